/* Real faults against real files and processes:
 *   - a writer killed with SIGKILL in the middle of a save, and in the middle of its
 *     commit: the previous checkpoint loads, and the next save of that step succeeds;
 *   - one flipped byte in a shard (data, chunk header, shard header) and a truncated
 *     shard: the error names the file and chunk, the loader falls back to the previous
 *     checkpoint, `newt ckpt verify` exits non-zero;
 *   - a truncated, empty or malformed manifest: rejected clearly, the loader falls back;
 *   - a manifest whose files point outside its directory, by name or by symbolic link:
 *     rejected;
 *   - a full disk (a small tmpfs this test mounts): the save fails with NEWT_ERR_NOSPACE,
 *     synchronously and in the background, nothing earlier is touched, later saves work.
 * The writers that get killed and the full-disk run are this binary re-executed
 * ("child ..."), so their test knobs come from a fresh environment. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/internal.h"
#include "ckpt_util.h"
#include "common/proc.h"

static char root[256], self[4096];

/* ---- child modes ------------------------------------------------------------------------ */

/* child save DIR STEP SCALE NOISE CHUNK ASYNC: one rank saves the state of STEP. */
static int child_save(char **argv) {
  const char *dir = argv[0];
  int64_t step = atoll(argv[1]), scale = atoll(argv[2]);
  int noise = atoi(argv[3]), async = atoi(argv[5]);
  ckpt_saver_opts o = {.dir = dir, .rank = 0, .nranks = 1, .threads = 2, .chunk_bytes = (size_t)atoll(argv[4]),
                       .commit = 1, .keep = 10};
  ckpt_saver *sv;
  tstate s;
  ts_make(&s, step, scale, noise);
  int started;
  newt_result_t r = ckpt_saver_init(&sv, &o);
  if (r == NEWT_OK) r = ckpt_save_begin(sv, step, async, &started);
  if (r == NEWT_OK) r = ts_save_into(sv, &s, step);
  if (r == NEWT_OK && async) r = ckpt_save_wait(sv, NEWT_DEADLINE_NONE);
  if (r != NEWT_OK) fprintf(stderr, "child save: %s\n", newt_errmsg());
  return r == NEWT_OK ? 0 : 1;
}

static pid_t spawn_child(const char *const *args, const char *env) {
  const char *argv[16] = {self, "child"};
  int n = 2;
  for (const char *const *a = args; *a && n < 15; a++) argv[n++] = *a;
  argv[n] = NULL;
  const char *envv[2] = {env, NULL};
  newt_spawn_opts so = {.env = env ? envv : NULL, .die_with_parent = 1};
  pid_t pid = -1;
  T_OK(newt_proc_spawn(argv, &so, &pid));
  return pid;
}

/* ---- helpers ------------------------------------------------------------------------------ */

/* Waits until a file in dir/step-<step> matches the suffix (and, for .shard, holds at
 * least min bytes); returns 1 when seen. */
static int wait_for_file(const char *dir, int64_t step, const char *suffix, off_t min, int64_t timeout_ms) {
  char sd[400];
  ckpt_step_dirname(sd, sizeof sd, dir, step);
  newt_deadline_t d = newt_deadline_in_ms(timeout_ms);
  while (!newt_deadline_passed(d)) {
    DIR *dd = opendir(sd);
    struct dirent *e;
    while (dd && (e = readdir(dd)) != NULL) {
      size_t l = strlen(e->d_name), sl = strlen(suffix);
      if (l < sl || strcmp(e->d_name + l - sl, suffix) != 0) continue;
      struct stat st;
      char p[700];
      snprintf(p, sizeof p, "%s/%s", sd, e->d_name);
      if (stat(p, &st) == 0 && st.st_size >= min) {
        closedir(dd);
        return 1;
      }
    }
    if (dd) closedir(dd);
    newt_sleep_ms(5);
  }
  return 0;
}

static int manifest_exists(const char *dir, int64_t step) {
  char p[500];
  ckpt_step_dirname(p, sizeof p, dir, step);
  strncat(p, "/MANIFEST", sizeof p - strlen(p) - 1);
  return newt_fs_exists(p);
}

