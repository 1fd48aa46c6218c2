/* The NCCL backend on a GPU machine (label gpu; run by tests/gpu/run.sh). Every
 * scenario runs in its own forked process, so the test process itself never touches
 * CUDA before forking.
 *
 * One GPU:
 *  - a communicator of one rank: every operation (f32 sum/avg/max, bf16, i32, in place,
 *    zero elements, the *_async forms), split, against host references;
 *  - abort: every later operation fails at once with NEWT_ERR_ABORTED; abort and
 *    rebuild cycles;
 *  - a build whose peer never comes fails by the deadline instead of hanging;
 *  - 100 rebuilds (some freed cleanly, some aborted) leak neither device memory
 *    (cudaMemGetInfo) nor file descriptors.
 * Two or more GPUs (skipped, and said so, with one):
 *  - every operation across ranks, send/recv in a ring;
 *  - a blocked operation returns within 100 ms of comm_abort (bound asserted: 1 s);
 *  - kill -9 of a rank: the survivors' operation fails by the deadline, they shrink
 *    (ncclCommShrink with NCCL_SHRINK_ABORT) and get correct results; then a replacement
 *    process joins a new communicator built from a fresh unique id (growth). */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm_test.h"
#include "common/dtype.h"
#include "test.h"

#define CUDA_OK(call)                                                                      \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    CHECKR(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                    \
  } while (0)

/* Shared between the forked ranks: the unique id (what a plan would carry) and flags. */
typedef struct shared {
  unsigned char id[COMM_NCCL_ID_BYTES];
  _Atomic int id_ready;
  _Atomic int ready;
  _Atomic int go;
  _Atomic int done;
  unsigned char id2[COMM_NCCL_ID_BYTES];
  _Atomic int id2_ready;
} shared;

static shared *sh;

/* Runs fn(rank) in a forked child for each rank; returns the number of failed ranks.
 * victim >= 0 is killed with SIGKILL once every rank said it is ready. */
typedef int (*rank_fn)(int rank, int n);

static int run_ranks(int n, rank_fn fn, int victim, int timeout_s) {
  memset(sh, 0, sizeof *sh);
  pid_t pids[16];
  fflush(stderr);
  for (int r = 0; r < n; r++) {
    pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      int f = fn(r, n);
      fflush(stderr);
      _exit(f ? 1 : 0);
    }
    pids[r] = pid;
  }
  if (victim >= 0) {
    newt_deadline_t d = newt_deadline_in_ms(timeout_s * 1000);
    while (atomic_load(&sh->ready) < n && !newt_deadline_passed(d)) newt_sleep_ms(1);
    newt_sleep_ms(50);
    kill(pids[victim], SIGKILL);
  }
  int bad = 0;
  for (int r = 0; r < n; r++) {
    int st = 0;
    if (newt_proc_wait(pids[r], (int64_t)timeout_s * 1000, &st) != NEWT_OK) {
      fprintf(stderr, "rank %d did not finish in %d s\n", r, timeout_s);
      kill(pids[r], SIGKILL);
      newt_proc_wait(pids[r], 5000, &st);
      bad++;
    } else if (r != victim && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
      bad++;
    }
  }
  return bad;
}

/* How many GPUs, asked in a child so this process stays CUDA-free. */
static int gpu_count(void) {
  pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(n > 100 ? 100 : n);
  }
  int st = 0;
  if (newt_proc_wait(pid, 60000, &st) != NEWT_OK || !WIFEXITED(st)) return 0;
  return WEXITSTATUS(st);
}

static comm_config nccl_cfg(int rank, int n, const unsigned char *id, int64_t timeout_ms) {
  comm_config cfg = {.backend = COMM_BACKEND_NCCL, .rank = rank, .size = n, .device = rank,
                     .timeout_ms = timeout_ms};
  memcpy(cfg.nccl_id, id, COMM_NCCL_ID_BYTES);
  return cfg;
}

