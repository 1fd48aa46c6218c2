/* Checkpoints: sharded, layout-independent, zstd-compressed, verified, asynchronous.
 *
 * A checkpoint is a directory DIR/step-<N>/ holding one shard file and one shard index per
 * rank, and a MANIFEST committed last (ckpt/format.c documents every byte). A tensor is
 * stored by its global name, dtype and global shape; each rank stores the *slices* it holds
 * (common/slice.h: a box of the global tensor, as tensor/pipeline parallelism splits it,
 * optionally narrowed to a range of the box's row-major order, as ZeRO splits a flat
 * buffer). A reader asks for slices in the same form, under any other layout, and gets
 * them assembled from whichever stored chunks overlap them. Tensor names and the training
 * state are the caller's: ckpt/ knows tensors, slices, chunks and manifests, never the model
 * or the optimizer (gpt/ckpt.h names the GPT's weights and AdamW moments and writes
 * its training point). The training state is one JSON object the caller builds (a cJSON tree,
 * never text: it is encoded once, with the manifest), stored in the manifest as given.
 *
 * Saving, one saver per rank (rank 0 usually commits):
 *
 *   ckpt_saver_opts o = {.dir = "ck", .rank = r, .nranks = n, .commit = r == 0,
 *                        .attempt = generation};
 *   ckpt_saver_init(&s, &o);
 *   ...every K steps:
 *   int go;
 *   ckpt_save_begin(s, step, 1, &go);            // 1 = async; waits (or skips) if busy
 *   if (go) {
 *     ckpt_save_add(s, &desc, &slice, data);     // once per slice this rank stores
 *     ckpt_save_end(s, state);                   // async: returns after the snapshot copy
 *   }
 *   ckpt_saver_status(s, &st);                   // DONE / FAILED with a message
 *
 * The committer waits (with a deadline) for every rank's index of that step, verifies
 * them (checksums, sizes, and that the chunks cover every tensor exactly once), writes the
 * MANIFEST (temporary name, fsync, rename, fsync of the directory), then the `latest`
 * pointer the same way, and prunes to the newest `keep` committed checkpoints.
 *
 * One writer per directory: every saver holds its writer's lock of DIR/LOCK (ckpt_lock_take:
 * the ranks of one job share it as "job <name>"), and another writer's saver is refused.
 *
 * A saver and a reader are each used by one thread at a time; ckpt_saver_status,
 * ckpt_save_wait and ckpt_saver_abort may be called from any thread.
 *
 * Loading: ckpt_load(dir, CKPT_LATEST, ...) opens the newest committed checkpoint, reads
 * the requested slices (verifying every checksum it touches) and falls back to the previous
 * committed checkpoint when anything is torn or corrupt. Ranks of one job must load the same
 * step: when the steps they got differ, each loads again with max_step = the minimum. */
#ifndef NEWT_CKPT_CKPT_H
#define NEWT_CKPT_CKPT_H

#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/clock.h"
#include "common/dtype.h"
#include "common/err.h"
#include "common/slice.h"

#define CKPT_LATEST (-1)
#define CKPT_LEVEL_RAW (-1) /* ckpt_saver_opts.level: store every chunk uncompressed */

/* ---- whose checkpoint ----------------------------------------------------------------- */

/* A checkpoint is bound to the job that wrote it: with a key, every shard index and manifest
 * ends in "mac", HMAC-SHA256 under that key of the file's JSON before it (format.c), so the
 * manifest proves every chunk's place, size and checksum, the step and the training state. A
 * reader given the key takes a step only when its manifest proves the key: a step another job
 * wrote (another key), or one written without a key (the previous release, a job without a
 * secret), is skipped as a corrupt one is, naming its MANIFEST (NEWT_ERR_AUTH), and the load
 * falls back to the previous one. A reader without a key (newt ckpt ls|inspect|verify) reads
 * every step and proves nothing. docs/ckpt.md, "Whose checkpoint". */
typedef struct ckpt_key {
  int has; /* 0: none (nothing proved, nothing asked) */
  unsigned char bytes[32];
} ckpt_key;
/* The checkpoints' key of a job secret: HMAC-SHA256(secret, "newt-checkpoint"). */
newt_result_t ckpt_key_of_secret(ckpt_key *k, const unsigned char *secret, size_t len);

/* ---- saving ------------------------------------------------------------------------ */