/* Path of the shard file and the chunk j of tensor `name` in a committed step. */
static int find_chunk(const char *dir, int64_t step, const char *name, size_t j, char *shard, size_t cap,
                      ckpt_chunk *out) {
  char sd[400], mf[500];
  ckpt_step_dirname(sd, sizeof sd, dir, step);
  snprintf(mf, sizeof mf, "%s/MANIFEST", sd);
  ckpt_manifest m;
  if (ckpt_manifest_load(AT_FDCWD, NULL, mf, 0, &m) != NEWT_OK) return 0;
  const ckpt_tensor *t = ckpt_manifest_find(&m, name);
  int ok = t && j < t->nchunks;
  if (ok) {
    *out = t->chunks[j];
    snprintf(shard, cap, "%s/%s", sd, m.files[out->file].name);
  }
  ckpt_manifest_free(&m);
  return ok;
}

static void flip_byte(const char *path, off_t off) {
  FILE *f = fopen(path, "r+b");
  T_CHECK(f != NULL);
  if (!f) return;
  fseeko(f, off, SEEK_SET);
  int c = fgetc(f);
  fseeko(f, off, SEEK_SET);
  fputc(c ^ 0x20, f);
  fclose(f);
}

static uint64_t file_hash(const char *path) {
  char *text = NULL;
  size_t len = 0;
  if (newt_fs_read_all(path, (size_t)1 << 30, &text, &len) != NEWT_OK) return 0;
  uint64_t h = ckpt_hash(text, len);
  free(text);
  return h;
}

