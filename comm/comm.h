/* The collective interface: what every layer above (worker, model parallelism, ZeRO,
 * checkpoint resharding) uses to talk to its peers, whatever the backend.
 *
 * A communicator is built from what a plan gives: this rank, the world size, every
 * rank's address and host, the generation and its secret, deadlines. Both backends take
 * the same configuration: the NCCL backend builds, over the same addresses, a CPU
 * communicator of the same ranks as its control channel, through which rank 0 hands a
 * fresh NCCL unique id to the others (one per communicator built, never reused) and
 * every rank tells the others of a failure. It is built anew for each generation; nothing
 * from an older generation can join it (every connection proves generation and secret).
 * Sub-communicators for data / tensor / pipeline groups come from comm_split.
 *
 * Failure model. Every operation either completes on every rank or fails on every
 * surviving rank: a peer that dies (connection closed) is seen within milliseconds, one
 * that stops (SIGSTOP, hung) once timeout_ms passes without progress. A failed or aborted
 * communicator stays failed: every later operation returns the same error at once, and
 * comm_get_status() says which peer failed and why. The only way on is a new communicator
 * (next generation: comm_create, or comm_shrink among the survivors). comm_abort() may
 * be called from any thread; every pending and later operation then fails within 100 ms.
 * comm_free() after a failure or an abort releases everything (connections, threads,
 * shared memory, device resources).
 *
 * Buffers live where the backend computes: host memory for the CPU backend, device
 * memory for NCCL, where every operation is enqueued on the communicator's CUDA stream
 * (comm_config.stream, comm_set_stream) after the work queued there before it, and the
 * call waits for it by polling an event, never blocking in CUDA. Counts are in elements.
 * In-place operation (send == recv) is allowed
 * for allreduce and broadcast; for reduce_scatter recv may point at
 * send + rank * recvcount, for allgather send may point at recv + rank * sendcount, as
 * in NCCL. */
#ifndef NEWT_COMM_COMM_H
#define NEWT_COMM_COMM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/backend.h"
#include "common/dtype.h"
#include "common/err.h"

typedef struct comm comm_t;
typedef struct comm_req comm_req_t;

/* A communicator's backend: a row of the backend table (common/backend.h), which names it
 * and says its device; comm/backend.c holds each one's operations and library. */
typedef newt_backend_id comm_backend;
#define COMM_BACKEND_CPU NEWT_BACKEND_CPU
#define COMM_BACKEND_NCCL NEWT_BACKEND_NCCL

/* The library behind backend b, loaded now if it is not yet: a line naming its version and
 * file into desc (CPU: "built in"; NCCL: libnccl.so.2, loaded at run time: comm/nccl_lib.h).
 * NEWT_ERR_UNSUPPORTED for a backend this newt was built without; else the loader's error
 * (what it tried, or a version too old). */
newt_result_t comm_backend_library(comm_backend b, char *desc, size_t n);

/* GPUs this process can use (cudaGetDeviceCount; CUDA_VISIBLE_DEVICES applies): 0 in a build
 * without CUDA, on a host without a driver or GPU. The one count of newt's: the worker, the
 * model's device, `newt run` and the benches ask it. cuda_error (may be NULL) gets the CUDA
 * runtime's error when the count failed (a cudaError_t; 0: none, also without CUDA). */
int comm_gpu_count(int *cuda_error);

typedef enum comm_op { COMM_SUM = 0, COMM_AVG = 1, COMM_MAX = 2 } comm_op;

#define COMM_SECRET_MAX 64

/* The key of one generation's data plane, derived from the job's secret (a file only the
 * workers hold: a Kubernetes Secret, or the one `newt run` makes) and the plan's public salt:
 * HMAC-SHA256(job_secret, "newt-generation" | job | generation | salt). The plan in etcd
 * then carries the salt only, so who reads etcd cannot join or impersonate a rank. 32 bytes
 * into out; NEWT_ERR_INVALID when the job secret is shorter than 16 bytes. */
#define COMM_KEY_BYTES 32
newt_result_t comm_derive_secret(const void *job_secret, size_t job_secret_len, const char *job, uint64_t generation,
                                 const unsigned char *salt, size_t salt_len, unsigned char out[COMM_KEY_BYTES]);