/* A rank's layout as its checkpoint records it (the manifest's files[].layout, a JSON object):
 * for tools and people (`newt ckpt inspect`); no load reads it, since any layout loads any
 * checkpoint. The fields named in `has` are written, in the order below. */
enum {
  CKPT_LAYOUT_DP = 1u << 0,
  CKPT_LAYOUT_TP = 1u << 1,
  CKPT_LAYOUT_PP = 1u << 2,
  CKPT_LAYOUT_ZERO = 1u << 3,
  CKPT_LAYOUT_RANK = 1u << 4,
  CKPT_LAYOUT_GENERATION = 1u << 5,
  CKPT_LAYOUT_SHAPE = CKPT_LAYOUT_DP | CKPT_LAYOUT_TP | CKPT_LAYOUT_PP | CKPT_LAYOUT_ZERO, /* newt train's */
  CKPT_LAYOUT_ALL = CKPT_LAYOUT_SHAPE | CKPT_LAYOUT_RANK | CKPT_LAYOUT_GENERATION,     /* a job rank's */
};

typedef struct ckpt_layout {
  unsigned has;             /* CKPT_LAYOUT_* bits: the fields set */
  int64_t dp, tp, pp, zero; /* data, tensor and pipeline parallel sizes, the ZeRO stage */
  int64_t rank;             /* the rank that wrote the shard */
  int64_t generation;       /* the plan it saved under */
} ckpt_layout;

/* The layout as a manifest holds it: an object of the fields in `has` (NULL: out of memory). */
cJSON *ckpt_layout_json(const ckpt_layout *l);

typedef struct ckpt_saver ckpt_saver;

typedef struct ckpt_saver_opts {
  const char *dir;         /* the checkpoint directory (created) */
  int rank, nranks;        /* this rank, ranks that write shards of each step */
  int threads;             /* compression threads (default 2) */
  int level;               /* zstd level 1..22 (0: the default, 1; CKPT_LEVEL_RAW: none) */
  size_t chunk_bytes;      /* raw bytes per chunk (default 4 MiB, at least 64) */
  size_t staging_bytes;    /* staging memory for async snapshots allocated up front (0: on first use) */
  size_t staging_hint;     /* the bytes a save stages, when known: the first block taken on first
                              use is this large (0: blocks grow from 1 MiB, doubling) */
  int skip_if_busy;        /* begin while a save is in flight: 1 skips it, 0 waits */
  int64_t busy_wait_ms;    /* how long begin waits for the previous save (default 600000) */
  int commit;              /* this rank commits the step (one rank, usually 0) */
  int keep;                /* committed checkpoints the committer keeps (default 3) */
  int64_t commit_timeout_ms; /* committer's wait for the other ranks' indexes (default 600000) */
  uint64_t attempt;        /* same on every rank of one save attempt (e.g. the plan generation);
                              0 with nranks == 1 picks a random one */
  ckpt_layout layout;      /* this rank's layout, as the manifest records it (zero: none) */
  const ckpt_key *key;     /* its index, and the committer's manifest, proved with it (NULL: none) */
  /* The writer this saver belongs to: one writer per directory (DIR/LOCK, ckpt_lock_take).
   * Savers giving the same name share the directory -- every rank of one job: "job <name>";
   * NULL: with nranks == 1 this process alone, else every rank of this attempt. A directory
   * another writer holds makes ckpt_saver_init fail with NEWT_ERR_CONFLICT naming it. */
  const char *writer;
  /* Where staging memory comes from (NULL: posix_memalign, zeroed to fault its pages in):
   * a device runtime's pinned memory, say, that device-to-host copies into reservations
   * (ckpt_save_reserve) are fastest to. staging_alloc(staging_ctx, bytes) returns host
   * memory ready to use, aligned to at least CKPT_STAGING_ALIGN bytes, or NULL; each block
   * goes back through staging_free(staging_ctx, p), at the latest in ckpt_saver_free, and
   * never while a save may read it. Both are called from the threads that call
   * ckpt_saver_init, ckpt_save_add / ckpt_save_reserve and ckpt_saver_free, never from the
   * saver's own. The alignment is all the saver needs: staging is only read (the snapshot
   * copy, compression), and the shard file is written from the compression threads' own
   * buffers, so O_DIRECT asks nothing of it. */
  void *(*staging_alloc)(void *ctx, size_t bytes);
  void (*staging_free)(void *ctx, void *p);
  void *staging_ctx;
} ckpt_saver_opts;

