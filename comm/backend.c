/* The backends built into this newt: the one place that maps a backend of the backend table
 * (common/backend.h: its name and device) to its table of operations (internal.h) and its
 * library, as NCCL's list of transports does. The CPU backend is always there; the NCCL
 * backend only when built with the CUDA toolkit (NEWT_HAVE_CUDA), and otherwise its row has
 * no operations, which comm_create reports as NEWT_ERR_UNSUPPORTED.
 * Also the count of the GPUs a GPU backend's ranks may use (comm_gpu_count). */
#include <stdio.h>

#include "comm/internal.h"
#ifdef NEWT_HAVE_CUDA
#include <cuda_runtime.h>

#include "comm/nccl_lib.h"
#endif

static newt_result_t cpu_library(char *desc, size_t n) {
  snprintf(desc, n, "built in");
  return NEWT_OK;
}

/* Per backend id: what the messages call it, its operations and its library (NULL: not
 * built into this newt). */
static const struct {
  const char *label;
  const comm_backend_ops *ops;
  newt_result_t (*library)(char *desc, size_t n);
} built[NEWT_BACKEND__COUNT] = {
    [NEWT_BACKEND_CPU] = {"the CPU backend", &comm_cpu_ops, cpu_library},
#ifdef NEWT_HAVE_CUDA
    [NEWT_BACKEND_NCCL] = {"the NCCL backend", &comm_nccl_ops, nccl_lib_describe},
#else
    [NEWT_BACKEND_NCCL] = {"the NCCL backend", NULL, NULL},
#endif
};

const comm_backend_ops *comm_backend_ops_of(comm_backend b) {
  return (unsigned)b < NEWT_BACKEND__COUNT ? built[b].ops : NULL;
}

const char *comm_backend_label(comm_backend b) {
  return (unsigned)b < NEWT_BACKEND__COUNT && built[b].label ? built[b].label : "a backend";
}

newt_result_t comm_backend_library(comm_backend b, char *desc, size_t n) {
  if ((unsigned)b < NEWT_BACKEND__COUNT && built[b].library) return built[b].library(desc, n);
  return NEWT_ERR(NEWT_ERR_UNSUPPORTED, "this newt was built without %s (no CUDA toolkit at build time)",
                  comm_backend_label(b));
}

int comm_gpu_count(int *cuda_error) {
  if (cuda_error) *cuda_error = 0;
#ifdef NEWT_HAVE_CUDA
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* "no driver", "no device": none to use */
    if (cuda_error) *cuda_error = (int)e;
    return 0;
  }
  return n;
#else
  return 0;
#endif
}
