/* The strict test device (see dev_strict.h): the CPU device's memory and kernels behind
 * non-canonical pointers. Each entry of the table checks that its device arguments are
 * strict device pointers and its host arguments are not (aborting with the operation and
 * the argument named otherwise), translates them, and calls the same entry of
 * model_dev_cpu_ops (model/dev_internal.h) on the CPU device.
 *
 * Queued copies (model_dev_download_async, model_dev_upload_async) run late, as a GPU's
 * copy engine may: they wait in a queue until the next operation that touches device or
 * host memory of the device (or a collective over it, dev_strict_comm.h), and at the
 * latest model_dev_sync, so a caller that reads a download's destination, or changes an
 * upload's source, before the sync is caught by what it reads or what lands. Their host
 * side must lie in a block of model_dev_host_alloc (aborting otherwise), which the device
 * remembers, and counts for the tests of pools that keep them. */
#include "dev_strict.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/dev_internal.h"

static const model_dev_ops *cpu(void) { return &model_dev_cpu_ops; }

/* ---- host blocks and queued copies ---------------------------------------------------------------- */

typedef struct hblock {
  uintptr_t p;
  size_t n;
} hblock;
typedef struct pending {
  void *dst;
  const void *src; /* translated: host addresses */
  size_t n;
} pending;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static hblock *hblocks;
static size_t nhblocks, cap_hblocks, host_allocs;
static pending *pend;
static size_t npend, cap_pend;

void dev_strict_flush(void) {
  pthread_mutex_lock(&mu);
  for (size_t i = 0; i < npend; i++) memcpy(pend[i].dst, pend[i].src, pend[i].n);
  npend = 0;
  pthread_mutex_unlock(&mu);
}

size_t dev_strict_host_allocs(void) {
  pthread_mutex_lock(&mu);
  size_t n = host_allocs;
  pthread_mutex_unlock(&mu);
  return n;
}

size_t dev_strict_host_live(void) {
  pthread_mutex_lock(&mu);
  size_t n = nhblocks;
  pthread_mutex_unlock(&mu);
  return n;
}

/* Grows *arr (of *cap elements of size sz) to hold one more than n; aborts when it cannot. */
static void grow(void **arr, size_t *cap, size_t n, size_t sz) {
  if (n < *cap) return;
  size_t c = *cap ? 2 * *cap : 16;
  void *a = realloc(*arr, c * sz);
  if (!a) {
    fprintf(stderr, "dev_strict: out of memory\n");
    abort();
  }
  *arr = a;
  *cap = c;
}

/* A device argument: NULL, or a strict pointer (returned as its host address). */
static void *D_(const void *p, const char *op, const char *arg) {
  if (!p) return NULL;
  if (!dev_strict_is_dev(p)) {
    fprintf(stderr, "dev_strict: %s: %s = %p is not device memory (a host pointer where model/dev.h wants a device "
                    "pointer)\n", op, arg, p);
    abort();
  }
  return dev_strict_host(p);
}

/* A host argument: must not be a strict pointer. */
static void *H_(const void *p, const char *op, const char *arg) {
  if (dev_strict_is_dev(p)) {
    fprintf(stderr, "dev_strict: %s: %s = %p is device memory where model/dev.h wants host memory\n", op, arg, p);
    abort();
  }
  return (void *)(uintptr_t)p;
}

/* ... with the queued copies run first: every operation but another queued copy
 * comes after them. */
static void *D(const void *p, const char *op, const char *arg) {
  dev_strict_flush();
  return D_(p, op, arg);
}
static void *H(const void *p, const char *op, const char *arg) {
  dev_strict_flush();
  return H_(p, op, arg);
}

#define DF(p, op) ((float *)D((p), op, #p))
#define DI(p, op) ((const int32_t *)D((p), op, #p))

static void s_close(model_dev *d) { (void)d; }

