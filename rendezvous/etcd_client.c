/* The etcd client's life: the options checked and kept (endpoints, credentials, TLS
 * files), and rdzv_etcd_free, which stops the keep-alive thread (etcd_lease.c) before
 * it releases the pooled curl handles and wipes the password. libcurl's global set-up
 * runs once per process, on the first rdzv_etcd_init. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "rendezvous/etcd_internal.h"

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

const char *rdzv_etcd_endpoints(const rdzv_etcd *c) { return c->endpoints_str; }

static newt_result_t parse_endpoints(rdzv_etcd *c, const char *list) {
  char *copy = newt_strdup(list);
  NEWT_CHECK_ALLOC(copy);
  size_t cap = 1;
  for (const char *p = list; *p; p++) cap += *p == ',';
  c->urls = calloc(cap, sizeof *c->urls);
  if (!c->urls) {
    free(copy);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for %zu endpoints", cap);
  }
  char *save = NULL;
  for (char *tok = strtok_r(copy, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
    size_t n = strlen(tok);
    while (n > 0 && tok[n - 1] == '/') tok[--n] = '\0';
    if (strncmp(tok, "http://", 7) != 0 && strncmp(tok, "https://", 8) != 0) {
      free(copy);
      return NEWT_ERR(NEWT_ERR_INVALID,
                      "etcd endpoint \"%s\": expected http://host:port or https://host:port", tok);
    }
    c->urls[c->n_urls] = newt_strdup(tok);
    if (!c->urls[c->n_urls]) {
      free(copy);
      return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for an endpoint");
    }
    c->n_urls++;
  }
  free(copy);
  if (c->n_urls == 0) return NEWT_ERR(NEWT_ERR_INVALID, "etcd endpoints: none given (\"%s\")", list);
  return NEWT_OK;
}

newt_result_t rdzv_etcd_init(const rdzv_etcd_opts *o, rdzv_etcd **out) {
  *out = NULL;
  if (!o || !o->endpoints || !*o->endpoints)
    return NEWT_ERR(NEWT_ERR_INVALID, "etcd client: no endpoints given");
  pthread_once(&curl_once, curl_init);
  if (curl_init_rc != CURLE_OK)
    return NEWT_ERR(NEWT_ERR_INTERNAL, "curl_global_init: %s", curl_easy_strerror(curl_init_rc));
  if ((o->cert_file && *o->cert_file) != (o->key_file && *o->key_file))
    return NEWT_ERR(NEWT_ERR_INVALID, "etcd client: a client certificate needs both cert and key files");
  rdzv_etcd *c = calloc(1, sizeof *c);
  NEWT_CHECK_ALLOC(c);
  pthread_mutex_init(&c->auth_mu, NULL);
  pthread_mutex_init(&c->pool_mu, NULL);
  pthread_mutex_init(&c->ka_mu, NULL);
  rdzv_cond_init(&c->ka_cv);
  newt_result_t r = parse_endpoints(c, o->endpoints);
  if (r != NEWT_OK) {
    rdzv_etcd_free(c);
    return r;
  }
  c->endpoints_str = newt_strdup(o->endpoints);
  if (o->user && *o->user) {
    c->user = newt_strdup(o->user);
    c->password = newt_strdup(o->password ? o->password : "");
  }
  if (o->ca_file && *o->ca_file) c->ca_file = newt_strdup(o->ca_file);
  if (o->cert_file && *o->cert_file) c->cert_file = newt_strdup(o->cert_file);
  if (o->key_file && *o->key_file) c->key_file = newt_strdup(o->key_file);
  c->connect_ms = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 1000;
  *out = c;
  return NEWT_OK;
}

void rdzv_etcd_free(rdzv_etcd *c) {
  if (!c) return;
  rdzv_etcd_lease_shutdown(c);
  for (size_t i = 0; i < c->n_pool; i++) curl_easy_cleanup(c->pool[i]);
  free(c->pool);
  for (size_t i = 0; i < c->n_urls; i++) free(c->urls[i]);
  free(c->urls);
  free(c->endpoints_str);
  free(c->user);
  if (c->password) memset(c->password, 0, strlen(c->password));
  free(c->password);
  free(c->ca_file);
  free(c->cert_file);
  free(c->key_file);
  free(c->token);
  pthread_mutex_destroy(&c->auth_mu);
  pthread_mutex_destroy(&c->pool_mu);
  pthread_mutex_destroy(&c->ka_mu);
  pthread_cond_destroy(&c->ka_cv);
  free(c);
}

int rdzv_etcd_reachable(const rdzv_etcd *c) { return !atomic_load(&((rdzv_etcd *)c)->failing); }

uint64_t rdzv_etcd_outages_ended(const rdzv_etcd *c) { return atomic_load(&((rdzv_etcd *)c)->recoveries); }

int rdzv_etcd_transient(newt_result_t r) {
  return r == NEWT_ERR_UNAVAILABLE || r == NEWT_ERR_TIMEOUT || r == NEWT_ERR_NOSPACE;
}
