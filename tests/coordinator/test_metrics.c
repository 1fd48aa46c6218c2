/* The metrics endpoint, scraped over real HTTP with libcurl. */
#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>

#include "common/strutil.h"
#include "coordinator/metrics.h"
#include "test.h"

static size_t on_data(char *p, size_t sz, size_t n, void *ud) {
  newt_buf_append(ud, p, sz * n);
  return sz * n;
}

static long fetch(int port, const char *path, newt_buf *body) {
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
  CURL *c = curl_easy_init();
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, body);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
  long code = 0;
  if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(c);
  return code;
}

static void test_scrape(void) {
  metrics_t *m = NULL;
  T_OK(metrics_start("127.0.0.1", 0, &m));
  if (!m) return;
  T_CHECK(metrics_port(m) > 0);
  T_OK(metrics_define(m, "newt_generation", METRICS_GAUGE, "current plan generation"));
  T_OK(metrics_define(m, "newt_recoveries_total", METRICS_COUNTER, "recoveries"));
  metrics_set(m, "newt_generation", 7);
  metrics_add(m, "newt_recoveries_total", 1);
  metrics_add(m, "newt_recoveries_total", 2);
  metrics_set(m, "newt_not_defined", 1); /* ignored */
  newt_buf b;
  newt_buf_init(&b);
  T_CHECK(fetch(metrics_port(m), "/metrics", &b) == 200);
  T_CHECK_MSG(b.data && strstr(b.data, "# TYPE newt_generation gauge\nnewt_generation 7\n"), "%s", b.data);
  T_CHECK(b.data && strstr(b.data, "newt_recoveries_total 3\n"));
  T_CHECK(b.data && !strstr(b.data, "newt_not_defined"));
  newt_buf_reset(&b);
  T_CHECK(fetch(metrics_port(m), "/nope", &b) == 404);
  newt_buf_free(&b);
  metrics_t *m2 = NULL;
  T_ERR(NEWT_ERR_SYS, metrics_start("127.0.0.1", metrics_port(m), &m2));
  T_ERR(NEWT_ERR_INVALID, metrics_start("not-an-ip", 0, &m2));
  metrics_stop(m);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  T_RUN(test_scrape);
  curl_global_cleanup();
  return T_DONE();
}
