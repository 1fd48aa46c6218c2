/* The strict test device (see dev_strict.h): the CPU device's memory and kernels behind
 * non-canonical pointers. Each entry of the table checks that its device arguments are
 * strict device pointers and its host arguments are not (aborting with the operation and
 * the argument named otherwise), translates them, and calls the same entry of
 * model_dev_cpu_ops (model/dev_internal.h) on the CPU device. */
#include "dev_strict.h"

#include <stdio.h>
#include <stdlib.h>

#include "model/dev_internal.h"

static const model_dev_ops *cpu(void) { return &model_dev_cpu_ops; }

/* A device argument: NULL, or a strict pointer (returned as its host address). */
static void *D(const void *p, const char *op, const char *arg) {
  if (!p) return NULL;
  if (!dev_strict_is_dev(p)) {
    fprintf(stderr, "dev_strict: %s: %s = %p is not device memory (a host pointer where model/dev.h wants a device "
                    "pointer)\n", op, arg, p);
    abort();
  }
  return dev_strict_host(p);
}

/* A host argument: must not be a strict pointer. */
static void *H(const void *p, const char *op, const char *arg) {
  if (dev_strict_is_dev(p)) {
    fprintf(stderr, "dev_strict: %s: %s = %p is device memory where model/dev.h wants host memory\n", op, arg, p);
    abort();
  }
  return (void *)(uintptr_t)p;
}

#define DF(p, op) ((float *)D((p), op, #p))
#define DI(p, op) ((const int32_t *)D((p), op, #p))

static void s_close(model_dev *d) { (void)d; }

static newt_result_t s_alloc(model_dev *d, size_t bytes, void **out) {
  (void)d;
  void *p;
  NEWT_CHECK(cpu()->alloc(model_dev_cpu(), bytes, &p));
  *out = (void *)((uintptr_t)p ^ DEV_STRICT_TAG);
  return NEWT_OK;
}
static void s_free(model_dev *d, void *p) {
  (void)d;
  cpu()->free(model_dev_cpu(), D(p, "free", "p"));
}
static newt_result_t s_host_alloc(model_dev *d, size_t bytes, void **out) {
  (void)d;
  return cpu()->host_alloc(model_dev_cpu(), bytes, out);
}
static void s_host_free(model_dev *d, void *p) {
  (void)d;
  cpu()->host_free(model_dev_cpu(), H(p, "host_free", "p"));
}
static newt_result_t s_upload(model_dev *d, void *dst, const void *src, size_t bytes) {
  (void)d;
  return cpu()->upload(model_dev_cpu(), D(dst, "upload", "dst"), H(src, "upload", "src"), bytes);
}
static newt_result_t s_download(model_dev *d, void *dst, const void *src, size_t bytes) {
  (void)d;
  return cpu()->download(model_dev_cpu(), H(dst, "download", "dst"), D(src, "download", "src"), bytes);
}
static void s_copy(model_dev *d, void *dst, const void *src, size_t bytes) {
  (void)d;
  cpu()->copy(model_dev_cpu(), D(dst, "copy", "dst"), D(src, "copy", "src"), bytes);
}
static void s_zero(model_dev *d, void *p, size_t bytes) {
  (void)d;
  cpu()->zero(model_dev_cpu(), D(p, "zero", "p"), bytes);
}
static newt_result_t s_sync(model_dev *d) {
  (void)d;
  return NEWT_OK;
}
static size_t s_scratch_floats(const model_dev *d, int T, int C, int NH) {
  (void)d;
  return cpu()->scratch_floats(model_dev_cpu(), T, C, NH);
}

/* ---- kernels ------------------------------------------------------------------------------------ */