static void rewrite_manifest(const char *dir, int64_t step, const char *from, const char *to) {
  char sd[400], mf[500];
  ckpt_step_dirname(sd, sizeof sd, dir, step);
  snprintf(mf, sizeof mf, "%s/MANIFEST", sd);
  char *text = NULL;
  size_t len = 0;
  T_OK(newt_fs_read_all(mf, (size_t)1 << 30, &text, &len));
  char *body = strchr(text, '\n') + 1, *at = strstr(body, from);
  T_CHECK_MSG(at != NULL, "\"%s\" not in the manifest", from);
  if (!at) {
    free(text);
    return;
  }
  size_t bl = strlen(body) - strlen(from) + strlen(to);
  char *nb = malloc(bl + 1);
  if (!nb) abort();
  sprintf(nb, "%.*s%s%s", (int)(at - body), body, to, at + strlen(from));
  size_t ol;
  char *out = ts_frame(nb, &ol);
  T_OK(newt_fs_write_atomic(mf, out, ol));
  free(out);
  free(nb);
  free(text);
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_kill_mid_save(void) {
  char dir[300];
  snprintf(dir, sizeof dir, "%s/kill", root);
  T_OK(ts_save(dir, 1, 16, 1, 4096));
  /* step 2, asynchronously, slowed to 20 ms a chunk: killed once part of its shard is out */
  const char *args[] = {"save", dir, "2", "16", "1", "4096", "1", NULL};
  pid_t pid = spawn_child(args, "NEWT_CKPT_TEST_CHUNK_DELAY_MS=20");
  T_CHECK_MSG(wait_for_file(dir, 2, ".shard", 64 << 10, 60000), "the child never wrote 64 KiB of its shard");
  kill(pid, SIGKILL);
  int st = 0;
  T_OK(newt_proc_wait(pid, 10000, &st));
  T_CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the child finished before it was killed");
  T_CHECK(!manifest_exists(dir, 2));
  T_CHECK(ckpt_latest_pointer(dir) == 1);
  int fb = -1;
  ts_load_check(dir, CKPT_LATEST, 1, 16, 1, &fb);
  T_CHECK(fb == 0); /* an uncommitted step is not even a fallback */

  /* killed during the commit: its index is out, the manifest is not */
  const char *args3[] = {"save", dir, "3", "16", "1", "1048576", "0", NULL};
  pid = spawn_child(args3, "NEWT_CKPT_TEST_COMMIT_DELAY_MS=30000");
  T_CHECK_MSG(wait_for_file(dir, 3, ".index", 1, 60000), "the child never published its index");
  kill(pid, SIGKILL);
  T_OK(newt_proc_wait(pid, 10000, &st));
  T_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  T_CHECK(!manifest_exists(dir, 3));
  ts_load_check(dir, CKPT_LATEST, 1, 16, 1, NULL);

  /* the restarted run saves step 2 again (another attempt), over the leftovers */
  T_OK(ts_save(dir, 2, 16, 1, 4096));
  ts_load_check(dir, CKPT_LATEST, 2, 16, 1, NULL);
  ckpt_step_info *info;
  size_t n;
  T_OK(ckpt_list(dir, &info, &n));
  T_CHECK(n == 3 && info[0].valid && info[1].valid && info[1].latest && !info[2].committed);
  /* step 2's leftover partial shard of the killed attempt was cleaned at its commit */
  if (n == 3) T_CHECK_MSG(info[1].disk_bytes < info[1].file_bytes + 65536, "%llu bytes on disk for %llu in the shard",
                          (unsigned long long)info[1].disk_bytes, (unsigned long long)info[1].file_bytes);
  free(info);
  /* and committing step 4 prunes the abandoned step 3 */
  T_OK(ts_save(dir, 4, 16, 1, 4096));
  char sd[400];
  ckpt_step_dirname(sd, sizeof sd, dir, 3);
  T_CHECK(!newt_fs_exists(sd));
}

static void test_flipped_byte(void) {
  char dir[300], shard[600], out[8192], cmd[700];
  snprintf(dir, sizeof dir, "%s/flip", root);
  T_OK(ts_save(dir, 1, 4, 0, 4096));
  T_OK(ts_save(dir, 2, 4, 0, 4096));
  ckpt_chunk c;
  T_CHECK(find_chunk(dir, 2, "wte", 1, shard, sizeof shard, &c));
  T_CHECK(c.codec == CKPT_CODEC_ZSTD);
  flip_byte(shard, (off_t)(c.offset + CKPT_CHUNK_HDR + c.stored / 2));

  ckpt_reader *r;
  T_OK(ckpt_open(&r, dir, 2, 2));
  newt_tensor_desc d;
  T_OK(ckpt_reader_find(r, "wte", &d));
  float *buf = malloc(97 * 4 * 16 * sizeof *buf);
  T_ERR(NEWT_ERR_CORRUPT, ckpt_read_slice(r, &d, NULL, buf));
  const char *base = strrchr(shard, '/') + 1;
  T_CHECK_MSG(strstr(newt_errmsg(), base) && strstr(newt_errmsg(), "chunk 1 of tensor \"wte\"") &&
                  strstr(newt_errmsg(), "checksum mismatch"), "message: %s", newt_errmsg());
  /* what does not overlap the damaged chunk still reads: only overlapping chunks are read */
  newt_slice head;
  newt_slice_whole(&head, &d);
  head.end = 1024; /* chunk 0 holds elements [0, 1024) */
  T_OK(ckpt_read_slice(r, &d, &head, buf));
  T_OK(ckpt_reader_find(r, "adam.m/wte", &d));
  T_OK(ckpt_read_slice(r, &d, NULL, buf));
  ckpt_close(r);
  free(buf);

  int fb = 0;
  ts_load_check(dir, CKPT_LATEST, 1, 4, 0, &fb);
  T_CHECK(fb == 1);

  ckpt_verify_result vr;
  char sd[400];
  ckpt_step_dirname(sd, sizeof sd, dir, 2);
  T_ERR(NEWT_ERR_CORRUPT, ckpt_verify(sd, NULL, NULL, &vr));
  T_CHECK(vr.bad == 1 && vr.files == 1 && vr.chunks > 10);
  snprintf(cmd, sizeof cmd, "ckpt verify %s", sd);
  int rc = ts_run_newt(cmd, out, sizeof out);
  T_CHECK_MSG(rc == 1 && strstr(out, "FAIL") && strstr(out, base) && strstr(out, "chunk 1 of tensor \"wte\""),
              "newt %s: exit %d, output:\n%s", cmd, rc, out);
  snprintf(cmd, sizeof cmd, "ckpt verify %s/1", dir);
  rc = ts_run_newt(cmd, out, sizeof out);
  T_CHECK_MSG(rc == 0 && strstr(out, "ok"), "newt %s: exit %d, output:\n%s", cmd, rc, out);

  /* the byte restored, then the damage elsewhere: the chunk header, the shard header */
  flip_byte(shard, (off_t)(c.offset + CKPT_CHUNK_HDR + c.stored / 2));
  T_OK(ckpt_verify(sd, NULL, NULL, &vr));
  flip_byte(shard, (off_t)(c.offset + 12));
  T_ERR(NEWT_ERR_CORRUPT, ckpt_verify(sd, NULL, NULL, &vr));
  T_CHECK(strstr(newt_errmsg(), "1 problem") != NULL);
  T_OK(ckpt_open(&r, dir, 2, 1));
  T_OK(ckpt_reader_find(r, "wte", &d)); /* d.name points into the reader */
  buf = malloc(97 * 4 * 16 * sizeof *buf);
  T_ERR(NEWT_ERR_CORRUPT, ckpt_read_slice(r, &d, NULL, buf));
  T_CHECK_MSG(strstr(newt_errmsg(), "chunk 1 of tensor \"wte\"") && strstr(newt_errmsg(), "chunk header checksum"),
              "message: %s", newt_errmsg());
  ckpt_close(r);
  flip_byte(shard, (off_t)(c.offset + 12));
  flip_byte(shard, 20);
  T_OK(ckpt_open(&r, dir, 2, 1));
  T_OK(ckpt_reader_find(r, "wte", &d));
  T_ERR(NEWT_ERR_CORRUPT, ckpt_read_slice(r, &d, NULL, buf));
  T_CHECK_MSG(strstr(newt_errmsg(), "shard header checksum mismatch") != NULL, "message: %s", newt_errmsg());
  ckpt_close(r);
  flip_byte(shard, 20);
  T_OK(ckpt_verify(sd, NULL, NULL, &vr));
  /* a truncated shard */
  struct stat st;
  T_CHECK(stat(shard, &st) == 0);
  T_CHECK(truncate(shard, st.st_size - 1) == 0);
  T_OK(ckpt_open(&r, dir, 2, 1));
  T_OK(ckpt_reader_find(r, "wte", &d));
  T_ERR(NEWT_ERR_CORRUPT, ckpt_read_slice(r, &d, NULL, buf));
  T_CHECK_MSG(strstr(newt_errmsg(), base) && strstr(newt_errmsg(), "truncated"), "message: %s", newt_errmsg());
  ckpt_close(r);
  free(buf);
  ts_load_check(dir, CKPT_LATEST, 1, 4, 0, NULL);
}

static void test_bad_manifest(void) {
  char dir[300], sd[400], mf[500], out[8192], cmd[700];
  snprintf(dir, sizeof dir, "%s/manifest", root);
  T_OK(ts_save(dir, 1, 1, 0, 4096));
  T_OK(ts_save(dir, 2, 1, 0, 4096));
  ckpt_step_dirname(sd, sizeof sd, dir, 2);
  snprintf(mf, sizeof mf, "%s/MANIFEST", sd);
  char *text = NULL;
  size_t len = 0;
  T_OK(newt_fs_read_all(mf, 1 << 26, &text, &len));
  ckpt_reader *r = NULL;

  /* truncated: half of it */
  T_OK(newt_fs_write_atomic(mf, text, len / 2));
  T_ERR(NEWT_ERR_CORRUPT, ckpt_open(&r, dir, 2, 1));
  T_CHECK_MSG(strstr(newt_errmsg(), "MANIFEST: truncated") != NULL, "message: %s", newt_errmsg());
  int fb = 0;
  ts_load_check(dir, CKPT_LATEST, 1, 1, 0, &fb);
  T_CHECK(fb == 1);
  T_OK(ckpt_open(&r, dir, CKPT_LATEST, 1)); /* the newest valid one */
  T_CHECK(ckpt_reader_step(r) == 1);
  ckpt_close(r);
  snprintf(cmd, sizeof cmd, "ckpt ls %s", dir);
  int rc = ts_run_newt(cmd, out, sizeof out);
  T_CHECK_MSG(rc == 0 && strstr(out, "step-0000000002  corrupt") && strstr(out, "step-0000000001  committed"),
              "newt %s:\n%s", cmd, out);
  snprintf(cmd, sizeof cmd, "ckpt verify %s", sd);
  rc = ts_run_newt(cmd, out, sizeof out);
  T_CHECK_MSG(rc == 1 && strstr(out, "truncated"), "newt %s: exit %d\n%s", cmd, rc, out);

  /* empty */
  T_OK(newt_fs_write_atomic(mf, "", 0));
  T_ERR(NEWT_ERR_CORRUPT, ckpt_open(&r, dir, 2, 1));
  T_CHECK(strstr(newt_errmsg(), "no header line") != NULL);

  /* well framed, but a field is wrong: named in the message */
  T_OK(newt_fs_write_atomic(mf, text, len));
  T_OK(ckpt_open(&r, dir, 2, 1));
  ckpt_close(r);
  rewrite_manifest(dir, 2, "\"nranks\":1", "\"nranks\":\"one\"");
  T_ERR(NEWT_ERR_INVALID, ckpt_open(&r, dir, 2, 1));
  T_CHECK_MSG(strstr(newt_errmsg(), "MANIFEST.nranks: expected an integer, got \"one\"") != NULL, "message: %s",
              newt_errmsg());
  snprintf(cmd, sizeof cmd, "ckpt inspect %s", sd);
  rc = ts_run_newt(cmd, out, sizeof out);
  T_CHECK_MSG(rc == 1 && strstr(out, "MANIFEST.nranks"), "newt %s: exit %d\n%s", cmd, rc, out);
  T_OK(newt_fs_write_atomic(mf, text, len));
  rewrite_manifest(dir, 2, "\"dtype\":\"f32\"", "\"dtype\":\"float\"");
  T_ERR(NEWT_ERR_INVALID, ckpt_open(&r, dir, 2, 1));
  T_CHECK_MSG(strstr(newt_errmsg(), ".dtype: unknown dtype \"float\"") != NULL, "message: %s", newt_errmsg());
  ts_load_check(dir, CKPT_LATEST, 1, 1, 0, NULL);
  free(text);
}

static void test_paths_outside(void) {
  char dir[300], sd[400], shard[600], outside[600];
  snprintf(dir, sizeof dir, "%s/paths", root);
  T_OK(ts_save(dir, 1, 1, 0, 4096));
  T_OK(ts_save(dir, 2, 1, 0, 4096));
  ckpt_step_dirname(sd, sizeof sd, dir, 2);
  ckpt_chunk c;
  T_CHECK(find_chunk(dir, 2, "wte", 0, shard, sizeof shard, &c));
  const char *base = strrchr(shard, '/') + 1;
  char mf[500], *text = NULL;
  size_t len;
  snprintf(mf, sizeof mf, "%s/MANIFEST", sd);
  T_OK(newt_fs_read_all(mf, 1 << 26, &text, &len));
  ckpt_reader *r = NULL;
  char to[700];
  snprintf(to, sizeof to, "../step-0000000001/%s", base);
  rewrite_manifest(dir, 2, base, to);
  T_ERR(NEWT_ERR_INVALID, ckpt_open(&r, dir, 2, 1));
  T_CHECK_MSG(strstr(newt_errmsg(), "MANIFEST.files[0].name") && strstr(newt_errmsg(), "not a plain file name"),
              "message: %s", newt_errmsg());
  T_OK(newt_fs_write_atomic(mf, text, len));
  rewrite_manifest(dir, 2, base, "/etc/passwd");
  T_ERR(NEWT_ERR_INVALID, ckpt_open(&r, dir, 2, 1));
  T_CHECK(strstr(newt_errmsg(), "MANIFEST.files[0].name") != NULL);
  T_OK(newt_fs_write_atomic(mf, text, len));
  free(text);
  /* a symbolic link in place of the shard, to a copy outside the checkpoint */
  snprintf(outside, sizeof outside, "%s/outside.shard", root);
  T_CHECK(rename(shard, outside) == 0);
  T_CHECK(symlink(outside, shard) == 0);
  T_OK(ckpt_open(&r, dir, 2, 1));
  newt_tensor_desc d;
  T_OK(ckpt_reader_find(r, "wte", &d));
  float buf[97 * 16];
  T_ERR(NEWT_ERR_INVALID, ckpt_read_slice(r, &d, NULL, buf));
  T_CHECK_MSG(strstr(newt_errmsg(), "is a symbolic link") != NULL, "message: %s", newt_errmsg());
  ckpt_close(r);
  int fb = 0;
  ts_load_check(dir, CKPT_LATEST, 1, 1, 0, &fb);
  T_CHECK(fb == 1);
  ckpt_verify_result vr;
  T_ERR(NEWT_ERR_CORRUPT, ckpt_verify(sd, NULL, NULL, &vr));
}

/* The parent mounts a small tmpfs, a child process runs the saves on it, and the parent
 * unmounts whatever happened to the child. */
static void test_full_disk(void) {
  char mnt[300];
  snprintf(mnt, sizeof mnt, "%s/tmpfs", root);
  if (!ts_mount_tmpfs(mnt, "2m")) return;
  const char *args[] = {"fulldisk", mnt, NULL};
  pid_t pid = spawn_child(args, NULL);
  int st = 0;
  if (pid > 0) {
    newt_result_t r = newt_proc_wait(pid, 120000, &st);
    if (r != NEWT_OK) newt_proc_stop(pid, 100);
    T_CHECK_MSG(r == NEWT_OK && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the full-disk child failed (see above)");
  }
  ts_umount(mnt);
}

static void full_disk_body(const char *mnt) {
  char dir[400], sd[500], shard1[700];
  snprintf(dir, sizeof dir, "%s/ck", mnt);
  T_OK(ts_save(dir, 1, 1, 1, 16384));
  ckpt_chunk c;
  T_CHECK(find_chunk(dir, 1, "wte", 0, shard1, sizeof shard1, &c));
  uint64_t before = file_hash(shard1);
  /* about 2.8 MB of noise on a 2 MB disk */
  newt_result_t r = ts_save(dir, 2, 128, 1, 65536);
  T_CHECK_MSG(r == NEWT_ERR_NOSPACE, "save on a full disk: %s: %s", newt_result_name(r), newt_errmsg());
  T_CHECK_MSG(strstr(newt_errmsg(), "No space left on device") && strstr(newt_errmsg(), "step-0000000002"),
              "message: %s", newt_errmsg());
  ckpt_step_dirname(sd, sizeof sd, dir, 2);
  T_CHECK(!manifest_exists(dir, 2));
  T_CHECK(ckpt_latest_pointer(dir) == 1);
  T_CHECK(file_hash(shard1) == before);
  ts_load_check(dir, CKPT_LATEST, 1, 1, 1, NULL);

  /* in the background: reported through the status, the caller goes on */
  ckpt_saver_opts o = {.dir = dir, .rank = 0, .nranks = 1, .commit = 1, .keep = 10, .chunk_bytes = 65536};
  tstate s;
  ckpt_saver *sv = ts_begin(&o, &s, 3, 128, 1, 1);
  T_OK(ts_save_into(sv, &s, 3));
  T_ERR(NEWT_ERR_NOSPACE, ckpt_save_wait(sv, newt_deadline_in_ms(60000)));
  ckpt_save_status st;
  ckpt_saver_status(sv, &st);
  T_CHECK(st.state == CKPT_SAVE_FAILED && st.result == NEWT_ERR_NOSPACE && st.step == 3 && st.last_ok_step == -1);
  T_CHECK_MSG(strstr(st.message, "No space left on device") != NULL, "status message: %s", st.message);
  ts_free(&s);
  /* the failed saves removed their partial shards: a small save fits again */
  ts_make(&s, 4, 1, 1);
  int started;
  T_OK(ckpt_save_begin(sv, 4, 1, &started));
  T_OK(ts_save_into(sv, &s, 4));
  T_OK(ckpt_save_wait(sv, newt_deadline_in_ms(60000)));
  ckpt_saver_status(sv, &st);
  T_CHECK(st.state == CKPT_SAVE_DONE && st.last_ok_step == 4 && st.saves_failed == 1);
  ts_free(&s);
  ckpt_saver_free(sv);
  ts_load_check(dir, CKPT_LATEST, 4, 1, 1, NULL);
  ts_load_check(dir, 3, 1, 1, 1, NULL);
  T_CHECK(file_hash(shard1) == before);
}

#define T_RUN_ARG(fn, arg)                                                         \
  do {                                                                             \
    t_cur_name = #fn;                                                              \
    t_cur_failed = 0;                                                              \
    fn(arg);                                                                       \
    fprintf(stderr, "%s %s\n", t_cur_failed ? "FAILED" : "ok    ", #fn);           \
    if (t_cur_failed) t_failed++;                                                  \
    else t_passed++;                                                               \
  } while (0)

int main(int argc, char **argv) {
  if (argc >= 3 && strcmp(argv[1], "child") == 0) {
    if (strcmp(argv[2], "save") == 0 && argc == 9) return child_save(argv + 3);
    if (strcmp(argv[2], "fulldisk") == 0 && argc == 4) {
      T_RUN_ARG(full_disk_body, argv[3]);
      return T_DONE();
    }
    fprintf(stderr, "unknown child mode\n");
    return 2;
  }
  if (newt_proc_self_exe(self, sizeof self) != NEWT_OK) {
    fprintf(stderr, "%s\n", newt_errmsg());
    return 1;
  }
  ts_tmpdir(root, sizeof root, "/tmp", "ckpt-faults");
  T_RUN(test_kill_mid_save);
  T_RUN(test_flipped_byte);
  T_RUN(test_bad_manifest);
  T_RUN(test_paths_outside);
  T_RUN(test_full_disk);
  newt_fs_rm_rf(root);
  return T_DONE();
}
