/* newt bench allreduce|reduce_scatter|allgather: the collectives between N processes on
 * this machine, in the manner of nccl-tests.
 *
 *   newt bench allreduce --ranks 4 --min 4 --max 64M --backend shm
 *   newt bench allreduce --backend nccl --max 1G      (one rank per GPU; two on one GPU)
 *
 * Forks N ranks (loopback addresses on free ports; --backend shm gives every rank the
 * same host name, so they talk through shared memory; tcp gives each its own, so they
 * talk TCP; nccl runs the NCCL backend on device buffers, rank r on GPU r % GPUs, each
 * rank with an NCCL host identity of its own where ranks outnumber GPUs, so that NCCL
 * takes its network transport rather than refusing two ranks on one GPU; it fails at
 * once, saying so, where no GPU is visible). Rank 0 prints one JSON object per line:
 * first the time to build the
 * communicator (the first build, then a rebuild of the next generation by processes
 * already running, as after a failure), then one line per size, doubling from --min to
 * --max:
 *
 *   {"bench":"allreduce","backend":"shm","ranks":2,"bytes":67108864,"us":9876.5,
 *    "algbw":6.79,"busbw":6.79,"dtype":"f32","iters":5}
 *
 * us is the median over the timed iterations (after warm-up) of the slowest rank's
 * per-iteration time (nccl: as nccl-tests, the mean over `iters` operations issued back to
 * back on the stream and waited for together, the slowest rank's); algbw = bytes / time in
 * GB/s; busbw = algbw * 2(n-1)/n for allreduce, (n-1)/n for reduce-scatter and allgather.
 * For reduce-scatter and allgather `bytes` is the whole vector (n blocks). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "comm/comm.h"
#include "common/backend.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/log.h"
#include "common/opts.h"
#include "common/proc.h"
#include "common/sys.h"

#ifdef NEWT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

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
  const newt_backend *be; /* the backend's row (common/backend.h) */
  int nccl; /* device buffers: a GPU backend (NCCL) */
  int gpus;
} bench_args;

/* --backend: shm or tcp (the CPU backend over one transport: ranks on one host, or a host
 * each), or a backend of the table that computes on GPUs; NULL for any other word. */
static const newt_backend *bench_backend(const char *name) {
  if (strcmp(name, "shm") == 0 || strcmp(name, "tcp") == 0) return newt_backend_of(NEWT_BACKEND_CPU);
  const newt_backend *b = newt_backend_find(name);
  return newt_backend_uses_gpu(b) ? b : NULL;
}

/* What --backend takes, as a sentence lists it: "shm, tcp or nccl". */
static const char *bench_backends(char *out, size_t cap) {
  size_t at = (size_t)snprintf(out, cap, "shm, tcp");
  const newt_backend *b, *last = NULL;
  for (int i = 0; (b = newt_backend_at(i)) != NULL; i++)
    if (newt_backend_uses_gpu(b)) last = b;
  for (int i = 0; (b = newt_backend_at(i)) != NULL && at < cap; i++)
    if (newt_backend_uses_gpu(b)) at += (size_t)snprintf(out + at, cap - at, "%s%s", b == last ? " or " : ", ", b->name);
  return out;
}

/* Buffers where the backend computes: device memory for nccl. */
static void *buf_alloc(const bench_args *a, size_t n) {
#ifdef NEWT_HAVE_CUDA
  if (a->nccl) {
    void *p = NULL;
    if (cudaMalloc(&p, n ? n : 1) != cudaSuccess) return NULL;
    cudaMemset(p, 0, n ? n : 1);
    cudaStreamSynchronize(0);
    return p;
  }
#endif
  return malloc(n ? n : 1);
}

