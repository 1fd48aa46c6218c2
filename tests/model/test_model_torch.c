/* The CPU model against PyTorch: tests/model/fixture_tiny.bin (written by make_fixture.py
 * in float64 from the same bf16-exact initial weights) holds the batch, the logits, the
 * loss, every gradient and the losses of 10 AdamW steps; this test loads the weights into
 * newt's buffer by name and compares each, with fp32 tolerances, printing the worst tensor
 * and element on a mismatch. Runs at 1 and 2 threads (different GEMM splits). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/fs.h"
#include "model/gpt.h"
#include "model_test.h"
#include "model/ops.h"
#include "model/optim.h"
#include "test.h"

typedef struct rec {
  char name[64];
  uint32_t dtype, ndim;
  uint64_t dims[4], count;
  const uint8_t *data;
} rec;

static char *fix_buf;
static size_t fix_len;
static rec recs[128];
static int nrecs;

static int load_fixture(void) {
  const char *src = getenv("NEWT_SOURCE_DIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/tests/model/fixture_tiny.bin", src ? src : ".");
  if (newt_fs_read_all(path, 64u << 20, &fix_buf, &fix_len) != NEWT_OK) {
    fprintf(stderr, "cannot read %s: %s\n", path, newt_errmsg());
    return -1;
  }
  if (fix_len < 12 || memcmp(fix_buf, "NEWTFIX1", 8) != 0) return -1;
  uint32_t n;
  memcpy(&n, fix_buf + 8, 4);
  size_t off = 12;
  for (uint32_t i = 0; i < n && i < 128; i++) {
    rec *r = &recs[nrecs++];
    uint32_t nl;
    memcpy(&nl, fix_buf + off, 4);
    if (nl >= sizeof r->name) return -1;
    memcpy(r->name, fix_buf + off + 4, nl);
    r->name[nl] = 0;
    off += 4 + nl;
    memcpy(&r->dtype, fix_buf + off, 4);
    memcpy(&r->ndim, fix_buf + off + 4, 4);
    off += 8;
    r->count = 1;
    for (uint32_t d = 0; d < r->ndim; d++) {
      memcpy(&r->dims[d], fix_buf + off, 8);
      off += 8;
      r->count *= r->dims[d];
    }
    size_t esz = r->dtype == 1 ? 2 : r->dtype == 6 ? 8 : 4, bytes = r->count * esz;
    if (off + bytes > fix_len) return -1;
    uint8_t *copy = malloc(bytes ? bytes : 1); /* records are packed: copy to aligned memory */
    if (!copy) return -1;
    memcpy(copy, fix_buf + off, bytes);
    r->data = copy;
    off += bytes;
  }
  return 0;
}

static const rec *find(const char *name) {
  for (int i = 0; i < nrecs; i++)
    if (strcmp(recs[i].name, name) == 0) return &recs[i];
  T_FAIL("fixture has no record \"%s\"", name);
  return NULL;
}

static float f32_at(const rec *r, size_t i) {
  float f;
  memcpy(&f, r->data + 4 * i, 4);
  return f;
}

/* Worst element of got against ref: |got - ref| / (atol + rtol * |ref|). Returns that ratio
 * (> 1 is a failure) and its index. */
static double worst(const float *got, const rec *ref, double atol, double rtol, size_t *at) {
  double w = 0;
  *at = 0;
  for (size_t i = 0; i < ref->count; i++) {
    double r = f32_at(ref, i), e = fabs(got[i] - r) / (atol + rtol * fabs(r));
    if (!(e <= w)) { /* NaN counts as worst */
      w = isnan(e) ? INFINITY : e;
      *at = i;
    }
  }
  return w;
}

static model_config cfg;
static int B, T, STEPS;
static model_adamw_config hp;

static void load_params(model_gpt *g) {
  for (size_t k = 0; k < g->layout.n; k++) {
    const model_tensor *t = &g->layout.tensors[k];
    char name[80];
    snprintf(name, sizeof name, "param.%s", t->name);
    const rec *r = find(name);
    if (!r) continue;
    T_CHECK_MSG(r->count == t->size && r->dims[0] == t->shape[0], "%s: shape differs", t->name);
    if (r->count != t->size) continue;
    for (size_t i = 0; i < t->size; i++) {
      uint16_t h;
      memcpy(&h, r->data + 2 * i, 2);
      g->params[t->offset + i] = newt_bf16_to_f32(h);
    }
  }
}

