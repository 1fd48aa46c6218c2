/* The CPU backend's table of operations (comm_cpu_ops, see internal.h) and the CPU
 * communicator's life: the checks of its configuration, create, split, shrink, the
 * executor and the progress thread, abort and free.
 *
 * Files of the backend, each calling only those below it: this one on top; the builder
 * (cpu_build.c) and the algorithms (cpu_algo.c); the links, the control channel and the
 * wait loop (cpu_link.c); the handshake (cpu_auth.c) and sockets (cpu_net.c). All of
 * them record failures through core.c.
 *
 * Executor. Only one thread at a time runs operations on a communicator and reads its
 * control connections ("executing" under c->lock). A blocking call runs its operation in
 * the calling thread when nothing is queued (no hand-off, so a small allreduce costs a
 * few microseconds); otherwise it waits its turn. *_async calls queue a request that the
 * progress thread runs in issue order.
 *
 * Progress thread, when idle: sleeps in poll() on the eventfd, the listening socket (any
 * connection now is refused by the handshake, with a log line) and the control
 * connections: a peer that dies while we are idle fails the communicator without waiting
 * for the next operation, a peer's failure notice is adopted at once, a probe is answered
 * (an idle rank says it is in no operation). Once the communicator has failed it stops
 * listening and hands the listening socket to comm_shrink.
 *
 * Split: every member opens a listening socket on its host with a port the kernel picks;
 * the addresses go round with an allgather over the parent, then the child is built like
 * any communicator (its own connections, segments and progress thread). Shrink: aborts
 * the parent and builds the survivors' communicator on the parent's listening sockets,
 * with the new generation and secret. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/cpu.h"
#include "comm/reduce.h"
#include "common/log.h"
#include "common/strutil.h"

#define MAX_STRAYS 16

/* Wakes the progress thread (queue), and with `executor` the running operation too. */
static void wake(cpu_comm *c, int executor) {
  uint64_t one = 1;
  ssize_t w = write(c->pt_evfd, &one, sizeof one);
  if (executor) w = write(c->evfd, &one, sizeof one);
  (void)w;
}

uint64_t cpu_root_tag(const char *job) { return comm_hash(COMM_HASH_INIT, job, strlen(job)); }

uint64_t cpu_members_hash(int size, const char *const *addrs, const char *const *hosts) {
  uint64_t h = comm_hash(COMM_HASH_INIT, &size, sizeof size);
  for (int r = 0; r < size; r++) {
    h = comm_hash(h, addrs[r], strlen(addrs[r]) + 1);
    h = comm_hash(h, hosts[r], strlen(hosts[r]) + 1);
  }
  return h;
}

static void cpu_destroy(cpu_comm *c) {
  if (!c) return;
  cpu_links_close(c);
  if (c->evfd >= 0) close(c->evfd);
  if (c->pt_evfd >= 0) close(c->pt_evfd);
  for (int r = 0; r < c->size; r++) {
    if (c->addrs) free(c->addrs[r]);
    if (c->hosts) free(c->hosts[r]);
    if (c->root_addrs) free(c->root_addrs[r]);
    if (c->names) free(c->names[r]);
  }
  free(c->addrs);
  free(c->hosts);
  free(c->root_addrs);
  free(c->names);
  free(c->links);
  free(c->pfds);
  free(c->pfd_peer);
  free(c->scratch);
  pthread_mutex_destroy(&c->lock);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->ctrl_send_lock);
  free(c);
}

/* The parts every constructor shares; addrs and hosts are copied. roots[r] and
 * root_addrs[r] say who rank r is in the family's root (NULL: this is the root); they
 * become pub->root_ranks and the names used in messages. */
