/* The coordinator (see coordinator.h, docs/elastic.md).
 *
 * A leader keeps a picture of the job (picture.c) built from one consistent read of
 * /newt/<job>/ and a watch from the revision after it, through job/view.h: members
 * (workers/), the plan, the failure reports and acks of the current generation (each rank's
 * ack rides in its registration; a key acks/<gen>/<id> of the previous release counts too),
 * progress and the end marker. The watch thread only updates that picture; the main thread
 * (this file's loop) looks at it every few milliseconds and decides (decide.c):
 *
 *   - no plan yet: plan once enough workers are there and joins have settled;
 *   - a rank is leaving (SIGTERM): replan without it at the step boundary;
 *   - reports of a failed collective: wait until every rank not accused has reported (or
 *     the report window passes), fence the accused ranks that did not report themselves,
 *     replan with `switch: abort`;
 *   - a rank's registration vanished (lease expired): replan without it;
 *   - no step progress for hang_timeout_ms: replan with the live members (a hang nobody
 *     could name);
 *   - newcomers would allow a larger data-parallel size: replan at a step boundary once
 *     joins have settled;
 *   - every rank acknowledged the current generation: record the recovery and its timings.
 *
 * Every plan write is a guarded transaction on the candidacy key, so a deposed leader's
 * write fails; on that, or on losing the lease, the coordinator steps down and campaigns
 * again. This file holds the election, the leader's loop, the metrics and /healthz; coord.h
 * lists the other files, each a layer over the next. */
#include "coordinator/coordinator.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/param.h"
#include "common/sys.h"
#include "coordinator/coord.h"
#include "job/runlog.h"
#include "job/store.h"

NEWT_PARAM(CoordTickMs, "NEWT_COORD_TICK_MS", 5)

/* Metric groups: the job's metrics are the leader's only (a standby hides them). */
enum { GROUP_PROCESS = 0, GROUP_JOB = 1 };

/* --- leading ----------------------------------------------------------------------------------- */

static void on_leadership(void *ud, int leading, const char *why) {
  coord *c = ud;
  NEWT_INFO(COORD, "%s %s leadership: %s", c->id, leading ? "gained" : "lost", why ? why : "");
}

/* A standby hides the job's metrics (the leader's are the job's) and says so. */
static void standby_metrics(coord *c) {
  metrics_show_group(c->metrics, GROUP_JOB, 0);
  metrics_set_note(c->metrics, "newt: this coordinator is a standby; the job's metrics are the leader's (newt_is_leader 1)");
}

/* A generation a predecessor planned: its recovery is recorded only if it is not complete
 * yet (then the predecessor could not have recorded it). */
static void take_over_generation(coord *c) {
  pthread_mutex_lock(&c->mu);
  if (c->plan.generation) {
    int acked = 0;
    for (int k = 0; k < c->plan.nranks; k++) acked += coord_find_ack(c, c->plan.ranks[k].worker) >= 0;
    snprintf(c->cause, sizeof c->cause, "%s", c->plan.cause);
    c->recorded = acked == c->plan.nranks;
    c->t_published = c->plan.created_ms;
    c->t_detect = c->t_published;
    c->t_trigger = c->t_published;
    c->fault_step = coord_fault_step_locked(c, &c->went_on);
  }
  pthread_mutex_unlock(&c->mu);
}

/* Taking the lead: the job's metrics shown, the failures a predecessor planned for counted,
 * an event, the picture built. */
static newt_result_t lead_begin(coord *c) {
  NEWT_INFO(COORD, "%s leads job %s", c->id, c->o->job);
  metrics_set(c->metrics, "newt_is_leader", 1);
  metrics_show_group(c->metrics, GROUP_JOB, 1);
  metrics_set_note(c->metrics, NULL);
  coord_recount_failures(c);
  job_event ev = {.type = JOB_EV_LEADER};
  coord_post_event(c, &ev);
  c->plan_mono = c->stall_from = newt_now_ns();
  c->recorded = 1; /* a predecessor's generation: its recovery is its own */
  c->t_trigger = 0;
  NEWT_CHECK(coord_picture_start(c));
  take_over_generation(c);
  c->outages_seen = rdzv_etcd_outages_ended(c->etcd);
  return NEWT_OK;
}

