/* The leader's acts on the job: a plan computed from the picture and published (guarded by
 * its candidacy), a member fenced, a generation's recovery recorded once every rank
 * acknowledged it, and the keys of past generations forgotten. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/param.h"
#include "coordinator/coord.h"
#include "job/store.h"

/* Tests: a pause between a plan's publication and its taking into the picture, in which the
 * watch brings the plan and its ranks' first acks before the main thread (a loaded machine's
 * scheduling, made certain). */
NEWT_PARAM(AdoptPauseMs, "NEWT_COORD_ADOPT_PAUSE_MS", 0)

NEWT_PARAM(KeepEvents, "NEWT_KEEP_EVENTS", 1000)

/* --- a plan ----------------------------------------------------------------------------------- */

/* What the next plan is made from, read from the picture at once. */
typedef struct plan_inputs {
  plan_member *m, *donors; /* the candidates and the leavers that donate state (malloc'd) */
  int n, ndonors;
  uint64_t prev;           /* the generation to plan above */
  int64_t fault_step;      /* the step the current generation had reached (coord_fault_step_locked;
                              where none said, the newest progress): the plan's step */
  int went_on;             /* its survivors trained on after the failure (without etcd) */
  uint64_t t_detect;       /* wall ms of the earliest report (0: none) */
} plan_inputs;

/* Says which members wait for a GPU another uses. Called with mu held. */
static void warn_shared_gpus_locked(coord *c, const policy_view *v, char (*exclude)[RDZV_NAME_MAX], int nexclude) {
  for (int i = 0; i < c->nmembers; i++) {
    const job_worker *w = &c->members[i], *o = policy_gpu_taken(v, exclude, nexclude, w);
    if (o && !policy_member_leaving(w) && !policy_member_done(w))
      NEWT_WARN(COORD, "%s is on GPU %d of host %s, which %s uses: NCCL cannot run two ranks on one GPU, so %s "
                "waits for it (give each worker its own --device)", w->id, w->device, w->host, o->id, w->id);
  }
}

/* The generation is above every one a member has taken up (after etcd lost its data, the
 * registrations remember what the plan key forgot). */
static newt_result_t read_inputs(coord *c, char (*exclude)[RDZV_NAME_MAX], int nexclude, plan_inputs *in,
                                 int speeds) {
  memset(in, 0, sizeof *in);
  pthread_mutex_lock(&c->mu);
  size_t room = (size_t)(c->nmembers ? c->nmembers : 1);
  in->m = calloc(room, sizeof *in->m);
  in->donors = calloc(room, sizeof *in->donors);
  if (!in->m || !in->donors) {
    pthread_mutex_unlock(&c->mu);
    free(in->m);
    free(in->donors);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory planning");
  }
  policy_view v = coord_view_locked(c);
  in->n = policy_plan_members(&v, exclude, nexclude, in->m);
  warn_shared_gpus_locked(c, &v, exclude, nexclude);
  in->ndonors = policy_donors(&v, c->recorded, in->donors);
  in->prev = c->plan.generation;
  for (int i = 0; i < c->nmembers; i++) { /* a registration's generation far past ours is forged: not taken */
    uint64_t g = c->members[i].generation > 0 ? (uint64_t)c->members[i].generation : 0;
    if (g > in->prev && plan_check_jump(c->plan.generation, g) == NEWT_OK) in->prev = g;
  }
  /* the ranks' measured speeds (the newest progress of the plan in force), when speeds decide
     (speeds: a rebalance, or a plan that has shares already; any other plan shares evenly, so
     that a crowded machine's noise moves no share): the next plan's shares follow them
     (plan_compute) */
  double *us = speeds && c->prog_speed.generation == c->plan.generation && c->plan.dp > 0
                   ? malloc((size_t)c->plan.dp * sizeof *us) : NULL;
  if (us) policy_progress_us(&c->prog_speed, c->plan.dp, us);
  int out = us ? policy_replace_dp(&c->spec, &c->plan, us) : -1;
  for (int i = 0; us && i < in->n; i++) {
    const plan_rank *r = plan_find(&c->plan, in->m[i].id);
    if (r) in->m[i].sample_us = us[r->dp];
    if (!r || r->dp != out) continue;
    /* a straggler replaced by a spare: planned as the newest of newcomers, after every idle
       spare, so that it becomes one (registered, not fenced) */
    NEWT_INFO(COORD, "%s (data-parallel rank %d) computes %.0f us a sample, at least %g times the median rank's: a "
              "spare takes its place", in->m[i].id, out, us[out], c->spec.straggler_replace);
    in->m[i].prev_rank = in->m[i].prev_pp = -1;
    in->m[i].join_rev = (int64_t)1 << 50;
  }
  free(us);
  in->fault_step = coord_fault_step_locked(c, &in->went_on);
  if (in->fault_step <= 0) in->fault_step = c->prog_step;
  for (int i = 0; i < c->nreports; i++)
    if (!in->t_detect || c->reports[i].t_ms < in->t_detect) in->t_detect = c->reports[i].t_ms;
  pthread_mutex_unlock(&c->mu);
  return NEWT_OK;
}

