/* The NCCL backend (built only with NEWT_HAVE_CUDA), behind its table of operations
 * comm_nccl_ops (internal.h): the same interface for device buffers, following the recipe
 * NCCL documents for fault tolerance: nonblocking communicators polled against deadlines,
 * a failed family stopped (ncclCommRevoke) before anything is aborted, shrink only where
 * the parent is healthy and otherwise a rebuild from a fresh unique id, no NCCL call that
 * may wait under a lock anyone else needs.
 *
 *  - The control channel. Every NCCL communicator keeps a CPU communicator of the same
 *    ranks (comm_cpu_ops, built from the same comm_config: addresses, hosts, generation,
 *    secret), linked as its companion in the failure record (core.c). Rank 0 makes the
 *    NCCL unique id of each communicator it builds and hands it out over it (never one
 *    reused); a failure recorded anywhere goes to every peer through it (so a peer learns
 *    of an abort, and of the culprit, in milliseconds); a peer that dies is seen there the
 *    moment its connection closes; and a rank that waits too long probes its peers there.
 *    Splits and shrinks split and shrink it too, so every communicator has one.
 *  - Builds (ncclCommInitRankConfig, ncclCommSplit, ncclCommShrink with config.blocking =
 *    0) answer ncclInProgress; the handle of a split or shrink child is written by NCCL
 *    when its background build ends, into a slot that outlives the call (n->pending), and
 *    is read only then. A build polls against its own deadline (build_timeout_ms), the
 *    failure record and comm_config.cancel; when it gives up it stops the parent (revoke),
 *    which ends NCCL's build, and aborts whatever child came out of it.
 *  - Operations are enqueued on the communicator's stream (the caller's: comm_config.stream,
 *    inherited by children, comm_set_stream) between two events: `start` completes when the
 *    stream reaches the operation (the work before it done), `done` when it completed. A
 *    wait polls them, ncclCommGetAsyncError and the failure record. Progress is an
 *    operation issued, started or completed; after timeout_ms without any, the peers are
 *    probed over the control channel: one that does not answer is named (stopped or hung);
 *    one that answers but has neither entered the operation nor moved on since the last
 *    probe is named as such; if every peer is in the operation and nothing moves, NCCL
 *    itself is stuck (peer -1). An NCCL call refused on a nonblocking communicator is its
 *    async error: the communicator is failed (NCCL would fail every later call anyway).
 *  - Failure. comm_fail records it (no NCCL call: on_fail does nothing but let the waiters
 *    see the flag, and the companion tells the peers). The thread that meets a failure in
 *    a wait, comm_free (ops->retire) and comm_shrink revoke every NCCL communicator of the
 *    family (ncclCommRevoke stops in-flight work, so no abort or cudaFree waits on a
 *    sibling's kernel stuck on a dead peer: NVIDIA/nccl #549); comm_free then calls
 *    ncclCommAbort with no lock held but the communicator's own. A healthy communicator is
 *    freed with ncclCommFinalize (settled) and ncclCommDestroy.
 *  - No two of our threads are inside an NCCL call on one communicator at once (`api`). */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/internal.h"
#include "comm/nccl_lib.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/param.h"

#if NCCL_VERSION_CODE < NEWT_NCCL_MIN_CODE
#error "newt's NCCL backend needs NCCL 2.28.7 or newer (ncclCommRevoke, ncclCommShrink)"
#endif

NEWT_PARAM(CommNcclBuildMs, "NEWT_COMM_NCCL_BUILD_MS", 120000) /* default build deadline */

#define FAMILY_MAX 64

typedef struct nccl_inflight {
  uint64_t seq;
  uint64_t t_issue;
  cudaEvent_t start, done;
  int started;
} nccl_inflight;

