/* A plan in shards (job/plan.h, job/store.h) against a real etcd. NEWT_PLAN_SHARD_RANKS is 16
 * here, so a plan of 100 ranks on 13 hosts is a head and 7 shards:
 *   - the codec: the shards cut at hosts, the head naming each by its first host and digest,
 *     every rank back in its place, a donor kept in the head; plan_shard_of_host finds a host's shard from the head;
 *     plan_from_json refuses a head; a plan of at most 16 ranks is one record, byte for byte
 *     plan_to_json's, and a record of the previous release still reads;
 *   - publishing: every reader (job_change_get, job_view_read, job_follow, a worker's
 *     job_plan_shards_get and one shard alone) gets the whole plan; the shards of older plans
 *     go with the next head;
 *   - a leader deposed in the middle of writing its shards: its later shards and its head are
 *     refused, the next leader's plan of the same generation reads whole;
 *   - a head whose shards are not all there yet is refused naming the missing shard, and reads
 *     once the shard and the head are written again; a forged shard is refused naming it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/secret.h"
#include "job/plan.h"
#include "job/spec.h"
#include "job/store.h"
#include "job/view.h"
#include "rendezvous/rdzv.h"
#include "rendezvous/rdzv_test.h"

static rdzv_etcd_server *srv;
static rdzv_etcd *cli;

static newt_deadline_t dl(int64_t ms) { return newt_deadline_in_ms(ms); }

/* Plan gen of n workers in hosts of 8 (the last one short), tp 1, pp 1; the workers' order
 * (w099 first) makes the ranks' hosts differ from their names' order. */
static void make_plan(int n, uint64_t prev, newt_plan *p) {
  newt_spec s;
  spec_defaults(&s, "sh");
  s.tp = s.pp = 1, s.dp_min = 1, s.dp_max = n, s.global_batch = n, s.micro_batch = 1, s.even_batches = 0;
  plan_member *m = calloc((size_t)n, sizeof *m);
  for (int i = 0; i < n; i++) {
    snprintf(m[i].id, sizeof m[i].id, "w%03d", n - 1 - i);
    snprintf(m[i].host, sizeof m[i].host, "h%02d", i / 8);
    snprintf(m[i].addr, sizeof m[i].addr, "127.0.%d.1:%d", i / 8, 4000 + i % 8);
    m[i].join_rev = i + 1, m[i].prev_rank = m[i].prev_pp = -1;
  }
  T_OK(plan_compute(&s, m, n, prev, p));
  free(m);
}

static int same_ranks(const newt_plan *a, const newt_plan *b) {
  if (a->generation != b->generation || a->nranks != b->nranks || memcmp(a->secret, b->secret, sizeof a->secret))
    return 0;
  for (int i = 0; i < a->nranks; i++)
    if (memcmp(&a->ranks[i], &b->ranks[i], sizeof a->ranks[i]) != 0) return 0;
  return 1;
}

