/* The commit of a step, done by one rank: the step becomes visible all at once, or not.
 *
 *  1. Wait (until the deadline, abortable) for every rank's index in the step directory.
 *     Indexes of another attempt are stale leftovers (a killed run that reached this step
 *     before) and are waited past; a rank's `.failed` marker of this attempt ends the wait.
 *  2. Verify each index (its checksum, step, rank), that its shard file exists with the size
 *     and header the index states, and that the chunks of all ranks together cover every
 *     tensor exactly once with one dtype and shape.
 *  3. Write MANIFEST: temporary name, fsync, rename, fsync of the directory. From here on
 *     the step is committed; before, a reader never sees it.
 *  4. Point `latest` at it the same way (unless a newer step is already committed), remove
 *     stale files of other attempts from the step directory, and prune: committed steps
 *     beyond the newest `keep`, and uncommitted step directories older than the newest
 *     committed step (abandoned saves). Nothing newer is touched: a save may be running.
 *     A `latest` that cannot be written is a warning: the manifest is the commit.
 *
 * A commit runs under its writer's lock of DIR (lock.c: the saver's, or taken here for a
 * commit by hand): no other writer's commit, clean-up or pruning runs in the directory
 * meanwhile. Within the writer nothing a committed manifest names is removed either: right
 * before the rename every shard the new manifest names is checked to be still there; the
 * clean-up of the step keeps every file named by the manifest it wrote or by the one it
 * finds there then (and removes no shard when that one cannot be read); pruning removes an
 * abandoned step only while it holds no MANIFEST, and a committed step only beyond the
 * newest `keep`, whose manifests name files of their own directories only (plain names).
 *
 * The step directory is opened once (O_NOFOLLOW) and every file in it is read, written
 * and removed through that descriptor (dir.c says why). */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/internal.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/strutil.h"

/* A `.failed` marker of this attempt: NEWT_ERR_PEER with the rank's message. */
static newt_result_t check_failed(int stepfd, const char *stepdir, int rank, uint64_t attempt) {
  char name[64], *text = NULL;
  ckpt_failed_name(name, sizeof name, rank);
  size_t len;
  if (newt_fs_read_all_at(stepfd, stepdir, name, 65536, &text, &len) != NEWT_OK) {
    newt_err_clear();
    return NEWT_OK;
  }
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)attempt);
  newt_result_t r = NEWT_OK;
  if (attempt == 0 || strncmp(text, hex, 16) == 0) {
    const char *msg = len > 17 ? text + 17 : "";
    size_t ml = strlen(msg);
    while (ml > 0 && (msg[ml - 1] == '\n' || msg[ml - 1] == '\r')) ml--;
    r = NEWT_ERR(NEWT_ERR_PEER, "rank %d could not write its shard: %.*s", rank, (int)(ml < 900 ? ml : 900), msg);
  }
  free(text);
  return r;
}

/* Checks that the shard file an index names exists with the stated size and header. */
static newt_result_t check_shard(int stepfd, const char *stepdir, const ckpt_manifest *idx) {
  const ckpt_file *f = &idx->files[0];
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", stepdir, f->name);
  int fd;
  uint64_t size = 0;
  if (newt_fs_open_read_at(stepfd, stepdir, f->name, &fd, &size) != NEWT_OK)
    return newt_err_wrap(NEWT_ERR_CORRUPT, "rank %d: shard: ", idx->rank);
  uint8_t hdr[CKPT_SHARD_HDR];
  newt_result_t r = NEWT_OK;
  if (size != f->bytes)
    r = NEWT_ERR(NEWT_ERR_CORRUPT, "rank %d: shard %s has %llu bytes, its index says %llu", idx->rank, path,
                 (unsigned long long)size, (unsigned long long)f->bytes);
  else if (pread(fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr)
    r = NEWT_ERR(NEWT_ERR_CORRUPT, "rank %d: cannot read the header of %s", idx->rank, path);
  close(fd);
  if (r != NEWT_OK) return r;
  ckpt_shard_hdr h;
  NEWT_CHECK(ckpt_shard_hdr_decode(hdr, path, &h));
  if ((int)h.rank != idx->rank || (int)h.nranks != idx->nranks || h.step != idx->step || h.attempt != idx->attempt)
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: header (rank %u of %u, step %lld) disagrees with its index", path, h.rank,
                    h.nranks, (long long)h.step);
  return NEWT_OK;
}