struct nccl_comm {
  struct comm *pub;
  struct comm *ctl;  /* the control channel: a CPU communicator of the same ranks */
  ncclComm_t comm;   /* NULL once aborted */
  ncclComm_t pending; /* where NCCL writes a split or shrink child (read when its build ended) */
  cudaStream_t stream;
  cudaStream_t own; /* the stream of our own, when the caller gave none */
  int device;
  void *dbuf; /* the device's barrier bytes (barrier_bytes) */
  const atomic_int *cancel;
  pthread_mutex_t api;
  int revoked; /* ncclCommRevoke called (under api) */
  /* operations in flight, in issue order (under ops_mu; the probe hook reads them too) */
  pthread_mutex_t ops_mu;
  nccl_inflight *ring;
  size_t cap, head, count;
  cudaEvent_t pool[32];
  int npool;
  uint64_t last_event; /* when an operation last started or completed (ns) */
  _Atomic uint64_t issued, started, completed;
  /* operations up to this one completed before the revoke: the ones after it only stopped
   * (their events complete when revoked work ends early); UINT64_MAX until revoked */
  _Atomic uint64_t good_upto;
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

static ncclRedOp_t nccl_redop(comm_op op) { return op == COMM_AVG ? ncclAvg : op == COMM_MAX ? ncclMax : ncclSum; }

static ncclConfig_t nonblocking(void) {
  ncclConfig_t conf = NCCL_CONFIG_INITIALIZER;
  conf.blocking = 0;
  return conf;
}

static const char *last_error(void) {
  const char *s = nccl_api.GetLastError(NULL);
  return s && *s ? s : "no detail";
}

static newt_result_t cuda_fail(struct comm *c, cudaError_t e, const char *what) {
  return comm_fail(c, NEWT_ERR_CUDA, -1, 1, "%s: CUDA error %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

/* Backs off: yields at first, then sleeps 20 us, then 200 us. */
static void nap(uint64_t started_ns) {
  uint64_t waited = newt_now_ns() - started_ns;
  if (waited < 100000) sched_yield();
  else newt_sleep_us(waited < 10000000 ? 20 : 200);
}

static uint64_t probe_window_ns(int64_t timeout_ms) {
  int64_t ms = timeout_ms / 4;
  return (uint64_t)(ms < 200 ? 200 : ms > 2000 ? 2000 : ms) * 1000000ull; /* cpu_link.c's probe_ns */
}

/* --- stopping a family -------------------------------------------------------------------- */

static int poll_ops(struct nccl_comm *n, cudaError_t *e);

/* ncclCommRevoke once: in-flight work stops, the state goes ncclInProgress until quiet. */
static void revoke(struct nccl_comm *n) {
  pthread_mutex_lock(&n->api);
  if (n->comm && !n->revoked) {
    cudaSetDevice(n->device);
    cudaError_t e;
    pthread_mutex_lock(&n->ops_mu);
    poll_ops(n, &e);
    atomic_store(&n->good_upto, atomic_load(&n->completed));
    pthread_mutex_unlock(&n->ops_mu);
    ncclResult_t r = nccl_api.CommRevoke(n->comm, NCCL_REVOKE_DEFAULT);
    n->revoked = 1;
    NEWT_INFO(COMM, "rank %d: ncclCommRevoke: %s", n->pub->rank, nccl_api.GetErrorString(r));
  }
  pthread_mutex_unlock(&n->api);
}

/* Revokes every NCCL communicator of c's family, before any of them is aborted or any of
 * their buffers freed. No lock is held across the calls. */
static void stop_family(struct comm *c) {
  struct comm *members[FAMILY_MAX];
  int k = comm_family_collect(c, members, FAMILY_MAX);
  for (int i = 0; i < k; i++)
    if (members[i]->ops == &comm_nccl_ops && members[i]->impl) revoke(members[i]->impl);
}

/* A wait ends on a failed communicator: its family is stopped first. */
static newt_result_t stop_waiting(struct nccl_comm *n, const char *what) {
  stop_family(n->pub);
  return comm_failed_err(n->pub, what);
}

/* --- probing the peers over the control channel --------------------------------------------- */

/* Under ops_mu: an operation's events back to the pool (or destroyed when it is full). */
static void pool_put(struct nccl_comm *n, const nccl_inflight *op) {
  if (n->npool + 2 <= (int)(sizeof n->pool / sizeof n->pool[0])) {
    n->pool[n->npool++] = op->start;
    n->pool[n->npool++] = op->done;
  } else {
    cudaEventDestroy(op->start);
    cudaEventDestroy(op->done);
  }
}

/* Under ops_mu: notes the operations that started or completed; a CUDA error in e. */
static int poll_ops(struct nccl_comm *n, cudaError_t *e) {
  int moved = 0;
  *e = cudaSuccess;
  while (n->count) {
    nccl_inflight *op = &n->ring[n->head];
    if (!op->started) {
      cudaError_t q = cudaEventQuery(op->start);
      if (q == cudaSuccess) {
        op->started = 1;
        atomic_fetch_add(&n->started, 1);
        moved = 1;
      } else if (q != cudaErrorNotReady) {
        *e = q;
        break;
      }
    }
    cudaError_t q = cudaEventQuery(op->done);
    if (q == cudaErrorNotReady) break;
    if (q != cudaSuccess) {
      *e = q;
      break;
    }
    if (!op->started) atomic_fetch_add(&n->started, 1); /* done: started too */
    pool_put(n, op);
    n->head = (n->head + 1) % n->cap;
    n->count--;
    atomic_fetch_add(&n->completed, 1);
    moved = 1;
  }
  if (moved) n->last_event = newt_now_ns();
  return moved;
}

/* The probe hook: what this rank tells a peer that probes it (the control channel's
 * progress thread calls it): operations issued, started and completed. */
static void probe_state(void *arg, uint64_t out[COMM_PROBE_VALUES]) {
  struct nccl_comm *n = arg;
  cudaSetDevice(n->device);
  pthread_mutex_lock(&n->ops_mu);
  cudaError_t e;
  poll_ops(n, &e);
  pthread_mutex_unlock(&n->ops_mu);
  out[0] = atomic_load(&n->issued);
  out[1] = atomic_load(&n->started);
  out[2] = atomic_load(&n->completed);
}

#define PROBE_PEERS 64

typedef struct probe {
  int active, rounds;
  uint32_t seq;
  uint64_t until;
  uint64_t since; /* the first round since the last progress began (monotonic ns) */
  uint64_t prev[PROBE_PEERS][COMM_PROBE_VALUES]; /* the previous round's answers */
} probe;

/* Starts a probe round. */
static void probe_start(struct nccl_comm *n, probe *p) {
  p->active = 1;
  p->seq = comm_cpu_probe(n->ctl);
  if (p->rounds == 0) p->since = newt_now_ns();
  p->until = newt_now_ns() + probe_window_ns(atomic_load(&n->pub->stall_ms));
}

/* Evaluates a probe round made because nothing moved for timeout_ms while operation
 * `head` (the oldest in flight) waited; `started`: this rank's stream reached it. Returns
 * 0 while the round goes on, 1 when it shows progress (restart the clock), -1 when the
 * communicator is failed, naming who held it up:
 *  - a peer whose control connection closed, or that does not answer (stopped, hung);
 *  - this rank, when its own stream has not reached the operation for two rounds;
 *  - a peer that has not reached it for two rounds, its counters still;
 *  - nobody (-1) when every rank is in it and nothing moves: NCCL itself is stuck. */
static int probe_verdict(struct nccl_comm *n, probe *p, uint64_t head, int started, const char *what,
                         newt_result_t *res) {
  struct comm *c = n->pub;
  int silent = -1, gone = -1, behind = -1, moved = 0;
  for (int q = 0; q < c->size; q++) {
    if (q == c->rank) continue;
    uint64_t ans[COMM_PROBE_VALUES];
    int a = comm_cpu_probe_answer(n->ctl, q, p->seq, ans);
    if (a < 0 && gone < 0) gone = q;
    if (a == 0 && silent < 0) silent = q;
    if (a != 1) continue;
    if (q < PROBE_PEERS) {
      if (p->rounds > 0 && memcmp(ans, p->prev[q], sizeof ans) != 0) moved = 1;
      memcpy(p->prev[q], ans, sizeof ans);
    }
    if (ans[1] < head && behind < 0) behind = q;
  }
  if ((silent >= 0 || gone >= 0) && newt_now_ns() < p->until) return 0; /* wait for the answers */
  p->active = 0;
  p->rounds++;
  long long ms = (long long)atomic_load(&c->stall_ms);
  if (gone >= 0) { /* it said goodbye (freed its communicator), or died unnoticed so far */
    *res = comm_fail(c, NEWT_ERR_PEER, gone, 1, "%s left (its control connection is closed) while this rank waited in %s",
                     comm_cpu_peer_name(n->ctl, gone), what);
    return -1;
  }
  if (silent >= 0) {
    *res = comm_fail(c, NEWT_ERR_TIMEOUT, silent, 1,
                     "%s made no progress for %lld ms during %s and did not answer a probe (stopped or hung)",
                     comm_cpu_peer_name(n->ctl, silent), ms, what);
    return -1;
  }
  /* everyone alive: another period while something moved, and until the cap (timeout_ms)
     since the first round, whatever the stall deadline: a slow step is not a hang */
  if (moved || p->rounds == 1 || newt_now_ns() - p->since < (uint64_t)c->timeout_ms * 1000000ull) return 1;
  ms = (long long)((newt_now_ns() - p->since) / 1000000ull) + ms;
  if (!started)
    *res = comm_fail(c, NEWT_ERR_TIMEOUT, c->rank, 1,
                     "rank %d: its stream has not reached %s for %lld ms (the work queued before it is still "
                     "running, or hung)", c->rank, what, ms);
  else if (behind >= 0)
    *res = comm_fail(c, NEWT_ERR_TIMEOUT, behind, 1,
                     "%s is alive but has not reached %s (operation %llu of this communicator) for %lld ms",
                     comm_cpu_peer_name(n->ctl, behind), what, (unsigned long long)head, ms);
  else
    *res = comm_fail(c, NEWT_ERR_TIMEOUT, -1, 1,
                     "every rank is in %s and alive, but it made no progress for %lld ms (NCCL did not complete it)",
                     what, ms);
  return -1;
}

/* NCCL reported an error (ncclRemoteError, ncclSystemError, ...): a peer that died is seen
 * on the control channel as its connection closes, and named; otherwise the error is
 * NCCL's. */
static newt_result_t async_failure(struct nccl_comm *n, ncclResult_t state, const char *what) {
  char detail[256];
  snprintf(detail, sizeof detail, "%s", last_error());
  probe p = {0};
  probe_start(n, &p);
  uint64_t until = newt_now_ns() + probe_window_ns(atomic_load(&n->pub->stall_ms)), t0 = newt_now_ns();
  int silent = -1;
  while (newt_now_ns() < until) {
    if (atomic_load(&n->pub->failed)) return stop_waiting(n, what); /* named by the channel */
    silent = -1;
    for (int q = 0; q < n->pub->size && silent < 0; q++) {
      uint64_t ans[COMM_PROBE_VALUES];
      if (q != n->pub->rank && comm_cpu_probe_answer(n->ctl, q, p.seq, ans) != 1) silent = q;
    }
    if (silent < 0) break;
    nap(t0);
  }
  if (atomic_load(&n->pub->failed)) return stop_waiting(n, what);
  newt_result_t r;
  if (silent >= 0)
    r = comm_fail(n->pub, NEWT_ERR_PEER, silent, 1, "NCCL reported %s during %s (%s); %s does not answer",
                  nccl_api.GetErrorString(state), what, detail, comm_cpu_peer_name(n->ctl, silent));
  else
    r = comm_fail(n->pub, NEWT_ERR_NCCL, -1, 1, "%s: NCCL reported %s: %s (every peer answers on the control channel)",
                  what, nccl_api.GetErrorString(state), detail);
  stop_family(n->pub);
  return r;
}

/* --- operations --------------------------------------------------------------------------- */

/* The async state of n's communicator (ncclSuccess once aborted). */
static ncclResult_t async_state(struct nccl_comm *n) {
  ncclResult_t state = ncclSuccess;
  pthread_mutex_lock(&n->api);
  ncclResult_t r = n->comm ? nccl_api.CommGetAsyncError(n->comm, &state) : ncclSuccess;
  pthread_mutex_unlock(&n->api);
  return r != ncclSuccess ? r : state;
}

/* Waits until operation `seq` of n completed. The clock runs from the last progress: this
 * operation issued, or an operation of n started or completed; after timeout_ms without,
 * the peers are probed (probe_verdict). */
static newt_result_t wait_op(struct nccl_comm *n, uint64_t seq, const char *what) {
  struct comm *c = n->pub;
  uint64_t t0 = newt_now_ns();
  probe p = {0};
  newt_result_t res = NEWT_OK;
  for (;;) {
    int failed = atomic_load_explicit(&c->failed, memory_order_acquire);
    cudaError_t e;
    pthread_mutex_lock(&n->ops_mu);
    int moved = poll_ops(n, &e);
    int done = atomic_load(&n->completed) >= seq;
    uint64_t from = n->last_event, head = 0;
    int head_started = 0;
    if (!done && n->count) {
      const nccl_inflight *h = &n->ring[n->head];
      head = h->seq;
      head_started = h->started;
      if (seq >= h->seq) {
        const nccl_inflight *op = &n->ring[(n->head + (seq - h->seq)) % n->cap];
        if (op->t_issue > from) from = op->t_issue;
      }
    }
    pthread_mutex_unlock(&n->ops_mu);
    if (done && seq <= atomic_load(&n->good_upto)) return NEWT_OK; /* it completed, whatever happened since */
    if (failed || done) return stop_waiting(n, what);
    if (e != cudaSuccess) {
      cuda_fail(c, e, what);
      return stop_waiting(n, what);
    }
    if (moved) p.rounds = 0;
    ncclResult_t state = async_state(n);
    if (state != ncclSuccess && state != ncclInProgress) return async_failure(n, state, what);
    uint64_t now = newt_now_ns();
    if (p.active) {
      int v = probe_verdict(n, &p, head, head_started, what, &res);
      if (v < 0) return stop_waiting(n, what);
      if (v > 0) { /* the peers are alive (or moved on): another period */
        pthread_mutex_lock(&n->ops_mu);
        n->last_event = now;
        pthread_mutex_unlock(&n->ops_mu);
      }
    } else if (now - from > (uint64_t)atomic_load(&c->stall_ms) * 1000000ull) {
      NEWT_INFO(COMM, "rank %d: no progress in %s for %lld ms: probing the peers", c->rank, what,
                (long long)((now - from) / 1000000ull));
      probe_start(n, &p);
    }
    nap(t0);
  }
}

/* Polls ncclCommGetAsyncError on `h` until it is not ncclInProgress: a build (init,
 * split, shrink: cancellable), or a management call (revoke, finalize). */
static newt_result_t settle(struct nccl_comm *n, ncclComm_t h, newt_deadline_t d, int build, const char *what,
                            ncclResult_t *state) {
  struct comm *c = n->pub;
  uint64_t t0 = newt_now_ns();
  *state = ncclInProgress;
  for (;;) {
    if (atomic_load(&c->failed)) return comm_failed_err(c, what);
    if (build && n->cancel && atomic_load(n->cancel))
      return comm_fail(c, NEWT_ERR_ABORTED, -1, 1, "%s cancelled (a newer plan made it moot)", what);
    pthread_mutex_lock(&n->api);
    ncclResult_t r = nccl_api.CommGetAsyncError(h, state);
    pthread_mutex_unlock(&n->api);
    if (r != ncclSuccess) *state = r;
    if (*state != ncclInProgress) return NEWT_OK;
    if (newt_deadline_passed(d)) {
      if (!build) return NEWT_ERR(NEWT_ERR_TIMEOUT, "%s did not complete in time", what);
      /* name a peer that does not answer, if one does not */
      probe p = {0};
      probe_start(n, &p);
      while (newt_now_ns() < p.until && !atomic_load(&c->failed)) newt_sleep_ms(1);
      int silent = -1;
      for (int q = 0; q < c->size && silent < 0; q++) {
        uint64_t ans[COMM_PROBE_VALUES];
        if (q != c->rank && comm_cpu_probe_answer(n->ctl, q, p.seq, ans) != 1) silent = q;
      }
      if (atomic_load(&c->failed)) return comm_failed_err(c, what);
      if (silent >= 0)
        return comm_fail(c, NEWT_ERR_TIMEOUT, silent, 1, "%s did not complete within %lld ms: %s does not answer", what,
                         (long long)c->build_timeout_ms, comm_cpu_peer_name(n->ctl, silent));
      return comm_fail(c, NEWT_ERR_TIMEOUT, -1, 1,
                       "%s did not complete within %lld ms (every peer answers: did every rank call it, with the same "
                       "arguments?)", what, (long long)c->build_timeout_ms);
    }
    nap(t0);
  }
}

/* Takes the next operation's slot (events from the pool); under ops_mu. */
static nccl_inflight *op_slot(struct nccl_comm *n) {
  if (n->count == n->cap) {
    size_t cap = n->cap ? n->cap * 2 : 16;
    nccl_inflight *ring = malloc(sizeof *ring * cap);
    if (!ring) return NULL;
    for (size_t i = 0; i < n->count; i++) ring[i] = n->ring[(n->head + i) % n->cap];
    free(n->ring);
    n->ring = ring;
    n->cap = cap;
    n->head = 0;
  }
  nccl_inflight *op = &n->ring[(n->head + n->count) % n->cap];
  memset(op, 0, sizeof *op);
  cudaError_t e = cudaSuccess;
  if (n->npool >= 2) {
    op->done = n->pool[--n->npool];
    op->start = n->pool[--n->npool];
  } else {
    e = cudaEventCreateWithFlags(&op->start, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming);
    if (e != cudaSuccess && op->start) cudaEventDestroy(op->start);
  }
  return e == cudaSuccess ? op : NULL;
}

/* Enqueues op on the stream between its two events; *seq is its number. */
static newt_result_t issue(struct nccl_comm *n, const comm_opdesc *op, uint64_t *seq) {
  struct comm *c = n->pub;
  const char *what = comm_kind_name(op->kind);
  cudaSetDevice(n->device);
  ncclDataType_t t = nccl_type(op->dt);
  pthread_mutex_lock(&n->api);
  if (!n->comm || n->revoked) {
    pthread_mutex_unlock(&n->api);
    return comm_failed_err(c, what);
  }
  pthread_mutex_lock(&n->ops_mu);
  nccl_inflight *slot = op_slot(n);
  pthread_mutex_unlock(&n->ops_mu);
  if (!slot) {
    pthread_mutex_unlock(&n->api);
    return NEWT_ERR(NEWT_ERR_CUDA, "%s: no CUDA event for the operation", what);
  }
  cudaError_t e = cudaEventRecord(slot->start, n->stream);
  ncclResult_t r = ncclSuccess;
  if (e == cudaSuccess) {
    switch (op->kind) {
      case COMM_OP_ALLREDUCE:
        r = nccl_api.AllReduce(op->send, op->recv, op->count, t, nccl_redop(op->op), n->comm, n->stream);
        break;
      case COMM_OP_REDUCE_SCATTER:
        r = nccl_api.ReduceScatter(op->send, op->recv, op->count, t, nccl_redop(op->op), n->comm, n->stream);
        break;
      case COMM_OP_ALLGATHER: r = nccl_api.AllGather(op->send, op->recv, op->count, t, n->comm, n->stream); break;
      case COMM_OP_BROADCAST:
        r = nccl_api.Broadcast(op->send, op->recv, op->count, t, op->peer, n->comm, n->stream);
        break;
      case COMM_OP_SEND: r = nccl_api.Send(op->send, op->count, t, op->peer, n->comm, n->stream); break;
      case COMM_OP_RECV: r = nccl_api.Recv(op->recv, op->count, t, op->peer, n->comm, n->stream); break;
      case COMM_OP_BARRIER: r = nccl_api.AllReduce(n->dbuf, n->dbuf, 1, ncclUint8, ncclSum, n->comm, n->stream); break;
    }
  }
  pthread_mutex_unlock(&n->api);
  if (e == cudaSuccess && r == ncclInProgress) { /* enqueued once the state is ncclSuccess */
    ncclResult_t state;
    newt_result_t s = settle(n, n->comm, newt_deadline_in_ms(c->timeout_ms), 0, what, &state);
    if (s != NEWT_OK && !atomic_load(&c->failed))
      comm_fail(c, NEWT_ERR_TIMEOUT, -1, 1, "%s: NCCL did not take the operation within %lld ms", what,
                (long long)c->timeout_ms);
    r = s != NEWT_OK ? ncclInProgress : state;
  }
  if (e == cudaSuccess && r == ncclSuccess) e = cudaEventRecord(slot->done, n->stream);
  if (e != cudaSuccess || r != ncclSuccess) {
    pthread_mutex_lock(&n->ops_mu);
    pool_put(n, slot);
    pthread_mutex_unlock(&n->ops_mu);
    if (atomic_load(&c->failed)) return stop_waiting(n, what);
    if (e != cudaSuccess) {
      cuda_fail(c, e, what);
      return stop_waiting(n, what);
    }
    /* on a nonblocking communicator the refusal is its async error (enqueue.cc): dead */
    comm_fail(c, NEWT_ERR_NCCL, -1, 1, "%s: NCCL refused or failed the operation: %s: %s", what,
              nccl_api.GetErrorString(r), last_error());
    return stop_waiting(n, what);
  }
  pthread_mutex_lock(&n->ops_mu);
  slot->seq = atomic_fetch_add(&n->issued, 1) + 1;
  slot->t_issue = newt_now_ns();
  n->count++;
  *seq = slot->seq;
  pthread_mutex_unlock(&n->ops_mu);
  return NEWT_OK;
}

static newt_result_t nccl_run(struct comm *c, const comm_opdesc *op) {
  struct nccl_comm *n = c->impl;
  if (op->kind != COMM_OP_BARRIER && op->count == 0) return NEWT_OK;
  uint64_t seq;
  NEWT_CHECK(issue(n, op, &seq));
  return wait_op(n, seq, comm_kind_name(op->kind));
}

static newt_result_t nccl_submit(struct comm *c, struct comm_req *r) {
  struct nccl_comm *n = c->impl;
  r->seq = 0; /* nothing to wait for */
  if (r->op.count > 0) NEWT_CHECK(issue(n, &r->op, &r->seq));
  return NEWT_OK;
}

static newt_result_t nccl_wait_req(struct comm_req *r) {
  struct nccl_comm *n = r->c->impl;
  newt_result_t res = r->seq ? wait_op(n, r->seq, comm_kind_name(r->op.kind)) : NEWT_OK;
  comm_req_complete(r, res, res == NEWT_OK ? "" : newt_errmsg());
  return res;
}

/* --- construction --------------------------------------------------------------------------- */

/* A few bytes of device memory per device for comm_barrier, allocated once and kept: a
 * communicator freed never calls cudaFree, which would wait for the whole device (work of
 * other communicators included). Returns a CUDA error, or cudaSuccess with *out set. */
static cudaError_t barrier_bytes(int device, void **out) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  static void *bytes[64];
  if (device < 0 || device >= 64) return cudaErrorInvalidDevice;
  cudaError_t e = cudaSuccess;
  pthread_mutex_lock(&mu);
  if (!bytes[device]) e = cudaMalloc(&bytes[device], 16);
  *out = bytes[device];
  pthread_mutex_unlock(&mu);
  return e;
}

static newt_result_t nccl_comm_new(struct comm *pub, int device, void *stream, const atomic_int *cancel,
                                   struct nccl_comm **out) {
  struct nccl_comm *n = calloc(1, sizeof *n);
  NEWT_CHECK_ALLOC(n);
  n->pub = pub;
  n->device = device;
  n->cancel = cancel;
  n->last_event = newt_now_ns();
  atomic_store(&n->good_upto, UINT64_MAX);
  pthread_mutex_init(&n->api, NULL);
  pthread_mutex_init(&n->ops_mu, NULL);
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) {
    if (stream) n->stream = (cudaStream_t)stream;
    else if ((e = cudaStreamCreateWithFlags(&n->own, cudaStreamNonBlocking)) == cudaSuccess) n->stream = n->own;
  }
  if (e == cudaSuccess) e = barrier_bytes(device, &n->dbuf);
  if (e != cudaSuccess) {
    if (n->own) cudaStreamDestroy(n->own);
    pthread_mutex_destroy(&n->api);
    pthread_mutex_destroy(&n->ops_mu);
    free(n);
    return NEWT_ERR(NEWT_ERR_CUDA, "setting up the NCCL communicator on device %d: %s (%s)", device,
                    cudaGetErrorName(e), cudaGetErrorString(e));
  }
  *out = n;
  return NEWT_OK;
}

/* Releases n and its control channel; the NCCL handle is already gone. */
static void nccl_comm_release(struct nccl_comm *n) {
  if (n->ctl) {
    comm_obj_destroy(n->ctl);
    n->ctl = NULL;
  }
  cudaSetDevice(n->device);
  for (size_t i = 0; i < n->count; i++) {
    cudaEventDestroy(n->ring[(n->head + i) % n->cap].start);
    cudaEventDestroy(n->ring[(n->head + i) % n->cap].done);
  }
  for (int i = 0; i < n->npool; i++) cudaEventDestroy(n->pool[i]);
  free(n->ring);
  if (n->own) cudaStreamDestroy(n->own);
  pthread_mutex_destroy(&n->api);
  pthread_mutex_destroy(&n->ops_mu);
  free(n);
}

/* Aborts a handle (blocking in NCCL: never under a lock anyone else takes). */
static void abort_handle(ncclComm_t h, int rank) {
  if (!h) return;
  NEWT_INFO(COMM, "rank %d: ncclCommAbort", rank);
  nccl_api.CommAbort(h);
}

/* An empty CPU communicator object for pub's control channel, which comm_cpu_ops.create,
 * .split or .shrink (of the parent's channel) then builds. */
static struct comm *ctl_new(struct comm *pub) {
  return comm_obj_new(COMM_BACKEND_CPU, &comm_cpu_ops, pub->timeout_ms, pub->build_timeout_ms);
}

/* n's channel is ctl; pub gets its rank, size and root ranks (before the channel can
 * deliver a failure to it). */
static newt_result_t attach_ctl(struct comm *pub, struct nccl_comm *n, struct comm *ctl) {
  n->ctl = ctl;
  pub->rank = ctl->rank;
  pub->size = ctl->size;
  free(pub->root_ranks);
  pub->root_ranks = malloc(sizeof(int) * (size_t)ctl->size);
  if (!pub->root_ranks) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a communicator of %d ranks", ctl->size);
  for (int r = 0; r < ctl->size; r++) pub->root_ranks[r] = ctl->root_ranks ? ctl->root_ranks[r] : r;
  comm_cpu_set_probe_hook(ctl, probe_state, n);
  comm_companion_link(pub, ctl);
  return NEWT_OK;
}

/* The new NCCL handle h is n's, once its rank and size agree with the channel's. */
static newt_result_t adopt(struct comm *pub, struct nccl_comm *n, ncclComm_t h) {
  int rank = -1, size = 0;
  if (nccl_api.CommUserRank(h, &rank) != ncclSuccess || nccl_api.CommCount(h, &size) != ncclSuccess)
    return comm_fail(pub, NEWT_ERR_NCCL, -1, 1, "cannot read the new NCCL communicator's rank and size: %s",
                     last_error());
  if (rank != n->ctl->rank || size != n->ctl->size)
    return comm_fail(pub, NEWT_ERR_INTERNAL, -1, 1,
                     "the NCCL communicator is rank %d of %d, its control channel rank %d of %d", rank, size,
                     n->ctl->rank, n->ctl->size);
  n->comm = h;
  pub->impl = n;
  return NEWT_OK;
}

/* ncclCommInitRankConfig of n over its channel's ranks, from a unique id rank 0 makes
 * and hands out over the channel. */
static newt_result_t init_from_fresh_id(struct nccl_comm *n, newt_deadline_t d, const char *what) {
  struct comm *pub = n->pub, *ctl = n->ctl;
  unsigned char id_bytes[NCCL_UNIQUE_ID_BYTES] = {0};
  if (ctl->rank == 0) {
    ncclUniqueId u;
    ncclResult_t r = nccl_api.GetUniqueId(&u);
    if (r != ncclSuccess)
      return comm_fail(pub, NEWT_ERR_NCCL, -1, 1, "ncclGetUniqueId: %s: %s", nccl_api.GetErrorString(r), last_error());
    memcpy(id_bytes, u.internal, sizeof id_bytes);
  }
  comm_opdesc bc = {.kind = COMM_OP_BROADCAST, .send = id_bytes, .recv = id_bytes, .count = sizeof id_bytes,
                    .dt = NEWT_U8, .peer = 0};
  newt_result_t res = comm_cpu_ops.run(ctl, &bc);
  if (res != NEWT_OK) return atomic_load(&pub->failed) ? comm_failed_err(pub, what) : res;
  ncclUniqueId id;
  memcpy(id.internal, id_bytes, sizeof id.internal);
  ncclConfig_t conf = nonblocking();
  ncclComm_t h = NULL;
  cudaSetDevice(n->device);
  ncclResult_t r = nccl_api.CommInitRankConfig(&h, ctl->size, id, ctl->rank, &conf);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (h) abort_handle(h, ctl->rank);
    return comm_fail(pub, NEWT_ERR_NCCL, -1, 1, "%s: ncclCommInitRankConfig (rank %d of %d, device %d): %s: %s", what,
                     ctl->rank, ctl->size, n->device, nccl_api.GetErrorString(r), last_error());
  }
  ncclResult_t state;
  res = settle(n, h, d, 1, what, &state);
  if (res == NEWT_OK && state != ncclSuccess)
    res = comm_fail(pub, NEWT_ERR_NCCL, -1, 1, "%s: %s: %s", what, nccl_api.GetErrorString(state), last_error());
  if (res == NEWT_OK) res = adopt(pub, n, h);
  if (res != NEWT_OK) abort_handle(h, ctl->rank);
  return res;
}