static void test_codec(void) {
  newt_plan p, h;
  make_plan(100, 0, &p);
  T_OK(plan_add_donor(&p, "leaver", "h99", "127.0.99.1:4000")); /* a donor: in the head, rank 100 */
  char *head, **texts;
  int n;
  T_OK(plan_shard_encode(&p, 16, &head, &texts, &n));
  T_CHECK(n == 7); /* 16 ranks is two hosts: 13 hosts in 7 shards, the last of one host */
  T_ERR(NEWT_ERR_INVALID, plan_from_json(head, strlen(head), &h));
  T_CHECK(strstr(newt_errmsg(), "head of 7 shards") != NULL);
  T_OK(plan_head_from_json(head, strlen(head), &h));
  T_CHECK(plan_is_partial(&h) && h.nshards == 7 && strcmp(h.shards[1].host, "h02") == 0);
  T_CHECK(plan_shard_of_host(&h, "h05") == 2 && plan_shard_of_host(&h, "h12") == 6 && plan_shard_of_host(&h, "a") == -1);
  T_ERR(NEWT_ERR_NOTFOUND, plan_shards_done(&h));
  T_CHECK(strstr(newt_errmsg(), "shard 0 (hosts from \"h00\") is missing") != NULL);
  for (int i = n - 1; i >= 0; i--) T_OK(plan_shard_add(&h, i, texts[i], strlen(texts[i])));
  T_ERR(NEWT_ERR_INVALID, plan_shard_add(&h, 3, texts[3], strlen(texts[3])));
  T_OK(plan_shards_done(&h));
  T_CHECK(same_ranks(&p, &h));
  const plan_rank *d = plan_find_donor(&h, "leaver");
  T_CHECK(h.ndonors == 1 && d && d->rank == 100 && strcmp(d->addr, "127.0.99.1:4000") == 0);
  T_CHECK(plan_find(&h, "w042") && strcmp(plan_find(&h, "w042")->worker, "w042") == 0);
  /* one shard alone: the ranks of its hosts; another shard's bytes under its index are not it */
  plan_rank *v;
  int nv;
  newt_plan h2;
  T_OK(plan_head_from_json(head, strlen(head), &h2));
  T_OK(plan_shard_read(&h2, 2, texts[2], strlen(texts[2]), &v, &nv));
  T_CHECK(nv == 16 && strcmp(v[0].host, "h04") == 0 && strcmp(v[15].host, "h05") == 0);
  free(v);
  T_ERR(NEWT_ERR_INVALID, plan_shard_read(&h2, 2, texts[3], strlen(texts[3]), &v, &nv));
  T_CHECK(strstr(newt_errmsg(), "plan 1 shard 2: its digest is not the one its head names") != NULL);
  /* a plan written whole after it was read in shards: its ranks, as plan_to_json of the original */
  char *a = plan_to_json(&p), *b = plan_to_json(&h);
  T_CHECK(a && b && strcmp(a, b) == 0);
  free(a), free(b);
  plan_free(&h2), plan_free(&h), plan_free(&p);
  free(head);
  plan_shard_texts_free(texts, n);
}

/* A shard's entries are read straight from its text in the form plan_shard_encode writes, any
 * other form through cJSON (issue 42): the same entries either way, the same errors. The head
 * is told the altered shard's digest, as a leader that wrote it would. */
static int shard_reads(const char *head, const char *text, int i, const plan_rank *want, int nwant, const char *msg) {
  newt_plan h;
  plan_rank *v = NULL;
  int nv = 0, ok;
  if (plan_head_from_json(head, strlen(head), &h) != NEWT_OK || !text) return 0;
  newt_sha256(text, strlen(text), h.shards[i].digest);
  newt_result_t r = plan_shard_read(&h, i, text, strlen(text), &v, &nv);
  if (msg) ok = r != NEWT_OK && strcmp(newt_errmsg(), msg) == 0;
  else ok = r == NEWT_OK && nv == nwant && memcmp(v, want, (size_t)nv * sizeof *v) == 0;
  if (msg && !ok) fprintf(stderr, "got: %s\n", r == NEWT_OK ? "read" : newt_errmsg());
  free(v);
  plan_free(&h);
  return ok;
}

static void test_shard_reader_forms(void) {
  newt_plan p, h;
  make_plan(100, 0, &p);
  char *head, **texts;
  int n, nv;
  plan_rank *want;
  T_OK(plan_shard_encode(&p, 16, &head, &texts, &n));
  T_OK(plan_head_from_json(head, strlen(head), &h));
  T_OK(plan_shard_read(&h, 2, texts[2], strlen(texts[2]), &want, &nv));
  T_CHECK(shard_reads(head, texts[2], 2, want, nv, NULL));
  const char *rk = strstr(texts[2], "\"rank\":"); /* the shard's first entry's rank */
  char first[32];
  snprintf(first, sizeof first, "%.*s", (int)strcspn(rk, ","), rk);
  char alt[64];
  const char *same[][2] = {
      {"\"shard\":2", " \"shard\" :\n2 "},
      {"\"host\":\"h04\"", "\"host\":\"\\u0068\\u00304\""},
      {first, first}, /* itself, then as a string below */
      {"\"ranks\":[", "\"x\":{\"ranks\":[]},\"ranks\":["},
  };
  for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) {
    char *t = t_replaced(texts[2], same[k][0], same[k][1]);
    T_CHECK_MSG(shard_reads(head, t, 2, want, nv, NULL), "%s", same[k][1]);
    free(t);
  }
  snprintf(alt, sizeof alt, "\"rank\":\"%s\"", first + 7);
  char *t = t_replaced(texts[2], first, alt);
  T_CHECK(shard_reads(head, t, 2, want, nv, NULL));
  free(t);
  t = t_replaced(texts[2], "\"host\":\"h05\"", "\"host\":\"h06\"");
  T_CHECK(shard_reads(head, t, 2, want, nv, "plan 1 shard 2.ranks[8].host: \"h06\" is not one of the shard's hosts"));
  free(t);
  t = t_replaced(texts[2], "\"shard\":2", "\"shard\":3");
  T_CHECK(shard_reads(head, t, 2, want, nv, "plan 1 shard 2: it says plan 1 shard 3"));
  free(t);
  t = t_replaced(texts[2], "\"ranks\":[", "\"ranks\":[],\"y\":[");
  T_CHECK(shard_reads(head, t, 2, want, nv, "plan 1 shard 2.ranks: 0 entries, its head says 16"));
  free(t);
  free(want);
  plan_free(&h), plan_free(&p);
  free(head);
  plan_shard_texts_free(texts, n);
}

