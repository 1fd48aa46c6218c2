/* newt bench ckpt: saves and loads a state of a given size and prints one JSON line.
 *
 *   newt bench ckpt [--bytes N] [--threads T] [--level L] [--kind train|fp32|bf16]
 *                   [--chunk BYTES] [--repeat R] [--dir DIR] [--keep-dir] [--warm]
 *
 * Kinds: fp32 and bf16 are GPT-shaped tensors with weight-like values (about N(0, 0.02));
 * train is a real training state: newt's GPT (the small preset, widened and deepened to
 * the size asked) after a few real AdamW steps on the generated corpus, its weights and
 * both moments (see make_train_state).
 * Each repeat does a synchronous save (compression, writes, fsync, index, manifest,
 * `latest`: all of it timed), an asynchronous save (the caller's stall is the snapshot
 * copy; the rest runs behind it), and a load of every tensor, checked bit for bit. The
 * page cache is dropped before each load when /proc/sys/vm/drop_caches can be written
 * ("cache":"cold"), otherwise (or with --warm) the load reads what the page cache holds
 * ("cache":"warm"; shard files are written with O_DIRECT, so little). Medians are
 * reported: save_GBps = state_bytes / sync save time, load_GBps = state_bytes / load
 * time, ratio = state_bytes / shard file bytes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "ckpt/ckpt.h"
#include "common/fs.h"
#include "common/json.h"
#include "common/opts.h"
#include "common/strutil.h"
#include "gpt/ckpt.h"
#include "model/ops.h"
#include "model/tokens.h"
#include "model/train.h"

typedef struct bstate {
  newt_tensor_desc *t;
  char **names;
  void **data; /* owned, except for the train kind (the trainer's buffers) */
  size_t n, cap;
  uint64_t bytes;
  model_trainer *tr;
} bstate;

static uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1DULL;
}

/* About N(0, 1): the sum of four uniforms from one 64-bit draw (Irwin-Hall), rescaled. */
static float gauss(uint64_t *s) {
  uint64_t r = rng_next(s);
  double u = (double)(r & 0xffff) + (double)((r >> 16) & 0xffff) + (double)((r >> 32) & 0xffff) + (double)(r >> 48);
  return (float)((u / 65535.0 - 2.0) * 1.7320508);
}

static int add_tensor(bstate *st, const char *name, newt_dtype dt, int ndim, int64_t d0, int64_t d1, void *ext) {
  if (st->n == st->cap) {
    st->cap = st->cap ? st->cap * 2 : 64;
    st->t = realloc(st->t, st->cap * sizeof *st->t);
    st->names = realloc(st->names, st->cap * sizeof *st->names);
    st->data = realloc(st->data, st->cap * sizeof *st->data);
    if (!st->t || !st->names || !st->data) return -1;
  }
  newt_tensor_desc *t = &st->t[st->n];
  memset(t, 0, sizeof *t);
  st->names[st->n] = newt_strdup(name);
  t->name = st->names[st->n];
  t->dtype = dt;
  t->ndim = ndim;
  t->shape[0] = d0;
  t->shape[1] = d1;
  size_t bytes = (size_t)newt_shape_numel(ndim, t->shape) * newt_dtype_size(dt);
  st->data[st->n] = ext ? ext : malloc(bytes ? bytes : 1);
  if (!st->data[st->n] || !t->name) return -1;
  st->bytes += bytes;
  st->n++;
  return 0;
}

/* Weight-like initial values: layernorm weights near 1, biases near 0, matrices N(0, 0.02). */
static void init_values(float *w, size_t n, const char *name, uint64_t *rng) {
  int ln = strstr(name, "ln") != NULL, bias = name[strlen(name) - 1] == 'b';
  for (size_t i = 0; i < n; i++) {
    float g = gauss(rng);
    w[i] = ln && !bias ? 1.0f + 0.05f * g : bias ? 0.002f * g : 0.02f * g;
  }
}

