/* Moving bytes between two ranks, and waiting when they cannot move.
 *
 * Data: a byte stream per direction. Between ranks on one host it is a ring in shared
 * memory (the producer advances head, the consumer tail; each side keeps its own copy
 * and publishes it with a full fence so the sleeping-flag check below is sound). Between
 * hosts it is a TCP connection; the receiver reads into a staging buffer when it must
 * reduce, straight into the destination when it only copies.
 *
 * Control: framed messages on the control connection (cpu.h). A closed control
 * connection is how a dead peer shows itself: without a goodbye first, the peer died and
 * the communicator fails at once naming it.
 *
 * A peer that proved the secret may still lie. Every value read from it is checked before
 * it is used: each control frame's fields (ctrl_read), and the counters it writes in shared
 * memory -- the head of a ring it fills may be at most a ring ahead of our tail (or 63 bytes
 * behind it: each side rounds its position to 64 bytes after an operation), the tail of a
 * ring it drains only moves forward, at most 63 bytes past our head and never a ring behind
 * it. A value out of range ends the link (link_violation): the communicator fails with
 * NEWT_ERR_PEER naming the peer and the field, and nothing more is read from it.
 *
 * Waiting (cpu_wait_block): spin for NEWT_COMM_SPIN_US while shared memory is involved,
 * then raise our "sleeping" flag, let the caller look once more, and sleep in poll() on
 * the eventfd (abort), every control connection and the TCP data sockets involved. A peer
 * that moves data for us and sees the flag clears it and sends a doorbell. No progress
 * for timeout_ms starts a probe of the peer we wait for (see cpu.h). A probe's answer carries
 * the bytes the peer still has in flight to us on TCP (sent, not yet acknowledged): two ranks
 * that wait for each other with bytes in flight between them are on a slow or lossy link
 * (TCP retransmits, backing off), not in mismatched operations, and wait on, up to
 * LINK_SLOW_CAPS times the cap. */
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/cpu.h"
#include "common/log.h"

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

const char *cpu_peer_name(cpu_comm *c, int peer) {
  return peer >= 0 && peer < c->size && c->names[peer] ? c->names[peer] : "an unknown rank";
}

/* --- control channel ---------------------------------------------------------------- */

