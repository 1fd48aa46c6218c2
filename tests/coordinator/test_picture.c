/* The leader's lookups by name (issue 42): common/strindex.h checked against a scan through
 * random additions, deletions that swap the last item into the hole, and clears; then the
 * coordinator's picture (members joining, leaving and coming back, acks counted once) looked up
 * through its indexes, each lookup compared with a scan of the arrays. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/strindex.h"
#include "coordinator/coord.h"
#include "tests/test.h"

typedef struct item {
  int pad;
  char name[24];
} item;

static int scan(const item *v, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(v[i].name, name) == 0) return i;
  return -1;
}

static unsigned long long rng = 0x9e3779b97f4a7c15ull;
static unsigned next(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (unsigned)rng;
}

/* Every name that is or was in the array, and some never added, found where a scan finds it. */
static int agrees(const newt_strindex *x, const item *v, int n, int universe) {
  char name[24];
  for (int k = 0; k < universe; k++) {
    snprintf(name, sizeof name, "w-%d", k);
    if (newt_strindex_find(x, v, name) != scan(v, n, name)) return 0;
  }
  return x->count == n;
}

static void test_strindex_against_scan(void) {
  enum { U = 3000 };
  static item v[U];
  int n = 0, ok = 1;
  newt_strindex x = NEWT_STRINDEX(item, name);
  T_CHECK(newt_strindex_find(&x, v, "w-1") == -1); /* nothing allocated yet */
  for (int step = 0; step < 20000 && ok; step++) {
    char name[24];
    snprintf(name, sizeof name, "w-%u", next() % U);
    int at = newt_strindex_find(&x, v, name);
    if (at < 0 && n < U) { /* a join */
      snprintf(v[n].name, sizeof v[n].name, "%s", name);
      T_OK(newt_strindex_add(&x, v, n));
      n++;
    } else if (at >= 0) { /* a leave: the last item moves into its place */
      int last = n - 1;
      newt_strindex_del(&x, v, at);
      newt_strindex_renumber(&x, v, last, at);
      v[at] = v[last];
      n--;
    }
    if (step % 997 == 0) ok = agrees(&x, v, n, U + 10);
  }
  T_CHECK(ok && agrees(&x, v, n, U + 10));
  newt_strindex_clear(&x);
  T_CHECK(x.count == 0 && newt_strindex_find(&x, v, v[0].name) == -1);
  T_OK(newt_strindex_add(&x, v, 0));
  T_CHECK(newt_strindex_find(&x, v, v[0].name) == 0);
  newt_strindex_free(&x);
  T_CHECK(newt_strindex_find(&x, v, v[0].name) == -1);
}

/* A change of workers/<id> (or its deletion) through the watch's batch. */
static void worker_change(coord *c, const char *id, int deleted, int64_t lease) {
  static rdzv_etcd_kv kv;
  static char key[128];
  snprintf(key, sizeof key, "/newt/j/workers/%s", id);
  kv = (rdzv_etcd_kv){.key = key, .key_len = strlen(key), .lease = lease, .create_revision = 1, .mod_revision = 1};
  job_change ch;
  memset(&ch, 0, sizeof ch);
  ch.rec = JOB_REC_WORKER, ch.deleted = deleted, ch.kv = &kv;
  snprintf(ch.id, sizeof ch.id, "%s", id);
  snprintf(ch.u.worker.id, sizeof ch.u.worker.id, "%s", id);
  snprintf(ch.u.worker.host, sizeof ch.u.worker.host, "h");
  snprintf(ch.u.worker.addr, sizeof ch.u.worker.addr, "10.0.0.1:1");
  snprintf(ch.u.worker.state, sizeof ch.u.worker.state, "training");
  ch.u.worker.lease = lease;
  coord_on_batch(c, &ch, 1, 0);
}

static int members_agree(const coord *c, int universe) {
  char id[32];
  for (int k = 0; k < universe; k++) {
    snprintf(id, sizeof id, "w%d", k);
    int want = -1;
    for (int i = 0; i < c->nmembers && want < 0; i++)
      if (strcmp(c->members[i].id, id) == 0) want = i;
    if (coord_find_member(c, id) != want) return 0;
  }
  return 1;
}

