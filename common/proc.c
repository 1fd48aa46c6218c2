/* Spawning, signalling and reaping child processes (see proc.h). Uses fork+exec so the
 * child can redirect output, change directory, start a session and ask to die with its
 * parent before exec. */

#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"

newt_result_t newt_proc_spawn(const char *const *argv, const newt_spawn_opts *opts, pid_t *out) {
  newt_spawn_opts none = {0};
  if (!opts) opts = &none;
  pid_t parent = getpid();
  int errpipe[2];
  if (pipe2(errpipe, O_CLOEXEC) != 0)
    return NEWT_ERR(NEWT_ERR_SYS, "pipe for spawning %s: %s", argv[0], strerror(errno));
  pid_t pid = fork();
  if (pid < 0) {
    close(errpipe[0]);
    close(errpipe[1]);
    return NEWT_ERR(NEWT_ERR_SYS, "fork for %s: %s", argv[0], strerror(errno));
  }
  if (pid == 0) {
    close(errpipe[0]);
    if (opts->die_with_parent) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
    }
    if (opts->new_session) setsid();
    signal(SIGPIPE, SIG_DFL);
    if (opts->log_path) {
      int fd = opts->log_dir_fd
                   ? openat(*opts->log_dir_fd, opts->log_path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NOCTTY, 0644)
                   : open(opts->log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd < 0 && opts->log_dir_fd) { /* never written through a link: the child does not run */
        int e = errno;
        ssize_t w = write(errpipe[1], &e, sizeof e);
        (void)w;
        _exit(127);
      }
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
      }
      int nul = open("/dev/null", O_RDONLY);
      if (nul >= 0) {
        dup2(nul, 0);
        close(nul);
      }
    }
    if (opts->cwd && chdir(opts->cwd) != 0) {
      int e = errno;
      ssize_t w = write(errpipe[1], &e, sizeof e);
      (void)w;
      _exit(127);
    }
    for (const char *const *e = opts->env; e && *e; e++) putenv((char *)*e);
    execvp(argv[0], (char *const *)argv);
    int e = errno;
    ssize_t w = write(errpipe[1], &e, sizeof e);
    (void)w;
    _exit(127);
  }
  close(errpipe[1]);
  int child_errno = 0;
  ssize_t r;
  do r = read(errpipe[0], &child_errno, sizeof child_errno);
  while (r < 0 && errno == EINTR);
  close(errpipe[0]);
  if (r == (ssize_t)sizeof child_errno) {
    waitpid(pid, NULL, 0);
    return NEWT_ERR(child_errno == ENOENT ? NEWT_ERR_NOTFOUND : NEWT_ERR_SYS, "cannot run %s: %s",
                    argv[0], strerror(child_errno));
  }
  *out = pid;
  return NEWT_OK;
}

newt_result_t newt_proc_wait(pid_t pid, int64_t timeout_ms, int *status) {
  newt_deadline_t d = newt_deadline_in_ms(timeout_ms);
  int64_t nap_us = 200;
  for (;;) {
    int st = 0;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      if (status) *status = st;
      return NEWT_OK;
    }
    if (r < 0 && errno != EINTR)
      return NEWT_ERR(NEWT_ERR_SYS, "waitpid %d: %s", (int)pid, strerror(errno));
    if (newt_deadline_passed(d))
      return NEWT_ERR(NEWT_ERR_TIMEOUT, "process %d still running after %lld ms", (int)pid,
                      (long long)timeout_ms);
    newt_sleep_us(nap_us);
    if (nap_us < 20000) nap_us *= 2;
  }
}

newt_result_t newt_proc_stop(pid_t pid, int64_t grace_ms) {
  if (pid <= 0) return NEWT_OK;
  kill(pid, SIGCONT); /* a stopped process cannot act on SIGTERM */
  kill(pid, SIGTERM);
  if (newt_proc_wait(pid, grace_ms, NULL) == NEWT_OK) return NEWT_OK;
  kill(pid, SIGKILL);
  return newt_proc_wait(pid, 10000, NULL);
}

/* The state letter of /proc/PATH/stat ('R', 'S', 'T', 'Z'...); '?' when it cannot be read. */
static char stat_state(const char *path) {
  char state = '?';
  FILE *f = fopen(path, "r");
  if (!f) return '?';
  if (fscanf(f, "%*d (%*[^)]) %c", &state) != 1) state = '?';
  fclose(f);
  return state;
}

int newt_proc_alive(pid_t pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return 0;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  char state = stat_state(path);
  return state != 'Z' && state != 'X';
}

/* 1 when every thread of pid is stopped (or gone). */
static int all_threads_stopped(pid_t pid) {
  char dir[64];
  snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
  DIR *d = opendir(dir);
  if (!d) return 1; /* gone */
  int stopped = 1;
  struct dirent *e;
  while (stopped && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[400];
    snprintf(path, sizeof path, "%s/%s/stat", dir, e->d_name);
    char st = stat_state(path);
    stopped = st == 'T' || st == 't' || st == '?' || st == 'Z' || st == 'X';
  }
  closedir(d);
  return stopped;
}

newt_result_t newt_proc_pause(pid_t pid, int64_t timeout_ms) {
  if (pid <= 0 || kill(pid, SIGSTOP) != 0)
    return NEWT_ERR(NEWT_ERR_SYS, "SIGSTOP to %d: %s", (int)pid, pid > 0 ? strerror(errno) : "no such process");
  newt_deadline_t d = newt_deadline_in_ms(timeout_ms);
  int64_t nap_us = 100;
  while (!all_threads_stopped(pid)) {
    if (newt_deadline_passed(d))
      return NEWT_ERR(NEWT_ERR_TIMEOUT, "process %d not stopped %lld ms after SIGSTOP", (int)pid, (long long)timeout_ms);
    newt_sleep_us(nap_us);
    if (nap_us < 5000) nap_us *= 2;
  }
  return NEWT_OK;
}

const char *newt_proc_status_str(int st, char *buf, size_t cap) {
  if (WIFEXITED(st)) snprintf(buf, cap, "exit %d", WEXITSTATUS(st));
  else if (WIFSIGNALED(st)) snprintf(buf, cap, "killed by SIG%s", sigabbrev_np(WTERMSIG(st)) ? sigabbrev_np(WTERMSIG(st)) : "?");
  else snprintf(buf, cap, "status 0x%x", st);
  return buf;
}

newt_result_t newt_proc_self_exe(char *buf, size_t cap) {
  ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
  if (n < 0) return NEWT_ERR(NEWT_ERR_SYS, "readlink /proc/self/exe: %s", strerror(errno));
  buf[n] = '\0';
  return NEWT_OK;
}