/* The plan of in's candidates, with its donors. *no_layout when no layout fits them. */
static newt_result_t compute(coord *c, const plan_inputs *in, newt_plan *p, int *no_layout) {
  newt_result_t r = plan_compute(&c->spec, in->m, in->n, in->prev, p);
  *no_layout = r == NEWT_ERR_UNAVAILABLE;
  for (int i = 0; r == NEWT_OK && i < in->ndonors; i++)
    r = plan_add_donor(p, in->donors[i].id, in->donors[i].host, in->donors[i].addr);
  /* a rank of the last plan that this one makes a spare (the layout has no room for it)
     holds a state the ranks may need -- a ZeRO shard, its neighbour's copy of one -- so it
     takes part in the restore as a donor, then waits as a spare */
  for (int i = 0; r == NEWT_OK && i < in->n; i++)
    if (in->m[i].has_state && !plan_find(p, in->m[i].id) && !plan_find_donor(p, in->m[i].id))
      r = plan_add_donor(p, in->m[i].id, in->m[i].host, in->m[i].addr);
  return r;
}

/* Publishes p, guarded by leadership. A plan its readers would refuse is mended by no later
 * try: the job fails (*failed) rather than spin. */
static newt_result_t publish(coord *c, const newt_plan *p, int *failed) {
  char *json = NULL;
  newt_result_t r = plan_check_publishable(p, &json);
  if (r == NEWT_ERR_INVALID || r == NEWT_ERR_INTERNAL) {
    char why[JOB_TEXT_MAX];
    snprintf(why, sizeof why, "cannot publish a plan: %s", newt_errmsg());
    coord_fail_job(c, why);
    *failed = 1;
    return NEWT_OK;
  }
  free(json);
  if (r == NEWT_OK) r = job_plan_publish_plan(c->cand, c->o->job, p, job_call_deadline(), NULL);
  return r;
}

/* The shares of p in words, after what why says: "samples per step by measured speed: w0 7, w1 7,
 * w2 3, w3 7" (the first data-parallel rank of each: its tensor and pipeline peers take the same). */
static void say_shares(const newt_plan *p, char *why, size_t cap) {
  size_t at = strlen(why);
  at += (size_t)snprintf(why + at, at < cap ? cap - at : 0, "%ssamples per step by measured speed:", at ? "; " : "");
  for (int d = 0; d < p->dp && at < cap; d++) {
    const char *id = "?";
    for (int k = 0; k < p->nranks; k++)
      if (p->ranks[k].dp == d && p->ranks[k].tp == 0 && p->ranks[k].pp == 0) id = p->ranks[k].worker;
    at += (size_t)snprintf(why + at, cap - at, "%s %s %lld", d ? "," : "", id, (long long)p->shares[d]);
  }
}

/* p (moved in), published, is the current plan: its recovery's clocks start, its metrics
 * and its event. */
