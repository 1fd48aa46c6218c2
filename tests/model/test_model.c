/* Unit tests of the CPU model: the tensor table, presets and overrides, seeded
 * initialisation, gradients against finite differences, gradient accumulation against
 * one big batch, AdamW over shards against one update, and the learning-rate schedule. */
#include <stdlib.h>
#include <string.h>

#include "model/gpt.h"
#include "model_test.h"
#include "model/ops.h"
#include "model/optim.h"
#include "model/rng.h"
#include "test.h"

static void test_presets_and_overrides(void) {
  model_config c;
  T_OK(model_config_preset("tiny", &c));
  T_CHECK(c.vocab == 256 && c.ctx == 64 && c.layers == 4 && c.heads == 4 && c.channels == 128);
  T_OK(model_config_preset("small", &c));
  T_CHECK(c.vocab == 256 && c.ctx == 256 && c.layers == 6 && c.heads == 6 && c.channels == 384);
  T_OK(model_config_preset("gpt2-124m", &c));
  T_CHECK(c.vocab == 50257 && c.ctx == 1024 && c.layers == 12 && c.heads == 12 && c.channels == 768);
  T_ERR(NEWT_ERR_INVALID, model_config_preset("huge", &c));
  T_CHECK(strstr(newt_errmsg(), "huge") != NULL);
  T_OK(model_config_preset("tiny", &c));
  T_OK(model_config_override(&c, "layers=2,channels=64,heads=2"));
  T_CHECK(c.layers == 2 && c.channels == 64 && c.heads == 2 && c.vocab == 256);
  T_OK(model_config_check(&c));
  T_ERR(NEWT_ERR_INVALID, model_config_override(&c, "layer=3"));
  T_CHECK(strstr(newt_errmsg(), "layer") != NULL);
  T_ERR(NEWT_ERR_INVALID, model_config_override(&c, "ctx=abc"));
  T_CHECK(strstr(newt_errmsg(), "model.ctx") != NULL);
  T_OK(model_config_override(&c, "heads=3"));
  T_ERR(NEWT_ERR_INVALID, model_config_check(&c));
  T_CHECK(strstr(newt_errmsg(), "model.heads") != NULL);
  /* by value, as a spec's numbers are set */
  T_OK(model_config_set_int(&c, "heads", 4));
  T_OK(model_config_set_int(&c, "vocab", 50257));
  T_CHECK(c.heads == 4 && c.vocab == 50257 && c.layers == 2);
  T_OK(model_config_check(&c));
  T_ERR(NEWT_ERR_INVALID, model_config_set_int(&c, "width", 8));
  T_CHECK(strstr(newt_errmsg(), "model field \"width\" is unknown") != NULL);
}

static void test_layout(void) {
  model_config c;
  model_layout lay;
  T_OK(model_config_preset("tiny", &c));
  T_OK(model_layout_init(&lay, &c));
  T_CHECK(lay.nparams == 834304); /* PyTorch's count for the same shapes */
  T_CHECK(lay.n == 2 + 4 * 12 + 2);
  size_t end = 0;
  for (size_t i = 0; i < lay.n; i++) {
    const model_tensor *t = &lay.tensors[i];
    T_CHECK_MSG(t->offset % MODEL_ALIGN == 0 && t->offset >= end, "%s at %zu", t->name, t->offset);
    T_CHECK(t->size == t->shape[0] * t->shape[1]);
    T_CHECK(t->decay == (t->ndim == 2));
    T_CHECK(model_layout_find(&lay, t->name) == t);
    T_CHECK(model_layout_get(&lay, t->slot, t->layer < 0 ? 0 : t->layer) == t);
    end = t->offset + t->size;
  }
  T_CHECK(end <= lay.total);
  const model_tensor *t = model_layout_find(&lay, "h.2.attn.qkv.w");
  T_CHECK(t && t->shape[0] == 384 && t->shape[1] == 128 && t->layer == 2 && t->split == MODEL_SPLIT_QKV_ROWS);
  t = model_layout_find(&lay, "h.3.mlp.proj.w");
  T_CHECK(t && t->shape[0] == 128 && t->shape[1] == 512 && t->split == MODEL_SPLIT_COLS);
  T_CHECK(model_layout_find(&lay, "h.4.ln1.w") == NULL);
  size_t b0, e0, b1, e1;
  model_layout_layer_range(&lay, 0, 2, &b0, &e0);
  model_layout_layer_range(&lay, 2, 4, &b1, &e1);
  T_CHECK(b0 == model_layout_find(&lay, "h.0.ln1.w")->offset && e0 == b1);
  T_CHECK(e1 == model_layout_find(&lay, "lnf.w")->offset);
  model_layout_free(&lay);
  T_OK(model_config_preset("gpt2-124m", &c));
  T_OK(model_layout_init(&lay, &c));
  T_CHECK(lay.nparams == 124439808); /* GPT-2 small */
  model_layout_free(&lay);
}

