/* Checkpoint directories written by someone hostile (issue 17). Whoever can write in the
 * checkpoint volume can delete or damage checkpoints (the checksums find it and the
 * previous checkpoint is used), but must not be able to make newt write outside the
 * directory, hang, or use unbounded memory or time. Each test plants the real thing:
 *   - symbolic links under the names newt writes (temporary names, the shard of the
 *     attempt, a step directory) pointing at a victim file or directory outside: nothing
 *     is written or removed there, and the save still succeeds;
 *   - links in place of a step directory or a MANIFEST pointing at a valid checkpoint
 *     elsewhere: not read, the checkpoint inside the directory is loaded;
 *   - FIFOs named MANIFEST, a shard, an index and `latest`: `newt ckpt ls|verify|inspect`,
 *     a load, a commit and `newt train --ckpt-dir` finish with the FIFO named;
 *   - the 569-byte MANIFEST of a [2^27, 2] tensor: `newt ckpt ls` and a resume take no
 *     time;
 *   - a 17 MiB MANIFEST (valid frame and checksum, its state an array of 8.9 million zeros,
 *     which `newt ckpt ls` took 1.4 GB and 5 s to parse under the old 1 GiB bound): `newt ckpt
 *     ls|inspect` and a load refuse it, naming the file and the bound, each with a peak memory
 *     (the child's ru_maxrss) under 64 MB;
 *   - manifests at the 8 MiB bound (issue 37, item 11): one of 32,000 one-chunk tensors is
 *     inspected, and one whose state holds 4 million zeros refused, each under 64 MB.
 *   - another job's well-formed step, newer, copied in (issue 37): a load with this job's key
 *     refuses it naming its MANIFEST and falls back to this job's own; so is a step written
 *     without a key, until `ckpt_sign` adopts it; a reader without a key reads them all.
 * Everything that could hang runs as a child process (`newt`, or this binary re-executed
 * with "child") under a deadline, and counts as a failure when it is killed. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>

#include "ckpt_util.h"
#include "common/proc.h"
#include "common/strutil.h"

static char root[256], self[4096];

#define VICTIM "victim: must never change\n"

static void put_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  T_CHECK_MSG(f != NULL, "cannot write %s", path);
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

static int file_is(const char *path, const char *text) {
  char *got = NULL;
  size_t len;
  if (newt_fs_read_all(path, 1 << 20, &got, &len) != NEWT_OK) return 0;
  int same = strcmp(got, text) == 0;
  free(got);
  return same;
}

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) n += e->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

static int is_kind(const char *path, mode_t kind) {
  struct stat st;
  return lstat(path, &st) == 0 && (st.st_mode & S_IFMT) == kind;
}

static void mklink(const char *target, const char *fmt, const char *dir, const char *name) {
  char p[700];
  snprintf(p, sizeof p, fmt, dir, name);
  T_CHECK_MSG(symlink(target, p) == 0, "symlink %s: %s", p, strerror(errno));
}

static void copy_file(const char *from, const char *to) {
  char *text = NULL;
  size_t len = 0;
  T_OK(newt_fs_read_all(from, 1 << 26, &text, &len));
  FILE *f = fopen(to, "wb");
  T_CHECK(f != NULL);
  if (f && text) fwrite(text, 1, len, f);
  if (f) fclose(f);
  free(text);
}

/* The first *.shard in a step directory. */
static int shard_of(const char *sd, char *out, size_t cap) {
  DIR *d = opendir(sd);
  struct dirent *e;
  int found = 0;
  while (d && !found && (e = readdir(d)) != NULL) {
    size_t l = strlen(e->d_name);
    if (l > 6 && strcmp(e->d_name + l - 6, ".shard") == 0) found = snprintf(out, cap, "%s/%s", sd, e->d_name) > 0;
  }
  if (d) closedir(d);
  return found;
}

/* Runs argv (argv[0] "newt": $NEWT_BIN; "self": this binary), its output into `out`, under
 * a deadline: the exit status, -1 when it had to be killed. */
