/* The metrics registry and its HTTP endpoint (see metrics.h). A small fixed table under
 * one mutex: coordinators export a dozen values, scraped every few seconds. */
#include "coordinator/metrics.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strutil.h"

#define METRICS_MAX 32

struct metrics {
  struct MHD_Daemon *daemon;
  int port;
  pthread_mutex_t mu;
  int n;
  struct {
    char name[64];
    char help[160];
    metrics_kind kind;
    double value;
  } m[METRICS_MAX];
};

char *metrics_render(metrics_t *mt) {
  newt_buf b;
  newt_buf_init(&b);
  pthread_mutex_lock(&mt->mu);
  for (int i = 0; i < mt->n; i++) {
    newt_buf_printf(&b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", mt->m[i].name, mt->m[i].help,
                    mt->m[i].name, mt->m[i].kind == METRICS_COUNTER ? "counter" : "gauge", mt->m[i].name,
                    mt->m[i].value);
  }
  pthread_mutex_unlock(&mt->mu);
  if (!b.data) newt_buf_append(&b, "", 0);
  return b.data;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **req_cls) {
  metrics_t *mt = cls;
  struct MHD_Response *resp;
  unsigned status = MHD_HTTP_OK;
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
    static const char msg[] = "only GET\n";
    resp = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
    status = MHD_HTTP_METHOD_NOT_ALLOWED;
  } else if (strcmp(url, "/metrics") == 0) {
    char *text = metrics_render(mt);
    if (!text) return MHD_NO;
    resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4");
  } else if (strcmp(url, "/healthz") == 0) {
    static const char msg[] = "ok\n";
    resp = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
  } else {
    static const char msg[] = "not found: try /metrics\n";
    resp = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
    status = MHD_HTTP_NOT_FOUND;
  }
  if (!resp) return MHD_NO;
  enum MHD_Result r = MHD_queue_response(conn, status, resp);
  MHD_destroy_response(resp);
  return r;
}

newt_result_t metrics_start(const char *addr, int port, metrics_t **out) {
  metrics_t *mt = calloc(1, sizeof *mt);
  NEWT_CHECK_ALLOC(mt);
  pthread_mutex_init(&mt->mu, NULL);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
    free(mt);
    return NEWT_ERR(NEWT_ERR_INVALID, "--metrics-addr: \"%s\" is not an IPv4 address", addr);
  }
  mt->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, (uint16_t)port, NULL,
                                NULL, on_request, mt, MHD_OPTION_SOCK_ADDR, &sa,
                                MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
  if (!mt->daemon) {
    free(mt);
    return NEWT_ERR(NEWT_ERR_SYS, "metrics: cannot serve on %s:%d (port in use?)", addr, port);
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(mt->daemon, MHD_DAEMON_INFO_BIND_PORT);
  mt->port = info ? info->port : port;
  *out = mt;
  return NEWT_OK;
}

int metrics_port(const metrics_t *mt) { return mt->port; }

static int find(metrics_t *mt, const char *name) {
  for (int i = 0; i < mt->n; i++)
    if (strcmp(mt->m[i].name, name) == 0) return i;
  return -1;
}

newt_result_t metrics_define(metrics_t *mt, const char *name, metrics_kind kind, const char *help) {
  pthread_mutex_lock(&mt->mu);
  newt_result_t r = NEWT_OK;
  if (find(mt, name) < 0) {
    if (mt->n == METRICS_MAX) {
      r = NEWT_ERR(NEWT_ERR_INTERNAL, "metrics: more than %d metrics", METRICS_MAX);
    } else {
      snprintf(mt->m[mt->n].name, sizeof mt->m[0].name, "%s", name);
      snprintf(mt->m[mt->n].help, sizeof mt->m[0].help, "%s", help);
      mt->m[mt->n].kind = kind;
      mt->m[mt->n].value = 0;
      mt->n++;
    }
  }
  pthread_mutex_unlock(&mt->mu);
  return r;
}

static void update(metrics_t *mt, const char *name, double v, int add) {
  if (!mt) return;
  pthread_mutex_lock(&mt->mu);
  int i = find(mt, name);
  if (i >= 0) mt->m[i].value = add ? mt->m[i].value + v : v;
  pthread_mutex_unlock(&mt->mu);
}

void metrics_set(metrics_t *mt, const char *name, double v) { update(mt, name, v, 0); }

void metrics_add(metrics_t *mt, const char *name, double d) { update(mt, name, d, 1); }

void metrics_stop(metrics_t *mt) {
  if (!mt) return;
  MHD_stop_daemon(mt->daemon);
  pthread_mutex_destroy(&mt->mu);
  free(mt);
}