static newt_result_t cpu_alloc(struct comm *pub, int rank, int size, const char *const *addrs,
                               const char *const *hosts, const int *roots, const char *const *root_addrs,
                               const char *job, uint64_t generation, uint64_t tag,
                               const unsigned char *secret, size_t secret_len, int64_t timeout_ms,
                               int listen_fd, cpu_comm **out) {
  cpu_comm *c = calloc(1, sizeof *c);
  NEWT_CHECK_ALLOC(c);
  c->pub = pub;
  c->rank = rank;
  c->size = size;
  c->generation = generation;
  c->tag = tag;
  memcpy(c->secret, secret, secret_len);
  c->secret_len = secret_len;
  c->timeout_ms = timeout_ms;
  c->listen_fd = listen_fd;
  c->evfd = c->pt_evfd = -1;
  snprintf(c->job, sizeof c->job, "%s", job ? job : "job");
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->cv, NULL);
  pthread_mutex_init(&c->ctrl_send_lock, NULL);
  c->addrs = calloc((size_t)size, sizeof *c->addrs);
  c->hosts = calloc((size_t)size, sizeof *c->hosts);
  c->root_addrs = calloc((size_t)size, sizeof *c->root_addrs);
  c->names = calloc((size_t)size, sizeof *c->names);
  c->links = calloc((size_t)size, sizeof *c->links);
  c->pfds = calloc((size_t)size + 4, sizeof *c->pfds);
  c->pfd_peer = calloc((size_t)size + 4, sizeof *c->pfd_peer);
  free(pub->root_ranks);
  pub->root_ranks = calloc((size_t)size, sizeof *pub->root_ranks);
  if (!c->addrs || !c->hosts || !c->root_addrs || !c->names || !c->links || !c->pfds || !c->pfd_peer ||
      !pub->root_ranks) {
    c->listen_fd = -1;
    cpu_destroy(c);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a communicator of %d ranks", size);
  }
  for (int r = 0; r < size; r++) {
    c->addrs[r] = strdup(addrs[r]);
    c->hosts[r] = strdup(hosts[r]);
    c->root_addrs[r] = strdup(root_addrs ? root_addrs[r] : addrs[r]);
    pub->root_ranks[r] = roots ? roots[r] : r;
    c->names[r] = roots ? newt_asprintf("rank %d (world rank %d, %s)", r, roots[r], c->root_addrs[r] ? c->root_addrs[r] : "")
                        : newt_asprintf("rank %d (%s)", r, addrs[r]);
    c->links[r].peer = r;
    c->links[r].ctrl_fd = c->links[r].data_fd = -1;
    if (!c->addrs[r] || !c->hosts[r] || !c->root_addrs[r] || !c->names[r]) {
      c->listen_fd = -1;
      cpu_destroy(c);
      return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a communicator of %d ranks", size);
    }
  }
  for (int r = 0; r < size; r++) {
    c->links[r].local = r != rank && strcmp(hosts[r], hosts[rank]) == 0;
    c->nlocal += c->links[r].local;
    snprintf(c->links[r].addr, sizeof c->links[r].addr, "%s", addrs[r]);
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  c->crowded = cpus > 0 && c->nlocal + 1 > cpus;
  c->members = cpu_members_hash(size, (const char *const *)c->addrs, (const char *const *)c->hosts);
  c->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  c->pt_evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (c->evfd < 0 || c->pt_evfd < 0) {
    int e = errno;
    cpu_destroy(c);
    return NEWT_ERR(NEWT_ERR_SYS, "eventfd: %s", strerror(e));
  }
  *out = c;
  return NEWT_OK;
}

/* --- executor ----------------------------------------------------------------------- */

static newt_result_t exec_op(cpu_comm *c, const comm_opdesc *op) {
  if (atomic_load(&c->pub->failed)) return comm_failed_err(c->pub, comm_kind_name(op->kind));
  c->op_name = comm_kind_name(op->kind);
  c->op_seq++;
  newt_result_t res = cpu_algo_run(c, op);
  if (res == NEWT_OK) links_align(c);
  c->op_name = NULL;
  return res;
}

static void release_exec(cpu_comm *c) {
  pthread_mutex_lock(&c->lock);
  c->executing = 0;
  if (c->waiters) pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->lock);
}

