/* `newt train` with checkpoints, as a user runs it: one run goes to the end uninterrupted;
 * another, on its own checkpoint directory and with saves slowed down so that one is in
 * flight, is killed with SIGKILL mid-run and started again with the same command. The
 * restarted run resumes from the newest valid checkpoint and every step it logs, before
 * and after the kill, has the loss of the same step of the uninterrupted run (within 1e-6;
 * in practice bit for bit). A run of another model on that directory is refused. A run
 * whose final save fails on a full disk exits 1, naming the save and the reason. */
#include <math.h>
#include <signal.h>

#include "ckpt_util.h"
#include "common/proc.h"

static char root[256];

#define STEPS 40

static const char *bin(void) {
  const char *b = getenv("NEWT_BIN");
  return b ? b : "newt";
}

static pid_t start_train(const char *dir, const char *log, const char *out, const char *env) {
  const char *argv[] = {bin(), "train", "--model", "layers=2,channels=64", "--steps", "40", "--batch", "4",
                        "--seq-len", "32", "--ckpt-dir", dir, "--ckpt-every", "5", "--log", log, NULL};
  const char *envv[] = {env, NULL};
  newt_spawn_opts so = {.log_path = out, .env = env ? envv : NULL, .die_with_parent = 1};
  pid_t pid = -1;
  T_OK(newt_proc_spawn(argv, &so, &pid));
  return pid;
}

/* Reads "{"step":N,"loss":X,...}" lines; loss[N] = X (the last one seen for N). Returns
 * the number of complete lines; *bad counts the others. */
static int read_log(const char *path, double *loss, int *seen, int *bad) {
  char *text = NULL;
  size_t len = 0;
  *bad = 0;
  if (newt_fs_read_all(path, 1 << 24, &text, &len) != NEWT_OK) return 0;
  int n = 0;
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    long long step;
    double l;
    if (sscanf(line, "{\"step\":%lld,\"loss\":%lf,", &step, &l) == 2 && step >= 1 && step <= STEPS) {
      loss[step] = l;
      seen[step]++;
      n++;
    } else {
      (*bad)++;
    }
  }
  free(text);
  return n;
}

