/* The checks of a job before anything of it starts (gpt/gpt.h, gpt_start_check).
 *
 * A bad value found by a worker is found late: etcd, the coordinators and every worker have
 * started, and the reason is in a worker's log. So whatever starts a job (newt run, newt
 * coordinator --spec, newt bench recovery) or trains one (newt train) first asks here
 * everything the spec can answer without them, and refuses with the field and the value:
 *
 *   spec      the spec's own rules (spec_validate) and its JSON read back as itself
 *             (spec_check_json): what is published is what every reader accepts;
 *   trainer   the built-in trainer's (not a program's, which has its own model and data):
 *             the preset is one of model/config.c's and the overrides make a model
 *             (model_config_check), the sequence fits its context, the fixed part of the
 *             layout fits it (tp divides the heads and the vocab, pp at most the layers),
 *             and the trainer's configuration is built as every worker builds it
 *             (gpt_train_config, model_par_config_check: what gpt/worker.c's setup asks);
 *   files     what the spec names on this host: the token file (trainer) is a file, opens
 *             as a token file (header, size, checksums: model_tokens_open) and holds a
 *             sample of seq_len + 1 tokens of the model's vocab (model_loader_init, as the
 *             worker's loader); the checkpoint directory, when checkpoints are saved, is made
 *             when missing and its lock taken and let go as the job's ranks will take it
 *             ("job <name>", ckpt_lock_take: writable, no other writer's), and when they are
 *             only resumed from, is a directory if it exists.
 *
 * The order is that of the cost: the rules, the model, then the files. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt.h"
#include "gpt/gpt.h"
#include "model/config.h"
#include "model/loader.h"
#include "model/parallel.h"

/* Where a size of the model comes from, for messages: its override, or the preset. */
static const char *origin(const newt_spec *s, int64_t override, const char *field, char *buf, size_t cap) {
  if (override) snprintf(buf, cap, "spec.model.%s", field);
  else snprintf(buf, cap, "preset %s", s->preset);
  return buf;
}

static newt_result_t check_trainer(const newt_spec *s, model_config *m) {
  if (model_config_preset(s->preset, m) != NEWT_OK) {
    char names[256] = "";
    for (int i = 0, n = model_config_npresets(); i < n; i++) {
      size_t l = strlen(names);
      snprintf(names + l, sizeof names - l, "%s%s", i == 0 ? "" : i + 1 == n ? " or " : ", ",
               model_config_preset_name(i));
    }
    return NEWT_ERR(NEWT_ERR_INVALID, "spec.model.preset: unknown preset \"%s\" (%s)", s->preset, names);
  }
  const struct {
    const char *field;
    int64_t v, *slot;
  } over[] = {{"vocab", s->vocab, &m->vocab}, {"ctx", s->ctx, &m->ctx}, {"layers", s->layers, &m->layers},
              {"heads", s->heads, &m->heads}, {"channels", s->channels, &m->channels}};
  for (size_t i = 0; i < sizeof over / sizeof over[0]; i++)
    if (over[i].v) *over[i].slot = over[i].v;
  /* its messages name model.<field>: the spec's spec.model.<field> */
  newt_result_t r = model_config_check(m);
  if (r != NEWT_OK) return newt_err_wrap(NEWT_ERR_INVALID, "spec.");
  char from[96];
  if (s->seq_len > m->ctx)
    return NEWT_ERR(NEWT_ERR_INVALID, "spec.train.seq_len: %lld is longer than the model's ctx %lld (%s)",
                    (long long)s->seq_len, (long long)m->ctx, origin(s, s->ctx, "ctx", from, sizeof from));
  if (m->heads % s->tp != 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "spec.parallel.tp: %lld does not divide the model's heads %lld (%s)",
                    (long long)s->tp, (long long)m->heads, origin(s, s->heads, "heads", from, sizeof from));
  if (m->vocab % s->tp != 0)
    return NEWT_ERR(NEWT_ERR_INVALID,
                    "spec.parallel.tp: %lld does not divide the model's vocab %lld (%s; the embedding is split by tp)",
                    (long long)s->tp, (long long)m->vocab, origin(s, s->vocab, "vocab", from, sizeof from));
  if (s->pp > m->layers)
    return NEWT_ERR(NEWT_ERR_INVALID, "spec.parallel.pp: %lld stages for the model's %lld layers (%s)",
                    (long long)s->pp, (long long)m->layers, origin(s, s->layers, "layers", from, sizeof from));
  /* what every worker builds (gpt/worker.c, setup): anything the rules above missed */
  model_train_config c;
  r = gpt_train_config(s, 1, &c);
  if (r != NEWT_OK) return newt_err_wrap(NEWT_ERR_INVALID, "spec: ");
  model_par_config pc;
  model_par_config_from_rank(&pc, (int)s->tp, (int)s->pp, 1, (int)s->zero, 0);
  r = model_par_config_check(&pc, &c);
  if (r != NEWT_OK) return newt_err_wrap(NEWT_ERR_INVALID, "spec: the layout does not fit the model: ");
  return NEWT_OK;
}

