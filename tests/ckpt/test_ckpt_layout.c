/* Layout independence: a small GPT's weights and AdamW moments are sharded the way data,
 * tensor and pipeline groups and ZeRO stages shard them, saved by several ranks at once
 * (threads, and once separate processes), and loaded under every other layout; every
 * tensor piece must come back bit for bit. Several model sizes, odd ones included.
 *
 * Layout (tp, pp, dp, zero). Rank r has coordinates d = r / (pp*tp), p = r / tp % pp,
 * t = r % tp. Stage p holds layers [p*L/pp, (p+1)*L/pp), stage 0 the embeddings, the last
 * stage the final layernorm. Tensor parallelism splits qkv and fc weights by rows
 * (column-parallel), attn.proj and mlp.proj weights by columns (row-parallel), wte by rows
 * (vocab-parallel), in uneven parts when sizes do not divide; the rest is replicated and
 * written by t == 0. A (p, t) rank's local tensors, one after another, form its flat
 * buffer; with ZeRO the dp ranks own the uneven ranges [d*N/dp, (d+1)*N/dp) of it: moments
 * from stage 1, weights too at stage 3. Without ZeRO, dp rank 0 writes. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "common/fs.h"
#include "test.h"

enum { REPL, COLP, ROWP, VOCAB };

typedef struct gt {
  newt_tensor_desc d;
  char name[96];
  int kind;
  int layer; /* -1: embeddings (stage 0), -2: final layernorm (last stage) */
  uint32_t *data;
} gt;

typedef struct model {
  int64_t V, C, L, T;
  gt *t;
  size_t n;
} model;

typedef struct layout {
  int tp, pp, dp, zero;
} layout;

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

