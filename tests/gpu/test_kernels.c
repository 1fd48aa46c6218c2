/* The CUDA device's kernels against the CPU device's (model/dev.h): every model_k_* op runs
 * on both devices from the same random inputs, at a few shapes (sizes that are not
 * multiples of 32 or 64, a tensor-parallel rank's slice with half the heads or half the
 * vocabulary, and gpt2-124m's own sizes), and the GPU's results are downloaded and compared
 * with the CPU's. Label gpu: it needs a GPU (tests/gpu/run.sh runs it; `make test` does not).
 *
 * Output: one JSON line per compared tensor on stdout,
 *   {"op":"matmul_forward","shape":"B8 T1024 C768 OC3072","tensor":"out","n":...,
 *    "max_abs_err":...,"max_ref":...,"err":...,"tol":...,"pass":true}
 * where err = max |gpu - cpu| / max |cpu| over the tensor (an error relative to the
 * tensor's scale: elementwise relative errors blow up where the reference is near 0), and
 * one timing line for the matmul ({"op":"matmul_timing",...,"tflops":...}).
 *
 * Tolerances (err), and why:
 *   TOL_BF16 1e-2   one GEMM with bf16 inputs and fp32 accumulation (matmul): each input
 *                   is rounded to 8 significant bits (relative 2^-9), so a product is off by
 *                   up to ~4e-3 of itself, and over K random-signed terms the error grows
 *                   like the sum does (sqrt K): ~4e-3 of the output's typical size, below
 *                   1e-2 of its largest.
 *   TOL_BF16x2 3e-2 attention: two or three bf16 GEMMs in a chain (scores, softmax,
 *                   P V; and dP, dS, dQ/dK/dV), each adding its rounding to the next.
 *   TOL_FP32 1e-5   fp32 elementwise ops and row reductions (layernorm, GELU, softmax
 *                   cross-entropy, embeddings, AdamW): the same formulas, differing in
 *                   the order of sums (a warp tree against SIMD lanes) and in FMA
 *                   contraction; a few ulp of the tensor's scale.
 *   TOL_SUM 1e-4    fp32 sums over many rows (layernorm dweight/dbias, dbias over B*T
 *                   rows): both sides add thousands of terms in different orders (and the
 *                   GPU's order varies: atomics), errors ~ eps * sqrt(rows) of the sum.
 *   TOL_DOUBLE 1e-10 sums in double (sqnorm, the loss total): only the order differs.
 *   0               exact: the row max of ce_rowmax, the upload/download round trip. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "model/config.h"
#include "model/dev.h"
#include "model/layout.h"
#include "model/ops.h"
#include "model/optim.h"
#include "test.h"

#define TOL_BF16 1e-2
#define TOL_BF16x2 3e-2
#define TOL_FP32 1e-5
#define TOL_SUM 1e-4
#define TOL_DOUBLE 1e-10

static model_dev *CPU, *GPU;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd_u64(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}
static float rnd_f(float scale) { return scale * (2.0f * (float)((rnd_u64() >> 40) / 16777216.0) - 1.0f); }

/* A buffer on both devices with the same contents. */
typedef struct pair {
  void *c, *g;
  size_t bytes;
} pair;

static pair mk(size_t bytes, const void *init) {
  pair p = {.bytes = bytes};
  T_OK(model_dev_alloc(CPU, bytes, &p.c));
  T_OK(model_dev_alloc(GPU, bytes, &p.g));
  if (init && bytes && p.c && p.g) {
    memcpy(p.c, init, bytes);
    T_OK(model_dev_upload(GPU, p.g, init, bytes));
  }
  return p;
}
/* n random floats in [-scale, scale] */
static pair mkf(size_t n, float scale) {
  float *h = malloc((n ? n : 1) * sizeof *h);
  for (size_t i = 0; i < n; i++) h[i] = rnd_f(scale);
  pair p = mk(n * sizeof(float), h);
  free(h);
  return p;
}
/* n random ids in [0, hi) */
static pair mki(size_t n, int hi) {
  int32_t *h = malloc((n ? n : 1) * sizeof *h);
  for (size_t i = 0; i < n; i++) h[i] = (int32_t)(rnd_u64() % (uint64_t)hi);
  pair p = mk(n * sizeof(int32_t), h);
  free(h);
  return p;
}
static void drop(pair *p) {
  model_dev_free(CPU, p->c);
  model_dev_free(GPU, p->g);
  memset(p, 0, sizeof *p);
}
#define F(p) ((float *)(p).c)
#define G(p) ((float *)(p).g)
#define I(p) ((const int32_t *)(p).c)
#define GI(p) ((const int32_t *)(p).g)

