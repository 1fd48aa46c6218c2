/* Whether the chunks of a stored tensor cover it exactly once, with work bounded by the
 * number of chunks (never by rows or elements: a manifest is outside data, and a few
 * hundred bytes of it can describe a tensor of 2^31 rows). Also the small helpers the
 * files of ckpt/ share: a growable array and the printing of a shape. The slice geometry
 * itself is common/slice.c.
 *
 * The check: let f(e) be the number of chunks that hold element e. The chunks cover the
 * tensor exactly once when f - 1 is 0 on the tensor. Each chunk's slice is a union of at
 * most 2 * ndim - 1 disjoint boxes (the partial rows at the two ends of its range and the
 * whole blocks between), so f - 1 is a sum of signed boxes: +1 for each of those, -1 for
 * the tensor. A sum of boxes is 0 exactly when its differences along every dimension are,
 * and the difference of a box along dimension k is its two faces: +sign at lo[k], -sign at
 * hi[k]. So, dimension by dimension: the boxes become faces, faces at one coordinate with
 * the same extent in the remaining dimensions are merged (signs summed; neighbouring
 * chunks' faces cancel here), and the faces at each coordinate must cancel in the next
 * dimension, down to single points whose signs must sum to 0. A dimension that every box
 * spans whole is skipped. The cost is a sort of the chunks' boxes per dimension in
 * practice, 2^ndim faces per box at worst.
 *
 * A point whose signs do not cancel has, among its 2^ndim lower neighbours, an element
 * that is held twice or not at all: the message names it and the chunks that hold it, or
 * the run of elements that no chunk holds around it. An index (one rank's chunks) is
 * only checked for its total size here; whether the chunks of all ranks overlap is
 * decided at the commit, where all of them are known. */
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

typedef struct cbox {
  int64_t lo[NEWT_SLICE_MAX_DIMS], hi[NEWT_SLICE_MAX_DIMS];
} cbox;

/* A signed box; while dimension k is worked on, also its face's coordinate x there. */
typedef struct face {
  int64_t x;
  size_t box;
  int64_t sign;
} face;

typedef struct cover {
  int nd;
  const int64_t *shape;
  cbox *boxes;
  size_t nboxes, cap;
  face *lvl[NEWT_SLICE_MAX_DIMS]; /* the faces of dimension k */
  size_t lcap[NEWT_SLICE_MAX_DIMS];
  int64_t corner[NEWT_SLICE_MAX_DIMS]; /* where the signs did not cancel */
  int k;                               /* the dimension face_cmp sorts for */
} cover;

static newt_result_t add_box(cover *c, const int64_t *lo, const int64_t *hi) {
  NEWT_CHECK(CKPT_RESERVE(c->boxes, c->cap, c->nboxes));
  cbox *b = &c->boxes[c->nboxes++];
  memcpy(b->lo, lo, sizeof b->lo);
  memcpy(b->hi, hi, sizeof b->hi);
  return NEWT_OK;
}

/* The elements [b, e) (in row-major order) of the box of slice s over dimensions k.. (the
 * dimensions before k fixed in lo/hi), as boxes: at most 2 (ndim - k) - 1 of them. */
static newt_result_t cut(cover *c, const newt_slice *s, int k, int64_t b, int64_t e, int64_t *lo, int64_t *hi) {
  int64_t inner = 1;
  for (int j = k + 1; j < s->ndim; j++) inner *= s->shape[j];
  int64_t i0 = b / inner, i1 = e / inner, rb = b % inner, re = e % inner;
  int64_t full_lo[NEWT_SLICE_MAX_DIMS], full_hi[NEWT_SLICE_MAX_DIMS];
  if (i0 == i1) { /* inside one block of dimension k */
    lo[k] = s->offset[k] + i0, hi[k] = lo[k] + 1;
    return cut(c, s, k + 1, rb, re, lo, hi);
  }
  if (rb) { /* the partial block at the start */
    lo[k] = s->offset[k] + i0, hi[k] = lo[k] + 1;
    NEWT_CHECK(cut(c, s, k + 1, rb, inner, lo, hi));
    i0++;
  }
  if (i1 > i0) { /* whole blocks */
    memcpy(full_lo, lo, sizeof full_lo);
    memcpy(full_hi, hi, sizeof full_hi);
    full_lo[k] = s->offset[k] + i0, full_hi[k] = s->offset[k] + i1;
    for (int j = k + 1; j < s->ndim; j++) full_lo[j] = s->offset[j], full_hi[j] = s->offset[j] + s->shape[j];
    NEWT_CHECK(add_box(c, full_lo, full_hi));
  }
  if (re) { /* the partial block at the end */
    lo[k] = s->offset[k] + i1, hi[k] = lo[k] + 1;
    NEWT_CHECK(cut(c, s, k + 1, 0, re, lo, hi));
  }
  return NEWT_OK;
}

