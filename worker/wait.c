/* Waiting for a plan (internal.h). Between generations a worker waits for a plan that names
 * it a rank, noticing meanwhile a leave asked for, the job's end marker and its failure, and
 * proving its links to the plan's ranks when it was left out (peers.c); a spare that holds
 * a state hands it over first when the leader names it a donor. A leaver hands its state
 * over the same way (worker_hand_over): it waits, bounded, for the plan that names it a
 * donor, builds that generation's communicator with its ranks and gives them the parts they
 * need (state.c), then goes. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "common/clock.h"
#include "common/log.h"
#include "job/plan.h"
#include "job/records.h"
#include "worker/internal.h"

/* A donor's generation: build the communicator with the ranks, hand them this worker's
 * state (the parts they need); then it leaves, or waits as a spare. */
void worker_donate_on(worker *w, newt_plan *p, comm_t *c, comm_t *parent) {
  const plan_rank *me = plan_find_donor(p, w->id);
  comm_t *none = NULL;
  w->gen = p->generation;
  newt_result_t r = c ? NEWT_OK : worker_build_comm(w, p, me, NULL, &c);
  if (r == NEWT_OK) r = comm_split(c, -1, me->rank, &none); /* the ranks' own group */
  if (r == NEWT_OK) r = worker_donate(w, c);
  if (r == NEWT_OK) NEWT_INFO(WORKER, "%s: handed over the state of step %lld", w->id, (long long)w->live_step);
  else NEWT_WARN(WORKER, "%s: handing over its state in generation %llu: %s", w->id, (unsigned long long)p->generation,
                 newt_errmsg());
  if (c) comm_free(c);
  comm_free(parent);
}

static void donate(worker *w, newt_plan *p) { worker_donate_on(w, p, NULL, NULL); }

/* A leaving rank hands its state to the next generation's ranks (they may hold no other
 * copy of its parts) before it goes: the leader names it a donor of the plan without it.
 * A worker the latest plan does not name a rank (a spare) holds nothing anyone needs. */
void worker_hand_over(worker *w) {
  pthread_mutex_lock(&w->mu);
  int ranked = plan_find(&w->latest, w->id) != NULL;
  int donor = w->latest.generation > w->gen && plan_find_donor(&w->latest, w->id) != NULL;
  pthread_mutex_unlock(&w->mu);
  if (!w->has_state || (!ranked && !donor)) return;
  if (!w->leave_announced) { /* it left between steps: say so, the leader plans without it */
    w->leave_announced = 1;
    worker_set_state_async(w, "leaving");
  }
  newt_plan p;
  wait_outcome wo;
  if (worker_wait_plan(w, 1, NEWT_DEADLINE_NONE, &p, &wo) != NEWT_OK || wo != WAIT_PLAN) {
    NEWT_WARN(WORKER, "%s: no plan took over its state of step %lld", w->id, (long long)w->live_step);
    return;
  }
  donate(w, &p);
  plan_free(&p);
}

/* Waits for a plan newer than our generation in which we are a rank (donor: a donor);
 * meanwhile notices a leave asked for and the end of the job. A rank gives up (WAIT_LEAVE) at
 * until, a donor at its own bound. */
newt_result_t worker_wait_plan(worker *w, int donor, newt_deadline_t until, newt_plan *out, wait_outcome *how) {
  uint64_t spare_gen = 0;
  uint64_t next_done_check = 0;
  links_proof links = {0};
  /* a leaver waits (bounded: it must exit well within a pod's grace period) for the plan
     that names it a donor; the leader publishes it within milliseconds, or after a
     leadership change within a lease TTL */
  int64_t donor_wait = 3 * w->spec.lease_ttl_ms + 5000;
  if (donor_wait > 10000) donor_wait = 10000;
  newt_deadline_t give_up = donor ? newt_deadline_in_ms(donor_wait) : until;
  int64_t recheck_ms = donor ? -1 : worker_recheck(w); /* the last crash report's next look */
  for (;;) {
    if ((!donor && worker_stop_asked(w)) || newt_deadline_passed(give_up)) {
      *how = WAIT_LEAVE;
      return NEWT_OK;
    }
    pthread_mutex_lock(&w->mu);
    if (w->latest.generation > w->gen) {
      const plan_rank *me = donor ? plan_find_donor(&w->latest, w->id) : plan_find(&w->latest, w->id);
      if (me) {
        newt_result_t r = plan_copy(out, &w->latest);
        pthread_mutex_unlock(&w->mu);
        NEWT_CHECK(r);
        if (!donor) atomic_store(&w->renewed, 0); /* taken in: nothing to prove any more */
        *how = WAIT_PLAN;
        return NEWT_OK;
      }
      if (!donor && spare_gen != w->latest.generation) {
        spare_gen = w->latest.generation;
        /* a spare of this plan that was a rank of the last one: it hands the ranks what
           they need of its state first (the leader named it a donor) */
        newt_plan give;
        int donates = w->has_state && plan_find_donor(&w->latest, w->id) && plan_copy(&give, &w->latest) == NEWT_OK;
        pthread_mutex_unlock(&w->mu);
        worker_set_state_async(w, "spare");
        worker_label_metrics(w, -1);
        if (donates) {
          donate(w, &give);
          plan_free(&give);
        }
        continue;
      }
    }
    worker_wait_cv(w, recheck_ms >= 0 && recheck_ms < 50 ? (int)recheck_ms : 50);
    pthread_mutex_unlock(&w->mu);
    if (!donor) worker_prove_links(w, &links);
    if (recheck_ms >= 0) recheck_ms = worker_recheck(w);
    uint64_t now = newt_wall_ms();
    if (now >= next_done_check) {
      next_done_check = now + 500;
      if (job_done_get(w->etcd, w->o.job, &w->spec, &w->auth, &w->end_marker)) {
        w->have_end_marker = 1;
        *how = WAIT_DONE;
        return NEWT_OK;
      }
      job_failed f;
      if (!donor && job_has_failed(w->etcd, w->o.job, &f)) {
        w->failed = 1;
        snprintf(w->failed_why, sizeof w->failed_why, "%s", f.why);
        *how = WAIT_FAILED;
        return NEWT_OK;
      }
    }
  }
}
