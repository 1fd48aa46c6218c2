/* The CUDA model's entry points in a build without CUDA: each fails with
 * NEWT_ERR_UNSUPPORTED (see gpt_cuda.h). */
#ifndef NEWT_HAVE_CUDA
#include "model/gpt_cuda.h"

#define NO_CUDA() NEWT_ERR(NEWT_ERR_UNSUPPORTED, "this newt was built without CUDA (NEWT_CUDA=OFF or no toolkit)")

newt_result_t model_cuda_init(model_cuda **out, const model_config *cfg, int B, int T) {
  (void)cfg, (void)B, (void)T;
  *out = NULL;
  return NO_CUDA();
}
void model_cuda_free(model_cuda *m) { (void)m; }
newt_result_t model_cuda_set_params(model_cuda *m, const float *p) { (void)m, (void)p; return NO_CUDA(); }
newt_result_t model_cuda_get_params(model_cuda *m, float *p) { (void)m, (void)p; return NO_CUDA(); }
newt_result_t model_cuda_get_grads(model_cuda *m, float *g) { (void)m, (void)g; return NO_CUDA(); }
newt_result_t model_cuda_get_logits(model_cuda *m, float *l) { (void)m, (void)l; return NO_CUDA(); }
newt_result_t model_cuda_zero_grads(model_cuda *m) { (void)m; return NO_CUDA(); }
newt_result_t model_cuda_forward_backward(model_cuda *m, const int32_t *inputs, const int32_t *targets,
                                          float dscale, double *loss_sum) {
  (void)m, (void)inputs, (void)targets, (void)dscale, (void)loss_sum;
  return NO_CUDA();
}
newt_result_t model_cuda_adamw(model_cuda *m, const model_adamw_config *hp, int64_t t, double lr,
                               double *grad_norm) {
  (void)m, (void)hp, (void)t, (void)lr, (void)grad_norm;
  return NO_CUDA();
}
#else
typedef int model_gpt_cuda_stub_unused; /* ISO C wants a translation unit to declare something */
#endif
