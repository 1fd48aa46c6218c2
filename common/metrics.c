/* The metrics registry and its HTTP endpoint (see metrics.h). Small fixed tables under
 * one mutex: a process exports a few dozen series, scraped every few seconds. The
 * process_* families are not in the tables: a scrape reads them from /proc as it renders. */
#include "common/metrics.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <math.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/strutil.h"

#define METRICS_FAMILIES 64
#define METRICS_SERIES 512
#define METRICS_BUCKETS 16
#define METRICS_DAEMONS 4
#define METRICS_CONST_LABELS 256

typedef struct family {
  char name[64];
  char help[200];
  metrics_kind kind;
  int group;
  int nb;
  double bounds[METRICS_BUCKETS];
} family;

typedef struct series {
  int fam;
  char labels[96];
  double value; /* gauge, counter; a histogram's sum */
  double count;
  double buckets[METRICS_BUCKETS]; /* per bound, not cumulative */
} series;

/* A connection a listener holds, oldest first (see on_connection). */
typedef struct held {
  int fd;
  int evicted; /* shut down to make room: closed by libmicrohttpd at its next look */
  struct held *prev, *next;
} held;

/* One address's daemon and the connections it holds. Only its daemon's thread touches it. */
typedef struct listener {
  struct MHD_Daemon *daemon;
  held *oldest, *newest;
  int n;     /* held and not evicted */
  int limit; /* metrics_limits.total */
} listener;

struct metrics {
  listener ls[METRICS_DAEMONS];
  int ndaemons;
  int port;
  pthread_mutex_t mu;
  int nf, ns;
  family f[METRICS_FAMILIES];
  series s[METRICS_SERIES];
  unsigned hidden; /* bit g: group g is hidden */
  char const_labels[METRICS_CONST_LABELS]; /* rendered (name="value",...), before each series' own */
  char note[256];
  metrics_health_fn health;
  void *health_ud;
};

char *metrics_fmt_value(double v, char *out, size_t cap) {
  if (isnan(v)) snprintf(out, cap, "NaN");
  else if (isinf(v)) snprintf(out, cap, v > 0 ? "+Inf" : "-Inf");
  else if (v == floor(v) && fabs(v) < 1e15) snprintf(out, cap, "%.0f", v);
  else snprintf(out, cap, "%.15g", v); /* 15 digits: the noise of binary fractions stays out */
  return out;
}

static void render_series(newt_buf *b, const family *f, const series *s, const char *const_labels) {
  char v[40], le[40], labels[METRICS_CONST_LABELS + sizeof s->labels + 2];
  /* the whole label set: the constant labels, then the series' own */
  snprintf(labels, sizeof labels, "%s%s%s", const_labels, const_labels[0] && s->labels[0] ? "," : "", s->labels);
  const char *open = labels[0] ? "{" : "", *close = labels[0] ? "}" : "", *sep = labels[0] ? "," : "";
  if (f->kind != METRICS_HISTOGRAM) {
    newt_buf_printf(b, "%s%s%s%s %s\n", f->name, open, labels, close, metrics_fmt_value(s->value, v, sizeof v));
    return;
  }
  double cum = 0;
  for (int i = 0; i < f->nb; i++) {
    cum += s->buckets[i];
    newt_buf_printf(b, "%s_bucket{%s%sle=\"%s\"} %s\n", f->name, labels, sep,
                    metrics_fmt_value(f->bounds[i], le, sizeof le), metrics_fmt_value(cum, v, sizeof v));
  }
  newt_buf_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %s\n", f->name, labels, sep, metrics_fmt_value(s->count, v, sizeof v));
  newt_buf_printf(b, "%s_sum%s%s%s %s\n", f->name, open, labels, close, metrics_fmt_value(s->value, v, sizeof v));
  newt_buf_printf(b, "%s_count%s%s%s %s\n", f->name, open, labels, close, metrics_fmt_value(s->count, v, sizeof v));
}

