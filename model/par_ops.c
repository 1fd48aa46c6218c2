/* The pieces of a step on one rank's tensors (see par_internal.h): gpt.c's sequence of ops
 * at the tensor-parallel shapes, with Megatron's all-reduces over the tensor-parallel group.
 *
 * Per block (C channels, tp ranks, each with NH/tp heads, C/tp attention channels and 4C/tp
 * MLP channels), the residual stream x (B,T,C) is replicated:
 *
 *   forward   ln1 -> qkv (column-parallel: this rank's heads) -> attention -> attn.proj
 *             (row-parallel: a partial (B,T,C)) -> all-reduce (g) -> + bias + x = res1;
 *             ln2 -> mlp.fc (column) -> gelu -> mlp.proj (row) -> all-reduce (g) -> res2
 *   backward  d res2 reaches mlp.proj as is (g's backward is the identity); mlp.fc's input
 *             gradient is a partial -> all-reduce (f) -> ln2 backward; the same for qkv
 *             -> all-reduce (f) -> ln1 backward
 *
 * so replicated tensors (layernorms, the row-parallel biases) get the same gradient on every
 * rank from the same data and stay identical without communication. The embedding looks up
 * the rank's rows of wte (zeros elsewhere) and all-reduces before adding wpe; the head
 * computes this rank's V/tp logits and the cross-entropy from three reductions per token:
 * the max (all-reduce MAX), then the sum of exponentials and the target's logit (one SUM).
 * With tp = 1 every piece is exactly gpt.c's, bit for bit. Every op is a kernel of the rank's
 * device (model/dev.h) on its memory; the all-reduces take the same device pointers. */
#include "model/par_internal.h"

int par_local_index(const model_par *p, int slot, int layer) {
  const model_tensor *g = model_layout_get(&p->global, slot, layer);
  return p->of_global[g - p->global.tensors];
}

float *par_param(const model_par *p, int slot, int layer) {
  int k = par_local_index(p, slot, layer);
  if (k < 0) return NULL;
  const model_tensor *l = &p->local.tensors[k];
  if (p->params) return p->params + l->offset;
  int u = p->ten[k].unit;
  for (int i = 0; i < 2; i++)
    if (p->gathered[i] == u) return p->gather[i] + (l->offset - p->units[u].off);
  return NULL;
}

float *par_grad(const model_par *p, int slot, int layer) {
  int k = par_local_index(p, slot, layer);
  return k < 0 ? NULL : p->grads + p->local.tensors[k].offset;
}

int par_primary(const model_par *p, const model_tensor *t) {
  if (t->split == MODEL_SPLIT_NONE && p->pc.tp_rank != 0) return 0;
  if (t->slot == MODEL_WTE && !p->first) return 0;
  return 1;
}

static newt_result_t tp_sum(comm_t *tp, float *x, size_t n) {
  return tp ? comm_allreduce(tp, x, x, n, NEWT_F32, COMM_SUM) : NEWT_OK;
}

/* A row-parallel linear: out (B,T,OC) = res + bias + inp (B,T,IC) @ weight^T summed over tp. */
static newt_result_t row_parallel(const model_par *p, comm_t *tp, float *out, const float *res, const float *inp,
                                  const float *weight, const float *bias, int B, int T, int IC, int OC) {
  if (!tp) {
    model_k_matmul_forward(p->dev, out, res, inp, weight, bias, B, T, IC, OC);
    return NEWT_OK;
  }
  model_k_matmul_forward(p->dev, out, NULL, inp, weight, NULL, B, T, IC, OC);
  NEWT_CHECK(tp_sum(tp, out, (size_t)B * T * OC));
  model_k_add_res_bias(p->dev, out, res, bias, (size_t)B * T, (size_t)OC);
  return NEWT_OK;
}

#define P(slot, l) par_param(p, (slot), (l))
#define G(slot, l) par_grad(p, (slot), (l))

newt_result_t par_embed_forward(const model_par *p, comm_t *tp, model_acts *a, const int32_t *inputs) {
  int B = a->B, T = a->T, C = (int)p->cfg.model.channels;
  model_dev *d = p->dev;
  NEWT_CHECK(model_dev_upload(d, a->inputs, inputs, (size_t)B * T * sizeof(int32_t)));
  if (!tp) {
    model_k_encoder_forward(d, a->x0, a->inputs, P(MODEL_WTE, 0), P(MODEL_WPE, 0), B, T, C);
    return NEWT_OK;
  }
  int Vl = (int)p->cfg.model.vocab / p->pc.tp, lo = p->pc.tp_rank * Vl;
  model_k_embed_rows_forward(d, a->x0, a->inputs, P(MODEL_WTE, 0), B * T, C, lo, Vl);
  NEWT_CHECK(tp_sum(tp, a->x0, (size_t)B * T * C));
  model_k_add_positions(d, a->x0, P(MODEL_WPE, 0), B, T, C);
  return NEWT_OK;
}

