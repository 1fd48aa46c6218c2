/* The step protocol: a worker's life under the program's step loop (internal.h; newt.h is
 * the contract). Its other parts, each a file this one calls: join.c (what a worker is and
 * holds before its first step), watch.c (the plan watch), wait.c (waiting for a plan; a
 * donor's hand-over), generation.c (a generation built, reported failed, ended) and
 * finish.c (the end: the termination message, everything released).
 *
 * Threads: the program's thread calls in (join, begin, commit, end, finish) and does all
 * the work of a generation; the plan watch (an etcd watch on /newt/<job>/plan) keeps the
 * newest plan and, when it asks to drop the running step (switch "abort"), aborts the
 * communicator so a pending collective returns at once; a publisher thread writes what need
 * not hold up a step (progress, acks, registration state) to etcd.
 *
 * The protocol. newt_step_begin drives everything between steps: the first call registers;
 * while no plan names this worker a rank it waits (a spare); a plan that does is built into
 * a generation (its communicator, its tensor, data and pipeline groups) and handed to the
 * program (NEXT_GENERATION), which declares its state and restores it. Then each begin hands
 * out a step and this rank's samples; commit agrees on the step over the world (with the
 * control values: a rank asks to leave, a newer plan asks to switch) and snapshots the
 * state before the update; end does what follows a step (the replica, a checkpoint,
 * progress, the step log). A failed collective anywhere makes the next begin report whom
 * this rank lost, end the generation and wait for the next plan; a leave agreed at a commit
 * makes it hand this rank's state over (as a donor of the next plan) and say NEXT_LEFT. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/param.h"
#include "common/strutil.h"
#include "job/plan.h"
#include "job/records.h"
#include "job/runlog.h"
#include "rendezvous/etcd.h"
#include "worker/internal.h"

NEWT_PARAM(StallMultiple, "NEWT_STALL_MULTIPLE", 3)   /* the stall deadline: this many times ... */
NEWT_PARAM(StallFloorMs, "NEWT_STALL_FLOOR_MS", 250)  /* ... the 95th percentile of the step times, at least this */

/* --- the step log --------------------------------------------------------------------------- */

/* The step log (--step-log): rank 0 appends each step's line. Every rank keeps the line of
 * the last step it did, so that when a rank 0 is killed before it wrote its last step's
 * line, the next rank 0 writes it, having done that step too (a line twice is harmless:
 * readers keep one per step). */
static void log_step(worker *w, int rank0, const job_step *line) {
  w->last_step = *line;
  w->last_step_logged = rank0 && w->step_log_fd >= 0;
  if (!w->last_step_logged) return;
  if (job_steplog_append(w->step_log_fd, line) != NEWT_OK) /* the log is for people: training goes on */
    NEWT_WARN(WORKER, "%s: step log %s: %s", w->id, w->o.step_log, newt_errmsg());
}

/* --- the step protocol ---------------------------------------------------------------------- */

/* The worker's part is over: how (NEXT_DONE, LEFT, FAILED, LEFT_OUT). */
static newt_result_t over(worker *w, newt_next how, newt_next *next) {
  w->phase = PHASE_OVER;
  w->over = how;
  *next = how;
  return NEWT_OK;
}

/* Registers and watches the plan (the first begin). */
static newt_result_t enter(worker *w) {
  NEWT_CHECK(worker_publisher_start(w));
  NEWT_CHECK(worker_register(w));
  for (;;) { /* etcd away: wait for it */
    newt_result_t r = worker_watch_plan(w);
    if (r == NEWT_OK) break;
    if (!rdzv_etcd_transient(r) || worker_stop_asked(w)) return r;
    NEWT_WARN(WORKER, "%s: watching the plan: %s (waiting for etcd)", w->id, newt_errmsg());
    newt_sleep_ms(1000);
  }
  NEWT_INFO(WORKER, "%s: registered for job %s at %s (host %s, failure domain %s)", w->id, w->o.job, w->addr, w->host,
            w->domain);
  w->phase = PHASE_WAITING;
  return NEWT_OK;
}

