/* Helpers of the parallel-trainer tests: the small model they train, the single-process
 * reference run, one process per rank (forked once; each runs many layouts in turn, each
 * layout on a fresh world communicator), a barrier of all those processes in shared memory,
 * and the pieces of a rank laid over the global tensors (a "checkpoint" in shared memory:
 * one float per element of the global layout for the parameters and each moment, and a count
 * of the primary pieces that covered it), read and written through the device interface. */
#ifndef NEWT_TESTS_PAR_TEST_H
#define NEWT_TESTS_PAR_TEST_H

#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "comm/comm_test.h"
#include "model/dev_strict_comm.h"
#include "model/parallel.h"
#include "test.h"

#define PT_MAX_RANKS 8
#define PT_MAX_STEPS 24

/* The test model: 4 layers, 64 channels, 4 heads, ctx 32, vocab 256; a global batch of 8
 * sequences of 32 tokens in micro-batches of 2; 20 steps of AdamW (clipping at 1.0 bites in
 * the first steps). */
static inline model_train_config pt_config(int steps) {
  model_train_config c;
  model_train_defaults(&c, "tiny", steps);
  model_config_override(&c.model, "layers=4,channels=64,heads=4,ctx=32");
  c.seq_len = 32;
  c.batch = 8;
  c.micro_batch = 2;
  c.threads = 1;
  c.optim.lr = 3e-3;
  c.optim.lr_min = 3e-4;
  return c;
}

typedef struct pt_ref {
  int steps;
  double loss[PT_MAX_STEPS], norm[PT_MAX_STEPS];
  float *params, *m, *v; /* after the last step, global layout */
  size_t total;
} pt_ref;

static model_tokens pt_corpus;
static model_loader pt_loader;

static inline void pt_data_init(const model_train_config *c) {
  size_t n = 1 << 18;
  char *text = malloc(n);
  model_text_generate(5, text, n);
  if (model_tokens_from_memory(&pt_corpus, text, 1, n, 256) != NEWT_OK ||
      model_loader_init(&pt_loader, &pt_corpus, c->seq_len, c->data_seed, c->model.vocab) != NEWT_OK) {
    fprintf(stderr, "test data: %s\n", newt_errmsg());
    exit(2);
  }
  free(text);
}

/* The single-process run of `steps` steps: losses, norms, and the state after `state_at`. */
static inline void pt_reference(const model_train_config *c, int steps, int state_at, pt_ref *ref) {
  model_trainer tr;
  T_OK(model_trainer_init(&tr, c));
  ref->steps = steps;
  ref->total = tr.gpt.layout.total;
  ref->params = malloc(ref->total * sizeof(float));
  ref->m = malloc(ref->total * sizeof(float));
  ref->v = malloc(ref->total * sizeof(float));
  for (int s = 0; s < ref->steps; s++) {
    model_step_info info;
    T_OK(model_trainer_step_data(&tr, &pt_loader, &info));
    ref->loss[s] = info.loss;
    ref->norm[s] = info.grad_norm;
    if (s + 1 == state_at) {
      memcpy(ref->params, tr.gpt.params, ref->total * sizeof(float));
      memcpy(ref->m, tr.opt.m, ref->total * sizeof(float));
      memcpy(ref->v, tr.opt.v, ref->total * sizeof(float));
    }
  }
  model_trainer_free(&tr);
}

/* This data-parallel rank's slice of step s's global batch. */
static inline newt_result_t pt_fetch(const model_train_config *c, const model_par_config *pc, int s, int32_t *in,
                                     int32_t *tg, int *count) {
  int64_t first, n;
  model_batch_slice(c->batch, pc->dp_rank, pc->dp, &first, &n);
  *count = (int)n;
  return model_loader_fetch(&pt_loader, (uint64_t)s * c->batch + (uint64_t)first, n, in, tg);
}

/* ---- shared memory: a barrier of all rank processes and the global "checkpoint" ------------------ */

typedef struct pt_shared {
  _Atomic int arrived, gen;
  _Atomic int failed;
  size_t total;     /* floats per kind (the global layout's total) */
  _Atomic int *cnt; /* [3][total] primary pieces that covered each element */
  float *val;       /* [3][total] their values */
} pt_shared;

static inline pt_shared *pt_shared_new(size_t total) {
  size_t bytes = sizeof(pt_shared) + 3 * total * (sizeof(int) + sizeof(float));
  pt_shared *sh = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) {
    perror("mmap");
    exit(2);
  }
  memset(sh, 0, bytes);
  sh->total = total;
  sh->cnt = (_Atomic int *)(sh + 1);
  sh->val = (float *)(sh->cnt + 3 * total);
  return sh;
}

/* All n processes meet (deadline 120 s; 0 when it passes). */
static inline int pt_barrier(pt_shared *sh, int n) {
  int g = atomic_load(&sh->gen);
  if (atomic_fetch_add(&sh->arrived, 1) == n - 1) {
    atomic_store(&sh->arrived, 0);
    atomic_fetch_add(&sh->gen, 1);
    return 1;
  }
  newt_deadline_t d = newt_deadline_in_ms(120000);
  while (atomic_load(&sh->gen) == g) {
    if (newt_deadline_passed(d)) return 0;
    newt_sleep_ms(1);
  }
  return 1;
}

