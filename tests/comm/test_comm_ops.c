/* Every operation of the CPU backend against a plain reference computed here: allreduce,
 * reduce-scatter, allgather (also in place), broadcast from two roots, send/recv, barrier
 * and the *_async forms; dtypes f32, bf16, i32, i64, u8; ops sum, avg, max; sizes 0, 1,
 * primes, sizes not divisible by the rank count and sizes large enough for the ring
 * algorithms; 1 to 8 ranks over shared memory, 2 to 4 over TCP, 4 and 6 on two "hosts"
 * (shared memory within, TCP between). Each rank is a real process.
 *
 * Inputs are small integers, so every sum is exact whatever the order and the results
 * must equal the reference bit for bit; a separate check with fractional values bounds
 * the rounding (bf16: 2^-8 relative per reduction step). Every rank also checks that all
 * ranks got bitwise identical allreduce results. */
#include <math.h>

#include "comm/comm.h"
#include "comm_test.h"
#include "common/dtype.h"
#include "test.h"

static const newt_dtype dtypes_all[] = {NEWT_F32, NEWT_BF16, NEWT_I32, NEWT_I64, NEWT_U8};
static const size_t sizes_ar[] = {0, 1, 2, 3, 7, 13, 31, 127, 1021, 4099, 65537, 300007};
static const size_t sizes_rs[] = {0, 1, 3, 7, 61, 1021, 40009};

static double gen(newt_dtype dt, int rank, size_t i, int seed) {
  if (dt == NEWT_U8) return (double)((rank * 3 + i + (size_t)seed) % 7);
  return (double)((int)((rank * 131 + i * 31 + (size_t)seed * 7) % 19) - 9);
}

/* The reduction of element i over all ranks, as the backend must produce it. */
static double expect_reduce(newt_dtype dt, comm_op op, int n, size_t i, int seed) {
  double acc = op == COMM_MAX ? -1e300 : 0;
  for (int r = 0; r < n; r++) {
    double x = gen(dt, r, i, seed);
    acc = op == COMM_MAX ? (x > acc ? x : acc) : acc + x;
  }
  if (op == COMM_AVG) {
    if (dt == NEWT_F32 || dt == NEWT_BF16) acc = (double)((float)acc / (float)n);
    else acc = (double)((int64_t)acc / n);
  }
  uint64_t tmp = 0;
  ct_set_elem(dt, &tmp, 0, acc); /* the type's own rounding */
  return ct_get_elem(dt, &tmp, 0);
}

static void *xalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) abort();
  return p;
}

static const char *opname(comm_op op) { return op == COMM_SUM ? "sum" : op == COMM_AVG ? "avg" : "max"; }

/* Bitwise agreement of `buf` across ranks, through allgather of a hash. */
static void check_agree(comm_t *c, int rank, const void *buf, size_t bytes, const char *what) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; i++) h = (h ^ ((const uint8_t *)buf)[i]) * 1099511628211ull;
  int n = comm_size(c);
  uint64_t *all = xalloc(sizeof(uint64_t) * (size_t)n);
  OKR(comm_allgather(c, &h, all, 1, NEWT_I64));
  for (int r = 0; r < n; r++) CHECKR(all[r] == h, "%s: rank %d's result differs from ours", what, r);
  free(all);
}

static void check_allreduce(comm_t *c, int rank, newt_dtype dt, comm_op op, size_t count, int inplace, int seed) {
  int n = comm_size(c);
  size_t es = newt_dtype_size(dt);
  void *send = xalloc(count * es), *recv = inplace ? send : xalloc(count * es);
  for (size_t i = 0; i < count; i++) ct_set_elem(dt, send, i, gen(dt, rank, i, seed));
  OKR(comm_allreduce(c, send, recv, count, dt, op));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < count; i++)
    if (ct_get_elem(dt, recv, i) != expect_reduce(dt, op, n, i, seed) && bad++ == 0) first = i;
  CHECKR(bad == 0, "allreduce %s %s count %zu%s: %zu wrong, first [%zu] = %g, expected %g", newt_dtype_name(dt),
         opname(op), count, inplace ? " in place" : "", bad, first, ct_get_elem(dt, recv, first),
         expect_reduce(dt, op, n, first, seed));
  if (count > 0) check_agree(c, rank, recv, count * es, "allreduce");
  if (!inplace) free(recv);
  free(send);
}

