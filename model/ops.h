/* The model's operations on the CPU, in fp32: one plain function per op, forward and
 * backward, in the manner of llm.c. Shapes are in the comments; B is the micro-batch,
 * T the sequence length, C the channels, OC a linear layer's output channels, NH the
 * heads, V the vocabulary. Every op takes its sizes as arguments, so a tensor-parallel
 * rank calls the same functions with its local shapes (its heads, its share of 4C), and a
 * pipeline stage runs the blocks it owns.
 *
 * Conventions: parameter gradients (dweight, dbias, dwte, ...) are always accumulated
 * (+=), so micro-batches add up; activation gradients are overwritten unless the comment
 * says "accumulated". GEMMs go to OpenBLAS (cblas_sgemm) called single-threaded from
 * inside an OpenMP region, each thread taking a block of the output, so exactly
 * `threads` threads run (no OpenBLAS pool competing with OpenMP's); everything else is
 * OpenMP loops. model_threads_set chooses the count for the process. */
#ifndef NEWT_MODEL_OPS_H
#define NEWT_MODEL_OPS_H

#include <stddef.h>
#include <stdint.h>

/* Uses `threads` OpenMP threads for every op (<= 0: all cores) and puts OpenBLAS in
 * single-threaded mode. Returns the count in force. */
int model_threads_set(int threads);
int model_threads_get(void);

/* OpenBLAS picks its kernels once, when it loads, from the CPU's model number, and takes a
 * model it does not know for its oldest x86-64 core: Debian 12's 0.3.21 runs an Emerald
 * Rapids (family 6, model 207) on Prescott's SSE3 kernels, at a quarter of the speed of its
 * AVX-512 ones. model_blas_core_hint names the core OPENBLAS_CORETYPE should ask for when
 * OpenBLAS took one without AVX2 on a CPU (and OS) that runs AVX2 and FMA: Cooperlake or
 * SkylakeX (AVX-512, with or without BF16) or Haswell; NULL when OPENBLAS_CORETYPE is set
 * or OpenBLAS's own choice stands. The variable counts only at a process's start (cli/main.c
 * sets it and starts the binary again). model_blas_core: the core in use. */
const char *model_blas_core_hint(void);
const char *model_blas_core(void);

/* Floats of per-thread scratch the ops below need for sizes T and C/NH (see
 * model_attention_*, model_layernorm_backward); callers pass `scratch` with
 * model_threads_get() times this many floats. */
size_t model_ops_scratch_floats(int T, int C, int NH);

/* out (B,T,C) = wte[inp] + wpe[t];  inp (B,T), wte (V,C), wpe (maxT,C) */
void model_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                           int T, int C);
/* dwte (V,C) += ..., dwpe (maxT,C) += ...;  dout (B,T,C), inp (B,T) */
void model_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                            int T, int C);

/* out (B,T,C), mean (B,T), rstd (B,T);  inp (B,T,C), weight (C), bias (C); eps 1e-5 */
void model_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                             const float *weight, const float *bias, int B, int T, int C);
/* dinp (B,T,C) accumulated; dweight (C), dbias (C) += ...;  dout, inp (B,T,C);
 * scratch: per-thread floats (model_ops_scratch_floats) */
void model_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, const float *mean,
                              const float *rstd, int B, int T, int C, float *scratch);

/* out (B,T,OC) = [res +] inp @ weight^T [+ bias];  inp (B,T,C), weight (OC,C), bias (OC) or
 * NULL, res (B,T,OC) or NULL (a residual added in the same pass) */
void model_matmul_forward(float *out, const float *res, const float *inp, const float *weight,
                          const float *bias, int B, int T, int C, int OC);
/* dinp (B,T,C) = dout @ weight (skipped when dinp is NULL); dweight (OC,C) += dout^T @ inp;
 * dbias (OC) += column sums of dout (skipped when NULL);  dout (B,T,OC) */
void model_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, int B, int T, int C, int OC);

/* Causal self-attention. qkv (B,T,3C) holds q, k, v for NH heads of C/NH channels each;
 * out (B,T,C); att (B,NH,T,T) the softmax probabilities (lower triangle written and read,
 * the upper one never touched) */
void model_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                             float *scratch);
/* dqkv (B,T,3C) overwritten;  dout (B,T,C), att (B,NH,T,T), qkv (B,T,3C) */
void model_attention_backward(float *dqkv, const float *dout, const float *att, const float *qkv,
                              int B, int T, int C, int NH, float *scratch);

/* tanh-approximated GELU over N elements; backward: dinp = gelu'(inp) * dout (dinp may be
 * dout, in place) */
void model_gelu_forward(float *out, const float *inp, size_t N);
void model_gelu_backward(float *dinp, const float *inp, const float *dout, size_t N);

/* Softmax cross-entropy over logits (B,T,V) and targets (B,T): losses (B,T) per token.
 * With dlogits != NULL also writes dlogits (B,T,V) = (softmax - onehot) * dscale, which may
 * be `logits` itself (in place). Returns the sum of the losses (double). */
double model_crossentropy_forward(float *losses, float *dlogits, const float *logits,
                                  const int32_t *targets, int B, int T, int V, float dscale);

/* exp(x) to about 1 ulp, vectorisable (Cephes polynomial, inputs clamped to [-87.3, 88.3]) */
static inline float model_expf(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  float t = x * 1.44269504088896341f + 12582912.0f; /* round to nearest by the 1.5*2^23 trick */
  float n = t - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  union { int32_t i; float f; } s;
  s.i = ((int32_t)n + 127) << 23;
  return y * s.f;
}

#endif
