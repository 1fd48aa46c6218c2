/* newt status: the state of a job as etcd holds it, for people: what it is doing, the plan,
 * the workers, the recoveries as a table and the newest events, with times relative to now
 * ("12 s ago") and durations ("334 ms"). --watch refreshes it (in place on a terminal) until
 * the job is done; --json prints the same as one JSON object per line (per refresh with
 * --watch). A job with no keys in etcd is an error (exit 1, saying so). --wait-workers N
 * waits until at least N workers are registered (the Helm chart's test hook). Without --etcd
 * (or NEWT_ETCD) a job of a `newt run` of this host is found by its record (launch/runfile.h),
 * which also says how the run ended once its private etcd is gone: a watch ends with the run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cmds.h"
#include "cli/etcd_flags.h"
#include "common/clock.h"
#include "common/json.h"
#include "common/opts.h"
#include "common/secret.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "job/plan.h"
#include "job/records.h"
#include "job/spec.h"
#include "job/view.h"
#include "launch/runfile.h"
#include "rendezvous/rdzv.h"

/* What status shows of a job: the typed picture (job/view.h) and what it derives from it. */
typedef struct status {
  const char *job;
  job_view v;
  int nospace, corrupt, alarms_read; /* etcd's alarms */
  struct spare {
    char id[RDZV_NAME_MAX];
    const char *why; /* into the plan or an event of v */
  } *spares;
  int nspares;
  struct recovery {
    const job_event *e; /* a recovered event of v */
    const job_fault *f; /* the fault newt run noted for its generation (NULL: none) */
    job_recovery_times t;
  } *recs;
  int nrecs;
  const char *state; /* the job's state in a word, as the first line of the text says it */
} status;

static void status_free(status *st) {
  job_view_free(&st->v);
  free(st->spares);
  free(st->recs);
  memset(st, 0, sizeof *st);
}

static int names(char (*ids)[RDZV_NAME_MAX], int n, const char *id) {
  for (int i = 0; i < n; i++)
    if (strcmp(ids[i], id) == 0) return 1;
  return 0;
}

/* Each registered worker that is no rank of the plan, and why: the plan's reason for the
 * spares it names, the newest spare event's for a worker that joined after it. */
static void find_spares(status *st) {
  const job_view *v = &st->v;
  if (!v->plan.generation || !(st->spares = calloc((size_t)v->nworkers + 1, sizeof *st->spares))) return;
  for (int i = 0; i < v->nworkers; i++) {
    const char *id = v->workers[i].id, *why = NULL;
    if (plan_find(&v->plan, id)) continue;
    for (int k = 0; k < v->nevents; k++) /* oldest first: the newest wins */
      if (v->events[k]->type == JOB_EV_SPARE && names(v->events[k]->spare_ids, v->events[k]->nspare_ids, id))
        why = v->events[k]->why;
    if (plan_is_spare(&v->plan, id)) why = v->plan.spare_why;
    struct spare *sp = &st->spares[st->nspares++];
    snprintf(sp->id, sizeof sp->id, "%s", id);
    sp->why = why ? why : "registered after the plan: the leader takes it in when a plan with it is larger";
  }
}

/* Each recovered event with its times as every view gives them (job_recovery_time): from the
 * fault where newt run noted one it injected, else from the first detection. */
static void find_recoveries(status *st) {
  const job_view *v = &st->v;
  if (!(st->recs = calloc((size_t)v->nevents + 1, sizeof *st->recs))) return;
  for (int i = 0; i < v->nevents; i++) {
    const job_event *e = v->events[i];
    if (e->type != JOB_EV_RECOVERED) continue;
    struct recovery *r = &st->recs[st->nrecs++];
    r->e = e;
    for (int k = 0; k < v->nfaults && !r->f; k++)
      if (v->faults[k].generation == e->generation) r->f = &v->faults[k];
    r->t = job_recovery_time(e, r->f ? r->f->t_ms : 0);
  }
}

static void warn_refused(void *ud, const job_change *ch) {
  (void)ud;
  fprintf(stderr, "newt status: ignoring %s\n", ch->why);
}

/* Everything under /newt/<job>/ that status shows. NEWT_ERR_NOTFOUND when the job has no key
 * at all. */