/* The process_* families of the Prometheus clients, read from /proc at each scrape; one
 * that cannot be read here (NAN) is left out. */
enum { PROC_CPU, PROC_RSS, PROC_VSIZE, PROC_START, PROC_OPEN_FDS, PROC_MAX_FDS, PROC_N };

static const struct {
  const char *name, *type, *help;
} proc_families[PROC_N] = {
    {"process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds."},
    {"process_resident_memory_bytes", "gauge", "Resident memory size in bytes."},
    {"process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes."},
    {"process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds."},
    {"process_open_fds", "gauge", "Number of open file descriptors."},
    {"process_max_fds", "gauge", "Maximum number of open file descriptors."},
};

static double boot_time_s(void) {
  FILE *f = fopen("/proc/stat", "r");
  if (!f) return NAN;
  char line[256];
  double bt = NAN;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "btime ", 6) == 0) {
      bt = strtod(line + 6, NULL);
      break;
    }
  fclose(f);
  return bt;
}

static void read_proc(double v[PROC_N]) {
  for (int i = 0; i < PROC_N; i++) v[i] = NAN;
  long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
  char text[1024];
  FILE *f = fopen("/proc/self/stat", "r");
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  if (f) fclose(f);
  text[n] = '\0';
  /* pid (comm) state ...: comm may hold spaces and parentheses, so fields count from the
     last ')': utime and stime are fields 14 and 15, starttime 22, vsize 23, rss 24 (proc(5)) */
  const char *rest = strrchr(text, ')');
  unsigned long utime, stime, vsize;
  unsigned long long start;
  long rss;
  if (rest && tick > 0 &&
      sscanf(rest + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %*d %*d %*d %*d %*d %*d %llu %lu %ld", &utime,
             &stime, &start, &vsize, &rss) == 5) {
    v[PROC_CPU] = (double)(utime + stime) / (double)tick;
    v[PROC_VSIZE] = (double)vsize;
    v[PROC_RSS] = (double)rss * (double)page;
    v[PROC_START] = boot_time_s() + (double)start / (double)tick;
  }
  DIR *d = opendir("/proc/self/fd");
  if (d) {
    int fds = 0;
    for (struct dirent *e; (e = readdir(d));) fds += e->d_name[0] != '.';
    closedir(d);
    v[PROC_OPEN_FDS] = fds; /* counts the descriptor that reads the folder too, as the Go client does */
  }
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) v[PROC_MAX_FDS] = (double)rl.rlim_cur;
}

static void render_process(newt_buf *b, const double v[PROC_N], const char *const_labels) {
  const char *open = const_labels[0] ? "{" : "", *close = const_labels[0] ? "}" : "";
  for (int i = 0; i < PROC_N; i++) {
    char val[40];
    if (isnan(v[i])) continue;
    const char *name = proc_families[i].name;
    newt_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s%s%s%s %s\n", name, proc_families[i].help, name,
                    proc_families[i].type, name, open, const_labels, close, metrics_fmt_value(v[i], val, sizeof val));
  }
}

char *metrics_render(metrics_t *mt) {
  static const char *const kinds[] = {"gauge", "counter", "histogram"};
  double proc[PROC_N];
  read_proc(proc);
  newt_buf b;
  newt_buf_init(&b);
  pthread_mutex_lock(&mt->mu);
  if (mt->note[0]) newt_buf_printf(&b, "# %s\n", mt->note);
  for (int i = 0; i < mt->nf; i++) {
    const family *f = &mt->f[i];
    if (f->group < 32 && (mt->hidden >> f->group) & 1) continue;
    newt_buf_printf(&b, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name, kinds[f->kind]);
    for (int k = 0; k < mt->ns; k++)
      if (mt->s[k].fam == i) render_series(&b, f, &mt->s[k], mt->const_labels);
  }
  render_process(&b, proc, mt->const_labels);
  pthread_mutex_unlock(&mt->mu);
  if (!b.data) newt_buf_append(&b, "", 0);
  return b.data;
}

