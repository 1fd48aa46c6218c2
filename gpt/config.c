/* The trainer and the token stream a job spec asks for (gpt/gpt.h): the GPT worker builds its
 * trainer from the job's spec, and `newt train` from the spec its flags describe, with these
 * two functions, so a job and `newt train` with the same values follow one trajectory. */
#include <stdlib.h>

#include "gpt/gpt.h"
#include "model/tokens.h"

newt_result_t gpt_open_data(const newt_spec *s, model_tokens *tok) {
  if (s->data_path[0]) return model_tokens_open(tok, s->data_path);
  char *text = malloc((size_t)s->gen_bytes);
  NEWT_CHECK_ALLOC(text);
  model_text_generate(s->data_seed, text, (size_t)s->gen_bytes);
  newt_result_t r = model_tokens_from_memory(tok, text, 1, (uint64_t)s->gen_bytes, 256);
  free(text);
  return r;
}

newt_result_t gpt_train_config(const newt_spec *s, int threads, model_train_config *c) {
  NEWT_CHECK(model_train_defaults(c, s->preset, s->steps));
  const struct {
    const char *field;
    int64_t v;
  } over[] = {{"vocab", s->vocab}, {"ctx", s->ctx}, {"layers", s->layers}, {"heads", s->heads},
              {"channels", s->channels}};
  for (size_t i = 0; i < sizeof over / sizeof over[0]; i++) {
    if (over[i].v) NEWT_CHECK(model_config_set_int(&c->model, over[i].field, over[i].v));
  }
  c->batch = (int)s->global_batch;
  c->micro_batch = (int)s->micro_batch;
  c->seq_len = s->seq_len ? (int)s->seq_len : (int)c->model.ctx;
  c->seed = s->seed;
  c->data_seed = s->data_seed;
  c->threads = threads;
  c->optim.lr = s->lr;
  c->optim.lr_min = s->lr_min;
  if (s->warmup >= 0) c->optim.warmup = s->warmup;
  c->optim.weight_decay = s->weight_decay;
  c->optim.grad_clip = s->grad_clip;
  NEWT_CHECK(model_train_config_check(c));
  if (s->pp > c->model.layers)
    return NEWT_ERR(NEWT_ERR_INVALID, "spec.parallel.pp: %lld stages for %lld layers", (long long)s->pp,
                    (long long)c->model.layers);
  return NEWT_OK;
}
