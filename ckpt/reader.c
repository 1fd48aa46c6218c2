/* Reading checkpoints: open a committed step (its manifest parsed and checked: checksum,
 * fields, plain file names, chunks covering every tensor exactly once), then assemble
 * requested slices from the chunks that overlap them. Each overlapping chunk is read once,
 * its header and both checksums verified, decompressed on the pool, and copied into every
 * request it overlaps (decoded straight into the caller's buffer when it maps onto one
 * contiguous run of it). Shard files are opened inside the step directory with
 * O_NOFOLLOW, so neither a name nor a symbolic link leads outside it.
 *
 * ckpt_load walks committed steps from the newest down and takes the first that reads
 * back whole; ckpt_verify reads every chunk of a step and reports each problem. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/internal.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/strutil.h"

typedef struct worker_buf {
  ckpt_codec codec;
  uint8_t *stored; /* chunk header + stored bytes */
  size_t stored_cap;
  uint8_t *raw;
  size_t raw_cap;
} worker_buf;

struct ckpt_reader {
  char *stepdir;
  int dirfd;
  ckpt_manifest m;
  int *fds; /* per file, -1 until opened */
  pthread_mutex_t fd_mu;
  ckpt_pool *pool;
  worker_buf *bufs;
  int nbufs;
};

void ckpt_close(ckpt_reader *r) {
  if (!r) return;
  for (size_t i = 0; r->fds && i < r->m.nfiles; i++)
    if (r->fds[i] >= 0) close(r->fds[i]);
  free(r->fds);
  if (r->dirfd >= 0) close(r->dirfd);
  ckpt_pool_free(r->pool);
  for (int i = 0; r->bufs && i < r->nbufs; i++) {
    ckpt_codec_free(&r->bufs[i].codec);
    free(r->bufs[i].stored);
    free(r->bufs[i].raw);
  }
  free(r->bufs);
  ckpt_manifest_free(&r->m);
  pthread_mutex_destroy(&r->fd_mu);
  free(r->stepdir);
  free(r);
}

/* A reader on the open step directory stepfd (the reader's from here on: closed on failure
 * too); stepdir is its path. */
static newt_result_t open_fd(ckpt_reader **out, int stepfd, const char *stepdir, int threads, const ckpt_key *key) {
  ckpt_reader *r = calloc(1, sizeof *r);
  if (!r) {
    close(stepfd);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory opening %s", stepdir);
  }
  r->dirfd = stepfd;
  pthread_mutex_init(&r->fd_mu, NULL);
  newt_result_t res = NEWT_OK;
  if (!(r->stepdir = newt_strdup(stepdir))) res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory opening %s", stepdir);
  if (res == NEWT_OK) {
    res = ckpt_manifest_load_keyed(r->dirfd, r->stepdir, "MANIFEST", 0, key, &r->m);
    if (res == NEWT_ERR_NOTFOUND)
      res = NEWT_ERR(NEWT_ERR_NOTFOUND, "%s: no MANIFEST: the step was never committed", r->stepdir);
  }
  if (res == NEWT_OK && !(r->fds = malloc((r->m.nfiles ? r->m.nfiles : 1) * sizeof *r->fds)))
    res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory opening %s", r->stepdir);
  for (size_t i = 0; res == NEWT_OK && i < r->m.nfiles; i++) r->fds[i] = -1;
  if (res == NEWT_OK) res = ckpt_pool_init(&r->pool, threads > 0 ? threads : 2);
  if (res == NEWT_OK) {
    r->nbufs = ckpt_pool_size(r->pool);
    if (!(r->bufs = calloc((size_t)r->nbufs, sizeof *r->bufs))) res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  }
  if (res != NEWT_OK) {
    ckpt_close(r);
    return res;
  }
  *out = r;
  return NEWT_OK;
}

/* Opens a step directory given by its path (trailing slashes dropped, so that a link as
 * its last component is not followed); *sd is the path as used, malloc'd. */
