/* The GPT on an NVIDIA GPU (see model/gpt_cuda.h): bf16 activations and GEMMs over cuBLAS
 * with fp32 accumulation, fp32 master weights, gradients, moments and residual gradient.
 *
 * The step mirrors the CPU model (model/gpt.c) piece for piece; each op below names its
 * CPU twin in model/ops.h. Row-wise kernels (layernorm, softmax) use one warp per row;
 * cross-entropy one block per row; elementwise kernels one thread per element. Parameter
 * gradients that many rows add into (layernorm weights, embeddings) use fp32 atomics.
 *
 * cuBLAS is column-major: a row-major (R, K) matrix is its (K, R) transpose to cuBLAS, so
 * the row-major product out = inp @ W^T is computed as out^T = W^T^T inp^T, and so on; each
 * call carries the row-major formula it computes. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/err.h"
#include "model/carve.h"
#include "model/gpt_cuda.h"
#include "model/layout.h"
}

typedef __nv_bfloat16 bf16;

#define CU(call)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess)                                                                    \
      return NEWT_ERR(NEWT_ERR_CUDA, "%s: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
  } while (0)
#define CUBLAS(call)                                                                          \
  do {                                                                                        \
    cublasStatus_t s_ = (call);                                                               \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                          \
      return NEWT_ERR(NEWT_ERR_CUDA, "%s: cuBLAS status %d (%s:%d)", #call, (int)s_, __FILE__, __LINE__); \
  } while (0)
#define LAUNCHED() CU(cudaGetLastError())

static __device__ __forceinline__ float bf(bf16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ bf16 tobf(float x) { return __float2bfloat16(x); }

static __device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
static __device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/* Sum (IS_MAX 0) or max (IS_MAX 1) over a block of at most 1024 threads; every thread
 * gets the result. */
template <int IS_MAX>
static __device__ float block_reduce(float v) {
  __shared__ float part[32];
  __shared__ float total;
  int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = (blockDim.x + 31) / 32;
  v = IS_MAX ? warp_max(v) : warp_sum(v);
  __syncthreads(); /* part[] may still be read by a previous call */
  if (lane == 0) part[w] = v;
  __syncthreads();
  if (w == 0) {
    float s = lane < nw ? part[lane] : (IS_MAX ? -INFINITY : 0.0f);
    s = IS_MAX ? warp_max(s) : warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}
#define block_sum(v) block_reduce<0>(v)
#define block_max(v) block_reduce<1>(v)

#define THREADS 256
static unsigned blocks_for(size_t n) { return (unsigned)((n + THREADS - 1) / THREADS); }
static unsigned warp_blocks_for(size_t rows) { return (unsigned)((rows + THREADS / 32 - 1) / (THREADS / 32)); }

/* --- kernels ------------------------------------------------------------------------ */

/* model_encoder_forward: out (B,T,C) = wte[inp] + wpe[t] */
__global__ void k_encoder_fwd(bf16 *out, const int32_t *inp, const bf16 *wte, const bf16 *wpe, int T, int C,
                              size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  size_t bt = i / C;
  int c = (int)(i % C), t = (int)(bt % T);
  out[i] = tobf(bf(wte[(size_t)inp[bt] * C + c]) + bf(wpe[(size_t)t * C + c]));
}

/* model_encoder_backward: dwte, dwpe += dout (fp32) */
__global__ void k_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int T, int C,
                              size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  size_t bt = i / C;
  int c = (int)(i % C), t = (int)(bt % T);
  atomicAdd(&dwte[(size_t)inp[bt] * C + c], dout[i]);
  atomicAdd(&dwpe[(size_t)t * C + c], dout[i]);
}

/* model_layernorm_forward, one warp per row of C */
__global__ void k_layernorm_fwd(bf16 *out, float *mean, float *rstd, const bf16 *inp, const bf16 *w,
                                const bf16 *b, int N, int C) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const bf16 *x = inp + (size_t)row * C;
  float s = 0.0f;
  for (int i = lane; i < C; i += 32) s += bf(x[i]);
  float m = warp_sum(s) / C;
  float v = 0.0f;
  for (int i = lane; i < C; i += 32) {
    float d = bf(x[i]) - m;
    v += d * d;
  }
  float r = rsqrtf(warp_sum(v) / C + 1e-5f);
  bf16 *o = out + (size_t)row * C;
  for (int i = lane; i < C; i += 32) o[i] = tobf((bf(x[i]) - m) * r * bf(w[i]) + bf(b[i]));
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

