/* The job as the launcher sees it (run.h): job/view.h's typed changes taken into the run's
 * picture, on the watch's thread, under the run's lock:
 *
 *   progress    the step (it only grows), generation, loss, throughput and world
 *   done        the end marker, when it ends the job (job_done_counts: plausible for the spec,
 *               proved by a rank of the job, no step beyond the job's progress), judged once
 *               its batch is taken in: a rank writes its last step's progress with it
 *   ckpt        each new checkpoint pointer once, into the result (a resync shows the newest
 *               again), and rank 0's count of the saves it skipped
 *   events      queued for the main loop (recoveries.c); a resync does not queue them again:
 *               they were handled when they came
 *
 * Our watch breaking is etcd away (etcd_lost_ms, for the live line and for what waits on
 * etcd) until it delivers again. The plan in force and the end marker are also read
 * directly, decoded the same way (job_change_get). */
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include "common/clock.h"
#include "job/records.h"
#include "launch/run.h"

/* Queues an event for the main loop, a copy of its own: the change's is freed with its batch. */
static void queue_event(run *r, const job_event *e) {
  if (r->nevents == r->cap_events) {
    int cap = r->cap_events ? 2 * r->cap_events : 32;
    job_event *evs = realloc(r->events, (size_t)cap * sizeof *evs);
    if (!evs) return;
    r->events = evs;
    r->cap_events = cap;
  }
  if (job_event_copy(&r->events[r->nevents], e) == NEWT_OK) r->nevents++;
}

static void take_progress(run *r, const job_progress *p) {
  if (r->o->spec.restart) { /* beats: the program's steps come from the step log */
    if (p->step > r->beat) r->beat = p->step;
    r->gen = (int64_t)p->generation;
    r->world = (int)p->world;
    r->dp = (int)p->dp;
    r->progress_t_ms = p->t_ms;
    return;
  }
  if (p->step > r->step) r->step = p->step;
  r->gen = (int64_t)p->generation;
  r->loss = p->loss;
  r->tps = p->tokens_per_s;
  r->world = (int)p->world;
  r->dp = (int)p->dp;
  r->progress_t_ms = p->t_ms;
}

static void take_done(run *r, const job_change *ch) {
  r->done_seen = ch->u.done;
  r->done_seen_rev = ch->kv ? ch->kv->mod_revision : 0;
  r->done_pending = 1;
}

/* The end marker taken when it is the job's end: a forged one (it says the last step while
 * the ranks are at step 12, or it does not prove the job secret) is said once and the job
 * trains on. */
static void judge_done(run *r) {
  if (!r->done_pending || r->done) return;
  r->done_pending = 0;
  char key[256];
  const job_done *d = &r->done_seen;
  if (job_key(key, sizeof key, r->o->spec.job, JOB_REC_DONE, 0, NULL) != NEWT_OK) return;
  if (job_done_counts(d, key, &r->o->spec, &r->auth, r->o->spec.restart ? r->beat : r->step) != NEWT_OK) {
    if (r->done_rev != r->done_seen_rev)
      snprintf(r->done_warn, sizeof r->done_warn, "ignoring the end marker %s; the job trains on", newt_errmsg());
    r->done_rev = r->done_seen_rev;
    return;
  }
  r->done_step = d->step;
  r->done_loss = d->loss;
  r->done_samples = (int64_t)d->samples;
  r->done = 1;
}

static void take_ckpt(launcher_result *res, const job_ckpt *c) {
  /* rank 0's count of the saves it skipped (written again at each skip; a new rank 0 counts
     its own: the count never goes down) */
  if (c->skipped > res->ckpts_skipped) res->ckpts_skipped = c->skipped;
  if (res->nckpts && res->ckpts[res->nckpts - 1].step >= c->step) return;
  launcher_ckpt *n = realloc(res->ckpts, (size_t)(res->nckpts + 1) * sizeof *n);
  if (!n) return;
  res->ckpts = n;
  n[res->nckpts++] =
      (launcher_ckpt){.step = c->step, .bytes = c->bytes, .save_ms = c->save_ms, .stall_ms = c->stall_ms};
}