static newt_result_t cpu_run(struct comm *pub, const comm_opdesc *op) {
  cpu_comm *c = pub->impl;
  pthread_mutex_lock(&c->lock);
  while ((c->executing || c->qhead) && !c->stop) {
    c->waiters++;
    pthread_cond_wait(&c->cv, &c->lock);
    c->waiters--;
  }
  if (c->stop) {
    pthread_mutex_unlock(&c->lock);
    return NEWT_ERR(NEWT_ERR_ABORTED, "%s: the communicator is being freed", comm_kind_name(op->kind));
  }
  c->executing = 1;
  pthread_mutex_unlock(&c->lock);
  newt_result_t res = exec_op(c, op);
  release_exec(c);
  return res;
}

static newt_result_t cpu_submit(struct comm *pub, struct comm_req *r) {
  cpu_comm *c = pub->impl;
  pthread_mutex_lock(&c->lock);
  if (c->stop) {
    pthread_mutex_unlock(&c->lock);
    return NEWT_ERR(NEWT_ERR_ABORTED, "%s: the communicator is being freed", comm_kind_name(r->op.kind));
  }
  r->next = NULL;
  if (c->qtail) c->qtail->next = r;
  else c->qhead = r;
  c->qtail = r;
  int idle = !c->executing;
  pthread_mutex_unlock(&c->lock);
  if (idle) wake(c, 0);
  return NEWT_OK;
}

static newt_result_t cpu_wait_req(struct comm_req *r) {
  while (!atomic_load_explicit(&r->done, memory_order_acquire)) comm_futex_wait(&r->done, 0, 100);
  return r->result;
}

/* --- progress thread ---------------------------------------------------------------- */

static int refuse_all(void *arg, int peer, int kind) {
  (void)arg;
  (void)peer;
  (void)kind;
  return 0;
}

static void strays_close(cpu_comm *c) {
  for (int i = 0; i < c->nstrays; i++) hs_close(&c->strays[i]);
  c->nstrays = 0;
}

static void serve_listener(cpu_comm *c, struct pollfd *pf, int np, int lst, int first_stray) {
  hs_ctx ctx = {.rank = c->rank, .size = c->size, .generation = c->generation, .tag = c->tag,
                .members = c->members, .secret = c->secret, .secret_len = c->secret_len,
                .want = refuse_all, .where = "communicator"};
  for (int i = first_stray; i < np && i - first_stray < c->nstrays; i++) {
    hs_conn *h = &c->strays[i - first_stray];
    if (pf[i].revents || newt_deadline_passed(h->deadline))
      if (hs_step(h, &ctx) == HS_FAILED || h->st == HS_DONE) hs_close(h);
  }
  int j = 0;
  for (int i = 0; i < c->nstrays; i++)
    if (c->strays[i].st != HS_IDLE) c->strays[j++] = c->strays[i];
  c->nstrays = j;
  if (lst < 0 || !pf[lst].revents) return;
  for (;;) {
    char remote[96];
    int fd = net_accept(c->listen_fd, remote, sizeof remote);
    if (fd < 0) return;
    int slot = hs_admit(c->strays, &c->nstrays, MAX_STRAYS, "communicator", c->rank);
    if (slot < 0) {
      hs_log_refusal(NEWT_LOG_WARN, "communicator", c->rank, c->generation, remote, "too many pending handshakes");
      close(fd);
      continue;
    }
    hs_conn *h = &c->strays[slot];
    hs_server_start(h, fd, remote, newt_deadline_in_ms(newt_param_CommHandshakeMs()));
    if (hs_step(h, &ctx) == HS_FAILED) {
      hs_close(h);
      c->nstrays--;
    }
  }
}

