/* newt bench allreduce|reduce_scatter|allgather: the CPU backend's collectives between
 * N processes on this machine, in the manner of nccl-tests.
 *
 *   newt bench allreduce --ranks 4 --min 4 --max 64M --backend shm
 *
 * Forks N ranks (loopback addresses on free ports; --backend shm gives every rank the
 * same host name, so they talk through shared memory; tcp gives each its own, so they
 * talk TCP). Rank 0 prints one JSON object per line: first the time to build the
 * communicator (the first build, then a rebuild of the next generation by processes
 * already running, as after a failure), then one line per size, doubling from --min to
 * --max:
 *
 *   {"bench":"allreduce","backend":"shm","ranks":2,"bytes":67108864,"us":9876.5,
 *    "algbw":6.79,"busbw":6.79,"dtype":"f32","iters":5}
 *
 * us is the median over the timed iterations (after warm-up) of the slowest rank's
 * per-iteration time; algbw = bytes / time in GB/s; busbw = algbw * 2(n-1)/n for
 * allreduce, (n-1)/n for reduce-scatter and allgather. For reduce-scatter and allgather
 * `bytes` is the whole vector (n blocks). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "comm/comm.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/log.h"
#include "common/opts.h"
#include "common/proc.h"
#include "common/sys.h"

#define MAX_RANKS 64

typedef struct bench_args {
  const char *op;
  const char *backend;
  const char *dtype_name;
  newt_dtype dt;
  int64_t ranks, min, max, iters, warmup, timeout_ms;
  char addr_buf[MAX_RANKS][64];
  char host_buf[MAX_RANKS][32];
  const char *addrs[MAX_RANKS];
  const char *hosts[MAX_RANKS];
  unsigned char secret[32];
  char job[48];
} bench_args;

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The slowest rank's value (nanoseconds). */
static newt_result_t max_over_ranks(comm_t *c, uint64_t v, uint64_t *out) {
  int64_t in = (int64_t)v, m = 0;
  NEWT_CHECK(comm_allreduce(c, &in, &m, 1, NEWT_I64, COMM_MAX));
  *out = (uint64_t)m;
  return NEWT_OK;
}

static newt_result_t create(const bench_args *a, int rank, uint64_t generation, comm_t **c, uint64_t *ns) {
  comm_config cfg = {.backend = COMM_BACKEND_CPU, .rank = rank, .size = (int)a->ranks, .addrs = a->addrs,
                     .hosts = a->hosts, .job = a->job, .generation = generation, .secret_len = sizeof a->secret,
                     .timeout_ms = a->timeout_ms};
  memcpy(cfg.secret, a->secret, sizeof a->secret);
  uint64_t t0 = newt_now_ns();
  NEWT_CHECK(comm_create(&cfg, c));
  return max_over_ranks(*c, newt_now_ns() - t0, ns);
}

static newt_result_t run_op(comm_t *c, const bench_args *a, const void *send, void *recv, size_t count) {
  if (strcmp(a->op, "allreduce") == 0) return comm_allreduce(c, send, recv, count, a->dt, COMM_SUM);
  if (strcmp(a->op, "reduce_scatter") == 0) return comm_reduce_scatter(c, send, recv, count, a->dt, COMM_SUM);
  return comm_allgather(c, send, recv, count, a->dt);
}