static void test_init_reproducible(void) {
  model_config c;
  T_OK(model_config_preset("tiny", &c));
  model_gpt a, b;
  T_OK(model_gpt_init(&a, &c));
  T_OK(model_gpt_init(&b, &c));
  model_threads_set(1);
  model_gpt_init_weights(&a, 42);
  model_threads_set(2);
  model_gpt_init_weights(&b, 42);
  T_CHECK(memcmp(a.params, b.params, a.layout.total * sizeof(float)) == 0);
  const model_tensor *t = model_layout_find(&a.layout, "h.0.mlp.fc.w");
  double s = 0, s2 = 0;
  for (size_t i = 0; i < t->size; i++) {
    s += a.params[t->offset + i];
    s2 += (double)a.params[t->offset + i] * a.params[t->offset + i];
  }
  double sd = sqrt(s2 / t->size - (s / t->size) * (s / t->size));
  T_CHECK_MSG(fabs(sd - 0.02) < 0.001 && fabs(s / t->size) < 0.001, "std %g mean %g", sd, s / t->size);
  T_CHECK(model_layout_find(&a.layout, "h.1.ln2.w") && a.params[model_layout_find(&a.layout, "h.1.ln2.w")->offset] == 1.0f);
  model_gpt_init_weights(&b, 43);
  T_CHECK(memcmp(a.params, b.params, a.layout.total * sizeof(float)) != 0);
  model_gpt_free(&a);
  model_gpt_free(&b);
}

/* A small model with random (not default) layernorm weights and biases. */
static model_config small_cfg(void) {
  model_config c;
  model_config_preset("tiny", &c);
  model_config_override(&c, "layers=2,channels=32,heads=2,ctx=16,vocab=48");
  return c;
}

static void randomize(model_gpt *g, uint64_t seed) {
  model_gpt_init_weights(g, seed);
  for (size_t k = 0; k < g->layout.n; k++) {
    const model_tensor *t = &g->layout.tensors[k];
    if (t->ndim == 2) continue;
    for (size_t i = 0; i < t->size; i++)
      g->params[t->offset + i] += (float)(0.1 * model_rng_normal(seed, 99 + k, i));
  }
}

static void make_batch(int32_t *x, int32_t *y, int n, int V, uint64_t seed) {
  for (int i = 0; i < n; i++) {
    x[i] = (int32_t)(model_rng_u64(seed, 1, i) % V);
    y[i] = (int32_t)(model_rng_u64(seed, 2, i) % V);
  }
}

