/* A peer that holds the job's secret and lies (issue 24, item 4): it completes the real
 * handshake with honest ranks of a CPU communicator, then sends what an honest rank never
 * would, one mutation per case. Each victim must end that link with an error naming the
 * peer and the bad field, never crash or touch memory outside what it mapped, and the
 * honest ranks must go on without the liar.
 *
 * Three processes per case: slots 0 and 1 are honest ranks, slot 2 is the hostile peer,
 * written here against the wire format of comm/cpu.h (of the library it uses only the
 * HELLO's encoder, the MAC and the hashes a HELLO carries).
 *
 *  - hello:  the communicator of generation 7 is {slot 0, hostile}. The hostile first sends
 *            a mutated HELLO (ranks, kind, size, version out of range, a HELLO or a PROOF
 *            cut short) and waits for the victim to close it; then it joins for real. The
 *            victim's build completes, and its log has the refusal naming the hostile's
 *            address and the field.
 *  - offer:  the same pair; the hostile's shared-memory offer is mutated (an offset or a
 *            ring size that wraps around 2^64, past the end, misaligned, inside the
 *            header, a wrong segment size or name, a short or second offer, a segment of
 *            another rank). The victim's comm_create fails with NEWT_ERR_PEER naming rank 1
 *            and the field, and marks only it missing.
 *  - frame:  the communicator is {slot 0, slot 1, hostile}; once both honest ranks built
 *            it, the hostile sends one bad control frame (type, reserved byte, length, a
 *            frame cut short, a failure notice or probe answer with bad fields, shared-memory
 *            frames after the build). The victim's allreduce fails with NEWT_ERR_PEER naming
 *            rank 2 and the field; the other honest rank learns the same verdict.
 *  - ring:   as frame, but the hostile writes a ring counter in shared memory (the head of
 *            the ring it fills, the tail of the ring it drains) out of any honest range.
 *  - data:   as frame, with the hostile on another host (TCP); it sends part of a block on
 *            the data connection and closes it.
 * After each case the honest ranks build generation 8 without the hostile (comm_shrink of
 * the failed communicator, or comm_create when the first never formed), run an allreduce
 * and check it, and end with as many fds as they started with; no segment is left in
 * /dev/shm. Every wait is for an event (a closed socket, a counter in shared memory); the
 * deadlines only bound a broken run.
 *
 * Arguments: case names to run only those (default: all). NEWT_TEST_VERBOSE=1 prints the
 * honest ranks' logs (each says the verdict it met) also when a case passes. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>

#include "comm/comm.h"
#include "comm/cpu.h"
#include "comm_test.h"
#include "common/fs.h"
#include "test.h"

#define H_RING 65536 /* bytes of each ring the hostile offers */
#define H_SLOT ((SHM_RING_HDR + H_RING + 4095) & ~4095)
#define N_FLOATS 65536 /* 256 KiB: the ring algorithm, blocks larger than a hostile ring */

enum { K_HELLO, K_OFFER, K_FRAME, K_RING, K_DATA };

enum {
  M_NONE,
  /* hello */
  H_SRC, H_DST, H_SELF, H_KIND, H_SIZE, H_VERSION, H_DATA_LOCAL, H_CUT, H_PROOF_CUT,
  /* offer */
  O_WRAP_OFFSET, O_WRAP_RING, O_PAST_END, O_MISALIGNED, O_IN_HEADER, O_RING_ZERO, O_RING_ODD, O_SIZE_HUGE,
  O_SIZE_WRONG, O_NAME_UNTERMINATED, O_NAME_SLASH, O_NAME_OTHER, O_SHORT, O_TWICE, O_NOT_ITS,
  /* frame */
  F_TYPE_ZERO, F_TYPE_HIGH, F_RESERVED, F_LEN_OVER, F_LEN_MAX, F_TRUNCATED, F_FAIL_SHORT, F_FAIL_CODE,
  F_FAIL_CULPRIT, F_PONG_SHORT, F_PONG_WAITING, F_PONG_IN_OP, F_PING_PAYLOAD, F_DOORBELL_ARG, F_OFFER_LATE,
  F_MAPPED_LATE,
  /* ring */
  R_HEAD_AHEAD, R_HEAD_BEHIND, R_TAIL_AHEAD, R_TAIL_BEHIND,
  /* data */
  D_TRUNCATED,
};

typedef struct hcase {
  const char *name;
  int kind;
  int mut;
  int victim;        /* the slot that gets the mutation */
  int tcp;           /* the hostile on another host */
  const char *field; /* what the victim's error (hello: its log line) must say */
} hcase;

