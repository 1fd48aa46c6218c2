/* newt bench rendezvous: how long N workers take to rendezvous, and to take the next plan
 * after a host is lost.
 *
 * For each N: a coordinator campaigns and leads, and watches membership (snapshot + watch).
 * Then the clock starts, and N simulated workers, each exactly as a real worker would
 * (worker/publish.c), register concurrently from a pool of threads sharing one client (its
 * pool of keep-alive connections): in hosts of --per-host workers (default 8) under a node
 * agent, whose lease (cli/agent.h: one grant per host) they register on, through the host's
 * batch (rendezvous/batch.h, as the agent's gateway gathers them: --batch 1, the default;
 * --batch 0: one write each, the previous release); with --per-host 1 as workers started
 * alone, each with a lease of its own (a grant and the registration). A host h's workers listen on 127.a.b.c (h + 1 in the
 * last three bytes) at ports 20000 + their index in the host, so 100,000 workers have
 * addresses that parse. When the coordinator's view holds all N, it computes plan 1 from
 * them (plan_compute: a spec of tp 1, pp 1, dp up to N) and publishes it (job_plan_publish,
 * guarded); the workers read it (here: one watch of the plan key, the plan parsed once, as
 * every worker parses it) and each writes the update of its registration that says
 * "training" and carries its acknowledgement; the clock stops when the coordinator's view
 * shows every one acknowledging generation 1 -- the barrier the coordinator keeps.
 *
 * Then the replan (--replan, default on): host 0's lease is revoked (a host lost: its
 * workers' registrations go in one revision), and the clock runs from the revocation until
 * the watch holds plan 2, computed and published from the view without host 0's workers
 * (replan_ms), and until every survivor acknowledged it (replan_ack_ms).
 *
 * Cost per worker: the registration txn and the update that acknowledges, plus a lease
 * grant per host (3/8 of a write with hosts of 8 whose writes go together, 2 + 1/8 each
 * alone; 3 started alone), and one plan write, each a raft
 * commit with a WAL fsync; the workers' client counts the writes it sent (rdzv_etcd_writes,
 * the agents' grants included), and the line says how many per worker. Every etcd call has a
 * deadline of its own (--op-ms), so a slow etcd fails a call, not the whole run by its age.
 * The line also says the bytes of the largest request either client sent (max_request_bytes:
 * etcd refuses one over --max-request-bytes, 1.5 MiB by default), the plan's bytes, and the
 * process's peak resident memory (the leader's view and plans, and the simulated workers'
 * client, together). One JSON line per N:
 *   {"bench":"rendezvous","workers":256,"ms":...,"register_ms":...,"writes_per_worker":2.125,...} */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/opts.h"
#include "common/strutil.h"
#include "job/plan.h"
#include "job/records.h"
#include "job/spec.h"
#include "job/store.h"
#include "rendezvous/batch.h"
#include "rendezvous/etcd_server.h"
#include "rendezvous/rdzv.h"

typedef struct bench_run {
  rdzv_etcd *c;              /* the workers' client */
  const char *job;
  int n;
  int per_host;              /* workers per host agent (1: each on a lease of its own) */
  int64_t ttl, op_ms;
  int64_t *host_lease;       /* per host: its agent's lease (0: not granted yet) */
  rdzv_batch **host_batch;   /* per host: its agent's batch (NULL each: every worker writes alone) */
  pthread_mutex_t *host_mu;
  char (*ids)[RDZV_NAME_MAX];
  rdzv_registration **regs;
  atomic_int next_reg, next_ack1, next_ack, next_leave, failed;
  int lost_host;             /* the host lost in the replan (-1: none yet) */
  int check_plan;            /* the leader checks a plan reads back before it publishes it */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t plan_gen;         /* the newest plan the workers hold (the watch parsed it) */
  uint64_t plan_seen_ns;     /* when they got it */
  double parse_ms;           /* the watch's read of the newest plan (its shards read and parsed) */
  double host_read_ms;       /* a host's read of its own shard (median of 8) */
  char err[512];
} bench_run;

static void fail(bench_run *b, const char *what) {
  pthread_mutex_lock(&b->mu);
  if (!b->err[0]) snprintf(b->err, sizeof b->err, "%s: %s", what, newt_errmsg());
  pthread_mutex_unlock(&b->mu);
  atomic_store(&b->failed, 1);
}