/* err = max |got - ref| / max |ref|; prints the JSON line; fails the test above tol */
static int cmp_host(const char *op, const char *shape, const char *tensor, const float *ref, const float *got,
                    size_t n, double tol) {
  double max_abs = 0, max_ref = 0;
  size_t worst = 0;
  int nonfinite = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(got[i]) && isfinite(ref[i])) nonfinite++;
    double e = fabs((double)got[i] - ref[i]);
    if (e > max_abs || (e != e)) {
      max_abs = e;
      worst = i;
    }
    if (fabs(ref[i]) > max_ref) max_ref = fabs(ref[i]);
  }
  double err = max_abs / (max_ref > 1e-30 ? max_ref : 1e-30);
  int pass = !nonfinite && err <= tol;
  printf("{\"op\":\"%s\",\"shape\":\"%s\",\"tensor\":\"%s\",\"n\":%zu,\"max_abs_err\":%.3g,\"max_ref\":%.3g,"
         "\"err\":%.3g,\"tol\":%g,\"pass\":%s}\n",
         op, shape, tensor, n, max_abs, max_ref, err, tol, pass ? "true" : "false");
  fflush(stdout);
  T_CHECK_MSG(pass, "%s %s %s: err %.3g > tol %g (worst at %zu: cpu %.9g, gpu %.9g)%s", op, shape, tensor, err, tol,
              worst, n ? ref[worst] : 0.0, n ? got[worst] : 0.0, nonfinite ? ", non-finite values" : "");
  return pass;
}

static int cmp(const char *op, const char *shape, const char *tensor, const pair *p, size_t n, double tol) {
  float *got = malloc((n ? n : 1) * sizeof *got);
  T_OK(model_dev_download(GPU, got, p->g, n * sizeof(float)));
  int ok = cmp_host(op, shape, tensor, (const float *)p->c, got, n, tol);
  free(got);
  return ok;
}

static int cmp_double(const char *op, const char *shape, const char *tensor, const pair *p, double tol) {
  double got = 0, ref = *(const double *)p->c;
  T_OK(model_dev_download(GPU, &got, p->g, sizeof got));
  double err = fabs(got - ref) / (fabs(ref) > 1e-300 ? fabs(ref) : 1e-300);
  int pass = err <= tol;
  printf("{\"op\":\"%s\",\"shape\":\"%s\",\"tensor\":\"%s\",\"n\":1,\"max_abs_err\":%.3g,\"max_ref\":%.17g,"
         "\"err\":%.3g,\"tol\":%g,\"pass\":%s}\n",
         op, shape, tensor, fabs(got - ref), ref, err, tol, pass ? "true" : "false");
  T_CHECK_MSG(pass, "%s %s %s: cpu %.17g, gpu %.17g", op, shape, tensor, ref, got);
  return pass;
}

/* the CPU device's scratch for (T, C, NH): every thread's share */
static float *cpu_scratch(int T, int C, int NH) {
  size_t n = model_dev_scratch_floats(CPU, T, C, NH) * (size_t)model_threads_get();
  return calloc(n ? n : 1, sizeof(float));
}

/* ---- the device itself ------------------------------------------------------------------- */

static void test_device(void) {
  T_CHECK(model_dev_kind_of(GPU) == MODEL_DEV_CUDA);
  T_CHECK(!model_dev_host_visible(GPU));
  T_CHECK(model_dev_stream(GPU) != NULL);
  T_CHECK(strncmp(model_dev_name(GPU), "cuda:", 5) == 0);
  T_CHECK(model_dev_scratch_floats(GPU, 1024, 768, 12) == 0);
  printf("{\"device\":\"%s\",\"peak_bf16_tflops\":%.0f}\n", model_dev_name(GPU), model_dev_peak_flops(GPU) / 1e12);

  /* a round trip larger than the staging slots, the source overwritten at once after the
     upload (dev.h: it may be reused on return), and zeroed memory */
  size_t n = (20u << 20) + 3;
  unsigned char *src = malloc(n), *orig = malloc(n), *back = malloc(n);
  for (size_t i = 0; i < n; i++) orig[i] = src[i] = (unsigned char)(rnd_u64() >> 56);
  void *a = NULL, *b = NULL;
  T_OK(model_dev_alloc(GPU, n, &a));
  T_OK(model_dev_alloc(GPU, n, &b));
  T_OK(model_dev_download(GPU, back, b, n));
  size_t nonzero = 0;
  for (size_t i = 0; i < n; i++) nonzero += back[i] != 0;
  T_CHECK_MSG(nonzero == 0, "model_dev_alloc: %zu bytes not zero", nonzero);
  T_OK(model_dev_upload(GPU, a, src, n));
  memset(src, 0xa5, n);
  model_dev_copy(GPU, b, a, n);
  model_dev_zero(GPU, a, 1000);
  T_OK(model_dev_download(GPU, back, b, n));
  T_CHECK_MSG(memcmp(back, orig, n) == 0, "upload, copy, download: the bytes differ");
  T_OK(model_dev_download(GPU, back, a, 1000));
  nonzero = 0;
  for (size_t i = 0; i < 1000; i++) nonzero += back[i] != 0;
  T_CHECK_MSG(nonzero == 0, "model_dev_zero: %zu bytes not zero", nonzero);
  model_dev_free(GPU, a);
  model_dev_free(GPU, b);
  free(src);
  free(orig);
  free(back);

  /* host memory: pinned, zeroed */
  unsigned char *h = NULL;
  T_OK(model_dev_host_alloc(GPU, 4096, (void **)&h));
  if (h) T_CHECK(h[0] == 0 && h[4095] == 0);
  model_dev_host_free(GPU, h);

  /* an allocation that cannot succeed is an error naming the size, not a sticky one */
  void *huge = NULL;
  newt_result_t r = model_dev_alloc(GPU, (size_t)1 << 50, &huge);
  T_CHECK(r != NEWT_OK && huge == NULL);
  T_CHECK_MSG(strstr(newt_errmsg(), "cudaMalloc") != NULL, "message: %s", newt_errmsg());
  T_OK(model_dev_error(GPU));
  T_OK(model_dev_sync(GPU));
}

