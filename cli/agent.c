/* The node agent (see agent.h): one loop that polls every 50 ms; it reaps with
 * waitpid(-1) (children and adopted orphans alike), forwards a stop signal once, starts
 * the children whose restart time has come, and kills the ones the health thread found
 * unhealthy too often. Each child writes its termination message to a file in a private
 * directory, which the agent reads when the child ends.
 *
 * The health thread probes each running child's /healthz in turn (a probe can take its
 * 3 s timeout, which the main loop must not wait for); it records, per child and under a
 * lock, the pid it probed and how many probes in a row failed. Only the main loop, which
 * reaps, signals a child: the pid it kills is one it has not reaped.
 *
 * The lease thread holds the host's lease: it waits for the job's spec (the lease's TTL is
 * the workers'), grants and keeps the lease, writes its id to the lease file the children
 * read, and grants a new one when the keep-alive reports it lost. The main loop deletes the
 * registration of a child that ended or stayed stopped past the TTL (job_registration_forget:
 * a transaction guarded by the host's lease, so only while the key is on it). */
#include "cli/agent.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/ending.h"
#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/proc.h"
#include "common/sys.h"
#include "job/records.h"
#include "job/spec.h"
#include "job/store.h"
#include "rendezvous/batch.h"
#include "rendezvous/gateway.h"
#include "rendezvous/rdzv.h"

#define AGENT_BACKOFF_FIRST_MS 500
#define AGENT_BACKOFF_MAX_MS 30000
#define AGENT_HEALTH_TIMEOUT_MS 3000
/* How long the host gateway's first transaction waits for the other children's (batch.h). */
#define AGENT_GATEWAY_LINGER_MS 10

typedef struct child {
  char id[96];
  char device[16], port[16], metrics_port[16];
  char local_rank[32], local_world[32]; /* its LOCAL_RANK=i and LOCAL_WORLD_SIZE=n */
  char end_path[640];
  pid_t pid;              /* 0: not running */
  uint64_t started_ms;    /* monotonic */
  uint64_t restart_at_ms; /* a restart is due then (0: none) */
  uint64_t *restarts;     /* monotonic ms of its restarts, the last max_restarts + 1 */
  int nrestarts;          /* restarts in all */
  int code;               /* JOB_EXIT_* of its last end (-1: running or never ended) */
  char msg[512];          /* its last termination message */
  /* health, under agent.health_mu: the pid the health thread probes (set by the main loop
     at a start, 0 when it ended), failed probes of it in a row and the last one's reason */
  pid_t probe_pid;
  int fails;
  char why[256];
  char killed[320];       /* why the agent killed it (main loop only; "" when it did not) */
  /* its registration on the host's lease (main loop only) */
  int forget_pending;     /* it ended: its registration is to be deleted before it restarts */
  uint64_t forget_at_ms;  /* next try (monotonic) */
  uint64_t stopped_ms;    /* monotonic ms it was first seen stopped (0: running) */
  int stopped_forgot;     /* its registration was deleted while it stayed stopped */
} child;

typedef struct agent {
  const cli_agent_opts *o;
  child *kids;
  char exe[1024];
  char dir[512];          /* the children's termination logs */
  int stop_sig;           /* the signal forwarded (0: none yet) */
  int giving_up;          /* the others were asked to leave: a bad flag or a spent budget */
  int done, failed, usage, spent; /* how children ended: 0, 4, 2, budget spent (index + 1) */
  char probe_host[64];    /* where the children's /healthz answer */
  pthread_mutex_t health_mu;
  pthread_cond_t health_cv;
  int health_stop;
  /* the host's lease */
  rdzv_etcd *etcd;        /* NULL: no host lease */
  char lease_env[700];    /* NEWT_HOST_LEASE_FILE=<dir>/host-lease */
  rdzv_batch *batch;      /* the children's transactions on the host's lease, in one */
  rdzv_gateway *gateway;  /* ... served to them at <dir>/gw (NULL: none, they write themselves) */
  char gateway_env[700];  /* NEWT_HOST_GATEWAY=<dir>/gw */
  pthread_t lease_thread;
  _Atomic int64_t lease;  /* the lease the children find in the file (0: none yet) */
  _Atomic int64_t ttl_ms;
  atomic_int lease_lost, lease_stop;
} agent;