static void check_reduce_scatter(comm_t *c, int rank, newt_dtype dt, comm_op op, size_t rc, int inplace, int seed) {
  int n = comm_size(c);
  size_t es = newt_dtype_size(dt);
  void *send = xalloc(rc * (size_t)n * es);
  for (size_t i = 0; i < rc * (size_t)n; i++) ct_set_elem(dt, send, i, gen(dt, rank, i, seed));
  void *recv = inplace ? (char *)send + (size_t)rank * rc * es : xalloc(rc * es);
  OKR(comm_reduce_scatter(c, send, recv, rc, dt, op));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < rc; i++)
    if (ct_get_elem(dt, recv, i) != expect_reduce(dt, op, n, (size_t)rank * rc + i, seed) && bad++ == 0) first = i;
  CHECKR(bad == 0, "reduce_scatter %s %s recvcount %zu%s: %zu wrong, first [%zu] = %g, expected %g",
         newt_dtype_name(dt), opname(op), rc, inplace ? " in place" : "", bad, first, ct_get_elem(dt, recv, first),
         expect_reduce(dt, op, n, (size_t)rank * rc + first, seed));
  if (!inplace) free(recv);
  free(send);
}

static void check_allgather(comm_t *c, int rank, newt_dtype dt, size_t sc, int inplace, int seed) {
  int n = comm_size(c);
  size_t es = newt_dtype_size(dt);
  void *recv = xalloc(sc * (size_t)n * es);
  memset(recv, 0xee, sc * (size_t)n * es);
  void *send = inplace ? (char *)recv + (size_t)rank * sc * es : xalloc(sc * es);
  for (size_t i = 0; i < sc; i++) ct_set_elem(dt, send, i, gen(dt, rank, i, seed));
  OKR(comm_allgather(c, send, recv, sc, dt));
  size_t bad = 0;
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < sc; i++) {
      uint64_t e = 0;
      ct_set_elem(dt, &e, 0, gen(dt, r, i, seed));
      if (ct_get_elem(dt, recv, (size_t)r * sc + i) != ct_get_elem(dt, &e, 0)) bad++;
    }
  CHECKR(bad == 0, "allgather %s sendcount %zu%s: %zu wrong", newt_dtype_name(dt), sc, inplace ? " in place" : "", bad);
  if (!inplace) free(send);
  free(recv);
}

static void check_broadcast(comm_t *c, int rank, size_t count, int root, int inplace) {
  float *buf = xalloc(count * 4), *recv = inplace ? buf : xalloc(count * 4);
  for (size_t i = 0; i < count; i++) buf[i] = rank == root ? (float)(i % 1000) + 0.5f : -1.0f;
  if (!inplace) memset(recv, 0, count * 4);
  OKR(comm_broadcast(c, rank == root ? buf : NULL, recv, count, NEWT_F32, root));
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) bad += recv[i] != (float)(i % 1000) + 0.5f;
  CHECKR(bad == 0, "broadcast count %zu root %d%s: %zu wrong", count, root, inplace ? " in place" : "", bad);
  if (!inplace) free(recv);
  free(buf);
}

static void check_sendrecv(comm_t *c, int rank, size_t count) {
  int n = comm_size(c);
  if (n == 1) return;
  int to = (rank + 1) % n, from = (rank + n - 1) % n;
  int32_t *out = xalloc(count * 4), *in = xalloc(count * 4);
  for (size_t i = 0; i < count; i++) out[i] = (int32_t)(rank * 100000 + (int)i);
  if (rank % 2 == 0) {
    OKR(comm_send(c, out, count, NEWT_I32, to));
    OKR(comm_recv(c, in, count, NEWT_I32, from));
  } else {
    OKR(comm_recv(c, in, count, NEWT_I32, from));
    OKR(comm_send(c, out, count, NEWT_I32, to));
  }
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) bad += in[i] != (int32_t)(from * 100000 + (int)i);
  CHECKR(bad == 0, "send/recv count %zu from rank %d: %zu wrong", count, from, bad);
  free(out);
  free(in);
}