/* Waiting: for a plan naming this worker a rank, a donor's hand-over, or the end. */
static newt_result_t wait_generation(worker *w, newt_next *next) {
  for (;;) {
    newt_plan p;
    wait_outcome wo;
    NEWT_CHECK(worker_wait_plan(w, 0, NEWT_DEADLINE_NONE, &p, &wo));
    switch (wo) {
      case WAIT_DONE: /* without this worker when it trained and was left out: it says so (ended_done) */
        NEWT_INFO(WORKER, "%s: the job is done", w->id);
        return over(w, w->done_step > 0 || w->held_plan.generation > 0 ? NEWT_NEXT_LEFT_OUT : NEWT_NEXT_DONE, next);
      case WAIT_FAILED:
        NEWT_ERROR(WORKER, "%s: the job failed: %s", w->id, w->failed_why);
        return over(w, NEWT_NEXT_FAILED, next);
      case WAIT_LEAVE:
        NEWT_INFO(WORKER, "%s: leaving between generations", w->id);
        worker_hand_over(w);
        return over(w, NEWT_NEXT_LEFT, next);
      case WAIT_PLAN: break;
    }
    int built = worker_start_generation(w, &p, NULL, NULL);
    plan_free(&p);
    if (built) {
      *next = NEWT_NEXT_GENERATION;
      return NEWT_OK;
    }
  }
}

/* The last step was trained in a generation the survivors of a crash made while etcd was away
 * (peers.c): no plan of the leader's names the membership the job ends with, and the crash is
 * in no record. So the end waits for the leader's plan, which follows the survivors' reports
 * once etcd is back (the end marker needs etcd too): its generation is taken up with no step
 * left to train, acknowledged (end_trained), and the end marker follows, so the recovery is
 * recorded and the job ends in a generation of the leader's. At most NEWT_DONE_WAIT_MS: then
 * the job ends as it is, saying so. */
static newt_result_t end_after_leaders_plan(worker *w, newt_next *next) {
  NEWT_INFO(WORKER, "%s: trained the last step (%lld) in generation %llu (peers %d), which no plan of the leader's "
            "names: waiting for the leader's plan (it follows once etcd is back) before the end", w->id,
            (long long)w->live_step, (unsigned long long)w->plan.generation, w->peer_epoch);
  worker_end_generation(w);
  w->phase = PHASE_WAITING;
  newt_deadline_t until = newt_deadline_in_ms(worker_done_wait_ms());
  for (;;) {
    newt_plan p;
    wait_outcome wo;
    NEWT_CHECK(worker_wait_plan(w, 0, until, &p, &wo));
    if (wo == WAIT_DONE) return over(w, NEWT_NEXT_DONE, next);
    if (wo == WAIT_FAILED) {
      NEWT_ERROR(WORKER, "%s: the job failed: %s", w->id, w->failed_why);
      return over(w, NEWT_NEXT_FAILED, next);
    }
    if (wo == WAIT_LEAVE) { /* asked to stop, or no plan came: the job is trained all the same */
      NEWT_WARN(WORKER, "%s: no plan of the leader's came for generation %llu (peers %d)%s: the job ends without its "
                "recovery in the record", w->id, (unsigned long long)w->gen, w->peer_epoch,
                worker_stop_asked(w) ? " before this worker was asked to stop" : "");
      worker_mark_done(w, w->last_loss);
      return over(w, NEWT_NEXT_DONE, next);
    }
    int built = worker_start_generation(w, &p, NULL, NULL);
    plan_free(&p);
    if (built) {
      *next = NEWT_NEXT_GENERATION;
      return NEWT_OK;
    }
  }
}

/* The job's last step is done. A generation taken up with no step left to train (the
 * leader's plan after the survivors' own, end_after_leaders_plan) is acknowledged now, and
 * every rank's acknowledgement is in etcd before any end marker (a barrier after each rank's
 * publisher wrote its own): the leader records the recovery before it sees the end. */