static void test_finite_differences(void) {
  model_threads_set(1);
  model_config c = small_cfg();
  int B = 2, T = 16;
  model_gpt g;
  model_acts a;
  model_scratch s;
  whole_init(&g, &a, &s, &c, B, T);
  randomize(&g, 5);
  int32_t x[32], y[32];
  make_batch(x, y, B * T, (int)c.vocab, 3);
  model_gpt_zero_grads(&g);
  model_forward_backward(&g, &a, &s, x, y, 1.0f / (B * T));
  const char *names[] = {"wte", "wpe", "h.0.ln1.w", "h.0.ln1.b", "h.0.attn.qkv.w", "h.0.attn.qkv.b",
                         "h.1.attn.proj.w", "h.1.attn.proj.b", "h.0.ln2.w", "h.1.mlp.fc.w",
                         "h.1.mlp.fc.b", "h.0.mlp.proj.w", "h.1.mlp.proj.b", "lnf.w", "lnf.b"};
  int checked = 0;
  double worst = 0;
  for (size_t n = 0; n < sizeof names / sizeof names[0]; n++) {
    const model_tensor *t = model_layout_find(&g.layout, names[n]);
    /* the element with the largest gradient and one picked at random */
    size_t idx[2] = {0, model_rng_u64(11, n, 0) % t->size};
    for (size_t i = 0; i < t->size; i++)
      if (fabsf(g.grads[t->offset + i]) > fabsf(g.grads[t->offset + idx[0]])) idx[0] = i;
    for (int k = 0; k < 2; k++) {
      float *p = &g.params[t->offset + idx[k]], p0 = *p, h = 1e-2f;
      *p = p0 + h;
      double lp = model_forward_backward(&g, &a, &s, x, y, 0.0f) / (B * T);
      *p = p0 - h;
      double lm = model_forward_backward(&g, &a, &s, x, y, 0.0f) / (B * T);
      *p = p0;
      double fd = (lp - lm) / (2.0 * ((double)(p0 + h) - (double)p0));
      double an = g.grads[t->offset + idx[k]];
      worst = fmax(worst, fabs(fd - an) / (1e-5 + 1e-3 * fabs(fd)));
      T_CHECK_MSG(fabs(fd - an) <= 1e-5 + 1e-3 * fabs(fd), "%s[%zu]: analytic %.7g, finite difference %.7g",
                  names[n], idx[k], an, fd);
      checked++;
    }
  }
  T_CHECK(checked == 30);
  fprintf(stderr, "  30 finite differences, worst %.3fx tolerance\n", worst);
  whole_free(&g, &a, &s);
}

/* Max over the buffer of |a - b| / (1e-6 * max|b| + 1e-5 |b|): <= 1 passes. */
static double grad_diff(const model_gpt *g, const float *a, const float *b) {
  double w = 0;
  for (size_t k = 0; k < g->layout.n; k++) {
    const model_tensor *t = &g->layout.tensors[k];
    double mx = 0;
    for (size_t i = 0; i < t->size; i++) mx = fmax(mx, fabs(b[t->offset + i]));
    for (size_t i = 0; i < t->size; i++) {
      double e = fabs(a[t->offset + i] - b[t->offset + i]) / (1e-5 * mx + 1e-5 * fabs(b[t->offset + i]) + 1e-12);
      w = fmax(w, e);
    }
  }
  return w;
}

static void test_accumulation_equals_big_batch(void) {
  model_threads_set(2);
  model_config c = small_cfg();
  int T = 16, K = 4;
  model_gpt g;
  model_acts big, one;
  model_scratch sb, s1;
  T_OK(model_gpt_init(&g, &c));
  T_OK(model_acts_init(&big, &c, K, T, 0, (int)c.layers, 1));
  T_OK(model_acts_init(&one, &c, 1, T, 0, (int)c.layers, 1));
  T_OK(model_scratch_init(&sb, &c, K, T));
  T_OK(model_scratch_init(&s1, &c, 1, T));
  randomize(&g, 8);
  int32_t x[4 * 16], y[4 * 16];
  make_batch(x, y, K * T, (int)c.vocab, 4);
  float dscale = 1.0f / (K * T);
  model_gpt_zero_grads(&g);
  double lbig = model_forward_backward(&g, &big, &sb, x, y, dscale);
  float *ref = malloc(g.layout.total * sizeof(float));
  memcpy(ref, g.grads, g.layout.total * sizeof(float));
  model_gpt_zero_grads(&g);
  double lacc = 0;
  for (int m = 0; m < K; m++) lacc += model_forward_backward(&g, &one, &s1, x + m * T, y + m * T, dscale);
  T_NEAR(lacc / (K * T), lbig / (K * T), 1e-6);
  double w = grad_diff(&g, g.grads, ref);
  T_CHECK_MSG(w <= 1.0, "4 micro-batches of 1 vs one batch of 4: gradients differ (%.2fx tolerance)", w);
  /* and the gradients really are the mean: half the scale gives half the gradient */
  model_gpt_zero_grads(&g);
  model_forward_backward(&g, &big, &sb, x, y, dscale * 0.5f);
  for (size_t i = 0; i < g.layout.total; i++) g.grads[i] *= 2.0f;
  T_CHECK(grad_diff(&g, g.grads, ref) <= 1.0);
  free(ref);
  model_scratch_free(&sb);
  model_scratch_free(&s1);
  model_acts_free(&big);
  model_acts_free(&one);
  model_gpt_free(&g);
}

