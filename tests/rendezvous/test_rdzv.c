/* Integration tests of the rendezvous protocols against a real etcd: registration on a
 * lease (a registered worker process killed with kill -9 leaves the view when its lease
 * expires), the membership view (snapshot + watch), leader election with real candidate
 * processes (kill -9 of the leader, SIGSTOP of the next one past its TTL; an observer
 * watching etcd checks that every leader write came from the one leader of that moment),
 * deposed leaders' guarded writes, and the generation barrier; each through the job's records
 * over them (job/store.h), as the coordinator and the worker use them.
 *
 * The candidate and worker processes are this binary re-executed with --candidate or
 * --worker. */
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/json.h"
#include "rdzv_test.h"
#include "job/store.h"
#include "rendezvous/rdzv.h"

static rdzv_etcd_server *srv;
static rdzv_etcd *cli;
static char self_exe[1024];

static newt_deadline_t dl(int64_t ms) { return newt_deadline_in_ms(ms); }

/* --- child roles -------------------------------------------------------------------------- */

/* --candidate URL JOB NAME TTL: campaigns; while leading, writes its name to /newt/JOB/owner
 * (guarded) every 50 ms. Exits 3 when a guarded write is refused. */
static int candidate_main(char **argv) {
  rdzv_etcd_opts o = {.endpoints = argv[0]};
  rdzv_etcd *c = tu_client_opts(&o);
  rdzv_campaign_opts co = {.name = argv[2], .ttl_s = atoi(argv[3])};
  rdzv_candidate *cand;
  if (job_campaign(c, argv[1], &co, dl(10000), &cand) != NEWT_OK) {
    fprintf(stderr, "%s: campaign: %s\n", argv[2], newt_errmsg());
    return 2;
  }
  if (rdzv_candidate_wait(cand, NEWT_DEADLINE_NONE) != NEWT_OK) {
    fprintf(stderr, "%s: %s\n", argv[2], newt_errmsg());
    return 4;
  }
  char key[256];
  newt_job_path(key, sizeof key, argv[1], "owner");
  for (;;) {
    newt_result_t r = rdzv_guarded_put(cand, key, argv[2], strlen(argv[2]), dl(1000), NULL);
    if (r == NEWT_ERR_CONFLICT) {
      fprintf(stderr, "%s: %s\n", argv[2], newt_errmsg());
      return 3;
    }
    newt_sleep_ms(50);
  }
}

/* --worker URL JOB ID TTL: registers and waits to be killed. */
static int worker_main(char **argv) {
  rdzv_etcd_opts o = {.endpoints = argv[0]};
  rdzv_etcd *c = tu_client_opts(&o);
  job_worker w = {.device = -1, .state = "ready", .pid = getpid()};
  snprintf(w.id, sizeof w.id, "%s", argv[2]);
  snprintf(w.host, sizeof w.host, "%s", "localhost");
  rdzv_registration *r;
  if (job_register(c, argv[1], &w, atoi(argv[3]), NULL, NULL, dl(10000), &r) != NEWT_OK) {
    fprintf(stderr, "worker %s: %s\n", argv[2], newt_errmsg());
    return 2;
  }
  for (;;) newt_sleep_ms(1000);
}

/* A host: one process that grants the host's lease and registers workers <name>-0..2 on it
 * (as a node agent's workers do), then lives until killed. */
static int host_main(char **argv) {
  rdzv_etcd_opts o = {.endpoints = argv[0]};
  rdzv_etcd *c = tu_client_opts(&o);
  int64_t ttl = atoi(argv[3]), lease = 0;
  if (rdzv_etcd_lease_grant(c, ttl, 0, dl(10000), &lease, NULL) != NEWT_OK) {
    fprintf(stderr, "host %s: %s\n", argv[2], newt_errmsg());
    return 2;
  }
  for (int i = 0; i < 3; i++) {
    job_worker w = {.device = -1, .state = "ready", .pid = getpid()};
    snprintf(w.id, sizeof w.id, "%s-%d", argv[2], i);
    snprintf(w.host, sizeof w.host, "%s", argv[2]);
    rdzv_registration *r;
    if (job_register_on(c, argv[1], &w, lease, ttl, NULL, NULL, dl(10000), &r) != NEWT_OK ||
        !rdzv_registration_shared(r)) {
      fprintf(stderr, "host %s: %s\n", argv[2], newt_errmsg());
      return 2;
    }
  }
  for (;;) newt_sleep_ms(1000);
}

static pid_t spawn_role(const char *role, const char *job, const char *name, const char *ttl) {
  const char *argv[] = {self_exe, role, rdzv_etcd_server_url(srv), job, name, ttl, NULL};
  pid_t pid = 0;
  newt_spawn_opts so = {.die_with_parent = 1};
  if (newt_proc_spawn(argv, &so, &pid) != NEWT_OK) {
    fprintf(stderr, "FATAL: %s\n", newt_errmsg());
    exit(1);
  }
  return pid;
}

/* --- membership ------------------------------------------------------------------------------ */