static coord *new_coord(void) {
  coord *c = calloc(1, sizeof *c);
  pthread_mutex_init(&c->mu, NULL);
  coord_picture_init(c);
  return c;
}

static void free_coord(coord *c) {
  plan_free(&c->plan);
  free(c->members), free(c->acks), free(c->departed), free(c->reports), free(c->held), free(c->held_ids);
  coord_picture_free(c);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static void test_members_join_leave_return(void) {
  coord *c = new_coord();
  for (int k = 0; k < 200; k++) {
    char id[32];
    snprintf(id, sizeof id, "w%d", k);
    worker_change(c, id, 0, 100 + k);
  }
  T_CHECK(c->nmembers == 200 && members_agree(c, 210));
  worker_change(c, "w5", 0, 7); /* an update: still one member, its lease the new one */
  T_CHECK(c->nmembers == 200 && coord_find_member(c, "w5") >= 0 && c->members[coord_find_member(c, "w5")].lease == 7);
  for (int k = 0; k < 200; k += 3) { /* leaves, the first and the last among them */
    char id[32];
    snprintf(id, sizeof id, "w%d", k);
    worker_change(c, id, 1, 0);
  }
  worker_change(c, "w199", 1, 0);
  T_CHECK(c->nmembers == 200 - 67 - 1 && members_agree(c, 210));
  T_CHECK(coord_find_member(c, "w0") < 0 && coord_find_member(c, "w199") < 0 && coord_find_member(c, "w1") >= 0);
  worker_change(c, "w0", 0, 1); /* back */
  worker_change(c, "w3", 0, 1);
  T_CHECK(c->nmembers == 134 && members_agree(c, 210));
  coord_on_batch(c, NULL, 0, 1); /* a resync starts the members anew */
  T_CHECK(c->nmembers == 0 && coord_find_member(c, "w1") < 0);
  worker_change(c, "w1", 0, 1);
  T_CHECK(c->nmembers == 1 && coord_find_member(c, "w1") == 0 && members_agree(c, 210));
  free_coord(c);
}

/* An ack of each rank counted once, found by its id; a new plan starts them anew. */
static void test_acks_once(void) {
  coord *c = new_coord();
  newt_plan *p = &c->plan;
  p->generation = 4, p->dp = 50, p->tp = 1, p->pp = 1, p->nranks = 50;
  p->ranks = calloc(50, sizeof *p->ranks);
  for (int k = 0; k < 50; k++) {
    snprintf(p->ranks[k].worker, sizeof p->ranks[k].worker, "w%d", k);
    p->ranks[k].rank = k;
  }
  for (int k = 0; k < 60; k++) { /* ranks and others */
    char id[32];
    snprintf(id, sizeof id, "w%d", k);
    worker_change(c, id, 0, 100 + k);
  }
  static rdzv_etcd_kv kv;
  static char key[128];
  for (int round = 0; round < 2; round++) /* every ack written twice */
    for (int k = 59; k >= 0; k--) {
      job_change ch;
      memset(&ch, 0, sizeof ch);
      snprintf(key, sizeof key, "/newt/j/acks/4/w%d", k);
      kv = (rdzv_etcd_kv){.key = key, .key_len = strlen(key), .lease = 100 + k};
      ch.rec = JOB_REC_ACK, ch.kv = &kv, ch.generation = 4;
      snprintf(ch.id, sizeof ch.id, "w%d", k);
      ch.u.ack.t_step = k; /* the first one counts */
      coord_on_batch(c, &ch, 1, 0);
    }
  T_CHECK(c->nacks == 50); /* the ranks' only, once each */
  int ok = 1;
  for (int k = 0; k < 60; k++) {
    char id[32];
    snprintf(id, sizeof id, "w%d", k);
    int i = coord_find_ack(c, id);
    ok &= k < 50 ? i >= 0 && strcmp(c->acks[i].id, id) == 0 : i < 0;
  }
  T_CHECK(ok);
  newt_plan next;
  memset(&next, 0, sizeof next);
  next.generation = 5;
  coord_set_plan_locked(c, &next);
  T_CHECK(c->nacks == 0 && coord_find_ack(c, "w1") < 0);
  free_coord(c);
}

int main(void) {
  T_RUN(test_strindex_against_scan);
  T_RUN(test_members_join_leave_return);
  T_RUN(test_acks_once);
  return T_DONE();
}
