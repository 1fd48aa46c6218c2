/* Child processes: the launcher, the benchmarks and the tests start coordinators,
 * workers and etcd as real processes, signal them (kill -9, SIGSTOP, SIGTERM) and reap
 * them with a deadline. */
#ifndef NEWT_COMMON_PROC_H
#define NEWT_COMMON_PROC_H

#include <stdint.h>
#include <sys/types.h>

#include "err.h"

typedef struct newt_spawn_opts {
  const char *log_path;      /* stdout+stderr appended here; NULL inherits */
  const int *log_dir_fd;     /* non-NULL: log_path is a name in this open directory, opened there
                                without following a link (O_NOFOLLOW: a planted link is refused) */
  const char *const *env;    /* extra "K=V" entries, NULL-terminated; may be NULL */
  const char *cwd;           /* NULL keeps ours */
  int new_session;           /* setsid(): its own process group (kill the group) */
  int die_with_parent;       /* PR_SET_PDEATHSIG SIGKILL: never outlive the launcher */
} newt_spawn_opts;

newt_result_t newt_proc_spawn(const char *const *argv, const newt_spawn_opts *opts, pid_t *pid);

/* Waits up to timeout_ms (< 0: forever) for pid; *status is the waitpid status.
 * NEWT_ERR_TIMEOUT when it is still running. */
newt_result_t newt_proc_wait(pid_t pid, int64_t timeout_ms, int *status);

/* SIGTERM, then SIGKILL after grace_ms, then reaps. */
newt_result_t newt_proc_stop(pid_t pid, int64_t grace_ms);

/* SIGSTOP, then waits (up to timeout_ms) until every thread of pid is stopped: a signal
 * is delivered when each thread next enters the kernel, and a thread busy on another core
 * may answer one more request after kill() returned. */
newt_result_t newt_proc_pause(pid_t pid, int64_t timeout_ms);

/* 1 when pid exists and is not a zombie of ours. */
int newt_proc_alive(pid_t pid);

/* "exit 3", "killed by SIGKILL" for a waitpid status. */
const char *newt_proc_status_str(int status, char *buf, size_t cap);

/* Absolute path of the running executable (for re-executing `newt` subcommands). */
newt_result_t newt_proc_self_exe(char *buf, size_t cap);

#endif
