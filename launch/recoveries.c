/* The leader's events, handled on the main loop (run.h): each appended to the event log, a
 * line of news for people, and each recovery paired with the fault we injected that it
 * answers, so that its timings start at the fault (job_recovery_time, the one definition of
 * every view):
 *
 *   crash, hang  any worker fault not yet answered, injected before its plan (a stopped
 *                worker may be seen first through its expired lease)
 *   leave        a term of a worker
 *   join         a cont (a woken worker comes back as a joiner), or the join faults and
 *                mended cuts whose workers its plan names (join_answers)
 *   leader       a coordinator we killed, answered by the next leader
 *
 * Several faults at once are coalesced into one plan: a recovery answers every one of its kind
 * before its plan. Each fault we injected that a recovery answered is noted in etcd (faults/
 * <gen>) for newt status, which then times that recovery as we do. Once the run ended, the
 * step log adds what etcd could not say: how long training paused while etcd was away, and
 * when the layout after a fault took its first step (resumed_ms); a fault the survivors went
 * on from without etcd and that no recovery of the leader's answered is said, not recorded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/strutil.h"
#include "job/runlog.h"
#include "launch/run.h"

/* A new recovery in the result, zeroed (NULL: out of memory). */
static launcher_recovery *add_recovery(run *r) {
  launcher_recovery *n = realloc(r->res->recoveries, (size_t)(r->res->nrecoveries + 1) * sizeof *n);
  if (!n) return NULL;
  r->res->recoveries = n;
  n = &r->res->recoveries[r->res->nrecoveries++];
  memset(n, 0, sizeof *n);
  return n;
}

launcher_recovery *recoveries_add_unplanned(run *r, const char *cause, const fault *f) {
  launcher_recovery *rec = add_recovery(r);
  if (!rec) return NULL;
  snprintf(rec->cause, sizeof rec->cause, "%s", cause);
  snprintf(rec->restore, sizeof rec->restore, "memory");
  snprintf(rec->fault, sizeof rec->fault, "%s", f->what);
  rec->t_fault = rec->t_ms = f->t_ms;
  rec->step = rec->fault_step = r->step; /* training went on: nothing done again */
  rec->world = r->world;
  rec->from_start_ms = -1;
  return rec;
}

/* The workers whose joins answer a join fault (its joiners) or a mended cut (those it left
 * out): how many, and the k-th. */
static int64_t joiner_count(const fault *f) { return f->back ? f->nback : f->ev.arg; }
static void joiner_name(const fault *f, int64_t k, char *name, size_t cap) {
  if (f->back) snprintf(name, cap, "%s", f->back[k]);
  else snprintf(name, cap, "w%lld", (long long)(f->join_first + k));
}

/* How many of a join fault's joiners plan (its ranks, spares and donors) or ids (a spare
 * event's) name. */
static int joiners_seen(const fault *f, const newt_plan *plan, char (*ids)[RDZV_NAME_MAX], int nids) {
  int n = 0;
  for (int64_t k = 0; k < joiner_count(f); k++) {
    char name[RDZV_NAME_MAX];
    joiner_name(f, k, name, sizeof name);
    int seen = plan && (plan_find(plan, name) || plan_is_spare(plan, name) || plan_find_donor(plan, name));
    for (int i = 0; !seen && i < nids; i++) seen = strcmp(ids[i], name) == 0;
    n += seen;
  }
  return n;
}

/* Whether a join (or a spare event) answers join fault f: it does where a plan names more of
 * its joiners than before; the fault is answered in full once every joiner was seen. Several
 * joiners of one fault may register far enough apart to be taken in by two plans. Without a
 * plan to look at (etcd away), the first join answers it. */
static int join_answers(fault *f, const newt_plan *plan, char (*ids)[RDZV_NAME_MAX], int nids) {
  if (!plan && nids == 0) return f->matched = 1;
  int seen = joiners_seen(f, plan, ids, nids);
  if (seen <= f->joined) return 0;
  f->joined = seen;
  f->matched = seen >= joiner_count(f);
  return 1;
}

/* The answer of the faults a recovery of cause answers at once (a join's joiners are
 * counted: join_answers). */
static chaos_answer answer_of(const char *cause) {
  static const struct {
    const char *cause;
    chaos_answer answer;
  } answers[] = {{"crash", CHAOS_ANSWER_CRASH}, {"hang", CHAOS_ANSWER_CRASH}, {"leave", CHAOS_ANSWER_LEAVE},
                 {"join", CHAOS_ANSWER_WAKE}, {"rebalance", CHAOS_ANSWER_REBALANCE}};
  for (size_t i = 0; i < sizeof answers / sizeof answers[0]; i++)
    if (strcmp(cause, answers[i].cause) == 0) return answers[i].answer;
  return CHAOS_ANSWER_NONE;
}

