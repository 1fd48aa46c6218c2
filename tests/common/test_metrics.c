/* The metrics endpoint, scraped over real HTTP with libcurl: families, labels,
 * histograms, the number format, groups, /healthz, and a hostile neighbour (issue 17,
 * item 13): 1,100 connections held open from one address must neither starve a scrape
 * from another nor fill the log. */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/metrics.h"
#include "common/strutil.h"
#include "test.h"

static size_t on_data(char *p, size_t sz, size_t n, void *ud) {
  newt_buf_append(ud, p, sz * n);
  return sz * n;
}

static long fetch(const char *host, int port, const char *path, newt_buf *body, long timeout_ms) {
  char url[128];
  snprintf(url, sizeof url, "http://%s:%d%s", host, port, path);
  CURL *c = curl_easy_init();
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, body);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
  long code = 0;
  if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(c);
  return code;
}

static int unhealthy(void *ud, char *why, size_t cap) {
  snprintf(why, cap, "step loop stuck for %d s", *(int *)ud);
  return 0;
}

static void test_scrape(void) {
  metrics_t *m = NULL;
  T_OK(metrics_start("127.0.0.1", 0, NULL, &m));
  if (!m) return;
  T_CHECK(metrics_port(m) > 0);
  T_OK(metrics_define(m, "newt_generation", METRICS_GAUGE, "current plan generation"));
  T_OK(metrics_define(m, "newt_recoveries_total", METRICS_COUNTER, "recoveries"));
  T_OK(metrics_define_group(m, "newt_steps_total", METRICS_COUNTER, 1, "steps"));
  double b[] = {0.1, 1, 10};
  T_OK(metrics_define_histogram(m, "newt_recovery_duration_seconds", 1, b, 3, "recoveries"));
  metrics_set(m, "newt_generation", 7);
  metrics_add(m, "newt_recoveries_total", 1);
  metrics_add(m, "newt_recoveries_total", 2);
  metrics_add_l(m, "newt_recoveries_total", "cause=\"crash\"", 1);
  metrics_set(m, "newt_not_defined", 1); /* ignored */
  metrics_observe(m, "newt_recovery_duration_seconds", "cause=\"crash\"", 0.25);
  metrics_observe(m, "newt_recovery_duration_seconds", "cause=\"crash\"", 0.05);
  metrics_set(m, "newt_steps_total", 8388.1);
  newt_buf b1;
  newt_buf_init(&b1);
  T_CHECK(fetch("127.0.0.1", metrics_port(m), "/metrics", &b1, 5000) == 200);
  const char *t = b1.data ? b1.data : "";
  T_CHECK_MSG(strstr(t, "# TYPE newt_generation gauge\nnewt_generation 7\n"), "%s", t);
  T_CHECK(strstr(t, "newt_recoveries_total 3\n"));
  T_CHECK(strstr(t, "newt_recoveries_total{cause=\"crash\"} 1\n"));
  T_CHECK(!strstr(t, "newt_not_defined"));
  T_CHECK_MSG(strstr(t, "newt_steps_total 8388.1\n"), "%s", t);
  T_CHECK(strstr(t, "newt_recovery_duration_seconds_bucket{cause=\"crash\",le=\"0.1\"} 1\n"));
  T_CHECK(strstr(t, "newt_recovery_duration_seconds_bucket{cause=\"crash\",le=\"1\"} 2\n"));
  T_CHECK(strstr(t, "newt_recovery_duration_seconds_bucket{cause=\"crash\",le=\"+Inf\"} 2\n"));
  T_CHECK(strstr(t, "newt_recovery_duration_seconds_sum{cause=\"crash\"} 0.3\n"));
  T_CHECK(strstr(t, "newt_recovery_duration_seconds_count{cause=\"crash\"} 2\n"));
  /* a hidden group and a note */
  metrics_show_group(m, 1, 0);
  metrics_set_note(m, "standby: the leader exports the job's metrics");
  newt_buf_reset(&b1);
  T_CHECK(fetch("127.0.0.1", metrics_port(m), "/metrics", &b1, 5000) == 200);
  t = b1.data ? b1.data : "";
  T_CHECK_MSG(!strstr(t, "newt_steps_total") && strstr(t, "# standby: the leader") && strstr(t, "newt_generation 7"), "%s", t);
  /* health */
  newt_buf_reset(&b1);
  T_CHECK(fetch("127.0.0.1", metrics_port(m), "/healthz", &b1, 5000) == 200);
  int stuck = 42;
  metrics_set_health(m, unhealthy, &stuck);
  newt_buf_reset(&b1);
  T_CHECK(fetch("127.0.0.1", metrics_port(m), "/healthz", &b1, 5000) == 503);
  T_CHECK(b1.data && strstr(b1.data, "stuck for 42 s"));
  newt_buf_reset(&b1);
  T_CHECK(fetch("127.0.0.1", metrics_port(m), "/nope", &b1, 5000) == 404);
  newt_buf_free(&b1);
  metrics_t *m2 = NULL;
  T_ERR(NEWT_ERR_SYS, metrics_start("127.0.0.1", metrics_port(m), NULL, &m2));
  T_ERR(NEWT_ERR_INVALID, metrics_start("not-an-ip", 0, NULL, &m2));
  metrics_stop(m);
}

