/* An etcd v3 client over etcd's JSON gateway (`POST /v3/...`), built on libcurl and cJSON.
 *
 * The gateway speaks the v3 protobuf messages as JSON: keys and values are base64, int64
 * fields are decimal strings, zero-valued fields are omitted. This client hides all of
 * that: keys are C strings, values are byte ranges, numbers are int64_t.
 *
 * What it offers: put, range (one key, a prefix, any [key, range_end) with limit and
 * revision), delete, txn (compares on version / create / mod revision / value / lease;
 * success and failure op lists), leases (grant, revoke, time-to-live, a background
 * keep-alive that reports a lost lease at once), and watches (etcd_watch.c): one
 * streaming response per watch, read line by line, resumed after a reconnect from the
 * last delivered revision + 1, re-read as a "resync" snapshot when that revision has been
 * compacted.
 *
 * Endpoints and failover: opts.endpoints lists one or more URLs. A call tries the
 * endpoint that answered last, then the others; a refused or timed-out connection moves
 * on to the next one, and when all are unreachable the call retries with a short backoff
 * until its deadline, then fails with NEWT_ERR_UNAVAILABLE naming every URL and why.
 * A request that reached a server and then lost its answer is retried only when it is a
 * read (range, time-to-live); a write reports NEWT_ERR_UNAVAILABLE, since it may have been
 * applied.
 *
 * Auth: with opts.user set, the client trades user/password for a token
 * (/v3/auth/authenticate), sends it on every request ("Authorization: <token>") and
 * trades again when etcd says the token is invalid (expired, or etcd restarted). A wrong
 * password is NEWT_ERR_AUTH naming the user and URL. TLS: https endpoints are verified
 * against opts.ca_file (or the system store); opts.cert_file/key_file give a client
 * certificate (mTLS). A verification failure is NEWT_ERR_AUTH naming the URL and file.
 *
 * Threads: every function may be called from any thread at once. Connections are kept
 * alive in a pool of curl handles, so a call costs one HTTP round trip on an open
 * connection. Every call takes a deadline (newt_deadline_t, absolute monotonic). */
#ifndef NEWT_RENDEZVOUS_ETCD_H
#define NEWT_RENDEZVOUS_ETCD_H

#include <stddef.h>
#include <stdint.h>

#include "common/clock.h"
#include "common/err.h"

typedef struct rdzv_etcd rdzv_etcd;

typedef struct rdzv_etcd_opts {
  const char *endpoints;      /* "http://127.0.0.1:2379,https://10.0.0.2:2379" */
  const char *user;           /* NULL or "": no auth */
  const char *password;
  const char *ca_file;        /* PEM CA bundle that signs the servers' certificates */
  const char *cert_file;      /* PEM client certificate (mTLS), with key_file */
  const char *key_file;
  int64_t connect_timeout_ms; /* one connection attempt to one endpoint; 0: 1000 */
} rdzv_etcd_opts;

newt_result_t rdzv_etcd_init(const rdzv_etcd_opts *opts, rdzv_etcd **out);
/* Stops the keep-alive thread (leases are left to expire; revoke them first to leave at
 * once). Every watch of this client must have been freed. */
void rdzv_etcd_free(rdzv_etcd *c);

/* Counts every request of this client in m (NULL: none): newt_etcd_requests_total,
 * newt_etcd_request_errors_total (no endpoint answered, or etcd refused) and the histogram
 * newt_etcd_request_duration_seconds (failover and retries included). */
struct metrics;
newt_result_t rdzv_etcd_set_metrics(rdzv_etcd *c, struct metrics *m);

/* How many requests of this client asked etcd to write (put, delete, txn, lease grant and
 * revoke: each a raft proposal; keep-alives and reads are not): what a protocol costs. */
int64_t rdzv_etcd_writes(rdzv_etcd *c);
/* The bytes of the largest request body this client sent (JSON, values in base64): what
 * etcd's request limit (--max-request-bytes, 1.5 MiB by default) is measured against, with
 * the base64 of the gateway on top. */
int64_t rdzv_etcd_max_request(rdzv_etcd *c);

/* The endpoints as given, comma-separated (for messages). */
const char *rdzv_etcd_endpoints(const rdzv_etcd *c);

