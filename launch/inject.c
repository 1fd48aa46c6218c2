/* Chaos (run.h): each action's fire and mend functions, which chaos.c's table names and calls
 * when the job reaches an item's step: signals to processes, a host's workers at once, a
 * network namespace cut or slowed, workers started, etcd stopped, wiped or a member killed.
 * Each fault is recorded with the wall time it was injected, for the recovery that answers it
 * (recoveries.c). Cuts are mended and etcd's faults undone when their time or step comes; an
 * etcd fault is a recovery of its own, recorded once training's progress reaches etcd again. */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/strutil.h"
#include "job/store.h"
#include "launch/run.h"

/* A fault fired now, recorded for the recovery that answers it (NULL: out of memory). */
static fault *add_fault(run *r, const chaos_event *e, const char *what) {
  fault *f = realloc(r->faults, (size_t)(r->nfaults + 1) * sizeof *f);
  if (!f) return NULL;
  r->faults = f;
  f = &r->faults[r->nfaults++];
  memset(f, 0, sizeof *f);
  f->ev = *e;
  snprintf(f->what, sizeof f->what, "%s", what);
  f->t_ms = newt_wall_ms();
  return f;
}

/* A worker fault that lands on a spare (a worker the plan in force does not make a rank)
 * costs no rank and answers no recovery: says so, and returns 1. */
static int lands_on_spare(run *r, const newt_plan *plan, const char *what, const char *name) {
  if (!plan || plan_find(plan, name)) return 0;
  if (!r->o->quiet)
    fprintf(stderr, "%snewt run: chaos: %s lands on %s, a spare of plan %llu (%s): no rank is lost, training goes on\n",
            live_news(r), what, name, (unsigned long long)plan->generation,
            plan_is_spare(plan, name) && plan->spare_why[0] ? plan->spare_why : "it joined after the plan");
  return 1;
}

static int signal_of(chaos_action a) {
  switch (a) {
    case CHAOS_KILL: return SIGKILL;
    case CHAOS_STOP: return SIGSTOP;
    case CHAOS_TERM: return SIGTERM;
    default: return SIGCONT;
  }
}

/* kill:host:I: every live worker of simulated host I, SIGKILL back to back (a node lost as a
 * unit); one fault, answered by one recovery, unless every one of them was a spare. */
int inject_fire_host(run *r, const chaos_event *e, const newt_plan *plan, const char *what) {
  if (r->o->hosts <= 0 || e->index >= r->o->hosts) {
    fprintf(stderr, "%snewt run: chaos %s: there is no simulated host %d (--hosts %d)\n", live_news(r), what, e->index,
            r->o->hosts);
    return 0;
  }
  pid_t pids[1024];
  int n = 0, ranks = 0;
  char names[512] = "";
  for (int i = 0; i < r->nprocs && n < (int)(sizeof pids / sizeof pids[0]); i++) {
    proc *p = &r->procs[i];
    if (!p->alive || p->kind != PROC_WORKER || p->host != e->index) continue;
    p->killed_by_chaos = 1;
    pids[n++] = p->pid;
    ranks += !plan || plan_find(plan, p->name) != NULL;
    newt_list_add(names, sizeof names, p->name);
  }
  if (n == 0) {
    fprintf(stderr, "%snewt run: chaos %s: no worker of host%d is running\n", live_news(r), what, e->index);
    return 0;
  }
  fault *f = add_fault(r, e, what);
  for (int i = 0; i < n; i++) kill(pids[i], SIGKILL); /* nothing between them: the host goes at once */
  if (ranks == 0) { /* every one a spare of the plan in force: no rank is lost */
    if (f) f->matched = 1;
    if (!r->o->quiet)
      fprintf(stderr, "%snewt run: chaos: %s kills %s, spares of plan %llu: no rank is lost, training goes on\n",
              live_news(r), what, names, (unsigned long long)plan->generation);
    return 0;
  }
  if (!r->o->quiet)
    fprintf(stderr, "%snewt run: chaos: %s (host%d: %s, %d worker%s at once)\n", live_news(r), what, e->index, names, n,
            n == 1 ? "" : "s");
  return 0;
}

/* cut:... / cut-etcd:...: the target's namespace cut (netns_cut), to be mended after arg ms
 * or at until_step (inject_mend_cuts). A cut of the data plane is a worker fault a recovery
 * answers (the others lose the cut-off ranks), unless no rank is there; a cut from etcd
 * answers none (the job goes on as it is: docs/elastic.md, "etcd away"). */
/* The live process a worker target names (worker:I, or rank:R of plan), or NULL after saying
 * why not (it is not running, or the plan has no such rank). */