static newt_result_t collect(rdzv_etcd *c, const char *job, status *st) {
  memset(st, 0, sizeof *st);
  st->job = job;
  NEWT_CHECK(job_view_read(c, job, newt_deadline_in_ms(5000), warn_refused, NULL, &st->v));
  find_spares(st);
  find_recoveries(st);
  st->alarms_read = rdzv_etcd_alarms(c, newt_deadline_in_ms(5000), &st->nospace, &st->corrupt) == NEWT_OK;
  const job_view *v = &st->v;
  st->state = v->has_failed ? "failed" : v->has_done ? "done" : v->has_progress ? "running" : v->plan.generation ? "starting"
                                                                                                                   : "waiting";
  return NEWT_OK;
}

/* --- as JSON: each record by its codec, at the edge ------------------------------------------ */

/* A record's JSON text (malloc'd, may be NULL) added to obj under key, or to the array obj
 * when key is NULL. */
static cJSON *add_text(cJSON *obj, const char *key, char *text) {
  cJSON *j = NULL;
  if (text) newt_json_parse(text, strlen(text), key ? key : "record", &j);
  free(text);
  if (!j) return NULL;
  if (key) cJSON_AddItemToObject(obj, key, j);
  else cJSON_AddItemToArray(obj, j);
  return j;
}

static void json_records(cJSON *j, const status *st, int nevents) {
  const job_view *v = &st->v;
  cJSON *workers = cJSON_AddArrayToObject(j, "workers");
  for (int i = 0; i < v->nworkers; i++) {
    char *text = NULL;
    if (job_worker_to_json(&v->workers[i], &text) == NEWT_OK) add_text(workers, NULL, text);
  }
  cJSON *events = cJSON_AddArrayToObject(j, "events");
  for (int i = v->nevents > nevents ? v->nevents - nevents : 0; i < v->nevents; i++)
    add_text(events, NULL, job_event_to_json(v->events[i]));
  /* the single records in their keys' order, as etcd lists them (the previous release's output) */
  if (v->has_ckpt) add_text(j, "ckpt", job_ckpt_to_json(&v->ckpt));
  if (v->has_done) add_text(j, "done", job_done_to_json(&v->done));
  if (v->has_failed) add_text(j, "failed", job_failed_to_json(&v->failed));
  if (v->plan.generation) {
    newt_plan p = v->plan;
    memset(p.secret, 0, sizeof p.secret);
    cJSON *pj = add_text(j, "plan", plan_to_json(&p));
    if (pj) cJSON_DeleteItemFromObject(pj, "secret"); /* never shown */
  }
  if (v->has_progress) add_text(j, "progress", job_progress_to_json(&v->progress));
  if (v->has_spec) add_text(j, "spec", spec_to_json(&v->spec));
}

static cJSON *to_json(const status *st, int nevents) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "job", st->job);
  json_records(j, st, nevents);
  if (st->v.plan.generation) {
    cJSON *spares = cJSON_AddArrayToObject(j, "spares");
    for (int i = 0; i < st->nspares; i++) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "worker", st->spares[i].id);
      cJSON_AddStringToObject(o, "why", st->spares[i].why);
      cJSON_AddItemToArray(spares, o);
    }
  }
  cJSON *recs = cJSON_AddArrayToObject(j, "recoveries");
  for (int i = 0; i < st->nrecs; i++) {
    const struct recovery *r = &st->recs[i];
    cJSON *o = add_text(recs, NULL, job_event_to_json(r->e));
    if (!o) continue;
    job_recovery_times_add(o, &r->t);
    if (r->f && r->t.start == r->f->t_ms) cJSON_AddStringToObject(o, "fault", r->f->what);
  }
  char shown[128];
  if (st->v.leader_rev)
    cJSON_AddStringToObject(j, "leader", newt_str_printable(shown, sizeof shown, st->v.leader.name));
  else
    cJSON_AddNullToObject(j, "leader");
  cJSON *alarms = cJSON_AddArrayToObject(j, "etcd_alarms");
  if (st->nospace) cJSON_AddItemToArray(alarms, cJSON_CreateString("NOSPACE"));
  if (st->corrupt) cJSON_AddItemToArray(alarms, cJSON_CreateString("CORRUPT"));
  cJSON_AddStringToObject(j, "state", st->state);
  return j;
}

/* --- as text --------------------------------------------------------------------------------- */

/* "12 s ago" for a wall-clock stamp in ms ("just now" when it is not in the past). */
static const char *ago(uint64_t now, uint64_t t_ms, char *out, size_t cap) {
  if (!t_ms || t_ms >= now) return snprintf(out, cap, "just now"), out;
  char d[32];
  snprintf(out, cap, "%s ago", newt_fmt_duration((double)(now - t_ms) / 1e3, d, sizeof d));
  return out;
}