static newt_result_t end_trained(worker *w, newt_next *next) {
  w->trained_last = 1; /* its loss is the job's: every rank has the same (the commit's sums) */
  if (w->peer_epoch) return end_after_leaders_plan(w, next);
  NEWT_INFO(WORKER, "%s: trained the last step (%lld)", w->id, (long long)w->live_step);
  if (w->first_step_of_gen) {
    w->first_step_of_gen = 0;
    w->t_first_step = newt_wall_ms();
    worker_publish_ack(w, NULL);
    worker_publisher_flush(w, newt_deadline_in_ms(w->spec.lease_ttl_ms + 3000));
    if (comm_barrier(comm_host_channel(w->train)) != NEWT_OK) /* a rank lost at the end: its own marker follows */
      NEWT_WARN(WORKER, "%s: waiting for the other ranks' acknowledgements of generation %llu: %s", w->id,
                (unsigned long long)w->plan.generation, newt_errmsg());
  }
  /* the job's last state in its checkpoint directory before the marker ends it (newt run gives
     the processes of a job done 10 s; a save is waited for before that clock starts) */
  if (worker_ckpt_final(w, "the job's last step") != NEWT_OK) NEWT_WARN(WORKER, "%s", newt_errmsg());
  worker_mark_done(w, w->last_loss);
  worker_end_generation(w);
  return over(w, NEWT_NEXT_DONE, next);
}

/* The step that comes, or the end of the generation the last commit agreed on. */
static newt_result_t next_step(worker *w, newt_batch *b, newt_next *next) {
  if (w->leave_agreed || w->switch_agreed) {
    int leaving = w->leave_agreed && worker_stop_asked(w);
    NEWT_INFO(WORKER, "%s: %s after step %lld", w->id, w->leave_agreed ? "a rank leaves" : "switching to the next plan",
              (long long)w->live_step);
    w->leave_agreed = w->switch_agreed = 0;
    /* when every rank leaves at once (the whole job stopped: Ctrl-C on `newt run`, every pod
       deleted) no one stays to take the state: it goes to the checkpoint directory, if the job
       has one, so that a run on it resumes from this very step */
    if (leaving && w->all_leave && worker_ckpt_final(w, "the whole job stops") != NEWT_OK)
      NEWT_WARN(WORKER, "%s", newt_errmsg());
    worker_end_generation(w);
    if (leaving) {
      /* ... and waiting for a plan that names us a donor would only hold the exit up */
      if (w->all_leave) NEWT_INFO(WORKER, "%s: every rank leaves after step %lld: nothing to hand over", w->id,
                                  (long long)w->live_step);
      else worker_hand_over(w);
      NEWT_INFO(WORKER, "%s: left gracefully after step %lld", w->id, (long long)w->live_step);
      return over(w, NEWT_NEXT_LEFT, next);
    }
    w->phase = PHASE_WAITING;
    return wait_generation(w, next);
  }
  if (w->live_step >= w->spec.steps || w->end_now) return end_trained(w, next);
  const newt_plan *p = &w->plan;
  int64_t gb = p->global_batch, off;
  plan_slice(p, w->dp_rank, &off, &w->step_count);
  w->step_first = (int64_t)worker_cursor(w) + off;
  *b = (newt_batch){.size = b->size, .step = w->live_step + 1, .first = w->step_first, .count = w->step_count,
                    .micro_batch = p->micro_batch, .accum = (w->step_count + p->micro_batch - 1) / p->micro_batch,
                    .global_batch = gb};
  if (w->sample_log && w->tp_rank == 0 && w->pp_rank == 0) { /* one rank per data-parallel slice */
    fprintf(w->sample_log, "C %llu %lld %llu %lld %d\n", (unsigned long long)p->generation, (long long)w->live_step + 1,
            (unsigned long long)w->step_first, (long long)w->step_count, w->peer_epoch);
    fflush(w->sample_log);
  }
  if (worker_stop_asked(w) && !w->leave_announced) {
    /* let the leader plan the next generation while this step finishes */
    w->leave_announced = 1;
    worker_set_state_async(w, "leaving");
  }
  w->wait_at_begin = comm_thread_wait_ns();
  atomic_store(&w->step_started, newt_now_ns());
  w->step = STEP_BEGUN;
  *next = NEWT_NEXT_STEP;
  return NEWT_OK;
}

