/* The public side of comm/: the argument checks of the interface (they stay in release
 * builds), then one call through the communicator's table of operations (c->ops, picked
 * once per communicator by comm_backend_ops_of). The requests of the *_async calls and
 * the failure record live in core.c; each backend checks what only it reads (the CPU
 * backend its addresses and secret, the types it reduces). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/internal.h"
#include "common/log.h"

/* --- construction ------------------------------------------------------------------- */

newt_result_t comm_create(const comm_config *cfg, comm_t **out) {
  if (!cfg || !out) return NEWT_ERR(NEWT_ERR_INVALID, "comm_create: cfg and out are required");
  *out = NULL;
  if (cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size)
    return NEWT_ERR(NEWT_ERR_INVALID, "comm_config: rank %d of size %d is out of range", cfg->rank, cfg->size);
  if (cfg->timeout_ms <= 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "comm_config.timeout_ms is %lld, expected > 0", (long long)cfg->timeout_ms);
  if (cfg->build_timeout_ms < 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "comm_config.build_timeout_ms is %lld, expected >= 0 (0: the default)",
                    (long long)cfg->build_timeout_ms);
  if (!newt_backend_of(cfg->backend))
    return NEWT_ERR(NEWT_ERR_INVALID, "comm_config.backend %d is not a backend", (int)cfg->backend);
  const comm_backend_ops *ops = comm_backend_ops_of(cfg->backend);
  if (!ops) /* only a GPU backend can be left out */
    return NEWT_ERR(NEWT_ERR_UNSUPPORTED,
                    "comm_create: %s is not built into this newt (built without the CUDA "
                    "toolkit); rebuild with -DNEWT_CUDA=ON where CUDA and NCCL are installed, or use the "
                    "CPU backend", comm_backend_label(cfg->backend));
  /* the backend sets build_timeout_ms from its default when cfg leaves it 0 */
  struct comm *c = comm_obj_new(cfg->backend, ops, cfg->timeout_ms, cfg->build_timeout_ms);
  NEWT_CHECK_ALLOC(c);
  c->rank = cfg->rank;
  c->size = cfg->size;
  newt_result_t res = ops->create(cfg, c);
  if (res != NEWT_OK) {
    comm_obj_release(c);
    return res;
  }
  *out = c;
  return NEWT_OK;
}

newt_result_t comm_split(comm_t *parent, int color, int key, comm_t **out) {
  if (!parent || !out) return NEWT_ERR(NEWT_ERR_INVALID, "comm_split: parent and out are required");
  *out = NULL;
  if (atomic_load(&parent->failed)) return comm_failed_err(parent, "comm_split");
  struct comm *c = comm_obj_new(parent->backend, parent->ops, parent->timeout_ms, parent->build_timeout_ms);
  NEWT_CHECK_ALLOC(c);
  atomic_store(&c->stall_ms, atomic_load(&parent->stall_ms));
  int member = 0;
  newt_result_t res = parent->ops->split(parent, color, key, c, &member);
  if (res == NEWT_OK && member) res = comm_family_link(parent, c);
  if (res != NEWT_OK || !member) {
    if (res != NEWT_OK && member) comm_free(c);
    else comm_obj_release(c);
    return res;
  }
  *out = c;
  return NEWT_OK;
}

newt_result_t comm_shrink(comm_t *c, const int *exclude, int nexclude, uint64_t generation,
                          const unsigned char *secret, size_t secret_len, comm_t **out) {
  if (!c || !out || (nexclude > 0 && !exclude) || nexclude < 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "comm_shrink: communicator, exclude list and out are required");
  *out = NULL;
  if (nexclude >= c->size)
    return NEWT_ERR(NEWT_ERR_INVALID, "comm_shrink: excluding %d of %d ranks leaves none", nexclude, c->size);
  for (int i = 0; i < nexclude; i++) {
    if (exclude[i] < 0 || exclude[i] >= c->size)
      return NEWT_ERR(NEWT_ERR_INVALID, "comm_shrink: exclude[%d] = %d is not a rank of this communicator (size %d)",
                      i, exclude[i], c->size);
    if (exclude[i] == c->rank)
      return NEWT_ERR(NEWT_ERR_INVALID, "comm_shrink: exclude[%d] is this rank (%d); excluded ranks do not call it",
                      i, c->rank);
  }
  for (int i = 0; i < nexclude; i++)
    for (int j = 0; j < i; j++)
      if (exclude[i] == exclude[j])
        return NEWT_ERR(NEWT_ERR_INVALID, "comm_shrink: rank %d is excluded twice (exclude[%d] and exclude[%d])",
                        exclude[i], j, i);
  struct comm *n = comm_obj_new(c->backend, c->ops, c->timeout_ms, c->build_timeout_ms);
  NEWT_CHECK_ALLOC(n);
  atomic_store(&n->stall_ms, atomic_load(&c->stall_ms));
  newt_result_t res = c->ops->shrink(c, exclude, nexclude, generation, secret, secret_len, n);
  if (res != NEWT_OK) {
    comm_obj_release(n);
    return res;
  }
  *out = n;
  return NEWT_OK;
}