static void *progress_main(void *arg) {
  cpu_comm *c = arg;
  size_t cap = (size_t)c->size + MAX_STRAYS + 4;
  struct pollfd *pf = calloc(cap, sizeof *pf);
  int *peer = calloc(cap, sizeof *peer);
  hs_conn strays[MAX_STRAYS];
  c->strays = strays;
  pthread_mutex_lock(&c->lock);
  while (!c->stop && pf && peer) {
    if (c->qhead && !c->executing) {
      struct comm_req *r = c->qhead;
      c->qhead = r->next;
      if (!c->qhead) c->qtail = NULL;
      c->executing = 1;
      pthread_mutex_unlock(&c->lock);
      newt_result_t res = exec_op(c, &r->op);
      /* idle before the waiter wakes: a comm_free right after comm_wait must not find the
         communicator busy (it would abort it under peers still finishing the operation) */
      pthread_mutex_lock(&c->lock);
      c->executing = 0;
      if (c->waiters) pthread_cond_broadcast(&c->cv);
      pthread_mutex_unlock(&c->lock);
      comm_req_complete(r, res, res == NEWT_OK ? "" : newt_errmsg());
      pthread_mutex_lock(&c->lock);
      continue;
    }
    if (c->executing) {
      c->waiters++;
      pthread_cond_wait(&c->cv, &c->lock);
      c->waiters--;
      continue;
    }
    int healthy = !atomic_load(&c->pub->failed);
    if (!healthy && !c->listener_released) {
      strays_close(c);
      c->listener_released = 1;
      if (c->waiters) pthread_cond_broadcast(&c->cv);
    }
    int np = 0, lst = -1, first_stray, first_ctrl;
    pf[np++] = (struct pollfd){.fd = c->pt_evfd, .events = POLLIN};
    if (healthy && c->listen_fd >= 0 && !c->listener_released) {
      lst = np;
      pf[np++] = (struct pollfd){.fd = c->listen_fd, .events = POLLIN};
    }
    first_stray = np;
    for (int i = 0; i < c->nstrays; i++) pf[np++] = (struct pollfd){.fd = strays[i].fd, .events = hs_events(&strays[i])};
    first_ctrl = np;
    if (healthy)
      for (int r = 0; r < c->size; r++)
        if (r != c->rank && c->links[r].ctrl_fd >= 0 && !c->links[r].ctrl_eof) {
          peer[np] = r;
          pf[np++] = (struct pollfd){.fd = c->links[r].ctrl_fd, .events = POLLIN | POLLRDHUP};
        }
    pthread_mutex_unlock(&c->lock);
    int k = poll(pf, (nfds_t)np, c->nstrays ? 50 : 1000);
    pthread_mutex_lock(&c->lock);
    if (k < 0) continue;
    if (k == 0) {
      if (c->nstrays && !c->listener_released) serve_listener(c, pf, first_ctrl, lst, first_stray);
      continue;
    }
    if (pf[0].revents) {
      uint64_t v;
      ssize_t rd = read(c->pt_evfd, &v, sizeof v);
      (void)rd;
    }
    if (!c->listener_released) serve_listener(c, pf, first_ctrl, lst, first_stray);
    int ready = 0; /* a frame, or a hang-up */
    for (int i = first_ctrl; i < np; i++) ready |= pf[i].revents != 0;
    if (ready && !c->executing && !c->stop) {
      c->executing = c->draining = 1;
      pthread_mutex_unlock(&c->lock);
      for (int i = first_ctrl; i < np; i++)
        if (pf[i].revents) ctrl_drain(c, &c->links[peer[i]]);
      pthread_mutex_lock(&c->lock);
      c->executing = c->draining = 0;
      if (c->waiters) pthread_cond_broadcast(&c->cv);
    }
  }
  strays_close(c);
  c->strays = NULL;
  c->listener_released = 1;
  if (c->waiters) pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->lock);
  free(pf);
  free(peer);
  return NULL;
}

static newt_result_t start_thread(cpu_comm *c) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int e = pthread_create(&c->thread, NULL, progress_main, c);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (e != 0) return NEWT_ERR(NEWT_ERR_SYS, "starting the progress thread: %s", strerror(e));
  c->thread_started = 1;
  return NEWT_OK;
}

