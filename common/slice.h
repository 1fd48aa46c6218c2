/* Slices of global tensors: the vocabulary the model (what a rank holds under a tensor,
 * pipeline, data and ZeRO layout), the checkpoints (what a rank stores and what a reader
 * asks for) and the worker (what ranks send each other when they reshard) share.
 *
 * A tensor is a name, an element type and a global shape (1 to NEWT_SLICE_MAX_DIMS dims).
 * A slice is a box of it (offset[d] .. offset[d] + shape[d], as tensor and pipeline
 * parallelism split it), narrowed to the elements [begin, end) of the box's row-major order
 * (as ZeRO splits a flat buffer). A slice's data is its elements in that order. Rows of the
 * last dimension are contiguous both in a slice's data and in the global tensor, so the
 * operations in slice.c walk rows. Everything here is pure arithmetic on shapes and
 * memory: no I/O, no allocation. */
#ifndef NEWT_COMMON_SLICE_H
#define NEWT_COMMON_SLICE_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/err.h"

#define NEWT_SLICE_MAX_DIMS 8

/* A global tensor: name, element type and global shape (1 to NEWT_SLICE_MAX_DIMS dims). */
typedef struct newt_tensor_desc {
  const char *name;
  newt_dtype dtype;
  int ndim;
  int64_t shape[NEWT_SLICE_MAX_DIMS];
} newt_tensor_desc;

/* A slice of a global tensor: the box offset[d] .. offset[d]+shape[d], narrowed to the
 * elements [begin, end) of the box's row-major order. Data for a slice is its elements in
 * that order, end - begin of them. A whole box has begin = 0, end = its element count. */
typedef struct newt_slice {
  int ndim;
  int64_t offset[NEWT_SLICE_MAX_DIMS];
  int64_t shape[NEWT_SLICE_MAX_DIMS];
  int64_t begin, end;
} newt_slice;

/* The whole box offset/shape (begin 0, end its element count); offset NULL: all zeros. */
void newt_slice_box(newt_slice *s, int ndim, const int64_t *offset, const int64_t *shape);
/* The whole tensor. */
void newt_slice_whole(newt_slice *s, const newt_tensor_desc *t);
/* Elements in the slice (end - begin). */
int64_t newt_slice_numel(const newt_slice *s);
/* Elements of a shape. */
int64_t newt_shape_numel(int ndim, const int64_t *shape);
/* NEWT_ERR_INVALID (naming `what`) unless s is a well-formed slice of t. */
newt_result_t newt_slice_check(const newt_slice *s, const newt_tensor_desc *t, const char *what);

/* Copies the elements two slices of the same tensor (global shape `shape`) have in common,
 * from src (laid out as src_slice) into dst (laid out as dst_slice). Returns the number of
 * elements copied; dst NULL only counts them. This is the resharding primitive: the
 * checkpoint reader uses it, and so does a rank that reshards in memory. */
int64_t newt_slice_copy(const int64_t *shape, size_t esize, const newt_slice *dst_slice, void *dst,
                        const newt_slice *src_slice, const void *src);
/* 1 when the slices share an element. */
int newt_slices_may_overlap(const newt_slice *a, const newt_slice *b);
/* When every element of `inner` sits inside `outer` in the same order as a contiguous run,
 * returns 1 and the element position of that run in outer's data. */
int newt_slice_contiguous_in(const int64_t *shape, const newt_slice *inner, const newt_slice *outer,
                             int64_t *pos);
/* The global coordinates of dims 0 .. ndim-2 of row `row` of s's box (rows of the last
 * dimension, counted in the box's row-major order), into coords. */
void newt_slice_row_coords(const newt_slice *s, int64_t row, int64_t *coords);

/* ZeRO: the flat buffer is the tensors' elements one after another (tensor i's slice
 * `boxes[i]`, whole box, in order). A rank that owns [off, off+len) of it holds, for each
 * tensor the range touches, the piece below. */
typedef struct newt_flat_piece {
  size_t tensor;    /* index into the table */
  newt_slice slice; /* the box boxes[tensor], narrowed to the part in the range */
  int64_t flat_off; /* where that part starts in the flat buffer (elements) */
} newt_flat_piece;
/* Fills out (capacity cap) with the pieces of [off, off+len); *n is the count. */
newt_result_t newt_flat_pieces(const newt_slice *boxes, size_t ntensors, int64_t off, int64_t len,
                               newt_flat_piece *out, size_t cap, size_t *n);

#endif
