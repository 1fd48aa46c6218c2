/* The NCCL backend (built only with NEWT_HAVE_CUDA), behind its table of operations
 * comm_nccl_ops (internal.h): the same interface for device buffers, on NCCL's
 * nonblocking communicators so that nothing ever blocks without a deadline and
 * everything can be aborted.
 *
 *  - Communicators are created with config.blocking = 0 (ncclCommInitRankConfig,
 *    ncclCommSplit, ncclCommShrink); any NCCL call may answer ncclInProgress, and then
 *    ncclCommGetAsyncError is polled until it is not, against the deadline and the
 *    communicator's failure flag ("settle").
 *  - An operation is enqueued on the communicator's stream; its completion is a CUDA
 *    event polled with cudaEventQuery, interleaved with ncclCommGetAsyncError, against
 *    timeout_ms and the failure flag. There is no blocking stream synchronisation.
 *  - Failure (an NCCL async error, a CUDA error, the deadline) marks the communicator
 *    failed; every wait then returns. The NCCL handle of a broken communicator is never
 *    finalised or destroyed: comm_abort and comm_free call ncclCommAbort, and comm_shrink
 *    first builds the survivors' communicator with ncclCommShrink(NCCL_SHRINK_ABORT)
 *    (which terminates the parent's in-flight work) and then aborts the parent. A healthy
 *    communicator is freed with ncclCommFinalize (settled) then ncclCommDestroy.
 *  - No two threads are inside an NCCL call on one communicator at once (`api` lock);
 *    comm_abort takes it too, so ncclCommAbort never races another NCCL call.
 *  - NCCL cannot say which peer failed: peer is -1 and the message carries
 *    ncclGetLastError's text. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/internal.h"
#include "common/clock.h"
#include "common/log.h"

struct nccl_comm {
  struct comm *pub;
  ncclComm_t comm; /* NULL once aborted */
  cudaStream_t stream;
  int own_stream;
  int device;
  cudaEvent_t done; /* recorded after each blocking operation */
  void *dbuf;       /* a few device bytes for barrier */
  pthread_mutex_t api;
  int aborted; /* ncclCommAbort was called (under api) */
};

static ncclDataType_t nccl_type(newt_dtype dt) {
  switch (dt) {
    case NEWT_F32: return ncclFloat32;
    case NEWT_BF16: return ncclBfloat16;
    case NEWT_F16: return ncclFloat16;
    case NEWT_I32: return ncclInt32;
    case NEWT_I64: return ncclInt64;
    default: return ncclUint8;
  }
}

static ncclRedOp_t nccl_op(comm_op op) { return op == COMM_AVG ? ncclAvg : op == COMM_MAX ? ncclMax : ncclSum; }

static newt_result_t cuda_fail(struct comm *c, cudaError_t e, const char *what) {
  return comm_fail(c, NEWT_ERR_CUDA, -1, 0, "%s: CUDA error %s (%s)", what, cudaGetErrorName(e),
                   cudaGetErrorString(e));
}

static const char *last_error(struct nccl_comm *n) {
  const char *s = n->comm ? ncclGetLastError(n->comm) : NULL;
  return s && *s ? s : "no detail";
}

/* ncclCommAbort once; the handle is gone afterwards. Never with another NCCL call in flight. */
static void abort_locked(struct nccl_comm *n) {
  if (n->comm && !n->aborted) {
    NEWT_INFO(COMM, "rank %d: ncclCommAbort", n->pub->rank);
    ncclCommAbort(n->comm);
  }
  n->comm = NULL;
  n->aborted = 1;
}

static void abort_now(struct nccl_comm *n) {
  pthread_mutex_lock(&n->api);
  abort_locked(n);
  pthread_mutex_unlock(&n->api);
}

/* A wait ends on a failed communicator; an aborted one also gets its ncclCommAbort now
 * (comm_abort could not, while another NCCL call was in flight). */
static newt_result_t stop_waiting(struct nccl_comm *n, const char *what) {
  if (atomic_load(&n->pub->aborted)) abort_now(n);
  return comm_failed_err(n->pub, what);
}

/* Backs off: spins (yielding) at first, then sleeps up to 200 us. */
static void nap(uint64_t started_ns) {
  uint64_t waited = newt_now_ns() - started_ns;
  if (waited < 100000) sched_yield();
  else newt_sleep_us(waited < 10000000 ? 20 : 200);
}