/* Rank 0 makes the id, the others wait for it (in a real job it comes with the plan). */
static void share_id(int rank, unsigned char *slot, _Atomic int *flag) {
  if (rank == 0) {
    if (comm_nccl_unique_id(slot) != NEWT_OK) fprintf(stderr, "rank 0: unique id: %s\n", newt_errmsg());
    atomic_store(flag, 1);
  } else {
    while (!atomic_load(flag)) newt_sleep_ms(1);
  }
}

static void *dev_from(const void *host, size_t bytes) {
  void *d = NULL;
  if (cudaMalloc(&d, bytes ? bytes : 1) != cudaSuccess) return NULL;
  if (bytes) cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
  return d;
}

static void to_host(void *host, const void *dev, size_t bytes) {
  if (bytes) cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost);
}

static float val(int rank, size_t i) { return (float)((int)((rank * 13 + i * 7) % 11) - 5); }

/* allreduce of count f32 (op) across the communicator, checked on the host */
static void check_allreduce_f32(comm_t *c, int rank, comm_op op, size_t count, int inplace) {
  int n = comm_size(c);
  float *h = malloc(count * 4 + 4), *out = malloc(count * 4 + 4);
  for (size_t i = 0; i < count; i++) h[i] = val(rank, i);
  float *ds = dev_from(h, count * 4), *dr = inplace ? ds : dev_from(NULL, count * 4);
  OKR(comm_allreduce(c, ds, dr, count, NEWT_F32, op));
  to_host(out, dr, count * 4);
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) {
    float e = op == COMM_MAX ? -1e30f : 0;
    for (int q = 0; q < n; q++) e = op == COMM_MAX ? (val(q, i) > e ? val(q, i) : e) : e + val(q, i);
    if (op == COMM_AVG) e /= (float)n;
    bad += out[i] != e;
  }
  CHECKR(bad == 0, "allreduce f32 op %d count %zu%s: %zu wrong", (int)op, count, inplace ? " in place" : "", bad);
  cudaFree(ds);
  if (!inplace) cudaFree(dr);
  free(h);
  free(out);
}

