/* The GPT's flat buffers as checkpoint slices, and a training run's state JSON (see
 * checkpoint.h). */
#include "gpt/ckpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/log.h"
#include "model/optim.h"

#define NAME_CAP (MODEL_NAME_MAX + 8)

/* Calls fn for every tensor the range crosses, with its slice and where its first element
 * is in the buffer. */
typedef newt_result_t (*piece_fn)(void *ctx, const model_tensor *t, const newt_tensor_desc *d,
                                  const newt_slice *s, size_t at);

static newt_result_t each_piece(const gpt_ckpt_bufs *b, piece_fn fn, void *ctx) {
  if (!b->layout) return NEWT_ERR(NEWT_ERR_INVALID, "model_ckpt: no layout");
  if (b->off + b->len > b->layout->total)
    return NEWT_ERR(NEWT_ERR_INVALID, "model_ckpt: range [%zu, %zu) runs past the buffer (%zu floats)", b->off,
                    b->off + b->len, b->layout->total);
  if ((b->m || b->v) && (b->off < b->moff || b->off + b->len > b->moff + b->mlen))
    return NEWT_ERR(NEWT_ERR_INVALID, "model_ckpt: range [%zu, %zu) is not inside the moments' [%zu, %zu)", b->off,
                    b->off + b->len, b->moff, b->moff + b->mlen);
  for (size_t i = 0; i < b->layout->n; i++) {
    const model_tensor *t = &b->layout->tensors[i];
    size_t a = b->off > t->offset ? b->off : t->offset;
    size_t e = b->off + b->len < t->offset + t->size ? b->off + b->len : t->offset + t->size;
    if (a >= e) continue;
    newt_tensor_desc d = {.name = t->name, .dtype = NEWT_F32, .ndim = t->ndim,
                          .shape = {(int64_t)t->shape[0], (int64_t)t->shape[1]}};
    newt_slice s;
    newt_slice_whole(&s, &d);
    s.begin = (int64_t)(a - t->offset);
    s.end = (int64_t)(e - t->offset);
    NEWT_CHECK(fn(ctx, t, &d, &s, a));
  }
  return NEWT_OK;
}

static newt_result_t add_one(void *ctx, const model_tensor *t, const newt_tensor_desc *d, const newt_slice *s,
                             size_t at) {
  const gpt_ckpt_bufs *b = ((void **)ctx)[1];
  ckpt_saver *sv = ((void **)ctx)[0];
  if (b->params) NEWT_CHECK(ckpt_save_add(sv, d, s, b->params + at));
  char name[NAME_CAP];
  newt_tensor_desc md = *d;
  md.name = name;
  if (b->m) {
    snprintf(name, sizeof name, "%s%s", MODEL_PAR_NAME_M, t->name);
    NEWT_CHECK(ckpt_save_add(sv, &md, s, b->m + (at - b->moff)));
  }
  if (b->v) {
    snprintf(name, sizeof name, "%s%s", MODEL_PAR_NAME_V, t->name);
    NEWT_CHECK(ckpt_save_add(sv, &md, s, b->v + (at - b->moff)));
  }
  return NEWT_OK;
}

newt_result_t gpt_ckpt_add(ckpt_saver *s, const gpt_ckpt_bufs *b) {
  void *ctx[2] = {s, (void *)b};
  return each_piece(b, add_one, ctx);
}

typedef struct req_ctx {
  const gpt_ckpt_bufs *b;
  ckpt_request *reqs;
  char (*names)[NAME_CAP];
  size_t n;
} req_ctx;

static void push_req(req_ctx *c, const char *prefix, const model_tensor *t, const newt_tensor_desc *d,
                     const newt_slice *s, float *out) {
  if (c->reqs) {
    snprintf(c->names[c->n], NAME_CAP, "%s%s", prefix, t->name);
    c->reqs[c->n] = (ckpt_request){.t = *d, .slice = *s, .out = out};
    c->reqs[c->n].t.name = c->names[c->n];
  }
  c->n++;
}

static newt_result_t req_one(void *ctx, const model_tensor *t, const newt_tensor_desc *d, const newt_slice *s,
                             size_t at) {
  req_ctx *c = ctx;
  const gpt_ckpt_bufs *b = c->b;
  if (b->params) push_req(c, "", t, d, s, b->params + at);
  if (b->m) push_req(c, MODEL_PAR_NAME_M, t, d, s, b->m + (at - b->moff));
  if (b->v) push_req(c, MODEL_PAR_NAME_V, t, d, s, b->v + (at - b->moff));
  return NEWT_OK;
}

