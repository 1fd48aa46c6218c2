/* newt report: a run as one self-contained HTML page (cli/report.h): the loss curve with
 * each recovery marked (and a reference run drawn on top with --baseline), the membership
 * timeline, where each recovery's time went, throughput and checkpoints, the ranks' speeds
 * (where the step log has them), and a table of the recoveries.
 *
 * What it reads: the log directory of `newt run` (summary.json, steps.jsonl, events.jsonl),
 * or a summary (whose step_log / event_log / log_dir name the rest), or a job's own step and
 * event logs (the chart writes them to the checkpoint volume: runs/<job>/; the recoveries
 * then come from the event log), or a step log alone (`newt train --log`). Every file goes through its parser (launch/summary.c,
 * job/runlog.h); a bad line or field is refused with its name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cmds.h"
#include "cli/report.h"
#include "common/fs.h"
#include "common/opts.h"
#include "job/runlog.h"
#include "launch/launcher.h"

#define SUMMARY_MAX (64u << 20)

static int is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* dir/name into out, refusing a path that does not fit. */
static newt_result_t path_in(char *out, size_t cap, const char *dir, const char *name) {
  int n = snprintf(out, cap, "%s%s%s", dir, name[0] ? "/" : "", name);
  if (n < 0 || (size_t)n >= cap) return NEWT_ERR(NEWT_ERR_INVALID, "the path %s/%s is too long", dir, name);
  return NEWT_OK;
}

/* A step log read and stitched into one history. */
static newt_result_t read_steps(const char *path, job_step **steps, size_t *n, size_t *redone, size_t *torn) {
  NEWT_CHECK(job_steplog_read(path, steps, n, torn));
  newt_result_t r = job_steplog_stitch(*steps, n, redone);
  if (r == NEWT_OK && *n == 0) r = NEWT_ERR(NEWT_ERR_INVALID, "%s: no step in it (did the run take one?)", path);
  if (r != NEWT_OK) {
    free(*steps);
    *steps = NULL;
  }
  return r;
}

static newt_result_t read_summary(const char *path, launcher_summary *s) {
  char *text = NULL;
  size_t len = 0;
  NEWT_CHECK(newt_fs_read_all(path, SUMMARY_MAX, &text, &len));
  newt_result_t r = launcher_summary_from_json(text, len, s);
  free(text);
  if (r != NEWT_OK) return newt_err_wrap(r, "%s: ", path);
  return NEWT_OK;
}

/* The step and event logs not given as flags: the directory's, else what the summary names
 * (p_steps and p_events hold them, 1024 bytes each); an event log that is not there is none. */
static newt_result_t log_paths(const char *dir, const launcher_summary *sum, const char **steps_path, char *p_steps,
                               const char **events_path, char *p_events) {
  const char *from = dir ? dir : sum && sum->res.log_dir[0] ? sum->res.log_dir : NULL;
  if (!*steps_path) {
    if (dir || !sum || !sum->res.step_log[0]) NEWT_CHECK(path_in(p_steps, 1024, from ? from : ".", "steps.jsonl"));
    else NEWT_CHECK(path_in(p_steps, 1024, sum->res.step_log, ""));
    *steps_path = p_steps;
  }
  if (!*events_path) {
    if (dir || !sum || !sum->res.event_log[0]) NEWT_CHECK(path_in(p_events, 1024, from ? from : ".", "events.jsonl"));
    else NEWT_CHECK(path_in(p_events, 1024, sum->res.event_log, ""));
    if (newt_fs_exists(p_events)) *events_path = p_events;
  }
  return NEWT_OK;
}

