/* Lease keep-alive: one background thread per client renews every kept lease.
 *
 * Each kept lease has a due time (a third of its TTL after the last renewal was sent) and
 * a local expiry (the last successful renewal's send time + the TTL etcd answered with).
 * The thread sleeps on a condition variable until the earliest due time, renews that
 * lease (POST /v3/lease/keepalive, one request, one answer line), and:
 *   - on success moves due and expiry on;
 *   - when etcd answers TTL 0 (the lease is gone) reports the lease lost at once;
 *   - on any other failure (etcd down, restarting, stopped) retries every 200 ms, and
 *     reports the lease lost when the local expiry passes without a renewal: it may have
 *     expired on the server, so the owner must stop acting on it.
 * An etcd restart of a few seconds is therefore survived by any lease whose TTL is
 * longer than the outage (etcd also extends every lease's TTL when it becomes leader).
 * The lost callback runs on this thread, outside the lock; unkeep waits for a callback of
 * its lease that is running, so the owner may free what the callback uses afterwards.
 *
 * The kept leases are found by id through a hash of buckets and the next one due through a
 * heap of those not lost, so that a client keeping many (newt bench rendezvous plays 12,500
 * hosts' agents) costs a logarithm per keep, renewal and look-up, not a scan of them all. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "rendezvous/etcd_internal.h"

struct rdzv_lease_entry {
  int64_t id;
  int64_t ttl_s;
  rdzv_etcd_lease_lost_fn fn;
  void *ud;
  uint64_t due_ns;
  uint64_t expires_ns;
  int lost;
  char why[512];
  rdzv_lease_entry *next; /* in its bucket */
  size_t heap_i;          /* its place in the heap (SIZE_MAX: not there, lost) */
};

#define LEASE_BUCKETS 4096

struct rdzv_lease_table {
  rdzv_lease_entry *bucket[LEASE_BUCKETS];
  rdzv_lease_entry **heap; /* by due_ns, the earliest first */
  size_t n, cap;
};

static rdzv_lease_entry **slot_of(struct rdzv_lease_table *t, int64_t id) {
  uint64_t h = (uint64_t)id * 0x9E3779B97F4A7C15ull;
  return &t->bucket[h >> 52]; /* the top 12 bits: LEASE_BUCKETS */
}

static rdzv_lease_entry *find(rdzv_etcd *c, int64_t id) {
  if (!c->leases) return NULL;
  for (rdzv_lease_entry *e = *slot_of(c->leases, id); e; e = e->next)
    if (e->id == id) return e;
  return NULL;
}

/* --- the heap of due times ---------------------------------------------------------------- */

static void heap_set(struct rdzv_lease_table *t, size_t i, rdzv_lease_entry *e) {
  t->heap[i] = e;
  e->heap_i = i;
}

static void heap_up(struct rdzv_lease_table *t, size_t i) {
  rdzv_lease_entry *e = t->heap[i];
  while (i > 0 && t->heap[(i - 1) / 2]->due_ns > e->due_ns) {
    heap_set(t, i, t->heap[(i - 1) / 2]);
    i = (i - 1) / 2;
  }
  heap_set(t, i, e);
}

static void heap_down(struct rdzv_lease_table *t, size_t i) {
  rdzv_lease_entry *e = t->heap[i];
  for (;;) {
    size_t k = 2 * i + 1;
    if (k >= t->n) break;
    if (k + 1 < t->n && t->heap[k + 1]->due_ns < t->heap[k]->due_ns) k++;
    if (t->heap[k]->due_ns >= e->due_ns) break;
    heap_set(t, i, t->heap[k]);
    i = k;
  }
  heap_set(t, i, e);
}

/* Its due time changed: its place in the heap too. */
static void heap_fix(struct rdzv_lease_table *t, rdzv_lease_entry *e) {
  if (e->heap_i == SIZE_MAX) return;
  heap_up(t, e->heap_i);
  heap_down(t, e->heap_i);
}

