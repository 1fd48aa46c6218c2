/* Hostile input, round four (issue 37): real `newt run` jobs against someone who can write what
 * the job trusts -- its etcd, its checkpoint directory, its log directory -- but does not hold
 * the job secret. Each scenario plants the real thing and checks what the job then does.
 *
 *   forged_done     a forger with write access to etcd writes a plausible end marker (the
 *                   last step, every sample) at step 10 of 400: newt run says it ignores it,
 *                   the job trains on to its real end and newt run reports the true end (every
 *                   step, the uninterrupted run's loss)
 *   forged_reports  a forger writes hang reports on a rank's lease (its id is in the
 *                   registration) naming the two healthy others, twelve times: nobody is
 *                   fenced, no failure is planned for (the budget untouched), the job ends with
 *                   every step at the uninterrupted loss, and the leader says it ignored them
 *   private_etcd    newt run's own etcd refuses a client without the job's user and password
 *                   (another user of the host reaches its port, not the job's keys)
 *   foreign_ckpt    another job's well-formed step, newer than this job's, copied into its
 *                   checkpoint directory: the resume refuses it naming its MANIFEST and goes
 *                   back to the job's own newest checkpoint (step 20, not 30), and trains to
 *                   its end
 *   unsigned_ckpt   a directory whose only step was written without the job's key (as the
 *                   previous release wrote it): the job fails naming it rather than start over
 *                   on top of it; `newt ckpt sign` adopts it, and the job resumes from it
 *   log_dir         a log directory another user owns, or others can write, is refused (exit 2,
 *                   naming it); links planted where newt run writes its files (the step log, the
 *                   event log, a process log, job.secret) are never followed: the files they
 *                   point at keep their bytes
 *   secret_file     a job secret file another user owns or can read is refused, naming it, by
 *                   newt run and by a worker
 *
 * usage: NEWT_BIN=path/to/newt test_trust <scenario> (one ctest test per scenario). */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/internal.h"
#include "common/clock.h"
#include "common/fs.h"
#include "common/json.h"
#include "common/proc.h"
#include "job/records.h"
#include "job/store.h"
#include "rendezvous/etcd_server.h"
#include "rendezvous/rdzv.h"
#include "tests/elastic/e2e.h"
#include "test.h"

#define GB "24"
#define MB "2"
#define MODEL "layers=2,channels=64"
#define SEQ "32"
#define OTHER_UID 65534 /* nobody */

static const char *newt_bin;
static char tmpdir[256];

static int run_capture(const char *const *argv, char **out) { return e2e_run_capture(tmpdir, argv, out); }

/* `newt run` of the test model (logs in tmpdir/<tag>, summary tmpdir/<tag>.json), with more
 * flags (NULL-terminated), as a child: its pid (its output in tmpdir/<tag>.out). */
static pid_t job_start(const char *tag, const char *etcd, int nproc, int steps, const char *const *extra) {
  char logs[512], summary[512], out[512], st[16], np[16];
  snprintf(logs, sizeof logs, "%s/%s", tmpdir, tag);
  snprintf(summary, sizeof summary, "%s/%s.json", tmpdir, tag);
  snprintf(out, sizeof out, "%s/%s.out", tmpdir, tag);
  snprintf(st, sizeof st, "%d", steps);
  snprintf(np, sizeof np, "%d", nproc);
  const char *argv[48] = {newt_bin, "run", "--job", tag, "--nproc", np, "--model", MODEL, "--seq-len", SEQ,
                          "--steps", st, "--global-batch", GB, "--micro-batch", MB, "--log-dir", logs, "--summary",
                          summary, "--timeout-ms", "240000"};
  int a = 22;
  if (etcd) argv[a++] = "--etcd", argv[a++] = etcd;
  for (int i = 0; extra && extra[i] && a < 47; i++) argv[a++] = extra[i];
  newt_spawn_opts po = {.log_path = out};
  pid_t pid = 0;
  T_OK(newt_proc_spawn(argv, &po, &pid));
  return pid;
}

/* Waits for a job_start child; its exit status (-1: killed, or not ended in 280 s), its output
 * in *out when out is not NULL. */
