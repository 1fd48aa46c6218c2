/* Parsing, validation and printing of the job spec (see spec.h). Each section is read
 * with the field-naming JSON getters; unknown fields are errors; spec_validate holds the
 * rules that tie fields together. */
#include "job/spec.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/strutil.h"

void spec_defaults(newt_spec *s, const char *job) {
  memset(s, 0, sizeof *s);
  snprintf(s->job, sizeof s->job, "%s", job ? job : "");
  snprintf(s->preset, sizeof s->preset, "tiny");
  s->data_seed = 1;
  s->gen_bytes = 1 << 21;
  s->steps = 100;
  s->global_batch = 32;
  s->micro_batch = 4;
  s->seq_len = 0;
  s->lr = 1e-3;
  s->lr_min = 1e-4;
  s->weight_decay = 0.1;
  s->grad_clip = 1.0;
  s->warmup = -1;
  s->seed = 1;
  s->tp = 1;
  s->pp = 1;
  s->zero = 0;
  s->dp_min = 1;
  s->dp_max = 1024;
  s->start_workers = 0;
  s->start_timeout_ms = 30000;
  s->join_window_ms = SPEC_JOIN_WINDOW_MS;
  s->ckpt_every = 0;
  s->ckpt_keep = 3;
  s->ckpt_level = 3;
  s->lease_ttl_ms = 2000;
  s->comm_timeout_ms = 3000;
  s->hang_timeout_ms = 5000;
  s->first_step_timeout_ms = 120000;
  s->report_window_ms = 300;
  s->replica_every = 1;
  s->replicas = 1;
  s->max_failures = 10;
  s->failure_window_ms = 600000;
  s->progress_timeout_ms = SPEC_PROGRESS_TIMEOUT_MS;
  snprintf(s->backend, sizeof s->backend, "cpu");
}

/* Numbers are JSON numbers: "steps": "20" is refused naming the field, as a typo would be. */
#define GET_INT(obj, what, field, out) newt_json_get_int_strict(obj, what, field, 0, out)
#define GET_DOUBLE(obj, what, field, out) newt_json_get_double_strict(obj, what, field, 0, out)

/* A seed is 64 bits, more than a JSON number holds exactly (2^53), so spec_to_json writes one
 * beyond SEED_NUMBER_MAX as a decimal string (as newt_json_add_int writes every int64, which is
 * how newt wrote seeds before): a number, or such a string of digits, and nothing else. */
#define SEED_NUMBER_MAX 999999999999999ULL /* 15 digits: what cJSON prints exactly */

static newt_result_t get_seed(const cJSON *obj, const char *what, const char *field, uint64_t *out) {
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
  NEWT_CHECK(GET_INT(obj, what, field, &v));
  if (v < 0) return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: must not be negative, got %lld", what, field, (long long)v);
  *out = (uint64_t)v;
  return NEWT_OK;
}

/* The writer of get_seed's form. */
static void add_seed(cJSON *obj, const char *field, uint64_t v) {
  if (v <= SEED_NUMBER_MAX) {
    cJSON_AddNumberToObject(obj, field, (double)v);
    return;
  }
  char digits[24];
  snprintf(digits, sizeof digits, "%llu", (unsigned long long)v);
  cJSON_AddStringToObject(obj, field, digits);
}

static newt_result_t parse_model(const cJSON *m, newt_spec *s) {
  static const char *const known[] = {"preset", "vocab", "ctx", "layers", "heads", "channels", NULL};
  const char *w = "spec.model";
  NEWT_CHECK(newt_json_check_fields(m, w, known));
  NEWT_CHECK(newt_json_get_strcpy(m, w, "preset", 0, s->preset, sizeof s->preset));
  NEWT_CHECK(GET_INT(m, w, "vocab", &s->vocab));
  NEWT_CHECK(GET_INT(m, w, "ctx", &s->ctx));
  NEWT_CHECK(GET_INT(m, w, "layers", &s->layers));
  NEWT_CHECK(GET_INT(m, w, "heads", &s->heads));
  NEWT_CHECK(GET_INT(m, w, "channels", &s->channels));
  return NEWT_OK;
}

