/* The single-host launcher (see launcher.h).
 *
 * It owns every process it starts (each dies with it), watches /newt/<job>/ for progress,
 * events and the end marker, fires the chaos schedule when the job reaches each step,
 * and pairs each fault it injected with the recovery the coordinator recorded for it:
 * faults carry the wall-clock time they were injected, recovery events the times of
 * detection, plan, communicator, restore and first step, so the summary's intervals are
 * differences of wall-clock times taken on this one host.
 *
 * The run's files for `newt report` live in the log directory: rank 0 appends the step log
 * (each worker is started with --step-log), and every event the watch brings is appended
 * to the event log as it is handled.
 *
 * With a program (launcher_opts.command) each worker is `newt worker <its flags> -- COMMAND
 * ARGS`, which execs the program in its place, with its slot on this host as LOCAL_RANK: the
 * pid the launcher tracks, signals and reaps is the program's. */
#include "launch/launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/json.h"
#include "common/log.h"
#include "common/proc.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "job/plan.h"
#include "job/records.h"
#include "job/runlog.h"
#include "job/store.h"
#include "job/view.h"
#include "launch/netns.h"
#include "rendezvous/etcd_server.h"
#include "rendezvous/rdzv.h"

typedef enum proc_kind { PROC_WORKER, PROC_COORD } proc_kind;

typedef struct proc {
  pid_t pid;
  proc_kind kind;
  char name[32];
  int alive;
  int killed_by_chaos;
  int metrics_port; /* a coordinator's (0: none) */
  int device;       /* a worker's GPU (-1: none) */
  int slot;         /* a worker's slot on this host, its LOCAL_RANK (-1: a coordinator) */
  int host;         /* a worker's simulated host (launcher_opts.hosts; -1: none) */
  int nshost;       /* with --netns: the host whose namespace it runs in (-1: none) */
} proc;

typedef struct fault {
  chaos_event ev;
  char what[64];  /* "kill:worker:1@step=15" */
  uint64_t t_ms;
  int matched;
  int join_first, joined; /* join: its joiners are w<join_first>.. (ev.arg of them); how many a plan has seen */
  char (*back)[RDZV_NAME_MAX]; /* a mended cut: the workers it left out, whose joins answer it
                                  (malloc'd; NULL: not a mend) */
  int nback;
} fault;

typedef struct run {
  const launcher_opts *o;
  launcher_result *res;
  char exe[4096];
  char etcd_url[512];
  rdzv_etcd_server *server;
  rdzv_etcd *etcd;
  job_follow *follow;
  char prefix[256];
  char secret_file[600]; /* the job's secret the workers derive data-plane keys from */
  proc *procs;
  int nprocs, cap_procs, next_worker, next_coord;
  fault *faults;
  int nfaults;
  int recoveries_seen;
  int event_log_fd; /* the event log (-1: none) */
  int steps_fd;     /* the step log, followed for the step when etcd is away (-1: not) */
  char steps_line[1024]; /* its line being read, and whether it outgrew the buffer */
  size_t steps_len;
  int steps_long;
  int64_t steps_world; /* the world of the step log's last line (0: none yet) */
  int tty;          /* stderr is a terminal: the live line refreshes in place */
  int line_open;    /* the live line is on the terminal, not ended by a line break */
  double t_line;    /* when the last plain live line was printed */
  double t_step0;   /* when the live line first saw a step, and which (for the ETA) */
  int64_t step0;

  pthread_mutex_t mu; /* the picture the watch keeps: */
  int64_t step, gen;
  double loss, tps;
  int world, dp;
  uint64_t progress_t_ms;
  job_event *events; /* events not handled yet */
  int nevents, cap_events;
  int done;
  int64_t done_step, done_samples;
  double done_loss;
  int stopping; /* ending every process: nothing is restarted, no exit is news */
  job_fault *notes; /* faults we injected, to note in etcd for newt status (note_fault) */
  int nnotes, notes_done;

  /* an etcd fault in progress (chaos): what was done, when to undo it */
  int etcd_down;
  chaos_event etcd_ev;   /* restart, stop or wipe of the whole etcd, or kill|stop of a member */
  uint64_t etcd_up_at;   /* monotonic ns: undo it then (0: never, a member left dead) */
  uint64_t etcd_back_ms; /* wall ms it served again (0: not yet) */
  int etcd_fault;        /* index into faults */
  uint64_t etcd_lost_ms; /* wall ms our watch of etcd last broke with nothing since (0: fine) */

  netns_net *net; /* --netns: the namespaces (NULL: none) */
  struct cut {    /* cuts and slow links in force that are to be mended (chaos cut:..., cut-etcd:...,
                     slow:...) */
    int host;
    int slow;       /* a slow link (else a cut of link) */
    netns_link link;
    uint64_t at;        /* monotonic ns to mend it (0: at until_step) */
    int64_t until_step;
    char what[64];
  } *cuts;
  int ncuts;
} run;

/* What starts a line of news: a line break ending the live line, when one is open on the
 * terminal (the news line then closes it). */
static const char *news(run *r) {
  const char *s = r->line_open ? "\n" : "";
  r->line_open = 0;
  return s;
}

/* --- processes ------------------------------------------------------------------------------- */

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
  char local_rank[32], local_world[32], hostname[32];
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
  strv_add2(argv, "--job-secret-file", r->secret_file);
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
  strv_add2(argv, "--job", r->o->spec.job);
  strv_add2(argv, "--id", x->name);
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
  p->device = x->gpu;
  p->slot = x->slot;
  p->host = x->host;
  p->nshost = x->nshost;
  snprintf(p->name, sizeof p->name, "%s", x->name);
  p->metrics_port = x->port;
  return NEWT_OK;
}

static newt_result_t spawn(run *r, proc_kind kind, int index) {
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
     processes in order (stop_all); each still dies with us */
  newt_spawn_opts so = {.log_path = x.logp, .env = env.v, .die_with_parent = 1, .new_session = 1};
  pid_t pid;
  newt_result_t res = argv.oom || env.oom ? NEWT_ERR(NEWT_ERR_NOMEM, "out of memory starting %s", x.name)
                                          : newt_proc_spawn(argv.v, &so, &pid);
  free(argv.v);
  free(env.v);
  NEWT_CHECK(res);
  return track(r, &x, pid);
}

static proc *find_proc(run *r, const char *name) {
  for (int i = 0; i < r->nprocs; i++)
    if (strcmp(r->procs[i].name, name) == 0) return &r->procs[i];
  return NULL;
}

/* Reaps exited children; a coordinator that chaos killed is started again. */
static void reap(run *r) {
  for (int i = 0; i < r->nprocs; i++) {
    proc *p = &r->procs[i];
    if (!p->alive) continue;
    int st;
    if (waitpid(p->pid, &st, WNOHANG) != p->pid) continue;
    p->alive = 0;
    char how[64];
    newt_proc_status_str(st, how, sizeof how);
    int expected = r->done || r->res->failed[0] || r->stopping || p->killed_by_chaos ||
                   (WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!expected && !r->o->quiet) fprintf(stderr, "%snewt run: %s exited (%s); see %s/%s.log\n", news(r), p->name, how, r->res->log_dir, p->name);
    if (p->kind == PROC_COORD && p->killed_by_chaos && !r->done && !r->stopping) {
      if (spawn(r, PROC_COORD, r->next_coord++) != NEWT_OK)
        fprintf(stderr, "newt run: restarting a coordinator: %s\n", newt_errmsg());
      p = &r->procs[i]; /* spawn may have moved the array */
    }
  }
}

/* --- the watch ------------------------------------------------------------------------------- */

/* A copy of a list of worker ids (NULL for none, or out of memory). */
static void *copy_ids(const void *ids, int n) {
  void *p = n > 0 ? malloc((size_t)n * RDZV_NAME_MAX) : NULL;
  if (p) memcpy(p, ids, (size_t)n * RDZV_NAME_MAX);
  return p;
}