/* Whether this coordinator still leads and may act this round (*act). etcd away long enough
 * for the candidacy's lease to look lost: keep leading if etcd still has it (decide nothing
 * meanwhile); NEWT_ERR_CONFLICT only when it is gone. etcd away: the picture is stale and no
 * write can land, so nothing is decided either. */
static newt_result_t still_leading(coord *c, int *act) {
  *act = 0;
  if (!rdzv_candidate_is_leader(c->cand)) {
    newt_result_t k = rdzv_candidate_renew(c->cand, job_call_deadline());
    if (k == NEWT_OK && rdzv_candidate_is_leader(c->cand)) return NEWT_OK;
    if (k == NEWT_ERR_UNAVAILABLE || k == NEWT_ERR_TIMEOUT) {
      newt_sleep_ms(200);
      return NEWT_OK;
    }
    return NEWT_ERR(NEWT_ERR_CONFLICT, "%s lost leadership%s%s", c->id, k == NEWT_OK ? "" : ": ",
                    k == NEWT_OK ? "" : newt_errmsg());
  }
  if (!rdzv_etcd_reachable(c->etcd)) {
    newt_sleep_ms(newt_param_CoordTickMs());
    return NEWT_OK;
  }
  *act = 1;
  return NEWT_OK;
}

/* The job is done (its end marker): the last recovery recorded, the event. 0 while it is not. */
static int finish_if_done(coord *c) {
  pthread_mutex_lock(&c->mu);
  int done = c->done;
  pthread_mutex_unlock(&c->mu);
  if (!done) return 0;
  if (c->plan_mono && !c->recorded) coord_record_recovery(c);
  job_event e = {.type = JOB_EV_DONE};
  pthread_mutex_lock(&c->mu);
  e.step = c->done_seen.step; /* the end as its marker says it (judged: picture.c), not the newest */
  e.loss = c->done_seen.loss; /* progress record, which another rank's older one may have overwritten */
  pthread_mutex_unlock(&c->mu);
  coord_post_event(c, &e);
  NEWT_INFO(COORD, "job %s is done", c->o->job);
  metrics_set(c->metrics, "newt_job_done", 1);
  return 1;
}

/* One round of the leader's work. *stop: leading ends now (the job ended, or a changed spec
 * found leadership lost). etcd refusing or not answering (an outage, NOSPACE) loses nothing
 * by trying again at the next round: only a lost leadership (NEWT_ERR_CONFLICT) ends leading. */
static newt_result_t lead_round(coord *c, int *stop) {
  if (rdzv_etcd_outages_ended(c->etcd) != c->outages_seen) coord_after_outage(c);
  pthread_mutex_lock(&c->mu);
  int foreign = c->plan_foreign;
  c->plan_foreign = 0;
  pthread_mutex_unlock(&c->mu);
  if (foreign) coord_restore_records(c); /* our plan over a forged one */
  coord_check_alarms(c);
  coord_check_spec_file(c);
  coord_post_said(c);
  newt_result_t r = coord_take_spec_change(c);
  if (r != NEWT_OK && r != NEWT_ERR_CONFLICT) {
    coord_warn_limited(c, "taking the changed spec", newt_errmsg());
    r = NEWT_OK;
  }
  *stop = 1;
  if (r != NEWT_OK || finish_if_done(c) || coord_fatal_report(c) || coord_past_progress_bound(c)) return r;
  *stop = 0;
  r = coord_decide(c);
  if (r != NEWT_OK && r != NEWT_ERR_CONFLICT) {
    coord_warn_limited(c, "deciding", newt_errmsg());
    r = NEWT_OK;
  }
  return r;
}

/* Leading ends: the picture stops; the job's metrics stay when the job ended (its end is
 * what the last scrapes must see), else they hide as a standby's. */
static void lead_end(coord *c) {
  coord_picture_stop(c);
  metrics_set(c->metrics, "newt_is_leader", 0);
  pthread_mutex_lock(&c->mu);
  int ended = c->failed || c->done;
  pthread_mutex_unlock(&c->mu);
  if (ended)
    metrics_set_note(c->metrics, "newt: the job has ended; this coordinator led it and exits after --metrics-linger-ms");
  else
    standby_metrics(c);
}