static int run_deadline(const char *const *argv, int64_t ms, char *out, size_t cap) {
  const char *bin = getenv("NEWT_BIN");
  const char *a[32];
  int n = 0;
  for (; argv[n] && n < 31; n++) a[n] = argv[n];
  a[n] = NULL;
  a[0] = strcmp(argv[0], "self") == 0 ? self : bin ? bin : "newt";
  char log[400];
  snprintf(log, sizeof log, "%s/child.out", root);
  unlink(log);
  newt_spawn_opts so = {.log_path = log, .die_with_parent = 1};
  pid_t pid = -1;
  T_OK(newt_proc_spawn(a, &so, &pid));
  int st = 0, rc = -1;
  if (newt_proc_wait(pid, ms, &st) != NEWT_OK) {
    kill(pid, SIGKILL);
    newt_proc_wait(pid, 10000, &st);
  } else if (WIFEXITED(st)) {
    rc = WEXITSTATUS(st);
  }
  char *text = NULL;
  size_t len = 0;
  out[0] = '\0';
  if (newt_fs_read_all(log, 1 << 24, &text, &len) == NEWT_OK) snprintf(out, cap, "%s", text);
  free(text);
  return rc;
}

/* run_deadline, with the child's peak resident memory (ru_maxrss, KiB) in *rss_kb. */
static int run_rss(const char *const *argv, int64_t ms, char *out, size_t cap, long *rss_kb) {
  const char *bin = getenv("NEWT_BIN");
  const char *a[32];
  int n = 0;
  for (; argv[n] && n < 31; n++) a[n] = argv[n];
  a[n] = NULL;
  a[0] = strcmp(argv[0], "self") == 0 ? self : bin ? bin : "newt";
  char log[400];
  snprintf(log, sizeof log, "%s/child.out", root);
  unlink(log);
  newt_spawn_opts so = {.log_path = log, .die_with_parent = 1};
  pid_t pid = -1;
  T_OK(newt_proc_spawn(a, &so, &pid));
  int st = 0, rc = -1;
  struct rusage ru;
  memset(&ru, 0, sizeof ru);
  newt_deadline_t d = newt_deadline_in_ms(ms);
  pid_t got = 0;
  while ((got = wait4(pid, &st, WNOHANG, &ru)) == 0 && !newt_deadline_passed(d)) newt_sleep_ms(5);
  if (got != pid) {
    kill(pid, SIGKILL);
    wait4(pid, &st, 0, &ru);
  } else if (WIFEXITED(st)) {
    rc = WEXITSTATUS(st);
  }
  *rss_kb = ru.ru_maxrss;
  char *text = NULL;
  size_t len = 0;
  out[0] = '\0';
  if (newt_fs_read_all(log, 1 << 24, &text, &len) == NEWT_OK) snprintf(out, cap, "%s", text);
  free(text);
  return rc;
}

/* ---- writing: links under the names newt creates ----------------------------------------- */

static void test_temporary_name_links(void) {
  char dir[300], victim[300], sd[400];
  snprintf(dir, sizeof dir, "%s/tmplinks", root);
  snprintf(victim, sizeof victim, "%s/victim-tmp", root);
  put_file(victim, VICTIM);
  ckpt_step_dirname(sd, sizeof sd, dir, 1);
  T_OK(newt_fs_mkdirs(sd, 0755));
  /* the pid is predictable (1 in a container): every temporary name of this process */
  char name[64];
  snprintf(name, sizeof name, "latest.tmp.%d", (int)getpid());
  mklink(victim, "%s/%s", dir, name);
  snprintf(name, sizeof name, "MANIFEST.tmp.%d", (int)getpid());
  mklink(victim, "%s/%s", sd, name);
  snprintf(name, sizeof name, "rank-00000.index.tmp.%d", (int)getpid());
  mklink(victim, "%s/%s", sd, name);
  T_OK(ts_save(dir, 1, 1, 0, 4096));
  T_CHECK_MSG(file_is(victim, VICTIM), "the save wrote through a link into %s", victim);
  char latest[400];
  snprintf(latest, sizeof latest, "%s/latest", dir);
  T_CHECK(is_kind(latest, S_IFREG) && ckpt_latest_pointer(dir) == 1);
  ts_load_check(dir, CKPT_LATEST, 1, 1, 0, NULL);
}

static void test_shard_name_link(void) {
  char dir[300], victim[300], sd[400], shard[500];
  snprintf(dir, sizeof dir, "%s/shardlink", root);
  snprintf(victim, sizeof victim, "%s/victim-shard", root);
  put_file(victim, VICTIM);
  ckpt_step_dirname(sd, sizeof sd, dir, 1);
  T_OK(newt_fs_mkdirs(sd, 0755));
  /* the attempt is the plan generation: the shard's name is predictable */
  ckpt_saver_opts o = {.dir = dir, .rank = 0, .nranks = 1, .commit = 1, .keep = 10, .attempt = 7};
  char name[64];
  ckpt_shard_name(name, sizeof name, 0, 7);
  mklink(victim, "%s/%s", sd, name);
  snprintf(shard, sizeof shard, "%s/%s", sd, name);
  tstate s;
  ckpt_saver *sv = ts_begin(&o, &s, 1, 16, 1, 0);
  T_OK(ts_save_into(sv, &s, 1));
  ckpt_saver_free(sv);
  ts_free(&s);
  T_CHECK_MSG(file_is(victim, VICTIM), "the shard was written through a link into %s", victim);
  T_CHECK(is_kind(shard, S_IFREG));
  ts_load_check(dir, CKPT_LATEST, 1, 16, 1, NULL);
}

