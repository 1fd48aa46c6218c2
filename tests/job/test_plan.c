/* Unit tests of the job spec and the plan (placement, batch keeping, JSON validation). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "job/plan.h"
#include "job/records.h"
#include "job/spec.h"
#include "job/store.h"
#include "rendezvous/rdzv.h"
#include "test.h"

static newt_result_t parse(const char *text, newt_spec *s) { return spec_from_json(text, strlen(text), s); }

static void expect_spec_error(const char *text, const char *needle) {
  newt_spec s;
  newt_result_t r = parse(text, &s);
  T_CHECK_MSG(r == NEWT_ERR_INVALID, "spec %s was accepted", text);
  T_CHECK_MSG(strstr(newt_errmsg(), needle) != NULL, "error \"%s\" does not name \"%s\"", newt_errmsg(), needle);
}

static void test_spec(void) {
  newt_spec s;
  T_OK(parse("{\"job\":\"j1\",\"train\":{\"steps\":50,\"global_batch\":24,\"micro_batch\":2},"
             "\"parallel\":{\"tp\":2,\"dp_max\":6},\"model\":{\"preset\":\"small\",\"layers\":4}}", &s));
  T_CHECK(s.steps == 50 && s.global_batch == 24 && s.micro_batch == 2 && s.tp == 2 && s.dp_max == 6);
  T_CHECK(strcmp(s.preset, "small") == 0 && s.layers == 4 && s.pp == 1 && s.lr > 0);
  char *text = spec_to_json(&s);
  newt_spec back;
  T_OK(parse(text, &back));
  T_CHECK(memcmp(&s, &back, sizeof s) == 0);
  free(text);

  expect_spec_error("{\"train\":{}}", "spec.job");
  expect_spec_error("{\"job\":\"a b\"}", "spec.job");
  expect_spec_error("{\"job\":\"j\",\"parallel\":{\"tp\":0}}", "spec.parallel.tp");
  expect_spec_error("{\"job\":\"j\",\"parallel\":{\"tpp\":2}}", "spec.parallel.tpp: unknown field");
  expect_spec_error("{\"job\":\"j\",\"parallel\":{\"tp\":\"two\"}}", "spec.parallel.tp");
  expect_spec_error("{\"job\":\"j\",\"train\":{\"global_batch\":30,\"micro_batch\":4}}", "spec.train.global_batch");
  /* the ranks split the samples (the first ones one more): 3 and 3 is fine, unless every rank
     must take as many whole micro-batches */
  T_OK(parse("{\"job\":\"j\",\"train\":{\"global_batch\":6,\"micro_batch\":2},\"parallel\":{\"dp_min\":2,\"dp_max\":2}}", &s));
  expect_spec_error("{\"job\":\"j\",\"train\":{\"global_batch\":6,\"micro_batch\":2},"
                    "\"parallel\":{\"dp_min\":2,\"dp_max\":2,\"even_batches\":true}}",
                    "spec.train.global_batch: 6 cannot be split");
  expect_spec_error("{\"job\":\"j\",\"train\":{\"global_batch\":4,\"micro_batch\":2},\"parallel\":{\"dp_min\":5}}",
                    "spec.parallel.dp_min: 5 data-parallel ranks, but the global batch has 4 samples");
  expect_spec_error("{\"job\":\"j\",\"parallel\":{\"even_batches\":1}}", "spec.parallel.even_batches");
  /* the join window: 100 ms by default, written only when another (a spec of the defaults
     reads as before it existed) */
  T_OK(parse("{\"job\":\"j\"}", &s));
  char *dj = spec_to_json(&s);
  T_CHECK_MSG(s.join_window_ms == 100 && dj && !strstr(dj, "join_window_ms") && !strstr(dj, "even_batches"), "%s", dj);
  free(dj);
  T_OK(parse("{\"job\":\"j\",\"parallel\":{\"join_window_ms\":2000,\"even_batches\":true}}", &s));
  dj = spec_to_json(&s);
  T_OK(parse(dj, &back));
  T_CHECK_MSG(back.join_window_ms == 2000 && back.even_batches == 1, "%s", dj);
  free(dj);
  expect_spec_error("{\"job\":\"j\",\"parallel\":{\"join_window_ms\":-1}}", "spec.parallel.join_window_ms");
  /* spec.fault.replicas: 1 by default and then not written (a spec of the previous release
     reads the same), 1..8, not changed while the job runs */
  T_OK(parse("{\"job\":\"j\"}", &s));
  dj = spec_to_json(&s);
  T_CHECK_MSG(s.replicas == 1 && dj && !strstr(dj, "replicas"), "%s", dj);
  free(dj);
  T_OK(parse("{\"job\":\"j\",\"fault\":{\"replicas\":3}}", &s));
  dj = spec_to_json(&s);
  T_OK(parse(dj, &back));
  T_CHECK_MSG(back.replicas == 3, "%s", dj);
  free(dj);
  expect_spec_error("{\"job\":\"j\",\"fault\":{\"replicas\":0}}", "spec.fault.replicas: must be 1..8");
  expect_spec_error("{\"job\":\"j\",\"fault\":{\"replicas\":9}}", "spec.fault.replicas: must be 1..8");
  expect_spec_error("{\"job\":\"j\",\"fault\":{\"replicas\":\"2\"}}", "spec.fault.replicas");
  back.replicas = 1;
  T_CHECK(!spec_update_allowed(&s, &back, NULL, 0) && strstr(newt_errmsg(), "spec.fault.replicas: 3 -> 1"));
  /* spec.fault.on_state_loss, verify_every, on_mismatch: checkpoint, 10 and rollback by default
     and then not written; words from their sets, a count not negative; changeable */
  T_OK(parse("{\"job\":\"j\"}", &s));
  dj = spec_to_json(&s);
  T_CHECK_MSG(s.on_state_loss == SPEC_LOSS_CHECKPOINT && s.verify_every == SPEC_VERIFY_EVERY &&
                  s.on_mismatch == SPEC_MISMATCH_ROLLBACK && dj && !strstr(dj, "on_state_loss") &&
                  !strstr(dj, "verify_every") && !strstr(dj, "on_mismatch"),
              "%s", dj);
  free(dj);
  T_OK(parse("{\"job\":\"j\",\"fault\":{\"on_state_loss\":\"restart\",\"verify_every\":0,\"on_mismatch\":\"warn\"}}", &s));
  dj = spec_to_json(&s);
  T_OK(parse(dj, &back));
  T_CHECK_MSG(back.on_state_loss == SPEC_LOSS_RESTART && back.verify_every == 0 && back.on_mismatch == SPEC_MISMATCH_WARN,
              "%s", dj);
  free(dj);
  expect_spec_error("{\"job\":\"j\",\"fault\":{\"on_state_loss\":\"init\"}}", "spec.fault.on_state_loss");
  expect_spec_error("{\"job\":\"j\",\"fault\":{\"on_mismatch\":\"ignore\"}}", "spec.fault.on_mismatch");
  expect_spec_error("{\"job\":\"j\",\"fault\":{\"verify_every\":-1}}", "spec.fault.verify_every");
  T_CHECK(spec_state_loss_parse("fail") == SPEC_LOSS_FAIL && spec_state_loss_parse("x") < 0 &&
          strcmp(spec_mismatch_name(SPEC_MISMATCH_FAIL), "fail") == 0 && spec_mismatch_name(7) == NULL);
  spec_defaults(&back, "j");
  T_CHECK(spec_update_allowed(&s, &back, NULL, 0));
  /* spec.fault.progress_timeout_ms: 10 min by default and then not written, 0 (for ever) or
     at least 1000, changeable while the job runs -- and the change is named though the old
     spec does not write the field */
  T_OK(parse("{\"job\":\"j\"}", &s));
  dj = spec_to_json(&s);
  T_CHECK_MSG(s.progress_timeout_ms == 600000 && dj && !strstr(dj, "progress_timeout_ms"), "%s", dj);
  free(dj);
  T_OK(parse("{\"job\":\"j\",\"fault\":{\"progress_timeout_ms\":0}}", &back));
  dj = spec_to_json(&back);
  T_CHECK_MSG(dj && strstr(dj, "\"progress_timeout_ms\":0"), "%s", dj);
  free(dj);
  char what[256] = "";
  T_CHECK(spec_update_allowed(&s, &back, what, sizeof what));
  T_CHECK_MSG(strstr(what, "fault.progress_timeout_ms default -> 0"), "changed: %s", what);
  T_CHECK(spec_update_allowed(&back, &s, what, sizeof what));
  T_CHECK_MSG(strstr(what, "fault.progress_timeout_ms 0 -> default"), "changed: %s", what);
  expect_spec_error("{\"job\":\"j\",\"fault\":{\"progress_timeout_ms\":999}}", "spec.fault.progress_timeout_ms");
  expect_spec_error("{\"job\":\"j\",\"fault\":{\"progress_timeout_ms\":-1}}", "spec.fault.progress_timeout_ms");
  expect_spec_error("{\"job\":\"j\",\"parallel\":{\"dp_min\":4,\"dp_max\":2}}", "spec.parallel.dp_max");
  /* hostile sizes: no overflow, no division by zero, no loop of 9e15 (issue 17, item 5) */
  expect_spec_error("{\"job\":\"j\",\"train\":{\"global_batch\":8589934592,\"micro_batch\":4294967296},"
                    "\"parallel\":{\"dp_min\":4294967296,\"dp_max\":4294967296}}",
                    "spec.train.global_batch: at most");
  expect_spec_error("{\"job\":\"j\",\"train\":{\"global_batch\":9007199254740881,\"micro_batch\":1},"
                    "\"parallel\":{\"dp_min\":2}}",
                    "spec.train.global_batch: at most");
  expect_spec_error("{\"job\":\"j\",\"train\":{\"global_batch\":16,\"micro_batch\":4},"
                    "\"parallel\":{\"dp_max\":4294967296}}",
                    "spec.parallel.dp_max: at most");
  expect_spec_error("{\"job\":\"j\",\"parallel\":{\"tp\":1024,\"pp\":1024,\"dp_max\":4}}", "spec.parallel: tp x pp");
  expect_spec_error("{\"job\":\"j\",\"fault\":{\"lease_ttl_ms\":9223372036854775807}}", "spec.fault.lease_ttl_ms");
  expect_spec_error("{\"job\":\"j\",\"train\":{\"steps\":-9223372036854775807}}", "spec.train.steps");
  expect_spec_error("{\"job\":\"j\",\"parallel\":{\"zero\":4}}", "spec.parallel.zero");
  expect_spec_error("{\"job\":\"j\",\"ckpt\":{\"every\":5}}", "spec.ckpt.dir");
  expect_spec_error("{\"job\":\"j\",\"fault\":{\"lease_ttl_ms\":10}}", "spec.fault.lease_ttl_ms");
  expect_spec_error("{\"job\":\"j\",\"backend\":\"gpu\"}", "spec.backend");
  expect_spec_error("{\"job\":\"j\",\"model\":{\"layers\":2},\"parallel\":{\"pp\":4}}", "spec.parallel.pp");
  expect_spec_error("{\"job\":\"j\",", "spec: malformed JSON");
  expect_spec_error("[1,2]", "spec");
}

