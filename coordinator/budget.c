/* When the leader gives up on the job. The failure budget: at most spec.fault.max_failures
 * recoveries from a crash or hang within failure_window_ms (a leave, a join, a lost
 * coordinator or an etcd outage are the job's normal life), counted from the job's events
 * by a new leader. The progress bound: no step completed for progress_timeout_ms. Either
 * fails the job: the failed record (guarded by leadership), an event, the log, the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/strutil.h"
#include "coordinator/coord.h"

/* Recoveries from these causes spend the budget. */
static int is_failure(const char *cause) { return strcmp(cause, "crash") == 0 || strcmp(cause, "hang") == 0; }

static int failures_in_window(coord *c, uint64_t now) {
  int n = 0;
  for (int i = 0; i < c->nfails; i++) n += c->fails[i] + (uint64_t)c->spec.failure_window_ms > now;
  return n;
}

static void count_failure(coord *c, uint64_t t_ms) {
  if (c->nfails == (int)(sizeof c->fails / sizeof c->fails[0])) {
    memmove(c->fails, c->fails + 1, sizeof c->fails - sizeof c->fails[0]);
    c->nfails--;
  }
  c->fails[c->nfails++] = t_ms;
  metrics_set(c->metrics, "newt_failure_budget_used", failures_in_window(c, newt_wall_ms()));
}

void coord_count_plan(coord *c, const char *cause, uint64_t t_ms) {
  if (is_failure(cause)) count_failure(c, t_ms);
}

/* A new leader goes on counting where the last one was. */
void coord_recount_failures(coord *c) {
  char prefix[256];
  c->nfails = 0;
  if (job_prefix(prefix, sizeof prefix, c->o->job, JOB_REC_EVENT, -1) != NEWT_OK) return;
  rdzv_etcd_range_opts ro = {.prefix = 1, .sort = RDZV_SORT_KEY_ASCEND};
  rdzv_etcd_kvs evs;
  if (rdzv_etcd_range(c->etcd, prefix, &ro, job_call_deadline(), &evs) != NEWT_OK) return;
  uint64_t now = newt_wall_ms();
  for (size_t i = 0; i < evs.n; i++) {
    job_change ch;
    if (job_change_expect(c->o->job, &evs.kvs[i], JOB_REC_EVENT, &ch) != NEWT_OK) continue;
    const job_event *e = &ch.u.event;
    if (e->type == JOB_EV_PLAN && is_failure(e->cause) && e->t_ms + (uint64_t)c->spec.failure_window_ms > now)
      count_failure(c, e->t_ms);
    job_change_free(&ch);
  }
  rdzv_etcd_kvs_free(&evs);
}

/* Workers and the other coordinators see the failed record and end too. */
void coord_fail_job(coord *c, const char *why) {
  job_failed f = {.t_ms = newt_wall_ms()};
  snprintf(f.why, sizeof f.why, "%s", why);
  snprintf(f.coordinator, sizeof f.coordinator, "%s", c->id);
  char *val = job_failed_to_json(&f), key[256];
  if (val && job_key(key, sizeof key, c->o->job, JOB_REC_FAILED, 0, NULL) == NEWT_OK &&
      rdzv_guarded_put(c->cand, key, val, strlen(val), job_call_deadline(), NULL) != NEWT_OK)
    NEWT_WARN(COORD, "%s: writing %s: %s", c->id, key, newt_errmsg());
  free(val);
  job_event ev = {.type = JOB_EV_FAILED};
  snprintf(ev.why, sizeof ev.why, "%s", why);
  coord_post_event(c, &ev);
  NEWT_ERROR(COORD, "job %s failed: %s", c->o->job, why);
  metrics_set(c->metrics, "newt_job_failed", 1);
  c->failed = 1;
  if (c->o->end) {
    c->o->end->status = JOB_EXIT_FAILED;
    snprintf(c->o->end->msg, sizeof c->o->end->msg, "failed: %s", why);
  }
}

int coord_budget_spent(coord *c, const char *cause) {
  if (!is_failure(cause) || c->spec.max_failures <= 0) return 0;
  uint64_t now = newt_wall_ms();
  int n = failures_in_window(c, now) + 1;
  if (n <= c->spec.max_failures) return 0;
  char why[JOB_TEXT_MAX], d[32];
  snprintf(why, sizeof why,
           "failure budget spent: %d recoveries from a crash or hang within %s (spec.fault.max_failures %lld, "
           "failure_window_ms %lld), the last a %s at step %lld; the job cannot make progress",
           n, newt_fmt_duration((double)c->spec.failure_window_ms / 1e3, d, sizeof d), (long long)c->spec.max_failures,
           (long long)c->spec.failure_window_ms, cause, (long long)c->prog_step);
  coord_fail_job(c, why);
  return 1;
}

/* Once the job has a plan, no step completed for that long -- counted from the newest step,
 * this leader's start and etcd's return, not reset by a plan (generations that never form
 * are no progress) -- fails the job, naming what it waited for. Before the job's first step
 * the bound is at least the first step's own deadline. */
int coord_past_progress_bound(coord *c) {
  int64_t bound = c->spec.progress_timeout_ms;
  pthread_mutex_lock(&c->mu);
  uint64_t from = c->stall_from, gen = c->plan.generation;
  int64_t step = c->prog_step;
  int waiting = c->waiting_logged;
  char why[sizeof c->waiting_why];
  snprintf(why, sizeof why, "%s", c->waiting_why);
  pthread_mutex_unlock(&c->mu);
  if (bound <= 0 || !gen || !from) return 0;
  if (step <= 0 && bound < c->spec.first_step_timeout_ms) bound = c->spec.first_step_timeout_ms;
  uint64_t now = newt_now_ns();
  if (now < from || now - from < (uint64_t)bound * 1000000ull) return 0;
  char msg[JOB_TEXT_MAX], d[32];
  snprintf(msg, sizeof msg,
           "no step completed for %s (spec.fault.progress_timeout_ms %lld) since step %lld (generation %llu in force%s%s): "
           "the job cannot make progress",
           newt_fmt_duration((double)(now - from) / 1e9, d, sizeof d), (long long)c->spec.progress_timeout_ms,
           (long long)step, (unsigned long long)gen, waiting ? "; the leader cannot plan: " : "",
           waiting ? why : "");
  coord_fail_job(c, msg);
  return 1;
}

int coord_fatal_report(coord *c) {
  char why[JOB_TEXT_MAX] = "";
  pthread_mutex_lock(&c->mu);
  snprintf(why, sizeof why, "%s", c->fatal_why); /* from a rank of the plan in force only (put_report) */
  pthread_mutex_unlock(&c->mu);
  if (!why[0]) return 0;
  coord_post_said(c); /* what the same report said (a mismatch) comes before the failure */
  coord_fail_job(c, why);
  return 1;
}
