/* Leader election among candidates, and the writes only a leader may make (rdzv.h).
 *
 * Each candidate holds a lease and one key on it, <prefix><lease hex>. The leader is the
 * candidate whose key has the lowest create_revision. Since revisions only grow, no key
 * created later can ever sort before an existing one: a candidate that once held the
 * lowest key keeps leading for exactly as long as its key exists. That is what makes the
 * guard of every leader write sound: a transaction that compares "my key's
 * create_revision is still mine" succeeds only while this candidate leads, whatever its
 * own view of the world (a leader paused by SIGSTOP past its TTL comes back deposed, and
 * its first guarded write fails with NEWT_ERR_CONFLICT).
 *
 * A candidate learns of changes through a watch of the prefix (snapshot first, then the
 * watch from the snapshot's revision + 1), and of its own lease's loss from the
 * keep-alive thread, which gives up on it locally no later than etcd can expire it (the
 * local expiry counts from when a renewal was sent, etcd's from when it arrived). State
 * changes are reported to the leadership callback in order, one at a time. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/strutil.h"
#include "rendezvous/etcd_internal.h"
#include "rendezvous/rdzv.h"

typedef struct cand_key {
  char *key;
  int64_t create_revision;
} cand_key;

struct rdzv_candidate {
  rdzv_etcd *c;
  char prefix[200];
  char key[256];
  char name[RDZV_NAME_MAX];
  int64_t lease, ttl_s, create_revision;
  rdzv_leadership_fn fn;
  void *ud;
  pthread_mutex_t mu; /* everything below */
  pthread_cond_t cv;
  cand_key *keys;
  size_t n, cap;
  int leading, ever_led, lost, kept;
  uint64_t aborts; /* rdzv_candidate_abort calls: a wait ends when this moves */
  char why[512];
  pthread_mutex_t notify_mu; /* serializes evaluation + callback, so reports stay in order */
  int reported;              /* the last state given to fn */
  rdzv_etcd_watch *watch;
};

static void put_key_locked(rdzv_candidate *c, const rdzv_etcd_kv *kv);

static void set_keys_locked(rdzv_candidate *c, const rdzv_etcd_kv *kvs, size_t n) {
  for (size_t i = 0; i < c->n; i++) free(c->keys[i].key);
  c->n = 0;
  for (size_t i = 0; i < n; i++) put_key_locked(c, &kvs[i]);
}

static void del_key_locked(rdzv_candidate *c, const char *key) {
  for (size_t i = 0; i < c->n; i++) {
    if (strcmp(c->keys[i].key, key) == 0) {
      free(c->keys[i].key);
      c->keys[i] = c->keys[--c->n];
      return;
    }
  }
}

static void put_key_locked(rdzv_candidate *c, const rdzv_etcd_kv *kv) {
  for (size_t i = 0; i < c->n; i++)
    if (strcmp(c->keys[i].key, kv->key) == 0) return; /* an update keeps its create_revision */
  if (c->n == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 8;
    cand_key *p = realloc(c->keys, cap * sizeof *p);
    if (!p) return;
    c->keys = p;
    c->cap = cap;
  }
  c->keys[c->n].key = newt_strdup(kv->key);
  c->keys[c->n].create_revision = kv->create_revision;
  if (c->keys[c->n].key) c->n++;
}

/* Recomputes leadership from the table (under mu). Sets lost when our key is gone. */
static void recompute_locked(rdzv_candidate *c) {
  int mine = 0;
  int64_t lowest = INT64_MAX;
  for (size_t i = 0; i < c->n; i++) {
    if (c->keys[i].create_revision < lowest) lowest = c->keys[i].create_revision;
    if (strcmp(c->keys[i].key, c->key) == 0) mine = 1;
  }
  if (!mine && !c->lost) {
    c->lost = 1;
    snprintf(c->why, sizeof c->why, "candidacy key %s was deleted", c->key);
  }
  c->leading = !c->lost && mine && lowest == c->create_revision;
  if (c->leading) c->ever_led = 1;
  pthread_cond_broadcast(&c->cv);
}

/* Reports a change of state to fn, in order. */
static void report(rdzv_candidate *c) {
  pthread_mutex_lock(&c->notify_mu);
  pthread_mutex_lock(&c->mu);
  int now = c->leading;
  char why[sizeof c->why];
  snprintf(why, sizeof why, "%s", now ? "lowest create_revision in the election" : c->lost ? c->why : "another candidate leads");
  int changed = now != c->reported;
  c->reported = now;
  pthread_mutex_unlock(&c->mu);
  if (changed) {
    NEWT_INFO(RDZV, "%s: %s (%s)", c->name, now ? "leading" : "not leading", why);
    if (c->fn) c->fn(c->ud, now, why);
  }
  pthread_mutex_unlock(&c->notify_mu);
}

