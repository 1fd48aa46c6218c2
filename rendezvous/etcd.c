/* The etcd v3 client's request path and its unary calls (see etcd.h).
 *
 * A call builds its JSON body with cJSON, then rdzv_etcd_request POSTs it: it takes an
 * idle curl handle from the pool (whose connections are still open), tries the preferred
 * endpoint and then the others, re-authenticates once when etcd says the token is
 * invalid, and when no endpoint can be connected to, backs off (25 ms doubling to 500 ms)
 * and tries again until the deadline (and, reaching none by then, forgets its token: an
 * etcd that comes back holds none of the tokens it gave). Every transfer's curl timeout is the time left
 * before the call's deadline, so no call outlives it. */
#include "rendezvous/etcd_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/log.h"
#include "common/metrics.h"
#include "rendezvous/etcd_parse.h"

#define RDZV_MAX_RESPONSE ((size_t)256 << 20)
#define RDZV_POOL_MAX 512

void rdzv_fmt(char *dst, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(dst, cap, fmt, ap);
  va_end(ap);
}

void rdzv_cond_init(pthread_cond_t *cv) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &ca);
  pthread_condattr_destroy(&ca);
}

void rdzv_etcd_setup_post(CURL *h, const char *url, const char *body, struct curl_slist *hdrs,
                          curl_write_callback write_fn, void *write_ud, char *errbuf) {
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_POST, 1L);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_fn);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, write_ud);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
}

/* --- curl handles -------------------------------------------------------------------------- */

CURL *rdzv_etcd_handle_new(rdzv_etcd *c) {
  CURL *h = curl_easy_init();
  if (!h) return NULL;
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 10L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 5L);
  curl_easy_setopt(h, CURLOPT_PROXY, ""); /* etcd is never reached through an http_proxy */
  if (c->ca_file) curl_easy_setopt(h, CURLOPT_CAINFO, c->ca_file);
  if (c->cert_file) {
    curl_easy_setopt(h, CURLOPT_SSLCERT, c->cert_file);
    curl_easy_setopt(h, CURLOPT_SSLKEY, c->key_file);
  }
  return h;
}

static CURL *pool_get(rdzv_etcd *c) {
  CURL *h = NULL;
  pthread_mutex_lock(&c->pool_mu);
  if (c->n_pool > 0) h = c->pool[--c->n_pool];
  pthread_mutex_unlock(&c->pool_mu);
  return h ? h : rdzv_etcd_handle_new(c);
}

static void pool_put(rdzv_etcd *c, CURL *h) {
  pthread_mutex_lock(&c->pool_mu);
  if (c->n_pool == c->cap_pool && c->cap_pool < RDZV_POOL_MAX) {
    size_t cap = c->cap_pool ? c->cap_pool * 2 : 16;
    CURL **p = realloc(c->pool, cap * sizeof *p);
    if (p) {
      c->pool = p;
      c->cap_pool = cap;
    }
  }
  if (c->n_pool < c->cap_pool) {
    c->pool[c->n_pool++] = h;
    h = NULL;
  }
  pthread_mutex_unlock(&c->pool_mu);
  if (h) curl_easy_cleanup(h);
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud) {
  newt_buf *b = ud;
  size_t n = size * nmemb;
  if (b->len + n > RDZV_MAX_RESPONSE) return 0; /* curl reports a write error */
  if (newt_buf_append(b, data, n) != NEWT_OK) return 0;
  return n;
}

/* --- auth -------------------------------------------------------------------------------------- */

static newt_result_t authenticate(rdzv_etcd *c, newt_deadline_t d) {
  cJSON *req = cJSON_CreateObject();
  NEWT_CHECK_ALLOC(req);
  cJSON_AddStringToObject(req, "name", c->user);
  cJSON_AddStringToObject(req, "password", c->password);
  char *body = newt_json_print(req);
  cJSON_Delete(req);
  NEWT_CHECK_ALLOC(body);
  newt_buf resp;
  newt_buf_init(&resp);
  newt_result_t r = rdzv_etcd_request(c, "/v3/auth/authenticate", body,
                                      RDZV_REQ_NOAUTH | RDZV_REQ_IDEMPOTENT, "authenticate", d, &resp);
  memset(body, 0, strlen(body));
  free(body);
  if (r != NEWT_OK) {
    newt_buf_free(&resp);
    if (r == NEWT_ERR_AUTH)
      return newt_err_wrap(r, "etcd user \"%s\" at %s: ", c->user, c->endpoints_str);
    return r;
  }
  cJSON *j = NULL;
  const char *token = NULL;
  r = newt_json_parse(resp.data, resp.len, "authenticate", &j);
  if (r == NEWT_OK) r = newt_json_get_str(j, "authenticate", "token", 1, &token);
  if (r == NEWT_OK && !*token) r = NEWT_ERR(NEWT_ERR_AUTH, "authenticate: etcd gave an empty token");
  if (r == NEWT_OK) {
    char *t = newt_strdup(token);
    if (!t) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a token");
    else {
      free(c->token);
      c->token = t;
      c->token_gen++;
    }
  }
  cJSON_Delete(j);
  newt_buf_free(&resp);
  return r == NEWT_ERR_INVALID ? NEWT_ERR_CORRUPT : r;
}

