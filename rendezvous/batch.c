/* Group commit of etcd transactions (batch.h): a queue of waiting callers, one of which sends
 * at a time, taking every queued transaction whose keys are not another's into one. */
#include "rendezvous/batch.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "rendezvous/etcd_internal.h"

typedef struct waiter {
  const rdzv_etcd_cmp *cmps;
  size_t ncmp;
  const rdzv_etcd_op *ops, *fail;
  size_t nops, nfail;
  newt_deadline_t d;
  int lone;                  /* a range or prefix op: never merged */
  size_t bytes;              /* of keys and values */
  int lingered;              /* queued through a linger already: the next sender need not wait */
  int done;
  newt_result_t rc;
  char msg[512];
  rdzv_etcd_txn_result res;
  struct waiter *next;
} waiter;

struct rdzv_batch {
  rdzv_etcd *c;
  rdzv_batch_opts o;
  pthread_mutex_t mu;
  pthread_cond_t cv;  /* a waiter done, the queue grown, the sender's turn free */
  waiter *head, *tail;
  int queued;
  int busy;           /* a caller is sending (or lingering before it sends) */
  int64_t posted, sent;
};

newt_result_t rdzv_batch_new(rdzv_etcd *c, const rdzv_batch_opts *o, rdzv_batch **out) {
  *out = NULL;
  rdzv_batch *b = calloc(1, sizeof *b);
  NEWT_CHECK_ALLOC(b);
  b->c = c;
  if (o) b->o = *o;
  if (b->o.expect < 1) b->o.expect = 1;
  if (b->o.linger_ms < 0) b->o.linger_ms = 0;
  if (b->o.max_ops <= 0) b->o.max_ops = RDZV_BATCH_MAX_OPS;
  if (!b->o.max_bytes) b->o.max_bytes = RDZV_BATCH_MAX_BYTES;
  pthread_mutex_init(&b->mu, NULL);
  rdzv_cond_init(&b->cv);
  *out = b;
  return NEWT_OK;
}

void rdzv_batch_free(rdzv_batch *b) {
  if (!b) return;
  pthread_mutex_destroy(&b->mu);
  pthread_cond_destroy(&b->cv);
  free(b);
}

void rdzv_batch_counts(rdzv_batch *b, int64_t *posted, int64_t *sent) {
  pthread_mutex_lock(&b->mu);
  if (posted) *posted = b->posted;
  if (sent) *sent = b->sent;
  pthread_mutex_unlock(&b->mu);
}

/* ---- which transactions go together ------------------------------------------------------- */

/* 1 when a key w compares or touches is one of x's. */
static int clash_key(const waiter *x, const char *key) {
  for (size_t i = 0; i < x->ncmp; i++)
    if (strcmp(x->cmps[i].key, key) == 0) return 1;
  for (size_t i = 0; i < x->nops; i++)
    if (strcmp(x->ops[i].key, key) == 0) return 1;
  return 0;
}

static int clash(const waiter *w, const waiter *x) {
  for (size_t i = 0; i < w->ncmp; i++)
    if (clash_key(x, w->cmps[i].key)) return 1;
  for (size_t i = 0; i < w->nops; i++)
    if (clash_key(x, w->ops[i].key)) return 1;
  return 0;
}

/* Takes from the queue the transactions the next request carries: the first, and then each
 * queued one that may join it (not lone, no key of the taken ones', within the bounds). At
 * most 64 in one request. Called with mu held. */
static int take(rdzv_batch *b, waiter **taken, int cap) {
  waiter *w = b->head, *prev = NULL;
  int n = 0;
  size_t ops = 0, bytes = 0;
  while (w && n < cap) {
    int ok = n == 0;
    if (!ok && !w->lone && !taken[0]->lone && ops + w->ncmp + w->nops <= (size_t)b->o.max_ops &&
        bytes + w->bytes <= b->o.max_bytes) {
      ok = 1;
      for (int i = 0; ok && i < n; i++) ok = !clash(w, taken[i]);
    }
    waiter *next = w->next;
    if (ok) {
      taken[n++] = w;
      ops += w->ncmp + w->nops;
      bytes += w->bytes;
      if (prev) prev->next = next;
      else b->head = next;
      if (b->tail == w) b->tail = prev;
      w->next = NULL;
      b->queued--;
    } else {
      prev = w;
    }
    w = next;
  }
  return n;
}

