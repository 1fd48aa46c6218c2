/* The coordinator (see coordinator.h, docs/elastic.md).
 *
 * A leader keeps a picture of the job built from one consistent read of /newt/<job>/ and
 * a watch from the revision after it: members (workers/), the plan, the failure reports
 * and acks of the current generation (each rank's ack rides in its registration; a key
 * acks/<gen>/<id> of the previous release counts too), progress and the end marker. The watch thread only
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
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/param.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "common/metrics.h"
#include "coordinator/policy.h"
#include "job/plan.h"
#include "job/records.h"
#include "job/runlog.h"
#include "job/spec.h"
#include "job/store.h"
#include "rendezvous/rdzv.h"

NEWT_PARAM(StartWindowMs, "NEWT_START_WINDOW_MS", 1000)
NEWT_PARAM(CoordTickMs, "NEWT_COORD_TICK_MS", 5)
NEWT_PARAM(KeepEvents, "NEWT_KEEP_EVENTS", 1000)
NEWT_PARAM(SpecCheckMs, "NEWT_SPEC_CHECK_MS", 5000)

/* Metric groups: the job's metrics are the leader's only (a standby hides them). */
enum { GROUP_PROCESS = 0, GROUP_JOB = 1 };

/* An acknowledgement of the current generation, by whom. */
typedef struct c_ack {
  char id[RDZV_NAME_MAX];
  job_ack a;
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
  job_worker *members;
  int nmembers, cap_members;
  newt_plan plan; /* generation 0: none */
  job_report *reports;
  int nreports;
  c_ack *acks;
  int nacks;
  int64_t prog_step;
  int64_t prog_committed; /* the newest step every rank completed, by the progress record */
  double prog_loss, prog_tps;
  uint64_t prog_change; /* monotonic ns of the last step change (or the plan, if later) */
  uint64_t stall_from;  /* monotonic ns the progress bound counts from: the newest step change,
                           this leader's start or etcd's return (a plan does not reset it) */
  int done;
  uint64_t last_join;   /* monotonic ns of the last registration we had not seen */
  uint64_t join_seen_ms; /* wall ms of the first registration the plan does not take in, since
                            the plan (a join's recovery starts there) */
  uint64_t join_checked_join, join_checked_gen; /* join_grows_layout said no for these */
  job_event spare_ev;   /* ... and said why, to be posted (spare_ev.type == JOB_EV_SPARE) */
  int event_log_fd;     /* coordinator_opts.event_log (-1: none) */
  uint64_t first_member; /* monotonic ns the first worker was seen (the first plan) */
  uint64_t first_report; /* monotonic ns of the first report of this generation (0: none) */
  uint64_t first_gone;   /* monotonic ns a rank of this generation was first missing (0: none) */
  int said_alive;        /* this generation's vanished ranks were said alive (say_alive_locked) */
  int64_t max_step_seen; /* newest committed step any rank of this generation said (progress, reports) */
  char (*departed)[RDZV_NAME_MAX]; /* left gracefully since the plan (their key is gone) */
  int ndeparted;
  struct held {
    char id[RDZV_NAME_MAX];
    uint64_t until; /* monotonic ns */
    int strikes;
    uint64_t gen;   /* the generation it could not be in */
    int64_t links_gen; /* its newest links record: of this later generation (0: none) ... */
    int links_ok;      /* ... all of whose ranks answered (put_links): the hold ends at once;
                          else it lasts while they do not, past until */
    int build;         /* a build could not take it in: its links answering proves nothing (a
                          worker without the job's key has working links), only their coming
                          back after a cut does: the hold ends early only after saw_cut */
    int saw_cut;       /* it said it did not reach a later plan's ranks */
    int said_kept;     /* logged that it is kept out past until */
  } *held;                         /* workers a generation could not take in: kept out a while */
  int nheld;
  char (*held_ids)[RDZV_NAME_MAX]; /* those still held, for the policy */
  int nheld_ids;

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
  char waiting_why[JOB_TEXT_MAX / 2]; /* why the last replan found no layout (waiting_logged) */
  uint64_t outages_seen; /* rdzv_etcd_outages_ended when last looked at */
  uint64_t outage_end;   /* monotonic ns etcd last came back (0: never) */
  uint64_t last_warn;    /* monotonic ns of the last rate-limited warning */
  char last_warn_msg[256];
  uint64_t alarms_checked; /* monotonic ns etcd's alarms were last read */
  uint64_t nospace_since;  /* wall ms etcd was first seen out of space (0: it is not) */

  /* the failure budget: wall ms of the plans made for a crash or hang, newest last */
  uint64_t fails[256];
  int nfails;
  int failed; /* this leader gave up on the job */

  /* spec changes: the file given (re-read every NEWT_SPEC_CHECK_MS), and one in etcd that
     the watch saw (taken by the main thread at the next tick) */
  char *spec_file_text;
  uint64_t spec_file_checked;
  newt_spec spec_next; /* guarded by mu */
  int spec_changed;    /* guarded by mu */
  int plan_foreign;    /* guarded by mu: the stored plan is one we would not take (forged, corrupt) */

  int64_t steps_counted;     /* the step newt_steps_total has counted up to */
  _Atomic uint64_t tick;     /* monotonic ns the main loop last went round (/healthz) */
} coord;

/* --- the spec ------------------------------------------------------------------------------ */

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
    newt_spec old;
    const rdzv_etcd_kv *kv = &tr.results[0].range.kvs[0];
    r = spec_from_json(kv->value, kv->value_len, &old);
    char what[512] = "";
    if (r == NEWT_OK && memcmp(&old, &s, sizeof s) != 0) {
      if (!spec_update_allowed(&old, &s, what, sizeof what)) {
        r = newt_err_wrap(NEWT_ERR_CONFLICT, "%s: ", file);
      } else {
        /* only over the spec we compared with: a concurrent change is not overwritten */
        rdzv_etcd_cmp same = {.key = key, .target = RDZV_CMP_MOD, .result = RDZV_CMP_EQUAL, .number = kv->mod_revision};
        rdzv_etcd_txn_result tr2;
        memset(&tr2, 0, sizeof tr2);
        r = rdzv_etcd_txn(c, &same, 1, &put, 1, NULL, 0, job_call_deadline(), &tr2);
        if (r == NEWT_OK && !tr2.succeeded)
          r = NEWT_ERR(NEWT_ERR_UNAVAILABLE, "%s: the spec in etcd changed meanwhile; trying again", file);
        rdzv_etcd_txn_result_free(&tr2);
        if (r == NEWT_OK && changed && cap) snprintf(changed, cap, "%s", what);
      }
    }
  }
  free(norm);
  rdzv_etcd_txn_result_free(&tr);
  return r;
}

/* --- the picture (watch thread and snapshot) ---------------------------------------------- */

static int find_member(const coord *c, const char *id) {
  for (int i = 0; i < c->nmembers; i++)
    if (strcmp(c->members[i].id, id) == 0) return i;
  return -1;
}

static void put_ack(coord *c, const rdzv_etcd_kv *kv, const char *id, const char *text, size_t len);

static void put_member(coord *c, const rdzv_etcd_kv *kv, const char *id) {
  job_worker w;
  if (job_worker_from_json(kv->value, kv->value_len, kv->key, &w) != NEWT_OK) {
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
      job_worker *m = realloc(c->members, (size_t)cap * sizeof *m);
      if (!m) return;
      c->members = m;
      c->cap_members = cap;
    }
    i = c->nmembers++;
    if (!c->plan.generation || !plan_find(&c->plan, id)) {
      c->last_join = newt_now_ns();
      if (!c->join_seen_ms) c->join_seen_ms = newt_wall_ms();
    }
    NEWT_INFO(COORD, "worker %s joined (host %s%s%s, %s)", id, w.host, strcmp(w.domain, w.host) ? ", failure domain " : "",
              strcmp(w.domain, w.host) ? w.domain : "", w.addr);
  }
  c->members[i] = w;
  /* the acknowledgement of the current generation, folded into the registration */
  if (w.ack[0] && c->plan.generation && (uint64_t)w.generation == c->plan.generation)
    put_ack(c, kv, id, w.ack, strlen(w.ack));
}

static void drop_member(coord *c, const char *id) {
  int i = find_member(c, id);
  if (i < 0) return;
  NEWT_INFO(COORD, "worker %s left (%s)", id, policy_member_leaving(&c->members[i]) ? "gracefully" : "registration gone");
  if (policy_member_leaving(&c->members[i])) {
    /* remember it: its "left" and its deletion may arrive together */
    char (*d)[RDZV_NAME_MAX] = realloc(c->departed, (size_t)(c->ndeparted + 1) * sizeof *d);
    if (d) {
      c->departed = d;
      snprintf(c->departed[c->ndeparted++], RDZV_NAME_MAX, "%s", id);
    }
  }
  c->members[i] = c->members[--c->nmembers];
}

/* Whether a report or ack under key kv comes from a rank of the current plan, registered
 * now and written on its own lease: what anyone else writes there counts for nothing. */
static int from_live_rank(coord *c, const rdzv_etcd_kv *kv, const char *id) {
  int i = find_member(c, id);
  if (i < 0 || !plan_find(&c->plan, id) || kv->lease != c->members[i].lease) {
    NEWT_WARN(COORD, "ignoring %s: not written by a registered rank of generation %llu on its lease", kv->key,
              (unsigned long long)c->plan.generation);
    return 0;
  }
  return 1;
}

