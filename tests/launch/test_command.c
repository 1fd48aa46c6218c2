/* Running user programs as workers (`-- COMMAND [ARGS...]`, cli/program.h), with a stand-in
 * for a program built on libnewt (tests/launch/standin.sh: it writes its pid, arguments and
 * environment to a file named by NEWT_WORKER_ID, then exits or waits to be stopped):
 *
 *   worker  `newt worker [flags] -- standin ARGS`: every variable of the environment
 *           contract for a full set of flags (flags over inherited values, inherited ones
 *           kept, LOCAL_RANK kept, no RANK/WORLD_SIZE, the rest inherited) and for none (the
 *           defaults: host-pid, the host name, 0 and 1); the ARGS as given (a `--` and a
 *           --help among them); the program has newt worker's pid and gets its SIGTERM; a
 *           missing or non-executable COMMAND and a bare `--` exit 2 naming the problem.
 *   agent   `newt worker --local-workers 2 --id node --device 2 ... -- standin`: child i has
 *           LOCAL_RANK i, LOCAL_WORLD_SIZE 2, id node-i, device 2+i, ports + i, its own
 *           termination log, and is the pid the agent started; both exit 0, so the agent
 *           does (done, nothing restarted); a COMMAND that cannot run ends the agent with 2
 *           and its message, restarting nothing.
 *   run     `newt run --nproc 3 --chaos kill:worker:1@step=1,join:2@step=2 -- standin`: the
 *           workers run the program (its 100-odd words, more than a fixed argv would
 *           hold, as given) with the run's etcd, job, step log, secret and termination
 *           logs, LOCAL_RANK 0, 1, 2 of 3; the steps come from lines the test
 *           appends to the step log (as the program's rank 0 would), so w1 is killed at step
 *           1 and, once the launcher has reaped it, the joiners of step 2 take the lowest
 *           free slots (w3: 1 of 3, w4: 3 of 4). A run whose program never trains cannot
 *           end by itself: SIGTERM ends it (exit 1) and no program is left behind.
 *
 *   bench   `newt bench recovery -- newt-mlp` (examples/mlp, a program on libnewt): a line per
 *           run naming the program with its recovery's phases, no step lost, and the
 *           medians; `--` with nothing after it is refused.
 *   example docs/api.md's example (examples/linreg) is the file verbatim, and trains under
 *           `newt run -- newt-linreg` (done, every step and sample, the loss down tenfold).
 *
 * Every wait is for an event (a file, a process gone), bounded generously.
 * usage: test_command worker|agent|run|bench|example (ctest: command_<name>). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cJSON.h"
#include "common/clock.h"
#include "common/fs.h"
#include "common/proc.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "job/runlog.h"
#include "test.h"

static char tmp[] = "/tmp/newt-test-command-XXXXXX";
static const char *newt_bin, *standin;

/* The contract's variables and the others a test looks at, cleared at the start so that
 * only what a test sets is inherited. */
static const char *const contract[] = {
    "NEWT_ETCD", "NEWT_ETCD_USER", "NEWT_ETCD_PASSWORD_FILE", "NEWT_ETCD_CA", "NEWT_ETCD_CERT", "NEWT_ETCD_KEY",
    "NEWT_JOB", "NEWT_WORKER_ID", "NEWT_HOST", "NEWT_DOMAIN", "NEWT_ADDR", "NEWT_PORT", "NEWT_DEVICE", "NEWT_SHARE_DEVICE",
    "NEWT_THREADS", "NEWT_STEP_LOG", "NEWT_JOB_SECRET_FILE", "NEWT_METRICS_PORT", "NEWT_METRICS_ADDR",
    "NEWT_TERMINATION_LOG", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE", "POD_NAME", "POD_IP",
    "OMP_NUM_THREADS", "STANDIN_THEN", NULL};

static char *slurp(const char *path) {
  char *t = NULL;
  size_t n = 0;
  if (newt_fs_read_all(path, 1 << 20, &t, &n) != NEWT_OK) return NULL;
  return t;
}

/* The value of line "name=..." in text (malloc'd; NULL: no such line). */
static char *value_of(const char *text, const char *name) {
  size_t n = strlen(name);
  for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    if (strncmp(l, name, n) == 0 && l[n] == '=') {
      size_t len = strcspn(l + n + 1, "\n");
      char *v = malloc(len + 1);
      if (v) memcpy(v, l + n + 1, len), v[len] = '\0';
      return v;
    }
  return NULL;
}

/* The stand-in's record must say name=want (want NULL: no such variable). */
static void expect_var(const char *what, const char *text, const char *name, const char *want) {
  char *v = value_of(text, name);
  if (!want) T_CHECK_MSG(!v, "%s: %s is set (to \"%s\"), it should not be", what, name, v);
  else T_CHECK_MSG(v && strcmp(v, want) == 0, "%s: %s is \"%s\", want \"%s\"", what, name, v ? v : "(unset)", want);
  free(v);
}

