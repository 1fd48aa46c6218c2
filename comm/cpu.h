/* Internals of the CPU backend: links to peers, the control channel, the wait loop, the
 * handshake and the builder. See docs/comm.md for the design; in short:
 *
 *  - Every pair of ranks has a control connection (TCP, authenticated by the handshake in
 *    cpu_auth.c). It carries small framed messages (doorbells, probes, failure notices,
 *    shared-memory set-up, goodbye) and is how a peer's death is seen at once: its
 *    kernel closes the socket.
 *  - Data moves over a byte stream per direction: a shared-memory ring (single producer,
 *    single consumer) between ranks on the same host, a second TCP connection otherwise.
 *  - An operation runs in one thread (the caller's, or the communicator's progress
 *    thread for *_async), the "executor". It moves bytes while it can, spins briefly when
 *    it cannot, then sleeps in poll() on the control sockets, the data sockets and an
 *    eventfd (abort). A rank about to sleep sets a flag in its shared-memory header; a
 *    peer that moves data for it sees the flag and sends a doorbell on the control
 *    connection.
 *  - No progress for timeout_ms: the executor probes the peer it waits for; a peer that
 *    answers says whom it waits for, and the probe follows the chain to the rank that
 *    does not answer. That rank is named in the error and in a failure notice to all. */
#ifndef NEWT_COMM_CPU_H
#define NEWT_COMM_CPU_H

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "comm/internal.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/param.h"

typedef struct cpu_comm cpu_comm;

/* Knobs (environment). */
NEWT_PARAM(CommShmRing, "NEWT_COMM_SHM_RING", 1 << 20)        /* bytes per shared-memory ring */
NEWT_PARAM(CommShmChunk, "NEWT_COMM_SHM_CHUNK", 64 << 10)     /* bytes copied per ring commit */
NEWT_PARAM(CommTcpChunk, "NEWT_COMM_TCP_CHUNK", 512 << 10)    /* bytes per send()/recv() */
NEWT_PARAM(CommTcpBuf, "NEWT_COMM_TCP_BUF", 4 << 20)          /* SO_SNDBUF/RCVBUF; 0: kernel's */
NEWT_PARAM(CommSmallBytes, "NEWT_COMM_SMALL_BYTES", 16 << 10) /* latency algorithms below */
NEWT_PARAM(CommSpinUs, "NEWT_COMM_SPIN_US", 200)              /* look (spin, yield) before sleeping */
NEWT_PARAM(CommTcpSpin, "NEWT_COMM_TCP_SPIN", 1)              /* TCP waits look before sleeping too */
NEWT_PARAM(CommHandshakeMs, "NEWT_COMM_HANDSHAKE_MS", 3000)   /* one incoming handshake */
NEWT_PARAM(CommFuse, "NEWT_COMM_FUSE", 1) /* forward straight into the next ring, stream results */
NEWT_PARAM(CommRound, "NEWT_COMM_ROUND", 256 << 10)           /* bytes per block per ring round */

/* Little-endian integers on the wire. */
static inline void le_put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void le_put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t le_get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static inline uint64_t le_get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* --- control messages ------------------------------------------------------------------
 * A frame is an 8-byte header {u8 type, u8 0, u16 payload length, u32 argument}
 * (little-endian) and the payload (at most CTRL_MAX_PAYLOAD bytes). A peer proved the
 * secret, not its honesty: ctrl_read checks every field of every frame (the type, the
 * reserved byte, the length against what the type carries, the argument, the ranks and
 * codes in the payload), and a frame that fails ends the link naming the peer and the
 * field (docs/comm.md, "What a peer with the secret can do"). */
enum {
  CTRL_DOORBELL = 1, /* wake up: data or space in a shared-memory ring */
  CTRL_PING,         /* arg = sequence (CTRL_EXT_PROBE set: another backend's probe) */
  CTRL_PONG,         /* arg = sequence; payload: i32 in_op, i32 waiting_on[, u64 ext[COMM_PROBE_VALUES]] */
  CTRL_FAIL,         /* arg = code; payload: i32 culprit, message */
  CTRL_BYE,          /* the peer freed its communicator */
  CTRL_SHM_OFFER,    /* payload: u64 segment size, u64 ring offset, u64 ring bytes, name */
  CTRL_SHM_MAPPED,   /* the peer mapped our segment */
};
#define CTRL_HDR 8
#define CTRL_MAX_PAYLOAD 400
#define CTRL_EXT_PROBE 0x80000000u /* a probe of comm_cpu_probe, answered with the hook's values */

