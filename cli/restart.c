/* The restart mode's supervisor (cli/restart.h): a program that does not link newt, run as
 * torchrun runs it, restarted by newt whenever the job's membership changes.
 *
 * It is a libnewt program like gpt/worker.c, on newt.h and worker/bridge.h alone. Its steps
 * are beats: at most one every NEWT_RESTART_BEAT_MS (50 ms), so the step protocol, etcd and
 * the logs see a bounded rate whatever the program does.
 *
 *   NEXT_GENERATION   end the program (SIGTERM to its process group, SIGKILL after
 *                     NEWT_RESTART_GRACE_MS); restore (the count of the programs' starts,
 *                     the one state declared); exchange, over
 *                     the world: each rank's address, host and restart count, rank 0's fresh
 *                     port; start the program with the torchrun environment of the new world
 *   NEXT_STEP         a beat: a restart the last beat's sums asked for (the same exchange),
 *                     then watch the program for a beat; commit {progressed, exited 0,
 *                     failed, stopped, rank 0's loss}; act on the sums (below)
 *   NEXT_LEFT, ...    end the program; newt_finish says the exit status
 *
 * What the sums say, every supervisor alike (they are bitwise the same on every rank):
 *
 *   a program failed (exit != 0, a signal) or is stopped (SIGSTOP)   restart all, same world
 *   no program progressed for spec.fault.hang_timeout_ms              restart all, same world
 *     (first_step_timeout_ms until one printed a step or wrote its heartbeat)
 *   every program exited 0                                            the job is done
 *   failure restarts beyond spec.fault.max_failures in the window     the job fails
 *
 * Times are rank 0's clock, a value of the beat's commit, so every rank agrees on them; the
 * restart count and the failure restarts' times are state newt keeps for the supervisors
 * (NEWT_PER_JOB bytes: a joiner gets them from its peers).
 *
 * Progress is activity of the program's process group (its I/O, rchar + wchar of
 * /proc/PID/io, or its CPU time: a long step that computes and says nothing is not a hang)
 * or a change of the heartbeat file (NEWT_HEARTBEAT_FILE: its time or size). A program that
 * waits for ever in a collective that blocks (gloo) does neither; one that spins in it
 * (NCCL polls) still uses CPU and is left to that library's own timeout (torch's
 * init_process_group(timeout=...), its NCCL watchdog), which ends it: a failure, restarted. A supervisor killed,
 * stopped or asked to leave (SIGTERM) is newt's own fault: the others' commit fails or
 * agrees a leave, and the leader's next plan is a new generation.
 *
 * The program's stdout goes through the supervisor (a pipe, copied to its own stdout): a
 * line `NEWT_STEP <n> [loss <x>]` is the program's step, which rank 0's supervisor appends
 * to the step log (with the restarts so far), so newt run's live line, chaos triggers,
 * summary and report count the program's steps, not the beats. */
#include "cli/restart.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/ending.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/param.h"
#include "common/sys.h"
#include "job/ending.h"
#include "job/runlog.h"
#include "job/spec.h"
#include "worker/bridge.h"

NEWT_PARAM(RestartBeatMs, "NEWT_RESTART_BEAT_MS", 50)      /* a beat at most this often */
NEWT_PARAM(RestartGraceMs, "NEWT_RESTART_GRACE_MS", 5000)  /* SIGTERM, then SIGKILL after this */

extern char **environ;

/* The values of a beat, summed over the world (V_LOSS, V_STEP and V_T are rank 0's alone: its
 * program's loss and step, its wall clock, the time every rank agrees on). */
enum { V_PROGRESSED, V_STARTED, V_EXITED_OK, V_FAILED, V_STOPPED, V_LOSS, V_STEP, V_T, V_N };

/* The state newt keeps for the supervisors (NEWT_PER_JOB bytes, the same on every rank): the
 * programs' starts, and the agreed times of the restarts a failure or a hang asked for, the
 * newest RESTART_RING of them, for the failure budget. */