static int job_wait(const char *tag, pid_t pid, char **out) {
  int st = 0;
  if (newt_proc_wait(pid, 280000, &st) != NEWT_OK) {
    newt_proc_stop(pid, 1000);
    st = -1;
  }
  char path[512];
  size_t n;
  snprintf(path, sizeof path, "%s/%s.out", tmpdir, tag);
  if (out && newt_fs_read_all(path, 64 << 20, out, &n) != NEWT_OK) *out = NULL;
  return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int job_run(const char *tag, const char *etcd, int nproc, int steps, const char *const *extra, char **out) {
  return job_wait(tag, job_start(tag, etcd, nproc, steps, extra), out);
}

static cJSON *summary_of(const char *tag) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s.json", tmpdir, tag);
  return e2e_read_json(path);
}

/* The loss of `newt train` over the same steps, batch and model (NaN when it failed). */
static double train_loss(int steps) { return e2e_train_loss(tmpdir, newt_bin, MODEL, SEQ, GB, MB, steps); }

/* The run ended done with every step at the uninterrupted loss (ref NaN: not checked), and
 * recorded `recoveries` recoveries (-1: any); its summary (NULL when it cannot be read). */
static cJSON *ended_done(const char *tag, int steps, double ref, int recoveries) {
  cJSON *j = summary_of(tag);
  const cJSON *done = j ? cJSON_GetObjectItemCaseSensitive(j, "done") : NULL;
  double st = e2e_num(j, "steps"), loss = e2e_num(j, "final_loss");
  int nrec = cJSON_GetArraySize(j ? cJSON_GetObjectItemCaseSensitive(j, "recoveries") : NULL);
  T_CHECK_MSG(cJSON_IsTrue(done) && st == steps, "%s: done %d at step %.0f of %d", tag, cJSON_IsTrue(done), st, steps);
  T_CHECK_MSG(isnan(ref) || fabs(loss - ref) <= 1e-4 * fmax(1.0, fabs(ref)), "%s: final loss %.7f, uninterrupted %.7f",
              tag, loss, ref);
  T_CHECK_MSG(recoveries < 0 || nrec == recoveries, "%s: %d recoveries, expected %d", tag, nrec, recoveries);
  return j;
}

/* Whether any file of the run's log directory whose name starts with `prefix` holds `needle`. */
static int logs_say(const char *tag, const char *prefix, const char *needle) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/%s", tmpdir, tag);
  DIR *d = opendir(dir);
  int said = 0;
  for (struct dirent *e; d && !said && (e = readdir(d));) {
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 || !strstr(e->d_name, ".log")) continue;
    char path[1024], *text = NULL;
    size_t n;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (newt_fs_read_all(path, 64 << 20, &text, &n) == NEWT_OK) said = strstr(text, needle) != NULL;
    free(text);
  }
  if (d) closedir(d);
  return said;
}

/* The step of the job's progress record (0: none yet, or unreadable). */
static int64_t progress_step(rdzv_etcd *c, const char *job) {
  char key[256];
  rdzv_etcd_kv kv;
  int64_t step = 0;
  if (job_key(key, sizeof key, job, JOB_REC_PROGRESS, 0, NULL) != NEWT_OK ||
      rdzv_etcd_get(c, key, newt_deadline_in_ms(2000), &kv, NULL) != NEWT_OK)
    return 0;
  job_progress p;
  if (job_progress_from_json(kv.value, kv.value_len, &p) == NEWT_OK) step = p.step;
  rdzv_etcd_kv_free(&kv);
  return step;
}

/* An etcd of the test's own, and a client that may write anything in it: the forger. */
typedef struct forger {
  rdzv_etcd_server *srv;
  rdzv_etcd *c;
} forger;

static int forger_start(forger *f) {
  memset(f, 0, sizeof *f);
  rdzv_etcd_server_opts so = {0};
  T_OK(rdzv_etcd_server_start(&so, &f->srv));
  if (!f->srv) return 0;
  rdzv_etcd_opts eo;
  rdzv_etcd_server_client_opts(f->srv, &eo);
  T_OK(rdzv_etcd_init(&eo, &f->c));
  return f->c != NULL;
}

static void forger_free(forger *f) {
  rdzv_etcd_free(f->c);
  rdzv_etcd_server_free(f->srv);
}

/* --- item 3: the end of a job ----------------------------------------------------------------- */

