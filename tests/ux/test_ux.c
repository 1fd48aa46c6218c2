/* What a person sees of newt, checked as a person would see it.
 *
 *   cli   a mistyped flag or command names the one that was meant; `newt --help` lists
 *         --version; a bad value `newt run` can see before start (an unknown preset, a missing
 *         token file, a seq_len beyond the model's ctx, a tp that does not divide its heads, a
 *         program not found, a string where a number belongs, a checkpoint directory another
 *         writer holds) exits 2 naming it, with nothing started; `newt coordinator --spec` and
 *         `newt train` refuse theirs the same way.
 *   run   a real `newt run` (its own etcd, real processes) with rank 0 killed (kill -9: the
 *         writer of the step log) and a worker joining, and all around it:
 *         - `newt status` against the live job: what it is doing in words, the workers, the
 *           recoveries as a table, times relative to now; `--watch --json` gives one JSON
 *           object per line until the job is done; a job that does not exist exits 1 and
 *           says so;
 *         - the live line of `newt run` with stderr in a file: plain lines, no carriage
 *           returns, no loss before the first step;
 *         - the step log: every step once after stitching, with the fields of its format,
 *           the generations in order, and the same losses as `newt train` (one process,
 *           no faults) with the same spec;
 *         - `newt report` of the run with that training run as --baseline, opened in a real
 *           headless browser (Debian's chromium): the page loads without a console message,
 *           its DOM holds the five charts (the ranks' speeds too) and one marker per recovery of
 *           the summary (in the loss and membership charts and the bars), and its screenshot is
 *           not blank (tests/ux/png_check.mjs decodes it). Without chromium the test fails
 *           saying so.
 *
 *   tty   the live line of `newt run` on a terminal (script(1) gives it one): refreshed in
 *         place, with an ETA, no loss before the first step.
 *
 *   stop  spares and Ctrl-C (issue 25, items 2 and 5): two workers train with --dp-max 2,
 *         two more join and stay spares (the layout is no larger with them), and chaos kills one of them: `newt run` says the joiners stay spares and
 *         that the kill lands on a spare, `newt status` lists the other spare with the
 *         reason; then a SIGINT to `newt run`'s process group (a terminal's Ctrl-C): it
 *         ends with status 130, says it was interrupted and offers no report, its summary
 *         says "interrupted" and why, its step and event logs read whole, no process of the
 *         run is left, and `newt report` of the run shows the spares and the interruption.
 *
 *   report_speeds  `newt report` of a step log with the ranks' speeds and an event log with a
 *         crash and two rebalances (issue 41) draws the chart of rank speeds: the median, a
 *         line per rank ever listed slow, a marker per rebalance (not the crash), and under it
 *         the count and the last plan's shares; the same run without speeds has no such chart.
 *
 * usage: test_ux cli|run|tty|stop|report_speeds (one ctest test each). */
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/json.h"
#include "common/proc.h"
#include "common/strutil.h"
#include "job/runlog.h"
#include "job/store.h"
#include "rendezvous/etcd_server.h"
#include "rendezvous/rdzv.h"
#include "test.h"

#define STEPS 600
#define STEPS_S "600"
#define MODEL "layers=2,channels=64"

static char tmp[] = "/tmp/newt-test-ux-XXXXXX";
static const char *newt_bin, *source_dir;