static const char *dur(int64_t ms, char *out, size_t cap) { return newt_fmt_duration((double)ms / 1e3, out, cap); }

/* The names, comma-separated between before and after (nothing when there are none). */
static void print_names(FILE *f, const char *before, char (*ids)[RDZV_NAME_MAX], int n, const char *after) {
  if (n <= 0 || !ids) return;
  fputs(before, f);
  for (int i = 0; i < n; i++) fprintf(f, "%s%s", i ? ", " : "", ids[i]);
  fputs(after, f);
}

/* One line about an event, as a person would say it. */
static void describe_event(FILE *f, const job_event *e, const status *st) {
  char d[32];
  switch (e->type) {
  case JOB_EV_LEADER: fprintf(f, "coordinator %s leads", e->coordinator); break;
  case JOB_EV_PLAN:
    fprintf(f, "plan %lld (%s): %lld ranks, dp %lld, %lld spares", (long long)e->generation, e->cause,
            (long long)e->world, (long long)e->dp, (long long)e->spares);
    print_names(f, " (", e->spare_ids, e->nspare_ids, ")");
    print_names(f, "; left out: ", e->excluded, e->nexcluded, "");
    if (e->spares > 0 && e->why[0]) fprintf(f, "; spares because %s", e->why);
    break;
  case JOB_EV_SPARE:
    print_names(f, "", e->spare_ids, e->nspare_ids, e->nspare_ids == 1 ? " joined and stays a spare: " : " joined and stay spares: ");
    fprintf(f, "%s", e->why);
    break;
  case JOB_EV_FENCE: fprintf(f, "fenced worker %s (its lease revoked)", e->worker); break;
  case JOB_EV_WAITING: fprintf(f, "waiting: %s", e->why); break;
  case JOB_EV_ETCD: fprintf(f, "%s", e->why); break;
  case JOB_EV_STARTED:
    fprintf(f, "generation %lld started: %lld ranks, first step %s after the plan", (long long)e->generation,
            (long long)e->world, dur(e->t_step >= e->t_plan && e->t_plan ? (int64_t)(e->t_step - e->t_plan) : 0, d, sizeof d));
    break;
  case JOB_EV_RECOVERED: {
    const struct recovery *r = NULL; /* its times, as the table gives them */
    for (int i = 0; i < st->nrecs && !r; i++)
      if (st->recs[i].e->generation == e->generation) r = &st->recs[i];
    fprintf(f, "recovered from %s in %s: generation %lld, %lld ranks, state from %s; the fault hit at step %lld, "
            "training went on from step %lld, %lld redone", e->cause, r ? dur(r->t.total_ms, d, sizeof d) : "?",
            (long long)e->generation, (long long)e->world, e->restore, (long long)job_event_fault_step(e),
            (long long)e->restore_step, (long long)e->steps_lost);
    break;
  }
  case JOB_EV_DONE: fprintf(f, "done at step %lld, loss %.4f", (long long)e->step, e->loss); break;
  case JOB_EV_FAILED: fprintf(f, "the job failed: %s", e->why); break;
  case JOB_EV_SPEC: fprintf(f, "spec %s", e->why); break;
  case JOB_EV_MISMATCH: fprintf(f, "%s (said by %s)", e->why, e->worker); break;
  default: fprintf(f, "%s", job_event_type_name(e->type)); break;
  }
}

/* The ranks' speeds the progress record carries (docs/elastic.md, "Stragglers"): the median
 * data-parallel rank's compute per sample, those off it by the margin (named by the plan of
 * the same generation), how long one has been off, and the plan's shares. */
static void print_speeds(FILE *f, const job_progress *pr, const newt_plan *plan) {
  if (!(pr->sample_us > 0)) return;
  fprintf(f, "  speeds      %.0f us of compute per sample (the median rank)", pr->sample_us);
  for (int i = 0; i < pr->nslow && i < JOB_SLOW_MAX; i++) {
    const char *who = "?";
    for (int k = 0; plan->generation == pr->generation && k < plan->nranks; k++)
      if (plan->ranks[k].dp == pr->slow[i].dp && plan->ranks[k].tp == 0 && plan->ranks[k].pp == 0)
        who = plan->ranks[k].worker;
    fprintf(f, "%s %s (dp %d) %.0f us, %.2fx", i ? "," : ";", who, pr->slow[i].dp, pr->slow[i].us,
            pr->slow[i].us / pr->sample_us);
  }
  if (pr->straggle > 0)
    fprintf(f, "; a rank off the median for %lld steps (%.1f s)", (long long)pr->straggle, (double)pr->straggle_ms / 1e3);
  if (plan->shares) {
    fprintf(f, "; shares");
    for (int d = 0; d < plan->dp; d++) fprintf(f, "%s%lld", d ? "," : " ", (long long)plan->shares[d]);
  }
  fputc('\n', f);
}

