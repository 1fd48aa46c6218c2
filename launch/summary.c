/* The summary of a run read back (launcher.h): the parser of what launcher_summary_json
 * writes, for `newt report`. A summary is a file a person may have edited or truncated, so
 * every field is checked and a bad one named; fields added later (step, t_ms and fault of a
 * recovery, t_start_ms, steps_planned, the run's files, checkpoints, outcome and reason) are
 * optional, so the summaries of earlier versions still read. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "job/records.h"
#include "launch/launcher.h"

/* An integer field that cannot be negative. */
static newt_result_t get_count(const cJSON *j, const char *what, const char *field, int required, int64_t *out) {
  NEWT_CHECK(newt_json_get_int(j, what, field, required, out));
  if (*out < 0) return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: %lld is negative", what, field, (long long)*out);
  return NEWT_OK;
}

static newt_result_t get_recovery(const cJSON *e, const char *what, launcher_recovery *rec) {
  memset(rec, 0, sizeof *rec);
  int injected = 0;
  int64_t t_ms = 0;
  newt_result_t r = newt_json_get_strcpy(e, what, "cause", 1, rec->cause, sizeof rec->cause);
  if (r == NEWT_OK) r = newt_json_get_strcpy(e, what, "fault", 0, rec->fault, sizeof rec->fault);
  if (r == NEWT_OK) r = newt_json_get_strcpy(e, what, "restore", 0, rec->restore, sizeof rec->restore);
  if (r == NEWT_OK) r = get_count(e, what, "generation", 0, &rec->generation);
  if (r == NEWT_OK) r = get_count(e, what, "step", 0, &rec->step);
  if (r == NEWT_OK) r = get_count(e, what, "world", 0, &rec->world);
  if (r == NEWT_OK) r = get_count(e, what, "t_ms", 0, &t_ms);
  if (r == NEWT_OK) r = get_count(e, what, "detect_ms", 1, &rec->detect_ms);
  if (r == NEWT_OK) r = get_count(e, what, "plan_ms", 1, &rec->plan_ms);
  if (r == NEWT_OK) r = get_count(e, what, "comm_ms", 1, &rec->comm_ms);
  if (r == NEWT_OK) r = get_count(e, what, "restore_ms", 1, &rec->restore_ms);
  rec->step_ms = -1; /* absent from a summary written before it was */
  if (r == NEWT_OK && cJSON_GetObjectItemCaseSensitive(e, "step_ms")) r = get_count(e, what, "step_ms", 1, &rec->step_ms);
  if (r == NEWT_OK) r = get_count(e, what, "total_ms", 1, &rec->total_ms);
  if (r == NEWT_OK) r = get_count(e, what, "steps_lost", 0, &rec->steps_lost);
  if (r == NEWT_OK) r = newt_json_get_bool(e, what, "injected", 0, &injected);
  rec->outage_ms = rec->pause_ms = rec->resumed_ms = -1;
  if (r == NEWT_OK) r = newt_json_get_int(e, what, "resumed_ms", 0, &rec->resumed_ms);
  if (r == NEWT_OK) r = newt_json_get_int(e, what, "outage_ms", 0, &rec->outage_ms);
  if (r == NEWT_OK) r = newt_json_get_int(e, what, "pause_ms", 0, &rec->pause_ms);
  if (r == NEWT_OK) r = newt_json_get_double(e, what, "tokens_per_s_before", 0, &rec->tps_before);
  if (r == NEWT_OK) r = newt_json_get_double(e, what, "tokens_per_s_during", 0, &rec->tps_during);
  int64_t before = rec->detect_ms + rec->plan_ms + rec->comm_ms + rec->restore_ms;
  if (rec->step_ms < 0) rec->step_ms = rec->total_ms > before ? rec->total_ms - before : 0; /* written before it was */
  rec->t_ms = (uint64_t)t_ms;
  rec->t_fault = injected ? (uint64_t)(t_ms ? t_ms : 1) : 0;
  return r;
}

static newt_result_t get_ckpt(const cJSON *e, const char *what, launcher_ckpt *c) {
  memset(c, 0, sizeof *c);
  newt_result_t r = get_count(e, what, "step", 1, &c->step);
  if (r == NEWT_OK) r = get_count(e, what, "bytes", 0, &c->bytes);
  if (r == NEWT_OK) r = get_count(e, what, "save_ms", 0, &c->save_ms);
  if (r == NEWT_OK) r = newt_json_get_double(e, what, "stall_ms", 0, &c->stall_ms);
  if (r == NEWT_OK && !(c->stall_ms >= 0 && c->stall_ms <= JOB_STALL_MS_MAX))
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s.stall_ms: %g is out of range [0, %g]", what, c->stall_ms, JOB_STALL_MS_MAX);
  return r;
}

/* How the run ended: outcome (one of launcher.h's words) and reason; a summary written
 * before they were has done and failed only. */