static const hcase cases[] = {
    {"hello_src_out_of_range", K_HELLO, H_SRC, 0, 0, "source rank"},
    {"hello_dst_not_this_rank", K_HELLO, H_DST, 0, 0, "destination rank"},
    {"hello_src_is_this_rank", K_HELLO, H_SELF, 0, 0, "source rank"},
    {"hello_kind", K_HELLO, H_KIND, 0, 0, "kind 9"},
    {"hello_size", K_HELLO, H_SIZE, 0, 0, "size 1000"},
    {"hello_version", K_HELLO, H_VERSION, 0, 0, "protocol version 99"},
    {"hello_data_to_local_peer", K_HELLO, H_DATA_LOCAL, 0, 0, "not expected now"},
    {"hello_truncated", K_HELLO, H_CUT, 0, 0, "closed during the handshake"},
    {"proof_truncated", K_HELLO, H_PROOF_CUT, 0, 0, "closed before its proof"},
    {"offer_wrap_offset", K_OFFER, O_WRAP_OFFSET, 0, 0, "ring offset"},
    {"offer_wrap_ring", K_OFFER, O_WRAP_RING, 0, 0, "ring of"},
    {"offer_past_end", K_OFFER, O_PAST_END, 0, 0, "past the end"},
    {"offer_misaligned", K_OFFER, O_MISALIGNED, 0, 0, "ring offset"},
    {"offer_in_header", K_OFFER, O_IN_HEADER, 0, 0, "ring offset"},
    {"offer_ring_zero", K_OFFER, O_RING_ZERO, 0, 0, "ring of 0 bytes"},
    {"offer_ring_odd", K_OFFER, O_RING_ODD, 0, 0, "ring of 65528 bytes"},
    {"offer_size_huge", K_OFFER, O_SIZE_HUGE, 0, 0, "segment size"},
    {"offer_size_wrong", K_OFFER, O_SIZE_WRONG, 0, 0, "its offer says"},
    {"offer_name_unterminated", K_OFFER, O_NAME_UNTERMINATED, 0, 0, "segment name"},
    {"offer_name_slash", K_OFFER, O_NAME_SLASH, 0, 0, "segment name"},
    {"offer_name_other", K_OFFER, O_NAME_OTHER, 0, 0, "segment name"},
    {"offer_short", K_OFFER, O_SHORT, 0, 0, "shared-memory offer of 10 payload bytes"},
    {"offer_twice", K_OFFER, O_TWICE, 0, 0, "second shared-memory offer"},
    {"offer_not_its_segment", K_OFFER, O_NOT_ITS, 0, 0, "not its segment"},
    {"frame_type_zero", K_FRAME, F_TYPE_ZERO, 0, 0, "unknown type 0"},
    {"frame_type_high", K_FRAME, F_TYPE_HIGH, 0, 0, "unknown type 200"},
    {"frame_reserved", K_FRAME, F_RESERVED, 0, 0, "reserved byte 0x5a"},
    {"frame_length_over", K_FRAME, F_LEN_OVER, 0, 0, "401 payload bytes"},
    {"frame_length_max", K_FRAME, F_LEN_MAX, 0, 0, "65535 payload bytes"},
    {"frame_truncated", K_FRAME, F_TRUNCATED, 0, 0, "in the middle of a control frame"},
    {"frame_fail_short", K_FRAME, F_FAIL_SHORT, 0, 0, "failure notice of 2 payload bytes"},
    {"frame_fail_code", K_FRAME, F_FAIL_CODE, 0, 0, "code 9999"},
    {"frame_fail_culprit", K_FRAME, F_FAIL_CULPRIT, 0, 0, "naming rank -7"},
    {"frame_pong_short", K_FRAME, F_PONG_SHORT, 0, 0, "probe answer of 5 payload bytes"},
    {"frame_pong_waiting", K_FRAME, F_PONG_WAITING, 0, 0, "waits for rank 1000"},
    {"frame_pong_in_op", K_FRAME, F_PONG_IN_OP, 0, 0, "in-operation flag 7"},
    {"frame_ping_payload", K_FRAME, F_PING_PAYLOAD, 0, 0, "probe of 16 payload bytes"},
    {"frame_doorbell_arg", K_FRAME, F_DOORBELL_ARG, 0, 0, "argument 77"},
    {"frame_offer_after_build", K_FRAME, F_OFFER_LATE, 0, 0, "after the build"},
    {"frame_mapped_after_build", K_FRAME, F_MAPPED_LATE, 0, 0, "after the build"},
    {"frame_type_tcp", K_FRAME, F_TYPE_HIGH, 0, 1, "unknown type 200"},
    {"frame_offer_tcp", K_FRAME, F_OFFER_LATE, 0, 1, "after the build"},
    {"ring_head_ahead", K_RING, R_HEAD_AHEAD, 0, 0, "ring's head"},
    {"ring_head_behind", K_RING, R_HEAD_BEHIND, 0, 0, "ring's head"},
    {"ring_tail_ahead", K_RING, R_TAIL_AHEAD, 1, 0, "ring's tail"},
    {"ring_tail_behind", K_RING, R_TAIL_BEHIND, 1, 0, "ring's tail"},
    {"data_truncated_tcp", K_DATA, D_TRUNCATED, 0, 1, "closed the data connection"},
};

