/* Prometheus metrics over HTTP (GET /metrics, text exposition format 0.0.4), served by
 * libmicrohttpd on its own thread. Values are set from any thread; a scrape renders a
 * consistent copy. Metric names are fixed at registration (metrics_define). */
#ifndef NEWT_COORDINATOR_METRICS_H
#define NEWT_COORDINATOR_METRICS_H

#include "common/err.h"

typedef struct metrics metrics_t;

typedef enum metrics_kind { METRICS_GAUGE, METRICS_COUNTER } metrics_kind;

/* Starts serving on addr:port (port 0 picks a free one; see metrics_port). */
newt_result_t metrics_start(const char *addr, int port, metrics_t **out);
int metrics_port(const metrics_t *m);
/* Declares a metric (idempotent); its value starts at 0. */
newt_result_t metrics_define(metrics_t *m, const char *name, metrics_kind kind, const char *help);
void metrics_set(metrics_t *m, const char *name, double value);
void metrics_add(metrics_t *m, const char *name, double delta);
/* The exposition text (malloc'd), as a scrape would get it. */
char *metrics_render(metrics_t *m);
void metrics_stop(metrics_t *m);

#endif