static void put_report(coord *c, const rdzv_etcd_kv *kv, const char *id) {
  job_report rep;
  if (job_report_from_json(kv->value, kv->value_len, &rep) != NEWT_OK) {
    NEWT_WARN(COORD, "ignoring %s: %s", kv->key, newt_errmsg());
    return;
  }
  if (strcmp(rep.worker, id) != 0) {
    NEWT_WARN(COORD, "ignoring %s: it is signed by worker %s", kv->key, rep.worker);
    return;
  }
  if (!from_live_rank(c, kv, id)) return;
  /* the coordinator's clock orders reports and times the detection: a worker's clock (or
     a forger's) does not get into the recovery's timings */
  rep.t_ms = newt_wall_ms();
  rep.revision = kv->mod_revision; /* a worker registered after it is not judged by it */
  for (int i = 0; i < c->nreports; i++)
    if (strcmp(c->reports[i].worker, id) == 0) {
      c->reports[i] = rep;
      return;
    }
  job_report *r = realloc(c->reports, (size_t)(c->nreports + 1) * sizeof *r);
  if (!r) return;
  c->reports = r;
  c->reports[c->nreports++] = rep;
  if (!c->first_report) c->first_report = newt_now_ns();
  if (rep.step > c->max_step_seen) c->max_step_seen = rep.step;
}

/* An acknowledgement of the current generation by worker id: text is the ack, under key kv
 * (acks/<gen>/<id>, the previous release's own key, or workers/<id>, the registration that
 * carries it). */
static void put_ack(coord *c, const rdzv_etcd_kv *kv, const char *id, const char *text, size_t len) {
  c_ack a;
  memset(&a, 0, sizeof a);
  if (job_ack_from_json(text, len, &a.a) != NEWT_OK) {
    NEWT_WARN(COORD, "ignoring %s: %s", kv->key, newt_errmsg());
    return;
  }
  if (!from_live_rank(c, kv, id)) return;
  /* a rank's phases happened between the plan and the ack's arrival, by our clock */
  uint64_t now = newt_wall_ms(), from = c->plan.created_ms;
  uint64_t *t[] = {&a.a.t_plan, &a.a.t_comm, &a.a.t_restore, &a.a.t_step};
  for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
    if (*t[k] > now) *t[k] = now;
    if (*t[k] < from) *t[k] = from;
  }
  snprintf(a.id, sizeof a.id, "%s", id);
  for (int i = 0; i < c->nacks; i++)
    if (strcmp(c->acks[i].id, id) == 0) return;
  c_ack *n = realloc(c->acks, (size_t)(c->nacks + 1) * sizeof *n);
  if (!n) return;
  c->acks = n;
  c->acks[c->nacks++] = a;
}

static void put_progress(coord *c, const rdzv_etcd_kv *kv) {
  job_progress pr;
  if (job_progress_from_json(kv->value, kv->value_len, &pr) != NEWT_OK) {
    NEWT_WARN(COORD, "ignoring %s: %s", kv->key, newt_errmsg());
    return;
  }
  int64_t step = pr.step;
  c->prog_loss = pr.loss;
  c->prog_tps = pr.tokens_per_s;
  if (step != c->prog_step) c->prog_change = c->stall_from = newt_now_ns();
  c->prog_step = step;
  /* a recovery loses the committed steps it goes back behind; the step rank 0 finished
     first is not one while another rank may still lack it */
  c->prog_committed = pr.committed >= 0 ? pr.committed : step;
  if (c->prog_committed > c->max_step_seen) c->max_step_seen = c->prog_committed;
  if (step > c->steps_counted) { /* a step rolled back and done again counts once */
    metrics_add(c->metrics, "newt_steps_total", (double)(step - c->steps_counted));
    metrics_add(c->metrics, "newt_tokens_total", (double)(step - c->steps_counted) * (double)pr.step_tokens);
    c->steps_counted = step;
  }
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
  c->said_alive = 0;
  c->max_step_seen = c->prog_committed;
}

/* A plan in etcd newer than ours (the leader's, seen by a standby; or forged): taken when it
 * agrees with the spec and is no jump far past ours. One that is not is ignored and, when
 * this coordinator leads, put right by restore_records (our plan published again). */
static void take_plan_locked(coord *c, const rdzv_etcd_kv *kv) {
  newt_plan p;
  if (plan_from_json(kv->value, kv->value_len, &p) != NEWT_OK) {
    NEWT_WARN(COORD, "the stored plan is not valid: %s", newt_errmsg());
    c->plan_foreign = 1;
    return;
  }
  if (p.generation <= c->plan.generation) {
    plan_free(&p);
    return;
  }
  if (plan_check_spec(&p, &c->spec) != NEWT_OK || plan_check_jump(c->plan.generation, p.generation) != NEWT_OK) {
    NEWT_WARN(COORD, "ignoring the stored plan: %s", newt_errmsg());
    c->plan_foreign = 1;
    plan_free(&p);
    return;
  }
  set_plan_locked(c, &p);
}

/* A spec in etcd other than ours (a coordinator stored a changed one): kept for the main
 * thread when a running job may take it, refused (logged) otherwise. Called with mu held. */
static void take_spec_locked(coord *c, const rdzv_etcd_kv *kv) {
  newt_spec s;
  if (spec_from_json(kv->value, kv->value_len, &s) != NEWT_OK) {
    NEWT_WARN(COORD, "ignoring the spec in etcd: %s", newt_errmsg());
    return;
  }
  if (memcmp(&s, &c->spec, sizeof s) == 0) return;
  if (!spec_update_allowed(&c->spec, &s, NULL, 0)) {
    NEWT_ERROR(COORD, "ignoring the spec in etcd: %s", newt_errmsg());
    return;
  }
  c->spec_next = s;
  c->spec_changed = 1;
}

static void put_links(coord *c, const rdzv_etcd_kv *kv, const char *id, int deleted);

/* One key of the job changed (value NULL: deleted). Called with mu held. */
static void apply_kv(coord *c, const rdzv_etcd_kv *kv, int deleted) {
  size_t plen = strlen(c->prefix);
  if (kv->key_len <= plen || strncmp(kv->key, c->prefix, plen) != 0) return;
  const char *id = NULL;
  uint64_t gen = 0;
  switch (job_key_parse(kv->key + plen, &gen, &id)) {
  case JOB_REC_WORKER:
    if (deleted) drop_member(c, id);
    else put_member(c, kv, id);
    break;
  case JOB_REC_REPORT:
    if (!deleted && gen == c->plan.generation) put_report(c, kv, id);
    break;
  case JOB_REC_ACK:
    if (!deleted && gen == c->plan.generation) put_ack(c, kv, id, kv->value, kv->value_len);
    break;
  case JOB_REC_PROGRESS:
    if (!deleted) put_progress(c, kv);
    break;
  case JOB_REC_LINKS:
    put_links(c, kv, id, deleted);
    break;
  case JOB_REC_DONE: {
    job_done d;
    if (deleted) break;
    if (job_done_from_json(kv->value, kv->value_len, &d) != NEWT_OK)
      NEWT_WARN(COORD, "ignoring %s: %s", kv->key, newt_errmsg());
    else if (!job_done_plausible(&d, &c->spec))
      NEWT_WARN(COORD, "ignoring %s: it says step %lld of %lld", kv->key, (long long)d.step, (long long)c->spec.steps);
    else
      c->done = 1;
    break;
  }
  case JOB_REC_PLAN:
    if (!deleted) take_plan_locked(c, kv);
    break;
  case JOB_REC_SPEC:
    if (!deleted) take_spec_locked(c, kv);
    break;
  case JOB_REC_CKPT: {
    job_ckpt ck;
    if (!deleted && job_ckpt_from_json(kv->value, kv->value_len, &ck) == NEWT_OK) {
      metrics_set(c->metrics, "newt_checkpoint_last_step", (double)ck.step);
      if (ck.bytes > 0) metrics_set(c->metrics, "newt_checkpoint_bytes", (double)ck.bytes);
      if (ck.save_ms > 0) metrics_observe(c->metrics, "newt_checkpoint_save_duration_seconds", NULL, (double)ck.save_ms / 1e3);
      if (ck.stall_ms > 0) metrics_observe(c->metrics, "newt_checkpoint_stall_seconds", NULL, ck.stall_ms / 1e3);
    }
    break;
  }
  default:
    break;
  }
}

static void reset_picture_locked(coord *c) {
  c->nmembers = 0;
  c->nreports = 0;
  c->nacks = 0;
  c->first_report = 0;
}

/* Sorting keys so that the plan is read before the registrations, and both before the
 * reports and acks of its generation (which count only from its registered ranks). */
static int kv_rank(const coord *c, const rdzv_etcd_kv *kv) {
  job_record rec = job_key_parse(kv->key + strlen(c->prefix), NULL, NULL);
  return rec == JOB_REC_PLAN ? 0 : rec == JOB_REC_PROGRESS ? 1 : rec == JOB_REC_WORKER ? 2 : 3;
}

static void apply_snapshot_locked(coord *c, const rdzv_etcd_kv *kvs, size_t n) {
  reset_picture_locked(c);
  for (int pass = 0; pass < 4; pass++)
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
  NEWT_CHECK(rdzv_etcd_range(c->etcd, c->prefix, &ro, job_call_deadline(), &all));
  pthread_mutex_lock(&c->mu);
  apply_snapshot_locked(c, all.kvs, all.n);
  c->prog_change = newt_now_ns();
  pthread_mutex_unlock(&c->mu);
  rdzv_etcd_watch_opts wo = {.prefix = 1, .start_revision = all.revision + 1, .progress_notify = 1};
  rdzv_etcd_kvs_free(&all);
  return rdzv_etcd_watch_start(c->etcd, c->prefix, &wo, on_watch, c, job_call_deadline(), &c->watch);
}

/* A warning that repeats every tick while etcd is away or full: logged when it changes,
 * and at most every 10 s otherwise. */