/* The first lines: the state in words, the leader, etcd's alarms, progress, plan, checkpoint. */
static void print_head(FILE *f, const status *st, uint64_t now) {
  const job_view *v = &st->v;
  const newt_plan *plan = &v->plan;
  char a[48];
  fprintf(f, "job %s: ", st->job);
  if (v->has_failed)
    fprintf(f, "FAILED %s: %s\n", ago(now, v->failed.t_ms, a, sizeof a), v->failed.why);
  else if (v->has_done && v->has_spec && v->spec.restart) /* beats: the program's steps are its own */
    fprintf(f, "done (restart mode: every program exited 0) at beat %lld, the program's loss %.4f, %s\n",
            (long long)v->done.step, v->done.loss, ago(now, v->done.t_ms, a, sizeof a));
  else if (v->has_done)
    fprintf(f, "done at step %lld, final loss %.4f, %lld samples, %s\n", (long long)v->done.step, v->done.loss,
            (long long)v->done.samples, ago(now, v->done.t_ms, a, sizeof a));
  else if (v->has_progress && v->has_spec && v->spec.restart)
    fprintf(f, "running (restart mode: the supervisors' beat %lld; the program's steps are in the step log), the "
            "program's loss %.4f\n", (long long)v->progress.step, v->progress.loss);
  else if (v->has_progress && v->has_spec && v->spec.steps > 0)
    fprintf(f, "running, step %lld of %lld (%.0f%%)\n", (long long)v->progress.step, (long long)v->spec.steps,
            100.0 * (double)v->progress.step / (double)v->spec.steps);
  else
    fprintf(f, "%s\n", plan->generation ? "starting: no step yet" : "waiting for a plan");
  char shown[128];
  fprintf(f, "  leader      %s\n", v->leader_rev ? newt_str_printable(shown, sizeof shown, v->leader.name) : "none");
  if (st->nospace)
    fprintf(f, "  etcd        out of space (NOSPACE alarm): it refuses every write until space is freed (etcdctl "
               "compact, defrag, alarm disarm); training goes on, plans and progress wait\n");
  if (st->corrupt) fprintf(f, "  etcd        a member's data is corrupt (CORRUPT alarm): replace that member\n");
  if (v->has_progress && !v->has_done)
    fprintf(f, "  progress    loss %.4f, %.0f tokens/s, world %lld (dp %lld), generation %llu, %s\n", v->progress.loss,
            v->progress.tokens_per_s, (long long)v->progress.world, (long long)v->progress.dp,
            (unsigned long long)v->progress.generation, ago(now, v->progress.t_ms, a, sizeof a));
  if (v->has_progress && !v->has_done) print_speeds(f, &v->progress, plan);
  if (plan->generation)
    fprintf(f, "  plan        generation %llu (%s): %d ranks, dp %d x tp %d x pp %d, accum %lld, %s\n",
            (unsigned long long)plan->generation, plan->cause, plan->nranks, plan->dp, plan->tp, plan->pp,
            (long long)plan->accum, ago(now, plan->created_ms, a, sizeof a));
  if (v->has_ckpt) {
    fprintf(f, "  checkpoint  step %lld in %s", (long long)v->ckpt.step, v->ckpt.dir);
    if (v->ckpt.skipped > 0) /* saves rank 0 skipped, its previous one still being written */
      fprintf(f, " (%lld skipped: the save before was still being written)", (long long)v->ckpt.skipped);
    fputc('\n', f);
  }
}