/* Every number of a spec is a JSON number (issue 25, item 4): each numeric field of a whole
 * spec, written as a string of its own value, is refused naming it. */
static void strings_refused(cJSON *node, cJSON *root, const char *path, int *numbers) {
  for (int i = 0; i < cJSON_GetArraySize(node); i++) {
    cJSON *it = cJSON_GetArrayItem(node, i);
    char sub[128], key[64];
    snprintf(sub, sizeof sub, "%s.%s", path, it->string);
    snprintf(key, sizeof key, "%s", it->string);
    if (cJSON_IsObject(it)) strings_refused(it, root, sub, numbers);
    if (!cJSON_IsNumber(it)) continue;
    (*numbers)++;
    double v = it->valuedouble;
    char digits[64];
    snprintf(digits, sizeof digits, "%.17g", v);
    cJSON_ReplaceItemInObjectCaseSensitive(node, key, cJSON_CreateString(digits));
    char *text = cJSON_PrintUnformatted(root);
    newt_spec s;
    char want[300];
    snprintf(want, sizeof want, "%s: expected a number, got the string \"%s\"", sub, digits);
    newt_result_t r = text ? parse(text, &s) : NEWT_ERR_NOMEM;
    T_CHECK_MSG(r == NEWT_ERR_INVALID && strstr(newt_errmsg(), want), "%s as a string: %s (want \"%s\")", sub,
                r == NEWT_OK ? "accepted" : newt_errmsg(), want);
    free(text);
    cJSON_ReplaceItemInObjectCaseSensitive(node, key, cJSON_CreateNumber(v));
  }
}

