/* The job secret, its keys and the files it lives in (see secret.h). */
#include "common/secret.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/log.h"
#include "common/strutil.h"
#include "common/sys.h"

newt_result_t newt_hmac(const void *key, size_t key_len, const void *const *parts, const size_t *lens, int n,
                        unsigned char out[NEWT_MAC_BYTES]) {
  size_t total = 0;
  for (int i = 0; i < n; i++) total += lens[i];
  unsigned char *msg = malloc(total ? total : 1);
  if (!msg) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory computing a MAC of %zu bytes", total);
  size_t at = 0;
  for (int i = 0; i < n; i++) {
    if (lens[i]) memcpy(msg + at, parts[i], lens[i]);
    at += lens[i];
  }
  unsigned int outlen = NEWT_MAC_BYTES;
  unsigned char *r = HMAC(EVP_sha256(), key, (int)key_len, msg, total, out, &outlen);
  free(msg);
  if (!r || outlen != NEWT_MAC_BYTES) return NEWT_ERR(NEWT_ERR_INTERNAL, "HMAC-SHA256 failed");
  return NEWT_OK;
}

newt_result_t newt_sha256(const void *data, size_t n, unsigned char out[NEWT_MAC_BYTES]) {
  unsigned int outlen = NEWT_MAC_BYTES;
  if (EVP_Digest(data, n, out, &outlen, EVP_sha256(), NULL) != 1 || outlen != NEWT_MAC_BYTES)
    return NEWT_ERR(NEWT_ERR_INTERNAL, "SHA-256 failed");
  return NEWT_OK;
}

int newt_ct_equal(const void *a, const void *b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

/* Whether this process is in group g (its effective group or a supplementary one). */
static int in_group(gid_t g) {
  if (g == getegid()) return 1;
  gid_t groups[256];
  int n = getgroups((int)(sizeof groups / sizeof groups[0]), groups);
  for (int i = 0; i < n; i++)
    if (groups[i] == g) return 1;
  return 0;
}

newt_result_t newt_secret_check_fd(int fd, const char *what) {
  struct stat st;
  if (fstat(fd, &st) != 0) return NEWT_ERR(NEWT_ERR_SYS, "the job secret file %s: %s", what, strerror(errno));
  uid_t me = geteuid();
  if (!S_ISREG(st.st_mode)) return NEWT_ERR(NEWT_ERR_INVALID, "the job secret file %s is not a regular file", what);
  if (st.st_nlink != 1)
    return NEWT_ERR(NEWT_ERR_INVALID, "the job secret file %s has %llu links: a secret has one name, its own", what,
                    (unsigned long long)st.st_nlink);
  if (st.st_uid != me && st.st_uid != 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "the job secret file %s is owned by uid %u, not by this user (uid %u) or root: "
                    "another user could change it", what, (unsigned)st.st_uid, (unsigned)me);
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return NEWT_ERR(NEWT_ERR_INVALID, "the job secret file %s can be written by other users (mode %04o): chmod 600 it",
                    what, (unsigned)(st.st_mode & 07777));
  if ((st.st_mode & S_IROTH) || ((st.st_mode & S_IRGRP) && !in_group(st.st_gid)))
    return NEWT_ERR(NEWT_ERR_INVALID, "the job secret file %s can be read by other users (mode %04o, group %u): chmod "
                    "600 it", what, (unsigned)(st.st_mode & 07777), (unsigned)st.st_gid);
  return NEWT_OK;
}

newt_result_t newt_secret_read_fd(int fd, const char *what, unsigned char **out, size_t *len) {
  *out = NULL;
  *len = 0;
  newt_result_t r = newt_secret_check_fd(fd, what);
  unsigned char *buf = r == NEWT_OK ? malloc(NEWT_SECRET_MAX + 1) : NULL;
  if (r == NEWT_OK && !buf) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory reading %s", what);
  size_t n = 0;
  while (r == NEWT_OK && n <= NEWT_SECRET_MAX) {
    ssize_t k = pread(fd, buf + n, NEWT_SECRET_MAX + 1 - n, (off_t)n);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) r = NEWT_ERR(NEWT_ERR_SYS, "reading the job secret file %s: %s", what, strerror(errno));
    if (k <= 0) break;
    n += (size_t)k;
  }
  if (r == NEWT_OK && (n < NEWT_SECRET_MIN || n > NEWT_SECRET_MAX))
    r = NEWT_ERR(NEWT_ERR_INVALID, "the job secret file %s: a job secret has %d to %d bytes, it has %zu%s", what,
                 NEWT_SECRET_MIN, NEWT_SECRET_MAX, n, n > NEWT_SECRET_MAX ? " or more" : "");
  if (r != NEWT_OK) {
    if (buf) OPENSSL_cleanse(buf, NEWT_SECRET_MAX + 1);
    free(buf);
    return r;
  }
  *out = buf;
  *len = n;
  return NEWT_OK;
}

newt_result_t newt_secret_read(const char *path, unsigned char **out, size_t *len) {
  *out = NULL;
  *len = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return NEWT_ERR(errno == ENOENT ? NEWT_ERR_NOTFOUND : NEWT_ERR_SYS, "the job secret file %s: %s", path,
                              strerror(errno));
  newt_result_t r = newt_secret_read_fd(fd, path, out, len);
  close(fd);
  return r;
}

