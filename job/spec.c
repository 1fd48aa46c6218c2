/* Parsing, validation and printing of the job spec (see spec.h). The spec is a table of its
 * sections and fields (job/codec.h: names, defaults, the order they are written in; unknown
 * fields are errors, numbers are JSON numbers); spec_validate holds the ranges and the rules
 * that tie fields together. */
#include "job/spec.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/backend.h"
#include "common/json.h"
#include "common/strutil.h"
#include "job/codec.h"

/* A seed is 64 bits, more than a JSON number holds exactly (2^53), so spec_to_json writes one
 * beyond SEED_NUMBER_MAX as a decimal string (as newt_json_add_int writes every int64, which is
 * how newt wrote seeds before): a number, or such a string of digits, and nothing else. */
#define SEED_NUMBER_MAX 999999999999999ULL /* 15 digits: what cJSON prints exactly */

static newt_result_t get_seed(const cJSON *obj, const char *what, const codec_field *f, void *rec, int required) {
  const char *field = f->name;
  uint64_t *out = (uint64_t *)((char *)rec + f->off);
  const cJSON *it = cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, field) : NULL;
  if (cJSON_IsString(it)) {
    const char *v = it->valuestring;
    char *end = NULL;
    int digits = *v >= '0' && *v <= '9';
    for (const char *p = v; *p && digits; p++) digits = *p >= '0' && *p <= '9';
    errno = 0;
    unsigned long long u = digits ? strtoull(v, &end, 10) : 0;
    if (!digits || errno || *end || u <= SEED_NUMBER_MAX)
      return NEWT_ERR(NEWT_ERR_INVALID,
                      "%s.%s: expected a number, got the string \"%.40s\" (a seed is a string only beyond %llu, "
                      "where a JSON number loses digits: a string of digits up to 18446744073709551615)",
                      what, field, v, SEED_NUMBER_MAX);
    *out = (uint64_t)u;
    return NEWT_OK;
  }
  if (cJSON_IsNumber(it) && it->valuedouble > (double)NEWT_JSON_INT_EXACT)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: %.17g is beyond 2^53, where a JSON number loses digits: write the seed "
                    "as a string of digits", what, field, it->valuedouble);
  int64_t v = (int64_t)*out;
  NEWT_CHECK(newt_json_get_int_strict(obj, what, field, required, &v));
  if (v < 0) return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: must not be negative, got %lld", what, field, (long long)v);
  *out = (uint64_t)v;
  return NEWT_OK;
}

/* The writer of get_seed's form. */
static newt_result_t put_seed(cJSON *obj, const codec_field *f, const void *rec) {
  uint64_t v;
  memcpy(&v, (const char *)rec + f->off, sizeof v);
  char digits[24];
  snprintf(digits, sizeof digits, "%llu", (unsigned long long)v);
  const cJSON *added = v <= SEED_NUMBER_MAX ? cJSON_AddNumberToObject(obj, f->name, (double)v)
                                            : cJSON_AddStringToObject(obj, f->name, digits);
  return added ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing the spec's %s", f->name);
}

/* The spec, section by section: its fields, their defaults (those of `newt train`, so a job and
 * `newt train` with the same values follow the same trajectory) and the order they are written
 * in. Ranges and the rules that tie fields together are spec_validate's. Fields marked omit are
 * written only when not their default: a spec of the defaults reads in a release without them
 * (absent: the default, as before they existed). */
#define SPEC_SECTION(label, fields_)                                                                               \
  {.name = (label), .size = sizeof(newt_spec), .fields = (fields_), .n = sizeof(fields_) / sizeof((fields_)[0]),    \
   .strict = 1, .closed = 1}
#define NUM(m, key, d) {CODEC_NUM(newt_spec, m, key), .def = (d)}
#define REAL(m, key, d) {CODEC_REAL(newt_spec, m, key), .ddef = (d)}