static void test_spec_numbers(void) {
  /* the case, and a double that parses: both were accepted */
  expect_spec_error("{\"job\":\"j\",\"train\":{\"steps\":\"20\"}}",
                    "spec.train.steps: expected a number, got the string \"20\"");
  expect_spec_error("{\"job\":\"j\",\"train\":{\"lr\":\"0.01\"}}",
                    "spec.train.lr: expected a number, got the string \"0.01\"");
  expect_spec_error("{\"job\":\"j\",\"train\":{\"lr\":\"fast\"}}", "spec.train.lr: expected a number");
  expect_spec_error("{\"job\":\"j\",\"parallel\":{\"tp\":true}}", "spec.parallel.tp: expected a number, got a boolean");
  expect_spec_error("{\"job\":\"j\",\"parallel\":{\"tp\":1.5}}", "spec.parallel.tp: expected an integer, got 1.5");
  expect_spec_error("{\"job\":\"j\",\"train\":{\"lr\":1e999}}", "spec.train.lr: expected a finite number");
  /* every numeric field of a spec that sets them all */
  newt_spec all;
  spec_defaults(&all, "j");
  all.vocab = 256, all.ctx = 64, all.layers = 4, all.heads = 4, all.channels = 128, all.ckpt_every = 5;
  snprintf(all.ckpt_dir, sizeof all.ckpt_dir, "/ckpt");
  char *text = spec_to_json(&all);
  cJSON *root = text ? cJSON_Parse(text) : NULL;
  T_CHECK(root != NULL);
  int numbers = 0;
  if (root) strings_refused(root, root, "spec", &numbers);
  T_CHECK_MSG(numbers == 35, "the spec has %d numeric fields, not the 35 of job/spec.h", numbers);
  cJSON_Delete(root);
  free(text);

  /* seeds: 64 bits. Beyond 15 digits written as a string of digits (as newt wrote them
     before, with newt_json_add_int) and read back exactly; a small one as a string, a
     number beyond 2^53, a sign or other characters are refused */
  newt_spec s, back;
  spec_defaults(&s, "j");
  s.seed = UINT64_MAX;
  s.data_seed = 1000000000000000ull;
  text = spec_to_json(&s);
  T_CHECK(text && strstr(text, "\"seed\":\"18446744073709551615\"") && strstr(text, "\"seed\":\"1000000000000000\""));
  T_OK(parse(text, &back));
  T_CHECK(back.seed == UINT64_MAX && back.data_seed == 1000000000000000ull);
  free(text);
  T_OK(spec_check_json(&s));
  T_OK(parse("{\"job\":\"j\",\"train\":{\"seed\":\"9223372036854775807\"},\"data\":{\"seed\":9007199254740992}}", &back));
  T_CHECK(back.seed == 9223372036854775807ull && back.data_seed == 9007199254740992ull);
  expect_spec_error("{\"job\":\"j\",\"train\":{\"seed\":\"12\"}}",
                    "spec.train.seed: expected a number, got the string \"12\"");
  expect_spec_error("{\"job\":\"j\",\"data\":{\"seed\":1e17}}", "spec.data.seed: 1e+17 is beyond 2^53");
  expect_spec_error("{\"job\":\"j\",\"data\":{\"seed\":\"-1000000000000000\"}}", "spec.data.seed: expected a number");
  expect_spec_error("{\"job\":\"j\",\"data\":{\"seed\":\"18446744073709551616\"}}", "spec.data.seed");
  expect_spec_error("{\"job\":\"j\",\"data\":{\"seed\":\" 1000000000000000\"}}", "spec.data.seed");
  expect_spec_error("{\"job\":\"j\",\"data\":{\"seed\":-1}}", "spec.data.seed: must not be negative");

  /* what is published reads back as itself; a value the JSON cannot carry is refused first */
  spec_defaults(&s, "j");
  T_OK(spec_check_json(&s));
  s.lr = INFINITY;
  T_ERR(NEWT_ERR_INVALID, spec_validate(&s));
  T_CHECK_MSG(strstr(newt_errmsg(), "spec.train.lr"), "%s", newt_errmsg());
  spec_defaults(&s, "j");
  s.grad_clip = NAN;
  T_ERR(NEWT_ERR_INVALID, spec_validate(&s));
  T_CHECK_MSG(strstr(newt_errmsg(), "spec.train.grad_clip"), "%s", newt_errmsg());

  /* records stay lenient: etcd's gateway and newt_json_add_int write int64 as strings */
  const char *prog = "{\"generation\":\"4\",\"step\":\"120\",\"loss\":1.5,\"t_ms\":\"1700000000000000000\"}";
  job_progress p;
  T_OK(job_progress_from_json(prog, strlen(prog), &p));
  T_CHECK(p.generation == 4 && p.step == 120 && p.t_ms == 1700000000000000000ull);
  cJSON *o = cJSON_CreateObject();
  newt_json_add_int(o, "rev", 1234567890123456789LL);
  int64_t rev = 0;
  T_OK(newt_json_get_int(o, "record", "rev", 1, &rev));
  T_CHECK(rev == 1234567890123456789LL);
  T_ERR(NEWT_ERR_INVALID, newt_json_get_int_strict(o, "record", "rev", 1, &rev));
  cJSON_Delete(o);
}

static plan_member mk(const char *id, const char *host, int64_t rev, int prev_rank, int prev_pp) {
  plan_member m;
  memset(&m, 0, sizeof m);
  snprintf(m.id, sizeof m.id, "%s", id);
  snprintf(m.host, sizeof m.host, "%s", host);
  snprintf(m.addr, sizeof m.addr, "127.0.0.1:%lld", (long long)(4000 + rev));
  m.join_rev = rev;
  m.prev_rank = prev_rank;
  m.prev_pp = prev_pp;
  m.has_state = prev_rank >= 0;
  return m;
}

/* A spec of layout tp x pp with ZeRO zero, micro-batches of 1 in a global batch of 8. */
static newt_spec layout_spec(int tp, int pp, int zero) {
  newt_spec s;
  spec_defaults(&s, "j");
  s.tp = tp;
  s.pp = pp;
  s.zero = zero;
  s.global_batch = 8;
  s.micro_batch = 1;
  return s;
}

static void test_plan_dp(void) {
  newt_spec s;
  spec_defaults(&s, "j");
  s.global_batch = 24;
  s.micro_batch = 2;
  /* every replica trains: 5 ranks take 5, 5, 5, 5 and 4 samples (3, 3, 3, 3 and 2
     micro-batches); at most one sample each */
  T_CHECK(plan_choose_dp(&s, 5) == 5);
  T_CHECK(plan_choose_dp(&s, 30) == 24);
  T_CHECK(plan_accum(24, 2, 5) == 3 && plan_accum(24, 2, 4) == 3 && plan_accum(24, 2, 24) == 1);
  int64_t first, count, tiled = 0;
  for (int d = 0; d < 5; d++) { /* contiguous, every sample once, the first ones one more */
    plan_batch_slice(24, 5, d, &first, &count);
    T_CHECK(first == tiled && count == (d < 4 ? 5 : 4));
    tiled = first + count;
  }
  T_CHECK(tiled == 24);
  /* spec.parallel.even_batches: only sizes that give every rank the same whole micro-batches */
  s.even_batches = 1;
  T_CHECK(plan_choose_dp(&s, 5) == 4); /* 5 does not divide 12 micro-batches */
  T_CHECK(plan_choose_dp(&s, 12) == 12);
  T_CHECK(plan_choose_dp(&s, 0) == 0);
  plan_member m[5];
  for (int i = 0; i < 5; i++) {
    char id[8];
    snprintf(id, sizeof id, "w%d", i);
    m[i] = mk(id, "h", 10 + i, -1, -1);
  }
  newt_plan p;
  T_OK(plan_compute(&s, m, 5, 3, &p));
  T_CHECK(p.generation == 4 && p.dp == 4 && p.nranks == 4 && p.nspares == 1);
  T_CHECK(p.accum * p.dp * p.micro_batch == s.global_batch);
  T_CHECK(strcmp(p.spares[0], "w4") == 0); /* the latest joiner waits */
  T_CHECK_MSG(strcmp(p.spare_why, "the global batch of 24 samples is 12 micro-batches of 2, which split evenly over 4 "
                                  "data-parallel ranks, not 5 (spec.parallel.even_batches)") == 0,
              "spare_why: %s", p.spare_why);
  char *pj = plan_to_json(&p);
  newt_plan back;
  T_OK(plan_from_json(pj, strlen(pj), &back));
  T_CHECK(strcmp(back.spare_why, p.spare_why) == 0);
  plan_free(&back);
  /* a reason with a terminal escape (from a hostile etcd writer) is refused */
  cJSON *pjs = cJSON_Parse(pj);
  cJSON_ReplaceItemInObject(pjs, "spare_why", cJSON_CreateString("ok\033[2J"));
  char *bad = cJSON_PrintUnformatted(pjs);
  T_ERR(NEWT_ERR_INVALID, plan_from_json(bad, strlen(bad), &back));
  T_CHECK_MSG(strstr(newt_errmsg(), "plan.spare_why") != NULL, "%s", newt_errmsg());
  free(bad);
  cJSON_Delete(pjs);
  free(pj);
  T_CHECK(strcmp(p.restore, "init") == 0);
  for (int r = 0; r < 4; r++) T_CHECK(p.ranks[r].rank == r && p.ranks[r].dp == r);
  /* w1 dies: survivors keep their order, the spare fills in */
  plan_member next[4] = {mk("w0", "h", 10, 0, 0), mk("w2", "h", 12, 2, 0), mk("w3", "h", 13, 3, 0),
                         mk("w4", "h", 14, -1, -1)};
  newt_plan q;
  T_OK(plan_compute(&s, next, 4, p.generation, &q));
  T_CHECK(q.generation == 5 && q.dp == 4 && q.nspares == 0 && q.spare_why[0] == '\0');
  T_CHECK(strcmp(q.ranks[0].worker, "w0") == 0 && strcmp(q.ranks[1].worker, "w2") == 0 &&
          strcmp(q.ranks[2].worker, "w3") == 0 && strcmp(q.ranks[3].worker, "w4") == 0);
  T_CHECK(strcmp(q.restore, "peer") == 0);
  T_CHECK(memcmp(p.secret, q.secret, sizeof p.secret) != 0);
  plan_free(&p);
  plan_free(&q);
  /* too few */
  s.dp_min = 2;
  T_ERR(NEWT_ERR_UNAVAILABLE, plan_compute(&s, m, 1, 0, &p));
  T_CHECK(strstr(newt_errmsg(), "1 workers") != NULL);
  /* without even_batches every worker trains: 5 ranks, no spare, accum the most a rank takes;
     a global batch of 3 samples gives a sample to 3 ranks at most */
  s.even_batches = 0;
  s.dp_min = 1;
  T_OK(plan_compute(&s, m, 5, 3, &p));
  T_CHECK_MSG(p.dp == 5 && p.nspares == 0 && p.accum == 3 && !p.spare_why[0], "dp %d, %d spares, accum %lld", p.dp,
              p.nspares, (long long)p.accum);
  pj = plan_to_json(&p);
  T_OK(plan_from_json(pj, strlen(pj), &back)); /* accum 3 x dp 5 x 2 is not 24: the first ranks' share */
  plan_free(&back);
  free(pj);
  plan_free(&p);
  s.global_batch = 3;
  s.micro_batch = 1;
  T_OK(plan_compute(&s, m, 5, 3, &p));
  T_CHECK_MSG(p.dp == 3 && p.nspares == 2 &&
                  strcmp(p.spare_why, "the global batch of 3 samples gives a sample to at most 3 data-parallel ranks, "
                                      "not 5") == 0,
              "dp %d, %d spares: %s", p.dp, p.nspares, p.spare_why);
  plan_free(&p);
}

