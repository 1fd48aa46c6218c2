/* What the files of ckpt/ share and nobody else needs: the on-disk records (format.c),
 * the in-memory manifest, the chunk codec (codec.c), the thread pool (pool.c), the
 * coverage check of a tensor's chunks and small helpers (coverage.c) and directory naming
 * (dir.c). */
#ifndef NEWT_CKPT_INTERNAL_H
#define NEWT_CKPT_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>
#include <zstd.h>

#include "ckpt/ckpt.h"
#include "common/param.h"

#define CKPT_FORMAT_VERSION 1
#define CKPT_SHARD_HDR 64
#define CKPT_CHUNK_HDR 48
#define CKPT_ALIGN 4096 /* chunks start at multiples of this (direct I/O) */
#define CKPT_MAX_CHUNK ((uint64_t)1 << 30)     /* raw bytes of one chunk */
/* Bytes of a manifest or index file. A manifest takes about 240 bytes per chunk, 170 per rank
 * (its file entry, with a layout like the worker's) and 60 per tensor plus its name. The
 * largest layout a checkpoint is sized for -- 4096 ranks, 444 tensors (gpt2-124m and its AdamW
 * moments) and 16384 chunks (that model under ZeRO-3 over dp 256 x tp 4 x pp 4 makes about
 * 14000) -- needs 4.6 MB (test_ckpt_unit checks it fits in 60% of the bound). Reading one
 * holds the text, the decoded manifest (about its size) and one piece of JSON at a time
 * (format.c): 20 to 27 MB at the bound. A larger file is refused before it is read; the
 * encoder refuses to write one, so whatever newt commits reads back (docs/ckpt.md, "Limits"). */
#define CKPT_MAX_MANIFEST ((size_t)8 << 20)
#define CKPT_MAX_STATE_VALUES 65536 /* JSON values in a manifest's state document (a tree of them is kept) */
#define CKPT_MAX_NAME 1024                     /* bytes of a tensor name */
#define CKPT_MAX_RANKS (1 << 20)

/* Test knob: milliseconds slept after writing each chunk (makes a save long enough to be
 * killed in the middle), and before the manifest is renamed into place. */
NEWT_PARAM(CkptTestChunkDelayMs, "NEWT_CKPT_TEST_CHUNK_DELAY_MS", 0)
NEWT_PARAM(CkptTestCommitDelayMs, "NEWT_CKPT_TEST_COMMIT_DELAY_MS", 0)
/* Shard files are written and read with O_DIRECT where the filesystem allows it (no page
 * cache churn on a training host); 0 turns that off. */
NEWT_PARAM(CkptDirectIo, "NEWT_CKPT_DIRECT_IO", 1)

enum { CKPT_CODEC_RAW = 0, CKPT_CODEC_ZSTD = 1, CKPT_CODEC__COUNT };
enum { CKPT_FILTER_NONE = 0, CKPT_FILTER_SHUFFLE = 1, CKPT_FILTER_ROT1 = 2, CKPT_FILTER__COUNT };

const char *ckpt_codec_name(int codec);
const char *ckpt_filter_name(int filter);

/* ---- on-disk records (format.c) ---------------------------------------------------- */

typedef struct ckpt_shard_hdr {
  uint32_t rank, nranks;
  int64_t step;
  uint64_t attempt;
} ckpt_shard_hdr;

typedef struct ckpt_chunk_hdr {
  uint8_t codec, filter, esize;
  uint64_t raw, stored, xxh_raw, xxh_stored;
} ckpt_chunk_hdr;

void ckpt_shard_hdr_encode(const ckpt_shard_hdr *h, uint8_t out[CKPT_SHARD_HDR]);
newt_result_t ckpt_shard_hdr_decode(const uint8_t in[CKPT_SHARD_HDR], const char *what,
                                    ckpt_shard_hdr *h);
void ckpt_chunk_hdr_encode(const ckpt_chunk_hdr *h, uint8_t out[CKPT_CHUNK_HDR]);
newt_result_t ckpt_chunk_hdr_decode(const uint8_t in[CKPT_CHUNK_HDR], const char *what,
                                    ckpt_chunk_hdr *h);

/* One stored chunk: where it is and which slice of its tensor it holds. */
typedef struct ckpt_chunk {
  uint32_t file;   /* index into the manifest's files */
  uint8_t codec, filter;
  uint64_t offset; /* of its chunk header in the file */
  uint64_t stored, raw, xxh_raw, xxh_stored;
  newt_slice slice;
} ckpt_chunk;

