/* libnewt: a training program becomes one elastic worker of a newt job.
 *
 * The program joins a job (newt_join), then loops on newt_step_begin, which hands it either
 * a step to run -- the step's number and this rank's share of the global batch as sample
 * indices -- or a new generation: the job's membership changed (a worker died, hung, joined
 * or left), and the program takes the new layout and groups (newt_layout_get), declares its
 * training state for them (newt_state_tensor, newt_state_bytes) and lets newt fill it
 * (newt_state_restore: from its own memory, its peers', a leaver's, or the newest
 * checkpoint). A step is: compute over its samples, reduce gradients over the groups
 * (newt_allreduce ...), newt_step_commit (every rank agrees the step happened; newt keeps
 * the pre-update state), the optimizer update, newt_step_end. A collective that fails
 * because a peer died, hung or left returns an error within the job's deadline: the program
 * goes back to newt_step_begin, which recovers. No abort, no hang, no step lost, no sample
 * lost or repeated, the global batch kept at any world size. docs/api.md is the whole
 * contract, with a complete example.
 *
 * ABI rules. Handles are opaque. Every options or results struct starts with `size`, the
 * caller's sizeof: the library reads and writes only that many bytes of it, so structs grow
 * at their end and a program built against an older header keeps working (the fields it
 * lacks take their defaults). Initialise them with the *_init functions (or the *_INIT
 * macros in C). Enumerations only gain values. NEWT_VERSION_* is the header's version,
 * newt_version() the library's: same major, and a minor at least the header's. Every
 * function returns a newt_result_t (or says otherwise); on failure newt_errmsg() is the
 * message of this thread's last failure, naming what failed (the argument, the peer, the
 * field). Functions of one newt_ctx are called from one thread at a time. */
#ifndef NEWT_H
#define NEWT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NEWT_VERSION_MAJOR 0
#define NEWT_VERSION_MINOR 1
#define NEWT_VERSION_PATCH 0
#define NEWT_VERSION_NUMBER (NEWT_VERSION_MAJOR * 10000 + NEWT_VERSION_MINOR * 100 + NEWT_VERSION_PATCH)

#if defined(__GNUC__)
#define NEWT_API __attribute__((visibility("default")))
#else
#define NEWT_API
#endif

/* The library's version, as NEWT_VERSION_NUMBER (e.g. 100 for 0.1.0). */
NEWT_API int newt_version(void);

/* ---- results and types ------------------------------------------------------------------ */

typedef enum newt_result {
  NEWT_OK = 0,
  NEWT_ERR_INVALID,     /* a bad argument, flag, spec, plan or file content; a call out of order */
  NEWT_ERR_SYS,         /* a system call failed (errno in the message) */
  NEWT_ERR_NOMEM,       /* allocation failed */
  NEWT_ERR_TIMEOUT,     /* a deadline passed: a peer did not answer in time */
  NEWT_ERR_ABORTED,     /* aborted: a newer plan dropped the generation, or a signal */
  NEWT_ERR_PEER,        /* a peer failed (its connection closed, a bad proof) */
  NEWT_ERR_NOTFOUND,    /* a key, file, tensor or library does not exist */
  NEWT_ERR_CONFLICT,    /* a guarded write lost */
  NEWT_ERR_UNAVAILABLE, /* a service (etcd) cannot be reached */
  NEWT_ERR_AUTH,        /* authentication or TLS verification failed */
  NEWT_ERR_CORRUPT,     /* checksum mismatch, torn or malformed data */
  NEWT_ERR_NOSPACE,     /* disk full */
  NEWT_ERR_CUDA,        /* CUDA runtime error */
  NEWT_ERR_NCCL,        /* NCCL error */
  NEWT_ERR_INTERNAL,    /* a bug in newt: an invariant did not hold */
  NEWT_ERR_UNSUPPORTED  /* not built in (no CUDA) or not available here */
} newt_result_t;

/* The message of this thread's last failure ("" when none). */
NEWT_API const char *newt_errmsg(void);
/* A short stable name of a result ("timeout", "peer", ...). */
NEWT_API const char *newt_result_name(newt_result_t r);

