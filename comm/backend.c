/* The backends built into this newt: the one place that maps a comm_backend to its table
 * of operations (internal.h), as NCCL's list of transports does. The CPU backend is always
 * there; the NCCL backend only when built with the CUDA toolkit (NEWT_HAVE_CUDA), and
 * otherwise its entry is NULL, which comm_create and comm_nccl_unique_id report as
 * NEWT_ERR_UNSUPPORTED. */
#include <stdio.h>

#include "comm/internal.h"
#ifdef NEWT_HAVE_CUDA
#include "comm/nccl_lib.h"
#endif

const comm_backend_ops *comm_backend_ops_of(comm_backend b) {
  switch (b) {
    case COMM_BACKEND_CPU: return &comm_cpu_ops;
#ifdef NEWT_HAVE_CUDA
    case COMM_BACKEND_NCCL: return &comm_nccl_ops;
#endif
    default: return NULL;
  }
}

newt_result_t comm_backend_library(comm_backend b, char *desc, size_t n) {
  if (b == COMM_BACKEND_CPU) {
    snprintf(desc, n, "built in");
    return NEWT_OK;
  }
#ifdef NEWT_HAVE_CUDA
  if (b == COMM_BACKEND_NCCL) return nccl_lib_describe(desc, n);
#endif
  return NEWT_ERR(NEWT_ERR_UNSUPPORTED, "this newt was built without the NCCL backend (no CUDA toolkit at build time)");
}