static void print_recoveries(FILE *f, const status *st, uint64_t now) {
  fprintf(f, "\nrecoveries (%d)%s\n", st->nrecs,
          st->nrecs ? ": each from the fault (newt run's injected one) or else its first detection, to the next "
                      "completed step"
                    : "");
  if (st->nrecs)
    fprintf(f, "  %-3s %-14s %-12s %-4s %-6s %-9s %-9s %-9s %-9s %-9s %-9s %-10s %-9s %-9s %s\n", "#", "WHEN", "CAUSE",
            "GEN", "RANKS", "DETECT", "PLAN", "COMM", "RESTORE", "STEP", "TOTAL", "STATE FROM", "FAULT AT", "WENT ON",
            "REDONE");
  for (int i = 0; i < st->nrecs; i++) {
    const struct recovery *r = &st->recs[i];
    char a[48], dt[32], pl[32], cm[32], rs[32], sp[32], tot[32];
    fprintf(f, "  %-3d %-14s %-12s %-4lld %-6lld %-9s %-9s %-9s %-9s %-9s %-9s %-10s %-9lld %-9lld %lld\n", i + 1,
            ago(now, r->t.start, a, sizeof a), r->e->cause, (long long)r->e->generation, (long long)r->e->world,
            dur(r->t.detect_ms, dt, sizeof dt), dur(r->t.plan_ms, pl, sizeof pl), dur(r->t.comm_ms, cm, sizeof cm),
            dur(r->t.restore_ms, rs, sizeof rs), dur(r->t.step_ms, sp, sizeof sp), dur(r->t.total_ms, tot, sizeof tot),
            r->e->restore, (long long)job_event_fault_step(r->e), (long long)r->e->restore_step,
            (long long)r->e->steps_lost);
  }
}

static void print_text(FILE *f, const status *st, int nevents, uint64_t now) {
  const job_view *v = &st->v;
  print_head(f, st, now);
  fprintf(f, "\nworkers (%d)\n", v->nworkers);
  if (v->nworkers) fprintf(f, "  %-20s %-8s %-10s %-4s %-16s %s\n", "ID", "RANK", "STATE", "GEN", "HOST", "ADDRESS");
  for (int i = 0; i < v->nworkers; i++) {
    const job_worker *w = &v->workers[i];
    const plan_rank *pr = plan_find(&v->plan, w->id);
    char rk[16];
    snprintf(rk, sizeof rk, pr ? "%d" : "spare", pr ? pr->rank : 0);
    fprintf(f, "  %-20s %-8s %-10s %-4lld %-16s %s\n", w->id, rk, w->state, (long long)w->generation, w->host, w->addr);
  }
  if (st->nspares) fprintf(f, "\nspares (%d): registered, not training\n", st->nspares);
  for (int i = 0; i < st->nspares; i++) fprintf(f, "  %-20s %s\n", st->spares[i].id, st->spares[i].why);
  print_recoveries(f, st, now);
  int first = v->nevents > nevents ? v->nevents - nevents : 0;
  if (v->nevents > first) fprintf(f, "\nnewest events\n");
  for (int i = first; i < v->nevents; i++) {
    char b[48];
    fprintf(f, "  %-14s ", ago(now, v->events[i]->t_ms, b, sizeof b));
    describe_event(f, v->events[i], st);
    fputc('\n', f);
  }
}

/* One look at the job, as text or one JSON line; on a terminal with --watch it replaces the
 * last one on the screen. */
static void show(const status *st, int nevents, int json, int watch, int tty) {
  if (json) {
    cJSON *j = to_json(st, nevents);
    char *t = j ? newt_json_print(j) : NULL;
    printf("%s\n", t ? t : "{}");
    free(t);
    cJSON_Delete(j);
  } else {
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m) return;
    print_text(m, st, nevents, newt_wall_ms());
    fclose(m);
    if (watch && tty) printf("\033[H\033[2J"); /* home, clear: the new picture in place */
    fputs(text, stdout);
    if (watch && !tty) putchar('\n');
    free(text);
  }
  fflush(stdout);
}

/* --- a newt run job, found by its record (launch/runfile.h) ----------------------------------- */

typedef struct found {
  int have; /* the etcd is the one a newt run recorded for the job */
  runfile rec;
  char path[700];
} found;

/* Whether the run of the record is over, the record read again: it said how it ended, or its
 * process is gone (a newer run of the name took the record, or none is left). */
static int run_over(found *f) {
  runfile now;
  if (runfile_read(f->rec.job, &now, NULL, 0) == NEWT_OK && now.pid == f->rec.pid &&
      now.t_start_ms == f->rec.t_start_ms)
    f->rec = now;
  return runfile_over(&f->rec);
}

/* The end of a run whose etcd ended with it, as its record says it: status's last word (the
 * watch's too). 0 when the record says how it ended, 1 when its process went without a word. */