/* The alignment ckpt_saver_opts.staging_alloc must give: reservations are cut at multiples
 * of it and handed out for slices of any dtype. */
#define CKPT_STAGING_ALIGN 64

typedef enum ckpt_save_state {
  CKPT_SAVE_IDLE = 0, /* nothing saved yet */
  CKPT_SAVE_RUNNING,  /* a save is in flight */
  CKPT_SAVE_DONE,     /* the last save succeeded */
  CKPT_SAVE_FAILED,   /* the last save failed: result and message say why */
} ckpt_save_state;

typedef struct ckpt_save_status {
  ckpt_save_state state; /* of the last save */
  int64_t step;          /* its step (-1: none) */
  newt_result_t result;
  char message[512];
  int64_t last_ok_step;  /* newest step this saver wrote (and committed, if it commits) */
  uint64_t saves_ok, saves_failed, saves_skipped;
  double stall_ms;       /* time the caller spent in begin..end of the last save */
  double write_ms;       /* compress + write + fsync (+ commit) of the last save */
  uint64_t raw_bytes, file_bytes; /* of the last save, this rank */
  uint64_t step_bytes;  /* the committer's: bytes of every file of the step it committed (the shards,
                           the indexes, the manifest); 0 on other ranks and when it failed */
} ckpt_save_status;

newt_result_t ckpt_saver_init(ckpt_saver **out, const ckpt_saver_opts *opts);
/* Waits for a save in flight (aborting a committer's wait), then frees everything. */
void ckpt_saver_free(ckpt_saver *s);

/* Starts the save of `step`. When a save is in flight: skip_if_busy sets *started = 0 and
 * returns NEWT_OK; otherwise it waits (busy_wait_ms). async = 1: slices are copied into the
 * staging memory at ckpt_save_end and written in the background; async = 0: ckpt_save_end
 * writes them from the caller's memory and returns when done. */
newt_result_t ckpt_save_begin(ckpt_saver *s, int64_t step, int async, int *started);
/* Adds one slice (NULL: the whole tensor). data must stay valid and unchanged until
 * ckpt_save_end returns. */
newt_result_t ckpt_save_add(ckpt_saver *s, const newt_tensor_desc *t, const newt_slice *slice,
                            const void *data);
/* Async saves only: reserves staging memory for a slice and returns it in *dst, to be
 * filled (e.g. by a device-to-host copy) before ckpt_save_end. */
newt_result_t ckpt_save_reserve(ckpt_saver *s, const newt_tensor_desc *t, const newt_slice *slice,
                                void **dst);
/* Ends the save. state (an object; NULL = {}) is the training state the committer stores in
 * the manifest: the saver keeps a copy, the caller its own. Sync: returns the save's result.
 * Async: returns once the snapshot is taken; the result comes later through
 * ckpt_saver_status / ckpt_save_wait. */
newt_result_t ckpt_save_end(ckpt_saver *s, const cJSON *state);
/* Ends a save begun (between ckpt_save_begin and ckpt_save_end) without writing it, as
 * failed with result r for `why` (the status says so; a `.failed` marker in the step's
 * directory stops the committer waiting for this rank): for a caller that could not gather
 * its slices (a device-to-host copy failed), whose staged bytes must never reach a
 * checkpoint. Returns r with why as its message (why may be newt_errmsg()). */
newt_result_t ckpt_save_fail(ckpt_saver *s, newt_result_t r, const char *why);
/* Waits for the save in flight (if any) and returns its result (NEWT_OK when none ran). */
newt_result_t ckpt_save_wait(ckpt_saver *s, newt_deadline_t deadline);
/* Aborts the save in flight at its next check (a committer waiting for other ranks stops). */
void ckpt_saver_abort(ckpt_saver *s);
void ckpt_saver_status(ckpt_saver *s, ckpt_save_status *st);
/* The staging memory's first block (for registering it as pinned memory with a device
 * runtime, where staging_alloc does not give such memory already). It is reused by every
 * save and grows only when a save needs more. */
void *ckpt_saver_staging(ckpt_saver *s, size_t *bytes);

/* ---- committing -------------------------------------------------------------------- */