static const codec_field model_fields[] = {
    {CODEC_STR(newt_spec, preset, "preset"), .sdef = "tiny"},
    /* 0 keeps the preset's value, and is not written */
    {CODEC_NUM(newt_spec, vocab, "vocab"), CODEC_OMIT},     {CODEC_NUM(newt_spec, ctx, "ctx"), CODEC_OMIT},
    {CODEC_NUM(newt_spec, layers, "layers"), CODEC_OMIT},   {CODEC_NUM(newt_spec, heads, "heads"), CODEC_OMIT},
    {CODEC_NUM(newt_spec, channels, "channels"), CODEC_OMIT},
};
static const codec_field data_fields[] = {
    {CODEC_STR(newt_spec, data_path, "path")},
    {CODEC_CUSTOM(newt_spec, data_seed, "seed", put_seed, get_seed), .def = 1},
    NUM(gen_bytes, "gen_bytes", 1 << 21),
};
static const codec_field train_fields[] = {
    NUM(steps, "steps", 100),        NUM(global_batch, "global_batch", 32), NUM(micro_batch, "micro_batch", 4),
    NUM(seq_len, "seq_len", 0),      REAL(lr, "lr", 1e-3),                  REAL(lr_min, "lr_min", 1e-4),
    NUM(warmup, "warmup", -1),       REAL(weight_decay, "weight_decay", 0.1), REAL(grad_clip, "grad_clip", 1.0),
    {CODEC_CUSTOM(newt_spec, seed, "seed", put_seed, get_seed), .def = 1},
};
static const codec_field parallel_fields[] = {
    NUM(tp, "tp", 1),
    NUM(pp, "pp", 1),
    NUM(zero, "zero", 0),
    NUM(dp_min, "dp_min", 1),
    NUM(dp_max, "dp_max", 1024),
    NUM(start_workers, "start_workers", 0),
    NUM(start_timeout_ms, "start_timeout_ms", 30000),
    {CODEC_NUM(newt_spec, join_window_ms, "join_window_ms"), .def = SPEC_JOIN_WINDOW_MS, CODEC_OMIT},
    {CODEC_BOOL(newt_spec, even_batches, "even_batches"), CODEC_OMIT},
};
static const codec_field ckpt_fields[] = {
    {CODEC_STR(newt_spec, ckpt_dir, "dir")}, NUM(ckpt_every, "every", 0), NUM(ckpt_keep, "keep", 3),
    NUM(ckpt_level, "level", 3),
};
static const char *const state_losses[] = {"checkpoint", "fail", "restart", NULL};
static const char *const mismatches[] = {"rollback", "warn", "fail", NULL};
static const char *word_of(const char *const *words, int n, int v) { return v >= 0 && v < n ? words[v] : NULL; }
static int word_index(const char *const *words, const char *w) {
  for (int i = 0; w && words[i]; i++)
    if (strcmp(words[i], w) == 0) return i;
  return -1;
}
const char *spec_state_loss_name(int v) { return word_of(state_losses, 3, v); }
const char *spec_mismatch_name(int v) { return word_of(mismatches, 3, v); }
int spec_state_loss_parse(const char *word) { return word_index(state_losses, word); }
int spec_mismatch_parse(const char *word) { return word_index(mismatches, word); }