static newt_deadline_t op_deadline(const bench_run *b) { return newt_deadline_in_ms(b->op_ms); }

/* One host's read of a plan in shards: the head's shard of its host (plan_shard_of_host), at
 * the head's revision: what a host agent hands its workers. Its ms into *ms. */
static void host_read(bench_run *b, const newt_plan *head, int64_t rev, int h, double *ms) {
  char host[64];
  snprintf(host, sizeof host, "bench-%d", h);
  uint64_t t0 = newt_now_ns();
  plan_rank *v = NULL;
  int n = 0, i = plan_shard_of_host(head, host);
  if (i < 0 || job_plan_shard_get(b->c, b->job, head, i, rev, op_deadline(b), &v, &n) != NEWT_OK) {
    fail(b, "a host's read of its shard");
    return;
  }
  int mine = 0;
  for (int k = 0; k < n; k++) mine += strcmp(v[k].host, host) == 0;
  if (mine != (h == b->n / b->per_host ? b->n % b->per_host : b->per_host)) fail(b, "a host's ranks in its shard");
  free(v);
  *ms = (double)(newt_now_ns() - t0) / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The workers hold a plan once it is read whole (a plan in shards: its head, then its shards at
 * the head's revision, as a worker's plan watch reads it): one read here stands for every
 * worker's. A plan in shards is also read as 8 hosts read it (the head and their own shard):
 * the median is host_read_ms. */
static void take_plan(bench_run *b, const rdzv_etcd_kv *kv) {
  newt_plan p;
  uint64_t t0 = newt_now_ns();
  if (plan_head_from_json(kv->value, kv->value_len, &p) != NEWT_OK) {
    fail(b, "a worker's read of the plan");
    return;
  }
  double host_ms[8] = {0};
  int nh = 0;
  if (plan_is_partial(&p)) {
    int hosts = (b->n + b->per_host - 1) / b->per_host;
    for (; nh < 8 && nh < hosts; nh++) host_read(b, &p, kv->mod_revision, 1 + (int)((int64_t)nh * (hosts - 1) / 8), &host_ms[nh]);
    t0 = newt_now_ns();
    if (job_plan_shards_get(b->c, b->job, &p, kv->mod_revision, op_deadline(b)) != NEWT_OK) {
      fail(b, "a worker's read of the plan's shards");
      plan_free(&p);
      return;
    }
  }
  qsort(host_ms, (size_t)nh, sizeof host_ms[0], cmp_double);
  pthread_mutex_lock(&b->mu);
  b->parse_ms = (double)(newt_now_ns() - t0) / 1e6;
  b->host_read_ms = nh ? host_ms[nh / 2] : b->parse_ms;
  b->plan_gen = p.generation;
  b->plan_seen_ns = newt_now_ns();
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
  plan_free(&p);
}

static void on_plan(void *ud, const rdzv_etcd_watch_resp *r) {
  bench_run *b = ud;
  if (r->kind != RDZV_WATCH_EVENTS) return;
  for (size_t i = 0; i < r->n_events; i++)
    if (r->events[i].type == RDZV_EVENT_PUT) take_plan(b, &r->events[i].kv);
}

/* Worker i's address: host h's own loopback address, a port per worker of the host. */
static void worker_addr(const bench_run *b, int i, char *out, size_t cap) {
  int h = i / b->per_host + 1;
  snprintf(out, cap, "127.%d.%d.%d:%d", (h >> 16) & 255, (h >> 8) & 255, h & 255, 20000 + i % b->per_host);
}

static void register_one(bench_run *b, int i) {
  job_worker w = {.device = -1, .state = "joining", .host = "bench", .pid = getpid()};
  snprintf(w.id, sizeof w.id, "%s", b->ids[i]);
  worker_addr(b, i, w.addr, sizeof w.addr);
  if (b->per_host <= 1) { /* a worker started alone: a lease of its own */
    if (job_register(b->c, b->job, &w, b->ttl, NULL, NULL, op_deadline(b), &b->regs[i]) != NEWT_OK) fail(b, "register");
    return;
  }
  /* a worker under its host's agent: the agent granted the host's lease when it started
     (here: the first of its workers to get there), the worker registers on it */
  int h = i / b->per_host;
  snprintf(w.host, sizeof w.host, "bench-%d", h);
  pthread_mutex_lock(&b->host_mu[h]);
  if (!b->host_lease[h] && rdzv_etcd_lease_grant(b->c, b->ttl, 0, op_deadline(b), &b->host_lease[h], NULL) != NEWT_OK)
    fail(b, "host lease");
  int64_t lease = b->host_lease[h];
  pthread_mutex_unlock(&b->host_mu[h]);
  job_host_route via = {.batch = b->host_batch ? b->host_batch[h] : NULL};
  if (lease && job_register_via(b->c, b->job, &w, lease, &via, b->ttl, NULL, NULL, op_deadline(b), &b->regs[i]) != NEWT_OK)
    fail(b, "register");
}

/* Waits until the workers hold plan gen (or the run failed). */
static void wait_plan(bench_run *b, uint64_t gen) {
  pthread_mutex_lock(&b->mu);
  while (b->plan_gen < gen && !atomic_load(&b->failed)) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* the condition variable's clock */
    ts.tv_nsec += 100000000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&b->cv, &b->mu, &ts);
  }
  pthread_mutex_unlock(&b->mu);
}

