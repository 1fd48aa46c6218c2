/* The NCCL 2.28 calls newt makes, as a behavioural double (tests only): communicators
 * between real processes of one machine, host memory for device memory, and the
 * semantics newt's recovery depends on. Each behaviour names the NCCL function it
 * follows (src/init.cc, src/enqueue.cc, src/group.cc, src/misc/argcheck.cc,
 * src/misc/utils.cc of NVIDIA/nccl v2.28); docs/comm.md has the table.
 *
 * Bootstrap. ncclGetUniqueId opens a listening socket on 127.0.0.1 and starts a root
 * thread for it (bootstrapGetUniqueId/bootstrapRoot); the id carries its port and a
 * random magic. Each rank of ncclCommInitRankConfig opens a listening socket of its own,
 * tells the root its port, host hash and bus id, and gets every rank's back
 * (bootstrapAllGather of peerInfo); then each pair connects twice: a data connection
 * for collectives and a bootstrap connection for later splits and shrinks. The root ends
 * once it has served every rank (an id serves one communicator: a second use finds no
 * root), when every rank that came has gone, or after NEWT_NCCL_DOUBLE_ROOT_MS.
 *
 * Nonblocking communicators (config.blocking = 0): init, split, shrink, finalize and
 * revoke run as a job in a thread of their own and return ncclInProgress; the state is
 * read with ncclCommGetAsyncError, which joins a finished job. A split or shrink runs on
 * the parent: the parent answers ncclInProgress until the child is built, and the child
 * handle is written to *newcomm only when the job ends, even when it failed
 * (ncclCommInitRankFunc: "assign it to user pointer").
 *
 * Collectives are work on the caller's stream (double.h): every rank sends its part to
 * every peer over the data connections and reduces what it gets in rank order, so every
 * rank gets bitwise the same result. The work does not finish until its bytes have moved
 * or the communicator's abort flag is raised (ncclCommAbort, ncclCommRevoke,
 * ncclCommShrink with NCCL_SHRINK_ABORT): a stopped peer holds it for ever; a dead
 * peer's closed connection also records ncclRemoteError, which ncclCommGetAsyncError
 * reports (the proxy's asyncResult), and still holds it until the abort. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "double.h"

#define ID_TAG 0x4e44424cu   /* "NDBL": a unique id of the double */
#define COMM_MAGIC 0x6e63636cu
#define MSG_DATA 0x4e444154u /* "NDAT" */
#define MSG_BOOT 0x4e424f54u /* "NBOT" */

/* --- warnings and the last error (debug.cc: WARN, ncclGetLastError) ------------------- */

static pthread_mutex_t err_mu = PTHREAD_MUTEX_INITIALIZER;
static char last_error[1024];

static void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn(const char *fmt, ...) {
  char msg[sizeof last_error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&err_mu);
  memcpy(last_error, msg, sizeof msg);
  pthread_mutex_unlock(&err_mu);
  const char *d = getenv("NCCL_DEBUG");
  if (d && (!strcasecmp(d, "WARN") || !strcasecmp(d, "INFO") || !strcasecmp(d, "TRACE")))
    fprintf(stderr, "%d [%d] NCCL WARN %s\n", (int)getpid(), dbl_current_device(), msg);
}

const char *ncclGetLastError(ncclComm_t comm) {
  /* NCCL returns its one buffer (racy when another thread warns meanwhile); the double
   * hands each thread a copy */
  static __thread char mine[sizeof last_error];
  (void)comm; /* "comm is currently unused and can be set to NULL" */
  pthread_mutex_lock(&err_mu);
  memcpy(mine, last_error, sizeof mine);
  pthread_mutex_unlock(&err_mu);
  return mine;
}