static void expect_int(const char *what, const char *text, const char *name, long long want) {
  char w[32];
  snprintf(w, sizeof w, "%lld", want);
  expect_var(what, text, name, w);
}

/* The stand-in's record for worker id, once it is there (NULL after ms). */
static char *wait_record(const char *id, int64_t ms) {
  char path[400];
  snprintf(path, sizeof path, "%s/%s.env", tmp, id);
  newt_deadline_t d = newt_deadline_in_ms(ms);
  while (!newt_fs_exists(path) && !newt_deadline_passed(d)) newt_sleep_ms(20);
  return slurp(path);
}

static int gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

/* Waits for pid to be gone (reaped by its parent, not a zombie); 1 when it is. */
static int wait_gone(pid_t pid, int64_t ms) {
  newt_deadline_t d = newt_deadline_in_ms(ms);
  while (!gone(pid) && !newt_deadline_passed(d)) newt_sleep_ms(20);
  return gone(pid);
}

/* Starts argv with env (extra K=V, may be NULL), output into log. */
static pid_t start(const char *const *argv, const char *const *env, const char *log) {
  newt_spawn_opts so = {.log_path = log, .env = env, .die_with_parent = 1};
  pid_t pid = -1;
  T_OK(newt_proc_spawn(argv, &so, &pid));
  return pid;
}