/* Worker i takes up generation gen and says so in its registration: state "training", the
 * generation and its acknowledgement (what a rank reports: its timings, where its state came
 * from), one write on its lease. */
static void ack_one(bench_run *b, int i, int64_t gen) {
  uint64_t now = newt_wall_ms();
  job_ack a = {.rank = i, .t_plan = now, .t_comm = now, .t_restore = now, .t_step = now, .restore_step = 0};
  snprintf(a.restore, sizeof a.restore, "init");
  char *ack = job_ack_to_json(&a);
  if (!ack || job_registration_ack(b->regs[i], "training", gen, ack, op_deadline(b)) != NEWT_OK) fail(b, "ack");
  free(ack);
}

/* A pool thread: registers workers while there are some to register, then (every worker
 * registered) waits for plan 1 and acknowledges it for workers in order, as many as it gets
 * to: the threads in flight play consecutive workers, a host's together, as a host's workers
 * (processes of their own) take a plan together. */
static void *pool_main(void *arg) {
  bench_run *b = arg;
  int i;
  while (!atomic_load(&b->failed) && (i = atomic_fetch_add(&b->next_reg, 1)) < b->n) register_one(b, i);
  wait_plan(b, 1);
  while (!atomic_load(&b->failed) && (i = atomic_fetch_add(&b->next_ack1, 1)) < b->n) ack_one(b, i, 1);
  return NULL;
}

/* A pool thread of the replan: the survivors acknowledge plan 2 once they hold it. */
static void *ack2_main(void *arg) {
  bench_run *b = arg;
  int i;
  wait_plan(b, 2);
  while (!atomic_load(&b->failed) && (i = atomic_fetch_add(&b->next_ack, 1)) < b->n)
    if (i / b->per_host != b->lost_host) ack_one(b, i, 2);
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
  void *(*fn)(void *);
} pool_arg;

static void *pool_runner(void *arg) {
  pool_arg *p = arg;
  run_pool(p->b, p->threads, p->fn);
  return NULL;
}

/* --- the coordinator ------------------------------------------------------------------------- */

typedef struct leader {
  rdzv_etcd *c;
  rdzv_candidate *cand;
  rdzv_members *view;
  int64_t rev;               /* the view's revision seen last */
  newt_spec spec;
  newt_plan plan;            /* the newest plan published */
  size_t plan_bytes;         /* its record's bytes */
  double plan_ms;            /* its computation and publication */
} leader;

/* Waits until pred(count) holds for the view (count: members, or members acknowledging gen). */
static newt_result_t leader_wait(leader *l, bench_run *b, size_t want, int64_t acked_gen, newt_deadline_t d) {
  for (;;) {
    size_t have = acked_gen ? job_members_count_acked(l->view, acked_gen) : rdzv_members_count(l->view);
    if (have == want || atomic_load(&b->failed)) return NEWT_OK;
    newt_result_t w = rdzv_members_wait(l->view, l->rev, newt_deadline_min(d, newt_deadline_in_ms(100)), NULL, &l->rev);
    if (w != NEWT_OK && w != NEWT_ERR_TIMEOUT) return w;
    if (newt_deadline_passed(d))
      return acked_gen ? NEWT_ERR(NEWT_ERR_TIMEOUT, "only %zu of %zu workers acknowledged generation %lld", have, want,
                                  (long long)acked_gen)
                       : NEWT_ERR(NEWT_ERR_TIMEOUT, "the view holds %zu workers, not %zu", have, want);
  }
}

