/* The summary of a run (launcher.h): what `newt run` writes in its log directory (and where
 * --summary says), and `newt report` reads back. One codec (job/codec.h) of three tables, a
 * recovery, a checkpoint and the summary around them, so that a field is spelled once: the
 * writer is the tables in order (the bytes are the previous release's: a table is never
 * reordered, tests/launch/fixtures/), the reader the same tables with their checks.
 *
 * A summary is a file a person may have edited or truncated, so every field is checked and a
 * bad one named ("summary.recoveries[2].detect_ms: ..."). Fields added later (step, t_ms,
 * fault and fault_step of a recovery, t_start_ms, steps_planned, the run's files,
 * checkpoints, outcome and reason, samples_repeated, checkpoints_skipped, resumed_from) are
 * optional, so the summaries of earlier versions still read: a recovery without
 * step_ms gets what the other phases leave of its total, a summary without an outcome the
 * one its done and failed say. Some fields are written only where they mean something: an
 * outage's (outage_ms, pause_ms, tokens/s) for cause etcd, resumed_ms once measured, a
 * checkpoint's sizes and times once known, the counts where they are not 0, resumed_from for
 * a run that started from a checkpoint. A recovery without fault_step (0) hit at step +
 * steps_lost: launcher_recovery_fault_step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "job/codec.h"
#include "job/records.h"
#include "launch/launcher.h"

/* --- arrays of records ------------------------------------------------------------------------ */

/* A field that is an array of records of f->sub's table: a malloc'd array at f's place in the
 * struct, its count an int at f->count_off (launcher_result_free frees it). */
#define SUMMARY_ARRAY(m, n, key, table)                                                                         \
  CODEC_CUSTOM(launcher_summary, m, key, put_array, get_array), .sub = &(table),                             \
      .count_off = offsetof(launcher_summary, n)

static newt_result_t put_array(cJSON *obj, const codec_field *f, const void *rec) {
  const char *items;
  memcpy(&items, (const char *)rec + f->off, sizeof items);
  int n = *(const int *)((const char *)rec + f->count_off);
  cJSON *a = cJSON_AddArrayToObject(obj, f->name);
  for (int i = 0; a && i < n; i++) {
    cJSON *e = cJSON_CreateObject();
    if (!e || !cJSON_AddItemToArray(a, e)) {
      cJSON_Delete(e);
      a = NULL;
      break;
    }
    NEWT_CHECK(codec_encode_object(f->sub, e, items + (size_t)i * f->sub->size));
  }
  return a ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing %s", f->name);
}

static newt_result_t get_array(const cJSON *obj, const char *what, const codec_field *f, void *rec, int required) {
  const cJSON *a = NULL;
  NEWT_CHECK(newt_json_get_arr(obj, what, f->name, required, &a));
  int n = a ? cJSON_GetArraySize(a) : 0, *count = (int *)((char *)rec + f->count_off);
  char *items = n > 0 ? calloc((size_t)n, f->sub->size) : NULL;
  if (n > 0 && !items) return NEWT_ERR(NEWT_ERR_NOMEM, "%s.%s: out of memory for %d", what, f->name, n);
  memcpy((char *)rec + f->off, &items, sizeof items);
  *count = 0;
  for (const cJSON *e = a ? a->child : NULL; e; e = e->next, (*count)++) {
    char label[96];
    snprintf(label, sizeof label, "%s.%s[%d]", what, f->name, *count);
    NEWT_CHECK(codec_decode_object(f->sub, e, label, items + (size_t)*count * f->sub->size));
  }
  return NEWT_OK;
}

/* --- a recovery ------------------------------------------------------------------------------- */

/* The outage's fields are an etcd recovery's alone. */
static int not_etcd(const void *rec) { return strcmp(((const launcher_recovery *)rec)->cause, "etcd") != 0; }

/* "injected": the recovery answers a fault we injected. Read back, the fault's time is the
 * recovery's start (t_ms, read before it; 1 where that is not recorded). */
static newt_result_t put_injected(cJSON *obj, const codec_field *f, const void *rec) {
  if (cJSON_AddBoolToObject(obj, f->name, ((const launcher_recovery *)rec)->t_fault != 0)) return NEWT_OK;
  return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing %s", f->name);
}

