/* A private etcd as child processes, one per member (see etcd_server.h).
 *
 * Start: pick two free loopback ports (client, peer) per member, all distinct; run every
 * member (data under its directory's data/, log appended to its etcd.log, one
 * --initial-cluster naming all) before waiting for any to serve clients, since a member of
 * a new cluster serves only once a quorum is up (each is spawned once the one before serves
 * its peers, which needs no quorum: a new member that asks a peer still starting up whether
 * it is in the cluster already waits 2 s for the answer); then read each log from where it stood before the start
 * until it says it serves client traffic (etcd writes that once a leader is elected and
 * the member is published), a member exits (its log's tail becomes the error, naming it),
 * or the deadline passes (every member of that launch is then killed). A start whose ports
 * were taken in between is retried on new ports; a restart or a wipe retries on the same
 * ones. A wipe also changes the cluster token, so a fresh cluster is a cluster of its own.
 * With root_password, the first start (and every wipe) adds user root, grants it the root
 * role and enables auth, through our own client. */
#include "rendezvous/etcd_server.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/json.h"
#include "common/log.h"
#include "common/proc.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "rendezvous/etcd_internal.h"

/* One etcd process. */
typedef struct member {
  int client_port, peer_port;
  pid_t pid;           /* 0 while not running */
  off_t log_from;      /* its log's size at its last start: readiness is read from there */
  char dir[544];       /* <dir> for a single member, <dir>/m<i> for one of several */
  char log_path[576];  /* <member dir>/etcd.log */
  char url[128];       /* its client URL */
} member;

struct rdzv_etcd_server {
  rdzv_etcd_server_opts o;
  char *binary;
  char dir[512];
  int own_dir;
  int n;               /* members */
  unsigned epoch;      /* bumped by each wipe: a fresh cluster has a token of its own */
  member m[RDZV_ETCD_MAX_MEMBERS];
  char urls[RDZV_ETCD_MAX_MEMBERS * 128]; /* every member's client URL, comma-separated */
  char client_host[64];
  char *tls_cert, *tls_key, *tls_ca, *client_cert, *client_key, *root_password;
  char *user, *user_password, *user_prefix;
};

const char *rdzv_etcd_server_url(const rdzv_etcd_server *s) { return s->urls; }
const char *rdzv_etcd_server_dir(const rdzv_etcd_server *s) { return s->dir; }
pid_t rdzv_etcd_server_pid(const rdzv_etcd_server *s) { return s->m[0].pid; }
int rdzv_etcd_server_members(const rdzv_etcd_server *s) { return s->n; }

const char *rdzv_etcd_server_member_url(const rdzv_etcd_server *s, int i) {
  return i >= 0 && i < s->n ? s->m[i].url : NULL;
}

pid_t rdzv_etcd_server_member_pid(const rdzv_etcd_server *s, int i) {
  return i >= 0 && i < s->n ? s->m[i].pid : 0;
}

void rdzv_etcd_server_client_opts(const rdzv_etcd_server *s, rdzv_etcd_opts *o) {
  memset(o, 0, sizeof *o);
  o->endpoints = s->urls;
  o->ca_file = s->tls_ca;
  o->cert_file = s->client_cert;
  o->key_file = s->client_key;
  if (s->root_password) {
    o->user = "root";
    o->password = s->root_password;
  }
}

void rdzv_etcd_server_user_opts(const rdzv_etcd_server *s, rdzv_etcd_opts *o) {
  rdzv_etcd_server_client_opts(s, o);
  if (s->user) {
    o->user = s->user;
    o->password = s->user_password;
  }
}

/* "etcd (URL)" for a single member, "etcd member 2 (URL)" for one of several: how errors
 * name it. */
static const char *who(const rdzv_etcd_server *s, int i, char *buf, size_t cap) {
  if (s->n == 1) snprintf(buf, cap, "etcd (%s)", s->m[i].url);
  else snprintf(buf, cap, "etcd member %d (%s)", i, s->m[i].url);
  return buf;
}