/* Builds c's links and starts its thread; destroys c on failure. */
static newt_result_t finish(struct comm *pub, cpu_comm *c, newt_deadline_t deadline) {
  newt_result_t res = cpu_build(c, deadline);
  if (res == NEWT_OK) res = start_thread(c);
  if (res != NEWT_OK) {
    cpu_destroy(c);
    return res;
  }
  pub->impl = c;
  NEWT_INFO(COMM, "rank %d of %d: communicator of generation %llu built (%d peers on this host)", c->rank,
            c->size, (unsigned long long)c->generation, c->nlocal);
  return NEWT_OK;
}

/* What only this backend reads of a configuration. */
static newt_result_t check_cpu_config(const comm_config *cfg) {
  if (!cfg->addrs || !cfg->hosts)
    return NEWT_ERR(NEWT_ERR_INVALID, "comm_config: addrs and hosts are required for every rank (the NCCL backend's "
                                      "control channel needs them too)");
  for (int r = 0; r < cfg->size; r++) {
    if (!cfg->addrs[r] || !cfg->addrs[r][0])
      return NEWT_ERR(NEWT_ERR_INVALID, "comm_config.addrs[%d] is missing", r);
    if (!cfg->hosts[r] || !cfg->hosts[r][0])
      return NEWT_ERR(NEWT_ERR_INVALID, "comm_config.hosts[%d] is missing", r);
    if (strlen(cfg->addrs[r]) > 90)
      return NEWT_ERR(NEWT_ERR_INVALID, "comm_config.addrs[%d] \"%.40s...\" is too long", r, cfg->addrs[r]);
    for (int q = 0; q < r; q++)
      if (strcmp(cfg->addrs[q], cfg->addrs[r]) == 0)
        return NEWT_ERR(NEWT_ERR_INVALID, "comm_config.addrs[%d] and addrs[%d] are both \"%s\"", q, r,
                        cfg->addrs[r]);
  }
  return NEWT_OK;
}

static newt_result_t check_secret(size_t len) {
  if (len < 16 || len > COMM_SECRET_MAX)
    return NEWT_ERR(NEWT_ERR_INVALID, "comm secret_len is %zu, expected 16 to %d bytes", len, COMM_SECRET_MAX);
  return NEWT_OK;
}

static newt_result_t cpu_create(const comm_config *cfg, struct comm *pub) {
  NEWT_CHECK(check_cpu_config(cfg));
  NEWT_CHECK(check_secret(cfg->secret_len));
  cpu_comm *c;
  pub->build_timeout_ms = cfg->build_timeout_ms > 0 ? cfg->build_timeout_ms : cfg->timeout_ms;
  newt_deadline_t deadline = newt_deadline_in_ms(pub->build_timeout_ms);
  const char *job = cfg->job ? cfg->job : "job";
  uint64_t tag = cpu_root_tag(job);
  int lfd = -1;
  /* the caller's listening socket: a duplicate (never closing the caller's), non-blocking
     like our own (the status flag is shared with the caller's descriptor) */
  if (cfg->listen_fd > 0 && ((lfd = fcntl(cfg->listen_fd, F_DUPFD_CLOEXEC, 3)) < 0 ||
                             fcntl(lfd, F_SETFL, fcntl(lfd, F_GETFL) | O_NONBLOCK) != 0)) {
    int e = errno;
    if (lfd >= 0) close(lfd);
    return NEWT_ERR(NEWT_ERR_SYS, "using the listening socket %d for %s: %s", cfg->listen_fd, cfg->addrs[cfg->rank],
                    strerror(e));
  }
  newt_result_t r = cpu_alloc(pub, cfg->rank, cfg->size, cfg->addrs, cfg->hosts, NULL, NULL, job, cfg->generation,
                              tag, cfg->secret, cfg->secret_len, cfg->timeout_ms, lfd, &c);
  if (r != NEWT_OK) {
    if (lfd >= 0) close(lfd);
    return r;
  }
  c->cancel = cfg->cancel;
  c->peers_listen = cfg->peers_listen;
  c->missing = cfg->missing;
  return finish(pub, c, deadline);
}

