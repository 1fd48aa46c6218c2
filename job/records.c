/* The records of a job in etcd (see records.h): keys, and for each record the table of its
 * fields (job/codec.h) that writes it (a cJSON document, so strings are always escaped), reads
 * it and checks every field it takes before anyone acts on it. Bytes and structs only: the
 * reads in etcd are job/store.c's. */
#include "job/records.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/strutil.h"
#include "job/codec.h"

/* --- keys ------------------------------------------------------------------------------------ */

static const struct {
  job_record rec;
  const char *name; /* the key, or its prefix when it ends in '/' */
} keys[] = {
    {JOB_REC_SPEC, "spec"},         {JOB_REC_PLAN, "plan"},         {JOB_REC_PROGRESS, "progress"},
    {JOB_REC_DONE, "done"},         {JOB_REC_CKPT, "ckpt"},         {JOB_REC_WORKER, "workers/"},
    {JOB_REC_ELECTION, "election/"}, {JOB_REC_REPORT, "reports/"},  {JOB_REC_ACK, "acks/"},
    {JOB_REC_EVENT, "events/"},     {JOB_REC_FAILED, "failed"},     {JOB_REC_FAULT, "faults/"},
    {JOB_REC_LINKS, "links/"},      {JOB_REC_PLAN_SHARD, "plan/"},
};

/* The key of rec, or its prefix when it ends in '/' (NULL: none). */
static const char *key_name(job_record rec) {
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (keys[i].rec == rec) return keys[i].name;
  return NULL;
}

newt_result_t job_prefix(char *out, size_t cap, const char *job, job_record rec, int64_t generation) {
  if (rec == JOB_REC_OTHER) return newt_job_path(out, cap, job, ""); /* the whole job */
  const char *name = key_name(rec);
  if (!name || name[strlen(name) - 1] != '/')
    return NEWT_ERR(NEWT_ERR_INVALID, "job_prefix: record %d has a key of its own, no prefix", (int)rec);
  char suffix[64];
  if ((rec == JOB_REC_REPORT || rec == JOB_REC_ACK || rec == JOB_REC_PLAN_SHARD) && generation >= 0)
    snprintf(suffix, sizeof suffix, "%s%020llu/", name, (unsigned long long)generation);
  else
    snprintf(suffix, sizeof suffix, "%s", name);
  return newt_job_path(out, cap, job, suffix);
}

newt_result_t job_key(char *out, size_t cap, const char *job, job_record rec, uint64_t generation, const char *id) {
  const char *name = key_name(rec);
  if (!name || rec == JOB_REC_ELECTION || rec == JOB_REC_EVENT)
    return NEWT_ERR(NEWT_ERR_INVALID, "job_key: no single key for record %d", (int)rec);
  char suffix[128];
  if (rec == JOB_REC_REPORT || rec == JOB_REC_ACK || rec == JOB_REC_PLAN_SHARD) {
    NEWT_CHECK(newt_check_name(rec == JOB_REC_PLAN_SHARD ? "shard" : "worker id", id));
    snprintf(suffix, sizeof suffix, "%s%020llu/%s", name, (unsigned long long)generation, id);
  } else if (rec == JOB_REC_WORKER || rec == JOB_REC_LINKS) {
    NEWT_CHECK(newt_check_name("worker id", id));
    snprintf(suffix, sizeof suffix, "%s%s", name, id);
  } else if (rec == JOB_REC_FAULT) {
    snprintf(suffix, sizeof suffix, "%s%020llu", name, (unsigned long long)generation);
  } else {
    snprintf(suffix, sizeof suffix, "%s", name);
  }
  return newt_job_path(out, cap, job, suffix);
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
    if (rec == JOB_REC_REPORT || rec == JOB_REC_ACK || rec == JOB_REC_FAULT || rec == JOB_REC_PLAN_SHARD) {
      /* "<20 digits>/<id>", or "<20 digits>" alone for a fault */
      size_t digits = 0;
      uint64_t g = 0;
      while (tail[digits] >= '0' && tail[digits] <= '9' && digits < 20) g = g * 10 + (uint64_t)(tail[digits++] - '0');
      if (digits != 20 || tail[20] != (rec == JOB_REC_FAULT ? '\0' : '/')) return JOB_REC_OTHER;
      tail += 21;
      if (generation) *generation = g;
    }
    if (rec == JOB_REC_REPORT || rec == JOB_REC_ACK || rec == JOB_REC_WORKER || rec == JOB_REC_LINKS ||
        rec == JOB_REC_PLAN_SHARD) {
      char name_copy[NEWT_ID_MAX];
      if (strlen(tail) >= sizeof name_copy) return JOB_REC_OTHER;
      snprintf(name_copy, sizeof name_copy, "%s", tail);
      if (newt_check_name("worker id", name_copy) != NEWT_OK) return JOB_REC_OTHER;
      if (id) *id = tail;
    }
    return rec;
  }
  return JOB_REC_OTHER;
}

/* --- tables ---------------------------------------------------------------------------------- */