typedef enum newt_dtype { NEWT_F32 = 0, NEWT_BF16 = 1, NEWT_F16 = 2, NEWT_I32 = 3, NEWT_I64 = 4, NEWT_U8 = 5 } newt_dtype;

typedef enum newt_op { NEWT_SUM = 0, NEWT_AVG = 1, NEWT_MAX = 2 } newt_op;

typedef struct newt_ctx newt_ctx;   /* this process as one worker of one job */
typedef struct newt_comm newt_comm; /* a group of ranks of one generation */
typedef struct newt_req newt_req;   /* an asynchronous collective in flight */

/* ---- joining a job ------------------------------------------------------------------------ */

/* An int option left as NEWT_FROM_ENV takes the environment's value (then its default). */
#define NEWT_FROM_ENV (-2)

/* Memory of a device newt does not know, or of one the program manages its own way (the
 * CUDA runtime, on the program's stream, is built in: see newt_join_opts.device). newt
 * copies the state's device memory with it: into a device copy before each update, into
 * host staging to send, save or receive. `host_visible`: device pointers are host memory
 * (no staging). Copies are queued in order after the program's work; `sync` waits for
 * them. Every function may be called from any thread. */
typedef struct newt_memory {
  size_t size;
  void *ctx;
  int host_visible;
  newt_result_t (*alloc)(void *ctx, size_t bytes, void **out); /* device memory */
  void (*free)(void *ctx, void *p);
  newt_result_t (*host_alloc)(void *ctx, size_t bytes, void **out); /* host memory copies are fast from (pinned) */
  void (*host_free)(void *ctx, void *p);
  /* queue a copy: kind 0 device to device, 1 device to host, 2 host to device */
  void (*copy)(void *ctx, void *dst, const void *src, size_t bytes, int kind);
  newt_result_t (*sync)(void *ctx); /* wait for every copy queued (and the work before them) */
} newt_memory;

typedef struct newt_join_opts {
  size_t size;
  /* etcd: NULL takes NEWT_ETCD (comma-separated endpoints), NEWT_ETCD_USER,
     NEWT_ETCD_PASSWORD_FILE, NEWT_ETCD_CA, NEWT_ETCD_CERT, NEWT_ETCD_KEY */
  const char *etcd, *etcd_user, *etcd_password_file, *etcd_ca, *etcd_cert, *etcd_key;
  const char *job;       /* NULL: NEWT_JOB */
  const char *worker_id; /* NULL: NEWT_WORKER_ID, else POD_NAME, else host-pid */
  const char *host;      /* workers of one host share memory; NULL: NEWT_HOST, else the host name */
  const char *addr;      /* the IPv4 address peers reach this worker at; NULL: NEWT_ADDR, else POD_IP, else 127.0.0.1 */
  int port;              /* the data plane's port (0: any); NEWT_FROM_ENV: NEWT_PORT, else 0 */
  /* -1: the state is host memory and the groups are CPU communicators; >= 0: that CUDA
     device, the groups NCCL on cuda_stream. NEWT_FROM_ENV: NEWT_DEVICE, else LOCAL_RANK
     modulo the GPUs visible when the job trains on GPUs (spec.backend nccl), else -1. */
  int device;
  void *cuda_stream;     /* the program's cudaStream_t (NULL: the legacy default stream) */
  int share_device;      /* 1: other workers may train on this GPU too; NEWT_FROM_ENV: NEWT_SHARE_DEVICE */
  const newt_memory *memory; /* NULL: built in (host memory, or the CUDA runtime for a device) */
  const char *job_secret_file; /* NULL: NEWT_JOB_SECRET_FILE (the data plane's keys, and the proof of
                                  its records and checkpoints, come from it; refused when another user
                                  owns it or can read or write it) */
  const char *step_log;        /* while rank 0, one JSON line per step here; NULL: NEWT_STEP_LOG */
  const char *metrics_addr;    /* NULL: NEWT_METRICS_ADDR, else 127.0.0.1 */
  int metrics_port;            /* /metrics and /healthz (0: none); NEWT_FROM_ENV: NEWT_METRICS_PORT */
  const char *termination_log; /* NULL: NEWT_TERMINATION_LOG, else /dev/termination-log when it exists */
  int handle_signals;          /* 1: SIGTERM and SIGINT ask for a graceful leave (the default); 0: the program
                                  calls newt_leave */
  int64_t spec_wait_ms;        /* how long to wait, in all, for etcd to answer and the job's spec to appear;
                                  then newt_join fails naming etcd's address (0: NEWT_SPEC_WAIT_MS, else 60 s) */
  const char *domain;          /* the failure domain: what goes down as a unit with this worker (a node, a
                                  rack, a zone); copies of a shard are placed in other domains. NULL:
                                  NEWT_DOMAIN, else the host */
} newt_join_opts;

