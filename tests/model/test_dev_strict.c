/* The strict test device (dev_strict.h) itself: its memory faults when the host touches it,
 * bytes cross only by upload and download, a host pointer given as device memory is
 * refused, queued downloads land late and only in model_dev_host_alloc memory, and its
 * kernels are the CPU device's bit for bit (a layernorm, a matmul, the squared norm into a
 * device double, AdamW with its moments on the device). */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/dev_strict.h"
#include "model/rng.h"
#include "test.h"

/* Runs fn in a child; returns the signal that ended it (0: it exited). */
static int child_signal(void (*fn)(void *), void *arg) {
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);
    fn(arg);
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

static void touch(void *p) { *(volatile float *)p = 1.0f; }
static void misuse(void *p) { model_dev_zero(dev_strict(), p, 4); }

static void test_memory(void) {
  model_dev *d = dev_strict();
  T_CHECK(!model_dev_host_visible(d));
  void *p = NULL, *h = NULL;
  T_OK(model_dev_alloc(d, 1024, &p));
  T_OK(model_dev_host_alloc(d, 1024, &h));
  T_CHECK(dev_strict_is_dev(p) && !dev_strict_is_dev(h));
  T_CHECK_MSG(child_signal(touch, p) == SIGSEGV, "a host store into strict device memory did not fault");
  fprintf(stderr, "  expected below: the strict device refusing a host pointer\n");
  T_CHECK_MSG(child_signal(misuse, h) == SIGABRT, "host memory given as device memory was not refused");
  float *x = h;
  for (int i = 0; i < 256; i++) x[i] = (float)i;
  T_OK(model_dev_upload(d, p, x, 1024));
  memset(x, 0, 1024);
  T_OK(model_dev_download(d, x, p, 1024));
  T_CHECK(x[0] == 0.0f && x[255] == 255.0f);
  model_dev_zero(d, p, 1024);
  T_OK(model_dev_download(d, x, p, 1024));
  T_CHECK(x[255] == 0.0f);
  model_dev_free(d, p);
  model_dev_host_free(d, h);
}

static void queue_into_pageable(void *p) {
  float x[4];
  model_dev_download_async(dev_strict(), x, p, sizeof x);
}

/* Queued downloads: the bytes are there after the sync (not before), in the order queued
 * ahead of later work, and only into host_alloc memory. */
static void test_download_async(void) {
  model_dev *d = dev_strict();
  size_t allocs = dev_strict_host_allocs(), live = dev_strict_host_live();
  void *p = NULL, *h = NULL;
  T_OK(model_dev_alloc(d, 1024, &p));
  T_OK(model_dev_host_alloc(d, 2048, &h));
  T_CHECK(dev_strict_host_allocs() == allocs + 1 && dev_strict_host_live() == live + 1);
  float src[256], *x = h;
  for (int i = 0; i < 256; i++) src[i] = (float)(i + 1);
  T_OK(model_dev_upload(d, p, src, sizeof src));
  model_dev_download_async(d, x, p, 512);
  model_dev_download_async(d, x + 256, (float *)p + 128, 512);
  T_CHECK_MSG(x[0] == 0.0f && x[256] == 0.0f, "a queued download landed before the sync");
  model_dev_zero(d, p, 1024); /* queued after the downloads: they see the bytes before it */
  T_OK(model_dev_sync(d));
  T_CHECK(x[0] == 1.0f && x[127] == 128.0f && x[256] == 129.0f && x[383] == 256.0f);
  fprintf(stderr, "  expected below: the strict device refusing a queued download into pageable memory\n");
  T_CHECK_MSG(child_signal(queue_into_pageable, p) == SIGABRT, "a queued download into pageable memory was accepted");
  model_dev_free(d, p);
  model_dev_host_free(d, h);
  T_CHECK(dev_strict_host_live() == live);
}

static void upload_from_pageable(void *p) {
  float x[4] = {0};
  model_dev_upload_async(dev_strict(), p, x, sizeof x);
}

/* Queued uploads: from host_alloc memory only, landing at the sync (a source changed
 * before it lands as changed), in order with the work around them. */
static void test_upload_async(void) {
  model_dev *d = dev_strict();
  void *p = NULL, *h = NULL;
  T_OK(model_dev_alloc(d, 1024, &p));
  T_OK(model_dev_host_alloc(d, 1024, &h));
  float *x = h, back[256];
  for (int i = 0; i < 256; i++) x[i] = (float)(i + 1);
  model_dev_upload_async(d, p, x, 1024);
  x[0] = -1.0f; /* before the sync: what lands is this */
  T_OK(model_dev_sync(d));
  T_OK(model_dev_download(d, back, p, sizeof back));
  T_CHECK_MSG(back[0] == -1.0f && back[255] == 256.0f, "a queued upload landed at %g before the sync, not at it",
              back[0]);
  model_dev_zero(d, p, 1024);
  model_dev_upload_async(d, p, x, 512); /* after the zeroing, before the download */
  T_OK(model_dev_download(d, back, p, sizeof back));
  T_CHECK(back[1] == 2.0f && back[127] == 128.0f && back[128] == 0.0f);
  fprintf(stderr, "  expected below: the strict device refusing a queued upload from pageable memory\n");
  T_CHECK_MSG(child_signal(upload_from_pageable, p) == SIGABRT, "a queued upload from pageable memory was accepted");
  model_dev_free(d, p);
  model_dev_host_free(d, h);
}