static rdzv_candidate *lead(const char *job, const char *name) {
  rdzv_candidate *c = NULL;
  rdzv_campaign_opts co = {.name = name, .ttl_s = 10};
  T_OK(job_campaign(cli, job, &co, dl(5000), &c));
  return c;
}

static int count_shard_keys(const char *job) {
  char prefix[256];
  T_OK(job_prefix(prefix, sizeof prefix, job, JOB_REC_PLAN_SHARD, -1));
  rdzv_etcd_kvs kvs;
  rdzv_etcd_range_opts o = {.prefix = 1, .keys_only = 1};
  T_OK(rdzv_etcd_range(cli, prefix, &o, dl(5000), &kvs));
  int n = (int)kvs.n;
  rdzv_etcd_kvs_free(&kvs);
  return n;
}

/* The plan as each reader gets it, compared with p. */
static void check_readers(const char *job, const newt_plan *p) {
  job_change ch;
  T_OK(job_change_get(cli, job, JOB_REC_PLAN, dl(5000), &ch));
  T_CHECK(ch.rec == JOB_REC_PLAN && !plan_is_partial(&ch.u.plan) && same_ranks(p, &ch.u.plan));
  job_change_free(&ch);
  job_view v;
  T_OK(job_view_read(cli, job, dl(5000), NULL, NULL, &v));
  T_CHECK(same_ranks(p, &v.plan) && v.nrefused == 0);
  job_view_free(&v);
}

typedef struct followed {
  pthread_mutex_t mu;
  uint64_t gen;     /* the newest whole plan */
  char why[512];    /* the newest refusal */
} followed;

static void on_batch(void *ud, const job_change *chs, size_t n, int resync) {
  followed *f = ud;
  (void)resync;
  pthread_mutex_lock(&f->mu);
  for (size_t i = 0; i < n; i++) {
    if (chs[i].rec == JOB_REC_PLAN && !plan_is_partial(&chs[i].u.plan) && chs[i].u.plan.nranks == 100)
      f->gen = chs[i].u.plan.generation;
    if (chs[i].refused) snprintf(f->why, sizeof f->why, "%s", chs[i].why);
  }
  pthread_mutex_unlock(&f->mu);
}

static int followed_wait(followed *f, uint64_t gen, const char *why) {
  for (int k = 0; k < 1000; k++) { /* a broken watch fails the test, after 10 s */
    pthread_mutex_lock(&f->mu);
    int ok = why ? strstr(f->why, why) != NULL : f->gen == gen;
    pthread_mutex_unlock(&f->mu);
    if (ok) return 1;
    newt_sleep_ms(10);
  }
  return 0;
}