typedef struct ctrl_msg {
  int type;
  uint32_t arg;
  size_t len;
  uint8_t payload[CTRL_MAX_PAYLOAD];
} ctrl_msg;

/* --- shared memory ----------------------------------------------------------------------
 * One segment per rank and communicator: a header page, then one receive ring per peer
 * on the same host. A ring is written by the peer (head) and read by the owner (tail). */
#define SHM_MAGIC 0x6e65777473686d31ull /* "newtshm1" */
#define SHM_HDR_BYTES 4096
#define SHM_MAX_BYTES ((uint64_t)1 << 40) /* the largest segment a peer may offer */

typedef struct shm_ring {
  _Atomic uint64_t head; /* bytes written, by the producer */
  char pad0[56];
  _Atomic uint64_t tail; /* bytes read, by the consumer */
  char pad1[56];
} shm_ring; /* the ring's data follows */
#define SHM_RING_HDR 128

typedef struct shm_hdr {
  uint64_t magic;
  uint64_t generation;
  uint32_t rank;
  uint32_t size;
  char pad[40];
  _Atomic uint32_t sleeping; /* the owner is (about to be) asleep in poll() */
  char pad1[60];
} shm_hdr;

typedef struct cpu_link {
  int peer;
  int local;   /* same host: data over shared memory */
  int ctrl_fd; /* -1 until connected */
  int data_fd; /* TCP peers only */
  char addr[96];
  /* control receive buffer */
  uint8_t crx[CTRL_HDR + CTRL_MAX_PAYLOAD];
  size_t crx_len;
  /* written by the thread that reads the control connection, read by any (a failure
   * notice, a probe's answer) */
  _Atomic int gone;     /* 0 live, 1 said goodbye, 2 closed without goodbye (died) */
  _Atomic int ctrl_eof; /* the control connection is closed: no longer polled */
  /* the peer's answer to the last comm_cpu_probe: its number and the hook's values */
  _Atomic uint32_t ext_seq;
  _Atomic uint64_t ext_val[COMM_PROBE_VALUES];
  /* shared memory */
  shm_ring *tx, *rx; /* tx in the peer's segment, rx in ours */
  uint8_t *txd, *rxd;
  size_t tx_ring, rx_ring; /* bytes of each ring (the receiver chooses) */
  size_t rx_off;           /* builder: our ring's offset in our segment */
  uint64_t tx_head, tx_tail, rx_tail; /* our copies */
  void *peer_map;
  size_t peer_map_len;
  shm_hdr *peer_hdr;
  int mapped_by_peer; /* builder: the peer mapped our segment */
  /* TCP receive staging (reductions read from here) */
  uint8_t *stage;
  size_t stage_cap, stage_r, stage_w;
} cpu_link;

/* --- the handshake (cpu_auth.c) ----------------------------------------------------- */
#define HS_HELLO_LEN 96
#define HS_PROBE_MAGIC "NEWTPRB1" /* a link probe's header (comm_time_links), not a hello */
#define HS_PROBE_VERSION 1
#define HS_CHAL_LEN 88
#define HS_MAC_LEN 32
#define HS_NONCE_LEN 32
enum { HS_KIND_CTRL = 0, HS_KIND_DATA = 1 };

/* What a handshake proves and whom it accepts. */
typedef struct hs_ctx {
  int rank, size;
  uint64_t generation, tag, members;
  const unsigned char *secret;
  size_t secret_len;
  /* server side: 1 when the link (peer, kind) is wanted now (not built, not a duplicate) */
  int (*want)(void *arg, int peer, int kind);
  void *arg;
  const char *where; /* "communicator build", "communicator" (for log lines) */
} hs_ctx;