static struct MHD_Response *text_response(const char *msg) {
  return MHD_create_response_from_buffer(strlen(msg), (void *)msg, MHD_RESPMEM_MUST_COPY);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size,
                                  void **req_cls) {
  metrics_t *mt = cls;
  struct MHD_Response *resp;
  unsigned status = MHD_HTTP_OK;
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
    resp = text_response("only GET\n");
    status = MHD_HTTP_METHOD_NOT_ALLOWED;
  } else if (strcmp(url, "/metrics") == 0) {
    char *text = metrics_render(mt);
    if (!text) return MHD_NO;
    resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (resp) MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4");
  } else if (strcmp(url, "/healthz") == 0) {
    char why[256] = "ok";
    pthread_mutex_lock(&mt->mu);
    metrics_health_fn fn = mt->health;
    void *ud = mt->health_ud;
    pthread_mutex_unlock(&mt->mu);
    int ok = fn ? fn(ud, why, sizeof why) : 1;
    char msg[300];
    snprintf(msg, sizeof msg, "%s\n", ok ? "ok" : why);
    resp = text_response(msg);
    if (!ok) status = MHD_HTTP_SERVICE_UNAVAILABLE;
  } else {
    resp = text_response("not found: try /metrics or /healthz\n");
    status = MHD_HTTP_NOT_FOUND;
  }
  if (!resp) return MHD_NO;
  enum MHD_Result r = MHD_queue_response(conn, status, resp);
  MHD_destroy_response(resp);
  return r;
}

/* What the endpoint complains of (a refused connection, a full table, a connection closed
 * for a new one): at most one line every 10 s, with the count of those not shown, so a
 * flood cannot fill the log. */
static void vlog_limited(const char *fmt, va_list ap) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  static uint64_t last;
  static long suppressed;
  uint64_t now = newt_now_ns();
  pthread_mutex_lock(&mu);
  if (last && now - last < 10000000000ull) {
    suppressed++;
    pthread_mutex_unlock(&mu);
    return;
  }
  long n = suppressed;
  suppressed = 0;
  last = now;
  pthread_mutex_unlock(&mu);
  char msg[256];
  vsnprintf(msg, sizeof msg, fmt, ap);
  size_t len = strlen(msg);
  while (len && (msg[len - 1] == '\n' || msg[len - 1] == '\r')) msg[--len] = '\0';
  NEWT_WARN(COMMON, "metrics endpoint: %s (%ld more such messages in the last 10 s)", msg, n);
}

static void log_limited(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void log_limited(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog_limited(fmt, ap);
  va_end(ap);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  vlog_limited(fmt, ap);
}

/* Room for a new connection, whatever slow clients hold (issue 37, item 5). At its limit
 * libmicrohttpd stops accepting (new connections wait in the kernel's queue until one it
 * holds closes): 8 addresses holding 8 partial requests each (a byte every few seconds
 * defeats its idle timeout) kept every /healthz probe out. So its own limit is `total` plus
 * a reserve, and this listener holds `total`: a connection that
 * comes when all are held shuts down the oldest one (its request unfinished or its reply
 * unread for longest), which libmicrohttpd then closes. A probe sends its request at once,
 * so it is answered unless `total` newer connections come before its request does. Called
 * on the daemon's one thread, before a connection is served and when it is closed (before
 * its socket is: the descriptor shut down is still its own). */
#define METRICS_RESERVE 16

static void on_connection(void *cls, struct MHD_Connection *conn, void **ctx, enum MHD_ConnectionNotificationCode toe) {
  listener *l = cls;
  if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
    held *h = *ctx;
    if (!h) return;
    if (h->prev) h->prev->next = h->next;
    else l->oldest = h->next;
    if (h->next) h->next->prev = h->prev;
    else l->newest = h->prev;
    if (!h->evicted) l->n--;
    free(h);
    *ctx = NULL;
    return;
  }
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  held *h = ci ? calloc(1, sizeof *h) : NULL;
  if (!h) return; /* not counted: the reserve covers it */
  h->fd = ci->connect_fd;
  if (l->n >= l->limit) {
    held *o = l->oldest;
    while (o && o->evicted) o = o->next;
    if (o) {
      shutdown(o->fd, SHUT_RDWR);
      o->evicted = 1;
      l->n--;
      log_limited("%d connections held: the oldest was closed for a new one (slow clients?)", l->limit);
    }
  }
  h->prev = l->newest;
  if (l->newest) l->newest->next = h;
  else l->oldest = h;
  l->newest = h;
  l->n++;
  *ctx = h;
}

