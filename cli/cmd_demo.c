/* newt demo: the rendezvous, shown with real processes on this host.
 *
 * It starts a private etcd, three coordinator candidates and four workers, each a
 * separate `newt demo --role ...` process (this binary re-executed), and narrates:
 * workers register on leases, one coordinator is elected and publishes plan 1, every
 * worker acknowledges it (the generation barrier); one worker is killed with kill -9, its
 * lease expires, the others see it leave and the leader publishes plan 2 to the
 * survivors; then the leader is killed with kill -9, another candidate takes over and
 * publishes plan 3. Everything is then stopped cleanly. Each process prints its own lines,
 * prefixed with its name; the demo's own lines start with "demo:".
 *
 * Roles (hidden flags): --role coordinator|worker --etcd URL --job J --name N --ttl S. */
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cmds.h"
#include "common/json.h"
#include "common/log.h"
#include "common/opts.h"
#include "common/proc.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "job/plan.h"
#include "job/spec.h"
#include "job/store.h"
#include "rendezvous/etcd_server.h"
#include "rendezvous/rdzv.h"

static const char *me = "demo";

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  printf("%-6s %s\n", me, line);
  fflush(stdout);
}

/* The stored plan's generation and its ranks' worker ids (at most 64), read by the plan's own
 * codec (job/plan.h): the demo's plans are the job's plans. */
static int parse_plan(const char *json, size_t len, int64_t *gen, char ids[][RDZV_NAME_MAX], int *n) {
  newt_plan p;
  *n = 0;
  if (plan_from_json(json, len, &p) != NEWT_OK) return -1;
  *gen = (int64_t)p.generation;
  for (int i = 0; i < p.nranks && *n < 64; i++) snprintf(ids[(*n)++], RDZV_NAME_MAX, "%s", p.ranks[i].worker);
  plan_free(&p);
  return 0;
}

static void list_ids(char *out, size_t cap, char ids[][RDZV_NAME_MAX], int n) {
  out[0] = '\0';
  for (int i = 0; i < n; i++) snprintf(out + strlen(out), cap - strlen(out), "%s%s", i ? " " : "", ids[i]);
}

/* --- worker role ------------------------------------------------------------------------------ */

typedef struct worker_ctx {
  rdzv_etcd *c;
  const char *job, *name;
  rdzv_registration *reg;
  int64_t acked;
} worker_ctx;

static void worker_on_member(void *ud, const rdzv_member_event *e) {
  worker_ctx *w = ud;
  static const char *verbs[] = {"joined", "left", "updated", "resync"};
  if (e->id && strcmp(e->id, w->name) != 0 && e->change != RDZV_MEMBER_UPDATE)
    say("sees %s %s (revision %lld)", e->id, verbs[e->change], (long long)e->revision);
}

static void worker_on_plan(void *ud, const rdzv_etcd_watch_resp *r) {
  worker_ctx *w = ud;
  if (r->kind != RDZV_WATCH_EVENTS) return;
  for (size_t i = 0; i < r->n_events; i++) {
    const rdzv_etcd_event *e = &r->events[i];
    int64_t g;
    char ids[64][RDZV_NAME_MAX], list[1024];
    int n;
    if (e->type != RDZV_EVENT_PUT || parse_plan(e->kv.value, e->kv.value_len, &g, ids, &n) != 0 || g <= w->acked)
      continue;
    int in = 0;
    for (int k = 0; k < n; k++) in |= strcmp(ids[k], w->name) == 0;
    if (!in) continue;
    list_ids(list, sizeof list, ids, n);
    if (job_barrier_ack(w->c, w->job, g, w->name, rdzv_registration_lease(w->reg), newt_deadline_in_ms(5000)) == NEWT_OK) {
      w->acked = g;
      say("plan %lld: workers [%s]: acknowledged", (long long)g, list);
    } else {
      say("could not acknowledge plan %lld: %s", (long long)g, newt_errmsg());
    }
  }
}