static int say_run_over(const runfile *rf, int json) {
  char a[48], reason[512];
  newt_str_printable(reason, sizeof reason, rf->reason);
  int done = rf->ended && strcmp(rf->outcome, "done") == 0;
  if (json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "job", rf->job);
    cJSON *e = cJSON_AddObjectToObject(j, "run_ended");
    cJSON_AddStringToObject(e, "outcome", rf->ended ? rf->outcome : "gone");
    cJSON_AddStringToObject(e, "reason", reason);
    newt_json_add_int(e, "steps", rf->steps);
    cJSON_AddNumberToObject(e, "loss", rf->loss);
    cJSON_AddStringToObject(e, "log_dir", rf->log_dir);
    int failed = rf->ended && strcmp(rf->outcome, "failed") == 0;
    cJSON_AddStringToObject(j, "state", done ? "done" : failed ? "failed" : "ended");
    char *t = newt_json_print(j);
    printf("%s\n", t ? t : "{}");
    free(t);
    cJSON_Delete(j);
  } else if (!rf->ended) {
    printf("job %s: its newt run (pid %lld) is gone without saying how it ended (killed?), and its etcd with it; "
           "the run's files are in %s\n", rf->job, (long long)rf->pid, rf->log_dir);
  } else {
    printf("job %s: ", rf->job);
    if (done) printf("done at step %lld, final loss %.4f", (long long)rf->steps, rf->loss);
    else if (strcmp(rf->outcome, "failed") == 0) printf("FAILED at step %lld: %s", (long long)rf->steps, reason);
    else if (reason[0]) printf("%s", reason); /* "interrupted by SIGINT at step 12", ... */
    else printf("%s at step %lld", rf->outcome, (long long)rf->steps);
    printf(" (its newt run ended %s, and its etcd with it)\n", ago(newt_wall_ms(), rf->t_end_ms, a, sizeof a));
    /* a report where newt run offers one: a run that made steps and was not cut short */
    if (done || (rf->steps > 0 && strcmp(rf->outcome, "interrupted") != 0))
      printf("  the run's report: newt report %s\n", rf->log_dir);
    else
      printf("  the run's files are in %s\n", rf->log_dir);
  }
  fflush(stdout);
  return rf->ended ? 0 : 1;
}

/* The etcd of a newt run job when no --etcd (nor NEWT_ETCD) names one: its record's endpoint,
 * user and files. The password is read with a secret file's checks (newt_secret_read). 0: go
 * on (f->have says whether a record was found); else the exit status. */
static int find_run(cli_etcd_flags *ef, found *f, char **password) {
  memset(f, 0, sizeof *f);
  if (cli_etcd_given(ef) || !ef->job || newt_check_name("--job", ef->job) != NEWT_OK) return 0;
  newt_result_t r = runfile_read(ef->job, &f->rec, f->path, sizeof f->path);
  if (r == NEWT_ERR_NOTFOUND) return 0;
  if (r != NEWT_OK) {
    fprintf(stderr, "newt status: %s\n", newt_errmsg());
    return 1;
  }
  f->have = 1;
  ef->endpoints = f->rec.etcd;
  ef->user = ef->password_file = NULL; /* read below, with the checks of a secret */
  ef->ca = f->rec.ca[0] ? f->rec.ca : NULL;
  ef->cert = f->rec.cert[0] ? f->rec.cert : NULL;
  ef->key = f->rec.key[0] ? f->rec.key : NULL;
  if (!f->rec.user[0] || (f->rec.private_etcd && runfile_over(&f->rec))) return 0;
  unsigned char *pw = NULL;
  size_t len = 0;
  if (newt_secret_read(f->rec.password_file, &pw, &len) != NEWT_OK) {
    fprintf(stderr, "newt status: the etcd password of job %s's newt run (recorded in %s): %s\n", ef->job, f->path,
            newt_errmsg());
    return 1;
  }
  while (len > 0 && (pw[len - 1] == '\n' || pw[len - 1] == '\r')) len--;
  *password = malloc(len + 1);
  if (*password) {
    memcpy(*password, pw, len);
    (*password)[len] = '\0';
  }
  newt_secret_free(pw, len);
  if (!*password) {
    fprintf(stderr, "newt status: out of memory\n");
    return 1;
  }
  return 0;
}

/* newt status's flags */
typedef struct status_flags {
  cli_etcd_flags ef;
  int json, watch;
  int64_t wait_workers, timeout, nevents, interval, etcd_wait;
} status_flags;