static newt_result_t s_alloc(model_dev *d, size_t bytes, void **out) {
  (void)d;
  void *p;
  NEWT_CHECK(cpu()->alloc(model_dev_cpu(), bytes, &p));
  *out = (void *)((uintptr_t)p ^ DEV_STRICT_TAG);
  return NEWT_OK;
}
static void s_free(model_dev *d, void *p) {
  (void)d;
  cpu()->free(model_dev_cpu(), D(p, "free", "p"));
}
static newt_result_t s_host_alloc(model_dev *d, size_t bytes, void **out) {
  (void)d;
  NEWT_CHECK(cpu()->host_alloc(model_dev_cpu(), bytes, out));
  pthread_mutex_lock(&mu);
  grow((void **)&hblocks, &cap_hblocks, nhblocks, sizeof *hblocks);
  hblocks[nhblocks++] = (hblock){(uintptr_t)*out, bytes};
  host_allocs++;
  pthread_mutex_unlock(&mu);
  return NEWT_OK;
}
static void s_host_free(model_dev *d, void *p) {
  (void)d;
  H(p, "host_free", "p");
  pthread_mutex_lock(&mu);
  size_t k = 0;
  while (k < nhblocks && hblocks[k].p != (uintptr_t)p) k++;
  if (k == nhblocks) {
    fprintf(stderr, "dev_strict: host_free: p = %p is not a block of host_alloc\n", p);
    abort();
  }
  hblocks[k] = hblocks[--nhblocks];
  pthread_mutex_unlock(&mu);
  cpu()->host_free(model_dev_cpu(), p);
}
static newt_result_t s_upload(model_dev *d, void *dst, const void *src, size_t bytes) {
  (void)d;
  return cpu()->upload(model_dev_cpu(), D(dst, "upload", "dst"), H(src, "upload", "src"), bytes);
}
static newt_result_t s_download(model_dev *d, void *dst, const void *src, size_t bytes) {
  (void)d;
  return cpu()->download(model_dev_cpu(), H(dst, "download", "dst"), D(src, "download", "src"), bytes);
}
/* Queues a copy of bytes from src to dst (both host addresses), whose host side `host` (the
 * caller's pointer, named `what`) must lie in a block of host_alloc. */
static void queue_copy(void *dst, const void *src, size_t bytes, const void *host, const char *op, const char *what) {
  pthread_mutex_lock(&mu);
  size_t k = 0;
  uintptr_t a = (uintptr_t)host;
  while (k < nhblocks && !(a >= hblocks[k].p && bytes <= hblocks[k].n && a - hblocks[k].p <= hblocks[k].n - bytes)) k++;
  if (k == nhblocks) {
    fprintf(stderr, "dev_strict: %s: %s = %p (%zu bytes) is not in a block of host_alloc (a queued copy needs pinned "
                    "memory)\n", op, what, host, bytes);
    abort();
  }
  grow((void **)&pend, &cap_pend, npend, sizeof *pend);
  pend[npend++] = (pending){dst, src, bytes};
  pthread_mutex_unlock(&mu);
}
static void s_download_async(model_dev *d, void *dst, const void *src, size_t bytes) {
  (void)d;
  const void *s = D_(src, "download_async", "src");
  H_(dst, "download_async", "dst");
  queue_copy(dst, s, bytes, dst, "download_async", "dst");
}
static void s_upload_async(model_dev *d, void *dst, const void *src, size_t bytes) {
  (void)d;
  void *t = D_(dst, "upload_async", "dst");
  H_(src, "upload_async", "src");
  queue_copy(t, src, bytes, src, "upload_async", "src");
}
static void s_copy(model_dev *d, void *dst, const void *src, size_t bytes) {
  (void)d;
  cpu()->copy(model_dev_cpu(), D(dst, "copy", "dst"), D(src, "copy", "src"), bytes);
}
static void s_zero(model_dev *d, void *p, size_t bytes) {
  (void)d;
  cpu()->zero(model_dev_cpu(), D(p, "zero", "p"), bytes);
}
static newt_result_t s_sync(model_dev *d) {
  (void)d;
  dev_strict_flush();
  return NEWT_OK;
}
static size_t s_scratch_floats(const model_dev *d, int T, int C, int NH) {
  (void)d;
  return cpu()->scratch_floats(model_dev_cpu(), T, C, NH);
}

/* ---- kernels ------------------------------------------------------------------------------------ */

