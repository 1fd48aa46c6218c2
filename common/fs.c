/* Durable file helpers (see fs.h). */
#include "fs.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static newt_result_t sys_err(const char *op, const char *path) {
  int e = errno;
  if (e == ENOSPC || e == EDQUOT)
    return NEWT_ERR(NEWT_ERR_NOSPACE, "%s %s: %s", op, path, strerror(e));
  if (e == ENOENT) return NEWT_ERR(NEWT_ERR_NOTFOUND, "%s %s: %s", op, path, strerror(e));
  return NEWT_ERR(NEWT_ERR_SYS, "%s %s: %s", op, path, strerror(e));
}

newt_result_t newt_fs_mkdirs(const char *path, unsigned mode) {
  char buf[4096];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
    return NEWT_ERR(NEWT_ERR_INVALID, "path too long: %.64s...", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, mode) != 0 && errno != EEXIST) return sys_err("mkdir", buf);
    *p = '/';
  }
  if (mkdir(buf, mode) != 0 && errno != EEXIST) return sys_err("mkdir", buf);
  return NEWT_OK;
}

void newt_fs_dirname(const char *path, char *out, size_t cap) {
  const char *slash = strrchr(path, '/');
  if (!slash) {
    snprintf(out, cap, ".");
  } else if (slash == path) {
    snprintf(out, cap, "/");
  } else {
    snprintf(out, cap, "%.*s", (int)(slash - path), path);
  }
}

newt_result_t newt_fs_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return sys_err("open directory", dir);
  if (fsync(fd) != 0 && errno != EINVAL) {
    newt_result_t r = sys_err("fsync directory", dir);
    close(fd);
    return r;
  }
  close(fd);
  return NEWT_OK;
}

newt_result_t newt_fs_write_all(int fd, const void *buf, size_t len, const char *path) {
  const char *p = buf;
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0) {
      if (errno == EINTR) continue;
      return sys_err("write", path);
    }
    if (w == 0) {
      errno = ENOSPC;
      return sys_err("write", path);
    }
    p += w;
    len -= (size_t)w;
  }
  return NEWT_OK;
}

newt_result_t newt_fs_write_atomic(const char *path, const void *data, size_t len) {
  char tmp[4200], dir[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  newt_fs_dirname(path, dir, sizeof dir);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return sys_err("create", tmp);
  newt_result_t r = newt_fs_write_all(fd, data, len, tmp);
  if (r == NEWT_OK && fsync(fd) != 0) r = sys_err("fsync", tmp);
  if (close(fd) != 0 && r == NEWT_OK) r = sys_err("close", tmp);
  if (r == NEWT_OK && rename(tmp, path) != 0) r = sys_err("rename to", path);
  if (r != NEWT_OK) {
    unlink(tmp);
    return r;
  }
  return newt_fs_fsync_dir(dir);
}

newt_result_t newt_fs_read_all(const char *path, size_t max, char **out, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return sys_err("open", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    newt_result_t r = sys_err("stat", path);
    close(fd);
    return r;
  }
  if ((size_t)st.st_size > max) {
    close(fd);
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: %lld bytes, more than the %zu allowed", path,
                    (long long)st.st_size, max);
  }
  size_t cap = (size_t)st.st_size + 1, n = 0;
  char *buf = malloc(cap);
  if (!buf) {
    close(fd);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory reading %s", path);
  }
  for (;;) {
    if (n + 1 >= cap) { /* the file grew while reading */
      if (cap > max) break;
      char *nb = realloc(buf, cap * 2);
      if (!nb) break;
      buf = nb;
      cap *= 2;
    }
    ssize_t r = read(fd, buf + n, cap - n - 1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      newt_result_t res = sys_err("read", path);
      free(buf);
      close(fd);
      return res;
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  close(fd);
  buf[n] = '\0';
  *out = buf;
  if (len) *len = n;
  return NEWT_OK;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb; (void)flag; (void)ftw;
  return remove(p) != 0 && errno != ENOENT ? -1 : 0;
}

newt_result_t newt_fs_rm_rf(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return errno == ENOENT ? NEWT_OK : sys_err("stat", path);
  if (nftw(path, rm_one, 32, FTW_DEPTH | FTW_PHYS) != 0) return sys_err("remove", path);
  return NEWT_OK;
}

int newt_fs_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}