static void test_forged_done(void) {
  const int STEPS = 400; /* the forger writes at step 10: the job has 390 more to train on */
  double ref = train_loss(STEPS);
  forger f;
  if (!forger_start(&f)) return;
  pid_t pid = job_start("done", rdzv_etcd_server_url(f.srv), 3, STEPS, NULL);
  char key[256], done[256];
  snprintf(done, sizeof done, "{\"step\":%d,\"loss\":0.0,\"t_ms\":1,\"samples\":%d}", STEPS, STEPS * atoi(GB));
  T_OK(job_key(key, sizeof key, "done", JOB_REC_DONE, 0, NULL));
  int64_t at = 0;
  for (newt_deadline_t d = newt_deadline_in_ms(120000); !newt_deadline_passed(d) && newt_proc_alive(pid);
       newt_sleep_ms(20))
    if ((at = progress_step(f.c, "done")) >= 10) break;
  T_CHECK_MSG(at >= 10, "the job never reached step 10; logs in %s", tmpdir);
  /* the last step and every sample: plausible, and not the job's own */
  T_OK(rdzv_etcd_put(f.c, key, done, strlen(done), 0, newt_deadline_in_ms(2000), NULL));
  int64_t then = progress_step(f.c, "done");
  T_CHECK_MSG(then < STEPS, "the forger wrote at step %lld of %d: too late to tell", (long long)then, STEPS);
  char *out = NULL;
  int rc = job_wait("done", pid, &out);
  T_CHECK_MSG(rc == 0, "newt run exited %d beside a forged end marker:\n%s", rc, out ? out : "");
  T_CHECK_MSG(out && strstr(out, "ignoring the end marker") && strstr(out, "the job trains on"),
              "newt run did not say it ignored the forged end marker:\n%s", out ? out : "");
  char says[128];
  snprintf(says, sizeof says, "done: %d steps, final loss %.4f", STEPS, ref);
  T_CHECK_MSG(out && strstr(out, says), "newt run did not report the true end (\"%s\"):\n%s", says, out ? out : "");
  cJSON_Delete(ended_done("done", STEPS, ref, 0));
  T_CHECK_MSG(logs_say("done", "c", "ignoring the end marker"), "no coordinator said it ignored the end marker");
  free(out);
  forger_free(&f);
}

/* newt run's own etcd: its port is open to every user of the host; its keys are not. */
static void test_private_etcd(void) {
  pid_t pid = job_start("private", NULL, 2, 1000000, NULL);
  char logs[512], pwfile[600], outp[512], *out = NULL, url[128] = "";
  snprintf(logs, sizeof logs, "%s/private", tmpdir);
  snprintf(pwfile, sizeof pwfile, "%s/etcd.password", logs);
  snprintf(outp, sizeof outp, "%s/private.out", tmpdir);
  int64_t lines = 0;
  for (newt_deadline_t d = newt_deadline_in_ms(120000); !newt_deadline_passed(d) && newt_proc_alive(pid) && !lines;
       newt_sleep_ms(50)) {
    size_t n;
    free(out);
    out = NULL;
    const char *at = newt_fs_read_all(outp, 1 << 20, &out, &n) == NEWT_OK ? strstr(out, "etcd http://") : NULL;
    if (at) sscanf(at + 5, "%127[^ ,)]", url);
    char steps[600], *text = NULL;
    snprintf(steps, sizeof steps, "%s/steps.jsonl", logs);
    if (url[0] && newt_fs_read_all(steps, 1 << 20, &text, &n) == NEWT_OK) lines = n > 0;
    free(text);
  }
  T_CHECK_MSG(url[0] && lines, "the job never trained a step; logs in %s:\n%s", tmpdir, out ? out : "");
  rdzv_etcd *anon = NULL;
  T_OK(rdzv_etcd_init(&(rdzv_etcd_opts){.endpoints = url}, &anon));
  const char *forged = "{\"step\":1000000,\"loss\":0.0,\"t_ms\":1,\"samples\":24000000}";
  if (anon) {
    T_ERR(NEWT_ERR_AUTH, rdzv_etcd_put(anon, "/newt/private/done", forged, strlen(forged), 0, newt_deadline_in_ms(3000),
                                       NULL));
    rdzv_etcd_kv kv;
    T_ERR(NEWT_ERR_AUTH, rdzv_etcd_get(anon, "/newt/private/spec", newt_deadline_in_ms(3000), &kv, NULL));
  }
  rdzv_etcd_free(anon);
  /* the job's own user, with the password file newt run gave its processes, reads the job */
  char *pw = NULL;
  size_t pn = 0;
  struct stat st;
  T_CHECK_MSG(stat(pwfile, &st) == 0 && (st.st_mode & 077) == 0, "%s: not there, or not mode 0600", pwfile);
  T_OK(newt_fs_read_all(pwfile, 256, &pw, &pn));
  rdzv_etcd *user = NULL;
  T_OK(rdzv_etcd_init(&(rdzv_etcd_opts){.endpoints = url, .user = "newt-private", .password = pw}, &user));
  rdzv_etcd_kv kv;
  if (user && rdzv_etcd_get(user, "/newt/private/spec", newt_deadline_in_ms(3000), &kv, NULL) == NEWT_OK)
    rdzv_etcd_kv_free(&kv);
  else
    T_FAIL("the job's user cannot read its spec: %s", newt_errmsg());
  rdzv_etcd_free(user);
  free(pw);
  kill(pid, SIGINT);
  free(out);
  out = NULL;
  job_wait("private", pid, &out);
  free(out);
}

