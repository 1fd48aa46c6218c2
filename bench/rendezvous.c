/* newt bench rendezvous: how long N workers take to rendezvous.
 *
 * For each N: a coordinator campaigns and leads, and watches membership (snapshot + watch).
 * Then the clock starts, and N simulated workers, each exactly as a real worker would
 * (worker/publish.c), register concurrently from a pool of threads sharing one client (its
 * pool of keep-alive connections): in hosts of --per-host workers (default 8) under a node
 * agent, whose lease (cli/agent.h: one grant per host) they register on, one write each
 * (job_register_on); with --per-host 1 as workers started alone, each with a lease of its
 * own (a grant and the registration). Once a worker took up the plan it writes the update of
 * its registration that says "training" and carries its acknowledgement of the generation. When the coordinator's view holds all N, it publishes
 * plan 1 (a guarded write listing them); the workers learn the plan from a watch of the
 * plan key and each acknowledges it; the clock stops when the coordinator's view of the
 * registrations (the same watch) shows every one of them acknowledging generation 1 -- the
 * barrier the coordinator keeps.
 *
 * Cost per worker: the registration txn and the update that acknowledges, plus a lease
 * grant per host (2 + 1/8 writes with hosts of 8; 3 alone), and one plan write, each a raft
 * commit with a WAL fsync; the workers' client counts the writes it sent (rdzv_etcd_writes,
 * the agents' grants included), and the line says how many per worker. etcd batches concurrent proposals into one fsync, so the pool's concurrency, not
 * the round trip, sets the pace. One JSON line per N:
 *   {"bench":"rendezvous","workers":256,"ms":...,"register_ms":...,"writes_per_worker":3.0,...} */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/opts.h"
#include "common/strutil.h"
#include "job/records.h"
#include "job/store.h"
#include "rendezvous/etcd_server.h"
#include "rendezvous/rdzv.h"

typedef struct bench_run {
  rdzv_etcd *c;
  const char *job;
  int n;
  int per_host;              /* workers per host agent (1: each on a lease of its own) */
  int64_t ttl;
  int64_t *host_lease;       /* per host: its agent's lease (0: not granted yet) */
  pthread_mutex_t *host_mu;
  char (*ids)[RDZV_NAME_MAX];
  rdzv_registration **regs;
  atomic_int next_reg, next_leave, failed;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int64_t plan_gen;
  char err[512];
} bench_run;

static void fail(bench_run *b, const char *what) {
  pthread_mutex_lock(&b->mu);
  if (!b->err[0]) snprintf(b->err, sizeof b->err, "%s: %s", what, newt_errmsg());
  pthread_mutex_unlock(&b->mu);
  atomic_store(&b->failed, 1);
}