/* A launch the kernels refuse is the device's sticky error, named with the device and the
 * op; later kernels are skipped (on a second device of the same GPU). */
static void test_sticky_error(void) {
  model_dev *d = NULL;
  T_OK(model_dev_open(MODEL_DEV_CUDA, 0, &d));
  if (!d) return;
  float *x = NULL;
  T_OK(model_dev_alloc(d, 3 * 72 * sizeof(float), (void **)&x));
  model_k_attention_forward(d, x, x, x, 1, 1, 72, 5, NULL); /* 72 heads of 5: not a multiple */
  newt_result_t r = model_dev_sync(d);
  T_CHECK(r == NEWT_ERR_INVALID);
  T_CHECK_MSG(strstr(newt_errmsg(), "attention_forward") && strstr(newt_errmsg(), "cuda:0"), "message: %s",
              newt_errmsg());
  T_CHECK(model_dev_error(d) == NEWT_ERR_INVALID);
  float y = 0;
  T_CHECK(model_dev_download(d, &y, x, sizeof y) == NEWT_ERR_INVALID);
  model_dev_free(d, x);
  model_dev_close(d);
}

/* ---- embeddings ------------------------------------------------------------------------------ */

static void test_encoder(void) {
  static const int S[][4] = {{2, 37, 72, 100}, {4, 1024, 768, 50257}}; /* B T C V */
  for (size_t s = 0; s < sizeof S / sizeof S[0]; s++) {
    int B = S[s][0], T = S[s][1], C = S[s][2], V = S[s][3];
    char sh[96];
    snprintf(sh, sizeof sh, "B%d T%d C%d V%d", B, T, C, V);
    size_t n = (size_t)B * T * C;
    pair inp = mki((size_t)B * T, V), wte = mkf((size_t)V * C, 1), wpe = mkf((size_t)T * C, 1);
    pair out = mk(n * sizeof(float), NULL), dout = mkf(n, 1);
    pair dwte = mkf((size_t)V * C, 1), dwpe = mkf((size_t)T * C, 1);
    model_k_encoder_forward(CPU, F(out), I(inp), F(wte), F(wpe), B, T, C);
    model_k_encoder_forward(GPU, G(out), GI(inp), G(wte), G(wpe), B, T, C);
    cmp("encoder_forward", sh, "out", &out, n, TOL_FP32);
    model_k_encoder_backward(CPU, F(dwte), F(dwpe), F(dout), I(inp), B, T, C);
    model_k_encoder_backward(GPU, G(dwte), G(dwpe), G(dout), GI(inp), B, T, C);
    cmp("encoder_backward", sh, "dwte", &dwte, (size_t)V * C, TOL_FP32);
    cmp("encoder_backward", sh, "dwpe", &dwpe, (size_t)T * C, TOL_FP32);
    drop(&inp), drop(&wte), drop(&wpe), drop(&out), drop(&dout), drop(&dwte), drop(&dwpe);
  }
}