/* GPT-2-like shapes scaled so that the weights hold `params` elements. */
static int make_shapes(bstate *st, int64_t params, newt_dtype dt, const char *prefix) {
  int64_t C = (int64_t)sqrt((double)params / 144.0) / 64 * 64;
  if (C < 64) C = 64;
  int64_t V = params * 15 / 100 / C, T = 256;
  if (V < 1) V = 1;
  int64_t L = (params - (V + T) * C) / (12 * C * C + 13 * C);
  if (L < 1) L = 1;
  char name[128];
#define T2(n, a, b) (snprintf(name, sizeof name, "%s%s", prefix, n), add_tensor(st, name, dt, 2, a, b, NULL))
#define T1(n, a) (snprintf(name, sizeof name, "%s%s", prefix, n), add_tensor(st, name, dt, 1, a, 0, NULL))
  if (T2("wte", V, C) || T2("wpe", T, C)) return -1;
  for (int64_t l = 0; l < L; l++) {
    char n[96];
#define LN(s) (snprintf(n, sizeof n, "h.%lld.%s", (long long)l, s), n)
    if (T1(LN("ln1.w"), C) || T1(LN("ln1.b"), C) || T2(LN("attn.qkv.w"), 3 * C, C) || T1(LN("attn.qkv.b"), 3 * C) ||
        T2(LN("attn.proj.w"), C, C) || T1(LN("attn.proj.b"), C) || T1(LN("ln2.w"), C) || T1(LN("ln2.b"), C) ||
        T2(LN("mlp.fc.w"), 4 * C, C) || T1(LN("mlp.fc.b"), 4 * C) || T2(LN("mlp.proj.w"), C, 4 * C) ||
        T1(LN("mlp.proj.b"), C))
      return -1;
#undef LN
  }
  if (T1("lnf.w", C) || T1("lnf.b", C)) return -1;
#undef T1
#undef T2
  return 0;
}

/* A real training state of about `bytes` (weights + 2 moments, 12 bytes a parameter):
 * the small preset (V 256, ctx 256, 6 heads) at the widest C of 48 * 2^k that still gives
 * two layers or more, and as many layers as fill the size, after `steps` AdamW steps on
 * the generated corpus (batch 2 x 32 tokens). */
static int make_train_state(bstate *st, int64_t bytes, int threads) {
  const int steps = 3;
  model_train_config cfg;
  if (model_train_defaults(&cfg, "small", steps) != NEWT_OK) return -1;
  int64_t params = bytes / 12, C = 48;
  while (C < 4096 && 2 * 12 * (4 * C * C) <= params) C *= 2;
  int64_t L = (params - 512 * C) / (12 * C * C);
  cfg.model.channels = C;
  cfg.model.layers = L < 1 ? 1 : L;
  cfg.batch = cfg.micro_batch = 2;
  cfg.seq_len = 32;
  cfg.threads = threads;
  st->tr = calloc(1, sizeof *st->tr);
  if (!st->tr || model_trainer_init(st->tr, &cfg) != NEWT_OK) return -1;
  size_t nt = (size_t)1 << 16;
  char *text = malloc(nt);
  model_tokens tok;
  model_loader ld;
  if (!text) return -1;
  model_text_generate(7, text, nt);
  newt_result_t r = model_tokens_from_memory(&tok, text, 1, nt, 256);
  free(text);
  if (r != NEWT_OK) return -1;
  if (model_loader_init(&ld, &tok, cfg.seq_len, 1, cfg.model.vocab) != NEWT_OK) r = NEWT_ERR_INVALID;
  for (int k = 0; k < steps && r == NEWT_OK; k++) {
    model_step_info info;
    r = model_trainer_step_data(st->tr, &ld, &info);
    fprintf(stderr, "bench ckpt: training step %d: loss %.4f\n", k + 1, info.loss);
  }
  model_tokens_close(&tok);
  if (r != NEWT_OK) return -1;
  const model_layout *lay = &st->tr->gpt.layout;
  for (int g = 0; g < 3; g++)
    for (size_t i = 0; i < lay->n; i++) {
      const model_tensor *t = &lay->tensors[i];
      float *base = g == 0 ? st->tr->gpt.params : g == 1 ? st->tr->opt.m : st->tr->opt.v;
      char name[96];
      snprintf(name, sizeof name, "%s%s", g == 0 ? "" : g == 1 ? MODEL_PAR_NAME_M : MODEL_PAR_NAME_V, t->name);
      if (add_tensor(st, name, NEWT_F32, t->ndim, (int64_t)t->shape[0], (int64_t)t->shape[1], base + t->offset))
        return -1;
    }
  return 0;
}