static newt_result_t parse_data(const cJSON *d, newt_spec *s) {
  static const char *const known[] = {"path", "seed", "gen_bytes", NULL};
  NEWT_CHECK(newt_json_check_fields(d, "spec.data", known));
  NEWT_CHECK(newt_json_get_strcpy(d, "spec.data", "path", 0, s->data_path, sizeof s->data_path));
  NEWT_CHECK(GET_INT(d, "spec.data", "gen_bytes", &s->gen_bytes));
  return get_seed(d, "spec.data", "seed", &s->data_seed);
}

static newt_result_t parse_train(const cJSON *t, newt_spec *s) {
  static const char *const known[] = {"steps", "global_batch", "micro_batch", "seq_len", "lr", "lr_min", "warmup",
                                      "weight_decay", "grad_clip", "seed", NULL};
  const char *w = "spec.train";
  NEWT_CHECK(newt_json_check_fields(t, w, known));
  NEWT_CHECK(GET_INT(t, w, "steps", &s->steps));
  NEWT_CHECK(GET_INT(t, w, "global_batch", &s->global_batch));
  NEWT_CHECK(GET_INT(t, w, "micro_batch", &s->micro_batch));
  NEWT_CHECK(GET_INT(t, w, "seq_len", &s->seq_len));
  NEWT_CHECK(GET_DOUBLE(t, w, "lr", &s->lr));
  NEWT_CHECK(GET_DOUBLE(t, w, "lr_min", &s->lr_min));
  NEWT_CHECK(GET_INT(t, w, "warmup", &s->warmup));
  NEWT_CHECK(GET_DOUBLE(t, w, "weight_decay", &s->weight_decay));
  NEWT_CHECK(GET_DOUBLE(t, w, "grad_clip", &s->grad_clip));
  return get_seed(t, w, "seed", &s->seed);
}

static newt_result_t parse_parallel(const cJSON *p, newt_spec *s) {
  static const char *const known[] = {"tp",      "pp", "zero", "dp_min", "dp_max", "start_workers", "start_timeout_ms",
                                      "even_batches", "join_window_ms", NULL};
  const char *w = "spec.parallel";
  NEWT_CHECK(newt_json_check_fields(p, w, known));
  NEWT_CHECK(GET_INT(p, w, "tp", &s->tp));
  NEWT_CHECK(GET_INT(p, w, "pp", &s->pp));
  NEWT_CHECK(GET_INT(p, w, "zero", &s->zero));
  NEWT_CHECK(GET_INT(p, w, "dp_min", &s->dp_min));
  NEWT_CHECK(GET_INT(p, w, "start_workers", &s->start_workers));
  NEWT_CHECK(GET_INT(p, w, "start_timeout_ms", &s->start_timeout_ms));
  NEWT_CHECK(GET_INT(p, w, "join_window_ms", &s->join_window_ms));
  NEWT_CHECK(newt_json_get_bool(p, w, "even_batches", 0, &s->even_batches));
  return GET_INT(p, w, "dp_max", &s->dp_max);
}

static newt_result_t parse_ckpt(const cJSON *c, newt_spec *s) {
  static const char *const known[] = {"dir", "every", "keep", "level", NULL};
  const char *w = "spec.ckpt";
  NEWT_CHECK(newt_json_check_fields(c, w, known));
  NEWT_CHECK(newt_json_get_strcpy(c, w, "dir", 0, s->ckpt_dir, sizeof s->ckpt_dir));
  NEWT_CHECK(GET_INT(c, w, "every", &s->ckpt_every));
  NEWT_CHECK(GET_INT(c, w, "keep", &s->ckpt_keep));
  return GET_INT(c, w, "level", &s->ckpt_level);
}

