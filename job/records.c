/* The records of a job in etcd (see records.h): keys, and for each record one writer (a
 * cJSON document, so strings are always escaped) and one parser that checks every field it
 * takes before anyone acts on it. */
#include "job/records.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/log.h"
#include "common/param.h"

NEWT_PARAM(EtcdCallMs, "NEWT_ETCD_CALL_MS", 5000)

newt_deadline_t job_call_deadline(void) { return newt_deadline_in_ms(newt_param_EtcdCallMs()); }

/* --- keys ------------------------------------------------------------------------------------ */

static const struct {
  job_record rec;
  const char *name; /* the key, or its prefix when it ends in '/' */
} keys[] = {
    {JOB_REC_SPEC, "spec"},         {JOB_REC_PLAN, "plan"},         {JOB_REC_PROGRESS, "progress"},
    {JOB_REC_DONE, "done"},         {JOB_REC_CKPT, "ckpt"},         {JOB_REC_WORKER, "workers/"},
    {JOB_REC_ELECTION, "election/"}, {JOB_REC_REPORT, "reports/"},  {JOB_REC_ACK, "acks/"},
    {JOB_REC_EVENT, "events/"},     {JOB_REC_FAILED, "failed"},     {JOB_REC_FAULT, "faults/"},
    {JOB_REC_LINKS, "links/"},
};

newt_result_t job_key(char *out, size_t cap, const char *job, job_record rec, uint64_t generation, const char *id) {
  const char *name = NULL;
  for (size_t i = 0; i < sizeof keys / sizeof keys[0] && !name; i++)
    if (keys[i].rec == rec) name = keys[i].name;
  if (!name || rec == JOB_REC_ELECTION || rec == JOB_REC_EVENT)
    return NEWT_ERR(NEWT_ERR_INVALID, "job_key: no single key for record %d", (int)rec);
  char suffix[128];
  if (rec == JOB_REC_REPORT || rec == JOB_REC_ACK) {
    NEWT_CHECK(rdzv_check_name("worker id", id));
    snprintf(suffix, sizeof suffix, "%s%020llu/%s", name, (unsigned long long)generation, id);
  } else if (rec == JOB_REC_WORKER || rec == JOB_REC_LINKS) {
    NEWT_CHECK(rdzv_check_name("worker id", id));
    snprintf(suffix, sizeof suffix, "%s%s", name, id);
  } else if (rec == JOB_REC_FAULT) {
    snprintf(suffix, sizeof suffix, "%s%020llu", name, (unsigned long long)generation);
  } else {
    snprintf(suffix, sizeof suffix, "%s", name);
  }
  return rdzv_key(out, cap, job, suffix);
}

job_record job_key_parse(const char *rest, uint64_t *generation, const char **id) {
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    const char *name = keys[i].name;
    size_t n = strlen(name);
    if (name[n - 1] != '/') {
      if (strcmp(rest, name) == 0) return keys[i].rec;
      continue;
    }
    if (strncmp(rest, name, n) != 0) continue;
    const char *tail = rest + n;
    job_record rec = keys[i].rec;
    if (rec == JOB_REC_REPORT || rec == JOB_REC_ACK || rec == JOB_REC_FAULT) {
      /* "<20 digits>/<id>", or "<20 digits>" alone for a fault */
      size_t digits = 0;
      uint64_t g = 0;
      while (tail[digits] >= '0' && tail[digits] <= '9' && digits < 20) g = g * 10 + (uint64_t)(tail[digits++] - '0');
      if (digits != 20 || tail[20] != (rec == JOB_REC_FAULT ? '\0' : '/')) return JOB_REC_OTHER;
      tail += 21;
      if (generation) *generation = g;
    }
    if (rec == JOB_REC_REPORT || rec == JOB_REC_ACK || rec == JOB_REC_WORKER || rec == JOB_REC_LINKS) {
      char name_copy[RDZV_NAME_MAX];
      if (strlen(tail) >= sizeof name_copy) return JOB_REC_OTHER;
      snprintf(name_copy, sizeof name_copy, "%s", tail);
      if (rdzv_check_name("worker id", name_copy) != NEWT_OK) return JOB_REC_OTHER;
      if (id) *id = tail;
    }
    return rec;
  }
  return JOB_REC_OTHER;
}

/* --- parsing helpers ------------------------------------------------------------------------- */