static newt_result_t lead(coord *c) {
  NEWT_CHECK(lead_begin(c));
  newt_result_t r = NEWT_OK;
  int stop = 0;
  while (r == NEWT_OK && !c->failed && !stop) {
    atomic_store(&c->tick, newt_now_ns());
    if (newt_stop_requested()) break;
    int act;
    r = still_leading(c, &act);
    if (r != NEWT_OK || !act) continue;
    r = lead_round(c, &stop);
    if (!stop) newt_sleep_ms(newt_param_CoordTickMs());
  }
  lead_end(c);
  return r;
}

/* --- the process ------------------------------------------------------------------------------- */

/* Errors no retry mends: a wrong password or certificate, a bad flag. Everything else etcd
 * says (unavailable, timed out, out of space, a lost leadership) passes; a coordinator
 * outlives it. */
static int fatal(newt_result_t r) {
  return r == NEWT_ERR_AUTH || r == NEWT_ERR_INVALID || r == NEWT_ERR_UNSUPPORTED || r == NEWT_ERR_NOMEM;
}

/* /healthz: the main loop goes round every few ms (a standby's every 500 ms); a loop stuck
 * for 30 s (a deadlock, a call without a deadline) is unhealthy. */
static int coord_health(void *ud, char *why, size_t cap) {
  coord *c = ud;
  uint64_t t = atomic_load(&c->tick), now = newt_now_ns();
  if (!t || now - t < 30000000000ull) return 1;
  snprintf(why, cap, "the coordinator's main loop has not run for %.0f s", (double)(now - t) / 1e9);
  return 0;
}

static newt_result_t define_metrics(coord *c) {
  static const struct {
    const char *name;
    metrics_kind kind;
    int group;
    const char *help;
  } defs[] = {
      {"newt_build_info", METRICS_GAUGE, GROUP_PROCESS, "1, labelled with newt's version and the process's role"},
      {"newt_is_leader", METRICS_GAUGE, GROUP_PROCESS, "1 when this coordinator leads the job (its metrics are the job's)"},
      {"newt_generation", METRICS_GAUGE, GROUP_JOB, "generation of the current plan"},
      {"newt_world_size", METRICS_GAUGE, GROUP_JOB, "ranks in the current plan"},
      {"newt_data_parallel_size", METRICS_GAUGE, GROUP_JOB, "data-parallel size of the current plan"},
      {"newt_spares", METRICS_GAUGE, GROUP_JOB, "registered workers the current plan keeps as spares"},
      {"newt_workers", METRICS_GAUGE, GROUP_JOB, "registered workers"},
      {"newt_step", METRICS_GAUGE, GROUP_JOB, "newest completed step"},
      {"newt_steps_total", METRICS_COUNTER, GROUP_JOB, "steps completed (a step rolled back and done again counts once)"},
      {"newt_tokens_total", METRICS_COUNTER, GROUP_JOB, "tokens trained on: steps x global batch x sequence length"},
      {"newt_loss", METRICS_GAUGE, GROUP_JOB, "loss of the newest step"},
      {"newt_tokens_per_second", METRICS_GAUGE, GROUP_JOB, "training throughput of the newest step"},
      {"newt_recoveries_total", METRICS_COUNTER, GROUP_JOB, "recoveries completed, by cause"},
      {"newt_steps_lost_total", METRICS_COUNTER, GROUP_JOB, "steps trained again after recoveries"},
      {"newt_checkpoint_last_step", METRICS_GAUGE, GROUP_JOB, "step of the newest committed checkpoint"},
      {"newt_checkpoint_bytes", METRICS_GAUGE, GROUP_JOB, "bytes on disk of the newest committed checkpoint"},
      {"newt_failure_budget_used", METRICS_GAUGE, GROUP_JOB, "recoveries from a crash or hang within the failure window"},
      {"newt_failure_budget_limit", METRICS_GAUGE, GROUP_JOB, "spec.fault.max_failures (0: no budget)"},
      {"newt_job_done", METRICS_GAUGE, GROUP_JOB, "1 once the job trained its last step"},
      {"newt_job_failed", METRICS_GAUGE, GROUP_JOB, "1 once the job failed (its reason: newt status)"},
      {"newt_etcd_nospace", METRICS_GAUGE, GROUP_JOB, "1 while etcd is out of space (NOSPACE alarm)"},
  };
  static const double recovery_s[] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
  static const double save_s[] = {0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
  static const double stall_s[] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++)
    NEWT_CHECK(metrics_define_group(c->metrics, defs[i].name, defs[i].kind, defs[i].group, defs[i].help));
  NEWT_CHECK(metrics_define_histogram(c->metrics, "newt_recovery_duration_seconds", GROUP_JOB, recovery_s, 10,
                                      "detection to the first completed step of a recovery, by cause"));
  NEWT_CHECK(metrics_define_histogram(c->metrics, "newt_checkpoint_save_duration_seconds", GROUP_JOB, save_s, 11,
                                      "a checkpoint's save on rank 0: compress, write, fsync, commit"));
  NEWT_CHECK(metrics_define_histogram(c->metrics, "newt_checkpoint_stall_seconds", GROUP_JOB, stall_s, 11,
                                      "what a checkpoint's save took of rank 0's step loop: its snapshot or downloads"));
  /* every cause from the start, so that rate() has a series before the first recovery */
  static const char *const causes[] = {"crash", "hang", "leave", "join", "coordinator", "etcd", "spec", "rebalance"};
  for (size_t i = 0; i < sizeof causes / sizeof causes[0]; i++) {
    char l[48];
    snprintf(l, sizeof l, "cause=\"%s\"", causes[i]);
    metrics_add_l(c->metrics, "newt_recoveries_total", l, 0);
  }
  metrics_set_l(c->metrics, "newt_build_info", "version=\"" NEWT_VERSION "\",role=\"coordinator\"", 1);
  metrics_set(c->metrics, "newt_failure_budget_limit", (double)c->spec.max_failures);
  metrics_set_health(c->metrics, coord_health, c);
  standby_metrics(c);
  return rdzv_etcd_set_metrics(c->etcd, c->metrics);
}