/* Finds the binary: opts, $NEWT_ETCD_BIN, then PATH. */
static newt_result_t find_binary(const char *given, char **out) {
  const char *b = given && *given ? given : getenv("NEWT_ETCD_BIN");
  if (b && *b) {
    if (access(b, X_OK) != 0)
      return NEWT_ERR(NEWT_ERR_NOTFOUND, "etcd binary %s: %s", b, strerror(errno));
    *out = newt_strdup(b);
    NEWT_CHECK_ALLOC(*out);
    return NEWT_OK;
  }
  const char *path = getenv("PATH");
  char *copy = newt_strdup(path && *path ? path : "/usr/local/bin:/usr/bin:/bin");
  NEWT_CHECK_ALLOC(copy);
  char *save = NULL;
  for (char *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
    char *cand = newt_asprintf("%s/etcd", d);
    if (cand && access(cand, X_OK) == 0) {
      free(copy);
      *out = cand;
      return NEWT_OK;
    }
    free(cand);
  }
  free(copy);
  return NEWT_ERR(NEWT_ERR_NOTFOUND,
                  "etcd is not installed (no etcd on PATH): install the Debian package etcd-server "
                  "(scripts/install-deps.sh does), set NEWT_ETCD_BIN, or give an --etcd URL");
}

static off_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? st.st_size : 0;
}