const char *ncclGetErrorString(ncclResult_t code) {
  switch (code) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

ncclResult_t ncclGetVersion(int *version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

/* --- the communicator ----------------------------------------------------------------- */

typedef struct peer_info {
  uint32_t port;
  uint32_t pad;
  uint64_t host_hash;
  int64_t bus_id;
} peer_info;

enum { JOB_NONE = 0, JOB_INIT, JOB_CHILD, JOB_REVOKE, JOB_FINALIZE };

struct ncclComm {
  uint32_t start_magic;
  uint64_t magic; /* the communicator's identity in handshakes */
  int rank, nranks, device, blocking;
  _Atomic int async;       /* comm->asyncResult */
  _Atomic int proxy_error; /* what the transport saw (proxyState->asyncResult) */
  _Atomic uint32_t abort_flag;
  _Atomic uint32_t *child_abort; /* childAbortFlag: the child a split/shrink job builds (under mu) */
  int revoked, finalize_called, destroy_flag;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int inflight; /* collectives of this communicator queued or running (under mu) */
  /* the background job */
  int job_kind;
  pthread_t job;
  int job_running;
  _Atomic int job_done;
  /* the transport */
  int listen_fd;
  int *data_fd, *boot_fd;
  uint64_t *tx_seq, *rx_seq, *btx_seq, *brx_seq;
  peer_info *peers;
  uint64_t child_count, shrink_count;
  uint32_t end_magic;
};

/* What a job needs; freed by the job. */
typedef struct job_args {
  struct ncclComm *comm;  /* the job's communicator: its state is the job's result */
  struct ncclComm *child; /* split/shrink: the child being built (NULL: NCCL_SPLIT_NOCOLOR) */
  ncclComm_t *newcomm;    /* where the child handle is written when the job ends */
  ncclUniqueId id;
  int color, key, shrink;
  int *excl, nexcl;
  uint64_t tag;
} job_args;

static void set_abort_flags(struct ncclComm *c, uint32_t v) {
  /* init.cc setCommAbortFlags: the child being built is aborted with its parent */
  pthread_mutex_lock(&c->mu);
  if (c->child_abort) atomic_store(c->child_abort, v);
  atomic_store(&c->abort_flag, v);
  pthread_mutex_unlock(&c->mu);
}

static int aborted(struct ncclComm *a, struct ncclComm *b) {
  return (a && atomic_load(&a->abort_flag)) || (b && atomic_load(&b->abort_flag));
}

static void join_job(struct ncclComm *c) {
  if (c->job_running) {
    pthread_join(c->job, NULL);
    c->job_running = 0;
    c->job_kind = JOB_NONE;
  }
}

static ncclResult_t comm_check(struct ncclComm *c, const char *op) {
  /* argcheck.cc CommCheck */
  if (!c) {
    warn("%s : comm argument is NULL", op);
    return ncclInvalidArgument;
  }
  if (c->start_magic != COMM_MAGIC || c->end_magic != COMM_MAGIC) {
    warn("Error: corrupted comm object detected");
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  /* init.cc ncclCommGetAsyncError: comm->asyncResult, then the proxy's; a finished
   * group job is completed (joined) */
  ncclResult_t r = comm_check(comm, "ncclGetAsyncError");
  if (r != ncclSuccess) return r;
  if (!asyncError) {
    warn("ncclGetAsyncError : asyncError argument is NULL");
    return ncclInvalidArgument;
  }
  if (comm->job_running && atomic_load(&comm->job_done)) join_job(comm);
  ncclResult_t a = (ncclResult_t)atomic_load(&comm->async);
  if (a == ncclSuccess) a = (ncclResult_t)atomic_load(&comm->proxy_error);
  *asyncError = a;
  return ncclSuccess;
}

static ncclResult_t ensure_ready(struct ncclComm *c) {
  /* init.cc ncclCommEnsureReady: with the abort flag up the job is stopped and joined;
   * otherwise the async state, InProgress meaning "not ready" (ncclInvalidArgument) */
  if (atomic_load(&c->abort_flag)) {
    join_job(c);
    return ncclSuccess;
  }
  ncclResult_t r = ncclSuccess;
  ncclCommGetAsyncError(c, &r);
  if (r == ncclInProgress) {
    warn("Attempt to use communicator before the previous operation returned ncclSuccess");
    return ncclInvalidArgument;
  }
  return r;
}

static struct ncclComm *comm_new(int device, int blocking) {
  struct ncclComm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->start_magic = c->end_magic = COMM_MAGIC;
  c->device = device;
  c->blocking = blocking;
  c->rank = c->nranks = -1;
  c->listen_fd = -1;
  atomic_store(&c->async, ncclInProgress);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  return c;
}

static void comm_release(struct ncclComm *c) {
  if (c->listen_fd >= 0) close(c->listen_fd);
  for (int r = 0; r < c->nranks; r++) {
    if (c->data_fd && c->data_fd[r] >= 0) close(c->data_fd[r]);
    if (c->boot_fd && c->boot_fd[r] >= 0) close(c->boot_fd[r]);
  }
  free(c->data_fd);
  free(c->boot_fd);
  free(c->tx_seq);
  free(c->rx_seq);
  free(c->btx_seq);
  free(c->brx_seq);
  free(c->peers);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  c->start_magic = c->end_magic = 0; /* commPoison */
  c->rank = c->nranks = c->device = -1;
  free(c);
}

static int comm_alloc_peers(struct ncclComm *c, int nranks) {
  c->nranks = nranks;
  c->data_fd = malloc(sizeof(int) * (size_t)nranks);
  c->boot_fd = malloc(sizeof(int) * (size_t)nranks);
  c->tx_seq = calloc((size_t)nranks, sizeof(uint64_t));
  c->rx_seq = calloc((size_t)nranks, sizeof(uint64_t));
  c->btx_seq = calloc((size_t)nranks, sizeof(uint64_t));
  c->brx_seq = calloc((size_t)nranks, sizeof(uint64_t));
  c->peers = calloc((size_t)nranks, sizeof(peer_info));
  if (!c->data_fd || !c->boot_fd || !c->tx_seq || !c->rx_seq || !c->btx_seq || !c->brx_seq || !c->peers) return -1;
  for (int r = 0; r < nranks; r++) c->data_fd[r] = c->boot_fd[r] = -1;
  return 0;
}

/* Waits until no collective of c is queued or running. */
static void wait_idle(struct ncclComm *c) {
  pthread_mutex_lock(&c->mu);
  while (c->inflight > 0) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
}

/* --- sockets ----------------------------------------------------------------------- */

enum { IO_OK = 0, IO_ABORTED = 1, IO_CLOSED = -1, IO_ERROR = -2, IO_TIMEOUT = -3 };

static int listen_any(int *fd_out, uint32_t *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 128) != 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  *fd_out = fd;
  *port = ntohs(sa.sin_port);
  return 0;
}

/* Connects to 127.0.0.1:port; refused connections are retried for refused_ms. */
static int connect_port(uint32_t port, struct ncclComm *a, struct ncclComm *b, int64_t refused_ms, int *fd_out) {
  uint64_t give_up = dbl_now_ns() + (uint64_t)refused_ms * 1000000ull;
  for (;;) {
    if (aborted(a, b)) return IO_ABORTED;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return IO_ERROR;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int r = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    int err = r == 0 ? 0 : errno;
    while (err == EINPROGRESS) {
      if (aborted(a, b)) {
        close(fd);
        return IO_ABORTED;
      }
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      if (poll(&p, 1, 10) > 0) {
        socklen_t l = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) != 0) err = errno;
      }
    }
    if (err == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      *fd_out = fd;
      return IO_OK;
    }
    close(fd);
    if (err != ECONNREFUSED || dbl_now_ns() > give_up) return IO_CLOSED;
    dbl_sleep_us(10000);
  }
}

/* Moves all of buf (send or receive) on a nonblocking socket, watching the abort flags;
 * timeout_ms < 0: none. */
static int io_full(int fd, void *buf, size_t n, int send_dir, struct ncclComm *a, struct ncclComm *b,
                   int64_t timeout_ms) {
  size_t off = 0;
  uint64_t until = timeout_ms < 0 ? UINT64_MAX : dbl_now_ns() + (uint64_t)timeout_ms * 1000000ull;
  while (off < n) {
    if (aborted(a, b)) return IO_ABORTED;
    ssize_t k = send_dir ? send(fd, (char *)buf + off, n - off, MSG_DONTWAIT | MSG_NOSIGNAL)
                         : recv(fd, (char *)buf + off, n - off, MSG_DONTWAIT);
    if (k > 0) {
      off += (size_t)k;
      continue;
    }
    if (k == 0 && !send_dir) return IO_CLOSED;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return errno == ECONNRESET || errno == EPIPE ? IO_CLOSED : IO_ERROR;
    if (dbl_now_ns() > until) return IO_TIMEOUT;
    struct pollfd p = {.fd = fd, .events = send_dir ? POLLOUT : POLLIN};
    poll(&p, 1, 10);
  }
  return IO_OK;
}

static uint64_t random64(void) {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) v = dbl_now_ns() ^ ((uint64_t)getpid() << 32);
  return v;
}

