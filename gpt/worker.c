/* `newt worker`'s trainer: the built-in GPT as a program on libnewt (gpt/gpt.h, newt.h).
 *
 * It joins, builds its trainer configuration from the job's spec and opens its device; then
 * it loops on newt_step_begin. On each generation it makes the parallel trainer
 * (model/parallel.h) for the layout it is given (kept when the layout is the same, or differs
 * only in its data-parallel size under ZeRO 0: model_par_relayout, nothing moved), takes
 * the trainer's groups from newt's (the embedding group of a pipeline's first and last
 * stage split from the world), declares every piece of the trainer as the state, and lets
 * newt restore it (a new job initialises the weights from the seed). A step: its samples
 * from the loader, the gradients (model_par_grads), newt_step_commit with the step's
 * squared gradients and loss (summed over the world in rank order: the bits of
 * model_par_step), the update (model_par_apply), newt_step_end. Any collective that fails
 * sends it back to newt_step_begin, which recovers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "gpt/ckpt.h"
#include "gpt/gpt.h"
#include "job/ending.h"
#include "job/spec.h"
#include "model/dev.h"
#include "model/loader.h"
#include "model/ops.h"
#include "model/parallel.h"
#include "worker/bridge.h"

typedef struct gpt_worker {
  newt_ctx *ctx;
  newt_spec spec;
  model_train_config tcfg;
  char data_desc[SPEC_PATH_MAX + 32];
  model_tokens tok;
  int have_tok;
  model_loader ld;
  model_dev *dev;
  newt_memory mem; /* newt's copies of the state through the device (not host memory) */
  model_par par, old;
  int have_par, have_old;
  int par_restored; /* par holds the state (a restore filled it); else old does, if any */
  model_par_comms comms;
  int32_t *inputs, *targets;
} gpt_worker;

/* --- the device's memory for newt ----------------------------------------------------------- */

static newt_result_t m_alloc(void *ctx, size_t bytes, void **out) { return model_dev_alloc(ctx, bytes, out); }
static void m_free(void *ctx, void *p) { model_dev_free(ctx, p); }
static newt_result_t m_host_alloc(void *ctx, size_t bytes, void **out) { return model_dev_host_alloc(ctx, bytes, out); }
static void m_host_free(void *ctx, void *p) { model_dev_host_free(ctx, p); }
static void m_copy(void *ctx, void *dst, const void *src, size_t bytes, int kind) {
  if (kind == 0) model_dev_copy(ctx, dst, src, bytes);
  else if (kind == 1) model_dev_download_async(ctx, dst, src, bytes);
  else model_dev_upload_async(ctx, dst, src, bytes);
}
static newt_result_t m_sync(void *ctx) { return model_dev_sync(ctx); }

void gpt_dev_memory(model_dev *dev, newt_memory *out) {
  *out = (newt_memory){.size = sizeof *out, .ctx = dev, .host_visible = model_dev_host_visible(dev),
                       .alloc = m_alloc, .free = m_free, .host_alloc = m_host_alloc, .host_free = m_host_free,
                       .copy = m_copy, .sync = m_sync};
}

/* --- the state document ------------------------------------------------------------------- */

/* The GPT's fields of a checkpoint's state: what newt train writes too (gpt/ckpt.h), but the
 * step and cursor, which are newt's. */
static char *doc_write(void *arg, int64_t step) {
  gpt_worker *g = arg;
  cJSON *state = NULL;
  if (gpt_ckpt_train_state(&g->tcfg, step, (uint64_t)step * (uint64_t)g->spec.global_batch, step, g->data_desc,
                           &state) != NEWT_OK)
    return NULL;
  char *json = cJSON_PrintUnformatted(state); /* newt.h's document is text: the library's edge */
  cJSON_Delete(state);
  return json;
}

static newt_result_t doc_check(void *arg, const char *state_json, int64_t step) {
  gpt_worker *g = arg;
  return gpt_ckpt_check_state(&g->tcfg, g->data_desc, state_json, step);
}

/* --- a generation ----------------------------------------------------------------------------- */

static int same_layout(const model_par_config *a, const model_par_config *b) {
  return a->tp == b->tp && a->pp == b->pp && a->dp == b->dp && a->zero == b->zero && a->tp_rank == b->tp_rank &&
         a->pp_rank == b->pp_rank && a->dp_rank == b->dp_rank && a->max_micro == b->max_micro;
}

/* The trainer's groups: newt's, and the tied embedding's (first and last stage of each
 * pipeline), split from the world. */
static newt_result_t groups(gpt_worker *g, const newt_layout *l, const model_par_config *pc) {
  memset(&g->comms, 0, sizeof g->comms);
  g->comms.world = worker_comm_of(l->world_comm);
  g->comms.tp = worker_comm_of(l->tp_comm);
  g->comms.dp = worker_comm_of(l->dp_comm);
  g->comms.pp = worker_comm_of(l->pp_comm);
  if (pc->pp < 2) return NEWT_OK;
  int color, key;
  model_par_group_color(pc, MODEL_PAR_EMB, &color, &key);
  newt_comm *emb = NULL;
  NEWT_CHECK(newt_comm_split(l->world_comm, color, key, &emb));
  g->comms.emb = worker_comm_of(emb);
  return NEWT_OK;
}

