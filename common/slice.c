/* Slice geometry (see slice.h). Rows of the last dimension are contiguous both in a slice's
 * data and in the global tensor, so every operation here walks rows: copying the
 * intersection of two slices (a checkpoint reader assembling a requested slice from stored
 * chunks, or a rank resharding in memory), testing whether one slice is a contiguous run of
 * another, and cutting a ZeRO flat range into one slice per tensor. */
#include "common/slice.h"

#include <string.h>

int64_t newt_shape_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

void newt_slice_box(newt_slice *s, int ndim, const int64_t *offset, const int64_t *shape) {
  memset(s, 0, sizeof *s);
  s->ndim = ndim;
  for (int i = 0; i < ndim; i++) {
    s->offset[i] = offset ? offset[i] : 0;
    s->shape[i] = shape[i];
  }
  s->begin = 0;
  s->end = newt_shape_numel(ndim, shape);
}

void newt_slice_whole(newt_slice *s, const newt_tensor_desc *t) { newt_slice_box(s, t->ndim, NULL, t->shape); }

int64_t newt_slice_numel(const newt_slice *s) { return s->end - s->begin; }

newt_result_t newt_slice_check(const newt_slice *s, const newt_tensor_desc *t, const char *what) {
  if (t->ndim < 1 || t->ndim > NEWT_SLICE_MAX_DIMS)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: tensor \"%s\" has %d dimensions, expected 1 to %d", what, t->name,
                    t->ndim, NEWT_SLICE_MAX_DIMS);
  if (s->ndim != t->ndim)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: slice of %d dimensions for tensor \"%s\" of %d", what, s->ndim,
                    t->name, t->ndim);
  for (int i = 0; i < s->ndim; i++)
    if (s->offset[i] < 0 || s->shape[i] < 1 || s->offset[i] > t->shape[i] - s->shape[i])
      return NEWT_ERR(NEWT_ERR_INVALID, "%s: box dimension %d [%lld, %lld) lies outside tensor \"%s\" "
                      "(size %lld)", what, i, (long long)s->offset[i], (long long)(s->offset[i] + s->shape[i]),
                      t->name, (long long)t->shape[i]);
  int64_t n = newt_shape_numel(s->ndim, s->shape);
  if (s->begin < 0 || s->end <= s->begin || s->end > n)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: range [%lld, %lld) of a box of %lld elements (tensor \"%s\")", what,
                    (long long)s->begin, (long long)s->end, (long long)n, t->name);
  return NEWT_OK;
}

/* Row index (over dims 0..L-1) of global row coordinates r inside slice s's box. */
static int64_t box_row(const newt_slice *s, const int64_t *r, int L) {
  int64_t R = 0;
  for (int i = 0; i < L; i++) R = R * s->shape[i] + (r[i] - s->offset[i]);
  return R;
}

/* Global row coordinates of box row R of slice s. */
static void box_unravel(const newt_slice *s, int64_t R, int L, int64_t *r) {
  for (int i = L - 1; i >= 0; i--) {
    r[i] = s->offset[i] + R % s->shape[i];
    R /= s->shape[i];
  }
}

void newt_slice_row_coords(const newt_slice *s, int64_t row, int64_t *coords) {
  box_unravel(s, row, s->ndim - 1, coords);
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

int64_t newt_slice_copy(const int64_t *shape, size_t es, const newt_slice *D, void *dst, const newt_slice *S,
                        const void *src) {
  (void)shape;
  int d = D->ndim, L = d - 1;
  if (S->ndim != d || d < 1) return 0;
  int64_t lo[NEWT_SLICE_MAX_DIMS], hi[NEWT_SLICE_MAX_DIMS];
  for (int i = 0; i < d; i++) {
    lo[i] = D->offset[i] > S->offset[i] ? D->offset[i] : S->offset[i];
    int64_t a = D->offset[i] + D->shape[i], b = S->offset[i] + S->shape[i];
    hi[i] = a < b ? a : b;
    if (lo[i] >= hi[i]) return 0;
  }
  int64_t slD = D->shape[L], slS = S->shape[L];
  int64_t rD1 = (D->end - 1) / slD, rS1 = (S->end - 1) / slS;
  int64_t gD[NEWT_SLICE_MAX_DIMS], gS[NEWT_SLICE_MAX_DIMS], r[NEWT_SLICE_MAX_DIMS];
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

int newt_slices_may_overlap(const newt_slice *a, const newt_slice *b) {
  return newt_slice_copy(NULL, 0, a, NULL, b, NULL) > 0;
}

/* Whether the slice is one run of the global row-major order: [*start, *start + numel). */
static int global_run(const int64_t *shape, const newt_slice *s, int64_t *start) {
  int64_t row = 1;
  for (int i = 1; i < s->ndim; i++) {
    if (s->offset[i] != 0 || s->shape[i] != shape[i]) return 0;
    row *= shape[i];
  }
  *start = s->offset[0] * row + s->begin;
  return 1;
}

int newt_slice_contiguous_in(const int64_t *shape, const newt_slice *in, const newt_slice *out, int64_t *pos) {
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
  if (a < b || a + newt_slice_numel(in) > b + newt_slice_numel(out)) return 0;
  *pos = a - b;
  return 1;
}

newt_result_t newt_flat_pieces(const newt_slice *boxes, size_t nt, int64_t off, int64_t len,
                               newt_flat_piece *out, size_t cap, size_t *n) {
  *n = 0;
  if (off < 0 || len < 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "flat range [%lld, +%lld): negative", (long long)off, (long long)len);
  int64_t start = 0;
  for (size_t i = 0; i < nt; i++) {
    int64_t numel = newt_shape_numel(boxes[i].ndim, boxes[i].shape);
    int64_t a = off > start ? off : start, b = off + len < start + numel ? off + len : start + numel;
    if (a < b) {
      if (*n >= cap) return NEWT_ERR(NEWT_ERR_INVALID, "flat range [%lld, +%lld): more than %zu pieces",
                                     (long long)off, (long long)len, cap);
      newt_flat_piece *p = &out[(*n)++];
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