/* Polls ncclCommGetAsyncError on `comm` until it is not ncclInProgress. */
static newt_result_t settle(struct nccl_comm *n, ncclComm_t comm, newt_deadline_t d, const char *what) {
  uint64_t t0 = newt_now_ns();
  for (;;) {
    if (atomic_load(&n->pub->failed)) return stop_waiting(n, what);
    ncclResult_t state = ncclSuccess;
    pthread_mutex_lock(&n->api);
    ncclResult_t r = n->aborted ? ncclInvalidUsage : ncclCommGetAsyncError(comm, &state);
    pthread_mutex_unlock(&n->api);
    if (r != ncclSuccess)
      return comm_fail(n->pub, NEWT_ERR_NCCL, -1, 0, "%s: ncclCommGetAsyncError: %s", what, ncclGetErrorString(r));
    if (state == ncclSuccess) return NEWT_OK;
    if (state != ncclInProgress)
      return comm_fail(n->pub, NEWT_ERR_NCCL, -1, 0, "%s: NCCL reported %s: %s", what, ncclGetErrorString(state),
                       last_error(n));
    if (newt_deadline_passed(d))
      return comm_fail(n->pub, NEWT_ERR_TIMEOUT, -1, 0,
                       "%s did not complete within %lld ms (a peer stopped, died or did not call it)", what,
                       (long long)n->pub->timeout_ms);
    nap(t0);
  }
}

/* Waits for `ev` (recorded after an operation) against the deadline and the flags. */
static newt_result_t wait_event(struct nccl_comm *n, cudaEvent_t ev, const char *what) {
  newt_deadline_t d = newt_deadline_in_ms(n->pub->timeout_ms);
  uint64_t t0 = newt_now_ns();
  for (;;) {
    if (atomic_load(&n->pub->failed)) return stop_waiting(n, what);
    cudaError_t q = cudaEventQuery(ev);
    if (q != cudaSuccess && q != cudaErrorNotReady) return cuda_fail(n->pub, q, what);
    ncclResult_t state = ncclSuccess;
    pthread_mutex_lock(&n->api);
    ncclResult_t r = n->aborted ? ncclSuccess : ncclCommGetAsyncError(n->comm, &state);
    pthread_mutex_unlock(&n->api);
    if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress))
      return comm_fail(n->pub, NEWT_ERR_NCCL, -1, 0, "%s: NCCL reported %s: %s", what,
                       ncclGetErrorString(r != ncclSuccess ? r : state), last_error(n));
    if (q == cudaSuccess) return NEWT_OK;
    if (newt_deadline_passed(d))
      return comm_fail(n->pub, NEWT_ERR_TIMEOUT, -1, 0,
                       "%s made no progress for %lld ms (a peer stopped, died or did not call it)", what,
                       (long long)n->pub->timeout_ms);
    nap(t0);
  }
}

/* Enqueues op on the stream; settles an ncclInProgress answer. */
static newt_result_t issue(struct nccl_comm *n, const comm_opdesc *op) {
  const char *what = comm_kind_name(op->kind);
  cudaSetDevice(n->device);
  ncclDataType_t t = nccl_type(op->dt);
  pthread_mutex_lock(&n->api);
  if (n->aborted || !n->comm) {
    pthread_mutex_unlock(&n->api);
    return comm_failed_err(n->pub, what);
  }
  ncclResult_t r = ncclSuccess;
  switch (op->kind) {
    case COMM_OP_ALLREDUCE:
      r = ncclAllReduce(op->send, op->recv, op->count, t, nccl_op(op->op), n->comm, n->stream);
      break;
    case COMM_OP_REDUCE_SCATTER:
      r = ncclReduceScatter(op->send, op->recv, op->count, t, nccl_op(op->op), n->comm, n->stream);
      break;
    case COMM_OP_ALLGATHER: r = ncclAllGather(op->send, op->recv, op->count, t, n->comm, n->stream); break;
    case COMM_OP_BROADCAST:
      r = ncclBroadcast(op->send, op->recv, op->count, t, op->peer, n->comm, n->stream);
      break;
    case COMM_OP_SEND: r = ncclSend(op->send, op->count, t, op->peer, n->comm, n->stream); break;
    case COMM_OP_RECV: r = ncclRecv(op->recv, op->count, t, op->peer, n->comm, n->stream); break;
    case COMM_OP_BARRIER: r = ncclAllReduce(n->dbuf, n->dbuf, 1, ncclUint8, ncclSum, n->comm, n->stream); break;
  }
  pthread_mutex_unlock(&n->api);
  if (r == ncclInProgress) return settle(n, n->comm, newt_deadline_in_ms(n->pub->timeout_ms), what);
  if (r == ncclInvalidArgument)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: NCCL refused the arguments: %s", what, last_error(n));
  if (r != ncclSuccess)
    return comm_fail(n->pub, NEWT_ERR_NCCL, -1, 0, "%s: %s: %s", what, ncclGetErrorString(r), last_error(n));
  return NEWT_OK;
}

