/* newt bench train: training throughput of the model, on the CPU in one process or as a
 * parallel layout of processes on this host, or on GPUs (one per rank).
 *
 *   newt bench train --preset tiny|small|gpt2-124m --threads T [--batch B] [--micro-batch M]
 *                    [--steps N] [--warmup W] [--tp TP --pp PP --dp DP --zero Z]
 *                    [--backend cpu|cuda] [--device D]
 *
 * Runs W untimed steps, then N timed ones on a fixed random batch of B sequences of the
 * preset's ctx, and prints one JSON line with the median step:
 * {"bench":"train","preset":...,"threads":...,"tp":...,"pp":...,"dp":...,"zero":...,"ranks":...,
 *  "batch":...,"micro_batch":...,"seq_len":...,"params":...,"tokens_per_s":...,"ms_per_step":...,
 *  "gflops":...,"state_bytes":...,"act_bytes":...,"blas_core":...}
 * gflops counts 6 FLOPs per parameter per token plus the causal half of attention
 * (model_flops_per_token), for the whole layout. With tp * pp * dp = 1 and zero 0 it times the
 * single-process trainer (model/train.h); otherwise it forks tp * pp * dp processes, each a
 * rank of the parallel trainer (model/parallel.h) with T threads, connected by the CPU
 * backend over shared memory, and rank 0 reports (every step ends in a collective over all
 * ranks, so their step times agree). state_bytes and act_bytes are rank 0's parameters,
 * gradients and moments, and its activations. The default micro-batch is the data-parallel
 * rank's share of the batch, split in pp micro-batches when pp > 1. blas_core (CPU only): the
 * OpenBLAS core the GEMMs ran on (model/ops.h: newt asks for the CPU's own where OpenBLAS
 * does not know it).
 *
 * --backend cuda times the parallel trainer on GPUs (model/dev.h): with one rank in this
 * process, without communicators, on GPU --device; with more, rank r is a forked process on
 * GPU --device + r, its communicators NCCL on its device's stream (as a worker builds them).
 * Each step ends with model_dev_sync, so its time is the GPU's work, not its enqueueing. The
 * line adds "backend":"cuda", "device" (rank 0's model_dev_name) and "mfu": the achieved
 * FLOP/s (the gflops above) over the ranks' model_dev_peak_flops, null when the peak is
 * unknown. The defaults fit a GPU: micro-batch 8 (a GPU's memory holds gpt2-124m's
 * activations for 8 sequences of 1024 easily) and a batch of 4 micro-batches per
 * data-parallel rank (32 sequences with dp 1). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "comm/comm.h"
#include "common/clock.h"
#include "common/opts.h"
#include "common/proc.h"
#include "common/sys.h"
#include "job/spec.h"
#include "model/dev.h"
#include "model/ops.h"
#include "model/parallel.h"
#include "model/rng.h"
#include "model/train.h"

#include <xxhash.h>

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median_ms(double *ms, int64_t n) {
  qsort(ms, (size_t)n, sizeof *ms, cmp_double);
  return n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
}

/* A fixed random global batch. */
static void random_batch(const model_train_config *cfg, int32_t *x, int32_t *y) {
  size_t n = (size_t)cfg->batch * cfg->seq_len;
  for (size_t i = 0; i < n; i++) {
    x[i] = (int32_t)(model_rng_u64(7, 1, i) % (uint64_t)cfg->model.vocab);
    y[i] = (int32_t)(model_rng_u64(7, 2, i) % (uint64_t)cfg->model.vocab);
  }
}

typedef struct bench_line {
  const char *preset;
  int threads;
  model_par_config pc;
  const model_train_config *cfg;
  size_t params, state_bytes, act_bytes;
  double ms; /* median step */
  int gpu;            /* --backend cuda: the first GPU (rank r trains on gpu + r); -1: the CPU */
  const char *device; /* --backend cuda: rank 0's model_dev_name; NULL on the CPU */
  double peak;        /* --backend cuda: rank 0's model_dev_peak_flops (0: unknown) */
  int64_t verify_every; /* newt bench verify: the check's interval (0: newt bench train) */
  double check_ms;      /* ... the median check */
  size_t repl_bytes;    /* ... rank 0's replicated bytes (fingerprinted) */
} bench_line;

