/* The GPT-2 model on the CPU: parameters and gradients in two buffers of one layout
 * (layout.h), the activations of one micro-batch (model_acts), the backward pass's
 * scratch (model_scratch), and the step decomposed into the pieces a pipeline schedule
 * drives:
 *
 *   model_embed_forward  -> model_block_forward(l) for each layer -> model_head_forward
 *   model_head_backward  -> model_block_backward(l) in reverse     -> model_embed_backward
 *
 * A stage that owns layers [l0, l1) keeps a model_acts for each micro-batch in flight
 * (model_acts_bytes says how much memory that is) and one model_scratch. The boundary
 * tensors are acts->x0 (the input of layer l0: written by the embedding, or received from
 * the previous stage) and scratch->dres (the gradient of the residual stream: the last
 * piece run leaves there the gradient with respect to its input).
 *
 * Gradient accumulation: parameter gradients add up (+=) across calls; the head scales
 * the per-token gradient by `dscale`, which the caller sets to 1 / (tokens in the global
 * batch), so k micro-batches give the gradient of the mean loss over all of them, as one
 * big batch would. model_gpt_zero_grads starts a step. */
#ifndef NEWT_MODEL_GPT_H
#define NEWT_MODEL_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "model/dev.h"
#include "model/layout.h"

typedef struct model_gpt {
  model_layout layout;
  float *params; /* layout.total floats */
  float *grads;  /* layout.total floats, same layout */
} model_gpt;

/* Allocates zeroed params and grads for cfg. */
newt_result_t model_gpt_init(model_gpt *g, const model_config *cfg);
void model_gpt_free(model_gpt *g);

/* GPT-2 initialisation, a pure function of (seed, tensor name, element): weights N(0, 0.02),
 * the two residual projections N(0, 0.02/sqrt(2L)), biases 0, layernorm weights 1. Any
 * range of the buffer can be initialised alone and comes out the same. */
void model_gpt_init_weights(model_gpt *g, uint64_t seed);

/* The initial values of elements [i0, i0 + n) of tensor t (row-major in the whole tensor,
 * t one of lay's) into out: what model_gpt_init_weights writes there. A tensor-parallel
 * rank initialises its box of a tensor row by row with it. */
void model_gpt_init_tensor(const model_layout *lay, const model_tensor *t, uint64_t seed, size_t i0,
                           size_t n, float *out);

void model_gpt_zero_grads(model_gpt *g);

/* Pointer to a tensor's parameters / gradients (slot: enum model_slot). */
float *model_gpt_param(const model_gpt *g, int slot, int layer);
float *model_gpt_grad(const model_gpt *g, int slot, int layer);

/* The activations of one block for one micro-batch. */
typedef struct model_block_acts {
  float *ln1, *ln1_mean, *ln1_rstd; /* (B,T,C) (B,T) (B,T) */
  float *qkv;                       /* (B,T,3C) (3C/tp with tensor parallelism) */
  float *att;                       /* (B,NH,T,T) attention probabilities (NH/tp) */
  float *atty;                      /* (B,T,C) attention output before the projection (C/tp) */
  float *res1;                      /* (B,T,C) x + attn */
  float *ln2, *ln2_mean, *ln2_rstd; /* (B,T,C) (B,T) (B,T) */
  float *fch;                       /* (B,T,4C) (4C/tp) */
  float *fch_gelu;                  /* (B,T,4C) (4C/tp) */
  float *res2;                      /* (B,T,C) block output */
} model_block_acts;

/* Everything one micro-batch keeps between its forward and its backward. */
typedef struct model_acts {
  int B, T;
  int tp;             /* tensor-parallel ranks the per-head and per-vocab tensors are split in */
  int l0, l1;         /* the layers held */
  int head;           /* 1: holds the final layernorm, logits and losses */
  int32_t *inputs;    /* (B,T) token ids (the embedding backward needs them) */
  int32_t *targets;   /* (B,T) (head) */
  float *x0;          /* (B,T,C) input of layer l0 */
  model_block_acts *blk; /* l1 - l0 entries */
  float *lnf, *lnf_mean, *lnf_rstd; /* (B,T,C) (B,T) (B,T) (head) */
  float *logits;      /* (B,T,V) (head; V/tp); dlogits after a forward with dscale != 0 */
  float *losses;      /* (B,T) per-token loss (head) */
  void *mem;
  size_t bytes;
  model_dev *dev;     /* the device mem is on (model_acts_init_dev); NULL: host memory */
} model_acts;

