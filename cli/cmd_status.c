/* newt status: the state of a job as etcd holds it, for people: what it is doing, the plan,
 * the workers, the recoveries as a table and the newest events, with times relative to now
 * ("12 s ago") and durations ("334 ms"). --watch refreshes it (in place on a terminal) until
 * the job is done; --json prints the same as one JSON object per line (per refresh with
 * --watch). A job with no keys in etcd is an error (exit 1, saying so). --wait-workers N
 * waits until at least N workers are registered (the Helm chart's test hook). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cmds.h"
#include "cli/etcd_flags.h"
#include "common/clock.h"
#include "common/json.h"
#include "common/opts.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "job/plan.h"
#include "job/records.h"
#include "job/spec.h"
#include "job/store.h"
#include "rendezvous/rdzv.h"

/* A record decoded by its codec, re-encoded as a JSON item: NULL (and a warning naming
 * the key) when it does not pass its parser, so status never shows what the job would
 * refuse. */
static cJSON *checked_item(const rdzv_etcd_kv *kv, job_record rec) {
  char *text = NULL;
  newt_result_t r = NEWT_OK;
  switch (rec) {
  case JOB_REC_WORKER: {
    job_worker w;
    r = job_worker_from_json(kv->value, kv->value_len, kv->key, &w);
    if (r == NEWT_OK) r = job_worker_to_json(&w, &text);
    break;
  }
  case JOB_REC_PLAN: {
    newt_plan p;
    r = plan_from_json(kv->value, kv->value_len, &p);
    if (r == NEWT_OK) {
      memset(p.secret, 0, sizeof p.secret); /* never shown */
      text = plan_to_json(&p);
      plan_free(&p);
    }
    break;
  }
  case JOB_REC_PROGRESS: {
    job_progress p;
    if ((r = job_progress_from_json(kv->value, kv->value_len, &p)) == NEWT_OK) text = job_progress_to_json(&p);
    break;
  }
  case JOB_REC_DONE: {
    job_done d;
    if ((r = job_done_from_json(kv->value, kv->value_len, &d)) == NEWT_OK) text = job_done_to_json(&d);
    break;
  }
  case JOB_REC_FAILED: {
    job_failed fl;
    if ((r = job_failed_from_json(kv->value, kv->value_len, &fl)) == NEWT_OK) text = job_failed_to_json(&fl);
    break;
  }
  case JOB_REC_CKPT: {
    job_ckpt c;
    if ((r = job_ckpt_from_json(kv->value, kv->value_len, &c)) == NEWT_OK) text = job_ckpt_to_json(&c);
    break;
  }
  case JOB_REC_EVENT: {
    job_event e;
    if ((r = job_event_from_json(kv->value, kv->value_len, &e)) == NEWT_OK) {
      text = job_event_to_json(&e);
      job_event_free(&e);
    }
    break;
  }
  case JOB_REC_SPEC: {
    newt_spec sp;
    if ((r = spec_from_json(kv->value, kv->value_len, &sp)) == NEWT_OK) text = spec_to_json(&sp);
    break;
  }
  default:
    return NULL;
  }
  if (r != NEWT_OK) {
    char key[256];
    fprintf(stderr, "newt status: ignoring %s: %s\n", newt_str_printable(key, sizeof key, kv->key), newt_errmsg());
    return NULL;
  }
  cJSON *j = NULL;
  if (text) newt_json_parse(text, strlen(text), kv->key, &j);
  free(text);
  if (j && rec == JOB_REC_PLAN) cJSON_DeleteItemFromObject(j, "secret");
  return j;
}

static const char *str_of(const cJSON *o, const char *k, const char *deflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : deflt;
}

