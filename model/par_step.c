/* One optimizer step of a parallel rank (see parallel.h).
 *
 * Schedule (1F1B, Megatron's non-interleaved one). Stage s of pp runs its M micro-batches as
 *
 *   warmup    i < w = min(pp - s - 1, M):  RF(i) F(i) SF(i)
 *   steady    k < M - w:                   RF(w+k) F(w+k) RB(k) SF(w+k) B(k) SB(k)
 *   cooldown  k >= M - w:                  RB(k) B(k) SB(k)
 *
 * with RF/SF receive/send the activations from/to the previous/next stage and RB/SB the
 * gradients. Megatron posts SF(w+k) and RB(k) together (and SB(k) with RF(w+k+1)); with
 * blocking point-to-point calls the receive of a gradient goes first and the send of a
 * gradient goes first, which gives both ends of every link the same order of messages
 * (F0..F(w-1), B0, F(w), B1, F(w+1), ...), so no send waits on a peer that waits on it,
 * however small the transport's buffers. A stage keeps the activations of the micro-batches
 * in flight (at most w + 1) in slots i % nacts.
 *
 * Buckets. During B(M-1), the last backward of the step on this stage, each bucket whose
 * gradients are complete goes to the data-parallel group at once (async; all-reduce, or
 * reduce-scatter into the shard for ZeRO 2/3): lnf after the head, each layer after its
 * backward, wpe after the embedding backward, wte then too (pp = 1) or after the tied
 * embedding's all-reduce between the first and last stage (pp > 1, blocking, after the
 * schedule). All are waited before the optimizer.
 *
 * ZeRO 3 gathers a bucket's parameters (all-gather over the data-parallel group) before a
 * piece needs them, into one of two working buffers (least recently used goes); the
 * buffers are forgotten at the start of each step and after the update. The gathers are
 * collectives, so every data-parallel rank runs as many micro-batches: where the global
 * batch gives ranks unequal numbers (one more on the first ones), the others add *empty*
 * micro-batches -- one sequence, its logits' gradient zero, its loss counted nowhere -- which
 * gather what a real one gathers and add exact zeros to the gradients.
 *
 * End of the step: one all-gather over the world of each rank's (sum of squared gradients,
 * sum of token losses), summed in rank order (model_par_grads returns them; model_par_step
 * gathers them over the host channel, newt's worker inside newt_step_commit with its own
 * control values); then model_par_apply: clip, AdamW over the shard buffers, and for
 * ZeRO 1/2 the all-gather of the updated chunks into the full parameters. ZeRO 1/2 update the
 * owned chunks in place in the full buffers (moments in the shard buffers); only ZeRO 3 keeps
 * the parameters and the reduced gradients of its chunks apart.
 *
 * Device. Every buffer is the rank's device memory and every op a kernel of it (model/dev.h);
 * the loss and the squares are summed on the device into device doubles, and the host reads
 * one thing per step: the all-gathered end-of-step record, downloaded into host staging. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "model/par_internal.h"

/* ---- buckets and ZeRO 3 gathers ------------------------------------------------------------ */

/* The unit of key (a layer, or MODEL_PAR_UNIT_*), or -1. */
static int unit_of(const model_par *p, int key) {
  for (int u = 0; u < p->nunits; u++)
    if (p->units[u].layer == key) return u;
  return -1;
}

/* Sends bucket u to the data-parallel group (async): all-reduced in place (ZeRO 0/1),
 * reduce-scattered in place (ZeRO 2: the owned chunk of grads) or into the shard (ZeRO 3). */
static newt_result_t launch_bucket(model_par *p, const model_par_comms *c, int u) {
  if (u < 0 || p->reqs[u]) return NEWT_OK;
  const model_par_unit *un = &p->units[u];
  float *g = p->grads + un->off;
  if (!c->dp) { /* one data-parallel rank: the chunk is the bucket */
    if (p->pc.zero == 3) model_dev_copy(p->dev, p->shard_grads + un->soff, g, un->len * sizeof(float));
    return NEWT_OK;
  }
  if (p->pc.zero >= 2) {
    float *dst = p->pc.zero == 3 ? p->shard_grads + un->soff : g + (size_t)p->pc.dp_rank * un->chunk;
    return comm_reduce_scatter_async(c->dp, g, dst, un->chunk, NEWT_F32, COMM_SUM, &p->reqs[u]);
  }
  return comm_allreduce_async(c->dp, g, g, un->len, NEWT_F32, COMM_SUM, &p->reqs[u]);
}

