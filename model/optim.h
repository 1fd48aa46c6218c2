/* AdamW (decoupled weight decay), global gradient-norm clipping and the learning-rate
 * schedule (linear warmup, then cosine decay to lr_min).
 *
 * The optimizer state covers one (offset, length) range of the parameter buffer, so a
 * ZeRO shard is just a smaller range; the moments are indexed from that range's start.
 * Which elements decay comes from the tensor table (model_tensor.decay), looked up per
 * tensor that the range crosses. The update follows PyTorch's AdamW exactly:
 *
 *   p *= 1 - lr * wd                      (decayed tensors only)
 *   m = b1 m + (1 - b1) g ;  v = b2 v + (1 - b2) g^2
 *   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 *
 * Clipping is global: the caller sums model_sqnorm over its ranges (and over ranks),
 * takes the root and passes model_clip_scale(norm, max) as grad_scale. */
#ifndef NEWT_MODEL_OPTIM_H
#define NEWT_MODEL_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "model/layout.h"

typedef struct model_adamw_config {
  double lr;           /* peak learning rate */
  double lr_min;       /* floor of the cosine */
  int64_t warmup;      /* steps of linear warmup */
  int64_t steps;       /* total steps the cosine spans */
  double beta1, beta2, eps;
  double weight_decay; /* on tensors with decay = 1 */
  double grad_clip;    /* max global gradient norm; <= 0: no clipping */
} model_adamw_config;

/* lr 1e-3 -> 1e-4 over `steps` with 5% warmup (at least 1 step), betas (0.9, 0.95),
 * eps 1e-8, weight decay 0.1, clip 1.0. */
model_adamw_config model_adamw_defaults(int64_t steps);

newt_result_t model_adamw_config_check(const model_adamw_config *c);

/* Learning rate of 0-based step `step`: (step+1)/warmup * lr during warmup, then cosine
 * from lr to lr_min over the remaining steps, lr_min after them. */
double model_lr_at(const model_adamw_config *c, int64_t step);

typedef struct model_adamw {
  model_adamw_config hp;
  size_t off, len; /* the range of the buffer this state covers */
  float *m, *v;    /* len floats each */
  int64_t t;       /* updates done */
  int owned;       /* m and v are model_adamw_init's (model_adamw_free frees them) */
} model_adamw;

newt_result_t model_adamw_init(model_adamw *o, const model_adamw_config *hp, size_t off, size_t len);
/* The same over moments the caller allocated and zeroed (len floats each; device memory
 * from model_dev_alloc for a trainer on a device, model/dev.h): model_adamw_free leaves
 * them to the caller. */
newt_result_t model_adamw_init_with(model_adamw *o, const model_adamw_config *hp, size_t off, size_t len, float *m,
                                    float *v);
void model_adamw_free(model_adamw *o);

/* One update of params[off, off+len) from grads (both full-layout buffers) times
 * grad_scale, at learning rate lr. */
void model_adamw_update(model_adamw *o, const model_layout *lay, float *params, const float *grads,
                        double lr, float grad_scale);

/* Sum of squares of x[0, n) in double. */
double model_sqnorm(const float *x, size_t n);

/* PyTorch's clip_grad_norm_ factor: min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0. */
float model_clip_scale(double norm, double max_norm);

#endif