static void adopt(coord *c, newt_plan *p, const char *cause, char (*exclude)[RDZV_NAME_MAX], int nexclude,
                  const plan_inputs *in) {
  uint64_t now = newt_wall_ms();
  NEWT_INFO(COORD, "published plan %llu (%s): %d ranks, dp %d, accum %lld, %d spares", (unsigned long long)p->generation,
            cause, p->nranks, p->dp, (long long)p->accum, p->nspares);
  /* the event's own copy of the spares: once the plan is the picture's, the watch may replace it */
  char(*spares)[RDZV_NAME_MAX] = p->nspares > 0 ? malloc((size_t)p->nspares * sizeof *spares) : NULL;
  if (spares) memcpy(spares, p->spares, (size_t)p->nspares * sizeof *spares);
  job_event ev = {.type = JOB_EV_PLAN, .generation = (int64_t)p->generation, .world = p->nranks, .dp = p->dp,
                  .spares = p->nspares, .excluded = exclude, .nexcluded = nexclude,
                  .spare_ids = spares, .nspare_ids = spares ? p->nspares : 0};
  snprintf(ev.why, sizeof ev.why, "%s", p->spare_why);
  if (p->shares) say_shares(p, ev.why, sizeof ev.why);
  snprintf(ev.cause, sizeof ev.cause, "%s", cause);

  if (newt_param_AdoptPauseMs() > 0) newt_sleep_ms(newt_param_AdoptPauseMs());
  pthread_mutex_lock(&c->mu);
  coord_set_plan_locked(c, p); /* the watch may have brought it first, with acks: they stay */
  c->prog_change = newt_now_ns();
  c->join_seen_ms = 0; /* whoever registered before this plan is in it, or its spare */
  pthread_mutex_unlock(&c->mu);

  c->plan_mono = newt_now_ns();
  c->recorded = 0;
  snprintf(c->cause, sizeof c->cause, "%s", cause);
  c->t_published = now;
  if (!c->t_trigger) c->t_trigger = now;
  c->t_detect = in->t_detect ? in->t_detect : c->t_trigger;
  c->fault_step = in->fault_step;
  c->went_on = in->went_on;
  c->waiting_logged = 0;
  metrics_set(c->metrics, "newt_generation", (double)c->plan.generation);
  metrics_set(c->metrics, "newt_world_size", (double)c->plan.nranks);
  metrics_set(c->metrics, "newt_data_parallel_size", (double)c->plan.dp);
  metrics_set(c->metrics, "newt_spares", (double)c->plan.nspares);
  coord_count_plan(c, cause, now);
  coord_post_event(c, &ev);
  free(spares);
}

/* *no_layout is set (and NEWT_ERR_UNAVAILABLE returned) when no layout fits the live
 * members; NEWT_ERR_CONFLICT when we no longer lead; other errors are etcd's. */
newt_result_t coord_replan(coord *c, const char *cause, const char *switch_mode, char (*exclude)[RDZV_NAME_MAX],
                           int nexclude, int *no_layout) {
  *no_layout = 0;
  plan_inputs in;
  NEWT_CHECK(read_inputs(c, exclude, nexclude, &in, strcmp(cause, "rebalance") == 0 || c->plan.shares != NULL));
  newt_plan p = {0};
  int failed = 0;
  newt_result_t r = compute(c, &in, &p, no_layout);
  if (r == NEWT_OK) {
    snprintf(p.cause, sizeof p.cause, "%s", cause);
    snprintf(p.switch_mode, sizeof p.switch_mode, "%s", switch_mode);
    p.step = in.fault_step;
    r = publish(c, &p, &failed);
  }
  if (r == NEWT_OK && !failed) adopt(c, &p, cause, exclude, nexclude, &in);
  else plan_free(&p);
  free(in.m);
  free(in.donors);
  return r;
}

/* --- a fence ---------------------------------------------------------------------------------- */

/* Its registration goes by revoking its lease; a lease other members are registered on too
 * (their host's, job_register_on) is theirs as well: then only the member's key goes (a
 * guarded delete while it is on that lease), and the member, when it writes again, finds it
 * gone and registers anew, as one whose own lease was revoked. */