newt_result_t rdzv_etcd_reauth(rdzv_etcd *c, uint64_t gen, newt_deadline_t d) {
  if (!c->user) return NEWT_ERR(NEWT_ERR_AUTH, "etcd at %s wants authentication: give a user", c->endpoints_str);
  pthread_mutex_lock(&c->auth_mu);
  newt_result_t r = NEWT_OK;
  if (c->token_gen == gen) r = authenticate(c, d);
  pthread_mutex_unlock(&c->auth_mu);
  return r;
}

void rdzv_etcd_forget_token(rdzv_etcd *c, uint64_t gen) {
  if (!c->user || !gen) return;
  pthread_mutex_lock(&c->auth_mu);
  if (c->token_gen == gen && c->token) {
    free(c->token);
    c->token = NULL;
  }
  pthread_mutex_unlock(&c->auth_mu);
}

newt_result_t rdzv_etcd_headers(rdzv_etcd *c, newt_deadline_t d, struct curl_slist **out, uint64_t *gen) {
  struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
  if (h) h = curl_slist_append(h, "Expect:");
  *gen = 0;
  if (h && c->user) {
    pthread_mutex_lock(&c->auth_mu);
    newt_result_t r = c->token ? NEWT_OK : authenticate(c, d);
    char line[1024] = "";
    if (r == NEWT_OK) snprintf(line, sizeof line, "Authorization: %s", c->token);
    *gen = c->token_gen;
    pthread_mutex_unlock(&c->auth_mu);
    if (r != NEWT_OK) {
      curl_slist_free_all(h);
      return r;
    }
    struct curl_slist *h2 = curl_slist_append(h, line);
    if (!h2) curl_slist_free_all(h);
    h = h2;
  }
  if (!h) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for request headers");
  *out = h;
  return NEWT_OK;
}

/* --- one transfer ---------------------------------------------------------------------------- */

newt_result_t rdzv_etcd_curl_result(rdzv_etcd *c, CURL *h, CURLcode cc, const char *errbuf,
                                    const char *url, int *retry_safe) {
  const char *detail = errbuf && errbuf[0] ? errbuf : curl_easy_strerror(cc);
  long req_size = 0;
  curl_easy_getinfo(h, CURLINFO_REQUEST_SIZE, &req_size);
  *retry_safe = 0;
  /* with TLS 1.3 the server refuses a client certificate after the handshake: its alert
     comes with whatever curl does next (a read, a write), under whatever code that gives */
  if (errbuf && strstr(errbuf, "alert") && (strstr(errbuf, "certificate") || strstr(errbuf, "unknown ca")))
    return NEWT_ERR(NEWT_ERR_AUTH, "TLS with %s failed: %s (client certificate %s; curl error %d)", url, detail,
                    c->cert_file ? c->cert_file : "(none)", (int)cc);
  switch (cc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
      *retry_safe = 1;
      return NEWT_ERR(NEWT_ERR_UNAVAILABLE, "%s: %s", url, detail);
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_ISSUER_ERROR:
      return NEWT_ERR(NEWT_ERR_AUTH, "TLS with %s failed: %s (CA file %s, client certificate %s)", url,
                      detail, c->ca_file ? c->ca_file : "(system)", c->cert_file ? c->cert_file : "(none)");
    case CURLE_SSL_CONNECT_ERROR:
      /* a handshake the server refused (no or bad client certificate) */
      return NEWT_ERR(NEWT_ERR_AUTH, "TLS handshake with %s failed: %s (CA file %s, client certificate %s)",
                      url, detail, c->ca_file ? c->ca_file : "(system)",
                      c->cert_file ? c->cert_file : "(none)");
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
      return NEWT_ERR(NEWT_ERR_INVALID, "%s: %s", url, detail);
    case CURLE_WRITE_ERROR:
      return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: answer larger than %zu bytes or out of memory", url,
                      RDZV_MAX_RESPONSE);
    case CURLE_OPERATION_TIMEDOUT:
      *retry_safe = req_size == 0;
      return NEWT_ERR(req_size == 0 ? NEWT_ERR_UNAVAILABLE : NEWT_ERR_TIMEOUT, "%s: %s%s", url, detail,
                      req_size == 0 ? "" : " (the server took the request but did not answer in time)");
    default:
      *retry_safe = req_size == 0;
      return NEWT_ERR(NEWT_ERR_UNAVAILABLE, "%s: %s (curl error %d)", url, detail, (int)cc);
  }
}

