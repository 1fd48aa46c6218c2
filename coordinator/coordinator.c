/* The coordinator (see coordinator.h, docs/elastic.md).
 *
 * A leader keeps a picture of the job built from one consistent read of /newt/<job>/ and
 * a watch from the revision after it: members (workers/), the plan, the failure reports
 * and acks of the current generation, progress and the end marker. The watch thread only
 * updates that picture; the main thread looks at it every few milliseconds and decides:
 *
 *   - no plan yet: plan once enough workers are there and joins have settled;
 *   - a rank is leaving (SIGTERM): replan without it at the step boundary;
 *   - reports of a failed collective: wait until every rank not accused has reported (or
 *     the report window passes), fence the accused ranks that did not report themselves,
 *     replan with `switch: abort`;
 *   - a rank's registration vanished (lease expired): replan without it;
 *   - no step progress for hang_timeout_ms: replan with the live members (a hang nobody
 *     could name);
 *   - newcomers would allow a larger data-parallel size: replan at a step boundary once
 *     joins have settled;
 *   - every rank acknowledged the current generation: record the recovery and its timings.
 *
 * Every plan write is a guarded transaction on the candidacy key, so a deposed leader's
 * write fails; on that, or on losing the lease, the coordinator steps down and campaigns
 * again. */
#include "coordinator/coordinator.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/json.h"
#include "common/log.h"
#include "common/param.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "coordinator/metrics.h"
#include "coordinator/plan.h"
#include "coordinator/spec.h"
#include "rendezvous/rdzv.h"

NEWT_PARAM(JoinWindowMs, "NEWT_JOIN_WINDOW_MS", 500)
NEWT_PARAM(StartWindowMs, "NEWT_START_WINDOW_MS", 1000)
NEWT_PARAM(CoordTickMs, "NEWT_COORD_TICK_MS", 5)
NEWT_PARAM(CoordCallMs, "NEWT_ETCD_CALL_MS", 5000)

#define MAX_ACCUSE 8

typedef struct c_report {
  char id[RDZV_NAME_MAX];
  char accuse[MAX_ACCUSE][RDZV_NAME_MAX];
  int naccuse;
  int hang;
  int64_t step;
  uint64_t t_ms;
} c_report;

typedef struct c_ack {
  char id[RDZV_NAME_MAX];
  uint64_t t_plan, t_comm, t_restore, t_step;
  char restore[8];
  int64_t restore_step;
} c_ack;

typedef struct coord {
  const coordinator_opts *o;
  char id[RDZV_NAME_MAX];
  rdzv_etcd *etcd;
  newt_spec spec;
  metrics_t *metrics;
  rdzv_candidate *cand;
  char prefix[256];

  pthread_mutex_t mu; /* guards the picture below, written by the watch thread */
  rdzv_worker *members;
  int nmembers, cap_members;
  newt_plan plan; /* generation 0: none */
  c_report *reports;
  int nreports;
  c_ack *acks;
  int nacks;
  int64_t prog_step;
  double prog_loss, prog_tps;
  uint64_t prog_change; /* monotonic ns of the last step change */
  int done;
  uint64_t last_join;   /* monotonic ns of the last registration we had not seen */
  uint64_t join_checked_join, join_checked_gen; /* join_grows_layout said no for these */
  uint64_t first_member; /* monotonic ns the first worker was seen (the first plan) */
  uint64_t first_report; /* monotonic ns of the first report of this generation (0: none) */
  uint64_t first_gone;   /* monotonic ns a rank of this generation was first missing (0: none) */
  int64_t max_step_seen; /* newest step any rank of this generation reached */
  char (*departed)[RDZV_NAME_MAX]; /* left gracefully since the plan (their key is gone) */
  int ndeparted;

  /* main thread only */
  rdzv_etcd_watch *watch;
  uint64_t plan_mono;   /* when the current plan was published */
  int recorded;         /* the recovery of the current generation is recorded */
  char cause[16];       /* what triggered the current plan */
  uint64_t t_trigger;   /* wall ms: when we learnt of it */
  uint64_t t_detect;    /* wall ms: the earliest detection (a survivor's report) */
  uint64_t t_published; /* wall ms */
  int64_t lost_from;    /* newest step reached before the plan (steps_lost) */
  int waiting_logged;
} coord;

static newt_deadline_t call_deadline(void) { return newt_deadline_in_ms(newt_param_CoordCallMs()); }

/* --- the spec ------------------------------------------------------------------------------ */

newt_result_t coordinator_put_spec(rdzv_etcd *c, const char *job, const char *file) {
  char *text = NULL;
  size_t len = 0;
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
  r = rdzv_key(key, sizeof key, job, "spec");
  rdzv_etcd_cmp cmp = {.key = key, .target = RDZV_CMP_CREATE, .result = RDZV_CMP_EQUAL, .number = 0};
  rdzv_etcd_op put = {.type = RDZV_OP_PUT, .key = key, .value = norm, .value_len = strlen(norm)};
  rdzv_etcd_op get = {.type = RDZV_OP_RANGE, .key = key};
  rdzv_etcd_txn_result tr;
  memset(&tr, 0, sizeof tr);
  if (r == NEWT_OK) r = rdzv_etcd_txn(c, &cmp, 1, &put, 1, &get, 1, call_deadline(), &tr);
  free(norm);
  NEWT_CHECK(r);
  if (!tr.succeeded && tr.n == 1 && tr.results[0].range.n == 1) {
    newt_spec old;
    const rdzv_etcd_kv *kv = &tr.results[0].range.kvs[0];
    r = spec_from_json(kv->value, kv->value_len, &old);
    if (r == NEWT_OK && memcmp(&old, &s, sizeof s) != 0)
      r = NEWT_ERR(NEWT_ERR_CONFLICT,
                   "job %s already has a different spec in etcd; %s was not stored (delete %s to replace it)", job,
                   file, key);
  }
  rdzv_etcd_txn_result_free(&tr);
  return r;
}