typedef struct comm_config {
  comm_backend backend;
  int rank;
  int size;
  /* addrs[r] is "ip:port" ("[v6]:port") where rank r listens (this rank binds its own;
   * free the previous generation's communicator on the same address first, binding is
   * retried until the deadline); hosts[r] names r's host: ranks with equal hosts[] use
   * shared memory, others TCP. NCCL: the control channel's. */
  const char *const *addrs;
  const char *const *hosts;
  const char *job;     /* names shared-memory segments; any short identifier */
  uint64_t generation; /* proven on every connection */
  unsigned char secret[COMM_SECRET_MAX];
  size_t secret_len;   /* 16 to COMM_SECRET_MAX bytes */
  /* The longest an operation may go without progress (CPU: no byte moved; NCCL: no
   * operation of the communicator started or completed, and no peer moved on): then the
   * peers are probed and the one that stopped is named. */
  int64_t timeout_ms;
  /* Deadline of comm_create, and of comm_split and comm_shrink on what it builds. 0: the
   * backend's default: timeout_ms for the CPU backend; NEWT_COMM_NCCL_BUILD_MS (120 s),
   * and at least timeout_ms, for NCCL (topology, connections, a fresh unique id). */
  int64_t build_timeout_ms;
  /* NCCL backend: the CUDA device, and the stream operations are enqueued on (a
   * cudaStream_t: the model's, so a collective runs after the compute queued before it;
   * NULL: a stream of the communicator's own). Split and shrink children inherit it. */
  int device;
  void *stream;
  /* > 0: a socket already bound to addrs[rank] and listening, held by the caller for its
   * whole life (a worker keeps its data-plane port from one generation to the next, so no
   * other process can take it between them). The communicator listens on a duplicate and
   * never closes the caller's. 0: bind addrs[rank] here. */
  int listen_fd;
  /* Optional: once *cancel is nonzero, a build under way gives up at once with
   * NEWT_ERR_ABORTED (a newer plan made it moot), telling the peers. CPU: read during
   * comm_create; NCCL: during comm_create, and comm_split / comm_shrink of what it built
   * (the pointer must stay valid as long as the communicator). */
  const atomic_int *cancel;
  /* Every peer listens on its address before any build starts (as workers do, holding
   * their socket for life), so a connection refused there means the peer's process is
   * gone: the build fails within ~200 ms naming it, not at its deadline. */
  int peers_listen;
  /* CPU backend, optional: [size]; after a build that failed, 1 for each peer whose links
   * were not made (it never came, or could not prove the generation), 0 for the others: whom
   * a rank can blame for a generation that never formed. */
  int *missing;
} comm_config;

/* Why a communicator failed. */
typedef struct comm_status {
  newt_result_t code; /* NEWT_OK while healthy */
  int peer;           /* rank (in this communicator) that failed; -1 when unknown */
  char msg[256];      /* "rank 2 (10.0.0.3:4012) closed the connection during allreduce" */
} comm_status;

/* Builds the communicator; collective over all `size` ranks; fails by cfg->timeout_ms
 * naming the ranks that did not connect. */
newt_result_t comm_create(const comm_config *cfg, comm_t **out);

/* Collective over the parent: ranks with the same color form a sub-communicator,
 * ordered by key (then by parent rank). color < 0: this rank gets *out = NULL. A failure
 * of the parent fails its children, and of a child its parent. */
newt_result_t comm_split(comm_t *parent, int color, int key, comm_t **out);

/* Collective over the survivors of a failed (or healthy) communicator: every rank not in
 * exclude[0..nexclude) calls it with the same list (nexclude may be 0) and gets a
 * communicator without the excluded ranks (ranks renumbered in order), proving
 * `generation` and `secret`. The parent is retired by it (aborted, a healthy one too) and
 * must still be freed by the caller, before or after the new one. CPU: new connections
 * through the parent's listening sockets (the parent's streams may hold the failed
 * operation's bytes). NCCL: the control channel is shrunk first; then, where every
 * survivor's NCCL communicator is healthy once revoked, ncclCommShrink; otherwise (an
 * asynchronous NCCL error, nobody excluded) a new NCCL communicator of the survivors from
 * a fresh unique id. Different exclude lists on different ranks fail by the deadline;
 * the survivors must call it within the build deadline of each other. */
newt_result_t comm_shrink(comm_t *c, const int *exclude, int nexclude, uint64_t generation,
                          const unsigned char *secret, size_t secret_len, comm_t **out);

/* Which of the listeners at addrs[0..n) are gone: a TCP connect to each, all at once, for at
 * most timeout_ms. state[i] = 1: it accepted (a process listens there, whether or not it
 * answers), 0: refused (nothing listens: where every peer holds its listening socket for
 * life, as workers do, its process is gone), -1: no answer by then, or another error (a
 * host that is down, a cut link: nothing proven). NULL or empty addrs[i]: state -1, nothing
 * tried. The connections are closed at once; the listener sees a connection that says
 * nothing, which a build refuses. */
newt_result_t comm_probe_listeners(const char *const *addrs, int n, int64_t timeout_ms, int *state);

