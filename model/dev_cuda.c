/* The CUDA device (model/dev.h), built with NEWT_HAVE_CUDA only: one GPU, one non-blocking
 * stream every piece of work is ordered on, and the kernels of model/cuda/kernels.h on it.
 *
 * Memory is cudaMalloc'd (usable from any stream, NCCL's included) and zeroed by a
 * cudaMemsetAsync queued on the stream; host memory for copies is pinned (cudaMallocHost).
 * Uploads go through two pinned staging slots of STAGE_BYTES: the source is copied into a
 * slot and the slot's cudaMemcpyAsync queued, so the caller may reuse the source on return
 * while the copy, and the kernels before it, still run; a slot is refilled once its
 * previous copy is done (an event per slot). Downloads queue the copy and wait for the
 * stream; queued downloads (into pinned memory) only queue it. Device-to-device copies and
 * zeroing are queued.
 *
 * Errors: a kernel the launcher could not enqueue, a failed copy or a failed stream
 * synchronisation becomes the device's sticky error (model_dev_fail; dev.c then skips every
 * kernel and returns it, prefixed with the device's name, from sync and download). A
 * failed allocation is not sticky: it is returned, naming the size and what the device has
 * free. Like cuBLAS handles and streams, the device is used from the thread that opened it
 * (or one that made its GPU current with cudaSetDevice) -- but for its host memory
 * (model_dev_host_alloc / model_dev_host_free), which any thread may ask for. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "model/cuda/kernels.h"
#include "model/dev_internal.h"

#define STAGE_SLOTS 2
#define STAGE_BYTES ((size_t)8 << 20)

typedef struct cuda_impl {
  model_cuda_kernels *k;
  void *stage[STAGE_SLOTS];           /* pinned */
  cudaEvent_t staged[STAGE_SLOTS];    /* recorded after the slot's copy */
  int next;                           /* the slot the next chunk takes */
} cuda_impl;

static cudaStream_t stream_of(const model_dev *d) { return (cudaStream_t)d->stream; }
static cuda_impl *impl_of(const model_dev *d) { return (cuda_impl *)d->impl; }

/* Records "CALL: cudaErrorX (text)" as the device's error; returns it named with the
 * device (what dev.c's own checks return once the error is sticky). */
static newt_result_t fail_cuda(model_dev *d, const char *call, cudaError_t e) {
  (void)NEWT_ERR(NEWT_ERR_CUDA, "%s: %s (%s)", call, cudaGetErrorName(e), cudaGetErrorString(e));
  model_dev_fail(d, NEWT_ERR_CUDA);
  char msg[sizeof d->errmsg];
  snprintf(msg, sizeof msg, "%s", d->errmsg);
  return NEWT_ERR(d->err, "%s: %s", d->name, msg);
}

/* A launcher's refusal becomes the device's error. */
static void kernel_result(model_dev *d, newt_result_t r) {
  if (r != NEWT_OK) model_dev_fail(d, r);
}

/* ---- memory ------------------------------------------------------------------------------ */

static newt_result_t cu_alloc(model_dev *d, size_t bytes, void **out) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* an allocation failure is not the device's fault */
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
    return NEWT_ERR(e == cudaErrorMemoryAllocation ? NEWT_ERR_NOMEM : NEWT_ERR_CUDA,
                    "%s: cudaMalloc of %zu bytes (%.2f GiB): %s; the device has %.2f GiB free of %.2f GiB", d->name,
                    bytes, bytes / 1073741824.0, cudaGetErrorName(e), free_b / 1073741824.0,
                    total_b / 1073741824.0);
  }
  e = cudaMemsetAsync(p, 0, bytes, stream_of(d));
  if (e != cudaSuccess) {
    (void)cudaFree(p);
    return fail_cuda(d, "cudaMemsetAsync", e);
  }
  *out = p;
  return NEWT_OK;
}

static void cu_free(model_dev *d, void *p) {
  cudaError_t e = cudaFree(p); /* waits for the work that may still use p */
  if (e != cudaSuccess) (void)fail_cuda(d, "cudaFree", e);
}

/* Host memory may be asked for from any thread (the worker pins its checkpoint staging on
 * one of its own, model/dev.h): that thread's current device is made this one first, so
 * no context is created on another GPU. */
static newt_result_t cu_host_alloc(model_dev *d, size_t bytes, void **out) {
  void *p = NULL;
  cudaError_t e = cudaSetDevice(d->ordinal);
  if (e == cudaSuccess) e = cudaMallocHost(&p, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return NEWT_ERR(NEWT_ERR_NOMEM, "%s: cudaMallocHost of %zu bytes of pinned host memory: %s (%s)", d->name, bytes,
                    cudaGetErrorName(e), cudaGetErrorString(e));
  }
  memset(p, 0, bytes);
  *out = p;
  return NEWT_OK;
}