static void test_plan_tp_pp(void) {
  newt_spec s = layout_spec(2, 2, 0);
  /* 3 workers on host a, 3 on b, 2 on c: groups a0a1, b0b1, c0c1; a2 and b2 spare */
  plan_member m[8] = {mk("a0", "a", 1, -1, -1), mk("a1", "a", 2, -1, -1), mk("a2", "a", 3, -1, -1),
                      mk("b0", "b", 4, -1, -1), mk("b1", "b", 5, -1, -1), mk("b2", "b", 6, -1, -1),
                      mk("c0", "c", 7, -1, -1), mk("c1", "c", 8, -1, -1)};
  newt_plan p;
  T_OK(plan_compute(&s, m, 8, 0, &p));
  T_CHECK(p.dp == 1 && p.nranks == 4 && p.nspares == 4);
  /* every reason a layout has for spares, in one plan */
  T_CHECK_MSG(strcmp(p.spare_why, "2 workers make no whole tensor-parallel group (tp 2, on one host); 1 tensor-parallel "
                                  "group makes no whole pipeline (pp 2)") == 0,
              "spare_why: %s", p.spare_why);
  plan_free(&p);
  s.dp_max = 1;
  plan_member m4[4] = {mk("a0", "a", 1, -1, -1), mk("a1", "a", 2, -1, -1), mk("b0", "b", 3, -1, -1),
                       mk("b1", "b", 4, -1, -1)};
  s.pp = 1;
  T_OK(plan_compute(&s, m4, 4, 0, &p));
  T_CHECK_MSG(p.nspares == 2 && strcmp(p.spare_why, "spec.parallel.dp_max caps data parallelism at 1") == 0,
              "spare_why: %s", p.spare_why);
  s.dp_max = 64;
  s.pp = 2;
  for (int r = 0; r < p.nranks; r += 2) T_CHECK(strcmp(p.ranks[r].host, p.ranks[r + 1].host) == 0);
  for (int r = 0; r < p.nranks; r++)
    T_CHECK((p.ranks[r].pp * p.dp + p.ranks[r].dp) * p.tp + p.ranks[r].tp == r);
  plan_free(&p);
  /* stage 0 held by (x0,x1), stage 1 by (y0,y1); with a newcomer group first in order,
     survivors keep their stages */
  plan_member k[6] = {mk("n0", "n", 1, -1, -1), mk("n1", "n", 2, -1, -1), mk("y0", "y", 3, 2, 1),
                      mk("y1", "y", 4, 3, 1), mk("x0", "x", 5, 0, 0), mk("x1", "x", 6, 1, 0)};
  T_OK(plan_compute(&s, k, 6, 0, &p));
  T_CHECK(p.dp == 1);
  T_CHECK(strcmp(p.ranks[0].worker, "x0") == 0 && strcmp(p.ranks[2].worker, "y0") == 0);
  plan_free(&p);
}

/* Data-parallel neighbours on different hosts (a ZeRO shard's copy must not die with it):
   two hosts of two tensor-parallel groups each make the ring a, b, a, b. */
static void test_plan_spreads_hosts(void) {
  newt_spec s = layout_spec(2, 1, 1);
  plan_member m[8] = {mk("a0", "a", 1, -1, -1), mk("a1", "a", 2, -1, -1), mk("a2", "a", 3, -1, -1),
                      mk("a3", "a", 4, -1, -1), mk("b0", "b", 5, -1, -1), mk("b1", "b", 6, -1, -1),
                      mk("b2", "b", 7, -1, -1), mk("b3", "b", 8, -1, -1)};
  newt_plan p;
  T_OK(plan_compute(&s, m, 8, 0, &p));
  T_CHECK(p.dp == 4 && p.nranks == 8);
  for (int d = 0; d < p.dp; d++) {
    const plan_rank *r = &p.ranks[d * p.tp], *next = &p.ranks[((d + 1) % p.dp) * p.tp];
    T_CHECK_MSG(strcmp(r->host, next->host) != 0, "dp %d and %d both on host %s", d, (d + 1) % p.dp, r->host);
    T_CHECK(strcmp(p.ranks[d * p.tp].host, p.ranks[d * p.tp + 1].host) == 0); /* a group on one host */
  }
  plan_free(&p);
  /* one host: the order is kept */
  for (int i = 0; i < 8; i++) snprintf(m[i].host, sizeof m[i].host, "h");
  T_OK(plan_compute(&s, m, 8, 0, &p));
  for (int r = 0; r < p.nranks; r++) T_CHECK(strcmp(p.ranks[r].worker, m[r].id) == 0);
  plan_free(&p);
}

/* The domain of data-parallel rank d of stage pi (its group's first rank's member). */
static const char *dom_at(const newt_plan *p, const plan_member *m, int n, int pi, int d) {
  const char *id = p->ranks[(pi * p->dp + d) * p->tp].worker;
  for (int i = 0; i < n; i++)
    if (strcmp(m[i].id, id) == 0) return m[i].domain[0] ? m[i].domain : m[i].host;
  return "?";
}

/* Whether any w consecutive data-parallel ranks of every stage (around the ring) are in w
 * distinct domains; says where not. */
static int windows_distinct(const newt_plan *p, const plan_member *m, int n, int w) {
  int ok = 1;
  for (int pi = 0; pi < p->pp; pi++)
    for (int d = 0; d < p->dp; d++)
      for (int t = 1; t < w && t < p->dp; t++)
        if (strcmp(dom_at(p, m, n, pi, d), dom_at(p, m, n, pi, (d + t) % p->dp)) == 0) {
          T_FAIL("stage %d: dp %d and %d both in domain %s (window %d)", pi, d, (d + t) % p->dp,
                 dom_at(p, m, n, pi, d), w);
          ok = 0;
        }
  return ok;
}