typedef struct view_log {
  pthread_mutex_t mu;
  int joins, leaves, updates, resyncs;
  char last_id[RDZV_NAME_MAX];
  char last_state[64];
  int64_t last_rev;
  int out_of_order;
  int64_t leave_rev[16]; /* the revisions of the first 16 leaves */
} view_log;

static void on_member(void *ud, const rdzv_member_event *e) {
  view_log *v = ud;
  pthread_mutex_lock(&v->mu);
  if (e->revision < v->last_rev) v->out_of_order++;
  v->last_rev = e->revision;
  switch (e->change) {
    case RDZV_MEMBER_JOIN: v->joins++; break;
    case RDZV_MEMBER_LEAVE:
      if (v->leaves < 16) v->leave_rev[v->leaves] = e->revision;
      v->leaves++;
      break;
    case RDZV_MEMBER_UPDATE: v->updates++; break;
    case RDZV_MEMBER_RESYNC: v->resyncs++; break;
  }
  if (e->value) {
    const job_worker *w = e->value;
    snprintf(v->last_id, sizeof v->last_id, "%s", e->id);
    snprintf(v->last_state, sizeof v->last_state, "%s", w->state);
  }
  pthread_mutex_unlock(&v->mu);
}

static int view_get(view_log *v, int which) {
  pthread_mutex_lock(&v->mu);
  int n = which == 0 ? v->joins : which == 1 ? v->leaves : v->updates;
  pthread_mutex_unlock(&v->mu);
  return n;
}

static int wait_view(view_log *v, int which, int want, int64_t ms) {
  newt_deadline_t d = dl(ms);
  while (view_get(v, which) < want && !newt_deadline_passed(d)) newt_sleep_ms(10);
  return view_get(v, which) >= want;
}

static job_worker mkworker(const char *id) {
  job_worker w = {.device = -1, .state = "joining", .host = "localhost", .pid = getpid()};
  snprintf(w.id, sizeof w.id, "%s", id);
  return w;
}

static void test_membership(void) {
  rdzv_registration *r[4];
  for (int i = 0; i < 3; i++) {
    char id[16];
    snprintf(id, sizeof id, "w%d", i);
    job_worker w = mkworker(id);
    T_OK(job_register(cli, "mem", &w, 10, NULL, NULL, dl(5000), &r[i]));
  }
  /* an id in use is refused */
  job_worker dup = mkworker("w1");
  rdzv_registration *rd;
  T_ERR(NEWT_ERR_CONFLICT, job_register(cli, "mem", &dup, 10, NULL, NULL, dl(5000), &rd));
  T_CHECK(strstr(newt_errmsg(), "w1") != NULL);

  view_log v = {.mu = PTHREAD_MUTEX_INITIALIZER};
  rdzv_members *m;
  T_OK(job_members_start(cli, "mem", on_member, &v, dl(5000), &m));
  T_CHECK(view_get(&v, 0) == 3 && rdzv_members_count(m) == 3); /* the snapshot, delivered before start returns */
  job_worker *list;
  size_t n;
  int64_t rev0;
  T_OK(job_members_get(m, &list, &n, &rev0));
  T_CHECK(n == 3 && strcmp(list[0].id, "w0") == 0 && strcmp(list[2].id, "w2") == 0 && list[1].lease == rdzv_registration_lease(r[1]));
  free(list);

  job_worker w3 = mkworker("w3");
  T_OK(job_register(cli, "mem", &w3, 10, NULL, NULL, dl(5000), &r[3]));
  T_CHECK(wait_view(&v, 0, 4, 5000));
  T_OK(job_registration_update(r[0], "training", 5, dl(5000)));
  T_CHECK(wait_view(&v, 2, 1, 5000));
  pthread_mutex_lock(&v.mu);
  T_CHECK(strcmp(v.last_id, "w0") == 0 && strcmp(v.last_state, "training") == 0);
  pthread_mutex_unlock(&v.mu);
  /* a graceful leave is seen at once */
  int64_t before = 0;
  T_OK(job_members_get(m, &list, &n, &before));
  free(list);
  T_OK(rdzv_registration_leave(r[2], dl(5000)));
  int64_t rev = 0;
  T_OK(rdzv_members_wait(m, before, dl(5000), NULL, &rev));
  T_CHECK(wait_view(&v, 1, 1, 5000) && rev > before);
  T_OK(job_members_get(m, &list, &n, NULL));
  T_CHECK(n == 3);
  free(list);
  rdzv_registration_free(r[2]);
  /* a lease that is no longer kept alive expires and takes its registration with it */
  job_worker w4 = mkworker("w4");
  rdzv_registration *r4;
  T_OK(job_register(cli, "mem", &w4, 1, NULL, NULL, dl(5000), &r4));
  T_CHECK(wait_view(&v, 0, 5, 5000));
  uint64_t t0 = newt_now_ns();
  rdzv_registration_free(r4); /* stops the keep-alive without revoking */
  T_CHECK(wait_view(&v, 1, 2, 10000));
  fprintf(stderr, "  TTL 1 s registration gone %.0f ms after its keep-alive stopped\n", (double)(newt_now_ns() - t0) / 1e6);
  T_ERR(NEWT_ERR_TIMEOUT, rdzv_members_wait(m, INT64_MAX - 1, dl(100), NULL, NULL));
  atomic_int abort_flag = 1;
  T_ERR(NEWT_ERR_ABORTED, rdzv_members_wait(m, INT64_MAX - 1, dl(5000), &abort_flag, NULL));
  T_CHECK(v.out_of_order == 0);
  rdzv_members_free(m);
  for (int i = 0; i < 4; i++)
    if (i != 2) {
      T_OK(rdzv_registration_leave(r[i], dl(5000)));
      rdzv_registration_free(r[i]);
    }
}