/* The document as an object; errors name `what`. */
static newt_result_t parse_object(const char *text, size_t len, const char *what, cJSON **out) {
  NEWT_CHECK(newt_json_parse(text, len, what, out));
  if (!cJSON_IsObject(*out)) {
    cJSON_Delete(*out);
    *out = NULL;
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: expected a JSON object", what);
  }
  return NEWT_OK;
}

/* An integer field in [lo, hi]. */
static newt_result_t get_range(const cJSON *j, const char *what, const char *field, int required, int64_t lo,
                               int64_t hi, int64_t *out) {
  int64_t v = *out;
  NEWT_CHECK(newt_json_get_int(j, what, field, required, &v));
  if (v < lo || v > hi)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: %lld is out of range [%lld, %lld]", what, field, (long long)v,
                    (long long)lo, (long long)hi);
  *out = v;
  return NEWT_OK;
}

/* A wall-clock stamp in ms (or any other count that cannot be negative). */
static newt_result_t get_ms(const cJSON *j, const char *what, const char *field, int required, uint64_t *out) {
  int64_t v = (int64_t)*out;
  NEWT_CHECK(get_range(j, what, field, required, 0, INT64_MAX, &v));
  *out = (uint64_t)v;
  return NEWT_OK;
}

/* A number that may be null (NaN: a loss that was not finite). */
static newt_result_t get_real(const cJSON *j, const char *what, const char *field, int required, double *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(j, field);
  if (cJSON_IsNull(it)) {
    *out = NAN;
    return NEWT_OK;
  }
  return newt_json_get_double(j, what, field, required, out);
}

/* Free text for people (a report's or a waiting event's why, a directory, a name): copied,
 * with every control character (a terminal escape, a newline) made a '?', since readers
 * print it. */
static newt_result_t get_text(const cJSON *j, const char *what, const char *field, int required, char *out,
                              size_t cap) {
  NEWT_CHECK(newt_json_get_strcpy(j, what, field, required, out, cap));
  for (char *p = out; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
  return NEWT_OK;
}

/* A string from the NULL-terminated set `allowed`. */
static newt_result_t get_word(const cJSON *j, const char *what, const char *field, int required,
                              const char *const *allowed, char *out, size_t cap) {
  const char *s = NULL;
  NEWT_CHECK(newt_json_get_str(j, what, field, required, &s));
  if (!s) return NEWT_OK;
  char list[160] = "";
  for (size_t i = 0; allowed[i]; i++) {
    if (strcmp(s, allowed[i]) == 0) {
      snprintf(out, cap, "%s", s);
      return NEWT_OK;
    }
    size_t l = strlen(list);
    snprintf(list + l, sizeof list - l, "%s%s", i ? (allowed[i + 1] ? ", " : " or ") : "", allowed[i]);
  }
  return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: expected %s, got \"%.40s\"", what, field, list, s);
}

/* A worker id (1-63 of [A-Za-z0-9._-]). */
static newt_result_t get_name(const cJSON *j, const char *what, const char *field, int required, char *out) {
  char tmp[RDZV_NAME_MAX] = "";
  newt_result_t r = newt_json_get_strcpy(j, what, field, required, tmp, sizeof tmp);
  if (r != NEWT_OK) return r;
  if (!tmp[0] && !required && !cJSON_GetObjectItemCaseSensitive(j, field)) return NEWT_OK;
  char label[96];
  snprintf(label, sizeof label, "%s.%s", what, field);
  NEWT_CHECK(rdzv_check_name(label, tmp));
  memcpy(out, tmp, sizeof tmp);
  return NEWT_OK;
}

/* A finished document, printed compactly; NULL when out of memory. */
static char *finish(cJSON *j) {
  char *text = j ? newt_json_print(j) : NULL;
  cJSON_Delete(j);
  return text;
}

static const char *const kinds[] = {"crash", "hang", NULL};
static const char *const restores[] = {"memory", "peer", "init", "ckpt", NULL};

int job_restore_rank(const char *restore) {
  for (int i = 0; restores[i]; i++)
    if (strcmp(restore, restores[i]) == 0) return i;
  return -1;
}

/* --- report ---------------------------------------------------------------------------------- */

char *job_report_to_json(const job_report *r) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  cJSON_AddStringToObject(j, "worker", r->worker);
  cJSON_AddStringToObject(j, "kind", r->hang ? "hang" : "crash");
  cJSON_AddStringToObject(j, "during", r->build ? "build" : "step");
  cJSON *acc = cJSON_AddArrayToObject(j, "accuse");
  for (int i = 0; acc && i < r->naccuse && i < JOB_ACCUSE_MAX; i++)
    cJSON_AddItemToArray(acc, cJSON_CreateString(r->accuse[i]));
  newt_json_add_int(j, "step", r->step);
  newt_json_add_int(j, "t_ms", (int64_t)r->t_ms);
  cJSON_AddStringToObject(j, "why", r->why);
  return finish(j);
}

