/* Where a generation's state comes from: the cheapest source that holds the newest whole
 * state (docs/elastic.md, "Restore").
 *
 * The ranks of the new communicator reshard in memory (worker/reshard.c): each says which
 * pieces of the weights and AdamW moments it holds and of which step, the newest step that
 * the held pieces cover wins, and whoever lacks it receives it from a holder over the new
 * communicator, so a replacement or a joiner is filled from its peers. A rank whose last
 * all-reduce failed holds step s and one whose all-reduce completed holds s + 1: both are
 * whole states, the newer wins, nothing is mixed. Only when no step is covered is the
 * newest valid checkpoint read (every rank reads it, and they check they read the same
 * step), and on a new job the weights come from the seed, identically on every rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/internal.h"
#include "worker/reshard.h"

/* The trainer's state as reshard pieces: every tensor whole, its weights and both AdamW
 * moments (named as in checkpoints). *out is malloc'd. */
static newt_result_t state_pieces(worker *w, reshard_piece **out, size_t *n) {
  model_trainer *tr = &w->tr;
  const model_layout *lay = &tr->gpt.layout;
  reshard_piece *p = calloc(lay->n * 3, sizeof *p);
  NEWT_CHECK_ALLOC(p);
  static const char *const prefix[3] = {"", CKPT_ADAM_M, CKPT_ADAM_V};
  float *base[3] = {tr->gpt.params, tr->opt.m - tr->opt.off, tr->opt.v - tr->opt.off};
  size_t k = 0;
  for (int kind = 0; kind < 3; kind++)
    for (size_t i = 0; i < lay->n; i++) {
      const model_tensor *t = &lay->tensors[i];
      reshard_piece *q = &p[k++];
      snprintf(q->name, sizeof q->name, "%s%s", prefix[kind], t->name);
      q->ndim = t->ndim;
      q->shape[0] = (int64_t)t->shape[0];
      if (t->ndim == 2) q->shape[1] = (int64_t)t->shape[1];
      int64_t off[2] = {0, 0};
      ckpt_slice_box(&q->slice, t->ndim, off, q->shape);
      q->data = base[kind] + t->offset;
    }
  *out = p;
  *n = k;
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
  reshard_piece *pieces = NULL;
  size_t np = 0;
  NEWT_CHECK(state_pieces(w, &pieces, &np));
  reshard_result rr;
  for (size_t i = 0; i < np; i++) pieces[i].step = w->has_state ? w->tr.step : -1;
  newt_result_t r = reshard_exchange(c, pieces, w->has_state ? np : 0, pieces, np, &rr);
  free(pieces);
  if (r != NEWT_OK && r != NEWT_ERR_NOTFOUND) return r;
  if (r == NEWT_OK) {
    /* a step's whole state: the data cursor and the optimizer's count follow from it */
    w->tr.step = rr.step;
    w->tr.cursor = (uint64_t)rr.step * (uint64_t)p->global_batch;
    w->tr.opt.t = rr.step;
    snprintf(w->restore_src, sizeof w->restore_src, "%s", rr.received ? "peer" : "memory");
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