/* Declares every piece of the trainer as newt state. */
static newt_result_t declare(gpt_worker *g) {
  model_par_piece *pp = NULL;
  size_t n = 0;
  NEWT_CHECK(model_par_pieces(&g->par, &pp, &n));
  int device = !model_dev_host_visible(g->dev);
  newt_result_t r = NEWT_OK;
  for (size_t i = 0; r == NEWT_OK && i < n; i++) {
    const model_par_piece *p = &pp[i];
    int64_t offset[NEWT_SLICE_MAX_DIMS], extent[NEWT_SLICE_MAX_DIMS];
    for (int d = 0; d < p->slice.ndim; d++) offset[d] = p->slice.offset[d], extent[d] = p->slice.shape[d];
    newt_tensor t;
    newt_tensor_init(&t);
    t.name = p->desc.name;
    t.dtype = NEWT_F32;
    t.ndim = p->desc.ndim;
    t.shape = p->desc.shape;
    t.offset = offset;
    t.extent = extent;
    t.begin = p->slice.begin;
    t.end = p->slice.end;
    t.data = p->data;
    t.bytes = (size_t)newt_slice_numel(&p->slice) * sizeof(float);
    t.flags = (device ? NEWT_TENSOR_DEVICE : 0) | (p->derived ? NEWT_TENSOR_DERIVED : 0);
    r = newt_state_tensor(g->ctx, &t);
  }
  free(pp);
  return r;
}

/* A new generation: the trainer for its layout, its groups, the state declared and restored.
 * A failed collective returns its error (the next begin recovers); anything else is fatal. */
static newt_result_t generation(gpt_worker *g) {
  newt_layout l = {.size = sizeof l};
  NEWT_CHECK(newt_layout_get(g->ctx, &l));
  model_par_config pc;
  model_par_config_from_rank(&pc, l.tp, l.pp, l.dp, (int)g->spec.zero, l.rank);
  pc.dev = g->dev;
  pc.max_micro = (int)l.accum_max; /* the shares may be uneven (a rebalanced plan): the most a rank takes */
  if (g->have_par && g->par_restored && !same_layout(&g->par.pc, &pc)) {
    if (model_par_relayout(&g->par, &pc) == NEWT_OK)
      NEWT_DEBUG(WORKER, "the trainer keeps its buffers: data-parallel rank %d of %d", pc.dp_rank, pc.dp);
    else
      newt_err_clear(); /* buffers of another layout: a new trainer, below */
  }
  if (!g->have_par || !same_layout(&g->par.pc, &pc)) {
    if (g->have_par && g->par_restored) { /* the trainer holding the state: the restore's source */
      g->old = g->par;
      g->have_old = 1;
    } else if (g->have_par) { /* made for a generation that never restored: nothing in it */
      model_par_free(&g->par);
    }
    g->have_par = g->par_restored = 0;
    NEWT_CHECK(model_par_alloc(&g->par, &g->tcfg, &pc)); /* its weights come from the restore */
    g->have_par = 1;
  }
  NEWT_CHECK(groups(g, &l, &pc));
  NEWT_CHECK(declare(g));
  newt_restore_info ri = {.size = sizeof ri};
  NEWT_CHECK(newt_state_restore(g->ctx, &ri));
  g->par_restored = 1;
  if (g->have_old) { /* newt read what it needed of it */
    model_par_free(&g->old);
    g->have_old = 0;
  }
  if (ri.source == NEWT_FROM_NOTHING) {
    NEWT_CHECK(model_par_init_weights(&g->par)); /* the seed's weights, the same on every rank */
  } else {
    g->par.step = ri.step;
    g->par.opt.t = ri.step; /* one AdamW update per step */
    g->par.params_stale = 0; /* the full parameters were restored too */
  }
  return NEWT_OK;
}

/* --- a step ------------------------------------------------------------------------------------ */

static newt_result_t step(gpt_worker *g, const newt_batch *b) {
  NEWT_CHECK(model_loader_fetch(&g->ld, (uint64_t)b->first, b->count, g->inputs, g->targets));
  double part[2], sums[2];
  NEWT_CHECK(model_par_grads(&g->par, &g->comms, g->inputs, g->targets, (int)b->count, part));
  NEWT_CHECK(newt_step_commit(g->ctx, part, sums, 2));
  model_step_info info;
  newt_step_result res;
  newt_step_result_init(&res);
  res.after = model_par_apply(&g->par, &g->comms, sums, &info);
  res.loss = info.loss;
  res.lr = info.lr;
  res.grad_norm = info.grad_norm;
  res.tokens = info.tokens;
  return newt_step_end(g->ctx, &res);
}

