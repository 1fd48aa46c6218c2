/* Names inside a checkpoint directory (format.c has the table), scanning for steps, the
 * `latest` pointer, removing a step so that it never looks committed while half gone, and
 * `ckpt_list` behind `newt ckpt ls`.
 *
 * Anyone who can write in the checkpoint volume can plant links, FIFOs or files under the
 * names below. So everything inside DIR is reached relative to an open descriptor of DIR
 * (and of a step directory), never by a path again, through the `_at` functions of
 * common/fs.h: no link is followed, no FIFO is opened, every file is created exclusively.
 * A `step-<N>` that is not a directory is not a checkpoint: scans skip it with a warning,
 * and nothing is ever removed through it. DIR itself is the caller's path (the volume). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/internal.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/secret.h"
#include "common/strutil.h"
#include "common/sys.h"

void ckpt_step_name(char *out, size_t cap, int64_t step) { snprintf(out, cap, "step-%010lld", (long long)step); }

void ckpt_step_dirname(char *out, size_t cap, const char *dir, int64_t step) {
  snprintf(out, cap, "%s/step-%010lld", dir, (long long)step);
}

int64_t ckpt_parse_step_name(const char *name) {
  if (strncmp(name, "step-", 5) != 0 || !name[5]) return -1;
  int64_t v = 0;
  for (const char *p = name + 5; *p; p++) {
    if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10) return -1;
    v = v * 10 + (*p - '0');
  }
  return v;
}

void ckpt_shard_name(char *out, size_t cap, int rank, uint64_t attempt) {
  snprintf(out, cap, "rank-%05d-%016llx.shard", rank, (unsigned long long)attempt);
}
void ckpt_index_name(char *out, size_t cap, int rank) { snprintf(out, cap, "rank-%05d.index", rank); }
void ckpt_failed_name(char *out, size_t cap, int rank) { snprintf(out, cap, "rank-%05d.failed", rank); }

newt_result_t ckpt_dir_open(const char *dir, int *fd) {
  *fd = -1;
  if (!dir || !*dir) return NEWT_ERR(NEWT_ERR_INVALID, "checkpoint directory: empty path");
  return newt_fs_dir_open(dir, 0, fd);
}

static int step_cmp(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* 1 when the entry is a directory (a link is not). */
static int is_dir(int dirfd, const struct dirent *e, mode_t *mode) {
  struct stat st;
  if (e->d_type == DT_DIR) return 1;
  if (e->d_type != DT_UNKNOWN) {
    *mode = e->d_type == DT_LNK ? S_IFLNK : e->d_type == DT_FIFO ? S_IFIFO : S_IFREG;
    return 0;
  }
  if (fstatat(dirfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) return 0;
  *mode = st.st_mode;
  return S_ISDIR(st.st_mode);
}

newt_result_t ckpt_scan_steps(int dirfd, const char *dir, int64_t **steps, size_t *n) {
  *steps = NULL;
  *n = 0;
  int fd = dup(dirfd); /* closedir closes it; the caller keeps dirfd */
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    return NEWT_ERR(NEWT_ERR_SYS, "open directory %s: %s", dir, strerror(errno));
  }
  size_t cap = 0;
  newt_result_t r = NEWT_OK;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    int64_t s = ckpt_parse_step_name(e->d_name);
    if (s < 0) continue;
    mode_t mode = 0;
    if (!is_dir(dirfd, e, &mode)) {
      NEWT_WARN(CKPT, "%s/%s is %s, not a directory: not a checkpoint, ignored", dir, e->d_name,
                S_ISLNK(mode) ? "a symbolic link" : "another kind of file");
      continue;
    }
    r = CKPT_RESERVE(*steps, cap, *n);
    if (r != NEWT_OK) break;
    (*steps)[(*n)++] = s;
  }
  closedir(d);
  if (r != NEWT_OK) {
    free(*steps);
    *steps = NULL;
    *n = 0;
    return r;
  }
  if (*n > 1) qsort(*steps, *n, sizeof **steps, step_cmp);
  return NEWT_OK;
}

newt_result_t ckpt_step_open(int dirfd, const char *dir, int64_t step, int create, int *fd) {
  char name[64];
  ckpt_step_name(name, sizeof name, step);
  return newt_fs_subdir_at(dirfd, dir, name, create, fd);
}

int ckpt_step_committed(int dirfd, int64_t step) {
  int fd;
  if (ckpt_step_open(dirfd, NULL, step, 0, &fd) != NEWT_OK) {
    newt_err_clear();
    return 0;
  }
  int c = newt_fs_exists_at(fd, "MANIFEST");
  close(fd);
  return c;
}