static int wait_exit(pid_t pid, int64_t ms) {
  int st = 0;
  if (newt_proc_wait(pid, ms, &st) != NEWT_OK) {
    newt_proc_stop(pid, 100);
    return -1;
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_kill_and_resume(void) {
  char da[300], db[300], la[300], lb[300], oa[300], ob[300];
  snprintf(da, sizeof da, "%s/a", root);
  snprintf(db, sizeof db, "%s/b", root);
  snprintf(la, sizeof la, "%s/a.log", root);
  snprintf(lb, sizeof lb, "%s/b.log", root);
  snprintf(oa, sizeof oa, "%s/a.out", root);
  snprintf(ob, sizeof ob, "%s/b.out", root);

  int rc = wait_exit(start_train(da, la, oa, NULL), 120000);
  T_CHECK_MSG(rc == 0, "the uninterrupted run exited %d", rc);
  double ref[STEPS + 1] = {0}, got[STEPS + 1] = {0};
  int seen_a[STEPS + 1] = {0}, seen_b[STEPS + 1] = {0}, bad = 0;
  T_CHECK(read_log(la, ref, seen_a, &bad) == STEPS && bad == 0);

  /* saves slowed to 25 ms a chunk: the one in flight when the kill comes is torn */
  pid_t pid = start_train(db, lb, ob, "NEWT_CKPT_TEST_CHUNK_DELAY_MS=25");
  newt_deadline_t d = newt_deadline_in_ms(120000);
  int n = 0;
  while (!newt_deadline_passed(d) && (n = read_log(lb, got, seen_b, &bad)) < 23) {
    memset(seen_b, 0, sizeof seen_b);
    newt_sleep_ms(5);
  }
  kill(pid, SIGKILL);
  int st = 0;
  T_OK(newt_proc_wait(pid, 10000, &st));
  T_CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the run ended before the kill (%d steps logged)", n);
  ckpt_step_info *info;
  size_t ns;
  T_OK(ckpt_list(db, &info, &ns));
  int64_t newest = -1;
  for (size_t i = 0; i < ns; i++)
    if (info[i].valid) newest = info[i].step;
  free(info);
  T_CHECK_MSG(newest >= 5 && newest < 23, "newest committed step at the kill: %lld", (long long)newest);

  /* the same command again */
  rc = wait_exit(start_train(db, lb, ob, NULL), 120000);
  T_CHECK_MSG(rc == 0, "the restarted run exited %d", rc);
  char *out = NULL;
  size_t len;
  T_OK(newt_fs_read_all(ob, 1 << 24, &out, &len));
  char want[64];
  snprintf(want, sizeof want, "resumed at step %lld from", (long long)newest);
  T_CHECK_MSG(out && strstr(out, want), "no \"%s\" in the output:\n%s", want, out ? out : "");
  T_CHECK(out && strstr(out, "\"steps\":40,") && strstr(out, "\"samples_consumed\":160,"));
  free(out);

  memset(seen_b, 0, sizeof seen_b);
  memset(got, 0, sizeof got);
  /* the killed run's lines and the restarted run's, step by step (the restarted one
   * redoes the steps after the checkpoint it resumed from: the later value is checked,
   * the earlier one was checked before the restart) */
  read_log(lb, got, seen_b, &bad);
  T_CHECK_MSG(bad <= 1, "%d unreadable lines in %s", bad, lb); /* a line cut by the kill */
  int checked = 0;
  for (int s = 1; s <= STEPS; s++) {
    T_CHECK_MSG(seen_b[s] >= 1, "step %d never logged", s);
    if (!seen_b[s]) continue;
    T_CHECK_MSG(fabs(got[s] - ref[s]) <= 1e-6, "step %d: loss %.9g after the kill, %.9g uninterrupted", s, got[s],
                ref[s]);
    checked++;
  }
  T_CHECK(checked == STEPS);
  for (int s = (int)newest + 1; s <= 23; s++) T_CHECK_MSG(seen_b[s] == 2, "step %d logged %d times", s, seen_b[s]);
}

static void test_other_model_refused(void) {
  char dir[300], out[8192], args[700];
  snprintf(dir, sizeof dir, "%s/a", root);
  snprintf(args, sizeof args, "train --model layers=3,channels=64 --steps 40 --batch 4 --seq-len 32 --ckpt-dir %s",
           dir);
  int rc = ts_run_newt(args, out, sizeof out);
  T_CHECK_MSG(rc == 1 && strstr(out, "state.config.model.layers is 2 in the checkpoint, 3 in this run"),
              "newt %s: exit %d\n%s", args, rc, out);
  snprintf(args, sizeof args, "train --model layers=2,channels=64 --steps 40 --batch 8 --seq-len 32 --ckpt-dir %s",
           dir);
  rc = ts_run_newt(args, out, sizeof out);
  T_CHECK_MSG(rc == 1 && strstr(out, "state.config.batch is 4 in the checkpoint, 8 in this run"), "newt %s: exit %d\n%s",
              args, rc, out);
  /* done already: resumes at step 40 and has nothing left to do */
  snprintf(args, sizeof args, "train --model layers=2,channels=64 --steps 40 --batch 4 --seq-len 32 --ckpt-dir %s",
           dir);
  rc = ts_run_newt(args, out, sizeof out);
  T_CHECK_MSG(rc == 0 && strstr(out, "resumed at step 40") && !strstr(out, "step    41"), "newt %s: exit %d\n%s", args,
              rc, out);
  T_CHECK(ts_run_newt("train --ckpt-every 5 --steps 1", out, sizeof out) == 2 && strstr(out, "needs --ckpt-dir"));
}

/* The final save fails on a full disk (a small tmpfs): the run must not exit 0 as if its
 * work were saved; it says which save failed and why. */
static void test_full_disk_exit(void) {
  char mnt[300], args[700], out[16384];
  snprintf(mnt, sizeof mnt, "%s/tmpfs", root);
  if (!ts_mount_tmpfs(mnt, "128k")) return; /* a checkpoint of this model is about 290 KB */
  snprintf(args, sizeof args, "train --model layers=1,channels=32 --steps 4 --batch 2 --seq-len 16 --ckpt-dir %s/ck "
           "--ckpt-every 2", mnt);
  int rc = ts_run_newt(args, out, sizeof out);
  T_CHECK_MSG(rc == 1 && strstr(out, "the checkpoint of step 4 failed and no later one was saved") &&
                  strstr(out, "No space left on device"), "newt %s: exit %d\n%s", args, rc, out);
  ts_umount(mnt);
}

int main(void) {
  ts_tmpdir(root, sizeof root, "/tmp", "ckpt-train");
  T_RUN(test_kill_and_resume);
  T_RUN(test_other_model_refused);
  T_RUN(test_full_disk_exit);
  newt_fs_rm_rf(root);
  return T_DONE();
}
