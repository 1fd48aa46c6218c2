/* The real client against a fake etcd: a socket server in this process that answers with
 * garbage, truncated bodies, HTML error pages, closed connections, and a chunked watch
 * stream whose lines are cut across chunk boundaries, followed by a garbage line, a
 * truncated chunk, and a compacted-revision cancel. The client must deliver exactly the
 * events that were sent, in order, re-open the stream from the right revision each time,
 * re-read (resync) after the compaction, and never crash or hang. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rdzv_test.h"

static int lfd, port;
static atomic_int stop_server, watch_conns;
static char watch_bodies[8][1024]; /* the create requests the server received */
static char url[64];

static void send_all(int fd, const char *s, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
    if (w <= 0) return;
    s += w;
    n -= (size_t)w;
  }
}

static void send_str(int fd, const char *s) { send_all(fd, s, strlen(s)); }

static void chunk(int fd, const char *s) {
  char hdr[32];
  snprintf(hdr, sizeof hdr, "%zx\r\n", strlen(s));
  send_str(fd, hdr);
  send_str(fd, s);
  send_str(fd, "\r\n");
  newt_sleep_ms(20); /* separate reads on the client side */
}

/* Reads one request: returns the path, fills body. */
static int read_request(int fd, char *path, size_t pcap, char *body, size_t bcap) {
  char buf[8192];
  size_t n = 0;
  buf[0] = '\0';
  char *end = NULL;
  while (!(end = strstr(buf, "\r\n\r\n"))) {
    ssize_t r = recv(fd, buf + n, sizeof buf - 1 - n, 0);
    if (r <= 0) return -1;
    n += (size_t)r;
    buf[n] = '\0';
  }
  sscanf(buf, "POST %255s", path);
  (void)pcap;
  size_t clen = 0;
  char *cl = strcasestr(buf, "Content-Length:");
  if (cl) clen = (size_t)atol(cl + 15);
  size_t have = n - (size_t)(end + 4 - buf);
  memmove(buf, end + 4, have);
  while (have < clen && have < sizeof buf - 1) {
    ssize_t r = recv(fd, buf + have, sizeof buf - 1 - have, 0);
    if (r <= 0) break;
    have += (size_t)r;
  }
  buf[have] = '\0';
  size_t k = have < bcap - 1 ? have : bcap - 1;
  memcpy(body, buf, k);
  body[k] = '\0';
  return 0;
}

static void reply(int fd, const char *status, const char *body) {
  char hdr[256];
  snprintf(hdr, sizeof hdr, "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
           status, strlen(body));
  send_str(fd, hdr);
  send_str(fd, body);
}

static const char *stream_head =
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";

static void serve_watch(int fd, int k) {
  send_str(fd, stream_head);
  switch (k) {
    case 0: /* two events, each line cut across chunks, then a garbage line */
      chunk(fd, "{\"result\":{\"header\":{\"revision\":\"10\"},\"created\":true}}\n{\"result\":{\"header\":{\"revision\":\"11\"},\"eve");
      chunk(fd, "nts\":[{\"kv\":{\"key\":\"YQ==\",\"mod_revision\":\"11\",\"create_revision\":\"11\",\"version\":\"1\",\"value\":\"MQ==\"}}]}}\n{\"result\":{\"header\":{\"revi");
      chunk(fd, "sion\":\"12\"},\"events\":[{\"kv\":{\"key\":\"Yg==\",\"mod_revision\":\"12\"");
      chunk(fd, ",\"create_revision\":\"12\",\"version\":\"1\"}}]}}");
      chunk(fd, "\n");
      chunk(fd, "this is not json\n");
      newt_sleep_ms(500);
      break;
    case 1: /* one event, then a chunk that promises 100 bytes and stops after 20 */
      chunk(fd, "{\"result\":{\"header\":{\"revision\":\"13\"},\"created\":true}}\n");
      chunk(fd, "{\"result\":{\"header\":{\"revision\":\"13\"},\"events\":[{\"kv\":{\"key\":\"YQ==\",\"mod_revision\":\"13\",\"create_revision\":\"11\",\"version\":\"2\",\"value\":\"Mg==\"}}]}}\n");
      send_str(fd, "64\r\n{\"result\":{\"header\"");
      newt_sleep_ms(100);
      break;
    case 2: /* the start revision was compacted */
      chunk(fd, "{\"result\":{\"header\":{\"revision\":\"30\"},\"created\":true}}\n{\"result\":{\"header\":{},\"canceled\":true,\"compact_revision\":\"20\"}}\n");
      newt_sleep_ms(500);
      break;
    default: /* a healthy stream that stays open */
      chunk(fd, "{\"result\":{\"header\":{\"revision\":\"25\"},\"created\":true}}\n");
      while (!atomic_load(&stop_server)) {
        char b[256];
        struct timeval tv = {0, 100000};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        if (recv(fd, b, sizeof b, 0) == 0) break; /* the client hung up */
      }
  }
}