/* Runs argv with stdout and stderr into *out (malloc'd); returns the exit status or -1. */
static int run_capture(const char *const *argv, int64_t timeout_ms, char **out) {
  char path[512];
  static int seq;
  snprintf(path, sizeof path, "%s/out.%d", tmp, seq++);
  newt_spawn_opts so = {.log_path = path, .die_with_parent = 1};
  pid_t pid;
  if (out) *out = NULL;
  if (newt_proc_spawn(argv, &so, &pid) != NEWT_OK) return -1;
  int st = 0;
  if (newt_proc_wait(pid, timeout_ms, &st) != NEWT_OK) {
    newt_proc_stop(pid, 1000);
    return -1;
  }
  size_t n;
  if (out && newt_fs_read_all(path, 64 << 20, out, &n) != NEWT_OK) *out = NULL;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static size_t count(const char *hay, const char *needle) {
  size_t n = 0;
  for (const char *p = hay; p && (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

/* --- cli -------------------------------------------------------------------------------------- */

static void expect(const char *const *argv, int want_rc, const char *needle) {
  char *out = NULL;
  int rc = run_capture(argv, 30000, &out);
  T_CHECK_MSG(rc == want_rc, "newt %s %s exited %d, expected %d:\n%s", argv[1], argv[2] ? argv[2] : "", rc, want_rc,
              out ? out : "");
  T_CHECK_MSG(out && strstr(out, needle), "newt %s %s does not say \"%s\":\n%s", argv[1], argv[2] ? argv[2] : "",
              needle, out ? out : "");
  free(out);
}

static void test_cli(void) {
  const char *n = newt_bin;
  expect((const char *[]){n, "run", "--nprc", "3", NULL}, 2, "unknown flag --nprc: did you mean --nproc?");
  expect((const char *[]){n, "run", "--global-bacth", "3", NULL}, 2, "did you mean --global-batch?");
  expect((const char *[]){n, "worker", "--job", "j", "--threds", "2", NULL}, 2, "did you mean --threads?");
  expect((const char *[]){n, "stauts", NULL}, 2, "did you mean status?");
  expect((const char *[]){n, "--verison", NULL}, 2, "did you mean --version?");
  expect((const char *[]){n, "xyzzy", NULL}, 2, "unknown command \"xyzzy\"");
  expect((const char *[]){n, "--help", NULL}, 0, "--version");
  expect((const char *[]){n, "--help", NULL}, 0, "report");
  expect((const char *[]){n, "--version", NULL}, 0, "newt 0.");
  expect((const char *[]){n, "report", NULL}, 2, "give a run's log directory");
  expect((const char *[]){n, "report", "/nonexistent/dir", NULL}, 2, "is not a directory");
  /* a logging variable of an unknown value is said at once, whatever the command (item 6) */
  setenv("NEWT_DEBUG", "verbose", 1);
  setenv("NEWT_LOG_FORMAT", "yaml", 1);
  setenv("NEWT_DEBUG_SUBSYS", "RDZV,NETWORK", 1);
  expect((const char *[]){n, "report", NULL}, 2, "NEWT_DEBUG=verbose is not one of ERROR, WARN, INFO, DEBUG, TRACE");
  expect((const char *[]){n, "report", NULL}, 2, "NEWT_LOG_FORMAT=yaml is not text or json");
  expect((const char *[]){n, "report", NULL}, 2, "NEWT_DEBUG_SUBSYS: NETWORK is not one of");
  unsetenv("NEWT_DEBUG");
  unsetenv("NEWT_LOG_FORMAT");
  unsetenv("NEWT_DEBUG_SUBSYS");
  /* a flag of a spec field beside --spec is refused, not silently ignored (issue 25, item 6) */
  expect((const char *[]){n, "run", "--spec", "/nonexistent/spec.json", "--steps", "3", "--lr=0.1", NULL}, 2,
         "--steps, --lr: the spec file (--spec) sets the job's fields");
}

/* Refused before start (issue 25, item 4): exit 2 with the message naming the field and the
 * value, and nothing of the run made: its log directory (given, so it can be looked for),
 * which the launcher makes first, before etcd's data, the coordinators and the workers. */
static void expect_refused(const char *const *argv, const char *needle, const char *log_dir) {
  expect(argv, 2, needle);
  T_CHECK_MSG(!newt_fs_exists(log_dir), "newt %s started something before refusing: %s exists", argv[1], log_dir);
}

static void test_refused_before_start(void) {
  const char *n = newt_bin;
  char dir[300], spec[300], ckpt[300], lock[340], train_out[300];
  snprintf(dir, sizeof dir, "%s/refused-logs", tmp);
  expect_refused((const char *[]){n, "run", "--preset", "huge", "--nproc", "1", "--log-dir", dir, NULL},
                 "newt run: spec.model.preset: unknown preset \"huge\" (tiny, small or gpt2-124m)", dir);
  expect_refused((const char *[]){n, "run", "--data", "/nonexistent/corpus.tok", "--nproc", "1", "--log-dir", dir, NULL},
                 "newt run: spec.data.path: token file /nonexistent/corpus.tok: No such file or directory", dir);
  expect_refused((const char *[]){n, "run", "--seq-len", "128", "--nproc", "1", "--log-dir", dir, NULL},
                 "newt run: spec.train.seq_len: 128 is longer than the model's ctx 64 (preset tiny)", dir);
  expect_refused((const char *[]){n, "run", "--tp", "3", "--nproc", "3", "--log-dir", dir, NULL},
                 "newt run: spec.parallel.tp: 3 does not divide the model's heads 4 (preset tiny)", dir);
  expect_refused((const char *[]){n, "run", "--nproc", "1", "--log-dir", dir, "--", "no-such-program-here", NULL},
                 "newt run: cannot run the program \"no-such-program-here\" (the COMMAND after --): not found in PATH",
                 dir);
  /* a spec file: a string where a number belongs, in newt run and newt coordinator */
  snprintf(spec, sizeof spec, "%s/steps-string.json", tmp);
  const char *text = "{\"job\":\"j\",\"train\":{\"steps\":\"20\"}}";
  T_OK(newt_fs_write_atomic(spec, text, strlen(text)));
  expect_refused((const char *[]){n, "run", "--spec", spec, "--nproc", "1", "--log-dir", dir, NULL},
                 "spec.train.steps: expected a number, got the string \"20\"", dir);
  /* the coordinator checks its spec before it asks etcd anything (none answers here) */
  expect((const char *[]){n, "coordinator", "--job", "j", "--etcd", "http://127.0.0.1:9", "--metrics-port", "0",
                          "--spec", spec, NULL},
         2, "spec.train.steps: expected a number, got the string \"20\"");
  snprintf(spec, sizeof spec, "%s/huge.json", tmp);
  text = "{\"job\":\"j\",\"model\":{\"preset\":\"huge\"}}";
  T_OK(newt_fs_write_atomic(spec, text, strlen(text)));
  expect((const char *[]){n, "coordinator", "--job", "j", "--etcd", "http://127.0.0.1:9", "--metrics-port", "0",
                          "--spec", spec, NULL},
         2, "spec.model.preset: unknown preset \"huge\"");
  /* newt train, the trainer's own flags: the same check, the same exit */
  expect((const char *[]){n, "train", "--data", "/nonexistent/corpus.tok", "--steps", "1", NULL}, 2,
         "newt train: spec.data.path: token file /nonexistent/corpus.tok");
  /* a checkpoint directory another writer holds (a newt train saving there: its lock names
     it once taken) is refused before start, naming the holder */
  snprintf(ckpt, sizeof ckpt, "%s/held-ckpt", tmp);
  snprintf(lock, sizeof lock, "%s/LOCK", ckpt);
  snprintf(train_out, sizeof train_out, "%s/holder.out", tmp);
  const char *holder[] = {n, "train", "--model", "layers=1,channels=32", "--steps", "1000000", "--ckpt-dir", ckpt,
                          "--ckpt-every", "1000000", NULL};
  newt_spawn_opts so = {.log_path = train_out, .die_with_parent = 1};
  pid_t pid = -1;
  T_OK(newt_proc_spawn(holder, &so, &pid));
  int held = 0;
  for (newt_deadline_t d = newt_deadline_in_ms(60000); !held && !newt_deadline_passed(d); newt_sleep_ms(20)) {
    char *l = NULL;
    size_t len = 0;
    held = newt_fs_read_all(lock, 1 << 16, &l, &len) == NEWT_OK && len > 0;
    free(l);
  }
  T_CHECK_MSG(held, "newt train never took the lock of %s (see %s)", ckpt, train_out);
  if (held)
    expect_refused((const char *[]){n, "run", "--ckpt-dir", ckpt, "--ckpt-every", "5", "--nproc", "1", "--log-dir", dir,
                                    NULL},
                   "newt run: spec.ckpt.dir: ", dir);
  if (pid > 0) newt_proc_stop(pid, 5000);
}

/* --- run: status, step log, report ------------------------------------------------------------ */

static rdzv_etcd_server *etcd;
static char logs[200];

/* `newt status` of the live job, until it shows a recovery (or the job ends). */
static void check_status_live(const char *url, pid_t run) {
  const char *argv[] = {newt_bin, "status", "--etcd", url, "--job", "ux", NULL};
  int saw_running = 0, saw_recovery = 0;
  newt_deadline_t d = newt_deadline_in_ms(240000);
  while (!(saw_running && saw_recovery) && !newt_deadline_passed(d)) {
    char *out = NULL;
    int rc = run_capture(argv, 30000, &out);
    int st;
    int ended = waitpid(run, &st, WNOHANG) == run;
    if (out && strstr(out, "job ux: running, step ")) {
      if (!saw_running) { /* the first look at a running job: the picture a person gets */
        T_CHECK_MSG(rc == 0, "newt status exited %d", rc);
        T_CHECK_MSG(strstr(out, "  leader      c"), "no leader line:\n%s", out);
        T_CHECK_MSG(strstr(out, "  progress    loss ") && strstr(out, " tokens/s, world "), "no progress line:\n%s",
                    out);
        T_CHECK_MSG(strstr(out, " ago\n"), "no relative time:\n%s", out);
        T_CHECK_MSG(strstr(out, "\nworkers (") && strstr(out, "  ID "), "no table of workers:\n%s", out);
        T_CHECK_MSG(!strstr(out, "t_ms") && !strstr(out, "{\""), "raw JSON in the text:\n%s", out);
      }
      saw_running = 1;
      if (strstr(out, "recoveries (1)") || strstr(out, "recoveries (2)")) {
        saw_recovery = 1;
        T_CHECK_MSG(strstr(out, "  #   WHEN ") && strstr(out, " crash ") && strstr(out, " ms "),
                    "the recoveries are not a table with the crash in it:\n%s", out);
        T_CHECK_MSG(strstr(out, "recovered from crash in ") && strstr(out, ": generation 2"),
                    "the recovery is not among the events:\n%s", out);
      }
    }
    free(out);
    if (ended) {
      fprintf(stderr, "test_ux: newt run ended (status %d) before status saw it all\n", st);
      break;
    }
    newt_sleep_ms(150);
  }
  T_CHECK_MSG(saw_running, "newt status never showed the job running");
  T_CHECK_MSG(saw_recovery, "newt status never showed the crash's recovery while the job ran");
}

/* The done job's status: its recoveries, timed as the summary times them (one definition in
 * every view: issue 25, item 9), generation by generation. */
static void check_status_after(const char *url, int nrec, const cJSON *summary_recs) {
  const char *argv[] = {newt_bin, "status", "--etcd", url, "--job", "ux", "--json", NULL};
  char *out = NULL;
  int rc = run_capture(argv, 30000, &out);
  T_CHECK_MSG(rc == 0 && out && count(out, "\n") == 1, "newt status --json: exit %d, not one line:\n%s", rc,
              out ? out : "");
  cJSON *j = NULL;
  if (out && newt_json_parse(out, strlen(out), "status", &j) == NEWT_OK) {
    T_CHECK_MSG(cJSON_GetObjectItemCaseSensitive(j, "done") != NULL, "the done job has no done record");
    const cJSON *recs = cJSON_GetObjectItemCaseSensitive(j, "recoveries");
    int n = cJSON_GetArraySize(recs);
    T_CHECK_MSG(n == nrec, "newt status --json: %d recoveries, the summary %d", n, nrec);
    for (const cJSON *r = recs ? recs->child : NULL; r; r = r->next) {
      int64_t gen = -1, total = -1, start = -1, want_total = -2, want_start = -2;
      newt_json_get_int(r, "status.recoveries[]", "generation", 1, &gen);
      newt_json_get_int(r, "status.recoveries[]", "total_ms", 1, &total);
      newt_json_get_int(r, "status.recoveries[]", "start_ms", 1, &start);
      for (const cJSON *x = summary_recs ? summary_recs->child : NULL; x; x = x->next) {
        int64_t g = -1;
        newt_json_get_int(x, "summary.recoveries[]", "generation", 1, &g);
        if (g != gen) continue;
        newt_json_get_int(x, "summary.recoveries[]", "total_ms", 1, &want_total);
        newt_json_get_int(x, "summary.recoveries[]", "t_ms", 1, &want_start);
      }
      T_CHECK_MSG(total == want_total && start == want_start,
                  "generation %lld: newt status times it %lld ms from %lld, the summary %lld ms from %lld", (long long)gen,
                  (long long)total, (long long)start, (long long)want_total, (long long)want_start);
    }
    cJSON_Delete(j);
  } else {
    T_FAIL("newt status --json: %s", newt_errmsg());
  }
  free(out);
  /* a job that does not exist */
  const char *missing[] = {newt_bin, "status", "--etcd", url, "--job", "no-such-job", NULL};
  rc = run_capture(missing, 30000, &out);
  T_CHECK_MSG(rc == 1 && out && strstr(out, "no job \"no-such-job\""), "a missing job: exit %d:\n%s", rc,
              out ? out : "");
  free(out);
  const char *watch_missing[] = {newt_bin, "status", "--etcd", url, "--job", "no-such-job", "--watch", NULL};
  rc = run_capture(watch_missing, 30000, &out);
  T_CHECK_MSG(rc == 1 && out && strstr(out, "no job \"no-such-job\""), "--watch of a missing job: exit %d:\n%s", rc,
              out ? out : "");
  free(out);
}

/* A client of the test's etcd (NULL, with a failed check, when it cannot be made). */
static rdzv_etcd *ux_client(void) {
  rdzv_etcd_opts eo;
  rdzv_etcd_server_client_opts(etcd, &eo);
  rdzv_etcd *c = NULL;
  T_OK(rdzv_etcd_init(&eo, &c));
  return c;
}

/* Records whose strings carry terminal escapes, newlines and bells (issue 24, item 6): a plan
 * whose cause clears the screen, a worker key and an event of the same, a checkpoint pointer
 * with a BEL in its directory; and C1 controls (issue 37, item 9): CSI as UTF-8 (C2 9B), as a
 * raw byte and as a JSON escape, in an event's reason and the checkpoint's directory.
 * Whatever `newt status` prints of them (text or JSON, stdout and stderr) carries no control
 * byte but the line ends, C1 included, and no byte of a malformed UTF-8 sequence. */
static void check_status_hostile(const char *url) {
  rdzv_etcd *c = ux_client();
  if (!c) return;
  char *plan = NULL, key[256];
  T_OK(job_plan_get(c, "ux", newt_deadline_in_ms(5000), &plan, NULL, NULL));
  const char *cause = plan ? strstr(plan, "\"cause\":\"") : NULL;
  if (cause) {
    cause += strlen("\"cause\":\"");
    char *bad = newt_asprintf("%.*s\\u001b[2J\\u001b[31m%s", (int)(cause - plan), plan, cause);
    if (bad && newt_job_path(key, sizeof key, "ux", "plan") == NEWT_OK)
      T_OK(rdzv_etcd_put(c, key, bad, strlen(bad), 0, newt_deadline_in_ms(5000), NULL));
    free(bad);
  }
  T_CHECK_MSG(cause != NULL, "no cause in the plan: %s", plan ? plan : "");
  free(plan);
  const struct {
    const char *suffix, *value;
  } recs[] = {{"workers/w\x1b[2J", "{\"host\":\"h\x1b]0;owned\x07\",\"addr\":\"1.2.3.4:5\"}"},
              {"events/9999999999999999-00000000-deadbeef", "{\"type\":\"waiting\",\"t_ms\":1,\"why\":\"x\x1b[2J\\u001b[2J\\n\"}"},
              {"events/9999999999999999-00000001-deadbeef",
               "{\"type\":\"waiting\",\"t_ms\":2,\"why\":\"c1 \xc2\x9b" "2J \x9b" "31m \\u009b2J\"}"},
              {"ckpt", "{\"step\":10,\"dir\":\"/tmp/\\u0007\\u001b[2J\xc2\x9b" "31m\\u0085\",\"t_ms\":1}"}};
  for (size_t i = 0; i < sizeof recs / sizeof recs[0]; i++)
    if (newt_job_path(key, sizeof key, "ux", recs[i].suffix) == NEWT_OK)
      T_OK(rdzv_etcd_put(c, key, recs[i].value, strlen(recs[i].value), 0, newt_deadline_in_ms(5000), NULL));
  const char *text[] = {newt_bin, "status", "--etcd", url, "--job", "ux", NULL};
  const char *json[] = {newt_bin, "status", "--etcd", url, "--job", "ux", "--json", NULL};
  const char *const *runs[] = {text, json};
  for (size_t k = 0; k < 2; k++) {
    char *out = NULL;
    run_capture(runs[k], 30000, &out);
    for (const char *p = out; p && *p; p++) {
      const unsigned char *u = (const unsigned char *)p;
      int c1 = u[0] == 0xc2 && u[1] >= 0x80 && u[1] <= 0x9f; /* U+0080..U+009F in UTF-8 */
      int lone = (u[0] >= 0x80 && u[0] <= 0xbf) || u[0] == 0xc0 || u[0] == 0xc1 || u[0] >= 0xf5; /* starts no sequence */
      if ((u[0] < 0x20 && *p != '\n') || u[0] == 0x7f || c1 || lone) {
        T_FAIL("newt status%s printed control byte 0x%02x%s at %ld:\n%s", k ? " --json" : "", u[0], c1 ? " (C1)" : "",
               (long)(p - out), out);
        break;
      }
      if (u[0] >= 0xc2) /* a sequence's lead: its continuation bytes are no control */
        while ((u[1] & 0xc0) == 0x80) p++, u++;
    }
    free(out);
  }
  rdzv_etcd_free(c);
}

/* `newt status --watch` ends (issue 25, item 3): by itself when the job is done (its JSON
 * says "state":"done"); after --timeout-ms for a job that makes no progress; and when etcd
 * stays unreachable past --etcd-wait-ms (the etcd of a `newt run` ends with its job). */
static void check_watch_ends(const char *url) {
  char *out = NULL;
  const char *done[] = {newt_bin, "status", "--etcd", url, "--job", "ux", "--watch", "--json", NULL};
  int rc = run_capture(done, 30000, &out);
  T_CHECK_MSG(rc == 0 && out && strstr(out, "\"state\":\"done\""), "--watch of a done job: exit %d:\n%s", rc,
              out ? out : "");
  free(out);
  rdzv_etcd *c = ux_client();
  char key[256];
  const char *prog = "{\"generation\":1,\"step\":3,\"loss\":1.5,\"tokens_per_s\":1,\"t_ms\":1}";
  if (c && newt_job_path(key, sizeof key, "stuck", "progress") == NEWT_OK)
    T_OK(rdzv_etcd_put(c, key, prog, strlen(prog), 0, newt_deadline_in_ms(5000), NULL));
  rdzv_etcd_free(c);
  const char *stuck[] = {newt_bin, "status", "--etcd", url, "--job", "stuck", "--watch", "--interval-ms", "100",
                         "--timeout-ms", "700", NULL};
  rc = run_capture(stuck, 30000, &out);
  T_CHECK_MSG(rc == 1 && out && strstr(out, "--timeout-ms 700: it is still running"),
              "--watch --timeout-ms 700 of a job that makes no progress: exit %d:\n%s", rc, out ? out : "");
  free(out);
  const char *away[] = {newt_bin, "status", "--etcd", "http://127.0.0.1:9", "--job", "ux", "--watch", "--interval-ms",
                        "100", "--etcd-wait-ms", "500", NULL};
  rc = run_capture(away, 30000, &out);
  T_CHECK_MSG(rc == 1 && out && strstr(out, "giving up: etcd unreachable"),
              "--watch with etcd away past --etcd-wait-ms: exit %d:\n%s", rc, out ? out : "");
  free(out);
}

/* `newt job rm` (issue 25, item 7): a done job's records go (asked for --yes without a
 * terminal), its name is free again; a live one is refused without --force. */
static void check_job_rm(const char *url) {
  char *out = NULL;
  const char *ask[] = {newt_bin, "job", "rm", "--etcd", url, "--job", "ux", NULL};
  int rc = run_capture(ask, 30000, &out);
  T_CHECK_MSG(rc == 2 && out && strstr(out, "Give --yes"), "job rm without --yes: exit %d:\n%s", rc, out ? out : "");
  free(out);
  rdzv_etcd *c = ux_client();
  char key[256];
  int64_t lease = 0; /* a registration as a live worker has it: on a lease */
  if (c) T_OK(rdzv_etcd_lease_grant(c, 60, 0, newt_deadline_in_ms(5000), &lease, NULL));
  if (c && newt_job_path(key, sizeof key, "live", "workers/w0") == NEWT_OK)
    T_OK(rdzv_etcd_put(c, key, "{}", 2, lease, newt_deadline_in_ms(5000), NULL));
  const char *live[] = {newt_bin, "job", "rm", "--etcd", url, "--job", "live", "--yes", NULL};
  rc = run_capture(live, 30000, &out);
  T_CHECK_MSG(rc == 1 && out && strstr(out, "job live is live"), "job rm of a live job: exit %d:\n%s", rc,
              out ? out : "");
  free(out);
  const char *yes[] = {newt_bin, "job", "rm", "--etcd", url, "--job", "ux", "--yes", NULL};
  rc = run_capture(yes, 30000, &out);
  T_CHECK_MSG(rc == 0 && out && strstr(out, "removed job ux"), "job rm --yes: exit %d:\n%s", rc, out ? out : "");
  free(out);
  char prefix[256];
  rdzv_etcd_kvs left = {0};
  if (c && newt_job_path(prefix, sizeof prefix, "ux", "") == NEWT_OK)
    T_OK(rdzv_etcd_range(c, prefix, &(rdzv_etcd_range_opts){.prefix = 1, .count_only = 1}, newt_deadline_in_ms(5000),
                         &left));
  T_CHECK_MSG(left.count == 0, "%lld keys of job ux left after job rm", (long long)left.count);
  rdzv_etcd_kvs_free(&left);
  rdzv_etcd_free(c);
}

/* The --watch --json lines written while the job ran. */
static void check_watch(const char *path, pid_t watcher) {
  int st = 0;
  T_CHECK_MSG(newt_proc_wait(watcher, 30000, &st) == NEWT_OK && WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "newt status --watch did not end by itself with the job (status %d)", st);
  char *text = NULL;
  size_t len = 0;
  T_OK(newt_fs_read_all(path, 64 << 20, &text, &len));
  int lines = 0, last_done = 0;
  for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
    cJSON *j = NULL;
    if (newt_json_parse(line, strlen(line), "watch line", &j) != NEWT_OK) {
      T_FAIL("newt status --watch --json: a line is not JSON: %.200s", line);
      break;
    }
    lines++;
    last_done = cJSON_GetObjectItemCaseSensitive(j, "done") != NULL;
    cJSON_Delete(j);
  }
  T_CHECK_MSG(lines >= 3, "newt status --watch --json: %d lines", lines);
  T_CHECK_MSG(last_done, "the last line of --watch does not show the job done");
  free(text);
}

/* Every step once, the fields of the format, generations in order, the losses of newt train. */
static void check_step_log(const char *path, const char *base_path, int64_t *gens) {
  job_step *s = NULL, *b = NULL;
  size_t n = 0, nb = 0, redone = 0;
  T_OK(job_steplog_read(path, &s, &n, NULL));
  T_OK(job_steplog_stitch(s, &n, &redone));
  T_CHECK_MSG(n == STEPS, "the step log has %zu steps, the run %d", n, STEPS);
  uint64_t gen = 0, t = 0;
  for (size_t i = 0; i < n; i++) {
    T_CHECK_MSG(s[i].step == (int64_t)i + 1, "step %zu is %lld", i + 1, (long long)s[i].step);
    T_CHECK_MSG(s[i].generation >= gen && s[i].t_ms >= t, "step %lld goes back in generation or time",
                (long long)s[i].step);
    T_CHECK_MSG(s[i].world >= 1 && s[i].dp >= 1 && s[i].lr > 0 && s[i].tokens_per_s > 0 && isfinite(s[i].loss) &&
                    s[i].grad_norm > 0 && isfinite(s[i].grad_norm),
                "step %lld: world %lld dp %lld lr %g tokens/s %g loss %g grad_norm %g", (long long)s[i].step,
                (long long)s[i].world, (long long)s[i].dp, s[i].lr, s[i].tokens_per_s, s[i].loss, s[i].grad_norm);
    gen = s[i].generation, t = s[i].t_ms;
  }
  *gens = (int64_t)gen;
  T_OK(job_steplog_read(base_path, &b, &nb, NULL));
  T_CHECK_MSG(nb == STEPS, "newt train --log wrote %zu steps", nb);
  double worst = 0;
  double worst_norm = 0; /* the gradient norm of one process and of the job's ranks: the same step */
  for (size_t i = 0; i < n && i < nb; i++) {
    worst = fmax(worst, fabs(s[i].loss - b[i].loss));
    worst_norm = fmax(worst_norm, fabs(s[i].grad_norm - b[i].grad_norm) / fmax(b[i].grad_norm, 1e-12));
  }
  T_CHECK_MSG(worst <= 1e-3, "the run's losses differ from newt train's by up to %g", worst);
  T_CHECK_MSG(worst_norm <= 1e-2, "the run's gradient norms differ from newt train's by up to %g (relative)", worst_norm);
  free(s);
  free(b);
}

static void check_report(const char *page, int nrec, const char *median) {
  char *html = NULL;
  size_t len = 0;
  T_OK(newt_fs_read_all(page, 64 << 20, &html, &len));
  if (!html) return;
  /* the median of the recoveries' totals as the summary has them: the mean of the middle two */
  char card[128];
  snprintf(card, sizeof card, "<b>%s</b><span>median recovery</span>", median);
  T_CHECK_MSG(strstr(html, card), "the report has no card %s", card);
  T_CHECK_MSG(count(html, "<script") == 0 && count(html, "src=") == 0 && count(html, "href=") == 0,
              "the page is not self-contained (script, src or href)");
  T_CHECK_MSG(count(html, "class=\"recovery-marker\"") == (size_t)nrec, "%zu loss markers, %d recoveries",
              count(html, "class=\"recovery-marker\""), nrec);
  free(html);

  /* the page in a real browser */
  const char *chromium = NULL, *names[] = {"chromium", "chromium-browser", NULL};
  for (int i = 0; names[i] && !chromium; i++) {
    const char *v[] = {names[i], "--version", NULL};
    if (run_capture(v, 60000, NULL) == 0) chromium = names[i];
  }
  if (!chromium) {
    T_FAIL("chromium is not installed: the report is checked in a real browser (scripts/install-deps.sh test "
           "installs Debian's chromium)");
    return;
  }
  char profile[400], url[600], png[400], shot[440];
  snprintf(profile, sizeof profile, "--user-data-dir=%s/chromium-profile", tmp);
  snprintf(url, sizeof url, "file://%s", page);
  snprintf(png, sizeof png, "%s/shot.png", tmp);
  snprintf(shot, sizeof shot, "--screenshot=%s", png);
  /* the DOM on stdout, the browser's log (console messages included) on stderr: one file */
  const char *dump[] = {chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--no-first-run", "--enable-logging=stderr", "--v=0", profile, "--dump-dom", url, NULL};
  char *d = NULL;
  int rc = run_capture(dump, 120000, &d);
  T_CHECK_MSG(rc == 0 && d && strstr(d, "</html>"), "chromium --dump-dom exited %d:\n%s", rc, d ? d : "");
  if (d) {
    /* no console message at all: the page has no script, so any is a load error */
    T_CHECK_MSG(!strstr(d, ":CONSOLE"), "the browser's console says something:\n%s", strstr(d, ":CONSOLE"));
    /* the workers measure their speeds (issue 41): the step log has them, and the page their chart */
    const char *charts[] = {"id=\"loss-chart\"", "id=\"membership-chart\"", "id=\"recovery-chart\"",
                            "id=\"throughput-chart\"", "id=\"speed-chart\""};
    for (size_t i = 0; i < 5; i++) T_CHECK_MSG(strstr(d, charts[i]), "the DOM has no %s", charts[i]);
    T_CHECK_MSG(count(d, "<svg") == 5, "the DOM has %zu svg elements", count(d, "<svg"));
    T_CHECK_MSG(count(d, "<polyline") >= 4, "the DOM has %zu series", count(d, "<polyline"));
    const char *kinds[] = {"class=\"recovery-marker\"", "class=\"timeline-marker\"", "class=\"recovery-bar\""};
    for (size_t i = 0; i < 3; i++)
      T_CHECK_MSG(count(d, kinds[i]) == (size_t)nrec, "the DOM has %zu %s, the summary %d recoveries",
                  count(d, kinds[i]), kinds[i], nrec);
    T_CHECK_MSG(strstr(d, "<table id=\"recoveries\""), "the DOM has no table of recoveries");
  }
  free(d);
  const char *snap[] = {chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--no-first-run", "--hide-scrollbars", profile, "--window-size=1000,2200", shot, url, NULL};
  char *out = NULL;
  rc = run_capture(snap, 120000, &out);
  T_CHECK_MSG(rc == 0 && newt_fs_exists(png), "chromium --screenshot exited %d:\n%s", rc, out ? out : "");
  free(out);
  char script[400];
  snprintf(script, sizeof script, "%s/tests/ux/png_check.mjs", source_dir);
  const char *check[] = {"node", script, png, NULL};
  rc = run_capture(check, 60000, &out);
  T_CHECK_MSG(rc == 0, "the screenshot of the report is blank or unreadable (exit %d): %s", rc, out ? out : "");
  if (out) fprintf(stderr, "test_ux: screenshot %s", out);
  free(out);
}

static void test_run(void) {
  rdzv_etcd_server_opts so = {0};
  T_OK(rdzv_etcd_server_start(&so, &etcd));
  if (!etcd) return;
  const char *url = rdzv_etcd_server_url(etcd);
  snprintf(logs, sizeof logs, "%s/logs", tmp);
  char base[300], watch_out[300], run_out[300], summary[300];
  snprintf(base, sizeof base, "%s/baseline.jsonl", tmp);
  snprintf(watch_out, sizeof watch_out, "%s/watch.jsonl", tmp);
  snprintf(run_out, sizeof run_out, "%s/run.out", tmp);
  snprintf(summary, sizeof summary, "%s/summary.json", logs);

  /* the reference: one process, no faults, the same spec */
  const char *train[] = {newt_bin, "train", "--model", MODEL, "--seq-len", "32", "--steps", STEPS_S, "--batch", "24",
                         "--micro-batch", "2", "--log", base, NULL};
  T_CHECK(run_capture(train, 300000, NULL) == 0);

  const char *runv[] = {newt_bin, "run", "--etcd", url, "--job", "ux", "--nproc", "3", "--model", MODEL, "--seq-len",
                        "32", "--steps", STEPS_S, "--global-batch", "24", "--micro-batch", "2", "--chaos",
                        "kill:rank:0@step=40,join:1@step=120", "--log-dir", logs, "--timeout-ms", "240000", NULL};
  newt_spawn_opts rso = {.log_path = run_out, .die_with_parent = 1};
  pid_t run = -1, watcher = -1;
  T_OK(newt_proc_spawn(runv, &rso, &run));
  /* a watcher from the start: it waits for the job's keys, then follows it to the end */
  newt_sleep_ms(300);
  const char *watchv[] = {newt_bin, "status", "--etcd", url, "--job", "ux", "--watch", "--json", "--interval-ms", "300",
                          "--wait-workers", "1", "--timeout-ms", "60000", NULL};
  newt_spawn_opts wso = {.log_path = watch_out, .die_with_parent = 1};
  T_OK(newt_proc_spawn(watchv, &wso, &watcher));
  check_status_live(url, run);
  int st = 0;
  T_CHECK_MSG(newt_proc_wait(run, 240000, &st) == NEWT_OK && WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "newt run failed (status %d); see %s", st, run_out);
  check_watch(watch_out, watcher);
  /* stderr was a file, not a terminal: plain lines, no carriage returns or escapes, and no
     loss before the first step */
  char *log = NULL;
  size_t loglen = 0;
  T_OK(newt_fs_read_all(run_out, 64 << 20, &log, &loglen));
  if (log) {
    T_CHECK_MSG(!strchr(log, '\r') && !strchr(log, '\033'), "the live line in a file has \\r or escapes:\n%s", log);
    T_CHECK_MSG(count(log, "newt run: step ") >= 1, "no plain progress line:\n%s", log);
    const char *first = strstr(log, "newt run: step ");
    const char *loss = strstr(log, "loss ");
    T_CHECK_MSG(loss && first && loss > first, "a loss before the first step:\n%s", log);
  }
  free(log);

  char *text = NULL;
  size_t len = 0;
  int nrec = -1;
  T_OK(newt_fs_read_all(summary, 1 << 20, &text, &len));
  cJSON *j = NULL, *summary_recs = NULL;
  char median[32] = "?";
  if (text && newt_json_parse(text, len, "summary", &j) == NEWT_OK) {
    const cJSON *recs = cJSON_GetObjectItemCaseSensitive(j, "recoveries");
    summary_recs = cJSON_Duplicate(recs, 1);
    nrec = cJSON_GetArraySize(recs);
    if (nrec == 2) {
      int64_t a = 0, b = 0;
      newt_json_get_int(recs->child, "recovery", "total_ms", 1, &a);
      newt_json_get_int(recs->child->next, "recovery", "total_ms", 1, &b);
      newt_fmt_duration((double)((a + b) / 2) / 1e3, median, sizeof median);
    }
    T_CHECK_MSG(nrec == 2, "%d recoveries (a crash and a join expected):\n%s", nrec, text);
    for (const cJSON *r = recs ? recs->child : NULL; r; r = r->next) {
      int64_t step = 0, t_ms = 0;
      newt_json_get_int(r, "recovery", "step", 1, &step);
      newt_json_get_int(r, "recovery", "t_ms", 1, &t_ms);
      T_CHECK_MSG(step > 0 && t_ms > 0, "a recovery without its step or time:\n%s", text);
    }
    cJSON_Delete(j);
  }
  free(text);
  int64_t gens = 0;
  char steps[300];
  snprintf(steps, sizeof steps, "%s/steps.jsonl", logs);
  check_step_log(steps, base, &gens);
  T_CHECK_MSG(gens >= 3, "the step log ends in generation %lld (a crash and a join: 3)", (long long)gens);
  check_status_after(url, nrec, summary_recs);
  cJSON_Delete(summary_recs);
  check_watch_ends(url);
  check_status_hostile(url);
  check_job_rm(url);

  char page[300];
  snprintf(page, sizeof page, "%s/report.html", logs);
  const char *report[] = {newt_bin, "report", logs, "--baseline", base, NULL};
  char *out = NULL;
  int rc = run_capture(report, 60000, &out);
  T_CHECK_MSG(rc == 0 && out && strstr(out, page), "newt report exited %d:\n%s", rc, out ? out : "");
  free(out);
  if (nrec > 0) check_report(page, nrec, median);
}

/* --- tty: the live line on a terminal ------------------------------------------------------ */

/* `newt run` under script(1), which gives it a terminal: one line refreshed in place (a
 * carriage return and erase-line before each), with a percentage and an ETA, and no loss
 * shown before the first step. */
static void test_tty(void) {
  char logs_dir[300], cmd[1024], typescript[300];
  snprintf(logs_dir, sizeof logs_dir, "%s/tty-logs", tmp);
  snprintf(typescript, sizeof typescript, "%s/typescript", tmp);
  snprintf(cmd, sizeof cmd,
           "%s run --nproc 2 --model " MODEL " --seq-len 32 --steps 300 --global-batch 24 --micro-batch 2 "
           "--log-dir %s --timeout-ms 200000",
           newt_bin, logs_dir);
  const char *argv[] = {"script", "-qec", cmd, typescript, NULL};
  char *out = NULL;
  int rc = run_capture(argv, 240000, &out);
  T_CHECK_MSG(rc == 0, "newt run under script exited %d:\n%s", rc, out ? out : "");
  char *t = NULL;
  size_t len = 0;
  T_OK(newt_fs_read_all(typescript, 64 << 20, &t, &len));
  if (t) {
    T_CHECK_MSG(strstr(t, "\r\033[Kstep "), "no line refreshed in place:\n%s", t);
    T_CHECK_MSG(strstr(t, "%) | loss "), "no percentage and loss in the live line");
    T_CHECK_MSG(strstr(t, ", ETA "), "no ETA in the live line");
    T_CHECK_MSG(!strstr(t, "newt run: step "), "plain lines on a terminal");
    for (const char *p = strstr(t, "starting"); p; p = strstr(p + 1, "starting")) {
      const char *end = strchr(p, '\r');
      T_CHECK_MSG(!end || !memmem(p, (size_t)(end - p), "loss", 4), "a loss before the first step");
    }
  }
  free(t);
  free(out);
}

/* --- stop: spares said, Ctrl-C --------------------------------------------------------------- */

/* Waits (bounded) until the file holds needle; returns its text (malloc'd) or NULL. */
static char *wait_for_text(const char *path, const char *needle, int64_t timeout_ms) {
  newt_deadline_t d = newt_deadline_in_ms(timeout_ms);
  for (;;) {
    char *t = NULL;
    size_t n = 0;
    if (newt_fs_read_all(path, 64 << 20, &t, &n) == NEWT_OK && strstr(t, needle)) return t;
    if (newt_deadline_passed(d)) {
      T_FAIL("%s never said \"%s\":\n%s", path, needle, t ? t : "(nothing)");
      free(t);
      return NULL;
    }
    free(t);
    newt_sleep_ms(100);
  }
}

/* Processes whose command line names the job (every process `newt run` started does). */
static int processes_of(const char *job) {
  int n = 0;
  DIR *d = opendir("/proc");
  for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char path[300], *t = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
    if (newt_fs_read_all(path, 1 << 16, &t, &len) != NEWT_OK) continue;
    for (size_t i = 0; i < len; i++)
      if (!t[i]) t[i] = ' ';
    n += len && memmem(t, len, job, strlen(job)) != NULL;
    free(t);
  }
  if (d) closedir(d);
  return n;
}

static void test_stop(void) {
  rdzv_etcd_server_opts so = {0};
  T_OK(rdzv_etcd_server_start(&so, &etcd));
  if (!etcd) return;
  const char *url = rdzv_etcd_server_url(etcd);
  char job[64], logs_dir[300], out_path[300], summary[400], steps[400], events[400], page[400];
  snprintf(job, sizeof job, "ux-stop-%d", (int)getpid());
  snprintf(logs_dir, sizeof logs_dir, "%s/stop-logs", tmp);
  snprintf(out_path, sizeof out_path, "%s/stop.out", tmp);
  snprintf(summary, sizeof summary, "%s/summary.json", logs_dir);
  snprintf(steps, sizeof steps, "%s/steps.jsonl", logs_dir);
  snprintf(events, sizeof events, "%s/events.jsonl", logs_dir);
  snprintf(page, sizeof page, "%s/report.html", logs_dir);
  /* at most two data-parallel ranks: the two joiners make no larger layout */
  const char *runv[] = {newt_bin, "run", "--etcd", url, "--job", job, "--nproc", "2", "--model", MODEL, "--seq-len",
                        "32", "--steps", "1000000", "--global-batch", "8", "--micro-batch", "4", "--dp-max", "2", "--chaos",
                        "join:2@step=5,kill:worker:2@step=10", "--log-dir", logs_dir, "--timeout-ms", "600000", NULL};
  newt_spawn_opts rso = {.log_path = out_path, .die_with_parent = 1, .new_session = 1}; /* its own group, as a shell's job */
  pid_t run = -1;
  T_OK(newt_proc_spawn(runv, &rso, &run));
  if (run < 0) return;
  char *t = wait_for_text(out_path, "chaos: kill:worker:2@step=10 lands on w2, a spare of plan 1", 180000);
  free(t);
  /* the other joiner, as `newt status` shows it: a spare, and why */
  const char *status_json[] = {newt_bin, "status", "--etcd", url, "--job", job, "--json", NULL};
  newt_deadline_t d = newt_deadline_in_ms(180000);
  int seen = 0;
  char *out = NULL;
  while (!seen && !newt_deadline_passed(d)) {
    free(out);
    out = NULL;
    if (run_capture(status_json, 30000, &out) == 0 && out) {
      cJSON *j = NULL;
      if (newt_json_parse(out, strlen(out), "status", &j) == NEWT_OK) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(j, "spares");
        for (const cJSON *x = sp ? sp->child : NULL; x; x = x->next) {
          const cJSON *w = cJSON_GetObjectItemCaseSensitive(x, "worker"), *why = cJSON_GetObjectItemCaseSensitive(x, "why");
          seen |= cJSON_IsString(w) && strcmp(w->valuestring, "w3") == 0 && cJSON_IsString(why) &&
                  strstr(why->valuestring, "spec.parallel.dp_max caps data parallelism at 2");
        }
        cJSON_Delete(j);
      }
    }
    if (!seen) newt_sleep_ms(200);
  }
  T_CHECK_MSG(seen, "newt status never listed w3 as a spare with the reason:\n%s", out ? out : "");
  free(out);
  const char *status_text[] = {newt_bin, "status", "--etcd", url, "--job", job, NULL};
  out = NULL;
  T_CHECK(run_capture(status_text, 30000, &out) == 0);
  /* the killed spare may still be registered (its lease runs out within its TTL): the count is 1 or 2 */
  T_CHECK_MSG(out && strstr(out, "): registered, not training\n") &&
                  strstr(out, "  w3                   spec.parallel.dp_max caps data parallelism at 2\n") &&
                  strstr(out, "joined and stay"),
              "newt status does not show the spare and its event:\n%s", out ? out : "");
  free(out);
  t = wait_for_text(out_path, " joined and stay", 1000);
  T_CHECK_MSG(t && strstr(t, "w3"), "newt run does not name the spare w3:\n%s", t ? t : "");
  free(t);

  /* Ctrl-C: SIGINT to the run's process group, as a terminal sends it */
  T_CHECK(kill(-run, SIGINT) == 0);
  int st = 0;
  T_CHECK_MSG(newt_proc_wait(run, 60000, &st) == NEWT_OK, "newt run did not end after SIGINT");
  T_CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 130, "newt run after SIGINT: status 0x%x, expected exit 130", st);
  T_CHECK_MSG(processes_of(job) == 0, "%d processes of the run are left after it ended", processes_of(job));
  size_t len = 0;
  t = NULL;
  T_OK(newt_fs_read_all(out_path, 64 << 20, &t, &len));
  if (t) {
    T_CHECK_MSG(strstr(t, "newt run: interrupted by SIGINT at step "), "no word of the interruption:\n%s", t);
    T_CHECK_MSG(!strstr(t, "newt report"), "a report is offered for an interrupted run:\n%s", t);
    T_CHECK_MSG(!strstr(t, "still running after"), "a process had to be waited for:\n%s", t);
  }
  free(t);
  t = NULL;
  T_OK(newt_fs_read_all(summary, 1 << 20, &t, &len));
  cJSON *j = NULL;
  if (t && newt_json_parse(t, len, "summary", &j) == NEWT_OK) {
    const cJSON *oc = cJSON_GetObjectItemCaseSensitive(j, "outcome"), *why = cJSON_GetObjectItemCaseSensitive(j, "reason");
    T_CHECK_MSG(cJSON_IsString(oc) && strcmp(oc->valuestring, "interrupted") == 0, "summary outcome:\n%s", t);
    T_CHECK_MSG(cJSON_IsString(why) && strstr(why->valuestring, "interrupted by SIGINT at step"), "summary reason:\n%s", t);
    T_CHECK_MSG(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "done")), "summary done:\n%s", t);
    cJSON_Delete(j);
  } else {
    T_FAIL("the summary %s does not read:\n%s", summary, t ? t : "");
  }
  free(t);
  job_step *sl = NULL;
  size_t ns = 0, torn = 0;
  T_OK(job_steplog_read(steps, &sl, &ns, &torn));
  T_CHECK_MSG(ns > 10, "the step log has %zu steps", ns);
  free(sl);
  job_event *ev = NULL;
  size_t ne = 0;
  T_OK(job_eventlog_read(events, &ev, &ne, &torn));
  int spare_events = 0;
  for (size_t i = 0; i < ne; i++) spare_events += ev[i].type == JOB_EV_SPARE;
  T_CHECK_MSG(spare_events >= 1, "the event log has no spare event (%zu events)", ne);
  job_eventlog_free(ev, ne);

  /* the report of the interrupted run: it says so, and shows the spares */
  const char *report[] = {newt_bin, "report", logs_dir, NULL};
  out = NULL;
  T_CHECK(run_capture(report, 60000, &out) == 0);
  free(out);
  char *html = NULL;
  T_OK(newt_fs_read_all(page, 64 << 20, &html, &len));
  if (html) {
    T_CHECK_MSG(strstr(html, "interrupted by SIGINT at step"), "the report does not say the run was interrupted");
    T_CHECK_MSG(strstr(html, "class=\"spare-note\"") && strstr(html, "spec.parallel.dp_max caps data parallelism at 2"),
                "the report does not list the spares and why");
    T_CHECK_MSG(strstr(html, "<polyline class=\"workers\""), "the report does not draw the registered workers");
  }
  free(html);
}