/* Its exit status (-1: killed, or still running after ms: then it is killed). */
static int finish(pid_t pid, int64_t ms, int *st_out) {
  int st = 0;
  if (pid <= 0) return -1;
  if (newt_proc_wait(pid, ms, &st) != NEWT_OK) {
    kill(pid, SIGKILL);
    newt_proc_wait(pid, 5000, &st);
    T_FAIL("process %d still running after %lld ms", (int)pid, (long long)ms);
  }
  if (st_out) *st_out = st;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_file(const char *path, const char *text) { T_OK(newt_fs_write_atomic(path, text, strlen(text))); }

/* --- worker --------------------------------------------------------------------------------- */

static void check_full(const char *rec, const char *pw, const char *tl, pid_t pid) {
  const char *w = "newt worker with every flag";
  expect_var(w, rec, "NEWT_ETCD", "http://10.0.0.1:2379,http://10.0.0.2:2379");
  expect_var(w, rec, "NEWT_ETCD_USER", "trainer");
  expect_var(w, rec, "NEWT_ETCD_PASSWORD_FILE", pw);
  expect_var(w, rec, "NEWT_ETCD_CA", "/etc/ca.crt"); /* the flag, not the inherited /inherited/ca */
  expect_var(w, rec, "NEWT_ETCD_CERT", "/etc/tls.crt");
  expect_var(w, rec, "NEWT_ETCD_KEY", "/etc/tls.key");
  expect_var(w, rec, "NEWT_JOB", "job-a");
  expect_var(w, rec, "NEWT_WORKER_ID", "w-7");
  expect_var(w, rec, "NEWT_HOST", "host-1");
  expect_var(w, rec, "NEWT_DOMAIN", "rack-2");
  expect_var(w, rec, "NEWT_ADDR", "10.1.2.3");
  expect_var(w, rec, "NEWT_PORT", "29501"); /* the flag, not the inherited 1234 */
  expect_var(w, rec, "NEWT_DEVICE", "3");
  expect_var(w, rec, "NEWT_SHARE_DEVICE", "1");
  expect_var(w, rec, "NEWT_THREADS", "5");
  expect_var(w, rec, "OMP_NUM_THREADS", "5"); /* the program's thread pools: --threads */
  expect_var(w, rec, "NEWT_STEP_LOG", "/logs/steps.jsonl");
  expect_var(w, rec, "NEWT_JOB_SECRET_FILE", "/etc/secret");
  expect_var(w, rec, "NEWT_METRICS_PORT", "9402");
  expect_var(w, rec, "NEWT_METRICS_ADDR", "10.1.2.3,127.0.0.1");
  expect_var(w, rec, "NEWT_TERMINATION_LOG", tl);
  expect_var(w, rec, "LOCAL_RANK", "5"); /* inherited: kept */
  expect_var(w, rec, "LOCAL_WORLD_SIZE", "1");
  expect_var(w, rec, "RANK", NULL);
  expect_var(w, rec, "WORLD_SIZE", NULL);
  expect_var(w, rec, "NEWT_EXTRA", "kept"); /* an inherited NEWT_* no flag names */
  expect_var(w, rec, "OTHER_VAR", "inherited");
  expect_int(w, rec, "pid", (long long)pid); /* exec'd, not forked: newt worker's pid */
  T_CHECK_MSG(strstr(rec, "\narg=a b\narg=--port\narg=1\narg=--\narg=--help\narg=\n"),
              "the program's arguments are not as given (a b, --port 1, --, --help, an empty one):\n%.400s", rec);
}

/* Every flag, over inherited values: the program sees the flags. */
static void worker_full(void) {
  char pw[300], tl[300], log[300];
  snprintf(pw, sizeof pw, "%s/password", tmp);
  snprintf(tl, sizeof tl, "%s/full.end", tmp);
  snprintf(log, sizeof log, "%s/full.log", tmp);
  write_file(pw, "secret\n");
  const char *argv[] = {newt_bin, "worker", "--etcd", "http://10.0.0.1:2379,http://10.0.0.2:2379", "--etcd-user",
                        "trainer", "--etcd-password-file", pw, "--etcd-ca", "/etc/ca.crt", "--etcd-cert",
                        "/etc/tls.crt", "--etcd-key", "/etc/tls.key", "--job", "job-a", "--id", "w-7", "--host",
                        "host-1", "--domain", "rack-2", "--addr", "10.1.2.3", "--port", "29501", "--device", "3", "--share-device",
                        "--threads", "5", "--step-log", "/logs/steps.jsonl", "--job-secret-file", "/etc/secret",
                        "--metrics-port", "9402", "--metrics-addr", "10.1.2.3,127.0.0.1", "--termination-log", tl,
                        "--", "sh", standin, "a b", "--port", "1", "--", "--help", "", NULL};
  const char *env[] = {"NEWT_JOB=inherited-job", "NEWT_WORKER_ID=inherited-id", "NEWT_PORT=1234",
                       "NEWT_ETCD_CA=/inherited/ca", "LOCAL_RANK=5", "NEWT_EXTRA=kept", "OTHER_VAR=inherited",
                       "STANDIN_THEN=exit", NULL};
  pid_t pid = start(argv, env, log);
  int rc = finish(pid, 30000, NULL);
  T_CHECK_MSG(rc == 0, "newt worker -- standin exited %d, the stand-in's 0 (log %s)", rc, log);
  char *rec = wait_record("w-7", 1000);
  T_CHECK_MSG(rec, "the stand-in wrote no record (log %s)", log);
  if (rec) check_full(rec, pw, tl, pid);
  free(rec);
  char *msg = slurp(tl);
  T_CHECK_MSG(msg && strcmp(msg, "done: stand-in\n") == 0, "the termination log is the program's: %s", msg ? msg : "(none)");
  free(msg);
}

/* No flag but --job: the defaults newt worker itself would take; inherited values stay. */
static void worker_defaults(void) {
  char log[300];
  snprintf(log, sizeof log, "%s/defaults.log", tmp);
  const char *argv[] = {newt_bin, "worker", "--job", "job-b", "--", "sh", standin, NULL};
  const char *env[] = {"NEWT_THREADS=7", "OMP_NUM_THREADS=3", "STANDIN_THEN=exit", NULL};
  pid_t pid = start(argv, env, log);
  int rc = finish(pid, 30000, NULL);
  T_CHECK_MSG(rc == 0, "newt worker --job job-b -- standin exited %d (log %s)", rc, log);
  char id[128];
  snprintf(id, sizeof id, "%.40s-%d", newt_hostname(), (int)pid);
  char *rec = wait_record(id, 1000);
  T_CHECK_MSG(rec, "no record of %s: the default id is not host-pid of newt worker's pid (log %s)", id, log);
  if (!rec) return;
  const char *w = "newt worker with defaults";
  expect_var(w, rec, "NEWT_ETCD", "http://127.0.0.1:2379");
  expect_var(w, rec, "NEWT_JOB", "job-b");
  expect_var(w, rec, "NEWT_WORKER_ID", id);
  expect_var(w, rec, "NEWT_HOST", newt_hostname());
  expect_var(w, rec, "NEWT_PORT", "0");
  expect_var(w, rec, "NEWT_DEVICE", "-1");
  expect_var(w, rec, "NEWT_THREADS", "7"); /* inherited, no flag: stays */
  expect_var(w, rec, "OMP_NUM_THREADS", "3"); /* inherited: the user's choice */
  expect_var(w, rec, "NEWT_METRICS_PORT", "0");
  expect_var(w, rec, "NEWT_METRICS_ADDR", "127.0.0.1");
  expect_var(w, rec, "LOCAL_RANK", "0");
  expect_var(w, rec, "LOCAL_WORLD_SIZE", "1");
  const char *unset[] = {"NEWT_ETCD_USER", "NEWT_ETCD_PASSWORD_FILE", "NEWT_ETCD_CA", "NEWT_ETCD_CERT",
                         "NEWT_ETCD_KEY", "NEWT_DOMAIN", "NEWT_ADDR", "NEWT_SHARE_DEVICE", "NEWT_STEP_LOG",
                         "NEWT_JOB_SECRET_FILE", "RANK", "WORLD_SIZE", NULL};
  for (int i = 0; unset[i]; i++) expect_var(w, rec, unset[i], NULL);
  /* the default termination log is the program's only where it exists (a container) */
  expect_var(w, rec, "NEWT_TERMINATION_LOG", access("/dev/termination-log", F_OK) == 0 ? "/dev/termination-log" : NULL);
  free(rec);
}

/* The program is the process newt worker was: SIGTERM to that pid ends the program as its
 * default disposition says (killed by SIGTERM), not as newt would (exit 3). */
static void worker_sigterm(void) {
  char log[300];
  snprintf(log, sizeof log, "%s/sigterm.log", tmp);
  const char *argv[] = {newt_bin, "worker", "--job", "job-c", "--id", "sig", "--", "sh", standin, NULL};
  pid_t pid = start(argv, NULL, log);
  char *rec = wait_record("sig", 30000);
  T_CHECK_MSG(rec, "the stand-in wrote no record (log %s)", log);
  if (rec) expect_int("the waiting stand-in", rec, "pid", (long long)pid);
  free(rec);
  kill(pid, SIGTERM);
  int st = 0;
  finish(pid, 30000, &st);
  T_CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM, "SIGTERM did not end the program itself (status 0x%x)", st);
}

