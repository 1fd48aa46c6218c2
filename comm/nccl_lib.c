/* NCCL loaded at run time for the NCCL backend (comm/nccl_lib.h). */
#include "comm/nccl_lib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dynlib.h"

nccl_lib nccl_api;

static newt_dynlib_once once = NEWT_DYNLIB_ONCE;

static void version_text(int code, char *out, size_t n) {
  /* NCCL_VERSION(X,Y,Z) is X*10000+Y*100+Z from 2.9 on */
  snprintf(out, n, "%d.%d.%d", code / 10000, code / 100 % 100, code % 100);
}

#ifdef NEWT_NCCL_LINKED
static newt_result_t fill(void) {
#define NEWT_NCCL_TAKE(f) nccl_api.f = nccl##f;
  NEWT_NCCL_FUNCTIONS(NEWT_NCCL_TAKE)
#undef NEWT_NCCL_TAKE
  snprintf(nccl_api.path, sizeof nccl_api.path, "linked");
  return NEWT_OK;
}
#else
/* dir/libnccl.so.2 into out, or "" when dir is unset */
static const char *in_dir(const char *dir, const char *sub, char *out, size_t n) {
  if (!dir || !*dir) return "";
  snprintf(out, n, "%s%s/libnccl.so.2", dir, sub);
  return out;
}

static newt_result_t fill(void) {
  char a[600], b[600], c[600];
  const char *explicit = getenv("NEWT_NCCL_LIBRARY");
  const char *nccl_home = getenv("NCCL_HOME"), *cuda_home = getenv("CUDA_HOME");
  const char *some[] = {explicit};
  const char *all[] = {"libnccl.so.2", in_dir(nccl_home, "/lib", a, sizeof a), in_dir(nccl_home, "/lib64", b, sizeof b),
                       in_dir(cuda_home, "/lib64", c, sizeof c), "/usr/local/cuda/lib64/libnccl.so.2"};
  newt_dynlib lib;
  const char *hint = "NCCL " NEWT_NCCL_MIN_TEXT " or newer is needed: install it (Debian/Ubuntu: libnccl2; pip: "
                     "nvidia-nccl-cu13) and put its lib directory on LD_LIBRARY_PATH, or set NEWT_NCCL_LIBRARY to "
                     "the path of libnccl.so.2";
  if (explicit && *explicit) NEWT_CHECK(newt_dynlib_open(&lib, "NCCL (NEWT_NCCL_LIBRARY)", some, 1, hint));
  else NEWT_CHECK(newt_dynlib_open(&lib, "NCCL (libnccl.so.2)", all, sizeof all / sizeof all[0], hint));
#define NEWT_NCCL_RESOLVE(f) NEWT_CHECK(newt_dynlib_symbol(&lib, "NCCL", "nccl" #f, &nccl_api.f));
  NEWT_NCCL_FUNCTIONS(NEWT_NCCL_RESOLVE)
#undef NEWT_NCCL_RESOLVE
  snprintf(nccl_api.path, sizeof nccl_api.path, "%s", lib.path);
  return NEWT_OK;
}
#endif

static newt_result_t load(void) {
  newt_result_t r = fill();
  if (r == NEWT_OK) {
    int v = 0;
    ncclResult_t nr = nccl_api.GetVersion(&v);
    if (nr != ncclSuccess) {
      r = NEWT_ERR(NEWT_ERR_NCCL, "NCCL at %s: ncclGetVersion failed (%d)", nccl_api.path, (int)nr);
    } else if (v < NEWT_NCCL_MIN_CODE) {
      char have[32];
      version_text(v, have, sizeof have);
      r = NEWT_ERR(NEWT_ERR_UNSUPPORTED,
                   "NCCL %s at %s is too old: newt's NCCL backend needs " NEWT_NCCL_MIN_TEXT
                   " or newer (ncclCommRevoke, ncclCommShrink); point NEWT_NCCL_LIBRARY or LD_LIBRARY_PATH at a "
                   "newer libnccl.so.2",
                   have, nccl_api.path);
    }
    nccl_api.version = v;
  }
  return r;
}

newt_result_t nccl_lib_load(void) { return newt_dynlib_load(&once, load); }

newt_result_t nccl_lib_describe(char *desc, size_t n) {
  NEWT_CHECK(nccl_lib_load());
  char v[32];
  version_text(nccl_api.version, v, sizeof v);
  snprintf(desc, n, "NCCL %s (%s)", v, nccl_api.path);
  return NEWT_OK;
}
