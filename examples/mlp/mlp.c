/* newt-mlp: a small model trained elastically under newt, written only against newt.h (and
 * OpenBLAS for its matrix products). docs/api.md walks through it.
 *
 *   newt run --nproc 4 [--zero 1] [--steps N] -- newt-mlp [--hidden H] [--lr LR] [--seed S]
 *                                                         [--start-delay-ms MS] [--slow-step N:MS]
 *
 * --start-delay-ms: a slow start-up on purpose (what building a large model or starting CUDA
 * costs), spent after the first generation's restore, before the first step.
 * --slow-step N:MS: a slow but healthy step on purpose (a straggler, a pause of the host):
 * rank 1 spends MS more in step N, before its gradients go to the others.
 *
 * The model: a two-layer perceptron (D inputs, H hidden units with tanh, C classes, softmax
 * cross-entropy) learning a fixed random teacher. Sample i's input is drawn by a
 * counter-based generator from (seed, i), its label is the teacher's argmax: every sample is
 * a pure function of its index, so the indices newt hands a rank are its whole data loader,
 * and no sample is lost or repeated however the job resizes.
 *
 * Its state: the parameters as one flat vector (W1 [H, D], b1 [H], W2 [C, H], b2 [C]), Adam's
 * two moments of the same length, and a running mean of the loss (bytes of the job). With
 * the job's ZeRO stage 0 every rank holds all of it (replicas). With 1 or more each
 * data-parallel rank owns a range of the vector: it keeps the moments of that range only,
 * updates that range of the parameters, and the ranks all-gather the parameters after the
 * update. The parameters are then declared twice: the owned range as state, the whole vector
 * as derived (rebuilt by the all-gather, never saved). Tensor and pipeline layouts are not
 * this model's: it refuses them. */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "newt.h"

#define D 32 /* inputs */
#define C 8  /* classes */

#define TRY(call)                         \
  do {                                    \
    newt_result_t r_ = (call);            \
    if (r_ != NEWT_OK) return r_;         \
  } while (0)

typedef struct model {
  int H;               /* hidden units */
  double lr;
  uint64_t seed;
  int64_t n;           /* parameters */
  float teacher[C * D];
} model;

/* One generation's buffers: the flat vectors, padded to chunk * dp for the all-gather. */
typedef struct state {
  int dp, dp_rank, zero;
  int64_t chunk, lo, hi;  /* the owned range [lo, hi) of [0, n) */
  float *params, *grads, *m, *v, *gather;
  double *ema;            /* running mean of the loss: declared state, so memory that lives as long
                             as the generation's buffers (never the stack) */
} state;

/* --- data ----------------------------------------------------------------------------------- */

/* A counter-based generator: uniform in [-1, 1) from (seed, i, j). */
static float uniform(uint64_t seed, uint64_t i, uint64_t j) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull ^ (i + 1) * 0xbf58476d1ce4e5b9ull ^ (j + 1) * 0x94d049bb133111ebull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Sample i: its input (D floats) and its label. */
static int sample(const model *md, int64_t i, float *x) {
  for (int d = 0; d < D; d++) x[d] = uniform(md->seed, (uint64_t)i, (uint64_t)d);
  int best = 0;
  float bv = -INFINITY;
  for (int c = 0; c < C; c++) {
    float s = 0;
    for (int d = 0; d < D; d++) s += md->teacher[c * D + d] * x[d];
    if (s > bv) bv = s, best = c;
  }
  return best;
}

/* --- the model: forward and backward of a micro-batch ------------------------------------------- */

/* Adds the gradients of samples [first, first + m) to g (scaled by 1 / global batch) and
 * returns their summed loss. */
