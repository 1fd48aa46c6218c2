/* The record of a `newt run` job for `newt status` (runfile.h): its directory, written and
 * read by this user alone. */
#include "launch/runfile.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/json.h"
#include "common/secret.h"

#define RUNFILE_MAX (64 << 10)

/* The directory's path, and its descriptor once made and checked. */
static newt_result_t open_dir(char *path, size_t cap, int *fd) {
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  if (xdg && xdg[0] == '/') snprintf(path, cap, "%s/newt", xdg);
  else snprintf(path, cap, "/tmp/newt-%u", (unsigned)geteuid());
  if (mkdir(path, 0700) != 0 && errno != EEXIST)
    return NEWT_ERR(NEWT_ERR_SYS, "newt run's records: mkdir %s: %s", path, strerror(errno));
  NEWT_CHECK(newt_dir_trusted(path, "newt run's records directory", fd));
  struct stat st;
  if (fstat(*fd, &st) != 0 || (st.st_mode & 077)) {
    close(*fd);
    *fd = -1;
    return NEWT_ERR(NEWT_ERR_AUTH, "newt run's records directory %s can be read by other users (mode %04o): chmod 700 "
                    "it", path, (unsigned)(st.st_mode & 07777));
  }
  return NEWT_OK;
}

newt_result_t runfile_dir(char *out, size_t cap) {
  int fd;
  NEWT_CHECK(open_dir(out, cap, &fd));
  close(fd);
  return NEWT_OK;
}

static char *to_json(const runfile *rf) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  cJSON_AddStringToObject(j, "job", rf->job);
  newt_json_add_int(j, "pid", rf->pid);
  newt_json_add_int(j, "t_start_ms", (int64_t)rf->t_start_ms);
  cJSON_AddBoolToObject(j, "private_etcd", rf->private_etcd);
  cJSON_AddStringToObject(j, "etcd", rf->etcd);
  cJSON_AddStringToObject(j, "user", rf->user);
  cJSON_AddStringToObject(j, "password_file", rf->password_file);
  cJSON_AddStringToObject(j, "ca", rf->ca);
  cJSON_AddStringToObject(j, "cert", rf->cert);
  cJSON_AddStringToObject(j, "key", rf->key);
  cJSON_AddStringToObject(j, "log_dir", rf->log_dir);
  if (rf->ended) {
    cJSON *e = cJSON_AddObjectToObject(j, "ended");
    cJSON_AddStringToObject(e, "outcome", rf->outcome);
    cJSON_AddStringToObject(e, "reason", rf->reason);
    newt_json_add_int(e, "steps", rf->steps);
    cJSON_AddNumberToObject(e, "loss", rf->loss);
    newt_json_add_int(e, "t_ms", (int64_t)rf->t_end_ms);
  }
  char *text = newt_json_print(j);
  cJSON_Delete(j);
  return text;
}

static newt_result_t from_json(const char *text, size_t len, const char *what, runfile *rf) {
  cJSON *j = NULL;
  memset(rf, 0, sizeof *rf);
  NEWT_CHECK(newt_json_parse(text, len, what, &j));
  int64_t pid = 0, t0 = 0;
  int priv = 0;
  const cJSON *e = NULL;
  newt_result_t r = newt_json_get_strcpy(j, what, "job", 1, rf->job, sizeof rf->job);
  if (r == NEWT_OK) r = newt_json_get_int(j, what, "pid", 1, &pid);
  if (r == NEWT_OK) r = newt_json_get_int(j, what, "t_start_ms", 1, &t0);
  if (r == NEWT_OK) r = newt_json_get_bool(j, what, "private_etcd", 1, &priv);
  if (r == NEWT_OK) r = newt_json_get_strcpy(j, what, "etcd", 1, rf->etcd, sizeof rf->etcd);
  if (r == NEWT_OK) r = newt_json_get_strcpy(j, what, "user", 0, rf->user, sizeof rf->user);
  if (r == NEWT_OK) r = newt_json_get_strcpy(j, what, "password_file", 0, rf->password_file, sizeof rf->password_file);
  if (r == NEWT_OK) r = newt_json_get_strcpy(j, what, "ca", 0, rf->ca, sizeof rf->ca);
  if (r == NEWT_OK) r = newt_json_get_strcpy(j, what, "cert", 0, rf->cert, sizeof rf->cert);
  if (r == NEWT_OK) r = newt_json_get_strcpy(j, what, "key", 0, rf->key, sizeof rf->key);
  if (r == NEWT_OK) r = newt_json_get_strcpy(j, what, "log_dir", 0, rf->log_dir, sizeof rf->log_dir);
  if (r == NEWT_OK) r = newt_json_get_obj(j, what, "ended", 0, &e);
  if (r == NEWT_OK && e) {
    int64_t steps = 0, t1 = 0;
    rf->ended = 1;
    r = newt_json_get_strcpy(e, what, "outcome", 1, rf->outcome, sizeof rf->outcome);
    if (r == NEWT_OK) r = newt_json_get_strcpy(e, what, "reason", 0, rf->reason, sizeof rf->reason);
    if (r == NEWT_OK) r = newt_json_get_int(e, what, "steps", 0, &steps);
    if (r == NEWT_OK) r = newt_json_get_double(e, what, "loss", 0, &rf->loss);
    if (r == NEWT_OK) r = newt_json_get_int(e, what, "t_ms", 0, &t1);
    rf->steps = steps;
    rf->t_end_ms = (uint64_t)t1;
  }
  cJSON_Delete(j);
  rf->pid = pid;
  rf->t_start_ms = (uint64_t)t0;
  rf->private_etcd = priv;
  if (r == NEWT_OK && (pid <= 0 || !rf->etcd[0])) r = NEWT_ERR(NEWT_ERR_CORRUPT, "%s: no pid or no etcd", what);
  return r;
}