/* Whether the job has ended, for a coordinator that does not lead: done (its marker), or
 * failed (another coordinator gave up on it: end says why). */
static int job_ended(coord *c) {
  job_failed f;
  if (job_has_failed(c->etcd, c->o->job, &f)) {
    if (c->o->end && c->o->end->status != JOB_EXIT_FAILED) {
      c->o->end->status = JOB_EXIT_FAILED;
      snprintf(c->o->end->msg, sizeof c->o->end->msg, "failed: %s", f.why);
    }
    c->failed = 1;
    return 1;
  }
  return job_is_done(c->etcd, c->o->job, &c->spec, &c->auth);
}

/* After the job's end (done or failed) a coordinator keeps serving its final metrics for
 * --metrics-linger-ms, so that each Prometheus scrapes them at least once: the leader's say
 * newt_job_done or newt_job_failed 1, from which the chart's alerts remember the end and
 * tell a job that ended from one whose coordinators are all gone. The standbys wait too: one
 * that exited 4 at once would fail the Kubernetes Job, which stops the leader's pod before
 * its final scrape. A signal ends the wait; /healthz stays healthy. */
static void linger(coord *c) {
  if (!c->metrics || c->o->metrics_linger_ms <= 0) return;
  NEWT_INFO(COORD, "%s: serving the job's final metrics for %d ms (--metrics-linger-ms)", c->id, c->o->metrics_linger_ms);
  newt_deadline_t d = newt_deadline_in_ms(c->o->metrics_linger_ms);
  while (!newt_deadline_passed(d) && !newt_stop_requested()) {
    atomic_store(&c->tick, newt_now_ns());
    newt_sleep_ms(100);
  }
}

/* The end of a coordinator that ran without error: done, failed (set where it was seen),
 * or stopped by a signal before the end. */
static void set_end(coord *c) {
  job_end *e = c->o->end;
  if (!e || e->status == JOB_EXIT_FAILED) return;
  if (newt_stop_requested() && !job_is_done(c->etcd, c->o->job, &c->spec, &c->auth)) {
    e->status = JOB_EXIT_LEFT;
    snprintf(e->msg, sizeof e->msg, "left: stopped by signal %d before the end of job %s; the other coordinators go on",
             newt_stop_requested(), c->o->job);
    return;
  }
  e->status = JOB_EXIT_DONE;
  snprintf(e->msg, sizeof e->msg, "done: job %s trained its %lld steps", c->o->job, (long long)c->spec.steps);
}