/* --- split -------------------------------------------------------------------------- */

/* The deadline of a build from c (split, shrink). */
static int64_t build_ms(const struct comm *c) { return c->build_timeout_ms > 0 ? c->build_timeout_ms : c->timeout_ms; }

#define SPLIT_REC 128

typedef struct split_member {
  int color, key, prank;
} split_member;

static int member_cmp(const void *a, const void *b) {
  const split_member *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->prank < y->prank ? -1 : (x->prank > y->prank);
}

static newt_result_t cpu_split(struct comm *parent, int color, int key, struct comm *child, int *member) {
  cpu_comm *pc = parent->impl;
  newt_result_t res = NEWT_OK;
  int lfd = -1, n = pc->size;
  char myaddr[96] = "";
  uint8_t *recs = NULL;
  split_member *m = NULL;
  char **addrs = NULL, **hosts = NULL, **root_addrs = NULL;
  int *roots = NULL;
  *member = 0;
  if (color >= 0) NEWT_CHECK(net_listen_ephemeral(pc->addrs[pc->rank], &lfd, myaddr, sizeof myaddr));
  recs = calloc((size_t)n, SPLIT_REC);
  m = calloc((size_t)n, sizeof *m);
  addrs = calloc((size_t)n, sizeof *addrs);
  hosts = calloc((size_t)n, sizeof *hosts);
  root_addrs = calloc((size_t)n, sizeof *root_addrs);
  roots = calloc((size_t)n, sizeof *roots);
  if (!recs || !m || !addrs || !hosts || !root_addrs || !roots) {
    res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory splitting a communicator of %d ranks", n);
    goto out;
  }
  uint8_t mine[SPLIT_REC] = {0};
  int32_t ck[2] = {color < 0 ? -1 : color, key};
  memcpy(mine, ck, sizeof ck);
  snprintf((char *)mine + 8, SPLIT_REC - 8, "%s", myaddr);
  comm_opdesc ag = {.kind = COMM_OP_ALLGATHER, .send = mine, .recv = recs, .count = SPLIT_REC, .dt = NEWT_U8};
  NEWT_CHECK_GOTO(cpu_run(parent, &ag), res, out);
  uint32_t seq = pc->split_seq++;
  if (color < 0) goto out;
  int k = 0;
  for (int r = 0; r < n; r++) {
    int32_t v[2];
    memcpy(v, recs + (size_t)r * SPLIT_REC, sizeof v);
    recs[(size_t)r * SPLIT_REC + SPLIT_REC - 1] = '\0';
    if (v[0] == color) m[k++] = (split_member){v[0], v[1], r};
  }
  qsort(m, (size_t)k, sizeof *m, member_cmp);
  int me = -1;
  for (int i = 0; i < k; i++) {
    addrs[i] = (char *)recs + (size_t)m[i].prank * SPLIT_REC + 8;
    hosts[i] = pc->hosts[m[i].prank];
    if (m[i].prank == pc->rank) me = i;
    /* a peer's record: its address must be one a rank could listen on (printable, as long as
       comm_config allows) before anyone connects to it */
    size_t alen = strlen(addrs[i]);
    int printable = 1;
    for (size_t j = 0; j < alen; j++) printable &= addrs[i][j] > 32 && addrs[i][j] < 127;
    if (alen == 0 || alen > 90 || !printable) {
      res = NEWT_ERR(NEWT_ERR_PEER, "split: %s sent %s address for the new communicator",
                     cpu_peer_name(pc, m[i].prank), alen == 0 ? "no" : "an unusable (too long or unprintable)");
      goto out;
    }
  }
  child->rank = me;
  child->size = k;
  for (int i = 0; i < k; i++) {
    roots[i] = parent->root_ranks[m[i].prank];
    root_addrs[i] = pc->root_addrs[m[i].prank];
  }
  uint64_t tag = comm_hash(pc->tag, &seq, sizeof seq);
  tag = comm_hash(tag, &color, sizeof color);
  cpu_comm *c;
  NEWT_CHECK_GOTO(cpu_alloc(child, me, k, (const char *const *)addrs, (const char *const *)hosts, roots,
                            (const char *const *)root_addrs, pc->job, pc->generation, tag, pc->secret,
                            pc->secret_len, pc->timeout_ms, lfd, &c),
                  res, out);
  lfd = -1; /* c owns it now */
  res = finish(child, c, newt_deadline_in_ms(build_ms(parent)));
  if (res == NEWT_OK) *member = 1;
out:
  if (lfd >= 0) close(lfd);
  free(recs);
  free(m);
  free(addrs);
  free(hosts);
  free(root_addrs);
  free(roots);
  return res;
}

