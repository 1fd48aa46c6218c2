/* The CPU ops (see ops.h): fp32, OpenBLAS for GEMMs, OpenMP for the rest.
 *
 * Parallel layout: row-wise ops (layernorm, gelu, cross-entropy) split rows; attention
 * splits (batch, head) pairs, each thread running its head as single-threaded GEMMs over
 * blocks of 64 query rows that skip the key blocks above the diagonal (the causal half),
 * with the softmax and its backward in between; encoder backward splits
 * channels so that no two threads add into the same embedding row; a GEMM splits the rows
 * of its output into blocks (gemm_chunk) that the threads take dynamically, each calling
 * cblas_sgemm on its block with OpenBLAS in single-threaded mode. Reductions that cross
 * rows (layernorm's dweight, dbias) go through per-thread partials in the caller's scratch.
 * Transcendentals use model_expf, a polynomial that vectorises (libm's expf and tanhf
 * do not without -ffast-math): GELU's tanh is 1 - 2 / (exp(2u) + 1). */
#include "model/ops.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int n_threads = 1;

int model_threads_set(int threads) {
  if (threads <= 0) threads = omp_get_num_procs();
  n_threads = threads;
  omp_set_num_threads(threads);
  openblas_set_num_threads(1);
  return n_threads;
}

int model_threads_get(void) { return n_threads; }

const char *model_blas_core(void) { return openblas_get_corename(); }

const char *model_blas_core_hint(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (getenv("OPENBLAS_CORETYPE")) return NULL;
  /* OpenBLAS's x86-64 cores without AVX2 (its names, as openblas_get_corename says them) */
  static const char *const before_avx2[] = {"unknown", "katmai", "coppermine", "northwood", "prescott", "banias",
                                            "atom", "core2", "penryn", "dunnington", "nehalem", "sandybridge",
                                            "opteron", "barcelona", "bobcat", "bulldozer", "piledriver", "nano"};
  const char *core = openblas_get_corename();
  int old = 0;
  for (size_t i = 0; core && i < sizeof before_avx2 / sizeof before_avx2[0]; i++) old |= !strcasecmp(core, before_avx2[i]);
  __builtin_cpu_init(); /* its answers include the OS's: AVX state saved on a switch */
  if (!old || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return NULL;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return __builtin_cpu_supports("avx512bf16") ? "Cooperlake" : "SkylakeX";
  return "Haswell";
#else
  return NULL;
#endif
}

size_t model_ops_scratch_floats(int T, int C, int NH) {
  (void)NH;
  size_t att = (size_t)T * T; /* attention backward: dS */
  size_t ln = 2 * (size_t)C;  /* layernorm backward: dweight, dbias partials */
  size_t n = att > ln ? att : ln;
  return (n + 15) / 16 * 16;
}

/* The [begin, end) block of n items for thread t of nt, in multiples of `grain`. */
static void split(int n, int t, int nt, int grain, int *begin, int *end) {
  int units = (n + grain - 1) / grain;
  int u0 = (int)((long)units * t / nt), u1 = (int)((long)units * (t + 1) / nt);
  *begin = u0 * grain < n ? u0 * grain : n;
  *end = u1 * grain < n ? u1 * grain : n;
}

void model_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                           int T, int C) {
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < B * T; bt++) {
    const float *e = wte + (size_t)inp[bt] * C, *p = wpe + (size_t)(bt % T) * C;
    float *o = out + (size_t)bt * C;
#pragma omp simd
    for (int i = 0; i < C; i++) o[i] = e[i] + p[i];
  }
}

void model_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                            int T, int C) {
#pragma omp parallel
  {
    int c0, c1;
    split(C, omp_get_thread_num(), omp_get_num_threads(), 16, &c0, &c1);
    for (int bt = 0; bt < B * T; bt++) {
      const float *d = dout + (size_t)bt * C;
      float *e = dwte + (size_t)inp[bt] * C, *p = dwpe + (size_t)(bt % T) * C;
#pragma omp simd
      for (int i = c0; i < c1; i++) {
        e[i] += d[i];
        p[i] += d[i];
      }
    }
  }
}

