/* Unit tests of the summary of `newt run` (launch/summary.c): what launcher_summary_json
 * writes parses back field for field, an earlier summary without the newer fields still
 * reads, a bad field is refused by name, and the summaries of the previous release
 * (fixtures/: written by the writer before issue 28's codec) read back to the values they
 * were written from and are written again to the same bytes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
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
  /* one account of each recovery, the samples trained twice, the saves skipped, and a run
     resumed from an earlier run's checkpoint (issue 35): written when there is something to
     say, read back */
  T_CHECK_MSG(!strstr(text, "samples_repeated") && !strstr(text, "checkpoints_skipped") && !strstr(text, "resumed_from") &&
              !strstr(text, "fault_step"), "%s", text);
  T_CHECK(s.res.nrecoveries < 1 || launcher_recovery_fault_step(&s.res.recoveries[0]) == 100);
  launcher_result_free(&s.res);
  free(text);
  recs[0].fault_step = 104;
  recs[0].steps_lost = 4;
  res.samples_repeated = 4 * 24;
  res.ckpts_skipped = 3;
  res.resumed_step = 60;
  snprintf(res.resumed_dir, sizeof res.resumed_dir, "/ck/demo");
  text = launcher_summary_json(&o, &res);
  T_OK(launcher_summary_from_json(text, strlen(text), &s));
  T_CHECK_MSG(s.res.samples_repeated == 96 && s.res.ckpts_skipped == 3 && s.res.resumed_step == 60 &&
              strcmp(s.res.resumed_dir, "/ck/demo") == 0, "%s", text);
  T_CHECK_MSG(s.res.nrecoveries == 2 && s.res.recoveries[0].fault_step == 104 && s.res.recoveries[0].steps_lost == 4 &&
              launcher_recovery_fault_step(&s.res.recoveries[0]) == 104, "%s", text);
  T_CHECK_MSG(strstr(text, "\"resumed_from\":\t{") != NULL, "%s", text);
  /* replicas that disagreed and workers left out: written when there are some, read back */
  T_CHECK(text && !strstr(text, "mismatches") && !strstr(text, "left_out"));
  launcher_result_free(&s.res);
  free(text);
  launcher_mismatch mm = {.step = 20, .back_to = 10, .generation = 1, .t_ms = 1700000000200ull, .action = "rollback",
                          .worker = "w1", .why = "replicas disagree at step 20: wte"};
  char left[1][NEWT_ID_MAX] = {"w2"};
  res.mismatches = &mm;
  res.nmismatches = 1;
  res.left_out = left;
  res.nleft_out = 1;
  text = launcher_summary_json(&o, &res);
  T_OK(launcher_summary_from_json(text, strlen(text), &s));
  T_CHECK(s.res.nmismatches == 1 && s.res.nleft_out == 1);
  if (s.res.nmismatches == 1 && s.res.nleft_out == 1) {
    const launcher_mismatch *m = &s.res.mismatches[0];
    T_CHECK(m->step == 20 && m->back_to == 10 && m->generation == 1 && strcmp(m->action, "rollback") == 0 &&
            strcmp(m->worker, "w1") == 0 && strcmp(m->why, mm.why) == 0 && strcmp(s.res.left_out[0], "w2") == 0);
  }
  launcher_result_free(&s.res);
  free(text);
  /* an action outside the set is refused, naming it */
  const char *bad = "{\"steps\":40,\"final_loss\":3.5,\"generations\":2,\"samples_consumed\":960,\"recoveries\":[],"
                    "\"mismatches\":[{\"step\":20,\"back_to\":10,\"action\":\"shrug\"}]}";
  T_ERR(NEWT_ERR_INVALID, launcher_summary_from_json(bad, strlen(bad), &s));
  T_CHECK_MSG(strstr(newt_errmsg(), "mismatches[0].action") != NULL, "%s", newt_errmsg());
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
  T_CHECK(s.res.etcd_keys == -1 && s.res.t_start_ms == 0 && s.res.nckpts == 0); /* not recorded */
  /* a recovery of an earlier version says no fault_step: it hit at step + steps_lost */
  T_CHECK(s.res.recoveries[0].fault_step == 0 && launcher_recovery_fault_step(&s.res.recoveries[0]) == 0);
  T_CHECK(s.res.samples_repeated == 0 && s.res.ckpts_skipped == 0 && s.res.resumed_step == 0);
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
      {"{\"steps\":1,\"final_loss\":1,\"generations\":1,\"samples_consumed\":1,\"recoveries\":[],"
       "\"resumed_from\":{\"dir\":\"/ck\"}}",
       "summary.resumed_from.step"},
      {"{\"steps\":1,\"final_loss\":1,\"generations\":1,\"samples_consumed\":1,\"samples_repeated\":-24,"
       "\"recoveries\":[]}",
       "summary.samples_repeated"},
      {"[]", "summary"},
      {"{\"steps\":", "summary"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    T_ERR(NEWT_ERR_INVALID, launcher_summary_from_json(bad[i][0], strlen(bad[i][0]), &s));
    T_CHECK_MSG(strstr(newt_errmsg(), bad[i][1]) != NULL, "%s: %s", bad[i][0], newt_errmsg());
  }
}