int ctrl_send(cpu_comm *c, cpu_link *l, int type, uint32_t arg, const void *payload, size_t len) {
  uint8_t buf[CTRL_HDR + CTRL_MAX_PAYLOAD];
  if (l->ctrl_fd < 0 || l->ctrl_eof || len > CTRL_MAX_PAYLOAD) return -1;
  buf[0] = (uint8_t)type;
  buf[1] = 0;
  buf[2] = (uint8_t)(len & 0xff);
  buf[3] = (uint8_t)(len >> 8);
  le_put32(buf + 4, arg);
  if (len) memcpy(buf + CTRL_HDR, payload, len);
  pthread_mutex_lock(&c->ctrl_send_lock);
  ssize_t n;
  do n = send(l->ctrl_fd, buf, CTRL_HDR + len, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  pthread_mutex_unlock(&c->ctrl_send_lock);
  if (n == (ssize_t)(CTRL_HDR + len)) return 0;
  if (n > 0) NEWT_WARN(COMM, "control frame to rank %d cut short (peer not reading)", l->peer);
  return -1;
}

static const char *ctrl_name(int type) {
  switch (type) {
    case CTRL_DOORBELL: return "doorbell";
    case CTRL_PING: return "probe";
    case CTRL_PONG: return "probe answer";
    case CTRL_FAIL: return "failure notice";
    case CTRL_BYE: return "goodbye";
    case CTRL_SHM_OFFER: return "shared-memory offer";
    case CTRL_SHM_MAPPED: return "shared-memory mapped frame";
    default: return "control frame";
  }
}

/* Whether m is a frame an honest peer of a communicator of `size` ranks sends: 0, or -1
 * with why naming the field. The header was checked already (type, reserved byte, length
 * within the buffer). */
static int ctrl_check(const ctrl_msg *m, int size, char *why, size_t cap) {
  const char *name = ctrl_name(m->type);
  switch (m->type) {
    case CTRL_PONG: {
      if (m->len != 8 && m->len != 12 && m->len != 8 + 8 * COMM_PROBE_VALUES && m->len != 12 + 8 * COMM_PROBE_VALUES) {
        snprintf(why, cap, "sent a %s of %zu payload bytes (8, 12, %d or %d)", name, m->len, 8 + 8 * COMM_PROBE_VALUES,
                 12 + 8 * COMM_PROBE_VALUES);
        return -1;
      }
      uint32_t in_op = le_get32(m->payload);
      int32_t waiting_on = (int32_t)le_get32(m->payload + 4);
      if (in_op > 1) {
        snprintf(why, cap, "sent a %s with in-operation flag %u (0 or 1)", name, in_op);
        return -1;
      }
      if (waiting_on < -1 || waiting_on >= size) {
        snprintf(why, cap, "sent a %s saying it waits for rank %d (of %d)", name, (int)waiting_on, size);
        return -1;
      }
      return 0;
    }
    case CTRL_FAIL: {
      if (m->len < 4) {
        snprintf(why, cap, "sent a %s of %zu payload bytes (at least 4)", name, m->len);
        return -1;
      }
      int32_t culprit = (int32_t)le_get32(m->payload);
      if (m->arg <= (uint32_t)NEWT_OK || m->arg >= (uint32_t)NEWT_ERR__COUNT) {
        snprintf(why, cap, "sent a %s with code %u (not an error code)", name, m->arg);
        return -1;
      }
      if (culprit < -1) {
        snprintf(why, cap, "sent a %s naming rank %d", name, (int)culprit);
        return -1;
      }
      return 0;
    }
    case CTRL_PING: /* the argument is a sequence number: any value is one */
      if (m->len != 0) {
        snprintf(why, cap, "sent a %s of %zu payload bytes (expected 0)", name, m->len);
        return -1;
      }
      return 0;
    case CTRL_SHM_OFFER: /* its fields: shm_map_peer */
      if (m->len < 25) {
        snprintf(why, cap, "sent a %s of %zu payload bytes (at least 25)", name, m->len);
        return -1;
      }
      break;
    default: /* doorbell, goodbye, mapped: nothing but the header */
      if (m->len != 0) {
        snprintf(why, cap, "sent a %s of %zu payload bytes (expected 0)", name, m->len);
        return -1;
      }
      break;
  }
  if (m->arg != 0) {
    snprintf(why, cap, "sent a %s with argument %u (must be 0)", name, m->arg);
    return -1;
  }
  return 0;
}

int ctrl_read(cpu_comm *c, cpu_link *l, ctrl_msg *m, char *why, size_t cap) {
  for (;;) {
    if (l->crx_len >= CTRL_HDR) {
      int type = l->crx[0];
      size_t len = (size_t)l->crx[2] | ((size_t)l->crx[3] << 8);
      if (type < CTRL_DOORBELL || type > CTRL_SHM_MAPPED) {
        snprintf(why, cap, "sent a control frame of unknown type %d", type);
        return -2;
      }
      if (l->crx[1] != 0) {
        snprintf(why, cap, "sent a control frame with reserved byte 0x%02x (must be 0)", l->crx[1]);
        return -2;
      }
      if (len > CTRL_MAX_PAYLOAD) {
        snprintf(why, cap, "sent a control frame of %zu payload bytes (at most %d)", len, CTRL_MAX_PAYLOAD);
        return -2;
      }
      if (l->crx_len >= CTRL_HDR + len) {
        m->type = type;
        m->arg = le_get32(l->crx + 4);
        m->len = len;
        memcpy(m->payload, l->crx + CTRL_HDR, len);
        memmove(l->crx, l->crx + CTRL_HDR + len, l->crx_len - CTRL_HDR - len);
        l->crx_len -= CTRL_HDR + len;
        return ctrl_check(m, c->size, why, cap) == 0 ? 1 : -2;
      }
    }
    if (l->ctrl_fd < 0 || l->ctrl_eof) {
      snprintf(why, cap, "closed its connection");
      return -1;
    }
    ssize_t n = recv(l->ctrl_fd, l->crx + l->crx_len, sizeof l->crx - l->crx_len, MSG_DONTWAIT);
    if (n > 0) {
      l->crx_len += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n == 0 && l->crx_len > 0) { /* a frame cut short */
      size_t want = l->crx_len >= CTRL_HDR ? CTRL_HDR + ((size_t)l->crx[2] | ((size_t)l->crx[3] << 8)) : CTRL_HDR;
      snprintf(why, cap, "closed its connection in the middle of a control frame (%zu of %zu bytes)", l->crx_len,
               want);
      return -2;
    }
    if (n == 0) snprintf(why, cap, "closed its connection");
    else snprintf(why, cap, "closed its connection (%s)", strerror(errno));
    return -1;
  }
}

/* Printable text from a peer's bytes (no control characters into logs and statuses). */
void ctrl_text(const uint8_t *p, size_t n, char *out, size_t cap) {
  size_t k = 0;
  for (size_t i = 0; i < n && k + 1 < cap; i++) out[k++] = p[i] >= 32 && p[i] < 127 ? (char)p[i] : '?';
  if (cap) out[k] = '\0';
}

/* A peer broke the protocol (a frame, a ring counter): the communicator fails with
 * NEWT_ERR_PEER naming it and what it did (the verdict goes to every peer, the offender
 * too), then its connections are shut, so nothing more is read from it. */
static newt_result_t link_violation(cpu_comm *c, cpu_link *l, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static newt_result_t link_violation(cpu_comm *c, cpu_link *l, const char *fmt, ...) {
  char why[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  newt_result_t r = comm_fail(c->pub, NEWT_ERR_PEER, l->peer, 1, "%s %s%s%s", cpu_peer_name(c, l->peer), why,
                              c->op_name ? " during " : "", c->op_name ? c->op_name : "");
  /* after the verdict went round (the offender is told too): nothing more from it */
  if (l->gone == 0) l->gone = 2;
  l->ctrl_eof = 1;
  if (l->ctrl_fd >= 0) shutdown(l->ctrl_fd, SHUT_RDWR);
  if (l->data_fd >= 0) shutdown(l->data_fd, SHUT_RDWR);
  return r;
}

void ctrl_notify_fail(cpu_comm *c, newt_result_t code, int culprit_root, const char *msg) {
  uint8_t p[CTRL_MAX_PAYLOAD];
  size_t n = strlen(msg);
  if (n > sizeof p - 4) n = sizeof p - 4;
  le_put32(p, (uint32_t)culprit_root);
  memcpy(p + 4, msg, n);
  /* the culprit too: a dead one cannot read it, a live one (stopped, late) learns it was
   * named as soon as it reads its control connection */
  for (int r = 0; r < c->size && c->links; r++)
    if (r != c->rank) ctrl_send(c, &c->links[r], CTRL_FAIL, (uint32_t)code, p, n + 4);
}

static void handle_pong(cpu_comm *c, cpu_link *l, const ctrl_msg *m);
static uint32_t link_in_flight(const cpu_link *l);

/* A failure notice from l->peer: adopt its verdict (the culprit is a root rank). */
static void handle_fail(cpu_comm *c, cpu_link *l, const ctrl_msg *m) {
  /* ctrl_check: at least 4 bytes, an error code, a culprit >= -1 (a root rank: one outside
   * this communicator is named as unknown) */
  int culprit = (int32_t)le_get32(m->payload);
  newt_result_t code = (newt_result_t)m->arg;
  char msg[CTRL_MAX_PAYLOAD];
  ctrl_text(m->payload + 4, m->len - 4, msg, sizeof msg);
  if (culprit >= 0 && culprit == comm_to_root(c->pub, c->rank))
    comm_fail(c->pub, code, c->rank, 0, "%s reported this rank: %s", cpu_peer_name(c, l->peer), msg);
  else
    comm_fail_reported(c->pub, code, culprit, l->peer, msg);
}

void ctrl_drain(cpu_comm *c, cpu_link *l) {
  ctrl_msg m;
  char why[200];
  for (;;) {
    int r = ctrl_read(c, l, &m, why, sizeof why);
    if (r == 0) return;
    if (r == -2) {
      link_violation(c, l, "%s", why);
      return;
    }
    if (r < 0) {
      l->ctrl_eof = 1;
      if (l->gone == 0) {
        l->gone = 2;
        comm_fail(c->pub, NEWT_ERR_PEER, l->peer, 1, "%s %s%s%s (the process died?)", cpu_peer_name(c, l->peer),
                  why, c->op_name ? " during " : "", c->op_name ? c->op_name : "");
      }
      return;
    }
    switch (m.type) {
      case CTRL_PING: {
        uint8_t p[12 + 8 * COMM_PROBE_VALUES];
        size_t len = 8;
        int in_op = c->cur_wait != NULL;
        le_put32(p, (uint32_t)in_op);
        le_put32(p + 4, (uint32_t)(in_op ? c->cur_wait->blocker : -1));
        if (atomic_load_explicit(&c->probe_hook_set, memory_order_acquire)) {
          uint64_t ext[COMM_PROBE_VALUES] = {0};
          c->probe_hook(c->probe_arg, ext);
          for (int i = 0; i < COMM_PROBE_VALUES; i++) le_put64(p + 8 + 8 * i, ext[i]);
          len += 8 * COMM_PROBE_VALUES;
        }
        le_put32(p + len, link_in_flight(l)); /* last: what we still have on the way to it */
        len += 4;
        ctrl_send(c, l, CTRL_PONG, m.arg, p, len);
        break;
      }
      case CTRL_PONG: handle_pong(c, l, &m); break;
      case CTRL_FAIL: handle_fail(c, l, &m); break;
      case CTRL_BYE:
        if (l->gone == 0) l->gone = 1;
        break;
      case CTRL_DOORBELL: break;
      default: /* shared-memory set-up: every such frame of an honest peer came before the build ended */
        link_violation(c, l, "sent a %s after the build", ctrl_name(m.type));
        return;
    }
  }
}

/* --- data streams -------------------------------------------------------------------- */

static void doorbell(cpu_comm *c, cpu_link *l) {
  if (atomic_load_explicit(&l->peer_hdr->sleeping, memory_order_seq_cst) &&
      atomic_exchange(&l->peer_hdr->sleeping, 0))
    ctrl_send(c, l, CTRL_DOORBELL, 0, NULL, 0);
}

size_t link_chunk(const cpu_link *l) {
  return (size_t)(l->local ? newt_param_CommShmChunk() : newt_param_CommTcpChunk());
}

static newt_result_t tcp_broken(cpu_comm *c, cpu_link *l, const char *what, int err) {
  const char *name = cpu_peer_name(c, l->peer);
  if (err == 0)
    return comm_fail(c->pub, NEWT_ERR_PEER, l->peer, 1, "%s closed the data connection during %s",
                     name, c->op_name ? c->op_name : "an operation");
  return comm_fail(c->pub, NEWT_ERR_PEER, l->peer, 1, "%s: %s on the data connection during %s: %s",
                   name, what, c->op_name ? c->op_name : "an operation", strerror(err));
}

newt_result_t link_reserve(cpu_comm *c, cpu_link *l, size_t want, size_t esize, uint8_t **p, size_t *room) {
  /* positions are rounded up to 64 bytes at the end of each operation, by each side on
   * its own: a difference that looks negative means "nothing yet" */
  int64_t used = (int64_t)(l->tx_head - l->tx_tail);
  *room = 0;
  *p = l->txd;
  if (used < 0 || (size_t)used + want > l->tx_ring) {
    uint64_t t = atomic_load_explicit(&l->tx->tail, memory_order_acquire);
    /* the peer's: it only moves forward, never more than 63 bytes past what we wrote (its
       rounding), never a ring behind it */
    if ((int64_t)(t - l->tx_tail) < 0 || (int64_t)(t - l->tx_head) > 63 ||
        (int64_t)(l->tx_head - t) > (int64_t)l->tx_ring)
      return link_violation(c, l,
                            "moved the shared-memory ring's tail to %llu (it was %llu; this rank's head is %llu, "
                            "the ring holds %zu)",
                            (unsigned long long)t, (unsigned long long)l->tx_tail,
                            (unsigned long long)l->tx_head, l->tx_ring);
    l->tx_tail = t;
    used = (int64_t)(l->tx_head - l->tx_tail);
    if (used < 0) used = 0;
  }
  size_t pos = (size_t)(l->tx_head % l->tx_ring);
  size_t n = l->tx_ring - (size_t)used; /* 0 <= used <= tx_ring */
  if (n > l->tx_ring - pos) n = l->tx_ring - pos;
  if (n > want) n = want;
  *p = l->txd + pos;
  *room = n - n % esize;
  return NEWT_OK;
}

void link_commit(cpu_comm *c, cpu_link *l, size_t n) {
  if (n == 0) return;
  l->tx_head += n;
  atomic_store_explicit(&l->tx->head, l->tx_head, memory_order_seq_cst);
  doorbell(c, l);
}

newt_result_t link_send(cpu_comm *c, cpu_link *l, const void *p, size_t len, size_t *n) {
  *n = 0;
  if (len == 0) return NEWT_OK;
  if (l->local) {
    size_t done = 0;
    for (int piece = 0; piece < 2 && done < len; piece++) { /* the ring wraps at most once */
      uint8_t *q;
      size_t room;
      NEWT_CHECK(link_reserve(c, l, len - done, 1, &q, &room));
      if (room == 0) break;
      memcpy(q, (const uint8_t *)p + done, room);
      l->tx_head += room;
      done += room;
    }
    if (done) {
      atomic_store_explicit(&l->tx->head, l->tx_head, memory_order_seq_cst);
      doorbell(c, l);
    }
    *n = done;
    return NEWT_OK;
  }
  ssize_t r;
  do r = send(l->data_fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (r < 0 && errno == EINTR);
  if (r > 0) *n = (size_t)r;
  else if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return tcp_broken(c, l, "send", errno);
  return NEWT_OK;
}

newt_result_t link_peek(cpu_comm *c, cpu_link *l, size_t want, size_t esize, const uint8_t **p,
                        size_t *avail) {
  *avail = 0;
  if (l->local) {
    uint64_t head = atomic_load_explicit(&l->rx->head, memory_order_acquire);
    size_t pos = (size_t)(l->rx_tail % l->rx_ring);
    int64_t ahead = (int64_t)(head - l->rx_tail); /* < 0: the producer has not rounded yet */
    if (ahead > (int64_t)l->rx_ring || ahead < -63) /* the peer's: at most a ring ahead */
      return link_violation(c, l,
                            "moved the shared-memory ring's head to %llu, %lld bytes from this rank's tail %llu "
                            "(the ring holds %zu)",
                            (unsigned long long)head, (long long)ahead, (unsigned long long)l->rx_tail, l->rx_ring);
    size_t n = ahead > 0 ? (size_t)ahead : 0;
    if (n > l->rx_ring - pos) n = l->rx_ring - pos;
    if (n > want) n = want;
    *p = l->rxd + pos;
    *avail = n - n % esize;
    return NEWT_OK;
  }
  if (l->stage_r == l->stage_w) {
    l->stage_r = l->stage_w = 0;
  } else if (l->stage_r % esize != 0 || (l->stage_w - l->stage_r < want && l->stage_w == l->stage_cap)) {
    memmove(l->stage, l->stage + l->stage_r, l->stage_w - l->stage_r);
    l->stage_w -= l->stage_r;
    l->stage_r = 0;
  }
  if (l->stage_w - l->stage_r < want && l->stage_w < l->stage_cap) {
    ssize_t r;
    do r = recv(l->data_fd, l->stage + l->stage_w, l->stage_cap - l->stage_w, MSG_DONTWAIT);
    while (r < 0 && errno == EINTR);
    if (r > 0) l->stage_w += (size_t)r;
    else if (r == 0 && l->stage_w == l->stage_r) return tcp_broken(c, l, "recv", 0);
    else if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return tcp_broken(c, l, "recv", errno);
  }
  size_t n = l->stage_w - l->stage_r;
  if (n > want) n = want;
  *p = l->stage + l->stage_r;
  *avail = n - n % esize;
  return NEWT_OK;
}

void link_consume(cpu_comm *c, cpu_link *l, size_t n) {
  if (n == 0) return;
  if (l->local) {
    l->rx_tail += n;
    atomic_store_explicit(&l->rx->tail, l->rx_tail, memory_order_seq_cst);
    doorbell(c, l);
  } else {
    l->stage_r += n;
  }
}

newt_result_t link_recv(cpu_comm *c, cpu_link *l, void *dst, size_t len, size_t *n) {
  *n = 0;
  uint8_t *d = dst;
  if (l->local) {
    while (*n < len) {
      const uint8_t *p;
      size_t avail;
      NEWT_CHECK(link_peek(c, l, len - *n, 1, &p, &avail));
      if (avail == 0) break;
      memcpy(d + *n, p, avail);
      link_consume(c, l, avail);
      *n += avail;
    }
    return NEWT_OK;
  }
  if (l->stage_w > l->stage_r) {
    size_t take = l->stage_w - l->stage_r;
    if (take > len) take = len;
    memcpy(d, l->stage + l->stage_r, take);
    l->stage_r += take;
    *n = take;
    if (*n == len) return NEWT_OK;
  }
  ssize_t r;
  do r = recv(l->data_fd, d + *n, len - *n, MSG_DONTWAIT);
  while (r < 0 && errno == EINTR);
  if (r > 0) *n += (size_t)r;
  else if (r == 0) return tcp_broken(c, l, "recv", 0);
  else if (errno != EAGAIN && errno != EWOULDBLOCK) return tcp_broken(c, l, "recv", errno);
  return NEWT_OK;
}

void links_align(cpu_comm *c) {
  for (int r = 0; r < c->size; r++) {
    cpu_link *l = &c->links[r];
    if (r == c->rank || !l->local) continue;
    uint64_t h = (l->tx_head + 63) & ~(uint64_t)63;
    if (h != l->tx_head) {
      l->tx_head = h;
      atomic_store_explicit(&l->tx->head, h, memory_order_release);
    }
    uint64_t t = (l->rx_tail + 63) & ~(uint64_t)63;
    if (t != l->rx_tail) {
      l->rx_tail = t;
      atomic_store_explicit(&l->rx->tail, t, memory_order_release);
    }
  }
}

/* --- waiting ------------------------------------------------------------------------- */

static uint64_t spin_ns(void) { return (uint64_t)newt_param_CommSpinUs() * 1000ull; }

/* Two ranks waiting for each other with bytes in flight between them wait on up to this many
 * times the cap (comm_config.timeout_ms) before the link is called dead. */
#define LINK_SLOW_CAPS 10

/* The stall deadline (comm_set_stall; the timeout until set). */
static int64_t stall_ms(cpu_comm *c) { return atomic_load_explicit(&c->pub->stall_ms, memory_order_relaxed); }

/* How long a probe's answer may take: a quarter of the stall deadline, at least 200 ms (a
 * progress thread of a loaded host may wait that long for a CPU: no silence before it). */
static uint64_t probe_ns(cpu_comm *c) {
  int64_t ms = stall_ms(c) / 4;
  if (ms < 200) ms = 200;
  if (ms > 2000) ms = 2000;
  return (uint64_t)ms * 1000000ull;
}

static uint64_t stall_ns(cpu_comm *c) {
  int64_t ms = stall_ms(c);
  return ms < 0 ? UINT64_MAX / 2 : (uint64_t)ms * 1000000ull;
}

/* How long the wait has gone without progress, in ms. */
static long long stalled_ms(const cpu_wait *w) { return (long long)((newt_now_ns() - w->since) / 1000000ull); }

void cpu_wait_init(cpu_wait *w, cpu_comm *c) {
  memset(w, 0, sizeof *w);
  w->c = c;
  uint64_t now = newt_now_ns();
  w->spin_until = now + spin_ns();
  w->stall_at = now + stall_ns(c);
  w->since = now;
  w->blocker = -1;
  w->probe_target = -1;
  c->cur_wait = w;
}

void cpu_wait_progress(cpu_wait *w) {
  uint64_t now = newt_now_ns();
  w->spin_until = now + spin_ns();
  w->stall_at = now + stall_ns(w->c);
  w->since = now;
  w->probes = 0;
  w->probing = 0;
  w->blocker = -1;
  if (w->armed) {
    atomic_store(&w->c->hdr->sleeping, 0);
    w->armed = 0;
  }
}

static newt_result_t probe_verdict(cpu_wait *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static newt_result_t probe_verdict(cpu_wait *w, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  w->probing = 0;
  return comm_fail(w->c->pub, NEWT_ERR_TIMEOUT, w->probe_target, 1, "%s", msg);
}

static void probe_send(cpu_wait *w, int target) {
  cpu_comm *c = w->c;
  w->probing = 1;
  w->probe_target = target;
  w->probe_seq++;
  w->probe_until = newt_now_ns() + probe_ns(c);
  ctrl_send(c, &c->links[target], CTRL_PING, w->probe_seq, NULL, 0);
}

/* Bytes sent on l's TCP data connection and not yet acknowledged by the peer (the kernel's
 * send queue), capped at 2^31; 0 for shared memory or when unknown. */
static uint32_t link_in_flight(const cpu_link *l) {
  int n = 0;
  if (l->local || l->data_fd < 0 || ioctl(l->data_fd, SIOCOUTQ, &n) != 0 || n < 0) return 0;
  return (uint32_t)n;
}

static void handle_pong(cpu_comm *c, cpu_link *l, const ctrl_msg *m) {
  if (m->arg & CTRL_EXT_PROBE) { /* comm_cpu_probe's */
    if (m->len >= 8 + 8 * COMM_PROBE_VALUES) {
      for (int i = 0; i < COMM_PROBE_VALUES; i++) atomic_store(&l->ext_val[i], le_get64(m->payload + 8 + 8 * i));
      atomic_store_explicit(&l->ext_seq, m->arg, memory_order_release);
    }
    return;
  }
  cpu_wait *w = c->cur_wait;
  if (!w || !w->probing || w->probe_target != l->peer || m->arg != w->probe_seq || m->len < 8) return;
  int in_op = (int)le_get32(m->payload);
  int waiting_on = (int32_t)le_get32(m->payload + 4);
  const char *name = cpu_peer_name(c, l->peer);
  int alive_verdict = !in_op || waiting_on == c->rank; /* (waiting on another: follow the chain) */
  /* bytes on the way between us, either way: a slow or lossy link, not a mismatch */
  uint32_t theirs = m->len == 12 || m->len == 12 + 8 * COMM_PROBE_VALUES ? le_get32(m->payload + m->len - 4) : 0;
  uint32_t ours = link_in_flight(l);
  if (in_op && waiting_on == c->rank && (theirs || ours) && stalled_ms(w) >= c->timeout_ms &&
      stalled_ms(w) < LINK_SLOW_CAPS * c->timeout_ms) {
    if (!w->slow_said) /* once per wait */
      NEWT_WARN(COMM, "rank %d: %s and this rank wait for each other during %s with %u bytes still in flight from it "
                "and %u to it for %lld ms: a slow or lossy link (TCP retransmits), waiting on", c->rank, name,
                c->op_name ? c->op_name : "the operation", theirs, ours, stalled_ms(w));
    w->slow_said = 1;
    w->probing = 0;
    w->stall_at = newt_now_ns() + stall_ns(c);
    return;
  }
  if (alive_verdict && stalled_ms(w) < c->timeout_ms) {
    /* alive: still computing its part (a slow step, a straggler), or in the operation with
       data for us still in flight (a lossy link retransmits): not a hang, nor a mismatch,
       until the cap; only silence is named at the stall deadline */
    w->probing = 0;
    w->stall_at = newt_now_ns() + stall_ns(c);
  } else if (!in_op) {
    probe_verdict(w, "%s is alive but has not entered %s after %lld ms", name,
                  c->op_name ? c->op_name : "the operation", stalled_ms(w));
  } else if (waiting_on < 0 || waiting_on >= c->size) {
    /* busy, not blocked: it is making progress of its own; wait another period */
    w->probing = 0;
    w->stall_at = newt_now_ns() + stall_ns(c);
  } else if (waiting_on == c->rank && (theirs || ours)) {
    probe_verdict(w, "%s and this rank wait for each other during %s with bytes in flight between them for %lld ms "
                  "(a link that loses everything?)", name, c->op_name ? c->op_name : "the operation", stalled_ms(w));
  } else if (waiting_on == c->rank) {
    probe_verdict(w, "%s and this rank wait for each other during %s (mismatched operations?)", name,
                  c->op_name ? c->op_name : "the operation");
  } else if (++w->probe_hops >= c->size) {
    probe_verdict(w, "ranks wait for each other in a cycle through %s during %s", name,
                  c->op_name ? c->op_name : "the operation");
  } else {
    NEWT_DEBUG(COMM, "rank %d: probe: rank %d waits for rank %d", c->rank, l->peer, waiting_on);
    probe_send(w, waiting_on);
  }
}

newt_result_t cpu_wait_block(cpu_wait *w, cpu_link *rx, cpu_link *tx) {
  cpu_comm *c = w->c;
  if (atomic_load_explicit(&c->pub->failed, memory_order_acquire))
    return comm_failed_err(c->pub, c->op_name);
  w->blocker = rx ? rx->peer : (tx ? tx->peer : -1);
  int shm = (rx && rx->local) || (tx && tx->local);
  int spin = shm || (newt_param_CommTcpSpin() && (rx || tx));
  uint64_t now = newt_now_ns();
  if (spin && now < w->spin_until) {
    /* spin for the first 10 us (a peer on another CPU answers within that), then keep
     * looking but hand the CPU to anyone who wants it (a peer on this CPU, when ranks
     * outnumber CPUs); sleeping costs a wake-up, which on a virtual machine is slow */
    uint64_t pure = spin_ns() < 10000 ? spin_ns() : 10000;
    if (c->crowded || w->spin_until - now < spin_ns() - pure) sched_yield();
    else
      for (int i = 0; i < 32; i++) cpu_relax();
    return NEWT_OK;
  }
  if (shm && !w->armed) {
    atomic_store(&c->hdr->sleeping, 1);
    atomic_thread_fence(memory_order_seq_cst);
    w->armed = 1;
    return NEWT_OK; /* the caller looks once more before we sleep */
  }
  struct pollfd *pf = c->pfds;
  int np = 0;
  pf[np++] = (struct pollfd){.fd = c->evfd, .events = POLLIN};
  for (int r = 0; r < c->size; r++) {
    cpu_link *l = &c->links[r];
    if (r != c->rank && l->ctrl_fd >= 0 && !l->ctrl_eof) {
      c->pfd_peer[np] = r;
      pf[np++] = (struct pollfd){.fd = l->ctrl_fd, .events = POLLIN};
    }
  }
  int ndata = np;
  if (rx && !rx->local) pf[np++] = (struct pollfd){.fd = rx->data_fd, .events = POLLIN};
  if (tx && !tx->local) pf[np++] = (struct pollfd){.fd = tx->data_fd, .events = POLLOUT};
  uint64_t until = w->probing ? w->probe_until : w->stall_at;
  int64_t ms = until > now ? (int64_t)((until - now + 999999) / 1000000) : 0;
  if (ms > 100) ms = 100;
  int k = poll(pf, (nfds_t)np, (int)ms);
  if (w->armed) {
    atomic_store(&c->hdr->sleeping, 0);
    w->armed = 0;
  }
  now = newt_now_ns();
  w->spin_until = now + spin_ns();
  if (k < 0 && errno != EINTR)
    return comm_fail(c->pub, NEWT_ERR_SYS, -1, 1, "poll during %s: %s", c->op_name, strerror(errno));
  if (k > 0) {
    if (pf[0].revents) {
      uint64_t v;
      ssize_t rd = read(c->evfd, &v, sizeof v);
      (void)rd;
    }
    for (int i = 1; i < ndata; i++)
      if (pf[i].revents) ctrl_drain(c, &c->links[c->pfd_peer[i]]);
  }
  if (atomic_load_explicit(&c->pub->failed, memory_order_acquire))
    return comm_failed_err(c->pub, c->op_name);
  if (rx && rx->gone && rx->local &&
      (int64_t)(atomic_load_explicit(&rx->rx->head, memory_order_acquire) - rx->rx_tail) <= 0)
    return comm_fail(c->pub, NEWT_ERR_PEER, rx->peer, 1,
                     "%s left (freed its communicator) while this rank waited for its data in %s",
                     cpu_peer_name(c, rx->peer), c->op_name);
  if (tx && tx->gone)
    return comm_fail(c->pub, NEWT_ERR_PEER, tx->peer, 1,
                     "%s left (freed its communicator) while this rank had data for it in %s",
                     cpu_peer_name(c, tx->peer), c->op_name);
  if (!w->probing && now >= w->stall_at && w->blocker >= 0) {
    if (w->probes++ == 0)
      NEWT_INFO(COMM, "rank %d: no progress in %s for %lld ms, probing rank %d", c->rank, c->op_name, stalled_ms(w),
                w->blocker);
    else
      NEWT_DEBUG(COMM, "rank %d: no progress in %s for %lld ms, probing rank %d again", c->rank, c->op_name,
                 stalled_ms(w), w->blocker);
    w->probe_hops = 0;
    probe_send(w, w->blocker);
  } else if (w->probing && now >= w->probe_until) {
    /* the probe itself not yet acknowledged by the peer's host: lost on a lossy link (TCP
       sends it again), or the link is cut -- waited for up to the cap; acknowledged and not
       answered: the process is stopped or hung */
    int n = 0;
    const cpu_link *t = &c->links[w->probe_target];
    int unacked = t->ctrl_fd >= 0 && ioctl(t->ctrl_fd, SIOCOUTQ, &n) == 0 && n > 0;
    if (unacked && stalled_ms(w) < c->timeout_ms) {
      w->probe_until = now + probe_ns(c);
      return NEWT_OK;
    }
    if (unacked)
      return probe_verdict(w, "%s made no progress for %lld ms during %s and its host did not acknowledge a probe "
                           "(the link is cut, or loses everything)", cpu_peer_name(c, w->probe_target), stalled_ms(w),
                           c->op_name);
    return probe_verdict(w, "%s made no progress for %lld ms during %s and did not answer a probe (stopped or hung)",
                         cpu_peer_name(c, w->probe_target), stalled_ms(w), c->op_name);
  }
  return NEWT_OK;
}
