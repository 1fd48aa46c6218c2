/* How `newt coordinator` and `newt worker` end: the exit status and the termination message
 * of job/records.h (JOB_EXIT_*), written to the termination log that Kubernetes shows
 * (`kubectl describe pod`, .status.containerStatuses[].state.terminated.message). */
#ifndef NEWT_CLI_ENDING_H
#define NEWT_CLI_ENDING_H

#include "common/err.h"
#include "job/ending.h"
#include "job/records.h"

/* The default termination log: where Kubernetes mounts it. Written only when it exists
 * (a container); a path given with --termination-log or NEWT_TERMINATION_LOG is created. */
#define CLI_TERMINATION_LOG JOB_TERMINATION_LOG

/* The termination log to use: flag, else NEWT_TERMINATION_LOG, else the default. */
const char *cli_termination_log(const char *flag);

/* Ends a service: r is what its run returned (an error overrides e), e how it ended. Writes
 * the message to path (see above) and returns the exit status. */
int cli_end(const char *cmd, newt_result_t r, job_end *e, const char *path);

#endif
