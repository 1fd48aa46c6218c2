/* NCCL as the NCCL backend (nccl.c) calls it: a table of NCCL's functions, filled once
 * when the first NCCL communicator is built. A newt built with CUDA does not link NCCL:
 * it loads libnccl.so.2 at run time, so everything but the NCCL backend runs on a host
 * without it, and the backend says what it looked for, and which version it found, when
 * it cannot start (docs/comm.md, "Which NCCL").
 *
 * Where it looks, in order (the first file that opens is used):
 *   NEWT_NCCL_LIBRARY   a path to libnccl.so.2 (then nothing else is tried)
 *   libnccl.so.2        the dynamic loader's search (LD_LIBRARY_PATH, ld.so.cache, ...)
 *   $NCCL_HOME/lib, $NCCL_HOME/lib64, $CUDA_HOME/lib64, /usr/local/cuda/lib64
 * The library must be NCCL 2.28.7 or newer (ncclCommRevoke, ncclCommShrink): an older one
 * is refused, naming its version and file.
 *
 * Built against the test double (NEWT_NCCL_LINKED), the table takes the double's
 * functions, linked in, and loads nothing. */
#ifndef NEWT_COMM_NCCL_LIB_H
#define NEWT_COMM_NCCL_LIB_H

#include <nccl.h>
#include <stddef.h>

#include "common/err.h"

/* The oldest NCCL the backend works with. */
#define NEWT_NCCL_MIN_CODE NCCL_VERSION(2, 28, 7)
#define NEWT_NCCL_MIN_TEXT "2.28.7"

/* X(name): every NCCL function the backend calls, without its "nccl" prefix. */
#define NEWT_NCCL_FUNCTIONS(X)                                                                                 \
  X(GetVersion) X(GetErrorString) X(GetLastError) X(GetUniqueId) X(CommInitRankConfig) X(CommSplit)           \
  X(CommShrink) X(CommRevoke) X(CommFinalize) X(CommDestroy) X(CommAbort) X(CommGetAsyncError) X(CommCount) \
  X(CommUserRank) X(AllReduce) X(ReduceScatter) X(AllGather) X(Broadcast) X(Send) X(Recv)

typedef struct nccl_lib {
#define NEWT_NCCL_MEMBER(f) __typeof__(nccl##f) *f;
  NEWT_NCCL_FUNCTIONS(NEWT_NCCL_MEMBER)
#undef NEWT_NCCL_MEMBER
  int version;    /* ncclGetVersion's code, e.g. 22809 */
  char path[512]; /* the file loaded ("linked" for the double) */
} nccl_lib;

/* The table, valid once nccl_lib_load returned NEWT_OK. */
extern nccl_lib nccl_api;

/* Loads NCCL once (thread-safe; every later call returns the first one's result and
 * message): NEWT_ERR_NOTFOUND when no candidate opens or a symbol is missing,
 * NEWT_ERR_UNSUPPORTED for a version older than NEWT_NCCL_MIN_TEXT. */
newt_result_t nccl_lib_load(void);

/* nccl_lib_load, then "NCCL 2.28.9 (/path/libnccl.so.2)" into desc. */
newt_result_t nccl_lib_describe(char *desc, size_t n);

#endif
