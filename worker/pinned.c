/* The worker's pinned host memory: a pool of blocks of its memory's host_alloc
 * (cudaMallocHost on a GPU), for the staging that device-to-host copies land in or
 * host-to-device copies leave from: the checkpoint saver's staging (save.c) and the
 * restore's (state.c). With host memory only the saver's staging comes from it (plain
 * host memory with its pages touched; the state moves there are zero-copy): so that a new
 * generation's first checkpoint does not stall the step allocating and faulting in its
 * staging again.
 *
 * Pinning gigabytes costs hundreds of milliseconds (the pages are faulted in and locked),
 * and a saver is made every generation and a restore stages every recovery: a block given
 * back is kept, marked free, and the next request of at most its size gets it (the
 * smallest free one that fits), so the memory is pinned once per run and a recovery or a
 * new generation of the same layout allocates nothing. A request that no free block fits
 * (the state grew: a smaller data-parallel group with ZeRO, say) gives the free blocks
 * smaller than it back to the device first, so outgrown blocks do not pile up.
 *
 * Sizes are rounded up to POOL_GRAIN so that requests a little apart share blocks. The
 * blocks are host_alloc's as they come, aligned to 64 bytes at least (newt_memory's promise,
 * what the checkpoint saver needs: CKPT_STAGING_ALIGN). The pool is freed with the worker's
 * state, before its device is closed. Every call takes the pool's mutex: blocks
 * may be given back from any thread. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/internal.h"

#define POOL_GRAIN ((size_t)64 << 10)

typedef struct pblock {
  void *p;    /* from the memory's host_alloc */
  size_t cap; /* its bytes */
  int used;
} pblock;

struct worker_pinned {
  newt_memory mem; /* the worker's: its host_alloc gives the blocks */
  pthread_mutex_t mu;
  pblock *blocks;
  size_t n, cap;
  worker_pinned_stats st;
};

newt_result_t worker_pinned_init(worker_pinned **out, const newt_memory *mem) {
  worker_pinned *p = calloc(1, sizeof *p);
  NEWT_CHECK_ALLOC(p);
  p->mem = *mem;
  pthread_mutex_init(&p->mu, NULL);
  *out = p;
  return NEWT_OK;
}

/* Gives the free blocks smaller than bytes back to the device (called with mu held). */
static void drop_outgrown(worker_pinned *p, size_t bytes) {
  size_t k = 0;
  for (size_t i = 0; i < p->n; i++) {
    if (!p->blocks[i].used && p->blocks[i].cap < bytes) {
      p->mem.host_free(p->mem.ctx, p->blocks[i].p);
      p->st.bytes -= p->blocks[i].cap;
      continue;
    }
    p->blocks[k++] = p->blocks[i];
  }
  p->n = k;
}

static size_t grain(size_t bytes) {
  size_t want = (bytes ? bytes : 1) + POOL_GRAIN - 1;
  return want - want % POOL_GRAIN;
}

/* The smallest free block of at least want bytes (called with mu held), NULL: none. */
static pblock *best_fit(worker_pinned *p, size_t want) {
  pblock *best = NULL;
  for (size_t i = 0; i < p->n; i++)
    if (!p->blocks[i].used && p->blocks[i].cap >= want && (!best || p->blocks[i].cap < best->cap)) best = &p->blocks[i];
  return best;
}

int worker_pinned_has(worker_pinned *p, size_t bytes) {
  pthread_mutex_lock(&p->mu);
  int has = best_fit(p, grain(bytes)) != NULL;
  pthread_mutex_unlock(&p->mu);
  return has;
}

/* Room in the block table for one more (called with mu held). */
static newt_result_t table_room(worker_pinned *p) {
  if (p->n < p->cap) return NEWT_OK;
  size_t c = p->cap ? 2 * p->cap : 8;
  pblock *nb = realloc(p->blocks, c * sizeof *nb);
  if (!nb) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for the pinned pool's table");
  p->blocks = nb, p->cap = c;
  return NEWT_OK;
}

/* Adds a block of the device's memory to the table (called with mu held, room made). */
static void add_block(worker_pinned *p, void *mem, size_t cap, int used) {
  p->blocks[p->n++] = (pblock){mem, cap, used};
  p->st.allocs++;
  p->st.bytes += cap;
}