/* The faults a recovery answers: every unmatched fault of its answer (its action's row in
 * chaos.c says it) injected before its plan (several at once are coalesced into one plan);
 * for a crash or hang, any worker fault, since a stopped worker may be seen first through
 * its expired lease; for a join, a woken worker, and the join faults whose joiners plan
 * names (join_answers). */
static uint64_t match_faults(run *r, const char *cause, uint64_t t_plan, const newt_plan *plan, const char **what) {
  uint64_t first = 0;
  chaos_answer answer = answer_of(cause);
  for (int i = 0; i < r->nfaults; i++) {
    fault *f = &r->faults[i];
    if (f->matched || f->t_ms > t_plan) continue;
    int ok = answer != CHAOS_ANSWER_NONE && f->answer == answer;
    if (ok) f->matched = 1;
    else if (answer == CHAOS_ANSWER_WAKE && f->answer == CHAOS_ANSWER_JOINERS) ok = join_answers(f, plan, NULL, 0);
    if (!ok) continue;
    if (!first || f->t_ms < first) first = f->t_ms, *what = f->what;
  }
  return first;
}

void launcher_recovery_of(const job_event *e, uint64_t t_fault, launcher_recovery *out) {
  job_recovery_times rt = job_recovery_time(e, t_fault);
  memset(out, 0, sizeof *out);
  snprintf(out->cause, sizeof out->cause, "%s", e->cause);
  snprintf(out->restore, sizeof out->restore, "%s", e->restore);
  out->generation = e->generation;
  out->t_ms = rt.start;
  out->step = e->restore_step;
  out->fault_step = job_event_fault_step(e);
  out->world = e->world;
  out->detect_ms = rt.detect_ms;
  out->plan_ms = rt.plan_ms;
  out->comm_ms = rt.comm_ms;
  out->restore_ms = rt.restore_ms;
  out->step_ms = rt.step_ms;
  out->total_ms = rt.total_ms;
  out->steps_lost = e->steps_lost;
  out->outage_ms = out->pause_ms = out->resumed_ms = out->from_start_ms = -1;
}

/* Notes in etcd a fault we injected, for the recovery of generation gen (job_fault): newt
 * status then times that recovery as we do. Written off the event's path, when etcd answers
 * (recoveries_flush_notes). */
static void note_fault(run *r, int64_t gen, uint64_t t_ms, const char *what) {
  job_fault *n = realloc(r->notes, (size_t)(r->nnotes + 1) * sizeof *n);
  if (!n) return;
  r->notes = n;
  n = &r->notes[r->nnotes++];
  memset(n, 0, sizeof *n);
  n->generation = gen;
  n->t_ms = t_ms;
  snprintf(n->what, sizeof n->what, "%s", what);
}

/* Writes the notes not written yet, while etcd answers (a note waits out an outage, and
 * the loop is not held up asking an etcd its watch says is away). */
void recoveries_flush_notes(run *r, int64_t wait_ms) {
  int away = follow_etcd_away(r);
  while (!away && r->notes_done < r->nnotes && r->etcd) {
    const job_fault *f = &r->notes[r->notes_done];
    char key[256], *text = job_fault_to_json(f);
    newt_result_t res = text ? job_key(key, sizeof key, r->o->spec.job, JOB_REC_FAULT, (uint64_t)f->generation, NULL)
                             : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
    if (res == NEWT_OK)
      res = rdzv_etcd_put(r->etcd, key, text, strlen(text), 0, newt_deadline_in_ms(wait_ms), NULL);
    free(text);
    if (res != NEWT_OK) return; /* the next look tries again */
    r->notes_done++;
  }
}

/* Worker ids, comma-separated, on stderr. */
static void print_ids(char (*ids)[RDZV_NAME_MAX], int n) {
  for (int i = 0; i < n; i++) fprintf(stderr, "%s%s", i ? ", " : "", ids[i]);
}