/* argv must exit 2 with needle in its output (and in the termination log tl, when given). */
static void expect_usage(const char *what, const char *const *argv, const char *needle, const char *tl) {
  char log[300];
  static int seq;
  snprintf(log, sizeof log, "%s/usage-%d.log", tmp, seq++);
  int rc = finish(start(argv, NULL, log), 30000, NULL);
  char *out = slurp(log);
  T_CHECK_MSG(rc == 2, "%s: exit %d, want 2:\n%s", what, rc, out ? out : "");
  T_CHECK_MSG(out && strstr(out, needle), "%s: the message does not say \"%s\":\n%s", what, needle, out ? out : "");
  free(out);
  if (!tl) return;
  char *msg = slurp(tl);
  T_CHECK_MSG(msg && strncmp(msg, "error: ", 7) == 0 && strstr(msg, needle), "%s: termination message %s", what,
              msg ? msg : "(none)");
  free(msg);
}

static void worker_usage(void) {
  char tl[300], plain[300];
  snprintf(tl, sizeof tl, "%s/usage.end", tmp);
  snprintf(plain, sizeof plain, "%s/not-executable", tmp);
  write_file(plain, "#!/bin/sh\nexit 0\n");
  const char *missing[] = {newt_bin, "worker", "--job", "j", "--termination-log", tl, "--", "/nonexistent/train", "x", NULL};
  expect_usage("a missing COMMAND", missing, "cannot run the program \"/nonexistent/train\" (the COMMAND after --): No such file or directory", tl);
  const char *in_path[] = {newt_bin, "worker", "--job", "j", "--", "newt-no-such-program", NULL};
  expect_usage("a COMMAND not in PATH", in_path, "\"newt-no-such-program\" (the COMMAND after --): No such file or directory (not found in PATH)", NULL);
  const char *noexec[] = {newt_bin, "worker", "--job", "j", "--termination-log", tl, "--", plain, NULL};
  expect_usage("a COMMAND that is not executable", noexec, "Permission denied", tl);
  const char *bare[] = {newt_bin, "worker", "--job", "j", "--", NULL};
  expect_usage("a bare --", bare, "newt worker: -- must be followed by the program to run", NULL);
  const char *stray[] = {newt_bin, "worker", "--job", "j", "train.py", NULL};
  expect_usage("a program without --", stray, "unexpected argument \"train.py\"", NULL);
  const char *id[] = {newt_bin, "worker", "--job", "j", "--id", "no/slash", "--", "true", NULL};
  expect_usage("a bad --id", id, "--id", NULL);
}

static void test_worker(void) {
  worker_full();
  worker_defaults();
  worker_sigterm();
  worker_usage();
}

/* --- agent ---------------------------------------------------------------------------------- */