/* --- item 4: reports a rank did not write ------------------------------------------------------ */

static void test_forged_reports(void) {
  const int STEPS = 1500, WRITES = 12;
  double ref = train_loss(STEPS);
  forger f;
  if (!forger_start(&f)) return;
  pid_t pid = job_start("reports", rdzv_etcd_server_url(f.srv), 3, STEPS, NULL);
  int writes = 0;
  for (newt_deadline_t d = newt_deadline_in_ms(200000); !newt_deadline_passed(d) && newt_proc_alive(pid) &&
                                                         writes < WRITES;
       newt_sleep_ms(100)) {
    char *plan = NULL, key[256];
    int64_t g = 0;
    if (progress_step(f.c, "reports") < 5 ||
        job_plan_get(f.c, "reports", newt_deadline_in_ms(1000), &plan, &g, NULL) != NEWT_OK)
      continue;
    free(plan);
    /* w0's lease, from its registration: anyone who reads etcd can read it */
    rdzv_etcd_kv reg;
    if (job_key(key, sizeof key, "reports", JOB_REC_WORKER, 0, "w0") != NEWT_OK ||
        rdzv_etcd_get(f.c, key, newt_deadline_in_ms(1000), &reg, NULL) != NEWT_OK)
      continue;
    int64_t lease = reg.lease;
    rdzv_etcd_kv_free(&reg);
    char rep[512];
    snprintf(rep, sizeof rep, "{\"worker\":\"w0\",\"kind\":\"hang\",\"accuse\":[\"w1\",\"w2\"],\"step\":%lld,"
             "\"done_step\":%lld,\"t_ms\":%llu,\"why\":\"forged: no progress\"}", (long long)progress_step(f.c, "reports"),
             (long long)progress_step(f.c, "reports"), (unsigned long long)newt_wall_ms());
    if (job_key(key, sizeof key, "reports", JOB_REC_REPORT, (uint64_t)g, "w0") == NEWT_OK &&
        rdzv_etcd_put(f.c, key, rep, strlen(rep), lease, newt_deadline_in_ms(1000), NULL) == NEWT_OK)
      writes++;
  }
  T_CHECK_MSG(writes == WRITES, "the forger got %d of its %d reports in; logs in %s", writes, WRITES, tmpdir);
  char *out = NULL;
  int rc = job_wait("reports", pid, &out);
  T_CHECK_MSG(rc == 0, "newt run exited %d beside forged reports:\n%s", rc, out ? out : "");
  cJSON *j = ended_done("reports", STEPS, ref, 0);
  T_CHECK_MSG(e2e_num(j, "generations") == 1, "%.0f generations: a forged report was planned for", e2e_num(j, "generations"));
  cJSON_Delete(j);
  T_CHECK_MSG(!logs_say("reports", "c", " fenced "), "a healthy worker was fenced; logs in %s", tmpdir);
  T_CHECK_MSG(logs_say("reports", "c", "no mac, and this job holds a secret"),
              "no coordinator said it ignored a report that proves nothing; logs in %s", tmpdir);
  free(out);
  forger_free(&f);
}

/* --- item 1: whose checkpoint ------------------------------------------------------------------- */

