/* The CUDA runtime calls newt and its tests make, as a behavioural double (tests only).
 *
 * Device memory is host memory from malloc, remembered so that cudaPointerGetAttributes
 * can tell it from other host memory (NCCL's CudaPtrCheck depends on that) and
 * cudaMemGetInfo can account for it. A stream is a queue of work run in order by a
 * thread of its own; events complete when the stream reaches them; cudaStreamWaitEvent
 * holds a stream until an event completes. cudaFree and cudaDeviceSynchronize wait for
 * every stream of the process to be idle, as the real ones synchronise the device: work
 * that never finishes (a collective whose peer died, on a communicator nobody revoked or
 * aborted) makes them wait for ever, which is the hazard of NVIDIA/nccl #549 that newt's
 * recovery must avoid. cudaMemcpy runs after the legacy default stream's queued work; no
 * other implicit synchronisation between the legacy stream and other streams is modelled.
 *
 * One process is one host thread's view of "its" GPU: cudaSetDevice picks among
 * NEWT_NCCL_DOUBLE_DEVICES devices (default 1), each with a PCI bus id (NCCL's busId). */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "double.h"

/* --- helpers ----------------------------------------------------------------------- */

uint64_t dbl_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void dbl_sleep_us(int64_t us) {
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

int64_t dbl_knob(const char *name, int64_t def) {
  const char *v = getenv(name);
  if (!v || !*v) return def;
  char *end = NULL;
  long long x = strtoll(v, &end, 0);
  return end && *end == '\0' ? (int64_t)x : def;
}

int dbl_thread_start(pthread_t *t, void *(*fn)(void *), void *arg, int detached) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t a;
  pthread_attr_init(&a);
  if (detached) pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  int e = pthread_create(t, &a, fn, arg);
  pthread_attr_destroy(&a);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return e;
}

/* --- devices ----------------------------------------------------------------------- */

static __thread int cur_device;

static int device_count(void) {
  int64_t n = dbl_knob("NEWT_NCCL_DOUBLE_DEVICES", 1);
  return n < 0 ? 0 : n > 64 ? 64 : (int)n;
}

int dbl_current_device(void) { return cur_device; }

int64_t dbl_bus_id(int device) {
  int64_t forced = dbl_knob("NEWT_NCCL_DOUBLE_BUSID", -1);
  return forced >= 0 ? forced : 0x1000 * (int64_t)(device + 1);
}

uint64_t dbl_host_hash(void) {
  /* src/misc/utils.cc getHostHash: NCCL_HOSTID, else the hostname and the boot id */
  char buf[1024] = "";
  const char *id = getenv("NCCL_HOSTID");
  if (id) snprintf(buf, sizeof buf, "%s", id);
  else {
    gethostname(buf, sizeof buf - 1);
    size_t n = strlen(buf);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
      if (!fgets(buf + n, (int)(sizeof buf - n), f)) buf[n] = '\0';
      fclose(f);
    }
  }
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char *p = buf; *p && *p != '\n'; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
  return h;
}

/* --- memory ------------------------------------------------------------------------ */

typedef struct alloc {
  char *p;
  size_t size;
  int device;
  struct alloc *next;
} alloc;

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static alloc *allocs;
static size_t allocated;

int dbl_device_pointer(const void *p, int *device) {
  int found = 0;
  pthread_mutex_lock(&mem_mu);
  for (alloc *a = allocs; a; a = a->next)
    if ((const char *)p >= a->p && (const char *)p < a->p + (a->size ? a->size : 1)) {
      if (device) *device = a->device;
      found = 1;
      break;
    }
  pthread_mutex_unlock(&mem_mu);
  return found;
}

/* --- streams ----------------------------------------------------------------------- */

struct CUstream_st {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  dbl_work *head, *tail;
  int busy;      /* work is running */
  int destroyed; /* cudaStreamDestroy: the thread ends once the queue is empty */
  int device;
  pthread_t thread;
};

/* Work queued or running on any stream, for device synchronisation. */
static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dev_cv = PTHREAD_COND_INITIALIZER;
static long pending;

static void pending_add(long d) {
  pthread_mutex_lock(&dev_mu);
  pending += d;
  if (pending == 0) pthread_cond_broadcast(&dev_cv);
  pthread_mutex_unlock(&dev_mu);
}

void dbl_device_sync(const char *who) {
  uint64_t t0 = dbl_now_ns();
  int said = 0;
  pthread_mutex_lock(&dev_mu);
  while (pending > 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50000000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&dev_cv, &dev_mu, &ts);
    if (!said && pending > 0 && dbl_now_ns() - t0 > 5000000000ull) {
      said = 1;
      fprintf(stderr,
              "[nccl double] %s has waited 5 s for the device to go idle: %ld stream work item(s) never "
              "finish (a collective whose peer is gone, on a communicator nobody revoked or aborted; "
              "NVIDIA/nccl #549)\n",
              who, pending);
    }
  }
  pthread_mutex_unlock(&dev_mu);
}

