/* The device a trainer runs on: its memory and its kernels, one interface with a CPU and a
 * CUDA implementation (docs/model.md, "Devices"). The parallel trainer (parallel.h) calls
 * nothing else to compute, so the orchestration that matters for recovery (the schedule,
 * buckets, ZeRO, snapshots, pieces, restore) is one code on both devices.
 *
 *   model_dev_cpu()        host memory; the kernels of ops.h (OpenBLAS, OpenMP), run at once
 *   model_dev_open(CUDA)   one GPU: memory from cudaMalloc, kernels enqueued in order on the
 *                          device's stream (model/cuda/kernels.h: cuBLAS with bf16 inputs and
 *                          fp32 accumulation; everything kept in fp32), returning before they
 *                          ran; collectives (comm_set_stream) are ordered on the same stream
 *
 * Memory. Pointers from model_dev_alloc are device pointers: the host must not read or write
 * them (with the CUDA device they are not host memory; the test double makes them fault when
 * touched), only pass them to this interface and to collectives of a communicator on the same
 * device (the CPU backend for model_dev_cpu, NCCL for a GPU). Bytes cross with
 * model_dev_upload / model_dev_download (or model_dev_download_async and one sync);
 * model_dev_host_alloc gives host memory those copies are fastest from (pinned on a GPU).
 *
 * Errors. Kernels return nothing: a device that fails (a launch refused, a fault) keeps its
 * first error, and model_dev_sync, model_dev_download and model_dev_error return it from then
 * on; the device is then unusable (free it and open another). The CPU device never fails.
 *
 * Shapes and conventions are ops.h's: B micro-batch, T sequence length, C channels, OC a
 * linear layer's output channels, NH heads, V vocabulary; parameter gradients are
 * accumulated (+=), activation gradients overwritten unless said otherwise. Every float
 * pointer below is device memory unless it says host. */
#ifndef NEWT_MODEL_DEV_H
#define NEWT_MODEL_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "common/backend.h" /* a backend's device (newt_backend_uses_gpu) is the CUDA one here */
#include "common/err.h"
#include "model/layout.h"
#include "model/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum model_dev_kind { MODEL_DEV_CPU = 0, MODEL_DEV_CUDA } model_dev_kind;

typedef struct model_dev model_dev;

/* The CPU device (one per process, never freed). */
model_dev *model_dev_cpu(void);
/* A device of `kind`: MODEL_DEV_CPU gives model_dev_cpu(); MODEL_DEV_CUDA binds GPU `ordinal`
 * (cudaSetDevice for the calling thread), creates its stream and its kernels' handles. Fails
 * with NEWT_ERR_UNSUPPORTED in a build without CUDA, NEWT_ERR_CUDA naming the device when it
 * cannot be used. */
newt_result_t model_dev_open(model_dev_kind kind, int ordinal, model_dev **out);
/* Waits for the device's work and frees what model_dev_open made (not the CPU device). */
void model_dev_close(model_dev *d);
/* GPUs this process can use (comm_gpu_count, the one count: cudaGetDeviceCount;
 * CUDA_VISIBLE_DEVICES applies): 0 in a build without CUDA, on a host without a driver or GPU. */
int model_dev_cuda_count(void);

/* What the CUDA device would run on, for `newt --version --libs`: "CUDA runtime 13.0,
 * driver 13.0, 1 GPU (NVIDIA H200)" into desc, and NEWT_OK when a GPU can be used. Else
 * NEWT_ERR_UNSUPPORTED (built without CUDA) or NEWT_ERR_CUDA naming what is missing (no
 * driver, no GPU), desc then saying as much as it found. */
newt_result_t model_dev_cuda_describe(char *desc, size_t n);
/* The library the CUDA device loads at run time, loaded now if not yet: cuBLAS
 * (model/cuda/cublas_lib.h), "cuBLAS 13.1.0 (/path/libcublas.so.13)" into desc; the
 * loader's error (what it tried), or NEWT_ERR_UNSUPPORTED without CUDA. */
newt_result_t model_dev_cuda_library(char *desc, size_t n);

