/* What Kubernetes sees of newt's processes, tested with real processes (a real etcd, `newt
 * coordinator` and `newt worker` as the chart runs them, real signals):
 *
 *   ends    exit statuses and termination messages: a worker sent SIGTERM leaves (3,
 *           "left: ..."), a standby sent SIGTERM leaves (3), the rest end with the job (0,
 *           "done: ..."); the metrics of the leader, a standby and a worker pass `promtool
 *           check metrics`, a standby hides the job's metrics, every series of a worker
 *           carries worker= and rank=, the leader serves newt_job_done 1 after the end
 *           (--metrics-linger-ms) until SIGTERM, /healthz answers; a changed
 *           spec file is taken at a step boundary when only ckpt.every changed and refused,
 *           naming the field, when train.steps changed, and the job goes on.
 *   budget  the failure budget: spec.fault.max_failures 1, two workers killed with kill -9:
 *           the second failure ends the job: the coordinator and the surviving worker exit 4
 *           with "failed: failure budget spent ..." (the leader once its lingering metrics
 *           said newt_job_failed 1; a standby lingers too), `newt status` and the events
 *           say so.
 *   agent   the node agent (`newt worker --local-workers 2`, cli/agent.h) as the chart's GPU
 *           mode runs it: both local workers train and serve /healthz and metrics (worker=,
 *           rank= on every series) on metrics port + i;
 *           both register on the agent's host lease; one of them killed with kill -9 has its
 *           registration deleted by the agent (the other's stays), is restarted under its id
 *           on the host lease and rejoins (a "join" plan, the job back to 2 ranks); one
 *           stopped has its registration deleted once it stayed stopped past the lease TTL; SIGTERM to the agent: it exits 3 ("left: ")
 *           within 30 s and leaves no worker behind.
 *   agent_done  a job that ends under an agent: it exits 0 ("done: ") and restarts nothing.
 *   agent_budget  --max-restarts 0: a local worker killed with kill -9 is not restarted, the
 *           other leaves, the agent exits 1 naming the worker and the flag.
 *   agent_usage  a flag the workers refuse (--addr): the agent exits 2 with their message,
 *           restarting nothing.
 *   agent_pid1  the agent as PID 1 of a PID namespace (unshare, as in a container; skipped
 *           where that needs a root it lacks): SIGTERM reaches it, both workers leave, it
 *           exits 3.
 *
 * Usage: test_k8s ends|budget|agent|agent_done|agent_budget|agent_usage|agent_pid1 (ctest runs each as k8s_<name>). */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/proc.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "job/records.h"
#include "job/store.h"
#include "rendezvous/etcd_server.h"
#include "rendezvous/rdzv.h"
#include "test.h"

static const char *bin(void) { return getenv("NEWT_BIN") ? getenv("NEWT_BIN") : "newt"; }

typedef struct proc {
  pid_t pid;
  char end[512]; /* its termination log */
  int port;      /* its metrics port (0: none) */
} proc;

static char dir[256];
static rdzv_etcd_server *srv;
static rdzv_etcd *cli;

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/newt-k8s-XXXXXX");
  T_CHECK(mkdtemp(dir) != NULL);
  rdzv_etcd_server_opts so = {0};
  T_OK(rdzv_etcd_server_start(&so, &srv));
  rdzv_etcd_opts eo = {.endpoints = rdzv_etcd_server_url(srv)};
  T_OK(rdzv_etcd_init(&eo, &cli));
}

static void write_spec(const char *path, const char *job, int steps, int gb, int every, int max_failures) {
  char text[512];
  int n = snprintf(text, sizeof text,
                   "{\"job\":\"%s\",\"train\":{\"steps\":%d,\"global_batch\":%d,\"micro_batch\":2},"
                   "\"parallel\":{\"dp_min\":1,\"dp_max\":4,\"start_workers\":%d},\"ckpt\":{\"dir\":\"%s/ck\",\"every\":%d},"
                   "\"fault\":{\"max_failures\":%d,\"failure_window_ms\":600000}}",
                   job, steps, gb, 0, dir, every, max_failures);
  T_OK(newt_fs_write_atomic(path, text, (size_t)n));
}