/* --- the picture (watch thread and snapshot) ---------------------------------------------- */

static int find_member(const coord *c, const char *id) {
  for (int i = 0; i < c->nmembers; i++)
    if (strcmp(c->members[i].id, id) == 0) return i;
  return -1;
}

static void put_member(coord *c, const rdzv_etcd_kv *kv, const char *id) {
  rdzv_worker w;
  if (rdzv_worker_from_json(kv->value, kv->value_len, kv->key, &w) != NEWT_OK) {
    NEWT_WARN(COORD, "ignoring a registration: %s", newt_errmsg());
    return;
  }
  if (strcmp(w.id, id) != 0) {
    NEWT_WARN(COORD, "ignoring %s: it registers id %s", kv->key, w.id);
    return;
  }
  w.lease = kv->lease;
  w.create_revision = kv->create_revision;
  w.mod_revision = kv->mod_revision;
  int i = find_member(c, id);
  if (i < 0) {
    if (c->nmembers == c->cap_members) {
      int cap = c->cap_members ? 2 * c->cap_members : 16;
      rdzv_worker *m = realloc(c->members, (size_t)cap * sizeof *m);
      if (!m) return;
      c->members = m;
      c->cap_members = cap;
    }
    i = c->nmembers++;
    if (!c->plan.generation || !plan_find(&c->plan, id)) c->last_join = newt_now_ns();
  }
  c->members[i] = w;
}

static int member_leaving(const rdzv_worker *w) {
  return strcmp(w->state, "leaving") == 0 || strcmp(w->state, "left") == 0;
}

/* A worker that finished the job: it leaves, but nothing needs replanning for it. */
static int member_done(const rdzv_worker *w) { return strcmp(w->state, "done") == 0; }

static void drop_member(coord *c, const char *id) {
  int i = find_member(c, id);
  if (i < 0) return;
  if (member_leaving(&c->members[i])) {
    /* remember it: its "left" and its deletion may arrive together */
    char (*d)[RDZV_NAME_MAX] = realloc(c->departed, (size_t)(c->ndeparted + 1) * sizeof *d);
    if (d) {
      c->departed = d;
      snprintf(c->departed[c->ndeparted++], RDZV_NAME_MAX, "%s", id);
    }
  }
  c->members[i] = c->members[--c->nmembers];
}

static int departed(const coord *c, const char *id) {
  for (int i = 0; i < c->ndeparted; i++)
    if (strcmp(c->departed[i], id) == 0) return 1;
  return 0;
}

static int64_t key_generation(const char *rest, const char **id) {
  /* "<20 digits>/<id>" */
  char *end;
  long long g = strtoll(rest, &end, 10);
  if (end == rest || *end != '/') return -1;
  *id = end + 1;
  return g;
}

static void put_report(coord *c, const rdzv_etcd_kv *kv, const char *id) {
  cJSON *j;
  if (newt_json_parse(kv->value, kv->value_len, kv->key, &j) != NEWT_OK) return;
  c_report rep;
  memset(&rep, 0, sizeof rep);
  snprintf(rep.id, sizeof rep.id, "%s", id);
  const char *kind = "crash";
  int64_t t = 0;
  newt_json_get_str(j, "report", "kind", 0, &kind);
  newt_json_get_int(j, "report", "step", 0, &rep.step);
  newt_json_get_int(j, "report", "t_ms", 0, &t);
  rep.t_ms = (uint64_t)t;
  rep.hang = strcmp(kind, "hang") == 0;
  const cJSON *acc = NULL;
  newt_json_get_arr(j, "report", "accuse", 0, &acc);
  for (const cJSON *a = acc ? acc->child : NULL; a && rep.naccuse < MAX_ACCUSE; a = a->next)
    if (cJSON_IsString(a)) snprintf(rep.accuse[rep.naccuse++], RDZV_NAME_MAX, "%s", a->valuestring);
  cJSON_Delete(j);
  for (int i = 0; i < c->nreports; i++)
    if (strcmp(c->reports[i].id, id) == 0) {
      c->reports[i] = rep;
      return;
    }
  c_report *r = realloc(c->reports, (size_t)(c->nreports + 1) * sizeof *r);
  if (!r) return;
  c->reports = r;
  c->reports[c->nreports++] = rep;
  if (!c->first_report) c->first_report = newt_now_ns();
  if (rep.step > c->max_step_seen) c->max_step_seen = rep.step;
}