typedef struct ckpt_commit_opts {
  const char *dir;
  int64_t step;
  int nranks;
  uint64_t attempt;        /* accept only indexes of this attempt (0: any) */
  const cJSON *state;      /* the training state, an object (NULL: {}) */
  newt_deadline_t deadline;
  int keep;                /* committed checkpoints to keep (< 1: keep all) */
  const atomic_int *abort; /* may be NULL */
  const char *writer;      /* as ckpt_saver_opts.writer (NULL: the same default) */
  uint64_t *step_bytes;    /* may be NULL; a commit sets it to the bytes of every file of the
                              committed step (shards, indexes, manifest) */
  const ckpt_key *key;     /* the indexes must prove it, the manifest is proved with it (NULL: none) */
} ckpt_commit_opts;

/* Waits for every rank's index of the step, verifies, writes the manifest, updates
 * `latest`, prunes. */
newt_result_t ckpt_commit(const ckpt_commit_opts *o);

/* ---- one writer per directory -------------------------------------------------------- */

/* DIR/LOCK: a shared flock held by every process of one writer while it saves (a saver takes
 * it in ckpt_saver_init and lets it go in ckpt_saver_free; a commit by hand for its
 * duration). `writer` names the writer: processes giving the same name share the directory,
 * any other name is refused with NEWT_ERR_CONFLICT, the message naming the directory and the
 * holder (its writer, and the pid, host, command and time of the process that took it).
 * The lock goes with the last process of its writer, however it ends (kill -9 included).
 * DIR is made when missing. Takes of one process share one descriptor (reference counted). */
typedef struct ckpt_lock ckpt_lock;
newt_result_t ckpt_lock_take(const char *dir, const char *writer, ckpt_lock **out);
void ckpt_lock_release(ckpt_lock *l); /* NULL: nothing */

/* ---- reading ----------------------------------------------------------------------- */

typedef struct ckpt_reader ckpt_reader;

typedef struct ckpt_request {
  newt_tensor_desc t; /* name, dtype and global shape, as the caller expects them */
  newt_slice slice;   /* what to read */
  void *out;          /* slice's elements, in slice order */
} ckpt_request;

/* Opens DIR/step-<step> (step >= 0) or the newest committed checkpoint whose manifest
 * is valid (CKPT_LATEST). threads: decompression threads (< 1: 2). Inside DIR nothing is
 * reached through a symbolic link: a step-<N> or MANIFEST that is one is not a checkpoint. */
newt_result_t ckpt_open(ckpt_reader **out, const char *dir, int64_t step, int threads);
/* The same, taking only a step whose manifest proves key (NULL or none: any). */
newt_result_t ckpt_open_keyed(ckpt_reader **out, const char *dir, int64_t step, int threads, const ckpt_key *key);
/* Opens one step directory by its path (its last component must not be a symbolic link). */
newt_result_t ckpt_open_path(ckpt_reader **out, const char *stepdir, int threads);
void ckpt_close(ckpt_reader *r);

int64_t ckpt_reader_step(const ckpt_reader *r);
const char *ckpt_reader_path(const ckpt_reader *r);
/* The training state object (owned by the reader). */
const cJSON *ckpt_reader_state(const ckpt_reader *r);
size_t ckpt_reader_ntensors(const ckpt_reader *r);
/* Tensors in name order; desc.name points into the reader. */
void ckpt_reader_tensor(const ckpt_reader *r, size_t i, newt_tensor_desc *desc);
newt_result_t ckpt_reader_find(const ckpt_reader *r, const char *name, newt_tensor_desc *desc);

/* Reads every request (decompressing the overlapping chunks in parallel, each once). */
newt_result_t ckpt_read_slices(ckpt_reader *r, const ckpt_request *reqs, size_t n);
newt_result_t ckpt_read_slice(ckpt_reader *r, const newt_tensor_desc *t, const newt_slice *slice,
                              void *out);

typedef struct ckpt_loaded {
  int64_t step;
  cJSON *state;     /* the training state object; the caller frees it (cJSON_Delete) */
  int fallbacks;    /* newer committed checkpoints skipped as torn or corrupt */
  int committed;    /* committed checkpoints (<= max_step) looked at: 0 on a fresh directory */
  int refused;      /* ... of which were skipped for not proving the key (another job's, or
                       written without a key) */
  char refused_why[600]; /* the newest one's reason, naming its MANIFEST ("": none) */
} ckpt_loaded;
/* Reads the requests from the newest committed checkpoint with step <= max_step
 * (CKPT_LATEST: any) that reads back whole, falling back past torn or corrupt ones.
 * NEWT_ERR_NOTFOUND when there is none. Each manifest looked at is read and parsed once. */