newt_result_t gpt_ckpt_requests(const gpt_ckpt_bufs *b, ckpt_request **reqs, size_t *n) {
  req_ctx c = {.b = b};
  NEWT_CHECK(each_piece(b, req_one, &c)); /* count */
  size_t count = c.n;
  void *block = malloc((count ? count : 1) * (sizeof(ckpt_request) + NAME_CAP));
  NEWT_CHECK_ALLOC(block);
  c.reqs = block;
  c.names = (char (*)[NAME_CAP])((ckpt_request *)block + count);
  c.n = 0;
  newt_result_t r = each_piece(b, req_one, &c);
  if (r != NEWT_OK) {
    free(block);
    return r;
  }
  *reqs = c.reqs;
  *n = count;
  return NEWT_OK;
}

/* ---- a whole trainer ------------------------------------------------------------------------- */

static gpt_ckpt_bufs trainer_bufs(const model_trainer *tr) {
  return (gpt_ckpt_bufs){.layout = &tr->gpt.layout, .params = tr->gpt.params, .m = tr->opt.m, .v = tr->opt.v,
                           .moff = tr->opt.off, .mlen = tr->opt.len, .off = tr->opt.off, .len = tr->opt.len};
}

newt_result_t gpt_ckpt_train_state(const model_train_config *c, int64_t step, uint64_t cursor,
                                     int64_t adam_t, const char *data, cJSON **state) {
  cJSON *o = cJSON_CreateObject(), *rng, *cfg, *model, *optim;
  NEWT_CHECK_ALLOC(o);
  newt_json_add_int(o, "step", step);
  newt_json_add_int(o, "cursor", (int64_t)cursor);
  newt_json_add_int(o, "adam_t", adam_t);
  cJSON_AddNumberToObject(o, "lr", model_lr_at(&c->optim, step));
  cJSON_AddItemToObject(o, "rng", rng = cJSON_CreateObject());
  newt_json_add_int(rng, "seed", (int64_t)c->seed);
  newt_json_add_int(rng, "data_seed", (int64_t)c->data_seed);
  cJSON_AddItemToObject(o, "config", cfg = cJSON_CreateObject());
  cJSON_AddItemToObject(cfg, "model", model = cJSON_CreateObject());
  newt_json_add_int(model, "vocab", c->model.vocab);
  newt_json_add_int(model, "ctx", c->model.ctx);
  newt_json_add_int(model, "layers", c->model.layers);
  newt_json_add_int(model, "heads", c->model.heads);
  newt_json_add_int(model, "channels", c->model.channels);
  newt_json_add_int(cfg, "batch", c->batch);
  newt_json_add_int(cfg, "micro_batch", c->micro_batch);
  newt_json_add_int(cfg, "seq_len", c->seq_len);
  cJSON_AddStringToObject(cfg, "data", data ? data : "");
  cJSON_AddItemToObject(cfg, "optim", optim = cJSON_CreateObject());
  cJSON_AddNumberToObject(optim, "lr", c->optim.lr);
  cJSON_AddNumberToObject(optim, "lr_min", c->optim.lr_min);
  newt_json_add_int(optim, "warmup", c->optim.warmup);
  newt_json_add_int(optim, "steps", c->optim.steps);
  cJSON_AddNumberToObject(optim, "beta1", c->optim.beta1);
  cJSON_AddNumberToObject(optim, "beta2", c->optim.beta2);
  cJSON_AddNumberToObject(optim, "eps", c->optim.eps);
  cJSON_AddNumberToObject(optim, "weight_decay", c->optim.weight_decay);
  cJSON_AddNumberToObject(optim, "grad_clip", c->optim.grad_clip);
  *state = o;
  return NEWT_OK;
}

newt_result_t gpt_ckpt_trainer_state(const model_trainer *tr, const char *data, cJSON **state) {
  return gpt_ckpt_train_state(&tr->cfg, tr->step, tr->cursor, tr->opt.t, data, state);
}

newt_result_t gpt_ckpt_trainer_save(ckpt_saver *s, const model_trainer *tr, const char *data, int async,
                                      int *started) {
  cJSON *state = NULL;
  NEWT_CHECK(gpt_ckpt_trainer_state(tr, data, &state));
  newt_result_t r = ckpt_save_begin(s, tr->step, async, started);
  if (r == NEWT_OK && *started) {
    gpt_ckpt_bufs b = trainer_bufs(tr);
    r = gpt_ckpt_add(s, &b);
    if (r == NEWT_OK) r = ckpt_save_end(s, state);
    else r = ckpt_save_fail(s, r, newt_errmsg()); /* nothing half-gathered is written */
  }
  cJSON_Delete(state);
  return r;
}

