/* What one rank of a parallel layout holds (see parallel.h): its coordinates and groups,
 * its local tensor table and buckets, its buffers and initial weights, and the pieces of
 * global tensors it holds.
 *
 * The local table walks the global one in order, keeping the tensors of this stage, each at
 * its tensor-parallel shape, grouped in buckets (wte, wpe, each layer, lnf). A tensor
 * starts at a MODEL_ALIGN boundary; a bucket is padded to a multiple of dp * MODEL_ALIGN,
 * so that its dp chunks are equal and aligned (ZeRO 0 has no chunks: a multiple of
 * MODEL_ALIGN, the same buffers at any dp, which model_par_relayout keeps). The shard
 * buffers hold this rank's chunk of every bucket, one after the other (the moments; with
 * ZeRO 3 also the parameters and the reduced gradients); with ZeRO 3 `shard` lists the runs
 * of tensors in them, so AdamW (which only needs offsets, sizes and decay flags) runs over
 * them as over a whole model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/ops.h"
#include "model/par_internal.h"

void model_par_config_from_rank(model_par_config *pc, int tp, int pp, int dp, int zero, int rank) {
  *pc = (model_par_config){.tp = tp, .pp = pp, .dp = dp, .zero = zero};
  pc->tp_rank = tp > 0 ? rank % tp : 0;
  pc->dp_rank = tp > 0 && dp > 0 ? (rank / tp) % dp : 0;
  pc->pp_rank = tp > 0 && dp > 0 ? rank / (tp * dp) : 0;
}

int model_par_world_rank(const model_par_config *pc) {
  return (pc->pp_rank * pc->dp + pc->dp_rank) * pc->tp + pc->tp_rank;
}

newt_result_t model_par_config_check(const model_par_config *pc, const model_train_config *cfg) {
  NEWT_CHECK(model_train_config_check(cfg));
  const model_config *m = &cfg->model;
  if (pc->tp < 1 || pc->pp < 1 || pc->dp < 1)
    return NEWT_ERR(NEWT_ERR_INVALID, "parallel layout tp = %d, pp = %d, dp = %d: each must be >= 1", pc->tp,
                    pc->pp, pc->dp);
  if (m->heads % pc->tp != 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "parallel.tp = %d must divide model.heads = %lld", pc->tp,
                    (long long)m->heads);
  if (m->vocab % pc->tp != 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "parallel.tp = %d must divide model.vocab = %lld (vocab-parallel embedding)",
                    pc->tp, (long long)m->vocab);
  if (pc->pp > m->layers)
    return NEWT_ERR(NEWT_ERR_INVALID, "parallel.pp = %d: more stages than model.layers = %lld", pc->pp,
                    (long long)m->layers);
  if (pc->dp > cfg->batch)
    return NEWT_ERR(NEWT_ERR_INVALID, "parallel.dp = %d: more data-parallel ranks than sequences in the batch (%d)",
                    pc->dp, cfg->batch);
  if (pc->zero < 0 || pc->zero > 3)
    return NEWT_ERR(NEWT_ERR_INVALID, "parallel.zero = %d: the ZeRO stage must be 0, 1, 2 or 3", pc->zero);
  if (pc->tp_rank < 0 || pc->tp_rank >= pc->tp || pc->pp_rank < 0 || pc->pp_rank >= pc->pp || pc->dp_rank < 0 ||
      pc->dp_rank >= pc->dp)
    return NEWT_ERR(NEWT_ERR_INVALID, "parallel rank (tp %d, pp %d, dp %d) outside the layout %d x %d x %d",
                    pc->tp_rank, pc->pp_rank, pc->dp_rank, pc->tp, pc->pp, pc->dp);
  return NEWT_OK;
}

void model_par_stage_layers(int layers, int pp, int stage, int *l0, int *l1) {
  int q = layers / pp, r = layers % pp;
  *l0 = stage * q + (stage < r ? stage : r);
  *l1 = *l0 + q + (stage < r ? 1 : 0);
}

/* ---- communicators ----------------------------------------------------------------------- */