static void check_child(const char *rec, const char *log_text, int i) {
  char what[64], id[32];
  snprintf(what, sizeof what, "local worker %d", i);
  snprintf(id, sizeof id, "node-%d", i);
  expect_var(what, rec, "NEWT_WORKER_ID", id);
  expect_int(what, rec, "LOCAL_RANK", i); /* the agent's, over its own inherited 9 */
  expect_var(what, rec, "LOCAL_WORLD_SIZE", "2");
  expect_int(what, rec, "NEWT_DEVICE", 2 + i);
  expect_int(what, rec, "NEWT_PORT", 29600 + i);
  expect_int(what, rec, "NEWT_METRICS_PORT", 9600 + i);
  expect_var(what, rec, "NEWT_JOB", "job-agent");
  T_CHECK_MSG(strstr(rec, "\narg=--device\narg=7\n"), "%s: the program's own arguments were changed:\n%.300s", what, rec);
  char *tl = value_of(rec, "NEWT_TERMINATION_LOG");
  T_CHECK_MSG(tl && strstr(tl, id), "%s: its termination log %s is not its own", what, tl ? tl : "(unset)");
  free(tl);
  char *pid = value_of(rec, "pid"), line[96];
  snprintf(line, sizeof line, "local worker %s started (pid %s,", id, pid ? pid : "?");
  T_CHECK_MSG(log_text && strstr(log_text, line), "%s: the program's pid is not the one the agent started (%s)", what, line);
  free(pid);
}

static void agent_done(void) {
  char log[300], tl[300];
  snprintf(log, sizeof log, "%s/agent.log", tmp);
  snprintf(tl, sizeof tl, "%s/agent.end", tmp);
  /* the program's arguments include flags the agent sets for its children (--device) */
  const char *argv[] = {newt_bin, "worker", "--local-workers", "2", "--job", "job-agent", "--id", "node", "--device",
                        "2", "--port", "29600", "--metrics-port", "9600", "--termination-log", tl, "--", "sh",
                        standin, "--device", "7", NULL};
  const char *env[] = {"STANDIN_THEN=exit", "LOCAL_RANK=9", "LOCAL_WORLD_SIZE=9", NULL};
  int rc = finish(start(argv, env, log), 60000, NULL);
  char *text = slurp(log);
  T_CHECK_MSG(rc == 0, "the agent exited %d: both programs exited 0, the job is done (log %s)", rc, log);
  for (int i = 0; i < 2; i++) {
    char id[32];
    snprintf(id, sizeof id, "node-%d", i);
    char *rec = wait_record(id, 1000);
    T_CHECK_MSG(rec, "no record of local worker %s (log %s)", id, log);
    if (rec) check_child(rec, text, i);
    free(rec);
  }
  T_CHECK_MSG(text && !strstr(text, "restarting"), "the agent restarted a program that ended with the job (log %s)", log);
  free(text);
  char *msg = slurp(tl);
  T_CHECK_MSG(msg && strstr(msg, "done: stand-in (local worker node-"), "the agent's termination message: %s",
              msg ? msg : "(none)");
  free(msg);
}

static void agent_cannot_run(void) {
  char log[300], tl[300];
  snprintf(log, sizeof log, "%s/agent-usage.log", tmp);
  snprintf(tl, sizeof tl, "%s/agent-usage.end", tmp);
  const char *argv[] = {newt_bin, "worker", "--local-workers", "2", "--job", "job-agent2", "--id", "bad",
                        "--termination-log", tl, "--", "/nonexistent/train", NULL};
  int rc = finish(start(argv, NULL, log), 60000, NULL);
  T_CHECK_MSG(rc == 2, "the agent exited %d, want 2: its programs cannot run (log %s)", rc, log);
  char *msg = slurp(tl), *text = slurp(log);
  T_CHECK_MSG(msg && strstr(msg, "error: cannot run the program \"/nonexistent/train\""),
              "the agent's termination message does not say why: %s", msg ? msg : "(none)");
  T_CHECK_MSG(text && !strstr(text, "restarting"), "a program that cannot run was restarted (log %s)", log);
  free(msg);
  free(text);
}

static void test_agent(void) {
  agent_done();
  agent_cannot_run();
}

/* --- run ------------------------------------------------------------------------------------- */

#define RUN_EXTRA_ARGS 100

/* What every worker of the run gets: the run's etcd, job and files, its slot. */
static void check_run_worker(const char *rec, const char *logs, const char *id, int slot, int world) {
  char what[64], path[400];
  snprintf(what, sizeof what, "newt run's %s", id);
  expect_var(what, rec, "NEWT_WORKER_ID", id);
  expect_int(what, rec, "LOCAL_RANK", slot);
  expect_int(what, rec, "LOCAL_WORLD_SIZE", world);
  expect_var(what, rec, "NEWT_JOB", "cmdrun");
  snprintf(path, sizeof path, "%s/steps.jsonl", logs);
  expect_var(what, rec, "NEWT_STEP_LOG", path);
  snprintf(path, sizeof path, "%s/job.secret", logs);
  expect_var(what, rec, "NEWT_JOB_SECRET_FILE", path);
  snprintf(path, sizeof path, "%s/%s.end", logs, id);
  expect_var(what, rec, "NEWT_TERMINATION_LOG", path);
  expect_var(what, rec, "NEWT_THREADS", "1");
  expect_var(what, rec, "NEWT_DEVICE", "-1");
  char *etcd = value_of(rec, "NEWT_ETCD");
  T_CHECK_MSG(etcd && strncmp(etcd, "http://127.0.0.1:", 17) == 0, "%s: NEWT_ETCD %s is not the private etcd", what,
              etcd ? etcd : "(unset)");
  free(etcd);
  char last[48];
  snprintf(last, sizeof last, "\narg=word-%d\n", RUN_EXTRA_ARGS - 1);
  T_CHECK_MSG(strstr(rec, "\narg=x y\narg=--nproc\narg=word-0\n") && strstr(rec, last),
              "%s: the program's arguments are not as given", what);
}

