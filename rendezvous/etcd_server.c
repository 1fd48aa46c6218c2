/* A private etcd as a child process (see etcd_server.h).
 *
 * Start: pick two free loopback ports (client, peer), run etcd with its data under
 * <dir>/data and its log appended to <dir>/etcd.log, and read the log from where it stood
 * before the start until it says it serves client traffic (etcd writes that once a
 * leader is elected and the member is published), the process exits (its log's tail
 * becomes the error), or the deadline passes. A start whose ports were taken in between
 * is retried on new ports. With root_password, the first start adds user root, grants it
 * the root role and enables auth, through our own client. */
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
#include "common/log.h"
#include "common/proc.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "rendezvous/etcd_internal.h"

struct rdzv_etcd_server {
  rdzv_etcd_server_opts o;
  char *binary;
  char dir[512];
  int own_dir;
  char log_path[600];
  char url[128];
  int client_port, peer_port;
  pid_t pid;
  char *tls_cert, *tls_key, *tls_ca, *client_cert, *client_key, *root_password;
};

const char *rdzv_etcd_server_url(const rdzv_etcd_server *s) { return s->url; }
const char *rdzv_etcd_server_dir(const rdzv_etcd_server *s) { return s->dir; }
pid_t rdzv_etcd_server_pid(const rdzv_etcd_server *s) { return s->pid; }