/* The writer and the reader of a record whose struct its table describes: each record below is
 * its table and this line. */
#define RECORD_CODEC(T, table)                                                                                  \
  char *T##_to_json(const T *v) {                                                                               \
    char *text;                                                                                                 \
    return codec_encode(&(table), v, &text) == NEWT_OK ? text : NULL;                                           \
  }                                                                                                             \
  newt_result_t T##_from_json(const char *text, size_t len, T *out) { return codec_read(&(table), text, len, NULL, out); }

static const char *const kinds[] = {"crash", "hang", NULL};
static const char *const mismatch_actions[] = {"rollback", "warn", "fail", NULL}; /* spec.fault.on_mismatch's */
static const char *const phases[] = {"step", "build", NULL};
static const char *const restores[] = {"memory", "peer", "init", "ckpt", NULL};

int job_restore_rank(const char *restore) {
  for (int i = 0; restores[i]; i++)
    if (strcmp(restore, restores[i]) == 0) return i;
  return -1;
}

/* --- registration ----------------------------------------------------------------------------- */

/* Whether every character of s is in allowed. */
static int text_of(const char *s, const char *allowed) { return s[strspn(s, allowed)] == '\0'; }

#define NAME_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:"

/* What others print and connect to: no control characters, nothing but a name or an address (a
 * registration comes from etcd, where anyone with write access can put it). */
static newt_result_t check_host(const char *what, const void *rec) {
  const job_worker *w = rec;
  if (w->host[0] && text_of(w->host, NAME_CHARS)) return NEWT_OK;
  return NEWT_ERR(NEWT_ERR_INVALID, "%s.host: a host name of letters, digits, '.', '-', '_' and ':'", what);
}

static newt_result_t check_domain(const char *what, const void *rec) {
  job_worker *w = (job_worker *)rec;
  if (!w->domain[0]) snprintf(w->domain, sizeof w->domain, "%s", w->host); /* the previous release's */
  else if (!text_of(w->domain, NAME_CHARS "/"))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.domain: a failure domain of letters, digits, '.', '-', '_', ':' and '/'", what);
  return NEWT_OK;
}

/* The domain is written only when it is not the host's: what the previous release wrote. */
static int domain_is_host(const void *rec) {
  const job_worker *w = rec;
  return !w->domain[0] || strcmp(w->domain, w->host) == 0;
}

static newt_result_t check_addr(const char *what, const void *rec) {
  const job_worker *w = rec;
  const char *colon = strrchr(w->addr, ':');
  int64_t port = 0;
  if (w->addr[0] && (!colon || colon == w->addr || !text_of(w->addr, "0123456789abcdefABCDEF.:[]") ||
                     newt_parse_int(colon + 1, &port) != 0 || port < 1 || port > 65535))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.addr: \"%.64s\" is not an IP address and port", what, w->addr);
  return NEWT_OK;
}

static newt_result_t check_state(const char *what, const void *rec) {
  const job_worker *w = rec;
  if (w->state[0] && text_of(w->state, "abcdefghijklmnopqrstuvwxyz-_")) return NEWT_OK;
  return NEWT_ERR(NEWT_ERR_INVALID, "%s.state: lower-case letters only", what);
}

/* The acknowledgement: a JSON object this record carries as text (its own codec is job_ack's). */
static newt_result_t put_ack(cJSON *obj, const codec_field *f, const void *rec) {
  const job_worker *w = rec;
  if (!w->ack[0]) return NEWT_OK;
  cJSON *ack;
  NEWT_CHECK(newt_json_parse(w->ack, strlen(w->ack), "registration.ack", &ack));
  if (!cJSON_IsObject(ack)) {
    cJSON_Delete(ack);
    return NEWT_ERR(NEWT_ERR_INVALID, "registration.ack: expected a JSON object");
  }
  if (cJSON_AddItemToObject(obj, f->name, ack)) return NEWT_OK;
  cJSON_Delete(ack);
  return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing registration.ack");
}

static newt_result_t get_ack(const cJSON *j, const char *what, const codec_field *f, void *rec, int required) {
  job_worker *w = rec;
  const cJSON *ack = NULL; /* absent in the previous release's registrations, and before an ack */
  NEWT_CHECK(newt_json_get_obj(j, what, f->name, required, &ack));
  if (!ack) return NEWT_OK;
  char *text = newt_json_print(ack);
  if (!text) return NEWT_ERR(NEWT_ERR_NOMEM, "%s.ack: out of memory", what);
  size_t n = strlen(text);
  if (n < sizeof w->ack) memcpy(w->ack, text, n + 1);
  free(text);
  if (n >= sizeof w->ack) return NEWT_ERR(NEWT_ERR_INVALID, "%s.ack: %zu bytes, more than %d", what, n, JOB_ACK_MAX - 1);
  return NEWT_OK;
}

