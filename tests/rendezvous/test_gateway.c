/* Integration tests of the host's transaction gateway (rendezvous/gateway.h) against a real
 * etcd: a transaction through the gateway gives what it gives directly (a guarded put, a
 * failed compare whose failure ops read kvs, a delete, binary values); an error keeps its
 * code and message; 16 clients at once cost etcd one merged transaction; no gateway, or one
 * stopped, is *unreached = 1, and one that took the request and then failed is *unreached = 0;
 * hostile frames from a raw socket (cut short, not JSON, not base64, too many ops, a huge
 * length, random bytes) leave the server serving.
 *
 * One watch per host: three subscribers to a shared key get its value at once and each
 * newest one after, through one etcd watch (the gateway's count, and etcd's own gauge of
 * watchers); deletes are not sent; a key not shared is NEWT_ERR_NOTFOUND, no gateway
 * NEWT_ERR_UNAVAILABLE, etcd paused a refusal the next subscription gets past; the gateway
 * stopping, or a fake one sending what it must not, ends each subscription with one
 * fn(NULL); a subscriber that never reads (its socket full of large values) holds up
 * neither another subscriber nor stop. */
#include <curl/curl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/json.h"
#include "common/strutil.h"
#include "rdzv_test.h"
#include "rendezvous/batch.h"
#include "rendezvous/gateway.h"

static rdzv_etcd_server *srv;
static rdzv_etcd *cli;
static char dir[512];

static newt_deadline_t dl(int64_t ms) { return newt_deadline_in_ms(ms); }

