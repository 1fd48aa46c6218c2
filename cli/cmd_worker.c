/* newt worker: one training process. Registers with etcd, follows the leader's plans,
 * rebuilds its communicator on each, restores state, trains, and leaves gracefully on
 * SIGTERM. --step-log FILE: while it is rank 0, it appends a line per step to FILE (the
 * step log, job/runlog.h). --metrics-port: its own metrics and /healthz. Exit status and
 * termination message: cli/ending.h. --local-workers N: the node agent of cli/agent.h,
 * which runs N such workers (one per GPU of the node) and restarts the ones that crash. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cli/agent.h"
#include "cli/cmds.h"
#include "cli/ending.h"
#include "cli/etcd_flags.h"
#include "common/log.h"
#include "common/opts.h"
#include "common/sys.h"
#include "gpt/gpt.h"
#include "rendezvous/rdzv.h"

int newt_cmd_worker(int argc, char **argv) {
  newt_log_set_default_level(NEWT_LOG_INFO); /* lifecycle lines: plan, joined, left, done */
  cli_etcd_flags ef;
  cli_etcd_flags_init(&ef);
  const char *id = getenv("NEWT_WORKER_ID") ? getenv("NEWT_WORKER_ID") : getenv("POD_NAME");
  const char *host = getenv("NEWT_HOST");
  const char *addr = getenv("NEWT_ADDR") ? getenv("NEWT_ADDR") : getenv("POD_IP");
  const char *step_log = NULL, *term_log = NULL, *secret_file = getenv("NEWT_JOB_SECRET_FILE");
  const char *metrics_addr = getenv("NEWT_METRICS_ADDR") ? getenv("NEWT_METRICS_ADDR") : "127.0.0.1";
  int64_t metrics_port = 0;
  int64_t port = 0, device = -1, threads = 1;
  int64_t local_workers = 0, max_restarts = 5, restart_window = 600, health_every = 5000;
  int share_device = 0;
  if (getenv("NEWT_DEVICE")) device = atoi(getenv("NEWT_DEVICE"));
  newt_opt opts[] = {CLI_ETCD_OPTS(&ef),
                     {"id", NEWT_OPT_STR, &id, "worker id, unique in the job (env NEWT_WORKER_ID, POD_NAME; default host-pid)"},
                     {"host", NEWT_OPT_STR, &host, "host identity: workers on one host share memory (env NEWT_HOST; default hostname)"},
                     {"addr", NEWT_OPT_STR, &addr, "address peers reach this worker at (env NEWT_ADDR, POD_IP; default 127.0.0.1)"},
                     {"port", NEWT_OPT_INT, &port, "data-plane port (0: any free port)"},
                     {"device", NEWT_OPT_INT, &device, "CUDA device (-1: train on CPU) (env NEWT_DEVICE)"},
                     {"share-device", NEWT_OPT_FLAG, &share_device,
                      "other workers with --share-device may train on this GPU too (each its own NCCL host: "
                      "NCCL_HOSTID, set when unset; docs/elastic.md, GPU workers on one host)"},
                     {"threads", NEWT_OPT_INT, &threads, "CPU threads for compute"},
                     {"step-log", NEWT_OPT_STR, &step_log, "while rank 0, append one JSON line per step to FILE (docs/elastic.md)"},
                     {"job-secret-file", NEWT_OPT_STR, &secret_file,
                      "the job's secret, the data plane's keys come from it (env NEWT_JOB_SECRET_FILE; docs/elastic.md)"},
                     {"metrics-port", NEWT_OPT_INT, &metrics_port, "port of this worker's metrics and /healthz (0: off)"},
                     {"metrics-addr", NEWT_OPT_STR, &metrics_addr,
                      "addresses the metrics server binds, comma-separated (env NEWT_METRICS_ADDR)"},
                     {"termination-log", NEWT_OPT_STR, &term_log,
                      "file for the termination message (env NEWT_TERMINATION_LOG; default /dev/termination-log when it exists)"},
                     {"local-workers", NEWT_OPT_INT, &local_workers,
                      "run N workers, worker i as --id ID-i --device DEVICE+i --port PORT+i --metrics-port METRICS-PORT+i, "
                      "restarting the ones that crash (the node agent: docs/kubernetes.md, GPU nodes; 0: be one worker)"},
                     {"max-restarts", NEWT_OPT_INT, &max_restarts,
                      "with --local-workers: restarts of one worker within --restart-window before the agent gives up"},
                     {"restart-window", NEWT_OPT_INT, &restart_window, "with --local-workers: the window of --max-restarts, seconds"},
                     {"health-every-ms", NEWT_OPT_INT, &health_every,
                      "with --local-workers and --metrics-port: probe each worker's /healthz this often; one failing "
                      "3 probes in a row is killed and restarts (0: no probes)"},
                     NEWT_OPT_END};
  int rc = newt_opts_exit(newt_opts_parse("worker", "--job NAME [flags]", opts, argc, argv, NULL, 0, NULL));
  if (rc >= 0) return rc;
  rdzv_etcd_opts eo;
  char *password = NULL;
  newt_result_t r = cli_etcd_opts(&ef, &eo, &password);
  if (r != NEWT_OK) {
    fprintf(stderr, "newt worker: %s\n", newt_errmsg());
    return 2;
  }
  if (port < 0 || port > 65535 || threads < 0 || metrics_port < 0 || metrics_port > 65535) {
    fprintf(stderr, "newt worker: --port and --metrics-port must be 0..65535 and --threads >= 0\n");
    free(password);
    return 2;
  }
  if (local_workers < 0 || local_workers > 64 || max_restarts < 0 || max_restarts > 1000 || restart_window < 1 ||
      health_every < 0 || health_every > 3600000) {
    fprintf(stderr, "newt worker: --local-workers must be 0..64, --max-restarts 0..1000, --restart-window >= 1 and "
                    "--health-every-ms 0..3600000\n");
    free(password);
    return 2;
  }
  if (local_workers > 0) {
    free(password); /* read to check it; the workers read it themselves */
    if (port > 0 && port + local_workers - 1 > 65535) {
      fprintf(stderr, "newt worker: --port %lld + --local-workers %lld goes beyond port 65535\n", (long long)port,
              (long long)local_workers);
      return 2;
    }
    if (metrics_port > 0 && metrics_port + local_workers - 1 > 65535) {
      fprintf(stderr, "newt worker: --metrics-port %lld + --local-workers %lld goes beyond port 65535\n",
              (long long)metrics_port, (long long)local_workers);
      return 2;
    }
    /* the ids stay the same across a worker's restarts: the agent's own id, suffixed */
    char own_id[64];
    if (id && *id) snprintf(own_id, sizeof own_id, "%s", id);
    else snprintf(own_id, sizeof own_id, "%.40s-%d", host && *host ? host : newt_hostname(), (int)getpid());
    char first[96];
    snprintf(first, sizeof first, "%s-%lld", own_id, (long long)local_workers - 1);
    if (rdzv_check_name("--id", first) != NEWT_OK) {
      fprintf(stderr, "newt worker: %s (with --local-workers the ids are ID-0 ... ID-%lld)\n", newt_errmsg(),
              (long long)local_workers - 1);
      return 2;
    }
    cli_agent_opts ao = {.n = (int)local_workers, .id = own_id, .device = device >= 0 ? (int)device : 0,
                         .port = (int)port, .metrics_port = (int)metrics_port, .max_restarts = (int)max_restarts,
                         .restart_window_ms = restart_window * 1000, .health_every_ms = health_every,
                         .metrics_addr = metrics_addr, .term_log = cli_termination_log(term_log),
                         .argc = argc, .argv = argv};
    return cli_agent_run(&ao);
  }
  free(password); /* libnewt reads the file itself */
  newt_join_opts jo;
  newt_join_opts_init(&jo);
  jo.etcd = ef.endpoints;
  jo.etcd_user = ef.user;
  jo.etcd_password_file = ef.password_file;
  jo.etcd_ca = ef.ca;
  jo.etcd_cert = ef.cert;
  jo.etcd_key = ef.key;
  jo.job = ef.job;
  jo.worker_id = id;
  jo.host = host;
  jo.addr = addr;
  jo.port = (int)port;
  jo.device = (int)device;
  jo.share_device = share_device;
  jo.step_log = step_log;
  jo.job_secret_file = secret_file;
  jo.metrics_addr = metrics_addr;
  jo.metrics_port = (int)metrics_port;
  jo.termination_log = cli_termination_log(term_log);
  jo.handle_signals = 1;
  return gpt_worker_run(&jo, (int)threads);
}