static const codec_field worker_fields[] = {
    {CODEC_NAME(job_worker, id, "id"), CODEC_REQUIRED},
    {CODEC_STR(job_worker, host, "host"), CODEC_REQUIRED, .check = check_host},
    {CODEC_STR(job_worker, addr, "addr"), .check = check_addr},
    {CODEC_INT(job_worker, device, "device", -1, 1024), .def = -1},
    {CODEC_STR(job_worker, state, "state"), CODEC_REQUIRED, .check = check_state},
    {CODEC_INT(job_worker, pid, "pid", 0, INT64_MAX)},
    {CODEC_INT(job_worker, generation, "generation", 0, NEWT_JSON_INT_EXACT - 1)},
    {CODEC_BOOL(job_worker, shares_device, "shares_device"), CODEC_OMIT},
    {CODEC_STR(job_worker, domain, "domain"), .skip = domain_is_host, .check = check_domain},
    {CODEC_CUSTOM(job_worker, ack, "ack", put_ack, get_ack)},
};
static const codec_table worker_table = CODEC_TABLE(job_worker, "registration", worker_fields);

newt_result_t job_worker_to_json(const job_worker *w, char **out) { return codec_encode(&worker_table, w, out); }

newt_result_t job_worker_from_json(const char *text, size_t len, const char *what, job_worker *out) {
  return codec_read(&worker_table, text, len, what, out);
}

int job_worker_acked(const job_worker *w, int64_t generation) {
  return w->generation > generation || (w->generation == generation && w->ack[0]);
}

newt_result_t job_worker_ack(const job_worker *w, job_ack *out) {
  if (!w->ack[0]) return NEWT_ERR(NEWT_ERR_NOTFOUND, "registration of %s: no acknowledgement", w->id);
  return job_ack_from_json(w->ack, strlen(w->ack), out);
}

/* --- candidacy ------------------------------------------------------------------------------- */

static const codec_field candidacy_fields[] = {
    {CODEC_TEXT(job_candidacy, name, "name"), CODEC_REQUIRED},
    {CODEC_TEXT(job_candidacy, host, "host")},
    {CODEC_INT(job_candidacy, pid, "pid", 0, INT64_MAX)},
};
static const codec_table candidacy_table = CODEC_TABLE(job_candidacy, "candidacy", candidacy_fields);
RECORD_CODEC(job_candidacy, candidacy_table)

/* --- report ---------------------------------------------------------------------------------- */

static const codec_field report_fields[] = {
    {CODEC_NAME(job_report, worker, "worker"), CODEC_REQUIRED},
    {CODEC_ENUM(job_report, hang, "kind", kinds), CODEC_REQUIRED},
    {CODEC_ENUM(job_report, build, "during", phases)},
    {CODEC_NAMES(job_report, accuse, naccuse, "accuse", JOB_ACCUSE_MAX)},
    {CODEC_INT(job_report, step, "step", -1, INT64_MAX), CODEC_REQUIRED, .def = -1},
    /* 0: not said (the previous release's reports), and not written */
    {CODEC_INT(job_report, done_step, "done_step", 0, INT64_MAX), CODEC_OMIT},
    {CODEC_MS(job_report, t_ms, "t_ms"), CODEC_REQUIRED},
    {CODEC_TEXT(job_report, why, "why")},
    {CODEC_TEXT(job_report, mismatch, "mismatch"), CODEC_OMIT},
    {CODEC_WORD(job_report, action, "action", mismatch_actions), CODEC_OMIT},
    {CODEC_INT(job_report, mismatch_step, "mismatch_step", 0, INT64_MAX), CODEC_OMIT},
    {CODEC_INT(job_report, back_to, "back_to", 0, INT64_MAX), CODEC_OMIT},
    {CODEC_TEXT(job_report, fatal, "fatal"), CODEC_OMIT},
    {CODEC_TOKEN(job_report, mac, "mac"), CODEC_OMIT},
};
static const codec_table report_table = CODEC_TABLE(job_report, "report", report_fields);
RECORD_CODEC(job_report, report_table)

/* --- ack ------------------------------------------------------------------------------------- */

static const codec_field ack_fields[] = {
    {CODEC_INT(job_ack, rank, "rank", 0, INT32_MAX), CODEC_REQUIRED},
    {CODEC_MS(job_ack, t_plan, "t_plan"), CODEC_REQUIRED},
    {CODEC_MS(job_ack, t_comm, "t_comm"), CODEC_REQUIRED},
    {CODEC_MS(job_ack, t_restore, "t_restore"), CODEC_REQUIRED},
    {CODEC_MS(job_ack, t_step, "t_step"), CODEC_REQUIRED},
    {CODEC_WORD(job_ack, restore, "restore", restores), CODEC_REQUIRED},
    {CODEC_INT(job_ack, restore_step, "restore_step", 0, INT64_MAX), CODEC_REQUIRED},
    {CODEC_TOKEN(job_ack, mac, "mac"), CODEC_OMIT},
};
static const codec_table ack_table = CODEC_TABLE(job_ack, "ack", ack_fields);
RECORD_CODEC(job_ack, ack_table)