void model_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                             const float *weight, const float *bias, int B, int T, int C) {
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < B * T; bt++) {
    const float *x = inp + (size_t)bt * C;
    float m = 0.0f;
#pragma omp simd reduction(+ : m)
    for (int i = 0; i < C; i++) m += x[i];
    m /= C;
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
    v /= C;
    float s = 1.0f / sqrtf(v + 1e-5f);
    float *o = out + (size_t)bt * C;
#pragma omp simd
    for (int i = 0; i < C; i++) o[i] = (s * (x[i] - m)) * weight[i] + bias[i];
    mean[bt] = m;
    rstd[bt] = s;
  }
}

void model_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, const float *mean,
                              const float *rstd, int B, int T, int C, float *scratch) {
  size_t stride = (2 * (size_t)C + 15) / 16 * 16; /* <= model_ops_scratch_floats() */
  int nt = 1;
#pragma omp parallel
  {
    int t = omp_get_thread_num();
#pragma omp single
    nt = omp_get_num_threads();
    float *dw = scratch + (size_t)t * stride, *db = dw + C;
    memset(dw, 0, 2 * (size_t)C * sizeof(float));
    int r0, r1;
    split(B * T, t, omp_get_num_threads(), 1, &r0, &r1);
    for (int bt = r0; bt < r1; bt++) {
      const float *x = inp + (size_t)bt * C, *d = dout + (size_t)bt * C;
      float *dx = dinp + (size_t)bt * C;
      float m = mean[bt], s = rstd[bt];
      float dmean = 0.0f, dnmean = 0.0f;
#pragma omp simd reduction(+ : dmean, dnmean)
      for (int i = 0; i < C; i++) {
        float n = (x[i] - m) * s, dn = weight[i] * d[i];
        dmean += dn;
        dnmean += dn * n;
      }
      dmean /= C;
      dnmean /= C;
#pragma omp simd
      for (int i = 0; i < C; i++) {
        float n = (x[i] - m) * s, dn = weight[i] * d[i];
        db[i] += d[i];
        dw[i] += n * d[i];
        dx[i] += (dn - dmean - n * dnmean) * s;
      }
    }
  }
  /* reduce the per-thread partials, channels split over threads */
#pragma omp parallel for schedule(static)
  for (int i = 0; i < C; i++) {
    float w = 0.0f, b = 0.0f;
    for (int t = 0; t < nt; t++) {
      w += scratch[(size_t)t * stride + i];
      b += scratch[(size_t)t * stride + C + i];
    }
    dweight[i] += w;
    dbias[i] += b;
  }
}

/* Rows per GEMM block: one block with one thread; with more, about four blocks per thread
 * (at least 64 rows, multiples of 16) handed out dynamically, so a thread that the OS
 * preempts (other processes on the cores) delays the op by a block, not by its whole share. */
static int gemm_chunk(int n) {
  if (n_threads <= 1) return n > 0 ? n : 1;
  int c = (n + 4 * n_threads - 1) / (4 * n_threads);
  c = (c + 15) / 16 * 16;
  return c < 64 ? 64 : c;
}

void model_matmul_forward(float *out, const float *res, const float *inp, const float *weight,
                          const float *bias, int B, int T, int C, int OC) {
  int M = B * T, ch = gemm_chunk(M), nch = (M + ch - 1) / ch;
#pragma omp parallel for schedule(dynamic, 1)
  for (int k = 0; k < nch; k++) {
    int m0 = k * ch, m1 = m0 + ch < M ? m0 + ch : M;
    float beta = 0.0f;
    if (res || bias) {
      beta = 1.0f;
      for (int m = m0; m < m1; m++) {
        float *o = out + (size_t)m * OC;
        const float *r = res ? res + (size_t)m * OC : NULL;
        if (r && bias) {
#pragma omp simd
          for (int o_ = 0; o_ < OC; o_++) o[o_] = r[o_] + bias[o_];
        } else {
          memcpy(o, r ? r : bias, (size_t)OC * sizeof(float));
        }
      }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m1 - m0, OC, C, 1.0f, inp + (size_t)m0 * C, C,
                weight, C, beta, out + (size_t)m0 * OC, OC);
  }
}

