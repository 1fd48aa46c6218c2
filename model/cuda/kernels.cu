/* The CUDA kernels behind model/cuda/kernels.h: one launcher per model_k_* op of
 * model/dev.h, each enqueuing on the context's stream and never waiting for the device.
 * Every op names its CPU twin (model/ops.h, model/dev_cpu.c); those are the reference and
 * tests/gpu/test_kernels.c compares every launcher with them (docs/model.md, "CUDA device").
 *
 * Numerics.
 *   - Storage is fp32 everywhere: parameters, gradients, activations, AdamW moments.
 *   - GEMMs (the linear layers, and attention's Q K^T, P V and their backward) go to
 *     cuBLAS as cublasGemmEx / cublasGemmStridedBatchedEx on the fp32 buffers with
 *     CUBLAS_COMPUTE_32F_FAST_16BF: cuBLAS rounds the inputs to bf16 inside the GEMM and
 *     runs the tensor cores with fp32 accumulation, and C (and its beta * C term) stays
 *     fp32 (the compute type allows bf16 or TF32 rounding of the inputs, cuBLAS choosing
 *     per kernel: either is at least as accurate as bf16). No bf16 copies are kept, so no conversion kernels and no extra memory; the
 *     price is that each GEMM reads fp32 (twice the bytes of bf16 inputs).
 *   - Bias column sums (dbias) are fp32 cublasSgemv against a vector of ones.
 *   - Everything else is fp32 arithmetic in newt's kernels below, in the CPU op's order of
 *     operations where it has one; exp is the polynomial of ops.h's model_expf (dev_expf),
 *     so GELU, softmax and cross-entropy round like the CPU ops, up to FMA contraction.
 *   - Sums of squares and loss totals are summed in double, in a fixed order (a fixed grid
 *     of partials, then one block), so they are reproducible on one kind of GPU.
 *   - Not bit-reproducible: dwte (the embedding gradient, fp32 atomics for ids that repeat)
 *     and the layernorm dweight / dbias (fp32 atomics across blocks).
 *
 * Layouts (cuBLAS is column-major): a row-major (R, K) matrix with leading dimension ld is
 * the column-major (K, R) matrix, its transpose, with the same ld. So row-major
 * out = inp @ W^T is column-major out^T = W^T^T inp^T: gemm(T, N) with A = W, B = inp;
 * each call below carries the row-major formula it computes.
 *
 * Attention keeps ops.h's layouts: qkv (B,T,3C) with head h of q at columns h*hs (k at C +
 * h*hs, v at 2C + h*hs), att (B,NH,T,T), out (B,T,C). Per batch row b, the NH heads are one
 * strided-batched GEMM (stride hs between heads inside qkv, T*T inside att), so no permuted
 * copies of q, k, v are made. The whole (T,T) score matrix is computed (the CPU op skips
 * the blocks above the diagonal): twice the FLOPs of the causal half, in return for plain
 * batched GEMMs; the softmax writes zeros above the diagonal.
 *
 * Launch configurations: elementwise kernels run a grid-stride loop over size_t indices
 * with at most MAX_GRID blocks; row kernels give each row a warp (ROW_WARPS rows per
 * block) or a block (cross-entropy, whose rows are the vocabulary), again grid-striding
 * over rows, so no size of gpt2-124m (V 50257, C 768, T 1024, B 16) overflows an int index
 * or the grid's limits. Shared memory: the block reductions use 33 words; the layernorm
 * backward 2*C floats when that fits in 48 KiB (C <= 6144), global atomics beyond. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>

extern "C" {
#include "model/cuda/cublas_lib.h"
#include "model/cuda/kernels.h"
}

#define THREADS 256                  /* threads per block of the elementwise and row kernels */
#define ROW_WARPS (THREADS / 32)     /* rows per block of the warp-per-row kernels */
#define MAX_GRID (1u << 20)          /* blocks at most; the loops stride over the rest */
#define SQNORM_PARTS_MAX 4096        /* partial sums of sqnorm's first pass */
#define LN_SMEM_MAX (48 * 1024)      /* the default limit of dynamic shared memory */
#define CUBLAS_WORKSPACE (32u << 20) /* cuBLAS workspace: room for its Hopper GEMM kernels */

struct model_cuda_kernels {
  cudaStream_t s;
  cublasHandle_t h;
  void *ws;          /* cuBLAS workspace, CUBLAS_WORKSPACE bytes */
  double *parts;     /* sqnorm partials, SQNORM_PARTS_MAX */
  float *scratch;    /* attention backward: dS and the masked P, grown on demand */
  size_t scratch_cap; /* floats */
  float *ones;       /* ones_cap ones, for dbias */
  size_t ones_cap;
  int sms;           /* multiprocessors */
  int pools;         /* stream-ordered allocation (cudaMallocAsync) is supported */
};

/* ---- errors ------------------------------------------------------------------------------- */

static newt_result_t cuda_fail(const char *op, const char *call, cudaError_t e) {
  return NEWT_ERR(NEWT_ERR_CUDA, "%s: %s: %s (%s)", op, call, cudaGetErrorName(e), cudaGetErrorString(e));
}
static newt_result_t cublas_fail(const char *op, const char *call, cublasStatus_t s) {
  return NEWT_ERR(NEWT_ERR_CUDA, "%s: %s: %s", op, call, cublas_api.GetStatusName(s));
}