static proc *target_proc(run *r, const chaos_event *e, const newt_plan *plan, const char *what) {
  char name[RDZV_NAME_MAX] = "";
  if (!e->by_rank) snprintf(name, sizeof name, "w%d", e->index);
  else if (plan && e->index < plan->nranks) snprintf(name, sizeof name, "%s", plan->ranks[e->index].worker);
  proc *p = name[0] ? procs_find(r, name) : NULL;
  if (!p || !p->alive) {
    fprintf(stderr, "%snewt run: chaos %s: %s\n", live_news(r), what, name[0] ? "not running" : "no such rank now");
    return NULL;
  }
  return p;
}

int inject_fire_cut(run *r, const chaos_event *e, const newt_plan *plan, const char *what) {
  int host = e->target == CHAOS_HOST ? e->index : -1;
  if (e->target != CHAOS_HOST) {
    proc *p = target_proc(r, e, plan, what);
    if (!p) return 0;
    host = p->nshost;
  }
  netns_link link = e->action == CHAOS_CUT ? NETNS_PEERS : NETNS_ETCD;
  int slow = e->action == CHAOS_SLOW;
  if ((slow ? netns_slow(r->net, host, e->kbit) : netns_cut(r->net, host, link, 1)) != NEWT_OK) {
    fprintf(stderr, "%snewt run: chaos %s: %s\n", live_news(r), what, newt_errmsg());
    return 0;
  }
  char names[256] = "";
  int ranks = 0;
  for (int i = 0; i < r->nprocs; i++) {
    const proc *p = &r->procs[i];
    if (!p->alive || p->kind != PROC_WORKER || p->nshost != host) continue;
    newt_list_add(names, sizeof names, p->name);
    ranks += !plan || plan_find(plan, p->name) != NULL;
  }
  fault *f = add_fault(r, e, what);
  if (f && ranks == 0) f->matched = 1; /* no rank lost: no recovery is to answer it (nor ever one a cut from etcd:
                                          its row says so; a slow link, only when it stalls its ranks) */
  if (e->arg || e->until_step) {
    cut *c = realloc(r->cuts, (size_t)(r->ncuts + 1) * sizeof *c);
    if (c) {
      r->cuts = c;
      c = &r->cuts[r->ncuts++];
      *c = (cut){.host = host, .slow = slow, .link = link, .until_step = e->until_step,
                 .at = e->arg ? newt_now_ns() + (uint64_t)e->arg * 1000000ull : 0};
      snprintf(c->what, sizeof c->what, "%s", what);
    }
  }
  if (!r->o->quiet)
    fprintf(stderr, "%snewt run: chaos: %s (the namespace of %s %s)\n", live_news(r), what,
            names[0] ? names : "no worker",
            slow                 ? "on a slow link with a short queue: slow and lossy"
            : link == NETNS_PEERS ? "cut from every other host: a partition of the data plane"
                                  : "cut from etcd and the coordinators");
  return 0;
}

/* A data-plane cut or slow link mended: the workers it left out (alive, no rank of the plan
 * in force) come back as joiners, so the mend is a fault their joins answer (join_answers), as a
 * woken worker's cont is. */
static void note_mend(run *r, const cut *c) {
  newt_plan buf, *plan = follow_plan(r, &buf);
  int n = 0;
  char (*back)[RDZV_NAME_MAX] = calloc((size_t)(r->nprocs ? r->nprocs : 1), sizeof *back);
  for (int i = 0; back && i < r->nprocs; i++) {
    const proc *p = &r->procs[i];
    /* without a plan to look at (etcd away), those of the cut host */
    int out = plan ? !plan_find(plan, p->name) : p->nshost == c->host;
    if (p->alive && p->kind == PROC_WORKER && out) snprintf(back[n++], RDZV_NAME_MAX, "%s", p->name);
  }
  if (plan) plan_free(plan);
  chaos_event ev = {.action = CHAOS_CUT, .target = CHAOS_HOST, .index = c->host};
  char what[64];
  snprintf(what, sizeof what, "%.50s mended", c->what);
  fault *f = n ? add_fault(r, &ev, what) : NULL;
  if (!f) {
    free(back);
    return;
  }
  f->answer = CHAOS_ANSWER_JOINERS;
  f->back = back;
  f->nback = n;
}