static char logdir[256];

static int is_post(const hcase *k) { return k->kind >= K_FRAME; }

/* Generation 7's members: {0, 1, hostile} after the build, {0, hostile} for the build's cases. */
static int gen7_members(const hcase *k, int *m) {
  m[0] = 0;
  if (is_post(k)) {
    m[1] = 1;
    m[2] = 2;
    return 3;
  }
  m[1] = 2;
  return 2;
}

/* --- the hostile peer -------------------------------------------------------------------- */

static int hx_connect(const char *addr) {
  struct sockaddr_storage ss;
  socklen_t len;
  if (net_resolve(addr, &ss, &len) != NEWT_OK) return -1;
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct timeval tv = {30, 0}; /* bounds a broken run only */
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&ss, len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int send_all(int fd, const void *p, size_t n) {
  size_t off = 0;
  while (off < n) {
    ssize_t r = send(fd, (const char *)p + off, n - off, MSG_NOSIGNAL);
    if (r <= 0) return -1;
    off += (size_t)r;
  }
  return 0;
}

/* Reads until the other side closes (1), or an error or the receive timeout (0). */
static int read_to_eof(int fd) {
  char b[512];
  for (;;) {
    ssize_t r = recv(fd, b, sizeof b, 0);
    if (r == 0 || (r < 0 && errno == ECONNRESET)) return 1;
    if (r < 0) return 0;
  }
}

typedef struct hx_ctx {
  const unsigned char *secret;
  uint64_t generation, tag, members;
  int me, size;
} hx_ctx;

/* A real handshake as rank x->me with dst; the fd, or -1. */
static int hx_join(const hx_ctx *x, const char *addr, int dst, int kind) {
  int fd = hx_connect(addr);
  if (fd < 0) return -1;
  uint8_t hello[HS_HELLO_LEN], nonce[HS_NONCE_LEN], chal[HS_CHAL_LEN], proof[HS_MAC_LEN], expect[HS_MAC_LEN], res[8];
  newt_random_bytes(nonce, sizeof nonce);
  hs_encode_hello(hello, x->generation, x->tag, x->members, x->me, dst, x->size, kind, nonce);
  if (send_all(fd, hello, sizeof hello) != 0 || ct_read_full(fd, chal, sizeof chal) != 0 || le_get32(chal + 8) != 0)
    goto bad;
  hs_mac(x->secret, 32, "newt-server", hello, chal + 24, expect);
  if (memcmp(expect, chal + 56, HS_MAC_LEN) != 0) goto bad;
  hs_mac(x->secret, 32, "newt-client", hello, chal + 24, proof);
  if (send_all(fd, proof, sizeof proof) != 0 || ct_read_full(fd, res, sizeof res) != 0 || le_get32(res) != 0) goto bad;
  return fd;
bad:
  close(fd);
  return -1;
}

/* A mutated handshake; returns 1 when the victim refused it and closed the connection. Its
 * local port goes to sh->val[0] first (the victim's log names it). */
static int hx_bad_hello(ct_world *w, const hx_ctx *x, const char *addr, int mut) {
  int fd = hx_connect(addr);
  if (fd < 0) return 0;
  struct sockaddr_in sa;
  socklen_t sl = sizeof sa;
  getsockname(fd, (struct sockaddr *)&sa, &sl);
  atomic_store(&w->sh->val[0], ntohs(sa.sin_port));
  uint8_t hello[HS_HELLO_LEN], nonce[HS_NONCE_LEN] = {7}, chal[HS_CHAL_LEN], proof[HS_MAC_LEN], res[8];
  hs_encode_hello(hello, x->generation, x->tag, x->members, x->me, 0, x->size, HS_KIND_CTRL, nonce);
  switch (mut) {
    case H_SRC: le_put32(hello + 40, 7); break;
    case H_DST: le_put32(hello + 44, 5); break;
    case H_SELF: le_put32(hello + 40, 0); break;
    case H_KIND: le_put32(hello + 12, 9); break;
    case H_SIZE: le_put32(hello + 48, 1000); break;
    case H_VERSION: le_put32(hello + 8, 99); break;
    case H_DATA_LOCAL: le_put32(hello + 12, HS_KIND_DATA); break;
    default: break;
  }
  int refused = 0;
  if (mut == H_CUT) {
    refused = send_all(fd, hello, 50) == 0 && shutdown(fd, SHUT_WR) == 0;
  } else if (send_all(fd, hello, sizeof hello) == 0 && ct_read_full(fd, chal, sizeof chal) == 0) {
    if (mut != H_PROOF_CUT && mut != H_DATA_LOCAL) {
      refused = le_get32(chal + 8) != 0;
    } else if (le_get32(chal + 8) == 0) {
      hs_mac(x->secret, 32, "newt-client", hello, chal + 24, proof);
      if (mut == H_PROOF_CUT) refused = send_all(fd, proof, 10) == 0 && shutdown(fd, SHUT_WR) == 0;
      else refused = send_all(fd, proof, sizeof proof) == 0 && ct_read_full(fd, res, sizeof res) == 0 && le_get32(res) != 0;
    }
  }
  refused = refused && read_to_eof(fd);
  close(fd);
  return refused;
}

static int hx_frame(int fd, int type, int rsv, unsigned len, uint32_t arg, const void *payload, size_t n) {
  static uint8_t b[CTRL_HDR + 65536];
  b[0] = (uint8_t)type;
  b[1] = (uint8_t)rsv;
  b[2] = (uint8_t)(len & 0xff);
  b[3] = (uint8_t)(len >> 8);
  le_put32(b + 4, arg);
  if (n) memcpy(b + CTRL_HDR, payload, n);
  return send_all(fd, b, CTRL_HDR + n);
}

static int hx_read_frame(int fd, int *type, uint8_t *payload, size_t *len) {
  uint8_t h[CTRL_HDR];
  if (ct_read_full(fd, h, sizeof h) != 0) return -1;
  *type = h[0];
  *len = (size_t)h[2] | (size_t)h[3] << 8;
  if (*len > CTRL_MAX_PAYLOAD) return -1;
  return ct_read_full(fd, payload, *len);
}

typedef struct hx_peer {
  int ctrl, data;
  /* the victim's offer: its segment, mapped here, and the ring in it this peer fills */
  void *map;
  size_t map_len;
  uint64_t off;
} hx_peer;

static size_t offer_payload(uint8_t *p, uint64_t size, uint64_t off, uint64_t ring, const char *name) {
  le_put64(p, size);
  le_put64(p + 8, off);
  le_put64(p + 16, ring);
  size_t n = strlen(name) + 1;
  memcpy(p + 24, name, n);
  return 24 + n;
}

/* The hostile's offer to peer i, mutated when i is the victim of an offer case. */
static void hx_offer(int fd, const hcase *k, int victim, const char *seg, uint64_t seg_size, int i) {
  uint8_t p[CTRL_MAX_PAYLOAD];
  uint64_t size = seg_size, off = SHM_HDR_BYTES + (uint64_t)i * H_SLOT, ring = H_RING;
  int mut = victim && k->kind == K_OFFER ? k->mut : M_NONE;
  switch (mut) {
    case O_WRAP_OFFSET: off = (uint64_t)0 - (SHM_RING_HDR + H_RING) + SHM_HDR_BYTES; break; /* off + 128 + ring = 4096 */
    case O_WRAP_RING: ring = (uint64_t)0 - off - SHM_RING_HDR + 64; break;                 /* off + 128 + ring = 64 */
    case O_PAST_END: off = seg_size - SHM_RING_HDR - H_RING + 64; break;
    case O_MISALIGNED: off += 8; break;
    case O_IN_HEADER: off = 64; break;
    case O_RING_ZERO: ring = 0; break;
    case O_RING_ODD: ring = H_RING - 8; break;
    case O_SIZE_HUGE: size = (uint64_t)1 << 63; break;
    case O_SIZE_WRONG: size = seg_size + 4096; break;
    default: break;
  }
  size_t n;
  if (mut == O_NAME_UNTERMINATED) {
    n = offer_payload(p, size, off, ring, seg);
    memset(p + 24, 'a', 60);
    memcpy(p + 24, "/newt-", 6);
    n = 24 + 60; /* no NUL */
  } else if (mut == O_NAME_SLASH) {
    char bad[200];
    snprintf(bad, sizeof bad, "%s/../x", seg);
    n = offer_payload(p, size, off, ring, bad);
  } else if (mut == O_NAME_OTHER) {
    n = offer_payload(p, size, off, ring, "/other-segment");
  } else {
    n = offer_payload(p, size, off, ring, seg);
  }
  if (mut == O_SHORT) n = 10;
  hx_frame(fd, CTRL_SHM_OFFER, 0, (unsigned)n, 0, p, n);
  if (mut == O_TWICE) hx_frame(fd, CTRL_SHM_OFFER, 0, (unsigned)n, 0, p, n);
}

/* Reads peer i's offer, maps its segment (to write its ring's head), says mapped. */
static int hx_take_offer(hx_peer *p) {
  uint8_t pl[CTRL_MAX_PAYLOAD + 1];
  size_t len;
  int type;
  if (hx_read_frame(p->ctrl, &type, pl, &len) != 0 || type != CTRL_SHM_OFFER || len < 25) return -1;
  pl[len] = 0;
  uint64_t size = le_get64(pl);
  p->off = le_get64(pl + 8);
  int fd = shm_open((const char *)pl + 24, O_RDWR, 0);
  if (fd < 0) return -1;
  p->map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p->map == MAP_FAILED) {
    p->map = NULL;
    return -1;
  }
  p->map_len = size;
  return hx_frame(p->ctrl, CTRL_SHM_MAPPED, 0, 0, 0, NULL, 0);
}