/* One try at loading rank r's index: 1 when it is there and belongs to this save. */
static newt_result_t try_index(const ckpt_commit_opts *o, int stepfd, const char *stepdir, int r,
                               ckpt_manifest *idx, int *got) {
  char name[64], path[4400];
  *got = 0;
  ckpt_index_name(name, sizeof name, r);
  snprintf(path, sizeof path, "%s/%s", stepdir, name);
  if (!newt_fs_exists_at(stepfd, name)) return check_failed(stepfd, stepdir, r, o->attempt);
  newt_result_t lr = ckpt_manifest_load_keyed(stepfd, stepdir, name, 1, o->key, idx);
  if (lr == NEWT_ERR_AUTH) { /* not this job's (planted): waited past, as another attempt's is */
    newt_err_clear();
    return check_failed(stepfd, stepdir, r, o->attempt);
  }
  NEWT_CHECK(lr);
  if (o->attempt != 0 && idx->attempt != o->attempt) { /* stale: wait for this attempt's */
    ckpt_manifest_free(idx);
    return check_failed(stepfd, stepdir, r, o->attempt);
  }
  newt_result_t res = NEWT_OK;
  if (idx->step != o->step || idx->nranks != o->nranks || idx->rank != r || idx->nfiles != 1)
    res = NEWT_ERR(NEWT_ERR_CORRUPT, "%s: index of rank %d, step %lld, %d ranks, %zu files; expected rank %d, step "
                   "%lld, %d ranks, 1 file", path, idx->rank, (long long)idx->step, idx->nranks, idx->nfiles, r,
                   (long long)o->step, o->nranks);
  if (res == NEWT_OK) res = check_shard(stepfd, stepdir, idx);
  if (res != NEWT_OK) {
    ckpt_manifest_free(idx);
    return res;
  }
  *got = 1;
  return NEWT_OK;
}

/* Waits for the indexes in the step directory, which it opens (into *stepfd) once a rank
 * has made it. */
static newt_result_t wait_indexes(const ckpt_commit_opts *o, int dirfd, const char *stepdir, int *stepfd,
                                  ckpt_manifest *idx) {
  int64_t missing = o->nranks;
  int64_t sleep_us = 500;
  uint64_t t0 = newt_now_ns();
  for (;;) {
    if (*stepfd < 0) {
      newt_result_t r = ckpt_step_open(dirfd, o->dir, o->step, 0, stepfd);
      if (r == NEWT_ERR_NOTFOUND) newt_err_clear();
      else NEWT_CHECK(r);
    }
    for (int r = 0; *stepfd >= 0 && r < o->nranks; r++) {
      if (idx[r].nfiles) continue;
      int got;
      NEWT_CHECK(try_index(o, *stepfd, stepdir, r, &idx[r], &got));
      missing -= got;
    }
    if (missing == 0) return NEWT_OK;
    if (o->abort && atomic_load(o->abort))
      return NEWT_ERR(NEWT_ERR_ABORTED, "commit of step %lld aborted", (long long)o->step);
    if (newt_deadline_passed(o->deadline)) {
      char list[256] = "";
      size_t used = 0;
      for (int r = 0; r < o->nranks && used + 16 < sizeof list; r++)
        if (!idx[r].nfiles) used += (size_t)snprintf(list + used, sizeof list - used, "%s%d", used ? ", " : "", r);
      return NEWT_ERR(NEWT_ERR_TIMEOUT, "commit of step %lld: waited %.0f ms for the shard indexes of rank(s) %s "
                      "in %s", (long long)o->step, (double)(newt_now_ns() - t0) / 1e6, list, stepdir);
    }
    int64_t left_us = newt_deadline_left_ms(o->deadline) * 1000 + 1000;
    newt_sleep_us(sleep_us < left_us ? sleep_us : left_us);
    if (sleep_us < 20000) sleep_us *= 2;
  }
}