void model_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, int B, int T, int C, int OC) {
  int M = B * T, mch = gemm_chunk(M), nm = dinp ? (M + mch - 1) / mch : 0;
  int och = gemm_chunk(OC), no = (OC + och - 1) / och;
#pragma omp parallel
  {
    /* dinp rows [m0, m1) = dout[m0..m1) @ weight */
#pragma omp for schedule(dynamic, 1) nowait
    for (int k = 0; k < nm; k++) {
      int m0 = k * mch, m1 = m0 + mch < M ? m0 + mch : M;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m1 - m0, C, OC, 1.0f, dout + (size_t)m0 * OC, OC,
                  weight, C, 0.0f, dinp + (size_t)m0 * C, C);
    }
    /* dweight rows [o0, o1) += dout[:, o0..o1)^T @ inp; dbias[o0..o1) += column sums */
#pragma omp for schedule(dynamic, 1) nowait
    for (int k = 0; k < no; k++) {
      int o0 = k * och, o1 = o0 + och < OC ? o0 + och : OC;
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, C, M, 1.0f, dout + o0, OC, inp, C, 1.0f,
                  dweight + (size_t)o0 * C, C);
      if (dbias)
        for (int m = 0; m < M; m++) {
          const float *d = dout + (size_t)m * OC;
#pragma omp simd
          for (int o = o0; o < o1; o++) dbias[o] += d[o];
        }
    }
  }
}

/* Attention of one (batch, head) pair as GEMMs over row blocks of ATT_BLK, skipping the
 * blocks above the diagonal: row block r of the scores needs key columns [0, (r+1) BLK)
 * only. Inside the diagonal block the entries above the diagonal are set to zero in att
 * (and in dS), so the GEMMs that read the block see a causal matrix. */
#define ATT_BLK 64

void model_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                             float *scratch) {
  (void)scratch;
  int hs = C / NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(dynamic, 1)
  for (int bh = 0; bh < B * NH; bh++) {
    int b = bh / NH, h = bh % NH;
    const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * (size_t)C;
    float *P = att + (size_t)bh * T * T; /* (T,T) */
    float *o = out + (size_t)b * T * C + (size_t)h * hs;
    for (int r0 = 0; r0 < T; r0 += ATT_BLK) {
      int rn = T - r0 < ATT_BLK ? T - r0 : ATT_BLK, cols = r0 + rn;
      /* S[r0.., 0..cols) = scale * Q[r0..] K[0..cols)^T */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rn, cols, hs, scale, q + (size_t)r0 * C3, C3,
                  k, C3, 0.0f, P + (size_t)r0 * T, T);
      for (int t = r0; t < cols; t++) {
        float *row = P + (size_t)t * T;
        int n = t + 1;
        float mx = row[0];
        for (int t2 = 1; t2 < n; t2++) mx = row[t2] > mx ? row[t2] : mx;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int t2 = 0; t2 < n; t2++) {
          float e = model_expf(row[t2] - mx);
          row[t2] = e;
          sum += e;
        }
        float inv = 1.0f / sum;
#pragma omp simd
        for (int t2 = 0; t2 < n; t2++) row[t2] *= inv;
        memset(row + n, 0, (size_t)(cols - n) * sizeof(float));
      }
      /* O[r0..] = P[r0.., 0..cols) V[0..cols) */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rn, hs, cols, 1.0f, P + (size_t)r0 * T, T, v,
                  C3, 0.0f, o + (size_t)r0 * C, C);
    }
  }
}