static void test_embed_rows(void) {
  /* B T C V lo Vl: the upper half of a small vocabulary; half of gpt2's (tp 2, rank 1) */
  static const int S[][6] = {{2, 37, 72, 100, 50, 50}, {4, 1024, 768, 50257, 25129, 25128}};
  for (size_t s = 0; s < sizeof S / sizeof S[0]; s++) {
    int B = S[s][0], T = S[s][1], C = S[s][2], V = S[s][3], lo = S[s][4], Vl = S[s][5], BT = B * T;
    char sh[96];
    snprintf(sh, sizeof sh, "B%d T%d C%d V%d lo%d Vl%d", B, T, C, V, lo, Vl);
    size_t n = (size_t)BT * C;
    pair inp = mki((size_t)BT, V), wte = mkf((size_t)Vl * C, 1), wpe = mkf((size_t)T * C, 1);
    pair out = mkf(n, 1), dout = mkf(n, 1), dwte = mkf((size_t)Vl * C, 1), dwpe = mkf((size_t)T * C, 1);
    model_k_embed_rows_forward(CPU, F(out), I(inp), F(wte), BT, C, lo, Vl);
    model_k_embed_rows_forward(GPU, G(out), GI(inp), G(wte), BT, C, lo, Vl);
    cmp("embed_rows_forward", sh, "out", &out, n, 0);
    model_k_add_positions(CPU, F(out), F(wpe), B, T, C);
    model_k_add_positions(GPU, G(out), G(wpe), B, T, C);
    cmp("add_positions", sh, "x", &out, n, TOL_FP32);
    model_k_embed_rows_backward(CPU, F(dwte), F(dwpe), F(dout), I(inp), B, T, C, lo, Vl);
    model_k_embed_rows_backward(GPU, G(dwte), G(dwpe), G(dout), GI(inp), B, T, C, lo, Vl);
    cmp("embed_rows_backward", sh, "dwte", &dwte, (size_t)Vl * C, TOL_FP32);
    cmp("embed_rows_backward", sh, "dwpe", &dwpe, (size_t)T * C, TOL_FP32);
    drop(&inp), drop(&wte), drop(&wpe), drop(&out), drop(&dout), drop(&dwte), drop(&dwpe);
  }
}

/* ---- layernorm -------------------------------------------------------------------------------- */

static void test_layernorm(void) {
  /* B T C; C 7000 takes the kernel's path without shared memory (2C floats > 48 KiB) */
  static const int S[][3] = {{3, 37, 72}, {4, 1024, 768}, {1, 5, 7000}};
  for (size_t s = 0; s < sizeof S / sizeof S[0]; s++) {
    int B = S[s][0], T = S[s][1], C = S[s][2];
    char sh[64];
    snprintf(sh, sizeof sh, "B%d T%d C%d", B, T, C);
    size_t n = (size_t)B * T * C, rows = (size_t)B * T;
    pair inp = mkf(n, 2), w = mkf((size_t)C, 1), b = mkf((size_t)C, 1), out = mk(n * sizeof(float), NULL);
    pair mean = mk(rows * sizeof(float), NULL), rstd = mk(rows * sizeof(float), NULL);
    pair dout = mkf(n, 1), dinp = mkf(n, 1), dw = mkf((size_t)C, 1), db = mkf((size_t)C, 1);
    model_k_layernorm_forward(CPU, F(out), F(mean), F(rstd), F(inp), F(w), F(b), B, T, C);
    model_k_layernorm_forward(GPU, G(out), G(mean), G(rstd), G(inp), G(w), G(b), B, T, C);
    cmp("layernorm_forward", sh, "out", &out, n, TOL_FP32);
    cmp("layernorm_forward", sh, "mean", &mean, rows, TOL_FP32);
    cmp("layernorm_forward", sh, "rstd", &rstd, rows, TOL_FP32);
    /* the backward from the CPU's mean and rstd on both: it alone is compared */
    T_OK(model_dev_upload(GPU, mean.g, mean.c, mean.bytes));
    T_OK(model_dev_upload(GPU, rstd.g, rstd.c, rstd.bytes));
    float *scratch = cpu_scratch(T, C, 1);
    model_k_layernorm_backward(CPU, F(dinp), F(dw), F(db), F(dout), F(inp), F(w), F(mean), F(rstd), B, T, C, scratch);
    model_k_layernorm_backward(GPU, G(dinp), G(dw), G(db), G(dout), G(inp), G(w), G(mean), G(rstd), B, T, C, NULL);
    free(scratch);
    cmp("layernorm_backward", sh, "dinp", &dinp, n, TOL_FP32);
    cmp("layernorm_backward", sh, "dweight", &dw, (size_t)C, TOL_SUM);
    cmp("layernorm_backward", sh, "dbias", &db, (size_t)C, TOL_SUM);
    drop(&inp), drop(&w), drop(&b), drop(&out), drop(&mean), drop(&rstd);
    drop(&dout), drop(&dinp), drop(&dw), drop(&db);
  }
}

/* ---- linear layers ---------------------------------------------------------------------------- */