/* A recovery: timed from the fault we injected that it answers, else its first detection. */
static void on_recovered(run *r, const job_event *e) {
  const char *cause = e->cause, *restore = e->restore;
  int64_t gen = e->generation, world = e->world, lost = e->steps_lost, from = e->restore_step;
  launcher_recovery *rec = add_recovery(r);
  if (!rec) return;
  const char *what = "";
  /* a join is matched by its joiners in the plan in force (a later one names them too) */
  newt_plan buf, *plan = strcmp(cause, "join") == 0 ? follow_plan(r, &buf) : NULL;
  uint64_t t_fault = match_faults(r, cause, e->t_plan, plan, &what);
  if (plan) plan_free(plan);
  /* one definition in every view (job_recovery_time): from the fault we injected, else
     the first detection; a join starts at the joiner's registration, not at the start
     of its process. newt status learns of the fault from our note in etcd. */
  uint64_t from_fault = strcmp(cause, "join") == 0 ? 0 : t_fault;
  launcher_recovery_of(e, from_fault, rec);
  if (from_fault && rec->t_ms == from_fault) note_fault(r, gen, from_fault, what);
  snprintf(rec->fault, sizeof rec->fault, "%s", what);
  rec->t_fault = t_fault;
  /* a join we started: its start-up too, from the process start to the first step */
  uint64_t end = rec->t_ms + (uint64_t)rec->total_ms;
  if (!from_fault && t_fault && strcmp(cause, "join") == 0)
    rec->from_start_ms = end > t_fault && (int64_t)(end - t_fault) > rec->total_ms ? (int64_t)(end - t_fault)
                                                                                     : rec->total_ms;
  if (r->o->quiet) return;
  char started[80] = "";
  if (rec->from_start_ms >= 0)
    snprintf(started, sizeof started, ", %lld ms from the joiner's process start", (long long)rec->from_start_ms);
  /* one account of the steps, as the summary, newt status and the report give it; a plan
     that took over from survivors who went on without etcd comes at a later step */
  if (r->o->spec.restart) { /* the programs start again from their own checkpoints: newt kept no step of theirs */
    fprintf(stderr,
            "%snewt run: a new generation after a %s in %lld ms%s (detect %lld, plan %lld, first beat %lld ms), "
            "generation %lld, %lld rank%s: the programs start again from their own checkpoints\n",
            live_news(r), cause, (long long)rec->total_ms, started, (long long)rec->detect_ms, (long long)rec->plan_ms,
            (long long)rec->step_ms, (long long)gen, (long long)world, world == 1 ? "" : "s");
    return;
  }
  char account[160];
  if (rec->fault_step < from)
    snprintf(account, sizeof account, "the fault hit at step %lld, the survivors went on without etcd, and the "
             "leader's plan took over at step %lld", (long long)rec->fault_step, (long long)from);
  else
    snprintf(account, sizeof account, "the fault hit at step %lld, training went on from step %lld",
             (long long)rec->fault_step, (long long)from);
  fprintf(stderr,
          "%snewt run: recovered from %s in %lld ms%s (detect %lld, plan %lld, comm %lld, restore %lld, first "
          "step %lld ms; state from %s), generation %lld, %lld rank%s: %s, %lld step%s redone\n",
          live_news(r), cause, (long long)rec->total_ms, started, (long long)rec->detect_ms, (long long)rec->plan_ms,
          (long long)rec->comm_ms, (long long)rec->restore_ms, (long long)rec->step_ms, restore, (long long)gen,
          (long long)world, world == 1 ? "" : "s", account, (long long)lost, lost == 1 ? "" : "s");
  if (lost > 0 && (strcmp(restore, "ckpt") == 0 || strcmp(restore, "init") == 0))
    fprintf(stderr, "newt run: WARNING: no step was whole in the ranks' memory: training went back to %s (step "
            "%lld), %lld step%s redone (more failure domains lost at once than spec.fault.replicas keeps copies for?)%s\n",
            strcmp(restore, "ckpt") == 0 ? "the newest checkpoint" : "the initial state", (long long)from,
            (long long)lost, lost == 1 ? "" : "s",
            strcmp(restore, "init") == 0 ? "; started again from nothing as spec.fault.on_state_loss restart allows" : "");
}

/* A new leader: a coordinator we killed has been replaced. */
static void on_leader(run *r, const job_event *e) {
  for (int i = 0; i < r->nfaults; i++) {
    fault *f = &r->faults[i];
    if (f->matched || f->answer != CHAOS_ANSWER_LEADER || f->t_ms > e->t_ms) continue;
    f->matched = 1;
    launcher_recovery *rec = recoveries_add_unplanned(r, "coordinator", f);
    if (!rec) break;
    rec->detect_ms = rec->total_ms = run_ms_between(e->t_ms, f->t_ms);
    if (!r->o->quiet)
      fprintf(stderr, "%snewt run: a new coordinator leads %lld ms after the leader was lost; training went on\n",
              live_news(r), (long long)rec->total_ms);
  }
}

