/* The ranks' speeds, as every rank of a generation measures them (speed.h). The cost is one
 * double more in the commit's all-gather and, per step, a median over the window for each
 * data-parallel rank (dp x window values). */
#include "worker/speed.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/param.h"
#include "common/strutil.h"

/* A rank whose compute per step is off the median rank's by less than this (ms) is never a
   straggler, whatever the ratio: steps of a few milliseconds move by half on a crowded
   machine's noise alone, and a plan switch (hundreds of ms) would not pay for itself */
NEWT_PARAM(StragglerFloorMs, "NEWT_STRAGGLER_FLOOR_MS", 20)

#define SPEED_WINDOW_MIN 8 /* rows kept for the speeds when rebalancing is off */

newt_result_t worker_speed_start(worker_speed *s, const newt_plan *p, const newt_spec *spec) {
  worker_speed_free(s);
  s->dp = p->dp;
  s->tp = p->tp;
  s->window = spec->straggler_window > SPEED_WINDOW_MIN ? (int)spec->straggler_window : SPEED_WINDOW_MIN;
  s->margin = spec->straggler_window > 0 ? spec->straggler_margin : 1e9;
  size_t cells = (size_t)s->window * (size_t)s->dp;
  s->c = calloc(cells, sizeof *s->c);
  s->us = calloc(cells, sizeof *s->us);
  s->t_ms = calloc((size_t)s->window, sizeof *s->t_ms);
  s->med = calloc((size_t)(s->dp > s->window ? s->dp : s->window) * 2, sizeof *s->med);
  if (!s->c || !s->us || !s->t_ms || !s->med) {
    worker_speed_free(s);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory measuring the ranks' speeds");
  }
  return NEWT_OK;
}

void worker_speed_free(worker_speed *s) {
  free(s->c);
  free(s->us);
  free(s->t_ms);
  free(s->med);
  memset(s, 0, sizeof *s);
}

/* The median over the ring of column d of ring (into s->med's second half as scratch). */
static double ring_median(const worker_speed *s, const double *ring, int d) {
  double *v = s->med + (s->dp > s->window ? s->dp : s->window);
  for (int i = 0; i < s->n; i++) v[i] = ring[(size_t)i * (size_t)s->dp + (size_t)d];
  return newt_percentile(v, (size_t)s->n, 0.5);
}

/* Each data-parallel rank's median over the ring into s->med[0..dp); the median of those, the
 * ranks' reference. Of two ranks, the smaller: their median is their mean, which neither is
 * ever 1 + margin times when one is twice as slow as the other. */
static double medians(const worker_speed *s, const double *ring) {
  for (int d = 0; d < s->dp; d++) s->med[d] = ring_median(s, ring, d);
  if (s->dp == 2) return s->med[0] < s->med[1] ? s->med[0] : s->med[1];
  double *v = s->med + (s->dp > s->window ? s->dp : s->window);
  memcpy(v, s->med, (size_t)s->dp * sizeof *v);
  return newt_percentile(v, (size_t)s->dp, 0.5);
}

void worker_speed_step(worker_speed *s, const newt_plan *p, const double *compute, int stride, int size,
                       uint64_t now_ms) {
  if (!s->c || p->dp != s->dp || size != p->nranks) return;
  double *row = s->c + (size_t)s->at * (size_t)s->dp, *urow = s->us + (size_t)s->at * (size_t)s->dp;
  memset(row, 0, (size_t)s->dp * sizeof *row);
  for (int q = 0; q < size; q++) { /* rank = (pp * dp + d) * tp + t: a data-parallel rank is its slowest */
    int d = (q / s->tp) % s->dp;
    double c = compute[(size_t)q * (size_t)stride];
    if (c > row[d]) row[d] = c;
  }
  for (int d = 0; d < s->dp; d++) {
    int64_t first, count;
    plan_slice(p, d, &first, &count);
    urow[d] = count > 0 ? row[d] * 1e6 / (double)count : 0;
  }
  s->t_ms[s->at] = now_ms;
  s->at = (s->at + 1) % s->window;
  if (s->n < s->window) s->n++;
  s->off = 0;
  if (s->n < s->window || s->dp < 2) return;
  /* each rank's compute per step against the median rank's: balanced shares make them equal,
     whatever the speeds */
  double all = medians(s, s->c), floor_s = (double)newt_param_StragglerFloorMs() / 1e3;
  for (int d = 0; d < s->dp && all > 0; d++)
    s->off |= fabs(s->med[d] - all) >= floor_s &&
              (s->med[d] > (1.0 + s->margin) * all || s->med[d] * (1.0 + s->margin) < all);
  if (s->off || !p->shares) return;
  /* shares in force, and every rank's compute per sample within the margin of every other's:
     the straggler recovered, and even shares are its due (a rank with a small share does its
     step's fixed work over fewer samples, so its compute per step alone may never look off) */
  medians(s, s->us);
  double lo = 0, hi = 0;
  for (int d = 0; d < s->dp; d++) {
    if (d == 0 || s->med[d] < lo) lo = s->med[d];
    if (d == 0 || s->med[d] > hi) hi = s->med[d];
  }
  s->off = lo > 0 && hi <= (1.0 + s->margin) * lo;
}

void worker_speed_summary(const worker_speed *s, uint64_t now_ms, job_progress *pr) {
  pr->sample_us = 0;
  pr->nslow = 0;
  pr->straggle = pr->straggle_ms = 0;
  if (!s->c || s->n == 0) return;
  double all = medians(s, s->us);
  pr->sample_us = all;
  /* the ranks off the median's speed by the margin, the farthest first */
  for (int k = 0; k < JOB_SLOW_MAX && all > 0; k++) {
    int best = -1;
    double far = 1.0 + s->margin;
    for (int d = 0; d < s->dp; d++) {
      double r = s->med[d] > all ? s->med[d] / all : s->med[d] > 0 ? all / s->med[d] : 0;
      int listed = 0;
      for (int i = 0; i < pr->nslow; i++) listed |= pr->slow[i].dp == d;
      if (!listed && r > far) best = d, far = r;
    }
    if (best < 0) break;
    pr->slow[pr->nslow].dp = best;
    pr->slow[pr->nslow].us = s->med[best];
    pr->nslow++;
  }
  if (s->off) { /* the window's steps, and the time they span */
    uint64_t oldest = s->t_ms[s->at]; /* the ring is full: the next row to write is the oldest */
    pr->straggle = s->n;
    pr->straggle_ms = now_ms > oldest ? (int64_t)(now_ms - oldest) : 0;
  }
}

void worker_speed_line(const worker_speed *s, job_step *line) {
  job_progress pr = {0};
  worker_speed_summary(s, 0, &pr);
  line->sample_us = pr.sample_us;
  line->nslow = pr.nslow;
  memcpy(line->slow, pr.slow, sizeof line->slow);
}