static void warn_limited(coord *c, const char *what, const char *msg) {
  uint64_t now = newt_now_ns();
  if (strncmp(c->last_warn_msg, msg, sizeof c->last_warn_msg - 1) == 0 && now - c->last_warn < 10000000000ull) return;
  c->last_warn = now;
  snprintf(c->last_warn_msg, sizeof c->last_warn_msg, "%s", msg);
  NEWT_WARN(COORD, "%s: %s: %s (trying again)", c->id, what, msg);
}

/* --- decisions (main thread) ----------------------------------------------------------------- */

/* Posts an event of this coordinator, stamped now. */
static void post_event(coord *c, job_event *ev) {
  ev->t_ms = newt_wall_ms();
  snprintf(ev->coordinator, sizeof ev->coordinator, "%s", c->id);
  if (c->event_log_fd >= 0 && job_eventlog_append(c->event_log_fd, ev) != NEWT_OK)
    warn_limited(c, "writing the event log", newt_errmsg());
  char *text = job_event_to_json(ev);
  if (text && job_event_post(c->etcd, c->o->job, text, job_call_deadline()) != NEWT_OK)
    warn_limited(c, "posting an event", newt_errmsg());
  free(text);
}

/* Whether the members not in the plan would make a larger one: the plan they would get
 * (placement included: tensor-parallel groups never span hosts) against the current.
 * Leavers, donors and finishers count for nothing. Called with mu held (from the policy);
 * the answer is kept until the membership or the plan changes. */
static int join_grows_layout(void *ud);
static void spare_event_locked(coord *c, const plan_member *m, int n, const char *why);

/* The picture as the policy sees it. Called with mu held; valid while it is held. */
static policy_view view_locked(coord *c) {
  uint64_t prog = c->prog_change > c->plan_mono ? c->prog_change : c->plan_mono;
  return (policy_view){.spec = &c->spec,
                       .plan = &c->plan,
                       .members = c->members,
                       .nmembers = c->nmembers,
                       .reports = c->reports,
                       .nreports = c->nreports,
                       .departed = c->departed,
                       .ndeparted = c->ndeparted,
                       .held_out = c->held_ids,
                       .nheld_out = c->nheld_ids,
                       .now = newt_now_ns(),
                       .first_member = c->first_member,
                       .last_join = c->last_join,
                       .first_report = c->first_report,
                       .first_gone = c->first_gone,
                       .last_progress = prog,
                       .steps_done = c->prog_step,
                       .outage_end = c->outage_end,
                       .join_window_ms = c->spec.join_window_ms,
                       .start_window_ms = newt_param_StartWindowMs(),
                       .join_grows = join_grows_layout,
                       .ud = c};
}

static int join_grows_layout(void *ud) {
  coord *c = ud;
  if (c->join_checked_join == c->last_join && c->join_checked_gen == c->plan.generation) return 0;
  plan_member *m = calloc((size_t)(c->nmembers ? c->nmembers : 1), sizeof *m);
  if (!m) return 0;
  policy_view v = view_locked(c);
  int n = policy_plan_members(&v, NULL, 0, m), unplanned = 0;
  for (int i = 0; i < n; i++) unplanned += m[i].prev_rank < 0;
  newt_plan trial = {0};
  int planned = unplanned && plan_compute(&c->spec, m, n, c->plan.generation, &trial) == NEWT_OK;
  int grows = planned && trial.dp * trial.pp > c->plan.dp * c->plan.pp;
  if (!grows) c->join_checked_join = c->last_join, c->join_checked_gen = c->plan.generation;
  if (!grows && unplanned) spare_event_locked(c, m, n, planned ? trial.spare_why : newt_errmsg());
  plan_free(&trial);
  free(m);
  return grows;
}

/* Workers that joined and stay spares (the layout is no larger with them): an event naming
 * them and why, for `newt run`, `newt status` and the report; posted by decide, outside the
 * lock. Called with mu held. */
static void spare_event_locked(coord *c, const plan_member *m, int n, const char *why) {
  job_event *e = &c->spare_ev;
  job_event_free(e);
  memset(e, 0, sizeof *e);
  e->spare_ids = calloc((size_t)(n ? n : 1), sizeof *e->spare_ids);
  if (!e->spare_ids) return;
  for (int i = 0; i < n; i++) /* the plan's own spares were named with it */
    if (m[i].prev_rank < 0 && !plan_is_spare(&c->plan, m[i].id))
      snprintf(e->spare_ids[e->nspare_ids++], RDZV_NAME_MAX, "%s", m[i].id);
  if (!e->nspare_ids) return;
  e->type = JOB_EV_SPARE;
  e->generation = (int64_t)c->plan.generation;
  snprintf(e->why, sizeof e->why, "%s", why);
}

/* --- the failure budget -------------------------------------------------------------------- */

/* Recoveries from these causes spend the budget; a leave, a join, a lost coordinator or an
 * etcd outage are the job's normal life. */
static int is_failure(const char *cause) { return strcmp(cause, "crash") == 0 || strcmp(cause, "hang") == 0; }

static int failures_in_window(coord *c, uint64_t now) {
  int n = 0;
  for (int i = 0; i < c->nfails; i++) n += c->fails[i] + (uint64_t)c->spec.failure_window_ms > now;
  return n;
}

static void count_failure(coord *c, uint64_t t_ms) {
  if (c->nfails == (int)(sizeof c->fails / sizeof c->fails[0])) {
    memmove(c->fails, c->fails + 1, sizeof c->fails - sizeof c->fails[0]);
    c->nfails--;
  }
  c->fails[c->nfails++] = t_ms;
  metrics_set(c->metrics, "newt_failure_budget_used", failures_in_window(c, newt_wall_ms()));
}

/* The failures a predecessor planned for, from the job's events (a new leader goes on
 * counting where the last one was). */
static void recount_failures(coord *c) {
  char prefix[256];
  c->nfails = 0;
  if (job_prefix(prefix, sizeof prefix, c->o->job, JOB_REC_EVENT, -1) != NEWT_OK) return;
  rdzv_etcd_range_opts ro = {.prefix = 1, .sort = RDZV_SORT_KEY_ASCEND};
  rdzv_etcd_kvs evs;
  if (rdzv_etcd_range(c->etcd, prefix, &ro, job_call_deadline(), &evs) != NEWT_OK) return;
  uint64_t now = newt_wall_ms();
  for (size_t i = 0; i < evs.n; i++) {
    job_event e;
    if (job_event_from_json(evs.kvs[i].value, evs.kvs[i].value_len, &e) != NEWT_OK) continue;
    if (e.type == JOB_EV_PLAN && is_failure(e.cause) && e.t_ms + (uint64_t)c->spec.failure_window_ms > now)
      count_failure(c, e.t_ms);
    job_event_free(&e);
  }
  rdzv_etcd_kvs_free(&evs);
}

/* Gives up on the job: the failed record (guarded by leadership), an event, the log, and
 * this process's end. Workers and the other coordinators see the record and end too. */
static void fail_job(coord *c, const char *why) {
  job_failed f = {.t_ms = newt_wall_ms()};
  snprintf(f.why, sizeof f.why, "%s", why);
  snprintf(f.coordinator, sizeof f.coordinator, "%s", c->id);
  char *val = job_failed_to_json(&f), key[256];
  if (val && job_key(key, sizeof key, c->o->job, JOB_REC_FAILED, 0, NULL) == NEWT_OK &&
      rdzv_guarded_put(c->cand, key, val, strlen(val), job_call_deadline(), NULL) != NEWT_OK)
    NEWT_WARN(COORD, "%s: writing %s: %s", c->id, key, newt_errmsg());
  free(val);
  job_event ev = {.type = JOB_EV_FAILED};
  snprintf(ev.why, sizeof ev.why, "%s", why);
  post_event(c, &ev);
  NEWT_ERROR(COORD, "job %s failed: %s", c->o->job, why);
  metrics_set(c->metrics, "newt_job_failed", 1);
  c->failed = 1;
  if (c->o->end) {
    c->o->end->status = JOB_EXIT_FAILED;
    snprintf(c->o->end->msg, sizeof c->o->end->msg, "failed: %s", why);
  }
}

/* Whether planning for one more failure would overspend the budget; if so, fails the job. */
static int budget_spent(coord *c, const char *cause) {
  if (!is_failure(cause) || c->spec.max_failures <= 0) return 0;
  uint64_t now = newt_wall_ms();
  int n = failures_in_window(c, now) + 1;
  if (n <= c->spec.max_failures) return 0;
  char why[JOB_TEXT_MAX], d[32];
  snprintf(why, sizeof why,
           "failure budget spent: %d recoveries from a crash or hang within %s (spec.fault.max_failures %lld, "
           "failure_window_ms %lld), the last a %s at step %lld; the job cannot make progress",
           n, newt_fmt_duration((double)c->spec.failure_window_ms / 1e3, d, sizeof d), (long long)c->spec.max_failures,
           (long long)c->spec.failure_window_ms, cause, (long long)c->prog_step);
  fail_job(c, why);
  return 1;
}

/* The progress bound (spec.fault.progress_timeout_ms): once the job has a plan, no step
 * completed for that long -- counted from the newest step, this leader's start and etcd's
 * return, not reset by a plan (generations that never form are no progress) -- fails the
 * job, naming what it waited for. Before the job's first step the bound is at least the
 * first step's own deadline. Returns 1 when it failed the job. */