/* Plan gen from the view's members (the previous plan's ranks keep their places), published. */
static newt_result_t leader_plan(leader *l, bench_run *b, const char *job) {
  uint64_t t0 = newt_now_ns();
  job_worker *ws = NULL;
  size_t n = 0;
  NEWT_CHECK(job_members_get(l->view, &ws, &n, NULL));
  plan_member *m = calloc(n ? n : 1, sizeof *m);
  if (!m) {
    free(ws);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory planning");
  }
  for (size_t i = 0; i < n; i++) {
    snprintf(m[i].id, sizeof m[i].id, "%s", ws[i].id);
    snprintf(m[i].host, sizeof m[i].host, "%.63s", ws[i].host);
    snprintf(m[i].addr, sizeof m[i].addr, "%.95s", ws[i].addr);
    m[i].join_rev = ws[i].create_revision;
    const plan_rank *was = l->plan.generation ? plan_find(&l->plan, ws[i].id) : NULL;
    m[i].prev_rank = was ? was->rank : -1;
    m[i].prev_pp = was ? was->pp : -1;
    m[i].has_state = was != NULL;
  }
  free(ws);
  newt_plan p;
  char *json = NULL;
  newt_result_t r = plan_compute(&l->spec, m, (int)n, l->plan.generation, &p);
  free(m);
  if (r == NEWT_OK && b->check_plan) r = plan_check_publishable(&p, &json); /* the coordinator's check */
  free(json);
  if (r == NEWT_OK) r = job_plan_publish_plan(l->cand, job, &p, op_deadline(b), &l->plan_bytes);
  if (r != NEWT_OK) {
    plan_free(&p);
    return r;
  }
  plan_free(&l->plan);
  l->plan = p;
  l->plan_ms = (double)(newt_now_ns() - t0) / 1e6;
  return NEWT_OK;
}

/* The spec the leader plans by: every worker a data-parallel rank (tp 1, pp 1), one sample each. */
static void bench_spec(newt_spec *s, const char *job, int n) {
  spec_defaults(s, job);
  s->tp = s->pp = 1;
  s->dp_min = 1;
  s->dp_max = n;
  s->global_batch = n;
  s->micro_batch = 1;
  s->even_batches = 0;
}

static newt_result_t leader_start(leader *l, rdzv_etcd *c, bench_run *b, newt_deadline_t d, rdzv_etcd_watch **watch) {
  l->c = c;
  bench_spec(&l->spec, b->job, b->n);
  rdzv_campaign_opts co = {.name = "bench-coordinator", .ttl_s = 10};
  NEWT_CHECK(job_campaign(c, b->job, &co, d, &l->cand));
  NEWT_CHECK(rdzv_candidate_wait(l->cand, d));
  NEWT_CHECK(job_members_start(c, b->job, NULL, NULL, d, &l->view));
  char plan_key[256];
  NEWT_CHECK(job_key(plan_key, sizeof plan_key, b->job, JOB_REC_PLAN, 0, NULL));
  return rdzv_etcd_watch_start(b->c, plan_key, NULL, on_plan, b, d, watch);
}

/* What one measurement found, for its line. */
typedef struct result {
  double ms, register_ms, barrier_ms, plan_ms, parse_ms, host_read_ms;
  double replan_ms, replan_ack_ms, replan_plan_ms;
  int64_t writes, plan_writes;
  size_t plan_bytes;
} result;