typedef struct attempt {
  long status;
  newt_result_t res;  /* transport result */
  int retry_safe;     /* the request did not reach the server */
} attempt;

static void transfer(rdzv_etcd *c, CURL *h, const char *url, const char *body,
                     struct curl_slist *hdrs, newt_deadline_t d, newt_buf *resp, attempt *a) {
  char errbuf[CURL_ERROR_SIZE] = "";
  int64_t left = newt_deadline_left_ms(d);
  if (left < 1) left = 1;
  newt_buf_reset(resp);
  rdzv_etcd_setup_post(h, url, body, hdrs, on_body, resp, errbuf);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(left > 0x7fffffff ? 0x7fffffff : left));
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(left < c->connect_ms ? left : c->connect_ms));
  CURLcode cc = curl_easy_perform(h);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
  a->status = 0;
  a->retry_safe = 0;
  if (cc != CURLE_OK) {
    a->res = rdzv_etcd_curl_result(c, h, cc, errbuf, url, &a->retry_safe);
    return;
  }
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &a->status);
  a->res = NEWT_OK;
}

newt_result_t rdzv_etcd_set_metrics(rdzv_etcd *c, metrics_t *m) {
  static const double bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  NEWT_CHECK(metrics_define(m, "newt_etcd_requests_total", METRICS_COUNTER, "requests this process made to etcd"));
  NEWT_CHECK(metrics_define(m, "newt_etcd_request_errors_total", METRICS_COUNTER,
                            "requests to etcd that failed: no endpoint answered, or etcd refused"));
  NEWT_CHECK(metrics_define_histogram(m, "newt_etcd_request_duration_seconds", 0, bounds, (int)(sizeof bounds / sizeof bounds[0]),
                                      "time of a request to etcd, failover and retries included"));
  atomic_store(&c->metrics, m);
  return NEWT_OK;
}

static newt_result_t request(rdzv_etcd *c, const char *path, const char *body, int flags, const char *what,
                             newt_deadline_t d, newt_buf *resp);

int64_t rdzv_etcd_writes(rdzv_etcd *c) { return (int64_t)atomic_load(&c->writes); }
int64_t rdzv_etcd_max_request(rdzv_etcd *c) { return (int64_t)atomic_load(&c->max_body); }

/* Whether a request to path asks etcd to write. */
static int is_write(const char *path) {
  static const char *const writes[] = {"/v3/kv/put", "/v3/kv/deleterange", "/v3/kv/txn", "/v3/lease/grant",
                                       "/v3/lease/revoke"};
  for (size_t i = 0; i < sizeof writes / sizeof writes[0]; i++)
    if (strcmp(path, writes[i]) == 0) return 1;
  return 0;
}

newt_result_t rdzv_etcd_request(rdzv_etcd *c, const char *path, const char *body, int flags,
                                const char *what, newt_deadline_t d, newt_buf *resp) {
  if (is_write(path)) atomic_fetch_add(&c->writes, 1);
  long long len = body ? (long long)strlen(body) : 0, seen = atomic_load(&c->max_body);
  while (len > seen && !atomic_compare_exchange_weak(&c->max_body, &seen, len)) {
  }
  metrics_t *m = atomic_load(&c->metrics);
  uint64_t t0 = m ? newt_now_ns() : 0;
  newt_result_t r = request(c, path, body, flags, what, d, resp);
  if (m) {
    metrics_add(m, "newt_etcd_requests_total", 1);
    if (r != NEWT_OK) metrics_add(m, "newt_etcd_request_errors_total", 1);
    metrics_observe(m, "newt_etcd_request_duration_seconds", NULL, (double)(newt_now_ns() - t0) / 1e9);
  }
  return r;
}