static newt_result_t nccl_run(struct comm *c, const comm_opdesc *op) {
  struct nccl_comm *n = c->impl;
  if (op->kind != COMM_OP_BARRIER && op->count == 0) return NEWT_OK;
  NEWT_CHECK(issue(n, op));
  cudaError_t e = cudaEventRecord(n->done, n->stream);
  if (e != cudaSuccess) return cuda_fail(c, e, comm_kind_name(op->kind));
  return wait_event(n, n->done, comm_kind_name(op->kind));
}

static newt_result_t nccl_submit(struct comm *c, struct comm_req *r) {
  struct nccl_comm *n = c->impl;
  if (r->op.count > 0) NEWT_CHECK(issue(n, &r->op));
  cudaEvent_t ev;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(ev, n->stream);
  if (e != cudaSuccess) return cuda_fail(c, e, comm_kind_name(r->op.kind));
  r->event = ev;
  return NEWT_OK;
}

static newt_result_t nccl_wait_req(struct comm_req *r) {
  struct nccl_comm *n = r->c->impl;
  cudaSetDevice(n->device);
  newt_result_t res = wait_event(n, (cudaEvent_t)r->event, comm_kind_name(r->op.kind));
  cudaEventDestroy((cudaEvent_t)r->event);
  r->event = NULL;
  comm_req_complete(r, res, res == NEWT_OK ? "" : newt_errmsg());
  return res;
}

static newt_result_t nccl_comm_new(struct comm *pub, int device, void *stream, struct nccl_comm **out) {
  struct nccl_comm *n = calloc(1, sizeof *n);
  NEWT_CHECK_ALLOC(n);
  n->pub = pub;
  n->device = device;
  pthread_mutex_init(&n->api, NULL);
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) {
    if (stream) n->stream = (cudaStream_t)stream;
    else {
      e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
      n->own_stream = e == cudaSuccess;
    }
  }
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&n->done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaMalloc(&n->dbuf, 16);
  if (e != cudaSuccess) {
    if (n->done) cudaEventDestroy(n->done);
    if (n->own_stream) cudaStreamDestroy(n->stream);
    pthread_mutex_destroy(&n->api);
    free(n);
    return NEWT_ERR(NEWT_ERR_CUDA, "setting up the NCCL communicator on device %d: %s", device, cudaGetErrorString(e));
  }
  *out = n;
  return NEWT_OK;
}

static void nccl_comm_release(struct nccl_comm *n) {
  cudaSetDevice(n->device);
  if (n->dbuf) cudaFree(n->dbuf);
  if (n->done) cudaEventDestroy(n->done);
  if (n->own_stream) cudaStreamDestroy(n->stream);
  pthread_mutex_destroy(&n->api);
  free(n);
}

/* Polls a communicator being created (init, split, shrink) without a comm_t yet. */
static newt_result_t settle_new(ncclComm_t comm, newt_deadline_t d, const char *what, int64_t timeout_ms) {
  uint64_t t0 = newt_now_ns();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess) return NEWT_OK;
    if (state != ncclInProgress)
      return NEWT_ERR(NEWT_ERR_NCCL, "%s: %s: %s", what, ncclGetErrorString(state), ncclGetLastError(comm));
    if (newt_deadline_passed(d))
      return NEWT_ERR(NEWT_ERR_TIMEOUT, "%s did not complete within %lld ms (did every rank call it, with the same "
                                        "unique id / exclude list?)", what, (long long)timeout_ms);
    nap(t0);
  }
}

