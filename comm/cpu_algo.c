/* The collective algorithms of the CPU backend, all driven by one engine.
 *
 * The engine (ring_run) runs a list of steps between a left link (bytes come in) and a
 * right link (bytes go out). Step s sends sbytes from src and receives rbytes into dst,
 * either copied or reduced with `own` (dst = own op incoming). Sends and receives
 * proceed independently, chunk by chunk, so a step is pipelined with the next one; gates
 * keep the data dependencies:
 *   GATE_SEND_PREV  byte x of step s is sent once byte x of step s-1 has arrived (a ring
 *                   forwards what it just reduced);
 *   GATE_SEND_SAME  byte x is sent once byte x of the same step has arrived (a chain);
 *   GATE_RECV_SEND  byte x is received once byte x of the same step has been sent (the
 *                   receive overwrites what is being sent: reduce-scatter's scratch).
 * Every dependency points to an earlier byte of an earlier or the same step, on this
 * rank or a neighbour, so the ring cannot deadlock whatever the buffer sizes.
 *
 * Algorithms:
 *  - allreduce, large: ring reduce-scatter then ring allgather (2(n-1) steps of 1/n of
 *    the vector each; the bandwidth-optimal choice). The receive buffer holds the partial
 *    sums. Every block is reduced in ring order and then copied, so all ranks end with
 *    bitwise identical results.
 *  - allreduce, small (<= NEWT_COMM_SMALL_BYTES) and barrier: recursive doubling
 *    (log2 n exchanges of the whole vector; non-powers of two fold the extra ranks in
 *    first). Partners combine the same two values (x+y and y+x are equal in IEEE
 *    arithmetic), so results are identical on all ranks here too.
 *  - reduce-scatter and allgather: the ring halves above.
 *  - broadcast: a binomial tree for small messages, a pipelined chain for large ones.
 *  - send/recv: one step on the peer's link. */
#include <stdlib.h>
#include <string.h>

#include "comm/cpu.h"
#include "comm/reduce.h"

enum { GATE_SEND_PREV = 1, GATE_SEND_SAME = 2, GATE_RECV_SEND = 4 };

typedef struct ring_step {
  const uint8_t *src; /* NULL: nothing to send at this step */
  size_t sbytes;
  uint8_t *dst; /* NULL: nothing to receive */
  const uint8_t *own;
  size_t rbytes;
  int div;
  int gate;
  int scratch; /* dst only feeds the next step's send: not needed afterwards */
} ring_step;

/* Step s forwards: what it receives is exactly what step s+1 sends. */
static int forwards(const ring_step *st, int n, int s) {
  return s + 1 < n && (st[s + 1].gate & GATE_SEND_PREV) && st[s + 1].src == st[s].dst && st[s].dst &&
         st[s + 1].sbytes == st[s].rbytes;
}

typedef struct ring_plan {
  cpu_link *left, *right;
  ring_step *steps;
  int n;
  int fuse;
  newt_dtype dt;
  comm_op op;
  size_t es;
} ring_plan;

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

