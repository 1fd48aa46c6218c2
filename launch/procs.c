/* The launcher's processes (run.h): the etcd client's flags, each worker's and coordinator's
 * command line and environment, started as children that die with us, reaped, and ended.
 *
 * With a program (launcher_opts.command) each worker is `newt worker <its flags> -- COMMAND
 * ARGS`, which execs the program in its place, with its slot on this host as LOCAL_RANK: the
 * pid the launcher tracks, signals and reaps is the program's. With --netns a worker starts
 * inside its host's namespace (`ip netns exec`). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/proc.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "launch/run.h"

/* The GPU for a new worker: the one fewest live workers use (the lowest of those), so a
 * replacement takes the GPU of the worker it replaces; -1 without GPUs. */
static int free_gpu(const run *r) {
  int best = -1, best_n = 0;
  for (int d = 0; d < r->o->gpus; d++) {
    int n = 0;
    for (int i = 0; i < r->nprocs; i++) n += r->procs[i].alive && r->procs[i].kind == PROC_WORKER && r->procs[i].device == d;
    if (best < 0 || n < best_n) best = d, best_n = n;
  }
  return best;
}

/* The slot of a new worker on this host (its LOCAL_RANK): the lowest one no live worker
 * holds, so w0..w(N-1) get 0..N-1 and a joiner or a replacement the lowest free one. */
static int free_slot(const run *r) {
  for (int s = 0;; s++) {
    int held = 0;
    for (int i = 0; i < r->nprocs && !held; i++)
      held = r->procs[i].alive && r->procs[i].kind == PROC_WORKER && r->procs[i].slot == s;
    if (!held) return s;
  }
}

/* The simulated host of a new worker (launcher_opts.hosts; -1: none): the first nproc in
 * contiguous blocks, w(i) on host i * hosts / nproc; a later one (a joiner) on the host with
 * the fewest live workers, the lowest of those. */
static int host_of_new(const run *r, int index) {
  int hosts = r->o->hosts;
  if (hosts <= 0) return -1;
  if (index < r->o->nproc) return (int)((int64_t)index * hosts / r->o->nproc);
  int best = 0, best_n = -1;
  for (int h = 0; h < hosts; h++) {
    int n = 0;
    for (int i = 0; i < r->nprocs; i++) n += r->procs[i].alive && r->procs[i].kind == PROC_WORKER && r->procs[i].host == h;
    if (best_n < 0 || n < best_n) best = h, best_n = n;
  }
  return best;
}

/* A NULL-terminated list of strings that grows as it is filled (argv, env): a long
 * COMMAND never overflows it; oom is set when it could not grow. */
typedef struct strv {
  const char **v;
  int n, cap, oom;
} strv;