/* --- shrink ------------------------------------------------------------------------- */

static newt_result_t cpu_shrink(struct comm *parent, const int *exclude, int nexclude, uint64_t generation,
                                const unsigned char *secret, size_t secret_len, struct comm *out) {
  if (!secret) return NEWT_ERR(NEWT_ERR_INVALID, "comm_shrink: the secret of the new generation is required");
  NEWT_CHECK(check_secret(secret_len));
  cpu_comm *pc = parent->impl;
  int n = pc->size;
  char *gone = calloc((size_t)n, 1);
  const char **addrs = calloc((size_t)n, sizeof *addrs);
  const char **hosts = calloc((size_t)n, sizeof *hosts);
  newt_result_t res = NEWT_OK;
  if (!gone || !addrs || !hosts) {
    res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory shrinking a communicator");
    goto out;
  }
  for (int i = 0; i < nexclude; i++) gone[exclude[i]] = 1;
  comm_fail(parent, NEWT_ERR_ABORTED, -1, 0, "aborted by comm_shrink (the survivors built generation %llu)",
            (unsigned long long)generation);
  /* take the parent's listening socket once its progress thread let go of it */
  newt_deadline_t d = newt_deadline_in_ms(5000);
  pthread_mutex_lock(&pc->lock);
  while (!pc->listener_released && pc->thread_started && !newt_deadline_passed(d)) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 10000000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pc->waiters++;
    pthread_cond_timedwait(&pc->cv, &pc->lock, &ts);
    pc->waiters--;
  }
  int lfd = pc->listener_released || !pc->thread_started ? pc->listen_fd : -1;
  if (lfd >= 0) pc->listen_fd = -1;
  pthread_mutex_unlock(&pc->lock);
  int k = 0, me = -1;
  uint64_t tag = comm_hash(pc->tag, "shrink", 6);
  tag = comm_hash(tag, &generation, sizeof generation);
  for (int r = 0; r < n; r++) {
    if (gone[r]) {
      tag = comm_hash(tag, &r, sizeof r);
      continue;
    }
    if (r == pc->rank) me = k;
    addrs[k] = pc->addrs[r];
    hosts[k] = pc->hosts[r];
    k++;
  }
  out->rank = me;
  out->size = k;
  cpu_comm *c;
  res = cpu_alloc(out, me, k, addrs, hosts, NULL, NULL, pc->job, generation, tag, secret, secret_len,
                  pc->timeout_ms, lfd, &c);
  if (res != NEWT_OK) {
    if (lfd >= 0) close(lfd);
    goto out;
  }
  res = finish(out, c, newt_deadline_in_ms(build_ms(parent)));
out:
  free(gone);
  free(addrs);
  free(hosts);
  return res;
}

/* --- failure, abort, free ------------------------------------------------------------ */

static void cpu_on_fail(struct comm *pub, newt_result_t code, int culprit_root, const char *cause, int notify) {
  cpu_comm *c = pub->impl;
  if (!c) return;
  if (notify) {
    if (code == NEWT_ERR_ABORTED) {
      char m[200];
      snprintf(m, sizeof m, "%s aborted its communicator", c->names[c->rank]);
      ctrl_notify_fail(c, NEWT_ERR_ABORTED, comm_to_root(pub, c->rank), m);
    } else {
      ctrl_notify_fail(c, code, culprit_root, cause);
    }
  }
  wake(c, 1);
}