/* The flags parsed into f and checked; -1 to go on, else the exit status. */
static int parse_flags(int argc, char **argv, status_flags *f) {
  *f = (status_flags){.timeout = -1, .nevents = 10, .interval = 1000, .etcd_wait = 60000};
  cli_etcd_flags_init(&f->ef);
  newt_opt opts[] = {CLI_ETCD_OPTS(&f->ef),
                     {"json", NEWT_OPT_FLAG, &f->json, "one JSON object per line instead of text"},
                     {"watch", NEWT_OPT_FLAG, &f->watch, "refresh every --interval-ms until the job is done"},
                     {"interval-ms", NEWT_OPT_INT, &f->interval, "how often --watch refreshes"},
                     {"wait-workers", NEWT_OPT_INT, &f->wait_workers, "wait until at least N workers are registered"},
                     {"timeout-ms", NEWT_OPT_INT, &f->timeout,
                      "how long --wait-workers waits (default 60000); with --watch, the most it watches (default: "
                      "until the job is done or failed)"},
                     {"etcd-wait-ms", NEWT_OPT_INT, &f->etcd_wait,
                      "with --watch, how long etcd may be unreachable before it gives up (a job's etcd ends with it)"},
                     {"events", NEWT_OPT_INT, &f->nevents, "newest events to show"},
                     NEWT_OPT_END};
  int rc = newt_opts_exit(newt_opts_parse("status", "--job NAME [flags]", opts, argc, argv, NULL, 0, NULL));
  if (rc >= 0) return rc;
  if (f->interval < 50 || f->nevents < 0 || f->timeout < -1 || f->timeout == 0 || f->etcd_wait < 0) {
    fprintf(stderr, "newt status: --interval-ms must be at least 50, --events at least 0, --timeout-ms positive and "
                    "--etcd-wait-ms at least 0\n");
    return 2;
  }
  return -1;
}

/* Where the looks are: the deadlines, since when etcd is away, whether the job's run ended */
typedef struct looks {
  newt_deadline_t watch_end, d; /* --watch's end; --wait-workers' */
  uint64_t away_since;          /* wall ms etcd stopped answering (--watch) */
  int over;                     /* the recorded newt run of the job ended (--watch) */
  int tty;
} looks;

/* --watch outlives an outage: says since when etcd is away, and waits --interval-ms. 1 to look
 * again; 0 to stop (the error said after); -1 when it gives up (said). */
static int etcd_away(const status_flags *f, const char *endpoints, looks *l) {
  uint64_t now = newt_wall_ms();
  if (!l->away_since) l->away_since = now;
  char dur[32], clock[32];
  fprintf(l->tty ? stdout : stderr, "%snewt status: etcd unreachable for %s (since %s): %s%s", l->tty ? "\r\033[K" : "",
          newt_fmt_duration((double)(now - l->away_since) / 1e3, dur, sizeof dur),
          newt_fmt_utc(l->away_since, clock, sizeof clock), newt_errmsg(), l->tty ? "" : "\n");
  fflush(l->tty ? stdout : stderr);
  if (now - l->away_since >= (uint64_t)f->etcd_wait) { /* the job's etcd may have ended with it: do not spin */
    fprintf(stderr, "%snewt status: giving up: etcd unreachable at %s for %s, longer than --etcd-wait-ms %lld (a "
            "job run by newt run stops its etcd when it ends)\n", l->tty ? "\n" : "", endpoints, dur,
            (long long)f->etcd_wait);
    return -1;
  }
  if (newt_deadline_passed(l->watch_end)) return 0;
  newt_sleep_ms((int64_t)f->interval);
  return newt_stop_requested() ? 0 : 1;
}

/* The wait for the next look: it ends early when the run of a recorded job ends, for one last
 * look at its etcd (the end marker) before its etcd is gone. */
static void wait_next(const status_flags *f, found *fd, looks *l) {
  uint64_t looked = 0;
  for (newt_deadline_t next = newt_deadline_in_ms(f->interval); !newt_deadline_passed(next) && !newt_stop_requested();) {
    newt_sleep_ms(20);
    if (fd->have && fd->rec.private_etcd && newt_wall_ms() - looked >= 200) {
      looked = newt_wall_ms();
      if ((l->over = run_over(fd))) break;
    }
  }
}

/* The looks at the job, once or (--watch) until it ends; the exit status, *r the error of the
 * last look (said by the caller). */
