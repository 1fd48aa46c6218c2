/* The handshake every CPU-backend connection starts with: it proves the generation and
 * the per-generation secret in both directions, so a worker of an older generation, a
 * process of another job or a stray client is refused (with a log line saying why) and
 * never becomes a link.
 *
 *   client -> server  HELLO     (96 bytes) "NEWTHLO1", version, kind (control/data),
 *                               generation, communicator tag, member-table hash, source
 *                               rank, destination rank, size, client nonce (32 random bytes)
 *   server -> client  CHALLENGE (88 bytes) "NEWTCHL1", status, server generation, server
 *                               nonce (32 random bytes), HMAC-SHA256(secret, "newt-server"
 *                               || HELLO || server nonce)
 *   client -> server  PROOF     (32 bytes) HMAC-SHA256(secret, "newt-client" || HELLO ||
 *                               server nonce)
 *   server -> client  RESULT    (8 bytes)  status (0: accepted)
 *
 * The server's fresh nonce makes a recorded PROOF useless on a later connection (no
 * replay); the client's nonce, inside HELLO, does the same for the server's answer. A
 * HELLO of another generation, communicator or rank is refused before any proof. All
 * integers are little-endian. Both sides run as nonblocking state machines driven by
 * poll(), with a deadline, so a silent or slow client never holds anything up.
 *
 * A link probe (comm_time_links, cpu_net.c) is no handshake: a 96-byte header "NEWTPRB1",
 * version, the count of bytes that follow (at most COMM_LINK_PROBE_MAX); the listener reads
 * them whole, answers "NEWTPRB1" and closes. It proves nothing and changes nothing: its
 * sender times how fast the link carries data (a worker held out of a plan, to be taken
 * back only once its link is well: docs/elastic.md). It costs the listener what any bytes
 * sent to it cost, within the handshake's deadline and the pending connections' bound. */
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/cpu.h"
#include "common/log.h"
#include "common/sys.h"

#define HS_VERSION 1
#define HS_RESULT_LEN 8

enum {
  REJ_NONE = 0,
  REJ_VERSION,
  REJ_GENERATION,
  REJ_COMM,
  REJ_RANK,
  REJ_PROOF,
  REJ_DUP,
};

static const char *rej_text(uint32_t s) {
  switch (s) {
    case REJ_VERSION: return "protocol version differs";
    case REJ_GENERATION: return "generation differs";
    case REJ_COMM: return "another communicator (tag, size or member table differ)";
    case REJ_RANK: return "invalid rank claim";
    case REJ_PROOF: return "bad proof (wrong secret)";
    case REJ_DUP: return "duplicate or unexpected connection";
    default: return "unknown refusal";
  }
}


void hs_encode_hello(uint8_t out[HS_HELLO_LEN], uint64_t generation, uint64_t tag, uint64_t members,
                     int src, int dst, int size, int kind, const uint8_t nonce[HS_NONCE_LEN]) {
  memset(out, 0, HS_HELLO_LEN);
  memcpy(out, "NEWTHLO1", 8);
  le_put32(out + 8, HS_VERSION);
  le_put32(out + 12, (uint32_t)kind);
  le_put64(out + 16, generation);
  le_put64(out + 24, tag);
  le_put64(out + 32, members);
  le_put32(out + 40, (uint32_t)src);
  le_put32(out + 44, (uint32_t)dst);
  le_put32(out + 48, (uint32_t)size);
  memcpy(out + 56, nonce, HS_NONCE_LEN);
}

void hs_mac(const unsigned char *secret, size_t secret_len, const char *label,
            const uint8_t hello[HS_HELLO_LEN], const uint8_t nonce_s[HS_NONCE_LEN],
            uint8_t out[HS_MAC_LEN]) {
  uint8_t msg[32 + HS_HELLO_LEN + HS_NONCE_LEN];
  size_t l = strlen(label);
  memcpy(msg, label, l);
  memcpy(msg + l, hello, HS_HELLO_LEN);
  memcpy(msg + l + HS_HELLO_LEN, nonce_s, HS_NONCE_LEN);
  unsigned int outlen = HS_MAC_LEN;
  if (!HMAC(EVP_sha256(), secret, (int)secret_len, msg, l + HS_HELLO_LEN + HS_NONCE_LEN, out,
            &outlen))
    memset(out, 0, HS_MAC_LEN); /* never matches a real proof */
}