/* The state of a run: fp32/bf16 weight-like tensors, or (train) a real training state. */
static int make_state(bstate *st, const char *kind, int64_t bytes, int threads) {
  uint64_t rng = 0x9E3779B97F4A7C15ULL;
  if (strcmp(kind, "train") == 0) return make_train_state(st, bytes, threads);
  if (strcmp(kind, "fp32") != 0 && strcmp(kind, "bf16") != 0) return -2;
  int bf = kind[0] == 'b';
  if (make_shapes(st, bytes / (bf ? 2 : 4), bf ? NEWT_BF16 : NEWT_F32, "")) return -1;
  for (size_t i = 0; i < st->n; i++) {
    size_t n = (size_t)newt_shape_numel(st->t[i].ndim, st->t[i].shape);
    if (!bf) {
      init_values(st->data[i], n, st->t[i].name, &rng);
      continue;
    }
    float *tmp = malloc(n * sizeof *tmp);
    if (!tmp) return -1;
    init_values(tmp, n, st->t[i].name, &rng);
    uint16_t *h = st->data[i];
    for (size_t k = 0; k < n; k++) h[k] = newt_f32_to_bf16(tmp[k]);
    free(tmp);
  }
  return 0;
}

static void free_state(bstate *st) {
  for (size_t i = 0; i < st->n; i++) {
    free(st->names[i]);
    if (!st->tr) free(st->data[i]);
  }
  if (st->tr) model_trainer_free(st->tr);
  free(st->tr);
  free(st->t);
  free(st->names);
  free(st->data);
}

static int dbl_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, dbl_cmp);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int drop_caches(void) {
  sync();
  FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
  if (!f) return 0;
  int ok = fputs("3\n", f) >= 0;
  ok = fclose(f) == 0 && ok;
  return ok;
}

static newt_result_t save_all(ckpt_saver *s, const bstate *st, int64_t step, int async) {
  int started = 0;
  NEWT_CHECK(ckpt_save_begin(s, step, async, &started));
  if (!started) return NEWT_ERR(NEWT_ERR_INTERNAL, "save of step %lld skipped", (long long)step);
  for (size_t i = 0; i < st->n; i++) NEWT_CHECK(ckpt_save_add(s, &st->t[i], NULL, st->data[i]));
  cJSON *state = cJSON_CreateObject();
  NEWT_CHECK_ALLOC(state);
  newt_json_add_int(state, "step", step);
  cJSON_AddBoolToObject(state, "bench", 1);
  newt_result_t r = ckpt_save_end(s, state);
  cJSON_Delete(state);
  return r;
}

/* The times of each repeat, seconds */
typedef struct bench_times {
  double *save, *load, *stall, *async;
  int warm; /* --warm: the page cache is kept */
  int cold; /* the last load's page cache was dropped */
} bench_times;

/* Repeat k: a synchronous save, an asynchronous one (its stall and its whole), and a load of
 * the synchronous one, checked bit for bit against the state; its times into t. */