/* Queues an event for the main loop, a copy of its own: the change's is freed with its batch. */
static void queue_event(run *r, const job_event *e) {
  if (r->nevents == r->cap_events) {
    int cap = r->cap_events ? 2 * r->cap_events : 32;
    job_event *evs = realloc(r->events, (size_t)cap * sizeof *evs);
    if (!evs) return;
    r->events = evs;
    r->cap_events = cap;
  }
  job_event *q = &r->events[r->nevents];
  *q = *e;
  q->excluded = copy_ids(e->excluded, e->nexcluded);
  q->spare_ids = copy_ids(e->spare_ids, e->nspare_ids);
  if ((e->nexcluded > 0 && !q->excluded) || (e->nspare_ids > 0 && !q->spare_ids)) {
    job_event_free(q);
    return;
  }
  r->nevents++;
}

static void take_progress(run *r, const job_progress *p) {
  if (p->step > r->step) r->step = p->step;
  r->gen = (int64_t)p->generation;
  r->loss = p->loss;
  r->tps = p->tokens_per_s;
  r->world = (int)p->world;
  r->dp = (int)p->dp;
  r->progress_t_ms = p->t_ms;
}

static void take_done(run *r, const job_done *d) {
  if (!job_done_plausible(d, &r->o->spec)) return;
  r->done_step = d->step;
  r->done_loss = d->loss;
  r->done_samples = (int64_t)d->samples;
  r->done = 1;
}

static void take_ckpt(launcher_result *res, const job_ckpt *c) {
  if (res->nckpts && res->ckpts[res->nckpts - 1].step >= c->step) return;
  launcher_ckpt *n = realloc(res->ckpts, (size_t)(res->nckpts + 1) * sizeof *n);
  if (!n) return;
  res->ckpts = n;
  n[res->nckpts++] = (launcher_ckpt){.step = c->step, .bytes = c->bytes, .save_ms = c->save_ms, .stall_ms = c->stall_ms};
}

/* One change into the picture (r->mu held); events are queued unless resync. A deletion, a
 * record its codec refused and the records the launcher does not follow change nothing. */
static void take(run *r, const job_change *ch, int resync) {
  if (ch->deleted) return;
  switch (ch->rec) {
    case JOB_REC_PROGRESS: take_progress(r, &ch->u.progress); break;
    case JOB_REC_DONE: take_done(r, &ch->u.done); break;
    case JOB_REC_CKPT: take_ckpt(r->res, &ch->u.ckpt); break;
    case JOB_REC_EVENT:
      if (!resync) queue_event(r, &ch->u.event);
      break;
    default: break;
  }
}

static void on_changes(void *ud, const job_change *chs, size_t n, int resync) {
  run *r = ud;
  pthread_mutex_lock(&r->mu);
  for (size_t i = 0; i < n; i++) take(r, &chs[i], resync);
  pthread_mutex_unlock(&r->mu);
}

static void on_health(void *ud, int ok, const char *why) {
  (void)why;
  run *r = ud;
  pthread_mutex_lock(&r->mu);
  r->etcd_lost_ms = ok ? 0 : newt_wall_ms();
  pthread_mutex_unlock(&r->mu);
}

/* Follows the step log rank 0 appends to (the run's own file, job/runlog.h): each step
 * reaches the launcher through it even while etcd is away, so the chaos schedule fires at
 * its step and the live line moves whatever etcd does. Reads what was appended since the
 * last look, at most 64 KiB a call; a line that does not parse (torn by a killed writer, or
 * longer than the buffer) is skipped. */
/* A step log line in another world than the last while etcd is away: the survivors of a
 * crash went on among themselves (worker/peers.c); the leader's plan, and its "recovered"
 * line, come only once etcd is back. Says so, timed from the newest worker fault before it. */
static void resumed_line(run *r, const job_step *s) {
  int64_t prev = r->steps_world;
  r->steps_world = s->world;
  pthread_mutex_lock(&r->mu);
  int away = r->etcd_down || r->etcd_lost_ms;
  pthread_mutex_unlock(&r->mu);
  if (!prev || s->world == prev || !away || r->o->quiet) return;
  const fault *f = NULL;
  for (int i = 0; i < r->nfaults; i++)
    if (r->faults[i].ev.target == CHAOS_WORKER && r->faults[i].ev.action != CHAOS_JOIN && r->faults[i].t_ms <= s->t_ms)
      f = &r->faults[i];
  if (!f) return;
  fprintf(stderr, "%snewt run: training resumed without etcd at step %lld, %lld ms after %s: %lld ranks (the survivors "
          "went on among themselves; the leader's plan follows once etcd is back)\n", news(r), (long long)s->step,
          (long long)(s->t_ms - f->t_ms), f->what, (long long)s->world);
}

static void follow_steps(run *r) {
  char chunk[65536];
  ssize_t got = r->steps_fd >= 0 ? read(r->steps_fd, chunk, sizeof chunk) : 0;
  for (ssize_t i = 0; i < got; i++) {
    if (chunk[i] != '\n') {
      if (r->steps_len < sizeof r->steps_line) r->steps_line[r->steps_len++] = chunk[i];
      else r->steps_long = 1;
      continue;
    }
    job_step s;
    if (!r->steps_long && job_step_from_json(r->steps_line, r->steps_len, &s) == NEWT_OK) {
      resumed_line(r, &s);
      pthread_mutex_lock(&r->mu);
      if (s.step > r->step || (int64_t)s.generation > r->gen) {
        if (s.step > r->step) r->step = s.step;
        r->gen = (int64_t)s.generation;
        r->loss = s.loss;
        r->tps = s.tokens_per_s;
        r->world = (int)s.world;
        r->dp = (int)s.dp;
      }
      pthread_mutex_unlock(&r->mu);
    }
    r->steps_len = 0;
    r->steps_long = 0;
  }
}

/* Reads the record rec (a key of its own: job_key) into *ch, decoded (JOB_REC_OTHER where
 * its codec refused it; job_change_free it). NEWT_ERR_NOTFOUND: no such key; else etcd's. */
static newt_result_t read_record(run *r, job_record rec, newt_deadline_t d, job_change *ch) {
  char key[256];
  rdzv_etcd_kv kv;
  NEWT_CHECK(job_key(key, sizeof key, r->o->spec.job, rec, 0, NULL));
  NEWT_CHECK(rdzv_etcd_get(r->etcd, key, d, &kv, NULL));
  job_change_decode(r->prefix, &kv, 0, ch);
  ch->kv = NULL; /* freed here: what the change holds is its own */
  rdzv_etcd_kv_free(&kv);
  return NEWT_OK;
}

/* Reads the end marker from etcd directly (retrying until d while etcd does not answer);
 * 1 when the job is done (taken as the watch would), 0 when it is not or etcd is away. */
static int read_done(run *r, newt_deadline_t d) {
  for (;;) {
    job_change ch;
    newt_result_t res = read_record(r, JOB_REC_DONE, newt_deadline_min(d, newt_deadline_in_ms(2000)), &ch);
    if (res == NEWT_OK) {
      pthread_mutex_lock(&r->mu);
      take(r, &ch, 1);
      int done = r->done;
      pthread_mutex_unlock(&r->mu);
      job_change_free(&ch);
      return done;
    }
    if (res == NEWT_ERR_NOTFOUND || newt_deadline_passed(d)) return 0;
    newt_sleep_ms(100);
  }
}

/* --- chaos ----------------------------------------------------------------------------------- */

static fault *add_fault(run *r, const chaos_event *e) {
  fault *f = realloc(r->faults, (size_t)(r->nfaults + 1) * sizeof *f);
  if (!f) return NULL;
  r->faults = f;
  f = &r->faults[r->nfaults++];
  memset(f, 0, sizeof *f);
  f->ev = *e;
  chaos_event_str(e, f->what, sizeof f->what);
  f->t_ms = newt_wall_ms();
  return f;
}

/* The plan in force, from etcd (NEWT_ERR_*: none, etcd away, or refused). */
static newt_result_t current_plan(run *r, newt_plan *out) {
  job_change ch;
  NEWT_CHECK(read_record(r, JOB_REC_PLAN, newt_deadline_in_ms(2000), &ch));
  if (ch.rec != JOB_REC_PLAN) return NEWT_ERR(NEWT_ERR_INVALID, "%s", ch.why);
  *out = ch.u.plan; /* its arrays are the caller's now */
  return NEWT_OK;
}

/* The plan in force before the faults of one look fire (NULL where etcd is away: nothing
 * waits for it): the rank a "rank" fault names, and whether a worker fault lands on a spare.
 * Taken once for all the faults due together, so that faults of one step fire back to back. */
