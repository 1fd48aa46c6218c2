/* The leader's picture of the job, built from job/view.h: a snapshot of /newt/<job>/ as one
 * resync batch (the spec, the plan, the progress and the registrations before the rest),
 * then the watch's batches, each change a typed record. The watch's thread only updates the
 * picture, under mu, one batch at a time; the main thread reads it (coord_view_locked) and
 * decides. What counts is judged here: a report or an acknowledgement only from a rank of
 * the current plan, registered now, on its own lease, and -- when the job has a secret --
 * proving it (job_report_check: the lease id is readable by anyone, and etcd lets any writer
 * put a key on any lease); the coordinator's clock on reports and acks; a links record only
 * with its proof; a plan taken only when it agrees with the spec and is no jump far past ours;
 * a spec only when a running job may take it; an end marker only when it is plausible, proves
 * the secret and says no step beyond the newest progress of the job (job_done_counts), judged
 * once its batch is taken in. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/param.h"
#include "coordinator/coord.h"

NEWT_PARAM(StartWindowMs, "NEWT_START_WINDOW_MS", 1000)
/* a straggle shorter than this is noise, however many steps it spans (a rank descheduled for a
   moment spans many short steps): docs/elastic.md, "Stragglers" */
NEWT_PARAM(StraggleMinMs, "NEWT_STRAGGLER_MIN_MS", 1000)

/* --- members, reports, acks, progress ------------------------------------------------------ */

/* The members and the acks are looked up by id through a hash index each (common/strindex.h),
 * kept with the array: a lookup for each of 100,000 ranks or registrations is O(1), not a scan. */
int coord_find_member(const coord *c, const char *id) { return newt_strindex_find(&c->member_ix, c->members, id); }

int coord_find_ack(const coord *c, const char *id) { return newt_strindex_find(&c->ack_ix, c->acks, id); }

void coord_picture_init(coord *c) {
  c->member_ix = NEWT_STRINDEX(job_worker, id);
  c->ack_ix = NEWT_STRINDEX(c_ack, id);
}

void coord_picture_free(coord *c) {
  newt_strindex_free(&c->member_ix);
  newt_strindex_free(&c->ack_ix);
}

/* A record that does not prove the job secret counts for nothing: said at once, then at most
 * every 10 s with the count (a forger may write one every few milliseconds). */
static int proved(coord *c, newt_result_t r) {
  if (r == NEWT_OK) return 1;
  uint64_t now = newt_now_ns();
  c->auth_refused++;
  if (!c->auth_warned || now - c->auth_warned >= 10000000000ull) {
    NEWT_WARN(COORD, "ignoring %s%s", newt_errmsg(),
              c->auth_refused > 1 ? " (and others that prove nothing since the last such warning)" : "");
    c->auth_warned = now;
    c->auth_refused = 0;
  }
  return 0;
}

/* The key of change ch as text. */
static const char *key_of(const job_change *ch, char *buf, size_t cap) {
  snprintf(buf, cap, "%.*s", (int)ch->kv->key_len, ch->kv->key);
  return buf;
}

/* Whether a report or ack (change ch) comes from a rank of the current plan, registered now
 * and written on its own lease: what anyone else writes there counts for nothing. */
static int from_live_rank(coord *c, const job_change *ch) {
  int i = coord_find_member(c, ch->id);
  if (i < 0 || !plan_find(&c->plan, ch->id) || ch->kv->lease != c->members[i].lease) {
    NEWT_WARN(COORD, "ignoring %s: not written by a registered rank of generation %llu on its lease", ch->kv->key,
              (unsigned long long)c->plan.generation);
    return 0;
  }
  return 1;
}

/* An acknowledgement of the current generation by worker ch->id, under ch's key (acks/<gen>/<id>,
 * the previous release's own key, or workers/<id>, the registration that carries it). */