static newt_result_t one_repeat(ckpt_saver *ss, ckpt_saver *as, const bstate *st, int64_t k, const char *sync_dir,
                                int threads, ckpt_request *reqs, void **outs, bench_times *t, uint64_t *file_bytes) {
  sync();
  double t0 = newt_now_s();
  newt_result_t r = save_all(ss, st, k + 1, 0);
  t->save[k] = newt_now_s() - t0;
  NEWT_CHECK(r);
  ckpt_save_status ssst;
  ckpt_saver_status(ss, &ssst);
  *file_bytes = ssst.file_bytes;

  sync();
  t0 = newt_now_s();
  r = save_all(as, st, k + 1, 1);
  t->stall[k] = newt_now_s() - t0;
  if (r == NEWT_OK) r = ckpt_save_wait(as, NEWT_DEADLINE_NONE);
  t->async[k] = newt_now_s() - t0;
  NEWT_CHECK(r);

  t->cold = !t->warm && drop_caches();
  ckpt_loaded ld;
  t0 = newt_now_s();
  r = ckpt_load(sync_dir, CKPT_LATEST, threads, reqs, st->n, &ld);
  t->load[k] = newt_now_s() - t0;
  NEWT_CHECK(r);
  cJSON_Delete(ld.state);
  for (size_t i = 0; i < st->n && r == NEWT_OK; i++) {
    size_t b = (size_t)newt_shape_numel(st->t[i].ndim, st->t[i].shape) * newt_dtype_size(st->t[i].dtype);
    if (memcmp(outs[i], st->data[i], b) != 0)
      r = NEWT_ERR(NEWT_ERR_INTERNAL, "tensor %s did not load back bit for bit", st->t[i].name);
    memset(outs[i], 0xff, b);
  }
  fprintf(stderr, "bench ckpt: repeat %lld: sync save %.3f s, async stall %.1f ms (total %.3f s), load %.3f s\n",
          (long long)k + 1, t->save[k], t->stall[k] * 1e3, t->async[k], t->load[k]);
  return r;
}