/* A field of the saved config that must equal this run's. */
static newt_result_t same_int(const cJSON *o, const char *what, const char *field, int64_t have) {
  int64_t v = 0;
  NEWT_CHECK(newt_json_get_int(o, what, field, 1, &v));
  if (v != have)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s is %lld in the checkpoint, %lld in this run: resume with the same "
                    "model, data and batch, or use another checkpoint directory", what, field, (long long)v,
                    (long long)have);
  return NEWT_OK;
}

static newt_result_t check_config(const cJSON *state, const model_train_config *c, const char *data, int warn) {
  const cJSON *cfg = NULL, *model = NULL, *rng = NULL, *optim = NULL;
  NEWT_CHECK(newt_json_get_obj(state, "state", "config", 1, &cfg));
  NEWT_CHECK(newt_json_get_obj(cfg, "state.config", "model", 1, &model));
  NEWT_CHECK(newt_json_get_obj(state, "state", "rng", 1, &rng));
  const char *m = "state.config.model";
  NEWT_CHECK(same_int(model, m, "vocab", c->model.vocab));
  NEWT_CHECK(same_int(model, m, "ctx", c->model.ctx));
  NEWT_CHECK(same_int(model, m, "layers", c->model.layers));
  NEWT_CHECK(same_int(model, m, "heads", c->model.heads));
  NEWT_CHECK(same_int(model, m, "channels", c->model.channels));
  NEWT_CHECK(same_int(cfg, "state.config", "batch", c->batch));
  NEWT_CHECK(same_int(cfg, "state.config", "seq_len", c->seq_len));
  NEWT_CHECK(same_int(rng, "state.rng", "seed", (int64_t)c->seed));
  NEWT_CHECK(same_int(rng, "state.rng", "data_seed", (int64_t)c->data_seed));
  const char *d = NULL;
  NEWT_CHECK(newt_json_get_str(cfg, "state.config", "data", 1, &d));
  if (strcmp(d, data ? data : "") != 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "state.config.data is \"%s\" in the checkpoint, \"%s\" in this run", d,
                    data ? data : "");
  /* Other optimizer settings are the user's to change, but the run then leaves the path
   * the interrupted one was on. */
  NEWT_CHECK(newt_json_get_obj(cfg, "state.config", "optim", 1, &optim));
  double lr = 0, lr_min = 0;
  int64_t steps = 0, warmup = 0;
  NEWT_CHECK(newt_json_get_double(optim, "state.config.optim", "lr", 1, &lr));
  NEWT_CHECK(newt_json_get_double(optim, "state.config.optim", "lr_min", 1, &lr_min));
  NEWT_CHECK(newt_json_get_int(optim, "state.config.optim", "steps", 1, &steps));
  NEWT_CHECK(newt_json_get_int(optim, "state.config.optim", "warmup", 1, &warmup));
  if (warn && (lr != c->optim.lr || lr_min != c->optim.lr_min || steps != c->optim.steps || warmup != c->optim.warmup))
    NEWT_WARN(CKPT, "resuming with another learning-rate schedule (lr %g -> %g, lr_min %g -> %g, steps %lld -> %lld, "
              "warmup %lld -> %lld): the run will not follow the interrupted one", lr, c->optim.lr, lr_min,
              c->optim.lr_min, (long long)steps, (long long)c->optim.steps, (long long)warmup,
              (long long)c->optim.warmup);
  return NEWT_OK;
}

newt_result_t gpt_ckpt_check_state(const model_train_config *c, const char *data, const char *state_json, int64_t step) {
  cJSON *state = NULL;
  NEWT_CHECK(newt_json_parse(state_json, strlen(state_json), "state", &state));
  static int warned;
  newt_result_t r = check_config(state, c, data, !warned);
  warned = 1;
  int64_t t = 0;
  if (r == NEWT_OK) r = newt_json_get_int(state, "state", "adam_t", 1, &t);
  if (r == NEWT_OK && t != step)
    r = NEWT_ERR(NEWT_ERR_INVALID, "state.adam_t %lld in the checkpoint of step %lld: one update per step expected",
                 (long long)t, (long long)step);
  cJSON_Delete(state);
  return r;
}