static void s_encoder_forward(model_dev *d, float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                              int T, int C) {
  (void)d;
  const char *op = "encoder_forward";
  cpu()->encoder_forward(model_dev_cpu(), DF(out, op), DI(inp, op), DF(wte, op), DF(wpe, op), B, T, C);
}
static void s_encoder_backward(model_dev *d, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                               int T, int C) {
  (void)d;
  const char *op = "encoder_backward";
  cpu()->encoder_backward(model_dev_cpu(), DF(dwte, op), DF(dwpe, op), DF(dout, op), DI(inp, op), B, T, C);
}
static void s_embed_rows_forward(model_dev *d, float *out, const int32_t *inp, const float *wte, int BT, int C, int lo,
                                 int Vl) {
  (void)d;
  const char *op = "embed_rows_forward";
  cpu()->embed_rows_forward(model_dev_cpu(), DF(out, op), DI(inp, op), DF(wte, op), BT, C, lo, Vl);
}
static void s_add_positions(model_dev *d, float *x, const float *wpe, int B, int T, int C) {
  (void)d;
  const char *op = "add_positions";
  cpu()->add_positions(model_dev_cpu(), DF(x, op), DF(wpe, op), B, T, C);
}
static void s_embed_rows_backward(model_dev *d, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                                  int T, int C, int lo, int Vl) {
  (void)d;
  const char *op = "embed_rows_backward";
  cpu()->embed_rows_backward(model_dev_cpu(), DF(dwte, op), DF(dwpe, op), DF(dout, op), DI(inp, op), B, T, C, lo, Vl);
}
static void s_layernorm_forward(model_dev *d, float *out, float *mean, float *rstd, const float *inp,
                                const float *weight, const float *bias, int B, int T, int C) {
  (void)d;
  const char *op = "layernorm_forward";
  cpu()->layernorm_forward(model_dev_cpu(), DF(out, op), DF(mean, op), DF(rstd, op), DF(inp, op), DF(weight, op),
                           DF(bias, op), B, T, C);
}
static void s_layernorm_backward(model_dev *d, float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, const float *mean, const float *rstd, int B,
                                 int T, int C, float *scratch) {
  (void)d;
  const char *op = "layernorm_backward";
  cpu()->layernorm_backward(model_dev_cpu(), DF(dinp, op), DF(dweight, op), DF(dbias, op), DF(dout, op), DF(inp, op),
                            DF(weight, op), DF(mean, op), DF(rstd, op), B, T, C, DF(scratch, op));
}
static void s_matmul_forward(model_dev *d, float *out, const float *res, const float *inp, const float *weight,
                             const float *bias, int B, int T, int C, int OC) {
  (void)d;
  const char *op = "matmul_forward";
  cpu()->matmul_forward(model_dev_cpu(), DF(out, op), DF(res, op), DF(inp, op), DF(weight, op), DF(bias, op), B, T, C,
                        OC);
}
static void s_matmul_backward(model_dev *d, float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, int B, int T, int C, int OC) {
  (void)d;
  const char *op = "matmul_backward";
  cpu()->matmul_backward(model_dev_cpu(), DF(dinp, op), DF(dweight, op), DF(dbias, op), DF(dout, op), DF(inp, op),
                         DF(weight, op), B, T, C, OC);
}
static void s_attention_forward(model_dev *d, float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                                float *scratch) {
  (void)d;
  const char *op = "attention_forward";
  cpu()->attention_forward(model_dev_cpu(), DF(out, op), DF(att, op), DF(qkv, op), B, T, C, NH, DF(scratch, op));
}
static void s_attention_backward(model_dev *d, float *dqkv, const float *dout, const float *att, const float *qkv,
                                 int B, int T, int C, int NH, float *scratch) {
  (void)d;
  const char *op = "attention_backward";
  cpu()->attention_backward(model_dev_cpu(), DF(dqkv, op), DF(dout, op), DF(att, op), DF(qkv, op), B, T, C, NH,
                            DF(scratch, op));
}
static void s_gelu_forward(model_dev *d, float *out, const float *inp, size_t N) {
  (void)d;
  cpu()->gelu_forward(model_dev_cpu(), DF(out, "gelu_forward"), DF(inp, "gelu_forward"), N);
}
static void s_gelu_backward(model_dev *d, float *dinp, const float *inp, const float *dout, size_t N) {
  (void)d;
  const char *op = "gelu_backward";
  cpu()->gelu_backward(model_dev_cpu(), DF(dinp, op), DF(inp, op), DF(dout, op), N);
}
static void s_add_res_bias(model_dev *d, float *out, const float *res, const float *bias, size_t BT, size_t C) {
  (void)d;
  const char *op = "add_res_bias";
  cpu()->add_res_bias(model_dev_cpu(), DF(out, op), DF(res, op), DF(bias, op), BT, C);
}
static void s_crossentropy(model_dev *d, float *losses, float *dlogits, const float *logits, const int32_t *targets,
                           int B, int T, int V, float dscale, double *loss_acc) {
  (void)d;
  const char *op = "crossentropy";
  cpu()->crossentropy(model_dev_cpu(), DF(losses, op), DF(dlogits, op), DF(logits, op), DI(targets, op), B, T, V,
                      dscale, (double *)D(loss_acc, op, "loss_acc"));
}
static void s_ce_rowmax(model_dev *d, float *mx, const float *logits, int BT, int Vl) {
  (void)d;
  cpu()->ce_rowmax(model_dev_cpu(), DF(mx, "ce_rowmax"), DF(logits, "ce_rowmax"), BT, Vl);
}
static void s_ce_partials(model_dev *d, float *st, const float *logits, const float *mx, const int32_t *targets,
                          int BT, int Vl, int lo) {
  (void)d;
  const char *op = "ce_partials";
  cpu()->ce_partials(model_dev_cpu(), DF(st, op), DF(logits, op), DF(mx, op), DI(targets, op), BT, Vl, lo);
}
static void s_ce_finish(model_dev *d, float *losses, float *logits, const float *mx, const float *st,
                        const int32_t *targets, int BT, int Vl, int lo, float dscale, double *loss_acc) {
  (void)d;
  const char *op = "ce_finish";
  cpu()->ce_finish(model_dev_cpu(), DF(losses, op), DF(logits, op), DF(mx, op), DF(st, op), DI(targets, op), BT, Vl,
                   lo, dscale, (double *)D(loss_acc, op, "loss_acc"));
}
static void s_sqnorm(model_dev *d, double *acc, const float *x, size_t n) {
  (void)d;
  cpu()->sqnorm(model_dev_cpu(), (double *)D(acc, "sqnorm", "acc"), DF(x, "sqnorm"), n);
}
/* The optimizer's state is a host struct whose moments are device memory: a copy with the
 * moments translated runs, and its update count comes back. */
