/* The per-rank saver: collects the slices a rank stores, cuts them into chunks, compresses
 * them on a thread pool and writes them to the rank's shard file, then publishes the
 * rank's index and (on the committing rank) commits the step.
 *
 * Asynchronous saves: ckpt_save_end copies every slice into the staging memory (blocks
 * kept from save to save, so a save allocates nothing once warm; the copy runs on the pool
 * too) and hands the save to a background thread. That copy is all the caller waits for.
 * The blocks are the caller's when it gives an allocator (opts.staging_alloc: a device's
 * pinned memory, which its caller keeps from saver to saver), else page-aligned and zeroed.
 * One save is in flight at most: ckpt_save_begin waits for it or skips, by setting.
 *
 * Writing: each compression thread claims the next chunk and encodes it (codec.c) into its
 * own segment buffer, after the chunks already there; when the next chunk might not fit,
 * it takes the next free file offset under a lock and writes the segment there as one
 * block padded to 4 KiB (small tensors share blocks, large chunks fill them). The shard
 * file is opened with O_DIRECT where the filesystem allows it (the page cache of a
 * training host stays for training; on VMs, fresh page-cache pages are also slow to fault
 * in), otherwise buffered, with the writeback of each block started at once
 * (sync_file_range). While one thread waits for its write the other compresses, so with
 * two threads the disk stays busy.
 *
 * A failure stops the other threads at their next chunk, removes the shard file and
 * leaves a `.failed` marker so that the committer stops waiting; the previous checkpoint
 * stays the newest.
 *
 * A saver holds its writer's lock of DIR (lock.c) from ckpt_saver_init to ckpt_saver_free:
 * one writer per directory. A shard that the step's committed manifest names is never
 * replaced under it: a save of a committed step by the same attempt (a run started over)
 * removes that manifest first, so the step is uncommitted, never committed and half gone. */
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
#include "common/param.h"
#include "common/strutil.h"
#include "common/sys.h"

/* Tests: a save, once written (and committed), stays in flight until the next one is asked
 * for (ckpt_save_begin: with skip_if_busy it is skipped, deterministically), waited for,
 * aborted or the saver freed -- a save too slow to keep up, made certain. */
NEWT_PARAM(CkptHold, "NEWT_CKPT_HOLD", 0)

#define STAGING_MIN ((size_t)1 << 20)
#define SNAPSHOT_PIECE ((size_t)4 << 20)

typedef struct entry {
  newt_tensor_desc t; /* t.name is owned */
  newt_slice slice;
  const void *src;    /* caller's memory (NULL for a reservation) */
  void *staged;       /* async: the snapshot */
  size_t bytes;
} entry;

typedef struct piece {
  size_t entry;
  newt_slice slice;
  const uint8_t *data;
  size_t bytes;
  ckpt_chunk meta;
} piece;

typedef struct block {
  uint8_t *p;
  size_t cap;
} block;

/* A compression thread's segment: chunks encoded one after another into an aligned
 * buffer, written out as one block when the next chunk might not fit. */
typedef struct segment {
  ckpt_codec codec;
  uint8_t *buf;
  size_t cap, len;
  size_t *pending; /* pieces in the buffer; their meta.offset is relative until written */
  size_t npending, pcap;
} segment;

struct ckpt_saver {
  char *dir;
  ckpt_layout layout;
  char *writer;    /* the writer it belongs to, and its lock of DIR (lock.c) */
  ckpt_lock *lock;
  int rank, nranks, level, skip_if_busy, commit, keep;
  size_t chunk_bytes;
  int64_t busy_wait_ms, commit_timeout_ms;
  uint64_t attempt;
  ckpt_key key; /* opts.key's (has 0: none) */

  ckpt_pool *pool;
  segment *segs; /* one per pool worker */
  int nsegs;

  block *blocks;
  size_t nblocks, cur_block, cur_used;
  void *(*ext_alloc)(void *ctx, size_t bytes); /* the caller's staging allocator (NULL: ours) */
  size_t hint;                                  /* opts.staging_hint */
  void (*ext_free)(void *ctx, void *p);
  void *ext_ctx;

  /* the save being built (between begin and end) or written */
  int building, async;
  int64_t step;
  uint64_t t_begin;
  entry *entries;
  size_t nentries, ecap;
  cJSON *state;       /* the training state (the committer's), a copy of the caller's */
  piece *pieces;
  size_t npieces, pcap;

  /* writing */
  pthread_mutex_t off_mu;
  uint64_t next_off;
  int fd;
  atomic_int direct;  /* fd is O_DIRECT */
  uint8_t *hdr_block; /* CKPT_ALIGN bytes, aligned */
  char shard_path[4300];
  int shard_made;     /* this save created its shard file (removed when the save fails) */
  ckpt_job_err err;

  /* the background thread and the status it reports */
  pthread_t bg;
  int bg_started, bg_job, bg_stop, running;
  int release; /* NEWT_CKPT_HOLD: the save in flight may end now */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  atomic_int abort;
  ckpt_save_status st;
};

/* ---- staging memory -------------------------------------------------------------------- */

static void staging_free_block(ckpt_saver *s, void *p) {
  if (s->ext_free) s->ext_free(s->ext_ctx, p);
  else free(p);
}