static void *stream_main(void *arg) {
  struct CUstream_st *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->destroyed) pthread_cond_wait(&s->cv, &s->mu);
    if (!s->head) break; /* destroyed and drained */
    dbl_work *w = s->head;
    s->head = w->next;
    if (!s->head) s->tail = NULL;
    s->busy = 1;
    pthread_mutex_unlock(&s->mu);
    cur_device = s->device;
    w->run(w);
    if (w->release) w->release(w);
    pthread_mutex_lock(&s->mu);
    s->busy = 0;
    pthread_cond_broadcast(&s->cv);
    pending_add(-1);
  }
  int detached = s->destroyed == 2;
  pthread_mutex_unlock(&s->mu);
  if (detached) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
  }
  return NULL;
}

static cudaError_t stream_new(int device, struct CUstream_st **out) {
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (!s) return cudaErrorMemoryAllocation;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->device = device;
  if (dbl_thread_start(&s->thread, stream_main, s, 0) != 0) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return cudaErrorMemoryAllocation;
  }
  *out = s;
  return cudaSuccess;
}

static pthread_mutex_t legacy_mu = PTHREAD_MUTEX_INITIALIZER;
static struct CUstream_st *legacy;

static struct CUstream_st *resolve(cudaStream_t s) {
  if (s && s != cudaStreamLegacy && s != cudaStreamPerThread) return s;
  pthread_mutex_lock(&legacy_mu);
  if (!legacy) stream_new(0, &legacy);
  struct CUstream_st *l = legacy;
  pthread_mutex_unlock(&legacy_mu);
  return l;
}

cudaError_t dbl_stream_push(cudaStream_t stream, dbl_work *w) {
  struct CUstream_st *s = resolve(stream);
  if (!s) return cudaErrorMemoryAllocation;
  w->next = NULL;
  pending_add(1);
  pthread_mutex_lock(&s->mu);
  if (s->tail) s->tail->next = w;
  else s->head = w;
  s->tail = w;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return cudaSuccess;
}