static newt_result_t adopt(struct comm *pub, struct nccl_comm *n, ncclComm_t comm) {
  int rank = -1, size = 0;
  if (ncclCommUserRank(comm, &rank) != ncclSuccess || ncclCommCount(comm, &size) != ncclSuccess) {
    ncclCommAbort(comm);
    return NEWT_ERR(NEWT_ERR_NCCL, "cannot read the new NCCL communicator's rank and size");
  }
  n->comm = comm;
  pub->rank = rank;
  pub->size = size;
  pub->impl = n;
  return NEWT_OK;
}

static ncclConfig_t nonblocking(void) {
  ncclConfig_t conf = NCCL_CONFIG_INITIALIZER;
  conf.blocking = 0;
  return conf;
}

static newt_result_t nccl_create(const comm_config *cfg, struct comm *c) {
  struct nccl_comm *n;
  NEWT_CHECK(nccl_comm_new(c, cfg->device, cfg->stream, &n));
  ncclUniqueId id;
  memcpy(id.internal, cfg->nccl_id, sizeof id.internal);
  ncclConfig_t conf = nonblocking();
  ncclComm_t comm = NULL;
  newt_deadline_t d = newt_deadline_in_ms(cfg->timeout_ms);
  ncclResult_t r = ncclCommInitRankConfig(&comm, cfg->size, id, cfg->rank, &conf);
  newt_result_t res = NEWT_OK;
  if (r != ncclSuccess && r != ncclInProgress)
    res = NEWT_ERR(NEWT_ERR_NCCL, "ncclCommInitRankConfig (rank %d of %d, device %d): %s", cfg->rank, cfg->size,
                   cfg->device, ncclGetErrorString(r));
  else
    res = settle_new(comm, d, "NCCL communicator init", cfg->timeout_ms);
  if (res == NEWT_OK) res = adopt(c, n, comm);
  else if (comm) ncclCommAbort(comm);
  if (res != NEWT_OK) {
    nccl_comm_release(n);
    return res;
  }
  NEWT_INFO(COMM, "rank %d of %d: NCCL communicator on device %d", c->rank, c->size, cfg->device);
  return NEWT_OK;
}

static newt_result_t nccl_split(struct comm *parent, int color, int key, struct comm *child, int *member) {
  struct nccl_comm *p = parent->impl, *n;
  *member = 0;
  NEWT_CHECK(nccl_comm_new(child, p->device, NULL, &n));
  ncclConfig_t conf = nonblocking();
  ncclComm_t comm = NULL;
  newt_deadline_t d = newt_deadline_in_ms(parent->timeout_ms);
  pthread_mutex_lock(&p->api);
  ncclResult_t r = p->aborted ? ncclInvalidUsage
                              : ncclCommSplit(p->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &comm, &conf);
  pthread_mutex_unlock(&p->api);
  newt_result_t res = NEWT_OK;
  if (r != ncclSuccess && r != ncclInProgress) res = comm_fail(parent, NEWT_ERR_NCCL, -1, 0, "ncclCommSplit: %s", ncclGetErrorString(r));
  if (res == NEWT_OK) res = settle(p, p->comm, d, "ncclCommSplit (parent)");
  if (res == NEWT_OK && comm) res = settle_new(comm, d, "ncclCommSplit", parent->timeout_ms);
  if (res == NEWT_OK && comm) res = adopt(child, n, comm);
  else if (comm) ncclCommAbort(comm);
  if (res != NEWT_OK || !comm) {
    nccl_comm_release(n);
    return res;
  }
  *member = 1;
  return NEWT_OK;
}

