/* comm_split into tensor and data groups (4 ranks as 2x2 over shared memory, 6 as 2x3
 * on two hosts): ranks ordered by key, color < 0 gets no communicator, collectives in
 * each group give the group's results, and a tensor group and a data group run at the
 * same time from two threads. A kill -9 inside one group fails that group, the parent
 * (its peer renumbered to the parent's rank) and the other groups of every survivor;
 * the survivors then shrink the parent and carry on. */
#include <pthread.h>

#include "comm/comm.h"
#include "comm_test.h"
#include "test.h"

typedef struct layout {
  int tp;     /* tensor group size: groups of consecutive ranks */
  int victim; /* -1: no failure */
} layout;

/* allreduce of the world ranks in c: the group's sum, checked against `expect`. */
static int group_sum(comm_t *c, int rank, size_t count, int expect) {
  int32_t *x = malloc(count * 4), *y = malloc(count * 4);
  for (size_t i = 0; i < count; i++) x[i] = rank + 1000 * (int32_t)(i % 7);
  newt_result_t r = comm_allreduce(c, x, y, count, NEWT_I32, COMM_SUM);
  int bad = 0;
  for (size_t i = 0; r == NEWT_OK && i < count; i++)
    bad += y[i] != expect + 1000 * (int32_t)(i % 7) * comm_size(c);
  free(x);
  free(y);
  return r != NEWT_OK ? -1 : bad;
}

typedef struct loop_arg {
  comm_t *c;
  int rank, expect, bad, iters;
} loop_arg;

static void *loop_thread(void *p) {
  loop_arg *a = p;
  for (int i = 0; i < a->iters; i++)
    if (group_sum(a->c, a->rank, 20011, a->expect) != 0) a->bad++;
  return NULL;
}