static int face_cmp(const void *a, const void *b, void *ctx) {
  const face *p = a, *q = b;
  const cover *c = ctx;
  if (p->x != q->x) return p->x < q->x ? -1 : 1;
  const cbox *u = &c->boxes[p->box], *v = &c->boxes[q->box];
  for (int j = c->k + 1; j < c->nd; j++) {
    if (u->lo[j] != v->lo[j]) return u->lo[j] < v->lo[j] ? -1 : 1;
    if (u->hi[j] != v->hi[j]) return u->hi[j] < v->hi[j] ? -1 : 1;
  }
  return 0;
}

/* Whether the signed boxes in[0..n) sum to 0 over dimensions k..: *bad = 1 (and c->corner
 * the point) when not. */
static newt_result_t cancel(cover *c, int k, const face *in, size_t n, int *bad) {
  if (k == c->nd) {
    int64_t sum = 0;
    for (size_t i = 0; i < n; i++) sum += in[i].sign;
    *bad = sum != 0;
    return NEWT_OK;
  }
  int whole = 1; /* every box spans dimension k: its two faces mirror each other */
  for (size_t i = 0; i < n && whole; i++)
    whole = c->boxes[in[i].box].lo[k] == 0 && c->boxes[in[i].box].hi[k] == c->shape[k];
  if (whole) {
    c->corner[k] = 0;
    return cancel(c, k + 1, in, n, bad);
  }
  if (c->lcap[k] < 2 * n) {
    face *nf = realloc(c->lvl[k], 2 * n * sizeof *nf);
    if (!nf) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: %zu faces checking chunk coverage", 2 * n);
    c->lvl[k] = nf;
    c->lcap[k] = 2 * n;
  }
  face *f = c->lvl[k];
  for (size_t i = 0; i < n; i++) {
    const cbox *b = &c->boxes[in[i].box];
    f[2 * i] = (face){b->lo[k], in[i].box, in[i].sign};
    f[2 * i + 1] = (face){b->hi[k], in[i].box, -in[i].sign};
  }
  c->k = k; /* (the recursion below changes it only after the merge) */
  qsort_r(f, 2 * n, sizeof *f, face_cmp, c);
  size_t m = 0;
  for (size_t i = 0; i < 2 * n; i++) { /* merge faces with one key */
    if (m > 0 && face_cmp(&f[m - 1], &f[i], c) == 0) f[m - 1].sign += f[i].sign;
    else f[m++] = f[i];
  }
  for (size_t a = 0; a < m;) {
    size_t b = a, w = a;
    while (b < m && f[b].x == f[a].x) b++;
    for (size_t i = a; i < b; i++)
      if (f[i].sign) f[w++] = f[i];
    c->corner[k] = f[a].x;
    if (w > a) NEWT_CHECK(cancel(c, k + 1, f + a, w - a, bad));
    if (*bad) return NEWT_OK;
    a = b;
  }
  return NEWT_OK;
}

/* 1 when slice s holds the element at global coordinates p. */
static int holds(const newt_slice *s, const int64_t *p) {
  int64_t pos = 0;
  for (int j = 0; j < s->ndim; j++) {
    int64_t l = p[j] - s->offset[j];
    if (l < 0 || l >= s->shape[j]) return 0;
    pos = pos * s->shape[j] + l;
  }
  return pos >= s->begin && pos < s->end;
}

static int64_t flat_index(int nd, const int64_t *shape, const int64_t *p) {
  int64_t v = 0;
  for (int j = 0; j < nd; j++) v = v * shape[j] + p[j];
  return v;
}

/* Of slice s's elements, how many come before the element at p in the tensor's order. */
static int64_t count_before(const newt_slice *s, const int64_t *p) {
  int64_t cnt = 0, inner = newt_shape_numel(s->ndim, s->shape);
  for (int j = 0; j < s->ndim; j++) {
    inner /= s->shape[j];
    int64_t l = p[j] - s->offset[j];
    cnt += (l < 0 ? 0 : l > s->shape[j] ? s->shape[j] : l) * inner;
    if (l < 0 || l >= s->shape[j]) break;
  }
  cnt = cnt < s->begin ? s->begin : cnt > s->end ? s->end : cnt;
  return cnt - s->begin;
}