static int past_progress_bound(coord *c) {
  int64_t bound = c->spec.progress_timeout_ms;
  pthread_mutex_lock(&c->mu);
  uint64_t from = c->stall_from, gen = c->plan.generation;
  int64_t step = c->prog_step;
  int waiting = c->waiting_logged;
  char why[sizeof c->waiting_why];
  snprintf(why, sizeof why, "%s", c->waiting_why);
  pthread_mutex_unlock(&c->mu);
  if (bound <= 0 || !gen || !from) return 0;
  if (step <= 0 && bound < c->spec.first_step_timeout_ms) bound = c->spec.first_step_timeout_ms;
  uint64_t now = newt_now_ns();
  if (now < from || now - from < (uint64_t)bound * 1000000ull) return 0;
  char msg[JOB_TEXT_MAX], d[32];
  snprintf(msg, sizeof msg,
           "no step completed for %s (spec.fault.progress_timeout_ms %lld) since step %lld (generation %llu in force%s%s): "
           "the job cannot make progress",
           newt_fmt_duration((double)(now - from) / 1e9, d, sizeof d), (long long)c->spec.progress_timeout_ms,
           (long long)step, (unsigned long long)gen, waiting ? "; the leader cannot plan: " : "",
           waiting ? why : "");
  fail_job(c, msg);
  return 1;
}

/* Computes and publishes the next plan. *no_layout is set (and NEWT_ERR_UNAVAILABLE
 * returned) when no layout fits the live members; NEWT_ERR_CONFLICT when we no longer lead;
 * other errors are etcd's. The generation is above every one a member has taken up (after
 * etcd lost its data, the registrations remember what the plan key forgot). */
static newt_result_t replan(coord *c, const char *cause, const char *switch_mode, char (*exclude)[RDZV_NAME_MAX],
                            int nexclude, int *no_layout) {
  *no_layout = 0;
  pthread_mutex_lock(&c->mu);
  size_t room = (size_t)(c->nmembers ? c->nmembers : 1);
  plan_member *m = calloc(room, sizeof *m), *donors = calloc(room, sizeof *donors);
  if (!m || !donors) {
    pthread_mutex_unlock(&c->mu);
    free(m);
    free(donors);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory planning");
  }
  policy_view v = view_locked(c);
  int n = policy_plan_members(&v, exclude, nexclude, m);
  for (int i = 0; i < c->nmembers; i++) {
    const job_worker *w = &c->members[i], *o = policy_gpu_taken(&v, exclude, nexclude, w);
    if (o && !policy_member_leaving(w) && !policy_member_done(w))
      NEWT_WARN(COORD, "%s is on GPU %d of host %s, which %s uses: NCCL cannot run two ranks on one GPU, so %s "
                "waits for it (give each worker its own --device)", w->id, w->device, w->host, o->id, w->id);
  }
  int ndonors = policy_donors(&v, c->recorded, donors);
  uint64_t prev = c->plan.generation;
  for (int i = 0; i < c->nmembers; i++) { /* a registration's generation far past ours is forged: not taken */
    uint64_t g = c->members[i].generation > 0 ? (uint64_t)c->members[i].generation : 0;
    if (g > prev && plan_check_jump(c->plan.generation, g) == NEWT_OK) prev = g;
  }
  int64_t step = c->prog_step, lost_from = c->max_step_seen;
  uint64_t t_detect = 0;
  for (int i = 0; i < c->nreports; i++)
    if (!t_detect || c->reports[i].t_ms < t_detect) t_detect = c->reports[i].t_ms;
  pthread_mutex_unlock(&c->mu);

  newt_plan p = {0};
  newt_result_t r = plan_compute(&c->spec, m, n, prev, &p);
  *no_layout = r == NEWT_ERR_UNAVAILABLE;
  for (int i = 0; r == NEWT_OK && i < ndonors; i++) r = plan_add_donor(&p, donors[i].id, donors[i].host, donors[i].addr);
  free(donors);
  /* a rank of the last plan that this one makes a spare (the layout has no room for it)
     holds a state the ranks may need -- a ZeRO shard, its neighbour's copy of one -- so it
     takes part in the restore as a donor, then waits as a spare */
  for (int i = 0; r == NEWT_OK && i < n; i++)
    if (m[i].has_state && !plan_find(&p, m[i].id) && !plan_find_donor(&p, m[i].id))
      r = plan_add_donor(&p, m[i].id, m[i].host, m[i].addr);
  free(m);
  if (r != NEWT_OK) {
    plan_free(&p);
    return r;
  }
  snprintf(p.cause, sizeof p.cause, "%s", cause);
  snprintf(p.switch_mode, sizeof p.switch_mode, "%s", switch_mode);
  p.step = step;
  char *json = NULL;
  r = plan_check_publishable(&p, &json);
  if (r == NEWT_ERR_INVALID || r == NEWT_ERR_INTERNAL) { /* no later try mends it: end, do not spin */
    char why[JOB_TEXT_MAX];
    snprintf(why, sizeof why, "cannot publish a plan: %s", newt_errmsg());
    plan_free(&p);
    fail_job(c, why);
    return NEWT_OK;
  }
  if (r != NEWT_OK) {
    plan_free(&p);
    return r;
  }
  r = job_plan_publish(c->cand, c->o->job, (int64_t)p.generation, json, job_call_deadline());
  free(json);
  if (r != NEWT_OK) {
    plan_free(&p);
    return r;
  }
  uint64_t now = newt_wall_ms();
  NEWT_INFO(COORD, "published plan %llu (%s): %d ranks, dp %d, accum %lld, %d spares", (unsigned long long)p.generation,
            cause, p.nranks, p.dp, (long long)p.accum, p.nspares);
  job_event ev = {.type = JOB_EV_PLAN, .generation = (int64_t)p.generation, .world = p.nranks, .dp = p.dp,
                  .spares = p.nspares, .excluded = exclude, .nexcluded = nexclude,
                  .spare_ids = p.spares, .nspare_ids = p.nspares};
  snprintf(ev.why, sizeof ev.why, "%s", p.spare_why);
  snprintf(ev.cause, sizeof ev.cause, "%s", cause);

  pthread_mutex_lock(&c->mu);
  set_plan_locked(c, &p);
  c->prog_change = newt_now_ns();
  c->join_seen_ms = 0; /* whoever registered before this plan is in it, or its spare */
  pthread_mutex_unlock(&c->mu);

  c->plan_mono = newt_now_ns();
  c->recorded = 0;
  snprintf(c->cause, sizeof c->cause, "%s", cause);
  c->t_published = now;
  if (!c->t_trigger) c->t_trigger = now;
  c->t_detect = t_detect ? t_detect : c->t_trigger;
  c->lost_from = lost_from;
  c->waiting_logged = 0;
  metrics_set(c->metrics, "newt_generation", (double)c->plan.generation);
  metrics_set(c->metrics, "newt_world_size", (double)c->plan.nranks);
  metrics_set(c->metrics, "newt_data_parallel_size", (double)c->plan.dp);
  metrics_set(c->metrics, "newt_spares", (double)c->plan.nspares);
  if (is_failure(cause)) count_failure(c, now);
  post_event(c, &ev);
  return NEWT_OK;
}

/* Fences a member: deletes its registration by revoking its lease; a lease other members
 * are registered on too (their host's, job_register_on) is theirs as well: then only the
 * member's key goes (a guarded delete while it is on that lease), and the member, when it
 * writes again, finds it gone and registers anew, as one whose own lease was revoked. */
static void fence(coord *c, const char *id) {
  pthread_mutex_lock(&c->mu);
  int i = find_member(c, id), shared = 0;
  int64_t lease = i >= 0 ? c->members[i].lease : 0;
  for (int k = 0; k < c->nmembers && lease; k++) shared |= k != i && c->members[k].lease == lease;
  pthread_mutex_unlock(&c->mu);
  char key[256];
  newt_result_t r = NEWT_OK;
  if (lease && shared && (r = job_key(key, sizeof key, c->o->job, JOB_REC_WORKER, 0, id)) == NEWT_OK) {
    rdzv_etcd_cmp on = {.key = key, .target = RDZV_CMP_LEASE, .result = RDZV_CMP_EQUAL, .number = lease};
    rdzv_etcd_op del = {.type = RDZV_OP_DELETE, .key = key};
    r = rdzv_guarded_txn(c->cand, &on, 1, &del, 1, job_call_deadline(), NULL);
  } else if (lease && !shared) {
    r = rdzv_etcd_lease_revoke(c->etcd, lease, job_call_deadline());
  }
  if (r != NEWT_OK && newt_errcode() != NEWT_ERR_NOTFOUND) NEWT_WARN(COORD, "fencing %s: %s", id, newt_errmsg());
  /* out of the picture now, not when the watch brings the deletion: no plan (nor the
     question whether newcomers allow a larger one) may count it meanwhile */
  pthread_mutex_lock(&c->mu);
  drop_member(c, id);
  pthread_mutex_unlock(&c->mu);
  NEWT_INFO(COORD, "fenced %s", id);
  job_event ev = {.type = JOB_EV_FENCE};
  snprintf(ev.worker, sizeof ev.worker, "%s", id);
  post_event(c, &ev);
}

/* Keeps the job's keys bounded however long it runs: the reports and acks of generations
 * before the current one, and the events beyond the newest NEWT_KEEP_EVENTS. (etcd's own
 * history is compacted by etcd: the private etcd of `newt run` does it automatically; a
 * production etcd should run with --auto-compaction-retention.) Writes are guarded by
 * leadership; a failure is tried again at the next generation. */