/* n floats of device memory of d holding src. */
static float *up(model_dev *d, const float *src, size_t n) {
  void *p = NULL;
  T_OK(model_dev_alloc(d, n * sizeof(float), &p));
  T_OK(model_dev_upload(d, p, src, n * sizeof(float)));
  return p;
}

static void down(model_dev *d, float *dst, const float *p, size_t n) { T_OK(model_dev_download(d, dst, p, n * sizeof(float))); }

/* The same kernels on the CPU device and on the strict device: the same bits. */
static void test_kernels(void) {
  enum { B = 2, T = 8, C = 32, OC = 48 };
  size_t nx = B * T * C, nw = (size_t)OC * C, no = B * T * OC;
  float *x = malloc(nx * 4), *w = malloc(nw * 4), *lw = malloc(C * 4), *lb = malloc(C * 4);
  for (size_t i = 0; i < nx; i++) x[i] = (float)model_rng_normal(1, 1, i);
  for (size_t i = 0; i < nw; i++) w[i] = (float)(0.02 * model_rng_normal(1, 2, i));
  for (int i = 0; i < C; i++) lw[i] = 1.0f + 0.1f * (float)i / C, lb[i] = 0.01f * (float)i;
  float *out[2], *ln[2];
  double sq[2];
  model_layout lay = {0};
  model_tensor t = {.offset = 0, .size = nw, .decay = 1};
  lay.tensors = &t;
  lay.n = 1;
  lay.total = nw;
  model_dev *devs[2] = {model_dev_cpu(), dev_strict()};
  float *wafter[2];
  for (int k = 0; k < 2; k++) {
    model_dev *d = devs[k];
    float *dx = up(d, x, nx), *dw = up(d, w, nw), *dlw = up(d, lw, C), *dlb = up(d, lb, C);
    void *dln, *dmean, *drstd, *dout, *dacc;
    T_OK(model_dev_alloc(d, nx * 4, &dln));
    T_OK(model_dev_alloc(d, B * T * 4, &dmean));
    T_OK(model_dev_alloc(d, B * T * 4, &drstd));
    T_OK(model_dev_alloc(d, no * 4, &dout));
    T_OK(model_dev_alloc(d, sizeof(double), &dacc));
    model_k_layernorm_forward(d, dln, dmean, drstd, dx, dlw, dlb, B, T, C);
    model_k_matmul_forward(d, dout, NULL, dln, dw, NULL, B, T, C, OC);
    model_k_sqnorm(d, dacc, dout, no);
    model_adamw_config hp = model_adamw_defaults(10);
    float *m = NULL, *v = NULL;
    T_OK(model_dev_alloc(d, nw * 4, (void **)&m));
    T_OK(model_dev_alloc(d, nw * 4, (void **)&v));
    model_adamw o;
    T_OK(model_adamw_init_with(&o, &hp, 0, nw, m, v));
    model_k_adamw(d, &o, &lay, dw, dw, 1e-3, 1.0f); /* the weights as their own gradients */
    T_CHECK(o.t == 1);
    out[k] = malloc(no * 4);
    ln[k] = malloc(nx * 4);
    wafter[k] = malloc(nw * 4);
    down(d, out[k], dout, no);
    down(d, ln[k], dln, nx);
    down(d, wafter[k], dw, nw);
    T_OK(model_dev_download(d, &sq[k], dacc, sizeof(double)));
    T_OK(model_dev_sync(d));
    void *bufs[] = {dx, dw, dlw, dlb, dln, dmean, drstd, dout, dacc, m, v};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) model_dev_free(d, bufs[i]);
    model_adamw_free(&o);
  }
  T_CHECK(memcmp(ln[0], ln[1], nx * 4) == 0);
  T_CHECK(memcmp(out[0], out[1], no * 4) == 0);
  T_CHECK(memcmp(wafter[0], wafter[1], nw * 4) == 0);
  T_CHECK(memcmp(&sq[0], &sq[1], sizeof(double)) == 0 && sq[0] > 0);
  for (int k = 0; k < 2; k++) free(out[k]), free(ln[k]), free(wafter[k]);
  free(x), free(w), free(lw), free(lb);
}

int main(void) {
  T_RUN(test_memory);
  T_RUN(test_download_async);
  T_RUN(test_upload_async);
  T_RUN(test_kernels);
  return T_DONE();
}
