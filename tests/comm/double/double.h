/* The behavioural double of the CUDA runtime and NCCL (tests only; never linked into the
 * shipped newt): what cuda_double.c and nccl_double.c share.
 *
 * Host memory stands in for device memory. A stream is an in-order queue of work run by
 * one thread of its own (the "GPU"); a collective is work on that queue which moves bytes
 * over sockets between the ranks' processes and, like a kernel, does not finish until its
 * data has moved or its communicator's abort flag is raised. Every behaviour is written
 * after the NCCL 2.28 / CUDA runtime function it follows; docs/comm.md has the table.
 *
 * Knobs (environment, read when used):
 *   NEWT_NCCL_DOUBLE_DEVICES  devices this process sees (cudaGetDeviceCount; default 1)
 *   NEWT_NCCL_DOUBLE_BUSID    the PCI bus id every device of this process claims
 *                             (default 0x1000 * (device + 1), as one machine's GPUs)
 *   NEWT_NCCL_DOUBLE_MEM      bytes of "device memory" (cudaMemGetInfo; default 80 GiB)
 *   NEWT_NCCL_DOUBLE_ROOT_MS  how long a unique id's root waits for its ranks (120000)
 *   NCCL_HOSTID, NCCL_CHECK_POINTERS, NCCL_DEBUG=WARN: as in NCCL. */
#ifndef NEWT_TESTS_COMM_DOUBLE_H
#define NEWT_TESTS_COMM_DOUBLE_H

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>

/* Work queued on a stream: run() is called by the stream's thread, in order, and returns
 * when the work is done (or gave up because it was aborted); release() frees it. */
typedef struct dbl_work {
  void (*run)(struct dbl_work *w);
  void (*release)(struct dbl_work *w);
  struct dbl_work *next;
} dbl_work;

/* Queues w on s (NULL: the legacy default stream). */
cudaError_t dbl_stream_push(cudaStream_t s, dbl_work *w);

/* Waits until no stream of this process has work queued or running: what cudaFree and
 * NCCL's teardown (commFree -> ncclCudaFree) imply. `who` names the caller in the
 * message printed when the wait lasts (work that never finishes: a collective whose peer
 * is gone and whose communicator was neither revoked nor aborted, NVIDIA/nccl #549). */
void dbl_device_sync(const char *who);

/* This thread's current device (cudaSetDevice), its PCI bus id, and this host's hash
 * (NCCL's getHostHash: NCCL_HOSTID, else hostname and boot id). */
int dbl_current_device(void);
int64_t dbl_bus_id(int device);
uint64_t dbl_host_hash(void);

/* 1 when p points into memory from cudaMalloc (*device set), as cudaPointerGetAttributes. */
int dbl_device_pointer(const void *p, int *device);

/* Knob from the environment, decimal or 0x hex; def when unset. */
int64_t dbl_knob(const char *name, int64_t def);

uint64_t dbl_now_ns(void);
void dbl_sleep_us(int64_t us);

/* Starts a thread with every signal blocked (as the CUDA runtime's and NCCL's own). */
int dbl_thread_start(pthread_t *t, void *(*fn)(void *), void *arg, int detached);

#endif
