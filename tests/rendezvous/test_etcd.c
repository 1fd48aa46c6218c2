/* Integration tests of the etcd client against a real etcd started here (free loopback
 * ports, own data directory): key-value calls, txn, leases and keep-alive, watches
 * (order, cancel, progress, restart of etcd, compaction while disconnected), failover,
 * deadlines against an unreachable or stopped etcd. Auth and TLS are in test_etcd_secure.c. */
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "common/strutil.h"
#include "common/sys.h"
#include "rdzv_test.h"

static rdzv_etcd_server *srv;
static rdzv_etcd *cli;

static newt_deadline_t dl(int64_t ms) { return newt_deadline_in_ms(ms); }

static void test_kv(void) {
  int64_t rev1 = 0, rev2 = 0;
  T_OK(rdzv_etcd_put(cli, "/kv/a", "1", 1, 0, dl(5000), &rev1));
  T_OK(rdzv_etcd_put(cli, "/kv/b", "two", 3, 0, dl(5000), &rev2));
  T_OK(rdzv_etcd_put(cli, "/kv/c", "", 0, 0, dl(5000), NULL));
  T_OK(rdzv_etcd_put(cli, "/kv0", "outside", 7, 0, dl(5000), NULL)); /* just past the prefix's range_end "/kv/"+1 */
  T_CHECK(rev2 > rev1 && rev1 > 0);
  rdzv_etcd_kv kv;
  T_OK(rdzv_etcd_get(cli, "/kv/b", dl(5000), &kv, NULL));
  T_CHECK(kv.value_len == 3 && memcmp(kv.value, "two", 3) == 0 && kv.version == 1 && kv.create_revision == rev2);
  rdzv_etcd_kv_free(&kv);
  T_ERR(NEWT_ERR_NOTFOUND, rdzv_etcd_get(cli, "/kv/none", dl(5000), &kv, NULL));

  rdzv_etcd_kvs r;
  rdzv_etcd_range_opts ro = {.prefix = 1};
  T_OK(rdzv_etcd_range(cli, "/kv/", &ro, dl(5000), &r));
  T_CHECK(r.n == 3 && r.count == 3 && !r.more);
  if (r.n == 3) T_CHECK(strcmp(r.kvs[0].key, "/kv/a") == 0 && strcmp(r.kvs[2].key, "/kv/c") == 0 && r.kvs[2].value_len == 0);
  rdzv_etcd_kvs_free(&r);
  ro.limit = 2;
  T_OK(rdzv_etcd_range(cli, "/kv/", &ro, dl(5000), &r));
  T_CHECK(r.n == 2 && r.count == 3 && r.more);
  rdzv_etcd_kvs_free(&r);
  /* reading at an old revision */
  rdzv_etcd_range_opts at = {.prefix = 1, .revision = rev1};
  T_OK(rdzv_etcd_range(cli, "/kv/", &at, dl(5000), &r));
  T_CHECK(r.n == 1);
  rdzv_etcd_kvs_free(&r);
  rdzv_etcd_range_opts future = {.revision = rev2 + 1000};
  T_ERR(NEWT_ERR_INVALID, rdzv_etcd_range(cli, "/kv/a", &future, dl(5000), &r));
  T_CHECK(strstr(newt_errmsg(), "future revision") != NULL);
  /* binary values survive base64 */
  char bin[256];
  for (int i = 0; i < 256; i++) bin[i] = (char)i;
  T_OK(rdzv_etcd_put(cli, "/kv/bin", bin, sizeof bin, 0, dl(5000), NULL));
  T_OK(rdzv_etcd_get(cli, "/kv/bin", dl(5000), &kv, NULL));
  T_CHECK(kv.value_len == 256 && memcmp(kv.value, bin, 256) == 0);
  rdzv_etcd_kv_free(&kv);

  int64_t deleted = 0;
  T_OK(rdzv_etcd_delete(cli, "/kv/", 1, dl(5000), &deleted, NULL));
  T_CHECK(deleted == 4);
  T_OK(rdzv_etcd_get(cli, "/kv0", dl(5000), &kv, NULL)); /* outside the prefix: kept */
  rdzv_etcd_kv_free(&kv);
  T_OK(rdzv_etcd_delete(cli, "/kv0", 0, dl(5000), &deleted, NULL));
  T_CHECK(deleted == 1);
}