static newt_result_t get_injected(const cJSON *obj, const char *what, const codec_field *f, void *rec, int required) {
  launcher_recovery *r = rec;
  int injected = 0;
  NEWT_CHECK(newt_json_get_bool(obj, what, f->name, required, &injected));
  r->t_fault = injected ? (r->t_ms ? r->t_ms : 1) : 0;
  return NEWT_OK;
}

#define RECOVERY_MS(m, key) CODEC_MS(launcher_recovery, m, key)
/* -1: not measured */
#define RECOVERY_OPT(m, key) CODEC_INT(launcher_recovery, m, key, -1, INT64_MAX), .def = -1

static const codec_field recovery_fields[] = {
    {CODEC_STR(launcher_recovery, cause, "cause"), CODEC_REQUIRED},
    {RECOVERY_MS(generation, "generation")},
    {RECOVERY_MS(step, "step")},
    {RECOVERY_MS(fault_step, "fault_step"), CODEC_OMIT}, /* absent (0): step + steps_lost */
    {RECOVERY_MS(world, "world")},
    {RECOVERY_MS(t_ms, "t_ms")},
    {RECOVERY_MS(detect_ms, "detect_ms"), CODEC_REQUIRED},
    {RECOVERY_MS(plan_ms, "plan_ms"), CODEC_REQUIRED},
    {RECOVERY_MS(comm_ms, "comm_ms"), CODEC_REQUIRED},
    {RECOVERY_MS(restore_ms, "restore_ms"), CODEC_REQUIRED},
    {RECOVERY_OPT(step_ms, "step_ms")}, /* absent (or -1): derived once read (summary_read) */
    {RECOVERY_MS(total_ms, "total_ms"), CODEC_REQUIRED},
    {RECOVERY_MS(steps_lost, "steps_lost")},
    {CODEC_STR(launcher_recovery, restore, "restore")},
    {CODEC_CUSTOM(launcher_recovery, t_fault, "injected", put_injected, get_injected)},
    {CODEC_STR(launcher_recovery, fault, "fault"), CODEC_OMIT},
    {RECOVERY_OPT(resumed_ms, "resumed_ms"), CODEC_OMIT},
    {RECOVERY_OPT(from_start_ms, "from_start_ms"), CODEC_OMIT}, /* a join newt run started */
    {RECOVERY_OPT(outage_ms, "outage_ms"), .skip = not_etcd},
    {RECOVERY_OPT(pause_ms, "pause_ms"), .skip = not_etcd},
    {CODEC_REAL(launcher_recovery, tps_before, "tokens_per_s_before"), .skip = not_etcd},
    {CODEC_REAL(launcher_recovery, tps_during, "tokens_per_s_during"), .skip = not_etcd},
};
static const codec_table recovery_table = CODEC_TABLE(launcher_recovery, "recovery", recovery_fields);

/* --- replicas that disagreed -------------------------------------------------------------------- */

static const char *const mismatch_actions[] = {"rollback", "warn", "fail", NULL};
static const codec_field mismatch_fields[] = {
    {CODEC_MS(launcher_mismatch, step, "step"), CODEC_REQUIRED},
    {CODEC_MS(launcher_mismatch, back_to, "back_to"), CODEC_REQUIRED},
    {CODEC_WORD(launcher_mismatch, action, "action", mismatch_actions), CODEC_REQUIRED},
    {CODEC_MS(launcher_mismatch, generation, "generation")},
    {CODEC_MS(launcher_mismatch, t_ms, "t_ms")},
    {CODEC_STR(launcher_mismatch, worker, "worker")},
    {CODEC_TEXT(launcher_mismatch, why, "why")},
};
static const codec_table mismatch_table = CODEC_TABLE(launcher_mismatch, "mismatch", mismatch_fields);

/* --- a checkpoint ----------------------------------------------------------------------------- */

static const codec_field ckpt_fields[] = {
    {CODEC_MS(launcher_ckpt, step, "step"), CODEC_REQUIRED},
    {CODEC_MS(launcher_ckpt, bytes, "bytes"), CODEC_OMIT},
    {CODEC_MS(launcher_ckpt, save_ms, "save_ms"), CODEC_OMIT},
    {CODEC_REAL(launcher_ckpt, stall_ms, "stall_ms"), CODEC_OMIT, .dmin = 0, .dmax = JOB_STALL_MS_MAX},
};
static const codec_table ckpt_table = CODEC_TABLE(launcher_ckpt, "checkpoint", ckpt_fields);