/* model_layernorm_backward: dinp (fp32) accumulated; dw, db (fp32) += */
__global__ void k_layernorm_bwd(float *dinp, float *dw, float *db, const bf16 *dout, const bf16 *inp,
                                const bf16 *w, const float *mean, const float *rstd, int N, int C) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const bf16 *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
  float m = mean[row], r = rstd[row], a = 0.0f, b = 0.0f;
  for (int i = lane; i < C; i += 32) {
    float n = (bf(x[i]) - m) * r, dn = bf(w[i]) * bf(d[i]);
    a += dn;
    b += dn * n;
  }
  a = warp_sum(a) / C;
  b = warp_sum(b) / C;
  float *dx = dinp + (size_t)row * C;
  for (int i = lane; i < C; i += 32) {
    float n = (bf(x[i]) - m) * r, di = bf(d[i]), dn = bf(w[i]) * di;
    dx[i] += (dn - a - n * b) * r;
    atomicAdd(&dw[i], n * di);
    atomicAdd(&db[i], di);
  }
}

/* out (N,OC) += bias (OC) [+ res (N,OC)], after a GEMM wrote out */
__global__ void k_bias_residual(bf16 *out, const bf16 *bias, const bf16 *res, int OC, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = bf(out[i]);
  if (bias) v += bf(bias[i % OC]);
  if (res) v += bf(res[i]);
  out[i] = tobf(v);
}

/* dbias (OC) += column sums of dout (N,OC) */
__global__ void k_colsum(float *dbias, const bf16 *dout, int N, int OC) {
  int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  float s = 0.0f;
  for (int r = 0; r < N; r++) s += bf(dout[(size_t)r * OC + o]);
  dbias[o] += s;
}

#define GELU_S 0.7978845608028654f
/* model_gelu_forward */
__global__ void k_gelu_fwd(bf16 *out, const bf16 *inp, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = bf(inp[i]);
  out[i] = tobf(0.5f * x * (1.0f + tanhf(GELU_S * (x + 0.044715f * x * x * x))));
}
/* model_gelu_backward: dinp = gelu'(inp) * dout (may alias) */
__global__ void k_gelu_bwd(bf16 *dinp, const bf16 *inp, const bf16 *dout, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = bf(inp[i]), th = tanhf(GELU_S * (x + 0.044715f * x * x * x));
  float local = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
  dinp[i] = tobf(local * bf(dout[i]));
}

/* heads (B,NH,T,hs) <- src rows of stride ld (B,T,.) at column offset h*hs */
__global__ void k_split_heads(bf16 *dst, const bf16 *src, int ld, int T, int NH, int hs, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  int d = (int)(i % hs), t = (int)((i / hs) % T), h = (int)((i / ((size_t)hs * T)) % NH);
  size_t b = i / ((size_t)hs * T * NH);
  dst[i] = src[(b * T + t) * ld + (size_t)h * hs + d];
}
/* the inverse: dst rows of stride ld <- heads (B,NH,T,hs) */
__global__ void k_merge_heads(bf16 *dst, const bf16 *src, int ld, int T, int NH, int hs, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  int d = (int)(i % hs), t = (int)((i / hs) % T), h = (int)((i / ((size_t)hs * T)) % NH);
  size_t b = i / ((size_t)hs * T * NH);
  dst[(b * T + t) * ld + (size_t)h * hs + d] = src[i];
}

/* causal softmax of scaled scores (rows of T, row r is query t = r % T): att (bf16), zero
 * above the diagonal; one warp per row */
__global__ void k_softmax_fwd(bf16 *att, const float *s, int rows, int T) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  int t = row % T;
  const float *x = s + (size_t)row * T;
  float mx = -INFINITY;
  for (int i = lane; i <= t; i += 32) mx = fmaxf(mx, x[i]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int i = lane; i <= t; i += 32) sum += expf(x[i] - mx);
  float inv = 1.0f / warp_sum(sum);
  bf16 *o = att + (size_t)row * T;
  for (int i = lane; i < T; i += 32) o[i] = tobf(i <= t ? expf(x[i] - mx) * inv : 0.0f);
}

/* softmax backward: dpre = att * (datt - sum(att * datt)), zero above the diagonal */
__global__ void k_softmax_bwd(bf16 *dpre, const float *datt, const bf16 *att, int rows, int T) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  int t = row % T;
  const float *d = datt + (size_t)row * T;
  const bf16 *a = att + (size_t)row * T;
  float dot = 0.0f;
  for (int i = lane; i <= t; i += 32) dot += bf(a[i]) * d[i];
  dot = warp_sum(dot);
  bf16 *o = dpre + (size_t)row * T;
  for (int i = lane; i < T; i += 32) o[i] = tobf(i <= t ? bf(a[i]) * (d[i] - dot) : 0.0f);
}