static void test_killed_worker_leaves(void) {
  view_log v = {.mu = PTHREAD_MUTEX_INITIALIZER};
  rdzv_members *m;
  T_OK(job_members_start(cli, "kill", on_member, &v, dl(5000), &m));
  pid_t pid = spawn_role("--worker", "kill", "victim", "2");
  T_CHECK(wait_view(&v, 0, 1, 10000));
  uint64_t t0 = newt_now_ns();
  kill(pid, SIGKILL);
  newt_proc_wait(pid, 5000, NULL);
  T_CHECK(wait_view(&v, 1, 1, 10000));
  double ms = (double)(newt_now_ns() - t0) / 1e6;
  fprintf(stderr, "  worker killed with kill -9 left the view after %.0f ms (TTL 2 s)\n", ms);
  T_CHECK(ms < 2000 + 4000);
  rdzv_members_free(m);
}

/* Workers on their host's lease (job_register_on): one write each; one that leaves takes
 * only its own key; one whose key was deleted under it (its agent took it for dead, or the
 * leader fenced it) is refused and registers on the host's lease again; the host lost (its
 * lease revoked or expired) takes every worker on it at once, in one revision; after that a
 * renewal, or a registration on a lease that is gone, uses a lease of its own. */
static void test_host_lease(void) {
  rdzv_etcd *wc = tu_client(srv); /* the host's client: its writes are the host's */
  int64_t host = 0;
  T_OK(rdzv_etcd_lease_grant(wc, 30, 0, dl(5000), &host, NULL));
  view_log v = {.mu = PTHREAD_MUTEX_INITIALIZER};
  rdzv_members *m;
  T_OK(job_members_start(cli, "host", on_member, &v, dl(5000), &m));
  rdzv_registration *r[3] = {0};
  int64_t w0 = rdzv_etcd_writes(wc);
  for (int i = 0; i < 3; i++) {
    char id[16];
    snprintf(id, sizeof id, "h%d", i);
    job_worker w = mkworker(id);
    T_OK(job_register_on(wc, "host", &w, host, 30, NULL, NULL, dl(5000), &r[i]));
    if (!r[i]) return;
    T_CHECK(rdzv_registration_shared(r[i]) && rdzv_registration_lease(r[i]) == host);
  }
  T_CHECK_MSG(rdzv_etcd_writes(wc) - w0 == 3, "3 registrations on the host's lease took %lld writes",
              (long long)(rdzv_etcd_writes(wc) - w0));
  T_CHECK(wait_view(&v, 0, 3, 5000));
  /* one leaves: its key goes, the lease and the others stay */
  T_OK(rdzv_registration_leave(r[1], dl(5000)));
  T_CHECK(wait_view(&v, 1, 1, 5000));
  T_CHECK(rdzv_members_count(m) == 2);
  int64_t ttl = 0;
  T_OK(rdzv_etcd_lease_keepalive_once(cli, host, dl(5000), &ttl));
  rdzv_registration_free(r[1]);
  r[1] = NULL;
  /* h2's key deleted under it: refused, then registered on the host's lease again */
  char key[128];
  T_OK(newt_job_path(key, sizeof key, "host", "workers/h2"));
  T_OK(rdzv_etcd_delete(cli, key, 0, dl(5000), NULL, NULL));
  T_CHECK(wait_view(&v, 1, 2, 5000));
  T_ERR(NEWT_ERR_CONFLICT, job_registration_update(r[2], "training", 1, dl(5000)));
  T_OK(rdzv_registration_renew(r[2], dl(5000)));
  T_CHECK(rdzv_registration_shared(r[2]) && rdzv_registration_lease(r[2]) == host);
  T_CHECK(wait_view(&v, 0, 4, 5000));
  T_OK(rdzv_etcd_lease_keepalive_once(cli, host, dl(5000), &ttl)); /* the renewal kept the host's lease */
  /* the host lost: both workers on its lease go at once */
  T_OK(rdzv_etcd_lease_revoke(cli, host, dl(5000)));
  T_CHECK(wait_view(&v, 1, 4, 5000));
  T_CHECK(rdzv_members_count(m) == 0);
  pthread_mutex_lock(&v.mu);
  T_CHECK_MSG(v.leave_rev[2] == v.leave_rev[3], "the host's workers left at revisions %lld and %lld",
              (long long)v.leave_rev[2], (long long)v.leave_rev[3]);
  pthread_mutex_unlock(&v.mu);
  /* after that a renewal goes on with a lease of its own, and so does a new registration */
  T_OK(rdzv_registration_renew(r[0], dl(5000)));
  T_CHECK(!rdzv_registration_shared(r[0]) && rdzv_registration_lease(r[0]) != host);
  job_worker w9 = mkworker("h9");
  rdzv_registration *r9 = NULL;
  T_OK(job_register_on(wc, "host", &w9, host, 30, NULL, NULL, dl(5000), &r9));
  T_CHECK(r9 && !rdzv_registration_shared(r9) && rdzv_registration_lease(r9) != host);
  T_ERR(NEWT_ERR_INVALID, job_register_on(wc, "host", &w9, 0, 30, NULL, NULL, dl(5000), &r9));
  T_CHECK(wait_view(&v, 0, 6, 5000));
  rdzv_registration_leave(r[0], dl(5000));
  rdzv_registration_free(r[0]);
  rdzv_registration_free(r[2]);
  if (r9) rdzv_registration_leave(r9, dl(5000));
  rdzv_registration_free(r9);
  rdzv_members_free(m);
  rdzv_etcd_free(wc);
}