static uint64_t now_ms(void) { return newt_now_ns() / 1000000; }

static int is_own_flag(const char *arg) {
  static const char *const own[] = {CLI_AGENT_OWN_FLAGS};
  if (strncmp(arg, "--", 2) != 0) return 0;
  const char *name = arg + 2, *eq = strchr(name, '=');
  size_t n = eq ? (size_t)(eq - name) : strlen(name);
  for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
    if (strlen(own[i]) == n && strncmp(own[i], name, n) == 0) return eq ? 1 : 2; /* args it takes */
  return 0;
}

/* ---- health ---------------------------------------------------------------------------- */

typedef struct probe_body {
  char buf[200];
  size_t n;
} probe_body;

static size_t probe_write(char *p, size_t size, size_t nmemb, void *ud) {
  probe_body *b = ud;
  size_t k = size * nmemb, room = sizeof b->buf - 1 - b->n, c = k < room ? k : room;
  memcpy(b->buf + b->n, p, c);
  b->n += c;
  b->buf[b->n] = '\0';
  return k;
}

/* One GET of a child's /healthz: 1 healthy, 0 unhealthy or silent (why says which), -1
 * nothing listens there (starting, or gone). */
static int probe(const char *host, const char *port, char *why, size_t cap) {
  CURL *h = curl_easy_init();
  if (!h) return -1;
  char url[128];
  snprintf(url, sizeof url, "http://%s:%s/healthz", host, port);
  probe_body b = {.n = 0};
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_NOPROXY, "*"); /* a proxy from the environment is not the way to a local port */
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)AGENT_HEALTH_TIMEOUT_MS);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, probe_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
  CURLcode e = curl_easy_perform(h);
  long code = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(h);
  if (e == CURLE_COULDNT_CONNECT) return -1;
  if (e == CURLE_OK && code == 200) return 1;
  while (b.n > 0 && (b.buf[b.n - 1] == '\n' || b.buf[b.n - 1] == '\r')) b.buf[--b.n] = '\0';
  if (e == CURLE_OPERATION_TIMEDOUT) snprintf(why, cap, "no answer from %s within %d ms", url, AGENT_HEALTH_TIMEOUT_MS);
  else if (e != CURLE_OK) snprintf(why, cap, "%s: %s", url, curl_easy_strerror(e));
  else snprintf(why, cap, "%s: HTTP %ld: %.96s", url, code, b.buf);
  return 0;
}

static void *health_main(void *arg) {
  agent *a = arg;
  pthread_mutex_lock(&a->health_mu);
  while (!a->health_stop) {
    for (int i = 0; i < a->o->n && !a->health_stop; i++) {
      child *c = &a->kids[i];
      pid_t pid = c->probe_pid;
      if (!pid) continue;
      pthread_mutex_unlock(&a->health_mu);
      char why[256] = "";
      int ok = probe(a->probe_host, c->metrics_port, why, sizeof why);
      pthread_mutex_lock(&a->health_mu);
      if (c->probe_pid != pid) continue; /* it ended meanwhile */
      if (ok != 0) {
        c->fails = 0;
        continue;
      }
      c->fails++;
      snprintf(c->why, sizeof c->why, "%s", why);
      NEWT_WARN(CLI, "local worker %s (pid %d) failed health probe %d of %d: %s", c->id, (int)pid, c->fails,
                AGENT_HEALTH_FAILS, why);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)a->o->health_every_ms * 1000000ull;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    if (!a->health_stop) pthread_cond_timedwait(&a->health_cv, &a->health_mu, &ts);
  }
  pthread_mutex_unlock(&a->health_mu);
  return NULL;
}

/* Kills the children that failed AGENT_HEALTH_FAILS probes in a row (not once the agent is
 * stopping: they are leaving anyway). */