static newt_result_t ring_run(cpu_comm *c, const ring_plan *p) {
  cpu_wait w;
  cpu_wait_init(&w, c);
  int ss = 0, rs = 0;
  size_t so = 0, ro = 0;
  size_t sch = p->right ? link_chunk(p->right) : 0;
  size_t rch = p->left ? link_chunk(p->left) : 0;
  newt_result_t res = NEWT_OK;
  for (;;) {
    while (ss < p->n && (!p->steps[ss].src || so == p->steps[ss].sbytes)) {
      ss++;
      so = 0;
    }
    while (rs < p->n && (!p->steps[rs].dst || ro == p->steps[rs].rbytes)) {
      rs++;
      ro = 0;
    }
    if (ss >= p->n && rs >= p->n) break;
    if (atomic_load_explicit(&c->pub->failed, memory_order_relaxed)) { /* aborted meanwhile */
      res = comm_failed_err(c->pub, c->op_name);
      goto out;
    }
    int moved = 0, tx_full = 0, rx_empty = 0; /* blocked by the link, not by a gate */
    if (ss < p->n) {
      const ring_step *st = &p->steps[ss];
      size_t limit = st->sbytes;
      if ((st->gate & GATE_SEND_PREV) && ss > 0 && rs <= ss - 1) limit = rs == ss - 1 ? ro : 0;
      if ((st->gate & GATE_SEND_SAME) && rs <= ss) limit = rs == ss ? ro : 0;
      if (so < limit) { /* one chunk per turn, so what was just reduced is still in cache */
        size_t n;
        res = link_send(c, p->right, st->src + so, min_sz(limit - so, sch), &n);
        if (res != NEWT_OK) goto out;
        tx_full = n == 0;
        so += n;
        moved |= n > 0;
      }
    }
    if (rs < p->n) {
      const ring_step *st = &p->steps[rs];
      size_t limit = st->rbytes;
      if ((st->gate & GATE_RECV_SEND) && ss <= rs) limit = ss == rs ? so - so % p->es : 0;
      if (ro < limit) {
        size_t want = min_sz(limit - ro, rch), got = 0;
        uint8_t *slot;
        size_t room = 0;
        /* forwarding over shared memory with nothing left behind: produce straight into
         * the next ring, and store the result (if it is kept) with streaming stores */
        if (p->fuse && ss == rs + 1 && so == ro && p->right && p->right->local && forwards(p->steps, p->n, rs)) {
          res = link_reserve(c, p->right, want, p->es, &slot, &room);
          if (res != NEWT_OK) goto out;
        }
        if (room > 0) {
          const uint8_t *q;
          res = link_peek(c, p->left, room, p->es, &q, &got);
          if (res != NEWT_OK) goto out;
          if (st->own) comm_reduce(p->dt, p->op, slot, st->own + ro, q, got / p->es, st->div);
          else memcpy(slot, q, got);
          link_consume(c, p->left, got);
          if (!st->scratch) comm_copy_stream(st->dst + ro, slot, got);
          link_commit(c, p->right, got);
          so += got;
        } else if (st->own) {
          const uint8_t *q;
          res = link_peek(c, p->left, want, p->es, &q, &got);
          if (res != NEWT_OK) goto out;
          comm_reduce(p->dt, p->op, st->dst + ro, st->own == st->dst ? NULL : st->own + ro, q,
                      got / p->es, st->div);
          link_consume(c, p->left, got);
        } else if (p->left->local && p->fuse && !forwards(p->steps, p->n, rs)) {
          const uint8_t *q; /* a final copy: streaming stores */
          res = link_peek(c, p->left, want, 1, &q, &got);
          if (res != NEWT_OK) goto out;
          comm_copy_stream(st->dst + ro, q, got);
          link_consume(c, p->left, got);
        } else {
          res = link_recv(c, p->left, st->dst + ro, want, &got);
          if (res != NEWT_OK) goto out;
        }
        rx_empty = got == 0;
        ro += got;
        moved |= got > 0;
      }
    }
    if (moved) {
      cpu_wait_progress(&w);
    } else {
      res = cpu_wait_block(&w, rx_empty ? p->left : NULL, tx_full ? p->right : NULL);
      if (res != NEWT_OK) goto out;
    }
  }
out:
  if (p->fuse) comm_stream_fence();
  if (w.armed) atomic_store(&c->hdr->sleeping, 0);
  c->cur_wait = NULL;
  return res;
}

/* One step with one peer: send, receive, or both at once. */
static newt_result_t p2p(cpu_comm *c, int peer, const void *sbuf, void *rbuf, size_t bytes) {
  ring_step st = {.src = sbuf, .sbytes = sbuf ? bytes : 0, .dst = rbuf, .rbytes = rbuf ? bytes : 0};
  ring_plan p = {.left = &c->links[peer], .right = &c->links[peer], .steps = &st, .n = 1, .es = 1};
  return ring_run(c, &p);
}

newt_result_t cpu_scratch(cpu_comm *c, size_t n, void **out) {
  if (n > c->scratch_cap) {
    free(c->scratch);
    c->scratch = aligned_alloc(64, (n + 63) & ~(size_t)63);
    c->scratch_cap = c->scratch ? n : 0;
    if (!c->scratch) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: %zu bytes of scratch", n);
  }
  *out = c->scratch;
  return NEWT_OK;
}