static void housekeeping(coord *c, uint64_t gen) {
  if (gen > 1) {
    if (job_barrier_forget(c->cand, c->o->job, (int64_t)gen, job_call_deadline()) != NEWT_OK)
      NEWT_DEBUG(COORD, "forgetting old acks: %s", newt_errmsg());
    char from[256], to[256];
    if (job_key(from, sizeof from, c->o->job, JOB_REC_REPORT, 0, "x") == NEWT_OK &&
        job_key(to, sizeof to, c->o->job, JOB_REC_REPORT, gen, "x") == NEWT_OK) {
      *strrchr(from, '/') = '\0'; /* ".../reports/000..0" up to ".../reports/<gen>" */
      *strrchr(to, '/') = '\0';
      rdzv_etcd_op del = {.type = RDZV_OP_DELETE, .key = from, .range_end = to};
      if (rdzv_guarded_txn(c->cand, NULL, 0, &del, 1, job_call_deadline(), NULL) != NEWT_OK)
        NEWT_DEBUG(COORD, "forgetting old reports: %s", newt_errmsg());
    }
  }
  char prefix[256];
  int64_t keep = newt_param_KeepEvents();
  if (job_prefix(prefix, sizeof prefix, c->o->job, JOB_REC_EVENT, -1) != NEWT_OK) return;
  rdzv_etcd_range_opts ro = {.prefix = 1, .count_only = 1};
  rdzv_etcd_kvs cnt;
  if (rdzv_etcd_range(c->etcd, prefix, &ro, job_call_deadline(), &cnt) != NEWT_OK) return;
  int64_t extra = cnt.count - keep;
  rdzv_etcd_kvs_free(&cnt);
  if (extra <= 0) return;
  /* the key of the oldest event to keep: the events sort by time */
  rdzv_etcd_range_opts first = {.prefix = 1, .keys_only = 1, .limit = extra + 1, .sort = RDZV_SORT_KEY_ASCEND};
  rdzv_etcd_kvs old;
  if (rdzv_etcd_range(c->etcd, prefix, &first, job_call_deadline(), &old) != NEWT_OK) return;
  if (old.n == (size_t)extra + 1) {
    rdzv_etcd_op del = {.type = RDZV_OP_DELETE, .key = prefix, .range_end = old.kvs[extra].key};
    if (rdzv_guarded_txn(c->cand, NULL, 0, &del, 1, job_call_deadline(), NULL) != NEWT_OK)
      NEWT_DEBUG(COORD, "forgetting old events: %s", newt_errmsg());
  }
  rdzv_etcd_kvs_free(&old);
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
  /* the slowest rank's timings, the oldest state restored, the costliest source */
  job_event ev = {.type = strcmp(c->cause, "initial") == 0 ? JOB_EV_STARTED : JOB_EV_RECOVERED,
                  .generation = (int64_t)p->generation,
                  .world = p->nranks,
                  .restore_step = INT64_MAX,
                  .t_trigger = c->t_trigger,
                  .t_detect = c->t_detect,
                  .t_plan = c->t_published};
  snprintf(ev.restore, sizeof ev.restore, "memory");
  for (int k = 0; k < c->nacks; k++) {
    const job_ack *a = &c->acks[k].a;
    /* the plan was out once a rank saw it: the reply to our write can come after that */
    if (a->t_plan && a->t_plan < ev.t_plan) ev.t_plan = a->t_plan;
    if (a->t_comm > ev.t_comm) ev.t_comm = a->t_comm;
    if (a->t_restore > ev.t_restore) ev.t_restore = a->t_restore;
    if (a->t_step > ev.t_step) ev.t_step = a->t_step;
    if (a->restore_step < ev.restore_step) ev.restore_step = a->restore_step;
    if (job_restore_rank(a->restore) > job_restore_rank(ev.restore)) snprintf(ev.restore, sizeof ev.restore, "%s", a->restore);
  }
  pthread_mutex_unlock(&c->mu);
  c->recorded = 1;
  int64_t lost = c->lost_from - ev.restore_step;
  if (lost < 0 || ev.type == JOB_EV_STARTED) lost = 0;
  ev.steps_lost = lost;
  snprintf(ev.cause, sizeof ev.cause, "%s", c->cause);
  NEWT_INFO(COORD, "generation %llu (%s) complete: %lld ms from detection to its first step, %lld steps lost",
            (unsigned long long)ev.generation, c->cause, (long long)(ev.t_step - c->t_detect), (long long)lost);
  if (ev.type == JOB_EV_RECOVERED) {
    char labels[64];
    snprintf(labels, sizeof labels, "cause=\"%s\"", c->cause);
    metrics_add_l(c->metrics, "newt_recoveries_total", labels, 1);
    metrics_observe(c->metrics, "newt_recovery_duration_seconds", labels, (double)(ev.t_step - c->t_detect) / 1e3);
    metrics_add(c->metrics, "newt_steps_lost_total", (double)lost);
  }
  post_event(c, &ev);
  c->t_trigger = 0;
  housekeeping(c, (uint64_t)ev.generation);
}

/* Reads etcd's alarms every 5 s and says, once, when it ran out of space and when it has
 * space again: meanwhile etcd refuses every write (no plan, event or progress can land) and
 * training goes on on the data plane. */
static void check_alarms(coord *c) {
  uint64_t now = newt_now_ns();
  if (c->alarms_checked && now - c->alarms_checked < 5000000000ull) return;
  c->alarms_checked = now;
  int nospace = 0, corrupt = 0;
  if (rdzv_etcd_alarms(c->etcd, job_call_deadline(), &nospace, &corrupt) != NEWT_OK) return;
  if (nospace && !c->nospace_since) {
    c->nospace_since = newt_wall_ms();
    NEWT_ERROR(COORD, "%s: etcd is out of space (NOSPACE alarm): it refuses every write until space is freed "
               "(etcdctl compact, etcdctl defrag, etcdctl alarm disarm); training goes on, plans wait", c->id);
  } else if (!nospace && c->nospace_since) {
    char d[32];
    job_event ev = {.type = JOB_EV_ETCD};
    snprintf(ev.why, sizeof ev.why, "etcd was out of space (NOSPACE alarm) for %s; it takes writes again",
             newt_fmt_duration((double)(newt_wall_ms() - c->nospace_since) / 1e3, d, sizeof d));
    NEWT_WARN(COORD, "%s: %s", c->id, ev.why);
    post_event(c, &ev); /* what could not be said while it was full */
    c->nospace_since = 0;
  }
  metrics_set(c->metrics, "newt_etcd_nospace", nospace);
}

/* Puts back what the leader knows when etcd lost it (an etcd without a persistent volume
 * came back empty) or a writer replaced it: the spec, and the current plan under its own
 * generation (workers take only newer plans, so it changes nothing for them; joiners find
 * it) where the stored one is gone, invalid, older, or newer and forged. */
static void restore_records(coord *c) {
  char key[256];
  rdzv_etcd_kv kv;
  if (job_key(key, sizeof key, c->o->job, JOB_REC_SPEC, 0, NULL) != NEWT_OK) return;
  newt_result_t r = rdzv_etcd_get(c->etcd, key, job_call_deadline(), &kv, NULL);
  if (r == NEWT_OK) rdzv_etcd_kv_free(&kv);
  else if (r == NEWT_ERR_NOTFOUND) {
    char *spec = spec_to_json(&c->spec);
    if (spec && job_spec_put(c->etcd, c->o->job, spec, job_call_deadline()) == NEWT_OK)
      NEWT_WARN(COORD, "%s: etcd had lost the job's spec; stored it again", c->id);
    free(spec);
  }
  pthread_mutex_lock(&c->mu);
  newt_plan p = {0};
  newt_result_t cr = c->plan.generation ? plan_copy(&p, &c->plan) : NEWT_ERR_NOTFOUND;
  pthread_mutex_unlock(&c->mu);
  if (cr != NEWT_OK) return;
  const char *lost = NULL;
  r = job_key(key, sizeof key, c->o->job, JOB_REC_PLAN, 0, NULL);
  if (r == NEWT_OK) r = rdzv_etcd_get(c->etcd, key, job_call_deadline(), &kv, NULL);
  if (r == NEWT_ERR_NOTFOUND) {
    lost = "etcd had lost the plan";
  } else if (r == NEWT_OK) {
    newt_plan stored;
    if (plan_from_json(kv.value, kv.value_len, &stored) != NEWT_OK) {
      lost = "the stored plan was not valid";
    } else {
      /* an older one, or a newer one we would not take: forged or corrupt (a newer one we
         would take is the watch's to bring) */
      if (stored.generation < p.generation ||
          (stored.generation > p.generation && (plan_check_spec(&stored, &c->spec) != NEWT_OK ||
                                                plan_check_jump(p.generation, stored.generation) != NEWT_OK)))
        lost = "the stored plan was not one of this job's (forged or corrupt)";
      plan_free(&stored);
    }
    rdzv_etcd_kv_free(&kv);
  }
  if (lost) {
    char *json = plan_to_json(&p);
    if (json && job_plan_publish(c->cand, c->o->job, (int64_t)p.generation, json, job_call_deadline()) == NEWT_OK)
      NEWT_WARN(COORD, "%s: %s; published generation %llu again", c->id, lost, (unsigned long long)p.generation);
    free(json);
  }
  plan_free(&p);
}

/* etcd answers again after an outage. What the picture says about time is stale: no
 * progress could be published and no lease renewed meanwhile. So the stall clock starts
 * again, and every rank gets a lease TTL (and the join window) to renew its registration
 * before a missing one counts as gone; a rank that died during the outage was reported by
 * the survivors (their reports are queued until etcd answers) or stops the steps. */
static void after_outage(coord *c) {
  c->outages_seen = rdzv_etcd_outages_ended(c->etcd);
  pthread_mutex_lock(&c->mu);
  uint64_t now = newt_now_ns();
  c->prog_change = c->stall_from = now;
  c->first_gone = 0;
  c->outage_end = now;
  pthread_mutex_unlock(&c->mu);
  NEWT_INFO(COORD, "%s: etcd answers again; members have %lld ms to renew their registrations", c->id,
            (long long)(c->spec.lease_ttl_ms + c->spec.join_window_ms));
  restore_records(c);
}