static uint64_t mix64(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

/* --- the unique id and its root (bootstrap.cc bootstrapGetUniqueId, bootstrapRoot) ------ */

typedef struct id_wire {
  uint32_t tag;
  uint32_t port;
  uint64_t magic;
} id_wire;

typedef struct hello_wire {
  uint64_t magic;
  int32_t nranks, rank;
  peer_info info;
} hello_wire;

typedef struct root_conn {
  int fd;
  hello_wire h;
  size_t have;
  int rank; /* -1 until its hello is complete */
} root_conn;

typedef struct root_args {
  int fd;
  uint64_t magic;
} root_args;

static void *root_main(void *arg) {
  root_args *ra = arg;
  int lfd = ra->fd;
  uint64_t magic = ra->magic;
  free(ra);
  uint64_t until = dbl_now_ns() + (uint64_t)dbl_knob("NEWT_NCCL_DOUBLE_ROOT_MS", 120000) * 1000000ull;
  int cap = 64, n = 0, nranks = -1, got = 0, ever = 0;
  root_conn *conns = calloc((size_t)cap, sizeof *conns);
  struct pollfd *pf = NULL;
  peer_info *table = NULL;
  char *taken = NULL; /* rank numbers already claimed */
  while (conns && dbl_now_ns() < until) {
    struct pollfd *npf = realloc(pf, sizeof *pf * ((size_t)n + 1));
    if (!npf) break;
    pf = npf;
    pf[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
    for (int i = 0; i < n; i++) pf[i + 1] = (struct pollfd){.fd = conns[i].fd, .events = POLLIN};
    poll(pf, (nfds_t)n + 1, 50);
    int k = 0;
    for (int i = 0; i < n; i++) {
      root_conn *c = &conns[i];
      int drop = 0;
      if (c->rank < 0) {
        ssize_t r = recv(c->fd, (char *)&c->h + c->have, sizeof c->h - c->have, MSG_DONTWAIT);
        if (r > 0) c->have += (size_t)r;
        else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) drop = 1;
        if (!drop && c->have == sizeof c->h) {
          int bad = c->h.magic != magic || c->h.nranks < 1 || c->h.rank < 0 || c->h.rank >= c->h.nranks ||
                    (nranks >= 0 && c->h.nranks != nranks);
          if (!bad && nranks < 0) {
            nranks = c->h.nranks;
            table = calloc((size_t)nranks, sizeof *table);
            taken = calloc((size_t)nranks, 1);
            if (!table || !taken) bad = 1;
          }
          if (!bad && taken[c->h.rank]) bad = 1; /* two ranks claim one rank number */
          if (bad) drop = 1;
          else {
            c->rank = c->h.rank;
            taken[c->rank] = 1;
            table[c->rank] = c->h.info;
            got++;
          }
        }
      } else {
        char b;
        if (recv(c->fd, &b, 1, MSG_DONTWAIT | MSG_PEEK) == 0) { /* the rank gave up (aborted) */
          drop = 1;
          taken[c->rank] = 0;
          got--;
        }
      }
      if (drop) close(c->fd);
      else conns[k++] = *c;
    }
    n = k;
    if (pf[0].revents) {
      int fd;
      while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
        if (n == cap) {
          root_conn *m = realloc(conns, sizeof *conns * (size_t)cap * 2);
          if (!m) {
            close(fd);
            continue;
          }
          conns = m;
          cap *= 2;
        }
        conns[n++] = (root_conn){.fd = fd, .rank = -1};
        ever = 1;
      }
    }
    if (nranks > 0 && got == nranks) {
      for (int i = 0; i < n; i++)
        if (conns[i].rank >= 0) io_full(conns[i].fd, table, sizeof *table * (size_t)nranks, 1, NULL, NULL, 10000);
      break;
    }
    if (ever && n == 0) break; /* every rank that came has gone */
  }
  for (int i = 0; conns && i < n; i++) close(conns[i].fd);
  free(conns);
  free(pf);
  free(table);
  free(taken);
  close(lfd);
  return NULL;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
  if (!uniqueId) {
    warn("GetUniqueId : out argument is NULL");
    return ncclInvalidArgument;
  }
  root_args *ra = malloc(sizeof *ra);
  uint32_t port = 0;
  if (!ra || listen_any(&ra->fd, &port) != 0) {
    free(ra);
    warn("bootstrap: cannot open the root's listening socket: %s", strerror(errno));
    return ncclSystemError;
  }
  ra->magic = random64();
  id_wire w = {.tag = ID_TAG, .port = port, .magic = ra->magic};
  pthread_t t;
  int fd = ra->fd;
  if (dbl_thread_start(&t, root_main, ra, 1) != 0) {
    close(fd);
    free(ra);
    warn("bootstrap: cannot start the root thread");
    return ncclSystemError;
  }
  memset(uniqueId, 0, sizeof *uniqueId);
  memcpy(uniqueId->internal, &w, sizeof w);
  return ncclSuccess;
}

/* --- meshes: a data and a bootstrap connection per pair -------------------------------- */

typedef struct mesh_hello {
  uint64_t magic;
  int32_t rank;
  int32_t chan; /* 0 data, 1 bootstrap */
} mesh_hello;

/* Connects c's ranks (peers[] filled, listen_fd open); `b` is a second communicator
 * whose abort flag also stops it (the parent of a child being built). */