/* A host killed with kill -9 (its process holds the lease its three workers are on): all
 * three leave the view together, in one revision, once its lease runs out. */
static void test_host_killed(void) {
  view_log v = {.mu = PTHREAD_MUTEX_INITIALIZER};
  rdzv_members *m;
  T_OK(job_members_start(cli, "hostkill", on_member, &v, dl(5000), &m));
  pid_t pid = spawn_role("--host", "hostkill", "node7", "2");
  T_CHECK(wait_view(&v, 0, 3, 10000));
  job_worker *list = NULL;
  size_t n = 0;
  T_OK(job_members_get(m, &list, &n, NULL));
  T_CHECK(n == 3 && list[0].lease && list[0].lease == list[1].lease && list[1].lease == list[2].lease);
  free(list);
  kill(pid, SIGKILL);
  newt_proc_wait(pid, 5000, NULL);
  T_CHECK(wait_view(&v, 1, 3, 10000));
  pthread_mutex_lock(&v.mu);
  T_CHECK(v.leave_rev[0] == v.leave_rev[1] && v.leave_rev[1] == v.leave_rev[2]);
  pthread_mutex_unlock(&v.mu);
  rdzv_members_free(m);
}

/* --- election, in process ---------------------------------------------------------------------- */

typedef struct lead_log {
  atomic_int gained, lost;
} lead_log;

static void on_lead(void *ud, int leading, const char *why) {
  lead_log *l = ud;
  atomic_fetch_add(leading ? &l->gained : &l->lost, 1);
}

static void *abort_later(void *arg) {
  newt_sleep_ms(200);
  rdzv_candidate_abort(arg);
  return NULL;
}

static void test_election_inprocess(void) {
  lead_log la = {0}, lb = {0};
  rdzv_candidate *a, *b;
  rdzv_campaign_opts oa = {.name = "a", .ttl_s = 5, .fn = on_lead, .ud = &la};
  rdzv_campaign_opts ob = {.name = "b", .ttl_s = 5, .fn = on_lead, .ud = &lb};
  T_OK(job_campaign(cli, "el", &oa, dl(5000), &a));
  T_OK(rdzv_candidate_wait(a, dl(5000)));
  T_OK(job_campaign(cli, "el", &ob, dl(5000), &b));
  T_ERR(NEWT_ERR_TIMEOUT, rdzv_candidate_wait(b, dl(300)));
  pthread_t th;
  pthread_create(&th, NULL, abort_later, b);
  T_ERR(NEWT_ERR_ABORTED, rdzv_candidate_wait(b, dl(10000)));
  pthread_join(th, NULL);
  T_CHECK(rdzv_candidate_is_leader(a) && !rdzv_candidate_is_leader(b));
  char name[64];
  T_OK(job_leader_get(cli, "el", dl(5000), name, sizeof name, NULL));
  T_CHECK(strcmp(name, "a") == 0);
  T_OK(job_plan_publish(a, "el", 1, "{\"generation\":1,\"workers\":[]}", dl(5000)));
  T_ERR(NEWT_ERR_INVALID, job_plan_publish(a, "el", 0, "{\"generation\":0}", dl(5000))); /* generations start at 1 */
  T_ERR(NEWT_ERR_CONFLICT, job_plan_publish(b, "el", 2, "{\"generation\":2}", dl(5000))); /* not the leader */
  /* a resigns: b takes over at once */
  uint64_t t0 = newt_now_ns();
  T_OK(rdzv_candidate_resign(a, dl(5000)));
  T_OK(rdzv_candidate_wait(b, dl(5000)));
  fprintf(stderr, "  takeover after resign: %.0f ms\n", (double)(newt_now_ns() - t0) / 1e6);
  T_ERR(NEWT_ERR_CONFLICT, job_plan_publish(a, "el", 2, "{\"generation\":2}", dl(5000)));
  T_OK(job_plan_publish(b, "el", 2, "{\"generation\":2}", dl(5000)));
  int64_t g = 0;
  T_OK(job_plan_get(cli, "el", dl(5000), NULL, &g, NULL));
  T_CHECK(g == 2);
  T_CHECK(atomic_load(&la.gained) == 1 && atomic_load(&la.lost) == 1 && atomic_load(&lb.gained) == 1);

  /* deposed from outside: b's lease is revoked by someone else; its guarded write fails */
  rdzv_etcd *other = tu_client(srv);
  T_OK(rdzv_etcd_lease_revoke(other, rdzv_candidate_lease(b), dl(5000)));
  newt_result_t r = job_plan_publish(b, "el", 3, "{\"generation\":3}", dl(5000));
  T_CHECK(r == NEWT_ERR_CONFLICT);
  fprintf(stderr, "  deposed leader's write: %s\n", newt_errmsg());
  for (int i = 0; i < 100 && !atomic_load(&lb.lost); i++) newt_sleep_ms(20);
  T_CHECK(atomic_load(&lb.lost) == 1 && !rdzv_candidate_is_leader(b));
  T_ERR(NEWT_ERR_CONFLICT, rdzv_candidate_wait(b, dl(1000)));
  T_OK(job_plan_get(cli, "el", dl(5000), NULL, &g, NULL));
  T_CHECK(g == 2);
  rdzv_etcd_free(other);
  rdzv_candidate_free(a);
  rdzv_candidate_free(b);
}