/* 1 when the running generation's communicator failed (a collective of this rank's, or a
 * peer's failure spread to it). */
static int generation_failed(worker *w) {
  comm_status st;
  comm_get_status(w->all, &st);
  return st.code != NEWT_OK;
}

/* A generation failed: report whom this rank lost, end it, wait for the next plan. */
static newt_result_t recover(worker *w, newt_next *next) {
  w->t_detect = newt_wall_ms();
  if (w->step == STEP_COMMITTED) w->live_step++, w->derived_stale = 1; /* applied, not ended */
  worker_report_failure(w);
  /* etcd away: the survivors may go on among themselves (worker/peers.c) */
  newt_plan p;
  comm_t *c = NULL, *parent = NULL;
  int peers = worker_peer_recover(w, &p, &c, &parent);
  worker_end_generation(w);
  w->phase = PHASE_WAITING;
  if (peers) {
    int built = 0;
    if (plan_find(&p, w->id)) built = worker_start_generation(w, &p, c, parent);
    else worker_donate_on(w, &p, c, parent); /* a donor of it: hands its state over, then waits */
    plan_free(&p);
    if (built) {
      *next = NEWT_NEXT_GENERATION;
      return NEWT_OK;
    }
  }
  return wait_generation(w, next);
}

/* Replicas disagreed and a check rolled back (verify.c): the generation starts again, its
 * layout and groups the same; the program declares and restores, and the restore takes the
 * verified copy. */
static newt_result_t restart_generation(worker *w, newt_next *next) {
  NEWT_INFO(WORKER, "%s: generation %llu starts again from step %lld, its newest verified step", w->id,
            (unsigned long long)w->plan.generation, (long long)w->rollback_to);
  worker_await_declaration(w);
  *next = NEWT_NEXT_GENERATION;
  return NEWT_OK;
}

newt_result_t worker_begin(worker *w, newt_batch *b, newt_next *next) {
  if (w->failed && w->phase != PHASE_OVER) { /* a restore or a check found the job failing (its words in failed_why) */
    if (w->all) worker_end_generation(w);
    return over(w, NEWT_NEXT_FAILED, next);
  }
  switch (w->phase) {
    case PHASE_OVER:
      return NEWT_ERR(NEWT_ERR_INVALID, "newt_step_begin: this worker's part is over (%s): call newt_finish",
                      w->over == NEWT_NEXT_DONE       ? "the job is done"
                      : w->over == NEWT_NEXT_LEFT_OUT ? "the job is done without it"
                      : w->over == NEWT_NEXT_LEFT     ? "it left"
                                                      : "the job failed");
    case PHASE_JOINED: NEWT_CHECK(enter(w)); return wait_generation(w, next);
    case PHASE_WAITING: return wait_generation(w, next);
    case PHASE_BUILT:
      if (generation_failed(w)) return recover(w, next); /* the restore's collectives failed */
      if (w->restore_err[0]) /* the root cause, not this consequence of it */
        return NEWT_ERR(NEWT_ERR_INVALID, "newt_step_begin: generation %llu is built but its state is not restored: "
                        "its newt_state_restore failed: %s", (unsigned long long)w->plan.generation, w->restore_err);
      return NEWT_ERR(NEWT_ERR_INVALID, "newt_step_begin: generation %llu is built but its state is not restored "
                      "(declare it, then newt_state_restore)", (unsigned long long)w->plan.generation);
    case PHASE_RUNNING: break;
  }
  if (generation_failed(w)) return recover(w, next);
  if (w->rollback_to >= 0) return restart_generation(w, next);
  if (w->step != STEP_IDLE)
    return NEWT_ERR(NEWT_ERR_INVALID, "newt_step_begin: step %lld was begun and not %s, and its generation is "
                    "healthy (commit and end every step; after a failed collective, begin again)",
                    (long long)w->live_step + 1, w->step == STEP_BEGUN ? "committed" : "ended");
  return next_step(w, b, next);
}