/* 1 when nothing listens on 127.0.0.1:port. */
static int port_free(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

/* A process with more arguments (extra: NULL-terminated, may be NULL), started through the
 * command wrap (NULL-terminated, may be NULL: e.g. unshare); its metrics port and the one
 * after it are free (an agent's second worker serves on port + 1). */
static void spawn_x(proc *p, const char *kind, const char *name, const char *job, const char *spec,
                    const char *const *extra, const char *const *wrap) {
  char log[600], port[16];
  snprintf(log, sizeof log, "%s/%s.log", dir, name);
  snprintf(p->end, sizeof p->end, "%s/%s.end", dir, name);
  /* below the kernel's ephemeral range (32768 and up): a port bind(0) hands out is also what
     any process's next outgoing connection may take before ours binds it (a flake seen under
     a full suite: "Address already in use") */
  static unsigned seed;
  if (!seed) seed = (unsigned)getpid() * 2654435761u;
  p->port = 0;
  for (int k = 0; k < 200 && !p->port; k++) {
    int port = 20000 + (int)(rand_r(&seed) % 12000);
    if (port_free(port) && port_free(port + 1)) p->port = port;
  }
  if (!p->port) T_OK(newt_net_free_port(&p->port));
  snprintf(port, sizeof port, "%d", p->port);
  const char *argv[40];
  int a = 0;
  for (int k = 0; wrap && wrap[k] && a < 8; k++) argv[a++] = wrap[k];
  argv[a++] = bin();
  argv[a++] = kind;
  argv[a++] = "--etcd";
  argv[a++] = rdzv_etcd_server_url(srv);
  argv[a++] = "--job";
  argv[a++] = job;
  argv[a++] = "--id";
  argv[a++] = name;
  argv[a++] = "--metrics-port";
  argv[a++] = port;
  argv[a++] = "--metrics-addr";
  argv[a++] = "127.0.0.1";
  argv[a++] = "--termination-log";
  argv[a++] = p->end;
  if (spec) {
    argv[a++] = "--spec";
    argv[a++] = spec;
  }
  for (int k = 0; extra && extra[k] && a < 39; k++) argv[a++] = extra[k];
  argv[a] = NULL;
  static const char *const env[] = {"NEWT_SPEC_CHECK_MS=200", NULL};
  newt_spawn_opts so = {.log_path = log, .env = env, .die_with_parent = 1};
  T_OK(newt_proc_spawn(argv, &so, &p->pid));
}

static void spawn(proc *p, const char *kind, const char *name, const char *job, const char *spec) {
  spawn_x(p, kind, name, job, spec, NULL, NULL);
}

/* Waits for the process to exit; its exit status (-1: killed or still running). */
static int wait_exit(proc *p, int64_t ms) {
  int st = 0;
  if (newt_proc_wait(p->pid, ms, &st) != NEWT_OK) {
    kill(p->pid, SIGKILL);
    newt_proc_wait(p->pid, 5000, &st);
    return -1;
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *path) {
  char *t = NULL;
  size_t n = 0;
  if (newt_fs_read_all(path, 1 << 20, &t, &n) != NEWT_OK) return newt_strdup("");
  return t;
}

static size_t on_data(char *p, size_t sz, size_t n, void *ud) {
  newt_buf_append(ud, p, sz * n);
  return sz * n;
}

static long get(int port, const char *path, newt_buf *b) {
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
  newt_buf_reset(b);
  CURL *c = curl_easy_init();
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
  long code = 0;
  if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(c);
  return code;
}

/* promtool check metrics on a scrape (Debian's prometheus package: the test profile). */
static void promtool(const char *what, const char *text) {
  char path[600], cmd[1400];
  snprintf(path, sizeof path, "%s/%s.prom", dir, what);
  T_OK(newt_fs_write_atomic(path, text, strlen(text)));
  snprintf(cmd, sizeof cmd, "promtool check metrics < %s > %s.out 2>&1", path, path);
  int rc = system(cmd);
  char out[700];
  snprintf(out, sizeof out, "%s.out", path);
  char *o = slurp(out);
  T_CHECK_MSG(rc == 0, "promtool check metrics on the %s's metrics (%s): %s", what, path, o);
  free(o);
}

static int64_t progress_step(const char *job) {
  char key[256];
  rdzv_etcd_kv kv;
  if (job_key(key, sizeof key, job, JOB_REC_PROGRESS, 0, NULL) != NEWT_OK) return -1;
  if (rdzv_etcd_get(cli, key, newt_deadline_in_ms(2000), &kv, NULL) != NEWT_OK) return -1;
  job_progress p;
  int64_t s = job_progress_from_json(kv.value, kv.value_len, &p) == NEWT_OK ? p.step : -1;
  rdzv_etcd_kv_free(&kv);
  return s;
}

static int wait_step(const char *job, int64_t step, int64_t ms) {
  newt_deadline_t d = newt_deadline_in_ms(ms);
  while (!newt_deadline_passed(d)) {
    if (progress_step(job) >= step) return 1;
    newt_sleep_ms(50);
  }
  return 0;
}

/* The job's events, as one text (each event's JSON on a line). */
static char *events(const char *job) {
  char prefix[256];
  newt_buf b;
  newt_buf_init(&b);
  newt_job_path(prefix, sizeof prefix, job, "events/");
  rdzv_etcd_range_opts ro = {.prefix = 1, .sort = RDZV_SORT_KEY_ASCEND};
  rdzv_etcd_kvs all;
  if (rdzv_etcd_range(cli, prefix, &ro, newt_deadline_in_ms(5000), &all) == NEWT_OK) {
    for (size_t i = 0; i < all.n; i++) newt_buf_printf(&b, "%.*s\n", (int)all.kvs[i].value_len, all.kvs[i].value);
    rdzv_etcd_kvs_free(&all);
  }
  if (!b.data) newt_buf_append(&b, "", 0);
  return b.data;
}

static int wait_event(const char *job, const char *needle, int64_t ms) {
  newt_deadline_t d = newt_deadline_in_ms(ms);
  while (!newt_deadline_passed(d)) {
    char *e = events(job);
    int found = strstr(e, needle) != NULL;
    free(e);
    if (found) return 1;
    newt_sleep_ms(100);
  }
  return 0;
}

static void check_end(proc *p, const char *who, int status, int want, const char *prefix) {
  char *msg = slurp(p->end);
  T_CHECK_MSG(status == want, "%s exited %d, want %d (message: %s)", who, status, want, msg);
  T_CHECK_MSG(strncmp(msg, prefix, strlen(prefix)) == 0, "%s: termination message \"%s\", want it to start \"%s\"", who,
              msg, prefix);
  free(msg);
}

/* The value of the first sample of metric name in a scrape (after its labels), or NULL. */
static const char *sample_of(const char *text, const char *name) {
  size_t n = strlen(name);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (strncmp(p, name, n) == 0 && (p[n] == ' ' || p[n] == '{')) {
      const char *v = strchr(p, ' ');
      return v ? v + 1 : NULL;
    }
  return NULL;
}

/* Every sample of a worker's scrape carries worker="<id>" and the same rank="<r>" first
 * (issue 25, item 8): r is what its newt_worker_rank says, or "" while it holds no rank (a
 * spare). 1 when it holds a rank. */
static int check_worker_labels(const char *id, const char *t) {
  char want[96], rank[16] = "?";
  int n = snprintf(want, sizeof want, "{worker=\"%s\",rank=\"", id);
  const char *first = strstr(t, want);
  if (first) sscanf(first + n, "%15[^\"]", rank);
  if (first && first[n] == '"') rank[0] = '\0';
  const char *rank_v = sample_of(t, "newt_worker_rank");
  T_CHECK_MSG(!rank[0] || (rank_v && atoi(rank_v) == atoi(rank)), "worker %s: rank=\"%s\", newt_worker_rank %s", id, rank,
              rank_v ? rank_v : "missing");
  snprintf(want + n, sizeof want - (size_t)n, "%s\"", rank);
  int lines = 0, bad = 0;
  for (const char *p = t; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
    if (*p == '#' || *p == '\n') continue;
    lines++;
    const char *brace = strchr(p, '{'), *end = strchr(p, '\n');
    if (!brace || (end && brace > end) || strncmp(brace, want, strlen(want)) != 0) {
      if (!bad) T_FAIL("worker %s: a sample without %s: %.*s", id, want, end ? (int)(end - p) : 80, p);
      bad++;
    }
  }
  T_CHECK_MSG(lines >= 20 && !bad, "worker %s: %d of %d samples lack %s", id, bad, lines, want);
  T_CHECK_MSG(strstr(t, "\nprocess_resident_memory_bytes{") && strstr(t, "\nprocess_open_fds{"), "worker %s: no process_*: %s",
              id, t);
  return first && rank[0] >= '0' && rank[0] <= '9';
}

/* --metrics-linger-ms for the coordinators: longer than any test waits, so only a signal
 * ends it. */
static const char *const linger[] = {"--metrics-linger-ms", "600000", NULL};

/* The job's end on the /metrics of the coordinator that led it (it lingers): the scrape
 * holds `want`, the job's metrics and newt_is_leader 0, and passes promtool; then SIGTERM. */
static void last_scrape(proc *p, const char *who, const char *want, newt_buf *b) {
  newt_deadline_t d = newt_deadline_in_ms(60000);
  long code = 0;
  do {
    code = get(p->port, "/metrics", b);
    if (code == 200 && b->data && strstr(b->data, want) && strstr(b->data, "\nnewt_is_leader 0\n")) break;
    newt_sleep_ms(100);
  } while (!newt_deadline_passed(d));
  const char *t = code == 200 && b->data ? b->data : "";
  T_CHECK_MSG(strstr(t, want) && strstr(t, "\nnewt_step ") && strstr(t, "\nnewt_is_leader 0\n"),
              "%s's metrics after the job's end (HTTP %ld) lack %s: %s", who, code, want, t);
  if (strstr(t, want)) promtool("end", t);
  T_CHECK(get(p->port, "/healthz", b) == 200);
  kill(p->pid, SIGTERM);
}

static void test_ends(void) {
  const char *job = "k8s-ends";
  char spec[600];
  snprintf(spec, sizeof spec, "%s/spec.json", dir);
  write_spec(spec, job, 220, 8, 50, 10);
  proc c[2], w[3];
  spawn_x(&c[0], "coordinator", "c0", job, spec, linger, NULL);
  spawn_x(&c[1], "coordinator", "c1", job, spec, linger, NULL);
  for (int i = 0; i < 3; i++) {
    char name[8];
    snprintf(name, sizeof name, "w%d", i);
    spawn(&w[i], "worker", name, job, NULL);
  }
  T_CHECK_MSG(wait_step(job, 20, 90000), "no step 20 in 90 s (logs in %s)", dir);

  /* metrics: the leader's pass promtool and hold the job's; a standby's hide them */
  newt_buf b;
  newt_buf_init(&b);
  int leader = -1;
  for (int i = 0; i < 2; i++) {
    T_CHECK(get(c[i].port, "/metrics", &b) == 200);
    if (b.data && strstr(b.data, "\nnewt_is_leader 1\n")) leader = i;
  }
  T_CHECK_MSG(leader >= 0, "no coordinator says it leads");
  if (leader < 0) leader = 0;
  int standby = 1 - leader;
  T_CHECK(get(c[leader].port, "/metrics", &b) == 200);
  const char *t = b.data ? b.data : "";
  static const char *const want[] = {"newt_steps_total ", "newt_tokens_total ", "newt_recoveries_total{cause=\"crash\"} ",
                                     "newt_steps_lost_total ", "newt_recovery_duration_seconds", "newt_checkpoint_save_duration_seconds",
                                     "newt_checkpoint_stall_seconds",
                                     "newt_checkpoint_bytes ", "newt_checkpoint_last_step ", "newt_etcd_request_errors_total ",
                                     "newt_etcd_request_duration_seconds_bucket", "newt_workers ", "newt_spares ",
                                     "newt_build_info{version=", "newt_world_size ", "process_cpu_seconds_total ",
                                     "process_resident_memory_bytes ", "process_start_time_seconds ", "process_open_fds "};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) T_CHECK_MSG(strstr(t, want[i]), "leader metrics lack %s", want[i]);
  promtool("leader", t);
  T_CHECK(get(c[standby].port, "/metrics", &b) == 200);
  t = b.data ? b.data : "";
  T_CHECK_MSG(strstr(t, "standby") && !strstr(t, "newt_steps_total") && strstr(t, "newt_is_leader 0"), "standby: %s", t);
  promtool("standby", t);
  T_CHECK(get(c[leader].port, "/healthz", &b) == 200);
  /* 8 samples in micro-batches of 2 make dp 1, 2 or 4: of 3 workers one is a spare, which
     exports its metrics too but has trained nothing */
  int trained = 0, ranked = 0;
  for (int i = 0; i < 3; i++) {
    T_CHECK(get(w[i].port, "/healthz", &b) == 200);
    T_CHECK(get(w[i].port, "/metrics", &b) == 200);
    t = b.data ? b.data : "";
    char id[8];
    snprintf(id, sizeof id, "w%d", i);
    T_CHECK_MSG(strstr(t, "newt_worker_tokens_per_second{") && strstr(t, "newt_worker_communicator_builds_total{"),
                "worker %d metrics: %s", i, t);
    ranked += check_worker_labels(id, t);
    const char *builds = sample_of(t, "newt_worker_communicator_builds_total");
    trained += strstr(t, "newt_worker_step_duration_seconds_bucket") && builds && atoll(builds) >= 1;
    promtool("worker", t);
  }
  T_CHECK_MSG(trained >= 1, "no worker exports the metrics of a trained step");
  T_CHECK_MSG(ranked >= 1, "no worker's series carry a rank");

  /* a changed spec: ckpt.every may change (taken at a step boundary), train.steps may not */
  write_spec(spec, job, 220, 8, 40, 10);
  T_CHECK_MSG(wait_event(job, "taken: ckpt.every 50 -> 40", 20000), "the changed ckpt.every was not taken");
  T_CHECK_MSG(wait_event(job, "\"cause\":\"spec\"", 20000), "no plan for the changed spec");
  write_spec(spec, job, 300, 8, 40, 10);
  T_CHECK_MSG(wait_event(job, "refused: ", 20000), "the changed train.steps was not refused");
  char *ev = events(job);
  T_CHECK_MSG(strstr(ev, "spec.train.steps: 220 -> 300 cannot change"), "the refusal does not name the field: %s", ev);
  free(ev);

  /* SIGTERM to a worker and to the standby: they leave (3), the job goes on */
  kill(w[2].pid, SIGTERM);
  check_end(&w[2], "w2 (SIGTERM)", wait_exit(&w[2], 30000), JOB_EXIT_LEFT, "left: ");
  kill(c[standby].pid, SIGTERM);
  check_end(&c[standby], "the standby (SIGTERM)", wait_exit(&c[standby], 30000), JOB_EXIT_LEFT, "left: ");
  /* the rest end with the job */
  for (int i = 0; i < 2; i++) check_end(&w[i], i ? "w1" : "w0", wait_exit(&w[i], 180000), JOB_EXIT_DONE, "done: ");
  /* the leader serves the job's end until --metrics-linger-ms (the chart's alerts remember
     it), then SIGTERM cuts the wait short and it still ends with the job */
  last_scrape(&c[leader], "the leader", "\nnewt_job_done 1\n", &b);
  check_end(&c[leader], "the leader", wait_exit(&c[leader], 30000), JOB_EXIT_DONE, "done: ");
  newt_buf_free(&b);
}

static void test_budget(void) {
  const char *job = "k8s-budget";
  char spec[600];
  snprintf(spec, sizeof spec, "%s/spec.json", dir);
  write_spec(spec, job, 100000, 12, 0, 1); /* dp 3, 2 and 1 all split it */
  proc c, w[3];
  /* the run's files as the chart puts them on the checkpoint volume (runs/<job>/, a folder
     that does not exist yet): the leader's event log, rank 0's step log */
  char event_log[700], step_log[700], runs[640];
  snprintf(runs, sizeof runs, "%s/ckpt/runs/%s", dir, job);
  snprintf(event_log, sizeof event_log, "--event-log=%s/events.jsonl", runs);
  snprintf(step_log, sizeof step_log, "--step-log=%s/steps.jsonl", runs);
  const char *cx[] = {event_log, linger[0], linger[1], NULL}, *wx[] = {step_log, NULL};
  spawn_x(&c, "coordinator", "c0", job, spec, cx, NULL);
  for (int i = 0; i < 3; i++) {
    char name[8];
    snprintf(name, sizeof name, "w%d", i);
    spawn_x(&w[i], "worker", name, job, NULL, wx, NULL);
  }
  T_CHECK_MSG(wait_step(job, 5, 90000), "no step 5 in 90 s (logs in %s)", dir);
  proc sb; /* a standby: c0 leads by now */
  spawn_x(&sb, "coordinator", "c1", job, spec, linger, NULL);
  kill(w[2].pid, SIGKILL);
  wait_exit(&w[2], 5000);
  T_CHECK_MSG(wait_event(job, "\"type\":\"recovered\"", 60000), "no recovery from the first kill");
  int64_t s = progress_step(job);
  T_CHECK(wait_step(job, s + 3, 60000));
  kill(w[1].pid, SIGKILL);
  wait_exit(&w[1], 5000);
  newt_buf b;
  newt_buf_init(&b);
  last_scrape(&c, "the coordinator", "\nnewt_job_failed 1\n", &b);
  check_end(&c, "the coordinator", wait_exit(&c, 60000), JOB_EXIT_FAILED, "failed: failure budget spent: 2 recoveries");
  /* the standby saw the failure and lingers too (its exit 4 would fail the Kubernetes Job,
     which stops the leader's pod before its final scrape), until SIGTERM */
  char log[600];
  snprintf(log, sizeof log, "%s/c1.log", dir);
  newt_deadline_t d = newt_deadline_in_ms(60000);
  char *text = NULL;
  while (!newt_deadline_passed(d) && !strstr(text = slurp(log), "serving the job's final metrics")) {
    free(text);
    text = NULL;
    newt_sleep_ms(100);
  }
  T_CHECK_MSG(text && strstr(text, "serving the job's final metrics"), "the standby does not linger: %s", text ? text : "");
  free(text);
  T_CHECK_MSG(get(sb.port, "/metrics", &b) == 200 && b.data && strstr(b.data, "\nnewt_is_leader 0\n"), "the standby's metrics: %s",
              b.data ? b.data : "");
  kill(sb.pid, SIGTERM);
  check_end(&sb, "the standby", wait_exit(&sb, 60000), JOB_EXIT_FAILED, "failed: failure budget spent");
  newt_buf_free(&b);
  check_end(&w[0], "w0", wait_exit(&w[0], 60000), JOB_EXIT_FAILED, "failed: failure budget spent");
  char *ev = events(job);
  T_CHECK_MSG(strstr(ev, "\"type\":\"failed\"") && strstr(ev, "failure budget spent"), "no failed event: %s", ev);
  free(ev);
  /* newt status says so, and exits 0 (the job is over) */
  char out[600];
  snprintf(out, sizeof out, "%s/status.txt", dir);
  const char *argv[] = {bin(), "status", "--etcd", rdzv_etcd_server_url(srv), "--job", job, NULL};
  newt_spawn_opts so = {.log_path = out};
  pid_t pid;
  T_OK(newt_proc_spawn(argv, &so, &pid));
  int st = 0;
  T_OK(newt_proc_wait(pid, 30000, &st));
  text = slurp(out);
  T_CHECK_MSG(strstr(text, "FAILED") && strstr(text, "failure budget spent"), "newt status: %s", text);
  free(text);
  /* newt report of the job's own files (no newt run, no summary): the recovery of the first
     kill comes from the event log, timed as newt status times it */
  snprintf(out, sizeof out, "%s/report.txt", dir);
  const char *rv[] = {bin(), "report", runs, NULL};
  T_OK(newt_proc_spawn(rv, &so, &pid));
  T_OK(newt_proc_wait(pid, 60000, &st));
  text = slurp(out);
  T_CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0 && strstr(text, " steps, 1 recoveries"), "newt report %s: %s", runs,
              text);
  free(text);
  char page[700];
  snprintf(page, sizeof page, "%s/report.html", runs);
  text = slurp(page);
  T_CHECK_MSG(text && strstr(text, "without newt run's summary") && strstr(text, "class=\"recovery-marker\""),
              "the report of %s has no recovery from its event log", runs);
  free(text);
}