static void hx_mutate_frame(int fd, const hcase *k, const char *seg, uint64_t seg_size) {
  uint8_t p[CTRL_MAX_PAYLOAD + 1];
  memset(p, 0, sizeof p);
  switch (k->mut) {
    case F_TYPE_ZERO: hx_frame(fd, 0, 0, 0, 0, NULL, 0); break;
    case F_TYPE_HIGH: hx_frame(fd, 200, 0, 0, 0, NULL, 0); break;
    case F_RESERVED: hx_frame(fd, CTRL_DOORBELL, 0x5a, 0, 0, NULL, 0); break;
    case F_LEN_OVER: hx_frame(fd, CTRL_FAIL, 0, 401, NEWT_ERR_PEER, p, 401); break;
    case F_LEN_MAX: {
      static uint8_t big[65535];
      hx_frame(fd, CTRL_PING, 0, 65535, 1, big, sizeof big);
      break;
    }
    case F_TRUNCATED:
      hx_frame(fd, CTRL_FAIL, 0, 100, NEWT_ERR_PEER, p, 20);
      shutdown(fd, SHUT_WR);
      break;
    case F_FAIL_SHORT: hx_frame(fd, CTRL_FAIL, 0, 2, NEWT_ERR_PEER, p, 2); break;
    case F_FAIL_CODE:
      le_put32(p, (uint32_t)-1);
      memcpy(p + 4, "lies", 4);
      hx_frame(fd, CTRL_FAIL, 0, 8, 9999, p, 8);
      break;
    case F_FAIL_CULPRIT:
      le_put32(p, (uint32_t)-7);
      memcpy(p + 4, "lies", 4);
      hx_frame(fd, CTRL_FAIL, 0, 8, NEWT_ERR_PEER, p, 8);
      break;
    case F_PONG_SHORT: hx_frame(fd, CTRL_PONG, 0, 5, 1, p, 5); break;
    case F_PONG_WAITING:
      le_put32(p, 1);
      le_put32(p + 4, 1000);
      hx_frame(fd, CTRL_PONG, 0, 8, 1, p, 8);
      break;
    case F_PONG_IN_OP:
      le_put32(p, 7);
      le_put32(p + 4, (uint32_t)-1);
      hx_frame(fd, CTRL_PONG, 0, 8, 1, p, 8);
      break;
    case F_PING_PAYLOAD: hx_frame(fd, CTRL_PING, 0, 16, 1, p, 16); break;
    case F_DOORBELL_ARG: hx_frame(fd, CTRL_DOORBELL, 0, 0, 77, NULL, 0); break;
    case F_OFFER_LATE: {
      size_t n = offer_payload(p, seg_size, (uint64_t)0 - (SHM_RING_HDR + H_RING) + SHM_HDR_BYTES, H_RING,
                               seg ? seg : "/newt-none");
      hx_frame(fd, CTRL_SHM_OFFER, 0, (unsigned)n, 0, p, n);
      break;
    }
    case F_MAPPED_LATE: hx_frame(fd, CTRL_SHM_MAPPED, 0, 0, 0, NULL, 0); break;
    default: break;
  }
}