newt_result_t job_report_from_json(const char *text, size_t len, job_report *out) {
  const char *what = "report";
  cJSON *j;
  NEWT_CHECK(parse_object(text, len, what, &j));
  job_report r;
  memset(&r, 0, sizeof r);
  r.step = -1;
  char kind[8] = "", during[8] = "step";
  const cJSON *acc = NULL;
  static const char *const phases[] = {"step", "build", NULL};
  newt_result_t res = get_name(j, what, "worker", 1, r.worker);
  if (res == NEWT_OK) res = get_word(j, what, "kind", 1, kinds, kind, sizeof kind);
  if (res == NEWT_OK) res = get_word(j, what, "during", 0, phases, during, sizeof during);
  if (res == NEWT_OK) res = get_range(j, what, "step", 1, -1, INT64_MAX, &r.step);
  if (res == NEWT_OK) res = get_ms(j, what, "t_ms", 1, &r.t_ms);
  if (res == NEWT_OK) res = get_text(j, what, "why", 0, r.why, sizeof r.why);
  if (res == NEWT_OK) res = newt_json_get_arr(j, what, "accuse", 0, &acc);
  if (res == NEWT_OK && cJSON_GetArraySize(acc) > JOB_ACCUSE_MAX)
    res = NEWT_ERR(NEWT_ERR_INVALID, "report.accuse: %d workers, at most %d", cJSON_GetArraySize(acc), JOB_ACCUSE_MAX);
  int i = 0;
  for (const cJSON *a = acc ? acc->child : NULL; res == NEWT_OK && a; a = a->next, i++) {
    char label[48];
    snprintf(label, sizeof label, "report.accuse[%d]", i);
    if (!cJSON_IsString(a)) res = NEWT_ERR(NEWT_ERR_INVALID, "%s: expected a worker id", label);
    else if ((res = rdzv_check_name(label, a->valuestring)) == NEWT_OK)
      snprintf(r.accuse[r.naccuse++], RDZV_NAME_MAX, "%s", a->valuestring);
  }
  cJSON_Delete(j);
  if (res != NEWT_OK) return res;
  r.hang = strcmp(kind, "hang") == 0;
  r.build = strcmp(during, "build") == 0;
  *out = r;
  return NEWT_OK;
}

/* --- ack ------------------------------------------------------------------------------------- */

char *job_ack_to_json(const job_ack *a) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  newt_json_add_int(j, "rank", a->rank);
  newt_json_add_int(j, "t_plan", (int64_t)a->t_plan);
  newt_json_add_int(j, "t_comm", (int64_t)a->t_comm);
  newt_json_add_int(j, "t_restore", (int64_t)a->t_restore);
  newt_json_add_int(j, "t_step", (int64_t)a->t_step);
  cJSON_AddStringToObject(j, "restore", a->restore);
  newt_json_add_int(j, "restore_step", a->restore_step);
  return finish(j);
}

newt_result_t job_ack_from_json(const char *text, size_t len, job_ack *out) {
  const char *what = "ack";
  cJSON *j;
  NEWT_CHECK(parse_object(text, len, what, &j));
  job_ack a;
  memset(&a, 0, sizeof a);
  newt_result_t r = get_range(j, what, "rank", 1, 0, INT32_MAX, &a.rank);
  if (r == NEWT_OK) r = get_ms(j, what, "t_plan", 1, &a.t_plan);
  if (r == NEWT_OK) r = get_ms(j, what, "t_comm", 1, &a.t_comm);
  if (r == NEWT_OK) r = get_ms(j, what, "t_restore", 1, &a.t_restore);
  if (r == NEWT_OK) r = get_ms(j, what, "t_step", 1, &a.t_step);
  if (r == NEWT_OK) r = get_word(j, what, "restore", 1, restores, a.restore, sizeof a.restore);
  if (r == NEWT_OK) r = get_range(j, what, "restore_step", 1, 0, INT64_MAX, &a.restore_step);
  cJSON_Delete(j);
  if (r == NEWT_OK) *out = a;
  return r;
}

/* --- progress -------------------------------------------------------------------------------- */