/* newt bench verify's line: the step, the check, and what the check costs a step at the
 * interval. */
static void print_verify(const bench_line *b) {
  double per = b->check_ms / (double)b->verify_every;
  printf("{\"bench\":\"verify\",\"preset\":\"%s\",\"threads\":%d,\"dp\":%d,\"zero\":%d,\"batch\":%d,"
         "\"micro_batch\":%d,\"params\":%zu,\"state_bytes\":%zu,\"replicated_bytes\":%zu,\"every\":%lld,"
         "\"ms_per_step\":%.2f,\"check_ms\":%.3f,\"cost_ms_per_step\":%.4f,\"cost_pct\":%.3f,\"blas_core\":\"%s\"}\n",
         b->preset, b->threads, b->pc.dp, b->pc.zero, b->cfg->batch, b->cfg->micro_batch, b->params, b->state_bytes,
         b->repl_bytes, (long long)b->verify_every, b->ms, b->check_ms, per, 100.0 * per / b->ms, model_blas_core());
  fflush(stdout);
}

/* The work of one check of the replicas (worker/verify.c) on this rank's state, as a worker
 * does it for the pieces the GPT declares: XXH3 of each part its data-parallel group holds
 * alike (ZeRO 0: every part; ZeRO 1/2: the full parameters; ZeRO 3: none), a copy of every
 * part into the verified copy, the 16-byte all-gather of the fingerprints. Its ms. */
static double check_once(const model_par_piece *pc, size_t n, int zero, char *copy, comm_t *world, size_t *repl) {
  double t0 = newt_now_s();
  uint64_t h = 0;
  size_t off = 0;
  *repl = 0;
  for (size_t i = 0; i < n; i++) {
    size_t b = (size_t)newt_slice_numel(&pc[i].slice) * sizeof(float);
    if (zero == 0 || pc[i].derived) {
      uint64_t kv[2] = {h, XXH3_64bits(pc[i].data, b)};
      h = XXH3_64bits(kv, sizeof kv);
      *repl += b;
    }
    memcpy(copy + off, pc[i].data, b);
    off += b;
  }
  uint64_t mine[2] = {h, n}, *all = malloc((size_t)comm_size(world) * sizeof mine);
  if (!all || comm_allgather(world, mine, all, sizeof mine, NEWT_U8) != NEWT_OK) h = 0;
  free(all);
  return (newt_now_s() - t0) * 1e3;
}

static void print_line(const bench_line *b) {
  const model_train_config *c = b->cfg;
  double tps = (double)c->batch * c->seq_len / (b->ms / 1e3);
  double flops = model_flops_per_token(&c->model, c->seq_len) * tps;
  printf("{\"bench\":\"train\",\"preset\":\"%s\",\"threads\":%d,\"tp\":%d,\"pp\":%d,\"dp\":%d,\"zero\":%d,"
         "\"ranks\":%d,\"batch\":%d,\"micro_batch\":%d,\"seq_len\":%d,\"params\":%zu,\"tokens_per_s\":%.0f,"
         "\"ms_per_step\":%.2f,\"gflops\":%.2f,\"state_bytes\":%zu,\"act_bytes\":%zu",
         b->preset, b->threads, b->pc.tp, b->pc.pp, b->pc.dp, b->pc.zero, b->pc.tp * b->pc.pp * b->pc.dp, c->batch,
         c->micro_batch, c->seq_len, b->params, tps, b->ms, flops / 1e9, b->state_bytes, b->act_bytes);
  if (!b->device) printf(",\"blas_core\":\"%s\"", model_blas_core());
  if (b->device) {
    printf(",\"backend\":\"cuda\",\"device\":\"");
    for (const char *q = b->device; *q; q++) /* a name is plain text; keep the line JSON anyway */
      if (*q >= 0x20 && *q < 0x7f && *q != '"' && *q != '\\') putchar(*q);
    if (b->peak > 0) /* every rank has a GPU of rank 0's kind */
      printf("\",\"mfu\":%.4f", flops / (b->peak * b->pc.tp * b->pc.pp * b->pc.dp));
    else
      printf("\",\"mfu\":null");
  }
  printf("}\n");
  fflush(stdout);
}

