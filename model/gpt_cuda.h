/* The GPT on an NVIDIA GPU: bf16 compute with fp32 master weights.
 *
 * The device holds the parameters in fp32 (the master copy AdamW updates) and in bf16
 * (what the kernels read), gradients and AdamW moments in fp32 in the same layout as the
 * CPU model (layout.h), and one micro-batch of bf16 activations. GEMMs go to cuBLAS
 * (cublasGemmEx / cublasGemmStridedBatchedEx, bf16 inputs, fp32 accumulation; weight
 * gradients accumulate straight into fp32); layernorm, attention softmax, GELU,
 * cross-entropy, embedding, AdamW and the gradient norm are newt's own kernels. The
 * gradient of the residual stream is kept in fp32. The CPU model (gpt.h) is the
 * reference: tests/model/test_model_cuda checks forward, backward and steps against it.
 *
 * Built only when NEWT_HAVE_CUDA; elsewhere every function fails with
 * NEWT_ERR_UNSUPPORTED. */
#ifndef NEWT_MODEL_GPT_CUDA_H
#define NEWT_MODEL_GPT_CUDA_H

#include <stdint.h>

#include "common/err.h"
#include "model/config.h"
#include "model/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct model_cuda model_cuda;

/* Allocates everything on the current device for micro-batches of B sequences of T. */
newt_result_t model_cuda_init(model_cuda **out, const model_config *cfg, int B, int T);
void model_cuda_free(model_cuda *m);

/* Host fp32 buffers of the layout's total size. */
newt_result_t model_cuda_set_params(model_cuda *m, const float *params);
newt_result_t model_cuda_get_params(model_cuda *m, float *params);
newt_result_t model_cuda_get_grads(model_cuda *m, float *grads);
/* The fp32 logits (B,T,V) of the last forward. */
newt_result_t model_cuda_get_logits(model_cuda *m, float *logits);

newt_result_t model_cuda_zero_grads(model_cuda *m);

/* One micro-batch (B,T) of host token ids: forward, and with dscale != 0 backward,
 * adding into the gradients. *loss_sum gets the sum of the token losses. */
newt_result_t model_cuda_forward_backward(model_cuda *m, const int32_t *inputs, const int32_t *targets,
                                          float dscale, double *loss_sum);

/* Global-norm clipping and one AdamW update (the t-th) at lr, on the device; *grad_norm
 * gets the norm before clipping. Same rule as model_adamw_update. */
newt_result_t model_cuda_adamw(model_cuda *m, const model_adamw_config *hp, int64_t t, double lr,
                               double *grad_norm);

#ifdef __cplusplus
}
#endif

#endif