static newt_result_t nccl_create(const comm_config *cfg, struct comm *c) {
  if (cfg->device < 0) return NEWT_ERR(NEWT_ERR_INVALID, "comm_config.device is %d, expected >= 0", cfg->device);
  NEWT_CHECK(nccl_lib_load()); /* the first NCCL communicator of the process loads NCCL */
  int64_t build = cfg->build_timeout_ms > 0 ? cfg->build_timeout_ms : newt_param_CommNcclBuildMs();
  if (build < cfg->timeout_ms && cfg->build_timeout_ms <= 0) build = cfg->timeout_ms;
  c->build_timeout_ms = build;
  newt_deadline_t d = newt_deadline_in_ms(build);
  /* the control channel first: the same configuration, as a CPU communicator */
  comm_config tc = *cfg;
  tc.backend = COMM_BACKEND_CPU;
  tc.build_timeout_ms = build;
  struct comm *ctl = ctl_new(c);
  NEWT_CHECK_ALLOC(ctl);
  ctl->rank = cfg->rank;
  ctl->size = cfg->size;
  newt_result_t res = comm_cpu_ops.create(&tc, ctl);
  if (res != NEWT_OK) {
    comm_obj_release(ctl);
    return res;
  }
  struct nccl_comm *n;
  res = nccl_comm_new(c, cfg->device, cfg->stream, cfg->cancel, &n);
  if (res != NEWT_OK) {
    comm_obj_destroy(ctl);
    return res;
  }
  res = attach_ctl(c, n, ctl);
  if (res == NEWT_OK) res = init_from_fresh_id(n, d, "NCCL communicator init");
  if (res != NEWT_OK) {
    c->impl = NULL;
    nccl_comm_release(n);
    return res;
  }
  NEWT_INFO(COMM, "rank %d of %d: NCCL communicator of generation %llu on device %d", c->rank, c->size,
            (unsigned long long)cfg->generation, cfg->device);
  return NEWT_OK;
}