/* The training point of a loaded checkpoint (its state): the same run as c and data, and a
 * step, data cursor and AdamW count that agree with the checkpoint's step. */
static newt_result_t loaded_point(const ckpt_loaded *ld, const model_train_config *c, const char *data,
                                  const char *dir, int64_t *s, int64_t *cursor, int64_t *t) {
  const cJSON *state = ld->state;
  newt_result_t r = check_config(state, c, data, 0);
  if (r == NEWT_OK) r = newt_json_get_int(state, "state", "step", 1, s);
  if (r == NEWT_OK) r = newt_json_get_int(state, "state", "cursor", 1, cursor);
  if (r == NEWT_OK) r = newt_json_get_int(state, "state", "adam_t", 1, t);
  if (r == NEWT_OK && (*s != ld->step || *cursor < 0 || *t < 0))
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s: state.step %lld in the checkpoint of step %lld", dir, (long long)*s,
                 (long long)ld->step);
  return r;
}

/* ckpt_state_check_fn: the run of a checkpoint must be this run (warned once about
 * another learning-rate schedule). */
typedef struct same_run {
  const model_train_config *c;
  const char *data;
  int seen;
} same_run;

static newt_result_t check_run(void *ctx, int64_t step, const cJSON *state) {
  same_run *k = ctx;
  (void)step;
  return check_config(state, k->c, k->data, k->seen++ == 0);
}

newt_result_t gpt_ckpt_trainer_resume(const char *dir, model_trainer *tr, const char *data, int threads,
                                        int64_t *step) {
  *step = -1;
  /* Read into copies: the trainer stays as it is when nothing loads. */
  gpt_ckpt_bufs b = trainer_bufs(tr);
  size_t total = tr->gpt.layout.total;
  float *p = calloc(total ? total : 1, sizeof *p), *m = calloc(b.mlen ? b.mlen : 1, sizeof *m),
        *v = calloc(b.mlen ? b.mlen : 1, sizeof *v);
  ckpt_request *reqs = NULL;
  size_t nreq = 0;
  ckpt_loaded ld = {0};
  newt_result_t r = p && m && v ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory resuming from %s", dir);
  b.params = p, b.m = m, b.v = v;
  /* The run must be the same run: checked on each manifest before asking for its tensors
   * (a mismatch names the field, not a missing tensor), and again on what loads. */
  same_run k = {&tr->cfg, data, 0};
  if (r == NEWT_OK) r = gpt_ckpt_requests(&b, &reqs, &nreq);
  if (r == NEWT_OK) r = ckpt_load_checked(dir, CKPT_LATEST, threads, reqs, nreq, check_run, &k, &ld);
  int fresh = r == NEWT_ERR_NOTFOUND && ld.committed == 0; /* nothing committed: a fresh run */
  int64_t s = 0, cursor = 0, t = 0;
  if (r == NEWT_OK) r = loaded_point(&ld, &tr->cfg, data, dir, &s, &cursor, &t);
  if (r == NEWT_OK) {
    memcpy(tr->gpt.params, p, total * sizeof *p);
    memcpy(tr->opt.m, m, b.mlen * sizeof *m);
    memcpy(tr->opt.v, v, b.mlen * sizeof *v);
    tr->step = s;
    tr->cursor = (uint64_t)cursor;
    tr->opt.t = t;
    *step = s;
  } else if (fresh) {
    newt_err_clear();
    r = NEWT_OK;
  } else {
    newt_err_wrap(r, "resuming from %s: ", dir);
  }
  cJSON_Delete(ld.state);
  free(reqs);
  free(p);
  free(m);
  free(v);
  return r;
}

newt_result_t gpt_ckpt_train_load(const char *dir, int64_t max_step, const model_train_config *c,
                                    const char *data, int threads, const ckpt_request *reqs, size_t n,
                                    const ckpt_key *key, gpt_ckpt_train_point *out) {
  same_run k = {c, data, 0};
  ckpt_loaded ld = {0};
  newt_result_t r = ckpt_load_keyed(dir, max_step, threads, reqs, n, check_run, &k, key, &ld);
  out->committed = ld.committed;
  out->refused = ld.refused;
  if (r != NEWT_OK) return r;
  int64_t s = 0, cursor = 0, t = 0;
  r = loaded_point(&ld, c, data, dir, &s, &cursor, &t);
  if (r == NEWT_OK) {
    out->step = s;
    out->cursor = (uint64_t)cursor;
    out->adam_t = t;
    out->fallbacks = ld.fallbacks;
  }
  cJSON_Delete(ld.state);
  return r == NEWT_OK ? NEWT_OK : newt_err_wrap(r, "loading %s: ", dir);
}