/* Bytes model_acts_init allocates for these sizes and layers. */
size_t model_acts_bytes(const model_config *cfg, int B, int T, int l0, int l1, int head);
newt_result_t model_acts_init(model_acts *a, const model_config *cfg, int B, int T, int l0, int l1,
                              int head);
/* The same for a tensor-parallel rank of tp (model/parallel.h): the tensors marked "/tp"
 * above hold this rank's heads, share of 4C and share of the vocabulary. tp must divide
 * heads and vocab. model_acts_init is tp = 1. */
size_t model_acts_bytes_tp(const model_config *cfg, int tp, int B, int T, int l0, int l1, int head);
newt_result_t model_acts_init_tp(model_acts *a, const model_config *cfg, int tp, int B, int T, int l0,
                                 int l1, int head);
/* The same in the memory of device `dev` (model/dev.h: one model_dev_alloc carved up; the
 * pointers are device pointers, for the kernels of dev.h). */
newt_result_t model_acts_init_dev(model_acts *a, model_dev *dev, const model_config *cfg, int tp, int B, int T,
                                  int l0, int l1, int head);
void model_acts_free(model_acts *a);

/* The backward pass's working memory, shared by the micro-batches of one stage. */
typedef struct model_scratch {
  int B, T;
  int threads;   /* model_threads_get() at init: the per-thread scratch is sized for it */
  float *dres;   /* (B,T,C) gradient of the residual stream */
  float *dx;     /* (B,T,C) dln / datty */
  float *dqkv;   /* (B,T,3C) */
  float *dfch;   /* (B,T,4C) */
  float *thread; /* per-thread scratch of the ops (model_ops_scratch_floats each) */
  void *mem;
  size_t bytes;
  model_dev *dev; /* the device mem is on (model_scratch_init_dev); NULL: host memory */
} model_scratch;

/* Sized for the thread count in force (model_threads_set first); should the count rise
 * later, the pieces below lower it back to s->threads (with a warning) rather than overrun. */
newt_result_t model_scratch_init(model_scratch *s, const model_config *cfg, int B, int T);
/* The same in the memory of device `dev`: `thread` holds model_dev_scratch_floats per thread
 * (the CPU device: ops.h's, for model_threads_get() threads; the CUDA device: none). */
newt_result_t model_scratch_init_dev(model_scratch *s, model_dev *dev, const model_config *cfg, int B, int T);
void model_scratch_free(model_scratch *s);
/* What the pieces do first: lowers the thread count back to s->threads if it rose. */
void model_scratch_guard(const model_scratch *s);

/* The pieces of a step; B and T are the acts'. inputs/targets are (B,T) ids < V. */
void model_embed_forward(const model_gpt *g, model_acts *a, const int32_t *inputs);
void model_block_forward(const model_gpt *g, model_acts *a, model_scratch *s, int l);
/* Final layernorm, logits, losses. dscale != 0: also replaces the logits by dlogits
 * scaled by dscale, ready for model_head_backward. Returns the sum of the token losses. */
double model_head_forward(const model_gpt *g, model_acts *a, const int32_t *targets, float dscale);
void model_head_backward(model_gpt *g, model_acts *a, model_scratch *s);
void model_block_backward(model_gpt *g, model_acts *a, model_scratch *s, int l);
void model_embed_backward(model_gpt *g, model_acts *a, model_scratch *s);

/* The whole model on one micro-batch: forward (and, with dscale != 0, backward, adding
 * into g->grads). a must hold every layer and the head. Returns the sum of token losses. */
double model_forward_backward(model_gpt *g, model_acts *a, model_scratch *s, const int32_t *inputs,
                              const int32_t *targets, float dscale);

/* Training FLOPs (forward + backward) per token of a sequence of length T, counting the
 * causal half of attention. */
double model_flops_per_token(const model_config *cfg, int T);

#endif