static double micro_batch(const model *md, const float *p, float *g, int64_t first, int m, int64_t global_batch) {
  int H = md->H;
  const float *W1 = p, *b1 = p + H * D, *W2 = b1 + H, *b2 = W2 + C * H;
  float *gW1 = g, *gb1 = g + H * D, *gW2 = gb1 + H, *gb2 = gW2 + C * H;
  float *x = malloc(sizeof(float) * (size_t)m * (D + 2 * H + C)), *h = x + m * D, *dh = h + m * H, *z = dh + m * H;
  int *y = malloc(sizeof(int) * (size_t)m);
  if (!x || !y) {
    free(x), free(y);
    return NAN;
  }
  for (int s = 0; s < m; s++) y[s] = sample(md, first + s, x + s * D);
  /* h = tanh(x W1^T + b1), z = h W2^T + b2 */
  for (int s = 0; s < m; s++) memcpy(h + s * H, b1, sizeof(float) * (size_t)H), memcpy(z + s * C, b2, sizeof(float) * C);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, H, D, 1.0f, x, D, W1, D, 1.0f, h, H);
  for (int k = 0; k < m * H; k++) h[k] = tanhf(h[k]);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, C, H, 1.0f, h, H, W2, H, 1.0f, z, C);
  /* softmax cross-entropy; z becomes dz = (softmax - onehot) / global batch */
  double loss = 0;
  for (int s = 0; s < m; s++) {
    float *zs = z + s * C, mx = zs[0], sum = 0;
    for (int c = 1; c < C; c++) mx = zs[c] > mx ? zs[c] : mx;
    for (int c = 0; c < C; c++) sum += zs[c] = expf(zs[c] - mx);
    loss -= log(zs[y[s]] / sum);
    for (int c = 0; c < C; c++) zs[c] = (zs[c] / sum - (c == y[s])) / (float)global_batch;
  }
  /* gW2 += dz^T h, gb2 += sum dz, dh = (dz W2) (1 - h^2), gW1 += dh^T x, gb1 += sum dh */
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, H, m, 1.0f, z, C, h, H, 1.0f, gW2, H);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, H, C, 1.0f, z, C, W2, H, 0.0f, dh, H);
  for (int k = 0; k < m * H; k++) dh[k] *= 1.0f - h[k] * h[k];
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, D, m, 1.0f, dh, H, x, D, 1.0f, gW1, D);
  for (int s = 0; s < m; s++) {
    for (int c = 0; c < C; c++) gb2[c] += z[s * C + c];
    for (int u = 0; u < H; u++) gb1[u] += dh[s * H + u];
  }
  free(x), free(y);
  return loss;
}

/* The initial parameters, the same on every rank (from the seed). */
static void init_params(const model *md, float *p) {
  int64_t nw1 = (int64_t)md->H * D, nw2 = (int64_t)C * md->H;
  for (int64_t k = 0; k < md->n; k++) {
    float scale = k < nw1 ? 1.0f / sqrtf(D) : k < nw1 + md->H ? 0 : k < nw1 + md->H + nw2 ? 1.0f / sqrtf((float)md->H) : 0;
    p[k] = scale * uniform(md->seed + 1, 0, (uint64_t)k);
  }
}

/* --- a generation ------------------------------------------------------------------------------ */

static void state_free(state *s) {
  free(s->params), free(s->grads), free(s->m), free(s->v), free(s->gather), free(s->ema);
  memset(s, 0, sizeof *s);
}

/* A part of a 1-D tensor of n floats: elements [lo, hi) of it. */
static newt_result_t declare(newt_ctx *c, const char *name, int64_t n, float *data, int64_t lo, int64_t hi,
                             unsigned flags) {
  if (lo >= hi) return NEWT_OK; /* this rank owns none of it */
  newt_tensor t;
  newt_tensor_init(&t);
  t.name = name;
  t.dtype = NEWT_F32;
  t.ndim = 1;
  t.shape = &n;
  t.begin = lo;
  t.end = hi;
  t.data = data;
  t.bytes = (size_t)(hi - lo) * sizeof(float);
  t.flags = flags;
  return newt_state_tensor(c, &t);
}

/* The buffers for the new layout, the state declared on them and restored (from the last
 * generation's buffers, peers, a checkpoint; or initialised on a new job). */