/* The rendezvous: registrations, plan 1, its barrier. */
static newt_result_t rendezvous(bench_run *b, leader *l, int threads, newt_deadline_t d, result *res) {
  int64_t writes0 = rdzv_etcd_writes(b->c), plan_writes0 = rdzv_etcd_writes(l->c);
  uint64_t t0 = newt_now_ns();
  pthread_t pool;
  pool_arg pa = {b, threads, pool_main};
  pthread_create(&pool, NULL, pool_runner, &pa);
  newt_result_t r = leader_wait(l, b, (size_t)b->n, 0, d); /* the coordinator: until its view holds all n */
  uint64_t t_reg = newt_now_ns();
  if (r == NEWT_OK && !atomic_load(&b->failed)) r = leader_plan(l, b, b->job);
  if (r == NEWT_OK) r = leader_wait(l, b, (size_t)b->n, 1, d); /* the barrier */
  uint64_t t1 = newt_now_ns();
  if (r != NEWT_OK) fail(b, "coordinator");
  pthread_join(pool, NULL);
  res->ms = (double)(t1 - t0) / 1e6;
  res->register_ms = (double)(t_reg - t0) / 1e6;
  res->barrier_ms = (double)(t1 - t_reg) / 1e6;
  res->plan_ms = l->plan_ms;
  res->plan_bytes = l->plan_bytes;
  res->parse_ms = b->parse_ms;
  res->host_read_ms = b->host_read_ms;
  res->writes = rdzv_etcd_writes(b->c) - writes0;
  res->plan_writes = rdzv_etcd_writes(l->c) - plan_writes0;
  return atomic_load(&b->failed) ? NEWT_ERR(NEWT_ERR_INTERNAL, "%s", b->err) : r;
}

/* The replan: host 0 lost (its lease revoked), plan 2 computed and published without it; the
 * clock runs until the workers hold plan 2 and until every survivor acknowledged it. */
static newt_result_t replan(bench_run *b, leader *l, int threads, newt_deadline_t d, result *res) {
  int lost = b->n < b->per_host ? b->n : b->per_host;
  if (b->per_host <= 1 || b->n <= lost) return NEWT_OK; /* no host to lose and keep a job */
  b->lost_host = 0;
  pthread_t pool;
  pool_arg pa = {b, threads, ack2_main};
  pthread_create(&pool, NULL, pool_runner, &pa);
  uint64_t t0 = newt_now_ns();
  rdzv_etcd_lease_unkeep(b->c, b->host_lease[0]);
  newt_result_t r = rdzv_etcd_lease_revoke(b->c, b->host_lease[0], op_deadline(b));
  b->host_lease[0] = 0;
  if (r == NEWT_OK) r = leader_wait(l, b, (size_t)(b->n - lost), 0, d); /* the leader sees them go */
  if (r == NEWT_OK) r = leader_plan(l, b, b->job);
  if (r == NEWT_OK) wait_plan(b, 2);
  uint64_t t_held = b->plan_seen_ns;
  if (r == NEWT_OK) r = leader_wait(l, b, (size_t)(b->n - lost), 2, d);
  uint64_t t1 = newt_now_ns();
  if (r != NEWT_OK) fail(b, "coordinator's replan");
  pthread_join(pool, NULL);
  res->replan_ms = t_held > t0 ? (double)(t_held - t0) / 1e6 : 0;
  res->replan_ack_ms = (double)(t1 - t0) / 1e6;
  res->replan_plan_ms = l->plan_ms;
  return atomic_load(&b->failed) ? NEWT_ERR(NEWT_ERR_INTERNAL, "%s", b->err) : r;
}

static void print_result(const bench_run *b, const result *x, int threads, rdzv_etcd *c, rdzv_etcd *wc,
                         const char *where) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  int64_t max_req = rdzv_etcd_max_request(c) > rdzv_etcd_max_request(wc) ? rdzv_etcd_max_request(c)
                                                                           : rdzv_etcd_max_request(wc);
  printf("{\"bench\":\"rendezvous\",\"workers\":%d,\"ms\":%.1f,\"register_ms\":%.1f,\"barrier_ms\":%.1f,"
         "\"plan_ms\":%.1f,\"plan_bytes\":%zu,\"plan_read_ms\":%.1f,\"host_read_ms\":%.1f,\"replan_ms\":%.1f,\"replan_ack_ms\":%.1f,"
         "\"replan_plan_ms\":%.1f,\"threads\":%d,\"per_host\":%d,\"batch\":%d,\"etcd_writes\":%lld,\"writes_per_worker\":%.3f,"
         "\"max_request_bytes\":%lld,\"peak_rss_mb\":%.1f,\"etcd\":\"%s\"}\n",
         b->n, x->ms, x->register_ms, x->barrier_ms, x->plan_ms, x->plan_bytes, x->parse_ms, x->host_read_ms, x->replan_ms,
         x->replan_ack_ms, x->replan_plan_ms, threads, b->per_host, b->host_batch != NULL,
         (long long)(x->writes + x->plan_writes),
         (double)x->writes / b->n, (long long)max_req, (double)ru.ru_maxrss / 1024.0, where);
  fflush(stdout);
}