/* --- report: rank speeds ---------------------------------------------------------------------- */

#define T0 1700000000000ull

/* Steps 1..30 of 3 data-parallel ranks: generation 2 (a crash) from step 6, 3 (a rebalance)
 * from step 11, 4 (another) from step 21. With speeds: dp 1 slow until the first rebalance and
 * a little after it, dp 2 below the median near the end. */
static void write_speed_steps(const char *path, int speeds) {
  int fd = -1;
  T_OK(job_runlog_open(path, 1, &fd));
  for (int64_t k = 1; k <= 30; k++) {
    job_step s = {.step = k, .loss = 4.0 - 0.05 * (double)k, .lr = 0.01, .tokens_per_s = 1000, .world = 3, .dp = 3,
                  .generation = k <= 5 ? 1 : k <= 10 ? 2 : k <= 20 ? 3 : 4, .t_ms = T0 + 100 * (uint64_t)k};
    if (speeds) {
      s.sample_us = k <= 10 ? 100 : 120;
      if (k >= 3 && k <= 14) s.slow[s.nslow++] = (struct job_slow){.dp = 1, .us = k <= 10 ? 400 : 260};
      if (k >= 25) s.slow[s.nslow++] = (struct job_slow){.dp = 2, .us = 40};
    }
    T_OK(job_steplog_append(fd, &s));
  }
  close(fd);
}