/* The token file, as the worker opens and loads it. */
static newt_result_t check_data(const newt_spec *s, const model_config *m) {
  if (!s->data_path[0]) return NEWT_OK; /* the generated corpus: made from the spec alone */
  struct stat st;
  if (stat(s->data_path, &st) == 0 && !S_ISREG(st.st_mode))
    return NEWT_ERR(NEWT_ERR_INVALID, "spec.data.path: \"%s\" is not a file (a token file of newt data prepare)",
                    s->data_path);
  model_tokens tok;
  memset(&tok, 0, sizeof tok);
  newt_result_t r = model_tokens_open(&tok, s->data_path);
  if (r != NEWT_OK) return newt_err_wrap(NEWT_ERR_INVALID, "spec.data.path: ");
  int T = s->seq_len ? (int)s->seq_len : (int)m->ctx;
  char from[96];
  if (tok.count < (uint64_t)T + 1)
    r = NEWT_ERR(NEWT_ERR_INVALID, "spec.data.path: %s holds %llu tokens, fewer than one sample of seq_len + 1 = %d",
                 s->data_path, (unsigned long long)tok.count, T + 1);
  else if ((int64_t)tok.vocab > m->vocab)
    r = NEWT_ERR(NEWT_ERR_INVALID, "spec.data.path: %s has tokens of a vocab of %u, more than the model's vocab %lld (%s)",
                 s->data_path, tok.vocab, (long long)m->vocab, origin(s, s->vocab, "vocab", from, sizeof from));
  model_loader ld; /* as the worker's loader takes it: anything the rules above missed */
  if (r == NEWT_OK && (r = model_loader_init(&ld, &tok, T, s->data_seed, m->vocab)) != NEWT_OK)
    r = newt_err_wrap(NEWT_ERR_INVALID, "spec.data.path: %s: ", s->data_path);
  model_tokens_close(&tok);
  return r;
}

/* The checkpoint directory, as the job's ranks will use it (worker/save.c). */
static newt_result_t check_ckpt_dir(const newt_spec *s) {
  if (!s->ckpt_dir[0]) return NEWT_OK;
  if (s->ckpt_every == 0) { /* only resumed from, when it exists */
    struct stat st;
    if (stat(s->ckpt_dir, &st) == 0 && !S_ISDIR(st.st_mode))
      return NEWT_ERR(NEWT_ERR_INVALID, "spec.ckpt.dir: \"%s\" is not a directory", s->ckpt_dir);
    return NEWT_OK;
  }
  char writer[128];
  snprintf(writer, sizeof writer, "job %s", s->job);
  ckpt_lock *lock = NULL;
  newt_result_t r = ckpt_lock_take(s->ckpt_dir, writer, &lock);
  if (r != NEWT_OK) return newt_err_wrap(r == NEWT_ERR_NOMEM ? r : NEWT_ERR_INVALID, "spec.ckpt.dir: ");
  ckpt_lock_release(lock);
  return NEWT_OK;
}

newt_result_t gpt_start_check(const newt_spec *s, unsigned what) {
  if (what & GPT_CHECK_SPEC) {
    NEWT_CHECK(spec_validate(s));
    NEWT_CHECK(spec_check_json(s));
  }
  model_config m;
  if (what & GPT_CHECK_TRAINER) NEWT_CHECK(check_trainer(s, &m));
  if (what & GPT_CHECK_FILES) {
    if (what & GPT_CHECK_TRAINER) NEWT_CHECK(check_data(s, &m));
    NEWT_CHECK(check_ckpt_dir(s));
  }
  return NEWT_OK;
}