static newt_result_t staging_add_block(ckpt_saver *s, size_t cap) {
  block *nb = realloc(s->blocks, (s->nblocks + 1) * sizeof *nb);
  NEWT_CHECK_ALLOC(nb);
  s->blocks = nb;
  uint8_t *p = NULL;
  if (s->ext_alloc) { /* the caller's memory, ready to use (pinned memory is resident already) */
    if (!(p = s->ext_alloc(s->ext_ctx, cap)))
      return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: %zu bytes of checkpoint staging memory (staging_alloc)", cap);
    if ((uintptr_t)p % CKPT_STAGING_ALIGN != 0) {
      staging_free_block(s, p);
      return NEWT_ERR(NEWT_ERR_INVALID, "ckpt saver: staging_alloc gave %p, not aligned to %d bytes", (void *)p,
                      CKPT_STAGING_ALIGN);
    }
  } else {
    if (posix_memalign((void **)&p, 4096, cap) != 0 || !p)
      return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: %zu bytes of checkpoint staging memory", cap);
    memset(p, 0, cap); /* fault the pages in now, not during a snapshot */
  }
  s->blocks[s->nblocks++] = (block){p, cap};
  return NEWT_OK;
}

static newt_result_t staging_alloc(ckpt_saver *s, size_t bytes, void **out) {
  bytes = (bytes + CKPT_STAGING_ALIGN - 1) & ~(size_t)(CKPT_STAGING_ALIGN - 1);
  while (s->cur_block < s->nblocks && s->blocks[s->cur_block].cap - s->cur_used < bytes) {
    s->cur_block++;
    s->cur_used = 0;
  }
  if (s->cur_block == s->nblocks) { /* grow geometrically: a few blocks hold any state */
    size_t total = 0;
    for (size_t i = 0; i < s->nblocks; i++) total += s->blocks[i].cap;
    size_t cap = bytes > total ? bytes : total;
    if (!s->nblocks && s->hint >= cap) cap = s->hint; /* the whole save in one block, as sized */
    else if (cap < STAGING_MIN) cap = STAGING_MIN;
    NEWT_CHECK(staging_add_block(s, cap));
    s->cur_used = 0;
  }
  *out = s->blocks[s->cur_block].p + s->cur_used;
  s->cur_used += bytes;
  return NEWT_OK;
}

void *ckpt_saver_staging(ckpt_saver *s, size_t *bytes) {
  *bytes = s->nblocks ? s->blocks[0].cap : 0;
  return s->nblocks ? s->blocks[0].p : NULL;
}

/* ---- init / free ----------------------------------------------------------------------- */

static void *bg_main(void *arg);