static newt_result_t generation(newt_ctx *c, const model *md, int zero, state *s, newt_layout *l) {
  if (l->tp > 1 || l->pp > 1) {
    fprintf(stderr, "newt-mlp: trains data-parallel only: the job asks for tp %d and pp %d\n", l->tp, l->pp);
    return NEWT_ERR_INVALID;
  }
  state ns = {.dp = l->dp, .dp_rank = l->dp_rank, .zero = zero > 0};
  ns.chunk = (md->n + l->dp - 1) / l->dp;
  ns.lo = ns.zero ? (int64_t)l->dp_rank * ns.chunk : 0;
  ns.hi = ns.zero ? ns.lo + ns.chunk : md->n;
  if (ns.hi > md->n) ns.hi = md->n;
  size_t padded = (size_t)(ns.chunk * l->dp);
  ns.params = calloc(padded, sizeof(float));
  ns.grads = calloc(padded, sizeof(float));
  ns.gather = calloc(padded, sizeof(float));
  ns.m = calloc(padded, sizeof(float));
  ns.v = calloc(padded, sizeof(float));
  ns.ema = calloc(1, sizeof(double));
  if (!ns.params || !ns.grads || !ns.gather || !ns.m || !ns.v || !ns.ema) {
    state_free(&ns);
    return NEWT_ERR_NOMEM;
  }
  newt_result_t r = NEWT_OK;
  if (ns.zero) { /* the owned range, and the whole vector the all-gather rebuilds */
    r = declare(c, "params", md->n, ns.params + ns.lo, ns.lo, ns.hi, 0);
    if (r == NEWT_OK) r = declare(c, "params", md->n, ns.params, 0, md->n, NEWT_TENSOR_DERIVED);
  } else {
    r = declare(c, "params", md->n, ns.params, 0, md->n, 0);
  }
  if (r == NEWT_OK) r = declare(c, "adam.m", md->n, ns.m + ns.lo, ns.lo, ns.hi, 0);
  if (r == NEWT_OK) r = declare(c, "adam.v", md->n, ns.v + ns.lo, ns.lo, ns.hi, 0);
  if (r == NEWT_OK) r = newt_state_bytes(c, "loss_ema", NEWT_PER_JOB, ns.ema, sizeof *ns.ema);
  newt_restore_info ri = {.size = sizeof ri};
  if (r == NEWT_OK) r = newt_state_restore(c, &ri);
  if (r != NEWT_OK) {
    state_free(&ns);
    return r;
  }
  state_free(s); /* newt has read what it needed of the last generation's buffers */
  *s = ns;
  if (ri.source == NEWT_FROM_NOTHING) {
    init_params(md, s->params);
    *s->ema = 0;
  }
  return NEWT_OK;
}

/* --- a step ------------------------------------------------------------------------------------ */

/* --slow-step N:MS (0 MS: none) */
static int64_t slow_step;
static long slow_ms;

static newt_result_t step(newt_ctx *c, const model *md, state *s, const newt_layout *l, const newt_batch *b) {
  memset(s->grads, 0, sizeof(float) * (size_t)md->n);
  double loss = 0;
  for (int64_t at = 0; at < b->count; at += b->micro_batch) {
    int m = (int)(b->count - at < b->micro_batch ? b->count - at : b->micro_batch);
    loss += micro_batch(md, s->params, s->grads, b->first + at, m, b->global_batch);
  }
  if (slow_ms > 0 && b->step == slow_step && l->rank == 1) {
    struct timespec ts = {slow_ms / 1000, slow_ms % 1000 * 1000000};
    nanosleep(&ts, NULL);
  }
  if (l->dp_comm) TRY(newt_allreduce(l->dp_comm, s->grads, s->grads, (size_t)md->n, NEWT_F32, NEWT_SUM));
  double total = 0;
  TRY(newt_step_commit(c, &loss, &total, 1)); /* every rank agrees; newt keeps the state */
  /* Adam over this rank's range */
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  double c1 = 1 - pow(b1, (double)b->step), c2 = 1 - pow(b2, (double)b->step);
  for (int64_t k = s->lo; k < s->hi; k++) {
    float g = s->grads[k];
    s->m[k] = (float)(b1 * s->m[k] + (1 - b1) * g);
    s->v[k] = (float)(b2 * s->v[k] + (1 - b2) * g * g);
    s->params[k] -= (float)(md->lr * (s->m[k] / c1) / (sqrt(s->v[k] / c2) + eps));
  }
  newt_step_result res;
  newt_step_result_init(&res);
  res.loss = total / (double)b->global_batch;
  res.lr = md->lr;
  *s->ema = *s->ema == 0 ? res.loss : 0.9 * *s->ema + 0.1 * res.loss;
  if (s->zero && l->dp_comm) { /* the parameters whole again */
    res.after = newt_allgather(l->dp_comm, s->params + s->lo, s->gather, (size_t)s->chunk, NEWT_F32);
    if (res.after == NEWT_OK) memcpy(s->params, s->gather, sizeof(float) * (size_t)md->n);
  }
  return newt_step_end(c, &res);
}

