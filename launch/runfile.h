/* Where a `newt run` job's etcd is, for `newt status --job NAME` with no other flag: newt run
 * records its job's endpoint and credentials' files in a file of this user's alone, and
 * newt status finds it by the job's name. The record names files, never holds a password.
 *
 *   the directory  $XDG_RUNTIME_DIR/newt, else /tmp/newt-<uid>: made mode 0700; refused
 *                  (naming it and why) unless it is this user's, nobody else can read or write
 *                  it, and no directory above it can be written by another user (sticky /tmp
 *                  aside: newt_dir_trusted)
 *   the file       <job>.run, JSON (the fields of runfile below), mode 0600, written anew and
 *                  renamed into place; read through the directory's descriptor without
 *                  following a link, and refused unless it is a regular file of this user's
 *                  that nobody else can read or write
 *
 * At its end newt run writes the outcome into its record before its private etcd stops, so a
 * `newt status --watch` that finds etcd gone knows the run ended and how. The newest run of a
 * job name owns the record: an older run of the same name leaves a newer one's alone. */
#ifndef NEWT_LAUNCH_RUNFILE_H
#define NEWT_LAUNCH_RUNFILE_H

#include <stdint.h>

#include "common/err.h"
#include "rendezvous/rdzv.h"

typedef struct runfile {
  char job[RDZV_NAME_MAX];
  int64_t pid;             /* newt run's */
  uint64_t t_start_ms;     /* with pid, which run this is */
  int private_etcd;        /* the run's own etcd, which ends with it (else --etcd's) */
  char etcd[512];          /* endpoints, comma-separated */
  char user[128];          /* "" without authentication */
  char password_file[1024];
  char ca[1024], cert[1024], key[1024]; /* --etcd's TLS files ("": none) */
  char log_dir[1024];
  /* once the run ended */
  int ended;
  char outcome[32]; /* done, failed, exited, timeout, interrupted, error (launcher_result) */
  char reason[512];
  int64_t steps;
  double loss;
  uint64_t t_end_ms;
} runfile;

/* The records' directory, made when missing and checked; its path into out. */
newt_result_t runfile_dir(char *out, size_t cap);
/* Writes rf as the record of its job (made anew, mode 0600). */
newt_result_t runfile_write(const runfile *rf);
/* Writes rf, its end said, over the record of its job only while that record is still this
 * run's (pid and start); a newer run's is left alone. */
newt_result_t runfile_end(const runfile *rf);
/* The record of a job. NEWT_ERR_NOTFOUND: none; refused (NEWT_ERR_AUTH) when it is not this
 * user's alone, naming the file and why. path (may be NULL): the file's path, for messages. */
newt_result_t runfile_read(const char *job, runfile *rf, char *path, size_t cap);
/* Whether the run of a record is over: it said so, or its process is gone. */
int runfile_over(const runfile *rf);

#endif