/* --- the previous release's summaries (fixtures/README.md) -------------------------------- */

static launcher_opts compat_opts(void) {
  launcher_opts o;
  memset(&o, 0, sizeof o);
  spec_defaults(&o.spec, "compat");
  o.spec.steps = 300;
  o.spec.global_batch = 24;
  o.nproc = 4;
  return o;
}

/* The values of fixtures/summary-done.json: a recovery of every kind newt run records. */
static launcher_recovery compat_recs[5] = {
    {.cause = "crash", .fault = "kill:worker:1@step=100", .t_fault = 1700000000100ull, .t_ms = 1700000000100ull,
     .step = 100, .world = 3, .detect_ms = 77, .plan_ms = 19, .comm_ms = 14, .restore_ms = 161, .step_ms = 3,
     .total_ms = 334, .steps_lost = 0, .generation = 2, .restore = "memory", .outage_ms = -1, .pause_ms = -1,
     .resumed_ms = 120, .from_start_ms = -1},
    {.cause = "join", .t_ms = 1700000009000ull, .step = 200, .world = 4, .detect_ms = 1326, .plan_ms = 9,
     .comm_ms = 153, .restore_ms = 239, .step_ms = 73, .total_ms = 1800, .generation = 3, .restore = "peer",
     .outage_ms = -1, .pause_ms = -1, .resumed_ms = -1, .from_start_ms = -1},
    {.cause = "etcd", .fault = "restart:etcd@step=150", .t_fault = 1700000012000ull, .t_ms = 1700000012000ull,
     .step = 150, .world = 4, .detect_ms = 2100, .total_ms = 2450, .restore = "memory", .outage_ms = 2100,
     .pause_ms = 0, .tps_before = 51234.5, .tps_during = 49876.25, .resumed_ms = -1, .from_start_ms = -1},
    {.cause = "coordinator", .fault = "kill:coordinator:leader@step=180", .t_fault = 1700000015000ull,
     .t_ms = 1700000015000ull, .step = 180, .world = 4, .detect_ms = 812, .total_ms = 812, .restore = "memory",
     .outage_ms = -1, .pause_ms = -1, .resumed_ms = -1, .from_start_ms = -1},
    {.cause = "hang", .fault = "stop:worker:2@step=250", .t_fault = 1700000020000ull, .t_ms = 1700000020000ull,
     .step = 248, .world = 3, .detect_ms = 3001, .plan_ms = 12, .comm_ms = 40, .restore_ms = 900, .step_ms = 20,
     .total_ms = 3973, .steps_lost = 2, .generation = 4, .restore = "ckpt", .outage_ms = -1, .pause_ms = -1,
     .resumed_ms = 4100, .from_start_ms = -1}};
static launcher_ckpt compat_ckpts[3] = {{.step = 100, .bytes = 4096, .save_ms = 812, .stall_ms = 3.125},
                                        {.step = 200},
                                        {.step = 300, .bytes = 8192, .stall_ms = 0.5}};

static void compat_paths(launcher_result *res, const char *dir, int files) {
  snprintf(res->log_dir, sizeof res->log_dir, "/tmp/%s", dir);
  if (!files) return;
  snprintf(res->step_log, sizeof res->step_log, "/tmp/%s/steps.jsonl", dir);
  snprintf(res->event_log, sizeof res->event_log, "/tmp/%s/events.jsonl", dir);
}

static launcher_result compat_done(void) {
  launcher_result res = {.done = 1, .steps = 300, .final_loss = 2.1889, .generations = 4, .samples_consumed = 7200,
                         .wall_s = 25.5, .recoveries = compat_recs, .nrecoveries = 5, .t_start_ms = 1699999990000ull,
                         .etcd_keys = 7, .ckpts = compat_ckpts, .nckpts = 3};
  compat_paths(&res, "compat-logs", 1);
  snprintf(res.outcome, sizeof res.outcome, "done");
  return res;
}