newt_result_t ckpt_saver_init(ckpt_saver **out, const ckpt_saver_opts *o) {
  if (!o->dir || !*o->dir) return NEWT_ERR(NEWT_ERR_INVALID, "ckpt saver: dir is empty");
  if (o->nranks < 1 || o->nranks > CKPT_MAX_RANKS || o->rank < 0 || o->rank >= o->nranks)
    return NEWT_ERR(NEWT_ERR_INVALID, "ckpt saver: rank %d of %d ranks", o->rank, o->nranks);
  if (o->chunk_bytes && (o->chunk_bytes < 64 || o->chunk_bytes > CKPT_MAX_CHUNK / 4))
    return NEWT_ERR(NEWT_ERR_INVALID, "ckpt saver: chunk_bytes %zu, expected 64 to %llu", o->chunk_bytes,
                    (unsigned long long)(CKPT_MAX_CHUNK / 4));
  if (o->level > ZSTD_maxCLevel() || (o->level < 0 && o->level != CKPT_LEVEL_RAW))
    return NEWT_ERR(NEWT_ERR_INVALID, "ckpt saver: zstd level %d, expected 1 to %d (or CKPT_LEVEL_RAW)", o->level,
                    ZSTD_maxCLevel());
  if (!o->staging_alloc != !o->staging_free)
    return NEWT_ERR(NEWT_ERR_INVALID, "ckpt saver: staging_alloc and staging_free are given together or not at all");
  if (o->layout.has & ~(unsigned)CKPT_LAYOUT_ALL)
    return NEWT_ERR(NEWT_ERR_INVALID, "ckpt saver: layout.has 0x%x names fields other than CKPT_LAYOUT_ALL's",
                    o->layout.has);
  ckpt_saver *s = calloc(1, sizeof *s);
  NEWT_CHECK_ALLOC(s);
  s->dir = newt_strdup(o->dir);
  s->layout = o->layout;
  s->rank = o->rank;
  s->nranks = o->nranks;
  s->level = o->level > 0 ? o->level : o->level == CKPT_LEVEL_RAW ? 0 : 1;
  s->skip_if_busy = o->skip_if_busy;
  s->commit = o->commit;
  s->keep = o->keep ? o->keep : 3;
  s->chunk_bytes = o->chunk_bytes ? o->chunk_bytes : ((size_t)4 << 20);
  s->busy_wait_ms = o->busy_wait_ms > 0 ? o->busy_wait_ms : 600000;
  s->commit_timeout_ms = o->commit_timeout_ms > 0 ? o->commit_timeout_ms : 600000;
  s->attempt = o->attempt;
  if (o->key) s->key = *o->key;
  s->ext_alloc = o->staging_alloc;
  s->hint = o->staging_hint;
  s->ext_free = o->staging_free;
  s->ext_ctx = o->staging_ctx;
  s->fd = -1;
  s->st.step = -1;
  s->st.last_ok_step = -1;
  if (s->attempt == 0 && s->nranks == 1) {
    while (s->attempt == 0) newt_random_bytes(&s->attempt, sizeof s->attempt);
  }
  char writer[512];
  if (o->writer) snprintf(writer, sizeof writer, "%s", o->writer);
  else ckpt_writer_default(writer, sizeof writer, s->nranks, s->attempt);
  s->writer = newt_strdup(writer);
  pthread_mutex_init(&s->off_mu, NULL);
  pthread_mutex_init(&s->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  int threads = o->threads > 0 ? o->threads : 2;
  newt_result_t r = NEWT_OK;
  if (!s->dir || !s->writer) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: ckpt saver");
  if (r == NEWT_OK) r = ckpt_lock_take(s->dir, s->writer, &s->lock); /* first: a refused saver takes nothing */
  if (r == NEWT_OK) r = ckpt_pool_init(&s->pool, threads);
  if (r == NEWT_OK && !(s->segs = calloc((size_t)threads, sizeof *s->segs)))
    r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: ckpt saver");
  if (r == NEWT_OK) s->nsegs = threads;
  for (int i = 0; r == NEWT_OK && i < s->nsegs; i++)
    r = ckpt_buf_grow(&s->segs[i].buf, &s->segs[i].cap, 2 * (CKPT_CHUNK_HDR + s->chunk_bytes) + CKPT_ALIGN);
  if (r == NEWT_OK && o->staging_bytes) r = staging_add_block(s, o->staging_bytes);
  if (r == NEWT_OK && posix_memalign((void **)&s->hdr_block, CKPT_ALIGN, CKPT_ALIGN) != 0)
    r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: ckpt saver");
  if (r == NEWT_OK) {
    if (pthread_create(&s->bg, NULL, bg_main, s) != 0) r = NEWT_ERR(NEWT_ERR_SYS, "cannot start the checkpoint thread");
    else s->bg_started = 1;
  }
  if (r != NEWT_OK) {
    ckpt_saver_free(s);
    return r;
  }
  *out = s;
  return NEWT_OK;
}

static void clear_entries(ckpt_saver *s) {
  for (size_t i = 0; i < s->nentries; i++) free((char *)s->entries[i].t.name);
  s->nentries = 0;
}

/* NEWT_CKPT_HOLD: lets the save in flight end. Called with mu held. */
static void release_locked(ckpt_saver *s) {
  s->release = 1;
  pthread_cond_broadcast(&s->cv);
}

void ckpt_saver_free(ckpt_saver *s) {
  if (!s) return;
  if (s->bg_started) {
    pthread_mutex_lock(&s->mu);
    release_locked(s);
    while (s->running) pthread_cond_wait(&s->cv, &s->mu);
    s->bg_stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->bg, NULL);
  }
  ckpt_lock_release(s->lock); /* nothing of this saver writes any more */
  ckpt_pool_free(s->pool);
  for (int i = 0; s->segs && i < s->nsegs; i++) {
    ckpt_codec_free(&s->segs[i].codec);
    free(s->segs[i].buf);
    free(s->segs[i].pending);
  }
  free(s->segs);
  for (size_t i = 0; i < s->nblocks; i++) staging_free_block(s, s->blocks[i].p);
  free(s->blocks);
  clear_entries(s);
  free(s->entries);
  free(s->pieces);
  free(s->hdr_block);
  cJSON_Delete(s->state);
  free(s->dir);
  free(s->writer);
  pthread_mutex_destroy(&s->off_mu);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}

/* ---- building a save -------------------------------------------------------------------- */

static int wait_idle(ckpt_saver *s, newt_deadline_t deadline) {
  while (s->running) {
    if (deadline == NEWT_DEADLINE_NONE) {
      pthread_cond_wait(&s->cv, &s->mu);
      continue;
    }
    if (newt_deadline_passed(deadline)) return 0;
    struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000u), .tv_nsec = (long)(deadline % 1000000000u)};
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
  }
  return 1;
}

newt_result_t ckpt_save_begin(ckpt_saver *s, int64_t step, int async, int *started) {
  *started = 0;
  if (step < 0) return NEWT_ERR(NEWT_ERR_INVALID, "ckpt_save_begin: step %lld is negative", (long long)step);
  if (s->building) return NEWT_ERR(NEWT_ERR_INVALID, "ckpt_save_begin: the save of step %lld was not ended",
                                   (long long)s->step);
  uint64_t t0 = newt_now_ns();
  pthread_mutex_lock(&s->mu);
  if (s->running && s->skip_if_busy) {
    s->st.saves_skipped++;
    release_locked(s);
    pthread_mutex_unlock(&s->mu);
    NEWT_DEBUG(CKPT, "step %lld: a save is in flight, skipping this one", (long long)step);
    return NEWT_OK;
  }
  release_locked(s);
  int idle = wait_idle(s, newt_deadline_in_ms(s->busy_wait_ms));
  int64_t busy_step = s->st.step;
  pthread_mutex_unlock(&s->mu);
  if (!idle)
    return NEWT_ERR(NEWT_ERR_TIMEOUT, "ckpt_save_begin(step %lld): the save of step %lld is still running "
                    "after %lld ms", (long long)step, (long long)busy_step, (long long)s->busy_wait_ms);
  clear_entries(s);
  s->cur_block = 0;
  s->cur_used = 0;
  s->building = 1;
  s->async = async;
  s->step = step;
  s->t_begin = t0;
  atomic_store(&s->abort, 0);
  *started = 1;
  return NEWT_OK;
}