static void put_ack(coord *c, const rdzv_etcd_kv *kv, const char *id) {
  cJSON *j;
  if (newt_json_parse(kv->value, kv->value_len, kv->key, &j) != NEWT_OK) return;
  c_ack a;
  memset(&a, 0, sizeof a);
  snprintf(a.id, sizeof a.id, "%s", id);
  int64_t v = 0;
  const char *src = "";
  if (newt_json_get_int(j, "ack", "t_plan", 0, &v) == NEWT_OK) a.t_plan = (uint64_t)v;
  if (newt_json_get_int(j, "ack", "t_comm", 0, &v) == NEWT_OK) a.t_comm = (uint64_t)v;
  if (newt_json_get_int(j, "ack", "t_restore", 0, &v) == NEWT_OK) a.t_restore = (uint64_t)v;
  if (newt_json_get_int(j, "ack", "t_step", 0, &v) == NEWT_OK) a.t_step = (uint64_t)v;
  newt_json_get_int(j, "ack", "restore_step", 0, &a.restore_step);
  newt_json_get_str(j, "ack", "restore", 0, &src);
  snprintf(a.restore, sizeof a.restore, "%s", src);
  cJSON_Delete(j);
  for (int i = 0; i < c->nacks; i++)
    if (strcmp(c->acks[i].id, id) == 0) return;
  c_ack *n = realloc(c->acks, (size_t)(c->nacks + 1) * sizeof *n);
  if (!n) return;
  c->acks = n;
  c->acks[c->nacks++] = a;
}

static void put_progress(coord *c, const rdzv_etcd_kv *kv) {
  cJSON *j;
  if (newt_json_parse(kv->value, kv->value_len, "progress", &j) != NEWT_OK) return;
  int64_t step = c->prog_step;
  newt_json_get_int(j, "progress", "step", 0, &step);
  newt_json_get_double(j, "progress", "loss", 0, &c->prog_loss);
  newt_json_get_double(j, "progress", "tokens_per_s", 0, &c->prog_tps);
  cJSON_Delete(j);
  if (step != c->prog_step) c->prog_change = newt_now_ns();
  c->prog_step = step;
  if (step > c->max_step_seen) c->max_step_seen = step;
  metrics_set(c->metrics, "newt_step", (double)step);
  metrics_set(c->metrics, "newt_loss", c->prog_loss);
  metrics_set(c->metrics, "newt_tokens_per_second", c->prog_tps);
}

/* A new current plan (taken over): the reports, acks and departures of the last one are
 * no longer this generation's. Called with mu held. */
static void set_plan_locked(coord *c, newt_plan *p) {
  plan_free(&c->plan);
  c->plan = *p;
  c->nreports = 0;
  c->nacks = 0;
  c->ndeparted = 0;
  c->first_report = 0;
  c->first_gone = 0;
  c->max_step_seen = c->prog_step;
}

static void take_plan_locked(coord *c, const rdzv_etcd_kv *kv) {
  newt_plan p;
  if (plan_from_json(kv->value, kv->value_len, &p) != NEWT_OK) {
    NEWT_WARN(COORD, "the stored plan is not valid: %s", newt_errmsg());
    return;
  }
  if (p.generation <= c->plan.generation) {
    plan_free(&p);
    return;
  }
  set_plan_locked(c, &p);
}

/* One key of the job changed (value NULL: deleted). Called with mu held. */
static void apply_kv(coord *c, const rdzv_etcd_kv *kv, int deleted) {
  size_t plen = strlen(c->prefix);
  if (kv->key_len <= plen || strncmp(kv->key, c->prefix, plen) != 0) return;
  const char *rest = kv->key + plen, *id = NULL;
  if (strncmp(rest, "workers/", 8) == 0) {
    if (deleted) drop_member(c, rest + 8);
    else put_member(c, kv, rest + 8);
  } else if (strncmp(rest, "reports/", 8) == 0 && !deleted) {
    if (key_generation(rest + 8, &id) == (int64_t)c->plan.generation) put_report(c, kv, id);
  } else if (strncmp(rest, "acks/", 5) == 0 && !deleted) {
    if (key_generation(rest + 5, &id) == (int64_t)c->plan.generation) put_ack(c, kv, id);
  } else if (strcmp(rest, "progress") == 0 && !deleted) {
    put_progress(c, kv);
  } else if (strcmp(rest, "done") == 0 && !deleted) {
    c->done = 1;
  } else if (strcmp(rest, "plan") == 0 && !deleted) {
    take_plan_locked(c, kv);
  }
}

static void reset_picture_locked(coord *c) {
  c->nmembers = 0;
  c->nreports = 0;
  c->nacks = 0;
  c->first_report = 0;
}

/* Sorting keys so that the plan is read before reports and acks of its generation. */
static int kv_rank(const coord *c, const rdzv_etcd_kv *kv) {
  const char *rest = kv->key + strlen(c->prefix);
  return strcmp(rest, "plan") == 0 ? 0 : strcmp(rest, "progress") == 0 ? 1 : 2;
}

static void apply_snapshot_locked(coord *c, const rdzv_etcd_kv *kvs, size_t n) {
  reset_picture_locked(c);
  for (int pass = 0; pass < 3; pass++)
    for (size_t i = 0; i < n; i++)
      if (kv_rank(c, &kvs[i]) == pass) apply_kv(c, &kvs[i], 0);
}

static void on_watch(void *ud, const rdzv_etcd_watch_resp *r) {
  coord *c = ud;
  pthread_mutex_lock(&c->mu);
  if (r->kind == RDZV_WATCH_EVENTS) {
    for (size_t i = 0; i < r->n_events; i++) apply_kv(c, &r->events[i].kv, r->events[i].type == RDZV_EVENT_DELETE);
  } else if (r->kind == RDZV_WATCH_RESYNC) {
    apply_snapshot_locked(c, r->kvs, r->n_kvs);
  }
  pthread_mutex_unlock(&c->mu);
}

