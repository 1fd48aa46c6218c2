/* What the backends of comm/ share: the communicator object every public call takes, the
 * description of one operation, requests, the failure record (core.c) and the table of
 * operations each backend fills in.
 *
 * Layering: comm.c (the public face: argument checks, then one call through c->ops)
 * picks a backend's table with comm_backend_ops_of (backend.c) and calls core.c; each
 * backend (cpu_comm.c and the files below it, nccl.c) calls core.c; core.c calls no
 * backend by name, only the on_fail of the table stored in the communicator.
 *
 * A failure is recorded once per communicator (the first one wins) under one process-wide
 * lock, and spreads through the split family: a child's failure fails its parent and the
 * parent's its children (peers renumbered, -1 where the peer is not a member). It also
 * spreads to a communicator's companion: the CPU communicator of the same ranks that an
 * NCCL communicator keeps as its control channel (a peer's death seen there fails the
 * NCCL communicator; a failure of the NCCL communicator goes to the peers through it).
 * The backend is told (ops->on_fail) so it can wake its waiters and, for the CPU backend,
 * tell its peers. */
#ifndef NEWT_COMM_INTERNAL_H
#define NEWT_COMM_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"

typedef struct comm_backend_ops comm_backend_ops;

typedef enum comm_kind {
  COMM_OP_ALLREDUCE = 0,
  COMM_OP_REDUCE_SCATTER,
  COMM_OP_ALLGATHER,
  COMM_OP_BROADCAST,
  COMM_OP_SEND,
  COMM_OP_RECV,
  COMM_OP_BARRIER,
} comm_kind;

/* One operation as the caller gave it. count is in elements: the vector for allreduce,
 * broadcast, send and recv; recvcount for reduce-scatter; sendcount for allgather. */
typedef struct comm_opdesc {
  comm_kind kind;
  const void *send;
  void *recv;
  size_t count;
  newt_dtype dt;
  comm_op op;
  int peer; /* root for broadcast, peer for send/recv */
} comm_opdesc;

const char *comm_kind_name(comm_kind k);

struct comm_req {
  struct comm *c;                /* NULL once c was freed */
  const comm_backend_ops *ops;   /* c's backend (still known after c was freed) */
  comm_opdesc op;
  _Atomic uint32_t done; /* futex word: 0 pending, 1 done */
  newt_result_t result;
  char msg[512];
  struct comm_req *next;  /* CPU: the issue-order queue */
  struct comm_req *onext; /* outstanding requests of c (comm_free completes them) */
  uint64_t seq;           /* NCCL: the operation's number on its communicator */
};

struct comm {
  comm_backend backend;
  int rank;
  int size;
  int64_t timeout_ms;       /* the longest an operation may go without progress while every peer
                               answers (one that answers but has not entered it is named then) */
  _Atomic int64_t stall_ms; /* no progress this long: the peers are probed, and one that does not
                               answer is named at once (comm_set_stall; at most timeout_ms) */
  int64_t build_timeout_ms; /* deadline of a build (create, split, shrink) */
  struct comm *parent; /* split parent, NULL for a root */
  int *root_ranks;     /* [size]: each rank's rank in the family's root (the communicator
                          comm_create or comm_shrink made); NULL: unknown (NCCL children) */
  struct comm **children;
  int nchildren;
  int cap_children;
  struct comm *companion; /* the control channel of an NCCL communicator, and back */
  _Atomic int failed;
  _Atomic int aborted;
  comm_status status;           /* under the family lock */
  struct comm_req *outstanding; /* under the family lock */
  const comm_backend_ops *ops; /* the backend's table */
  void *impl;                  /* the backend's own state (cpu_comm, nccl_comm); NULL until built */
};

/* Records c's failure (first one wins) and spreads it through c's family; peer is c's
 * rank that failed (-1: none), the message (the cause) names it. notify: tell c's peers
 * (CPU backend). Returns the recorded code with this thread's error set to the recorded
 * message. */
newt_result_t comm_fail(struct comm *c, newt_result_t code, int peer, int notify, const char *fmt,
                        ...) __attribute__((format(printf, 5, 6)));
/* The same for a failure a peer (our rank `reporter`) told us about; the culprit is a
 * root rank (see root_ranks). */
newt_result_t comm_fail_reported(struct comm *c, newt_result_t code, int culprit_root, int reporter,
                                 const char *cause);
/* Rank translations through root_ranks; -1 when unknown or not a member. */
int comm_to_root(const struct comm *c, int rank);
int comm_to_local(const struct comm *c, int root);

/* The recorded failure as this thread's error ("allreduce: rank 2 ... closed ..."). */
newt_result_t comm_failed_err(struct comm *c, const char *what);

/* A communicator object with no backend state yet (impl NULL), and its release. */
struct comm *comm_obj_new(comm_backend b, const comm_backend_ops *ops, int64_t timeout_ms, int64_t build_timeout_ms);
void comm_obj_release(struct comm *c);
/* Frees c whole: ops->retire, out of its family, ops->free, outstanding requests
 * completed, the object released (comm_free, and a backend freeing its companion). */
void comm_obj_destroy(struct comm *c);

/* Links a new split child under its parent (for failure propagation). */
newt_result_t comm_family_link(struct comm *parent, struct comm *child);
/* Makes a and b companions: each one's failure is the other's. */
void comm_companion_link(struct comm *a, struct comm *b);
/* Takes c out of its family and away from its companion (c is being freed); children still
 * linked are warned about. */