static void heap_remove(struct rdzv_lease_table *t, rdzv_lease_entry *e) {
  size_t i = e->heap_i;
  if (i == SIZE_MAX) return;
  e->heap_i = SIZE_MAX;
  rdzv_lease_entry *last = t->heap[--t->n];
  if (i == t->n) return;
  heap_set(t, i, last);
  heap_fix(t, last);
}

static void timed_wait(rdzv_etcd *c, uint64_t until_ns) {
  struct timespec ts = {(time_t)(until_ns / 1000000000ull), (long)(until_ns % 1000000000ull)};
  pthread_cond_timedwait(&c->ka_cv, &c->ka_mu, &ts);
}

static void *keepalive_main(void *arg) {
  rdzv_etcd *c = arg;
  pthread_mutex_lock(&c->ka_mu);
  while (!c->ka_stop) {
    rdzv_lease_entry *next = c->leases && c->leases->n ? c->leases->heap[0] : NULL;
    uint64_t now = newt_now_ns();
    if (!next) {
      pthread_cond_wait(&c->ka_cv, &c->ka_mu);
      continue;
    }
    if (next->due_ns > now) {
      timed_wait(c, next->due_ns);
      continue;
    }
    int64_t id = next->id, ttl = next->ttl_s;
    pthread_mutex_unlock(&c->ka_mu);

    int64_t per_call_ms = ttl * 1000 / 3;
    if (per_call_ms > 2000) per_call_ms = 2000;
    if (per_call_ms < 200) per_call_ms = 200;
    uint64_t sent = newt_now_ns();
    int64_t got_ttl = 0;
    newt_result_t r = rdzv_etcd_lease_keepalive_once(c, id, newt_deadline_in_ms(per_call_ms), &got_ttl);
    char err[400];
    snprintf(err, sizeof err, "%s", r == NEWT_OK ? "" : newt_errmsg());

    pthread_mutex_lock(&c->ka_mu);
    rdzv_lease_entry *e = find(c, id);
    if (!e || e->lost) continue; /* unkept meanwhile */
    now = newt_now_ns();
    if (r == NEWT_OK) {
      e->expires_ns = sent + (uint64_t)got_ttl * 1000000000ull;
      e->due_ns = sent + (uint64_t)got_ttl * 1000000000ull / 3;
      heap_fix(c->leases, e);
      NEWT_TRACE(RDZV, "lease %llx renewed, TTL %lld s", (unsigned long long)id, (long long)got_ttl);
      continue;
    }
    if (r == NEWT_ERR_NOTFOUND) {
      snprintf(e->why, sizeof e->why, "etcd says lease %llx is gone (expired or revoked)",
               (unsigned long long)id);
    } else if (r == NEWT_ERR_AUTH || now >= e->expires_ns) {
      snprintf(e->why, sizeof e->why, "lease %llx could not be renewed %s: %s", (unsigned long long)id,
               r == NEWT_ERR_AUTH ? "(auth)" : "within its TTL, it may have expired", err);
    } else {
      NEWT_DEBUG(RDZV, "lease %llx: renewal failed, retrying: %s", (unsigned long long)id, err);
      e->due_ns = now + 200000000ull;
      if (e->due_ns > e->expires_ns) e->due_ns = e->expires_ns;
      heap_fix(c->leases, e);
      continue;
    }
    e->lost = 1;
    heap_remove(c->leases, e);
    NEWT_WARN(RDZV, "%s", e->why);
    if (e->fn) {
      rdzv_etcd_lease_lost_fn fn = e->fn;
      void *ud = e->ud;
      char why[sizeof e->why];
      memcpy(why, e->why, sizeof why);
      c->ka_in_callback = id;
      pthread_mutex_unlock(&c->ka_mu);
      fn(ud, id, why);
      pthread_mutex_lock(&c->ka_mu);
      c->ka_in_callback = 0;
      pthread_cond_broadcast(&c->ka_cv);
    }
  }
  pthread_mutex_unlock(&c->ka_mu);
  return NULL;
}