/* The last ~1 KB of a member's log, one line, for error messages. */
static void log_tail(const member *m, char *out, size_t cap) {
  out[0] = '\0';
  int fd = open(m->log_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  off_t size = lseek(fd, 0, SEEK_END);
  off_t from = size > 1024 ? size - 1024 : 0;
  char buf[1025];
  ssize_t n = pread(fd, buf, sizeof buf - 1, from);
  close(fd);
  if (n <= 0) return;
  buf[n] = '\0';
  size_t o = 0;
  for (ssize_t i = 0; i < n && o + 1 < cap; i++) out[o++] = buf[i] == '\n' ? ' ' : buf[i];
  out[o] = '\0';
}

/* 1 when a member's log, since its last start, holds one of the lines. */
static int log_says(const member *m, const char *const *lines) {
  int fd = open(m->log_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  newt_buf b;
  newt_buf_init(&b);
  char chunk[8192];
  ssize_t n;
  off_t at = m->log_from;
  while ((n = pread(fd, chunk, sizeof chunk, at)) > 0) {
    newt_buf_append(&b, chunk, (size_t)n);
    at += n;
  }
  close(fd);
  int found = 0;
  for (size_t i = 0; b.data && lines[i] && !found; i++) found = strstr(b.data, lines[i]) != NULL;
  newt_buf_free(&b);
  return found;
}

/* zap logs "serving client traffic (in)securely", capnslog "ready to serve client requests";
 * both come after the server's ReadyNotify (leader elected, member published) */
static const char *const serves_clients[] = {"serving client traffic", "ready to serve client requests", NULL};
/* logged once the member's bootstrap is done, before any quorum */
static const char *const serves_peers[] = {"serving peer traffic", NULL};

static newt_result_t spawn(rdzv_etcd_server *s, int i) {
  member *m = &s->m[i];
  char data[600], name[16], purl[160], cluster[RDZV_ETCD_MAX_MEMBERS * 48], token[64], quota[64];
  const char *hb = s->n == 1 ? "25" : "50", *el = s->n == 1 ? "250" : "500";
  char prog[96], ttl[64];
  snprintf(data, sizeof data, "%s/data", m->dir);
  snprintf(name, sizeof name, s->n == 1 ? "newt" : "m%d", i);
  snprintf(purl, sizeof purl, "http://127.0.0.1:%d", m->peer_port);
  size_t used = 0;
  cluster[0] = '\0';
  for (int k = 0; k < s->n; k++) {
    char kname[16];
    snprintf(kname, sizeof kname, s->n == 1 ? "newt" : "m%d", k);
    used += (size_t)snprintf(cluster + used, sizeof cluster - used, "%s%s=http://127.0.0.1:%d", k ? "," : "",
                             kname, s->m[k].peer_port);
  }
  snprintf(token, sizeof token, "--initial-cluster-token=newt-%d-%u", (int)getpid(), s->epoch);
  const char *argv[64];
  int a = 0;
  argv[a++] = s->binary;
  argv[a++] = "--name";
  argv[a++] = name;
  argv[a++] = "--data-dir";
  argv[a++] = data;
  argv[a++] = "--listen-client-urls";
  argv[a++] = m->url;
  argv[a++] = "--advertise-client-urls";
  argv[a++] = m->url;
  argv[a++] = "--listen-peer-urls";
  argv[a++] = purl;
  argv[a++] = "--initial-advertise-peer-urls";
  argv[a++] = purl;
  argv[a++] = "--initial-cluster";
  argv[a++] = cluster;
  argv[a++] = "--initial-cluster-state=new";
  argv[a++] = token;
  argv[a++] = "--logger=zap";
  argv[a++] = "--log-outputs=stderr";
  argv[a++] = "--heartbeat-interval";
  argv[a++] = hb;
  argv[a++] = "--election-timeout";
  argv[a++] = el;
  if (s->n > 1) argv[a++] = "--pre-vote"; /* a resumed member does not depose the leader */
  argv[a++] = "--auto-compaction-mode=revision";
  argv[a++] = "--auto-compaction-retention=1000";
  if (s->o.quota_bytes > 0) {
    snprintf(quota, sizeof quota, "--quota-backend-bytes=%lld", (long long)s->o.quota_bytes);
    argv[a++] = quota;
  }
  if (s->o.progress_notify_ms > 0) {
    snprintf(prog, sizeof prog, "--experimental-watch-progress-notify-interval=%lldms",
             (long long)s->o.progress_notify_ms);
    argv[a++] = prog;
  }
  if (s->o.auth_token_ttl_s > 0) {
    snprintf(ttl, sizeof ttl, "--auth-token-ttl=%lld", (long long)s->o.auth_token_ttl_s);
    argv[a++] = ttl;
  }
  if (s->tls_cert) {
    argv[a++] = "--cert-file";
    argv[a++] = s->tls_cert;
    argv[a++] = "--key-file";
    argv[a++] = s->tls_key;
    if (s->o.client_cert_auth) {
      argv[a++] = "--client-cert-auth";
      argv[a++] = "--trusted-ca-file";
      argv[a++] = s->tls_ca;
    }
  }
  argv[a] = NULL;
  m->log_from = file_size(m->log_path);
  newt_spawn_opts so = {.log_path = m->log_path, .die_with_parent = 1, .new_session = 1};
  return newt_proc_spawn(argv, &so, &m->pid);
}

/* kill -9 and reap member i, if it runs. */
static void reap(member *m) {
  if (!m->pid) return;
  kill(m->pid, SIGKILL);
  newt_proc_wait(m->pid, 10000, NULL);
  m->pid = 0;
}

/* Runs the members in the mask (bit i: member i), every one before waiting for any to serve
 * clients (a new cluster serves only once a quorum is up), and waits until each does. On
 * failure every member of the mask is killed; *port_clash is set when one exited
 * complaining that an address was in use. */
static newt_result_t launch(rdzv_etcd_server *s, unsigned mask, newt_deadline_t d, int *port_clash) {
  *port_clash = 0;
  newt_result_t r = NEWT_OK;
  unsigned waiting = 0;
  int prev = -1; /* the member spawned last */
  for (int i = 0; i < s->n && r == NEWT_OK; i++) {
    if (!(mask & (1u << i))) continue;
    /* a new member asks its peers whether it is in their cluster already, and one whose
       peer port accepts but does not answer yet (itself in that step) holds it 2 s: the
       next is spawned once this one serves its peers (before any quorum), or after 3 s */
    if (prev >= 0) {
      newt_deadline_t dp = newt_deadline_in_ms(3000);
      while (!log_says(&s->m[prev], serves_peers) && !newt_deadline_passed(dp < d ? dp : d) &&
             newt_proc_alive(s->m[prev].pid))
        newt_sleep_ms(5);
    }
    r = spawn(s, i);
    if (r == NEWT_OK) waiting |= 1u << i;
    prev = i;
  }
  int64_t nap_ms = 5;
  char name[160], tail[1100], how[64];
  while (r == NEWT_OK && waiting) {
    for (int i = 0; i < s->n && r == NEWT_OK; i++) {
      member *m = &s->m[i];
      if (!(waiting & (1u << i))) continue;
      if (log_says(m, serves_clients)) {
        waiting &= ~(1u << i);
        continue;
      }
      int st;
      if (waitpid(m->pid, &st, WNOHANG) == m->pid) {
        m->pid = 0;
        log_tail(m, tail, sizeof tail);
        *port_clash = strstr(tail, "address already in use") != NULL;
        r = NEWT_ERR(NEWT_ERR_UNAVAILABLE, "%s exited during startup (%s); its log %s ends: %s",
                     who(s, i, name, sizeof name), newt_proc_status_str(st, how, sizeof how), m->log_path, tail);
      } else if (newt_deadline_passed(d)) {
        log_tail(m, tail, sizeof tail);
        r = NEWT_ERR(NEWT_ERR_TIMEOUT, "%s did not become ready in time%s; its log %s ends: %s",
                     who(s, i, name, sizeof name), s->n > 1 ? " (a member serves once a quorum is up)" : "",
                     m->log_path, tail);
      }
    }
    if (r != NEWT_OK || !waiting) break;
    newt_sleep_ms(nap_ms);
    if (nap_ms < 50) nap_ms *= 2;
  }
  if (r != NEWT_OK)
    for (int i = 0; i < s->n; i++)
      if (mask & (1u << i)) reap(&s->m[i]);
  return r;
}

/* launch() again while a port of the old processes lingers, until the deadline. */
static newt_result_t relaunch(rdzv_etcd_server *s, unsigned mask, newt_deadline_t d) {
  int clash = 0;
  for (;;) {
    newt_result_t r = launch(s, mask, d, &clash);
    if (r == NEWT_OK || !clash || newt_deadline_passed(d)) return r;
    newt_sleep_ms(100);
  }
}

/* New free ports for every member, all distinct, and the URLs on them. */
static newt_result_t pick_ports(rdzv_etcd_server *s) {
  int taken[2 * RDZV_ETCD_MAX_MEMBERS];
  size_t nt = 0;
  for (int i = 0; i < s->n; i++) {
    int *ports[2] = {&s->m[i].client_port, &s->m[i].peer_port};
    for (size_t k = 0; k < 2; k++) {
      for (int again = 1; again;) {
        NEWT_CHECK(newt_net_free_port(ports[k]));
        again = 0;
        for (size_t t = 0; t < nt; t++) again |= taken[t] == *ports[k];
      }
      taken[nt++] = *ports[k];
    }
  }
  size_t used = 0;
  for (int i = 0; i < s->n; i++) {
    member *m = &s->m[i];
    snprintf(m->url, sizeof m->url, "%s://%s:%d", s->tls_cert ? "https" : "http", s->client_host, m->client_port);
    used += (size_t)snprintf(s->urls + used, sizeof s->urls - used, "%s%s", i ? "," : "", m->url);
  }
  return NEWT_OK;
}

/* Deletes every member's data directory (a wipe; a cluster's start). */
static newt_result_t remove_data(rdzv_etcd_server *s) {
  for (int i = 0; i < s->n; i++) {
    char data[600];
    snprintf(data, sizeof data, "%s/data", s->m[i].dir);
    NEWT_CHECK(newt_fs_rm_rf(data));
  }
  return NEWT_OK;
}

static unsigned all_members(const rdzv_etcd_server *s) { return (1u << s->n) - 1u; }

static newt_result_t admin(rdzv_etcd *c, const char *path, const char *body, newt_deadline_t d) {
  newt_buf resp;
  newt_buf_init(&resp);
  newt_result_t r = rdzv_etcd_request(c, path, body, RDZV_REQ_NOAUTH, path, d, &resp);
  newt_buf_free(&resp);
  return r;
}

/* The user of its own: a role of its name that may read and write [prefix, its end), and the
 * user with that role (etcd's JSON gateway carries keys in base64). */
static newt_result_t add_user(rdzv_etcd *c, const rdzv_etcd_server *s, newt_deadline_t d) {
  size_t n = strlen(s->user_prefix);
  char *end = newt_strdup(s->user_prefix);
  NEWT_CHECK_ALLOC(end);
  end[n - 1]++; /* the prefix's range end: its last byte plus one */
  char *k64 = malloc(newt_base64_encoded_len(n)), *e64 = malloc(newt_base64_encoded_len(n));
  cJSON *role = cJSON_CreateObject(), *grant = cJSON_CreateObject(), *user = cJSON_CreateObject(),
        *link = cJSON_CreateObject();
  newt_result_t r = k64 && e64 && role && grant && user && link ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  char *bodies[4] = {NULL, NULL, NULL, NULL};
  if (r == NEWT_OK) {
    newt_base64_encode(s->user_prefix, n, k64);
    newt_base64_encode(end, n, e64);
    cJSON_AddStringToObject(role, "name", s->user);
    cJSON_AddStringToObject(grant, "name", s->user);
    cJSON *perm = cJSON_AddObjectToObject(grant, "perm");
    cJSON_AddStringToObject(perm, "permType", "READWRITE");
    cJSON_AddStringToObject(perm, "key", k64);
    cJSON_AddStringToObject(perm, "range_end", e64);
    cJSON_AddStringToObject(user, "name", s->user);
    cJSON_AddStringToObject(user, "password", s->user_password);
    cJSON_AddStringToObject(link, "user", s->user);
    cJSON_AddStringToObject(link, "role", s->user);
    cJSON *objs[4] = {role, grant, user, link};
    for (int i = 0; i < 4; i++)
      if (!(bodies[i] = cJSON_PrintUnformatted(objs[i]))) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  }
  static const char *const paths[4] = {"/v3/auth/role/add", "/v3/auth/role/grant", "/v3/auth/user/add",
                                       "/v3/auth/user/grant"};
  for (int i = 0; r == NEWT_OK && i < 4; i++) r = admin(c, paths[i], bodies[i], d);
  for (int i = 0; i < 4; i++) {
    if (bodies[i]) memset(bodies[i], 0, strlen(bodies[i]));
    free(bodies[i]);
  }
  cJSON_Delete(role);
  cJSON_Delete(grant);
  cJSON_Delete(user);
  cJSON_Delete(link);
  free(k64);
  free(e64);
  free(end);
  return r == NEWT_OK ? r : newt_err_wrap(r, "adding etcd user %s: ", s->user);
}

static newt_result_t enable_auth(rdzv_etcd_server *s, newt_deadline_t d) {
  rdzv_etcd_opts co;
  rdzv_etcd_server_client_opts(s, &co);
  co.user = NULL; /* auth is not on yet */
  rdzv_etcd *c;
  NEWT_CHECK(rdzv_etcd_init(&co, &c));
  cJSON *u = cJSON_CreateObject();
  cJSON_AddStringToObject(u, "name", "root");
  cJSON_AddStringToObject(u, "password", s->root_password);
  char *body = cJSON_PrintUnformatted(u);
  cJSON_Delete(u);
  newt_result_t r = body ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  if (r == NEWT_OK) r = admin(c, "/v3/auth/user/add", body, d);
  if (r == NEWT_OK) r = admin(c, "/v3/auth/user/grant", "{\"user\":\"root\",\"role\":\"root\"}", d);
  if (body) memset(body, 0, strlen(body));
  free(body);
  if (r == NEWT_OK && s->user) r = add_user(c, s, d);
  if (r == NEWT_OK) r = admin(c, "/v3/auth/enable", "{}", d);
  rdzv_etcd_free(c);
  if (r != NEWT_OK) return newt_err_wrap(r, "enabling auth on %s: ", s->urls);
  return NEWT_OK;
}

static char *dup_opt(const char *v) { return v && *v ? newt_strdup(v) : NULL; }

newt_result_t rdzv_etcd_server_start(const rdzv_etcd_server_opts *o, rdzv_etcd_server **out) {
  static const rdzv_etcd_server_opts none;
  if (!o) o = &none;
  *out = NULL;
  if (o->tls_cert && !o->tls_key)
    return NEWT_ERR(NEWT_ERR_INVALID, "etcd server: tls_cert given without tls_key");
  if (o->client_cert_auth && !o->tls_ca)
    return NEWT_ERR(NEWT_ERR_INVALID, "etcd server: client_cert_auth needs tls_ca");
  if (o->members < 0 || o->members > RDZV_ETCD_MAX_MEMBERS)
    return NEWT_ERR(NEWT_ERR_INVALID, "etcd server: members %d is not 1..%d", o->members, RDZV_ETCD_MAX_MEMBERS);
  if (o->quota_bytes < 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "etcd server: quota_bytes %lld is negative", (long long)o->quota_bytes);
  if (o->user && *o->user && (!o->root_password || !o->user_password || !o->user_prefix || !*o->user_prefix))
    return NEWT_ERR(NEWT_ERR_INVALID, "etcd server: user %s needs root_password, a password and a prefix", o->user);
  rdzv_etcd_server *s = calloc(1, sizeof *s);
  NEWT_CHECK_ALLOC(s);
  s->o = *o;
  s->n = o->members > 0 ? o->members : 1;
  snprintf(s->client_host, sizeof s->client_host, "%s", o->client_host && *o->client_host ? o->client_host : "127.0.0.1");
  s->tls_cert = dup_opt(o->tls_cert);
  s->tls_key = dup_opt(o->tls_key);
  s->tls_ca = dup_opt(o->tls_ca);
  s->client_cert = dup_opt(o->client_cert);
  s->client_key = dup_opt(o->client_key);
  s->root_password = o->root_password ? newt_strdup(o->root_password) : NULL;
  if (o->root_password && o->user && *o->user) {
    s->user = newt_strdup(o->user);
    s->user_password = newt_strdup(o->user_password);
    s->user_prefix = newt_strdup(o->user_prefix);
  }
  newt_result_t r = find_binary(o->binary, &s->binary);
  if (r != NEWT_OK) goto fail;
  if (o->dir && *o->dir) {
    snprintf(s->dir, sizeof s->dir, "%s", o->dir);
    r = newt_fs_mkdirs(s->dir, 0700);
    if (r != NEWT_OK) goto fail;
  } else {
    const char *tmp = getenv("TMPDIR");
    snprintf(s->dir, sizeof s->dir, "%s/newt-etcd-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(s->dir)) {
      r = NEWT_ERR(NEWT_ERR_SYS, "mkdtemp %s: %s", s->dir, strerror(errno));
      goto fail;
    }
    s->own_dir = 1;
  }
  for (int i = 0; i < s->n; i++) {
    member *m = &s->m[i];
    if (s->n == 1) snprintf(m->dir, sizeof m->dir, "%s", s->dir);
    else snprintf(m->dir, sizeof m->dir, "%s/m%d", s->dir, i);
    snprintf(m->log_path, sizeof m->log_path, "%s/etcd.log", m->dir);
    r = newt_fs_mkdirs(m->dir, 0700);
    if (r != NEWT_OK) goto fail;
  }
  newt_deadline_t d = newt_deadline_in_ms(o->start_timeout_ms > 0 ? o->start_timeout_ms : 30000);
  for (int tries = 0;; tries++) {
    r = pick_ports(s);
    /* a cluster's data names its peers' ports: every start of one begins empty */
    if (r == NEWT_OK && s->n > 1) r = remove_data(s);
    if (r != NEWT_OK) goto fail;
    int clash = 0;
    r = launch(s, all_members(s), d, &clash);
    if (r == NEWT_OK) break;
    if (!clash || tries >= 3) goto fail;
    NEWT_INFO(RDZV, "etcd: a port was taken meanwhile, trying others");
  }
  if (s->root_password) {
    r = enable_auth(s, d);
    if (r != NEWT_OK) goto fail;
  }
  NEWT_INFO(RDZV, "etcd %d serving at %s (%d member%s, data in %s)", (int)s->m[0].pid, s->urls, s->n,
            s->n == 1 ? "" : "s", s->dir);
  *out = s;
  return NEWT_OK;
fail:
  rdzv_etcd_server_free(s);
  return r;
}

/* Member i, or NEWT_ERR_INVALID naming the count. */
static newt_result_t member_at(rdzv_etcd_server *s, int i, member **out) {
  if (i < 0 || i >= s->n)
    return NEWT_ERR(NEWT_ERR_INVALID, "etcd member %d: the private etcd has %d member%s (0..%d)", i, s->n,
                    s->n == 1 ? "" : "s", s->n - 1);
  *out = &s->m[i];
  return NEWT_OK;
}

newt_result_t rdzv_etcd_server_stop(rdzv_etcd_server *s, int64_t grace_ms) {
  /* one member at a time, within one grace: a leader told to stop hands its leadership to
     a member still up at once, where stopping all together would leave it waiting for a
     successor until the grace ran out */
  newt_deadline_t d = newt_deadline_in_ms(grace_ms > 0 ? grace_ms : 0);
  newt_result_t r = NEWT_OK;
  for (int i = 0; i < s->n; i++) {
    member *m = &s->m[i];
    if (!m->pid) continue;
    newt_result_t w = newt_proc_stop(m->pid, newt_deadline_left_ms(d));
    if (r == NEWT_OK) r = w;
    m->pid = 0;
  }
  return r;
}

/* Sends sig to every running member; NEWT_ERR_INVALID (kill) or NEWT_ERR_SYS when none
 * runs or a signal fails. */
static newt_result_t signal_all(rdzv_etcd_server *s, int sig, const char *what) {
  int running = 0;
  char name[160];
  for (int i = 0; i < s->n; i++) {
    member *m = &s->m[i];
    if (!m->pid) continue;
    running++;
    if (sig == SIGSTOP) { /* stopped on return: it answers nothing more */
      newt_result_t r = newt_proc_pause(m->pid, 5000);
      if (r != NEWT_OK) return NEWT_ERR(r, "%s: %s", who(s, i, name, sizeof name), newt_errmsg());
    } else if (kill(m->pid, sig) != 0)
      return NEWT_ERR(NEWT_ERR_SYS, "%s to %s: %s", what, who(s, i, name, sizeof name), strerror(errno));
  }
  if (!running)
    return NEWT_ERR(sig == SIGKILL ? NEWT_ERR_INVALID : NEWT_ERR_SYS, "%s to etcd at %s: not running", what, s->urls);
  return NEWT_OK;
}

newt_result_t rdzv_etcd_server_kill(rdzv_etcd_server *s) {
  NEWT_CHECK(signal_all(s, SIGKILL, "SIGKILL"));
  newt_result_t r = NEWT_OK;
  for (int i = 0; i < s->n; i++) {
    member *m = &s->m[i];
    if (!m->pid) continue;
    newt_result_t w = newt_proc_wait(m->pid, 10000, NULL);
    if (r == NEWT_OK) r = w;
    m->pid = 0;
  }
  return r;
}

newt_result_t rdzv_etcd_server_pause(rdzv_etcd_server *s) { return signal_all(s, SIGSTOP, "SIGSTOP"); }

newt_result_t rdzv_etcd_server_resume(rdzv_etcd_server *s) { return signal_all(s, SIGCONT, "SIGCONT"); }

newt_result_t rdzv_etcd_server_restart(rdzv_etcd_server *s, newt_deadline_t d) {
  NEWT_CHECK(rdzv_etcd_server_stop(s, 5000));
  /* the old processes' ports can linger for a moment: a clash is retried on the same ports */
  return relaunch(s, all_members(s), d);
}

newt_result_t rdzv_etcd_server_wipe(rdzv_etcd_server *s, newt_deadline_t d) {
  NEWT_CHECK(rdzv_etcd_server_stop(s, 5000));
  NEWT_CHECK(remove_data(s));
  s->epoch++; /* a new cluster, which no member of the old one can talk to */
  NEWT_CHECK(relaunch(s, all_members(s), d));
  if (s->root_password) NEWT_CHECK(enable_auth(s, d));
  NEWT_INFO(RDZV, "etcd at %s wiped: serving again, empty", s->urls);
  return NEWT_OK;
}

newt_result_t rdzv_etcd_server_member_kill(rdzv_etcd_server *s, int i) {
  member *m = NULL;
  char name[160];
  NEWT_CHECK(member_at(s, i, &m));
  if (!m->pid) return NEWT_ERR(NEWT_ERR_INVALID, "%s is not running", who(s, i, name, sizeof name));
  kill(m->pid, SIGKILL);
  newt_result_t r = newt_proc_wait(m->pid, 10000, NULL);
  m->pid = 0;
  return r;
}

/* SIGSTOP or SIGCONT to member i. */
static newt_result_t member_signal(rdzv_etcd_server *s, int i, int sig, const char *what) {
  member *m = NULL;
  char name[160];
  NEWT_CHECK(member_at(s, i, &m));
  if (!m->pid || kill(m->pid, sig) != 0)
    return NEWT_ERR(NEWT_ERR_SYS, "%s to %s: %s", what, who(s, i, name, sizeof name),
                    m->pid ? strerror(errno) : "not running");
  return NEWT_OK;
}

newt_result_t rdzv_etcd_server_member_pause(rdzv_etcd_server *s, int i) {
  member *m = NULL;
  char name[160];
  NEWT_CHECK(member_at(s, i, &m));
  if (!m->pid) return NEWT_ERR(NEWT_ERR_SYS, "SIGSTOP to %s: not running", who(s, i, name, sizeof name));
  newt_result_t r = newt_proc_pause(m->pid, 5000); /* stopped on return: it answers nothing more */
  return r == NEWT_OK ? NEWT_OK : NEWT_ERR(r, "%s: %s", who(s, i, name, sizeof name), newt_errmsg());
}

newt_result_t rdzv_etcd_server_member_resume(rdzv_etcd_server *s, int i) {
  return member_signal(s, i, SIGCONT, "SIGCONT");
}

newt_result_t rdzv_etcd_server_member_restart(rdzv_etcd_server *s, int i, newt_deadline_t d) {
  member *m = NULL;
  NEWT_CHECK(member_at(s, i, &m));
  if (m->pid) {
    newt_result_t r = newt_proc_stop(m->pid, 5000);
    m->pid = 0;
    NEWT_CHECK(r);
  }
  return relaunch(s, 1u << i, d);
}

/* Asks member i whether it leads: its status names a leader, and that leader is it. */
static newt_result_t member_leads(rdzv_etcd_server *s, int i, newt_deadline_t d, int *leads) {
  *leads = 0;
  rdzv_etcd_opts co;
  rdzv_etcd_server_client_opts(s, &co);
  co.endpoints = s->m[i].url;
  rdzv_etcd *c;
  NEWT_CHECK(rdzv_etcd_init(&co, &c));
  newt_buf resp;
  newt_buf_init(&resp);
  cJSON *j = NULL;
  const cJSON *h = NULL;
  const char *id = NULL, *lead = NULL;
  newt_result_t r = rdzv_etcd_request(c, "/v3/maintenance/status", "{}", RDZV_REQ_IDEMPOTENT, "status", d, &resp);
  if (r == NEWT_OK) r = newt_json_parse(resp.data ? resp.data : "", resp.len, "etcd status", &j);
  if (r == NEWT_OK) r = newt_json_get_obj(j, "etcd status", "header", 1, &h);
  if (r == NEWT_OK) r = newt_json_get_str(h, "etcd status header", "member_id", 1, &id);
  if (r == NEWT_OK) r = newt_json_get_str(j, "etcd status", "leader", 0, &lead); /* absent: none */
  if (r == NEWT_OK) *leads = lead && strcmp(id, lead) == 0;
  cJSON_Delete(j);
  newt_buf_free(&resp);
  rdzv_etcd_free(c);
  return r;
}

newt_result_t rdzv_etcd_server_leader(rdzv_etcd_server *s, newt_deadline_t d, int *leader) {
  *leader = -1;
  for (;;) {
    for (int i = 0; i < s->n; i++) {
      if (!s->m[i].pid) continue;
      /* a stopped member would hold the question to the deadline: a second each */
      newt_deadline_t di = newt_deadline_in_ms(1000);
      int leads = 0;
      if (member_leads(s, i, di < d ? di : d, &leads) == NEWT_OK && leads) {
        *leader = i;
        return NEWT_OK;
      }
    }
    if (newt_deadline_passed(d)) break;
    newt_sleep_ms(50);
  }
  return NEWT_ERR(NEWT_ERR_UNAVAILABLE, "etcd at %s: no member says it leads (by the deadline)", s->urls);
}

void rdzv_etcd_server_free(rdzv_etcd_server *s) {
  if (!s) return;
  rdzv_etcd_server_stop(s, 5000);
  if (s->own_dir) newt_fs_rm_rf(s->dir);
  free(s->binary);
  free(s->tls_cert);
  free(s->tls_key);
  free(s->tls_ca);
  free(s->client_cert);
  free(s->client_key);
  if (s->root_password) memset(s->root_password, 0, strlen(s->root_password));
  free(s->root_password);
  if (s->user_password) memset(s->user_password, 0, strlen(s->user_password));
  free(s->user_password);
  free(s->user);
  free(s->user_prefix);
  free(s);
}
