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
 * other. Within one step, two held pieces of a tensor must be identical (replicas),
 * disjoint (shards) or one inside the other; that is how layouts cut tensors. Pieces are
 * of any element type; the bytes move as they are. */
#ifndef NEWT_WORKER_RESHARD_H
#define NEWT_WORKER_RESHARD_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/ckpt.h"
#include "comm/comm.h"
#include "common/dtype.h"
#include "common/err.h"

#define RESHARD_NAME_MAX 72

/* Flags of a piece. */
#define RESHARD_OPTIONAL 1u /* a need that may stay unfilled (nobody holds it at the step chosen):
                               it does not count toward covering a step */
#define RESHARD_DERIVED 2u  /* rebuilt by the program from other pieces (ZeRO 1/2's full parameters): a
                               need like any other, never the copy to save */
#define RESHARD_LOCAL_MASK 0xff00u /* bits the caller keeps for itself: never sent, never read here */

typedef struct reshard_piece {
  char name[RESHARD_NAME_MAX]; /* global tensor ("h.0.attn.qkv.w", "adam.m/h.0.attn.qkv.w") */
  int64_t step;                 /* held pieces: the step of their data (a rank may hold pieces
                                   of several steps: its state, a snapshot, a peer's replica);
                                   needed pieces: ignored */
  newt_dtype dtype;             /* the element type (F32 when zeroed) */
  unsigned flags;               /* RESHARD_* */
  int ndim;
  int64_t shape[NEWT_SLICE_MAX_DIMS]; /* global shape */
  newt_slice slice;             /* the part held or needed */
  void *data;                   /* its elements in slice order */
} reshard_piece;

/* Bytes of a piece's elements. */
static inline size_t reshard_piece_bytes(const reshard_piece *p) {
  return (size_t)newt_slice_numel(&p->slice) * newt_dtype_size(p->dtype);
}

typedef struct reshard_result {
  int64_t step;        /* the step every rank now holds (-1: none covered, see below) */
  int64_t received;    /* elements this rank received from peers */
  int64_t copied;      /* elements this rank copied from its own pieces */
  int source;          /* 0: all from own memory, 1: some from peers */
  int64_t newest;      /* the newest step any rank holds a piece of (-1: none) */
  /* NEWT_ERR_NOTFOUND: the tensors whose needed parts the newest step's pieces do not cover
     ("adam.m/wte, wte, ...": the first few by name; "" when nothing is held), and how many */
  char lost[256];
  int nlost;
} reshard_result;

/* What reshard_exchange works out about the needs of every rank, for the caller (may be
 * NULL; arrays of nneed entries, each may be NULL). */
typedef struct reshard_roles {
  int check;     /* 1: the needs must be a layout: one dtype and shape per tensor across the
                    ranks, and its parts tiling it (every element needed by some rank, two
                    parts equal, disjoint or one inside the other); else NEWT_ERR_INVALID on
                    every rank, naming the tensor and the ranks */
  int *primary;  /* 1 where this rank is the one to save the part: the lowest rank among the
                    ranks needing it, it not inside another part, and not derived */
  int *unique;   /* 1 where no other rank of this rank's group needs this part or one containing
                    it (a ZeRO shard within its data-parallel group) */
  const int *group; /* [ranks of c]: each rank's group (NULL: one group of all); a rank of
                       group -1 (a donor) holds nothing that counts */
  int *filled;   /* 1 where the need was filled (an optional one may not be) */
  int *replicated; /* 1 where every rank of this rank's group (of two or more) needs this very part,
                      not optional: a replica the group's ranks must hold alike */
  int whole;     /* out: every rank needs every (non-optional) tensor whole: plain data
                    parallelism, where the newest state always wins and no copy is needed */
} reshard_roles;

/* Collective over c. `have`: the pieces this rank holds, each of its own step (nhave 0:
 * nothing). On NEWT_OK every need piece of every rank is filled with the data of res->step
 * (optional ones where that step holds them). NEWT_ERR_NOTFOUND (on every rank, nothing
 * changed, the roles still worked out) when no step's holdings cover every rank's needs:
 * res->newest and res->lost then say which step was newest and what it lacks.
 * `have` and `need` may point into the same memory (a rank keeping its pieces). */
newt_result_t reshard_exchange(comm_t *c, const reshard_piece *have, size_t nhave, const reshard_piece *need,
                               size_t nneed, reshard_roles *roles, reshard_result *res);

/* Descriptors of pieces as bytes, without their data (to tell a peer what follows):
 * reshard_wire_size(n) bytes; unpacking checks every record and leaves data NULL. */
size_t reshard_wire_size(size_t n);
void reshard_pack(const reshard_piece *p, size_t n, void *buf);
newt_result_t reshard_unpack(const void *buf, size_t len, reshard_piece *out, size_t n);

#endif