newt_result_t worker_commit(worker *w, const double *values, double *sums, int n) {
  if (w->phase != PHASE_RUNNING || w->step != STEP_BEGUN)
    return NEWT_ERR(NEWT_ERR_INVALID, "newt_step_commit: no step is begun (newt_step_begin said NEXT_STEP first)%s",
                    w->step == STEP_COMMITTED ? "; this step was committed already" : "");
  /* [leave, switch, reaches etcd, compute, values...] of every rank, summed in rank order in
     double; compute: this rank's seconds from begin to here less its time in collectives
     (speed.c: the ranks' speeds) */
  int k = n + 4, size = comm_size(w->train);
  double mine[36];
  mine[0] = worker_stop_asked(w) ? 1 : 0;
  mine[1] = (double)atomic_load(&w->switch_pending);
  pthread_mutex_lock(&w->mu);
  mine[2] = !w->etcd || (rdzv_etcd_reachable(w->etcd) && !w->pub_failing);
  pthread_mutex_unlock(&w->mu);
  uint64_t began = atomic_load(&w->step_started), waited = comm_thread_wait_ns() - w->wait_at_begin;
  double compute = began ? ((double)(newt_now_ns() - began) - (double)waited) / 1e9 : 0;
  mine[3] = compute > 0 ? compute : 0;
  for (int i = 0; i < n; i++) mine[4 + i] = values[i];
  double *all = malloc((size_t)size * (size_t)k * sizeof *all);
  NEWT_CHECK_ALLOC(all);
  newt_result_t r = comm_allgather(comm_host_channel(w->train), mine, all, (size_t)k * sizeof(double), NEWT_U8);
  if (r != NEWT_OK) {
    free(all);
    return r;
  }
  double tot[36] = {0};
  for (int q = 0; q < size; q++)
    for (int i = 0; i < k; i++) tot[i] += all[(size_t)q * (size_t)k + (size_t)i];
  if (!w->first_step_of_gen) /* a generation's first holds lazy starts */
    worker_speed_step(&w->speed, &w->plan, all + 3, k, size, newt_wall_ms());
  if (w->step_count > 0) {
    metrics_set(w->metrics, "newt_worker_compute_seconds", mine[3]);
    metrics_set(w->metrics, "newt_worker_sample_compute_seconds", mine[3] / (double)w->step_count);
  }
  /* the progress record (the leader's evidence that steps go on) comes from the lowest rank
     that reaches etcd, not from rank 0 alone: a rank cut from etcd, rank 0 included, is then
     seen alive while it trains (docs/elastic.md, "When etcd is away") */
  w->progress_rank = 0;
  for (int q = size - 1; q >= 0; q--)
    if (all[(size_t)q * (size_t)k + 2] > 0) w->progress_rank = q;
  free(all);
  for (int i = 0; i < n; i++) sums[i] = tot[4 + i];
  w->leave_agreed = tot[0] > 0;
  w->all_leave = tot[0] >= (double)size && w->plan.nspares == 0;
  w->switch_agreed = tot[1] > 0;
  /* every rank finished the step before (its update, its post-update collectives): it is
     committed, and the snapshot to roll back to is taken of it now, before the update. Taken
     earlier, at the start of the step, a rank could drop the only whole state while another
     rank still lacked the previous step's parameters (a ZeRO all-gather cut by a death). */
  w->committed_step = w->live_step;
  NEWT_CHECK(worker_snapshot(w));
  w->step = STEP_COMMITTED;
  return NEWT_OK;
}