/* After ncclCommSplit / ncclCommShrink answered r: waits for the parent's background
 * build to end, then for the child NCCL wrote into n->pending (*child). `watch` is the
 * communicator whose failure record, cancel flag and control channel the wait follows (the
 * parent for a split; the new communicator for a shrink, the parent being retired). When
 * the wait gives up, the parent is stopped (split: its family revoked; shrink: the retired
 * parent aborted), which ends NCCL's build: only then is the child slot final. */
static newt_result_t settle_child(struct nccl_comm *watch, struct nccl_comm *p, struct nccl_comm *n, ncclResult_t r,
                                  newt_deadline_t d, const char *what, ncclComm_t *child) {
  struct comm *c = watch->pub;
  *child = NULL;
  newt_result_t res = NEWT_OK;
  if (r != ncclSuccess && r != ncclInProgress)
    res = comm_fail(c, NEWT_ERR_NCCL, -1, 1, "%s: %s: %s", what, nccl_api.GetErrorString(r), last_error());
  ncclResult_t state = ncclSuccess;
  if (res == NEWT_OK) res = settle(watch, p->comm, d, 1, what, &state);
  if (res == NEWT_OK && state != ncclSuccess)
    res = comm_fail(c, NEWT_ERR_NCCL, -1, 1, "%s: %s: %s", what, nccl_api.GetErrorString(state), last_error());
  if (res == NEWT_OK) {
    *child = __atomic_load_n(&n->pending, __ATOMIC_ACQUIRE);
    if (*child) res = settle(watch, *child, d, 1, what, &state); /* ready once the build ended */
    if (res == NEWT_OK && *child && state != ncclSuccess)
      res = comm_fail(c, NEWT_ERR_NCCL, -1, 1, "%s (the new communicator): %s: %s", what, nccl_api.GetErrorString(state),
                      last_error());
  }
  if (res != NEWT_OK) {
    if (watch == p) {
      stop_family(p->pub);
    } else {
      pthread_mutex_lock(&p->api);
      abort_handle(p->comm, p->pub->rank);
      p->comm = NULL;
      pthread_mutex_unlock(&p->api);
    }
    *child = __atomic_load_n(&n->pending, __ATOMIC_ACQUIRE);
  }
  return res;
}

