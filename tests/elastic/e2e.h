/* What the end-to-end tests of tests/elastic share: running a command and keeping what it
 * printed. */
#ifndef NEWT_TESTS_ELASTIC_E2E_H
#define NEWT_TESTS_ELASTIC_E2E_H

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/proc.h"

/* Runs argv, its stdout and stderr into dir/out.<pid> and then *out (malloc'd; may be NULL);
 * returns its exit status, or -1 when it could not run or did not end within 300 s. */
static inline int e2e_run_capture(const char *dir, const char *const *argv, char **out) {
  char path[512];
  snprintf(path, sizeof path, "%s/out.%d", dir, (int)getpid());
  unlink(path);
  newt_spawn_opts so = {.log_path = path};
  pid_t pid;
  if (newt_proc_spawn(argv, &so, &pid) != NEWT_OK) return -1;
  int st = 0;
  if (newt_proc_wait(pid, 300000, &st) != NEWT_OK) {
    newt_proc_stop(pid, 1000);
    return -1;
  }
  size_t n;
  if (out && newt_fs_read_all(path, 64 << 20, out, &n) != NEWT_OK) *out = NULL;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