/* Waits for every bucket in flight; returns the first error. */
static newt_result_t wait_buckets(model_par *p) {
  newt_result_t res = NEWT_OK;
  char msg[512] = "";
  for (int u = 0; u < p->nunits; u++) {
    if (!p->reqs[u]) continue;
    newt_result_t r = comm_wait(p->reqs[u]);
    p->reqs[u] = NULL;
    if (r != NEWT_OK && res == NEWT_OK) {
      res = r;
      snprintf(msg, sizeof msg, "%s", newt_errmsg());
    }
  }
  return res == NEWT_OK ? NEWT_OK : NEWT_ERR(res, "%s", msg);
}

static void forget_gathers(model_par *p) {
  p->gathered[0] = p->gathered[1] = -1;
}

/* ZeRO 3: bucket u's parameters into a working buffer (no-op otherwise). */
static newt_result_t gather_unit(model_par *p, const model_par_comms *c, int u) {
  if (p->pc.zero < 3 || u < 0) return NEWT_OK;
  for (int i = 0; i < 2; i++)
    if (p->gathered[i] == u) {
      p->gather_next = 1 - i;
      return NEWT_OK;
    }
  int i = p->gather_next;
  const model_par_unit *un = &p->units[u];
  p->gathered[i] = -1;
  if (c->dp) NEWT_CHECK(comm_allgather(c->dp, p->shard_params + un->soff, p->gather[i], un->chunk, NEWT_F32));
  else model_dev_copy(p->dev, p->gather[i], p->shard_params + un->soff, un->len * sizeof(float));
  p->gathered[i] = u;
  p->gather_next = 1 - i;
  return NEWT_OK;
}

/* ZeRO 1/2: every rank's updated chunks into the full parameters (in place). */
static newt_result_t gather_params(model_par *p, const model_par_comms *c) {
  if (!c->dp) return NEWT_OK;
  newt_result_t res = NEWT_OK;
  for (int u = 0; u < p->nunits && res == NEWT_OK; u++) {
    const model_par_unit *un = &p->units[u];
    float *b = p->params + un->off;
    res = comm_allgather_async(c->dp, b + (size_t)p->pc.dp_rank * un->chunk, b, un->chunk, NEWT_F32, &p->reqs[u]);
  }
  newt_result_t w = wait_buckets(p);
  return res != NEWT_OK ? res : w;
}

/* ---- the schedule ------------------------------------------------------------------------------ */

typedef struct sched {
  model_par *p;
  const model_par_comms *c;
  const int32_t *inputs, *targets;
  int count, M, mb, T, C;
  int own; /* micro-batches of this rank's samples; [own, M): empty ones (ZeRO 3) */
  float dscale;
} sched;

static model_acts *slot_of(sched *s, int i) {
  model_acts *a = &s->p->acts[i % s->p->nacts];
  if (i >= s->own) a->B = 1; /* an empty micro-batch: one sequence */
  else a->B = s->count - i * s->mb < s->mb ? s->count - i * s->mb : s->mb;
  return a;
}

static size_t boundary_floats(sched *s, int i) { return (size_t)slot_of(s, i)->B * s->T * s->C; }

static newt_result_t recv_forward(sched *s, int i) {
  if (s->p->first) return NEWT_OK;
  return comm_recv(s->c->pp, slot_of(s, i)->x0, boundary_floats(s, i), NEWT_F32, s->p->pc.pp_rank - 1);
}

static newt_result_t send_forward(sched *s, int i) {
  model_par *p = s->p;
  if (p->last) return NEWT_OK;
  model_acts *a = slot_of(s, i);
  return comm_send(s->c->pp, a->blk[p->l1 - 1 - p->l0].res2, boundary_floats(s, i), NEWT_F32, p->pc.pp_rank + 1);
}

static newt_result_t recv_backward(sched *s, int i) {
  if (s->p->last) return NEWT_OK;
  return comm_recv(s->c->pp, s->p->scratch.dres, boundary_floats(s, i), NEWT_F32, s->p->pc.pp_rank + 1);
}

static newt_result_t send_backward(sched *s, int i) {
  if (s->p->first) return NEWT_OK;
  return comm_send(s->c->pp, s->p->scratch.dres, boundary_floats(s, i), NEWT_F32, s->p->pc.pp_rank - 1);
}

