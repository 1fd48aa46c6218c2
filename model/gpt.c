/* The CPU model (see gpt.h): buffers, initialisation and the pieces of a step, each a
 * short sequence of ops (ops.h) over the tensors of the layout. */
#include "model/gpt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "model/carve.h"
#include "model/ops.h"
#include "model/rng.h"

/* 64-byte aligned, zeroed; sizes rounded up to the alignment. */
static void *alloc_zeroed(size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  void *p = aligned_alloc(64, bytes ? bytes : 64);
  if (p) memset(p, 0, bytes);
  return p;
}

newt_result_t model_gpt_init(model_gpt *g, const model_config *cfg) {
  memset(g, 0, sizeof *g);
  NEWT_CHECK(model_layout_init(&g->layout, cfg));
  g->params = alloc_zeroed(g->layout.total * sizeof(float));
  g->grads = alloc_zeroed(g->layout.total * sizeof(float));
  if (!g->params || !g->grads) {
    model_gpt_free(g);
    return NEWT_ERR(NEWT_ERR_NOMEM, "model: out of memory for %zu parameters", g->layout.total);
  }
  return NEWT_OK;
}

void model_gpt_free(model_gpt *g) {
  free(g->params);
  free(g->grads);
  model_layout_free(&g->layout);
  memset(g, 0, sizeof *g);
}

void model_gpt_init_tensor(const model_layout *lay, const model_tensor *t, uint64_t seed, size_t i0,
                           size_t n, float *out) {
  if (t->ndim == 1) {
    int ln_weight = t->slot == MODEL_LN1_W || t->slot == MODEL_LN2_W || t->slot == MODEL_LNF_W;
    for (size_t i = 0; i < n; i++) out[i] = ln_weight ? 1.0f : 0.0f;
    return;
  }
  double proj_std = 0.02 / sqrt(2.0 * (double)lay->cfg.layers);
  double std = (t->slot == MODEL_PROJ_W || t->slot == MODEL_FCPROJ_W) ? proj_std : 0.02;
  uint64_t stream = model_rng_hash(t->name);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = (float)(std * model_rng_normal(seed, stream, i0 + i));
}

void model_gpt_init_weights(model_gpt *g, uint64_t seed) {
  const model_layout *lay = &g->layout;
  for (size_t k = 0; k < lay->n; k++) {
    const model_tensor *t = &lay->tensors[k];
    model_gpt_init_tensor(lay, t, seed, 0, t->size, g->params + t->offset);
  }
}

void model_gpt_zero_grads(model_gpt *g) { memset(g->grads, 0, g->layout.total * sizeof(float)); }

float *model_gpt_param(const model_gpt *g, int slot, int layer) {
  return g->params + model_layout_get(&g->layout, slot, layer)->offset;
}

float *model_gpt_grad(const model_gpt *g, int slot, int layer) {
  return g->grads + model_layout_get(&g->layout, slot, layer)->offset;
}

#define CARVE_F(c, n) ((float *)model_carve((c), (size_t)(n) * sizeof(float)))

static void acts_carve(model_acts *a, const model_config *cfg, model_carver *c) {
  size_t B = a->B, T = a->T, C = cfg->channels, NH = cfg->heads, V = cfg->vocab, tp = a->tp;
  size_t BT = B * T;
  a->inputs = model_carve(c, BT * sizeof(int32_t));
  a->targets = model_carve(c, BT * sizeof(int32_t));
  a->x0 = CARVE_F(c, BT * C);
  for (int l = a->l0; l < a->l1; l++) {
    model_block_acts tmp, *b = a->blk ? &a->blk[l - a->l0] : &tmp;
    b->ln1 = CARVE_F(c, BT * C);
    b->ln1_mean = CARVE_F(c, BT);
    b->ln1_rstd = CARVE_F(c, BT);
    b->qkv = CARVE_F(c, BT * 3 * C / tp);
    b->att = CARVE_F(c, B * NH / tp * T * T);
    b->atty = CARVE_F(c, BT * C / tp);
    b->res1 = CARVE_F(c, BT * C);
    b->ln2 = CARVE_F(c, BT * C);
    b->ln2_mean = CARVE_F(c, BT);
    b->ln2_rstd = CARVE_F(c, BT);
    b->fch = CARVE_F(c, BT * 4 * C / tp);
    b->fch_gelu = CARVE_F(c, BT * 4 * C / tp);
    b->res2 = CARVE_F(c, BT * C);
  }
  if (a->head) {
    a->lnf = CARVE_F(c, BT * C);
    a->lnf_mean = CARVE_F(c, BT);
    a->lnf_rstd = CARVE_F(c, BT);
    a->logits = CARVE_F(c, BT * V / tp);
    a->losses = CARVE_F(c, BT);
  }
}