void coord_fence(coord *c, const char *id) {
  pthread_mutex_lock(&c->mu);
  int i = coord_find_member(c, id), shared = 0;
  int64_t lease = i >= 0 ? c->members[i].lease : 0;
  for (int k = 0; k < c->nmembers && lease; k++) shared |= k != i && c->members[k].lease == lease;
  pthread_mutex_unlock(&c->mu);
  char key[256];
  newt_result_t r = NEWT_OK;
  if (lease && shared && (r = job_key(key, sizeof key, c->o->job, JOB_REC_WORKER, 0, id)) == NEWT_OK) {
    rdzv_etcd_cmp on = {.key = key, .target = RDZV_CMP_LEASE, .result = RDZV_CMP_EQUAL, .number = lease};
    rdzv_etcd_op del = {.type = RDZV_OP_DELETE, .key = key};
    r = rdzv_guarded_txn(c->cand, &on, 1, &del, 1, job_call_deadline(), NULL);
  } else if (lease && !shared) {
    r = rdzv_etcd_lease_revoke(c->etcd, lease, job_call_deadline());
  }
  if (r != NEWT_OK && newt_errcode() != NEWT_ERR_NOTFOUND) NEWT_WARN(COORD, "fencing %s: %s", id, newt_errmsg());
  /* out of the picture now, not when the watch brings the deletion: no plan (nor the
     question whether newcomers allow a larger one) may count it meanwhile */
  pthread_mutex_lock(&c->mu);
  coord_drop_member(c, id);
  pthread_mutex_unlock(&c->mu);
  NEWT_INFO(COORD, "fenced %s", id);
  job_event ev = {.type = JOB_EV_FENCE};
  snprintf(ev.worker, sizeof ev.worker, "%s", id);
  coord_post_event(c, &ev);
}

/* --- a recovery recorded ---------------------------------------------------------------------- */

/* Keeps the job's keys bounded however long it runs: the reports and acks of generations
 * before the current one, and the events beyond the newest NEWT_KEEP_EVENTS. (etcd's own
 * history is compacted by etcd: the private etcd of `newt run` does it automatically; a
 * production etcd should run with --auto-compaction-retention.) Writes are guarded by
 * leadership; a failure is tried again at the next generation. */
static void housekeeping(coord *c, uint64_t gen) {
  if (gen > 1) {
    if (job_barrier_forget(c->cand, c->o->job, (int64_t)gen, job_call_deadline()) != NEWT_OK)
      NEWT_DEBUG(COORD, "forgetting old acks: %s", newt_errmsg());
    char from[256], to[256];
    if (job_key(from, sizeof from, c->o->job, JOB_REC_REPORT, 0, "x") == NEWT_OK &&
        job_key(to, sizeof to, c->o->job, JOB_REC_REPORT, gen, "x") == NEWT_OK) {
      *strrchr(from, '/') = '\0'; /* ".../reports/000..0" up to ".../reports/<gen>" */
      *strrchr(to, '/') = '\0';
      rdzv_etcd_op del = {.type = RDZV_OP_DELETE, .key = from, .range_end = to};
      if (rdzv_guarded_txn(c->cand, NULL, 0, &del, 1, job_call_deadline(), NULL) != NEWT_OK)
        NEWT_DEBUG(COORD, "forgetting old reports: %s", newt_errmsg());
    }
  }
  char prefix[256];
  int64_t keep = newt_param_KeepEvents();
  if (job_prefix(prefix, sizeof prefix, c->o->job, JOB_REC_EVENT, -1) != NEWT_OK) return;
  rdzv_etcd_range_opts ro = {.prefix = 1, .count_only = 1};
  rdzv_etcd_kvs cnt;
  if (rdzv_etcd_range(c->etcd, prefix, &ro, job_call_deadline(), &cnt) != NEWT_OK) return;
  int64_t extra = cnt.count - keep;
  rdzv_etcd_kvs_free(&cnt);
  if (extra <= 0) return;
  /* the key of the oldest event to keep: the events sort by time */
  rdzv_etcd_range_opts first = {.prefix = 1, .keys_only = 1, .limit = extra + 1, .sort = RDZV_SORT_KEY_ASCEND};
  rdzv_etcd_kvs old;
  if (rdzv_etcd_range(c->etcd, prefix, &first, job_call_deadline(), &old) != NEWT_OK) return;
  if (old.n == (size_t)extra + 1) {
    rdzv_etcd_op del = {.type = RDZV_OP_DELETE, .key = prefix, .range_end = old.kvs[extra].key};
    if (rdzv_guarded_txn(c->cand, NULL, 0, &del, 1, job_call_deadline(), NULL) != NEWT_OK)
      NEWT_DEBUG(COORD, "forgetting old events: %s", newt_errmsg());
  }
  rdzv_etcd_kvs_free(&old);
}

