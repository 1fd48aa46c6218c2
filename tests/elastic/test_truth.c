/* newt never claims what did not happen (issue 35): real `newt run` jobs, faults injected for
 * real, and what newt says of them checked against what happened.
 *
 *   state_loss  two neighbouring data-parallel ranks killed at once under ZeRO 1 and ZeRO 3,
 *               with one copy of each shard (spec.fault.replicas 1): no step is whole in the
 *               survivors' memory. Without a checkpoint the job fails -- newt run exits 4,
 *               says why (the step, the ranks gone, what was lost, the remedy), the summary's
 *               outcome is "failed" and every worker's termination message says the same;
 *               with --on-state-loss fail it fails although a checkpoint is there; with
 *               --on-state-loss restart it starts again from the initial state and says so.
 *   state_ckpt  the same loss with checkpoints: the job resumes from the newest one, ends
 *               done at the uninterrupted run's loss, and its recovery says so.
 *   flip        one bit of one rank's replicated weights flipped (chaos flip:rank:1@step=15):
 *               the check at step 20 names the tensor and the rank, the job rolls back to step
 *               10 and ends at the uninterrupted loss (1e-5 relative), the rollback in the
 *               summary; without the check (--verify-every 0) the same flip ends elsewhere
 *               (the fault is real), and with --on-mismatch fail the job fails naming it.
 *   drift       a PyTorch program with BatchNorm declared as state: its running statistics
 *               drift apart on each rank by its own code; the first check (after the job's
 *               first step) names them with the way out and fails the job: there is no
 *               verified step to go back to, and it is the program's own doing.
 *   left_out    a worker stopped (SIGSTOP), left out, and woken only once the job is done
 *               (newt run wakes what it stopped at the end): it claims nothing of the job's
 *               success -- it exits 5, its termination message says the step it was left out
 *               at and the job's end as the end marker says -- and newt run counts it.
 *
 * usage: NEWT_BIN=path/to/newt test_truth <scenario> (one ctest test per scenario). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/json.h"
#include "common/proc.h"
#include "tests/elastic/e2e.h"
#include "test.h"

#define GB "24"
#define MB "2"
#define MODEL "layers=2,channels=64"
#define SEQ "32"

static const char *newt_bin;
static char tmpdir[256];

/* Runs argv, its stdout and stderr into *out (malloc'd); returns the exit status or -1. */
static int run_capture(const char *const *argv, char **out) { return e2e_run_capture(tmpdir, argv, out); }

/* One `newt run` of the test model on nproc workers (tag: its job, logs in tmpdir/<tag> and
 * summary tmpdir/<tag>.json), with more flags (NULL-terminated); its exit status, its
 * output in *out. */
static int job_run(const char *tag, int nproc, int steps, const char *const *extra, char **out) {
  char logs[512], summary[512], st[16], np[16];
  snprintf(logs, sizeof logs, "%s/%s", tmpdir, tag);
  snprintf(summary, sizeof summary, "%s/%s.json", tmpdir, tag);
  snprintf(st, sizeof st, "%d", steps);
  snprintf(np, sizeof np, "%d", nproc);
  const char *argv[48] = {newt_bin, "run", "--quiet", "--job", tag, "--nproc", np, "--model", MODEL, "--seq-len", SEQ,
                          "--steps", st, "--global-batch", GB, "--micro-batch", MB, "--log-dir", logs, "--summary",
                          summary, "--timeout-ms", "180000"};
  int a = 23;
  for (int i = 0; extra && extra[i] && a < 47; i++) argv[a++] = extra[i];
  return run_capture(argv, out);
}

/* The summary of run `tag` (NULL when it cannot be read). */
static cJSON *summary_of(const char *tag) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s.json", tmpdir, tag);
  return e2e_read_json(path);
}

/* The loss of `newt train` over the same steps, batch and model (NaN when it failed). */
static double train_loss(int steps) { return e2e_train_loss(tmpdir, newt_bin, MODEL, SEQ, GB, MB, steps); }

/* Every worker of run tag that wrote a termination message says `prefix`...; how many did. */
static int ends_say(const char *tag, int nproc, const char *prefix, const char *also) {
  int n = 0;
  for (int i = 0; i < nproc; i++) {
    char path[600], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/%s/w%d.end", tmpdir, tag, i);
    if (newt_fs_read_all(path, 1 << 16, &text, &len) != NEWT_OK) continue; /* killed: no message */
    T_CHECK_MSG(strncmp(text, prefix, strlen(prefix)) == 0 && (!also || strstr(text, also)),
                "%s: w%d's termination message is not \"%s...\"%s%s: %s", tag, i, prefix, also ? " with " : "",
                also ? also : "", text);
    n++;
    free(text);
  }
  return n;
}

