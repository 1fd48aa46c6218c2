/* The rendezvous protocols other than election (rdzv_elect.c): key names, worker
 * registration on a lease, the membership view, the generation barrier, spec / plan /
 * events. See rdzv.h for the key layout and docs/rendezvous.md for the guarantees.
 *
 * The membership view and the barrier share one pattern: read the whole prefix once
 * (one range, at revision R), then watch it from R + 1. etcd orders every change by
 * revision, so the snapshot plus the watch sees each change exactly once; the watch layer
 * resumes after reconnects and turns a compacted history into a RESYNC snapshot. */
#include "rendezvous/rdzv.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/json.h"
#include "common/log.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "rendezvous/etcd_internal.h"

/* --- names and keys ----------------------------------------------------------------------- */

newt_result_t rdzv_check_name(const char *what, const char *name) {
  if (!name || !*name) return NEWT_ERR(NEWT_ERR_INVALID, "%s: empty", what);
  size_t n = strlen(name);
  if (n >= RDZV_NAME_MAX)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s \"%.70s...\": longer than %d characters", what, name, RDZV_NAME_MAX - 1);
  for (size_t i = 0; i < n; i++) {
    char ch = name[i];
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
             ch == '_' || ch == '-';
    if (!ok)
      return NEWT_ERR(NEWT_ERR_INVALID, "%s \"%s\": character %zu is not one of A-Z a-z 0-9 . _ -", what, name,
                      i + 1);
  }
  return NEWT_OK;
}

newt_result_t rdzv_key(char *out, size_t cap, const char *job, const char *suffix) {
  NEWT_CHECK(rdzv_check_name("job name", job));
  int n = snprintf(out, cap, "/newt/%s/%s", job, suffix ? suffix : "");
  if (n < 0 || (size_t)n >= cap) return NEWT_ERR(NEWT_ERR_INVALID, "key for job %s is too long", job);
  return NEWT_OK;
}

/* Sleeps on cv until pred holds, d passes or *abort is set: 0, NEWT_ERR_TIMEOUT, ABORTED.
 * Called with mu held. */
static newt_result_t cond_wait_slice(pthread_cond_t *cv, pthread_mutex_t *mu, newt_deadline_t d,
                                     const atomic_int *abort) {
  if (abort && atomic_load(abort)) return NEWT_ERR_ABORTED;
  if (newt_deadline_passed(d)) return NEWT_ERR_TIMEOUT;
  uint64_t until = newt_now_ns() + 50000000ull; /* 50 ms: abort flags are polled */
  if (d != NEWT_DEADLINE_NONE && d < until) until = d;
  struct timespec ts = {(time_t)(until / 1000000000ull), (long)(until % 1000000000ull)};
  pthread_cond_timedwait(cv, mu, &ts);
  return NEWT_OK;
}


/* --- worker registrations ----------------------------------------------------------------- */

newt_result_t rdzv_worker_to_json(const rdzv_worker *w, char **out) {
  cJSON *j = cJSON_CreateObject();
  NEWT_CHECK_ALLOC(j);
  int ok = cJSON_AddStringToObject(j, "id", w->id) && cJSON_AddStringToObject(j, "host", w->host) &&
           cJSON_AddStringToObject(j, "addr", w->addr) && newt_json_add_int(j, "device", w->device) &&
           cJSON_AddStringToObject(j, "state", w->state) && newt_json_add_int(j, "pid", w->pid) &&
           newt_json_add_int(j, "generation", w->generation) &&
           (!w->shares_device || cJSON_AddBoolToObject(j, "shares_device", 1)) &&
           (!w->domain[0] || strcmp(w->domain, w->host) == 0 || cJSON_AddStringToObject(j, "domain", w->domain));
  if (ok && w->ack[0]) {
    cJSON *ack;
    newt_result_t r = newt_json_parse(w->ack, strlen(w->ack), "registration.ack", &ack);
    if (r != NEWT_OK) {
      cJSON_Delete(j);
      return r;
    }
    if (!cJSON_IsObject(ack)) {
      cJSON_Delete(ack);
      cJSON_Delete(j);
      return NEWT_ERR(NEWT_ERR_INVALID, "registration.ack: expected a JSON object");
    }
    ok = cJSON_AddItemToObject(j, "ack", ack);
    if (!ok) cJSON_Delete(ack);
  }
  *out = ok ? newt_json_print(j) : NULL;
  cJSON_Delete(j);
  NEWT_CHECK_ALLOC(*out);
  return NEWT_OK;
}

int rdzv_worker_acked(const rdzv_worker *w, int64_t generation) {
  return w->generation > generation || (w->generation == generation && w->ack[0]);
}

/* Whether every character of s is in allowed. */
static int text_of(const char *s, const char *allowed) { return s[strspn(s, allowed)] == '\0'; }

