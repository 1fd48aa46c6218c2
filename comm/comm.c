/* The public side of comm/: argument checks that stay in release builds, dispatch to
 * the CPU backend (cpu_*.c) or the NCCL backend (nccl.c), requests of the *_async
 * calls, and the failure record of every communicator and its split family. */
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "comm/internal.h"
#include "comm/reduce.h"
#include "common/log.h"

/* Guards every communicator's status, family links and outstanding requests. */
static pthread_mutex_t family_lock = PTHREAD_MUTEX_INITIALIZER;

const char *comm_kind_name(comm_kind k) {
  static const char *const names[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                      "send",      "recv",           "barrier"};
  return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "operation";
}

uint64_t comm_hash(uint64_t h, const void *data, size_t len) {
  const unsigned char *p = data;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

void comm_futex_wait(_Atomic uint32_t *addr, uint32_t val, int64_t timeout_ms) {
  struct timespec ts = {(time_t)(timeout_ms / 1000), (long)(timeout_ms % 1000) * 1000000L};
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
}

void comm_futex_wake(_Atomic uint32_t *addr) {
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* --- failures ------------------------------------------------------------------------ */

int comm_to_root(const struct comm *c, int rank) {
  return rank >= 0 && rank < c->size && c->root_ranks ? c->root_ranks[rank] : -1;
}

int comm_to_local(const struct comm *c, int root) {
  for (int i = 0; root >= 0 && c->root_ranks && i < c->size; i++)
    if (c->root_ranks[i] == root) return i;
  return -1;
}

static void backend_on_fail(struct comm *c, newt_result_t code, int root, const char *cause, int notify) {
  if (c->backend == COMM_BACKEND_CPU) cpu_on_fail(c, code, root, cause, notify);
#ifdef NEWT_HAVE_CUDA
  else nccl_on_fail(c, code, root, cause, notify);
#endif
}

/* Under family_lock. The culprit is a root rank; `from` is the relative the failure came
 * from (not told again); relatives record the same cause. */
static void fail_one(struct comm *c, struct comm *from, newt_result_t code, int root, const char *cause,
                     const char *suffix, int notify) {
  if (atomic_load(&c->failed)) return;
  c->status.code = code;
  c->status.peer = comm_to_local(c, root);
  snprintf(c->status.msg, sizeof c->status.msg, "%s%s%s%s%s", cause, suffix ? " (" : "", suffix ? suffix : "",
           suffix ? ")" : "", from ? " (seen in a related communicator)" : "");
  if (code == NEWT_ERR_ABORTED) atomic_store(&c->aborted, 1);
  atomic_store_explicit(&c->failed, 1, memory_order_release);
  if (code == NEWT_ERR_ABORTED) NEWT_INFO(COMM, "rank %d of %d: %s", c->rank, c->size, c->status.msg);
  else NEWT_WARN(COMM, "rank %d of %d: communicator failed: %s", c->rank, c->size, c->status.msg);
  backend_on_fail(c, code, root, cause, notify);
  if (c->parent && c->parent != from) fail_one(c->parent, c, code, root, cause, NULL, 1);
  for (int i = 0; i < c->nchildren; i++)
    if (c->children[i] != from) fail_one(c->children[i], c, code, root, cause, NULL, 1);
}

static newt_result_t record(struct comm *c, newt_result_t code, int root, const char *cause, const char *suffix,
                            int notify) {
  comm_status st;
  pthread_mutex_lock(&family_lock);
  fail_one(c, NULL, code, root, cause, suffix, notify);
  st = c->status;
  pthread_mutex_unlock(&family_lock);
  return NEWT_ERR(st.code, "%s", st.msg);
}

newt_result_t comm_fail(struct comm *c, newt_result_t code, int peer, int notify, const char *fmt, ...) {
  char cause[sizeof c->status.msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cause, sizeof cause, fmt, ap);
  va_end(ap);
  return record(c, code, comm_to_root(c, peer), cause, NULL, notify);
}

newt_result_t comm_fail_reported(struct comm *c, newt_result_t code, int culprit_root, int reporter,
                                 const char *cause) {
  char by[48];
  snprintf(by, sizeof by, "reported by rank %d", reporter);
  return record(c, code, culprit_root, cause, by, 0);
}

newt_result_t comm_failed_err(struct comm *c, const char *what) {
  comm_status st;
  pthread_mutex_lock(&family_lock);
  st = c->status;
  pthread_mutex_unlock(&family_lock);
  return NEWT_ERR(st.code, "%s: the communicator has failed: %s", what ? what : "operation", st.msg);
}

newt_result_t comm_family_link(struct comm *parent, struct comm *child) {
  newt_result_t res = NEWT_OK;
  pthread_mutex_lock(&family_lock);
  if (parent->nchildren == parent->cap_children) {
    int cap = parent->cap_children ? parent->cap_children * 2 : 4;
    struct comm **ch = realloc(parent->children, (size_t)cap * sizeof *ch);
    if (!ch) res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory linking a split communicator");
    else {
      parent->children = ch;
      parent->cap_children = cap;
    }
  }
  if (res == NEWT_OK) {
    parent->children[parent->nchildren++] = child;
    child->parent = parent;
  }
  pthread_mutex_unlock(&family_lock);
  return res;
}

/* --- requests ------------------------------------------------------------------------- */

newt_result_t comm_req_new(struct comm *c, const comm_opdesc *op, struct comm_req **out) {
  struct comm_req *r = calloc(1, sizeof *r);
  NEWT_CHECK_ALLOC(r);
  r->c = c;
  r->op = *op;
  pthread_mutex_lock(&family_lock);
  r->onext = c->outstanding;
  c->outstanding = r;
  pthread_mutex_unlock(&family_lock);
  *out = r;
  return NEWT_OK;
}

void comm_req_complete(struct comm_req *r, newt_result_t res, const char *msg) {
  r->result = res;
  snprintf(r->msg, sizeof r->msg, "%s", msg ? msg : "");
  atomic_store_explicit(&r->done, 1, memory_order_release);
  comm_futex_wake(&r->done);
}

void comm_req_untrack(struct comm_req *r) {
  pthread_mutex_lock(&family_lock);
  if (r->c) {
    for (struct comm_req **p = &r->c->outstanding; *p; p = &(*p)->onext)
      if (*p == r) {
        *p = r->onext;
        break;
      }
  }
  r->c = NULL;
  pthread_mutex_unlock(&family_lock);
}

void comm_req_abort_all(struct comm *c) {
  pthread_mutex_lock(&family_lock);
  for (struct comm_req *r = c->outstanding; r; r = r->onext) {
    if (!atomic_load(&r->done))
      comm_req_complete(r, NEWT_ERR_ABORTED, "the communicator was freed before the operation completed");
    r->c = NULL;
  }
  c->outstanding = NULL;
  pthread_mutex_unlock(&family_lock);
}

/* --- construction ------------------------------------------------------------------- */

static newt_result_t check_cpu_config(const comm_config *cfg) {
  if (!cfg->addrs || !cfg->hosts)
    return NEWT_ERR(NEWT_ERR_INVALID, "comm_config: the CPU backend needs addrs and hosts for every rank");
  for (int r = 0; r < cfg->size; r++) {
    if (!cfg->addrs[r] || !cfg->addrs[r][0])
      return NEWT_ERR(NEWT_ERR_INVALID, "comm_config.addrs[%d] is missing", r);
    if (!cfg->hosts[r] || !cfg->hosts[r][0])
      return NEWT_ERR(NEWT_ERR_INVALID, "comm_config.hosts[%d] is missing", r);
    if (strlen(cfg->addrs[r]) > 90)
      return NEWT_ERR(NEWT_ERR_INVALID, "comm_config.addrs[%d] \"%.40s...\" is too long", r, cfg->addrs[r]);
    for (int q = 0; q < r; q++)
      if (strcmp(cfg->addrs[q], cfg->addrs[r]) == 0)
        return NEWT_ERR(NEWT_ERR_INVALID, "comm_config.addrs[%d] and addrs[%d] are both \"%s\"", q, r,
                        cfg->addrs[r]);
  }
  return NEWT_OK;
}

static newt_result_t check_secret(size_t len) {
  if (len < 16 || len > COMM_SECRET_MAX)
    return NEWT_ERR(NEWT_ERR_INVALID, "comm secret_len is %zu, expected 16 to %d bytes", len, COMM_SECRET_MAX);
  return NEWT_OK;
}

static struct comm *comm_alloc(comm_backend b, int64_t timeout_ms) {
  struct comm *c = calloc(1, sizeof *c);
  if (c) {
    c->backend = b;
    c->timeout_ms = timeout_ms;
    c->status.peer = -1;
  }
  return c;
}

static void comm_release(struct comm *c) {
  free(c->root_ranks);
  free(c->children);
  free(c);
}

newt_result_t comm_create(const comm_config *cfg, comm_t **out) {
  if (!cfg || !out) return NEWT_ERR(NEWT_ERR_INVALID, "comm_create: cfg and out are required");
  *out = NULL;
  if (cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size)
    return NEWT_ERR(NEWT_ERR_INVALID, "comm_config: rank %d of size %d is out of range", cfg->rank, cfg->size);
  if (cfg->timeout_ms <= 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "comm_config.timeout_ms is %lld, expected > 0", (long long)cfg->timeout_ms);
  if (cfg->backend != COMM_BACKEND_CPU && cfg->backend != COMM_BACKEND_NCCL)
    return NEWT_ERR(NEWT_ERR_INVALID, "comm_config.backend %d is not a backend", (int)cfg->backend);
#ifndef NEWT_HAVE_CUDA
  if (cfg->backend == COMM_BACKEND_NCCL)
    return NEWT_ERR(NEWT_ERR_UNSUPPORTED,
                    "comm_create: the NCCL backend is not built into this newt (built without the CUDA "
                    "toolkit); rebuild with -DNEWT_CUDA=ON where CUDA and NCCL are installed, or use the "
                    "CPU backend");
#endif
  if (cfg->backend == COMM_BACKEND_CPU) {
    NEWT_CHECK(check_cpu_config(cfg));
    NEWT_CHECK(check_secret(cfg->secret_len));
  }
  struct comm *c = comm_alloc(cfg->backend, cfg->timeout_ms);
  NEWT_CHECK_ALLOC(c);
  c->rank = cfg->rank;
  c->size = cfg->size;
  newt_result_t res;
#ifdef NEWT_HAVE_CUDA
  if (cfg->backend == COMM_BACKEND_NCCL) res = nccl_create(cfg, c);
  else
#endif
    res = cpu_create(cfg, c);
  if (res != NEWT_OK) {
    comm_release(c);
    return res;
  }
  *out = c;
  return NEWT_OK;
}

newt_result_t comm_split(comm_t *parent, int color, int key, comm_t **out) {
  if (!parent || !out) return NEWT_ERR(NEWT_ERR_INVALID, "comm_split: parent and out are required");
  *out = NULL;
  if (atomic_load(&parent->failed)) return comm_failed_err(parent, "comm_split");
  struct comm *c = comm_alloc(parent->backend, parent->timeout_ms);
  NEWT_CHECK_ALLOC(c);
  int member = 0;
  newt_result_t res;
#ifdef NEWT_HAVE_CUDA
  if (parent->backend == COMM_BACKEND_NCCL) res = nccl_split(parent, color, key, c, &member);
  else
#endif
    res = cpu_split(parent, color, key, c, &member);
  if (res == NEWT_OK && member) res = comm_family_link(parent, c);
  if (res != NEWT_OK || !member) {
    if (res != NEWT_OK && member) comm_free(c);
    else comm_release(c);
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
  if (c->backend == COMM_BACKEND_CPU) {
    if (!secret) return NEWT_ERR(NEWT_ERR_INVALID, "comm_shrink: the secret of the new generation is required");
    NEWT_CHECK(check_secret(secret_len));
  }
  struct comm *n = comm_alloc(c->backend, c->timeout_ms);
  NEWT_CHECK_ALLOC(n);
  newt_result_t res;
#ifdef NEWT_HAVE_CUDA
  if (c->backend == COMM_BACKEND_NCCL) res = nccl_shrink(c, exclude, nexclude, n);
  else
#endif
    res = cpu_shrink(c, exclude, nexclude, generation, secret, secret_len, n);
  if (res != NEWT_OK) {
    comm_release(n);
    return res;
  }
  *out = n;
  return NEWT_OK;
}

newt_result_t comm_nccl_unique_id(unsigned char id[COMM_NCCL_ID_BYTES]) {
  if (!id) return NEWT_ERR(NEWT_ERR_INVALID, "comm_nccl_unique_id: id is required");
#ifdef NEWT_HAVE_CUDA
  return nccl_unique_id(id);
#else
  return NEWT_ERR(NEWT_ERR_UNSUPPORTED, "comm_nccl_unique_id: the NCCL backend is not built into this newt "
                                        "(built without the CUDA toolkit)");
#endif
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
    if (c->backend == COMM_BACKEND_CPU && !comm_reduce_supported(op->dt))
      return NEWT_ERR(NEWT_ERR_UNSUPPORTED, "%s: the CPU backend does not reduce %s (f32, bf16, i32, i64, u8 only)",
                      what, newt_dtype_name(op->dt));
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

static newt_result_t run(struct comm *c, const comm_opdesc *op) {
  NEWT_CHECK(check_op(c, op));
#ifdef NEWT_HAVE_CUDA
  if (c->backend == COMM_BACKEND_NCCL) return nccl_run(c, op);
#endif
  return cpu_run(c, op);
}

static newt_result_t submit(struct comm *c, const comm_opdesc *op, comm_req_t **req) {
  if (!req) return NEWT_ERR(NEWT_ERR_INVALID, "%s_async: req is required", comm_kind_name(op->kind));
  *req = NULL;
  NEWT_CHECK(check_op(c, op));
  struct comm_req *r;
  NEWT_CHECK(comm_req_new(c, op, &r));
  newt_result_t res;
#ifdef NEWT_HAVE_CUDA
  if (c->backend == COMM_BACKEND_NCCL) res = nccl_submit(c, r);
  else
#endif
    res = cpu_submit(c, r);
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
#ifdef NEWT_HAVE_CUDA
    if (c->backend == COMM_BACKEND_NCCL) nccl_wait_req(r);
    else
#endif
      cpu_wait_req(r);
  }
  newt_result_t res = r->result;
  char msg[sizeof r->msg];
  snprintf(msg, sizeof msg, "%s", r->msg);
  comm_kind k = r->op.kind;
  comm_req_untrack(r);
#ifdef NEWT_HAVE_CUDA
  nccl_event_destroy(r->event);
#endif
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
  pthread_mutex_lock(&family_lock);
  *st = c->status;
  pthread_mutex_unlock(&family_lock);
}

void comm_free(comm_t *c) {
  if (!c) return;
  pthread_mutex_lock(&family_lock);
  if (c->nchildren > 0)
    NEWT_WARN(COMM, "rank %d: comm_free of a communicator with %d split children still alive (free them first)",
              c->rank, c->nchildren);
  for (int i = 0; i < c->nchildren; i++) c->children[i]->parent = NULL;
  c->nchildren = 0;
  if (c->parent) {
    struct comm *p = c->parent;
    for (int i = 0; i < p->nchildren; i++)
      if (p->children[i] == c) {
        p->children[i] = p->children[--p->nchildren];
        break;
      }
    c->parent = NULL;
  }
  pthread_mutex_unlock(&family_lock);
#ifdef NEWT_HAVE_CUDA
  if (c->backend == COMM_BACKEND_NCCL) nccl_free(c);
  else
#endif
    cpu_free(c);
  comm_req_abort_all(c);
  comm_release(c);
}