void model_par_group_color(const model_par_config *pc, model_par_group g, int *color, int *key) {
  switch (g) {
    case MODEL_PAR_TP:
      *color = pc->pp_rank * pc->dp + pc->dp_rank;
      *key = pc->tp_rank;
      return;
    case MODEL_PAR_DP:
      *color = pc->pp_rank * pc->tp + pc->tp_rank;
      *key = pc->dp_rank;
      return;
    case MODEL_PAR_PP:
      *color = pc->dp_rank * pc->tp + pc->tp_rank;
      *key = pc->pp_rank;
      return;
    case MODEL_PAR_EMB:
      *color = pc->pp > 1 && (pc->pp_rank == 0 || pc->pp_rank == pc->pp - 1) ? pc->dp_rank * pc->tp + pc->tp_rank
                                                                               : -1;
      *key = pc->pp_rank;
      return;
  }
  *color = -1;
  *key = 0;
}

newt_result_t model_par_comms_split(comm_t *world, const model_par_config *pc, model_par_comms *out) {
  memset(out, 0, sizeof *out);
  int n = pc->tp * pc->pp * pc->dp;
  if (!world || comm_size(world) != n || comm_rank(world) != model_par_world_rank(pc))
    return NEWT_ERR(NEWT_ERR_INVALID,
                    "model_par_comms_split: world rank %d of %d, but the layout says rank %d of %d (tp %d, pp %d, dp %d)",
                    world ? comm_rank(world) : -1, world ? comm_size(world) : 0, model_par_world_rank(pc), n,
                    pc->tp, pc->pp, pc->dp);
  out->world = world;
  const struct {
    model_par_group g;
    int size;
    comm_t **dst;
  } groups[] = {{MODEL_PAR_TP, pc->tp, &out->tp},
                {MODEL_PAR_DP, pc->dp, &out->dp},
                {MODEL_PAR_PP, pc->pp, &out->pp},
                {MODEL_PAR_EMB, pc->pp > 1 ? 2 : 1, &out->emb}};
  for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
    if (groups[i].size < 2) continue; /* same decision on every rank: nobody calls split */
    int color, key;
    model_par_group_color(pc, groups[i].g, &color, &key);
    newt_result_t r = comm_split(world, color, key, groups[i].dst);
    if (r != NEWT_OK) {
      model_par_comms_free(out);
      return r;
    }
  }
  return NEWT_OK;
}

void model_par_comms_free(model_par_comms *c) {
  comm_free(c->emb);
  comm_free(c->pp);
  comm_free(c->dp);
  comm_free(c->tp);
  memset(c, 0, sizeof *c);
}

/* ---- the local table ----------------------------------------------------------------------- */

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* Does this stage hold global tensor t? */
static int holds(const model_par *p, const model_tensor *t) {
  switch (t->slot) {
    case MODEL_WTE: return p->first || p->last;
    case MODEL_WPE: return p->first;
    case MODEL_LNF_W:
    case MODEL_LNF_B: return p->last;
    default: return t->layer >= p->l0 && t->layer < p->l1;
  }
}

/* The unit key of a tensor: its layer, or MODEL_PAR_UNIT_WTE, _WPE, _LNF. wte is a bucket of
 * its own on both stages that hold it, so that both reduce it alike and stay identical. */
static int unit_key(const model_tensor *t) {
  if (t->slot == MODEL_WTE) return MODEL_PAR_UNIT_WTE;
  if (t->slot == MODEL_WPE) return MODEL_PAR_UNIT_WPE;
  if (t->slot == MODEL_LNF_W || t->slot == MODEL_LNF_B) return MODEL_PAR_UNIT_LNF;
  return t->layer;
}

