/* The ranks' speeds (worker/speed.c, issue 41): when a window of steps makes the measure "off",
 * from the computes the commit's all-gather hands over. A plan of three data-parallel ranks;
 * each step gives every rank a compute, no clock is read. */
#include <stdlib.h>
#include <string.h>

#include "job/plan.h"
#include "job/spec.h"
#include "test.h"
#include "worker/speed.h"

#define WIN 10

static void plan3(newt_plan *p, int64_t *shares) {
  memset(p, 0, sizeof *p);
  p->dp = 3, p->tp = 1, p->pp = 1, p->nranks = 3, p->global_batch = 24, p->micro_batch = 2;
  p->shares = shares;
}

static void start(worker_speed *s, const newt_plan *p) {
  newt_spec spec;
  spec_defaults(&spec, "speed");
  spec.straggler_window = WIN;
  spec.straggler_margin = 0.5;
  memset(s, 0, sizeof *s);
  T_OK(worker_speed_start(s, p, &spec));
}

/* steps steps in which rank r's compute (s) is slow and the others' fast; the off flag after each */
static int run(worker_speed *s, const newt_plan *p, int steps, int r, double slow, double fast, int *offs) {
  int n_off = 0;
  for (int i = 0; i < steps; i++) {
    double c[3] = {fast, fast, fast};
    c[r] = slow;
    worker_speed_step(s, p, c, 1, 3, (uint64_t)(1000 + i * 100));
    n_off += s->off;
  }
  if (offs) *offs = n_off;
  return s->off;
}

static void test_straggler(void) {
  newt_plan p;
  worker_speed s;
  plan3(&p, NULL);
  start(&s, &p);
  int offs;
  T_CHECK_MSG(!run(&s, &p, WIN, 1, 0.05, 0.05, &offs) && offs == 0, "equal ranks: off %d times", offs);
  /* slow for fewer than half the window: no median moves */
  T_CHECK_MSG(!run(&s, &p, WIN / 2 - 1, 1, 0.2, 0.05, &offs) && offs == 0, "a short slowdown: off %d times", offs);
  T_CHECK(!run(&s, &p, WIN, 1, 0.05, 0.05, NULL));
  /* slow for a whole window: off */
  T_CHECK_MSG(run(&s, &p, WIN, 1, 0.2, 0.05, NULL), "a rank 4x slower for a window is not off");
  /* twice as slow, but by 3 ms a step: under the floor (NEWT_STRAGGLER_FLOOR_MS, 20), noise */
  worker_speed tiny;
  start(&tiny, &p);
  T_CHECK_MSG(!run(&tiny, &p, 2 * WIN, 1, 0.006, 0.003, &offs) && offs == 0, "a rank 3 ms a step slower: off %d times",
              offs);
  worker_speed_free(&tiny);
  job_progress pr;
  memset(&pr, 0, sizeof pr);
  worker_speed_summary(&s, 3000, &pr);
  T_CHECK_MSG(pr.nslow == 1 && pr.slow[0].dp == 1 && pr.straggle == WIN, "summary: %d slow, dp %d, straggle %lld",
              pr.nslow, pr.nslow ? pr.slow[0].dp : -1, (long long)pr.straggle);
  job_step line = {0}; /* the step log's line carries the same speeds */
  worker_speed_line(&s, &line);
  T_CHECK_MSG(line.sample_us == pr.sample_us && line.sample_us > 0 && line.nslow == 1 &&
                  line.slow[0].dp == 1 && line.slow[0].us == pr.slow[0].us,
              "line: %g us, %d slow", line.sample_us, line.nslow);
  worker_speed_free(&s);
}

/* Shares in force (the slowed rank 6 of 24, the others 9): the rank recovered when every rank's
 * compute per sample is within the margin, though its compute per step, with its step's fixed
 * work over fewer samples, is not off. */
static void test_give_back(void) {
  int64_t shares[3] = {9, 6, 9};
  newt_plan p;
  worker_speed s;
  plan3(&p, shares);
  start(&s, &p);
  /* fixed 20 ms a step, 5 ms a sample everywhere: 50 ms against 65 ms a step (within the margin
     of a half), 8.3 ms against 7.2 ms a sample (within it too): the even shares are due */
  T_CHECK_MSG(run(&s, &p, WIN, 1, 0.050, 0.065, NULL), "a recovered rank with a small share is not off");
  /* still slow, 10 ms a sample: 80 ms against 65 ms a step, 13.3 ms against 7.2 ms a sample: the
     shares fit well enough, nothing is due */
  T_CHECK_MSG(!run(&s, &p, WIN, 1, 0.080, 0.065, NULL), "a rank still slow looks recovered");
  worker_speed_free(&s);
  /* without shares the same computes say nothing of a give-back */
  plan3(&p, NULL);
  start(&s, &p);
  T_CHECK(!run(&s, &p, WIN, 1, 0.050, 0.065, NULL));
  worker_speed_free(&s);
}

/* Two ranks: one twice as slow as the other is a straggler (their median, their mean, is not a
 * reference either is far from). */
static void test_two(void) {
  newt_plan p;
  worker_speed s;
  plan3(&p, NULL);
  p.dp = 2, p.nranks = 2;
  start(&s, &p);
  double c[2] = {0.05, 0.05};
  for (int i = 0; i < WIN; i++) worker_speed_step(&s, &p, c, 1, 2, (uint64_t)(1000 + i * 100));
  T_CHECK(!s.off);
  c[1] = 0.10;
  for (int i = 0; i < WIN; i++) worker_speed_step(&s, &p, c, 1, 2, (uint64_t)(2000 + i * 100));
  T_CHECK_MSG(s.off, "of two ranks, one at half the other's speed is not off");
  job_progress pr;
  memset(&pr, 0, sizeof pr);
  worker_speed_summary(&s, 3000, &pr);
  T_CHECK_MSG(pr.nslow == 1 && pr.slow[0].dp == 1, "summary: %d slow, dp %d", pr.nslow, pr.nslow ? pr.slow[0].dp : -1);
  worker_speed_free(&s);
}

int main(void) {
  T_RUN(test_two);
  T_RUN(test_straggler);
  T_RUN(test_give_back);
  return T_DONE();
}