/* A victim directory with files that a commit's clean-up and pruning would remove. */
static void make_victim_dir(const char *vd) {
  char p[400];
  T_OK(newt_fs_mkdirs(vd, 0755));
  const char *names[] = {"keep.txt", "old.shard", "note.failed", "x.tmp.1", "MANIFEST"};
  for (int i = 0; i < 5; i++) {
    snprintf(p, sizeof p, "%s/%s", vd, names[i]);
    put_file(p, VICTIM);
  }
}

static int victim_dir_intact(const char *vd) {
  char p[400];
  const char *names[] = {"keep.txt", "old.shard", "note.failed", "x.tmp.1", "MANIFEST"};
  for (int i = 0; i < 5; i++) {
    snprintf(p, sizeof p, "%s/%s", vd, names[i]);
    if (!file_is(p, VICTIM)) return 0;
  }
  return count_entries(vd) == 5;
}

static void test_step_dir_link(void) {
  char dir[300], vd[300], vd0[300], sd[400];
  snprintf(dir, sizeof dir, "%s/steplink", root);
  snprintf(vd, sizeof vd, "%s/victim-dir", root);
  snprintf(vd0, sizeof vd0, "%s/victim-dir0", root);
  make_victim_dir(vd);
  make_victim_dir(vd0);
  T_OK(ts_save(dir, 1, 1, 0, 4096));
  /* the step about to be saved is a link to the victim: replaced, never written through */
  ckpt_step_dirname(sd, sizeof sd, dir, 2);
  T_CHECK(symlink(vd, sd) == 0);
  /* an older "step" is a link to a victim holding a MANIFEST: not a checkpoint, never pruned through */
  char sd0[400];
  ckpt_step_dirname(sd0, sizeof sd0, dir, 0);
  T_CHECK(symlink(vd0, sd0) == 0);
  ckpt_saver_opts o = {.dir = dir, .rank = 0, .nranks = 1, .commit = 1, .keep = 1};
  tstate s;
  ckpt_saver *sv = ts_begin(&o, &s, 2, 1, 0, 0);
  T_OK(ts_save_into(sv, &s, 2));
  ckpt_saver_free(sv);
  ts_free(&s);
  T_CHECK_MSG(victim_dir_intact(vd), "files were written into or removed from %s through step-0000000002", vd);
  T_CHECK_MSG(victim_dir_intact(vd0), "files were removed from %s through step-0000000000", vd0);
  T_CHECK(is_kind(sd, S_IFDIR));
  ts_load_check(dir, CKPT_LATEST, 2, 1, 0, NULL);
  ckpt_step_info *info = NULL;
  size_t n = 0;
  T_OK(ckpt_list(dir, &info, &n));
  T_CHECK_MSG(n == 1 && info[0].step == 2 && info[0].valid, "%zu steps listed", n); /* 1 pruned, 0 is no step */
  free(info);
}

/* ---- reading: links to a valid checkpoint elsewhere ------------------------------------- */

