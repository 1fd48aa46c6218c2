/* Joining (internal.h): what a worker is and holds before its first step. Its id, host and
 * failure domain; the data-plane socket, bound once and held for its whole life; the job
 * secret and the keys made of it; the etcd client; the metrics and health endpoint; the job's
 * spec, waited for; the spec's backend (common/backend.h) and the device it trains on; the
 * sample and step logs. Registration and the plan watch come with the first newt_step_begin
 * (worker.c). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/backend.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/name.h"
#include "common/secret.h"
#include "common/sys.h"
#include "job/records.h"
#include "job/runlog.h"
#include "job/store.h"
#include "rendezvous/rdzv.h"
#include "worker/internal.h"

/* The data-plane socket: bound once to addr:port (port 0: any free one) and held for the
 * whole life of the worker, so the address it registers stays its own across generations;
 * each generation's communicator listens on it. */
static newt_result_t bind_listener(const char *addr, int port, int *fd_out, int *port_out) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
    return NEWT_ERR(NEWT_ERR_INVALID, "--addr: \"%s\" is not an IPv4 address (newt_join_opts.addr, NEWT_ADDR)", addr);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1;
  socklen_t len = sizeof sa;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 256) != 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    return NEWT_ERR(NEWT_ERR_SYS, "addr %s, port %d: cannot listen for the data plane: %s", addr, port,
                    strerror(e));
  }
  *fd_out = fd;
  *port_out = ntohs(sa.sin_port);
  return NEWT_OK;
}

/* Every series this worker serves carries its id and rank (rank -1: "", none: before its
 * first generation, or a spare), so that a new rank moves them all. */
newt_result_t worker_label_metrics(worker *w, int rank) {
  char r[16] = "";
  if (rank >= 0) snprintf(r, sizeof r, "%d", rank);
  metrics_label l[] = {{"worker", w->id}, {"rank", r}};
  return metrics_set_const_labels(w->metrics, l, 2);
}

/* /healthz: unhealthy while one step has taken longer than the hang timeout (the leader
 * replans without a rank stuck that long; a probe restarts its container). Waiting for a
 * plan is healthy: a job below its minimum size waits as long as it takes. */
static int worker_health(void *ud, char *why, size_t cap) {
  worker *w = ud;
  uint64_t t = atomic_load(&w->step_started), now = newt_now_ns();
  int64_t limit = w->spec.hang_timeout_ms > 0 ? w->spec.hang_timeout_ms : 5000;
  if (!t || now - t <= (uint64_t)limit * 1000000) return 1;
  snprintf(why, cap, "step %lld has run for %.1f s, beyond the hang timeout (%lld ms)", (long long)w->live_step + 1,
           (double)(now - t) / 1e9, (long long)limit);
  return 0;
}

