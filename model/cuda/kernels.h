/* The CUDA kernels of the device interface (model/dev.h): one launcher per model_k_* op,
 * each enqueuing its work on the stream of a kernels context and returning whether the
 * launch was accepted. The CUDA device (model/dev_cuda.c) is their only caller; it records
 * a failed launch as the device's error (model_dev_fail).
 *
 * The launchers only enqueue: none waits for the device or reads device memory from the
 * host, so a fault inside a kernel surfaces later, from the stream (cudaStreamSynchronize
 * in model_dev_sync / model_dev_download). Every pointer is device memory unless it says
 * host; shapes and semantics are exactly ops.h's / dev.h's (the CPU ops are the
 * reference, tests/gpu/test_kernels.c compares every launcher with them). No CUDA type
 * appears here (the stream is a void *), so a CPU test double can implement the same
 * launchers over the ops of ops.h on a stand-in stream.
 *
 * Numerics (model/cuda/kernels.cu says how): storage is fp32 everywhere; GEMMs run on the
 * tensor cores with bf16 inputs and fp32 accumulation, everything else in fp32 (sums of
 * squares and loss totals in double). The token embedding's gradient (dwte) and the
 * layernorm weights' gradients are added with atomics, so their rounding depends on the
 * order the hardware takes (not bit-reproducible from run to run); everything else is, on
 * one GPU model with one cuBLAS version. Call the launchers with the stream's device current
 * (cudaSetDevice), as for any cuBLAS handle.
 *
 * Errors: NEWT_ERR_CUDA naming the op and the call that refused ("matmul_forward:
 * cublasGemmEx: CUBLAS_STATUS_..."); NEWT_ERR_INVALID for shapes the op cannot take. */
#ifndef NEWT_MODEL_CUDA_KERNELS_H
#define NEWT_MODEL_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "model/layout.h"
#include "model/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct model_cuda_kernels model_cuda_kernels;

/* A kernels context on `stream` (a cudaStream_t of the calling thread's current device):
 * the cuBLAS handle bound to it, its workspace, and the scratch the launchers grow as
 * shapes need it (stream-ordered allocations: no launcher waits for the device; on a GPU
 * without memory pools, growing the scratch waits for the stream once). */
newt_result_t model_cuda_kernels_init(void *stream, model_cuda_kernels **out);
/* Waits for the stream, then frees the handle, the workspace and the scratch. */
void model_cuda_kernels_free(model_cuda_kernels *k);

/* ---- the model (ops.h) ---------------------------------------------------------------- */

/* out (B,T,C) = wte[inp] + wpe[t];  inp (B,T) ids < V, wte (V,C), wpe (maxT,C) */
newt_result_t model_cuda_encoder_forward(model_cuda_kernels *k, float *out, const int32_t *inp, const float *wte,
                                         const float *wpe, int B, int T, int C);
/* dwte (V,C) += dout of each id's rows, dwpe (maxT,C) += dout summed over the batch;
 * dout (B,T,C), inp (B,T) */
newt_result_t model_cuda_encoder_backward(model_cuda_kernels *k, float *dwte, float *dwpe, const float *dout,
                                          const int32_t *inp, int B, int T, int C);
/* out (BT,C) = wte[inp - lo] for ids in [lo, lo + Vl), zeros for the others;
 * inp (BT), wte (Vl,C) */
newt_result_t model_cuda_embed_rows_forward(model_cuda_kernels *k, float *out, const int32_t *inp, const float *wte,
                                            int BT, int C, int lo, int Vl);
/* x (B,T,C) += wpe[t];  wpe (maxT,C) */
newt_result_t model_cuda_add_positions(model_cuda_kernels *k, float *x, const float *wpe, int B, int T, int C);
/* dwpe (maxT,C) += dout summed over the batch; dwte (Vl,C) += dout of the ids in
 * [lo, lo + Vl);  dout (B,T,C), inp (B,T) */
newt_result_t model_cuda_embed_rows_backward(model_cuda_kernels *k, float *dwte, float *dwpe, const float *dout,
                                             const int32_t *inp, int B, int T, int C, int lo, int Vl);

/* out (B,T,C), mean (B,T), rstd (B,T);  inp (B,T,C), weight (C), bias (C); eps 1e-5 */
newt_result_t model_cuda_layernorm_forward(model_cuda_kernels *k, float *out, float *mean, float *rstd,
                                           const float *inp, const float *weight, const float *bias, int B, int T,
                                           int C);
/* dinp (B,T,C) accumulated; dweight (C), dbias (C) +=;  dout, inp (B,T,C), weight (C),
 * mean, rstd (B,T) */