static ncclResult_t mesh_build(struct ncclComm *c, struct ncclComm *b) {
  int me = c->rank, n = c->nranks;
  for (int q = 0; q < me; q++) {
    for (int chan = 0; chan < 2; chan++) {
      int fd = -1;
      int r = connect_port(c->peers[q].port, c, b, 1000, &fd);
      mesh_hello h = {.magic = c->magic, .rank = me, .chan = chan};
      if (r == IO_OK) r = io_full(fd, &h, sizeof h, 1, c, b, -1);
      if (r != IO_OK) {
        if (fd >= 0) close(fd);
        if (r == IO_ABORTED) return ncclInternalError;
        warn("bootstrap: connecting to rank %d failed: %s", q, r == IO_CLOSED ? "refused or closed" : strerror(errno));
        return ncclRemoteError;
      }
      (chan ? c->boot_fd : c->data_fd)[q] = fd;
    }
  }
  int want = 2 * (n - 1 - me);
  while (want > 0) {
    if (aborted(c, b)) return ncclInternalError;
    struct pollfd p = {.fd = c->listen_fd, .events = POLLIN};
    poll(&p, 1, 10);
    int fd = accept4(c->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) continue;
    mesh_hello h;
    int r = io_full(fd, &h, sizeof h, 0, c, b, 5000);
    if (r == IO_ABORTED) {
      close(fd);
      return ncclInternalError;
    }
    if (r != IO_OK || h.magic != c->magic || h.rank <= me || h.rank >= n || (h.chan != 0 && h.chan != 1) ||
        (h.chan ? c->boot_fd : c->data_fd)[h.rank] >= 0) {
      close(fd); /* a stray or stale connection */
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    (h.chan ? c->boot_fd : c->data_fd)[h.rank] = fd;
    want--;
  }
  close(c->listen_fd);
  c->listen_fd = -1;
  return ncclSuccess;
}

/* --- moving messages: one operation's sends and receives to and from each peer ---------- */

typedef struct msg_hdr {
  uint32_t magic;
  uint32_t kind;
  uint64_t seq;
  uint64_t bytes;
} msg_hdr;

typedef struct xfer {
  int peer;
  const char *tx; /* NULL: nothing to send to this peer */
  size_t tx_len, tx_off;
  char *rx; /* NULL: nothing to receive from this peer */
  size_t rx_len, rx_off;
  msg_hdr th, rh;
  size_t th_off, rh_off;
} xfer;

/* Runs every transfer to its end. Returns IO_OK, IO_ABORTED, IO_CLOSED (peer gone; *bad
 * names it) or IO_ERROR (a mismatched message). boot: the bootstrap connections. */
static int exchange(struct ncclComm *c, struct ncclComm *b, xfer *x, int nx, int boot, uint32_t kind, int *bad) {
  uint32_t magic = boot ? MSG_BOOT : MSG_DATA;
  int *fds = boot ? c->boot_fd : c->data_fd;
  uint64_t *txs = boot ? c->btx_seq : c->tx_seq, *rxs = boot ? c->brx_seq : c->rx_seq;
  for (int i = 0; i < nx; i++) {
    x[i].th = (msg_hdr){.magic = magic, .kind = kind, .seq = x[i].tx ? ++txs[x[i].peer] : 0, .bytes = x[i].tx_len};
    x[i].th_off = x[i].rh_off = x[i].tx_off = x[i].rx_off = 0;
    if (!x[i].tx) x[i].th_off = sizeof(msg_hdr);
    if (!x[i].rx) x[i].rh_off = sizeof(msg_hdr);
    else rxs[x[i].peer]++;
  }
  struct pollfd *pf = calloc((size_t)nx + 1, sizeof *pf);
  if (!pf) return IO_ERROR;
  int res = IO_OK;
  for (;;) {
    int open = 0;
    for (int i = 0; i < nx; i++) {
      xfer *t = &x[i];
      int fd = fds[t->peer];
      int want_tx = t->th_off < sizeof(msg_hdr) || (t->tx && t->tx_off < t->tx_len);
      int want_rx = t->rh_off < sizeof(msg_hdr) || (t->rx && t->rx_off < t->rx_len);
      /* as much as the socket takes, then poll */
      while (want_tx) {
        const char *p = t->th_off < sizeof(msg_hdr) ? (const char *)&t->th + t->th_off : t->tx + t->tx_off;
        size_t len = t->th_off < sizeof(msg_hdr) ? sizeof(msg_hdr) - t->th_off : t->tx_len - t->tx_off;
        ssize_t k = send(fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
          *bad = t->peer;
          res = IO_CLOSED;
          goto out;
        }
        if (t->th_off < sizeof(msg_hdr)) t->th_off += (size_t)k;
        else t->tx_off += (size_t)k;
        want_tx = t->th_off < sizeof(msg_hdr) || t->tx_off < t->tx_len;
      }
      while (want_rx) {
        char *p = t->rh_off < sizeof(msg_hdr) ? (char *)&t->rh + t->rh_off : t->rx + t->rx_off;
        size_t len = t->rh_off < sizeof(msg_hdr) ? sizeof(msg_hdr) - t->rh_off : t->rx_len - t->rx_off;
        ssize_t k = recv(fd, p, len, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          *bad = t->peer;
          res = IO_CLOSED;
          goto out;
        }
        if (k < 0) break;
        if (t->rh_off < sizeof(msg_hdr)) {
          t->rh_off += (size_t)k;
          if (t->rh_off == sizeof(msg_hdr) &&
              (t->rh.magic != magic || t->rh.kind != kind || t->rh.seq != rxs[t->peer] || t->rh.bytes != t->rx_len)) {
            warn("the double saw mismatched operations from rank %d: kind %u seq %llu bytes %llu, expected kind %u "
                 "seq %llu bytes %zu (collectives issued in different orders or with different counts?)",
                 t->peer, t->rh.kind, (unsigned long long)t->rh.seq, (unsigned long long)t->rh.bytes, kind,
                 (unsigned long long)rxs[t->peer], t->rx_len);
            *bad = t->peer;
            res = IO_ERROR;
            goto out;
          }
        } else {
          t->rx_off += (size_t)k;
        }
        want_rx = t->rh_off < sizeof(msg_hdr) || t->rx_off < t->rx_len;
      }
      if (want_tx || want_rx) {
        pf[open++] = (struct pollfd){.fd = fd, .events = (short)((want_tx ? POLLOUT : 0) | (want_rx ? POLLIN : 0))};
      }
    }
    if (open == 0) break;
    if (aborted(c, b)) {
      res = IO_ABORTED;
      break;
    }
    poll(pf, (nfds_t)open, 10);
  }
out:
  free(pf);
  return res;
}

/* --- reductions ---------------------------------------------------------------------- */

static size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

static float half_to_f(uint16_t h) {
  uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
  if (e == 0) {
    if (m == 0) bits = s;
    else { /* subnormal */
      e = 113;
      while (!(m & 0x400)) m <<= 1, e--;
      bits = s | (e << 23) | ((m & 0x3ff) << 13);
    }
  } else if (e == 31) bits = s | 0x7f800000u | (m << 13);
  else bits = s | ((e + 112) << 23) | (m << 13);
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static uint16_t f_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t s = (x >> 16) & 0x8000, e = (x >> 23) & 0xff, m = x & 0x7fffff;
  if (e == 0xff) return (uint16_t)(s | 0x7c00 | (m ? 0x200 : 0));
  int ne = (int)e - 127 + 15;
  if (ne >= 31) return (uint16_t)(s | 0x7c00);
  if (ne <= 0) {
    if (ne < -10) return (uint16_t)s;
    m |= 0x800000;
    uint32_t shift = (uint32_t)(14 - ne), hm = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (hm & 1))) hm++;
    return (uint16_t)(s | hm);
  }
  uint32_t hm = m >> 13, rem = m & 0x1fff;
  uint32_t h = s | ((uint32_t)ne << 10) | hm;
  if (rem > 0x1000 || (rem == 0x1000 && (hm & 1))) h++;
  return (uint16_t)h;
}

static float bf16_to_f(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static uint16_t f_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

#define RED(a, b, op) ((op) == ncclSum || (op) == ncclAvg ? (a) + (b) : (op) == ncclProd ? (a) * (b) \
                       : (op) == ncclMax ? ((a) > (b) ? (a) : (b)) : ((a) < (b) ? (a) : (b)))

/* acc[i] = acc[i] op in[i]; with in NULL, acc[i] /= by (ncclAvg: the sum divided by the
 * rank count, integers truncating). Half types are reduced in float, rounded each step. */