/* ---- sending --------------------------------------------------------------------------- */

static void alone(rdzv_batch *b, waiter *w) {
  w->rc = rdzv_etcd_txn(b->c, w->cmps, w->ncmp, w->ops, w->nops, w->fail, w->nfail, w->d, &w->res);
  if (w->rc != NEWT_OK) snprintf(w->msg, sizeof w->msg, "%s", newt_errmsg());
}

/* Sends the taken transactions: one alone as it is; several as one, each caller given its own
 * ops' results when it succeeded, each sent again alone when it did not (one compare that
 * failed, or a refusal that one of them may have caused), the same transient failure to
 * every caller. Returns the requests sent. */
static int64_t send_taken(rdzv_batch *b, waiter **t, int n) {
  if (n <= 0) return 0;
  if (n == 1) {
    alone(b, t[0]);
    return 1;
  }
  size_t ncmp = 0, nops = 0;
  newt_deadline_t d = t[0]->d;
  for (int i = 0; i < n; i++) {
    ncmp += t[i]->ncmp;
    nops += t[i]->nops;
    if (t[i]->d < d) d = t[i]->d;
  }
  rdzv_etcd_cmp *cmps = calloc(ncmp ? ncmp : 1, sizeof *cmps);
  rdzv_etcd_op *ops = calloc(nops ? nops : 1, sizeof *ops);
  rdzv_etcd_txn_result m;
  memset(&m, 0, sizeof m);
  newt_result_t rc;
  if (!cmps || !ops) {
    rc = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory merging %d etcd transactions", n);
  } else {
    size_t ci = 0, oi = 0;
    for (int i = 0; i < n; i++) {
      memcpy(cmps + ci, t[i]->cmps, t[i]->ncmp * sizeof *cmps);
      memcpy(ops + oi, t[i]->ops, t[i]->nops * sizeof *ops);
      ci += t[i]->ncmp;
      oi += t[i]->nops;
    }
    rc = rdzv_etcd_txn(b->c, cmps, ncmp, ops, nops, NULL, 0, d, &m);
  }
  free(cmps);
  free(ops);
  int64_t sent = rc == NEWT_ERR_NOMEM ? 0 : 1;
  if (rc == NEWT_OK && m.succeeded && m.n != nops) { /* applied, but not what was asked */
    rdzv_etcd_txn_result_free(&m);
    rc = NEWT_ERR(NEWT_ERR_CORRUPT, "etcd answered a transaction of %zu ops with %zu results", nops, m.n);
    for (int i = 0; i < n; i++) {
      t[i]->rc = rc;
      snprintf(t[i]->msg, sizeof t[i]->msg, "%s", newt_errmsg());
    }
    return sent;
  }
  if (rc == NEWT_OK && m.succeeded) {
    size_t off = 0;
    for (int i = 0; i < n; i++) {
      waiter *w = t[i];
      w->res.succeeded = 1;
      w->res.revision = m.revision;
      w->res.n = w->nops;
      w->res.results = calloc(w->nops ? w->nops : 1, sizeof *w->res.results);
      if (!w->res.results) {
        w->res.n = 0;
        w->rc = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a transaction's results");
        snprintf(w->msg, sizeof w->msg, "%s", newt_errmsg());
        for (size_t k = 0; k < w->nops; k++) rdzv_etcd_kvs_free(&m.results[off + k].range);
      } else {
        memcpy(w->res.results, m.results + off, w->nops * sizeof *m.results);
        w->rc = NEWT_OK;
      }
      off += w->nops;
    }
    free(m.results); /* their ranges are the callers' now */
    return sent;
  }
  if (rc == NEWT_OK) rdzv_etcd_txn_result_free(&m);
  if (rdzv_etcd_transient(rc)) {
    for (int i = 0; i < n; i++) {
      t[i]->rc = rc;
      snprintf(t[i]->msg, sizeof t[i]->msg, "%s", newt_errmsg());
    }
    return sent;
  }
  for (int i = 0; i < n; i++) alone(b, t[i]);
  return sent + n;
}

