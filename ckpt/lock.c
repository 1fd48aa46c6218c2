/* One writer per checkpoint directory: DIR/LOCK.
 *
 * Two writers in one directory destroy each other's checkpoints: the clean-up of one's commit
 * and its pruning remove what the other writes, and their shard names (rank, attempt) may
 * collide. So a directory has one *writer* at a time. A writer is a group of processes that
 * agree on its name: every rank of one newt job (the worker names it "job <name>"), one
 * process (a one-rank saver by default: `newt train`), or the ranks of one save attempt (a
 * saver of several ranks by default). Each process of the group that saves holds a shared
 * flock(2) on DIR/LOCK for as long as its saver lives; the file names the group, with the pid,
 * host, command and time of the process that took it first. Another writer is refused while
 * any process of the holder's group is alive, with those details in the message.
 *
 * Taking it (the file is opened once per process, see below):
 *   1. LOCK_EX|LOCK_NB succeeds: nobody holds it (what the file says is stale, of a writer
 *      that has exited): write this writer into it, then convert to LOCK_SH. flock's
 *      conversion is not atomic (another process may take LOCK_EX in between and write its
 *      own name), so the content is read again below like anyone else's;
 *   2. else LOCK_SH|LOCK_NB succeeds: the file names the writer holding it: this one (join)
 *      or another (refused);
 *   3. else someone holds LOCK_EX for the moment it writes the file: poll, up to 10 s.
 * The content is written only under LOCK_EX and read only under LOCK_SH: never half written.
 *
 * Locks go with their process (kill -9 included): a LOCK file left behind blocks nobody, and
 * is never removed (removing a lock file that others hold open would break the exclusion).
 * A process keeps one descriptor per lock file (a table with reference counts): flock locks
 * belong to the open file, so savers of one process share it, and on NFS, where Linux
 * emulates flock with POSIX locks that belong to the process and all vanish when any of its
 * descriptors of the file is closed, no second descriptor is ever opened and closed.
 *
 * The directory may be written by others (docs/ckpt.md, "A directory others can write"): a
 * symbolic link, FIFO or other special file planted under the name LOCK is removed itself and
 * a regular file made; a regular file with more than one link (perhaps a hard link to a file
 * elsewhere) is never written through: taking the lock fails, naming it.
 *
 * Holding the lock needs write access to the file (issue 37, item 8). flock(2) takes any
 * descriptor, a read-only one too, so whoever can open the file can keep every writer out;
 * and a read lock of fcntl(2) blocks a write lock as well. So nobody may open it who may not
 * write it: it is made mode 0600, and a lock file of an older release (0644: read by anyone)
 * is made so too -- chmod at once, and, when nobody holds it, replaced by a new file (a
 * descriptor opened before the chmod would otherwise keep its power). Whoever takes the lock
 * checks afterwards that the name still leads to the file it locked, and starts over if not. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/internal.h"
#include "common/fs.h"
#include "common/json.h"
#include "common/log.h"
#include "common/strutil.h"
#include "common/sys.h"

#define LOCK_NAME "LOCK"
#define LOCK_MAX_TEXT 4096 /* bytes of DIR/LOCK read */
#define LOCK_EX_WAIT_MS 10000

struct ckpt_lock {
  dev_t dev;
  ino_t ino;
  int fd;
  int refs;
  char *writer;
  struct ckpt_lock *next;
};

static pthread_mutex_t locks_mu = PTHREAD_MUTEX_INITIALIZER;
static ckpt_lock *locks; /* held by this process, under locks_mu */

void ckpt_writer_default(char *out, size_t cap, int nranks, uint64_t attempt) {
  if (nranks <= 1) snprintf(out, cap, "process %d on %s", (int)getpid(), newt_hostname());
  else snprintf(out, cap, "attempt %016llx of %d ranks", (unsigned long long)attempt, nranks);
}

/* This process's command line, arguments joined by spaces (for the holder's description). */
static void own_command(char *out, size_t cap) {
  out[0] = '\0';
  int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t n = read(fd, out, cap - 1);
  close(fd);
  if (n <= 0) {
    out[0] = '\0';
    return;
  }
  while (n > 0 && out[n - 1] == '\0') n--;
  for (ssize_t i = 0; i < n; i++)
    if (out[i] == '\0' || (unsigned char)out[i] < 0x20) out[i] = ' ';
  out[n] = '\0';
}

/* The read permissions of mode given to a class (group, others) that may not write: who could
 * hold the lock without the right to write it. */
static mode_t read_only_bits(mode_t mode) {
  mode_t r = 0;
  if ((mode & S_IRGRP) && !(mode & S_IWGRP)) r |= S_IRGRP;
  if ((mode & S_IROTH) && !(mode & S_IWOTH)) r |= S_IROTH;
  return r;
}

