/* AdamW, clipping and the schedule (see optim.h). */
#include "model/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

model_adamw_config model_adamw_defaults(int64_t steps) {
  model_adamw_config c = {.lr = 1e-3, .lr_min = 1e-4, .steps = steps, .beta1 = 0.9, .beta2 = 0.95,
                          .eps = 1e-8, .weight_decay = 0.1, .grad_clip = 1.0};
  c.warmup = steps / 20 > 1 ? steps / 20 : 1;
  return c;
}

newt_result_t model_adamw_config_check(const model_adamw_config *c) {
  if (!(c->lr > 0) || !isfinite(c->lr)) return NEWT_ERR(NEWT_ERR_INVALID, "optim.lr = %g: must be > 0", c->lr);
  if (!(c->lr_min >= 0) || c->lr_min > c->lr)
    return NEWT_ERR(NEWT_ERR_INVALID, "optim.lr_min = %g: must be in [0, lr = %g]", c->lr_min, c->lr);
  if (c->warmup < 0) return NEWT_ERR(NEWT_ERR_INVALID, "optim.warmup = %lld: must be >= 0", (long long)c->warmup);
  if (c->steps < 1) return NEWT_ERR(NEWT_ERR_INVALID, "optim.steps = %lld: must be >= 1", (long long)c->steps);
  if (!(c->beta1 >= 0 && c->beta1 < 1)) return NEWT_ERR(NEWT_ERR_INVALID, "optim.beta1 = %g: must be in [0, 1)", c->beta1);
  if (!(c->beta2 >= 0 && c->beta2 < 1)) return NEWT_ERR(NEWT_ERR_INVALID, "optim.beta2 = %g: must be in [0, 1)", c->beta2);
  if (!(c->eps > 0)) return NEWT_ERR(NEWT_ERR_INVALID, "optim.eps = %g: must be > 0", c->eps);
  if (!(c->weight_decay >= 0))
    return NEWT_ERR(NEWT_ERR_INVALID, "optim.weight_decay = %g: must be >= 0", c->weight_decay);
  if (isnan(c->grad_clip)) return NEWT_ERR(NEWT_ERR_INVALID, "optim.grad_clip is not a number");
  return NEWT_OK;
}

double model_lr_at(const model_adamw_config *c, int64_t step) {
  if (step < c->warmup) return c->lr * (double)(step + 1) / (double)c->warmup;
  int64_t span = c->steps - c->warmup;
  if (span <= 0 || step >= c->steps) return c->lr_min;
  double progress = (double)(step - c->warmup) / (double)span;
  return c->lr_min + 0.5 * (c->lr - c->lr_min) * (1.0 + cos(M_PI * progress));
}

newt_result_t model_adamw_init(model_adamw *o, const model_adamw_config *hp, size_t off, size_t len) {
  memset(o, 0, sizeof *o);
  NEWT_CHECK(model_adamw_config_check(hp));
  o->hp = *hp;
  o->off = off;
  o->len = len;
  size_t bytes = (len ? len : 1) * sizeof(float);
  o->m = malloc(bytes);
  o->v = malloc(bytes);
  o->owned = 1;
  if (!o->m || !o->v) {
    model_adamw_free(o);
    return NEWT_ERR(NEWT_ERR_NOMEM, "optim: out of memory for moments of %zu parameters", len);
  }
  memset(o->m, 0, bytes); /* touch the pages now, not in the first step */
  memset(o->v, 0, bytes);
  return NEWT_OK;
}

newt_result_t model_adamw_init_with(model_adamw *o, const model_adamw_config *hp, size_t off, size_t len, float *m,
                                    float *v) {
  memset(o, 0, sizeof *o);
  NEWT_CHECK(model_adamw_config_check(hp));
  *o = (model_adamw){.hp = *hp, .off = off, .len = len, .m = m, .v = v};
  return NEWT_OK;
}

void model_adamw_free(model_adamw *o) {
  if (o->owned) {
    free(o->m);
    free(o->v);
  }
  memset(o, 0, sizeof *o);
}

void model_adamw_update(model_adamw *o, const model_layout *lay, float *params, const float *grads,
                        double lr, float grad_scale) {
  o->t++;
  const model_adamw_config *h = &o->hp;
  double bc1 = 1.0 - pow(h->beta1, (double)o->t), bc2 = 1.0 - pow(h->beta2, (double)o->t);
  const float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2), eps = (float)h->eps;
  const float b1 = (float)h->beta1, b2 = (float)h->beta2, gs = grad_scale;
  const float wdecay = (float)(1.0 - lr * h->weight_decay);
  const size_t lo = o->off, hi = o->off + o->len;
  float *m = o->m, *v = o->v;
  /* one parallel region: each thread takes its static share of every tensor's run */
#pragma omp parallel
  for (size_t k = 0; k < lay->n; k++) {
    const model_tensor *t = &lay->tensors[k];
    size_t a = t->offset > lo ? t->offset : lo, b = t->offset + t->size < hi ? t->offset + t->size : hi;
    if (a >= b) continue;
    const float decay = t->decay ? wdecay : 1.0f;
#pragma omp for simd schedule(static) nowait
    for (size_t i = a; i < b; i++) {
      float gi = grads[i] * gs;
      float mi = b1 * m[i - lo] + (1.0f - b1) * gi;
      float vi = b2 * v[i - lo] + (1.0f - b2) * gi * gi;
      m[i - lo] = mi;
      v[i - lo] = vi;
      params[i] = params[i] * decay - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
    }
  }
}

double model_sqnorm(const float *x, size_t n) {
  double s = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : s)
  for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
  return s;
}

float model_clip_scale(double norm, double max_norm) {
  if (!(max_norm > 0)) return 1.0f;
  double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? (float)c : 1.0f;
}