static void s_encoder_forward(model_dev *d, float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                              int T, int C) {
  (void)d;
  const char *op = "encoder_forward";
  cpu()->encoder_forward(model_dev_cpu(), DF(out, op), DI(inp, op), DF(wte, op), DF(wpe, op), B, T, C);
}
static void s_encoder_backward(model_dev *d, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                               int T, int C) {
  (void)d;
  const char *op = "encoder_backward";
  cpu()->encoder_backward(model_dev_cpu(), DF(dwte, op), DF(dwpe, op), DF(dout, op), DI(inp, op), B, T, C);
}
static void s_embed_rows_forward(model_dev *d, float *out, const int32_t *inp, const float *wte, int BT, int C, int lo,
                                 int Vl) {
  (void)d;
  const char *op = "embed_rows_forward";
  cpu()->embed_rows_forward(model_dev_cpu(), DF(out, op), DI(inp, op), DF(wte, op), BT, C, lo, Vl);
}
static void s_add_positions(model_dev *d, float *x, const float *wpe, int B, int T, int C) {
  (void)d;
  const char *op = "add_positions";
  cpu()->add_positions(model_dev_cpu(), DF(x, op), DF(wpe, op), B, T, C);
}
static void s_embed_rows_backward(model_dev *d, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                                  int T, int C, int lo, int Vl) {
  (void)d;
  const char *op = "embed_rows_backward";
  cpu()->embed_rows_backward(model_dev_cpu(), DF(dwte, op), DF(dwpe, op), DF(dout, op), DI(inp, op), B, T, C, lo, Vl);
}
static void s_layernorm_forward(model_dev *d, float *out, float *mean, float *rstd, const float *inp,
                                const float *weight, const float *bias, int B, int T, int C) {
  (void)d;
  const char *op = "layernorm_forward";
  cpu()->layernorm_forward(model_dev_cpu(), DF(out, op), DF(mean, op), DF(rstd, op), DF(inp, op), DF(weight, op),
                           DF(bias, op), B, T, C);
}
static void s_layernorm_backward(model_dev *d, float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, const float *mean, const float *rstd, int B,
                                 int T, int C, float *scratch) {
  (void)d;
  const char *op = "layernorm_backward";
  cpu()->layernorm_backward(model_dev_cpu(), DF(dinp, op), DF(dweight, op), DF(dbias, op), DF(dout, op), DF(inp, op),
                            DF(weight, op), DF(mean, op), DF(rstd, op), B, T, C, DF(scratch, op));
}
static void s_matmul_forward(model_dev *d, float *out, const float *res, const float *inp, const float *weight,
                             const float *bias, int B, int T, int C, int OC) {
  (void)d;
  const char *op = "matmul_forward";
  cpu()->matmul_forward(model_dev_cpu(), DF(out, op), DF(res, op), DF(inp, op), DF(weight, op), DF(bias, op), B, T, C,
                        OC);
}
static void s_matmul_backward(model_dev *d, float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, int B, int T, int C, int OC) {
  (void)d;
  const char *op = "matmul_backward";
  cpu()->matmul_backward(model_dev_cpu(), DF(dinp, op), DF(dweight, op), DF(dbias, op), DF(dout, op), DF(inp, op),
                         DF(weight, op), B, T, C, OC);
}
static void s_attention_forward(model_dev *d, float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                                float *scratch) {
  (void)d;
  const char *op = "attention_forward";
  cpu()->attention_forward(model_dev_cpu(), DF(out, op), DF(att, op), DF(qkv, op), B, T, C, NH, DF(scratch, op));
}
static void s_attention_backward(model_dev *d, float *dqkv, const float *dout, const float *att, const float *qkv,
                                 int B, int T, int C, int NH, float *scratch) {
  (void)d;
  const char *op = "attention_backward";
  cpu()->attention_backward(model_dev_cpu(), DF(dqkv, op), DF(dout, op), DF(att, op), DF(qkv, op), B, T, C, NH,
                            DF(scratch, op));
}
static void s_gelu_forward(model_dev *d, float *out, const float *inp, size_t N) {
  (void)d;
  cpu()->gelu_forward(model_dev_cpu(), DF(out, "gelu_forward"), DF(inp, "gelu_forward"), N);
}
static void s_gelu_backward(model_dev *d, float *dinp, const float *inp, const float *dout, size_t N) {
  (void)d;
  const char *op = "gelu_backward";
  cpu()->gelu_backward(model_dev_cpu(), DF(dinp, op), DF(inp, op), DF(dout, op), N);
}
static void s_add_res_bias(model_dev *d, float *out, const float *res, const float *bias, size_t BT, size_t C) {
  (void)d;
  const char *op = "add_res_bias";
  cpu()->add_res_bias(model_dev_cpu(), DF(out, op), DF(res, op), DF(bias, op), BT, C);
}
static void s_crossentropy(model_dev *d, float *losses, float *dlogits, const float *logits, const int32_t *targets,
                           int B, int T, int V, float dscale, double *loss_acc) {
  (void)d;
  const char *op = "crossentropy";
  cpu()->crossentropy(model_dev_cpu(), DF(losses, op), DF(dlogits, op), DF(logits, op), DI(targets, op), B, T, V,
                      dscale, (double *)D(loss_acc, op, "loss_acc"));
}
static void s_ce_rowmax(model_dev *d, float *mx, const float *logits, int BT, int Vl) {
  (void)d;
  cpu()->ce_rowmax(model_dev_cpu(), DF(mx, "ce_rowmax"), DF(logits, "ce_rowmax"), BT, Vl);
}
static void s_ce_partials(model_dev *d, float *st, const float *logits, const float *mx, const int32_t *targets,
                          int BT, int Vl, int lo) {
  (void)d;
  const char *op = "ce_partials";
  cpu()->ce_partials(model_dev_cpu(), DF(st, op), DF(logits, op), DF(mx, op), DI(targets, op), BT, Vl, lo);
}
static void s_ce_finish(model_dev *d, float *losses, float *logits, const float *mx, const float *st,
                        const int32_t *targets, int BT, int Vl, int lo, float dscale, double *loss_acc) {
  (void)d;
  const char *op = "ce_finish";
  cpu()->ce_finish(model_dev_cpu(), DF(losses, op), DF(logits, op), DF(mx, op), DF(st, op), DI(targets, op), BT, Vl,
                   lo, dscale, (double *)D(loss_acc, op, "loss_acc"));
}
static void s_sqnorm(model_dev *d, double *acc, const float *x, size_t n) {
  (void)d;
  cpu()->sqnorm(model_dev_cpu(), (double *)D(acc, "sqnorm", "acc"), DF(x, "sqnorm"), n);
}
/* The optimizer's state is a host struct whose moments are device memory: a copy with the
 * moments translated runs, and its update count comes back. */