#define CU(op, call)                                           \
  do {                                                         \
    cudaError_t e_ = (call);                                   \
    if (e_ != cudaSuccess) return cuda_fail(op, #call, e_);    \
  } while (0)
/* after a kernel launch: a refused configuration, or an earlier fault the stream reported */
#define LAUNCHED(op)                                                    \
  do {                                                                  \
    cudaError_t e_ = cudaGetLastError();                                \
    if (e_ != cudaSuccess) return cuda_fail(op, "kernel launch", e_);   \
  } while (0)
#define DIMS(op, ok, ...) \
  do {                    \
    if (!(ok)) return NEWT_ERR(NEWT_ERR_INVALID, op ": " __VA_ARGS__); \
  } while (0)

static unsigned grid_for(size_t n, unsigned per_block) {
  size_t g = (n + per_block - 1) / per_block;
  return (unsigned)(g < MAX_GRID ? g : MAX_GRID);
}

/* ---- device helpers --------------------------------------------------------------------- */

/* ops.h's model_expf, the same polynomial (exp to about 1 ulp; inputs clamped) */
static __device__ __forceinline__ float dev_expf(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  float t = x * 1.44269504088896341f + 12582912.0f;
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
  return y * __int_as_float(((int)n + 127) << 23);
}

template <typename V>
static __device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
static __device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Sum (MAX false) or max over the block (blockDim.x a multiple of 32, at most 1024);
 * every thread gets the result. Safe to call repeatedly (it synchronises before reuse). */
template <typename V, bool MAX>
static __device__ V block_reduce(V v) {
  __shared__ V part[32];
  __shared__ V total;
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = MAX ? (V)warp_max((float)v) : warp_sum(v);
  __syncthreads(); /* part[] and total may still be read by the previous call */
  if (lane == 0) part[w] = v;
  __syncthreads();
  if (w == 0) {
    V s = lane < nw ? part[lane] : (MAX ? (V)-INFINITY : (V)0);
    s = MAX ? (V)warp_max((float)s) : warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

#define GRID_STRIDE(i, n) \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)
/* one warp per row: `r` the row, `lane` the lane */
#define ROWS_BY_WARP(r, rows)                                                           \
  for (size_t r = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < (rows); \
       r += (size_t)gridDim.x * (blockDim.x >> 5))
/* one block per row */
#define ROWS_BY_BLOCK(r, rows) for (size_t r = blockIdx.x; r < (rows); r += gridDim.x)

/* ---- kernels: embeddings -------------------------------------------------------------------- */

/* model_encoder_forward: out (BT,C) = wte[inp] + wpe[t]; n = BT*C */
__global__ void k_encoder_fwd(float *out, const int32_t *inp, const float *wte, const float *wpe, int T, int C,
                              size_t n) {
  GRID_STRIDE(i, n) {
    size_t bt = i / C;
    size_t c = i % C;
    out[i] = wte[(size_t)inp[bt] * C + c] + wpe[(bt % T) * C + c];
  }
}

/* dev_cpu.c's embed_rows_forward: out (BT,C) = wte[inp - lo] inside [lo, lo + Vl), else 0 */
__global__ void k_embed_rows_fwd(float *out, const int32_t *inp, const float *wte, int C, int lo, int Vl, size_t n) {
  GRID_STRIDE(i, n) {
    size_t bt = i / C;
    long long tok = (long long)inp[bt] - lo;
    out[i] = tok >= 0 && tok < Vl ? wte[(size_t)tok * C + i % C] : 0.0f;
  }
}

/* dev_cpu.c's add_positions: x (BT,C) += wpe[t] */
__global__ void k_add_positions(float *x, const float *wpe, int T, int C, size_t n) {
  GRID_STRIDE(i, n) {
    size_t bt = i / C;
    x[i] = x[i] + wpe[(bt % T) * C + i % C];
  }
}

/* dwpe (T,C) += dout summed over the batch, b in order (as the CPU loops: bit for bit);
 * n = T*C */
__global__ void k_positions_bwd(float *dwpe, const float *dout, int B, size_t n) {
  GRID_STRIDE(i, n) {
    float acc = dwpe[i];
    for (int b = 0; b < B; b++) acc += dout[(size_t)b * n + i];
    dwpe[i] = acc;
  }
}

/* dwte (Vl,C) += dout of the ids in [lo, lo + Vl) (fp32 atomics: ids repeat); n = BT*C */
__global__ void k_tokens_bwd(float *dwte, const float *dout, const int32_t *inp, int C, int lo, int Vl, size_t n) {
  GRID_STRIDE(i, n) {
    long long tok = (long long)inp[i / C] - lo;
    if (tok >= 0 && tok < Vl) atomicAdd(&dwte[(size_t)tok * C + i % C], dout[i]);
  }
}

/* ---- kernels: layernorm ----------------------------------------------------------------------- */

/* model_layernorm_forward, a warp per row of C */
__global__ void k_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                const float *b, size_t rows, int C) {
  int lane = threadIdx.x & 31;
  ROWS_BY_WARP(r, rows) {
    const float *x = inp + r * C;
    float s = 0.0f;
    for (int i = lane; i < C; i += 32) s += x[i];
    float m = warp_sum(s) / C;
    float v = 0.0f;
    for (int i = lane; i < C; i += 32) v += (x[i] - m) * (x[i] - m);
    v = warp_sum(v) / C;
    float rs = 1.0f / sqrtf(v + 1e-5f);
    float *o = out + r * C;
    for (int i = lane; i < C; i += 32) o[i] = (rs * (x[i] - m)) * w[i] + b[i];
    if (lane == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
}

/* model_layernorm_backward, a warp per row: dinp += ...; dweight, dbias += summed in
 * shared memory per block (SMEM, 2*C floats) or straight in global memory, with atomics */
template <bool SMEM>
__global__ void k_layernorm_bwd(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                const float *w, const float *mean, const float *rstd, size_t rows, int C) {
  extern __shared__ float sh[];
  float *dw = SMEM ? sh : dweight, *db = SMEM ? sh + C : dbias;
  if (SMEM) {
    for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) sh[i] = 0.0f;
    __syncthreads();
  }
  int lane = threadIdx.x & 31;
  ROWS_BY_WARP(r, rows) {
    const float *x = inp + r * C, *d = dout + r * C;
    float *dx = dinp + r * C;
    float m = mean[r], s = rstd[r];
    float dmean = 0.0f, dnmean = 0.0f;
    for (int i = lane; i < C; i += 32) {
      float n = (x[i] - m) * s, dn = w[i] * d[i];
      dmean += dn;
      dnmean += dn * n;
    }
    dmean = warp_sum(dmean) / C;
    dnmean = warp_sum(dnmean) / C;
    for (int i = lane; i < C; i += 32) {
      float n = (x[i] - m) * s, dn = w[i] * d[i];
      atomicAdd(&db[i], d[i]);
      atomicAdd(&dw[i], n * d[i]);
      dx[i] += (dn - dmean - n * dnmean) * s;
    }
  }
  if (SMEM) {
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
      atomicAdd(&dweight[i], sh[i]);
      atomicAdd(&dbias[i], sh[C + i]);
    }
  }
}

/* ---- kernels: linear layers ------------------------------------------------------------------- */

/* out (M,OC) = res + bias, res, or bias, the C of a GEMM with beta 1 (model_matmul_forward's
 * order: r + bias); res may be out */
__global__ void k_res_bias(float *out, const float *res, const float *bias, int OC, size_t n) {
  GRID_STRIDE(i, n) {
    if (res && bias) out[i] = res[i] + bias[i % OC];
    else if (res) out[i] = res[i];
    else out[i] = bias[i % OC];
  }
}

__global__ void k_fill(float *x, float v, size_t n) {
  GRID_STRIDE(i, n) x[i] = v;
}

/* dev_cpu.c's add_res_bias: out (BT,C) = (res + bias) + out */
__global__ void k_add_res_bias(float *out, const float *res, const float *bias, size_t C, size_t n) {
  GRID_STRIDE(i, n) out[i] = (res[i] + bias[i % C]) + out[i];
}

/* ---- kernels: attention --------------------------------------------------------------------- */

/* The causal softmax of model_attention_forward over rows of (T,T) matrices, a warp per
 * row: row r is query t = r % T; columns <= t become the probabilities, the others 0. */
__global__ void k_softmax_causal(float *att, size_t rows, int T) {
  int lane = threadIdx.x & 31;
  ROWS_BY_WARP(r, rows) {
    float *row = att + r * T;
    int n = (int)(r % T) + 1;
    float mx = -INFINITY;
    for (int j = lane; j < n; j += 32) mx = fmaxf(mx, row[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j < n; j += 32) {
      float e = dev_expf(row[j] - mx);
      row[j] = e;
      sum += e;
    }
    float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j < T; j += 32) row[j] = j < n ? row[j] * inv : 0.0f;
  }
}

/* The softmax backward of model_attention_backward over rows of (T,T) matrices: dS holds
 * dP on entry and P * (dP - sum(P * dP)) on return, zeros above the diagonal; Pm gets P's
 * lower triangle and zeros above it (the backward reads only att's lower triangle). */
__global__ void k_softmax_causal_bwd(float *dS, float *Pm, const float *P, size_t rows, int T) {
  int lane = threadIdx.x & 31;
  ROWS_BY_WARP(r, rows) {
    const float *p = P + r * T;
    float *d = dS + r * T, *pm = Pm + r * T;
    int n = (int)(r % T) + 1;
    float dot = 0.0f;
    for (int j = lane; j < n; j += 32) dot += p[j] * d[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32) {
      float pj = j < n ? p[j] : 0.0f;
      d[j] = j < n ? pj * (d[j] - dot) : 0.0f;
      pm[j] = pj;
    }
  }
}

/* ---- kernels: GELU ---------------------------------------------------------------------------- */

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */

/* tanh(u) = 1 - 2 / (exp(2u) + 1), as ops_cpu.c */
static __device__ __forceinline__ float tanh_fast(float u) { return 1.0f - 2.0f / (dev_expf(2.0f * u) + 1.0f); }

__global__ void k_gelu_fwd(float *out, const float *inp, size_t n) {
  GRID_STRIDE(i, n) {
    float x = inp[i];
    float u = GELU_S * (x + 0.044715f * x * x * x);
    out[i] = 0.5f * x * (1.0f + tanh_fast(u));
  }
}

__global__ void k_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n) {
  GRID_STRIDE(i, n) {
    float x = inp[i];
    float u = GELU_S * (x + 0.044715f * x * x * x);
    float th = tanh_fast(u);
    float local = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = local * dout[i];
  }
}

/* ---- kernels: cross-entropy ------------------------------------------------------------------- */

/* model_crossentropy_forward, a block per row of V; dlogits (NULL: none) may be logits */
__global__ void k_crossentropy(float *losses, float *dlogits, const float *logits, const int32_t *targets, int V,
                               float dscale, size_t rows) {
  ROWS_BY_BLOCK(r, rows) {
    const float *l = logits + r * V;
    int y = targets[r];
    float ly = y >= 0 && y < V ? l[y] : NAN; /* read before any thread overwrites the row */
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, l[v]);
    mx = block_reduce<float, true>(mx);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) sum += dev_expf(l[v] - mx);
    sum = block_reduce<float, false>(sum); /* its barriers order every read above before the writes below */
    if (threadIdx.x == 0) losses[r] = logf(sum) + mx - ly;
    if (dlogits) {
      float *d = dlogits + r * V, inv = 1.0f / sum;
      for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float g = dev_expf(l[v] - mx) * inv * dscale;
        d[v] = v == y ? g - dscale : g;
      }
    }
    __syncthreads(); /* the next row's reads of ly come after this row's writes */
  }
}