static void kill_unhealthy(agent *a) {
  if (a->stop_sig || a->giving_up) return;
  pthread_mutex_lock(&a->health_mu);
  for (int i = 0; i < a->o->n; i++) {
    child *c = &a->kids[i];
    if (c->pid <= 0 || c->probe_pid != c->pid || c->fails < AGENT_HEALTH_FAILS) continue;
    NEWT_ERROR(CLI, "local worker %s (pid %d) failed %d health probes in a row (%s): killing it, it restarts", c->id,
               (int)c->pid, c->fails, c->why);
    snprintf(c->killed, sizeof c->killed, "unhealthy: %s", c->why);
    kill(c->pid, SIGKILL);
    c->probe_pid = 0; /* no more probes of it: it is gone once reaped */
  }
  pthread_mutex_unlock(&a->health_mu);
}

/* Where the children's metrics answer: 127.0.0.1 when they bind it, else their first address. */
static void probe_host_of(const char *addrs, char *out, size_t cap) {
  snprintf(out, cap, "127.0.0.1");
  if (!addrs || !*addrs || strstr(addrs, "127.0.0.1")) return;
  size_t n = strcspn(addrs, ",");
  if (n < cap && !(n == 7 && strncmp(addrs, "0.0.0.0", 7) == 0)) snprintf(out, cap, "%.*s", (int)n, addrs);
}

static void set_probe_pid(agent *a, child *c, pid_t pid) {
  pthread_mutex_lock(&a->health_mu);
  c->probe_pid = pid;
  c->fails = 0;
  pthread_mutex_unlock(&a->health_mu);
}

/* ---- the host's lease ------------------------------------------------------------------------ */

static void on_host_lease_lost(void *ud, int64_t lease, const char *why) {
  agent *a = ud;
  NEWT_WARN(CLI, "host lease %llx lost (%s): the local workers go on with leases of their own", (unsigned long long)lease,
            why);
  atomic_store(&a->lease_lost, 1);
}

/* Sleeps ms in slices, returning early when the agent stops. */
static void lease_nap(agent *a, int ms) {
  for (int t = 0; t < ms && !atomic_load(&a->lease_stop); t += 50) newt_sleep_ms(50);
}

static void *lease_main(void *arg) {
  agent *a = arg;
  const char *path = a->lease_env + strlen("NEWT_HOST_LEASE_FILE=");
  int64_t ttl_s = 0;
  while (!atomic_load(&a->lease_stop)) {
    if (!ttl_s) { /* the spec says the workers' lease TTL: the host's is the same */
      char *text = NULL;
      newt_spec spec;
      if (job_spec_get(a->etcd, a->o->job, newt_deadline_in_ms(2000), &text) == NEWT_OK &&
          spec_from_json(text, strlen(text), &spec) == NEWT_OK)
        ttl_s = (spec.lease_ttl_ms + 999) / 1000;
      free(text);
      if (!ttl_s) lease_nap(a, 200);
      continue;
    }
    int64_t cur = atomic_load(&a->lease);
    if (cur && !atomic_load(&a->lease_lost)) {
      lease_nap(a, 100);
      continue;
    }
    if (cur) { /* lost: the children fall back to their own; a new one for later starts */
      unlink(path);
      atomic_store(&a->lease, 0);
      rdzv_etcd_lease_unkeep(a->etcd, cur);
    }
    atomic_store(&a->lease_lost, 0);
    int64_t lease = 0;
    if (rdzv_etcd_lease_grant(a->etcd, ttl_s, 0, newt_deadline_in_ms(2000), &lease, NULL) != NEWT_OK) {
      lease_nap(a, 500);
      continue;
    }
    char text[32];
    int n = snprintf(text, sizeof text, "%lld\n", (long long)lease);
    if (rdzv_etcd_lease_keep(a->etcd, lease, ttl_s, on_host_lease_lost, a) != NEWT_OK ||
        newt_fs_write_atomic(path, text, (size_t)n) != NEWT_OK) {
      NEWT_WARN(CLI, "host lease: %s", newt_errmsg());
      rdzv_etcd_lease_unkeep(a->etcd, lease);
      rdzv_etcd_lease_revoke(a->etcd, lease, newt_deadline_in_ms(1000));
      lease_nap(a, 500);
      continue;
    }
    atomic_store(&a->ttl_ms, ttl_s * 1000);
    atomic_store(&a->lease, lease);
    NEWT_INFO(CLI, "host lease %llx (TTL %lld s): the local workers register on it", (unsigned long long)lease,
              (long long)ttl_s);
  }
  return NULL;
}

