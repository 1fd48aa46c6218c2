/* The handshake keeps everything but the ranks of this generation out, during
 * comm_create and while operations run, without disturbing the communicator:
 *
 *  - a HELLO of the previous generation: refused before any proof;
 *  - the right generation with a wrong secret: refused at the proof (and the client sees
 *    that the server's proof does not match its secret either);
 *  - a proof replayed from an earlier connection: refused (fresh server nonce);
 *  - garbage bytes, and a client that connects and says nothing: refused (bad magic /
 *    handshake deadline), while the real ranks connect meanwhile;
 *  - a real stale worker (comm_create of generation g-1 claiming rank 1): its build fails
 *    with a message naming the generation, and rank 0 never accepts it;
 *  - after the build, even a correct proof claiming an existing rank is refused.
 * The ranks' allreduces stay correct throughout, and rank 0's log has a line for each
 * refusal saying why. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "comm/comm.h"
#include "comm/cpu.h"
#include "comm_test.h"
#include "common/fs.h"
#include "common/log.h"
#include "test.h"

static char logdir[256];

/* --- a raw client speaking the wire protocol of cpu_auth.c ------------------------------- */

static int raw_connect(const char *addr) {
  struct sockaddr_storage ss;
  socklen_t len;
  if (net_resolve(addr, &ss, &len) != NEWT_OK) return -1;
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&ss, len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static uint32_t le32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

typedef struct raw_claim {
  uint64_t generation;
  const unsigned char *secret;
  int src, dst;
  const uint8_t *proof; /* NULL: compute it from `secret` */
} raw_claim;

/* Runs one handshake; returns the server's status (0 accepted, the refusal code from the
 * challenge or the result), -1 when the server closed. nonce_out gets the server nonce,
 * proof_out the proof we sent, server_ok whether the server proved `secret`. */
static int raw_handshake(const ct_world *w, const char *addr, const raw_claim *cl, uint8_t nonce_out[32],
                         uint8_t proof_out[32], int *server_ok) {
  int fd = raw_connect(addr);
  if (fd < 0) return -2;
  uint8_t hello[HS_HELLO_LEN], nonce_c[32], chal[HS_CHAL_LEN], proof[32], res[8];
  newt_random_bytes(nonce_c, sizeof nonce_c);
  hs_encode_hello(hello, cl->generation, cpu_root_tag(w->job), cpu_members_hash(w->size, w->addrs, w->hosts),
                  cl->src, cl->dst, w->size, HS_KIND_CTRL, nonce_c);
  int status = -1;
  if (send(fd, hello, sizeof hello, MSG_NOSIGNAL) != (ssize_t)sizeof hello || ct_read_full(fd, chal, sizeof chal) != 0)
    goto out;
  status = (int)le32(chal + 8);
  if (status != 0) goto out;
  if (nonce_out) memcpy(nonce_out, chal + 24, 32);
  uint8_t expect[32];
  hs_mac(cl->secret, 32, "newt-server", hello, chal + 24, expect);
  if (server_ok) *server_ok = memcmp(expect, chal + 56, 32) == 0;
  if (cl->proof) memcpy(proof, cl->proof, 32);
  else hs_mac(cl->secret, 32, "newt-client", hello, chal + 24, proof);
  if (proof_out) memcpy(proof_out, proof, 32);
  status = -1;
  if (send(fd, proof, sizeof proof, MSG_NOSIGNAL) != (ssize_t)sizeof proof || ct_read_full(fd, res, sizeof res) != 0)
    goto out;
  status = (int)le32(res);
out:
  close(fd);
  return status;
}

/* 1 when the server closed a connection that sent `bytes` (garbage) or nothing. */
static int raw_closed_after(const char *addr, const void *bytes, size_t n, int64_t within_ms) {
  int fd = raw_connect(addr);
  if (fd < 0) return 0;
  if (n) send(fd, bytes, n, MSG_NOSIGNAL);
  struct timeval tv = {(time_t)(within_ms / 1000), (suseconds_t)(within_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char b[256];
  ssize_t r = recv(fd, b, sizeof b, 0);
  close(fd);
  return r == 0 || (r < 0 && errno == ECONNRESET);
}

/* --- the ranks ------------------------------------------------------------------------ */

static int auth_rank(ct_world *w, int rank, void *arg) {
  (void)arg;
  if (ct_log_to(logdir, rank) != 0) return 1;
  comm_config cfg;
  ct_config(w, rank, &cfg);
  comm_t *c = NULL;
  newt_result_t r = comm_create(&cfg, &c);
  CHECKR(r == NEWT_OK, "comm_create: %s", newt_errmsg());
  if (!c) return 1;
  atomic_fetch_add(&w->sh->ready, 1);
  /* operations while rogues knock */
  int it = 0;
  for (;;) {
    /* stop together: the flag goes round with a max-allreduce */
    int32_t stop = atomic_load(&w->sh->go) && it >= 20, any = 0;
    r = comm_allreduce(c, &stop, &any, 1, NEWT_I32, COMM_MAX);
    CHECKR(r == NEWT_OK, "stop flag: %s", newt_errmsg());
    if (r != NEWT_OK || any) break;
    float x[1000], y[1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)(rank + i);
    r = comm_allreduce(c, x, y, 1000, NEWT_F32, COMM_SUM);
    CHECKR(r == NEWT_OK, "allreduce %d: %s", it, newt_errmsg());
    if (r != NEWT_OK) break;
    for (int i = 0; i < 1000; i++) CHECKR(y[i] == (float)(1 + 2 * i), "allreduce %d: [%d] = %g", it, i, y[i]);
    it++;
  }
  comm_status st;
  comm_get_status(c, &st);
  CHECKR(st.code == NEWT_OK, "status: %s", st.msg);
  CHECKR(comm_barrier(c) == NEWT_OK, "barrier: %s", newt_errmsg());
  comm_free(c);
  fprintf(stderr, "rank %d: %d allreduces\n", rank, it);
  return ct_failures;
}

/* A worker of the previous generation claiming rank 1. */
static int stale_rank(ct_world *w, int rank, void *arg) {
  (void)arg;
  comm_config cfg;
  ct_config(w, 1, &cfg);
  cfg.generation = w->generation - 1;
  cfg.timeout_ms = 1500;
  comm_t *c = NULL;
  newt_result_t r = comm_create(&cfg, &c);
  CHECKR(r != NEWT_OK, "a stale worker was accepted");
  CHECKR(strstr(newt_errmsg(), "generation") != NULL, "the stale worker's error does not say why: %s", newt_errmsg());
  comm_free(c);
  return ct_failures;
}

static int wait_listening(const char *addr) {
  for (int i = 0; i < 5000; i++) {
    int fd = raw_connect(addr);
    if (fd >= 0) {
      close(fd);
      return 1;
    }
    newt_sleep_ms(2);
  }
  return 0;
}

static void knock_all(ct_world *w, const char *addr, int dst, int during_ops) {
  unsigned char wrong[32];
  memcpy(wrong, w->secret, 32);
  wrong[5] ^= 0x10;
  int src = dst == 0 ? 1 : 0;
  raw_claim stale = {.generation = w->generation - 1, .secret = w->secret, .src = src, .dst = dst};
  T_CHECK_MSG(raw_handshake(w, addr, &stale, NULL, NULL, NULL) == 2, "previous generation not refused at hello");
  raw_claim bad = {.generation = w->generation, .secret = wrong, .src = src, .dst = dst};
  int server_ok = 1;
  T_CHECK_MSG(raw_handshake(w, addr, &bad, NULL, NULL, &server_ok) == 5, "wrong secret not refused at the proof");
  T_CHECK_MSG(!server_ok, "the server's proof matched a wrong secret");
  /* replay: a valid proof for nonce 1, sent on a second connection */
  if (!during_ops) {
    int fd = raw_connect(addr);
    uint8_t hello[HS_HELLO_LEN], nonce_c[32] = {1}, chal[HS_CHAL_LEN], proof1[32];
    hs_encode_hello(hello, w->generation, cpu_root_tag(w->job), cpu_members_hash(w->size, w->addrs, w->hosts), src,
                    dst, w->size, HS_KIND_CTRL, nonce_c);
    T_CHECK(send(fd, hello, sizeof hello, MSG_NOSIGNAL) == (ssize_t)sizeof hello && ct_read_full(fd, chal, sizeof chal) == 0);
    hs_mac(w->secret, 32, "newt-client", hello, chal + 24, proof1);
    close(fd); /* never sent: it would be accepted */
    raw_claim replay = {.generation = w->generation, .secret = w->secret, .src = src, .dst = dst, .proof = proof1};
    T_CHECK_MSG(raw_handshake(w, addr, &replay, NULL, NULL, NULL) == 5, "a replayed proof was not refused");
  } else {
    raw_claim dup = {.generation = w->generation, .secret = w->secret, .src = src, .dst = dst};
    T_CHECK_MSG(raw_handshake(w, addr, &dup, NULL, NULL, NULL) == 6, "a correct proof for an existing link was not refused");
  }
  char junk[200];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (char)(i * 37 + 11);
  T_CHECK_MSG(raw_closed_after(addr, junk, sizeof junk, 3000), "garbage was not refused");
}

static int log_has(int rank, const char *needle) {
  char path[300], *text = NULL;
  size_t len;
  snprintf(path, sizeof path, "%s/rank%d.log", logdir, rank);
  if (newt_fs_read_all(path, 1 << 22, &text, &len) != NEWT_OK) return 0;
  int found = strstr(text, needle) != NULL;
  free(text);
  return found;
}

static void test_rogues(void) {
  ct_world w;
  ct_world_init(&w, 2, CT_SHM, "auth");
  snprintf(logdir, sizeof logdir, "/tmp/newt-test-auth-%d", (int)getpid());
  newt_fs_mkdirs(logdir, 0700);
  setenv("NEWT_COMM_HANDSHAKE_MS", "800", 1);
  w.timeout_ms = 30000;
  /* rank 0 alone first */
  ct_world only0 = w;
  only0.size = 2;
  ct_spawn_one(&only0, 0, auth_rank, NULL);
  T_CHECK(wait_listening(w.addrs[0]));
  /* during the build: rogues, a silent client, a real stale worker */
  int silent = raw_connect(w.addrs[0]);
  knock_all(&w, w.addrs[0], 0, 0);
  ct_world stale = w;
  ct_spawn_one(&stale, 1, stale_rank, NULL);
  T_CHECK_MSG(ct_wait(&stale, 20000, NULL) == 0, "the stale worker's check failed");
  char b;
  struct timeval tv = {5, 0};
  setsockopt(silent, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  T_CHECK_MSG(recv(silent, &b, 1, 0) == 0, "a silent client was not dropped");
  close(silent);
  /* now the real rank 1 */
  w.pids[0] = only0.pids[0];
  ct_spawn_one(&w, 1, auth_rank, NULL);
  newt_deadline_t d = newt_deadline_in_ms(30000);
  while (atomic_load(&w.sh->ready) < 2 && !newt_deadline_passed(d)) newt_sleep_ms(2);
  T_CHECK_MSG(atomic_load(&w.sh->ready) == 2, "the real ranks did not build their communicator");
  /* while operations run */
  for (int k = 0; k < 2; k++) knock_all(&w, w.addrs[k], k, 1);
  atomic_store(&w.sh->go, 1);
  T_CHECK(ct_wait(&w, 30000, NULL) == 0);
  const char *reasons[] = {"generation 6, this communicator is generation 7 (a stale worker", "proof is wrong",
                           "bad magic", "handshake not completed in time", "not expected now"};
  for (size_t i = 0; i < sizeof reasons / sizeof *reasons; i++)
    T_CHECK_MSG(log_has(0, reasons[i]), "rank 0's log has no refusal line with \"%s\"", reasons[i]);
  T_CHECK_MSG(log_has(1, "proof is wrong") && log_has(1, "not expected now"), "rank 1's log lacks refusal lines");
  if (t_cur_failed) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cat %s/rank0.log %s/rank1.log >&2", logdir, logdir);
    if (system(cmd) != 0) fprintf(stderr, "(no logs)\n");
  }
  newt_fs_rm_rf(logdir);
  ct_world_free(&w);
}


/* A flood of silent connections (issue 17, item 12): 100 clients connect to rank 0's data
 * port and say nothing while the generation is built. The ranks of the plan, which speak at
 * once, still get in (a silent client's slot goes to them), so the build takes no handshake
 * deadline (3 s) longer; and the log says a few lines, not one per refusal. */
static void test_flood(void) {
  ct_world w;
  ct_world_init(&w, 2, CT_SHM, "flood");
  snprintf(logdir, sizeof logdir, "/tmp/newt-test-flood-%d", (int)getpid());
  newt_fs_mkdirs(logdir, 0700);
  setenv("NEWT_COMM_HANDSHAKE_MS", "3000", 1);
  setenv("NEWT_DEBUG", "INFO", 1);
  w.timeout_ms = 30000;
  ct_world only0 = w;
  ct_spawn_one(&only0, 0, auth_rank, NULL);
  T_CHECK(wait_listening(w.addrs[0]));
  enum { NSILENT = 100 };
  int silent[NSILENT];
  for (int i = 0; i < NSILENT; i++) silent[i] = raw_connect(w.addrs[0]);
  newt_sleep_ms(2 * HS_SILENT_MS); /* they are silent, and have been for a while */
  uint64_t t0 = newt_now_ns();
  w.pids[0] = only0.pids[0];
  ct_spawn_one(&w, 1, auth_rank, NULL);
  newt_deadline_t d = newt_deadline_in_ms(30000);
  while (atomic_load(&w.sh->ready) < 2 && !newt_deadline_passed(d)) newt_sleep_ms(2);
  double took = (double)(newt_now_ns() - t0) / 1e6;
  T_CHECK_MSG(atomic_load(&w.sh->ready) == 2, "the ranks did not build their communicator");
  T_CHECK_MSG(took < 2000, "the build took %.0f ms behind 100 silent connections (a handshake deadline is 3000)", took);
  atomic_store(&w.sh->go, 1);
  T_CHECK(ct_wait(&w, 30000, NULL) == 0);
  for (int i = 0; i < NSILENT; i++)
    if (silent[i] >= 0) close(silent[i]);
  char path[300], *text = NULL;
  size_t len;
  int lines = 0;
  snprintf(path, sizeof path, "%s/rank0.log", logdir);
  if (newt_fs_read_all(path, 1 << 22, &text, &len) == NEWT_OK)
    for (const char *p = text; (p = strstr(p, "refused a connection")) != NULL; p++) lines++;
  free(text);
  T_CHECK_MSG(lines >= 1 && lines <= 12, "rank 0 logged %d refusals for %d silent clients", lines, NSILENT);
  unsetenv("NEWT_DEBUG");
  newt_fs_rm_rf(logdir);
  ct_world_free(&w);
}

/* The link probe (comm_time_links): a communicator's listener, busy with allreduces, reads a
 * probe's bytes whole and answers it; nothing listening, no answer; a probe that announces
 * more than COMM_LINK_PROBE_MAX is closed unanswered; none of it is logged as a refusal, and
 * the ranks' operations go on untouched. */
static void test_link_probe(void) {
  ct_world w;
  ct_world_init(&w, 2, CT_TCP, "linkprobe");
  snprintf(logdir, sizeof logdir, "/tmp/newt-test-linkprobe-%d", (int)getpid());
  newt_fs_mkdirs(logdir, 0700);
  w.timeout_ms = 30000;
  ct_spawn(&w, auth_rank, NULL);
  newt_deadline_t d = newt_deadline_in_ms(30000);
  while (atomic_load(&w.sh->ready) < 2 && !newt_deadline_passed(d)) newt_sleep_ms(2);
  T_CHECK_MSG(atomic_load(&w.sh->ready) == 2, "the ranks did not build their communicator");
  /* a port nothing listens on: one bound and closed */
  ct_world gone;
  ct_world_init(&gone, 1, CT_TCP, "gone");
  close(gone.lfd[0]);
  gone.lfd[0] = -1;
  const char *addrs[4] = {w.addrs[0], w.addrs[1], gone.addrs[0], ""};
  double ms[4];
  for (int round = 0; round < 3; round++) {
    T_OK(comm_time_links(addrs, 4, 1u << 20, 10000, ms));
    T_CHECK_MSG(ms[0] >= 0 && ms[1] >= 0, "round %d: 1 MiB to the ranks: %.1f and %.1f ms", round, ms[0], ms[1]);
    T_CHECK_MSG(ms[2] < 0 && ms[3] < 0, "round %d: nothing listens, yet %.1f ms; no address, %.1f ms", round, ms[2],
                ms[3]);
  }
  T_CHECK(comm_time_links(addrs, 1, COMM_LINK_PROBE_MAX + 1u, 1000, ms) == NEWT_ERR_INVALID);
  /* a header announcing too much: closed without an answer */
  int fd = raw_connect(w.addrs[0]);
  uint8_t head[HS_HELLO_LEN] = {0};
  memcpy(head, HS_PROBE_MAGIC, 8);
  le_put32(head + 8, HS_PROBE_VERSION);
  le_put32(head + 12, COMM_LINK_PROBE_MAX + 1u);
  T_CHECK(fd >= 0 && send(fd, head, sizeof head, MSG_NOSIGNAL) == (ssize_t)sizeof head);
  if (fd >= 0) {
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b[8];
    ssize_t r = recv(fd, b, sizeof b, 0);
    T_CHECK_MSG(r == 0 || (r < 0 && errno == ECONNRESET), "a probe of too many bytes: recv %zd", r);
    close(fd);
  }
  atomic_store(&w.sh->go, 1);
  T_CHECK(ct_wait(&w, 30000, NULL) == 0);
  for (int r = 0; r < 2; r++) {
    char path[300], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/rank%d.log", logdir, r);
    T_OK(newt_fs_read_all(path, 1 << 22, &text, &len));
    T_CHECK_MSG(text && !strstr(text, "refused a connection"), "rank %d logged a probe as a refusal:\n%s", r,
                text ? text : "");
    free(text);
  }
  newt_fs_rm_rf(logdir);
  ct_world_free(&gone);
  ct_world_free(&w);
}

int main(void) {
  T_RUN(test_rogues);
  T_RUN(test_flood);
  T_RUN(test_link_probe);
  return T_DONE();
}