/* The local shape of t and the boxes of it this tensor-parallel rank holds. */
static void split_tensor(const model_par *p, const model_tensor *g, model_tensor *l, model_par_tensor *pt) {
  size_t tp = (size_t)p->pc.tp, r = (size_t)p->pc.tp_rank, d0 = g->shape[0], d1 = g->shape[1];
  *l = *g;
  pt->nbox = 1;
  pt->box[0] = (model_par_box){.rows = d0, .cols = d1};
  switch (g->split) {
    case MODEL_SPLIT_NONE: break;
    case MODEL_SPLIT_ROWS:
      l->shape[0] = d0 / tp;
      pt->box[0] = (model_par_box){.row0 = r * (d0 / tp), .rows = d0 / tp, .cols = d1};
      break;
    case MODEL_SPLIT_COLS:
      l->shape[1] = d1 / tp;
      pt->box[0] = (model_par_box){.col0 = r * (d1 / tp), .rows = d0, .cols = d1 / tp};
      break;
    case MODEL_SPLIT_QKV_ROWS: {
      size_t blk = d0 / 3, mine = blk / tp; /* q, k, v blocks of C rows; this rank's heads in each */
      l->shape[0] = 3 * mine;
      pt->nbox = 3;
      for (size_t j = 0; j < 3; j++)
        pt->box[j] = (model_par_box){.local_off = j * mine * d1, .row0 = j * blk + r * mine, .rows = mine,
                                     .cols = d1};
      break;
    }
  }
  l->size = l->shape[0] * l->shape[1];
}

static newt_result_t build_tables(model_par *p) {
  const model_layout *gl = &p->global;
  size_t dp = p->pc.zero ? (size_t)p->pc.dp : 1; /* the chunks a bucket is cut into */
  model_layout *lay = &p->local;
  lay->cfg = gl->cfg;
  lay->tensors = calloc(gl->n, sizeof *lay->tensors);
  p->ten = calloc(gl->n, sizeof *p->ten);
  p->of_global = malloc(gl->n * sizeof *p->of_global);
  p->units = calloc(gl->n, sizeof *p->units);
  if (!lay->tensors || !p->ten || !p->of_global || !p->units)
    return NEWT_ERR(NEWT_ERR_NOMEM, "model_par: out of memory for the tensor table");
  size_t at = 0, shard = 0;
  int key = 0, open = 0;
  for (size_t i = 0; i < gl->n; i++) {
    const model_tensor *g = &gl->tensors[i];
    p->of_global[i] = -1;
    if (!holds(p, g)) continue;
    if (!open || unit_key(g) != key) { /* close the bucket, open the next */
      if (open) {
        model_par_unit *u = &p->units[p->nunits - 1];
        u->len = align_up(at - u->off, dp * MODEL_ALIGN);
        at = u->off + u->len;
      }
      model_par_unit *u = &p->units[p->nunits++];
      u->off = at;
      u->layer = key = unit_key(g);
      open = 1;
    }
    size_t k = lay->n++;
    model_tensor *l = &lay->tensors[k];
    model_par_tensor *pt = &p->ten[k];
    split_tensor(p, g, l, pt);
    l->offset = at;
    at = align_up(at + l->size, MODEL_ALIGN);
    lay->nparams += l->size;
    pt->global = g;
    pt->local = l;
    pt->unit = p->nunits - 1;
    p->of_global[i] = (int)k;
  }
  model_par_unit *u = &p->units[p->nunits - 1];
  u->len = align_up(at - u->off, dp * MODEL_ALIGN);
  lay->total = u->off + u->len;
  for (int k = 0; k < p->nunits; k++) {
    p->units[k].chunk = p->units[k].len / dp;
    p->units[k].soff = shard;
    shard += p->units[k].chunk;
  }
  p->shard_len = p->pc.zero ? shard : lay->total;
  if (p->pc.zero < 3) return NEWT_OK;
  /* ZeRO 3, the optimizer's table of the shard buffers: each tensor's part of the owned chunk */
  p->shard.cfg = gl->cfg;
  p->shard.tensors = calloc(lay->n, sizeof *p->shard.tensors);
  if (!p->shard.tensors) return NEWT_ERR(NEWT_ERR_NOMEM, "model_par: out of memory for the shard table");
  for (size_t k = 0; k < lay->n; k++) {
    size_t a, e, at;
    if (!par_chunk_part(p, k, &a, &e, &at)) continue;
    model_tensor *run = &p->shard.tensors[p->shard.n++];
    *run = lay->tensors[k];
    run->offset = at;
    run->size = e - a;
    run->ndim = 1;
    run->shape[0] = run->size;
    run->shape[1] = 1;
    p->shard.nparams += run->size;
  }
  p->shard.total = shard;
  return NEWT_OK;
}