/* A worker's /healthz says unhealthy while one of its steps runs beyond the hang timeout,
 * and healthy again once the step completes: a peer stopped (SIGSTOP) inside a step, with a
 * collective timeout far beyond the hang timeout and the coordinator stopped too (so
 * nothing replans meanwhile). The step goes on without the control plane: w0 is healthy
 * again while the coordinator is still stopped. */
static void test_health(void) {
  const char *job = "k8s-health";
  char spec[600], text[700];
  snprintf(spec, sizeof spec, "%s/spec.json", dir);
  int n = snprintf(text, sizeof text,
                   "{\"job\":\"%s\",\"train\":{\"steps\":100000,\"global_batch\":8,\"micro_batch\":2},"
                   "\"parallel\":{\"dp_min\":1,\"dp_max\":2,\"start_workers\":2},"
                   "\"fault\":{\"comm_timeout_ms\":60000,\"hang_timeout_ms\":1500}}",
                   job);
  T_OK(newt_fs_write_atomic(spec, text, (size_t)n));
  proc c, w[2];
  spawn(&c, "coordinator", "c0", job, spec);
  /* the stall deadline, which follows the step times once 8 steps were seen (a few ms each:
     a stopped peer would be named after 250 ms, and w0 would leave its step), held at the
     collective timeout: w0 stays in the step with its stopped peer, however many steps came
     before the stop */
  setenv("NEWT_STALL_FLOOR_MS", "60000", 1);
  spawn(&w[0], "worker", "w0", job, NULL);
  spawn(&w[1], "worker", "w1", job, NULL);
  unsetenv("NEWT_STALL_FLOOR_MS");
  T_CHECK_MSG(wait_step(job, 5, 90000), "no step 5 in 90 s (logs in %s)", dir);
  newt_buf b;
  newt_buf_init(&b);
  T_CHECK(get(w[0].port, "/healthz", &b) == 200);
  kill(c.pid, SIGSTOP);
  kill(w[1].pid, SIGSTOP);
  long code = 0;
  newt_deadline_t d = newt_deadline_in_ms(20000);
  while (!newt_deadline_passed(d) && (code = get(w[0].port, "/healthz", &b)) == 200) newt_sleep_ms(100);
  T_CHECK_MSG(code == 503 && b.data && strstr(b.data, "beyond the hang timeout"),
              "w0's /healthz with its peer stopped inside a step: %ld %s", code, b.data ? b.data : "");
  kill(w[1].pid, SIGCONT);
  d = newt_deadline_in_ms(20000);
  while (!newt_deadline_passed(d) && (code = get(w[0].port, "/healthz", &b)) != 200) newt_sleep_ms(100);
  T_CHECK_MSG(code == 200, "w0's /healthz once its peer goes on: %ld %s", code, b.data ? b.data : "");
  int64_t s = progress_step(job);
  kill(c.pid, SIGCONT);
  T_CHECK_MSG(wait_step(job, s + 3, 60000), "no step after %lld once everyone went on", (long long)s);
  T_CHECK(get(w[0].port, "/healthz", &b) == 200);
  newt_buf_free(&b);
  for (int i = 0; i < 2; i++) kill(w[i].pid, SIGKILL), wait_exit(&w[i], 5000);
  kill(c.pid, SIGKILL);
  wait_exit(&c, 5000);
}