static newt_result_t request(rdzv_etcd *c, const char *path, const char *body, int flags, const char *what,
                             newt_deadline_t d, newt_buf *resp) {
  CURL *h = pool_get(c);
  if (!h) return NEWT_ERR(NEWT_ERR_NOMEM, "curl_easy_init failed");
  newt_buf fails; /* "url: why; url: why" for the message when all fail */
  newt_buf_init(&fails);
  int64_t backoff_ms = 25;
  int reauthed = (flags & RDZV_REQ_NOAUTH) != 0;
  int idempotent = (flags & RDZV_REQ_IDEMPOTENT) != 0;
  newt_result_t res = NEWT_OK;
  newt_result_t worst = NEWT_ERR_UNAVAILABLE;
  uint64_t used_gen = 0; /* the token of the last attempt */
  int answered = 0;      /* some endpoint answered over HTTP */
  for (;;) {
    newt_buf_reset(&fails);
    worst = NEWT_ERR_UNAVAILABLE;
    size_t first = atomic_load(&c->preferred) % c->n_urls;
    int retry = 0; /* 1: every endpoint failed in a way that may be tried again */
    for (size_t k = 0; k < c->n_urls; k++) {
      size_t i = (first + k) % c->n_urls;
      char url[1024];
      snprintf(url, sizeof url, "%s%s", c->urls[i], path);
      struct curl_slist *hdrs = NULL;
      uint64_t gen = 0;
      if (flags & RDZV_REQ_NOAUTH) {
        hdrs = curl_slist_append(NULL, "Content-Type: application/json");
        if (!hdrs) {
          res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for headers");
          goto done;
        }
      } else {
        res = rdzv_etcd_headers(c, d, &hdrs, &gen);
        if (res != NEWT_OK) goto done;
      }
      attempt a;
      /* with several endpoints, one that hangs (a stopped member) may hold an attempt for a
         share of the time left only, so the others are tried within the deadline */
      newt_deadline_t da = d;
      if (c->n_urls > 1 && k + 1 < c->n_urls && d != NEWT_DEADLINE_NONE) {
        int64_t share = newt_deadline_left_ms(d) / (int64_t)(c->n_urls - k);
        if (share < 300) share = 300;
        da = newt_deadline_in_ms(share);
        if (da > d) da = d;
      }
      transfer(c, h, url, body, hdrs, da, resp, &a);
      curl_slist_free_all(hdrs);
      used_gen = gen;
      answered |= a.res == NEWT_OK;
      if (a.res == NEWT_OK && a.status == 200) {
        atomic_store(&c->preferred, i);
        if (atomic_exchange(&c->failing, 0)) atomic_fetch_add(&c->recoveries, 1);
        res = NEWT_OK;
        goto done;
      }
      if (a.res == NEWT_OK) {
        rdzv_etcd_gw_error e;
        rdzv_etcd_parse_error(resp->data ? resp->data : "", resp->len, &e);
        if (!reauthed && c->user && rdzv_etcd_is_token_error(e.message)) {
          reauthed = 1;
          NEWT_DEBUG(RDZV, "%s: %s; authenticating again", what, e.message);
          res = rdzv_etcd_reauth(c, gen, d);
          if (res != NEWT_OK) goto done;
          k--; /* the same endpoint again, with the new token */
          continue;
        }
        newt_result_t code = e.grpc_code >= 0 ? rdzv_etcd_grpc_code_result(e.grpc_code, e.message)
                                              : (a.status == 404 ? NEWT_ERR_UNSUPPORTED : NEWT_ERR_PEER);
        if (code == NEWT_ERR_UNAVAILABLE && idempotent) { /* "no leader", "stopping": another endpoint */
          /* over TLS, the gateway reaches etcd's own gRPC port with etcd's server certificate
             as its client certificate: one without the client auth usage closes every call
             (docs/kubernetes.md, "etcd: TLS and authentication") */
          int gw_cert = strncmp(url, "https:", 6) == 0 && a.status == 503 &&
                        (strstr(e.message, "closed") || strstr(e.message, "broken pipe") ||
                         strstr(e.message, "connection reset") || strstr(e.message, "EOF") || strstr(e.message, "tls:"));
          newt_buf_printf(&fails, "%s%s: HTTP %ld: %s%s", fails.len ? "; " : "", url, a.status, e.message,
                          gw_cert ? " (etcd's gateway lost its link to etcd itself: with --client-cert-auth, etcd's "
                                    "server certificate needs the client auth usage as well as server auth)"
                                  : "");
          retry = 1;
          continue;
        }
        if (strstr(e.message, "CommonName of client sending a request against gateway")) {
          /* etcd with --client-cert-auth and auth on refuses, on its JSON gateway, any client
             certificate that carries a Common Name (CVE-2018-16886): the identity is the user */
          res = NEWT_ERR(NEWT_ERR_AUTH,
                         "etcd %s: %s refuses the client certificate %s because it has a Common Name: with "
                         "client-certificate auth and users on, etcd's gateway takes only certificates without "
                         "one (issue it with a subject like /O=newt); the user and password say who we are",
                         what, url, c->cert_file ? c->cert_file : "(none)");
          goto done;
        }
        res = NEWT_ERR(code, "etcd %s: %s (HTTP %ld from %s)%s", what, e.message, a.status, url,
                       strstr(e.message, "user name is empty") ? ": etcd has auth enabled, give a user and password" : "");
        goto done;
      }
      /* transport failure */
      newt_buf_printf(&fails, "%s%s", fails.len ? "; " : "", newt_errmsg());
      if (a.res == NEWT_ERR_AUTH || a.res == NEWT_ERR_INVALID || a.res == NEWT_ERR_CORRUPT) {
        res = NEWT_ERR(a.res, "etcd %s: %s", what, fails.data);
        goto done;
      }
      if (a.res == NEWT_ERR_TIMEOUT) {
        worst = NEWT_ERR_TIMEOUT;
        rdzv_etcd_forget_token(c, gen); /* one etcd cannot check is held, not refused (a wipe) */
      }
      if (a.retry_safe || idempotent) {
        retry = 1;
        continue;
      }
      /* the next call starts with another endpoint: this one may be hung (a stopped member) */
      atomic_store(&c->preferred, (i + 1) % c->n_urls);
      res = NEWT_ERR(a.res, "etcd %s: %s; the write may or may not have been applied", what, fails.data);
      goto done;
    }
    if (!retry || newt_deadline_passed(d)) break;
    int64_t left = newt_deadline_left_ms(d);
    newt_sleep_ms(backoff_ms < left ? backoff_ms : left);
    if (newt_deadline_passed(d)) break;
    if (backoff_ms < 500) backoff_ms *= 2;
  }
  atomic_store(&c->failing, 1);
  /* no endpoint could be reached at all: etcd went away, and an etcd that comes back has
     lost every simple token it gave (they live in its memory); a wiped one holds a request
     with such a token until its deadline rather than refuse it. The next call authenticates
     afresh. */
  if (!answered) rdzv_etcd_forget_token(c, used_gen);
  res = NEWT_ERR(worst, "etcd %s: no endpoint answered by the deadline: %s", what,
                 fails.len ? fails.data : "(no attempt)");
done:
  newt_buf_free(&fails);
  pool_put(c, h);
  return res;
}

