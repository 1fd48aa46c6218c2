/* Unit tests of the etcd client's pure parts: prefix range_end, the watch stream line
 * splitter (every split point of a real stream), the response parsers on answers captured
 * from etcd 3.4's gateway and on broken ones, and the mapping of gateway errors. */
#include <string.h>

#include "rendezvous/etcd_parse.h"
#include "rendezvous/rdzv.h"
#include "test.h"

static void test_prefix_end(void) {
  char out[16];
  size_t n;
  rdzv_etcd_prefix_end("/newt/j/", 8, out, &n);
  T_CHECK(n == 8 && memcmp(out, "/newt/j0", 8) == 0); /* '/' + 1 == '0' */
  rdzv_etcd_prefix_end("a", 1, out, &n);
  T_CHECK(n == 1 && out[0] == 'b');
  rdzv_etcd_prefix_end("a\xff", 2, out, &n); /* trailing 0xff is dropped, the byte before incremented */
  T_CHECK(n == 1 && out[0] == 'b');
  rdzv_etcd_prefix_end("a\xff\xff", 3, out, &n);
  T_CHECK(n == 1 && out[0] == 'b');
  rdzv_etcd_prefix_end("\xff\xff", 2, out, &n); /* no successor: to the end of the keyspace */
  T_CHECK(n == 1 && out[0] == '\0');
  rdzv_etcd_prefix_end("", 0, out, &n);
  T_CHECK(n == 1 && out[0] == '\0');
  rdzv_etcd_prefix_end("a\xfe", 2, out, &n);
  T_CHECK(n == 2 && out[0] == 'a' && (unsigned char)out[1] == 0xff);
}

typedef struct lines_seen {
  char text[8][128];
  int n;
} lines_seen;

static newt_result_t on_line(void *ud, const char *line, size_t len) {
  lines_seen *s = ud;
  if (s->n < 8 && len < 128) {
    memcpy(s->text[s->n], line, len);
    s->text[s->n][len] = '\0';
  }
  s->n++;
  return NEWT_OK;
}

static void test_lines_every_split(void) {
  const char *stream = "{\"a\":1}\n{\"b\":2}\r\n\n{\"c\":3}\n{\"d\"";
  size_t len = strlen(stream);
  /* one cut anywhere, two cuts anywhere: always the same three lines and one partial */
  for (size_t i = 0; i <= len; i++) {
    for (size_t j = i; j <= len; j++) {
      rdzv_etcd_lines l;
      rdzv_etcd_lines_init(&l, 0);
      lines_seen s = {0};
      T_OK(rdzv_etcd_lines_feed(&l, stream, i, on_line, &s));
      T_OK(rdzv_etcd_lines_feed(&l, stream + i, j - i, on_line, &s));
      T_OK(rdzv_etcd_lines_feed(&l, stream + j, len - j, on_line, &s));
      T_CHECK_MSG(s.n == 3 && strcmp(s.text[0], "{\"a\":1}") == 0 && strcmp(s.text[1], "{\"b\":2}") == 0 &&
                      strcmp(s.text[2], "{\"c\":3}") == 0 && rdzv_etcd_lines_pending(&l) == 4,
                  "cut at %zu,%zu: %d lines", i, j, s.n);
      rdzv_etcd_lines_free(&l);
    }
  }
  /* byte by byte */
  rdzv_etcd_lines l;
  rdzv_etcd_lines_init(&l, 0);
  lines_seen s = {0};
  for (size_t i = 0; i < len; i++) T_OK(rdzv_etcd_lines_feed(&l, stream + i, 1, on_line, &s));
  T_CHECK(s.n == 3);
  rdzv_etcd_lines_reset(&l);
  T_CHECK(rdzv_etcd_lines_pending(&l) == 0);
  rdzv_etcd_lines_free(&l);
}

static void test_lines_limit(void) {
  rdzv_etcd_lines l;
  rdzv_etcd_lines_init(&l, 16);
  lines_seen s = {0};
  T_OK(rdzv_etcd_lines_feed(&l, "0123456789", 10, on_line, &s));
  T_ERR(NEWT_ERR_CORRUPT, rdzv_etcd_lines_feed(&l, "0123456789", 10, on_line, &s)); /* 20 bytes, no newline */
  rdzv_etcd_lines_reset(&l);
  T_ERR(NEWT_ERR_CORRUPT, rdzv_etcd_lines_feed(&l, "01234567890123456789\n", 21, on_line, &s));
  T_CHECK(s.n == 0);
  rdzv_etcd_lines_free(&l);
}