static void add_plan(int fd, int64_t gen, const char *cause, const char *why, int64_t step) {
  job_event e = {.type = JOB_EV_PLAN, .t_ms = T0 + 100 * (uint64_t)step + 10, .generation = gen, .world = 3, .dp = 3};
  snprintf(e.cause, sizeof e.cause, "%s", cause);
  snprintf(e.why, sizeof e.why, "%s", why);
  T_OK(job_eventlog_append(fd, &e));
  if (gen == 1) return;
  uint64_t t = e.t_ms;
  job_event r = {.type = JOB_EV_RECOVERED, .t_ms = t + 50, .generation = gen, .world = 3, .t_trigger = t - 5,
                 .t_detect = t - 5, .t_plan = t, .t_comm = t + 10, .t_restore = t + 20, .t_step = t + 50,
                 .restore_step = step, .fault_step = step};
  snprintf(r.cause, sizeof r.cause, "%s", cause);
  snprintf(r.restore, sizeof r.restore, "memory");
  T_OK(job_eventlog_append(fd, &r));
}

static char *report_of(const char *dir, int speeds) {
  char path[512];
  T_CHECK(mkdir(dir, 0700) == 0);
  snprintf(path, sizeof path, "%s/steps.jsonl", dir);
  write_speed_steps(path, speeds);
  snprintf(path, sizeof path, "%s/events.jsonl", dir);
  int fd = -1;
  T_OK(job_runlog_open(path, 1, &fd));
  add_plan(fd, 1, "initial", "", 0);
  add_plan(fd, 2, "crash", "", 5);
  add_plan(fd, 3, "rebalance", "samples per step by measured speed: w0 10, w1 4, w2 10", 10);
  add_plan(fd, 4, "rebalance", "samples per step by measured speed: w0 9, w1 6, w2 9", 20);
  close(fd);
  char *out = NULL, *html = NULL;
  size_t n = 0;
  const char *argv[] = {newt_bin, "report", dir, NULL};
  int rc = run_capture(argv, 30000, &out);
  T_CHECK_MSG(rc == 0, "newt report %s exited %d:\n%s", dir, rc, out ? out : "");
  free(out);
  snprintf(path, sizeof path, "%s/report.html", dir);
  T_OK(newt_fs_read_all(path, 64 << 20, &html, &n));
  return html;
}