#define RESTART_RING 256
typedef struct restart_state {
  int64_t starts;   /* the programs' generations the job started */
  int64_t nfail;    /* failure restarts so far */
  int64_t fail_ms[RESTART_RING];
} restart_state;

/* What each rank says at an exchange (int64 each). */
enum { X_ADDR, X_PORT, X_STARTS, X_HOST, X_N };

typedef struct child {
  pid_t pid;         /* 0: none; its process group has the same id */
  int out;           /* its stdout (a pipe; -1: none) */
  char line[1024];   /* the line being read, for NEWT_STEP */
  size_t len;
  int exited, status; /* it ended (a zombie until end_child reaps it), its waitpid status */
  uint64_t io;       /* rchar + wchar of its process group at the last look */
  struct timespec hb; /* the heartbeat file's time and size at the last look */
  off_t hb_size;
  int started;       /* it printed a NEWT_STEP line or wrote its heartbeat: its start-up is over */
} child;

typedef struct sup {
  const cli_restart_opts *o;
  newt_ctx *ctx;
  newt_spec spec;
  char exe[PATH_MAX];
  uint32_t addr;      /* ours, network order */
  uint64_t host_hash;
  char hb_path[PATH_MAX];
  int step_log_fd;    /* -1: none */
  newt_layout l;
  restart_state st;   /* declared: restored at each generation */
  int restart_due;    /* the last beat's sums asked for a restart */
  int64_t progress_ms; /* the agreed time of the newest beat at which a program progressed (0: none yet) */
  child ch;
  int64_t step;       /* the program's newest NEWT_STEP (rank 0's writes it to the step log) */
  double loss;
  /* the environment of this generation's programs */
  int local_rank, local_world, group_rank, group_world;
  char master[INET_ADDRSTRLEN];
  int port;
} sup;

/* --- the program's output ------------------------------------------------------------------- */

/* A NEWT_STEP line: the program's step (and loss), into the step log while rank 0. */
static void take_line(sup *s, const char *line) {
  long long n;
  int used = 0;
  if (sscanf(line, "NEWT_STEP %lld%n", &n, &used) != 1 || n < 1) return;
  double loss = NAN;
  sscanf(line + used, " loss %lf", &loss);
  s->step = n;
  s->ch.started = 1;
  if (isfinite(loss)) s->loss = loss;
  if (s->l.rank != 0 || s->step_log_fd < 0) return;
  job_step js = {.step = n, .loss = isfinite(loss) ? loss : NAN, .world = s->l.world, .dp = s->l.world,
                 .generation = s->l.generation, .t_ms = newt_wall_ms(), .restarts = s->st.starts - 1};
  if (job_steplog_append(s->step_log_fd, &js) != NEWT_OK)
    NEWT_WARN(CLI, "step log %s: %s", s->o->step_log, newt_errmsg());
}

/* Copies what the program wrote to our stdout, and takes its lines; waits up to wait_ms for
 * some. */
static void pump(sup *s, int64_t wait_ms) {
  child *c = &s->ch;
  if (c->out < 0) {
    if (wait_ms > 0) newt_sleep_ms(wait_ms);
    return;
  }
  struct pollfd pf = {.fd = c->out, .events = POLLIN};
  if (poll(&pf, 1, (int)wait_ms) <= 0) return;
  char buf[8192];
  ssize_t got = read(c->out, buf, sizeof buf);
  if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) { /* the program closed its stdout */
    close(c->out);
    c->out = -1;
    return;
  }
  for (ssize_t off = 0; got > 0 && off < got;) {
    ssize_t w = write(STDOUT_FILENO, buf + off, (size_t)(got - off));
    if (w <= 0) break;
    off += w;
  }
  for (ssize_t i = 0; i < got; i++) {
    if (buf[i] == '\n') {
      c->line[c->len < sizeof c->line ? c->len : sizeof c->line - 1] = 0;
      take_line(s, c->line);
      c->len = 0;
    } else if (c->len < sizeof c->line - 1) {
      c->line[c->len++] = buf[i];
    }
  }
}

