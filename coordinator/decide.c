/* The leader's decision, every tick: the policy (policy.c, a pure function) looks at the
 * picture, and this acts on what it says -- the spares said, the budget checked, the
 * excluded fenced and held out, the next plan published, or the current generation's
 * recovery recorded once every rank acknowledged it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/strutil.h"
#include "coordinator/coord.h"

/* Says, once per generation, which ranks' registrations vanished while steps went on (the
 * progress record: written by the lowest rank that reaches etcd): alive, cut from etcd, not
 * fenced. Called with mu held. */
static void say_alive_locked(coord *c) {
  char names[256] = "";
  for (int k = 0; k < c->plan.nranks; k++)
    if (coord_find_member(c, c->plan.ranks[k].worker) < 0) newt_list_add(names, sizeof names, c->plan.ranks[k].worker);
  c->said_alive = 1;
  NEWT_INFO(COORD, "generation %llu: the registration of %s vanished, but steps went on since (step %lld): alive "
            "(cut from etcd?), nothing replanned", (unsigned long long)c->plan.generation, names[0] ? names : "a rank",
            (long long)c->prog_step);
}

/* Workers that joined and stay spares, as join_grows_layout found them (picture.c). */
static void say_spares(coord *c, job_event *spare) {
  if (spare->type == JOB_EV_SPARE) {
    NEWT_INFO(COORD, "%d worker%s stay%s spare: %s", spare->nspare_ids, spare->nspare_ids == 1 ? "" : "s",
              spare->nspare_ids == 1 ? "s" : "", spare->why);
    coord_post_event(c, spare);
  }
  job_event_free(spare);
}

static void say_partition(const coord *c, const policy_decision *d) {
  char names[256] = "";
  for (int i = 0; i < d->nexclude; i++) newt_list_add(names, sizeof names, d->exclude[i]);
  if (d->partition == POLICY_PARTITION_BUILD)
    NEWT_WARN(COORD, "generation %llu never formed and every rank is named by most of the others (a partition no "
              "majority explains): the largest side goes on; left out: %s", (unsigned long long)c->plan.generation,
              names);
  else
    NEWT_WARN(COORD, "generation %llu failed and ranks that reported it are named by most of the others (cut off "
              "from them on the data plane): the largest side goes on; left out: %s",
              (unsigned long long)c->plan.generation, names);
}

/* What the reports of the generation say of id, in words: the others' connections to it
 * closed (its process ended: a crash, a kill; or its host closed them), it answered nobody
 * by the deadline (stopped, hung, or a cut link), or a build could not take it in. Whether
 * it is alive no report can say. Called with mu held. */
static void lost_how(const policy_view *v, const char *id, int build, char *out, size_t cap) {
  int crash = 0, hang = 0;
  for (int i = 0; i < v->nreports; i++)
    for (int k = 0; k < v->reports[i].naccuse; k++)
      if (strcmp(v->reports[i].accuse[k], id) == 0 && !v->reports[i].build) v->reports[i].hang ? hang++ : crash++;
  if (build)
    snprintf(out, cap, "the build of the generation could not take it in (its links were not made)");
  else if (crash && !hang)
    snprintf(out, cap, "the others' connections to it closed (%d report%s: its process ended -- a crash, a kill -- "
             "or its host closed them)", crash, crash == 1 ? "" : "s");
  else if (hang && !crash)
    snprintf(out, cap, "it answered none of the others by the deadline (%d report%s: stopped, hung, or a cut link)",
             hang, hang == 1 ? "" : "s");
  else if (hang)
    snprintf(out, cap, "the others lost it (%d saw its connections close, %d no answer by the deadline)", crash, hang);
  else
    snprintf(out, cap, "the others lost it (no report says how)");
}

/* A worker fenced alive (a build could not take it in, it was on another side of a
 * partition or cut, it stopped or hung) registers again at once: held out until its links to
 * the ranks of a later plan work (coord_put_links), so that no generation is tried with it first
 * -- a cut link would fail that build. */
