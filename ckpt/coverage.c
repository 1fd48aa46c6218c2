/* Whether the chunks of a stored tensor cover it exactly once: each chunk's slice becomes
 * the list of global element intervals it holds (one per row of the last dimension, merged
 * where rows run on), and the sorted intervals of all chunks must neither overlap nor
 * (for a whole checkpoint) leave a gap. Also the small helpers the files of ckpt/ share:
 * a growable array and the printing of a shape. The slice geometry itself is
 * common/slice.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/internal.h"

newt_result_t ckpt_array_reserve(void **arr, size_t *cap, size_t n, size_t elem) {
  if (n < *cap) return NEWT_OK;
  size_t nc = *cap ? *cap * 2 : 16;
  if (nc <= n) nc = n + 1;
  void *na = realloc(*arr, nc * elem);
  if (!na) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: an array of %zu elements", nc);
  *arr = na;
  *cap = nc;
  return NEWT_OK;
}

void ckpt_shape_str(int ndim, const int64_t *shape, char *out, size_t cap) {
  size_t used = (size_t)snprintf(out, cap, "(");
  for (int i = 0; i < ndim && i < NEWT_SLICE_MAX_DIMS && used < cap; i++)
    used += (size_t)snprintf(out + used, cap - used, "%s%lld", i ? "," : "", (long long)shape[i]);
  if (used < cap) snprintf(out + used, cap - used, ")");
}

/* ---- coverage ---------------------------------------------------------------------------- */

typedef struct interval {
  int64_t a, b;
  size_t chunk;
} interval;

typedef struct ivec {
  interval *v;
  size_t n, cap;
} ivec;

static newt_result_t push(ivec *iv, int64_t a, int64_t b, size_t chunk) {
  if (iv->n > 0 && iv->v[iv->n - 1].b == a && iv->v[iv->n - 1].chunk == chunk) {
    iv->v[iv->n - 1].b = b;
    return NEWT_OK;
  }
  NEWT_CHECK(CKPT_RESERVE(iv->v, iv->cap, iv->n));
  iv->v[iv->n++] = (interval){a, b, chunk};
  return NEWT_OK;
}

/* The global intervals of one slice, in its order. */
static newt_result_t slice_intervals(const int64_t *shape, const newt_slice *s, size_t chunk, ivec *iv) {
  int L = s->ndim - 1;
  int64_t sl = s->shape[L];
  int64_t r[NEWT_SLICE_MAX_DIMS];
  for (int64_t R = s->begin / sl; R <= (s->end - 1) / sl; R++) {
    newt_slice_row_coords(s, R, r);
    int64_t grow = 0;
    for (int i = 0; i < L; i++) grow = grow * shape[i] + r[i];
    int64_t ca = s->begin - R * sl > 0 ? s->begin - R * sl : 0;
    int64_t cb = s->end - R * sl < sl ? s->end - R * sl : sl;
    int64_t g = grow * shape[L] + s->offset[L];
    NEWT_CHECK(push(iv, g + ca, g + cb, chunk));
  }
  return NEWT_OK;
}

static int interval_cmp(const void *x, const void *y) {
  const interval *a = x, *b = y;
  return a->a < b->a ? -1 : a->a > b->a;
}

newt_result_t ckpt_coverage_check(const ckpt_tensor *t, int full, const char *what) {
  int64_t numel = newt_shape_numel(t->ndim, t->shape);
  ivec iv = {0};
  newt_result_t r = NEWT_OK;
  for (size_t j = 0; j < t->nchunks && r == NEWT_OK; j++) r = slice_intervals(t->shape, &t->chunks[j].slice, j, &iv);
  if (r != NEWT_OK) {
    free(iv.v);
    return r;
  }
  qsort(iv.v, iv.n, sizeof *iv.v, interval_cmp);
  int64_t at = 0;
  for (size_t k = 0; k < iv.n && r == NEWT_OK; k++) {
    const interval *x = &iv.v[k];
    if (x->a < at)
      r = NEWT_ERR(NEWT_ERR_INVALID, "%s: chunks %zu and %zu both hold element %lld", what,
                   iv.v[k - 1].chunk, x->chunk, (long long)x->a);
    else if (full && x->a > at)
      r = NEWT_ERR(NEWT_ERR_INVALID, "%s: elements [%lld, %lld) of %lld are in no chunk (a rank's slices "
                   "are missing)", what, (long long)at, (long long)x->a, (long long)numel);
    at = x->b;
  }
  if (r == NEWT_OK && full && at != numel)
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s: elements [%lld, %lld) of %lld are in no chunk (a rank's slices are "
                 "missing)", what, (long long)at, (long long)numel, (long long)numel);
  free(iv.v);
  return r;
}