static newt_result_t open_step_path(const char *stepdir, char **sd, int *fd) {
  size_t len = strlen(stepdir);
  while (len > 1 && stepdir[len - 1] == '/') len--;
  *sd = newt_asprintf("%.*s", (int)len, stepdir);
  if (!*sd) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory opening %s", stepdir);
  newt_result_t res = newt_fs_subdir_at(AT_FDCWD, NULL, *sd, 0, fd);
  if (res == NEWT_ERR_NOTFOUND)
    res = NEWT_ERR(NEWT_ERR_NOTFOUND, "%s: no MANIFEST: the step was never committed", *sd);
  return res;
}

newt_result_t ckpt_open_path(ckpt_reader **out, const char *stepdir, int threads) {
  char *sd = NULL;
  int fd;
  newt_result_t res = open_step_path(stepdir, &sd, &fd);
  if (res == NEWT_OK) res = open_fd(out, fd, sd, threads, NULL);
  free(sd);
  return res;
}

/* Opens DIR for reading; a missing one is *fd = -1 (no checkpoints), not an error. */
static newt_result_t open_dir(const char *dir, int *fd) {
  newt_result_t r = ckpt_dir_open(dir, fd);
  if (r != NEWT_ERR_NOTFOUND) return r;
  newt_err_clear();
  *fd = -1;
  return NEWT_OK;
}

/* step-<N>'s descriptor when it is a directory with a MANIFEST, else -1. */
static int committed_step(int dirfd, const char *dir, int64_t step) {
  int fd;
  if (ckpt_step_open(dirfd, dir, step, 0, &fd) != NEWT_OK) { /* replaced since the scan */
    NEWT_WARN(CKPT, "skipping it: %s", newt_errmsg());
    newt_err_clear();
    return -1;
  }
  if (newt_fs_exists_at(fd, "MANIFEST")) return fd;
  close(fd);
  return -1;
}

newt_result_t ckpt_open(ckpt_reader **out, const char *dir, int64_t step, int threads) {
  return ckpt_open_keyed(out, dir, step, threads, NULL);
}

newt_result_t ckpt_open_keyed(ckpt_reader **out, const char *dir, int64_t step, int threads, const ckpt_key *key) {
  char sd[4200];
  int dirfd, fd;
  if (step >= 0) {
    ckpt_step_dirname(sd, sizeof sd, dir, step);
    NEWT_CHECK(ckpt_dir_open(dir, &dirfd));
    newt_result_t r = ckpt_step_open(dirfd, dir, step, 0, &fd);
    close(dirfd);
    if (r == NEWT_ERR_NOTFOUND)
      return NEWT_ERR(NEWT_ERR_NOTFOUND, "%s: no MANIFEST: the step was never committed", sd);
    NEWT_CHECK(r);
    return open_fd(out, fd, sd, threads, key);
  }
  int64_t *steps = NULL;
  size_t n = 0;
  NEWT_CHECK(open_dir(dir, &dirfd));
  newt_result_t r = dirfd >= 0 ? ckpt_scan_steps(dirfd, dir, &steps, &n) : NEWT_OK;
  char first_err[1024] = "";
  for (size_t i = n; r == NEWT_OK && i-- > 0;) {
    if ((fd = committed_step(dirfd, dir, steps[i])) < 0) continue;
    ckpt_step_dirname(sd, sizeof sd, dir, steps[i]);
    if (open_fd(out, fd, sd, threads, key) == NEWT_OK) {
      free(steps);
      close(dirfd);
      return NEWT_OK;
    }
    NEWT_WARN(CKPT, "skipping %s: %s", sd, newt_errmsg());
    if (!first_err[0]) snprintf(first_err, sizeof first_err, "; %s", newt_errmsg());
  }
  free(steps);
  if (dirfd >= 0) close(dirfd);
  NEWT_CHECK(r);
  return NEWT_ERR(NEWT_ERR_NOTFOUND, "no usable committed checkpoint in %s%s", dir, first_err);
}

int64_t ckpt_reader_step(const ckpt_reader *r) { return r->m.step; }
const char *ckpt_reader_path(const ckpt_reader *r) { return r->stepdir; }
const cJSON *ckpt_reader_state(const ckpt_reader *r) { return r->m.state; }
size_t ckpt_reader_ntensors(const ckpt_reader *r) { return r->m.ntensors; }

static void desc_of(const ckpt_tensor *t, newt_tensor_desc *d) {
  d->name = t->name;
  d->dtype = t->dtype;
  d->ndim = t->ndim;
  memcpy(d->shape, t->shape, sizeof d->shape);
}