static void stream_sync(struct CUstream_st *s) {
  pthread_mutex_lock(&s->mu);
  while (s->head || s->busy) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
  (void)flags;
  if (!pStream) return cudaErrorInvalidValue;
  return stream_new(cur_device, pStream);
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) { return cudaStreamCreateWithFlags(pStream, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return cudaErrorInvalidResourceHandle;
  /* as CUDA: returns at once; the stream's resources go once its work is done */
  pthread_mutex_lock(&s->mu);
  int idle = !s->head && !s->busy;
  pthread_t t = s->thread;
  if (!idle) pthread_detach(t); /* before the thread can see `destroyed` and free s */
  s->destroyed = idle ? 1 : 2;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  if (idle) {
    pthread_join(t, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
  }
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  struct CUstream_st *r = resolve(s);
  if (!r) return cudaErrorMemoryAllocation;
  stream_sync(r);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  dbl_device_sync("cudaDeviceSynchronize");
  return cudaSuccess;
}

/* --- events ------------------------------------------------------------------------ */

struct CUevent_st {
  uint64_t recorded;  /* records issued */
  uint64_t completed; /* the highest record the stream reached */
  int refs;           /* the handle and each pending record or wait */
};

static pthread_mutex_t ev_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ev_cv = PTHREAD_COND_INITIALIZER;

static void ev_unref_locked(struct CUevent_st *e) {
  if (--e->refs == 0) free(e);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  (void)flags;
  if (!event) return cudaErrorInvalidValue;
  struct CUevent_st *e = calloc(1, sizeof *e);
  if (!e) return cudaErrorMemoryAllocation;
  e->refs = 1;
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidResourceHandle;
  pthread_mutex_lock(&ev_mu);
  ev_unref_locked(e);
  pthread_mutex_unlock(&ev_mu);
  return cudaSuccess;
}

typedef struct ev_work {
  dbl_work w;
  struct CUevent_st *e;
  uint64_t target;
} ev_work;

static void ev_record_run(dbl_work *w) {
  ev_work *x = (ev_work *)w;
  pthread_mutex_lock(&ev_mu);
  if (x->e->completed < x->target) x->e->completed = x->target;
  pthread_cond_broadcast(&ev_cv);
  pthread_mutex_unlock(&ev_mu);
}

static void ev_wait_run(dbl_work *w) {
  ev_work *x = (ev_work *)w;
  pthread_mutex_lock(&ev_mu);
  while (x->e->completed < x->target) pthread_cond_wait(&ev_cv, &ev_mu);
  pthread_mutex_unlock(&ev_mu);
}

static void ev_work_release(dbl_work *w) {
  ev_work *x = (ev_work *)w;
  pthread_mutex_lock(&ev_mu);
  ev_unref_locked(x->e);
  pthread_mutex_unlock(&ev_mu);
  free(x);
}

static cudaError_t ev_push(cudaStream_t stream, cudaEvent_t e, int record) {
  if (!e) return cudaErrorInvalidResourceHandle;
  ev_work *x = calloc(1, sizeof *x);
  if (!x) return cudaErrorMemoryAllocation;
  x->w.run = record ? ev_record_run : ev_wait_run;
  x->w.release = ev_work_release;
  x->e = e;
  pthread_mutex_lock(&ev_mu);
  e->refs++;
  if (record) e->recorded++;
  x->target = e->recorded; /* a wait on a never-recorded event does not wait */
  pthread_mutex_unlock(&ev_mu);
  cudaError_t r = dbl_stream_push(stream, &x->w);
  if (r != cudaSuccess) ev_work_release(&x->w);
  return r;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) { return ev_push(stream, e, 1); }

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned int flags) {
  (void)flags;
  return ev_push(stream, e, 0);
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidResourceHandle;
  pthread_mutex_lock(&ev_mu);
  int done = e->completed >= e->recorded;
  pthread_mutex_unlock(&ev_mu);
  return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidResourceHandle;
  pthread_mutex_lock(&ev_mu);
  uint64_t target = e->recorded;
  while (e->completed < target) pthread_cond_wait(&ev_cv, &ev_mu);
  pthread_mutex_unlock(&ev_mu);
  return cudaSuccess;
}

/* --- copies, sets, host functions ----------------------------------------------------- */

typedef struct mem_work {
  dbl_work w;
  void *dst;
  const void *src;
  size_t n;
  int value; /* memset when src is NULL */
  cudaHostFn_t fn;
  void *data;
} mem_work;

static void mem_run(dbl_work *w) {
  mem_work *x = (mem_work *)w;
  if (x->fn) x->fn(x->data);
  else if (x->src) memmove(x->dst, x->src, x->n);
  else if (x->n) memset(x->dst, x->value, x->n);
}

static void mem_release(dbl_work *w) { free(w); }

static cudaError_t mem_push(cudaStream_t stream, void *dst, const void *src, size_t n, int value, cudaHostFn_t fn,
                            void *data) {
  mem_work *x = calloc(1, sizeof *x);
  if (!x) return cudaErrorMemoryAllocation;
  *x = (mem_work){.w = {.run = mem_run, .release = mem_release}, .dst = dst, .src = src, .n = n,
                  .value = value, .fn = fn, .data = data};
  cudaError_t r = dbl_stream_push(stream, &x->w);
  if (r != cudaSuccess) free(x);
  return r;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  (void)kind;
  if (count && (!dst || !src)) return cudaErrorInvalidValue;
  return mem_push(stream, dst, src, count, 0, NULL, NULL);
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
  if (count && !devPtr) return cudaErrorInvalidValue;
  return mem_push(stream, devPtr, NULL, count, value, NULL, NULL);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData) {
  if (!fn) return cudaErrorInvalidValue;
  return mem_push(stream, NULL, NULL, 0, 0, fn, userData);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  (void)kind;
  if (count && (!dst || !src)) return cudaErrorInvalidValue;
  struct CUstream_st *l = resolve(NULL);
  if (l) stream_sync(l);
  memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
  if (count && !devPtr) return cudaErrorInvalidValue;
  struct CUstream_st *l = resolve(NULL);
  if (l) stream_sync(l);
  memset(devPtr, value, count);
  return cudaSuccess;
}

/* --- memory, devices ------------------------------------------------------------------ */

static size_t mem_total(void) { return (size_t)dbl_knob("NEWT_NCCL_DOUBLE_MEM", 80ll << 30); }

cudaError_t cudaMalloc(void **devPtr, size_t size) {
  if (!devPtr) return cudaErrorInvalidValue;
  alloc *a = calloc(1, sizeof *a);
  pthread_mutex_lock(&mem_mu);
  int room = allocated + size <= mem_total();
  pthread_mutex_unlock(&mem_mu);
  char *p = a && room ? malloc(size ? size : 1) : NULL;
  if (!p) {
    free(a);
    return cudaErrorMemoryAllocation;
  }
  a->p = p;
  a->size = size;
  a->device = cur_device;
  pthread_mutex_lock(&mem_mu);
  a->next = allocs;
  allocs = a;
  allocated += size;
  pthread_mutex_unlock(&mem_mu);
  *devPtr = p;
  return cudaSuccess;
}

/* Takes the allocation that starts at p off the list (NULL: none does). */
static alloc *alloc_take(const void *p) {
  pthread_mutex_lock(&mem_mu);
  alloc **pp = &allocs;
  while (*pp && (*pp)->p != p) pp = &(*pp)->next;
  alloc *a = *pp;
  if (a) {
    *pp = a->next;
    allocated -= a->size;
  }
  pthread_mutex_unlock(&mem_mu);
  return a;
}

cudaError_t cudaFree(void *devPtr) {
  if (!devPtr) return cudaSuccess;
  dbl_device_sync("cudaFree"); /* cudaFree synchronises the device */
  alloc *a = alloc_take(devPtr);
  if (!a) return cudaErrorInvalidValue;
  free(a->p);
  free(a);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  pthread_mutex_lock(&mem_mu);
  size_t used = allocated;
  pthread_mutex_unlock(&mem_mu);
  if (free_bytes) *free_bytes = mem_total() - used;
  if (total) *total = mem_total();
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr) {
  if (!attributes) return cudaErrorInvalidValue;
  memset(attributes, 0, sizeof *attributes);
  int dev = 0;
  if (ptr && dbl_device_pointer(ptr, &dev)) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = dev;
    attributes->devicePointer = (void *)ptr;
  } else {
    attributes->type = cudaMemoryTypeUnregistered; /* host memory CUDA does not know */
    attributes->device = -2;
    attributes->hostPointer = (void *)ptr;
  }
  return cudaSuccess;
}