/* --- request bodies ---------------------------------------------------------------------------- */

cJSON *rdzv_etcd_add_b64(cJSON *obj, const char *field, const void *data, size_t len) {
  char *s = newt_base64_encode_alloc(data, len);
  if (!s) return NULL;
  cJSON *it = cJSON_AddStringToObject(obj, field, s);
  free(s);
  return it;
}

cJSON *rdzv_etcd_add_i64(cJSON *obj, const char *field, int64_t v) {
  char s[32];
  snprintf(s, sizeof s, "%lld", (long long)v);
  return cJSON_AddStringToObject(obj, field, s);
}

/* key (and range_end for a prefix) into obj. An empty prefix means every key. */
static int add_key_range(cJSON *obj, const char *key, int prefix, const char *range_end) {
  size_t klen = strlen(key);
  if (prefix) {
    char *end = malloc(klen + 2);
    if (!end) return 0;
    size_t elen;
    rdzv_etcd_prefix_end(key, klen, end, &elen);
    int ok = rdzv_etcd_add_b64(obj, "key", klen ? key : "\0", klen ? klen : 1) &&
             rdzv_etcd_add_b64(obj, "range_end", end, elen);
    free(end);
    return ok;
  }
  if (!rdzv_etcd_add_b64(obj, "key", key, klen)) return 0;
  if (range_end && !rdzv_etcd_add_b64(obj, "range_end", range_end, strlen(range_end) ? strlen(range_end) : 1))
    return 0;
  return 1;
}

/* Prints and frees obj, sends it, returns the answer. */
static newt_result_t send_json(rdzv_etcd *c, const char *path, cJSON *obj, int ok, int flags,
                               const char *what, newt_deadline_t d, newt_buf *resp) {
  char *body = ok ? newt_json_print(obj) : NULL;
  cJSON_Delete(obj);
  if (!body) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory building the %s request", what);
  newt_result_t r = rdzv_etcd_request(c, path, body, flags, what, d, resp);
  free(body);
  return r;
}

static void describe(char *out, size_t cap, const char *verb, const char *key) {
  snprintf(out, cap, "%s %.200s", verb, key ? key : "(no key)");
}

static newt_result_t check_key(const char *key, const char *what) {
  if (!key) return NEWT_ERR(NEWT_ERR_INVALID, "etcd %s: key is NULL", what);
  return NEWT_OK;
}

