/* The files a run keeps beside its job, for people and for `newt report`: the step log and
 * the event log, both JSON lines (one record per line, through the codecs of records.h).
 *
 *   file          one line per                     written by                 format
 *   steps.jsonl   step done                        rank 0 (`newt worker           job_step
 *                                                  --step-log`), `newt train
 *                                                  --log`
 *   events.jsonl  event of the leader, as `newt    `newt run`                 job_event
 *                 run` saw it in etcd
 *
 * The step log is written by whichever worker is rank 0: a worker that becomes rank 0 in a
 * later generation appends to the same file (first the line of the step it restored, which
 * a killed rank 0 may have taken with it), and a step rolled back by a recovery appears
 * again with a newer generation. Each line is one write(2) to a file opened O_APPEND, so
 * lines of two writers never interleave; a writer killed in the middle of a line leaves a
 * last line without its newline, which readers skip. job_steplog_stitch turns the lines
 * into the run's history: one line per step, of the newest generation that did it. */
#ifndef NEWT_JOB_RUNLOG_H
#define NEWT_JOB_RUNLOG_H

#include <stddef.h>

#include "common/err.h"
#include "job/records.h"

/* Opens (creates) path for appending lines, making its folder first; truncate: start it
 * empty. A symbolic link in its place is refused, never written through. */
newt_result_t job_runlog_open(const char *path, int truncate, int *fd);
/* The same for `name` in the open directory dirfd (dir: its path, for messages). */
newt_result_t job_runlog_open_at(int dirfd, const char *dir, const char *name, int truncate, int *fd);

/* Appends one line: s (or e) as its codec writes it, and a newline, in one write. */
newt_result_t job_steplog_append(int fd, const job_step *s);
newt_result_t job_eventlog_append(int fd, const job_event *e);

/* Every complete line of a step log (or event log), in file order, malloc'd into *out.
 * A line that does not parse fails the read, naming the file, the line and the field;
 * a last line without its newline (a writer killed mid-line) is skipped and counted in
 * *torn (may be NULL). The event log's events are freed with job_eventlog_free. */
newt_result_t job_steplog_read(const char *path, job_step **out, size_t *n, size_t *torn);
newt_result_t job_eventlog_read(const char *path, job_event **out, size_t *n, size_t *torn);
void job_eventlog_free(job_event *e, size_t n);

/* The run's history from the lines of a step log, in place: sorted by step, one line per
 * step, of the newest generation that did it (of two lines of one generation, the later;
 * a stale rank 0 that wakes up after the others went on writes an older generation, which
 * loses). *n becomes the number of steps; *redone (may be NULL) gets the number of steps
 * done again by a later generation (rolled back by a recovery). */
newt_result_t job_steplog_stitch(job_step *s, size_t *n, size_t *redone);

#endif