static newt_result_t start_picture(coord *c) {
  rdzv_etcd_kvs all;
  rdzv_etcd_range_opts ro = {.prefix = 1};
  NEWT_CHECK(rdzv_etcd_range(c->etcd, c->prefix, &ro, call_deadline(), &all));
  pthread_mutex_lock(&c->mu);
  apply_snapshot_locked(c, all.kvs, all.n);
  c->prog_change = newt_now_ns();
  pthread_mutex_unlock(&c->mu);
  rdzv_etcd_watch_opts wo = {.prefix = 1, .start_revision = all.revision + 1, .progress_notify = 1};
  rdzv_etcd_kvs_free(&all);
  return rdzv_etcd_watch_start(c->etcd, c->prefix, &wo, on_watch, c, call_deadline(), &c->watch);
}

/* --- decisions (main thread) ----------------------------------------------------------------- */

static void post_event(coord *c, cJSON *ev) {
  newt_json_add_int(ev, "t_ms", (int64_t)newt_wall_ms());
  cJSON_AddStringToObject(ev, "coordinator", c->id);
  char *text = newt_json_print(ev);
  cJSON_Delete(ev);
  if (text && rdzv_event_post(c->etcd, c->o->job, text, call_deadline()) != NEWT_OK)
    NEWT_WARN(COORD, "posting an event: %s", newt_errmsg());
  free(text);
}

static int is_reporter(const coord *c, const char *id) {
  for (int i = 0; i < c->nreports; i++)
    if (strcmp(c->reports[i].id, id) == 0) return 1;
  return 0;
}

static int is_accused(const coord *c, const char *id) {
  for (int i = 0; i < c->nreports; i++)
    for (int k = 0; k < c->reports[i].naccuse; k++)
      if (strcmp(c->reports[i].accuse[k], id) == 0) return 1;
  return 0;
}

/* The plan members (live, not leaving, not in `exclude`). Called with mu held. */
static int collect_members(coord *c, char (*exclude)[RDZV_NAME_MAX], int nexclude, plan_member *out) {
  int n = 0;
  for (int i = 0; i < c->nmembers; i++) {
    const rdzv_worker *w = &c->members[i];
    if (member_leaving(w) || member_done(w) || !w->addr[0]) continue;
    int skip = 0;
    for (int k = 0; k < nexclude && !skip; k++) skip = strcmp(exclude[k], w->id) == 0;
    if (skip) continue;
    plan_member *m = &out[n++];
    memset(m, 0, sizeof *m);
    snprintf(m->id, sizeof m->id, "%s", w->id);
    snprintf(m->host, sizeof m->host, "%.63s", w->host);
    snprintf(m->addr, sizeof m->addr, "%.95s", w->addr);
    m->join_rev = w->create_revision;
    const plan_rank *r = c->plan.generation ? plan_find(&c->plan, w->id) : NULL;
    m->prev_rank = r ? r->rank : -1;
    m->prev_pp = r ? r->pp : -1;
    m->has_state = r != NULL;
  }
  return n;
}

/* Computes and publishes the next plan. Returns NEWT_ERR_UNAVAILABLE when no layout fits
 * the live members, NEWT_ERR_CONFLICT when we no longer lead. */
static newt_result_t replan(coord *c, const char *cause, const char *switch_mode, char (*exclude)[RDZV_NAME_MAX],
                            int nexclude) {
  pthread_mutex_lock(&c->mu);
  plan_member *m = calloc((size_t)(c->nmembers ? c->nmembers : 1), sizeof *m);
  if (!m) {
    pthread_mutex_unlock(&c->mu);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory planning");
  }
  int n = collect_members(c, exclude, nexclude, m);
  /* workers leaving gracefully hand their state over before they go: the ranks of the
     current plan, and its donors while it has not started (once it has, they handed over
     and left) */
  plan_member *donors = calloc((size_t)(c->nmembers ? c->nmembers : 1), sizeof *donors);
  int ndonors = 0;
  for (int i = 0; donors && i < c->nmembers; i++) {
    const rdzv_worker *w = &c->members[i];
    if (strcmp(w->state, "leaving") != 0 || !w->addr[0]) continue;
    if (!plan_find(&c->plan, w->id) && (c->recorded || !plan_find_donor(&c->plan, w->id))) continue;
    snprintf(donors[ndonors].id, sizeof donors[ndonors].id, "%s", w->id);
    snprintf(donors[ndonors].host, sizeof donors[ndonors].host, "%.63s", w->host);
    snprintf(donors[ndonors].addr, sizeof donors[ndonors].addr, "%.95s", w->addr);
    ndonors++;
  }
  uint64_t prev = c->plan.generation;
  int64_t step = c->prog_step, lost_from = c->max_step_seen;
  uint64_t first_report = c->first_report;
  uint64_t t_detect = 0;
  for (int i = 0; i < c->nreports; i++)
    if (!t_detect || c->reports[i].t_ms < t_detect) t_detect = c->reports[i].t_ms;
  pthread_mutex_unlock(&c->mu);
  (void)first_report;

  newt_plan p = {0};
  newt_result_t r = donors ? plan_compute(&c->spec, m, n, prev, &p) : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory planning");
  free(m);
  for (int i = 0; r == NEWT_OK && i < ndonors; i++) r = plan_add_donor(&p, donors[i].id, donors[i].host, donors[i].addr);
  free(donors);
  if (r != NEWT_OK) {
    plan_free(&p);
    return r;
  }
  snprintf(p.cause, sizeof p.cause, "%s", cause);
  snprintf(p.switch_mode, sizeof p.switch_mode, "%s", switch_mode);
  p.step = step;
  char *json = plan_to_json(&p);
  if (!json) {
    plan_free(&p);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing a plan");
  }
  r = rdzv_plan_publish(c->cand, (int64_t)p.generation, json, call_deadline());
  free(json);
  if (r != NEWT_OK) {
    plan_free(&p);
    return r;
  }
  uint64_t now = newt_wall_ms();
  NEWT_INFO(COORD, "published plan %llu (%s): %d ranks, dp %d, accum %lld, %d spares", (unsigned long long)p.generation,
            cause, p.nranks, p.dp, (long long)p.accum, p.nspares);
  cJSON *ev = cJSON_CreateObject();
  cJSON_AddStringToObject(ev, "type", "plan");
  newt_json_add_int(ev, "generation", (int64_t)p.generation);
  cJSON_AddStringToObject(ev, "cause", cause);
  newt_json_add_int(ev, "world", p.nranks);
  newt_json_add_int(ev, "dp", p.dp);
  newt_json_add_int(ev, "spares", p.nspares);
  cJSON *ex = cJSON_AddArrayToObject(ev, "excluded");
  for (int i = 0; i < nexclude; i++) cJSON_AddItemToArray(ex, cJSON_CreateString(exclude[i]));

  pthread_mutex_lock(&c->mu);
  set_plan_locked(c, &p);
  c->prog_change = newt_now_ns();
  pthread_mutex_unlock(&c->mu);

  c->plan_mono = newt_now_ns();
  c->recorded = 0;
  snprintf(c->cause, sizeof c->cause, "%s", cause);
  c->t_published = now;
  if (!c->t_trigger) c->t_trigger = now;
  c->t_detect = t_detect ? t_detect : c->t_trigger;
  c->lost_from = lost_from;
  c->waiting_logged = 0;
  metrics_set(c->metrics, "newt_generation", (double)p.generation);
  metrics_set(c->metrics, "newt_world_size", (double)p.nranks);
  post_event(c, ev);
  return NEWT_OK;
}