static void test_read_links(void) {
  char dir[300], other[300], sd[400], osd[400], p[600], q[600];
  snprintf(dir, sizeof dir, "%s/readlink", root);
  snprintf(other, sizeof other, "%s/elsewhere", root);
  T_OK(ts_save(dir, 1, 1, 0, 4096));
  T_OK(ts_save(other, 5, 1, 0, 4096));
  T_OK(ts_save(other, 6, 1, 0, 4096));
  /* step 5 is a link to the step directory of another checkpoint */
  ckpt_step_dirname(sd, sizeof sd, dir, 5);
  ckpt_step_dirname(osd, sizeof osd, other, 5);
  T_CHECK(symlink(osd, sd) == 0);
  /* step 6 is a directory with a copy of the shard, its MANIFEST a link to the other one */
  ckpt_step_dirname(sd, sizeof sd, dir, 6);
  ckpt_step_dirname(osd, sizeof osd, other, 6);
  T_OK(newt_fs_mkdirs(sd, 0755));
  T_CHECK(shard_of(osd, p, sizeof p));
  snprintf(q, sizeof q, "%s/%s", sd, strrchr(p, '/') + 1);
  copy_file(p, q);
  snprintf(p, sizeof p, "%s/MANIFEST", osd);
  mklink(p, "%s/%s", sd, "MANIFEST");

  int fb = -1;
  ts_load_check(dir, CKPT_LATEST, 1, 1, 0, &fb);
  T_CHECK_MSG(fb == 1, "%d fallbacks (step 6 is one, step 5 is not a checkpoint)", fb);
  ckpt_reader *r = NULL;
  T_ERR(NEWT_ERR_INVALID, ckpt_open(&r, dir, 6, 1));
  T_CHECK_MSG(strstr(newt_errmsg(), "MANIFEST is a symbolic link"), "message: %s", newt_errmsg());
  T_ERR(NEWT_ERR_INVALID, ckpt_open(&r, dir, 5, 1));
  T_CHECK_MSG(strstr(newt_errmsg(), "step-0000000005 is a symbolic link"), "message: %s", newt_errmsg());
  ckpt_step_dirname(sd, sizeof sd, dir, 5);
  T_ERR(NEWT_ERR_INVALID, ckpt_open_path(&r, sd, 1));
  T_OK(ckpt_open(&r, dir, CKPT_LATEST, 1));
  T_CHECK(ckpt_reader_step(r) == 1);
  ckpt_close(r);
  ckpt_step_info *info = NULL;
  size_t n = 0;
  T_OK(ckpt_list(dir, &info, &n));
  T_CHECK_MSG(n == 2 && info[0].step == 1 && info[0].valid && info[1].step == 6 && info[1].committed &&
                  !info[1].valid, "%zu steps listed", n);
  free(info);
}

/* ---- FIFOs ----------------------------------------------------------------------------------- */

static void make_fifo(const char *path) {
  unlink(path);
  T_CHECK_MSG(mkfifo(path, 0644) == 0, "mkfifo %s: %s", path, strerror(errno));
}

/* A FIFO named `name` in step-<step> of dir (made when missing), or in dir (step < 0). */
static void plant_fifo(const char *dir, int64_t step, const char *name) {
  char sd[400], p[600];
  if (step >= 0) ckpt_step_dirname(sd, sizeof sd, dir, step);
  else snprintf(sd, sizeof sd, "%s", dir);
  T_OK(newt_fs_mkdirs(sd, 0755));
  snprintf(p, sizeof p, "%s/%s", sd, name);
  make_fifo(p);
}

/* child fifo DIR: what a library user does with a directory full of FIFOs (the parent
 * kills it when it hangs). */
static int child_fifo(const char *dir) {
  int fb = -1;
  ts_load_check(dir, CKPT_LATEST, 1, 1, 0, &fb);
  T_CHECK_MSG(fb == 2, "%d fallbacks", fb);
  T_CHECK(ckpt_latest_pointer(dir) == -1);
  /* a commit by hand of step 4, whose index is a FIFO */
  ckpt_commit_opts co = {.dir = dir, .step = 4, .nranks = 1, .deadline = newt_deadline_in_ms(2000)};
  T_ERR(NEWT_ERR_INVALID, ckpt_commit(&co));
  T_CHECK_MSG(strstr(newt_errmsg(), "rank-00000.index is a FIFO"), "message: %s", newt_errmsg());
  /* and a save over the FIFOs: the index and `latest` are replaced */
  T_OK(ts_save(dir, 4, 1, 0, 4096));
  T_CHECK(ckpt_latest_pointer(dir) == 4);
  ts_load_check(dir, CKPT_LATEST, 4, 1, 0, NULL);
  return T_DONE();
}