static newt_result_t add_entry(ckpt_saver *s, const newt_tensor_desc *t, const newt_slice *slice,
                               const void *data, void **reserved) {
  if (!s->building) return NEWT_ERR(NEWT_ERR_INVALID, "ckpt_save_add: no save begun");
  if (!t->name || !*t->name || strlen(t->name) > CKPT_MAX_NAME)
    return NEWT_ERR(NEWT_ERR_INVALID, "ckpt_save_add: tensor name empty or longer than %d bytes", CKPT_MAX_NAME);
  for (const char *p = t->name; *p; p++)
    if ((unsigned char)*p < 0x20)
      return NEWT_ERR(NEWT_ERR_INVALID, "ckpt_save_add: control character in tensor name \"%s\"", t->name);
  if ((unsigned)t->dtype >= NEWT_DTYPE__COUNT)
    return NEWT_ERR(NEWT_ERR_INVALID, "ckpt_save_add: tensor \"%s\": unknown dtype %d", t->name, (int)t->dtype);
  for (int i = 0; i < t->ndim && i < NEWT_SLICE_MAX_DIMS; i++)
    if (t->shape[i] < 0)
      return NEWT_ERR(NEWT_ERR_INVALID, "ckpt_save_add: tensor \"%s\": negative shape", t->name);
  newt_slice whole;
  if (!slice) {
    newt_slice_whole(&whole, t);
    slice = &whole;
  }
  int empty = t->ndim >= 1 && t->ndim <= NEWT_SLICE_MAX_DIMS && newt_shape_numel(t->ndim, t->shape) == 0;
  if (!empty) {
    char what[CKPT_MAX_NAME + 32];
    snprintf(what, sizeof what, "ckpt_save_add(\"%s\")", t->name);
    NEWT_CHECK(newt_slice_check(slice, t, what));
  }
  NEWT_CHECK(CKPT_RESERVE(s->entries, s->ecap, s->nentries));
  entry *e = &s->entries[s->nentries];
  memset(e, 0, sizeof *e);
  e->t = *t;
  e->t.name = newt_strdup(t->name);
  NEWT_CHECK_ALLOC(e->t.name);
  e->slice = *slice;
  e->bytes = empty ? 0 : (size_t)newt_slice_numel(slice) * newt_dtype_size(t->dtype);
  e->src = data;
  s->nentries++;
  if ((s->async || reserved) && e->bytes) {
    newt_result_t r = staging_alloc(s, e->bytes, &e->staged);
    if (r != NEWT_OK) {
      free((char *)e->t.name);
      s->nentries--;
      return r;
    }
  }
  if (reserved) *reserved = e->staged;
  return NEWT_OK;
}

newt_result_t ckpt_save_add(ckpt_saver *s, const newt_tensor_desc *t, const newt_slice *slice, const void *data) {
  if (!data && t->ndim >= 1 && t->ndim <= NEWT_SLICE_MAX_DIMS && newt_shape_numel(t->ndim, t->shape) > 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "ckpt_save_add(\"%s\"): data is NULL", t->name ? t->name : "?");
  return add_entry(s, t, slice, data, NULL);
}

newt_result_t ckpt_save_reserve(ckpt_saver *s, const newt_tensor_desc *t, const newt_slice *slice, void **dst) {
  if (s->building && !s->async)
    return NEWT_ERR(NEWT_ERR_INVALID, "ckpt_save_reserve(\"%s\"): only for asynchronous saves", t->name ? t->name : "?");
  return add_entry(s, t, slice, NULL, dst);
}

/* ---- writing ------------------------------------------------------------------------------ */

/* Writes one block at off. With O_DIRECT refused by the filesystem for this write (EINVAL),
 * the file goes on buffered. */
static newt_result_t write_block(ckpt_saver *s, const uint8_t *buf, size_t len, uint64_t off) {
  while (len > 0) {
    ssize_t w = pwrite(s->fd, buf, len, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EINVAL && atomic_load(&s->direct)) {
      pthread_mutex_lock(&s->off_mu);
      if (atomic_load(&s->direct)) {
        int fl = fcntl(s->fd, F_GETFL);
        if (fl != -1 && fcntl(s->fd, F_SETFL, fl & ~O_DIRECT) == 0) atomic_store(&s->direct, 0);
      }
      pthread_mutex_unlock(&s->off_mu);
      if (!atomic_load(&s->direct)) continue;
    }
    if (w <= 0) {
      int e = w == 0 ? ENOSPC : errno;
      if (e == ENOSPC || e == EDQUOT) return NEWT_ERR(NEWT_ERR_NOSPACE, "write %s: %s", s->shard_path, strerror(e));
      return NEWT_ERR(NEWT_ERR_SYS, "write %s: %s", s->shard_path, strerror(e));
    }
    buf += w;
    off += (uint64_t)w;
    len -= (size_t)w;
  }
  return NEWT_OK;
}

/* Writes a segment out at the next free offset of the file (padded to CKPT_ALIGN, which
 * O_DIRECT needs) and gives its chunks their file offsets. */
