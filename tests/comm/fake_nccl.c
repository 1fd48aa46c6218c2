/* A stand-in libnccl.so.2 for tests/comm/test_libs.c (tests only): every function the NCCL
 * backend resolves (comm/nccl_lib.h), doing nothing, with the version FAKE_NCCL_VERSION; with
 * FAKE_NCCL_PARTIAL it lacks ncclCommShrink, as a library of another kind would. */
#include <nccl.h>

ncclResult_t ncclGetVersion(int *v) {
  *v = FAKE_NCCL_VERSION;
  return ncclSuccess;
}
const char *ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "fake error"; }
const char *ncclGetLastError(ncclComm_t c) { return c ? "" : ""; }
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) { return id ? ncclInternalError : ncclInvalidArgument; }
ncclResult_t ncclCommInitRankConfig(ncclComm_t *c, int n, ncclUniqueId id, int r, ncclConfig_t *cf) {
  (void)c, (void)n, (void)id, (void)r, (void)cf;
  return ncclInternalError;
}
ncclResult_t ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t *out, ncclConfig_t *cf) {
  (void)c, (void)color, (void)key, (void)out, (void)cf;
  return ncclInternalError;
}
#ifndef FAKE_NCCL_PARTIAL
ncclResult_t ncclCommShrink(ncclComm_t c, int *ex, int n, ncclComm_t *out, ncclConfig_t *cf, int flags) {
  (void)c, (void)ex, (void)n, (void)out, (void)cf, (void)flags;
  return ncclInternalError;
}
#endif
ncclResult_t ncclCommRevoke(ncclComm_t c, int flags) { return c && flags >= 0 ? ncclInternalError : ncclInvalidArgument; }
ncclResult_t ncclCommFinalize(ncclComm_t c) { return c ? ncclInternalError : ncclInvalidArgument; }
ncclResult_t ncclCommDestroy(ncclComm_t c) { return c ? ncclInternalError : ncclInvalidArgument; }
ncclResult_t ncclCommAbort(ncclComm_t c) { return c ? ncclInternalError : ncclInvalidArgument; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *e) {
  *e = ncclInternalError;
  return c ? ncclSuccess : ncclInvalidArgument;
}
ncclResult_t ncclCommCount(const ncclComm_t c, int *n) {
  *n = 0;
  return c ? ncclInternalError : ncclInvalidArgument;
}
ncclResult_t ncclCommUserRank(const ncclComm_t c, int *r) {
  *r = -1;
  return c ? ncclInternalError : ncclInvalidArgument;
}
#define FAKE_COLL(name, ...)                                       \
  ncclResult_t name(__VA_ARGS__) { return ncclInternalError; }
FAKE_COLL(ncclAllReduce, const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t st)
FAKE_COLL(ncclReduceScatter, const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
          cudaStream_t st)
FAKE_COLL(ncclAllGather, const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st)
FAKE_COLL(ncclBroadcast, const void *s, void *r, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st)
FAKE_COLL(ncclSend, const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st)
FAKE_COLL(ncclRecv, void *r, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st)
