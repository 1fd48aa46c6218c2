/* Names inside a checkpoint directory (format.c has the table), scanning for steps, the
 * `latest` pointer, removing a step so that it never looks committed while half gone, and
 * `ckpt_list` behind `newt ckpt ls`. */
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
#include "common/strutil.h"

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

static int step_cmp(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

newt_result_t ckpt_scan_steps(const char *dir, int64_t **steps, size_t *n) {
  *steps = NULL;
  *n = 0;
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return NEWT_OK;
    return NEWT_ERR(NEWT_ERR_SYS, "open directory %s: %s", dir, strerror(errno));
  }
  size_t cap = 0;
  newt_result_t r = NEWT_OK;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    int64_t s = ckpt_parse_step_name(e->d_name);
    if (s < 0) continue;
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

newt_result_t ckpt_remove_step(const char *dir, int64_t step) {
  char sd[4096], mf[4200];
  ckpt_step_dirname(sd, sizeof sd, dir, step);
  snprintf(mf, sizeof mf, "%s/MANIFEST", sd);
  if (unlink(mf) == 0) NEWT_CHECK(newt_fs_fsync_dir(sd));
  else if (errno != ENOENT) return NEWT_ERR(NEWT_ERR_SYS, "remove %s: %s", mf, strerror(errno));
  NEWT_CHECK(newt_fs_rm_rf(sd));
  return newt_fs_fsync_dir(dir);
}

newt_result_t ckpt_write_latest(const char *dir, int64_t step) {
  char path[4200], text[32];
  snprintf(path, sizeof path, "%s/latest", dir);
  int n = snprintf(text, sizeof text, "%lld\n", (long long)step);
  return newt_fs_write_atomic(path, text, (size_t)n);
}

int64_t ckpt_latest_pointer(const char *dir) {
  char path[4200], *text = NULL;
  size_t len = 0;
  snprintf(path, sizeof path, "%s/latest", dir);
  if (newt_fs_read_all(path, 64, &text, &len) != NEWT_OK) {
    newt_err_clear();
    return -1;
  }
  while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == ' ')) text[--len] = '\0';
  int64_t v = -1;
  if (newt_parse_int(text, &v) != 0 || v < 0) v = -1;
  free(text);
  return v;
}

static uint64_t dir_bytes(const char *path) {
  DIR *d = opendir(path);
  if (!d) return 0;
  uint64_t total = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
      total += (uint64_t)st.st_size;
  }
  closedir(d);
  return total;
}

newt_result_t ckpt_list(const char *dir, ckpt_step_info **out, size_t *n) {
  int64_t *steps = NULL;
  NEWT_CHECK(ckpt_scan_steps(dir, &steps, n));
  *out = calloc(*n ? *n : 1, sizeof **out);
  if (!*out) {
    free(steps);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory listing %s", dir);
  }
  int64_t latest = ckpt_latest_pointer(dir);
  for (size_t i = 0; i < *n; i++) {
    ckpt_step_info *s = &(*out)[i];
    char sd[4096], mf[4200];
    s->step = steps[i];
    snprintf(s->name, sizeof s->name, "step-%010lld", (long long)steps[i]);
    ckpt_step_dirname(sd, sizeof sd, dir, steps[i]);
    snprintf(mf, sizeof mf, "%s/MANIFEST", sd);
    s->disk_bytes = dir_bytes(sd);
    s->latest = steps[i] == latest;
    s->committed = newt_fs_exists(mf);
    if (!s->committed) continue;
    ckpt_manifest m;
    if (ckpt_manifest_load(mf, mf, 0, &m) != NEWT_OK) {
      newt_err_clear();
      continue;
    }
    s->valid = 1;
    s->nranks = m.nranks;
    s->ntensors = m.ntensors;
    for (size_t f = 0; f < m.nfiles; f++) {
      s->file_bytes += m.files[f].bytes;
      s->raw_bytes += m.files[f].raw_bytes;
    }
    ckpt_manifest_free(&m);
  }
  free(steps);
  return NEWT_OK;
}