static void s_adamw(model_dev *d, model_adamw *o, const model_layout *lay, float *params, const float *grads,
                    double lr, float grad_scale) {
  (void)d;
  const char *op = "adamw";
  model_adamw h = *(model_adamw *)H(o, op, "o");
  h.m = DF(o->m, op);
  h.v = DF(o->v, op);
  cpu()->adamw(model_dev_cpu(), &h, H(lay, op, "lay"), DF(params, op), DF(grads, op), lr, grad_scale);
  o->t = h.t;
}

static const model_dev_ops strict_ops = {
    .close = s_close,
    .alloc = s_alloc,
    .free = s_free,
    .host_alloc = s_host_alloc,
    .host_free = s_host_free,
    .upload = s_upload,
    .download = s_download,
    .download_async = s_download_async,
    .upload_async = s_upload_async,
    .copy = s_copy,
    .zero = s_zero,
    .sync = s_sync,
    .scratch_floats = s_scratch_floats,
    .encoder_forward = s_encoder_forward,
    .encoder_backward = s_encoder_backward,
    .embed_rows_forward = s_embed_rows_forward,
    .add_positions = s_add_positions,
    .embed_rows_backward = s_embed_rows_backward,
    .layernorm_forward = s_layernorm_forward,
    .layernorm_backward = s_layernorm_backward,
    .matmul_forward = s_matmul_forward,
    .matmul_backward = s_matmul_backward,
    .attention_forward = s_attention_forward,
    .attention_backward = s_attention_backward,
    .gelu_forward = s_gelu_forward,
    .gelu_backward = s_gelu_backward,
    .add_res_bias = s_add_res_bias,
    .crossentropy = s_crossentropy,
    .ce_rowmax = s_ce_rowmax,
    .ce_partials = s_ce_partials,
    .ce_finish = s_ce_finish,
    .sqnorm = s_sqnorm,
    .adamw = s_adamw,
};

model_dev *dev_strict(void) {
  /* kind CPU: the CPU's kernels (and model_dev_close leaves it alone); host_visible 0 */
  static model_dev strict = {.ops = &strict_ops, .kind = MODEL_DEV_CPU, .ordinal = -1, .host_visible = 0,
                             .name = "strict (tests: the CPU device behind non-canonical pointers)"};
  return &strict;
}