/* dev_cpu.c's ce_rowmax: mx (BT) = the row max of logits (BT,Vl) */
__global__ void k_ce_rowmax(float *mx, const float *logits, int Vl, size_t rows) {
  ROWS_BY_BLOCK(r, rows) {
    const float *l = logits + r * Vl;
    float m = -INFINITY;
    for (int v = threadIdx.x; v < Vl; v += blockDim.x) m = fmaxf(m, l[v]);
    m = block_reduce<float, true>(m);
    if (threadIdx.x == 0) mx[r] = m;
  }
}

/* dev_cpu.c's ce_partials: st (BT,2) = (sum exp(l - mx), the target's logit or 0) */
__global__ void k_ce_partials(float *st, const float *logits, const float *mx, const int32_t *targets, int Vl, int lo,
                              size_t rows) {
  ROWS_BY_BLOCK(r, rows) {
    const float *l = logits + r * Vl;
    float m = mx[r], sum = 0.0f;
    for (int v = threadIdx.x; v < Vl; v += blockDim.x) sum += dev_expf(l[v] - m);
    sum = block_reduce<float, false>(sum);
    if (threadIdx.x == 0) {
      long long y = (long long)targets[r] - lo;
      st[2 * r] = sum;
      st[2 * r + 1] = y >= 0 && y < Vl ? l[y] : 0.0f;
    }
  }
}