/* The host's gateway (rendezvous/gateway.h): the children's registrations and the rewrites
 * that acknowledge a generation, on the host's lease, go to etcd together, the first waiting
 * up to AGENT_GATEWAY_LINGER_MS for the others. Without it each child writes its own. */
static void gateway_start(agent *a) {
  char path[600];
  snprintf(path, sizeof path, "%s/gw", a->dir);
  rdzv_batch_opts bo = {.expect = a->o->n, .linger_ms = AGENT_GATEWAY_LINGER_MS};
  if (a->o->n < 2) return; /* one worker: nothing to gather */
  if (rdzv_batch_new(a->etcd, &bo, &a->batch) != NEWT_OK || rdzv_gateway_start(a->batch, path, &a->gateway) != NEWT_OK) {
    NEWT_WARN(CLI, "no host gateway (%s): each local worker writes its registration itself", newt_errmsg());
    rdzv_batch_free(a->batch);
    a->batch = NULL;
    a->gateway = NULL;
    return;
  }
  /* and the plan's watch, one for the host (its workers would each hold one) */
  char key[256];
  if (job_key(key, sizeof key, a->o->job, JOB_REC_PLAN, 0, NULL) != NEWT_OK ||
      rdzv_gateway_share(a->gateway, a->etcd, key) != NEWT_OK)
    NEWT_WARN(CLI, "host gateway: the plan's watch is not shared (%s): each local worker watches it", newt_errmsg());
  snprintf(a->gateway_env, sizeof a->gateway_env, "NEWT_HOST_GATEWAY=%s", path);
}

/* Starts the lease thread when the agent has etcd options (a client of its own). */
static void lease_start(agent *a) {
  if (!a->o->etcd || !a->o->job) return;
  if (rdzv_etcd_init(a->o->etcd, &a->etcd) != NEWT_OK) {
    NEWT_WARN(CLI, "no host lease (%s): the local workers register on leases of their own", newt_errmsg());
    a->etcd = NULL;
    return;
  }
  snprintf(a->lease_env, sizeof a->lease_env, "NEWT_HOST_LEASE_FILE=%s/host-lease", a->dir);
  if (pthread_create(&a->lease_thread, NULL, lease_main, a) != 0) {
    NEWT_WARN(CLI, "no host lease (cannot start its thread): the local workers register on leases of their own");
    rdzv_etcd_free(a->etcd);
    a->etcd = NULL;
    a->lease_env[0] = '\0';
    return;
  }
  gateway_start(a);
}

/* Stops the lease thread and revokes the lease: every child has ended. */
static void lease_end(agent *a) {
  if (!a->etcd) return;
  if (a->batch) {
    int64_t posted = 0, sent = 0, subs = 0, watches = 0;
    rdzv_batch_counts(a->batch, &posted, &sent);
    rdzv_gateway_share_counts(a->gateway, &subs, &watches);
    NEWT_INFO(CLI, "host gateway: the local workers' %lld transactions went to etcd in %lld writes; their %lld plan "
              "watches were %lld of etcd's", (long long)posted, (long long)sent, (long long)subs, (long long)watches);
  }
  rdzv_gateway_stop(a->gateway); /* every child has ended */
  rdzv_batch_free(a->batch);
  a->gateway = NULL;
  a->batch = NULL;
  atomic_store(&a->lease_stop, 1);
  pthread_join(a->lease_thread, NULL);
  int64_t lease = atomic_load(&a->lease);
  if (lease) {
    rdzv_etcd_lease_unkeep(a->etcd, lease);
    newt_result_t r = rdzv_etcd_lease_revoke(a->etcd, lease, newt_deadline_in_ms(2000));
    if (r != NEWT_OK && r != NEWT_ERR_NOTFOUND) NEWT_WARN(CLI, "revoking the host lease: %s", newt_errmsg());
  }
  rdzv_etcd_free(a->etcd);
  a->etcd = NULL;
}