static newt_result_t nccl_split(struct comm *parent, int color, int key, struct comm *child, int *member) {
  struct nccl_comm *p = parent->impl, *n;
  *member = 0;
  NEWT_CHECK(nccl_comm_new(child, p->device, p->stream, p->cancel, &n));
  newt_deadline_t d = newt_deadline_in_ms(parent->build_timeout_ms);
  ncclConfig_t conf = nonblocking();
  cudaSetDevice(p->device);
  pthread_mutex_lock(&p->api);
  ncclResult_t r = p->comm && !p->revoked
                       ? nccl_api.CommSplit(p->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &n->pending, &conf)
                       : ncclInvalidUsage;
  pthread_mutex_unlock(&p->api);
  ncclComm_t h = NULL;
  newt_result_t res = settle_child(p, p, n, r, d, "ncclCommSplit", &h);
  /* the control channel, split the same way (ranks ordered by key, then parent rank, as NCCL) */
  struct comm *ctl = NULL;
  int ctl_member = 0;
  if (res == NEWT_OK) {
    ctl = ctl_new(child);
    if (!ctl) res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory splitting a communicator");
    else res = comm_cpu_ops.split(p->ctl, color, key, ctl, &ctl_member);
    if (res != NEWT_OK && !atomic_load(&parent->failed))
      comm_fail(parent, res, -1, 1, "splitting the control channel: %s", newt_errmsg());
    if (res != NEWT_OK) {
      res = comm_failed_err(parent, "comm_split");
      stop_family(parent);
    }
  }
  if (res == NEWT_OK && (ctl_member != 0) != (h != NULL))
    res = comm_fail(parent, NEWT_ERR_INTERNAL, -1, 1, "split: NCCL and the control channel disagree on membership");
  if (res == NEWT_OK && h) {
    res = attach_ctl(child, n, ctl);
    ctl = NULL;
    if (res == NEWT_OK) res = adopt(child, n, h);
  }
  if (res != NEWT_OK || !h) {
    if (ctl && ctl_member) comm_obj_destroy(ctl);
    else if (ctl) comm_obj_release(ctl);
    child->impl = NULL;
    abort_handle(res != NEWT_OK ? h : NULL, parent->rank);
    nccl_comm_release(n);
    return res;
  }
  *member = 1;
  return NEWT_OK;
}