int par_chunk_part(const model_par *p, size_t k, size_t *a, size_t *e, size_t *at) {
  const model_tensor *l = &p->local.tensors[k];
  const model_par_unit *u = &p->units[p->ten[k].unit];
  size_t c0 = u->off + (size_t)p->pc.dp_rank * u->chunk, c1 = c0 + u->chunk;
  *a = l->offset > c0 ? l->offset : c0;
  *e = l->offset + l->size < c1 ? l->offset + l->size : c1;
  *at = u->soff + (*a - c0);
  return *a < *e;
}

/* ---- allocation and initial weights ---------------------------------------------------------- */

/* n zeroed floats of the rank's device (at least one, so that a buffer is never NULL). */
static newt_result_t dev_floats(model_par *p, size_t n, float **out) {
  void *x;
  NEWT_CHECK(model_dev_alloc(p->dev, (n ? n : 1) * sizeof(float), &x));
  *out = x;
  return NEWT_OK;
}

/* The initial values of local tensor k into dst (host memory: its local elements, row-major). */
static void init_tensor(const model_par *p, size_t k, uint64_t seed, float *dst) {
  const model_par_tensor *pt = &p->ten[k];
  const model_tensor *g = pt->global;
  for (int b = 0; b < pt->nbox; b++) {
    const model_par_box *bx = &pt->box[b];
    float *out = dst + bx->local_off;
    if (bx->cols == g->shape[1]) { /* whole rows: one run */
      model_gpt_init_tensor(&p->global, g, seed, bx->row0 * g->shape[1], bx->rows * bx->cols, out);
      continue;
    }
    for (size_t i = 0; i < bx->rows; i++)
      model_gpt_init_tensor(&p->global, g, seed, (bx->row0 + i) * g->shape[1] + bx->col0, bx->cols,
                            out + i * bx->cols);
  }
}

/* The weights from the seed. They are computed on the host: straight into the buffers when
 * the device's memory is the host's, else a tensor (ZeRO 3: a bucket) at a time in host
 * staging, uploaded. */
static newt_result_t init_weights(model_par *p) {
  uint64_t seed = p->cfg.seed;
  int visible = model_dev_host_visible(p->dev);
  float *stage = NULL;
  if (!visible) {
    size_t most = 1;
    for (size_t k = 0; k < p->local.n; k++)
      if (p->local.tensors[k].size > most) most = p->local.tensors[k].size;
    for (int u = 0; p->pc.zero == 3 && u < p->nunits; u++)
      if (p->units[u].len > most) most = p->units[u].len;
    void *h;
    NEWT_CHECK(model_dev_host_alloc(p->dev, most * sizeof(float), &h));
    stage = h;
  }
  newt_result_t r = NEWT_OK;
  if (p->pc.zero < 3) {
    for (size_t k = 0; k < p->local.n && r == NEWT_OK; k++) {
      const model_tensor *t = &p->local.tensors[k];
      float *dst = p->params + t->offset;
      init_tensor(p, k, seed, visible ? dst : stage);
      if (!visible) r = model_dev_upload(p->dev, dst, stage, t->size * sizeof(float));
    }
  } else {
    /* ZeRO 3: a bucket at a time, keeping this rank's chunk */
    for (int u = 0; u < p->nunits && r == NEWT_OK; u++) {
      const model_par_unit *un = &p->units[u];
      float *buf = visible ? p->gather[0] : stage;
      memset(buf, 0, un->len * sizeof(float));
      for (size_t k = 0; k < p->local.n; k++)
        if (p->ten[k].unit == u) init_tensor(p, k, seed, buf + (p->local.tensors[k].offset - un->off));
      const float *chunk = buf + (size_t)p->pc.dp_rank * un->chunk;
      if (visible) model_dev_copy(p->dev, p->shard_params + un->soff, chunk, un->chunk * sizeof(float));
      else r = model_dev_upload(p->dev, p->shard_params + un->soff, chunk, un->chunk * sizeof(float));
    }
  }
  model_dev_host_free(p->dev, stage);
  if (r == NEWT_OK) r = model_dev_sync(p->dev);
  return r;
}

#define PAR_REC_MAX (2 * sizeof(double)) /* a step's totals: squares and loss */

/* The micro-batches a stage keeps in flight on 1F1B: at most pp - stage, and at most those
 * of data-parallel rank 0, which has the most. */