/* --- election with processes, checked from the outside ------------------------------------------ */

typedef struct hist_ev {
  char key[128];
  char value[128];
  int del;
  int64_t create_rev, mod_rev;
} hist_ev;

typedef struct history {
  pthread_mutex_t mu;
  hist_ev ev[4096];
  int n;
  char last_owner[64];
  int64_t owner_writes;
} history;

static void on_history(void *ud, const rdzv_etcd_watch_resp *r) {
  history *h = ud;
  if (r->kind != RDZV_WATCH_EVENTS) return;
  pthread_mutex_lock(&h->mu);
  for (size_t i = 0; i < r->n_events && h->n < 4096; i++) {
    const rdzv_etcd_event *e = &r->events[i];
    hist_ev *x = &h->ev[h->n++];
    snprintf(x->key, sizeof x->key, "%s", e->kv.key);
    snprintf(x->value, sizeof x->value, "%.*s", (int)e->kv.value_len, e->kv.value ? e->kv.value : "");
    x->del = e->type == RDZV_EVENT_DELETE;
    x->create_rev = e->kv.create_revision;
    x->mod_rev = e->kv.mod_revision;
    if (strstr(x->key, "/owner") && !x->del) {
      snprintf(h->last_owner, sizeof h->last_owner, "%s", x->value);
      h->owner_writes++;
    }
  }
  pthread_mutex_unlock(&h->mu);
}

static void owner_now(history *h, char *out, size_t cap, int64_t *writes) {
  pthread_mutex_lock(&h->mu);
  snprintf(out, cap, "%s", h->last_owner);
  *writes = h->owner_writes;
  pthread_mutex_unlock(&h->mu);
}

/* Waits until someone other than `not` writes as owner; returns its index in names. */
static int wait_owner(history *h, const char *not, char names[][16], int n, int64_t ms) {
  newt_deadline_t d = dl(ms);
  while (!newt_deadline_passed(d)) {
    char o[64];
    int64_t w;
    owner_now(h, o, sizeof o, &w);
    for (int i = 0; i < n; i++)
      if (o[0] && strcmp(o, names[i]) == 0 && (!not || strcmp(o, not) != 0)) return i;
    newt_sleep_ms(10);
  }
  return -1;
}

static void test_election_processes(void) {
  const char *job = "elp";
  const int ttl = 2;
  history *h = calloc(1, sizeof *h);
  pthread_mutex_init(&h->mu, NULL);
  char prefix[64];
  newt_job_path(prefix, sizeof prefix, job, "");
  rdzv_etcd_watch *w;
  T_OK(rdzv_etcd_watch_start(cli, prefix, &(rdzv_etcd_watch_opts){.prefix = 1}, on_history, h, dl(5000), &w));
  char names[3][16] = {"c0", "c1", "c2"};
  pid_t pids[3];
  for (int i = 0; i < 3; i++) pids[i] = spawn_role("--candidate", job, names[i], "2");
  int first = wait_owner(h, NULL, names, 3, 15000);
  T_CHECK(first >= 0);
  if (first < 0) goto out;
  newt_sleep_ms(300);
  /* kill -9 the leader: another must lead within its TTL (plus etcd's expiry check and slack) */
  uint64_t t0 = newt_now_ns();
  kill(pids[first], SIGKILL);
  newt_proc_wait(pids[first], 5000, NULL);
  int second = wait_owner(h, names[first], names, 3, ttl * 1000 + 8000);
  double ms = (double)(newt_now_ns() - t0) / 1e6;
  T_CHECK(second >= 0 && second != first);
  fprintf(stderr, "  leader %s killed with kill -9; %s leads and writes after %.0f ms (TTL %d s)\n", names[first],
          second >= 0 ? names[second] : "nobody", ms, ttl);
  T_CHECK(ms < ttl * 1000 + 3000);
  if (second < 0) goto out;
  newt_sleep_ms(300);
  /* SIGSTOP the new leader past its TTL: the third takes over; when the stopped one resumes
   * it still believes it leads until its first guarded write is refused (exit 3) */
  kill(pids[second], SIGSTOP);
  int third = wait_owner(h, names[second], names, 3, ttl * 1000 + 8000);
  T_CHECK(third >= 0 && third != first && third != second);
  newt_sleep_ms(300);
  kill(pids[second], SIGCONT);
  int st = 0;
  T_OK(newt_proc_wait(pids[second], 10000, &st));
  T_CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 3, "the resumed, deposed leader ended with status 0x%x", st);
  pids[second] = 0;
  newt_sleep_ms(500);
