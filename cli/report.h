/* The report of a run as one self-contained HTML page (cli/report.c): inline SVG charts and
 * a table, no script, no file or network fetched, so it opens offline in any browser.
 *
 *   loss       loss against step; each recovery a marker where training went on from,
 *              labelled with its cause; a reference run (--baseline) drawn on top
 *   membership world size and generation over wall time, each recovery marked with its
 *              cause (join, leave, crash, hang, ...) and shaded for as long as it took
 *   recoveries one bar per recovery split into detect, plan, communicator, restore (and
 *              the first step after it), labelled in ms
 *   throughput tokens/s over wall time, checkpoint commits as ticks
 *   speeds     (a step log with the ranks' speeds only) the median rank's compute per sample
 *              and each rank's the step log lists as off it, against step; each rebalance
 *              marked where it took effect; under it, the rebalances and the last plan's shares
 *   table      the recoveries, one row each
 *
 * Every recovery marker carries class "recovery-marker" (loss chart) and
 * "timeline-marker" (membership chart) and data-recovery="<index>", so tests and scripts
 * can count them; a rebalance's on the speeds chart, "rebalance-marker". */
#ifndef NEWT_CLI_REPORT_H
#define NEWT_CLI_REPORT_H

#include <stddef.h>

#include "common/err.h"
#include "common/strutil.h"
#include "job/records.h"
#include "launch/launcher.h"

typedef struct report_input {
  const char *title;              /* the job's name, or what the page is about */
  const launcher_summary *summary; /* NULL: a step log alone (`newt train --log`) */
  const job_step *steps;          /* stitched (job_steplog_stitch) */
  size_t nsteps, redone, torn;    /* steps done again after a rollback, torn lines skipped */
  const job_step *baseline;       /* stitched; NULL: none */
  size_t nbaseline;
  const char *baseline_name;
  const job_event *events;        /* the event log; NULL: none */
  size_t nevents;
  const char *sources;            /* the files read, shown at the foot of the page */
} report_input;

/* Appends the page to out. */
newt_result_t report_html(const report_input *in, newt_buf *out);

#endif