newt_result_t comm_set_stream(comm_t *c, void *stream) {
  if (!c) return NEWT_ERR(NEWT_ERR_INVALID, "comm_set_stream: communicator is NULL");
  return c->ops->set_stream ? c->ops->set_stream(c, stream) : NEWT_OK;
}

comm_t *comm_host_channel(comm_t *c) {
  if (!c) return NULL;
  return newt_backend_uses_gpu(newt_backend_of(c->backend)) && c->companion ? c->companion : c;
}

static void set_stall_one(struct comm *c, int64_t ms) {
  int64_t v = ms < 1 ? 1 : ms > c->timeout_ms ? c->timeout_ms : ms;
  atomic_store(&c->stall_ms, v);
}

void comm_set_stall(comm_t *c, int64_t ms) {
  if (!c) return;
  struct comm *members[256];
  int n = comm_family_collect(c, members, (int)(sizeof members / sizeof members[0]));
  if (n == 0) members[n++] = c;
  for (int i = 0; i < n; i++) {
    set_stall_one(members[i], ms);
    if (members[i]->companion) set_stall_one(members[i]->companion, ms);
  }
}

int comm_rank(const comm_t *c) { return c ? c->rank : -1; }
int comm_size(const comm_t *c) { return c ? c->size : 0; }
comm_backend comm_get_backend(const comm_t *c) { return c ? c->backend : COMM_BACKEND_CPU; }

/* --- operations -------------------------------------------------------------------- */

static int sends(comm_kind k) { return k != COMM_OP_RECV && k != COMM_OP_BARRIER; }
static int receives(comm_kind k) { return k != COMM_OP_SEND && k != COMM_OP_BARRIER; }
static int reduces(comm_kind k) { return k == COMM_OP_ALLREDUCE || k == COMM_OP_REDUCE_SCATTER; }

static newt_result_t check_op(struct comm *c, const comm_opdesc *op) {
  const char *what = comm_kind_name(op->kind);
  if (!c) return NEWT_ERR(NEWT_ERR_INVALID, "%s: communicator is NULL", what);
  if (op->kind == COMM_OP_BARRIER) goto state;
  if ((unsigned)op->dt >= NEWT_DTYPE__COUNT) return NEWT_ERR(NEWT_ERR_INVALID, "%s: dtype %d is not a type", what, (int)op->dt);
  if (reduces(op->kind)) {
    if (op->op != COMM_SUM && op->op != COMM_AVG && op->op != COMM_MAX)
      return NEWT_ERR(NEWT_ERR_INVALID, "%s: op %d is not sum, avg or max", what, (int)op->op);
    if (c->ops->check_reduce) NEWT_CHECK(c->ops->check_reduce(op->dt, what));
  }
  size_t es = newt_dtype_size(op->dt);
  size_t blocks = (op->kind == COMM_OP_REDUCE_SCATTER || op->kind == COMM_OP_ALLGATHER) ? (size_t)c->size : 1;
  if (op->count > SIZE_MAX / es / blocks)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: count %zu of %s overflows", what, op->count, newt_dtype_name(op->dt));
  if (op->count > 0 && ((sends(op->kind) && !op->send && !(op->kind == COMM_OP_BROADCAST && op->peer != c->rank)) ||
                        (receives(op->kind) && !op->recv)))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: a buffer is NULL with count %zu", what, op->count);
  if (op->kind == COMM_OP_BROADCAST && (op->peer < 0 || op->peer >= c->size))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: root %d is not a rank (size %d)", what, op->peer, c->size);
  if ((op->kind == COMM_OP_SEND || op->kind == COMM_OP_RECV) &&
      (op->peer < 0 || op->peer >= c->size || op->peer == c->rank))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: peer %d is not another rank (this is rank %d of %d)", what, op->peer,
                    c->rank, c->size);
state:
  if (atomic_load_explicit(&c->failed, memory_order_acquire)) return comm_failed_err(c, what);
  return NEWT_OK;
}

/* Time this thread spent in blocking operations and waits (comm_thread_wait_ns). */
static _Thread_local uint64_t waited_ns;

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t comm_thread_wait_ns(void) { return waited_ns; }

static newt_result_t run(struct comm *c, const comm_opdesc *op) {
  NEWT_CHECK(check_op(c, op));
  uint64_t t0 = mono_ns();
  newt_result_t r = c->ops->run(c, op);
  waited_ns += mono_ns() - t0;
  return r;
}