/* model_crossentropy_forward, one block per row: losses, and dlogits (bf16) when dscale != 0 */
__global__ void k_crossentropy(float *losses, bf16 *dlogits, const float *logits, const int32_t *targets,
                               int V, float dscale) {
  size_t row = blockIdx.x;
  const float *l = logits + row * V;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, l[i]);
  mx = block_max(mx);
  float s = 0.0f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) s += expf(l[i] - mx);
  s = block_sum(s);
  int y = targets[row];
  if (threadIdx.x == 0) losses[row] = logf(s) + mx - l[y];
  if (dscale != 0.0f)
    for (int i = threadIdx.x; i < V; i += blockDim.x)
      dlogits[row * V + i] = tobf((expf(l[i] - mx) / s - (i == y ? 1.0f : 0.0f)) * dscale);
}

__global__ void k_to_bf16(bf16 *out, const float *in, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = tobf(in[i]);
}

/* sum of squares into *out (fp32 atomics of per-block sums) */
__global__ void k_sqnorm(float *out, const float *x, size_t n) {
  float s = 0.0f;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    s += x[i] * x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) atomicAdd(out, s);
}

/* model_adamw_update on one run of elements, also refreshing the bf16 copy */
__global__ void k_adamw(float *p, bf16 *p16, const float *g, float *m, float *v, size_t n, float decay, float b1,
                        float b2, float step_size, float bc2_sqrt, float eps, float gs) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float gi = g[i] * gs;
  float mi = b1 * m[i] + (1.0f - b1) * gi, vi = b2 * v[i] + (1.0f - b2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  float pi = p[i] * decay - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
  p[i] = pi;
  p16[i] = tobf(pi);
}

/* --- the model ------------------------------------------------------------------------ */

struct block16 {
  bf16 *ln1, *qkv, *att, *atty, *res1, *ln2, *fch, *fchg, *res2;
  float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
};

struct model_cuda {
  model_layout lay;
  int B, T, C, NH, V, L;
  cublasHandle_t blas;
  void *mem; /* one allocation, carved */
  float *p32, *g32, *m, *v, *norm;
  bf16 *p16;
  int32_t *inputs, *targets;
  bf16 *x0;
  block16 *blk; /* host array of device pointers */
  bf16 *lnf;
  float *lnf_mean, *lnf_rstd, *logits, *losses;
  bf16 *dlogits;
  /* backward and attention scratch */
  float *dres, *scores;
  bf16 *dres16, *dx16, *dqkv16, *dfch16, *q, *k, *vv, *y, *dq, *dk, *dv, *dpre;
  float *host_losses;
};

#define F32(c, n) ((float *)model_carve((c), (size_t)(n) * sizeof(float)))
#define B16(c, n) ((bf16 *)model_carve((c), (size_t)(n) * sizeof(bf16)))

static void carve_all(model_cuda *m, model_carver *c) {
  size_t P = m->lay.total, BT = (size_t)m->B * m->T, C = m->C, V = m->V, BHTT = (size_t)m->B * m->NH * m->T * m->T;
  m->p32 = F32(c, P);
  m->g32 = F32(c, P);
  m->m = F32(c, P);
  m->v = F32(c, P);
  m->norm = F32(c, 1);
  m->p16 = B16(c, P);
  m->inputs = (int32_t *)model_carve(c, BT * sizeof(int32_t));
  m->targets = (int32_t *)model_carve(c, BT * sizeof(int32_t));
  m->x0 = B16(c, BT * C);
  for (int l = 0; l < m->L; l++) {
    block16 tmp, *b = m->blk ? &m->blk[l] : &tmp;
    b->ln1 = B16(c, BT * C);
    b->ln1_mean = F32(c, BT);
    b->ln1_rstd = F32(c, BT);
    b->qkv = B16(c, BT * 3 * C);
    b->att = B16(c, BHTT);
    b->atty = B16(c, BT * C);
    b->res1 = B16(c, BT * C);
    b->ln2 = B16(c, BT * C);
    b->ln2_mean = F32(c, BT);
    b->ln2_rstd = F32(c, BT);
    b->fch = B16(c, BT * 4 * C);
    b->fchg = B16(c, BT * 4 * C);
    b->res2 = B16(c, BT * C);
  }
  m->lnf = B16(c, BT * C);
  m->lnf_mean = F32(c, BT);
  m->lnf_rstd = F32(c, BT);
  m->logits = F32(c, BT * V);
  m->losses = F32(c, BT);
  m->dlogits = B16(c, BT * V);
  m->dres = F32(c, BT * C);
  m->scores = F32(c, BHTT);
  m->dres16 = B16(c, BT * C);
  m->dx16 = B16(c, BT * C);
  m->dqkv16 = B16(c, BT * 3 * C);
  m->dfch16 = B16(c, BT * 4 * C);
  m->q = B16(c, BT * C);
  m->k = B16(c, BT * C);
  m->vv = B16(c, BT * C);
  m->y = B16(c, BT * C);
  m->dq = B16(c, BT * C);
  m->dk = B16(c, BT * C);
  m->dv = B16(c, BT * C);
  m->dpre = B16(c, BHTT);
}