newt_result_t ckpt_remove_step(int dirfd, const char *dir, int64_t step, int only_uncommitted) {
  char name[64], sd[4200];
  ckpt_step_name(name, sizeof name, step);
  snprintf(sd, sizeof sd, "%s/%s", dir, name);
  int fd;
  newt_result_t r = newt_fs_subdir_at(dirfd, dir, name, 0, &fd);
  if (r == NEWT_ERR_NOTFOUND) {
    newt_err_clear();
    return NEWT_OK;
  }
  NEWT_CHECK(r); /* not a directory: never removed through */
  if (only_uncommitted && newt_fs_exists_at(fd, "MANIFEST")) {
    close(fd);
    NEWT_DEBUG(CKPT, "%s is committed now: not removed", sd);
    return NEWT_OK;
  }
  if (unlinkat(fd, "MANIFEST", 0) == 0) r = newt_fs_fsync_fd(fd, sd);
  else if (errno != ENOENT) r = NEWT_ERR(NEWT_ERR_SYS, "remove %s/MANIFEST: %s", sd, strerror(errno));
  close(fd);
  NEWT_CHECK(r);
  NEWT_CHECK(newt_fs_rm_rf_at(dirfd, dir, name));
  return newt_fs_fsync_fd(dirfd, dir);
}

newt_result_t ckpt_write_latest(int dirfd, const char *dir, int64_t step) {
  char text[32];
  int n = snprintf(text, sizeof text, "%lld\n", (long long)step);
  return newt_fs_write_atomic_at(dirfd, dir, "latest", text, (size_t)n);
}

int64_t ckpt_latest_at(int dirfd, const char *dir) {
  char *text = NULL;
  size_t len = 0;
  if (newt_fs_read_all_at(dirfd, dir, "latest", 64, &text, &len) != NEWT_OK) {
    if (newt_errcode() != NEWT_ERR_NOTFOUND) NEWT_WARN(CKPT, "%s (ignored)", newt_errmsg());
    newt_err_clear();
    return -1;
  }
  while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == ' ')) text[--len] = '\0';
  int64_t v = -1;
  if (newt_parse_int(text, &v) != 0 || v < 0) v = -1;
  free(text);
  return v;
}

int64_t ckpt_latest_pointer(const char *dir) {
  int fd;
  if (ckpt_dir_open(dir, &fd) != NEWT_OK) {
    newt_err_clear();
    return -1;
  }
  int64_t v = ckpt_latest_at(fd, dir);
  close(fd);
  return v;
}

static uint64_t dir_bytes(int fd) {
  int dfd = dup(fd);
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (!d) {
    if (dfd >= 0) close(dfd);
    return 0;
  }
  uint64_t total = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    struct stat st;
    if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
      total += (uint64_t)st.st_size;
  }
  closedir(d);
  return total;
}

static void list_one(int dirfd, const char *dir, int64_t latest, ckpt_step_info *s) {
  char sd[4200];
  int fd;
  snprintf(s->name, sizeof s->name, "step-%010lld", (long long)s->step);
  ckpt_step_dirname(sd, sizeof sd, dir, s->step);
  s->latest = s->step == latest;
  if (ckpt_step_open(dirfd, dir, s->step, 0, &fd) != NEWT_OK) { /* replaced since the scan */
    newt_err_clear();
    return;
  }
  s->disk_bytes = dir_bytes(fd);
  s->committed = newt_fs_exists_at(fd, "MANIFEST");
  ckpt_manifest m;
  if (s->committed && ckpt_manifest_load(fd, sd, "MANIFEST", 0, &m) == NEWT_OK) {
    s->valid = 1;
    s->nranks = m.nranks;
    s->ntensors = m.ntensors;
    for (size_t f = 0; f < m.nfiles; f++) {
      s->file_bytes += m.files[f].bytes;
      s->raw_bytes += m.files[f].raw_bytes;
    }
    ckpt_manifest_free(&m);
  }
  newt_err_clear();
  close(fd);
}

newt_result_t ckpt_list(const char *dir, ckpt_step_info **out, size_t *n) {
  int64_t *steps = NULL;
  int dirfd;
  *out = NULL;
  *n = 0;
  newt_result_t r = ckpt_dir_open(dir, &dirfd);
  if (r == NEWT_ERR_NOTFOUND) { /* no directory: no checkpoints */
    newt_err_clear();
    r = NEWT_OK;
    dirfd = -1;
  }
  NEWT_CHECK(r);
  if (dirfd >= 0) r = ckpt_scan_steps(dirfd, dir, &steps, n);
  if (r == NEWT_OK && !(*out = calloc(*n ? *n : 1, sizeof **out)))
    r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory listing %s", dir);
  int64_t latest = r == NEWT_OK && dirfd >= 0 ? ckpt_latest_at(dirfd, dir) : -1;
  for (size_t i = 0; r == NEWT_OK && i < *n; i++) {
    (*out)[i].step = steps[i];
    list_one(dirfd, dir, latest, &(*out)[i]);
  }
  if (dirfd >= 0) close(dirfd);
  free(steps);
  return r;
}