static int acts_in_flight(const model_train_config *cfg, const model_par_config *pc) {
  int64_t first_count, count;
  model_batch_slice(cfg->batch, 0, pc->dp, &first_count, &count);
  int M = pc->max_micro > 0 ? pc->max_micro : (int)((count + cfg->micro_batch - 1) / cfg->micro_batch);
  return pc->pp - pc->pp_rank < M ? pc->pp - pc->pp_rank : M;
}

newt_result_t model_par_relayout(model_par *p, const model_par_config *pc) {
  const model_par_config *o = &p->pc;
  if (pc->zero != 0 || o->zero != 0 || pc->tp != o->tp || pc->pp != o->pp || pc->tp_rank != o->tp_rank ||
      pc->pp_rank != o->pp_rank || (pc->dev && pc->dev != p->dev) || acts_in_flight(&p->cfg, pc) != p->nacts)
    return NEWT_ERR(NEWT_ERR_UNSUPPORTED, "model_par_relayout: the layout changes more than the data-parallel size");
  NEWT_CHECK(model_par_config_check(pc, &p->cfg));
  p->pc.dp = pc->dp;
  p->pc.dp_rank = pc->dp_rank;
  return NEWT_OK;
}

newt_result_t model_par_alloc(model_par *p, const model_train_config *cfg, const model_par_config *pc) {
  memset(p, 0, sizeof *p);
  NEWT_CHECK(model_par_config_check(pc, cfg));
  p->cfg = *cfg;
  p->pc = *pc;
  p->dev = pc->dev ? pc->dev : model_dev_cpu();
  p->first = pc->pp_rank == 0;
  p->last = pc->pp_rank == pc->pp - 1;
  model_par_stage_layers((int)cfg->model.layers, pc->pp, pc->pp_rank, &p->l0, &p->l1);
  model_threads_set(cfg->threads);
  newt_result_t r;
  NEWT_CHECK_GOTO(model_layout_init(&p->global, &cfg->model), r, fail);
  NEWT_CHECK_GOTO(build_tables(p), r, fail);
  size_t total = p->local.total;
  int zero = pc->zero;
  p->reqs = calloc((size_t)p->nunits, sizeof *p->reqs);
  if (!p->reqs) {
    r = NEWT_ERR(NEWT_ERR_NOMEM, "model_par: out of memory for %d buckets", p->nunits);
    goto fail;
  }
  NEWT_CHECK_GOTO(dev_floats(p, total, &p->grads), r, fail);
  if (zero < 3) NEWT_CHECK_GOTO(dev_floats(p, total, &p->params), r, fail);
  if (zero == 0) {
    p->shard_params = p->params;
    p->shard_grads = p->grads;
  } else if (zero == 3) {
    NEWT_CHECK_GOTO(dev_floats(p, p->shard_len, &p->shard_params), r, fail);
    NEWT_CHECK_GOTO(dev_floats(p, p->shard_len, &p->shard_grads), r, fail);
  }
  if (zero == 3) {
    for (int u = 0; u < p->nunits; u++)
      if (p->units[u].len > p->gather_len) p->gather_len = p->units[u].len;
    for (int i = 0; i < 2; i++) {
      p->gathered[i] = -1;
      NEWT_CHECK_GOTO(dev_floats(p, p->gather_len, &p->gather[i]), r, fail);
    }
  }
  float *m = NULL, *v = NULL;
  NEWT_CHECK_GOTO(dev_floats(p, p->shard_len, &m), r, fail);
  if ((r = dev_floats(p, p->shard_len, &v)) != NEWT_OK) {
    model_dev_free(p->dev, m);
    goto fail;
  }
  if ((r = model_adamw_init_with(&p->opt, &cfg->optim, 0, p->shard_len, m, v)) != NEWT_OK) {
    model_dev_free(p->dev, m);
    model_dev_free(p->dev, v);
    goto fail;
  }
  /* activations: the micro-batches a stage has in flight on 1F1B */
  int T = cfg->seq_len, mb = cfg->micro_batch;
  p->nacts = acts_in_flight(cfg, pc);
  p->acts = calloc((size_t)p->nacts, sizeof *p->acts);
  if (!p->acts) {
    r = NEWT_ERR(NEWT_ERR_NOMEM, "model_par: out of memory");
    goto fail;
  }
  for (int i = 0; i < p->nacts; i++)
    NEWT_CHECK_GOTO(model_acts_init_dev(&p->acts[i], p->dev, &cfg->model, pc->tp, mb, T, p->l0, p->l1, p->last), r,
                    fail);
  NEWT_CHECK_GOTO(model_scratch_init_dev(&p->scratch, p->dev, &cfg->model, mb, T), r, fail);
  if (p->last && pc->tp > 1) NEWT_CHECK_GOTO(dev_floats(p, 3 * (size_t)mb * T, &p->ce), r, fail);
  NEWT_CHECK_GOTO(model_dev_alloc(p->dev, PAR_REC_MAX, &p->rec), r, fail);
  NEWT_CHECK_GOTO(model_dev_host_alloc(p->dev, PAR_REC_MAX, &p->host_rec), r, fail);
  void *acc;
  NEWT_CHECK_GOTO(model_dev_alloc(p->dev, 2 * sizeof(double), &acc), r, fail);
  p->loss_acc = acc; /* [1]: the losses of ZeRO 3's empty micro-batches, thrown away */
  return NEWT_OK;
fail:
  model_par_free(p);
  return r;
}