static void fence_excluded(coord *c, const policy_decision *d) {
  for (int i = 0; d->fence && i < d->nexclude; i++) {
    pthread_mutex_lock(&c->mu);
    int present = coord_find_member(c, d->exclude[i]) >= 0;
    policy_view now = coord_view_locked(c); /* the reports as they are now: the watch may have moved them */
    int build = present && policy_blames_build(&now, d->exclude[i]);
    char known[200];
    lost_how(&now, d->exclude[i], build, known, sizeof known);
    pthread_mutex_unlock(&c->mu);
    if (present) coord_hold_out(c, d->exclude[i], build, known);
    if (present) coord_fence(c, d->exclude[i]);
  }
}

/* No layout fits the live members: said once (a log line, an event) until a plan is made. */
static void say_waiting(coord *c, const char *cause) {
  if (c->waiting_logged) return;
  NEWT_WARN(COORD, "cannot plan (%s): %s", cause, newt_errmsg());
  job_event ev = {.type = JOB_EV_WAITING};
  snprintf(ev.why, sizeof ev.why, "%s", newt_errmsg());
  coord_post_event(c, &ev);
  c->waiting_logged = 1;
  snprintf(c->waiting_why, sizeof c->waiting_why, "%s", newt_errmsg());
}

/* Why the shares change, in the log: the ranks off the median's speed the progress says. */
static void say_straggle(coord *c) {
  pthread_mutex_lock(&c->mu);
  job_progress pr = c->prog_speed;
  char ranks[512] = "";
  for (int i = 0; i < pr.nslow && i < JOB_SLOW_MAX; i++) {
    const char *who = "?";
    for (int k = 0; k < c->plan.nranks; k++)
      if (c->plan.ranks[k].dp == pr.slow[i].dp && c->plan.ranks[k].tp == 0 && c->plan.ranks[k].pp == 0)
        who = c->plan.ranks[k].worker;
    size_t at = strlen(ranks);
    snprintf(ranks + at, sizeof ranks - at, "%s%s (dp %d) %.0f us, %.2fx", at ? ", " : "", who, pr.slow[i].dp,
             pr.slow[i].us, pr.slow[i].us / pr.sample_us);
  }
  pthread_mutex_unlock(&c->mu);
  NEWT_INFO(COORD, "generation %llu: a rank's compute stayed off the median rank's for %lld steps (%lld ms); compute "
            "per sample: the median %.0f us%s%s: the shares follow the speeds", (unsigned long long)pr.generation,
            (long long)pr.straggle, (long long)pr.straggle_ms, pr.sample_us, ranks[0] ? "; " : ", no rank off it",
            ranks);
}

/* Replans for cause, as d says. */
static newt_result_t act(coord *c, const policy_decision *d, const char *cause, uint64_t join_seen) {
  if (d->partition) say_partition(c, d);
  if (d->reason == POLICY_REBALANCE) say_straggle(c);
  /* a join's recovery starts at the joiner's registration, the others' at the decision (or
     the reports' first detection: coord_replan) */
  if (!c->t_trigger) c->t_trigger = d->reason == POLICY_JOIN && join_seen ? join_seen : newt_wall_ms();
  fence_excluded(c, d);
  int no_layout;
  newt_result_t r = coord_replan(c, cause, d->at_boundary ? "boundary" : "abort", d->exclude, d->nexclude, &no_layout);
  if (no_layout) {
    say_waiting(c, cause);
    r = NEWT_OK;
  }
  return r;
}

newt_result_t coord_decide(coord *c) {
  policy_decision d;
  pthread_mutex_lock(&c->mu);
  metrics_set(c->metrics, "newt_workers", (double)c->nmembers);
  coord_held_refresh_locked(c);
  policy_view v = coord_view_locked(c);
  newt_result_t r = policy_decide(&v, &d);
  c->first_member = d.first_member;
  c->first_gone = d.first_gone;
  if (d.gone_alive && !c->said_alive) say_alive_locked(c);
  job_event spare = c->spare_ev;
  memset(&c->spare_ev, 0, sizeof c->spare_ev);
  uint64_t join_seen = c->join_seen_ms;
  pthread_mutex_unlock(&c->mu);
  say_spares(c, &spare);
  if (r != NEWT_OK) return r;

  const char *cause = policy_cause(d.reason);
  if (cause && !coord_budget_spent(c, cause)) r = act(c, &d, cause, join_seen);
  else if (!cause && c->plan_mono && !c->recorded) coord_record_recovery(c);
  policy_decision_free(&d);
  return r;
}