static void test_report_speeds(void) {
  char dir[300];
  snprintf(dir, sizeof dir, "%s/speeds", tmp);
  char *html = report_of(dir, 1);
  const char *chart = html ? strstr(html, "id=\"speed-chart\"") : NULL;
  T_CHECK_MSG(chart, "no chart of rank speeds in %s/report.html", dir);
  if (chart) {
    T_CHECK_MSG(count(chart, "class=\"rebalance-marker\"") == 2, "%zu rebalance markers, 2 rebalances (and a crash)",
                count(chart, "class=\"rebalance-marker\""));
    /* numbered as the table numbers them: the crash is recovery 1 (index 0) */
    T_CHECK(strstr(chart, "class=\"rebalance-marker\" data-recovery=\"1\"") &&
            strstr(chart, "class=\"rebalance-marker\" data-recovery=\"2\""));
    T_CHECK_MSG(count(chart, "<polyline class=\"speed-rank") == 2 && strstr(chart, "data-dp=\"1\"") &&
                    strstr(chart, "data-dp=\"2\""),
                "not one line for each of dp 1 and dp 2");
    T_CHECK(count(chart, "<polyline class=\"speed-median\"") == 1);
    const char *note = strstr(chart, "id=\"speed-note\">");
    T_CHECK_MSG(note && strstr(note, "2 rebalances.") && strstr(note, "generation 4, rebalance") &&
                    strstr(note, "w0 9, w1 6, w2 9") && !strstr(note, "w1 4"),
                "the note does not give 2 rebalances and the last plan's shares: %.300s", note ? note : "(none)");
  }
  /* the crash's marker is on the loss chart, not on the speeds' */
  T_CHECK(html && count(html, "class=\"recovery-marker\"") == 3);
  free(html);
  snprintf(dir, sizeof dir, "%s/no-speeds", tmp);
  html = report_of(dir, 0);
  T_CHECK_MSG(html && strstr(html, "id=\"loss-chart\""), "no report in %s", dir);
  T_CHECK_MSG(html && !strstr(html, "speed-chart") && !strstr(html, "Rank speeds") && !strstr(html, "rebalance-marker"),
              "a run without speeds has a chart of them");
  free(html);
}

int main(int argc, char **argv) {
  newt_bin = getenv("NEWT_BIN");
  source_dir = getenv("NEWT_SOURCE_DIR");
  if (argc != 2 || !newt_bin || !source_dir) {
    fprintf(stderr, "usage: NEWT_BIN=... NEWT_SOURCE_DIR=... test_ux cli|run|tty|stop|report_speeds\n");
    return 2;
  }
  if (!mkdtemp(tmp)) return 2;
  if (strcmp(argv[1], "cli") == 0) {
    T_RUN(test_cli);
    T_RUN(test_refused_before_start);
  }
  else if (strcmp(argv[1], "run") == 0) T_RUN(test_run);
  else if (strcmp(argv[1], "tty") == 0) T_RUN(test_tty);
  else if (strcmp(argv[1], "stop") == 0) T_RUN(test_stop);
  else if (strcmp(argv[1], "report_speeds") == 0) T_RUN(test_report_speeds);
  else T_FAIL("unknown scenario %s", argv[1]);
  if (etcd) rdzv_etcd_server_free(etcd);
  if (!t_failed) newt_fs_rm_rf(tmp);
  else fprintf(stderr, "test_ux: files kept in %s\n", tmp);
  return T_DONE();
}