static newt_result_t parse_fault(const cJSON *f, newt_spec *s) {
  static const char *const known[] = {"lease_ttl_ms", "comm_timeout_ms", "hang_timeout_ms",
                                      "first_step_timeout_ms", "report_window_ms", "replica_every", "replicas",
                                      "max_failures", "failure_window_ms", "progress_timeout_ms", NULL};
  const char *w = "spec.fault";
  NEWT_CHECK(newt_json_check_fields(f, w, known));
  NEWT_CHECK(GET_INT(f, w, "lease_ttl_ms", &s->lease_ttl_ms));
  NEWT_CHECK(GET_INT(f, w, "comm_timeout_ms", &s->comm_timeout_ms));
  NEWT_CHECK(GET_INT(f, w, "hang_timeout_ms", &s->hang_timeout_ms));
  NEWT_CHECK(GET_INT(f, w, "first_step_timeout_ms", &s->first_step_timeout_ms));
  NEWT_CHECK(GET_INT(f, w, "report_window_ms", &s->report_window_ms));
  NEWT_CHECK(GET_INT(f, w, "max_failures", &s->max_failures));
  NEWT_CHECK(GET_INT(f, w, "failure_window_ms", &s->failure_window_ms));
  NEWT_CHECK(GET_INT(f, w, "replicas", &s->replicas));
  NEWT_CHECK(GET_INT(f, w, "progress_timeout_ms", &s->progress_timeout_ms));
  return GET_INT(f, w, "replica_every", &s->replica_every);
}

typedef newt_result_t (*section_fn)(const cJSON *, newt_spec *);

newt_result_t spec_from_cjson(const cJSON *j, newt_spec *out) {
  static const char *const known[] = {"job", "model", "data", "train", "parallel", "ckpt", "fault",
                                      "backend", NULL};
  static const struct {
    const char *name;
    section_fn fn;
  } sections[] = {{"model", parse_model},       {"data", parse_data}, {"train", parse_train},
                  {"parallel", parse_parallel}, {"ckpt", parse_ckpt}, {"fault", parse_fault}};
  NEWT_CHECK(newt_json_check_fields(j, "spec", known));
  const char *job = NULL;
  NEWT_CHECK(newt_json_get_str(j, "spec", "job", 1, &job));
  newt_spec s;
  spec_defaults(&s, "");
  if (strlen(job) >= sizeof s.job)
    return NEWT_ERR(NEWT_ERR_INVALID, "spec.job: longer than %zu characters", sizeof s.job - 1);
  snprintf(s.job, sizeof s.job, "%s", job);
  for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++) {
    const cJSON *sec = NULL;
    NEWT_CHECK(newt_json_get_obj(j, "spec", sections[i].name, 0, &sec));
    if (sec) NEWT_CHECK(sections[i].fn(sec, &s));
  }
  NEWT_CHECK(newt_json_get_strcpy(j, "spec", "backend", 0, s.backend, sizeof s.backend));
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
  RULE(s->replica_every >= 1, "spec.fault.replica_every: must be at least 1, got %lld",
       (long long)s->replica_every);
  RULE(s->replicas >= 1 && s->replicas <= SPEC_REPLICAS_MAX,
       "spec.fault.replicas: must be 1..%d (copies of each ZeRO shard, on as many other failure domains), got %lld",
       SPEC_REPLICAS_MAX, (long long)s->replicas);
  RULE(strcmp(s->backend, "cpu") == 0 || strcmp(s->backend, "nccl") == 0,
       "spec.backend: must be \"cpu\" or \"nccl\", got \"%s\"", s->backend);
  return NEWT_OK;
}