/* --- progress -------------------------------------------------------------------------------- */

/* The ranks off the median's speed, [[dp, us], ...] (at most JOB_SLOW_MAX, written only when
 * there is one), of a progress record or a step log's line: the field's offset is the array's
 * and count_off its count's, so both records spell it with one row (CODEC_SLOW). */
#define CODEC_SLOW(T) CODEC_CUSTOM(T, slow, "slow", put_slow, get_slow), .count_off = offsetof(T, nslow)

static newt_result_t put_slow(cJSON *obj, const codec_field *f, const void *rec) {
  const struct job_slow *slow = (const void *)((const char *)rec + f->off);
  int n = *(const int *)((const char *)rec + f->count_off);
  if (n <= 0) return NEWT_OK;
  cJSON *a = cJSON_AddArrayToObject(obj, f->name);
  NEWT_CHECK_ALLOC(a);
  for (int i = 0; i < n && i < JOB_SLOW_MAX; i++) {
    cJSON *e = cJSON_CreateArray();
    if (!e || !cJSON_AddItemToArray(a, e) || !cJSON_AddItemToArray(e, cJSON_CreateNumber(slow[i].dp)) ||
        !cJSON_AddItemToArray(e, cJSON_CreateNumber(round(slow[i].us * 10) / 10)))
      return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing %s", f->name);
  }
  return NEWT_OK;
}

static newt_result_t get_slow(const cJSON *j, const char *what, const codec_field *f, void *rec, int required) {
  struct job_slow *slow = (void *)((char *)rec + f->off);
  int *n = (int *)((char *)rec + f->count_off);
  const cJSON *a = NULL;
  NEWT_CHECK(newt_json_get_arr(j, what, f->name, required, &a));
  *n = 0;
  if (!a) return NEWT_OK;
  if (cJSON_GetArraySize(a) > JOB_SLOW_MAX)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: %d entries, at most %d", what, f->name, cJSON_GetArraySize(a), JOB_SLOW_MAX);
  for (const cJSON *e = a->child; e; e = e->next) {
    const cJSON *d = cJSON_GetArrayItem(e, 0), *us = cJSON_GetArrayItem(e, 1);
    if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsNumber(d) || !cJSON_IsNumber(us) ||
        !(d->valuedouble >= 0 && d->valuedouble <= (1 << 20)) || d->valuedouble != floor(d->valuedouble) ||
        !(us->valuedouble > 0 && us->valuedouble <= 1e12))
      return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s[%d]: expected [data-parallel index, microseconds per sample]", what,
                      f->name, *n);
    slow[*n].dp = (int)d->valuedouble;
    slow[*n].us = us->valuedouble;
    (*n)++;
  }
  return NEWT_OK;
}

static const codec_field progress_fields[] = {
    {CODEC_MS(job_progress, generation, "generation"), CODEC_REQUIRED},
    {CODEC_INT(job_progress, step, "step", 0, INT64_MAX), CODEC_REQUIRED},
    /* written once a rank knows it: an older worker's record reads as -1 (take step) */
    {CODEC_INT(job_progress, committed, "committed", -1, INT64_MAX), CODEC_MAX_OF(job_progress, step), .def = -1,
     CODEC_OMIT},
    {CODEC_REAL(job_progress, loss, "loss"), CODEC_REQUIRED, .flags = CODEC_NULL},
    {CODEC_REAL(job_progress, tokens_per_s, "tokens_per_s"), .flags = CODEC_NULL},
    {CODEC_INT(job_progress, step_tokens, "step_tokens", 0, INT64_MAX), CODEC_OMIT},
    {CODEC_INT(job_progress, world, "world", 0, INT32_MAX)},
    {CODEC_INT(job_progress, dp, "dp", 0, INT32_MAX)},
    {CODEC_MS(job_progress, t_ms, "t_ms"), CODEC_REQUIRED},
    /* new fields, each written only when set: a progress record without them is the previous
       release's bytes */
    {CODEC_REAL(job_progress, sample_us, "sample_us"), CODEC_OMIT, .dmin = 0, .dmax = 1e12, .scale = 10},
    {CODEC_SLOW(job_progress)},
    {CODEC_INT(job_progress, straggle, "straggle", 0, INT32_MAX), CODEC_OMIT},
    {CODEC_MS(job_progress, straggle_ms, "straggle_ms"), CODEC_OMIT},
};
static const codec_table progress_table = CODEC_TABLE(job_progress, "progress", progress_fields);
RECORD_CODEC(job_progress, progress_table)

/* --- a step of the step log ------------------------------------------------------------------- */