static void test_fifos(void) {
  char dir[300], sd[400], p[600], out[16384];
  snprintf(dir, sizeof dir, "%s/fifo", root);
  for (int s = 1; s <= 3; s++) T_OK(ts_save(dir, s, 1, 0, 4096));
  plant_fifo(dir, 3, "MANIFEST");
  ckpt_step_dirname(sd, sizeof sd, dir, 2);
  T_CHECK(shard_of(sd, p, sizeof p));
  make_fifo(p);
  plant_fifo(dir, -1, "latest");
  plant_fifo(dir, 4, "rank-00000.index");

  const char *ls[] = {"newt", "ckpt", "ls", dir, NULL};
  int rc = run_deadline(ls, 20000, out, sizeof out);
  T_CHECK_MSG(rc == 0 && strstr(out, "step-0000000003  corrupt") && strstr(out, "step-0000000001  committed") &&
                  strstr(out, "latest is a FIFO"), "newt ckpt ls: exit %d (-1: hung)\n%s", rc, out);
  snprintf(p, sizeof p, "%s/3", dir);
  const char *verify3[] = {"newt", "ckpt", "verify", p, NULL};
  rc = run_deadline(verify3, 20000, out, sizeof out);
  T_CHECK_MSG(rc == 1 && strstr(out, "MANIFEST is a FIFO, not a regular file"), "newt ckpt verify: exit %d\n%s", rc,
              out);
  const char *inspect3[] = {"newt", "ckpt", "inspect", p, NULL};
  rc = run_deadline(inspect3, 20000, out, sizeof out);
  T_CHECK_MSG(rc == 1 && strstr(out, "MANIFEST is a FIFO"), "newt ckpt inspect: exit %d\n%s", rc, out);
  snprintf(p, sizeof p, "%s/2", dir);
  const char *verify2[] = {"newt", "ckpt", "verify", p, NULL};
  rc = run_deadline(verify2, 20000, out, sizeof out);
  T_CHECK_MSG(rc == 1 && strstr(out, ".shard is a FIFO"), "newt ckpt verify: exit %d\n%s", rc, out);
  const char *child[] = {"self", "child", "fifo", dir, NULL};
  rc = run_deadline(child, 60000, out, sizeof out);
  T_CHECK_MSG(rc == 0, "the library child: exit %d (-1: hung)\n%s", rc, out);
}

/* ---- newt train on a planted directory ---------------------------------------------------- */

static void test_train_resume(void) {
  char dir[300], sd[400], p[600], out[16384];
  snprintf(dir, sizeof dir, "%s/train", root);
  const char *train[] = {"newt", "train", "--model", "layers=1,channels=32", "--batch", "2", "--seq-len", "16",
                         "--ckpt-every", "5", "--ckpt-dir", dir, "--steps", "10", NULL};
  int rc = run_deadline(train, 120000, out, sizeof out);
  T_CHECK_MSG(rc == 0, "newt train: exit %d\n%s", rc, out);
  /* newer than anything valid: a FIFO MANIFEST (step 99) and the 569-byte manifest of a
     [2^27, 2] tensor (step 98); `latest` a FIFO */
  plant_fifo(dir, 99, "MANIFEST");
  plant_fifo(dir, -1, "latest");
  ckpt_step_dirname(sd, sizeof sd, dir, 98);
  T_OK(newt_fs_mkdirs(sd, 0755));
  snprintf(p, sizeof p, "%s/MANIFEST", sd);
  size_t len;
  char *text = ts_hostile_manifest(98, (int64_t)1 << 27, 1, &len);
  T_OK(newt_fs_write_atomic(p, text, len));
  free(text);

  const char *ls[] = {"newt", "ckpt", "ls", dir, NULL};
  double t0 = newt_now_s();
  rc = run_deadline(ls, 20000, out, sizeof out);
  T_CHECK_MSG(rc == 0 && strstr(out, "step-0000000098  corrupt") && newt_now_s() - t0 < 10,
              "newt ckpt ls: exit %d (-1: hung) in %.1f s\n%s", rc, newt_now_s() - t0, out);
  train[13] = "20";
  t0 = newt_now_s();
  rc = run_deadline(train, 120000, out, sizeof out);
  T_CHECK_MSG(rc == 0 && strstr(out, "resumed at step 10 from") && strstr(out, "\"steps\":20,"),
              "newt train: exit %d (-1: hung)\n%s", rc, out);
  T_CHECK_MSG(newt_now_s() - t0 < 30, "newt train took %.1f s", newt_now_s() - t0);
  T_CHECK(ckpt_latest_pointer(dir) == 20);
}

/* ---- a manifest too large to read ------------------------------------------------------------- */

/* child huge DIR: a load falls back past the huge manifest of step 2 to step 1. */
static int child_huge(const char *dir) {
  int fb = -1;
  ts_load_check(dir, CKPT_LATEST, 1, 1, 0, &fb);
  T_CHECK_MSG(fb == 1, "%d fallbacks", fb);
  ckpt_reader *r = NULL;
  T_ERR(NEWT_ERR_INVALID, ckpt_open(&r, dir, 2, 1));
  fprintf(stderr, "open step 2: %s\n", newt_errmsg());
  return T_DONE();
}

