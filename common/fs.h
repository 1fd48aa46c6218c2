/* Files and directories with the durability newt's invariants need: writes that are
 * visible all at once (temporary file, fsync, rename, fsync of the directory), whole-file
 * reads with a size bound, recursive mkdir and removal. Errors name the path. */
#ifndef NEWT_COMMON_FS_H
#define NEWT_COMMON_FS_H

#include <stddef.h>

#include "err.h"

newt_result_t newt_fs_mkdirs(const char *path, unsigned mode);
/* Writes `len` bytes to path atomically: path.tmp.<pid>, fsync, rename, fsync(dir). */
newt_result_t newt_fs_write_atomic(const char *path, const void *data, size_t len);
/* Writes all of buf to fd, retrying short writes and EINTR; ENOSPC gives NEWT_ERR_NOSPACE. */
newt_result_t newt_fs_write_all(int fd, const void *buf, size_t len, const char *path);
/* Reads the whole file (at most max bytes) into a malloc'd, NUL-terminated buffer. */
newt_result_t newt_fs_read_all(const char *path, size_t max, char **out, size_t *len);
newt_result_t newt_fs_fsync_dir(const char *dir);
/* Removes path and everything under it; a missing path is not an error. */
newt_result_t newt_fs_rm_rf(const char *path);
int newt_fs_exists(const char *path);
/* Directory part of path into out (".", when none). */
void newt_fs_dirname(const char *path, char *out, size_t cap);

#endif