/* Whether etcd answered this client's last call (1), or the last call found no endpoint
 * answering by its deadline (0): an outage in progress as this client sees it (the lease
 * keep-alive makes calls every third of a TTL, so a client with a lease finds out within
 * one). */
int rdzv_etcd_reachable(const rdzv_etcd *c);
/* How many outages this client has seen end: +1 each time a call is answered after one
 * that was not. A caller that kept a picture of etcd (a watch, timers) compares it with
 * the value it last saw to know that an outage ended meanwhile. */
uint64_t rdzv_etcd_outages_ended(const rdzv_etcd *c);
/* Whether a call's result is etcd being away or full for now (unavailable, timed out, out
 * of space): the same call may succeed later, and nobody need stop for it. */
int rdzv_etcd_transient(newt_result_t r);

/* The alarms raised in the cluster (GET /v3/maintenance/alarm): *nospace when a member ran
 * out of its quota (etcd then refuses every write until space is freed: compact, defrag,
 * `etcdctl alarm disarm`), *corrupt when a member's data is corrupt. */
newt_result_t rdzv_etcd_alarms(rdzv_etcd *c, newt_deadline_t d, int *nospace, int *corrupt);

/* One key-value pair. key and value are malloc'd and NUL-terminated (value may hold
 * NULs: use value_len). */
typedef struct rdzv_etcd_kv {
  char *key;
  size_t key_len;
  char *value;
  size_t value_len;
  int64_t create_revision;
  int64_t mod_revision;
  int64_t version;
  int64_t lease;
} rdzv_etcd_kv;

void rdzv_etcd_kv_free(rdzv_etcd_kv *kv);

/* The answer of a range: kvs in etcd's order, the store revision it was read at. */
typedef struct rdzv_etcd_kvs {
  rdzv_etcd_kv *kvs;
  size_t n;
  int64_t count;    /* keys in the range (more than n when limited) */
  int more;         /* 1 when limit cut the answer */
  int64_t revision; /* header revision */
} rdzv_etcd_kvs;

void rdzv_etcd_kvs_free(rdzv_etcd_kvs *r);

typedef enum rdzv_etcd_sort {
  RDZV_SORT_NONE = 0,
  RDZV_SORT_KEY_ASCEND,
  RDZV_SORT_CREATE_ASCEND, /* by create_revision: election order */
  RDZV_SORT_MOD_ASCEND,
} rdzv_etcd_sort;

typedef struct rdzv_etcd_range_opts {
  int prefix;            /* every key starting with `key` */
  const char *range_end; /* or [key, range_end); "\0" style "all keys >= key" is prefix "" */
  int64_t limit;         /* 0: no limit */
  int64_t revision;      /* 0: latest */
  int keys_only;
  int count_only;
  rdzv_etcd_sort sort;
} rdzv_etcd_range_opts;

/* The range_end that selects every key with the given prefix: the prefix with its last
 * byte below 0xff incremented and what follows dropped; "\0" (all keys) when every byte
 * is 0xff or the prefix is empty. out needs len + 1 bytes; *out_len is set. */
void rdzv_etcd_prefix_end(const char *prefix, size_t len, char *out, size_t *out_len);

newt_result_t rdzv_etcd_range(rdzv_etcd *c, const char *key, const rdzv_etcd_range_opts *o,
                              newt_deadline_t d, rdzv_etcd_kvs *out);
/* One key; NEWT_ERR_NOTFOUND when absent. *revision (may be NULL) is the store revision. */
newt_result_t rdzv_etcd_get(rdzv_etcd *c, const char *key, newt_deadline_t d, rdzv_etcd_kv *out,
                            int64_t *revision);
/* lease 0: no lease. *revision (may be NULL) is the revision of the write. */
newt_result_t rdzv_etcd_put(rdzv_etcd *c, const char *key, const void *value, size_t len,
                            int64_t lease, newt_deadline_t d, int64_t *revision);
/* Deletes key (or every key under it when prefix); *deleted (may be NULL) counts them. */
newt_result_t rdzv_etcd_delete(rdzv_etcd *c, const char *key, int prefix, newt_deadline_t d,
                               int64_t *deleted, int64_t *revision);