static void put_ack(coord *c, const job_change *ch, const job_ack *ack) {
  c_ack a;
  memset(&a, 0, sizeof a);
  a.a = *ack;
  if (!from_live_rank(c, ch)) return;
  /* a rank's phases happened between the plan and the ack's arrival, by our clock */
  uint64_t now = newt_wall_ms(), from = c->plan.created_ms;
  uint64_t *t[] = {&a.a.t_plan, &a.a.t_comm, &a.a.t_restore, &a.a.t_step};
  for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
    if (*t[k] > now) *t[k] = now;
    if (*t[k] < from) *t[k] = from;
  }
  snprintf(a.id, sizeof a.id, "%s", ch->id);
  if (coord_find_ack(c, a.id) >= 0) return; /* counted already */
  if (c->nacks == c->cap_acks) {
    int cap = c->cap_acks ? 2 * c->cap_acks : 16;
    c_ack *n = realloc(c->acks, (size_t)cap * sizeof *n);
    if (!n) return;
    c->acks = n;
    c->cap_acks = cap;
  }
  c->acks[c->nacks] = a;
  if (newt_strindex_add(&c->ack_ix, c->acks, c->nacks) == NEWT_OK) c->nacks++;
}

/* The acknowledgement folded into registration ch (job_worker_ack: a bad one is refused while
 * the registration stands). */
static void put_folded_ack(coord *c, const job_change *ch) {
  job_ack a;
  char key[256];
  if (job_worker_ack(&ch->u.worker, &a) != NEWT_OK) {
    NEWT_WARN(COORD, "ignoring %s: %s", ch->kv->key, newt_errmsg());
    return;
  }
  if (!proved(c, job_ack_check(&c->auth, key_of(ch, key, sizeof key), ch->u.worker.generation, c->plan.secret,
                               sizeof c->plan.secret, &a)))
    return;
  put_ack(c, ch, &a);
}

static void put_member(coord *c, const job_change *ch) {
  const job_worker *w = &ch->u.worker;
  int i = coord_find_member(c, ch->id);
  if (i < 0) {
    if (c->nmembers == c->cap_members) {
      int cap = c->cap_members ? 2 * c->cap_members : 16;
      job_worker *m = realloc(c->members, (size_t)cap * sizeof *m);
      if (!m) return;
      c->members = m;
      c->cap_members = cap;
    }
    c->members[c->nmembers] = *w;
    if (newt_strindex_add(&c->member_ix, c->members, c->nmembers) != NEWT_OK) return;
    i = c->nmembers++;
    if (!c->plan.generation || !plan_find(&c->plan, ch->id)) {
      c->last_join = newt_now_ns();
      if (!c->join_seen_ms) c->join_seen_ms = newt_wall_ms();
    }
    NEWT_INFO(COORD, "worker %s joined (host %s%s%s, %s)", ch->id, w->host,
              strcmp(w->domain, w->host) ? ", failure domain " : "", strcmp(w->domain, w->host) ? w->domain : "",
              w->addr);
    coord_held_registered_locked(c, ch->id, w, !c->in_resync);
  }
  c->members[i] = *w;
  /* the acknowledgement of the current generation, folded into the registration */
  if (w->ack[0] && c->plan.generation && (uint64_t)w->generation == c->plan.generation) put_folded_ack(c, ch);
}

void coord_drop_member(coord *c, const char *id) {
  int i = coord_find_member(c, id);
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
  int last = --c->nmembers;
  newt_strindex_del(&c->member_ix, c->members, i);
  newt_strindex_renumber(&c->member_ix, c->members, last, i);
  c->members[i] = c->members[last];
}