static void test_matmul(void) {
  /* B T C OC res bias (res: 0 none, 1 its own buffer, 2 out itself) dinp:
     odd sizes; a residual; in place; gpt2's fc (768 -> 3072); its tp-2 slice (1536);
     a tp-2 row-parallel projection (384 -> 768, no bias: added after the all-reduce);
     the backward without dinp (the first layer's) */
  static const int S[][7] = {{2, 37, 72, 200, 0, 1, 1},    {1, 50, 96, 288, 1, 1, 1},
                             {2, 16, 64, 64, 2, 1, 1},     {8, 1024, 768, 3072, 0, 1, 1},
                             {8, 1024, 768, 1536, 0, 1, 1}, {8, 1024, 384, 768, 1, 0, 1},
                             {3, 33, 40, 24, 0, 0, 0}};
  for (size_t s = 0; s < sizeof S / sizeof S[0]; s++) {
    int B = S[s][0], T = S[s][1], C = S[s][2], OC = S[s][3], res = S[s][4], bias = S[s][5], want_dinp = S[s][6];
    char sh[96];
    snprintf(sh, sizeof sh, "B%d T%d C%d OC%d%s%s", B, T, C, OC, res == 1 ? " res" : res == 2 ? " res=out" : "",
             bias ? " bias" : "");
    size_t M = (size_t)B * T;
    pair inp = mkf(M * C, 1), w = mkf((size_t)OC * C, 0.5f), bs = mkf((size_t)OC, 1);
    pair out = mkf(M * OC, 1), r = mkf(res == 1 ? M * OC : 0, 1);
    const float *rc = res == 1 ? F(r) : res == 2 ? F(out) : NULL, *rg = res == 1 ? G(r) : res == 2 ? G(out) : NULL;
    model_k_matmul_forward(CPU, F(out), rc, F(inp), F(w), bias ? F(bs) : NULL, B, T, C, OC);
    model_k_matmul_forward(GPU, G(out), rg, G(inp), G(w), bias ? G(bs) : NULL, B, T, C, OC);
    cmp("matmul_forward", sh, "out", &out, M * OC, TOL_BF16);

    pair dout = mkf(M * OC, 1), dinp = mk(M * C * sizeof(float), NULL), dw = mkf((size_t)OC * C, 1);
    pair db = mkf((size_t)OC, 1);
    model_k_matmul_backward(CPU, want_dinp ? F(dinp) : NULL, F(dw), bias ? F(db) : NULL, F(dout), F(inp), F(w), B, T,
                            C, OC);
    model_k_matmul_backward(GPU, want_dinp ? G(dinp) : NULL, G(dw), bias ? G(db) : NULL, G(dout), G(inp), G(w), B,
                            T, C, OC);
    if (want_dinp) cmp("matmul_backward", sh, "dinp", &dinp, M * C, TOL_BF16);
    cmp("matmul_backward", sh, "dweight", &dw, (size_t)OC * C, TOL_BF16);
    cmp("matmul_backward", sh, "dbias", &db, (size_t)OC, TOL_SUM);
    drop(&inp), drop(&w), drop(&bs), drop(&out), drop(&r), drop(&dout), drop(&dinp), drop(&dw), drop(&db);
  }
}

/* The GPU's matmul at gpt2-124m's fc size, timed: forward and backward, TFLOP/s. */
static void test_matmul_timing(void) {
  const int B = 8, T = 1024, C = 768, OC = 3072, iters = 20;
  size_t M = (size_t)B * T;
  float *inp = NULL, *w = NULL, *bs = NULL, *out = NULL, *dinp = NULL, *dw = NULL, *db = NULL;
  T_OK(model_dev_alloc(GPU, M * C * sizeof(float), (void **)&inp));
  T_OK(model_dev_alloc(GPU, (size_t)OC * C * sizeof(float), (void **)&w));
  T_OK(model_dev_alloc(GPU, (size_t)OC * sizeof(float), (void **)&bs));
  T_OK(model_dev_alloc(GPU, M * OC * sizeof(float), (void **)&out));
  T_OK(model_dev_alloc(GPU, M * C * sizeof(float), (void **)&dinp));
  T_OK(model_dev_alloc(GPU, (size_t)OC * C * sizeof(float), (void **)&dw));
  T_OK(model_dev_alloc(GPU, (size_t)OC * sizeof(float), (void **)&db));
  for (int i = 0; i < 3; i++) model_k_matmul_forward(GPU, out, NULL, inp, w, bs, B, T, C, OC);
  T_OK(model_dev_sync(GPU));
  double t0 = newt_now_s();
  for (int i = 0; i < iters; i++) model_k_matmul_forward(GPU, out, NULL, inp, w, bs, B, T, C, OC);
  T_OK(model_dev_sync(GPU));
  double fwd = (newt_now_s() - t0) / iters;
  for (int i = 0; i < 3; i++) model_k_matmul_backward(GPU, dinp, dw, db, out, inp, w, B, T, C, OC);
  T_OK(model_dev_sync(GPU));
  t0 = newt_now_s();
  for (int i = 0; i < iters; i++) model_k_matmul_backward(GPU, dinp, dw, db, out, inp, w, B, T, C, OC);
  T_OK(model_dev_sync(GPU));
  double bwd = (newt_now_s() - t0) / iters;
  double flop = 2.0 * M * C * OC, peak = model_dev_peak_flops(GPU);
  printf("{\"op\":\"matmul_timing\",\"shape\":\"B%d T%d C%d OC%d\",\"forward_ms\":%.3f,\"forward_tflops\":%.1f,"
         "\"backward_ms\":%.3f,\"backward_tflops\":%.1f,\"peak_tflops\":%.0f}\n",
         B, T, C, OC, fwd * 1e3, flop / fwd / 1e12, bwd * 1e3, 2 * flop / bwd / 1e12, peak / 1e12);
  model_dev_free(GPU, inp), model_dev_free(GPU, w), model_dev_free(GPU, bs), model_dev_free(GPU, out);
  model_dev_free(GPU, dinp), model_dev_free(GPU, dw), model_dev_free(GPU, db);
}

