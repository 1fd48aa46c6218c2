/* The metrics endpoint, scraped over real HTTP with libcurl: families, labels,
 * histograms, the number format, groups, /healthz, and a hostile neighbour (issue 17,
 * item 13): 1,100 connections held open from one address must neither starve a scrape
 * from another nor fill the log. Issue 25, item 8: the process_* families with values
 * that fit this process, and constant labels on every series (set again: moved, escaped),
 * each scrape passing `promtool check metrics` where promtool is installed. Issue 37, item
 * 5: slow clients from many addresses holding partial requests must not keep /healthz out. */
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
#include "common/fs.h"
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

/* promtool check metrics on a scrape: 1 when it passes, or when promtool is not
 * installed (the k8s tests require it; here it is a second opinion). */
static int promtool_ok(const char *text, char *why, size_t cap) {
  if (system("command -v promtool >/dev/null 2>&1") != 0) return 1;
  char dir[] = "/tmp/newt-promtool-XXXXXX", in[64], out[64], cmd[256];
  if (!mkdtemp(dir)) return 0;
  snprintf(in, sizeof in, "%s/in", dir);
  snprintf(out, sizeof out, "%s/out", dir);
  int ok = newt_fs_write_atomic(in, text, strlen(text)) == NEWT_OK;
  snprintf(cmd, sizeof cmd, "promtool check metrics < %s > %s 2>&1", in, out);
  ok = ok && system(cmd) == 0;
  char *o = NULL;
  size_t n = 0;
  if (newt_fs_read_all(out, 1 << 16, &o, &n) == NEWT_OK) snprintf(why, cap, "%s", o);
  free(o);
  unlink(in);
  unlink(out);
  rmdir(dir);
  return ok;
}