static int mod(int a, int n) { return ((a % n) + n) % n; }

/* Block b of `count` elements split in n: the first count % n blocks get one more. */
static size_t blk_off(size_t count, int n, int b) {
  size_t base = count / (size_t)n, rem = count % (size_t)n;
  return (size_t)b * base + ((size_t)b < rem ? (size_t)b : rem);
}
static size_t blk_len(size_t count, int n, int b) {
  return count / (size_t)n + ((size_t)b < count % (size_t)n ? 1 : 0);
}

static newt_result_t run_steps(cpu_comm *c, ring_step *steps, int nsteps, const comm_opdesc *op,
                               cpu_link *left, cpu_link *right) {
  ring_plan p = {.left = left, .right = right, .steps = steps, .n = nsteps, .dt = op->dt, .op = op->op,
                 .es = newt_dtype_size(op->dt), .fuse = newt_param_CommFuse() != 0};
  return ring_run(c, &p);
}

/* Rounds: every block is cut into pieces of NEWT_COMM_ROUND bytes and the whole ring
 * (all its steps) runs on one piece after the other, so a piece forwarded at step s+1 is
 * the one just reduced at step s, still in cache (or straight into the next ring). */
static size_t round_elems(size_t es) {
  size_t per = (size_t)newt_param_CommRound() / es;
  return per ? per : 1;
}

/* Round k's part [*start, *start + *cnt) of a block of len elements. */
static void round_part(size_t len, size_t per, size_t k, size_t *start, size_t *cnt) {
  size_t a = k * per < len ? k * per : len, b = (k + 1) * per < len ? (k + 1) * per : len;
  *start = a;
  *cnt = b - a;
}

/* Runs the steps from the left neighbour to the right one, and frees them. */
static newt_result_t run_ring(cpu_comm *c, ring_step *st, size_t nsteps, const comm_opdesc *op) {
  int n = c->size, r = c->rank;
  newt_result_t res = run_steps(c, st, (int)nsteps, op, &c->links[mod(r - 1, n)], &c->links[mod(r + 1, n)]);
  free(st);
  return res;
}

static newt_result_t alloc_steps(size_t rounds, int per_round, ring_step **st) {
  *st = calloc(rounds * (size_t)per_round, sizeof **st);
  if (!*st) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: %zu ring steps", rounds * (size_t)per_round);
  return NEWT_OK;
}

static newt_result_t ring_allreduce(cpu_comm *c, const comm_opdesc *op) {
  int n = c->size, r = c->rank, per_round = 2 * (n - 1);
  size_t es = newt_dtype_size(op->dt), per = round_elems(es), cnt = op->count;
  size_t rounds = (blk_len(cnt, n, 0) + per - 1) / per;
  const uint8_t *send = op->send;
  uint8_t *recv = op->recv;
  ring_step *st;
  NEWT_CHECK(alloc_steps(rounds, per_round, &st));
  for (size_t k = 0; k < rounds; k++) {
    ring_step *x = st + k * (size_t)per_round;
    size_t a, na, b, nb;
    for (int s = 0; s < n - 1; s++, x++) {
      int sb = mod(r - s, n), rb = mod(r - s - 1, n);
      round_part(blk_len(cnt, n, sb), per, k, &a, &na);
      round_part(blk_len(cnt, n, rb), per, k, &b, &nb);
      x->src = (s == 0 ? send : recv) + (blk_off(cnt, n, sb) + a) * es;
      x->sbytes = na * es;
      x->dst = recv + (blk_off(cnt, n, rb) + b) * es;
      x->own = send + (blk_off(cnt, n, rb) + b) * es;
      x->rbytes = nb * es;
      x->div = (s == n - 2 && op->op == COMM_AVG) ? n : 0;
      x->gate = s > 0 ? GATE_SEND_PREV : 0;
      x->scratch = s < n - 2; /* partial sums: overwritten by the allgather */
    }
    for (int t = 0; t < n - 1; t++, x++) {
      int sb = mod(r + 1 - t, n), rb = mod(r - t, n);
      round_part(blk_len(cnt, n, sb), per, k, &a, &na);
      round_part(blk_len(cnt, n, rb), per, k, &b, &nb);
      x->src = recv + (blk_off(cnt, n, sb) + a) * es;
      x->sbytes = na * es;
      x->dst = recv + (blk_off(cnt, n, rb) + b) * es;
      x->rbytes = nb * es;
      x->gate = GATE_SEND_PREV;
    }
  }
  return run_ring(c, st, rounds * (size_t)per_round, op);
}