static void test_huge_manifest(void) {
  char dir[300], sd[400], p[600], out[16384], bound[64];
  snprintf(dir, sizeof dir, "%s/huge", root);
  snprintf(bound, sizeof bound, "more than the %zu bytes", CKPT_MAX_MANIFEST);
  T_OK(ts_save(dir, 1, 1, 0, 4096));
  /* step 2: a well-framed manifest of 17 MiB, its state 8.9 million zeros (a JSON node each) */
  size_t want = (size_t)17 << 20;
  const char *head = "{\"format\":\"newt-ckpt\",\"version\":1,\"kind\":\"manifest\",\"step\":2,\"nranks\":1,"
                     "\"attempt\":\"0000000000000001\",\"created_ms\":0,\"files\":[{\"name\":\"a.shard\",\"rank\":0,"
                     "\"bytes\":8192,\"raw_bytes\":0}],\"tensors\":[],\"state\":{\"x\":[0";
  char *body = malloc(want + 1);
  T_CHECK(body != NULL);
  if (!body) return;
  size_t n = strlen(head);
  memcpy(body, head, n);
  while (n + 5 < want) body[n++] = ',', body[n++] = '0';
  memcpy(body + n, "]}}", 4);
  size_t len;
  char *text = ts_frame(body, &len);
  free(body);
  ckpt_step_dirname(sd, sizeof sd, dir, 2);
  T_OK(newt_fs_mkdirs(sd, 0755));
  snprintf(p, sizeof p, "%s/MANIFEST", sd);
  T_OK(newt_fs_write_atomic(p, text, len));
  free(text);
  char named[500];
  snprintf(named, sizeof named, "%s/MANIFEST: %zu bytes, %s", sd, len, bound);

  long rss = 0;
  const char *ls[] = {"newt", "ckpt", "ls", dir, NULL};
  int rc = run_rss(ls, 60000, out, sizeof out, &rss);
  T_CHECK_MSG(rc == 0 && strstr(out, "step-0000000002  corrupt") && strstr(out, "step-0000000001  committed"),
              "newt ckpt ls: exit %d (-1: hung)\n%s", rc, out);
  T_CHECK_MSG(rss < 64 * 1024, "newt ckpt ls took %ld KiB of memory for a manifest it must not read", rss);
  snprintf(p, sizeof p, "%s/2", dir);
  const char *inspect[] = {"newt", "ckpt", "inspect", p, NULL};
  rc = run_rss(inspect, 60000, out, sizeof out, &rss);
  T_CHECK_MSG(rc == 1 && strstr(out, named), "newt ckpt inspect: exit %d, expected 1 naming \"%s\"\n%s", rc, named,
              out);
  T_CHECK_MSG(rss < 64 * 1024, "newt ckpt inspect took %ld KiB of memory", rss);
  const char *child[] = {"self", "child", "huge", dir, NULL};
  rc = run_rss(child, 60000, out, sizeof out, &rss);
  T_CHECK_MSG(rc == 0 && strstr(out, named), "the library child: exit %d\n%s", rc, out);
  T_CHECK_MSG(rss < 64 * 1024, "a load took %ld KiB of memory", rss);
}

/* A manifest at the bound (issue 37, item 11), JSON of about `bytes`: many one-chunk tensors
 * (what newt writes for a model of many small parts), or its state an array of zeros. */
static char *bound_manifest(int zeros, size_t bytes) {
  newt_buf b;
  newt_buf_init(&b);
  size_t n = bytes / 260;
  newt_buf_printf(&b, "{\"format\":\"newt-ckpt\",\"version\":1,\"kind\":\"manifest\",\"step\":3,\"nranks\":1,"
                      "\"attempt\":\"0000000000000001\",\"created_ms\":0,\"files\":[{\"name\":\"a.shard\",\"rank\":0,"
                      "\"bytes\":8192,\"raw_bytes\":0}],\"tensors\":[");
  for (size_t k = 0; !zeros && k < n; k++)
    newt_buf_printf(&b, "%s{\"name\":\"layers.%08zu.weight\",\"dtype\":\"f32\",\"shape\":[4],\"chunks\":[{\"file\":0,"
                        "\"offset\":4096,\"stored\":16,\"raw\":16,\"codec\":\"raw\",\"filter\":\"none\",\"xxh_raw\":"
                        "\"0000000000000000\",\"xxh_stored\":\"0000000000000000\",\"box_offset\":[0],\"box_shape\":[4],"
                        "\"begin\":0,\"end\":4}]}",
                    k ? "," : "", k);
  newt_buf_printf(&b, "],\"state\":{\"x\":[0");
  while (zeros && b.len + 8 < bytes) newt_buf_append(&b, ",0,0,0,0", 8);
  newt_buf_printf(&b, "]}}");
  return b.data;
}