out:
  for (int i = 0; i < 3; i++)
    if (pids[i] > 0 && i != first) newt_proc_stop(pids[i], 2000);
  newt_sleep_ms(200);
  rdzv_etcd_watch_free(w);
  /* Replay the history: at every owner write, the writer must be the candidate with the
   * lowest create_revision among the candidacy keys that exist at that revision. */
  struct {
    char key[128];
    char name[16];
    int64_t create_rev;
  } cands[16];
  int nc = 0, bad = 0, writes = 0, switches = 0;
  char prev[64] = "";
  for (int i = 0; i < h->n; i++) {
    hist_ev *x = &h->ev[i];
    if (strstr(x->key, "/election/")) {
      int at = -1;
      for (int k = 0; k < nc; k++)
        if (strcmp(cands[k].key, x->key) == 0) at = k;
      if (x->del) {
        if (at >= 0) cands[at] = cands[--nc];
      } else if (at < 0 && nc < 16) {
        snprintf(cands[nc].key, sizeof cands[nc].key, "%s", x->key);
        cJSON *j = NULL;
        const char *nm = "?";
        if (newt_json_parse(x->value, strlen(x->value), "candidacy", &j) == NEWT_OK)
          newt_json_get_str(j, "candidacy", "name", 0, &nm);
        snprintf(cands[nc].name, sizeof cands[nc].name, "%s", nm);
        cJSON_Delete(j);
        cands[nc].create_rev = x->create_rev;
        nc++;
      }
    } else if (strstr(x->key, "/owner") && !x->del) {
      int lo = -1;
      for (int k = 0; k < nc; k++)
        if (lo < 0 || cands[k].create_rev < cands[lo].create_rev) lo = k;
      writes++;
      if (lo < 0 || strcmp(cands[lo].name, x->value) != 0) {
        bad++;
        fprintf(stderr, "  revision %lld: %s wrote, but %s led\n", (long long)x->mod_rev, x->value,
                lo < 0 ? "nobody" : cands[lo].name);
      }
      if (strcmp(prev, x->value) != 0) switches++;
      snprintf(prev, sizeof prev, "%s", x->value);
    }
  }
  fprintf(stderr, "  history: %d owner writes, %d leader changes, %d by a non-leader\n", writes, switches, bad);
  T_CHECK(bad == 0 && writes > 10 && switches == 3);
  pthread_mutex_destroy(&h->mu);
  free(h);
}

/* --- barrier ------------------------------------------------------------------------------------- */

typedef struct late_ack {
  const char *id;
  int64_t gen;
} late_ack;

static void *ack_later(void *arg) {
  late_ack *a = arg;
  newt_sleep_ms(300);
  job_barrier_ack(cli, "bar", a->gen, a->id, 0, dl(5000));
  return NULL;
}

typedef struct ack_args {
  rdzv_registration *reg;
  int64_t gen;
} ack_args;

static void *ack_reg_later(void *arg) {
  ack_args *a = arg;
  newt_sleep_ms(300);
  job_registration_ack(a->reg, "training", a->gen, "{\"rank\":0}", dl(5000));
  return NULL;
}