static int run_worker(rdzv_etcd *c, const char *job, const char *name, int64_t ttl) {
  worker_ctx w = {.c = c, .job = job, .name = name};
  job_worker info = {.device = -1, .state = "ready", .pid = getpid()};
  snprintf(info.id, sizeof info.id, "%s", name);
  snprintf(info.host, sizeof info.host, "%s", newt_hostname());
  if (job_register(c, job, &info, ttl, NULL, NULL, newt_deadline_in_ms(10000), &w.reg) != NEWT_OK) {
    say("cannot register: %s", newt_errmsg());
    return 1;
  }
  say("registered on lease %llx (TTL %lld s, pid %d)", (unsigned long long)rdzv_registration_lease(w.reg),
      (long long)ttl, (int)getpid());
  char plan_key[256];
  job_key(plan_key, sizeof plan_key, job, JOB_REC_PLAN, 0, NULL);
  rdzv_members *m = NULL;
  rdzv_etcd_watch *pw = NULL;
  if (job_members_start(c, job, worker_on_member, &w, newt_deadline_in_ms(10000), &m) != NEWT_OK ||
      rdzv_etcd_watch_start(c, plan_key, &(rdzv_etcd_watch_opts){.start_revision = 1}, worker_on_plan, &w,
                            newt_deadline_in_ms(10000), &pw) != NEWT_OK) {
    say("cannot watch: %s", newt_errmsg());
    return 1;
  }
  while (!newt_stop_requested() && !rdzv_registration_lost(w.reg, NULL, 0)) newt_sleep_ms(50);
  rdzv_etcd_watch_free(pw);
  rdzv_members_free(m);
  if (rdzv_registration_lost(w.reg, NULL, 0)) {
    say("lost my lease");
    return 3;
  }
  rdzv_registration_leave(w.reg, newt_deadline_in_ms(3000));
  rdzv_registration_free(w.reg);
  say("left");
  return 0;
}

/* --- coordinator role ---------------------------------------------------------------------------- */

static void on_leadership(void *ud, int leading, const char *why) {
  if (!leading) say("no longer leader: %s", why);
}

/* Plan g for the registered workers, made by the job's planner (plan_compute, over a spec of
 * the defaults) and written by the plan's codec. The demo's workers have no data plane: a
 * rank's address is "-" (nobody connects to it). */
static newt_result_t make_plan(const char *job, const job_worker *ws, size_t n, int64_t g, char **json) {
  newt_spec s;
  spec_defaults(&s, job);
  plan_member *pm = calloc(n ? n : 1, sizeof *pm);
  if (!pm) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    snprintf(pm[i].id, sizeof pm[i].id, "%s", ws[i].id);
    snprintf(pm[i].host, sizeof pm[i].host, "%s", ws[i].host);
    snprintf(pm[i].addr, sizeof pm[i].addr, "%s", ws[i].addr[0] ? ws[i].addr : "-");
    pm[i].join_rev = ws[i].create_revision;
    pm[i].prev_rank = pm[i].prev_pp = -1;
  }
  newt_plan p;
  newt_result_t r = plan_compute(&s, pm, (int)n, (uint64_t)g - 1, &p);
  free(pm);
  if (r != NEWT_OK) return r;
  r = plan_check_publishable(&p, json);
  plan_free(&p);
  return r;
}

static int publish(rdzv_candidate *cand, rdzv_members *m, const char *job, int64_t g) {
  job_worker *ws;
  size_t n;
  if (job_members_get(m, &ws, &n, NULL) != NEWT_OK) return -1;
  char list[1024] = "", *json = NULL;
  for (size_t i = 0; i < n; i++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? " " : "", ws[i].id);
  newt_result_t r = make_plan(job, ws, n, g, &json);
  free(ws);
  if (r == NEWT_OK) r = job_plan_publish(cand, job, g, json, newt_deadline_in_ms(5000));
  free(json);
  if (r != NEWT_OK) {
    say("plan %lld refused: %s", (long long)g, newt_errmsg());
    return -1;
  }
  say("published plan %lld: workers [%s]", (long long)g, list);
  return 0;
}

static int run_coordinator(rdzv_etcd *c, const char *job, const char *name, int64_t ttl) {
  rdzv_candidate *cand;
  rdzv_campaign_opts co = {.name = name, .ttl_s = ttl, .fn = on_leadership};
  if (job_campaign(c, job, &co, newt_deadline_in_ms(10000), &cand) != NEWT_OK) {
    say("cannot campaign: %s", newt_errmsg());
    return 1;
  }
  say("candidate (lease %llx)", (unsigned long long)rdzv_candidate_lease(cand));
  newt_result_t r;
  while ((r = rdzv_candidate_wait(cand, newt_deadline_in_ms(200))) == NEWT_ERR_TIMEOUT && !newt_stop_requested()) {
  }
  if (r != NEWT_OK) {
    rdzv_candidate_resign(cand, newt_deadline_in_ms(2000));
    rdzv_candidate_free(cand);
    return newt_stop_requested() ? 0 : 3;
  }
  say("elected leader");
  rdzv_members *m;
  if (job_members_start(c, job, NULL, NULL, newt_deadline_in_ms(10000), &m) != NEWT_OK) return 1;
  int64_t g = 0;
  job_plan_get(c, job, newt_deadline_in_ms(5000), NULL, &g, NULL);
  int64_t seen = 0;
  size_t last_n = (size_t)-1;
  while (!newt_stop_requested() && rdzv_candidate_is_leader(cand)) {
    size_t n = rdzv_members_count(m);
    /* a new plan when membership changed (and at once after an election) */
    if (n != last_n && n > 0) {
      if (publish(cand, m, job, ++g) != 0) break;
      last_n = n;
    }
    rdzv_members_wait(m, seen, newt_deadline_in_ms(200), NULL, &seen);
  }
  rdzv_members_free(m);
  int stopped = newt_stop_requested();
  rdzv_candidate_resign(cand, newt_deadline_in_ms(2000));
  rdzv_candidate_free(cand);
  return stopped ? 0 : 3;
}

