/* The plan watch (internal.h): an etcd watch on /newt/<job>/plan, on the watch's own thread,
 * keeps the newest plan this worker may take (a plan in shards read whole: its head, then its
 * shards at the head's revision) (newer than the one it has and agreeing with
 * the spec; a forged or corrupt one is logged and ignored) and wakes whoever waits for one.
 * A plan that ends the running generation at once (its switch "abort", or nothing in it for
 * this worker) aborts the generation's communicator, so that a pending collective returns; one
 * that lets the step finish sets switch_pending for the next commit; one that comes while a
 * communicator is being built cancels the build. What it touches is guarded by w->mu. Under
 * a node agent the plan comes through the agent's gateway instead (one etcd watch for the
 * host), the same way, and from etcd itself again if the agent goes. */
#include <pthread.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include "common/log.h"
#include "job/plan.h"
#include "job/records.h"
#include "job/store.h"
#include "rendezvous/etcd.h"
#include "rendezvous/gateway.h"
#include "worker/internal.h"

/* Whether plan p ends the running generation at once rather than at the next step
 * boundary: it says so, or it has nothing for us to do (a plan naming us a donor lets the
 * step finish: we leave after it, state in hand). */
int worker_plan_drops_now(const newt_plan *p, const char *id) {
  return strcmp(p->switch_mode, "abort") == 0 || (!plan_find(p, id) && !plan_find_donor(p, id));
}

/* A plan from etcd, taken when it is newer than the newest one here and agrees with the
 * job's spec; a forged or corrupt one is ignored (logged) and the generation goes on. A
 * worker that has not taken up any generation yet follows the record as etcd orders it: a
 * lower generation after a higher one is the leader putting its plan back over a forged one
 * that this worker, knowing no generation, could not tell from a real one. */
static void take_plan(worker *w, const char *json, size_t len, int64_t revision) {
  newt_plan p;
  if (plan_head_from_json(json, len, &p) != NEWT_OK) {
    NEWT_WARN(WORKER, "%s: ignoring a plan: %s", w->id, newt_errmsg());
    return;
  }
  /* a head: its shards, written before it, read at its revision (every one: the communicator,
     the groups and the state's moves are built from every rank's place) */
  if (plan_is_partial(&p) && job_plan_shards_get(w->etcd, w->o.job, &p, revision, job_call_deadline()) != NEWT_OK) {
    NEWT_WARN(WORKER, "%s: ignoring a plan: %s", w->id, newt_errmsg());
    plan_free(&p);
    return;
  }
  pthread_mutex_lock(&w->mu);
  uint64_t have = w->latest.generation;
  int newer = p.generation > have || (w->gen == 0 && p.generation < have);
  newt_result_t ok = newer ? plan_check_spec(&p, &w->spec) : NEWT_OK;
  if (ok == NEWT_OK && newer) ok = plan_check_jump(w->gen ? have : 0, p.generation);
  if (ok != NEWT_OK) {
    pthread_mutex_unlock(&w->mu);
    NEWT_WARN(WORKER, "%s: ignoring a plan: %s", w->id, newt_errmsg());
    plan_free(&p);
    return;
  }
  if (newer) {
    plan_free(&w->latest);
    w->latest = p;
    /* a generation still building its communicator has no step to finish: it gives way */
    if (!w->comm) atomic_store(&w->build_cancel, 1);
    if (w->comm && p.generation > w->gen) {
      if (worker_plan_drops_now(&p, w->id)) {
        NEWT_INFO(WORKER, "%s: plan %llu (%s) drops generation %llu now", w->id,
                  (unsigned long long)p.generation, p.cause, (unsigned long long)w->gen);
        comm_abort(w->comm);
      } else {
        atomic_store(&w->switch_pending, 1);
      }
    }
    pthread_cond_broadcast(&w->cv);
  } else {
    plan_free(&p);
  }
  pthread_mutex_unlock(&w->mu);
}

