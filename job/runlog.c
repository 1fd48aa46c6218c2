/* The step log and the event log of a run (see runlog.h): appending a record as one line
 * in one write, reading every line back through its codec, and stitching the step log's
 * lines into one history. */
#include "job/runlog.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs.h"

#define RUNLOG_MAX_BYTES ((size_t)1 << 30) /* a million steps take about 200 MB */

newt_result_t job_runlog_open(const char *path, int truncate, int *fd) {
  char dir[4096];
  newt_fs_dirname(path, dir, sizeof dir);
  NEWT_CHECK(newt_fs_mkdirs(dir, 0755)); /* a fresh volume's runs/<job>/ */
  return job_runlog_open_at(AT_FDCWD, NULL, path, truncate, fd);
}

newt_result_t job_runlog_open_at(int dirfd, const char *dir, const char *name, int truncate, int *fd) {
  int f = openat(dirfd, name, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | (truncate ? O_TRUNC : 0),
                 0644);
  if (f < 0)
    return NEWT_ERR(NEWT_ERR_SYS, "%s%s%s: cannot open it for appending: %s", dir ? dir : "", dir ? "/" : "", name,
                    errno == ELOOP ? "it is a symbolic link, not followed" : strerror(errno));
  *fd = f;
  return NEWT_OK;
}

/* text and a newline in one write, so two writers' lines never interleave. */
static newt_result_t append_line(int fd, char *text) {
  if (!text) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing a log line");
  size_t len = strlen(text);
  char *line = realloc(text, len + 2);
  if (!line) {
    free(text);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing a log line");
  }
  line[len] = '\n';
  line[len + 1] = '\0';
  ssize_t w;
  do w = write(fd, line, len + 1);
  while (w < 0 && errno == EINTR);
  int e = errno;
  free(line);
  if (w < 0) return NEWT_ERR(e == ENOSPC ? NEWT_ERR_NOSPACE : NEWT_ERR_SYS, "writing a log line: %s", strerror(e));
  if ((size_t)w != len + 1) return NEWT_ERR(NEWT_ERR_SYS, "writing a log line: %zd of %zu bytes", w, len + 1);
  return NEWT_OK;
}

newt_result_t job_steplog_append(int fd, const job_step *s) { return append_line(fd, job_step_to_json(s)); }

newt_result_t job_eventlog_append(int fd, const job_event *e) { return append_line(fd, job_event_to_json(e)); }

/* Calls take(ud, line, len) for every complete non-empty line of path; stops at the first
 * failure, naming path and the line number. */
typedef newt_result_t (*line_fn)(void *ud, const char *line, size_t len);

static newt_result_t each_line(const char *path, line_fn take, void *ud, size_t *torn) {
  char *text = NULL;
  size_t len = 0;
  if (torn) *torn = 0;
  NEWT_CHECK(newt_fs_read_all(path, RUNLOG_MAX_BYTES, &text, &len));
  newt_result_t r = NEWT_OK;
  size_t lineno = 0;
  for (size_t at = 0; at < len && r == NEWT_OK;) {
    const char *nl = memchr(text + at, '\n', len - at);
    lineno++;
    if (!nl) { /* a writer died in the middle of its last line */
      if (torn) (*torn)++;
      break;
    }
    size_t n = (size_t)(nl - (text + at));
    if (n > 0 && (r = take(ud, text + at, n)) != NEWT_OK) r = newt_err_wrap(r, "%s line %zu: ", path, lineno);
    at += n + 1;
  }
  free(text);
  return r;
}

typedef struct grow {
  void *items;
  size_t n, cap, size;
} grow;

static void *grow_next(grow *g) {
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 256;
    void *p = realloc(g->items, cap * g->size);
    if (!p) return NULL;
    g->items = p;
    g->cap = cap;
  }
  return (char *)g->items + g->n * g->size;
}

static newt_result_t take_step(void *ud, const char *line, size_t len) {
  grow *g = ud;
  job_step *s = grow_next(g);
  if (!s) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory reading a step log");
  NEWT_CHECK(job_step_from_json(line, len, s));
  g->n++;
  return NEWT_OK;
}

static newt_result_t take_event(void *ud, const char *line, size_t len) {
  grow *g = ud;
  job_event *e = grow_next(g);
  if (!e) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory reading an event log");
  NEWT_CHECK(job_event_from_json(line, len, e));
  g->n++;
  return NEWT_OK;
}

newt_result_t job_steplog_read(const char *path, job_step **out, size_t *n, size_t *torn) {
  grow g = {.size = sizeof(job_step)};
  newt_result_t r = each_line(path, take_step, &g, torn);
  if (r != NEWT_OK) {
    free(g.items);
    return r;
  }
  *out = g.items;
  *n = g.n;
  return NEWT_OK;
}

newt_result_t job_eventlog_read(const char *path, job_event **out, size_t *n, size_t *torn) {
  grow g = {.size = sizeof(job_event)};
  newt_result_t r = each_line(path, take_event, &g, torn);
  if (r != NEWT_OK) {
    job_eventlog_free(g.items, g.n);
    return r;
  }
  *out = g.items;
  *n = g.n;
  return NEWT_OK;
}

void job_eventlog_free(job_event *e, size_t n) {
  for (size_t i = 0; e && i < n; i++) job_event_free(&e[i]);
  free(e);
}

/* --- stitching ------------------------------------------------------------------------------ */

typedef struct ranked {
  job_step s;
  size_t line; /* file order, for ties */
} ranked;

static int by_step_gen_line(const void *a, const void *b) {
  const ranked *x = a, *y = b;
  if (x->s.step != y->s.step) return x->s.step < y->s.step ? -1 : 1;
  if (x->s.generation != y->s.generation) return x->s.generation < y->s.generation ? -1 : 1;
  if (x->s.restarts != y->s.restarts) return x->s.restarts < y->s.restarts ? -1 : 1;
  return x->line < y->line ? -1 : x->line > y->line;
}

newt_result_t job_steplog_stitch(job_step *s, size_t *n, size_t *redone) {
  if (redone) *redone = 0;
  if (*n == 0) return NEWT_OK;
  ranked *r = malloc(*n * sizeof *r);
  if (!r) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory sorting %zu steps", *n);
  for (size_t i = 0; i < *n; i++) r[i] = (ranked){s[i], i};
  qsort(r, *n, sizeof *r, by_step_gen_line);
  size_t out = 0;
  for (size_t first = 0, last; first < *n; first = last + 1) {
    last = first; /* [first, last]: the lines of one step, the winner last */
    while (last + 1 < *n && r[last + 1].s.step == r[first].s.step) last++;
    if (redone && (r[first].s.generation != r[last].s.generation || r[first].s.restarts != r[last].s.restarts))
      (*redone)++;
    s[out++] = r[last].s;
  }
  free(r);
  *n = out;
  return NEWT_OK;
}