static newt_result_t forward(sched *s, int i) {
  model_par *p = s->p;
  const model_par_comms *c = s->c;
  model_acts *a = slot_of(s, i);
  int empty = i >= s->own;
  size_t at = empty ? 0 : (size_t)i * s->mb * s->T; /* an empty one reads the first sequence */
  if (p->first) {
    NEWT_CHECK(gather_unit(p, c, unit_of(p, MODEL_PAR_UNIT_WTE)));
    NEWT_CHECK(gather_unit(p, c, unit_of(p, MODEL_PAR_UNIT_WPE)));
    NEWT_CHECK(par_embed_forward(p, c->tp, a, s->inputs + at));
  }
  for (int l = p->l0; l < p->l1; l++) {
    NEWT_CHECK(gather_unit(p, c, unit_of(p, l)));
    NEWT_CHECK(par_block_forward(p, c->tp, a, &p->scratch, l));
  }
  if (p->last) {
    NEWT_CHECK(gather_unit(p, c, unit_of(p, MODEL_PAR_UNIT_LNF)));
    NEWT_CHECK(gather_unit(p, c, unit_of(p, MODEL_PAR_UNIT_WTE)));
    NEWT_CHECK(par_head_forward(p, c->tp, a, s->targets + at, s->dscale, p->loss_acc + empty));
    if (empty) /* its logits' gradient: zero, so its backward adds exact zeros */
      model_dev_zero(p->dev, a->logits, (size_t)a->B * s->T * (p->cfg.model.vocab / p->pc.tp) * sizeof(float));
  }
  return NEWT_OK;
}

/* The backward of micro-batch i; the last one of the step launches the buckets. */
static newt_result_t backward(sched *s, int i) {
  model_par *p = s->p;
  const model_par_comms *c = s->c;
  model_acts *a = slot_of(s, i);
  int final = i == s->M - 1;
  if (p->last) {
    NEWT_CHECK(gather_unit(p, c, unit_of(p, MODEL_PAR_UNIT_LNF)));
    NEWT_CHECK(gather_unit(p, c, unit_of(p, MODEL_PAR_UNIT_WTE)));
    NEWT_CHECK(par_head_backward(p, c->tp, a, &p->scratch));
    if (final) NEWT_CHECK(launch_bucket(p, c, unit_of(p, MODEL_PAR_UNIT_LNF)));
  }
  for (int l = p->l1 - 1; l >= p->l0; l--) {
    NEWT_CHECK(gather_unit(p, c, unit_of(p, l)));
    NEWT_CHECK(par_block_backward(p, c->tp, a, &p->scratch, l));
    if (final) NEWT_CHECK(launch_bucket(p, c, unit_of(p, l)));
  }
  if (p->first) {
    par_embed_backward(p, a, &p->scratch);
    if (final) NEWT_CHECK(launch_bucket(p, c, unit_of(p, MODEL_PAR_UNIT_WPE)));
    if (final && p->pc.pp == 1) NEWT_CHECK(launch_bucket(p, c, unit_of(p, MODEL_PAR_UNIT_WTE)));
  }
  return NEWT_OK;
}

static newt_result_t run_schedule(sched *s) {
  int M = s->M, w = s->p->pc.pp - s->p->pc.pp_rank - 1;
  if (w > M) w = M;
  for (int i = 0; i < w; i++) {
    NEWT_CHECK(recv_forward(s, i));
    NEWT_CHECK(forward(s, i));
    NEWT_CHECK(send_forward(s, i));
  }
  for (int k = 0; k < M - w; k++) {
    NEWT_CHECK(recv_forward(s, w + k));
    NEWT_CHECK(forward(s, w + k));
    NEWT_CHECK(recv_backward(s, k));
    NEWT_CHECK(send_forward(s, w + k));
    NEWT_CHECK(backward(s, k));
    NEWT_CHECK(send_backward(s, k));
  }
  for (int k = M - w; k < M; k++) {
    NEWT_CHECK(recv_backward(s, k));
    NEWT_CHECK(backward(s, k));
    NEWT_CHECK(send_backward(s, k));
  }
  /* the tied embedding: the first stage's and the head's gradients of wte add up */
  model_par *p = s->p;
  if (s->c->emb) {
    const model_tensor *wte = &p->local.tensors[par_local_index(p, MODEL_WTE, 0)];
    NEWT_CHECK(comm_allreduce(s->c->emb, p->grads + wte->offset, p->grads + wte->offset, wte->size, NEWT_F32,
                              COMM_SUM));
  }
  return launch_bucket(p, s->c, unit_of(p, MODEL_PAR_UNIT_WTE));
}

