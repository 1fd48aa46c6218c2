/* The single-host launcher (see launcher.h): its start, its main loop and its end; run.h
 * maps the files it is made of.
 *
 * It owns every process it starts (each dies with it), follows /newt/<job>/ for progress,
 * events and the end marker (job/view.h), fires the chaos schedule when the job reaches each
 * step, and pairs each fault it injected with the recovery the coordinator recorded for it:
 * faults carry the wall-clock time they were injected, recovery events the times of
 * detection, plan, communicator, restore and first step, so the summary's intervals are
 * differences of wall-clock times taken on this one host.
 *
 * The run's files for `newt report` live in the log directory: rank 0 appends the step log
 * (each worker is started with --step-log), and every event the watch brings is appended
 * to the event log as it is handled. */
#include "launch/launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/proc.h"
#include "common/secret.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "job/runlog.h"
#include "job/store.h"
#include "launch/run.h"

/* --- the start ------------------------------------------------------------------------------ */

newt_result_t launcher_check_opts(const launcher_opts *o) {
  newt_result_t r = chaos_check_needs(o, CHAOS_NEEDS_ETCD | CHAOS_NEEDS_NETNS | CHAOS_NEEDS_CKPT);
  if (r != NEWT_OK) return r;
  if (o->netns && o->etcd)
    return NEWT_ERR(NEWT_ERR_INVALID, "--netns runs its own etcd on the namespaces' bridge: leave out --etcd");
  /* a log directory that is there already: this user's, written by nobody else (root writes in
     it: another user's links there would make it truncate and append to files of theirs) */
  int fd = -1;
  r = o->log_dir && newt_fs_exists(o->log_dir) ? newt_dir_trusted(o->log_dir, "--log-dir", &fd) : NEWT_OK;
  if (fd >= 0) close(fd);
  NEWT_CHECK(r);
  if (o->secret_file) {
    unsigned char *secret = NULL;
    size_t len = 0;
    r = newt_secret_read(o->secret_file, &secret, &len);
    newt_secret_free(secret, len);
    NEWT_CHECK(r);
  }
  return NEWT_OK;
}

newt_result_t launcher_check_hosts(const launcher_opts *o) { return chaos_check_needs(o, CHAOS_NEEDS_HOSTS); }

/* The job secret's bytes: --job-secret-file's, the checkpoint directory's own (made when
 * missing, so that runs on one directory share the checkpoints' key), or new ones. */
static newt_result_t job_secret(run *r, unsigned char **secret, size_t *len) {
  const launcher_opts *o = r->o;
  if (o->secret_file) return newt_secret_read(o->secret_file, secret, len);
  const char *ck = o->spec.ckpt_dir;
  if (ck[0] && (o->spec.ckpt_every > 0 || newt_fs_exists(ck))) return newt_secret_in_dir(ck, 1, secret, len);
  unsigned char key[32];
  unsigned char *hex = malloc(65);
  NEWT_CHECK_ALLOC(hex);
  newt_result_t res = newt_random_bytes(key, sizeof key);
  newt_hex_encode(key, sizeof key, (char *)hex);
  memset(key, 0, sizeof key);
  *secret = hex;
  *len = 64;
  return res;
}

/* A file of ours in the log directory, made anew, mode 0600: a stale file or a link in its place
 * is removed itself, never written through. */