/* A plan other than the first (or the first with spares): said, with its spares. */
static void on_plan(run *r, const job_event *e) {
  if (r->o->quiet || (strcmp(e->cause, "initial") == 0 && e->spares <= 0)) return;
  fprintf(stderr, "%snewt run: plan %lld (%s): %lld rank%s", live_news(r), (long long)e->generation, e->cause,
          (long long)e->world, e->world == 1 ? "" : "s");
  if (e->spares > 0) {
    fprintf(stderr, ", %lld spare%s (", (long long)e->spares, e->spares == 1 ? "" : "s");
    print_ids(e->spare_ids, e->nspare_ids);
    fprintf(stderr, "): %s", e->why[0] ? e->why : "the layout has no room for them");
  }
  fputc('\n', stderr);
}

/* Joiners the layout takes no more of than before: a join fault is answered by it. */
static void on_spare(run *r, const job_event *e) {
  for (int i = 0; i < r->nfaults; i++) {
    fault *f = &r->faults[i];
    if (f->matched || f->answer != CHAOS_ANSWER_JOINERS || f->t_ms > e->t_ms) continue;
    if (join_answers(f, NULL, e->spare_ids, e->nspare_ids)) break;
  }
  if (r->o->quiet) return;
  fprintf(stderr, "%snewt run: ", live_news(r));
  print_ids(e->spare_ids, e->nspare_ids);
  fprintf(stderr, " joined and stay%s: %s\n", e->nspare_ids == 1 ? "s a spare" : " spares", e->why);
}

/* Replicas that disagreed: said, and kept for the summary. */
static void on_mismatch(run *r, const job_event *e) {
  launcher_result *res = r->res;
  launcher_mismatch *m = realloc(res->mismatches, (size_t)(res->nmismatches + 1) * sizeof *m);
  if (m) {
    res->mismatches = m;
    m += res->nmismatches++;
    *m = (launcher_mismatch){.step = e->step, .back_to = e->restore_step, .generation = e->generation, .t_ms = e->t_ms};
    snprintf(m->action, sizeof m->action, "%s", e->action);
    snprintf(m->worker, sizeof m->worker, "%s", e->worker);
    snprintf(m->why, sizeof m->why, "%s", e->why);
  }
  if (!r->o->quiet) fprintf(stderr, "%snewt run: %s\n", live_news(r), e->why);
}

/* The first generation took up its state: from a checkpoint of an earlier run (the summary's
 * resumed_from), or afresh. */
static void on_started(run *r, const job_event *e) {
  launcher_result *res = r->res;
  if (strcmp(e->restore, "ckpt") != 0 || e->restore_step <= 0 || res->resumed_step > 0) return;
  res->resumed_step = e->restore_step;
  snprintf(res->resumed_dir, sizeof res->resumed_dir, "%s", r->o->spec.ckpt_dir);
  if (!r->o->quiet)
    fprintf(stderr, "%snewt run: resumed from the checkpoint of step %lld in %s (an earlier run's): steps 1 to %lld "
            "are not trained again\n", live_news(r), (long long)res->resumed_step, res->resumed_dir,
            (long long)res->resumed_step);
}

static void handle_event(run *r, const job_event *e) {
  if (e->generation > r->res->generations) r->res->generations = e->generation;
  if (e->type == JOB_EV_RECOVERED) on_recovered(r, e);
  else if (e->type == JOB_EV_STARTED) on_started(r, e);
  else if (e->type == JOB_EV_LEADER) on_leader(r, e);
  else if (e->type == JOB_EV_PLAN) on_plan(r, e);
  else if (e->type == JOB_EV_SPARE) on_spare(r, e);
  else if (e->type == JOB_EV_MISMATCH) on_mismatch(r, e);
  else if (e->type == JOB_EV_DONE) r->leader_done = 1;
  else if (e->type == JOB_EV_FAILED) {
    snprintf(r->res->failed, sizeof r->res->failed, "%s", e->why);
    fprintf(stderr, "%snewt run: the job failed: %s\n", live_news(r), e->why);
  } else if (r->o->quiet) {
    return;
  } else if (e->type == JOB_EV_WAITING) {
    fprintf(stderr, "%snewt run: the coordinator waits for workers: %s\n", live_news(r), e->why);
  } else if (e->type == JOB_EV_ETCD) {
    fprintf(stderr, "%snewt run: %s\n", live_news(r), e->why);
  } else if (e->type == JOB_EV_SPEC) {
    fprintf(stderr, "%snewt run: spec %s\n", live_news(r), e->why);
  }
}

