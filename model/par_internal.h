/* Shared by the parallel trainer's files: par_layout.c (tables, buffers, pieces), par_ops.c
 * (the pieces of a step on this rank's tensors, with the tensor-parallel all-reduces) and
 * par_step.c (the 1F1B schedule, buckets, ZeRO, the optimizer step). */
#ifndef NEWT_MODEL_PAR_INTERNAL_H
#define NEWT_MODEL_PAR_INTERNAL_H

#include "model/parallel.h"

/* Local index of the tensor of `slot` in `layer` (layer ignored for wte, wpe, lnf), or -1. */
int par_local_index(const model_par *p, int slot, int layer);
/* Its parameters (in params, or with ZeRO 3 in the working buffer its bucket was gathered
 * into; NULL when it was not) and its gradients. */
float *par_param(const model_par *p, int slot, int layer);
float *par_grad(const model_par *p, int slot, int layer);
/* The part of local tensor k in this rank's data-parallel chunk of its bucket: [*a, *e) of
 * the local buffer, and *at, where *a sits in the shard buffers. 0 when empty. */
int par_chunk_part(const model_par *p, size_t k, size_t *a, size_t *e, size_t *at);
/* Is this rank's copy of local tensor t (or of a run of it) the one that counts once:
 * split tensors on every tensor-parallel rank, replicated ones on rank 0, wte on the first
 * stage (the head's copy is a duplicate). Data-parallel replicas aside. */
int par_primary(const model_par *p, const model_tensor *t);

/* The pieces of a step on this rank's tensors (acts a, the stage's scratch); tp is the
 * tensor-parallel group (NULL: tp = 1, and the ops are exactly model_*'s in gpt.c). */
newt_result_t par_embed_forward(const model_par *p, comm_t *tp, model_acts *a, const int32_t *inputs);
newt_result_t par_block_forward(const model_par *p, comm_t *tp, model_acts *a, model_scratch *s, int l);
/* Uploads the targets (host); *loss_acc (one device double) += the sum of the token losses
 * (the same on every tensor-parallel rank). par_embed_forward uploads the inputs (host). */
newt_result_t par_head_forward(const model_par *p, comm_t *tp, model_acts *a, const int32_t *targets, float dscale,
                               double *loss_acc);
newt_result_t par_head_backward(const model_par *p, comm_t *tp, model_acts *a, model_scratch *s);
newt_result_t par_block_backward(const model_par *p, comm_t *tp, model_acts *a, model_scratch *s, int l);
void par_embed_backward(const model_par *p, model_acts *a, model_scratch *s);

#endif