static void cu_host_free(model_dev *d, void *p) {
  (void)cudaSetDevice(d->ordinal);
  cudaError_t e = cudaFreeHost(p);
  if (e != cudaSuccess) (void)fail_cuda(d, "cudaFreeHost", e);
}

static newt_result_t cu_upload(model_dev *d, void *dst, const void *src, size_t bytes) {
  cuda_impl *c = impl_of(d);
  cudaError_t e;
  for (size_t done = 0; done < bytes;) {
    size_t n = bytes - done < STAGE_BYTES ? bytes - done : STAGE_BYTES;
    int i = c->next;
    c->next = (i + 1) % STAGE_SLOTS;
    if ((e = cudaEventSynchronize(c->staged[i])) != cudaSuccess) return fail_cuda(d, "cudaEventSynchronize", e);
    memcpy(c->stage[i], (const char *)src + done, n);
    if ((e = cudaMemcpyAsync((char *)dst + done, c->stage[i], n, cudaMemcpyHostToDevice, stream_of(d))) != cudaSuccess)
      return fail_cuda(d, "cudaMemcpyAsync (host to device)", e);
    if ((e = cudaEventRecord(c->staged[i], stream_of(d))) != cudaSuccess) return fail_cuda(d, "cudaEventRecord", e);
    done += n;
  }
  return NEWT_OK;
}

static newt_result_t cu_download(model_dev *d, void *dst, const void *src, size_t bytes) {
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_of(d));
  if (e != cudaSuccess) return fail_cuda(d, "cudaMemcpyAsync (device to host)", e);
  if ((e = cudaStreamSynchronize(stream_of(d))) != cudaSuccess) return fail_cuda(d, "cudaStreamSynchronize", e);
  return NEWT_OK;
}

/* Into pinned memory (model_dev_host_alloc), so the copy engine runs it while the host goes
 * on; its error is the device's, returned by the next sync. */
static void cu_download_async(model_dev *d, void *dst, const void *src, size_t bytes) {
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_of(d));
  if (e != cudaSuccess) (void)fail_cuda(d, "cudaMemcpyAsync (device to host, queued)", e);
}

/* From pinned memory straight to the device, no staging slot: the caller keeps src until
 * its sync. */
static void cu_upload_async(model_dev *d, void *dst, const void *src, size_t bytes) {
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_of(d));
  if (e != cudaSuccess) (void)fail_cuda(d, "cudaMemcpyAsync (host to device, queued)", e);
}

static void cu_copy(model_dev *d, void *dst, const void *src, size_t bytes) {
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_of(d));
  if (e != cudaSuccess) (void)fail_cuda(d, "cudaMemcpyAsync (device to device)", e);
}

static void cu_zero(model_dev *d, void *p, size_t bytes) {
  cudaError_t e = cudaMemsetAsync(p, 0, bytes, stream_of(d));
  if (e != cudaSuccess) (void)fail_cuda(d, "cudaMemsetAsync", e);
}

static newt_result_t cu_sync(model_dev *d) {
  cudaError_t e = cudaStreamSynchronize(stream_of(d));
  return e == cudaSuccess ? NEWT_OK : fail_cuda(d, "cudaStreamSynchronize", e);
}

static size_t cu_scratch_floats(const model_dev *d, int T, int C, int NH) {
  (void)d, (void)T, (void)C, (void)NH;
  return 0; /* the kernels keep their own scratch */
}

/* ---- kernels ------------------------------------------------------------------------------ */

#define KS(d) (impl_of(d)->k)