static void s_adamw(model_dev *d, model_adamw *o, const model_layout *lay, float *params, const float *grads,
                    double lr, float grad_scale) {
  (void)d;
  const char *op = "adamw";
  model_adamw h = *(model_adamw *)H(o, op, "o");
  h.m = DF(o->m, op);
  h.v = DF(o->v, op);
  cpu()->adamw(model_dev_cpu(), &h, H(lay, op, "lay"), DF(params, op), DF(grads, op), lr, grad_scale);
  o->t = h.t;
}

static const model_dev_ops strict_ops = {
    .close = s_close,
    .alloc = s_alloc,
    .free = s_free,
    .host_alloc = s_host_alloc,
    .host_free = s_host_free,
    .upload = s_upload,
    .download = s_download,
    .copy = s_copy,
    .zero = s_zero,
    .sync = s_sync,
    .scratch_floats = s_scratch_floats,
    .encoder_forward = s_encoder_forward,
    .encoder_backward = s_encoder_backward,
    .embed_rows_forward = s_embed_rows_forward,
    .add_positions = s_add_positions,
    .embed_rows_backward = s_embed_rows_backward,
    .layernorm_forward = s_layernorm_forward,
    .layernorm_backward = s_layernorm_backward,
    .matmul_forward = s_matmul_forward,
    .matmul_backward = s_matmul_backward,
    .attention_forward = s_attention_forward,
    .attention_backward = s_attention_backward,
    .gelu_forward = s_gelu_forward,
    .gelu_backward = s_gelu_backward,
    .add_res_bias = s_add_res_bias,
    .crossentropy = s_crossentropy,
    .ce_rowmax = s_ce_rowmax,
    .ce_partials = s_ce_partials,
    .ce_finish = s_ce_finish,
    .sqnorm = s_sqnorm,
    .adamw = s_adamw,
};

model_dev *dev_strict(void) {
  /* kind CPU: the CPU's kernels (and model_dev_close leaves it alone); host_visible 0 */
  static model_dev strict = {.ops = &strict_ops, .kind = MODEL_DEV_CPU, .ordinal = -1, .host_visible = 0,
                             .name = "strict (tests: the CPU device behind non-canonical pointers)"};
  return &strict;
}
