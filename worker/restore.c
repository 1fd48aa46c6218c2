/* Where a generation's state comes from: the cheapest source that holds the newest whole
 * state (docs/elastic.md, "Restore").
 *
 * Every rank of the new communicator tells the others (one allgather) whether it holds a
 * state and of which step. The newest step held by any rank wins; if some rank lacks it,
 * the lowest-ranked holder broadcasts it (weights, AdamW moments, step and data cursor)
 * over the new communicator, so a replacement or a joiner is filled from its peers. A
 * rank whose last all-reduce failed holds step s and one whose all-reduce completed holds
 * s + 1: both are whole states, the newer wins, nothing is mixed. Only when no rank holds
 * anything is the newest valid checkpoint read (every rank reads it), and on a new job the
 * weights come from the seed, identically on every rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/internal.h"

/* Header of a state broadcast. */
enum { HDR_STEP, HDR_CURSOR, HDR_OPT_T, HDR_N };

static newt_result_t broadcast_state(worker *w, comm_t *c, int root) {
  model_trainer *tr = &w->tr;
  int64_t hdr[HDR_N] = {tr->step, (int64_t)tr->cursor, tr->opt.t};
  NEWT_CHECK(comm_broadcast(c, hdr, hdr, HDR_N, NEWT_I64, root));
  NEWT_CHECK(comm_broadcast(c, tr->gpt.params, tr->gpt.params, tr->gpt.layout.total, NEWT_F32, root));
  NEWT_CHECK(comm_broadcast(c, tr->opt.m, tr->opt.m, tr->opt.len, NEWT_F32, root));
  NEWT_CHECK(comm_broadcast(c, tr->opt.v, tr->opt.v, tr->opt.len, NEWT_F32, root));
  tr->step = hdr[HDR_STEP];
  tr->cursor = (uint64_t)hdr[HDR_CURSOR];
  tr->opt.t = hdr[HDR_OPT_T];
  return NEWT_OK;
}

static void init_from_seed(worker *w) {
  model_trainer *tr = &w->tr;
  model_gpt_init_weights(&tr->gpt, tr->cfg.seed);
  memset(tr->opt.m, 0, tr->opt.len * sizeof(float));
  memset(tr->opt.v, 0, tr->opt.len * sizeof(float));
  tr->opt.t = 0;
  tr->step = 0;
  tr->cursor = 0;
}

newt_result_t worker_restore(worker *w, comm_t *c, const newt_plan *p) {
  int n = comm_size(c);
  int64_t mine[2] = {w->has_state, w->tr.step};
  int64_t *all = malloc((size_t)n * 2 * sizeof *all);
  NEWT_CHECK_ALLOC(all);
  newt_result_t r = comm_allgather(c, mine, all, 2, NEWT_I64);
  if (r != NEWT_OK) {
    free(all);
    return r;
  }
  int holder = -1, lacking = 0;
  int64_t best = -1;
  for (int i = 0; i < n; i++)
    if (all[2 * i] && all[2 * i + 1] > best) {
      best = all[2 * i + 1];
      holder = i;
    }
  for (int i = 0; i < n; i++) lacking += !(all[2 * i] && all[2 * i + 1] == best);
  free(all);

  if (holder >= 0) {
    int had = w->has_state && w->tr.step == best;
    if (lacking) NEWT_CHECK(broadcast_state(w, c, holder));
    snprintf(w->restore_src, sizeof w->restore_src, "%s", had ? "memory" : "peer");
  } else {
    int64_t step = -1;
    r = worker_ckpt_load(w, &step);
    if (r == NEWT_OK || r == NEWT_ERR_NOTFOUND) {
      /* every rank must have read the same step (a commit racing the reads would split them) */
      int64_t got = r == NEWT_OK ? step : -1, lo = got, hi = got;
      int64_t *steps = malloc((size_t)n * sizeof *steps);
      NEWT_CHECK_ALLOC(steps);
      newt_result_t g = comm_allgather(c, &got, steps, 1, NEWT_I64);
      for (int i = 0; g == NEWT_OK && i < n; i++) {
        if (steps[i] < lo) lo = steps[i];
        if (steps[i] > hi) hi = steps[i];
      }
      free(steps);
      NEWT_CHECK(g);
      if (lo != hi)
        return NEWT_ERR(NEWT_ERR_CORRUPT, "ranks read different checkpoints (steps %lld to %lld) from %s",
                        (long long)lo, (long long)hi, w->spec.ckpt_dir);
    }
    if (r == NEWT_OK) {
      snprintf(w->restore_src, sizeof w->restore_src, "ckpt");
    } else if (r == NEWT_ERR_NOTFOUND) {
      if (p->step > 0)
        NEWT_ERROR(WORKER, "%s: the job was at step %lld but no rank holds a state and there is no "
                           "checkpoint: starting again from the seed",
                   w->id, (long long)p->step);
      init_from_seed(w);
      snprintf(w->restore_src, sizeof w->restore_src, "init");
    } else {
      return r;
    }
  }
  w->has_state = 1;
  w->restore_step = w->tr.step;
  NEWT_INFO(WORKER, "%s: generation %llu starts at step %lld (state from %s)", w->id,
            (unsigned long long)p->generation, (long long)w->tr.step, w->restore_src);
  return NEWT_OK;
}