newt_result_t ckpt_load(const char *dir, int64_t max_step, int threads, const ckpt_request *reqs,
                        size_t n, ckpt_loaded *out);
/* ckpt_load that first shows each checkpoint's training state to check (before any of its
 * tensors is read): an error from it ends the load with that error, no fallback (a run
 * that is not this one, say). */
typedef newt_result_t (*ckpt_state_check_fn)(void *ctx, int64_t step, const cJSON *state);
newt_result_t ckpt_load_checked(const char *dir, int64_t max_step, int threads, const ckpt_request *reqs,
                                size_t n, ckpt_state_check_fn check, void *ctx, ckpt_loaded *out);
/* ckpt_load_checked taking only steps whose manifest proves key (NULL or none: any); the
 * others are fallbacks, counted in out->refused. */
newt_result_t ckpt_load_keyed(const char *dir, int64_t max_step, int threads, const ckpt_request *reqs, size_t n,
                              ckpt_state_check_fn check, void *ctx, const ckpt_key *key, ckpt_loaded *out);
/* Adopts a step as the key's: verifies every chunk of stepdir (ckpt_verify), then writes its
 * MANIFEST again proved with key (temporary name, fsync, rename). For a checkpoint one trusts
 * that a job with a key would refuse: written by the previous release, without a key, or under
 * another key (`newt ckpt sign`). */
newt_result_t ckpt_sign(const char *stepdir, const ckpt_key *key);

/* Verifies every checksum of a step directory; calls report for each problem found
 * (the message names the file and chunk). Returns NEWT_ERR_CORRUPT when any was found,
 * another error when the manifest itself cannot be used (reported too). */
typedef void (*ckpt_report_fn)(void *ctx, const char *message);
typedef struct ckpt_verify_result {
  size_t files, chunks; /* checked */
  size_t bad;           /* problems reported */
  uint64_t stored_bytes, raw_bytes;
} ckpt_verify_result;
newt_result_t ckpt_verify(const char *stepdir, ckpt_report_fn report, void *ctx, ckpt_verify_result *res);

/* A description of a step directory for tools (`newt ckpt inspect`), from its manifest. */
typedef struct ckpt_info_file {
  int rank;
  char *name;                /* the shard file, inside the step directory */
  uint64_t bytes, raw_bytes; /* its size, the tensor bytes it holds */
  ckpt_layout layout;        /* the layout its rank saved under */
} ckpt_info_file;

typedef struct ckpt_info_tensor {
  char *name;
  newt_dtype dtype;
  int ndim;
  int64_t shape[NEWT_SLICE_MAX_DIMS];
  size_t chunks;
  uint64_t raw_bytes, stored_bytes; /* of its chunks, raw and as stored */
} ckpt_info_tensor;

typedef struct ckpt_info {
  char *path; /* the step directory, as given */
  int64_t step;
  int nranks;
  uint64_t attempt, created_ms;
  uint64_t raw_bytes, stored_bytes, file_bytes; /* tensors' bytes, their chunks' stored bytes, the shard files' */
  double ratio;                                  /* raw_bytes / stored_bytes (1 when nothing is stored) */
  ckpt_info_file *files;                         /* one per shard file, in the manifest's order */
  size_t nfiles;
  ckpt_info_tensor *tensors; /* in name order */
  size_t ntensors;
  cJSON *state; /* the training state object */
} ckpt_info;

/* Fills *out (ckpt_info_free it; nothing to free on failure). */
newt_result_t ckpt_inspect(const char *stepdir, ckpt_info *out);
void ckpt_info_free(ckpt_info *info);

/* ---- listing ----------------------------------------------------------------------- */

typedef struct ckpt_step_info {
  int64_t step;
  char name[64];     /* step-<N> */
  int committed;     /* a MANIFEST exists */
  int valid;         /* ... and it parses and checks out */
  int latest;        /* the `latest` pointer names it */
  uint64_t disk_bytes;  /* bytes of all files in the directory */
  uint64_t raw_bytes;   /* tensor bytes (from the manifest) */
  uint64_t file_bytes;  /* shard bytes the manifest references */
  int nranks;
  size_t ntensors;
} ckpt_step_info;

/* Every step-<N> directory of dir, ascending by step. */
newt_result_t ckpt_list(const char *dir, ckpt_step_info **out, size_t *n);
/* The step the `latest` pointer names, or -1. */
int64_t ckpt_latest_pointer(const char *dir);

#endif