void inject_mend_cuts(run *r, int64_t step) {
  uint64_t now = newt_now_ns();
  for (int i = 0; i < r->ncuts;) {
    cut *c = &r->cuts[i];
    if (c->at ? now < c->at : step < c->until_step) {
      i++;
      continue;
    }
    if ((c->slow ? netns_slow(r->net, c->host, 0) : netns_cut(r->net, c->host, c->link, 0)) != NEWT_OK) {
      fprintf(stderr, "%snewt run: chaos %s: cannot mend it: %s\n", live_news(r), c->what, newt_errmsg());
    } else {
      if (!r->o->quiet) fprintf(stderr, "%snewt run: chaos: %s mended\n", live_news(r), c->what);
      if (c->slow || c->link == NETNS_PEERS) note_mend(r, c); /* a slow link may have left its workers out too */
    }
    r->cuts[i] = r->cuts[--r->ncuts];
  }
}

/* join:N: N new workers, answered by the plans that take them in (or the spare events that
 * say they stay out). */
int inject_fire_join(run *r, const chaos_event *e, const newt_plan *plan, const char *what) {
  (void)plan;
  int first = r->next_worker;
  for (int64_t k = 0; k < e->arg; k++)
    if (procs_spawn(r, PROC_WORKER, r->next_worker++) != NEWT_OK)
      fprintf(stderr, "newt run: chaos %s: %s\n", what, newt_errmsg());
  fault *f = add_fault(r, e, what);
  if (f) f->join_first = first;
  return 1;
}

/* The whole etcd stopped or paused, or a member killed or paused (the private etcd only),
 * until inject_etcd_tick undoes it. 1 when it was done. */
int inject_fire_etcd(run *r, const chaos_event *e, const newt_plan *plan, const char *what) {
  (void)plan;
  newt_result_t res = NEWT_OK;
  if (!r->server)
    res = NEWT_ERR(NEWT_ERR_UNSUPPORTED, "chaos on etcd needs the private etcd (no --etcd)");
  else if (e->index >= rdzv_etcd_server_members(r->server))
    res = NEWT_ERR(NEWT_ERR_INVALID, "etcd has %d members, there is no member %d (--etcd-members)",
                   rdzv_etcd_server_members(r->server), e->index);
  else if (r->etcd_down)
    res = NEWT_ERR(NEWT_ERR_INVALID, "an etcd fault is still in progress");
  else if (e->index >= 0)
    res = e->action == CHAOS_KILL ? rdzv_etcd_server_member_kill(r->server, e->index)
                                  : rdzv_etcd_server_member_pause(r->server, e->index);
  else
    res = e->action == CHAOS_STOP ? rdzv_etcd_server_pause(r->server) : rdzv_etcd_server_stop(r->server, 0);
  if (res != NEWT_OK) {
    fprintf(stderr, "%snewt run: chaos %s: %s\n", live_news(r), what, newt_errmsg());
    return 0;
  }
  fault *f = add_fault(r, e, what);
  r->etcd_down = 1;
  r->etcd_ev = *e;
  r->etcd_back_ms = 0;
  r->etcd_up_at = e->until_step || (e->index >= 0 && e->arg == 0) ? 0 : newt_now_ns() + (uint64_t)e->arg * 1000000ull;
  r->etcd_fault = f ? (int)(f - r->faults) : -1;
  return 1;
}

/* The name of the process a signal acts on: w<I>, the worker that is rank R of the plan in
 * force, c<I>, or the leader. 0 (and said why) where there is none. */
static int target_name(run *r, const chaos_event *e, const newt_plan *plan, const char *what, char *name, size_t cap) {
  name[0] = '\0';
  if (e->target == CHAOS_COORDINATOR && e->index < 0) {
    if (job_leader_get(r->etcd, r->o->spec.job, newt_deadline_in_ms(2000), name, cap, NULL) == NEWT_OK) return 1;
    fprintf(stderr, "newt run: chaos %s: no leader to act on (%s)\n", what, newt_errmsg());
    return 0;
  }
  if (e->target == CHAOS_COORDINATOR) snprintf(name, cap, "c%d", e->index);
  else if (!e->by_rank) snprintf(name, cap, "w%d", e->index);
  else if (plan && e->index < plan->nranks) snprintf(name, cap, "%s", plan->ranks[e->index].worker);
  if (name[0]) return 1;
  fprintf(stderr, "newt run: chaos %s: no rank %d in the current plan\n", what, e->index);
  return 0;
}

/* kill, stop, term or cont of a worker or a coordinator. A woken worker comes back as a
 * joiner (cont answers a join); a fault on a spare answers nothing. 1 when it was sent and
 * is not a spare's (lands_on_spare says that one). */