static void test_txn(void) {
  int64_t rev = 0;
  T_OK(rdzv_etcd_put(cli, "/txn/k", "v1", 2, 0, dl(5000), &rev));
  rdzv_etcd_op put = {.type = RDZV_OP_PUT, .key = "/txn/k", .value = "v2", .value_len = 2};
  rdzv_etcd_op get = {.type = RDZV_OP_RANGE, .key = "/txn/k"};
  rdzv_etcd_txn_result tr;
  struct {
    rdzv_etcd_cmp cmp;
    int expect;
  } cases[] = {
      {{.key = "/txn/k", .target = RDZV_CMP_CREATE, .result = RDZV_CMP_EQUAL, .number = rev}, 1},
      {{.key = "/txn/k", .target = RDZV_CMP_CREATE, .result = RDZV_CMP_EQUAL, .number = rev + 100}, 0},
      {{.key = "/txn/k", .target = RDZV_CMP_VERSION, .result = RDZV_CMP_EQUAL, .number = 2}, 1},
      {{.key = "/txn/k", .target = RDZV_CMP_MOD, .result = RDZV_CMP_LESS, .number = rev}, 0},
      {{.key = "/txn/k", .target = RDZV_CMP_VALUE, .result = RDZV_CMP_EQUAL, .value = "v2", .value_len = 2}, 1},
      {{.key = "/txn/k", .target = RDZV_CMP_VALUE, .result = RDZV_CMP_NOT_EQUAL, .value = "v2", .value_len = 2}, 0},
      {{.key = "/txn/absent", .target = RDZV_CMP_CREATE, .result = RDZV_CMP_EQUAL, .number = 0}, 1},
      {{.key = "/txn/k", .target = RDZV_CMP_LEASE, .result = RDZV_CMP_EQUAL, .number = 0}, 1},
      {{.key = "/txn/k", .target = RDZV_CMP_VERSION, .result = RDZV_CMP_GREATER, .number = 100}, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    T_OK(rdzv_etcd_txn(cli, &cases[i].cmp, 1, &put, 1, &get, 1, dl(5000), &tr));
    T_CHECK_MSG(tr.succeeded == cases[i].expect, "case %zu: succeeded %d", i, tr.succeeded);
    T_CHECK(tr.n == 1);
    if (!tr.succeeded && tr.n == 1) {
      T_CHECK(tr.results[0].type == RDZV_OP_RANGE && tr.results[0].range.n == 1);
    }
    rdzv_etcd_txn_result_free(&tr);
  }
  /* several ops, a delete among them */
  rdzv_etcd_op ops[] = {{.type = RDZV_OP_PUT, .key = "/txn/x", .value = "1", .value_len = 1},
                        {.type = RDZV_OP_DELETE, .key = "/txn/k"},
                        {.type = RDZV_OP_RANGE, .key = "/txn/", .prefix = 1}};
  T_OK(rdzv_etcd_txn(cli, NULL, 0, ops, 3, NULL, 0, dl(5000), &tr));
  T_CHECK(tr.succeeded && tr.n == 3);
  if (tr.n == 3) {
    T_CHECK(tr.results[1].type == RDZV_OP_DELETE && tr.results[1].deleted == 1);
    T_CHECK(tr.results[2].range.n == 1 && strcmp(tr.results[2].range.kvs[0].key, "/txn/x") == 0);
  }
  rdzv_etcd_txn_result_free(&tr);
  T_OK(rdzv_etcd_delete(cli, "/txn/", 1, dl(5000), NULL, NULL));
}

static void test_lease_calls(void) {
  int64_t lease = 0, granted = 0, ttl = 0;
  T_OK(rdzv_etcd_lease_grant(cli, 30, 0, dl(5000), &lease, &granted));
  T_CHECK(lease != 0 && granted == 30);
  T_OK(rdzv_etcd_put(cli, "/lease/k", "x", 1, lease, dl(5000), NULL));
  T_OK(rdzv_etcd_lease_ttl(cli, lease, dl(5000), &ttl, &granted));
  T_CHECK(ttl > 25 && ttl <= 30 && granted == 30);
  T_OK(rdzv_etcd_lease_keepalive_once(cli, lease, dl(5000), &ttl));
  T_CHECK(ttl == 30);
  rdzv_etcd_kv kv;
  T_OK(rdzv_etcd_get(cli, "/lease/k", dl(5000), &kv, NULL));
  T_CHECK(kv.lease == lease);
  rdzv_etcd_kv_free(&kv);
  T_OK(rdzv_etcd_lease_revoke(cli, lease, dl(5000)));
  T_ERR(NEWT_ERR_NOTFOUND, rdzv_etcd_get(cli, "/lease/k", dl(5000), &kv, NULL));
  T_ERR(NEWT_ERR_NOTFOUND, rdzv_etcd_lease_ttl(cli, lease, dl(5000), &ttl, NULL));
  T_ERR(NEWT_ERR_NOTFOUND, rdzv_etcd_lease_keepalive_once(cli, lease, dl(5000), &ttl));
  T_ERR(NEWT_ERR_NOTFOUND, rdzv_etcd_lease_revoke(cli, lease, dl(5000)));
  /* a chosen lease id */
  T_OK(rdzv_etcd_lease_grant(cli, 5, 0x1234567, dl(5000), &lease, NULL));
  T_CHECK(lease == 0x1234567);
  T_OK(rdzv_etcd_lease_revoke(cli, lease, dl(5000)));
}

typedef struct lost_rec {
  atomic_int n;
  atomic_llong at_ns;
  char why[512];
} lost_rec;

static void on_lost(void *ud, int64_t lease, const char *why) {
  lost_rec *l = ud;
  snprintf(l->why, sizeof l->why, "%s", why);
  atomic_store(&l->at_ns, (long long)newt_now_ns());
  atomic_fetch_add(&l->n, 1);
}

static void test_keepalive_and_lost(void) {
  int64_t lease = 0, ttl = 0;
  lost_rec lr = {0};
  T_OK(rdzv_etcd_lease_grant(cli, 2, 0, dl(5000), &lease, NULL));
  T_OK(rdzv_etcd_lease_keep(cli, lease, 2, on_lost, &lr));
  newt_sleep_ms(4500); /* more than twice the TTL: alive only through keep-alives */
  T_OK(rdzv_etcd_lease_ttl(cli, lease, dl(5000), &ttl, NULL));
  T_CHECK(atomic_load(&lr.n) == 0 && rdzv_etcd_lease_lost(cli, lease, NULL, 0) == 0);
  /* someone else revokes it: the owner hears of it at its next renewal (<= TTL/3) */
  rdzv_etcd *other = tu_client(srv);
  uint64_t t0 = newt_now_ns();
  T_OK(rdzv_etcd_lease_revoke(other, lease, dl(5000)));
  for (int i = 0; i < 100 && !atomic_load(&lr.n); i++) newt_sleep_ms(50);
  T_CHECK(atomic_load(&lr.n) == 1);
  double ms = (double)(atomic_load(&lr.at_ns) - (long long)t0) / 1e6;
  fprintf(stderr, "  lost lease reported %.0f ms after the revoke: %s\n", ms, lr.why);
  T_CHECK(ms < 2000);
  char why[512];
  T_CHECK(rdzv_etcd_lease_lost(cli, lease, why, sizeof why) == 1 && strstr(why, "gone"));
  rdzv_etcd_lease_unkeep(cli, lease);
  T_CHECK(rdzv_etcd_lease_lost(cli, lease, NULL, 0) == -1);
  rdzv_etcd_free(other);
}

/* --- watches --------------------------------------------------------------------------------- */

typedef struct seen {
  pthread_mutex_t mu;
  char keys[256][64];
  int types[256];
  int64_t revs[256];
  int n, progress, resyncs, errors;
  char resync_keys[16][64];
  int n_resync;
  int64_t last_rev;
  int out_of_order;
} seen;

static void on_watch(void *ud, const rdzv_etcd_watch_resp *r) {
  seen *s = ud;
  pthread_mutex_lock(&s->mu);
  if (r->kind == RDZV_WATCH_EVENTS) {
    for (size_t i = 0; i < r->n_events && s->n < 256; i++) {
      const rdzv_etcd_event *e = &r->events[i];
      if (e->kv.mod_revision <= s->last_rev) s->out_of_order++;
      s->last_rev = e->kv.mod_revision;
      snprintf(s->keys[s->n], 64, "%s", e->kv.key);
      s->types[s->n] = e->type;
      s->revs[s->n] = e->kv.mod_revision;
      s->n++;
    }
  } else if (r->kind == RDZV_WATCH_PROGRESS) {
    s->progress++;
  } else if (r->kind == RDZV_WATCH_RESYNC) {
    s->resyncs++;
    s->n_resync = 0;
    for (size_t i = 0; i < r->n_kvs && i < 16; i++) snprintf(s->resync_keys[s->n_resync++], 64, "%s", r->kvs[i].key);
    s->last_rev = r->revision;
  } else {
    s->errors++;
  }
  pthread_mutex_unlock(&s->mu);
}

static int seen_count(seen *s) {
  pthread_mutex_lock(&s->mu);
  int n = s->n;
  pthread_mutex_unlock(&s->mu);
  return n;
}

static int wait_seen(seen *s, int n, int64_t ms) {
  newt_deadline_t d = dl(ms);
  while (seen_count(s) < n && !newt_deadline_passed(d)) newt_sleep_ms(10);
  return seen_count(s) >= n;
}

static void test_watch_basic(void) {
  seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
  rdzv_etcd_watch *w;
  rdzv_etcd_watch_opts wo = {.prefix = 1, .prev_kv = 1};
  T_OK(rdzv_etcd_watch_start(cli, "/w/", &wo, on_watch, &s, dl(5000), &w));
  T_OK(rdzv_etcd_put(cli, "/w/a", "1", 1, 0, dl(5000), NULL));
  T_OK(rdzv_etcd_put(cli, "/w/b", "2", 1, 0, dl(5000), NULL));
  T_OK(rdzv_etcd_put(cli, "/wx", "not under the prefix", 20, 0, dl(5000), NULL));
  T_OK(rdzv_etcd_put(cli, "/w/a", "3", 1, 0, dl(5000), NULL));
  T_OK(rdzv_etcd_delete(cli, "/w/b", 0, dl(5000), NULL, NULL));
  T_CHECK(wait_seen(&s, 4, 5000));
  newt_sleep_ms(100);
  T_CHECK(seen_count(&s) == 4);
  T_CHECK(strcmp(s.keys[0], "/w/a") == 0 && strcmp(s.keys[1], "/w/b") == 0 && strcmp(s.keys[2], "/w/a") == 0);
  T_CHECK(s.types[3] == RDZV_EVENT_DELETE && s.out_of_order == 0);
  int64_t next = rdzv_etcd_watch_next_revision(w);
  T_CHECK(next == s.revs[3] + 1);
  /* cancel from another thread is prompt */
  uint64_t t0 = newt_now_ns();
  rdzv_etcd_watch_free(w);
  double ms = (double)(newt_now_ns() - t0) / 1e6;
  T_CHECK_MSG(ms < 1000, "cancel took %.0f ms", ms);
  /* a watch from an old revision replays history */
  seen s2 = {.mu = PTHREAD_MUTEX_INITIALIZER};
  rdzv_etcd_watch_opts old = {.prefix = 1, .start_revision = s.revs[0]};
  T_OK(rdzv_etcd_watch_start(cli, "/w/", &old, on_watch, &s2, dl(5000), &w));
  T_CHECK(wait_seen(&s2, 4, 5000));
  T_CHECK(s2.revs[0] == s.revs[0] && s2.revs[3] == s.revs[3]);
  rdzv_etcd_watch_free(w);
  T_OK(rdzv_etcd_delete(cli, "/w", 1, dl(5000), NULL, NULL));
}

static void test_watch_progress(void) {
  seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
  rdzv_etcd_watch *w;
  rdzv_etcd_watch_opts wo = {.prefix = 1, .progress_notify = 1, .idle_timeout_ms = 5000};
  T_OK(rdzv_etcd_watch_start(cli, "/progress/", &wo, on_watch, &s, dl(5000), &w));
  newt_sleep_ms(2500); /* the server sends one every 500 ms */
  pthread_mutex_lock(&s.mu);
  int p = s.progress;
  pthread_mutex_unlock(&s.mu);
  fprintf(stderr, "  %d progress notifications in 2.5 s\n", p);
  T_CHECK(p >= 1);
  rdzv_etcd_watch_free(w);
}

/* A writer that creates /r/NNN once each (create-if-absent, so a retried write cannot
 * duplicate an event), retrying while etcd is down. */
typedef struct writer {
  rdzv_etcd *c;
  int count;
  atomic_int done;
  int64_t gap_ms;
} writer;

static void *writer_main(void *arg) {
  writer *wr = arg;
  for (int i = 0; i < wr->count; i++) {
    char key[32];
    snprintf(key, sizeof key, "/r/%03d", i);
    rdzv_etcd_cmp cmp = {.key = key, .target = RDZV_CMP_CREATE, .result = RDZV_CMP_EQUAL, .number = 0};
    rdzv_etcd_op put = {.type = RDZV_OP_PUT, .key = key, .value = "x", .value_len = 1};
    while (rdzv_etcd_txn(wr->c, &cmp, 1, &put, 1, NULL, 0, dl(2000), NULL) != NEWT_OK) newt_sleep_ms(50);
    atomic_store(&wr->done, i + 1);
    newt_sleep_ms(wr->gap_ms);
  }
  return NULL;
}

static void test_restart_survival(void) {
  seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
  lost_rec lr = {0};
  rdzv_etcd_watch *w;
  rdzv_etcd_watch_opts wo = {.prefix = 1};
  T_OK(rdzv_etcd_watch_start(cli, "/r/", &wo, on_watch, &s, dl(5000), &w));
  int64_t lease = 0, ttl = 0;
  T_OK(rdzv_etcd_lease_grant(cli, 8, 0, dl(5000), &lease, NULL));
  T_OK(rdzv_etcd_put(cli, "/leased", "x", 1, lease, dl(5000), NULL));
  T_OK(rdzv_etcd_lease_keep(cli, lease, 8, on_lost, &lr));
  rdzv_etcd *wc = tu_client(srv);
  writer wr = {.c = wc, .count = 40, .gap_ms = 40};
  pthread_t th;
  pthread_create(&th, NULL, writer_main, &wr);
  while (atomic_load(&wr.done) < 10) newt_sleep_ms(5);
  T_OK(rdzv_etcd_server_kill(srv)); /* kill -9 in the middle of the writes */
  newt_sleep_ms(2500);
  T_OK(rdzv_etcd_server_restart(srv, dl(30000)));
  pthread_join(th, NULL);
  T_CHECK(wait_seen(&s, 40, 15000));
  newt_sleep_ms(200);
  pthread_mutex_lock(&s.mu);
  T_CHECK_MSG(s.n == 40, "%d events for 40 writes", s.n);
  for (int i = 0; i < s.n && i < 40; i++) {
    char key[32];
    snprintf(key, sizeof key, "/r/%03d", i);
    T_CHECK_MSG(strcmp(s.keys[i], key) == 0, "event %d is %s, expected %s", i, s.keys[i], key);
  }
  T_CHECK(s.out_of_order == 0);
  pthread_mutex_unlock(&s.mu);
  T_CHECK(rdzv_etcd_watch_reconnects(w) >= 1);
  fprintf(stderr, "  watch re-opened %lld time(s), %d events, lease lost %d\n",
          (long long)rdzv_etcd_watch_reconnects(w), s.n, atomic_load(&lr.n));
  /* the lease lived through it */
  T_CHECK(atomic_load(&lr.n) == 0);
  T_OK(rdzv_etcd_lease_ttl(cli, lease, dl(5000), &ttl, NULL));
  rdzv_etcd_kv kv;
  T_OK(rdzv_etcd_get(cli, "/leased", dl(5000), &kv, NULL));
  rdzv_etcd_kv_free(&kv);
  rdzv_etcd_lease_unkeep(cli, lease);
  T_OK(rdzv_etcd_lease_revoke(cli, lease, dl(5000)));
  rdzv_etcd_watch_free(w);
  rdzv_etcd_free(wc);
  T_OK(rdzv_etcd_delete(cli, "/r/", 1, dl(5000), NULL, NULL));
}

static void test_compaction_resync(void) {
  tu_proxy *px = tu_proxy_start(atoi(strrchr(rdzv_etcd_server_url(srv), ':') + 1));
  char ep[64];
  snprintf(ep, sizeof ep, "http://127.0.0.1:%d", tu_proxy_port(px));
  rdzv_etcd_opts po = {.endpoints = ep};
  rdzv_etcd *via = tu_client_opts(&po);
  seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
  rdzv_etcd_watch *w;
  rdzv_etcd_watch_opts wo = {.prefix = 1};
  T_OK(rdzv_etcd_put(cli, "/c/k1", "1", 1, 0, dl(5000), NULL));
  T_OK(rdzv_etcd_watch_start(via, "/c/", &wo, on_watch, &s, dl(5000), &w));
  T_OK(rdzv_etcd_put(cli, "/c/k2", "2", 1, 0, dl(5000), NULL));
  T_CHECK(wait_seen(&s, 1, 5000));
  tu_proxy_cut(px); /* the watch's connection is closed, and new ones refused */
  T_OK(rdzv_etcd_delete(cli, "/c/k1", 0, dl(5000), NULL, NULL));
  T_OK(rdzv_etcd_put(cli, "/c/k3", "3", 1, 0, dl(5000), NULL));
  int64_t rev = 0;
  T_OK(rdzv_etcd_put(cli, "/c/k2", "22", 2, 0, dl(5000), &rev));
  T_OK(rdzv_etcd_compact(cli, rev, dl(5000)));
  tu_proxy_restore(px);
  newt_deadline_t d = dl(10000);
  for (;;) {
    pthread_mutex_lock(&s.mu);
    int r = s.resyncs;
    pthread_mutex_unlock(&s.mu);
    if (r || newt_deadline_passed(d)) break;
    newt_sleep_ms(20);
  }
  pthread_mutex_lock(&s.mu);
  T_CHECK(s.resyncs == 1);
  T_CHECK_MSG(s.n_resync == 2 && strcmp(s.resync_keys[0], "/c/k2") == 0 && strcmp(s.resync_keys[1], "/c/k3") == 0,
              "resync held %d keys", s.n_resync);
  T_CHECK(s.last_rev >= rev);
  pthread_mutex_unlock(&s.mu);
  /* and it watches on after the resync */
  T_OK(rdzv_etcd_put(cli, "/c/k4", "4", 1, 0, dl(5000), NULL));
  T_CHECK(wait_seen(&s, 2, 5000));
  T_CHECK(strcmp(s.keys[1], "/c/k4") == 0);
  rdzv_etcd_watch_free(w);
  rdzv_etcd_free(via);
  tu_proxy_free(px);
  /* a watch started at a compacted revision begins with a resync */
  seen s2 = {.mu = PTHREAD_MUTEX_INITIALIZER};
  rdzv_etcd_watch_opts old = {.prefix = 1, .start_revision = 2};
  T_OK(rdzv_etcd_watch_start(cli, "/c/", &old, on_watch, &s2, dl(5000), &w));
  for (int i = 0; i < 200 && !s2.resyncs; i++) newt_sleep_ms(20);
  T_CHECK(s2.resyncs == 1 && s2.n_resync == 3);
  rdzv_etcd_watch_free(w);
  T_OK(rdzv_etcd_delete(cli, "/c/", 1, dl(5000), NULL, NULL));
}

static void test_unreachable_and_failover(void) {
  int dead_port = 0;
  T_OK(newt_net_free_port(&dead_port)); /* nothing listens there */
  char dead[64], both[256];
  snprintf(dead, sizeof dead, "http://127.0.0.1:%d", dead_port);
  rdzv_etcd_opts o = {.endpoints = dead, .connect_timeout_ms = 300};
  rdzv_etcd *c = tu_client_opts(&o);
  uint64_t t0 = newt_now_ns();
  newt_result_t r = rdzv_etcd_put(c, "/x", "1", 1, 0, dl(700), NULL);
  double ms = (double)(newt_now_ns() - t0) / 1e6;
  T_CHECK(r == NEWT_ERR_UNAVAILABLE);
  T_CHECK_MSG(strstr(newt_errmsg(), dead) != NULL, "message does not name %s: %s", dead, newt_errmsg());
  fprintf(stderr, "  unreachable: %.0f ms: %s\n", ms, newt_errmsg());
  T_CHECK(ms >= 650 && ms < 3000);
  rdzv_etcd_watch *w;
  T_ERR(NEWT_ERR_UNAVAILABLE, rdzv_etcd_watch_start(c, "/x", NULL, NULL, NULL, dl(700), &w));
  T_CHECK(strstr(newt_errmsg(), dead) != NULL);
  rdzv_etcd_free(c);
  /* failover: the dead endpoint first, the live one second */
  snprintf(both, sizeof both, "%s,%s", dead, rdzv_etcd_server_url(srv));
  o.endpoints = both;
  c = tu_client_opts(&o);
  T_OK(rdzv_etcd_put(c, "/failover", "1", 1, 0, dl(5000), NULL));
  seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
  T_OK(rdzv_etcd_watch_start(c, "/failover", NULL, on_watch, &s, dl(5000), &w));
  T_OK(rdzv_etcd_put(c, "/failover", "2", 1, 0, dl(5000), NULL));
  T_CHECK(wait_seen(&s, 1, 5000));
  rdzv_etcd_watch_free(w);
  rdzv_etcd_free(c);
}

static void test_stopped_etcd_deadline(void) {
  T_OK(rdzv_etcd_server_pause(srv));
  uint64_t t0 = newt_now_ns();
  newt_result_t r = rdzv_etcd_put(cli, "/stopped", "1", 1, 0, dl(800), NULL);
  double ms = (double)(newt_now_ns() - t0) / 1e6;
  T_CHECK(r == NEWT_ERR_TIMEOUT || r == NEWT_ERR_UNAVAILABLE);
  T_CHECK(strstr(newt_errmsg(), rdzv_etcd_server_url(srv)) != NULL);
  fprintf(stderr, "  stopped etcd: %s after %.0f ms: %s\n", newt_result_name(r), ms, newt_errmsg());
  T_CHECK(ms >= 750 && ms < 3000);
  T_OK(rdzv_etcd_server_resume(srv));
  T_OK(rdzv_etcd_put(cli, "/stopped", "1", 1, 0, dl(10000), NULL));
}

int main(void) {
  rdzv_etcd_server_opts so = {.progress_notify_ms = 500};
  srv = tu_server(&so);
  cli = tu_client(srv);
  T_RUN(test_kv);
  T_RUN(test_txn);
  T_RUN(test_lease_calls);
  T_RUN(test_keepalive_and_lost);
  T_RUN(test_watch_basic);
  T_RUN(test_watch_progress);
  T_RUN(test_unreachable_and_failover);
  T_RUN(test_stopped_etcd_deadline);
  T_RUN(test_compaction_resync);
  T_RUN(test_restart_survival);
  rdzv_etcd_free(cli);
  rdzv_etcd_server_free(srv);
  return T_DONE();
}