/* A double as JSON: null when not finite (JSON has no NaN). */
static void add_real(cJSON *j, const char *field, double v) {
  if (isfinite(v)) cJSON_AddNumberToObject(j, field, v);
  else cJSON_AddNullToObject(j, field);
}

char *job_progress_to_json(const job_progress *p) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  newt_json_add_int(j, "generation", (int64_t)p->generation);
  newt_json_add_int(j, "step", p->step);
  if (p->committed >= 0 && p->committed <= p->step) newt_json_add_int(j, "committed", p->committed);
  add_real(j, "loss", p->loss);
  add_real(j, "tokens_per_s", p->tokens_per_s);
  if (p->step_tokens > 0) newt_json_add_int(j, "step_tokens", p->step_tokens);
  newt_json_add_int(j, "world", p->world);
  newt_json_add_int(j, "dp", p->dp);
  newt_json_add_int(j, "t_ms", (int64_t)p->t_ms);
  return finish(j);
}

newt_result_t job_progress_from_json(const char *text, size_t len, job_progress *out) {
  const char *what = "progress";
  cJSON *j;
  NEWT_CHECK(parse_object(text, len, what, &j));
  job_progress p;
  memset(&p, 0, sizeof p);
  newt_result_t r = get_ms(j, what, "generation", 1, &p.generation);
  if (r == NEWT_OK) r = get_range(j, what, "step", 1, 0, INT64_MAX, &p.step);
  p.committed = -1;
  if (r == NEWT_OK) r = get_range(j, what, "committed", 0, -1, p.step, &p.committed);
  if (r == NEWT_OK) r = get_real(j, what, "loss", 1, &p.loss);
  if (r == NEWT_OK) r = get_real(j, what, "tokens_per_s", 0, &p.tokens_per_s);
  if (r == NEWT_OK) r = get_range(j, what, "step_tokens", 0, 0, INT64_MAX, &p.step_tokens);
  if (r == NEWT_OK) r = get_range(j, what, "world", 0, 0, INT32_MAX, &p.world);
  if (r == NEWT_OK) r = get_range(j, what, "dp", 0, 0, INT32_MAX, &p.dp);
  if (r == NEWT_OK) r = get_ms(j, what, "t_ms", 1, &p.t_ms);
  cJSON_Delete(j);
  if (r == NEWT_OK) *out = p;
  return r;
}

/* --- a step of the step log ------------------------------------------------------------------- */

char *job_step_to_json(const job_step *s) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  newt_json_add_int(j, "step", s->step);
  add_real(j, "loss", s->loss);
  add_real(j, "lr", s->lr);
  if (s->grad_norm != 0) add_real(j, "grad_norm", s->grad_norm); /* null: not finite (the step diverged) */
  add_real(j, "tokens_per_s", s->tokens_per_s);
  newt_json_add_int(j, "world", s->world);
  newt_json_add_int(j, "dp", s->dp);
  newt_json_add_int(j, "generation", (int64_t)s->generation);
  newt_json_add_int(j, "t_ms", (int64_t)s->t_ms);
  newt_json_add_int(j, "ckpt", s->ckpt);
  return finish(j);
}

newt_result_t job_step_from_json(const char *text, size_t len, job_step *out) {
  const char *what = "step";
  cJSON *j;
  NEWT_CHECK(parse_object(text, len, what, &j));
  job_step s;
  memset(&s, 0, sizeof s);
  s.lr = s.tokens_per_s = NAN;
  s.world = s.dp = s.generation = 1;
  newt_result_t r = get_range(j, what, "step", 1, 1, INT64_MAX, &s.step);
  if (r == NEWT_OK) r = get_real(j, what, "loss", 1, &s.loss);
  if (r == NEWT_OK) r = get_real(j, what, "lr", 0, &s.lr);
  if (r == NEWT_OK) r = get_real(j, what, "grad_norm", 0, &s.grad_norm);
  if (r == NEWT_OK && s.grad_norm < 0)
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s.grad_norm: %g is negative (a norm)", what, s.grad_norm);
  if (r == NEWT_OK) r = get_real(j, what, "tokens_per_s", 0, &s.tokens_per_s);
  if (r == NEWT_OK) r = get_range(j, what, "world", 0, 1, INT32_MAX, &s.world);
  if (r == NEWT_OK) r = get_range(j, what, "dp", 0, 1, INT32_MAX, &s.dp);
  if (r == NEWT_OK) r = get_ms(j, what, "generation", 0, &s.generation);
  if (r == NEWT_OK) r = get_ms(j, what, "t_ms", 0, &s.t_ms);
  if (r == NEWT_OK) r = get_range(j, what, "ckpt", 0, 0, INT64_MAX, &s.ckpt);
  cJSON_Delete(j);
  if (r == NEWT_OK) *out = s;
  return r;
}