static void cu_encoder_forward(model_dev *d, float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                               int T, int C) {
  kernel_result(d, model_cuda_encoder_forward(KS(d), out, inp, wte, wpe, B, T, C));
}
static void cu_encoder_backward(model_dev *d, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                                int T, int C) {
  kernel_result(d, model_cuda_encoder_backward(KS(d), dwte, dwpe, dout, inp, B, T, C));
}
static void cu_embed_rows_forward(model_dev *d, float *out, const int32_t *inp, const float *wte, int BT, int C,
                                  int lo, int Vl) {
  kernel_result(d, model_cuda_embed_rows_forward(KS(d), out, inp, wte, BT, C, lo, Vl));
}
static void cu_add_positions(model_dev *d, float *x, const float *wpe, int B, int T, int C) {
  kernel_result(d, model_cuda_add_positions(KS(d), x, wpe, B, T, C));
}
static void cu_embed_rows_backward(model_dev *d, float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                                   int B, int T, int C, int lo, int Vl) {
  kernel_result(d, model_cuda_embed_rows_backward(KS(d), dwte, dwpe, dout, inp, B, T, C, lo, Vl));
}
static void cu_layernorm_forward(model_dev *d, float *out, float *mean, float *rstd, const float *inp,
                                 const float *weight, const float *bias, int B, int T, int C) {
  kernel_result(d, model_cuda_layernorm_forward(KS(d), out, mean, rstd, inp, weight, bias, B, T, C));
}
static void cu_layernorm_backward(model_dev *d, float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, const float *mean, const float *rstd, int B,
                                  int T, int C, float *scratch) {
  (void)scratch;
  kernel_result(d, model_cuda_layernorm_backward(KS(d), dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C));
}
static void cu_matmul_forward(model_dev *d, float *out, const float *res, const float *inp, const float *weight,
                              const float *bias, int B, int T, int C, int OC) {
  kernel_result(d, model_cuda_matmul_forward(KS(d), out, res, inp, weight, bias, B, T, C, OC));
}
static void cu_matmul_backward(model_dev *d, float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, int B, int T, int C, int OC) {
  kernel_result(d, model_cuda_matmul_backward(KS(d), dinp, dweight, dbias, dout, inp, weight, B, T, C, OC));
}
static void cu_attention_forward(model_dev *d, float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                                 float *scratch) {
  (void)scratch;
  kernel_result(d, model_cuda_attention_forward(KS(d), out, att, qkv, B, T, C, NH));
}
static void cu_attention_backward(model_dev *d, float *dqkv, const float *dout, const float *att, const float *qkv,
                                  int B, int T, int C, int NH, float *scratch) {
  (void)scratch;
  kernel_result(d, model_cuda_attention_backward(KS(d), dqkv, dout, att, qkv, B, T, C, NH));
}
static void cu_gelu_forward(model_dev *d, float *out, const float *inp, size_t N) {
  kernel_result(d, model_cuda_gelu_forward(KS(d), out, inp, N));
}
static void cu_gelu_backward(model_dev *d, float *dinp, const float *inp, const float *dout, size_t N) {
  kernel_result(d, model_cuda_gelu_backward(KS(d), dinp, inp, dout, N));
}
static void cu_add_res_bias(model_dev *d, float *out, const float *res, const float *bias, size_t BT, size_t C) {
  kernel_result(d, model_cuda_add_res_bias(KS(d), out, res, bias, BT, C));
}
static void cu_crossentropy(model_dev *d, float *losses, float *dlogits, const float *logits, const int32_t *targets,
                            int B, int T, int V, float dscale, double *loss_acc) {
  kernel_result(d, model_cuda_crossentropy(KS(d), losses, dlogits, logits, targets, B, T, V, dscale, loss_acc));
}
static void cu_ce_rowmax(model_dev *d, float *mx, const float *logits, int BT, int Vl) {
  kernel_result(d, model_cuda_ce_rowmax(KS(d), mx, logits, BT, Vl));
}
static void cu_ce_partials(model_dev *d, float *st, const float *logits, const float *mx, const int32_t *targets,
                           int BT, int Vl, int lo) {
  kernel_result(d, model_cuda_ce_partials(KS(d), st, logits, mx, targets, BT, Vl, lo));
}
static void cu_ce_finish(model_dev *d, float *losses, float *logits, const float *mx, const float *st,
                         const int32_t *targets, int BT, int Vl, int lo, float dscale, double *loss_acc) {
  kernel_result(d, model_cuda_ce_finish(KS(d), losses, logits, mx, st, targets, BT, Vl, lo, dscale, loss_acc));
}
static void cu_sqnorm(model_dev *d, double *acc, const float *x, size_t n) {
  kernel_result(d, model_cuda_sqnorm(KS(d), acc, x, n));
}
static void cu_adamw(model_dev *d, model_adamw *o, const model_layout *lay, float *params, const float *grads,
                     double lr, float grad_scale) {
  kernel_result(d, model_cuda_adamw_update(KS(d), o, lay, params, grads, lr, grad_scale));
}

/* ---- open and close ------------------------------------------------------------------------- */

static void cu_close(model_dev *d) {
  cuda_impl *c = impl_of(d);
  (void)cudaSetDevice(d->ordinal);
  if (d->stream) (void)cudaStreamSynchronize(stream_of(d));
  if (c) {
    model_cuda_kernels_free(c->k);
    for (int i = 0; i < STAGE_SLOTS; i++) {
      if (c->staged[i]) (void)cudaEventDestroy(c->staged[i]);
      if (c->stage[i]) (void)cudaFreeHost(c->stage[i]);
    }
    free(c);
  }
  if (d->stream) (void)cudaStreamDestroy(stream_of(d));
  (void)cudaGetLastError();
  free(d);
}