/* cp -r from to (to must not exist). */
static void copy_tree(const char *from, const char *to) {
  char *out = NULL;
  const char *argv[] = {"cp", "-r", from, to, NULL};
  T_CHECK_MSG(run_capture(argv, &out) == 0, "cp -r %s %s: %s", from, to, out ? out : "");
  free(out);
}

static void test_foreign_ckpt(void) {
  char mine[512], theirs[512], from[600], to[600], *out = NULL;
  snprintf(mine, sizeof mine, "%s/ck", tmpdir);
  snprintf(theirs, sizeof theirs, "%s/ck-other", tmpdir);
  double ref = NAN; /* 20 steps, then 40 from step 20: another learning-rate schedule than 40 at once */
  const char *a[] = {"--ckpt-dir", mine, "--ckpt-every", "10", NULL};
  T_CHECK_MSG(job_run("first", NULL, 2, 20, a, &out) == 0, "the first run failed:\n%s", out ? out : "");
  free(out);
  /* another job, same model and run, another learning rate: well formed, other weights */
  const char *b[] = {"--ckpt-dir", theirs, "--ckpt-every", "10", "--lr", "0.02", NULL};
  T_CHECK_MSG(job_run("other", NULL, 2, 30, b, &out) == 0, "the other job failed:\n%s", out ? out : "");
  free(out);
  snprintf(from, sizeof from, "%s/step-0000000030", theirs);
  snprintf(to, sizeof to, "%s/step-0000000030", mine);
  copy_tree(from, to);
  T_CHECK_MSG(job_run("resumed", NULL, 2, 40, a, &out) == 0, "the resumed run failed:\n%s", out ? out : "");
  cJSON *j = ended_done("resumed", 40, ref, -1);
  const cJSON *rf = j ? cJSON_GetObjectItemCaseSensitive(j, "resumed_from") : NULL;
  T_CHECK_MSG(e2e_num(rf, "step") == 20, "resumed from step %.0f, expected this job's own 20 (30 is another job's):\n%s",
              e2e_num(rf, "step"), out ? out : "");
  char manifest[700];
  snprintf(manifest, sizeof manifest, "%s/MANIFEST", to);
  T_CHECK_MSG(logs_say("resumed", "w", manifest) && logs_say("resumed", "w", "another job's checkpoint"),
              "no worker named %s as another job's; logs in %s", manifest, tmpdir);
  cJSON_Delete(j);
  free(out);
}

static void test_unsigned_ckpt(void) {
  char dir[512], step[600], mf[700], *out = NULL;
  snprintf(dir, sizeof dir, "%s/ck", tmpdir);
  double ref = NAN; /* 20 steps, then 40 from step 20: another learning-rate schedule than 40 at once */
  const char *a[] = {"--ckpt-dir", dir, "--ckpt-every", "10", NULL};
  T_CHECK_MSG(job_run("first", NULL, 2, 20, a, &out) == 0, "the first run failed:\n%s", out ? out : "");
  free(out);
  out = NULL;
  /* as the previous release left it: no key in the directory, a manifest that proves nothing
     (written again by the encoder without a key: the previous release's bytes) */
  snprintf(step, sizeof step, "%s/job.secret", dir);
  T_CHECK_MSG(unlink(step) == 0, "%s: none to remove", step);
  snprintf(step, sizeof step, "%s/step-0000000010", dir);
  newt_fs_rm_rf(step);
  snprintf(step, sizeof step, "%s/step-0000000020", dir);
  snprintf(mf, sizeof mf, "%s/MANIFEST", step);
  ckpt_manifest m;
  char *text = NULL;
  size_t len = 0;
  T_OK(ckpt_manifest_load(AT_FDCWD, NULL, mf, 0, &m));
  T_OK(ckpt_manifest_encode(&m, &text, &len));
  ckpt_manifest_free(&m);
  T_CHECK(text && !strstr(text, "\"mac\""));
  if (text) T_OK(newt_fs_write_atomic(mf, text, len));
  free(text);
  /* a job with a key finds it and nothing it can trust: it fails naming it, never starting over
     on top of it (its saves would prune it) */
  int rc = job_run("refused", NULL, 2, 40, a, &out);
  T_CHECK_MSG(rc == 4 && out && strstr(out, "none proved by this job's secret") && strstr(out, mf),
              "a directory of an unproved checkpoint: exit %d (expected 4, naming %s):\n%s", rc, mf, out ? out : "");
  T_CHECK_MSG(newt_fs_exists(mf), "%s is gone", mf);
  free(out);
  out = NULL;
  /* adopted: newt ckpt sign verifies it and proves it with the directory's key */
  const char *sign[] = {newt_bin, "ckpt", "sign", dir, NULL};
  rc = run_capture(sign, &out);
  T_CHECK_MSG(rc == 0 && out && strstr(out, "every checksum verified"), "newt ckpt sign: exit %d:\n%s", rc, out ? out : "");
  free(out);
  out = NULL;
  T_CHECK_MSG(job_run("resumed", NULL, 2, 40, a, &out) == 0, "the run after the sign failed:\n%s", out ? out : "");
  cJSON *j = ended_done("resumed", 40, ref, -1);
  const cJSON *rf = j ? cJSON_GetObjectItemCaseSensitive(j, "resumed_from") : NULL;
  T_CHECK_MSG(e2e_num(rf, "step") == 20, "resumed from step %.0f, expected the adopted 20", e2e_num(rf, "step"));
  cJSON_Delete(j);
  free(out);
}

