/* newt coordinator: campaigns for leadership; the leader turns membership into plans,
 * detects failures and records events; every coordinator serves Prometheus metrics (the
 * leader's are the job's) and /healthz. Exit status and termination message: cli/ending.h. */
#include <stdio.h>
#include <stdlib.h>

#include "cli/cmds.h"
#include "cli/ending.h"
#include "cli/etcd_flags.h"
#include "common/log.h"
#include "common/opts.h"
#include "coordinator/coordinator.h"

int newt_cmd_coordinator(int argc, char **argv) {
  newt_log_set_default_level(NEWT_LOG_INFO); /* lifecycle lines: plan, joined, left, done */
  cli_etcd_flags ef;
  cli_etcd_flags_init(&ef);
  const char *id = getenv("NEWT_COORDINATOR_ID") ? getenv("NEWT_COORDINATOR_ID") : getenv("POD_NAME");
  const char *spec = getenv("NEWT_SPEC_FILE");
  const char *metrics_addr = getenv("NEWT_METRICS_ADDR") ? getenv("NEWT_METRICS_ADDR") : "127.0.0.1";
  const char *term_log = NULL, *event_log = getenv("NEWT_EVENT_LOG");
  int64_t metrics_port = 9400, linger_ms = 0;
  newt_opt opts[] = {CLI_ETCD_OPTS(&ef),
                     {"id", NEWT_OPT_STR, &id, "coordinator id (env NEWT_COORDINATOR_ID, POD_NAME; default host-pid)"},
                     {"spec", NEWT_OPT_STR, &spec, "job spec file, stored in etcd when the job has none (env NEWT_SPEC_FILE)"},
                     {"metrics-port", NEWT_OPT_INT, &metrics_port, "Prometheus metrics and /healthz port (0: off)"},
                     {"metrics-addr", NEWT_OPT_STR, &metrics_addr,
                      "addresses the metrics server binds, comma-separated (env NEWT_METRICS_ADDR; the chart: the pod IP and 127.0.0.1)"},
                     {"metrics-linger-ms", NEWT_OPT_INT, &linger_ms,
                      "after the job's end, serve the final metrics this long before exiting, so that Prometheus "
                      "sees the end (the chart: two scrape intervals)"},
                     {"event-log", NEWT_OPT_STR, &event_log,
                      "append every event the leader posts to this file too, for newt report (env NEWT_EVENT_LOG; "
                      "the chart: runs/<job>/events.jsonl on the checkpoint volume)"},
                     {"termination-log", NEWT_OPT_STR, &term_log,
                      "file for the termination message (env NEWT_TERMINATION_LOG; default /dev/termination-log when it exists)"},
                     NEWT_OPT_END};
  int rc = newt_opts_exit(newt_opts_parse("coordinator", "--job NAME [flags]", opts, argc, argv, NULL, 0, NULL));
  if (rc >= 0) return rc;
  job_end end = {.status = JOB_EXIT_DONE};
  coordinator_opts co = {.job = ef.job, .id = id, .spec_file = spec, .metrics_addr = metrics_addr,
                         .metrics_port = (int)metrics_port, .metrics_linger_ms = (int)linger_ms, .end = &end,
                         .event_log = event_log};
  char *password = NULL;
  newt_result_t r = cli_etcd_opts(&ef, &co.etcd, &password);
  if (r == NEWT_OK && (linger_ms < 0 || linger_ms > 3600000))
    r = NEWT_ERR(NEWT_ERR_INVALID, "--metrics-linger-ms must be 0..3600000");
  if (r != NEWT_OK || metrics_port < 0 || metrics_port > 65535) {
    fprintf(stderr, "newt coordinator: %s\n", r != NEWT_OK ? newt_errmsg() : "--metrics-port must be 0..65535");
    free(password);
    return 2;
  }
  r = coordinator_run(&co);
  free(password);
  return cli_end("coordinator", r, &end, cli_termination_log(term_log));
}