static void test_publish(void) {
  rdzv_candidate *a = lead("sh", "a");
  T_OK(rdzv_candidate_wait(a, dl(5000)));
  followed f = {.mu = PTHREAD_MUTEX_INITIALIZER};
  job_follow *fw = NULL;
  T_OK(job_follow_start(cli, "sh", on_batch, NULL, &f, dl(5000), &fw));
  newt_plan p1, p2;
  make_plan(100, 0, &p1);
  size_t bytes = 0;
  T_OK(job_plan_publish_plan(a, "sh", &p1, dl(5000), &bytes));
  T_CHECK(bytes > 9000 && count_shard_keys("sh") == 7);
  check_readers("sh", &p1);
  T_CHECK(followed_wait(&f, 1, NULL));
  /* the worker's read: the head at its revision, then its shards; one shard alone */
  char key[256], *json = NULL;
  int64_t rev = 0, g = 0;
  T_OK(job_plan_get(cli, "sh", dl(5000), &json, &g, &rev));
  newt_plan h;
  T_OK(plan_head_from_json(json, strlen(json), &h));
  plan_rank *v;
  int nv;
  T_OK(job_plan_shard_get(cli, "sh", &h, plan_shard_of_host(&h, "h07"), rev, dl(5000), &v, &nv));
  T_CHECK(nv == 16 && strcmp(v[2].host, "h06") == 0 && plan_find(&p1, v[2].worker)->rank == v[2].rank);
  free(v);
  /* plan 2 (host h00 gone); plan 1's shards go with its head, and plan 1 still reads at its revision */
  make_plan(92, 1, &p2);
  T_OK(job_plan_publish_plan(a, "sh", &p2, dl(5000), NULL));
  T_CHECK(count_shard_keys("sh") == 6);
  T_OK(job_plan_shards_get(cli, "sh", &h, rev, dl(5000)));
  T_CHECK(same_ranks(&p1, &h));
  job_change ch;
  T_OK(job_change_get(cli, "sh", JOB_REC_PLAN, dl(5000), &ch));
  T_CHECK(same_ranks(&p2, &ch.u.plan));
  job_change_free(&ch);
  /* a small plan is one record, plan_to_json's bytes */
  newt_plan small;
  make_plan(16, 2, &small);
  T_OK(job_plan_publish_plan(a, "sh", &small, dl(5000), NULL));
  char *mine = plan_to_json(&small), *stored = NULL;
  T_OK(job_plan_get(cli, "sh", dl(5000), &stored, NULL, NULL));
  T_CHECK(mine && stored && strcmp(mine, stored) == 0);
  (void)key;
  free(mine), free(stored), free(json);
  job_follow_free(fw);
  plan_free(&h), plan_free(&small), plan_free(&p1), plan_free(&p2);
  rdzv_candidate_resign(a, dl(5000));
  rdzv_candidate_free(a);
}

/* Leader a writes the first two shards of plan 1 and is deposed; its next shard and its head
 * are refused; b publishes its own plan 1, which every reader gets whole. */
static void test_leader_change(void) {
  rdzv_candidate *a = lead("lc", "a"), *b = lead("lc", "b");
  T_OK(rdzv_candidate_wait(a, dl(5000)));
  newt_plan pa, pb;
  make_plan(100, 0, &pa);
  char *head, **texts, key[256];
  int n;
  T_OK(plan_shard_encode(&pa, 16, &head, &texts, &n));
  for (int i = 0; i < 2; i++) {
    snprintf(key, sizeof key, "/newt/lc/plan/%020d/%06d", 1, i);
    T_OK(rdzv_guarded_put(a, key, texts[i], strlen(texts[i]), dl(5000), NULL));
  }
  T_OK(rdzv_candidate_resign(a, dl(5000)));
  T_OK(rdzv_candidate_wait(b, dl(5000)));
  snprintf(key, sizeof key, "/newt/lc/plan/%020d/%06d", 1, 2);
  T_ERR(NEWT_ERR_CONFLICT, rdzv_guarded_put(a, key, texts[2], strlen(texts[2]), dl(5000), NULL));
  T_ERR(NEWT_ERR_CONFLICT, job_plan_publish_plan(a, "lc", &pa, dl(5000), NULL));
  make_plan(100, 0, &pb); /* the same generation, another secret: other shards */
  T_CHECK(memcmp(pa.secret, pb.secret, sizeof pa.secret) != 0);
  T_OK(job_plan_publish_plan(b, "lc", &pb, dl(5000), NULL));
  check_readers("lc", &pb);
  /* the deposed leader's shard, late, is refused: b's stays */
  snprintf(key, sizeof key, "/newt/lc/plan/%020d/%06d", 1, 0);
  T_ERR(NEWT_ERR_CONFLICT, rdzv_guarded_put(a, key, texts[0], strlen(texts[0]), dl(5000), NULL));
  check_readers("lc", &pb);
  free(head);
  plan_shard_texts_free(texts, n);
  plan_free(&pa), plan_free(&pb);
  rdzv_candidate_resign(b, dl(5000));
  rdzv_candidate_free(a), rdzv_candidate_free(b);
}