/* Fences a member: deletes its registration by revoking its lease. */
static void fence(coord *c, const char *id) {
  pthread_mutex_lock(&c->mu);
  int i = find_member(c, id);
  int64_t lease = i >= 0 ? c->members[i].lease : 0;
  pthread_mutex_unlock(&c->mu);
  if (lease && rdzv_etcd_lease_revoke(c->etcd, lease, call_deadline()) != NEWT_OK &&
      newt_errcode() != NEWT_ERR_NOTFOUND)
    NEWT_WARN(COORD, "fencing %s: %s", id, newt_errmsg());
  /* out of the picture now, not when the watch brings the deletion: no plan (nor the
     question whether newcomers allow a larger one) may count it meanwhile */
  pthread_mutex_lock(&c->mu);
  drop_member(c, id);
  pthread_mutex_unlock(&c->mu);
  NEWT_INFO(COORD, "fenced %s", id);
  cJSON *ev = cJSON_CreateObject();
  cJSON_AddStringToObject(ev, "type", "fence");
  cJSON_AddStringToObject(ev, "worker", id);
  post_event(c, ev);
}

static void record_recovery(coord *c) {
  pthread_mutex_lock(&c->mu);
  const newt_plan *p = &c->plan;
  int all = p->generation && p->nranks > 0;
  for (int r = 0; r < p->nranks && all; r++) {
    int found = 0;
    for (int k = 0; k < c->nacks && !found; k++) found = strcmp(c->acks[k].id, p->ranks[r].worker) == 0;
    all = found;
  }
  if (!all) {
    pthread_mutex_unlock(&c->mu);
    return;
  }
  uint64_t t_comm = 0, t_restore = 0, t_step = 0;
  int64_t restore_step = INT64_MAX;
  const char *worst = "memory";
  static const char *const order[] = {"memory", "peer", "init", "ckpt"};
  for (int k = 0; k < c->nacks; k++) {
    const c_ack *a = &c->acks[k];
    if (a->t_comm > t_comm) t_comm = a->t_comm;
    if (a->t_restore > t_restore) t_restore = a->t_restore;
    if (a->t_step > t_step) t_step = a->t_step;
    if (a->restore_step < restore_step) restore_step = a->restore_step;
    for (int o = 0; o < 4; o++)
      if (strcmp(a->restore, order[o]) == 0)
        for (int q = 0; q < 4; q++)
          if (strcmp(worst, order[q]) == 0 && o > q) worst = order[o];
  }
  uint64_t gen = p->generation;
  int world = p->nranks;
  pthread_mutex_unlock(&c->mu);
  c->recorded = 1;
  int64_t lost = c->lost_from - restore_step;
  if (lost < 0 || strcmp(c->cause, "initial") == 0) lost = 0;
  cJSON *ev = cJSON_CreateObject();
  cJSON_AddStringToObject(ev, "type", strcmp(c->cause, "initial") == 0 ? "started" : "recovered");
  newt_json_add_int(ev, "generation", (int64_t)gen);
  cJSON_AddStringToObject(ev, "cause", c->cause);
  newt_json_add_int(ev, "world", world);
  newt_json_add_int(ev, "t_trigger", (int64_t)c->t_trigger);
  newt_json_add_int(ev, "t_detect", (int64_t)c->t_detect);
  newt_json_add_int(ev, "t_plan", (int64_t)c->t_published);
  newt_json_add_int(ev, "t_comm", (int64_t)t_comm);
  newt_json_add_int(ev, "t_restore", (int64_t)t_restore);
  newt_json_add_int(ev, "t_step", (int64_t)t_step);
  cJSON_AddStringToObject(ev, "restore", worst);
  newt_json_add_int(ev, "restore_step", restore_step);
  newt_json_add_int(ev, "steps_lost", lost);
  NEWT_INFO(COORD, "generation %llu (%s) complete: %lld ms from detection to its first step, %lld steps lost",
            (unsigned long long)gen, c->cause, (long long)(t_step - c->t_detect), (long long)lost);
  if (strcmp(c->cause, "initial") != 0) {
    metrics_add(c->metrics, "newt_recoveries_total", 1);
    metrics_set(c->metrics, "newt_last_recovery_ms", (double)(t_step - c->t_detect));
  }
  post_event(c, ev);
  c->t_trigger = 0;
}