static double num_of(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

/* Whether the array of strings names id. */
static int names(const cJSON *arr, const char *id) {
  for (const cJSON *x = arr ? arr->child : NULL; x; x = x->next)
    if (cJSON_IsString(x) && strcmp(x->valuestring, id) == 0) return 1;
  return 0;
}

/* "spares": each registered worker that is no rank of the plan, and why: the plan's reason
 * for the spares it names, the newest spare event's for a worker that joined after it. */
static void add_spares(cJSON *j, const cJSON *workers, const cJSON *events) {
  const cJSON *plan = cJSON_GetObjectItemCaseSensitive(j, "plan");
  if (!plan) return;
  const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(plan, "ranks");
  cJSON *spares = cJSON_AddArrayToObject(j, "spares");
  for (const cJSON *w = workers ? workers->child : NULL; w; w = w->next) {
    const char *id = str_of(w, "id", "?");
    int ranked = 0;
    for (const cJSON *r = ranks ? ranks->child : NULL; r && !ranked; r = r->next) ranked = strcmp(str_of(r, "worker", ""), id) == 0;
    if (ranked) continue;
    const char *why = NULL;
    for (const cJSON *e = events ? events->child : NULL; e; e = e->next) /* oldest first: the newest wins */
      if (strcmp(str_of(e, "type", ""), "spare") == 0 && names(cJSON_GetObjectItemCaseSensitive(e, "spare_ids"), id))
        why = str_of(e, "why", NULL);
    if (names(cJSON_GetObjectItemCaseSensitive(plan, "spares"), id)) why = str_of(plan, "spare_why", why);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "worker", id);
    cJSON_AddStringToObject(o, "why", why ? why : "registered after the plan: the leader takes it in when a plan "
                                                  "with it is larger");
    cJSON_AddItemToArray(spares, o);
  }
}

/* The recoveries (recovered events) and the faults newt run noted for them. */
typedef struct timed {
  job_event *recs;
  int nrecs;
  job_fault *faults;
  int nfaults;
} timed;

static void take_timed(timed *t, const rdzv_etcd_kv *kv, job_record rec) {
  if (rec == JOB_REC_FAULT) {
    job_fault f;
    job_fault *n = realloc(t->faults, (size_t)(t->nfaults + 1) * sizeof *n);
    if (!n) return;
    t->faults = n;
    if (job_fault_from_json(kv->value, kv->value_len, &f) == NEWT_OK) t->faults[t->nfaults++] = f;
    return;
  }
  job_event e;
  if (job_event_from_json(kv->value, kv->value_len, &e) != NEWT_OK) return;
  job_event *n = e.type == JOB_EV_RECOVERED ? realloc(t->recs, (size_t)(t->nrecs + 1) * sizeof *n) : NULL;
  if (!n) {
    job_event_free(&e);
    return;
  }
  t->recs = n;
  t->recs[t->nrecs++] = e;
}

static void timed_free(timed *t) {
  for (int i = 0; i < t->nrecs; i++) job_event_free(&t->recs[i]);
  free(t->recs);
  free(t->faults);
}

/* "recoveries": each recovered event with its times as every view gives them
 * (job_recovery_time): start_ms and the phases, from the fault where newt run noted one it
 * injected ("fault": the chaos item), else from the first detection. */
static void add_recoveries(cJSON *j, const timed *t) {
  cJSON *recs = cJSON_AddArrayToObject(j, "recoveries");
  for (int i = 0; i < t->nrecs; i++) {
    const job_event *e = &t->recs[i];
    const job_fault *f = NULL;
    for (int k = 0; k < t->nfaults && !f; k++)
      if (t->faults[k].generation == e->generation) f = &t->faults[k];
    job_recovery_times rt = job_recovery_time(e, f ? f->t_ms : 0);
    char *text = job_event_to_json(e);
    cJSON *o = NULL;
    if (!text || newt_json_parse(text, strlen(text), "event", &o) != NEWT_OK) {
      free(text);
      continue;
    }
    free(text);
    newt_json_add_int(o, "start_ms", (int64_t)rt.start);
    newt_json_add_int(o, "detect_ms", rt.detect_ms);
    newt_json_add_int(o, "plan_ms", rt.plan_ms);
    newt_json_add_int(o, "comm_ms", rt.comm_ms);
    newt_json_add_int(o, "restore_ms", rt.restore_ms);
    newt_json_add_int(o, "step_ms", rt.step_ms);
    newt_json_add_int(o, "total_ms", rt.total_ms);
    if (f && rt.start == f->t_ms) cJSON_AddStringToObject(o, "fault", f->what);
    cJSON_AddItemToArray(recs, o);
  }
}

/* Everything under /newt/<job>/ that status shows, as one JSON object: the records, the
 * newest nevents events, and every recovery (the "recovered" events). NEWT_ERR_NOTFOUND
 * when the job has no key at all. */