newt_result_t rdzv_etcd_range(rdzv_etcd *c, const char *key, const rdzv_etcd_range_opts *o,
                              newt_deadline_t d, rdzv_etcd_kvs *out) {
  static const rdzv_etcd_range_opts none;
  if (!o) o = &none;
  memset(out, 0, sizeof *out);
  NEWT_CHECK(check_key(key, "range"));
  char what[256];
  describe(what, sizeof what, "range", key);
  cJSON *req = cJSON_CreateObject();
  NEWT_CHECK_ALLOC(req);
  int ok = add_key_range(req, key, o->prefix, o->range_end);
  if (o->limit > 0) ok = ok && rdzv_etcd_add_i64(req, "limit", o->limit);
  if (o->revision > 0) ok = ok && rdzv_etcd_add_i64(req, "revision", o->revision);
  if (o->keys_only) ok = ok && cJSON_AddTrueToObject(req, "keys_only");
  if (o->count_only) ok = ok && cJSON_AddTrueToObject(req, "count_only");
  if (o->sort != RDZV_SORT_NONE) {
    static const char *const targets[] = {"", "KEY", "CREATE", "MOD"};
    ok = ok && cJSON_AddStringToObject(req, "sort_order", "ASCEND") &&
         cJSON_AddStringToObject(req, "sort_target", targets[o->sort]);
  }
  newt_buf resp;
  newt_buf_init(&resp);
  newt_result_t r = send_json(c, "/v3/kv/range", req, ok, RDZV_REQ_IDEMPOTENT, what, d, &resp);
  if (r == NEWT_OK) r = rdzv_etcd_parse_range(resp.data, resp.len, out);
  newt_buf_free(&resp);
  return r;
}

newt_result_t rdzv_etcd_get(rdzv_etcd *c, const char *key, newt_deadline_t d, rdzv_etcd_kv *out,
                            int64_t *revision) {
  rdzv_etcd_kvs r;
  memset(out, 0, sizeof *out);
  NEWT_CHECK(rdzv_etcd_range(c, key, NULL, d, &r));
  if (revision) *revision = r.revision;
  if (r.n == 0) {
    rdzv_etcd_kvs_free(&r);
    return NEWT_ERR(NEWT_ERR_NOTFOUND, "etcd: no key %.200s", key);
  }
  *out = r.kvs[0];
  memset(&r.kvs[0], 0, sizeof r.kvs[0]);
  rdzv_etcd_kvs_free(&r);
  return NEWT_OK;
}

newt_result_t rdzv_etcd_put(rdzv_etcd *c, const char *key, const void *value, size_t len, int64_t lease,
                            newt_deadline_t d, int64_t *revision) {
  NEWT_CHECK(check_key(key, "put"));
  char what[256];
  describe(what, sizeof what, "put", key);
  cJSON *req = cJSON_CreateObject();
  NEWT_CHECK_ALLOC(req);
  int ok = rdzv_etcd_add_b64(req, "key", key, strlen(key)) != NULL &&
           rdzv_etcd_add_b64(req, "value", value ? value : "", value ? len : 0) != NULL;
  if (lease) ok = ok && rdzv_etcd_add_i64(req, "lease", lease);
  newt_buf resp;
  newt_buf_init(&resp);
  newt_result_t r = send_json(c, "/v3/kv/put", req, ok, 0, what, d, &resp);
  if (r == NEWT_OK) r = rdzv_etcd_parse_write(resp.data, resp.len, revision, NULL);
  newt_buf_free(&resp);
  return r;
}

newt_result_t rdzv_etcd_delete(rdzv_etcd *c, const char *key, int prefix, newt_deadline_t d,
                               int64_t *deleted, int64_t *revision) {
  NEWT_CHECK(check_key(key, "delete"));
  char what[256];
  describe(what, sizeof what, "delete", key);
  cJSON *req = cJSON_CreateObject();
  NEWT_CHECK_ALLOC(req);
  int ok = add_key_range(req, key, prefix, NULL);
  newt_buf resp;
  newt_buf_init(&resp);
  newt_result_t r = send_json(c, "/v3/kv/deleterange", req, ok, 0, what, d, &resp);
  if (r == NEWT_OK) r = rdzv_etcd_parse_write(resp.data, resp.len, revision, deleted);
  newt_buf_free(&resp);
  return r;
}

newt_result_t rdzv_etcd_compact(rdzv_etcd *c, int64_t revision, newt_deadline_t d) {
  cJSON *req = cJSON_CreateObject();
  NEWT_CHECK_ALLOC(req);
  int ok = rdzv_etcd_add_i64(req, "revision", revision) && cJSON_AddTrueToObject(req, "physical");
  newt_buf resp;
  newt_buf_init(&resp);
  newt_result_t r = send_json(c, "/v3/kv/compaction", req, ok, RDZV_REQ_IDEMPOTENT, "compact", d, &resp);
  newt_buf_free(&resp);
  return r;
}

/* --- txn ---------------------------------------------------------------------------------------- */