static void sock_path(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

/* The address of a socket at path (the test's paths fit). */
static struct sockaddr_un unix_addr(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t n = strlen(path);
  if (n >= sizeof sa.sun_path) n = sizeof sa.sun_path - 1;
  memcpy(sa.sun_path, path, n);
  return sa;
}

/* A batch (expect, linger_ms) on cli served at dir/name, and a client of it. */
typedef struct gw_fixture {
  rdzv_batch *b;
  rdzv_gateway *g;
  rdzv_gateway_client *c;
  char path[600];
} gw_fixture;

static int fixture_start(gw_fixture *f, const char *name, int expect, int64_t linger_ms) {
  memset(f, 0, sizeof *f);
  sock_path(f->path, sizeof f->path, name);
  rdzv_batch_opts o = {.expect = expect, .linger_ms = linger_ms};
  if (rdzv_batch_new(cli, &o, &f->b) != NEWT_OK || rdzv_gateway_start(f->b, f->path, &f->g) != NEWT_OK ||
      rdzv_gateway_client_new(f->path, &f->c) != NEWT_OK) {
    T_FAIL("gateway fixture %s: %s", name, newt_errmsg());
    return -1;
  }
  return 0;
}

static void fixture_stop(gw_fixture *f) {
  rdzv_gateway_client_free(f->c);
  rdzv_gateway_stop(f->g);
  rdzv_batch_free(f->b);
}

/* --- the same result as direct ------------------------------------------------------------- */

/* a and b name keys under different roots (da, db): the same once the root is cut off. */
static int same_key(const rdzv_etcd_kv *a, const char *da, const rdzv_etcd_kv *b, const char *db) {
  size_t na = strlen(da), nb = strlen(db);
  return a->key_len >= na && b->key_len >= nb && a->key_len - na == b->key_len - nb &&
         memcmp(a->key + na, b->key + nb, a->key_len - na) == 0;
}

/* Results of the same transaction on two roots: equal but for revisions, which are checked
 * against each result's own revision (kvs written by it carry it). */
static void check_same(const rdzv_etcd_txn_result *a, const char *da, const rdzv_etcd_txn_result *b, const char *db) {
  T_CHECK(a->succeeded == b->succeeded);
  T_CHECK(a->n == b->n);
  T_CHECK(b->revision > 0);
  for (size_t i = 0; i < a->n && i < b->n; i++) {
    const rdzv_etcd_op_result *x = &a->results[i], *y = &b->results[i];
    T_CHECK(x->type == y->type);
    T_CHECK(x->deleted == y->deleted);
    T_CHECK(x->range.n == y->range.n && x->range.count == y->range.count && x->range.more == y->range.more);
    for (size_t k = 0; k < x->range.n && k < y->range.n; k++) {
      const rdzv_etcd_kv *p = &x->range.kvs[k], *q = &y->range.kvs[k];
      T_CHECK(same_key(p, da, q, db));
      T_CHECK(p->value_len == q->value_len && memcmp(p->value, q->value, p->value_len) == 0);
      T_CHECK(p->version == q->version && p->lease == q->lease);
      T_CHECK(q->create_revision > 0 && q->mod_revision >= q->create_revision && q->mod_revision <= b->revision);
    }
  }
}

/* One transaction, its keys under a root: built twice, once per root. */
typedef struct txn_spec {
  rdzv_etcd_cmp cmp[2];
  size_t ncmp;
  rdzv_etcd_op ok[2], fail[2];
  size_t nok, nfail;
  char k0[128], k1[128];
} txn_spec;

typedef void (*txn_build_fn)(txn_spec *t);

static const char bin[] = {'a', 0, 'b', (char)0xff, '\n'};

/* A guarded put (of a binary value) whose failure op reads the key: succeeds the first time,
 * its compare fails the second. */
static void build_register(txn_spec *t) {
  t->cmp[0] = (rdzv_etcd_cmp){.key = t->k0, .target = RDZV_CMP_CREATE, .result = RDZV_CMP_EQUAL};
  t->ok[0] = (rdzv_etcd_op){.type = RDZV_OP_PUT, .key = t->k0, .value = bin, .value_len = sizeof bin};
  t->fail[0] = (rdzv_etcd_op){.type = RDZV_OP_RANGE, .key = t->k0};
  t->ncmp = t->nok = t->nfail = 1;
}

static void build_second(txn_spec *t) {
  t->ok[0] = (rdzv_etcd_op){.type = RDZV_OP_PUT, .key = t->k1, .value = "one", .value_len = 3};
  t->nok = 1;
}

/* A compare on a value that fails: the failure ops read the whole prefix and one key. */
static void build_failed_value(txn_spec *t) {
  t->cmp[0] = (rdzv_etcd_cmp){.key = t->k1, .target = RDZV_CMP_VALUE, .result = RDZV_CMP_EQUAL, .value = "two",
                              .value_len = 3};
  t->ok[0] = (rdzv_etcd_op){.type = RDZV_OP_DELETE, .key = t->k1};
  t->fail[0] = (rdzv_etcd_op){.type = RDZV_OP_RANGE, .key = t->k0, .range_end = t->k1};
  t->fail[1] = (rdzv_etcd_op){.type = RDZV_OP_RANGE, .key = t->k1};
  t->ncmp = t->nok = 1;
  t->nfail = 2;
}

/* The same compare holding: its success op deletes. */
static void build_delete(txn_spec *t) {
  t->cmp[0] = (rdzv_etcd_cmp){.key = t->k1, .target = RDZV_CMP_VERSION, .result = RDZV_CMP_EQUAL, .number = 1};
  t->ok[0] = (rdzv_etcd_op){.type = RDZV_OP_DELETE, .key = t->k1};
  t->ok[1] = (rdzv_etcd_op){.type = RDZV_OP_RANGE, .key = t->k0, .prefix = 1};
  t->ncmp = 1;
  t->nok = 2;
}

/* The transaction on root da straight to etcd and on db through the gateway, compared. */
static void run_both(rdzv_gateway_client *c, txn_build_fn build, const char *da, const char *db, int succeeded,
                     size_t n, size_t kvs) {
  txn_spec ta, tb;
  memset(&ta, 0, sizeof ta);
  memset(&tb, 0, sizeof tb);
  snprintf(ta.k0, sizeof ta.k0, "%s/reg/w0", da);
  snprintf(ta.k1, sizeof ta.k1, "%s/reg/w1", da);
  snprintf(tb.k0, sizeof tb.k0, "%s/reg/w0", db);
  snprintf(tb.k1, sizeof tb.k1, "%s/reg/w1", db);
  build(&ta);
  build(&tb);
  rdzv_etcd_txn_result a, b;
  int unreached = -1;
  T_OK(rdzv_etcd_txn(cli, ta.cmp, ta.ncmp, ta.ok, ta.nok, ta.fail, ta.nfail, dl(10000), &a));
  T_OK(rdzv_gateway_txn(c, tb.cmp, tb.ncmp, tb.ok, tb.nok, tb.fail, tb.nfail, dl(10000), &b, &unreached));
  T_CHECK(unreached == 0);
  check_same(&a, da, &b, db);
  size_t got = 0;
  for (size_t i = 0; i < b.n; i++) got += b.results[i].range.n;
  T_CHECK_MSG(b.succeeded == succeeded && b.n == n && got == kvs, "succeeded %d, %zu results, %zu kvs", b.succeeded,
              b.n, got);
  rdzv_etcd_txn_result_free(&a);
  rdzv_etcd_txn_result_free(&b);
}

static void test_same_as_direct(void) {
  gw_fixture f;
  if (fixture_start(&f, "same.sock", 1, 0)) return;
  const char *da = "/gw/direct", *db = "/gw/via";
  static const struct {
    txn_build_fn build;
    int succeeded;
    size_t n, kvs; /* results, and kvs read in all */
  } cases[] = {
      {build_register, 1, 1, 0},     {build_register, 0, 1, 1}, {build_second, 1, 1, 0},
      {build_failed_value, 0, 2, 2}, {build_delete, 1, 2, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) 
    run_both(f.c, cases[i].build, da, db, cases[i].succeeded, cases[i].n, cases[i].kvs);

  /* what the cases left, read back through a failed compare: the binary value, whole */
  txn_spec t;
  memset(&t, 0, sizeof t);
  snprintf(t.k0, sizeof t.k0, "%s/reg/w0", db);
  build_register(&t);
  rdzv_etcd_txn_result res;
  int unreached = -1;
  T_OK(rdzv_gateway_txn(f.c, t.cmp, 1, t.ok, 1, t.fail, 1, dl(10000), &res, &unreached));
  T_CHECK(!res.succeeded && res.n == 1 && res.results[0].type == RDZV_OP_RANGE && res.results[0].range.n == 1);
  if (res.n == 1 && res.results[0].range.n == 1) {
    const rdzv_etcd_kv *kv = &res.results[0].range.kvs[0];
    T_CHECK(kv->value_len == sizeof bin && memcmp(kv->value, bin, sizeof bin) == 0);
    T_CHECK(strcmp(kv->key, t.k0) == 0 && kv->version == 1);
  }
  rdzv_etcd_txn_result_free(&res);

  /* out NULL is allowed, as for rdzv_etcd_txn */
  rdzv_etcd_op put = {.type = RDZV_OP_PUT, .key = "/gw/via/null-out", .value = "x", .value_len = 1};
  T_OK(rdzv_gateway_txn(f.c, NULL, 0, &put, 1, NULL, 0, dl(10000), NULL, &unreached));
  T_CHECK(unreached == 0);
  rdzv_etcd_kv kv;
  T_OK(rdzv_etcd_get(cli, "/gw/via/null-out", dl(5000), &kv, NULL));
  T_CHECK(kv.value_len == 1 && kv.value[0] == 'x');
  rdzv_etcd_kv_free(&kv);

  struct stat st;
  T_CHECK(stat(f.path, &st) == 0 && S_ISSOCK(st.st_mode) && (st.st_mode & 0777) == 0600);
  fixture_stop(&f);
  T_CHECK(stat(f.path, &st) != 0); /* removed */
}

/* --- an error keeps its code and message --------------------------------------------------- */

static void test_error_code(void) {
  gw_fixture f;
  if (fixture_start(&f, "err.sock", 1, 0)) return;
  rdzv_etcd_op put = {.type = RDZV_OP_PUT, .key = "/gw/err/k", .value = "v", .value_len = 1, .lease = 0x7e57deadbeef};
  rdzv_etcd_txn_result res;
  T_ERR(NEWT_ERR_NOTFOUND, rdzv_etcd_txn(cli, NULL, 0, &put, 1, NULL, 0, dl(10000), &res));
  char batch_msg[1024];
  T_ERR(NEWT_ERR_NOTFOUND, rdzv_batch_txn(f.b, NULL, 0, &put, 1, NULL, 0, dl(10000), &res));
  snprintf(batch_msg, sizeof batch_msg, "%s", newt_errmsg());
  int unreached = -1;
  T_ERR(NEWT_ERR_NOTFOUND, rdzv_gateway_txn(f.c, NULL, 0, &put, 1, NULL, 0, dl(10000), &res, &unreached));
  T_CHECK(unreached == 0);
  T_CHECK_MSG(strcmp(newt_errmsg(), batch_msg) == 0, "gateway: \"%s\", batch: \"%s\"", newt_errmsg(), batch_msg);
  T_CHECK(res.n == 0 && res.results == NULL);
  /* the connection goes on after an error answer */
  rdzv_etcd_op ok = {.type = RDZV_OP_PUT, .key = "/gw/err/k", .value = "v", .value_len = 1};
  T_OK(rdzv_gateway_txn(f.c, NULL, 0, &ok, 1, NULL, 0, dl(10000), NULL, &unreached));
  /* a bad argument: refused before anything is sent */
  rdzv_etcd_op nokey = {.type = RDZV_OP_PUT};
  T_ERR(NEWT_ERR_INVALID, rdzv_gateway_txn(f.c, NULL, 0, &nokey, 1, NULL, 0, dl(10000), NULL, &unreached));
  T_CHECK(unreached == 1);
  fixture_stop(&f);
}

/* --- many clients at once: one merged transaction ------------------------------------------ */

#define N_CONC 16

typedef struct conc_arg {
  const char *path;
  int i;
  int64_t lease;
  newt_result_t r;
  int unreached;
  rdzv_etcd_txn_result res;
  char msg[256];
} conc_arg;

static void *conc_main(void *p) {
  conc_arg *a = p;
  rdzv_gateway_client *c;
  a->r = rdzv_gateway_client_new(a->path, &c);
  if (a->r != NEWT_OK) return NULL;
  char key[64], val[32];
  snprintf(key, sizeof key, "/gw/conc/w%02d", a->i);
  snprintf(val, sizeof val, "worker %d", a->i);
  rdzv_etcd_cmp cmp = {.key = key, .target = RDZV_CMP_CREATE, .result = RDZV_CMP_EQUAL};
  rdzv_etcd_op put = {.type = RDZV_OP_PUT, .key = key, .value = val, .value_len = strlen(val), .lease = a->lease};
  rdzv_etcd_op get = {.type = RDZV_OP_RANGE, .key = key};
  a->r = rdzv_gateway_txn(c, &cmp, 1, &put, 1, &get, 1, dl(90000), &a->res, &a->unreached);
  snprintf(a->msg, sizeof a->msg, "%s", newt_errmsg());
  rdzv_gateway_client_free(c);
  return NULL;
}

static void test_concurrent(void) {
  gw_fixture f;
  /* the first waits (60 s at most) until all 16 are queued: one transaction, whatever the timing */
  if (fixture_start(&f, "conc.sock", N_CONC, 60000)) return;
  int64_t lease = 0;
  T_OK(rdzv_etcd_lease_grant(cli, 60, 0, dl(5000), &lease, NULL));
  conc_arg args[N_CONC];
  pthread_t th[N_CONC];
  for (int i = 0; i < N_CONC; i++) {
    args[i] = (conc_arg){.path = f.path, .i = i, .lease = lease};
    pthread_create(&th[i], NULL, conc_main, &args[i]);
  }
  int64_t rev = -1;
  for (int i = 0; i < N_CONC; i++) {
    pthread_join(th[i], NULL);
    T_CHECK_MSG(args[i].r == NEWT_OK, "client %d: %s: %s", i, newt_result_name(args[i].r), args[i].msg);
    T_CHECK(args[i].res.succeeded && args[i].res.n == 1 && args[i].res.results[0].type == RDZV_OP_PUT);
    if (rev < 0) rev = args[i].res.revision;
    T_CHECK(args[i].res.revision == rev); /* one transaction: one revision */
    rdzv_etcd_txn_result_free(&args[i].res);
  }
  int64_t posted = 0, sent = 0;
  rdzv_batch_counts(f.b, &posted, &sent);
  T_CHECK_MSG(posted == N_CONC && sent == 1, "posted %lld, sent %lld", (long long)posted, (long long)sent);
  rdzv_etcd_kvs kvs;
  T_OK(rdzv_etcd_range(cli, "/gw/conc/", &(rdzv_etcd_range_opts){.prefix = 1}, dl(5000), &kvs));
  T_CHECK(kvs.n == N_CONC);
  for (size_t i = 0; i < kvs.n; i++) T_CHECK(kvs.kvs[i].lease == lease);
  rdzv_etcd_kvs_free(&kvs);
  T_OK(rdzv_etcd_lease_revoke(cli, lease, dl(5000)));
  fixture_stop(&f);
}

/* --- no gateway, a gateway gone, a gateway that fails -------------------------------------- */

static rdzv_etcd_op probe_put = {.type = RDZV_OP_PUT, .key = "/gw/probe", .value = "p", .value_len = 1};

static void test_unreached(void) {
  char path[600];
  rdzv_gateway_client *c;
  int unreached = -1;
  /* no socket there: at once, though the deadline is an hour away */
  sock_path(path, sizeof path, "none.sock");
  T_OK(rdzv_gateway_client_new(path, &c));
  T_ERR(NEWT_ERR_UNAVAILABLE, rdzv_gateway_txn(c, NULL, 0, &probe_put, 1, NULL, 0, dl(3600000), NULL, &unreached));
  T_CHECK(unreached == 1);
  T_CHECK(strstr(newt_errmsg(), path) != NULL);
  rdzv_gateway_client_free(c);
  /* a file that is no socket */
  sock_path(path, sizeof path, "plain-file");
  FILE *fp = fopen(path, "w");
  if (fp) fclose(fp);
  T_OK(rdzv_gateway_client_new(path, &c));
  unreached = -1;
  T_ERR(NEWT_ERR_UNAVAILABLE, rdzv_gateway_txn(c, NULL, 0, &probe_put, 1, NULL, 0, dl(3600000), NULL, &unreached));
  T_CHECK(unreached == 1);
  rdzv_gateway_client_free(c);
  /* the server refuses to replace it */
  rdzv_batch *b;
  rdzv_gateway *g;
  T_OK(rdzv_batch_new(cli, NULL, &b));
  T_ERR(NEWT_ERR_INVALID, rdzv_gateway_start(b, path, &g));
  /* paths too long for a unix socket */
  char longp[300];
  memset(longp, 'x', sizeof longp - 1);
  longp[0] = '/';
  longp[sizeof longp - 1] = '\0';
  T_ERR(NEWT_ERR_INVALID, rdzv_gateway_start(b, longp, &g));
  T_CHECK(strstr(newt_errmsg(), "bytes") != NULL);
  T_ERR(NEWT_ERR_INVALID, rdzv_gateway_client_new(longp, &c));
  rdzv_batch_free(b);

  /* a gateway stopped between two calls: the next is unreached; started again, it serves */
  gw_fixture f;
  if (fixture_start(&f, "stop.sock", 1, 0)) return;
  T_OK(rdzv_gateway_txn(f.c, NULL, 0, &probe_put, 1, NULL, 0, dl(10000), NULL, &unreached));
  rdzv_gateway_stop(f.g);
  unreached = -1;
  T_ERR(NEWT_ERR_UNAVAILABLE, rdzv_gateway_txn(f.c, NULL, 0, &probe_put, 1, NULL, 0, dl(3600000), NULL, &unreached));
  T_CHECK(unreached == 1);
  T_OK(rdzv_gateway_start(f.b, f.path, &f.g));
  T_OK(rdzv_gateway_txn(f.c, NULL, 0, &probe_put, 1, NULL, 0, dl(10000), NULL, &unreached));
  T_CHECK(unreached == 0);
  /* stopped and started again while the client kept its connection: it sends again on a new one */
  rdzv_gateway_stop(f.g);
  T_OK(rdzv_gateway_start(f.b, f.path, &f.g));
  T_OK(rdzv_gateway_txn(f.c, NULL, 0, &probe_put, 1, NULL, 0, dl(10000), NULL, &unreached));
  /* an old socket left at the path (its server gone without removing it) is replaced */
  rdzv_gateway_stop(f.g);
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = unix_addr(f.path);
  T_CHECK(bind(s, (struct sockaddr *)&sa, sizeof sa) == 0);
  close(s);
  T_OK(rdzv_gateway_start(f.b, f.path, &f.g));
  T_OK(rdzv_gateway_txn(f.c, NULL, 0, &probe_put, 1, NULL, 0, dl(10000), NULL, &unreached));
  fixture_stop(&f);
}

/* A fake gateway: listens at path and does `mode` with the first request. */
enum { FAKE_CLOSE, FAKE_SILENT, FAKE_GARBAGE, FAKE_BAD_CODE };

typedef struct fake_srv {
  int lfd, mode;
} fake_srv;

static int read_full(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n) {
    ssize_t m = read(fd, p, n);
    if (m <= 0) return -1;
    p += m;
    n -= (size_t)m;
  }
  return 0;
}

static void write_frame(int fd, const void *body, uint32_t n, uint32_t claimed) {
  unsigned char hdr[4] = {claimed >> 24, claimed >> 16, claimed >> 8, claimed};
  if (send(fd, hdr, 4, MSG_NOSIGNAL) != 4) return;
  if (n) (void)!send(fd, body, n, MSG_NOSIGNAL);
}

static void *fake_main(void *p) {
  fake_srv *s = p;
  int fd = accept(s->lfd, NULL, NULL);
  if (fd < 0) return NULL;
  unsigned char hdr[4];
  if (read_full(fd, hdr, 4) == 0) {
    uint32_t n = (uint32_t)hdr[0] << 24 | hdr[1] << 16 | hdr[2] << 8 | hdr[3];
    char *body = malloc(n ? n : 1);
    if (body && read_full(fd, body, n) == 0) {
      if (s->mode == FAKE_SILENT) newt_sleep_ms(1500);
      if (s->mode == FAKE_GARBAGE) write_frame(fd, "{\"responses\":7}", 15, 15);
      if (s->mode == FAKE_BAD_CODE) write_frame(fd, "{\"code\":999,\"message\":\"x\"}", 27, 27);
    }
    free(body);
  }
  close(fd);
  return NULL;
}

static int fake_listen(const char *path) {
  unlink(path);
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = unix_addr(path);
  if (s < 0 || bind(s, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(s, 4) != 0) return -1;
  return s;
}

static void fake_case(int mode, int64_t deadline_ms, newt_result_t want) {
  char path[600];
  sock_path(path, sizeof path, "fake.sock");
  fake_srv s = {.lfd = fake_listen(path), .mode = mode};
  T_CHECK(s.lfd >= 0);
  pthread_t th;
  pthread_create(&th, NULL, fake_main, &s);
  rdzv_gateway_client *c;
  T_OK(rdzv_gateway_client_new(path, &c));
  int unreached = -1;
  rdzv_etcd_txn_result res;
  T_ERR(want, rdzv_gateway_txn(c, NULL, 0, &probe_put, 1, NULL, 0, dl(deadline_ms), &res, &unreached));
  T_CHECK_MSG(unreached == 0, "mode %d: unreached %d", mode, unreached);
  pthread_join(th, NULL);
  close(s.lfd);
  unlink(path);
  rdzv_gateway_client_free(c);
}

static void test_client_faults(void) {
  /* took the request and closed: may or may not have been applied */
  fake_case(FAKE_CLOSE, 10000, NEWT_ERR_UNAVAILABLE);
  T_CHECK(strstr(newt_errmsg(), "may or may not") != NULL);
  /* took it and said nothing by the deadline */
  fake_case(FAKE_SILENT, 300, NEWT_ERR_TIMEOUT);
  /* answered something that is no answer */
  fake_case(FAKE_GARBAGE, 10000, NEWT_ERR_CORRUPT);
  fake_case(FAKE_BAD_CODE, 10000, NEWT_ERR_CORRUPT);
}

/* --- hostile frames ------------------------------------------------------------------------- */

static int raw_connect(const char *path) {
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = unix_addr(path);
  if (s >= 0 && connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(s);
    return -1;
  }
  struct timeval tv = {.tv_sec = 10};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return s;
}

/* Sends a frame (claimed length, then n bytes) and reads what comes back: the error answer's
 * code (its message into msg), or 0 when the server closed without one. Either way the
 * server must have closed the connection afterwards. */
static int64_t hostile(const char *path, const void *body, uint32_t n, uint32_t claimed, char *msg, size_t cap) {
  int fd = raw_connect(path);
  if (fd < 0) return -1;
  write_frame(fd, body, n, claimed);
  if (n < claimed) shutdown(fd, SHUT_WR); /* cut short */
  int64_t code = 0;
  unsigned char hdr[4];
  if (msg) msg[0] = '\0';
  if (read_full(fd, hdr, 4) == 0) {
    uint32_t m = (uint32_t)hdr[0] << 24 | hdr[1] << 16 | hdr[2] << 8 | hdr[3];
    char *a = m < (1u << 20) ? calloc(1, m + 1) : NULL;
    cJSON *j = NULL;
    if (a && read_full(fd, a, m) == 0 && newt_json_parse(a, m, "answer", &j) == NEWT_OK) {
      const char *s = NULL;
      newt_json_get_int(j, "answer", "code", 1, &code);
      if (msg && newt_json_get_str(j, "answer", "message", 0, &s) == NEWT_OK && s) snprintf(msg, cap, "%s", s);
      cJSON_Delete(j);
    }
    free(a);
  }
  char c;
  T_CHECK_MSG(read(fd, &c, 1) == 0, "the server kept the connection open after a bad frame");
  close(fd);
  return code;
}

static int64_t hostile_text(const char *path, const char *text, char *msg, size_t cap) {
  return hostile(path, text, (uint32_t)strlen(text), (uint32_t)strlen(text), msg, cap);
}

static void test_hostile_frames(void) {
  gw_fixture f;
  if (fixture_start(&f, "hostile.sock", 1, 0)) return;
  char msg[512];
  /* a huge length: refused, naming the bound */
  T_CHECK(hostile(f.path, NULL, 0, 0xffffffffu, msg, sizeof msg) == NEWT_ERR_INVALID);
  T_CHECK_MSG(strstr(msg, "4194304") && strstr(msg, "4 MiB"), "%s", msg);
  T_CHECK(hostile(f.path, NULL, 0, (4u << 20) + 1, NULL, 0) == NEWT_ERR_INVALID);
  T_CHECK(hostile(f.path, NULL, 0, 0, NULL, 0) == NEWT_ERR_INVALID);
  /* cut short: closed without an answer */
  T_CHECK(hostile(f.path, "{\"timeout_ms\":", 14, 100, NULL, 0) == 0);
  T_CHECK(hostile(f.path, NULL, 0, 5000, NULL, 0) == 0);
  /* a header cut short */
  int fd = raw_connect(f.path);
  if (fd >= 0) {
    T_CHECK(write(fd, "\0\0", 2) == 2);
    shutdown(fd, SHUT_WR);
    char c;
    T_CHECK(read(fd, &c, 1) == 0);
    close(fd);
  }
  /* not JSON, not an object, bad fields */
  static const struct {
    const char *text, *names;
  } bad[] = {
      {"{not json", "malformed JSON"},
      {"[1,2,3]", "request"},
      {"{}", "timeout_ms"},
      {"{\"timeout_ms\":\"soon\"}", "timeout_ms"},
      {"{\"timeout_ms\":100,\"compare\":\"x\"}", "compare"},
      {"{\"timeout_ms\":100,\"success\":[{\"type\":\"put\",\"key\":\"!!notbase64!!\"}]}", "request.success[0].key: not base64"},
      {"{\"timeout_ms\":100,\"success\":[{\"type\":\"put\",\"key\":\"YQBi\"}]}", "NUL"},
      {"{\"timeout_ms\":100,\"success\":[{\"type\":\"put\"}]}", "request.success[0].key: missing"},
      {"{\"timeout_ms\":100,\"success\":[{\"type\":\"explode\",\"key\":\"YQ==\"}]}", "explode"},
      {"{\"timeout_ms\":100,\"success\":[{\"type\":\"range\",\"key\":\"YQ==\",\"range_end\":7}]}", "range_end"},
      {"{\"timeout_ms\":100,\"failure\":[{\"type\":\"put\",\"key\":\"YQ==\",\"value\":\"@@@\"}]}", "value"},
      {"{\"timeout_ms\":100,\"compare\":[{\"key\":\"YQ==\",\"target\":\"mod\",\"result\":\"sideways\"}]}", "sideways"},
      {"{\"timeout_ms\":100,\"compare\":[{\"key\":\"YQ==\",\"target\":\"value\",\"result\":\"equal\",\"value\":1}]}", "value"},
      {"{\"timeout_ms\":100,\"compare\":[7]}", "compare[0]"},
      {"{\"timeout_ms\":100,\"success\":[null]}", "success[0]"},
      {"{\"timeout_ms\":100,\"watch\":\"!!notbase64!!\"}", "request.watch: not base64"},
      {"{\"timeout_ms\":100,\"watch\":7}", "request.watch"},
      {"{\"timeout_ms\":100,\"watch\":\"YQBi\"}", "NUL"},
      {"{\"watch\":\"YQ==\"}", "timeout_ms"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int64_t code = hostile_text(f.path, bad[i].text, msg, sizeof msg);
    T_CHECK_MSG(code == NEWT_ERR_INVALID, "%s: code %lld (%s)", bad[i].text, (long long)code, msg);
    T_CHECK_MSG(strstr(msg, bad[i].names) != NULL, "%s: \"%s\" does not name %s", bad[i].text, msg, bad[i].names);
  }
  /* too many ops */
  newt_buf b;
  newt_buf_init(&b);
  newt_buf_printf(&b, "{\"timeout_ms\":100,\"compare\":[");
  for (int i = 0; i < 1025; i++)
    newt_buf_printf(&b, "%s{\"key\":\"YQ==\",\"target\":\"version\",\"result\":\"equal\"}", i ? "," : "");
  newt_buf_printf(&b, "]}");
  T_CHECK(hostile_text(f.path, b.data, msg, sizeof msg) == NEWT_ERR_INVALID);
  T_CHECK_MSG(strstr(msg, "1024"), "%s", msg);
  /* nesting deeper than any parser's stack */
  newt_buf_reset(&b);
  for (int i = 0; i < 100000; i++) newt_buf_append(&b, "[", 1);
  T_CHECK(hostile_text(f.path, b.data, NULL, 0) == NEWT_ERR_INVALID);
  newt_buf_free(&b);
  /* random frames (a fixed seed) */
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int k = 0; k < 200; k++) {
    char junk[300];
    uint32_t n = 1 + (uint32_t)(k * 7 % (sizeof junk - 1));
    for (uint32_t i = 0; i < n; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      junk[i] = (char)(k % 2 ? x : " {}[]\":,0123456789abcdefnulltruefalse"[x % 38]);
    }
    int64_t code = hostile(f.path, junk, n, n, NULL, 0);
    T_CHECK_MSG(code == NEWT_ERR_INVALID || code == 0, "random frame %d: code %lld", k, (long long)code);
  }
  /* a client that connects and leaves, many times */
  for (int k = 0; k < 50; k++) {
    int s = raw_connect(f.path);
    if (s >= 0) close(s);
  }
  /* the server still serves a good client */
  int unreached = -1;
  T_OK(rdzv_gateway_txn(f.c, NULL, 0, &probe_put, 1, NULL, 0, dl(10000), NULL, &unreached));
  T_CHECK(unreached == 0);
  /* a connection idle in the middle of a frame does not hold up stop */
  int idle = raw_connect(f.path);
  if (idle >= 0) write_frame(idle, "{", 1, 50);
  fixture_stop(&f);
  if (idle >= 0) close(idle);
}

/* --- one watch per host ------------------------------------------------------------------ */

/* What a subscriber got: its newest value, how many, and its ends. */
typedef struct sub {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* on CLOCK_MONOTONIC */
  const char *key;
  int64_t mod_rev, create_rev, version; /* of the newest value; mod_rev 0: none yet */
  char value[64];                       /* its first bytes */
  size_t value_len;
  char last;                            /* its last byte */
  int values, ended;
  int bad; /* a value of another key, an empty one (a delete sent) or one older than the one before */
} sub;

static void sub_init(sub *s, const char *key) {
  memset(s, 0, sizeof *s);
  s->key = key;
  pthread_mutex_init(&s->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
}

static void sub_destroy(sub *s) {
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
}

static void on_value(void *ud, const rdzv_etcd_kv *kv) {
  sub *s = ud;
  pthread_mutex_lock(&s->mu);
  if (!kv) {
    s->ended++;
  } else {
    if (strcmp(kv->key, s->key) != 0 || kv->value_len == 0 || kv->mod_revision < s->mod_rev) s->bad++;
    s->mod_rev = kv->mod_revision;
    s->create_rev = kv->create_revision;
    s->version = kv->version;
    s->value_len = kv->value_len;
    size_t n = kv->value_len < sizeof s->value - 1 ? kv->value_len : sizeof s->value - 1;
    memcpy(s->value, kv->value, n);
    s->value[n] = '\0';
    s->last = kv->value_len ? kv->value[kv->value_len - 1] : 0;
    s->values++;
  }
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* Waits until s got a value of revision rev or later (rev 0: until it ended); 60 s is only
 * the failure bound. 1 when it did. */
static int sub_wait(sub *s, int64_t rev) {
  newt_deadline_t d = dl(60000);
  pthread_mutex_lock(&s->mu);
  int ok;
  while (!(ok = rev ? s->mod_rev >= rev : s->ended > 0) && !newt_deadline_passed(d)) {
    struct timespec ts = {(time_t)(d / 1000000000ull), (long)(d % 1000000000ull)};
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
  }
  pthread_mutex_unlock(&s->mu);
  return ok;
}

/* s's newest value is `value` (a string) at revision rev, version version. */
static void sub_check(sub *s, const char *value, int64_t rev, int64_t version) {
  pthread_mutex_lock(&s->mu);
  T_CHECK_MSG(s->mod_rev == rev && s->version == version && s->value_len == strlen(value) &&
                  strcmp(s->value, value) == 0 && s->bad == 0 && s->ended == 0,
              "%s: \"%s\" at %lld version %lld (bad %d, ended %d), expected \"%s\" at %lld version %lld", s->key,
              s->value, (long long)s->mod_rev, (long long)s->version, s->bad, s->ended, value, (long long)rev,
              (long long)version);
  pthread_mutex_unlock(&s->mu);
}

static int sub_get(sub *s, const int *field) {
  pthread_mutex_lock(&s->mu);
  int v = *field;
  pthread_mutex_unlock(&s->mu);
  return v;
}

static size_t on_body(char *p, size_t size, size_t n, void *ud) {
  return newt_buf_append(ud, p, size * n) == NEWT_OK ? size * n : 0;
}

/* etcd's own gauge of the watchers it serves (its Prometheus metrics); -1 when it has none. */
static int64_t etcd_watchers(void) {
  static const char name[] = "\netcd_debugging_mvcc_watcher_total ";
  char url[512];
  snprintf(url, sizeof url, "%s/metrics", rdzv_etcd_server_url(srv));
  newt_buf body;
  newt_buf_init(&body);
  CURL *c = curl_easy_init();
  if (!c) return -1;
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
  int64_t n = -1;
  if (curl_easy_perform(c) == CURLE_OK && newt_buf_append(&body, "", 1) == NEWT_OK) {
    const char *at = strstr(body.data, name);
    if (at) n = strtoll(at + sizeof name - 1, NULL, 10);
  }
  curl_easy_cleanup(c);
  newt_buf_free(&body);
  return n;
}

static int64_t put_str(const char *key, const char *value) {
  int64_t rev = 0;
  T_OK(rdzv_etcd_put(cli, key, value, strlen(value), 0, dl(10000), &rev));
  return rev;
}

#define N_SUBS 3

static void test_watch_shared(void) {
  gw_fixture f;
  if (fixture_start(&f, "watch.sock", 1, 0)) return;
  const char *key = "/gw/watch/plan";
  T_OK(rdzv_gateway_share(f.g, cli, key));
  T_OK(rdzv_gateway_share(f.g, cli, key)); /* again: the same share */
  int64_t r0 = put_str(key, "plan 0");
  int64_t before = etcd_watchers();
  sub s[N_SUBS];
  rdzv_gateway_watch *w[N_SUBS] = {NULL};
  for (int i = 0; i < N_SUBS; i++) {
    sub_init(&s[i], key);
    T_OK(rdzv_gateway_watch_start(f.path, key, on_value, &s[i], dl(10000), &w[i]));
  }
  /* the value there is, at once */
  for (int i = 0; i < N_SUBS; i++) {
    T_CHECK(sub_wait(&s[i], r0));
    sub_check(&s[i], "plan 0", r0, 1);
    T_CHECK(s[i].create_rev == r0);
  }
  int64_t subs = -1, watches = -1;
  rdzv_gateway_share_counts(f.g, &subs, &watches);
  T_CHECK_MSG(subs == N_SUBS && watches == 1, "%lld subscriptions, %lld watches", (long long)subs,
              (long long)watches);
  /* etcd's own count: one watcher for the three (each started before its watch_start returned) */
  int64_t after = etcd_watchers();
  if (before < 0 || after < 0) fprintf(stderr, "  etcd has no etcd_debugging_mvcc_watcher_total: not checked\n");
  else T_CHECK_MSG(after == before + 1, "etcd's watchers: %lld before, %lld after", (long long)before,
                   (long long)after);
  fprintf(stderr, "  etcd's watchers: %lld before %d subscriptions, %lld after\n", (long long)before, N_SUBS,
          (long long)after);

  /* each put's value */
  int64_t r1 = put_str(key, "plan 1");
  for (int i = 0; i < N_SUBS; i++) {
    T_CHECK(sub_wait(&s[i], r1));
    sub_check(&s[i], "plan 1", r1, 2);
  }
  int64_t r2 = put_str(key, "plan two");
  for (int i = 0; i < N_SUBS; i++) {
    T_CHECK(sub_wait(&s[i], r2));
    sub_check(&s[i], "plan two", r2, 3);
  }
  /* a delete is not sent; the put after it is (sub_check: no empty value came) */
  T_OK(rdzv_etcd_delete(cli, key, 0, dl(10000), NULL, NULL));
  int64_t r3 = put_str(key, "plan 3");
  for (int i = 0; i < N_SUBS; i++) {
    T_CHECK(sub_wait(&s[i], r3));
    sub_check(&s[i], "plan 3", r3, 1);
    T_CHECK(s[i].create_rev == r3);
  }

  /* a second key, with no value yet: nothing comes until its first put */
  const char *key2 = "/gw/watch/empty";
  sub e;
  sub_init(&e, key2);
  rdzv_gateway_watch *we = NULL;
  T_OK(rdzv_gateway_share(f.g, cli, key2));
  T_OK(rdzv_gateway_watch_start(f.path, key2, on_value, &e, dl(10000), &we));
  int64_t r4 = put_str(key2, "first");
  T_CHECK(sub_wait(&e, r4));
  sub_check(&e, "first", r4, 1);
  T_CHECK(sub_get(&e, &e.values) == 1);
  rdzv_gateway_share_counts(f.g, &subs, &watches);
  T_CHECK_MSG(subs == N_SUBS + 1 && watches == 2, "%lld subscriptions, %lld watches", (long long)subs,
              (long long)watches);
  /* a fifth key is refused (four at most) */
  T_OK(rdzv_gateway_share(f.g, cli, "/gw/watch/k3"));
  T_OK(rdzv_gateway_share(f.g, cli, "/gw/watch/k4"));
  T_ERR(NEWT_ERR_INVALID, rdzv_gateway_share(f.g, cli, "/gw/watch/k5"));

  /* free is the caller's own end: no fn(NULL) */
  rdzv_gateway_watch_free(we);
  T_CHECK(sub_get(&e, &e.ended) == 0);
  sub_destroy(&e);
  for (int i = 0; i < N_SUBS; i++) {
    rdzv_gateway_watch_free(w[i]);
    T_CHECK(sub_get(&s[i], &s[i].ended) == 0);
    sub_destroy(&s[i]);
  }
  rdzv_gateway_watch_free(NULL);
  fixture_stop(&f);
}

static void test_watch_refused(void) {
  const char *key = "/gw/watch/shared", *other = "/gw/watch/other";
  sub s;
  sub_init(&s, key);
  rdzv_gateway_watch *w = NULL;
  /* no gateway: at once, though the deadline is an hour away */
  char path[600];
  sock_path(path, sizeof path, "none.sock");
  double t0 = newt_now_s();
  T_ERR(NEWT_ERR_UNAVAILABLE, rdzv_gateway_watch_start(path, key, on_value, &s, dl(3600000), &w));
  T_CHECK(newt_now_s() - t0 < 5 && w == NULL);

  gw_fixture f;
  if (fixture_start(&f, "refuse.sock", 1, 0)) return;
  T_OK(rdzv_gateway_share(f.g, cli, key));
  /* a key not shared */
  T_ERR(NEWT_ERR_NOTFOUND, rdzv_gateway_watch_start(f.path, other, on_value, &s, dl(10000), &w));
  T_CHECK_MSG(strstr(newt_errmsg(), other) != NULL, "%s", newt_errmsg());
  T_CHECK(w == NULL);
  /* etcd not answering: refused; the next subscription starts the watch */
  T_OK(rdzv_etcd_server_pause(srv));
  newt_result_t r = rdzv_gateway_watch_start(f.path, key, on_value, &s, dl(3000), &w);
  T_OK(rdzv_etcd_server_resume(srv));
  T_CHECK_MSG(r == NEWT_ERR_UNAVAILABLE || r == NEWT_ERR_TIMEOUT, "%s: %s", newt_result_name(r), newt_errmsg());
  fprintf(stderr, "  etcd paused: %s: %s\n", newt_result_name(r), newt_errmsg());
  int64_t subs = -1, watches = -1;
  rdzv_gateway_share_counts(f.g, &subs, &watches);
  T_CHECK_MSG(subs == 0 && watches == 0, "%lld subscriptions, %lld watches", (long long)subs, (long long)watches);
  T_OK(rdzv_gateway_watch_start(f.path, key, on_value, &s, dl(30000), &w));
  int64_t rev = put_str(key, "after the outage");
  T_CHECK(sub_wait(&s, rev));
  sub_check(&s, "after the outage", rev, 1);
  rdzv_gateway_share_counts(f.g, &subs, &watches);
  T_CHECK_MSG(subs == 1 && watches == 1, "%lld subscriptions, %lld watches", (long long)subs, (long long)watches);
  /* bad arguments */
  rdzv_gateway_watch *none = NULL;
  T_ERR(NEWT_ERR_INVALID, rdzv_gateway_watch_start(f.path, "", on_value, &s, dl(1000), &none));
  T_ERR(NEWT_ERR_INVALID, rdzv_gateway_watch_start(f.path, key, NULL, &s, dl(1000), &none));
  rdzv_gateway_watch_free(w);
  sub_destroy(&s);
  fixture_stop(&f);
}

static void test_watch_gateway_stops(void) {
  gw_fixture f;
  if (fixture_start(&f, "wstop.sock", 1, 0)) return;
  const char *key = "/gw/watch/stops";
  T_OK(rdzv_gateway_share(f.g, cli, key));
  int64_t rev = put_str(key, "v");
  sub s[N_SUBS];
  rdzv_gateway_watch *w[N_SUBS] = {NULL};
  for (int i = 0; i < N_SUBS; i++) {
    sub_init(&s[i], key);
    T_OK(rdzv_gateway_watch_start(f.path, key, on_value, &s[i], dl(10000), &w[i]));
    T_CHECK(sub_wait(&s[i], rev));
  }
  rdzv_gateway_stop(f.g);
  for (int i = 0; i < N_SUBS; i++) {
    T_CHECK(sub_wait(&s[i], 0));
    rdzv_gateway_watch_free(w[i]);
    T_CHECK_MSG(s[i].ended == 1 && s[i].values == 1, "subscriber %d: %d ends, %d values", i, s[i].ended,
                s[i].values);
    sub_destroy(&s[i]);
  }
  rdzv_gateway_client_free(f.c);
  rdzv_batch_free(f.b);
}

/* A fake gateway that answers a subscription with `mode`'s frames, then keeps the connection
 * until the client leaves. */
enum { FW_ERROR, FW_STRANGE, FW_BAD_JSON, FW_OTHER_KEY, FW_HUGE, FW_NO_KV, FW_AT_ONCE };

static void *fake_watch_main(void *p) {
  fake_srv *s = p;
  int fd = accept(s->lfd, NULL, NULL);
  if (fd < 0) return NULL;
  unsigned char hdr[4];
  char *body = NULL;
  uint32_t n = 0;
  if (read_full(fd, hdr, 4) == 0) {
    n = (uint32_t)hdr[0] << 24 | hdr[1] << 16 | hdr[2] << 8 | hdr[3];
    body = malloc(n ? n : 1);
  }
  if (body && read_full(fd, body, n) == 0) {
    static const char watching[] = "{\"watching\":true}";
    /* key "/gw/fake" and "/gw/else", base64 */
    static const char kv[] = "{\"kv\":{\"key\":\"L2d3L2Zha2U=\",\"value\":\"eA==\",\"mod_revision\":\"7\"}}";
    static const char other[] = "{\"kv\":{\"key\":\"L2d3L2Vsc2U=\",\"value\":\"eA==\",\"mod_revision\":\"7\"}}";
    char both[256];
    switch (s->mode) {
      case FW_ERROR: {
        char e[64];
        snprintf(e, sizeof e, "{\"code\":%d,\"message\":\"etcd away\"}", NEWT_ERR_UNAVAILABLE);
        write_frame(fd, e, (uint32_t)strlen(e), (uint32_t)strlen(e));
        break;
      }
      case FW_STRANGE: write_frame(fd, "{\"hello\":1}", 11, 11); break;
      case FW_AT_ONCE: break;
      default: write_frame(fd, watching, sizeof watching - 1, sizeof watching - 1); break;
    }
    if (s->mode == FW_BAD_JSON) write_frame(fd, "{not json", 9, 9);
    if (s->mode == FW_OTHER_KEY) write_frame(fd, other, sizeof other - 1, sizeof other - 1);
    if (s->mode == FW_HUGE) write_frame(fd, NULL, 0, 0xffffffffu);
    if (s->mode == FW_NO_KV) write_frame(fd, "{\"code\":3,\"message\":\"x\"}", 24, 24);
    if (s->mode == FW_AT_ONCE) { /* the answer and a value in one write: the client must not lose the value */
      uint32_t a = sizeof watching - 1, b = sizeof kv - 1;
      unsigned char *q = (unsigned char *)both;
      q[0] = 0, q[1] = 0, q[2] = 0, q[3] = (unsigned char)a;
      memcpy(both + 4, watching, a);
      q += 4 + a;
      q[0] = 0, q[1] = 0, q[2] = 0, q[3] = (unsigned char)b;
      memcpy(both + 8 + a, kv, b);
      T_CHECK(send(fd, both, 8 + a + b, MSG_NOSIGNAL) == (ssize_t)(8 + a + b));
    }
    char c;
    while (read(fd, &c, 1) > 0) {
    }
  }
  free(body);
  close(fd);
  return NULL;
}

/* Subscribes to the fake in `mode`: start's result (its message in msg), and what fn got by
 * the time free returned. */
static newt_result_t fake_watch(int mode, int *values, int *ended, char *msg, size_t cap) {
  char path[600];
  sock_path(path, sizeof path, "fakew.sock");
  fake_srv s = {.lfd = fake_listen(path), .mode = mode};
  T_CHECK(s.lfd >= 0);
  pthread_t th;
  pthread_create(&th, NULL, fake_watch_main, &s);
  sub u;
  sub_init(&u, "/gw/fake");
  rdzv_gateway_watch *w = NULL;
  newt_result_t r = rdzv_gateway_watch_start(path, "/gw/fake", on_value, &u, dl(10000), &w);
  snprintf(msg, cap, "%s", newt_errmsg());
  if (r == NEWT_OK && mode == FW_AT_ONCE) T_CHECK(sub_wait(&u, 7));
  if (r == NEWT_OK && mode != FW_AT_ONCE) T_CHECK(sub_wait(&u, 0));
  rdzv_gateway_watch_free(w); /* the client leaves: the fake ends */
  pthread_join(th, NULL);
  close(s.lfd);
  unlink(path);
  *values = u.values;
  *ended = u.ended;
  T_CHECK(u.bad == 0);
  sub_destroy(&u);
  return r;
}

static void test_watch_client_faults(void) {
  int values = -1, ended = -1;
  char msg[512];
  T_ERR(NEWT_ERR_UNAVAILABLE, fake_watch(FW_ERROR, &values, &ended, msg, sizeof msg));
  T_CHECK_MSG(strcmp(msg, "etcd away") == 0, "%s", msg);
  T_ERR(NEWT_ERR_CORRUPT, fake_watch(FW_STRANGE, &values, &ended, msg, sizeof msg));
  /* the value that came with the answer is delivered; free then calls nothing */
  T_OK(fake_watch(FW_AT_ONCE, &values, &ended, msg, sizeof msg));
  T_CHECK_MSG(values == 1 && ended == 0, "%d values, %d ends", values, ended);
  /* what it must not send ends the subscription: fn(NULL), once */
  static const int bad[] = {FW_BAD_JSON, FW_OTHER_KEY, FW_HUGE, FW_NO_KV};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    T_OK(fake_watch(bad[i], &values, &ended, msg, sizeof msg));
    T_CHECK_MSG(values == 0 && ended == 1, "mode %d: %d values, %d ends", bad[i], values, ended);
  }
}

/* A raw subscriber: subscribes to key and reads the answer; 0 when it was {watching: true}. */
static int raw_subscribe(int fd, const char *key) {
  char b64[256], req[400];
  newt_base64_encode(key, strlen(key), b64); /* the test's keys fit */
  snprintf(req, sizeof req, "{\"watch\":\"%s\",\"timeout_ms\":10000}", b64);
  write_frame(fd, req, (uint32_t)strlen(req), (uint32_t)strlen(req));
  unsigned char hdr[4];
  char ans[64] = {0};
  if (read_full(fd, hdr, 4) != 0 || hdr[0] || hdr[1] || hdr[2] || hdr[3] >= sizeof ans) return -1;
  if (read_full(fd, ans, hdr[3]) != 0) return -1;
  return strcmp(ans, "{\"watching\":true}") == 0 ? 0 : -1;
}

#define BIG_VALUE ((size_t)256 << 10)
#define N_BIG 16

static void test_watch_slow_subscriber(void) {
  gw_fixture f;
  if (fixture_start(&f, "slow.sock", 1, 0)) return;
  const char *key = "/gw/watch/big";
  T_OK(rdzv_gateway_share(f.g, cli, key));
  /* one that subscribes and never reads again (a stopped worker) */
  int raw = raw_connect(f.path);
  T_CHECK(raw >= 0 && raw_subscribe(raw, key) == 0);
  sub s;
  sub_init(&s, key);
  rdzv_gateway_watch *w = NULL;
  T_OK(rdzv_gateway_watch_start(f.path, key, on_value, &s, dl(10000), &w));
  /* 4 MiB of values, far over what the raw one's socket holds: the other gets each newest */
  char *v = malloc(BIG_VALUE);
  for (int k = 0; v && k < N_BIG; k++) {
    memset(v, 'a' + k, BIG_VALUE);
    int64_t rev = 0;
    T_OK(rdzv_etcd_put(cli, key, v, BIG_VALUE, 0, dl(30000), &rev));
    T_CHECK_MSG(sub_wait(&s, rev), "value %d (revision %lld) did not come", k, (long long)rev);
    pthread_mutex_lock(&s.mu);
    T_CHECK(s.mod_rev == rev && s.value_len == BIG_VALUE && s.value[0] == 'a' + k && s.last == 'a' + k);
    pthread_mutex_unlock(&s.mu);
  }
  free(v);
  int pending = 0;
  T_CHECK(raw < 0 || (ioctl(raw, FIONREAD, &pending) == 0 && pending > 0));
  rdzv_gateway_watch_free(w);
  T_CHECK(s.ended == 0 && s.bad == 0);
  sub_destroy(&s);
  /* stop does not wait for the raw one's blocked write */
  double t0 = newt_now_s();
  fixture_stop(&f);
  double took = newt_now_s() - t0;
  T_CHECK_MSG(took < 5, "stop took %.1f s", took);
  if (raw >= 0) close(raw);
}

int main(void) {
  tu_tmpdir(dir, sizeof dir, "gateway");
  srv = tu_server(NULL);
  cli = tu_client(srv);
  T_RUN(test_same_as_direct);
  T_RUN(test_error_code);
  T_RUN(test_concurrent);
  T_RUN(test_unreached);
  T_RUN(test_client_faults);
  T_RUN(test_hostile_frames);
  T_RUN(test_watch_shared); /* first of the watches: etcd's gauge of watchers counts ours alone */
  T_RUN(test_watch_refused);
  T_RUN(test_watch_gateway_stops);
  T_RUN(test_watch_client_faults);
  T_RUN(test_watch_slow_subscriber);
  rdzv_etcd_free(cli);
  rdzv_etcd_server_free(srv);
  newt_fs_rm_rf(dir);
  return T_DONE();
}