/* Compacts the key-value history up to revision (tests; operators). */
newt_result_t rdzv_etcd_compact(rdzv_etcd *c, int64_t revision, newt_deadline_t d);

/* --- transactions ---------------------------------------------------------------------- */

typedef enum rdzv_etcd_cmp_target {
  RDZV_CMP_VERSION = 0,
  RDZV_CMP_CREATE,
  RDZV_CMP_MOD,
  RDZV_CMP_VALUE,
  RDZV_CMP_LEASE,
} rdzv_etcd_cmp_target;

typedef enum rdzv_etcd_cmp_result {
  RDZV_CMP_EQUAL = 0,
  RDZV_CMP_GREATER,
  RDZV_CMP_LESS,
  RDZV_CMP_NOT_EQUAL,
} rdzv_etcd_cmp_result;

/* key <target> <result> number (or value). A missing key has version, create and mod
 * revision 0: "create_revision == 0" is "the key does not exist". */
typedef struct rdzv_etcd_cmp {
  const char *key;
  rdzv_etcd_cmp_target target;
  rdzv_etcd_cmp_result result;
  int64_t number;    /* version / revision / lease */
  const void *value; /* RDZV_CMP_VALUE */
  size_t value_len;
} rdzv_etcd_cmp;

typedef enum rdzv_etcd_op_type { RDZV_OP_PUT = 0, RDZV_OP_RANGE, RDZV_OP_DELETE } rdzv_etcd_op_type;

typedef struct rdzv_etcd_op {
  rdzv_etcd_op_type type;
  const char *key;
  int prefix;          /* range / delete: the whole prefix */
  const char *range_end; /* range / delete: or [key, range_end) */
  const void *value;   /* put */
  size_t value_len;
  int64_t lease;       /* put */
} rdzv_etcd_op;

typedef struct rdzv_etcd_op_result {
  rdzv_etcd_op_type type;
  rdzv_etcd_kvs range;  /* RDZV_OP_RANGE */
  int64_t deleted;      /* RDZV_OP_DELETE */
} rdzv_etcd_op_result;

typedef struct rdzv_etcd_txn_result {
  int succeeded;   /* 1: the compares held and `success` ran; 0: `failure` ran */
  int64_t revision;
  rdzv_etcd_op_result *results;
  size_t n;
} rdzv_etcd_txn_result;

void rdzv_etcd_txn_result_free(rdzv_etcd_txn_result *r);

/* If all cmps hold, runs success, else failure. out may be NULL (then only *succeeded is
 * not available: use the out form when you need it). */
newt_result_t rdzv_etcd_txn(rdzv_etcd *c, const rdzv_etcd_cmp *cmps, size_t ncmp,
                            const rdzv_etcd_op *success, size_t nsuccess,
                            const rdzv_etcd_op *failure, size_t nfailure, newt_deadline_t d,
                            rdzv_etcd_txn_result *out);

/* --- leases ----------------------------------------------------------------------------- */

/* id 0 lets etcd choose. *granted_ttl (may be NULL) is what etcd granted. */
newt_result_t rdzv_etcd_lease_grant(rdzv_etcd *c, int64_t ttl_s, int64_t id, newt_deadline_t d,
                                    int64_t *lease, int64_t *granted_ttl);
/* Revoking drops every key on the lease. NEWT_ERR_NOTFOUND when it does not exist. */
newt_result_t rdzv_etcd_lease_revoke(rdzv_etcd *c, int64_t lease, newt_deadline_t d);
/* Seconds left (NEWT_ERR_NOTFOUND when the lease expired or never was). */
newt_result_t rdzv_etcd_lease_ttl(rdzv_etcd *c, int64_t lease, newt_deadline_t d, int64_t *ttl,
                                  int64_t *granted_ttl);
/* One renewal; NEWT_ERR_NOTFOUND when the lease is gone. */
newt_result_t rdzv_etcd_lease_keepalive_once(rdzv_etcd *c, int64_t lease, newt_deadline_t d,
                                             int64_t *ttl);

/* Called on the keep-alive thread, once, when a kept lease is lost: etcd says it is gone,
 * or no renewal succeeded for its whole TTL (it may have expired). Must not block. */
