/* newt train: trains the GPT in this process, without a coordinator, and prints a line
 * per step. It is the reference every parallel layout is compared with: its flags make a
 * job spec, and the trainer and the data come from that spec through the worker's own
 * functions (gpt_train_config, gpt_open_data), so a job with the same values follows
 * the same trajectory.
 *
 * Data: --data FILE (a token file from `newt data prepare`), or without it the generated
 * corpus (model_text_generate, seeded by --data-seed), which is learnable.
 *
 * Checkpoints: with --ckpt-dir DIR it first resumes from the newest valid checkpoint there
 * (weights, AdamW moments, step, data cursor; gpt/ckpt.h), then saves one every
 * --ckpt-every steps in the background while it trains on. A failed save is reported and
 * training goes on; one that no later save made good (the final one, say) makes the exit
 * status 1. --log FILE (or --step-log) appends one JSON line per step: the step log of
 * `newt run` (job/runlog.h), whose loss curve `newt report --baseline` draws beside a run's.
 *
 * Devices: --device cpu (the default) or cuda (cuda:N for GPU N; cuda alone: LOCAL_RANK's GPU,
 * else GPU 0). Both run the parallel trainer (model/parallel.h) as a layout of one rank, the
 * trainer every worker runs, on the device's memory and kernels (model/dev.h): on the CPU
 * that is model_trainer bit for bit, on a GPU the same code with the CUDA kernels, and a
 * checkpoint written on one device resumes on the other. */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cmds.h"
#include "common/clock.h"
#include "common/fs.h"
#include "common/opts.h"
#include "common/secret.h"
#include "common/sys.h"
#include "gpt/ckpt.h"
#include "gpt/gpt.h"
#include "job/runlog.h"
#include "job/spec.h"
#include "model/dev.h"
#include "model/ops.h"
#include "model/parallel.h"
#include "model/train.h"

/* --device: -1 the CPU, -2 a GPU of this process's choice, N GPU N; -1 returned when bad. */
static int parse_device(const char *s, int *gpu) {
  if (strcmp(s, "cpu") == 0 || strcmp(s, "cuda") == 0) {
    *gpu = strcmp(s, "cpu") == 0 ? -1 : -2;
    return 0;
  }
  if (strncmp(s, "cuda:", 5) != 0 || s[5] < '0' || s[5] > '9') return -1;
  char *end = NULL;
  long n = strtol(s + 5, &end, 10);
  if (*end || n > 4095) return -1;
  *gpu = (int)n;
  return 0;
}

/* The device of --device (NULL for the CPU: the trainer's default). */
static newt_result_t open_device(int gpu, model_dev **out) {
  *out = NULL;
  if (gpu == -1) return NEWT_OK;
  int n = model_dev_cuda_count();
  if (n == 0)
    return NEWT_ERR(NEWT_ERR_UNSUPPORTED, "--device cuda: this process sees no GPU (a build without CUDA, no "
                    "driver, or CUDA_VISIBLE_DEVICES=%s)",
                    getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "(unset)");
  const char *local = getenv("LOCAL_RANK");
  if (gpu == -2) gpu = local && *local ? atoi(local) % n : 0;
  if (gpu >= n)
    return NEWT_ERR(NEWT_ERR_INVALID, "--device cuda:%d: this process sees %d GPU%s (0 to %d)", gpu, n,
                    n == 1 ? "" : "s", n - 1);
  return model_dev_open(MODEL_DEV_CUDA, gpu, out);
}

/* The saver's staging on a GPU: the device's pinned host memory (gpt_ckpt_par_add). */
static void *staging_alloc(void *dev, size_t bytes) {
  void *p = NULL; /* aligned as the saver needs (model/dev.h); the saver checks it */
  return model_dev_host_alloc(dev, bytes, &p) == NEWT_OK ? p : NULL;
}

static void staging_free(void *dev, void *p) { model_dev_host_free(dev, p); }

/* Saves the trainer as its step, in the background once the state is on the host. */
static newt_result_t save(ckpt_saver *s, const model_par *p, uint64_t cursor, const char *data, int *started) {
  cJSON *state = NULL;
  NEWT_CHECK(gpt_ckpt_train_state(&p->cfg, p->step, cursor, p->opt.t, data, &state));
  newt_result_t r = ckpt_save_begin(s, p->step, 1, started);
  if (r == NEWT_OK && *started) {
    r = gpt_ckpt_par_add(s, p);
    if (r == NEWT_OK) r = ckpt_save_end(s, state);
    else r = ckpt_save_fail(s, r, newt_errmsg()); /* what was staged must not be written */
  }
  cJSON_Delete(state);
  return r;
}