/* --- the whole life ------------------------------------------------------------------------- */

/* The job's model, data and device; newt told how its memory is copied. */
static newt_result_t setup(gpt_worker *g, int threads) {
  newt_job_info ji = {.size = sizeof ji};
  NEWT_CHECK(newt_job_get(g->ctx, &ji));
  NEWT_CHECK(spec_from_json(ji.spec_json, strlen(ji.spec_json), &g->spec));
  /* the model's checks of a job's start (gpt/gpt.h): a bad one is a bad spec (exit 2), said
     as newt run and newt coordinator say it */
  NEWT_CHECK(gpt_start_check(&g->spec, GPT_CHECK_TRAINER));
  model_train_config *tc = &g->tcfg;
  NEWT_CHECK(gpt_train_config(&g->spec, threads, tc));
  /* the fixed part of the layout must fit the model (tp divides heads and vocab, ...) */
  model_par_config pc;
  model_par_config_from_rank(&pc, (int)g->spec.tp, (int)g->spec.pp, 1, (int)g->spec.zero, 0);
  newt_result_t lr = model_par_config_check(&pc, tc);
  if (lr != NEWT_OK) return newt_err_wrap(lr, "the job's spec does not fit its model: ");
  model_threads_set(tc->threads);
  spec_data_desc(&g->spec, g->data_desc, sizeof g->data_desc);
  if (ji.device >= 0) {
    newt_result_t r = model_dev_open(MODEL_DEV_CUDA, ji.device, &g->dev);
    if (r != NEWT_OK) return newt_err_wrap(r, "spec.backend nccl: ");
    NEWT_INFO(WORKER, "%s: trains on %s", ji.worker_id, model_dev_name(g->dev));
    gpt_dev_memory(g->dev, &g->mem);
    NEWT_CHECK(newt_use_device(g->ctx, model_dev_stream(g->dev), &g->mem));
  } else {
    g->dev = model_dev_cpu();
  }
  /* the token file this host sees: one that is missing or no token file is a bad spec here
     (exit 2, not a crash to restart), as newt run refuses it before start */
  newt_result_t dr = gpt_open_data(&g->spec, &g->tok);
  if (dr != NEWT_OK) return newt_err_wrap(dr == NEWT_ERR_NOMEM ? dr : NEWT_ERR_INVALID, "spec.data.path: ");
  g->have_tok = 1;
  dr = model_loader_init(&g->ld, &g->tok, tc->seq_len, tc->data_seed, tc->model.vocab);
  if (dr != NEWT_OK) return newt_err_wrap(NEWT_ERR_INVALID, "spec.data.path: ");
  size_t n = (size_t)g->spec.global_batch * (size_t)tc->seq_len;
  g->inputs = malloc(n * sizeof *g->inputs);
  g->targets = malloc(n * sizeof *g->targets);
  NEWT_CHECK_ALLOC(g->inputs);
  NEWT_CHECK_ALLOC(g->targets);
  return newt_state_document(g->ctx, doc_write, doc_check, g);
}

/* Whether the running generation failed (an error of its collectives): then the next begin
 * recovers; any other error ends the worker. */
static int generation_failed(gpt_worker *g) {
  comm_status st;
  if (!g->comms.world) return 0;
  comm_get_status(g->comms.world, &st);
  return st.code != NEWT_OK;
}

static newt_result_t train(gpt_worker *g) {
  for (;;) {
    newt_batch b = {.size = sizeof b};
    newt_next next;
    NEWT_CHECK(newt_step_begin(g->ctx, &b, &next));
    newt_result_t r = NEWT_OK;
    switch (next) {
      case NEWT_NEXT_GENERATION: r = generation(g); break;
      case NEWT_NEXT_STEP: r = step(g, &b); break;
      default: return NEWT_OK; /* done, left, failed: newt_finish says which */
    }
    if (r != NEWT_OK && !generation_failed(g)) return r;
  }
}

int gpt_worker_run(const newt_join_opts *o, int threads) {
  gpt_worker *g = calloc(1, sizeof *g);
  if (!g) return 1;
  newt_result_t r = newt_join(o, &g->ctx);
  if (r != NEWT_OK) { /* said and written to the termination log by newt_join */
    free(g);
    return job_exit_status(r);
  }
  r = setup(g, threads);
  if (r == NEWT_OK) r = train(g);
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", newt_errmsg());
  int status = newt_finish(g->ctx, r == NEWT_OK ? NEWT_OK : NEWT_ERR(r, "%s", msg)); /* frees newt's copies first */
  if (g->have_par) model_par_free(&g->par);
  if (g->have_old) model_par_free(&g->old);
  if (g->dev && model_dev_kind_of(g->dev) != MODEL_DEV_CPU) model_dev_close(g->dev); /* after its buffers */
  if (g->have_tok) model_tokens_close(&g->tok);
  free(g->inputs);
  free(g->targets);
  free(g);
  return status;
}