newt_result_t comm_derive_secret(const void *job_secret, size_t job_secret_len, const char *job, uint64_t generation,
                                 const unsigned char *salt, size_t salt_len, unsigned char out[COMM_KEY_BYTES]) {
  if (job_secret_len < 16 || job_secret_len > 4096)
    return NEWT_ERR(NEWT_ERR_INVALID, "the job secret has %zu bytes: 16 to 4096", job_secret_len);
  size_t jl = strnlen(job, 64);
  if (salt_len > 64) salt_len = 64;
  uint8_t msg[15 + 64 + 8 + 64];
  size_t n = 0;
  memcpy(msg, "newt-generation", 15), n = 15;
  memcpy(msg + n, job, jl), n += jl;
  for (int i = 0; i < 8; i++) msg[n++] = (uint8_t)(generation >> (8 * i));
  memcpy(msg + n, salt, salt_len), n += salt_len;
  unsigned int outlen = COMM_KEY_BYTES;
  if (!HMAC(EVP_sha256(), job_secret, (int)job_secret_len, msg, n, out, &outlen))
    return NEWT_ERR(NEWT_ERR_INTERNAL, "HMAC-SHA256 failed deriving the generation's key");
  return NEWT_OK;
}

static void set_out(hs_conn *h, const void *p, size_t n) {
  memcpy(h->out, p, n);
  h->out_len = n;
  h->out_off = 0;
}

static void want_in(hs_conn *h, size_t n) {
  h->in_have = 0;
  h->in_want = n;
}

/* 1 written, 0 not yet, -1 broken */
static int hs_write(hs_conn *h) {
  while (h->out_off < h->out_len) {
    ssize_t n = send(h->fd, h->out + h->out_off, h->out_len - h->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) h->out_off += (size_t)n;
    else if (n < 0 && errno == EINTR) continue;
    else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    else return -1;
  }
  return 1;
}

/* 1 complete, 0 not yet, -1 broken, -2 closed by the other side */
static int hs_read(hs_conn *h) {
  while (h->in_have < h->in_want) {
    ssize_t n = recv(h->fd, h->in + h->in_have, h->in_want - h->in_have, MSG_DONTWAIT);
    if (n > 0) h->in_have += (size_t)n;
    else if (n == 0) return -2;
    else if (errno == EINTR) continue;
    else if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    else return -1;
  }
  return 1;
}

