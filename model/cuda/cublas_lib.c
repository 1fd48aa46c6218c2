/* cuBLAS loaded at run time for the CUDA kernels (model/cuda/cublas_lib.h). */
#include "model/cuda/cublas_lib.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/dynlib.h"

#define STR_(x) #x
#define STR(x) STR_(x)
#define SONAME "libcublas.so." STR(CUBLAS_VER_MAJOR)

cublas_lib cublas_api;

static newt_dynlib_once once = NEWT_DYNLIB_ONCE;

static newt_result_t fill(void) {
  char a[600];
  const char *explicit = getenv("NEWT_CUBLAS_LIBRARY"), *cuda_home = getenv("CUDA_HOME");
  if (cuda_home && *cuda_home) snprintf(a, sizeof a, "%s/lib64/" SONAME, cuda_home);
  else a[0] = '\0';
  const char *some[] = {explicit};
  const char *all[] = {SONAME, a, "/usr/local/cuda/lib64/" SONAME};
  const char *hint = "the CUDA device needs cuBLAS " STR(CUBLAS_VER_MAJOR) ".x (the CUDA toolkit's, or pip's "
                     "nvidia-cublas): put its lib directory on LD_LIBRARY_PATH, or set NEWT_CUBLAS_LIBRARY to the "
                     "path of " SONAME;
  newt_dynlib lib;
  if (explicit && *explicit) NEWT_CHECK(newt_dynlib_open(&lib, "cuBLAS (NEWT_CUBLAS_LIBRARY)", some, 1, hint));
  else NEWT_CHECK(newt_dynlib_open(&lib, "cuBLAS (" SONAME ")", all, sizeof all / sizeof all[0], hint));
#define NEWT_CUBLAS_RESOLVE(m, sym, type) NEWT_CHECK(newt_dynlib_symbol(&lib, "cuBLAS", #sym, &cublas_api.m));
  NEWT_CUBLAS_FUNCTIONS(NEWT_CUBLAS_RESOLVE)
#undef NEWT_CUBLAS_RESOLVE
  snprintf(cublas_api.path, sizeof cublas_api.path, "%s", lib.path);
  if (cublas_api.GetProperty(MAJOR_VERSION, &cublas_api.major) != CUBLAS_STATUS_SUCCESS ||
      cublas_api.GetProperty(MINOR_VERSION, &cublas_api.minor) != CUBLAS_STATUS_SUCCESS ||
      cublas_api.GetProperty(PATCH_LEVEL, &cublas_api.patch) != CUBLAS_STATUS_SUCCESS)
    return NEWT_ERR(NEWT_ERR_CUDA, "cuBLAS at %s: cublasGetProperty failed", lib.path);
  if (cublas_api.major != CUBLAS_VER_MAJOR)
    return NEWT_ERR(NEWT_ERR_UNSUPPORTED, "cuBLAS at %s is version %d.%d.%d: this newt was built for cuBLAS %d", lib.path,
                    cublas_api.major, cublas_api.minor, cublas_api.patch, CUBLAS_VER_MAJOR);
  return NEWT_OK;
}

newt_result_t cublas_lib_load(void) { return newt_dynlib_load(&once, fill); }

newt_result_t cublas_lib_describe(char *desc, size_t n) {
  NEWT_CHECK(cublas_lib_load());
  snprintf(desc, n, "cuBLAS %d.%d.%d (%s)", cublas_api.major, cublas_api.minor, cublas_api.patch, cublas_api.path);
  return NEWT_OK;
}