char *spec_to_json(const newt_spec *s) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  cJSON_AddStringToObject(j, "job", s->job);
  cJSON *m = cJSON_AddObjectToObject(j, "model");
  cJSON_AddStringToObject(m, "preset", s->preset);
  const struct {
    const char *k;
    int64_t v;
  } sizes[] = {{"vocab", s->vocab}, {"ctx", s->ctx}, {"layers", s->layers}, {"heads", s->heads}, {"channels", s->channels}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (sizes[i].v) newt_json_add_int(m, sizes[i].k, sizes[i].v);
  cJSON *d = cJSON_AddObjectToObject(j, "data");
  cJSON_AddStringToObject(d, "path", s->data_path);
  add_seed(d, "seed", s->data_seed);
  newt_json_add_int(d, "gen_bytes", s->gen_bytes);
  cJSON *t = cJSON_AddObjectToObject(j, "train");
  newt_json_add_int(t, "steps", s->steps);
  newt_json_add_int(t, "global_batch", s->global_batch);
  newt_json_add_int(t, "micro_batch", s->micro_batch);
  newt_json_add_int(t, "seq_len", s->seq_len);
  cJSON_AddNumberToObject(t, "lr", s->lr);
  cJSON_AddNumberToObject(t, "lr_min", s->lr_min);
  newt_json_add_int(t, "warmup", s->warmup);
  cJSON_AddNumberToObject(t, "weight_decay", s->weight_decay);
  cJSON_AddNumberToObject(t, "grad_clip", s->grad_clip);
  add_seed(t, "seed", s->seed);
  cJSON *p = cJSON_AddObjectToObject(j, "parallel");
  newt_json_add_int(p, "tp", s->tp);
  newt_json_add_int(p, "pp", s->pp);
  newt_json_add_int(p, "zero", s->zero);
  newt_json_add_int(p, "dp_min", s->dp_min);
  newt_json_add_int(p, "dp_max", s->dp_max);
  newt_json_add_int(p, "start_workers", s->start_workers);
  newt_json_add_int(p, "start_timeout_ms", s->start_timeout_ms);
  /* written when not the default: a spec of the defaults reads in a release without it */
  if (s->join_window_ms != SPEC_JOIN_WINDOW_MS) newt_json_add_int(p, "join_window_ms", s->join_window_ms);
  if (s->even_batches) cJSON_AddBoolToObject(p, "even_batches", 1); /* absent: false, as before it existed */
  cJSON *c = cJSON_AddObjectToObject(j, "ckpt");
  cJSON_AddStringToObject(c, "dir", s->ckpt_dir);
  newt_json_add_int(c, "every", s->ckpt_every);
  newt_json_add_int(c, "keep", s->ckpt_keep);
  newt_json_add_int(c, "level", s->ckpt_level);
  cJSON *f = cJSON_AddObjectToObject(j, "fault");
  newt_json_add_int(f, "lease_ttl_ms", s->lease_ttl_ms);
  newt_json_add_int(f, "comm_timeout_ms", s->comm_timeout_ms);
  newt_json_add_int(f, "hang_timeout_ms", s->hang_timeout_ms);
  newt_json_add_int(f, "first_step_timeout_ms", s->first_step_timeout_ms);
  newt_json_add_int(f, "report_window_ms", s->report_window_ms);
  newt_json_add_int(f, "replica_every", s->replica_every);
  if (s->replicas != 1) newt_json_add_int(f, "replicas", s->replicas); /* absent: 1, as before it existed */
  newt_json_add_int(f, "max_failures", s->max_failures);
  newt_json_add_int(f, "failure_window_ms", s->failure_window_ms);
  if (s->progress_timeout_ms != SPEC_PROGRESS_TIMEOUT_MS) /* absent: the default, as before it existed */
    newt_json_add_int(f, "progress_timeout_ms", s->progress_timeout_ms);
  cJSON_AddStringToObject(j, "backend", s->backend);
  char *out = newt_json_print(j);
  cJSON_Delete(j);
  return out;
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
    "fault.failure_window_ms", "fault.progress_timeout_ms", NULL};

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