void par_embed_backward(const model_par *p, model_acts *a, model_scratch *s) {
  int B = a->B, T = a->T, C = (int)p->cfg.model.channels;
  float *dwte = G(MODEL_WTE, 0), *dwpe = G(MODEL_WPE, 0);
  if (p->pc.tp == 1) {
    model_k_encoder_backward(p->dev, dwte, dwpe, s->dres, a->inputs, B, T, C);
    return;
  }
  int Vl = (int)p->cfg.model.vocab / p->pc.tp, lo = p->pc.tp_rank * Vl;
  model_k_embed_rows_backward(p->dev, dwte, dwpe, s->dres, a->inputs, B, T, C, lo, Vl);
}

/* The input of layer l of the stage's acts. */
static const float *layer_input(const model_acts *a, int l) {
  return l == a->l0 ? a->x0 : a->blk[l - a->l0 - 1].res2;
}

newt_result_t par_block_forward(const model_par *p, comm_t *tp, model_acts *a, model_scratch *s, int l) {
  int B = a->B, T = a->T, C = (int)p->cfg.model.channels, ntp = p->pc.tp;
  int Cl = C / ntp, NHl = (int)p->cfg.model.heads / ntp, Fl = 4 * C / ntp;
  model_dev *d = p->dev;
  model_block_acts *b = &a->blk[l - a->l0];
  const float *x = layer_input(a, l);
  model_scratch_guard(s);
  model_k_layernorm_forward(d, b->ln1, b->ln1_mean, b->ln1_rstd, x, P(MODEL_LN1_W, l), P(MODEL_LN1_B, l), B, T, C);
  model_k_matmul_forward(d, b->qkv, NULL, b->ln1, P(MODEL_QKV_W, l), P(MODEL_QKV_B, l), B, T, C, 3 * Cl);
  model_k_attention_forward(d, b->atty, b->att, b->qkv, B, T, Cl, NHl, s->thread);
  NEWT_CHECK(row_parallel(p, tp, b->res1, x, b->atty, P(MODEL_PROJ_W, l), P(MODEL_PROJ_B, l), B, T, Cl, C));
  model_k_layernorm_forward(d, b->ln2, b->ln2_mean, b->ln2_rstd, b->res1, P(MODEL_LN2_W, l), P(MODEL_LN2_B, l), B,
                            T, C);
  model_k_matmul_forward(d, b->fch, NULL, b->ln2, P(MODEL_FC_W, l), P(MODEL_FC_B, l), B, T, C, Fl);
  model_k_gelu_forward(d, b->fch_gelu, b->fch, (size_t)B * T * Fl);
  return row_parallel(p, tp, b->res2, b->res1, b->fch_gelu, P(MODEL_FCPROJ_W, l), P(MODEL_FCPROJ_B, l), B, T, Fl,
                      C);
}