static void test_barrier(void) {
  const char *ids[] = {"w0", "w1", "w2", "w3"};
  for (int i = 0; i < 3; i++) T_OK(job_barrier_ack(cli, "bar", 1, ids[i], 0, dl(5000)));
  T_OK(job_barrier_ack(cli, "bar", 2, "w3", 0, dl(5000))); /* another generation does not count */
  uint64_t t0 = newt_now_ns();
  newt_result_t r = job_barrier_wait(cli, "bar", 1, ids, 4, dl(800), NULL);
  double ms = (double)(newt_now_ns() - t0) / 1e6;
  T_CHECK(r == NEWT_ERR_TIMEOUT);
  fprintf(stderr, "  %s\n", newt_errmsg());
  T_CHECK(strstr(newt_errmsg(), "w3") && !strstr(newt_errmsg(), "w0") && strstr(newt_errmsg(), "1 of 4"));
  T_CHECK(ms >= 750 && ms < 3000);
  late_ack la = {.id = "w3", .gen = 1};
  pthread_t th;
  pthread_create(&th, NULL, ack_later, &la);
  T_OK(job_barrier_wait(cli, "bar", 1, ids, 4, dl(10000), NULL));
  pthread_join(th, NULL);
  /* acks on a lease vanish with it: a dead member no longer counts */
  int64_t lease;
  T_OK(rdzv_etcd_lease_grant(cli, 30, 0, dl(5000), &lease, NULL));
  T_OK(job_barrier_ack(cli, "bar", 5, "w0", lease, dl(5000)));
  T_OK(job_barrier_wait(cli, "bar", 5, ids, 1, dl(5000), NULL));
  T_OK(rdzv_etcd_lease_revoke(cli, lease, dl(5000)));
  T_ERR(NEWT_ERR_TIMEOUT, job_barrier_wait(cli, "bar", 5, ids, 1, dl(300), NULL));
  atomic_int stop = 1;
  T_ERR(NEWT_ERR_ABORTED, job_barrier_wait(cli, "bar", 5, ids, 1, dl(5000), &stop));
  /* the leader forgets old generations */
  rdzv_candidate *c = NULL;
  T_OK(job_campaign(cli, "bar", &(rdzv_campaign_opts){.name = "k", .ttl_s = 5}, dl(5000), &c));
  if (!c) return;
  T_OK(rdzv_candidate_wait(c, dl(5000)));
  T_OK(job_barrier_forget(c, "bar", 2, dl(5000)));
  T_ERR(NEWT_ERR_TIMEOUT, job_barrier_wait(cli, "bar", 1, ids, 1, dl(200), NULL));
  T_OK(job_barrier_wait(cli, "bar", 2, ids + 3, 1, dl(2000), NULL));
  T_OK(rdzv_candidate_resign(c, dl(5000)));
  rdzv_candidate_free(c);
}

/* The barrier on acknowledgements folded into registrations (one write per worker per
 * generation), beside the previous release's acks/<g>/<id> keys: either counts; one that
 * vanishes with its registration (lease lost) no longer does; a new generation's update
 * without its ack does not count for it; and taking up a generation costs each worker one write. */
static void test_barrier_folded(void) {
  const char *ids[] = {"f0", "f1", "f2"};
  rdzv_etcd *wc = tu_client(srv); /* the workers' own client: its writes are theirs */
  rdzv_registration *r[3] = {0};
  int64_t w0 = rdzv_etcd_writes(wc);
  for (int i = 0; i < 3; i++) {
    job_worker w = mkworker(ids[i]);
    T_OK(job_register(wc, "fold", &w, 30, NULL, NULL, dl(5000), &r[i]));
  }
  if (!r[0] || !r[1] || !r[2]) return;
  T_CHECK_MSG(rdzv_etcd_writes(wc) - w0 == 6, "registering 3 workers took %lld writes", (long long)(rdzv_etcd_writes(wc) - w0));
  T_ERR(NEWT_ERR_TIMEOUT, job_barrier_wait(cli, "fold", 1, ids, 3, dl(300), NULL));
  T_CHECK(strstr(newt_errmsg(), "3 of 3") != NULL);
  /* f0 and f1 acknowledge in their registrations: one write each */
  int64_t w1 = rdzv_etcd_writes(wc);
  T_OK(job_registration_ack(r[0], "training", 1, "{\"rank\":0}", dl(5000)));
  T_OK(job_registration_ack(r[1], "training", 1, "{\"rank\":1}", dl(5000)));
  T_CHECK(rdzv_etcd_writes(wc) - w1 == 2);
  /* a membership view counts them too (as the leader's picture does) */
  rdzv_members *view = NULL;
  T_OK(job_members_start(cli, "fold", NULL, NULL, dl(5000), &view));
  if (!view) return;
  T_CHECK(job_members_count_acked(view, 1) == 2 && job_members_count_acked(view, 2) == 0);
  T_CHECK(job_members_count_acked(view, 1) == 2); /* from here on counted change by change */
  T_ERR(NEWT_ERR_INVALID, job_registration_ack(r[2], "training", 1, "", dl(5000)));
  /* f2 took up generation 1 in its registration but did not acknowledge it: not counted */
  T_OK(job_registration_update(r[2], "training", 1, dl(5000)));
  T_ERR(NEWT_ERR_TIMEOUT, job_barrier_wait(cli, "fold", 1, ids, 3, dl(300), NULL));
  T_CHECK(strstr(newt_errmsg(), "1 of 3") && strstr(newt_errmsg(), "f2") && !strstr(newt_errmsg(), "f0"));
  /* the previous release's ack key counts as well */
  T_OK(job_barrier_ack(cli, "fold", 1, "f2", rdzv_registration_lease(r[2]), dl(5000)));
  T_OK(job_barrier_wait(cli, "fold", 1, ids, 3, dl(5000), NULL));
  /* a state update in the same generation keeps the ack; a new generation drops it */
  T_OK(job_registration_update(r[0], "leaving", 1, dl(5000)));
  T_OK(job_barrier_wait(cli, "fold", 1, ids, 1, dl(5000), NULL));
  char key[128];
  rdzv_etcd_kv kv;
  job_worker back;
  T_OK(newt_job_path(key, sizeof key, "fold", "workers/f1"));
  T_OK(job_registration_update(r[1], "spare", 2, dl(5000)));
  T_OK(rdzv_etcd_get(cli, key, dl(5000), &kv, NULL));
  T_OK(job_worker_from_json(kv.value, kv.value_len, "reg", &back));
  T_CHECK(back.generation == 2 && back.ack[0] == '\0' && strcmp(back.state, "spare") == 0);
  rdzv_etcd_kv_free(&kv);
  T_ERR(NEWT_ERR_TIMEOUT, job_barrier_wait(cli, "fold", 2, ids + 1, 1, dl(300), NULL));
  T_OK(job_barrier_wait(cli, "fold", 1, ids + 1, 1, dl(5000), NULL)); /* past 1: 1 is behind it */
  /* an acknowledgement goes with its registration: a worker whose lease is lost no longer
     counts, even while the barrier waits (the watch sees it go) */
  T_OK(rdzv_registration_leave(r[0], dl(5000)));
  T_ERR(NEWT_ERR_TIMEOUT, job_barrier_wait(cli, "fold", 1, ids, 1, dl(300), NULL));
  T_CHECK(strstr(newt_errmsg(), "f0") != NULL);
  /* the view, kept up to date change by change: f1 (past 1) counts, f0 gone, f2's ack is a key */
  newt_deadline_t until = dl(5000);
  while (rdzv_members_count(view) != 2 && !newt_deadline_passed(until)) newt_sleep_ms(10);
  T_CHECK_MSG(job_members_count_acked(view, 1) == 1, "the view counts %zu acknowledging generation 1",
              job_members_count_acked(view, 1));
  rdzv_members_free(view);
  rdzv_registration_free(r[0]);
  r[0] = NULL;
  job_worker w = mkworker("f0");
  T_OK(job_register(wc, "fold", &w, 30, NULL, NULL, dl(5000), &r[0]));
  atomic_int stop = 0;
  pthread_t th;
  ack_args aa = {.reg = r[0], .gen = 1};
  pthread_create(&th, NULL, ack_reg_later, &aa);
  T_OK(job_barrier_wait(cli, "fold", 1, ids, 3, dl(10000), &stop)); /* the watch sees the ack come */
  pthread_join(th, NULL);
  int64_t before = rdzv_etcd_writes(wc);
  T_OK(rdzv_registration_leave(r[2], dl(5000))); /* its lease and its acks/ key go together */
  T_CHECK(rdzv_etcd_writes(wc) - before == 1);
  T_ERR(NEWT_ERR_TIMEOUT, job_barrier_wait(cli, "fold", 1, ids + 2, 1, dl(300), NULL));
  for (int i = 0; i < 3; i++) {
    if (i != 2 && r[i]) rdzv_registration_leave(r[i], dl(5000));
    rdzv_registration_free(r[i]);
  }
  rdzv_etcd_free(wc);
}