typedef enum hs_state {
  HS_IDLE = 0,
  HS_CONNECTING,
  HS_C_HELLO,  /* client: sending hello */
  HS_C_CHAL,   /* client: reading challenge */
  HS_C_PROOF,  /* client: sending proof */
  HS_C_RESULT, /* client: reading result */
  HS_S_HELLO,  /* server: reading hello */
  HS_S_CHAL,   /* server: sending challenge */
  HS_S_PROOF,  /* server: reading proof */
  HS_S_RESULT, /* server: sending result */
  HS_S_REJECT, /* server: sending a refusal, then close */
  HS_S_DRAIN,  /* server: reading a link probe's bytes (comm_time_links) */
  HS_S_PROBED, /* server: answering a link probe, then close */
  HS_DONE,
  HS_FAILED,
} hs_state;

typedef struct hs_conn {
  int fd;
  hs_state st;
  int peer, kind; /* client: whom we connect to; server: who the hello claims to be */
  uint8_t in[HS_HELLO_LEN];
  size_t in_have, in_want;
  uint8_t out[HS_HELLO_LEN];
  size_t out_len, out_off;
  uint8_t hello[HS_HELLO_LEN];
  uint8_t nonce_s[HS_NONCE_LEN];
  newt_deadline_t deadline;
  char remote[96];
  char why[256]; /* why it failed */
  int retryable; /* client: the refusal may go away (peer not ready, other generation) */
  int conn_err;  /* client: the connect's errno (0: it connected) */
  uint64_t started_ns; /* server: when it was accepted */
  size_t drain;        /* server: a link probe's bytes still to read */
} hs_conn;

void hs_client_start(hs_conn *h, const hs_ctx *ctx, int fd, int peer, int kind, const char *remote,
                     newt_deadline_t deadline);
void hs_server_start(hs_conn *h, int fd, const char *remote, newt_deadline_t deadline);
/* Advances after poll() said the fd is ready (or on a timer); returns h->st. */
hs_state hs_step(hs_conn *h, const hs_ctx *ctx);
short hs_events(const hs_conn *h);
/* Closes the fd unless it was handed over (DONE). */
void hs_close(hs_conn *h);

/* Admission of an accepted connection before it proved anything, into the pending table
 * pending[0..*n) of room `cap`: a free slot when there is one; else the slot of the oldest
 * connection that has sent nothing for HS_SILENT_MS (closed, counted as a refusal), so a
 * flood of silent clients cannot keep the ranks of the plan out -- they speak at once; else
 * -1 (the caller closes the new one). Returns the slot, *n grown when it is a new one. */
#define HS_SILENT_MS 50
int hs_admit(hs_conn *pending, int *n, int cap, const char *where, int rank);

/* A refused connection, logged at `level` -- at most 3 lines per kind of refusal (its
 * reason) per 10 s for the whole process, then one line counting the rest: a flood of
 * refusals must not flood the log. */
void hs_log_refusal(newt_log_level level, const char *where, int rank, uint64_t generation, const char *remote,
                    const char *why);

/* Exposed for the tests: the wire forms. */
void hs_encode_hello(uint8_t out[HS_HELLO_LEN], uint64_t generation, uint64_t tag, uint64_t members,
                     int src, int dst, int size, int kind, const uint8_t nonce[HS_NONCE_LEN]);
void hs_mac(const unsigned char *secret, size_t secret_len, const char *label,
            const uint8_t hello[HS_HELLO_LEN], const uint8_t nonce_s[HS_NONCE_LEN],
            uint8_t out[HS_MAC_LEN]);

/* --- sockets (cpu_net.c) ------------------------------------------------------------- */
/* Parses "host:port" or "[v6]:port"; resolves numerically when it can. */
newt_result_t net_resolve(const char *addr, struct sockaddr_storage *ss, socklen_t *len);
/* A nonblocking listening socket on addr, retried (EADDRINUSE) until the deadline. */
newt_result_t net_listen(const char *addr, newt_deadline_t deadline, int *fd);
/* A listening socket on the host part of addr and a port the kernel picks; "host:port" out. */
newt_result_t net_listen_ephemeral(const char *like, int *fd, char *out, size_t cap);
/* Starts a nonblocking connect; *fd >= 0 on success (connection in progress). */
/* *err: the connect's errno when it failed at once (ECONNREFUSED: nothing listens there). */
newt_result_t net_connect_start(const struct sockaddr_storage *ss, socklen_t len, int *fd, int *err);
void net_tune(int fd, int data);
/* The next pending connection (nonblocking, close-on-exec), its peer's "ip:port" in
 * remote; -1 when none is pending. */