/* --- the program's process group -------------------------------------------------------------- */

/* One process's state letter, process group and activity: its I/O (rchar + wchar) and its
 * CPU time in clock ticks (utime + stime), summed; 0 when it is read. */
static int proc_look(const char *pid, char *state, long *pgrp, uint64_t *io) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%s/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *rp = strrchr(buf, ')'); /* the command's name may hold anything */
  long ppid;
  unsigned long long utime = 0, stime = 0;
  int got = rp ? sscanf(rp + 1, " %c %ld %ld %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", state, &ppid, pgrp, &utime,
                        &stime)
               : 0;
  if (got < 3) return -1;
  *io = got == 5 ? utime + stime : 0; /* a program that computes is not hung */
  snprintf(path, sizeof path, "/proc/%s/io", pid);
  if (!(f = fopen(path, "r"))) return 0; /* not readable: its state still counts */
  unsigned long long v;
  char key[32];
  while (fscanf(f, "%31[^:]: %llu\n", key, &v) == 2)
    if (strcmp(key, "rchar") == 0 || strcmp(key, "wchar") == 0) *io += v;
  fclose(f);
  return 0;
}

/* The activity (I/O and CPU time) of the program's process group, and whether a process of
 * it is stopped. */
static void group_look(pid_t pgid, uint64_t *io, int *stopped) {
  *io = 0;
  *stopped = 0;
  DIR *d = opendir("/proc");
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    if (!isdigit((unsigned char)e->d_name[0])) continue;
    char state;
    long pgrp;
    uint64_t pio;
    if (proc_look(e->d_name, &state, &pgrp, &pio) != 0 || pgrp != (long)pgid) continue;
    *io += pio;
    *stopped |= state == 'T';
  }
  closedir(d);
}

/* Whether the heartbeat file changed since the last look. */
static int heartbeat_changed(sup *s) {
  struct stat st;
  if (stat(s->hb_path, &st) != 0) return 0;
  child *c = &s->ch;
  int changed = st.st_mtim.tv_sec != c->hb.tv_sec || st.st_mtim.tv_nsec != c->hb.tv_nsec || st.st_size != c->hb_size;
  c->hb = st.st_mtim;
  c->hb_size = st.st_size;
  return changed;
}

/* Notes the program's end without reaping it: while it is a zombie its pid, the id of its
 * process group, cannot be given to another process, so end_child's kill of the group can
 * never reach a stranger's. block: wait for the end. */
static void reap(sup *s, int block) {
  child *c = &s->ch;
  if (!c->pid || c->exited) return;
  siginfo_t si = {0};
  int flags = WEXITED | WNOWAIT | (block ? 0 : WNOHANG);
  while (waitid(P_PID, (id_t)c->pid, &si, flags) < 0 && errno == EINTR) {
  }
  if (si.si_pid != c->pid) return;
  c->exited = 1; /* the status as waitpid would give it (exit code << 8, or the signal) */
  c->status = si.si_code == CLD_EXITED ? (si.si_status & 0xff) << 8 : (si.si_status & 0x7f);
}

/* Ends the program: SIGTERM (and SIGCONT, for a stopped one) to its group, SIGKILL after
 * grace_ms; what it still wrote is copied. */
static void end_child(sup *s, int64_t grace_ms, const char *why) {
  child *c = &s->ch;
  if (!c->pid) return;
  reap(s, 0);
  if (!c->exited) {
    NEWT_INFO(CLI, "ending the program (pid %d): %s", (int)c->pid, why);
    kill(-c->pid, SIGTERM);
    kill(-c->pid, SIGCONT);
    newt_deadline_t d = newt_deadline_in_ms(grace_ms);
    while (!c->exited && !newt_deadline_passed(d)) {
      pump(s, 5);
      reap(s, 0);
    }
    if (!c->exited) {
      kill(-c->pid, SIGKILL);
      reap(s, 1);
    }
  }
  kill(-c->pid, SIGKILL); /* what it left behind in its group; the group is still its own */
  while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR) {
  }
  /* what it wrote last; a process that left its group may hold the pipe open: not waited for */
  for (newt_deadline_t d = newt_deadline_in_ms(1000); c->out >= 0 && !newt_deadline_passed(d);) pump(s, 50);
  if (c->out >= 0) close(c->out);
  *c = (child){.out = -1};
}

