/* What a generation measures of its data-parallel ranks' speeds (speed.c; docs/elastic.md,
 * "Stragglers"). Every rank hands its compute of the step -- the wall time from
 * newt_step_begin to newt_step_commit less the time its thread spent in collectives
 * (comm_thread_wait_ns) -- to the commit's all-gather, so every rank holds every rank's, and
 * each keeps the same account over the last spec.fault.straggler_window steps: per
 * data-parallel rank (the slowest of its tensor and pipeline ranks), its compute per step
 * and per sample, and whether the median over the window of one rank's compute per step is
 * more than spec.fault.straggler_margin above or below the median rank's (a straggler, or one
 * that recovered with a smaller share), or, under shares, whether every rank's compute per
 * sample is within the margin of every other's (the straggler recovered). Medians: a slowdown of fewer than half the window's
 * steps moves none. The progress record carries the summary (worker_speed_summary); the
 * leader decides (coordinator/policy.c). */
#ifndef NEWT_WORKER_SPEED_H
#define NEWT_WORKER_SPEED_H

#include <stdint.h>

#include "common/err.h"
#include "job/plan.h"
#include "job/records.h"
#include "job/spec.h"

typedef struct worker_speed {
  int dp, tp, window;
  double margin;
  double *c;           /* [window][dp] ring: each step's compute (s) of each data-parallel rank */
  double *us;          /* [window][dp] ring: ... per sample (microseconds) */
  uint64_t *t_ms;      /* [window]: when each step of the ring was agreed */
  double *med;         /* [dp] scratch */
  int at, n;           /* the next row of the ring; rows held */
  int off;             /* at the last step, with the ring full: a rank's median compute was off the
                          median rank's by more than the margin */
} worker_speed;

/* A generation's account, empty, for plan p. */
newt_result_t worker_speed_start(worker_speed *s, const newt_plan *p, const newt_spec *spec);
void worker_speed_free(worker_speed *s);

/* One step: compute[q], rank q's compute in seconds (stride doubles apart), for the size ranks
 * of plan p. */
void worker_speed_step(worker_speed *s, const newt_plan *p, const double *compute, int stride, int size,
                       uint64_t now_ms);

/* The account into the progress record's speed fields (sample_us, slow, straggle). */
void worker_speed_summary(const worker_speed *s, uint64_t now_ms, job_progress *pr);
/* The same summary into a step log's line (sample_us, slow). */
void worker_speed_line(const worker_speed *s, job_step *line);

#endif
