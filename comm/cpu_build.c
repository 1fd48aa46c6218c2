/* Building the links of a CPU communicator: one event loop that listens, connects, runs
 * the handshakes (cpu_auth.c) of every connection at once and sets up shared memory.
 *
 *  - Rank r connects to every rank below it and accepts from every rank above: one
 *    control connection per pair, plus one data connection per pair on different hosts.
 *    Refused or failed connects are retried with backoff until the deadline (a peer may
 *    not be listening yet, or still be on the previous generation).
 *  - Anything else that connects (a stale worker, a wrong secret, garbage, a silent
 *    client) is refused by the handshake with a log line and does not delay the build.
 *  - Shared memory: each rank with peers on its host creates one segment
 *    (/dev/shm/newt-<job>-<generation>-<tag>-<rank>-<random>, mode 0600) holding one
 *    receive ring per local peer, offers it to each local peer over the control
 *    connection (CTRL_SHM_OFFER: name, size, the peer's ring), and unlinks it as soon as
 *    every local peer said it mapped it (CTRL_SHM_MAPPED), so nothing is left in /dev/shm
 *    even if a rank is killed later.
 *  - An offer comes from a peer that proved the secret, not its honesty: its segment size,
 *    ring offset and ring size are checked without overflow (the ring lies inside the
 *    segment, past its header, 64-byte aligned), its name is one of ours (/newt-..., no
 *    other '/'), the file's size is the offer's and its header is the peer's of this
 *    generation. A bad offer, or any frame no honest peer sends, fails the build naming the
 *    peer and the field, and marks that peer (only) missing. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/cpu.h"
#include "common/log.h"
#include "common/sys.h"

#define MAX_PENDING 64
#define REFUSALS_DEAD 5                 /* refused connects in a row ... */
#define REFUSED_DEAD_NS 200000000ull    /* ... over at least this long: the peer is gone */

typedef struct builder {
  cpu_comm *c;
  hs_ctx ctx;
  newt_deadline_t deadline;
  hs_conn *out;       /* [size * 2]: our connects (p * 2 + kind) */
  uint64_t *retry_at; /* [size * 2] */
  uint64_t *backoff;  /* [size * 2] */
  char (*why)[256];   /* [size]: why the last connect to p failed */
  int *have;          /* [size * 2]: established */
  int *refused;       /* [size]: connects to p refused in a row (nothing listens there) */
  uint64_t *refused_since; /* [size]: when the first of them was */
  struct sockaddr_storage *ss;
  socklen_t *sslen;
  hs_conn in[MAX_PENDING];
  int nin;
  int mapped;    /* local peers whose segment we mapped */
  int mapped_by; /* local peers that mapped ours */
  int dead;      /* the rank this build found dead (its link closed with no word, it refuses
                    connections, or a peer said so), -1: none */
  char err[512];
} builder;

static int needs(const cpu_comm *c, int p, int kind) {
  return p != c->rank && (kind == HS_KIND_CTRL || !c->links[p].local);
}

static int want_incoming(void *arg, int peer, int kind) {
  builder *b = arg;
  return peer > b->c->rank && needs(b->c, peer, kind) && !b->have[peer * 2 + kind];
}


/* --- shared memory ------------------------------------------------------------------- */

static size_t ring_bytes(void) {
  int64_t r = newt_param_CommShmRing();
  if (r < 64 << 10) r = 64 << 10;
  return ((size_t)r + 4095) & ~(size_t)4095;
}

static size_t slot_bytes(size_t ring) { return (SHM_RING_HDR + ring + 4095) & ~(size_t)4095; }

static void sanitize(const char *in, char *out, size_t cap) {
  size_t n = 0;
  for (const char *p = in ? in : "job"; *p && n + 1 < cap; p++)
    out[n++] = ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                *p == '_' || *p == '.')
                   ? *p
                   : '_';
  out[n] = '\0';
}

