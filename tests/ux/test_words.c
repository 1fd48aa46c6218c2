/* What a program of one's own says when it goes wrong, where its user looks (issue 38,
 * items 5, 6, 8 and 9). No check times anything: each waits for an end, with a failsafe.
 *
 *   join_wait      newt_join with etcd on a closed loopback port and NEWT_SPEC_WAIT_MS=1000
 *                  ends (it waited forever): an error naming the address and what it tried,
 *                  on stderr and in its termination message
 *   restore_error  `newt run -- ux-prog gap` (parts that leave an element of "W" to no rank):
 *                  the restore's tiling error is in newt run's own output (the worker's line),
 *                  not only in the worker's log
 *   words          a program run outside newt says to run it under `newt run --`, without a
 *                  stray "newt worker :"; a kill -9 is not said to be a worker left out alive;
 *                  `newt bench recovery -- PROGRAM` claims no preset
 *   join_time      a join newt run started: its recovery says the time from the joiner's
 *                  process start beside the job's wait (the console, the summary's
 *                  from_start_ms, the report), never less than it
 *
 * usage: test_words join_wait|restore_error|words|join_time (ctest: ux_<name>). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/json.h"
#include "common/proc.h"
#include "common/sys.h"
#include "rendezvous/etcd_server.h"
#include "test.h"

static char tmp[] = "/tmp/newt-test-words-XXXXXX";
static const char *newt_bin, *prog;
static rdzv_etcd_server *etcd;

/* Runs argv (extra env) with stdout and stderr into *out; the exit status, or -1 when it was
 * still running at the failsafe (killed) or did not start. */
