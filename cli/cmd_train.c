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
#include "job/spec_flags.h"
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

/* newt train's flags beside the spec's (those are a spec_flags): the device, the threads, the
 * optimizer's moments and the checkpoints of this process */
typedef struct train_flags {
  const char *device, *ckpt_dir, *log_path, *secret_file;
  int64_t threads, ckpt_every, ckpt_keep, ckpt_level;
  double beta1, beta2, eps;
} train_flags;

/* The flags, in --help's order, parsed into f and sf; -1 to go on, else the exit status
 * (--help: 0, a bad flag: 2). The spec's defaults are newt train's own: a batch of 8, its
 * micro-batch 0 (the batch), lr-min -1 (lr / 10). */
static int parse_flags(int argc, char **argv, train_flags *f, spec_flags *sf) {
  *f = (train_flags){.device = "cpu", .threads = 1, .ckpt_keep = 3, .ckpt_level = 1, .beta1 = 0.9, .beta2 = 0.95,
                     .eps = 1e-8};
  newt_spec d;
  spec_defaults(&d, "train");
  d.global_batch = 8;
  d.micro_batch = 0;
  d.lr_min = -1;
  newt_opt opts[] = {
      SPEC_OPT("preset"), SPEC_OPT("model"), SPEC_OPT("steps"), SPEC_OPT("data"),
      SPEC_OPT_HELP("data-seed", "seed of the sample order (and of the generated corpus)"),
      {"threads", NEWT_OPT_INT, &f->threads, "CPU threads (0: all cores)"},
      SPEC_OPT("batch"),
      SPEC_OPT_HELP("micro-batch", "sequences per forward/backward (0: the batch)"),
      SPEC_OPT_HELP("seq-len", "sequence length (0: the preset's ctx)"),
      SPEC_OPT("seed"), SPEC_OPT("lr"), SPEC_OPT("lr-min"), SPEC_OPT("warmup"), SPEC_OPT("weight-decay"),
      SPEC_OPT("grad-clip"),
      {"beta1", NEWT_OPT_DOUBLE, &f->beta1, "AdamW beta1"},
      {"beta2", NEWT_OPT_DOUBLE, &f->beta2, "AdamW beta2"},
      {"eps", NEWT_OPT_DOUBLE, &f->eps, "AdamW epsilon"},
      SPEC_OPT("gen-bytes"),
      {"ckpt-dir", NEWT_OPT_STR, &f->ckpt_dir, "checkpoint directory: resume from it, save into it"},
      {"ckpt-every", NEWT_OPT_INT, &f->ckpt_every, "save a checkpoint every K steps (0: only resume)"},
      {"ckpt-keep", NEWT_OPT_INT, &f->ckpt_keep, "committed checkpoints to keep"},
      {"ckpt-level", NEWT_OPT_INT, &f->ckpt_level, "zstd level of checkpoints (0: uncompressed)"},
      {"job-secret-file", NEWT_OPT_STR, &f->secret_file,
       "the secret the checkpoints are proved with (yours, mode 0600; default: the checkpoint directory's own "
       "job.secret, made when missing): a checkpoint that does not prove it is not resumed from"},
      {"log", NEWT_OPT_STR, &f->log_path, "append one JSON line per step (the step log: step, loss, lr, ...) to FILE"},
      {"step-log", NEWT_OPT_STR, &f->log_path, "the same as --log"},
      {"device", NEWT_OPT_STR, &f->device, "cpu, or cuda[:N]: GPU N (cuda: LOCAL_RANK's, else 0)"},
      NEWT_OPT_END,
  };
  if (spec_flags_bind(sf, opts, &d) != NEWT_OK) return newt_opts_exit(NEWT_ERR_INVALID);
  return newt_opts_exit(newt_opts_parse("train", "[flags]", opts, argc, argv, NULL, 0, NULL));
}

/* The job spec the flags describe, and the trainer's config from it: the worker builds its
 * trainer and its data from a spec with the same two functions, so both follow one
 * trajectory. 0, or 2 with the reason said. */