int newt_cmd_report(int argc, char **argv) {
  const char *summary_path = NULL, *steps_path = NULL, *events_path = NULL, *baseline = NULL, *out_path = NULL,
             *title = NULL;
  newt_opt opts[] = {
      {"summary", NEWT_OPT_STR, &summary_path, "the run's summary (newt run --summary); default: DIR/summary.json"},
      {"steps", NEWT_OPT_STR, &steps_path, "the step log; default: DIR/steps.jsonl, or the summary's step_log"},
      {"events", NEWT_OPT_STR, &events_path, "the event log; default: DIR/events.jsonl, or the summary's event_log"},
      {"baseline", NEWT_OPT_STR, &baseline, "a reference run drawn on top: its step log (newt train --log) or log dir"},
      {"out", NEWT_OPT_STR, &out_path, "the page to write; default: report.html beside the run's files"},
      {"title", NEWT_OPT_STR, &title, "the page's title; default: the job's name"},
      NEWT_OPT_END};
  char *pos[1];
  int npos = 0;
  int rc = newt_opts_exit(newt_opts_parse("report", "[DIR] [--summary FILE] [--steps FILE] [--baseline FILE|DIR] [--out FILE]",
                                          opts, argc, argv, pos, 1, &npos));
  if (rc >= 0) return rc;
  const char *dir = npos ? pos[0] : NULL;
  if (!dir && !summary_path && !steps_path) {
    fprintf(stderr, "newt report: give a run's log directory (newt report DIR), --summary FILE or --steps FILE\n");
    return 2;
  }
  if (dir && !is_dir(dir)) {
    fprintf(stderr, "newt report: %s is not a directory (the log directory of newt run --log-dir)\n", dir);
    return 2;
  }

  /* Everything below is released at `done`. */
  char p_summary[1024], p_steps[1024], p_events[1024], p_base[1024], p_out[1024];
  launcher_summary sum;
  int have_sum = 0, status = 1;
  job_step *steps = NULL, *base = NULL;
  job_event *events = NULL;
  size_t nsteps = 0, nbase = 0, nevents = 0, redone = 0, torn = 0, base_redone = 0;
  newt_buf page;
  newt_buf_init(&page);
  newt_result_t r = NEWT_OK;

  if (!summary_path && dir) {
    if ((r = path_in(p_summary, sizeof p_summary, dir, "summary.json")) != NEWT_OK) goto done;
    if (newt_fs_exists(p_summary)) summary_path = p_summary;
  }
  if (summary_path) {
    if ((r = read_summary(summary_path, &sum)) != NEWT_OK) goto done;
    have_sum = 1;
  }
  if ((r = log_paths(dir, have_sum ? &sum : NULL, &steps_path, p_steps, &events_path, p_events)) != NEWT_OK) goto done;
  if ((r = read_steps(steps_path, &steps, &nsteps, &redone, &torn)) != NEWT_OK) {
    if (r == NEWT_ERR_NOTFOUND) r = newt_err_wrap(r, "no step log (newt run writes steps.jsonl in its log directory): ");
    goto done;
  }
  if (events_path && (r = job_eventlog_read(events_path, &events, &nevents, NULL)) != NEWT_OK) goto done;
  if (baseline) {
    if ((r = path_in(p_base, sizeof p_base, baseline, is_dir(baseline) ? "steps.jsonl" : "")) != NEWT_OK) goto done;
    if ((r = read_steps(p_base, &base, &nbase, &base_redone, NULL)) != NEWT_OK) {
      r = newt_err_wrap(r, "--baseline: ");
      goto done;
    }
  }
  if (!out_path) {
    char d[1024];
    newt_fs_dirname(summary_path ? summary_path : steps_path, d, sizeof d);
    if ((r = path_in(p_out, sizeof p_out, dir ? dir : d, "report.html")) != NEWT_OK) goto done;
    out_path = p_out;
  }

  char sources[4096];
  snprintf(sources, sizeof sources, "%s%s%s%s%s%s%s", have_sum ? summary_path : "", have_sum ? ", " : "", steps_path,
           events_path ? ", " : "", events_path ? events_path : "", baseline ? ", baseline " : "",
           baseline ? p_base : "");
  char base_name[300];
  snprintf(base_name, sizeof base_name, "baseline: %.280s", baseline ? baseline : "");
  report_input in = {.title = title ? title : have_sum && sum.job[0] ? sum.job : steps_path,
                     .summary = have_sum ? &sum : NULL,
                     .steps = steps,
                     .nsteps = nsteps,
                     .redone = redone,
                     .torn = torn,
                     .baseline = base,
                     .nbaseline = nbase,
                     .baseline_name = base_name,
                     .events = events,
                     .nevents = nevents,
                     .sources = sources};
  if ((r = report_html(&in, &page)) != NEWT_OK) goto done;
  if ((r = newt_fs_write_atomic(out_path, page.data, page.len)) != NEWT_OK) goto done;
  int nrec = have_sum ? sum.res.nrecoveries : 0; /* without a summary, the event log's */
  for (size_t i = 0; !have_sum && i < nevents; i++) nrec += events[i].type == JOB_EV_RECOVERED;
  printf("newt report: %s (%zu steps, %d recoveries, %zu KiB; open it in any browser)\n", out_path, nsteps, nrec,
         (page.len + 1023) / 1024);
  status = 0;
done:
  if (r != NEWT_OK) fprintf(stderr, "newt report: %s\n", newt_errmsg());
  newt_buf_free(&page);
  free(steps);
  free(base);
  job_eventlog_free(events, nevents);
  if (have_sum) launcher_result_free(&sum.res);
  return status;
}