/* The stall deadline of the generation's collectives (comm_set_stall) follows the observed
 * step times: NEWT_STALL_MULTIPLE times the 95th percentile of the last WORKER_STEP_TIMES
 * steps, at least NEWT_STALL_FLOOR_MS, at most spec.fault.comm_timeout_ms (the cap, and the
 * deadline until WORKER_STEP_TIMES / 8 steps were seen). A rank that stops (SIGSTOP, a hung
 * host) answers no probe and is named at that deadline; one that answers but is still in
 * its step is waited for up to the cap, so a slow but healthy step is no hang. */
static void follow_steps(worker *w, double step_s) {
  w->step_s[w->step_s_at] = step_s;
  w->step_s_at = (w->step_s_at + 1) % WORKER_STEP_TIMES;
  if (w->nstep_s < WORKER_STEP_TIMES) w->nstep_s++;
  if (w->nstep_s < WORKER_STEP_TIMES / 8 || !w->train) return;
  /* a generation's communicators get the deadline at once; after that it is worked out every
     eighth step, not on every step's path */
  if (w->stall_ms && w->step_s_at % 8) return;
  double sorted[WORKER_STEP_TIMES];
  memcpy(sorted, w->step_s, (size_t)w->nstep_s * sizeof *sorted);
  double p95 = newt_percentile(sorted, (size_t)w->nstep_s, 0.95);
  int64_t ms = (int64_t)(newt_param_StallMultiple() * p95 * 1e3), cap = w->spec.comm_timeout_ms;
  if (ms < newt_param_StallFloorMs()) ms = newt_param_StallFloorMs();
  if (ms > cap) ms = cap;
  if (ms == w->stall_ms) return;
  if (w->stall_ms == 0 || ms * 4 < w->stall_ms * 3 || ms * 4 > w->stall_ms * 5) /* say a move of a quarter or more */
    NEWT_INFO(WORKER, "%s: a collective without progress for %lld ms probes its peers (95th percentile of the last %d "
              "steps: %.0f ms; a peer still in its step is waited for up to %lld ms)", w->id, (long long)ms,
              w->nstep_s, p95 * 1e3, (long long)cap);
  w->stall_ms = ms;
  comm_set_stall(w->train, ms);
  metrics_set(w->metrics, "newt_worker_stall_deadline_seconds", (double)ms / 1e3);
}

newt_result_t worker_end(worker *w, const newt_step_result *res) {
  if (w->phase != PHASE_RUNNING || w->step != STEP_COMMITTED)
    return NEWT_ERR(NEWT_ERR_INVALID, "newt_step_end: no step is committed (newt_step_commit first)");
  w->step = STEP_IDLE;
  atomic_store(&w->step_started, 0);
  w->live_step++;
  w->derived_stale = res->after != NEWT_OK;
  if (w->sample_log) {
    fprintf(w->sample_log, "A %llu %lld %llu %d\n", (unsigned long long)w->plan.generation, (long long)w->live_step,
            (unsigned long long)newt_wall_ms(), w->peer_epoch);
    fflush(w->sample_log);
  }
  if (res->after != NEWT_OK) return NEWT_ERR(res->after, "the step's post-update collectives failed");
  worker_chaos_flip(w);
  /* the replicated state checked (when due) before it is copied, checkpointed or logged: a
     disagreement rolled back returns here, the next step the one after the verified step */
  int rolled = 0;
  NEWT_CHECK(worker_verify(w, 0, &rolled));
  if (rolled) return NEWT_OK;
  NEWT_CHECK(worker_replicate(w));
  w->done_step = w->live_step; /* with its copies made: a rank lost before them costs this step */
  const newt_plan *p = &w->plan;
  int64_t tokens = res->tokens > 0 ? res->tokens : p->global_batch;
  double now = newt_now_s(), tps = w->t_last > 0 ? (double)tokens / (now - w->t_last) : 0;
  metrics_observe(w->metrics, "newt_worker_step_duration_seconds", NULL, w->t_last > 0 ? now - w->t_last : 0);
  metrics_set(w->metrics, "newt_worker_tokens_per_second", tps);
  metrics_set(w->metrics, "newt_worker_step", (double)w->live_step);
  if (res->lr > 0) metrics_set(w->metrics, "newt_worker_learning_rate", res->lr);
  if (res->grad_norm != 0) metrics_set(w->metrics, "newt_worker_grad_norm", res->grad_norm);
  if (!w->first_step_of_gen) follow_steps(w, now - w->t_last); /* a generation's first holds its restore */
  w->t_last = now;
  w->last_loss = res->loss;
  if (w->first_step_of_gen) {
    w->first_step_of_gen = 0;
    w->t_first_step = newt_wall_ms();
    worker_publish_ack(w, w->leave_announced ? NULL : "training");
  }
  if (w->me->rank == w->progress_rank) worker_publish_progress(w, res->loss, tps, tokens);
  newt_result_t cr = worker_ckpt_step(w);
  if (cr != NEWT_OK) /* a checkpoint that cannot start is reported, training goes on */
    NEWT_WARN(WORKER, "%s: checkpoint of step %lld: %s", w->id, (long long)w->live_step, newt_errmsg());
  job_step line = {.step = w->live_step, .loss = res->loss, .lr = res->lr, .grad_norm = res->grad_norm,
                   .tokens_per_s = tps, .world = p->nranks,
                   .dp = p->dp, .generation = p->generation, .t_ms = newt_wall_ms(), .ckpt = w->ckpt_published};
  worker_speed_line(&w->speed, &line); /* the speeds the progress record carries, for the report */
  log_step(w, w->me->rank == 0, &line);
  return NEWT_OK;
}

