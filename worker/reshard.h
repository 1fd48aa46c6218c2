/* In-memory resharding: after a new plan, every rank of the new communicator says which
 * slices of which tensors it holds (and of which step) and which it needs under the new
 * layout; the newest step whose needs are all covered by what the ranks hold wins, and the
 * slices move between ranks over the communicator. A replacement or a joiner is filled
 * from its peers; a layout change (a different data-parallel size re-cutting ZeRO shards,
 * pipeline stages moving) is resharded in memory; only when no step is covered does the
 * caller fall back to a checkpoint.
 *
 * Pieces use the checkpoint's slice algebra (newt_slice: a box of a global tensor,
 * narrowed to a range of its row-major order), so whatever one layout holds can fill any
 * other. Within one step, two held pieces of a tensor must be identical (replicas) or
 * disjoint (shards); that is how layouts cut tensors. */
#ifndef NEWT_WORKER_RESHARD_H
#define NEWT_WORKER_RESHARD_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/ckpt.h"
#include "comm/comm.h"
#include "common/err.h"

#define RESHARD_NAME_MAX 72

typedef struct reshard_piece {
  char name[RESHARD_NAME_MAX]; /* global tensor ("h.0.attn.qkv.w", "adam.m/h.0.attn.qkv.w") */
  int64_t step;                 /* held pieces: the step of their data (a rank may hold pieces
                                   of several steps: its state, a snapshot, a peer's replica);
                                   needed pieces: ignored */
  int ndim;
  int64_t shape[NEWT_SLICE_MAX_DIMS]; /* global shape */
  newt_slice slice;             /* the part held or needed */
  float *data;                  /* its elements in slice order (f32) */
} reshard_piece;

typedef struct reshard_result {
  int64_t step;        /* the step every rank now holds (-1: none covered, see below) */
  int64_t received;    /* elements this rank received from peers */
  int64_t copied;      /* elements this rank copied from its own pieces */
  int source;          /* 0: all from own memory, 1: some from peers */
} reshard_result;

/* Collective over c. `have`: the pieces this rank holds, each of its own step (nhave 0:
 * nothing). On NEWT_OK every need piece of every rank is filled with the data of res->step.
 * NEWT_ERR_NOTFOUND (on every rank, nothing changed) when no step's holdings cover every
 * rank's needs. `have` and `need` may point into the same memory (a rank keeping its
 * pieces). */
newt_result_t reshard_exchange(comm_t *c, const reshard_piece *have, size_t nhave, const reshard_piece *need,
                               size_t nneed, reshard_result *res);

/* Descriptors of pieces as bytes, without their data (to tell a peer what follows):
 * reshard_wire_size(n) bytes; unpacking checks every record and leaves data NULL. */
size_t reshard_wire_size(size_t n);
void reshard_pack(const reshard_piece *p, size_t n, void *buf);
newt_result_t reshard_unpack(const void *buf, size_t len, reshard_piece *out, size_t n);

#endif