/* DIR/LOCK opened for reading and writing, a regular file of one link (made when missing, mode
 * 0600; anything else under the name is removed itself, a directory or a hard link refused).
 * *readable: the file could be opened by someone who may not write it (an older release's
 * 0644): its mode is made tight here, and take() replaces it when nobody holds it. */
static newt_result_t open_lock_file(int dirfd, const char *dir, int *fd, struct stat *st, int *readable) {
  *readable = 0;
  for (int tries = 0;; tries++) {
    if (fstatat(dirfd, LOCK_NAME, st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st->st_mode)) {
      if (S_ISDIR(st->st_mode) || tries >= 3)
        return NEWT_ERR(NEWT_ERR_INVALID, "%s/%s is a %s, not a regular file: the writer's lock cannot be taken",
                        dir, LOCK_NAME, S_ISDIR(st->st_mode) ? "directory" : "special file");
      NEWT_WARN(CKPT, "%s/%s is not a regular file: removing it (the entry itself) to make the lock file", dir,
                LOCK_NAME);
      if (unlinkat(dirfd, LOCK_NAME, 0) != 0 && errno != ENOENT)
        return NEWT_ERR(NEWT_ERR_SYS, "remove %s/%s: %s", dir, LOCK_NAME, strerror(errno));
      continue;
    }
    *fd = openat(dirfd, LOCK_NAME, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (*fd < 0) {
      if ((errno == ELOOP || errno == ENXIO || errno == EISDIR) && tries < 3) continue; /* swapped meanwhile */
      return NEWT_ERR(errno == ENOSPC ? NEWT_ERR_NOSPACE : NEWT_ERR_SYS, "open %s/%s: %s", dir, LOCK_NAME,
                      strerror(errno));
    }
    if (fstat(*fd, st) != 0) {
      newt_result_t r = NEWT_ERR(NEWT_ERR_SYS, "stat %s/%s: %s", dir, LOCK_NAME, strerror(errno));
      close(*fd);
      return r;
    }
    if (!S_ISREG(st->st_mode) && tries < 3) { /* swapped between the check and the open */
      close(*fd);
      continue;
    }
    if (!S_ISREG(st->st_mode) || st->st_nlink != 1) {
      close(*fd);
      return NEWT_ERR(NEWT_ERR_INVALID, "%s/%s has %llu links (another name for a file elsewhere?): not written "
                      "through, the writer's lock cannot be taken; remove it", dir, LOCK_NAME,
                      (unsigned long long)st->st_nlink);
    }
    mode_t ro = read_only_bits(st->st_mode);
    if (ro) {
      *readable = 1;
      mode_t tight = st->st_mode & 07666 & ~ro;
      if (fchmod(*fd, tight) != 0)
        NEWT_WARN(CKPT, "%s/%s is mode %04o (uid %d): whoever may read it can keep every writer out, and its mode "
                  "cannot be changed here (%s); make it %04o", dir, LOCK_NAME, (unsigned)(st->st_mode & 07777),
                  (int)st->st_uid, strerror(errno), (unsigned)tight);
    }
    return NEWT_OK;
  }
}

/* What DIR/LOCK says (read under a lock): its writer into `writer` (empty when unreadable),
 * a description of the holder for messages into `who`. */
static void read_holder(int fd, char *writer, size_t wcap, char *who, size_t cap) {
  char text[LOCK_MAX_TEXT + 1];
  ssize_t n = pread(fd, text, LOCK_MAX_TEXT, 0);
  writer[0] = '\0';
  snprintf(who, cap, "unknown (the lock file is empty or unreadable)");
  if (n <= 0) return;
  text[n] = '\0';
  cJSON *j = cJSON_ParseWithLength(text, (size_t)n);
  const cJSON *w = cJSON_GetObjectItemCaseSensitive(j, "writer");
  if (!cJSON_IsString(w)) {
    snprintf(who, cap, "unknown (the lock file holds \"%.80s\")", text);
    cJSON_Delete(j);
    return;
  }
  snprintf(writer, wcap, "%s", w->valuestring);
  const cJSON *pid = cJSON_GetObjectItemCaseSensitive(j, "pid");
  const cJSON *host = cJSON_GetObjectItemCaseSensitive(j, "host");
  const cJSON *since = cJSON_GetObjectItemCaseSensitive(j, "since_ms");
  const cJSON *cmd = cJSON_GetObjectItemCaseSensitive(j, "cmd");
  char when[64] = "?";
  if (cJSON_IsNumber(since) && since->valuedouble >= 0) {
    time_t t = (time_t)(since->valuedouble / 1000);
    struct tm tm;
    if (gmtime_r(&t, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
  }
  snprintf(who, cap, "writer \"%.200s\", taken by pid %lld on host %.100s since %s (command: %.300s)", writer,
           cJSON_IsNumber(pid) ? (long long)pid->valuedouble : -1LL,
           cJSON_IsString(host) ? host->valuestring : "?", when, cJSON_IsString(cmd) ? cmd->valuestring : "?");
  cJSON_Delete(j);
}

/* Writes this writer into DIR/LOCK (under LOCK_EX: the shorter, the better; a process
 * stopped in between keeps everyone out until it goes on or dies). */
static newt_result_t write_holder(int fd, const char *dir, const char *writer) {
  char cmd[512];
  own_command(cmd, sizeof cmd);
  cJSON *j = cJSON_CreateObject();
  NEWT_CHECK_ALLOC(j);
  cJSON_AddStringToObject(j, "writer", writer);
  newt_json_add_int(j, "pid", (int64_t)getpid());
  cJSON_AddStringToObject(j, "host", newt_hostname());
  newt_json_add_int(j, "since_ms", (int64_t)newt_wall_ms());
  cJSON_AddStringToObject(j, "cmd", cmd);
  char *text = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  NEWT_CHECK_ALLOC(text);
  size_t len = strlen(text);
  newt_result_t r = NEWT_OK;
  char what[4200];
  snprintf(what, sizeof what, "%s/%s", dir, LOCK_NAME);
  if (ftruncate(fd, 0) != 0) r = NEWT_ERR(NEWT_ERR_SYS, "truncate %s: %s", what, strerror(errno));
  for (size_t off = 0; r == NEWT_OK && off < len;) {
    ssize_t n = pwrite(fd, text + off, len - off, (off_t)off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      r = NEWT_ERR(errno == ENOSPC || errno == EDQUOT ? NEWT_ERR_NOSPACE : NEWT_ERR_SYS, "write %s: %s", what,
                   strerror(errno));
    else off += (size_t)n;
  }
  free(text); /* not fsync'd: it matters only while its processes live, and LOCK_EX is held briefly */
  return r;
}

static newt_result_t refused(const char *dir, const char *who) {
  return NEWT_ERR(NEWT_ERR_CONFLICT, "checkpoint directory %s has another writer: %s. One writer per directory "
                  "(%s/%s): stop that one or give this one another directory; the lock goes when every process "
                  "of that writer has exited", dir, who, dir, LOCK_NAME);
}

/* A new DIR/LOCK in place of the one fd holds exclusively (nobody else holds it): mode
 * `mode`, under a temporary name first, then renamed over it. */
static newt_result_t replace_lock_file(int dirfd, const char *dir, mode_t mode) {
  char tmp[64];
  snprintf(tmp, sizeof tmp, "%s.%d.new", LOCK_NAME, (int)getpid());
  unlinkat(dirfd, tmp, 0);
  int fd = openat(dirfd, tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return NEWT_ERR(NEWT_ERR_SYS, "create %s/%s: %s", dir, tmp, strerror(errno));
  int ok = fchmod(fd, mode) == 0;
  close(fd);
  if (!ok || renameat(dirfd, tmp, dirfd, LOCK_NAME) != 0) {
    newt_result_t r = NEWT_ERR(NEWT_ERR_SYS, "replace %s/%s: %s", dir, LOCK_NAME, strerror(errno));
    unlinkat(dirfd, tmp, 0);
    return r;
  }
  NEWT_INFO(CKPT, "%s/%s could be read by those who may not write it: replaced by a file of mode %04o", dir, LOCK_NAME,
            (unsigned)mode);
  return NEWT_OK;
}

/* Whether DIR/LOCK still names the file fd has open (a writer may have replaced it). */
static int still_named(int dirfd, int fd) {
  struct stat a, b;
  return fstat(fd, &a) == 0 && fstatat(dirfd, LOCK_NAME, &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

/* Takes the flock on a new descriptor of DIR/LOCK for `writer` (steps 1 to 3 above). *again:
 * the lock was not taken because the file under the name changed (replaced here or by
 * another writer): open it again and start over. */
static newt_result_t take(int fd, int dirfd, const char *dir, const char *writer, int readable, int *again) {
  newt_deadline_t deadline = newt_deadline_in_ms(LOCK_EX_WAIT_MS);
  int64_t sleep_us = 200;
  char held[512], who[1200];
  *again = 0;
  for (;;) {
    int shared = 0;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
      if (!still_named(dirfd, fd)) { /* replaced since it was opened */
        flock(fd, LOCK_UN);
        *again = 1;
        return NEWT_OK;
      }
      struct stat st;
      if (readable && fstat(fd, &st) == 0) { /* nobody holds it: a new file, which nobody has open */
        if (replace_lock_file(dirfd, dir, st.st_mode & 07666 & ~read_only_bits(st.st_mode)) == NEWT_OK) {
          flock(fd, LOCK_UN);
          *again = 1;
          return NEWT_OK;
        }
        NEWT_WARN(CKPT, "%s: the lock file is kept as it is", newt_errmsg());
        readable = 0;
      }
      newt_result_t r = write_holder(fd, dir, writer);
      if (r != NEWT_OK) {
        flock(fd, LOCK_UN);
        return r;
      }
      shared = flock(fd, LOCK_SH | LOCK_NB) == 0;
    } else if (errno == EWOULDBLOCK || errno == EINTR) {
      shared = flock(fd, LOCK_SH | LOCK_NB) == 0;
    } else {
      return NEWT_ERR(NEWT_ERR_SYS, "flock %s/%s: %s", dir, LOCK_NAME, strerror(errno));
    }
    if (shared) {
      if (!still_named(dirfd, fd)) { /* a file replaced since it was opened: its lock keeps nobody out */
        flock(fd, LOCK_UN);
        *again = 1;
        return NEWT_OK;
      }
      read_holder(fd, held, sizeof held, who, sizeof who);
      if (strcmp(held, writer) == 0) return NEWT_OK;
      flock(fd, LOCK_UN);
      return refused(dir, who);
    }
    if (newt_deadline_passed(deadline)) {
      read_holder(fd, held, sizeof held, who, sizeof who); /* may be half written: a hint */
      return NEWT_ERR(NEWT_ERR_CONFLICT, "checkpoint directory %s: %s/%s has been held exclusively for %d s (a "
                      "writer stopped while taking it?); it says: %s", dir, dir, LOCK_NAME, LOCK_EX_WAIT_MS / 1000,
                      who);
    }
    newt_sleep_us(sleep_us);
    if (sleep_us < 20000) sleep_us *= 2;
  }
}

newt_result_t ckpt_lock_take(const char *dir, const char *writer, ckpt_lock **out) {
  *out = NULL;
  if (!writer || !*writer || strlen(writer) > 400)
    return NEWT_ERR(NEWT_ERR_INVALID, "checkpoint writer: a name of 1 to 400 bytes, got \"%.40s\"", writer ? writer : "");
  int dirfd;
  NEWT_CHECK(newt_fs_dir_open(dir, 1, &dirfd));
  pthread_mutex_lock(&locks_mu);
  /* held by this process already: never a second descriptor (see the top) */
  struct stat st;
  ckpt_lock *l = NULL;
  if (fstatat(dirfd, LOCK_NAME, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
    for (l = locks; l && !(l->dev == st.st_dev && l->ino == st.st_ino); l = l->next) {
    }
  newt_result_t r = NEWT_OK;
  if (l) {
    if (strcmp(l->writer, writer) == 0) {
      l->refs++;
      *out = l;
    } else {
      char held[512], who[1200];
      read_holder(l->fd, held, sizeof held, who, sizeof who);
      r = refused(dir, who);
    }
    pthread_mutex_unlock(&locks_mu);
    close(dirfd);
    return r;
  }
  int fd = -1;
  for (int tries = 0;; tries++) {
    int readable = 0, again = 0;
    r = open_lock_file(dirfd, dir, &fd, &st, &readable);
    if (r == NEWT_OK) r = take(fd, dirfd, dir, writer, readable, &again);
    if (r != NEWT_OK || !again) break;
    close(fd);
    fd = -1;
    if (tries == 8) {
      r = NEWT_ERR(NEWT_ERR_CONFLICT, "checkpoint directory %s: %s/%s was replaced under this writer %d times", dir,
                   dir, LOCK_NAME, tries + 1);
      break;
    }
  }
  close(dirfd);
  if (r == NEWT_OK && (!(l = calloc(1, sizeof *l)) || !(l->writer = newt_strdup(writer)))) {
    free(l);
    r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: checkpoint lock");
  }
  if (r != NEWT_OK) {
    if (fd >= 0) close(fd);
    pthread_mutex_unlock(&locks_mu);
    return r;
  }
  *l = (ckpt_lock){.dev = st.st_dev, .ino = st.st_ino, .fd = fd, .refs = 1, .writer = l->writer, .next = locks};
  locks = l;
  pthread_mutex_unlock(&locks_mu);
  NEWT_DEBUG(CKPT, "took %s/%s for writer \"%s\"", dir, LOCK_NAME, writer);
  *out = l;
  return NEWT_OK;
}

void ckpt_lock_release(ckpt_lock *l) {
  if (!l) return;
  pthread_mutex_lock(&locks_mu);
  if (--l->refs == 0) {
    for (ckpt_lock **p = &locks; *p; p = &(*p)->next)
      if (*p == l) {
        *p = l->next;
        break;
      }
    close(l->fd); /* the flock goes with the last descriptor */
    free(l->writer);
    free(l);
  }
  pthread_mutex_unlock(&locks_mu);
}