static int bench_rank(const bench_args *a, int rank) {
  char name[32];
  snprintf(name, sizeof name, "bench-rank%d", rank);
  newt_log_set_name(name);
  int n = (int)a->ranks;
  size_t es = newt_dtype_size(a->dt);
  comm_t *c = NULL;
  uint64_t ns;
  void *send = NULL, *recv = NULL;
  uint64_t *times = NULL;
  newt_result_t res;
  NEWT_CHECK_GOTO(create(a, rank, 1, &c, &ns), res, fail);
  if (rank == 0)
    printf("{\"bench\":\"comm_create\",\"backend\":\"%s\",\"ranks\":%d,\"ms\":%.3f}\n", a->backend, n, ns / 1e6);
  /* the next generation, built by running processes (what a recovery does) */
  NEWT_CHECK_GOTO(comm_barrier(c), res, fail);
  comm_free(c);
  c = NULL;
  NEWT_CHECK_GOTO(create(a, rank, 2, &c, &ns), res, fail);
  if (rank == 0) {
    printf("{\"bench\":\"comm_rebuild\",\"backend\":\"%s\",\"ranks\":%d,\"ms\":%.3f}\n", a->backend, n, ns / 1e6);
    fflush(stdout);
  }
  size_t maxbytes = (size_t)a->max + (size_t)n * es;
  send = malloc(maxbytes);
  recv = malloc(maxbytes);
  times = malloc(sizeof *times * 1000);
  if (!send || !recv || !times) {
    res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for %zu-byte buffers", maxbytes);
    goto fail;
  }
  for (size_t i = 0; i < maxbytes; i++) ((unsigned char *)send)[i] = (unsigned char)(i * 7 + 1) & 0x3f;
  memset(recv, 0, maxbytes);
  int per_rank = strcmp(a->op, "allreduce") != 0;
  double factor = n > 1 ? (per_rank ? (double)(n - 1) / n : 2.0 * (n - 1) / n) : 0;
  for (int64_t bytes = a->min; bytes <= a->max; bytes *= 2) {
    size_t count = (size_t)bytes / es / (per_rank ? (size_t)n : 1);
    if (count == 0) count = 1;
    size_t total = count * es * (per_rank ? (size_t)n : 1);
    int iters = (int)a->iters;
    if (iters <= 0) {
      int64_t k = ((int64_t)1 << 29) / (int64_t)total;
      iters = k < 10 ? 10 : k > 1000 ? 1000 : (int)k;
    }
    if (iters > 1000) iters = 1000;
    for (int i = 0; i < a->warmup; i++) NEWT_CHECK_GOTO(run_op(c, a, send, recv, count), res, fail);
    for (int i = 0; i < iters; i++) {
      uint64_t t0 = newt_now_ns();
      NEWT_CHECK_GOTO(run_op(c, a, send, recv, count), res, fail);
      times[i] = newt_now_ns() - t0;
    }
    qsort(times, (size_t)iters, sizeof *times, cmp_u64);
    NEWT_CHECK_GOTO(max_over_ranks(c, times[iters / 2], &ns), res, fail);
    if (rank == 0) {
      double us = ns / 1e3, algbw = (double)total / (ns * 1e-9) / 1e9;
      printf("{\"bench\":\"%s\",\"backend\":\"%s\",\"ranks\":%d,\"bytes\":%zu,\"us\":%.2f,\"algbw\":%.3f,"
             "\"busbw\":%.3f,\"dtype\":\"%s\",\"iters\":%d}\n",
             a->op, a->backend, n, total, us, algbw, algbw * factor, a->dtype_name, iters);
      fflush(stdout);
    }
    if (bytes > INT64_MAX / 2) break;
  }
  NEWT_CHECK_GOTO(comm_barrier(c), res, fail);
  comm_free(c);
  free(send);
  free(recv);
  free(times);
  return 0;
fail:
  fprintf(stderr, "newt bench %s: rank %d: %s\n", a->op, rank, newt_errmsg());
  comm_free(c);
  free(send);
  free(recv);
  free(times);
  return 1;
}