/* --- a generation's world: the exchange and the environment ---------------------------------- */

static uint64_t hash_str(const char *p) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  return h & INT64_MAX;
}

/* A free port on our address (the program's rendezvous, while rank 0). */
static newt_result_t free_port(uint32_t addr, int *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return NEWT_ERR(NEWT_ERR_SYS, "socket: %s", strerror(errno));
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = addr};
  socklen_t len = sizeof a;
  int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0;
  int e = errno;
  close(fd);
  if (!ok) return NEWT_ERR(NEWT_ERR_SYS, "finding a free port for MASTER_PORT: %s", strerror(e));
  *port = ntohs(a.sin_port);
  return NEWT_OK;
}

/* LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK and GROUP_WORLD_SIZE from every rank's host: the
 * ranks of one host are its local ranks, the hosts in the order of their lowest rank its
 * groups. */
static void place(sup *s, const int64_t *all) {
  int world = s->l.world, me = s->l.rank;
  s->local_rank = s->local_world = s->group_rank = s->group_world = 0;
  for (int r = 0; r < world; r++) {
    int64_t h = all[r * X_N + X_HOST];
    int first = 1;
    for (int q = 0; q < r && first; q++) first = all[q * X_N + X_HOST] != h;
    if (first) {
      if (h == all[me * X_N + X_HOST]) s->group_rank = s->group_world;
      s->group_world++;
    }
    if (h == all[me * X_N + X_HOST]) {
      if (r < me) s->local_rank++;
      s->local_world++;
    }
  }
}

/* Agrees, over the world, on the programs' next start: rank 0's address and a fresh port, the
 * restart count (the most any rank has seen, plus one), the hosts. Collective. */
static newt_result_t exchange(sup *s) {
  int world = s->l.world;
  int64_t mine[X_N] = {s->addr, 0, s->st.starts, (int64_t)s->host_hash};
  if (s->l.rank == 0) {
    int port = 0;
    NEWT_CHECK(free_port(s->addr, &port));
    mine[X_PORT] = port;
  }
  int64_t *all = malloc((size_t)world * X_N * sizeof *all);
  NEWT_CHECK_ALLOC(all);
  newt_result_t r = NEWT_OK;
  if (s->l.world_comm) r = newt_allgather(s->l.world_comm, mine, all, X_N, NEWT_I64);
  else memcpy(all, mine, sizeof mine);
  if (r == NEWT_OK) {
    int64_t starts = 0;
    for (int i = 0; i < world; i++)
      if (all[i * X_N + X_STARTS] > starts) starts = all[i * X_N + X_STARTS];
    s->st.starts = starts + 1;
    struct in_addr a = {.s_addr = (uint32_t)all[X_ADDR]};
    inet_ntop(AF_INET, &a, s->master, sizeof s->master);
    s->port = (int)all[X_PORT];
    place(s, all);
  }
  free(all);
  return r;
}

/* A NULL-terminated environment: ours without the names set here, then these. */
typedef struct envv {
  char **v;
  int n, cap;
} envv;

/* Appends entry (malloc'd; NULL: out of memory). */
static int env_add(envv *e, char *entry) {
  if (entry && e->n + 2 > e->cap) {
    int cap = e->cap ? 2 * e->cap : 64;
    char **v = realloc(e->v, (size_t)cap * sizeof *v);
    if (!v) {
      free(entry);
      return -1;
    }
    e->v = v;
    e->cap = cap;
  }
  if (!entry) return -1;
  e->v[e->n++] = entry;
  e->v[e->n] = NULL;
  return 0;
}