static newt_result_t merge(const ckpt_commit_opts *o, ckpt_manifest *idx, ckpt_manifest *m) {
  m->step = o->step;
  m->nranks = o->nranks;
  m->attempt = idx[0].attempt;
  m->created_ms = newt_wall_ms();
  m->files = calloc((size_t)o->nranks, sizeof *m->files);
  NEWT_CHECK_ALLOC(m->files);
  for (int r = 0; r < o->nranks; r++) {
    m->files[r] = idx[r].files[0];
    memset(&idx[r].files[0], 0, sizeof idx[r].files[0]); /* moved */
    m->nfiles++;
    for (size_t i = 0; i < idx[r].ntensors; i++) {
      ckpt_tensor *src = &idx[r].tensors[i], *t;
      newt_tensor_desc d = {.name = src->name, .dtype = src->dtype, .ndim = src->ndim};
      memcpy(d.shape, src->shape, sizeof d.shape);
      NEWT_CHECK(ckpt_manifest_add_tensor(m, &d, &t));
      t->chunks = src->chunks; /* moved */
      t->nchunks = src->nchunks;
      t->cap = src->cap;
      src->chunks = NULL;
      src->nchunks = src->cap = 0;
      for (size_t j = 0; j < t->nchunks; j++) t->chunks[j].file = (uint32_t)r;
    }
  }
  char what[64];
  snprintf(what, sizeof what, "commit of step %lld", (long long)o->step);
  NEWT_CHECK(ckpt_manifest_sort(m, 1, what));
  for (size_t i = 0; i < m->ntensors; i++) {
    char tw[CKPT_MAX_NAME + 64];
    snprintf(tw, sizeof tw, "commit of step %lld: tensor \"%s\"", (long long)o->step, m->tensors[i].name);
    NEWT_CHECK(ckpt_coverage_check(&m->tensors[i], 1, tw));
  }
  return NEWT_OK;
}

static int names_file(const ckpt_manifest *m, const char *name) {
  for (size_t f = 0; m && f < m->nfiles; f++)
    if (strcmp(m->files[f].name, name) == 0) return 1;
  return 0;
}

/* Every shard the manifest names is still there, with its size (checked right before the
 * rename: a manifest never commits a file gone since the indexes were read). */
static newt_result_t shards_present(int stepfd, const char *stepdir, const ckpt_manifest *m) {
  for (size_t f = 0; f < m->nfiles; f++) {
    struct stat st;
    if (fstatat(stepfd, m->files[f].name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        (uint64_t)st.st_size != m->files[f].bytes)
      return NEWT_ERR(NEWT_ERR_CORRUPT, "commit of %s: the shard %s of rank %d is gone or changed since its index "
                      "was read: not committed", stepdir, m->files[f].name, m->files[f].rank);
  }
  return NEWT_OK;
}

/* Removes what no manifest of the step references: shards of other attempts, markers,
 * temporary files of killed writers. The manifest there now is read again first, and what
 * it names is kept too (it is not `m` when another commit of this step renamed its own over
 * it); when it cannot be read, no shard is removed. */
static void clean_step(int stepfd, const char *stepdir, const ckpt_manifest *m) {
  ckpt_manifest now;
  int now_ok = ckpt_manifest_load(stepfd, stepdir, "MANIFEST", 0, &now) == NEWT_OK;
  if (!now_ok) {
    NEWT_WARN(CKPT, "clean-up of %s: its MANIFEST does not read back (%s): no shard removed", stepdir, newt_errmsg());
    newt_err_clear();
  }
  int fd = dup(stepfd);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    if (now_ok) ckpt_manifest_free(&now);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    const char *n = e->d_name;
    if (n[0] == '.' || strcmp(n, "MANIFEST") == 0) continue;
    size_t len = strlen(n);
    int shard = len > 6 && strcmp(n + len - 6, ".shard") == 0;
    int junk = strstr(n, ".tmp.") != NULL || (len > 7 && strcmp(n + len - 7, ".failed") == 0);
    if (shard) shard = now_ok && !names_file(m, n) && !names_file(&now, n);
    if (shard || junk) unlinkat(dirfd(d), n, 0);
  }
  closedir(d);
  if (now_ok) ckpt_manifest_free(&now);
}

static void prune(int dirfd, const char *dir, int keep) {
  int64_t *steps = NULL;
  size_t n = 0;
  if (ckpt_scan_steps(dirfd, dir, &steps, &n) != NEWT_OK) {
    NEWT_WARN(CKPT, "prune %s: %s", dir, newt_errmsg());
    return;
  }
  int *committed = calloc(n ? n : 1, sizeof *committed);
  if (!committed) {
    free(steps);
    return;
  }
  int64_t newest = -1;
  for (size_t i = 0; i < n; i++) {
    committed[i] = ckpt_step_committed(dirfd, steps[i]);
    if (committed[i]) newest = steps[i];
  }
  int kept = 0;
  for (size_t i = n; i-- > 0;) {
    int drop = committed[i] ? (keep > 0 && ++kept > keep) : steps[i] < newest;
    if (!drop) continue;
    /* an abandoned step committed since the scan is kept (it holds a MANIFEST now) */
    if (ckpt_remove_step(dirfd, dir, steps[i], !committed[i]) != NEWT_OK)
      NEWT_WARN(CKPT, "prune step %lld: %s", (long long)steps[i], newt_errmsg());
    else
      NEWT_DEBUG(CKPT, "pruned %s step %lld", committed[i] ? "committed" : "abandoned", (long long)steps[i]);
  }
  free(committed);
  free(steps);
}