static const codec_field fault_fields[] = {
    NUM(lease_ttl_ms, "lease_ttl_ms", 2000),
    NUM(comm_timeout_ms, "comm_timeout_ms", 3000),
    NUM(hang_timeout_ms, "hang_timeout_ms", 5000),
    NUM(first_step_timeout_ms, "first_step_timeout_ms", 120000),
    NUM(report_window_ms, "report_window_ms", 300),
    NUM(replica_every, "replica_every", 1),
    {CODEC_NUM(newt_spec, replicas, "replicas"), .def = 1, CODEC_OMIT},
    NUM(max_failures, "max_failures", 10),
    NUM(failure_window_ms, "failure_window_ms", 600000),
    {CODEC_NUM(newt_spec, progress_timeout_ms, "progress_timeout_ms"), .def = SPEC_PROGRESS_TIMEOUT_MS, CODEC_OMIT},
    {CODEC_ENUM(newt_spec, on_state_loss, "on_state_loss", state_losses), CODEC_OMIT},
    {CODEC_NUM(newt_spec, verify_every, "verify_every"), .def = SPEC_VERIFY_EVERY, CODEC_OMIT},
    {CODEC_ENUM(newt_spec, on_mismatch, "on_mismatch", mismatches), CODEC_OMIT},
    {CODEC_REAL(newt_spec, straggler_margin, "straggler_margin"), .ddef = SPEC_STRAGGLER_MARGIN, CODEC_OMIT},
    {CODEC_NUM(newt_spec, straggler_window, "straggler_window"), .def = SPEC_STRAGGLER_WINDOW, CODEC_OMIT},
    {CODEC_REAL(newt_spec, straggler_replace, "straggler_replace"), .ddef = 0, CODEC_OMIT},
};
static const codec_table model_table = SPEC_SECTION("spec.model", model_fields);
static const codec_table data_table = SPEC_SECTION("spec.data", data_fields);
static const codec_table train_table = SPEC_SECTION("spec.train", train_fields);
static const codec_table parallel_table = SPEC_SECTION("spec.parallel", parallel_fields);
static const codec_table ckpt_table = SPEC_SECTION("spec.ckpt", ckpt_fields);
static const codec_table fault_table = SPEC_SECTION("spec.fault", fault_fields);
static const codec_field spec_fields[] = {
    {CODEC_STR(newt_spec, job, "job"), CODEC_REQUIRED},
    {CODEC_OBJECT("model", model_table)},
    {CODEC_OBJECT("data", data_table)},
    {CODEC_OBJECT("train", train_table)},
    {CODEC_OBJECT("parallel", parallel_table)},
    {CODEC_OBJECT("ckpt", ckpt_table)},
    {CODEC_OBJECT("fault", fault_table)},
    {CODEC_STR(newt_spec, backend, "backend"), .sdef = "cpu"},
    {CODEC_BOOL(newt_spec, restart, "restart"), CODEC_OMIT},
};
static const codec_table spec_table = SPEC_SECTION("spec", spec_fields);

/* A field of table t by its name, its length n (NULL: none). */
static const codec_field *field_named(const codec_table *t, const char *name, size_t n) {
  for (size_t i = 0; i < t->n; i++)
    if (strlen(t->fields[i].name) == n && strncmp(t->fields[i].name, name, n) == 0) return &t->fields[i];
  return NULL;
}

const codec_field *spec_field(const char *path) {
  const char *dot = strchr(path, '.');
  const codec_field *f = field_named(&spec_table, path, dot ? (size_t)(dot - path) : strlen(path));
  if (!f || !dot) return f;
  return f->kind == CODEC_K_OBJECT ? field_named(f->sub, dot + 1, strlen(dot + 1)) : NULL;
}

int spec_field_path(size_t i, char *path, size_t cap) {
  for (size_t k = 0; k < spec_table.n; k++) {
    const codec_field *f = &spec_table.fields[k];
    size_t n = f->kind == CODEC_K_OBJECT ? f->sub->n : 1; /* the fields it holds */
    if (i >= n) {
      i -= n;
      continue;
    }
    if (f->kind == CODEC_K_OBJECT) snprintf(path, cap, "%s.%s", f->name, f->sub->fields[i].name);
    else snprintf(path, cap, "%s", f->name);
    return 1;
  }
  return 0;
}

void spec_defaults(newt_spec *s, const char *job) {
  memset(s, 0, sizeof *s);
  codec_defaults(&spec_table, s);
  snprintf(s->job, sizeof s->job, "%s", job ? job : "");
}

