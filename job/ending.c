/* The exit status and termination message of a process of a job (see ending.h). */
#include "job/ending.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *job_termination_log(const char *flag) {
  if (flag && *flag) return flag;
  const char *env = getenv("NEWT_TERMINATION_LOG");
  return env && *env ? env : JOB_TERMINATION_LOG;
}

int job_exit_status(newt_result_t r) {
  return r == NEWT_ERR_INVALID || r == NEWT_ERR_UNSUPPORTED ? JOB_EXIT_USAGE : JOB_EXIT_ERROR;
}

int job_end_write(const char *who, newt_result_t r, job_end *e, const char *path) {
  if (r != NEWT_OK) {
    e->status = job_exit_status(r);
    snprintf(e->msg, sizeof e->msg, "error: %s", newt_errmsg());
    fprintf(stderr, "%s: %s\n", who, newt_errmsg());
  } else if (!e->msg[0]) {
    snprintf(e->msg, sizeof e->msg, "%s", e->status == JOB_EXIT_DONE ? "done" : "ended");
  }
  /* the default exists only in a container; elsewhere nothing is written */
  int explicit = strcmp(path, JOB_TERMINATION_LOG) != 0;
  int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | (explicit ? O_CREAT : 0), 0644);
  if (fd >= 0) {
    char line[sizeof e->msg + 2];
    int n = snprintf(line, sizeof line, "%s\n", e->msg);
    ssize_t w = write(fd, line, (size_t)n);
    (void)w;
    close(fd);
  } else if (explicit) {
    fprintf(stderr, "%s: cannot write the termination log %s\n", who, path);
  }
  return e->status;
}