static newt_result_t flush_segment(ckpt_saver *s, segment *g) {
  if (g->len == 0) return NEWT_OK;
  size_t blk = ckpt_align_up(g->len);
  memset(g->buf + g->len, 0, blk - g->len);
  pthread_mutex_lock(&s->off_mu);
  uint64_t off = s->next_off;
  s->next_off += blk;
  pthread_mutex_unlock(&s->off_mu);
  NEWT_CHECK(write_block(s, g->buf, blk, off));
  /* Buffered: start the writeback now, so the fsync at the end has little left to wait for. */
  if (!atomic_load(&s->direct)) sync_file_range(s->fd, (off_t)off, (off_t)blk, SYNC_FILE_RANGE_WRITE);
  for (size_t k = 0; k < g->npending; k++) s->pieces[g->pending[k]].meta.offset += off;
  g->len = 0;
  g->npending = 0;
  return NEWT_OK;
}

static void write_piece(void *ctx, size_t i, int worker) {
  ckpt_saver *s = ctx;
  if (atomic_load(&s->err.code) != NEWT_OK) return;
  if (atomic_load(&s->abort)) {
    ckpt_job_err_set(&s->err, NEWT_ERR(NEWT_ERR_ABORTED, "save of step %lld aborted", (long long)s->step));
    return;
  }
  piece *p = &s->pieces[i];
  const entry *e = &s->entries[p->entry];
  segment *g = &s->segs[worker];
  newt_result_t r = NEWT_OK;
  if (g->len + CKPT_CHUNK_HDR + p->bytes > g->cap) r = flush_segment(s, g);
  if (r == NEWT_OK) r = CKPT_RESERVE(g->pending, g->pcap, g->npending);
  ckpt_chunk_hdr h;
  if (r == NEWT_OK) r = ckpt_chunk_encode(&g->codec, p->data, p->bytes, e->t.dtype, s->level, &h, g->buf + g->len);
  if (r != NEWT_OK) {
    ckpt_job_err_set(&s->err, r);
    return;
  }
  p->meta = (ckpt_chunk){.file = 0, .codec = h.codec, .filter = h.filter, .offset = g->len, .stored = h.stored,
                         .raw = h.raw, .xxh_raw = h.xxh_raw, .xxh_stored = h.xxh_stored, .slice = p->slice};
  g->pending[g->npending++] = i;
  g->len += CKPT_CHUNK_HDR + h.stored;
  int64_t delay = newt_param_CkptTestChunkDelayMs();
  if (delay > 0) {
    r = flush_segment(s, g); /* a slowed save shows its progress on disk */
    if (r != NEWT_OK) ckpt_job_err_set(&s->err, r);
    newt_sleep_ms(delay);
  }
}

/* Cuts every entry into chunks of at most chunk_bytes (whole elements). */
static newt_result_t make_pieces(ckpt_saver *s) {
  s->npieces = 0;
  for (size_t i = 0; i < s->nentries; i++) {
    const entry *e = &s->entries[i];
    if (!e->bytes) continue;
    size_t es = newt_dtype_size(e->t.dtype);
    int64_t per = (int64_t)(s->chunk_bytes / es);
    if (per < 1) per = 1;
    const uint8_t *data = e->staged ? e->staged : e->src;
    for (int64_t a = e->slice.begin; a < e->slice.end; a += per) {
      int64_t b = a + per < e->slice.end ? a + per : e->slice.end;
      NEWT_CHECK(CKPT_RESERVE(s->pieces, s->pcap, s->npieces));
      piece *p = &s->pieces[s->npieces++];
      p->entry = i;
      p->slice = e->slice;
      p->slice.begin = a;
      p->slice.end = b;
      p->data = data + (size_t)(a - e->slice.begin) * es;
      p->bytes = (size_t)(b - a) * es;
    }
  }
  return NEWT_OK;
}

static newt_result_t write_index(ckpt_saver *s, int stepfd, const char *stepdir, const char *shard_name,
                                 uint64_t raw_bytes) {
  ckpt_manifest m = {.is_index = 1, .step = s->step, .nranks = s->nranks, .rank = s->rank,
                     .attempt = s->attempt, .created_ms = newt_wall_ms()};
  newt_result_t r = NEWT_OK;
  m.files = calloc(1, sizeof *m.files);
  if (!m.files) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: shard index");
  m.nfiles = 1;
  m.files[0] = (ckpt_file){.name = newt_strdup(shard_name), .rank = s->rank, .bytes = s->next_off,
                           .raw_bytes = raw_bytes, .layout = s->layout};
  if (!m.files[0].name) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: shard index");
  /* one tensor per entry (tensor i holds entry i's pieces), merged by name below; empty
   * tensors (no pieces) are listed too, so that the manifest knows them */
  for (size_t i = 0; r == NEWT_OK && i < s->nentries; i++) {
    ckpt_tensor *t;
    r = ckpt_manifest_add_tensor(&m, &s->entries[i].t, &t);
  }
  for (size_t i = 0; r == NEWT_OK && i < s->npieces; i++)
    r = ckpt_tensor_add_chunk(&m.tensors[s->pieces[i].entry], &s->pieces[i].meta);
  if (r == NEWT_OK) r = ckpt_manifest_sort(&m, 1, "shard index");
  char *text = NULL;
  size_t len = 0;
  if (r == NEWT_OK) r = ckpt_manifest_encode_keyed(&m, &s->key, &text, &len);
  ckpt_manifest_free(&m);
  if (r != NEWT_OK) return r;
  char name[64];
  ckpt_index_name(name, sizeof name, s->rank);
  r = newt_fs_write_atomic_at(stepfd, stepdir, name, text, len);
  free(text);
  return r;
}