void worker_chaos_die(worker *w) {
  char point[16];
  unsigned long long gen = 0;
  if (!w->chaos_die[0] || sscanf(w->chaos_die, "%15[a-z]:%llu", point, &gen) != 2) return;
  if (strcmp(point, "restored") != 0 || gen != w->plan.generation) return;
  NEWT_WARN(WORKER, "%s: NEWT_CHAOS_DIE: killed right after the restore of generation %llu", w->id, gen);
  raise(SIGKILL);
}

newt_result_t worker_restored(worker *w) {
  w->t_restore = newt_wall_ms();
  /* the ranks of this generation hold the state from now on: named if it is ever lost */
  plan_free(&w->held_plan);
  if (plan_copy(&w->held_plan, &w->plan) != NEWT_OK) memset(&w->held_plan, 0, sizeof w->held_plan);
  /* a rank 0 killed right after a step may have taken that step's line with it, and the new
     rank 0 may not have done that step itself (its state came from a peer): every rank that
     did it and has not written it writes it (a line twice is harmless: readers keep one) */
  if (!w->last_step_logged && w->last_step.step == w->live_step && w->live_step > 0) log_step(w, 1, &w->last_step);
  NEWT_CHECK(worker_ckpt_generation(w));
  /* a restored state is checked at once: the generation's first verified copy. The parts are
     filled by now, and the program holds the state in what it declared: a check cut by a peer
     lost (the generation failed, not the job) does not undo that, so the restore says it is
     done, and the next newt_step_begin recovers from these parts. Said failed, a program
     would take its new buffers for empty and free them (the built-in trainer did), while
     newt read the next generation's restore from them: replicas that disagree, or garbage. */
  int rolled = 0;
  newt_result_t v = worker_verify(w, 1, &rolled);
  if (v != NEWT_OK && (w->failed || !generation_failed(w))) return v;
  if (v != NEWT_OK)
    NEWT_INFO(WORKER, "%s: generation %llu's check after its restore was cut (%s): the state is restored; the next "
              "step begin recovers", w->id, (unsigned long long)w->plan.generation, newt_errmsg());
  w->phase = PHASE_RUNNING;
  w->step = STEP_IDLE;
  w->first_step_of_gen = 1;
  w->t_last = newt_now_s();
  if (worker_speed_start(&w->speed, &w->plan, &w->spec) != NEWT_OK) /* measured for people and the leader: training goes on */
    NEWT_WARN(WORKER, "%s: %s", w->id, newt_errmsg());
  w->stall_ms = 0; /* the new communicators start at the cap; the next step sets the deadline */
  return NEWT_OK;
}