static void combine(void *acc, const void *in, size_t n, ncclDataType_t t, ncclRedOp_t op, int by) {
#define LOOP(ty, GET, PUT)                                                              \
  do {                                                                                  \
    ty *a = acc;                                                                        \
    const ty *b = in;                                                                   \
    for (size_t i = 0; i < n; i++) a[i] = PUT(b ? RED(GET(a[i]), GET(b[i]), op) : GET(a[i]) / by); \
  } while (0)
#define SAME(x) (x)
  switch (t) {
    case ncclInt8: LOOP(int8_t, SAME, (int8_t)); break;
    case ncclUint8: LOOP(uint8_t, SAME, (uint8_t)); break;
    case ncclInt32: LOOP(int32_t, SAME, (int32_t)); break;
    case ncclUint32: LOOP(uint32_t, SAME, (uint32_t)); break;
    case ncclInt64: LOOP(int64_t, SAME, (int64_t)); break;
    case ncclUint64: LOOP(uint64_t, SAME, (uint64_t)); break;
    case ncclFloat32: LOOP(float, SAME, (float)); break;
    case ncclFloat64: LOOP(double, SAME, (double)); break;
    case ncclFloat16: LOOP(uint16_t, half_to_f, f_to_half); break;
    case ncclBfloat16: LOOP(uint16_t, bf16_to_f, f_to_bf16); break;
    default: break;
  }
#undef SAME
#undef LOOP
}

/* --- collectives: work on the stream ----------------------------------------------------- */

enum { K_ALLREDUCE = 1, K_REDUCE_SCATTER, K_ALLGATHER, K_BROADCAST, K_SEND, K_RECV };

typedef struct coll_work {
  dbl_work w;
  struct ncclComm *comm;
  int kind;
  const char *send;
  char *recv;
  size_t count;
  ncclDataType_t dt;
  ncclRedOp_t op;
  int peer; /* root of a broadcast, peer of send/recv */
} coll_work;

static const char *kind_name(int k) {
  static const char *const n[] = {"?", "AllReduce", "ReduceScatter", "AllGather", "Broadcast", "Send", "Recv"};
  return k >= 1 && k <= 6 ? n[k] : "?";
}

/* A peer's connection broke: the proxy records the error; the "kernel" stays stuck
 * until the abort flag comes (a real kernel waits on its FIFO the same way). */
static void stuck_after(struct ncclComm *c, int res, int peer, int kind) {
  int expected = ncclSuccess;
  ncclResult_t code = res == IO_CLOSED ? ncclRemoteError : ncclInternalError;
  if (atomic_compare_exchange_strong(&c->proxy_error, &expected, (int)code) && res == IO_CLOSED)
    warn("NET/Socket : peer rank %d closed the connection during %s (Connection closed by remote peer)", peer,
         kind_name(kind));
  while (!atomic_load(&c->abort_flag)) dbl_sleep_us(5000);
}

static void coll_run(dbl_work *w) {
  coll_work *x = (coll_work *)w;
  struct ncclComm *c = x->comm;
  int n = c->nranks, me = c->rank;
  size_t es = type_size(x->dt), bytes = x->count * es;
  xfer *t = calloc((size_t)n, sizeof *t);
  char *tmp = NULL;
  int nx = 0, res = IO_OK, bad = -1;
  if (!t) goto done;
  if (atomic_load(&c->abort_flag)) goto done;
  switch (x->kind) {
    case K_ALLREDUCE:
    case K_REDUCE_SCATTER: {
      /* every rank's part comes to each rank, which reduces them in rank order */
      size_t part = x->kind == K_ALLREDUCE ? bytes : bytes; /* reduce-scatter: count is recvcount */
      tmp = malloc((size_t)n * part + 1);
      if (!tmp) goto done;
      for (int p = 0; p < n; p++) {
        if (p == me) continue;
        const char *mine = x->kind == K_ALLREDUCE ? x->send : x->send + (size_t)p * part;
        t[nx++] = (xfer){.peer = p, .tx = mine, .tx_len = part, .rx = tmp + (size_t)p * part, .rx_len = part};
      }
      res = exchange(c, NULL, t, nx, 0, (uint32_t)x->kind, &bad);
      if (res != IO_OK) break;
      memcpy(tmp + (size_t)me * part, x->kind == K_ALLREDUCE ? x->send : x->send + (size_t)me * part, part);
      for (int p = 1; p < n; p++) combine(tmp, tmp + (size_t)p * part, x->count, x->dt, x->op, 1);
      if (x->op == ncclAvg) combine(tmp, NULL, x->count, x->dt, x->op, n);
      memcpy(x->recv, tmp, part);
      break;
    }
    case K_ALLGATHER: {
      tmp = malloc(bytes + 1);
      if (!tmp) goto done;
      memcpy(tmp, x->send, bytes); /* in place: send may be inside recv */
      for (int p = 0; p < n; p++)
        if (p != me) t[nx++] = (xfer){.peer = p, .tx = tmp, .tx_len = bytes, .rx = x->recv + (size_t)p * bytes,
                                      .rx_len = bytes};
      res = exchange(c, NULL, t, nx, 0, (uint32_t)x->kind, &bad);
      if (res == IO_OK) memmove(x->recv + (size_t)me * bytes, tmp, bytes);
      break;
    }
    case K_BROADCAST:
      if (me == x->peer) {
        for (int p = 0; p < n; p++)
          if (p != me) t[nx++] = (xfer){.peer = p, .tx = x->send, .tx_len = bytes};
        res = exchange(c, NULL, t, nx, 0, (uint32_t)x->kind, &bad);
        if (res == IO_OK && x->recv != x->send) memmove(x->recv, x->send, bytes);
      } else {
        t[nx++] = (xfer){.peer = x->peer, .rx = x->recv, .rx_len = bytes};
        res = exchange(c, NULL, t, nx, 0, (uint32_t)x->kind, &bad);
      }
      break;
    case K_SEND:
      t[nx++] = (xfer){.peer = x->peer, .tx = x->send, .tx_len = bytes};
      res = exchange(c, NULL, t, nx, 0, K_SEND, &bad);
      break;
    case K_RECV: /* a send's message: the header carries K_SEND */
      t[nx++] = (xfer){.peer = x->peer, .rx = x->recv, .rx_len = bytes};
      res = exchange(c, NULL, t, nx, 0, K_SEND, &bad);
      break;
  }
  if (res == IO_CLOSED || res == IO_ERROR) stuck_after(c, res, bad, x->kind);
done:
  free(t);
  free(tmp);
}

static void coll_release(dbl_work *w) {
  coll_work *x = (coll_work *)w;
  struct ncclComm *c = x->comm;
  pthread_mutex_lock(&c->mu);
  c->inflight--;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  free(x);
}