void recoveries_take_events(run *r, job_event *evs, int n) {
  for (int i = 0; i < n; i++) {
    if (r->event_log_fd >= 0 && job_eventlog_append(r->event_log_fd, &evs[i]) != NEWT_OK) {
      fprintf(stderr, "newt run: %s: %s (no more events are logged)\n", r->res->event_log, newt_errmsg());
      close(r->event_log_fd);
      r->event_log_fd = -1;
    }
    handle_event(r, &evs[i]);
    job_event_free(&evs[i]);
  }
}

/* An etcd outage measured on the step log (rank 0's line per step, with its wall time and
 * throughput): the longest stretch without a step while etcd was away, beyond the usual step
 * time before it (0 when no stretch was three usual step times: steps went on at their
 * pace), and the median tokens/s of the steps before it and of those during it. */
static void measure_outage(launcher_recovery *rec, const job_step *s, size_t n) {
  uint64_t down = rec->t_fault, up = down + (uint64_t)(rec->outage_ms > 0 ? rec->outage_ms : rec->total_ms);
  double gaps[64], before[64], during[4096];
  size_t ng = 0, nb = 0, nd = 0;
  uint64_t longest = 0;
  for (size_t i = 1; i < n; i++) {
    uint64_t t = s[i].t_ms, gap = t > s[i - 1].t_ms ? t - s[i - 1].t_ms : 0;
    if (t < down && t + 10000 >= down) {
      if (ng < 64) gaps[ng++] = (double)gap;
      if (nb < 64) before[nb++] = s[i].tokens_per_s;
    } else if (t >= down && s[i - 1].t_ms <= up) {
      if (gap > longest) longest = gap;
      if (t <= up && nd < 4096) during[nd++] = s[i].tokens_per_s;
    }
  }
  double usual = newt_median(gaps, ng);
  rec->pause_ms = ng && longest > 3 * usual ? (int64_t)((double)longest - usual) : 0;
  rec->tps_before = newt_median(before, nb);
  rec->tps_during = newt_median(during, nd);
}

/* From an injected fault to the first step the new layout completed: rank 0's first line
 * after the fault with another world than the last before it (-1: none). */
static int64_t resumed_after(uint64_t t_fault, const job_step *s, size_t n) {
  int64_t world = -1; /* the world of the last step before the fault */
  for (size_t i = 0; i < n; i++) {
    if (s[i].t_ms <= t_fault) world = s[i].world;
    else if (world >= 0 && s[i].world != world) return (int64_t)(s[i].t_ms - t_fault);
  }
  return -1;
}

/* A worker fault no recovery of the leader's answered, after which the step log shows the
 * survivors going on without etcd (another world): the job ended before the leader's plan
 * for it was taken up (etcd away to the end, no coordinator). Said as it is: no record is
 * made up for it. */
static void say_unrecorded(run *r, const job_step *s, size_t n) {
  for (int i = 0; i < r->nfaults && !r->o->quiet; i++) {
    const fault *f = &r->faults[i];
    /* a slow link that stalled no rank past the hang deadline lost none: nothing to record */
    if (f->matched || f->ev.action == CHAOS_SLOW || (f->answer != CHAOS_ANSWER_CRASH && f->answer != CHAOS_ANSWER_LEAVE))
      continue;
    int64_t resumed = resumed_after(f->t_ms, s, n);
    if (resumed >= 0)
      fprintf(stderr, "newt run: %s: the survivors went on without etcd (training resumed %lld ms after it), but the "
              "job ended before the leader's plan for it was taken up: the recovery is in no record (the summary "
              "has none)\n", f->what, (long long)resumed);
  }
}

void recoveries_measure(run *r) {
  job_step *s = NULL;
  size_t n = 0;
  if (job_steplog_read(r->res->step_log, &s, &n, NULL) != NEWT_OK || job_steplog_stitch(s, &n, NULL) != NEWT_OK) {
    free(s);
    return;
  }
  for (int k = 0; k < r->res->nrecoveries; k++) {
    launcher_recovery *rec = &r->res->recoveries[k];
    int etcd = strcmp(rec->cause, "etcd") == 0;
    if (etcd && n >= 3) measure_outage(rec, s, n);
    rec->resumed_ms = rec->t_fault && !etcd ? resumed_after(rec->t_fault, s, n) : -1;
  }
  say_unrecorded(r, s, n);
  free(s);
}