/* How well the links to the listeners at addrs[0..n) carry data, all at once: to each a
 * connection that sends a link probe of `bytes` (at most COMM_LINK_PROBE_MAX), which a
 * communicator's or a build's listener reads whole and answers between its operations
 * (cpu_auth.c), then closes. ms[i]: from the start of the connect to the answer, or -1:
 * refused, not answered within timeout_ms, or another error. NULL or empty addrs[i]: -1. */
#define COMM_LINK_PROBE_MAX (8u << 20)
newt_result_t comm_time_links(const char *const *addrs, int n, size_t bytes, int64_t timeout_ms, double *ms);

/* NCCL: the stream later operations of c are enqueued on (a cudaStream_t; NULL: the
 * communicator's own). They run after the work queued on it before them; operations
 * already issued stay on their stream. CPU: accepted and ignored. */
newt_result_t comm_set_stream(comm_t *c, void *stream);

/* How long an operation of c's family (its root, every split, their control channels) goes
 * without progress before the peers are probed: a peer that does not answer (stopped, hung)
 * is named then, at once; one that answers but has not entered the operation (still
 * computing) is waited for up to comm_config.timeout_ms, the cap. ms is clamped to
 * [1, timeout_ms]; until set, it is timeout_ms. From any thread, between or during
 * operations (a wait takes the new value at its next look). */
void comm_set_stall(comm_t *c, int64_t ms);

/* The communicator of the same ranks for host memory: c itself for the CPU backend, an
 * NCCL communicator's control channel (a CPU communicator whose failure is c's, and the
 * other way round). What a generation moves between host buffers (control values, pieces
 * of state staged from the device) goes over it. Owned by c: valid until comm_free(c). */
comm_t *comm_host_channel(comm_t *c);

int comm_rank(const comm_t *c);
int comm_size(const comm_t *c);
comm_backend comm_get_backend(const comm_t *c);

newt_result_t comm_allreduce(comm_t *c, const void *send, void *recv, size_t count, newt_dtype dt,
                             comm_op op);
/* send holds size * recvcount elements; rank r receives the reduced block r. */
newt_result_t comm_reduce_scatter(comm_t *c, const void *send, void *recv, size_t recvcount,
                                  newt_dtype dt, comm_op op);
/* recv holds size * sendcount elements, block r from rank r. */
newt_result_t comm_allgather(comm_t *c, const void *send, void *recv, size_t sendcount,
                             newt_dtype dt);
newt_result_t comm_broadcast(comm_t *c, const void *send, void *recv, size_t count, newt_dtype dt,
                             int root);
newt_result_t comm_send(comm_t *c, const void *buf, size_t count, newt_dtype dt, int peer);
newt_result_t comm_recv(comm_t *c, void *buf, size_t count, newt_dtype dt, int peer);
newt_result_t comm_barrier(comm_t *c);

/* Nonblocking forms: the operation is queued and progresses in the background (CPU: a
 * progress thread per communicator; NCCL: the stream), in issue order; comm_wait returns
 * its result and frees the request. Buffers must stay valid until then. Used to overlap
 * gradient reduction with the backward pass. Every request must be waited for, also
 * after a failure or after comm_free (which completes pending ones with
 * NEWT_ERR_ABORTED); a blocking call issued meanwhile runs after the queued ones. */
newt_result_t comm_allreduce_async(comm_t *c, const void *send, void *recv, size_t count,
                                   newt_dtype dt, comm_op op, comm_req_t **req);
newt_result_t comm_reduce_scatter_async(comm_t *c, const void *send, void *recv, size_t recvcount,
                                        newt_dtype dt, comm_op op, comm_req_t **req);
newt_result_t comm_allgather_async(comm_t *c, const void *send, void *recv, size_t sendcount,
                                   newt_dtype dt, comm_req_t **req);
newt_result_t comm_wait(comm_req_t *req);

/* Nanoseconds the calling thread has spent, since it started, inside blocking operations and
 * comm_wait, of any communicator: what a rank waits for its peers (and moves bytes) rather than
 * computes. A step's compute is its wall time less what this grew by (worker/speed.c). Two
 * clock reads per call. */
uint64_t comm_thread_wait_ns(void);

/* Makes every pending and later operation fail (NEWT_ERR_ABORTED) within 100 ms. The
 * peers are told: their operations fail with NEWT_ERR_ABORTED too, comm_get_status naming
 * this rank (a deliberate drop, e.g. for a newer plan, not a crash). Async-signal-unsafe,
 * thread-safe, idempotent. */
void comm_abort(comm_t *c);

/* Health of the communicator: code NEWT_OK while usable. */
void comm_get_status(const comm_t *c, comm_status *st);

/* Frees the communicator (aborting it first if operations are pending); children from
 * comm_split must be freed before their parent. NULL is ignored. */
void comm_free(comm_t *c);

#endif