static int add_ops(cJSON *req, const char *field, const rdzv_etcd_op *ops, size_t n) {
  if (n == 0) return 1;
  cJSON *arr = cJSON_AddArrayToObject(req, field);
  if (!arr) return 0;
  for (size_t i = 0; i < n; i++) {
    const rdzv_etcd_op *o = &ops[i];
    cJSON *wrap = cJSON_CreateObject();
    if (!wrap) return 0;
    cJSON_AddItemToArray(arr, wrap);
    cJSON *inner = NULL;
    int ok = 1;
    if (!o->key) return 0;
    switch (o->type) {
      case RDZV_OP_PUT:
        inner = cJSON_AddObjectToObject(wrap, "request_put");
        ok = inner && rdzv_etcd_add_b64(inner, "key", o->key, strlen(o->key)) &&
             rdzv_etcd_add_b64(inner, "value", o->value ? o->value : "", o->value ? o->value_len : 0);
        if (ok && o->lease) ok = rdzv_etcd_add_i64(inner, "lease", o->lease) != NULL;
        break;
      case RDZV_OP_RANGE:
        inner = cJSON_AddObjectToObject(wrap, "request_range");
        ok = inner && add_key_range(inner, o->key, o->prefix, o->range_end);
        break;
      case RDZV_OP_DELETE:
        inner = cJSON_AddObjectToObject(wrap, "request_delete_range");
        ok = inner && add_key_range(inner, o->key, o->prefix, o->range_end);
        break;
      default: return 0;
    }
    if (!ok) return 0;
  }
  return 1;
}