model_dev_kind model_dev_kind_of(const model_dev *d);
/* The GPU ordinal (-1 for the CPU). */
int model_dev_ordinal(const model_dev *d);
/* The stream work is ordered on (a cudaStream_t; NULL for the CPU): give it to the
 * communicators of this device (comm_set_stream) so collectives follow the kernels. */
void *model_dev_stream(const model_dev *d);
/* 1 when device pointers are host memory the host may use directly (the CPU device). */
int model_dev_host_visible(const model_dev *d);
/* A line naming the device ("cpu", "cuda:0 NVIDIA H200 (139 GiB)"). */
const char *model_dev_name(const model_dev *d);
/* Dense bf16 peak of the device in FLOP/s (for MFU), 0 when unknown (the CPU). */
double model_dev_peak_flops(const model_dev *d);
/* The dense bf16 tensor-core peak in FLOP/s of the GPU called `name` (cudaDeviceProp.name)
 * with compute capability major `cc_major`, by the vendor's datasheets (model/peak.c has the
 * table, each part its own row: the H200 NVL is not the SXM part); 0 for one not in it. */
double model_dev_peak_bf16(const char *name, int cc_major);

/* ---- memory ---------------------------------------------------------------------------- */

/* bytes of zeroed device memory (*out NULL for 0 bytes); the error names the size and what
 * the device has free. */
newt_result_t model_dev_alloc(model_dev *d, size_t bytes, void **out);
void model_dev_free(model_dev *d, void *p);
/* Host memory copies to and from the device are fastest with (pinned on a GPU), zeroed,
 * aligned to at least 64 bytes (the CPU's to 64, a GPU's pinned memory to pages). Unlike
 * the rest of the device, these two may be called from any thread. */
newt_result_t model_dev_host_alloc(model_dev *d, size_t bytes, void **out);
void model_dev_host_free(model_dev *d, void *p);

/* Host -> device, after the work queued before it; src (host) may be reused on return. */
newt_result_t model_dev_upload(model_dev *d, void *dst, const void *src, size_t bytes);
/* Device -> host: waits for the work queued before it and the copy; the device's error. */
newt_result_t model_dev_download(model_dev *d, void *dst, const void *src, size_t bytes);
/* Device -> host, queued: dst (host) must be model_dev_host_alloc memory of this device (a
 * copy into pageable memory would not be asynchronous on a GPU) and its bytes are valid
 * only after the next model_dev_sync, whose result is the copy's. Many pieces queued and
 * one sync cost one wait, where a model_dev_download each waits each time. */
void model_dev_download_async(model_dev *d, void *dst, const void *src, size_t bytes);
/* Host -> device, queued: src (host) must be model_dev_host_alloc memory of this device and
 * stay unchanged until the next model_dev_sync, whose result is the copy's (model_dev_upload
 * instead copies src through staging slots, so src may be reused on return). */
void model_dev_upload_async(model_dev *d, void *dst, const void *src, size_t bytes);
/* Device -> device and zeroing, queued. */
void model_dev_copy(model_dev *d, void *dst, const void *src, size_t bytes);
void model_dev_zero(model_dev *d, void *p, size_t bytes);
/* Waits for every piece of work queued; the device's error. */
newt_result_t model_dev_sync(model_dev *d);
/* The device's first error, without waiting (NEWT_OK while it has none). */
newt_result_t model_dev_error(const model_dev *d);

/* ---- kernels: the model (ops.h, at any local shape) --------------------------------------- */

/* Floats of scratch the kernels below that take `scratch` need for sizes T and C/NH, for one
 * CPU thread (ops.h's model_ops_scratch_floats); the CPU device wants model_threads_get()
 * times this many, the CUDA device none (it ignores scratch). */
size_t model_dev_scratch_floats(const model_dev *d, int T, int C, int NH);

/* out (B,T,C) = wte[inp] + wpe[t];  inp (B,T) device ids < V, wte (V,C), wpe (maxT,C) */
void model_k_encoder_forward(model_dev *d, float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                             int T, int C);
/* dwte (V,C) += ..., dwpe (maxT,C) += ...;  dout (B,T,C) */
void model_k_encoder_backward(model_dev *d, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                              int T, int C);
/* A vocab-parallel embedding's rows (parallel.h): out (BT,C) = wte[inp - lo] for the ids in
 * [lo, lo + Vl), zeros for the others;  wte (Vl,C) this rank's rows */