static void buf_free(const bench_args *a, void *p) {
#ifdef NEWT_HAVE_CUDA
  if (a->nccl) {
    if (p) cudaFree(p);
    return;
  }
#endif
  free(p);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The slowest rank's value (nanoseconds); scratch: 8 bytes where the backend computes. */
static newt_result_t max_over_ranks(comm_t *c, const bench_args *a, void *scratch, uint64_t v, uint64_t *out) {
  int64_t in = (int64_t)v, m = 0;
  if (!a->nccl) {
    NEWT_CHECK(comm_allreduce(c, &in, &m, 1, NEWT_I64, COMM_MAX));
    *out = (uint64_t)m;
    return NEWT_OK;
  }
#ifdef NEWT_HAVE_CUDA
  cudaMemcpy(scratch, &in, sizeof in, cudaMemcpyHostToDevice);
  cudaStreamSynchronize(0); /* the communicator's stream does not wait for the legacy one */
  NEWT_CHECK(comm_allreduce(c, scratch, scratch, 1, NEWT_I64, COMM_MAX));
  cudaMemcpy(&m, scratch, sizeof m, cudaMemcpyDeviceToHost);
#endif
  *out = (uint64_t)m;
  return NEWT_OK;
}

static newt_result_t create(const bench_args *a, int rank, uint64_t generation, void *scratch, comm_t **c,
                            uint64_t *ns) {
  comm_config cfg = {.backend = a->be->id, .rank = rank,
                     .size = (int)a->ranks, .addrs = a->addrs, .hosts = a->hosts, .job = a->job,
                     .generation = generation, .secret_len = sizeof a->secret, .timeout_ms = a->timeout_ms,
                     .device = a->gpus > 0 ? rank % a->gpus : 0};
  memcpy(cfg.secret, a->secret, sizeof a->secret);
  uint64_t t0 = newt_now_ns();
  NEWT_CHECK(comm_create(&cfg, c));
  return max_over_ranks(*c, a, scratch, newt_now_ns() - t0, ns);
}

/* nccl: `iters` operations issued back to back and waited for together; the mean. */
static newt_result_t run_batch(comm_t *c, const bench_args *a, const void *send, void *recv, size_t count, int iters,
                               uint64_t *mean_ns) {
  comm_req_t *reqs[64];
  uint64_t t0 = newt_now_ns();
  newt_result_t res = NEWT_OK;
  for (int done = 0; done < iters && res == NEWT_OK;) {
    int k = iters - done < 64 ? iters - done : 64, issued = 0;
    for (; issued < k && res == NEWT_OK; issued++) {
      if (strcmp(a->op, "allreduce") == 0) res = comm_allreduce_async(c, send, recv, count, a->dt, COMM_SUM, &reqs[issued]);
      else if (strcmp(a->op, "reduce_scatter") == 0)
        res = comm_reduce_scatter_async(c, send, recv, count, a->dt, COMM_SUM, &reqs[issued]);
      else res = comm_allgather_async(c, send, recv, count, a->dt, &reqs[issued]);
    }
    if (res != NEWT_OK) issued--;
    for (int i = 0; i < issued; i++) {
      newt_result_t w = comm_wait(reqs[i]);
      if (res == NEWT_OK) res = w;
    }
    done += k;
  }
  *mean_ns = (newt_now_ns() - t0) / (uint64_t)(iters > 0 ? iters : 1);
  return res;
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
  void *send = NULL, *recv = NULL, *scratch = NULL;
  uint64_t *times = NULL;
  newt_result_t res;
  if (a->nccl && a->ranks > a->gpus) { /* ranks share GPUs: each its own host to NCCL */
    char host[64];
    snprintf(host, sizeof host, "newt-bench-%d-rank%d", (int)getppid(), rank);
    setenv("NCCL_HOSTID", host, 1);
  }
#ifdef NEWT_HAVE_CUDA
  if (a->nccl) cudaSetDevice(rank % a->gpus);
#endif
  scratch = buf_alloc(a, 8);
  if (!scratch) {
    res = NEWT_ERR(NEWT_ERR_NOMEM, "no memory for 8 bytes on the device");
    goto fail;
  }
  NEWT_CHECK_GOTO(create(a, rank, 1, scratch, &c, &ns), res, fail);
  if (rank == 0)
    printf("{\"bench\":\"comm_create\",\"backend\":\"%s\",\"ranks\":%d,\"ms\":%.3f}\n", a->backend, n, ns / 1e6);
  /* the next generation, built by running processes (what a recovery does) */
  NEWT_CHECK_GOTO(comm_barrier(c), res, fail);
  comm_free(c);
  c = NULL;
  NEWT_CHECK_GOTO(create(a, rank, 2, scratch, &c, &ns), res, fail);
  if (rank == 0) {
    printf("{\"bench\":\"comm_rebuild\",\"backend\":\"%s\",\"ranks\":%d,\"ms\":%.3f}\n", a->backend, n, ns / 1e6);
    fflush(stdout);
  }
  size_t maxbytes = (size_t)a->max + (size_t)n * es;
  send = buf_alloc(a, maxbytes);
  recv = buf_alloc(a, maxbytes);
  times = malloc(sizeof *times * 1000);
  if (!send || !recv || !times) {
    res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for %zu-byte buffers%s", maxbytes, a->nccl ? " on the GPU" : "");
    goto fail;
  }
  if (!a->nccl) {
    for (size_t i = 0; i < maxbytes; i++) ((unsigned char *)send)[i] = (unsigned char)(i * 7 + 1) & 0x3f;
    memset(recv, 0, maxbytes);
  }
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
    uint64_t t;
    if (a->nccl) {
      NEWT_CHECK_GOTO(run_batch(c, a, send, recv, count, iters, &t), res, fail);
    } else {
      for (int i = 0; i < iters; i++) {
        uint64_t t0 = newt_now_ns();
        NEWT_CHECK_GOTO(run_op(c, a, send, recv, count), res, fail);
        times[i] = newt_now_ns() - t0;
      }
      qsort(times, (size_t)iters, sizeof *times, cmp_u64);
      t = times[iters / 2];
    }
    NEWT_CHECK_GOTO(max_over_ranks(c, a, scratch, t, &ns), res, fail);
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
  buf_free(a, send);
  buf_free(a, recv);
  buf_free(a, scratch);
  free(times);
  return 0;
fail:
  fprintf(stderr, "newt bench %s: rank %d: %s\n", a->op, rank, newt_errmsg());
  comm_free(c);
  buf_free(a, send);
  buf_free(a, recv);
  buf_free(a, scratch);
  free(times);
  return 1;
}

/* GPUs visible, asked in a child process (this one forks the ranks: it must not have
 * touched CUDA); -1 and why in `why` when none can be used. */
static int gpu_count(char *why, size_t cap) {
#ifdef NEWT_HAVE_CUDA
  int fds[2];
  if (pipe(fds) != 0) {
    snprintf(why, cap, "pipe: %s", strerror(errno));
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    int count_err = 0, n = comm_gpu_count(&count_err);
    cudaError_t e = (cudaError_t)count_err;
    char msg[256];
    if (e != cudaSuccess) snprintf(msg, sizeof msg, "E%s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
    else snprintf(msg, sizeof msg, "N%d", n);
    ssize_t w = write(fds[1], msg, strlen(msg));
    (void)w;
    _exit(0);
  }
  close(fds[1]);
  char buf[256] = "";
  ssize_t k = pid > 0 ? read(fds[0], buf, sizeof buf - 1) : -1;
  close(fds[0]);
  if (pid > 0) newt_proc_wait(pid, 60000, NULL);
  if (k > 0) buf[k] = '\0';
  if (k > 1 && buf[0] == 'N' && atoi(buf + 1) > 0) return atoi(buf + 1);
  snprintf(why, cap, "no GPU (cudaGetDeviceCount: %s)", k > 1 && buf[0] == 'E' ? buf + 1 : "no device");
  return -1;
#else
  snprintf(why, cap, "this newt is built without CUDA (rebuild with -DNEWT_CUDA=ON where CUDA and NCCL are installed)");
  return -1;
#endif
}

/* The ranks, a process each (killed with this one), waited for: 0 when every one exited 0;
 * else 1, the others killed at the first that did not. */
static int run_ranks(const bench_args *a) {
  fflush(stdout);
  pid_t pids[MAX_RANKS] = {0};
  pid_t parent = getpid();
  for (int r = 0; r < a->ranks; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      for (int q = 0; q < r; q++) kill(pids[q], SIGKILL);
      return 1;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      int code = bench_rank(a, r);
      fflush(stdout);
      _exit(code);
    }
    pids[r] = pid;
  }
  int failed = 0;
  for (int r = 0; r < a->ranks; r++) {
    int st = 0;
    if (newt_proc_wait(pids[r], -1, &st) != NEWT_OK || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      if (!failed)
        for (int q = 0; q < a->ranks; q++)
          if (q != r) kill(pids[q], SIGKILL);
      failed = 1;
    }
  }
  return failed ? 1 : 0;
}

int newt_bench_collective(const char *op, int argc, char **argv) {
  bench_args a = {.op = op, .backend = "shm", .dtype_name = "f32", .ranks = -1, .min = 4, .max = 64 << 20,
                  .iters = 0, .warmup = 3, .timeout_ms = 60000};
  newt_opt opts[] = {
      {"ranks", NEWT_OPT_INT, &a.ranks, "processes (ranks) to start, 1 to 64 (default 2; nccl: one per GPU, at least 2)"},
      {"min", NEWT_OPT_SIZE, &a.min, "smallest message in bytes"},
      {"max", NEWT_OPT_SIZE, &a.max, "largest message in bytes (sizes double from --min)"},
      {"backend", NEWT_OPT_STR, &a.backend,
       "shm (one host: shared memory), tcp (a host per rank: TCP) or nccl (the GPUs: the NCCL backend)"},
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
  a.be = bench_backend(a.backend);
  if (a.ranks == -1 && !newt_backend_uses_gpu(a.be)) a.ranks = 2;
  if (a.ranks != -1 && (a.ranks < 1 || a.ranks > MAX_RANKS)) {
    fprintf(stderr, "newt %s: --ranks %lld: expected 1 to %d\n", cmd, (long long)a.ranks, MAX_RANKS);
    return 2;
  }
  if (a.min < 1 || a.max < a.min) {
    fprintf(stderr, "newt %s: --min %lld --max %lld: expected 1 <= min <= max\n", cmd, (long long)a.min,
            (long long)a.max);
    return 2;
  }
  if (!a.be) {
    char names[128];
    fprintf(stderr, "newt %s: --backend \"%s\": expected %s\n", cmd, a.backend, bench_backends(names, sizeof names));
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
  a.nccl = newt_backend_uses_gpu(a.be);
  if (a.nccl) {
    char why[320];
    a.gpus = gpu_count(why, sizeof why);
    if (a.gpus < 1) {
      fprintf(stderr, "newt %s: --backend %s: %s\n", cmd, a.backend, why);
      return 1;
    }
    /* one rank per GPU; on one GPU two ranks: a collective of one rank moves nothing */
    if (a.ranks == -1) a.ranks = a.gpus > MAX_RANKS ? MAX_RANKS : a.gpus < 2 ? 2 : a.gpus;
    if (a.ranks > a.gpus)
      fprintf(stderr, "newt %s: %lld ranks on %d GPU(s): each rank is a host of its own to NCCL (NCCL_HOSTID), so "
                      "the figures are those of NCCL's network transport\n", cmd, (long long)a.ranks, a.gpus);
  }
  int tcp = strcmp(a.backend, "shm") != 0;
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
  return run_ranks(&a);
}