int net_accept(int lfd, char *remote, size_t cap);
/* "a.b.c.d:port" of the remote end (logs). */
void net_peer_name(int fd, char *out, size_t cap);
int net_set_nonblock(int fd);

/* --- the communicator ---------------------------------------------------------------- */
struct cpu_comm {
  struct comm *pub;
  int rank, size;
  uint64_t generation, tag, members;
  unsigned char secret[COMM_SECRET_MAX];
  size_t secret_len;
  int64_t timeout_ms;
  char **addrs;      /* [size] */
  char **hosts;      /* [size] */
  char **root_addrs; /* [size]: each rank's address in the family's root communicator */
  char **names;      /* [size]: "rank 2 (10.0.0.3:4012)", "rank 1 (world rank 3, 10.0.0.4:4012)" */
  char job[48];
  cpu_link *links; /* [size]; links[rank] unused */
  int nlocal;      /* peers on this host */
  int crowded;     /* more ranks on this host than CPUs: yield while spinning */
  int listen_fd;
  const atomic_int *cancel; /* comm_config.cancel: a build under way gives up */
  int peers_listen;         /* comm_config.peers_listen: a refused connection = a dead peer */
  int *missing;             /* comm_config.missing: filled when the build fails */
  int evfd;    /* wakes the executor's poll() (abort, failure) */
  int pt_evfd; /* wakes the progress thread's (queue, failure, stop) */
  /* our shared-memory segment */
  void *map;
  size_t map_len;
  shm_hdr *hdr;
  char shm_name[160];
  int shm_linked; /* the name still exists in /dev/shm */
  /* executor, queue, progress thread (under lock) */
  pthread_mutex_t lock;
  pthread_cond_t cv;
  int waiters;   /* threads in pthread_cond_wait on cv */
  int executing; /* an operation (or the idle control drain) owns the links */
  int draining;  /* ... and it is the control drain, no operation of the user's */
  int stop;
  struct comm_req *qhead, *qtail;
  pthread_t thread;
  int thread_started;
  int listener_released; /* the progress thread no longer touches listen_fd */
  hs_conn *strays;       /* refused connections in progress (progress thread) */
  int nstrays;
  /* executor state (read by the control handler) */
  struct cpu_wait *cur_wait;
  uint64_t op_seq;
  const char *op_name;
  pthread_mutex_t ctrl_send_lock;
  struct pollfd *pfds; /* [size + 4] */
  int *pfd_peer;       /* [size + 4]: the peer of each control entry in pfds */
  void *scratch;
  size_t scratch_cap;
  uint32_t split_seq;
  /* as another backend's control channel: what a probe's answer carries */
  void (*probe_hook)(void *arg, uint64_t out[COMM_PROBE_VALUES]);
  void *probe_arg;
  _Atomic int probe_hook_set;
  _Atomic uint32_t ext_probe_seq;
};

/* --- control channel (cpu_link.c) ----------------------------------------------------- */
/* Sends one frame without blocking; 0 when sent, -1 when it could not be (dropped). */
int ctrl_send(cpu_comm *c, cpu_link *l, int type, uint32_t arg, const void *payload, size_t len);
/* Reads the next frame and checks it for a communicator of c->size ranks: 1 got one, 0
 * none for now, -1 closed, -2 a frame no honest peer sends (or a connection closed in the
 * middle of one). why gets a clause naming what the peer did ("sent a control frame of
 * unknown type 200", "closed its connection"). */
int ctrl_read(cpu_comm *c, cpu_link *l, ctrl_msg *m, char *why, size_t cap);
/* Printable text of a peer's n bytes (control characters as '?'), NUL-terminated. */
void ctrl_text(const uint8_t *p, size_t n, char *out, size_t cap);
/* Handles every pending frame of l in an operation or while idle (PING, PONG, FAIL,
 * BYE, DOORBELL); a closed connection marks the peer gone. */
