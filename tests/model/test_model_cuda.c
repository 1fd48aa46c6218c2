/* The CUDA model against the CPU model (label gpu: needs an NVIDIA GPU; run by
 * tests/gpu/run.sh). Same weights, same batch: logits and loss, every gradient tensor, and
 * the losses and weights after 5 AdamW steps must agree within bf16 tolerances (relative
 * error norms of a few percent); the worst tensor is printed. */
#include <stdlib.h>
#include <string.h>

#include "model/gpt.h"
#include "model_test.h"
#include "model/gpt_cuda.h"
#include "model/ops.h"
#include "model/optim.h"
#include "model/rng.h"
#include "test.h"

/* ||a - b|| / ||b|| over n elements */
static double rel_err(const float *a, const float *b, size_t n) {
  double d = 0, r = 0;
  for (size_t i = 0; i < n; i++) {
    d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    r += (double)b[i] * b[i];
  }
  return sqrt(d / (r > 0 ? r : 1e-30));
}

static void test_cuda_matches_cpu(void) {
  model_threads_set(2);
  model_config cfg;
  T_OK(model_config_preset("tiny", &cfg));
  int B = 4, T = (int)cfg.ctx, V = (int)cfg.vocab;
  model_gpt g;
  model_acts a;
  model_scratch s;
  whole_init(&g, &a, &s, &cfg, B, T);
  model_gpt_init_weights(&g, 3);
  for (size_t k = 0; k < g.layout.n; k++) { /* non-trivial layernorm weights and biases */
    const model_tensor *t = &g.layout.tensors[k];
    if (t->ndim == 1)
      for (size_t i = 0; i < t->size; i++) g.params[t->offset + i] += (float)(0.05 * model_rng_normal(4, k, i));
  }
  int32_t *x = malloc((size_t)B * T * 4), *y = malloc((size_t)B * T * 4);
  for (int i = 0; i < B * T; i++) {
    x[i] = (int32_t)(model_rng_u64(5, 1, i) % V);
    y[i] = (int32_t)(model_rng_u64(5, 2, i) % V);
  }
  model_cuda *m = NULL;
  T_OK(model_cuda_init(&m, &cfg, B, T));
  if (!m) return;
  T_OK(model_cuda_set_params(m, g.params));
  size_t n = g.layout.total, nl = (size_t)B * T * V;
  float *buf = malloc((n > nl ? n : nl) * sizeof(float));

  /* forward */
  double lc = model_forward_backward(&g, &a, &s, x, y, 0.0f) / (B * T), lg = 0;
  T_OK(model_cuda_forward_backward(m, x, y, 0.0f, &lg));
  lg /= B * T;
  T_OK(model_cuda_get_logits(m, buf));
  double le = rel_err(buf, a.logits, nl);
  fprintf(stderr, "  loss cpu %.5f gpu %.5f, logits relative error %.4f\n", lc, lg, le);
  T_CHECK(le < 0.03);
  T_NEAR(lg, lc, 0.02);

  /* backward: every gradient */
  float dscale = 1.0f / (B * T);
  model_gpt_zero_grads(&g);
  model_forward_backward(&g, &a, &s, x, y, dscale);
  T_OK(model_cuda_zero_grads(m));
  T_OK(model_cuda_forward_backward(m, x, y, dscale, &lg));
  T_OK(model_cuda_get_grads(m, buf));
  double worst = 0;
  const char *wname = "";
  for (size_t k = 0; k < g.layout.n; k++) {
    const model_tensor *t = &g.layout.tensors[k];
    double e = rel_err(buf + t->offset, g.grads + t->offset, t->size);
    if (e > worst) {
      worst = e;
      wname = t->name;
    }
  }
  fprintf(stderr, "  gradients: worst relative error %.4f in %s\n", worst, wname);
  T_CHECK_MSG(worst < 0.08, "gradient of %s differs by %.4f (relative norm)", wname, worst);
  T_CHECK(rel_err(buf, g.grads, n) < 0.04);

  /* 5 AdamW steps on both */
  model_adamw_config hp = model_adamw_defaults(5);
  model_adamw opt;
  T_OK(model_adamw_init(&opt, &hp, 0, n));
  for (int step = 0; step < 5; step++) {
    double lr = model_lr_at(&hp, step), gn_gpu = 0;
    model_gpt_zero_grads(&g);
    lc = model_forward_backward(&g, &a, &s, x, y, dscale) / (B * T);
    double gn = sqrt(model_sqnorm(g.grads, n));
    model_adamw_update(&opt, &g.layout, g.params, g.grads, lr, model_clip_scale(gn, hp.grad_clip));
    T_OK(model_cuda_zero_grads(m));
    T_OK(model_cuda_forward_backward(m, x, y, dscale, &lg));
    T_OK(model_cuda_adamw(m, &hp, step + 1, lr, &gn_gpu));
    lg /= B * T;
    fprintf(stderr, "  step %d: loss cpu %.5f gpu %.5f, grad norm cpu %.4f gpu %.4f\n", step, lc, lg, gn, gn_gpu);
    T_NEAR(lg, lc, 0.03);
    T_NEAR(gn_gpu, gn, 0.05 * gn);
  }
  T_OK(model_cuda_get_params(m, buf));
  double pe = rel_err(buf, g.params, n);
  fprintf(stderr, "  weights after 5 steps: relative error %.5f\n", pe);
  T_CHECK(pe < 0.02);
  model_adamw_free(&opt);
  model_cuda_free(m);
  free(buf);
  free(x);
  free(y);
  whole_free(&g, &a, &s);
}

int main(void) {
  T_RUN(test_cuda_matches_cpu);
  return T_DONE();
}