newt_result_t model_par_init_weights(model_par *p) {
  model_dev_zero(p->dev, p->opt.m, p->opt.len * sizeof *p->opt.m);
  model_dev_zero(p->dev, p->opt.v, p->opt.len * sizeof *p->opt.v);
  p->opt.t = 0;
  p->step = 0;
  return init_weights(p);
}

newt_result_t model_par_init(model_par *p, const model_train_config *cfg, const model_par_config *pc) {
  NEWT_CHECK(model_par_alloc(p, cfg, pc));
  newt_result_t r = init_weights(p);
  if (r != NEWT_OK) model_par_free(p);
  return r;
}

void model_par_free(model_par *p) {
  model_dev *d = p->dev;
  if (d) {
    for (int i = 0; p->acts && i < p->nacts; i++) model_acts_free(&p->acts[i]);
    model_scratch_free(&p->scratch);
    model_dev_free(d, p->opt.m);
    model_dev_free(d, p->opt.v);
    if (p->pc.zero == 3) {
      model_dev_free(d, p->shard_params);
      model_dev_free(d, p->shard_grads);
    }
    model_dev_free(d, p->params);
    model_dev_free(d, p->grads);
    model_dev_free(d, p->gather[0]);
    model_dev_free(d, p->gather[1]);
    model_dev_free(d, p->ce);
    model_dev_free(d, p->rec);
    model_dev_host_free(d, p->host_rec);
    model_dev_free(d, p->loss_acc);
  }
  model_adamw_free(&p->opt);
  free(p->acts);
  free(p->reqs);
  free(p->units);
  free(p->of_global);
  free(p->ten);
  free(p->shard.tensors);
  free(p->local.tensors);
  model_layout_free(&p->global);
  memset(p, 0, sizeof *p);
}

void model_par_memory(const model_par *p, size_t *state, size_t *acts) {
  size_t total = p->local.total, floats = total + (p->params ? total : 0) + 2 * p->shard_len + 2 * p->gather_len;
  if (p->pc.zero == 3) floats += 2 * p->shard_len; /* shard parameters and gradients */
  *state = floats * sizeof(float);
  *acts = p->scratch.bytes;
  for (int i = 0; i < p->nacts; i++) *acts += p->acts[i].bytes;
}

/* ---- pieces ------------------------------------------------------------------------------------ */

#define PIECE_NAME (MODEL_NAME_MAX + 8)

typedef struct piece_list {
  model_par_piece *v; /* NULL: count only */
  char (*names)[PIECE_NAME];
  size_t n;
} piece_list;

/* Elements [a, e) of local tensor k (relative to its start), whose element a is at data:
 * one piece per box they cross. */