void ctrl_drain(cpu_comm *c, cpu_link *l);
/* Tells every live peer why c failed; the culprit is a root rank (-1: none). */
void ctrl_notify_fail(cpu_comm *c, newt_result_t code, int culprit_root, const char *msg);

/* --- data streams (cpu_link.c) -------------------------------------------------------- */
/* Takes up to len bytes into the stream to l; *n bytes taken (0: full). */
newt_result_t link_send(cpu_comm *c, cpu_link *l, const void *p, size_t len, size_t *n);
/* Points *p at up to *avail contiguous incoming bytes (0: none yet), reading into the
 * staging buffer for TCP; esize-aligned. */
newt_result_t link_peek(cpu_comm *c, cpu_link *l, size_t want, size_t esize, const uint8_t **p,
                        size_t *avail);
void link_consume(cpu_comm *c, cpu_link *l, size_t n);
/* Shared memory only: *p gets up to *room contiguous free bytes of the ring to l (at most
 * want, a multiple of esize); link_commit publishes the first n of them. Fails (naming
 * the peer) when the peer's tail is out of any honest range. */
newt_result_t link_reserve(cpu_comm *c, cpu_link *l, size_t want, size_t esize, uint8_t **p, size_t *room);
void link_commit(cpu_comm *c, cpu_link *l, size_t n);
/* Copies up to len incoming bytes to dst; *n copied (0: none yet). */
newt_result_t link_recv(cpu_comm *c, cpu_link *l, void *dst, size_t len, size_t *n);
/* After an operation: shared-memory stream positions to the next 64 bytes. */
void links_align(cpu_comm *c);
size_t link_chunk(const cpu_link *l);

/* --- the wait loop (cpu_link.c) ------------------------------------------------------- */
typedef struct cpu_wait {
  cpu_comm *c;
  uint64_t spin_until;
  uint64_t stall_at;
  int armed;
  int blocker; /* the peer we wait for, -1 none */
  int probing;
  int probe_target;
  int probe_hops;
  uint32_t probe_seq;
  uint64_t probe_until;
  uint64_t since; /* the last progress (monotonic ns) */
  int probes;     /* probes since then (the first is logged at INFO) */
  int slow_said;  /* a slow or lossy link was logged during this wait */
} cpu_wait;

void cpu_wait_init(cpu_wait *w, cpu_comm *c);
/* Bytes moved: resets the spin window and the no-progress deadline. */
void cpu_wait_progress(cpu_wait *w);
/* Nothing moved: rx is the link we want data from, tx the one we want to send to (either
 * may be NULL). Returns after a short spin or a sleep; an error when the communicator
 * failed, was aborted, a peer died, or made no progress for the stall deadline
 * (comm_set_stall) and did not answer a probe, or answered that it had not entered the
 * operation for timeout_ms. */
newt_result_t cpu_wait_block(cpu_wait *w, cpu_link *rx, cpu_link *tx);

/* --- algorithms (cpu_algo.c) ----------------------------------------------------------- */
newt_result_t cpu_algo_run(cpu_comm *c, const comm_opdesc *op);
/* Scratch space of at least n bytes (executor only). */
newt_result_t cpu_scratch(cpu_comm *c, size_t n, void **out);

/* --- the builder (cpu_build.c) ------------------------------------------------------- */
/* Connects every pair, proves generation and secret, sets up shared memory. Uses
 * c->listen_fd when >= 0 (taken over from a parent), else listens on addrs[rank]. */
newt_result_t cpu_build(cpu_comm *c, newt_deadline_t deadline);
/* Releases links, segments and sockets (no goodbye). */
void cpu_links_close(cpu_comm *c);

/* What a communicator's handshakes carry: the tag of a communicator built by
 * comm_create, and the hash of the member table (size, addresses, hosts). */
uint64_t cpu_root_tag(const char *job);
uint64_t cpu_members_hash(int size, const char *const *addrs, const char *const *hosts);

/* "rank 3 (10.0.0.4:4012)" */
const char *cpu_peer_name(cpu_comm *c, int peer);

#endif