static newt_result_t nccl_shrink(struct comm *parent, const int *exclude, int nexclude, uint64_t generation,
                                 const unsigned char *secret, size_t secret_len, struct comm *out) {
  struct nccl_comm *p = parent->impl, *n;
  if (!secret) return NEWT_ERR(NEWT_ERR_INVALID, "comm_shrink: the secret of the new generation is required");
  if (secret_len < 16 || secret_len > COMM_SECRET_MAX)
    return NEWT_ERR(NEWT_ERR_INVALID, "comm shrink secret_len is %zu, expected 16 to %d bytes", secret_len,
                    COMM_SECRET_MAX);
  NEWT_CHECK(nccl_comm_new(out, p->device, p->stream, p->cancel, &n));
  newt_deadline_t d = newt_deadline_in_ms(parent->build_timeout_ms);
  /* 1. the old communicator stops: a failed family whole, a healthy parent alone */
  if (atomic_load(&parent->failed)) stop_family(parent);
  else revoke(p);
  ncclResult_t state = ncclInternalError;
  pthread_mutex_lock(&p->api);
  if (p->comm) {
    uint64_t t0 = newt_now_ns();
    while (nccl_api.CommGetAsyncError(p->comm, &state) == ncclSuccess && state == ncclInProgress &&
           !newt_deadline_passed(d)) {
      pthread_mutex_unlock(&p->api);
      nap(t0);
      pthread_mutex_lock(&p->api);
    }
  }
  pthread_mutex_unlock(&p->api);
  int healthy = state == ncclSuccess;
  /* 2. the survivors' control channel (it retires the parent's, and so the parent) */
  struct comm *ctl = ctl_new(out);
  if (!ctl) {
    nccl_comm_release(n);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory shrinking a communicator");
  }
  newt_result_t res = comm_cpu_ops.shrink(p->ctl, exclude, nexclude, generation, secret, secret_len, ctl);
  if (res != NEWT_OK) {
    comm_obj_release(ctl);
    nccl_comm_release(n);
    return res;
  }
  res = attach_ctl(out, n, ctl);
  /* 3. ncclCommShrink only where every survivor's communicator is healthy once revoked;
   * otherwise (an async error, nobody excluded) a new one from a fresh unique id */
  int32_t rebuild = !healthy || nexclude == 0, any = 0;
  comm_opdesc ar = {.kind = COMM_OP_ALLREDUCE, .send = &rebuild, .recv = &any, .count = 1, .dt = NEWT_I32,
                    .op = COMM_MAX};
  if (res == NEWT_OK) res = comm_cpu_ops.run(ctl, &ar);
  if (res == NEWT_OK && !any) {
    int *ex = malloc(sizeof(int) * (size_t)nexclude);
    if (!ex) res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory shrinking a communicator");
    ncclComm_t h = NULL;
    if (res == NEWT_OK) {
      memcpy(ex, exclude, sizeof(int) * (size_t)nexclude);
      ncclConfig_t conf = nonblocking();
      cudaSetDevice(p->device);
      pthread_mutex_lock(&p->api);
      ncclResult_t r = p->comm ? nccl_api.CommShrink(p->comm, ex, nexclude, &n->pending, &conf, NCCL_SHRINK_DEFAULT)
                               : ncclInvalidUsage;
      pthread_mutex_unlock(&p->api);
      free(ex);
      res = settle_child(n, p, n, r, d, "ncclCommShrink", &h);
      if (res == NEWT_OK && !h) res = NEWT_ERR(NEWT_ERR_NCCL, "ncclCommShrink gave no communicator");
      if (res == NEWT_OK) res = adopt(out, n, h);
      if (res != NEWT_OK) abort_handle(h, out->rank);
    }
    if (res == NEWT_OK)
      NEWT_INFO(COMM, "rank %d of %d: shrunk (ncclCommShrink) to generation %llu", out->rank, out->size,
                (unsigned long long)generation);
  } else if (res == NEWT_OK) {
    res = init_from_fresh_id(n, d, "comm_shrink (a new NCCL communicator of the survivors)");
    if (res == NEWT_OK)
      NEWT_INFO(COMM, "rank %d of %d: shrunk to generation %llu by a rebuild from a fresh unique id (%s)", out->rank,
                out->size, (unsigned long long)generation,
                nexclude == 0 ? "nobody excluded" : "NCCL reported an error on a survivor's communicator");
  }
  if (res != NEWT_OK) {
    out->impl = NULL;
    nccl_comm_release(n);
    return res;
  }
  return NEWT_OK;
}