static newt_result_t start_one(metrics_t *mt, const char *addr, int port, const metrics_limits *l) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
    return NEWT_ERR(NEWT_ERR_INVALID, "--metrics-addr: \"%s\" is not an IPv4 address", addr);
  listener *ls = &mt->ls[mt->ndaemons];
  *ls = (listener){.limit = l->total};
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG, (uint16_t)port, NULL, NULL, on_request, mt,
      MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL, MHD_OPTION_SOCK_ADDR, &sa,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)(l->total + METRICS_RESERVE), MHD_OPTION_NOTIFY_CONNECTION, on_connection, ls,
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)l->per_ip, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)l->timeout_s,
      MHD_OPTION_END);
  if (!d) return NEWT_ERR(NEWT_ERR_SYS, "metrics: cannot serve on %s:%d (port in use?)", addr, port);
  ls->daemon = d;
  mt->ndaemons++;
  if (!mt->port) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    mt->port = info ? info->port : port;
  }
  return NEWT_OK;
}

newt_result_t metrics_start(const char *addrs, int port, const metrics_limits *limits, metrics_t **out) {
  metrics_limits l = limits ? *limits : (metrics_limits){0};
  if (l.per_ip <= 0) l.per_ip = 8;
  if (l.total <= 0) l.total = 64;
  if (l.timeout_s <= 0) l.timeout_s = 5;
  metrics_t *mt = calloc(1, sizeof *mt);
  NEWT_CHECK_ALLOC(mt);
  pthread_mutex_init(&mt->mu, NULL);
  char list[256];
  snprintf(list, sizeof list, "%s", addrs && *addrs ? addrs : "127.0.0.1");
  newt_result_t r = NEWT_OK;
  for (char *save = NULL, *a = strtok_r(list, ",", &save); a && r == NEWT_OK; a = strtok_r(NULL, ",", &save)) {
    if (mt->ndaemons == METRICS_DAEMONS)
      r = NEWT_ERR(NEWT_ERR_INVALID, "--metrics-addr: at most %d addresses", METRICS_DAEMONS);
    else
      r = start_one(mt, a, mt->port ? mt->port : port, &l);
  }
  if (r == NEWT_OK && !mt->ndaemons) r = NEWT_ERR(NEWT_ERR_INVALID, "--metrics-addr: no address in \"%s\"", addrs);
  if (r != NEWT_OK) {
    metrics_stop(mt);
    return r;
  }
  *out = mt;
  return NEWT_OK;
}

int metrics_port(const metrics_t *mt) { return mt->port; }

static int find_family(const metrics_t *mt, const char *name) {
  for (int i = 0; i < mt->nf; i++)
    if (strcmp(mt->f[i].name, name) == 0) return i;
  return -1;
}