static newt_plan *plan_before_faults(run *r, newt_plan *buf) {
  pthread_mutex_lock(&r->mu);
  int away = r->etcd_down || r->etcd_lost_ms;
  pthread_mutex_unlock(&r->mu);
  return !away && current_plan(r, buf) == NEWT_OK ? buf : NULL;
}

/* A worker fault that lands on a spare (a worker the plan in force does not make a rank)
 * costs no rank and answers no recovery: says so, and returns 1. */
static int lands_on_spare(run *r, const newt_plan *plan, const char *what, const char *name) {
  if (!plan || plan_find(plan, name)) return 0;
  if (!r->o->quiet)
    fprintf(stderr, "%snewt run: chaos: %s lands on %s, a spare of plan %llu (%s): no rank is lost, training goes on\n",
            news(r), what, name, (unsigned long long)plan->generation,
            plan_is_spare(plan, name) && plan->spare_why[0] ? plan->spare_why : "it joined after the plan");
  return 1;
}

static int signal_of(chaos_action a) {
  switch (a) {
    case CHAOS_KILL: return SIGKILL;
    case CHAOS_STOP: return SIGSTOP;
    case CHAOS_TERM: return SIGTERM;
    default: return SIGCONT;
  }
}

/* kill:host:I: every live worker of simulated host I, SIGKILL back to back (a node lost as a
 * unit); one fault, answered by one recovery, unless every one of them was a spare. */
static void fire_host(run *r, const chaos_event *e, const newt_plan *plan, const char *what) {
  if (r->o->hosts <= 0 || e->index >= r->o->hosts) {
    fprintf(stderr, "%snewt run: chaos %s: there is no simulated host %d (--hosts %d)\n", news(r), what, e->index,
            r->o->hosts);
    return;
  }
  pid_t pids[1024];
  int n = 0, ranks = 0;
  char names[512] = "";
  for (int i = 0; i < r->nprocs && n < (int)(sizeof pids / sizeof pids[0]); i++) {
    proc *p = &r->procs[i];
    if (!p->alive || p->kind != PROC_WORKER || p->host != e->index) continue;
    p->killed_by_chaos = 1;
    pids[n++] = p->pid;
    ranks += !plan || plan_find(plan, p->name) != NULL;
    newt_list_add(names, sizeof names, p->name);
  }
  if (n == 0) {
    fprintf(stderr, "%snewt run: chaos %s: no worker of host%d is running\n", news(r), what, e->index);
    return;
  }
  fault *f = add_fault(r, e);
  for (int i = 0; i < n; i++) kill(pids[i], SIGKILL); /* nothing between them: the host goes at once */
  if (ranks == 0) { /* every one a spare of the plan in force: no rank is lost */
    if (f) f->matched = 1;
    if (!r->o->quiet)
      fprintf(stderr, "%snewt run: chaos: %s kills %s, spares of plan %llu: no rank is lost, training goes on\n",
              news(r), what, names, (unsigned long long)plan->generation);
    return;
  }
  if (!r->o->quiet)
    fprintf(stderr, "%snewt run: chaos: %s (host%d: %s, %d worker%s at once)\n", news(r), what, e->index, names, n,
            n == 1 ? "" : "s");
}

/* cut:... / cut-etcd:...: the target's namespace cut (netns_cut), to be mended after arg ms
 * or at until_step (mend_cuts). A cut of the data plane is a worker fault a recovery answers
 * (the others lose the cut-off ranks), unless no rank is there; a cut from etcd answers none
 * (the job goes on as it is: docs/elastic.md, "etcd away"). */
static void fire_cut(run *r, const chaos_event *e, const newt_plan *plan, const char *what) {
  int host = e->target == CHAOS_HOST ? e->index : -1;
  if (e->target != CHAOS_HOST) {
    char name[RDZV_NAME_MAX] = "";
    if (!e->by_rank) snprintf(name, sizeof name, "w%d", e->index);
    else if (plan && e->index < plan->nranks) snprintf(name, sizeof name, "%s", plan->ranks[e->index].worker);
    proc *p = name[0] ? find_proc(r, name) : NULL;
    if (!p || !p->alive) {
      fprintf(stderr, "%snewt run: chaos %s: %s\n", news(r), what, name[0] ? "not running" : "no such rank now");
      return;
    }
    host = p->nshost;
  }
  netns_link link = e->action == CHAOS_CUT ? NETNS_PEERS : NETNS_ETCD;
  int slow = e->action == CHAOS_SLOW;
  if ((slow ? netns_slow(r->net, host, e->kbit) : netns_cut(r->net, host, link, 1)) != NEWT_OK) {
    fprintf(stderr, "%snewt run: chaos %s: %s\n", news(r), what, newt_errmsg());
    return;
  }
  char names[256] = "";
  int ranks = 0;
  for (int i = 0; i < r->nprocs; i++) {
    const proc *p = &r->procs[i];
    if (!p->alive || p->kind != PROC_WORKER || p->nshost != host) continue;
    newt_list_add(names, sizeof names, p->name);
    ranks += !plan || plan_find(plan, p->name) != NULL;
  }
  fault *f = add_fault(r, e);
  if (f && (slow || link == NETNS_ETCD || ranks == 0)) f->matched = 1; /* no recovery is to answer it */
  if (e->arg || e->until_step) {
    struct cut *c = realloc(r->cuts, (size_t)(r->ncuts + 1) * sizeof *c);
    if (c) {
      r->cuts = c;
      c = &r->cuts[r->ncuts++];
      *c = (struct cut){.host = host, .slow = slow, .link = link, .until_step = e->until_step,
                        .at = e->arg ? newt_now_ns() + (uint64_t)e->arg * 1000000ull : 0};
      snprintf(c->what, sizeof c->what, "%s", what);
    }
  }
  if (!r->o->quiet)
    fprintf(stderr, "%snewt run: chaos: %s (the namespace of %s %s)\n", news(r), what, names[0] ? names : "no worker",
            slow                 ? "on a slow link with a short queue: slow and lossy"
            : link == NETNS_PEERS ? "cut from every other host: a partition of the data plane"
                                  : "cut from etcd and the coordinators");
}

/* A data-plane cut mended: the workers it left out (alive, no rank of the plan in force)
 * come back as joiners, so the mend is a fault their joins answer (join_answers), as a
 * woken worker's cont is. */
static void note_mend(run *r, const struct cut *c) {
  newt_plan buf, *plan = plan_before_faults(r, &buf);
  int n = 0;
  char (*back)[RDZV_NAME_MAX] = calloc((size_t)(r->nprocs ? r->nprocs : 1), sizeof *back);
  for (int i = 0; back && i < r->nprocs; i++) {
    const proc *p = &r->procs[i];
    /* without a plan to look at (etcd away), those of the cut host */
    int out = plan ? !plan_find(plan, p->name) : p->nshost == c->host;
    if (p->alive && p->kind == PROC_WORKER && out) snprintf(back[n++], RDZV_NAME_MAX, "%s", p->name);
  }
  if (plan) plan_free(plan);
  chaos_event ev = {.action = CHAOS_CUT, .target = CHAOS_HOST, .index = c->host};
  fault *f = n ? add_fault(r, &ev) : NULL;
  if (!f) {
    free(back);
    return;
  }
  snprintf(f->what, sizeof f->what, "%.50s mended", c->what);
  f->back = back;
  f->nback = n;
}

/* Mends the cuts whose time or step has come. */
static void mend_cuts(run *r, int64_t step) {
  uint64_t now = newt_now_ns();
  for (int i = 0; i < r->ncuts;) {
    struct cut *c = &r->cuts[i];
    if (c->at ? now < c->at : step < c->until_step) {
      i++;
      continue;
    }
    if ((c->slow ? netns_slow(r->net, c->host, 0) : netns_cut(r->net, c->host, c->link, 0)) != NEWT_OK) {
      fprintf(stderr, "%snewt run: chaos %s: cannot mend it: %s\n", news(r), c->what, newt_errmsg());
    } else {
      if (!r->o->quiet) fprintf(stderr, "%snewt run: chaos: %s mended\n", news(r), c->what);
      if (!c->slow && c->link == NETNS_PEERS) note_mend(r, c);
    }
    r->cuts[i] = r->cuts[--r->ncuts];
  }
}