/* Two neighbours in the data-parallel ring (ranks 1 and 2 of 4: rank 1's shard and its one
   copy) killed at once */
#define KILL2 "kill:rank:1@step=12,kill:rank:2@step=12"

/* A lost state fails the job: exit 4, the reason everywhere, nothing claimed. */
static void check_failed(const char *tag, int rc, const char *out, const char *because) {
  T_CHECK_MSG(rc == 4, "%s: newt run exited %d, expected 4 (the job failed):\n%s", tag, rc, out ? out : "");
  T_CHECK_MSG(out && strstr(out, "the job failed: state lost at step ") && strstr(out, "rank 1 (") &&
                  strstr(out, "rank 2 (") && strstr(out, "lost: parts of ") && strstr(out, because) &&
                  strstr(out, "Remedy: ") && strstr(out, "--replicas") && strstr(out, "--ckpt-every") &&
                  strstr(out, "--on-state-loss restart"),
              "%s: newt run does not say why the job failed:\n%s", tag, out ? out : "");
  T_CHECK_MSG(!out || !strstr(out, "newt run: done"), "%s: newt run claims the job done:\n%s", tag, out);
  cJSON *s = summary_of(tag);
  T_CHECK_MSG(s && strcmp(e2e_str(s, "outcome"), "failed") == 0 && strstr(e2e_str(s, "failed"), "state lost at step "),
              "%s: the summary's outcome is \"%s\" (failed: \"%s\")", tag, e2e_str(s, "outcome"), e2e_str(s, "failed"));
  const cJSON *done = s ? cJSON_GetObjectItemCaseSensitive(s, "done") : NULL;
  T_CHECK_MSG(cJSON_IsFalse(done), "%s: the summary says the job is done", tag);
  cJSON_Delete(s);
  /* the two survivors (and no one else) said it in their termination messages */
  T_CHECK_MSG(ends_say(tag, 4, "failed: state lost at step ", because) == 2,
              "%s: not every survivor ended with the failure", tag);
}

static void test_state_loss(void) {
  char *out = NULL;
  /* ZeRO 1 and ZeRO 3 without a checkpoint: the job fails */
  const char *z1[] = {"--zero", "1", "--chaos", KILL2, NULL};
  int rc = job_run("z1", 4, 40, z1, &out);
  check_failed("z1", rc, out, "there is no checkpoint to go back to");
  free(out);
  const char *z3[] = {"--zero", "3", "--chaos", KILL2, NULL};
  rc = job_run("z3", 4, 40, z3, &out);
  check_failed("z3", rc, out, "there is no checkpoint to go back to");
  free(out);
  /* a checkpoint to go back to, but the spec says fail */
  char ck[400];
  snprintf(ck, sizeof ck, "%s/fail.ckpt", tmpdir);
  const char *fail[] = {"--zero", "3", "--ckpt-dir", ck, "--ckpt-every", "5", "--on-state-loss", "fail", "--chaos",
                        "kill:rank:1@ckpt=10,kill:rank:2@ckpt=10", NULL};
  rc = job_run("fail", 4, 40, fail, &out);
  check_failed("fail", rc, out, "spec.fault.on_state_loss is fail");
  free(out);
  /* the opt-in: training starts again from the initial state, said, and ends done at the
     uninterrupted loss (the same spec from step 0) */
  const char *restart[] = {"--zero", "1", "--on-state-loss", "restart", "--chaos", KILL2, NULL};
  rc = job_run("restart", 4, 40, restart, &out);
  T_CHECK_MSG(rc == 0, "restart: newt run exited %d:\n%s", rc, out ? out : "");
  free(out);
  cJSON *s = summary_of("restart");
  const cJSON *recs = s ? cJSON_GetObjectItemCaseSensitive(s, "recoveries") : NULL;
  const cJSON *r0 = recs ? cJSON_GetArrayItem(recs, 0) : NULL;
  T_CHECK_MSG(cJSON_GetArraySize(recs) == 1 && strcmp(e2e_str(r0, "restore"), "init") == 0 && e2e_num(r0, "step") == 0,
              "restart: the recovery did not start again from the initial state");
  T_CHECK_MSG(e2e_num(r0, "fault_step") >= 12 && e2e_num(r0, "steps_lost") == e2e_num(r0, "fault_step") &&
                  e2e_num(s, "samples_repeated") == e2e_num(r0, "steps_lost") * 24,
              "restart: fault_step %.0f, steps_lost %.0f, samples_repeated %.0f do not add up", e2e_num(r0, "fault_step"),
              e2e_num(r0, "steps_lost"), e2e_num(s, "samples_repeated"));
  T_CHECK_MSG(strcmp(e2e_str(s, "outcome"), "done") == 0, "restart: outcome %s", e2e_str(s, "outcome"));
  double ref = train_loss(40);
  T_CHECK_MSG(fabs(e2e_num(s, "final_loss") - ref) <= 1e-4 * fmax(1.0, fabs(ref)), "restart: final loss %.7f, "
              "uninterrupted %.7f", e2e_num(s, "final_loss"), ref);
  cJSON_Delete(s);
  char log[600], *text = NULL;
  size_t n;
  int said = 0;
  for (int i = 0; i < 4 && !said; i++) {
    snprintf(log, sizeof log, "%s/restart/w%d.log", tmpdir, i);
    if (newt_fs_read_all(log, 64 << 20, &text, &n) != NEWT_OK) continue;
    said = strstr(text, "starts again from its initial state (spec.fault.on_state_loss restart)") != NULL;
    free(text);
  }
  T_CHECK_MSG(said, "restart: no worker said that training starts again from the initial state");
}