static void *server_main(void *arg) {
  (void)arg;
  while (!atomic_load(&stop_server)) {
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0) continue;
    char path[256] = "", body[4096] = "";
    if (read_request(fd, path, sizeof path, body, sizeof body) == 0) {
      if (strcmp(path, "/v3/watch") == 0) {
        int k = atomic_fetch_add(&watch_conns, 1);
        if (k < 8) memcpy(watch_bodies[k], body, sizeof watch_bodies[k] - 1);
        serve_watch(fd, k);
      } else if (strcmp(path, "/v3/kv/range") == 0 && strstr(body, "\"cmVzeW5j")) { /* "resync..." */
        reply(fd, "200 OK", "{\"header\":{\"revision\":\"24\"},\"kvs\":[{\"key\":\"cmVzeW5jL2E=\",\"mod_revision\":\"21\",\"create_revision\":\"11\",\"version\":\"5\"},{\"key\":\"cmVzeW5jL2M=\",\"mod_revision\":\"23\",\"create_revision\":\"23\",\"version\":\"1\"}],\"count\":\"2\"}");
      } else if (strstr(body, "Z2FyYmFnZQ")) { /* key "garbage" */
        reply(fd, "200 OK", "not json at all");
      } else if (strstr(body, "dHJ1bmM")) { /* "trunc" */
        reply(fd, "200 OK", "{\"header\":{\"revision\":\"5\"},\"kvs\":[{\"key\":\"YQ==\"");
      } else if (strstr(body, "aHRtbA")) { /* "html" */
        reply(fd, "502 Bad Gateway", "<html><body>502 Bad Gateway</body></html>");
      } else if (strstr(body, "d2VpcmQ")) { /* "weird": a valid JSON of the wrong shape */
        reply(fd, "200 OK", "{\"header\":{\"revision\":\"x\"},\"kvs\":7}");
      }
      /* anything else ("close"): hang up without a word */
    }
    close(fd);
  }
  return NULL;
}

static newt_deadline_t dl(int64_t ms) { return newt_deadline_in_ms(ms); }

static void test_unary_garbage(void) {
  rdzv_etcd_opts o = {.endpoints = url};
  rdzv_etcd *c = tu_client_opts(&o);
  rdzv_etcd_kvs r;
  T_ERR(NEWT_ERR_CORRUPT, rdzv_etcd_range(c, "garbage", NULL, dl(3000), &r));
  T_ERR(NEWT_ERR_CORRUPT, rdzv_etcd_range(c, "trunc", NULL, dl(3000), &r));
  T_ERR(NEWT_ERR_CORRUPT, rdzv_etcd_range(c, "weird", NULL, dl(3000), &r));
  fprintf(stderr, "  %s\n", newt_errmsg());
  T_ERR(NEWT_ERR_PEER, rdzv_etcd_range(c, "html", NULL, dl(3000), &r));
  T_CHECK(strstr(newt_errmsg(), "502") != NULL);
  fprintf(stderr, "  %s\n", newt_errmsg());
  /* a server that hangs up: a write fails at once (it may have been applied), a read is
   * retried until its deadline */
  uint64_t t0 = newt_now_ns();
  newt_result_t res = rdzv_etcd_put(c, "close", "v", 1, 0, dl(3000), NULL);
  T_CHECK(res == NEWT_ERR_UNAVAILABLE && (newt_now_ns() - t0) < 2000000000ull);
  fprintf(stderr, "  %s\n", newt_errmsg());
  t0 = newt_now_ns();
  res = rdzv_etcd_range(c, "close", NULL, dl(600), &r);
  double ms = (double)(newt_now_ns() - t0) / 1e6;
  T_CHECK(res == NEWT_ERR_UNAVAILABLE && ms >= 550 && ms < 2500);
  rdzv_etcd_free(c);
}