static int build_spec(const train_flags *f, const spec_flags *sf, newt_spec *spec, model_train_config *cfg,
                      int *gpu) {
  *spec = sf->defaults;
  if (spec_flags_apply(sf, spec) != NEWT_OK) {
    fprintf(stderr, "newt train: %s\n", newt_errmsg());
    return 2;
  }
  int64_t batch = spec->global_batch, micro = spec->micro_batch, seq = spec->seq_len;
  if (spec->steps < 1 || batch < 1 || batch > 1 << 20 || micro < 0 || micro > batch || f->threads < 0 ||
      f->threads > 1024 || seq < 0 || seq > 1 << 20 || spec->gen_bytes < 2) {
    fprintf(stderr, "newt train: --steps, --batch and --gen-bytes must be positive; --micro-batch in "
                    "[0, batch], --threads in [0, 1024], --seq-len >= 0\n");
    return 2;
  }
  if (parse_device(f->device, gpu) != 0) {
    fprintf(stderr, "newt train: --device \"%s\": cpu, cuda, or cuda:N (a GPU ordinal)\n", f->device);
    return 2;
  }
  if (!f->ckpt_dir && f->ckpt_every > 0) {
    fprintf(stderr, "newt train: --ckpt-every needs --ckpt-dir\n");
    return 2;
  }
  if (micro == 0) spec->micro_batch = batch;
  /* the checks of a job's start (gpt/gpt.h): the model, and the token file here */
  if (gpt_start_check(spec, GPT_CHECK_TRAINER | GPT_CHECK_FILES) != NEWT_OK ||
      gpt_train_config(spec, (int)f->threads, cfg) != NEWT_OK) {
    fprintf(stderr, "newt train: %s\n", newt_errmsg());
    return 2;
  }
  cfg->optim.beta1 = f->beta1;
  cfg->optim.beta2 = f->beta2;
  cfg->optim.eps = f->eps;
  if (model_train_config_check(cfg) != NEWT_OK) {
    fprintf(stderr, "newt train: %s\n", newt_errmsg());
    return 2;
  }
  return 0;
}

/* One run of the trainer: everything it holds, released at one place (trainer_free). */
typedef struct trainer {
  model_train_config cfg;
  model_tokens tok;
  model_loader ld;
  model_dev *dev;
  model_par par;
  int have_par;
  ckpt_saver *saver;
  ckpt_key key; /* the checkpoints' key of the secret */
  int steplog;
  int32_t *inputs, *targets;
  uint64_t cursor; /* samples consumed */
  int64_t resumed; /* the step resumed at (-1: a fresh run) */
  char data_desc[SPEC_PATH_MAX + 32];
} trainer;

/* The device, the data, the trainer and a batch's buffers. */
static newt_result_t trainer_open(trainer *t, const newt_spec *spec, int gpu) {
  const model_train_config *cfg = &t->cfg;
  NEWT_CHECK(open_device(gpu, &t->dev));
  NEWT_CHECK(gpt_open_data(spec, &t->tok));
  NEWT_CHECK(model_loader_init(&t->ld, &t->tok, cfg->seq_len, cfg->data_seed, cfg->model.vocab));
  model_par_config pc;
  model_par_config_from_rank(&pc, 1, 1, 1, 0, 0);
  pc.dev = t->dev;
  NEWT_CHECK(model_par_init(&t->par, cfg, &pc));
  t->have_par = 1;
  t->inputs = malloc((size_t)cfg->batch * cfg->seq_len * sizeof *t->inputs);
  t->targets = malloc((size_t)cfg->batch * cfg->seq_len * sizeof *t->targets);
  if (!t->inputs || !t->targets)
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a batch of %d x %d", cfg->batch, cfg->seq_len);
  return NEWT_OK;
}

/* The checkpoints' key: of the secret given, else of the directory's own (docs/ckpt.md,
 * "Whose checkpoint"); none where there is no directory, nothing to resume or save. */
static newt_result_t ckpt_key_open(trainer *t, const train_flags *f) {
  unsigned char *secret = NULL;
  size_t slen = 0;
  newt_result_t res = f->secret_file ? newt_secret_read(f->secret_file, &secret, &slen)
                                     : newt_secret_in_dir(f->ckpt_dir, f->ckpt_every > 0 || newt_fs_exists(f->ckpt_dir),
                                                          &secret, &slen);
  if (res == NEWT_ERR_NOTFOUND && !f->secret_file) { /* no directory, nothing to resume, nothing to save */
    newt_err_clear();
    res = NEWT_OK;
  } else if (res == NEWT_OK) {
    res = ckpt_key_of_secret(&t->key, secret, slen);
  }
  newt_secret_free(secret, slen);
  return res;
}