static void on_plan(void *ud, const rdzv_etcd_watch_resp *r) {
  bench_run *b = ud;
  if (r->kind != RDZV_WATCH_EVENTS) return;
  pthread_mutex_lock(&b->mu);
  b->plan_gen = 1;
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

static void *pool_main(void *arg) {
  bench_run *b = arg;
  newt_deadline_t d = newt_deadline_in_ms(60000);
  int i, mine_n = 0;
  int *mine = malloc((size_t)b->n * sizeof *mine); /* the workers this thread plays */
  if (!mine) {
    fail(b, "out of memory");
    return NULL;
  }
  while (!atomic_load(&b->failed) && (i = atomic_fetch_add(&b->next_reg, 1)) < b->n) {
    mine[mine_n++] = i;
    job_worker w = {.device = -1, .state = "joining", .host = "bench", .pid = getpid()};
    snprintf(w.id, sizeof w.id, "%s", b->ids[i]);
    snprintf(w.addr, sizeof w.addr, "127.0.0.1:%d", 20000 + i);
    if (b->per_host <= 1) { /* a worker started alone: a lease of its own */
      if (job_register(b->c, b->job, &w, b->ttl, NULL, NULL, d, &b->regs[i]) != NEWT_OK) fail(b, "register");
      continue;
    }
    /* a worker under its host's agent: the agent granted the host's lease when it started
       (here: the first of its workers to get there), the worker registers on it */
    int h = i / b->per_host;
    snprintf(w.host, sizeof w.host, "bench-%d", h);
    pthread_mutex_lock(&b->host_mu[h]);
    if (!b->host_lease[h] && rdzv_etcd_lease_grant(b->c, b->ttl, 0, d, &b->host_lease[h], NULL) != NEWT_OK)
      fail(b, "host lease");
    int64_t lease = b->host_lease[h];
    pthread_mutex_unlock(&b->host_mu[h]);
    if (lease && job_register_on(b->c, b->job, &w, lease, b->ttl, NULL, NULL, d, &b->regs[i]) != NEWT_OK)
      fail(b, "register");
  }
  /* every worker learns the plan (here: one shared watch of the plan key) */
  pthread_mutex_lock(&b->mu);
  while (!b->plan_gen && !atomic_load(&b->failed) && !newt_deadline_passed(d)) {
    pthread_mutex_unlock(&b->mu);
    newt_sleep_us(200);
    pthread_mutex_lock(&b->mu);
  }
  pthread_mutex_unlock(&b->mu);
  /* each worker takes up generation 1 and says so in its registration: state "training",
     generation 1 and its acknowledgement (what a rank reports: its timings, where its state
     came from), one write on its own lease */
  for (int k = 0; k < mine_n && !atomic_load(&b->failed); k++) {
    i = mine[k];
    uint64_t now = newt_wall_ms();
    job_ack a = {.rank = i, .t_plan = now, .t_comm = now, .t_restore = now, .t_step = now, .restore_step = 0};
    snprintf(a.restore, sizeof a.restore, "init");
    char *ack = job_ack_to_json(&a);
    if (!ack || job_registration_ack(b->regs[i], "training", 1, ack, d) != NEWT_OK) fail(b, "ack");
    free(ack);
  }
  free(mine);
  return NULL;
}

static void *leave_main(void *arg) {
  bench_run *b = arg;
  int i;
  while ((i = atomic_fetch_add(&b->next_leave, 1)) < b->n) {
    if (!b->regs[i]) continue;
    /* on a host's lease the lease's revocation below takes them all */
    if (!rdzv_registration_shared(b->regs[i])) rdzv_registration_leave(b->regs[i], newt_deadline_in_ms(10000));
    rdzv_registration_free(b->regs[i]);
  }
  return NULL;
}

static void run_pool(bench_run *b, int threads, void *(*fn)(void *)) {
  pthread_t *th = calloc((size_t)threads, sizeof *th);
  for (int t = 0; t < threads; t++) pthread_create(&th[t], NULL, fn, b);
  for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
  free(th);
}

typedef struct pool_arg {
  bench_run *b;
  int threads;
} pool_arg;

static void *pool_runner(void *arg) {
  pool_arg *p = arg;
  run_pool(p->b, p->threads, pool_main);
  return NULL;
}

/* One measurement; prints its JSON line. The coordinator uses c, the simulated workers wc. */
static newt_result_t bench_one(rdzv_etcd *c, rdzv_etcd *wc, int n, int per_host, int threads, int64_t ttl, int rep,
                               const char *where) {
  char job[RDZV_NAME_MAX];
  snprintf(job, sizeof job, "bench-%d-%d-%d", (int)getpid(), n, rep);
  int hosts = (n + per_host - 1) / per_host;
  bench_run b = {.c = wc, .job = job, .n = n, .per_host = per_host, .ttl = ttl};
  pthread_mutex_init(&b.mu, NULL);
  pthread_cond_init(&b.cv, NULL);
  b.ids = calloc((size_t)n, sizeof *b.ids);
  b.regs = calloc((size_t)n, sizeof *b.regs);
  b.host_lease = calloc((size_t)hosts, sizeof *b.host_lease);
  b.host_mu = calloc((size_t)hosts, sizeof *b.host_mu);
  for (int h = 0; b.host_mu && h < hosts; h++) pthread_mutex_init(&b.host_mu[h], NULL);
  newt_buf plan;
  newt_buf_init(&plan);
  rdzv_candidate *leader = NULL;
  rdzv_members *view = NULL;
  rdzv_etcd_watch *plan_watch = NULL;
  newt_result_t r = NEWT_OK;
  if (!b.ids || !b.regs || !b.host_lease || !b.host_mu) {
    r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for %d workers", n);
    goto out;
  }
  for (int i = 0; i < n; i++) {
    snprintf(b.ids[i], sizeof b.ids[i], "w%05d", i);
  }
  newt_deadline_t d = newt_deadline_in_ms(120000);
  rdzv_campaign_opts co = {.name = "bench-coordinator", .ttl_s = 10};
  NEWT_CHECK_GOTO(job_campaign(c, job, &co, d, &leader), r, out);
  NEWT_CHECK_GOTO(rdzv_candidate_wait(leader, d), r, out);
  NEWT_CHECK_GOTO(job_members_start(c, job, NULL, NULL, d, &view), r, out);
  char plan_key[256];
  NEWT_CHECK_GOTO(job_key(plan_key, sizeof plan_key, job, JOB_REC_PLAN, 0, NULL), r, out);
  NEWT_CHECK_GOTO(rdzv_etcd_watch_start(c, plan_key, NULL, on_plan, &b, d, &plan_watch), r, out);

  int64_t writes0 = rdzv_etcd_writes(wc), plan_writes0 = rdzv_etcd_writes(c);
  uint64_t t0 = newt_now_ns();
  pthread_t pool;
  pool_arg pa = {&b, threads < n ? threads : n};
  pthread_create(&pool, NULL, pool_runner, &pa);
  /* the coordinator: wait until its view holds all n */
  int64_t rev = 0;
  while (rdzv_members_count(view) < (size_t)n && !atomic_load(&b.failed)) {
    newt_result_t w = rdzv_members_wait(view, rev, newt_deadline_min(d, newt_deadline_in_ms(100)), NULL, &rev);
    if (w != NEWT_OK && w != NEWT_ERR_TIMEOUT) {
      r = w;
      break;
    }
    if (newt_deadline_passed(d)) {
      r = NEWT_ERR(NEWT_ERR_TIMEOUT, "only %zu of %d workers registered", rdzv_members_count(view), n);
      break;
    }
  }
  uint64_t t_reg = newt_now_ns();
  if (r == NEWT_OK && !atomic_load(&b.failed)) {
    newt_buf_printf(&plan, "{\"generation\":1,\"workers\":[");
    for (int i = 0; i < n; i++) newt_buf_printf(&plan, "%s\"%s\"", i ? "," : "", b.ids[i]);
    newt_buf_printf(&plan, "]}");
    r = job_plan_publish(leader, job, 1, plan.data, d);
    /* the barrier: the view's registrations, every one acknowledging generation 1 */
    while (r == NEWT_OK && job_members_count_acked(view, 1) < (size_t)n && !atomic_load(&b.failed)) {
      newt_result_t w = rdzv_members_wait(view, rev, newt_deadline_min(d, newt_deadline_in_ms(100)), NULL, &rev);
      if (w != NEWT_OK && w != NEWT_ERR_TIMEOUT) r = w;
      else if (newt_deadline_passed(d))
        r = NEWT_ERR(NEWT_ERR_TIMEOUT, "only %zu of %d workers acknowledged generation 1",
                     job_members_count_acked(view, 1), n);
    }
  }
  uint64_t t1 = newt_now_ns();
  int64_t writes = rdzv_etcd_writes(wc) - writes0, plan_writes = rdzv_etcd_writes(c) - plan_writes0;
  if (r != NEWT_OK) fail(&b, "coordinator");
  pthread_join(pool, NULL);
  if (atomic_load(&b.failed)) {
    r = NEWT_ERR(NEWT_ERR_INTERNAL, "rendezvous of %d workers failed: %s", n, b.err);
  } else {
    printf("{\"bench\":\"rendezvous\",\"workers\":%d,\"ms\":%.1f,\"register_ms\":%.1f,\"barrier_ms\":%.1f,"
           "\"threads\":%d,\"per_host\":%d,\"etcd_writes\":%lld,\"writes_per_worker\":%.3f,\"etcd\":\"%s\"}\n",
           n, (double)(t1 - t0) / 1e6, (double)(t_reg - t0) / 1e6, (double)(t1 - t_reg) / 1e6, pa.threads, per_host,
           (long long)(writes + plan_writes), (double)writes / n, where);
    fflush(stdout);
  }
out:
  rdzv_etcd_watch_free(plan_watch);
  rdzv_members_free(view);
  if (b.regs) run_pool(&b, threads < n ? threads : n, leave_main);
  for (int h = 0; b.host_lease && h < hosts; h++)
    if (b.host_lease[h]) {
      rdzv_etcd_lease_unkeep(wc, b.host_lease[h]);
      rdzv_etcd_lease_revoke(wc, b.host_lease[h], newt_deadline_in_ms(5000));
    }
  if (leader) {
    rdzv_candidate_resign(leader, newt_deadline_in_ms(5000));
    rdzv_candidate_free(leader);
  }
  char prefix[128];
  if (newt_job_path(prefix, sizeof prefix, job, "") == NEWT_OK)
    rdzv_etcd_delete(c, prefix, 1, newt_deadline_in_ms(10000), NULL, NULL);
  newt_buf_free(&plan);
  free(b.ids);
  free(b.regs);
  free(b.host_lease);
  for (int h = 0; b.host_mu && h < hosts; h++) pthread_mutex_destroy(&b.host_mu[h]);
  free(b.host_mu);
  pthread_mutex_destroy(&b.mu);
  pthread_cond_destroy(&b.cv);
  return r;
}

int newt_bench_rendezvous(int argc, char **argv) {
  const char *workers = "16,64,256,1024", *etcd = NULL, *data_dir = NULL;
  int64_t threads = 64, ttl = 30, repeat = 1, per_host = 8;
  newt_opt opts[] = {
      {"workers", NEWT_OPT_STR, &workers, "worker counts, comma-separated"},
      {"etcd", NEWT_OPT_STR, &etcd, "etcd endpoints (default: start a private etcd)"},
      {"data-dir", NEWT_OPT_STR, &data_dir, "directory of the private etcd (default: a new one in $TMPDIR)"},
      {"threads", NEWT_OPT_INT, &threads, "concurrent simulated workers in flight"},
      {"ttl", NEWT_OPT_INT, &ttl, "worker lease TTL in seconds"},
      {"per-host", NEWT_OPT_INT, &per_host,
       "workers per host, registered on their host agent's lease (1: each worker on a lease of its own, as "
       "a worker started alone)"},
      {"repeat", NEWT_OPT_INT, &repeat, "measurements per worker count (one line each)"},
      NEWT_OPT_END,
  };
  int ex = newt_opts_exit(newt_opts_parse("bench rendezvous", "[flags]", opts, argc, argv, NULL, 0, NULL));
  if (ex >= 0) return ex;
  if (threads < 1 || ttl < 1 || repeat < 1 || per_host < 1 || per_host > 1024) {
    fprintf(stderr, "newt bench rendezvous: --threads, --ttl and --repeat must be positive, --per-host 1..1024\n");
    return 2;
  }
  int counts[64], nc = 0;
  char *list = newt_strdup(workers), *save = NULL;
  for (char *t = strtok_r(list, ",", &save); t && nc < 64; t = strtok_r(NULL, ",", &save)) {
    int64_t v;
    if (newt_parse_int(t, &v) != 0 || v < 1 || v > 100000) {
      fprintf(stderr, "newt bench rendezvous: --workers: \"%s\" is not a count from 1 to 100000\n", t);
      free(list);
      return 2;
    }
    counts[nc++] = (int)v;
  }
  free(list);
  rdzv_etcd_server *srv = NULL;
  if (!etcd) {
    rdzv_etcd_server_opts so = {.dir = data_dir};
    if (rdzv_etcd_server_start(&so, &srv) != NEWT_OK) {
      fprintf(stderr, "newt bench rendezvous: %s\n", newt_errmsg());
      return 1;
    }
    etcd = rdzv_etcd_server_url(srv);
    fprintf(stderr, "bench rendezvous: private etcd at %s (data in %s)\n", etcd, rdzv_etcd_server_dir(srv));
  }
  rdzv_etcd_opts eo = {.endpoints = etcd};
  rdzv_etcd *c = NULL, *wc = NULL; /* the coordinator's client, the workers' */
  int rc = 0;
  if (rdzv_etcd_init(&eo, &c) != NEWT_OK || rdzv_etcd_init(&eo, &wc) != NEWT_OK) {
    fprintf(stderr, "newt bench rendezvous: %s\n", newt_errmsg());
    if (c) rdzv_etcd_free(c);
    rdzv_etcd_server_free(srv);
    return 1;
  }
  for (int i = 0; i < nc && rc == 0; i++)
    for (int k = 0; k < repeat && rc == 0; k++)
      if (bench_one(c, wc, counts[i], (int)per_host, (int)threads, ttl, k, srv ? "private" : "external") != NEWT_OK) {
        fprintf(stderr, "newt bench rendezvous: %s\n", newt_errmsg());
        rc = 1;
      }
  rdzv_etcd_free(wc);
  rdzv_etcd_free(c);
  rdzv_etcd_server_free(srv);
  return rc;
}