int inject_fire_signal(run *r, const chaos_event *e, const newt_plan *plan, const char *what) {
  char name[RDZV_NAME_MAX];
  if (!target_name(r, e, plan, what, name, sizeof name)) return 0;
  proc *p = procs_find(r, name);
  if (!p) {
    fprintf(stderr, "newt run: chaos %s: no such process\n", what);
    return 0;
  }
  if (!p->alive) {
    fprintf(stderr, "newt run: chaos %s: %s is not running\n", what, p->name);
    return 0;
  }
  if (e->action == CHAOS_KILL) p->killed_by_chaos = 1;
  fault *f = add_fault(r, e, what);
  kill(p->pid, signal_of(e->action));
  int spare = p->kind == PROC_WORKER && e->action != CHAOS_CONT && lands_on_spare(r, plan, what, p->name);
  if (f && spare) f->matched = 1;
  return !spare;
}

/* flip: armed in the workers at their start (procs.c), so the rank flips it itself, at that
 * step; said, no fault recorded. */
int inject_fire_flip(run *r, const chaos_event *e, const newt_plan *plan, const char *what) {
  (void)plan;
  if (!r->o->quiet)
    fprintf(stderr, "%snewt run: chaos: %s (rank %d flipped a bit of %s after step %lld, as armed)\n", live_news(r),
            what, e->index, e->tensor[0] ? e->tensor : "its first replicated part", (long long)e->step);
  return 0;
}

/* Undoes the etcd fault in force once its time or step has come: the store started, resumed
 * or refilled (one that cannot be brought back is given up on: etcd_down cleared). */
static void etcd_back(run *r) {
  const chaos_event *e = &r->etcd_ev;
  pthread_mutex_lock(&r->mu);
  int until_reached = e->until_step && r->step >= e->until_step;
  pthread_mutex_unlock(&r->mu);
  if (r->etcd_back_ms || !((r->etcd_up_at && newt_now_ns() >= r->etcd_up_at) || until_reached)) return;
  newt_deadline_t d = newt_deadline_in_ms(30000);
  newt_result_t res = e->index >= 0 ? (e->action == CHAOS_KILL ? rdzv_etcd_server_member_restart(r->server, e->index, d)
                                                              : rdzv_etcd_server_member_resume(r->server, e->index))
                      : e->action == CHAOS_STOP ? rdzv_etcd_server_resume(r->server)
                      : e->action == CHAOS_WIPE ? rdzv_etcd_server_wipe(r->server, d)
                                                : rdzv_etcd_server_restart(r->server, d);
  if (res != NEWT_OK) {
    fprintf(stderr, "%snewt run: bringing etcd back: %s\n", live_news(r), newt_errmsg());
    r->etcd_down = 0;
    return;
  }
  r->etcd_back_ms = newt_wall_ms();
  if (!r->o->quiet)
    fprintf(stderr, "%snewt run: etcd %s\n", live_news(r),
            e->index >= 0 ? "has all its members again" : e->action == CHAOS_WIPE ? "serves again, empty" : "serves again");
}

void inject_etcd_tick(run *r, int64_t step) {
  (void)step;
  if (!r->etcd_down) return;
  etcd_back(r);
  if (!r->etcd_down) return; /* it could not be brought back */
  if (r->etcd_fault < 0) {
    r->etcd_down = r->etcd_back_ms == 0;
    return;
  }
  fault *f = &r->faults[r->etcd_fault];
  /* training's progress must reach etcd after it came back (after the fault, for a member
     left dead, or one still away when the job's end marker reached the others: they served
     all along) */
  int for_good = !r->etcd_up_at && !r->etcd_ev.until_step; /* a member left dead */
  uint64_t since = r->etcd_back_ms ? r->etcd_back_ms : for_good || r->done ? f->t_ms : 0;
  if (!since || (r->progress_t_ms < since && !r->done)) return;
  r->etcd_down = 0;
  f->matched = 1;
  launcher_recovery *rec = recoveries_add_unplanned(r, "etcd", f);
  if (!rec) return;
  uint64_t reached = r->progress_t_ms >= since ? r->progress_t_ms : newt_wall_ms(); /* or the end marker */
  rec->outage_ms = r->etcd_back_ms ? run_ms_between(r->etcd_back_ms, f->t_ms) : 0;
  rec->pause_ms = rec->resumed_ms = -1; /* from the step log, at the end */
  rec->detect_ms = rec->outage_ms;
  rec->total_ms = run_ms_between(reached, f->t_ms);
  if (!r->o->quiet && !r->etcd_back_ms && !for_good)
    fprintf(stderr, "%snewt run: the job ended while etcd's fault (%s) lasted; training went on\n", live_news(r),
            f->what);
  else if (!r->o->quiet)
    fprintf(stderr, "%snewt run: etcd was away for %lld ms; training went on, %lld ms until progress reached it again\n",
            live_news(r), (long long)rec->outage_ms, (long long)rec->total_ms);
}

