/* Libraries loaded at run time (dlopen): how newt uses NCCL and cuBLAS, so that a newt built
 * with CUDA starts -- `newt --version`, CPU workers, the coordinator -- on a host that has
 * neither, and says what it looked for when a GPU part asks for one.
 *
 * A caller names the library (for messages), the file names to try in order (a bare
 * soname goes through the dynamic loader's search: LD_LIBRARY_PATH, the binary's RUNPATH,
 * ld.so.cache, the default directories; a path is opened as it is) and the symbols it needs;
 * the first candidate that opens is the one used -- one that opens but lacks a symbol is an
 * error naming the symbol, never a silent fall back to the next. */
#ifndef NEWT_COMMON_DYNLIB_H
#define NEWT_COMMON_DYNLIB_H

#include <pthread.h>
#include <stddef.h>

#include "err.h"

typedef struct newt_dynlib {
  void *handle;
  char path[512]; /* the file the loader opened ("" when unknown) */
} newt_dynlib;

/* Opens the first of candidates[0..n) (NULL or "" entries are skipped) that the dynamic
 * loader accepts. On failure NEWT_ERR_NOTFOUND whose message names `what`, every candidate
 * tried with the loader's reason, and `hint` (may be NULL). */
newt_result_t newt_dynlib_open(newt_dynlib *lib, const char *what, const char *const *candidates, size_t n,
                               const char *hint);

/* Resolves `name` into *fn_out, a function pointer of the caller's type (written as the
 * loader's address, as POSIX allows); a missing symbol is NEWT_ERR_NOTFOUND naming it,
 * `what` and the file. */
newt_result_t newt_dynlib_symbol(const newt_dynlib *lib, const char *what, const char *name, void *fn_out);

/* A library loaded once per process: the first newt_dynlib_load calls `load`, which fills the
 * caller's table; every call returns that first result, with its message (a load is not
 * retried: the process's environment has not changed). Define one with NEWT_DYNLIB_ONCE. */
typedef struct newt_dynlib_once {
  pthread_mutex_t mu;
  int done;
  newt_result_t result;
  char error[1536];
} newt_dynlib_once;
#define NEWT_DYNLIB_ONCE {PTHREAD_MUTEX_INITIALIZER, 0, NEWT_OK, ""}

newt_result_t newt_dynlib_load(newt_dynlib_once *once, newt_result_t (*load)(void));

#endif
