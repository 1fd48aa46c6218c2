/* What the files of the etcd client share (etcd.c: the request path and the unary calls;
 * etcd_client.c: init and free; etcd_lease.c: keep-alive; etcd_watch.c: watches): the
 * client struct, the pooled request path and the per-handle setup (TLS, auth header). Not
 * a public header. */
#ifndef NEWT_RENDEZVOUS_ETCD_INTERNAL_H
#define NEWT_RENDEZVOUS_ETCD_INTERNAL_H

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>

#include "common/strutil.h"
#include "rendezvous/etcd.h"

typedef struct rdzv_lease_entry rdzv_lease_entry;
struct rdzv_lease_table;

struct rdzv_etcd {
  char *endpoints_str;
  char **urls;
  size_t n_urls;
  atomic_size_t preferred; /* the endpoint that answered last */
  /* outages: failing is set when a call found no endpoint answering and cleared by the next
     call that got an answer, which also counts one more recovery; a watch stream opened
     before a recovery may be a dead connection nobody closed, so it is re-opened */
  atomic_int failing;
  atomic_ullong recoveries;
  char *user, *password, *ca_file, *cert_file, *key_file;
  int64_t connect_ms;
  struct metrics *_Atomic metrics; /* request counts and latency go here (rdzv_etcd_set_metrics) */
  atomic_llong writes;              /* requests that ask etcd for a write (rdzv_etcd_writes) */
  atomic_llong max_body;            /* the bytes of the largest request body sent (rdzv_etcd_max_request) */

  pthread_mutex_t auth_mu; /* token and token_gen */
  char *token;
  uint64_t token_gen;

  pthread_mutex_t pool_mu; /* idle curl handles, each with its open connections */
  CURL **pool;
  size_t n_pool, cap_pool;

  /* keep-alive (etcd_lease.c) */
  pthread_mutex_t ka_mu;
  pthread_cond_t ka_cv;
  pthread_t ka_thread;
  int ka_started, ka_stop;
  int64_t ka_in_callback; /* lease whose lost callback is running */
  struct rdzv_lease_table *leases; /* the kept leases: by id, and by due time (NULL: none yet) */
};

/* Request flags. */
enum {
  RDZV_REQ_IDEMPOTENT = 1, /* a read: may be re-sent after an answer was lost */
  RDZV_REQ_NOAUTH = 2,     /* no token (authenticate itself) */
};

/* POSTs body to path on the endpoints (failover, auth, retries; see etcd.h) and returns
 * the 200 answer's body in resp. `what` names the call in messages ("put /newt/j/plan"). */
newt_result_t rdzv_etcd_request(rdzv_etcd *c, const char *path, const char *body, int flags,
                                const char *what, newt_deadline_t d, newt_buf *resp);

/* A new curl handle with the client's TLS settings. */
CURL *rdzv_etcd_handle_new(rdzv_etcd *c);

/* Content type, and the token when auth is on (authenticating first if there is none yet).
 * *gen is the token generation used (for rdzv_etcd_reauth). */
newt_result_t rdzv_etcd_headers(rdzv_etcd *c, newt_deadline_t d, struct curl_slist **out,
                                uint64_t *gen);
/* Forgets token `gen` (unless another thread traded it since): the next request trades the
 * password anew. For a request that got no answer in time: an etcd emptied and started again
 * (chaos wipe) holds a request whose token is newer than its own history instead of refusing
 * it, so such a token is never seen refused. */
void rdzv_etcd_forget_token(rdzv_etcd *c, uint64_t gen);
/* Trades the password for a new token, unless another thread already did since `gen`. */
newt_result_t rdzv_etcd_reauth(rdzv_etcd *c, uint64_t gen, newt_deadline_t d);

/* Turns a failed transfer into a result with a message naming url ("connection refused").
 * *retry_safe is 1 when the request cannot have reached the server. */
newt_result_t rdzv_etcd_curl_result(rdzv_etcd *c, CURL *h, CURLcode cc, const char *errbuf,
                                    const char *url, int *retry_safe);

/* Sets up h to POST body (JSON) to url with headers, writing the answer through
 * write_fn(write_ud) and errors into errbuf. */
void rdzv_etcd_setup_post(CURL *h, const char *url, const char *body, struct curl_slist *hdrs,
                          curl_write_callback write_fn, void *write_ud, char *errbuf);

/* A condition variable on CLOCK_MONOTONIC (deadlines are monotonic). */
void rdzv_cond_init(pthread_cond_t *cv);

/* Adds base64 of data as a string field. NULL when out of memory. */
cJSON *rdzv_etcd_add_b64(cJSON *obj, const char *field, const void *data, size_t len);
/* Adds an int64 as a decimal string (the gateway's form). */
cJSON *rdzv_etcd_add_i64(cJSON *obj, const char *field, int64_t v);

void rdzv_etcd_lease_shutdown(rdzv_etcd *c);

/* snprintf into a fixed buffer where cutting a long message short is intended. */
void rdzv_fmt(char *dst, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
