/* The job secret and what is made of it: HMAC-SHA256 (OpenSSL), a constant-time comparison,
 * the secret read from its file only when nobody else can read or write that file, and the
 * check that a directory newt writes into as root (a log directory) belongs to this user.
 *
 * A secret file is refused, naming it and why, when it is not a regular file, has more than
 * one link, is owned by a user other than this one or root, or can be read or written by
 * another user: written by group or other, read by other, read by a group this process is
 * not in (a Kubernetes Secret volume is root's, mode 0440, of the pod's fsGroup: accepted).
 * Its path is followed (a Secret's file is a link into ..data/): the directory it lies in is
 * its owner's to keep, and newt run checks the directories it makes (newt_dir_trusted).
 *
 * Every key newt derives from the job secret is HMAC-SHA256(secret, label), one label per use
 * (the data plane's per-generation key: comm/comm.h; the records' and the checkpoints' keys:
 * job/records.h, ckpt/ckpt.h), so no use can stand in for another. */
#ifndef NEWT_COMMON_SECRET_H
#define NEWT_COMMON_SECRET_H

#include <stddef.h>

#include "err.h"

#define NEWT_MAC_BYTES 32 /* HMAC-SHA256 */
#define NEWT_MAC_HEX 64
#define NEWT_SECRET_MIN 16
#define NEWT_SECRET_MAX 4096

/* HMAC-SHA256(key, the n parts of msg one after another) into out. */
newt_result_t newt_hmac(const void *key, size_t key_len, const void *const *parts, const size_t *lens, int n,
                        unsigned char out[NEWT_MAC_BYTES]);
/* SHA-256 of n bytes into out (NEWT_MAC_BYTES): a digest, for what a sealed record names by
 * its content (a plan's head names its shards so). */
newt_result_t newt_sha256(const void *data, size_t n, unsigned char out[NEWT_MAC_BYTES]);
/* 1 when the n bytes of a and b are equal, in time that does not depend on where they differ. */
int newt_ct_equal(const void *a, const void *b, size_t n);

/* Reads a job secret file (16 to 4096 bytes) into a malloc'd buffer after the checks above;
 * errors name the file ("the job secret file /x: owned by uid 1000, not by this user (uid 0)
 * or root"). The caller wipes and frees it. */
newt_result_t newt_secret_read(const char *path, unsigned char **out, size_t *len);
/* The same on an open file (what: its name in messages). */
newt_result_t newt_secret_read_fd(int fd, const char *what, unsigned char **out, size_t *len);
/* The checks of newt_secret_read on an open file. */
newt_result_t newt_secret_check_fd(int fd, const char *what);
/* Wipes and frees a secret (NULL: nothing). */
void newt_secret_free(unsigned char *secret, size_t len);

/* The job secret a checkpoint directory keeps for itself, DIR/job.secret: the secret of
 * `newt run` and `newt train` when no --job-secret-file is given, so that their runs on one
 * directory share the checkpoints' key. create: made when missing (32 random bytes as 64 hex
 * digits, mode 0600, exclusively; DIR made too). Read through DIR's descriptor, never
 * through a link, with newt_secret_read's checks; *secret is malloc'd (newt_secret_free).
 * NEWT_ERR_NOTFOUND: none, and not create. */
newt_result_t newt_secret_in_dir(const char *dir, int create, unsigned char **secret, size_t *len);

/* Whether path (opened without following a link in its last component: *fd, O_DIRECTORY) is
 * a directory this user may trust to hold its files: owned by this user, written by nobody
 * else (no group or other write bit), and every directory above it owned by this user or
 * root and written by nobody else unless sticky (/tmp: others cannot rename what is ours).
 * A link as the last component is refused; what: the flag that named it ("--log-dir"). */
newt_result_t newt_dir_trusted(const char *path, const char *what, int *fd);

#endif