/* Deletes child c's registration while it is on the host's lease (what its own lease's end
 * would have done): 0 done or nothing to do, -1 etcd did not answer (try again). */
static int forget(agent *a, const child *c) {
  int64_t lease = atomic_load(&a->lease);
  int deleted;
  if (!a->etcd || !lease) return 0;
  if (job_registration_forget(a->etcd, a->o->job, c->id, lease, newt_deadline_in_ms(1000), &deleted) != NEWT_OK) {
    NEWT_WARN(CLI, "deleting the registration of local worker %s: %s (trying again)", c->id, newt_errmsg());
    return -1;
  }
  if (deleted) NEWT_INFO(CLI, "local worker %s: its registration on the host lease deleted", c->id);
  return 0;
}

/* The registrations of children that ended, and of those stopped past the lease TTL. */
static void forget_due(agent *a) {
  if (!a->etcd) return;
  uint64_t now = now_ms(), ttl = (uint64_t)atomic_load(&a->ttl_ms);
  for (int i = 0; i < a->o->n; i++) {
    child *c = &a->kids[i];
    if (c->forget_pending && now >= c->forget_at_ms) {
      if (forget(a, c) == 0) c->forget_pending = 0;
      else c->forget_at_ms = now + 500;
    }
    if (c->pid <= 0) continue;
    char path[64], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)c->pid);
    int stopped = 0;
    if (newt_fs_read_all(path, 4096, &text, &len) == NEWT_OK) {
      const char *close = text ? strrchr(text, ')') : NULL; /* "pid (comm) S ..." */
      stopped = close && close[1] == ' ' && (close[2] == 'T' || close[2] == 't');
    }
    free(text);
    if (!stopped) {
      c->stopped_ms = 0, c->stopped_forgot = 0;
    } else if (!c->stopped_ms) {
      c->stopped_ms = now;
    } else if (!c->stopped_forgot && ttl && now - c->stopped_ms > ttl) {
      NEWT_WARN(CLI, "local worker %s (pid %d) stopped for more than the lease TTL (%llu ms): its registration goes, "
                "as its own lease would have", c->id, (int)c->pid, (unsigned long long)ttl);
      if (forget(a, c) == 0) c->stopped_forgot = 1;
    }
  }
}

/* ---- children ------------------------------------------------------------------------------ */

static newt_result_t start(agent *a, int i) {
  const cli_agent_opts *o = a->o;
  child *c = &a->kids[i];
  size_t words = 0;
  while (o->command && o->command[words]) words++;
  const char **argv = calloc((size_t)o->argc + 16 + words, sizeof *argv);
  NEWT_CHECK_ALLOC(argv);
  int n = 0;
  argv[n++] = a->exe;
  argv[n++] = "worker";
  for (int k = 0; k < o->argc; k++) {
    int skip = is_own_flag(o->argv[k]);
    if (skip) k += skip - 1;
    else argv[n++] = o->argv[k];
  }
  const char *mine[][2] = {{"--id", c->id}, {"--device", c->device}, {"--port", c->port},
                           {"--metrics-port", c->metrics_port}, {"--termination-log", c->end_path}};
  for (size_t k = 0; k < sizeof mine / sizeof mine[0]; k++) argv[n++] = mine[k][0], argv[n++] = mine[k][1];
  if (o->command) argv[n++] = "--"; /* the program and its arguments last, as given */
  for (size_t k = 0; k < words; k++) argv[n++] = o->command[k];
  argv[n] = NULL;
  unlink(c->end_path);
  /* a session of its own: a terminal's ^C reaches the agent only, which forwards it once */
  const char *env[] = {c->local_rank, c->local_world, a->lease_env[0] ? a->lease_env : NULL,
                       a->gateway_env[0] ? a->gateway_env : NULL, NULL};
  newt_spawn_opts so = {.env = env, .new_session = 1, .die_with_parent = 1};
  newt_result_t r = newt_proc_spawn(argv, &so, &c->pid);
  free(argv);
  if (r != NEWT_OK) {
    c->pid = 0;
    return r;
  }
  c->started_ms = now_ms();
  c->stopped_ms = 0, c->stopped_forgot = 0;
  c->code = -1;
  c->killed[0] = '\0';
  set_probe_pid(a, c, c->pid);
  NEWT_INFO(CLI, "local worker %s started (pid %d, device %s, metrics port %s)", c->id, (int)c->pid, c->device,
            c->metrics_port);
  return NEWT_OK;
}