/* With checkpoints the same loss goes back to the newest one, and says so. */
static void test_state_ckpt(void) {
  char ck[400], *out = NULL;
  snprintf(ck, sizeof ck, "%s/ck", tmpdir);
  const char *flags[] = {"--zero", "3", "--ckpt-dir", ck, "--ckpt-every", "5", "--chaos",
                         "kill:rank:1@ckpt=10,kill:rank:2@ckpt=10", NULL};
  int rc = job_run("ckpt", 4, 40, flags, &out);
  T_CHECK_MSG(rc == 0, "ckpt: newt run exited %d:\n%s", rc, out ? out : "");
  free(out);
  cJSON *s = summary_of("ckpt");
  const cJSON *recs = s ? cJSON_GetObjectItemCaseSensitive(s, "recoveries") : NULL;
  const cJSON *r0 = recs ? cJSON_GetArrayItem(recs, 0) : NULL;
  T_CHECK_MSG(cJSON_GetArraySize(recs) == 1 && strcmp(e2e_str(r0, "restore"), "ckpt") == 0 && e2e_num(r0, "step") >= 10,
              "ckpt: the recovery did not go back to a checkpoint");
  /* one account: the step the fault hit, the step training went on from, the steps redone,
     and the samples trained twice */
  double fault = e2e_num(r0, "fault_step"), from = e2e_num(r0, "step"), lost = e2e_num(r0, "steps_lost");
  T_CHECK_MSG(fault >= 10 && lost == fault - from && lost > 0 && e2e_num(s, "samples_repeated") == lost * 24,
              "ckpt: fault_step %.0f, step %.0f, steps_lost %.0f, samples_repeated %.0f do not add up", fault, from, lost,
              e2e_num(s, "samples_repeated"));
  T_CHECK_MSG(strcmp(e2e_str(s, "outcome"), "done") == 0 && e2e_num(s, "steps") == 40, "ckpt: outcome %s",
              e2e_str(s, "outcome"));
  double ref = train_loss(40);
  T_CHECK_MSG(fabs(e2e_num(s, "final_loss") - ref) <= 1e-4 * fmax(1.0, fabs(ref)),
              "ckpt: final loss %.7f, uninterrupted %.7f", e2e_num(s, "final_loss"), ref);
  cJSON_Delete(s);
}

/* The summary's mismatches (NULL when none). */
static const cJSON *mismatches_of(const cJSON *s) { return s ? cJSON_GetObjectItemCaseSensitive(s, "mismatches") : NULL; }