/* Keeps a worker fenced alive out of plans (it registers again after its fence, and would
 * stop the job the same way at once): until it says it reaches every rank of a later plan
 * (put_links), and past until while it says it does not (held_refresh_locked). */
static void hold_out(coord *c, const char *id, int build) {
  pthread_mutex_lock(&c->mu);
  int i = 0;
  while (i < c->nheld && strcmp(c->held[i].id, id) != 0) i++;
  if (i == c->nheld) {
    struct held *h = realloc(c->held, (size_t)(c->nheld + 1) * sizeof *h);
    char (*ids)[RDZV_NAME_MAX] = realloc(c->held_ids, (size_t)(c->nheld + 1) * sizeof *ids);
    if (h) c->held = h;
    if (ids) c->held_ids = ids;
    if (!h || !ids) {
      pthread_mutex_unlock(&c->mu);
      return;
    }
    memset(&c->held[i], 0, sizeof c->held[i]);
    snprintf(c->held[i].id, sizeof c->held[i].id, "%s", id);
    c->nheld++;
  }
  int64_t ms = policy_hold_out_ms(++c->held[i].strikes);
  c->held[i].until = newt_now_ns() + (uint64_t)ms * 1000000ull;
  c->held[i].gen = c->plan.generation;
  c->held[i].build = build;
  c->held[i].saw_cut = 0;
  c->held[i].links_gen = 0;
  pthread_mutex_unlock(&c->mu);
  char d[32];
  NEWT_WARN(COORD, "%s: %s is left out of generation %llu alive (the others lost it: a cut link, a stop, a build "
            "that could not take it in); no plan takes it until it reaches every rank of a later one, or for %s at "
            "most while it says nothing", c->id, id, (unsigned long long)c->plan.generation,
            newt_fmt_duration((double)ms / 1e3, d, sizeof d));
}

/* links/<id> (or its deletion): what a worker left out says of its links to the ranks of a
 * plan. One held out since an earlier generation is let back at once when all of them
 * answered (the cut that kept it out healed), and kept out past its hold-out while they do
 * not (held_refresh_locked). Called with mu held. */
static void put_links(coord *c, const rdzv_etcd_kv *kv, const char *id, int deleted) {
  job_links l = {0};
  if (!deleted && job_links_from_json(kv->value, kv->value_len, &l) != NEWT_OK) {
    NEWT_WARN(COORD, "ignoring %s: %s", kv->key, newt_errmsg());
    return;
  }
  uint64_t now = newt_now_ns();
  for (int i = 0; i < c->nheld; i++) {
    struct held *h = &c->held[i];
    if (strcmp(h->id, id) != 0) continue;
    int was_held = h->until > now || h->said_kept;
    if (deleted || (uint64_t)l.generation <= h->gen) { /* gone, or of the generation it failed */
      h->links_gen = 0;
      continue;
    }
    h->links_gen = l.generation;
    h->links_ok = l.answered == l.ranks;
    h->saw_cut |= !h->links_ok;
    if (!h->links_ok || !was_held || (h->build && !h->saw_cut)) continue;
    h->until = now;
    h->said_kept = 0;
    NEWT_INFO(COORD, "%s: %s reaches every rank of generation %lld again: its hold-out ends", c->id, id,
              (long long)l.generation);
  }
}

/* The ids still held out, for the policy: those whose hold-out has not run out, and those
 * that say they still do not reach every rank of a plan after the one they failed (taken
 * in, they would only fail its build). Called with mu held. */
static void held_refresh_locked(coord *c) {
  uint64_t now = newt_now_ns();
  int before = c->nheld_ids;
  c->nheld_ids = 0;
  for (int i = 0; i < c->nheld; i++) {
    struct held *h = &c->held[i];
    int cut = h->links_gen > 0 && !h->links_ok;
    if (h->until <= now && cut && !h->said_kept) {
      h->said_kept = 1;
      NEWT_INFO(COORD, "%s: the hold-out of %s ran out, but it does not reach every rank of generation %lld: kept "
                "out until it does", c->id, h->id, (long long)h->links_gen);
    }
    if (h->until <= now && !cut) h->said_kept = 0;
    if (h->until > now || cut) snprintf(c->held_ids[c->nheld_ids++], RDZV_NAME_MAX, "%s", h->id);
  }
  /* one let back may make a larger layout: join_grows_layout's cached "no" is moot (the list
     only shrinks by releases; a new hold comes with a plan, which moots it anyway) */
  if (c->nheld_ids < before) c->join_checked_gen = UINT64_MAX;
}

/* Says, once per generation, which ranks' registrations vanished while steps went on (the
 * progress record: written by the lowest rank that reaches etcd): alive, cut from etcd, not
 * fenced. Called with mu held. */
static void say_alive_locked(coord *c) {
  char names[256] = "";
  for (int k = 0; k < c->plan.nranks; k++)
    if (find_member(c, c->plan.ranks[k].worker) < 0) newt_list_add(names, sizeof names, c->plan.ranks[k].worker);
  c->said_alive = 1;
  NEWT_INFO(COORD, "generation %llu: the registration of %s vanished, but steps went on since (step %lld): alive "
            "(cut from etcd?), nothing replanned", (unsigned long long)c->plan.generation, names[0] ? names : "a rank",
            (long long)c->prog_step);
}

/* Looks at the picture once and acts on the policy's decision. Returns NEWT_ERR_CONFLICT
 * when leadership is lost. */
static newt_result_t decide(coord *c) {
  policy_decision d;
  pthread_mutex_lock(&c->mu);
  metrics_set(c->metrics, "newt_workers", (double)c->nmembers);
  held_refresh_locked(c);
  policy_view v = view_locked(c);
  newt_result_t r = policy_decide(&v, &d);
  c->first_member = d.first_member;
  c->first_gone = d.first_gone;
  if (d.gone_alive && !c->said_alive) say_alive_locked(c);
  job_event spare = c->spare_ev;
  memset(&c->spare_ev, 0, sizeof c->spare_ev);
  uint64_t join_seen = c->join_seen_ms;
  pthread_mutex_unlock(&c->mu);
  if (spare.type == JOB_EV_SPARE) {
    NEWT_INFO(COORD, "%d worker%s stay%s spare: %s", spare.nspare_ids, spare.nspare_ids == 1 ? "" : "s",
              spare.nspare_ids == 1 ? "s" : "", spare.why);
    post_event(c, &spare);
  }
  job_event_free(&spare);
  if (r != NEWT_OK) return r;

  const char *cause = policy_cause(d.reason);
  if (cause && budget_spent(c, cause)) {
    policy_decision_free(&d);
    return NEWT_OK;
  }
  if (cause && d.partition) {
    char names[256] = "";
    for (int i = 0; i < d.nexclude; i++) newt_list_add(names, sizeof names, d.exclude[i]);
    if (d.partition == POLICY_PARTITION_BUILD)
      NEWT_WARN(COORD, "generation %llu never formed and every rank is named by most of the others (a partition no "
                "majority explains): the largest side goes on; left out: %s", (unsigned long long)c->plan.generation,
                names);
    else
      NEWT_WARN(COORD, "generation %llu failed and ranks that reported it are named by most of the others (cut off "
                "from them on the data plane): the largest side goes on; left out: %s",
                (unsigned long long)c->plan.generation, names);
  }
  if (cause) {
    /* a join's recovery starts at the joiner's registration, the others' at the decision
       (or the reports' first detection: replan) */
    if (!c->t_trigger) c->t_trigger = d.reason == POLICY_JOIN && join_seen ? join_seen : newt_wall_ms();
    for (int i = 0; d.fence && i < d.nexclude; i++) {
      pthread_mutex_lock(&c->mu);
      int present = find_member(c, d.exclude[i]) >= 0;
      policy_view now = view_locked(c); /* the reports as they are now: the watch may have moved them */
      int build = present && policy_blames_build(&now, d.exclude[i]);
      pthread_mutex_unlock(&c->mu);
      /* a worker fenced alive (a build could not take it in, it was on another side of a
         partition or cut, it stopped or hung) registers again at once: held out until its
         links to the ranks of a later plan work (put_links), so that no generation is tried
         with it first -- a cut link would fail that build */
      if (present) hold_out(c, d.exclude[i], build);
      if (present) fence(c, d.exclude[i]);
    }
    int no_layout;
    r = replan(c, cause, d.at_boundary ? "boundary" : "abort", d.exclude, d.nexclude, &no_layout);
    if (no_layout) {
      if (!c->waiting_logged) {
        NEWT_WARN(COORD, "cannot plan (%s): %s", cause, newt_errmsg());
        job_event ev = {.type = JOB_EV_WAITING};
        snprintf(ev.why, sizeof ev.why, "%s", newt_errmsg());
        post_event(c, &ev);
        c->waiting_logged = 1;
        snprintf(c->waiting_why, sizeof c->waiting_why, "%s", newt_errmsg());
      }
      r = NEWT_OK;
    }
  } else if (c->plan_mono && !c->recorded) {
    record_recovery(c);
  }
  policy_decision_free(&d);
  return r;
}

/* --- spec changes ------------------------------------------------------------------------- */

/* Posts what happened to a changed spec: taken (what changed) or refused (why). */
static void spec_event(coord *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void spec_event(coord *c, const char *fmt, ...) {
  job_event ev = {.type = JOB_EV_SPEC};
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ev.why, sizeof ev.why, fmt, ap);
  va_end(ap);
  post_event(c, &ev);
}

/* Re-reads the spec file (a ConfigMap that `helm upgrade` changed is updated in place) and
 * stores it when its content changed since the last look: taken when only fields that can
 * change differ, refused (logged, an event, the job goes on as it is) otherwise. */