int newt_bench_ckpt(int argc, char **argv) {
  int64_t bytes = (int64_t)1 << 30, threads = 2, level = 1, chunk = 4 << 20, repeat = 3;
  const char *kind = "train", *dir = NULL;
  int keep_dir = 0, warm = 0;
  newt_opt opts[] = {
      {"bytes", NEWT_OPT_SIZE, &bytes, "size of the state"},
      {"threads", NEWT_OPT_INT, &threads, "compression / decompression threads"},
      {"level", NEWT_OPT_INT, &level, "zstd level (0: store raw)"},
      {"kind", NEWT_OPT_STR, &kind, "train (weights + AdamW moments), fp32 or bf16"},
      {"chunk", NEWT_OPT_SIZE, &chunk, "raw bytes per chunk"},
      {"repeat", NEWT_OPT_INT, &repeat, "repeats (medians are reported)"},
      {"dir", NEWT_OPT_STR, &dir, "checkpoint directory (default: a fresh one under /tmp)"},
      {"keep-dir", NEWT_OPT_FLAG, &keep_dir, "leave the checkpoints on disk"},
      {"warm", NEWT_OPT_FLAG, &warm, "load from the page cache (do not drop it first)"},
      NEWT_OPT_END};
  int ex = newt_opts_exit(newt_opts_parse("bench ckpt", NULL, opts, argc, argv, NULL, 0, NULL));
  if (ex >= 0) return ex;
  if (bytes < 4096 || threads < 1 || repeat < 1 || level < 0) {
    fprintf(stderr, "newt bench ckpt: --bytes at least 4096, --threads and --repeat at least 1, --level >= 0\n");
    return 2;
  }
  char dbuf[256];
  if (!dir) {
    snprintf(dbuf, sizeof dbuf, "/tmp/newt-bench-ckpt-%d", (int)getpid());
    dir = dbuf;
  }
  bstate st = {0};
  fprintf(stderr, "bench ckpt: building a %s state of %lld bytes\n", kind, (long long)bytes);
  int mk = make_state(&st, kind, bytes, (int)threads);
  if (mk != 0) {
    fprintf(stderr, mk == -2 ? "newt bench ckpt: --kind is train, fp32 or bf16, not \"%s\"\n"
                             : "newt bench ckpt: out of memory building the %s state\n", kind);
    free_state(&st);
    return mk == -2 ? 2 : 1;
  }
  char sync_dir[300], async_dir[300];
  snprintf(sync_dir, sizeof sync_dir, "%s/sync", dir);
  snprintf(async_dir, sizeof async_dir, "%s/async", dir);
  ckpt_saver_opts so = {.dir = sync_dir, .rank = 0, .nranks = 1, .threads = (int)threads, .level = (int)level,
                        .chunk_bytes = (size_t)chunk, .commit = 1, .keep = 1,
                        .layout = {.has = CKPT_LAYOUT_SHAPE, .dp = 1, .tp = 1, .pp = 1}};
  if (level == 0) so.level = CKPT_LEVEL_RAW;
  ckpt_saver_opts ao = so;
  ao.dir = async_dir;
  ao.staging_bytes = st.bytes;
  ckpt_saver *ss = NULL, *as = NULL;
  ckpt_request *reqs = calloc(st.n, sizeof *reqs);
  void **outs = calloc(st.n, sizeof *outs);
  double *t_save = calloc((size_t)repeat, sizeof(double)), *t_load = calloc((size_t)repeat, sizeof(double));
  double *t_stall = calloc((size_t)repeat, sizeof(double)), *t_async = calloc((size_t)repeat, sizeof(double));
  int rc = 1, cold = 1;
  uint64_t file_bytes = 0;
  newt_result_t r = ckpt_saver_init(&ss, &so);
  if (r == NEWT_OK) r = ckpt_saver_init(&as, &ao);
  if (r == NEWT_OK && (!reqs || !outs || !t_save || !t_load || !t_stall || !t_async))
    r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; r == NEWT_OK && i < st.n; i++) {
    size_t b = (size_t)newt_shape_numel(st.t[i].ndim, st.t[i].shape) * newt_dtype_size(st.t[i].dtype);
    outs[i] = malloc(b ? b : 1);
    if (!outs[i]) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
    else memset(outs[i], 0xff, b);
    reqs[i].t = st.t[i];
    reqs[i].out = outs[i];
    newt_slice_whole(&reqs[i].slice, &st.t[i]);
  }
  bench_times bt = {t_save, t_load, t_stall, t_async, .warm = warm};
  for (int64_t k = 0; r == NEWT_OK && k < repeat; k++) {
    r = one_repeat(ss, as, &st, k, sync_dir, (int)threads, reqs, outs, &bt, &file_bytes);
    cold = bt.cold && cold;
  }
  if (r == NEWT_OK) {
    int n = (int)repeat;
    double save = median(t_save, n), load = median(t_load, n), stall = median(t_stall, n), async = median(t_async, n);
    printf("{\"bench\":\"ckpt\",\"kind\":\"%s\",\"state_bytes\":%llu,\"file_bytes\":%llu,\"ratio\":%.4f,"
           "\"save_GBps\":%.3f,\"load_GBps\":%.3f,\"stall_ms\":%.2f,\"sync_save_ms\":%.1f,\"async_save_ms\":%.1f,"
           "\"stall_pct\":%.2f,\"threads\":%lld,\"level\":%lld,\"chunk_bytes\":%lld,\"tensors\":%zu,"
           "\"cache\":\"%s\",\"repeat\":%lld}\n",
           kind, (unsigned long long)st.bytes, (unsigned long long)file_bytes,
           file_bytes ? (double)st.bytes / (double)file_bytes : 0.0, (double)st.bytes / save / 1e9,
           (double)st.bytes / load / 1e9, stall * 1e3, save * 1e3, async * 1e3, 100.0 * stall / save,
           (long long)threads, (long long)level, (long long)chunk, st.n, cold ? "cold" : "warm", (long long)repeat);
    fflush(stdout);
    rc = 0;
  } else {
    fprintf(stderr, "newt bench ckpt: %s\n", newt_errmsg());
  }
  ckpt_saver_free(ss);
  ckpt_saver_free(as);
  for (size_t i = 0; outs && i < st.n; i++) free(outs[i]);
  free(outs);
  free(reqs);
  free(t_save);
  free(t_load);
  free(t_stall);
  free(t_async);
  free_state(&st);
  if (!keep_dir && newt_fs_rm_rf(dir) != NEWT_OK) fprintf(stderr, "newt bench ckpt: %s\n", newt_errmsg());
  return rc;
}