/* The defaults of the first `size` bytes of o (the caller's sizeof, set in o->size): a
 * program built against an older header, with a smaller struct, gets only the fields it
 * has. newt_join_opts_init(o) is the same with sizeof *o; the function of that name (a
 * program built against 0.1.0's header calls it) fills only the fields 0.1.0 had. */
NEWT_API void newt_join_opts_init_size(newt_join_opts *o, size_t size);
NEWT_API void newt_join_opts_init(newt_join_opts *o);
#define newt_join_opts_init(o) newt_join_opts_init_size((o), sizeof *(o))
#define NEWT_JOIN_OPTS_INIT                                                                                     \
  {                                                                                                             \
    sizeof(newt_join_opts), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NEWT_FROM_ENV,           \
        NEWT_FROM_ENV, NULL, NEWT_FROM_ENV, NULL, NULL, NULL, NULL, NEWT_FROM_ENV, NULL, 1, 0                    \
  }

/* Becomes a worker of the job: reads its spec from etcd (waiting for it), binds the data
 * plane's socket. It registers (and so can be planned) at the first newt_step_begin.
 * `o` may be NULL (everything from the environment, as `newt run -- COMMAND` sets it). */
NEWT_API newt_result_t newt_join(const newt_join_opts *o, newt_ctx **out);

/* For a program that opens its device after joining (newt_job_get says which): the CUDA
 * stream newt's copies and NCCL's collectives go on, and optionally the program's own
 * memory functions (NULL: the CUDA runtime's). Before the first newt_step_begin. */
NEWT_API newt_result_t newt_use_device(newt_ctx *c, void *cuda_stream, const newt_memory *memory);

typedef struct newt_job_info {
  size_t size;
  const char *job, *worker_id;
  int64_t steps;        /* the job trains this many steps */
  int64_t global_batch; /* samples per step, whatever the world size */
  int64_t micro_batch;  /* samples per micro-batch: each rank takes its accum of them per step */
  int zero;             /* the spec's ZeRO stage (0..3): how far the program shards its optimizer state */
  int device;           /* the CUDA device (-1: the CPU) */
  const char *spec_json; /* the job's whole spec, as JSON */
} newt_job_info;
NEWT_API newt_result_t newt_job_get(newt_ctx *c, newt_job_info *out);

/* ---- the layout of a generation -------------------------------------------------------------- */

/* Ranks are ordered rank = (pp_rank * dp + dp_rank) * tp + tp_rank (Megatron's order); the
 * tensor-parallel group of a rank shares its pipeline and data coordinates (one host), and
 * so on. A group of one rank is NULL. The pointers are valid until the next generation. */
typedef struct newt_layout {
  size_t size;
  uint64_t generation;
  int rank, world;    /* this rank among the ranks that train (world = dp * tp * pp) */
  int dp, tp, pp;     /* the group sizes */
  int dp_rank, tp_rank, pp_rank;
  int64_t accum;      /* micro-batches per step on this data-parallel rank (the ranks split the
                         global batch's samples as evenly as they go: the first ones may take
                         one sample, so one micro-batch, more; or by their measured speeds) */
  newt_comm *world_comm, *dp_comm, *tp_comm, *pp_comm;
  int64_t accum_max;  /* the most micro-batches any data-parallel rank takes per step (the ranks'
                         shares may differ by more than one: the leader rebalances for a
                         straggler by measured speed; docs/elastic.md, "Stragglers") */
} newt_layout;
NEWT_API newt_result_t newt_layout_get(newt_ctx *c, newt_layout *out);