/* --- where the run's state came from ------------------------------------------------------ */

/* Written only for a run whose first generation started from a checkpoint (an earlier run's). */
static int not_resumed(const void *rec) { return ((const launcher_summary *)rec)->res.resumed_step <= 0; }

static const codec_field resumed_fields[] = {
    {CODEC_MS(launcher_summary, res.resumed_step, "step"), CODEC_REQUIRED},
    {CODEC_STR(launcher_summary, res.resumed_dir, "dir")},
};
static const codec_table resumed_table = CODEC_TABLE(launcher_summary, "resumed_from", resumed_fields);

/* Written only for a run whose checkpoint directory holds a committed step at its end. */
static int no_newest(const void *rec) { return ((const launcher_summary *)rec)->res.newest_ckpt <= 0; }

static const codec_field newest_fields[] = {
    {CODEC_MS(launcher_summary, res.newest_ckpt, "step"), CODEC_REQUIRED},
    {CODEC_STR(launcher_summary, ckpt_dir, "dir")},
};
static const codec_table newest_table = CODEC_TABLE(launcher_summary, "newest_checkpoint", newest_fields);

/* --- the summary ------------------------------------------------------------------------------ */

/* Written only in the restart mode (spec.restart). */
static int not_restart(const void *rec) { return !((const launcher_summary *)rec)->res.restart_mode; }

static const codec_field restart_fields[] = {
    {CODEC_MS(launcher_summary, res.restarts, "restarts"), CODEC_REQUIRED},
    {CODEC_MS(launcher_summary, res.steps_redone, "steps_redone"), CODEC_REQUIRED},
    {CODEC_MS(launcher_summary, res.beats, "beats")},
};
static const codec_table restart_table = CODEC_TABLE(launcher_summary, "restart", restart_fields);

/* Read back: a summary with a restart object is of the restart mode. */
static newt_result_t get_restart(const cJSON *obj, const char *what, const codec_field *f, void *rec, int required) {
  launcher_summary *s = rec;
  const cJSON *o = cJSON_GetObjectItemCaseSensitive(obj, f->name);
  (void)required;
  if (!o) return NEWT_OK;
  char label[96];
  snprintf(label, sizeof label, "%s.%s", what, f->name);
  s->res.restart_mode = 1;
  return codec_decode_object(&restart_table, o, label, s);
}

static newt_result_t put_restart(cJSON *obj, const codec_field *f, const void *rec) {
  cJSON *o = cJSON_AddObjectToObject(obj, f->name);
  if (!o) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing %s", f->name);
  return codec_encode_object(&restart_table, o, rec);
}

/* Written only when replicas disagreed: a run without is what the previous release wrote. */
static int no_mismatches(const void *rec) { return ((const launcher_summary *)rec)->res.nmismatches == 0; }

/* How a run ends (launcher_result.outcome). */
static const char *const outcomes[] = {"done", "failed", "interrupted", "timeout", "exited", "error", NULL};

#define SUMMARY_MS(m, key) CODEC_MS(launcher_summary, m, key)