size_t model_acts_bytes_tp(const model_config *cfg, int tp, int B, int T, int l0, int l1, int head) {
  model_acts a = {.B = B, .T = T, .tp = tp > 1 ? tp : 1, .l0 = l0, .l1 = l1, .head = head};
  model_carver c = {.align = 64};
  acts_carve(&a, cfg, &c);
  return c.off;
}

size_t model_acts_bytes(const model_config *cfg, int B, int T, int l0, int l1, int head) {
  return model_acts_bytes_tp(cfg, 1, B, T, l0, l1, head);
}

/* The checks and the allocation of model_acts_init_tp / _dev (dev NULL: host memory). */
static newt_result_t acts_init(model_acts *a, model_dev *dev, const model_config *cfg, int tp, int B, int T, int l0,
                               int l1, int head) {
  memset(a, 0, sizeof *a);
  NEWT_CHECK(model_config_check(cfg));
  if (B < 1 || T < 1 || T > cfg->ctx)
    return NEWT_ERR(NEWT_ERR_INVALID, "model acts: B = %d, T = %d: need B >= 1 and 1 <= T <= ctx = %lld",
                    B, T, (long long)cfg->ctx);
  if (l0 < 0 || l1 < l0 || l1 > cfg->layers)
    return NEWT_ERR(NEWT_ERR_INVALID, "model acts: layers [%d, %d) outside [0, %lld)", l0, l1,
                    (long long)cfg->layers);
  if (tp < 1 || cfg->heads % tp != 0 || cfg->vocab % tp != 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "model acts: tp = %d must divide heads = %lld and vocab = %lld", tp,
                    (long long)cfg->heads, (long long)cfg->vocab);
  *a = (model_acts){.B = B, .T = T, .tp = tp, .l0 = l0, .l1 = l1, .head = head, .dev = dev};
  a->bytes = model_acts_bytes_tp(cfg, tp, B, T, l0, l1, head);
  a->blk = calloc(l1 > l0 ? (size_t)(l1 - l0) : 1, sizeof *a->blk);
  if (!a->blk) return NEWT_ERR(NEWT_ERR_NOMEM, "model acts: out of memory");
  if (dev) {
    newt_result_t r = model_dev_alloc(dev, a->bytes, &a->mem);
    if (r != NEWT_OK) {
      model_acts_free(a);
      return newt_err_wrap(r, "model acts: ");
    }
  } else {
    a->mem = alloc_zeroed(a->bytes);
  }
  if (!a->mem) {
    size_t bytes = a->bytes;
    model_acts_free(a);
    return NEWT_ERR(NEWT_ERR_NOMEM, "model acts: out of memory (%zu bytes)", bytes);
  }
  model_carver c = {.base = a->mem, .align = 64};
  acts_carve(a, cfg, &c);
  return NEWT_OK;
}

newt_result_t model_acts_init_tp(model_acts *a, const model_config *cfg, int tp, int B, int T, int l0,
                                 int l1, int head) {
  return acts_init(a, NULL, cfg, tp, B, T, l0, l1, head);
}

newt_result_t model_acts_init_dev(model_acts *a, model_dev *dev, const model_config *cfg, int tp, int B, int T,
                                  int l0, int l1, int head) {
  return acts_init(a, dev, cfg, tp, B, T, l0, l1, head);
}

newt_result_t model_acts_init(model_acts *a, const model_config *cfg, int B, int T, int l0, int l1,
                              int head) {
  return model_acts_init_tp(a, cfg, 1, B, T, l0, l1, head);
}

void model_acts_free(model_acts *a) {
  if (a->dev) model_dev_free(a->dev, a->mem);
  else free(a->mem);
  free(a->blk);
  memset(a, 0, sizeof *a);
}

static void scratch_carve(model_scratch *s, const model_config *cfg, size_t per_thread, model_carver *c) {
  size_t BT = (size_t)s->B * s->T, C = cfg->channels;
  s->dres = CARVE_F(c, BT * C);
  s->dx = CARVE_F(c, BT * C);
  s->dqkv = CARVE_F(c, BT * 3 * C);
  s->dfch = CARVE_F(c, BT * 4 * C);
  s->thread = CARVE_F(c, (size_t)s->threads * per_thread);
}

