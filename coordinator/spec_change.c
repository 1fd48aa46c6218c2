/* A changed spec. `newt coordinator --spec FILE` stores the file's spec (coordinator_put_spec)
 * and, while it runs, reads the file again every NEWT_SPEC_CHECK_MS (a ConfigMap that `helm
 * upgrade` changed is updated in place): a change only in fields that can change while the
 * job runs (spec_update_allowed) replaces the spec in etcd, any other is refused. The leader
 * takes a changed spec the watch brought (picture.c): its own settings at once, the workers'
 * with a plan at the next step boundary. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/param.h"
#include "coordinator/coord.h"

NEWT_PARAM(SpecCheckMs, "NEWT_SPEC_CHECK_MS", 5000)

/* Replaces old (the stored spec, kv) with s (its text put) when only fields that can change
 * differ, and only over the spec compared with: a concurrent change is not overwritten. */
static newt_result_t replace_spec(rdzv_etcd *c, const char *file, const rdzv_etcd_kv *kv, const newt_spec *old,
                                  const newt_spec *s, const rdzv_etcd_op *put, char *changed, size_t cap) {
  char what[512] = "";
  if (memcmp(old, s, sizeof *s) == 0) return NEWT_OK;
  if (!spec_update_allowed(old, s, what, sizeof what)) return newt_err_wrap(NEWT_ERR_CONFLICT, "%s: ", file);
  rdzv_etcd_cmp same = {.key = put->key, .target = RDZV_CMP_MOD, .result = RDZV_CMP_EQUAL, .number = kv->mod_revision};
  rdzv_etcd_txn_result tr;
  memset(&tr, 0, sizeof tr);
  newt_result_t r = rdzv_etcd_txn(c, &same, 1, put, 1, NULL, 0, job_call_deadline(), &tr);
  if (r == NEWT_OK && !tr.succeeded)
    r = NEWT_ERR(NEWT_ERR_UNAVAILABLE, "%s: the spec in etcd changed meanwhile; trying again", file);
  rdzv_etcd_txn_result_free(&tr);
  if (r == NEWT_OK && changed && cap) snprintf(changed, cap, "%s", what);
  return r;
}

newt_result_t coordinator_put_spec(rdzv_etcd *c, const char *job, const char *file, char *changed, size_t cap) {
  char *text = NULL;
  size_t len = 0;
  if (changed && cap) changed[0] = '\0';
  NEWT_CHECK(newt_fs_read_all(file, 1 << 20, &text, &len));
  newt_spec s;
  newt_result_t r = spec_from_json(text, len, &s);
  free(text);
  if (r != NEWT_OK) return newt_err_wrap(r, "%s: ", file);
  if (strcmp(s.job, job) != 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: spec.job is \"%s\" but this is job \"%s\"", file, s.job, job);
  char *norm = spec_to_json(&s);
  NEWT_CHECK_ALLOC(norm);
  char key[256];
  r = job_key(key, sizeof key, job, JOB_REC_SPEC, 0, NULL);
  rdzv_etcd_cmp cmp = {.key = key, .target = RDZV_CMP_CREATE, .result = RDZV_CMP_EQUAL, .number = 0};
  rdzv_etcd_op put = {.type = RDZV_OP_PUT, .key = key, .value = norm, .value_len = strlen(norm)};
  rdzv_etcd_op get = {.type = RDZV_OP_RANGE, .key = key};
  rdzv_etcd_txn_result tr;
  memset(&tr, 0, sizeof tr);
  if (r == NEWT_OK) r = rdzv_etcd_txn(c, &cmp, 1, &put, 1, &get, 1, job_call_deadline(), &tr);
  if (r == NEWT_OK && !tr.succeeded && tr.n == 1 && tr.results[0].range.n == 1) {
    const rdzv_etcd_kv *kv = &tr.results[0].range.kvs[0];
    job_change old;
    r = job_change_expect(job, kv, JOB_REC_SPEC, &old);
    if (r == NEWT_OK) r = replace_spec(c, file, kv, &old.u.spec, &s, &put, changed, cap);
    job_change_free(&old);
  }
  free(norm);
  rdzv_etcd_txn_result_free(&tr);
  return r;
}

/* Posts what happened to a changed spec: taken (what changed) or refused (why). */
static void spec_event(coord *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void spec_event(coord *c, const char *fmt, ...) {
  job_event ev = {.type = JOB_EV_SPEC};
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ev.why, sizeof ev.why, fmt, ap);
  va_end(ap);
  coord_post_event(c, &ev);
}

/* Stored when its content changed since the last look: taken when only fields that can
 * change differ, refused (logged, an event, the job goes on as it is) otherwise. */
void coord_check_spec_file(coord *c) {
  uint64_t now = newt_now_ns();
  if (!c->o->spec_file || (c->spec_file_checked && now - c->spec_file_checked < (uint64_t)newt_param_SpecCheckMs() * 1000000))
    return;
  c->spec_file_checked = now;
  char *text = NULL;
  size_t len = 0;
  if (newt_fs_read_all(c->o->spec_file, 1 << 20, &text, &len) != NEWT_OK) return; /* mid-update: next time */
  if (c->spec_file_text && strcmp(c->spec_file_text, text) == 0) {
    free(text);
    return;
  }
  char changed[512];
  newt_result_t r = coordinator_put_spec(c->etcd, c->o->job, c->o->spec_file, changed, sizeof changed);
  if (r == NEWT_OK || r == NEWT_ERR_CONFLICT || r == NEWT_ERR_INVALID) { /* an answer: not again until it changes */
    free(c->spec_file_text);
    c->spec_file_text = text;
    text = NULL;
  }
  if (r == NEWT_OK && changed[0]) NEWT_INFO(COORD, "%s: stored the changed spec of %s: %s", c->id, c->o->spec_file, changed);
  if (r == NEWT_ERR_CONFLICT || r == NEWT_ERR_INVALID) {
    NEWT_ERROR(COORD, "%s: refused the changed spec: %s", c->id, newt_errmsg());
    if (c->cand && rdzv_candidate_is_leader(c->cand)) spec_event(c, "refused: %s", newt_errmsg());
  }
  free(text);
}

/* The coordinator's own settings at once; what the workers use (checkpoints, timeouts, the
 * data-parallel range) with a plan at the next step boundary, which each rank reads the spec
 * again for. */
newt_result_t coord_take_spec_change(coord *c) {
  pthread_mutex_lock(&c->mu);
  if (!c->spec_changed) {
    pthread_mutex_unlock(&c->mu);
    return NEWT_OK;
  }
  newt_spec old = c->spec;
  char what[512] = "";
  int ok = spec_update_allowed(&old, &c->spec_next, what, sizeof what);
  if (ok) c->spec = c->spec_next;
  c->spec_changed = 0;
  int planned = c->plan.generation > 0;
  pthread_mutex_unlock(&c->mu);
  if (!ok || !what[0]) return NEWT_OK;
  NEWT_INFO(COORD, "%s: took the changed spec: %s", c->id, what);
  spec_event(c, "taken: %s", what);
  if (!planned) return NEWT_OK;
  int no_layout;
  newt_result_t r = coord_replan(c, "spec", "boundary", NULL, 0, &no_layout);
  if (no_layout) {
    NEWT_WARN(COORD, "%s: no layout fits the changed spec (%s); the next plan takes it", c->id, newt_errmsg());
    r = NEWT_OK;
  }
  return r;
}