/* Restarts of c within the window. */
static int recent_restarts(const agent *a, const child *c, uint64_t now) {
  int k = 0, keep = a->o->max_restarts + 1;
  for (int j = 0; j < c->nrestarts && j < keep; j++)
    if (now - c->restarts[j] <= (uint64_t)a->o->restart_window_ms) k++;
  return k;
}

static void ask_all_to_leave(agent *a, int sig) {
  for (int i = 0; i < a->o->n; i++) {
    child *c = &a->kids[i];
    c->restart_at_ms = 0;
    if (c->pid > 0) kill(c->pid, sig);
  }
}

/* Child i ended with waitpid status st: what it means, and whether it starts again. */
static void ended(agent *a, int i, int st) {
  child *c = &a->kids[i];
  char how[64], *text = NULL;
  size_t len = 0;
  newt_proc_status_str(st, how, sizeof how);
  pid_t pid = c->pid;
  c->pid = 0;
  set_probe_pid(a, c, 0);
  c->msg[0] = '\0';
  if (newt_fs_read_all(c->end_path, sizeof c->msg - 1, &text, &len) == NEWT_OK) {
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r')) len--;
    snprintf(c->msg, sizeof c->msg, "%.*s", (int)len, text);
  }
  free(text);
  int code = WIFEXITED(st) ? WEXITSTATUS(st) : JOB_EXIT_ERROR;
  c->code = code;
  /* gone now, not when a lease would run out: on the host's lease nothing else removes it */
  c->forget_pending = a->etcd != NULL;
  c->forget_at_ms = 0;
  if (c->forget_pending && forget(a, c) == 0) c->forget_pending = 0;
  if (!c->msg[0] && c->killed[0]) snprintf(c->msg, sizeof c->msg, "error: killed by the node agent: %s", c->killed);
  if (!c->msg[0]) snprintf(c->msg, sizeof c->msg, "error: %s", how);
  NEWT_INFO(CLI, "local worker %s (pid %d) ended (%s) after %.1f s: %s", c->id, (int)pid, how,
            (double)(now_ms() - c->started_ms) / 1000.0, c->msg);
  if (code == JOB_EXIT_DONE || code == JOB_EXIT_LEFT_OUT) a->done = 1; /* left out: the job is done without it */
  if (code == JOB_EXIT_FAILED) a->failed = i + 1;
  if (code == JOB_EXIT_USAGE && !a->usage) {
    a->usage = i + 1;
    if (!a->giving_up) {
      a->giving_up = 1;
      NEWT_ERROR(CLI, "local worker %s refused its flags or the spec: the others leave", c->id);
      ask_all_to_leave(a, SIGTERM);
    }
  }
  /* a crash (a signal, exit 1 or any other status) or a leave nobody asked for */
  int crashed = code != JOB_EXIT_DONE && code != JOB_EXIT_FAILED && code != JOB_EXIT_USAGE && code != JOB_EXIT_LEFT_OUT;
  if (!crashed || a->stop_sig || a->giving_up || a->done || a->failed) return;
  uint64_t now = now_ms();
  int recent = recent_restarts(a, c, now);
  if (recent >= a->o->max_restarts) {
    a->spent = i + 1;
    a->giving_up = 1;
    NEWT_ERROR(CLI, "local worker %s ended (%s) after %d restarts within %lld s: its restart budget is spent, the "
               "others leave", c->id, how, recent, (long long)(a->o->restart_window_ms / 1000));
    snprintf(c->msg, sizeof c->msg, "error: local worker %s crashed (%s) after %d restarts within %lld s (--max-restarts)",
             c->id, how, recent, (long long)(a->o->restart_window_ms / 1000));
    ask_all_to_leave(a, SIGTERM);
    return;
  }
  int64_t delay = AGENT_BACKOFF_FIRST_MS;
  for (int k = 0; k < recent && delay < AGENT_BACKOFF_MAX_MS; k++) delay *= 2;
  if (delay > AGENT_BACKOFF_MAX_MS) delay = AGENT_BACKOFF_MAX_MS;
  c->restart_at_ms = now + (uint64_t)delay;
  NEWT_INFO(CLI, "restarting local worker %s in %.1f s (restart %d of %d within %lld s)", c->id, (double)delay / 1000.0,
            recent + 1, a->o->max_restarts, (long long)(a->o->restart_window_ms / 1000));
}