static void fire(run *r, chaos_event *e, const newt_plan *plan) {
  char what[64], name[RDZV_NAME_MAX];
  chaos_event_str(e, what, sizeof what);
  e->fired = 1;
  proc *p = NULL;
  if (e->action == CHAOS_CUT || e->action == CHAOS_CUT_ETCD || e->action == CHAOS_SLOW) {
    fire_cut(r, e, plan, what);
    return;
  }
  switch (e->target) {
    case CHAOS_WORKER:
      if (e->action == CHAOS_JOIN) {
        int first = r->next_worker;
        for (int64_t k = 0; k < e->arg; k++)
          if (spawn(r, PROC_WORKER, r->next_worker++) != NEWT_OK)
            fprintf(stderr, "newt run: chaos %s: %s\n", what, newt_errmsg());
        fault *f = add_fault(r, e);
        if (f) f->join_first = first;
        break;
      }
      if (e->by_rank) {
        /* the worker that is this rank of the plan now in force */
        name[0] = '\0';
        if (plan && e->index < plan->nranks) snprintf(name, sizeof name, "%s", plan->ranks[e->index].worker);
        if (!name[0]) {
          fprintf(stderr, "newt run: chaos %s: no rank %d in the current plan\n", what, e->index);
          return;
        }
      } else {
        snprintf(name, sizeof name, "w%d", e->index);
      }
      p = find_proc(r, name);
      break;
    case CHAOS_COORDINATOR:
      if (e->index >= 0) {
        snprintf(name, sizeof name, "c%d", e->index);
      } else if (job_leader_get(r->etcd, r->o->spec.job, newt_deadline_in_ms(2000), name, sizeof name, NULL) != NEWT_OK) {
        fprintf(stderr, "newt run: chaos %s: no leader to act on (%s)\n", what, newt_errmsg());
        return;
      }
      p = find_proc(r, name);
      break;
    case CHAOS_HOST:
      fire_host(r, e, plan, what);
      return;
    case CHAOS_ETCD: {
      newt_result_t res = NEWT_OK;
      if (!r->server)
        res = NEWT_ERR(NEWT_ERR_UNSUPPORTED, "chaos on etcd needs the private etcd (no --etcd)");
      else if (e->index >= rdzv_etcd_server_members(r->server))
        res = NEWT_ERR(NEWT_ERR_INVALID, "etcd has %d members, there is no member %d (--etcd-members)",
                       rdzv_etcd_server_members(r->server), e->index);
      else if (r->etcd_down)
        res = NEWT_ERR(NEWT_ERR_INVALID, "an etcd fault is still in progress");
      else if (e->index >= 0)
        res = e->action == CHAOS_KILL ? rdzv_etcd_server_member_kill(r->server, e->index)
                                      : rdzv_etcd_server_member_pause(r->server, e->index);
      else
        res = e->action == CHAOS_STOP ? rdzv_etcd_server_pause(r->server) : rdzv_etcd_server_stop(r->server, 0);
      if (res != NEWT_OK) {
        fprintf(stderr, "%snewt run: chaos %s: %s\n", news(r), what, newt_errmsg());
        return;
      }
      fault *f = add_fault(r, e);
      r->etcd_down = 1;
      r->etcd_ev = *e;
      r->etcd_back_ms = 0;
      r->etcd_up_at = e->until_step || (e->index >= 0 && e->arg == 0) ? 0 : newt_now_ns() + (uint64_t)e->arg * 1000000ull;
      r->etcd_fault = f ? (int)(f - r->faults) : -1;
      break;
    }
  }
  if (p) {
    if (!p->alive) {
      fprintf(stderr, "newt run: chaos %s: %s is not running\n", what, p->name);
      return;
    }
    if (e->action == CHAOS_KILL) p->killed_by_chaos = 1;
    /* a woken worker comes back as a joiner: cont answers a join; a fault on a spare answers
       nothing */
    fault *f = add_fault(r, e);
    kill(p->pid, signal_of(e->action));
    int spare = p->kind == PROC_WORKER && e->action != CHAOS_CONT && lands_on_spare(r, plan, what, p->name);
    if (f && spare) f->matched = 1;
    if (spare) return;
  } else if (e->target != CHAOS_ETCD && e->action != CHAOS_JOIN) {
    fprintf(stderr, "newt run: chaos %s: no such process\n", what);
    return;
  }
  if (!r->o->quiet) fprintf(stderr, "%snewt run: chaos: %s\n", news(r), what);
}

/* --- recoveries -------------------------------------------------------------------------- */

static launcher_recovery *add_recovery(run *r) {
  launcher_recovery *n = realloc(r->res->recoveries, (size_t)(r->res->nrecoveries + 1) * sizeof *n);
  if (!n) return NULL;
  r->res->recoveries = n;
  n = &r->res->recoveries[r->res->nrecoveries++];
  memset(n, 0, sizeof *n);
  return n;
}

static int64_t diff(uint64_t a, uint64_t b) { return a >= b ? (int64_t)(a - b) : 0; }

/* How many of a join fault's joiners plan (its ranks, spares and donors) or ids (a spare
 * event's) name. */
/* The workers whose joins answer a join fault (its joiners) or a mended cut (those it left
 * out): how many, and the k-th. */
static int64_t joiner_count(const fault *f) { return f->back ? f->nback : f->ev.arg; }
static void joiner_name(const fault *f, int64_t k, char *name, size_t cap) {
  if (f->back) snprintf(name, cap, "%s", f->back[k]);
  else snprintf(name, cap, "w%lld", (long long)(f->join_first + k));
}

static int joiners_seen(const fault *f, const newt_plan *plan, char (*ids)[RDZV_NAME_MAX], int nids) {
  int n = 0;
  for (int64_t k = 0; k < joiner_count(f); k++) {
    char name[RDZV_NAME_MAX];
    joiner_name(f, k, name, sizeof name);
    int seen = plan && (plan_find(plan, name) || plan_is_spare(plan, name) || plan_find_donor(plan, name));
    for (int i = 0; !seen && i < nids; i++) seen = strcmp(ids[i], name) == 0;
    n += seen;
  }
  return n;
}

/* Whether a join (or a spare event) answers join fault f: it does where a plan names more of
 * its joiners than before; the fault is answered in full once every joiner was seen. Several
 * joiners of one fault may register far enough apart to be taken in by two plans. Without a
 * plan to look at (etcd away), the first join answers it. */
static int join_answers(fault *f, const newt_plan *plan, char (*ids)[RDZV_NAME_MAX], int nids) {
  if (!plan && nids == 0) return f->matched = 1;
  int seen = joiners_seen(f, plan, ids, nids);
  if (seen <= f->joined) return 0;
  f->joined = seen;
  f->matched = seen >= joiner_count(f);
  return 1;
}

/* The faults a recovery answers: every unmatched fault of its kind injected before its
 * plan (several at once are coalesced into one plan); for a crash or hang, any worker
 * fault, since a stopped worker may be seen first through its expired lease; for a join,
 * the join faults whose joiners plan names (join_answers). */
static uint64_t match_faults(run *r, const char *cause, uint64_t t_plan, const newt_plan *plan, const char **what) {
  uint64_t first = 0;
  int join = strcmp(cause, "join") == 0;
  for (int i = 0; i < r->nfaults; i++) {
    fault *f = &r->faults[i];
    if (f->matched || f->t_ms > t_plan) continue;
    const chaos_event *e = &f->ev;
    int worker_fault = !f->back && (e->target == CHAOS_WORKER || e->target == CHAOS_HOST) &&
                       e->action != CHAOS_JOIN && e->action != CHAOS_CONT;
    int ok = (join && e->action == CHAOS_CONT) ||
             (strcmp(cause, "leave") == 0 && worker_fault && e->action == CHAOS_TERM) ||
             ((strcmp(cause, "crash") == 0 || strcmp(cause, "hang") == 0) && worker_fault &&
              e->action != CHAOS_TERM);
    if (ok) f->matched = 1;
    else if (join && (e->action == CHAOS_JOIN || f->back)) ok = join_answers(f, plan, NULL, 0);
    if (!ok) continue;
    if (!first || f->t_ms < first) first = f->t_ms, *what = f->what;
  }
  return first;
}