/* Calls fn(ctx, element index in the global buffer, element of the piece's data) for each
 * element of the piece. */
typedef void (*pt_elem_fn)(void *ctx, const model_par_piece *pc, size_t global, size_t i);
static inline void pt_piece_each(const model_par_piece *pc, pt_elem_fn fn, void *ctx) {
  const newt_slice *s = &pc->slice;
  size_t gcols = pc->tensor->shape[1], cols = s->ndim == 2 ? (size_t)s->shape[1] : 1;
  size_t off1 = s->ndim == 2 ? (size_t)s->offset[1] : 0;
  for (int64_t e = s->begin; e < s->end; e++) {
    size_t r = (size_t)e / cols, cc = (size_t)e % cols;
    size_t g = ((size_t)s->offset[0] + r) * gcols + off1 + cc;
    fn(ctx, pc, pc->tensor->offset + g, (size_t)(e - s->begin));
  }
}

typedef struct pt_cover {
  pt_shared *sh;
  int bad;
} pt_cover;

/* Primary pieces: count and store. */
static inline void pt_put(void *ctx, const model_par_piece *pc, size_t g, size_t i) {
  pt_shared *sh = ((pt_cover *)ctx)->sh;
  atomic_fetch_add(&sh->cnt[(size_t)pc->kind * sh->total + g], 1);
  sh->val[(size_t)pc->kind * sh->total + g] = pc->data[i];
}

/* Any piece: must equal the primary copy bit for bit. */
static inline void pt_same(void *ctx, const model_par_piece *pc, size_t g, size_t i) {
  pt_cover *cv = ctx;
  float want = cv->sh->val[(size_t)pc->kind * cv->sh->total + g];
  if (memcmp(&want, &pc->data[i], sizeof want) != 0 && cv->bad++ < 3)
    fprintf(stderr, "  replica of %s element %zu is %.9g, the primary copy %.9g\n", pc->desc.name,
            g - pc->tensor->offset, pc->data[i], want);
}

/* Restore: every piece from the shared copy. */
static inline void pt_get(void *ctx, const model_par_piece *pc, size_t g, size_t i) {
  pt_shared *sh = ((pt_cover *)ctx)->sh;
  pc->data[i] = sh->val[(size_t)pc->kind * sh->total + g];
}

/* The pieces are device memory (model/dev.h): each is downloaded into host memory for fn,
 * and uploaded back after pt_get. */
static inline int pt_pieces_apply(const model_par *p, pt_elem_fn fn, pt_shared *sh, int primary_only) {
  model_par_piece *pcs;
  size_t n;
  if (model_par_pieces(p, &pcs, &n) != NEWT_OK) {
    fprintf(stderr, "model_par_pieces: %s\n", newt_errmsg());
    return 1;
  }
  pt_cover cv = {.sh = sh};
  for (size_t i = 0; i < n; i++) {
    if (primary_only && !pcs[i].primary) continue;
    if (pcs[i].derived && p->params_stale) continue; /* not state: the next step rebuilds them */
    size_t bytes = (size_t)newt_slice_numel(&pcs[i].slice) * sizeof(float);
    model_par_piece h = pcs[i];
    h.data = malloc(bytes ? bytes : 1);
    if (!h.data || model_dev_download(p->dev, h.data, pcs[i].data, bytes) != NEWT_OK) {
      fprintf(stderr, "%s: download: %s\n", pcs[i].desc.name, newt_errmsg());
      cv.bad++;
    } else {
      pt_piece_each(&h, fn, &cv);
      if (fn == pt_get && model_dev_upload(p->dev, pcs[i].data, h.data, bytes) != NEWT_OK) {
        fprintf(stderr, "%s: upload: %s\n", pcs[i].desc.name, newt_errmsg());
        cv.bad++;
      }
    }
    free(h.data);
  }
  free(pcs);
  return cv.bad;
}

/* Every piece of p downloaded into one malloc'd host buffer, in piece order (*n floats). */
static inline float *pt_pieces_download(const model_par *p, size_t *n) {
  model_par_piece *pcs;
  size_t np, total = 0, off = 0;
  if (model_par_pieces(p, &pcs, &np) != NEWT_OK) return NULL;
  for (size_t i = 0; i < np; i++) total += (size_t)newt_slice_numel(&pcs[i].slice);
  float *out = malloc((total ? total : 1) * sizeof *out);
  for (size_t i = 0; out && i < np; i++) {
    size_t k = (size_t)newt_slice_numel(&pcs[i].slice);
    if (model_dev_download(p->dev, out + off, pcs[i].data, k * sizeof *out) != NEWT_OK) {
      free(out);
      out = NULL;
    }
    off += k;
  }
  free(pcs);
  *n = total;
  return out;
}

#endif