typedef struct got {
  pthread_mutex_t mu;
  char log[2048];
  int events, errors, resyncs;
} got;

static void on_watch(void *ud, const rdzv_etcd_watch_resp *r) {
  got *g = ud;
  pthread_mutex_lock(&g->mu);
  char item[160];
  if (r->kind == RDZV_WATCH_EVENTS) {
    for (size_t i = 0; i < r->n_events; i++) {
      snprintf(item, sizeof item, "%s@%lld=%s ", r->events[i].kv.key, (long long)r->events[i].kv.mod_revision,
               r->events[i].kv.value);
      strncat(g->log, item, sizeof g->log - strlen(g->log) - 1);
      g->events++;
    }
  } else if (r->kind == RDZV_WATCH_RESYNC) {
    snprintf(item, sizeof item, "resync@%lld:%zu ", (long long)r->revision, r->n_kvs);
    strncat(g->log, item, sizeof g->log - strlen(g->log) - 1);
    g->resyncs++;
  } else if (r->kind == RDZV_WATCH_ERROR) {
    g->errors++;
  }
  pthread_mutex_unlock(&g->mu);
}

static void test_watch_stream(void) {
  rdzv_etcd_opts o = {.endpoints = url};
  rdzv_etcd *c = tu_client_opts(&o);
  got g = {.mu = PTHREAD_MUTEX_INITIALIZER};
  rdzv_etcd_watch *w;
  T_OK(rdzv_etcd_watch_start(c, "resync/", &(rdzv_etcd_watch_opts){.prefix = 1}, on_watch, &g, dl(5000), &w));
  newt_deadline_t d = dl(15000);
  while (atomic_load(&watch_conns) < 4 && !newt_deadline_passed(d)) newt_sleep_ms(20);
  newt_sleep_ms(300);
  pthread_mutex_lock(&g.mu);
  fprintf(stderr, "  delivered: %s(%d stream errors)\n", g.log, g.errors);
  T_CHECK(strcmp(g.log, "a@11=1 b@12= a@13=2 resync@24:2 ") == 0);
  T_CHECK(g.errors >= 2);
  pthread_mutex_unlock(&g.mu);
  /* every re-open asked for the revision after the last one delivered */
  T_CHECK(!strstr(watch_bodies[0], "start_revision"));
  T_CHECK(strstr(watch_bodies[1], "\"start_revision\":\"13\"") != NULL);
  T_CHECK(strstr(watch_bodies[2], "\"start_revision\":\"14\"") != NULL);
  T_CHECK(strstr(watch_bodies[3], "\"start_revision\":\"25\"") != NULL);
  T_CHECK(rdzv_etcd_watch_next_revision(w) == 25); /* resync at 24: next is 25 */
  uint64_t t0 = newt_now_ns();
  rdzv_etcd_watch_free(w);
  T_CHECK((newt_now_ns() - t0) < 1500000000ull);
  rdzv_etcd_free(c);
}

int main(void) {
  lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(lfd, 16) != 0 ||
      getsockname(lfd, (struct sockaddr *)&sa, &len) != 0)
    return 1;
  struct timeval tv = {0, 200000};
  setsockopt(lfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  port = ntohs(sa.sin_port);
  snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
  pthread_t th;
  pthread_create(&th, NULL, server_main, NULL);
  T_RUN(test_unary_garbage);
  T_RUN(test_watch_stream);
  atomic_store(&stop_server, 1);
  pthread_join(th, NULL);
  close(lfd);
  return T_DONE();
}