newt_result_t par_block_backward(const model_par *p, comm_t *tp, model_acts *a, model_scratch *s, int l) {
  int B = a->B, T = a->T, C = (int)p->cfg.model.channels, ntp = p->pc.tp;
  int Cl = C / ntp, NHl = (int)p->cfg.model.heads / ntp, Fl = 4 * C / ntp;
  model_dev *d = p->dev;
  model_block_acts *b = &a->blk[l - a->l0];
  const float *x = layer_input(a, l);
  size_t BT = (size_t)B * T;
  model_scratch_guard(s);
  /* res2 = res1 + mlp.proj(gelu(fc(ln2(res1)))): dres holds d res2 = d res1 (pass-through) */
  model_k_matmul_backward(d, s->dfch, G(MODEL_FCPROJ_W, l), G(MODEL_FCPROJ_B, l), s->dres, b->fch_gelu,
                          P(MODEL_FCPROJ_W, l), B, T, Fl, C);
  model_k_gelu_backward(d, s->dfch, b->fch, s->dfch, BT * Fl);
  model_k_matmul_backward(d, s->dx, G(MODEL_FC_W, l), G(MODEL_FC_B, l), s->dfch, b->ln2, P(MODEL_FC_W, l), B, T, C,
                          Fl);
  NEWT_CHECK(tp_sum(tp, s->dx, BT * C));
  model_k_layernorm_backward(d, s->dres, G(MODEL_LN2_W, l), G(MODEL_LN2_B, l), s->dx, b->res1, P(MODEL_LN2_W, l),
                             b->ln2_mean, b->ln2_rstd, B, T, C, s->thread);
  /* res1 = x + attn.proj(attention(qkv(ln1(x)))) */
  model_k_matmul_backward(d, s->dx, G(MODEL_PROJ_W, l), G(MODEL_PROJ_B, l), s->dres, b->atty, P(MODEL_PROJ_W, l), B,
                          T, Cl, C);
  model_k_attention_backward(d, s->dqkv, s->dx, b->att, b->qkv, B, T, Cl, NHl, s->thread);
  model_k_matmul_backward(d, s->dx, G(MODEL_QKV_W, l), G(MODEL_QKV_B, l), s->dqkv, b->ln1, P(MODEL_QKV_W, l), B, T,
                          C, 3 * Cl);
  NEWT_CHECK(tp_sum(tp, s->dx, BT * C));
  model_k_layernorm_backward(d, s->dres, G(MODEL_LN1_W, l), G(MODEL_LN1_B, l), s->dx, x, P(MODEL_LN1_W, l),
                             b->ln1_mean, b->ln1_rstd, B, T, C, s->thread);
  return NEWT_OK;
}

newt_result_t par_head_forward(const model_par *p, comm_t *tp, model_acts *a, const int32_t *targets, float dscale,
                               double *loss_acc) {
  int B = a->B, T = a->T, C = (int)p->cfg.model.channels, Vl = (int)p->cfg.model.vocab / p->pc.tp;
  model_dev *d = p->dev;
  const float *x = layer_input(a, a->l1);
  NEWT_CHECK(model_dev_upload(d, a->targets, targets, (size_t)B * T * sizeof(int32_t)));
  model_k_layernorm_forward(d, a->lnf, a->lnf_mean, a->lnf_rstd, x, P(MODEL_LNF_W, 0), P(MODEL_LNF_B, 0), B, T, C);
  model_k_matmul_forward(d, a->logits, NULL, a->lnf, P(MODEL_WTE, 0), NULL, B, T, C, Vl);
  if (!tp) {
    model_k_crossentropy(d, a->losses, dscale != 0.0f ? a->logits : NULL, a->logits, a->targets, B, T, Vl, dscale,
                         loss_acc);
    return NEWT_OK;
  }
  /* vocab-parallel: the row max (all-reduce MAX), then the sum of exponentials and the
     target's logit (all-reduce SUM), then the losses and the logits' gradients */
  int BT = B * T, lo = p->pc.tp_rank * Vl;
  float *mx = p->ce, *st = p->ce + BT;
  model_k_ce_rowmax(d, mx, a->logits, BT, Vl);
  NEWT_CHECK(comm_allreduce(tp, mx, mx, (size_t)BT, NEWT_F32, COMM_MAX));
  model_k_ce_partials(d, st, a->logits, mx, a->targets, BT, Vl, lo);
  NEWT_CHECK(comm_allreduce(tp, st, st, 2 * (size_t)BT, NEWT_F32, COMM_SUM));
  model_k_ce_finish(d, a->losses, a->logits, mx, st, a->targets, BT, Vl, lo, dscale, loss_acc);
  return NEWT_OK;
}

newt_result_t par_head_backward(const model_par *p, comm_t *tp, model_acts *a, model_scratch *s) {
  int B = a->B, T = a->T, C = (int)p->cfg.model.channels, Vl = (int)p->cfg.model.vocab / p->pc.tp;
  model_dev *d = p->dev;
  const float *x = layer_input(a, a->l1);
  model_scratch_guard(s);
  model_k_matmul_backward(d, s->dx, G(MODEL_WTE, 0), NULL, a->logits, a->lnf, P(MODEL_WTE, 0), B, T, C, Vl);
  NEWT_CHECK(tp_sum(tp, s->dx, (size_t)B * T * C));
  model_dev_zero(d, s->dres, (size_t)B * T * C * sizeof(float));
  model_k_layernorm_backward(d, s->dres, G(MODEL_LNF_W, 0), G(MODEL_LNF_B, 0), s->dx, x, P(MODEL_LNF_W, 0),
                             a->lnf_mean, a->lnf_rstd, B, T, C, s->thread);
  return NEWT_OK;
}