/* One change into the picture (r->mu held); events are queued unless resync. A deletion, a
 * record its codec refused and the records the launcher does not follow change nothing. */
static void take(run *r, const job_change *ch, int resync) {
  if (ch->deleted) return;
  switch (ch->rec) {
    case JOB_REC_PROGRESS: take_progress(r, &ch->u.progress); break;
    case JOB_REC_DONE: take_done(r, ch); break;
    case JOB_REC_CKPT: take_ckpt(r->res, &ch->u.ckpt); break;
    case JOB_REC_EVENT:
      if (!resync) queue_event(r, &ch->u.event);
      break;
    default: break;
  }
}

static void on_changes(void *ud, const job_change *chs, size_t n, int resync) {
  run *r = ud;
  pthread_mutex_lock(&r->mu);
  for (size_t i = 0; i < n; i++) take(r, &chs[i], resync);
  judge_done(r);
  pthread_mutex_unlock(&r->mu);
}

static void on_health(void *ud, int ok, const char *why) {
  (void)why;
  run *r = ud;
  pthread_mutex_lock(&r->mu);
  r->etcd_lost_ms = ok ? 0 : newt_wall_ms();
  pthread_mutex_unlock(&r->mu);
}

newt_result_t follow_start(run *r, newt_deadline_t d) {
  return job_follow_start(r->etcd, r->o->spec.job, on_changes, on_health, r, d, &r->follow);
}

int follow_etcd_away(run *r) {
  pthread_mutex_lock(&r->mu);
  int away = r->etcd_down || r->etcd_lost_ms;
  pthread_mutex_unlock(&r->mu);
  return away;
}

int64_t follow_etcd_revision(run *r, int64_t wait_ms) {
  /* the newest change of a key the job holds now (an event, the end marker, ...): writes
     outside the job's prefix, in a shared etcd, are no change of ours to wait for */
  rdzv_etcd_range_opts ro = {.prefix = 1, .keys_only = 1};
  rdzv_etcd_kvs kvs;
  if (!r->etcd || rdzv_etcd_range(r->etcd, r->prefix, &ro, newt_deadline_in_ms(wait_ms), &kvs) != NEWT_OK) return -1;
  int64_t rev = 0;
  for (size_t i = 0; i < kvs.n; i++)
    if (kvs.kvs[i].mod_revision > rev) rev = kvs.kvs[i].mod_revision;
  rdzv_etcd_kvs_free(&kvs);
  return rev;
}

int follow_caught_up(run *r, int64_t rev) { return rev < 0 || job_follow_revision(r->follow) >= rev; }

int follow_read_done(run *r, newt_deadline_t d) {
  for (;;) {
    job_change ch;
    newt_deadline_t each = newt_deadline_min(d, newt_deadline_in_ms(2000));
    /* the progress first: a rank writes its last step's with the marker */
    job_change pc;
    if (job_change_get(r->etcd, r->o->spec.job, JOB_REC_PROGRESS, each, &pc) == NEWT_OK) {
      pthread_mutex_lock(&r->mu);
      take(r, &pc, 1);
      pthread_mutex_unlock(&r->mu);
      job_change_free(&pc);
    }
    newt_result_t res = job_change_get(r->etcd, r->o->spec.job, JOB_REC_DONE, each, &ch);
    if (res == NEWT_ERR_INVALID) return 0; /* refused: no end marker the job would take */
    if (res == NEWT_OK) {
      pthread_mutex_lock(&r->mu);
      take(r, &ch, 1);
      r->done_seen_rev = -1; /* read directly: said as the watch's */
      judge_done(r);
      int done = r->done;
      pthread_mutex_unlock(&r->mu);
      job_change_free(&ch);
      return done;
    }
    if (res == NEWT_ERR_NOTFOUND || newt_deadline_passed(d)) return 0;
    newt_sleep_ms(100);
  }
}

newt_plan *follow_plan(run *r, newt_plan *buf) {
  job_change ch;
  if (follow_etcd_away(r) ||
      job_change_get(r->etcd, r->o->spec.job, JOB_REC_PLAN, newt_deadline_in_ms(2000), &ch) != NEWT_OK)
    return NULL;
  *buf = ch.u.plan; /* its arrays are the caller's now */
  return buf;
}
