/* The restart mode: `newt worker --restart -- COMMAND [ARGS...]` supervises COMMAND, a
 * program that does not link newt (a script torchrun would launch), as one worker of a job
 * whose spec says restart (docs/elastic.md, "Scripts that do not link newt").
 *
 * The supervisor is a libnewt program (newt.h, and worker/bridge.h for the job's end): the
 * job's steps are its beats. At each generation it ends its program, agrees with the other
 * supervisors on the new world (rank 0's address and a fresh port, the restart count, the
 * hosts) and starts the program again with the environment torchrun gives; at each beat it
 * says whether its program progressed, exited or stopped, and every supervisor, seeing the
 * same sums, acts alike: a program failed or stopped, or none progressed for
 * spec.fault.hang_timeout_ms, restarts them all; all exited 0 ends the job done. A
 * supervisor killed, stopped or asked to leave is newt's own fault and changes the world. */
#ifndef NEWT_CLI_RESTART_H
#define NEWT_CLI_RESTART_H

#include "newt.h"

typedef struct cli_restart_opts {
  const newt_join_opts *join; /* the worker's options (its step log given here, not there) */
  char *const *command;       /* COMMAND ARGS..., NULL-terminated */
  const char *step_log;       /* while rank 0, the program's step lines are appended here (NULL: none) */
  const char *addr;           /* this worker's address (MASTER_ADDR when it is rank 0); NULL: 127.0.0.1 */
  int threads;                /* OMP_NUM_THREADS of the program, unless the environment sets it */
} cli_restart_opts;

/* Runs the supervisor to the job's end; the exit status of newt worker (cli/ending.h). */
int cli_restart_run(const cli_restart_opts *o);

#endif