static void test_adamw_shards_and_decay(void) {
  model_threads_set(1);
  model_config c = small_cfg();
  model_gpt g;
  T_OK(model_gpt_init(&g, &c));
  randomize(&g, 9);
  size_t n = g.layout.total;
  float *p0 = malloc(n * sizeof(float)), *full = malloc(n * sizeof(float));
  memcpy(p0, g.params, n * sizeof(float));
  for (size_t i = 0; i < n; i++) g.grads[i] = (float)(1e-3 * model_rng_normal(1, 2, i));
  model_adamw_config hp = model_adamw_defaults(10);
  model_adamw one, sh[3];
  T_OK(model_adamw_init(&one, &hp, 0, n));
  size_t cut[4] = {0, 1000, n / 2 + 7, n}; /* shards that cut tensors in the middle */
  for (int k = 0; k < 3; k++) T_OK(model_adamw_init(&sh[k], &hp, cut[k], cut[k + 1] - cut[k]));
  for (int step = 0; step < 3; step++)
    model_adamw_update(&one, &g.layout, g.params, g.grads, model_lr_at(&hp, step), 0.5f);
  memcpy(full, g.params, n * sizeof(float));
  memcpy(g.params, p0, n * sizeof(float));
  for (int step = 0; step < 3; step++)
    for (int k = 0; k < 3; k++)
      model_adamw_update(&sh[k], &g.layout, g.params, g.grads, model_lr_at(&hp, step), 0.5f);
  T_CHECK(memcmp(full, g.params, n * sizeof(float)) == 0);
  /* zero gradients: only 2-D tensors shrink, by (1 - lr wd) */
  memcpy(g.params, p0, n * sizeof(float));
  memset(g.grads, 0, n * sizeof(float));
  model_adamw z;
  T_OK(model_adamw_init(&z, &hp, 0, n));
  model_adamw_update(&z, &g.layout, g.params, g.grads, 0.01, 1.0f);
  for (size_t k = 0; k < g.layout.n; k++) {
    const model_tensor *t = &g.layout.tensors[k];
    float want = t->ndim == 2 ? p0[t->offset] * (float)(1.0 - 0.01 * hp.weight_decay) : p0[t->offset];
    T_CHECK_MSG(g.params[t->offset] == want, "%s: %g, want %g", t->name, g.params[t->offset], want);
  }
  model_adamw_free(&z);
  model_adamw_free(&one);
  for (int k = 0; k < 3; k++) model_adamw_free(&sh[k]);
  free(p0);
  free(full);
  model_gpt_free(&g);
}

static void test_schedule_and_clip(void) {
  model_adamw_config c = model_adamw_defaults(100);
  c.lr = 1e-3;
  c.lr_min = 1e-4;
  c.warmup = 10;
  T_NEAR(model_lr_at(&c, 0), 1e-4, 1e-12);
  T_NEAR(model_lr_at(&c, 9), 1e-3, 1e-12);
  T_NEAR(model_lr_at(&c, 10), 1e-3, 1e-12);
  T_NEAR(model_lr_at(&c, 55), 0.5 * (1e-3 + 1e-4), 1e-12);
  T_NEAR(model_lr_at(&c, 100), 1e-4, 1e-12);
  T_NEAR(model_lr_at(&c, 1000), 1e-4, 1e-12);
  for (int s = 11; s < 100; s++) T_CHECK(model_lr_at(&c, s) < model_lr_at(&c, s - 1));
  T_NEAR(model_clip_scale(4.0, 1.0), 1.0 / (4.0 + 1e-6), 1e-7);
  T_CHECK(model_clip_scale(0.5, 1.0) == 1.0f);
  T_CHECK(model_clip_scale(50.0, 0.0) == 1.0f);
  float v[5] = {3, 4, 0, 0, 0};
  T_NEAR(model_sqnorm(v, 5), 25.0, 0);
  c.lr_min = 2e-3;
  T_ERR(NEWT_ERR_INVALID, model_adamw_config_check(&c));
  T_CHECK(strstr(newt_errmsg(), "optim.lr_min") != NULL);
}

