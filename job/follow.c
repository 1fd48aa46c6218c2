/* The job read from etcd for its picture (see view.h): one record got and decoded, the whole
 * job read into a job_view, and job_follow (a snapshot, then the watch, as batches of changes).
 * The store side of job/: view.c decodes, this file reads. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/strutil.h"
#include "job/store.h"
#include "job/view.h"

/* --- one record ------------------------------------------------------------------------------ */

newt_result_t job_change_get(rdzv_etcd *c, const char *job, job_record rec, newt_deadline_t d, job_change *out) {
  char key[256];
  rdzv_etcd_kv kv;
  memset(out, 0, sizeof *out);
  NEWT_CHECK(job_key(key, sizeof key, job, rec, 0, NULL));
  NEWT_CHECK(rdzv_etcd_get(c, key, d, &kv, NULL));
  newt_result_t r = job_change_expect(job, &kv, rec, out);
  if (r == NEWT_OK && rec == JOB_REC_PLAN && plan_is_partial(&out->u.plan)) { /* a head: its shards */
    r = job_plan_shards_get(c, job, &out->u.plan, kv.mod_revision, d);
    if (r != NEWT_OK) {
      char k[256];
      r = NEWT_ERR(r, "%s: %s", newt_str_printable(k, sizeof k, kv.key), newt_errmsg());
      job_change_free(out);
    }
  }
  out->kv = NULL; /* freed here */
  rdzv_etcd_kv_free(&kv);
  return r;
}

/* --- the picture ------------------------------------------------------------------------------ */

newt_result_t job_view_read(rdzv_etcd *c, const char *job, newt_deadline_t d,
                            void (*warn)(void *ud, const job_change *ch), void *ud, job_view *out) {
  memset(out, 0, sizeof *out);
  char prefix[256];
  NEWT_CHECK(job_prefix(prefix, sizeof prefix, job, JOB_REC_OTHER, -1));
  rdzv_etcd_kvs all;
  rdzv_etcd_range_opts ro = {.prefix = 1};
  NEWT_CHECK(rdzv_etcd_range(c, prefix, &ro, d, &all));
  if (all.n == 0) {
    rdzv_etcd_kvs_free(&all);
    return NEWT_ERR(NEWT_ERR_NOTFOUND, "no job \"%s\" in etcd at %s (no key under %s)", job, rdzv_etcd_endpoints(c),
                    prefix);
  }
  job_view_take(out, prefix, &all, warn, ud);
  rdzv_etcd_kvs_free(&all);
  return NEWT_OK;
}

/* --- following it ----------------------------------------------------------------------------- */

struct job_follow {
  rdzv_etcd *c;
  char job[NEWT_ID_MAX];
  char prefix[256];
  job_follow_fn fn;
  job_follow_health_fn health;
  void *ud;
  int broken; /* the watch's thread only: the stream broke and nothing came since */
  _Atomic int64_t handed; /* the newest revision fn has returned from (job_follow_revision) */
  rdzv_etcd_watch *watch;
};

static void deliver_all(job_follow *f, const rdzv_etcd_kvs *all) {
  job_change *chs;
  if (job_changes_decode(f->prefix, all, &chs) != NEWT_OK) {
    NEWT_WARN(JOB, "%s", newt_errmsg());
    return;
  }
  f->fn(f->ud, chs, all->n, 1);
  job_changes_free(chs, all->n);
  atomic_store(&f->handed, all->revision);
}

static void on_watch(void *ud, const rdzv_etcd_watch_resp *r) {
  job_follow *f = ud;
  if (r->kind == RDZV_WATCH_ERROR) {
    if (!f->broken && f->health) f->health(f->ud, 0, r->error ? r->error : "the watch broke");
    f->broken = 1;
    return;
  }
  if (f->broken && f->health) f->health(f->ud, 1, NULL);
  f->broken = 0;
  if (r->kind == RDZV_WATCH_RESYNC) {
    rdzv_etcd_kvs all = {.kvs = r->kvs, .n = r->n_kvs, .revision = r->revision};
    deliver_all(f, &all);
  } else if (r->kind == RDZV_WATCH_EVENTS && r->n_events) {
    job_change *chs = calloc(r->n_events, sizeof *chs);
    if (!chs) {
      NEWT_WARN(JOB, "out of memory for %zu changes of the job: they are lost", r->n_events);
      return;
    }
    for (size_t i = 0; i < r->n_events; i++) {
      job_change_decode(f->prefix, &r->events[i].kv, r->events[i].type == RDZV_EVENT_DELETE, &chs[i]);
      job_change *ch = &chs[i];
      /* a plan head: its shards, written before it, read at its revision */
      if (ch->rec == JOB_REC_PLAN && plan_is_partial(&ch->u.plan) &&
          job_plan_shards_get(f->c, f->job, &ch->u.plan, ch->kv->mod_revision, job_call_deadline()) != NEWT_OK)
        job_change_refuse(ch);
    }
    f->fn(f->ud, chs, r->n_events, 0);
    job_changes_free(chs, r->n_events);
  }
  if (r->kind != RDZV_WATCH_ERROR && r->revision > atomic_load(&f->handed)) atomic_store(&f->handed, r->revision);
}

newt_result_t job_follow_start(rdzv_etcd *c, const char *job, job_follow_fn fn, job_follow_health_fn health,
                               void *ud, newt_deadline_t d, job_follow **out) {
  *out = NULL;
  job_follow *f = calloc(1, sizeof *f);
  if (!f) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  f->c = c;
  snprintf(f->job, sizeof f->job, "%s", job);
  f->fn = fn;
  f->health = health;
  f->ud = ud;
  newt_result_t r = job_prefix(f->prefix, sizeof f->prefix, job, JOB_REC_OTHER, -1);
  rdzv_etcd_kvs all = {0};
  rdzv_etcd_range_opts ro = {.prefix = 1};
  if (r == NEWT_OK) r = rdzv_etcd_range(c, f->prefix, &ro, d, &all);
  if (r == NEWT_OK) deliver_all(f, &all);
  rdzv_etcd_watch_opts wo = {.prefix = 1, .start_revision = all.revision + 1, .progress_notify = 1};
  if (r == NEWT_OK) r = rdzv_etcd_watch_start(c, f->prefix, &wo, on_watch, f, d, &f->watch);
  rdzv_etcd_kvs_free(&all);
  if (r != NEWT_OK) {
    free(f);
    return r;
  }
  *out = f;
  return NEWT_OK;
}

int64_t job_follow_revision(job_follow *f) { return f ? atomic_load(&f->handed) : 0; }

void job_follow_free(job_follow *f) {
  if (!f) return;
  rdzv_etcd_watch_free(f->watch);
  free(f);
}