newt_result_t spec_from_cjson(const cJSON *j, newt_spec *out) {
  newt_spec s;
  memset(&s, 0, sizeof s);
  NEWT_CHECK(codec_decode_object(&spec_table, j, "spec", &s));
  NEWT_CHECK(spec_validate(&s));
  *out = s;
  return NEWT_OK;
}

newt_result_t spec_from_json(const char *text, size_t len, newt_spec *s) {
  cJSON *j = NULL;
  NEWT_CHECK(newt_json_parse(text, len, "spec", &j));
  newt_result_t r = spec_from_cjson(j, s);
  cJSON_Delete(j);
  return r;
}

newt_result_t spec_set_model(newt_spec *s, const char *list) {
  if (!list || !*list) return NEWT_OK;
  struct {
    const char *name;
    int64_t *field;
  } fields[] = {{"vocab", &s->vocab}, {"ctx", &s->ctx}, {"layers", &s->layers}, {"heads", &s->heads},
                {"channels", &s->channels}};
  char buf[256];
  if (strlen(list) >= sizeof buf) return NEWT_ERR(NEWT_ERR_INVALID, "model overrides: too long");
  snprintf(buf, sizeof buf, "%s", list);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(tok, '=');
    int64_t v;
    if (!eq || newt_parse_int(eq + 1, &v) != 0 || v < 1)
      return NEWT_ERR(NEWT_ERR_INVALID, "model override \"%s\": expected field=positive integer", tok);
    *eq = '\0';
    size_t i = 0;
    while (i < sizeof fields / sizeof fields[0] && strcmp(fields[i].name, tok) != 0) i++;
    if (i == sizeof fields / sizeof fields[0])
      return NEWT_ERR(NEWT_ERR_INVALID, "model override: unknown field \"%s\" (vocab, ctx, layers, heads, channels)", tok);
    *fields[i].field = v;
  }
  return NEWT_OK;
}

#define RULE(cond, ...)                                        \
  do {                                                         \
    if (!(cond)) return NEWT_ERR(NEWT_ERR_INVALID, __VA_ARGS__); \
  } while (0)

