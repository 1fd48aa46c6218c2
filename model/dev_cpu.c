/* The CPU device (dev.h): host memory, and the kernels of ops.h run at once on the calling
 * thread's OpenMP team. The few loops of the parallel trainer that are not ops of the
 * single-process model (the vocab-parallel embedding and cross-entropy, the rest of a
 * row-parallel linear) are here, written as they were in par_ops.c so that every layout
 * keeps its bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/dev_internal.h"
#include "model/ops.h"

static newt_result_t cpu_alloc(model_dev *d, size_t bytes, void **out) {
  (void)d;
  size_t rounded = (bytes + 63) / 64 * 64;
  void *p = aligned_alloc(64, rounded);
  if (!p) return NEWT_ERR(NEWT_ERR_NOMEM, "cpu: out of memory for %zu bytes", bytes);
  memset(p, 0, rounded); /* touch the pages now, not in the first step */
  *out = p;
  return NEWT_OK;
}

static void cpu_free(model_dev *d, void *p) {
  (void)d;
  free(p);
}

static newt_result_t cpu_copy_sync(model_dev *d, void *dst, const void *src, size_t bytes) {
  (void)d;
  memcpy(dst, src, bytes);
  return NEWT_OK;
}

static void cpu_copy(model_dev *d, void *dst, const void *src, size_t bytes) {
  (void)d;
  memcpy(dst, src, bytes);
}

static void cpu_zero(model_dev *d, void *p, size_t bytes) {
  (void)d;
  memset(p, 0, bytes);
}

static newt_result_t cpu_sync(model_dev *d) {
  (void)d;
  return NEWT_OK;
}

static size_t cpu_scratch_floats(const model_dev *d, int T, int C, int NH) {
  (void)d;
  return model_ops_scratch_floats(T, C, NH);
}

/* ---- the ops of ops.h ---------------------------------------------------------------------- */

static void cpu_encoder_forward(model_dev *d, float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                                int T, int C) {
  (void)d;
  model_encoder_forward(out, inp, wte, wpe, B, T, C);
}
static void cpu_encoder_backward(model_dev *d, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                                 int T, int C) {
  (void)d;
  model_encoder_backward(dwte, dwpe, dout, inp, B, T, C);
}
static void cpu_layernorm_forward(model_dev *d, float *out, float *mean, float *rstd, const float *inp,
                                  const float *weight, const float *bias, int B, int T, int C) {
  (void)d;
  model_layernorm_forward(out, mean, rstd, inp, weight, bias, B, T, C);
}
static void cpu_layernorm_backward(model_dev *d, float *dinp, float *dweight, float *dbias, const float *dout,
                                   const float *inp, const float *weight, const float *mean, const float *rstd, int B,
                                   int T, int C, float *scratch) {
  (void)d;
  model_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C, scratch);
}
static void cpu_matmul_forward(model_dev *d, float *out, const float *res, const float *inp, const float *weight,
                               const float *bias, int B, int T, int C, int OC) {
  (void)d;
  model_matmul_forward(out, res, inp, weight, bias, B, T, C, OC);
}
static void cpu_matmul_backward(model_dev *d, float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, int B, int T, int C, int OC) {
  (void)d;
  model_matmul_backward(dinp, dweight, dbias, dout, inp, weight, B, T, C, OC);
}
static void cpu_attention_forward(model_dev *d, float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                                  float *scratch) {
  (void)d;
  model_attention_forward(out, att, qkv, B, T, C, NH, scratch);
}
static void cpu_attention_backward(model_dev *d, float *dqkv, const float *dout, const float *att, const float *qkv,
                                   int B, int T, int C, int NH, float *scratch) {
  (void)d;
  model_attention_backward(dqkv, dout, att, qkv, B, T, C, NH, scratch);
}
static void cpu_gelu_forward(model_dev *d, float *out, const float *inp, size_t N) {
  (void)d;
  model_gelu_forward(out, inp, N);
}
static void cpu_gelu_backward(model_dev *d, float *dinp, const float *inp, const float *dout, size_t N) {
  (void)d;
  model_gelu_backward(dinp, inp, dout, N);
}
static void cpu_crossentropy(model_dev *d, float *losses, float *dlogits, const float *logits, const int32_t *targets,
                             int B, int T, int V, float dscale, double *loss_acc) {
  (void)d;
  *loss_acc += model_crossentropy_forward(losses, dlogits, logits, targets, B, T, V, dscale);
}

/* ---- the parallel trainer's own loops --------------------------------------------------------- */

static void cpu_embed_rows_forward(model_dev *d, float *out, const int32_t *inp, const float *wte, int BT, int C,
                                   int lo, int Vl) {
  (void)d;
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < BT; bt++) {
    int tok = inp[bt] - lo;
    float *o = out + (size_t)bt * C;
    if (tok >= 0 && tok < Vl) memcpy(o, wte + (size_t)tok * C, (size_t)C * sizeof(float));
    else memset(o, 0, (size_t)C * sizeof(float));
  }
}