/* Tells the committer not to wait for this rank (best effort: the disk may be full). */
static void write_failed_marker(ckpt_saver *s, int stepfd, const char *stepdir, const char *msg) {
  char name[64];
  ckpt_failed_name(name, sizeof name, s->rank);
  char *text = newt_asprintf("%016llx\n%s\n", (unsigned long long)s->attempt, msg);
  if (text && newt_fs_write_atomic_at(stepfd, stepdir, name, text, strlen(text)) != NEWT_OK) newt_err_clear();
  free(text);
}

/* Opens DIR (made when missing) and its step directory (made, or a non-directory in its
 * place replaced: files are created in it through the descriptor, never by path). */
static newt_result_t open_step(ckpt_saver *s, int *dirfd, int *stepfd) {
  NEWT_CHECK(newt_fs_dir_open(s->dir, 1, dirfd));
  char parent[4096];
  newt_fs_dirname(s->dir, parent, sizeof parent);
  NEWT_CHECK(newt_fs_fsync_dir(parent)); /* DIR itself may be new */
  NEWT_CHECK(ckpt_step_open(*dirfd, s->dir, s->step, 1, stepfd));
  return newt_fs_fsync_fd(*dirfd, s->dir);
}

/* A committed manifest of the step that names this save's shard (the same rank and attempt:
 * a run started over, its attempts counted from the start again) is removed before the shard
 * is replaced: the step is then uncommitted until this save commits it again, never
 * committed with a file gone. A manifest that does not check out commits nothing. */
static newt_result_t uncommit_if_named(ckpt_saver *s, int stepfd, const char *stepdir, const char *shard) {
  if (!newt_fs_exists_at(stepfd, "MANIFEST")) return NEWT_OK;
  ckpt_manifest m;
  if (ckpt_manifest_load(stepfd, stepdir, "MANIFEST", 0, &m) != NEWT_OK) {
    newt_err_clear();
    return NEWT_OK;
  }
  int named = 0;
  for (size_t f = 0; f < m.nfiles; f++) named |= strcmp(m.files[f].name, shard) == 0;
  ckpt_manifest_free(&m);
  if (!named) return NEWT_OK;
  NEWT_WARN(CKPT, "rank %d: %s/MANIFEST commits step %lld with %s, which this save replaces: the step is "
            "uncommitted until this save commits it again", s->rank, stepdir, (long long)s->step, shard);
  if (unlinkat(stepfd, "MANIFEST", 0) != 0 && errno != ENOENT)
    return NEWT_ERR(NEWT_ERR_SYS, "remove %s/MANIFEST: %s", stepdir, strerror(errno));
  return newt_fs_fsync_fd(stepfd, stepdir);
}

/* Writes this rank's shard and publishes its index. */
static newt_result_t write_shard(ckpt_saver *s, int stepfd, const char *stepdir, const char *shard,
                                 uint64_t *raw_out) {
  char marker[64];
  ckpt_failed_name(marker, sizeof marker, s->rank);
  unlinkat(stepfd, marker, 0); /* a marker of an earlier try of this step */
  NEWT_CHECK(uncommit_if_named(s, stepfd, stepdir, shard));
  NEWT_CHECK(make_pieces(s));
  uint64_t raw = 0;
  for (size_t i = 0; i < s->nentries; i++) raw += s->entries[i].bytes;
  *raw_out = raw;

  /* Created exclusively: a file or link already under the (predictable) name is removed
   * itself, never written through. */
  int direct = newt_param_CkptDirectIo() != 0;
  if (direct && newt_fs_create_at(stepfd, stepdir, shard, O_DIRECT, &s->fd) != NEWT_OK) {
    newt_err_clear(); /* tmpfs and friends refuse O_DIRECT */
    direct = 0;
  }
  if (!direct) NEWT_CHECK(newt_fs_create_at(stepfd, stepdir, shard, 0, &s->fd));
  s->shard_made = 1;
  atomic_store(&s->direct, direct);
  memset(s->hdr_block, 0, CKPT_ALIGN);
  ckpt_shard_hdr_encode(&(ckpt_shard_hdr){.rank = (uint32_t)s->rank, .nranks = (uint32_t)s->nranks,
                                          .step = s->step, .attempt = s->attempt}, s->hdr_block);
  newt_result_t r = write_block(s, s->hdr_block, CKPT_ALIGN, 0);
  s->next_off = CKPT_ALIGN;
  atomic_store(&s->err.code, NEWT_OK);
  uint64_t t0 = newt_now_ns();
  for (int i = 0; i < s->nsegs; i++) s->segs[i].len = s->segs[i].npending = 0;
  if (r == NEWT_OK) {
    ckpt_pool_run(s->pool, s->npieces, write_piece, s);
    r = ckpt_job_err_raise(&s->err);
  }
  for (int i = 0; r == NEWT_OK && i < s->nsegs; i++) r = flush_segment(s, &s->segs[i]);
  uint64_t t1 = newt_now_ns();
  if (r == NEWT_OK && fsync(s->fd) != 0) {
    int e = errno;
    r = NEWT_ERR(e == ENOSPC || e == EDQUOT ? NEWT_ERR_NOSPACE : NEWT_ERR_SYS, "fsync %s: %s", s->shard_path,
                 strerror(e));
  }
  if (close(s->fd) != 0 && r == NEWT_OK) r = NEWT_ERR(NEWT_ERR_SYS, "close %s: %s", s->shard_path, strerror(errno));
  s->fd = -1;
  uint64_t t2 = newt_now_ns();
  if (r == NEWT_OK) r = write_index(s, stepfd, stepdir, shard, raw);
  NEWT_DEBUG(CKPT, "rank %d step %lld: %zu chunks, %llu raw bytes -> %llu: compress+write %.1f ms, fsync %.1f ms, "
             "index %.1f ms", s->rank, (long long)s->step, s->npieces, (unsigned long long)raw,
             (unsigned long long)s->next_off, (double)(t1 - t0) / 1e6, (double)(t2 - t1) / 1e6,
             (double)(newt_now_ns() - t2) / 1e6);
  return r;
}

