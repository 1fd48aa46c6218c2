/* newt coordinator: campaigns for leadership; the leader turns membership into plans,
 * detects failures and records events; every coordinator serves Prometheus metrics (the
 * leader's are the job's) and /healthz. Exit status and termination message: cli/ending.h.
 *
 * A spec file (--spec) is checked before anything else (gpt_start_check): its rules, its JSON
 * read back, and with --trainer builtin the built-in trainer's model and layout; not the
 * files it names, which are the workers' (the coordinator's host need not see them). A bad
 * one exits 2 naming the file, the field and the value, before etcd is asked anything. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmds.h"
#include "cli/ending.h"
#include "cli/etcd_flags.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/opts.h"
#include "coordinator/coordinator.h"
#include "gpt/gpt.h"

/* The spec file, checked as gpt_start_check does before a job starts (see above). */
static newt_result_t check_spec(const char *file, const char *job, int builtin) {
  unsigned what = GPT_CHECK_SPEC | (builtin ? GPT_CHECK_TRAINER : 0);
  char *text = NULL;
  size_t len = 0;
  newt_spec s;
  newt_result_t r = newt_fs_read_all(file, 1 << 20, &text, &len);
  if (r == NEWT_OK) r = spec_from_json(text, len, &s);
  free(text);
  if (r == NEWT_OK && strcmp(s.job, job) != 0)
    r = NEWT_ERR(NEWT_ERR_INVALID, "spec.job is \"%s\" but this is job \"%s\"", s.job, job);
  if (r == NEWT_OK) r = gpt_start_check(&s, what);
  return r == NEWT_OK ? r : newt_err_wrap(NEWT_ERR_INVALID, "%s: ", file);
}

int newt_cmd_coordinator(int argc, char **argv) {
  newt_log_set_default_level(NEWT_LOG_INFO); /* lifecycle lines: plan, joined, left, done */
  cli_etcd_flags ef;
  cli_etcd_flags_init(&ef);
  const char *id = getenv("NEWT_COORDINATOR_ID") ? getenv("NEWT_COORDINATOR_ID") : getenv("POD_NAME");
  const char *spec = getenv("NEWT_SPEC_FILE");
  const char *metrics_addr = getenv("NEWT_METRICS_ADDR") ? getenv("NEWT_METRICS_ADDR") : "127.0.0.1";
  const char *term_log = NULL, *event_log = getenv("NEWT_EVENT_LOG"), *secret_file = getenv("NEWT_JOB_SECRET_FILE");
  const char *trainer = getenv("NEWT_TRAINER") && *getenv("NEWT_TRAINER") ? getenv("NEWT_TRAINER") : "builtin";
  int64_t metrics_port = 9400, linger_ms = 0;
  newt_opt opts[] = {CLI_ETCD_OPTS(&ef),
                     {"id", NEWT_OPT_STR, &id, "coordinator id (env NEWT_COORDINATOR_ID, POD_NAME; default host-pid)"},
                     {"spec", NEWT_OPT_STR, &spec, "job spec file, stored in etcd when the job has none (env NEWT_SPEC_FILE)"},
                     {"trainer", NEWT_OPT_STR, &trainer,
                      "what the workers run: builtin (newt's GPT: the spec's model and layout are checked at the start) "
                      "or program (one's own, newt worker -- COMMAND: they are the program's) (env NEWT_TRAINER)"},
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
                     {"job-secret-file", NEWT_OPT_STR, &secret_file,
                      "the job secret the workers hold (env NEWT_JOB_SECRET_FILE): a rank's report, acknowledgement or "
                      "end marker counts only when it proves it"},
                     NEWT_OPT_END};
  int rc = newt_opts_exit(newt_opts_parse("coordinator", "--job NAME [flags]", opts, argc, argv, NULL, 0, NULL));
  if (rc >= 0) return rc;
  job_end end = {.status = JOB_EXIT_DONE};
  coordinator_opts co = {.job = ef.job, .id = id, .spec_file = spec, .metrics_addr = metrics_addr,
                         .metrics_port = (int)metrics_port, .metrics_linger_ms = (int)linger_ms, .end = &end,
                         .event_log = event_log, .secret_file = secret_file};
  char *password = NULL;
  newt_result_t r = cli_etcd_opts(&ef, &co.etcd, &password);
  if (r == NEWT_OK && (linger_ms < 0 || linger_ms > 3600000))
    r = NEWT_ERR(NEWT_ERR_INVALID, "--metrics-linger-ms must be 0..3600000");
  if (r != NEWT_OK || metrics_port < 0 || metrics_port > 65535) {
    fprintf(stderr, "newt coordinator: %s\n", r != NEWT_OK ? newt_errmsg() : "--metrics-port must be 0..65535");
    free(password);
    return 2;
  }
  int builtin = strcmp(trainer, "builtin") == 0;
  if (!builtin && strcmp(trainer, "program") != 0) {
    fprintf(stderr, "newt coordinator: --trainer: builtin or program, got \"%s\"\n", trainer);
    free(password);
    return 2;
  }
  if (spec && check_spec(spec, ef.job, builtin) != NEWT_OK) {
    free(password);
    return cli_end("coordinator", NEWT_ERR_INVALID, &end, cli_termination_log(term_log));
  }
  r = coordinator_run(&co);
  free(password);
  return cli_end("coordinator", r, &end, cli_termination_log(term_log));
}