/* ---- the step ---------------------------------------------------------------------------------- */

static newt_result_t check_step(const model_par *p, const model_par_comms *c, int count) {
  const model_par_config *pc = &p->pc;
  int64_t first, want;
  model_batch_slice(p->cfg.batch, pc->dp_rank, pc->dp, &first, &want);
  if (pc->max_micro > 0 && count >= 1 && count <= (int64_t)pc->max_micro * p->cfg.micro_batch) return NEWT_OK;
  if (count != want)
    return NEWT_ERR(NEWT_ERR_INVALID,
                    "model_par_step: %d sequences, but data-parallel rank %d of %d takes %lld of the global batch of %d",
                    count, pc->dp_rank, pc->dp, (long long)want, p->cfg.batch);
  int n = pc->tp * pc->pp * pc->dp;
  if ((n > 1 && (!c || !c->world)) || (c && c->world && comm_size(c->world) != n) ||
      (pc->tp > 1 && !c->tp) || (pc->dp > 1 && !c->dp) || (pc->pp > 1 && (!c->pp || ((p->first || p->last) && !c->emb))))
    return NEWT_ERR(NEWT_ERR_INVALID, "model_par_step: the communicators do not match the layout tp %d, pp %d, dp %d "
                    "(build them with model_par_comms_split)", pc->tp, pc->pp, pc->dp);
  return NEWT_OK;
}

/* Squared gradients this rank counts toward the global norm (each element of the model
 * once), added on the device into *acc (one device double). */
static void grad_sqnorm(const model_par *p, double *acc) {
  const model_layout *lay = &p->local;
  model_dev *d = p->dev;
  int zero = p->pc.zero;
  if (!zero) {
    if (p->pc.dp_rank != 0) return; /* replicas of dp rank 0's */
    int all = 1;
    for (size_t k = 0; k < lay->n && all; k++) all = par_primary(p, &lay->tensors[k]);
    if (all) { /* the gaps are zeros: model_trainer's sum */
      model_k_sqnorm(d, acc, p->grads, lay->total);
      return;
    }
  }
  for (size_t k = 0; k < lay->n; k++) {
    const model_tensor *t = &lay->tensors[k];
    size_t a, e, at;
    if (!par_primary(p, t)) continue;
    if (!zero) model_k_sqnorm(d, acc, p->grads + t->offset, t->size);
    else if (par_chunk_part(p, k, &a, &e, &at))
      model_k_sqnorm(d, acc, zero == 3 ? p->shard_grads + at : p->grads + a, e - a);
  }
}

/* AdamW over what this rank updates: the whole local buffer (ZeRO 0), each owned chunk of
 * the full buffers with its moments in the shard buffers (ZeRO 1/2: one view of the optimizer
 * per bucket), or the shard buffers (ZeRO 3). */
static void update(model_par *p, double lr, float grad_scale) {
  model_dev *d = p->dev;
  if (p->pc.zero == 0) {
    model_k_adamw(d, &p->opt, &p->local, p->params, p->grads, lr, grad_scale);
  } else if (p->pc.zero == 3) {
    model_k_adamw(d, &p->opt, &p->shard, p->shard_params, p->shard_grads, lr, grad_scale);
  } else {
    for (int u = 0; u < p->nunits; u++) {
      const model_par_unit *un = &p->units[u];
      model_adamw view = p->opt;
      view.off = un->off + (size_t)p->pc.dp_rank * un->chunk;
      view.len = un->chunk;
      view.m = p->opt.m + un->soff;
      view.v = p->opt.v + un->soff;
      model_k_adamw(d, &view, &p->local, p->params, p->grads, lr, grad_scale);
    }
    p->opt.t++;
  }
}