static newt_result_t write_private(run *r, const char *name, const void *data, size_t len, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s", r->res->log_dir, name);
  unlinkat(r->log_fd, name, 0);
  int fd = openat(r->log_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return NEWT_ERR(NEWT_ERR_SYS, "creating %s: %s", path, strerror(errno));
  newt_result_t w = newt_fs_write_all(fd, data, len, path);
  close(fd);
  return w;
}

/* The run's files (job/runlog.h), started empty: a log directory used before holds no
 * earlier run's lines. Each is opened through the directory's descriptor, never through a
 * link (newt run may run as root, the directory checked to be its own). */
static newt_result_t open_run_files(run *r) {
  launcher_result *res = r->res;
  int fd;
  if (r->o->step_log) {
    snprintf(res->step_log, sizeof res->step_log, "%s", r->o->step_log);
    NEWT_CHECK(job_runlog_open(res->step_log, 1, &fd));
    close(fd);
    r->steps_fd = open(res->step_log, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  } else {
    snprintf(res->step_log, sizeof res->step_log, "%s/steps.jsonl", res->log_dir);
    NEWT_CHECK(job_runlog_open_at(r->log_fd, res->log_dir, "steps.jsonl", 1, &fd));
    close(fd);
    r->steps_fd = openat(r->log_fd, "steps.jsonl", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  }
  snprintf(res->event_log, sizeof res->event_log, "%s/events.jsonl", res->log_dir);
  /* the job's secret, readable by us alone: the plans in etcd carry only salts */
  unsigned char *secret = NULL;
  size_t len = 0;
  NEWT_CHECK(job_secret(r, &secret, &len));
  newt_result_t w = write_private(r, "job.secret", secret, len, r->secret_file, sizeof r->secret_file);
  if (w == NEWT_OK) w = job_auth_init(&r->auth, secret, len, r->o->spec.job);
  newt_secret_free(secret, len);
  NEWT_CHECK(w);
  return job_runlog_open_at(r->log_fd, res->log_dir, "events.jsonl", 1, &r->event_log_fd);
}

/* The etcd of the run: the one given (--etcd), or a private one started in the log directory. */
static newt_result_t start_etcd(run *r) {
  const launcher_opts *o = r->o;
  if (o->etcd) {
    snprintf(r->etcd_url, sizeof r->etcd_url, "%s", o->etcd);
  } else {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/etcd", r->res->log_dir);
    /* empty: an earlier run's data in a log directory used again holds its users and passwords */
    NEWT_CHECK(newt_fs_rm_rf_at(r->log_fd, r->res->log_dir, "etcd"));
    NEWT_CHECK(newt_fs_mkdirs(dir, 0700));
    /* authentication on: root (its password in our memory alone) and the job's own user, who
       may read and write the job's keys only; its password is a file of the log directory (mode
       0600), which every process is given (--etcd-user, --etcd-password-file): another user of
       this host reaches etcd's port, not the job */
    char root_pw[65], user_pw[65];
    unsigned char raw[64];
    NEWT_CHECK(newt_random_bytes(raw, sizeof raw));
    newt_hex_encode(raw, 32, root_pw);
    newt_hex_encode(raw + 32, 32, user_pw);
    memset(raw, 0, sizeof raw);
    snprintf(r->etcd_user, sizeof r->etcd_user, "newt-%.80s", o->spec.job);
    newt_result_t res = write_private(r, "etcd.password", user_pw, 64, r->etcd_pw_file, sizeof r->etcd_pw_file);
    /* with --netns, on the bridge: the workers' namespaces reach it there (and so do we) */
    rdzv_etcd_server_opts so = {.dir = dir, .members = o->etcd_members, .client_host = r->net ? netns_gateway(r->net) : NULL,
                                .root_password = root_pw, .user = r->etcd_user, .user_password = user_pw,
                                .user_prefix = r->prefix};
    if (res == NEWT_OK) {
      res = rdzv_etcd_server_start(&so, &r->server);
      if (res != NEWT_OK) res = newt_err_wrap(res, "newt run needs etcd (Debian package etcd-server) or --etcd URL: ");
    }
    memset(root_pw, 0, sizeof root_pw);
    memset(user_pw, 0, sizeof user_pw);
    NEWT_CHECK(res);
    snprintf(r->etcd_url, sizeof r->etcd_url, "%s", rdzv_etcd_server_url(r->server));
  }
  rdzv_etcd_opts eo = o->etcd ? o->etcd_client : (rdzv_etcd_opts){0};
  if (r->server) rdzv_etcd_server_user_opts(r->server, &eo);
  eo.endpoints = r->etcd_url;
  return rdzv_etcd_init(&eo, &r->etcd);
}

/* The job's spec, in a job name used once: the keys of an earlier run are not mixed with. */
static newt_result_t put_spec(run *r) {
  const launcher_opts *o = r->o;
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
  return res;
}

/* path made absolute (as given when it cannot be) into out: a record is read from anywhere. */
static void abs_path(char *out, size_t cap, const char *path) {
  char *real = path && path[0] ? realpath(path, NULL) : NULL;
  snprintf(out, cap, "%s", real ? real : path ? path : "");
  free(real);
}

/* The record newt status finds the job by (runfile.h); a run goes on without it. */
static void record(run *r) {
  const launcher_opts *o = r->o;
  runfile *rf = &r->rec;
  memset(rf, 0, sizeof *rf);
  snprintf(rf->job, sizeof rf->job, "%s", o->spec.job);
  rf->pid = getpid();
  rf->t_start_ms = r->res->t_start_ms;
  rf->private_etcd = r->server != NULL;
  snprintf(rf->etcd, sizeof rf->etcd, "%s", r->etcd_url);
  const char *user = r->server ? r->etcd_user : o->etcd_client.user;
  const char *pw = r->server ? r->etcd_pw_file : o->etcd_password_file;
  snprintf(rf->user, sizeof rf->user, "%s", user ? user : "");
  abs_path(rf->password_file, sizeof rf->password_file, pw);
  if (o->etcd) {
    abs_path(rf->ca, sizeof rf->ca, o->etcd_client.ca_file);
    abs_path(rf->cert, sizeof rf->cert, o->etcd_client.cert_file);
    abs_path(rf->key, sizeof rf->key, o->etcd_client.key_file);
  }
  abs_path(rf->log_dir, sizeof rf->log_dir, r->res->log_dir);
  if (runfile_write(rf) == NEWT_OK) r->rec_written = 1;
  else if (!o->quiet)
    fprintf(stderr, "newt run: newt status --job %s cannot find this run by itself: %s\n", o->spec.job, newt_errmsg());
}

/* The one command that shows the job: `newt status --job NAME` where the record is written,
 * else with the flags that reach its etcd. */
static void say_status_command(const run *r) {
  const runfile *rf = &r->rec;
  if (r->rec_written) {
    fprintf(stderr, "newt run: watch it with: newt status --job %s --watch\n", rf->job);
    return;
  }
  fprintf(stderr, "newt run: watch it with: newt status --job %s --etcd %s", rf->job, rf->etcd);
  if (rf->user[0]) fprintf(stderr, " --etcd-user %s --etcd-password-file %s", rf->user, rf->password_file);
  fprintf(stderr, "%s%s --watch\n", rf->ca[0] ? " --etcd-ca " : "", rf->ca);
}

static newt_result_t start(run *r) {
  const launcher_opts *o = r->o;
  if (o->chaos.n) { /* our copy of the schedule: each marked once fired */
    r->chaos = calloc((size_t)o->chaos.n, sizeof *r->chaos);
    if (!r->chaos) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
    memcpy(r->chaos, o->chaos.events, (size_t)o->chaos.n * sizeof *r->chaos);
    r->nchaos = o->chaos.n;
  }
  NEWT_CHECK(newt_proc_self_exe(r->exe, sizeof r->exe));
  if (o->log_dir) {
    snprintf(r->res->log_dir, sizeof r->res->log_dir, "%s", o->log_dir);
    NEWT_CHECK(newt_fs_mkdirs(o->log_dir, 0755));
  } else {
    snprintf(r->res->log_dir, sizeof r->res->log_dir, "/tmp/newt-run-%s-XXXXXX", o->spec.job);
    if (!mkdtemp(r->res->log_dir)) return NEWT_ERR(NEWT_ERR_SYS, "mkdtemp %s: %s", r->res->log_dir, strerror(errno));
  }
  /* ours, written by nobody else, and so every directory above it: its files are opened here */
  NEWT_CHECK(newt_dir_trusted(r->res->log_dir, "--log-dir", &r->log_fd));
  NEWT_CHECK(job_prefix(r->prefix, sizeof r->prefix, o->spec.job, JOB_REC_OTHER, -1));
  NEWT_CHECK(open_run_files(r));
  if (o->netns) NEWT_CHECK(netns_start(&r->net));
  NEWT_CHECK(start_etcd(r));
  NEWT_CHECK(put_spec(r));
  NEWT_CHECK(follow_start(r, newt_deadline_in_ms(5000)));
  for (int i = 0; i < o->coordinators; i++) NEWT_CHECK(procs_spawn(r, PROC_COORD, r->next_coord++));
  for (int i = 0; i < o->nproc; i++) NEWT_CHECK(procs_spawn(r, PROC_WORKER, r->next_worker++));
  record(r);
  if (!o->quiet) {
    fprintf(stderr, "newt run: job %s: %d workers, %d coordinators, etcd %s%s%s%s, logs in %s\n", o->spec.job,
            o->nproc, o->coordinators, r->etcd_url, r->etcd_user[0] ? " (user " : "", r->etcd_user,
            r->etcd_user[0] ? ", --etcd-password-file etcd.password in the logs)" : "", r->res->log_dir);
    say_status_command(r);
    for (int i = 0; i < r->nprocs; i++)
      if (r->procs[i].kind == PROC_COORD && r->procs[i].metrics_port)
        fprintf(stderr, "newt run: %s serves metrics at http://127.0.0.1:%d/metrics (the leader's are the job's)\n",
                r->procs[i].name, r->procs[i].metrics_port);
  }
  return NEWT_OK;
}

/* --- the loop ------------------------------------------------------------------------------- */

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

/* Handles the events the watch queued, taken with the step and the end (step, done: may be
 * NULL) in one look at the picture; handled outside the lock (handling may read etcd). */
static void handle_queued(run *r, int64_t *step, int *done) {
  pthread_mutex_lock(&r->mu);
  job_event *evs = r->events;
  int n = r->nevents;
  r->events = NULL;
  r->nevents = r->cap_events = 0;
  if (step) *step = r->step;
  if (done) *done = r->done;
  char warn[sizeof r->done_warn];
  snprintf(warn, sizeof warn, "%s", r->done_warn);
  r->done_warn[0] = '\0';
  pthread_mutex_unlock(&r->mu);
  if (warn[0] && !r->o->quiet) fprintf(stderr, "%snewt run: %s\n", live_news(r), warn);
  recoveries_take_events(r, evs, n);
  free(evs);
}

/* The termination message of a worker that exited 4 (the job failed: it says why, in
 * <log dir>/<name>.end), into why; 0 when none did. */
static int worker_failure(run *r, char *why, size_t cap) {
  for (int i = 0; i < r->nprocs; i++) {
    const proc *p = &r->procs[i];
    if (p->kind != PROC_WORKER || p->status != JOB_EXIT_FAILED) continue;
    char name[64], *text = NULL;
    size_t len = 0;
    snprintf(name, sizeof name, "%s.end", p->name);
    if (newt_fs_read_all_at(r->log_fd, r->res->log_dir, name, 4096, &text, &len) != NEWT_OK) continue;
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r')) len--;
    const char *m = len > 8 && strncmp(text, "failed: ", 8) == 0 ? text + 8 : text;
    snprintf(why, cap, "%.*s (%s's termination message)", (int)(len - (size_t)(m - text)), m, p->name);
    free(text);
    return 1;
  }
  return 0;
}

/* Whether the run is cut short now (its outcome and *rc set): a signal, --timeout, or every
 * worker gone, no join to come, and the job not done. */
static int cut_short(run *r, int64_t step, newt_deadline_t deadline, newt_result_t *rc) {
  launcher_result *res = r->res;
  int sig = newt_stop_requested();
  if (sig) {
    ended(res, "interrupted", "interrupted by SIG%s at step %lld", sig == SIGINT ? "INT" : "TERM", (long long)step);
    *rc = NEWT_ERR(NEWT_ERR_ABORTED, "newt run: %s; the run's files are in %s", res->reason, res->log_dir);
    return 1;
  }
  if (newt_deadline_passed(deadline)) {
    ended(res, "timeout", "not done after %lld ms (--timeout), at step %lld", (long long)r->o->timeout_ms,
          (long long)step);
    *rc = NEWT_ERR(NEWT_ERR_TIMEOUT, "newt run: the job was %s; logs in %s", res->reason, res->log_dir);
    return 1;
  }
  int pending_joins = 0;
  for (int i = 0; i < r->nchaos; i++)
    pending_joins += !r->chaos[i].fired && chaos_event_answer(&r->chaos[i]) == CHAOS_ANSWER_JOINERS;
  if (procs_workers(r) || pending_joins) return 0;
  /* the watch may lag behind (etcd came back a moment ago): the end marker decides */
  if (follow_read_done(r, newt_deadline_in_ms(10000))) return 0;
  /* the leader's word before the workers': its failed record, and the events before it (a
     mismatch), may still be on their way when the workers it failed have all exited (they
     said the job failed: a leader alive says it too, within a few seconds) */
  int64_t rev = follow_etcd_revision(r, 1000);
  char said[64];
  int failed = worker_failure(r, said, sizeof said);
  for (newt_deadline_t d = newt_deadline_in_ms(failed && procs_coordinators(r) ? 5000 : 3000);
       !newt_deadline_passed(d) && !res->failed[0];) {
    if (!failed && follow_caught_up(r, rev)) break;
    newt_sleep_ms(5);
    handle_queued(r, NULL, NULL);
  }
  handle_queued(r, NULL, NULL);
  if (res->failed[0]) {
    ended(res, "failed", "%s", res->failed);
    *rc = NEWT_ERR(NEWT_ERR_ABORTED, "newt run: the job failed at step %lld: %s; logs in %s", (long long)step,
                   res->failed, res->log_dir);
    return 1;
  }
  /* no leader said the job failed (none is left, or etcd is away), but the workers did */
  if (worker_failure(r, res->failed, sizeof res->failed)) {
    fprintf(stderr, "%snewt run: the job failed: %s\n", live_news(r), res->failed);
    ended(res, "failed", "%s", res->failed);
    *rc = NEWT_ERR(NEWT_ERR_ABORTED, "newt run: the job failed at step %lld: %s; logs in %s", (long long)step,
                   res->failed, res->log_dir);
    return 1;
  }
  ended(res, "exited", "every worker has exited at step %lld, the job not done", (long long)step);
  *rc = NEWT_ERR(NEWT_ERR_UNAVAILABLE, "newt run: %s; logs in %s", res->reason, res->log_dir);
  return 1;
}

/* One look at the job: its steps and events taken, the chaos due fired, cuts mended, etcd's
 * fault undone, notes written, processes reaped, the live line. 1 when the run is over (done,
 * failed or cut short: *rc says how). */
static int look(run *r, newt_deadline_t deadline, double *last_line, newt_result_t *rc) {
  launcher_result *res = r->res;
  int64_t step;
  int done;
  live_follow_steps(r);
  handle_queued(r, &step, &done);
  if (res->failed[0]) {
    *rc = NEWT_ERR(NEWT_ERR_ABORTED, "newt run: the job failed at step %lld: %s; logs in %s", (long long)step,
                   res->failed, res->log_dir);
    ended(res, "failed", "%s", res->failed);
    return 1;
  }
  if (done) {
    inject_etcd_tick(r, step); /* an outage the job finished in ends with the end marker reaching etcd */
    return 1;
  }
  chaos_fire_due(r, step);
  chaos_mend(r, step);
  recoveries_flush_notes(r, 300);
  procs_reap(r);
  if (newt_now_s() - *last_line > 0.2) {
    live_line(r, 0);
    *last_line = newt_now_s();
  }
  return cut_short(r, step, deadline, rc);
}

/* The restart mode's figures: the program's steps and loss from the step log (the supervisors'
 * beats are not the program's steps, and newt counted none of its samples), its restarts, and
 * the steps its restarts made it do again (job_steplog_stitch). */
static void restart_figures(run *r) {
  launcher_result *res = r->res;
  for (int k = 0; k < 1024 && live_follow_steps(r); k++) {
  }
  res->restart_mode = 1;
  res->beats = r->done ? r->done_step : r->beat;
  res->steps = r->step;
  res->final_loss = r->loss;
  res->samples_consumed = 0;
  res->restarts = r->restarts;
  job_step *s = NULL;
  size_t n = 0, redone = 0;
  if (job_steplog_read(res->step_log, &s, &n, NULL) == NEWT_OK && job_steplog_stitch(s, &n, &redone) == NEWT_OK)
    res->steps_redone = (int64_t)redone;
  free(s);
}

/* The loop, then the run's figures: the last events (the final recovery, "done"), the notes
 * not written yet, the last live line. */
static newt_result_t run_loop(run *r) {
  launcher_result *res = r->res;
  newt_result_t rc = NEWT_OK;
  newt_deadline_t deadline = newt_deadline_in_ms(r->o->timeout_ms > 0 ? r->o->timeout_ms : -1);
  double last_line = 0;
  while (!look(r, deadline, &last_line, &rc)) newt_sleep_ms(5);
  /* the leader's last words come after the end marker: the last recovery, then "done" (at
     most 3 s, while a coordinator lives to say them, or our watch has yet to bring what etcd
     holds: after an outage its back-off may keep it a moment behind the end) */
  int64_t rev = r->done ? follow_etcd_revision(r, 1000) : -1;
  for (newt_deadline_t d = newt_deadline_in_ms(3000);
       r->done && (!r->leader_done || !follow_caught_up(r, rev)) && !newt_deadline_passed(d);) {
    newt_sleep_ms(5);
    handle_queued(r, NULL, NULL);
    procs_reap(r);
    if (!procs_coordinators(r) && follow_caught_up(r, rev)) break;
  }
  handle_queued(r, NULL, NULL);
  recoveries_flush_notes(r, 2000);
  live_line(r, 1);
  if (!r->o->quiet && r->line_open) fputs(live_news(r), stderr);
  res->done = r->done;
  res->steps = r->done ? r->done_step : r->step;
  res->final_loss = r->done ? r->done_loss : r->loss;
  res->samples_consumed = r->done_samples;
  if (r->o->spec.restart) restart_figures(r);
  if (r->done) ended(res, "done", "%s", "");
  return rc;
}

/* --- the end -------------------------------------------------------------------------------- */

/* What the job leaves in etcd once every process ended: bounded however long it ran (the
 * leader's housekeeping). Keys on a lease are not counted, they go within its TTL (a worker
 * that ended while etcd was away could not revoke its registration), nor our own notes of
 * the faults we injected (faults/), which are not the job's. */
static void count_keys(run *r) {
  r->res->etcd_keys = -1;
  rdzv_etcd_range_opts ko = {.prefix = 1, .keys_only = 1};
  rdzv_etcd_kvs keys;
  char faults[256];
  if (!r->etcd || job_prefix(faults, sizeof faults, r->o->spec.job, JOB_REC_FAULT, -1) != NEWT_OK ||
      rdzv_etcd_range(r->etcd, r->prefix, &ko, newt_deadline_in_ms(3000), &keys) != NEWT_OK)
    return;
  size_t flen = strlen(faults);
  r->res->etcd_keys = 0;
  for (size_t i = 0; i < keys.n; i++) {
    const rdzv_etcd_kv *kv = &keys.kvs[i];
    r->res->etcd_keys += kv->lease == 0 && !(kv->key_len >= flen && memcmp(kv->key, faults, flen) == 0);
  }
  rdzv_etcd_kvs_free(&keys);
}

static void run_free(run *r) {
  job_follow_free(r->follow);
  if (r->etcd) rdzv_etcd_free(r->etcd);
  if (r->server) rdzv_etcd_server_free(r->server);
  netns_free(r->net); /* once every process in them has ended */
  free(r->cuts);
  if (r->event_log_fd >= 0) close(r->event_log_fd);
  if (r->steps_fd >= 0) close(r->steps_fd);
  if (r->log_fd >= 0) close(r->log_fd);
  for (int i = 0; i < r->nevents; i++) job_event_free(&r->events[i]);
  free(r->events);
  free(r->procs);
  free(r->chaos);
  for (int i = 0; i < r->nfaults; i++) free(r->faults[i].back);
  free(r->faults);
  free(r->notes);
  pthread_mutex_destroy(&r->mu);
  free(r);
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
  r->log_fd = -1;
  r->tty = isatty(STDERR_FILENO);
  pthread_mutex_init(&r->mu, NULL);
  r->t0 = newt_now_s();
  res->t_start_ms = newt_wall_ms();
  newt_result_t rc = launcher_check_opts(o);
  if (rc == NEWT_OK) rc = start(r);
  if (rc == NEWT_OK) rc = run_loop(r);
  if (!res->outcome[0]) ended(res, "error", "%s", newt_errmsg());
  /* what went wrong, kept across the clean-up below (which may fail at things of its own) */
  char why[1024];
  snprintf(why, sizeof why, "%s", rc != NEWT_OK ? newt_errmsg() : "");
  chaos_end(r);
  procs_stop_all(r);
  if (!res->done) { /* cut short: the steps the ranks ended after the cut (a stop's last), from their log */
    for (int k = 0; k < 1024 && live_follow_steps(r); k++) {
    }
    res->steps = r->step;
    res->final_loss = r->loss;
    res->samples_consumed = r->step * o->spec.global_batch; /* the cursor of the last committed step */
    if (o->spec.restart) restart_figures(r);
  }
  res->wall_s = newt_now_s() - r->t0;
  recoveries_measure(r);
  /* the steps each recovery did again, and each rollback of replicas that disagreed, in
     samples: every sample once is samples_consumed = steps x global_batch and none repeated */
  for (int i = 0; i < res->nrecoveries && !o->spec.restart; i++)
    res->samples_repeated += res->recoveries[i].steps_lost * o->spec.global_batch;
  for (int i = 0; i < res->nmismatches; i++)
    if (strcmp(res->mismatches[i].action, "rollback") == 0 && res->mismatches[i].step > res->mismatches[i].back_to)
      res->samples_repeated += (res->mismatches[i].step - res->mismatches[i].back_to) * o->spec.global_batch;
  count_keys(r);
  if (r->rec_written) { /* how it ended, before its etcd does: a watcher that finds it gone reads this */
    runfile *rf = &r->rec;
    rf->ended = 1;
    snprintf(rf->outcome, sizeof rf->outcome, "%s", res->outcome);
    snprintf(rf->reason, sizeof rf->reason, "%s", res->reason);
    rf->steps = res->steps;
    rf->loss = res->final_loss;
    rf->t_end_ms = newt_wall_ms();
    if (runfile_end(rf) != NEWT_OK && !o->quiet)
      fprintf(stderr, "newt run: recording the end for newt status: %s\n", newt_errmsg());
  }
  run_free(r);
  return rc == NEWT_OK ? NEWT_OK : NEWT_ERR(rc, "%s", why);
}