static const codec_field summary_fields[] = {
    {CODEC_STR(launcher_summary, job, "job")},
    {CODEC_BOOL(launcher_summary, res.done, "done")},
    {SUMMARY_MS(res.steps, "steps"), CODEC_REQUIRED},
    {CODEC_REAL(launcher_summary, res.final_loss, "final_loss"), CODEC_REQUIRED}, /* not finite: written as 0 */
    {SUMMARY_MS(res.generations, "generations"), CODEC_REQUIRED},
    {SUMMARY_MS(res.samples_consumed, "samples_consumed"), CODEC_REQUIRED},
    {SUMMARY_MS(res.samples_repeated, "samples_repeated"), CODEC_OMIT}, /* absent: 0 */
    {SUMMARY_MS(global_batch, "global_batch")},
    {SUMMARY_MS(workers, "workers")},
    {SUMMARY_MS(steps_planned, "steps_planned")},
    {CODEC_REAL(launcher_summary, res.wall_s, "wall_s")},
    {SUMMARY_MS(res.t_start_ms, "t_start_ms")},
    {CODEC_INT(launcher_summary, res.etcd_keys, "etcd_keys", -1, INT64_MAX), .def = -1},
    {CODEC_STR(launcher_summary, res.failed, "failed"), CODEC_OMIT},
    {CODEC_WORD(launcher_summary, res.outcome, "outcome", outcomes)}, /* absent: derived once read */
    {CODEC_STR(launcher_summary, res.reason, "reason"), CODEC_OMIT},
    {SUMMARY_ARRAY(res.recoveries, res.nrecoveries, "recoveries", recovery_table), CODEC_REQUIRED},
    {SUMMARY_ARRAY(res.ckpts, res.nckpts, "checkpoints", ckpt_table)},
    {SUMMARY_MS(res.ckpts_skipped, "checkpoints_skipped"), CODEC_OMIT}, /* absent: 0 */
    {CODEC_OBJECT("resumed_from", resumed_table), .skip = not_resumed},
    {CODEC_OBJECT("newest_checkpoint", newest_table), .skip = no_newest},
    {CODEC_NAMES(launcher_summary, res.left_out, res.nleft_out, "left_out", 0), CODEC_OMIT},
    {SUMMARY_ARRAY(res.mismatches, res.nmismatches, "mismatches", mismatch_table), .skip = no_mismatches},
    {CODEC_CUSTOM(launcher_summary, res.restart_mode, "restart", put_restart, get_restart), .skip = not_restart},
    {CODEC_STR(launcher_summary, res.log_dir, "log_dir")},
    {CODEC_STR(launcher_summary, res.step_log, "step_log")},
    {CODEC_STR(launcher_summary, res.event_log, "event_log")},
};
static const codec_table summary_table = CODEC_TABLE(launcher_summary, "summary", summary_fields);

char *launcher_summary_json(const launcher_opts *o, const launcher_result *res) {
  launcher_summary s = {.global_batch = o->spec.global_batch, .workers = o->nproc, .steps_planned = o->spec.steps,
                        .res = *res};
  if (o->spec.restart) s.global_batch = s.steps_planned = 0; /* the beats' own: not the program's */
  snprintf(s.job, sizeof s.job, "%s", o->spec.job);
  snprintf(s.ckpt_dir, sizeof s.ckpt_dir, "%s", o->spec.ckpt_dir);
  if (!isfinite(s.res.final_loss)) s.res.final_loss = 0;
  if (!s.res.outcome[0]) snprintf(s.res.outcome, sizeof s.res.outcome, "%s", res->done ? "done" : "error");
  cJSON *j = cJSON_CreateObject();
  char *text = j && codec_encode_object(&summary_table, j, &s) == NEWT_OK ? cJSON_Print(j) : NULL; /* for people too */
  cJSON_Delete(j);
  return text;
}

/* What a summary of an earlier version leaves out, derived: a recovery's first step (what the
 * other phases leave of its total), how the run ended (from done and failed). */
static void summary_read(launcher_result *res) {
  for (int i = 0; i < res->nrecoveries; i++) {
    launcher_recovery *rec = &res->recoveries[i];
    int64_t before = rec->detect_ms + rec->plan_ms + rec->comm_ms + rec->restore_ms;
    if (rec->step_ms < 0) rec->step_ms = rec->total_ms > before ? rec->total_ms - before : 0;
  }
  if (!res->outcome[0])
    snprintf(res->outcome, sizeof res->outcome, "%s", res->done ? "done" : res->failed[0] ? "failed" : "error");
}

newt_result_t launcher_summary_from_json(const char *text, size_t len, launcher_summary *out) {
  memset(out, 0, sizeof *out);
  newt_result_t r = codec_decode(&summary_table, text, len, NULL, out);
  if (r != NEWT_OK) {
    launcher_result_free(&out->res);
    return r;
  }
  summary_read(&out->res);
  return NEWT_OK;
}

int64_t launcher_recovery_fault_step(const launcher_recovery *r) {
  return r->fault_step > 0 ? r->fault_step : r->step + r->steps_lost;
}

void launcher_result_free(launcher_result *res) {
  free(res->recoveries);
  res->recoveries = NULL;
  res->nrecoveries = 0;
  free(res->ckpts);
  res->ckpts = NULL;
  res->nckpts = 0;
  free(res->left_out);
  res->left_out = NULL;
  free(res->mismatches);
  res->mismatches = NULL;
  res->nmismatches = 0;
  res->nleft_out = 0;
}