newt_result_t worker_pinned_reserve(worker_pinned *p, size_t bytes) {
  size_t want = grain(bytes);
  if (worker_pinned_has(p, want)) return NEWT_OK;
  void *mem = NULL; /* pinned outside the lock: the pool serves its users meanwhile */
  NEWT_CHECK(p->mem.host_alloc(p->mem.ctx, want, &mem));
  pthread_mutex_lock(&p->mu);
  drop_outgrown(p, want); /* as a get that no free block fits does */
  newt_result_t r = table_room(p);
  if (r == NEWT_OK) add_block(p, mem, want, 0);
  pthread_mutex_unlock(&p->mu);
  if (r != NEWT_OK) p->mem.host_free(p->mem.ctx, mem);
  return r;
}

newt_result_t worker_pinned_get(worker_pinned *p, size_t bytes, void **out) {
  *out = NULL;
  size_t want = grain(bytes);
  pthread_mutex_lock(&p->mu);
  pblock *best = best_fit(p, want);
  newt_result_t r = NEWT_OK;
  if (best) {
    best->used = 1;
    *out = best->p;
    p->st.reused++;
  } else {
    drop_outgrown(p, want);
    void *mem = NULL;
    if ((r = table_room(p)) == NEWT_OK && (r = p->mem.host_alloc(p->mem.ctx, want, &mem)) == NEWT_OK) {
      add_block(p, mem, want, 1);
      *out = mem;
    }
  }
  pthread_mutex_unlock(&p->mu);
  return r;
}

void worker_pinned_put(worker_pinned *p, void *ptr) {
  if (!ptr) return;
  pthread_mutex_lock(&p->mu);
  size_t i = 0;
  while (i < p->n && p->blocks[i].p != ptr) i++;
  if (i < p->n && p->blocks[i].used) p->blocks[i].used = 0;
  else NEWT_ERROR(WORKER, "pinned pool: %p given back is not a block in use (ignored)", ptr);
  pthread_mutex_unlock(&p->mu);
}

void worker_pinned_stats_get(worker_pinned *p, worker_pinned_stats *st) {
  pthread_mutex_lock(&p->mu);
  *st = p->st;
  st->blocks = p->n;
  pthread_mutex_unlock(&p->mu);
}

void worker_pinned_free(worker_pinned *p) {
  if (!p) return;
  for (size_t i = 0; i < p->n; i++) {
    if (p->blocks[i].used) { /* still someone's: leaked rather than freed under its user */
      NEWT_ERROR(WORKER, "pinned pool freed with a block of %zu bytes in use (not freed)", p->blocks[i].cap);
      continue;
    }
    p->mem.host_free(p->mem.ctx, p->blocks[i].p);
  }
  free(p->blocks);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

/* ckpt_saver_opts.staging_alloc / staging_free over the pool (ctx: the pool); its blocks
 * are aligned to CKPT_STAGING_ALIGN. */
void *worker_pinned_staging_alloc(void *ctx, size_t bytes) {
  void *mem = NULL;
  if (worker_pinned_get(ctx, bytes, &mem) != NEWT_OK) {
    NEWT_WARN(WORKER, "checkpoint staging: %s", newt_errmsg());
    return NULL;
  }
  return mem;
}

void worker_pinned_staging_free(void *ctx, void *ptr) { worker_pinned_put(ctx, ptr); }

newt_result_t worker_pinned_of(worker *w, worker_pinned **out) {
  if (!w->pinned) NEWT_CHECK(worker_pinned_init(&w->pinned, &w->o.memory));
  *out = w->pinned;
  return NEWT_OK;
}

newt_result_t worker_stage_get(worker *w, size_t bytes, void **out) {
  worker_pinned *pool = NULL;
  *out = NULL;
  NEWT_CHECK(worker_pinned_of(w, &pool));
  newt_result_t r = worker_pinned_get(pool, bytes, out);
  return r == NEWT_OK ? NEWT_OK : newt_err_wrap(r, "staging %zu bytes of the state on the host: ", bytes);
}

void worker_stage_release(worker *w, void *stage) {
  if (stage) worker_pinned_put(w->pinned, stage);
}