static void test_add_res_bias(void) {
  static const size_t S[][2] = {{37, 72}, {8192, 768}};
  for (size_t s = 0; s < sizeof S / sizeof S[0]; s++) {
    size_t BT = S[s][0], C = S[s][1];
    char sh[64];
    snprintf(sh, sizeof sh, "BT%zu C%zu", BT, C);
    pair out = mkf(BT * C, 1), res = mkf(BT * C, 1), b = mkf(C, 1);
    model_k_add_res_bias(CPU, F(out), F(res), F(b), BT, C);
    model_k_add_res_bias(GPU, G(out), G(res), G(b), BT, C);
    cmp("add_res_bias", sh, "out", &out, BT * C, TOL_FP32);
    drop(&out), drop(&res), drop(&b);
  }
}

/* ---- attention ---------------------------------------------------------------------------------- */

static void test_attention(void) {
  /* B T C NH: odd sizes (hs 24); a tp-2 slice (half the heads, half the channels);
     gpt2-124m; its tp-2 slice */
  static const int S[][4] = {{2, 37, 72, 3}, {1, 64, 96, 2}, {2, 1024, 768, 12}, {2, 1024, 384, 6}};
  for (size_t s = 0; s < sizeof S / sizeof S[0]; s++) {
    int B = S[s][0], T = S[s][1], C = S[s][2], NH = S[s][3];
    char sh[64];
    snprintf(sh, sizeof sh, "B%d T%d C%d NH%d", B, T, C, NH);
    size_t n = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
    pair qkv = mkf(3 * n, 1), out = mk(n * sizeof(float), NULL), att = mk(natt * sizeof(float), NULL);
    float *scratch = cpu_scratch(T, C, NH);
    model_k_attention_forward(CPU, F(out), F(att), F(qkv), B, T, C, NH, scratch);
    model_k_attention_forward(GPU, G(out), G(att), G(qkv), B, T, C, NH, NULL);
    cmp("attention_forward", sh, "out", &out, n, TOL_BF16x2);
    /* att: the lower triangle (the CPU leaves the upper one as it was); the GPU's upper
       one must be zeros */
    float *got = malloc(natt * sizeof *got), *ref = malloc(natt * sizeof *ref);
    T_OK(model_dev_download(GPU, got, att.g, att.bytes));
    memcpy(ref, att.c, att.bytes);
    size_t upper_nonzero = 0;
    for (size_t r = 0; r < (size_t)B * NH * T; r++)
      for (int j = (int)(r % T) + 1; j < T; j++) {
        upper_nonzero += got[r * T + j] != 0.0f;
        got[r * T + j] = ref[r * T + j] = 0.0f;
      }
    cmp_host("attention_forward", sh, "att", ref, got, natt, TOL_BF16x2);
    T_CHECK_MSG(upper_nonzero == 0, "%s: %zu probabilities above the diagonal are not 0", sh, upper_nonzero);
    /* the backward from the CPU's probabilities on both, the GPU's upper triangle garbage
       (it must read the lower one only) */
    for (size_t r = 0; r < (size_t)B * NH * T; r++)
      for (int j = (int)(r % T) + 1; j < T; j++) ref[r * T + j] = 1e30f;
    T_OK(model_dev_upload(GPU, att.g, ref, att.bytes));
    free(got);
    free(ref);
    pair dout = mkf(n, 1), dqkv = mkf(3 * n, 1);
    model_k_attention_backward(CPU, F(dqkv), F(dout), F(att), F(qkv), B, T, C, NH, scratch);
    model_k_attention_backward(GPU, G(dqkv), G(dout), G(att), G(qkv), B, T, C, NH, NULL);
    cmp("attention_backward", sh, "dqkv", &dqkv, 3 * n, TOL_BF16x2);
    free(scratch);
    drop(&qkv), drop(&out), drop(&att), drop(&dout), drop(&dqkv);
  }
}

/* ---- GELU ---------------------------------------------------------------------------------------- */