static newt_result_t submit(struct comm *c, const comm_opdesc *op, comm_req_t **req) {
  if (!req) return NEWT_ERR(NEWT_ERR_INVALID, "%s_async: req is required", comm_kind_name(op->kind));
  *req = NULL;
  NEWT_CHECK(check_op(c, op));
  struct comm_req *r;
  NEWT_CHECK(comm_req_new(c, op, &r));
  newt_result_t res = c->ops->submit(c, r);
  if (res != NEWT_OK) {
    comm_req_untrack(r);
    free(r);
    return res;
  }
  *req = r;
  return NEWT_OK;
}

newt_result_t comm_allreduce(comm_t *c, const void *send, void *recv, size_t count, newt_dtype dt, comm_op op) {
  comm_opdesc d = {.kind = COMM_OP_ALLREDUCE, .send = send, .recv = recv, .count = count, .dt = dt, .op = op};
  return run(c, &d);
}

newt_result_t comm_reduce_scatter(comm_t *c, const void *send, void *recv, size_t recvcount, newt_dtype dt,
                                  comm_op op) {
  comm_opdesc d = {.kind = COMM_OP_REDUCE_SCATTER, .send = send, .recv = recv, .count = recvcount, .dt = dt, .op = op};
  return run(c, &d);
}

newt_result_t comm_allgather(comm_t *c, const void *send, void *recv, size_t sendcount, newt_dtype dt) {
  comm_opdesc d = {.kind = COMM_OP_ALLGATHER, .send = send, .recv = recv, .count = sendcount, .dt = dt};
  return run(c, &d);
}

newt_result_t comm_broadcast(comm_t *c, const void *send, void *recv, size_t count, newt_dtype dt, int root) {
  comm_opdesc d = {.kind = COMM_OP_BROADCAST, .send = send, .recv = recv, .count = count, .dt = dt, .peer = root};
  return run(c, &d);
}

newt_result_t comm_send(comm_t *c, const void *buf, size_t count, newt_dtype dt, int peer) {
  comm_opdesc d = {.kind = COMM_OP_SEND, .send = buf, .count = count, .dt = dt, .peer = peer};
  return run(c, &d);
}

newt_result_t comm_recv(comm_t *c, void *buf, size_t count, newt_dtype dt, int peer) {
  comm_opdesc d = {.kind = COMM_OP_RECV, .recv = buf, .count = count, .dt = dt, .peer = peer};
  return run(c, &d);
}

newt_result_t comm_barrier(comm_t *c) {
  comm_opdesc d = {.kind = COMM_OP_BARRIER, .dt = NEWT_U8};
  return run(c, &d);
}

newt_result_t comm_allreduce_async(comm_t *c, const void *send, void *recv, size_t count, newt_dtype dt,
                                   comm_op op, comm_req_t **req) {
  comm_opdesc d = {.kind = COMM_OP_ALLREDUCE, .send = send, .recv = recv, .count = count, .dt = dt, .op = op};
  return submit(c, &d, req);
}

newt_result_t comm_reduce_scatter_async(comm_t *c, const void *send, void *recv, size_t recvcount,
                                        newt_dtype dt, comm_op op, comm_req_t **req) {
  comm_opdesc d = {.kind = COMM_OP_REDUCE_SCATTER, .send = send, .recv = recv, .count = recvcount, .dt = dt, .op = op};
  return submit(c, &d, req);
}

newt_result_t comm_allgather_async(comm_t *c, const void *send, void *recv, size_t sendcount, newt_dtype dt,
                                   comm_req_t **req) {
  comm_opdesc d = {.kind = COMM_OP_ALLGATHER, .send = send, .recv = recv, .count = sendcount, .dt = dt};
  return submit(c, &d, req);
}

newt_result_t comm_wait(comm_req_t *r) {
  if (!r) return NEWT_ERR(NEWT_ERR_INVALID, "comm_wait: req is NULL");
  struct comm *c = r->c;
  if (c && !atomic_load_explicit(&r->done, memory_order_acquire)) {
    uint64_t t0 = mono_ns();
    c->ops->wait_req(r);
    waited_ns += mono_ns() - t0;
  }
  newt_result_t res = r->result;
  char msg[sizeof r->msg];
  snprintf(msg, sizeof msg, "%s", r->msg);
  comm_kind k = r->op.kind;
  comm_req_untrack(r);
  free(r);
  if (res != NEWT_OK) return NEWT_ERR(res, "%s_async: %s", comm_kind_name(k), msg);
  return NEWT_OK;
}

void comm_abort(comm_t *c) {
  if (!c) return;
  atomic_store(&c->aborted, 1);
  comm_fail(c, NEWT_ERR_ABORTED, -1, 1, "aborted by the application (comm_abort)");
}

void comm_get_status(const comm_t *c, comm_status *st) {
  if (!st) return;
  if (!c) {
    memset(st, 0, sizeof *st);
    st->code = NEWT_ERR_INVALID;
    st->peer = -1;
    snprintf(st->msg, sizeof st->msg, "no communicator");
    return;
  }
  comm_status_copy(c, st);
}

void comm_free(comm_t *c) { comm_obj_destroy(c); }
