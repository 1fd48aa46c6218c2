/* Files and directories with the durability newt's invariants need: writes that are
 * visible all at once (temporary file, fsync, rename, fsync of the directory), whole-file
 * reads with a size bound, recursive mkdir and removal. Errors name the path.
 *
 * The `_at` functions are for directories that others may write (a checkpoint volume is
 * one): they work relative to an open directory (dirfd; AT_FDCWD for the current one),
 * never follow a symbolic link in the last component of `name` (nor, in newt_fs_rm_rf_at,
 * anywhere below it), never block on a FIFO, and create every file exclusively
 * (O_CREAT|O_EXCL|O_NOFOLLOW; an entry already there, a stale file or a planted link, is
 * removed itself first). A link or a special file put under a name newt will use can
 * therefore neither redirect a write nor hang a read. `dir` is the directory's path, used
 * in messages only (NULL when `name` is the whole path). */
#ifndef NEWT_COMMON_FS_H
#define NEWT_COMMON_FS_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

newt_result_t newt_fs_mkdirs(const char *path, unsigned mode);
/* Writes `len` bytes to path atomically: path.tmp.<pid> (created exclusively), fsync,
 * rename, fsync(dir). The directories on the path are followed (the path is the caller's). */
newt_result_t newt_fs_write_atomic(const char *path, const void *data, size_t len);
/* Writes all of buf to fd, retrying short writes and EINTR; ENOSPC gives NEWT_ERR_NOSPACE. */
newt_result_t newt_fs_write_all(int fd, const void *buf, size_t len, const char *path);
/* Reads the whole file (at most max bytes) into a malloc'd, NUL-terminated buffer. The path
 * is the caller's: followed, and it may be a pipe. */
newt_result_t newt_fs_read_all(const char *path, size_t max, char **out, size_t *len);
newt_result_t newt_fs_fsync_dir(const char *dir);
/* fsync of an open directory (EINVAL, a filesystem without it, is not an error). */
newt_result_t newt_fs_fsync_fd(int fd, const char *what);
/* Removes path and everything under it; a missing path is not an error, a symbolic link
 * is removed itself. */
newt_result_t newt_fs_rm_rf(const char *path);
int newt_fs_exists(const char *path);
/* Directory part of path into out (".", when none). */
void newt_fs_dirname(const char *path, char *out, size_t cap);

/* ---- inside a directory others may write (see the top) ------------------------------- */

/* Opens the directory at path (create: makes it first, as newt_fs_mkdirs). The path is the
 * caller's and is followed. */
newt_result_t newt_fs_dir_open(const char *path, int create, int *fd);
/* Opens the subdirectory `name` of dirfd. A symbolic link or another kind of file in its
 * place is NEWT_ERR_INVALID, a missing one NEWT_ERR_NOTFOUND. create: makes it first, and
 * a non-directory found in its place is removed (the entry itself) and replaced. */
newt_result_t newt_fs_subdir_at(int dirfd, const char *dir, const char *name, int create, int *fd);
/* Opens a regular file for reading (blocking reads). A symbolic link, FIFO, socket,
 * device or directory is NEWT_ERR_INVALID naming it, a missing file NEWT_ERR_NOTFOUND.
 * size: its size (may be NULL). */
newt_result_t newt_fs_open_read_at(int dirfd, const char *dir, const char *name, int *fd, uint64_t *size);
/* newt_fs_read_all for a regular file opened as above; more than max bytes is
 * NEWT_ERR_INVALID. */
newt_result_t newt_fs_read_all_at(int dirfd, const char *dir, const char *name, size_t max, char **out,
                                  size_t *len);
/* Creates `name` for writing, exclusively; flags are added to the open (O_DIRECT). */
newt_result_t newt_fs_create_at(int dirfd, const char *dir, const char *name, int flags, int *fd);
/* newt_fs_write_atomic inside dirfd: name.tmp.<pid> created exclusively, fsync, renameat,
 * fsync of dirfd. */
newt_result_t newt_fs_write_atomic_at(int dirfd, const char *dir, const char *name, const void *data,
                                      size_t len);
/* Removes `name` and, when it is a directory, everything under it, opening each directory
 * with O_NOFOLLOW: a symbolic link anywhere is removed itself, never followed. */
newt_result_t newt_fs_rm_rf_at(int dirfd, const char *dir, const char *name);
/* 1 when an entry of that name exists, of any kind (a link is not followed). */
int newt_fs_exists_at(int dirfd, const char *name);

#endif