static void test_flip(void) {
  double ref = train_loss(40);
  char *out = NULL;
  /* a layer norm's gain halved (or doubled) on rank 1 after step 15 */
#define FLIP "flip:rank:1:h.0.ln1.w@step=15"
  const char *flip[] = {"--chaos", FLIP, NULL};
  int rc = job_run("flip", 4, 40, flip, &out);
  T_CHECK_MSG(rc == 0, "flip: newt run exited %d:\n%s", rc, out ? out : "");
  free(out);
  cJSON *s = summary_of("flip");
  const cJSON *m = mismatches_of(s), *m0 = cJSON_GetArrayItem(m, 0);
  T_CHECK_MSG(cJSON_GetArraySize(m) == 1 && e2e_num(m0, "step") == 20 && e2e_num(m0, "back_to") == 10 &&
                  strcmp(e2e_str(m0, "action"), "rollback") == 0 &&
                  strstr(e2e_str(m0, "why"), "replicas disagree at step 20: h.0.ln1.w (1 tensor) differs on rank 1 (") &&
                  strstr(e2e_str(m0, "why"), "rolled back to step 10"),
              "flip: the summary does not record the rollback from step 20 to 10, naming the tensor and the rank: %s",
              e2e_str(m0, "why"));
  T_CHECK_MSG(strcmp(e2e_str(s, "outcome"), "done") == 0 && e2e_num(s, "steps") == 40, "flip: outcome %s",
              e2e_str(s, "outcome"));
  T_CHECK_MSG(e2e_num(s, "samples_repeated") == 10 * 24, "flip: samples_repeated %.0f, the rollback redid 10 steps",
              e2e_num(s, "samples_repeated"));
  double loss = e2e_num(s, "final_loss");
  T_CHECK_MSG(fabs(loss - ref) <= 1e-5 * fabs(ref), "flip: final loss %.9f, uninterrupted %.9f", loss, ref);
  cJSON_Delete(s);
  /* the fault is real: unchecked, the same flip ends elsewhere */
  const char *off[] = {"--verify-every", "0", "--chaos", FLIP, NULL};
  rc = job_run("flip_off", 4, 40, off, &out);
  free(out);
  s = summary_of("flip_off");
  T_CHECK_MSG(rc == 0 && cJSON_GetArraySize(mismatches_of(s)) == 0, "flip_off: exited %d", rc);
  T_CHECK_MSG(fabs(e2e_num(s, "final_loss") - ref) > 1e-5 * fabs(ref),
              "flip_off: the flipped bit changed nothing (final loss %.9f, uninterrupted %.9f)", e2e_num(s, "final_loss"),
              ref);
  cJSON_Delete(s);
  /* on_mismatch fail: the job fails, naming it */
  const char *fail[] = {"--on-mismatch", "fail", "--chaos", FLIP, NULL};
  rc = job_run("flip_fail", 4, 40, fail, &out);
  T_CHECK_MSG(rc == 4 && out && strstr(out, "the job failed at step ") &&
                  strstr(out, "replicas disagree at step 20: h.0.ln1.w") && strstr(out, "spec.fault.on_mismatch fail"),
              "flip_fail: exited %d:\n%s", rc, out ? out : "");
  free(out);
  T_CHECK_MSG(ends_say("flip_fail", 4, "failed: replicas disagree at step 20: h.0.ln1.w", NULL) == 4,
              "flip_fail: not every worker ended with the failure");
}

static void test_drift(void) {
  const char *py = getenv("NEWT_PYTHON"), *src = getenv("NEWT_SOURCE_DIR");
  if (!py || !src) {
    T_FAIL("NEWT_PYTHON (a Python with torch) or NEWT_SOURCE_DIR is not set");
    return;
  }
  char script[600], *out = NULL;
  snprintf(script, sizeof script, "%s/tests/elastic/drift.py", src);
  char logs[512], summary[512];
  snprintf(logs, sizeof logs, "%s/drift", tmpdir);
  snprintf(summary, sizeof summary, "%s/drift.json", tmpdir);
  const char *argv[] = {newt_bin, "run", "--quiet", "--job", "drift", "--nproc", "3", "--steps", "40", "--global-batch",
                        "12", "--micro-batch", "2", "--log-dir", logs, "--summary", summary, "--timeout-ms", "180000",
                        "--", py, script, NULL};
  int rc = run_capture(argv, &out);
  T_CHECK_MSG(rc == 4 && out && strstr(out, "the job failed at step ") && strstr(out, "replicas disagree at step 1,"),
              "drift: newt run exited %d:\n%s", rc, out ? out : "");
  free(out);
  /* the first check, after the job's first step, names the buffers with the way out: there
     is no verified step to go back to, and it is the program's own doing */
  cJSON *s = summary_of("drift");
  const cJSON *m = mismatches_of(s), *m0 = cJSON_GetArrayItem(m, 0);
  const char *why = e2e_str(m0, "why");
  T_CHECK_MSG(strcmp(e2e_str(s, "outcome"), "failed") == 0 && cJSON_GetArraySize(m) == 1 &&
                  strcmp(e2e_str(m0, "action"), "fail") == 0 && e2e_num(m0, "step") == 1,
              "drift: the summary does not record the failure at the first check");
  T_CHECK_MSG(strstr(why, "replicas disagree at step 1, the first check of the job") &&
                  strstr(why, "model.1.running_mean, model.1.running_var (2 tensors) differ among ranks") &&
                  strstr(why, "The program's own code makes them differ") && strstr(why, "BatchNorm") &&
                  strstr(why, "declare it per rank"),
              "drift: the first check does not name the drifting buffers with the way out: %s", why);
  T_CHECK_MSG(strstr(e2e_str(s, "failed"), "model.1.running_mean"), "drift: the failure does not name them: %s",
              e2e_str(s, "failed"));
  cJSON_Delete(s);
}

