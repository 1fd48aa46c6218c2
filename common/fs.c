/* Durable file helpers (see fs.h). The `_at` functions never follow a link in the name
 * they are given and never open anything but a regular file or a directory: every open
 * there carries O_NOFOLLOW, reads also O_NONBLOCK (a FIFO cannot block the open) and an
 * fstat check before the first read, creations O_CREAT|O_EXCL. */
#include "fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "strutil.h"

#define WHAT_CAP 4400 /* a path for messages: a directory's path and a name in it */
#define RM_MAX_DEPTH 64

static newt_result_t sys_err(const char *op, const char *path) {
  int e = errno;
  if (e == ENOSPC || e == EDQUOT)
    return NEWT_ERR(NEWT_ERR_NOSPACE, "%s %s: %s", op, path, strerror(e));
  if (e == ENOENT) return NEWT_ERR(NEWT_ERR_NOTFOUND, "%s %s: %s", op, path, strerror(e));
  return NEWT_ERR(NEWT_ERR_SYS, "%s %s: %s", op, path, strerror(e));
}

/* "dir/name" (or name alone) for messages. */
static void what_of(char *out, const char *dir, const char *name) {
  int n = dir ? snprintf(out, WHAT_CAP, "%s/%s", dir, name) : snprintf(out, WHAT_CAP, "%s", name);
  if (n >= WHAT_CAP) memcpy(out + WHAT_CAP - 4, "...", 4); /* messages only */
}

static const char *kind_of(mode_t m) {
  if (S_ISLNK(m)) return "symbolic link";
  if (S_ISFIFO(m)) return "FIFO";
  if (S_ISSOCK(m)) return "socket";
  if (S_ISDIR(m)) return "directory";
  if (S_ISCHR(m) || S_ISBLK(m)) return "device";
  if (S_ISREG(m)) return "regular file";
  return "special file";
}

static newt_result_t wrong_kind(const char *what, mode_t m, const char *want) {
  if (S_ISLNK(m))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s is a symbolic link, not a %s: newt does not follow links here", what, want);
  return NEWT_ERR(NEWT_ERR_INVALID, "%s is a %s, not a %s", what, kind_of(m), want);
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

newt_result_t newt_fs_fsync_fd(int fd, const char *what) {
  if (fsync(fd) != 0 && errno != EINVAL) return sys_err("fsync directory", what);
  return NEWT_OK;
}

newt_result_t newt_fs_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return sys_err("open directory", dir);
  newt_result_t r = newt_fs_fsync_fd(fd, dir);
  close(fd);
  return r;
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
  char dir[4096];
  newt_fs_dirname(path, dir, sizeof dir);
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  if (!*base) return NEWT_ERR(NEWT_ERR_INVALID, "write %s: not a file name", path);
  int fd;
  NEWT_CHECK(newt_fs_dir_open(dir, 0, &fd));
  newt_result_t r = newt_fs_write_atomic_at(fd, dir, base, data, len);
  close(fd);
  return r;
}

/* Reads fd to its end into a malloc'd, NUL-terminated buffer: at most max bytes (one more
 * is an error), starting with room for `hint`. */
static newt_result_t read_fd(int fd, const char *what, size_t max, uint64_t hint, char **out, size_t *len) {
  size_t cap = (hint < max ? (size_t)hint : max) + 1, n = 0;
  char *buf = malloc(cap);
  if (!buf) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory reading %s", what);
  newt_result_t r = NEWT_OK;
  for (;;) {
    if (n + 1 == cap && cap <= max) { /* it grew (or has no size, a pipe): more room */
      size_t nc = cap > max / 2 ? max + 1 : cap * 2;
      char *nb = realloc(buf, nc);
      if (!nb) {
        r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory reading %s", what);
        break;
      }
      buf = nb;
      cap = nc;
    }
    char probe; /* with max bytes read, one more byte says the file is too long */
    int full = n + 1 == cap;
    ssize_t got = read(fd, full ? &probe : buf + n, full ? 1 : cap - n - 1);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      r = sys_err("read", what);
      break;
    }
    if (got == 0) break;
    if (full) {
      r = NEWT_ERR(NEWT_ERR_INVALID, "%s: more than the %zu bytes allowed", what, max);
      break;
    }
    n += (size_t)got;
  }
  if (r != NEWT_OK) {
    free(buf);
    return r;
  }
  buf[n] = '\0';
  *out = buf;
  if (len) *len = n;
  return NEWT_OK;
}