/* The series of family fam with labels, created when new (-1: the table is full). */
static int find_series(metrics_t *mt, int fam, const char *labels) {
  if (!labels) labels = "";
  for (int k = 0; k < mt->ns; k++)
    if (mt->s[k].fam == fam && strcmp(mt->s[k].labels, labels) == 0) return k;
  if (mt->ns == METRICS_SERIES || strlen(labels) >= sizeof mt->s[0].labels) return -1;
  if (labels[0]) /* a labelled family: the unlabelled series made at its definition goes, unless set */
    for (int k = 0; k < mt->ns; k++)
      if (mt->s[k].fam == fam && !mt->s[k].labels[0] && mt->s[k].value == 0) {
        memmove(&mt->s[k], &mt->s[k + 1], (size_t)(mt->ns - k - 1) * sizeof mt->s[0]);
        mt->ns--;
        break;
      }
  series *s = &mt->s[mt->ns];
  memset(s, 0, sizeof *s);
  s->fam = fam;
  snprintf(s->labels, sizeof s->labels, "%s", labels);
  return mt->ns++;
}

static newt_result_t define(metrics_t *mt, const char *name, metrics_kind kind, int group, const double *bounds, int nb,
                            const char *help) {
  if (!mt) return NEWT_OK;
  if (nb > METRICS_BUCKETS) return NEWT_ERR(NEWT_ERR_INTERNAL, "metrics: %s has more than %d buckets", name, METRICS_BUCKETS);
  pthread_mutex_lock(&mt->mu);
  newt_result_t r = NEWT_OK;
  if (find_family(mt, name) < 0) {
    if (mt->nf == METRICS_FAMILIES) {
      r = NEWT_ERR(NEWT_ERR_INTERNAL, "metrics: more than %d metrics", METRICS_FAMILIES);
    } else {
      family *f = &mt->f[mt->nf];
      memset(f, 0, sizeof *f);
      snprintf(f->name, sizeof f->name, "%s", name);
      snprintf(f->help, sizeof f->help, "%s", help);
      f->kind = kind;
      f->group = group;
      f->nb = nb;
      for (int i = 0; i < nb; i++) f->bounds[i] = bounds[i];
      mt->nf++;
      if (kind != METRICS_HISTOGRAM) find_series(mt, mt->nf - 1, NULL);
    }
  }
  pthread_mutex_unlock(&mt->mu);
  return r;
}

newt_result_t metrics_define(metrics_t *mt, const char *name, metrics_kind kind, const char *help) {
  return define(mt, name, kind, 0, NULL, 0, help);
}

newt_result_t metrics_define_group(metrics_t *mt, const char *name, metrics_kind kind, int group, const char *help) {
  return define(mt, name, kind, group, NULL, 0, help);
}

newt_result_t metrics_define_histogram(metrics_t *mt, const char *name, int group, const double *bounds, int n,
                                       const char *help) {
  return define(mt, name, METRICS_HISTOGRAM, group, bounds, n, help);
}

typedef enum { OP_SET, OP_ADD, OP_OBSERVE } op_kind;

static void update(metrics_t *mt, const char *name, const char *labels, double v, op_kind op) {
  if (!mt) return;
  pthread_mutex_lock(&mt->mu);
  int f = find_family(mt, name);
  int k = f >= 0 ? find_series(mt, f, labels) : -1;
  if (k >= 0) {
    series *s = &mt->s[k];
    const family *fam = &mt->f[f];
    if (fam->kind == METRICS_HISTOGRAM) {
      if (op == OP_OBSERVE) {
        s->value += v;
        s->count += 1;
        for (int i = 0; i < fam->nb; i++)
          if (v <= fam->bounds[i]) {
            s->buckets[i] += 1;
            break;
          }
      }
    } else {
      s->value = op == OP_SET ? v : s->value + v;
    }
  }
  pthread_mutex_unlock(&mt->mu);
}