static newt_result_t collect(rdzv_etcd *c, const char *job, int nevents, cJSON **out, int *nworkers) {
  char prefix[256];
  NEWT_CHECK(rdzv_key(prefix, sizeof prefix, job, ""));
  rdzv_etcd_kvs all;
  rdzv_etcd_range_opts ro = {.prefix = 1};
  NEWT_CHECK(rdzv_etcd_range(c, prefix, &ro, newt_deadline_in_ms(5000), &all));
  *nworkers = 0;
  if (all.n == 0) {
    rdzv_etcd_kvs_free(&all);
    return NEWT_ERR(NEWT_ERR_NOTFOUND, "no job \"%s\" in etcd at %s (no key under %s)", job, rdzv_etcd_endpoints(c),
                    prefix);
  }
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "job", job);
  cJSON *workers = cJSON_AddArrayToObject(j, "workers");
  cJSON *events = cJSON_AddArrayToObject(j, "events");
  size_t plen = strlen(prefix);
  *nworkers = 0;
  timed t = {0};
  for (size_t i = 0; i < all.n; i++) {
    const rdzv_etcd_kv *kv = &all.kvs[i];
    job_record rec = job_key_parse(kv->key + plen, NULL, NULL);
    if (rec == JOB_REC_FAULT || rec == JOB_REC_EVENT) take_timed(&t, kv, rec);
    static const char *const single[] = {[JOB_REC_SPEC] = "spec", [JOB_REC_PLAN] = "plan",
                                         [JOB_REC_PROGRESS] = "progress", [JOB_REC_DONE] = "done",
                                         [JOB_REC_CKPT] = "ckpt", [JOB_REC_FAILED] = "failed"};
    if (rec != JOB_REC_WORKER && rec != JOB_REC_EVENT &&
        (rec >= (int)(sizeof single / sizeof single[0]) || !single[rec]))
      continue;
    cJSON *v = checked_item(kv, rec);
    if (!v) continue;
    if (rec == JOB_REC_WORKER) cJSON_AddItemToArray(workers, v), (*nworkers)++;
    else if (rec == JOB_REC_EVENT) cJSON_AddItemToArray(events, v);
    else cJSON_AddItemToObject(j, single[rec], v);
  }
  rdzv_etcd_kvs_free(&all);
  add_spares(j, workers, events);
  add_recoveries(j, &t);
  timed_free(&t);
  while (cJSON_GetArraySize(events) > nevents) cJSON_DeleteItemFromArray(events, 0);
  char leader[128], shown[128];
  if (job_leader_get(c, job, newt_deadline_in_ms(5000), leader, sizeof leader, NULL) == NEWT_OK)
    cJSON_AddStringToObject(j, "leader", newt_str_printable(shown, sizeof shown, leader));
  else
    cJSON_AddNullToObject(j, "leader");
  int nospace = 0, corrupt = 0;
  cJSON *alarms = cJSON_AddArrayToObject(j, "etcd_alarms");
  if (rdzv_etcd_alarms(c, newt_deadline_in_ms(5000), &nospace, &corrupt) == NEWT_OK) {
    if (nospace) cJSON_AddItemToArray(alarms, cJSON_CreateString("NOSPACE"));
    if (corrupt) cJSON_AddItemToArray(alarms, cJSON_CreateString("CORRUPT"));
  }
  /* the job's state in a word, as the first line of the text says it */
  const char *state = cJSON_GetObjectItemCaseSensitive(j, "failed")     ? "failed"
                      : cJSON_GetObjectItemCaseSensitive(j, "done")     ? "done"
                      : cJSON_GetObjectItemCaseSensitive(j, "progress") ? "running"
                      : cJSON_GetObjectItemCaseSensitive(j, "plan")     ? "starting"
                                                                        : "waiting";
  cJSON_AddStringToObject(j, "state", state);
  *out = j;
  return NEWT_OK;
}

/* "12 s ago" for a wall-clock stamp in ms ("just now" when it is not in the past). */
static const char *ago(uint64_t now, double t_ms, char *out, size_t cap) {
  if (!(t_ms > 0) || t_ms >= (double)now) return snprintf(out, cap, "just now"), out;
  char d[32];
  snprintf(out, cap, "%s ago", newt_fmt_duration(((double)now - t_ms) / 1e3, d, sizeof d));
  return out;
}

static const char *dur_of(const cJSON *o, const char *ms, char *out, size_t cap) {
  return newt_fmt_duration(num_of(o, ms) / 1e3, out, cap);
}