/* The value of the first sample line that starts with `series` (name and labels), or NAN. */
static double sample(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (strncmp(p, series, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
  return NAN;
}

static double cpu_used_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* process_*: every family with its HELP and TYPE, values this process has. */
static void test_process(void) {
  metrics_t *m = NULL;
  T_OK(metrics_start("127.0.0.1", 0, NULL, &m));
  if (!m) return;
  /* CPU time, so that the counter has something to count: until the kernel says 50 ms */
  volatile double x = 0;
  while (cpu_used_s() < 0.05) x += 1;
  newt_buf b;
  newt_buf_init(&b);
  T_CHECK(fetch("127.0.0.1", metrics_port(m), "/metrics", &b, 5000) == 200);
  const char *t = b.data ? b.data : "";
  static const char *const types[][2] = {{"process_cpu_seconds_total", "counter"}, {"process_resident_memory_bytes", "gauge"},
                                         {"process_virtual_memory_bytes", "gauge"}, {"process_start_time_seconds", "gauge"},
                                         {"process_open_fds", "gauge"},          {"process_max_fds", "gauge"}};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    char line[128];
    snprintf(line, sizeof line, "# TYPE %s %s\n", types[i][0], types[i][1]);
    T_CHECK_MSG(strstr(t, line), "no \"%s\" in:\n%s", line, t);
    snprintf(line, sizeof line, "# HELP %s ", types[i][0]);
    T_CHECK_MSG(strstr(t, line), "no \"%s\" in:\n%s", line, t);
  }
  double now = (double)newt_wall_ms() / 1e3, start = sample(t, "process_start_time_seconds");
  T_CHECK_MSG(start <= now + 1 && start > now - 86400, "process_start_time_seconds %f, now %f", start, now);
  double rss = sample(t, "process_resident_memory_bytes"), vsz = sample(t, "process_virtual_memory_bytes");
  T_CHECK_MSG(rss > 1e5 && vsz >= rss, "resident %f, virtual %f bytes", rss, vsz);
  double cpu = sample(t, "process_cpu_seconds_total"), used = cpu_used_s();
  T_CHECK_MSG(cpu > 0 && cpu <= used + 0.1, "process_cpu_seconds_total %f, getrusage %f", cpu, used);
  double fds = sample(t, "process_open_fds"), max = sample(t, "process_max_fds");
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  T_CHECK_MSG(fds >= 3 && fds <= max && max == (double)rl.rlim_cur, "open fds %f, max %f (limit %llu)", fds, max,
              (unsigned long long)rl.rlim_cur);
  /* a descriptor opened shows: the count is read at the scrape */
  int extra = open("/dev/null", O_RDONLY);
  newt_buf_reset(&b);
  T_CHECK(fetch("127.0.0.1", metrics_port(m), "/metrics", &b, 5000) == 200);
  double fds2 = sample(b.data ? b.data : "", "process_open_fds");
  T_CHECK_MSG(fds2 >= fds + 1, "process_open_fds %f after opening one more than %f", fds2, fds);
  close(extra);
  char why[1024] = "";
  T_CHECK_MSG(promtool_ok(b.data ? b.data : "", why, sizeof why), "promtool check metrics: %s\n%s", why, b.data);
  newt_buf_free(&b);
  metrics_stop(m);
}

/* Constant labels: on every series (plain, labelled, histogram, process_*), moved when set
 * again (no series of the old value left), escaped, refused when the name is not one. */
static void test_const_labels(void) {
  metrics_t *m = NULL;
  T_OK(metrics_start("127.0.0.1", 0, NULL, &m));
  if (!m) return;
  double bounds[] = {0.1, 1};
  T_OK(metrics_define(m, "newt_worker_step", METRICS_GAUGE, "step"));
  T_OK(metrics_define(m, "newt_build_info", METRICS_GAUGE, "build"));
  T_OK(metrics_define_histogram(m, "newt_worker_step_duration_seconds", 0, bounds, 2, "step time"));
  metrics_set(m, "newt_worker_step", 12);
  metrics_set_l(m, "newt_build_info", "version=\"1\",role=\"worker\"", 1);
  metrics_observe(m, "newt_worker_step_duration_seconds", NULL, 0.5);
  metrics_label l[] = {{"worker", "w0"}, {"rank", "3"}};
  T_OK(metrics_set_const_labels(m, l, 2));
  char *t = metrics_render(m);
  T_CHECK_MSG(t && strstr(t, "\nnewt_worker_step{worker=\"w0\",rank=\"3\"} 12\n"), "%s", t);
  T_CHECK_MSG(t && strstr(t, "\nnewt_build_info{worker=\"w0\",rank=\"3\",version=\"1\",role=\"worker\"} 1\n"), "%s", t);
  T_CHECK_MSG(t && strstr(t, "\nnewt_worker_step_duration_seconds_bucket{worker=\"w0\",rank=\"3\",le=\"1\"} 1\n"), "%s", t);
  T_CHECK_MSG(t && strstr(t, "\nnewt_worker_step_duration_seconds_count{worker=\"w0\",rank=\"3\"} 1\n"), "%s", t);
  T_CHECK_MSG(t && strstr(t, "\nprocess_open_fds{worker=\"w0\",rank=\"3\"} "), "%s", t);
  /* every sample line carries them */
  int lines = 0, bare = 0;
  const char *want = "{worker=\"w0\",rank=\"3\"";
  for (char *p = t; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
    if (*p == '#' || *p == '\n') continue;
    lines++;
    char *end = strchr(p, '\n'), *brace = strchr(p, '{');
    if (!brace || (end && brace > end) || strncmp(brace, want, strlen(want)) != 0) bare++;
  }
  T_CHECK_MSG(lines >= 12 && bare == 0, "%d of %d sample lines lack the constant labels:\n%s", bare, lines, t);
  free(t);
  /* a new rank: every series moves, none of the old rank is left */
  metrics_label l2[] = {{"worker", "w0"}, {"rank", "0"}};
  T_OK(metrics_set_const_labels(m, l2, 2));
  t = metrics_render(m);
  T_CHECK_MSG(t && !strstr(t, "rank=\"3\"") && strstr(t, "\nnewt_worker_step{worker=\"w0\",rank=\"0\"} 12\n"), "%s", t);
  free(t);
  /* escaped: backslash, quote, newline */
  metrics_label odd[] = {{"worker", "a\\b\"c\nd"}, {"rank", ""}};
  T_OK(metrics_set_const_labels(m, odd, 2));
  newt_buf b;
  newt_buf_init(&b);
  T_CHECK(fetch("127.0.0.1", metrics_port(m), "/metrics", &b, 5000) == 200);
  T_CHECK_MSG(b.data && strstr(b.data, "\nnewt_worker_step{worker=\"a\\\\b\\\"c\\nd\",rank=\"\"} 12\n"), "%s", b.data);
  char why[1024] = "";
  T_CHECK_MSG(promtool_ok(b.data ? b.data : "", why, sizeof why), "promtool check metrics: %s\n%s", why, b.data);
  /* refused: not label names, or too long; the set in force stays */
  metrics_label bad[][1] = {{{"9rank", "x"}}, {{"le", "x"}}, {{"__name__", "x"}}, {{"ra-nk", "x"}}, {{"", "x"}}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) T_ERR(NEWT_ERR_INVALID, metrics_set_const_labels(m, bad[i], 1));
  char longv[300];
  memset(longv, 'x', sizeof longv - 1);
  longv[sizeof longv - 1] = '\0';
  metrics_label big[] = {{"worker", longv}};
  T_ERR(NEWT_ERR_INVALID, metrics_set_const_labels(m, big, 1));
  t = metrics_render(m);
  T_CHECK_MSG(t && strstr(t, "rank=\"\"") && !strstr(t, "xxxxxxxx"), "%s", t);
  free(t);
  /* none again */
  T_OK(metrics_set_const_labels(m, NULL, 0));
  t = metrics_render(m);
  T_CHECK_MSG(t && strstr(t, "\nnewt_worker_step 12\n") && !strstr(t, "worker=\""), "%s", t);
  free(t);
  T_OK(metrics_set_const_labels(NULL, l, 2)); /* no server: nothing to do */
  newt_buf_free(&b);
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

/* A slow client from 127.0.0.<host>: connected, its request begun and never ended (the
 * headers' blank line never comes); -1 when it cannot connect. */
static int slow_client(int host, int port) {
  struct sockaddr_in from = {.sin_family = AF_INET}, to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  char ip[32];
  snprintf(ip, sizeof ip, "127.0.0.%d", host);
  inet_pton(AF_INET, ip, &from.sin_addr);
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  static const char part[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
  if (bind(fd, (struct sockaddr *)&from, sizeof from) != 0 || connect(fd, (struct sockaddr *)&to, sizeof to) != 0 ||
      send(fd, part, sizeof part - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof part - 1)) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Issue 37, item 5: slow clients from 16 addresses, 8 from each (the most one address may
 * hold), each holding a partial request: 128 connections tried, twice what the endpoint
 * holds. /healthz from 127.0.0.1 must be answered, five times over, the slow clients
 * connecting again before each probe in place of whatever the server closed. The idle
 * timeout is made long: these clients stand for ones that send a byte before each timeout
 * (a trickled request is never idle). Before, the first 64 filled the table, libmicrohttpd
 * stopped accepting, and every probe waited behind them unanswered. */
static void test_slow_clients(void) {
  metrics_t *m = NULL;
  metrics_limits lim = {.timeout_s = 3600};
  T_OK(metrics_start("127.0.0.1", 0, &lim, &m));
  if (!m) return;
  int port = metrics_port(m);
  enum { ADDRS = 16, PER = 8, PROBES = 5 };
  int fds[ADDRS][PER];
  memset(fds, -1, sizeof fds);
  for (int probe = 0; probe < PROBES; probe++) {
    int held = 0;
    for (int a = 0; a < ADDRS; a++)
      for (int k = 0; k < PER; k++) {
        char c;
        ssize_t n = fds[a][k] >= 0 ? recv(fds[a][k], &c, 1, MSG_DONTWAIT) : -1;
        if (fds[a][k] >= 0 && (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK))) { /* closed by the server */
          close(fds[a][k]);
          fds[a][k] = -1;
        }
        if (fds[a][k] < 0) fds[a][k] = slow_client(10 + a, port);
        held += fds[a][k] >= 0;
      }
    T_CHECK_MSG(held > 64, "only %d slow clients connected", held);
    newt_buf b;
    newt_buf_init(&b);
    long code = fetch("127.0.0.1", port, "/healthz", &b, 20000);
    T_CHECK_MSG(code == 200 && b.data && strcmp(b.data, "ok\n") == 0, "probe %d with %d slow clients: HTTP %ld", probe,
                held, code);
    newt_buf_free(&b);
  }
  for (int a = 0; a < ADDRS; a++)
    for (int k = 0; k < PER; k++)
      if (fds[a][k] >= 0) close(fds[a][k]);
  metrics_stop(m);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  T_RUN(test_format);
  T_RUN(test_scrape);
  T_RUN(test_process);
  T_RUN(test_const_labels);
  T_RUN(test_two_addresses);
  T_RUN(test_held_connections);
  T_RUN(test_slow_clients);
  curl_global_cleanup();
  return T_DONE();
}