newt_result_t spec_validate(const newt_spec *s) {
  RULE(s->job[0], "spec.job: must not be empty");
  for (const char *p = s->job; *p; p++)
    RULE(isalnum((unsigned char)*p) || *p == '-' || *p == '_' || *p == '.',
         "spec.job: \"%s\" may hold only letters, digits, '-', '_' and '.'", s->job);
  RULE(s->preset[0], "spec.model.preset: must not be empty");
  RULE(s->vocab >= 0 && s->ctx >= 0 && s->layers >= 0 && s->heads >= 0 && s->channels >= 0,
       "spec.model: sizes must not be negative");
  RULE(s->steps >= 1, "spec.train.steps: must be at least 1, got %lld", (long long)s->steps);
  RULE(s->micro_batch >= 1, "spec.train.micro_batch: must be at least 1, got %lld",
       (long long)s->micro_batch);
  RULE(s->global_batch >= 1, "spec.train.global_batch: must be at least 1, got %lld",
       (long long)s->global_batch);
  RULE(s->global_batch % s->micro_batch == 0,
       "spec.train.global_batch: %lld is not a multiple of micro_batch %lld",
       (long long)s->global_batch, (long long)s->micro_batch);
  RULE(s->lr > 0 && isfinite(s->lr), "spec.train.lr: must be positive and finite, got %g", s->lr);
  RULE(s->lr_min >= 0 && s->lr_min <= s->lr, "spec.train.lr_min: must be in [0, lr=%g], got %g",
       s->lr, s->lr_min);
  RULE(s->warmup >= -1, "spec.train.warmup: must be -1 (5%% of the steps) or more");
  RULE(s->seq_len >= 0 && (s->ctx == 0 || s->seq_len <= s->ctx),
       "spec.train.seq_len: must be in [0, ctx] (0: the model's ctx), got %lld", (long long)s->seq_len);
  RULE(s->data_path[0] || s->gen_bytes >= 2, "spec.data.gen_bytes: must be at least 2, got %lld",
       (long long)s->gen_bytes);
  RULE(s->weight_decay >= 0 && isfinite(s->weight_decay), "spec.train.weight_decay: must be finite and not negative, got %g",
       s->weight_decay);
  RULE(s->grad_clip >= 0 && isfinite(s->grad_clip),
       "spec.train.grad_clip: must be finite and not negative (0 disables clipping), got %g", s->grad_clip);
  RULE(s->tp >= 1, "spec.parallel.tp: must be at least 1, got %lld", (long long)s->tp);
  RULE(s->pp >= 1, "spec.parallel.pp: must be at least 1, got %lld", (long long)s->pp);
  RULE(s->zero >= 0 && s->zero <= 3, "spec.parallel.zero: must be 0, 1, 2 or 3, got %lld",
       (long long)s->zero);
  RULE(s->dp_min >= 1, "spec.parallel.dp_min: must be at least 1, got %lld", (long long)s->dp_min);
  RULE(s->dp_max >= s->dp_min, "spec.parallel.dp_max: %lld is below dp_min %lld",
       (long long)s->dp_max, (long long)s->dp_min);
  RULE(s->start_workers >= 0, "spec.parallel.start_workers: must not be negative");
  RULE(s->start_timeout_ms >= 0, "spec.parallel.start_timeout_ms: must not be negative");
  RULE(s->join_window_ms >= 0, "spec.parallel.join_window_ms: must not be negative");
  RULE(s->layers == 0 || s->pp <= s->layers, "spec.parallel.pp: %lld stages for %lld layers",
       (long long)s->pp, (long long)s->layers);
  /* upper bounds, before anything multiplies two fields: a spec comes from etcd or a file
     and must not be able to overflow, divide by zero or loop for ever */
  struct {
    const char *field;
    int64_t v, max;
  } caps[] = {
      {"spec.model.vocab", s->vocab, 1 << 24},       {"spec.model.ctx", s->ctx, 1 << 16},
      {"spec.model.layers", s->layers, 1024},        {"spec.model.heads", s->heads, 1 << 16},
      {"spec.model.channels", s->channels, 1 << 16}, {"spec.train.steps", s->steps, (int64_t)1 << 40},
      {"spec.train.global_batch", s->global_batch, 1 << 24},
      {"spec.train.micro_batch", s->micro_batch, 1 << 24},
      {"spec.train.seq_len", s->seq_len, 1 << 16},   {"spec.train.warmup", s->warmup, (int64_t)1 << 40},
      {"spec.data.gen_bytes", s->gen_bytes, (int64_t)1 << 40},
      {"spec.parallel.tp", s->tp, 1024},             {"spec.parallel.pp", s->pp, 1024},
      {"spec.parallel.dp_min", s->dp_min, 1 << 16},  {"spec.parallel.dp_max", s->dp_max, 1 << 16},
      {"spec.parallel.start_workers", s->start_workers, 1 << 20},
      {"spec.parallel.start_timeout_ms", s->start_timeout_ms, 86400000},
      {"spec.parallel.join_window_ms", s->join_window_ms, 3600000},
      {"spec.ckpt.every", s->ckpt_every, (int64_t)1 << 40}, {"spec.ckpt.keep", s->ckpt_keep, 100000},
      {"spec.fault.lease_ttl_ms", s->lease_ttl_ms, 3600000},
      {"spec.fault.comm_timeout_ms", s->comm_timeout_ms, 86400000},
      {"spec.fault.hang_timeout_ms", s->hang_timeout_ms, 86400000},
      {"spec.fault.first_step_timeout_ms", s->first_step_timeout_ms, 86400000},
      {"spec.fault.report_window_ms", s->report_window_ms, 3600000},
      {"spec.fault.replica_every", s->replica_every, 1 << 20},
      {"spec.fault.max_failures", s->max_failures, 1 << 20},
      {"spec.fault.failure_window_ms", s->failure_window_ms, (int64_t)30 * 86400000},
      {"spec.fault.progress_timeout_ms", s->progress_timeout_ms, (int64_t)30 * 86400000},
      {"spec.fault.verify_every", s->verify_every, 1 << 20},
      {"spec.fault.straggler_window", s->straggler_window, 4096},
  };
  for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++)
    RULE(caps[i].v <= caps[i].max, "%s: at most %lld, got %lld", caps[i].field, (long long)caps[i].max,
         (long long)caps[i].v);
  RULE(s->micro_batch <= s->global_batch, "spec.train.micro_batch: %lld is larger than global_batch %lld",
       (long long)s->micro_batch, (long long)s->global_batch);
  RULE(s->tp * s->pp * s->dp_max <= 1 << 20, "spec.parallel: tp x pp x dp_max = %lld ranks, at most %d",
       (long long)(s->tp * s->pp * s->dp_max), 1 << 20);
  RULE(s->even_batches || s->dp_min <= s->global_batch,
       "spec.parallel.dp_min: %lld data-parallel ranks, but the global batch has %lld samples (one for each at the "
       "least)",
       (long long)s->dp_min, (long long)s->global_batch);
  int feasible = !s->even_batches; /* any size up to the global batch: the ranks split its samples */
  for (int64_t dp = s->dp_min; dp <= s->dp_max && dp <= s->global_batch && !feasible; dp++)
    feasible = s->global_batch % (dp * s->micro_batch) == 0;
  RULE(feasible,
       "spec.train.global_batch: %lld cannot be split into micro-batches of %lld over any "
       "data-parallel size in [%lld, %lld] (spec.parallel.even_batches asks every rank to take as many)",
       (long long)s->global_batch, (long long)s->micro_batch, (long long)s->dp_min,
       (long long)s->dp_max);
  RULE(s->ckpt_every >= 0, "spec.ckpt.every: must not be negative (0 disables checkpoints)");
  RULE(!s->restart || !s->ckpt_dir[0],
       "spec.ckpt.dir: a job of the restart mode (spec.restart) keeps no checkpoint of newt's: its program saves its "
       "own; leave the directory out");
  RULE(s->ckpt_keep >= 1, "spec.ckpt.keep: must be at least 1, got %lld", (long long)s->ckpt_keep);
  RULE(s->ckpt_level >= -7 && s->ckpt_level <= 22, "spec.ckpt.level: zstd levels are -7..22, got %lld",
       (long long)s->ckpt_level);
  RULE(s->ckpt_every == 0 || s->ckpt_dir[0], "spec.ckpt.dir: needed when ckpt.every is set");
  RULE(s->lease_ttl_ms >= 1000, "spec.fault.lease_ttl_ms: must be at least 1000 (etcd's minimum), got %lld",
       (long long)s->lease_ttl_ms);
  RULE(s->comm_timeout_ms >= 50, "spec.fault.comm_timeout_ms: must be at least 50, got %lld",
       (long long)s->comm_timeout_ms);
  RULE(s->hang_timeout_ms >= 100, "spec.fault.hang_timeout_ms: must be at least 100, got %lld",
       (long long)s->hang_timeout_ms);
  RULE(s->first_step_timeout_ms >= 100, "spec.fault.first_step_timeout_ms: must be at least 100, got %lld",
       (long long)s->first_step_timeout_ms);
  RULE(s->report_window_ms >= 0, "spec.fault.report_window_ms: must not be negative");
  RULE(s->max_failures >= 0, "spec.fault.max_failures: must not be negative (0: no budget)");
  RULE(s->failure_window_ms >= 1000, "spec.fault.failure_window_ms: must be at least 1000, got %lld",
       (long long)s->failure_window_ms);
  RULE(s->progress_timeout_ms == 0 || s->progress_timeout_ms >= 1000,
       "spec.fault.progress_timeout_ms: must be 0 (wait for ever) or at least 1000, got %lld",
       (long long)s->progress_timeout_ms);
  RULE(s->verify_every >= 0, "spec.fault.verify_every: must not be negative (0: never), got %lld",
       (long long)s->verify_every);
  RULE(s->straggler_window >= 0, "spec.fault.straggler_window: must not be negative (0: never rebalance), got %lld",
       (long long)s->straggler_window);
  RULE(s->straggler_margin >= 0.01 && s->straggler_margin <= 100,
       "spec.fault.straggler_margin: must be 0.01..100 (a fraction of the median rank's compute), got %g",
       s->straggler_margin);
  RULE(s->straggler_replace == 0 || (s->straggler_replace >= 1 && s->straggler_replace <= 1000),
       "spec.fault.straggler_replace: must be 0 (never) or 1..1000 (times the median rank's compute per sample), got %g",
       s->straggler_replace);
  RULE(s->replica_every >= 1, "spec.fault.replica_every: must be at least 1, got %lld",
       (long long)s->replica_every);
  RULE(s->replicas >= 1 && s->replicas <= SPEC_REPLICAS_MAX,
       "spec.fault.replicas: must be 1..%d (copies of each ZeRO shard, on as many other failure domains), got %lld",
       SPEC_REPLICAS_MAX, (long long)s->replicas);
  char backends[128]; /* the backend table's names (common/backend.h) */
  RULE(newt_backend_find(s->backend), "spec.backend: must be %s, got \"%s\"",
       newt_backend_names(backends, sizeof backends, "\""), s->backend);
  return NEWT_OK;
}