static int bench_single(bench_line *b, int64_t warmup, int64_t steps) {
  const model_train_config *cfg = b->cfg;
  model_trainer tr;
  if (model_trainer_init(&tr, cfg) != NEWT_OK) {
    fprintf(stderr, "newt bench train: %s\n", newt_errmsg());
    return 1;
  }
  size_t n = (size_t)cfg->batch * cfg->seq_len;
  int32_t *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
  double *ms = malloc((size_t)steps * sizeof *ms);
  if (!x || !y || !ms) {
    fprintf(stderr, "newt bench train: out of memory\n");
    return 1;
  }
  random_batch(cfg, x, y);
  model_step_info info;
  for (int64_t s = 0; s < warmup + steps; s++) {
    model_trainer_step(&tr, x, y, cfg->batch, &info);
    if (s >= warmup) ms[s - warmup] = info.ms;
    fprintf(stderr, "step %lld loss %.4f %.1f ms\n", (long long)s + 1, info.loss, info.ms);
  }
  b->ms = median_ms(ms, steps);
  b->params = tr.gpt.layout.nparams;
  b->state_bytes = 4 * tr.gpt.layout.total * sizeof(float);
  b->act_bytes = tr.acts.bytes + tr.scratch.bytes;
  print_line(b);
  free(x);
  free(y);
  free(ms);
  model_trainer_free(&tr);
  return 0;
}

/* --backend cuda, one rank: the parallel trainer on GPU `device`, every step synced. */
static int bench_cuda(bench_line *b, int device, int64_t warmup, int64_t steps) {
  const model_train_config *cfg = b->cfg;
  model_dev *dev = NULL;
  model_par p;
  int have_p = 0, rc = 1;
  size_t n = (size_t)cfg->batch * cfg->seq_len;
  int32_t *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
  double *ms = malloc((size_t)steps * sizeof *ms);
  if (!x || !y || !ms) {
    fprintf(stderr, "newt bench train: out of memory\n");
    goto out;
  }
  if (model_dev_open(MODEL_DEV_CUDA, device, &dev) != NEWT_OK) {
    fprintf(stderr, "newt bench train: --device %d: %s\n", device, newt_errmsg());
    goto out;
  }
  model_par_config pc = b->pc;
  pc.dev = dev;
  if (model_par_init(&p, cfg, &pc) != NEWT_OK) {
    fprintf(stderr, "newt bench train: %s: %s\n", model_dev_name(dev), newt_errmsg());
    goto out;
  }
  have_p = 1;
  random_batch(cfg, x, y);
  model_step_info info;
  for (int64_t s = 0; s < warmup + steps; s++) {
    double t0 = newt_now_s();
    /* one rank: no communicators (model_par_step takes NULL); the sync makes the time the GPU's */
    if (model_par_step(&p, NULL, x, y, cfg->batch, &info) != NEWT_OK || model_dev_sync(dev) != NEWT_OK) {
      fprintf(stderr, "newt bench train: %s, step %lld: %s\n", model_dev_name(dev), (long long)s + 1, newt_errmsg());
      goto out;
    }
    double t = (newt_now_s() - t0) * 1e3;
    if (s >= warmup) ms[s - warmup] = t;
    fprintf(stderr, "step %lld loss %.4f %.1f ms\n", (long long)s + 1, info.loss, t);
  }
  b->ms = median_ms(ms, steps);
  b->params = p.global.nparams;
  model_par_memory(&p, &b->state_bytes, &b->act_bytes);
  b->device = model_dev_name(dev);
  b->peak = model_dev_peak_flops(dev);
  print_line(b);
  rc = 0;
out:
  if (have_p) model_par_free(&p);
  if (dev) model_dev_close(dev);
  free(x);
  free(y);
  free(ms);
  return rc;
}