typedef struct ckpt_tensor {
  char *name;
  newt_dtype dtype;
  int ndim;
  int64_t shape[NEWT_SLICE_MAX_DIMS];
  ckpt_chunk *chunks;
  size_t nchunks, cap;
  size_t seq; /* order of addition (keeps merges deterministic) */
} ckpt_tensor;

typedef struct ckpt_file {
  char *name;        /* plain file name inside the step directory */
  int rank;
  uint64_t bytes;    /* file size */
  uint64_t raw_bytes;
  ckpt_layout layout; /* the rank's layout (has 0: none recorded) */
} ckpt_file;

/* A manifest, or one rank's index (is_index, one file, no state). */
typedef struct ckpt_manifest {
  int is_index;
  int64_t step;
  int nranks, rank;
  uint64_t attempt;
  uint64_t created_ms;
  ckpt_file *files;
  size_t nfiles;
  ckpt_tensor *tensors; /* sorted by name once parsed or finished */
  size_t ntensors, cap;
  cJSON *state;         /* manifest only */
  size_t encoded_bytes; /* the framed text it was decoded from (0: built in memory) */
} ckpt_manifest;

void ckpt_manifest_free(ckpt_manifest *m);
/* Appends a tensor (names may repeat until ckpt_manifest_sort). */
newt_result_t ckpt_manifest_add_tensor(ckpt_manifest *m, const newt_tensor_desc *d, ckpt_tensor **out);
newt_result_t ckpt_tensor_add_chunk(ckpt_tensor *t, const ckpt_chunk *c);
/* Sorts the tensors by name. Tensors of one name are merged into one (chunks in the order
 * they were added) when allow_dups, an error naming `what` otherwise; merged ones must
 * agree on dtype and shape. */
newt_result_t ckpt_manifest_sort(ckpt_manifest *m, int allow_dups, const char *what);
const ckpt_tensor *ckpt_manifest_find(const ckpt_manifest *m, const char *name);
/* Framed text: header line + JSON, malloc'd; with a key (not NULL, has) the JSON ends in
 * its "mac". */
newt_result_t ckpt_manifest_encode(const ckpt_manifest *m, char **text, size_t *len);
newt_result_t ckpt_manifest_encode_keyed(const ckpt_manifest *m, const ckpt_key *key, char **text, size_t *len);
/* Parses and validates framed text; every error names `what` and the field. With a key, a
 * file whose "mac" does not prove it is NEWT_ERR_AUTH (checked before the JSON is parsed);
 * without, a "mac" is checked for its form only. */
newt_result_t ckpt_manifest_decode(const char *text, size_t len, const char *what, int want_index,
                                   ckpt_manifest *m);
newt_result_t ckpt_manifest_decode_keyed(const char *text, size_t len, const char *what, int want_index,
                                         const ckpt_key *key, ckpt_manifest *m);
/* Reads and decodes the regular file `name` in dirfd (dir: its path; the messages name
 * dir/name). AT_FDCWD with a path as name works too (its last component is not followed). */
newt_result_t ckpt_manifest_load(int dirfd, const char *dir, const char *name, int want_index,
                                 ckpt_manifest *m);
newt_result_t ckpt_manifest_load_keyed(int dirfd, const char *dir, const char *name, int want_index,
                                       const ckpt_key *key, ckpt_manifest *m);
/* 1 when name is a plain file name (no '/', not "." or "..", [A-Za-z0-9._-] only). */
int ckpt_plain_name(const char *name);

/* ---- chunk codec (codec.c) ---------------------------------------------------------- */

typedef struct ckpt_codec {
  ZSTD_CCtx *cctx;
  int cctx_mode; /* parameters set on cctx: level * 2 + entropy, or INT_MIN */
  ZSTD_DCtx *dctx;
  uint8_t *tmp;   /* filtered bytes */
  size_t tmp_cap;
} ckpt_codec;

void ckpt_codec_free(ckpt_codec *c);
/* Encodes len raw bytes of dtype dt at dst (room for CKPT_CHUNK_HDR + len bytes): the
 * chunk header, then the stored bytes (h->stored of them). */
newt_result_t ckpt_chunk_encode(ckpt_codec *c, const void *raw, size_t len, newt_dtype dt, int level,
                                ckpt_chunk_hdr *h, uint8_t *dst);
/* Grows a CKPT_ALIGN-aligned buffer to at least need bytes (contents are not kept). */
newt_result_t ckpt_buf_grow(uint8_t **buf, size_t *cap, size_t need);
static inline uint64_t ckpt_align_up(uint64_t n) { return (n + CKPT_ALIGN - 1) & ~(uint64_t)(CKPT_ALIGN - 1); }
/* Decodes stored bytes into out (h->raw bytes), verifying both checksums; errors start
 * with `what` (the file and chunk). */