static ncclResult_t ptr_check(struct ncclComm *c, const void *p, const char *name, const char *op) {
  /* argcheck.cc CudaPtrCheck, done when NCCL_CHECK_POINTERS=1 */
  int dev = -1;
  if (!dbl_device_pointer(p, &dev)) {
    warn("%s : %s %p is not a valid pointer", op, name, p);
    return ncclInvalidArgument;
  }
  if (dev != c->device) {
    warn("%s : %s allocated on device %d mismatchs with NCCL device %d", op, name, dev, c->device);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* enqueue.cc ncclEnqueueCheck: revoked -> ncclInvalidUsage; EnsureReady; ArgsCheck; a
 * failure on a nonblocking communicator becomes its async error. */
static ncclResult_t enqueue(int kind, const void *send, void *recv, size_t count, ncclDataType_t dt,
                            ncclRedOp_t op, int peer, ncclComm_t comm, cudaStream_t stream) {
  const char *name = kind_name(kind);
  ncclResult_t r = comm_check(comm, name);
  if (r != ncclSuccess) return r;
  if (comm->revoked) {
    warn("%s: communicator was revoked", name);
    return ncclInvalidUsage;
  }
  r = ensure_ready(comm);
  if (r != ncclSuccess) goto fail;
  int rooted = kind == K_BROADCAST || kind == K_SEND || kind == K_RECV;
  if (rooted && (peer < 0 || peer >= comm->nranks)) {
    warn("%s : invalid root %d (root should be in the 0..%d range)", name, peer, comm->nranks);
    r = ncclInvalidArgument;
    goto fail;
  }
  if ((int)dt < 0 || dt >= ncclNumTypes || dt == ncclFloat8e4m3 || dt == ncclFloat8e5m2) {
    warn("%s : invalid type %d", name, (int)dt);
    r = ncclInvalidArgument;
    goto fail;
  }
  if ((int)op < 0 || op >= ncclNumOps) {
    warn("%s : invalid reduction operation %d", name, (int)op);
    r = ncclInvalidArgument;
    goto fail;
  }
  if (dbl_knob("NCCL_CHECK_POINTERS", 0) && count > 0) {
    if (kind == K_SEND || kind == K_RECV) r = ptr_check(comm, kind == K_SEND ? send : recv, "buff", name);
    else {
      if (kind != K_BROADCAST || comm->rank == peer) r = ptr_check(comm, send, "sendbuff", name);
      if (r == ncclSuccess) r = ptr_check(comm, recv, "recvbuff", name);
    }
    if (r != ncclSuccess) goto fail;
  }
  if (count == 0) return ncclSuccess;
  coll_work *x = calloc(1, sizeof *x);
  if (!x) {
    r = ncclSystemError;
    goto fail;
  }
  *x = (coll_work){.w = {.run = coll_run, .release = coll_release}, .comm = comm, .kind = kind, .send = send,
                   .recv = recv, .count = count, .dt = dt, .op = op, .peer = peer};
  pthread_mutex_lock(&comm->mu);
  comm->inflight++;
  pthread_mutex_unlock(&comm->mu);
  if (dbl_stream_push(stream, &x->w) != cudaSuccess) {
    coll_release(&x->w);
    r = ncclUnhandledCudaError;
    goto fail;
  }
  return ncclSuccess;
fail:
  if (!comm->blocking) atomic_store(&comm->async, r);
  return r;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return enqueue(K_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(K_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return enqueue(K_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return enqueue(K_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return enqueue(K_SEND, sendbuff, NULL, count, datatype, ncclSum, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return enqueue(K_RECV, NULL, recvbuff, count, datatype, ncclSum, peer, comm, stream);
}

/* --- RAS: what the first communicator of a process leaves running ---------------------- */

/* ras.cc ncclRasCommInit (called by bootstrapInit and bootstrapSplit for every communicator,
 * from NCCL 2.24 on, unless NCCL_RAS_ENABLE=0): the first one of the process opens the RAS
 * listening socket and a notification socket pair and starts the RAS thread; all of them
 * live until the process exits (rasTerminate at exit), whatever happens to the
 * communicators. So a process's descriptors and threads are counted as a baseline only
 * after its first communicator (tests/comm/test_comm_nccl.c: rank_setup). */
static pthread_once_t ras_once = PTHREAD_ONCE_INIT;
static int ras_listen_fd = -1, ras_pipe[2] = {-1, -1};

static void *ras_main(void *arg) {
  (void)arg;
  struct pollfd p = {.fd = ras_pipe[0], .events = POLLIN};
  for (;;) (void)poll(&p, 1, -1); /* nothing is ever sent: it waits until exit */
  return NULL;
}

static void ras_start(void) {
  const char *e = getenv("NCCL_RAS_ENABLE");
  if (e && atoi(e) != 1) return;
  uint32_t port = 0;
  pthread_t t;
  if (listen_any(&ras_listen_fd, &port) != 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ras_pipe) != 0 ||
      dbl_thread_start(&t, ras_main, NULL, 1) != 0)
    warn("RAS: cannot start (%s): continuing without it", strerror(errno)); /* as NCCL: INFO, not fatal */
}

static void ras_comm_init(void) { pthread_once(&ras_once, ras_start); }

/* --- jobs: init, split/shrink, revoke, finalize ---------------------------------------- */

static ncclResult_t init_job(job_args *ja) {
  /* init.cc ncclCommInitRankFunc -> bootstrapInit, then initTransportsRank's
   * AllGather1 of peerInfo and its duplicate-GPU check */
  struct ncclComm *c = ja->comm;
  ras_comm_init();
  id_wire id;
  memcpy(&id, ja->id.internal, sizeof id);
  if (id.tag != ID_TAG || id.port == 0 || id.port > 65535) {
    warn("bootstrap: the unique id is not one ncclGetUniqueId made (no root address in it)");
    return ncclSystemError;
  }
  c->magic = id.magic;
  if (listen_any(&c->listen_fd, &c->peers[c->rank].port) != 0) {
    warn("bootstrap: cannot listen: %s", strerror(errno));
    return ncclSystemError;
  }
  c->peers[c->rank].host_hash = dbl_host_hash();
  c->peers[c->rank].bus_id = dbl_bus_id(c->device);
  int fd = -1;
  int r = connect_port(id.port, c, NULL, 2000, &fd);
  if (r == IO_ABORTED) return ncclInternalError;
  if (r != IO_OK) {
    warn("bootstrap: connecting to the root of the unique id (127.0.0.1:%u) failed: connection refused (an id "
         "used a second time, or its creator is gone)", id.port);
    return ncclSystemError;
  }
  hello_wire h = {.magic = id.magic, .nranks = c->nranks, .rank = c->rank, .info = c->peers[c->rank]};
  r = io_full(fd, &h, sizeof h, 1, c, NULL, -1);
  if (r == IO_OK) r = io_full(fd, c->peers, sizeof(peer_info) * (size_t)c->nranks, 0, c, NULL, -1);
  close(fd);
  if (r == IO_ABORTED) return ncclInternalError;
  if (r != IO_OK) {
    warn("bootstrap: the root of the unique id closed the connection before every rank came (wrong rank count, "
         "a rank number used twice, or the root gave up)");
    return ncclSystemError;
  }
  for (int i = 0; i < c->nranks; i++)
    if (i != c->rank && c->peers[i].host_hash == c->peers[c->rank].host_hash &&
        c->peers[i].bus_id == c->peers[c->rank].bus_id) {
      warn("Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx", c->rank, i,
           (unsigned long)c->peers[c->rank].bus_id);
      return ncclInvalidUsage;
    }
  return mesh_build(c, NULL);
}

typedef struct split_rec {
  int32_t color, key;
  peer_info info;
} split_rec;

typedef struct member {
  int key, prank;
} member;

static int member_cmp(const void *a, const void *b) {
  const member *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return (x->prank > y->prank) - (x->prank < y->prank);
}

static ncclResult_t child_job(job_args *ja) {
  ras_comm_init(); /* bootstrapSplit: RAS for the child too */
  /* init.cc ncclCommInitRankFunc for a parent: the colors and keys of the parent's ranks
   * (the survivors of a shrink) over the parent's bootstrap connections, then the child's
   * own connections */
  struct ncclComm *p = ja->comm, *c = ja->child;
  int n = p->nranks, me = p->rank;
  char *in = calloc((size_t)n, 1);
  split_rec *recs = calloc((size_t)n, sizeof *recs);
  xfer *t = calloc((size_t)n, sizeof *t);
  member *m = calloc((size_t)n, sizeof *m);
  ncclResult_t res = ncclSuccess;
  if (!in || !recs || !t || !m) {
    res = ncclSystemError;
    goto out;
  }
  for (int r = 0; r < n; r++) in[r] = 1;
  for (int i = 0; i < ja->nexcl; i++) in[ja->excl[i]] = 0;
  split_rec mine = {.color = c ? ja->color : NCCL_SPLIT_NOCOLOR, .key = ja->key};
  if (c) {
    if (listen_any(&c->listen_fd, &mine.info.port) != 0) {
      warn("bootstrap: cannot listen: %s", strerror(errno));
      res = ncclSystemError;
      goto out;
    }
    mine.info.host_hash = dbl_host_hash();
    mine.info.bus_id = dbl_bus_id(c->device);
  }
  recs[me] = mine;
  int nx = 0, bad = -1;
  for (int r = 0; r < n; r++)
    if (r != me && in[r])
      t[nx++] = (xfer){.peer = r, .tx = (const char *)&mine, .tx_len = sizeof mine, .rx = (char *)&recs[r],
                       .rx_len = sizeof mine};
  int io = exchange(p, c, t, nx, 1, (uint32_t)ja->tag, &bad);
  if (io == IO_ABORTED) {
    res = ncclInternalError;
    goto out;
  }
  if (io != IO_OK) {
    warn("bootstrap: rank %d of the parent %s while the %s was agreed", bad,
         io == IO_CLOSED ? "closed its connection (the process died?)" : "sent a mismatched message",
         ja->shrink ? "shrink" : "split");
    res = ncclRemoteError;
    goto out;
  }
  if (!c) goto out; /* NCCL_SPLIT_NOCOLOR */
  int k = 0;
  for (int r = 0; r < n; r++)
    if (in[r] && recs[r].color == ja->color) m[k++] = (member){recs[r].key, r};
  qsort(m, (size_t)k, sizeof *m, member_cmp);
  if (comm_alloc_peers(c, k) != 0) {
    res = ncclSystemError;
    goto out;
  }
  for (int i = 0; i < k; i++) {
    c->peers[i] = recs[m[i].prank].info;
    if (m[i].prank == me) c->rank = i;
  }
  c->magic = mix64(mix64(p->magic, ja->tag), (uint64_t)(uint32_t)ja->color);
  res = mesh_build(c, p);
out:
  free(in);
  free(recs);
  free(t);
  free(m);
  return res;
}

static void *job_main(void *arg) {
  job_args *ja = arg;
  struct ncclComm *c = ja->comm;
  ncclResult_t res = ncclSuccess;
  switch (c->job_kind) {
    case JOB_INIT: res = init_job(ja); break;
    case JOB_CHILD: {
      res = child_job(ja);
      if (ja->child) {
        if (res != ncclSuccess && ja->child->rank < 0) ja->child->rank = 0;
        atomic_store(&ja->child->async, res);
      }
      pthread_mutex_lock(&c->mu);
      c->child_abort = NULL;
      pthread_mutex_unlock(&c->mu);
      /* ncclCommInitRankFunc: "assign it to user pointer", also when the build failed */
      __atomic_store_n(ja->newcomm, ja->child, __ATOMIC_RELEASE);
      break;
    }
    case JOB_REVOKE:
      /* init.cc commRevokeAsync: wait for in-flight work to stop, clear the abort flags */
      wait_idle(c);
      set_abort_flags(c, 0);
      break;
    case JOB_FINALIZE: wait_idle(c); break;
  }
  free(ja->excl);
  free(ja);
  /* done first: whoever sees the result below joins this thread (ncclCommGetAsyncError) */
  atomic_store(&c->job_done, 1);
  atomic_store(&c->async, res); /* group.cc: the group's result becomes the async state */
  return NULL;
}

static ncclResult_t start_job(struct ncclComm *c, int kind, job_args *ja) {
  join_job(c); /* the last one ended (its result was read): reap it */
  ja->comm = c;
  c->job_kind = kind;
  atomic_store(&c->job_done, 0);
  atomic_store(&c->async, ncclInProgress);
  if (dbl_thread_start(&c->job, job_main, ja, 0) != 0) {
    free(ja->excl);
    free(ja);
    atomic_store(&c->async, ncclSystemError);
    return ncclSystemError;
  }
  c->job_running = 1;
  if (c->blocking) {
    join_job(c);
    return (ncclResult_t)atomic_load(&c->async);
  }
  ncclResult_t r = ncclSuccess;
  ncclCommGetAsyncError(c, &r);
  return r;
}

static int config_blocking(const ncclConfig_t *config, int inherit) {
  if (!config || config->blocking == NCCL_CONFIG_UNDEF_INT) return inherit;
  return config->blocking != 0;
}

static ncclResult_t config_check(const ncclConfig_t *config) {
  /* init.cc parseCommConfig: NCCL_CONFIG_INITIALIZER must have been used */
  if (config && (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, blocking) + sizeof(int))) {
    warn("ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* --- the communicator calls ------------------------------------------------------------ */

ncclResult_t ncclCommInitRankConfig(ncclComm_t *newcomm, int nranks, ncclUniqueId commId, int myrank,
                                    ncclConfig_t *config) {
  /* init.cc ncclCommInitRankConfig -> ncclCommInitRankDev: *newcomm is set at once and,
   * nonblocking, the state is ncclInProgress until the background init ends */
  if (!newcomm) {
    warn("CommInitRank : newcomm argument is NULL");
    return ncclInvalidArgument;
  }
  ncclResult_t r = config_check(config);
  if (r != ncclSuccess) return r;
  if (nranks < 1 || myrank < 0 || myrank >= nranks) {
    warn("Invalid rank requested : %d/%d", myrank, nranks);
    return ncclInvalidArgument;
  }
  struct ncclComm *c = comm_new(dbl_current_device(), config_blocking(config, 1));
  if (!c || comm_alloc_peers(c, nranks) != 0) {
    if (c) comm_release(c);
    return ncclSystemError;
  }
  c->rank = myrank;
  job_args *ja = calloc(1, sizeof *ja);
  if (!ja) {
    comm_release(c);
    return ncclSystemError;
  }
  ja->id = commId;
  *newcomm = c;
  return start_job(c, JOB_INIT, ja);
}

ncclResult_t ncclCommInitRank(ncclComm_t *newcomm, int nranks, ncclUniqueId commId, int myrank) {
  return ncclCommInitRankConfig(newcomm, nranks, commId, myrank, NULL);
}

static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

/* init.cc ncclCommInitChildComm (split and shrink) */
static ncclResult_t init_child(struct ncclComm *p, ncclComm_t *newcomm, int shrink, int color, int key,
                               const int *excl, int nexcl, ncclConfig_t *config, const char *caller) {
  ncclResult_t r = comm_check(p, caller);
  if (r != ncclSuccess) return r;
  if (!newcomm) {
    warn("%s : newcomm argument is NULL", caller);
    return ncclInvalidArgument;
  }
  if ((r = config_check(config)) != ncclSuccess) return r;
  int *ex = NULL;
  if (shrink) {
    if (!excl) {
      warn("%s : excludeRanksList argument is NULL", caller);
      return ncclInvalidArgument;
    }
    if (nexcl <= 0) return ncclInvalidArgument; /* excludeRanksCount > 0 */
    ex = malloc(sizeof(int) * (size_t)nexcl);
    if (!ex) return ncclSystemError;
    memcpy(ex, excl, sizeof(int) * (size_t)nexcl);
    qsort(ex, (size_t)nexcl, sizeof(int), cmp_int);
    for (int i = 0; i < nexcl; i++)
      if (ex[i] == p->rank || ex[i] < 0 || ex[i] >= p->nranks) {
        free(ex);
        return ncclInvalidArgument; /* ranks in excludeRanksList should not call it */
      }
  }
  if ((r = ensure_ready(p)) != ncclSuccess) {
    free(ex);
    return r;
  }
  *newcomm = NULL; /* "*newcomm should be NCCL_COMM_NULL until comm split fully complete" */
  struct ncclComm *child = NULL;
  if (shrink || color != NCCL_SPLIT_NOCOLOR) {
    child = comm_new(p->device, config_blocking(config, p->blocking));
    if (!child) {
      free(ex);
      return ncclSystemError;
    }
  }
  job_args *ja = calloc(1, sizeof *ja);
  if (!ja) {
    free(ex);
    if (child) comm_release(child);
    return ncclSystemError;
  }
  ja->child = child;
  ja->newcomm = newcomm;
  ja->shrink = shrink;
  ja->color = shrink ? 0 : color;
  ja->key = shrink ? p->rank : key;
  ja->excl = ex;
  ja->nexcl = shrink ? nexcl : 0;
  ja->tag = shrink ? (0x80000000u | (uint32_t)++p->shrink_count) : (uint32_t)++p->child_count;
  pthread_mutex_lock(&p->mu);
  p->child_abort = child ? &child->abort_flag : NULL;
  pthread_mutex_unlock(&p->mu);
  return start_job(p, JOB_CHILD, ja);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
  return init_child(comm, newcomm, 0, color, key, NULL, 0, config, "ncclCommSplit");
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,
                            ncclConfig_t *config, int shrinkFlags) {
  /* init.cc ncclCommShrink: NCCL_SHRINK_ABORT stops the parent's work first */
  ncclResult_t r = comm_check(comm, "ncclCommShrink");
  if (r != ncclSuccess) return r;
  if (shrinkFlags & NCCL_SHRINK_ABORT) {
    set_abort_flags(comm, 1);
    wait_idle(comm);
    set_abort_flags(comm, 0);
  }
  return init_child(comm, newcomm, 1, 0, comm->rank, excludeRanksList, excludeRanksCount, config, "ncclCommShrink");
}

ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  /* init.cc ncclCommRevoke + commRevokeAsync */
  if (!comm) return ncclSuccess;
  if (revokeFlags != NCCL_REVOKE_DEFAULT) return ncclInvalidArgument;
  if (comm->destroy_flag || comm->finalize_called) return ncclInvalidArgument;
  if (comm->revoked) return ncclInvalidArgument;
  set_abort_flags(comm, 1);
  comm->revoked = 1;
  ensure_ready(comm); /* joins a job in progress (it sees the abort flag) */
  comm->finalize_called = 1;
  job_args *ja = calloc(1, sizeof *ja);
  if (!ja) return ncclSystemError;
  return start_job(comm, JOB_REVOKE, ja);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  /* init.cc ncclCommFinalize: waits for the communicator's work (commDestroySync) */
  if (!comm) return ncclSuccess;
  ncclResult_t r = ensure_ready(comm);
  if (r != ncclSuccess) return r;
  if (comm->finalize_called) return ncclInvalidArgument;
  comm->finalize_called = 1;
  job_args *ja = calloc(1, sizeof *ja);
  if (!ja) return ncclSystemError;
  return start_job(comm, JOB_FINALIZE, ja);
}

/* commReclaim -> commFree: NCCL frees its device buffers (cudaFree), which waits for the
 * whole device, other communicators' work included */
static void reclaim(struct ncclComm *c, const char *who) {
  wait_idle(c);
  dbl_device_sync(who);
  comm_release(c);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (comm->rank == -1 || comm->nranks == -1 || comm->start_magic != COMM_MAGIC) {
    warn("comm %p has already been destroyed", (void *)comm);
    return ncclInvalidArgument;
  }
  comm->destroy_flag = 1;
  ncclResult_t r = ensure_ready(comm); /* an unhealthy communicator is not destroyed */
  if (r != ncclSuccess) return r;
  reclaim(comm, "ncclCommDestroy");
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  /* init.cc ncclCommAbort: raise the abort flags (the child being built too), join the
   * job, then reclaim */
  if (!comm) return ncclSuccess;
  set_abort_flags(comm, 1);
  comm->destroy_flag = 1;
  ensure_ready(comm);
  reclaim(comm, "ncclCommAbort");
  return ncclSuccess;
}

/* ncclCommCount, ncclCommUserRank: once the communicator is ready (ncclCommEnsureReady) */
static ncclResult_t attribute(const ncclComm_t comm, const char *what, int *out, int value_of_rank) {
  ncclResult_t r = comm_check(comm, what);
  if (r != ncclSuccess) return r;
  if (!out) return ncclInvalidArgument;
  if ((r = ensure_ready(comm)) != ncclSuccess) return r;
  *out = value_of_rank ? comm->rank : comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) { return attribute(comm, "CommCount", count, 0); }

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) { return attribute(comm, "CommUserRank", rank, 1); }