/* The coordinator's name, its event log, the keys it needs and its etcd client. */
static newt_result_t setup(coord *c, const coordinator_opts *o) {
  c->o = o;
  c->event_log_fd = -1;
  pthread_mutex_init(&c->mu, NULL);
  newt_result_t r = newt_check_name("job", o->job);
  if (r == NEWT_OK && o->event_log) r = job_runlog_open(o->event_log, 0, &c->event_log_fd);
  if (o->id && *o->id) snprintf(c->id, sizeof c->id, "%s", o->id);
  else snprintf(c->id, sizeof c->id, "coordinator-%.32s-%d", newt_hostname(), (int)getpid());
  newt_log_set_name(c->id);
  if (r == NEWT_OK) r = job_key(c->plan_key, sizeof c->plan_key, o->job, JOB_REC_PLAN, 0, NULL);
  /* the job secret: what a rank says for itself counts only with its proof */
  if (r == NEWT_OK) r = job_auth_load(&c->auth, o->secret_file, o->job);
  if (r == NEWT_OK && !c->auth.has)
    NEWT_WARN(COORD, "%s: no job secret (--job-secret-file, NEWT_JOB_SECRET_FILE): reports, acknowledgements and the "
              "end marker count as anyone with write access to etcd wrote them", c->id);
  if (r == NEWT_OK) r = rdzv_etcd_init(&o->etcd, &c->etcd);
  return r;
}

/* Stores the spec of --spec FILE, waiting for etcd as long as it takes, and keeps the file's
 * text (to see it change). A spec the running job may not take is refused: the job goes on
 * with the spec it has (refusing to run would crash-loop the pod). */
static newt_result_t store_spec_file(coord *c) {
  const coordinator_opts *o = c->o;
  newt_result_t r = NEWT_OK;
  while (r == NEWT_OK) {
    char changed[512];
    r = coordinator_put_spec(c->etcd, o->job, o->spec_file, changed, sizeof changed);
    if (r == NEWT_OK && changed[0]) NEWT_INFO(COORD, "%s: stored the changed spec of %s: %s", c->id, o->spec_file, changed);
    if (r == NEWT_ERR_CONFLICT) {
      NEWT_ERROR(COORD, "%s: refused the spec of %s, going on with the job's spec in etcd: %s", c->id, o->spec_file,
                 newt_errmsg());
      r = NEWT_OK;
      break;
    }
    if (r == NEWT_OK || fatal(r) || newt_stop_requested()) break;
    coord_warn_limited(c, "storing the spec", newt_errmsg()); /* etcd away: wait for it */
    r = NEWT_OK;
    newt_sleep_ms(200);
  }
  if (r == NEWT_OK) newt_fs_read_all(o->spec_file, 1 << 20, &c->spec_file_text, &(size_t){0});
  return r;
}

/* The job's spec, from etcd: etcd away, waited for as long as it takes; no spec in a
 * reachable etcd, for 60 s. */
static newt_result_t read_spec(coord *c) {
  newt_deadline_t d = newt_deadline_in_ms(60000);
  for (;;) {
    job_change ch;
    newt_result_t r = job_change_get(c->etcd, c->o->job, JOB_REC_SPEC, job_call_deadline(), &ch);
    if (r == NEWT_OK) c->spec = ch.u.spec;
    job_change_free(&ch);
    if (r == NEWT_OK || fatal(r)) return r;
    if (r != NEWT_ERR_NOTFOUND) {
      coord_warn_limited(c, "reading the spec", newt_errmsg());
      d = newt_deadline_in_ms(60000);
    } else if (newt_deadline_passed(d)) {
      return NEWT_ERR(NEWT_ERR_NOTFOUND, "job %s has no spec in etcd (give one with --spec FILE)", c->o->job);
    }
    if (newt_stop_requested()) return NEWT_ERR(NEWT_ERR_ABORTED, "stopped while waiting for the spec");
    newt_sleep_ms(200);
  }
}

static newt_result_t start_metrics(coord *c) {
  const coordinator_opts *o = c->o;
  if (o->metrics_port <= 0) return NEWT_OK;
  const char *addr = o->metrics_addr ? o->metrics_addr : "127.0.0.1";
  NEWT_CHECK(metrics_start(addr, o->metrics_port, NULL, &c->metrics));
  if (!c->metrics) return NEWT_OK;
  NEWT_CHECK(define_metrics(c));
  NEWT_INFO(COORD, "%s: metrics at http://%s:%d/metrics (health: /healthz)", c->id, addr, metrics_port(c->metrics));
  return NEWT_OK;
}