static int run_env(const char *const *argv, const char *const *env, int64_t failsafe_ms, char **out) {
  char path[512];
  static int seq;
  snprintf(path, sizeof path, "%s/out.%d", tmp, seq++);
  newt_spawn_opts so = {.log_path = path, .env = env, .die_with_parent = 1, .new_session = 1};
  pid_t pid;
  *out = NULL;
  if (newt_proc_spawn(argv, &so, &pid) != NEWT_OK) return -1;
  int st = 0, rc = -1;
  if (newt_proc_wait(pid, failsafe_ms, &st) != NEWT_OK) {
    kill(-pid, SIGKILL);
    newt_proc_stop(pid, 1000);
  } else {
    rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  size_t n;
  if (newt_fs_read_all(path, 64 << 20, out, &n) != NEWT_OK) *out = NULL;
  return rc;
}

static char *slurp(const char *path) {
  char *t = NULL;
  size_t n;
  return newt_fs_read_all(path, 64 << 20, &t, &n) == NEWT_OK ? t : NULL;
}

static const char *etcd_url(void) {
  if (!etcd) {
    rdzv_etcd_server_opts so = {0};
    T_OK(rdzv_etcd_server_start(&so, &etcd));
  }
  return etcd ? rdzv_etcd_server_url(etcd) : "http://127.0.0.1:1";
}

/* --- item 5 ----------------------------------------------------------------------------------- */

static void test_join_wait(void) {
  int port = 0;
  T_OK(newt_net_free_port(&port)); /* nothing listens there */
  char ev[128], tl[300], tle[340], addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  snprintf(ev, sizeof ev, "NEWT_ETCD=http://%s", addr);
  snprintf(tl, sizeof tl, "%s/join.end", tmp);
  snprintf(tle, sizeof tle, "NEWT_TERMINATION_LOG=%s", tl);
  const char *env[] = {ev, "NEWT_JOB=ux-wait", "NEWT_SPEC_WAIT_MS=1000", tle, NULL};
  const char *argv[] = {prog, "join", NULL};
  char *out = NULL;
  int rc = run_env(argv, env, 90000, &out); /* a failsafe only */
  T_CHECK_MSG(rc > 0, "newt_join with etcd away did not end (or crashed): rc %d:\n%s", rc, out ? out : "");
  T_CHECK_MSG(out && strstr(out, addr) && strstr(out, "did not answer") && strstr(out, "/newt/ux-wait/spec"),
              "newt_join's error does not name etcd's address (%s) and what it tried:\n%s", addr, out ? out : "");
  char *end = slurp(tl);
  T_CHECK_MSG(end && strstr(end, addr), "the termination message does not name %s: %s", addr, end ? end : "(none)");
  free(end);
  free(out);
}

/* --- item 6 ----------------------------------------------------------------------------------- */

static void test_restore_error(void) {
  char logs[300];
  snprintf(logs, sizeof logs, "%s/gap", tmp);
  const char *argv[] = {newt_bin, "run", "--etcd", etcd_url(), "--job", "ux-gap", "--nproc", "1", "--steps", "4",
                        "--global-batch", "2", "--micro-batch", "1", "--log-dir", logs, "--timeout-ms", "120000", "--",
                        prog, "gap", NULL};
  char *out = NULL;
  int rc = run_env(argv, NULL, 180000, &out);
  T_CHECK_MSG(rc > 0, "newt run of a program whose restore fails exited %d:\n%s", rc, out ? out : "");
  T_CHECK_MSG(out && strstr(out, "w0 exited") && strstr(out, "declared by no rank") && strstr(out, "tensor \"W\""),
              "newt run's output does not carry the worker's tiling error:\n%s", out ? out : "");
  char end[340];
  snprintf(end, sizeof end, "%s/w0.end", logs);
  char *e = slurp(end);
  T_CHECK_MSG(e && strstr(e, "declared by no rank"), "w0's termination message lacks the root cause: %s",
              e ? e : "(none)");
  free(e);
  free(out);
}

/* --- item 8 ----------------------------------------------------------------------------------- */

static int any_log_has(const char *dir, const char *prefix, const char *needle) {
  for (int i = 0; i < 8; i++) {
    char p[400];
    snprintf(p, sizeof p, "%s/%s%d.log", dir, prefix, i);
    char *t = slurp(p);
    int has = t && strstr(t, needle);
    free(t);
    if (has) return 1;
  }
  return 0;
}

static void test_words(void) {
  /* outside newt */
  const char *argv[] = {prog, "join", NULL};
  char *out = NULL;
  int rc = run_env(argv, NULL, 60000, &out);
  T_CHECK_MSG(rc > 0 && out && strstr(out, "newt run -- ") && strstr(out, "newt worker: newt_join: no job") &&
                  !strstr(out, "newt worker :"),
              "a program outside newt exited %d saying:\n%s", rc, out ? out : "");
  free(out);

  /* a kill -9: what the leader knows, not "alive" */
  char logs[300];
  snprintf(logs, sizeof logs, "%s/kill", tmp);
  const char *runv[] = {newt_bin, "run", "--etcd", etcd_url(), "--job", "ux-kill", "--nproc", "3", "--model",
                        "layers=2,channels=64", "--seq-len", "32", "--steps", "120", "--global-batch", "12",
                        "--micro-batch", "2", "--chaos", "kill:worker:1@step=20", "--log-dir", logs, "--timeout-ms",
                        "240000", NULL};
  rc = run_env(runv, NULL, 300000, &out);
  T_CHECK_MSG(rc == 0, "newt run with a kill exited %d:\n%s", rc, out ? out : "");
  free(out);
  T_CHECK_MSG(!any_log_has(logs, "c", "alive (the others lost it"),
              "a coordinator says the killed worker was left out alive; logs in %s", logs);
  T_CHECK_MSG(any_log_has(logs, "c", "w1 is left out of generation") &&
                  any_log_has(logs, "c", "connections to it closed"),
              "no coordinator says what it knows of the killed w1 (its connections closed); logs in %s", logs);

  /* newt bench recovery -- PROGRAM: no preset claimed */
  const char *mlp = getenv("NEWT_MLP");
  T_CHECK_MSG(mlp != NULL, "NEWT_MLP is not set");
  if (!mlp) return;
  const char *bench[] = {newt_bin, "bench", "recovery", "--runs", "1", "--nproc", "3", "--global-batch", "12",
                         "--steps", "2000", "--kill-at", "10", "--", mlp, "--hidden", "64", NULL};
  rc = run_env(bench, NULL, 240000, &out);
  T_CHECK_MSG(rc == 0 && out && strstr(out, "\"preset\":null") && !strstr(out, "\"preset\":\""),
              "newt bench recovery -- newt-mlp exited %d, its lines' preset:\n%s", rc, out ? out : "");
  free(out);
}

/* --- item 9 ----------------------------------------------------------------------------------- */

static void test_join_time(void) {
  char logs[300], summary[340], page[340];
  snprintf(logs, sizeof logs, "%s/join", tmp);
  snprintf(summary, sizeof summary, "%s/summary.json", logs);
  snprintf(page, sizeof page, "%s/report.html", logs);
  const char *runv[] = {newt_bin, "run", "--etcd", etcd_url(), "--job", "ux-join", "--nproc", "2", "--model",
                        "layers=2,channels=64", "--seq-len", "32", "--steps", "200", "--global-batch", "12",
                        "--micro-batch", "2", "--chaos", "join:1@step=20", "--log-dir", logs, "--timeout-ms",
                        "240000", NULL};
  char *out = NULL;
  int rc = run_env(runv, NULL, 300000, &out);
  T_CHECK_MSG(rc == 0, "newt run with a join exited %d:\n%s", rc, out ? out : "");
  T_CHECK_MSG(out && strstr(out, "recovered from join in") && strstr(out, "ms from the joiner's process start"),
              "newt run's line of the join lacks the time from the joiner's start:\n%s", out ? out : "");
  free(out);
  char *text = slurp(summary);
  cJSON *j = NULL;
  int joins = 0;
  if (text && newt_json_parse(text, strlen(text), "summary", &j) == NEWT_OK) {
    const cJSON *recs = cJSON_GetObjectItemCaseSensitive(j, "recoveries");
    for (const cJSON *r = recs ? recs->child : NULL; r; r = r->next) {
      const char *cause = cJSON_GetStringValue(cJSON_GetObjectItem(r, "cause"));
      if (!cause || strcmp(cause, "join") != 0) continue;
      joins++;
      const cJSON *total = cJSON_GetObjectItem(r, "total_ms"), *start = cJSON_GetObjectItem(r, "from_start_ms");
      T_CHECK_MSG(cJSON_IsNumber(total) && cJSON_IsNumber(start) && start->valuedouble >= total->valuedouble,
                  "the join's recovery has no from_start_ms at least its total_ms:\n%s", text);
    }
    cJSON_Delete(j);
  }
  T_CHECK_MSG(joins == 1, "%d join recoveries in the summary:\n%s", joins, text ? text : "(none)");
  free(text);
  const char *report[] = {newt_bin, "report", logs, NULL};
  rc = run_env(report, NULL, 60000, &out);
  free(out);
  char *html = slurp(page);
  T_CHECK_MSG(rc == 0 && html && strstr(html, "ms from the joiner's process start"),
              "newt report (exit %d) does not show the join's time from the joiner's start", rc);
  free(html);
}

int main(int argc, char **argv) {
  newt_bin = getenv("NEWT_BIN");
  prog = getenv("NEWT_UX_PROG");
  if (argc != 2 || !newt_bin || !prog) {
    fprintf(stderr, "usage: NEWT_BIN=... NEWT_UX_PROG=... test_words join_wait|restore_error|words|join_time\n");
    return 2;
  }
  unsetenv("NEWT_JOB");
  unsetenv("NEWT_ETCD");
  if (!mkdtemp(tmp)) return 2;
  if (strcmp(argv[1], "join_wait") == 0) T_RUN(test_join_wait);
  else if (strcmp(argv[1], "restore_error") == 0) T_RUN(test_restore_error);
  else if (strcmp(argv[1], "words") == 0) T_RUN(test_words);
  else if (strcmp(argv[1], "join_time") == 0) T_RUN(test_join_time);
  else T_FAIL("unknown scenario %s", argv[1]);
  if (etcd) rdzv_etcd_server_free(etcd);
  if (!t_failed) newt_fs_rm_rf(tmp);
  else fprintf(stderr, "test_words: files kept in %s\n", tmp);
  return T_DONE();
}
