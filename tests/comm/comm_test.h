/* Helpers shared by the comm tests: a "world" of N rank processes on this machine
 * (loopback addresses on free ports, one host name for all ranks, one per rank, or two
 * hosts), forked from the test, each running a function that returns its number of
 * failed checks; the parent waits for them with a deadline, kills stragglers and counts
 * the ranks that failed. A page of shared memory lets ranks and the parent exchange
 * small facts (times, pids). */
#ifndef NEWT_TESTS_COMM_TEST_H
#define NEWT_TESTS_COMM_TEST_H

#include <arpa/inet.h>
#include <dirent.h>
#include <sys/socket.h>
#include <time.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/proc.h"
#include "common/sys.h"

#define CT_MAX 16

/* Checks inside a rank process: print "rank R: FAIL file:line: ..." and count; the rank's
 * function returns ct_failures (its exit status says whether any check failed). */
static int ct_failures __attribute__((unused));

#define CHECKR(cond, ...)                                                   \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__);   \
      fprintf(stderr, __VA_ARGS__);                                         \
      fputc('\n', stderr);                                                  \
      ct_failures++;                                                        \
    }                                                                       \
  } while (0)

#define OKR(call)                                                                          \
  do {                                                                                     \
    newt_result_t r_ = (call);                                                             \
    CHECKR(r_ == NEWT_OK, "%s -> %s: %s", #call, newt_result_name(r_), newt_errmsg());     \
  } while (0)

/* Element i of a buffer of type dt, as a double, and back (with the type's rounding). */
static inline void ct_set_elem(newt_dtype dt, void *buf, size_t i, double v) {
  switch (dt) {
    case NEWT_F32: ((float *)buf)[i] = (float)v; break;
    case NEWT_BF16: ((uint16_t *)buf)[i] = newt_f32_to_bf16((float)v); break;
    case NEWT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case NEWT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case NEWT_U8: ((uint8_t *)buf)[i] = (uint8_t)(int)v; break;
    default: break;
  }
}

static inline double ct_get_elem(newt_dtype dt, const void *buf, size_t i) {
  switch (dt) {
    case NEWT_F32: return ((const float *)buf)[i];
    case NEWT_BF16: return newt_bf16_to_f32(((const uint16_t *)buf)[i]);
    case NEWT_I32: return ((const int32_t *)buf)[i];
    case NEWT_I64: return (double)((const int64_t *)buf)[i];
    case NEWT_U8: return ((const uint8_t *)buf)[i];
    default: return 0;
  }
}

enum { CT_SHM = 0, CT_TCP = 1, CT_MIXED = 2 };

typedef struct ct_shared {
  _Atomic int ready;        /* ranks that reached a point */
  _Atomic int go;           /* the parent's signal */
  _Atomic uint64_t t_ns[8]; /* free slots for times (monotonic ns) */
  _Atomic int64_t val[CT_MAX];
  _Atomic int errors[CT_MAX];
} ct_shared;

typedef struct ct_world {
  int size;
  int mode;
  char job[48];
  char addr_buf[CT_MAX][64];
  char host_buf[CT_MAX][32];
  const char *addrs[CT_MAX];
  const char *hosts[CT_MAX];
  unsigned char secret[32];
  uint64_t generation;
  int64_t timeout_ms;
  pid_t pids[CT_MAX];
  int lfd[CT_MAX]; /* each rank's listening socket, bound here so no other process takes the port */
  ct_shared *sh;
} ct_world;

static inline void ct_world_init(ct_world *w, int size, int mode, const char *name) {
  memset(w, 0, sizeof *w);
  w->size = size;
  w->mode = mode;
  snprintf(w->job, sizeof w->job, "t%d-%s", (int)getpid(), name);
  for (int r = 0; r < size; r++) {
    int port = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    w->lfd[r] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (w->lfd[r] < 0 || bind(w->lfd[r], (struct sockaddr *)&sa, sizeof sa) != 0 || listen(w->lfd[r], 64) != 0 ||
        getsockname(w->lfd[r], (struct sockaddr *)&sa, &len) != 0) {
      fprintf(stderr, "no listening socket on 127.0.0.1\n");
      exit(2);
    }
    port = ntohs(sa.sin_port);
    snprintf(w->addr_buf[r], sizeof w->addr_buf[r], "127.0.0.1:%d", port);
    if (mode == CT_SHM) snprintf(w->host_buf[r], sizeof w->host_buf[r], "hostA");
    else if (mode == CT_TCP) snprintf(w->host_buf[r], sizeof w->host_buf[r], "host%d", r);
    else snprintf(w->host_buf[r], sizeof w->host_buf[r], "host%d", r % 2);
    w->addrs[r] = w->addr_buf[r];
    w->hosts[r] = w->host_buf[r];
  }
  newt_random_bytes(w->secret, sizeof w->secret);
  w->generation = 7;
  w->timeout_ms = 20000;
  w->sh = mmap(NULL, sizeof(ct_shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (w->sh == MAP_FAILED) {
    perror("mmap");
    exit(2);
  }
  memset(w->sh, 0, sizeof *w->sh);
}

/* Sends this rank's stderr (its log lines, unbuffered) to <dir>/rank<rank>.log, for the
 * parent to read back: 0, or -1 when the file cannot be opened. */
static inline int ct_log_to(const char *dir, int rank) {
  char path[512];
  snprintf(path, sizeof path, "%s/rank%d.log", dir, rank);
  if (!freopen(path, "w", stderr)) return -1;
  setvbuf(stderr, NULL, _IONBF, 0);
  return 0;
}

static inline void ct_world_free(ct_world *w) {
  for (int r = 0; r < w->size; r++)
    if (w->lfd[r] > 0) close(w->lfd[r]);
  munmap(w->sh, sizeof(ct_shared));
}

static inline void ct_config(const ct_world *w, int rank, comm_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->backend = COMM_BACKEND_CPU;
  cfg->rank = rank;
  cfg->size = w->size;
  cfg->addrs = w->addrs;
  cfg->hosts = w->hosts;
  cfg->job = w->job;
  cfg->generation = w->generation;
  memcpy(cfg->secret, w->secret, sizeof w->secret);
  cfg->secret_len = sizeof w->secret;
  cfg->timeout_ms = w->timeout_ms;
  cfg->listen_fd = w->lfd[rank];
}

/* The configuration of `rank` in a communicator of members[0..nm) of w (a later
 * generation among survivors, say); addrs and hosts ([CT_MAX]) back cfg's tables. */
static inline void ct_config_members(const ct_world *w, int rank, const int *members, int nm, comm_config *cfg,
                                     const char **addrs, const char **hosts) {
  ct_config(w, rank, cfg);
  cfg->rank = -1;
  for (int i = 0; i < nm; i++) {
    addrs[i] = w->addrs[members[i]];
    hosts[i] = w->hosts[members[i]];
    if (members[i] == rank) cfg->rank = i;
  }
  cfg->size = nm;
  cfg->addrs = addrs;
  cfg->hosts = hosts;
}

/* A blocked operation aborted from another thread: the *_async allreduce and allgather
 * are queued (q1, q2), then the blocking allreduce of count floats x -> y waits (the peers
 * must not join) until comm_abort after after_ms; returns its result, *ms the time from the
 * abort to its return. */
typedef struct ct_aborter {
  comm_t *c;
  int64_t after_ms;
  uint64_t t_abort;
} ct_aborter;

static inline void *ct_abort_later(void *arg) {
  ct_aborter *a = arg;
  newt_sleep_ms(a->after_ms);
  a->t_abort = newt_now_ns();
  comm_abort(a->c);
  return NULL;
}

static inline newt_result_t ct_blocked_abort(comm_t *c, void *x, void *y, size_t count, int64_t after_ms,
                                             comm_req_t **q1, comm_req_t **q2, double *ms) {
  *q1 = *q2 = NULL;
  newt_result_t r1 = comm_allreduce_async(c, x, y, count, NEWT_F32, COMM_SUM, q1);
  newt_result_t r2 = comm_allgather_async(c, x, y, 16, NEWT_F32, q2);
  ct_aborter a = {.c = c, .after_ms = after_ms};
  pthread_t th;
  pthread_create(&th, NULL, ct_abort_later, &a);
  newt_result_t r = comm_allreduce(c, x, y, count, NEWT_F32, COMM_SUM);
  uint64_t t_ret = newt_now_ns();
  pthread_join(th, NULL);
  *ms = (double)(t_ret - a.t_abort) / 1e6;
  if (r1 != NEWT_OK || r2 != NEWT_OK) return NEWT_ERR(NEWT_ERR_INTERNAL, "queuing the *_async operations failed");
  return r;
}

typedef int (*ct_rank_fn)(ct_world *w, int rank, void *arg);

/* Forks the process of one rank running fn; it exits with 0 when fn found no failure. */
static inline void ct_spawn_one(ct_world *w, int r, ct_rank_fn fn, void *arg) {
  fflush(stdout);
  fflush(stderr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    exit(2);
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(3);
    int failures = fn(w, r, arg);
    fflush(stdout);
    fflush(stderr);
    exit(failures ? 1 : 0);
  }
  w->pids[r] = pid;
}

/* Forks one process per rank. */
static inline void ct_spawn(ct_world *w, ct_rank_fn fn, void *arg) {
  for (int r = 0; r < w->size; r++) ct_spawn_one(w, r, fn, arg);
}

/* Waits for every rank; returns the number of ranks that failed (a killed rank counts
 * unless `killed` says it was killed on purpose). */
static inline int ct_wait(ct_world *w, int64_t timeout_ms, const int *killed) {
  int bad = 0;
  newt_deadline_t d = newt_deadline_in_ms(timeout_ms);
  for (int r = 0; r < w->size; r++) {
    if (w->pids[r] <= 0) continue;
    int st = 0;
    int64_t left = newt_deadline_left_ms(d);
    if (newt_proc_wait(w->pids[r], left, &st) != NEWT_OK) {
      fprintf(stderr, "rank %d (pid %d) did not finish in time; killing it\n", r, (int)w->pids[r]);
      kill(w->pids[r], SIGCONT);
      kill(w->pids[r], SIGKILL);
      newt_proc_wait(w->pids[r], 5000, &st);
      bad++;
    } else if (killed && killed[r]) {
      /* expected */
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      char buf[64];
      fprintf(stderr, "rank %d (pid %d): %s\n", r, (int)w->pids[r], newt_proc_status_str(st, buf, sizeof buf));
      bad++;
    }
    w->pids[r] = 0;
  }
  return bad;
}

/* A fault injected for real: once every rank said it is ready (sh->ready reaches the
 * size), signals the victim (the time in sh->t_ns[0]), waits for the survivors and reaps
 * the victim (killed first when it was only stopped). Returns how many survivors failed,
 * -1 when the ranks never got going. */
static inline int ct_fault_when_ready(ct_world *w, int victim, int sig, int64_t ready_ms, int64_t wait_ms) {
  newt_deadline_t d = newt_deadline_in_ms(ready_ms);
  while (atomic_load(&w->sh->ready) < w->size && !newt_deadline_passed(d)) newt_sleep_ms(1);
  int going = atomic_load(&w->sh->ready) >= w->size;
  newt_sleep_ms(20);
  w->sh->t_ns[0] = newt_now_ns();
  kill(w->pids[victim], sig);
  int killed[CT_MAX] = {0};
  killed[victim] = 1;
  pid_t vp = w->pids[victim];
  w->pids[victim] = 0;
  int bad = ct_wait(w, wait_ms, killed);
  kill(vp, SIGKILL);
  newt_proc_wait(vp, 10000, NULL);
  return going ? bad : -1;
}

/* Entries of /dev/shm whose name contains `needle`. */
static inline int ct_shm_count(const char *needle) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strstr(e->d_name, needle)) n++;
  closedir(d);
  return n;
}

static inline int ct_count_dir(const char *path) {
  DIR *d = opendir(path);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

/* Reads exactly n bytes from a socket: 0, or -1 when it closed or failed first. */
static inline int ct_read_full(int fd, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = recv(fd, (char *)buf + got, n - got, 0);
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

/* Open fds and threads of this process. */
static inline int ct_fd_count(void) { return ct_count_dir("/proc/self/fd"); }
static inline int ct_thread_count(void) { return ct_count_dir("/proc/self/task"); }

/* The thread count once it is back to `want`, or what it is after 5 s: a joined thread leaves
 * /proc/self/task a moment after pthread_join returns (the kernel reaps it), so the check
 * waits for that event rather than catching the moment between. */
static inline int ct_threads_back_to(int want) {
  int n = ct_thread_count();
  for (int i = 0; i < 500 && n != want; i++) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
    n = ct_thread_count();
  }
  return n;
}

#endif