void comm_family_unlink(struct comm *c);
/* Up to cap members of c's family (its root and every descendant, c included) into out;
 * returns how many. The pointers stay valid while no member is freed (the members of one
 * family are freed from one thread, children first). */
int comm_family_collect(struct comm *c, struct comm **out, int cap);
/* c's status, read under the family lock. */
void comm_status_copy(const struct comm *c, comm_status *st);

/* Request bookkeeping: tracked until completed; comm_free completes the rest. */
newt_result_t comm_req_new(struct comm *c, const comm_opdesc *op, struct comm_req **out);
void comm_req_complete(struct comm_req *r, newt_result_t res, const char *msg);
void comm_req_untrack(struct comm_req *r);
/* Completes every outstanding request of c with NEWT_ERR_ABORTED (c is being freed). */
void comm_req_abort_all(struct comm *c);

/* 64-bit FNV-1a, for tags and member hashes. */
uint64_t comm_hash(uint64_t h, const void *data, size_t len);
#define COMM_HASH_INIT 0xcbf29ce484222325ull

/* Futex helpers (process-private). */
void comm_futex_wait(_Atomic uint32_t *addr, uint32_t val, int64_t timeout_ms);
void comm_futex_wake(_Atomic uint32_t *addr);

/* --- the table of a backend's operations ----------------------------------------------
 * One const table per backend (comm_cpu_ops in cpu_comm.c, comm_nccl_ops in nccl.c when
 * built with NEWT_HAVE_CUDA), as NCCL's transports or SQLite's VFS; its name and device are
 * its row of the backend table (common/backend.h), backend.c maps that row to it. comm.c has checked the
 * arguments the interface defines before any entry is called; c->rank, c->size,
 * c->timeout_ms and c->ops are set, c->impl is the backend's to set and clear. */
struct comm_backend_ops {
  /* Builds c from cfg (checking what only this backend reads first); collective. */
  newt_result_t (*create)(const comm_config *cfg, struct comm *c);
  /* comm_split: *member = 1 when child was built (color >= 0); child->rank/size set. */
  newt_result_t (*split)(struct comm *parent, int color, int key, struct comm *child, int *member);
  /* comm_shrink: the survivors' communicator in out; aborts the parent (once the
   * arguments only this backend reads are accepted). */
  newt_result_t (*shrink)(struct comm *parent, const int *exclude, int nexclude, uint64_t generation,
                          const unsigned char *secret, size_t secret_len, struct comm *out);
  /* A blocking operation, and a nonblocking one whose request comm_wait ends. */
  newt_result_t (*run)(struct comm *c, const comm_opdesc *op);
  newt_result_t (*submit)(struct comm *c, struct comm_req *r);
  /* Waits until r is done (r->c is set); the result is r->result. */
  newt_result_t (*wait_req)(struct comm_req *r);
  /* NULL: reduces every type; else fails (naming `what`) for a type it cannot reduce. */
  newt_result_t (*check_reduce)(newt_dtype dt, const char *what);
  /* c failed (under the family lock; see comm_fail): wake waiters, tell peers (notify).
   * Never blocks: no call that may wait runs under the family lock. */
  void (*on_fail)(struct comm *c, newt_result_t code, int culprit_root, const char *cause, int notify);
  /* NULL when none: c is about to be freed, its family still linked (NCCL: a failed
   * family is revoked, every member, before any is aborted). */
  void (*retire)(struct comm *c);
  /* Releases c->impl (the family is already unlinked; outstanding requests are completed
   * by the caller afterwards). */
  void (*free)(struct comm *c);
  /* NULL when the backend has no streams (comm_set_stream is then a no-op). */
  newt_result_t (*set_stream)(struct comm *c, void *stream);
};

/* --- the CPU backend as another backend's control channel (cpu_comm.c) ------------------
 * An NCCL communicator keeps a CPU communicator of the same ranks (its companion) to hand
 * out the unique id, to tell the peers of a failure and to probe them. A probe pings every
 * live peer; each answers, from its progress thread even while idle, with what its hook
 * says (the NCCL backend: operations issued, started and completed on that communicator). */
#define COMM_PROBE_VALUES 3
void comm_cpu_set_probe_hook(struct comm *c, void (*hook)(void *arg, uint64_t out[COMM_PROBE_VALUES]), void *arg);
/* Pings every live peer; returns the probe's number. */
uint32_t comm_cpu_probe(struct comm *c);
/* Peer's answer to probe `seq`: 1 answered (out set), 0 not yet, -1 gone (its connection
 * closed, or it said goodbye). */
int comm_cpu_probe_answer(struct comm *c, int peer, uint32_t seq, uint64_t out[COMM_PROBE_VALUES]);
/* "rank 2 (10.0.0.3:4012)", "rank 1 (world rank 3, 10.0.0.4:4012)" */
const char *comm_cpu_peer_name(struct comm *c, int peer);

extern const comm_backend_ops comm_cpu_ops;
extern const comm_backend_ops comm_nccl_ops; /* defined only with NEWT_HAVE_CUDA */

/* The table of backend b; NULL when b is not built into this newt (backend.c). */
const comm_backend_ops *comm_backend_ops_of(comm_backend b);
/* What messages call backend b ("the NCCL backend"). */
const char *comm_backend_label(comm_backend b);

#endif