static void strv_add(strv *s, const char *x) {
  if (s->oom) return;
  if (s->n + 2 > s->cap) {
    int cap = s->cap ? 2 * s->cap : 32;
    const char **v = realloc(s->v, (size_t)cap * sizeof *v);
    if (!v) {
      s->oom = 1;
      return;
    }
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = x;
  s->v[s->n] = NULL;
}

static void strv_add2(strv *s, const char *flag, const char *value) {
  strv_add(s, flag);
  strv_add(s, value);
}

/* What one spawn writes its words into: they live until the process is started. */
typedef struct spawn_ctx {
  proc_kind kind;
  char name[32], logp[600], threads[16], device[16], mport[16], hostid[128], endp[640];
  char local_rank[32], local_world[32], hostname[32], flip[400];
  int gpu, share, port, slot, index, host;
  int nshost;             /* --netns: the host whose namespace it runs in (-1: none) ... */
  const char *ns, *addr;  /* ... its name and address */
} spawn_ctx;

/* The worker's flags; --share-gpus: the worker shares its GPU (--share-device: the
   coordinator lets workers that all say so train on one GPU of this host, so tensor-parallel
   groups still form on it) and is a host of its own to NCCL (NCCL_HOSTID: its host hash, so
   two ranks on one GPU are not a duplicate GPU); NCCL then connects them over sockets on
   loopback, not P2P or shared memory (docs/elastic.md, "GPU workers on one host"). */
static void worker_args(run *r, spawn_ctx *x, strv *argv) {
  snprintf(x->threads, sizeof x->threads, "%d", r->o->threads > 0 ? r->o->threads : 1);
  strv_add2(argv, "--threads", x->threads);
  strv_add2(argv, "--step-log", r->res->step_log);
  x->gpu = free_gpu(r);
  x->slot = free_slot(r);
  x->host = host_of_new(r, x->index);
  if (x->host >= 0) { /* a simulated host: its own host (no shared memory with others) and failure domain */
    snprintf(x->hostname, sizeof x->hostname, "host%d", x->host);
    strv_add2(argv, "--host", x->hostname);
    strv_add2(argv, "--domain", x->hostname);
  }
  if (x->addr) strv_add2(argv, "--addr", x->addr); /* its namespace's own address */
  if (x->gpu >= 0) {
    snprintf(x->device, sizeof x->device, "%d", x->gpu);
    strv_add2(argv, "--device", x->device);
  }
  x->share = x->gpu >= 0 && r->o->share_gpus;
  if (x->share) {
    snprintf(x->hostid, sizeof x->hostid, "NCCL_HOSTID=newt-%s-%s", r->o->spec.job, x->name);
    strv_add(argv, "--share-device");
  }
  if (!r->o->command) return;
  if (r->o->spec.restart) strv_add(argv, "--restart"); /* it supervises the program (cli/restart.h) */
  strv_add(argv, "--"); /* the program newt worker execs in its place (cli/program.h) */
  for (char *const *w = r->o->command; *w; w++) strv_add(argv, *w);
}

static void coord_args(run *r, spawn_ctx *x, strv *argv) {
  if (!r->o->no_metrics && newt_net_free_port(&x->port) == NEWT_OK) {
    snprintf(x->mport, sizeof x->mport, "%d", x->port);
    strv_add2(argv, "--metrics-addr", "127.0.0.1");
  } else {
    snprintf(x->mport, sizeof x->mport, "0");
  }
  strv_add2(argv, "--metrics-port", x->mport);
}

static void args_of(run *r, spawn_ctx *x, strv *argv) {
  strv_add2(argv, r->exe, x->kind == PROC_WORKER ? "worker" : "coordinator");
  strv_add2(argv, "--etcd", r->etcd_url);
  const rdzv_etcd_opts *ec = &r->o->etcd_client;
  const char *sec[][2] = {{"--etcd-user", ec->user}, {"--etcd-password-file", r->o->etcd_password_file},
                          {"--etcd-ca", ec->ca_file}, {"--etcd-cert", ec->cert_file}, {"--etcd-key", ec->key_file}};
  for (size_t k = 0; r->o->etcd && k < sizeof sec / sizeof sec[0]; k++)
    if (sec[k][1] && *sec[k][1]) strv_add2(argv, sec[k][0], sec[k][1]);
  if (r->etcd_user[0]) { /* the private etcd's user of this job */
    strv_add2(argv, "--etcd-user", r->etcd_user);
    strv_add2(argv, "--etcd-password-file", r->etcd_pw_file);
  }
  strv_add2(argv, "--job", r->o->spec.job);
  strv_add2(argv, "--id", x->name);
  strv_add2(argv, "--job-secret-file", r->secret_file);
  if (x->kind == PROC_WORKER) worker_args(r, x, argv);
  else coord_args(r, x, argv);
}

/* Each process says how it ended (exit status and message) in <log dir>/<name>.end, as a
   pod does in its termination log; a worker running a program gets its slot as torchrun
   gives it (LOCAL_RANK, and LOCAL_WORLD_SIZE: --nproc, or more once joiners outnumber it). */
static void env_of(run *r, spawn_ctx *x, strv *env) {
  snprintf(x->endp, sizeof x->endp, "NEWT_TERMINATION_LOG=%s/%s.end", r->res->log_dir, x->name);
  strv_add(env, x->endp);
  if (!getenv("NEWT_DEBUG")) strv_add(env, "NEWT_DEBUG=INFO");
  if (x->share) {
    strv_add(env, x->hostid);
    strv_add(env, "NCCL_P2P_DISABLE=1");
    strv_add(env, "NCCL_SHM_DISABLE=1");
    if (!getenv("NCCL_SOCKET_IFNAME")) strv_add(env, "NCCL_SOCKET_IFNAME=lo");
  }
  if (x->kind == PROC_WORKER) { /* chaos flip:rank:R[:T]@step=N, armed: "R:N[:T];..." (worker/verify.c) */
    size_t l = (size_t)snprintf(x->flip, sizeof x->flip, "NEWT_CHAOS_FLIP=");
    int any = 0;
    for (int i = 0; i < r->nchaos && l < sizeof x->flip; i++) {
      const chaos_event *e = &r->chaos[i];
      if (e->action != CHAOS_FLIP) continue;
      l += (size_t)snprintf(x->flip + l, sizeof x->flip - l, "%s%d:%lld%s%s", any ? ";" : "", e->index,
                            (long long)e->step, e->tensor[0] ? ":" : "", e->tensor);
      any = 1;
    }
    if (any) strv_add(env, x->flip);
  }
  if (x->kind != PROC_WORKER || !r->o->command) return;
  snprintf(x->local_rank, sizeof x->local_rank, "LOCAL_RANK=%d", x->slot);
  snprintf(x->local_world, sizeof x->local_world, "LOCAL_WORLD_SIZE=%d", x->slot + 1 > r->o->nproc ? x->slot + 1 : r->o->nproc);
  strv_add(env, x->local_rank);
  strv_add(env, x->local_world);
}

/* Records a started process. */
static newt_result_t track(run *r, const spawn_ctx *x, pid_t pid) {
  if (r->nprocs == r->cap_procs) {
    int cap = r->cap_procs ? 2 * r->cap_procs : 16;
    proc *p = realloc(r->procs, (size_t)cap * sizeof *p);
    if (!p) {
      kill(pid, SIGKILL);
      return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory tracking processes");
    }
    r->procs = p;
    r->cap_procs = cap;
  }
  proc *p = &r->procs[r->nprocs++];
  memset(p, 0, sizeof *p);
  p->pid = pid;
  p->kind = x->kind;
  p->alive = 1;
  p->status = -1;
  p->device = x->gpu;
  p->slot = x->slot;
  p->host = x->host;
  p->nshost = x->nshost;
  snprintf(p->name, sizeof p->name, "%s", x->name);
  p->metrics_port = x->port;
  return NEWT_OK;
}

newt_result_t procs_spawn(run *r, proc_kind kind, int index) {
  spawn_ctx x = {.kind = kind, .gpu = -1, .slot = -1, .index = index, .host = -1, .nshost = -1};
  snprintf(x.name, sizeof x.name, "%s%d", kind == PROC_WORKER ? "w" : "c", index);
  snprintf(x.logp, sizeof x.logp, "%s/%s.log", r->res->log_dir, x.name);
  strv argv = {0}, env = {0};
  if (r->net && kind == PROC_WORKER) { /* in its host's namespace (one of its own without --hosts) */
    int h = host_of_new(r, index);
    x.nshost = h >= 0 ? h : index;
    NEWT_CHECK(netns_host(r->net, x.nshost, &x.ns, &x.addr));
    strv_add2(&argv, "ip", "netns");
    strv_add2(&argv, "exec", x.ns);
  }
  args_of(r, &x, &argv);
  env_of(r, &x, &env);
  /* a session of its own: a terminal's Ctrl-C reaches `newt run` alone, which ends the
     processes in order (procs_stop_all); each still dies with us */
  /* its log, in the log directory's descriptor: a link planted there is refused, never written
     through (the child opens it the same way) */
  char logname[64];
  snprintf(logname, sizeof logname, "%s.log", x.name);
  int lfd = openat(r->log_fd, logname, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, 0644);
  if (lfd < 0) {
    free(argv.v);
    free(env.v);
    return NEWT_ERR(NEWT_ERR_SYS, "%s: %s", x.logp, errno == ELOOP ? "a symbolic link: not followed" : strerror(errno));
  }
  close(lfd);
  newt_spawn_opts so = {.log_path = logname, .log_dir_fd = &r->log_fd, .env = env.v, .die_with_parent = 1,
                        .new_session = 1};
  pid_t pid;
  newt_result_t res = argv.oom || env.oom ? NEWT_ERR(NEWT_ERR_NOMEM, "out of memory starting %s", x.name)
                                          : newt_proc_spawn(argv.v, &so, &pid);
  free(argv.v);
  free(env.v);
  NEWT_CHECK(res);
  return track(r, &x, pid);
}

proc *procs_find(run *r, const char *name) {
  for (int i = 0; i < r->nprocs; i++)
    if (strcmp(r->procs[i].name, name) == 0) return &r->procs[i];
  return NULL;
}

/* The last line of <name>.log that says something (its tail read through the directory's
 * descriptor, never through a link), made printable, into out; "" when there is none. */
static void last_log_line(const run *r, const char *name, char *out, size_t cap) {
  char file[64], buf[4097];
  out[0] = '\0';
  snprintf(file, sizeof file, "%s.log", name);
  int fd = openat(r->log_fd, file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  off_t end = lseek(fd, 0, SEEK_END);
  ssize_t n = end < 0 ? -1 : pread(fd, buf, sizeof buf - 1, end > 4096 ? end - 4096 : 0);
  close(fd);
  if (n <= 0) return;
  buf[n] = '\0';
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = '\0';
  char *line = strrchr(buf, '\n');
  newt_str_printable(out, cap, line ? line + 1 : buf);
}

/* What a worker said as it ended: its termination message (<name>.end, written by
 * newt_finish), else the last line of its log. "" when neither says anything. */
static void last_words(run *r, const proc *p, char *out, size_t cap) {
  char name[64], *text = NULL;
  size_t len = 0;
  snprintf(name, sizeof name, "%s.end", p->name);
  out[0] = '\0';
  if (newt_fs_read_all_at(r->log_fd, r->res->log_dir, name, 4096, &text, &len) == NEWT_OK) {
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r')) len--;
    snprintf(out, cap, "%.*s", (int)len, text ? text : "");
    free(text);
  }
  if (!out[0]) last_log_line(r, p->name, out, cap);
}

/* A worker that ended left out (it trained, was left out and not taken back before the job
 * ended): counted in the summary, and said with its own termination message. */
static void left_out(run *r, const proc *p) {
  launcher_result *res = r->res;
  char(*l)[RDZV_NAME_MAX] = realloc(res->left_out, (size_t)(res->nleft_out + 1) * sizeof *l);
  if (l) {
    res->left_out = l;
    snprintf(l[res->nleft_out++], RDZV_NAME_MAX, "%s", p->name);
  }
  if (r->o->quiet) return;
  char name[64], *text = NULL;
  size_t len = 0;
  snprintf(name, sizeof name, "%s.end", p->name);
  if (newt_fs_read_all_at(r->log_fd, res->log_dir, name, 4096, &text, &len) == NEWT_OK)
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r')) len--;
  fprintf(stderr, "%snewt run: %s exited %d (%.*s)\n", live_news(r), p->name, JOB_EXIT_LEFT_OUT, (int)len,
          text ? text : "left out");
  free(text);
}

void procs_reap(run *r) {
  for (int i = 0; i < r->nprocs; i++) {
    proc *p = &r->procs[i];
    if (!p->alive) continue;
    int st;
    if (waitpid(p->pid, &st, WNOHANG) != p->pid) continue;
    p->alive = 0;
    p->status = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 1;
    char how[64];
    newt_proc_status_str(st, how, sizeof how);
    int expected = r->done || r->res->failed[0] || r->stopping || p->killed_by_chaos ||
                   (WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (p->kind == PROC_WORKER && p->status == JOB_EXIT_LEFT_OUT) {
      left_out(r, p);
      expected = 1;
    }
    if (!expected && !r->o->quiet) { /* with its own last words: the cause is rarely one file away */
      char words[1200];
      last_words(r, p, words, sizeof words);
      if (!words[0] && p->kind == PROC_WORKER && (p->status == 126 || p->status == 127))
        snprintf(words, sizeof words, "the program could not be started");
      fprintf(stderr, "%snewt run: %s exited (%s)%s%s; see %s/%s.log\n", live_news(r), p->name, how,
              words[0] ? ": " : "", words, r->res->log_dir, p->name);
      /* 126, 127: the shell or the loader could not start the program (it ran none of newt's
         code, and its log's last line is the loader's word) */
      if (p->kind == PROC_WORKER && p->status == 127 && strstr(words, "error while loading shared libraries"))
        fprintf(stderr, "newt run: ---> HINT: build the program with $(pkg-config --cflags --libs newt): its rpath "
                        "names libnewt's directory (docs/api.md, \"Build, link, run\"); or set LD_LIBRARY_PATH\n");
    }
    if (p->kind == PROC_COORD && p->killed_by_chaos && !r->done && !r->stopping) {
      if (procs_spawn(r, PROC_COORD, r->next_coord++) != NEWT_OK)
        fprintf(stderr, "newt run: restarting a coordinator: %s\n", newt_errmsg());
      p = &r->procs[i]; /* spawn may have moved the array */
    }
  }
}


static int live(const run *r, proc_kind kind) {
  int n = 0;
  for (int i = 0; i < r->nprocs; i++) n += r->procs[i].alive && r->procs[i].kind == kind;
  return n;
}

int procs_workers(const run *r) { return live(r, PROC_WORKER); }
int procs_coordinators(const run *r) { return live(r, PROC_COORD); }

/* Live processes, once the exited are reaped. */
static int alive_count(run *r) {
  procs_reap(r);
  int alive = 0;
  for (int i = 0; i < r->nprocs; i++) alive += r->procs[i].alive;
  return alive;
}

/* Ends every process. A job that is over (done, failed) ends by itself, as on Kubernetes:
 * a stopped process is woken, and what is left after 10 s is killed. A run cut short
 * (Ctrl-C, --timeout, an error) tells every process at once (SIGTERM: a worker leaves at
 * its step boundary, and when every rank leaves together none waits to hand its state
 * over; a coordinator resigns) and kills, all at once, what is left after STOP_GRACE_MS:
 * Ctrl-C ends a run within two seconds. But a job with a checkpoint directory stopped by a
 * signal saves the step its ranks stop at before they leave (worker_ckpt_stop), so that a
 * run on the directory resumes from that very step: its processes get STOP_SAVE_GRACE_MS,
 * and a second Ctrl-C ends newt run at once. Files stay whole either way: a step log line is
 * one write, and a checkpoint is visible only once its manifest is committed. */
#define STOP_GRACE_MS 1000
#define STOP_SAVE_GRACE_MS 160000 /* the workers' STOP_SAVE_MS (worker/save.c) and a margin */

void procs_stop_all(run *r) {
  r->stopping = 1;
  int ending = r->done || r->res->failed[0];
  int saving = !ending && newt_stop_requested() && r->o->spec.ckpt_dir[0] && r->o->spec.ckpt_every > 0 &&
               procs_workers(r) > 0;
  if (saving && !r->o->quiet)
    fprintf(stderr, "newt run: stopping: the workers save the step they stop at to %s before they leave (Ctrl-C "
            "again: end them now)\n", r->o->spec.ckpt_dir);
  newt_deadline_t d = newt_deadline_in_ms(ending ? 10000 : saving ? STOP_SAVE_GRACE_MS : STOP_GRACE_MS);
  for (int i = 0; i < r->nprocs; i++) {
    if (!r->procs[i].alive) continue;
    kill(r->procs[i].pid, SIGCONT); /* a stopped process cannot act on SIGTERM */
    if (!ending) kill(r->procs[i].pid, SIGTERM);
  }
  while (alive_count(r) && !newt_deadline_passed(d)) newt_sleep_ms(10);
  for (int i = 0; i < r->nprocs; i++)
    if (r->procs[i].alive) kill(r->procs[i].pid, SIGKILL);
  newt_deadline_t gone = newt_deadline_in_ms(10000); /* SIGKILL cannot be caught: reaping is prompt */
  while (alive_count(r) && !newt_deadline_passed(gone)) newt_sleep_ms(5);
}