static void bench_free(bench_run *b, leader *l, rdzv_etcd_watch *watch, int threads) {
  rdzv_etcd_watch_free(watch);
  rdzv_members_free(l->view);
  if (b->regs) run_pool(b, threads, leave_main);
  int hosts = (b->n + b->per_host - 1) / b->per_host;
  for (int h = 0; b->host_lease && h < hosts; h++)
    if (b->host_lease[h]) {
      rdzv_etcd_lease_unkeep(b->c, b->host_lease[h]);
      rdzv_etcd_lease_revoke(b->c, b->host_lease[h], newt_deadline_in_ms(5000));
    }
  if (l->cand) {
    rdzv_candidate_resign(l->cand, newt_deadline_in_ms(5000));
    rdzv_candidate_free(l->cand);
  }
  char prefix[128];
  if (newt_job_path(prefix, sizeof prefix, b->job, "") == NEWT_OK)
    rdzv_etcd_delete(l->c, prefix, 1, newt_deadline_in_ms(10000), NULL, NULL);
  plan_free(&l->plan);
  free(b->ids);
  free(b->regs);
  free(b->host_lease);
  for (int h = 0; b->host_batch && h < hosts; h++) rdzv_batch_free(b->host_batch[h]);
  free(b->host_batch);
  for (int h = 0; b->host_mu && h < hosts; h++) pthread_mutex_destroy(&b->host_mu[h]);
  free(b->host_mu);
  pthread_mutex_destroy(&b->mu);
  pthread_cond_destroy(&b->cv);
}

typedef struct bench_opts {
  int per_host, threads, replan, check_plan, batch;
  int64_t ttl, op_ms, linger_ms;
  const char *where;
} bench_opts;

/* One measurement; prints its JSON line. The coordinator uses c, the simulated workers wc. */
static newt_result_t bench_one(rdzv_etcd *c, rdzv_etcd *wc, int n, const bench_opts *o, int rep) {
  char job[RDZV_NAME_MAX];
  snprintf(job, sizeof job, "bench-%d-%d-%d", (int)getpid(), n, rep);
  int hosts = (n + o->per_host - 1) / o->per_host, threads = o->threads < n ? o->threads : n;
  bench_run b = {.c = wc, .job = job, .n = n, .per_host = o->per_host, .ttl = o->ttl, .op_ms = o->op_ms,
                 .lost_host = -1, .check_plan = o->check_plan};
  leader l = {.c = c};
  rdzv_etcd_watch *watch = NULL;
  result res = {0};
  pthread_mutex_init(&b.mu, NULL);
  pthread_cond_init(&b.cv, NULL);
  b.ids = calloc((size_t)n, sizeof *b.ids);
  b.regs = calloc((size_t)n, sizeof *b.regs);
  b.host_lease = calloc((size_t)hosts, sizeof *b.host_lease);
  b.host_mu = calloc((size_t)hosts, sizeof *b.host_mu);
  for (int h = 0; b.host_mu && h < hosts; h++) pthread_mutex_init(&b.host_mu[h], NULL);
  newt_result_t r = NEWT_OK;
  if (o->batch && o->per_host > 1) { /* each host's agent gathers its workers' writes */
    rdzv_batch_opts bo = {.expect = o->per_host, .linger_ms = o->linger_ms};
    b.host_batch = calloc((size_t)hosts, sizeof *b.host_batch);
    for (int h = 0; b.host_batch && h < hosts && r == NEWT_OK; h++) r = rdzv_batch_new(wc, &bo, &b.host_batch[h]);
    if (r != NEWT_OK) goto out;
  }
  if (!b.ids || !b.regs || !b.host_lease || !b.host_mu) {
    r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for %d workers", n);
    goto out;
  }
  for (int i = 0; i < n; i++) snprintf(b.ids[i], sizeof b.ids[i], "w%06d", i);
  newt_deadline_t d = newt_deadline_in_ms(120000 + 10 * (int64_t)n); /* the whole run's */
  NEWT_CHECK_GOTO(leader_start(&l, c, &b, d, &watch), r, out);
  NEWT_CHECK_GOTO(rendezvous(&b, &l, threads, d, &res), r, out);
  res.replan_ms = res.replan_ack_ms = res.replan_plan_ms = -1; /* none, or it failed */
  if (o->replan) r = replan(&b, &l, threads, d, &res);
  print_result(&b, &res, threads, c, wc, o->where); /* the rendezvous' figures, whatever the replan did */
out:
  if (r != NEWT_OK) r = NEWT_ERR(r, "rendezvous of %d workers failed: %s", n, newt_errmsg());
  bench_free(&b, &l, watch, threads);
  return r;
}

