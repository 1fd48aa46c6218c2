/* Slice geometry. A slice is a box of a global tensor narrowed to a range of the box's
 * row-major order. Rows of the last dimension are contiguous both in a slice's data and
 * in the global tensor, so every operation here walks rows: copying the intersection of
 * two slices (the reader assembling a requested slice from stored chunks, or a rank
 * resharding in memory), and listing the global element intervals a tensor's chunks cover
 * (checking that they cover it exactly once). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/internal.h"

int64_t ckpt_shape_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

void ckpt_slice_box(ckpt_slice *s, int ndim, const int64_t *offset, const int64_t *shape) {
  memset(s, 0, sizeof *s);
  s->ndim = ndim;
  for (int i = 0; i < ndim; i++) {
    s->offset[i] = offset ? offset[i] : 0;
    s->shape[i] = shape[i];
  }
  s->begin = 0;
  s->end = ckpt_shape_numel(ndim, shape);
}

void ckpt_slice_whole(ckpt_slice *s, const ckpt_tensor_desc *t) { ckpt_slice_box(s, t->ndim, NULL, t->shape); }

int64_t ckpt_slice_numel(const ckpt_slice *s) { return s->end - s->begin; }

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
  for (int i = 0; i < ndim && i < CKPT_MAX_DIMS && used < cap; i++)
    used += (size_t)snprintf(out + used, cap - used, "%s%lld", i ? "," : "", (long long)shape[i]);
  if (used < cap) snprintf(out + used, cap - used, ")");
}

newt_result_t ckpt_slice_check(const ckpt_slice *s, const ckpt_tensor_desc *t, const char *what) {
  if (t->ndim < 1 || t->ndim > CKPT_MAX_DIMS)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: tensor \"%s\" has %d dimensions, expected 1 to %d", what, t->name,
                    t->ndim, CKPT_MAX_DIMS);
  if (s->ndim != t->ndim)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: slice of %d dimensions for tensor \"%s\" of %d", what, s->ndim,
                    t->name, t->ndim);
  for (int i = 0; i < s->ndim; i++)
    if (s->offset[i] < 0 || s->shape[i] < 1 || s->offset[i] > t->shape[i] - s->shape[i])
      return NEWT_ERR(NEWT_ERR_INVALID, "%s: box dimension %d [%lld, %lld) lies outside tensor \"%s\" "
                      "(size %lld)", what, i, (long long)s->offset[i], (long long)(s->offset[i] + s->shape[i]),
                      t->name, (long long)t->shape[i]);
  int64_t n = ckpt_shape_numel(s->ndim, s->shape);
  if (s->begin < 0 || s->end <= s->begin || s->end > n)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: range [%lld, %lld) of a box of %lld elements (tensor \"%s\")", what,
                    (long long)s->begin, (long long)s->end, (long long)n, t->name);
  return NEWT_OK;
}

/* Row index (over dims 0..L-1) of global row coordinates r inside slice s's box. */
static int64_t box_row(const ckpt_slice *s, const int64_t *r, int L) {
  int64_t R = 0;
  for (int i = 0; i < L; i++) R = R * s->shape[i] + (r[i] - s->offset[i]);
  return R;
}

/* Global row coordinates of box row R of slice s. */
static void box_unravel(const ckpt_slice *s, int64_t R, int L, int64_t *r) {
  for (int i = L - 1; i >= 0; i--) {
    r[i] = s->offset[i] + R % s->shape[i];
    R /= s->shape[i];
  }
}

/* Smallest row r >= g (lexicographically) with lo <= r < hi in every dim; 0 when none. */
static int ceil_in_box(const int64_t *g, const int64_t *lo, const int64_t *hi, int L, int64_t *r) {
  for (int i = 0; i < L; i++) {
    if (g[i] < lo[i]) {
      for (int k = i; k < L; k++) r[k] = lo[k];
      return 1;
    }
    if (g[i] >= hi[i]) {
      for (int j = i - 1; j >= 0; j--) {
        if (r[j] + 1 < hi[j]) {
          r[j]++;
          for (int k = j + 1; k < L; k++) r[k] = lo[k];
          return 1;
        }
      }
      return 0;
    }
    r[i] = g[i];
  }
  return 1;
}

static int lex_less(const int64_t *a, const int64_t *b, int L) {
  for (int i = 0; i < L; i++)
    if (a[i] != b[i]) return a[i] < b[i];
  return 0;
}