/* --- slowcpu: a worker's CPU time cut down ------------------------------------------------------ */

#define THROTTLE_PERIOD_US 20000 /* one stop/continue cycle: short beside a step of milliseconds */

/* The throttle: in every period of THROTTLE_PERIOD_US the target runs percent of it and is
 * stopped for the rest, so that it does percent of the work it would do otherwise, whether the
 * machine's CPUs are idle or crowded: a GPU throttled to a fraction of its clock. (A cgroup's
 * cpu.max is a quota of a CPU, which slows nothing on a crowded machine where the worker gets
 * less than the quota anyway; and a share of its peers' CPU time feeds back on itself, as they
 * wait for it.) Left running at the end. */
static void *duty_cycle(void *arg) {
  throttle *t = arg;
  uint64_t run_us = (uint64_t)THROTTLE_PERIOD_US * (uint64_t)t->percent / 100u;
  while (!atomic_load(&t->stop)) {
    if (kill(t->pid, SIGCONT) != 0) break; /* it is gone */
    newt_sleep_us(run_us);
    if (atomic_load(&t->stop) || kill(t->pid, SIGSTOP) != 0) break;
    newt_sleep_us(THROTTLE_PERIOD_US - run_us);
  }
  kill(t->pid, SIGCONT);
  return NULL;
}

int inject_fire_slowcpu(run *r, const chaos_event *e, const newt_plan *plan, const char *what) {
  proc *p = target_proc(r, e, plan, what);
  if (!p) return 0;
  throttle **list = realloc(r->throttles, (size_t)(r->nthrottles + 1) * sizeof *list), *t = calloc(1, sizeof *t);
  if (list) r->throttles = list;
  if (!list || !t) {
    free(t);
    fprintf(stderr, "%snewt run: chaos %s: out of memory\n", live_news(r), what);
    return 0;
  }
  *t = (throttle){.pid = p->pid, .percent = e->percent, .until_step = e->until_step, .fault = -1,
                  .until_rebalanced = e->until_rebalanced};
  snprintf(t->name, sizeof t->name, "%s", p->name);
  snprintf(t->what, sizeof t->what, "%s", what);
  if (pthread_create(&t->thread, NULL, duty_cycle, t) != 0) {
    free(t);
    fprintf(stderr, "%snewt run: chaos %s: cannot start its throttle\n", live_news(r), what);
    return 0;
  }
  t->has_thread = 1;
  r->throttles[r->nthrottles++] = t;
  fault *f = add_fault(r, e, what);
  if (f) t->fault = r->nfaults - 1;
  if (f && plan && !plan_find(plan, p->name)) f->matched = 1; /* a spare's speed moves no share */
  if (!r->o->quiet)
    fprintf(stderr, "%snewt run: chaos: %s (%s runs %d%% of the time: stopped and continued every %d ms)\n",
            live_news(r), what, p->name, e->percent, THROTTLE_PERIOD_US / 1000);
  return 0;
}

void inject_mend_slowcpu(run *r, int64_t step) {
  for (int i = 0; i < r->nthrottles;) {
    throttle *t = r->throttles[i];
    /* until=rebalanced: until a plan answered it (the fault matched: recoveries.c) */
    int answered = t->until_rebalanced && t->fault >= 0 && t->fault < r->nfaults && r->faults[t->fault].matched;
    if (step >= 0 && !answered && (!t->until_step || step < t->until_step)) {
      i++;
      continue;
    }
    atomic_store(&t->stop, 1);
    if (t->has_thread) pthread_join(t->thread, NULL);
    if (step >= 0) { /* its end is a fault too: the plan that gives its share back answers it */
      chaos_event ev = {.action = CHAOS_SLOWCPU, .target = CHAOS_WORKER, .index = -1};
      char what[64];
      snprintf(what, sizeof what, "%.50s ended", t->what);
      fault *f = add_fault(r, &ev, what);
      if (f) f->answer = CHAOS_ANSWER_REBALANCE;
      if (!r->o->quiet) fprintf(stderr, "%snewt run: chaos: %s (%s has its CPU again)\n", live_news(r), what, t->name);
    }
    free(t);
    r->throttles[i] = r->throttles[--r->nthrottles];
  }
  if (step < 0) {
    free(r->throttles);
    r->throttles = NULL;
  }
}