/* dev_cpu.c's ce_finish: losses (BT); with dscale != 0 logits (BT,Vl) become dlogits */
__global__ void k_ce_finish(float *losses, float *logits, const float *mx, const float *st, const int32_t *targets,
                            int Vl, int lo, float dscale, size_t rows) {
  ROWS_BY_BLOCK(r, rows) {
    float m = mx[r], sum = st[2 * r];
    if (threadIdx.x == 0) losses[r] = logf(sum) + m - st[2 * r + 1];
    if (dscale != 0.0f) {
      float *g = logits + r * Vl, inv = 1.0f / sum;
      long long y = (long long)targets[r] - lo;
      for (int v = threadIdx.x; v < Vl; v += blockDim.x) {
        float e = dev_expf(g[v] - m) * inv * dscale;
        g[v] = v == y ? e - dscale : e;
      }
    }
  }
}

/* ---- kernels: sums in double ------------------------------------------------------------------ */

/* *acc += sum of x[0, n) in double: one block, a fixed order */
__global__ void k_sum_into(double *acc, const float *x, size_t n) {
  double s = 0.0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = block_reduce<double, false>(s);
  if (threadIdx.x == 0) *acc += s;
}

/* parts[block] = sum of squares of this block's grid-stride share of x, in double */
__global__ void k_sqnorm_parts(double *parts, const float *x, size_t n) {
  double s = 0.0;
  GRID_STRIDE(i, n) s += (double)x[i] * x[i];
  s = block_reduce<double, false>(s);
  if (threadIdx.x == 0) parts[blockIdx.x] = s;
}

/* *acc += sum of parts[0, n): one block, a fixed order */
__global__ void k_sum_parts(double *acc, const double *parts, int n) {
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += parts[i];
  s = block_reduce<double, false>(s);
  if (threadIdx.x == 0) *acc += s;
}

/* ---- kernels: AdamW ---------------------------------------------------------------------------- */

/* model_adamw_update over params[a, b), the moments indexed from lo (optim.c's loop) */
__global__ void k_adamw(float *params, const float *grads, float *m, float *v, size_t a, size_t n, size_t lo, float b1,
                        float b2, float gs, float step_size, float bc2_sqrt, float eps, float decay) {
  GRID_STRIDE(j, n) {
    size_t i = a + j;
    float gi = grads[i] * gs;
    float mi = b1 * m[i - lo] + (1.0f - b1) * gi;
    float vi = b2 * v[i - lo] + (1.0f - b2) * gi * gi;
    m[i - lo] = mi;
    v[i - lo] = vi;
    params[i] = params[i] * decay - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
  }
}

/* ---- the context ------------------------------------------------------------------------------- */

/* Grows a stream-ordered buffer to `bytes` (no wait: the old one is freed in stream order,
 * after the work queued on it). Without memory pools: cudaMalloc after a stream sync. */
static newt_result_t grow(model_cuda_kernels *k, const char *op, void **p, size_t *cap, size_t bytes, int *grown) {
  *grown = 0;
  if (*cap >= bytes) return NEWT_OK;
  void *q = NULL;
  if (k->pools) {
    if (*p) CU(op, cudaFreeAsync(*p, k->s));
    *p = NULL;
    *cap = 0;
    CU(op, cudaMallocAsync(&q, bytes, k->s));
  } else {
    CU(op, cudaStreamSynchronize(k->s));
    if (*p) CU(op, cudaFree(*p));
    *p = NULL;
    *cap = 0;
    CU(op, cudaMalloc(&q, bytes));
  }
  *p = q;
  *cap = bytes;
  *grown = 1;
  return NEWT_OK;
}

static newt_result_t scratch_floats(model_cuda_kernels *k, const char *op, size_t n, float **out) {
  size_t cap = k->scratch_cap * sizeof(float);
  int grown;
  void *p = k->scratch;
  newt_result_t r = grow(k, op, &p, &cap, n * sizeof(float), &grown);
  k->scratch = (float *)p;
  k->scratch_cap = cap / sizeof(float);
  *out = k->scratch;
  return r;
}