/* The tensor's flat index of element i of slice s. */
static int64_t flat_of(const newt_slice *s, const int64_t *shape, int64_t i) {
  int64_t p[NEWT_SLICE_MAX_DIMS], pos = s->begin + i;
  for (int j = s->ndim - 1; j >= 0; j--) {
    p[j] = s->offset[j] + pos % s->shape[j];
    pos /= s->shape[j];
  }
  return flat_index(s->ndim, shape, p);
}

/* The message for element p, where f is not 1. */
static newt_result_t report(const ckpt_tensor *t, const int64_t *p, const char *what) {
  int64_t numel = newt_shape_numel(t->ndim, t->shape), e = flat_index(t->ndim, t->shape, p);
  size_t first = 0, held = 0;
  int64_t gap_a = 0, gap_b = numel;
  for (size_t j = 0; j < t->nchunks; j++) {
    const newt_slice *s = &t->chunks[j].slice;
    if (holds(s, p)) {
      if (held++ == 1)
        return NEWT_ERR(NEWT_ERR_INVALID, "%s: chunks %zu and %zu both hold element %lld", what, first, j,
                        (long long)e);
      first = j;
      continue;
    }
    int64_t before = count_before(s, p), n = s->end - s->begin;
    if (before > 0 && flat_of(s, t->shape, before - 1) + 1 > gap_a) gap_a = flat_of(s, t->shape, before - 1) + 1;
    if (before < n && flat_of(s, t->shape, before) < gap_b) gap_b = flat_of(s, t->shape, before);
  }
  if (held == 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: elements [%lld, %lld) of %lld are in no chunk (a rank's slices are "
                    "missing)", what, (long long)gap_a, (long long)gap_b, (long long)numel);
  return NEWT_OK;
}

/* Finds, next to the corner where the signs did not cancel, the element to report. */
static newt_result_t report_near(const cover *c, const ckpt_tensor *t, const char *what) {
  for (unsigned eps = 0; eps < (1u << c->nd); eps++) {
    int64_t p[NEWT_SLICE_MAX_DIMS];
    int in = 1;
    for (int j = 0; j < c->nd && in; j++) {
      p[j] = c->corner[j] - ((eps >> j) & 1);
      in = p[j] >= 0 && p[j] < t->shape[j];
    }
    if (in) NEWT_CHECK(report(t, p, what));
  }
  return NEWT_ERR(NEWT_ERR_INVALID, "%s: the chunks do not cover the tensor exactly once", what);
}

newt_result_t ckpt_coverage_check(const ckpt_tensor *t, int full, const char *what) {
  int64_t numel = newt_shape_numel(t->ndim, t->shape), sum = 0;
  for (size_t j = 0; j < t->nchunks; j++) { /* slices are checked in bounds: no overflow */
    sum += newt_slice_numel(&t->chunks[j].slice);
    if (sum > numel && !full)
      return NEWT_ERR(NEWT_ERR_INVALID, "%s: the chunks hold more than the tensor's %lld elements: some overlap",
                      what, (long long)numel);
    if (sum > numel) break;
  }
  if (!full) return NEWT_OK;
  cover c = {.nd = t->ndim, .shape = t->shape};
  int64_t zero[NEWT_SLICE_MAX_DIMS] = {0}, lo[NEWT_SLICE_MAX_DIMS], hi[NEWT_SLICE_MAX_DIMS];
  face *in = NULL;
  size_t nin = 0, incap = 0;
  int bad = 0;
  newt_result_t r = numel > 0 ? add_box(&c, zero, t->shape) : NEWT_OK; /* the tensor, sign -1 */
  for (size_t j = 0; r == NEWT_OK && j < t->nchunks; j++) {
    const newt_slice *s = &t->chunks[j].slice;
    r = cut(&c, s, 0, s->begin, s->end, lo, hi);
  }
  for (size_t b = 0; r == NEWT_OK && b < c.nboxes; b++) {
    r = CKPT_RESERVE(in, incap, nin);
    if (r == NEWT_OK) in[nin++] = (face){0, b, b == 0 && numel > 0 ? -1 : 1};
  }
  if (r == NEWT_OK && nin > 0) r = cancel(&c, 0, in, nin, &bad);
  if (r == NEWT_OK && bad) r = report_near(&c, t, what);
  for (int k = 0; k < NEWT_SLICE_MAX_DIMS; k++) free(c.lvl[k]);
  free(c.boxes);
  free(in);
  return r;
}