/* --- done ------------------------------------------------------------------------------------ */

char *job_done_to_json(const job_done *d) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  newt_json_add_int(j, "step", d->step);
  add_real(j, "loss", d->loss);
  newt_json_add_int(j, "t_ms", (int64_t)d->t_ms);
  newt_json_add_int(j, "samples", (int64_t)d->samples);
  return finish(j);
}

newt_result_t job_done_from_json(const char *text, size_t len, job_done *out) {
  const char *what = "done";
  cJSON *j;
  NEWT_CHECK(parse_object(text, len, what, &j));
  job_done d;
  memset(&d, 0, sizeof d);
  newt_result_t r = get_range(j, what, "step", 1, 0, INT64_MAX, &d.step);
  if (r == NEWT_OK) r = get_real(j, what, "loss", 1, &d.loss);
  if (r == NEWT_OK) r = get_ms(j, what, "t_ms", 1, &d.t_ms);
  if (r == NEWT_OK) r = get_ms(j, what, "samples", 1, &d.samples);
  cJSON_Delete(j);
  if (r == NEWT_OK) *out = d;
  return r;
}

int job_done_plausible(const job_done *d, const newt_spec *spec) {
  return d->step == spec->steps && d->samples == (uint64_t)spec->steps * (uint64_t)spec->global_batch;
}

int job_is_done(rdzv_etcd *c, const char *job, const newt_spec *spec) {
  char key[256];
  rdzv_etcd_kv kv;
  if (job_key(key, sizeof key, job, JOB_REC_DONE, 0, NULL) != NEWT_OK) return 0;
  if (rdzv_etcd_get(c, key, job_call_deadline(), &kv, NULL) != NEWT_OK) return 0;
  job_done d;
  int ok = job_done_from_json(kv.value, kv.value_len, &d) == NEWT_OK;
  if (ok && !job_done_plausible(&d, spec)) {
    NEWT_WARN(JOB, "ignoring %s: step %lld and %llu samples, but the job has %lld steps of %lld", key,
              (long long)d.step, (unsigned long long)d.samples, (long long)spec->steps, (long long)spec->global_batch);
    ok = 0;
  } else if (!ok) {
    NEWT_WARN(JOB, "ignoring %s: %s", key, newt_errmsg());
  }
  rdzv_etcd_kv_free(&kv);
  return ok;
}

/* --- checkpoint pointer ---------------------------------------------------------------------- */

char *job_ckpt_to_json(const job_ckpt *c) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  newt_json_add_int(j, "step", c->step);
  cJSON_AddStringToObject(j, "dir", c->dir);
  if (c->bytes > 0) newt_json_add_int(j, "bytes", c->bytes);
  if (c->save_ms > 0) newt_json_add_int(j, "save_ms", c->save_ms);
  if (c->stall_ms > 0) cJSON_AddNumberToObject(j, "stall_ms", round(c->stall_ms * 1e3) / 1e3);
  return finish(j);
}

newt_result_t job_ckpt_from_json(const char *text, size_t len, job_ckpt *out) {
  const char *what = "ckpt";
  cJSON *j;
  NEWT_CHECK(parse_object(text, len, what, &j));
  job_ckpt c;
  memset(&c, 0, sizeof c);
  newt_result_t r = get_range(j, what, "step", 1, 0, INT64_MAX, &c.step);
  if (r == NEWT_OK) r = get_text(j, what, "dir", 1, c.dir, sizeof c.dir);
  if (r == NEWT_OK) r = get_range(j, what, "bytes", 0, 0, INT64_MAX, &c.bytes);
  if (r == NEWT_OK) r = get_range(j, what, "save_ms", 0, 0, INT64_MAX, &c.save_ms);
  if (r == NEWT_OK) r = newt_json_get_double(j, what, "stall_ms", 0, &c.stall_ms);
  if (r == NEWT_OK && !(c.stall_ms >= 0 && c.stall_ms <= JOB_STALL_MS_MAX))
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s.stall_ms: %g is out of range [0, %g]", what, c.stall_ms, JOB_STALL_MS_MAX);
  cJSON_Delete(j);
  if (r == NEWT_OK) *out = c;
  return r;
}