static void deposed(rdzv_candidate *c, const char *why);

static void on_lease_lost(void *ud, int64_t lease, const char *why) { deposed(ud, why); }

static void on_election_watch(void *ud, const rdzv_etcd_watch_resp *r) {
  rdzv_candidate *c = ud;
  if (r->kind != RDZV_WATCH_EVENTS && r->kind != RDZV_WATCH_RESYNC) return;
  pthread_mutex_lock(&c->mu);
  if (r->kind == RDZV_WATCH_RESYNC) {
    set_keys_locked(c, r->kvs, r->n_kvs);
  } else {
    for (size_t i = 0; i < r->n_events; i++) {
      const rdzv_etcd_event *e = &r->events[i];
      if (e->type == RDZV_EVENT_DELETE) del_key_locked(c, e->kv.key);
      else put_key_locked(c, &e->kv);
    }
  }
  recompute_locked(c);
  pthread_mutex_unlock(&c->mu);
  report(c);
}

newt_result_t rdzv_campaign(rdzv_etcd *ec, const char *prefix, const rdzv_campaign_opts *o, newt_deadline_t d,
                            rdzv_candidate **out) {
  *out = NULL;
  const char *name = o && o->name ? o->name : "coordinator";
  NEWT_CHECK(newt_check_name("candidate name", name));
  int64_t ttl = o && o->ttl_s > 0 ? o->ttl_s : 10;
  rdzv_candidate *c = calloc(1, sizeof *c);
  NEWT_CHECK_ALLOC(c);
  c->c = ec;
  c->ttl_s = ttl;
  c->fn = o ? o->fn : NULL;
  c->ud = o ? o->ud : NULL;
  snprintf(c->name, sizeof c->name, "%s", name);
  pthread_mutex_init(&c->mu, NULL);
  pthread_mutex_init(&c->notify_mu, NULL);
  rdzv_cond_init(&c->cv);
  newt_result_t r = NEWT_OK;
  const char *val = o && o->value ? o->value : c->name;
  rdzv_etcd_kvs snap = {0};
  if (strlen(prefix) >= sizeof c->prefix)
    NEWT_CHECK_GOTO(NEWT_ERR(NEWT_ERR_INVALID, "election %.80s...: prefix too long", prefix), r, fail);
  snprintf(c->prefix, sizeof c->prefix, "%s", prefix);
  NEWT_CHECK_GOTO(rdzv_etcd_lease_grant(ec, ttl, 0, d, &c->lease, NULL), r, fail);
  snprintf(c->key, sizeof c->key, "%s%016llx", c->prefix, (unsigned long long)c->lease);
  NEWT_CHECK_GOTO(rdzv_etcd_put(ec, c->key, val, strlen(val), c->lease, d, &c->create_revision), r, fail_lease);
  NEWT_CHECK_GOTO(rdzv_etcd_lease_keep(ec, c->lease, ttl, on_lease_lost, c), r, fail_lease);
  c->kept = 1;
  rdzv_etcd_range_opts ro = {.prefix = 1, .keys_only = 1};
  NEWT_CHECK_GOTO(rdzv_etcd_range(ec, c->prefix, &ro, d, &snap), r, fail_keep);
  pthread_mutex_lock(&c->mu);
  set_keys_locked(c, snap.kvs, snap.n);
  pthread_mutex_unlock(&c->mu);
  rdzv_etcd_watch_opts wo = {.prefix = 1, .start_revision = snap.revision + 1};
  rdzv_etcd_kvs_free(&snap);
  NEWT_CHECK_GOTO(rdzv_etcd_watch_start(ec, c->prefix, &wo, on_election_watch, c, d, &c->watch), r, fail_keep);
  pthread_mutex_lock(&c->mu);
  recompute_locked(c);
  pthread_mutex_unlock(&c->mu);
  report(c);
  NEWT_INFO(RDZV, "%s: candidate (key %s, create_revision %lld, TTL %lld s)", c->name, c->key,
            (long long)c->create_revision, (long long)ttl);
  *out = c;
  return NEWT_OK;
fail_keep:
  rdzv_etcd_lease_unkeep(ec, c->lease);
  c->kept = 0;
fail_lease:
  rdzv_etcd_lease_revoke(ec, c->lease, newt_deadline_in_ms(1000));
fail:
  rdzv_candidate_free(c);
  return r;
}