static void check_all_ops(comm_t *c, int rank) {
  int n = comm_size(c);
  const size_t counts[] = {0, 1, 7, 1000, 1 << 20};
  for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
    check_allreduce_f32(c, rank, COMM_SUM, counts[k], 0);
    check_allreduce_f32(c, rank, COMM_AVG, counts[k], 0);
    check_allreduce_f32(c, rank, COMM_MAX, counts[k], 1);
  }
  /* bf16 and i32 sums */
  size_t m = 4099;
  uint16_t *hb = malloc(m * 2), *ob = malloc(m * 2);
  int32_t *hi = malloc(m * 4), *oi = malloc(m * 4);
  for (size_t i = 0; i < m; i++) {
    hb[i] = newt_f32_to_bf16(val(rank, i));
    hi[i] = (int32_t)(rank * 1000 + (int)i);
  }
  void *db = dev_from(hb, m * 2), *di = dev_from(hi, m * 4);
  OKR(comm_allreduce(c, db, db, m, NEWT_BF16, COMM_SUM));
  OKR(comm_allreduce(c, di, di, m, NEWT_I32, COMM_SUM));
  to_host(ob, db, m * 2);
  to_host(oi, di, m * 4);
  size_t bad = 0;
  for (size_t i = 0; i < m; i++) {
    float e = 0;
    int32_t ei = 0;
    for (int q = 0; q < n; q++) {
      e += val(q, i);
      ei += q * 1000 + (int32_t)i;
    }
    bad += newt_bf16_to_f32(ob[i]) != e || oi[i] != ei;
  }
  CHECKR(bad == 0, "bf16/i32 allreduce: %zu wrong", bad);
  cudaFree(db);
  cudaFree(di);
  /* reduce-scatter and allgather: block r of rank q holds q + r */
  size_t rc = 1001;
  float *hs = malloc(rc * (size_t)n * 4), *hr = malloc(rc * (size_t)n * 4);
  for (int b = 0; b < n; b++)
    for (size_t i = 0; i < rc; i++) hs[(size_t)b * rc + i] = (float)(rank + b);
  float *dsend = dev_from(hs, rc * (size_t)n * 4), *drecv = dev_from(NULL, rc * (size_t)n * 4);
  OKR(comm_reduce_scatter(c, dsend, drecv, rc, NEWT_F32, COMM_SUM));
  to_host(hr, drecv, rc * 4);
  bad = 0;
  for (size_t i = 0; i < rc; i++) bad += hr[i] != (float)(n * (n - 1) / 2 + n * rank);
  CHECKR(bad == 0, "reduce_scatter: %zu wrong", bad);
  OKR(comm_allgather(c, dsend, drecv, rc, NEWT_F32)); /* block 0 of each rank: rank + 0 */
  to_host(hr, drecv, rc * (size_t)n * 4);
  bad = 0;
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < rc; i++) bad += hr[(size_t)q * rc + i] != (float)q;
  CHECKR(bad == 0, "allgather: %zu wrong", bad);
  /* broadcast from the last rank */
  for (size_t i = 0; i < rc; i++) hs[i] = rank == n - 1 ? (float)i : -1.0f;
  cudaMemcpy(dsend, hs, rc * 4, cudaMemcpyHostToDevice);
  OKR(comm_broadcast(c, dsend, drecv, rc, NEWT_F32, n - 1));
  to_host(hr, drecv, rc * 4);
  bad = 0;
  for (size_t i = 0; i < rc; i++) bad += hr[i] != (float)i;
  CHECKR(bad == 0, "broadcast: %zu wrong", bad);
  /* send/recv around the ring */
  if (n > 1) {
    int to = (rank + 1) % n, from = (rank + n - 1) % n;
    for (size_t i = 0; i < rc; i++) hs[i] = (float)(rank * 10000 + (int)i);
    cudaMemcpy(dsend, hs, rc * 4, cudaMemcpyHostToDevice);
    if (rank % 2 == 0) {
      OKR(comm_send(c, dsend, rc, NEWT_F32, to));
      OKR(comm_recv(c, drecv, rc, NEWT_F32, from));
    } else {
      OKR(comm_recv(c, drecv, rc, NEWT_F32, from));
      OKR(comm_send(c, dsend, rc, NEWT_F32, to));
    }
    to_host(hr, drecv, rc * 4);
    bad = 0;
    for (size_t i = 0; i < rc; i++) bad += hr[i] != (float)(from * 10000 + (int)i);
    CHECKR(bad == 0, "send/recv: %zu wrong", bad);
  }
  OKR(comm_barrier(c));
  /* async, waited out of order */
  comm_req_t *q[3];
  for (int k = 0; k < 3; k++) OKR(comm_allreduce_async(c, dsend, drecv + k * 100, 100, NEWT_F32, COMM_SUM, &q[k]));
  for (int k = 2; k >= 0; k--) OKR(comm_wait(q[k]));
  cudaFree(dsend);
  cudaFree(drecv);
  free(hs);
  free(hr);
  free(hb);
  free(ob);
  free(hi);
  free(oi);
}

/* --- one GPU ------------------------------------------------------------------------- */

/* A communicator of one rank on device 0, from a fresh unique id. */
static comm_t *alone(int rank) {
  unsigned char id[COMM_NCCL_ID_BYTES];
  OKR(comm_nccl_unique_id(id));
  comm_config cfg = nccl_cfg(0, 1, id, 30000);
  comm_t *c = NULL;
  OKR(comm_create(&cfg, &c));
  return c;
}

static int single_ops(int rank, int n) {
  (void)n;
  comm_t *c = alone(rank);
  if (!c) return 1;
  CHECKR(comm_rank(c) == 0 && comm_size(c) == 1 && comm_get_backend(c) == COMM_BACKEND_NCCL, "rank/size/backend");
  check_all_ops(c, rank);
  comm_t *child = NULL, *none = NULL;
  OKR(comm_split(c, 0, 0, &child));
  OKR(comm_split(c, -1, 0, &none));
  CHECKR(child && comm_size(child) == 1 && none == NULL, "split");
  if (child) check_allreduce_f32(child, rank, COMM_SUM, 1000, 0);
  comm_free(child);
  comm_free(c);
  return ct_failures;
}

static void *abort_later(void *arg) {
  newt_sleep_ms(300);
  comm_abort((comm_t *)arg);
  return NULL;
}

