/* newt bench train: training throughput of the CPU model in one process.
 *
 *   newt bench train --preset tiny|small --threads T [--batch B] [--steps N] [--warmup W]
 *
 * Runs W untimed steps, then N timed ones on a fixed random batch of B sequences of the
 * preset's ctx, and prints one JSON line with the median step:
 * {"bench":"train","preset":...,"threads":...,"tokens_per_s":...,"ms_per_step":...,"gflops":...}
 * gflops counts 6 FLOPs per parameter per token plus the causal half of attention
 * (model_flops_per_token). */
#include <stdio.h>
#include <stdlib.h>

#include "bench/bench.h"
#include "cli/cmds.h"
#include "common/opts.h"
#include "model/ops.h"
#include "model/rng.h"
#include "model/train.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int newt_bench_train(int argc, char **argv) {
  const char *preset = "tiny", *overrides = NULL;
  int64_t threads = 1, batch = 8, micro = 0, steps = 10, warmup = 3;
  newt_opt opts[] = {
      {"preset", NEWT_OPT_STR, &preset, "model preset: tiny, small or gpt2-124m"},
      {"model", NEWT_OPT_STR, &overrides, "overrides of the preset: layers=2,..."},
      {"threads", NEWT_OPT_INT, &threads, "CPU threads"},
      {"batch", NEWT_OPT_INT, &batch, "sequences per step"},
      {"micro-batch", NEWT_OPT_INT, &micro, "sequences per forward/backward (0: the batch)"},
      {"steps", NEWT_OPT_INT, &steps, "timed steps"},
      {"warmup", NEWT_OPT_INT, &warmup, "untimed steps first"},
      NEWT_OPT_END,
  };
  int rc = newt_cli_opts_exit(newt_opts_parse("bench train", "[flags]", opts, argc, argv, NULL, 0, NULL));
  if (rc >= 0) return rc;
  model_train_config cfg;
  if (model_train_defaults(&cfg, preset, warmup + steps) != NEWT_OK ||
      model_config_override(&cfg.model, overrides) != NEWT_OK) {
    fprintf(stderr, "newt bench train: %s\n", newt_errmsg());
    return 2;
  }
  if (threads < 1 || batch < 1 || batch > 1 << 16 || micro < 0 || steps < 1 || warmup < 0) {
    fprintf(stderr, "newt bench train: --threads, --batch and --steps must be >= 1\n");
    return 2;
  }
  cfg.threads = (int)threads;
  cfg.batch = (int)batch;
  cfg.micro_batch = micro ? (int)micro : (int)batch;
  model_trainer tr;
  if (model_trainer_init(&tr, &cfg) != NEWT_OK) {
    fprintf(stderr, "newt bench train: %s\n", newt_errmsg());
    return 1;
  }
  size_t n = (size_t)batch * cfg.seq_len;
  int32_t *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
  double *ms = malloc((size_t)steps * sizeof *ms);
  if (!x || !y || !ms) {
    fprintf(stderr, "newt bench train: out of memory\n");
    return 1;
  }
  for (size_t i = 0; i < n; i++) {
    x[i] = (int32_t)(model_rng_u64(7, 1, i) % (uint64_t)cfg.model.vocab);
    y[i] = (int32_t)(model_rng_u64(7, 2, i) % (uint64_t)cfg.model.vocab);
  }
  model_step_info info;
  for (int64_t s = 0; s < warmup + steps; s++) {
    model_trainer_step(&tr, x, y, (int)batch, &info);
    if (s >= warmup) ms[s - warmup] = info.ms;
    fprintf(stderr, "step %lld loss %.4f %.1f ms\n", (long long)s + 1, info.loss, info.ms);
  }
  qsort(ms, (size_t)steps, sizeof *ms, cmp_double);
  double med = steps % 2 ? ms[steps / 2] : 0.5 * (ms[steps / 2 - 1] + ms[steps / 2]);
  double tps = (double)n / (med / 1e3);
  printf("{\"bench\":\"train\",\"preset\":\"%s\",\"threads\":%lld,\"batch\":%lld,\"micro_batch\":%d,"
         "\"seq_len\":%d,\"params\":%zu,\"tokens_per_s\":%.0f,\"ms_per_step\":%.2f,\"gflops\":%.2f}\n",
         preset, (long long)threads, (long long)batch, cfg.micro_batch, cfg.seq_len, tr.gpt.layout.nparams,
         tps, med, model_flops_per_token(&cfg.model, cfg.seq_len) * tps / 1e9);
  free(x);
  free(y);
  free(ms);
  model_trainer_free(&tr);
  return 0;
}