static size_t toff(const model_cuda *m, int slot, int l) { return model_layout_get(&m->lay, slot, l)->offset; }
#define W16(slot, l) (m->p16 + toff(m, (slot), (l)))
#define G32(slot, l) (m->g32 + toff(m, (slot), (l)))

extern "C" newt_result_t model_cuda_init(model_cuda **out, const model_config *cfg, int B, int T) {
  *out = NULL;
  if (B < 1 || T < 1 || T > cfg->ctx)
    return NEWT_ERR(NEWT_ERR_INVALID, "cuda model: B = %d, T = %d: need B >= 1, 1 <= T <= ctx", B, T);
  model_cuda *m = (model_cuda *)calloc(1, sizeof *m);
  NEWT_CHECK_ALLOC(m);
  newt_result_t res = model_layout_init(&m->lay, cfg);
  if (res != NEWT_OK) {
    free(m);
    return res;
  }
  m->B = B;
  m->T = T;
  m->C = (int)cfg->channels;
  m->NH = (int)cfg->heads;
  m->V = (int)cfg->vocab;
  m->L = (int)cfg->layers;
  m->blk = (block16 *)calloc((size_t)m->L, sizeof *m->blk);
  m->host_losses = (float *)malloc((size_t)B * T * sizeof(float));
  model_carver c = {NULL, 0, 256};
  carve_all(m, &c);
  if (!m->blk || !m->host_losses) {
    model_cuda_free(m);
    return NEWT_ERR(NEWT_ERR_NOMEM, "cuda model: out of host memory");
  }
  cudaError_t e = cudaMalloc(&m->mem, c.off);
  if (e != cudaSuccess) {
    m->mem = NULL;
    model_cuda_free(m);
    return NEWT_ERR(NEWT_ERR_CUDA, "cuda model: cudaMalloc of %zu bytes: %s", c.off, cudaGetErrorString(e));
  }
  c = model_carver{(char *)m->mem, 0, 256};
  carve_all(m, &c);
  if (cublasCreate(&m->blas) != CUBLAS_STATUS_SUCCESS) {
    m->blas = NULL;
    model_cuda_free(m);
    return NEWT_ERR(NEWT_ERR_CUDA, "cuda model: cublasCreate failed");
  }
  if (cudaMemset(m->mem, 0, c.off) != cudaSuccess) {
    model_cuda_free(m);
    return NEWT_ERR(NEWT_ERR_CUDA, "cuda model: cudaMemset failed");
  }
  *out = m;
  return NEWT_OK;
}

extern "C" void model_cuda_free(model_cuda *m) {
  if (!m) return;
  if (m->blas) cublasDestroy(m->blas);
  if (m->mem) cudaFree(m->mem);
  free(m->blk);
  free(m->host_losses);
  model_layout_free(&m->lay);
  free(m);
}

