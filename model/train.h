/* Single-process training: the loop `newt train` runs, and the pieces a worker calls.
 *
 * A trainer owns the model (params, grads), one micro-batch of activations, the scratch
 * and the AdamW state over the whole buffer. One optimizer step over a global batch of
 * `batch` sequences runs them in micro-batches of `micro_batch` (gradient accumulation),
 * each scaled by 1 / (batch * T) so the gradient is that of the mean loss over the whole
 * global batch, then clips by the global norm and applies AdamW at the schedule's rate:
 *
 *   model_trainer_zero -> model_trainer_accumulate (any number of times; a worker
 *   all-reduces the grads here) -> model_trainer_apply
 *
 * model_trainer_step does the three on one batch; model_trainer_step_data takes the batch
 * at the loader's cursor and advances it. */
#ifndef NEWT_MODEL_TRAIN_H
#define NEWT_MODEL_TRAIN_H

#include <stdint.h>

#include "common/err.h"
#include "model/gpt.h"
#include "model/loader.h"
#include "model/optim.h"

typedef struct model_train_config {
  model_config model;
  model_adamw_config optim;
  int batch;          /* global batch, sequences per optimizer step */
  int micro_batch;    /* sequences per forward/backward (batch need not be a multiple) */
  int seq_len;        /* T <= model.ctx */
  uint64_t seed;      /* initial weights */
  uint64_t data_seed; /* sample order */
  int threads;        /* <= 0: all cores */
} model_train_config;

/* The tiny preset, batch 8, micro-batch 8, T = ctx, seed 1, data seed 1, AdamW defaults
 * for `steps` steps, 1 thread. */
newt_result_t model_train_defaults(model_train_config *c, const char *preset, int64_t steps);
newt_result_t model_train_config_check(const model_train_config *c);

typedef struct model_step_info {
  int64_t step;     /* 1-based number of the step just done */
  double loss;      /* mean token loss over the global batch */
  double lr;
  double grad_norm; /* before clipping */
  int64_t tokens;
  double ms;        /* wall time of the step */
} model_step_info;

typedef struct model_trainer {
  model_train_config cfg;
  model_gpt gpt;
  model_acts acts;
  model_scratch scratch;
  model_adamw opt;
  int32_t *inputs, *targets; /* (batch, T) staging for step_data */
  int64_t step;              /* optimizer steps done */
  uint64_t cursor;           /* samples consumed */
  double loss_sum;           /* sum of token losses since the last zero */
  int64_t loss_tokens;
} model_trainer;

/* Sets the thread count, allocates everything and initialises the weights from cfg->seed. */
newt_result_t model_trainer_init(model_trainer *tr, const model_train_config *cfg);
void model_trainer_free(model_trainer *tr);

void model_trainer_zero(model_trainer *tr);
/* Forward + backward of nseq sequences (nseq, T) in micro-batches, gradients scaled by
 * dscale per token (1 / tokens of the global batch). Returns the sum of their token losses. */
double model_trainer_accumulate(model_trainer *tr, const int32_t *inputs, const int32_t *targets,
                                int nseq, float dscale);
/* Clip, AdamW at model_lr_at(step), step++. info gets the step, lr, norm, and the mean
 * of the losses accumulated since model_trainer_zero. */
void model_trainer_apply(model_trainer *tr, model_step_info *info);

/* One optimizer step on nseq sequences (the global batch). */
newt_result_t model_trainer_step(model_trainer *tr, const int32_t *inputs, const int32_t *targets,
                                 int nseq, model_step_info *info);
/* One step on samples [cursor, cursor + batch) of the loader; advances the cursor. */
newt_result_t model_trainer_step_data(model_trainer *tr, const model_loader *ld, model_step_info *info);

#endif