static void cpu_add_positions(model_dev *d, float *x, const float *wpe, int B, int T, int C) {
  (void)d;
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < B * T; bt++) {
    float *o = x + (size_t)bt * C;
    const float *pe = wpe + (size_t)(bt % T) * C;
#pragma omp simd
    for (int i = 0; i < C; i++) o[i] = o[i] + pe[i];
  }
}

static void cpu_embed_rows_backward(model_dev *d, float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                                    int B, int T, int C, int lo, int Vl) {
  (void)d;
  /* blocks of channels per thread: no two threads add into the same element */
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += 16) {
    int c1 = c0 + 16 < C ? c0 + 16 : C;
    for (int bt = 0; bt < B * T; bt++) {
      const float *g = dout + (size_t)bt * C;
      float *pe = dwpe + (size_t)(bt % T) * C;
      int tok = inp[bt] - lo;
      float *e = tok >= 0 && tok < Vl ? dwte + (size_t)tok * C : NULL;
      for (int i = c0; i < c1; i++) {
        pe[i] += g[i];
        if (e) e[i] += g[i];
      }
    }
  }
}

/* in the order model_matmul_forward adds them */
static void cpu_add_res_bias(model_dev *d, float *out, const float *res, const float *bias, size_t BT, size_t C) {
  (void)d;
#pragma omp parallel for schedule(static)
  for (size_t bt = 0; bt < BT; bt++) {
    float *o = out + bt * C;
    const float *r = res + bt * C;
#pragma omp simd
    for (size_t i = 0; i < C; i++) o[i] = (r[i] + bias[i]) + o[i];
  }
}

static void cpu_ce_rowmax(model_dev *d, float *mx, const float *logits, int BT, int Vl) {
  (void)d;
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < BT; bt++) {
    const float *l = logits + (size_t)bt * Vl;
    float m = l[0];
    for (int v = 1; v < Vl; v++) m = l[v] > m ? l[v] : m;
    mx[bt] = m;
  }
}

static void cpu_ce_partials(model_dev *d, float *st, const float *logits, const float *mx, const int32_t *targets,
                            int BT, int Vl, int lo) {
  (void)d;
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < BT; bt++) {
    const float *l = logits + (size_t)bt * Vl;
    float m = mx[bt], sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < Vl; v++) sum += model_expf(l[v] - m);
    int y = targets[bt] - lo;
    st[2 * bt] = sum;
    st[2 * bt + 1] = y >= 0 && y < Vl ? l[y] : 0.0f;
  }
}

static void cpu_ce_finish(model_dev *d, float *losses, float *logits, const float *mx, const float *st,
                          const int32_t *targets, int BT, int Vl, int lo, float dscale, double *loss_acc) {
  (void)d;
  double sum_loss = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : sum_loss)
  for (int bt = 0; bt < BT; bt++) {
    float m = mx[bt], sum = st[2 * bt];
    float loss = logf(sum) + m - st[2 * bt + 1];
    losses[bt] = loss;
    sum_loss += loss;
    if (dscale != 0.0f) {
      float *g = logits + (size_t)bt * Vl, inv = 1.0f / sum;
#pragma omp simd
      for (int v = 0; v < Vl; v++) g[v] = model_expf(g[v] - m) * inv * dscale;
      int y = targets[bt] - lo;
      if (y >= 0 && y < Vl) g[y] -= dscale;
    }
  }
  *loss_acc += sum_loss;
}

static void cpu_sqnorm(model_dev *d, double *acc, const float *x, size_t n) {
  (void)d;
  *acc += model_sqnorm(x, n);
}

static void cpu_adamw(model_dev *d, model_adamw *o, const model_layout *lay, float *params, const float *grads,
                      double lr, float grad_scale) {
  (void)d;
  model_adamw_update(o, lay, params, grads, lr, grad_scale);
}

const model_dev_ops model_dev_cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .upload = cpu_copy_sync,
    .download = cpu_copy_sync,
    .download_async = cpu_copy, /* at once, as everything the CPU device queues */
    .upload_async = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .scratch_floats = cpu_scratch_floats,
    .encoder_forward = cpu_encoder_forward,
    .encoder_backward = cpu_encoder_backward,
    .embed_rows_forward = cpu_embed_rows_forward,
    .add_positions = cpu_add_positions,
    .embed_rows_backward = cpu_embed_rows_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .add_res_bias = cpu_add_res_bias,
    .crossentropy = cpu_crossentropy,
    .ce_rowmax = cpu_ce_rowmax,
    .ce_partials = cpu_ce_partials,
    .ce_finish = cpu_ce_finish,
    .sqnorm = cpu_sqnorm,
    .adamw = cpu_adamw,
};

model_dev *model_dev_cpu(void) {
  static model_dev cpu = {.ops = &model_dev_cpu_ops, .kind = MODEL_DEV_CPU, .ordinal = -1, .host_visible = 1,
                          .name = "cpu"};
  return &cpu;
}