static int env_put(envv *e, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int env_put(envv *e, const char *name, const char *fmt, ...) {
  char value[PATH_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(value, sizeof value, fmt, ap);
  va_end(ap);
  size_t len = strlen(name) + strlen(value) + 2;
  char *entry = malloc(len);
  if (entry) snprintf(entry, len, "%s=%s", name, value);
  return env_add(e, entry);
}

static void env_free(envv *e) {
  for (int i = 0; i < e->n; i++) free(e->v[i]);
  free(e->v);
}

/* The variables torchrun (1.13, local_elastic_agent.py) gives each worker, and ours. */
static const char *const torchrun_vars[] = {
    "LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
    "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "NEWT_HEARTBEAT_FILE", NULL};

static int is_set_here(const char *entry) {
  for (int i = 0; torchrun_vars[i]; i++) {
    size_t n = strlen(torchrun_vars[i]);
    if (strncmp(entry, torchrun_vars[i], n) == 0 && entry[n] == '=') return 1;
  }
  return 0;
}

static int build_env(const sup *s, envv *e) {
  int bad = 0;
  for (char **p = environ; *p && !bad; p++)
    if (!is_set_here(*p)) bad |= env_add(e, strdup(*p));
  const newt_layout *l = &s->l;
  bad |= env_put(e, "LOCAL_RANK", "%d", s->local_rank) | env_put(e, "RANK", "%d", l->rank);
  bad |= env_put(e, "GROUP_RANK", "%d", s->group_rank) | env_put(e, "ROLE_RANK", "%d", l->rank);
  bad |= env_put(e, "ROLE_NAME", "default") | env_put(e, "LOCAL_WORLD_SIZE", "%d", s->local_world);
  bad |= env_put(e, "WORLD_SIZE", "%d", l->world) | env_put(e, "GROUP_WORLD_SIZE", "%d", s->group_world);
  bad |= env_put(e, "ROLE_WORLD_SIZE", "%d", l->world) | env_put(e, "MASTER_ADDR", "%s", s->master);
  bad |= env_put(e, "MASTER_PORT", "%d", s->port);
  bad |= env_put(e, "TORCHELASTIC_RESTART_COUNT", "%lld", (long long)(s->st.starts - 1));
  bad |= env_put(e, "TORCHELASTIC_MAX_RESTARTS", "%lld", (long long)s->spec.max_failures);
  bad |= env_put(e, "TORCHELASTIC_RUN_ID", "%s", s->spec.job);
  bad |= env_put(e, "TORCHELASTIC_USE_AGENT_STORE", "False");
  bad |= env_put(e, "NEWT_HEARTBEAT_FILE", "%s", s->hb_path);
  if (!getenv("NCCL_ASYNC_ERROR_HANDLING")) bad |= env_put(e, "NCCL_ASYNC_ERROR_HANDLING", "1");
  /* torchrun's 1 for several workers of a node; --threads here (1 by default) */
  if (!getenv("OMP_NUM_THREADS")) bad |= env_put(e, "OMP_NUM_THREADS", "%d", s->o->threads > 0 ? s->o->threads : 1);
  return bad ? -1 : 0;
}

/* --- starting the program --------------------------------------------------------------------- */

/* The program's path, as execvp would find it (resolved before fork: the child only execs). */
static newt_result_t resolve(const char *cmd, char *out, size_t cap) {
  if (strchr(cmd, '/')) {
    snprintf(out, cap, "%s", cmd);
    return NEWT_OK;
  }
  const char *path = getenv("PATH");
  if (!path) path = "/bin:/usr/bin";
  for (const char *p = path;; p++) {
    const char *end = strchr(p, ':');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (snprintf(out, cap, "%.*s/%s", n ? (int)n : 1, n ? p : ".", cmd) < (int)cap && access(out, X_OK) == 0)
      return NEWT_OK;
    if (!end) break;
    p = end;
  }
  return NEWT_ERR(NEWT_ERR_INVALID, "cannot run the program \"%s\" (the COMMAND after --): not found in PATH", cmd);
}

/* In the child, between fork and exec: async-signal-safe calls only. */
static void exec_child(const sup *s, int out, char **envp, pid_t parent) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127); /* the supervisor died before the line above */
  if (out != STDOUT_FILENO) dup2(out, STDOUT_FILENO);
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  const int sigs[] = {SIGTERM, SIGINT, SIGPIPE, SIGCHLD, SIGHUP};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &dfl, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  execve(s->exe, s->o->command, envp);
  static const char msg[] = "newt worker --restart: cannot exec the program\n";
  (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
  _exit(127);
}

static newt_result_t spawn(sup *s) {
  envv e = {0};
  if (build_env(s, &e) != 0) {
    env_free(&e);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory building the program's environment");
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    env_free(&e);
    return NEWT_ERR(NEWT_ERR_SYS, "pipe: %s", strerror(errno));
  }
  unlink(s->hb_path); /* a new program's heartbeat starts with its first write */
  fflush(NULL);
  pid_t parent = getpid(), pid = fork();
  if (pid == 0) exec_child(s, fds[1], e.v, parent);
  int err = errno;
  close(fds[1]);
  env_free(&e);
  if (pid < 0) {
    close(fds[0]);
    return NEWT_ERR(NEWT_ERR_SYS, "fork: %s", strerror(err));
  }
  setpgid(pid, pid); /* either of us may be first */
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  s->ch = (child){.pid = pid, .out = fds[0]};
  int stopped;
  group_look(pid, &s->ch.io, &stopped);
  NEWT_INFO(CLI, "started the program (pid %d): RANK %d WORLD_SIZE %d LOCAL_RANK %d MASTER_ADDR %s MASTER_PORT %d "
            "TORCHELASTIC_RESTART_COUNT %lld (generation %llu)", (int)pid, s->l.rank, s->l.world, s->local_rank,
            s->master, s->port, (long long)(s->st.starts - 1), (unsigned long long)s->l.generation);
  return NEWT_OK;
}

/* --- the generation and the beat ------------------------------------------------------------- */

static newt_result_t generation(sup *s) {
  end_child(s, newt_param_RestartGraceMs(), "a new generation");
  s->l = (newt_layout){.size = sizeof s->l};
  NEWT_CHECK(newt_layout_get(s->ctx, &s->l));
  /* the programs keep their own state; newt keeps the count of their starts (a joiner's comes
     from its peers) */
  NEWT_CHECK(newt_state_bytes(s->ctx, "restart.state", NEWT_PER_JOB, &s->st, sizeof s->st));
  newt_restore_info ri = {.size = sizeof ri};
  NEWT_CHECK(newt_state_restore(s->ctx, &ri));
  NEWT_CHECK(exchange(s));
  s->restart_due = 0;
  s->progress_ms = 0;
  return spawn(s);
}

/* Watches the program for a beat: its output, its end, its progress. */
static void watch(sup *s, double v[V_N]) {
  child *c = &s->ch;
  newt_deadline_t d = newt_deadline_in_ms(newt_param_RestartBeatMs());
  int was = c->exited; /* an end is said at once; a program that ended waits out the beat */
  while ((was || !c->exited) && !newt_deadline_passed(d)) {
    pump(s, was ? newt_deadline_left_ms(d) : 10);
    reap(s, 0);
  }
  uint64_t io = 0;
  int stopped = 0;
  if (!c->exited) group_look(c->pid, &io, &stopped);
  int beat_file = heartbeat_changed(s);
  int progressed = (!c->exited && io != c->io) || beat_file;
  c->started |= beat_file;
  if (!c->exited) c->io = io;
  int ok = c->exited && WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0;
  v[V_PROGRESSED] = progressed;
  v[V_STARTED] = c->started;
  v[V_EXITED_OK] = ok;
  v[V_FAILED] = c->exited && !ok;
  v[V_STOPPED] = stopped;
  v[V_LOSS] = s->l.rank == 0 && isfinite(s->loss) ? s->loss : 0;
  v[V_STEP] = s->l.rank == 0 ? (double)s->step : 0;
  v[V_T] = s->l.rank == 0 ? (double)newt_wall_ms() : 0;
}

/* A failure restart counted against spec.fault.max_failures within failure_window_ms (at
 * agreed time t): 1 when the budget is spent. */
static int budget_spent(sup *s, int64_t t) {
  restart_state *st = &s->st;
  st->fail_ms[st->nfail++ % RESTART_RING] = t;
  int64_t max = s->spec.max_failures, in_window = 0;
  if (max <= 0) return 0;
  int64_t n = st->nfail < RESTART_RING ? st->nfail : RESTART_RING;
  for (int64_t i = 0; i < n; i++) in_window += t - st->fail_ms[i] <= s->spec.failure_window_ms;
  return in_window > max;
}

/* How long the programs may make no progress: spec.fault.hang_timeout_ms once one of them said
 * it runs (a NEWT_STEP line, its heartbeat), first_step_timeout_ms before (its start-up: an
 * import that maps its libraries reads nothing). */
static int64_t quiet_limit(const sup *s, const double *sum) {
  return sum[V_STARTED] > 0 ? s->spec.hang_timeout_ms : s->spec.first_step_timeout_ms;
}

/* What the sums of a beat ask for: 1 the job is done, -1 it fails (why), 0 go on (a restart
 * marked due when one is). */
static int decide(sup *s, const double *sum, char *why, size_t cap) {
  int world = s->l.world;
  int64_t t = (int64_t)sum[V_T];
  if (sum[V_PROGRESSED] > 0 || !s->progress_ms) s->progress_ms = t;
  if (sum[V_FAILED] > 0)
    snprintf(why, cap, "%.0f program%s failed", sum[V_FAILED], sum[V_FAILED] == 1 ? "" : "s");
  else if (sum[V_STOPPED] > 0)
    snprintf(why, cap, "%.0f program%s stopped (hung)", sum[V_STOPPED], sum[V_STOPPED] == 1 ? "" : "s");
  else if (sum[V_EXITED_OK] == world)
    return 1;
  else if (t - s->progress_ms >= quiet_limit(s, sum))
    snprintf(why, cap, "no program progressed for %lld ms (no I/O, no CPU time, no heartbeat: %s)", (long long)(t - s->progress_ms),
             sum[V_STARTED] > 0 ? "spec.fault.hang_timeout_ms" : "spec.fault.first_step_timeout_ms, before any step");
  else
    return 0;
  NEWT_INFO(CLI, "restarting the programs of generation %llu (restart %lld): %s", (unsigned long long)s->l.generation,
            (long long)s->st.starts, why);
  s->restart_due = 1;
  if (!budget_spent(s, t)) return 0;
  size_t n = strlen(why);
  snprintf(why + n, cap - n, "; %lld restarts for a failure within spec.fault.failure_window_ms %lld, more than "
           "spec.fault.max_failures %lld", (long long)s->st.nfail, (long long)s->spec.failure_window_ms,
           (long long)s->spec.max_failures);
  return -1;
}

static newt_result_t beat(sup *s) {
  if (s->restart_due) { /* every rank at the same beat: the sums were the same */
    end_child(s, newt_param_RestartGraceMs(), "a restart");
    NEWT_CHECK(exchange(s));
    s->restart_due = 0;
    s->progress_ms = 0;
    NEWT_CHECK(spawn(s));
  }
  double v[V_N], sum[V_N];
  watch(s, v);
  NEWT_CHECK(newt_step_commit(s->ctx, v, sum, V_N));
  char why[512];
  int outcome = decide(s, sum, why, sizeof why);
  newt_step_result res;
  newt_step_result_init(&res);
  res.loss = sum[V_LOSS];
  NEWT_CHECK(newt_step_end(s->ctx, &res));
  if (outcome > 0) {
    NEWT_INFO(CLI, "every program exited 0 (the program's step %lld): the job is done", (long long)sum[V_STEP]);
    NEWT_CHECK(worker_end_job_now(s->ctx));
  } else if (outcome < 0) {
    s->restart_due = 0;
    NEWT_CHECK(worker_fail_job(s->ctx, why));
  }
  return NEWT_OK;
}

/* --- the whole life ------------------------------------------------------------------------- */

static newt_result_t setup(sup *s) {
  newt_job_info ji = {.size = sizeof ji};
  NEWT_CHECK(newt_job_get(s->ctx, &ji));
  NEWT_CHECK(spec_from_json(ji.spec_json, strlen(ji.spec_json), &s->spec));
  if (!s->spec.restart)
    return NEWT_ERR(NEWT_ERR_INVALID, "newt worker --restart: job %s is not a job of the restart mode (its spec has no "
                    "\"restart\": true; newt run --restart writes it)", s->spec.job);
  NEWT_CHECK(resolve(s->o->command[0], s->exe, sizeof s->exe));
  const char *addr = s->o->addr && *s->o->addr ? s->o->addr : "127.0.0.1";
  struct in_addr a;
  if (inet_pton(AF_INET, addr, &a) != 1)
    return NEWT_ERR(NEWT_ERR_INVALID, "--addr \"%s\": the restart mode needs an IPv4 address (MASTER_ADDR)", addr);
  s->addr = a.s_addr;
  const char *host = getenv("NEWT_HOST");
  if (s->o->join->host) host = s->o->join->host;
  s->host_hash = hash_str(host && *host ? host : newt_hostname());
  const char *tmp = getenv("TMPDIR");
  snprintf(s->hb_path, sizeof s->hb_path, "%s/newt-heartbeat-%s-%d", tmp && *tmp ? tmp : "/tmp", ji.worker_id,
           (int)getpid());
  if (s->o->step_log && *s->o->step_log) NEWT_CHECK(job_runlog_open(s->o->step_log, 0, &s->step_log_fd));
  return NEWT_OK;
}

static newt_result_t loop(sup *s) {
  for (;;) {
    newt_batch b = {.size = sizeof b};
    newt_next next;
    newt_result_t r = newt_step_begin(s->ctx, &b, &next);
    if (r != NEWT_OK) return r;
    if (next == NEWT_NEXT_GENERATION) r = generation(s);
    else if (next == NEWT_NEXT_STEP) r = beat(s);
    else return NEWT_OK; /* done, left, left out, failed: newt_finish says which */
    if (r != NEWT_OK) { /* the generation failed (or cannot start): its program goes with it */
      NEWT_INFO(CLI, "generation %llu: %s", (unsigned long long)s->l.generation, newt_errmsg());
      end_child(s, newt_param_RestartGraceMs(), "its generation failed");
      if (r == NEWT_ERR_INVALID || r == NEWT_ERR_NOMEM) return r;
    }
  }
}

int cli_restart_run(const cli_restart_opts *o) {
  sup *s = calloc(1, sizeof *s);
  if (!s) return 1;
  s->o = o;
  s->step_log_fd = -1;
  s->ch.out = -1;
  s->loss = NAN;
  newt_result_t r = newt_join(o->join, &s->ctx);
  if (r != NEWT_OK) {
    free(s);
    return job_exit_status(r);
  }
  r = setup(s);
  if (r == NEWT_OK) r = loop(s);
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", newt_errmsg());
  end_child(s, newt_param_RestartGraceMs(), "the worker ends");
  int status = newt_finish(s->ctx, r == NEWT_OK ? NEWT_OK : NEWT_ERR(r, "%s", msg));
  if (s->step_log_fd >= 0) close(s->step_log_fd);
  unlink(s->hb_path);
  free(s);
  return status;
}