/* ---- collectives --------------------------------------------------------------------------------- */

/* Buffers are host memory in a CPU job, device memory (queued on cuda_stream) on GPUs. A
 * peer that died, hung or left makes a collective return NEWT_ERR_PEER, NEWT_ERR_TIMEOUT or
 * NEWT_ERR_ABORTED within the job's deadline: return to newt_step_begin. A group of a
 * generation that ended gives NEWT_ERR_INVALID. */
NEWT_API int newt_comm_rank(const newt_comm *c);
NEWT_API int newt_comm_size(const newt_comm *c);
/* The same ranks, for host buffers (an NCCL group's CPU companion; a CPU group itself). */
NEWT_API newt_comm *newt_comm_host(newt_comm *c);
/* Collective over parent: the ranks of one color form a group, ordered by key (then rank);
 * color < 0: none (*out NULL). Freed with the generation. */
NEWT_API newt_result_t newt_comm_split(newt_comm *parent, int color, int key, newt_comm **out);

NEWT_API newt_result_t newt_allreduce(newt_comm *c, const void *send, void *recv, size_t count, newt_dtype dt,
                                      newt_op op);
/* send holds size * recvcount elements; rank r receives the reduced block r. */
NEWT_API newt_result_t newt_reduce_scatter(newt_comm *c, const void *send, void *recv, size_t recvcount,
                                           newt_dtype dt, newt_op op);
/* recv holds size * sendcount elements, block r from rank r. */
NEWT_API newt_result_t newt_allgather(newt_comm *c, const void *send, void *recv, size_t sendcount, newt_dtype dt);
NEWT_API newt_result_t newt_broadcast(newt_comm *c, const void *send, void *recv, size_t count, newt_dtype dt,
                                      int root);
NEWT_API newt_result_t newt_send(newt_comm *c, const void *buf, size_t count, newt_dtype dt, int peer);
NEWT_API newt_result_t newt_recv(newt_comm *c, void *buf, size_t count, newt_dtype dt, int peer);
NEWT_API newt_result_t newt_barrier(newt_comm *c);
/* Queued in issue order, progressing in the background; every request must be waited for
 * (newt_wait frees it), also after a failure. */
NEWT_API newt_result_t newt_allreduce_async(newt_comm *c, const void *send, void *recv, size_t count, newt_dtype dt,
                                            newt_op op, newt_req **req);
NEWT_API newt_result_t newt_reduce_scatter_async(newt_comm *c, const void *send, void *recv, size_t recvcount,
                                                 newt_dtype dt, newt_op op, newt_req **req);
NEWT_API newt_result_t newt_allgather_async(newt_comm *c, const void *send, void *recv, size_t sendcount,
                                            newt_dtype dt, newt_req **req);
NEWT_API newt_result_t newt_wait(newt_req *req);

/* ---- training state ------------------------------------------------------------------------------ */

/* Flags of a tensor. */
#define NEWT_TENSOR_DEVICE 1u  /* data is device memory (the join's device); else host memory */
#define NEWT_TENSOR_DERIVED 2u /* rebuilt from others after each update (ZeRO 1/2's gathered parameters
                                  beside the owned chunk): filled on a restore, never saved, a source
                                  only when the last step ended whole */

/* A tensor of the state, or the part of it this rank holds: a box of the whole tensor
 * (offset and extent per dimension; NULL: the whole tensor) narrowed to the elements
 * [begin, end) of the box in row-major order (end 0: the whole box). The parts every rank
 * declares must tile each tensor: each element held by some rank, two parts either equal
 * (replicas), disjoint (shards) or one inside the other (a shard inside a replica). */
