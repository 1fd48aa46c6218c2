/* Prometheus metrics and health over HTTP (GET /metrics in the text exposition format
 * 0.0.4, GET /healthz), served by libmicrohttpd on its own thread, for the coordinator and
 * the worker alike. Values are set from any thread; a scrape renders a consistent copy.
 *
 * A metric is a family (name, help, kind; a histogram also its bucket bounds) and its
 * series, one per label set: `metrics_add_l(m, "newt_recoveries_total", "cause=\"crash\"", 1)`.
 * Values print with 15 significant digits at most ("8388.1", not "8388.1000000000004"; 0.1 +
 * 0.2 as "0.3"), whole numbers without a decimal point or exponent up to 1e15.
 *
 * Every scrape also carries the process_* families of the Prometheus clients, read from
 * /proc as it renders: process_cpu_seconds_total (counter), process_resident_memory_bytes,
 * process_virtual_memory_bytes, process_start_time_seconds (unix seconds), process_open_fds,
 * process_max_fds. Constant labels (metrics_set_const_labels) go on every series, those
 * included: a worker's worker="<id>",rank="<rank>".
 *
 * The endpoint is input from the network (DESIGN: the metrics port is bounded): it binds
 * only the addresses it is given, holds at most `per_ip` connections from one address (the
 * rest are closed at once) and `total` in all, drops a connection idle for `timeout_s`, and
 * logs what it complains of at most once every 10 s. Slow clients cannot hold it shut: a
 * connection that comes when `total` are held closes the oldest one (a partial request
 * trickled a byte at a time is never idle), so /healthz and scrapes are answered whatever
 * the others hold. */
#ifndef NEWT_COMMON_METRICS_H
#define NEWT_COMMON_METRICS_H

#include <stddef.h>

#include "common/err.h"

typedef struct metrics metrics_t;

typedef enum metrics_kind { METRICS_GAUGE, METRICS_COUNTER, METRICS_HISTOGRAM } metrics_kind;

typedef struct metrics_limits {
  int per_ip;    /* connections from one address (0: 8) */
  int total;     /* connections in all (0: 64); one more closes the oldest */
  int timeout_s; /* an idle connection is closed after this (0: 5) */
} metrics_limits;

/* Starts serving on port of each address in addrs, a comma-separated list of IPv4
 * addresses (at most 4; e.g. "10.1.2.3,127.0.0.1"). Port 0 picks a free one (the same for
 * every address; see metrics_port). limits may be NULL (the defaults). */
newt_result_t metrics_start(const char *addrs, int port, const metrics_limits *limits, metrics_t **out);
int metrics_port(const metrics_t *m);

/* Declares a family (idempotent); an unlabelled gauge or counter starts at 0. group 0 is
 * always shown; other groups only while shown (metrics_show_group). */
newt_result_t metrics_define(metrics_t *m, const char *name, metrics_kind kind, const char *help);
newt_result_t metrics_define_group(metrics_t *m, const char *name, metrics_kind kind, int group, const char *help);
/* A histogram with n upper bounds (ascending; +Inf is implicit). */
newt_result_t metrics_define_histogram(metrics_t *m, const char *name, int group, const double *bounds, int n,
                                       const char *help);

/* Sets, adds to, observes (histograms) the series of name with labels (NULL: none), e.g.
 * `cause="crash"`. Undeclared names are ignored; m may be NULL (no server). */
void metrics_set(metrics_t *m, const char *name, double value);
void metrics_add(metrics_t *m, const char *name, double delta);
void metrics_set_l(metrics_t *m, const char *name, const char *labels, double value);
void metrics_add_l(metrics_t *m, const char *name, const char *labels, double delta);
void metrics_observe(metrics_t *m, const char *name, const char *labels, double value);

/* Labels every series of m renders with, before its own (a worker's id and rank). A call
 * replaces the whole set (n 0: none), so a changed value moves every series at once and
 * no series of the old value is left. Values are escaped as the exposition format wants
 * (backslash, double quote, newline); a name must be [a-zA-Z_][a-zA-Z0-9_]*, neither "le"
 * nor starting with "__" (NEWT_ERR_INVALID), nor one a series sets itself; at most 255
 * bytes rendered in all. */
typedef struct metrics_label {
  const char *name, *value;
} metrics_label;
newt_result_t metrics_set_const_labels(metrics_t *m, const metrics_label *labels, int n);

/* Shows or hides the families of a group; a note (one line, may be NULL) is printed as a
 * comment at the top of every scrape (e.g. why the job's metrics are not here). */
void metrics_show_group(metrics_t *m, int group, int shown);
void metrics_set_note(metrics_t *m, const char *note);

/* /healthz: fn returns 1 when healthy, else 0 and a reason in why (served with 503). */
typedef int (*metrics_health_fn)(void *ud, char *why, size_t cap);
void metrics_set_health(metrics_t *m, metrics_health_fn fn, void *ud);

/* A value as the exposition prints it, into out (at least 32 bytes). */
char *metrics_fmt_value(double v, char *out, size_t cap);

/* The exposition text (malloc'd), as a scrape would get it. */
char *metrics_render(metrics_t *m);
void metrics_stop(metrics_t *m);

#endif
