/* cuBLAS as the CUDA kernels (kernels.cu) call it: a table of cuBLAS's functions, filled
 * when the first CUDA device is opened. A newt built with CUDA does not link cuBLAS: it
 * loads libcublas.so.<major> at run time, so that a host without the CUDA toolkit's
 * libraries still runs everything but the CUDA device (CPU workers, the coordinator,
 * `newt --version`), and the device says what it looked for when it cannot open.
 *
 * Where it looks, in order (the first file that opens is used):
 *   NEWT_CUBLAS_LIBRARY   a path to libcublas.so.<major> (then nothing else is tried)
 *   libcublas.so.<major>  the dynamic loader's search (LD_LIBRARY_PATH, ld.so.cache, ...)
 *   $CUDA_HOME/lib64, /usr/local/cuda/lib64
 * <major> is the cuBLAS major version newt was built with (CUBLAS_VER_MAJOR: 13 for CUDA 13);
 * libcublas finds its libcublasLt beside itself. */
#ifndef NEWT_MODEL_CUDA_CUBLAS_LIB_H
#define NEWT_MODEL_CUDA_CUBLAS_LIB_H

#include <cublas_v2.h>
#include <stddef.h>

#include "common/err.h"

/* cublasGemmEx and cublasGemmStridedBatchedEx have C++ overloads (cublas_api.h), so their
 * types are spelled out: the C functions the library exports. */
typedef cublasStatus_t (*newt_cublas_gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                              const void *, const void *, cudaDataType, int, const void *,
                                              cudaDataType, int, const void *, void *, cudaDataType, int,
                                              cublasComputeType_t, cublasGemmAlgo_t);
typedef cublasStatus_t (*newt_cublas_gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                                              int, int, int, const void *, const void *,
                                                              cudaDataType, int, long long int, const void *,
                                                              cudaDataType, int, long long int, const void *, void *,
                                                              cudaDataType, int, long long int, int,
                                                              cublasComputeType_t, cublasGemmAlgo_t);

/* X(member, symbol, type): every cuBLAS function the kernels call (the _v2 names are what
 * cublas_v2.h's macros stand for). */
#define NEWT_CUBLAS_FUNCTIONS(X)                                                                     \
  X(Create, cublasCreate_v2, __typeof__(cublasCreate_v2) *)                                        \
  X(Destroy, cublasDestroy_v2, __typeof__(cublasDestroy_v2) *)                                     \
  X(SetStream, cublasSetStream_v2, __typeof__(cublasSetStream_v2) *)                               \
  X(SetWorkspace, cublasSetWorkspace_v2, __typeof__(cublasSetWorkspace_v2) *)                      \
  X(GemmEx, cublasGemmEx, newt_cublas_gemm_ex)                                                     \
  X(GemmStridedBatchedEx, cublasGemmStridedBatchedEx, newt_cublas_gemm_strided_batched_ex)         \
  X(Sgemv, cublasSgemv_v2, __typeof__(cublasSgemv_v2) *)                                           \
  X(GetStatusName, cublasGetStatusName, __typeof__(cublasGetStatusName) *)                         \
  X(GetProperty, cublasGetProperty, __typeof__(cublasGetProperty) *)

typedef struct cublas_lib {
#define NEWT_CUBLAS_MEMBER(m, sym, type) type m;
  NEWT_CUBLAS_FUNCTIONS(NEWT_CUBLAS_MEMBER)
#undef NEWT_CUBLAS_MEMBER
  int major, minor, patch; /* the loaded library's version */
  char path[512];          /* the file loaded */
} cublas_lib;

/* The table, valid once cublas_lib_load returned NEWT_OK. */
extern cublas_lib cublas_api;

/* Loads cuBLAS once (thread-safe; later calls return the first one's result and message):
 * NEWT_ERR_NOTFOUND when no candidate opens or a symbol is missing. */
newt_result_t cublas_lib_load(void);

/* cublas_lib_load, then "cuBLAS 13.1.0 (/path/libcublas.so.13)" into desc. */
newt_result_t cublas_lib_describe(char *desc, size_t n);

#endif