int newt_bench_collective(const char *op, int argc, char **argv) {
  bench_args a = {.op = op, .backend = "shm", .dtype_name = "f32", .ranks = 2, .min = 4, .max = 64 << 20,
                  .iters = 0, .warmup = 3, .timeout_ms = 60000};
  newt_opt opts[] = {
      {"ranks", NEWT_OPT_INT, &a.ranks, "processes (ranks) to start, 1 to 64"},
      {"min", NEWT_OPT_SIZE, &a.min, "smallest message in bytes"},
      {"max", NEWT_OPT_SIZE, &a.max, "largest message in bytes (sizes double from --min)"},
      {"backend", NEWT_OPT_STR, &a.backend, "shm (one host: shared memory) or tcp (a host per rank: TCP)"},
      {"dtype", NEWT_OPT_STR, &a.dtype_name, "element type: f32 or bf16"},
      {"iters", NEWT_OPT_INT, &a.iters, "timed iterations per size (0: 2^29/bytes, 10 to 1000)"},
      {"warmup", NEWT_OPT_INT, &a.warmup, "untimed iterations per size"},
      {"timeout-ms", NEWT_OPT_INT, &a.timeout_ms, "communicator build deadline and no-progress timeout"},
      NEWT_OPT_END,
  };
  char cmd[64];
  snprintf(cmd, sizeof cmd, "bench %s", op);
  int rc = newt_opts_parse(cmd, "[flags]", opts, argc, argv, NULL, 0, NULL);
  if (rc != NEWT_OK) {
    if (rc == NEWT_ERR_ABORTED) return 0;
    fprintf(stderr, "%s\n", newt_errmsg());
    return 2;
  }
  int t = newt_dtype_from_name(a.dtype_name);
  if (a.ranks < 1 || a.ranks > MAX_RANKS) {
    fprintf(stderr, "newt %s: --ranks %lld: expected 1 to %d\n", cmd, (long long)a.ranks, MAX_RANKS);
    return 2;
  }
  if (a.min < 1 || a.max < a.min) {
    fprintf(stderr, "newt %s: --min %lld --max %lld: expected 1 <= min <= max\n", cmd, (long long)a.min,
            (long long)a.max);
    return 2;
  }
  if (strcmp(a.backend, "shm") != 0 && strcmp(a.backend, "tcp") != 0) {
    fprintf(stderr, "newt %s: --backend \"%s\": expected shm or tcp\n", cmd, a.backend);
    return 2;
  }
  if (t != NEWT_F32 && t != NEWT_BF16) {
    fprintf(stderr, "newt %s: --dtype \"%s\": expected f32 or bf16\n", cmd, a.dtype_name);
    return 2;
  }
  if (a.warmup < 0 || a.timeout_ms <= 0) {
    fprintf(stderr, "newt %s: --warmup must be >= 0 and --timeout-ms > 0\n", cmd);
    return 2;
  }
  a.dt = (newt_dtype)t;
  int tcp = strcmp(a.backend, "tcp") == 0;
  for (int r = 0; r < a.ranks; r++) {
    int port;
    if (newt_net_free_port(&port) != NEWT_OK) {
      fprintf(stderr, "newt %s: %s\n", cmd, newt_errmsg());
      return 1;
    }
    snprintf(a.addr_buf[r], sizeof a.addr_buf[r], "127.0.0.1:%d", port);
    snprintf(a.host_buf[r], sizeof a.host_buf[r], tcp ? "host%d" : "localhost", r);
    a.addrs[r] = a.addr_buf[r];
    a.hosts[r] = a.host_buf[r];
  }
  snprintf(a.job, sizeof a.job, "bench%d", (int)getpid());
  if (newt_random_bytes(a.secret, sizeof a.secret) != NEWT_OK) {
    fprintf(stderr, "newt %s: %s\n", cmd, newt_errmsg());
    return 1;
  }
  fflush(stdout);
  pid_t pids[MAX_RANKS] = {0};
  pid_t parent = getpid();
  for (int r = 0; r < a.ranks; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      for (int q = 0; q < r; q++) kill(pids[q], SIGKILL);
      return 1;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      int code = bench_rank(&a, r);
      fflush(stdout);
      _exit(code);
    }
    pids[r] = pid;
  }
  int failed = 0;
  for (int r = 0; r < a.ranks; r++) {
    int st = 0;
    if (newt_proc_wait(pids[r], -1, &st) != NEWT_OK || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      if (!failed)
        for (int q = 0; q < a.ranks; q++)
          if (q != r) kill(pids[q], SIGKILL);
      failed = 1;
    }
  }
  return failed ? 1 : 0;
}