/* generation and secret are not used: NCCL proves nothing of the kind. */
static newt_result_t nccl_shrink(struct comm *parent, const int *exclude, int nexclude, uint64_t generation,
                                 const unsigned char *secret, size_t secret_len, struct comm *out) {
  (void)generation;
  (void)secret;
  (void)secret_len;
  struct nccl_comm *p = parent->impl, *n;
  NEWT_CHECK(nccl_comm_new(out, p->device, NULL, &n));
  int *ex = malloc(sizeof(int) * (size_t)(nexclude > 0 ? nexclude : 1));
  if (!ex) {
    nccl_comm_release(n);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  }
  memcpy(ex, exclude, sizeof(int) * (size_t)nexclude);
  ncclConfig_t conf = nonblocking();
  ncclComm_t comm = NULL;
  newt_deadline_t d = newt_deadline_in_ms(parent->timeout_ms);
  cudaSetDevice(p->device);
  pthread_mutex_lock(&p->api);
  ncclResult_t r = p->aborted ? ncclInvalidUsage
                              : ncclCommShrink(p->comm, ex, nexclude, &comm, &conf, NCCL_SHRINK_ABORT);
  pthread_mutex_unlock(&p->api);
  free(ex);
  newt_result_t res = NEWT_OK;
  if (p->aborted)
    res = NEWT_ERR(NEWT_ERR_INVALID, "comm_shrink: the NCCL communicator was aborted; build a new one "
                                     "from a fresh unique id (comm_create)");
  else if (r != ncclSuccess && r != ncclInProgress)
    res = NEWT_ERR(NEWT_ERR_NCCL, "ncclCommShrink: %s", ncclGetErrorString(r));
  if (res == NEWT_OK && comm) res = settle_new(comm, d, "ncclCommShrink", parent->timeout_ms);
  if (res == NEWT_OK && comm) res = adopt(out, n, comm);
  else if (comm) ncclCommAbort(comm);
  /* the parent is done with either way: abort it (never finalize a broken one) */
  comm_fail(parent, NEWT_ERR_ABORTED, -1, 0, "aborted by comm_shrink");
  abort_now(p);
  if (res != NEWT_OK || !comm) {
    nccl_comm_release(n);
    return res != NEWT_OK ? res : NEWT_ERR(NEWT_ERR_NCCL, "ncclCommShrink returned no communicator");
  }
  return NEWT_OK;
}

static void nccl_on_fail(struct comm *c, newt_result_t code, int culprit_root, const char *cause,
                         int notify) {
  (void)culprit_root;
  (void)cause;
  (void)notify;
  struct nccl_comm *n = c->impl;
  if (!n || code != NEWT_ERR_ABORTED) return; /* a broken handle stays for comm_shrink or comm_free */
  if (pthread_mutex_trylock(&n->api) == 0) {
    abort_locked(n);
    pthread_mutex_unlock(&n->api);
  }
  /* else a thread is inside a (nonblocking, short) NCCL call; its next poll sees the flag
   * and comm_free aborts the handle */
}

static void nccl_free(struct comm *c) {
  struct nccl_comm *n = c->impl;
  if (!n) return;
  cudaSetDevice(n->device);
  if (!atomic_load(&c->failed) && n->comm) {
    pthread_mutex_lock(&n->api);
    ncclResult_t r = ncclCommFinalize(n->comm);
    pthread_mutex_unlock(&n->api);
    if ((r == ncclSuccess || r == ncclInProgress) &&
        settle(n, n->comm, newt_deadline_in_ms(c->timeout_ms), "ncclCommFinalize") == NEWT_OK) {
      pthread_mutex_lock(&n->api);
      ncclCommDestroy(n->comm);
      n->comm = NULL;
      pthread_mutex_unlock(&n->api);
    }
  }
  abort_now(n); /* a broken (or not finalised) handle: abort, never destroy */
  c->impl = NULL;
  nccl_comm_release(n);
}

static void nccl_event_destroy(void *event) {
  if (event) cudaEventDestroy((cudaEvent_t)event);
}

static newt_result_t nccl_unique_id(unsigned char id[COMM_NCCL_ID_BYTES]) {
  ncclUniqueId u;
  ncclResult_t r = ncclGetUniqueId(&u);
  if (r != ncclSuccess) return NEWT_ERR(NEWT_ERR_NCCL, "ncclGetUniqueId: %s", ncclGetErrorString(r));
  memcpy(id, u.internal, COMM_NCCL_ID_BYTES);
  return NEWT_OK;
}

const comm_backend_ops comm_nccl_ops = {
    .name = "nccl",
    .create = nccl_create,
    .split = nccl_split,
    .shrink = nccl_shrink,
    .run = nccl_run,
    .submit = nccl_submit,
    .wait_req = nccl_wait_req,
    .on_fail = nccl_on_fail,
    .free = nccl_free,
    .unique_id = nccl_unique_id,
    .event_destroy = nccl_event_destroy,
};