static newt_result_t ones(model_cuda_kernels *k, const char *op, size_t n, const float **out) {
  size_t cap = k->ones_cap * sizeof(float);
  int grown;
  void *p = k->ones;
  newt_result_t r = grow(k, op, &p, &cap, n * sizeof(float), &grown);
  k->ones = (float *)p;
  k->ones_cap = cap / sizeof(float);
  NEWT_CHECK(r);
  if (grown) {
    k_fill<<<grid_for(k->ones_cap, THREADS), THREADS, 0, k->s>>>(k->ones, 1.0f, k->ones_cap);
    LAUNCHED(op);
  }
  *out = k->ones;
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_kernels_init(void *stream, model_cuda_kernels **out) {
  *out = NULL;
  NEWT_CHECK(cublas_lib_load()); /* the first CUDA device of the process loads cuBLAS */
  model_cuda_kernels *k = (model_cuda_kernels *)calloc(1, sizeof *k);
  if (!k) return NEWT_ERR(NEWT_ERR_NOMEM, "model_cuda_kernels_init: out of memory");
  k->s = (cudaStream_t)stream;
  newt_result_t r = NEWT_OK;
  int dev = 0;
  cudaError_t e;
  cublasStatus_t bs;
  const char *call = "";
#define INIT_CU(c)                 \
  if ((e = (c)) != cudaSuccess) {  \
    call = #c;                     \
    goto cuda_error;               \
  }
#define INIT_CUBLAS(c)                       \
  if ((bs = (c)) != CUBLAS_STATUS_SUCCESS) { \
    call = #c;                               \
    goto cublas_error;                       \
  }
  INIT_CU(cudaGetDevice(&dev));
  INIT_CU(cudaDeviceGetAttribute(&k->sms, cudaDevAttrMultiProcessorCount, dev));
  INIT_CU(cudaDeviceGetAttribute(&k->pools, cudaDevAttrMemoryPoolsSupported, dev));
  INIT_CUBLAS(cublas_api.Create(&k->h));
  /* the stream first: cublasSetStream resets the workspace to cuBLAS's own */
  INIT_CUBLAS(cublas_api.SetStream(k->h, k->s));
  INIT_CU(cudaMalloc(&k->ws, CUBLAS_WORKSPACE));
  INIT_CUBLAS(cublas_api.SetWorkspace(k->h, k->ws, CUBLAS_WORKSPACE));
  INIT_CU(cudaMalloc((void **)&k->parts, SQNORM_PARTS_MAX * sizeof(double)));
#undef INIT_CU
#undef INIT_CUBLAS
  *out = k;
  return NEWT_OK;
cuda_error:
  r = cuda_fail("model_cuda_kernels_init", call, e);
  model_cuda_kernels_free(k);
  return r;
cublas_error:
  r = cublas_fail("model_cuda_kernels_init", call, bs);
  model_cuda_kernels_free(k);
  return r;
}

extern "C" void model_cuda_kernels_free(model_cuda_kernels *k) {
  if (!k) return;
  if (k->pools) { /* the grown buffers came from cudaMallocAsync */
    if (k->scratch) (void)cudaFreeAsync(k->scratch, k->s);
    if (k->ones) (void)cudaFreeAsync(k->ones, k->s);
  } else {
    (void)cudaStreamSynchronize(k->s);
    (void)cudaFree(k->scratch);
    (void)cudaFree(k->ones);
  }
  (void)cudaStreamSynchronize(k->s);
  if (k->h) (void)cublas_api.Destroy(k->h);
  (void)cudaFree(k->ws);
  (void)cudaFree(k->parts);
  (void)cudaGetLastError(); /* an error here is not the next op's */
  free(k);
}

/* ---- GEMMs --------------------------------------------------------------------------------------- */

/* column-major C (m,n) = alpha op(A) op(B) + beta C, fp32 buffers, bf16 tensor cores */
static newt_result_t gemm(model_cuda_kernels *k, const char *op, cublasOperation_t ta, cublasOperation_t tb, int m,
                          int n, int kk, float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                          float *C, int ldc) {
  cublasStatus_t s = cublas_api.GemmEx(k->h, ta, tb, m, n, kk, &alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, &beta, C,
                                  CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT);
  return s == CUBLAS_STATUS_SUCCESS ? NEWT_OK : cublas_fail(op, "cublasGemmEx", s);
}

/* `count` GEMMs as gemm(), operand i at A + i*sa, B + i*sb, C + i*sc */
static newt_result_t gemm_batched(model_cuda_kernels *k, const char *op, cublasOperation_t ta, cublasOperation_t tb,
                                  int m, int n, int kk, float alpha, const float *A, int lda, long long sa,
                                  const float *B, int ldb, long long sb, float beta, float *C, int ldc, long long sc,
                                  int count) {
  cublasStatus_t s = cublas_api.GemmStridedBatchedEx(k->h, ta, tb, m, n, kk, &alpha, A, CUDA_R_32F, lda, sa, B, CUDA_R_32F,
                                                ldb, sb, &beta, C, CUDA_R_32F, ldc, sc, count,
                                                CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT);
  return s == CUBLAS_STATUS_SUCCESS ? NEWT_OK : cublas_fail(op, "cublasGemmStridedBatchedEx", s);
}

/* ---- launchers: embeddings --------------------------------------------------------------------- */

extern "C" newt_result_t model_cuda_encoder_forward(model_cuda_kernels *k, float *out, const int32_t *inp,
                                                    const float *wte, const float *wpe, int B, int T, int C) {
  DIMS("encoder_forward", B >= 0 && T >= 0 && C >= 0, "B %d, T %d, C %d", B, T, C);
  size_t n = (size_t)B * T * C;
  if (!n) return NEWT_OK;
  k_encoder_fwd<<<grid_for(n, THREADS), THREADS, 0, k->s>>>(out, inp, wte, wpe, T, C, n);
  LAUNCHED("encoder_forward");
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_encoder_backward(model_cuda_kernels *k, float *dwte, float *dwpe,
                                                     const float *dout, const int32_t *inp, int B, int T, int C) {
  DIMS("encoder_backward", B >= 0 && T >= 0 && C >= 0, "B %d, T %d, C %d", B, T, C);
  size_t n = (size_t)B * T * C;
  if (!n) return NEWT_OK;
  k_tokens_bwd<<<grid_for(n, THREADS), THREADS, 0, k->s>>>(dwte, dout, inp, C, 0, INT_MAX, n);
  LAUNCHED("encoder_backward");
  size_t tc = (size_t)T * C;
  k_positions_bwd<<<grid_for(tc, THREADS), THREADS, 0, k->s>>>(dwpe, dout, B, tc);
  LAUNCHED("encoder_backward");
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_embed_rows_forward(model_cuda_kernels *k, float *out, const int32_t *inp,
                                                       const float *wte, int BT, int C, int lo, int Vl) {
  DIMS("embed_rows_forward", BT >= 0 && C >= 0 && Vl >= 0, "BT %d, C %d, Vl %d", BT, C, Vl);
  size_t n = (size_t)BT * C;
  if (!n) return NEWT_OK;
  k_embed_rows_fwd<<<grid_for(n, THREADS), THREADS, 0, k->s>>>(out, inp, wte, C, lo, Vl, n);
  LAUNCHED("embed_rows_forward");
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_add_positions(model_cuda_kernels *k, float *x, const float *wpe, int B, int T,
                                                  int C) {
  DIMS("add_positions", B >= 0 && T >= 0 && C >= 0, "B %d, T %d, C %d", B, T, C);
  size_t n = (size_t)B * T * C;
  if (!n) return NEWT_OK;
  k_add_positions<<<grid_for(n, THREADS), THREADS, 0, k->s>>>(x, wpe, T, C, n);
  LAUNCHED("add_positions");
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_embed_rows_backward(model_cuda_kernels *k, float *dwte, float *dwpe,
                                                        const float *dout, const int32_t *inp, int B, int T, int C,
                                                        int lo, int Vl) {
  DIMS("embed_rows_backward", B >= 0 && T >= 0 && C >= 0 && Vl >= 0, "B %d, T %d, C %d, Vl %d", B, T, C, Vl);
  size_t n = (size_t)B * T * C;
  if (!n) return NEWT_OK;
  size_t tc = (size_t)T * C;
  k_positions_bwd<<<grid_for(tc, THREADS), THREADS, 0, k->s>>>(dwpe, dout, B, tc);
  LAUNCHED("embed_rows_backward");
  if (Vl > 0) {
    k_tokens_bwd<<<grid_for(n, THREADS), THREADS, 0, k->s>>>(dwte, dout, inp, C, lo, Vl, n);
    LAUNCHED("embed_rows_backward");
  }
  return NEWT_OK;
}

/* ---- launchers: layernorm ------------------------------------------------------------------------ */

extern "C" newt_result_t model_cuda_layernorm_forward(model_cuda_kernels *k, float *out, float *mean, float *rstd,
                                                      const float *inp, const float *weight, const float *bias, int B,
                                                      int T, int C) {
  DIMS("layernorm_forward", B >= 0 && T >= 0 && C > 0, "B %d, T %d, C %d", B, T, C);
  size_t rows = (size_t)B * T;
  if (!rows) return NEWT_OK;
  k_layernorm_fwd<<<grid_for(rows, ROW_WARPS), THREADS, 0, k->s>>>(out, mean, rstd, inp, weight, bias, rows, C);
  LAUNCHED("layernorm_forward");
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_layernorm_backward(model_cuda_kernels *k, float *dinp, float *dweight,
                                                       float *dbias, const float *dout, const float *inp,
                                                       const float *weight, const float *mean, const float *rstd,
                                                       int B, int T, int C) {
  DIMS("layernorm_backward", B >= 0 && T >= 0 && C > 0, "B %d, T %d, C %d", B, T, C);
  size_t rows = (size_t)B * T;
  if (!rows) return NEWT_OK;
  /* a few blocks per multiprocessor: each adds its partial dweight, dbias once */
  unsigned grid = grid_for(rows, ROW_WARPS), cap = (unsigned)(k->sms > 0 ? 4 * k->sms : 512);
  if (grid > cap) grid = cap;
  size_t smem = 2 * (size_t)C * sizeof(float);
  if (smem <= LN_SMEM_MAX)
    k_layernorm_bwd<true><<<grid, THREADS, smem, k->s>>>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows, C);
  else
    k_layernorm_bwd<false><<<grid, THREADS, 0, k->s>>>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows, C);
  LAUNCHED("layernorm_backward");
  return NEWT_OK;
}

/* ---- launchers: linear layers -------------------------------------------------------------------- */

extern "C" newt_result_t model_cuda_matmul_forward(model_cuda_kernels *k, float *out, const float *res,
                                                   const float *inp, const float *weight, const float *bias, int B,
                                                   int T, int C, int OC) {
  DIMS("matmul_forward", B >= 0 && T >= 0 && C > 0 && OC > 0 && (long long)B * T <= INT_MAX,
       "B %d, T %d, C %d, OC %d", B, T, C, OC);
  int M = B * T;
  if (!M) return NEWT_OK;
  float beta = 0.0f;
  if (res || bias) {
    size_t n = (size_t)M * OC;
    if (bias || res != out) {
      k_res_bias<<<grid_for(n, THREADS), THREADS, 0, k->s>>>(out, res, bias, OC, n);
      LAUNCHED("matmul_forward");
    }
    beta = 1.0f;
  }
  /* out (M,OC) = inp (M,C) @ weight (OC,C)^T [+ out] */
  return gemm(k, "matmul_forward", CUBLAS_OP_T, CUBLAS_OP_N, OC, M, C, 1.0f, weight, C, inp, C, beta, out, OC);
}

extern "C" newt_result_t model_cuda_matmul_backward(model_cuda_kernels *k, float *dinp, float *dweight, float *dbias,
                                                    const float *dout, const float *inp, const float *weight, int B,
                                                    int T, int C, int OC) {
  DIMS("matmul_backward", B >= 0 && T >= 0 && C > 0 && OC > 0 && (long long)B * T <= INT_MAX,
       "B %d, T %d, C %d, OC %d", B, T, C, OC);
  int M = B * T;
  if (!M) return NEWT_OK;
  const char *op = "matmul_backward";
  /* dinp (M,C) = dout (M,OC) @ weight (OC,C) */
  if (dinp) NEWT_CHECK(gemm(k, op, CUBLAS_OP_N, CUBLAS_OP_N, C, M, OC, 1.0f, weight, C, dout, OC, 0.0f, dinp, C));
  /* dweight (OC,C) += dout (M,OC)^T @ inp (M,C) */
  NEWT_CHECK(gemm(k, op, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, M, 1.0f, inp, C, dout, OC, 1.0f, dweight, C));
  if (dbias) {
    /* dbias (OC) += dout (M,OC)^T @ ones (M), in fp32 */
    const float *one = NULL;
    NEWT_CHECK(ones(k, op, (size_t)M, &one));
    float alpha = 1.0f, beta = 1.0f;
    cublasStatus_t s = cublas_api.Sgemv(k->h, CUBLAS_OP_N, OC, M, &alpha, dout, OC, one, 1, &beta, dbias, 1);
    if (s != CUBLAS_STATUS_SUCCESS) return cublas_fail(op, "cublasSgemv", s);
  }
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_add_res_bias(model_cuda_kernels *k, float *out, const float *res,
                                                 const float *bias, size_t BT, size_t C) {
  size_t n = BT * C;
  if (!n) return NEWT_OK;
  k_add_res_bias<<<grid_for(n, THREADS), THREADS, 0, k->s>>>(out, res, bias, C, n);
  LAUNCHED("add_res_bias");
  return NEWT_OK;
}

/* ---- launchers: attention ------------------------------------------------------------------------ */

static newt_result_t attention_dims(const char *op, int B, int T, int C, int NH) {
  if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH != 0 || 3LL * C > INT_MAX || (long long)T * T > INT_MAX)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: B %d, T %d, C %d, NH %d: C must be a positive multiple of NH", op, B, T, C,
                    NH);
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_attention_forward(model_cuda_kernels *k, float *out, float *att, const float *qkv,
                                                      int B, int T, int C, int NH) {
  const char *op = "attention_forward";
  NEWT_CHECK(attention_dims(op, B, T, C, NH));
  if (!B || !T) return NEWT_OK;
  int hs = C / NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
  long long TT = (long long)T * T;
  for (int b = 0; b < B; b++) {
    const float *q = qkv + (size_t)b * T * C3, *kk = q + C;
    float *P = att + (size_t)b * NH * TT;
    /* head h: S (T,T) = scale * Q_h (T,hs) @ K_h (T,hs)^T */
    NEWT_CHECK(gemm_batched(k, op, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, kk, C3, hs, q, C3, hs, 0.0f, P, T, TT,
                            NH));
  }
  size_t rows = (size_t)B * NH * T;
  k_softmax_causal<<<grid_for(rows, ROW_WARPS), THREADS, 0, k->s>>>(att, rows, T);
  LAUNCHED(op);
  for (int b = 0; b < B; b++) {
    const float *v = qkv + (size_t)b * T * C3 + 2 * (size_t)C;
    const float *P = att + (size_t)b * NH * TT;
    float *o = out + (size_t)b * T * C;
    /* head h: O_h (T,hs) = P (T,T) @ V_h (T,hs) */
    NEWT_CHECK(gemm_batched(k, op, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, v, C3, hs, P, T, TT, 0.0f, o, C, hs, NH));
  }
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_attention_backward(model_cuda_kernels *k, float *dqkv, const float *dout,
                                                       const float *att, const float *qkv, int B, int T, int C,
                                                       int NH) {
  const char *op = "attention_backward";
  NEWT_CHECK(attention_dims(op, B, T, C, NH));
  if (!B || !T) return NEWT_OK;
  int hs = C / NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
  long long TT = (long long)T * T;
  /* one batch row at a time: dS and the masked P of its NH heads */
  float *dS;
  NEWT_CHECK(scratch_floats(k, op, 2 * (size_t)NH * TT, &dS));
  float *Pm = dS + (size_t)NH * TT;
  size_t rows = (size_t)NH * T;
  for (int b = 0; b < B; b++) {
    const float *q = qkv + (size_t)b * T * C3, *kk = q + C, *v = q + 2 * (size_t)C;
    float *dq = dqkv + (size_t)b * T * C3, *dk = dq + C, *dv = dq + 2 * (size_t)C;
    const float *P = att + (size_t)b * NH * TT, *dO = dout + (size_t)b * T * C;
    /* dP (T,T) = dO_h (T,hs) @ V_h (T,hs)^T */
    NEWT_CHECK(gemm_batched(k, op, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, v, C3, hs, dO, C, hs, 0.0f, dS, T, TT,
                            NH));
    k_softmax_causal_bwd<<<grid_for(rows, ROW_WARPS), THREADS, 0, k->s>>>(dS, Pm, P, rows, T);
    LAUNCHED(op);
    /* dQ_h (T,hs) = scale * dS (T,T) @ K_h (T,hs) */
    NEWT_CHECK(gemm_batched(k, op, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, scale, kk, C3, hs, dS, T, TT, 0.0f, dq, C3, hs,
                            NH));
    /* dK_h (T,hs) = scale * dS (T,T)^T @ Q_h (T,hs) */
    NEWT_CHECK(gemm_batched(k, op, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, scale, q, C3, hs, dS, T, TT, 0.0f, dk, C3, hs,
                            NH));
    /* dV_h (T,hs) = P (T,T)^T @ dO_h (T,hs) */
    NEWT_CHECK(gemm_batched(k, op, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, dO, C, hs, Pm, T, TT, 0.0f, dv, C3, hs,
                            NH));
  }
  return NEWT_OK;
}

/* ---- launchers: GELU ------------------------------------------------------------------------------ */

extern "C" newt_result_t model_cuda_gelu_forward(model_cuda_kernels *k, float *out, const float *inp, size_t N) {
  if (!N) return NEWT_OK;
  k_gelu_fwd<<<grid_for(N, THREADS), THREADS, 0, k->s>>>(out, inp, N);
  LAUNCHED("gelu_forward");
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_gelu_backward(model_cuda_kernels *k, float *dinp, const float *inp,
                                                  const float *dout, size_t N) {
  if (!N) return NEWT_OK;
  k_gelu_bwd<<<grid_for(N, THREADS), THREADS, 0, k->s>>>(dinp, inp, dout, N);
  LAUNCHED("gelu_backward");
  return NEWT_OK;
}

/* ---- launchers: cross-entropy ----------------------------------------------------------------------- */

static unsigned row_blocks(size_t rows) { return (unsigned)(rows < MAX_GRID ? rows : MAX_GRID); }

extern "C" newt_result_t model_cuda_crossentropy(model_cuda_kernels *k, float *losses, float *dlogits,
                                                 const float *logits, const int32_t *targets, int B, int T, int V,
                                                 float dscale, double *loss_acc) {
  DIMS("crossentropy", B >= 0 && T >= 0 && V > 0, "B %d, T %d, V %d", B, T, V);
  size_t rows = (size_t)B * T;
  if (!rows) return NEWT_OK;
  k_crossentropy<<<row_blocks(rows), THREADS, 0, k->s>>>(losses, dlogits, logits, targets, V, dscale, rows);
  LAUNCHED("crossentropy");
  k_sum_into<<<1, 1024, 0, k->s>>>(loss_acc, losses, rows);
  LAUNCHED("crossentropy");
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_ce_rowmax(model_cuda_kernels *k, float *mx, const float *logits, int BT, int Vl) {
  DIMS("ce_rowmax", BT >= 0 && Vl >= 0, "BT %d, Vl %d", BT, Vl);
  if (!BT) return NEWT_OK;
  k_ce_rowmax<<<row_blocks((size_t)BT), THREADS, 0, k->s>>>(mx, logits, Vl, (size_t)BT);
  LAUNCHED("ce_rowmax");
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_ce_partials(model_cuda_kernels *k, float *st, const float *logits,
                                                const float *mx, const int32_t *targets, int BT, int Vl, int lo) {
  DIMS("ce_partials", BT >= 0 && Vl >= 0, "BT %d, Vl %d", BT, Vl);
  if (!BT) return NEWT_OK;
  k_ce_partials<<<row_blocks((size_t)BT), THREADS, 0, k->s>>>(st, logits, mx, targets, Vl, lo, (size_t)BT);
  LAUNCHED("ce_partials");
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_ce_finish(model_cuda_kernels *k, float *losses, float *logits, const float *mx,
                                              const float *st, const int32_t *targets, int BT, int Vl, int lo,
                                              float dscale, double *loss_acc) {
  DIMS("ce_finish", BT >= 0 && Vl >= 0, "BT %d, Vl %d", BT, Vl);
  if (!BT) return NEWT_OK;
  k_ce_finish<<<row_blocks((size_t)BT), THREADS, 0, k->s>>>(losses, logits, mx, st, targets, Vl, lo, dscale,
                                                            (size_t)BT);
  LAUNCHED("ce_finish");
  k_sum_into<<<1, 1024, 0, k->s>>>(loss_acc, losses, (size_t)BT);
  LAUNCHED("ce_finish");
  return NEWT_OK;
}

/* ---- launchers: the optimizer ------------------------------------------------------------------------ */

extern "C" newt_result_t model_cuda_sqnorm(model_cuda_kernels *k, double *acc, const float *x, size_t n) {
  if (!n) return NEWT_OK;
  /* a fixed number of partials for a device: the same sum, bit for bit, every run */
  unsigned parts = (unsigned)(k->sms > 0 ? 4 * k->sms : 512);
  if (parts > SQNORM_PARTS_MAX) parts = SQNORM_PARTS_MAX;
  unsigned need = grid_for(n, THREADS);
  if (parts > need) parts = need;
  k_sqnorm_parts<<<parts, THREADS, 0, k->s>>>(k->parts, x, n);
  LAUNCHED("sqnorm");
  k_sum_parts<<<1, 1024, 0, k->s>>>(acc, k->parts, (int)parts);
  LAUNCHED("sqnorm");
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_adamw_update(model_cuda_kernels *k, model_adamw *o, const model_layout *lay,
                                                 float *params, const float *grads, double lr, float grad_scale) {
  /* optim.c's model_adamw_update, its host-side constants computed the same way */
  o->t++;
  const model_adamw_config *h = &o->hp;
  double bc1 = 1.0 - pow(h->beta1, (double)o->t), bc2 = 1.0 - pow(h->beta2, (double)o->t);
  const float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2), eps = (float)h->eps;
  const float b1 = (float)h->beta1, b2 = (float)h->beta2;
  const float wdecay = (float)(1.0 - lr * h->weight_decay);
  const size_t lo = o->off, hi = o->off + o->len;
  /* one launch per tensor the range crosses: the gaps between tensors stay as they are */
  for (size_t t = 0; t < lay->n; t++) {
    const model_tensor *x = &lay->tensors[t];
    size_t a = x->offset > lo ? x->offset : lo, b = x->offset + x->size < hi ? x->offset + x->size : hi;
    if (a >= b) continue;
    k_adamw<<<grid_for(b - a, THREADS), THREADS, 0, k->s>>>(params, grads, o->m, o->v, a, b - a, lo, b1, b2,
                                                            grad_scale, step_size, bc2_sqrt, eps,
                                                            x->decay ? wdecay : 1.0f);
    LAUNCHED("adamw");
  }
  return NEWT_OK;
}