newt_result_t ckpt_chunk_decode(ckpt_codec *c, const ckpt_chunk_hdr *h, const void *stored, void *out,
                                const char *what);
int ckpt_filter_for(newt_dtype dt);
void ckpt_filter_apply(int filter, size_t esize, const void *in, void *out, size_t len);
void ckpt_filter_undo(int filter, size_t esize, const void *in, void *out, size_t len);
uint64_t ckpt_hash(const void *p, size_t n);

/* ---- thread pool (pool.c) ----------------------------------------------------------- */

typedef struct ckpt_pool ckpt_pool;
typedef void (*ckpt_pool_fn)(void *ctx, size_t item, int worker);
/* nthreads workers in all, the caller of ckpt_pool_run being worker 0. */
newt_result_t ckpt_pool_init(ckpt_pool **out, int nthreads);
/* Runs fn(ctx, i, worker) for i in [0, n) and returns when all are done. */
void ckpt_pool_run(ckpt_pool *p, size_t n, ckpt_pool_fn fn, void *ctx);
int ckpt_pool_size(const ckpt_pool *p);
void ckpt_pool_free(ckpt_pool *p);

/* First error of a parallel job: code and message (messages are per thread). */
typedef struct ckpt_job_err {
  atomic_int code;
  char msg[1024];
} ckpt_job_err;
void ckpt_job_err_set(ckpt_job_err *e, newt_result_t code);
newt_result_t ckpt_job_err_raise(ckpt_job_err *e);

/* ---- coverage and helpers (coverage.c) ---------------------------------------------- */

/* Room for element n of a growable array (*arr of *cap elements of elem bytes; doubling). */
newt_result_t ckpt_array_reserve(void **arr, size_t *cap, size_t n, size_t elem);
#define CKPT_RESERVE(arr, cap, n) ckpt_array_reserve((void **)&(arr), &(cap), (n), sizeof *(arr))

/* "(97,16)" */
void ckpt_shape_str(int ndim, const int64_t *shape, char *out, size_t cap);
/* Verifies that a tensor's chunks never overlap and (full = 1) cover every element. */
newt_result_t ckpt_coverage_check(const ckpt_tensor *t, int full, const char *what);

/* ---- the writer's lock (lock.c) ------------------------------------------------------ */

/* The writer a saver or commit belongs to when none is named (ckpt_saver_opts.writer). */
void ckpt_writer_default(char *out, size_t cap, int nranks, uint64_t attempt);

/* ---- directory (dir.c) --------------------------------------------------------------- */

/* Everything inside DIR is reached through descriptors: dirfd is an open DIR, `dir` its
 * path (for messages). See dir.c for why. */

/* Opens the checkpoint directory DIR (a path of the caller's, followed). */
newt_result_t ckpt_dir_open(const char *dir, int *fd);
void ckpt_step_name(char *out, size_t cap, int64_t step);
/* DIR/step-<N> as a path, for messages and tools. */
void ckpt_step_dirname(char *out, size_t cap, const char *dir, int64_t step);
/* Parses "step-<digits>"; -1 when the name is something else. */
int64_t ckpt_parse_step_name(const char *name);
/* Steps of all step-<N> directories, ascending (malloc'd). An entry of such a name that is
 * not a directory (a symbolic link, a file) is not a checkpoint: skipped with a warning. */
newt_result_t ckpt_scan_steps(int dirfd, const char *dir, int64_t **steps, size_t *n);
/* Opens step-<N> (O_NOFOLLOW; create: makes it, replacing a non-directory in its place). */
newt_result_t ckpt_step_open(int dirfd, const char *dir, int64_t step, int create, int *fd);
/* 1 when step-<N> is a directory holding a MANIFEST (of any kind: a reader judges it). */
int ckpt_step_committed(int dirfd, int64_t step);
void ckpt_shard_name(char *out, size_t cap, int rank, uint64_t attempt);
void ckpt_index_name(char *out, size_t cap, int rank);
void ckpt_failed_name(char *out, size_t cap, int rank);
/* Removes a step directory so that it never looks committed while half removed: the
 * manifest goes first (fsync'd), then the rest. A step-<N> that is not a directory is an
 * error, never removed through. only_uncommitted: a step that holds a MANIFEST (committed
 * since the caller looked) is left as it is. */
newt_result_t ckpt_remove_step(int dirfd, const char *dir, int64_t step, int only_uncommitted);
/* Writes the `latest` pointer atomically. */
newt_result_t ckpt_write_latest(int dirfd, const char *dir, int64_t step);
/* The step `latest` names, or -1 (missing, not a regular file, malformed). */
int64_t ckpt_latest_at(int dirfd, const char *dir);

#endif