static void put_report(coord *c, const job_change *ch) {
  job_report rep = ch->u.report;
  char key[256];
  if (!proved(c, job_report_check(&c->auth, key_of(ch, key, sizeof key), c->plan.secret, sizeof c->plan.secret, &rep)))
    return;
  if (!from_live_rank(c, ch)) return;
  if (rep.mismatch[0]) { /* replicas disagreed: said as an event, nothing to plan for */
    job_event ev = {.type = JOB_EV_MISMATCH, .generation = (int64_t)c->plan.generation, .step = rep.mismatch_step,
                    .restore_step = rep.back_to};
    snprintf(ev.worker, sizeof ev.worker, "%s", ch->id);
    snprintf(ev.action, sizeof ev.action, "%s", rep.action);
    snprintf(ev.why, sizeof ev.why, "%s", rep.mismatch);
    const job_event *l = &c->said_last;
    int again = l->generation == ev.generation && l->step == ev.step && strcmp(l->action, ev.action) == 0 &&
                strcmp(l->why, ev.why) == 0;
    if (!again && c->nsaid < (int)(sizeof c->said / sizeof c->said[0])) {
      c->said[c->nsaid++] = ev; /* posted off the lock */
      c->said_last = ev;
    }
  }
  if (rep.fatal[0]) { /* no failure to plan for: the job fails (coord_fatal_report) */
    if (!c->fatal_why[0]) snprintf(c->fatal_why, sizeof c->fatal_why, "%s", rep.fatal);
    return;
  }
  if (rep.mismatch[0]) return;
  /* the step its writer completed, and when it saw the failure by its own clock (the step
     the fault hit: coord_fault_step_locked) */
  int64_t done = rep.done_step > 0 ? rep.done_step : rep.step;
  if (done > c->gen_done) c->gen_done = done;
  if (!c->gen_detect || rep.t_ms < c->gen_detect) c->gen_detect = rep.t_ms;
  /* the coordinator's clock orders reports and times the detection: a worker's clock (or
     a forger's) does not get into the recovery's timings */
  rep.t_ms = newt_wall_ms();
  rep.revision = ch->kv->mod_revision; /* a worker registered after it is not judged by it */
  for (int i = 0; i < c->nreports; i++)
    if (strcmp(c->reports[i].worker, ch->id) == 0) {
      /* the same rank's report written again (its second look named more ranks gone): the
         same detection, timed and judged from its first arrival */
      rep.t_ms = c->reports[i].t_ms;
      rep.revision = c->reports[i].revision;
      c->reports[i] = rep;
      return;
    }
  job_report *r = realloc(c->reports, (size_t)(c->nreports + 1) * sizeof *r);
  if (!r) return;
  c->reports = r;
  c->reports[c->nreports++] = rep;
  if (!c->first_report) c->first_report = newt_now_ns();
}

static void put_progress(coord *c, const job_progress *pr) {
  int64_t step = pr->step;
  c->prog_loss = pr->loss;
  c->prog_tps = pr->tokens_per_s;
  c->prog_speed = *pr;
  if (step != c->prog_step) c->prog_change = c->stall_from = newt_now_ns();
  c->prog_step = step;
  if (step > c->prog_max) c->prog_max = step;
  if (pr->generation == c->plan.generation && step >= c->gen_prog) c->gen_prog = step, c->gen_prog_t = pr->t_ms;
  if (step > c->steps_counted) { /* a step rolled back and done again counts once */
    metrics_add(c->metrics, "newt_steps_total", (double)(step - c->steps_counted));
    metrics_add(c->metrics, "newt_tokens_total", (double)(step - c->steps_counted) * (double)pr->step_tokens);
    c->steps_counted = step;
  }
  metrics_set(c->metrics, "newt_step", (double)step);
  metrics_set(c->metrics, "newt_loss", c->prog_loss);
  metrics_set(c->metrics, "newt_tokens_per_second", c->prog_tps);
}

/* --- the plan, the spec, the end, the checkpoint ------------------------------------------- */

void coord_set_plan_locked(coord *c, newt_plan *p) {
  if (c->plan.generation == p->generation && memcmp(c->plan.secret, p->secret, sizeof p->secret) == 0) {
    plan_free(p); /* the current one already (a secret is one plan's alone): what it gathered stays */
    return;
  }
  plan_free(&c->plan);
  c->plan = *p;
  c->nreports = 0;
  c->nacks = 0;
  newt_strindex_clear(&c->ack_ix);
  c->ndeparted = 0;
  c->first_report = 0;
  c->first_gone = 0;
  c->said_alive = 0;
  c->gen_done = c->gen_prog = 0;
  c->gen_detect = c->gen_prog_t = 0;
}

int64_t coord_fault_step_locked(const coord *c, int *went_on) {
  int64_t step = c->gen_done;
  /* the progress of the failed generation, written before the fault was seen: rank 0 may have
     completed a step the survivors did not (it died after it); written after it, and beyond
     every report, it is the survivors' own generation going on without etcd */
  int before = !c->gen_detect || c->gen_prog_t <= c->gen_detect;
  if (c->gen_prog > step && before) step = c->gen_prog;
  if (went_on) *went_on = c->gen_done > 0 && c->gen_prog > c->gen_done && !before;
  return step;
}