/* --- the node agent ---------------------------------------------------------------------- */

static int read_progress(const char *job, job_progress *p) {
  char key[256];
  rdzv_etcd_kv kv;
  if (job_key(key, sizeof key, job, JOB_REC_PROGRESS, 0, NULL) != NEWT_OK) return 0;
  if (rdzv_etcd_get(cli, key, newt_deadline_in_ms(2000), &kv, NULL) != NEWT_OK) return 0;
  int ok = job_progress_from_json(kv.value, kv.value_len, p) == NEWT_OK;
  rdzv_etcd_kv_free(&kv);
  return ok;
}

/* Worker id's registration into *kv (free with rdzv_etcd_kv_free); 0 when there is none. */
static int registration(const char *job, const char *id, rdzv_etcd_kv *kv) {
  char key[256], suffix[128];
  snprintf(suffix, sizeof suffix, "workers/%s", id);
  if (newt_job_path(key, sizeof key, job, suffix) != NEWT_OK) return 0;
  return rdzv_etcd_get(cli, key, newt_deadline_in_ms(2000), kv, NULL) == NEWT_OK;
}

/* The pid in worker id's registration (0: none). */
static pid_t worker_pid(const char *job, const char *id) {
  rdzv_etcd_kv kv;
  if (!registration(job, id, &kv)) return 0;
  job_worker w;
  pid_t pid = job_worker_from_json(kv.value, kv.value_len, "registration", &w) == NEWT_OK ? (pid_t)w.pid : 0;
  rdzv_etcd_kv_free(&kv);
  return pid;
}