static const codec_field step_fields[] = {
    {CODEC_INT(job_step, step, "step", 1, INT64_MAX), CODEC_REQUIRED},
    {CODEC_REAL(job_step, loss, "loss"), CODEC_REQUIRED, .flags = CODEC_NULL},
    {CODEC_REAL(job_step, lr, "lr"), .flags = CODEC_NULL, .ddef = NAN},
    /* 0: not known, and not written; null: not finite (the step diverged) */
    {CODEC_REAL(job_step, grad_norm, "grad_norm"), .flags = CODEC_NULL, .dmin = 0, .dmax = INFINITY, CODEC_OMIT},
    {CODEC_REAL(job_step, tokens_per_s, "tokens_per_s"), .flags = CODEC_NULL, .ddef = NAN},
    {CODEC_INT(job_step, world, "world", 1, INT32_MAX), .def = 1},
    {CODEC_INT(job_step, dp, "dp", 1, INT32_MAX), .def = 1},
    {CODEC_MS(job_step, generation, "generation"), .def = 1},
    {CODEC_MS(job_step, t_ms, "t_ms")},
    {CODEC_INT(job_step, ckpt, "ckpt", 0, INT64_MAX)},
    /* the restart mode's: the programs restarted before this step's (0: none, and not written) */
    {CODEC_INT(job_step, restarts, "restarts", 0, INT64_MAX), CODEC_OMIT},
    /* the ranks' speeds, as the progress record carries them, each written only when known: a
       line without them is the previous release's bytes */
    {CODEC_REAL(job_step, sample_us, "sample_us"), CODEC_OMIT, .dmin = 0, .dmax = 1e12, .scale = 10},
    {CODEC_SLOW(job_step)},
};
static const codec_table step_table = CODEC_TABLE(job_step, "step", step_fields);
RECORD_CODEC(job_step, step_table)

/* --- done ------------------------------------------------------------------------------------ */

static const codec_field done_fields[] = {
    {CODEC_INT(job_done, step, "step", 0, INT64_MAX), CODEC_REQUIRED},
    {CODEC_REAL(job_done, loss, "loss"), CODEC_REQUIRED, .flags = CODEC_NULL},
    {CODEC_MS(job_done, t_ms, "t_ms"), CODEC_REQUIRED},
    {CODEC_MS(job_done, samples, "samples"), CODEC_REQUIRED},
    {CODEC_TOKEN(job_done, mac, "mac"), CODEC_OMIT},
};
static const codec_table done_table = CODEC_TABLE(job_done, "done", done_fields);
RECORD_CODEC(job_done, done_table)

int job_done_plausible(const job_done *d, const newt_spec *spec) {
  /* in the restart mode the job ends at the beat where every program exited 0: any beat up to
     the last (docs/elastic.md, "Scripts that do not link newt") */
  int step_ok = spec->restart ? d->step >= 1 && d->step <= spec->steps : d->step == spec->steps;
  return step_ok && d->samples == (uint64_t)d->step * (uint64_t)spec->global_batch;
}

/* --- checkpoint pointer ---------------------------------------------------------------------- */

static const codec_field ckpt_fields[] = {
    {CODEC_INT(job_ckpt, step, "step", 0, INT64_MAX), CODEC_REQUIRED},
    {CODEC_TEXT(job_ckpt, dir, "dir"), CODEC_REQUIRED},
    /* 0: unknown (an older worker's record), and not written */
    {CODEC_INT(job_ckpt, bytes, "bytes", 0, INT64_MAX), CODEC_OMIT},
    {CODEC_INT(job_ckpt, save_ms, "save_ms", 0, INT64_MAX), CODEC_OMIT},
    {CODEC_REAL(job_ckpt, stall_ms, "stall_ms"), .dmin = 0, .dmax = JOB_STALL_MS_MAX, .scale = 1e3, CODEC_OMIT},
    {CODEC_INT(job_ckpt, skipped, "skipped", 0, INT64_MAX), CODEC_OMIT},
};
static const codec_table ckpt_table = CODEC_TABLE(job_ckpt, "ckpt", ckpt_fields);
RECORD_CODEC(job_ckpt, ckpt_table)

/* --- failed ---------------------------------------------------------------------------------- */

static const codec_field failed_fields[] = {
    {CODEC_TEXT(job_failed, why, "why"), CODEC_REQUIRED},
    {CODEC_MS(job_failed, t_ms, "t_ms"), CODEC_REQUIRED},
    {CODEC_TEXT(job_failed, coordinator, "coordinator")},
};
static const codec_table failed_table = CODEC_TABLE(job_failed, "failed", failed_fields);
RECORD_CODEC(job_failed, failed_table)

/* --- events ---------------------------------------------------------------------------------- */

static const char *const event_types[] = {"leader", "plan", "fence", "waiting", "started", "recovered", "done",
                                          "failed", "spec", "etcd",  "spare",   "mismatch",  NULL};
static const char *const causes[] = {"initial", "crash", "hang", "leave", "join", "coordinator", "etcd", "spec", "rebalance", NULL};

const char *job_event_type_name(job_event_type t) {
  return t >= JOB_EV_LEADER && t <= JOB_EV_MISMATCH ? event_types[t] : "?";
}

int64_t job_event_fault_step(const job_event *e) {
  return e->fault_step > 0 ? e->fault_step : e->restore_step + e->steps_lost;
}