/* Appends step's line to the step log, as the program's rank 0 would. */
static void append_step(const char *path, int64_t step) {
  int fd = -1;
  T_OK(job_runlog_open(path, 0, &fd));
  job_step s = {.step = step, .loss = 3.0, .lr = 1e-3, .tokens_per_s = 100, .world = 3, .dp = 3, .generation = 1,
                .t_ms = newt_wall_ms()};
  if (fd >= 0) T_OK(job_steplog_append(fd, &s));
  if (fd >= 0) close(fd);
}

static pid_t pid_in(const char *rec) {
  char *v = rec ? value_of(rec, "pid") : NULL;
  pid_t pid = v ? (pid_t)atoi(v) : 0;
  free(v);
  return pid;
}

static void test_run(void) {
  char logs[300], out[300], steps[400];
  snprintf(logs, sizeof logs, "%s/run", tmp);
  snprintf(out, sizeof out, "%s/run.out", tmp);
  snprintf(steps, sizeof steps, "%s/steps.jsonl", logs);
  /* a long command: more words than any fixed argv of the launcher's would hold */
  const char *argv[24 + RUN_EXTRA_ARGS] = {newt_bin, "run", "--nproc", "3", "--job", "cmdrun", "--coordinators", "1",
                                           "--no-metrics", "--quiet", "--log-dir", logs, "--timeout-ms", "240000",
                                           "--chaos", "kill:worker:1@step=1,join:2@step=2", "--", "sh", standin,
                                           "x y", "--nproc"};
  static char extra[RUN_EXTRA_ARGS][16];
  int a = 0;
  while (argv[a]) a++;
  for (int i = 0; i < RUN_EXTRA_ARGS; i++) snprintf(extra[i], sizeof extra[i], "word-%d", i), argv[a++] = extra[i];
  argv[a] = NULL;
  pid_t run = start(argv, NULL, out);
  pid_t pids[5] = {0};
  for (int i = 0; i < 3; i++) {
    char id[8];
    snprintf(id, sizeof id, "w%d", i);
    char *rec = wait_record(id, 120000);
    T_CHECK_MSG(rec, "newt run's %s did not run the program (logs in %s)", id, logs);
    if (rec) check_run_worker(rec, logs, id, i, 3);
    pids[i] = pid_in(rec);
    free(rec);
  }
  /* step 1: chaos kills w1; once the launcher has reaped it its slot is free */
  append_step(steps, 1);
  T_CHECK_MSG(pids[1] > 0 && wait_gone(pids[1], 60000), "w1 (pid %d) was not killed at step 1 (logs in %s)",
              (int)pids[1], logs);
  /* step 2: two joiners, the lowest free slots: 1 (of 3), then 3 (of 4) */
  append_step(steps, 2);
  const struct { const char *id; int slot, world; } joiners[] = {{"w3", 1, 3}, {"w4", 3, 4}};
  for (int i = 0; i < 2; i++) {
    char *rec = wait_record(joiners[i].id, 60000);
    T_CHECK_MSG(rec, "the joiner %s did not run the program (logs in %s)", joiners[i].id, logs);
    if (rec) check_run_worker(rec, logs, joiners[i].id, joiners[i].slot, joiners[i].world);
    pids[3 + i] = pid_in(rec);
    free(rec);
  }
  kill(run, SIGTERM);
  int rc = finish(run, 60000, NULL);
  char *text = slurp(out);
  T_CHECK_MSG(rc == 143 && text && strstr(text, "interrupted by SIGTERM at step 2"), "newt run on SIGTERM: exit %d:\n%s", rc,
              text ? text : "");
  free(text);
  for (int i = 0; i < 5; i++)
    T_CHECK_MSG(pids[i] <= 0 || wait_gone(pids[i], 10000), "the program of w%d (pid %d) outlived newt run", i,
                (int)pids[i]);
}

/* --- bench ---------------------------------------------------------------------------------- */

/* `newt bench recovery -- newt-mlp`: one JSON line per run naming the program, its fault
 * recovered (cause crash, every phase measured, no step lost, state from memory or a peer),
 * then the medians; a bare `--` is refused. */