/* --- item 2: a root newt run and its log directory ------------------------------------------------ */

static void put(const char *path, const char *text, unsigned mode) {
  FILE *f = fopen(path, "w");
  T_CHECK_MSG(f != NULL, "cannot write %s", path);
  if (f) fputs(text, f), fclose(f);
  chmod(path, mode);
}

static int holds(const char *path, const char *text) {
  char *got = NULL;
  size_t n;
  int same = newt_fs_read_all(path, 1 << 20, &got, &n) == NEWT_OK && strcmp(got, text) == 0;
  free(got);
  return same;
}

#define VICTIM "a root-only file: never truncated, never written through a link\n"

static void test_log_dir(void) {
  char dir[512], *out = NULL;
  /* another user's directory, and one others can write: refused before anything starts */
  snprintf(dir, sizeof dir, "%s/theirs", tmpdir);
  T_OK(newt_fs_mkdirs(dir, 0755));
  T_CHECK(chown(dir, OTHER_UID, OTHER_UID) == 0);
  const char *argv[] = {newt_bin, "run", "--nproc", "2", "--model", MODEL, "--seq-len", SEQ, "--steps", "5",
                        "--global-batch", GB, "--micro-batch", MB, "--log-dir", dir, NULL};
  int rc = run_capture(argv, &out);
  char uid[64];
  snprintf(uid, sizeof uid, "owned by uid %d", OTHER_UID);
  T_CHECK_MSG(rc == 2 && out && strstr(out, dir) && strstr(out, uid), "another user's --log-dir: exit %d:\n%s", rc,
              out ? out : "");
  free(out);
  out = NULL;
  snprintf(dir, sizeof dir, "%s/open", tmpdir);
  T_OK(newt_fs_mkdirs(dir, 0755));
  chmod(dir, 0777);
  argv[15] = dir;
  rc = run_capture(argv, &out);
  T_CHECK_MSG(rc == 2 && out && strstr(out, dir) && strstr(out, "can be written by other users"),
              "a world-writable --log-dir: exit %d:\n%s", rc, out ? out : "");
  free(out);
  out = NULL;
  /* links planted where newt run writes, each to a root-only file of its own */
  snprintf(dir, sizeof dir, "%s/linked", tmpdir);
  T_OK(newt_fs_mkdirs(dir, 0755));
  const char *names[] = {"steps.jsonl", "events.jsonl", "w0.log", "job.secret"};
  enum { NL = sizeof names / sizeof names[0] };
  char victim[NL][600], link[NL][600];
  for (int i = 0; i < NL; i++) {
    snprintf(victim[i], sizeof victim[i], "%s/victim-%d", tmpdir, i);
    snprintf(link[i], sizeof link[i], "%s/%s", dir, names[i]);
    put(victim[i], VICTIM, 0600);
    T_CHECK_MSG(symlink(victim[i], link[i]) == 0, "symlink %s", link[i]);
  }
  argv[15] = dir;
  /* each run stops at the first link it would write through, naming it; the link is removed
     (as an operator would) and the next run goes further; job.secret's is replaced, never
     followed, and the last run trains */
  int refused = 0;
  for (int k = 0; k < NL + 1; k++) {
    rc = run_capture(argv, &out);
    int named = -1;
    for (int i = 0; i < NL; i++)
      if (out && strstr(out, link[i]) && strstr(out, "symbolic link")) named = i;
    if (rc == 0) {
      free(out);
      out = NULL;
      break;
    }
    T_CHECK_MSG(named >= 0, "newt run exited %d without naming a planted link:\n%s", rc, out ? out : "");
    free(out);
    out = NULL;
    if (named < 0) break;
    refused++;
    unlink(link[named]);
  }
  T_CHECK_MSG(refused == 3 && rc == 0, "%d links refused (expected the step log, the event log and w0.log), then "
              "exit %d", refused, rc);
  for (int i = 0; i < NL; i++) T_CHECK_MSG(holds(victim[i], VICTIM), "%s was written through %s", victim[i], link[i]);
  struct stat st;
  T_CHECK_MSG(lstat(link[3], &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 077) == 0,
              "%s is not a file of newt run's own, mode 0600", link[3]);
}

