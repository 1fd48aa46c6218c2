/* For newt's own clients only (gpt/worker.c, cli/restart.c), beside newt.h: the communicator
 * behind a public group handle, so that the trainer's collectives (model/, over comm/) go to
 * it with no layer between (NULL for a group of a generation that ended); and the end of a
 * job in the restart mode, which ends when its programs did, not at its last step. */
#ifndef NEWT_WORKER_BRIDGE_H
#define NEWT_WORKER_BRIDGE_H

#include "comm/comm.h"
#include "newt.h"

comm_t *worker_comm_of(newt_comm *c);

/* The restart mode's end (spec.restart; cli/restart.c): the job ends done at the step just
 * ended. Every rank calls it after the newt_step_end of the same step (the step's sums said
 * every program exited 0); the next newt_step_begin marks the job done at that step and says
 * NEXT_DONE. NEWT_ERR_INVALID in a job of another mode, or anywhere but after newt_step_end. */
newt_result_t worker_end_job_now(newt_ctx *c);

/* The restart mode's failure budget spent (cli/restart.c): the job fails, `why` its reason
 * (every rank calls it at the same step; the leader fails the job on their reports, as on a
 * lost state's). The next newt_step_begin says NEXT_FAILED. */
newt_result_t worker_fail_job(newt_ctx *c, const char *why);

#endif