static void test_gelu(void) {
  static const size_t S[] = {37, 1000003};
  for (size_t s = 0; s < sizeof S / sizeof S[0]; s++) {
    size_t N = S[s];
    char sh[64];
    snprintf(sh, sizeof sh, "N%zu", N);
    pair inp = mkf(N, 4), out = mk(N * sizeof(float), NULL), dout = mkf(N, 1), dinp = mk(N * sizeof(float), NULL);
    model_k_gelu_forward(CPU, F(out), F(inp), N);
    model_k_gelu_forward(GPU, G(out), G(inp), N);
    cmp("gelu_forward", sh, "out", &out, N, TOL_FP32);
    model_k_gelu_backward(CPU, F(dinp), F(inp), F(dout), N);
    model_k_gelu_backward(GPU, G(dinp), G(inp), G(dout), N);
    cmp("gelu_backward", sh, "dinp", &dinp, N, TOL_FP32);
    model_k_gelu_backward(CPU, F(dout), F(inp), F(dout), N); /* in place */
    model_k_gelu_backward(GPU, G(dout), G(inp), G(dout), N);
    cmp("gelu_backward", sh, "dinp (in place)", &dout, N, TOL_FP32);
    drop(&inp), drop(&out), drop(&dout), drop(&dinp);
  }
}

/* ---- cross-entropy ------------------------------------------------------------------------------- */

static void test_crossentropy(void) {
  /* B T V mode: 0 dlogits apart, 1 in place, 2 without dlogits */
  static const int S[][4] = {{2, 37, 100, 0}, {1, 9, 100, 2}, {4, 256, 50257, 1}};
  for (size_t s = 0; s < sizeof S / sizeof S[0]; s++) {
    int B = S[s][0], T = S[s][1], V = S[s][2], mode = S[s][3];
    char sh[64];
    snprintf(sh, sizeof sh, "B%d T%d V%d%s", B, T, V, mode == 1 ? " in place" : mode == 2 ? " no dlogits" : "");
    size_t rows = (size_t)B * T, n = rows * V;
    float dscale = 1.0f / (float)rows;
    pair logits = mkf(n, 4), targets = mki(rows, V), losses = mk(rows * sizeof(float), NULL);
    pair dl = mk(mode == 0 ? n * sizeof(float) : 0, NULL);
    double acc0 = 1.25;
    pair acc = mk(sizeof(double), &acc0);
    float *dc = mode == 0 ? F(dl) : mode == 1 ? F(logits) : NULL, *dg = mode == 0 ? G(dl) : mode == 1 ? G(logits) : NULL;
    model_k_crossentropy(CPU, F(losses), dc, F(logits), I(targets), B, T, V, dscale, (double *)acc.c);
    model_k_crossentropy(GPU, G(losses), dg, G(logits), GI(targets), B, T, V, dscale, (double *)acc.g);
    cmp("crossentropy", sh, "losses", &losses, rows, TOL_FP32);
    if (mode == 0) cmp("crossentropy", sh, "dlogits", &dl, n, TOL_FP32);
    if (mode == 1) cmp("crossentropy", sh, "dlogits", &logits, n, TOL_FP32);
    cmp_double("crossentropy", sh, "loss_acc", &acc, TOL_FP32); /* float losses summed: theirs differ */
    drop(&logits), drop(&targets), drop(&losses), drop(&dl), drop(&acc);
  }
}

static void test_vocab_parallel_ce(void) {
  /* BT V lo Vl with_grad: a rank with the upper half; one with the lower half (forward
     only); gpt2's vocabulary at tp 2, rank 1 */
  static const int S[][5] = {{74, 100, 50, 50, 1}, {74, 100, 0, 50, 0}, {1024, 50257, 25128, 25129, 1}};
  for (size_t s = 0; s < sizeof S / sizeof S[0]; s++) {
    int BT = S[s][0], V = S[s][1], lo = S[s][2], Vl = S[s][3];
    float dscale = S[s][4] ? 1.0f / (float)BT : 0.0f;
    char sh[96];
    snprintf(sh, sizeof sh, "BT%d V%d lo%d Vl%d%s", BT, V, lo, Vl, dscale != 0.0f ? " grad" : "");
    size_t n = (size_t)BT * Vl;
    pair logits = mkf(n, 4), targets = mki((size_t)BT, V), mx = mk((size_t)BT * sizeof(float), NULL);
    pair st = mk(2 * (size_t)BT * sizeof(float), NULL), losses = mk((size_t)BT * sizeof(float), NULL);
    double acc0 = -3.5;
    pair acc = mk(sizeof(double), &acc0);
    model_k_ce_rowmax(CPU, F(mx), F(logits), BT, Vl);
    model_k_ce_rowmax(GPU, G(mx), G(logits), BT, Vl);
    cmp("ce_rowmax", sh, "mx", &mx, (size_t)BT, 0);
    model_k_ce_partials(CPU, F(st), F(logits), F(mx), I(targets), BT, Vl, lo);
    model_k_ce_partials(GPU, G(st), G(logits), G(mx), GI(targets), BT, Vl, lo);
    cmp("ce_partials", sh, "st", &st, 2 * (size_t)BT, TOL_FP32);
    T_OK(model_dev_upload(GPU, st.g, st.c, st.bytes)); /* the finish alone compared */
    model_k_ce_finish(CPU, F(losses), F(logits), F(mx), F(st), I(targets), BT, Vl, lo, dscale, (double *)acc.c);
    model_k_ce_finish(GPU, G(losses), G(logits), G(mx), G(st), GI(targets), BT, Vl, lo, dscale, (double *)acc.g);
    cmp("ce_finish", sh, "losses", &losses, (size_t)BT, TOL_FP32);
    cmp("ce_finish", sh, "dlogits", &logits, n, TOL_FP32);
    cmp_double("ce_finish", sh, "loss_acc", &acc, TOL_FP32);
    drop(&logits), drop(&targets), drop(&mx), drop(&st), drop(&losses), drop(&acc);
  }
}