#define BENCH_MAX_RANKS 64

typedef struct bench_world {
  int n;
  char addr[BENCH_MAX_RANKS][32];
  const char *addrs[BENCH_MAX_RANKS], *hosts[BENCH_MAX_RANKS];
  unsigned char secret[32];
  char job[32];
} bench_world;

/* One rank of the layout (a forked process): returns its exit status. */
static int bench_rank(bench_line *b, const bench_world *w, int rank, int64_t warmup, int64_t steps) {
  const model_train_config *cfg = b->cfg;
  comm_config cc = {.backend = COMM_BACKEND_CPU, .rank = rank, .size = w->n, .addrs = w->addrs, .hosts = w->hosts,
                    .job = w->job, .generation = 1, .secret_len = sizeof w->secret, .timeout_ms = 120000};
  memcpy(cc.secret, w->secret, sizeof w->secret);
  model_dev *dev = NULL;
  if (b->gpu >= 0) { /* GPU gpu + rank; NCCL on its stream: collectives follow the kernels */
    if (model_dev_open(MODEL_DEV_CUDA, b->gpu + rank, &dev) != NEWT_OK) {
      fprintf(stderr, "newt bench train: rank %d: --device %d + rank: %s\n", rank, b->gpu, newt_errmsg());
      return 1;
    }
    cc.backend = COMM_BACKEND_NCCL;
    cc.device = b->gpu + rank;
    cc.stream = model_dev_stream(dev);
  }
  comm_t *world = NULL;
  model_par_comms comms = {0};
  model_par p;
  int have_p = 0, rc = 1;
  model_par_piece *pieces = NULL; /* newt bench verify's */
  size_t npieces = 0, total = 0, repl = 0;
  char *copy = NULL;
  double *check = NULL;
  model_par_config pc;
  model_par_config_from_rank(&pc, b->pc.tp, b->pc.pp, b->pc.dp, b->pc.zero, rank);
  pc.dev = dev;
  size_t n = (size_t)cfg->batch * cfg->seq_len;
  int32_t *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
  double *ms = malloc((size_t)steps * sizeof *ms);
  if (!x || !y || !ms || comm_create(&cc, &world) != NEWT_OK || model_par_comms_split(world, &pc, &comms) != NEWT_OK ||
      model_par_init(&p, cfg, &pc) != NEWT_OK) {
    fprintf(stderr, "newt bench train: rank %d: %s\n", rank, newt_errmsg());
    goto out;
  }
  have_p = 1;
  random_batch(cfg, x, y);
  int64_t first, count;
  model_batch_slice(cfg->batch, pc.dp_rank, pc.dp, &first, &count);
  size_t at = (size_t)first * cfg->seq_len;
  model_step_info info;
  /* newt bench verify: the check after every step, timed apart from it */
  if (b->verify_every) {
    check = malloc((size_t)steps * sizeof *check);
    if (!check || model_par_pieces(&p, &pieces, &npieces) != NEWT_OK) goto out;
    for (size_t i = 0; i < npieces; i++) total += (size_t)newt_slice_numel(&pieces[i].slice) * sizeof(float);
    if (!(copy = malloc(total ? total : 1))) goto out;
  }
  for (int64_t s = 0; s < warmup + steps; s++) {
    double t0 = newt_now_s();
    if (model_par_step(&p, &comms, x + at, y + at, (int)count, &info) != NEWT_OK ||
        (dev && model_dev_sync(dev) != NEWT_OK)) {
      fprintf(stderr, "newt bench train: rank %d, step %lld: %s\n", rank, (long long)s + 1, newt_errmsg());
      goto out;
    }
    double t = dev ? (newt_now_s() - t0) * 1e3 : info.ms; /* a GPU's step: to its sync */
    if (s >= warmup) ms[s - warmup] = t;
    if (copy) {
      double c = check_once(pieces, npieces, pc.zero, copy, world, &repl);
      if (s >= warmup) check[s - warmup] = c;
    }
    if (rank == 0) fprintf(stderr, "step %lld loss %.4f %.1f ms\n", (long long)s + 1, info.loss, t);
  }
  if (rank == 0) {
    b->ms = median_ms(ms, steps);
    b->params = p.global.nparams;
    model_par_memory(&p, &b->state_bytes, &b->act_bytes);
    if (copy) {
      b->check_ms = median_ms(check, steps);
      b->repl_bytes = repl;
      b->state_bytes = total;
      print_verify(b);
      rc = 0;
      goto out;
    }
    if (dev) {
      b->device = model_dev_name(dev);
      b->peak = model_dev_peak_flops(dev);
    }
    print_line(b);
  }
  rc = 0;
out:
  free(pieces);
  free(copy);
  free(check);
  if (have_p) model_par_free(&p);
  model_par_comms_free(&comms);
  comm_free(world);
  if (dev) model_dev_close(dev);
  free(x);
  free(y);
  free(ms);
  return rc;
}