static void test_left_out(void) {
  char *out = NULL;
  const char *flags[] = {"--comm-timeout-ms", "1000", "--chaos", "stop:worker:2@step=10", NULL};
  int rc = job_run("left", 4, 60, flags, &out);
  T_CHECK_MSG(rc == 0, "left: newt run exited %d:\n%s", rc, out ? out : "");
  free(out);
  cJSON *s = summary_of("left");
  const cJSON *lo = s ? cJSON_GetObjectItemCaseSensitive(s, "left_out") : NULL;
  T_CHECK_MSG(cJSON_GetArraySize(lo) == 1 && strcmp(cJSON_GetArrayItem(lo, 0)->valuestring, "w2") == 0,
              "left: the summary does not count w2 as left out");
  double loss = e2e_num(s, "final_loss");
  cJSON_Delete(s);
  char path[600], *text = NULL, want[128];
  size_t n;
  snprintf(path, sizeof path, "%s/left/w2.end", tmpdir);
  T_OK(newt_fs_read_all(path, 1 << 16, &text, &n));
  long long step = -1;
  const char *p = text ? strstr(text, "trained up to step ") : NULL;
  if (p) step = strtoll(p + strlen("trained up to step "), NULL, 10);
  /* its own step, not the job's: the stop came once the step log said step 10, which rank 0
     writes after every rank committed step 10, so after w2 completed step 9 at least; the
     job's end as its marker says, its loss the job's */
  snprintf(want, sizeof want, "the job went on without it and is done: 60 steps, final loss %.4f", loss);
  T_CHECK_MSG(text && strncmp(text, "left out: w2 trained up to step ", 32) == 0 && step >= 9 && step < 60 &&
                  strstr(text, want),
              "left: w2's termination message: %s (expected the step it was left out at and \"%s\")",
              text ? text : "(none)", want);
  free(text);
  /* the others trained the last step: done, with the job's loss */
  snprintf(want, sizeof want, "(final loss %.4f)", loss);
  T_CHECK_MSG(ends_say("left", 2, "done: job left trained its 60 steps", want) == 2, "left: w0 and w1 do not say done");
}

int main(int argc, char **argv) {
  newt_bin = getenv("NEWT_BIN");
  if (!newt_bin || argc < 2) {
    fprintf(stderr, "usage: NEWT_BIN=path/to/newt test_truth <scenario>\n");
    return 2;
  }
  snprintf(tmpdir, sizeof tmpdir, "/tmp/newt-truth-%s-XXXXXX", argv[1]);
  if (!mkdtemp(tmpdir)) return 2;
  t_cur_name = argv[1];
  if (strcmp(argv[1], "state_loss") == 0) T_RUN(test_state_loss);
  else if (strcmp(argv[1], "state_ckpt") == 0) T_RUN(test_state_ckpt);
  else if (strcmp(argv[1], "left_out") == 0) T_RUN(test_left_out);
  else if (strcmp(argv[1], "flip") == 0) T_RUN(test_flip);
  else if (strcmp(argv[1], "drift") == 0) T_RUN(test_drift);
  else {
    fprintf(stderr, "test_truth: no scenario \"%s\"\n", argv[1]);
    return 2;
  }
  int rc = T_DONE();
  if (rc == 0) newt_fs_rm_rf(tmpdir);
  else fprintf(stderr, "logs kept in %s\n", tmpdir);
  return rc;
}
