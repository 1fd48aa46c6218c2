/* Unit tests of the summary of `newt run` read back (launch/summary.c): what
 * launcher_summary_json writes parses back field for field, an earlier summary without the
 * newer fields still reads, and a bad field is refused by name. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "launch/launcher.h"
#include "test.h"

static void test_roundtrip(void) {
  launcher_opts o;
  memset(&o, 0, sizeof o);
  spec_defaults(&o.spec, "demo");
  o.spec.steps = 300;
  o.nproc = 4;
  launcher_recovery recs[2] = {
      {.cause = "crash", .fault = "kill:worker:1@step=100", .t_fault = 1700000000100ull, .t_ms = 1700000000100ull,
       .step = 100, .world = 3, .detect_ms = 77, .plan_ms = 19, .comm_ms = 14, .restore_ms = 161, .step_ms = 3,
       .total_ms = 334,
       .generation = 2, .restore = "memory"},
      {.cause = "join", .t_ms = 1700000009000ull, .step = 200, .world = 4, .detect_ms = 1326, .plan_ms = 9,
       .comm_ms = 153, .restore_ms = 239, .total_ms = 1800, .generation = 3, .restore = "peer"}};
  launcher_ckpt cks[2] = {{.step = 100, .bytes = 4096, .save_ms = 812, .stall_ms = 3.125}, {.step = 200}};
  launcher_result res = {.done = 1, .steps = 300, .final_loss = 2.1889, .generations = 3, .samples_consumed = 7200,
                         .wall_s = 25.5, .recoveries = recs, .nrecoveries = 2, .t_start_ms = 1699999990000ull,
                         .ckpts = cks, .nckpts = 2};
  snprintf(res.log_dir, sizeof res.log_dir, "/tmp/demo-logs");
  snprintf(res.step_log, sizeof res.step_log, "/tmp/demo-logs/steps.jsonl");
  char *text = launcher_summary_json(&o, &res);
  T_CHECK(text != NULL);
  launcher_summary s;
  T_OK(launcher_summary_from_json(text, strlen(text), &s));
  T_CHECK(strcmp(s.job, "demo") == 0 && s.steps_planned == 300 && s.workers == 4);
  T_CHECK(s.res.done && s.res.steps == 300 && s.res.final_loss == 2.1889 && s.res.generations == 3);
  T_CHECK(s.res.samples_consumed == 7200 && s.res.t_start_ms == 1699999990000ull);
  T_CHECK(strcmp(s.res.step_log, "/tmp/demo-logs/steps.jsonl") == 0 && strcmp(s.res.log_dir, "/tmp/demo-logs") == 0);
  T_CHECK(s.res.nrecoveries == 2);
  if (s.res.nrecoveries == 2) {
    const launcher_recovery *a = &s.res.recoveries[0], *b = &s.res.recoveries[1];
    T_CHECK(strcmp(a->cause, "crash") == 0 && strcmp(a->fault, "kill:worker:1@step=100") == 0 && a->t_fault);
    T_CHECK(a->step == 100 && a->world == 3 && a->detect_ms == 77 && a->plan_ms == 19 && a->comm_ms == 14 &&
            a->restore_ms == 161 && a->total_ms == 334 && a->generation == 2 && strcmp(a->restore, "memory") == 0);
    T_CHECK(a->t_ms == 1700000000100ull);
    T_CHECK(strcmp(b->cause, "join") == 0 && !b->fault[0] && !b->t_fault && b->total_ms == 1800);
    T_CHECK_MSG(a->step_ms == 3, "step_ms %lld", (long long)a->step_ms); /* the first step after the restore */
  }
  T_CHECK(s.res.nckpts == 2);
  if (s.res.nckpts == 2)
    T_CHECK(memcmp(&s.res.ckpts[0], &cks[0], sizeof cks[0]) == 0 && memcmp(&s.res.ckpts[1], &cks[1], sizeof cks[1]) == 0);
  launcher_result_free(&s.res);
  free(text);
}

static void test_old_and_bad(void) {
  launcher_summary s;
  const char *old = "{\"steps\":40,\"final_loss\":3.5,\"generations\":2,\"samples_consumed\":960,"
                    "\"recoveries\":[{\"cause\":\"crash\",\"detect_ms\":1,\"plan_ms\":2,\"comm_ms\":3,"
                    "\"restore_ms\":4,\"total_ms\":12,\"steps_lost\":0,\"injected\":true}]}";
  T_OK(launcher_summary_from_json(old, strlen(old), &s));
  T_CHECK(s.res.nrecoveries == 1 && s.res.recoveries[0].total_ms == 12 && s.res.recoveries[0].t_fault);
  T_CHECK(s.res.recoveries[0].step_ms == 2); /* written before it was: what the other phases leave of the total */
  T_CHECK(strcmp(s.res.outcome, "error") == 0 && !s.res.reason[0]); /* neither done nor failed, no outcome */
  launcher_result_free(&s.res);
  /* how a run ended, read back */
  launcher_opts o;
  memset(&o, 0, sizeof o);
  spec_defaults(&o.spec, "stopped");
  launcher_result res = {.steps = 37, .final_loss = 5.29, .generations = 1};
  snprintf(res.outcome, sizeof res.outcome, "interrupted");
  snprintf(res.reason, sizeof res.reason, "interrupted by SIGINT at step 37");
  char *text = launcher_summary_json(&o, &res);
  T_OK(launcher_summary_from_json(text, strlen(text), &s));
  T_CHECK_MSG(!s.res.done && strcmp(s.res.outcome, "interrupted") == 0 &&
              strcmp(s.res.reason, "interrupted by SIGINT at step 37") == 0, "%s", text);
  launcher_result_free(&s.res);
  free(text);
  const char *bad[][2] = {
      {"{\"final_loss\":1,\"generations\":1,\"samples_consumed\":1,\"recoveries\":[]}", "summary.steps"},
      {"{\"steps\":1,\"final_loss\":1,\"generations\":1,\"samples_consumed\":1,\"recoveries\":[{\"cause\":\"crash\","
       "\"detect_ms\":1,\"plan_ms\":2,\"comm_ms\":-3,\"restore_ms\":4,\"total_ms\":5}]}",
       "summary.recoveries[0].comm_ms"},
      {"{\"steps\":1,\"final_loss\":1,\"generations\":1,\"samples_consumed\":1,\"recoveries\":[3]}",
       "summary.recoveries[0]"},
      {"{\"steps\":1,\"final_loss\":1,\"generations\":1,\"samples_consumed\":1,\"recoveries\":[],"
       "\"checkpoints\":[{\"step\":1,\"stall_ms\":-2}]}",
       "summary.checkpoints[0].stall_ms"},
      {"{\"steps\":1,\"final_loss\":1,\"generations\":1,\"samples_consumed\":1,\"recoveries\":[],"
       "\"outcome\":\"vanished\"}",
       "summary.outcome"},
      {"[]", "summary"},
      {"{\"steps\":", "summary"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    T_ERR(NEWT_ERR_INVALID, launcher_summary_from_json(bad[i][0], strlen(bad[i][0]), &s));
    T_CHECK_MSG(strstr(newt_errmsg(), bad[i][1]) != NULL, "%s: %s", bad[i][0], newt_errmsg());
  }
}

int main(void) {
  T_RUN(test_roundtrip);
  T_RUN(test_old_and_bad);
  return T_DONE();
}
