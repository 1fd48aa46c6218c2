/* newt status: the state of a job as etcd holds it: leader, plan, workers, progress, the
 * newest events. --wait-workers N waits until at least N workers are registered (the Helm
 * chart's test hook). --json prints one JSON document instead of text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmds.h"
#include "cli/etcd_flags.h"
#include "common/clock.h"
#include "common/json.h"
#include "common/opts.h"
#include "common/sys.h"
#include "job/plan.h"
#include "job/records.h"
#include "job/spec.h"
#include "rendezvous/rdzv.h"

/* A record decoded by its codec, re-encoded as a JSON item: NULL (and a warning naming
 * the key) when it does not pass its parser, so status never shows what the job would
 * refuse. */
static cJSON *checked_item(const rdzv_etcd_kv *kv, job_record rec) {
  char *text = NULL;
  newt_result_t r = NEWT_OK;
  switch (rec) {
  case JOB_REC_WORKER: {
    rdzv_worker w;
    r = rdzv_worker_from_json(kv->value, kv->value_len, kv->key, &w);
    if (r == NEWT_OK) r = rdzv_worker_to_json(&w, &text);
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
    fprintf(stderr, "newt status: ignoring %s: %s\n", kv->key, newt_errmsg());
    return NULL;
  }
  cJSON *j = NULL;
  if (text) newt_json_parse(text, strlen(text), kv->key, &j);
  free(text);
  if (j && rec == JOB_REC_PLAN) cJSON_DeleteItemFromObject(j, "secret");
  return j;
}

/* Everything under /newt/<job>/ that status shows, as one JSON object. */
static newt_result_t collect(rdzv_etcd *c, const char *job, int nevents, cJSON **out, int *nworkers) {
  char prefix[256];
  NEWT_CHECK(rdzv_key(prefix, sizeof prefix, job, ""));
  rdzv_etcd_kvs all;
  rdzv_etcd_range_opts ro = {.prefix = 1};
  NEWT_CHECK(rdzv_etcd_range(c, prefix, &ro, newt_deadline_in_ms(5000), &all));
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "job", job);
  cJSON *workers = cJSON_AddArrayToObject(j, "workers");
  cJSON *events = cJSON_AddArrayToObject(j, "events");
  size_t plen = strlen(prefix);
  *nworkers = 0;
  for (size_t i = 0; i < all.n; i++) {
    const rdzv_etcd_kv *kv = &all.kvs[i];
    job_record rec = job_key_parse(kv->key + plen, NULL, NULL);
    static const char *const single[] = {[JOB_REC_SPEC] = "spec", [JOB_REC_PLAN] = "plan",
                                         [JOB_REC_PROGRESS] = "progress", [JOB_REC_DONE] = "done",
                                         [JOB_REC_CKPT] = "ckpt"};
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
  while (cJSON_GetArraySize(events) > nevents) cJSON_DeleteItemFromArray(events, 0);
  char leader[128];
  if (rdzv_leader_get(c, job, newt_deadline_in_ms(5000), leader, sizeof leader, NULL) == NEWT_OK)
    cJSON_AddStringToObject(j, "leader", leader);
  else
    cJSON_AddNullToObject(j, "leader");
  *out = j;
  return NEWT_OK;
}

static const char *str_of(const cJSON *o, const char *k, const char *deflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : deflt;
}

static double num_of(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static void print_text(const cJSON *j) {
  const cJSON *plan = cJSON_GetObjectItemCaseSensitive(j, "plan");
  const cJSON *prog = cJSON_GetObjectItemCaseSensitive(j, "progress");
  const cJSON *done = cJSON_GetObjectItemCaseSensitive(j, "done");
  const cJSON *spec = cJSON_GetObjectItemCaseSensitive(j, "spec");
  const cJSON *train = spec ? cJSON_GetObjectItemCaseSensitive(spec, "train") : NULL;
  printf("job %s: %s, leader %s\n", str_of(j, "job", "?"), done ? "done" : plan ? "running" : "waiting for a plan",
         str_of(j, "leader", "none"));
  if (prog)
    printf("step %.0f/%.0f, loss %.4f, %.0f tokens/s\n", num_of(prog, "step"), train ? num_of(train, "steps") : 0,
           num_of(prog, "loss"), num_of(prog, "tokens_per_s"));
  if (plan) {
    printf("plan %.0f (%s): %.0f ranks, dp %.0f x tp %.0f x pp %.0f, accum %.0f\n", num_of(plan, "generation"),
           str_of(plan, "cause", "?"), (double)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(plan, "ranks")),
           num_of(plan, "dp"), num_of(plan, "tp"), num_of(plan, "pp"), num_of(plan, "accum"));
  }
  const cJSON *workers = cJSON_GetObjectItemCaseSensitive(j, "workers");
  printf("%d workers:\n", cJSON_GetArraySize(workers));
  for (const cJSON *w = workers ? workers->child : NULL; w; w = w->next) {
    int rank = -1;
    const cJSON *ranks = plan ? cJSON_GetObjectItemCaseSensitive(plan, "ranks") : NULL;
    for (const cJSON *r = ranks ? ranks->child : NULL; r; r = r->next)
      if (strcmp(str_of(r, "worker", ""), str_of(w, "id", "?")) == 0) rank = (int)num_of(r, "rank");
    char rk[16];
    snprintf(rk, sizeof rk, rank >= 0 ? "rank %d" : "spare", rank);
    printf("  %-16s %-8s %-10s gen %-4.0f %s %s\n", str_of(w, "id", "?"), rk, str_of(w, "state", "?"),
           num_of(w, "generation"), str_of(w, "host", "?"), str_of(w, "addr", ""));
  }
  const cJSON *events = cJSON_GetObjectItemCaseSensitive(j, "events");
  if (cJSON_GetArraySize(events)) printf("events:\n");
  for (const cJSON *e = events ? events->child : NULL; e; e = e->next) {
    char *t = newt_json_print(e);
    printf("  %s\n", t ? t : "?");
    free(t);
  }
}

int newt_cmd_status(int argc, char **argv) {
  cli_etcd_flags ef;
  cli_etcd_flags_init(&ef);
  int json = 0;
  int64_t wait_workers = 0, timeout = 60000, nevents = 10;
  newt_opt opts[] = {CLI_ETCD_OPTS(&ef),
                     {"json", NEWT_OPT_FLAG, &json, "print one JSON document"},
                     {"wait-workers", NEWT_OPT_INT, &wait_workers, "wait until at least N workers are registered"},
                     {"timeout-ms", NEWT_OPT_INT, &timeout, "how long --wait-workers waits"},
                     {"events", NEWT_OPT_INT, &nevents, "newest events to show"},
                     NEWT_OPT_END};
  int rc = newt_opts_exit(newt_opts_parse("status", "--job NAME [flags]", opts, argc, argv, NULL, 0, NULL));
  if (rc >= 0) return rc;
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
  newt_deadline_t d = newt_deadline_in_ms(timeout);
  cJSON *j = NULL;
  int n = 0;
  newt_result_t r;
  for (;;) {
    r = collect(c, ef.job, (int)nevents, &j, &n);
    if (r != NEWT_OK || n >= wait_workers || newt_deadline_passed(d) || newt_stop_requested()) break;
    cJSON_Delete(j);
    j = NULL;
    newt_sleep_ms(200);
  }
  rc = 0;
  if (r != NEWT_OK) {
    fprintf(stderr, "newt status: %s\n", newt_errmsg());
    rc = 1;
  } else {
    if (json) {
      char *t = cJSON_Print(j);
      printf("%s\n", t ? t : "{}");
      free(t);
    } else {
      print_text(j);
    }
    if (n < wait_workers) {
      fprintf(stderr, "newt status: %d workers registered for job %s after %lld ms, %lld wanted\n", n, ef.job,
              (long long)timeout, (long long)wait_workers);
      rc = 1;
    }
  }
  cJSON_Delete(j);
  rdzv_etcd_free(c);
  free(password);
  return rc;
}