/* Forks the ranks (before any thread exists in this process) and waits for them. */
static int bench_parallel(bench_line *b, int64_t warmup, int64_t steps) {
  bench_world w = {.n = b->pc.tp * b->pc.pp * b->pc.dp};
  if (w.n > BENCH_MAX_RANKS) {
    fprintf(stderr, "newt bench train: tp * pp * dp = %d ranks, at most %d on one host\n", w.n, BENCH_MAX_RANKS);
    return 2;
  }
  for (int r = 0; r < w.n; r++) {
    int port = 0;
    for (int tries = 0; tries < 100; tries++) { /* distinct ports */
      int dup = 0;
      if (newt_net_free_port(&port) != NEWT_OK) break;
      for (int q = 0; q < r; q++) dup |= atoi(strchr(w.addr[q], ':') + 1) == port;
      if (!dup) break;
    }
    snprintf(w.addr[r], sizeof w.addr[r], "127.0.0.1:%d", port);
    w.addrs[r] = w.addr[r];
    w.hosts[r] = "localhost";
  }
  if (newt_random_bytes(w.secret, sizeof w.secret) != NEWT_OK) {
    fprintf(stderr, "newt bench train: %s\n", newt_errmsg());
    return 1;
  }
  snprintf(w.job, sizeof w.job, "bench%d", (int)getpid());
  pid_t pids[BENCH_MAX_RANKS];
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < w.n; r++) {
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("newt bench train: fork");
      for (int q = 0; q < r; q++) kill(pids[q], SIGKILL);
      return 1;
    }
    if (pids[r] == 0) _exit(bench_rank(b, &w, r, warmup, steps));
  }
  /* the ranks in the order they end: the first that fails takes the others with it (they
     would wait for it in a collective until their timeout) */
  int bad = 0, left = w.n;
  double deadline = newt_now_s() + 3600;
  while (left > 0) {
    int st = 0;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    int r = 0;
    while (pid > 0 && r < w.n && pids[r] != pid) r++;
    if (pid > 0 && r < w.n) {
      pids[r] = 0;
      left--;
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad++;
    } else if (pid < 0 || newt_now_s() > deadline) {
      bad++;
      break;
    } else {
      usleep(20000);
      continue;
    }
    if (bad)
      for (int q = 0; q < w.n; q++)
        if (pids[q] > 0) kill(pids[q], SIGKILL);
  }
  for (int q = 0; q < w.n; q++) /* after a timeout: none left behind */
    if (pids[q] > 0) {
      kill(pids[q], SIGKILL);
      waitpid(pids[q], NULL, 0);
    }
  return bad ? 1 : 0;
}