static newt_result_t too_big(const char *what, off_t size, size_t max) {
  return NEWT_ERR(NEWT_ERR_INVALID, "%s: %lld bytes, more than the %zu allowed", what, (long long)size, max);
}

newt_result_t newt_fs_read_all(const char *path, size_t max, char **out, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return sys_err("open", path);
  struct stat st;
  newt_result_t r = NEWT_OK;
  if (fstat(fd, &st) != 0) r = sys_err("stat", path);
  else if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > max) r = too_big(path, st.st_size, max);
  else r = read_fd(fd, path, max, S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0, out, len);
  close(fd);
  return r;
}

static int rm_tree(int parent, const char *what, const char *name, int depth, newt_result_t *r);

newt_result_t newt_fs_rm_rf(const char *path) { return newt_fs_rm_rf_at(AT_FDCWD, NULL, path); }

int newt_fs_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* ---- inside a directory others may write ------------------------------------------------ */

newt_result_t newt_fs_dir_open(const char *path, int create, int *fd) {
  if (create) NEWT_CHECK(newt_fs_mkdirs(path, 0755));
  *fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (*fd < 0) return sys_err("open directory", path);
  return NEWT_OK;
}

newt_result_t newt_fs_subdir_at(int dirfd, const char *dir, const char *name, int create, int *fd) {
  char what[WHAT_CAP];
  what_of(what, dir, name);
  for (int tries = 0;; tries++) {
    if (create && mkdirat(dirfd, name, 0755) != 0 && errno != EEXIST) return sys_err("mkdir", what);
    *fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (*fd >= 0) return NEWT_OK;
    if (errno != ELOOP && errno != ENOTDIR) return sys_err("open directory", what);
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT && tries < 2) continue; /* gone meanwhile */
      return sys_err("stat", what);
    }
    if (!create || tries >= 2) return wrong_kind(what, st.st_mode, "directory");
    NEWT_WARN(COMMON, "%s is a %s, not a directory: removing it (the entry itself) to make the directory", what,
              kind_of(st.st_mode));
    if (unlinkat(dirfd, name, 0) != 0 && errno != ENOENT) return sys_err("remove", what);
  }
}

newt_result_t newt_fs_open_read_at(int dirfd, const char *dir, const char *name, int *fd, uint64_t *size) {
  char what[WHAT_CAP];
  what_of(what, dir, name);
  struct stat st;
  /* Checked before the open too: a device or a FIFO is never opened at all. */
  if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return sys_err("open", what);
  if (!S_ISREG(st.st_mode)) return wrong_kind(what, st.st_mode, "regular file");
  *fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (*fd < 0) return errno == ELOOP ? wrong_kind(what, S_IFLNK, "regular file") : sys_err("open", what);
  newt_result_t r = NEWT_OK;
  int fl;
  if (fstat(*fd, &st) != 0) r = sys_err("stat", what);
  else if (!S_ISREG(st.st_mode)) r = wrong_kind(what, st.st_mode, "regular file"); /* swapped meanwhile */
  else if ((fl = fcntl(*fd, F_GETFL)) == -1 || fcntl(*fd, F_SETFL, fl & ~O_NONBLOCK) != 0) r = sys_err("fcntl", what);
  if (r != NEWT_OK) {
    close(*fd);
    *fd = -1;
    return r;
  }
  if (size) *size = (uint64_t)st.st_size;
  return NEWT_OK;
}