/* ---- the optimizer ------------------------------------------------------------------------------- */

static void test_sqnorm(void) {
  static const size_t S[] = {37, 10000019};
  for (size_t s = 0; s < sizeof S / sizeof S[0]; s++) {
    size_t n = S[s];
    char sh[64];
    snprintf(sh, sizeof sh, "n%zu", n);
    double acc0 = 1.5;
    pair x = mkf(n, 3), acc = mk(sizeof(double), &acc0);
    model_k_sqnorm(CPU, (double *)acc.c, F(x), n);
    model_k_sqnorm(GPU, (double *)acc.g, G(x), n);
    model_k_sqnorm(CPU, (double *)acc.c, F(x), n / 2); /* accumulates */
    model_k_sqnorm(GPU, (double *)acc.g, G(x), n / 2);
    cmp_double("sqnorm", sh, "acc", &acc, TOL_DOUBLE);
    drop(&x), drop(&acc);
  }
}

static void test_adamw(void) {
  model_config cfg;
  model_layout lay;
  T_OK(model_config_preset("tiny", &cfg));
  T_OK(model_layout_init(&lay, &cfg));
  model_adamw_config hp = model_adamw_defaults(100);
  /* the whole buffer; a ZeRO shard cutting tensors in the middle */
  size_t ranges[][2] = {{0, lay.total}, {1000, lay.total / 2 - 993}};
  for (size_t s = 0; s < 2; s++) {
    size_t off = ranges[s][0], len = ranges[s][1];
    char sh[96];
    snprintf(sh, sizeof sh, "tiny off%zu len%zu", off, len);
    pair params = mkf(lay.total, 1), grads = mkf(lay.total, 1);
    model_adamw oc, og;
    T_OK(model_adamw_init(&oc, &hp, off, len));
    og = oc;
    pair m = mk(len * sizeof(float), NULL), v = mk(len * sizeof(float), NULL);
    og.m = G(m);
    og.v = G(v);
    for (int step = 0; step < 3; step++) {
      double lr = model_lr_at(&hp, step);
      model_k_adamw(CPU, &oc, &lay, F(params), F(grads), lr, 0.7f);
      model_k_adamw(GPU, &og, &lay, G(params), G(grads), lr, 0.7f);
    }
    T_CHECK(oc.t == 3 && og.t == 3);
    memcpy(m.c, oc.m, len * sizeof(float));
    memcpy(v.c, oc.v, len * sizeof(float));
    cmp("adamw", sh, "params", &params, lay.total, TOL_FP32);
    cmp("adamw", sh, "m", &m, len, TOL_FP32);
    cmp("adamw", sh, "v", &v, len, TOL_FP32);
    model_adamw_free(&oc);
    drop(&params), drop(&grads), drop(&m), drop(&v);
  }
  model_layout_free(&lay);
}

int main(void) {
  model_threads_set(0);
  int gpus = model_dev_cuda_count();
  if (gpus < 1) {
    fprintf(stderr, "test_kernels: no GPU this process can use (model_dev_cuda_count() = 0): this test needs one "
                    "(tests/gpu/run.sh)\n");
    return 1;
  }
  CPU = model_dev_cpu();
  if (model_dev_open(MODEL_DEV_CUDA, 0, &GPU) != NEWT_OK) {
    fprintf(stderr, "test_kernels: %s\n", newt_errmsg());
    return 1;
  }
  T_RUN(test_device);
  T_RUN(test_encoder);
  T_RUN(test_embed_rows);
  T_RUN(test_layernorm);
  T_RUN(test_matmul);
  T_RUN(test_matmul_timing);
  T_RUN(test_add_res_bias);
  T_RUN(test_attention);
  T_RUN(test_gelu);
  T_RUN(test_crossentropy);
  T_RUN(test_vocab_parallel_ce);
  T_RUN(test_sqnorm);
  T_RUN(test_adamw);
  T_RUN(test_sticky_error);
  T_OK(model_dev_sync(GPU));
  model_dev_close(GPU);
  return T_DONE();
}