/* --- failed ---------------------------------------------------------------------------------- */

char *job_failed_to_json(const job_failed *f) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  cJSON_AddStringToObject(j, "why", f->why);
  newt_json_add_int(j, "t_ms", (int64_t)f->t_ms);
  cJSON_AddStringToObject(j, "coordinator", f->coordinator);
  return finish(j);
}

newt_result_t job_failed_from_json(const char *text, size_t len, job_failed *out) {
  const char *what = "failed";
  cJSON *j;
  NEWT_CHECK(parse_object(text, len, what, &j));
  job_failed f;
  memset(&f, 0, sizeof f);
  newt_result_t r = get_text(j, what, "why", 1, f.why, sizeof f.why);
  if (r == NEWT_OK) r = get_ms(j, what, "t_ms", 1, &f.t_ms);
  if (r == NEWT_OK) r = get_text(j, what, "coordinator", 0, f.coordinator, sizeof f.coordinator);
  cJSON_Delete(j);
  if (r == NEWT_OK) *out = f;
  return r;
}

int job_has_failed(rdzv_etcd *c, const char *job, job_failed *out) {
  char key[256];
  rdzv_etcd_kv kv;
  if (job_key(key, sizeof key, job, JOB_REC_FAILED, 0, NULL) != NEWT_OK) return 0;
  if (rdzv_etcd_get(c, key, job_call_deadline(), &kv, NULL) != NEWT_OK) return 0;
  job_failed f;
  int ok = job_failed_from_json(kv.value, kv.value_len, &f) == NEWT_OK;
  if (!ok) NEWT_WARN(JOB, "ignoring %s: %s", key, newt_errmsg());
  else if (out) *out = f;
  rdzv_etcd_kv_free(&kv);
  return ok;
}

/* --- events ---------------------------------------------------------------------------------- */

static const char *const event_types[] = {"leader", "plan",   "fence", "waiting", "started", "recovered",
                                          "done",   "failed", "spec",  "etcd",    "spare",   NULL};
static const char *const causes[] = {"initial", "crash", "hang", "leave", "join", "coordinator", "etcd", "spec", NULL};

static void add_names(cJSON *j, const char *field, char (*names)[RDZV_NAME_MAX], int n) {
  cJSON *a = cJSON_AddArrayToObject(j, field);
  for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateString(names[i]));
}

/* An optional array of worker ids into *out (malloc'd; NULL when empty), each checked as a
 * name. */
static newt_result_t get_names(const cJSON *j, const char *what, const char *field, char (**out)[RDZV_NAME_MAX],
                               int *n) {
  const cJSON *a = NULL;
  NEWT_CHECK(newt_json_get_arr(j, what, field, 0, &a));
  int cap = cJSON_GetArraySize(a);
  if (cap > 0 && !(*out = calloc((size_t)cap, sizeof **out)))
    return NEWT_ERR(NEWT_ERR_NOMEM, "%s.%s: out of memory", what, field);
  int i = 0;
  for (const cJSON *x = a ? a->child : NULL; x; x = x->next, i++) {
    char label[64];
    snprintf(label, sizeof label, "%s.%s[%d]", what, field, i);
    if (!cJSON_IsString(x)) return NEWT_ERR(NEWT_ERR_INVALID, "%s: expected a worker id", label);
    NEWT_CHECK(rdzv_check_name(label, x->valuestring));
    snprintf((*out)[(*n)++], RDZV_NAME_MAX, "%s", x->valuestring);
  }
  return NEWT_OK;
}

const char *job_event_type_name(job_event_type t) {
  return t >= JOB_EV_LEADER && t <= JOB_EV_SPARE ? event_types[t] : "?";
}