/* The saver for what comes next, then the resume from the newest checkpoint, both with the key. */
static newt_result_t train_ckpt_open(trainer *t, const train_flags *f) {
  NEWT_CHECK(ckpt_key_open(t, f));
  ckpt_saver_opts so = {.dir = f->ckpt_dir, .rank = 0, .nranks = 1, .threads = 2, .level = (int)f->ckpt_level,
                        .keep = (int)f->ckpt_keep, .commit = 1, .key = &t->key,
                        .layout = {.has = CKPT_LAYOUT_SHAPE, .dp = 1, .tp = 1, .pp = 1}};
  if (f->ckpt_level == 0) so.level = CKPT_LEVEL_RAW;
  so.staging_hint = gpt_ckpt_par_staging_bytes(&t->par); /* the first save's staging: one block */
  if (!model_dev_host_visible(t->par.dev)) { /* a GPU's downloads land in its pinned memory */
    so.staging_alloc = staging_alloc;
    so.staging_free = staging_free;
    so.staging_ctx = t->par.dev;
  }
  /* the saver first: it takes the directory's lock (one writer per directory), so a run
     refused there reads nothing and trains nothing */
  if (f->ckpt_every > 0) NEWT_CHECK(ckpt_saver_init(&t->saver, &so));
  gpt_ckpt_train_point pt;
  newt_result_t res = gpt_ckpt_par_load(f->ckpt_dir, CKPT_LATEST, &t->par, t->data_desc, 2, NULL, &t->key, &pt);
  if (res == NEWT_OK) {
    t->resumed = pt.step;
    t->cursor = pt.cursor;
  } else if (res == NEWT_ERR_NOTFOUND && pt.committed == 0) { /* nothing committed: a fresh run */
    newt_err_clear(); /* nothing was read: the buffers hold the initial weights */
    res = NEWT_OK;
  } else {
    res = newt_err_wrap(res, "resuming from %s: ", f->ckpt_dir);
  }
  return res;
}

static void trainer_free(trainer *t) {
  ckpt_saver_free(t->saver);
  if (t->steplog >= 0) close(t->steplog);
  if (t->have_par) model_par_free(&t->par);
  if (t->dev) model_dev_close(t->dev);
  free(t->inputs);
  free(t->targets);
  model_tokens_close(&t->tok);
}

/* The saves of a run: the newest that failed (and why), what is committed */
typedef struct save_watch {
  uint64_t failed_saves;
  int64_t bad_save; /* the newest save that failed (-1: none) */
  char bad_msg[sizeof ((ckpt_save_status *)0)->message];
  int64_t committed; /* the newest committed checkpoint, for the step log */
} save_watch;

/* After a step: a failed background save is reported (training goes on), and the step saved
 * when it is one of --ckpt-every's. */
static void ckpt_after_step(trainer *t, const train_flags *f, int64_t step, save_watch *w) {
  ckpt_save_status st;
  ckpt_saver_status(t->saver, &st);
  if (st.last_ok_step > w->committed) w->committed = st.last_ok_step;
  if (st.saves_failed > w->failed_saves) {
    w->failed_saves = st.saves_failed;
    fprintf(stderr, "newt train: the checkpoint of step %lld failed (the previous one stays the newest): %s\n",
            (long long)st.step, st.message);
    w->bad_save = st.step;
    snprintf(w->bad_msg, sizeof w->bad_msg, "%s", st.message);
  }
  int started = 0;
  if (step % f->ckpt_every == 0 && save(t->saver, &t->par, t->cursor, t->data_desc, &started) != NEWT_OK) {
    fprintf(stderr, "newt train: checkpoint of step %lld: %s\n", (long long)step, newt_errmsg());
    w->bad_save = step;
    snprintf(w->bad_msg, sizeof w->bad_msg, "%s", newt_errmsg());
  }
}

/* The end of the saves: the last one waited for; a save asked for that no later one made
 * good means the run did not end saved: 1, else 0. */
static int ckpt_finish(trainer *t, save_watch *w) {
  if (!t->saver) return 0;
  ckpt_save_status st;
  if (ckpt_save_wait(t->saver, NEWT_DEADLINE_NONE) != NEWT_OK) {
    ckpt_saver_status(t->saver, &st);
    if (st.saves_failed > w->failed_saves) {
      fprintf(stderr, "newt train: the checkpoint of step %lld failed: %s\n", (long long)st.step, st.message);
      w->bad_save = st.step;
      snprintf(w->bad_msg, sizeof w->bad_msg, "%s", st.message);
    }
  }
  ckpt_saver_status(t->saver, &st);
  if (w->bad_save < 0 || w->bad_save <= st.last_ok_step) return 0;
  fprintf(stderr, "newt train: exiting with status 1: the checkpoint of step %lld failed and no later one was "
                  "saved: %s\n", (long long)w->bad_save, w->bad_msg);
  return 1;
}