/* Fractional values: the result is within the rounding the reduction may do. */
static void check_rounding(comm_t *c, int rank, newt_dtype dt, size_t count) {
  int n = comm_size(c);
  size_t es = newt_dtype_size(dt);
  void *send = xalloc(count * es), *recv = xalloc(count * es);
  for (size_t i = 0; i < count; i++) ct_set_elem(dt, send, i, sin(rank * 7.1 + (double)i * 0.37));
  OKR(comm_allreduce(c, send, recv, count, dt, COMM_SUM));
  double worst = 0;
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) {
    double exact = 0, mag = 0;
    for (int r = 0; r < n; r++) {
      uint64_t t = 0;
      ct_set_elem(dt, &t, 0, sin(r * 7.1 + (double)i * 0.37));
      exact += ct_get_elem(dt, &t, 0);
      mag += fabs(ct_get_elem(dt, &t, 0));
    }
    double tol = dt == NEWT_BF16 ? (n + 1) * mag / 256.0 : (n + 1) * mag * 1.2e-7;
    double err = fabs(ct_get_elem(dt, recv, i) - exact);
    if (err > tol) bad++;
    if (err > worst) worst = err;
  }
  CHECKR(bad == 0, "allreduce %s fractional count %zu: %zu beyond tolerance (worst %g)", newt_dtype_name(dt), count,
         bad, worst);
  check_agree(c, rank, recv, count * es, "allreduce fractional");
  free(send);
  free(recv);
}

static void check_async(comm_t *c, int rank) {
  int n = comm_size(c);
  enum { K = 3 };
  size_t counts[K] = {5, 4099, 70001};
  float *s[K], *r[K];
  comm_req_t *req[K + 2];
  for (int k = 0; k < K; k++) {
    s[k] = xalloc(counts[k] * 4);
    r[k] = xalloc(counts[k] * 4);
    for (size_t i = 0; i < counts[k]; i++) s[k][i] = (float)gen(NEWT_F32, rank, i, k);
    OKR(comm_allreduce_async(c, s[k], r[k], counts[k], NEWT_F32, COMM_SUM, &req[k]));
  }
  size_t rc = 1001;
  float *rs_send = xalloc(rc * (size_t)n * 4), *rs_recv = xalloc(rc * 4);
  for (size_t i = 0; i < rc * (size_t)n; i++) rs_send[i] = (float)gen(NEWT_F32, rank, i, 9);
  OKR(comm_reduce_scatter_async(c, rs_send, rs_recv, rc, NEWT_F32, COMM_SUM, &req[K]));
  float *ag = xalloc(rc * (size_t)n * 4), mine[1001];
  for (size_t i = 0; i < rc; i++) mine[i] = (float)gen(NEWT_F32, rank, i, 11);
  OKR(comm_allgather_async(c, mine, ag, rc, NEWT_F32, &req[K + 1]));
  /* a blocking operation issued meanwhile runs after the queued ones */
  float one = 1, total = 0;
  OKR(comm_allreduce(c, &one, &total, 1, NEWT_F32, COMM_SUM));
  CHECKR(total == (float)n, "blocking allreduce among async ones: %g", total);
  /* wait out of order */
  for (int k = K + 1; k >= 0; k--) OKR(comm_wait(req[k]));
  for (int k = 0; k < K; k++) {
    size_t bad = 0;
    for (size_t i = 0; i < counts[k]; i++) bad += r[k][i] != (float)expect_reduce(NEWT_F32, COMM_SUM, n, i, k);
    CHECKR(bad == 0, "allreduce_async #%d count %zu: %zu wrong", k, counts[k], bad);
    free(s[k]);
    free(r[k]);
  }
  size_t bad = 0;
  for (size_t i = 0; i < rc; i++) bad += rs_recv[i] != (float)expect_reduce(NEWT_F32, COMM_SUM, n, (size_t)rank * rc + i, 9);
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < rc; i++) bad += ag[(size_t)q * rc + i] != (float)gen(NEWT_F32, q, i, 11);
  CHECKR(bad == 0, "reduce_scatter_async/allgather_async: %zu wrong", bad);
  free(rs_send);
  free(rs_recv);
  free(ag);
}