static int single_abort_cycles(int rank, int n) {
  (void)n;
  for (int k = 0; k < 10; k++) {
    comm_t *c = alone(rank);
    if (!c) return 1;
    check_allreduce_f32(c, rank, COMM_SUM, 1000, 0);
    comm_abort(c);
    float *d = dev_from(NULL, 64);
    uint64_t t0 = newt_now_ns();
    CHECKR(comm_allreduce(c, d, d, 16, NEWT_F32, COMM_SUM) == NEWT_ERR_ABORTED, "an operation after the abort");
    CHECKR(newt_now_ns() - t0 < 100000000ull, "failing after an abort took %.1f ms", (newt_now_ns() - t0) / 1e6);
    comm_status st;
    comm_get_status(c, &st);
    CHECKR(st.code == NEWT_ERR_ABORTED, "status %s", newt_result_name(st.code));
    comm_free(c);
    cudaFree(d);
  }
  /* a peer that never comes: the nonblocking init gives up by the deadline */
  unsigned char id[COMM_NCCL_ID_BYTES];
  OKR(comm_nccl_unique_id(id));
  comm_config cfg = nccl_cfg(0, 2, id, 3000);
  comm_t *c = NULL;
  uint64_t t0 = newt_now_ns();
  newt_result_t r = comm_create(&cfg, &c);
  double ms = (newt_now_ns() - t0) / 1e6;
  CHECKR(r == NEWT_ERR_TIMEOUT && c == NULL, "a build without its peer -> %s after %.0f ms: %s", newt_result_name(r), ms,
         newt_errmsg());
  CHECKR(ms < 20000, "the build without its peer took %.0f ms", ms);
  return ct_failures;
}

static int single_leaks(int rank, int n) {
  (void)n;
  size_t free0 = 0, free1 = 0, total = 0;
  int fds0 = 0;
  for (int k = -1; k < 100; k++) {
    if (k == 0) { /* after one warm-up cycle: NCCL's one-time set-up is not a leak */
      cudaMemGetInfo(&free0, &total);
      fds0 = ct_fd_count();
    }
    comm_t *c = alone(rank);
    if (!c) return 1;
    float *d = dev_from(NULL, 4 << 20);
    OKR(comm_allreduce(c, d, d, 1 << 20, NEWT_F32, COMM_SUM));
    if (k % 10 == 3) comm_abort(c); /* some die the hard way */
    comm_free(c);
    cudaFree(d);
  }
  cudaMemGetInfo(&free1, &total);
  int fds1 = ct_fd_count();
  fprintf(stderr, "rank %d: 100 rebuilds: device memory free %zu -> %zu bytes, fds %d -> %d\n", rank, free0, free1,
          fds0, fds1);
  CHECKR(free1 + (16u << 20) >= free0, "device memory leaked: %zu bytes", free0 - free1);
  CHECKR(fds1 == fds0, "file descriptors leaked: %d -> %d", fds0, fds1);
  return ct_failures;
}

/* --- several GPUs -------------------------------------------------------------------- */

static comm_t *join(int rank, int n, unsigned char *slot, _Atomic int *flag, int64_t timeout_ms) {
  share_id(rank, slot, flag);
  comm_config cfg = nccl_cfg(rank, n, slot, timeout_ms);
  comm_t *c = NULL;
  OKR(comm_create(&cfg, &c));
  return c;
}

static int multi_ops(int rank, int n) {
  comm_t *c = join(rank, n, sh->id, &sh->id_ready, 60000);
  if (!c) return 1;
  check_all_ops(c, rank);
  comm_free(c);
  return ct_failures;
}