newt_result_t newt_fs_read_all_at(int dirfd, const char *dir, const char *name, size_t max, char **out,
                                  size_t *len) {
  int fd;
  uint64_t size;
  NEWT_CHECK(newt_fs_open_read_at(dirfd, dir, name, &fd, &size));
  char what[WHAT_CAP];
  what_of(what, dir, name);
  newt_result_t r = size > max ? too_big(what, (off_t)size, max) : read_fd(fd, what, max, size, out, len);
  close(fd);
  return r;
}

newt_result_t newt_fs_create_at(int dirfd, const char *dir, const char *name, int flags, int *fd) {
  char what[WHAT_CAP];
  what_of(what, dir, name);
  for (int tries = 0;; tries++) {
    *fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | flags, 0644);
    if (*fd >= 0) return NEWT_OK;
    if (errno != EEXIST || tries >= 3) return sys_err("create", what);
    /* a stale file of a killed writer, or something planted: the entry itself goes */
    if (unlinkat(dirfd, name, 0) != 0 && errno != ENOENT) return sys_err("remove", what);
  }
}

newt_result_t newt_fs_write_atomic_at(int dirfd, const char *dir, const char *name, const void *data,
                                      size_t len) {
  char tmp[WHAT_CAP], what[WHAT_CAP], tmp_what[WHAT_CAP];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", name, (int)getpid()) >= (int)sizeof tmp)
    return NEWT_ERR(NEWT_ERR_INVALID, "write %.64s...: name too long", name);
  what_of(what, dir, name);
  what_of(tmp_what, dir, tmp);
  int fd;
  NEWT_CHECK(newt_fs_create_at(dirfd, dir, tmp, 0, &fd));
  newt_result_t r = newt_fs_write_all(fd, data, len, tmp_what);
  if (r == NEWT_OK && fsync(fd) != 0) r = sys_err("fsync", tmp_what);
  if (close(fd) != 0 && r == NEWT_OK) r = sys_err("close", tmp_what);
  if (r == NEWT_OK && renameat(dirfd, tmp, dirfd, name) != 0) r = sys_err("rename to", what);
  if (r != NEWT_OK) {
    unlinkat(dirfd, tmp, 0);
    return r;
  }
  return newt_fs_fsync_fd(dirfd, dir ? dir : what);
}

/* Removes `name` in dirfd (a directory: its contents first, opened with O_NOFOLLOW).
 * Returns 0, or -1 with *r set. */
static int rm_tree(int parent, const char *what, const char *name, int depth, newt_result_t *r) {
  if (unlinkat(parent, name, 0) == 0 || errno == ENOENT) return 0;
  if (errno != EISDIR && errno != EPERM) {
    *r = sys_err("remove", what);
    return -1;
  }
  if (depth >= RM_MAX_DEPTH) {
    *r = NEWT_ERR(NEWT_ERR_INVALID, "remove %s: directories nested more than %d deep", what, RM_MAX_DEPTH);
    return -1;
  }
  int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    *r = sys_err("open directory", what);
    if (fd >= 0) close(fd);
    return -1;
  }
  int rc = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char *sub = newt_asprintf("%s/%s", what, e->d_name);
    if (!sub) {
      *r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory removing %s", what);
      rc = -1;
      break;
    }
    rc = rm_tree(dirfd(d), sub, e->d_name, depth + 1, r);
    free(sub);
  }
  closedir(d);
  if (rc == 0 && unlinkat(parent, name, AT_REMOVEDIR) != 0 && errno != ENOENT) {
    *r = sys_err("remove", what);
    rc = -1;
  }
  return rc;
}

newt_result_t newt_fs_rm_rf_at(int dirfd, const char *dir, const char *name) {
  char what[WHAT_CAP];
  what_of(what, dir, name);
  newt_result_t r = NEWT_OK;
  rm_tree(dirfd, what, name, 0, &r);
  return r;
}

int newt_fs_exists_at(int dirfd, const char *name) {
  struct stat st;
  return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
}