void metrics_set(metrics_t *mt, const char *name, double v) { update(mt, name, NULL, v, OP_SET); }
void metrics_add(metrics_t *mt, const char *name, double d) { update(mt, name, NULL, d, OP_ADD); }
void metrics_set_l(metrics_t *mt, const char *name, const char *labels, double v) { update(mt, name, labels, v, OP_SET); }
void metrics_add_l(metrics_t *mt, const char *name, const char *labels, double d) { update(mt, name, labels, d, OP_ADD); }
void metrics_observe(metrics_t *mt, const char *name, const char *labels, double v) {
  update(mt, name, labels, v, OP_OBSERVE);
}

/* A label name of the exposition format: [a-zA-Z_][a-zA-Z0-9_]*, not reserved ("__" names,
 * a histogram's le). */
static int label_name_ok(const char *n) {
  if (!n || !*n || strncmp(n, "__", 2) == 0 || strcmp(n, "le") == 0) return 0;
  for (const char *c = n; *c; c++) {
    int alpha = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '_';
    if (!alpha && !(c > n && *c >= '0' && *c <= '9')) return 0;
  }
  return 1;
}

newt_result_t metrics_set_const_labels(metrics_t *mt, const metrics_label *labels, int n) {
  if (!mt) return NEWT_OK;
  newt_buf b;
  newt_buf_init(&b);
  newt_buf_append(&b, "", 0);
  for (int i = 0; i < n; i++) {
    if (!label_name_ok(labels[i].name)) {
      newt_buf_free(&b);
      return NEWT_ERR(NEWT_ERR_INVALID, "metrics: \"%s\" is not a label name", labels[i].name ? labels[i].name : "");
    }
    newt_buf_printf(&b, "%s%s=\"", i ? "," : "", labels[i].name);
    /* the exposition format's escapes in a label value: backslash, double quote, newline */
    for (const char *c = labels[i].value ? labels[i].value : ""; *c; c++) {
      if (*c == '\\' || *c == '"') newt_buf_printf(&b, "\\%c", *c);
      else if (*c == '\n') newt_buf_append(&b, "\\n", 2);
      else newt_buf_append(&b, c, 1);
    }
    newt_buf_append(&b, "\"", 1);
  }
  newt_result_t r = NEWT_OK;
  if (!b.data) r = NEWT_ERR(NEWT_ERR_NOMEM, "metrics: out of memory");
  else if (b.len >= METRICS_CONST_LABELS)
    r = NEWT_ERR(NEWT_ERR_INVALID, "metrics: constant labels of %zu bytes (at most %d): %.60s...", b.len,
                 METRICS_CONST_LABELS - 1, b.data);
  if (r == NEWT_OK) {
    pthread_mutex_lock(&mt->mu);
    snprintf(mt->const_labels, sizeof mt->const_labels, "%s", b.data);
    pthread_mutex_unlock(&mt->mu);
  }
  newt_buf_free(&b);
  return r;
}

void metrics_show_group(metrics_t *mt, int group, int shown) {
  if (!mt || group < 0 || group >= 32) return;
  pthread_mutex_lock(&mt->mu);
  if (shown) mt->hidden &= ~(1u << group);
  else mt->hidden |= 1u << group;
  pthread_mutex_unlock(&mt->mu);
}

void metrics_set_note(metrics_t *mt, const char *note) {
  if (!mt) return;
  pthread_mutex_lock(&mt->mu);
  snprintf(mt->note, sizeof mt->note, "%s", note ? note : "");
  pthread_mutex_unlock(&mt->mu);
}

void metrics_set_health(metrics_t *mt, metrics_health_fn fn, void *ud) {
  if (!mt) return;
  pthread_mutex_lock(&mt->mu);
  mt->health = fn;
  mt->health_ud = ud;
  pthread_mutex_unlock(&mt->mu);
}

void metrics_stop(metrics_t *mt) {
  if (!mt) return;
  for (int i = 0; i < mt->ndaemons; i++) MHD_stop_daemon(mt->ls[i].daemon); /* closes (and frees) what each holds */
  pthread_mutex_destroy(&mt->mu);
  free(mt);
}