/* Issue 37, item 11: a manifest under the 8 MiB bound still took 344 MB to inspect (a JSON
 * tree of the whole file: 40 times the text for a state of zeros, 22 times for tiny tensors).
 * Now the file is read a piece at a time: `newt ckpt inspect` of 8 MiB of one-chunk tensors
 * reads them all with a peak memory under 64 MB, and a state of 4 million zeros is refused,
 * naming the bound on its values, under 64 MB too. */
static void test_manifest_at_bound(void) {
  char dir[300], sd[400], p[600], out[16384];
  snprintf(dir, sizeof dir, "%s/bound", root);
  for (int zeros = 0; zeros < 2; zeros++) {
    char *body = bound_manifest(zeros, CKPT_MAX_MANIFEST - 4096);
    size_t len;
    char *text = ts_frame(body, &len);
    free(body);
    ckpt_step_dirname(sd, sizeof sd, dir, 3 + zeros);
    T_OK(newt_fs_mkdirs(sd, 0755));
    snprintf(p, sizeof p, "%s/MANIFEST", sd);
    T_OK(newt_fs_write_atomic(p, text, len));
    free(text);
    T_CHECK_MSG(len <= CKPT_MAX_MANIFEST, "the manifest has %zu bytes", len);
    long rss = 0;
    const char *inspect[] = {"newt", "ckpt", "inspect", sd, NULL};
    int rc = run_rss(inspect, 120000, out, sizeof out, &rss);
    if (zeros)
      T_CHECK_MSG(rc == 1 && strstr(out, "MANIFEST.state") && strstr(out, "at most 65536"),
                  "newt ckpt inspect of a state of zeros: exit %d, expected 1 naming the bound\n%.2000s", rc, out);
    else
      T_CHECK_MSG(rc == 0 && strstr(out, "layers.00000000.weight"), "newt ckpt inspect of %zu bytes: exit %d\n%.2000s",
                  len, rc, out);
    T_CHECK_MSG(rss < 64 * 1024, "newt ckpt inspect of a %zu-byte manifest (%s) took %ld KiB of memory", len,
                zeros ? "a state of zeros" : "one-chunk tensors", rss);
  }
}

/* One rank saves the state of `step` with `key` (NULL: none) and commits it. */
static newt_result_t save_keyed(const char *dir, int64_t step, const ckpt_key *key) {
  ckpt_saver_opts o = {.dir = dir, .rank = 0, .nranks = 1, .threads = 2, .level = 3, .commit = 1, .keep = 10,
                       .key = key};
  ckpt_saver *sv;
  NEWT_CHECK(ckpt_saver_init(&sv, &o));
  tstate s;
  ts_make(&s, step, 1, 0);
  int started = 0;
  newt_result_t r = ckpt_save_begin(sv, step, 0, &started);
  if (r == NEWT_OK) r = ts_save_into(sv, &s, step);
  ts_free(&s);
  ckpt_saver_free(sv);
  return r;
}

/* The step a load with `key` takes (its state checked against that step's), the refusals. */
static int64_t load_keyed(const char *dir, const ckpt_key *key, ckpt_loaded *ld) {
  tstate want;
  ts_make(&want, 0, 1, 0);
  ckpt_request reqs[TS_MAX];
  for (size_t i = 0; i + 1 < want.n; i++) { /* the empty tensor has no slice to ask for */
    reqs[i] = (ckpt_request){.t = want.t[i], .out = malloc(want.bytes[i] ? want.bytes[i] : 1)};
    newt_slice_whole(&reqs[i].slice, &want.t[i]);
  }
  newt_result_t r = ckpt_load_keyed(dir, CKPT_LATEST, 2, reqs, want.n - 1, NULL, NULL, key, ld);
  int64_t got = r == NEWT_OK ? ld->step : -1;
  if (r == NEWT_OK) { /* the tensors of the step it says */
    tstate at;
    ts_make(&at, got, 1, 0);
    for (size_t i = 0; i + 1 < want.n; i++)
      T_CHECK_MSG(memcmp(reqs[i].out, at.data[i], at.bytes[i]) == 0, "step %lld: tensor %s differs", (long long)got,
                  at.names[i]);
    ts_free(&at);
  }
  cJSON_Delete(ld->state);
  ld->state = NULL;
  for (size_t i = 0; i + 1 < want.n; i++) free(reqs[i].out);
  ts_free(&want);
  return got;
}

