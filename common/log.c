/* Levelled, per-subsystem logging configured from the environment (see log.h).
 * Configuration is read once, on first use; each line is formatted into one buffer and
 * written with a single write(2) so lines of concurrent threads and processes sharing a
 * file do not interleave. */
#include "log.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_level = NEWT_LOG_WARN;
static int log_subsys = NEWT_SUBSYS_ALL;
static int log_fd = 2;
static char log_name[48] = "newt";
static int log_json;
static int log_level_from_env;

static const struct {
  const char *name;
  int bit;
} subsys_names[] = {
    {"COMMON", NEWT_SUBSYS_COMMON}, {"RDZV", NEWT_SUBSYS_RDZV},     {"COMM", NEWT_SUBSYS_COMM},
    {"MODEL", NEWT_SUBSYS_MODEL},   {"CKPT", NEWT_SUBSYS_CKPT},     {"COORD", NEWT_SUBSYS_COORD},
    {"WORKER", NEWT_SUBSYS_WORKER}, {"CLI", NEWT_SUBSYS_CLI},       {"BENCH", NEWT_SUBSYS_BENCH},
    {"JOB", NEWT_SUBSYS_JOB},
    {"ALL", NEWT_SUBSYS_ALL},
};

static const char *const level_names[] = {"NONE", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"};

static int parse_level(const char *s) {
  for (int i = 0; i <= NEWT_LOG_TRACE; i++)
    if (strcasecmp(s, level_names[i]) == 0) return i;
  return -1;
}

static void parse_subsys(const char *s) {
  int invert = s[0] == '^';
  if (invert) s++;
  int mask = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int known = 0;
    for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
      if (strcasecmp(tok, subsys_names[i].name) == 0) mask |= subsys_names[i].bit, known = 1;
    if (!known)
      fprintf(stderr, "newt: NEWT_DEBUG_SUBSYS: %s is not one of COMMON, RDZV, COMM, MODEL, CKPT, COORD, WORKER, "
                      "CLI, BENCH, JOB, ALL\n", tok);
  }
  log_subsys = invert ? ~mask : mask;
}

static void log_init(void) {
  const char *lvl = getenv("NEWT_DEBUG");
  if (lvl && *lvl) {
    int l = parse_level(lvl);
    if (l >= 0) log_level = l, log_level_from_env = 1;
    else fprintf(stderr, "newt: NEWT_DEBUG=%s is not one of ERROR, WARN, INFO, DEBUG, TRACE\n", lvl);
  }
  const char *fmt = getenv("NEWT_LOG_FORMAT");
  if (fmt && strcasecmp(fmt, "json") == 0) log_json = 1;
  else if (fmt && *fmt && strcasecmp(fmt, "text") != 0)
    fprintf(stderr, "newt: NEWT_LOG_FORMAT=%s is not text or json\n", fmt);
  const char *sub = getenv("NEWT_DEBUG_SUBSYS");
  if (sub && *sub) parse_subsys(sub);
  const char *file = getenv("NEWT_DEBUG_FILE");
  if (file && *file) {
    char path[512];
    size_t o = 0;
    for (const char *p = file; *p && o + 16 < sizeof path; p++) {
      if (p[0] == '%' && p[1] == 'p') {
        o += (size_t)snprintf(path + o, sizeof path - o, "%d", (int)getpid());
        p++;
      } else {
        path[o++] = *p;
      }
    }
    path[o] = '\0';
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) log_fd = fd;
  }
}

int newt_log_enabled(newt_log_level level, int subsys) {
  pthread_once(&log_once, log_init);
  return (int)level <= log_level && (subsys & log_subsys);
}

void newt_log_set_name(const char *name) { snprintf(log_name, sizeof log_name, "%s", name); }

void newt_log_set_level(newt_log_level level) {
  pthread_once(&log_once, log_init);
  log_level = (int)level;
}

void newt_log_set_default_level(newt_log_level level) {
  pthread_once(&log_once, log_init);
  if (!log_level_from_env) log_level = (int)level;
}

static const char *subsys_name(int subsys) {
  for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
    if (subsys_names[i].bit == subsys) return subsys_names[i].name;
  return "?";
}

/* s as the inside of a JSON string into out; returns the bytes written. */
static size_t json_escape(const char *s, char *out, size_t cap) {
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p && o + 7 < cap; p++) {
    if (*p == '"' || *p == '\\') out[o++] = '\\', out[o++] = (char)*p;
    else if (*p == '\n') out[o++] = '\\', out[o++] = 'n';
    else if (*p < 0x20) o += (size_t)snprintf(out + o, cap - o, "\\u%04x", *p);
    else out[o++] = (char)*p;
  }
  out[o] = '\0';
  return o;
}

void newt_log(newt_log_level level, int subsys, const char *file, int line, const char *fmt, ...) {
  char msg[1800], buf[8192], ts[40];
  struct timeval tv;
  gettimeofday(&tv, NULL);
  struct tm tm;
  gmtime_r(&tv.tv_sec, &tm);
  size_t tl = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(ts + tl, sizeof ts - tl, ".%03dZ", (int)(tv.tv_usec / 1000) % 1000);
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int n;
  if (log_json) {
    char emsg[sizeof msg * 2], ename[sizeof log_name * 2];
    json_escape(msg, emsg, sizeof emsg);
    json_escape(log_name, ename, sizeof ename);
    n = snprintf(buf, sizeof buf, "{\"time\":\"%s\",\"level\":\"%s\",\"subsys\":\"%s\",\"name\":\"%s\",\"pid\":%d,"
                 "\"src\":\"%s:%d\",\"msg\":\"%s\"}", ts, level_names[level], subsys_name(subsys), ename,
                 (int)getpid(), base, line, emsg);
  } else {
    n = snprintf(buf, sizeof buf, "%s %s[%d] %s %s %s:%d %s", ts, log_name, (int)getpid(), level_names[level],
                 subsys_name(subsys), base, line, msg);
  }
  if (n < 0) return;
  if ((size_t)n >= sizeof buf - 1) n = (int)sizeof buf - 2;
  buf[n++] = '\n';
  ssize_t w = write(log_fd, buf, (size_t)n);
  (void)w;
}