int newt_bench_rendezvous(int argc, char **argv) {
  const char *workers = "16,64,256,1024", *etcd = NULL, *data_dir = NULL;
  int64_t threads = 64, ttl = 30, repeat = 1, per_host = 8, op_ms = 30000, replan_on = 1, check_plan = 1, batch = 1,
          linger_ms = 10;
  newt_opt opts[] = {
      {"workers", NEWT_OPT_STR, &workers, "worker counts, comma-separated"},
      {"etcd", NEWT_OPT_STR, &etcd, "etcd endpoints (default: start a private etcd)"},
      {"data-dir", NEWT_OPT_STR, &data_dir, "directory of the private etcd (default: a new one in $TMPDIR)"},
      {"threads", NEWT_OPT_INT, &threads, "concurrent simulated workers in flight"},
      {"ttl", NEWT_OPT_INT, &ttl, "worker lease TTL in seconds"},
      {"per-host", NEWT_OPT_INT, &per_host,
       "workers per host, registered on their host agent's lease (1: each worker on a lease of its own, as "
       "a worker started alone)"},
      {"batch", NEWT_OPT_INT, &batch,
       "1: a host's workers' registrations and acknowledgements go to etcd together, as a node agent's gateway sends "
       "them (0: each its own write, the previous release)"},
      {"linger-ms", NEWT_OPT_INT, &linger_ms,
       "how long a host's first write waits for its other workers' (with --batch 1)"},
      {"repeat", NEWT_OPT_INT, &repeat, "measurements per worker count (one line each)"},
      {"op-ms", NEWT_OPT_INT, &op_ms, "the deadline of each etcd call, in ms"},
      {"check-plan", NEWT_OPT_INT, &check_plan,
       "1: the leader checks that a plan reads back before publishing it, as the coordinator does (0: not)"},
      {"replan", NEWT_OPT_INT, &replan_on, "1: after the rendezvous, lose host 0 and time the next plan (0: not)"},
      NEWT_OPT_END,
  };
  int ex = newt_opts_exit(newt_opts_parse("bench rendezvous", "[flags]", opts, argc, argv, NULL, 0, NULL));
  if (ex >= 0) return ex;
  if (threads < 1 || ttl < 1 || repeat < 1 || op_ms < 1 || per_host < 1 || per_host > 1024 || linger_ms < 0) {
    fprintf(stderr, "newt bench rendezvous: --threads, --ttl, --repeat and --op-ms must be positive, --per-host "
                    "1..1024, --linger-ms 0 or more\n");
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
  bench_opts bo = {.per_host = (int)per_host, .threads = (int)threads, .replan = replan_on != 0,
                   .check_plan = check_plan != 0, .ttl = ttl, .batch = batch != 0, .linger_ms = linger_ms,
                   .op_ms = op_ms, .where = srv ? "private" : "external"};
  for (int i = 0; i < nc && rc == 0; i++)
    for (int k = 0; k < repeat && rc == 0; k++)
      if (bench_one(c, wc, counts[i], &bo, k) != NEWT_OK) {
        fprintf(stderr, "newt bench rendezvous: %s\n", newt_errmsg());
        rc = 1;
      }
  rdzv_etcd_free(wc);
  rdzv_etcd_free(c);
  rdzv_etcd_server_free(srv);
  return rc;
}