void model_k_embed_rows_forward(model_dev *d, float *out, const int32_t *inp, const float *wte, int BT, int C, int lo,
                                int Vl);
/* x (B,T,C) = x + wpe[t] */
void model_k_add_positions(model_dev *d, float *x, const float *wpe, int B, int T, int C);
/* dwpe (maxT,C) += dout; dwte (Vl,C) += dout of the ids in [lo, lo + Vl)  (dout (B,T,C)) */
void model_k_embed_rows_backward(model_dev *d, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                                 int T, int C, int lo, int Vl);

void model_k_layernorm_forward(model_dev *d, float *out, float *mean, float *rstd, const float *inp,
                               const float *weight, const float *bias, int B, int T, int C);
/* dinp accumulated (ops.h) */
void model_k_layernorm_backward(model_dev *d, float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, const float *mean, const float *rstd, int B,
                                int T, int C, float *scratch);
/* out (B,T,OC) = [res +] inp (B,T,C) @ weight (OC,C)^T [+ bias (OC)] */
void model_k_matmul_forward(model_dev *d, float *out, const float *res, const float *inp, const float *weight,
                            const float *bias, int B, int T, int C, int OC);
/* dinp (skipped when NULL) = dout @ weight; dweight += dout^T @ inp; dbias += column sums
 * (skipped when NULL) */
void model_k_matmul_backward(model_dev *d, float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int B, int T, int C, int OC);
void model_k_attention_forward(model_dev *d, float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                               float *scratch);
void model_k_attention_backward(model_dev *d, float *dqkv, const float *dout, const float *att, const float *qkv,
                                int B, int T, int C, int NH, float *scratch);
void model_k_gelu_forward(model_dev *d, float *out, const float *inp, size_t N);
void model_k_gelu_backward(model_dev *d, float *dinp, const float *inp, const float *dout, size_t N);
/* out (BT,C) = (res + bias) + out: the rest of a row-parallel linear after its all-reduce */
void model_k_add_res_bias(model_dev *d, float *out, const float *res, const float *bias, size_t BT, size_t C);

/* Softmax cross-entropy (ops.h's model_crossentropy_forward): losses (B,T); with dlogits
 * (may be logits) also (softmax - onehot) * dscale; *loss_acc (one device double) += the sum
 * of the losses. */
void model_k_crossentropy(model_dev *d, float *losses, float *dlogits, const float *logits, const int32_t *targets,
                          int B, int T, int V, float dscale, double *loss_acc);
/* Vocab-parallel cross-entropy over this rank's logits (BT,Vl), its vocabulary starting at
 * lo, in three parts around two all-reduces (parallel.h):
 *   rowmax    mx (BT) = the row max of the rank's logits              -> all-reduce MAX
 *   partials  st (BT,2) = (sum of exp(logit - mx), the target's logit
 *             when this rank holds it, else 0)                        -> all-reduce SUM
 *   finish    losses (BT); with dscale != 0 logits become dlogits in place; *loss_acc += sum */
void model_k_ce_rowmax(model_dev *d, float *mx, const float *logits, int BT, int Vl);
void model_k_ce_partials(model_dev *d, float *st, const float *logits, const float *mx, const int32_t *targets,
                         int BT, int Vl, int lo);
void model_k_ce_finish(model_dev *d, float *losses, float *logits, const float *mx, const float *st,
                       const int32_t *targets, int BT, int Vl, int lo, float dscale, double *loss_acc);

/* ---- kernels: the optimizer ---------------------------------------------------------------- */

/* *acc (one device double) += the sum of squares of x[0, n) in double (model_sqnorm). */
void model_k_sqnorm(model_dev *d, double *acc, const float *x, size_t n);
/* model_adamw_update on the device: o's moments (o->m, o->v) and params, grads (full-layout
 * buffers) are device memory; lay (host) says which tensors decay. Increments o->t. */
void model_k_adamw(model_dev *d, model_adamw *o, const model_layout *lay, float *params, const float *grads,
                   double lr, float grad_scale);

#ifdef __cplusplus
}
#endif

#endif