/* --- the orchestrator ------------------------------------------------------------------------------ */

typedef struct child {
  char name[16];
  pid_t pid;
} child;

static newt_result_t spawn_child(const char *exe, const char *role, const char *url, const char *job, const char *name,
                                 int64_t ttl, pid_t *pid) {
  char ttl_s[32];
  snprintf(ttl_s, sizeof ttl_s, "%lld", (long long)ttl);
  const char *argv[] = {exe, "demo", "--role", role, "--etcd", url, "--job", job, "--name", name, "--ttl", ttl_s, NULL};
  newt_spawn_opts so = {.die_with_parent = 1};
  return newt_proc_spawn(argv, &so, pid);
}

/* Waits for a plan newer than `after` with `want` workers, then for its barrier. */
static newt_result_t wait_plan(rdzv_etcd *c, const char *job, int64_t after, int want, int64_t *gen, char *leader,
                               size_t cap) {
  newt_deadline_t d = newt_deadline_in_ms(30000);
  for (;;) {
    char *json = NULL;
    int64_t g = 0;
    if (job_plan_get(c, job, d, &json, &g, NULL) == NEWT_OK && g > after) {
      char ids[64][RDZV_NAME_MAX];
      int n = 0;
      parse_plan(json, strlen(json), &g, ids, &n);
      free(json);
      /* who published it: the election's leader (the plan is written only by the leader) */
      if (job_leader_get(c, job, d, leader, cap, NULL) != NEWT_OK) snprintf(leader, cap, "?");
      if (n == want) {
        const char *idp[64];
        for (int i = 0; i < n; i++) idp[i] = ids[i];
        NEWT_CHECK(job_barrier_wait(c, job, g, idp, (size_t)n, d, NULL));
        *gen = g;
        return NEWT_OK;
      }
    } else {
      free(json);
    }
    if (newt_deadline_passed(d))
      return NEWT_ERR(NEWT_ERR_TIMEOUT, "no plan after generation %lld with %d workers in 30 s", (long long)after, want);
    if (newt_stop_requested()) return NEWT_ERR(NEWT_ERR_ABORTED, "interrupted");
    newt_sleep_ms(50);
  }
}

static int find_child(child *cs, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(cs[i].name, name) == 0) return i;
  return -1;
}