static void test_format(void) {
  char v[40];
  T_CHECK(strcmp(metrics_fmt_value(8388.1, v, sizeof v), "8388.1") == 0);
  T_CHECK(strcmp(metrics_fmt_value(0.1 + 0.2, v, sizeof v), "0.3") == 0);
  T_CHECK(strcmp(metrics_fmt_value(8388.1000000000004, v, sizeof v), "8388.1") == 0);
  T_CHECK(strcmp(metrics_fmt_value(0.001, v, sizeof v), "0.001") == 0);
  T_CHECK(strcmp(metrics_fmt_value(1e18, v, sizeof v), "1e+18") == 0);
  T_CHECK(strcmp(metrics_fmt_value(123456789012, v, sizeof v), "123456789012") == 0);
  T_CHECK(strcmp(metrics_fmt_value(-2, v, sizeof v), "-2") == 0);
  T_CHECK(strcmp(metrics_fmt_value(1.0 / 0.0, v, sizeof v), "+Inf") == 0);
}

/* Two addresses, one port: the chart binds the pod IP and loopback (port-forward). */
static void test_two_addresses(void) {
  metrics_t *m = NULL;
  T_OK(metrics_start("127.0.0.1,127.0.0.3", 0, NULL, &m));
  if (!m) return;
  newt_buf b;
  newt_buf_init(&b);
  T_CHECK(fetch("127.0.0.1", metrics_port(m), "/healthz", &b, 5000) == 200);
  T_CHECK(fetch("127.0.0.3", metrics_port(m), "/healthz", &b, 5000) == 200);
  T_CHECK(fetch("127.0.0.2", metrics_port(m), "/healthz", &b, 2000) == 0); /* not bound there */
  newt_buf_free(&b);
  metrics_stop(m);
}

/* A server in a child process, as a coordinator is (1024 descriptors, its stderr in a
 * file), held by 1,100 silent connections from 127.0.0.2: a scrape from 127.0.0.1 must
 * still be answered at once, and the log must stay small. */
static void test_held_connections(void) {
  char dir[] = "/tmp/newt-metrics-XXXXXX";
  T_CHECK(mkdtemp(dir) != NULL);
  char log[128];
  snprintf(log, sizeof log, "%s/stderr", dir);
  int port = 0;
  int pfd[2];
  T_CHECK(pipe(pfd) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    struct rlimit rl = {1024, 1024};
    setrlimit(RLIMIT_NOFILE, &rl);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    metrics_t *m = NULL;
    if (metrics_start("127.0.0.1", 0, NULL, &m) != NEWT_OK) _exit(1);
    metrics_define(m, "newt_up", METRICS_GAUGE, "1");
    int p = metrics_port(m);
    if (write(pfd[1], &p, sizeof p) != sizeof p) _exit(1);
    for (;;) pause();
  }
  close(pfd[1]);
  T_CHECK(read(pfd[0], &port, sizeof port) == sizeof port);
  close(pfd[0]);
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < 2048 && rl.rlim_max >= 2048) {
    rl.rlim_cur = 2048;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  enum { HELD = 1100 };
  int *fds = malloc(HELD * sizeof *fds);
  int opened = 0;
  struct sockaddr_in from = {.sin_family = AF_INET}, to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.2", &from.sin_addr);
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  for (int i = 0; i < HELD; i++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    if (bind(fd, (struct sockaddr *)&from, sizeof from) != 0 || connect(fd, (struct sockaddr *)&to, sizeof to) != 0) {
      close(fd);
      continue;
    }
    fds[opened++] = fd;
  }
  T_CHECK_MSG(opened > 1000, "only %d connections opened", opened);
  newt_sleep_ms(300);
  for (int i = 0; i < 3; i++) {
    newt_buf b;
    newt_buf_init(&b);
    uint64_t t0 = newt_now_ns();
    long code = fetch("127.0.0.1", port, "/metrics", &b, 2000);
    T_CHECK_MSG(code == 200 && b.data && strstr(b.data, "newt_up 0"), "scrape %d with %d held connections: HTTP %ld after %.0f ms",
                i, opened, code, (double)(newt_now_ns() - t0) / 1e6);
    newt_buf_free(&b);
  }
  for (int i = 0; i < opened; i++) close(fds[i]);
  free(fds);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  struct stat st;
  T_CHECK(stat(log, &st) == 0);
  T_CHECK_MSG(st.st_size < 2048, "the server wrote %lld bytes of log", (long long)st.st_size);
  char *text = NULL;
  size_t len = 0;
  FILE *f = fopen(log, "r");
  if (f) {
    text = calloc(1, (size_t)st.st_size + 1);
    len = fread(text, 1, (size_t)st.st_size, f);
    fclose(f);
  }
  T_CHECK_MSG(!text || !strstr(text, "Too many open files"), "%.*s", (int)len, text);
  free(text);
  unlink(log);
  rmdir(dir);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  T_RUN(test_format);
  T_RUN(test_scrape);
  T_RUN(test_two_addresses);
  T_RUN(test_held_connections);
  curl_global_cleanup();
  return T_DONE();
}