void launcher_recovery_of(const job_event *e, uint64_t t_fault, launcher_recovery *out) {
  job_recovery_times rt = job_recovery_time(e, t_fault);
  memset(out, 0, sizeof *out);
  snprintf(out->cause, sizeof out->cause, "%s", e->cause);
  snprintf(out->restore, sizeof out->restore, "%s", e->restore);
  out->generation = e->generation;
  out->t_ms = rt.start;
  out->step = e->restore_step;
  out->world = e->world;
  out->detect_ms = rt.detect_ms;
  out->plan_ms = rt.plan_ms;
  out->comm_ms = rt.comm_ms;
  out->restore_ms = rt.restore_ms;
  out->step_ms = rt.step_ms;
  out->total_ms = rt.total_ms;
  out->steps_lost = e->steps_lost;
  out->outage_ms = out->pause_ms = out->resumed_ms = -1;
}

/* Notes in etcd a fault we injected, for the recovery of generation gen (job_fault): newt
 * status then times that recovery as we do. Written off the event's path (flush_notes),
 * when etcd answers. */
static void note_fault(run *r, int64_t gen, uint64_t t_ms, const char *what) {
  job_fault *n = realloc(r->notes, (size_t)(r->nnotes + 1) * sizeof *n);
  if (!n) return;
  r->notes = n;
  n = &r->notes[r->nnotes++];
  memset(n, 0, sizeof *n);
  n->generation = gen;
  n->t_ms = t_ms;
  snprintf(n->what, sizeof n->what, "%s", what);
}

/* Writes the notes not written yet, while etcd answers (a note waits out an outage, and
 * the loop is not held up asking an etcd its watch says is away). */
static void flush_notes(run *r, int64_t wait_ms) {
  pthread_mutex_lock(&r->mu);
  int away = r->etcd_down || r->etcd_lost_ms;
  pthread_mutex_unlock(&r->mu);
  while (!away && r->notes_done < r->nnotes && r->etcd) {
    const job_fault *f = &r->notes[r->notes_done];
    char key[256], *text = job_fault_to_json(f);
    newt_result_t res = text ? job_key(key, sizeof key, r->o->spec.job, JOB_REC_FAULT, (uint64_t)f->generation, NULL)
                             : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
    if (res == NEWT_OK)
      res = rdzv_etcd_put(r->etcd, key, text, strlen(text), 0, newt_deadline_in_ms(wait_ms), NULL);
    free(text);
    if (res != NEWT_OK) return; /* the next look tries again */
    r->notes_done++;
  }
}

/* Worker ids, comma-separated, on stderr. */
static void print_ids(char (*ids)[RDZV_NAME_MAX], int n) {
  for (int i = 0; i < n; i++) fprintf(stderr, "%s%s", i ? ", " : "", ids[i]);
}

static void handle_event(run *r, const job_event *e) {
  const char *cause = e->cause, *restore = e->restore;
  int64_t gen = e->generation, world = e->world, lost = e->steps_lost;
  if (gen > r->res->generations) r->res->generations = gen;
  if (e->type == JOB_EV_RECOVERED) {
    launcher_recovery *rec = add_recovery(r);
    if (rec) {
      const char *what = "";
      /* a join is matched by its joiners in the plan in force (a later one names them too) */
      newt_plan buf, *plan = strcmp(cause, "join") == 0 ? plan_before_faults(r, &buf) : NULL;
      uint64_t t_fault = match_faults(r, cause, e->t_plan, plan, &what);
      if (plan) plan_free(plan);
      /* one definition in every view (job_recovery_time): from the fault we injected, else
         the first detection; a join starts at the joiner's registration, not at the start
         of its process. newt status learns of the fault from our note in etcd. */
      uint64_t from_fault = strcmp(cause, "join") == 0 ? 0 : t_fault;
      launcher_recovery_of(e, from_fault, rec);
      if (from_fault && rec->t_ms == from_fault) note_fault(r, gen, from_fault, what);
      snprintf(rec->fault, sizeof rec->fault, "%s", what);
      rec->t_fault = t_fault;
      if (!r->o->quiet)
        fprintf(stderr,
                "%snewt run: recovered from %s in %lld ms (detect %lld, plan %lld, comm %lld, restore %lld, first "
                "step %lld ms; state from %s), generation %lld, %lld rank%s, %lld step%s lost\n",
                news(r), cause, (long long)rec->total_ms, (long long)rec->detect_ms, (long long)rec->plan_ms,
                (long long)rec->comm_ms, (long long)rec->restore_ms, (long long)rec->step_ms, restore, (long long)gen,
                (long long)world,
                world == 1 ? "" : "s", (long long)lost, lost == 1 ? "" : "s");
      if (!r->o->quiet && lost > 0 && (strcmp(restore, "ckpt") == 0 || strcmp(restore, "init") == 0))
        fprintf(stderr, "newt run: WARNING: no step was whole in the ranks' memory: training went back to %s, %lld "
                "step%s lost (more failure domains lost at once than spec.fault.replicas keeps copies for?)\n",
                strcmp(restore, "ckpt") == 0 ? "the newest checkpoint" : "the initial state", (long long)lost,
                lost == 1 ? "" : "s");
    }
  } else if (e->type == JOB_EV_LEADER) {
    /* a coordinator we killed has been replaced */
    for (int i = 0; i < r->nfaults; i++) {
      fault *f = &r->faults[i];
      if (f->matched || f->ev.target != CHAOS_COORDINATOR || f->t_ms > e->t_ms) continue;
      f->matched = 1;
      launcher_recovery *rec = add_recovery(r);
      if (!rec) break;
      snprintf(rec->cause, sizeof rec->cause, "coordinator");
      snprintf(rec->restore, sizeof rec->restore, "memory");
      snprintf(rec->fault, sizeof rec->fault, "%s", f->what);
      rec->t_fault = rec->t_ms = f->t_ms;
      rec->step = r->step;
      rec->world = r->world;
      rec->detect_ms = rec->total_ms = diff(e->t_ms, f->t_ms);
      if (!r->o->quiet)
        fprintf(stderr, "%snewt run: a new coordinator leads %lld ms after the leader was lost; training went on\n",
                news(r), (long long)rec->total_ms);
    }
  } else if (e->type == JOB_EV_PLAN && !r->o->quiet && (strcmp(cause, "initial") != 0 || e->spares > 0)) {
    fprintf(stderr, "%snewt run: plan %lld (%s): %lld rank%s", news(r), (long long)gen, cause, (long long)world,
            world == 1 ? "" : "s");
    if (e->spares > 0) {
      fprintf(stderr, ", %lld spare%s (", (long long)e->spares, e->spares == 1 ? "" : "s");
      print_ids(e->spare_ids, e->nspare_ids);
      fprintf(stderr, "): %s", e->why[0] ? e->why : "the layout has no room for them");
    }
    fputc('\n', stderr);
  } else if (e->type == JOB_EV_SPARE) {
    /* joiners the layout takes no more of than before: a join fault is answered by it */
    for (int i = 0; i < r->nfaults; i++) {
      fault *f = &r->faults[i];
      if (f->matched || (f->ev.action != CHAOS_JOIN && !f->back) || f->t_ms > e->t_ms) continue;
      if (join_answers(f, NULL, e->spare_ids, e->nspare_ids)) break;
    }
    if (!r->o->quiet) {
      fprintf(stderr, "%snewt run: ", news(r));
      print_ids(e->spare_ids, e->nspare_ids);
      fprintf(stderr, " joined and stay%s: %s\n", e->nspare_ids == 1 ? "s a spare" : " spares", e->why);
    }
  } else if (e->type == JOB_EV_WAITING && !r->o->quiet) {
    fprintf(stderr, "%snewt run: the coordinator waits for workers: %s\n", news(r), e->why);
  } else if (e->type == JOB_EV_ETCD && !r->o->quiet) {
    fprintf(stderr, "%snewt run: %s\n", news(r), e->why);
  } else if (e->type == JOB_EV_FAILED) {
    snprintf(r->res->failed, sizeof r->res->failed, "%s", e->why);
    fprintf(stderr, "%snewt run: the job failed: %s\n", news(r), e->why);
  } else if (e->type == JOB_EV_SPEC && !r->o->quiet) {
    fprintf(stderr, "%snewt run: spec %s\n", news(r), e->why);
  }
}