/* --- failure, free, streams ---------------------------------------------------------------- */

static void nccl_on_fail(struct comm *c, newt_result_t code, int culprit_root, const char *cause, int notify) {
  /* under the family lock: nothing that may wait. The waiters see c->failed; the peers
   * are told through the companion (the control channel); the family is revoked by the
   * thread that meets the failure, by comm_free and by comm_shrink. */
  (void)c;
  (void)code;
  (void)culprit_root;
  (void)cause;
  (void)notify;
}

static void nccl_retire(struct comm *c) {
  if (atomic_load(&c->failed)) stop_family(c);
}

static void nccl_free(struct comm *c) {
  struct nccl_comm *n = c->impl;
  if (!n) return;
  cudaSetDevice(n->device);
  pthread_mutex_lock(&n->api);
  if (!atomic_load(&c->failed) && n->comm && !n->revoked) {
    ncclResult_t r = nccl_api.CommFinalize(n->comm);
    pthread_mutex_unlock(&n->api);
    ncclResult_t state = r;
    if (r == ncclSuccess || r == ncclInProgress)
      settle(n, n->comm, newt_deadline_in_ms(c->timeout_ms), 0, "ncclCommFinalize", &state);
    pthread_mutex_lock(&n->api);
    if (state == ncclSuccess && nccl_api.CommDestroy(n->comm) == ncclSuccess) n->comm = NULL;
  }
  /* a broken, revoked or unfinished handle: abort, never destroy */
  abort_handle(n->comm, c->rank);
  n->comm = NULL;
  pthread_mutex_unlock(&n->api);
  c->impl = NULL;
  nccl_comm_release(n);
}

static newt_result_t nccl_set_stream(struct comm *c, void *stream) {
  struct nccl_comm *n = c->impl;
  if (!stream && !n->own) {
    cudaSetDevice(n->device);
    cudaError_t e = cudaStreamCreateWithFlags(&n->own, cudaStreamNonBlocking);
    if (e != cudaSuccess)
      return NEWT_ERR(NEWT_ERR_CUDA, "comm_set_stream: a stream of its own: %s", cudaGetErrorString(e));
  }
  pthread_mutex_lock(&n->api);
  n->stream = stream ? (cudaStream_t)stream : n->own;
  pthread_mutex_unlock(&n->api);
  return NEWT_OK;
}

const comm_backend_ops comm_nccl_ops = {
    .create = nccl_create,
    .split = nccl_split,
    .shrink = nccl_shrink,
    .run = nccl_run,
    .submit = nccl_submit,
    .wait_req = nccl_wait_req,
    .on_fail = nccl_on_fail,
    .retire = nccl_retire,
    .free = nccl_free,
    .set_stream = nccl_set_stream,
};