/* ns from t to now; 0 when t is later (the watch thread may stamp a time after ours). */
static uint64_t elapsed(uint64_t now, uint64_t t) { return now > t ? now - t : 0; }

/* Whether the members not in the plan would make a larger one: the plan they would get
 * (placement included: tensor-parallel groups never span hosts) against the current.
 * Leavers, donors and finishers count for nothing. Called with mu held; the answer is
 * kept until the membership or the plan changes. */
static int join_grows_layout(coord *c) {
  if (c->join_checked_join == c->last_join && c->join_checked_gen == c->plan.generation) return 0;
  plan_member *m = calloc((size_t)(c->nmembers ? c->nmembers : 1), sizeof *m);
  if (!m) return 0;
  int n = collect_members(c, NULL, 0, m), unplanned = 0;
  for (int i = 0; i < n; i++) unplanned += m[i].prev_rank < 0;
  newt_plan trial = {0};
  int grows = unplanned && plan_compute(&c->spec, m, n, c->plan.generation, &trial) == NEWT_OK &&
              trial.dp * trial.pp > c->plan.dp * c->plan.pp;
  plan_free(&trial);
  free(m);
  if (!grows) c->join_checked_join = c->last_join, c->join_checked_gen = c->plan.generation;
  return grows;
}

/* Looks at the picture once and acts. Returns NEWT_ERR_CONFLICT when leadership is lost. */
static newt_result_t decide(coord *c) {
  uint64_t now;
  char (*exclude)[RDZV_NAME_MAX] = NULL;
  int nexclude = 0;
  const char *cause = NULL, *mode = "abort";
  newt_result_t r = NEWT_OK;

  pthread_mutex_lock(&c->mu);
  now = newt_now_ns();
  metrics_set(c->metrics, "newt_workers", (double)c->nmembers);
  int nranks = c->plan.nranks;
  exclude = calloc((size_t)(c->nmembers + nranks + 1), sizeof *exclude);
  if (!exclude) {
    pthread_mutex_unlock(&c->mu);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory deciding");
  }
  int finishing = 0;
  for (int i = 0; i < c->nmembers; i++) finishing |= member_done(&c->members[i]);
  if (finishing) {
    /* the last step is done and the ranks are leaving: the end marker follows */
  } else if (!c->plan.generation) {
    /* the first plan: once spec.parallel.start_workers are here (or start_timeout_ms after
       the first came), else once joins settle or every worker a layout could use is here */
    int64_t most = c->spec.dp_max * c->spec.tp * c->spec.pp;
    if (c->nmembers > 0 && !c->first_member) c->first_member = now;
    int go;
    if (c->spec.start_workers > 0)
      go = c->nmembers >= c->spec.start_workers ||
           elapsed(now, c->first_member) >= (uint64_t)c->spec.start_timeout_ms * 1000000ull;
    else
      go = c->nmembers >= most || elapsed(now, c->last_join) >= (uint64_t)newt_param_StartWindowMs() * 1000000ull;
    if (c->nmembers > 0 && go) cause = "initial", mode = "boundary";
  } else {
    int gone = 0, leaving = 0, unreported = 0;
    for (int k = 0; k < nranks; k++) {
      const char *id = c->plan.ranks[k].worker;
      int i = find_member(c, id);
      if (i < 0 && departed(c, id)) {
        leaving++;
        snprintf(exclude[nexclude++], RDZV_NAME_MAX, "%s", id);
      } else if (i < 0) {
        gone++;
        snprintf(exclude[nexclude++], RDZV_NAME_MAX, "%s", id);
      } else if (member_leaving(&c->members[i])) {
        leaving++;
        snprintf(exclude[nexclude++], RDZV_NAME_MAX, "%s", id);
      } else if (c->nreports && is_accused(c, id) && !is_reporter(c, id)) {
        snprintf(exclude[nexclude++], RDZV_NAME_MAX, "%s", id); /* a suspect */
      } else if (c->nreports && !is_reporter(c, id)) {
        unreported++;
      }
    }
    int window_over = c->first_report &&
                      elapsed(now, c->first_report) >= (uint64_t)c->spec.report_window_ms * 1000000ull;
    /* a failure cascades (each rank that sees one aborts, closing its links), so the
       kind of the earliest report is the kind of the fault */
    int first_hang = 0;
    uint64_t first_t = UINT64_MAX;
    for (int i = 0; i < c->nreports; i++)
      if (c->reports[i].t_ms < first_t || (c->reports[i].t_ms == first_t && !c->reports[i].hang)) {
        first_t = c->reports[i].t_ms;
        first_hang = c->reports[i].hang;
      }
    if (c->nreports && (unreported == 0 || window_over)) {
      if (window_over && unreported) {
        /* ranks that neither reported nor were named: they are stuck too */
        for (int k = 0; k < nranks; k++) {
          const char *id = c->plan.ranks[k].worker;
          if (find_member(c, id) >= 0 && !is_reporter(c, id) && !is_accused(c, id))
            snprintf(exclude[nexclude++], RDZV_NAME_MAX, "%s", id);
        }
      }
      cause = first_hang ? "hang" : "crash";
    } else if (!c->nreports && leaving && !gone) {
      cause = "leave", mode = "boundary";
    } else if (!c->nreports && gone) {
      /* a lease ran out and no survivor saw a connection die: a rank that crashed would
         have been reported within milliseconds, so it stopped (or lost its network) --
         unless no rank survived to report anything. Leases of ranks that died together run
         out up to a renewal period apart: wait that long for the others (or a report). */
      if (!c->first_gone) c->first_gone = now;
      if (gone == nranks) {
        /* nobody left: nothing runs and no state is held, so gather the workers that are
           arriving (as for the first plan) instead of planning with the first one */
        if (elapsed(now, c->last_join) >= (uint64_t)newt_param_JoinWindowMs() * 1000000ull) cause = "crash";
      }
      else if (elapsed(now, c->first_gone) >= (uint64_t)c->spec.lease_ttl_ms / 2 * 1000000ull) cause = "hang";
    } else if (!c->nreports && elapsed(now, c->prog_change > c->plan_mono ? c->prog_change : c->plan_mono) >=
                                          (uint64_t)c->spec.hang_timeout_ms * 1000000ull) {
      cause = "hang";
    } else if (!c->nreports && elapsed(now, c->last_join) >= (uint64_t)newt_param_JoinWindowMs() * 1000000ull) {
      /* newcomers: replan only when they allow a larger layout */
      if (join_grows_layout(c)) cause = "join", mode = "boundary";
    }
  }
  pthread_mutex_unlock(&c->mu);

  if (cause) {
    if (!c->t_trigger) c->t_trigger = newt_wall_ms();
    /* fence the accused that did not report: a hung process must not come back into g+1 */
    if (strcmp(cause, "crash") == 0 || strcmp(cause, "hang") == 0)
      for (int i = 0; i < nexclude; i++) {
        pthread_mutex_lock(&c->mu);
        int present = find_member(c, exclude[i]) >= 0;
        pthread_mutex_unlock(&c->mu);
        if (present) fence(c, exclude[i]);
      }
    r = replan(c, cause, mode, exclude, nexclude);
    if (r == NEWT_ERR_UNAVAILABLE) {
      if (!c->waiting_logged) {
        NEWT_WARN(COORD, "cannot plan (%s): %s", cause, newt_errmsg());
        cJSON *ev = cJSON_CreateObject();
        cJSON_AddStringToObject(ev, "type", "waiting");
        cJSON_AddStringToObject(ev, "why", newt_errmsg());
        post_event(c, ev);
        c->waiting_logged = 1;
      }
      r = NEWT_OK;
    }
  } else if (c->plan_mono && !c->recorded) {
    record_recovery(c);
  }
  free(exclude);
  return r;
}