static newt_result_t ring_reduce_scatter(cpu_comm *c, const comm_opdesc *op) {
  int n = c->size, r = c->rank, per_round = n - 1;
  size_t es = newt_dtype_size(op->dt), per = round_elems(es), rc = op->count;
  size_t rounds = (rc + per - 1) / per;
  const uint8_t *send = op->send;
  uint8_t *scratch = NULL, *recv = op->recv;
  /* partial sums of a round; two, as a round's first receive may overlap the previous
   * round's last send */
  if (n > 2) NEWT_CHECK(cpu_scratch(c, 2 * per * es, (void **)&scratch));
  ring_step *st;
  NEWT_CHECK(alloc_steps(rounds, per_round, &st));
  for (size_t k = 0; k < rounds; k++) {
    size_t a, na;
    round_part(rc, per, k, &a, &na);
    uint8_t *part = scratch ? scratch + (k % 2) * per * es : NULL;
    for (int s = 0; s < n - 1; s++) {
      ring_step *x = st + k * (size_t)per_round + s;
      int sb = mod(r - s - 1, n), rb = mod(r - s - 2, n), last = s == n - 2;
      x->src = s == 0 ? send + ((size_t)sb * rc + a) * es : part;
      x->dst = last ? recv + a * es : part;
      x->own = send + ((size_t)rb * rc + a) * es;
      x->sbytes = x->rbytes = na * es;
      x->div = (last && op->op == COMM_AVG) ? n : 0;
      x->gate = (s > 0 ? GATE_SEND_PREV : 0) | ((s > 0 && !last) ? GATE_RECV_SEND : 0);
      x->scratch = !last;
    }
  }
  return run_ring(c, st, rounds * (size_t)per_round, op);
}

static newt_result_t ring_allgather(cpu_comm *c, const comm_opdesc *op) {
  int n = c->size, r = c->rank, per_round = n - 1;
  size_t es = newt_dtype_size(op->dt), per = round_elems(es), sc = op->count;
  size_t rounds = (sc + per - 1) / per;
  const uint8_t *send = op->send;
  uint8_t *recv = op->recv;
  if (send != recv + (size_t)r * sc * es) memcpy(recv + (size_t)r * sc * es, send, sc * es);
  ring_step *st;
  NEWT_CHECK(alloc_steps(rounds, per_round, &st));
  for (size_t k = 0; k < rounds; k++) {
    size_t a, na;
    round_part(sc, per, k, &a, &na);
    for (int t = 0; t < n - 1; t++) {
      ring_step *x = st + k * (size_t)per_round + t;
      int sb = mod(r - t, n), rb = mod(r - t - 1, n);
      x->src = t == 0 ? send + a * es : recv + ((size_t)sb * sc + a) * es;
      x->dst = recv + ((size_t)rb * sc + a) * es;
      x->sbytes = x->rbytes = na * es;
      x->gate = t > 0 ? GATE_SEND_PREV : 0;
    }
  }
  return run_ring(c, st, rounds * (size_t)per_round, op);
}