static const char *ms_of(const cJSON *o, const char *a, const char *b, char *out, size_t cap) {
  double x = num_of(o, a), y = num_of(o, b);
  return newt_fmt_duration(x > 0 && y >= x ? (y - x) / 1e3 : 0, out, cap);
}

/* The names of an array of strings, comma-separated between before and after (nothing when
 * it is empty). */
static void print_names(FILE *f, const char *before, const cJSON *arr, const char *after) {
  if (!cJSON_GetArraySize(arr)) return;
  fputs(before, f);
  for (const cJSON *x = arr->child; x; x = x->next) fprintf(f, "%s%s", x == arr->child ? "" : ", ", cJSON_IsString(x) ? x->valuestring : "?");
  fputs(after, f);
}

/* One line about an event, as a person would say it. */
static void describe_event(FILE *f, const cJSON *e, const cJSON *recs) {
  const char *type = str_of(e, "type", "?"), *cause = str_of(e, "cause", "?");
  char d[32];
  if (strcmp(type, "leader") == 0) {
    fprintf(f, "coordinator %s leads", str_of(e, "coordinator", "?"));
  } else if (strcmp(type, "plan") == 0) {
    fprintf(f, "plan %.0f (%s): %.0f ranks, dp %.0f, %.0f spares", num_of(e, "generation"), cause, num_of(e, "world"),
            num_of(e, "dp"), num_of(e, "spares"));
    print_names(f, " (", cJSON_GetObjectItemCaseSensitive(e, "spare_ids"), ")");
    print_names(f, "; left out: ", cJSON_GetObjectItemCaseSensitive(e, "excluded"), "");
    if (num_of(e, "spares") > 0 && str_of(e, "why", NULL)) fprintf(f, "; spares because %s", str_of(e, "why", ""));
  } else if (strcmp(type, "spare") == 0) {
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(e, "spare_ids");
    print_names(f, "", ids, cJSON_GetArraySize(ids) == 1 ? " joined and stays a spare: " : " joined and stay spares: ");
    fprintf(f, "%s", str_of(e, "why", "?"));
  } else if (strcmp(type, "fence") == 0) {
    fprintf(f, "fenced worker %s (its lease revoked)", str_of(e, "worker", "?"));
  } else if (strcmp(type, "waiting") == 0) {
    fprintf(f, "waiting: %s", str_of(e, "why", "?"));
  } else if (strcmp(type, "etcd") == 0) {
    fprintf(f, "%s", str_of(e, "why", "?"));
  } else if (strcmp(type, "started") == 0) {
    fprintf(f, "generation %.0f started: %.0f ranks, first step %s after the plan", num_of(e, "generation"),
            num_of(e, "world"), ms_of(e, "t_plan", "t_step", d, sizeof d));
  } else if (strcmp(type, "recovered") == 0) {
    const cJSON *r = recs ? recs->child : NULL; /* its times, as the table gives them */
    while (r && num_of(r, "generation") != num_of(e, "generation")) r = r->next;
    fprintf(f, "recovered from %s in %s: generation %.0f, %.0f ranks, state from %s", cause,
            r ? dur_of(r, "total_ms", d, sizeof d) : "?", num_of(e, "generation"), num_of(e, "world"),
            str_of(e, "restore", "?"));
  } else if (strcmp(type, "done") == 0) {
    fprintf(f, "done at step %.0f, loss %.4f", num_of(e, "step"), num_of(e, "loss"));
  } else if (strcmp(type, "failed") == 0) {
    fprintf(f, "the job failed: %s", str_of(e, "why", "?"));
  } else if (strcmp(type, "spec") == 0) {
    fprintf(f, "spec %s", str_of(e, "why", "?"));
  } else {
    fprintf(f, "%s", type);
  }
}

