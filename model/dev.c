/* The public face of the device interface (dev.h): dispatch to the device's table of
 * operations (dev_internal.h), and the checks of the sticky error every implementation
 * shares (recorded by dev_err.c's model_dev_fail). A device
 * that failed runs no more kernels: each is skipped, and the error comes back from the
 * next sync or download. */
#include <stdio.h>
#include <string.h>

#ifdef NEWT_HAVE_CUDA
#include <cuda_runtime.h>
#ifndef NEWT_GPU_DOUBLE
#include "model/cuda/cublas_lib.h"
#endif
#endif

#include "comm/comm.h"
#include "model/dev_internal.h"

static newt_result_t failed(const model_dev *d) {
  return NEWT_ERR(d->err, "%s: %s", d->name, d->errmsg);
}

newt_result_t model_dev_open(model_dev_kind kind, int ordinal, model_dev **out) {
  *out = NULL;
  if (kind == MODEL_DEV_CPU) {
    *out = model_dev_cpu();
    return NEWT_OK;
  }
  if (kind != MODEL_DEV_CUDA) return NEWT_ERR(NEWT_ERR_INVALID, "model_dev_open: no device kind %d", (int)kind);
#ifdef NEWT_HAVE_CUDA
  return model_dev_cuda_open(ordinal, out);
#else
  return NEWT_ERR(NEWT_ERR_UNSUPPORTED, "cuda:%d: this newt was built without CUDA (the CUDA toolkit was not found "
                  "when it was configured)", ordinal);
#endif
}

int model_dev_cuda_count(void) { return comm_gpu_count(NULL); }

newt_result_t model_dev_cuda_describe(char *desc, size_t n) {
#ifdef NEWT_HAVE_CUDA
  int rt = 0, drv = 0;
  (void)cudaRuntimeGetVersion(&rt);
  cudaError_t e = cudaDriverGetVersion(&drv);
  if (e != cudaSuccess || drv == 0) {
    (void)cudaGetLastError();
    snprintf(desc, n, "CUDA runtime %d.%d", rt / 1000, rt % 1000 / 10);
    return NEWT_ERR(NEWT_ERR_CUDA, "no CUDA driver (libcuda.so.1) could be loaded: no GPU can be used");
  }
  int count_err = 0, count = comm_gpu_count(&count_err);
  e = (cudaError_t)count_err;
  char name[sizeof ((struct cudaDeviceProp *)0)->name + 8] = "";
  struct cudaDeviceProp prop;
  if (count > 0 && cudaGetDeviceProperties(&prop, 0) == cudaSuccess) snprintf(name, sizeof name, " (%s)", prop.name);
  snprintf(desc, n, "CUDA runtime %d.%d, driver %d.%d, %d GPU%s%s", rt / 1000, rt % 1000 / 10, drv / 1000,
           drv % 1000 / 10, count, count == 1 ? "" : "s", name);
  if (count <= 0)
    return NEWT_ERR(NEWT_ERR_CUDA, "no GPU is visible (%s)", e == cudaSuccess ? "none found" : cudaGetErrorString(e));
  return NEWT_OK;
#else
  snprintf(desc, n, "no CUDA");
  return NEWT_ERR(NEWT_ERR_UNSUPPORTED, "this newt was built without CUDA");
#endif
}

newt_result_t model_dev_cuda_library(char *desc, size_t n) {
#if defined(NEWT_GPU_DOUBLE)
  snprintf(desc, n, "cuBLAS: the test double's kernels (linked)");
  return NEWT_OK;
#elif defined(NEWT_HAVE_CUDA)
  return cublas_lib_describe(desc, n);
#else
  snprintf(desc, n, "no cuBLAS");
  return NEWT_ERR(NEWT_ERR_UNSUPPORTED, "this newt was built without CUDA");
#endif
}

void model_dev_close(model_dev *d) {
  if (d && d->kind != MODEL_DEV_CPU && d->ops->close) d->ops->close(d);
}

model_dev_kind model_dev_kind_of(const model_dev *d) { return d->kind; }
int model_dev_ordinal(const model_dev *d) { return d->ordinal; }
void *model_dev_stream(const model_dev *d) { return d->stream; }
int model_dev_host_visible(const model_dev *d) { return d->host_visible; }
const char *model_dev_name(const model_dev *d) { return d->name; }
double model_dev_peak_flops(const model_dev *d) { return d->peak_flops; }

newt_result_t model_dev_alloc(model_dev *d, size_t bytes, void **out) {
  *out = NULL;
  if (d->err != NEWT_OK) return failed(d);
  return bytes ? d->ops->alloc(d, bytes, out) : NEWT_OK;
}

void model_dev_free(model_dev *d, void *p) {
  if (p) d->ops->free(d, p);
}

newt_result_t model_dev_host_alloc(model_dev *d, size_t bytes, void **out) {
  *out = NULL;
  return bytes ? d->ops->host_alloc(d, bytes, out) : NEWT_OK;
}

void model_dev_host_free(model_dev *d, void *p) {
  if (p) d->ops->host_free(d, p);
}

newt_result_t model_dev_upload(model_dev *d, void *dst, const void *src, size_t bytes) {
  if (d->err != NEWT_OK) return failed(d);
  return bytes ? d->ops->upload(d, dst, src, bytes) : NEWT_OK;
}

newt_result_t model_dev_download(model_dev *d, void *dst, const void *src, size_t bytes) {
  if (d->err != NEWT_OK) return failed(d);
  return bytes ? d->ops->download(d, dst, src, bytes) : d->ops->sync(d);
}