/* --- leadership and the main loop --------------------------------------------------------- */

static void on_leadership(void *ud, int leading, const char *why) {
  coord *c = ud;
  NEWT_INFO(COORD, "%s %s leadership: %s", c->id, leading ? "gained" : "lost", why ? why : "");
}

static newt_result_t lead(coord *c) {
  NEWT_INFO(COORD, "%s leads job %s", c->id, c->o->job);
  metrics_set(c->metrics, "newt_is_leader", 1);
  cJSON *ev = cJSON_CreateObject();
  cJSON_AddStringToObject(ev, "type", "leader");
  post_event(c, ev);
  c->plan_mono = newt_now_ns();
  c->recorded = 1; /* a predecessor's generation: its recovery is its own */
  c->t_trigger = 0;
  NEWT_CHECK(start_picture(c));
  pthread_mutex_lock(&c->mu);
  if (c->plan.generation) {
    /* a generation a predecessor planned: record its recovery only if it is not complete
       yet (then the predecessor could not have recorded it) */
    int acked = 0;
    for (int k = 0; k < c->plan.nranks; k++)
      for (int a = 0; a < c->nacks; a++) acked += strcmp(c->acks[a].id, c->plan.ranks[k].worker) == 0;
    snprintf(c->cause, sizeof c->cause, "%s", c->plan.cause);
    c->recorded = acked == c->plan.nranks;
    c->t_published = c->plan.created_ms;
    c->t_detect = c->t_published;
    c->t_trigger = c->t_published;
    c->lost_from = c->max_step_seen;
  }
  pthread_mutex_unlock(&c->mu);
  newt_result_t r = NEWT_OK;
  while (r == NEWT_OK) {
    if (newt_stop_requested()) break;
    if (!rdzv_candidate_is_leader(c->cand)) {
      r = NEWT_ERR(NEWT_ERR_CONFLICT, "%s lost leadership", c->id);
      break;
    }
    pthread_mutex_lock(&c->mu);
    int done = c->done;
    pthread_mutex_unlock(&c->mu);
    if (done) {
      if (c->plan_mono && !c->recorded) record_recovery(c);
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "type", "done");
      pthread_mutex_lock(&c->mu);
      newt_json_add_int(e, "step", c->prog_step);
      cJSON_AddNumberToObject(e, "loss", c->prog_loss);
      pthread_mutex_unlock(&c->mu);
      post_event(c, e);
      NEWT_INFO(COORD, "job %s is done", c->o->job);
      break;
    }
    r = decide(c);
    newt_sleep_ms(newt_param_CoordTickMs());
  }
  rdzv_etcd_watch_free(c->watch);
  c->watch = NULL;
  metrics_set(c->metrics, "newt_is_leader", 0);
  return r;
}