void rdzv_etcd_server_client_opts(const rdzv_etcd_server *s, rdzv_etcd_opts *o) {
  memset(o, 0, sizeof *o);
  o->endpoints = s->url;
  o->ca_file = s->tls_ca;
  o->cert_file = s->client_cert;
  o->key_file = s->client_key;
  if (s->root_password) {
    o->user = "root";
    o->password = s->root_password;
  }
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

/* The last ~1 KB of the log, one line, for error messages. */
static void log_tail(const rdzv_etcd_server *s, char *out, size_t cap) {
  out[0] = '\0';
  int fd = open(s->log_path, O_RDONLY | O_CLOEXEC);
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

/* 1 when the log, from offset on, says etcd serves clients. */
static int log_says_ready(const rdzv_etcd_server *s, off_t offset) {
  int fd = open(s->log_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  newt_buf b;
  newt_buf_init(&b);
  char chunk[8192];
  ssize_t n;
  off_t at = offset;
  while ((n = pread(fd, chunk, sizeof chunk, at)) > 0) {
    newt_buf_append(&b, chunk, (size_t)n);
    at += n;
  }
  close(fd);
  /* zap logs "serving client traffic (in)securely", capnslog "ready to serve client
   * requests"; both come after the server's ReadyNotify (leader elected, member published) */
  int ready = b.data && (strstr(b.data, "serving client traffic") || strstr(b.data, "ready to serve client requests"));
  newt_buf_free(&b);
  return ready;
}

static newt_result_t spawn(rdzv_etcd_server *s) {
  const char *scheme = s->tls_cert ? "https" : "http";
  char data[600], curl_[160], purl[160], cluster[200], hb[16] = "25", el[16] = "250", prog[96], ttl[64];
  snprintf(data, sizeof data, "%s/data", s->dir);
  snprintf(curl_, sizeof curl_, "%s://127.0.0.1:%d", scheme, s->client_port);
  snprintf(purl, sizeof purl, "http://127.0.0.1:%d", s->peer_port);
  snprintf(cluster, sizeof cluster, "newt=%s", purl);
  const char *argv[64];
  int a = 0;
  argv[a++] = s->binary;
  argv[a++] = "--name=newt";
  argv[a++] = "--data-dir";
  argv[a++] = data;
  argv[a++] = "--listen-client-urls";
  argv[a++] = curl_;
  argv[a++] = "--advertise-client-urls";
  argv[a++] = curl_;
  argv[a++] = "--listen-peer-urls";
  argv[a++] = purl;
  argv[a++] = "--initial-advertise-peer-urls";
  argv[a++] = purl;
  argv[a++] = "--initial-cluster";
  argv[a++] = cluster;
  argv[a++] = "--initial-cluster-state=new";
  argv[a++] = "--logger=zap";
  argv[a++] = "--log-outputs=stderr";
  argv[a++] = "--heartbeat-interval";
  argv[a++] = hb;
  argv[a++] = "--election-timeout";
  argv[a++] = el;
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
  newt_spawn_opts so = {.log_path = s->log_path, .die_with_parent = 1, .new_session = 1};
  return newt_proc_spawn(argv, &so, &s->pid);
}

/* Runs etcd and waits for it to serve. *port_clash is set when it exited complaining that
 * an address was in use. */
static newt_result_t launch(rdzv_etcd_server *s, newt_deadline_t d, int *port_clash) {
  *port_clash = 0;
  off_t offset = file_size(s->log_path);
  NEWT_CHECK(spawn(s));
  int64_t nap_ms = 5;
  for (;;) {
    if (log_says_ready(s, offset)) return NEWT_OK;
    int st;
    if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
      char tail[1100], how[64];
      s->pid = 0;
      log_tail(s, tail, sizeof tail);
      *port_clash = strstr(tail, "address already in use") != NULL;
      return NEWT_ERR(NEWT_ERR_UNAVAILABLE, "etcd (%s) exited during startup (%s); its log %s ends: %s",
                      s->url, newt_proc_status_str(st, how, sizeof how), s->log_path, tail);
    }
    if (newt_deadline_passed(d)) {
      char tail[1100];
      log_tail(s, tail, sizeof tail);
      kill(s->pid, SIGKILL);
      newt_proc_wait(s->pid, 5000, NULL);
      s->pid = 0;
      return NEWT_ERR(NEWT_ERR_TIMEOUT, "etcd (%s) did not become ready in time; its log %s ends: %s", s->url,
                      s->log_path, tail);
    }
    newt_sleep_ms(nap_ms);
    if (nap_ms < 50) nap_ms *= 2;
  }
}

static newt_result_t admin(rdzv_etcd *c, const char *path, const char *body, newt_deadline_t d) {
  newt_buf resp;
  newt_buf_init(&resp);
  newt_result_t r = rdzv_etcd_request(c, path, body, RDZV_REQ_NOAUTH, path, d, &resp);
  newt_buf_free(&resp);
  return r;
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
  if (r == NEWT_OK) r = admin(c, "/v3/auth/enable", "{}", d);
  if (body) memset(body, 0, strlen(body));
  free(body);
  rdzv_etcd_free(c);
  if (r != NEWT_OK) return newt_err_wrap(r, "enabling auth on %s: ", s->url);
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
  rdzv_etcd_server *s = calloc(1, sizeof *s);
  NEWT_CHECK_ALLOC(s);
  s->o = *o;
  s->tls_cert = dup_opt(o->tls_cert);
  s->tls_key = dup_opt(o->tls_key);
  s->tls_ca = dup_opt(o->tls_ca);
  s->client_cert = dup_opt(o->client_cert);
  s->client_key = dup_opt(o->client_key);
  s->root_password = o->root_password ? newt_strdup(o->root_password) : NULL;
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
  snprintf(s->log_path, sizeof s->log_path, "%s/etcd.log", s->dir);
  newt_deadline_t d = newt_deadline_in_ms(o->start_timeout_ms > 0 ? o->start_timeout_ms : 30000);
  for (int tries = 0;; tries++) {
    r = newt_net_free_port(&s->client_port);
    if (r == NEWT_OK) r = newt_net_free_port(&s->peer_port);
    if (r != NEWT_OK) goto fail;
    if (s->peer_port == s->client_port) continue;
    snprintf(s->url, sizeof s->url, "%s://127.0.0.1:%d", s->tls_cert ? "https" : "http", s->client_port);
    int clash = 0;
    r = launch(s, d, &clash);
    if (r == NEWT_OK) break;
    if (!clash || tries >= 3) goto fail;
    NEWT_INFO(RDZV, "etcd: a port was taken meanwhile, trying others");
  }
  if (s->root_password) {
    r = enable_auth(s, d);
    if (r != NEWT_OK) goto fail;
  }
  NEWT_INFO(RDZV, "etcd %d serving at %s (data in %s)", (int)s->pid, s->url, s->dir);
  *out = s;
  return NEWT_OK;
fail:
  rdzv_etcd_server_free(s);
  return r;
}

newt_result_t rdzv_etcd_server_stop(rdzv_etcd_server *s, int64_t grace_ms) {
  if (!s->pid) return NEWT_OK;
  newt_result_t r = newt_proc_stop(s->pid, grace_ms);
  s->pid = 0;
  return r;
}

newt_result_t rdzv_etcd_server_kill(rdzv_etcd_server *s) {
  if (!s->pid) return NEWT_ERR(NEWT_ERR_INVALID, "etcd at %s is not running", s->url);
  kill(s->pid, SIGKILL);
  newt_result_t r = newt_proc_wait(s->pid, 10000, NULL);
  s->pid = 0;
  return r;
}

newt_result_t rdzv_etcd_server_pause(rdzv_etcd_server *s) {
  if (!s->pid || kill(s->pid, SIGSTOP) != 0)
    return NEWT_ERR(NEWT_ERR_SYS, "SIGSTOP to etcd at %s: %s", s->url, s->pid ? strerror(errno) : "not running");
  return NEWT_OK;
}

newt_result_t rdzv_etcd_server_resume(rdzv_etcd_server *s) {
  if (!s->pid || kill(s->pid, SIGCONT) != 0)
    return NEWT_ERR(NEWT_ERR_SYS, "SIGCONT to etcd at %s: %s", s->url, s->pid ? strerror(errno) : "not running");
  return NEWT_OK;
}

newt_result_t rdzv_etcd_server_restart(rdzv_etcd_server *s, newt_deadline_t d) {
  NEWT_CHECK(rdzv_etcd_server_stop(s, 5000));
  int clash = 0;
  /* the old process's ports can linger for a moment: retry a clash on the same ports */
  for (;;) {
    newt_result_t r = launch(s, d, &clash);
    if (r == NEWT_OK || !clash || newt_deadline_passed(d)) return r;
    newt_sleep_ms(100);
  }
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
  free(s);
}