void model_dev_download_async(model_dev *d, void *dst, const void *src, size_t bytes) {
  if (d->err == NEWT_OK && bytes) d->ops->download_async(d, dst, src, bytes);
}

void model_dev_upload_async(model_dev *d, void *dst, const void *src, size_t bytes) {
  if (d->err == NEWT_OK && bytes) d->ops->upload_async(d, dst, src, bytes);
}

void model_dev_copy(model_dev *d, void *dst, const void *src, size_t bytes) {
  if (d->err == NEWT_OK && bytes && dst != src) d->ops->copy(d, dst, src, bytes);
}

void model_dev_zero(model_dev *d, void *p, size_t bytes) {
  if (d->err == NEWT_OK && bytes) d->ops->zero(d, p, bytes);
}

newt_result_t model_dev_sync(model_dev *d) {
  if (d->err != NEWT_OK) return failed(d);
  return d->ops->sync(d);
}

newt_result_t model_dev_error(const model_dev *d) { return d->err == NEWT_OK ? NEWT_OK : failed(d); }

size_t model_dev_scratch_floats(const model_dev *d, int T, int C, int NH) { return d->ops->scratch_floats(d, T, C, NH); }

/* ---- kernels: skipped on a failed device ---------------------------------------------------- */

#define K(name, ...)                                \
  do {                                              \
    if (d->err == NEWT_OK) d->ops->name(d, __VA_ARGS__); \
  } while (0)

void model_k_encoder_forward(model_dev *d, float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                             int T, int C) {
  K(encoder_forward, out, inp, wte, wpe, B, T, C);
}
void model_k_encoder_backward(model_dev *d, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                              int T, int C) {
  K(encoder_backward, dwte, dwpe, dout, inp, B, T, C);
}
void model_k_embed_rows_forward(model_dev *d, float *out, const int32_t *inp, const float *wte, int BT, int C, int lo,
                                int Vl) {
  K(embed_rows_forward, out, inp, wte, BT, C, lo, Vl);
}
void model_k_add_positions(model_dev *d, float *x, const float *wpe, int B, int T, int C) {
  K(add_positions, x, wpe, B, T, C);
}
void model_k_embed_rows_backward(model_dev *d, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                                 int T, int C, int lo, int Vl) {
  K(embed_rows_backward, dwte, dwpe, dout, inp, B, T, C, lo, Vl);
}
void model_k_layernorm_forward(model_dev *d, float *out, float *mean, float *rstd, const float *inp,
                               const float *weight, const float *bias, int B, int T, int C) {
  K(layernorm_forward, out, mean, rstd, inp, weight, bias, B, T, C);
}
void model_k_layernorm_backward(model_dev *d, float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, const float *mean, const float *rstd, int B,
                                int T, int C, float *scratch) {
  K(layernorm_backward, dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C, scratch);
}
void model_k_matmul_forward(model_dev *d, float *out, const float *res, const float *inp, const float *weight,
                            const float *bias, int B, int T, int C, int OC) {
  K(matmul_forward, out, res, inp, weight, bias, B, T, C, OC);
}
void model_k_matmul_backward(model_dev *d, float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int B, int T, int C, int OC) {
  K(matmul_backward, dinp, dweight, dbias, dout, inp, weight, B, T, C, OC);
}
void model_k_attention_forward(model_dev *d, float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                               float *scratch) {
  K(attention_forward, out, att, qkv, B, T, C, NH, scratch);
}
void model_k_attention_backward(model_dev *d, float *dqkv, const float *dout, const float *att, const float *qkv,
                                int B, int T, int C, int NH, float *scratch) {
  K(attention_backward, dqkv, dout, att, qkv, B, T, C, NH, scratch);
}
void model_k_gelu_forward(model_dev *d, float *out, const float *inp, size_t N) { K(gelu_forward, out, inp, N); }
void model_k_gelu_backward(model_dev *d, float *dinp, const float *inp, const float *dout, size_t N) {
  K(gelu_backward, dinp, inp, dout, N);
}
void model_k_add_res_bias(model_dev *d, float *out, const float *res, const float *bias, size_t BT, size_t C) {
  K(add_res_bias, out, res, bias, BT, C);
}
void model_k_crossentropy(model_dev *d, float *losses, float *dlogits, const float *logits, const int32_t *targets,
                          int B, int T, int V, float dscale, double *loss_acc) {
  K(crossentropy, losses, dlogits, logits, targets, B, T, V, dscale, loss_acc);
}
void model_k_ce_rowmax(model_dev *d, float *mx, const float *logits, int BT, int Vl) { K(ce_rowmax, mx, logits, BT, Vl); }
void model_k_ce_partials(model_dev *d, float *st, const float *logits, const float *mx, const int32_t *targets,
                         int BT, int Vl, int lo) {
  K(ce_partials, st, logits, mx, targets, BT, Vl, lo);
}
void model_k_ce_finish(model_dev *d, float *losses, float *logits, const float *mx, const float *st,
                       const int32_t *targets, int BT, int Vl, int lo, float dscale, double *loss_acc) {
  K(ce_finish, losses, logits, mx, st, targets, BT, Vl, lo, dscale, loss_acc);
}
void model_k_sqnorm(model_dev *d, double *acc, const float *x, size_t n) { K(sqnorm, acc, x, n); }
void model_k_adamw(model_dev *d, model_adamw *o, const model_layout *lay, float *params, const float *grads,
                   double lr, float grad_scale) {
  K(adamw, o, lay, params, grads, lr, grad_scale);
}