static int job_done(coord *c) {
  char key[256];
  rdzv_etcd_kv kv;
  if (rdzv_key(key, sizeof key, c->o->job, "done") != NEWT_OK) return 0;
  if (rdzv_etcd_get(c->etcd, key, call_deadline(), &kv, NULL) != NEWT_OK) return 0;
  rdzv_etcd_kv_free(&kv);
  return 1;
}

static newt_result_t define_metrics(coord *c) {
  static const struct {
    const char *name;
    metrics_kind kind;
    const char *help;
  } defs[] = {
      {"newt_is_leader", METRICS_GAUGE, "1 when this coordinator leads the job"},
      {"newt_generation", METRICS_GAUGE, "generation of the current plan"},
      {"newt_world_size", METRICS_GAUGE, "ranks in the current plan"},
      {"newt_workers", METRICS_GAUGE, "registered workers"},
      {"newt_step", METRICS_GAUGE, "newest completed step"},
      {"newt_loss", METRICS_GAUGE, "loss of the newest step"},
      {"newt_tokens_per_second", METRICS_GAUGE, "training throughput"},
      {"newt_recoveries_total", METRICS_COUNTER, "recoveries since this coordinator started leading"},
      {"newt_last_recovery_ms", METRICS_GAUGE, "detection to first step of the last recovery"},
  };
  for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++)
    NEWT_CHECK(metrics_define(c->metrics, defs[i].name, defs[i].kind, defs[i].help));
  return NEWT_OK;
}

newt_result_t coordinator_run(const coordinator_opts *o) {
  coord *c = calloc(1, sizeof *c);
  NEWT_CHECK_ALLOC(c);
  c->o = o;
  pthread_mutex_init(&c->mu, NULL);
  newt_result_t r = rdzv_check_name("job", o->job);
  if (o->id && *o->id) snprintf(c->id, sizeof c->id, "%s", o->id);
  else snprintf(c->id, sizeof c->id, "coordinator-%.32s-%d", newt_hostname(), (int)getpid());
  newt_log_set_name(c->id);
  if (r == NEWT_OK) r = rdzv_key(c->prefix, sizeof c->prefix, o->job, "");
  if (r == NEWT_OK) r = rdzv_etcd_init(&o->etcd, &c->etcd);
  if (r == NEWT_OK && o->spec_file) r = coordinator_put_spec(c->etcd, o->job, o->spec_file);
  char *spec = NULL;
  newt_deadline_t d = newt_deadline_in_ms(60000);
  while (r == NEWT_OK) {
    r = rdzv_spec_get(c->etcd, o->job, call_deadline(), &spec);
    if (r != NEWT_ERR_NOTFOUND) break;
    if (newt_deadline_passed(d) || newt_stop_requested()) {
      r = NEWT_ERR(NEWT_ERR_NOTFOUND, "job %s has no spec in etcd (give one with --spec FILE)", o->job);
      break;
    }
    r = NEWT_OK;
    newt_sleep_ms(200);
  }
  if (r == NEWT_OK) r = spec_from_json(spec, strlen(spec), &c->spec);
  free(spec);
  if (r == NEWT_OK && o->metrics_port > 0)
    r = metrics_start(o->metrics_addr ? o->metrics_addr : "0.0.0.0", o->metrics_port, &c->metrics);
  if (r == NEWT_OK && c->metrics) r = define_metrics(c);
  while (r == NEWT_OK && !newt_stop_requested()) {
    if (job_done(c)) break;
    rdzv_campaign_opts co = {.name = c->id, .ttl_s = (c->spec.lease_ttl_ms + 999) / 1000, .fn = on_leadership, .ud = c};
    r = rdzv_campaign(c->etcd, o->job, &co, call_deadline(), &c->cand);
    if (r == NEWT_ERR_UNAVAILABLE || r == NEWT_ERR_TIMEOUT) {
      /* etcd away: campaign again once it is back */
      NEWT_WARN(COORD, "campaigning: %s", newt_errmsg());
      newt_sleep_ms(200);
      r = NEWT_OK;
      continue;
    }
    if (r != NEWT_OK) break;
    newt_result_t w;
    do {
      w = rdzv_candidate_wait(c->cand, newt_deadline_in_ms(500));
      if (w == NEWT_ERR_TIMEOUT && (newt_stop_requested() || job_done(c))) break;
    } while (w == NEWT_ERR_TIMEOUT);
    if (w == NEWT_OK) {
      newt_result_t l = lead(c);
      if (l != NEWT_OK && l != NEWT_ERR_CONFLICT) r = l;
      else if (l == NEWT_ERR_CONFLICT) NEWT_WARN(COORD, "%s", newt_errmsg());
    } else if (w != NEWT_ERR_TIMEOUT && w != NEWT_ERR_CONFLICT) {
      r = w;
    }
    /* leaving the election (done, stopped, or leadership lost): revoke the candidacy so
       that a stale key of ours never stands in front of the next leader */
    rdzv_candidate_resign(c->cand, newt_deadline_in_ms(1000));
    rdzv_candidate_free(c->cand);
    c->cand = NULL;
    if (newt_stop_requested() || job_done(c) || r != NEWT_OK) break;
  }
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", newt_errmsg());
  metrics_stop(c->metrics);
  plan_free(&c->plan);
  free(c->members);
  free(c->reports);
  free(c->acks);
  free(c->departed);
  rdzv_etcd_free(c->etcd);
  pthread_mutex_destroy(&c->mu);
  free(c);
  return r == NEWT_OK ? NEWT_OK : NEWT_ERR(r, "%s", msg);
}