static newt_result_t start_metrics(worker *w) {
  static const double step_s[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  const char *addr = w->o.metrics_addr && *w->o.metrics_addr ? w->o.metrics_addr : "127.0.0.1";
  NEWT_CHECK(metrics_start(addr, w->o.metrics_port, NULL, &w->metrics));
  metrics_t *m = w->metrics;
  NEWT_CHECK(metrics_define(m, "newt_build_info", METRICS_GAUGE, "1, labelled with newt's version and the process's role"));
  NEWT_CHECK(metrics_define_histogram(m, "newt_worker_step_duration_seconds", 0, step_s, 12,
                                      "wall time of one training step on this worker"));
  NEWT_CHECK(metrics_define(m, "newt_worker_tokens_per_second", METRICS_GAUGE, "tokens of the global batch over this worker's last step time"));
  NEWT_CHECK(metrics_define(m, "newt_worker_step", METRICS_GAUGE, "the newest step this worker completed"));
  NEWT_CHECK(metrics_define(m, "newt_worker_compute_seconds", METRICS_GAUGE,
                            "this rank's compute in its last step: begin to commit, less its time in collectives"));
  NEWT_CHECK(metrics_define(m, "newt_worker_sample_compute_seconds", METRICS_GAUGE,
                            "this rank's compute per sample in its last step (its speed: docs/elastic.md, Stragglers)"));
  NEWT_CHECK(metrics_define(m, "newt_worker_stall_deadline_seconds", METRICS_GAUGE,
                            "how long a collective goes without progress before this worker probes its peers (follows "
                            "the step times; the cap, spec.fault.comm_timeout_ms, until enough steps were seen)"));
  NEWT_CHECK(metrics_define(m, "newt_worker_learning_rate", METRICS_GAUGE,
                            "the learning rate of this worker's last step, as its program said (0: not said)"));
  NEWT_CHECK(metrics_define(m, "newt_worker_grad_norm", METRICS_GAUGE,
                            "the gradients' global norm before clipping at this worker's last step, as its program "
                            "said (0: not said; NaN: not finite)"));
  NEWT_CHECK(metrics_define(m, "newt_worker_communicator_builds_total", METRICS_COUNTER,
                            "communicators this worker built: one per generation it trained in"));
  NEWT_CHECK(metrics_define(m, "newt_worker_generation", METRICS_GAUGE, "the generation this worker trains in"));
  NEWT_CHECK(metrics_define(m, "newt_worker_rank", METRICS_GAUGE, "this worker's rank in its generation"));
  metrics_set_l(m, "newt_build_info", "version=\"" NEWT_VERSION "\",role=\"worker\"", 1);
  NEWT_CHECK(worker_label_metrics(w, -1));
  metrics_set_health(m, worker_health, w);
  NEWT_CHECK(rdzv_etcd_set_metrics(w->etcd, m));
  NEWT_INFO(WORKER, "%s: metrics at http://%s:%d/metrics (health: /healthz)", w->id, addr, metrics_port(m));
  return NEWT_OK;
}

/* The spec's backend (its row of common/backend.h) and the device: for a backend on GPUs
 * (spec.backend nccl) the one the options name, else LOCAL_RANK modulo the GPUs visible (as
 * launchers set it), else the only one; -1 (the CPU) for a CPU backend. */
static newt_result_t pick_device(worker *w) {
  int want = w->o.device, gpus = 0;
  w->backend = newt_backend_find(w->spec.backend);
  if (!w->backend) /* spec_validate refused it already */
    return NEWT_ERR(NEWT_ERR_INVALID, "spec.backend: \"%s\" is no backend", w->spec.backend);
  gpus = comm_gpu_count(NULL);
  if (!newt_backend_uses_gpu(w->backend)) {
    if (want >= 0) NEWT_INFO(WORKER, "%s: the job trains on CPUs (spec.backend %s): device %d only registered", w->id,
                             w->backend->name, want);
    w->device = -1;
    return NEWT_OK;
  }
  if (gpus == 0)
    return NEWT_ERR(NEWT_ERR_UNSUPPORTED,
                    "spec.backend %s: this worker sees no GPU (a build without CUDA, no driver, or "
                    "CUDA_VISIBLE_DEVICES=%s)", w->backend->name,
                    getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "(unset)");
  const char *local = getenv("LOCAL_RANK");
  if (want < 0 && local && *local) want = atoi(local) % gpus;
  if (want < 0 && gpus == 1) want = 0;
  if (want < 0)
    return NEWT_ERR(NEWT_ERR_INVALID,
                    "spec.backend %s: %d GPUs are visible; the device (--device, NEWT_DEVICE or LOCAL_RANK) says "
                    "which one this worker trains on",
                    w->backend->name, gpus);
  if (want >= gpus)
    return NEWT_ERR(NEWT_ERR_INVALID, "device %d: this worker sees %d GPU%s (0 to %d)", want, gpus, gpus == 1 ? "" : "s",
                    gpus - 1);
  /* a shared device: NCCL refuses two ranks of a communicator on one GPU of one host, unless
     each is a host of its own to it (its host hash comes from NCCL_HOSTID) */
  if (w->o.share_device && !getenv("NCCL_HOSTID")) {
    char hostid[200];
    snprintf(hostid, sizeof hostid, "newt-%.63s-%.63s-%.63s", w->o.job, w->host, w->id);
    setenv("NCCL_HOSTID", hostid, 1);
  }
  w->device = want;
  return NEWT_OK;
}

/* The job secret (newt_secret_read: refused when another user owns it or can read or write
 * it) and the keys made of it: the records' and the checkpoints'. */
static newt_result_t read_secret(worker *w) {
  const char *f = w->o.secret_file;
  if (!f || !*f) {
    NEWT_WARN(WORKER, "%s: no job secret (job_secret_file, NEWT_JOB_SECRET_FILE): the data plane's keys are in the "
              "plans, which anyone who can read etcd can read, and nothing it writes to etcd or its checkpoints "
              "proves it is this job's", w->id);
    return NEWT_OK;
  }
  unsigned char *sec = NULL;
  size_t n = 0;
  newt_result_t r = newt_secret_read(f, &sec, &n);
  if (r == NEWT_OK) r = job_auth_init(&w->auth, sec, n, w->o.job);
  if (r == NEWT_OK) r = ckpt_key_of_secret(&w->ckpt_key, sec, n);
  if (r != NEWT_OK) {
    newt_secret_free(sec, n);
    return r;
  }
  w->job_secret = sec;
  w->job_secret_len = n;
  return NEWT_OK;
}

/* The job's spec from etcd, waiting for it to appear and for etcd to answer: spec_wait_ms in
 * all (60 s by default), each call within what is left of it. Past it, an error that names
 * etcd's address, what was tried and etcd's last answer. */
static newt_result_t read_spec(worker *w) {
  char *spec = NULL, last[512] = "", key[300], took[32];
  int64_t wait = w->o.spec_wait_ms > 0 ? w->o.spec_wait_ms : 60000;
  newt_deadline_t d = newt_deadline_in_ms(wait);
  double warned = 0;
  int tries = 0, away = 0;
  if (job_key(key, sizeof key, w->o.job, JOB_REC_SPEC, 0, NULL) != NEWT_OK) snprintf(key, sizeof key, "its spec");
  newt_fmt_duration((double)wait / 1e3, took, sizeof took);
  for (;;) {
    newt_result_t r = job_spec_get(w->etcd, w->o.job, newt_deadline_min(job_call_deadline(), d), &spec);
    tries++;
    if (r == NEWT_OK) break;
    if (r != NEWT_ERR_NOTFOUND && !rdzv_etcd_transient(r)) return r;
    away = rdzv_etcd_transient(r);
    if (away) {
      snprintf(last, sizeof last, "%s", newt_errmsg());
      if (newt_now_s() - warned >= 10) { /* said at most every 10 s */
        NEWT_WARN(WORKER, "%s: reading the job's spec: %s (waiting for etcd at %s, %s in all)", w->id, last,
                  rdzv_etcd_endpoints(w->etcd), took);
        warned = newt_now_s();
      }
    }
    if (newt_deadline_passed(d)) {
      if (away)
        return NEWT_ERR(NEWT_ERR_UNAVAILABLE, "newt_join: etcd at %s did not answer within %s (spec_wait_ms, "
                        "NEWT_SPEC_WAIT_MS): %d tries to read %s; the last: %s", rdzv_etcd_endpoints(w->etcd), took,
                        tries, key, last);
      return NEWT_ERR(NEWT_ERR_NOTFOUND, "job %s has no spec in etcd at %s after %s (%s; start a coordinator with "
                      "--spec, or run the program under `newt run -- PROGRAM`)", w->o.job,
                      rdzv_etcd_endpoints(w->etcd), took, key);
    }
    if (worker_stop_asked(w)) return NEWT_ERR(NEWT_ERR_ABORTED, "stopped while waiting for the spec");
    int64_t pause = away ? 1000 : 100, left = newt_deadline_left_ms(d);
    newt_sleep_ms(pause < left ? pause : left);
  }
  newt_result_t r = spec_from_json(spec, strlen(spec), &w->spec);
  if (r != NEWT_OK) {
    free(spec);
    return r;
  }
  w->spec_json = spec;
  return NEWT_OK;
}

newt_result_t worker_join(worker *w) {
  w->step_log_fd = -1;
  w->snap.step = w->snap.spare_step = -1;
  for (int j = 0; j < SPEC_REPLICAS_MAX; j++) w->rep[j].step = w->rep[j].spare_step = -1;
  w->vsnap.step = w->vsnap.spare_step = w->verified_step = w->rollback_to = -1;
  const char *flip = getenv("NEWT_CHAOS_FLIP");
  if (flip) snprintf(w->chaos_flip, sizeof w->chaos_flip, "%s", flip);
  const char *die = getenv("NEWT_CHAOS_DIE");
  if (die) snprintf(w->chaos_die, sizeof w->chaos_die, "%s", die);
  snprintf(w->host, sizeof w->host, "%s", w->o.host && *w->o.host ? w->o.host : newt_hostname());
  snprintf(w->domain, sizeof w->domain, "%s", w->o.domain && *w->o.domain ? w->o.domain : w->host);
  if (w->domain[strspn(w->domain, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:/")] != '\0' ||
      strlen(w->o.domain ? w->o.domain : "") >= sizeof w->domain)
    return NEWT_ERR(NEWT_ERR_INVALID, "failure domain \"%.64s\" (newt_join_opts.domain, NEWT_DOMAIN, newt worker "
                    "--domain): letters, digits, '.', '-', '_', ':' and '/', at most %zu characters", w->domain,
                    sizeof w->domain - 1);
  if (w->o.id && *w->o.id) snprintf(w->id, sizeof w->id, "%s", w->o.id);
  else snprintf(w->id, sizeof w->id, "%.40s-%d", w->host, (int)getpid());
  NEWT_CHECK(newt_check_name("worker id", w->id));
  NEWT_CHECK(newt_check_name("job", w->o.job));
  newt_log_set_name(w->id);
  const char *ip = w->o.addr && *w->o.addr ? w->o.addr : "127.0.0.1";
  int port = 0;
  NEWT_CHECK(bind_listener(ip, w->o.port, &w->listen_fd, &port));
  snprintf(w->addr, sizeof w->addr, "%s:%d", ip, port);
  NEWT_CHECK(read_secret(w));
  NEWT_CHECK(rdzv_etcd_init(&w->o.etcd, &w->etcd));
  if (w->o.metrics_port > 0) NEWT_CHECK(start_metrics(w));
  NEWT_CHECK(read_spec(w));
  NEWT_CHECK(pick_device(w));
  const char *slog = getenv("NEWT_SAMPLE_LOG_DIR");
  if (slog && *slog) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.samples", slog, w->id);
    w->sample_log = fopen(path, "a");
    if (!w->sample_log) return NEWT_ERR(NEWT_ERR_SYS, "NEWT_SAMPLE_LOG_DIR: cannot open %s", path);
  }
  if (w->o.step_log && *w->o.step_log) NEWT_CHECK(job_runlog_open(w->o.step_log, 0, &w->step_log_fd));
  w->phase = PHASE_JOINED;
  return NEWT_OK;
}