/* Captured from etcd 3.4.23's gateway. */
static const char *range_body =
    "{\"header\":{\"cluster_id\":\"324952591200643719\",\"member_id\":\"3319814642761637952\",\"revision\":\"2\","
    "\"raft_term\":\"2\"},\"kvs\":[{\"key\":\"Zm9v\",\"create_revision\":\"2\",\"mod_revision\":\"2\",\"version\":"
    "\"1\",\"value\":\"YmFy\"}],\"count\":\"1\"}";
static const char *txn_fail_body =
    "{\"header\":{\"revision\":\"3\"},\"responses\":[{\"response_range\":{\"header\":{\"revision\":\"3\"},"
    "\"kvs\":[{\"key\":\"Zm9v\",\"create_revision\":\"2\",\"mod_revision\":\"3\",\"version\":\"2\",\"value\":"
    "\"YmF6\"}],\"count\":\"1\"}}]}";
static const char *watch_events =
    "{\"result\":{\"header\":{\"revision\":\"8\"},\"events\":[{\"kv\":{\"key\":\"YTE=\",\"create_revision\":\"5\","
    "\"mod_revision\":\"6\",\"version\":\"2\",\"value\":\"eA==\"}},{\"type\":\"DELETE\",\"kv\":{\"key\":\"YTE=\","
    "\"mod_revision\":\"8\"}}]}}";
static const char *watch_compacted =
    "{\"result\":{\"header\":{\"cluster_id\":\"1\",\"raft_term\":\"2\"},\"canceled\":true,\"compact_revision\":\"6\"}}";

static void test_parsers(void) {
  rdzv_etcd_kvs r;
  T_OK(rdzv_etcd_parse_range(range_body, strlen(range_body), &r));
  T_CHECK(r.revision == 2 && r.n == 1 && r.count == 1);
  if (r.n == 1)
    T_CHECK(strcmp(r.kvs[0].key, "foo") == 0 && strcmp(r.kvs[0].value, "bar") == 0 && r.kvs[0].version == 1 &&
            r.kvs[0].lease == 0);
  rdzv_etcd_kvs_free(&r);
  /* an empty answer omits kvs and count */
  T_OK(rdzv_etcd_parse_range("{\"header\":{\"revision\":\"9\"}}", 28, &r));
  T_CHECK(r.n == 0 && r.count == 0 && r.revision == 9);
  rdzv_etcd_kvs_free(&r);

  rdzv_etcd_txn_result t;
  T_OK(rdzv_etcd_parse_txn(txn_fail_body, strlen(txn_fail_body), &t));
  T_CHECK(!t.succeeded && t.n == 1 && t.revision == 3 && t.results[0].type == RDZV_OP_RANGE &&
          t.results[0].range.n == 1);
  rdzv_etcd_txn_result_free(&t);

  int64_t id = 0, ttl = 0, granted = 0;
  const char *ka = "{\"result\":{\"header\":{\"revision\":\"2\"},\"ID\":\"2324035716345864460\",\"TTL\":\"5\"}}";
  T_OK(rdzv_etcd_parse_lease(ka, strlen(ka), &id, &ttl, &granted));
  T_CHECK(id == 2324035716345864460LL && ttl == 5);
  const char *gone = "{\"result\":{\"header\":{\"revision\":\"2\"},\"ID\":\"123\"}}";
  T_OK(rdzv_etcd_parse_lease(gone, strlen(gone), &id, &ttl, NULL));
  T_CHECK(id == 123 && ttl == 0);
  const char *ttl_unknown = "{\"header\":{},\"ID\":\"123\",\"TTL\":\"-1\"}";
  T_OK(rdzv_etcd_parse_lease(ttl_unknown, strlen(ttl_unknown), &id, &ttl, NULL));
  T_CHECK(ttl == -1);

  rdzv_etcd_watch_msg m;
  T_OK(rdzv_etcd_parse_watch(watch_events, strlen(watch_events), &m));
  T_CHECK(m.n_events == 2 && m.revision == 8);
  if (m.n_events == 2)
    T_CHECK(m.events[0].type == RDZV_EVENT_PUT && strcmp(m.events[0].kv.key, "a1") == 0 &&
            m.events[1].type == RDZV_EVENT_DELETE && m.events[1].kv.mod_revision == 8);
  rdzv_etcd_watch_msg_free(&m);
  T_OK(rdzv_etcd_parse_watch(watch_compacted, strlen(watch_compacted), &m));
  T_CHECK(m.canceled && m.compact_revision == 6 && m.n_events == 0);
  const char *stream_err = "{\"error\":{\"grpc_code\":16,\"http_code\":401,\"message\":\"etcdserver: invalid auth token\"}}";
  T_OK(rdzv_etcd_parse_watch(stream_err, strlen(stream_err), &m));
  T_CHECK(m.is_error && m.gw.grpc_code == 16 && rdzv_etcd_is_token_error(m.gw.message));
}