/* Undoes an etcd fault when its time is up (start, resume or refill the store), and records
 * it once training's progress (or the end marker) reaches etcd again. */
static void etcd_tick(run *r) {
  if (!r->etcd_down) return;
  const chaos_event *e = &r->etcd_ev;
  pthread_mutex_lock(&r->mu);
  int until_reached = e->until_step && r->step >= e->until_step;
  pthread_mutex_unlock(&r->mu);
  if (!r->etcd_back_ms && ((r->etcd_up_at && newt_now_ns() >= r->etcd_up_at) || until_reached)) {
    newt_deadline_t d = newt_deadline_in_ms(30000);
    newt_result_t res = e->index >= 0 ? (e->action == CHAOS_KILL ? rdzv_etcd_server_member_restart(r->server, e->index, d)
                                                                : rdzv_etcd_server_member_resume(r->server, e->index))
                        : e->action == CHAOS_STOP ? rdzv_etcd_server_resume(r->server)
                        : e->action == CHAOS_WIPE ? rdzv_etcd_server_wipe(r->server, d)
                                                  : rdzv_etcd_server_restart(r->server, d);
    if (res != NEWT_OK) {
      fprintf(stderr, "%snewt run: bringing etcd back: %s\n", news(r), newt_errmsg());
      r->etcd_down = 0;
      return;
    }
    r->etcd_back_ms = newt_wall_ms();
    if (!r->o->quiet)
      fprintf(stderr, "%snewt run: etcd %s\n", news(r),
              e->index >= 0 ? "has all its members again" : e->action == CHAOS_WIPE ? "serves again, empty" : "serves again");
  }
  if (r->etcd_fault < 0) {
    r->etcd_down = r->etcd_back_ms == 0;
    return;
  }
  fault *f = &r->faults[r->etcd_fault];
  /* training's progress must reach etcd after it came back (after the fault, for a member
     left dead, or one still away when the job's end marker reached the others: they served
     all along) */
  int for_good = !r->etcd_up_at && !r->etcd_ev.until_step; /* a member left dead */
  uint64_t since = r->etcd_back_ms ? r->etcd_back_ms : for_good || r->done ? f->t_ms : 0;
  if (!since || (r->progress_t_ms < since && !r->done)) return;
  r->etcd_down = 0;
  f->matched = 1;
  launcher_recovery *rec = add_recovery(r);
  if (!rec) return;
  snprintf(rec->cause, sizeof rec->cause, "etcd");
  snprintf(rec->restore, sizeof rec->restore, "memory");
  snprintf(rec->fault, sizeof rec->fault, "%s", f->what);
  rec->t_fault = rec->t_ms = f->t_ms;
  rec->step = r->step;
  rec->world = r->world;
  uint64_t reached = r->progress_t_ms >= since ? r->progress_t_ms : newt_wall_ms(); /* or the end marker */
  rec->outage_ms = r->etcd_back_ms ? diff(r->etcd_back_ms, f->t_ms) : 0;
  rec->pause_ms = rec->resumed_ms = -1; /* from the step log, at the end */
  rec->detect_ms = rec->outage_ms;
  rec->total_ms = diff(reached, f->t_ms);
  if (!r->o->quiet && !r->etcd_back_ms && !for_good)
    fprintf(stderr, "%snewt run: the job ended while etcd's fault (%s) lasted; training went on\n", news(r), f->what);
  else if (!r->o->quiet)
    fprintf(stderr, "%snewt run: etcd was away for %lld ms; training went on, %lld ms until progress reached it again\n",
            news(r), (long long)rec->outage_ms, (long long)rec->total_ms);
}

/* Measures each etcd outage on the step log (rank 0's line per step, with its wall time and
 * throughput): the longest stretch without a step while etcd was away, beyond the usual step
 * time before it (0 when no stretch was three usual step times: steps went on at their
 * pace), and the median tokens/s of the steps before it and of those during it. */
static void measure_outages(run *r) {
  job_step *s = NULL;
  size_t n = 0;
  if (job_steplog_read(r->res->step_log, &s, &n, NULL) != NEWT_OK || job_steplog_stitch(s, &n, NULL) != NEWT_OK) {
    free(s);
    return;
  }
  for (int k = 0; k < r->res->nrecoveries; k++) {
    launcher_recovery *rec = &r->res->recoveries[k];
    if (strcmp(rec->cause, "etcd") != 0 || n < 3) continue;
    uint64_t down = rec->t_fault, up = down + (uint64_t)(rec->outage_ms > 0 ? rec->outage_ms : rec->total_ms);
    double gaps[64], before[64], during[4096];
    size_t ng = 0, nb = 0, nd = 0;
    uint64_t longest = 0;
    for (size_t i = 1; i < n; i++) {
      uint64_t t = s[i].t_ms, gap = t > s[i - 1].t_ms ? t - s[i - 1].t_ms : 0;
      if (t < down && t + 10000 >= down) {
        if (ng < 64) gaps[ng++] = (double)gap;
        if (nb < 64) before[nb++] = s[i].tokens_per_s;
      } else if (t >= down && s[i - 1].t_ms <= up) {
        if (gap > longest) longest = gap;
        if (t <= up && nd < 4096) during[nd++] = s[i].tokens_per_s;
      }
    }
    double usual = newt_median(gaps, ng);
    rec->pause_ms = ng && longest > 3 * usual ? (int64_t)((double)longest - usual) : 0;
    rec->tps_before = newt_median(before, nb);
    rec->tps_during = newt_median(during, nd);
  }
  for (int k = 0; k < r->res->nrecoveries; k++) {
    launcher_recovery *rec = &r->res->recoveries[k];
    rec->resumed_ms = -1;
    if (!rec->t_fault || strcmp(rec->cause, "etcd") == 0) continue;
    int64_t world = -1; /* the world of the last step before the fault */
    for (size_t i = 0; i < n; i++) {
      if (s[i].t_ms <= rec->t_fault) world = s[i].world;
      else if (world >= 0 && s[i].world != world) {
        rec->resumed_ms = (int64_t)(s[i].t_ms - rec->t_fault);
        break;
      }
    }
  }
  free(s);
}


/* --- the run ------------------------------------------------------------------------------ */

/* The live line. On a terminal: one line refreshed in place, with the time left at the
 * pace since the first step seen. Elsewhere (a log file, a CI console): a plain line every
 * few seconds, and the last one. No loss is shown before the first step. */
static void live_line(run *r, double t0, int last) {
  if (r->o->quiet) return;
  double now = newt_now_s();
  int64_t step = r->step, steps = r->o->spec.steps;
  if (step > 0 && !r->t_step0) r->t_step0 = now, r->step0 = step;
  if (!r->tty && !last && now - r->t_line < 5.0) return;
  r->t_line = now;
  char took[32], left[48] = "";
  newt_fmt_duration(now - t0, took, sizeof took);
  if (step > r->step0 && step < steps && now > r->t_step0) {
    char d[32];
    double rate = (double)(step - r->step0) / (now - r->t_step0);
    snprintf(left, sizeof left, r->tty ? ", ETA %s" : ", about %s to go", newt_fmt_duration((double)(steps - step) / rate, d, sizeof d));
  }
  /* etcd away (our watch of it broke, and nothing came since): say so and since when */
  char away[64] = "";
  pthread_mutex_lock(&r->mu);
  uint64_t lost = r->etcd_lost_ms;
  pthread_mutex_unlock(&r->mu);
  if (lost) {
    char d[32];
    uint64_t wall = newt_wall_ms();
    snprintf(away, sizeof away, " | etcd unreachable for %s", newt_fmt_duration(wall > lost ? (double)(wall - lost) / 1e3 : 0, d, sizeof d));
  }
  const char *rec = r->res->nrecoveries == 1 ? "recovery" : "recoveries";
  if (r->tty && step <= 0)
    fprintf(stderr, "\r\033[Kstarting %d workers: waiting for the first step | %s", r->o->nproc, took);
  else if (r->tty)
    fprintf(stderr, "\r\033[Kstep %lld/%lld (%.0f%%) | loss %.4f | %.0f tok/s | world %d (dp %d) | gen %lld | %d %s | %s%s%s",
            (long long)step, (long long)steps, 100.0 * (double)step / (double)steps, r->loss, r->tps, r->world, r->dp,
            (long long)r->gen, r->res->nrecoveries, rec, took, left, away);
  else if (step <= 0)
    fprintf(stderr, "newt run: starting %d workers: no step yet, %s in\n", r->o->nproc, took);
  else
    fprintf(stderr, "newt run: step %lld/%lld (%.0f%%), loss %.4f, %.0f tokens/s, world %d (dp %d), generation %lld, %d %s, %s in%s%s\n",
            (long long)step, (long long)steps, 100.0 * (double)step / (double)steps, r->loss, r->tps, r->world, r->dp,
            (long long)r->gen, r->res->nrecoveries, rec, took, left, away);
  r->line_open = r->tty;
  fflush(stderr);
}