static void check_against_torch(int threads) {
  model_threads_set(threads);
  model_gpt g;
  model_acts a;
  model_scratch s;
  whole_init(&g, &a, &s, &cfg, B, T);
  load_params(&g);
  const int32_t *inputs = (const int32_t *)find("inputs")->data;
  const int32_t *targets = (const int32_t *)find("targets")->data;
  float dscale = 1.0f / (float)(B * T);

  /* forward only: logits and loss */
  double loss = model_forward_backward(&g, &a, &s, inputs, targets, 0.0f) / (B * T);
  size_t at;
  double w = worst(a.logits, find("logits"), 2e-6, 1e-5, &at);
  T_CHECK_MSG(w <= 1.0, "threads %d: logits[%zu] = %.8g, torch %.8g (error %.2fx tolerance)", threads,
              at, a.logits[at], f32_at(find("logits"), at), w);
  fprintf(stderr, "  threads %d: logits worst %.3fx tolerance, loss %.8f torch %.8f\n", threads, w, loss,
          f32_at(find("loss"), 0));
  T_NEAR(loss, f32_at(find("loss"), 0), 1e-6);

  /* forward + backward: every gradient */
  model_gpt_zero_grads(&g);
  double loss2 = model_forward_backward(&g, &a, &s, inputs, targets, dscale) / (B * T);
  T_NEAR(loss2, loss, 1e-9);
  double gw = 0;
  const char *gname = "";
  size_t gat = 0;
  float ggot = 0, gref = 0;
  for (size_t k = 0; k < g.layout.n; k++) {
    const model_tensor *t = &g.layout.tensors[k];
    char name[80];
    snprintf(name, sizeof name, "grad.%s", t->name);
    const rec *r = find(name);
    if (!r) continue;
    /* atol relative to the tensor's largest gradient: fp32 sums of ~128-512 terms */
    double mx = 0;
    for (size_t i = 0; i < r->count; i++) mx = fmax(mx, fabs(f32_at(r, i)));
    double tw = worst(g.grads + t->offset, r, 1e-5 * mx + 1e-10, 1e-4, &at);
    if (tw > gw) {
      gw = tw;
      gname = t->name;
      gat = at;
      ggot = g.grads[t->offset + at];
      gref = f32_at(r, at);
    }
  }
  fprintf(stderr, "  threads %d: gradients worst %.3fx tolerance in %s[%zu] (%.8g vs torch %.8g)\n",
          threads, gw, gname, gat, ggot, gref);
  T_CHECK_MSG(gw <= 1.0, "threads %d: gradient mismatch, worst tensor %s element %zu: %.8g, torch %.8g",
              threads, gname, gat, ggot, gref);

  /* 10 AdamW steps on the same batch */
  model_adamw opt;
  T_OK(model_adamw_init(&opt, &hp, 0, g.layout.total));
  const rec *lr = find("losses");
  for (int step = 0; step < STEPS; step++) {
    model_gpt_zero_grads(&g);
    double l = model_forward_backward(&g, &a, &s, inputs, targets, dscale) / (B * T);
    double norm = sqrt(model_sqnorm(g.grads, g.layout.total));
    model_adamw_update(&opt, &g.layout, g.params, g.grads, model_lr_at(&hp, step),
                       model_clip_scale(norm, hp.grad_clip));
    double ref = f32_at(lr, step);
    fprintf(stderr, "  threads %d: step %d loss %.7f torch %.7f (diff %.2g)\n", threads, step, l, ref,
            l - ref);
    T_CHECK_MSG(fabs(l - ref) <= 1e-6 * (1 + step), "threads %d: step %d loss %.8f, torch %.8f", threads,
                step, l, ref);
  }
  model_adamw_free(&opt);
  whole_free(&g, &a, &s);
}

static void test_torch_threads1(void) { check_against_torch(1); }
static void test_torch_threads2(void) { check_against_torch(2); }

int main(void) {
  if (load_fixture() != 0) {
    fprintf(stderr, "FAIL: tests/model/fixture_tiny.bin is missing or malformed\n");
    return 1;
  }
  const int32_t *c = (const int32_t *)find("config")->data;
  T_OK(model_config_preset("tiny", &cfg));
  if (!(cfg.vocab == c[0] && cfg.ctx == c[1] && cfg.layers == c[2] && cfg.heads == c[3] &&
        cfg.channels == c[4])) {
    fprintf(stderr, "FAIL: the fixture is not of the tiny preset\n");
    return 1;
  }
  B = c[5];
  T = c[6];
  STEPS = c[7];
  const double *h;
  h = (const double *)find("hparams")->data;
  hp = (model_adamw_config){.lr = h[0], .lr_min = h[1], .warmup = (int64_t)h[2], .steps = (int64_t)h[3],
                            .beta1 = h[4], .beta2 = h[5], .eps = h[6], .weight_decay = h[7],
                            .grad_clip = h[8]};
  T_RUN(test_torch_threads1);
  T_RUN(test_torch_threads2);
  for (int i = 0; i < nrecs; i++) free((void *)recs[i].data);
  free(fix_buf);
  return T_DONE();
}