/* model_scratch_init / _dev (dev NULL: host memory and ops.h's scratch per thread). */
static newt_result_t scratch_init(model_scratch *s, model_dev *dev, const model_config *cfg, int B, int T) {
  memset(s, 0, sizeof *s);
  NEWT_CHECK(model_config_check(cfg));
  s->B = B;
  s->T = T;
  s->threads = model_threads_get();
  s->dev = dev;
  size_t per_thread = dev ? model_dev_scratch_floats(dev, T, (int)cfg->channels, (int)cfg->heads)
                          : model_ops_scratch_floats(T, (int)cfg->channels, (int)cfg->heads);
  model_carver c = {.align = 64};
  scratch_carve(s, cfg, per_thread, &c);
  s->bytes = c.off;
  if (dev) {
    newt_result_t r = model_dev_alloc(dev, s->bytes, &s->mem);
    if (r != NEWT_OK) {
      memset(s, 0, sizeof *s);
      return newt_err_wrap(r, "model scratch: ");
    }
  } else {
    s->mem = alloc_zeroed(s->bytes);
    if (!s->mem) return NEWT_ERR(NEWT_ERR_NOMEM, "model scratch: out of memory (%zu bytes)", s->bytes);
  }
  c = (model_carver){.base = s->mem, .align = 64};
  scratch_carve(s, cfg, per_thread, &c);
  return NEWT_OK;
}

newt_result_t model_scratch_init(model_scratch *s, const model_config *cfg, int B, int T) {
  return scratch_init(s, NULL, cfg, B, T);
}

newt_result_t model_scratch_init_dev(model_scratch *s, model_dev *dev, const model_config *cfg, int B, int T) {
  return scratch_init(s, dev, cfg, B, T);
}

void model_scratch_free(model_scratch *s) {
  if (s->dev) model_dev_free(s->dev, s->mem);
  else free(s->mem);
  memset(s, 0, sizeof *s);
}

/* The per-thread scratch holds s->threads threads' worth. */
void model_scratch_guard(const model_scratch *s) {
  if (model_threads_get() > s->threads) {
    NEWT_WARN(MODEL, "%d threads, but the scratch was sized for %d: using %d", model_threads_get(), s->threads,
              s->threads);
    model_threads_set(s->threads);
  }
}

#define P(slot, l) model_gpt_param(g, (slot), (l))
#define G(slot, l) model_gpt_grad(g, (slot), (l))

void model_embed_forward(const model_gpt *g, model_acts *a, const int32_t *inputs) {
  int C = (int)g->layout.cfg.channels;
  memcpy(a->inputs, inputs, (size_t)a->B * a->T * sizeof(int32_t));
  model_encoder_forward(a->x0, a->inputs, P(MODEL_WTE, 0), P(MODEL_WPE, 0), a->B, a->T, C);
}

/* The input of layer l (its residual stream) and its activations. */
static const float *layer_input(const model_acts *a, int l) {
  return l == a->l0 ? a->x0 : a->blk[l - a->l0 - 1].res2;
}

void model_block_forward(const model_gpt *g, model_acts *a, model_scratch *s, int l) {
  int B = a->B, T = a->T, C = (int)g->layout.cfg.channels, NH = (int)g->layout.cfg.heads;
  model_block_acts *b = &a->blk[l - a->l0];
  const float *x = layer_input(a, l);
  model_scratch_guard(s);
  model_layernorm_forward(b->ln1, b->ln1_mean, b->ln1_rstd, x, P(MODEL_LN1_W, l), P(MODEL_LN1_B, l),
                          B, T, C);
  model_matmul_forward(b->qkv, NULL, b->ln1, P(MODEL_QKV_W, l), P(MODEL_QKV_B, l), B, T, C, 3 * C);
  model_attention_forward(b->atty, b->att, b->qkv, B, T, C, NH, s->thread);
  model_matmul_forward(b->res1, x, b->atty, P(MODEL_PROJ_W, l), P(MODEL_PROJ_B, l), B, T, C, C);
  model_layernorm_forward(b->ln2, b->ln2_mean, b->ln2_rstd, b->res1, P(MODEL_LN2_W, l),
                          P(MODEL_LN2_B, l), B, T, C);
  model_matmul_forward(b->fch, NULL, b->ln2, P(MODEL_FC_W, l), P(MODEL_FC_B, l), B, T, C, 4 * C);
  model_gelu_forward(b->fch_gelu, b->fch, (size_t)B * T * 4 * C);
  model_matmul_forward(b->res2, b->res1, b->fch_gelu, P(MODEL_FCPROJ_W, l), P(MODEL_FCPROJ_B, l), B,
                       T, 4 * C, C);
}

double model_head_forward(const model_gpt *g, model_acts *a, const int32_t *targets, float dscale) {
  int B = a->B, T = a->T, C = (int)g->layout.cfg.channels, V = (int)g->layout.cfg.vocab;
  const float *x = layer_input(a, a->l1);
  memcpy(a->targets, targets, (size_t)B * T * sizeof(int32_t));
  model_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, x, P(MODEL_LNF_W, 0), P(MODEL_LNF_B, 0),
                          B, T, C);
  model_matmul_forward(a->logits, NULL, a->lnf, P(MODEL_WTE, 0), NULL, B, T, C, V);
  return model_crossentropy_forward(a->losses, dscale != 0.0f ? a->logits : NULL, a->logits,
                                    a->targets, B, T, V, dscale);
}

