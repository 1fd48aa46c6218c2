/* A small fixed thread pool for the chunk work of one save or one load: the caller of
 * ckpt_pool_run is worker 0 and nthreads - 1 threads wait on a condition variable for
 * the next job; items are claimed with an atomic counter, so a slow chunk never holds up
 * the others. One job at a time per pool. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/internal.h"

struct ckpt_pool {
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  pthread_t *threads;
  int nthreads;      /* including the caller */
  int started;       /* threads running */
  uint64_t gen;      /* job number */
  int stop;
  ckpt_pool_fn fn;
  void *ctx;
  size_t n;
  atomic_size_t next;
  int busy;          /* helper threads still inside the current job */
};

typedef struct {
  ckpt_pool *p;
  int id;
} worker_arg;

static void drain(ckpt_pool *p, int id) {
  for (;;) {
    size_t i = atomic_fetch_add(&p->next, 1);
    if (i >= p->n) break;
    p->fn(p->ctx, i, id);
  }
}

static void *worker_main(void *arg) {
  worker_arg a = *(worker_arg *)arg;
  free(arg);
  ckpt_pool *p = a.p;
  uint64_t seen = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->stop && p->gen == seen) pthread_cond_wait(&p->wake, &p->mu);
    if (p->stop) break;
    seen = p->gen;
    pthread_mutex_unlock(&p->mu);
    drain(p, a.id);
    pthread_mutex_lock(&p->mu);
    if (--p->busy == 0) pthread_cond_signal(&p->done);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

newt_result_t ckpt_pool_init(ckpt_pool **out, int nthreads) {
  if (nthreads < 1) nthreads = 1;
  if (nthreads > 256) nthreads = 256;
  ckpt_pool *p = calloc(1, sizeof *p);
  NEWT_CHECK_ALLOC(p);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->done, NULL);
  p->nthreads = nthreads;
  p->threads = calloc((size_t)nthreads, sizeof *p->threads);
  if (!p->threads) {
    ckpt_pool_free(p);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: thread pool");
  }
  for (int i = 1; i < nthreads; i++) {
    worker_arg *a = malloc(sizeof *a);
    if (a) *a = (worker_arg){.p = p, .id = i};
    if (!a || pthread_create(&p->threads[i], NULL, worker_main, a) != 0) {
      free(a);
      ckpt_pool_free(p);
      return NEWT_ERR(NEWT_ERR_SYS, "cannot start checkpoint thread %d of %d", i, nthreads);
    }
    p->started++;
  }
  *out = p;
  return NEWT_OK;
}

void ckpt_pool_run(ckpt_pool *p, size_t n, ckpt_pool_fn fn, void *ctx) {
  if (n == 0) return;
  if (p->started == 0 || n == 1) {
    for (size_t i = 0; i < n; i++) fn(ctx, i, 0);
    return;
  }
  pthread_mutex_lock(&p->mu);
  p->fn = fn;
  p->ctx = ctx;
  p->n = n;
  atomic_store(&p->next, 0);
  p->busy = p->started;
  p->gen++;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  drain(p, 0);
  pthread_mutex_lock(&p->mu);
  while (p->busy > 0) pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

int ckpt_pool_size(const ckpt_pool *p) { return p->nthreads; }

void ckpt_pool_free(ckpt_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  for (int i = 1; i <= p->started; i++) pthread_join(p->threads[i], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->wake);
  pthread_cond_destroy(&p->done);
  free(p->threads);
  free(p);
}

void ckpt_job_err_set(ckpt_job_err *e, newt_result_t code) {
  int expected = NEWT_OK;
  if (atomic_compare_exchange_strong(&e->code, &expected, (int)code))
    snprintf(e->msg, sizeof e->msg, "%s", newt_errmsg());
}

newt_result_t ckpt_job_err_raise(ckpt_job_err *e) {
  int code = atomic_load(&e->code);
  if (code == NEWT_OK) return NEWT_OK;
  return NEWT_ERR((newt_result_t)code, "%s", e->msg);
}