static void print_text(FILE *f, const cJSON *j, uint64_t now) {
  const cJSON *plan = cJSON_GetObjectItemCaseSensitive(j, "plan");
  const cJSON *prog = cJSON_GetObjectItemCaseSensitive(j, "progress");
  const cJSON *done = cJSON_GetObjectItemCaseSensitive(j, "done");
  const cJSON *failed = cJSON_GetObjectItemCaseSensitive(j, "failed");
  const cJSON *spec = cJSON_GetObjectItemCaseSensitive(j, "spec");
  const cJSON *ckpt = cJSON_GetObjectItemCaseSensitive(j, "ckpt");
  const cJSON *train = spec ? cJSON_GetObjectItemCaseSensitive(spec, "train") : NULL;
  double steps = train ? num_of(train, "steps") : 0;
  char a[48], b[48];
  fprintf(f, "job %s: ", str_of(j, "job", "?"));
  if (failed)
    fprintf(f, "FAILED %s: %s\n", ago(now, num_of(failed, "t_ms"), a, sizeof a), str_of(failed, "why", "?"));
  else if (done)
    fprintf(f, "done at step %.0f, final loss %.4f, %.0f samples, %s\n", num_of(done, "step"), num_of(done, "loss"),
            num_of(done, "samples"), ago(now, num_of(done, "t_ms"), a, sizeof a));
  else if (prog && steps > 0)
    fprintf(f, "running, step %.0f of %.0f (%.0f%%)\n", num_of(prog, "step"), steps, 100 * num_of(prog, "step") / steps);
  else
    fprintf(f, "%s\n", plan ? "starting: no step yet" : "waiting for a plan");
  fprintf(f, "  leader      %s\n", str_of(j, "leader", "none"));
  for (const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "etcd_alarms") ? cJSON_GetObjectItemCaseSensitive(j, "etcd_alarms")->child : NULL;
       a; a = a->next)
    fprintf(f, "  etcd        %s\n",
            strcmp(a->valuestring, "NOSPACE") == 0
                ? "out of space (NOSPACE alarm): it refuses every write until space is freed (etcdctl compact, "
                  "defrag, alarm disarm); training goes on, plans and progress wait"
                : "a member's data is corrupt (CORRUPT alarm): replace that member");
  if (prog && !done)
    fprintf(f, "  progress    loss %.4f, %.0f tokens/s, world %.0f (dp %.0f), generation %.0f, %s\n",
            num_of(prog, "loss"), num_of(prog, "tokens_per_s"), num_of(prog, "world"), num_of(prog, "dp"),
            num_of(prog, "generation"), ago(now, num_of(prog, "t_ms"), a, sizeof a));
  if (plan)
    fprintf(f, "  plan        generation %.0f (%s): %d ranks, dp %.0f x tp %.0f x pp %.0f, accum %.0f, %s\n",
            num_of(plan, "generation"), str_of(plan, "cause", "?"),
            cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(plan, "ranks")), num_of(plan, "dp"), num_of(plan, "tp"),
            num_of(plan, "pp"), num_of(plan, "accum"), ago(now, num_of(plan, "created_ms"), a, sizeof a));
  if (ckpt) fprintf(f, "  checkpoint  step %.0f in %s\n", num_of(ckpt, "step"), str_of(ckpt, "dir", "?"));

  const cJSON *workers = cJSON_GetObjectItemCaseSensitive(j, "workers");
  fprintf(f, "\nworkers (%d)\n", cJSON_GetArraySize(workers));
  if (cJSON_GetArraySize(workers))
    fprintf(f, "  %-20s %-8s %-10s %-4s %-16s %s\n", "ID", "RANK", "STATE", "GEN", "HOST", "ADDRESS");
  for (const cJSON *w = workers ? workers->child : NULL; w; w = w->next) {
    int rank = -1;
    const cJSON *ranks = plan ? cJSON_GetObjectItemCaseSensitive(plan, "ranks") : NULL;
    for (const cJSON *r = ranks ? ranks->child : NULL; r; r = r->next)
      if (strcmp(str_of(r, "worker", ""), str_of(w, "id", "?")) == 0) rank = (int)num_of(r, "rank");
    char rk[16];
    snprintf(rk, sizeof rk, rank >= 0 ? "%d" : "spare", rank);
    fprintf(f, "  %-20s %-8s %-10s %-4.0f %-16s %s\n", str_of(w, "id", "?"), rk, str_of(w, "state", "?"),
            num_of(w, "generation"), str_of(w, "host", "?"), str_of(w, "addr", ""));
  }

  const cJSON *spares = cJSON_GetObjectItemCaseSensitive(j, "spares");
  if (cJSON_GetArraySize(spares)) fprintf(f, "\nspares (%d): registered, not training\n", cJSON_GetArraySize(spares));
  for (const cJSON *sp = spares ? spares->child : NULL; sp; sp = sp->next)
    fprintf(f, "  %-20s %s\n", str_of(sp, "worker", "?"), str_of(sp, "why", "?"));

  const cJSON *recs = cJSON_GetObjectItemCaseSensitive(j, "recoveries");
  int nrec = cJSON_GetArraySize(recs), i = 0;
  fprintf(f, "\nrecoveries (%d)%s\n", nrec,
          nrec ? ": each from the fault (newt run's injected one) or else its first detection, to the next completed "
                 "step"
               : "");
  if (nrec)
    fprintf(f, "  %-3s %-14s %-12s %-4s %-6s %-9s %-9s %-9s %-9s %-9s %-9s %-10s %s\n", "#", "WHEN", "CAUSE", "GEN",
            "RANKS", "DETECT", "PLAN", "COMM", "RESTORE", "STEP", "TOTAL", "STATE FROM", "STEPS LOST");
  for (const cJSON *r = recs ? recs->child : NULL; r; r = r->next) {
    char dt[32], pl[32], cm[32], rs[32], st[32], tot[32];
    fprintf(f, "  %-3d %-14s %-12s %-4.0f %-6.0f %-9s %-9s %-9s %-9s %-9s %-9s %-10s %.0f\n", ++i,
            ago(now, num_of(r, "start_ms"), a, sizeof a), str_of(r, "cause", "?"), num_of(r, "generation"),
            num_of(r, "world"), dur_of(r, "detect_ms", dt, sizeof dt), dur_of(r, "plan_ms", pl, sizeof pl),
            dur_of(r, "comm_ms", cm, sizeof cm), dur_of(r, "restore_ms", rs, sizeof rs),
            dur_of(r, "step_ms", st, sizeof st), dur_of(r, "total_ms", tot, sizeof tot), str_of(r, "restore", "?"),
            num_of(r, "steps_lost"));
  }

  const cJSON *events = cJSON_GetObjectItemCaseSensitive(j, "events");
  if (cJSON_GetArraySize(events)) fprintf(f, "\nnewest events\n");
  for (const cJSON *e = events ? events->child : NULL; e; e = e->next) {
    fprintf(f, "  %-14s ", ago(now, num_of(e, "t_ms"), b, sizeof b));
    describe_event(f, e, recs);
    fputc('\n', f);
  }
}