char *job_event_to_json(const job_event *e) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  cJSON_AddStringToObject(j, "type", job_event_type_name(e->type));
  switch (e->type) {
  case JOB_EV_PLAN: {
    newt_json_add_int(j, "generation", e->generation);
    cJSON_AddStringToObject(j, "cause", e->cause);
    newt_json_add_int(j, "world", e->world);
    newt_json_add_int(j, "dp", e->dp);
    newt_json_add_int(j, "spares", e->spares);
    add_names(j, "excluded", e->excluded, e->nexcluded);
    if (e->nspare_ids) add_names(j, "spare_ids", e->spare_ids, e->nspare_ids);
    if (e->why[0]) cJSON_AddStringToObject(j, "why", e->why);
    break;
  }
  case JOB_EV_SPARE:
    add_names(j, "spare_ids", e->spare_ids, e->nspare_ids);
    cJSON_AddStringToObject(j, "why", e->why);
    break;
  case JOB_EV_FENCE:
    cJSON_AddStringToObject(j, "worker", e->worker);
    break;
  case JOB_EV_WAITING:
  case JOB_EV_FAILED:
  case JOB_EV_SPEC:
  case JOB_EV_ETCD:
    cJSON_AddStringToObject(j, "why", e->why);
    break;
  case JOB_EV_STARTED:
  case JOB_EV_RECOVERED:
    newt_json_add_int(j, "generation", e->generation);
    cJSON_AddStringToObject(j, "cause", e->cause);
    newt_json_add_int(j, "world", e->world);
    newt_json_add_int(j, "t_trigger", (int64_t)e->t_trigger);
    newt_json_add_int(j, "t_detect", (int64_t)e->t_detect);
    newt_json_add_int(j, "t_plan", (int64_t)e->t_plan);
    newt_json_add_int(j, "t_comm", (int64_t)e->t_comm);
    newt_json_add_int(j, "t_restore", (int64_t)e->t_restore);
    newt_json_add_int(j, "t_step", (int64_t)e->t_step);
    cJSON_AddStringToObject(j, "restore", e->restore);
    newt_json_add_int(j, "restore_step", e->restore_step);
    newt_json_add_int(j, "steps_lost", e->steps_lost);
    break;
  case JOB_EV_DONE:
    newt_json_add_int(j, "step", e->step);
    add_real(j, "loss", e->loss);
    break;
  case JOB_EV_LEADER:
    break;
  }
  newt_json_add_int(j, "t_ms", (int64_t)e->t_ms);
  cJSON_AddStringToObject(j, "coordinator", e->coordinator);
  return finish(j);
}

newt_result_t job_event_from_json(const char *text, size_t len, job_event *out) {
  const char *what = "event";
  cJSON *j;
  NEWT_CHECK(parse_object(text, len, what, &j));
  job_event e;
  memset(&e, 0, sizeof e);
  char type[16] = "";
  newt_result_t r = get_word(j, what, "type", 1, event_types, type, sizeof type);
  for (int i = 0; r == NEWT_OK && event_types[i]; i++)
    if (strcmp(type, event_types[i]) == 0) e.type = (job_event_type)i;
  if (r == NEWT_OK) r = get_ms(j, what, "t_ms", 1, &e.t_ms);
  if (r == NEWT_OK) r = get_text(j, what, "coordinator", 0, e.coordinator, sizeof e.coordinator);
  int timed = e.type == JOB_EV_STARTED || e.type == JOB_EV_RECOVERED;
  if (r == NEWT_OK && (timed || e.type == JOB_EV_PLAN)) {
    r = get_range(j, what, "generation", 1, 1, INT64_MAX, &e.generation);
    if (r == NEWT_OK) r = get_word(j, what, "cause", 1, causes, e.cause, sizeof e.cause);
    if (r == NEWT_OK) r = get_range(j, what, "world", 1, 0, INT32_MAX, &e.world);
  }
  if (r == NEWT_OK && e.type == JOB_EV_PLAN) {
    r = get_range(j, what, "dp", 0, 0, INT32_MAX, &e.dp);
    if (r == NEWT_OK) r = get_range(j, what, "spares", 0, 0, INT32_MAX, &e.spares);
    if (r == NEWT_OK) r = get_names(j, what, "excluded", &e.excluded, &e.nexcluded);
  }
  if (r == NEWT_OK && (e.type == JOB_EV_PLAN || e.type == JOB_EV_SPARE)) {
    r = get_names(j, what, "spare_ids", &e.spare_ids, &e.nspare_ids);
    if (r == NEWT_OK) r = get_text(j, what, "why", e.type == JOB_EV_SPARE, e.why, sizeof e.why);
  }
  if (r == NEWT_OK && e.type == JOB_EV_FENCE) r = get_name(j, what, "worker", 1, e.worker);
  if (r == NEWT_OK && (e.type == JOB_EV_WAITING || e.type == JOB_EV_FAILED || e.type == JOB_EV_SPEC ||
                       e.type == JOB_EV_ETCD))
    r = get_text(j, what, "why", 0, e.why, sizeof e.why);
  if (r == NEWT_OK && timed) {
    r = get_ms(j, what, "t_trigger", 1, &e.t_trigger);
    if (r == NEWT_OK) r = get_ms(j, what, "t_detect", 1, &e.t_detect);
    if (r == NEWT_OK) r = get_ms(j, what, "t_plan", 1, &e.t_plan);
    if (r == NEWT_OK) r = get_ms(j, what, "t_comm", 1, &e.t_comm);
    if (r == NEWT_OK) r = get_ms(j, what, "t_restore", 1, &e.t_restore);
    if (r == NEWT_OK) r = get_ms(j, what, "t_step", 1, &e.t_step);
    if (r == NEWT_OK) r = get_word(j, what, "restore", 1, restores, e.restore, sizeof e.restore);
    if (r == NEWT_OK) r = get_range(j, what, "restore_step", 1, 0, INT64_MAX, &e.restore_step);
    if (r == NEWT_OK) r = get_range(j, what, "steps_lost", 1, 0, INT64_MAX, &e.steps_lost);
  }
  if (r == NEWT_OK && e.type == JOB_EV_DONE) {
    r = get_range(j, what, "step", 1, 0, INT64_MAX, &e.step);
    if (r == NEWT_OK) r = get_real(j, what, "loss", 1, &e.loss);
  }
  cJSON_Delete(j);
  if (r != NEWT_OK) {
    job_event_free(&e);
    return r;
  }
  *out = e;
  return NEWT_OK;
}