static void check_spec_file(coord *c) {
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

/* The leader takes a changed spec the watch saw: the coordinator's own settings at once;
 * what the workers use (checkpoints, timeouts, the data-parallel range) with a plan at the
 * next step boundary, which each rank reads the spec again for. */
static newt_result_t take_spec_change(coord *c) {
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
  newt_result_t r = replan(c, "spec", "boundary", NULL, 0, &no_layout);
  if (no_layout) {
    NEWT_WARN(COORD, "%s: no layout fits the changed spec (%s); the next plan takes it", c->id, newt_errmsg());
    r = NEWT_OK;
  }
  return r;
}

/* --- leadership and the main loop --------------------------------------------------------- */

static void on_leadership(void *ud, int leading, const char *why) {
  coord *c = ud;
  NEWT_INFO(COORD, "%s %s leadership: %s", c->id, leading ? "gained" : "lost", why ? why : "");
}

/* A standby hides the job's metrics (the leader's are the job's) and says so. */
static void standby_metrics(coord *c) {
  metrics_show_group(c->metrics, GROUP_JOB, 0);
  metrics_set_note(c->metrics, "newt: this coordinator is a standby; the job's metrics are the leader's (newt_is_leader 1)");
}

static newt_result_t lead(coord *c) {
  NEWT_INFO(COORD, "%s leads job %s", c->id, c->o->job);
  metrics_set(c->metrics, "newt_is_leader", 1);
  metrics_show_group(c->metrics, GROUP_JOB, 1);
  metrics_set_note(c->metrics, NULL);
  recount_failures(c);
  job_event ev = {.type = JOB_EV_LEADER};
  post_event(c, &ev);
  c->plan_mono = c->stall_from = newt_now_ns();
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
  c->outages_seen = rdzv_etcd_outages_ended(c->etcd);
  while (r == NEWT_OK && !c->failed) {
    atomic_store(&c->tick, newt_now_ns());
    if (newt_stop_requested()) break;
    if (!rdzv_candidate_is_leader(c->cand)) {
      /* etcd away long enough for the candidacy's lease to look lost: keep leading if etcd
         still has it (decide nothing meanwhile); step down only when it is gone */
      newt_result_t k = rdzv_candidate_renew(c->cand, job_call_deadline());
      if (k == NEWT_OK && rdzv_candidate_is_leader(c->cand)) continue;
      if (k == NEWT_ERR_UNAVAILABLE || k == NEWT_ERR_TIMEOUT) {
        newt_sleep_ms(200);
        continue;
      }
      r = NEWT_ERR(NEWT_ERR_CONFLICT, "%s lost leadership%s%s", c->id, k == NEWT_OK ? "" : ": ",
                   k == NEWT_OK ? "" : newt_errmsg());
      break;
    }
    if (!rdzv_etcd_reachable(c->etcd)) { /* an outage: the picture is stale, no write can land */
      newt_sleep_ms(newt_param_CoordTickMs());
      continue;
    }
    if (rdzv_etcd_outages_ended(c->etcd) != c->outages_seen) after_outage(c);
    pthread_mutex_lock(&c->mu);
    int foreign = c->plan_foreign;
    c->plan_foreign = 0;
    pthread_mutex_unlock(&c->mu);
    if (foreign) restore_records(c); /* our plan over a forged one */
    check_alarms(c);
    check_spec_file(c);
    r = take_spec_change(c);
    if (r != NEWT_OK && r != NEWT_ERR_CONFLICT) {
      warn_limited(c, "taking the changed spec", newt_errmsg());
      r = NEWT_OK;
    }
    if (r != NEWT_OK) break;
    pthread_mutex_lock(&c->mu);
    int done = c->done;
    pthread_mutex_unlock(&c->mu);
    if (done) {
      if (c->plan_mono && !c->recorded) record_recovery(c);
      job_event e = {.type = JOB_EV_DONE};
      pthread_mutex_lock(&c->mu);
      e.step = c->prog_step;
      e.loss = c->prog_loss;
      pthread_mutex_unlock(&c->mu);
      post_event(c, &e);
      NEWT_INFO(COORD, "job %s is done", c->o->job);
      metrics_set(c->metrics, "newt_job_done", 1);
      break;
    }
    if (past_progress_bound(c)) break;
    r = decide(c);
    if (r != NEWT_OK && r != NEWT_ERR_CONFLICT) {
      /* etcd refused or did not answer (an outage, NOSPACE): nothing is lost by trying again
         at the next tick; only a lost leadership ends leading */
      warn_limited(c, "deciding", newt_errmsg());
      r = NEWT_OK;
    }
    newt_sleep_ms(newt_param_CoordTickMs());
  }
  rdzv_etcd_watch_free(c->watch);
  c->watch = NULL;
  metrics_set(c->metrics, "newt_is_leader", 0);
  pthread_mutex_lock(&c->mu);
  int ended = c->failed || c->done;
  pthread_mutex_unlock(&c->mu);
  if (ended) /* the job's metrics stay: its end is what the last scrapes must see */
    metrics_set_note(c->metrics, "newt: the job has ended; this coordinator led it and exits after --metrics-linger-ms");
  else
    standby_metrics(c);
  return r;
}

/* Errors no retry mends: a wrong password or certificate, a bad flag. Everything else etcd
 * says (unavailable, timed out, out of space, a lost leadership) passes; a coordinator
 * outlives it. */
static int fatal(newt_result_t r) {
  return r == NEWT_ERR_AUTH || r == NEWT_ERR_INVALID || r == NEWT_ERR_UNSUPPORTED || r == NEWT_ERR_NOMEM;
}

/* /healthz: the main loop goes round every few ms (a standby's every 500 ms); a loop stuck
 * for 30 s (a deadlock, a call without a deadline) is unhealthy. */
static int coord_health(void *ud, char *why, size_t cap) {
  coord *c = ud;
  uint64_t t = atomic_load(&c->tick), now = newt_now_ns();
  if (!t || now - t < 30000000000ull) return 1;
  snprintf(why, cap, "the coordinator's main loop has not run for %.0f s", (double)(now - t) / 1e9);
  return 0;
}

static newt_result_t define_metrics(coord *c) {
  static const struct {
    const char *name;
    metrics_kind kind;
    int group;
    const char *help;
  } defs[] = {
      {"newt_build_info", METRICS_GAUGE, GROUP_PROCESS, "1, labelled with newt's version and the process's role"},
      {"newt_is_leader", METRICS_GAUGE, GROUP_PROCESS, "1 when this coordinator leads the job (its metrics are the job's)"},
      {"newt_generation", METRICS_GAUGE, GROUP_JOB, "generation of the current plan"},
      {"newt_world_size", METRICS_GAUGE, GROUP_JOB, "ranks in the current plan"},
      {"newt_data_parallel_size", METRICS_GAUGE, GROUP_JOB, "data-parallel size of the current plan"},
      {"newt_spares", METRICS_GAUGE, GROUP_JOB, "registered workers the current plan keeps as spares"},
      {"newt_workers", METRICS_GAUGE, GROUP_JOB, "registered workers"},
      {"newt_step", METRICS_GAUGE, GROUP_JOB, "newest completed step"},
      {"newt_steps_total", METRICS_COUNTER, GROUP_JOB, "steps completed (a step rolled back and done again counts once)"},
      {"newt_tokens_total", METRICS_COUNTER, GROUP_JOB, "tokens trained on: steps x global batch x sequence length"},
      {"newt_loss", METRICS_GAUGE, GROUP_JOB, "loss of the newest step"},
      {"newt_tokens_per_second", METRICS_GAUGE, GROUP_JOB, "training throughput of the newest step"},
      {"newt_recoveries_total", METRICS_COUNTER, GROUP_JOB, "recoveries completed, by cause"},
      {"newt_steps_lost_total", METRICS_COUNTER, GROUP_JOB, "steps trained again after recoveries"},
      {"newt_checkpoint_last_step", METRICS_GAUGE, GROUP_JOB, "step of the newest committed checkpoint"},
      {"newt_checkpoint_bytes", METRICS_GAUGE, GROUP_JOB, "bytes on disk of the newest committed checkpoint"},
      {"newt_failure_budget_used", METRICS_GAUGE, GROUP_JOB, "recoveries from a crash or hang within the failure window"},
      {"newt_failure_budget_limit", METRICS_GAUGE, GROUP_JOB, "spec.fault.max_failures (0: no budget)"},
      {"newt_job_done", METRICS_GAUGE, GROUP_JOB, "1 once the job trained its last step"},
      {"newt_job_failed", METRICS_GAUGE, GROUP_JOB, "1 once the job failed (its reason: newt status)"},
      {"newt_etcd_nospace", METRICS_GAUGE, GROUP_JOB, "1 while etcd is out of space (NOSPACE alarm)"},
  };
  static const double recovery_s[] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
  static const double save_s[] = {0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
  static const double stall_s[] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++)
    NEWT_CHECK(metrics_define_group(c->metrics, defs[i].name, defs[i].kind, defs[i].group, defs[i].help));
  NEWT_CHECK(metrics_define_histogram(c->metrics, "newt_recovery_duration_seconds", GROUP_JOB, recovery_s, 10,
                                      "detection to the first completed step of a recovery, by cause"));
  NEWT_CHECK(metrics_define_histogram(c->metrics, "newt_checkpoint_save_duration_seconds", GROUP_JOB, save_s, 11,
                                      "a checkpoint's save on rank 0: compress, write, fsync, commit"));
  NEWT_CHECK(metrics_define_histogram(c->metrics, "newt_checkpoint_stall_seconds", GROUP_JOB, stall_s, 11,
                                      "what a checkpoint's save took of rank 0's step loop: its snapshot or downloads"));
  /* every cause from the start, so that rate() has a series before the first recovery */
  static const char *const causes[] = {"crash", "hang", "leave", "join", "coordinator", "etcd", "spec"};
  for (size_t i = 0; i < sizeof causes / sizeof causes[0]; i++) {
    char l[48];
    snprintf(l, sizeof l, "cause=\"%s\"", causes[i]);
    metrics_add_l(c->metrics, "newt_recoveries_total", l, 0);
  }
  metrics_set_l(c->metrics, "newt_build_info", "version=\"" NEWT_VERSION "\",role=\"coordinator\"", 1);
  metrics_set(c->metrics, "newt_failure_budget_limit", (double)c->spec.max_failures);
  metrics_set_health(c->metrics, coord_health, c);
  standby_metrics(c);
  return rdzv_etcd_set_metrics(c->etcd, c->metrics);
}

/* Whether the job has ended, for a coordinator that does not lead: done (its marker), or
 * failed (another coordinator gave up on it: end says why). */
static int job_ended(coord *c) {
  job_failed f;
  if (job_has_failed(c->etcd, c->o->job, &f)) {
    if (c->o->end && c->o->end->status != JOB_EXIT_FAILED) {
      c->o->end->status = JOB_EXIT_FAILED;
      snprintf(c->o->end->msg, sizeof c->o->end->msg, "failed: %s", f.why);
    }
    c->failed = 1;
    return 1;
  }
  return job_is_done(c->etcd, c->o->job, &c->spec);
}

/* After the job's end (done or failed) a coordinator keeps serving its final metrics for
 * --metrics-linger-ms, so that each Prometheus scrapes them at least once: the leader's say
 * newt_job_done or newt_job_failed 1, from which the chart's alerts remember the end and
 * tell a job that ended from one whose coordinators are all gone. The standbys wait too: one
 * that exited 4 at once would fail the Kubernetes Job, which stops the leader's pod before
 * its final scrape. A signal ends the wait; /healthz stays healthy. */
static void linger(coord *c) {
  if (!c->metrics || c->o->metrics_linger_ms <= 0) return;
  NEWT_INFO(COORD, "%s: serving the job's final metrics for %d ms (--metrics-linger-ms)", c->id, c->o->metrics_linger_ms);
  newt_deadline_t d = newt_deadline_in_ms(c->o->metrics_linger_ms);
  while (!newt_deadline_passed(d) && !newt_stop_requested()) {
    atomic_store(&c->tick, newt_now_ns());
    newt_sleep_ms(100);
  }
}

/* The end of a coordinator that ran without error: done, failed (set where it was seen),
 * or stopped by a signal before the end. */
static void set_end(coord *c) {
  job_end *e = c->o->end;
  if (!e || e->status == JOB_EXIT_FAILED) return;
  if (newt_stop_requested() && !job_is_done(c->etcd, c->o->job, &c->spec)) {
    e->status = JOB_EXIT_LEFT;
    snprintf(e->msg, sizeof e->msg, "left: stopped by signal %d before the end of job %s; the other coordinators go on",
             newt_stop_requested(), c->o->job);
    return;
  }
  e->status = JOB_EXIT_DONE;
  snprintf(e->msg, sizeof e->msg, "done: job %s trained its %lld steps", c->o->job, (long long)c->spec.steps);
}

newt_result_t coordinator_run(const coordinator_opts *o) {
  coord *c = calloc(1, sizeof *c);
  NEWT_CHECK_ALLOC(c);
  c->o = o;
  c->event_log_fd = -1;
  pthread_mutex_init(&c->mu, NULL);
  newt_result_t r = rdzv_check_name("job", o->job);
  if (r == NEWT_OK && o->event_log) r = job_runlog_open(o->event_log, 0, &c->event_log_fd);
  if (o->id && *o->id) snprintf(c->id, sizeof c->id, "%s", o->id);
  else snprintf(c->id, sizeof c->id, "coordinator-%.32s-%d", newt_hostname(), (int)getpid());
  newt_log_set_name(c->id);
  if (r == NEWT_OK) r = rdzv_key(c->prefix, sizeof c->prefix, o->job, "");
  if (r == NEWT_OK) r = rdzv_etcd_init(&o->etcd, &c->etcd);
  while (r == NEWT_OK && o->spec_file) {
    char changed[512];
    r = coordinator_put_spec(c->etcd, o->job, o->spec_file, changed, sizeof changed);
    if (r == NEWT_OK && changed[0]) NEWT_INFO(COORD, "%s: stored the changed spec of %s: %s", c->id, o->spec_file, changed);
    if (r == NEWT_ERR_CONFLICT) {
      /* the job goes on with the spec it has: refusing to run would crash-loop the pod */
      NEWT_ERROR(COORD, "%s: refused the spec of %s, going on with the job's spec in etcd: %s", c->id, o->spec_file,
                 newt_errmsg());
      r = NEWT_OK;
      break;
    }
    if (r == NEWT_OK || fatal(r) || newt_stop_requested()) break;
    warn_limited(c, "storing the spec", newt_errmsg()); /* etcd away: wait for it */
    r = NEWT_OK;
    newt_sleep_ms(200);
  }
  if (r == NEWT_OK && o->spec_file) newt_fs_read_all(o->spec_file, 1 << 20, &c->spec_file_text, &(size_t){0});
  char *spec = NULL;
  newt_deadline_t d = newt_deadline_in_ms(60000);
  while (r == NEWT_OK) {
    /* etcd away: wait for it as long as it takes; no spec in a reachable etcd: 60 s */
    r = job_spec_get(c->etcd, o->job, job_call_deadline(), &spec);
    if (r == NEWT_OK || fatal(r)) break;
    if (r != NEWT_ERR_NOTFOUND) {
      warn_limited(c, "reading the spec", newt_errmsg());
      d = newt_deadline_in_ms(60000);
    } else if (newt_deadline_passed(d)) {
      r = NEWT_ERR(NEWT_ERR_NOTFOUND, "job %s has no spec in etcd (give one with --spec FILE)", o->job);
      break;
    }
    if (newt_stop_requested()) {
      r = NEWT_ERR(NEWT_ERR_ABORTED, "stopped while waiting for the spec");
      break;
    }
    r = NEWT_OK;
    newt_sleep_ms(200);
  }
  if (r == NEWT_OK) r = spec_from_json(spec, strlen(spec), &c->spec);
  free(spec);
  if (r == NEWT_OK && o->metrics_port > 0)
    r = metrics_start(o->metrics_addr ? o->metrics_addr : "127.0.0.1", o->metrics_port, NULL, &c->metrics);
  if (r == NEWT_OK && c->metrics) {
    r = define_metrics(c);
    if (r == NEWT_OK)
      NEWT_INFO(COORD, "%s: metrics at http://%s:%d/metrics (health: /healthz)", c->id,
                o->metrics_addr ? o->metrics_addr : "127.0.0.1", metrics_port(c->metrics));
  }
  while (r == NEWT_OK && !newt_stop_requested()) {
    atomic_store(&c->tick, newt_now_ns());
    if (job_ended(c)) {
      NEWT_INFO(COORD, "%s: job %s has %s; exiting (to use the name again: newt job rm --job %s)", c->id, c->o->job,
                c->failed ? "failed" : "its end marker", c->o->job);
      break;
    }
    rdzv_campaign_opts co = {.name = c->id, .ttl_s = (c->spec.lease_ttl_ms + 999) / 1000, .fn = on_leadership, .ud = c};
    r = job_campaign(c->etcd, o->job, &co, job_call_deadline(), &c->cand);
    if (r != NEWT_OK && !fatal(r)) {
      /* etcd away, full or refusing for now: campaign again once it is back */
      warn_limited(c, "campaigning", newt_errmsg());
      newt_sleep_ms(200);
      r = NEWT_OK;
      continue;
    }
    if (r != NEWT_OK) break;
    newt_result_t w;
    do {
      atomic_store(&c->tick, newt_now_ns());
      check_spec_file(c);
      w = rdzv_candidate_wait(c->cand, newt_deadline_in_ms(500));
      if (w == NEWT_ERR_TIMEOUT && (newt_stop_requested() || job_ended(c))) break;
    } while (w == NEWT_ERR_TIMEOUT);
    if (w == NEWT_OK) {
      newt_result_t l = lead(c);
      if (l != NEWT_OK && fatal(l)) r = l;
      else if (l != NEWT_OK) warn_limited(c, "leading", newt_errmsg());
    } else if (w != NEWT_ERR_TIMEOUT && w != NEWT_ERR_CONFLICT && fatal(w)) {
      r = w;
    }
    /* leaving the election (done, stopped, or leadership lost): revoke the candidacy so
       that a stale key of ours never stands in front of the next leader */
    rdzv_candidate_resign(c->cand, newt_deadline_in_ms(1000));
    rdzv_candidate_free(c->cand);
    c->cand = NULL;
    if (c->failed || newt_stop_requested() || job_ended(c) || r != NEWT_OK) break;
  }
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", newt_errmsg());
  int ended = r == NEWT_OK && !newt_stop_requested(); /* the loop ends so only at the job's end */
  if (r == NEWT_OK) set_end(c);
  if (ended) linger(c);
  rdzv_etcd_free(c->etcd); /* before the metrics its requests count into */
  metrics_stop(c->metrics);
  plan_free(&c->plan);
  free(c->members);
  free(c->reports);
  free(c->acks);
  free(c->departed);
  free(c->held);
  free(c->held_ids);
  job_event_free(&c->spare_ev);
  if (c->event_log_fd >= 0) close(c->event_log_fd);
  free(c->spec_file_text);
  pthread_mutex_destroy(&c->mu);
  free(c);
  return r == NEWT_OK ? NEWT_OK : NEWT_ERR(r, "%s", msg);
}