void model_attention_backward(float *dqkv, const float *dout, const float *att, const float *qkv,
                              int B, int T, int C, int NH, float *scratch) {
  int hs = C / NH, C3 = 3 * C;
  size_t stride = model_ops_scratch_floats(T, C, NH);
  float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel
  {
    float *dS = scratch + (size_t)omp_get_thread_num() * stride; /* (T,T) */
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; bh++) {
      int b = bh / NH, h = bh % NH;
      size_t qo = (size_t)b * T * C3 + (size_t)h * hs;
      const float *q = qkv + qo, *k = q + C, *v = q + 2 * (size_t)C;
      float *dq = dqkv + qo, *dk = dq + C, *dv = dq + 2 * (size_t)C;
      const float *P = att + (size_t)bh * T * T;
      const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
      for (int r0 = 0; r0 < T; r0 += ATT_BLK) {
        int rn = T - r0 < ATT_BLK ? T - r0 : ATT_BLK, cols = r0 + rn;
        /* dP[r0.., 0..cols) = dO[r0..] V[0..cols)^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rn, cols, hs, 1.0f, dO + (size_t)r0 * C, C, v,
                    C3, 0.0f, dS + (size_t)r0 * T, T);
        /* softmax backward: dS = P * (dP - sum(P * dP)), zero above the diagonal */
        for (int t = r0; t < cols; t++) {
          const float *p = P + (size_t)t * T;
          float *d = dS + (size_t)t * T;
          int n = t + 1;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int t2 = 0; t2 < n; t2++) dot += p[t2] * d[t2];
#pragma omp simd
          for (int t2 = 0; t2 < n; t2++) d[t2] = p[t2] * (d[t2] - dot);
          memset(d + n, 0, (size_t)(cols - n) * sizeof(float));
        }
        /* dQ[r0..] = scale * dS[r0.., 0..cols) K[0..cols) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rn, hs, cols, scale, dS + (size_t)r0 * T, T,
                    k, C3, 0.0f, dq + (size_t)r0 * C3, C3);
      }
      /* column block c0 of dK and dV: rows [c0, T) of dS and P reach it */
      for (int c0 = 0; c0 < T; c0 += ATT_BLK) {
        int cn = T - c0 < ATT_BLK ? T - c0 : ATT_BLK, rows = T - c0;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cn, hs, rows, scale, dS + (size_t)c0 * T + c0, T,
                    q + (size_t)c0 * C3, C3, 0.0f, dk + (size_t)c0 * C3, C3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cn, hs, rows, 1.0f, P + (size_t)c0 * T + c0, T,
                    dO + (size_t)c0 * C, C, 0.0f, dv + (size_t)c0 * C3, C3);
      }
    }
  }
}

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */

/* tanh(u) = 1 - 2 / (exp(2u) + 1) */
static inline float tanh_fast(float u) { return 1.0f - 2.0f / (model_expf(2.0f * u) + 1.0f); }

void model_gelu_forward(float *out, const float *inp, size_t N) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < N; i++) {
    float x = inp[i];
    float u = GELU_S * (x + 0.044715f * x * x * x);
    out[i] = 0.5f * x * (1.0f + tanh_fast(u));
  }
}

void model_gelu_backward(float *dinp, const float *inp, const float *dout, size_t N) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < N; i++) {
    float x = inp[i];
    float u = GELU_S * (x + 0.044715f * x * x * x);
    float th = tanh_fast(u);
    float local = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = local * dout[i];
  }
}

double model_crossentropy_forward(float *losses, float *dlogits, const float *logits,
                                  const int32_t *targets, int B, int T, int V, float dscale) {
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int bt = 0; bt < B * T; bt++) {
    const float *l = logits + (size_t)bt * V;
    float mx = l[0];
    for (int v = 1; v < V; v++) mx = l[v] > mx ? l[v] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; v++) sum += model_expf(l[v] - mx);
    int y = targets[bt];
    float loss = logf(sum) + mx - l[y];
    losses[bt] = loss;
    total += loss;
    if (dlogits) {
      float *d = dlogits + (size_t)bt * V;
      float inv = 1.0f / sum;
#pragma omp simd
      for (int v = 0; v < V; v++) d[v] = model_expf(l[v] - mx) * inv * dscale;
      d[y] -= dscale;
    }
  }
  return total;
}