static int64_t ms_between(uint64_t a, uint64_t b) { return b >= a ? (int64_t)(b - a) : 0; }

job_recovery_times job_recovery_time(const job_event *e, uint64_t t_fault) {
  job_recovery_times t;
  t.start = t_fault && t_fault <= e->t_detect ? t_fault : e->t_detect;
  t.detect_ms = ms_between(t.start, e->t_detect);
  t.plan_ms = ms_between(e->t_detect, e->t_plan);
  t.comm_ms = ms_between(e->t_plan, e->t_comm);
  t.restore_ms = ms_between(e->t_comm, e->t_restore);
  t.total_ms = ms_between(t.start, e->t_step);
  int64_t before = t.detect_ms + t.plan_ms + t.comm_ms + t.restore_ms;
  t.step_ms = t.total_ms > before ? t.total_ms - before : 0;
  return t;
}

/* --- faults ---------------------------------------------------------------------------------- */

char *job_fault_to_json(const job_fault *f) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  newt_json_add_int(j, "generation", f->generation);
  newt_json_add_int(j, "t_ms", (int64_t)f->t_ms);
  cJSON_AddStringToObject(j, "what", f->what);
  return finish(j);
}

newt_result_t job_fault_from_json(const char *text, size_t len, job_fault *out) {
  const char *what = "fault";
  cJSON *j;
  NEWT_CHECK(parse_object(text, len, what, &j));
  job_fault f;
  memset(&f, 0, sizeof f);
  newt_result_t r = get_range(j, what, "generation", 1, 1, INT64_MAX, &f.generation);
  if (r == NEWT_OK) r = get_ms(j, what, "t_ms", 1, &f.t_ms);
  if (r == NEWT_OK) r = get_text(j, what, "what", 1, f.what, sizeof f.what);
  cJSON_Delete(j);
  if (r == NEWT_OK) *out = f;
  return r;
}

char *job_links_to_json(const job_links *l) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  newt_json_add_int(j, "generation", l->generation);
  newt_json_add_int(j, "answered", l->answered);
  newt_json_add_int(j, "ranks", l->ranks);
  newt_json_add_int(j, "t_ms", (int64_t)l->t_ms);
  return finish(j);
}

newt_result_t job_links_from_json(const char *text, size_t len, job_links *out) {
  const char *what = "links";
  cJSON *j;
  NEWT_CHECK(parse_object(text, len, what, &j));
  job_links l;
  memset(&l, 0, sizeof l);
  newt_result_t r = get_range(j, what, "generation", 1, 1, INT64_MAX, &l.generation);
  if (r == NEWT_OK) r = get_range(j, what, "ranks", 1, 1, 1 << 20, &l.ranks);
  if (r == NEWT_OK) r = get_range(j, what, "answered", 1, 0, l.ranks, &l.answered);
  if (r == NEWT_OK) r = get_ms(j, what, "t_ms", 1, &l.t_ms);
  cJSON_Delete(j);
  if (r == NEWT_OK) *out = l;
  return r;
}

void job_event_free(job_event *e) {
  free(e->excluded);
  e->excluded = NULL;
  e->nexcluded = 0;
  free(e->spare_ids);
  e->spare_ids = NULL;
  e->nspare_ids = 0;
}