void newt_secret_free(unsigned char *secret, size_t len) {
  if (secret) OPENSSL_cleanse(secret, len);
  free(secret);
}

newt_result_t newt_secret_in_dir(const char *dir, int create, unsigned char **secret, size_t *len) {
  *secret = NULL;
  *len = 0;
  char path[4200];
  snprintf(path, sizeof path, "%s/job.secret", dir);
  int dirfd = -1;
  newt_result_t r = newt_fs_dir_open(dir, create, &dirfd);
  if (r != NEWT_OK) return r;
  int fd = openat(dirfd, "job.secret", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT && create) { /* made here, ours alone: never written through a planted name */
    unsigned char raw[32];
    char hex[65];
    r = newt_random_bytes(raw, sizeof raw);
    newt_hex_encode(raw, sizeof raw, hex);
    int w = r == NEWT_OK ? openat(dirfd, "job.secret", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600) : -1;
    if (r == NEWT_OK && w < 0 && errno != EEXIST) r = NEWT_ERR(NEWT_ERR_SYS, "creating %s: %s", path, strerror(errno));
    if (w >= 0) {
      r = newt_fs_write_all(w, hex, 64, path);
      if (r == NEWT_OK && fsync(w) != 0) r = NEWT_ERR(NEWT_ERR_SYS, "fsync %s: %s", path, strerror(errno));
      close(w);
      if (r == NEWT_OK) NEWT_INFO(COMMON, "%s: a new job secret for the checkpoints of %s (mode 0600)", path, dir);
    }
    memset(raw, 0, sizeof raw);
    memset(hex, 0, sizeof hex);
    if (r == NEWT_OK) fd = openat(dirfd, "job.secret", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  }
  if (r == NEWT_OK && fd < 0)
    r = errno == ENOENT ? NEWT_ERR(NEWT_ERR_NOTFOUND, "%s: no such file", path)
        : errno == ELOOP ? NEWT_ERR(NEWT_ERR_INVALID, "the job secret file %s is a symbolic link: not followed", path)
                         : NEWT_ERR(NEWT_ERR_SYS, "the job secret file %s: %s", path, strerror(errno));
  if (r == NEWT_OK) r = newt_secret_read_fd(fd, path, secret, len);
  if (fd >= 0) close(fd);
  close(dirfd);
  return r;
}

/* One directory above the one newt writes into: its owner is this user or root, and nobody
 * else may write it unless it is sticky. */
static newt_result_t check_above(const char *path, const char *what, const char *dir) {
  struct stat st;
  if (lstat(path, &st) != 0) return NEWT_ERR(NEWT_ERR_SYS, "%s %s: %s: %s", what, dir, path, strerror(errno));
  uid_t me = geteuid();
  if (st.st_uid != me && st.st_uid != 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s %s: the directory %s above it is owned by uid %u, who could replace it; "
                    "give a directory of your own", what, dir, path, (unsigned)st.st_uid);
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s %s: the directory %s above it can be written by other users (mode %04o, "
                    "not sticky), who could replace it; give a directory of your own", what, dir, path,
                    (unsigned)(st.st_mode & 07777));
  return NEWT_OK;
}

newt_result_t newt_dir_trusted(const char *path, const char *what, int *out) {
  *out = -1;
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    struct stat ls;
    if ((errno == ELOOP || errno == ENOTDIR) && lstat(path, &ls) == 0 && S_ISLNK(ls.st_mode))
      return NEWT_ERR(NEWT_ERR_INVALID, "%s %s is a symbolic link: give the directory itself", what, path);
    return NEWT_ERR(errno == ENOENT ? NEWT_ERR_NOTFOUND : NEWT_ERR_INVALID, "%s %s: %s", what, path, strerror(errno));
  }
  struct stat st;
  uid_t me = geteuid();
  newt_result_t r = NEWT_OK;
  if (fstat(fd, &st) != 0) r = NEWT_ERR(NEWT_ERR_SYS, "%s %s: %s", what, path, strerror(errno));
  else if (st.st_uid != me)
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s %s is owned by uid %u, not by this user (uid %u): its owner could put links "
                 "where newt writes; give a directory of your own", what, path, (unsigned)st.st_uid, (unsigned)me);
  else if (st.st_mode & (S_IWGRP | S_IWOTH))
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s %s can be written by other users (mode %04o): they could put links where newt "
                 "writes; chmod go-w it or give another directory", what, path, (unsigned)(st.st_mode & 07777));
  /* the directories above it, from the root down (as the kernel resolved them) */
  char *real = r == NEWT_OK ? realpath(path, NULL) : NULL;
  if (r == NEWT_OK && !real) r = NEWT_ERR(NEWT_ERR_SYS, "%s %s: %s", what, path, strerror(errno));
  if (r == NEWT_OK) r = check_above("/", what, path);
  for (size_t i = 1; r == NEWT_OK && real[i]; i++) {
    if (real[i] != '/') continue;
    real[i] = '\0';
    r = check_above(real, what, path);
    real[i] = '/';
  }
  free(real);
  if (r != NEWT_OK) {
    close(fd);
    return r;
  }
  *out = fd;
  return NEWT_OK;
}