newt_result_t rdzv_etcd_lease_keep(rdzv_etcd *c, int64_t lease, int64_t ttl_s, rdzv_etcd_lease_lost_fn fn,
                                   void *ud) {
  if (ttl_s <= 0) return NEWT_ERR(NEWT_ERR_INVALID, "lease keep-alive: TTL must be positive");
  rdzv_lease_entry *e = calloc(1, sizeof *e);
  NEWT_CHECK_ALLOC(e);
  uint64_t now = newt_now_ns();
  e->id = lease;
  e->ttl_s = ttl_s;
  e->fn = fn;
  e->ud = ud;
  e->due_ns = now + (uint64_t)ttl_s * 1000000000ull / 3;
  e->expires_ns = now + (uint64_t)ttl_s * 1000000000ull;
  e->heap_i = SIZE_MAX;
  pthread_mutex_lock(&c->ka_mu);
  if (find(c, lease)) {
    pthread_mutex_unlock(&c->ka_mu);
    free(e);
    return NEWT_ERR(NEWT_ERR_INVALID, "lease %llx is already kept alive", (unsigned long long)lease);
  }
  if (!c->leases) c->leases = calloc(1, sizeof *c->leases);
  struct rdzv_lease_table *t = c->leases;
  if (t && t->n == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 16;
    rdzv_lease_entry **h = realloc(t->heap, cap * sizeof *h);
    if (h) t->heap = h, t->cap = cap;
  }
  if (!t || t->n == t->cap) {
    pthread_mutex_unlock(&c->ka_mu);
    free(e);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory keeping lease %llx alive", (unsigned long long)lease);
  }
  if (!c->ka_started) {
    int err = pthread_create(&c->ka_thread, NULL, keepalive_main, c);
    if (err) {
      pthread_mutex_unlock(&c->ka_mu);
      free(e);
      return NEWT_ERR(NEWT_ERR_SYS, "starting the keep-alive thread: %s", strerror(err));
    }
    c->ka_started = 1;
  }
  rdzv_lease_entry **slot = slot_of(t, lease);
  e->next = *slot;
  *slot = e;
  heap_set(t, t->n++, e);
  heap_up(t, e->heap_i);
  pthread_cond_broadcast(&c->ka_cv);
  pthread_mutex_unlock(&c->ka_mu);
  return NEWT_OK;
}

void rdzv_etcd_lease_unkeep(rdzv_etcd *c, int64_t lease) {
  pthread_mutex_lock(&c->ka_mu);
  while (c->ka_in_callback == lease && !pthread_equal(pthread_self(), c->ka_thread))
    pthread_cond_wait(&c->ka_cv, &c->ka_mu);
  for (rdzv_lease_entry **p = c->leases ? slot_of(c->leases, lease) : NULL; p && *p; p = &(*p)->next) {
    if ((*p)->id == lease) {
      rdzv_lease_entry *e = *p;
      *p = e->next;
      heap_remove(c->leases, e);
      free(e);
      break;
    }
  }
  pthread_cond_broadcast(&c->ka_cv);
  pthread_mutex_unlock(&c->ka_mu);
}

int rdzv_etcd_lease_lost(rdzv_etcd *c, int64_t lease, char *why, size_t cap) {
  pthread_mutex_lock(&c->ka_mu);
  rdzv_lease_entry *e = find(c, lease);
  int st = e ? e->lost : -1;
  if (e && e->lost && why && cap) snprintf(why, cap, "%s", e->why);
  pthread_mutex_unlock(&c->ka_mu);
  return st;
}

void rdzv_etcd_lease_shutdown(rdzv_etcd *c) {
  pthread_mutex_lock(&c->ka_mu);
  c->ka_stop = 1;
  pthread_cond_broadcast(&c->ka_cv);
  int started = c->ka_started;
  pthread_mutex_unlock(&c->ka_mu);
  if (started) pthread_join(c->ka_thread, NULL);
  struct rdzv_lease_table *t = c->leases;
  for (size_t b = 0; t && b < LEASE_BUCKETS; b++)
    while (t->bucket[b]) {
      rdzv_lease_entry *e = t->bucket[b];
      t->bucket[b] = e->next;
      free(e);
    }
  if (t) free(t->heap);
  free(t);
  c->leases = NULL;
}
