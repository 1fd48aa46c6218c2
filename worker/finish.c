/* Finishing (internal.h): how a worker's part ended (done, left out, left, failed) said as
 * its termination message and exit status (job/ending.h), its registration's last state
 * written and the registration left, then everything the worker holds released. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/secret.h"
#include "job/ending.h"
#include "job/plan.h"
#include "rendezvous/gateway.h"
#include "rendezvous/rdzv.h"
#include "worker/internal.h"

static void teardown(worker *w) {
  worker_ckpt_free(w);
  worker_publisher_stop(w);
  worker_unwatch_plan(w);
  rdzv_registration_free(w->reg);
  rdzv_gateway_client_free(w->gateway); /* after the registration that used it */
  w->gateway = NULL;
  if (w->all) worker_end_generation(w);
  plan_free(&w->latest);
  plan_free(&w->plan);
  plan_free(&w->held_plan);
  worker_speed_free(&w->speed);
  worker_recheck_free(w);
  worker_state_free(w);
  for (newt_comm *h = w->comms, *nx; h; h = nx) {
    nx = h->next;
    h->magic = 0;
    free(h);
  }
  if (w->sample_log) fclose(w->sample_log);
  if (w->step_log_fd >= 0) close(w->step_log_fd);
  if (w->listen_fd > 0) close(w->listen_fd);
  newt_secret_free(w->job_secret, w->job_secret_len);
  memset(&w->auth, 0, sizeof w->auth);
  memset(&w->ckpt_key, 0, sizeof w->ckpt_key);
  free(w->spec_json);
  rdzv_etcd_free(w->etcd);
  metrics_stop(w->metrics); /* after the client whose requests it counts */
}

/* The job is done. A rank that trained its last step says so with the job's loss (every rank
 * has the same: the commit's sums); a worker that learned of the end from the end marker
 * speaks only for itself: left out after the steps it trained (JOB_EXIT_LEFT_OUT), or a spare
 * that trained none, with the job's end as the marker says. */
static void ended_done(worker *w, job_end *e) {
  const job_done *m = &w->end_marker;
  if (w->trained_last) {
    e->status = JOB_EXIT_DONE;
    snprintf(e->msg, sizeof e->msg, "done: job %s trained its %lld steps (final loss %.4f)", w->o.job,
             (long long)w->spec.steps, w->last_loss);
  } else if (w->done_step > 0 || w->held_plan.generation > 0) {
    e->status = JOB_EXIT_LEFT_OUT;
    snprintf(e->msg, sizeof e->msg,
             "left out: %s trained up to step %lld (generation %llu) and was left out; the job went on without it "
             "and is done: %lld steps, final loss %.4f (its end marker)", w->id, (long long)w->done_step,
             (unsigned long long)w->held_plan.generation, (long long)m->step, m->loss);
  } else {
    e->status = JOB_EXIT_DONE;
    snprintf(e->msg, sizeof e->msg, "done: job %s is done: %lld steps, final loss %.4f (its end marker); %s waited as a "
             "spare and trained none of them", w->o.job, (long long)m->step, m->loss, w->id);
  }
}

int worker_finish(worker *w, newt_result_t r) {
  job_end *e = &w->end;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", newt_errmsg()); /* the program's error, kept across teardown */
  if (w->failed) { /* the job failed: whatever the program made of it (a restore that found the
                       state lost returned an error), that is how this worker ends */
    r = NEWT_OK;
    e->status = JOB_EXIT_FAILED;
    snprintf(e->msg, sizeof e->msg, "failed: %s", w->failed_why);
  } else if (r == NEWT_OK && w->phase == PHASE_OVER) {
    if (w->over == NEWT_NEXT_FAILED) {
      e->status = JOB_EXIT_FAILED;
      snprintf(e->msg, sizeof e->msg, "failed: %s", w->failed_why);
    } else if (w->over == NEWT_NEXT_LEFT) {
      e->status = JOB_EXIT_LEFT;
      snprintf(e->msg, sizeof e->msg, "left: after step %lld of %lld; the job goes on without %s",
               (long long)w->live_step, (long long)w->spec.steps, w->id);
    } else {
      ended_done(w, e);
    }
  } else if (r == NEWT_OK) { /* finished before its part was over: as a leave */
    e->status = JOB_EXIT_LEFT;
    snprintf(e->msg, sizeof e->msg, "left: the program finished after step %lld of %lld", (long long)w->live_step,
             (long long)w->spec.steps);
  }
  if (w->reg && !rdzv_registration_lost(w->reg, NULL, 0)) {
    const char *state = r != NEWT_OK || e->status == JOB_EXIT_FAILED                 ? "failed"
                        : e->status == JOB_EXIT_DONE || e->status == JOB_EXIT_LEFT_OUT ? "done"
                                                                                       : "left";
    worker_set_state_async(w, state);
    worker_publisher_stop(w);
    if (rdzv_registration_leave(w->reg, job_call_deadline()) != NEWT_OK)
      NEWT_WARN(WORKER, "%s: leaving: %s", w->id, newt_errmsg());
  }
  char who[96]; /* no id yet: a join refused before it had one */
  snprintf(who, sizeof who, "newt worker%s%s", w->id[0] ? " " : "", w->id);
  const char *path = job_termination_log(w->o.termination_log);
  teardown(w);
  if (r != NEWT_OK) (void)NEWT_ERR(r, "%s", msg);
  int status = job_end_write(who, r, e, path);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  worker_mem_release(&w->o.memory);
  free(w->strings);
  free(w);
  return status;
}