newt_result_t model_par_grads(model_par *p, const model_par_comms *c, const int32_t *inputs,
                              const int32_t *targets, int count, double part[2]) {
  static const model_par_comms none = {0};
  if (!c) c = &none;
  NEWT_CHECK(check_step(p, c, count));
  p->t_step = newt_now_s();
  if (p->params_stale) { /* a previous step's all-gather failed: finish it */
    NEWT_CHECK(gather_params(p, c));
    p->params_stale = 0;
  }
  int T = p->cfg.seq_len, mb = p->cfg.micro_batch;
  sched s = {.p = p, .c = c, .inputs = inputs, .targets = targets, .count = count, .mb = mb, .T = T,
             .C = (int)p->cfg.model.channels, .M = (count + mb - 1) / mb,
             .dscale = 1.0f / (float)((int64_t)p->cfg.batch * T)};
  s.own = s.M;
  if (p->pc.zero == 3 && p->pc.dp > 1) { /* as many as the rank with the most */
    int64_t f, most;
    model_batch_slice(p->cfg.batch, 0, p->pc.dp, &f, &most);
    s.M = p->pc.max_micro > 0 ? p->pc.max_micro : (int)((most + mb - 1) / mb);
  }
  model_dev_zero(p->dev, p->grads, p->local.total * sizeof(float));
  model_dev_zero(p->dev, p->rec, 2 * sizeof(double));
  model_dev_zero(p->dev, p->loss_acc, 2 * sizeof(double));
  forget_gathers(p);
  newt_result_t r = run_schedule(&s);
  newt_result_t w = wait_buckets(p); /* also when the schedule failed: no request is left behind */
  if (r == NEWT_OK) r = w;
  for (int i = 0; i < p->nacts; i++) p->acts[i].B = mb;
  NEWT_CHECK(r);
  /* this rank's squares and loss, as doubles: the step's one download */
  grad_sqnorm(p, (double *)p->rec);
  if (p->last && p->pc.tp_rank == 0) model_dev_copy(p->dev, (double *)p->rec + 1, p->loss_acc, sizeof(double));
  NEWT_CHECK(model_dev_download(p->dev, p->host_rec, p->rec, 2 * sizeof(double)));
  memcpy(part, p->host_rec, 2 * sizeof(double));
  return NEWT_OK;
}

newt_result_t model_par_apply(model_par *p, const model_par_comms *c, const double sums[2], model_step_info *info) {
  static const model_par_comms none = {0};
  if (!c) c = &none;
  double norm = sqrt(sums[0]);
  double lr = model_lr_at(&p->cfg.optim, p->step);
  update(p, lr, model_clip_scale(norm, p->cfg.optim.grad_clip));
  p->step++;
  forget_gathers(p);
  if (info) {
    int64_t tokens = (int64_t)p->cfg.batch * p->cfg.seq_len;
    info->step = p->step;
    info->loss = sums[1] / (double)tokens;
    info->lr = lr;
    info->grad_norm = norm;
    info->tokens = tokens;
  }
  if (p->pc.zero == 1 || p->pc.zero == 2) {
    newt_result_t r = gather_params(p, c);
    if (r != NEWT_OK) {
      p->params_stale = 1;
      return r;
    }
  }
  if (info) info->ms = (newt_now_s() - p->t_step) * 1e3;
  return NEWT_OK;
}

/* The step's totals over the world: every rank's two doubles, gathered over the world's
 * host channel and summed in rank order, so every rank gets the same bits, and one rank
 * alone gets exactly its own (model_trainer's values). */
static newt_result_t sum_world(const model_par_comms *c, const double part[2], double sums[2]) {
  if (!c || !c->world) {
    sums[0] = part[0], sums[1] = part[1];
    return NEWT_OK;
  }
  comm_t *h = comm_host_channel(c->world);
  int n = comm_size(h);
  double *all = malloc((size_t)n * 2 * sizeof *all);
  NEWT_CHECK_ALLOC(all);
  newt_result_t r = comm_allgather(h, part, all, 2 * sizeof(double), NEWT_U8);
  sums[0] = sums[1] = 0;
  for (int q = 0; r == NEWT_OK && q < n; q++) {
    sums[0] += all[2 * q];
    sums[1] += all[2 * q + 1];
  }
  free(all);
  return r;
}

newt_result_t model_par_step(model_par *p, const model_par_comms *c, const int32_t *inputs,
                             const int32_t *targets, int count, model_step_info *info) {
  double part[2], sums[2];
  NEWT_CHECK(model_par_grads(p, c, inputs, targets, count, part));
  NEWT_CHECK(sum_world(c, part, sums));
  return model_par_apply(p, c, sums, info);
}