/* The fields of each type (a field is in the types of its mask, `type` first selects them). */
#define EV_PLAN CODEC_V(JOB_EV_PLAN)
#define EV_SPARE CODEC_V(JOB_EV_SPARE)
#define EV_TIMED (CODEC_V(JOB_EV_STARTED) | CODEC_V(JOB_EV_RECOVERED))
#define EV_WHY (CODEC_V(JOB_EV_WAITING) | CODEC_V(JOB_EV_FAILED) | CODEC_V(JOB_EV_SPEC) | CODEC_V(JOB_EV_ETCD))
#define EV_DONE CODEC_V(JOB_EV_DONE)
#define EV_MISMATCH CODEC_V(JOB_EV_MISMATCH)

static const codec_field event_fields[] = {
    {CODEC_ENUM(job_event, type, "type", event_types), CODEC_REQUIRED, .flags = CODEC_SELECTS},
    {CODEC_INT(job_event, generation, "generation", 1, INT64_MAX), .in = EV_PLAN | EV_TIMED | EV_MISMATCH, CODEC_REQUIRED},
    {CODEC_WORD(job_event, cause, "cause", causes), .in = EV_PLAN | EV_TIMED, CODEC_REQUIRED},
    {CODEC_INT(job_event, world, "world", 0, INT32_MAX), .in = EV_PLAN | EV_TIMED, CODEC_REQUIRED},
    {CODEC_INT(job_event, dp, "dp", 0, INT32_MAX), .in = EV_PLAN},
    {CODEC_INT(job_event, spares, "spares", 0, INT32_MAX), .in = EV_PLAN},
    {CODEC_NAMES(job_event, excluded, nexcluded, "excluded", 0), .in = EV_PLAN},
    {CODEC_NAMES(job_event, spare_ids, nspare_ids, "spare_ids", 0), .in = EV_PLAN | EV_SPARE, .omit = EV_PLAN},
    {CODEC_TEXT(job_event, why, "why"), .in = EV_PLAN | EV_SPARE | EV_WHY | EV_MISMATCH, .req = EV_SPARE | EV_MISMATCH,
     .omit = EV_PLAN},
    {CODEC_NAME(job_event, worker, "worker"), .in = CODEC_V(JOB_EV_FENCE) | EV_MISMATCH, CODEC_REQUIRED},
    {CODEC_MS(job_event, t_trigger, "t_trigger"), .in = EV_TIMED, CODEC_REQUIRED},
    {CODEC_MS(job_event, t_detect, "t_detect"), .in = EV_TIMED, CODEC_REQUIRED},
    {CODEC_MS(job_event, t_plan, "t_plan"), .in = EV_TIMED, CODEC_REQUIRED},
    {CODEC_MS(job_event, t_comm, "t_comm"), .in = EV_TIMED, CODEC_REQUIRED},
    {CODEC_MS(job_event, t_restore, "t_restore"), .in = EV_TIMED, CODEC_REQUIRED},
    {CODEC_MS(job_event, t_step, "t_step"), .in = EV_TIMED, CODEC_REQUIRED},
    {CODEC_WORD(job_event, restore, "restore", restores), .in = EV_TIMED, CODEC_REQUIRED},
    {CODEC_INT(job_event, restore_step, "restore_step", 0, INT64_MAX), .in = EV_TIMED | EV_MISMATCH, CODEC_REQUIRED},
    {CODEC_INT(job_event, steps_lost, "steps_lost", 0, INT64_MAX), .in = EV_TIMED, CODEC_REQUIRED},
    /* 0: not said (the previous release's events, or a fault before the first step), and not
       written: job_event_fault_step */
    {CODEC_INT(job_event, fault_step, "fault_step", 0, INT64_MAX), .in = CODEC_V(JOB_EV_RECOVERED), CODEC_OMIT},
    {CODEC_INT(job_event, step, "step", 0, INT64_MAX), .in = EV_DONE | EV_MISMATCH, CODEC_REQUIRED},
    {CODEC_WORD(job_event, action, "action", mismatch_actions), .in = EV_MISMATCH, CODEC_REQUIRED},
    {CODEC_REAL(job_event, loss, "loss"), .in = EV_DONE, CODEC_REQUIRED, .flags = CODEC_NULL},
    {CODEC_MS(job_event, t_ms, "t_ms"), CODEC_REQUIRED},
    {CODEC_TEXT(job_event, coordinator, "coordinator")},
};
static const codec_table event_table = CODEC_TABLE(job_event, "event", event_fields);
RECORD_CODEC(job_event, event_table)

void job_event_free(job_event *e) { codec_free(&event_table, e); }

/* A malloc'd copy of n worker ids (NULL for none); 0 when out of memory. */
static int copy_ids(char (**dst)[NEWT_ID_MAX], char (*src)[NEWT_ID_MAX], int n) {
  *dst = n > 0 && src ? malloc((size_t)n * sizeof **dst) : NULL;
  if (*dst) memcpy(*dst, src, (size_t)n * sizeof **dst);
  return *dst || n <= 0 || !src;
}