/* Whether every rank of the current plan acknowledged it. Called with mu held. */
static int all_acked_locked(const coord *c) {
  const newt_plan *p = &c->plan;
  int all = p->generation && p->nranks > 0;
  for (int r = 0; r < p->nranks && all; r++) all = coord_find_ack(c, p->ranks[r].worker) >= 0;
  return all;
}

/* The recovery's event: the slowest rank's timings, the oldest state restored, the costliest
 * source. Called with mu held. */
static job_event recovery_event_locked(const coord *c) {
  job_event ev = {.type = strcmp(c->cause, "initial") == 0 ? JOB_EV_STARTED : JOB_EV_RECOVERED,
                  .generation = (int64_t)c->plan.generation,
                  .world = c->plan.nranks,
                  .restore_step = INT64_MAX,
                  .t_trigger = c->t_trigger,
                  .t_detect = c->t_detect,
                  .t_plan = c->t_published};
  snprintf(ev.restore, sizeof ev.restore, "memory");
  for (int k = 0; k < c->nacks; k++) {
    const job_ack *a = &c->acks[k].a;
    /* the plan was out once a rank saw it: the reply to our write can come after that */
    if (a->t_plan && a->t_plan < ev.t_plan) ev.t_plan = a->t_plan;
    if (a->t_comm > ev.t_comm) ev.t_comm = a->t_comm;
    if (a->t_restore > ev.t_restore) ev.t_restore = a->t_restore;
    if (a->t_step > ev.t_step) ev.t_step = a->t_step;
    if (a->restore_step < ev.restore_step) ev.restore_step = a->restore_step;
    if (job_restore_rank(a->restore) > job_restore_rank(ev.restore)) snprintf(ev.restore, sizeof ev.restore, "%s", a->restore);
  }
  return ev;
}

void coord_record_recovery(coord *c) {
  pthread_mutex_lock(&c->mu);
  if (!all_acked_locked(c)) {
    pthread_mutex_unlock(&c->mu);
    return;
  }
  job_event ev = recovery_event_locked(c);
  pthread_mutex_unlock(&c->mu);
  c->recorded = 1;
  /* one account: the fault hit at fault_step, training went on from the step restored, and
     what lies between is done again. A step restored beyond it is one a rank applied and no
     report or progress said (the progress record is written at most every 100 ms): the
     fault hit there at the latest. Unless the survivors went on without etcd: then this
     plan took over later, where they had got to, and nothing was done again */
  int64_t lost = 0;
  if (ev.type == JOB_EV_RECOVERED) {
    ev.fault_step = c->fault_step;
    if (!c->went_on && ev.fault_step < ev.restore_step) ev.fault_step = ev.restore_step;
    lost = ev.fault_step > ev.restore_step ? ev.fault_step - ev.restore_step : 0;
  }
  ev.steps_lost = lost;
  snprintf(ev.cause, sizeof ev.cause, "%s", c->cause);
  if (ev.type == JOB_EV_RECOVERED)
    NEWT_INFO(COORD, "generation %llu (%s) complete: %lld ms from detection to its first step; the fault hit at step "
              "%lld, training went on from step %lld, %lld step%s redone", (unsigned long long)ev.generation, c->cause,
              (long long)(ev.t_step - c->t_detect), (long long)ev.fault_step, (long long)ev.restore_step,
              (long long)lost, lost == 1 ? "" : "s");
  else
    NEWT_INFO(COORD, "generation %llu (%s) complete: %lld ms from its plan to its first step, from step %lld (state "
              "from %s)", (unsigned long long)ev.generation, c->cause, (long long)(ev.t_step - c->t_detect),
              (long long)ev.restore_step, ev.restore);
  if (ev.type == JOB_EV_RECOVERED) {
    char labels[64];
    snprintf(labels, sizeof labels, "cause=\"%s\"", c->cause);
    metrics_add_l(c->metrics, "newt_recoveries_total", labels, 1);
    metrics_observe(c->metrics, "newt_recovery_duration_seconds", labels, (double)(ev.t_step - c->t_detect) / 1e3);
    metrics_add(c->metrics, "newt_steps_lost_total", (double)lost);
  }
  coord_post_event(c, &ev);
  c->t_trigger = 0;
  housekeeping(c, (uint64_t)ev.generation);
}
