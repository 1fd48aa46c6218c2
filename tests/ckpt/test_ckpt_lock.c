/* One writer per checkpoint directory (issue 24, item 3). Before DIR/LOCK, a second
 * `newt train --ckpt-dir D` started while a first one was saving into D exited 0, and the
 * clean-up and pruning of each removed the other's shards. Each test runs real writers as
 * processes (`newt train`, or this binary re-executed as a library writer) and waits for
 * events (the lock file naming its holder, a committed step), never for a fixed time:
 *   - two `newt train` in one directory: the second is refused (exit 1, its message naming
 *     the directory, the holder's pid, host and command) while the first is stopped holding
 *     the lock; the first then finishes, and every file its committed manifests name exists
 *     and verifies;
 *   - the ranks of one job (writer "job demo") share a directory as separate processes, even
 *     with a member stopped (SIGSTOP) holding it; another job and `newt train` are refused,
 *     naming "job demo"; a real job (`newt run`) keeps `newt train` out the same way;
 *   - a holder killed with SIGKILL leaves a lock file that blocks nobody;
 *   - links, FIFOs and hard links planted under the name LOCK never redirect a write;
 *   - read access alone holds nothing (issue 37, item 8): the lock file is 0600, another user
 *     cannot open it, and an older release's 0644 file that a reader opened beforehand is
 *     replaced, its reader's flock keeping nobody out;
 *   - a save of a step committed by the same attempt (a run started over) commits it again
 *     whole, never with a file of its manifest gone. */
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>

#include "ckpt_util.h"
#include "common/proc.h"
#include "common/sys.h"

static char root[256], self[4096];
static int reader_pipe = -1; /* reader_holds' child waits while it is open */

/* Spawns argv (argv[0] "newt": $NEWT_BIN; "self": this binary) with its output in log. */
static pid_t spawn(const char *const *argv, const char *log) {
  const char *a[40];
  int n = 0;
  for (; argv[n] && n < 39; n++) a[n] = argv[n];
  a[n] = NULL;
  const char *bin = getenv("NEWT_BIN");
  if (strcmp(argv[0], "self") == 0) a[0] = self;
  else if (strcmp(argv[0], "newt") == 0) a[0] = bin ? bin : "newt";
  unlink(log);
  newt_spawn_opts so = {.log_path = log, .die_with_parent = 1};
  pid_t pid = -1;
  T_OK(newt_proc_spawn(a, &so, &pid));
  return pid;
}