/* A failed run: a loss that was not finite (written as 0), etcd's keys unknown. */
static launcher_result compat_failed(void) {
  launcher_result res = {.steps = 41, .final_loss = NAN, .generations = 2, .samples_consumed = 984, .wall_s = 9.75,
                         .t_start_ms = 1699999980000ull, .etcd_keys = -1};
  compat_paths(&res, "failed-logs", 1);
  snprintf(res.failed, sizeof res.failed, "3 crashes in 60 s: the failure budget (spec.fault.max_failures) is spent");
  snprintf(res.outcome, sizeof res.outcome, "failed");
  snprintf(res.reason, sizeof res.reason, "%s", res.failed);
  return res;
}

/* A run that ended before it said how: no outcome (written as error). */
static launcher_result compat_error(void) {
  launcher_result res = {.etcd_keys = -1};
  compat_paths(&res, "error-logs", 0);
  return res;
}

/* The fixture `name` reads back to want (as it reads: a loss not finite as 0, no outcome as
 * error), and want is written to its bytes. */
static void check_compat(const char *name, launcher_result want) {
  char path[1024], *text = NULL;
  size_t len = 0;
  snprintf(path, sizeof path, "%s/tests/launch/fixtures/%s", getenv("NEWT_SOURCE_DIR"), name);
  T_OK(newt_fs_read_all(path, 1 << 20, &text, &len));
  if (!text) return;
  launcher_opts o = compat_opts();
  char *again = launcher_summary_json(&o, &want);
  T_CHECK_MSG(again && strcmp(again, text) == 0, "%s written again:\n%s\nwas:\n%s", name, again ? again : "(null)", text);
  free(again);
  launcher_summary s;
  T_OK(launcher_summary_from_json(text, len, &s));
  free(text);
  if (!isfinite(want.final_loss)) want.final_loss = 0;
  if (!want.outcome[0]) snprintf(want.outcome, sizeof want.outcome, "error");
  const launcher_result *got = &s.res;
  T_CHECK_MSG(strcmp(s.job, "compat") == 0 && s.steps_planned == 300 && s.global_batch == 24 && s.workers == 4,
              "%s: %s %lld %lld %lld", name, s.job, (long long)s.steps_planned, (long long)s.global_batch,
              (long long)s.workers);
  T_CHECK_MSG(got->done == want.done && got->steps == want.steps && got->final_loss == want.final_loss &&
              got->generations == want.generations && got->samples_consumed == want.samples_consumed &&
              got->wall_s == want.wall_s && got->t_start_ms == want.t_start_ms && got->etcd_keys == want.etcd_keys,
              "%s: the run's figures", name);
  T_CHECK_MSG(strcmp(got->log_dir, want.log_dir) == 0 && strcmp(got->step_log, want.step_log) == 0 &&
              strcmp(got->event_log, want.event_log) == 0, "%s: the run's files", name);
  T_CHECK_MSG(strcmp(got->failed, want.failed) == 0 && strcmp(got->outcome, want.outcome) == 0 &&
              strcmp(got->reason, want.reason) == 0, "%s: %s, %s, %s", name, got->failed, got->outcome, got->reason);
  T_CHECK_MSG(got->nrecoveries == want.nrecoveries && got->nckpts == want.nckpts, "%s: %d recoveries, %d checkpoints",
              name, got->nrecoveries, got->nckpts);
  for (int i = 0; i < got->nrecoveries && i < want.nrecoveries; i++)
    T_CHECK_MSG(memcmp(&got->recoveries[i], &want.recoveries[i], sizeof want.recoveries[i]) == 0, "%s: recovery %d",
                name, i);
  for (int i = 0; i < got->nckpts && i < want.nckpts; i++)
    T_CHECK_MSG(memcmp(&got->ckpts[i], &want.ckpts[i], sizeof want.ckpts[i]) == 0, "%s: checkpoint %d", name, i);
  launcher_result_free(&s.res);
}

static void test_previous_release(void) {
  check_compat("summary-done.json", compat_done());
  check_compat("summary-failed.json", compat_failed());
  check_compat("summary-error.json", compat_error());
}

int main(void) {
  if (!getenv("NEWT_SOURCE_DIR")) {
    fprintf(stderr, "NEWT_SOURCE_DIR is not set (ctest sets it): the fixtures are in its tests/launch/fixtures\n");
    return 1;
  }
  T_RUN(test_roundtrip);
  T_RUN(test_old_and_bad);
  T_RUN(test_previous_release);
  return T_DONE();
}