static int split_rank(ct_world *w, int rank, void *arg) {
  const layout *lay = arg;
  comm_config cfg;
  ct_config(w, rank, &cfg);
  comm_t *world = NULL, *tpc = NULL, *dpc = NULL, *rev = NULL, *none = NULL;
  OKR(comm_create(&cfg, &world));
  if (!world) return 1;
  int n = w->size, tp = lay->tp, dp = n / tp;
  int tgroup = rank / tp, dgroup = rank % tp;
  OKR(comm_split(world, tgroup, rank, &tpc));
  OKR(comm_split(world, dgroup, rank, &dpc));
  OKR(comm_split(world, 0, -rank, &rev)); /* keys reverse the order */
  OKR(comm_split(world, rank == n - 1 ? -1 : 0, 0, &none));
  if (!tpc || !dpc || !rev) return 1;
  CHECKR(comm_size(tpc) == tp && comm_rank(tpc) == rank % tp, "tensor group: rank %d of %d", comm_rank(tpc), comm_size(tpc));
  CHECKR(comm_size(dpc) == dp && comm_rank(dpc) == rank / tp, "data group: rank %d of %d", comm_rank(dpc), comm_size(dpc));
  CHECKR(comm_rank(rev) == n - 1 - rank, "reversed split: rank %d", comm_rank(rev));
  CHECKR((none == NULL) == (rank == n - 1), "color < 0 gave %p", (void *)none);
  int tsum = 0, dsum = 0;
  for (int q = 0; q < tp; q++) tsum += tgroup * tp + q;
  for (int q = 0; q < dp; q++) dsum += q * tp + dgroup;
  CHECKR(group_sum(tpc, rank, 1001, tsum) == 0, "tensor group allreduce");
  CHECKR(group_sum(dpc, rank, 100003, dsum) == 0, "data group allreduce");
  CHECKR(group_sum(world, rank, 777, n * (n - 1) / 2) == 0, "world allreduce");
  if (none) {
    int s = 0;
    for (int q = 0; q < n - 1; q++) s += q;
    CHECKR(group_sum(none, rank, 5, s) == 0, "split without the last rank");
  }
  /* two groups at once from two threads */
  loop_arg la = {.c = tpc, .rank = rank, .expect = tsum, .iters = 30};
  pthread_t th;
  pthread_create(&th, NULL, loop_thread, &la);
  int bad = 0;
  for (int i = 0; i < 30; i++)
    if (group_sum(dpc, rank, 20011, dsum) != 0) bad++;
  pthread_join(th, NULL);
  CHECKR(la.bad == 0 && bad == 0, "concurrent groups: %d tensor, %d data ct_failures", la.bad, bad);
  comm_free(none);
  comm_free(rev);
  if (lay->victim >= 0) {
    atomic_fetch_add(&w->sh->ready, 1);
    newt_result_t r = NEWT_OK;
    for (int i = 0; i < 1000000 && r == NEWT_OK; i++) {
      int32_t x = 1, y = 0;
      r = comm_allreduce(tpc, &x, &y, 1, NEWT_I32, COMM_SUM);
      if (r == NEWT_OK) newt_sleep_us(100);
    }
    comm_status ws, ts, ds;
    comm_get_status(world, &ws);
    comm_get_status(tpc, &ts);
    comm_get_status(dpc, &ds);
    CHECKR(ws.code != NEWT_OK && ts.code != NEWT_OK && ds.code != NEWT_OK, "not every group failed: %s / %s / %s",
           newt_result_name(ws.code), newt_result_name(ts.code), newt_result_name(ds.code));
    CHECKR(ws.peer == lay->victim, "the parent names peer %d, expected %d: %s", ws.peer, lay->victim, ws.msg);
    if (rank / tp == lay->victim / tp)
      CHECKR(ts.peer == lay->victim % tp, "the tensor group names peer %d: %s", ts.peer, ts.msg);
    comm_free(tpc);
    comm_free(dpc);
    int ex = lay->victim, survivors[CT_MAX], k = 0;
    for (int q = 0; q < n; q++)
      if (q != ex) survivors[k++] = q;
    unsigned char secret[32];
    memcpy(secret, w->secret, 32);
    secret[0] ^= 1;
    comm_t *s = NULL;
    OKR(comm_shrink(world, &ex, 1, w->generation + 1, secret, sizeof secret, &s));
    int total = 0;
    for (int q = 0; q < k; q++) total += survivors[q];
    if (s) CHECKR(group_sum(s, rank, 4099, total) == 0, "allreduce after shrink");
    comm_free(s);
    comm_free(world);
    return ct_failures;
  }
  OKR(comm_barrier(world));
  comm_free(tpc);
  comm_free(dpc);
  comm_free(world);
  return ct_failures;
}

static void run(int n, int mode, int tp, int victim) {
  ct_world w;
  char name[32];
  snprintf(name, sizeof name, "split%d%d", n, victim);
  ct_world_init(&w, n, mode, name);
  layout lay = {.tp = tp, .victim = victim};
  ct_spawn(&w, split_rank, &lay);
  int killed[CT_MAX] = {0};
  if (victim >= 0) {
    newt_deadline_t d = newt_deadline_in_ms(60000);
    while (atomic_load(&w.sh->ready) < n && !newt_deadline_passed(d)) newt_sleep_ms(1);
    newt_sleep_ms(20);
    kill(w.pids[victim], SIGKILL);
    killed[victim] = 1;
  }
  T_CHECK(ct_wait(&w, 90000, killed) == 0);
  T_CHECK_MSG(ct_shm_count(w.job) == 0, "shared memory of %s left in /dev/shm", w.job);
  ct_world_free(&w);
}

static void test_split_2x2(void) { run(4, CT_SHM, 2, -1); }
static void test_split_2x3_two_hosts(void) { run(6, CT_MIXED, 3, -1); }
static void test_split_kill9(void) { run(4, CT_SHM, 2, 1); }

int main(void) {
  T_RUN(test_split_2x2);
  T_RUN(test_split_2x3_two_hosts);
  T_RUN(test_split_kill9);
  return T_DONE();
}