static void test_spec_and_events(void) {
  T_OK(job_spec_put(cli, "sp", "{\"model\":\"gpt\",\"tp\":2}", dl(5000)));
  char *spec;
  T_OK(job_spec_get(cli, "sp", dl(5000), &spec));
  T_CHECK(strstr(spec, "\"tp\":2") != NULL);
  free(spec);
  T_ERR(NEWT_ERR_INVALID, job_spec_put(cli, "sp", "{not json", dl(5000)));
  T_ERR(NEWT_ERR_INVALID, job_spec_put(cli, "bad/job", "{}", dl(5000)));
  T_OK(job_event_post(cli, "sp", "{\"kind\":\"worker_failed\",\"id\":\"w1\"}", dl(5000)));
  T_OK(job_event_post(cli, "sp", "{\"kind\":\"plan\",\"generation\":2}", dl(5000)));
  rdzv_etcd_kvs r;
  T_OK(rdzv_etcd_range(cli, "/newt/sp/events/", &(rdzv_etcd_range_opts){.prefix = 1}, dl(5000), &r));
  T_CHECK(r.n == 2 && strstr(r.kvs[0].value, "worker_failed") && strstr(r.kvs[1].value, "\"plan\""));
  rdzv_etcd_kvs_free(&r);
  T_ERR(NEWT_ERR_NOTFOUND, job_plan_get(cli, "sp", dl(5000), NULL, NULL, NULL));
}

int main(int argc, char **argv) {
  if (argc >= 6 && strcmp(argv[1], "--candidate") == 0) return candidate_main(argv + 2);
  if (argc >= 6 && strcmp(argv[1], "--worker") == 0) return worker_main(argv + 2);
  if (argc >= 6 && strcmp(argv[1], "--host") == 0) return host_main(argv + 2);
  if (newt_proc_self_exe(self_exe, sizeof self_exe) != NEWT_OK) return 1;
  srv = tu_server(NULL);
  cli = tu_client(srv);
  T_RUN(test_membership);
  T_RUN(test_killed_worker_leaves);
  T_RUN(test_host_lease);
  T_RUN(test_host_killed);
  T_RUN(test_election_inprocess);
  T_RUN(test_election_processes);
  T_RUN(test_barrier);
  T_RUN(test_barrier_folded);
  T_RUN(test_spec_and_events);
  rdzv_etcd_free(cli);
  rdzv_etcd_server_free(srv);
  return T_DONE();
}