int newt_cmd_train(int argc, char **argv) {
  const char *preset = "tiny", *overrides = NULL, *data = NULL, *device = "cpu";
  int64_t steps = 100, threads = 1, batch = 8, micro = 0, seq = 0, seed = 1, data_seed = 1,
          warmup = -1, gen_bytes = 1 << 21;
  double lr = 1e-3, lr_min = -1, wd = 0.1, clip = 1.0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  const char *ckpt_dir = NULL, *log_path = NULL, *secret_file = NULL;
  int64_t ckpt_every = 0, ckpt_keep = 3, ckpt_level = 1;
  newt_opt opts[] = {
      {"preset", NEWT_OPT_STR, &preset, "model preset: tiny, small or gpt2-124m"},
      {"model", NEWT_OPT_STR, &overrides, "overrides of the preset: layers=2,channels=64,..."},
      {"steps", NEWT_OPT_INT, &steps, "optimizer steps"},
      {"data", NEWT_OPT_STR, &data, "token file (newt data prepare); default: the generated corpus"},
      {"data-seed", NEWT_OPT_INT, &data_seed, "seed of the sample order (and of the generated corpus)"},
      {"threads", NEWT_OPT_INT, &threads, "CPU threads (0: all cores)"},
      {"batch", NEWT_OPT_INT, &batch, "global batch, sequences per step"},
      {"micro-batch", NEWT_OPT_INT, &micro, "sequences per forward/backward (0: the batch)"},
      {"seq-len", NEWT_OPT_INT, &seq, "sequence length (0: the preset's ctx)"},
      {"seed", NEWT_OPT_INT, &seed, "seed of the initial weights"},
      {"lr", NEWT_OPT_DOUBLE, &lr, "peak learning rate"},
      {"lr-min", NEWT_OPT_DOUBLE, &lr_min, "final learning rate of the cosine (-1: lr / 10)"},
      {"warmup", NEWT_OPT_INT, &warmup, "warmup steps (-1: 5% of steps)"},
      {"weight-decay", NEWT_OPT_DOUBLE, &wd, "AdamW weight decay on 2-D weights"},
      {"grad-clip", NEWT_OPT_DOUBLE, &clip, "max global gradient norm (0: off)"},
      {"beta1", NEWT_OPT_DOUBLE, &beta1, "AdamW beta1"},
      {"beta2", NEWT_OPT_DOUBLE, &beta2, "AdamW beta2"},
      {"eps", NEWT_OPT_DOUBLE, &eps, "AdamW epsilon"},
      {"gen-bytes", NEWT_OPT_SIZE, &gen_bytes, "length of the generated corpus without --data"},
      {"ckpt-dir", NEWT_OPT_STR, &ckpt_dir, "checkpoint directory: resume from it, save into it"},
      {"ckpt-every", NEWT_OPT_INT, &ckpt_every, "save a checkpoint every K steps (0: only resume)"},
      {"ckpt-keep", NEWT_OPT_INT, &ckpt_keep, "committed checkpoints to keep"},
      {"ckpt-level", NEWT_OPT_INT, &ckpt_level, "zstd level of checkpoints (0: uncompressed)"},
      {"job-secret-file", NEWT_OPT_STR, &secret_file,
       "the secret the checkpoints are proved with (yours, mode 0600; default: the checkpoint directory's own "
       "job.secret, made when missing): a checkpoint that does not prove it is not resumed from"},
      {"log", NEWT_OPT_STR, &log_path, "append one JSON line per step (the step log: step, loss, lr, ...) to FILE"},
      {"step-log", NEWT_OPT_STR, &log_path, "the same as --log"},
      {"device", NEWT_OPT_STR, &device, "cpu, or cuda[:N]: GPU N (cuda: LOCAL_RANK's, else 0)"},
      NEWT_OPT_END,
  };
  int rc = newt_opts_exit(newt_opts_parse("train", "[flags]", opts, argc, argv, NULL, 0, NULL));
  if (rc >= 0) return rc;
  if (steps < 1 || batch < 1 || batch > 1 << 20 || micro < 0 || micro > batch || threads < 0 ||
      threads > 1024 || seq < 0 || seq > 1 << 20 || gen_bytes < 2) {
    fprintf(stderr, "newt train: --steps, --batch and --gen-bytes must be positive; --micro-batch in "
                    "[0, batch], --threads in [0, 1024], --seq-len >= 0\n");
    return 2;
  }
  int gpu = -1;
  if (parse_device(device, &gpu) != 0) {
    fprintf(stderr, "newt train: --device \"%s\": cpu, cuda, or cuda:N (a GPU ordinal)\n", device);
    return 2;
  }
  if (!ckpt_dir && ckpt_every > 0) {
    fprintf(stderr, "newt train: --ckpt-every needs --ckpt-dir\n");
    return 2;
  }

  /* The job spec these flags describe: the worker builds its trainer and its data from a
     spec with the same two functions, so both follow one trajectory. */
  newt_spec spec;
  spec_defaults(&spec, "train");
  snprintf(spec.preset, sizeof spec.preset, "%s", preset);
  spec.steps = steps;
  spec.global_batch = batch;
  spec.micro_batch = micro ? micro : batch;
  spec.seq_len = seq;
  spec.seed = (uint64_t)seed;
  spec.data_seed = (uint64_t)data_seed;
  spec.lr = lr;
  spec.lr_min = lr_min < 0 ? lr / 10 : lr_min;
  spec.warmup = warmup;
  spec.weight_decay = wd;
  spec.grad_clip = clip;
  spec.gen_bytes = gen_bytes;
  snprintf(spec.data_path, sizeof spec.data_path, "%s", data ? data : "");
  if (data && strlen(data) >= sizeof spec.data_path) {
    fprintf(stderr, "newt train: --data: a path of at most %zu characters\n", sizeof spec.data_path - 1);
    return 2;
  }
  /* the checks of a job's start (gpt/gpt.h): the model, and the token file here */
  model_train_config cfg;
  if (strlen(preset) >= sizeof spec.preset || spec_set_model(&spec, overrides) != NEWT_OK ||
      gpt_start_check(&spec, GPT_CHECK_TRAINER | GPT_CHECK_FILES) != NEWT_OK ||
      gpt_train_config(&spec, (int)threads, &cfg) != NEWT_OK) {
    fprintf(stderr, "newt train: %s\n", strlen(preset) >= sizeof spec.preset ? "--preset: too long" : newt_errmsg());
    return 2;
  }
  cfg.optim.beta1 = beta1;
  cfg.optim.beta2 = beta2;
  cfg.optim.eps = eps;
  if (model_train_config_check(&cfg) != NEWT_OK) {
    fprintf(stderr, "newt train: %s\n", newt_errmsg());
    return 2;
  }

  /* Everything below is released at one place, `done`. */
  model_tokens tok = {0};
  model_loader ld;
  model_dev *dev = NULL;
  model_par par;
  ckpt_saver *saver = NULL;
  int steplog = -1;
  int have_par = 0;
  int status = 1;
  int32_t *inputs = NULL, *targets = NULL;
  uint64_t cursor = 0; /* samples consumed */
  char data_desc[SPEC_PATH_MAX + 32];
  spec_data_desc(&spec, data_desc, sizeof data_desc);
  int64_t resumed = -1;
  newt_result_t res = open_device(gpu, &dev);
  if (res == NEWT_OK) res = gpt_open_data(&spec, &tok);
  if (res == NEWT_OK) res = model_loader_init(&ld, &tok, cfg.seq_len, cfg.data_seed, cfg.model.vocab);
  model_par_config pc;
  model_par_config_from_rank(&pc, 1, 1, 1, 0, 0);
  pc.dev = dev;
  if (res == NEWT_OK && (res = model_par_init(&par, &cfg, &pc)) == NEWT_OK) have_par = 1;
  if (res == NEWT_OK) {
    inputs = malloc((size_t)cfg.batch * cfg.seq_len * sizeof *inputs);
    targets = malloc((size_t)cfg.batch * cfg.seq_len * sizeof *targets);
    if (!inputs || !targets)
      res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a batch of %d x %d", cfg.batch, cfg.seq_len);
  }
  /* resume, and the saver for what comes next; both with the checkpoints' key of the secret (the
     directory's own unless one is given: docs/ckpt.md, "Whose checkpoint") */
  ckpt_key key = {0};
  if (res == NEWT_OK && ckpt_dir) {
    unsigned char *secret = NULL;
    size_t slen = 0;
    res = secret_file ? newt_secret_read(secret_file, &secret, &slen)
                      : newt_secret_in_dir(ckpt_dir, ckpt_every > 0 || newt_fs_exists(ckpt_dir), &secret, &slen);
    if (res == NEWT_ERR_NOTFOUND && !secret_file) { /* no directory, nothing to resume, nothing to save */
      newt_err_clear();
      res = NEWT_OK;
    } else if (res == NEWT_OK) {
      res = ckpt_key_of_secret(&key, secret, slen);
    }
    newt_secret_free(secret, slen);
  }
  if (res == NEWT_OK && ckpt_dir) {
    ckpt_saver_opts so = {.dir = ckpt_dir, .rank = 0, .nranks = 1, .threads = 2, .level = (int)ckpt_level,
                          .keep = (int)ckpt_keep, .commit = 1, .key = &key,
                          .layout = {.has = CKPT_LAYOUT_SHAPE, .dp = 1, .tp = 1, .pp = 1}};
    if (ckpt_level == 0) so.level = CKPT_LEVEL_RAW;
    so.staging_hint = gpt_ckpt_par_staging_bytes(&par); /* the first save's staging: one block */
    if (!model_dev_host_visible(par.dev)) { /* a GPU's downloads land in its pinned memory */
      so.staging_alloc = staging_alloc;
      so.staging_free = staging_free;
      so.staging_ctx = par.dev;
    }
    /* the saver first: it takes the directory's lock (one writer per directory), so a run
       refused there reads nothing and trains nothing */
    if (ckpt_every > 0) res = ckpt_saver_init(&saver, &so);
    if (res == NEWT_OK) {
      gpt_ckpt_train_point pt;
      res = gpt_ckpt_par_load(ckpt_dir, CKPT_LATEST, &par, data_desc, 2, NULL, &key, &pt);
      if (res == NEWT_OK) {
        resumed = pt.step;
        cursor = pt.cursor;
      } else if (res == NEWT_ERR_NOTFOUND && pt.committed == 0) { /* nothing committed: a fresh run */
        newt_err_clear(); /* nothing was read: the buffers hold the initial weights */
        res = NEWT_OK;
      } else {
        res = newt_err_wrap(res, "resuming from %s: ", ckpt_dir);
      }
    }
  }
  if (res == NEWT_OK && log_path && (res = job_runlog_open(log_path, 0, &steplog)) != NEWT_OK)
    res = newt_err_wrap(res, "--log: ");
  if (res != NEWT_OK) {
    fprintf(stderr, "newt train: %s\n", newt_errmsg());
    goto done;
  }
  const model_config *m = &cfg.model;
  printf("newt train: %s (V %lld, ctx %lld, L %lld, NH %lld, C %lld), %zu parameters, batch %d "
         "(micro-batch %d) x T %d, %s, data %s (%llu tokens, %llu samples per epoch)\n",
         preset, (long long)m->vocab, (long long)m->ctx, (long long)m->layers, (long long)m->heads,
         (long long)m->channels, par.global.nparams, cfg.batch, cfg.micro_batch, cfg.seq_len,
         model_dev_name(par.dev), data ? data : "generated", (unsigned long long)tok.count,
         (unsigned long long)ld.windows);
  fflush(stdout);
  if (resumed >= 0) printf("newt train: resumed at step %lld from %s\n", (long long)resumed, ckpt_dir);
  fflush(stdout);
  double first = NAN, last = NAN, ms_total = 0;
  status = 0;
  uint64_t failed_saves = 0;
  int64_t bad_save = -1; /* the newest save that failed, and why */
  char bad_msg[sizeof ((ckpt_save_status *)0)->message] = "";
  const int64_t resumed0 = par.step;
  int64_t committed = resumed > 0 ? resumed : 0; /* the newest committed checkpoint, for the step log */
  for (int64_t s = par.step; s < steps; s++) {
    model_step_info info;
    double t0 = newt_now_s();
    /* one rank: no communicators; the step's end downloads its loss, so its time is the device's */
    if (model_loader_fetch(&ld, cursor, cfg.batch, inputs, targets) != NEWT_OK ||
        model_par_step(&par, NULL, inputs, targets, cfg.batch, &info) != NEWT_OK) {
      fprintf(stderr, "newt train: step %lld: %s\n", (long long)s + 1, newt_errmsg());
      status = 1;
      break;
    }
    cursor += (uint64_t)cfg.batch;
    info.ms = (newt_now_s() - t0) * 1e3;
    if (s == resumed || s == 0) first = info.loss;
    last = info.loss;
    ms_total += info.ms;
    printf("step %5lld/%lld | loss %.4f | lr %.2e | norm %.3f | %8.0f tok/s | %7.1f ms\n",
           (long long)info.step, (long long)steps, info.loss, info.lr, info.grad_norm,
           (double)info.tokens / (info.ms / 1e3), info.ms);
    fflush(stdout);
    if (!isfinite(info.loss)) {
      fprintf(stderr, "newt train: the loss is not finite at step %lld\n", (long long)info.step);
      status = 1;
      break;
    }
    if (saver) { /* a failed background save is reported, and training goes on */
      ckpt_save_status st;
      ckpt_saver_status(saver, &st);
      if (st.last_ok_step > committed) committed = st.last_ok_step;
      if (st.saves_failed > failed_saves) {
        failed_saves = st.saves_failed;
        fprintf(stderr, "newt train: the checkpoint of step %lld failed (the previous one stays the newest): %s\n",
                (long long)st.step, st.message);
        bad_save = st.step;
        snprintf(bad_msg, sizeof bad_msg, "%s", st.message);
      }
      int started = 0;
      if (info.step % ckpt_every == 0 && save(saver, &par, cursor, data_desc, &started) != NEWT_OK) {
        fprintf(stderr, "newt train: checkpoint of step %lld: %s\n", (long long)info.step, newt_errmsg());
        bad_save = info.step;
        snprintf(bad_msg, sizeof bad_msg, "%s", newt_errmsg());
      }
    }
    if (steplog >= 0) {
      job_step line = {.step = info.step, .loss = info.loss, .lr = info.lr, .grad_norm = info.grad_norm,
                       .tokens_per_s = (double)info.tokens / (info.ms / 1e3), .world = 1, .dp = 1,
                       .generation = 1, .t_ms = newt_wall_ms(), .ckpt = committed};
      if (job_steplog_append(steplog, &line) != NEWT_OK)
        fprintf(stderr, "newt train: --log %s: %s\n", log_path, newt_errmsg());
    }
    if (newt_stop_requested()) {
      fprintf(stderr, "newt train: stopping after step %lld (signal)\n", (long long)info.step);
      break;
    }
  }
  printf("{\"steps\":%lld,\"first_loss\":%.6f,\"final_loss\":%.6f,\"samples_consumed\":%llu,\"ms_per_step\":%.2f}\n",
         (long long)par.step, first, last, (unsigned long long)cursor,
         par.step > resumed0 ? ms_total / (double)(par.step - resumed0) : 0.0);
  if (saver && ckpt_save_wait(saver, NEWT_DEADLINE_NONE) != NEWT_OK) {
    ckpt_save_status st;
    ckpt_saver_status(saver, &st);
    if (st.saves_failed > failed_saves) {
      fprintf(stderr, "newt train: the checkpoint of step %lld failed: %s\n", (long long)st.step, st.message);
      bad_save = st.step;
      snprintf(bad_msg, sizeof bad_msg, "%s", st.message);
    }
  }
  if (saver) { /* a save asked for that no later one made good: the run did not end saved */
    ckpt_save_status st;
    ckpt_saver_status(saver, &st);
    if (bad_save >= 0 && bad_save > st.last_ok_step) {
      fprintf(stderr, "newt train: exiting with status 1: the checkpoint of step %lld failed and no later one was "
                      "saved: %s\n", (long long)bad_save, bad_msg);
      status = 1;
    }
  }
done:
  ckpt_saver_free(saver);
  if (steplog >= 0) close(steplog);
  if (have_par) model_par_free(&par);
  if (dev) model_dev_close(dev);
  free(inputs);
  free(targets);
  model_tokens_close(&tok);
  return status;
}