/* Writes the save; the committer commits it (*step_bytes: the committed step's bytes). */
static newt_result_t run_save(ckpt_saver *s, uint64_t *raw_out, uint64_t *step_bytes) {
  char stepdir[4096], shard[64];
  ckpt_step_dirname(stepdir, sizeof stepdir, s->dir, s->step);
  ckpt_shard_name(shard, sizeof shard, s->rank, s->attempt);
  snprintf(s->shard_path, sizeof s->shard_path, "%s/%s", stepdir, shard);
  int dirfd = -1, stepfd = -1;
  char msg[1024] = "";
  s->shard_made = 0;
  newt_result_t r = open_step(s, &dirfd, &stepfd);
  if (r == NEWT_OK) r = write_shard(s, stepfd, stepdir, shard, raw_out);
  if (r != NEWT_OK) snprintf(msg, sizeof msg, "%s", newt_errmsg());
  if (r != NEWT_OK && stepfd >= 0) {
    if (s->shard_made) unlinkat(stepfd, shard, 0); /* its own, never a file of another save */
    write_failed_marker(s, stepfd, stepdir, msg);
  }
  if (stepfd >= 0) close(stepfd);
  if (dirfd >= 0) close(dirfd);
  if (r != NEWT_OK) return NEWT_ERR(r, "%s", msg);
  if (s->commit) {
    ckpt_commit_opts co = {.dir = s->dir, .step = s->step, .nranks = s->nranks, .attempt = s->attempt,
                           .state = s->state, .deadline = newt_deadline_in_ms(s->commit_timeout_ms),
                           .keep = s->keep, .abort = &s->abort, .writer = s->writer, .step_bytes = step_bytes,
                           .key = &s->key};
    NEWT_CHECK(ckpt_commit(&co));
  }
  return NEWT_OK;
}

/* Runs the save built by begin/add/end and records its outcome in the status. */
static void save_and_report(ckpt_saver *s) {
  uint64_t t0 = newt_now_ns(), raw = 0, step_bytes = 0;
  newt_result_t r = run_save(s, &raw, &step_bytes);
  pthread_mutex_lock(&s->mu);
  s->st.step = s->step;
  s->st.result = r;
  s->st.write_ms = (double)(newt_now_ns() - t0) / 1e6;
  s->st.raw_bytes = raw;
  s->st.file_bytes = r == NEWT_OK ? s->next_off : 0;
  s->st.step_bytes = r == NEWT_OK ? step_bytes : 0;
  if (r == NEWT_OK) {
    s->st.state = CKPT_SAVE_DONE;
    s->st.message[0] = '\0';
    s->st.last_ok_step = s->step;
    s->st.saves_ok++;
  } else {
    s->st.state = CKPT_SAVE_FAILED;
    snprintf(s->st.message, sizeof s->st.message, "%s", newt_errmsg());
    s->st.saves_failed++;
  }
  pthread_mutex_unlock(&s->mu);
  if (r != NEWT_OK)
    NEWT_WARN(CKPT, "rank %d: checkpoint of step %lld failed (%s): %s", s->rank, (long long)s->step,
              newt_result_name(r), s->st.message);
}

static void *bg_main(void *arg) {
  ckpt_saver *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->bg_job && !s->bg_stop) pthread_cond_wait(&s->cv, &s->mu);
    if (!s->bg_job) break;
    s->bg_job = 0;
    pthread_mutex_unlock(&s->mu);
    save_and_report(s);
    pthread_mutex_lock(&s->mu);
    while (newt_param_CkptHold() && !s->release && !s->bg_stop && !atomic_load(&s->abort))
      pthread_cond_wait(&s->cv, &s->mu);
    s->running = 0;
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* The snapshot: entries' bytes copied into their staging memory, in pieces, on the pool. */
typedef struct snap_item {
  const void *src;
  void *dst;
  size_t n;
} snap_item;

typedef struct snap_job {
  snap_item *items;
} snap_job;

static void snap_one(void *ctx, size_t i, int worker) {
  (void)worker;
  snap_item *it = &((snap_job *)ctx)->items[i];
  memcpy(it->dst, it->src, it->n);
}