int newt_bench_train(int argc, char **argv) {
  const char *preset = "tiny", *overrides = NULL, *backend = "cpu";
  int64_t threads = 1, batch = 0, micro = 0, steps = 10, warmup = 3, tp = 1, pp = 1, dp = 1, zero = 0, device = 0;
  newt_opt opts[] = {
      {"preset", NEWT_OPT_STR, &preset, "model preset: tiny, small or gpt2-124m"},
      {"model", NEWT_OPT_STR, &overrides, "overrides of the preset: layers=2,..."},
      {"threads", NEWT_OPT_INT, &threads, "CPU threads (per rank)"},
      {"batch", NEWT_OPT_INT, &batch,
       "sequences per step (the global batch; 0: 8, with --backend cuda 4 micro-batches per data-parallel rank)"},
      {"micro-batch", NEWT_OPT_INT, &micro,
       "sequences per forward/backward (0: the data-parallel share of the batch, over pp when pp > 1; "
       "with --backend cuda 8, or the batch when smaller)"},
      {"steps", NEWT_OPT_INT, &steps, "timed steps"},
      {"warmup", NEWT_OPT_INT, &warmup, "untimed steps first"},
      {"tp", NEWT_OPT_INT, &tp, "tensor-parallel ranks"},
      {"pp", NEWT_OPT_INT, &pp, "pipeline stages"},
      {"dp", NEWT_OPT_INT, &dp, "data-parallel ranks"},
      {"zero", NEWT_OPT_INT, &zero, "ZeRO stage 0..3"},
      {"backend", NEWT_OPT_STR, &backend, "cpu, or cuda: the parallel trainer on GPUs (one per rank, NCCL between them)"},
      {"device", NEWT_OPT_INT, &device, "with --backend cuda: the GPU (rank r of a layout trains on --device + r)"},
      NEWT_OPT_END,
  };
  int rc = newt_opts_exit(newt_opts_parse("bench train", "[flags]", opts, argc, argv, NULL, 0, NULL));
  if (rc >= 0) return rc;
  model_train_config cfg;
  if (model_train_defaults(&cfg, preset, warmup + steps) != NEWT_OK ||
      model_config_override(&cfg.model, overrides) != NEWT_OK) {
    fprintf(stderr, "newt bench train: %s\n", newt_errmsg());
    return 2;
  }
  int cuda = strcmp(backend, "cuda") == 0;
  if (!cuda && strcmp(backend, "cpu") != 0) {
    fprintf(stderr, "newt bench train: --backend: cpu or cuda, not \"%s\"\n", backend);
    return 2;
  }
  if (!cuda && device != 0) {
    fprintf(stderr, "newt bench train: --device goes with --backend cuda\n");
    return 2;
  }
  if (cuda && (device < 0 || device > 1023)) {
    fprintf(stderr, "newt bench train: --device: a GPU ordinal >= 0, got %lld\n", (long long)device);
    return 2;
  }
  if (batch == 0) batch = cuda ? 4 * (micro ? micro : 8) * dp : 8;
  if (cuda && micro == 0) {
    int64_t per = (batch + dp - 1) / dp; /* a data-parallel rank's share */
    micro = per < 8 ? per : 8;
  }
  if (threads < 1 || batch < 1 || batch > 1 << 16 || micro < 0 || steps < 1 || warmup < 0) {
    fprintf(stderr, "newt bench train: --threads, --batch and --steps must be >= 1\n");
    return 2;
  }
  if (tp < 1 || pp < 1 || dp < 1 || tp > 64 || pp > 64 || dp > 64 || zero < 0 || zero > 3) {
    fprintf(stderr, "newt bench train: --tp, --pp and --dp must be in [1, 64], --zero in [0, 3]\n");
    return 2;
  }
  cfg.threads = (int)threads;
  cfg.batch = (int)batch;
  cfg.seq_len = (int)cfg.model.ctx; /* after --model: the overridden ctx */
  int64_t share = (batch + dp - 1) / dp;
  cfg.micro_batch = micro ? (int)micro : (int)(pp > 1 && share >= pp ? share / pp : share);
  bench_line b = {.preset = preset, .threads = (int)threads, .cfg = &cfg, .gpu = cuda ? (int)device : -1};
  model_par_config_from_rank(&b.pc, (int)tp, (int)pp, (int)dp, (int)zero, 0);
  if (model_par_config_check(&b.pc, &cfg) != NEWT_OK) {
    fprintf(stderr, "newt bench train: %s\n", newt_errmsg());
    return 2;
  }
  if (cuda && tp * pp * dp == 1) return bench_cuda(&b, (int)device, warmup, steps);
  if (tp * pp * dp == 1 && zero == 0) return bench_single(&b, warmup, steps);
  return bench_parallel(&b, warmup, steps);
}