static void test_another_jobs_step(void) {
  char dir[512], other[512], sd[700], from[600], to[600];
  snprintf(dir, sizeof dir, "%s/mine", root);
  snprintf(other, sizeof other, "%s/theirs", root);
  ckpt_key mine, theirs;
  T_OK(ckpt_key_of_secret(&mine, (const unsigned char *)"my job secret, 32 bytes long....", 32));
  T_OK(ckpt_key_of_secret(&theirs, (const unsigned char *)"their job secret, also 32 bytes", 32));
  T_OK(save_keyed(dir, 10, &mine));
  T_OK(save_keyed(other, 20, &theirs)); /* another job's, well formed, newer: copied in */
  ckpt_step_dirname(from, sizeof from, other, 20);
  ckpt_step_dirname(to, sizeof to, dir, 20);
  T_OK(newt_fs_mkdirs(to, 0755));
  DIR *d = opendir(from);
  for (struct dirent *e; d && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char a[900], b[900];
    snprintf(a, sizeof a, "%s/%s", from, e->d_name);
    snprintf(b, sizeof b, "%s/%s", to, e->d_name);
    copy_file(a, b);
  }
  if (d) closedir(d);
  ckpt_loaded ld;
  T_CHECK_MSG(load_keyed(dir, &mine, &ld) == 10, "a load with this job's key took step %lld", (long long)ld.step);
  snprintf(sd, sizeof sd, "%s/MANIFEST", to);
  T_CHECK_MSG(ld.refused == 1 && ld.fallbacks == 1 && strstr(ld.refused_why, sd) && strstr(ld.refused_why, "another"),
              "refused %d, fallbacks %d: %s", ld.refused, ld.fallbacks, ld.refused_why);
  T_CHECK(load_keyed(dir, NULL, &ld) == 20); /* without a key: proves nothing, reads it */
  ckpt_reader *rd = NULL;
  T_ERR(NEWT_ERR_AUTH, ckpt_open_keyed(&rd, dir, 20, 1, &mine));
  T_CHECK(strstr(newt_errmsg(), sd) != NULL);
  /* written without a key (the previous release, a job without a secret): refused, until adopted */
  T_OK(save_keyed(dir, 30, NULL));
  T_CHECK(load_keyed(dir, &mine, &ld) == 10 && ld.refused == 2 && strstr(ld.refused_why, "without one"));
  ckpt_step_dirname(sd, sizeof sd, dir, 30);
  T_OK(ckpt_sign(sd, &mine));
  T_CHECK_MSG(load_keyed(dir, &mine, &ld) == 30 && ld.refused == 0, "after the sign: step %lld, %d refused",
              (long long)ld.step, ld.refused);
  /* a step of ours changed afterwards (its state, checksums made right again) is another's */
  ckpt_manifest m;
  char *text = NULL;
  size_t len = 0;
  T_OK(ckpt_manifest_load(AT_FDCWD, NULL, strcat(sd, "/MANIFEST"), 0, &m));
  cJSON_ReplaceItemInObject(m.state, "lr_step", cJSON_CreateNumber(7));
  T_OK(ckpt_manifest_encode_keyed(&m, &theirs, &text, &len));
  ckpt_manifest_free(&m);
  unlink(sd);
  put_file(sd, text ? text : "");
  free(text);
  T_CHECK(load_keyed(dir, &mine, &ld) == 10 && ld.refused == 2);
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "child") == 0 && strcmp(argv[2], "fifo") == 0) return child_fifo(argv[3]);
  if (argc == 4 && strcmp(argv[1], "child") == 0 && strcmp(argv[2], "huge") == 0) return child_huge(argv[3]);
  if (newt_proc_self_exe(self, sizeof self) != NEWT_OK) {
    fprintf(stderr, "%s\n", newt_errmsg());
    return 1;
  }
  ts_tmpdir(root, sizeof root, "/tmp", "ckpt-hostile");
  T_RUN(test_temporary_name_links);
  T_RUN(test_shard_name_link);
  T_RUN(test_step_dir_link);
  T_RUN(test_read_links);
  T_RUN(test_fifos);
  T_RUN(test_train_resume);
  T_RUN(test_huge_manifest);
  T_RUN(test_manifest_at_bound);
  T_RUN(test_another_jobs_step);
  newt_fs_rm_rf(root);
  return T_DONE();
}
