/* How a process of a job ends: the exit status and the termination message of
 * job/records.h (JOB_EXIT_*), written to the termination log that Kubernetes shows
 * (`kubectl describe pod`, .status.containerStatuses[].state.terminated.message). `newt
 * coordinator`, `newt worker` and a program on libnewt (newt_finish) end this way. */
#ifndef NEWT_JOB_ENDING_H
#define NEWT_JOB_ENDING_H

#include "common/err.h"
#include "job/records.h"

/* The default termination log: where Kubernetes mounts it. Written only when it exists
 * (a container); a path given with --termination-log or NEWT_TERMINATION_LOG is created. */
#define JOB_TERMINATION_LOG "/dev/termination-log"

/* The termination log to use: flag, else NEWT_TERMINATION_LOG, else the default. */
const char *job_termination_log(const char *flag);

/* The exit status of a process that stops on error r: JOB_EXIT_USAGE for what another
 * try will not mend (NEWT_ERR_INVALID, NEWT_ERR_UNSUPPORTED), else JOB_EXIT_ERROR. */
int job_exit_status(newt_result_t r);

/* Ends a process: r is what its run returned (an error overrides e), e how it ended. Writes
 * the message to path (see above) and returns the exit status; `who` names the process in
 * the line printed on an error ("newt worker"). */
int job_end_write(const char *who, newt_result_t r, job_end *e, const char *path);

#endif
