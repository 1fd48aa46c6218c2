/* The GPU libraries newt loads at run time (comm/nccl_lib.h, model/cuda/cublas_lib.h): a
 * newt built with CUDA links neither NCCL nor cuBLAS, so it starts where they are missing,
 * and the part that needs one says what it looked for.
 *
 *   found        NCCL and cuBLAS load from this machine's CUDA toolkit (the build found
 *                NCCL there), each with its version and file; the loaded NCCL is new enough
 *   missing      NEWT_NCCL_LIBRARY / NEWT_CUBLAS_LIBRARY naming no file: the error names
 *                the path and what to install; comm_create of the NCCL backend returns it,
 *                before it builds anything (no descriptor left open)
 *   too_old      a libnccl.so.2 of version 2.27.3 (fake_nccl.c) is refused, naming its
 *                version, its file and the version needed
 *   partial      a library lacking ncclCommShrink is refused, naming the symbol
 *   explicit     NEWT_NCCL_LIBRARY wins over the loader's search: a stand-in of version
 *                2.28.7 is the one loaded
 *   once         a second load gives the first one's answer without loading again
 *
 * Each case runs in a process of its own (a process loads a library once). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm_test.h"
#include "common/err.h"
#include "model/dev.h"
#include "test.h"

/* Runs fn in a child with env NAME=VALUE set (NULL: none); the child's failed checks fail
 * the calling case. */
static void in_child(void (*fn)(void), const char *name, const char *value) {
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    if (name) setenv(name, value, 1);
    t_cur_failed = 0;
    fn();
    fflush(stderr);
    _exit(t_cur_failed ? 1 : 0);
  }
  int st = 0;
  T_CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
  T_CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's checks failed (status %d)", st);
}

static void found_child(void) {
  char d[768];
  T_OK(comm_backend_library(COMM_BACKEND_NCCL, d, sizeof d));
  int maj = 0, min = 0, pat = 0;
  T_CHECK_MSG(sscanf(d, "NCCL %d.%d.%d (", &maj, &min, &pat) == 3, "%s", d);
  T_CHECK_MSG(maj * 10000 + min * 100 + pat >= 22807, "NCCL %d.%d.%d is older than the backend's 2.28.7", maj, min,
              pat);
  T_CHECK_MSG(strstr(d, "libnccl.so.2)"), "no file in \"%s\"", d);
  T_OK(model_dev_cuda_library(d, sizeof d));
  T_CHECK_MSG(strncmp(d, "cuBLAS 13.", 10) == 0 && strstr(d, "libcublas.so.13)"), "%s", d);
}
static void test_found(void) { in_child(found_child, NULL, NULL); }

static void missing_nccl_child(void) {
  char d[768];
  T_ERR(NEWT_ERR_NOTFOUND, comm_backend_library(COMM_BACKEND_NCCL, d, sizeof d));
  const char *m = newt_errmsg();
  T_CHECK_MSG(strstr(m, "/nonexistent/libnccl.so.2") && strstr(m, "NEWT_NCCL_LIBRARY") &&
                  strstr(m, "2.28.7 or newer"),
              "%s", m);
  /* the backend returns the loader's error before it builds anything */
  ct_world w;
  ct_world_init(&w, 1, CT_TCP, "libsnccl");
  comm_config cfg;
  ct_config(&w, 0, &cfg);
  cfg.backend = COMM_BACKEND_NCCL;
  cfg.device = 0;
  comm_t *c = NULL;
  int fds = ct_fd_count();
  T_ERR(NEWT_ERR_NOTFOUND, comm_create(&cfg, &c));
  T_CHECK_MSG(strstr(newt_errmsg(), "/nonexistent/libnccl.so.2"), "%s", newt_errmsg());
  T_CHECK(c == NULL);
  T_CHECK(ct_fd_count() == fds);
  ct_world_free(&w);
}
static void missing_cublas_child(void) {
  char d[768];
  T_ERR(NEWT_ERR_NOTFOUND, model_dev_cuda_library(d, sizeof d));
  T_CHECK_MSG(strstr(newt_errmsg(), "/nonexistent/libcublas.so.13") && strstr(newt_errmsg(), "LD_LIBRARY_PATH"), "%s",
              newt_errmsg());
}
static void test_missing(void) {
  in_child(missing_nccl_child, "NEWT_NCCL_LIBRARY", "/nonexistent/libnccl.so.2");
  in_child(missing_cublas_child, "NEWT_CUBLAS_LIBRARY", "/nonexistent/libcublas.so.13");
}

static void too_old_child(void) {
  char d[768];
  T_ERR(NEWT_ERR_UNSUPPORTED, comm_backend_library(COMM_BACKEND_NCCL, d, sizeof d));
  const char *m = newt_errmsg();
  T_CHECK_MSG(strstr(m, "NCCL 2.27.3 at ") && strstr(m, FAKE_NCCL_OLD) && strstr(m, "needs 2.28.7 or newer"), "%s", m);
}
static void test_too_old(void) { in_child(too_old_child, "NEWT_NCCL_LIBRARY", FAKE_NCCL_OLD); }

static void partial_child(void) {
  char d[768];
  T_ERR(NEWT_ERR_NOTFOUND, comm_backend_library(COMM_BACKEND_NCCL, d, sizeof d));
  T_CHECK_MSG(strstr(newt_errmsg(), "lacks ncclCommShrink") && strstr(newt_errmsg(), FAKE_NCCL_PARTIAL), "%s",
              newt_errmsg());
}
static void test_partial(void) { in_child(partial_child, "NEWT_NCCL_LIBRARY", FAKE_NCCL_PARTIAL); }

static void explicit_child(void) {
  char d[768];
  T_OK(comm_backend_library(COMM_BACKEND_NCCL, d, sizeof d));
  char want[600];
  snprintf(want, sizeof want, "NCCL 2.28.7 (%s)", FAKE_NCCL_NEW);
  T_CHECK_MSG(strcmp(d, want) == 0, "\"%s\", expected \"%s\"", d, want);
}
static void test_explicit(void) { in_child(explicit_child, "NEWT_NCCL_LIBRARY", FAKE_NCCL_NEW); }

static void once_child(void) {
  char d[768];
  T_ERR(NEWT_ERR_UNSUPPORTED, comm_backend_library(COMM_BACKEND_NCCL, d, sizeof d));
  /* the answer is kept: changing the variable now loads nothing else */
  setenv("NEWT_NCCL_LIBRARY", FAKE_NCCL_NEW, 1);
  T_ERR(NEWT_ERR_UNSUPPORTED, comm_backend_library(COMM_BACKEND_NCCL, d, sizeof d));
  T_CHECK_MSG(strstr(newt_errmsg(), "NCCL 2.27.3 at "), "%s", newt_errmsg());
}
static void test_once(void) { in_child(once_child, "NEWT_NCCL_LIBRARY", FAKE_NCCL_OLD); }

int main(void) {
  T_RUN(test_found);
  T_RUN(test_missing);
  T_RUN(test_too_old);
  T_RUN(test_partial);
  T_RUN(test_explicit);
  T_RUN(test_once);
  return T_DONE();
}