static int multi_abort(int rank, int n) {
  comm_t *c = join(rank, n, sh->id, &sh->id_ready, 60000);
  if (!c) return 1;
  float *d = dev_from(NULL, 4 << 20);
  if (rank == 0) {
    /* the others do not join this one: it blocks until the abort */
    pthread_t th;
    pthread_create(&th, NULL, abort_later, c);
    uint64_t t0 = newt_now_ns();
    newt_result_t r = comm_allreduce(c, d, d, 1 << 20, NEWT_F32, COMM_SUM);
    double ms = (newt_now_ns() - t0) / 1e6 - 300;
    pthread_join(th, NULL);
    CHECKR(r == NEWT_ERR_ABORTED, "the blocked allreduce -> %s: %s", newt_result_name(r), newt_errmsg());
    fprintf(stderr, "rank 0: the blocked allreduce returned %.1f ms after comm_abort\n", ms);
    CHECKR(ms < 1000, "abort took %.1f ms", ms);
    atomic_store(&sh->go, 1);
  } else {
    while (!atomic_load(&sh->go)) newt_sleep_ms(1);
  }
  comm_free(c);
  cudaFree(d);
  return ct_failures;
}

static int multi_kill(int rank, int n) {
  int victim = n - 1;
  comm_t *c = join(rank, n, sh->id, &sh->id_ready, 10000);
  if (!c) return 1;
  float *d = dev_from(NULL, 4 << 20);
  newt_result_t r = NEWT_OK;
  for (int it = 0; it < 1000000 && r == NEWT_OK; it++) {
    if (it == 3) atomic_fetch_add(&sh->ready, 1);
    r = comm_allreduce(c, d, d, 1 << 20, NEWT_F32, COMM_SUM);
  }
  CHECKR(r != NEWT_OK, "never failed");
  fprintf(stderr, "rank %d: after the kill: %s: %s\n", rank, newt_result_name(r), newt_errmsg());
  comm_t *s = NULL;
  OKR(comm_shrink(c, &victim, 1, 0, NULL, 0, &s));
  if (s) {
    CHECKR(comm_size(s) == n - 1, "shrunk size %d", comm_size(s));
    check_allreduce_f32(s, rank, COMM_SUM, 4099, 0);
  }
  comm_free(s);
  comm_free(c);
  /* growth: a replacement joins a communicator from a fresh unique id */
  atomic_fetch_add(&sh->done, 1);
  comm_t *g = join(rank, n, sh->id2, &sh->id2_ready, 60000);
  if (g) check_allreduce_f32(g, rank, COMM_SUM, 4099, 0);
  comm_free(g);
  cudaFree(d);
  return ct_failures;
}

static int replacement(int rank, int n) {
  while (atomic_load(&sh->done) < n - 1) newt_sleep_ms(1);
  comm_t *g = join(rank, n, sh->id2, &sh->id2_ready, 60000);
  if (g) check_allreduce_f32(g, rank, COMM_SUM, 4099, 0);
  comm_free(g);
  return ct_failures;
}

static int gpus;

static void test_single_gpu(void) {
  T_CHECK_MSG(gpus >= 1, "no GPU visible: these checks need one (tests/gpu/run.sh on a GPU machine)");
  if (gpus < 1) return;
  T_CHECK(run_ranks(1, single_ops, -1, 300) == 0);
  T_CHECK(run_ranks(1, single_abort_cycles, -1, 300) == 0);
  T_CHECK(run_ranks(1, single_leaks, -1, 600) == 0);
}

static void test_multi_gpu(void) {
  if (gpus < 2) {
    fprintf(stderr, "  %d GPU visible: the multi-rank checks need 2 or more and did not run\n", gpus);
    return;
  }
  int n = gpus > 4 ? 4 : gpus;
  T_CHECK(run_ranks(n, multi_ops, -1, 300) == 0);
  T_CHECK(run_ranks(2, multi_abort, -1, 300) == 0);
  /* kill the last rank; the others shrink, then a replacement joins with a fresh id */
  memset(sh, 0, sizeof *sh);
  pid_t rep = fork();
  if (rep == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    _exit(replacement(n - 1, n) ? 1 : 0);
  }
  int bad = run_ranks(n, multi_kill, n - 1, 300);
  int st = 0;
  T_CHECK(newt_proc_wait(rep, 300000, &st) == NEWT_OK && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  T_CHECK(bad == 0);
}

int main(void) {
  sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  gpus = gpu_count();
  fprintf(stderr, "%d GPU(s) visible\n", gpus);
  T_RUN(test_single_gpu);
  T_RUN(test_multi_gpu);
  return T_DONE();
}