static void add(model *m, const char *prefix, const char *name, int kind, int layer, int nd, int64_t a, int64_t b) {
  gt *t = &m->t[m->n++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s%s", prefix, name);
  t->d.name = t->name;
  t->d.dtype = NEWT_F32;
  t->d.ndim = nd;
  t->d.shape[0] = a;
  t->d.shape[1] = b;
  t->kind = kind;
  t->layer = layer;
  size_t n = (size_t)newt_shape_numel(nd, t->d.shape);
  t->data = malloc(n * 4);
  uint64_t seed = mix(m->n * 7919 + (uint64_t)m->C);
  int noisy = seed % 3 == 0; /* some tensors are random bits: stored raw */
  for (size_t i = 0; i < n; i++) {
    uint64_t r = mix(seed + i);
    if (noisy) {
      t->data[i] = (uint32_t)r;
    } else {
      float f = 0.02f * ((float)(r % 2001) - 1000.0f) / 1000.0f;
      memcpy(&t->data[i], &f, 4);
    }
  }
  if (n > 3) {
    t->data[0] = 0x80000000u; /* -0 */
    t->data[1] = 0x7fc0beefu; /* NaN with a payload */
    t->data[2] = 0x00000007u; /* denormal */
  }
}

static void make_model(model *m, int64_t V, int64_t C, int64_t L, int64_t T) {
  memset(m, 0, sizeof *m);
  m->V = V, m->C = C, m->L = L, m->T = T;
  m->t = calloc((size_t)(3 * (4 + 12 * L)), sizeof *m->t);
  const char *pre[3] = {"", "adam.m/", "adam.v/"};
  for (int k = 0; k < 3; k++) {
    add(m, pre[k], "wte", VOCAB, -1, 2, V, C);
    add(m, pre[k], "wpe", REPL, -1, 2, T, C);
    for (int64_t l = 0; l < L; l++) {
      char n[64];
#define LAYER(s, kind, nd, a, b) (snprintf(n, sizeof n, "h.%lld.%s", (long long)l, s), add(m, pre[k], n, kind, (int)l, nd, a, b))
      LAYER("ln1.w", REPL, 1, C, 0);
      LAYER("ln1.b", REPL, 1, C, 0);
      LAYER("attn.qkv.w", COLP, 2, 3 * C, C);
      LAYER("attn.qkv.b", COLP, 1, 3 * C, 0);
      LAYER("attn.proj.w", ROWP, 2, C, C);
      LAYER("attn.proj.b", REPL, 1, C, 0);
      LAYER("ln2.w", REPL, 1, C, 0);
      LAYER("ln2.b", REPL, 1, C, 0);
      LAYER("mlp.fc.w", COLP, 2, 4 * C, C);
      LAYER("mlp.fc.b", COLP, 1, 4 * C, 0);
      LAYER("mlp.proj.w", ROWP, 2, C, 4 * C);
      LAYER("mlp.proj.b", REPL, 1, C, 0);
#undef LAYER
    }
    add(m, pre[k], "lnf.w", REPL, -2, 1, C, 0);
    add(m, pre[k], "lnf.b", REPL, -2, 1, C, 0);
  }
}

static void free_model(model *m) {
  for (size_t i = 0; i < m->n; i++) free(m->t[i].data);
  free(m->t);
}

/* The elements of slice s of tensor t, independently of the library's copy code. */
static void extract(const gt *t, const newt_slice *s, uint32_t *out) {
  int nd = t->d.ndim;
  for (int64_t k = s->begin; k < s->end; k++) {
    int64_t rem = k, g = 0, idx[NEWT_SLICE_MAX_DIMS];
    for (int i = nd - 1; i >= 0; i--) {
      idx[i] = rem % s->shape[i];
      rem /= s->shape[i];
    }
    for (int i = 0; i < nd; i++) g = g * t->d.shape[i] + s->offset[i] + idx[i];
    out[k - s->begin] = t->data[g];
  }
}

static int on_stage(const model *m, const gt *t, int p, int pp) {
  if (t->layer == -1) return p == 0;
  if (t->layer == -2) return p == pp - 1;
  return t->layer >= p * m->L / pp && t->layer < (p + 1) * m->L / pp;
}

/* The tensor-parallel box of t at tp rank tr; 0 when the rank holds none of it. */
static int tp_box(const gt *t, int tr, int tp, newt_slice *s) {
  newt_slice_whole(s, &t->d);
  int dim = t->kind == COLP || t->kind == VOCAB ? 0 : t->kind == ROWP ? 1 : -1;
  if (dim < 0 || tp == 1) return 1;
  int64_t n = t->d.shape[dim], a = tr * n / tp, b = (tr + 1) * n / tp;
  if (a == b) return 0;
  s->offset[dim] = a;
  s->shape[dim] = b - a;
  s->begin = 0;
  s->end = newt_shape_numel(s->ndim, s->shape);
  return 1;
}

static int is_moment(const gt *t) { return strncmp(t->name, "adam.", 5) == 0; }

/* One piece a rank stores or needs. */
typedef struct need {
  const gt *t;
  newt_slice s;
} need;

/* What rank r of layout lo holds: `writing` = 1 gives the deduplicated set it writes,
 * 0 the set it reads back (replicas included). */
static size_t rank_pieces(const model *m, const layout *lo, int r, int writing, need *out) {
  int d = r / (lo->pp * lo->tp), p = r / lo->tp % lo->pp, t = r % lo->tp;
  size_t n = 0;
  for (int group = 0; group < 3; group++) { /* weights, adam.m, adam.v: one flat buffer each */
    newt_slice boxes[512];
    const gt *owner[512];
    size_t nb = 0;
    for (size_t i = 0; i < m->n; i++) {
      const gt *x = &m->t[i];
      int g = !is_moment(x) ? 0 : strncmp(x->name, "adam.m/", 7) == 0 ? 1 : 2;
      if (g != group || !on_stage(m, x, p, lo->pp)) continue;
      if (tp_box(x, t, lo->tp, &boxes[nb])) owner[nb++] = x;
    }
    int sharded = group == 0 ? lo->zero >= 3 : lo->zero >= 1;
    if (!sharded) {
      if (writing && d != 0) continue;
      for (size_t i = 0; i < nb; i++) {
        if (writing && owner[i]->kind == REPL && t != 0) continue;
        out[n++] = (need){owner[i], boxes[i]};
      }
      continue;
    }
    int64_t total = 0;
    for (size_t i = 0; i < nb; i++) total += newt_shape_numel(boxes[i].ndim, boxes[i].shape);
    int64_t a = d * total / lo->dp, b = (d + 1) * total / lo->dp;
    newt_flat_piece fp[512];
    size_t nf = 0;
    T_OK(newt_flat_pieces(boxes, nb, a, b - a, fp, 512, &nf));
    for (size_t i = 0; i < nf; i++) {
      if (writing && owner[fp[i].tensor]->kind == REPL && t != 0) continue;
      out[n++] = (need){owner[fp[i].tensor], fp[i].slice};
    }
  }
  return n;
}


typedef struct save_arg {
  const model *m;
  const layout *lo;
  const char *dir;
  int rank, async;
  int64_t step;
  size_t chunk;
  newt_result_t res;
  char msg[512];
} save_arg;

static newt_result_t save_rank(save_arg *a) {
  int nranks = a->lo->tp * a->lo->pp * a->lo->dp;
  char lj[128];
  snprintf(lj, sizeof lj, "{\"tp\":%d,\"pp\":%d,\"dp\":%d,\"zero\":%d}", a->lo->tp, a->lo->pp, a->lo->dp, a->lo->zero);
  ckpt_saver_opts o = {.dir = a->dir, .rank = a->rank, .nranks = nranks, .threads = 2, .level = 1,
                       .chunk_bytes = a->chunk, .commit = a->rank == 0, .keep = 2, .commit_timeout_ms = 60000,
                       .attempt = 0x5eed0000u + (uint64_t)a->step,
                       .layout = {.has = CKPT_LAYOUT_SHAPE, .dp = a->lo->dp, .tp = a->lo->tp, .pp = a->lo->pp,
                                  .zero = a->lo->zero}};
  ckpt_saver *s;
  NEWT_CHECK(ckpt_saver_init(&s, &o));
  need *pieces = malloc(4096 * sizeof *pieces);
  size_t n = rank_pieces(a->m, a->lo, a->rank, 1, pieces);
  uint32_t **bufs = calloc(n ? n : 1, sizeof *bufs);
  int started = 0;
  newt_result_t r = ckpt_save_begin(s, a->step, a->async, &started);
  for (size_t i = 0; r == NEWT_OK && i < n; i++) {
    bufs[i] = malloc((size_t)newt_slice_numel(&pieces[i].s) * 4);
    extract(pieces[i].t, &pieces[i].s, bufs[i]);
    r = ckpt_save_add(s, &pieces[i].t->d, &pieces[i].s, bufs[i]);
  }
  char state[256];
  snprintf(state, sizeof state, "{\"step\":%lld,\"cursor\":{\"pos\":%lld},\"saved_with\":%s}", (long long)a->step,
           (long long)a->step * 8, lj);
  cJSON *st = cJSON_Parse(state);
  if (r == NEWT_OK) r = st ? ckpt_save_end(s, st) : NEWT_ERR(NEWT_ERR_INVALID, "test state %s", state);
  cJSON_Delete(st);
  if (r == NEWT_OK && a->async) {
    for (size_t i = 0; i < n; i++) memset(bufs[i], 0xee, (size_t)newt_slice_numel(&pieces[i].s) * 4); /* after the snapshot */
    r = ckpt_save_wait(s, newt_deadline_in_ms(60000));
  }
  if (r != NEWT_OK) snprintf(a->msg, sizeof a->msg, "%s", newt_errmsg());
  ckpt_saver_free(s);
  for (size_t i = 0; i < n; i++) free(bufs[i]);
  free(bufs);
  free(pieces);
  return r;
}

static void *save_thread(void *p) {
  save_arg *a = p;
  a->res = save_rank(a);
  return NULL;
}

/* Every rank of lo saves its shard, as threads or as processes. */
static int save_layout(const model *m, const layout *lo, const char *dir, int64_t step, size_t chunk, int procs,
                       int async) {
  int n = lo->tp * lo->pp * lo->dp, ok = 1;
  save_arg *args = calloc((size_t)n, sizeof *args);
  pthread_t *th = calloc((size_t)n, sizeof *th);
  pid_t *pids = calloc((size_t)n, sizeof *pids);
  for (int r = 0; r < n; r++) {
    args[r] = (save_arg){.m = m, .lo = lo, .dir = dir, .rank = r, .async = async && r % 2 == 0, .step = step, .chunk = chunk};
    if (!procs) {
      pthread_create(&th[r], NULL, save_thread, &args[r]);
      continue;
    }
    fflush(NULL);
    pids[r] = fork();
    if (pids[r] == 0) {
      newt_result_t res = save_rank(&args[r]);
      if (res != NEWT_OK) fprintf(stderr, "rank %d: %s\n", r, args[r].msg);
      _exit(res == NEWT_OK ? 0 : 1);
    }
  }
  for (int r = 0; r < n; r++) {
    if (!procs) {
      pthread_join(th[r], NULL);
      T_CHECK_MSG(args[r].res == NEWT_OK, "layout tp%d pp%d dp%d zero%d rank %d: %s", lo->tp, lo->pp, lo->dp,
                  lo->zero, r, args[r].msg);
      ok = ok && args[r].res == NEWT_OK;
      continue;
    }
    int st = 0;
    waitpid(pids[r], &st, 0);
    T_CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank process %d failed", r);
    ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  free(args);
  free(th);
  free(pids);
  return ok;
}

/* Every rank of lo reads what it needs from the newest checkpoint and compares. The first
 * rank goes through ckpt_load; the others share one reader (as ranks on one host could). */
static int load_layout(const model *m, const layout *lo, const char *dir, int64_t step, const layout *saved) {
  int n = lo->tp * lo->pp * lo->dp, bad = 0;
  need *pieces = malloc(4096 * sizeof *pieces);
  ckpt_reader *rd = NULL;
  newt_result_t res = ckpt_open(&rd, dir, CKPT_LATEST, 2);
  T_CHECK_MSG(res == NEWT_OK, "open %s: %s", dir, newt_errmsg());
  for (int r = 0; r < n && !bad && res == NEWT_OK; r++) {
    size_t np = rank_pieces(m, lo, r, 0, pieces);
    ckpt_request *reqs = calloc(np ? np : 1, sizeof *reqs);
    uint32_t **want = calloc(np ? np : 1, sizeof *want);
    for (size_t i = 0; i < np; i++) {
      size_t ne = (size_t)newt_slice_numel(&pieces[i].s);
      reqs[i] = (ckpt_request){.t = pieces[i].t->d, .slice = pieces[i].s, .out = malloc(ne * 4)};
      memset(reqs[i].out, 0xab, ne * 4);
      want[i] = malloc(ne * 4);
      extract(pieces[i].t, &pieces[i].s, want[i]);
    }
    if (r == 0) {
      ckpt_loaded ld;
      res = ckpt_load(dir, CKPT_LATEST, 2, reqs, np, &ld);
      if (res == NEWT_OK) {
        T_CHECK(ld.step == step && ld.fallbacks == 0);
        char expect[64];
        snprintf(expect, sizeof expect, "\"cursor\":{\"pos\":%lld}", (long long)step * 8);
        char *have = cJSON_PrintUnformatted(ld.state);
        T_CHECK_MSG(have && strstr(have, expect) != NULL, "state %s", have ? have : "(none)");
        free(have);
        cJSON_Delete(ld.state);
      }
    } else {
      res = ckpt_read_slices(rd, reqs, np);
    }
    T_CHECK_MSG(res == NEWT_OK, "load under tp%d pp%d dp%d zero%d, rank %d: %s", lo->tp, lo->pp, lo->dp, lo->zero, r,
                newt_errmsg());
    for (size_t i = 0; i < np && !bad && res == NEWT_OK; i++)
      if (memcmp(reqs[i].out, want[i], (size_t)newt_slice_numel(&pieces[i].s) * 4) != 0) {
        T_FAIL("saved under tp%d pp%d dp%d zero%d, loaded under tp%d pp%d dp%d zero%d: rank %d, \"%s\" differs",
               saved->tp, saved->pp, saved->dp, saved->zero, lo->tp, lo->pp, lo->dp, lo->zero, r, pieces[i].t->name);
        bad = 1;
      }
    for (size_t i = 0; i < np; i++) {
      free(reqs[i].out);
      free(want[i]);
    }
    free(reqs);
    free(want);
  }
  ckpt_close(rd);
  free(pieces);
  return !bad && res == NEWT_OK;
}

static const layout layouts[] = {
    {1, 1, 1, 0}, {2, 1, 1, 0}, {4, 1, 1, 0}, {1, 2, 1, 0}, {1, 4, 1, 0}, {2, 2, 2, 1},
    {1, 1, 3, 1}, {1, 1, 4, 3}, {1, 2, 3, 2}, {2, 4, 2, 3}, {4, 2, 1, 0}, {4, 1, 2, 1},
};
#define NLAYOUTS (sizeof layouts / sizeof layouts[0])

static char tmpdir[256];

static void run_size(int64_t V, int64_t C, int64_t L, int64_t T, size_t chunk) {
  model m;
  make_model(&m, V, C, L, T);
  for (size_t a = 0; a < NLAYOUTS; a++) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/V%lld-C%lld-%zu", tmpdir, (long long)V, (long long)C, a);
    int64_t step = 10 + (int64_t)a;
    if (!save_layout(&m, &layouts[a], dir, step, chunk, 0, a % 2)) continue;
    for (size_t b = 0; b < NLAYOUTS; b++)
      if (!load_layout(&m, &layouts[b], dir, step, &layouts[a])) break;
    newt_fs_rm_rf(dir);
  }
  free_model(&m);
}

static void test_odd_small(void) { run_size(61, 12, 4, 7, 4 << 20); }
static void test_odd_tiny_chunks(void) { run_size(97, 20, 2, 9, 300); } /* chunks of 75 floats */
static void test_medium(void) { run_size(257, 36, 4, 16, 1000); }
static void test_larger(void) { run_size(1003, 64, 4, 32, 64 << 10); }

/* Separate processes write the shards; a layout with every mode at once reads them. */
static void test_processes(void) {
  model m;
  make_model(&m, 131, 28, 4, 11);
  char dir[512];
  snprintf(dir, sizeof dir, "%s/procs", tmpdir);
  layout save = {2, 2, 2, 1}, load = {4, 1, 3, 3};
  if (save_layout(&m, &save, dir, 5, 777, 1, 1)) {
    T_CHECK(load_layout(&m, &load, dir, 5, &save));
    T_CHECK(load_layout(&m, &layouts[0], dir, 5, &save));
    /* saved again by processes under another layout: step 6 wins, both stay (keep 2) */
    T_CHECK(save_layout(&m, &load, dir, 6, 4 << 20, 1, 0));
    T_CHECK(load_layout(&m, &save, dir, 6, &load));
    ckpt_step_info *info;
    size_t n;
    T_OK(ckpt_list(dir, &info, &n));
    T_CHECK(n == 2 && info[0].step == 5 && info[1].step == 6 && info[1].latest && info[0].valid && info[1].valid);
    T_CHECK(n == 2 && info[0].nranks == 8 && info[1].nranks == 12);
    free(info);
  }
  free_model(&m);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/dev/shm/newt-test-ckpt-layout-XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  T_RUN(test_odd_small);
  T_RUN(test_odd_tiny_chunks);
  T_RUN(test_medium);
  T_RUN(test_larger);
  T_RUN(test_processes);
  newt_fs_rm_rf(tmpdir);
  return T_DONE();
}