newt_result_t rdzv_etcd_txn(rdzv_etcd *c, const rdzv_etcd_cmp *cmps, size_t ncmp,
                            const rdzv_etcd_op *success, size_t nsuccess,
                            const rdzv_etcd_op *failure, size_t nfailure, newt_deadline_t d,
                            rdzv_etcd_txn_result *out) {
  static const char *const targets[] = {"VERSION", "CREATE", "MOD", "VALUE", "LEASE"};
  static const char *const fields[] = {"version", "create_revision", "mod_revision", "value", "lease"};
  static const char *const results[] = {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"};
  if (out) memset(out, 0, sizeof *out);
  cJSON *req = cJSON_CreateObject();
  NEWT_CHECK_ALLOC(req);
  int ok = 1;
  cJSON *arr = ncmp ? cJSON_AddArrayToObject(req, "compare") : NULL;
  if (ncmp && !arr) ok = 0;
  for (size_t i = 0; ok && i < ncmp; i++) {
    const rdzv_etcd_cmp *m = &cmps[i];
    if (!m->key || (unsigned)m->target > RDZV_CMP_LEASE || (unsigned)m->result > RDZV_CMP_NOT_EQUAL) {
      cJSON_Delete(req);
      return NEWT_ERR(NEWT_ERR_INVALID, "etcd txn: compare %zu has no key or a bad target/result", i);
    }
    cJSON *o = cJSON_CreateObject();
    if (!o) {
      ok = 0;
      break;
    }
    cJSON_AddItemToArray(arr, o);
    ok = rdzv_etcd_add_b64(o, "key", m->key, strlen(m->key)) &&
         cJSON_AddStringToObject(o, "target", targets[m->target]) &&
         cJSON_AddStringToObject(o, "result", results[m->result]);
    if (ok && m->target == RDZV_CMP_VALUE)
      ok = rdzv_etcd_add_b64(o, fields[m->target], m->value ? m->value : "", m->value ? m->value_len : 0) != NULL;
    else if (ok)
      ok = rdzv_etcd_add_i64(o, fields[m->target], m->number) != NULL;
  }
  ok = ok && add_ops(req, "success", success, nsuccess) && add_ops(req, "failure", failure, nfailure);
  char what[256];
  describe(what, sizeof what, "txn on", ncmp ? cmps[0].key : nsuccess ? success[0].key : "(nothing)");
  newt_buf resp;
  newt_buf_init(&resp);
  newt_result_t r = send_json(c, "/v3/kv/txn", req, ok, 0, what, d, &resp);
  rdzv_etcd_txn_result tmp;
  if (r == NEWT_OK) r = rdzv_etcd_parse_txn(resp.data, resp.len, out ? out : &tmp);
  if (r == NEWT_OK && !out) rdzv_etcd_txn_result_free(&tmp);
  newt_buf_free(&resp);
  return r;
}

/* --- leases (the keep-alive thread is in etcd_lease.c) --------------------------------------- */

static newt_result_t lease_call(rdzv_etcd *c, const char *path, int64_t id, int64_t ttl, int flags,
                                const char *verb, newt_deadline_t d, int64_t *id_out, int64_t *ttl_out,
                                int64_t *granted) {
  cJSON *req = cJSON_CreateObject();
  NEWT_CHECK_ALLOC(req);
  int ok = 1;
  if (id) ok = rdzv_etcd_add_i64(req, "ID", id) != NULL;
  if (ttl) ok = ok && rdzv_etcd_add_i64(req, "TTL", ttl);
  char what[96];
  snprintf(what, sizeof what, "%s lease %llx", verb, (unsigned long long)id);
  newt_buf resp;
  newt_buf_init(&resp);
  newt_result_t r = send_json(c, path, req, ok, flags, what, d, &resp);
  if (r == NEWT_OK) r = rdzv_etcd_parse_lease(resp.data, resp.len, id_out, ttl_out, granted);
  newt_buf_free(&resp);
  return r;
}

newt_result_t rdzv_etcd_lease_grant(rdzv_etcd *c, int64_t ttl_s, int64_t id, newt_deadline_t d,
                                    int64_t *lease, int64_t *granted_ttl) {
  if (ttl_s <= 0) return NEWT_ERR(NEWT_ERR_INVALID, "lease grant: TTL must be positive, got %lld", (long long)ttl_s);
  int64_t got_id = 0, got_ttl = 0;
  NEWT_CHECK(lease_call(c, "/v3/lease/grant", id, ttl_s, 0, "grant", d, &got_id, &got_ttl, NULL));
  if (got_id == 0 || got_ttl <= 0)
    return NEWT_ERR(NEWT_ERR_CORRUPT, "lease grant: etcd answered ID %lld TTL %lld", (long long)got_id,
                    (long long)got_ttl);
  *lease = got_id;
  if (granted_ttl) *granted_ttl = got_ttl;
  return NEWT_OK;
}

newt_result_t rdzv_etcd_lease_revoke(rdzv_etcd *c, int64_t lease, newt_deadline_t d) {
  return lease_call(c, "/v3/lease/revoke", lease, 0, RDZV_REQ_IDEMPOTENT, "revoke", d, NULL, NULL, NULL);
}

newt_result_t rdzv_etcd_lease_ttl(rdzv_etcd *c, int64_t lease, newt_deadline_t d, int64_t *ttl,
                                  int64_t *granted_ttl) {
  int64_t t = 0, g = 0;
  NEWT_CHECK(lease_call(c, "/v3/lease/timetolive", lease, 0, RDZV_REQ_IDEMPOTENT, "time-to-live of", d,
                        NULL, &t, &g));
  if (t < 0) return NEWT_ERR(NEWT_ERR_NOTFOUND, "lease %llx: expired or never granted", (unsigned long long)lease);
  if (ttl) *ttl = t;
  if (granted_ttl) *granted_ttl = g;
  return NEWT_OK;
}

newt_result_t rdzv_etcd_lease_keepalive_once(rdzv_etcd *c, int64_t lease, newt_deadline_t d, int64_t *ttl) {
  int64_t t = 0;
  NEWT_CHECK(lease_call(c, "/v3/lease/keepalive", lease, 0, RDZV_REQ_IDEMPOTENT, "keep-alive of", d, NULL,
                        &t, NULL));
  if (t <= 0) return NEWT_ERR(NEWT_ERR_NOTFOUND, "lease %llx: gone (expired or revoked)", (unsigned long long)lease);
  if (ttl) *ttl = t;
  return NEWT_OK;
}

newt_result_t rdzv_etcd_alarms(rdzv_etcd *c, newt_deadline_t d, int *nospace, int *corrupt) {
  *nospace = *corrupt = 0;
  newt_buf resp;
  newt_buf_init(&resp);
  newt_result_t r = rdzv_etcd_request(c, "/v3/maintenance/alarm", "{\"action\":\"GET\"}", RDZV_REQ_IDEMPOTENT,
                                      "alarm list", d, &resp);
  cJSON *j = NULL;
  if (r == NEWT_OK) r = newt_json_parse(resp.data, resp.len, "alarm list", &j);
  newt_buf_free(&resp);
  NEWT_CHECK(r);
  const cJSON *alarms = cJSON_GetObjectItemCaseSensitive(j, "alarms");
  for (const cJSON *a = cJSON_IsArray(alarms) ? alarms->child : NULL; a; a = a->next) {
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(a, "alarm");
    if (cJSON_IsString(kind) && strcmp(kind->valuestring, "NOSPACE") == 0) *nospace = 1;
    if (cJSON_IsString(kind) && strcmp(kind->valuestring, "CORRUPT") == 0) *corrupt = 1;
  }
  cJSON_Delete(j);
  return NEWT_OK;
}