static void on_plan(void *ud, const rdzv_etcd_watch_resp *r) {
  worker *w = ud;
  if (r->kind == RDZV_WATCH_EVENTS) {
    for (size_t i = 0; i < r->n_events; i++)
      if (r->events[i].type == RDZV_EVENT_PUT) take_plan(w, r->events[i].kv.value, r->events[i].kv.value_len, r->events[i].kv.mod_revision);
  } else if (r->kind == RDZV_WATCH_RESYNC) {
    for (size_t i = 0; i < r->n_kvs; i++) take_plan(w, r->kvs[i].value, r->kvs[i].value_len, r->kvs[i].mod_revision);
  }
}

/* The plan as it is, then every change after the revision it was read at: no plan can
 * slip between the read and the watch (also when there was none yet). */
static newt_result_t watch_etcd(worker *w, const char *key) {
  rdzv_etcd_kv kv;
  int64_t rev = 0;
  newt_result_t r = rdzv_etcd_get(w->etcd, key, job_call_deadline(), &kv, &rev);
  if (r == NEWT_OK) {
    take_plan(w, kv.value, kv.value_len, kv.mod_revision);
    rdzv_etcd_kv_free(&kv);
  } else if (r != NEWT_ERR_NOTFOUND) {
    return r;
  }
  rdzv_etcd_watch_opts wo = {.start_revision = rev + 1, .progress_notify = 1};
  rdzv_etcd_watch *watch = NULL;
  NEWT_CHECK(rdzv_etcd_watch_start(w->etcd, key, &wo, on_plan, w, job_call_deadline(), &watch));
  pthread_mutex_lock(&w->mu);
  w->plan_watch = watch;
  pthread_mutex_unlock(&w->mu);
  return NEWT_OK;
}

/* The host gateway's plan watch: a plan it sends is taken as one from etcd; when it ends (the
 * agent went), this worker watches etcd itself, until that works or the worker ends. */
static void on_gateway_plan(void *ud, const rdzv_etcd_kv *kv) {
  worker *w = ud;
  if (kv) {
    take_plan(w, kv->value, kv->value_len, kv->mod_revision);
    return;
  }
  char key[256];
  if (job_key(key, sizeof key, w->o.job, JOB_REC_PLAN, 0, NULL) != NEWT_OK) return;
  NEWT_WARN(WORKER, "%s: the host gateway's plan watch ended; watching the plan in etcd itself", w->id);
  while (!atomic_load(&w->plan_gw_closing) && !worker_stop_asked(w)) {
    if (watch_etcd(w, key) == NEWT_OK) return;
    NEWT_WARN(WORKER, "%s: watching the plan: %s (trying again)", w->id, newt_errmsg());
    for (int t = 0; t < 20 && !atomic_load(&w->plan_gw_closing); t++) newt_sleep_ms(50);
  }
}

/* Through the host agent's gateway when there is one (NEWT_HOST_GATEWAY: one etcd watch for
 * the host's workers, rendezvous/gateway.h), else, or when it refuses, etcd's own. */
newt_result_t worker_watch_plan(worker *w) {
  char key[256];
  NEWT_CHECK(job_key(key, sizeof key, w->o.job, JOB_REC_PLAN, 0, NULL));
  const char *path = getenv("NEWT_HOST_GATEWAY");
  if (path && *path) {
    rdzv_gateway_watch *gw = NULL;
    if (rdzv_gateway_watch_start(path, key, on_gateway_plan, w, job_call_deadline(), &gw) == NEWT_OK) {
      w->plan_gw = gw;
      return NEWT_OK;
    }
    NEWT_INFO(WORKER, "%s: host gateway %s: %s; watching the plan in etcd itself", w->id, path, newt_errmsg());
  }
  return watch_etcd(w, key);
}

void worker_unwatch_plan(worker *w) {
  atomic_store(&w->plan_gw_closing, 1);
  rdzv_gateway_watch_free(w->plan_gw); /* first: its end may start the etcd watch */
  w->plan_gw = NULL;
  rdzv_etcd_watch_free(w->plan_watch);
  w->plan_watch = NULL;
}