#define NEWT_MAX_DIMS 8
#define NEWT_NAME_MAX 71
typedef struct newt_tensor {
  size_t size;
  const char *name;     /* unique in the job, printable, at most NEWT_NAME_MAX bytes: its name in checkpoints */
  newt_dtype dtype;
  int ndim;             /* 1 .. NEWT_MAX_DIMS */
  const int64_t *shape; /* the whole tensor */
  const int64_t *offset, *extent; /* the box this rank holds (NULL: the whole tensor) */
  int64_t begin, end;   /* within the box, row-major (end 0: all of it) */
  void *data;           /* the elements, in that order */
  size_t bytes;         /* the buffer's size: (end - begin) * the dtype's size */
  unsigned flags;       /* NEWT_TENSOR_* */
} newt_tensor;
NEWT_API void newt_tensor_init(newt_tensor *t);
#define NEWT_TENSOR_INIT {sizeof(newt_tensor), NULL, NEWT_F32, 0, NULL, NULL, NULL, 0, 0, NULL, 0, 0}

/* Declares a tensor of this rank's state for the current generation (after
 * NEXT_GENERATION, before newt_state_restore). The memory must stay valid, and be written
 * only by the program's steps, until the next generation's restore returned. Sizes are
 * checked without overflow here: the tensor's bytes (the shape's product times the dtype's
 * size) fit 64 bits, offset[i] + extent[i] <= shape[i]; else NEWT_ERR_INVALID naming the field. */
NEWT_API newt_result_t newt_state_tensor(newt_ctx *c, const newt_tensor *t);

typedef enum newt_scope {
  NEWT_PER_JOB = 0, /* the same bytes on every rank (a data loader's position): restored on every rank */
  NEWT_PER_RANK = 1 /* this rank's own (an RNG): restored to the rank of the same number where a state of
                       that step has one, else left as it is (newt_restore_info.bytes_missing) */
} newt_scope;
/* Declares opaque bytes of the state: len bytes at buf (len at most INT64_MAX), saved and
 * restored with the tensors. */
NEWT_API newt_result_t newt_state_bytes(newt_ctx *c, const char *name, newt_scope scope, void *buf, size_t len);

/* The program's own fields of a checkpoint's state document (a JSON object's text, malloc'd:
 * newt frees it), and the check of a loaded one: return NEWT_ERR_INVALID, with a message
 * naming the field, to refuse a checkpoint of another run. Either may be NULL. */
typedef char *(*newt_doc_write_fn)(void *arg, int64_t step);
typedef newt_result_t (*newt_doc_check_fn)(void *arg, const char *state_json, int64_t step);
NEWT_API newt_result_t newt_state_document(newt_ctx *c, newt_doc_write_fn write, newt_doc_check_fn check, void *arg);

typedef enum newt_source {
  NEWT_FROM_MEMORY = 0,     /* every part was already here */
  NEWT_FROM_PEERS = 1,      /* some came from other ranks (a leaver's included) */
  NEWT_FROM_CHECKPOINT = 2, /* the newest checkpoint that reads back whole */
  NEWT_FROM_NOTHING = 3     /* nobody holds a state: a new job (initialise the state, identically on every rank) */
} newt_source;

typedef struct newt_restore_info {
  size_t size;
  int64_t step;          /* steps the state has done */
  newt_source source;
  int64_t bytes_received;
  int bytes_missing;     /* NEWT_PER_RANK bytes that no state held for this rank (left as they were) */
} newt_restore_info;
/* Collective over the generation: fills every declared tensor and bytes with the newest
 * whole state. The previous generation's declarations are read while it runs and released
 * when it returns NEWT_OK: their memory may be freed then. Once the parts are filled it
 * returns NEWT_OK even if a peer is lost in its last collective (the check of the restored
 * state): the state is in this declaration, and the next newt_step_begin recovers. When it
 * returns an error, this declaration holds nothing newt needs (the program may reuse or free
 * it) and the state stays where it was: keep the previous declaration's memory. */
NEWT_API newt_result_t newt_state_restore(newt_ctx *c, newt_restore_info *out);

/* ---- steps ------------------------------------------------------------------------------------------- */