/* Reaps whatever ended: our children, and orphans handed to us. */
static void reap(agent *a) {
  for (;;) {
    int st = 0;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid <= 0) return;
    int i = 0;
    while (i < a->o->n && a->kids[i].pid != pid) i++;
    if (i < a->o->n) ended(a, i, st);
    else NEWT_DEBUG(CLI, "reaped process %d (not a local worker)", (int)pid);
  }
}

static void start_due(agent *a) {
  uint64_t now = now_ms();
  for (int i = 0; i < a->o->n; i++) {
    child *c = &a->kids[i];
    if (!c->restart_at_ms || now < c->restart_at_ms) continue;
    if (c->forget_pending) continue; /* its old registration first (forget_due) */
    c->restart_at_ms = 0;
    if (a->done || a->failed) continue; /* the job ended meanwhile: nothing to rejoin */
    int keep = a->o->max_restarts + 1;
    memmove(c->restarts + 1, c->restarts, (size_t)(keep - 1) * sizeof *c->restarts);
    c->restarts[0] = now;
    c->nrestarts++;
    NEWT_INFO(CLI, "local worker %s: restart %d", c->id, c->nrestarts);
    if (start(a, i) != NEWT_OK) {
      NEWT_ERROR(CLI, "restarting local worker %s: %s", c->id, newt_errmsg());
      ended(a, i, JOB_EXIT_ERROR << 8); /* counts as a crash: retried within the budget */
    }
  }
}

static int running(const agent *a) {
  for (int i = 0; i < a->o->n; i++)
    if (a->kids[i].pid > 0 || a->kids[i].restart_at_ms) return 1;
  return 0;
}

/* The exit status and message once every child has ended (see agent.h). */
static void decide(agent *a, job_end *e) {
  int who = a->failed ? a->failed : a->usage ? a->usage : a->spent ? a->spent : 0;
  if (who) {
    e->status = a->failed ? JOB_EXIT_FAILED : a->usage ? JOB_EXIT_USAGE : JOB_EXIT_ERROR;
  } else {
    int want = a->done ? JOB_EXIT_DONE : a->stop_sig ? JOB_EXIT_LEFT : JOB_EXIT_ERROR;
    e->status = want;
    for (int i = 0; i < a->o->n && !who; i++)
      if (a->kids[i].code == want) who = i + 1;
    for (int i = 0; i < a->o->n && !who && a->done; i++) /* every one that trained was left out */
      if (a->kids[i].code == JOB_EXIT_LEFT_OUT) who = i + 1, e->status = JOB_EXIT_LEFT_OUT;
  }
  if (!who) { /* no child ended as the agent did (e.g. none ever started) */
    snprintf(e->msg, sizeof e->msg, "%s: %d local workers ended", e->status == JOB_EXIT_LEFT ? "left" : "error", a->o->n);
    return;
  }
  const child *c = &a->kids[who - 1];
  snprintf(e->msg, sizeof e->msg, "%s (local worker %s of %d)", c->msg, c->id, a->o->n);
}