/* ---- one rank of the parallel trainer ------------------------------------------------------ */

newt_result_t gpt_ckpt_par_add(ckpt_saver *s, const model_par *p) {
  model_par_piece *pp = NULL;
  size_t n = 0;
  NEWT_CHECK(model_par_pieces(p, &pp, &n));
  int visible = model_dev_host_visible(p->dev);
  newt_result_t r = NEWT_OK;
  for (size_t i = 0; r == NEWT_OK && i < n; i++) {
    if (!pp[i].primary) continue;
    if (visible) { /* the saver copies host memory itself (the async save's snapshot) */
      r = ckpt_save_add(s, &pp[i].desc, &pp[i].slice, pp[i].data);
      continue;
    }
    void *dst = NULL;
    r = ckpt_save_reserve(s, &pp[i].desc, &pp[i].slice, &dst);
    if (r == NEWT_OK)
      model_dev_download_async(p->dev, dst, pp[i].data, (size_t)newt_slice_numel(&pp[i].slice) * sizeof(float));
  }
  if (!visible) { /* one wait for every copy queued (after the step's work), after a failure too */
    newt_result_t sr = model_dev_sync(p->dev);
    if (r == NEWT_OK) r = sr;
  }
  free(pp);
  return r;
}

/* Bytes of the pieces p holds (only its primary ones: primary_only), each rounded up to
 * align; 0 on no memory. */
static size_t pieces_bytes(const model_par *p, int primary_only, size_t align) {
  model_par_piece *pp = NULL;
  size_t n = 0, total = 0;
  if (model_par_pieces(p, &pp, &n) != NEWT_OK) return 0;
  for (size_t i = 0; i < n; i++)
    if (pp[i].primary || !primary_only) {
      size_t b = (size_t)newt_slice_numel(&pp[i].slice) * sizeof(float);
      total += (b + align - 1) / align * align;
    }
  free(pp);
  return total;
}

size_t gpt_ckpt_par_staging_bytes(const model_par *p) { return pieces_bytes(p, 1, CKPT_STAGING_ALIGN); }

size_t gpt_ckpt_par_floats(const model_par *p) { return pieces_bytes(p, 0, 1) / sizeof(float); }

newt_result_t gpt_ckpt_par_load(const char *dir, int64_t max_step, model_par *p, const char *data, int threads,
                                  float *stage, const ckpt_key *key, gpt_ckpt_train_point *pt) {
  memset(pt, 0, sizeof *pt);
  pt->step = -1;
  model_par_piece *pp = NULL;
  size_t n = 0;
  NEWT_CHECK(model_par_pieces(p, &pp, &n));
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += (size_t)newt_slice_numel(&pp[i].slice);
  ckpt_request *reqs = calloc(n ? n : 1, sizeof *reqs);
  float *own = NULL; /* host staging of the call, when the caller gave none */
  newt_result_t r = reqs ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory reading a checkpoint");
  if (model_dev_host_visible(p->dev)) stage = NULL; /* read straight into the buffers */
  else if (r == NEWT_OK && !stage && (r = model_dev_host_alloc(p->dev, (total ? total : 1) * sizeof *stage, (void **)&own)) == NEWT_OK)
    stage = own;
  for (size_t i = 0, off = 0; r == NEWT_OK && i < n; i++) {
    reqs[i] = (ckpt_request){.t = pp[i].desc, .slice = pp[i].slice, .out = stage ? stage + off : pp[i].data};
    off += (size_t)newt_slice_numel(&pp[i].slice);
  }
  if (r == NEWT_OK) r = gpt_ckpt_train_load(dir, max_step, &p->cfg, data, threads, reqs, n, key, pt);
  for (size_t i = 0, off = 0; r == NEWT_OK && stage && i < n; i++) { /* queued, one wait */
    size_t k = (size_t)newt_slice_numel(&pp[i].slice);
    model_dev_upload_async(p->dev, pp[i].data, stage + off, k * sizeof *stage);
    off += k;
  }
  if (r == NEWT_OK && stage) r = model_dev_sync(p->dev);
  if (own) model_dev_host_free(p->dev, own);
  free(reqs);
  free(pp);
  if (r != NEWT_OK) return r;
  p->step = pt->step;
  p->opt.t = pt->adam_t;
  return NEWT_OK;
}