newt_result_t job_event_copy(job_event *dst, const job_event *src) {
  *dst = *src;
  if (copy_ids(&dst->excluded, src->excluded, src->nexcluded) &&
      copy_ids(&dst->spare_ids, src->spare_ids, src->nspare_ids))
    return NEWT_OK;
  job_event_free(dst);
  return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory copying an event's names");
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

static const codec_field times_fields[] = {
    {CODEC_MS(job_recovery_times, start, "start_ms")},     {CODEC_MS(job_recovery_times, detect_ms, "detect_ms")},
    {CODEC_MS(job_recovery_times, plan_ms, "plan_ms")},    {CODEC_MS(job_recovery_times, comm_ms, "comm_ms")},
    {CODEC_MS(job_recovery_times, restore_ms, "restore_ms")}, {CODEC_MS(job_recovery_times, step_ms, "step_ms")},
    {CODEC_MS(job_recovery_times, total_ms, "total_ms")},
};
static const codec_table times_table = CODEC_TABLE(job_recovery_times, "recovery", times_fields);

newt_result_t job_recovery_times_add(cJSON *obj, const job_recovery_times *t) {
  return codec_encode_object(&times_table, obj, t);
}

/* --- faults ---------------------------------------------------------------------------------- */

static const codec_field fault_fields[] = {
    {CODEC_INT(job_fault, generation, "generation", 1, INT64_MAX), CODEC_REQUIRED},
    {CODEC_MS(job_fault, t_ms, "t_ms"), CODEC_REQUIRED},
    {CODEC_TEXT(job_fault, what, "what"), CODEC_REQUIRED},
};
static const codec_table fault_table = CODEC_TABLE(job_fault, "fault", fault_fields);
RECORD_CODEC(job_fault, fault_table)

/* --- links ----------------------------------------------------------------------------------- */

#define LINKS_SLOW_MAX 1024

static const codec_field links_fields[] = {
    {CODEC_INT(job_links, generation, "generation", 1, INT64_MAX), CODEC_REQUIRED},
    {CODEC_INT(job_links, answered, "answered", 0, INT64_MAX), CODEC_MAX_OF(job_links, ranks), CODEC_REQUIRED},
    {CODEC_INT(job_links, ranks, "ranks", 1, 1 << 20), CODEC_REQUIRED},
    {CODEC_MS(job_links, t_ms, "t_ms"), CODEC_REQUIRED},
    {CODEC_TOKEN(job_links, mac, "mac"), CODEC_OMIT},
    {CODEC_INT(job_links, slow, "slow", 0, LINKS_SLOW_MAX), CODEC_OMIT},
};
static const codec_table links_table = CODEC_TABLE(job_links, "links", links_fields);
RECORD_CODEC(job_links, links_table)

/* --- proofs: what a rank says for itself, under the job secret (records.h) --------------------- */

newt_result_t job_auth_init(job_auth *a, const unsigned char *secret, size_t len, const char *job) {
  memset(a, 0, sizeof *a);
  if (!secret) return NEWT_OK;
  const void *parts[] = {"newt-records", "", job};
  size_t lens[] = {12, 1, strlen(job)};
  NEWT_CHECK(newt_hmac(secret, len, parts, lens, 3, a->key));
  a->has = 1;
  return NEWT_OK;
}

newt_result_t job_auth_load(job_auth *a, const char *path, const char *job) {
  memset(a, 0, sizeof *a);
  if (!path || !*path) return NEWT_OK;
  unsigned char *secret = NULL;
  size_t n = 0;
  NEWT_CHECK(newt_secret_read(path, &secret, &n));
  newt_result_t r = job_auth_init(a, secret, n, job);
  memset(secret, 0, n);
  free(secret);
  return r;
}

/* The mac of record rec (of table t, its "mac" at mac_off) at etcd key `key`: over its
 * canonical bytes, the codec's writing of what its reader decodes (a text field's control
 * characters read as '?', a field out of its range is left out), so that writer and reader
 * prove the same bytes. */
static newt_result_t record_mac(const job_auth *a, const codec_table *t, const void *rec, size_t mac_off,
                                const char *key, int64_t generation, const unsigned char *salt, size_t salt_len,
                                unsigned char out[NEWT_MAC_BYTES]) {
  char *first = NULL, *canon = NULL;
  void *tmp = calloc(1, t->size), *back = calloc(1, t->size);
  newt_result_t r = tmp && back ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory proving a record");
  if (r == NEWT_OK) {
    memcpy(tmp, rec, t->size);
    ((char *)tmp)[mac_off] = '\0';
    r = codec_encode(t, tmp, &first);
  }
  if (r == NEWT_OK) r = codec_read(t, first, strlen(first), NULL, back);
  if (r == NEWT_OK) {
    ((char *)back)[mac_off] = '\0';
    r = codec_encode(t, back, &canon);
    codec_free(t, back);
  }
  if (r == NEWT_OK) {
    unsigned char gen[8];
    for (int i = 0; i < 8; i++) gen[i] = (unsigned char)((uint64_t)generation >> (8 * i));
    const void *parts[] = {"newt-record", "", key, "", gen, salt ? (const void *)salt : "", canon};
    size_t lens[] = {11, 1, strlen(key), 1, sizeof gen, salt ? salt_len : 0, strlen(canon)};
    r = newt_hmac(a->key, sizeof a->key, parts, lens, 7, out);
  }
  free(first);
  free(canon);
  free(tmp);
  free(back);
  return r;
}

static newt_result_t seal(const job_auth *a, const codec_table *t, void *rec, size_t mac_off, size_t mac_size,
                          const char *key, int64_t generation, const unsigned char *salt, size_t salt_len) {
  char *mac = (char *)rec + mac_off;
  mac[0] = '\0';
  if (!a || !a->has) return NEWT_OK;
  unsigned char m[NEWT_MAC_BYTES];
  NEWT_CHECK(record_mac(a, t, rec, mac_off, key, generation, salt, salt_len, m));
  if (mac_size < NEWT_MAC_HEX + 1) return NEWT_ERR(NEWT_ERR_INTERNAL, "a record's mac field is too small");
  newt_hex_encode(m, sizeof m, mac);
  return NEWT_OK;
}

static newt_result_t check(const job_auth *a, const codec_table *t, const void *rec, size_t mac_off, const char *key,
                           int64_t generation, const unsigned char *salt, size_t salt_len) {
  if (!a || !a->has) return NEWT_OK;
  const char *mac = (const char *)rec + mac_off;
  if (!mac[0]) return NEWT_ERR(NEWT_ERR_AUTH, "%s: no mac, and this job holds a secret: not written by one of its ranks", key);
  unsigned char want[NEWT_MAC_BYTES], got[NEWT_MAC_BYTES];
  if (strlen(mac) != NEWT_MAC_HEX || newt_hex_decode(mac, got, sizeof got) != 0)
    return NEWT_ERR(NEWT_ERR_AUTH, "%s: its mac is not %d hex digits", key, NEWT_MAC_HEX);
  NEWT_CHECK(record_mac(a, t, rec, mac_off, key, generation, salt, salt_len, want));
  if (!newt_ct_equal(want, got, sizeof want))
    return NEWT_ERR(NEWT_ERR_AUTH, "%s: its mac does not prove the job's secret: not written by one of its ranks (or "
                    "changed since)", key);
  return NEWT_OK;
}

newt_result_t job_report_seal(const job_auth *a, const char *key, const unsigned char *salt, size_t salt_len,
                              job_report *r) {
  return seal(a, &report_table, r, offsetof(job_report, mac), sizeof r->mac, key, 0, salt, salt_len);
}

newt_result_t job_report_check(const job_auth *a, const char *key, const unsigned char *salt, size_t salt_len,
                               const job_report *r) {
  return check(a, &report_table, r, offsetof(job_report, mac), key, 0, salt, salt_len);
}

newt_result_t job_ack_seal(const job_auth *a, const char *key, int64_t generation, const unsigned char *salt,
                           size_t salt_len, job_ack *ack) {
  return seal(a, &ack_table, ack, offsetof(job_ack, mac), sizeof ack->mac, key, generation, salt, salt_len);
}

newt_result_t job_ack_check(const job_auth *a, const char *key, int64_t generation, const unsigned char *salt,
                            size_t salt_len, const job_ack *ack) {
  return check(a, &ack_table, ack, offsetof(job_ack, mac), key, generation, salt, salt_len);
}

newt_result_t job_links_seal(const job_auth *a, const char *key, job_links *l) {
  return seal(a, &links_table, l, offsetof(job_links, mac), sizeof l->mac, key, 0, NULL, 0);
}

newt_result_t job_links_check(const job_auth *a, const char *key, const job_links *l) {
  return check(a, &links_table, l, offsetof(job_links, mac), key, 0, NULL, 0);
}

newt_result_t job_done_seal(const job_auth *a, const char *key, job_done *d) {
  return seal(a, &done_table, d, offsetof(job_done, mac), sizeof d->mac, key, 0, NULL, 0);
}

newt_result_t job_done_check(const job_auth *a, const char *key, const job_done *d) {
  return check(a, &done_table, d, offsetof(job_done, mac), key, 0, NULL, 0);
}

newt_result_t job_done_counts(const job_done *d, const char *key, const newt_spec *spec, const job_auth *auth,
                              int64_t progress) {
  if (!job_done_plausible(d, spec))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: step %lld and %llu samples, but the job has %lld steps of %lld", key,
                    (long long)d->step, (unsigned long long)d->samples, (long long)spec->steps,
                    (long long)spec->global_batch);
  NEWT_CHECK(job_done_check(auth, key, d));
  if (progress < d->step)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: it says step %lld, the job's last, but its ranks have reached step %lld: not "
                    "the job's end", key, (long long)d->step, (long long)progress);
  return NEWT_OK;
}