/* The first caller to find nobody sending lingers for the host's other transactions, unless
 * every queued one has been through a linger already (they were left for the next request:
 * a key another had, or the bounds). Called with mu held. */
static void linger(rdzv_batch *b) {
  int fresh = 0;
  for (waiter *w = b->head; w; w = w->next) fresh |= !w->lingered;
  if (!b->o.linger_ms || !fresh || b->queued >= b->o.expect) return;
  uint64_t now = newt_now_ns(), until = now + (uint64_t)b->o.linger_ms * 1000000ull;
  /* never more than half the time the first caller has left: the rest is the request's */
  if (b->head->d != NEWT_DEADLINE_NONE) {
    uint64_t half = b->head->d > now ? now + (b->head->d - now) / 2 : now;
    if (half < until) until = half;
  }
  while (b->queued < b->o.expect && (now = newt_now_ns()) < until) {
    struct timespec ts = {(time_t)(until / 1000000000ull), (long)(until % 1000000000ull)};
    pthread_cond_timedwait(&b->cv, &b->mu, &ts);
  }
  for (waiter *w = b->head; w; w = w->next) w->lingered = 1;
}

static size_t op_bytes(const rdzv_etcd_op *op) { return strlen(op->key) + (op->type == RDZV_OP_PUT ? op->value_len : 0); }

newt_result_t rdzv_batch_txn(rdzv_batch *b, const rdzv_etcd_cmp *cmps, size_t ncmp, const rdzv_etcd_op *success,
                             size_t nsuccess, const rdzv_etcd_op *failure, size_t nfailure, newt_deadline_t d,
                             rdzv_etcd_txn_result *out) {
  if (out) memset(out, 0, sizeof *out);
  waiter w = {.cmps = cmps, .ncmp = ncmp, .ops = success, .nops = nsuccess, .fail = failure, .nfail = nfailure, .d = d};
  for (size_t i = 0; i < ncmp; i++) {
    if (!cmps[i].key) return NEWT_ERR(NEWT_ERR_INVALID, "etcd txn: compare %zu has no key", i);
    w.bytes += strlen(cmps[i].key) + (cmps[i].target == RDZV_CMP_VALUE ? cmps[i].value_len : 0);
  }
  for (size_t i = 0; i < nsuccess; i++) {
    if (!success[i].key) return NEWT_ERR(NEWT_ERR_INVALID, "etcd txn: op %zu has no key", i);
    w.lone |= success[i].type == RDZV_OP_RANGE || success[i].prefix || success[i].range_end;
    w.bytes += op_bytes(&success[i]);
  }
  pthread_mutex_lock(&b->mu);
  b->posted++;
  if (b->tail) b->tail->next = &w;
  else b->head = &w;
  b->tail = &w;
  b->queued++;
  pthread_cond_broadcast(&b->cv);
  while (!w.done) {
    if (b->busy) {
      pthread_cond_wait(&b->cv, &b->mu);
      continue;
    }
    b->busy = 1;
    linger(b);
    waiter *t[64] = {0};
    int n = take(b, t, 64);
    pthread_mutex_unlock(&b->mu);
    int64_t sent = send_taken(b, t, n);
    pthread_mutex_lock(&b->mu);
    b->sent += sent;
    for (int i = 0; i < n; i++) t[i]->done = 1;
    b->busy = 0;
    pthread_cond_broadcast(&b->cv);
  }
  pthread_mutex_unlock(&b->mu);
  if (w.rc != NEWT_OK) return NEWT_ERR(w.rc, "%s", w.msg);
  if (out) *out = w.res;
  else rdzv_etcd_txn_result_free(&w.res);
  return NEWT_OK;
}
