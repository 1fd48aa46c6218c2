/* Unit tests of the run's files (job/runlog.h): a step line round trip through its codec
 * (and the fixed order of its first fields, which scripts read), bad lines refused naming
 * the file, line and field, a torn last line skipped, two writers appending to one file
 * without interleaving, and the stitching of a log whose steps were rolled back and done
 * again, or written late by a stale rank 0. */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "job/runlog.h"
#include "test.h"

static char dir[] = "/tmp/newt-test-runlog-XXXXXX";

static job_step step_of(int64_t step, uint64_t gen, double loss) {
  job_step s = {.step = step, .loss = loss, .lr = 1e-3, .grad_norm = 0.75, .tokens_per_s = 12345.5, .world = 4, .dp = 4,
                .generation = gen, .t_ms = 1700000000000ull + (uint64_t)step * 100, .ckpt = step >= 10 ? 10 : 0};
  return s;
}

static void test_step_codec(void) {
  job_step s = step_of(7, 2, 2.718281828459045), back;
  char *text = job_step_to_json(&s);
  T_CHECK(text != NULL);
  T_CHECK_MSG(strncmp(text, "{\"step\":7,\"loss\":2.71828182845904", 33) == 0 && strstr(text, ",\"lr\":0.001,"), "%s",
              text);
  T_OK(job_step_from_json(text, strlen(text), &back));
  T_CHECK_MSG(strstr(text, ",\"grad_norm\":0.75,"), "%s", text);
  T_CHECK(back.step == 7 && back.loss == s.loss && back.lr == s.lr && back.grad_norm == 0.75 &&
          back.tokens_per_s == s.tokens_per_s &&
          back.world == 4 && back.dp == 4 && back.generation == 2 && back.t_ms == s.t_ms && back.ckpt == 0);
  free(text);
  s.loss = NAN;
  text = job_step_to_json(&s);
  T_CHECK(text && strstr(text, "\"loss\":null"));
  T_OK(job_step_from_json(text, strlen(text), &back));
  T_CHECK(isnan(back.loss));
  free(text);
  /* the lines of an older `newt train --log`: step, loss, lr */
  const char *old = "{\"step\":3,\"loss\":4.5,\"lr\":0.001}";
  T_OK(job_step_from_json(old, strlen(old), &back));
  T_CHECK(back.step == 3 && back.loss == 4.5 && back.generation == 1 && back.world == 1 && back.grad_norm == 0);
  const char *bad[][2] = {{"{\"loss\":1}", "step.step"},
                          {"{\"step\":0,\"loss\":1}", "step.step"},
                          {"{\"step\":1,\"loss\":\"x\"}", "step.loss"},
                          {"{\"step\":1,\"loss\":1,\"world\":0}", "step.world"},
                          {"{\"step\":1,\"loss\":1,\"t_ms\":-5}", "step.t_ms"},
                          {"{\"step\":1,\"loss\":1,\"grad_norm\":-2}", "step.grad_norm"},
                          {"[1,2]", "step"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    T_ERR(NEWT_ERR_INVALID, job_step_from_json(bad[i][0], strlen(bad[i][0]), &back));
    T_CHECK_MSG(strstr(newt_errmsg(), bad[i][1]) != NULL, "%s: %s", bad[i][0], newt_errmsg());
  }
}

static void test_read_and_torn(void) {
  char path[256];
  snprintf(path, sizeof path, "%s/steps.jsonl", dir);
  int fd = -1;
  T_OK(job_runlog_open(path, 1, &fd));
  for (int64_t i = 1; i <= 5; i++) {
    job_step s = step_of(i, 1, 10.0 / (double)i);
    T_OK(job_steplog_append(fd, &s));
  }
  T_CHECK(write(fd, "{\"step\":6,\"lo", 13) == 13); /* a writer killed mid-line */
  close(fd);
  job_step *s = NULL;
  size_t n = 0, torn = 0;
  T_OK(job_steplog_read(path, &s, &n, &torn));
  T_CHECK_MSG(n == 5 && torn == 1, "%zu lines, %zu torn", n, torn);
  T_CHECK(s && s[4].step == 5 && s[4].loss == 2.0);
  free(s);
  /* a bad line in the middle is refused, naming the file, the line and the field */
  char bad[256];
  snprintf(bad, sizeof bad, "%s/bad.jsonl", dir);
  const char *text = "{\"step\":1,\"loss\":1}\n{\"step\":2,\"loss\":true}\n{\"step\":3,\"loss\":1}\n";
  T_OK(newt_fs_write_atomic(bad, text, strlen(text)));
  T_ERR(NEWT_ERR_INVALID, job_steplog_read(bad, &s, &n, NULL));
  T_CHECK_MSG(strstr(newt_errmsg(), "bad.jsonl line 2") && strstr(newt_errmsg(), "step.loss"), "%s", newt_errmsg());
  T_ERR(NEWT_ERR_NOTFOUND, job_steplog_read("/nonexistent/steps.jsonl", &s, &n, NULL));
}

/* Two processes append 2000 lines each to one file: every line comes back whole. */
static void test_two_writers(void) {
  char path[256];
  snprintf(path, sizeof path, "%s/two.jsonl", dir);
  int fd = -1;
  T_OK(job_runlog_open(path, 1, &fd));
  close(fd);
  pid_t pids[2];
  for (int w = 0; w < 2; w++) {
    pids[w] = fork();
    if (pids[w] == 0) {
      int f = -1;
      if (job_runlog_open(path, 0, &f) != NEWT_OK) _exit(1);
      for (int64_t i = 1; i <= 2000; i++) {
        job_step s = step_of(i, (uint64_t)w + 1, 1.0);
        if (job_steplog_append(f, &s) != NEWT_OK) _exit(1);
      }
      _exit(0);
    }
  }
  for (int w = 0; w < 2; w++) {
    int st = 0;
    waitpid(pids[w], &st, 0);
    T_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  job_step *s = NULL;
  size_t n = 0, torn = 0;
  T_OK(job_steplog_read(path, &s, &n, &torn));
  T_CHECK_MSG(n == 4000 && torn == 0, "%zu lines, %zu torn", n, torn);
  free(s);
}

static void test_stitch(void) {
  /* generation 1 did steps 1..6; a crash rolled back step 6, generation 2 did 6..8; a
     stale rank 0 of generation 1 woke up and wrote step 7 late; generation 2 wrote step 8
     twice (the later one wins) */
  job_step in[] = {step_of(1, 1, 6), step_of(2, 1, 5), step_of(3, 1, 4), step_of(4, 1, 3), step_of(5, 1, 2),
                   step_of(6, 1, 1.5), step_of(6, 2, 1.4), step_of(7, 2, 1.3), step_of(7, 1, 9),
                   step_of(8, 2, 1.2), step_of(8, 2, 1.1)};
  size_t n = sizeof in / sizeof in[0], redone = 0;
  T_OK(job_steplog_stitch(in, &n, &redone));
  T_CHECK_MSG(n == 8, "%zu steps", n);
  for (size_t i = 0; i < n; i++) T_CHECK(in[i].step == (int64_t)i + 1);
  T_CHECK(in[5].generation == 2 && in[5].loss == 1.4);
  T_CHECK_MSG(in[6].loss == 1.3, "step 7: the stale generation's line won (loss %g)", in[6].loss);
  T_CHECK(in[7].loss == 1.1);
  T_CHECK_MSG(redone == 2, "%zu steps redone", redone);
  size_t zero = 0;
  T_OK(job_steplog_stitch(in, &zero, NULL));
  T_CHECK(zero == 0);
}

static void test_event_log(void) {
  char path[256];
  snprintf(path, sizeof path, "%s/events.jsonl", dir);
  int fd = -1;
  T_OK(job_runlog_open(path, 1, &fd));
  job_event e = {.type = JOB_EV_PLAN, .t_ms = 1700000000123ull, .generation = 2, .world = 3, .dp = 3};
  snprintf(e.cause, sizeof e.cause, "crash");
  snprintf(e.coordinator, sizeof e.coordinator, "c0");
  T_OK(job_eventlog_append(fd, &e));
  job_event r = {.type = JOB_EV_RECOVERED, .t_ms = 1700000000500ull, .generation = 2, .world = 3,
                 .t_trigger = 1, .t_detect = 2, .t_plan = 3, .t_comm = 4, .t_restore = 5, .t_step = 6,
                 .restore_step = 40};
  snprintf(r.cause, sizeof r.cause, "crash");
  snprintf(r.restore, sizeof r.restore, "memory");
  T_OK(job_eventlog_append(fd, &r));
  close(fd);
  job_event *ev = NULL;
  size_t n = 0;
  T_OK(job_eventlog_read(path, &ev, &n, NULL));
  T_CHECK(n == 2 && ev[0].type == JOB_EV_PLAN && ev[0].world == 3 && strcmp(ev[0].cause, "crash") == 0);
  T_CHECK(n == 2 && ev[1].type == JOB_EV_RECOVERED && ev[1].restore_step == 40 && ev[1].t_step == 6);
  job_eventlog_free(ev, n);
}

int main(void) {
  T_CHECK(mkdtemp(dir) != NULL);
  T_RUN(test_step_codec);
  T_RUN(test_read_and_torn);
  T_RUN(test_two_writers);
  T_RUN(test_stitch);
  T_RUN(test_event_log);
  newt_fs_rm_rf(dir);
  return T_DONE();
}