/* Waits (up to ms) for pid to exit: its exit status, -1 when killed or still running. */
static int reap(pid_t pid, int64_t ms) {
  int st = 0;
  if (newt_proc_wait(pid, ms, &st) != NEWT_OK) {
    kill(pid, SIGKILL);
    newt_proc_wait(pid, 10000, &st);
    return -1;
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs argv to its end (up to ms): exit status (-1: killed), output into out. */
static int run(const char *const *argv, int64_t ms, char *out, size_t cap) {
  char log[400];
  snprintf(log, sizeof log, "%s/run.out", root);
  int rc = reap(spawn(argv, log), ms);
  char *text = NULL;
  size_t len = 0;
  out[0] = '\0';
  if (newt_fs_read_all(log, 1 << 22, &text, &len) == NEWT_OK) snprintf(out, cap, "%s", text);
  free(text);
  return rc;
}

/* Waits up to ms for cond(arg): 1 when it held. Polls: the event is a file appearing. */
static int wait_for(int (*cond)(const void *), const void *arg, int64_t ms) {
  newt_deadline_t d = newt_deadline_in_ms(ms);
  while (!cond(arg)) {
    if (newt_deadline_passed(d)) return 0;
    newt_sleep_ms(5);
  }
  return 1;
}

typedef struct lock_names {
  const char *dir;
  char want[64];
} lock_names;

/* DIR/LOCK names `want` (a pid as "\"pid\":N," or a writer). */
static int lock_says(const void *p) {
  const lock_names *l = p;
  char path[400], *text = NULL;
  size_t len;
  snprintf(path, sizeof path, "%s/LOCK", l->dir);
  if (newt_fs_read_all(path, 1 << 16, &text, &len) != NEWT_OK) {
    newt_err_clear();
    return 0;
  }
  int yes = strstr(text, l->want) != NULL;
  free(text);
  return yes;
}

typedef struct log_has {
  const char *path, *text;
} log_has;

static int log_says(const void *p) {
  const log_has *l = p;
  char *text = NULL;
  size_t len;
  if (newt_fs_read_all(l->path, 1 << 20, &text, &len) != NEWT_OK) {
    newt_err_clear();
    return 0;
  }
  int yes = strstr(text, l->text) != NULL;
  free(text);
  return yes;
}

typedef struct committed_at_least {
  const char *dir;
  int64_t step;
} committed_at_least;

static int committed(const void *p) {
  const committed_at_least *c = p;
  ckpt_step_info *info = NULL;
  size_t n = 0;
  int yes = 0;
  if (ckpt_list(c->dir, &info, &n) == NEWT_OK)
    for (size_t i = 0; i < n; i++) yes |= info[i].valid && info[i].step >= c->step;
  newt_err_clear();
  free(info);
  return yes;
}

static void count_problem(void *ctx, const char *msg) {
  (*(int *)ctx)++;
  fprintf(stderr, "  verify: %s\n", msg);
}

/* Every committed step of dir: each file its manifest names exists with its size, and every
 * chunk verifies. Returns the number of committed steps. */
static int check_committed(const char *dir) {
  ckpt_step_info *info = NULL;
  size_t n = 0;
  T_OK(ckpt_list(dir, &info, &n));
  int steps = 0;
  for (size_t i = 0; i < n; i++) {
    if (!info[i].committed) continue;
    steps++;
    char sd[400];
    ckpt_step_dirname(sd, sizeof sd, dir, info[i].step);
    T_CHECK_MSG(info[i].valid, "%s: committed, but its manifest does not check out", sd);
    ckpt_manifest m;
    int fd = -1;
    T_OK(newt_fs_dir_open(sd, 0, &fd));
    if (fd < 0) continue;
    if (ckpt_manifest_load(fd, sd, "MANIFEST", 0, &m) == NEWT_OK) {
      for (size_t f = 0; f < m.nfiles; f++) {
        struct stat st;
        T_CHECK_MSG(fstatat(fd, m.files[f].name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                        (uint64_t)st.st_size == m.files[f].bytes,
                    "%s/MANIFEST names %s, which is gone or changed", sd, m.files[f].name);
      }
      ckpt_manifest_free(&m);
    }
    close(fd);
    int bad = 0;
    ckpt_verify_result vr;
    T_OK(ckpt_verify(sd, count_problem, &bad, &vr));
    T_CHECK_MSG(bad == 0, "%s: %d problems", sd, bad);
  }
  free(info);
  return steps;
}

/* ---- library writers (this binary, re-executed) ------------------------------------------- */

/* child save DIR WRITER RANK NRANKS STEP: saves the test state's share of that rank (rank 0
 * commits); exit 0, or 3 when the directory is another writer's (message on stderr). */
static int child_save(const char *dir, const char *writer, int rank, int nranks, int64_t step) {
  ckpt_saver_opts o = {.dir = dir, .rank = rank, .nranks = nranks, .commit = rank == 0, .keep = 3,
                       .commit_timeout_ms = 60000, .attempt = 0x1000 + (uint64_t)step, .writer = writer};
  ckpt_saver *sv = NULL;
  newt_result_t r = ckpt_saver_init(&sv, &o);
  if (r != NEWT_OK) {
    fprintf(stderr, "child save: %s: %s\n", newt_result_name(r), newt_errmsg());
    return r == NEWT_ERR_CONFLICT ? 3 : 1;
  }
  tstate s;
  ts_make(&s, step, 1, 0);
  int started = 0;
  r = ckpt_save_begin(sv, step, 0, &started);
  for (size_t i = 0; r == NEWT_OK && i < s.n; i++) { /* rank r: every tensor's r-th part of nranks */
    if (!s.bytes[i]) continue;
    newt_slice sl;
    newt_slice_whole(&sl, &s.t[i]);
    int64_t n = sl.end, a = n * rank / nranks, b = n * (rank + 1) / nranks;
    if (a == b) continue;
    sl.begin = a;
    sl.end = b;
    r = ckpt_save_add(sv, &s.t[i], &sl, (const uint8_t *)s.data[i] + (size_t)a * newt_dtype_size(s.t[i].dtype));
  }
  if (r == NEWT_OK) r = ts_save_end(sv, step);
  if (r != NEWT_OK) fprintf(stderr, "child save: %s\n", newt_errmsg());
  ckpt_saver_free(sv);
  ts_free(&s);
  return r == NEWT_OK ? 0 : 1;
}

/* child hold DIR WRITER: takes the lock, says "holding" once it has it, keeps it until killed. */
static int child_hold(const char *dir, const char *writer) {
  ckpt_lock *l = NULL;
  newt_result_t r = ckpt_lock_take(dir, writer, &l);
  if (r != NEWT_OK) {
    fprintf(stderr, "child hold: %s\n", newt_errmsg());
    return r == NEWT_ERR_CONFLICT ? 3 : 1;
  }
  printf("holding\n");
  fflush(stdout);
  for (;;) pause();
}

/* ---- the tests ---------------------------------------------------------------------------- */

/* The newest committed step of dir, -1 when none. */
static int64_t newest_committed(const char *dir) {
  ckpt_step_info *info = NULL;
  size_t n = 0;
  int64_t newest = -1;
  if (ckpt_list(dir, &info, &n) == NEWT_OK)
    for (size_t i = 0; i < n; i++)
      if (info[i].valid && info[i].step > newest) newest = info[i].step;
  newt_err_clear();
  free(info);
  return newest;
}

/* The second newt train's refusal names the directory and the first one (pid, host, command),
 * and it trained nothing. */
static void check_refused(const char *dir, pid_t holder, int rc, const char *out) {
  char who[128];
  snprintf(who, sizeof who, "taken by pid %d on host %s", (int)holder, newt_hostname());
  T_CHECK_MSG(rc == 1, "the second newt train: exit %d, expected 1 (refused)\n%s", rc, out);
  T_CHECK_MSG(strstr(out, "checkpoint directory") && strstr(out, dir) && strstr(out, "has another writer"),
              "the refusal does not name the directory:\n%s", out);
  T_CHECK_MSG(strstr(out, who) && strstr(out, "train --model layers=1,channels=32"),
              "the refusal does not name the holder (%s, its command):\n%s", who, out);
  T_CHECK_MSG(strstr(out, "resumed at") == NULL && strstr(out, "/30 |") == NULL, "the refused run trained:\n%s", out);
}

static void test_two_trains(void) {
  char dir[300], log[400], out[16384];
  snprintf(dir, sizeof dir, "%s/train", root);
  snprintf(log, sizeof log, "%s/train-a.out", root);
  /* far more steps than the test lasts: it ends when told (SIGTERM), never on its own */
  const char *a[] = {"newt", "train", "--model", "layers=1,channels=32", "--batch", "2", "--seq-len", "16",
                     "--ckpt-every", "1", "--ckpt-keep", "2", "--ckpt-dir", dir, "--steps", "1000000", NULL};
  pid_t pa = spawn(a, log);
  /* the first run holds the lock and has committed a few steps: stop it there */
  committed_at_least c = {dir, 2};
  T_CHECK_MSG(wait_for(committed, &c, 60000), "the first newt train committed nothing in 60 s");
  lock_names ln = {.dir = dir};
  snprintf(ln.want, sizeof ln.want, "\"pid\":%d,", (int)pa);
  T_CHECK_MSG(lock_says(&ln), "%s/LOCK does not name pid %d", dir, (int)pa);
  T_CHECK(kill(pa, SIGSTOP) == 0);
  /* a second newt train in the same directory: refused, naming the directory and the holder */
  const char *b[] = {"newt", "train", "--model", "layers=1,channels=32", "--batch", "2", "--seq-len", "16",
                     "--ckpt-every", "1", "--ckpt-dir", dir, "--steps", "30", NULL};
  int rc = run(b, 120000, out, sizeof out);
  check_refused(dir, pa, rc, out);
  /* a library writer of another name: refused the same way */
  char who[128];
  snprintf(who, sizeof who, "taken by pid %d on host", (int)pa);
  const char *other[] = {"self", "child", "save", dir, "job other", "0", "1", "100", NULL};
  rc = run(other, 60000, out, sizeof out);
  T_CHECK_MSG(rc == 3 && strstr(out, who) && strstr(out, dir), "another writer: exit %d, expected 3\n%s", rc, out);
  /* the first one goes on saving; meanwhile the second is refused again */
  T_CHECK(kill(pa, SIGCONT) == 0);
  rc = run(b, 120000, out, sizeof out);
  check_refused(dir, pa, rc, out);
  c.step = newest_committed(dir) + 3;
  T_CHECK_MSG(wait_for(committed, &c, 60000), "the first newt train committed nothing more in 60 s");
  /* it ends well; everything its manifests name is there */
  T_CHECK(kill(pa, SIGTERM) == 0);
  rc = reap(pa, 180000);
  char *text = NULL;
  size_t len = 0;
  if (newt_fs_read_all(log, 1 << 24, &text, &len) == NEWT_OK)
    T_CHECK_MSG(rc == 0 && strstr(text, "stopping after step"), "the first newt train: exit %d\n%.4000s", rc, text);
  free(text);
  int64_t last = newest_committed(dir);
  T_CHECK_MSG(last >= c.step && ckpt_latest_pointer(dir) == last, "newest %lld, latest %lld", (long long)last,
              (long long)ckpt_latest_pointer(dir));
  T_CHECK_MSG(check_committed(dir) == 2, "expected the 2 newest steps committed (--ckpt-keep 2)");
  /* once it has exited, the directory is free: a new run resumes from it */
  char steps[32], want[64];
  snprintf(steps, sizeof steps, "%lld", (long long)last + 2);
  snprintf(want, sizeof want, "resumed at step %lld", (long long)last);
  const char *again[] = {"newt", "train", "--model", "layers=1,channels=32", "--batch", "2", "--seq-len", "16",
                         "--ckpt-every", "2", "--ckpt-dir", dir, "--steps", steps, NULL};
  rc = run(again, 120000, out, sizeof out);
  T_CHECK_MSG(rc == 0 && strstr(out, want), "newt train after the first: exit %d\n%s", rc, out);
  check_committed(dir);
}

static void test_job_ranks_share(void) {
  char dir[300], log[400], out[16384];
  snprintf(dir, sizeof dir, "%s/job", root);
  /* a member of job demo holding the directory, stopped (a rank 0 of an earlier generation,
     fenced while hung) */
  snprintf(log, sizeof log, "%s/hold.out", root);
  const char *hold[] = {"self", "child", "hold", dir, "job demo", NULL};
  pid_t ph = spawn(hold, log);
  log_has held = {log, "holding"};
  T_CHECK_MSG(wait_for(log_says, &held, 30000), "the holder did not take %s/LOCK", dir);
  T_CHECK(kill(ph, SIGSTOP) == 0);
  /* two ranks of job demo, two processes: they share it, rank 0 commits */
  char l0[400], l1[400];
  snprintf(l0, sizeof l0, "%s/rank0.out", root);
  snprintf(l1, sizeof l1, "%s/rank1.out", root);
  const char *r0[] = {"self", "child", "save", dir, "job demo", "0", "2", "7", NULL};
  const char *r1[] = {"self", "child", "save", dir, "job demo", "1", "2", "7", NULL};
  pid_t p0 = spawn(r0, l0), p1 = spawn(r1, l1);
  int rc0 = reap(p0, 120000), rc1 = reap(p1, 120000);
  T_CHECK_MSG(rc0 == 0 && rc1 == 0, "ranks of job demo: exit %d and %d", rc0, rc1);
  ts_load_check(dir, CKPT_LATEST, 7, 1, 0, NULL);
  /* another job, and newt train: refused, naming job demo */
  const char *other[] = {"self", "child", "save", dir, "job other", "0", "1", "8", NULL};
  int rc = run(other, 60000, out, sizeof out);
  T_CHECK_MSG(rc == 3 && strstr(out, dir) && strstr(out, "writer \"job demo\""), "job other: exit %d\n%s", rc, out);
  const char *train[] = {"newt", "train", "--model", "layers=1,channels=32", "--batch", "2", "--seq-len", "16",
                         "--ckpt-every", "1", "--ckpt-dir", dir, "--steps", "2", NULL};
  rc = run(train, 120000, out, sizeof out);
  T_CHECK_MSG(rc == 1 && strstr(out, "writer \"job demo\"") && strstr(out, dir), "newt train: exit %d\n%s", rc, out);
  /* in this process: job demo joins, another writer is refused */
  ckpt_lock *l = NULL, *l2 = NULL;
  T_OK(ckpt_lock_take(dir, "job demo", &l));
  T_ERR(NEWT_ERR_CONFLICT, ckpt_lock_take(dir, "job other", &l2));
  T_CHECK_MSG(strstr(newt_errmsg(), "job demo"), "message: %s", newt_errmsg());
  ckpt_lock_release(l);
  kill(ph, SIGKILL);
  reap(ph, 10000);
  T_CHECK(check_committed(dir) == 1);
}

/* A real job (`newt run`, two workers) holds its directory as "job <name>": `newt train` there
 * is refused while it runs, and its checkpoints stay whole. */
static void test_job_and_train(void) {
  char dir[300], logs[300], log[400], out[16384];
  snprintf(dir, sizeof dir, "%s/run", root);
  snprintf(logs, sizeof logs, "%s/run-logs", root);
  snprintf(log, sizeof log, "%s/run.out", root);
  const char *job[] = {"newt", "run", "--nproc", "2", "--job", "lockjob", "--steps", "1000000", "--model",
                       "layers=1,channels=32", "--seq-len", "16", "--global-batch", "4", "--micro-batch", "2",
                       "--ckpt-dir", dir, "--ckpt-every", "100", "--log-dir", logs, "--quiet", "--no-metrics", NULL};
  pid_t pj = spawn(job, log);
  committed_at_least c = {dir, 100};
  T_CHECK_MSG(wait_for(committed, &c, 120000), "the job committed no checkpoint in 120 s");
  lock_names ln = {.dir = dir, .want = "\"writer\":\"job lockjob\""};
  T_CHECK_MSG(lock_says(&ln), "%s/LOCK does not name job lockjob", dir);
  const char *train[] = {"newt", "train", "--model", "layers=1,channels=32", "--batch", "4", "--seq-len", "16",
                         "--ckpt-every", "1", "--ckpt-dir", dir, "--steps", "3", NULL};
  char out2[16384];
  int rc = run(train, 120000, out2, sizeof out2);
  T_CHECK_MSG(rc == 1 && strstr(out2, dir) && strstr(out2, "writer \"job lockjob\"") && strstr(out2, "newt worker"),
              "newt train beside the job: exit %d\n%s", rc, out2);
  T_CHECK(kill(pj, SIGTERM) == 0);
  rc = reap(pj, 240000);
  T_CHECK_MSG(rc != -1, "newt run did not end on SIGTERM");
  T_CHECK_MSG(check_committed(dir) >= 1, "no committed checkpoint left");
  (void)out;
}

static void test_dead_holder(void) {
  char dir[300], log[400];
  snprintf(dir, sizeof dir, "%s/dead", root);
  snprintf(log, sizeof log, "%s/dead.out", root);
  const char *hold[] = {"self", "child", "hold", dir, "job gone", NULL};
  pid_t ph = spawn(hold, log);
  log_has held = {log, "holding"};
  T_CHECK_MSG(wait_for(log_says, &held, 30000), "the holder did not take %s/LOCK", dir);
  lock_names ln = {.dir = dir};
  snprintf(ln.want, sizeof ln.want, "\"pid\":%d,", (int)ph);
  ckpt_lock *l = NULL;
  T_ERR(NEWT_ERR_CONFLICT, ckpt_lock_take(dir, "job next", &l));
  T_CHECK(kill(ph, SIGKILL) == 0);
  T_CHECK(reap(ph, 10000) == -1); /* reaped: gone, with its descriptors */
  /* its LOCK file is still there, naming it: it blocks nobody */
  T_CHECK(lock_says(&ln));
  T_OK(ckpt_lock_take(dir, "job next", &l));
  snprintf(ln.want, sizeof ln.want, "\"writer\":\"job next\"");
  T_CHECK(lock_says(&ln));
  ckpt_lock_release(l);
  T_OK(ts_save(dir, 3, 1, 0, 4096)); /* and a saver of this process */
  ts_load_check(dir, CKPT_LATEST, 3, 1, 0, NULL);
}

#define VICTIM "victim: must never change\n"

static void test_planted_lock(void) {
  char dir[300], victim[300], lock[400], *text = NULL;
  size_t len;
  snprintf(dir, sizeof dir, "%s/planted", root);
  snprintf(victim, sizeof victim, "%s/victim", root);
  snprintf(lock, sizeof lock, "%s/LOCK", dir);
  T_OK(newt_fs_mkdirs(dir, 0755));
  T_OK(newt_fs_write_atomic(victim, VICTIM, strlen(VICTIM)));
  ckpt_lock *l = NULL;
  /* a symbolic link: removed itself, never written through */
  T_CHECK(symlink(victim, lock) == 0);
  T_OK(ckpt_lock_take(dir, "job a", &l));
  ckpt_lock_release(l);
  struct stat st;
  T_CHECK(lstat(lock, &st) == 0 && S_ISREG(st.st_mode));
  T_OK(newt_fs_read_all(victim, 1 << 16, &text, &len));
  T_CHECK_MSG(text && strcmp(text, VICTIM) == 0, "written through a link: %s", text ? text : "");
  free(text);
  /* a FIFO: the same, and nothing hangs */
  unlink(lock);
  T_CHECK(mkfifo(lock, 0644) == 0);
  T_OK(ckpt_lock_take(dir, "job a", &l));
  ckpt_lock_release(l);
  T_CHECK(lstat(lock, &st) == 0 && S_ISREG(st.st_mode));
  /* a hard link to a file elsewhere: refused, naming it, nothing written */
  unlink(lock);
  T_CHECK(link(victim, lock) == 0);
  T_ERR(NEWT_ERR_INVALID, ckpt_lock_take(dir, "job a", &l));
  T_CHECK_MSG(strstr(newt_errmsg(), lock) && strstr(newt_errmsg(), "2 links"), "message: %s", newt_errmsg());
  T_OK(newt_fs_read_all(victim, 1 << 16, &text, &len));
  T_CHECK_MSG(text && strcmp(text, VICTIM) == 0, "the victim changed: %s", text ? text : "");
  free(text);
  /* a lock file left half written, of nobody: taken and rewritten */
  unlink(lock);
  T_OK(newt_fs_write_atomic(lock, "{\"writer\":\"job", 14));
  T_OK(ckpt_lock_take(dir, "job b", &l));
  lock_names ln = {.dir = dir, .want = "\"writer\":\"job b\""};
  T_CHECK(lock_says(&ln));
  ckpt_lock_release(l);
}

/* A reader of DIR/LOCK, in a child: as user 65534 when `other` (this test runs as root),
 * it opens the lock file read-only and takes `how` (LOCK_SH or LOCK_EX) on it, then waits
 * for its pipe to close. Returns its pid; *held: 1 when it holds the lock, 0 when it could
 * not open the file or lock it. */
static pid_t reader_holds(const char *lock, int other, int how, int *held) {
  int up[2], down[2];
  *held = -1;
  if (pipe(up) != 0 || pipe(down) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    char ok = 0;
    if (!other || (setgid(65534) == 0 && setuid(65534) == 0)) {
      int fd = open(lock, O_RDONLY | O_CLOEXEC);
      ok = fd >= 0 && flock(fd, how | LOCK_NB) == 0;
    }
    if (write(up[1], &ok, 1) != 1) _exit(1);
    char c;
    while (read(down[0], &c, 1) > 0) {
    }
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  char ok = 0;
  *held = pid > 0 && read(up[0], &ok, 1) == 1 ? ok : -1;
  close(up[0]);
  reader_pipe = down[1];
  return pid;
}

static void reader_done(pid_t pid) {
  close(reader_pipe);
  if (pid > 0) waitpid(pid, NULL, 0);
}

/* Issue 37, item 8: read access alone to DIR/LOCK kept every writer out (the file was 0644
 * and flock takes a read-only descriptor). Now the lock file is 0600: another user cannot
 * open it to hold it; and a lock file of an older release (0644) that a reader opened before
 * any writer came is replaced when next taken, so the reader's lock keeps nobody out. */
static void test_reader_cannot_hold(void) {
  char dir[300], lock[400];
  snprintf(dir, sizeof dir, "%s/reader", root);
  snprintf(lock, sizeof lock, "%s/LOCK", dir);
  T_OK(newt_fs_mkdirs(dir, 0755));
  T_CHECK(chmod(root, 0755) == 0 && chmod(dir, 0755) == 0); /* the reader may reach the file */
  ckpt_lock *l = NULL;
  T_OK(ckpt_lock_take(dir, "job a", &l));
  ckpt_lock_release(l);
  struct stat st;
  T_CHECK_MSG(stat(lock, &st) == 0 && (st.st_mode & 0777) == 0600, "%s is mode %04o", lock, (unsigned)(st.st_mode & 0777));
  int held;
  if (geteuid() == 0) { /* another user who may read the directory */
    pid_t r = reader_holds(lock, 1, LOCK_SH, &held);
    T_CHECK_MSG(held == 0, "user 65534 holds %s (%d)", lock, held);
    l = NULL;
    T_OK(ckpt_lock_take(dir, "job b", &l));
    ckpt_lock_release(l);
    reader_done(r);
  } else {
    printf("  (not root: the reader as another user is not tried)\n");
  }
  /* an older release's lock file, 0644, opened by a reader before the next writer came */
  T_CHECK(unlink(lock) == 0);
  const char *old = "{\"writer\":\"job old\",\"pid\":1,\"host\":\"h\",\"since_ms\":1,\"cmd\":\"newt\"}";
  int fd = open(lock, O_WRONLY | O_CREAT | O_EXCL, 0644);
  T_CHECK(fd >= 0 && fchmod(fd, 0644) == 0 && write(fd, old, strlen(old)) == (ssize_t)strlen(old));
  if (fd >= 0) close(fd);
  int rfd = open(lock, O_RDONLY | O_CLOEXEC);
  T_CHECK(rfd >= 0);
  l = NULL;
  T_OK(ckpt_lock_take(dir, "job c", &l));
  ckpt_lock_release(l);
  T_CHECK_MSG(stat(lock, &st) == 0 && (st.st_mode & 0777) == 0600, "%s is mode %04o", lock, (unsigned)(st.st_mode & 0777));
  T_CHECK_MSG(rfd >= 0 && flock(rfd, LOCK_EX | LOCK_NB) == 0, "the reader's descriptor cannot take its lock");
  l = NULL;
  T_OK(ckpt_lock_take(dir, "job d", &l)); /* the reader's lock is on a file nobody uses */
  ckpt_lock_release(l);
  if (rfd >= 0) close(rfd);
  if (geteuid() == 0) { /* and the file the name leads to now is closed to user 65534 */
    pid_t r = reader_holds(lock, 1, LOCK_EX, &held);
    T_CHECK_MSG(held == 0, "user 65534 holds %s (%d)", lock, held);
    reader_done(r);
  }
}

/* A run started over (its attempts counted from the start again) saves a step committed by
 * the same attempt: the step is committed again, whole; nothing of a committed manifest is
 * ever missing. */
static void test_same_attempt_again(void) {
  char dir[300];
  snprintf(dir, sizeof dir, "%s/again", root);
  for (int round = 0; round < 2; round++) {
    ckpt_saver_opts o = {.dir = dir, .rank = 0, .nranks = 1, .commit = 1, .keep = 5, .attempt = 42};
    tstate s;
    ckpt_saver *sv = ts_begin(&o, &s, 5, 1, 0, 0);
    T_OK(ts_save_into(sv, &s, 5));
    ckpt_saver_free(sv);
    ts_free(&s);
    T_CHECK(check_committed(dir) == 1);
    ts_load_check(dir, CKPT_LATEST, 5, 1, 0, NULL);
  }
}

int main(int argc, char **argv) {
  if (argc == 8 && strcmp(argv[1], "child") == 0 && strcmp(argv[2], "save") == 0)
    return child_save(argv[3], argv[4], atoi(argv[5]), atoi(argv[6]), atoll(argv[7]));
  if (argc == 5 && strcmp(argv[1], "child") == 0 && strcmp(argv[2], "hold") == 0) return child_hold(argv[3], argv[4]);
  if (newt_proc_self_exe(self, sizeof self) != NEWT_OK) {
    fprintf(stderr, "%s\n", newt_errmsg());
    return 1;
  }
  ts_tmpdir(root, sizeof root, "/tmp", "ckpt-lock");
  T_RUN(test_two_trains);
  T_RUN(test_job_ranks_share);
  T_RUN(test_job_and_train);
  T_RUN(test_dead_holder);
  T_RUN(test_planted_lock);
  T_RUN(test_reader_cannot_hold);
  T_RUN(test_same_attempt_again);
  newt_fs_rm_rf(root);
  return T_DONE();
}