/* The steps, a line each, then the run's JSON line; the exit status. */
static int train_steps(trainer *t, const train_flags *f, int64_t steps) {
  const model_train_config *cfg = &t->cfg;
  double first = NAN, last = NAN, ms_total = 0;
  int status = 0;
  save_watch w = {.bad_save = -1, .committed = t->resumed > 0 ? t->resumed : 0};
  const int64_t resumed0 = t->par.step;
  for (int64_t s = t->par.step; s < steps; s++) {
    model_step_info info;
    double t0 = newt_now_s();
    /* one rank: no communicators; the step's end downloads its loss, so its time is the device's */
    if (model_loader_fetch(&t->ld, t->cursor, cfg->batch, t->inputs, t->targets) != NEWT_OK ||
        model_par_step(&t->par, NULL, t->inputs, t->targets, cfg->batch, &info) != NEWT_OK) {
      fprintf(stderr, "newt train: step %lld: %s\n", (long long)s + 1, newt_errmsg());
      status = 1;
      break;
    }
    t->cursor += (uint64_t)cfg->batch;
    info.ms = (newt_now_s() - t0) * 1e3;
    if (s == t->resumed || s == 0) first = info.loss;
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
    if (t->saver) ckpt_after_step(t, f, info.step, &w);
    if (t->steplog >= 0) {
      job_step line = {.step = info.step, .loss = info.loss, .lr = info.lr, .grad_norm = info.grad_norm,
                       .tokens_per_s = (double)info.tokens / (info.ms / 1e3), .world = 1, .dp = 1,
                       .generation = 1, .t_ms = newt_wall_ms(), .ckpt = w.committed};
      if (job_steplog_append(t->steplog, &line) != NEWT_OK)
        fprintf(stderr, "newt train: --log %s: %s\n", f->log_path, newt_errmsg());
    }
    if (newt_stop_requested()) {
      fprintf(stderr, "newt train: stopping after step %lld (signal)\n", (long long)info.step);
      break;
    }
  }
  printf("{\"steps\":%lld,\"first_loss\":%.6f,\"final_loss\":%.6f,\"samples_consumed\":%llu,\"ms_per_step\":%.2f}\n",
         (long long)t->par.step, first, last, (unsigned long long)t->cursor,
         t->par.step > resumed0 ? ms_total / (double)(t->par.step - resumed0) : 0.0);
  return ckpt_finish(t, &w) ? 1 : status;
}

/* The first lines: the model, the batch, the device and the data; the step resumed at. */
static void say_start(const trainer *t, const newt_spec *spec, const char *ckpt_dir) {
  const model_config *m = &t->cfg.model;
  printf("newt train: %s (V %lld, ctx %lld, L %lld, NH %lld, C %lld), %zu parameters, batch %d "
         "(micro-batch %d) x T %d, %s, data %s (%llu tokens, %llu samples per epoch)\n",
         spec->preset, (long long)m->vocab, (long long)m->ctx, (long long)m->layers, (long long)m->heads,
         (long long)m->channels, t->par.global.nparams, t->cfg.batch, t->cfg.micro_batch, t->cfg.seq_len,
         model_dev_name(t->par.dev), spec->data_path[0] ? spec->data_path : "generated",
         (unsigned long long)t->tok.count, (unsigned long long)t->ld.windows);
  fflush(stdout);
  if (t->resumed >= 0) printf("newt train: resumed at step %lld from %s\n", (long long)t->resumed, ckpt_dir);
  fflush(stdout);
}

int newt_cmd_train(int argc, char **argv) {
  train_flags f;
  spec_flags sf;
  int rc = parse_flags(argc, argv, &f, &sf);
  if (rc >= 0) return rc;
  newt_spec spec;
  trainer t;
  memset(&t, 0, sizeof t);
  t.steplog = -1;
  t.resumed = -1;
  int gpu = -1;
  if (build_spec(&f, &sf, &spec, &t.cfg, &gpu) != 0) return 2;
  spec_data_desc(&spec, t.data_desc, sizeof t.data_desc);
  newt_result_t res = trainer_open(&t, &spec, gpu);
  if (res == NEWT_OK && f.ckpt_dir) res = train_ckpt_open(&t, &f);
  if (res == NEWT_OK && f.log_path && (res = job_runlog_open(f.log_path, 0, &t.steplog)) != NEWT_OK)
    res = newt_err_wrap(res, "--log: ");
  int status = 1;
  if (res != NEWT_OK) {
    fprintf(stderr, "newt train: %s\n", newt_errmsg());
  } else {
    say_start(&t, &spec, f.ckpt_dir);
    status = train_steps(&t, &f, spec.steps);
  }
  trainer_free(&t);
  return status;
}
