/* The memory the declared state lives in (internal.h, newt.h's newt_memory): host memory,
 * the CUDA runtime on one device and stream, or the program's own functions. Each is a
 * newt_memory: the rest of the worker copies through it and knows no device.
 *
 * Host: device pointers are host memory (host_visible), copies are memcpy at once. CUDA:
 * cudaMalloc and cudaMallocHost with the device made current first (any thread may ask),
 * copies queued with cudaMemcpyAsync on the stream, sync waits for the stream; a copy the
 * runtime refuses is kept and returned by the next sync. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef NEWT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "worker/internal.h"

/* --- host -------------------------------------------------------------------------------------- */

static newt_result_t host_alloc(void *ctx, size_t bytes, void **out) {
  (void)ctx;
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 1) != 0)
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of host memory for %zu bytes", bytes);
  memset(p, 0, bytes); /* its pages touched now, not in the step that first uses them */
  *out = p;
  return NEWT_OK;
}
static void host_free(void *ctx, void *p) {
  (void)ctx;
  free(p);
}
static void host_copy(void *ctx, void *dst, const void *src, size_t bytes, int kind) {
  (void)ctx;
  (void)kind;
  if (bytes) memmove(dst, src, bytes);
}
static newt_result_t host_sync(void *ctx) {
  (void)ctx;
  return NEWT_OK;
}

void worker_mem_host(newt_memory *m) {
  *m = (newt_memory){.size = sizeof *m, .host_visible = 1, .alloc = host_alloc, .free = host_free,
                     .host_alloc = host_alloc, .host_free = host_free, .copy = host_copy, .sync = host_sync};
}

/* --- CUDA ------------------------------------------------------------------------------------- */

#ifdef NEWT_HAVE_CUDA
typedef struct cuda_mem {
  int device;
  cudaStream_t stream;
  pthread_mutex_t mu;
  cudaError_t err; /* the first refused copy, for the next sync */
  char what[64];
} cuda_mem;

static newt_result_t cuda_err(cuda_mem *c, const char *call, cudaError_t e) {
  (void)cudaGetLastError();
  return NEWT_ERR(e == cudaErrorMemoryAllocation ? NEWT_ERR_NOMEM : NEWT_ERR_CUDA, "cuda:%d: %s: %s (%s)", c->device,
                  call, cudaGetErrorName(e), cudaGetErrorString(e));
}

static newt_result_t cu_alloc(void *ctx, size_t bytes, void **out) {
  cuda_mem *c = ctx;
  cudaError_t e = cudaSetDevice(c->device);
  if (e == cudaSuccess) e = cudaMalloc(out, bytes ? bytes : 1);
  return e == cudaSuccess ? NEWT_OK : cuda_err(c, "cudaMalloc", e);
}
static void cu_free(void *ctx, void *p) {
  cuda_mem *c = ctx;
  (void)cudaSetDevice(c->device);
  if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
}
static newt_result_t cu_host_alloc(void *ctx, size_t bytes, void **out) {
  cuda_mem *c = ctx;
  cudaError_t e = cudaSetDevice(c->device);
  if (e == cudaSuccess) e = cudaMallocHost(out, bytes ? bytes : 1);
  return e == cudaSuccess ? NEWT_OK : cuda_err(c, "cudaMallocHost", e);
}
static void cu_host_free(void *ctx, void *p) {
  cuda_mem *c = ctx;
  (void)cudaSetDevice(c->device);
  if (cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
}
static void cu_copy(void *ctx, void *dst, const void *src, size_t bytes, int kind) {
  cuda_mem *c = ctx;
  static const enum cudaMemcpyKind kinds[3] = {cudaMemcpyDeviceToDevice, cudaMemcpyDeviceToHost,
                                               cudaMemcpyHostToDevice};
  if (!bytes) return;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kinds[kind < 0 || kind > 2 ? 0 : kind], c->stream);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    pthread_mutex_lock(&c->mu);
    if (c->err == cudaSuccess) c->err = e;
    pthread_mutex_unlock(&c->mu);
  }
}
static newt_result_t cu_sync(void *ctx) {
  cuda_mem *c = ctx;
  pthread_mutex_lock(&c->mu);
  cudaError_t queued = c->err;
  c->err = cudaSuccess;
  pthread_mutex_unlock(&c->mu);
  cudaError_t e = cudaStreamSynchronize(c->stream);
  if (queued != cudaSuccess) return cuda_err(c, "cudaMemcpyAsync", queued);
  return e == cudaSuccess ? NEWT_OK : cuda_err(c, "cudaStreamSynchronize", e);
}
#endif

newt_result_t worker_mem_cuda(newt_memory *m, int device, void *stream) {
#ifdef NEWT_HAVE_CUDA
  cuda_mem *c = calloc(1, sizeof *c);
  NEWT_CHECK_ALLOC(c);
  c->device = device;
  c->stream = (cudaStream_t)stream;
  pthread_mutex_init(&c->mu, NULL);
  *m = (newt_memory){.size = sizeof *m, .ctx = c, .host_visible = 0, .alloc = cu_alloc, .free = cu_free,
                     .host_alloc = cu_host_alloc, .host_free = cu_host_free, .copy = cu_copy, .sync = cu_sync};
  return NEWT_OK;
#else
  (void)m;
  (void)stream;
  return NEWT_ERR(NEWT_ERR_UNSUPPORTED, "cuda:%d: this libnewt was built without CUDA", device);
#endif
}

void worker_mem_release(newt_memory *m) {
#ifdef NEWT_HAVE_CUDA
  if (m->alloc == cu_alloc) {
    cuda_mem *c = m->ctx;
    pthread_mutex_destroy(&c->mu);
    free(c);
  }
#endif
  memset(m, 0, sizeof *m);
}