static hs_state fail(hs_conn *h, int retryable, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static hs_state fail(hs_conn *h, int retryable, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(h->why, sizeof h->why, fmt, ap);
  va_end(ap);
  h->retryable = retryable;
  h->st = HS_FAILED;
  return h->st;
}

void hs_client_start(hs_conn *h, const hs_ctx *ctx, int fd, int peer, int kind, const char *remote,
                     newt_deadline_t deadline) {
  memset(h, 0, sizeof *h);
  h->fd = fd;
  h->peer = peer;
  h->kind = kind;
  h->deadline = deadline;
  snprintf(h->remote, sizeof h->remote, "%s", remote);
  uint8_t nonce[HS_NONCE_LEN];
  if (newt_random_bytes(nonce, sizeof nonce) != NEWT_OK) memset(nonce, 0x5a, sizeof nonce);
  hs_encode_hello(h->hello, ctx->generation, ctx->tag, ctx->members, ctx->rank, peer, ctx->size,
                  kind, nonce);
  set_out(h, h->hello, HS_HELLO_LEN);
  h->st = HS_CONNECTING;
}

void hs_server_start(hs_conn *h, int fd, const char *remote, newt_deadline_t deadline) {
  memset(h, 0, sizeof *h);
  h->started_ns = newt_now_ns();
  h->fd = fd;
  h->peer = -1;
  h->deadline = deadline;
  snprintf(h->remote, sizeof h->remote, "%s", remote);
  want_in(h, HS_HELLO_LEN);
  h->st = HS_S_HELLO;
}

short hs_events(const hs_conn *h) {
  switch (h->st) {
    case HS_CONNECTING:
    case HS_C_HELLO:
    case HS_C_PROOF:
    case HS_S_CHAL:
    case HS_S_RESULT:
    case HS_S_REJECT:
    case HS_S_PROBED: return POLLOUT;
    case HS_C_CHAL:
    case HS_C_RESULT:
    case HS_S_HELLO:
    case HS_S_DRAIN:
    case HS_S_PROOF: return POLLIN;
    default: return 0;
  }
}

void hs_close(hs_conn *h) {
  if (h->fd >= 0 && h->st != HS_DONE) close(h->fd);
  h->fd = -1;
  h->st = HS_IDLE;
}

void hs_log_refusal(newt_log_level level, const char *where, int rank, uint64_t generation, const char *remote,
                    const char *why) {
  /* per kind of refusal (the reason's first words), so that a flood of one kind does not
     hide another: 3 lines per 10 s each, then one line counting what was not shown */
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  static uint64_t window_start;
  static int logged[16], suppressed;
  if (!newt_log_enabled(level, NEWT_SUBSYS_COMM)) return;
  uint64_t kind = comm_hash(COMM_HASH_INIT, why, strnlen(why, 24)) % 16, now = newt_now_ns();
  pthread_mutex_lock(&mu);
  int hidden = 0;
  if (now - window_start > 10000000000ull) {
    hidden = suppressed;
    window_start = now;
    suppressed = 0;
    memset(logged, 0, sizeof logged);
  }
  int say = logged[kind] < 3;
  if (say) logged[kind]++;
  else suppressed++;
  pthread_mutex_unlock(&mu);
  if (hidden)
    NEWT_WARN(COMM, "%s (rank %d): %d more refused connections in the last 10 s were not logged", where, rank, hidden);
  if (say)
    NEWT_LOG_AT(level, COMM, "%s (rank %d, generation %llu): refused a connection from %s: %s", where, rank,
                (unsigned long long)generation, remote, why);
}

int hs_admit(hs_conn *pending, int *n, int cap, const char *where, int rank) {
  if (*n < cap) return (*n)++;
  uint64_t now = newt_now_ns();
  int oldest = -1;
  for (int i = 0; i < *n; i++) {
    const hs_conn *h = &pending[i];
    int silent = h->st == HS_S_HELLO && h->in_have == 0 && now - h->started_ns >= (uint64_t)HS_SILENT_MS * 1000000ull;
    if (silent && (oldest < 0 || h->started_ns < pending[oldest].started_ns)) oldest = i;
  }
  if (oldest < 0) return -1;
  hs_log_refusal(NEWT_LOG_WARN, where, rank, 0, pending[oldest].remote,
                 "silent, and its slot was needed (too many pending handshakes)");
  hs_close(&pending[oldest]);
  return oldest;
}

/* Server: refuse with a status the client can read, then close. */
static hs_state refuse(hs_conn *h, const hs_ctx *ctx, uint32_t status, int chal, int stale, const char *why) {
  uint8_t m[HS_CHAL_LEN];
  memset(m, 0, sizeof m);
  if (chal) {
    memcpy(m, "NEWTCHL1", 8);
    le_put32(m + 8, status);
    le_put64(m + 16, ctx->generation);
    set_out(h, m, HS_CHAL_LEN);
  } else {
    le_put32(m, status);
    set_out(h, m, HS_RESULT_LEN);
  }
  snprintf(h->why, sizeof h->why, "%s", why);
  /* a newer generation knocking is normal while ranks move on (it retries); anything
   * else is a stale worker, another job or a stray client */
  newt_log_level lvl = status == REJ_GENERATION && !stale ? NEWT_LOG_INFO : NEWT_LOG_WARN;
  hs_log_refusal(lvl, ctx->where, ctx->rank, ctx->generation, h->remote, why);
  h->st = HS_S_REJECT;
  return h->st;
}

static hs_state server_hello(hs_conn *h, const hs_ctx *ctx) {
  char why[256];
  const uint8_t *m = h->in;
  uint32_t version = le_get32(m + 8), kind = le_get32(m + 12);
  uint64_t gen = le_get64(m + 16), tag = le_get64(m + 24), members = le_get64(m + 32);
  uint32_t src = le_get32(m + 40), dst = le_get32(m + 44), size = le_get32(m + 48);
  if (version != HS_VERSION) {
    snprintf(why, sizeof why, "protocol version %u, expected %u", version, HS_VERSION);
    return refuse(h, ctx, REJ_VERSION, 1, 1, why);
  }
  if (gen != ctx->generation) {
    snprintf(why, sizeof why, "it claims rank %u of generation %llu, this communicator is generation %llu%s",
             src, (unsigned long long)gen, (unsigned long long)ctx->generation,
             gen < ctx->generation ? " (a stale worker of an older generation)" : "");
    return refuse(h, ctx, REJ_GENERATION, 1, gen < ctx->generation, why);
  }
  if (tag != ctx->tag || members != ctx->members || size != (uint32_t)ctx->size) {
    snprintf(why, sizeof why,
             "it belongs to another communicator (tag %016llx, size %u, members %016llx; ours "
             "%016llx, %d, %016llx)",
             (unsigned long long)tag, size, (unsigned long long)members,
             (unsigned long long)ctx->tag, ctx->size, (unsigned long long)ctx->members);
    return refuse(h, ctx, REJ_COMM, 1, 1, why);
  }
  /* every field is a fixed-size integer, each compared with what this rank expects */
  const char *bad = NULL;
  if (src >= (uint32_t)ctx->size) bad = "source rank out of range";
  else if (dst != (uint32_t)ctx->rank) bad = "destination rank is not this rank";
  else if (src == dst) bad = "source rank is this rank's own";
  else if (kind != HS_KIND_CTRL && kind != HS_KIND_DATA) bad = "neither control (0) nor data (1)";
  if (bad) {
    snprintf(why, sizeof why, "invalid claim: rank %u connecting to rank %u of %d, kind %u (%s)", src, dst,
             ctx->size, kind, bad);
    return refuse(h, ctx, REJ_RANK, 1, 1, why);
  }
  h->peer = (int)src;
  h->kind = (int)kind;
  memcpy(h->hello, h->in, HS_HELLO_LEN);
  if (newt_random_bytes(h->nonce_s, HS_NONCE_LEN) != NEWT_OK)
    return fail(h, 0, "no random bytes for the challenge");
  uint8_t chal[HS_CHAL_LEN];
  memset(chal, 0, sizeof chal);
  memcpy(chal, "NEWTCHL1", 8);
  le_put64(chal + 16, ctx->generation);
  memcpy(chal + 24, h->nonce_s, HS_NONCE_LEN);
  hs_mac(ctx->secret, ctx->secret_len, "newt-server", h->hello, h->nonce_s, chal + 56);
  set_out(h, chal, HS_CHAL_LEN);
  h->st = HS_S_CHAL;
  return h->st;
}

static hs_state server_proof(hs_conn *h, const hs_ctx *ctx) {
  uint8_t expect[HS_MAC_LEN];
  char why[256];
  hs_mac(ctx->secret, ctx->secret_len, "newt-client", h->hello, h->nonce_s, expect);
  if (CRYPTO_memcmp(expect, h->in, HS_MAC_LEN) != 0) {
    snprintf(why, sizeof why,
             "it claims rank %d of generation %llu but its proof is wrong (wrong secret, or a "
             "replayed proof)",
             h->peer, (unsigned long long)ctx->generation);
    return refuse(h, ctx, REJ_PROOF, 0, 1, why);
  }
  if (!ctx->want || !ctx->want(ctx->arg, h->peer, h->kind)) {
    snprintf(why, sizeof why, "rank %d proved the secret but its %s connection is not expected now (duplicate?)",
             h->peer, h->kind == HS_KIND_DATA ? "data" : "control");
    return refuse(h, ctx, REJ_DUP, 0, 1, why);
  }
  uint8_t ok[HS_RESULT_LEN] = {0};
  set_out(h, ok, sizeof ok);
  h->st = HS_S_RESULT;
  return h->st;
}

static hs_state client_chal(hs_conn *h, const hs_ctx *ctx) {
  const uint8_t *m = h->in;
  if (memcmp(m, "NEWTCHL1", 8) != 0)
    return fail(h, 1, "%s did not answer as a newt communicator", h->remote);
  uint32_t status = le_get32(m + 8);
  if (status != REJ_NONE) {
    if (status == REJ_GENERATION)
      return fail(h, 1, "%s refused us: it is generation %llu, we are %llu", h->remote,
                  (unsigned long long)le_get64(m + 16), (unsigned long long)ctx->generation);
    return fail(h, 1, "%s refused us: %s", h->remote, rej_text(status));
  }
  memcpy(h->nonce_s, m + 24, HS_NONCE_LEN);
  uint8_t expect[HS_MAC_LEN];
  hs_mac(ctx->secret, ctx->secret_len, "newt-server", h->hello, h->nonce_s, expect);
  if (CRYPTO_memcmp(expect, m + 56, HS_MAC_LEN) != 0)
    return fail(h, 1, "%s did not prove the secret of generation %llu (a stale or foreign process?)",
                h->remote, (unsigned long long)ctx->generation);
  uint8_t proof[HS_MAC_LEN];
  hs_mac(ctx->secret, ctx->secret_len, "newt-client", h->hello, h->nonce_s, proof);
  set_out(h, proof, HS_MAC_LEN);
  h->st = HS_C_PROOF;
  return h->st;
}

hs_state hs_step(hs_conn *h, const hs_ctx *ctx) {
  for (;;) {
    if (h->st == HS_DONE || h->st == HS_FAILED || h->st == HS_IDLE) return h->st;
    if (newt_deadline_passed(h->deadline)) {
      if (h->st >= HS_S_HELLO && h->st <= HS_S_RESULT)
        hs_log_refusal(NEWT_LOG_WARN, ctx->where, ctx->rank, ctx->generation, h->remote,
                       "handshake not completed in time");
      return fail(h, 1, "handshake with %s not completed in time", h->remote);
    }
    hs_state before = h->st;
    int r;
    switch (h->st) {
      case HS_CONNECTING: {
        int err = 0;
        socklen_t len = sizeof err;
        struct pollfd p = {.fd = h->fd, .events = POLLOUT};
        if (poll(&p, 1, 0) <= 0) return h->st;
        if (getsockopt(h->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        h->conn_err = err;
        if (err != 0) return fail(h, 1, "connect to %s: %s", h->remote, strerror(err));
        h->st = HS_C_HELLO;
        break;
      }
      case HS_C_HELLO:
      case HS_C_PROOF:
      case HS_S_CHAL:
      case HS_S_RESULT:
      case HS_S_REJECT:
        r = hs_write(h);
        if (r < 0) {
          if (h->st == HS_S_REJECT) return fail(h, 0, "%s", h->why);
          return fail(h, 1, "sending to %s: %s", h->remote, strerror(errno));
        }
        if (r == 0) return h->st;
        if (h->st == HS_C_HELLO) {
          want_in(h, HS_CHAL_LEN);
          h->st = HS_C_CHAL;
        } else if (h->st == HS_C_PROOF) {
          want_in(h, HS_RESULT_LEN);
          h->st = HS_C_RESULT;
        } else if (h->st == HS_S_CHAL) {
          want_in(h, HS_MAC_LEN);
          h->st = HS_S_PROOF;
        } else if (h->st == HS_S_RESULT) {
          h->st = HS_DONE;
        } else {
          return fail(h, 0, "%s", h->why);
        }
        break;
      case HS_S_HELLO:
        r = hs_read(h);
        /* reject garbage as soon as the magic is wrong */
        if (h->in_have >= 8 && memcmp(h->in, "NEWTHLO1", 8) != 0 && memcmp(h->in, HS_PROBE_MAGIC, 8) != 0) {
          NEWT_WARN(COMM, "%s (rank %d): refused a connection from %s: not a newt handshake (bad magic)",
                    ctx->where, ctx->rank, h->remote);
          return fail(h, 0, "not a newt handshake");
        }
        if (r == -2 && h->in_have == 0) {
          /* closed without a byte: a liveness probe (comm_probe_listeners: a failure report,
             survivors looking for each other), not a peer that failed its handshake */
          NEWT_DEBUG(COMM, "%s (rank %d): a connection from %s closed without a word (a probe)", ctx->where, ctx->rank,
                     h->remote);
          return fail(h, 0, "closed without a word");
        }
        if (r == -2 || r == -1) {
          NEWT_WARN(COMM, "%s (rank %d): refused a connection from %s: closed during the handshake",
                    ctx->where, ctx->rank, h->remote);
          return fail(h, 0, "closed during the handshake");
        }
        if (r == 0) return h->st;
        if (memcmp(h->in, HS_PROBE_MAGIC, 8) == 0) {
          uint32_t n = le_get32(h->in + 12);
          if (le_get32(h->in + 8) != HS_PROBE_VERSION || n > COMM_LINK_PROBE_MAX) return fail(h, 0, "a bad link probe");
          h->drain = n;
          h->st = HS_S_DRAIN;
          break;
        }
        server_hello(h, ctx);
        break;
      case HS_S_DRAIN: {
        uint8_t sink[65536];
        while (h->drain > 0) {
          ssize_t n = recv(h->fd, sink, h->drain < sizeof sink ? h->drain : sizeof sink, MSG_DONTWAIT);
          if (n > 0) h->drain -= (size_t)n;
          else if (n < 0 && errno == EINTR) continue;
          else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return h->st;
          else return fail(h, 0, "a link probe closed before its bytes");
        }
        set_out(h, HS_PROBE_MAGIC, 8);
        h->st = HS_S_PROBED;
        break;
      }
      case HS_S_PROBED:
        r = hs_write(h);
        if (r == 0) return h->st;
        /* answered (or its sender went): closed as a connection that is no link */
        return fail(h, 0, "a link probe");
      case HS_S_PROOF:
        r = hs_read(h);
        if (r < 0) {
          NEWT_WARN(COMM, "%s (rank %d): refused a connection from %s: it claims rank %d but closed before its proof",
                    ctx->where, ctx->rank, h->remote, h->peer);
          return fail(h, 0, "closed during the handshake");
        }
        if (r == 0) return h->st;
        server_proof(h, ctx);
        break;
      case HS_C_CHAL:
      case HS_C_RESULT:
        r = hs_read(h);
        if (r == -2) return fail(h, 1, "%s closed the connection during the handshake", h->remote);
        if (r < 0) return fail(h, 1, "reading from %s: %s", h->remote, strerror(errno));
        if (r == 0) return h->st;
        if (h->st == HS_C_CHAL) {
          client_chal(h, ctx);
        } else {
          uint32_t status = le_get32(h->in);
          if (status != REJ_NONE) return fail(h, 1, "%s refused us: %s", h->remote, rej_text(status));
          h->st = HS_DONE;
        }
        break;
      default: return h->st;
    }
    if (h->st == before) return h->st;
  }
}