static void test_secret_file(void) {
  char secret[512], *out = NULL;
  snprintf(secret, sizeof secret, "%s/job.secret", tmpdir);
  put(secret, "0123456789abcdef0123456789abcdef", 0644);
  const char *argv[] = {newt_bin, "run", "--nproc", "2", "--model", MODEL, "--seq-len", SEQ, "--steps", "5",
                        "--global-batch", GB, "--micro-batch", MB, "--job-secret-file", secret, NULL};
  int rc = run_capture(argv, &out);
  T_CHECK_MSG(rc == 2 && out && strstr(out, secret) && strstr(out, "can be read by other users"),
              "a secret others can read: exit %d:\n%s", rc, out ? out : "");
  free(out);
  out = NULL;
  chmod(secret, 0600);
  T_CHECK(chown(secret, OTHER_UID, OTHER_UID) == 0);
  char uid[64];
  snprintf(uid, sizeof uid, "owned by uid %d", OTHER_UID);
  rc = run_capture(argv, &out);
  T_CHECK_MSG(rc == 2 && out && strstr(out, secret) && strstr(out, uid), "another user's secret: exit %d:\n%s", rc,
              out ? out : "");
  free(out);
  out = NULL;
  /* a worker reads it before anything else: refused, naming it */
  const char *wargv[] = {newt_bin, "worker", "--etcd", "http://127.0.0.1:9", "--job", "w", "--id", "w0",
                         "--job-secret-file", secret, NULL};
  rc = run_capture(wargv, &out);
  T_CHECK_MSG(rc != 0 && out && strstr(out, secret) && strstr(out, uid), "a worker given another user's secret: exit "
              "%d:\n%s", rc, out ? out : "");
  free(out);
}

int main(int argc, char **argv) {
  newt_bin = getenv("NEWT_BIN");
  if (!newt_bin || argc < 2) {
    fprintf(stderr, "usage: NEWT_BIN=path/to/newt test_trust <scenario>\n");
    return 2;
  }
  snprintf(tmpdir, sizeof tmpdir, "/tmp/newt-trust-%s-XXXXXX", argv[1]);
  if (!mkdtemp(tmpdir)) return 2;
  static const struct {
    const char *name;
    void (*fn)(void);
    int root;
  } cases[] = {{"forged_done", test_forged_done, 0},     {"forged_reports", test_forged_reports, 0},
               {"private_etcd", test_private_etcd, 0},   {"foreign_ckpt", test_foreign_ckpt, 0},
               {"unsigned_ckpt", test_unsigned_ckpt, 0}, {"log_dir", test_log_dir, 1},
               {"secret_file", test_secret_file, 1}};
  int found = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (strcmp(cases[i].name, argv[1]) != 0) continue;
    found = 1;
    if (cases[i].root && geteuid() != 0) {
      fprintf(stderr, "test_trust %s: needs root (a directory and a file of another user, made with chown)\n", argv[1]);
      T_FAIL("not root");
      break;
    }
    t_cur_name = cases[i].name;
    T_RUN(cases[i].fn);
  }
  if (!found) {
    fprintf(stderr, "test_trust: no scenario \"%s\"\n", argv[1]);
    return 2;
  }
  int rc = T_DONE();
  if (rc == 0) newt_fs_rm_rf(tmpdir);
  else fprintf(stderr, "logs kept in %s\n", tmpdir);
  return rc;
}