/* A plan in etcd newer than ours (the leader's, seen by a standby; or forged): taken when it
 * agrees with the spec and is no jump far past ours. One that is not is ignored and, when
 * this coordinator leads, put right by coord_restore_records (our plan published again). */
static void take_plan_locked(coord *c, const newt_plan *stored) {
  if (stored->generation <= c->plan.generation) return;
  if (plan_check_spec(stored, &c->spec) != NEWT_OK ||
      plan_check_jump(c->plan.generation, stored->generation) != NEWT_OK) {
    NEWT_WARN(COORD, "ignoring the stored plan: %s", newt_errmsg());
    c->plan_foreign = 1;
    return;
  }
  newt_plan p;
  if (plan_copy(&p, stored) == NEWT_OK) coord_set_plan_locked(c, &p);
}

/* A spec in etcd other than ours (a coordinator stored a changed one): kept for the main
 * thread when a running job may take it, refused (logged) otherwise. */
static void take_spec_locked(coord *c, const newt_spec *s) {
  if (memcmp(s, &c->spec, sizeof *s) == 0) return;
  if (!spec_update_allowed(&c->spec, s, NULL, 0)) {
    NEWT_ERROR(COORD, "ignoring the spec in etcd: %s", newt_errmsg());
    return;
  }
  c->spec_next = *s;
  c->spec_changed = 1;
}

/* An end marker, judged once the batch that brought it is taken in (a rank writes its last
 * step's progress in the same transaction: judge_done). */
static void put_done(coord *c, const job_change *ch) {
  c->done_seen = ch->u.done;
  key_of(ch, c->done_key, sizeof c->done_key);
  c->done_seen_rev = ch->kv->mod_revision;
}

/* The end marker counts when it is plausible, proves the job secret and says no step beyond
 * the newest progress of the job: one that says the last step while the ranks are at step 12
 * is not the end, and the job trains on (job_done_counts). Said once per version of it. */
static void judge_done(coord *c) {
  if (!c->done_key[0]) return;
  newt_result_t r = job_done_counts(&c->done_seen, c->done_key, &c->spec, &c->auth, c->prog_max);
  if (r == NEWT_OK) c->done = 1;
  else if (c->done_rev != c->done_seen_rev) {
    NEWT_WARN(COORD, "ignoring the end marker %s; the job trains on", newt_errmsg());
    c->done_rev = c->done_seen_rev;
  }
  c->done_key[0] = '\0';
}

static void put_ckpt(coord *c, const job_ckpt *ck) {
  metrics_set(c->metrics, "newt_checkpoint_last_step", (double)ck->step);
  /* rank 0 writes the record again at each skipped save: its commit is observed once */
  if (ck->step <= c->ckpt_seen) return;
  c->ckpt_seen = ck->step;
  if (ck->bytes > 0) metrics_set(c->metrics, "newt_checkpoint_bytes", (double)ck->bytes);
  if (ck->save_ms > 0) metrics_observe(c->metrics, "newt_checkpoint_save_duration_seconds", NULL, (double)ck->save_ms / 1e3);
  if (ck->stall_ms > 0) metrics_observe(c->metrics, "newt_checkpoint_stall_seconds", NULL, ck->stall_ms / 1e3);
}

/* --- following the job ------------------------------------------------------------------------ */

/* A record its codec refused counts for nothing; a refused plan is a foreign one, which the
 * leader puts right (coord_restore_records). */
static void refused_locked(coord *c, const job_change *ch) {
  NEWT_WARN(COORD, "ignoring %s", ch->why);
  if (ch->kv->key_len == strlen(c->plan_key) && memcmp(ch->kv->key, c->plan_key, ch->kv->key_len) == 0)
    c->plan_foreign = 1;
}