static newt_result_t get_outcome(const cJSON *j, const char *what, launcher_result *res) {
  static const char *const outcomes[] = {"done", "failed", "interrupted", "timeout", "exited", "error", NULL};
  NEWT_CHECK(newt_json_get_strcpy(j, what, "failed", 0, res->failed, sizeof res->failed));
  NEWT_CHECK(newt_json_get_strcpy(j, what, "outcome", 0, res->outcome, sizeof res->outcome));
  NEWT_CHECK(newt_json_get_strcpy(j, what, "reason", 0, res->reason, sizeof res->reason));
  if (!res->outcome[0]) {
    snprintf(res->outcome, sizeof res->outcome, "%s", res->done ? "done" : res->failed[0] ? "failed" : "error");
    return NEWT_OK;
  }
  for (int i = 0; outcomes[i]; i++)
    if (strcmp(res->outcome, outcomes[i]) == 0) return NEWT_OK;
  return NEWT_ERR(NEWT_ERR_INVALID, "%s.outcome: expected done, failed, interrupted, timeout, exited or error, got \"%s\"",
                  what, res->outcome);
}

newt_result_t launcher_summary_from_json(const char *text, size_t len, launcher_summary *out) {
  const char *what = "summary";
  memset(out, 0, sizeof *out);
  cJSON *j = NULL;
  NEWT_CHECK(newt_json_parse(text, len, what, &j));
  launcher_result *res = &out->res;
  const cJSON *recs = NULL, *cks = NULL;
  int64_t t_start = 0;
  res->final_loss = NAN;
  newt_result_t r = cJSON_IsObject(j) ? NEWT_OK : NEWT_ERR(NEWT_ERR_INVALID, "summary: expected a JSON object");
  if (r == NEWT_OK) r = newt_json_get_strcpy(j, what, "job", 0, out->job, sizeof out->job);
  if (r == NEWT_OK) r = newt_json_get_bool(j, what, "done", 0, &res->done);
  if (r == NEWT_OK) r = get_count(j, what, "steps", 1, &res->steps);
  if (r == NEWT_OK) r = newt_json_get_double(j, what, "final_loss", 1, &res->final_loss);
  if (r == NEWT_OK) r = get_count(j, what, "generations", 1, &res->generations);
  if (r == NEWT_OK) r = get_count(j, what, "samples_consumed", 1, &res->samples_consumed);
  if (r == NEWT_OK) r = get_count(j, what, "global_batch", 0, &out->global_batch);
  if (r == NEWT_OK) r = get_count(j, what, "workers", 0, &out->workers);
  if (r == NEWT_OK) r = get_count(j, what, "steps_planned", 0, &out->steps_planned);
  if (r == NEWT_OK) r = newt_json_get_double(j, what, "wall_s", 0, &res->wall_s);
  if (r == NEWT_OK) r = get_count(j, what, "t_start_ms", 0, &t_start);
  if (r == NEWT_OK) r = newt_json_get_strcpy(j, what, "log_dir", 0, res->log_dir, sizeof res->log_dir);
  if (r == NEWT_OK) r = newt_json_get_strcpy(j, what, "step_log", 0, res->step_log, sizeof res->step_log);
  if (r == NEWT_OK) r = newt_json_get_strcpy(j, what, "event_log", 0, res->event_log, sizeof res->event_log);
  if (r == NEWT_OK) r = get_outcome(j, what, res);
  if (r == NEWT_OK) r = newt_json_get_arr(j, what, "recoveries", 1, &recs);
  if (r == NEWT_OK) r = newt_json_get_arr(j, what, "checkpoints", 0, &cks);
  res->t_start_ms = (uint64_t)t_start;
  int n = recs ? cJSON_GetArraySize(recs) : 0;
  if (r == NEWT_OK && n > 0 && !(res->recoveries = calloc((size_t)n, sizeof *res->recoveries)))
    r = NEWT_ERR(NEWT_ERR_NOMEM, "summary.recoveries: out of memory for %d", n);
  for (const cJSON *e = recs ? recs->child : NULL; r == NEWT_OK && e; e = e->next) {
    char label[48];
    snprintf(label, sizeof label, "summary.recoveries[%d]", res->nrecoveries);
    if (!cJSON_IsObject(e)) r = NEWT_ERR(NEWT_ERR_INVALID, "%s: expected an object", label);
    else if ((r = get_recovery(e, label, &res->recoveries[res->nrecoveries])) == NEWT_OK) res->nrecoveries++;
  }
  int nc = cks ? cJSON_GetArraySize(cks) : 0;
  if (r == NEWT_OK && nc > 0 && !(res->ckpts = calloc((size_t)nc, sizeof *res->ckpts)))
    r = NEWT_ERR(NEWT_ERR_NOMEM, "summary.checkpoints: out of memory for %d", nc);
  for (const cJSON *e = cks ? cks->child : NULL; r == NEWT_OK && e; e = e->next) {
    char label[48];
    snprintf(label, sizeof label, "summary.checkpoints[%d]", res->nckpts);
    if (!cJSON_IsObject(e)) r = NEWT_ERR(NEWT_ERR_INVALID, "%s: expected an object", label);
    else if ((r = get_ckpt(e, label, &res->ckpts[res->nckpts])) == NEWT_OK) res->nckpts++;
  }
  cJSON_Delete(j);
  if (r != NEWT_OK) launcher_result_free(res);
  return r;
}