/* spec.fault.replicas = k: any k + 1 consecutive data-parallel ranks in k + 1 distinct failure
   domains where the domains allow, the domain (not the host) deciding; an order that already
   has it is kept; every stage spread over the domains. */
static void test_plan_domains(void) {
  newt_spec s = layout_spec(1, 1, 3);
  s.global_batch = 12;
  /* six workers on one host, in three domains, joined in domain order: a a b b c c */
  plan_member m[6];
  const char *doms[6] = {"a", "a", "b", "b", "c", "c"};
  for (int i = 0; i < 6; i++) {
    char id[8];
    snprintf(id, sizeof id, "w%d", i);
    m[i] = mk(id, "h", 10 + i, -1, -1);
    snprintf(m[i].domain, sizeof m[i].domain, "%s", doms[i]);
  }
  newt_plan p;
  for (int k = 1; k <= 3; k++) { /* 3: more than the 3 domains allow; 2 is the most they do */
    s.replicas = k;
    T_OK(plan_compute(&s, m, 6, 0, &p));
    T_CHECK(p.dp == 6);
    windows_distinct(&p, m, 6, k < 3 ? k + 1 : 3);
    for (int r = 0; r < p.nranks; r++) T_CHECK(strcmp(p.ranks[r].host, "h") == 0);
    plan_free(&p);
  }
  /* an order that already has it is kept: a b c a b c by join order */
  const char *kept[6] = {"a", "b", "c", "a", "b", "c"};
  for (int i = 0; i < 6; i++) snprintf(m[i].domain, sizeof m[i].domain, "%s", kept[i]);
  s.replicas = 2;
  T_OK(plan_compute(&s, m, 6, 0, &p));
  for (int r = 0; r < p.nranks; r++) T_CHECK_MSG(strcmp(p.ranks[r].worker, m[r].id) == 0, "rank %d: %s", r, p.ranks[r].worker);
  plan_free(&p);
  /* survivors of a kept ring stay in order when a domain's workers go (w1, w4 of domain b):
     a c a c needs no move */
  plan_member surv[4] = {m[0], m[2], m[3], m[5]};
  for (int i = 0; i < 4; i++) surv[i].prev_rank = (int[]){0, 2, 3, 5}[i], surv[i].prev_pp = 0, surv[i].has_state = 1;
  s.replicas = 1;
  T_OK(plan_compute(&s, surv, 4, 1, &p));
  T_CHECK(p.dp == 4);
  for (int r = 0; r < p.nranks; r++) T_CHECK_MSG(strcmp(p.ranks[r].worker, surv[r].id) == 0, "rank %d: %s", r, p.ranks[r].worker);
  windows_distinct(&p, surv, 4, 2);
  plan_free(&p);
  /* without a domain, the host is the domain */
  for (int i = 0; i < 6; i++) {
    m[i].domain[0] = '\0';
    snprintf(m[i].host, sizeof m[i].host, "%s", doms[i]);
  }
  s.replicas = 2;
  T_OK(plan_compute(&s, m, 6, 0, &p));
  windows_distinct(&p, m, 6, 3);
  plan_free(&p);
  /* tp 2 x pp 2 x dp 2 on two hosts of four workers: each stage's two groups on both hosts
     (one host's groups making a whole stage would take that stage's shards and their only
     copies down with it) */
  s = layout_spec(2, 2, 3);
  plan_member e[8] = {mk("a0", "a", 1, -1, -1), mk("a1", "a", 2, -1, -1), mk("a2", "a", 3, -1, -1),
                      mk("a3", "a", 4, -1, -1), mk("b0", "b", 5, -1, -1), mk("b1", "b", 6, -1, -1),
                      mk("b2", "b", 7, -1, -1), mk("b3", "b", 8, -1, -1)};
  T_OK(plan_compute(&s, e, 8, 0, &p));
  T_CHECK(p.dp == 2 && p.pp == 2 && p.nranks == 8);
  windows_distinct(&p, e, 8, 2);
  for (int r = 0; r < p.nranks; r += 2) T_CHECK(strcmp(p.ranks[r].host, p.ranks[r + 1].host) == 0);
  plan_free(&p);
  /* one domain: nothing to spread, the order is that of one host before domains existed */
  for (int i = 0; i < 8; i++) snprintf(e[i].host, sizeof e[i].host, "h");
  T_OK(plan_compute(&s, e, 8, 0, &p));
  for (int r = 0; r < p.nranks; r++) T_CHECK(strcmp(p.ranks[r].worker, e[r].id) == 0);
  plan_free(&p);
}

/* The registration record: the domain is written when it is not the host, and a record of
   the previous release (no domain) reads as its host. */
static void test_registration_domain(void) {
  job_worker w, back;
  memset(&w, 0, sizeof w);
  snprintf(w.id, sizeof w.id, "w1");
  snprintf(w.host, sizeof w.host, "node-7");
  snprintf(w.domain, sizeof w.domain, "zone-a/rack-3");
  snprintf(w.addr, sizeof w.addr, "10.0.0.7:4000");
  snprintf(w.state, sizeof w.state, "ready");
  w.device = -1;
  char *json = NULL;
  T_OK(job_worker_to_json(&w, &json));
  T_CHECK_MSG(json && strstr(json, "\"domain\":\"zone-a/rack-3\""), "%s", json);
  T_OK(job_worker_from_json(json, strlen(json), "workers/w1", &back));
  T_CHECK(strcmp(back.domain, "zone-a/rack-3") == 0 && strcmp(back.host, "node-7") == 0);
  free(json);
  snprintf(w.domain, sizeof w.domain, "node-7"); /* the host's: not written, as before */
  T_OK(job_worker_to_json(&w, &json));
  T_CHECK_MSG(json && !strstr(json, "domain"), "%s", json);
  free(json);
  const char *old = "{\"id\":\"w2\",\"host\":\"node-9\",\"addr\":\"10.0.0.9:4000\",\"device\":-1,"
                    "\"state\":\"training\",\"pid\":7,\"generation\":3}";
  T_OK(job_worker_from_json(old, strlen(old), "workers/w2", &back));
  T_CHECK_MSG(strcmp(back.domain, "node-9") == 0, "domain %s", back.domain);
  const char *bad = "{\"id\":\"w2\",\"host\":\"n\",\"domain\":\"a b\\u001b\",\"state\":\"ready\"}";
  T_ERR(NEWT_ERR_INVALID, job_worker_from_json(bad, strlen(bad), "workers/w2", &back));
  T_CHECK_MSG(strstr(newt_errmsg(), "workers/w2.domain") != NULL, "%s", newt_errmsg());
  const char *num = "{\"id\":\"w2\",\"host\":\"n\",\"domain\":7,\"state\":\"ready\"}";
  T_ERR(NEWT_ERR_INVALID, job_worker_from_json(num, strlen(num), "workers/w2", &back));
  T_CHECK_MSG(strstr(newt_errmsg(), "domain") != NULL, "%s", newt_errmsg());
}

/* tp 2 x pp 2 x dp 2 loses rank 5 (pp 1, dp 0, tp 1): the whole groups (0,1), (2,3) and
   (6,7) must make the new layout, not a group glued from rank 4 and rank 6. */