static newt_result_t shm_create(cpu_comm *c) {
  size_t ring = ring_bytes();
  c->map_len = SHM_HDR_BYTES + (size_t)c->nlocal * slot_bytes(ring);
  char job[40], rnd[17];
  sanitize(c->job, job, sizeof job);
  NEWT_CHECK(newt_random_hex(rnd, 8));
  snprintf(c->shm_name, sizeof c->shm_name, "/newt-%s-g%llu-%08llx-r%d-%s", job,
           (unsigned long long)c->generation, (unsigned long long)(c->tag & 0xffffffffu), c->rank, rnd);
  int fd = shm_open(c->shm_name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return NEWT_ERR(NEWT_ERR_SYS, "shm_open %s: %s", c->shm_name, strerror(errno));
  c->shm_linked = 1;
  if (ftruncate(fd, (off_t)c->map_len) != 0) {
    int e = errno;
    close(fd);
    return NEWT_ERR(NEWT_ERR_SYS, "ftruncate %s to %zu bytes: %s", c->shm_name, c->map_len, strerror(e));
  }
  void *m = mmap(NULL, c->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (m == MAP_FAILED) return NEWT_ERR(NEWT_ERR_SYS, "mmap %s: %s", c->shm_name, strerror(e));
  c->map = m;
  c->hdr = m;
  c->hdr->magic = SHM_MAGIC;
  c->hdr->generation = c->generation;
  c->hdr->rank = (uint32_t)c->rank;
  c->hdr->size = (uint32_t)c->size;
  size_t off = SHM_HDR_BYTES;
  for (int p = 0; p < c->size; p++) {
    cpu_link *l = &c->links[p];
    if (p == c->rank || !l->local) continue;
    l->rx = (shm_ring *)((uint8_t *)m + off);
    l->rxd = (uint8_t *)m + off + SHM_RING_HDR;
    l->rx_off = off;
    l->rx_ring = ring;
    off += slot_bytes(ring);
  }
  return NEWT_OK;
}

static void shm_offer(builder *b, cpu_link *l) {
  cpu_comm *c = b->c;
  uint8_t p[CTRL_MAX_PAYLOAD];
  size_t n = strlen(c->shm_name) + 1;
  le_put64(p, c->map_len);
  le_put64(p + 8, l->rx_off);
  le_put64(p + 16, l->rx_ring);
  memcpy(p + 24, c->shm_name, n);
  ctrl_send(c, l, CTRL_SHM_OFFER, 0, p, 24 + n);
}

/* Maps the segment l's peer offers (its payload has at least 25 bytes: ctrl_read) and
 * points the ring to it there. NEWT_ERR_PEER when the offer is not one an honest peer
 * makes; *blame then says the peer is at fault (0: a failure of this host, mmap). */
static newt_result_t shm_map_peer(builder *b, cpu_link *l, const ctrl_msg *m, int *blame) {
  cpu_comm *c = b->c;
  const char *who = cpu_peer_name(c, l->peer);
  char name[160];
  *blame = 1;
  if (l->peer_map) return NEWT_ERR(NEWT_ERR_PEER, "%s sent a second shared-memory offer", who);
  uint64_t size = le_get64(m->payload), off = le_get64(m->payload + 8), ring = le_get64(m->payload + 16), end;
  size_t nlen = strnlen((const char *)m->payload + 24, m->len - 24);
  if (nlen == m->len - 24 || nlen >= sizeof name || nlen < 7 || strncmp((const char *)m->payload + 24, "/newt-", 6) != 0 ||
      memchr(m->payload + 25, '/', nlen - 1) != NULL)
    return NEWT_ERR(NEWT_ERR_PEER,
                    "%s sent a shared-memory offer with a bad segment name (not a NUL-terminated \"/newt-...\" "
                    "of at most %zu bytes without another '/')",
                    who, sizeof name - 1);
  if (size < SHM_HDR_BYTES || size > SHM_MAX_BYTES)
    return NEWT_ERR(NEWT_ERR_PEER, "%s sent a shared-memory offer with segment size %llu (%d to 2^40 bytes)", who,
                    (unsigned long long)size, SHM_HDR_BYTES);
  if (ring == 0 || ring % 64 != 0 || ring > size)
    return NEWT_ERR(NEWT_ERR_PEER,
                    "%s sent a shared-memory offer with a ring of %llu bytes (a nonzero multiple of 64 within its "
                    "segment of %llu bytes)",
                    who, (unsigned long long)ring, (unsigned long long)size);
  if (off < SHM_HDR_BYTES || off % 64 != 0 || off >= size)
    return NEWT_ERR(NEWT_ERR_PEER,
                    "%s sent a shared-memory offer with ring offset %llu (a multiple of 64 from %d, within its "
                    "segment of %llu bytes)",
                    who, (unsigned long long)off, SHM_HDR_BYTES, (unsigned long long)size);
  if (__builtin_add_overflow(off, (uint64_t)SHM_RING_HDR + ring, &end) || end > size)
    return NEWT_ERR(NEWT_ERR_PEER,
                    "%s sent a shared-memory offer whose ring (offset %llu, %d + %llu bytes) runs past the end of "
                    "its segment of %llu bytes",
                    who, (unsigned long long)off, SHM_RING_HDR, (unsigned long long)ring, (unsigned long long)size);
  memcpy(name, m->payload + 24, nlen + 1);
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) /* an honest peer's segment is there until every local peer mapped it */
    return NEWT_ERR(NEWT_ERR_PEER, "%s offered shared memory %s that cannot be opened: %s", who, name,
                    strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != size) {
    close(fd);
    return NEWT_ERR(NEWT_ERR_PEER, "%s's shared memory %s has %lld bytes, its offer says %llu", who, name,
                    (long long)st.st_size, (unsigned long long)size);
  }
  void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (map == MAP_FAILED) {
    *blame = 0;
    return NEWT_ERR(NEWT_ERR_SYS, "mmap %s's shared memory %s: %s", who, name, strerror(e));
  }
  shm_hdr *h = map;
  if (h->magic != SHM_MAGIC || h->generation != c->generation || h->rank != (uint32_t)l->peer ||
      h->size != (uint32_t)c->size) {
    munmap(map, size);
    return NEWT_ERR(NEWT_ERR_PEER, "%s's shared memory %s is not its segment of this generation", who, name);
  }
  l->peer_map = map;
  l->peer_map_len = size;
  l->peer_hdr = h;
  l->tx = (shm_ring *)((uint8_t *)map + off);
  l->txd = (uint8_t *)map + off + SHM_RING_HDR;
  l->tx_ring = ring;
  b->mapped++;
  ctrl_send(c, l, CTRL_SHM_MAPPED, 0, NULL, 0);
  return NEWT_OK;
}

static newt_result_t build_ctrl(builder *b, cpu_link *l) {
  cpu_comm *c = b->c;
  const char *who = cpu_peer_name(c, l->peer);
  ctrl_msg m;
  char why[200];
  for (;;) {
    int r = ctrl_read(c, l, &m, why, sizeof why);
    if (r == 0) return NEWT_OK;
    if (r == -2) { /* a frame no honest peer sends: it is the one at fault */
      b->dead = l->peer;
      return NEWT_ERR(NEWT_ERR_PEER, "%s %s during the build", who, why);
    }
    if (r < 0) { /* with no CTRL_FAIL first: it died (a rank that gives up says so) */
      b->dead = l->peer;
      return NEWT_ERR(NEWT_ERR_PEER, "%s %s during the build (the process died?)", who, why);
    }
    switch (m.type) {
      case CTRL_SHM_OFFER: {
        int blame;
        newt_result_t e = shm_map_peer(b, l, &m, &blame);
        if (e != NEWT_OK) {
          if (blame) b->dead = l->peer;
          return e;
        }
        break;
      }
      case CTRL_SHM_MAPPED:
        if (!l->mapped_by_peer) {
          l->mapped_by_peer = 1;
          b->mapped_by++;
        }
        if (b->mapped_by == c->nlocal && c->shm_linked) {
          shm_unlink(c->shm_name);
          c->shm_linked = 0;
        }
        break;
      case CTRL_PING: {
        uint8_t p[8] = {0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
        ctrl_send(c, l, CTRL_PONG, m.arg, p, sizeof p);
        break;
      }
      case CTRL_BYE: return NEWT_ERR(NEWT_ERR_PEER, "%s left during the build", who);
      case CTRL_FAIL: { /* it gave up; its culprit, when it names one, is the rank it found dead */
        int culprit = (int32_t)le_get32(m.payload); /* ctrl_read: >= -1 */
        char text[CTRL_MAX_PAYLOAD];
        ctrl_text(m.payload + 4, m.len - 4, text, sizeof text);
        if (culprit >= 0 && culprit < c->size && culprit != c->rank) b->dead = culprit;
        return NEWT_ERR(NEWT_ERR_PEER, "%s failed during the build: %s", who, text);
      }
      default: break;
    }
  }
}

/* --- connections --------------------------------------------------------------------- */

static newt_result_t install(builder *b, hs_conn *h) {
  cpu_comm *c = b->c;
  cpu_link *l = &c->links[h->peer];
  b->have[h->peer * 2 + h->kind] = 1;
  net_tune(h->fd, h->kind == HS_KIND_DATA);
  if (h->kind == HS_KIND_DATA) {
    l->data_fd = h->fd;
    l->stage_cap = (size_t)newt_param_CommTcpChunk();
    if (l->stage_cap < 65536) l->stage_cap = 65536;
    l->stage = aligned_alloc(64, l->stage_cap);
    NEWT_CHECK_ALLOC(l->stage);
  } else {
    l->ctrl_fd = h->fd;
    if (l->local) shm_offer(b, l);
  }
  NEWT_DEBUG(COMM, "rank %d: %s connection with rank %d (%s) established", c->rank,
             h->kind == HS_KIND_DATA ? "data" : "control", h->peer, h->remote);
  h->fd = -1;
  h->st = HS_IDLE;
  return NEWT_OK;
}

/* A worker listens on its data-plane port for its whole life, so a connection refused
 * there (not one left unanswered) means its process is gone. */
static void note_refusal(builder *b, int p, int err, uint64_t now) {
  if (err != ECONNREFUSED) {
    b->refused[p] = 0;
    return;
  }
  if (b->refused[p]++ == 0) b->refused_since[p] = now;
}

/* A rank that has refused every connection for a while: the build fails now, naming it
 * (NEWT_ERR_PEER), instead of at its deadline. */
static newt_result_t check_refusals(builder *b, uint64_t now) {
  cpu_comm *c = b->c;
  if (!c->peers_listen) return NEWT_OK;
  for (int p = 0; p < c->rank; p++)
    if (b->refused[p] >= REFUSALS_DEAD && now - b->refused_since[p] >= REFUSED_DEAD_NS) {
      b->dead = p;
      if (c->missing)
        for (int q = 0; q < c->size; q++) c->missing[q] = q == p;
      return NEWT_ERR(NEWT_ERR_PEER,
                      "building the communicator (rank %d of %d, generation %llu): rank %d (%s) refuses "
                      "connections: nothing listens there (the process died?)",
                      c->rank, c->size, (unsigned long long)c->generation, p, c->addrs[p]);
    }
  return NEWT_OK;
}

static void start_connects(builder *b, uint64_t now) {
  cpu_comm *c = b->c;
  for (int p = 0; p < c->rank; p++)
    for (int k = 0; k < 2; k++) {
      int i = p * 2 + k;
      hs_conn *h = &b->out[i];
      if (!needs(c, p, k) || b->have[i] || h->st != HS_IDLE || now < b->retry_at[i]) continue;
      int fd, err;
      if (net_connect_start(&b->ss[p], b->sslen[p], &fd, &err) != NEWT_OK) {
        snprintf(b->why[p], sizeof b->why[p], "%s", newt_errmsg());
        note_refusal(b, p, err, now);
        b->retry_at[i] = now + b->backoff[i];
        continue;
      }
      newt_deadline_t d = newt_deadline_min(b->deadline, newt_deadline_in_ms(newt_param_CommHandshakeMs()));
      hs_client_start(h, &b->ctx, fd, p, k, c->addrs[p], d);
    }
}

static void client_failed(builder *b, int i, uint64_t now) {
  hs_conn *h = &b->out[i];
  int p = i / 2;
  note_refusal(b, p, h->conn_err, now);
  snprintf(b->why[p], sizeof b->why[p], "%s", h->why);
  NEWT_DEBUG(COMM, "rank %d: connecting to rank %d: %s; retrying", b->c->rank, p, h->why);
  hs_close(h);
  b->retry_at[i] = now + b->backoff[i];
  if (b->backoff[i] < 100000000ull) b->backoff[i] *= 2;
}

static int complete(builder *b) {
  cpu_comm *c = b->c;
  for (int p = 0; p < c->size; p++)
    for (int k = 0; k < 2; k++)
      if (needs(c, p, k) && !b->have[p * 2 + k]) return 0;
  return c->nlocal == 0 || (b->mapped == c->nlocal && b->mapped_by == c->nlocal);
}

/* Whether the links to rank p that this rank needs are not all made yet. */
static int link_missing(const builder *b, int p) {
  const cpu_comm *c = b->c;
  return p != c->rank && ((needs(c, p, 0) && !b->have[p * 2]) || (needs(c, p, 1) && !b->have[p * 2 + 1]));
}

/* A build that fails because a peer left it. A peer that died (its link closed with no word)
 * or that a peer found dead is the one marked missing: the ranks whose links are not made
 * yet may only be slow. A peer that gave up at its own deadline said so (CTRL_FAIL, naming
 * no one): then the ranks whose links were never made are marked missing, as at a timeout,
 * since they are whom it waited for (an impostor without the job's secret, say), not it --
 * and the build fails as at a timeout (NEWT_ERR_TIMEOUT: a report of a hang), for nobody
 * was seen to die: the leader weighs such accusations as it weighs its own timeouts'. */
static newt_result_t peer_left(builder *b, newt_result_t r) {
  cpu_comm *c = b->c;
  if (c->missing)
    for (int p = 0; p < c->size; p++) c->missing[p] = b->dead >= 0 ? p == b->dead : c->missing[p] || link_missing(b, p);
  if (b->dead >= 0) return r;
  char why[sizeof b->err];
  snprintf(why, sizeof why, "%s", newt_errmsg());
  return NEWT_ERR(NEWT_ERR_TIMEOUT, "%s", why);
}

static newt_result_t timed_out(builder *b) {
  cpu_comm *c = b->c;
  size_t n = 0;
  char *e = b->err;
  size_t cap = sizeof b->err;
  for (int p = 0; p < c->size && n < cap; p++) {
    if (p == c->rank) continue;
    int missing = link_missing(b, p);
    if (c->missing) c->missing[p] = missing;
    if (missing && p < c->rank)
      n += (size_t)snprintf(e + n, cap - n, "; rank %d (%s): %s", p, c->addrs[p],
                            b->why[p][0] ? b->why[p] : "no answer");
    else if (missing)
      n += (size_t)snprintf(e + n, cap - n, "; rank %d (%s) did not connect", p, c->addrs[p]);
    else if (c->links[p].local && (!c->links[p].peer_map || !c->links[p].mapped_by_peer))
      n += (size_t)snprintf(e + n, cap - n, "; rank %d (%s) did not set up shared memory", p, c->addrs[p]);
  }
  return NEWT_ERR(NEWT_ERR_TIMEOUT, "building the communicator (rank %d of %d, generation %llu) timed out after %lld ms%s",
                  c->rank, c->size, (unsigned long long)c->generation, (long long)c->timeout_ms, b->err);
}

static newt_result_t build_loop(builder *b) {
  cpu_comm *c = b->c;
  struct pollfd *pf = NULL;
  int *who = NULL; /* what each poll entry is: -1 listener, 0..: out index, 1000+: in index, 2000+: ctrl */
  size_t cap = (size_t)c->size * 3 + MAX_PENDING + 2;
  newt_result_t res = NEWT_OK;
  pf = calloc(cap, sizeof *pf);
  who = calloc(cap, sizeof *who);
  if (!pf || !who) {
    res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory building the communicator");
    goto done;
  }
  for (;;) {
    if (complete(b)) break;
    if (c->cancel && atomic_load(c->cancel)) {
      res = NEWT_ERR(NEWT_ERR_ABORTED, "building the communicator (rank %d of %d, generation %llu): cancelled",
                     c->rank, c->size, (unsigned long long)c->generation);
      goto done;
    }
    uint64_t now = newt_now_ns();
    if (newt_deadline_passed(b->deadline)) {
      res = timed_out(b);
      goto done;
    }
    NEWT_CHECK_GOTO(check_refusals(b, now), res, done);
    start_connects(b, now);
    int np = 0;
    pf[np] = (struct pollfd){.fd = c->listen_fd, .events = POLLIN};
    who[np++] = -1;
    for (int i = 0; i < c->size * 2; i++)
      if (b->out[i].st != HS_IDLE) {
        pf[np] = (struct pollfd){.fd = b->out[i].fd, .events = hs_events(&b->out[i])};
        who[np++] = i;
      }
    for (int i = 0; i < b->nin; i++) {
      pf[np] = (struct pollfd){.fd = b->in[i].fd, .events = hs_events(&b->in[i])};
      who[np++] = 1000 + i;
    }
    for (int p = 0; p < c->size; p++)
      if (p != c->rank && c->links[p].local && c->links[p].ctrl_fd >= 0) {
        pf[np] = (struct pollfd){.fd = c->links[p].ctrl_fd, .events = POLLIN};
        who[np++] = 2000 + p;
      }
    int64_t wait_ms = 10; /* until the next retry, at most 10 ms */
    for (int i = 0; i < c->size * 2; i++)
      if (b->out[i].st == HS_IDLE && !b->have[i] && b->retry_at[i] > now &&
          (int64_t)((b->retry_at[i] - now) / 1000000) < wait_ms)
        wait_ms = (int64_t)((b->retry_at[i] - now) / 1000000);
    int k = poll(pf, (nfds_t)np, (int)wait_ms);
    if (k < 0 && errno != EINTR) {
      res = NEWT_ERR(NEWT_ERR_SYS, "poll while building the communicator: %s", strerror(errno));
      goto done;
    }
    now = newt_now_ns();
    for (int i = 0; i < np; i++) {
      if (who[i] == -1) {
        if (!pf[i].revents) continue;
        for (;;) {
          char remote[96];
          int fd = net_accept(c->listen_fd, remote, sizeof remote);
          if (fd < 0) break;
          int slot = hs_admit(b->in, &b->nin, MAX_PENDING, "communicator build", c->rank);
          if (slot < 0) {
            hs_log_refusal(NEWT_LOG_WARN, "communicator build", c->rank, c->generation, remote,
                           "too many pending handshakes");
            close(fd);
            continue;
          }
          hs_server_start(&b->in[slot], fd, remote,
                          newt_deadline_min(b->deadline, newt_deadline_in_ms(newt_param_CommHandshakeMs())));
        }
      } else if (who[i] < 1000) {
        hs_conn *h = &b->out[who[i]];
        hs_state st = hs_step(h, &b->ctx);
        if (st == HS_DONE) NEWT_CHECK_GOTO(install(b, h), res, done);
        else if (st == HS_FAILED) client_failed(b, who[i], now);
      } else if (who[i] < 2000) {
        hs_conn *h = &b->in[who[i] - 1000];
        hs_state st = hs_step(h, &b->ctx);
        if (st == HS_DONE) NEWT_CHECK_GOTO(install(b, h), res, done);
        else if (st == HS_FAILED) hs_close(h);
      } else if (pf[i].revents) {
        if ((res = build_ctrl(b, &c->links[who[i] - 2000])) != NEWT_OK) {
          res = peer_left(b, res);
          goto done;
        }
      }
    }
    int j = 0;
    for (int i = 0; i < b->nin; i++)
      if (b->in[i].st != HS_IDLE) b->in[j++] = b->in[i];
    b->nin = j;
  }
done:
  for (int i = 0; i < b->nin; i++) hs_close(&b->in[i]);
  for (int i = 0; i < c->size * 2; i++) hs_close(&b->out[i]);
  free(pf);
  free(who);
  return res;
}

newt_result_t cpu_build(cpu_comm *c, newt_deadline_t deadline) {
  newt_result_t res = NEWT_OK;
  builder b;
  memset(&b, 0, sizeof b);
  b.c = c;
  b.deadline = deadline;
  b.dead = -1;
  b.ctx = (hs_ctx){.rank = c->rank, .size = c->size, .generation = c->generation, .tag = c->tag,
                   .members = c->members, .secret = c->secret, .secret_len = c->secret_len,
                   .want = want_incoming, .arg = &b, .where = "communicator build"};
  if (c->size == 1) return NEWT_OK;
  b.out = calloc((size_t)c->size * 2, sizeof *b.out);
  b.retry_at = calloc((size_t)c->size * 2, sizeof *b.retry_at);
  b.backoff = calloc((size_t)c->size * 2, sizeof *b.backoff);
  b.have = calloc((size_t)c->size * 2, sizeof *b.have);
  b.refused = calloc((size_t)c->size, sizeof *b.refused);
  b.refused_since = calloc((size_t)c->size, sizeof *b.refused_since);
  b.why = calloc((size_t)c->size, sizeof *b.why);
  b.ss = calloc((size_t)c->size, sizeof *b.ss);
  b.sslen = calloc((size_t)c->size, sizeof *b.sslen);
  if (!b.out || !b.retry_at || !b.backoff || !b.have || !b.refused || !b.refused_since || !b.why || !b.ss ||
      !b.sslen) {
    res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory building the communicator");
    goto done;
  }
  for (int i = 0; i < c->size * 2; i++) {
    b.out[i].fd = -1;
    b.backoff[i] = 1000000ull; /* 1 ms, doubling to 100 ms */
  }
  for (int p = 0; p < c->rank; p++) NEWT_CHECK_GOTO(net_resolve(c->addrs[p], &b.ss[p], &b.sslen[p]), res, done);
  if (c->listen_fd < 0) {
    NEWT_CHECK_GOTO(net_listen(c->addrs[c->rank], deadline, &c->listen_fd), res, done);
  } else { /* listening already (the caller's socket): the address must still be one */
    struct sockaddr_storage own;
    socklen_t ownlen;
    NEWT_CHECK_GOTO(net_resolve(c->addrs[c->rank], &own, &ownlen), res, done);
  }
  if (c->nlocal > 0) NEWT_CHECK_GOTO(shm_create(c), res, done);
  res = build_loop(&b);
  /* leaving the build: the peers connected so far learn why (and whom this rank found
     dead), so that they do not take this rank's closed links for its death */
  if (res != NEWT_OK && c->links) {
    char msg[CTRL_MAX_PAYLOAD - 4];
    snprintf(msg, sizeof msg, "%s", newt_errmsg());
    ctrl_notify_fail(c, res, b.dead, msg);
    res = NEWT_ERR(res, "%s", msg);
  }
done:
  free(b.out);
  free(b.retry_at);
  free(b.backoff);
  free(b.have);
  free(b.refused);
  free(b.refused_since);
  free(b.why);
  free(b.ss);
  free(b.sslen);
  return res;
}

void cpu_links_close(cpu_comm *c) {
  if (c->links) {
    for (int p = 0; p < c->size; p++) {
      cpu_link *l = &c->links[p];
      if (l->ctrl_fd >= 0) close(l->ctrl_fd);
      if (l->data_fd >= 0) close(l->data_fd);
      l->ctrl_fd = l->data_fd = -1;
      if (l->peer_map) munmap(l->peer_map, l->peer_map_len);
      l->peer_map = NULL;
      free(l->stage);
      l->stage = NULL;
    }
  }
  if (c->map) munmap(c->map, c->map_len);
  c->map = NULL;
  c->hdr = NULL;
  if (c->shm_linked) shm_unlink(c->shm_name);
  c->shm_linked = 0;
  if (c->listen_fd >= 0) close(c->listen_fd);
  c->listen_fd = -1;
}
