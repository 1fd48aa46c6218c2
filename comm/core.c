/* The machinery the backends of comm/ share (see internal.h): kind names, the hash of
 * tags, futex helpers, communicator objects, the failure record of every communicator and
 * its spread through the split family and to a companion, and the bookkeeping of requests.
 *
 * One process-wide lock (family_lock) guards every communicator's status, family and
 * companion links and outstanding requests. A failure is recorded once (the first wins),
 * then each relative up and down the family, and the companion, records the same cause;
 * each communicator that records it tells its backend through its table (c->ops->on_fail,
 * which never blocks), the only way this file reaches a backend besides freeing. */
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

/* Under family_lock. The culprit is a root rank; `from` is the relative the failure came
 * from (not told again); relatives record the same cause, the companion the same words
 * (it is the same communicator to the user: its voice to the peers). */
static void fail_one(struct comm *c, struct comm *from, newt_result_t code, int root, const char *cause,
                     const char *suffix, int notify) {
  if (atomic_load(&c->failed)) return;
  int related = from && from != c->companion;
  c->status.code = code;
  c->status.peer = comm_to_local(c, root);
  snprintf(c->status.msg, sizeof c->status.msg, "%s%s%s%s%s", cause, suffix ? " (" : "", suffix ? suffix : "",
           suffix ? ")" : "", related ? " (seen in a related communicator)" : "");
  if (code == NEWT_ERR_ABORTED) atomic_store(&c->aborted, 1);
  atomic_store_explicit(&c->failed, 1, memory_order_release);
  if (code == NEWT_ERR_ABORTED || (from && from == c->companion)) /* a companion's is said once */
    NEWT_INFO(COMM, "rank %d of %d: %s", c->rank, c->size, c->status.msg);
  else NEWT_WARN(COMM, "rank %d of %d: communicator failed: %s", c->rank, c->size, c->status.msg);
  c->ops->on_fail(c, code, root, cause, notify);
  if (c->companion && c->companion != from)
    fail_one(c->companion, c, code, root, cause, related ? NULL : suffix, notify);
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

/* --- communicator objects and their family -------------------------------------------- */

struct comm *comm_obj_new(comm_backend b, const comm_backend_ops *ops, int64_t timeout_ms, int64_t build_timeout_ms) {
  struct comm *c = calloc(1, sizeof *c);
  if (c) {
    c->backend = b;
    c->ops = ops;
    c->timeout_ms = timeout_ms;
    atomic_init(&c->stall_ms, timeout_ms);
    c->build_timeout_ms = build_timeout_ms;
    c->status.peer = -1;
  }
  return c;
}

void comm_obj_release(struct comm *c) {
  if (!c) return;
  free(c->root_ranks);
  free(c->children);
  free(c);
}

void comm_obj_destroy(struct comm *c) {
  if (!c) return;
  if (c->ops->retire) c->ops->retire(c);
  comm_family_unlink(c);
  c->ops->free(c);
  comm_req_abort_all(c);
  comm_obj_release(c);
}

void comm_companion_link(struct comm *a, struct comm *b) {
  pthread_mutex_lock(&family_lock);
  a->companion = b;
  b->companion = a;
  pthread_mutex_unlock(&family_lock);
}

static int collect(struct comm *c, struct comm **out, int n, int cap) {
  if (n < cap) out[n] = c;
  n++;
  for (int i = 0; i < c->nchildren; i++) n = collect(c->children[i], out, n, cap);
  return n;
}

int comm_family_collect(struct comm *c, struct comm **out, int cap) {
  pthread_mutex_lock(&family_lock);
  struct comm *root = c;
  while (root->parent) root = root->parent;
  int n = collect(root, out, 0, cap);
  pthread_mutex_unlock(&family_lock);
  return n < cap ? n : cap;
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

void comm_family_unlink(struct comm *c) {
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
  if (c->companion) {
    c->companion->companion = NULL;
    c->companion = NULL;
  }
  pthread_mutex_unlock(&family_lock);
}

void comm_status_copy(const struct comm *c, comm_status *st) {
  pthread_mutex_lock(&family_lock);
  *st = c->status;
  pthread_mutex_unlock(&family_lock);
}

/* --- requests ------------------------------------------------------------------------- */

newt_result_t comm_req_new(struct comm *c, const comm_opdesc *op, struct comm_req **out) {
  struct comm_req *r = calloc(1, sizeof *r);
  NEWT_CHECK_ALLOC(r);
  r->c = c;
  r->ops = c->ops;
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