/* The lease worker id's registration is on (0: none). */
static int64_t worker_lease(const char *job, const char *id) {
  rdzv_etcd_kv kv;
  if (!registration(job, id, &kv)) return 0;
  int64_t lease = kv.lease;
  rdzv_etcd_kv_free(&kv);
  return lease;
}

/* 1 when no process pid exists (not even a zombie). */
static int gone(pid_t pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

static int count(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
  return n;
}

/* A coordinator and an agent "node0" with 2 local workers on a job of `steps` steps (the
 * agent started through wrap, may be NULL); the agent's log (its own lines and its
 * workers') into log. */
static void start_agent_job(const char *job, int steps, const char *max_restarts, const char *const *wrap, proc *c,
                            proc *ag, char log[600]) {
  char spec[600];
  snprintf(spec, sizeof spec, "%s/spec.json", dir);
  snprintf(log, 600, "%s/node0.log", dir);
  write_spec(spec, job, steps, 8, 0, 10);
  spawn(c, "coordinator", "c0", job, spec);
  const char *const extra[] = {"--local-workers", "2", "--max-restarts", max_restarts, "--health-every-ms", "1000", NULL};
  spawn_x(ag, "worker", "node0", job, NULL, extra, wrap);
}

static void test_agent(void) {
  const char *job = "k8s-agent";
  char log[600];
  proc c, ag;
  start_agent_job(job, 100000, "5", NULL, &c, &ag, log);
  T_CHECK_MSG(wait_step(job, 5, 90000), "no step 5 in 90 s (logs in %s)", dir);
  job_progress p = {0};
  newt_deadline_t d = newt_deadline_in_ms(60000);
  while (!newt_deadline_passed(d) && !(read_progress(job, &p) && p.world == 2)) newt_sleep_ms(100);
  T_CHECK_MSG(p.world == 2, "the agent's 2 workers are not both ranks (world %lld)", (long long)p.world);
  /* each local worker serves its metrics and /healthz on the agent's port + i */
  newt_buf b;
  newt_buf_init(&b);
  for (int i = 0; i < 2; i++) {
    T_CHECK_MSG(get(ag.port + i, "/healthz", &b) == 200, "local worker %d: no /healthz on port %d", i, ag.port + i);
    T_CHECK_MSG(get(ag.port + i, "/metrics", &b) == 200 && b.data && strstr(b.data, "\nnewt_worker_step{"),
                "local worker %d: no metrics on port %d", i, ag.port + i);
    char id[16];
    snprintf(id, sizeof id, "node0-%d", i);
    T_CHECK_MSG(check_worker_labels(id, b.data ? b.data : ""), "local worker %s holds no rank", id);
  }
  newt_buf_free(&b);
  pid_t w0 = worker_pid(job, "node0-0"), w1 = worker_pid(job, "node0-1");
  T_CHECK_MSG(w0 > 0 && w1 > 0, "registrations of node0-0 (pid %d) and node0-1 (pid %d)", (int)w0, (int)w1);
  /* both registered on the host's lease, the agent's (one write each, no grant of their own) */
  int64_t host = worker_lease(job, "node0-0");
  T_CHECK_MSG(host && worker_lease(job, "node0-1") == host, "the local workers are on leases %llx and %llx, not one "
              "host lease", (unsigned long long)host, (unsigned long long)worker_lease(job, "node0-1"));
  uint64_t gen = p.generation;
  int64_t step = p.step;

  /* kill -9 one local worker: its registration goes at once (the agent deletes it: the host's
     lease lives on), the agent starts it again under its id, it rejoins */
  T_CHECK(kill(w1, SIGKILL) == 0);
  pid_t again = 0;
  d = newt_deadline_in_ms(30000);
  while (!newt_deadline_passed(d) && worker_pid(job, "node0-1") == w1) newt_sleep_ms(20);
  T_CHECK_MSG(worker_pid(job, "node0-1") != w1, "the killed node0-1's registration is still there");
  T_CHECK_MSG(worker_lease(job, "node0-0") == host, "node0-0's registration did not stay on the host lease");
  d = newt_deadline_in_ms(30000);
  while (!newt_deadline_passed(d) && ((again = worker_pid(job, "node0-1")) <= 0 || again == w1)) newt_sleep_ms(100);
  T_CHECK_MSG(again > 0 && again != w1, "node0-1 (pid %d) killed: not registered again (pid %d)", (int)w1, (int)again);
  T_CHECK_MSG(worker_lease(job, "node0-1") == host, "the restarted node0-1 is not on the host lease");
  T_CHECK_MSG(wait_event(job, "\"cause\":\"join\"", 60000), "no join plan after the restart");
  int back = 0;
  d = newt_deadline_in_ms(60000);
  while (!newt_deadline_passed(d) && !back) {
    back = read_progress(job, &p) && p.world == 2 && p.generation > gen + 1 && p.step > step;
    if (!back) newt_sleep_ms(100);
  }
  T_CHECK_MSG(back, "the job did not get back to 2 ranks (generation %llu, world %lld, step %lld; before: %llu, step %lld)",
              (unsigned long long)p.generation, (long long)p.world, (long long)p.step, (unsigned long long)gen,
              (long long)step);
  T_CHECK_MSG(worker_pid(job, "node0-0") == w0, "node0-0 was restarted too");
  char *text = slurp(log);
  T_CHECK_MSG(count(text, "restarting local worker node0-1") == 1 && !strstr(text, "restarting local worker node0-0"),
              "the agent's log does not say it restarted node0-1 once (%s)", log);
  T_CHECK_MSG(strstr(text, "local worker node0-1 (pid ") && strstr(text, "killed by SIGKILL"),
              "the agent's log does not say how node0-1 ended");
  free(text);

  /* SIGSTOP one local worker: its /healthz goes silent, the agent kills it after
     AGENT_HEALTH_FAILS probes in a row and starts it again (it would keep its GPU) */
  pid_t hung = again;
  gen = p.generation;
  step = p.step;
  T_CHECK(kill(hung, SIGSTOP) == 0);
  d = newt_deadline_in_ms(90000);
  while (!newt_deadline_passed(d) && ((again = worker_pid(job, "node0-1")) <= 0 || again == hung)) newt_sleep_ms(100);
  T_CHECK_MSG(again > 0 && again != hung, "node0-1 (pid %d) stopped: not killed and registered again (pid %d; logs in %s)",
              (int)hung, (int)again, dir);
  T_CHECK_MSG(gone(hung), "the stopped node0-1 (pid %d) is still there", (int)hung);
  back = 0;
  d = newt_deadline_in_ms(60000);
  while (!newt_deadline_passed(d) && !back) {
    back = read_progress(job, &p) && p.world == 2 && p.generation > gen && p.step > step;
    if (!back) newt_sleep_ms(100);
  }
  T_CHECK_MSG(back, "after the hang the job did not get back to 2 ranks (world %lld)", (long long)p.world);
  T_CHECK_MSG(worker_pid(job, "node0-0") == w0, "node0-0 was restarted too");
  text = slurp(log);
  T_CHECK_MSG(text && strstr(text, "failed 3 health probes in a row (no answer from http://127.0.0.1:") &&
                  count(text, "restarting local worker node0-1") == 2,
              "the agent's log does not say it killed the silent node0-1 and restarted it (%s)", log);
  /* stopped past the lease TTL (2 s) long before its third silent probe: its registration went
     then, as its own lease's would have */
  T_CHECK_MSG(text && strstr(text, "local worker node0-1 (pid ") && strstr(text, "stopped for more than the lease TTL"),
              "the agent's log does not say it deleted the stopped node0-1's registration (%s)", log);
  free(text);

  /* SIGTERM: every local worker leaves, the agent exits 3, none stays behind */
  uint64_t t0 = newt_wall_ms();
  kill(ag.pid, SIGTERM);
  check_end(&ag, "the agent (SIGTERM)", wait_exit(&ag, 30000), JOB_EXIT_LEFT, "left: ");
  T_CHECK_MSG(newt_wall_ms() - t0 < 30000, "the agent took %llu ms to leave", (unsigned long long)(newt_wall_ms() - t0));
  d = newt_deadline_in_ms(2000);
  while (!newt_deadline_passed(d) && !(gone(w0) && gone(again))) newt_sleep_ms(50);
  T_CHECK_MSG(gone(w0) && gone(again), "local workers left behind: %d %s, %d %s", (int)w0, gone(w0) ? "gone" : "alive",
              (int)again, gone(again) ? "gone" : "alive");
  /* the local workers' registrations, the rewrites that acknowledged each generation and the
     leaves went through the agent's gateway (rendezvous/gateway.h): 4 registrations (two
     restarts) and at least one acknowledgement each; and their 4 plan watches (one per start)
     were fewer of etcd's */
  text = slurp(log);
  const char *gw = text ? strstr(text, "host gateway: the local workers' ") : NULL;
  long long posted = -1, sent = -1, subs = -1, watches = -1;
  if (gw)
    sscanf(gw, "host gateway: the local workers' %lld transactions went to etcd in %lld writes; their %lld plan watches "
           "were %lld of etcd's", &posted, &sent, &subs, &watches);
  fprintf(stderr, "the agent's gateway: %lld transactions in %lld etcd writes, %lld plan watches in %lld of etcd's\n",
          posted, sent, subs, watches);
  T_CHECK_MSG(posted >= 8 && sent >= 1 && sent <= posted,
              "the agent's log does not say its gateway carried the local workers' writes (%lld in %lld; %s)", posted,
              sent, log);
  T_CHECK_MSG(subs >= 4 && watches >= 1 && watches < subs,
              "the agent's log does not say its gateway shared the plan's watch (%lld subscriptions, %lld watches; %s)",
              subs, watches, log);
  free(text);
  kill(c.pid, SIGTERM);
  wait_exit(&c, 30000);
}

static void test_agent_done(void) {
  const char *job = "k8s-agent-done";
  char log[600];
  proc c, ag;
  start_agent_job(job, 40, "5", NULL, &c, &ag, log);
  check_end(&ag, "the agent", wait_exit(&ag, 180000), JOB_EXIT_DONE, "done: ");
  check_end(&c, "the coordinator", wait_exit(&c, 30000), JOB_EXIT_DONE, "done: ");
  char *text = slurp(log);
  T_CHECK_MSG(count(text, "local worker node0-0 started") == 1 && count(text, "local worker node0-1 started") == 1 &&
                  !strstr(text, "restarting"),
              "a local worker was started more than once (%s)", log);
  T_CHECK_MSG(count(text, ") ended (exit 0)") == 2, "both local workers should end with exit 0 (%s)", log);
  free(text);
}

static void test_agent_budget(void) {
  const char *job = "k8s-agent-budget";
  char log[600];
  proc c, ag;
  start_agent_job(job, 100000, "0", NULL, &c, &ag, log);
  T_CHECK_MSG(wait_step(job, 3, 90000), "no step 3 in 90 s (logs in %s)", dir);
  pid_t w0 = worker_pid(job, "node0-0"), w1 = worker_pid(job, "node0-1");
  T_CHECK(w0 > 0 && w1 > 0);
  if (w0 > 0) kill(w0, SIGKILL);
  check_end(&ag, "the agent (budget spent)", wait_exit(&ag, 30000), JOB_EXIT_ERROR, "error: local worker node0-0 crashed");
  char *msg = slurp(ag.end);
  T_CHECK_MSG(strstr(msg, "--max-restarts"), "the message does not name the flag: %s", msg);
  free(msg);
  T_CHECK_MSG(gone(w1), "node0-1 (pid %d) stayed behind", (int)w1);
  char *text = slurp(log);
  T_CHECK_MSG(!strstr(text, "restarting"), "a local worker was restarted with --max-restarts 0 (%s)", log);
  free(text);
  kill(c.pid, SIGTERM);
  wait_exit(&c, 30000);
}

static void test_agent_usage(void) {
  /* a flag only the workers check (--addr): both refuse it (2), neither is restarted */
  proc ag;
  const char *const extra[] = {"--local-workers", "2", "--addr", "not-an-ip", NULL};
  spawn_x(&ag, "worker", "node0", "k8s-agent-usage", NULL, extra, NULL);
  check_end(&ag, "the agent (bad --addr)", wait_exit(&ag, 30000), JOB_EXIT_USAGE, "error: --addr: ");
  char log[600];
  snprintf(log, sizeof log, "%s/node0.log", dir);
  char *text = slurp(log);
  T_CHECK_MSG(!strstr(text, "restarting"), "a worker that refused its flags was restarted (%s)", log);
  free(text);
}

/* The pid of pid's first child (0: none), and the pid it has in its own PID namespace. */
static pid_t first_child(pid_t pid, long *ns_pid) {
  char path[96];
  snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
  FILE *f = fopen(path, "r");
  int child = 0;
  if (f) {
    if (fscanf(f, "%d", &child) != 1) child = 0;
    fclose(f);
  }
  *ns_pid = 0;
  snprintf(path, sizeof path, "/proc/%d/status", child);
  f = child > 0 ? fopen(path, "r") : NULL;
  char line[256];
  while (f && fgets(line, sizeof line, f)) /* "NSpid:\t<pid here>\t<pid in its namespace>" */
    if (strncmp(line, "NSpid:", 6) == 0) {
      char *last = strrchr(line, '\t');
      *ns_pid = last ? strtol(last + 1, NULL, 10) : 0;
    }
  if (f) fclose(f);
  return (pid_t)child;
}

static void test_agent_pid1(void) {
  if (system("unshare --pid --fork true >/dev/null 2>&1") != 0) {
    fprintf(stderr, "skipped: unshare --pid (a PID namespace, as in a container) needs root here\n");
    return;
  }
  /* the agent is PID 1 of a PID namespace of its own, as in a container */
  static const char *const wrap[] = {"unshare", "--pid", "--fork", "--kill-child", NULL};
  const char *job = "k8s-agent-pid1";
  char log[600];
  proc c, ag;
  start_agent_job(job, 100000, "5", wrap, &c, &ag, log);
  T_CHECK_MSG(wait_step(job, 5, 90000), "no step 5 in 90 s (logs in %s)", dir);
  long ns_pid = 0;
  pid_t agent = first_child(ag.pid, &ns_pid);
  T_CHECK_MSG(agent > 0 && ns_pid == 1, "the agent (pid %d) is pid %ld in its namespace, not 1", (int)agent, ns_pid);
  if (agent <= 0) return;
  kill(agent, SIGTERM); /* PID 1 gets only the signals it handles */
  check_end(&ag, "the agent as PID 1 (SIGTERM)", wait_exit(&ag, 30000), JOB_EXIT_LEFT, "left: ");
  char *text = slurp(log);
  T_CHECK_MSG(count(text, ") ended (exit 3)") == 2, "both local workers should leave (exit 3) before PID 1 ends (%s)", log);
  free(text);
  kill(c.pid, SIGTERM);
  wait_exit(&c, 30000);
}

int main(int argc, char **argv) {
  const char *which = argc > 1 ? argv[1] : "";
  curl_global_init(CURL_GLOBAL_DEFAULT);
  setup();
  if (strcmp(which, "ends") == 0) T_RUN(test_ends);
  else if (strcmp(which, "budget") == 0) T_RUN(test_budget);
  else if (strcmp(which, "health") == 0) T_RUN(test_health);
  else if (strcmp(which, "agent") == 0) T_RUN(test_agent);
  else if (strcmp(which, "agent_done") == 0) T_RUN(test_agent_done);
  else if (strcmp(which, "agent_budget") == 0) T_RUN(test_agent_budget);
  else if (strcmp(which, "agent_usage") == 0) T_RUN(test_agent_usage);
  else if (strcmp(which, "agent_pid1") == 0) T_RUN(test_agent_pid1);
  else T_FAIL("usage: test_k8s ends|budget|agent|agent_done|agent_budget|agent_usage|agent_pid1");
  rdzv_etcd_free(cli);
  rdzv_etcd_server_free(srv);
  if (!t_failed) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  } else {
    fprintf(stderr, "logs kept in %s\n", dir);
  }
  curl_global_cleanup();
  return T_DONE();
}