static void test_parsers_reject(void) {
  static const char *bad_ranges[] = {
      "",
      "[]",
      "{\"kvs\":{}}",
      "{\"kvs\":[{\"key\":\"!!notbase64\"}]}",
      "{\"kvs\":[{\"value\":\"YQ==\"}]}",                       /* no key */
      "{\"kvs\":[{\"key\":\"YQ==\",\"mod_revision\":\"x\"}]}",    /* not a number */
      "{\"kvs\":[{\"key\":\"YQ==\",\"version\":\"-3\"}]}",        /* negative */
      "{\"header\":{\"revision\":\"12\"},\"kvs\":[{\"key\":\"YQ==\"}",  /* truncated */
      "{\"header\":[],\"kvs\":[]}",
  };
  for (size_t i = 0; i < sizeof bad_ranges / sizeof *bad_ranges; i++) {
    rdzv_etcd_kvs r;
    newt_result_t res = rdzv_etcd_parse_range(bad_ranges[i], strlen(bad_ranges[i]), &r);
    T_CHECK_MSG(res == NEWT_ERR_CORRUPT, "range %zu: %s", i, newt_result_name(res));
  }
  rdzv_etcd_watch_msg m;
  const char *unordered = "{\"result\":{\"events\":[{\"kv\":{\"key\":\"YQ==\",\"mod_revision\":\"9\"}},"
                          "{\"kv\":{\"key\":\"YQ==\",\"mod_revision\":\"4\"}}]}}";
  T_ERR(NEWT_ERR_CORRUPT, rdzv_etcd_parse_watch(unordered, strlen(unordered), &m));
  const char *badtype = "{\"result\":{\"events\":[{\"type\":\"EXPLODE\",\"kv\":{\"key\":\"YQ==\",\"mod_revision\":\"9\"}}]}}";
  T_ERR(NEWT_ERR_CORRUPT, rdzv_etcd_parse_watch(badtype, strlen(badtype), &m));
  T_CHECK(strstr(newt_errmsg(), "events[0].type") != NULL);
  T_ERR(NEWT_ERR_CORRUPT, rdzv_etcd_parse_watch("{\"result\":{\"events\":[{}]}}", 27, &m));
  rdzv_etcd_txn_result t;
  T_ERR(NEWT_ERR_CORRUPT, rdzv_etcd_parse_txn("{\"responses\":[{\"response_what\":{}}]}", 36, &t));
  T_ERR(NEWT_ERR_CORRUPT, rdzv_etcd_parse_txn("{\"responses\":[1]}", 17, &t));
}

static void test_errors(void) {
  rdzv_etcd_gw_error e;
  const char *body = "{\"error\":\"etcdserver: requested lease not found\",\"message\":\"etcdserver: requested lease not found\",\"code\":5}";
  rdzv_etcd_parse_error(body, strlen(body), &e);
  T_CHECK(e.grpc_code == 5 && strstr(e.message, "lease not found"));
  T_CHECK(rdzv_etcd_grpc_code_result(e.grpc_code, e.message) == NEWT_ERR_NOTFOUND);
  T_CHECK(rdzv_etcd_grpc_code_result(3, "etcdserver: authentication failed, invalid user ID or password") == NEWT_ERR_AUTH);
  T_CHECK(rdzv_etcd_grpc_code_result(3, "etcdserver: too many operations") == NEWT_ERR_INVALID);
  T_CHECK(rdzv_etcd_grpc_code_result(14, "no leader") == NEWT_ERR_UNAVAILABLE);
  rdzv_etcd_parse_error("<html>502 Bad Gateway</html>\n", 29, &e);
  T_CHECK(e.grpc_code == -1 && strstr(e.message, "502 Bad Gateway"));
  rdzv_etcd_parse_error("", 0, &e);
  T_CHECK(e.message[0] != '\0');
}

static void test_names_and_keys(void) {
  T_OK(newt_check_name("job", "my-job_1.0"));
  T_ERR(NEWT_ERR_INVALID, newt_check_name("job", "a/b"));
  T_ERR(NEWT_ERR_INVALID, newt_check_name("job", ""));
  T_ERR(NEWT_ERR_INVALID, newt_check_name("job", "0123456789012345678901234567890123456789012345678901234567890123"));
  char key[64];
  T_OK(newt_job_path(key, sizeof key, "j", "x/y"));
  T_CHECK(strcmp(key, "/newt/j/x/y") == 0);
}

int main(void) {
  T_RUN(test_prefix_end);
  T_RUN(test_lines_every_split);
  T_RUN(test_lines_limit);
  T_RUN(test_parsers);
  T_RUN(test_parsers_reject);
  T_RUN(test_errors);
  T_RUN(test_names_and_keys);
  return T_DONE();
}