typedef void (*rdzv_etcd_lease_lost_fn)(void *ud, int64_t lease, const char *why);

/* Renews `lease` (granted with ttl_s) every ttl_s/3 on the client's keep-alive thread
 * until rdzv_etcd_lease_unkeep. */
newt_result_t rdzv_etcd_lease_keep(rdzv_etcd *c, int64_t lease, int64_t ttl_s,
                                   rdzv_etcd_lease_lost_fn fn, void *ud);
/* Stops renewing (the lease then expires unless revoked). */
void rdzv_etcd_lease_unkeep(rdzv_etcd *c, int64_t lease);
/* 1 when the kept lease was lost (why filled when not NULL), 0 while kept alive,
 * -1 when it is not kept by this client. */
int rdzv_etcd_lease_lost(rdzv_etcd *c, int64_t lease, char *why, size_t cap);

/* --- watches (etcd_watch.c) ----------------------------------------------------------------- */

typedef enum rdzv_etcd_event_type { RDZV_EVENT_PUT = 0, RDZV_EVENT_DELETE = 1 } rdzv_etcd_event_type;

typedef struct rdzv_etcd_event {
  rdzv_etcd_event_type type;
  rdzv_etcd_kv kv;      /* for DELETE: key and mod_revision only */
  rdzv_etcd_kv prev_kv; /* when asked for with prev_kv and etcd had it */
  int has_prev;
} rdzv_etcd_event;

typedef enum rdzv_etcd_watch_kind {
  RDZV_WATCH_EVENTS = 0, /* events, in revision order, each revision once */
  RDZV_WATCH_PROGRESS,   /* nothing changed up to `revision` */
  RDZV_WATCH_RESYNC,     /* history was compacted: kvs is the whole range at `revision`;
                            events between the last delivered revision and it are lost,
                            so the receiver replaces its state with kvs */
  RDZV_WATCH_ERROR,      /* the stream broke or was refused: `error`; it is re-opened */
} rdzv_etcd_watch_kind;

typedef struct rdzv_etcd_watch_resp {
  rdzv_etcd_watch_kind kind;
  int64_t revision;         /* header revision (EVENTS: of the last event) */
  rdzv_etcd_event *events;
  size_t n_events;
  rdzv_etcd_kv *kvs;        /* RESYNC */
  size_t n_kvs;
  const char *error;        /* ERROR */
} rdzv_etcd_watch_resp;

/* Called on the watch's own thread, one response at a time; the response is freed when
 * it returns. It may call rdzv_etcd_watch_cancel but not rdzv_etcd_watch_free. */
typedef void (*rdzv_etcd_watch_fn)(void *ud, const rdzv_etcd_watch_resp *r);

typedef struct rdzv_etcd_watch_opts {
  int prefix;               /* every key under `key` */
  int64_t start_revision;   /* 0: from now on */
  int prev_kv;
  int progress_notify;      /* ask etcd for progress notifications */
  int64_t idle_timeout_ms;  /* > 0: re-open the stream when nothing arrived for this long */
} rdzv_etcd_watch_opts;

typedef struct rdzv_etcd_watch rdzv_etcd_watch;

/* Starts a watch on its own thread; returns once etcd confirmed it (or by d with an
 * error): events after the returned *revision (may be NULL) are delivered. */
newt_result_t rdzv_etcd_watch_start(rdzv_etcd *c, const char *key, const rdzv_etcd_watch_opts *o,
                                    rdzv_etcd_watch_fn fn, void *ud, newt_deadline_t d,
                                    rdzv_etcd_watch **out);
/* Asks the watch to stop; safe from any thread, the callback included; returns at once. */
void rdzv_etcd_watch_cancel(rdzv_etcd_watch *w);
/* Cancels, waits for the thread and frees. Never from the watch's callback. */
void rdzv_etcd_watch_free(rdzv_etcd_watch *w);
/* The next revision the watch will deliver (last delivered + 1). */
int64_t rdzv_etcd_watch_next_revision(rdzv_etcd_watch *w);
/* How many times the stream was re-opened after breaking (tests, metrics). */
int64_t rdzv_etcd_watch_reconnects(rdzv_etcd_watch *w);

#endif
