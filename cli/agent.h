/* The node agent behind `newt worker --local-workers N`: one process per node (a pod that
 * holds all the node's GPUs) that runs N workers, worker i on device i, so the ranks of a
 * node see each other's GPUs (NVLink, P2P) instead of one container per GPU.
 *
 * It starts `newt worker <its own flags> --id <id>-<i> --device <device+i>` with
 * --port and --metrics-port shifted by i (0 stays 0) and a termination log of its own, with
 * LOCAL_RANK=i and LOCAL_WORLD_SIZE=N in its environment (as torchrun sets them), followed
 * by `-- COMMAND [ARGS...]` when it was given one (each child then execs the program in its
 * place, cli/program.h: the child's pid and exit status are the program's), and:
 *   - reaps every child, and every orphan too (it is a subreaper, and PID 1 in a container);
 *   - forwards SIGTERM/SIGINT to every child (a worker's graceful leave) and waits for them;
 *   - restarts a child that crashed (killed by a signal, exit 1, or 3 it was not asked for)
 *     under the same id, after 0.5 s doubling to 30 s, at most max_restarts times within
 *     restart_window_ms; a child that ends with the job (0), with the job's failure (4) or
 *     on a bad flag or spec (2) is not restarted;
 *   - with metrics ports, probes each child's /healthz every health_every_ms (on
 *     127.0.0.1 when --metrics-addr has it, else its first address) and kills (SIGKILL)
 *     a child that was unhealthy (503: a step stuck beyond the hang timeout) or silent (no
 *     answer within 3 s: stopped, wedged) AGENT_HEALTH_FAILS times in a row, which then
 *     restarts as a crash: a hung worker would otherwise keep its GPU for as long as the pod
 *     lives (the pod's liveness probe watches the first child only, and would restart them
 *     all); a child not listening yet (starting) is left alone;
 *   - holds the host's lease (docs/rendezvous.md, A lease per host): once the job's spec is
 *     in etcd it grants one lease of spec.fault.lease_ttl_ms, keeps it alive and writes its
 *     id to a file named to each child in NEWT_HOST_LEASE_FILE; a child registers on it
 *     (job_register_on: one etcd write, no grant of its own), so the host's loss (the
 *     agent's lease) removes all its workers at once. A child that ends has its
 *     registration deleted at once (guarded by the lease; a restart waits for that), and
 *     one stopped (SIGSTOP) for longer than the lease TTL too, as its own lease would have
 *     expired. When the lease is lost (etcd away past the TTL) the children go on with
 *     leases of their own and the agent grants a new one for the ones that start later; at
 *     its end it revokes the lease. Without etcd options (NULL) it holds none;
 *   - with two children or more, serves them a gateway (rendezvous/gateway.h) at a socket in
 *     its private directory, named to each child in NEWT_HOST_GATEWAY: a child's transactions
 *     on the host's lease (its registration, the rewrites that acknowledge a generation, its
 *     leave) go through it, and the agent sends those that come together as one (batch.h),
 *     so that the host's workers cost etcd one write where they cost one each; a child that
 *     cannot reach it writes to etcd itself;
 *   - exits once every child has ended, with the statuses of cli/ending.h: 4 when a child
 *     said the job failed, 2 on a bad flag or spec (the others are asked to leave), 1 when a
 *     child spent its restart budget (the others are asked to leave: the pod is replaced),
 *     0 when the job is done, 3 after SIGTERM; its termination message is the deciding
 *     child's, naming that child.
 * It logs one line per child start, exit and restart. */
#ifndef NEWT_CLI_AGENT_H
#define NEWT_CLI_AGENT_H

#include <stdint.h>

#include "rendezvous/etcd.h"

/* Probes in a row that find a child unhealthy or silent before it is killed. */
#define AGENT_HEALTH_FAILS 3

typedef struct cli_agent_opts {
  int n;                     /* local workers, >= 1 */
  const char *id;            /* child i is <id>-<i> */
  int device;                /* child i gets device + i */
  int port, metrics_port;    /* child i gets port + i, metrics_port + i (0: stays 0) */
  int max_restarts;          /* restarts of one child within the window (0: none) */
  int64_t health_every_ms;   /* /healthz probes of each child (0: none; needs metrics_port) */
  const char *metrics_addr;  /* the children's --metrics-addr (NULL: 127.0.0.1) */
  int64_t restart_window_ms;
  const char *term_log;      /* the agent's termination log (cli_termination_log) */
  int argc;                  /* the worker flags to pass on: those of the fields above */
  char **argv;               /* (and --local-workers, ...) are left out by the agent */
  char **command;            /* the program each child runs after `--` (NULL-terminated; NULL:
                                the built-in trainer) */
  const rdzv_etcd_opts *etcd; /* the job's etcd, for the host's lease (NULL: none) */
  const char *job;
} cli_agent_opts;

/* The flags the agent consumes or sets per child: not passed on as given. */
#define CLI_AGENT_OWN_FLAGS                                                                        \
  "local-workers", "max-restarts", "restart-window", "health-every-ms", "id", "device", "port",    \
      "metrics-port", "termination-log"

/* Runs the agent until every child has ended; returns the exit status (see above). */
int cli_agent_run(const cli_agent_opts *o);

#endif