static newt_result_t snapshot(ckpt_saver *s) {
  size_t n = 0;
  for (size_t i = 0; i < s->nentries; i++)
    if (s->entries[i].src) n += (s->entries[i].bytes + SNAPSHOT_PIECE - 1) / SNAPSHOT_PIECE;
  snap_job job = {.items = malloc((n ? n : 1) * sizeof *job.items)};
  NEWT_CHECK_ALLOC(job.items);
  size_t k = 0;
  for (size_t i = 0; i < s->nentries; i++) {
    const entry *e = &s->entries[i];
    if (!e->src) continue;
    for (size_t off = 0; off < e->bytes; off += SNAPSHOT_PIECE)
      job.items[k++] = (snap_item){(const uint8_t *)e->src + off, (uint8_t *)e->staged + off,
                                   e->bytes - off < SNAPSHOT_PIECE ? e->bytes - off : SNAPSHOT_PIECE};
  }
  ckpt_pool_run(s->pool, k, snap_one, &job);
  free(job.items);
  return NEWT_OK;
}

newt_result_t ckpt_save_end(ckpt_saver *s, const cJSON *state) {
  if (!s->building) return NEWT_ERR(NEWT_ERR_INVALID, "ckpt_save_end: no save begun");
  s->building = 0;
  if (state && !cJSON_IsObject(state))
    return NEWT_ERR(NEWT_ERR_INVALID, "ckpt_save_end: the training state is not a JSON object");
  cJSON_Delete(s->state);
  s->state = state ? cJSON_Duplicate(state, 1) : cJSON_CreateObject();
  NEWT_CHECK_ALLOC(s->state);
  if (!s->async) {
    pthread_mutex_lock(&s->mu);
    s->running = 1;
    s->st.state = CKPT_SAVE_RUNNING;
    pthread_mutex_unlock(&s->mu);
    save_and_report(s);
    pthread_mutex_lock(&s->mu);
    s->running = 0;
    s->st.stall_ms = (double)(newt_now_ns() - s->t_begin) / 1e6;
    newt_result_t r = s->st.result;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return r == NEWT_OK ? NEWT_OK : NEWT_ERR(r, "%s", s->st.message);
  }
  NEWT_CHECK(snapshot(s));
  pthread_mutex_lock(&s->mu);
  s->running = 1;
  s->release = 0;
  s->bg_job = 1;
  s->st.state = CKPT_SAVE_RUNNING;
  s->st.stall_ms = (double)(newt_now_ns() - s->t_begin) / 1e6;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return NEWT_OK;
}

newt_result_t ckpt_save_fail(ckpt_saver *s, newt_result_t r, const char *why) {
  if (!s->building) return NEWT_ERR(NEWT_ERR_INVALID, "ckpt_save_fail: no save begun");
  char msg[sizeof s->st.message];
  snprintf(msg, sizeof msg, "%s", why); /* why may be newt_errmsg(), which the calls below reset */
  s->building = 0;
  clear_entries(s);
  /* the marker tells the committer this rank's shard will not come */
  char stepdir[4096];
  ckpt_step_dirname(stepdir, sizeof stepdir, s->dir, s->step);
  int dirfd = -1, stepfd = -1;
  if (open_step(s, &dirfd, &stepfd) == NEWT_OK) write_failed_marker(s, stepfd, stepdir, msg);
  else newt_err_clear();
  if (stepfd >= 0) close(stepfd);
  if (dirfd >= 0) close(dirfd);
  pthread_mutex_lock(&s->mu);
  s->st.step = s->step;
  s->st.state = CKPT_SAVE_FAILED;
  s->st.result = r;
  snprintf(s->st.message, sizeof s->st.message, "%s", msg);
  s->st.saves_failed++;
  s->st.stall_ms = (double)(newt_now_ns() - s->t_begin) / 1e6;
  pthread_mutex_unlock(&s->mu);
  NEWT_WARN(CKPT, "rank %d: checkpoint of step %lld failed before it was written: %s", s->rank, (long long)s->step,
            msg);
  return NEWT_ERR(r, "%s", msg);
}

newt_result_t ckpt_save_wait(ckpt_saver *s, newt_deadline_t deadline) {
  pthread_mutex_lock(&s->mu);
  release_locked(s);
  int idle = wait_idle(s, deadline);
  newt_result_t r = s->st.state == CKPT_SAVE_FAILED ? s->st.result : NEWT_OK;
  int64_t step = s->st.step;
  char msg[sizeof s->st.message];
  snprintf(msg, sizeof msg, "%s", s->st.message);
  pthread_mutex_unlock(&s->mu);
  if (!idle) return NEWT_ERR(NEWT_ERR_TIMEOUT, "the checkpoint of step %lld is still being written", (long long)s->step);
  if (r != NEWT_OK) return NEWT_ERR(r, "checkpoint of step %lld: %s", (long long)step, msg);
  return NEWT_OK;
}

void ckpt_saver_abort(ckpt_saver *s) {
  atomic_store(&s->abort, 1);
  pthread_mutex_lock(&s->mu);
  release_locked(s);
  pthread_mutex_unlock(&s->mu);
}

void ckpt_saver_status(ckpt_saver *s, ckpt_save_status *st) {
  pthread_mutex_lock(&s->mu);
  *st = s->st;
  pthread_mutex_unlock(&s->mu);
}
