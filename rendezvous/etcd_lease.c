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
 * its lease that is running, so the owner may free what the callback uses afterwards. */
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
  rdzv_lease_entry *next;
};

static rdzv_lease_entry *find(rdzv_etcd *c, int64_t id) {
  for (rdzv_lease_entry *e = c->leases; e; e = e->next)
    if (e->id == id) return e;
  return NULL;
}

static void timed_wait(rdzv_etcd *c, uint64_t until_ns) {
  struct timespec ts = {(time_t)(until_ns / 1000000000ull), (long)(until_ns % 1000000000ull)};
  pthread_cond_timedwait(&c->ka_cv, &c->ka_mu, &ts);
}

static void *keepalive_main(void *arg) {
  rdzv_etcd *c = arg;
  pthread_mutex_lock(&c->ka_mu);
  while (!c->ka_stop) {
    rdzv_lease_entry *next = NULL;
    for (rdzv_lease_entry *e = c->leases; e; e = e->next)
      if (!e->lost && (!next || e->due_ns < next->due_ns)) next = e;
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
      continue;
    }
    e->lost = 1;
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
  pthread_mutex_lock(&c->ka_mu);
  if (find(c, lease)) {
    pthread_mutex_unlock(&c->ka_mu);
    free(e);
    return NEWT_ERR(NEWT_ERR_INVALID, "lease %llx is already kept alive", (unsigned long long)lease);
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
  e->next = c->leases;
  c->leases = e;
  pthread_cond_broadcast(&c->ka_cv);
  pthread_mutex_unlock(&c->ka_mu);
  return NEWT_OK;
}

void rdzv_etcd_lease_unkeep(rdzv_etcd *c, int64_t lease) {
  pthread_mutex_lock(&c->ka_mu);
  while (c->ka_in_callback == lease && !pthread_equal(pthread_self(), c->ka_thread))
    pthread_cond_wait(&c->ka_cv, &c->ka_mu);
  for (rdzv_lease_entry **p = &c->leases; *p; p = &(*p)->next) {
    if ((*p)->id == lease) {
      rdzv_lease_entry *e = *p;
      *p = e->next;
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
  while (c->leases) {
    rdzv_lease_entry *e = c->leases;
    c->leases = e->next;
    free(e);
  }
}