/* cudaMallocHost / cudaHostAlloc: page-locked host memory (here plain host memory, which
   the double's copies treat alike), page-aligned as the runtime's (it pins whole pages);
   cudaFreeHost does not wait for the device. */
cudaError_t cudaMallocHost(void **ptr, size_t size) {
  if (!ptr) return cudaErrorInvalidValue;
  *ptr = NULL;
  if (posix_memalign(ptr, 4096, size ? size : 1) != 0) *ptr = NULL;
  return *ptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags) {
  (void)flags;
  return cudaMallocHost(ptr, size);
}

cudaError_t cudaFreeHost(void *ptr) {
  free(ptr);
  return cudaSuccess;
}

/* Stream-ordered allocation (cudaMallocAsync / cudaFreeAsync): the memory is usable by
   work queued after the call; a free waits for the work queued before it, which the
   double gets by freeing from the stream's thread. */
typedef struct free_work {
  dbl_work w;
  void *p;
} free_work;

static void free_run(dbl_work *w) {
  alloc *a = alloc_take(((free_work *)w)->p);
  if (a) free(a->p);
  free(a);
}

static void free_release(dbl_work *w) { free(w); }

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream) {
  (void)stream;
  return cudaMalloc(devPtr, size);
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream) {
  if (!devPtr) return cudaSuccess;
  if (!dbl_device_pointer(devPtr, NULL)) return cudaErrorInvalidValue;
  free_work *f = calloc(1, sizeof *f);
  if (!f) return cudaErrorMemoryAllocation;
  *f = (free_work){.w = {.run = free_run, .release = free_release}, .p = devPtr};
  return dbl_stream_push(stream, &f->w);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  struct CUstream_st *s = resolve(stream);
  if (!s) return cudaErrorInvalidResourceHandle;
  pthread_mutex_lock(&s->mu);
  int idle = !s->head && !s->busy;
  pthread_mutex_unlock(&s->mu);
  return idle ? cudaSuccess : cudaErrorNotReady;
}

/* A device of the double: named so that logs say what ran, with the memory of the knob and
   compute capability 9.0 (an H100/H200's, the default NEWT_CUDA_ARCH). */
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  if (!prop) return cudaErrorInvalidValue;
  if (device < 0 || device >= device_count()) return cudaErrorInvalidDevice;
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "newt test double of a GPU");
  prop->totalGlobalMem = mem_total();
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->pciBusID = (int)(dbl_bus_id(device) >> 8);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  if (!value) return cudaErrorInvalidValue;
  if (device < 0 || device >= device_count()) return cudaErrorInvalidDevice;
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    default: *value = 0; break;
  }
  return cudaSuccess;
}

cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }

cudaError_t cudaGetDeviceCount(int *count) {
  if (!count) return cudaErrorInvalidValue;
  *count = device_count();
  return *count > 0 ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t cudaSetDevice(int device) {
  int n = device_count();
  if (n == 0) return cudaErrorNoDevice;
  if (device < 0 || device >= n) return cudaErrorInvalidDevice;
  cur_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  if (!device) return cudaErrorInvalidValue;
  *device = cur_device;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }

cudaError_t cudaDriverGetVersion(int *v) {
  if (!v) return cudaErrorInvalidValue;
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) { return cudaDriverGetVersion(v); }

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaErrorUnknown";
  }
}

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    default: return "unknown error";
  }
}