static int look(status_flags *f, rdzv_etcd *c, const rdzv_etcd_opts *eo, found *fd, looks *l, newt_result_t *r) {
  for (;;) {
    status st;
    *r = collect(c, f->ef.job, &st);
    int n = *r == NEWT_OK ? st.v.nworkers : 0;
    /* --wait-workers: a job that is not there yet may come */
    if ((*r == NEWT_OK || *r == NEWT_ERR_NOTFOUND) && n < f->wait_workers && !newt_deadline_passed(l->d) &&
        !newt_stop_requested()) {
      status_free(&st);
      newt_sleep_ms(200);
      continue;
    }
    if (*r != NEWT_OK && rdzv_etcd_transient(*r) && fd->have && fd->rec.private_etcd && run_over(fd)) {
      /* the job's newt run ended, and its etcd with it: its record says how */
      status_free(&st);
      *r = NEWT_OK;
      return say_run_over(&fd->rec, f->json);
    }
    if (*r != NEWT_OK && f->watch && rdzv_etcd_transient(*r)) {
      status_free(&st);
      int again = etcd_away(f, eo->endpoints, l);
      if (again > 0) continue;
      if (again < 0) *r = NEWT_OK;
      return again < 0 ? 1 : 0;
    }
    l->away_since = 0;
    if (*r != NEWT_OK) {
      status_free(&st);
      return 0;
    }
    show(&st, (int)f->nevents, f->json, f->watch, l->tty);
    int done = st.v.has_failed || st.v.has_done;
    const char *state = st.state;
    status_free(&st);
    if (n < f->wait_workers) {
      fprintf(stderr, "newt status: %d workers registered for job %s after %lld ms, %lld wanted\n", n, f->ef.job,
              (long long)f->timeout, (long long)f->wait_workers);
      return 1;
    }
    f->wait_workers = 0; /* waited for once, before the first look */
    if (!f->watch || done) return 0;
    if (l->over) return say_run_over(&fd->rec, f->json); /* its newt run ended, and this last look did not see the
                                                            job end */
    if (newt_deadline_passed(l->watch_end)) {
      fprintf(stderr, "newt status: watched job %s for --timeout-ms %lld: it is still %s\n", f->ef.job,
              (long long)f->timeout, state);
      return 1;
    }
    wait_next(f, fd, l);
    if (newt_stop_requested()) return 0;
  }
}

int newt_cmd_status(int argc, char **argv) {
  status_flags f;
  int rc = parse_flags(argc, argv, &f);
  if (rc >= 0) return rc;
  looks l = {.watch_end = newt_deadline_in_ms(f.watch && f.timeout > 0 ? f.timeout : -1)}; /* -1: none */
  if (f.timeout < 0) f.timeout = 60000; /* --wait-workers' */
  rdzv_etcd_opts eo;
  char *password = NULL, *run_pw = NULL;
  rdzv_etcd *c = NULL;
  found fd;
  if ((rc = find_run(&f.ef, &fd, &run_pw)) != 0) return rc;
  if (fd.have && fd.rec.private_etcd && runfile_over(&fd.rec)) return say_run_over(&fd.rec, f.json);
  if (cli_etcd_opts(&f.ef, &eo, &password) != NEWT_OK) {
    fprintf(stderr, "newt status: %s\n", newt_errmsg());
    free(run_pw);
    return 2;
  }
  if (run_pw) {
    eo.user = fd.rec.user;
    eo.password = password = run_pw;
  }
  if (rdzv_etcd_init(&eo, &c) != NEWT_OK) {
    fprintf(stderr, "newt status: %s\n", newt_errmsg());
    free(password);
    return 1;
  }
  l.tty = isatty(STDOUT_FILENO);
  l.d = newt_deadline_in_ms(f.timeout);
  newt_result_t r;
  rc = look(&f, c, &eo, &fd, &l, &r);
  if (r != NEWT_OK) {
    char run_dir[600];
    fprintf(stderr, "newt status: %s\n", newt_errmsg());
    if (rdzv_etcd_transient(r) && fd.have)
      fprintf(stderr, "newt status: that is the etcd of job %s's newt run (pid %lld), recorded in %s\n", f.ef.job,
              (long long)fd.rec.pid, fd.path);
    else if (rdzv_etcd_transient(r) && !cli_etcd_given(&f.ef) && runfile_dir(run_dir, sizeof run_dir) == NEWT_OK)
      fprintf(stderr, "newt status: no newt run of job %s is recorded for this user on this host (%s): give the job's "
              "etcd with --etcd URL (or NEWT_ETCD)\n", f.ef.job, run_dir);
    rc = 1;
  }
  rdzv_etcd_free(c);
  free(password);
  return rc;
}