void spec_set_restart(newt_spec *s) {
  s->restart = 1;
  s->steps = SPEC_RESTART_BEATS;
  s->global_batch = SPEC_RESTART_BATCH;
  s->micro_batch = 1;
}

char *spec_to_json(const newt_spec *s) {
  char *text;
  return codec_encode(&spec_table, s, &text) == NEWT_OK ? text : NULL;
}

newt_result_t spec_check_json(const newt_spec *s) {
  char *text = spec_to_json(s);
  NEWT_CHECK_ALLOC(text);
  newt_spec back;
  newt_result_t r = spec_from_json(text, strlen(text), &back);
  char *again = r == NEWT_OK ? spec_to_json(&back) : NULL;
  if (r != NEWT_OK) r = newt_err_wrap(r, "the spec as written does not read back: ");
  else if (!again) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: the spec read back");
  else if (strcmp(text, again) != 0) {
    size_t i = 0;
    while (text[i] && text[i] == again[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    r = NEWT_ERR(NEWT_ERR_INVALID, "the spec reads back otherwise than written, at ...%.60s... (read: ...%.60s...)",
                 text + from, again + from);
  }
  free(text);
  free(again);
  return r;
}

void spec_data_desc(const newt_spec *s, char *out, size_t cap) {
  if (s->data_path[0]) snprintf(out, cap, "%s", s->data_path);
  else snprintf(out, cap, "generated:%lld", (long long)s->gen_bytes);
}

/* --- changes to a running job's spec ----------------------------------------------------- */

static const char *const changeable[] = {
    "parallel.dp_min",        "parallel.dp_max",        "parallel.start_workers", "parallel.start_timeout_ms",
    "parallel.join_window_ms",
    "ckpt.every",             "ckpt.keep",              "ckpt.level",             "fault.comm_timeout_ms",
    "fault.hang_timeout_ms",  "fault.first_step_timeout_ms", "fault.report_window_ms", "fault.replica_every",    "fault.max_failures",
    "fault.failure_window_ms", "fault.progress_timeout_ms", "fault.on_state_loss", "fault.verify_every",
    "fault.on_mismatch", "fault.straggler_margin", "fault.straggler_window",
    "fault.straggler_replace", NULL};

/* Walks the leaves of a and b (both from spec_to_json: the same shape, but for the fields
 * written only when not their default, absent from one side) and notes every difference;
 * returns the first that may not change (NULL: none). */
static const char *diff_leaves(const cJSON *a, const cJSON *b, const char *path, newt_buf *changed, char *bad,
                               size_t cap) {
  if (cJSON_IsObject(a) || cJSON_IsObject(b)) {
    const char *first = NULL;
    for (int side = 0; side < 2; side++) { /* a's fields, then those only b has */
      const cJSON *from = side ? b : a;
      for (const cJSON *x = from ? from->child : NULL; x; x = x->next) {
        const cJSON *other = cJSON_GetObjectItemCaseSensitive(side ? a : b, x->string);
        if (side && other) continue;
        char sub[128];
        snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", x->string);
        const char *r = side ? diff_leaves(NULL, x, sub, changed, bad, cap) : diff_leaves(x, other, sub, changed, bad, cap);
        if (r && !first) first = r;
      }
    }
    return first;
  }
  /* a field written only when not its default reads "default" where absent */
  char *sa = a ? cJSON_PrintUnformatted(a) : newt_strdup("default"), *sb = b ? cJSON_PrintUnformatted(b) : newt_strdup("default");
  const char *res = NULL;
  if (sa && sb && strcmp(sa, sb) != 0) {
    int ok = 0;
    for (int i = 0; changeable[i]; i++) ok |= strcmp(changeable[i], path) == 0;
    if (ok) newt_buf_printf(changed, "%s%s %s -> %s", changed->len ? ", " : "", path, sa, sb);
    else if (!bad[0]) snprintf(bad, cap, "spec.%s: %s -> %s", path, sa, sb), res = bad;
    else res = bad;
  }
  free(sa);
  free(sb);
  return res;
}

int spec_update_allowed(const newt_spec *a, const newt_spec *b, char *changed, size_t cap) {
  if (a->restart != b->restart) { /* written only when set: the walk below may not see it */
    NEWT_ERR(NEWT_ERR_CONFLICT,
             "spec.restart: %s -> %s cannot change while job %s runs (its workers are %s); start a new job",
             a->restart ? "true" : "false", b->restart ? "true" : "false", a->job,
             a->restart ? "supervisors of programs that do not link newt" : "programs on libnewt");
    return 0;
  }
  if (a->replicas != b->replicas) { /* written only when not 1: the walk below may not see it */
    NEWT_ERR(NEWT_ERR_CONFLICT,
             "spec.fault.replicas: %lld -> %lld cannot change while job %s runs (the placement and every rank's "
             "copies follow it); keep the old value, or start a new job",
             (long long)a->replicas, (long long)b->replicas, a->job);
    return 0;
  }
  char *ta = spec_to_json(a), *tb = spec_to_json(b);
  cJSON *ja = ta ? cJSON_Parse(ta) : NULL, *jb = tb ? cJSON_Parse(tb) : NULL;
  free(ta);
  free(tb);
  if (!ja || !jb) {
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    NEWT_ERR(NEWT_ERR_NOMEM, "out of memory comparing specs");
    return 0;
  }
  newt_buf list;
  newt_buf_init(&list);
  char bad[256] = "";
  const char *first = diff_leaves(ja, jb, "", &list, bad, sizeof bad);
  cJSON_Delete(ja);
  cJSON_Delete(jb);
  if (changed && cap) snprintf(changed, cap, "%s", list.data ? list.data : "");
  newt_buf_free(&list);
  if (first) {
    NEWT_ERR(NEWT_ERR_CONFLICT,
             "%s cannot change while job %s runs (only the data-parallel range, start_*, ckpt.every/keep/level "
             "and the fault timeouts and budget can); keep the old value, or start a new job (another job.name, "
             "or delete /newt/%s/ in etcd once this one is stopped)",
             first, a->job, a->job);
    return 0;
  }
  return 1;
}