/* --- main ------------------------------------------------------------------------------------- */

static int usage(const char *why) {
  fprintf(stderr, "newt-mlp: %s\nusage: newt run [flags] -- newt-mlp [--hidden H] [--lr LR] [--seed S] "
                  "[--start-delay-ms MS] [--slow-step N:MS]\n", why);
  return 2;
}

int main(int argc, char **argv) {
  model md = {.H = 64, .lr = 0.003, .seed = 1};
  long start_delay_ms = 0;
  for (int i = 1; i < argc; i++) {
    char *end = NULL;
    if (i + 1 < argc && strcmp(argv[i], "--hidden") == 0) md.H = (int)strtol(argv[++i], &end, 10);
    else if (i + 1 < argc && strcmp(argv[i], "--lr") == 0) md.lr = strtod(argv[++i], &end);
    else if (i + 1 < argc && strcmp(argv[i], "--seed") == 0) md.seed = strtoull(argv[++i], &end, 10);
    else if (i + 1 < argc && strcmp(argv[i], "--start-delay-ms") == 0) start_delay_ms = strtol(argv[++i], &end, 10);
    else if (i + 1 < argc && strcmp(argv[i], "--slow-step") == 0) {
      slow_step = strtoll(argv[++i], &end, 10);
      if (end && *end == ':') slow_ms = strtol(end + 1, &end, 10);
      else return usage("--slow-step takes N:MS");
    }
    else return usage("unknown argument");
    if (!end || *end) return usage("a value is not a number");
  }
  if (md.H < 1 || md.H > 4096 || !(md.lr > 0) || start_delay_ms < 0 || start_delay_ms > 3600000 || slow_step < 0 ||
      slow_ms < 0 || slow_ms > 3600000)
    return usage("--hidden must be 1 to 4096, --lr > 0, --start-delay-ms 0 to 3600000, --slow-step N:MS with MS 0 "
                 "to 3600000");
  md.n = (int64_t)md.H * D + md.H + (int64_t)C * md.H + C;
  for (int k = 0; k < C * D; k++) md.teacher[k] = uniform(7, 1000000 + (uint64_t)k, 0);
  openblas_set_num_threads(1);

  newt_ctx *c = NULL;
  newt_result_t r = newt_join(NULL, &c); /* everything from the environment newt run sets */
  if (r != NEWT_OK) return 1;             /* newt_join said why */
  newt_job_info job = {.size = sizeof job};
  r = newt_job_get(c, &job);
  state s = {0};
  newt_layout l = {.size = sizeof l};
  while (r == NEWT_OK) {
    newt_batch b = {.size = sizeof b};
    newt_next next;
    r = newt_step_begin(c, &b, &next);
    if (r != NEWT_OK || next >= NEWT_NEXT_DONE) break;
    /* an error of a generation's collectives sends us back to newt_step_begin, which
       recovers (or says what was wrong: then we stop) */
    if (next == NEWT_NEXT_GENERATION) {
      if (newt_layout_get(c, &l) == NEWT_OK && generation(c, &md, job.zero, &s, &l) == NEWT_ERR_INVALID) r = NEWT_ERR_INVALID;
      if (start_delay_ms > 0) { /* the slow start-up, once */
        struct timespec ts = {start_delay_ms / 1000, start_delay_ms % 1000 * 1000000};
        nanosleep(&ts, NULL);
        start_delay_ms = 0;
      }
    } else {
      (void)step(c, &md, &s, &l, &b);
    }
  }
  if (r == NEWT_OK && s.params && l.rank == 0) fprintf(stderr, "newt-mlp: loss (running mean) %.6f\n", *s.ema);
  state_free(&s);
  return newt_finish(c, r);
}