void model_head_backward(model_gpt *g, model_acts *a, model_scratch *s) {
  int B = a->B, T = a->T, C = (int)g->layout.cfg.channels, V = (int)g->layout.cfg.vocab;
  const float *x = layer_input(a, a->l1);
  model_scratch_guard(s);
  model_matmul_backward(s->dx, G(MODEL_WTE, 0), NULL, a->logits, a->lnf, P(MODEL_WTE, 0), B, T, C, V);
  memset(s->dres, 0, (size_t)B * T * C * sizeof(float));
  model_layernorm_backward(s->dres, G(MODEL_LNF_W, 0), G(MODEL_LNF_B, 0), s->dx, x, P(MODEL_LNF_W, 0),
                           a->lnf_mean, a->lnf_rstd, B, T, C, s->thread);
}

void model_block_backward(model_gpt *g, model_acts *a, model_scratch *s, int l) {
  int B = a->B, T = a->T, C = (int)g->layout.cfg.channels, NH = (int)g->layout.cfg.heads;
  model_block_acts *b = &a->blk[l - a->l0];
  const float *x = layer_input(a, l);
  size_t BT = (size_t)B * T;
  model_scratch_guard(s);
  /* res2 = res1 + mlp.proj(gelu(fc(ln2(res1)))): dres holds d res2 = d res1 (pass-through) */
  model_matmul_backward(s->dfch, G(MODEL_FCPROJ_W, l), G(MODEL_FCPROJ_B, l), s->dres, b->fch_gelu,
                        P(MODEL_FCPROJ_W, l), B, T, 4 * C, C);
  model_gelu_backward(s->dfch, b->fch, s->dfch, BT * 4 * C);
  model_matmul_backward(s->dx, G(MODEL_FC_W, l), G(MODEL_FC_B, l), s->dfch, b->ln2, P(MODEL_FC_W, l),
                        B, T, C, 4 * C);
  model_layernorm_backward(s->dres, G(MODEL_LN2_W, l), G(MODEL_LN2_B, l), s->dx, b->res1,
                           P(MODEL_LN2_W, l), b->ln2_mean, b->ln2_rstd, B, T, C, s->thread);
  /* res1 = x + attn.proj(attention(qkv(ln1(x)))) */
  model_matmul_backward(s->dx, G(MODEL_PROJ_W, l), G(MODEL_PROJ_B, l), s->dres, b->atty,
                        P(MODEL_PROJ_W, l), B, T, C, C);
  model_attention_backward(s->dqkv, s->dx, b->att, b->qkv, B, T, C, NH, s->thread);
  model_matmul_backward(s->dx, G(MODEL_QKV_W, l), G(MODEL_QKV_B, l), s->dqkv, b->ln1,
                        P(MODEL_QKV_W, l), B, T, C, 3 * C);
  model_layernorm_backward(s->dres, G(MODEL_LN1_W, l), G(MODEL_LN1_B, l), s->dx, x, P(MODEL_LN1_W, l),
                           b->ln1_mean, b->ln1_rstd, B, T, C, s->thread);
}

void model_embed_backward(model_gpt *g, model_acts *a, model_scratch *s) {
  model_encoder_backward(G(MODEL_WTE, 0), G(MODEL_WPE, 0), s->dres, a->inputs, a->B, a->T,
                         (int)g->layout.cfg.channels);
}

double model_forward_backward(model_gpt *g, model_acts *a, model_scratch *s, const int32_t *inputs,
                              const int32_t *targets, float dscale) {
  model_embed_forward(g, a, inputs);
  for (int l = a->l0; l < a->l1; l++) model_block_forward(g, a, s, l);
  double loss = model_head_forward(g, a, targets, dscale);
  if (dscale == 0.0f) return loss;
  model_head_backward(g, a, s);
  for (int l = a->l1 - 1; l >= a->l0; l--) model_block_backward(g, a, s, l);
  model_embed_backward(g, a, s);
  return loss;
}

double model_flops_per_token(const model_config *cfg, int T) {
  double C = (double)cfg->channels, L = (double)cfg->layers, V = (double)cfg->vocab;
  double matmul = L * 12.0 * C * C + V * C;      /* multiply-adds per token, forward */
  double attn = L * 2.0 * C * (T + 1) / 2.0;     /* q.k and att.v over the causal half */
  return 6.0 * matmul + 6.0 * attn;              /* 2 FLOPs per MAC, x3 for forward + backward */
}