/* The bytes of the committed step: its shards, every rank's index (as read) and the manifest
 * (manifest_len as written). */
static uint64_t step_bytes(const ckpt_manifest *m, const ckpt_manifest *idx, int nranks, size_t manifest_len) {
  uint64_t b = manifest_len;
  for (size_t f = 0; f < m->nfiles; f++) b += m->files[f].bytes;
  for (int r = 0; r < nranks; r++) b += idx[r].encoded_bytes;
  return b;
}

newt_result_t ckpt_commit(const ckpt_commit_opts *o) {
  if (!o->dir || !*o->dir || o->step < 0 || o->nranks < 1 || o->nranks > CKPT_MAX_RANKS)
    return NEWT_ERR(NEWT_ERR_INVALID, "ckpt_commit: dir \"%s\", step %lld, nranks %d", o->dir ? o->dir : "",
                    (long long)o->step, o->nranks);
  if (o->state && !cJSON_IsObject(o->state))
    return NEWT_ERR(NEWT_ERR_INVALID, "ckpt_commit: the training state is not a JSON object");
  cJSON *state = o->state ? cJSON_Duplicate(o->state, 1) : cJSON_CreateObject();
  NEWT_CHECK_ALLOC(state);
  char stepdir[4096];
  ckpt_step_dirname(stepdir, sizeof stepdir, o->dir, o->step);
  ckpt_manifest *idx = calloc((size_t)o->nranks, sizeof *idx);
  ckpt_manifest m = {0};
  m.state = state;
  int dirfd = -1, stepfd = -1;
  char writer[512];
  if (o->writer) snprintf(writer, sizeof writer, "%s", o->writer);
  else ckpt_writer_default(writer, sizeof writer, o->nranks, o->attempt);
  ckpt_lock *lock = NULL; /* the saver's already, when a saver commits */
  newt_result_t r = idx ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: %d indexes", o->nranks);
  if (r == NEWT_OK) r = ckpt_lock_take(o->dir, writer, &lock);
  if (r == NEWT_OK) r = newt_fs_dir_open(o->dir, 1, &dirfd);
  if (r == NEWT_OK) r = wait_indexes(o, dirfd, stepdir, &stepfd, idx);
  if (r == NEWT_OK) r = merge(o, idx, &m);
  char *text = NULL;
  size_t len = 0;
  if (r == NEWT_OK) r = ckpt_manifest_encode_keyed(&m, o->key, &text, &len);
  int64_t delay = newt_param_CkptTestCommitDelayMs();
  if (r == NEWT_OK && delay > 0) newt_sleep_ms(delay);
  if (r == NEWT_OK) r = shards_present(stepfd, stepdir, &m);
  if (r == NEWT_OK) r = newt_fs_write_atomic_at(stepfd, stepdir, "MANIFEST", text, len);
  free(text);
  if (r == NEWT_OK && o->step_bytes) *o->step_bytes = step_bytes(&m, idx, o->nranks, len);
  if (r == NEWT_OK) { /* a hint for tools: the step is committed whether it moves or not */
    int64_t latest = ckpt_latest_at(dirfd, o->dir);
    if ((latest <= o->step || !ckpt_step_committed(dirfd, latest)) &&
        ckpt_write_latest(dirfd, o->dir, o->step) != NEWT_OK) {
      NEWT_WARN(CKPT, "step %lld is committed, but the latest pointer still names step %lld: %s", (long long)o->step,
                (long long)latest, newt_errmsg());
      newt_err_clear();
    }
  }
  if (r == NEWT_OK) {
    clean_step(stepfd, stepdir, &m);
    prune(dirfd, o->dir, o->keep);
    NEWT_INFO(CKPT, "committed step %lld (%d ranks, %zu tensors) in %s", (long long)o->step, o->nranks,
              m.ntensors, o->dir);
  }
  for (int i = 0; idx && i < o->nranks; i++) ckpt_manifest_free(&idx[i]);
  free(idx);
  if (stepfd >= 0) close(stepfd);
  if (dirfd >= 0) close(dirfd);
  ckpt_lock_release(lock);
  ckpt_manifest_free(&m);
  return r;
}
