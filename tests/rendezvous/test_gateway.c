/* Integration tests of the host's transaction gateway (rendezvous/gateway.h) against a real
 * etcd: a transaction through the gateway gives what it gives directly (a guarded put, a
 * failed compare whose failure ops read kvs, a delete, binary values); an error keeps its
 * code and message; 16 clients at once cost etcd one merged transaction; no gateway, or one
 * stopped, is *unreached = 1, and one that took the request and then failed is *unreached = 0;
 * hostile frames from a raw socket (cut short, not JSON, not base64, too many ops, a huge
 * length, random bytes) leave the server serving. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
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
  rdzv_etcd_free(cli);
  rdzv_etcd_server_free(srv);
  newt_fs_rm_rf(dir);
  return T_DONE();
}