newt_result_t runfile_write(const runfile *rf) {
  char dir[600], name[RDZV_NAME_MAX + 8], tmp[RDZV_NAME_MAX + 40];
  NEWT_CHECK(newt_check_name("job name", rf->job));
  int dfd;
  NEWT_CHECK(open_dir(dir, sizeof dir, &dfd));
  snprintf(name, sizeof name, "%s.run", rf->job);
  snprintf(tmp, sizeof tmp, ".%s.run.%ld", rf->job, (long)getpid());
  char *text = to_json(rf);
  newt_result_t r = text ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  unlinkat(dfd, tmp, 0);
  int fd = r == NEWT_OK ? openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600) : -1;
  if (r == NEWT_OK && fd < 0) r = NEWT_ERR(NEWT_ERR_SYS, "creating %s/%s: %s", dir, tmp, strerror(errno));
  if (r == NEWT_OK) r = newt_fs_write_all(fd, text, strlen(text), tmp);
  if (fd >= 0) close(fd);
  if (r == NEWT_OK && renameat(dfd, tmp, dfd, name) != 0)
    r = NEWT_ERR(NEWT_ERR_SYS, "renaming %s/%s: %s", dir, tmp, strerror(errno));
  if (r != NEWT_OK) unlinkat(dfd, tmp, 0);
  free(text);
  close(dfd);
  return r;
}

newt_result_t runfile_read(const char *job, runfile *rf, char *path, size_t cap) {
  char dir[600], name[RDZV_NAME_MAX + 8], where[700];
  NEWT_CHECK(newt_check_name("--job", job));
  int dfd;
  NEWT_CHECK(open_dir(dir, sizeof dir, &dfd));
  snprintf(name, sizeof name, "%s.run", job);
  snprintf(where, sizeof where, "%s/%s", dir, name);
  if (path) snprintf(path, cap, "%s", where);
  int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  int err = errno;
  close(dfd);
  if (fd < 0 && err == ENOENT) return NEWT_ERR(NEWT_ERR_NOTFOUND, "no newt run of job %s is recorded in %s", job, dir);
  if (fd < 0)
    return NEWT_ERR(NEWT_ERR_AUTH, "newt run's record %s: %s%s", where, strerror(err),
                    err == ELOOP ? " (a link: not trusted; remove it)" : "");
  struct stat st;
  newt_result_t r = NEWT_OK;
  if (fstat(fd, &st) != 0) r = NEWT_ERR(NEWT_ERR_SYS, "newt run's record %s: %s", where, strerror(errno));
  else if (!S_ISREG(st.st_mode)) r = NEWT_ERR(NEWT_ERR_AUTH, "newt run's record %s is not a regular file", where);
  else if (st.st_uid != geteuid())
    r = NEWT_ERR(NEWT_ERR_AUTH, "newt run's record %s is owned by uid %u, not by this user (uid %u): not trusted; "
                 "remove it", where, (unsigned)st.st_uid, (unsigned)geteuid());
  else if (st.st_mode & 077)
    r = NEWT_ERR(NEWT_ERR_AUTH, "newt run's record %s can be read or written by other users (mode %04o): not "
                 "trusted; remove it", where, (unsigned)(st.st_mode & 07777));
  else if (st.st_size > RUNFILE_MAX)
    r = NEWT_ERR(NEWT_ERR_CORRUPT, "newt run's record %s: %lld bytes, more than a record holds", where,
                 (long long)st.st_size);
  char *text = NULL;
  size_t len = 0;
  if (r == NEWT_OK) {
    text = malloc(RUNFILE_MAX + 1);
    ssize_t n = text ? read(fd, text, RUNFILE_MAX) : -1;
    if (n < 0) r = NEWT_ERR(NEWT_ERR_SYS, "reading %s: %s", where, text ? strerror(errno) : "out of memory");
    else len = (size_t)n;
  }
  close(fd);
  if (r == NEWT_OK) r = from_json(text, len, where, rf);
  free(text);
  return r;
}

newt_result_t runfile_end(const runfile *rf) {
  runfile now;
  newt_result_t r = runfile_read(rf->job, &now, NULL, 0);
  if (r == NEWT_OK && (now.pid != rf->pid || now.t_start_ms != rf->t_start_ms)) return NEWT_OK; /* a newer run's */
  if (r != NEWT_OK && r != NEWT_ERR_NOTFOUND) return r;
  return runfile_write(rf);
}

int runfile_over(const runfile *rf) {
  return rf->ended || (kill((pid_t)rf->pid, 0) != 0 && errno == ESRCH);
}