typedef enum newt_next {
  NEWT_NEXT_STEP = 0,       /* run the step in the batch */
  NEWT_NEXT_GENERATION = 1, /* a new layout: newt_layout_get, declare the state, newt_state_restore */
  NEWT_NEXT_DONE = 2,       /* the job trained its last step */
  NEWT_NEXT_LEFT = 3,       /* this worker left (a signal, newt_leave), its state handed over */
  NEWT_NEXT_FAILED = 4,     /* the job failed (its failure budget is spent, its state lost, ...) */
  NEWT_NEXT_LEFT_OUT = 5    /* the job is done without this worker: it trained, was left out (stopped, cut
                               off) and not taken back before the end; its loss is not the job's */
} newt_next;

/* A step's samples: step s covers the global sample indices [(s - 1) * global_batch,
 * s * global_batch) of the job's sample stream, whatever the world size; this rank takes
 * [first, first + count): the data-parallel ranks split the global batch as evenly as it
 * goes (the first global_batch % dp take one sample more), in accum micro-batches of
 * micro_batch (the last may be shorter). Average the loss over the global batch (divide by
 * global_batch, not count) and sum gradients over the data-parallel group: the update is
 * then the same at any world size, however unequal the ranks' shares. */
typedef struct newt_batch {
  size_t size;
  int64_t step; /* the step's number: steps done + 1 */
  int64_t first, count;
  int64_t micro_batch, accum, global_batch;
} newt_batch;

/* The next thing to do. After a failed collective (or any error of the step) call it again:
 * it reports whom this rank lost and waits for the next plan (NEXT_GENERATION). A step
 * begun and not ended is an error unless its generation failed. */
NEWT_API newt_result_t newt_step_begin(newt_ctx *c, newt_batch *b, newt_next *next);

/* After the step's gradients are reduced, before the update: every rank of the generation
 * agrees the step happened (and on what the next step boundary brings: a leave, a switch),
 * and newt keeps the pre-update state. values[0..n) (n <= 32, may be 0) are summed over the
 * ranks in rank order, in double, into sums (bitwise the same on every rank). NEWT_OK: apply
 * the update. An error: do not; return to newt_step_begin. */
NEWT_API newt_result_t newt_step_commit(newt_ctx *c, const double *values, double *sums, int n);

typedef struct newt_step_result {
  size_t size;
  double loss;          /* the step's mean loss (for progress, the step log, the summary) */
  double lr;            /* the learning rate it used (the step log; 0: not known) */
  int64_t tokens;       /* tokens of the global batch (tokens/s; 0: count samples) */
  newt_result_t after;  /* the result of collectives after the update (a ZeRO all-gather): an error leaves
                           NEWT_TENSOR_DERIVED tensors stale */
  double grad_norm;     /* the gradients' global norm before clipping (the step log, metrics; 0: not known) */
} newt_step_result;
NEWT_API void newt_step_result_init(newt_step_result *r);
/* After the update: the step is done. Progress, the step log, periodic checkpoints and the
 * copies that let a lost rank be restored from memory follow, off the step's path where
 * they can be. An error (a peer lost meanwhile): return to newt_step_begin. */
NEWT_API newt_result_t newt_step_end(newt_ctx *c, const newt_step_result *r);

/* Asks to leave at the next step boundary, handing this rank's state to the others (as
 * SIGTERM does); newt_step_begin then says NEXT_LEFT. */
NEWT_API void newt_leave(newt_ctx *c);

/* Ends this worker's part: deregisters, writes the termination message, frees c. `r` is the
 * program's own verdict (NEWT_OK, or the error that stops it). Returns the exit status the
 * program should end with: 0 done, 3 left, 4 the job failed, 5 left out (this worker trained, was
 * left out -- stopped, cut off -- and the job ended done without it), 1 an error, 2 an error another
 * try will not mend (NEWT_ERR_INVALID, NEWT_ERR_UNSUPPORTED), as `newt worker`'s (the node
 * agent and the chart read them). */
NEWT_API int newt_finish(newt_ctx *c, newt_result_t r);

#ifdef __cplusplus
}
#endif

#endif