static void test_acts_bytes(void) {
  model_config c;
  model_config_preset("tiny", &c);
  size_t all = model_acts_bytes(&c, 8, 64, 0, 4, 1);
  size_t half = model_acts_bytes(&c, 8, 64, 0, 2, 0) + model_acts_bytes(&c, 8, 64, 2, 4, 1);
  size_t per_layer = model_acts_bytes(&c, 8, 64, 0, 1, 0) - model_acts_bytes(&c, 8, 64, 0, 0, 0);
  /* a layer keeps 5 (B,T,C) tensors, 2 of (B,T,4C), one of (B,T,3C), att (B,NH,T,T), 4 (B,T) */
  size_t want = 4 * (5 * 8 * 64 * 128 + 2 * 8 * 64 * 512 + 8 * 64 * 384 + 8 * 4 * 64 * 64 + 4 * 8 * 64);
  T_CHECK_MSG(per_layer == want, "per layer %zu, want %zu", per_layer, want);
  T_CHECK(half > all && half - all == model_acts_bytes(&c, 8, 64, 0, 0, 0)); /* the second x0 + ids */
  model_acts a;
  T_ERR(NEWT_ERR_INVALID, model_acts_init(&a, &c, 8, 65, 0, 4, 1));
}

/* Raising the thread count after sizing the scratch must not overrun it (ASan build). */
static void test_threads_raised_after_scratch(void) {
  model_threads_set(1);
  model_config c = small_cfg();
  model_gpt g;
  model_acts a;
  model_scratch s;
  whole_init(&g, &a, &s, &c, 2, 16);
  randomize(&g, 1);
  int32_t x[32], y[32];
  make_batch(x, y, 32, (int)c.vocab, 1);
  model_threads_set(2);
  double l = model_forward_backward(&g, &a, &s, x, y, 1.0f / 32);
  T_CHECK(isfinite(l) && model_threads_get() == 1);
  whole_free(&g, &a, &s);
}

/* MFU's denominator (model/peak.c): each part its own datasheet row, whole words only. */
static void test_peak_table(void) {
  static const struct {
    const char *name;
    int major;
    double tflops;
  } cases[] = {
      {"NVIDIA H200", 9, 989},           {"NVIDIA H200 NVL", 9, 835},      {"NVIDIA H100 80GB HBM3", 9, 989},
      {"NVIDIA H100 PCIe", 9, 756},      {"NVIDIA H100 NVL", 9, 835},      {"NVIDIA H800", 9, 989},
      {"NVIDIA H800 PCIe", 9, 756},      {"NVIDIA H20", 9, 148},           {"NVIDIA GH200 480GB", 9, 989},
      {"NVIDIA A100-SXM4-80GB", 8, 312}, {"NVIDIA A100 80GB PCIe", 8, 312}, {"NVIDIA A10", 8, 125},
      {"NVIDIA A10G", 8, 0},             {"NVIDIA L40S", 8, 362},          {"NVIDIA L40", 8, 181},
      {"NVIDIA L4", 8, 121},             {"NVIDIA B200", 10, 2250},        {"NVIDIA GB200", 10, 2500},
      {"NVIDIA H200", 8, 0}, /* the compute capability disagrees: unknown */
      {"NVIDIA GeForce RTX 4090", 8, 0}, {"", 9, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    double got = model_dev_peak_bf16(cases[i].name, cases[i].major) / 1e12;
    T_CHECK_MSG(got == cases[i].tflops, "\"%s\" (cc %d.x): %.0f TFLOP/s, expected %.0f", cases[i].name,
                cases[i].major, got, cases[i].tflops);
  }
}

int main(void) {
  T_RUN(test_presets_and_overrides);
  T_RUN(test_layout);
  T_RUN(test_init_reproducible);
  T_RUN(test_finite_differences);
  T_RUN(test_accumulation_equals_big_batch);
  T_RUN(test_adamw_shards_and_decay);
  T_RUN(test_schedule_and_clip);
  T_RUN(test_acts_bytes);
  T_RUN(test_threads_raised_after_scratch);
  T_RUN(test_peak_table);
  return T_DONE();
}