/* Recursive doubling on recv (already holding this rank's input); tmp holds a partner's. */
static newt_result_t rd_allreduce(cpu_comm *c, const comm_opdesc *op) {
  int n = c->size, r = c->rank;
  size_t bytes = op->count * newt_dtype_size(op->dt);
  uint8_t *recv = op->recv, *tmp;
  NEWT_CHECK(cpu_scratch(c, bytes, (void **)&tmp));
  if (op->send != recv) memcpy(recv, op->send, bytes);
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  int rem = n - p2, newr;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      NEWT_CHECK(p2p(c, r + 1, recv, NULL, bytes));
      newr = -1;
    } else {
      NEWT_CHECK(p2p(c, r - 1, NULL, tmp, bytes));
      comm_reduce(op->dt, op->op, recv, NULL, tmp, op->count, 0);
      newr = r / 2;
    }
  } else {
    newr = r - rem;
  }
  if (newr >= 0) {
    for (int mask = 1; mask < p2; mask <<= 1) {
      int pn = newr ^ mask;
      int partner = pn < rem ? pn * 2 + 1 : pn + rem;
      NEWT_CHECK(p2p(c, partner, recv, tmp, bytes));
      comm_reduce(op->dt, op->op, recv, NULL, tmp, op->count, 0);
    }
    if (op->op == COMM_AVG) comm_scale(op->dt, recv, recv, op->count, n);
  }
  if (r < 2 * rem) {
    if (r % 2) NEWT_CHECK(p2p(c, r - 1, recv, NULL, bytes));
    else NEWT_CHECK(p2p(c, r + 1, NULL, recv, bytes));
  }
  return NEWT_OK;
}

static newt_result_t bcast_tree(cpu_comm *c, const comm_opdesc *op, size_t bytes) {
  int n = c->size, root = op->peer, v = mod(c->rank - root, n);
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      NEWT_CHECK(p2p(c, mod(v - mask + root, n), NULL, op->recv, bytes));
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < n) NEWT_CHECK(p2p(c, mod(v + mask + root, n), op->recv, NULL, bytes));
  return NEWT_OK;
}

static newt_result_t bcast_chain(cpu_comm *c, const comm_opdesc *op, size_t bytes) {
  int n = c->size, r = c->rank, v = mod(r - op->peer, n);
  ring_step st = {.gate = GATE_SEND_SAME};
  if (v > 0) {
    st.dst = op->recv;
    st.rbytes = bytes;
  }
  if (v < n - 1) {
    st.src = op->recv;
    st.sbytes = bytes;
  }
  return run_steps(c, &st, 1, op, v > 0 ? &c->links[mod(r - 1, n)] : NULL,
                   v < n - 1 ? &c->links[mod(r + 1, n)] : NULL);
}

newt_result_t cpu_algo_run(cpu_comm *c, const comm_opdesc *op) {
  size_t es = newt_dtype_size(op->dt);
  size_t bytes = op->count * es;
  int n = c->size;
  if (op->kind != COMM_OP_BARRIER && op->count == 0) return NEWT_OK;
  switch (op->kind) {
    case COMM_OP_ALLREDUCE:
      if (n == 1) {
        comm_scale(op->dt, op->recv, op->send, op->count, op->op == COMM_AVG ? 1 : 1);
        return NEWT_OK;
      }
      return bytes <= (size_t)newt_param_CommSmallBytes() ? rd_allreduce(c, op) : ring_allreduce(c, op);
    case COMM_OP_REDUCE_SCATTER:
      if (n == 1) {
        comm_scale(op->dt, op->recv, op->send, op->count, 1);
        return NEWT_OK;
      }
      return ring_reduce_scatter(c, op);
    case COMM_OP_ALLGATHER:
      if (n == 1) {
        if (op->send != op->recv) memmove(op->recv, op->send, bytes);
        return NEWT_OK;
      }
      return ring_allgather(c, op);
    case COMM_OP_BROADCAST:
      if (c->rank == op->peer && op->send != op->recv) memmove(op->recv, op->send, bytes);
      if (n == 1) return NEWT_OK;
      return bytes <= (size_t)newt_param_CommSmallBytes() ? bcast_tree(c, op, bytes) : bcast_chain(c, op, bytes);
    case COMM_OP_SEND: return p2p(c, op->peer, op->send, NULL, bytes);
    case COMM_OP_RECV: return p2p(c, op->peer, NULL, op->recv, bytes);
    case COMM_OP_BARRIER: {
      if (n == 1) return NEWT_OK;
      uint8_t one = 1, out = 0;
      comm_opdesc b = {.kind = COMM_OP_ALLREDUCE, .send = &one, .recv = &out, .count = 1, .dt = NEWT_U8,
                       .op = COMM_MAX};
      return rd_allreduce(c, &b);
    }
  }
  return NEWT_ERR(NEWT_ERR_INTERNAL, "unknown operation %d", (int)op->kind);
}