static int ops_rank(ct_world *w, int rank, void *arg) {
  (void)arg;
  comm_config cfg;
  ct_config(w, rank, &cfg);
  comm_t *c = NULL;
  OKR(comm_create(&cfg, &c));
  if (!c) return 1;
  int n = comm_size(c);
  CHECKR(comm_rank(c) == rank && n == w->size, "rank/size %d/%d", comm_rank(c), n);
  int seed = 1;
  for (size_t k = 0; k < sizeof sizes_ar / sizeof *sizes_ar; k++) {
    size_t count = sizes_ar[k];
    int big = count > 100000;
    for (size_t d = 0; d < sizeof dtypes_all / sizeof *dtypes_all; d++) {
      newt_dtype dt = dtypes_all[d];
      int floaty = dt == NEWT_F32 || dt == NEWT_BF16;
      if (big && !floaty) continue;
      check_allreduce(c, rank, dt, COMM_SUM, count, 0, seed++);
      if (floaty || dt == NEWT_I32) check_allreduce(c, rank, dt, COMM_AVG, count, 0, seed++);
      if (floaty || dt == NEWT_I64) check_allreduce(c, rank, dt, COMM_MAX, count, 0, seed++);
    }
    check_allreduce(c, rank, NEWT_F32, COMM_SUM, count, 1, seed++);
    check_broadcast(c, rank, count, 0, 0);
    check_broadcast(c, rank, count, n - 1, 1);
    check_sendrecv(c, rank, count);
  }
  for (size_t k = 0; k < sizeof sizes_rs / sizeof *sizes_rs; k++) {
    size_t count = sizes_rs[k];
    check_reduce_scatter(c, rank, NEWT_F32, COMM_SUM, count, 0, seed++);
    check_reduce_scatter(c, rank, NEWT_F32, COMM_AVG, count, 0, seed++);
    check_reduce_scatter(c, rank, NEWT_F32, COMM_MAX, count, 0, seed++);
    check_reduce_scatter(c, rank, NEWT_BF16, COMM_SUM, count, 0, seed++);
    check_reduce_scatter(c, rank, NEWT_BF16, COMM_AVG, count, 0, seed++);
    check_reduce_scatter(c, rank, NEWT_I32, COMM_SUM, count, 0, seed++);
    check_reduce_scatter(c, rank, NEWT_F32, COMM_SUM, count, 1, seed++);
    check_allgather(c, rank, NEWT_F32, count, 0, seed++);
    check_allgather(c, rank, NEWT_BF16, count, 0, seed++);
    check_allgather(c, rank, NEWT_U8, count, 0, seed++);
    check_allgather(c, rank, NEWT_F32, count, 1, seed++);
  }
  check_rounding(c, rank, NEWT_F32, 1000);
  check_rounding(c, rank, NEWT_F32, 100003);
  check_rounding(c, rank, NEWT_BF16, 1000);
  check_rounding(c, rank, NEWT_BF16, 100003);
  OKR(comm_barrier(c));
  check_async(c, rank);
  comm_status st;
  comm_get_status(c, &st);
  CHECKR(st.code == NEWT_OK, "status after the checks: %s", st.msg);
  OKR(comm_barrier(c));
  comm_free(c);
  return ct_failures;
}

static void run_world(int n, int mode) {
  static const char *const modes[] = {"shm", "tcp", "mixed"};
  ct_world w;
  char name[32];
  snprintf(name, sizeof name, "ops%d%s", n, modes[mode]);
  ct_world_init(&w, n, mode, name);
  double t0 = newt_now_s();
  ct_spawn(&w, ops_rank, NULL);
  int bad = ct_wait(&w, 100000, NULL);
  T_CHECK_MSG(bad == 0, "%d ranks of %d (%s) failed", bad, n, modes[mode]);
  T_CHECK_MSG(ct_shm_count(w.job) == 0, "shared memory of %s left in /dev/shm", w.job);
  fprintf(stderr, "  %d ranks over %s: %.2f s\n", n, modes[mode], newt_now_s() - t0);
  ct_world_free(&w);
}

static void test_shm_1_to_8(void) {
  for (int n = 1; n <= 8; n++) run_world(n, CT_SHM);
}

static void test_tcp(void) {
  for (int n = 2; n <= 4; n++) run_world(n, CT_TCP);
}

static void test_mixed(void) {
  run_world(4, CT_MIXED);
  run_world(6, CT_MIXED);
}

int main(void) {
  T_RUN(test_shm_1_to_8);
  T_RUN(test_tcp);
  T_RUN(test_mixed);
  return T_DONE();
}