/* newt bench verify: what the check of the replicas (docs/elastic.md, "Replicas that
 * disagree") costs a step, at the interval given (spec.fault.verify_every's default), for a
 * data-parallel layout of the preset: the ranks train as newt bench train's do, and after
 * every step each does a check's work (worker/verify.c: XXH3 of its replicated parts, a copy
 * of its whole state, the 16-byte all-gather), timed apart. One JSON line: the median step,
 * the median check, and the check over the interval against the step (cost_pct).
 *
 *   newt bench verify --preset tiny|small [--dp 4] [--zero 0] [--every 10] [--batch 16]
 *                     [--steps 20] [--threads 1] */
int newt_bench_verify(int argc, char **argv) {
  const char *preset = "tiny";
  int64_t threads = 1, batch = 16, micro = 0, steps = 20, warmup = 3, dp = 4, zero = 0, every = SPEC_VERIFY_EVERY;
  newt_opt opts[] = {
      {"preset", NEWT_OPT_STR, &preset, "model preset: tiny, small or gpt2-124m"},
      {"threads", NEWT_OPT_INT, &threads, "CPU threads per rank"},
      {"batch", NEWT_OPT_INT, &batch, "sequences per step (the global batch)"},
      {"micro-batch", NEWT_OPT_INT, &micro, "sequences per forward/backward (0: the rank's share)"},
      {"steps", NEWT_OPT_INT, &steps, "timed steps (each followed by a timed check)"},
      {"warmup", NEWT_OPT_INT, &warmup, "untimed steps first"},
      {"dp", NEWT_OPT_INT, &dp, "data-parallel ranks (at least 2: one compares with the others)"},
      {"zero", NEWT_OPT_INT, &zero, "ZeRO stage 0..3"},
      {"every", NEWT_OPT_INT, &every, "the check's interval in steps (spec.fault.verify_every)"},
      NEWT_OPT_END,
  };
  int rc = newt_opts_exit(newt_opts_parse("bench verify", "[flags]", opts, argc, argv, NULL, 0, NULL));
  if (rc >= 0) return rc;
  model_train_config cfg;
  if (model_train_defaults(&cfg, preset, warmup + steps) != NEWT_OK) {
    fprintf(stderr, "newt bench verify: %s\n", newt_errmsg());
    return 2;
  }
  if (threads < 1 || batch < dp || batch > 1 << 16 || micro < 0 || steps < 1 || warmup < 0 || dp < 2 || dp > 64 ||
      zero < 0 || zero > 3 || every < 1) {
    fprintf(stderr, "newt bench verify: --dp 2..64, --batch at least --dp, --zero 0..3, --every, --steps and "
                    "--threads at least 1\n");
    return 2;
  }
  cfg.threads = (int)threads;
  cfg.batch = (int)batch;
  cfg.seq_len = (int)cfg.model.ctx;
  cfg.micro_batch = micro ? (int)micro : (int)((batch + dp - 1) / dp);
  bench_line b = {.preset = preset, .threads = (int)threads, .cfg = &cfg, .gpu = -1, .verify_every = every};
  model_par_config_from_rank(&b.pc, 1, 1, (int)dp, (int)zero, 0);
  if (model_par_config_check(&b.pc, &cfg) != NEWT_OK) {
    fprintf(stderr, "newt bench verify: %s\n", newt_errmsg());
    return 2;
  }
  return bench_parallel(&b, warmup, steps);
}