static int run_demo(int64_t nworkers, int64_t ncoords, int64_t ttl) {
  char exe[1024];
  if (newt_proc_self_exe(exe, sizeof exe) != NEWT_OK) {
    fprintf(stderr, "newt demo: %s\n", newt_errmsg());
    return 1;
  }
  uint64_t t_start = newt_now_ns();
  rdzv_etcd_server *srv;
  if (rdzv_etcd_server_start(NULL, &srv) != NEWT_OK) {
    fprintf(stderr, "newt demo: %s\n", newt_errmsg());
    return 1;
  }
  const char *url = rdzv_etcd_server_url(srv);
  say("etcd %s is up (data in %s, pid %d)", url, rdzv_etcd_server_dir(srv), (int)rdzv_etcd_server_pid(srv));
  rdzv_etcd *c;
  rdzv_etcd_opts eo = {.endpoints = url};
  if (rdzv_etcd_init(&eo, &c) != NEWT_OK) return 1;
  const char *job = "demo";
  child cs[16];
  int n = 0, rc = 1;
  say("starting %lld workers and %lld coordinator candidates (leases of %lld s)", (long long)nworkers,
      (long long)ncoords, (long long)ttl);
  for (int i = 0; i < nworkers; i++, n++) {
    snprintf(cs[n].name, sizeof cs[n].name, "w%d", i);
    if (spawn_child(exe, "worker", url, job, cs[n].name, ttl, &cs[n].pid) != NEWT_OK) goto out;
  }
  for (int i = 0; i < ncoords; i++, n++) {
    snprintf(cs[n].name, sizeof cs[n].name, "c%d", i);
    if (spawn_child(exe, "coordinator", url, job, cs[n].name, ttl, &cs[n].pid) != NEWT_OK) goto out;
  }
  int64_t g = 0;
  char leader[64];
  if (wait_plan(c, job, 0, (int)nworkers, &g, leader, sizeof leader) != NEWT_OK) goto fail;
  say("leader %s published plan %lld and all %lld workers acknowledged it", leader, (long long)g, (long long)nworkers);

  int victim = find_child(cs, n, "w2");
  say("killing worker %s (pid %d) with kill -9; its lease expires within %lld s", cs[victim].name,
      (int)cs[victim].pid, (long long)ttl);
  uint64_t t0 = newt_now_ns();
  kill(cs[victim].pid, SIGKILL);
  newt_proc_wait(cs[victim].pid, 5000, NULL);
  cs[victim].pid = 0;
  if (wait_plan(c, job, g, (int)nworkers - 1, &g, leader, sizeof leader) != NEWT_OK) goto fail;
  say("%.1f s later: %s published plan %lld without %s, and the %lld survivors acknowledged it",
      (double)(newt_now_ns() - t0) / 1e9, leader, (long long)g, cs[victim].name, (long long)nworkers - 1);

  int lead = find_child(cs, n, leader);
  if (lead < 0) goto fail;
  say("killing the leader %s (pid %d) with kill -9", leader, (int)cs[lead].pid);
  t0 = newt_now_ns();
  kill(cs[lead].pid, SIGKILL);
  newt_proc_wait(cs[lead].pid, 5000, NULL);
  cs[lead].pid = 0;
  char old[64];
  snprintf(old, sizeof old, "%s", leader);
  if (wait_plan(c, job, g, (int)nworkers - 1, &g, leader, sizeof leader) != NEWT_OK) goto fail;
  say("%.1f s later: %s leads instead of %s, published plan %lld, acknowledged by all %lld workers",
      (double)(newt_now_ns() - t0) / 1e9, leader, old, (long long)g, (long long)nworkers - 1);
  rc = strcmp(leader, old) != 0 ? 0 : 1;
  goto out;
fail:
  say("failed: %s", newt_errmsg());
out:
  say("stopping everything");
  /* coordinators first (so no one is elected on the way out), then the workers */
  for (int pass = 0; pass < 2; pass++)
    for (int i = n - 1; i >= 0; i--)
      if (cs[i].pid > 0 && (cs[i].name[0] == 'c') == (pass == 0)) {
        newt_proc_stop(cs[i].pid, 5000);
        cs[i].pid = 0;
      }
  rdzv_etcd_free(c);
  rdzv_etcd_server_free(srv);
  say("%s in %.1f s", rc == 0 ? "done" : "FAILED", (double)(newt_now_ns() - t_start) / 1e9);
  return rc;
}

int newt_cmd_demo(int argc, char **argv) {
  const char *role = NULL, *etcd = NULL, *job = "demo", *name = NULL;
  int64_t workers = 4, coordinators = 3, ttl = 2;
  newt_opt opts[] = {
      {"workers", NEWT_OPT_INT, &workers, "worker processes (at least 3)"},
      {"coordinators", NEWT_OPT_INT, &coordinators, "coordinator candidates (at least 2)"},
      {"ttl", NEWT_OPT_INT, &ttl, "lease TTL in seconds"},
      {"role", NEWT_OPT_STR, &role, "(internal) coordinator or worker"},
      {"etcd", NEWT_OPT_STR, &etcd, "(internal) etcd endpoints"},
      {"job", NEWT_OPT_STR, &job, "(internal) job name"},
      {"name", NEWT_OPT_STR, &name, "(internal) this process's name"},
      NEWT_OPT_END,
  };
  int ex = newt_opts_exit(newt_opts_parse("demo", "[flags]", opts, argc, argv, NULL, 0, NULL));
  if (ex >= 0) return ex;
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (ttl < 1 || workers < 3 || workers > 8 || coordinators < 2 || coordinators > 8) {
    fprintf(stderr, "newt demo: --ttl >= 1, --workers 3..8, --coordinators 2..8\n");
    return 2;
  }
  if (!role) return run_demo(workers, coordinators, ttl);
  if (!etcd || !name) {
    fprintf(stderr, "newt demo --role needs --etcd and --name\n");
    return 2;
  }
  me = name;
  newt_log_set_name(name);
  rdzv_etcd *c;
  rdzv_etcd_opts eo = {.endpoints = etcd};
  if (rdzv_etcd_init(&eo, &c) != NEWT_OK) {
    fprintf(stderr, "%s: %s\n", name, newt_errmsg());
    return 1;
  }
  int rc = strcmp(role, "worker") == 0        ? run_worker(c, job, name, ttl)
           : strcmp(role, "coordinator") == 0 ? run_coordinator(c, job, name, ttl)
                                              : 2;
  rdzv_etcd_free(c);
  return rc;
}