newt_result_t model_cuda_layernorm_backward(model_cuda_kernels *k, float *dinp, float *dweight, float *dbias,
                                            const float *dout, const float *inp, const float *weight,
                                            const float *mean, const float *rstd, int B, int T, int C);
/* out (B,T,OC) = [res +] inp @ weight^T [+ bias];  inp (B,T,C), weight (OC,C), bias (OC) or
 * NULL, res (B,T,OC) or NULL (may be out) */
newt_result_t model_cuda_matmul_forward(model_cuda_kernels *k, float *out, const float *res, const float *inp,
                                        const float *weight, const float *bias, int B, int T, int C, int OC);
/* dinp (B,T,C) = dout @ weight (skipped when NULL); dweight (OC,C) += dout^T @ inp;
 * dbias (OC) += column sums of dout (skipped when NULL);  dout (B,T,OC), inp (B,T,C) */
newt_result_t model_cuda_matmul_backward(model_cuda_kernels *k, float *dinp, float *dweight, float *dbias,
                                         const float *dout, const float *inp, const float *weight, int B, int T,
                                         int C, int OC);
/* Causal self-attention over NH heads of C/NH channels: qkv (B,T,3C) [q | k | v], each head
 * h at columns h*C/NH of its third; out (B,T,C); att (B,NH,T,T) the probabilities (the
 * lower triangle is what the backward reads; this writes the whole (T,T), zeros above the
 * diagonal) */
newt_result_t model_cuda_attention_forward(model_cuda_kernels *k, float *out, float *att, const float *qkv, int B,
                                           int T, int C, int NH);
/* dqkv (B,T,3C) overwritten;  dout (B,T,C), att (B,NH,T,T) (lower triangle read),
 * qkv (B,T,3C) */
newt_result_t model_cuda_attention_backward(model_cuda_kernels *k, float *dqkv, const float *dout, const float *att,
                                            const float *qkv, int B, int T, int C, int NH);
/* tanh-GELU over N elements; backward: dinp = gelu'(inp) * dout (dinp may be dout) */
newt_result_t model_cuda_gelu_forward(model_cuda_kernels *k, float *out, const float *inp, size_t N);
newt_result_t model_cuda_gelu_backward(model_cuda_kernels *k, float *dinp, const float *inp, const float *dout,
                                       size_t N);
/* out (BT,C) = (res + bias) + out;  res (BT,C), bias (C) */
newt_result_t model_cuda_add_res_bias(model_cuda_kernels *k, float *out, const float *res, const float *bias,
                                      size_t BT, size_t C);

/* Softmax cross-entropy: losses (B,T) from logits (B,T,V) and targets (B,T) in [0, V); with
 * dlogits (may be logits) also (softmax - onehot) * dscale; *loss_acc (one double) += the
 * sum of the losses */
newt_result_t model_cuda_crossentropy(model_cuda_kernels *k, float *losses, float *dlogits, const float *logits,
                                      const int32_t *targets, int B, int T, int V, float dscale, double *loss_acc);
/* Vocab-parallel cross-entropy over this rank's logits (BT,Vl), vocabulary from lo (dev.h):
 * mx (BT) = row max;  st (BT,2) = (sum of exp(logit - mx), the target's logit or 0);
 * finish: losses (BT), logits -> dlogits in place when dscale != 0, *loss_acc += sum */
newt_result_t model_cuda_ce_rowmax(model_cuda_kernels *k, float *mx, const float *logits, int BT, int Vl);
newt_result_t model_cuda_ce_partials(model_cuda_kernels *k, float *st, const float *logits, const float *mx,
                                     const int32_t *targets, int BT, int Vl, int lo);
newt_result_t model_cuda_ce_finish(model_cuda_kernels *k, float *losses, float *logits, const float *mx,
                                   const float *st, const int32_t *targets, int BT, int Vl, int lo, float dscale,
                                   double *loss_acc);

/* ---- the optimizer (optim.h) ----------------------------------------------------------- */

/* *acc (one double) += the sum of squares of x[0, n), in double */
newt_result_t model_cuda_sqnorm(model_cuda_kernels *k, double *acc, const float *x, size_t n);
/* model_adamw_update: params, grads (full-layout buffers) and o->m, o->v (o->len floats,
 * indexed from o->off) are device memory; o and lay are host memory. Increments o->t. */
newt_result_t model_cuda_adamw_update(model_cuda_kernels *k, model_adamw *o, const model_layout *lay, float *params,
                                      const float *grads, double lr, float grad_scale);

#ifdef __cplusplus
}
#endif

#endif