/* One look at the job, as text or one JSON line; on a terminal with --watch it replaces the
 * last one on the screen. */
static void show(const cJSON *j, int json, int watch, int tty) {
  if (json) {
    char *t = newt_json_print(j);
    printf("%s\n", t ? t : "{}");
    free(t);
  } else {
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m) return;
    print_text(m, j, newt_wall_ms());
    fclose(m);
    if (watch && tty) printf("\033[H\033[2J"); /* home, clear: the new picture in place */
    fputs(text, stdout);
    if (watch && !tty) putchar('\n');
    free(text);
  }
  fflush(stdout);
}

int newt_cmd_status(int argc, char **argv) {
  cli_etcd_flags ef;
  cli_etcd_flags_init(&ef);
  int json = 0, watch = 0;
  int64_t wait_workers = 0, timeout = -1, nevents = 10, interval = 1000, etcd_wait = 60000;
  newt_opt opts[] = {CLI_ETCD_OPTS(&ef),
                     {"json", NEWT_OPT_FLAG, &json, "one JSON object per line instead of text"},
                     {"watch", NEWT_OPT_FLAG, &watch, "refresh every --interval-ms until the job is done"},
                     {"interval-ms", NEWT_OPT_INT, &interval, "how often --watch refreshes"},
                     {"wait-workers", NEWT_OPT_INT, &wait_workers, "wait until at least N workers are registered"},
                     {"timeout-ms", NEWT_OPT_INT, &timeout,
                      "how long --wait-workers waits (default 60000); with --watch, the most it watches (default: "
                      "until the job is done or failed)"},
                     {"etcd-wait-ms", NEWT_OPT_INT, &etcd_wait,
                      "with --watch, how long etcd may be unreachable before it gives up (a job's etcd ends with it)"},
                     {"events", NEWT_OPT_INT, &nevents, "newest events to show"},
                     NEWT_OPT_END};
  int rc = newt_opts_exit(newt_opts_parse("status", "--job NAME [flags]", opts, argc, argv, NULL, 0, NULL));
  if (rc >= 0) return rc;
  if (interval < 50 || nevents < 0 || timeout < -1 || timeout == 0 || etcd_wait < 0) {
    fprintf(stderr, "newt status: --interval-ms must be at least 50, --events at least 0, --timeout-ms positive and "
                    "--etcd-wait-ms at least 0\n");
    return 2;
  }
  newt_deadline_t watch_end = newt_deadline_in_ms(watch && timeout > 0 ? timeout : -1); /* -1: none */
  if (timeout < 0) timeout = 60000; /* --wait-workers' */
  rdzv_etcd_opts eo;
  char *password = NULL;
  rdzv_etcd *c = NULL;
  if (cli_etcd_opts(&ef, &eo, &password) != NEWT_OK) {
    fprintf(stderr, "newt status: %s\n", newt_errmsg());
    return 2;
  }
  if (rdzv_etcd_init(&eo, &c) != NEWT_OK) {
    fprintf(stderr, "newt status: %s\n", newt_errmsg());
    free(password);
    return 1;
  }
  int tty = isatty(STDOUT_FILENO);
  newt_deadline_t d = newt_deadline_in_ms(timeout);
  int n = 0;
  newt_result_t r;
  uint64_t away_since = 0; /* wall ms etcd stopped answering (--watch) */
  char clock[32];
  rc = 0;
  for (;;) {
    cJSON *j = NULL;
    r = collect(c, ef.job, (int)nevents, &j, &n);
    /* --wait-workers: a job that is not there yet may come */
    int waiting = (r == NEWT_OK || r == NEWT_ERR_NOTFOUND) && n < wait_workers && !newt_deadline_passed(d) &&
                  !newt_stop_requested();
    if (waiting) {
      cJSON_Delete(j);
      newt_sleep_ms(200);
      continue;
    }
    if (r != NEWT_OK && watch && rdzv_etcd_transient(r)) {
      /* --watch outlives an outage: say since when etcd is away, and look again */
      uint64_t now = newt_wall_ms();
      if (!away_since) away_since = now;
      char dur[32];
      fprintf(tty ? stdout : stderr, "%snewt status: etcd unreachable for %s (since %s): %s%s", tty ? "\r\033[K" : "",
              newt_fmt_duration((double)(now - away_since) / 1e3, dur, sizeof dur), newt_fmt_utc(away_since, clock, sizeof clock),
              newt_errmsg(), tty ? "" : "\n");
      fflush(tty ? stdout : stderr);
      cJSON_Delete(j);
      if (now - away_since >= (uint64_t)etcd_wait) { /* the job's etcd may have ended with it: do not spin */
        fprintf(stderr, "%snewt status: giving up: etcd unreachable for %s, longer than --etcd-wait-ms %lld (a job "
                "run by newt run stops its etcd when it ends)\n", tty ? "\n" : "", dur, (long long)etcd_wait);
        r = NEWT_OK;
        rc = 1;
        break;
      }
      if (newt_deadline_passed(watch_end)) break;
      newt_sleep_ms((int64_t)interval);
      if (newt_stop_requested()) break;
      continue;
    }
    away_since = 0;
    if (r != NEWT_OK) break;
    show(j, json, watch, tty);
    const char *state = str_of(j, "state", "");
    int done = strcmp(state, "done") == 0 || strcmp(state, "failed") == 0;
    char st[16];
    snprintf(st, sizeof st, "%s", state);
    cJSON_Delete(j);
    if (n < wait_workers) {
      fprintf(stderr, "newt status: %d workers registered for job %s after %lld ms, %lld wanted\n", n, ef.job,
              (long long)timeout, (long long)wait_workers);
      rc = 1;
      break;
    }
    wait_workers = 0; /* waited for once, before the first look */
    if (!watch || done) break;
    if (newt_deadline_passed(watch_end)) {
      fprintf(stderr, "newt status: watched job %s for --timeout-ms %lld: it is still %s\n", ef.job, (long long)timeout, st);
      rc = 1;
      break;
    }
    for (newt_deadline_t next = newt_deadline_in_ms(interval); !newt_deadline_passed(next) && !newt_stop_requested();)
      newt_sleep_ms(20);
    if (newt_stop_requested()) break;
  }
  if (r != NEWT_OK) {
    fprintf(stderr, "newt status: %s\n", newt_errmsg());
    rc = 1;
  }
  rdzv_etcd_free(c);
  free(password);
  return rc;
}