static shm_ring *ring_at(void *map, uint64_t off) { return (shm_ring *)((uint8_t *)map + off); }

static int hostile(ct_world *w, int slot, const hcase *k) {
  int rank = slot;
  int m[3], n = gen7_members(k, m), np = n - 1, local = !k->tcp;
  const char *addrs[3], *hosts[3];
  for (int i = 0; i < n; i++) {
    addrs[i] = w->addrs[m[i]];
    hosts[i] = w->hosts[m[i]];
  }
  hx_ctx x = {.secret = w->secret, .generation = w->generation, .tag = cpu_root_tag(w->job),
              .members = cpu_members_hash(n, addrs, hosts), .me = n - 1, .size = n};
  /* its own segment: a header as an honest rank writes it, a ring per peer */
  char seg[160] = "";
  uint64_t seg_size = SHM_HDR_BYTES + (uint64_t)np * H_SLOT;
  void *own = NULL;
  if (local) {
    char job[64];
    snprintf(job, sizeof job, "%s", w->job);
    for (char *p = job; *p; p++)
      if (*p == '-') *p = '_';
    snprintf(seg, sizeof seg, "/newt-%s-hostile", job);
    int fd = shm_open(seg, O_RDWR | O_CREAT | O_EXCL, 0600);
    CHECKR(fd >= 0 && ftruncate(fd, (off_t)seg_size) == 0, "its segment %s: %s", seg, strerror(errno));
    if (fd < 0) return ct_failures;
    own = mmap(NULL, seg_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    CHECKR(own != MAP_FAILED, "mmap: %s", strerror(errno));
    if (own == MAP_FAILED) return ct_failures;
    shm_hdr *h = own;
    h->magic = SHM_MAGIC;
    h->generation = w->generation;
    h->rank = (uint32_t)(k->kind == K_OFFER && k->mut == O_NOT_ITS ? 0 : x.me);
    h->size = (uint32_t)n;
  }
  hx_peer p[2];
  memset(p, 0, sizeof p);
  for (int i = 0; i < np; i++) {
    p[i].ctrl = p[i].data = -1;
    if (k->kind == K_HELLO && i == 0)
      CHECKR(hx_bad_hello(w, &x, addrs[0], k->mut), "%s: the victim did not refuse the mutated handshake", k->name);
    p[i].ctrl = hx_join(&x, addrs[i], i, HS_KIND_CTRL);
    CHECKR(p[i].ctrl >= 0, "no control connection to rank %d", i);
    if (!local) {
      p[i].data = hx_join(&x, addrs[i], i, HS_KIND_DATA);
      CHECKR(p[i].data >= 0, "no data connection to rank %d", i);
    }
  }
  if (local)
    for (int i = 0; i < np; i++) {
      if (p[i].ctrl < 0) continue;
      hx_offer(p[i].ctrl, k, m[i] == k->victim, seg, seg_size, i);
      int took = hx_take_offer(&p[i]);
      CHECKR(took == 0 || k->kind == K_OFFER, "rank %d's offer could not be taken", i);
    }
  if (is_post(k)) {
    /* once both honest ranks built the communicator */
    newt_deadline_t d = newt_deadline_in_ms(60000);
    while (atomic_load(&w->sh->ready) < 2 && !newt_deadline_passed(d)) newt_sleep_ms(1);
    CHECKR(atomic_load(&w->sh->ready) == 2, "the honest ranks did not build generation 7");
    hx_peer *v = &p[k->victim];
    if (k->kind == K_FRAME) {
      hx_mutate_frame(v->ctrl, k, local ? seg : NULL, seg_size);
    } else if (k->kind == K_RING) {
      shm_ring *r = k->mut == R_HEAD_AHEAD || k->mut == R_HEAD_BEHIND
                        ? ring_at(v->map, v->off)
                        : ring_at(own, SHM_HDR_BYTES + (uint64_t)k->victim * H_SLOT);
      switch (k->mut) {
        case R_HEAD_AHEAD: atomic_store(&r->head, 2 * (uint64_t)(1 << 20) + 64); break; /* more than a ring holds */
        case R_HEAD_BEHIND: atomic_store(&r->head, (uint64_t)0 - 4096); break;
        case R_TAIL_AHEAD: atomic_store(&r->tail, (uint64_t)1 << 20); break; /* more than was written */
        case R_TAIL_BEHIND: atomic_store(&r->tail, (uint64_t)0 - 4096); break;
        default: break;
      }
      hx_frame(v->ctrl, CTRL_DOORBELL, 0, 0, 0, NULL, 0);
    } else if (k->kind == K_DATA) {
      static uint8_t part[1000];
      CHECKR(send_all(v->data, part, sizeof part) == 0, "sending part of a block");
      shutdown(v->data, SHUT_WR);
    }
  }
  /* until every honest rank closed its connections: dropped as a liar, or done */
  newt_deadline_t d = newt_deadline_in_ms(60000);
  for (;;) {
    struct pollfd pf[4];
    int nf = 0;
    for (int i = 0; i < np; i++) {
      if (p[i].ctrl >= 0) pf[nf++] = (struct pollfd){.fd = p[i].ctrl, .events = POLLIN};
      if (p[i].data >= 0) pf[nf++] = (struct pollfd){.fd = p[i].data, .events = POLLIN};
    }
    if (nf == 0 || newt_deadline_passed(d)) break;
    if (poll(pf, (nfds_t)nf, 100) <= 0) continue;
    for (int j = 0; j < nf; j++) {
      if (!pf[j].revents) continue;
      char b[4096];
      ssize_t r = recv(pf[j].fd, b, sizeof b, MSG_DONTWAIT);
      if (r > 0 || (r < 0 && (errno == EAGAIN || errno == EINTR))) continue;
      for (int i = 0; i < np; i++) {
        if (p[i].ctrl == pf[j].fd) p[i].ctrl = -1;
        if (p[i].data == pf[j].fd) p[i].data = -1;
      }
      close(pf[j].fd);
    }
  }
  for (int i = 0; i < np; i++) {
    CHECKR(p[i].ctrl < 0 && p[i].data < 0, "rank %d never closed its connections", i);
    if (p[i].map) munmap(p[i].map, p[i].map_len);
  }
  if (own) munmap(own, seg_size);
  if (local) shm_unlink(seg);
  return ct_failures;
}

/* --- the honest ranks -------------------------------------------------------------------- */

/* Whether one line of the log at path holds both a and b. */
static int log_line_has(const char *path, const char *a, const char *b) {
  char *text = NULL;
  size_t len;
  if (newt_fs_read_all(path, 1 << 22, &text, &len) != NEWT_OK) return 0;
  int found = 0;
  for (char *line = text; line && *line && !found;) {
    char *end = strchr(line, '\n');
    if (end) *end = '\0';
    found = strstr(line, a) && strstr(line, b);
    line = end ? end + 1 : NULL;
  }
  free(text);
  return found;
}

static int check_sum(int rank, comm_t *c, const char *what) {
  float *x = malloc(N_FLOATS * sizeof *x), *y = malloc(N_FLOATS * sizeof *y);
  if (!x || !y) return 1;
  for (int i = 0; i < N_FLOATS; i++) x[i] = (float)(comm_rank(c) * 1000 + i % 997);
  newt_result_t r = comm_allreduce(c, x, y, N_FLOATS, NEWT_F32, COMM_SUM);
  CHECKR(r == NEWT_OK, "%s: allreduce: %s", what, newt_errmsg());
  int wrong = 0;
  for (int i = 0; r == NEWT_OK && i < N_FLOATS; i++) wrong += y[i] != (float)(1000 + 2 * (i % 997));
  CHECKR(wrong == 0, "%s: %d elements of the allreduce are wrong", what, wrong);
  free(x);
  free(y);
  return 0;
}

static int honest(ct_world *w, int slot, const hcase *k) {
  int rank = slot;
  char path[300];
  snprintf(path, sizeof path, "%s/slot%d.log", logdir, slot);
  if (!freopen(path, "w", stderr)) return 1;
  setvbuf(stderr, NULL, _IONBF, 0);
  int fds0 = ct_fd_count();
  comm_t *c = NULL, *c2 = NULL;
  char hname[160], err[1024];
  if (is_post(k) || slot == 0) {
    int m[3], n = gen7_members(k, m), missing[3] = {0};
    const char *addrs[CT_MAX], *hosts[CT_MAX];
    comm_config cfg;
    ct_config_members(w, slot, m, n, &cfg, addrs, hosts);
    /* the no-progress deadline only decides when the code under test takes a lie for truth */
    cfg.timeout_ms = is_post(k) ? 20000 : 3000;
    cfg.build_timeout_ms = 30000;
    cfg.missing = missing;
    snprintf(hname, sizeof hname, "rank %d (%s)", n - 1, w->addrs[2]);
    newt_result_t r = comm_create(&cfg, &c);
    snprintf(err, sizeof err, "%s", newt_errmsg());
    if (r != NEWT_OK) fprintf(stderr, "rank %d: comm_create: %s: %s\n", rank, newt_result_name(r), err);
    if (k->kind == K_HELLO) {
      CHECKR(r == NEWT_OK, "comm_create after a refused handshake: %s", err);
      char from[64];
      snprintf(from, sizeof from, "refused a connection from 127.0.0.1:%lld:", (long long)atomic_load(&w->sh->val[0]));
      CHECKR(log_line_has(path, from, k->field), "no log line \"%s ... %s\"", from, k->field);
      comm_free(c);
      c = NULL;
    } else if (k->kind == K_OFFER) {
      CHECKR(r == NEWT_ERR_PEER && strstr(err, hname) && strstr(err, k->field),
             "comm_create -> %s, expected NEWT_ERR_PEER naming %s and \"%s\": %s", newt_result_name(r), hname,
             k->field, err);
      CHECKR(missing[1] == 1 && missing[0] == 0, "missing = {%d, %d}, expected {0, 1}", missing[0], missing[1]);
      if (c) { /* the offer was taken: the first send goes through the ring it described */
        static uint8_t b[1 << 20];
        newt_result_t s = comm_send(c, b, sizeof b, NEWT_U8, 1);
        fprintf(stderr, "rank %d: a send through the hostile's ring: %s\n", rank, newt_result_name(s));
        comm_free(c);
        c = NULL;
      }
    } else {
      CHECKR(r == NEWT_OK, "comm_create with the hostile (still behaving): %s", err);
      if (c) {
        atomic_fetch_add(&w->sh->ready, 1);
        float *x = calloc(N_FLOATS, sizeof *x), *y = calloc(N_FLOATS, sizeof *y);
        r = comm_allreduce(c, x, y, N_FLOATS, NEWT_F32, COMM_SUM);
        snprintf(err, sizeof err, "%s", newt_errmsg());
        free(x);
        free(y);
        comm_status st;
        comm_get_status(c, &st);
        fprintf(stderr, "rank %d: allreduce: %s; status: peer %d, %s\n", rank, newt_result_name(r), st.peer, st.msg);
        CHECKR(r == NEWT_ERR_PEER && st.code == NEWT_ERR_PEER && st.peer == 2,
               "allreduce -> %s, status %s peer %d, expected NEWT_ERR_PEER naming rank 2: %s", newt_result_name(r),
               newt_result_name(st.code), st.peer, st.msg);
        CHECKR(strstr(st.msg, k->field) != NULL, "the verdict does not say \"%s\": %s", k->field, st.msg);
        if (slot == k->victim) CHECKR(strstr(st.msg, hname) != NULL, "the verdict does not name %s: %s", hname, st.msg);
        else CHECKR(strstr(st.msg, "reported by rank") != NULL, "not the victim's verdict: %s", st.msg);
        int ex = 2;
        unsigned char s2[32];
        memcpy(s2, w->secret, sizeof s2);
        s2[0] ^= 0xa5;
        OKR(comm_shrink(c, &ex, 1, w->generation + 1, s2, sizeof s2, &c2));
      }
    }
  }
  if (!c2) { /* the first generation never formed: the next without the hostile */
    int m[2] = {0, 1};
    const char *addrs[CT_MAX], *hosts[CT_MAX];
    comm_config cfg;
    ct_config_members(w, slot, m, 2, &cfg, addrs, hosts);
    cfg.generation = w->generation + 1;
    cfg.secret[0] ^= 0xa5;
    cfg.build_timeout_ms = 30000;
    OKR(comm_create(&cfg, &c2));
  }
  if (c2) check_sum(rank, c2, "generation 8 without the hostile");
  comm_free(c2);
  comm_free(c);
  int fds1 = ct_fd_count();
  CHECKR(fds1 == fds0, "%d fds open at the start, %d at the end", fds0, fds1);
  return ct_failures;
}

static int slot_main(ct_world *w, int slot, void *arg) {
  return slot == 2 ? hostile(w, slot, arg) : honest(w, slot, arg);
}

/* --- the cases --------------------------------------------------------------------------- */

static void run_case(const hcase *k) {
  ct_world w;
  ct_world_init(&w, 3, CT_SHM, k->name);
  if (k->tcp) snprintf(w.host_buf[2], sizeof w.host_buf[2], "hostB");
  snprintf(logdir, sizeof logdir, "/tmp/newt-test-hostile-%d-%s", (int)getpid(), k->name);
  newt_fs_mkdirs(logdir, 0700);
  ct_spawn(&w, slot_main, (void *)k);
  int bad = ct_wait(&w, 120000, NULL);
  T_CHECK_MSG(bad == 0, "%d of the 3 processes failed", bad);
  char needle[64];
  snprintf(needle, sizeof needle, "%s", w.job);
  for (char *p = needle; *p; p++)
    if (*p == '-') *p = '_';
  T_CHECK_MSG(ct_shm_count(needle) == 0, "segments of %s left in /dev/shm", needle);
  if (t_cur_failed || getenv("NEWT_TEST_VERBOSE")) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "for f in %s/*.log; do echo \"== $f\"; cat \"$f\"; done >&2", logdir);
    if (system(cmd) != 0) fprintf(stderr, "(no logs)\n");
  }
  newt_fs_rm_rf(logdir);
  ct_world_free(&w);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  int ran = 0;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    int want = argc < 2;
    for (int a = 1; a < argc; a++) want |= strcmp(argv[a], cases[i].name) == 0;
    if (!want) continue;
    ran++;
    t_cur_name = cases[i].name;
    t_cur_failed = 0;
    double t0 = newt_now_s();
    run_case(&cases[i]);
    fprintf(stderr, "%s %s (%.2f s)\n", t_cur_failed ? "FAILED" : "ok    ", cases[i].name, newt_now_s() - t0);
    if (t_cur_failed) t_failed++;
    else t_passed++;
  }
  if (!ran) {
    fprintf(stderr, "no case of that name\n");
    return 2;
  }
  return T_DONE();
}