int64_t ckpt_slice_copy(const int64_t *shape, size_t es, const ckpt_slice *D, void *dst, const ckpt_slice *S,
                        const void *src) {
  (void)shape;
  int d = D->ndim, L = d - 1;
  if (S->ndim != d || d < 1) return 0;
  int64_t lo[CKPT_MAX_DIMS], hi[CKPT_MAX_DIMS];
  for (int i = 0; i < d; i++) {
    lo[i] = D->offset[i] > S->offset[i] ? D->offset[i] : S->offset[i];
    int64_t a = D->offset[i] + D->shape[i], b = S->offset[i] + S->shape[i];
    hi[i] = a < b ? a : b;
    if (lo[i] >= hi[i]) return 0;
  }
  int64_t slD = D->shape[L], slS = S->shape[L];
  int64_t rD1 = (D->end - 1) / slD, rS1 = (S->end - 1) / slS;
  int64_t gD[CKPT_MAX_DIMS], gS[CKPT_MAX_DIMS], r[CKPT_MAX_DIMS];
  box_unravel(D, D->begin / slD, L, gD);
  box_unravel(S, S->begin / slS, L, gS);
  if (!ceil_in_box(lex_less(gD, gS, L) ? gS : gD, lo, hi, L, r)) return 0;
  int64_t copied = 0;
  for (;;) {
    int64_t RD = box_row(D, r, L), RS = box_row(S, r, L);
    if (RD > rD1 || RS > rS1) break;
    int64_t a = lo[L], b = hi[L];
    int64_t da = D->offset[L] + D->begin - RD * slD, db = D->offset[L] + D->end - RD * slD;
    int64_t sa = S->offset[L] + S->begin - RS * slS, sb = S->offset[L] + S->end - RS * slS;
    if (da > a) a = da;
    if (sa > a) a = sa;
    if (db < b) b = db;
    if (sb < b) b = sb;
    if (a < b) {
      if (dst) {
        int64_t kd = RD * slD + (a - D->offset[L]) - D->begin;
        int64_t ks = RS * slS + (a - S->offset[L]) - S->begin;
        memcpy((char *)dst + (size_t)kd * es, (const char *)src + (size_t)ks * es, (size_t)(b - a) * es);
      }
      copied += b - a;
    }
    /* next row of the intersection */
    int i = L - 1;
    for (; i >= 0; i--) {
      if (++r[i] < hi[i]) break;
      r[i] = lo[i];
    }
    if (i < 0) break;
  }
  return copied;
}

int ckpt_slices_may_overlap(const ckpt_slice *a, const ckpt_slice *b) {
  return ckpt_slice_copy(NULL, 0, a, NULL, b, NULL) > 0;
}

/* Whether the slice is one run of the global row-major order: [*start, *start + numel). */
static int global_run(const int64_t *shape, const ckpt_slice *s, int64_t *start) {
  int64_t row = 1;
  for (int i = 1; i < s->ndim; i++) {
    if (s->offset[i] != 0 || s->shape[i] != shape[i]) return 0;
    row *= shape[i];
  }
  *start = s->offset[0] * row + s->begin;
  return 1;
}

int ckpt_slice_contiguous_in(const int64_t *shape, const ckpt_slice *in, const ckpt_slice *out, int64_t *pos) {
  if (in->ndim != out->ndim) return 0;
  int same_box = 1;
  for (int i = 0; i < in->ndim && same_box; i++)
    same_box = in->offset[i] == out->offset[i] && in->shape[i] == out->shape[i];
  if (same_box) {
    if (in->begin < out->begin || in->end > out->end) return 0;
    *pos = in->begin - out->begin;
    return 1;
  }
  int64_t a, b;
  if (!global_run(shape, in, &a) || !global_run(shape, out, &b)) return 0;
  if (a < b || a + ckpt_slice_numel(in) > b + ckpt_slice_numel(out)) return 0;
  *pos = a - b;
  return 1;
}

newt_result_t ckpt_flat_pieces(const ckpt_slice *boxes, size_t nt, int64_t off, int64_t len,
                               ckpt_flat_piece *out, size_t cap, size_t *n) {
  *n = 0;
  if (off < 0 || len < 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "flat range [%lld, +%lld): negative", (long long)off, (long long)len);
  int64_t start = 0;
  for (size_t i = 0; i < nt; i++) {
    int64_t numel = ckpt_shape_numel(boxes[i].ndim, boxes[i].shape);
    int64_t a = off > start ? off : start, b = off + len < start + numel ? off + len : start + numel;
    if (a < b) {
      if (*n >= cap) return NEWT_ERR(NEWT_ERR_INVALID, "flat range [%lld, +%lld): more than %zu pieces",
                                     (long long)off, (long long)len, cap);
      ckpt_flat_piece *p = &out[(*n)++];
      p->tensor = i;
      p->slice = boxes[i];
      p->slice.begin = a - start;
      p->slice.end = b - start;
      p->flat_off = a;
    }
    start += numel;
  }
  if (off + len > start)
    return NEWT_ERR(NEWT_ERR_INVALID, "flat range [%lld, %lld) runs past the end of the buffer (%lld elements)",
                    (long long)off, (long long)(off + len), (long long)start);
  return NEWT_OK;
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
static newt_result_t slice_intervals(const int64_t *shape, const ckpt_slice *s, size_t chunk, ivec *iv) {
  int L = s->ndim - 1;
  int64_t sl = s->shape[L];
  int64_t r[CKPT_MAX_DIMS];
  for (int64_t R = s->begin / sl; R <= (s->end - 1) / sl; R++) {
    box_unravel(s, R, L, r);
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
  int64_t numel = ckpt_shape_numel(t->ndim, t->shape);
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