/* Handles the events the watch brought, each first appended to the event log. */
static void take_events(run *r, job_event *evs, int n) {
  for (int i = 0; i < n; i++) {
    if (r->event_log_fd >= 0 && job_eventlog_append(r->event_log_fd, &evs[i]) != NEWT_OK) {
      fprintf(stderr, "newt run: %s: %s (no more events are logged)\n", r->res->event_log, newt_errmsg());
      close(r->event_log_fd);
      r->event_log_fd = -1;
    }
    handle_event(r, &evs[i]);
    job_event_free(&evs[i]);
  }
}

/* The run's files (job/runlog.h), started empty: a log directory used before holds no
 * earlier run's lines. */
static newt_result_t open_run_files(run *r) {
  launcher_result *res = r->res;
  if (r->o->step_log) snprintf(res->step_log, sizeof res->step_log, "%s", r->o->step_log);
  else snprintf(res->step_log, sizeof res->step_log, "%s/steps.jsonl", res->log_dir);
  snprintf(res->event_log, sizeof res->event_log, "%s/events.jsonl", res->log_dir);
  int fd;
  NEWT_CHECK(job_runlog_open(res->step_log, 1, &fd));
  close(fd);
  r->steps_fd = open(res->step_log, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  /* the job's secret, readable by us alone: the plans in etcd carry only salts */
  unsigned char key[32];
  char hex[65];
  snprintf(r->secret_file, sizeof r->secret_file, "%s/job.secret", res->log_dir);
  unlink(r->secret_file);
  NEWT_CHECK(newt_random_bytes(key, sizeof key));
  newt_hex_encode(key, sizeof key, hex);
  fd = open(r->secret_file, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return NEWT_ERR(NEWT_ERR_SYS, "creating %s: %s", r->secret_file, strerror(errno));
  newt_result_t w = newt_fs_write_all(fd, hex, 64, r->secret_file);
  close(fd);
  memset(key, 0, sizeof key);
  memset(hex, 0, sizeof hex);
  NEWT_CHECK(w);
  return job_runlog_open(res->event_log, 1, &r->event_log_fd);
}

static newt_result_t start(run *r) {
  const launcher_opts *o = r->o;
  NEWT_CHECK(newt_proc_self_exe(r->exe, sizeof r->exe));
  if (o->log_dir) {
    snprintf(r->res->log_dir, sizeof r->res->log_dir, "%s", o->log_dir);
    NEWT_CHECK(newt_fs_mkdirs(o->log_dir, 0755));
  } else {
    snprintf(r->res->log_dir, sizeof r->res->log_dir, "/tmp/newt-run-%s-XXXXXX", o->spec.job);
    if (!mkdtemp(r->res->log_dir)) return NEWT_ERR(NEWT_ERR_SYS, "mkdtemp %s: %s", r->res->log_dir, strerror(errno));
  }
  NEWT_CHECK(open_run_files(r));
  if (o->netns) NEWT_CHECK(netns_start(&r->net));
  if (o->etcd) {
    snprintf(r->etcd_url, sizeof r->etcd_url, "%s", o->etcd);
  } else {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/etcd", r->res->log_dir);
    NEWT_CHECK(newt_fs_mkdirs(dir, 0755));
    /* with --netns, on the bridge: the workers' namespaces reach it there (and so do we) */
    rdzv_etcd_server_opts so = {.dir = dir, .members = o->etcd_members, .client_host = r->net ? netns_gateway(r->net) : NULL};
    newt_result_t res = rdzv_etcd_server_start(&so, &r->server);
    if (res != NEWT_OK) return newt_err_wrap(res, "newt run needs etcd (Debian package etcd-server) or --etcd URL: ");
    snprintf(r->etcd_url, sizeof r->etcd_url, "%s", rdzv_etcd_server_url(r->server));
  }
  rdzv_etcd_opts eo = o->etcd ? o->etcd_client : (rdzv_etcd_opts){0};
  eo.endpoints = r->etcd_url;
  NEWT_CHECK(rdzv_etcd_init(&eo, &r->etcd));
  NEWT_CHECK(job_prefix(r->prefix, sizeof r->prefix, o->spec.job, JOB_REC_OTHER, -1));
  /* a job name is used once: refuse to mix with the keys of an earlier run */
  rdzv_etcd_range_opts ro = {.prefix = 1, .count_only = 1};
  rdzv_etcd_kvs existing;
  NEWT_CHECK(rdzv_etcd_range(r->etcd, r->prefix, &ro, newt_deadline_in_ms(5000), &existing));
  int64_t count = existing.count;
  rdzv_etcd_kvs_free(&existing);
  if (count > 0)
    return NEWT_ERR(NEWT_ERR_CONFLICT, "job %s already has keys in etcd at %s: pick another --job", o->spec.job,
                    r->etcd_url);
  /* the first plan waits for the workers started here */
  newt_spec sp = o->spec;
  if (!sp.start_workers) sp.start_workers = o->nproc;
  char *spec = spec_to_json(&sp);
  NEWT_CHECK_ALLOC(spec);
  newt_result_t res = job_spec_put(r->etcd, o->spec.job, spec, newt_deadline_in_ms(5000));
  free(spec);
  NEWT_CHECK(res);
  NEWT_CHECK(job_follow_start(r->etcd, o->spec.job, on_changes, on_health, r, newt_deadline_in_ms(5000), &r->follow));
  for (int i = 0; i < o->coordinators; i++) NEWT_CHECK(spawn(r, PROC_COORD, r->next_coord++));
  for (int i = 0; i < o->nproc; i++) NEWT_CHECK(spawn(r, PROC_WORKER, r->next_worker++));
  if (!o->quiet) {
    fprintf(stderr, "newt run: job %s: %d workers, %d coordinators, etcd %s, logs in %s\n", o->spec.job, o->nproc,
            o->coordinators, r->etcd_url, r->res->log_dir);
    for (int i = 0; i < r->nprocs; i++)
      if (r->procs[i].kind == PROC_COORD && r->procs[i].metrics_port)
        fprintf(stderr, "newt run: %s serves metrics at http://127.0.0.1:%d/metrics (the leader's are the job's)\n",
                r->procs[i].name, r->procs[i].metrics_port);
  }
  return NEWT_OK;
}

/* Ends every process. A job that is over (done, failed) ends by itself, as on Kubernetes:
 * a stopped process is woken, and what is left after 10 s is killed. A run cut short
 * (Ctrl-C, --timeout, an error) tells every process at once (SIGTERM: a worker leaves at
 * its step boundary, and when every rank leaves together none waits to hand its state
 * over; a coordinator resigns) and kills, all at once, what is left after STOP_GRACE_MS:
 * Ctrl-C ends a run within two seconds. Files stay whole either way: a step log line is
 * one write, and a checkpoint is visible only once its manifest is committed. */
#define STOP_GRACE_MS 1000

/* How the run ended (the first call wins). */
static void ended(launcher_result *res, const char *outcome, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void ended(launcher_result *res, const char *outcome, const char *fmt, ...) {
  if (res->outcome[0]) return;
  snprintf(res->outcome, sizeof res->outcome, "%s", outcome);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(res->reason, sizeof res->reason, fmt, ap);
  va_end(ap);
}

static int alive_count(run *r) {
  reap(r);
  int alive = 0;
  for (int i = 0; i < r->nprocs; i++) alive += r->procs[i].alive;
  return alive;
}

static void stop_all(run *r) {
  r->stopping = 1;
  int ending = r->done || r->res->failed[0];
  newt_deadline_t d = newt_deadline_in_ms(ending ? 10000 : STOP_GRACE_MS);
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

newt_result_t launcher_run(const launcher_opts *o, launcher_result *res) {
  memset(res, 0, sizeof *res);
  run *r = calloc(1, sizeof *r);
  NEWT_CHECK_ALLOC(r);
  r->o = o;
  r->res = res;
  r->etcd_fault = -1;
  r->event_log_fd = -1;
  r->steps_fd = -1;
  r->tty = isatty(STDERR_FILENO);
  pthread_mutex_init(&r->mu, NULL);
  double t0 = newt_now_s();
  res->t_start_ms = newt_wall_ms();
  newt_result_t rc = NEWT_OK;
  for (int i = 0; i < o->chaos.n; i++) {
    const chaos_event *e = &o->chaos.events[i];
    char item[64];
    if (e->target == CHAOS_ETCD && o->etcd) {
      rc = NEWT_ERR(NEWT_ERR_INVALID, "--chaos restart:etcd needs the private etcd (leave out --etcd)");
      goto exit;
    }
    if ((e->action == CHAOS_CUT || e->action == CHAOS_CUT_ETCD || e->action == CHAOS_SLOW) && !o->netns) {
      rc = NEWT_ERR(NEWT_ERR_INVALID, "--chaos %s: needs --netns (each host in a network namespace: root)",
                    chaos_event_str(e, item, sizeof item));
      goto exit;
    }
  }
  if (o->netns && o->etcd) {
    rc = NEWT_ERR(NEWT_ERR_INVALID, "--netns runs its own etcd on the namespaces' bridge: leave out --etcd");
    goto exit;
  }
  NEWT_CHECK_GOTO(start(r), rc, exit);
  chaos_plan chaos = o->chaos;
  chaos_event *events = chaos.n ? calloc((size_t)chaos.n, sizeof *events) : NULL;
  if (chaos.n && !events) {
    rc = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
    goto exit;
  }
  if (chaos.n) memcpy(events, chaos.events, (size_t)chaos.n * sizeof *events);
  newt_deadline_t deadline = newt_deadline_in_ms(o->timeout_ms > 0 ? o->timeout_ms : -1);
  double last_line = 0;
  for (;;) {
    follow_steps(r);
    pthread_mutex_lock(&r->mu);
    int nev = r->nevents;
    job_event *evs = r->events;
    r->events = NULL;
    r->nevents = r->cap_events = 0;
    int64_t step = r->step;
    int done = r->done;
    pthread_mutex_unlock(&r->mu);
    take_events(r, evs, nev);
    free(evs);
    if (res->failed[0]) {
      rc = NEWT_ERR(NEWT_ERR_ABORTED, "newt run: the job failed at step %lld: %s; logs in %s", (long long)step,
                    res->failed, res->log_dir);
      ended(res, "failed", "%s", res->failed);
      break;
    }
    if (done) {
      etcd_tick(r); /* an outage the job finished in ends with the end marker reaching etcd */
      break;
    }
    int due = 0, workers_due = 0; /* the plan in force is read once for the faults due together */
    for (int i = 0; i < chaos.n; i++)
      if (!events[i].fired && step >= events[i].step)
        due = 1, workers_due |= events[i].target == CHAOS_WORKER && events[i].action != CHAOS_JOIN;
    newt_plan before, *plan = workers_due ? plan_before_faults(r, &before) : NULL;
    for (int i = 0; due && i < chaos.n; i++)
      if (!events[i].fired && step >= events[i].step) fire(r, &events[i], plan);
    if (plan) plan_free(plan);
    if (r->ncuts) mend_cuts(r, step);
    etcd_tick(r);
    flush_notes(r, 300);
    reap(r);
    if (newt_now_s() - last_line > 0.2) {
      live_line(r, t0, 0);
      last_line = newt_now_s();
    }
    int sig = newt_stop_requested();
    if (sig) {
      ended(res, "interrupted", "interrupted by SIG%s at step %lld", sig == SIGINT ? "INT" : "TERM", (long long)step);
      rc = NEWT_ERR(NEWT_ERR_ABORTED, "newt run: %s; the run's files are in %s", res->reason, res->log_dir);
      break;
    }
    if (newt_deadline_passed(deadline)) {
      ended(res, "timeout", "not done after %lld ms (--timeout), at step %lld", (long long)o->timeout_ms,
            (long long)step);
      rc = NEWT_ERR(NEWT_ERR_TIMEOUT, "newt run: the job was %s; logs in %s", res->reason, res->log_dir);
      break;
    }
    int workers = 0;
    for (int i = 0; i < r->nprocs; i++) workers += r->procs[i].alive && r->procs[i].kind == PROC_WORKER;
    int pending_joins = 0;
    for (int i = 0; i < chaos.n; i++) pending_joins += !events[i].fired && events[i].action == CHAOS_JOIN;
    if (!workers && !pending_joins) {
      /* the watch may lag behind (etcd came back a moment ago): the end marker decides */
      if (read_done(r, newt_deadline_in_ms(10000))) continue;
      ended(res, "exited", "every worker has exited at step %lld, the job not done", (long long)step);
      rc = NEWT_ERR(NEWT_ERR_UNAVAILABLE, "newt run: %s; logs in %s", res->reason, res->log_dir);
      break;
    }
    newt_sleep_ms(5);
  }
  free(events);
  /* the last events (the final recovery, "done") */
  newt_sleep_ms(r->done ? 100 : 0);
  pthread_mutex_lock(&r->mu);
  take_events(r, r->events, r->nevents);
  r->nevents = 0;
  pthread_mutex_unlock(&r->mu);
  flush_notes(r, 2000);
  live_line(r, t0, 1);
  if (!o->quiet && r->line_open) fputs(news(r), stderr);
  res->done = r->done;
  res->steps = r->done ? r->done_step : r->step;
  res->final_loss = r->done ? r->done_loss : r->loss;
  res->samples_consumed = r->done_samples;
  if (r->done) ended(res, "done", "%s", "");
exit:
  if (!res->outcome[0]) ended(res, "error", "%s", newt_errmsg());
  /* what went wrong, kept across the clean-up below (which may fail at things of its own) */
  char why[1024];
  snprintf(why, sizeof why, "%s", rc != NEWT_OK ? newt_errmsg() : "");
  stop_all(r);
  res->wall_s = newt_now_s() - t0;
  measure_outages(r);
  /* what the job leaves in etcd: bounded however long it ran (the leader's housekeeping);
     keys on a lease are not counted, they go within its TTL (a worker that ended while etcd
     was away could not revoke its registration) */
  res->etcd_keys = -1;
  rdzv_etcd_range_opts ko = {.prefix = 1, .keys_only = 1};
  rdzv_etcd_kvs keys;
  char faults[256]; /* our own notes of the faults we injected are not the job's */
  if (r->etcd && job_prefix(faults, sizeof faults, o->spec.job, JOB_REC_FAULT, -1) == NEWT_OK &&
      rdzv_etcd_range(r->etcd, r->prefix, &ko, newt_deadline_in_ms(3000), &keys) == NEWT_OK) {
    res->etcd_keys = 0;
    for (size_t i = 0; i < keys.n; i++)
      res->etcd_keys += keys.kvs[i].lease == 0 &&
                        !(keys.kvs[i].key_len >= strlen(faults) && memcmp(keys.kvs[i].key, faults, strlen(faults)) == 0);
    rdzv_etcd_kvs_free(&keys);
  }
  job_follow_free(r->follow);
  if (r->etcd) rdzv_etcd_free(r->etcd);
  if (r->server) rdzv_etcd_server_free(r->server);
  netns_free(r->net); /* once every process in them has ended */
  free(r->cuts);
  if (r->event_log_fd >= 0) close(r->event_log_fd);
  if (r->steps_fd >= 0) close(r->steps_fd);
  for (int i = 0; i < r->nevents; i++) job_event_free(&r->events[i]);
  free(r->events);
  free(r->procs);
  for (int i = 0; i < r->nfaults; i++) free(r->faults[i].back);
  free(r->faults);
  free(r->notes);
  pthread_mutex_destroy(&r->mu);
  free(r);
  return rc == NEWT_OK ? NEWT_OK : NEWT_ERR(rc, "%s", why);
}