static void test_plan_keeps_whole_groups(void) {
  newt_spec s = layout_spec(2, 2, 0);
  plan_member m[7];
  int ranks[7] = {0, 1, 2, 3, 4, 6, 7};
  for (int i = 0; i < 7; i++) {
    char id[8];
    snprintf(id, sizeof id, "r%d", ranks[i]);
    int r = ranks[i];
    m[i] = mk(id, "h", 10 + i, r, r / 4); /* rank = (pp * 2 + dp) * 2 + tp */
  }
  newt_plan p;
  T_OK(plan_compute(&s, m, 7, 1, &p));
  T_CHECK(p.dp == 1 && p.nranks == 4);
  /* stage 1 is the whole group (6, 7), each keeping its tp index */
  T_CHECK_MSG(strcmp(p.ranks[2].worker, "r6") == 0 && strcmp(p.ranks[3].worker, "r7") == 0, "stage 1: %s %s",
              p.ranks[2].worker, p.ranks[3].worker);
  T_CHECK(strcmp(p.ranks[0].worker, "r0") == 0 && strcmp(p.ranks[1].worker, "r1") == 0);
  T_CHECK(plan_is_spare(&p, "r4"));
  plan_free(&p);
}

static void test_plan_json(void) {
  newt_spec s;
  spec_defaults(&s, "j");
  s.global_batch = 8;
  s.micro_batch = 2;
  s.even_batches = 1; /* 3 workers: dp 2 and a spare */
  plan_member m[3] = {mk("w0", "h", 1, -1, -1), mk("w1", "h", 2, -1, -1), mk("w2", "h", 3, -1, -1)};
  newt_plan p, q;
  T_OK(plan_compute(&s, m, 3, 9, &p));
  char *text = plan_to_json(&p);
  T_OK(plan_from_json(text, strlen(text), &q));
  T_CHECK(q.generation == 10 && q.nranks == p.nranks && q.nspares == p.nspares);
  T_CHECK(memcmp(q.secret, p.secret, sizeof p.secret) == 0);
  T_CHECK(plan_find(&q, "w1") && plan_find(&q, "w1")->rank == 1);
  T_CHECK(plan_is_spare(&q, "w2") && !plan_find(&q, "w2"));
  plan_free(&q);
  /* a rank's failure domain: written only when not its host (the previous release's plan
     otherwise), read back, its host when absent */
  T_CHECK(text && !strstr(text, "\"domain\""));
  plan_member md[2] = {mk("w0", "h0", 1, -1, -1), mk("w1", "h1", 2, -1, -1)};
  snprintf(md[1].domain, sizeof md[1].domain, "rack7");
  newt_plan pd;
  s.even_batches = 0;
  T_OK(plan_compute(&s, md, 2, 1, &pd));
  char *td = plan_to_json(&pd);
  const char *d1 = td ? strstr(td, "\"domain\"") : NULL; /* w1's alone */
  T_CHECK_MSG(d1 && strncmp(d1, "\"domain\":\"rack7\"", 16) == 0 && !strstr(d1 + 1, "\"domain\""), "%s", td);
  T_OK(plan_from_json(td, strlen(td), &q));
  T_CHECK(plan_find(&q, "w1") && strcmp(plan_rank_domain(plan_find(&q, "w1")), "rack7") == 0);
  T_CHECK(plan_find(&q, "w0") && strcmp(plan_rank_domain(plan_find(&q, "w0")), "h0") == 0 && !plan_find(&q, "w0")->domain[0]);
  plan_free(&q);
  plan_free(&pd);
  free(td);
  /* a donor after the ranks */
  newt_plan dn;
  T_OK(plan_copy(&dn, &p));
  T_OK(plan_add_donor(&dn, "w9", "h", "127.0.0.1:9"));
  char *dt = plan_to_json(&dn);
  T_OK(plan_from_json(dt, strlen(dt), &q));
  T_CHECK(q.ndonors == 1 && q.donors[0].rank == q.nranks && plan_find_donor(&q, "w9") && !plan_find(&q, "w9"));
  plan_free(&q);
  free(dt);
  T_OK(plan_add_donor(&dn, "w0", "h", "127.0.0.1:10")); /* a rank cannot also donate */
  dt = plan_to_json(&dn);
  T_ERR(NEWT_ERR_INVALID, plan_from_json(dt, strlen(dt), &q));
  T_CHECK(strstr(newt_errmsg(), "plan.donors[1].worker") != NULL);
  free(dt);
  plan_free(&dn);
  struct {
    const char *from, *to, *needle;
  } bad[] = {
      {"\"accum\":2", "\"accum\":3", "plan.accum"},
      {"\"rank\":1", "\"rank\":2", "plan.ranks[1].rank"},
      {"\"worker\":\"w1\"", "\"worker\":\"w0\"", "plan.ranks[1].worker"},
      {"\"generation\":10", "\"generation\":\"x\"", "plan.generation"},
      /* a forged generation (issue 17, item 6): beyond what any job counts, and JSON's 2^53 */
      {"\"generation\":10", "\"generation\":\"9223372036854775807\"", "plan.generation"},
      {"\"generation\":10", "\"generation\":9007199254740992", "plan.generation"},
      {"\"switch\":\"boundary\"", "\"switch\":\"later\"", "plan.switch"},
      {"\"dp\":2,", "\"dp\":9,", "plan.dp: 9 data-parallel ranks for a global batch of 8"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char *b = strstr(text, bad[i].from);
    T_CHECK_MSG(b != NULL, "fixture %s not in %s", bad[i].from, text);
    if (!b) continue;
    char mod[4096];
    snprintf(mod, sizeof mod, "%.*s%s%s", (int)(b - text), text, bad[i].to, b + strlen(bad[i].from));
    T_CHECK_MSG(plan_from_json(mod, strlen(mod), &q) == NEWT_ERR_INVALID, "accepted %s", mod);
    T_CHECK_MSG(strstr(newt_errmsg(), bad[i].needle) != NULL, "error \"%s\" lacks %s", newt_errmsg(), bad[i].needle);
  }
  T_ERR(NEWT_ERR_INVALID, plan_from_json(text, strlen(text) / 2, &q));
  /* a layout of 4 ranks with 2 listed */
  char mod[4096];
  snprintf(mod, sizeof mod, "%s", text);
  char *d = strstr(mod, "\"dp\":2,"), *a = strstr(mod, "\"accum\":2");
  T_CHECK(d && a);
  if (d && a) {
    d[5] = '4';
    a[8] = '1';
    T_ERR(NEWT_ERR_INVALID, plan_from_json(mod, strlen(mod), &q));
    T_CHECK_MSG(strstr(newt_errmsg(), "plan.ranks: 2 entries") != NULL, "%s", newt_errmsg());
  }
  free(text);
  plan_free(&p);
}

/* A plan read from etcd (issue 24, items 1, 2 and 6): products that overflow, fields that
 * disagree with the spec, generations that jump or pass the bound, control bytes. */
static void test_plan_hostile(void) {
  newt_spec s;
  spec_defaults(&s, "j");
  s.global_batch = 8;
  s.micro_batch = 2;
  plan_member m[3] = {mk("w0", "h", 1, -1, -1), mk("w1", "h", 2, -1, -1), mk("w2", "h", 3, -1, -1)};
  newt_plan p, q;
  T_OK(plan_compute(&s, m, 3, 9, &p));
  char *text = plan_to_json(&p), mod[4096];
  struct {
    const char *from, *to, *needle;
  } bad[] = {
      /* accum x dp x micro_batch = 8 modulo 2^64: the check itself must not overflow */
      {"\"accum\":2", "\"accum\":4611686018427387906", "plan.accum"},
      {"\"accum\":2", "\"accum\":9223372036854775807", "plan.accum"},
      /* what newt status prints: no terminal escape, no newline */
      {"\"worker\":\"w1\"", "\"worker\":\"w\\u001b[2J\"", "plan.ranks[1].worker"},
      {"\"cause\":\"", "\"cause\":\"\\n\\u001b[2J", "plan.cause"},
      {"\"host\":\"h\"", "\"host\":\"h \\u0007\"", "plan.ranks[0].host"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char *b = strstr(text, bad[i].from);
    T_CHECK_MSG(b != NULL, "fixture %s not in %s", bad[i].from, text);
    if (!b) continue;
    snprintf(mod, sizeof mod, "%.*s%s%s", (int)(b - text), text, bad[i].to, b + strlen(bad[i].from));
    T_CHECK_MSG(plan_from_json(mod, strlen(mod), &q) == NEWT_ERR_INVALID, "accepted %s", mod);
    T_CHECK_MSG(strstr(newt_errmsg(), bad[i].needle) != NULL, "error \"%s\" lacks %s", newt_errmsg(), bad[i].needle);
    for (const char *c = newt_errmsg(); *c; c++)
      T_CHECK_MSG((unsigned char)*c >= 0x20 && *c != 0x7f, "a control byte in the error: %s", newt_errmsg());
  }
  /* the fields the spec fixes, each named */
  T_OK(plan_check_spec(&p, &s));
  struct {
    int64_t *field;
    int64_t value;
    const char *needle;
  } fixed[] = {{&s.global_batch, 4096, "plan.global_batch is 8, the job's spec fixes it at 4096"},
               {&s.micro_batch, 4, "plan.micro_batch is 2"},
               {&s.tp, 2, "plan.tp is 1"},
               {&s.pp, 2, "plan.pp is 1"},
               {&s.zero, 3, "plan.zero is 0"}};
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
    int64_t keep = *fixed[i].field;
    *fixed[i].field = fixed[i].value;
    T_ERR(NEWT_ERR_INVALID, plan_check_spec(&p, &s));
    T_CHECK_MSG(strstr(newt_errmsg(), fixed[i].needle) != NULL, "error \"%s\" lacks %s", newt_errmsg(),
                fixed[i].needle);
    *fixed[i].field = keep;
  }
  /* generations: a jump far past the newest known is refused; with none known, anything */
  T_OK(plan_check_jump(0, (uint64_t)NEWT_JSON_INT_EXACT - 2));
  T_OK(plan_check_jump(10, 11));
  T_OK(plan_check_jump(10, 10 + PLAN_MAX_JUMP));
  T_ERR(NEWT_ERR_INVALID, plan_check_jump(10, 10 + PLAN_MAX_JUMP + 1));
  T_ERR(NEWT_ERR_INVALID, plan_check_jump(10, (uint64_t)NEWT_JSON_INT_EXACT - 2));
  T_CHECK(strstr(newt_errmsg(), "forged or corrupt") != NULL);
  /* a leader publishes only what its readers take: the last valid generation, not one past it */
  char *json = NULL;
  p.generation = (uint64_t)NEWT_JSON_INT_EXACT - 1;
  T_OK(plan_check_publishable(&p, &json));
  T_OK(json ? plan_from_json(json, strlen(json), &q) : NEWT_ERR_INTERNAL);
  if (json) plan_free(&q);
  free(json);
  p.generation = (uint64_t)NEWT_JSON_INT_EXACT;
  T_ERR(NEWT_ERR_INVALID, plan_check_publishable(&p, &json));
  T_CHECK(json == NULL && strstr(newt_errmsg(), "past the largest a plan may have") != NULL);
  free(text);
  plan_free(&p);
}

/* Stragglers (issue 41): the leader gives a slow data-parallel rank a smaller share of the
 * global batch, in proportion to the measured speeds, and the plan carries the shares (a new
 * field, written only when set: a plan of even shares is the previous release's bytes). */
static void test_plan_shares(void) {
  int64_t out[4];
  double speed[4] = {2, 2, 2, 1}; /* one rank at half speed */
  T_OK(plan_shares_by_speed(24, 4, speed, out));
  T_CHECK_MSG(out[0] == 7 && out[1] == 7 && out[2] == 7 && out[3] == 3, "shares %lld %lld %lld %lld",
              (long long)out[0], (long long)out[1], (long long)out[2], (long long)out[3]);
  double slow[3] = {1000, 1, 1}; /* a sample each at least */
  T_OK(plan_shares_by_speed(5, 3, slow, out));
  T_CHECK(out[0] == 3 && out[1] == 1 && out[2] == 1);
  double bad[2] = {1, 0};
  T_CHECK(plan_shares_by_speed(8, 2, bad, out) == NEWT_ERR_INVALID);
  T_CHECK(plan_shares_by_speed(1, 2, speed, out) == NEWT_ERR_INVALID);
  /* measured compute per sample: within the margin the shares stay even (NULL) */
  newt_result_t err;
  double near[4] = {100, 110, 105, 120}, far[4] = {100, 100, 0, 200};
  T_CHECK(plan_shares_for(24, 4, near, 0.25, &err) == NULL && err == NEWT_OK);
  int64_t *sh = plan_shares_for(24, 4, far, 0.25, &err); /* the unmeasured one: the median's speed */
  T_CHECK(sh && sh[0] == 7 && sh[1] == 7 && sh[2] == 7 && sh[3] == 3);
  free(sh);
  /* plan_compute: the members' measurements make the shares, a slice each, accum the most */
  newt_spec s;
  spec_defaults(&s, "j");
  s.global_batch = 24;
  s.micro_batch = 2;
  plan_member m[4];
  for (int i = 0; i < 4; i++) {
    char id[8];
    snprintf(id, sizeof id, "w%d", i);
    m[i] = mk(id, "h", 10 + i, i, 0);
    m[i].sample_us = i == 2 ? 900 : 450;
  }
  newt_plan p, q;
  T_OK(plan_compute(&s, m, 4, 1, &p));
  T_CHECK(p.shares && p.shares[0] == 7 && p.shares[1] == 7 && p.shares[2] == 3 && p.shares[3] == 7);
  T_CHECK_MSG(p.accum == 4, "accum %lld", (long long)p.accum);
  int64_t first, count, at = 0;
  for (int d = 0; d < 4; d++) {
    plan_slice(&p, d, &first, &count);
    T_CHECK(first == at && count == p.shares[d]);
    at += count;
  }
  T_CHECK(at == 24);
  char *json = plan_to_json(&p);
  T_CHECK(json && strstr(json, "\"shares\":[7,7,3,7]"));
  T_OK(plan_from_json(json, strlen(json), &q));
  T_CHECK(q.shares && q.shares[2] == 3 && q.accum == 4);
  newt_plan c;
  T_OK(plan_copy(&c, &q));
  T_CHECK(c.shares && c.shares != q.shares && c.shares[3] == 7);
  plan_free(&c);
  plan_free(&q);
  /* shares that are no split of the global batch, or that the accum does not follow */
  static const struct {
    const char *from, *to, *err;
  } bad_shares[] = {
      {"[7,7,3,7]", "[7,7,3,6]", "plan.shares: 23 samples in all, the global batch is 24"},
      {"[7,7,3,7]", "[7,7,10]", "plan.shares: 3 entries, expected dp = 4"},
      {"[7,7,3,7]", "[7,7,0,10]", "plan.shares[2]: expected a whole number of samples 1..24"},
      {"[7,7,3,7]", "[6,6,6,6]", "plan.accum: 4, but"},
  };
  for (size_t i = 0; json && i < sizeof bad_shares / sizeof bad_shares[0]; i++) {
    char buf[4096];
    const char *at_ = strstr(json, bad_shares[i].from);
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at_ - json), json, bad_shares[i].to, at_ + strlen(bad_shares[i].from));
    newt_plan r;
    T_CHECK(plan_from_json(buf, strlen(buf), &r) == NEWT_ERR_INVALID);
    T_CHECK_MSG(strstr(newt_errmsg(), bad_shares[i].err) != NULL, "%s", newt_errmsg());
  }
  free(json);
  plan_free(&p);
  /* even speeds, or rebalancing off: no shares, and the record has none */
  for (int i = 0; i < 4; i++) m[i].sample_us = 450;
  T_OK(plan_compute(&s, m, 4, 1, &p));
  json = plan_to_json(&p);
  T_CHECK(!p.shares && json && !strstr(json, "shares"));
  free(json);
  plan_free(&p);
  m[2].sample_us = 900;
  s.straggler_window = 0;
  T_OK(plan_compute(&s, m, 4, 1, &p));
  T_CHECK(!p.shares && p.accum == 3);
  plan_free(&p);
}

