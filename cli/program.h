/* The program a worker runs: `newt worker [flags] -- COMMAND [ARGS...]` sets the environment
 * below from its flags and execs COMMAND, a training program built on libnewt, which
 * replaces it (the same pid: SIGTERM, the node agent's restarts and Kubernetes' exit
 * statuses reach the program itself). The program reads its configuration from these
 * variables; a flag wins over an inherited value (each flag's fallback is its variable),
 * and everything else of the environment is inherited as it is.
 *
 *   variable                  value
 *   NEWT_ETCD                 --etcd (always: the default endpoints when none is given)
 *   NEWT_ETCD_USER, NEWT_ETCD_PASSWORD_FILE, NEWT_ETCD_CA, NEWT_ETCD_CERT, NEWT_ETCD_KEY
 *                             the flags of the same names, those that are set
 *   NEWT_JOB                  --job
 *   NEWT_WORKER_ID            --id, else host-pid as newt worker makes it (the pid is the
 *                             program's: it is computed before the exec)
 *   NEWT_HOST                 --host, else the host name
 *   NEWT_DOMAIN               --domain, when given (else the library takes the host)
 *   NEWT_ADDR                 --addr, when given (or POD_IP)
 *   NEWT_PORT                 --port, the data plane's (0: any free port)
 *   NEWT_DEVICE               --device (-1: the CPU)
 *   NEWT_SHARE_DEVICE         1, only with --share-device
 *   NEWT_THREADS              --threads
 *   NEWT_STEP_LOG             --step-log, when given
 *   NEWT_JOB_SECRET_FILE      --job-secret-file, when given
 *   NEWT_METRICS_PORT         --metrics-port (0: off)
 *   NEWT_METRICS_ADDR         --metrics-addr
 *   NEWT_TERMINATION_LOG      the file for the termination message (cli_termination_log:
 *                             --termination-log, an inherited value, else
 *                             /dev/termination-log when it exists; unset otherwise)
 *   LOCAL_RANK                as torchrun sets it, the worker's slot on this host: kept when
 *                             inherited (the node agent, newt run), else 0
 *   LOCAL_WORLD_SIZE          the slots of this host: kept when inherited, else 1
 *
 * RANK and WORLD_SIZE are not set: in an elastic job they change without a restart (every
 * new plan can renumber the ranks and resize the world), so a value fixed at exec time
 * would soon be wrong; the program asks the library for the plan in force. */
#ifndef NEWT_CLI_PROGRAM_H
#define NEWT_CLI_PROGRAM_H

#include <stdint.h>

#include "cli/etcd_flags.h"
#include "common/err.h"

typedef struct cli_program {
  const cli_etcd_flags *etcd;
  const char *id;           /* NULL or "": host-pid */
  const char *host;         /* NULL or "": the host name */
  const char *domain;       /* the failure domain; NULL or "": not set (the host) */
  const char *addr;         /* NULL or "": not set */
  int64_t port, device, threads, metrics_port;
  int share_device;
  const char *step_log;     /* NULL: not set */
  const char *secret_file;  /* NULL: not set */
  const char *metrics_addr;
  const char *term_log;     /* the --termination-log flag (NULL: none) */
} cli_program;

/* The worker id the program gets: p->id, else host-pid (of this process, which the exec
 * keeps), into out. */
void cli_program_id(const cli_program *p, char *out, size_t cap);

/* Sets the variables above in this process's environment. */
newt_result_t cli_program_env(const cli_program *p);

/* Execs command (NULL-terminated, command[0] looked up in PATH) in place of this process,
 * with the signal dispositions newt changed put back; returns only when it cannot, with
 * NEWT_ERR_INVALID naming the command and why (a usage error: exit 2, not restarted), or
 * NEWT_ERR_ABORTED when a stop signal came before it (*sig: which). */
newt_result_t cli_program_exec(char *const *command, int *sig);

/* Whether command[0] can be run, before anything is started for it (newt run -- COMMAND): a
 * name with a '/' is an executable file; a bare name one found in PATH, as execvp finds it.
 * NEWT_ERR_INVALID naming the command and why, in cli_program_exec's words. */
newt_result_t cli_program_check(char *const *command);

#endif