newt_result_t rdzv_worker_from_json(const char *text, size_t len, const char *what, rdzv_worker *out) {
  memset(out, 0, sizeof *out);
  out->device = -1;
  cJSON *j;
  NEWT_CHECK(newt_json_parse(text, len, what, &j));
  int64_t device = -1;
  newt_result_t r;
  NEWT_CHECK_GOTO(newt_json_get_strcpy(j, what, "id", 1, out->id, sizeof out->id), r, done);
  NEWT_CHECK_GOTO(rdzv_check_name(what, out->id), r, done);
  NEWT_CHECK_GOTO(newt_json_get_strcpy(j, what, "host", 1, out->host, sizeof out->host), r, done);
  NEWT_CHECK_GOTO(newt_json_get_strcpy(j, what, "domain", 0, out->domain, sizeof out->domain), r, done);
  NEWT_CHECK_GOTO(newt_json_get_strcpy(j, what, "addr", 0, out->addr, sizeof out->addr), r, done);
  NEWT_CHECK_GOTO(newt_json_get_strcpy(j, what, "state", 1, out->state, sizeof out->state), r, done);
  NEWT_CHECK_GOTO(newt_json_get_int(j, what, "device", 0, &device), r, done);
  NEWT_CHECK_GOTO(newt_json_get_int(j, what, "pid", 0, &out->pid), r, done);
  NEWT_CHECK_GOTO(newt_json_get_int(j, what, "generation", 0, &out->generation), r, done);
  NEWT_CHECK_GOTO(newt_json_get_bool(j, what, "shares_device", 0, &out->shares_device), r, done);
  const cJSON *ack = NULL; /* absent in the previous release's registrations, and before an ack */
  NEWT_CHECK_GOTO(newt_json_get_obj(j, what, "ack", 0, &ack), r, done);
  if (ack) {
    char *text = newt_json_print(ack);
    size_t n = text ? strlen(text) : 0;
    if (text && n < sizeof out->ack) memcpy(out->ack, text, n + 1);
    free(text);
    if (!text) {
      r = NEWT_ERR(NEWT_ERR_NOMEM, "%s.ack: out of memory", what);
      goto done;
    }
    if (n >= sizeof out->ack) {
      r = NEWT_ERR(NEWT_ERR_INVALID, "%s.ack: %zu bytes, more than %d", what, n, RDZV_ACK_MAX - 1);
      goto done;
    }
  }
  if (device < -1 || device > 1024) {
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s.device: %lld is not a device index", what, (long long)device);
    goto done;
  }
  out->device = (int)device;
  /* what others print and connect to: no control characters, nothing but a name or an
     address (a registration comes from etcd, where anyone with write access can put it) */
  if (!text_of(out->host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:") || !out->host[0]) {
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s.host: a host name of letters, digits, '.', '-', '_' and ':'", what);
    goto done;
  }
  if (!out->domain[0]) snprintf(out->domain, sizeof out->domain, "%s", out->host); /* the previous release's */
  else if (!text_of(out->domain, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:/")) {
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s.domain: a failure domain of letters, digits, '.', '-', '_', ':' and '/'", what);
    goto done;
  }
  const char *colon = strrchr(out->addr, ':');
  int64_t port = 0;
  if (out->addr[0] && (!colon || colon == out->addr || !text_of(out->addr, "0123456789abcdefABCDEF.:[]") ||
                       newt_parse_int(colon + 1, &port) != 0 || port < 1 || port > 65535)) {
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s.addr: \"%.64s\" is not an IP address and port", what, out->addr);
    goto done;
  }
  if (!text_of(out->state, "abcdefghijklmnopqrstuvwxyz-_") || !out->state[0]) {
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s.state: lower-case letters only", what);
    goto done;
  }
  if (out->generation < 0 || out->generation >= NEWT_JSON_INT_EXACT || out->pid < 0) {
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: out of range", what, out->pid < 0 ? "pid" : "generation");
    goto done;
  }
done:
  cJSON_Delete(j);
  return r;
}

struct rdzv_registration {
  rdzv_etcd *c;
  char key[256];
  rdzv_worker w;
  _Atomic int64_t lease;
  int kept;
  int64_t ttl_s;
  rdzv_etcd_lease_lost_fn lost;
  void *ud;
  int64_t host_lease; /* the host's lease it was handed (0: none, or it went) */
  int shared;         /* 1: the registration is on host_lease, not a lease of its own */
};

/* Deletes the registration while it is on this lease (never another's). */
static newt_result_t delete_own_key(rdzv_registration *r, newt_deadline_t d) {
  rdzv_etcd_cmp cmp = {.key = r->key, .target = RDZV_CMP_LEASE, .result = RDZV_CMP_EQUAL, .number = r->lease};
  rdzv_etcd_op del = {.type = RDZV_OP_DELETE, .key = r->key};
  return rdzv_etcd_txn(r->c, &cmp, 1, &del, 1, NULL, 0, d, NULL);
}

/* Keeps the registration's lease alive: its own always; the host's unless this client keeps
 * it already (another registration on it, perhaps one claiming it at this moment). */
static newt_result_t keep_lease(rdzv_registration *r, int64_t lease) {
  if (r->shared && rdzv_etcd_lease_lost(r->c, lease, NULL, 0) >= 0) return NEWT_OK;
  newt_result_t res = rdzv_etcd_lease_keep(r->c, lease, r->ttl_s, r->lost, r->ud);
  if (res != NEWT_OK && r->shared && rdzv_etcd_lease_lost(r->c, lease, NULL, 0) >= 0) return NEWT_OK;
  r->kept = res == NEWT_OK;
  return res;
}

/* Writes the registration on a lease if the id is free, and keeps the lease alive: the host's
 * lease when it has one (no grant: one write; kept alive here too, so that its loss is
 * reported here, unless this client keeps it already), else a lease of its own. A host lease
 * etcd no longer has is given up for a lease of its own. */
static newt_result_t claim(rdzv_registration *r, const char *job, newt_deadline_t d) {
  char *json = NULL;
  int64_t lease = r->host_lease;
  int own = lease == 0;
  newt_result_t res;
  NEWT_CHECK(rdzv_worker_to_json(&r->w, &json));
  if (own) NEWT_CHECK_GOTO(rdzv_etcd_lease_grant(r->c, r->ttl_s, 0, d, &lease, NULL), res, fail);
  rdzv_etcd_cmp cmp = {.key = r->key, .target = RDZV_CMP_CREATE, .result = RDZV_CMP_EQUAL, .number = 0};
  rdzv_etcd_op put = {.type = RDZV_OP_PUT, .key = r->key, .value = json, .value_len = strlen(json), .lease = lease};
  rdzv_etcd_op get = {.type = RDZV_OP_RANGE, .key = r->key};
  rdzv_etcd_txn_result tr;
  res = rdzv_etcd_txn(r->c, &cmp, 1, &put, 1, &get, 1, d, &tr);
  if (res == NEWT_ERR_NOTFOUND && !own) { /* the host's lease is gone: one of our own */
    NEWT_INFO(RDZV, "%s: host lease %llx is gone; registering on a lease of its own", r->key, (unsigned long long)lease);
    free(json);
    r->host_lease = 0;
    return claim(r, job, d);
  }
  if (res != NEWT_OK) goto fail_lease;
  if (!tr.succeeded) {
    int64_t other = tr.n && tr.results[0].range.n ? tr.results[0].range.kvs[0].lease : 0;
    rdzv_etcd_txn_result_free(&tr);
    res = NEWT_ERR(NEWT_ERR_CONFLICT, "worker id %s is already registered in job %s (lease %llx): another "
                   "worker uses this id, or its previous run's lease has not expired yet", r->w.id, job,
                   (unsigned long long)other);
    goto fail_lease;
  }
  r->w.mod_revision = r->w.create_revision = tr.revision;
  r->w.lease = lease;
  rdzv_etcd_txn_result_free(&tr);
  r->shared = !own;
  r->kept = 0;
  r->lease = lease;
  res = keep_lease(r, lease);
  if (res != NEWT_OK) {
    if (!own) delete_own_key(r, newt_deadline_in_ms(1000)); /* not registered after all */
    goto fail_lease;
  }
  free(json);
  return NEWT_OK;
fail_lease:
  if (own) rdzv_etcd_lease_revoke(r->c, lease, newt_deadline_in_ms(1000)); /* never the host's */
fail:
  free(json);
  return res;
}

static newt_result_t do_register(rdzv_etcd *c, const char *job, const rdzv_worker *w, int64_t host_lease,
                                 int64_t ttl_s, rdzv_etcd_lease_lost_fn lost, void *ud, newt_deadline_t d,
                                 rdzv_registration **out) {
  *out = NULL;
  NEWT_CHECK(rdzv_check_name("worker id", w->id));
  char suffix[128];
  snprintf(suffix, sizeof suffix, "workers/%s", w->id);
  rdzv_registration *r = calloc(1, sizeof *r);
  NEWT_CHECK_ALLOC(r);
  r->c = c;
  r->w = *w;
  r->ttl_s = ttl_s;
  r->lost = lost;
  r->ud = ud;
  r->host_lease = host_lease;
  newt_result_t res = rdzv_key(r->key, sizeof r->key, job, suffix);
  if (res == NEWT_OK) res = claim(r, job, d);
  if (res != NEWT_OK) {
    free(r);
    return res;
  }
  *out = r;
  return NEWT_OK;
}

newt_result_t rdzv_register(rdzv_etcd *c, const char *job, const rdzv_worker *w, int64_t ttl_s,
                            rdzv_etcd_lease_lost_fn lost, void *ud, newt_deadline_t d,
                            rdzv_registration **out) {
  return do_register(c, job, w, 0, ttl_s, lost, ud, d, out);
}

newt_result_t rdzv_register_on(rdzv_etcd *c, const char *job, const rdzv_worker *w, int64_t host_lease,
                               int64_t ttl_s, rdzv_etcd_lease_lost_fn lost, void *ud, newt_deadline_t d,
                               rdzv_registration **out) {
  if (host_lease <= 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "registering %s on a host lease: lease %lld is not one", w->id,
                    (long long)host_lease);
  return do_register(c, job, w, host_lease, ttl_s, lost, ud, d, out);
}

int rdzv_registration_shared(const rdzv_registration *r) { return r->shared; }

newt_result_t rdzv_registration_renew(rdzv_registration *r, const char *job, newt_deadline_t d) {
  int64_t lease = r->lease, ttl = 0;
  newt_result_t res = rdzv_etcd_lease_keepalive_once(r->c, lease, d, &ttl);
  if (res != NEWT_OK && res != NEWT_ERR_NOTFOUND) return res;
  if (res == NEWT_OK) {
    rdzv_etcd_kv kv;
    res = rdzv_etcd_get(r->c, r->key, d, &kv, NULL);
    if (res != NEWT_OK && res != NEWT_ERR_NOTFOUND) return res;
    int ours = res == NEWT_OK && kv.lease == lease;
    if (res == NEWT_OK) rdzv_etcd_kv_free(&kv);
    if (ours) {
      /* etcd kept the lease (it extends every lease when it restarts): keep it again */
      if (r->kept) rdzv_etcd_lease_unkeep(r->c, lease);
      r->kept = 0;
      return keep_lease(r, lease);
    }
    /* the lease lives, our key on it does not (deleted: fenced, or taken for dead by the
       host's agent): a lease of our own goes; the host's stays for the others, and the
       registration is written on it again */
    if (!r->shared) rdzv_etcd_lease_revoke(r->c, lease, d);
  } else if (r->shared) {
    r->host_lease = 0; /* the host's lease went: one of our own from now on */
  }
  if (r->kept) rdzv_etcd_lease_unkeep(r->c, lease);
  r->kept = 0;
  return claim(r, job, d);
}

/* The registration rewritten (state NULL: the same; ack NULL: the same while the generation
 * is, none when it changes), only while the key is still on our lease. */
static newt_result_t rewrite(rdzv_registration *r, const char *state, int64_t generation, const char *ack,
                             newt_deadline_t d) {
  rdzv_worker w = r->w;
  if (state) snprintf(w.state, sizeof w.state, "%s", state);
  if (ack) {
    if (strlen(ack) >= sizeof w.ack)
      return NEWT_ERR(NEWT_ERR_INVALID, "registration %s: ack of %zu bytes, more than %d", r->key, strlen(ack),
                      RDZV_ACK_MAX - 1);
    snprintf(w.ack, sizeof w.ack, "%s", ack);
  } else if (generation != w.generation) {
    w.ack[0] = '\0';
  }
  w.generation = generation;
  char *json;
  NEWT_CHECK(rdzv_worker_to_json(&w, &json));
  rdzv_etcd_cmp cmp = {.key = r->key, .target = RDZV_CMP_LEASE, .result = RDZV_CMP_EQUAL, .number = r->lease};
  rdzv_etcd_op put = {.type = RDZV_OP_PUT, .key = r->key, .value = json, .value_len = strlen(json), .lease = r->lease};
  rdzv_etcd_txn_result tr;
  newt_result_t res = rdzv_etcd_txn(r->c, &cmp, 1, &put, 1, NULL, 0, d, &tr);
  free(json);
  NEWT_CHECK(res);
  int ok = tr.succeeded;
  int64_t rev = tr.revision;
  rdzv_etcd_txn_result_free(&tr);
  if (!ok)
    return NEWT_ERR(NEWT_ERR_CONFLICT, "registration %s is no longer ours: lease %llx was lost", r->key,
                    (unsigned long long)r->lease);
  r->w = w;
  r->w.mod_revision = rev;
  return NEWT_OK;
}

newt_result_t rdzv_registration_update(rdzv_registration *r, const char *state, int64_t generation,
                                       newt_deadline_t d) {
  return rewrite(r, state, generation, NULL, d);
}

newt_result_t rdzv_registration_ack(rdzv_registration *r, const char *state, int64_t generation,
                                    const char *ack_json, newt_deadline_t d) {
  if (!ack_json || !*ack_json)
    return NEWT_ERR(NEWT_ERR_INVALID, "registration %s: an acknowledgement of generation %lld without its ack", r->key,
                    (long long)generation);
  return rewrite(r, state, generation, ack_json, d);
}

int64_t rdzv_registration_lease(const rdzv_registration *r) { return r->lease; }

int rdzv_registration_lost(rdzv_registration *r, char *why, size_t cap) {
  return rdzv_etcd_lease_lost(r->c, r->lease, why, cap) == 1;
}

newt_result_t rdzv_registration_leave(rdzv_registration *r, newt_deadline_t d) {
  if (r->kept) rdzv_etcd_lease_unkeep(r->c, r->lease);
  r->kept = 0;
  /* on the host's lease: only our key goes (the lease is the other workers' too) */
  newt_result_t res = r->shared ? delete_own_key(r, d) : rdzv_etcd_lease_revoke(r->c, r->lease, d);
  return res == NEWT_ERR_NOTFOUND ? NEWT_OK : res; /* already gone: left anyway */
}

void rdzv_registration_free(rdzv_registration *r) {
  if (!r) return;
  if (r->kept) rdzv_etcd_lease_unkeep(r->c, r->lease);
  free(r);
}

/* --- membership view ------------------------------------------------------------------------- */

struct rdzv_members {
  rdzv_etcd *c;
  char prefix[256];
  size_t prefix_len;
  rdzv_members_fn fn;
  void *ud;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  rdzv_worker *w; /* sorted by id */
  size_t n, cap;
  int64_t revision;        /* the view is current at this revision */
  int64_t change_revision; /* revision of the last change */
  int64_t acked_gen;       /* the generation acked_n counts (-1: none asked yet) */
  size_t acked_n;          /* members acknowledging acked_gen, kept up to date per change */
  rdzv_etcd_watch *watch;
};

static int cmp_worker(const void *a, const void *b) {
  return strcmp(((const rdzv_worker *)a)->id, ((const rdzv_worker *)b)->id);
}

/* Index of id, or -(insertion point) - 1. */
static long find_member(const rdzv_members *m, const char *id) {
  size_t lo = 0, hi = m->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int c = strcmp(m->w[mid].id, id);
    if (c == 0) return (long)mid;
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return -(long)lo - 1;
}

/* Decodes workers/<id> into *w; 0 when it is not a well-formed registration (logged). */
static int decode_member(const rdzv_members *m, const rdzv_etcd_kv *kv, rdzv_worker *w) {
  if (kv->key_len <= m->prefix_len || strchr(kv->key + m->prefix_len, '/')) return 0;
  const char *id = kv->key + m->prefix_len;
  char what[300];
  snprintf(what, sizeof what, "registration %.250s", kv->key);
  if (rdzv_worker_from_json(kv->value, kv->value_len, what, w) != NEWT_OK) {
    NEWT_WARN(RDZV, "ignoring a malformed worker registration: %s", newt_errmsg());
    return 0;
  }
  if (strcmp(w->id, id) != 0) {
    NEWT_WARN(RDZV, "ignoring registration %s: its id is \"%s\"", kv->key, w->id);
    return 0;
  }
  w->lease = kv->lease;
  w->create_revision = kv->create_revision;
  w->mod_revision = kv->mod_revision;
  return 1;
}

/* Changes to hand to the callback once the lock is dropped. */
typedef struct change_list {
  rdzv_member_event *ev;
  rdzv_worker *w;
  size_t n, cap;
} change_list;

static void note(change_list *cl, rdzv_member_change ch, int64_t rev, const rdzv_worker *w) {
  if (cl->n == cl->cap) {
    size_t cap = cl->cap ? cl->cap * 2 : 8;
    rdzv_member_event *ev = realloc(cl->ev, cap * sizeof *ev);
    if (ev) cl->ev = ev;
    rdzv_worker *ws = realloc(cl->w, cap * sizeof *ws);
    if (ws) cl->w = ws;
    if (!ev || !ws) {
      NEWT_ERROR(RDZV, "out of memory noting a membership change");
      return;
    }
    cl->cap = cap;
  }
  cl->ev[cl->n] = (rdzv_member_event){.change = ch, .revision = rev, .worker = NULL};
  if (w) cl->w[cl->n] = *w;
  else memset(&cl->w[cl->n], 0, sizeof cl->w[cl->n]);
  cl->n++;
}

static void deliver_changes(rdzv_members *m, change_list *cl) {
  for (size_t i = 0; i < cl->n; i++) {
    cl->ev[i].worker = cl->ev[i].change == RDZV_MEMBER_RESYNC ? NULL : &cl->w[i];
    if (m->fn) m->fn(m->ud, &cl->ev[i]);
  }
  free(cl->ev);
  free(cl->w);
}

static int insert_member(rdzv_members *m, size_t at, const rdzv_worker *w) {
  if (m->n == m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 16;
    rdzv_worker *p = realloc(m->w, cap * sizeof *p);
    if (!p) return 0;
    m->w = p;
    m->cap = cap;
  }
  memmove(&m->w[at + 1], &m->w[at], (m->n - at) * sizeof *m->w);
  m->w[at] = *w;
  m->n++;
  return 1;
}

static void remove_member(rdzv_members *m, size_t at) {
  memmove(&m->w[at], &m->w[at + 1], (m->n - at - 1) * sizeof *m->w);
  m->n--;
}

/* Applies one PUT / DELETE (under mu). */
static void apply_event(rdzv_members *m, const rdzv_etcd_event *e, change_list *cl) {
  if (e->kv.key_len <= m->prefix_len) return;
  const char *id = e->kv.key + m->prefix_len;
  long at = find_member(m, id);
  if (e->type == RDZV_EVENT_DELETE) {
    if (at >= 0) {
      note(cl, RDZV_MEMBER_LEAVE, e->kv.mod_revision, &m->w[at]);
      m->acked_n -= (size_t)rdzv_worker_acked(&m->w[at], m->acked_gen);
      remove_member(m, (size_t)at);
    }
    return;
  }
  rdzv_worker w;
  if (!decode_member(m, &e->kv, &w)) return;
  if (at >= 0) {
    m->acked_n -= (size_t)rdzv_worker_acked(&m->w[at], m->acked_gen);
    m->acked_n += (size_t)rdzv_worker_acked(&w, m->acked_gen);
    m->w[at] = w;
    note(cl, RDZV_MEMBER_UPDATE, e->kv.mod_revision, &w);
  } else if (insert_member(m, (size_t)(-at - 1), &w)) {
    m->acked_n += (size_t)rdzv_worker_acked(&w, m->acked_gen);
    note(cl, RDZV_MEMBER_JOIN, e->kv.mod_revision, &w);
  }
}

/* Replaces the table with kvs (a full read at rev), noting the difference. */
static void apply_snapshot(rdzv_members *m, const rdzv_etcd_kv *kvs, size_t n, int64_t rev, change_list *cl) {
  rdzv_worker *fresh = calloc(n ? n : 1, sizeof *fresh);
  if (!fresh) {
    NEWT_ERROR(RDZV, "out of memory re-reading %s", m->prefix);
    return;
  }
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (decode_member(m, &kvs[i], &fresh[k])) k++;
  qsort(fresh, k, sizeof *fresh, cmp_worker);
  size_t i = 0, j = 0;
  while (i < m->n || j < k) {
    int c = i == m->n ? 1 : j == k ? -1 : strcmp(m->w[i].id, fresh[j].id);
    if (c < 0) note(cl, RDZV_MEMBER_LEAVE, rev, &m->w[i++]);
    else if (c > 0) note(cl, RDZV_MEMBER_JOIN, rev, &fresh[j++]);
    else {
      if (m->w[i].mod_revision != fresh[j].mod_revision) note(cl, RDZV_MEMBER_UPDATE, rev, &fresh[j]);
      i++, j++;
    }
  }
  free(m->w);
  m->w = fresh;
  m->acked_n = 0;
  for (size_t a = 0; a < k; a++) m->acked_n += (size_t)rdzv_worker_acked(&fresh[a], m->acked_gen);
  m->n = k;
  m->cap = n ? n : 1;
}

static void on_members_watch(void *ud, const rdzv_etcd_watch_resp *r) {
  rdzv_members *m = ud;
  change_list cl = {0};
  pthread_mutex_lock(&m->mu);
  switch (r->kind) {
    case RDZV_WATCH_EVENTS:
      for (size_t i = 0; i < r->n_events; i++) apply_event(m, &r->events[i], &cl);
      break;
    case RDZV_WATCH_RESYNC:
      NEWT_INFO(RDZV, "members %s: history compacted, re-read at revision %lld", m->prefix, (long long)r->revision);
      note(&cl, RDZV_MEMBER_RESYNC, r->revision, NULL);
      apply_snapshot(m, r->kvs, r->n_kvs, r->revision, &cl);
      break;
    default: break;
  }
  if (r->kind != RDZV_WATCH_ERROR && r->revision > m->revision) m->revision = r->revision;
  if (cl.n) {
    m->change_revision = cl.ev[cl.n - 1].revision;
    pthread_cond_broadcast(&m->cv);
  }
  pthread_mutex_unlock(&m->mu);
  deliver_changes(m, &cl);
}

newt_result_t rdzv_members_start(rdzv_etcd *c, const char *job, rdzv_members_fn fn, void *ud, newt_deadline_t d,
                                 rdzv_members **out) {
  *out = NULL;
  rdzv_members *m = calloc(1, sizeof *m);
  NEWT_CHECK_ALLOC(m);
  m->c = c;
  m->fn = fn;
  m->ud = ud;
  m->acked_gen = -1;
  pthread_mutex_init(&m->mu, NULL);
  rdzv_cond_init(&m->cv);
  newt_result_t r = rdzv_key(m->prefix, sizeof m->prefix, job, "workers/");
  rdzv_etcd_kvs snap = {0};
  if (r == NEWT_OK) {
    m->prefix_len = strlen(m->prefix);
    rdzv_etcd_range_opts ro = {.prefix = 1};
    r = rdzv_etcd_range(c, m->prefix, &ro, d, &snap);
  }
  if (r != NEWT_OK) {
    rdzv_members_free(m);
    return r;
  }
  change_list cl = {0};
  apply_snapshot(m, snap.kvs, snap.n, snap.revision, &cl);
  /* the snapshot's members join at their own revisions */
  for (size_t i = 0; i < cl.n; i++) cl.ev[i].revision = cl.w[i].mod_revision;
  m->revision = m->change_revision = snap.revision;
  rdzv_etcd_kvs_free(&snap);
  deliver_changes(m, &cl);
  rdzv_etcd_watch_opts wo = {.prefix = 1, .start_revision = m->revision + 1};
  r = rdzv_etcd_watch_start(c, m->prefix, &wo, on_members_watch, m, d, &m->watch);
  if (r != NEWT_OK) {
    rdzv_members_free(m);
    return r;
  }
  *out = m;
  return NEWT_OK;
}

newt_result_t rdzv_members_get(rdzv_members *m, rdzv_worker **out, size_t *n, int64_t *revision) {
  pthread_mutex_lock(&m->mu);
  rdzv_worker *copy = malloc((m->n ? m->n : 1) * sizeof *copy);
  if (copy) {
    memcpy(copy, m->w, m->n * sizeof *copy);
    *n = m->n;
    if (revision) *revision = m->revision;
  }
  pthread_mutex_unlock(&m->mu);
  NEWT_CHECK_ALLOC(copy);
  *out = copy;
  return NEWT_OK;
}

size_t rdzv_members_count(rdzv_members *m) {
  pthread_mutex_lock(&m->mu);
  size_t n = m->n;
  pthread_mutex_unlock(&m->mu);
  return n;
}

size_t rdzv_members_count_acked(rdzv_members *m, int64_t generation) {
  pthread_mutex_lock(&m->mu);
  if (generation != m->acked_gen) { /* counted afresh once, then kept up to date per change */
    m->acked_gen = generation;
    m->acked_n = 0;
    for (size_t i = 0; i < m->n; i++) m->acked_n += (size_t)rdzv_worker_acked(&m->w[i], generation);
  }
  size_t n = m->acked_n;
  pthread_mutex_unlock(&m->mu);
  return n;
}

newt_result_t rdzv_members_wait(rdzv_members *m, int64_t after, newt_deadline_t d, const atomic_int *abort,
                                int64_t *revision) {
  newt_result_t r = NEWT_OK;
  pthread_mutex_lock(&m->mu);
  while (m->change_revision <= after && (r = cond_wait_slice(&m->cv, &m->mu, d, abort)) == NEWT_OK) {
  }
  int64_t rev = m->change_revision;
  pthread_mutex_unlock(&m->mu);
  if (r == NEWT_ERR_TIMEOUT)
    return NEWT_ERR(r, "membership of %s: no change after revision %lld by the deadline", m->prefix, (long long)after);
  if (r == NEWT_ERR_ABORTED) return NEWT_ERR(r, "waiting for a membership change of %s: aborted", m->prefix);
  if (revision) *revision = rev;
  return NEWT_OK;
}

void rdzv_members_free(rdzv_members *m) {
  if (!m) return;
  rdzv_etcd_watch_free(m->watch);
  free(m->w);
  pthread_mutex_destroy(&m->mu);
  pthread_cond_destroy(&m->cv);
  free(m);
}

/* --- spec, plan, events ------------------------------------------------------------------------- */

static newt_result_t get_string(rdzv_etcd *c, const char *job, const char *suffix, newt_deadline_t d, char **out,
                                int64_t *mod_revision) {
  char key[256];
  NEWT_CHECK(rdzv_key(key, sizeof key, job, suffix));
  rdzv_etcd_kv kv;
  NEWT_CHECK(rdzv_etcd_get(c, key, d, &kv, NULL));
  *out = kv.value;
  if (mod_revision) *mod_revision = kv.mod_revision;
  kv.value = NULL;
  rdzv_etcd_kv_free(&kv);
  return NEWT_OK;
}

newt_result_t rdzv_spec_put(rdzv_etcd *c, const char *job, const char *spec_json, newt_deadline_t d) {
  char key[256];
  NEWT_CHECK(rdzv_key(key, sizeof key, job, "spec"));
  cJSON *j;
  NEWT_CHECK(newt_json_parse(spec_json, strlen(spec_json), "spec", &j));
  cJSON_Delete(j);
  return rdzv_etcd_put(c, key, spec_json, strlen(spec_json), 0, d, NULL);
}

newt_result_t rdzv_spec_get(rdzv_etcd *c, const char *job, newt_deadline_t d, char **spec_json) {
  return get_string(c, job, "spec", d, spec_json, NULL);
}

static newt_result_t plan_generation(const char *json, size_t len, int64_t *gen) {
  cJSON *j;
  NEWT_CHECK(newt_json_parse(json, len, "plan", &j));
  *gen = -1;
  newt_result_t r = newt_json_get_int(j, "plan", "generation", 1, gen);
  cJSON_Delete(j);
  if (r == NEWT_OK && *gen < 0) return NEWT_ERR(NEWT_ERR_INVALID, "plan.generation: negative");
  return r;
}

newt_result_t rdzv_plan_get(rdzv_etcd *c, const char *job, newt_deadline_t d, char **json, int64_t *generation,
                            int64_t *mod_revision) {
  char *s;
  NEWT_CHECK(get_string(c, job, "plan", d, &s, mod_revision));
  int64_t g;
  newt_result_t r = plan_generation(s, strlen(s), &g);
  if (r != NEWT_OK) {
    free(s);
    return r;
  }
  if (generation) *generation = g;
  if (json) *json = s;
  else free(s);
  return NEWT_OK;
}

newt_result_t rdzv_event_post(rdzv_etcd *c, const char *job, const char *event_json, newt_deadline_t d) {
  cJSON *j;
  NEWT_CHECK(newt_json_parse(event_json, strlen(event_json), "event", &j));
  int is_obj = cJSON_IsObject(j);
  cJSON_Delete(j);
  if (!is_obj) return NEWT_ERR(NEWT_ERR_INVALID, "event: expected a JSON object");
  /* time, then this process's sequence (two events of one millisecond keep their order),
   * then a random tag (two processes' events of one millisecond do not collide) */
  static atomic_uint_fast32_t seq;
  unsigned n = (unsigned)atomic_fetch_add(&seq, 1);
  char rnd[9], suffix[80], key[256];
  NEWT_CHECK(newt_random_hex(rnd, 4));
  snprintf(suffix, sizeof suffix, "events/%016llu-%08x-%s", (unsigned long long)newt_wall_ms(), n, rnd);
  NEWT_CHECK(rdzv_key(key, sizeof key, job, suffix));
  return rdzv_etcd_put(c, key, event_json, strlen(event_json), 0, d, NULL);
}

/* --- generation barrier --------------------------------------------------------------------------- */

static newt_result_t acks_prefix(char *out, size_t cap, const char *job, int64_t generation) {
  if (generation < 0) return NEWT_ERR(NEWT_ERR_INVALID, "barrier: negative generation %lld", (long long)generation);
  char suffix[64];
  snprintf(suffix, sizeof suffix, "acks/%020lld/", (long long)generation);
  return rdzv_key(out, cap, job, suffix);
}

newt_result_t rdzv_barrier_ack(rdzv_etcd *c, const char *job, int64_t generation, const char *id, int64_t lease,
                               newt_deadline_t d) {
  NEWT_CHECK(rdzv_check_name("worker id", id));
  char key[256];
  NEWT_CHECK(acks_prefix(key, sizeof key - RDZV_NAME_MAX, job, generation));
  strcat(key, id);
  char val[64];
  snprintf(val, sizeof val, "{\"t\":%llu}", (unsigned long long)newt_wall_ms());
  return rdzv_etcd_put(c, key, val, strlen(val), lease, d, NULL);
}

/* A barrier counts a member as acknowledged when its key acks/<g>/<id> exists (ACK_KEY) or
 * its registration acknowledges g (ACK_REG); either is enough, and each comes and goes with
 * its key. */
enum { ACK_KEY = 1, ACK_REG = 2 };

typedef struct barrier {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  const char **ids; /* sorted */
  unsigned char *acked; /* ACK_KEY | ACK_REG per id */
  size_t n, have;
  int64_t generation;
  size_t ack_prefix_len, reg_prefix_len;
} barrier;

/* One of the barrier's two watches: which prefix it reads. */
typedef struct barrier_source {
  barrier *b;
  int bit;
} barrier_source;

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Sets or clears `bit` of the member whose id ends kv's key (ignored when it is none of ids). */
static void barrier_mark(barrier *b, int bit, const rdzv_etcd_kv *kv, int on) {
  size_t plen = bit == ACK_KEY ? b->ack_prefix_len : b->reg_prefix_len;
  if (kv->key_len <= plen) return;
  const char *id = kv->key + plen;
  if (strchr(id, '/')) return;
  const char **hit = bsearch(&id, b->ids, b->n, sizeof *b->ids, cmp_str);
  if (!hit) return;
  if (on && bit == ACK_REG) { /* a registration counts when it says it took up g */
    rdzv_worker w;
    char what[300];
    snprintf(what, sizeof what, "registration %.250s", kv->key);
    on = rdzv_worker_from_json(kv->value, kv->value_len, what, &w) == NEWT_OK && strcmp(w.id, id) == 0 &&
         rdzv_worker_acked(&w, b->generation);
  }
  size_t i = (size_t)(hit - b->ids);
  int was = b->acked[i] != 0;
  b->acked[i] = (unsigned char)(on ? b->acked[i] | bit : b->acked[i] & ~bit);
  int is = b->acked[i] != 0;
  if (is && !was) b->have++;
  if (was && !is) b->have--;
}

static void barrier_clear(barrier *b, int bit) {
  for (size_t i = 0; i < b->n; i++) {
    int was = b->acked[i] != 0;
    b->acked[i] = (unsigned char)(b->acked[i] & ~bit);
    if (was && !b->acked[i]) b->have--;
  }
}

static void on_barrier_watch(void *ud, const rdzv_etcd_watch_resp *r) {
  barrier_source *src = ud;
  barrier *b = src->b;
  pthread_mutex_lock(&b->mu);
  if (r->kind == RDZV_WATCH_EVENTS) {
    for (size_t i = 0; i < r->n_events; i++)
      barrier_mark(b, src->bit, &r->events[i].kv, r->events[i].type == RDZV_EVENT_PUT);
  } else if (r->kind == RDZV_WATCH_RESYNC) {
    barrier_clear(b, src->bit);
    for (size_t i = 0; i < r->n_kvs; i++) barrier_mark(b, src->bit, &r->kvs[i], 1);
  }
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

/* Reads one prefix into the barrier, then watches it from the next revision. */
static newt_result_t barrier_follow(rdzv_etcd *c, barrier_source *src, const char *prefix, newt_deadline_t d,
                                    rdzv_etcd_watch **w) {
  rdzv_etcd_kvs snap = {0};
  rdzv_etcd_range_opts ro = {.prefix = 1, .keys_only = src->bit == ACK_KEY};
  NEWT_CHECK(rdzv_etcd_range(c, prefix, &ro, d, &snap));
  pthread_mutex_lock(&src->b->mu);
  for (size_t i = 0; i < snap.n; i++) barrier_mark(src->b, src->bit, &snap.kvs[i], 1);
  pthread_mutex_unlock(&src->b->mu);
  rdzv_etcd_watch_opts wo = {.prefix = 1, .start_revision = snap.revision + 1};
  rdzv_etcd_kvs_free(&snap);
  return rdzv_etcd_watch_start(c, prefix, &wo, on_barrier_watch, src, d, w);
}

newt_result_t rdzv_barrier_wait(rdzv_etcd *c, const char *job, int64_t generation, const char *const *ids, size_t n,
                                newt_deadline_t d, const atomic_int *abort) {
  char ack_prefix[256], reg_prefix[256];
  NEWT_CHECK(acks_prefix(ack_prefix, sizeof ack_prefix, job, generation));
  NEWT_CHECK(rdzv_key(reg_prefix, sizeof reg_prefix, job, "workers/"));
  barrier b = {.n = n, .generation = generation, .ack_prefix_len = strlen(ack_prefix),
               .reg_prefix_len = strlen(reg_prefix)};
  b.ids = malloc((n ? n : 1) * sizeof *b.ids);
  b.acked = calloc(n ? n : 1, 1);
  if (!b.ids || !b.acked) {
    free(b.ids);
    free(b.acked);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a barrier of %zu", n);
  }
  memcpy(b.ids, ids, n * sizeof *ids);
  qsort(b.ids, n, sizeof *b.ids, cmp_str);
  pthread_mutex_init(&b.mu, NULL);
  rdzv_cond_init(&b.cv);
  barrier_source from_regs = {&b, ACK_REG}, from_keys = {&b, ACK_KEY};
  rdzv_etcd_watch *wr = NULL, *wk = NULL;
  newt_result_t r = barrier_follow(c, &from_regs, reg_prefix, d, &wr);
  if (r == NEWT_OK) r = barrier_follow(c, &from_keys, ack_prefix, d, &wk);
  if (r == NEWT_OK) {
    pthread_mutex_lock(&b.mu);
    while (b.have < n && (r = cond_wait_slice(&b.cv, &b.mu, d, abort)) == NEWT_OK) {
    }
    pthread_mutex_unlock(&b.mu);
  }
  rdzv_etcd_watch_free(wr); /* no callback runs after these */
  rdzv_etcd_watch_free(wk);
  if (r == NEWT_ERR_TIMEOUT || r == NEWT_ERR_ABORTED) {
    newt_buf missing;
    newt_buf_init(&missing);
    size_t shown = 0;
    for (size_t i = 0; i < n; i++) {
      if (b.acked[i]) continue;
      if (shown < 32) newt_buf_printf(&missing, "%s%s", shown ? ", " : "", b.ids[i]);
      shown++;
    }
    if (shown > 32) newt_buf_printf(&missing, " and %zu more", shown - 32);
    r = NEWT_ERR(r, "barrier of job %s generation %lld %s: %zu of %zu members did not acknowledge: %s", job,
                 (long long)generation, r == NEWT_ERR_TIMEOUT ? "timed out" : "aborted", n - b.have, n,
                 missing.data ? missing.data : "");
    newt_buf_free(&missing);
  }
  free(b.ids);
  free(b.acked);
  pthread_mutex_destroy(&b.mu);
  pthread_cond_destroy(&b.cv);
  return r;
}