/* --- the ranks' reader (issue 42) ---------------------------------------------------------------
 *
 * plan_from_json reads the ranks of plan_to_json's form itself and any other form through
 * cJSON: both must give the same plan, and the same errors. */

static newt_plan reader_plan(void) {
  newt_plan p;
  memset(&p, 0, sizeof p);
  p.generation = 3, p.created_ms = 1;
  snprintf(p.cause, sizeof p.cause, "crash");
  snprintf(p.switch_mode, sizeof p.switch_mode, "abort");
  snprintf(p.restore, sizeof p.restore, "peer");
  p.dp = 4, p.tp = 2, p.pp = 2, p.global_batch = 8, p.micro_batch = 1, p.accum = plan_accum(8, 1, 4);
  p.nranks = 16;
  p.ranks = calloc(16, sizeof *p.ranks);
  p.spares = calloc(1, sizeof *p.spares);
  p.nspares = 1;
  snprintf(p.spares[0], PLAN_ID_MAX, "sp");
  snprintf(p.spare_why, sizeof p.spare_why, "one too many");
  for (int i = 0; i < 16; i++) {
    plan_rank *r = &p.ranks[i];
    r->rank = i, r->tp = i % 2, r->dp = (i / 2) % 4, r->pp = i / 8;
    snprintf(r->worker, sizeof r->worker, "w%02d", (i * 7) % 16);
    snprintf(r->host, sizeof r->host, "h%d", i / 4);
    snprintf(r->addr, sizeof r->addr, "10.0.0.%d:4000", i);
    if (i % 5 == 0) snprintf(r->domain, sizeof r->domain, "rack%d", i / 5);
  }
  plan_add_donor(&p, "dn", "h9", "10.0.1.1:4000");
  return p;
}