newt_result_t rdzv_candidate_wait(rdzv_candidate *c, newt_deadline_t d) {
  pthread_mutex_lock(&c->mu);
  newt_result_t r = NEWT_OK;
  uint64_t aborts = c->aborts;
  while (!c->leading && !c->lost && c->aborts == aborts) {
    if (newt_deadline_passed(d)) {
      r = NEWT_ERR_TIMEOUT;
      break;
    }
    if (d == NEWT_DEADLINE_NONE) pthread_cond_wait(&c->cv, &c->mu);
    else {
      struct timespec ts = {(time_t)(d / 1000000000ull), (long)(d % 1000000000ull)};
      pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
  }
  if (r == NEWT_OK && !c->leading) r = c->lost ? NEWT_ERR_CONFLICT : NEWT_ERR_ABORTED;
  char why[sizeof c->why];
  snprintf(why, sizeof why, "%s", c->why);
  pthread_mutex_unlock(&c->mu);
  switch (r) {
    case NEWT_OK: return NEWT_OK;
    case NEWT_ERR_TIMEOUT: return NEWT_ERR(r, "%s: not leading %s by the deadline (another candidate leads)", c->name, c->prefix);
    case NEWT_ERR_ABORTED: return NEWT_ERR(r, "%s: waiting for leadership of %s: aborted", c->name, c->prefix);
    default: return NEWT_ERR(r, "%s: lost its candidacy in %s: %s", c->name, c->prefix, why);
  }
}

void rdzv_candidate_abort(rdzv_candidate *c) {
  pthread_mutex_lock(&c->mu);
  c->aborts++;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

int rdzv_candidate_is_leader(rdzv_candidate *c) {
  pthread_mutex_lock(&c->mu);
  int l = c->leading;
  pthread_mutex_unlock(&c->mu);
  return l;
}

int64_t rdzv_candidate_lease(const rdzv_candidate *c) { return c->lease; }
const char *rdzv_candidate_key(const rdzv_candidate *c) { return c->key; }

newt_result_t rdzv_candidate_renew(rdzv_candidate *c, newt_deadline_t d) {
  pthread_mutex_lock(&c->mu);
  int lost = c->lost;
  pthread_mutex_unlock(&c->mu);
  if (!lost) return NEWT_OK;
  int64_t ttl = 0;
  newt_result_t r = rdzv_etcd_lease_keepalive_once(c->c, c->lease, d, &ttl);
  if (r == NEWT_ERR_NOTFOUND)
    return NEWT_ERR(NEWT_ERR_CONFLICT, "%s: its candidacy lease %llx expired", c->name, (unsigned long long)c->lease);
  NEWT_CHECK(r);
  rdzv_etcd_range_opts ro = {.prefix = 1, .keys_only = 1};
  rdzv_etcd_kvs snap;
  NEWT_CHECK(rdzv_etcd_range(c->c, c->prefix, &ro, d, &snap));
  int mine = 0;
  for (size_t i = 0; i < snap.n && !mine; i++)
    mine = strcmp(snap.kvs[i].key, c->key) == 0 && snap.kvs[i].create_revision == c->create_revision;
  if (!mine) {
    rdzv_etcd_kvs_free(&snap);
    return NEWT_ERR(NEWT_ERR_CONFLICT, "%s: its candidacy key %s is gone", c->name, c->key);
  }
  if (c->kept) rdzv_etcd_lease_unkeep(c->c, c->lease);
  c->kept = 0;
  r = rdzv_etcd_lease_keep(c->c, c->lease, c->ttl_s, on_lease_lost, c);
  if (r != NEWT_OK) {
    rdzv_etcd_kvs_free(&snap);
    return r;
  }
  c->kept = 1;
  pthread_mutex_lock(&c->mu);
  c->lost = 0;
  c->why[0] = '\0';
  set_keys_locked(c, snap.kvs, snap.n);
  recompute_locked(c);
  pthread_mutex_unlock(&c->mu);
  rdzv_etcd_kvs_free(&snap);
  NEWT_INFO(RDZV, "%s: candidacy kept across an etcd outage (lease %llx)", c->name, (unsigned long long)c->lease);
  report(c);
  return NEWT_OK;
}

/* Marks this candidate deposed (its key is gone though the watch may not have said so). */
static void deposed(rdzv_candidate *c, const char *why) {
  pthread_mutex_lock(&c->mu);
  if (!c->lost) {
    c->lost = 1;
    snprintf(c->why, sizeof c->why, "%s", why);
  }
  c->leading = 0;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  report(c);
}

newt_result_t rdzv_guarded_txn(rdzv_candidate *c, const rdzv_etcd_cmp *cmps, size_t ncmp, const rdzv_etcd_op *ops,
                               size_t nops, newt_deadline_t d, rdzv_etcd_txn_result *out) {
  if (out) memset(out, 0, sizeof *out);
  pthread_mutex_lock(&c->mu);
  int may = c->ever_led && !c->lost;
  pthread_mutex_unlock(&c->mu);
  if (!may)
    return NEWT_ERR(NEWT_ERR_CONFLICT, "%s: not the leader of %s: the write is refused", c->name, c->prefix);
  rdzv_etcd_cmp *all = calloc(ncmp + 1, sizeof *all);
  NEWT_CHECK_ALLOC(all);
  all[0] = (rdzv_etcd_cmp){.key = c->key, .target = RDZV_CMP_CREATE, .result = RDZV_CMP_EQUAL,
                           .number = c->create_revision};
  if (ncmp) memcpy(all + 1, cmps, ncmp * sizeof *cmps);
  rdzv_etcd_op check = {.type = RDZV_OP_RANGE, .key = c->key};
  rdzv_etcd_txn_result tr;
  newt_result_t r = rdzv_etcd_txn(c->c, all, ncmp + 1, ops, nops, &check, 1, d, &tr);
  free(all);
  NEWT_CHECK(r);
  if (tr.succeeded) {
    if (out) *out = tr;
    else rdzv_etcd_txn_result_free(&tr);
    return NEWT_OK;
  }
  int key_gone = tr.n < 1 || tr.results[0].range.n == 0 ||
                 tr.results[0].range.kvs[0].create_revision != c->create_revision;
  rdzv_etcd_txn_result_free(&tr);
  if (key_gone) {
    char why[400];
    snprintf(why, sizeof why, "deposed: candidacy key %s is gone (lease expired or revoked)", c->key);
    deposed(c, why);
    return NEWT_ERR(NEWT_ERR_CONFLICT, "%s: write refused, %s", c->name, why);
  }
  return NEWT_ERR(NEWT_ERR_CONFLICT, "%s: still leader, but the write's own compares failed", c->name);
}

newt_result_t rdzv_guarded_put(rdzv_candidate *c, const char *key, const void *value, size_t len, newt_deadline_t d,
                               int64_t *revision) {
  rdzv_etcd_op put = {.type = RDZV_OP_PUT, .key = key, .value = value, .value_len = len};
  rdzv_etcd_txn_result tr;
  NEWT_CHECK(rdzv_guarded_txn(c, NULL, 0, &put, 1, d, &tr));
  if (revision) *revision = tr.revision;
  rdzv_etcd_txn_result_free(&tr);
  return NEWT_OK;
}

newt_result_t rdzv_candidate_resign(rdzv_candidate *c, newt_deadline_t d) {
  if (c->kept) rdzv_etcd_lease_unkeep(c->c, c->lease);
  c->kept = 0;
  deposed(c, "resigned");
  newt_result_t r = rdzv_etcd_lease_revoke(c->c, c->lease, d);
  return r == NEWT_ERR_NOTFOUND ? NEWT_OK : r;
}

void rdzv_candidate_free(rdzv_candidate *c) {
  if (!c) return;
  rdzv_etcd_watch_free(c->watch);
  if (c->kept) rdzv_etcd_lease_unkeep(c->c, c->lease);
  set_keys_locked(c, NULL, 0);
  free(c->keys);
  pthread_mutex_destroy(&c->mu);
  pthread_mutex_destroy(&c->notify_mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

newt_result_t rdzv_leader_get(rdzv_etcd *c, const char *prefix, newt_deadline_t d, rdzv_etcd_kv *leader) {
  rdzv_etcd_range_opts ro = {.prefix = 1, .limit = 1, .sort = RDZV_SORT_CREATE_ASCEND};
  rdzv_etcd_kvs r;
  NEWT_CHECK(rdzv_etcd_range(c, prefix, &ro, d, &r));
  if (r.n == 0) {
    rdzv_etcd_kvs_free(&r);
    return NEWT_ERR(NEWT_ERR_NOTFOUND, "%s: no candidate is running for leader", prefix);
  }
  *leader = r.kvs[0]; /* the lowest create_revision leads */
  memset(&r.kvs[0], 0, sizeof r.kvs[0]);
  rdzv_etcd_kvs_free(&r);
  return NEWT_OK;
}