static void test_bench(void) {
  const char *mlp = getenv("NEWT_MLP");
  T_CHECK_MSG(mlp != NULL, "NEWT_MLP (examples/mlp's newt-mlp) is not set");
  if (!mlp) return;
  char out[300];
  snprintf(out, sizeof out, "%s/bench.out", tmp);
  const char *argv[] = {newt_bin, "bench", "recovery", "--runs", "2", "--nproc", "3", "--global-batch", "12",
                        "--steps", "2000", "--kill-at", "10", "--", mlp, "--hidden", "128", NULL};
  int rc = finish(start(argv, NULL, out), 240000, NULL);
  char *text = slurp(out);
  T_CHECK_MSG(rc == 0, "newt bench recovery -- newt-mlp exited %d:\n%s", rc, text ? text : "");
  int runs = 0, medians = 0;
  for (char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
    if (*l != '{') continue;
    size_t len = strcspn(l, "\n");
    cJSON *j = cJSON_ParseWithLength(l, len);
    T_CHECK_MSG(j != NULL, "not JSON: %.*s", (int)len, l);
    if (!j) continue;
    const char *program = cJSON_GetStringValue(cJSON_GetObjectItem(j, "program"));
    T_CHECK_MSG(program && strcmp(program, "newt-mlp") == 0, "the line names program %s: %.*s",
                program ? program : "(none)", (int)len, l);
    const char *phases[] = {"detect_ms", "plan_ms", "comm_ms", "restore_ms", "total_ms"};
    double sum = 0, total = -1;
    for (int k = 0; k < 5; k++) {
      const cJSON *v = cJSON_GetObjectItem(j, phases[k]);
      T_CHECK_MSG(cJSON_IsNumber(v) && v->valuedouble >= 0, "%s missing or negative: %.*s", phases[k], (int)len, l);
      if (!cJSON_IsNumber(v)) continue;
      if (k < 4) sum += v->valuedouble;
      else total = v->valuedouble;
    }
    T_CHECK_MSG(total >= sum, "the phases add up to %.0f ms, more than the total %.0f: %.*s", sum, total, (int)len, l);
    const cJSON *lost = cJSON_GetObjectItem(j, "steps_lost");
    T_CHECK_MSG(cJSON_IsNumber(lost) && lost->valuedouble == 0, "steps lost: %.*s", (int)len, l);
    if (cJSON_GetObjectItem(j, "median_of")) {
      medians++;
      T_CHECK_MSG(cJSON_GetObjectItem(j, "median_of")->valuedouble == 2, "median of: %.*s", (int)len, l);
    } else {
      runs++;
      const char *cause = cJSON_GetStringValue(cJSON_GetObjectItem(j, "cause"));
      const char *from = cJSON_GetStringValue(cJSON_GetObjectItem(j, "restore"));
      T_CHECK_MSG(cause && strcmp(cause, "crash") == 0, "cause: %.*s", (int)len, l);
      T_CHECK_MSG(from && (strcmp(from, "memory") == 0 || strcmp(from, "peer") == 0), "restore: %.*s", (int)len, l);
    }
    cJSON_Delete(j);
  }
  T_CHECK_MSG(runs == 2 && medians == 1, "%d run lines and %d median lines, want 2 and 1:\n%s", runs, medians,
              text ? text : "");
  free(text);
  /* the leader slow to take its own plan in after publishing it (NEWT_COORD_ADOPT_PAUSE_MS):
     the watch brings the plan and the ranks' acks first, and they must count (they were lost,
     and the recovery never recorded: "no recovery was recorded") */
  const char *env[] = {"NEWT_COORD_ADOPT_PAUSE_MS=300", NULL};
  const char *argv1[] = {newt_bin, "bench", "recovery", "--runs", "1", "--nproc", "3", "--global-batch", "12",
                         "--steps", "2000", "--kill-at", "10", "--", mlp, "--hidden", "128", NULL};
  rc = finish(start(argv1, env, out), 240000, NULL);
  text = slurp(out);
  T_CHECK_MSG(rc == 0 && text && strstr(text, "\"cause\":\"crash\""),
              "newt bench recovery with the leader slow to take its plan in: exit %d:\n%s", rc, text ? text : "");
  free(text);
  const char *bare[] = {newt_bin, "bench", "recovery", "--runs", "1", "--", NULL};
  rc = finish(start(bare, NULL, out), 60000, NULL);
  text = slurp(out);
  T_CHECK_MSG(rc == 2 && text && strstr(text, "-- must be followed by the program"),
              "newt bench recovery -- (nothing after it) exited %d:\n%s", rc, text ? text : "");
  free(text);
}

/* --- example ---------------------------------------------------------------------------- */

/* docs/api.md's example (examples/linreg): the page holds the file verbatim, and it trains
 * under `newt run -- newt-linreg`: every step, every sample, the loss going down. */