static void add_range(piece_list *pl, const model_par *p, size_t k, model_par_kind kind, size_t a, size_t e,
                      float *data, int primary, int derived) {
  static const char *const prefix[] = {"", MODEL_PAR_NAME_M, MODEL_PAR_NAME_V};
  const model_par_tensor *pt = &p->ten[k];
  const model_tensor *g = pt->global;
  for (int b = 0; b < pt->nbox; b++) {
    const model_par_box *bx = &pt->box[b];
    size_t b0 = bx->local_off, b1 = b0 + bx->rows * bx->cols;
    size_t s = a > b0 ? a : b0, t = e < b1 ? e : b1;
    if (s >= t) continue;
    if (pl->v) {
      model_par_piece *pc = &pl->v[pl->n];
      char *name = pl->names[pl->n];
      snprintf(name, PIECE_NAME, "%s%s", prefix[kind], g->name);
      *pc = (model_par_piece){.kind = kind, .tensor = g, .data = data + (s - a), .primary = primary, .derived = derived};
      pc->desc = (newt_tensor_desc){.name = name, .dtype = NEWT_F32, .ndim = g->ndim,
                                    .shape = {(int64_t)g->shape[0], (int64_t)g->shape[1]}};
      newt_slice *sl = &pc->slice;
      memset(sl, 0, sizeof *sl);
      sl->ndim = g->ndim;
      sl->offset[0] = (int64_t)bx->row0;
      sl->shape[0] = (int64_t)bx->rows;
      if (g->ndim == 2) {
        sl->offset[1] = (int64_t)bx->col0;
        sl->shape[1] = (int64_t)bx->cols;
      }
      sl->begin = (int64_t)(s - b0);
      sl->end = (int64_t)(t - b0);
    }
    pl->n++;
  }
}

/* The part of local tensor k in this rank's chunk: from `full` (a local-layout buffer) or
 * from `compact` (the shard buffers' order). */
static void add_chunk(piece_list *pl, const model_par *p, size_t k, model_par_kind kind, float *full, float *compact,
                      int primary) {
  size_t a, e, at, off = p->local.tensors[k].offset;
  if (par_chunk_part(p, k, &a, &e, &at))
    add_range(pl, p, k, kind, a - off, e - off, full ? full + a : compact + at, primary, 0);
}

static void list_pieces(const model_par *p, piece_list *pl) {
  int dp0 = p->pc.dp_rank == 0, zero = p->pc.zero;
  for (size_t k = 0; k < p->local.n; k++) {
    int prim = par_primary(p, &p->local.tensors[k]);
    if (zero == 3) {
      add_chunk(pl, p, k, MODEL_PAR_PARAM, NULL, p->shard_params, prim);
    } else if (zero) { /* the owned chunk, and the whole tensor the all-gather rebuilds */
      add_chunk(pl, p, k, MODEL_PAR_PARAM, p->params, NULL, prim);
      add_range(pl, p, k, MODEL_PAR_PARAM, 0, p->local.tensors[k].size, p->params + p->local.tensors[k].offset, 0, 1);
    } else {
      add_range(pl, p, k, MODEL_PAR_PARAM, 0, p->local.tensors[k].size, p->params + p->local.tensors[k].offset,
                prim && dp0, 0);
    }
  }
  for (int kind = MODEL_PAR_ADAM_M; kind <= MODEL_PAR_ADAM_V; kind++) {
    float *buf = kind == MODEL_PAR_ADAM_M ? p->opt.m : p->opt.v;
    for (size_t k = 0; k < p->local.n; k++) {
      int prim = par_primary(p, &p->local.tensors[k]);
      if (zero) add_chunk(pl, p, k, (model_par_kind)kind, NULL, buf, prim);
      else add_range(pl, p, k, (model_par_kind)kind, 0, p->local.tensors[k].size, buf + p->local.tensors[k].offset,
                     prim && dp0, 0);
    }
  }
}

newt_result_t model_par_pieces(const model_par *p, model_par_piece **out, size_t *n) {
  piece_list pl = {0};
  list_pieces(p, &pl);
  size_t count = pl.n;
  void *block = malloc((count ? count : 1) * (sizeof(model_par_piece) + PIECE_NAME));
  NEWT_CHECK_ALLOC(block);
  pl = (piece_list){.v = block, .names = (char (*)[PIECE_NAME])((model_par_piece *)block + count)};
  list_pieces(p, &pl);
  *out = block;
  *n = count;
  return NEWT_OK;
}
