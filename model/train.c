/* The single-process training loop (see train.h). */
#include "model/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "model/ops.h"

newt_result_t model_train_defaults(model_train_config *c, const char *preset, int64_t steps) {
  memset(c, 0, sizeof *c);
  NEWT_CHECK(model_config_preset(preset, &c->model));
  c->optim = model_adamw_defaults(steps);
  c->batch = 8;
  c->micro_batch = 8;
  c->seq_len = (int)c->model.ctx;
  c->seed = 1;
  c->data_seed = 1;
  c->threads = 1;
  return NEWT_OK;
}

newt_result_t model_train_config_check(const model_train_config *c) {
  NEWT_CHECK(model_config_check(&c->model));
  NEWT_CHECK(model_adamw_config_check(&c->optim));
  if (c->batch < 1) return NEWT_ERR(NEWT_ERR_INVALID, "train.batch = %d: must be >= 1", c->batch);
  if (c->micro_batch < 1 || c->micro_batch > c->batch)
    return NEWT_ERR(NEWT_ERR_INVALID, "train.micro_batch = %d: must be in [1, batch = %d]", c->micro_batch,
                    c->batch);
  if (c->threads < 0 || c->threads > 1024)
    return NEWT_ERR(NEWT_ERR_INVALID, "train.threads = %d: must be in [0, 1024] (0: all cores)", c->threads);
  if (c->seq_len < 1 || c->seq_len > c->model.ctx)
    return NEWT_ERR(NEWT_ERR_INVALID, "train.seq_len = %d: must be in [1, ctx = %lld]", c->seq_len,
                    (long long)c->model.ctx);
  return NEWT_OK;
}

newt_result_t model_trainer_init(model_trainer *tr, const model_train_config *cfg) {
  memset(tr, 0, sizeof *tr);
  NEWT_CHECK(model_train_config_check(cfg));
  tr->cfg = *cfg;
  model_threads_set(cfg->threads);
  newt_result_t res;
  int L = (int)cfg->model.layers, T = cfg->seq_len;
  NEWT_CHECK_GOTO(model_gpt_init(&tr->gpt, &cfg->model), res, fail);
  NEWT_CHECK_GOTO(model_acts_init(&tr->acts, &cfg->model, cfg->micro_batch, T, 0, L, 1), res, fail);
  NEWT_CHECK_GOTO(model_scratch_init(&tr->scratch, &cfg->model, cfg->micro_batch, T), res, fail);
  NEWT_CHECK_GOTO(model_adamw_init(&tr->opt, &cfg->optim, 0, tr->gpt.layout.total), res, fail);
  tr->inputs = malloc((size_t)cfg->batch * T * sizeof(int32_t));
  tr->targets = malloc((size_t)cfg->batch * T * sizeof(int32_t));
  if (!tr->inputs || !tr->targets) {
    res = NEWT_ERR(NEWT_ERR_NOMEM, "trainer: out of memory for a batch of %d x %d", cfg->batch, T);
    goto fail;
  }
  model_gpt_init_weights(&tr->gpt, cfg->seed);
  return NEWT_OK;
fail:
  model_trainer_free(tr);
  return res;
}

void model_trainer_free(model_trainer *tr) {
  free(tr->inputs);
  free(tr->targets);
  model_adamw_free(&tr->opt);
  model_scratch_free(&tr->scratch);
  model_acts_free(&tr->acts);
  model_gpt_free(&tr->gpt);
  memset(tr, 0, sizeof *tr);
}

void model_trainer_zero(model_trainer *tr) {
  model_gpt_zero_grads(&tr->gpt);
  tr->loss_sum = 0;
  tr->loss_tokens = 0;
}

double model_trainer_accumulate(model_trainer *tr, const int32_t *inputs, const int32_t *targets,
                                int nseq, float dscale) {
  int T = tr->cfg.seq_len, mb = tr->cfg.micro_batch;
  double sum = 0;
  for (int s = 0; s < nseq; s += mb) {
    int n = nseq - s < mb ? nseq - s : mb;
    tr->acts.B = n; /* a short last micro-batch uses the front of the buffers */
    sum += model_forward_backward(&tr->gpt, &tr->acts, &tr->scratch, inputs + (size_t)s * T,
                                  targets + (size_t)s * T, dscale);
  }
  tr->acts.B = mb;
  tr->loss_sum += sum;
  tr->loss_tokens += (int64_t)nseq * T;
  return sum;
}

void model_trainer_apply(model_trainer *tr, model_step_info *info) {
  model_gpt *g = &tr->gpt;
  double norm = sqrt(model_sqnorm(g->grads, g->layout.total));
  double lr = model_lr_at(&tr->cfg.optim, tr->step);
  model_adamw_update(&tr->opt, &g->layout, g->params, g->grads, lr,
                     model_clip_scale(norm, tr->cfg.optim.grad_clip));
  tr->step++;
  if (info) {
    info->step = tr->step;
    info->loss = tr->loss_tokens ? tr->loss_sum / (double)tr->loss_tokens : NAN;
    info->lr = lr;
    info->grad_norm = norm;
    info->tokens = tr->loss_tokens;
  }
}

newt_result_t model_trainer_step(model_trainer *tr, const int32_t *inputs, const int32_t *targets,
                                 int nseq, model_step_info *info) {
  if (nseq < 1) return NEWT_ERR(NEWT_ERR_INVALID, "trainer: a step needs at least one sequence");
  double t0 = newt_now_s();
  model_trainer_zero(tr);
  model_trainer_accumulate(tr, inputs, targets, nseq, 1.0f / (float)((int64_t)nseq * tr->cfg.seq_len));
  model_trainer_apply(tr, info);
  if (info) info->ms = (newt_now_s() - t0) * 1e3;
  return NEWT_OK;
}

newt_result_t model_trainer_step_data(model_trainer *tr, const model_loader *ld, model_step_info *info) {
  if (ld->T != tr->cfg.seq_len)
    return NEWT_ERR(NEWT_ERR_INVALID, "trainer: loader T = %d, model seq_len = %d", ld->T, tr->cfg.seq_len);
  double t0 = newt_now_s();
  NEWT_CHECK(model_loader_fetch(ld, tr->cursor, tr->cfg.batch, tr->inputs, tr->targets));
  NEWT_CHECK(model_trainer_step(tr, tr->inputs, tr->targets, tr->cfg.batch, info));
  tr->cursor += (uint64_t)tr->cfg.batch;
  if (info) info->ms = (newt_now_s() - t0) * 1e3;
  return NEWT_OK;
}