static void put_raw(const char *key, const char *value) {
  T_OK(rdzv_etcd_put(cli, key, value, strlen(value), 0, dl(5000), NULL));
}

/* A head written before its last shard: refused, naming the shard, by every reader; then the
 * shard and the head again: whole. A forged shard: refused, naming it. */
static void test_missing_and_forged(void) {
  followed f = {.mu = PTHREAD_MUTEX_INITIALIZER};
  job_follow *fw = NULL;
  newt_spec s;
  spec_defaults(&s, "mf");
  char *spec = spec_to_json(&s);
  put_raw("/newt/mf/spec", spec);
  free(spec);
  T_OK(job_follow_start(cli, "mf", on_batch, NULL, &f, dl(5000), &fw));
  newt_plan p;
  make_plan(100, 4, &p);
  char *head, **texts, key[256];
  int n;
  T_OK(plan_shard_encode(&p, 16, &head, &texts, &n));
  for (int i = 0; i < n - 1; i++) {
    snprintf(key, sizeof key, "/newt/mf/plan/%020d/%06d", 5, i);
    put_raw(key, texts[i]);
  }
  put_raw("/newt/mf/plan", head);
  job_change ch;
  T_ERR(NEWT_ERR_NOTFOUND, job_change_get(cli, "mf", JOB_REC_PLAN, dl(5000), &ch));
  T_CHECK(strstr(newt_errmsg(), "plan 5: shard 6 (hosts from \"h12\") is missing") != NULL);
  T_CHECK(followed_wait(&f, 0, "shard 6 (hosts from \"h12\") is missing"));
  job_view v;
  T_OK(job_view_read(cli, "mf", dl(5000), NULL, NULL, &v));
  T_CHECK(v.plan.generation == 0 && v.nrefused == 1);
  job_view_free(&v);
  snprintf(key, sizeof key, "/newt/mf/plan/%020d/%06d", 5, n - 1);
  put_raw(key, texts[n - 1]);
  put_raw("/newt/mf/plan", head);
  check_readers("mf", &p);
  T_CHECK(followed_wait(&f, 5, NULL));
  /* shard 3 forged: a worker's address changed */
  char *forged = strdup(texts[3]), *at = strstr(forged, "127.0.");
  T_CHECK(at != NULL);
  if (at) at[6] = at[6] == '9' ? '8' : '9';
  snprintf(key, sizeof key, "/newt/mf/plan/%020d/%06d", 5, 3);
  put_raw(key, forged);
  put_raw("/newt/mf/plan", head); /* the head again: the watch reads its shards anew */
  T_ERR(NEWT_ERR_INVALID, job_change_get(cli, "mf", JOB_REC_PLAN, dl(5000), &ch));
  T_CHECK(strstr(newt_errmsg(), "plan 5 shard 3: its digest is not the one its head names") != NULL);
  T_CHECK(followed_wait(&f, 0, "plan 5 shard 3: its digest is not the one its head names"));
  /* the previous release's plan record still reads */
  char *whole = plan_to_json(&p);
  put_raw("/newt/mf/plan", whole);
  check_readers("mf", &p);
  free(whole), free(forged), free(head);
  plan_shard_texts_free(texts, n);
  plan_free(&p);
  job_follow_free(fw);
}

int main(void) {
  setenv("NEWT_PLAN_SHARD_RANKS", "16", 1);
  srv = tu_server(NULL);
  cli = tu_client(srv);
  T_RUN(test_codec);
  T_RUN(test_shard_reader_forms);
  T_RUN(test_publish);
  T_RUN(test_leader_change);
  T_RUN(test_missing_and_forged);
  rdzv_etcd_free(cli);
  rdzv_etcd_server_free(srv);
  return T_DONE();
}