/* Stands by until this coordinator leads (NEWT_OK), reading the spec file meanwhile;
 * NEWT_ERR_TIMEOUT when a signal or the job's end came first. */
static newt_result_t stand_by(coord *c) {
  newt_result_t w;
  do {
    atomic_store(&c->tick, newt_now_ns());
    coord_check_spec_file(c);
    w = rdzv_candidate_wait(c->cand, newt_deadline_in_ms(500));
    if (w == NEWT_ERR_TIMEOUT && (newt_stop_requested() || job_ended(c))) break;
  } while (w == NEWT_ERR_TIMEOUT);
  return w;
}

/* One candidacy: campaigns, stands by, leads, resigns. *over: the job ended, failed, or a
 * signal came. Only errors no retry mends are returned. */
static newt_result_t candidacy(coord *c, int *over) {
  *over = 0;
  atomic_store(&c->tick, newt_now_ns());
  if (job_ended(c)) {
    NEWT_INFO(COORD, "%s: job %s has %s; exiting (to use the name again: newt job rm --job %s)", c->id, c->o->job,
              c->failed ? "failed" : "its end marker", c->o->job);
    *over = 1;
    return NEWT_OK;
  }
  rdzv_campaign_opts co = {.name = c->id, .ttl_s = (c->spec.lease_ttl_ms + 999) / 1000, .fn = on_leadership, .ud = c};
  newt_result_t r = job_campaign(c->etcd, c->o->job, &co, job_call_deadline(), &c->cand);
  if (r != NEWT_OK && !fatal(r)) {
    /* etcd away, full or refusing for now: campaign again once it is back */
    coord_warn_limited(c, "campaigning", newt_errmsg());
    newt_sleep_ms(200);
    return NEWT_OK;
  }
  if (r != NEWT_OK) return r;
  newt_result_t w = stand_by(c);
  /* leading a job that has ended (the leader before resigned at its end) would only say
     its end again */
  if (w == NEWT_OK && job_ended(c)) w = NEWT_ERR_TIMEOUT;
  if (w == NEWT_OK) {
    newt_result_t l = lead(c);
    if (l != NEWT_OK && fatal(l)) r = l;
    else if (l != NEWT_OK) coord_warn_limited(c, "leading", newt_errmsg());
  } else if (w != NEWT_ERR_TIMEOUT && w != NEWT_ERR_CONFLICT && fatal(w)) {
    r = w;
  }
  /* leaving the election (done, stopped, or leadership lost): revoke the candidacy so that a
     stale key of ours never stands in front of the next leader */
  rdzv_candidate_resign(c->cand, newt_deadline_in_ms(1000));
  rdzv_candidate_free(c->cand);
  c->cand = NULL;
  /* the end this coordinator judged (picture.c, judge_done) ends it even when etcd's records
     say otherwise now (a progress record written behind the end marker): leading again
     would end again, an event each time, for as long as they disagree */
  *over = c->failed || c->done || newt_stop_requested() || job_ended(c);
  return r;
}

static void coord_free(coord *c) {
  rdzv_etcd_free(c->etcd); /* before the metrics its requests count into */
  metrics_stop(c->metrics);
  plan_free(&c->plan);
  free(c->members);
  free(c->reports);
  free(c->acks);
  coord_picture_free(c);
  free(c->departed);
  free(c->held);
  free(c->held_ids);
  job_event_free(&c->spare_ev);
  if (c->event_log_fd >= 0) close(c->event_log_fd);
  free(c->spec_file_text);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

newt_result_t coordinator_run(const coordinator_opts *o) {
  coord *c = calloc(1, sizeof *c);
  NEWT_CHECK_ALLOC(c);
  coord_picture_init(c);
  newt_result_t r = setup(c, o);
  if (r == NEWT_OK && o->spec_file) r = store_spec_file(c);
  if (r == NEWT_OK) r = read_spec(c);
  if (r == NEWT_OK) r = start_metrics(c);
  int over = 0;
  while (r == NEWT_OK && !over && !newt_stop_requested()) r = candidacy(c, &over);
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", newt_errmsg());
  int ended = r == NEWT_OK && !newt_stop_requested(); /* the loop ends so only at the job's end */
  if (r == NEWT_OK) set_end(c);
  if (ended) linger(c);
  coord_free(c);
  return r == NEWT_OK ? NEWT_OK : NEWT_ERR(r, "%s", msg);
}
