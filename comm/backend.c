/* The backends built into this newt: the one place that maps a comm_backend to its table
 * of operations (internal.h), as NCCL's list of transports does. The CPU backend is always
 * there; the NCCL backend only when built with the CUDA toolkit (NEWT_HAVE_CUDA), and
 * otherwise its entry is NULL, which comm_create and comm_nccl_unique_id report as
 * NEWT_ERR_UNSUPPORTED. */
#include "comm/internal.h"

const comm_backend_ops *comm_backend_ops_of(comm_backend b) {
  switch (b) {
    case COMM_BACKEND_CPU: return &comm_cpu_ops;
#ifdef NEWT_HAVE_CUDA
    case COMM_BACKEND_NCCL: return &comm_nccl_ops;
#endif
    default: return NULL;
  }
}