static void cpu_free(struct comm *pub) {
  cpu_comm *c = pub->impl;
  if (!c) return;
  pthread_mutex_lock(&c->lock);
  c->stop = 1;
  /* an operation of the user's still queued or running; the progress thread reading a
     peer's goodbye is none (failing here would abort peers still finishing their last) */
  int busy = (c->executing && !c->draining) || c->qhead;
  pthread_mutex_unlock(&c->lock);
  if (busy) comm_fail(pub, NEWT_ERR_ABORTED, -1, 1, "communicator freed with operations pending");
  wake(c, 1);
  if (c->thread_started) pthread_join(c->thread, NULL);
  pthread_mutex_lock(&c->lock);
  while (c->executing) {
    c->waiters++;
    pthread_cond_wait(&c->cv, &c->lock);
    c->waiters--;
  }
  struct comm_req *q = c->qhead;
  c->qhead = c->qtail = NULL;
  pthread_mutex_unlock(&c->lock);
  while (q) {
    struct comm_req *next = q->next;
    comm_req_complete(q, NEWT_ERR_ABORTED, "the communicator was freed before the operation ran");
    q = next;
  }
  for (int r = 0; r < c->size; r++)
    if (r != c->rank) ctrl_send(c, &c->links[r], CTRL_BYE, 0, NULL, 0);
  pub->impl = NULL;
  cpu_destroy(c);
}

/* --- the control channel of another backend (internal.h) --------------------------------- */

void comm_cpu_set_probe_hook(struct comm *pub, void (*hook)(void *arg, uint64_t out[COMM_PROBE_VALUES]), void *arg) {
  cpu_comm *c = pub->impl;
  c->probe_hook = hook;
  c->probe_arg = arg;
  atomic_store_explicit(&c->probe_hook_set, 1, memory_order_release);
}

uint32_t comm_cpu_probe(struct comm *pub) {
  cpu_comm *c = pub->impl;
  uint32_t seq = (atomic_fetch_add(&c->ext_probe_seq, 1) + 1) | CTRL_EXT_PROBE;
  for (int r = 0; r < c->size; r++)
    if (r != c->rank) ctrl_send(c, &c->links[r], CTRL_PING, seq, NULL, 0);
  return seq; /* the answers come to the progress thread (or the executor) */
}

int comm_cpu_probe_answer(struct comm *pub, int peer, uint32_t seq, uint64_t out[COMM_PROBE_VALUES]) {
  cpu_comm *c = pub->impl;
  cpu_link *l = &c->links[peer];
  if (atomic_load_explicit(&l->ext_seq, memory_order_acquire) == seq) {
    for (int i = 0; i < COMM_PROBE_VALUES; i++) out[i] = atomic_load(&l->ext_val[i]);
    return 1;
  }
  return l->gone || l->ctrl_eof || l->ctrl_fd < 0 ? -1 : 0;
}

const char *comm_cpu_peer_name(struct comm *pub, int peer) { return cpu_peer_name(pub->impl, peer); }

/* --- the table --------------------------------------------------------------------- */

static newt_result_t cpu_check_reduce(newt_dtype dt, const char *what) {
  if (!comm_reduce_supported(dt))
    return NEWT_ERR(NEWT_ERR_UNSUPPORTED, "%s: the CPU backend does not reduce %s (f32, bf16, i32, i64, u8 only)",
                    what, newt_dtype_name(dt));
  return NEWT_OK;
}

const comm_backend_ops comm_cpu_ops = {
    .create = cpu_create,
    .split = cpu_split,
    .shrink = cpu_shrink,
    .run = cpu_run,
    .submit = cpu_submit,
    .wait_req = cpu_wait_req,
    .check_reduce = cpu_check_reduce,
    .on_fail = cpu_on_fail,
    .free = cpu_free,
};