extern "C" newt_result_t model_cuda_set_params(model_cuda *m, const float *params) {
  size_t n = m->lay.total;
  CU(cudaMemcpy(m->p32, params, n * sizeof(float), cudaMemcpyHostToDevice));
  k_to_bf16<<<blocks_for(n), THREADS>>>(m->p16, m->p32, n);
  LAUNCHED();
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_get_params(model_cuda *m, float *params) {
  CU(cudaMemcpy(params, m->p32, m->lay.total * sizeof(float), cudaMemcpyDeviceToHost));
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_get_grads(model_cuda *m, float *grads) {
  CU(cudaMemcpy(grads, m->g32, m->lay.total * sizeof(float), cudaMemcpyDeviceToHost));
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_get_logits(model_cuda *m, float *logits) {
  CU(cudaMemcpy(logits, m->logits, (size_t)m->B * m->T * m->V * sizeof(float), cudaMemcpyDeviceToHost));
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_zero_grads(model_cuda *m) {
  CU(cudaMemset(m->g32, 0, m->lay.total * sizeof(float)));
  return NEWT_OK;
}

/* C (m,n) = alpha op(A) op(B) + beta C, column-major, bf16 inputs, fp32 accumulation */
static newt_result_t gemm(model_cuda *m, cublasOperation_t ta, cublasOperation_t tb, int M, int N, int K,
                          float alpha, const bf16 *A, int lda, const bf16 *B, int ldb, float beta, void *C,
                          cudaDataType ct, int ldc) {
  CUBLAS(cublasGemmEx(m->blas, ta, tb, M, N, K, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta, C, ct,
                      ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return NEWT_OK;
}

static newt_result_t gemm_batched(model_cuda *m, cublasOperation_t ta, cublasOperation_t tb, int M, int N, int K,
                                  float alpha, const bf16 *A, int lda, long long sa, const bf16 *B, int ldb,
                                  long long sb, float beta, void *C, cudaDataType ct, int ldc, long long sc,
                                  int batch) {
  CUBLAS(cublasGemmStridedBatchedEx(m->blas, ta, tb, M, N, K, &alpha, A, CUDA_R_16BF, lda, sa, B, CUDA_R_16BF, ldb,
                                    sb, &beta, C, ct, ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return NEWT_OK;
}

/* model_matmul_forward: out (BT,OC) = [res +] inp (BT,C) @ W^T (W (OC,C)) [+ bias] */
static newt_result_t matmul_fwd(model_cuda *m, bf16 *out, const bf16 *res, const bf16 *inp, const bf16 *W,
                                const bf16 *bias, int C, int OC) {
  int BT = m->B * m->T;
  NEWT_CHECK(gemm(m, CUBLAS_OP_T, CUBLAS_OP_N, OC, BT, C, 1.0f, W, C, inp, C, 0.0f, out, CUDA_R_16BF, OC));
  size_t n = (size_t)BT * OC;
  k_bias_residual<<<blocks_for(n), THREADS>>>(out, bias, res, OC, n);
  LAUNCHED();
  return NEWT_OK;
}

/* model_matmul_backward: dinp (BT,C) = dout @ W; dW (OC,C) += dout^T @ inp; dbias += colsum */
static newt_result_t matmul_bwd(model_cuda *m, bf16 *dinp, float *dW, float *dbias, const bf16 *dout,
                                const bf16 *inp, const bf16 *W, int C, int OC) {
  int BT = m->B * m->T;
  NEWT_CHECK(gemm(m, CUBLAS_OP_N, CUBLAS_OP_N, C, BT, OC, 1.0f, W, C, dout, OC, 0.0f, dinp, CUDA_R_16BF, C));
  NEWT_CHECK(gemm(m, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, BT, 1.0f, inp, C, dout, OC, 1.0f, dW, CUDA_R_32F, C));
  if (dbias) {
    k_colsum<<<blocks_for((size_t)OC), THREADS>>>(dbias, dout, BT, OC);
    LAUNCHED();
  }
  return NEWT_OK;
}

static newt_result_t layernorm_fwd(model_cuda *m, bf16 *out, float *mean, float *rstd, const bf16 *inp,
                                   const bf16 *w, const bf16 *b) {
  int N = m->B * m->T;
  k_layernorm_fwd<<<warp_blocks_for((size_t)N), THREADS>>>(out, mean, rstd, inp, w, b, N, m->C);
  LAUNCHED();
  return NEWT_OK;
}

static newt_result_t layernorm_bwd(model_cuda *m, float *dw, float *db, const bf16 *dout, const bf16 *inp,
                                   const bf16 *w, const float *mean, const float *rstd) {
  int N = m->B * m->T;
  k_layernorm_bwd<<<warp_blocks_for((size_t)N), THREADS>>>(m->dres, dw, db, dout, inp, w, mean, rstd, N, m->C);
  LAUNCHED();
  return NEWT_OK;
}

/* (B,T,.) rows of stride ld at column h*hs <-> heads (B,NH,T,hs): split or merge */
static newt_result_t heads(model_cuda *m, bf16 *dst, const bf16 *src, int ld, int merge) {
  int hs = m->C / m->NH;
  size_t n = (size_t)m->B * m->T * m->C;
  if (merge) k_merge_heads<<<blocks_for(n), THREADS>>>(dst, src, ld, m->T, m->NH, hs, n);
  else k_split_heads<<<blocks_for(n), THREADS>>>(dst, src, ld, m->T, m->NH, hs, n);
  LAUNCHED();
  return NEWT_OK;
}
#define split_heads(m, dst, src, ld) heads((m), (dst), (src), (ld), 0)
#define merge_heads(m, dst, src, ld) heads((m), (dst), (src), (ld), 1)

/* q, k, v (B,NH,T,hs) from the block's qkv (B,T,3C) */
static newt_result_t split_qkv(model_cuda *m, block16 *b) {
  int C = m->C;
  NEWT_CHECK(split_heads(m, m->q, b->qkv, 3 * C));
  NEWT_CHECK(split_heads(m, m->k, b->qkv + C, 3 * C));
  return split_heads(m, m->vv, b->qkv + 2 * C, 3 * C);
}

/* model_attention_forward: per (b,h): S = scale Q K^T (fp32), P = causal softmax(S),
 * Y = P V; q, k, v, y are (B,NH,T,hs) */
static newt_result_t attention_fwd(model_cuda *m, block16 *b) {
  int T = m->T, C = m->C, NH = m->NH, hs = C / NH, BH = m->B * NH;
  long long THS = (long long)T * hs, TT = (long long)T * T;
  float scale = 1.0f / sqrtf((float)hs);
  NEWT_CHECK(split_qkv(m, b));
  /* S (T,T) = scale Q K^T */
  NEWT_CHECK(gemm_batched(m, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, m->k, hs, THS, m->q, hs, THS, 0.0f,
                          m->scores, CUDA_R_32F, T, TT, BH));
  k_softmax_fwd<<<warp_blocks_for((size_t)BH * T), THREADS>>>(b->att, m->scores, BH * T, T);
  LAUNCHED();
  /* Y (T,hs) = P V */
  NEWT_CHECK(gemm_batched(m, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, m->vv, hs, THS, b->att, T, TT, 0.0f, m->y,
                          CUDA_R_16BF, hs, THS, BH));
  return merge_heads(m, b->atty, m->y, C);
}

/* model_attention_backward: dqkv16 from dy = dx16 (B,T,C) */
static newt_result_t attention_bwd(model_cuda *m, block16 *b) {
  int T = m->T, C = m->C, NH = m->NH, hs = C / NH, BH = m->B * NH;
  long long THS = (long long)T * hs, TT = (long long)T * T;
  float scale = 1.0f / sqrtf((float)hs);
  NEWT_CHECK(split_qkv(m, b));
  NEWT_CHECK(split_heads(m, m->y, m->dx16, C)); /* y holds dY */
  /* dP (T,T) = dY V^T */
  NEWT_CHECK(gemm_batched(m, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, m->vv, hs, THS, m->y, hs, THS, 0.0f,
                          m->scores, CUDA_R_32F, T, TT, BH));
  /* dV (T,hs) = P^T dY */
  NEWT_CHECK(gemm_batched(m, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, m->y, hs, THS, b->att, T, TT, 0.0f, m->dv,
                          CUDA_R_16BF, hs, THS, BH));
  k_softmax_bwd<<<warp_blocks_for((size_t)BH * T), THREADS>>>(m->dpre, m->scores, b->att, BH * T, T);
  LAUNCHED();
  /* dQ (T,hs) = scale dS K ; dK (T,hs) = scale dS^T Q */
  NEWT_CHECK(gemm_batched(m, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, scale, m->k, hs, THS, m->dpre, T, TT, 0.0f, m->dq,
                          CUDA_R_16BF, hs, THS, BH));
  NEWT_CHECK(gemm_batched(m, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, scale, m->q, hs, THS, m->dpre, T, TT, 0.0f, m->dk,
                          CUDA_R_16BF, hs, THS, BH));
  NEWT_CHECK(merge_heads(m, m->dqkv16, m->dq, 3 * C));
  NEWT_CHECK(merge_heads(m, m->dqkv16 + C, m->dk, 3 * C));
  return merge_heads(m, m->dqkv16 + 2 * C, m->dv, 3 * C);
}

static newt_result_t dres_to_bf16(model_cuda *m) {
  size_t n = (size_t)m->B * m->T * m->C;
  k_to_bf16<<<blocks_for(n), THREADS>>>(m->dres16, m->dres, n);
  LAUNCHED();
  return NEWT_OK;
}

static const bf16 *layer_input(model_cuda *m, int l) { return l == 0 ? m->x0 : m->blk[l - 1].res2; }

static newt_result_t block_fwd(model_cuda *m, int l) {
  block16 *b = &m->blk[l];
  const bf16 *x = layer_input(m, l);
  int C = m->C;
  size_t n4 = (size_t)m->B * m->T * 4 * C;
  NEWT_CHECK(layernorm_fwd(m, b->ln1, b->ln1_mean, b->ln1_rstd, x, W16(MODEL_LN1_W, l), W16(MODEL_LN1_B, l)));
  NEWT_CHECK(matmul_fwd(m, b->qkv, NULL, b->ln1, W16(MODEL_QKV_W, l), W16(MODEL_QKV_B, l), C, 3 * C));
  NEWT_CHECK(attention_fwd(m, b));
  NEWT_CHECK(matmul_fwd(m, b->res1, x, b->atty, W16(MODEL_PROJ_W, l), W16(MODEL_PROJ_B, l), C, C));
  NEWT_CHECK(layernorm_fwd(m, b->ln2, b->ln2_mean, b->ln2_rstd, b->res1, W16(MODEL_LN2_W, l), W16(MODEL_LN2_B, l)));
  NEWT_CHECK(matmul_fwd(m, b->fch, NULL, b->ln2, W16(MODEL_FC_W, l), W16(MODEL_FC_B, l), C, 4 * C));
  k_gelu_fwd<<<blocks_for(n4), THREADS>>>(b->fchg, b->fch, n4);
  LAUNCHED();
  return matmul_fwd(m, b->res2, b->res1, b->fchg, W16(MODEL_FCPROJ_W, l), W16(MODEL_FCPROJ_B, l), 4 * C, C);
}

static newt_result_t block_bwd(model_cuda *m, int l) {
  block16 *b = &m->blk[l];
  const bf16 *x = layer_input(m, l);
  int C = m->C;
  size_t n4 = (size_t)m->B * m->T * 4 * C;
  NEWT_CHECK(dres_to_bf16(m));
  NEWT_CHECK(matmul_bwd(m, m->dfch16, G32(MODEL_FCPROJ_W, l), G32(MODEL_FCPROJ_B, l), m->dres16, b->fchg,
                        W16(MODEL_FCPROJ_W, l), 4 * C, C));
  k_gelu_bwd<<<blocks_for(n4), THREADS>>>(m->dfch16, b->fch, m->dfch16, n4);
  LAUNCHED();
  NEWT_CHECK(matmul_bwd(m, m->dx16, G32(MODEL_FC_W, l), G32(MODEL_FC_B, l), m->dfch16, b->ln2, W16(MODEL_FC_W, l),
                        C, 4 * C));
  NEWT_CHECK(layernorm_bwd(m, G32(MODEL_LN2_W, l), G32(MODEL_LN2_B, l), m->dx16, b->res1, W16(MODEL_LN2_W, l),
                           b->ln2_mean, b->ln2_rstd));
  NEWT_CHECK(dres_to_bf16(m));
  NEWT_CHECK(matmul_bwd(m, m->dx16, G32(MODEL_PROJ_W, l), G32(MODEL_PROJ_B, l), m->dres16, b->atty,
                        W16(MODEL_PROJ_W, l), C, C));
  NEWT_CHECK(attention_bwd(m, b));
  NEWT_CHECK(matmul_bwd(m, m->dx16, G32(MODEL_QKV_W, l), G32(MODEL_QKV_B, l), m->dqkv16, b->ln1,
                        W16(MODEL_QKV_W, l), C, 3 * C));
  return layernorm_bwd(m, G32(MODEL_LN1_W, l), G32(MODEL_LN1_B, l), m->dx16, x, W16(MODEL_LN1_W, l), b->ln1_mean,
                       b->ln1_rstd);
}

extern "C" newt_result_t model_cuda_forward_backward(model_cuda *m, const int32_t *inputs, const int32_t *targets,
                                                     float dscale, double *loss_sum) {
  int B = m->B, T = m->T, C = m->C, V = m->V, BT = B * T;
  size_t nbtc = (size_t)BT * C;
  for (int i = 0; i < BT; i++)
    if (inputs[i] < 0 || inputs[i] >= V || targets[i] < 0 || targets[i] >= V)
      return NEWT_ERR(NEWT_ERR_INVALID, "cuda model: token %d of the batch is outside [0, vocab = %d)", i, V);
  CU(cudaMemcpy(m->inputs, inputs, (size_t)BT * sizeof(int32_t), cudaMemcpyHostToDevice));
  CU(cudaMemcpy(m->targets, targets, (size_t)BT * sizeof(int32_t), cudaMemcpyHostToDevice));
  /* forward */
  k_encoder_fwd<<<blocks_for(nbtc), THREADS>>>(m->x0, m->inputs, W16(MODEL_WTE, 0), W16(MODEL_WPE, 0), T, C, nbtc);
  LAUNCHED();
  for (int l = 0; l < m->L; l++) NEWT_CHECK(block_fwd(m, l));
  const bf16 *xL = layer_input(m, m->L);
  NEWT_CHECK(layernorm_fwd(m, m->lnf, m->lnf_mean, m->lnf_rstd, xL, W16(MODEL_LNF_W, 0), W16(MODEL_LNF_B, 0)));
  /* logits (BT,V) fp32 = lnf @ wte^T */
  NEWT_CHECK(gemm(m, CUBLAS_OP_T, CUBLAS_OP_N, V, BT, C, 1.0f, W16(MODEL_WTE, 0), C, m->lnf, C, 0.0f, m->logits,
                  CUDA_R_32F, V));
  k_crossentropy<<<(unsigned)BT, THREADS>>>(m->losses, m->dlogits, m->logits, m->targets, V, dscale);
  LAUNCHED();
  CU(cudaMemcpy(m->host_losses, m->losses, (size_t)BT * sizeof(float), cudaMemcpyDeviceToHost));
  double sum = 0;
  for (int i = 0; i < BT; i++) sum += m->host_losses[i];
  *loss_sum = sum;
  if (dscale == 0.0f) return NEWT_OK;
  /* backward: head, blocks in reverse, embedding */
  NEWT_CHECK(gemm(m, CUBLAS_OP_N, CUBLAS_OP_N, C, BT, V, 1.0f, W16(MODEL_WTE, 0), C, m->dlogits, V, 0.0f, m->dx16,
                  CUDA_R_16BF, C));
  NEWT_CHECK(gemm(m, CUBLAS_OP_N, CUBLAS_OP_T, C, V, BT, 1.0f, m->lnf, C, m->dlogits, V, 1.0f, G32(MODEL_WTE, 0),
                  CUDA_R_32F, C));
  CU(cudaMemset(m->dres, 0, nbtc * sizeof(float)));
  NEWT_CHECK(layernorm_bwd(m, G32(MODEL_LNF_W, 0), G32(MODEL_LNF_B, 0), m->dx16, xL, W16(MODEL_LNF_W, 0), m->lnf_mean,
                           m->lnf_rstd));
  for (int l = m->L - 1; l >= 0; l--) NEWT_CHECK(block_bwd(m, l));
  k_encoder_bwd<<<blocks_for(nbtc), THREADS>>>(G32(MODEL_WTE, 0), G32(MODEL_WPE, 0), m->dres, m->inputs, T, C, nbtc);
  LAUNCHED();
  CU(cudaDeviceSynchronize());
  return NEWT_OK;
}

extern "C" newt_result_t model_cuda_adamw(model_cuda *m, const model_adamw_config *hp, int64_t t, double lr,
                                          double *grad_norm) {
  if (t < 1) return NEWT_ERR(NEWT_ERR_INVALID, "cuda adamw: update number %lld must be >= 1", (long long)t);
  size_t n = m->lay.total;
  float sq = 0.0f;
  CU(cudaMemset(m->norm, 0, sizeof(float)));
  k_sqnorm<<<1024, THREADS>>>(m->norm, m->g32, n);
  LAUNCHED();
  CU(cudaMemcpy(&sq, m->norm, sizeof(float), cudaMemcpyDeviceToHost));
  double norm = sqrt((double)sq);
  if (grad_norm) *grad_norm = norm;
  float gs = model_clip_scale(norm, hp->grad_clip);
  double bc1 = 1.0 - pow(hp->beta1, (double)t), bc2 = 1.0 - pow(hp->beta2, (double)t);
  float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2), decay = (float)(1.0 - lr * hp->weight_decay);
  for (size_t k = 0; k < m->lay.n; k++) {
    const model_tensor *tt = &m->lay.tensors[k];
    size_t o = tt->offset;
    k_adamw<<<blocks_for(tt->size), THREADS>>>(m->p32 + o, m->p16 + o, m->g32 + o, m->m + o, m->v + o, tt->size,
                                               tt->decay ? decay : 1.0f, (float)hp->beta1, (float)hp->beta2,
                                               step_size, bc2_sqrt, (float)hp->eps, gs);
    LAUNCHED();
  }
  CU(cudaDeviceSynchronize());
  return NEWT_OK;
}