void ckpt_reader_tensor(const ckpt_reader *r, size_t i, newt_tensor_desc *d) { desc_of(&r->m.tensors[i], d); }

newt_result_t ckpt_reader_find(const ckpt_reader *r, const char *name, newt_tensor_desc *d) {
  const ckpt_tensor *t = ckpt_manifest_find(&r->m, name);
  if (!t) return NEWT_ERR(NEWT_ERR_NOTFOUND, "%s: no tensor \"%s\" in the checkpoint", r->stepdir, name);
  desc_of(t, d);
  return NEWT_OK;
}

/* ---- chunks ------------------------------------------------------------------------------ */

static newt_result_t file_fd(ckpt_reader *r, uint32_t f, int *fd) {
  pthread_mutex_lock(&r->fd_mu);
  newt_result_t res = NEWT_OK;
  if (r->fds[f] < 0) {
    const ckpt_file *cf = &r->m.files[f];
    int x = -1;
    uint64_t size = 0;
    uint8_t hdr[CKPT_SHARD_HDR];
    ckpt_shard_hdr h;
    /* inside the step directory, not through a link, and a regular file (no FIFO) */
    res = newt_fs_open_read_at(r->dirfd, r->stepdir, cf->name, &x, &size);
    if (res == NEWT_ERR_NOTFOUND) res = newt_err_wrap(NEWT_ERR_CORRUPT, "missing: ");
    else if (res == NEWT_OK && size != cf->bytes)
      res = NEWT_ERR(NEWT_ERR_CORRUPT, "%s/%s: %llu bytes, the manifest says %llu (truncated or replaced)",
                     r->stepdir, cf->name, (unsigned long long)size, (unsigned long long)cf->bytes);
    else if (res == NEWT_OK && pread(x, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr)
      res = NEWT_ERR(NEWT_ERR_CORRUPT, "%s/%s: cannot read its header", r->stepdir, cf->name);
    if (res == NEWT_OK) {
      char what[4400];
      snprintf(what, sizeof what, "%s/%s", r->stepdir, cf->name);
      res = ckpt_shard_hdr_decode(hdr, what, &h);
      if (res == NEWT_OK && ((int)h.rank != cf->rank || h.step != r->m.step || h.attempt != r->m.attempt))
        res = NEWT_ERR(NEWT_ERR_CORRUPT, "%s: its header (rank %u, step %lld) does not match the manifest", what,
                       h.rank, (long long)h.step);
    }
    if (res == NEWT_OK) r->fds[f] = x;
    else if (x >= 0) close(x);
  }
  *fd = r->fds[f];
  pthread_mutex_unlock(&r->fd_mu);
  return res;
}

static newt_result_t grow(uint8_t **buf, size_t *cap, size_t need) {
  if (*cap >= need) return NEWT_OK;
  free(*buf);
  *buf = malloc(need);
  *cap = *buf ? need : 0;
  if (!*buf) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: a chunk buffer of %zu bytes", need);
  return NEWT_OK;
}

static void chunk_what(const ckpt_reader *r, const ckpt_tensor *t, size_t j, char *out, size_t cap) {
  const ckpt_chunk *c = &t->chunks[j];
  snprintf(out, cap, "%s/%s chunk %zu of tensor \"%s\" (at byte %llu)", r->stepdir, r->m.files[c->file].name, j,
           t->name, (unsigned long long)c->offset);
}

/* Reads, verifies and decodes chunk j of t into dst (NULL: the worker's raw buffer);
 * *raw is where the bytes ended up. */
static newt_result_t read_chunk(ckpt_reader *r, int worker, const ckpt_tensor *t, size_t j, void *dst,
                                const uint8_t **raw) {
  const ckpt_chunk *c = &t->chunks[j];
  worker_buf *b = &r->bufs[worker];
  char what[CKPT_MAX_NAME + 4500];
  chunk_what(r, t, j, what, sizeof what);
  int fd;
  NEWT_CHECK(file_fd(r, c->file, &fd));
  size_t need = CKPT_CHUNK_HDR + c->stored;
  NEWT_CHECK(grow(&b->stored, &b->stored_cap, need));
  size_t got = 0;
  while (got < need) {
    ssize_t n = pread(fd, b->stored + got, need - got, (off_t)(c->offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return NEWT_ERR(NEWT_ERR_SYS, "%s: read: %s", what, strerror(errno));
    if (n == 0) return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: the file ends inside the chunk", what);
    got += (size_t)n;
  }
  ckpt_chunk_hdr h;
  NEWT_CHECK(ckpt_chunk_hdr_decode(b->stored, what, &h));
  if (h.codec != c->codec || h.filter != c->filter || h.raw != c->raw || h.stored != c->stored ||
      h.xxh_raw != c->xxh_raw || h.xxh_stored != c->xxh_stored || h.esize != newt_dtype_size(t->dtype))
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: the chunk header disagrees with the manifest", what);
  if (!dst) {
    NEWT_CHECK(grow(&b->raw, &b->raw_cap, c->raw));
    dst = b->raw;
  }
  NEWT_CHECK(ckpt_chunk_decode(&b->codec, &h, b->stored + CKPT_CHUNK_HDR, dst, what));
  *raw = dst;
  return NEWT_OK;
}

/* ---- requests ---------------------------------------------------------------------------- */

typedef struct pair {
  const ckpt_tensor *t;
  size_t chunk;
  size_t req;
} pair;

typedef struct read_job {
  ckpt_reader *r;
  const ckpt_request *reqs;
  pair *pairs;
  size_t *first; /* work item k covers pairs first[k] .. first[k+1]-1 (one chunk) */
  atomic_llong *copied;
  ckpt_job_err err;
} read_job;

static void read_one(void *ctx, size_t k, int worker) {
  read_job *j = ctx;
  if (atomic_load(&j->err.code) != NEWT_OK) return;
  const pair *p = &j->pairs[j->first[k]];
  size_t np = j->first[k + 1] - j->first[k];
  const ckpt_chunk *c = &p->t->chunks[p->chunk];
  size_t es = newt_dtype_size(p->t->dtype);
  int64_t pos;
  void *direct = NULL;
  if (np == 1 && newt_slice_contiguous_in(p->t->shape, &c->slice, &j->reqs[p->req].slice, &pos))
    direct = (uint8_t *)j->reqs[p->req].out + (size_t)pos * es;
  const uint8_t *raw;
  newt_result_t res = read_chunk(j->r, worker, p->t, p->chunk, direct, &raw);
  if (res != NEWT_OK) {
    ckpt_job_err_set(&j->err, res);
    return;
  }
  for (size_t i = 0; i < np; i++) {
    const ckpt_request *q = &j->reqs[p[i].req];
    int64_t n = direct ? newt_slice_numel(&c->slice)
                       : newt_slice_copy(p->t->shape, es, &q->slice, q->out, &c->slice, raw);
    atomic_fetch_add(&j->copied[p[i].req], n);
  }
}

static int pair_cmp(const void *a, const void *b) {
  const pair *x = a, *y = b;
  if (x->t != y->t) return x->t < y->t ? -1 : 1;
  if (x->chunk != y->chunk) return x->chunk < y->chunk ? -1 : 1;
  return x->req < y->req ? -1 : x->req > y->req;
}

/* Checks a request against the manifest. */
static newt_result_t check_request(const ckpt_reader *r, const ckpt_request *q, size_t i, const ckpt_tensor **out) {
  const ckpt_tensor *t = ckpt_manifest_find(&r->m, q->t.name ? q->t.name : "");
  if (!t)
    return NEWT_ERR(NEWT_ERR_NOTFOUND, "%s: request %zu: no tensor \"%s\" in the checkpoint", r->stepdir, i,
                    q->t.name ? q->t.name : "");
  int same = t->dtype == q->t.dtype && t->ndim == q->t.ndim;
  for (int k = 0; same && k < t->ndim; k++) same = t->shape[k] == q->t.shape[k];
  if (!same) {
    char a[200], b[200];
    ckpt_shape_str(t->ndim, t->shape, a, sizeof a);
    ckpt_shape_str(q->t.ndim, q->t.shape, b, sizeof b);
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: tensor \"%s\" is %s %s in the checkpoint, requested as %s %s",
                    r->stepdir, t->name, newt_dtype_name(t->dtype), a, newt_dtype_name(q->t.dtype), b);
  }
  char what[CKPT_MAX_NAME + 64];
  snprintf(what, sizeof what, "request %zu (\"%s\")", i, t->name);
  NEWT_CHECK(newt_slice_check(&q->slice, &q->t, what));
  if (!q->out) return NEWT_ERR(NEWT_ERR_INVALID, "%s: out is NULL", what);
  *out = t;
  return NEWT_OK;
}

static newt_result_t check_requests(const ckpt_reader *r, const ckpt_request *reqs, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const ckpt_tensor *t;
    NEWT_CHECK(check_request(r, &reqs[i], i, &t));
  }
  return NEWT_OK;
}

static newt_result_t run_requests(ckpt_reader *r, const ckpt_request *reqs, size_t n) {
  read_job j = {.r = r, .reqs = reqs};
  size_t np = 0, cap = 0;
  newt_result_t res = NEWT_OK;
  for (size_t i = 0; i < n && res == NEWT_OK; i++) {
    const ckpt_tensor *t;
    res = check_request(r, &reqs[i], i, &t);
    for (size_t c = 0; res == NEWT_OK && c < t->nchunks; c++) {
      if (!newt_slices_may_overlap(&t->chunks[c].slice, &reqs[i].slice)) continue;
      res = CKPT_RESERVE(j.pairs, cap, np);
      if (res != NEWT_OK) break;
      j.pairs[np++] = (pair){t, c, i};
    }
  }
  if (res == NEWT_OK && np > 1) qsort(j.pairs, np, sizeof *j.pairs, pair_cmp);
  size_t nitems = 0;
  if (res == NEWT_OK) {
    j.first = malloc((np + 1) * sizeof *j.first);
    j.copied = calloc(n ? n : 1, sizeof *j.copied);
    if (!j.first || !j.copied) res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory planning reads");
  }
  if (res == NEWT_OK) {
    for (size_t k = 0; k < np; k++)
      if (k == 0 || j.pairs[k].t != j.pairs[k - 1].t || j.pairs[k].chunk != j.pairs[k - 1].chunk)
        j.first[nitems++] = k;
    j.first[nitems] = np;
    atomic_store(&j.err.code, NEWT_OK);
    ckpt_pool_run(r->pool, nitems, read_one, &j);
    res = ckpt_job_err_raise(&j.err);
  }
  for (size_t i = 0; res == NEWT_OK && i < n; i++)
    if (atomic_load(&j.copied[i]) != newt_slice_numel(&reqs[i].slice))
      res = NEWT_ERR(NEWT_ERR_CORRUPT, "%s: request %zu (\"%s\"): the chunks hold %lld of its %lld elements",
                     r->stepdir, i, reqs[i].t.name, (long long)atomic_load(&j.copied[i]),
                     (long long)newt_slice_numel(&reqs[i].slice));
  free(j.pairs);
  free(j.first);
  free(j.copied);
  return res;
}

newt_result_t ckpt_read_slices(ckpt_reader *r, const ckpt_request *reqs, size_t n) {
  return run_requests(r, reqs, n);
}

newt_result_t ckpt_read_slice(ckpt_reader *r, const newt_tensor_desc *t, const newt_slice *slice, void *out) {
  ckpt_request q = {.t = *t, .out = out};
  if (slice) q.slice = *slice;
  else newt_slice_whole(&q.slice, t);
  return run_requests(r, &q, 1);
}

newt_result_t ckpt_load_checked(const char *dir, int64_t max_step, int threads, const ckpt_request *reqs,
                                size_t n, ckpt_state_check_fn check, void *ctx, ckpt_loaded *out) {
  return ckpt_load_keyed(dir, max_step, threads, reqs, n, check, ctx, NULL, out);
}

newt_result_t ckpt_load_keyed(const char *dir, int64_t max_step, int threads, const ckpt_request *reqs, size_t n,
                              ckpt_state_check_fn check, void *ctx, const ckpt_key *key, ckpt_loaded *out) {
  memset(out, 0, sizeof *out);
  out->step = -1;
  int64_t *steps = NULL;
  size_t ns = 0;
  int dirfd;
  NEWT_CHECK(open_dir(dir, &dirfd));
  newt_result_t res = dirfd >= 0 ? ckpt_scan_steps(dirfd, dir, &steps, &ns) : NEWT_OK;
  char first_err[1024] = "";
  int fallbacks = 0, fd;
  for (size_t i = ns; res == NEWT_OK && i-- > 0;) {
    if (max_step >= 0 && steps[i] > max_step) continue;
    if ((fd = committed_step(dirfd, dir, steps[i])) < 0) continue;
    out->committed++;
    char sd[4200];
    ckpt_step_dirname(sd, sizeof sd, dir, steps[i]);
    ckpt_reader *r = NULL;
    newt_result_t rr = open_fd(&r, fd, sd, threads, key); /* the one parse of this manifest */
    if (rr == NEWT_ERR_AUTH) {
      out->refused++;
      if (!out->refused_why[0]) snprintf(out->refused_why, sizeof out->refused_why, "%s", newt_errmsg());
    }
    if (rr == NEWT_OK) {
      /* A state the caller refuses, or a request that does not fit the checkpoint, is the
       * caller's error: no fallback. */
      if (check) res = check(ctx, steps[i], ckpt_reader_state(r));
      if (res == NEWT_OK) res = check_requests(r, reqs, n);
      if (res != NEWT_OK) {
        ckpt_close(r);
        break;
      }
      rr = run_requests(r, reqs, n);
    }
    if (rr == NEWT_OK) {
      out->step = steps[i];
      out->state = r->m.state; /* moved: the reader's parse is the only one */
      r->m.state = NULL;
      out->fallbacks = fallbacks;
      ckpt_close(r);
      free(steps);
      close(dirfd);
      if (fallbacks) NEWT_WARN(CKPT, "loaded step %lld after skipping %d newer checkpoint(s)", (long long)out->step, fallbacks);
      return NEWT_OK;
    }
    ckpt_close(r);
    NEWT_WARN(CKPT, "checkpoint %s is unusable, falling back to the previous one: %s", sd, newt_errmsg());
    if (!first_err[0]) snprintf(first_err, sizeof first_err, "; newest failure: %s", newt_errmsg());
    fallbacks++;
  }
  free(steps);
  if (dirfd >= 0) close(dirfd);
  NEWT_CHECK(res);
  return NEWT_ERR(NEWT_ERR_NOTFOUND, "no committed checkpoint%s in %s reads back whole%s",
                  max_step >= 0 ? " at or before the asked step" : "", dir, first_err);
}

newt_result_t ckpt_load(const char *dir, int64_t max_step, int threads, const ckpt_request *reqs, size_t n,
                        ckpt_loaded *out) {
  return ckpt_load_checked(dir, max_step, threads, reqs, n, NULL, NULL, out);
}

newt_result_t ckpt_verify(const char *stepdir, ckpt_report_fn report, void *ctx, ckpt_verify_result *vr) {
  memset(vr, 0, sizeof *vr);
  ckpt_reader *r = NULL;
  newt_result_t res = ckpt_open_path(&r, stepdir, 1);
  if (res != NEWT_OK) {
    if (report) report(ctx, newt_errmsg());
    vr->bad = 1;
    return res;
  }
  for (size_t f = 0; f < r->m.nfiles; f++) {
    int fd;
    vr->files++;
    if (file_fd(r, (uint32_t)f, &fd) != NEWT_OK) {
      if (report) report(ctx, newt_errmsg());
      vr->bad++;
    }
  }
  for (size_t i = 0; i < r->m.ntensors; i++) {
    const ckpt_tensor *t = &r->m.tensors[i];
    for (size_t j = 0; j < t->nchunks; j++) {
      if (r->fds[t->chunks[j].file] < 0) continue; /* the file was reported already */
      const uint8_t *raw;
      vr->chunks++;
      vr->stored_bytes += t->chunks[j].stored;
      vr->raw_bytes += t->chunks[j].raw;
      if (read_chunk(r, 0, t, j, NULL, &raw) != NEWT_OK) {
        if (report) report(ctx, newt_errmsg());
        vr->bad++;
      }
    }
  }
  ckpt_close(r);
  if (vr->bad) return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: %zu problem(s) found", stepdir, vr->bad);
  return NEWT_OK;
}

newt_result_t ckpt_sign(const char *stepdir, const ckpt_key *key) {
  if (!key || !key->has) return NEWT_ERR(NEWT_ERR_INVALID, "ckpt_sign %s: no key", stepdir);
  ckpt_verify_result vr;
  NEWT_CHECK(ckpt_verify(stepdir, NULL, NULL, &vr));
  char *sd = NULL, *text = NULL;
  size_t len = 0;
  int fd = -1;
  ckpt_manifest m;
  memset(&m, 0, sizeof m);
  newt_result_t res = open_step_path(stepdir, &sd, &fd);
  if (res == NEWT_OK) res = ckpt_manifest_load(fd, sd, "MANIFEST", 0, &m);
  if (res == NEWT_OK) res = ckpt_manifest_encode_keyed(&m, key, &text, &len);
  if (res == NEWT_OK) res = newt_fs_write_atomic_at(fd, sd, "MANIFEST", text, len);
  if (res == NEWT_OK)
    NEWT_INFO(CKPT, "%s: its %zu chunks read back whole; its MANIFEST now proves this key", sd, vr.chunks);
  ckpt_manifest_free(&m);
  free(text);
  if (fd >= 0) close(fd);
  free(sd);
  return res;
}

/* The manifest's shard files and tensors as ckpt_info holds them (names moved out of m). */
static void info_take(ckpt_manifest *m, ckpt_info *in) {
  for (size_t f = 0; f < m->nfiles; f++) {
    const ckpt_file *mf = &m->files[f];
    in->files[f] = (ckpt_info_file){.rank = mf->rank, .name = mf->name, .bytes = mf->bytes,
                                    .raw_bytes = mf->raw_bytes, .layout = mf->layout};
    m->files[f].name = NULL;
    in->file_bytes += mf->bytes;
  }
  for (size_t i = 0; i < m->ntensors; i++) {
    ckpt_tensor *t = &m->tensors[i];
    ckpt_info_tensor *x = &in->tensors[i];
    *x = (ckpt_info_tensor){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .chunks = t->nchunks};
    memcpy(x->shape, t->shape, sizeof x->shape);
    t->name = NULL;
    for (size_t j = 0; j < t->nchunks; j++) {
      x->raw_bytes += t->chunks[j].raw;
      x->stored_bytes += t->chunks[j].stored;
    }
    in->raw_bytes += x->raw_bytes;
    in->stored_bytes += x->stored_bytes;
  }
}

newt_result_t ckpt_inspect(const char *stepdir, ckpt_info *out) {
  memset(out, 0, sizeof *out);
  ckpt_manifest m;
  char *sd = NULL;
  int fd;
  newt_result_t res = open_step_path(stepdir, &sd, &fd);
  if (res == NEWT_OK) {
    res = ckpt_manifest_load(fd, sd, "MANIFEST", 0, &m);
    close(fd);
  }
  free(sd);
  NEWT_CHECK(res);
  out->path = newt_strdup(stepdir);
  out->files = calloc(m.nfiles ? m.nfiles : 1, sizeof *out->files);
  out->tensors = calloc(m.ntensors ? m.ntensors : 1, sizeof *out->tensors);
  if (!out->path || !out->files || !out->tensors) {
    ckpt_manifest_free(&m);
    ckpt_info_free(out);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory describing %s", stepdir);
  }
  out->step = m.step;
  out->nranks = m.nranks;
  out->attempt = m.attempt;
  out->created_ms = m.created_ms;
  out->nfiles = m.nfiles;
  out->ntensors = m.ntensors;
  info_take(&m, out);
  out->ratio = out->stored_bytes ? (double)out->raw_bytes / (double)out->stored_bytes : 1.0;
  out->state = m.state; /* moved */
  m.state = NULL;
  ckpt_manifest_free(&m);
  return NEWT_OK;
}

void ckpt_info_free(ckpt_info *in) {
  if (!in) return;
  for (size_t f = 0; in->files && f < in->nfiles; f++) free(in->files[f].name);
  for (size_t i = 0; in->tensors && i < in->ntensors; i++) free(in->tensors[i].name);
  free(in->files);
  free(in->tensors);
  free(in->path);
  cJSON_Delete(in->state);
  memset(in, 0, sizeof *in);
}