int cli_agent_run(const cli_agent_opts *o) {
  agent a = {.o = o};
  job_end end = {.status = JOB_EXIT_ERROR};
  pthread_mutex_init(&a.health_mu, NULL);
  pthread_cond_init(&a.health_cv, NULL);
  probe_host_of(o->metrics_addr, a.probe_host, sizeof a.probe_host);
  pthread_t health;
  int have_health = 0;
  newt_result_t r = newt_proc_self_exe(a.exe, sizeof a.exe);
  const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(a.dir, sizeof a.dir, "%s/newt-agent-XXXXXX", tmp);
  int have_dir = r == NEWT_OK && mkdtemp(a.dir) != NULL;
  if (r == NEWT_OK && !have_dir)
    r = NEWT_ERR(NEWT_ERR_SYS, "cannot make a directory for the local workers' termination logs in %s: %s", tmp,
                 strerror(errno));
  a.kids = calloc((size_t)o->n, sizeof *a.kids);
  if (r == NEWT_OK && !a.kids) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for %d local workers", o->n);
  for (int i = 0; r == NEWT_OK && i < o->n; i++) {
    child *c = &a.kids[i];
    c->code = -1;
    c->restarts = calloc((size_t)o->max_restarts + 1, sizeof *c->restarts);
    if (!c->restarts) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for %d local workers", o->n);
    snprintf(c->id, sizeof c->id, "%s-%d", o->id, i);
    snprintf(c->device, sizeof c->device, "%d", o->device + i);
    snprintf(c->port, sizeof c->port, "%d", o->port > 0 ? o->port + i : 0);
    snprintf(c->metrics_port, sizeof c->metrics_port, "%d", o->metrics_port > 0 ? o->metrics_port + i : 0);
    snprintf(c->end_path, sizeof c->end_path, "%s/%s.end", a.dir, c->id);
    snprintf(c->local_rank, sizeof c->local_rank, "LOCAL_RANK=%d", i);
    snprintf(c->local_world, sizeof c->local_world, "LOCAL_WORLD_SIZE=%d", o->n);
  }
  newt_log_set_name(o->id);
  /* orphans of our children come to us, as they would to PID 1 */
  if (r == NEWT_OK && getpid() != 1 && prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
    NEWT_WARN(CLI, "cannot become a subreaper (%s): orphans of local workers go to init", strerror(errno));
  if (r == NEWT_OK)
    NEWT_INFO(CLI, "node agent %s: %d local workers, at most %d restarts each within %lld s", o->id, o->n,
              o->max_restarts, (long long)(o->restart_window_ms / 1000));
  if (r == NEWT_OK) lease_start(&a);
  for (int i = 0; r == NEWT_OK && i < o->n; i++) {
    r = start(&a, i);
    if (r != NEWT_OK) ask_all_to_leave(&a, SIGTERM);
  }
  if (r == NEWT_OK && o->health_every_ms > 0 && o->metrics_port > 0) {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK && pthread_create(&health, NULL, health_main, &a) == 0)
      have_health = 1;
    else
      NEWT_WARN(CLI, "cannot start the health probes of the local workers: a hung one keeps its GPU until it is "
                "stopped");
  }
  if (r != NEWT_OK) { /* the ones started leave; then the error is the agent's */
    while (running(&a)) reap(&a), newt_sleep_ms(50);
  } else {
    while (running(&a)) {
      int sig = newt_stop_requested();
      if (sig && !a.stop_sig) {
        a.stop_sig = sig;
        NEWT_INFO(CLI, "signal %d: the local workers leave", sig);
        ask_all_to_leave(&a, sig);
      }
      reap(&a);
      kill_unhealthy(&a);
      forget_due(&a);
      if (!a.stop_sig) start_due(&a);
      newt_sleep_ms(50);
    }
    reap(&a); /* orphans that ended last */
    decide(&a, &end);
  }
  if (have_health) {
    pthread_mutex_lock(&a.health_mu);
    a.health_stop = 1;
    pthread_cond_broadcast(&a.health_cv);
    pthread_mutex_unlock(&a.health_mu);
    pthread_join(health, NULL);
  }
  lease_end(&a);
  if (have_dir) newt_fs_rm_rf(a.dir);
  for (int i = 0; a.kids && i < o->n; i++) free(a.kids[i].restarts);
  free(a.kids);
  NEWT_INFO(CLI, "node agent %s: every local worker ended; exit %d", o->id, r == NEWT_OK ? end.status : JOB_EXIT_ERROR);
  return cli_end("worker", r, &end, o->term_log);
}
