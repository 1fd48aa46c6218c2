/* Unit tests of the job's records in etcd (job/records.h): keys built and parsed back, each
 * record's writer read back by its parser, and malformed input refused with the record and
 * field named. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job/records.h"
#include "job/spec.h"
#include "test.h"

/* The parser must refuse text with NEWT_ERR_INVALID and an error naming `needle`. */
#define EXPECT_REJECT(parse, type, text, needle)                                                               \
  do {                                                                                                         \
    type t_v_;                                                                                                 \
    const char *t_s_ = (text);                                                                                 \
    newt_result_t t_r_ = parse(t_s_, strlen(t_s_), &t_v_);                                                    \
    T_CHECK_MSG(t_r_ == NEWT_ERR_INVALID, "%s accepted %s", #parse, t_s_);                                     \
    T_CHECK_MSG(t_r_ != NEWT_ERR_INVALID || strstr(newt_errmsg(), (needle)) != NULL,                           \
                "%s: error \"%s\" does not name \"%s\"", t_s_, newt_errmsg(), (needle));                        \
  } while (0)

static void test_keys(void) {
  char key[256];
  uint64_t g = 0;
  const char *id = NULL;
  T_OK(job_key(key, sizeof key, "j1", JOB_REC_REPORT, 7, "w-3"));
  T_CHECK(strcmp(key, "/newt/j1/reports/00000000000000000007/w-3") == 0);
  T_CHECK(job_key_parse(key + strlen("/newt/j1/"), &g, &id) == JOB_REC_REPORT && g == 7 && strcmp(id, "w-3") == 0);
  T_OK(job_key(key, sizeof key, "j1", JOB_REC_ACK, 12345678901234ull, "w0"));
  T_CHECK(job_key_parse(key + strlen("/newt/j1/"), &g, &id) == JOB_REC_ACK && g == 12345678901234ull);
  T_OK(job_key(key, sizeof key, "j1", JOB_REC_PROGRESS, 0, NULL));
  T_CHECK(strcmp(key, "/newt/j1/progress") == 0);
  T_OK(job_key(key, sizeof key, "j1", JOB_REC_WORKER, 0, "w9"));
  T_CHECK(job_key_parse("workers/w9", NULL, &id) == JOB_REC_WORKER && strcmp(id, "w9") == 0);
  T_OK(job_key(key, sizeof key, "j1", JOB_REC_LINKS, 0, "w9"));
  T_CHECK(strcmp(key, "/newt/j1/links/w9") == 0);
  T_CHECK(job_key_parse("links/w9", NULL, &id) == JOB_REC_LINKS && strcmp(id, "w9") == 0);
  T_ERR(NEWT_ERR_INVALID, job_key(key, sizeof key, "j1", JOB_REC_LINKS, 0, "../x"));
  struct {
    const char *rest;
    job_record rec;
  } cases[] = {
      {"spec", JOB_REC_SPEC},
      {"plan", JOB_REC_PLAN},
      {"done", JOB_REC_DONE},
      {"ckpt", JOB_REC_CKPT},
      {"progress", JOB_REC_PROGRESS},
      {"events/0000001700000000-00000000-abcd1234", JOB_REC_EVENT},
      {"election/694d7e5a1b2c", JOB_REC_ELECTION},
      {"plans", JOB_REC_OTHER},
      {"reports/7/w0", JOB_REC_OTHER},                          /* generation not 20 digits */
      {"reports/00000000000000000007w0", JOB_REC_OTHER},        /* no slash */
      {"reports/00000000000000000007/w 0", JOB_REC_OTHER},      /* bad id */
      {"acks/00000000000000000007/", JOB_REC_OTHER},            /* empty id */
      {"workers/../../x", JOB_REC_OTHER},
      {"links/", JOB_REC_OTHER},
      {"links/a b", JOB_REC_OTHER},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    T_CHECK_MSG(job_key_parse(cases[i].rest, &g, &id) == cases[i].rec, "job_key_parse(%s)", cases[i].rest);
  T_ERR(NEWT_ERR_INVALID, job_key(key, sizeof key, "j1", JOB_REC_REPORT, 1, "a/b"));
  T_ERR(NEWT_ERR_INVALID, job_key(key, sizeof key, "j 1", JOB_REC_DONE, 0, NULL));
}

static void test_report(void) {
  job_report r = {.hang = 1, .naccuse = 2, .step = 41, .t_ms = 1700000000123ull};
  snprintf(r.worker, sizeof r.worker, "w1");
  snprintf(r.accuse[0], sizeof r.accuse[0], "w2");
  snprintf(r.accuse[1], sizeof r.accuse[1], "w3");
  snprintf(r.why, sizeof r.why, "allreduce: rank 2 \"quoted\" closed");
  char *text = job_report_to_json(&r);
  T_CHECK(text != NULL);
  job_report back;
  T_OK(job_report_from_json(text, strlen(text), &back));
  T_CHECK(memcmp(&r, &back, sizeof r) == 0);
  free(text);
  /* free text is printed by readers: control characters come back as '?' */
  snprintf(r.why, sizeof r.why, "line\nnext \x1b[2J");
  text = job_report_to_json(&r);
  T_OK(job_report_from_json(text, strlen(text), &back));
  T_CHECK_MSG(strcmp(back.why, "line?next ?[2J") == 0, "why: %s", back.why);
  free(text);
  /* and C1 controls (issue 37, item 9): CSI as UTF-8 (C2 9B), as a raw byte and as a JSON
     escape; other UTF-8 kept */
  snprintf(r.why, sizeof r.why, "a\xc2\x9b" "2J b\x9b" "2J \xe2\x80\x9cok\xe2\x80\x9d");
  text = job_report_to_json(&r);
  T_OK(job_report_from_json(text, strlen(text), &back));
  T_CHECK_MSG(strcmp(back.why, "a?2J b?2J \xe2\x80\x9cok\xe2\x80\x9d") == 0, "why: %s", back.why);
  free(text);
  const char *esc = "{\"worker\":\"w1\",\"kind\":\"crash\",\"step\":1,\"t_ms\":1,\"why\":\"c\\u009b2J\"}";
  T_OK(job_report_from_json(esc, strlen(esc), &back));
  T_CHECK_MSG(strcmp(back.why, "c?2J") == 0, "why: %s", back.why);
  job_report none = {.step = -1};
  snprintf(none.worker, sizeof none.worker, "w0");
  text = job_report_to_json(&none);
  T_OK(job_report_from_json(text, strlen(text), &back));
  T_CHECK(back.naccuse == 0 && back.hang == 0 && back.step == -1 && back.done_step == 0);
  T_CHECK_MSG(!strstr(text, "done_step"), "a report that says no step of its own writes none: %s", text);
  free(text);
  /* the reporter's own newest step (issue 35): written when said, read back; a report of the
     previous release has none (0) */
  none.done_step = 42;
  text = job_report_to_json(&none);
  T_OK(job_report_from_json(text, strlen(text), &back));
  T_CHECK_MSG(back.done_step == 42 && strstr(text, "\"done_step\":42"), "%s", text);
  free(text);
  EXPECT_REJECT(job_report_from_json, job_report,
                "{\"worker\":\"w1\",\"kind\":\"crash\",\"step\":1,\"done_step\":-1,\"t_ms\":1}", "report.done_step");

  EXPECT_REJECT(job_report_from_json, job_report, "[1]", "report: expected a JSON object");
  EXPECT_REJECT(job_report_from_json, job_report, "{\"worker\":\"w1\",\"kind\":\"x\",\"step\":1,\"t_ms\":1}",
                "report.kind");
  EXPECT_REJECT(job_report_from_json, job_report, "{\"kind\":\"crash\",\"step\":1,\"t_ms\":1}", "report.worker");
  EXPECT_REJECT(job_report_from_json, job_report, "{\"worker\":\"w1\",\"kind\":\"crash\",\"step\":-2,\"t_ms\":1}",
                "report.step");
  EXPECT_REJECT(job_report_from_json, job_report, "{\"worker\":\"w1\",\"kind\":\"crash\",\"step\":1,\"t_ms\":-5}",
                "report.t_ms");
  EXPECT_REJECT(job_report_from_json, job_report,
                "{\"worker\":\"w1\",\"kind\":\"crash\",\"step\":1,\"t_ms\":1,\"accuse\":[\"ok\",\"no good\"]}",
                "report.accuse[1]");
  EXPECT_REJECT(job_report_from_json, job_report,
                "{\"worker\":\"w1\",\"kind\":\"crash\",\"step\":1,\"t_ms\":1,\"accuse\":[1]}", "report.accuse[0]");
  EXPECT_REJECT(job_report_from_json, job_report,
                "{\"worker\":\"w1\",\"kind\":\"crash\",\"step\":1,\"t_ms\":1,"
                "\"accuse\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}",
                "report.accuse");
  EXPECT_REJECT(job_report_from_json, job_report, "{\"worker\":\"w1\",\"kind\":\"crash\",\"step\":\"x\",\"t_ms\":1}",
                "report.step");
  EXPECT_REJECT(job_report_from_json, job_report, "{\"worker\":\"w1\",", "report: malformed JSON");
}

static void test_ack(void) {
  job_ack a = {.rank = 3, .t_plan = 10, .t_comm = 20, .t_restore = 30, .t_step = 40, .restore_step = 99};
  snprintf(a.restore, sizeof a.restore, "peer");
  char *text = job_ack_to_json(&a);
  job_ack back;
  T_OK(job_ack_from_json(text, strlen(text), &back));
  T_CHECK(memcmp(&a, &back, sizeof a) == 0);
  free(text);
  T_CHECK(job_restore_rank("memory") == 0 && job_restore_rank("peer") == 1 && job_restore_rank("init") == 2 &&
          job_restore_rank("ckpt") == 3 && job_restore_rank("disk") == -1);
  EXPECT_REJECT(job_ack_from_json, job_ack,
                "{\"rank\":0,\"t_plan\":1,\"t_comm\":1,\"t_restore\":1,\"t_step\":1,\"restore\":\"disk\","
                "\"restore_step\":0}",
                "ack.restore");
  EXPECT_REJECT(job_ack_from_json, job_ack,
                "{\"rank\":-1,\"t_plan\":1,\"t_comm\":1,\"t_restore\":1,\"t_step\":1,\"restore\":\"init\","
                "\"restore_step\":0}",
                "ack.rank");
  EXPECT_REJECT(job_ack_from_json, job_ack, "{\"rank\":0,\"t_plan\":1}", "ack.t_comm");
}

/* links: a round trip, and the fields checked */
static void test_links(void) {
  job_links l = {.generation = 7, .answered = 2, .ranks = 3, .t_ms = 1700000000123ull}, lb;
  char *text = job_links_to_json(&l);
  T_OK(job_links_from_json(text, strlen(text), &lb));
  T_CHECK(memcmp(&l, &lb, sizeof l) == 0);
  free(text);
  EXPECT_REJECT(job_links_from_json, job_links, "{\"generation\":0,\"answered\":1,\"ranks\":1,\"t_ms\":1}",
                "links.generation");
  EXPECT_REJECT(job_links_from_json, job_links, "{\"generation\":3,\"answered\":4,\"ranks\":3,\"t_ms\":1}",
                "links.answered");
  EXPECT_REJECT(job_links_from_json, job_links, "{\"generation\":3,\"answered\":0,\"ranks\":0,\"t_ms\":1}",
                "links.ranks");
  EXPECT_REJECT(job_links_from_json, job_links, "{\"generation\":3,\"answered\":1,\"ranks\":1}", "links.t_ms");
  EXPECT_REJECT(job_links_from_json, job_links, "[1]", "links");
  /* how many of its links are not well yet: written only when some are, read as 0 when absent */
  l.slow = 2;
  text = job_links_to_json(&l);
  T_CHECK(text && strstr(text, "\"slow\":2"));
  T_OK(job_links_from_json(text, strlen(text), &lb));
  T_CHECK(lb.slow == 2);
  free(text);
  EXPECT_REJECT(job_links_from_json, job_links, "{\"generation\":3,\"answered\":1,\"ranks\":1,\"t_ms\":1,\"slow\":-1}",
                "links.slow");
}

static void test_progress_done_ckpt(void) {
  job_progress p = {.generation = 4, .step = 120, .loss = 2.25, .tokens_per_s = 12345.5, .world = 8, .dp = 2,
                    .t_ms = 1700000000000ull};
  char *text = job_progress_to_json(&p);
  job_progress pb;
  T_OK(job_progress_from_json(text, strlen(text), &pb));
  T_CHECK(memcmp(&p, &pb, sizeof p) == 0);
  free(text);
  p.loss = NAN; /* a diverged run: written as null, read back as NaN */
  text = job_progress_to_json(&p);
  T_CHECK(strstr(text, "\"loss\":null") != NULL);
  T_OK(job_progress_from_json(text, strlen(text), &pb));
  T_CHECK(isnan(pb.loss) && pb.step == 120);
  free(text);
  EXPECT_REJECT(job_progress_from_json, job_progress, "{\"generation\":1,\"step\":-3,\"loss\":1,\"t_ms\":1}",
                "progress.step");
  EXPECT_REJECT(job_progress_from_json, job_progress, "{\"generation\":1,\"step\":3,\"loss\":\"low\",\"t_ms\":1}",
                "progress.loss");
  /* the committed step: at most the step; absent (an older worker) reads as -1 */
  p.loss = 2.0;
  p.committed = 119;
  text = job_progress_to_json(&p);
  T_OK(job_progress_from_json(text, strlen(text), &pb));
  T_CHECK(pb.committed == 119 && pb.step == 120);
  free(text);
  const char *old = "{\"generation\":1,\"step\":3,\"loss\":1,\"t_ms\":1}";
  T_OK(job_progress_from_json(old, strlen(old), &pb));
  T_CHECK(pb.committed == -1);
  EXPECT_REJECT(job_progress_from_json, job_progress,
                "{\"generation\":1,\"step\":3,\"committed\":4,\"loss\":1,\"t_ms\":1}", "progress.committed");

  job_done d = {.step = 300, .loss = 2.1889, .t_ms = 5, .samples = 9600};
  text = job_done_to_json(&d);
  job_done db;
  T_OK(job_done_from_json(text, strlen(text), &db));
  T_CHECK(memcmp(&d, &db, sizeof d) == 0);
  free(text);
  EXPECT_REJECT(job_done_from_json, job_done, "{\"step\":3,\"loss\":1,\"t_ms\":1}", "done.samples");

  job_ckpt c = {.step = 50};
  snprintf(c.dir, sizeof c.dir, "/ck \"quoted\" dir");
  text = job_ckpt_to_json(&c);
  job_ckpt cb;
  T_OK(job_ckpt_from_json(text, strlen(text), &cb));
  T_CHECK(memcmp(&c, &cb, sizeof c) == 0);
  free(text);
  EXPECT_REJECT(job_ckpt_from_json, job_ckpt, "{\"step\":3}", "ckpt.dir");
  /* rank 0's stall, to the µs; optional (an older worker's record has none) */
  c.save_ms = 812;
  c.stall_ms = 3.1415926;
  text = job_ckpt_to_json(&c);
  T_OK(job_ckpt_from_json(text, strlen(text), &cb));
  T_CHECK(cb.save_ms == 812 && fabs(cb.stall_ms - 3.142) < 1e-9);
  EXPECT_REJECT(job_ckpt_from_json, job_ckpt, "{\"step\":3,\"dir\":\"d\",\"stall_ms\":-1}", "ckpt.stall_ms");
  EXPECT_REJECT(job_ckpt_from_json, job_ckpt, "{\"step\":3,\"dir\":\"d\",\"stall_ms\":1e12}", "ckpt.stall_ms");
  EXPECT_REJECT(job_ckpt_from_json, job_ckpt, "{\"step\":3,\"dir\":\"d\",\"stall_ms\":\"slow\"}", "ckpt.stall_ms");
  /* the saves rank 0 skipped (issue 35): written only when some were */
  T_CHECK_MSG(!strstr(text, "skipped"), "%s", text);
  free(text);
  c.skipped = 3;
  text = job_ckpt_to_json(&c);
  T_OK(job_ckpt_from_json(text, strlen(text), &cb));
  T_CHECK_MSG(cb.skipped == 3 && strstr(text, "\"skipped\":3"), "%s", text);
  free(text);
  EXPECT_REJECT(job_ckpt_from_json, job_ckpt, "{\"step\":3,\"dir\":\"d\",\"skipped\":-2}", "ckpt.skipped");
}

/* The ranks' speeds in a step log's line (issue 41): written only when known, so a line
 * without them is the previous release's bytes; read back as written; a malformed list of the
 * slow ranks is refused by name. The progress record shares the codec: its list reads back. */
static void test_step_speeds(void) {
  job_step s = {.step = 9, .loss = 2.5, .lr = 0.01, .tokens_per_s = 100, .world = 3, .dp = 3, .generation = 2,
                .t_ms = 1700000000000ull};
  char *text = job_step_to_json(&s);
  T_CHECK_MSG(text && !strstr(text, "sample_us") && !strstr(text, "slow"), "%s", text);
  free(text);
  s.sample_us = 812.25;
  s.nslow = 2;
  s.slow[0] = (struct job_slow){.dp = 2, .us = 2400.5};
  s.slow[1] = (struct job_slow){.dp = 0, .us = 300};
  text = job_step_to_json(&s);
  T_CHECK_MSG(text && strstr(text, "\"sample_us\":812.3,\"slow\":[[2,2400.5],[0,300]]"), "%s", text);
  job_step b;
  T_OK(job_step_from_json(text, strlen(text), &b));
  T_CHECK(fabs(b.sample_us - 812.3) < 1e-9 && b.nslow == 2 && b.slow[0].dp == 2 && b.slow[0].us == 2400.5 &&
          b.slow[1].dp == 0 && b.slow[1].us == 300 && b.step == 9);
  free(text);
  const char *old = "{\"step\":9,\"loss\":2.5,\"t_ms\":1}";
  T_OK(job_step_from_json(old, strlen(old), &b));
  T_CHECK(b.sample_us == 0 && b.nslow == 0);
  EXPECT_REJECT(job_step_from_json, job_step, "{\"step\":9,\"loss\":2.5,\"slow\":[[1]]}", "step.slow[0]");
  EXPECT_REJECT(job_step_from_json, job_step, "{\"step\":9,\"loss\":2.5,\"slow\":[[1,0]]}", "step.slow[0]");
  EXPECT_REJECT(job_step_from_json, job_step, "{\"step\":9,\"loss\":2.5,\"slow\":[[0,5],[1.5,5]]}",
                "step.slow[1]");
  EXPECT_REJECT(job_step_from_json, job_step, "{\"step\":9,\"loss\":2.5,\"slow\":{\"dp\":1}}", "step.slow");
  EXPECT_REJECT(job_step_from_json, job_step,
                "{\"step\":9,\"loss\":2.5,\"slow\":[[0,1],[1,1],[2,1],[3,1],[4,1],[5,1],[6,1],[7,1],[8,1]]}",
                "step.slow");
  EXPECT_REJECT(job_step_from_json, job_step, "{\"step\":9,\"loss\":2.5,\"sample_us\":-1}", "step.sample_us");
  job_progress p = {.generation = 2, .step = 9, .loss = 1, .t_ms = 1, .sample_us = 50, .nslow = 1};
  p.slow[0] = (struct job_slow){.dp = 1, .us = 125};
  text = job_progress_to_json(&p);
  job_progress pb;
  T_OK(job_progress_from_json(text, strlen(text), &pb));
  T_CHECK_MSG(pb.nslow == 1 && pb.slow[0].dp == 1 && pb.slow[0].us == 125 && pb.sample_us == 50, "%s", text);
  free(text);
  EXPECT_REJECT(job_progress_from_json, job_progress,
                "{\"generation\":1,\"step\":3,\"loss\":1,\"t_ms\":1,\"slow\":[[-1,5]]}", "progress.slow[0]");
}

static void test_events(void) {
  char ex[2][NEWT_ID_MAX] = {"w1", "w4"};
  job_event plan = {.type = JOB_EV_PLAN, .t_ms = 99, .generation = 3, .world = 6, .dp = 3, .spares = 1,
                    .excluded = ex, .nexcluded = 2};
  snprintf(plan.coordinator, sizeof plan.coordinator, "c0");
  snprintf(plan.cause, sizeof plan.cause, "crash");
  char *text = job_event_to_json(&plan);
  job_event e;
  T_OK(job_event_from_json(text, strlen(text), &e));
  T_CHECK(e.type == JOB_EV_PLAN && e.generation == 3 && e.world == 6 && e.dp == 3 && e.spares == 1);
  T_CHECK(e.nexcluded == 2 && strcmp(e.excluded[1], "w4") == 0 && strcmp(e.cause, "crash") == 0);
  T_CHECK(e.t_ms == 99 && strcmp(e.coordinator, "c0") == 0);
  job_event_free(&e);
  free(text);

  /* a plan's spares and why; workers that joined and stay spares */
  char sp[2][NEWT_ID_MAX] = {"w5", "w6"};
  job_event spares[] = {{.type = JOB_EV_PLAN, .t_ms = 7, .generation = 2, .world = 2, .dp = 2, .spares = 2,
                         .spare_ids = sp, .nspare_ids = 2, .why = "the global batch is 2 micro-batches"},
                        {.type = JOB_EV_SPARE, .t_ms = 8, .spare_ids = sp, .nspare_ids = 1, .why = "no larger layout"}};
  snprintf(spares[0].cause, sizeof spares[0].cause, "join");
  for (int i = 0; i < 2; i++) {
    text = job_event_to_json(&spares[i]);
    T_OK(job_event_from_json(text, strlen(text), &e));
    T_CHECK_MSG(e.type == spares[i].type && e.nspare_ids == spares[i].nspare_ids && strcmp(e.spare_ids[0], "w5") == 0 &&
                strcmp(e.why, spares[i].why) == 0, "%s", text);
    job_event_free(&e);
    free(text);
  }
  EXPECT_REJECT(job_event_from_json, job_event, "{\"type\":\"spare\",\"t_ms\":1,\"spare_ids\":[\"a b\"],\"why\":\"x\"}",
                "event.spare_ids[0]");
  EXPECT_REJECT(job_event_from_json, job_event, "{\"type\":\"spare\",\"t_ms\":1,\"spare_ids\":[3],\"why\":\"x\"}",
                "event.spare_ids[0]");
  EXPECT_REJECT(job_event_from_json, job_event, "{\"type\":\"spare\",\"t_ms\":1,\"spare_ids\":[\"w1\"]}", "event.why");

  /* a recovery's times, one definition: from the injected fault when it came before the
     detection, else from the detection; the phases add up to the total */
  job_event tm = {.type = JOB_EV_RECOVERED, .t_detect = 1000, .t_plan = 1020, .t_comm = 1030, .t_restore = 1060,
                  .t_step = 1200};
  job_recovery_times rt = job_recovery_time(&tm, 990);
  T_CHECK(rt.start == 990 && rt.detect_ms == 10 && rt.plan_ms == 20 && rt.comm_ms == 10 && rt.restore_ms == 30 &&
          rt.step_ms == 140 && rt.total_ms == 210);
  T_CHECK(rt.detect_ms + rt.plan_ms + rt.comm_ms + rt.restore_ms + rt.step_ms == rt.total_ms);
  rt = job_recovery_time(&tm, 0); /* not injected */
  T_CHECK(rt.start == 1000 && rt.detect_ms == 0 && rt.total_ms == 200 && rt.step_ms == 140);
  rt = job_recovery_time(&tm, 1100); /* a fault after the detection is not this recovery's */
  T_CHECK(rt.start == 1000 && rt.total_ms == 200);

  job_event rec = {.type = JOB_EV_RECOVERED, .t_ms = 100, .generation = 4, .world = 3, .t_trigger = 1,
                   .t_detect = 2, .t_plan = 3, .t_comm = 4, .t_restore = 5, .t_step = 6, .restore_step = 77,
                   .steps_lost = 0};
  snprintf(rec.cause, sizeof rec.cause, "hang");
  snprintf(rec.restore, sizeof rec.restore, "memory");
  text = job_event_to_json(&rec);
  T_OK(job_event_from_json(text, strlen(text), &e));
  T_CHECK(e.type == JOB_EV_RECOVERED && e.t_detect == 2 && e.t_step == 6 && e.restore_step == 77);
  T_CHECK(strcmp(e.restore, "memory") == 0 && strcmp(e.cause, "hang") == 0);
  /* without fault_step (the previous release's events): the step the fault hit is the step
     restored plus the steps done again */
  T_CHECK_MSG(!strstr(text, "fault_step") && e.fault_step == 0 && job_event_fault_step(&e) == 77, "%s", text);
  job_event_free(&e);
  free(text);
  /* with it (issue 35): one account, fault_step - restore_step = steps_lost */
  rec.fault_step = 80;
  rec.steps_lost = 3;
  text = job_event_to_json(&rec);
  T_OK(job_event_from_json(text, strlen(text), &e));
  T_CHECK_MSG(e.fault_step == 80 && job_event_fault_step(&e) == 80 && e.steps_lost == 3, "%s", text);
  job_event_free(&e);
  free(text);
  /* only a recovered event says it */
  job_event started = rec;
  started.type = JOB_EV_STARTED;
  text = job_event_to_json(&started);
  T_CHECK_MSG(text && !strstr(text, "fault_step"), "%s", text);
  free(text);

  job_event others[] = {{.type = JOB_EV_LEADER, .t_ms = 1},
                        {.type = JOB_EV_FENCE, .t_ms = 2, .worker = "w7"},
                        {.type = JOB_EV_WAITING, .t_ms = 3, .why = "need 4 workers, have 2"},
                        {.type = JOB_EV_DONE, .t_ms = 4, .step = 300, .loss = 2.5},
                        {.type = JOB_EV_ETCD, .t_ms = 5, .why = "etcd was out of space for 12 s"}};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
    text = job_event_to_json(&others[i]);
    T_OK(job_event_from_json(text, strlen(text), &e));
    T_CHECK_MSG(e.type == others[i].type && e.t_ms == others[i].t_ms, "%s", text);
    T_CHECK(strcmp(e.worker, others[i].worker) == 0 && strcmp(e.why, others[i].why) == 0);
    T_CHECK(e.step == others[i].step && e.loss == others[i].loss);
    job_event_free(&e);
    free(text);
  }
  EXPECT_REJECT(job_event_from_json, job_event, "{\"type\":\"reboot\",\"t_ms\":1}", "event.type");
  EXPECT_REJECT(job_event_from_json, job_event, "{\"type\":\"plan\",\"t_ms\":1,\"generation\":2,\"cause\":\"boredom\","
                                                "\"world\":1}",
                "event.cause");
  EXPECT_REJECT(job_event_from_json, job_event, "{\"type\":\"plan\",\"t_ms\":1,\"generation\":2,\"cause\":\"join\","
                                                "\"world\":1,\"excluded\":[\"../x\"]}",
                "event.excluded[0]");
  EXPECT_REJECT(job_event_from_json, job_event, "{\"type\":\"fence\",\"t_ms\":1}", "event.worker");
  EXPECT_REJECT(job_event_from_json, job_event, "{\"type\":\"recovered\",\"t_ms\":1,\"generation\":2,"
                                                "\"cause\":\"join\",\"world\":1}",
                "event.t_trigger");
  EXPECT_REJECT(job_event_from_json, job_event, "{\"type\":\"done\",\"t_ms\":1}", "event.step");
}

/* The registration record: a round trip, shares_device written only when set, hostile
 * registrations refused naming the field (issue 17, item 9). */
static void test_registration(void) {
  job_worker w = {.id = "w1", .host = "h", .addr = "10.0.0.1:4000", .device = 3, .state = "ready", .pid = 42,
                  .generation = 7};
  char *json;
  T_OK(job_worker_to_json(&w, &json));
  job_worker back;
  T_OK(job_worker_from_json(json, strlen(json), "reg", &back));
  T_CHECK(strcmp(back.id, "w1") == 0 && back.device == 3 && back.generation == 7 && strcmp(back.addr, w.addr) == 0);
  T_CHECK(back.shares_device == 0 && strstr(json, "shares_device") == NULL); /* written only when set */
  free(json);
  w.shares_device = 1;
  T_OK(job_worker_to_json(&w, &json));
  T_OK(job_worker_from_json(json, strlen(json), "reg", &back));
  T_CHECK(back.shares_device == 1);
  free(json);
  T_ERR(NEWT_ERR_INVALID, job_worker_from_json("{\"id\":\"w1\",\"host\":\"h\"}", 22, "reg", &back));
  T_CHECK(strstr(newt_errmsg(), "reg.state") != NULL);
  T_ERR(NEWT_ERR_INVALID, job_worker_from_json("{\"id\":\"w 1\",\"host\":\"h\",\"state\":\"x\"}", 35, "reg", &back));
  /* hostile registrations (issue 17, item 9): terminal escapes, a bad address, a forged generation */
  const char *bad[][2] = {
      {"{\"id\":\"w1\",\"host\":\"h\\u001b[2J\",\"state\":\"ready\"}", "reg.host"},
      {"{\"id\":\"w1\",\"host\":\"h\",\"addr\":\"10.0.0.1\",\"state\":\"ready\"}", "reg.addr"},
      {"{\"id\":\"w1\",\"host\":\"h\",\"addr\":\"10.0.0.1:99999\",\"state\":\"ready\"}", "reg.addr"},
      {"{\"id\":\"w1\",\"host\":\"h\",\"addr\":\"x;rm:1\",\"state\":\"ready\"}", "reg.addr"},
      {"{\"id\":\"w1\",\"host\":\"h\",\"state\":\"READY\\n\"}", "reg.state"},
      {"{\"id\":\"w1\",\"host\":\"h\",\"state\":\"ready\",\"generation\":\"9223372036854775807\"}", "reg.generation"},
      {"{\"id\":\"w1\",\"host\":\"h\",\"state\":\"ready\",\"shares_device\":\"yes\"}", "reg.shares_device"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    T_CHECK_MSG(job_worker_from_json(bad[i][0], strlen(bad[i][0]), "reg", &back) == NEWT_ERR_INVALID, "accepted %s",
                bad[i][0]);
    T_CHECK_MSG(strstr(newt_errmsg(), bad[i][1]) != NULL, "%s: %s", bad[i][0], newt_errmsg());
  }
  const char *v6 = "{\"id\":\"w1\",\"host\":\"node-7.zone_a\",\"addr\":\"[fe80::1]:4000\",\"state\":\"training\"}";
  T_OK(job_worker_from_json(v6, strlen(v6), "reg", &back));
}

/* The acknowledgement a registration carries: written and read back as the same object, absent
 * in the previous release's registrations (which still parse), bounded, an object only. */
static void test_worker_ack(void) {
  const char *old = "{\"id\":\"w1\",\"host\":\"h\",\"addr\":\"10.0.0.1:4000\",\"device\":-1,\"state\":\"training\","
                    "\"pid\":42,\"generation\":3}"; /* as the previous release wrote it */
  job_worker back;
  T_OK(job_worker_from_json(old, strlen(old), "reg", &back));
  T_CHECK(back.ack[0] == '\0' && back.generation == 3);
  T_CHECK(job_worker_acked(&back, 2) && !job_worker_acked(&back, 3)); /* past 2; 3 not acknowledged */
  job_worker w = {.id = "w1", .host = "h", .state = "training", .device = -1, .generation = 3,
                  .ack = "{\"rank\":1,\"t_step\":12,\"restore\":\"memory\"}"};
  char *json;
  T_OK(job_worker_to_json(&w, &json));
  T_CHECK(strstr(json, "\"ack\":{\"rank\":1,") != NULL); /* an object, not a string within */
  T_OK(job_worker_from_json(json, strlen(json), "reg", &back));
  T_CHECK(strcmp(back.ack, w.ack) == 0 && job_worker_acked(&back, 3) && !job_worker_acked(&back, 4));
  free(json);
  snprintf(w.ack, sizeof w.ack, "[1,2]");
  T_ERR(NEWT_ERR_INVALID, job_worker_to_json(&w, &json));
  T_CHECK(strstr(newt_errmsg(), "registration.ack") != NULL);
  const char *bad[][2] = {
      {"{\"id\":\"w1\",\"host\":\"h\",\"state\":\"training\",\"ack\":\"yes\"}", "reg.ack"},
      {"{\"id\":\"w1\",\"host\":\"h\",\"state\":\"training\",\"ack\":[1]}", "reg.ack"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    T_CHECK_MSG(job_worker_from_json(bad[i][0], strlen(bad[i][0]), "reg", &back) == NEWT_ERR_INVALID, "accepted %s",
                bad[i][0]);
    T_CHECK_MSG(strstr(newt_errmsg(), bad[i][1]) != NULL, "%s: %s", bad[i][0], newt_errmsg());
  }
  /* one longer than the registration holds is refused, naming the field */
  char big[JOB_ACK_MAX + 200];
  int n = snprintf(big, sizeof big, "{\"id\":\"w1\",\"host\":\"h\",\"state\":\"training\",\"ack\":{\"x\":\"");
  while (n < JOB_ACK_MAX + 100) big[n++] = 'a';
  snprintf(big + n, sizeof big - (size_t)n, "\"}}");
  T_ERR(NEWT_ERR_INVALID, job_worker_from_json(big, strlen(big), "reg", &back));
  T_CHECK(strstr(newt_errmsg(), "reg.ack") != NULL);
}

/* What a rank says for itself, proved by the job secret (issue 37, items 3 and 4): a sealed
 * record reads back and checks; the same bytes under another key, generation, salt or job, or
 * with any field changed, or without the proof, do not; a job without a secret seals and
 * checks nothing (the previous release's records). The end marker counts only when plausible,
 * proved, and not beyond the job's progress. */
static void test_proofs(void) {
  const unsigned char secret[] = "0123456789abcdef0123456789abcdef", other[] = "fedcba9876543210fedcba9876543210";
  unsigned char salt[32], salt2[32];
  memset(salt, 7, sizeof salt);
  memset(salt2, 8, sizeof salt2);
  job_auth a, b, c, none;
  T_OK(job_auth_init(&a, secret, 32, "job1"));
  T_OK(job_auth_init(&b, other, 32, "job1"));
  T_OK(job_auth_init(&c, secret, 32, "job2"));
  T_OK(job_auth_init(&none, NULL, 0, "job1"));
  const char *key = "/newt/job1/reports/00000000000000000003/w0";
  job_report r = {.hang = 1, .step = 12, .t_ms = 5, .naccuse = 2};
  snprintf(r.worker, sizeof r.worker, "w0");
  snprintf(r.accuse[0], sizeof r.accuse[0], "w1");
  snprintf(r.accuse[1], sizeof r.accuse[1], "w2");
  snprintf(r.why, sizeof r.why, "a control character\x1b and a newline\n"); /* read back as '?' */
  T_OK(job_report_seal(&a, key, salt, sizeof salt, &r));
  T_CHECK(strlen(r.mac) == 64);
  char *text = job_report_to_json(&r);
  job_report back;
  T_OK(job_report_from_json(text, strlen(text), &back));
  T_OK(job_report_check(&a, key, salt, sizeof salt, &back));
  T_ERR(NEWT_ERR_AUTH, job_report_check(&b, key, salt, sizeof salt, &back));  /* another secret */
  T_ERR(NEWT_ERR_AUTH, job_report_check(&c, key, salt, sizeof salt, &back));  /* another job */
  T_ERR(NEWT_ERR_AUTH, job_report_check(&a, key, salt2, sizeof salt2, &back)); /* another plan */
  T_ERR(NEWT_ERR_AUTH, job_report_check(&a, "/newt/job1/reports/00000000000000000004/w0", salt, sizeof salt, &back));
  T_OK(job_report_check(&none, key, salt, sizeof salt, &back)); /* no secret: nothing asked */
  back.naccuse = 1;                                                /* a field changed */
  T_ERR(NEWT_ERR_AUTH, job_report_check(&a, key, salt, sizeof salt, &back));
  T_CHECK(strstr(newt_errmsg(), key) != NULL);
  free(text);
  /* the previous release's report: no mac, refused where the job has a secret */
  const char *old = "{\"worker\":\"w0\",\"kind\":\"hang\",\"accuse\":[\"w1\"],\"step\":1,\"t_ms\":1,\"why\":\"x\"}";
  T_OK(job_report_from_json(old, strlen(old), &back));
  T_ERR(NEWT_ERR_AUTH, job_report_check(&a, key, salt, sizeof salt, &back));
  T_CHECK(strstr(newt_errmsg(), "no mac") != NULL);
  T_OK(job_report_check(&none, key, salt, sizeof salt, &back));
  /* an acknowledgement names its generation; links; a job without a secret writes no mac */
  job_ack k = {.rank = 1, .t_plan = 1, .t_comm = 2, .t_restore = 3, .t_step = 4, .restore_step = 0};
  snprintf(k.restore, sizeof k.restore, "peer");
  T_OK(job_ack_seal(&a, "/newt/job1/workers/w1", 3, salt, sizeof salt, &k));
  T_OK(job_ack_check(&a, "/newt/job1/workers/w1", 3, salt, sizeof salt, &k));
  T_ERR(NEWT_ERR_AUTH, job_ack_check(&a, "/newt/job1/workers/w1", 4, salt, sizeof salt, &k));
  T_ERR(NEWT_ERR_AUTH, job_ack_check(&a, "/newt/job1/workers/w2", 3, salt, sizeof salt, &k));
  text = job_ack_to_json(&k);
  T_CHECK(text && strlen(text) < JOB_ACK_MAX);
  free(text);
  job_links l = {.generation = 3, .answered = 2, .ranks = 2, .t_ms = 9};
  T_OK(job_links_seal(&none, "/newt/job1/links/w4", &l));
  T_CHECK(l.mac[0] == '\0');
  T_OK(job_links_seal(&a, "/newt/job1/links/w4", &l));
  T_OK(job_links_check(&a, "/newt/job1/links/w4", &l));
  T_ERR(NEWT_ERR_AUTH, job_links_check(&a, "/newt/job1/links/w5", &l));
  l.slow = 1; /* a link said well that was not: the proof no longer holds */
  T_ERR(NEWT_ERR_AUTH, job_links_check(&a, "/newt/job1/links/w4", &l));
  /* the end marker: plausible, proved, and not beyond the job's progress */
  newt_spec spec;
  spec_defaults(&spec, "job1");
  spec.steps = 100000;
  spec.global_batch = 8;
  job_done d = {.step = 100000, .loss = 1.5, .t_ms = 3, .samples = 800000};
  const char *dkey = "/newt/job1/done";
  T_OK(job_done_seal(&a, dkey, &d));
  T_OK(job_done_counts(&d, dkey, &spec, &a, 100000));
  T_ERR(NEWT_ERR_INVALID, job_done_counts(&d, dkey, &spec, &a, 12)); /* the ranks are at step 12 */
  T_CHECK(strstr(newt_errmsg(), "step 12") != NULL);
  T_ERR(NEWT_ERR_AUTH, job_done_counts(&d, dkey, &spec, &b, 100000));
  job_done forged = {.step = 100000, .loss = 0, .t_ms = 3, .samples = 800000};
  T_ERR(NEWT_ERR_AUTH, job_done_counts(&forged, dkey, &spec, &a, 100000));
  T_OK(job_done_counts(&forged, dkey, &spec, &none, 100000)); /* no secret: progress and plausibility only */
  T_ERR(NEWT_ERR_INVALID, job_done_counts(&forged, dkey, &spec, &none, 12));
  forged.step = 55;
  T_ERR(NEWT_ERR_INVALID, job_done_counts(&forged, dkey, &spec, &none, 100000));
}

/* The restart mode's spec: "restart" written only when set (a spec of the previous release
 * reads and writes the same bytes), read back; its end marker may come at any beat up to the
 * last, with that beat's samples; a spec with newt's checkpoints is refused by name. */
static void test_restart_mode(void) {
  newt_spec spec, back;
  spec_defaults(&spec, "job1");
  char *text = spec_to_json(&spec);
  T_CHECK(text && strstr(text, "restart") == NULL);
  free(text);
  spec_set_restart(&spec);
  T_OK(spec_validate(&spec));
  text = spec_to_json(&spec);
  T_CHECK(text && strstr(text, "\"restart\":true") != NULL);
  T_OK(spec_from_json(text, strlen(text), &back));
  T_CHECK(back.restart == 1 && back.steps == SPEC_RESTART_BEATS);
  free(text);
  job_auth none = {0};
  job_done d = {.step = 164, .loss = 0.05, .t_ms = 3, .samples = 164 * SPEC_RESTART_BATCH};
  T_OK(job_done_counts(&d, "/newt/job1/done", &spec, &none, 164));
  d.samples = 163 * SPEC_RESTART_BATCH; /* not that beat's */
  T_ERR(NEWT_ERR_INVALID, job_done_counts(&d, "/newt/job1/done", &spec, &none, 164));
  spec.restart = 0; /* another mode: only the last step ends the job */
  d.samples = 164 * SPEC_RESTART_BATCH;
  T_ERR(NEWT_ERR_INVALID, job_done_counts(&d, "/newt/job1/done", &spec, &none, 164));
  spec.restart = 1;
  snprintf(spec.ckpt_dir, sizeof spec.ckpt_dir, "/tmp/ck");
  T_ERR(NEWT_ERR_INVALID, spec_validate(&spec));
  T_CHECK(strstr(newt_errmsg(), "spec.ckpt.dir") != NULL);
  spec_defaults(&back, "job1");
  T_CHECK(!spec_update_allowed(&spec, &back, NULL, 0));
  T_CHECK(strstr(newt_errmsg(), "spec.restart") != NULL);
}

int main(void) {
  T_RUN(test_keys);
  T_RUN(test_report);
  T_RUN(test_ack);
  T_RUN(test_links);
  T_RUN(test_progress_done_ckpt);
  T_RUN(test_step_speeds);
  T_RUN(test_events);
  T_RUN(test_registration);
  T_RUN(test_worker_ack);
  T_RUN(test_proofs);
  T_RUN(test_restart_mode);
  return T_DONE();
}