/* text reads as the plan whose JSON is want, every rank found by its worker. */
static int reads_as(const char *text, const char *want) {
  newt_plan q;
  if (!text || plan_from_json(text, strlen(text), &q) != NEWT_OK) return 0;
  char *got = plan_to_json(&q);
  int ok = got && strcmp(got, want) == 0;
  for (int i = 0; ok && i < q.nranks; i++) ok = plan_find(&q, q.ranks[i].worker) == &q.ranks[i];
  ok = ok && !plan_find(&q, "dn") && plan_find_donor(&q, "dn");
  free(got);
  plan_free(&q);
  return ok;
}

/* text is refused with exactly msg. */
static int refused_as(const char *text, const char *msg) {
  newt_plan q;
  if (!text) return 0;
  if (plan_from_json(text, strlen(text), &q) == NEWT_OK) {
    plan_free(&q);
    return 0;
  }
  if (strcmp(newt_errmsg(), msg) != 0) fprintf(stderr, "got: %s\n", newt_errmsg());
  return strcmp(newt_errmsg(), msg) == 0;
}

static void test_plan_reader_forms(void) {
  newt_plan p = reader_plan();
  char *text = plan_to_json(&p), *t;
  T_CHECK(reads_as(text, text));
  /* forms cJSON reads: whitespace, other key orders, escapes, numbers as decimal strings or
     with an exponent, a key a rank does not know, "ranks" twice (the first counts) */
  cJSON *j = cJSON_Parse(text);
  for (cJSON *r = cJSON_GetObjectItem(j, "ranks")->child; r; r = r->next)
    cJSON_AddItemToObject(r, "rank", cJSON_DetachItemFromObject(r, "rank")); /* last */
  char *pretty = cJSON_Print(j);
  cJSON_Delete(j);
  T_CHECK(strchr(pretty, '\n') && reads_as(pretty, text));
  free(pretty);
  const char *same[][2] = {
      {"\"worker\":\"w07\"", "\"worker\":\"\\u0077\\u00307\""},
      {"\"rank\":5,", "\"rank\":\"5\","},
      {"\"rank\":5,", "\"rank\":5e0,"},
      {"\"rank\":5,", "\"rank\":005,"},
      {"\"dp\":0,", "\"dp\":-0,"},
      {"\"rank\":5,", "\"rank\":5,\"x\":[1,{\"y\":\"]\"}],"},
      {"\"spares\"", "\"ranks\":[],\"spares\""},
      {"\"generation\":3", " \t\n\"generation\" : 3 "},
  };
  for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) {
    t = t_replaced(text, same[k][0], same[k][1]);
    T_CHECK_MSG(reads_as(t, text), "%s -> %s", same[k][0], same[k][1]);
    free(t);
  }
  /* and what is refused, named as before */
  const char *refused[][3] = {
      {"\"worker\":\"w07\"", "\"worker\":\"w00\"", "plan.ranks[1].worker: \"w00\" is also rank 0"},
      {"\"rank\":5,\"worker\":\"w03\",\"host\":\"h1\",\"addr\":\"10.0.0.5:4000\",\"dp\":2",
       "\"rank\":5,\"worker\":\"w03\",\"host\":\"h1\",\"addr\":\"10.0.0.5:4000\",\"dp\":3",
       "plan.ranks[5]: coordinates (dp 3, tp 1, pp 0) do not give rank 5"},
      {"\"rank\":5,", "\"rank\":6,", "plan.ranks[5].rank: 6 is out of range [5, 5]"},
      {"\"rank\":5,", "\"rank\":5.5,", "plan.ranks[5].rank: expected an integer, got 5.5"},
      {"\"worker\":\"w07\"", "\"worker\":\"w 7\"", "plan.ranks[1].worker: byte 0x20 at 1 is not a printable character of a name"},
      {"\"worker\":\"w07\",", "", "plan.ranks[1].worker: missing required field"},
      {"\"rank\":5,", "\"rank\":5,\"rank\":6,", NULL}, /* cJSON takes the first: read */
      {"\"ranks\":[", "\"ranks\":[{},", "plan.ranks: 17 entries, expected dp x tp x pp = 16"},
      {"\"host\":\"h1\"", "\"host\":\"h1", NULL},
  };
  for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++) {
    t = t_replaced(text, refused[k][0], refused[k][1]);
    if (!refused[k][2] && k == 6) T_CHECK(reads_as(t, text));
    else if (!refused[k][2]) T_CHECK(t && plan_from_json(t, strlen(t), &(newt_plan){0}) != NEWT_OK &&
                                     strstr(newt_errmsg(), "malformed JSON at byte"));
    else T_CHECK_MSG(refused_as(t, refused[k][2]), "%s", refused[k][2]);
    free(t);
  }
  free(text);
  plan_free(&p);
}

int main(void) {
  T_RUN(test_spec);
  T_RUN(test_spec_numbers);
  T_RUN(test_plan_dp);
  T_RUN(test_plan_shares);
  T_RUN(test_plan_tp_pp);
  T_RUN(test_plan_keeps_whole_groups);
  T_RUN(test_plan_spreads_hosts);
  T_RUN(test_plan_domains);
  T_RUN(test_registration_domain);
  T_RUN(test_plan_json);
  T_RUN(test_plan_hostile);
  T_RUN(test_plan_reader_forms);
  return T_DONE();
}