static const model_dev_ops cuda_ops = {
    .close = cu_close,
    .alloc = cu_alloc,
    .free = cu_free,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .upload = cu_upload,
    .download = cu_download,
    .download_async = cu_download_async,
    .upload_async = cu_upload_async,
    .copy = cu_copy,
    .zero = cu_zero,
    .sync = cu_sync,
    .scratch_floats = cu_scratch_floats,
    .encoder_forward = cu_encoder_forward,
    .encoder_backward = cu_encoder_backward,
    .embed_rows_forward = cu_embed_rows_forward,
    .add_positions = cu_add_positions,
    .embed_rows_backward = cu_embed_rows_backward,
    .layernorm_forward = cu_layernorm_forward,
    .layernorm_backward = cu_layernorm_backward,
    .matmul_forward = cu_matmul_forward,
    .matmul_backward = cu_matmul_backward,
    .attention_forward = cu_attention_forward,
    .attention_backward = cu_attention_backward,
    .gelu_forward = cu_gelu_forward,
    .gelu_backward = cu_gelu_backward,
    .add_res_bias = cu_add_res_bias,
    .crossentropy = cu_crossentropy,
    .ce_rowmax = cu_ce_rowmax,
    .ce_partials = cu_ce_partials,
    .ce_finish = cu_ce_finish,
    .sqnorm = cu_sqnorm,
    .adamw = cu_adamw,
};

newt_result_t model_dev_cuda_open(int ordinal, model_dev **out) {
  *out = NULL;
  int count_err = 0, n = comm_gpu_count(&count_err);
  cudaError_t e = (cudaError_t)count_err;
  if (e != cudaSuccess)
    return NEWT_ERR(NEWT_ERR_CUDA, "cuda:%d: cudaGetDeviceCount: %s (%s): no GPU this process can use", ordinal,
                    cudaGetErrorName(e), cudaGetErrorString(e));
  if (ordinal < 0 || ordinal >= n)
    return NEWT_ERR(NEWT_ERR_CUDA, "cuda:%d: no such GPU: this process sees %d (CUDA_VISIBLE_DEVICES applies)",
                    ordinal, n);
  struct cudaDeviceProp prop;
  if ((e = cudaSetDevice(ordinal)) != cudaSuccess || (e = cudaGetDeviceProperties(&prop, ordinal)) != cudaSuccess) {
    (void)cudaGetLastError();
    return NEWT_ERR(NEWT_ERR_CUDA, "cuda:%d: cannot use the GPU: %s (%s)", ordinal, cudaGetErrorName(e),
                    cudaGetErrorString(e));
  }

  model_dev *d = calloc(1, sizeof *d);
  cuda_impl *c = calloc(1, sizeof *c);
  if (!d || !c) {
    free(d);
    free(c);
    return NEWT_ERR(NEWT_ERR_NOMEM, "cuda:%d: out of memory", ordinal);
  }
  d->ops = &cuda_ops;
  d->kind = MODEL_DEV_CUDA;
  d->ordinal = ordinal;
  d->host_visible = 0;
  d->impl = c;
  d->err = NEWT_OK;
  char gpu[80]; /* the name, cut to fit d->name */
  snprintf(gpu, sizeof gpu, "%.79s", prop.name);
  snprintf(d->name, sizeof d->name, "cuda:%d %s (%u GiB)", ordinal, gpu,
           (unsigned)((prop.totalGlobalMem >> 30) & 0xffffffu));
  d->peak_flops = model_dev_peak_bf16(prop.name, prop.major);

  newt_result_t r = NEWT_OK;
  const char *call = NULL;
  cudaStream_t s = NULL;
  if ((e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess) call = "cudaStreamCreateWithFlags";
  d->stream = s;
  for (int i = 0; !call && i < STAGE_SLOTS; i++) {
    if ((e = cudaMallocHost(&c->stage[i], STAGE_BYTES)) != cudaSuccess) call = "cudaMallocHost (staging)";
    else if ((e = cudaEventCreateWithFlags(&c->staged[i], cudaEventDisableTiming)) != cudaSuccess)
      call = "cudaEventCreateWithFlags";
  }
  if (call) {
    r = NEWT_ERR(NEWT_ERR_CUDA, "%s: %s: %s (%s)", d->name, call, cudaGetErrorName(e), cudaGetErrorString(e));
  } else if ((r = model_cuda_kernels_init(d->stream, &c->k)) != NEWT_OK) {
    r = newt_err_wrap(r, "%s: ", d->name);
  }
  if (r != NEWT_OK) {
    cu_close(d);
    return r;
  }
  *out = d;
  return NEWT_OK;
}