/* One key of the job changed. Reports and acks count only for the current generation. */
static void apply_locked(coord *c, const job_change *ch) {
  int del = ch->deleted, current = ch->generation == c->plan.generation;
  if (ch->refused) refused_locked(c, ch);
  switch (ch->rec) {
  case JOB_REC_WORKER:
    if (del) coord_drop_member(c, ch->id);
    else put_member(c, ch);
    break;
  case JOB_REC_REPORT:
    if (!del && current) put_report(c, ch);
    break;
  case JOB_REC_ACK: { /* the previous release's own key: proved as a folded one is */
    char key[256];
    if (!del && current &&
        proved(c, job_ack_check(&c->auth, key_of(ch, key, sizeof key), (int64_t)ch->generation, c->plan.secret,
                                sizeof c->plan.secret, &ch->u.ack)))
      put_ack(c, ch, &ch->u.ack);
    break;
  }
  case JOB_REC_PROGRESS:
    if (!del) put_progress(c, &ch->u.progress);
    break;
  case JOB_REC_LINKS: {
    char key[256];
    if (del || proved(c, job_links_check(&c->auth, key_of(ch, key, sizeof key), &ch->u.links)))
      coord_put_links(c, ch->id, del ? NULL : &ch->u.links);
    break;
  }
  case JOB_REC_DONE:
    if (!del) put_done(c, ch);
    break;
  case JOB_REC_PLAN:
    if (!del) take_plan_locked(c, &ch->u.plan);
    break;
  case JOB_REC_SPEC:
    if (!del) take_spec_locked(c, &ch->u.spec);
    break;
  case JOB_REC_CKPT:
    if (!del) put_ckpt(c, &ch->u.ckpt);
    break;
  default: break; /* refused, or a record the leader does not read */
  }
}

/* A resync (the snapshot, a re-read after a compaction or an outage) starts the members,
 * reports and acks again from what it brings; the plan and the clocks stay. */
static void reset_picture_locked(coord *c) {
  c->nmembers = 0;
  newt_strindex_clear(&c->member_ix);
  c->nreports = 0;
  c->nacks = 0;
  newt_strindex_clear(&c->ack_ix);
  c->first_report = 0;
}

void coord_on_batch(void *ud, const job_change *chs, size_t n, int resync) {
  coord *c = ud;
  pthread_mutex_lock(&c->mu);
  if (resync) reset_picture_locked(c);
  c->in_resync = resync;
  for (size_t i = 0; i < n; i++) apply_locked(c, &chs[i]);
  c->in_resync = 0;
  judge_done(c);
  pthread_mutex_unlock(&c->mu);
}

newt_result_t coord_picture_start(coord *c) {
  NEWT_CHECK(job_follow_start(c->etcd, c->o->job, coord_on_batch, NULL, c, job_call_deadline(), &c->follow));
  pthread_mutex_lock(&c->mu);
  c->prog_change = newt_now_ns();
  pthread_mutex_unlock(&c->mu);
  return NEWT_OK;
}

void coord_picture_stop(coord *c) {
  job_follow_free(c->follow);
  c->follow = NULL;
}

/* --- the picture as the policy sees it -------------------------------------------------------- */

/* Workers that joined and stay spares (the layout is no larger with them): an event naming
 * them and why, for `newt run`, `newt status` and the report; posted by coord_decide,
 * outside the lock. Called with mu held. */
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

/* Whether the members not in the plan would make a larger one: the plan they would get
 * (placement included: tensor-parallel groups never span hosts) against the current.
 * Leavers, donors and finishers count for nothing. Called with mu held (from the policy);
 * the answer is kept until the membership or the plan changes. */
static int join_grows_layout(void *ud) {
  coord *c = ud;
  if (c->join_checked_join == c->last_join && c->join_checked_gen == c->plan.generation) return 0;
  plan_member *m = calloc((size_t)(c->nmembers ? c->nmembers : 1), sizeof *m);
  if (!m) return 0;
  policy_view v = coord_view_locked(c);
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

policy_view coord_view_locked(coord *c) {
  uint64_t prog = c->prog_change > c->plan_mono ? c->prog_change : c->plan_mono;
  return (policy_view){.spec = &c->spec,
                       .plan = &c->plan,
                       .members = c->members,
                       .nmembers = c->nmembers,
                       .member_ix = &c->member_ix,
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
                       .progress = c->prog_speed.generation ? &c->prog_speed : NULL,
                       .straggle_min_ms = newt_param_StraggleMinMs(),
                       .join_grows = join_grows_layout,
                       .ud = c};
}