static void test_example(void) {
  const char *exe = getenv("NEWT_LINREG"), *src = getenv("NEWT_SOURCE_DIR");
  T_CHECK_MSG(exe != NULL, "NEWT_LINREG (examples/linreg's newt-linreg) is not set");
  if (!exe) return;
  char path[600];
  snprintf(path, sizeof path, "%s/examples/linreg/linreg.c", src);
  char *code = slurp(path);
  snprintf(path, sizeof path, "%s/docs/api.md", src);
  char *doc = slurp(path);
  const char *mark = "<!-- examples/linreg/linreg.c -->\n```c\n";
  char *at = doc ? strstr(doc, mark) : NULL;
  T_CHECK_MSG(code && at, "docs/api.md has no block after \"<!-- examples/linreg/linreg.c -->\"");
  if (code && at) {
    at += strlen(mark);
    char *end = strstr(at, "```");
    T_CHECK_MSG(end && (size_t)(end - at) == strlen(code) && strncmp(at, code, strlen(code)) == 0,
                "docs/api.md's example is not examples/linreg/linreg.c as it is");
  }
  free(code);
  free(doc);
  char logs[300], out[300], summary[300], steps[400];
  snprintf(logs, sizeof logs, "%s/example", tmp);
  snprintf(out, sizeof out, "%s/example.out", tmp);
  snprintf(summary, sizeof summary, "%s/example.json", tmp);
  snprintf(steps, sizeof steps, "%s/steps.jsonl", logs);
  const char *argv[] = {newt_bin, "run", "--nproc", "3", "--steps", "100", "--global-batch", "24", "--micro-batch", "2",
                        "--quiet", "--log-dir", logs, "--summary", summary, "--timeout-ms", "120000", "--", exe, NULL};
  int rc = finish(start(argv, NULL, out), 180000, NULL);
  char *text = slurp(out);
  T_CHECK_MSG(rc == 0, "newt run -- newt-linreg exited %d:\n%s", rc, text ? text : "");
  free(text);
  text = slurp(summary);
  cJSON *j = text ? cJSON_Parse(text) : NULL;
  T_CHECK_MSG(j != NULL, "no summary at %s", summary);
  if (j) {
    T_CHECK(cJSON_IsTrue(cJSON_GetObjectItem(j, "done")));
    const cJSON *st = cJSON_GetObjectItem(j, "steps"), *smp = cJSON_GetObjectItem(j, "samples_consumed"),
                *fl = cJSON_GetObjectItem(j, "final_loss");
    T_CHECK_MSG(cJSON_IsNumber(st) && st->valuedouble == 100, "steps: %s", text);
    T_CHECK_MSG(cJSON_IsNumber(smp) && smp->valuedouble == 2400, "samples: %s", text);
    char *log = slurp(steps);
    cJSON *first = log ? cJSON_ParseWithLength(log, strcspn(log, "\n")) : NULL;
    const cJSON *l1 = first ? cJSON_GetObjectItem(first, "loss") : NULL;
    T_CHECK_MSG(cJSON_IsNumber(l1) && cJSON_IsNumber(fl) && fl->valuedouble < l1->valuedouble / 10,
                "the loss went from %g to %g", l1 ? l1->valuedouble : -1, fl ? fl->valuedouble : -1);
    cJSON_Delete(first);
    free(log);
  }
  cJSON_Delete(j);
  free(text);
}

int main(int argc, char **argv) {
  newt_bin = getenv("NEWT_BIN");
  const char *src = getenv("NEWT_SOURCE_DIR");
  if (argc != 2 || !newt_bin || !src) {
    fprintf(stderr, "usage: NEWT_BIN=... NEWT_SOURCE_DIR=... test_command worker|agent|run|bench|example\n");
    return 2;
  }
  if (!mkdtemp(tmp)) return 2;
  static char script[600];
  snprintf(script, sizeof script, "%s/tests/launch/standin.sh", src);
  standin = script;
  for (int i = 0; contract[i]; i++) unsetenv(contract[i]);
  setenv("STANDIN_DIR", tmp, 1);
  if (strcmp(argv[1], "worker") == 0) T_RUN(test_worker);
  else if (strcmp(argv[1], "agent") == 0) T_RUN(test_agent);
  else if (strcmp(argv[1], "run") == 0) T_RUN(test_run);
  else if (strcmp(argv[1], "bench") == 0) T_RUN(test_bench);
  else if (strcmp(argv[1], "example") == 0) T_RUN(test_example);
  else T_FAIL("unknown scenario %s", argv[1]);
  if (!t_failed) newt_fs_rm_rf(tmp);
  else fprintf(stderr, "test_command: files kept in %s\n", tmp);
  return T_DONE();
}
