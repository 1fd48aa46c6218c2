/* The host's transaction gateway (gateway.h): a unix socket server that runs its clients'
 * transactions through the node agent's batch (batch.h), and the client its workers use.
 *
 * The wire. A connection carries a request, then its answer, then the next request; each is
 * one frame:
 *
 *   offset  size  what
 *   0       4     N, the bytes of JSON that follow, big-endian: 1 to 4 MiB for a request,
 *                 1 to 64 MiB for an answer
 *   4       N     one JSON object (below)
 *
 * A request:
 *
 *   field        what
 *   timeout_ms   the caller's time left (-1: no deadline; the gateway waits 10 min at most)
 *   compare      [{key, target, result, number, value}], at most 1024; target is version,
 *                create, mod, value or lease; result is equal, greater, less or not_equal
 *   success      [{type, key, prefix, range_end, value, lease}], at most 1024; type is put,
 *                range or delete; prefix is true or absent; range_end absent is none
 *   failure      the same as success
 *
 * An answer is etcd's own TxnResponse as its JSON gateway writes it ({header: {revision},
 * succeeded, responses: [{response_range | response_put | response_delete_range}]}), which
 * the client reads with the parser of a direct call (etcd_parse.h); or an error, {code,
 * message}: what rdzv_batch_txn returned, which the client returns as it is. Keys, values
 * and range_end are base64 (they are bytes); numbers are JSON numbers or decimal strings;
 * a field left out is zero or false.
 *
 * A subscription (gateway.h's one watch per host) is a request of its own:
 *
 *   field        what
 *   watch        the key (base64), one the gateway shares (rdzv_gateway_share)
 *   timeout_ms   the time to start the host's etcd watch in when none runs yet: the caller's
 *                time left, less a tenth (1 s at most) for the answer to come back in
 *
 * It is answered {watching: true}, or an error ({code, message}: NEWT_ERR_NOTFOUND when the
 * key is not shared; etcd's error when the watch could not start). After {watching} the
 * connection carries only the gateway's frames {kv: {key, value, create_revision,
 * mod_revision, version, lease}} (etcd's KeyValue as in a range answer, 64 MiB at most):
 * the key's value at once when it has one, then each newer one (puts, and the value a
 * resync found; deletes are not sent). The subscriber sends nothing more; bytes from it, or
 * its end, end the subscription. The value kept is the newest, so a subscriber that reads
 * slowly skips values, never queues them; one that takes more than 10 s to read a frame (a
 * stopped worker) is dropped. An etcd watch's callback only stores the value and wakes the
 * senders: no subscriber's socket can hold it up. The client ends a subscription (fn(NULL))
 * at a frame that is not a {kv} of the key it watches, as at the connection's end.
 *
 * The server trusts nothing a connection sends. A frame outside its bound, or one that is
 * not JSON or has a bad field (not base64, a key holding a NUL byte, an unknown name, too
 * many ops) is answered with NEWT_ERR_INVALID naming it, and the connection closed; a frame
 * cut short closes it. The gateway runs only whole requests, so a request whose sending
 * failed never ran: the client says *unreached = 1. A connection found closed while idle
 * (the agent restarted) is opened again once and the request sent again.
 *
 * Threads: the server has one accepting thread and one per connection, all joined by
 * rdzv_gateway_stop (which shuts the connections down, so only a transaction in flight, or
 * a subscription starting its etcd watch, holds it, for its deadline); a subscriber's
 * connection thread is its sender. A shared key's etcd watch runs on its own thread until
 * stop frees it, after the connections. A client's calls hold its mutex; a client's
 * subscription reads on a thread of its own. */
#include "rendezvous/gateway.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/json.h"
#include "common/log.h"
#include "common/strutil.h"
#include "rendezvous/etcd_internal.h"
#include "rendezvous/etcd_parse.h"

#define GW_MAX_REQUEST ((size_t)4 << 20)  /* bytes of a request's JSON */
#define GW_MAX_ANSWER ((size_t)64 << 20)  /* bytes of an answer's JSON */
#define GW_MAX_OPS 1024                   /* compares, and ops in each list, of one request */
#define GW_MAX_WAIT_MS ((int64_t)600000)  /* the longest the server runs one transaction */
#define GW_MAX_CONNS 1024                 /* open connections of one gateway */
#define GW_BACKLOG 128
#define GW_MAX_SHARED 4                   /* keys one gateway shares */
#define GW_SEND_MS 10000                  /* the longest a subscriber may take to read one frame */
#define GW_PEER_CHECK_MS 500              /* how often an idle subscriber's connection is looked at */
#define GW_PATH_MAX (sizeof(((struct sockaddr_un *)0)->sun_path) - 1)

static const char *const cmp_targets[] = {"version", "create", "mod", "value", "lease", NULL};
static const char *const cmp_results[] = {"equal", "greater", "less", "not_equal", NULL};
static const char *const op_types[] = {"put", "range", "delete", NULL};

/* --- frames ------------------------------------------------------------------------------ */

typedef enum { IO_OK = 0, IO_EOF, IO_FAIL, IO_TIMEOUT } io_status;

static int poll_ms(newt_deadline_t d) {
  if (d == NEWT_DEADLINE_NONE) return -1;
  int64_t left = newt_deadline_left_ms(d);
  return left > INT_MAX ? INT_MAX : (int)left;
}

/* Moves n bytes to fd (out) or from it, waiting in poll until d. IO_FAIL leaves errno set;
 * IO_EOF: the peer closed before n bytes came. */
static io_status io_all(int fd, void *buf, size_t n, int out, newt_deadline_t d) {
  char *p = buf;
  size_t k = 0;
  while (k < n) {
    struct pollfd pf = {.fd = fd, .events = out ? POLLOUT : POLLIN};
    int pr = poll(&pf, 1, poll_ms(d));
    if (pr < 0 && errno != EINTR) return IO_FAIL;
    if (pr <= 0) {
      if (newt_deadline_passed(d)) return IO_TIMEOUT;
      continue;
    }
    ssize_t m = out ? send(fd, p + k, n - k, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p + k, n - k, MSG_DONTWAIT);
    if (m > 0) {
      k += (size_t)m;
    } else if (m == 0 && !out) {
      return IO_EOF;
    } else if (m < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return IO_FAIL;
    }
  }
  return IO_OK;
}

static void put_be32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}

static uint32_t get_be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* frame = the length, then text (which is freed). */
static newt_result_t make_frame(char *text, newt_buf *frame) {
  size_t n = strlen(text);
  unsigned char hdr[4];
  put_be32(hdr, (uint32_t)n);
  newt_buf_reset(frame);
  newt_result_t r = newt_buf_append(frame, hdr, 4);
  if (r == NEWT_OK) r = newt_buf_append(frame, text, n);
  free(text);
  return r;
}

/* --- requests: the client encodes --------------------------------------------------------- */

static cJSON *add_bytes(cJSON *o, const char *field, const void *data, size_t len) {
  return rdzv_etcd_add_b64(o, field, data ? data : "", data ? len : 0);
}

static newt_result_t encode_cmp(cJSON *arr, const rdzv_etcd_cmp *m, size_t i) {
  if (!m->key || (unsigned)m->target > RDZV_CMP_LEASE || (unsigned)m->result > RDZV_CMP_NOT_EQUAL)
    return NEWT_ERR(NEWT_ERR_INVALID, "host gateway: compare[%zu] has no key or a bad target/result", i);
  cJSON *o = cJSON_CreateObject();
  NEWT_CHECK_ALLOC(o);
  cJSON_AddItemToArray(arr, o);
  int ok = add_bytes(o, "key", m->key, strlen(m->key)) &&
           cJSON_AddStringToObject(o, "target", cmp_targets[m->target]) &&
           cJSON_AddStringToObject(o, "result", cmp_results[m->result]);
  if (ok && m->target == RDZV_CMP_VALUE) ok = add_bytes(o, "value", m->value, m->value_len) != NULL;
  else if (ok && m->number) ok = newt_json_add_int(o, "number", m->number) != NULL;
  return ok ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "host gateway: out of memory encoding compare[%zu]", i);
}

static newt_result_t encode_op(cJSON *arr, const char *list, const rdzv_etcd_op *op, size_t i) {
  if (!op->key || (unsigned)op->type > RDZV_OP_DELETE)
    return NEWT_ERR(NEWT_ERR_INVALID, "host gateway: %s[%zu] has no key or a bad type", list, i);
  cJSON *o = cJSON_CreateObject();
  NEWT_CHECK_ALLOC(o);
  cJSON_AddItemToArray(arr, o);
  int ok = cJSON_AddStringToObject(o, "type", op_types[op->type]) && add_bytes(o, "key", op->key, strlen(op->key));
  if (ok && op->type == RDZV_OP_PUT) {
    ok = add_bytes(o, "value", op->value, op->value_len) && (!op->lease || newt_json_add_int(o, "lease", op->lease));
  } else if (ok) {
    ok = (!op->prefix || cJSON_AddTrueToObject(o, "prefix")) &&
         (!op->range_end || add_bytes(o, "range_end", op->range_end, strlen(op->range_end)));
  }
  return ok ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "host gateway: out of memory encoding %s[%zu]", list, i);
}

static newt_result_t check_count(const char *list, size_t n) {
  if (n > GW_MAX_OPS)
    return NEWT_ERR(NEWT_ERR_INVALID, "host gateway: %zu entries in %s, over the gateway's bound of %d", n, list,
                    GW_MAX_OPS);
  return NEWT_OK;
}

static newt_result_t encode_ops(cJSON *req, const char *list, const rdzv_etcd_op *ops, size_t n) {
  NEWT_CHECK(check_count(list, n));
  if (n == 0) return NEWT_OK;
  cJSON *arr = cJSON_AddArrayToObject(req, list);
  NEWT_CHECK_ALLOC(arr);
  for (size_t i = 0; i < n; i++) NEWT_CHECK(encode_op(arr, list, &ops[i], i));
  return NEWT_OK;
}

static newt_result_t encode_cmps(cJSON *req, const rdzv_etcd_cmp *cmps, size_t n) {
  NEWT_CHECK(check_count("compare", n));
  if (n == 0) return NEWT_OK;
  cJSON *arr = cJSON_AddArrayToObject(req, "compare");
  NEWT_CHECK_ALLOC(arr);
  for (size_t i = 0; i < n; i++) NEWT_CHECK(encode_cmp(arr, &cmps[i], i));
  return NEWT_OK;
}

typedef struct gw_txn {
  const rdzv_etcd_cmp *cmps;
  size_t ncmp;
  const rdzv_etcd_op *success, *failure;
  size_t nsuccess, nfailure;
} gw_txn;

/* The request's frame, with the time left to d. */
static newt_result_t encode_request(const gw_txn *t, newt_deadline_t d, newt_buf *frame) {
  cJSON *req = cJSON_CreateObject();
  NEWT_CHECK_ALLOC(req);
  int64_t timeout = d == NEWT_DEADLINE_NONE ? -1 : newt_deadline_left_ms(d);
  newt_result_t r = newt_json_add_int(req, "timeout_ms", timeout)
                        ? NEWT_OK
                        : NEWT_ERR(NEWT_ERR_NOMEM, "host gateway: out of memory encoding a request");
  if (r == NEWT_OK) r = encode_cmps(req, t->cmps, t->ncmp);
  if (r == NEWT_OK) r = encode_ops(req, "success", t->success, t->nsuccess);
  if (r == NEWT_OK) r = encode_ops(req, "failure", t->failure, t->nfailure);
  char *text = r == NEWT_OK ? newt_json_print(req) : NULL;
  cJSON_Delete(req);
  if (r != NEWT_OK) return r;
  if (!text) return NEWT_ERR(NEWT_ERR_NOMEM, "host gateway: out of memory printing a request");
  size_t n = strlen(text);
  if (n > GW_MAX_REQUEST) {
    free(text);
    return NEWT_ERR(NEWT_ERR_INVALID, "host gateway: a request of %zu bytes, over the gateway's bound of %zu (4 MiB)",
                    n, GW_MAX_REQUEST);
  }
  return make_frame(text, frame);
}

/* --- requests: the server decodes --------------------------------------------------------- */

typedef struct gw_req {
  int64_t timeout_ms;
  rdzv_etcd_cmp *cmps;
  size_t ncmp;
  rdzv_etcd_op *ops[2]; /* success, failure */
  size_t nops[2];
} gw_req;

static void req_free(gw_req *q) {
  for (size_t i = 0; i < q->ncmp; i++) {
    free((void *)q->cmps[i].key);
    free((void *)q->cmps[i].value);
  }
  free(q->cmps);
  for (int l = 0; l < 2; l++) {
    for (size_t i = 0; i < q->nops[l]; i++) {
      free((void *)q->ops[l][i].key);
      free((void *)q->ops[l][i].range_end);
      free((void *)q->ops[l][i].value);
    }
    free(q->ops[l]);
  }
  memset(q, 0, sizeof *q);
}

/* A base64 field as malloc'd bytes (NULL when absent). text: refused when it holds a NUL
 * byte (keys are C strings). */
static newt_result_t get_bytes(const cJSON *o, const char *what, const char *field, int text, char **out,
                               size_t *len) {
  const char *s = NULL;
  NEWT_CHECK(newt_json_get_str(o, what, field, 0, &s));
  if (!s) return NEWT_OK;
  size_t n = 0;
  char *v = newt_base64_decode_alloc(s, strlen(s), &n);
  if (!v) return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: not base64", what, field);
  if (text && memchr(v, 0, n)) {
    free(v);
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: holds a NUL byte", what, field);
  }
  *out = v;
  if (len) *len = n;
  return NEWT_OK;
}

static newt_result_t get_key(const cJSON *o, const char *what, char **out) {
  NEWT_CHECK(get_bytes(o, what, "key", 1, out, NULL));
  if (!*out) return NEWT_ERR(NEWT_ERR_INVALID, "%s.key: missing", what);
  return NEWT_OK;
}

/* A field naming one of names: its index. */
static newt_result_t get_name(const cJSON *o, const char *what, const char *field, const char *const *names,
                              int *out) {
  const char *s = NULL;
  NEWT_CHECK(newt_json_get_str(o, what, field, 1, &s));
  for (int i = 0; names[i]; i++) {
    if (strcmp(s, names[i]) == 0) {
      *out = i;
      return NEWT_OK;
    }
  }
  char shown[40];
  return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: unknown \"%s\"", what, field, newt_str_printable(shown, sizeof shown, s));
}

static newt_result_t decode_cmp(const cJSON *o, const char *what, rdzv_etcd_cmp *m) {
  int target = 0, result = 0;
  char *key = NULL, *value = NULL;
  NEWT_CHECK(get_name(o, what, "target", cmp_targets, &target));
  NEWT_CHECK(get_name(o, what, "result", cmp_results, &result));
  NEWT_CHECK(newt_json_get_int(o, what, "number", 0, &m->number));
  NEWT_CHECK(get_key(o, what, &key));
  m->key = key;
  m->target = (rdzv_etcd_cmp_target)target;
  m->result = (rdzv_etcd_cmp_result)result;
  if (target != RDZV_CMP_VALUE) return NEWT_OK;
  NEWT_CHECK(get_bytes(o, what, "value", 0, &value, &m->value_len));
  m->value = value;
  return NEWT_OK;
}

static newt_result_t decode_op(const cJSON *o, const char *what, rdzv_etcd_op *op) {
  int type = 0;
  char *key = NULL, *end = NULL, *value = NULL;
  NEWT_CHECK(get_name(o, what, "type", op_types, &type));
  NEWT_CHECK(newt_json_get_bool(o, what, "prefix", 0, &op->prefix));
  NEWT_CHECK(newt_json_get_int(o, what, "lease", 0, &op->lease));
  op->type = (rdzv_etcd_op_type)type;
  NEWT_CHECK(get_key(o, what, &key));
  op->key = key;
  NEWT_CHECK(get_bytes(o, what, "range_end", 1, &end, NULL));
  op->range_end = end;
  NEWT_CHECK(get_bytes(o, what, "value", 0, &value, &op->value_len));
  op->value = value;
  return NEWT_OK;
}

/* The array `field` of req (absent: none): a calloc'd array of size bytes for each of its
 * entries (at most GW_MAX_OPS), and its first entry. */
static newt_result_t get_list(const cJSON *req, const char *field, size_t size, void **arr, const cJSON **first) {
  const cJSON *a = NULL;
  NEWT_CHECK(newt_json_get_arr(req, "request", field, 0, &a));
  int cnt = a ? cJSON_GetArraySize(a) : 0;
  if (cnt > GW_MAX_OPS)
    return NEWT_ERR(NEWT_ERR_INVALID, "request.%s: %d entries, over the gateway's bound of %d", field, cnt, GW_MAX_OPS);
  if (cnt <= 0) return NEWT_OK;
  *arr = calloc((size_t)cnt, size);
  if (!*arr) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for %d entries of request.%s", cnt, field);
  *first = a->child;
  return NEWT_OK;
}

static newt_result_t decode_cmps(const cJSON *req, gw_req *q) {
  void *arr = NULL;
  const cJSON *it = NULL;
  NEWT_CHECK(get_list(req, "compare", sizeof *q->cmps, &arr, &it));
  q->cmps = arr;
  for (size_t i = 0; it; it = it->next, i++) {
    char what[48];
    snprintf(what, sizeof what, "request.compare[%zu]", i);
    q->ncmp = i + 1; /* freed from here on */
    NEWT_CHECK(decode_cmp(it, what, &q->cmps[i]));
  }
  return NEWT_OK;
}

static newt_result_t decode_ops(const cJSON *req, const char *field, gw_req *q, int l) {
  void *arr = NULL;
  const cJSON *it = NULL;
  NEWT_CHECK(get_list(req, field, sizeof *q->ops[l], &arr, &it));
  q->ops[l] = arr;
  for (size_t i = 0; it; it = it->next, i++) {
    char what[48];
    snprintf(what, sizeof what, "request.%s[%zu]", field, i);
    q->nops[l] = i + 1;
    NEWT_CHECK(decode_op(it, what, &q->ops[l][i]));
  }
  return NEWT_OK;
}

static newt_result_t decode_request(const cJSON *j, gw_req *q) {
  memset(q, 0, sizeof *q);
  newt_result_t r = NEWT_OK;
  NEWT_CHECK_GOTO(newt_json_get_int(j, "request", "timeout_ms", 1, &q->timeout_ms), r, done);
  NEWT_CHECK_GOTO(decode_cmps(j, q), r, done);
  NEWT_CHECK_GOTO(decode_ops(j, "success", q, 0), r, done);
  NEWT_CHECK_GOTO(decode_ops(j, "failure", q, 1), r, done);
done:
  if (r != NEWT_OK) req_free(q);
  return r;
}

/* --- answers: the server encodes etcd's TxnResponse, the client parses it ------------------ */

static int add_header(cJSON *o, int64_t revision) {
  cJSON *h = cJSON_AddObjectToObject(o, "header");
  return h && rdzv_etcd_add_i64(h, "revision", revision);
}

/* kv's fields into o, as etcd writes a KeyValue. */
static int fill_kv(cJSON *o, const rdzv_etcd_kv *kv) {
  return add_bytes(o, "key", kv->key, kv->key_len) && add_bytes(o, "value", kv->value, kv->value_len) &&
         rdzv_etcd_add_i64(o, "create_revision", kv->create_revision) &&
         rdzv_etcd_add_i64(o, "mod_revision", kv->mod_revision) && rdzv_etcd_add_i64(o, "version", kv->version) &&
         rdzv_etcd_add_i64(o, "lease", kv->lease);
}

static int encode_kv(cJSON *arr, const rdzv_etcd_kv *kv) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return 0;
  cJSON_AddItemToArray(arr, o);
  return fill_kv(o, kv);
}

static int encode_range(cJSON *o, const rdzv_etcd_kvs *r) {
  cJSON *arr = cJSON_AddArrayToObject(o, "kvs");
  int ok = arr && add_header(o, r->revision) && rdzv_etcd_add_i64(o, "count", r->count) &&
           (!r->more || cJSON_AddTrueToObject(o, "more"));
  for (size_t i = 0; ok && i < r->n; i++) ok = encode_kv(arr, &r->kvs[i]);
  return ok;
}

static int encode_op_result(cJSON *arr, const rdzv_etcd_op_result *res) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return 0;
  cJSON_AddItemToArray(arr, o);
  switch (res->type) {
    case RDZV_OP_RANGE: {
      cJSON *r = cJSON_AddObjectToObject(o, "response_range");
      return r && encode_range(r, &res->range);
    }
    case RDZV_OP_DELETE: {
      cJSON *r = cJSON_AddObjectToObject(o, "response_delete_range");
      return r && rdzv_etcd_add_i64(r, "deleted", res->deleted);
    }
    default: return cJSON_AddObjectToObject(o, "response_put") != NULL;
  }
}

/* The answer's text (malloc'd), NULL when out of memory. */
static char *encode_result(const rdzv_etcd_txn_result *res) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON *arr = cJSON_AddArrayToObject(o, "responses");
  int ok = arr && add_header(o, res->revision) && (!res->succeeded || cJSON_AddTrueToObject(o, "succeeded"));
  for (size_t i = 0; ok && i < res->n; i++) ok = encode_op_result(arr, &res->results[i]);
  char *text = ok ? newt_json_print(o) : NULL;
  cJSON_Delete(o);
  return text;
}

static char *encode_error(newt_result_t code, const char *message) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  char *text = NULL;
  if (cJSON_AddNumberToObject(o, "code", code) && cJSON_AddStringToObject(o, "message", message))
    text = newt_json_print(o);
  cJSON_Delete(o);
  return text;
}

/* --- the server ---------------------------------------------------------------------------- */

typedef struct gw_conn {
  struct rdzv_gateway *g;
  int fd;   /* closed (-1) by its thread, under g->mu */
  int done; /* its thread is returning: join it */
  pthread_t thread;
  struct gw_conn *next;
} gw_conn;

/* A key the gateway shares: one etcd watch, started by the first subscription, and the
 * newest value it saw. Guarded by g->share_mu (watch: set under it, freed by stop). */
typedef struct gw_share {
  struct rdzv_gateway *g;
  rdzv_etcd *c;
  char *key;
  rdzv_etcd_watch *watch; /* NULL: not started */
  int starting;           /* a subscription is starting the watch: the others wait */
  rdzv_etcd_kv kv;        /* the newest value, when has_kv */
  int has_kv;
  uint64_t seq;           /* +1 with each value stored */
  newt_buf frame;         /* the {kv} frame of value frame_seq, made by the first sender */
  uint64_t frame_seq;
} gw_share;

struct rdzv_gateway {
  rdzv_batch *b;
  char path[GW_PATH_MAX + 1];
  int lfd;
  int wake[2];     /* a byte here stops the accepting thread */
  dev_t dev;       /* the socket bound: stop removes the path only while it is this one */
  ino_t ino;
  pthread_t accepter;
  pthread_mutex_t mu; /* conns, nconns */
  gw_conn *conns;
  int nconns;
  pthread_mutex_t share_mu; /* shares, nshares, stopping, the counts */
  pthread_cond_t share_cv;  /* a new value, a watch started (or not), stop */
  gw_share shares[GW_MAX_SHARED];
  int nshares;
  int stopping;
  int64_t subscriptions, watches;
};

/* Sends an error answer: code and this thread's message. */
static void send_error(int fd, newt_result_t code) {
  char *text = encode_error(code, newt_errmsg());
  newt_buf frame;
  newt_buf_init(&frame);
  if (text && make_frame(text, &frame) == NEWT_OK) (void)io_all(fd, frame.data, frame.len, 1, NEWT_DEADLINE_NONE);
  newt_buf_free(&frame);
}

/* Runs a decoded request through the batch: the answer's text (malloc'd; NULL: no memory). */
static char *run_request(rdzv_gateway *g, gw_req *q) {
  int64_t ms = q->timeout_ms < 0 || q->timeout_ms > GW_MAX_WAIT_MS ? GW_MAX_WAIT_MS : q->timeout_ms;
  rdzv_etcd_txn_result res;
  memset(&res, 0, sizeof res);
  newt_result_t r = rdzv_batch_txn(g->b, q->cmps, q->ncmp, q->ops[0], q->nops[0], q->ops[1], q->nops[1],
                                   newt_deadline_in_ms(ms), &res);
  if (r != NEWT_OK) return encode_error(r, newt_errmsg());
  char *text = encode_result(&res);
  if (text && strlen(text) > GW_MAX_ANSWER) {
    size_t n = strlen(text);
    free(text);
    NEWT_ERR(NEWT_ERR_INVALID, "host gateway: the answer of %zu bytes is over the bound of %zu (64 MiB); "
             "the transaction ran at revision %lld", n, GW_MAX_ANSWER, (long long)res.revision);
    text = encode_error(NEWT_ERR_INVALID, newt_errmsg());
  }
  rdzv_etcd_txn_result_free(&res);
  return text;
}

/* --- shared watches: the server ------------------------------------------------------------ */

newt_result_t rdzv_gateway_share(rdzv_gateway *g, rdzv_etcd *c, const char *key) {
  if (!g || !c || !key || !*key) return NEWT_ERR(NEWT_ERR_INVALID, "host gateway: share: no gateway, client or key");
  newt_result_t r = NEWT_OK;
  pthread_mutex_lock(&g->share_mu);
  int i = 0;
  while (i < g->nshares && strcmp(g->shares[i].key, key) != 0) i++;
  if (i < g->nshares) {
    /* shared already */
  } else if (g->nshares == GW_MAX_SHARED) {
    r = NEWT_ERR(NEWT_ERR_INVALID, "host gateway %s: cannot share %.200s: it shares %d keys, its most", g->path, key,
                 GW_MAX_SHARED);
  } else {
    gw_share *s = &g->shares[i];
    s->key = newt_strdup(key);
    if (s->key) {
      s->g = g;
      s->c = c;
      newt_buf_init(&s->frame);
      g->nshares++;
    } else {
      r = NEWT_ERR(NEWT_ERR_NOMEM, "host gateway %s: out of memory sharing %.200s", g->path, key);
    }
  }
  pthread_mutex_unlock(&g->share_mu);
  return r;
}

void rdzv_gateway_share_counts(rdzv_gateway *g, int64_t *subscriptions, int64_t *watches) {
  int64_t s = 0, w = 0;
  if (g) {
    pthread_mutex_lock(&g->share_mu);
    s = g->subscriptions;
    w = g->watches;
    pthread_mutex_unlock(&g->share_mu);
  }
  if (subscriptions) *subscriptions = s;
  if (watches) *watches = w;
}

/* Stores kv (copied) as s's newest value and wakes the senders. Called with share_mu held. */
static void share_store(gw_share *s, const rdzv_etcd_kv *kv) {
  rdzv_etcd_kv copy = *kv;
  copy.key = malloc(kv->key_len + 1);
  copy.value = malloc(kv->value_len + 1);
  if (!copy.key || !copy.value) {
    rdzv_etcd_kv_free(&copy);
    NEWT_WARN(RDZV, "host gateway %s: out of memory for a value of %s (revision %lld): its subscribers keep the one "
              "before", s->g->path, s->key, (long long)kv->mod_revision);
    return;
  }
  if (kv->key_len) memcpy(copy.key, kv->key, kv->key_len);
  if (kv->value_len) memcpy(copy.value, kv->value, kv->value_len);
  copy.key[kv->key_len] = '\0';
  copy.value[kv->value_len] = '\0';
  rdzv_etcd_kv_free(&s->kv);
  s->kv = copy;
  s->has_kv = 1;
  s->seq++;
  pthread_cond_broadcast(&s->g->share_cv);
}

/* The etcd watch's callback: stores the value of the last put, or of a resync, and returns
 * (deletes are not sent; a resync with no value leaves the last one). */
static void on_share_watch(void *ud, const rdzv_etcd_watch_resp *r) {
  gw_share *s = ud;
  const rdzv_etcd_kv *kv = NULL;
  if (r->kind == RDZV_WATCH_EVENTS) {
    for (size_t i = 0; i < r->n_events; i++)
      if (r->events[i].type == RDZV_EVENT_PUT) kv = &r->events[i].kv;
  } else if (r->kind == RDZV_WATCH_RESYNC && r->n_kvs > 0) {
    kv = &r->kvs[0];
  } else if (r->kind == RDZV_WATCH_ERROR) {
    NEWT_DEBUG(RDZV, "host gateway %s: the watch of %s: %s (it is re-opened)", s->g->path, s->key,
               r->error ? r->error : "");
  }
  if (!kv) return;
  pthread_mutex_lock(&s->g->share_mu);
  share_store(s, kv);
  pthread_mutex_unlock(&s->g->share_mu);
}

/* Reads s's key and watches it from the revision after the read, by d: no value can slip
 * between (also when there is none yet). Called without share_mu, by one thread at a time. */
static newt_result_t share_start(gw_share *s, newt_deadline_t d) {
  rdzv_gateway *g = s->g;
  rdzv_etcd_kv kv;
  int64_t rev = 0;
  newt_result_t r = rdzv_etcd_get(s->c, s->key, d, &kv, &rev);
  if (r != NEWT_OK && r != NEWT_ERR_NOTFOUND)
    return newt_err_wrap(r, "host gateway %s: reading %s to watch it: ", g->path, s->key);
  pthread_mutex_lock(&g->share_mu);
  if (r == NEWT_OK) {
    share_store(s, &kv);
  } else { /* none yet (an earlier try may have stored one since deleted) */
    rdzv_etcd_kv_free(&s->kv);
    s->has_kv = 0;
  }
  pthread_mutex_unlock(&g->share_mu);
  rdzv_etcd_kv_free(&kv);
  rdzv_etcd_watch_opts wo = {.start_revision = rev + 1, .progress_notify = 1};
  rdzv_etcd_watch *w = NULL;
  r = rdzv_etcd_watch_start(s->c, s->key, &wo, on_share_watch, s, d, &w);
  if (r != NEWT_OK) return newt_err_wrap(r, "host gateway %s: watching %s: ", g->path, s->key);
  pthread_mutex_lock(&g->share_mu);
  s->watch = w;
  g->watches++;
  pthread_mutex_unlock(&g->share_mu);
  return NEWT_OK;
}

/* Waits on share_cv until d, or ms from now when sooner. Called with share_mu held. */
static void share_wait(rdzv_gateway *g, newt_deadline_t d, int64_t ms) {
  uint64_t until = newt_now_ns() + (uint64_t)ms * 1000000ull;
  if (d < until) until = d;
  struct timespec ts = {(time_t)(until / 1000000000ull), (long)(until % 1000000000ull)};
  pthread_cond_timedwait(&g->share_cv, &g->share_mu, &ts);
}

/* Takes a subscription to s, starting its etcd watch when none runs: one subscription tries
 * at a time, the others wait for it (to their deadline) and try again when it failed.
 * Called with share_mu held. */
static newt_result_t share_subscribe(gw_share *s, newt_deadline_t d) {
  rdzv_gateway *g = s->g;
  while (s->starting && !g->stopping && !newt_deadline_passed(d)) share_wait(g, d, GW_MAX_WAIT_MS);
  if (g->stopping) return NEWT_ERR(NEWT_ERR_UNAVAILABLE, "host gateway %s: stopping", g->path);
  if (s->starting)
    return NEWT_ERR(NEWT_ERR_TIMEOUT, "host gateway %s: the watch of %s was still starting at the deadline", g->path,
                    s->key);
  if (!s->watch) {
    s->starting = 1;
    pthread_mutex_unlock(&g->share_mu);
    newt_result_t r = share_start(s, d);
    pthread_mutex_lock(&g->share_mu);
    s->starting = 0;
    pthread_cond_broadcast(&g->share_cv);
    if (r != NEWT_OK) return r;
  }
  g->subscriptions++;
  return NEWT_OK;
}

/* Whether the subscriber sent something or went (it sends nothing once subscribed). */
static int peer_gone(int fd) {
  struct pollfd pf = {.fd = fd, .events = POLLIN};
  return poll(&pf, 1, 0) > 0 && pf.revents != 0;
}

/* The frame of s's newest value into out (s->frame is made once for each value). Called
 * with share_mu held. */
static newt_result_t share_frame(gw_share *s, newt_buf *out) {
  if (s->frame_seq != s->seq || s->frame.len == 0) {
    cJSON *o = cJSON_CreateObject();
    cJSON *kv = o ? cJSON_AddObjectToObject(o, "kv") : NULL;
    char *text = kv && fill_kv(kv, &s->kv) ? newt_json_print(o) : NULL;
    cJSON_Delete(o);
    if (!text) return NEWT_ERR(NEWT_ERR_NOMEM, "host gateway %s: out of memory encoding the value of %s", s->g->path,
                               s->key);
    size_t n = strlen(text);
    if (n > GW_MAX_ANSWER) {
      free(text);
      return NEWT_ERR(NEWT_ERR_INVALID, "host gateway %s: the value of %s (revision %lld) is %zu bytes to send, over "
                      "the bound of %zu (64 MiB)", s->g->path, s->key, (long long)s->kv.mod_revision, n,
                      GW_MAX_ANSWER);
    }
    newt_buf_reset(&s->frame);
    NEWT_CHECK(make_frame(text, &s->frame));
    s->frame_seq = s->seq;
  }
  newt_buf_reset(out);
  return newt_buf_append(out, s->frame.data, s->frame.len);
}

/* Sends fd each newest value of s until the gateway stops, the subscriber goes or a frame
 * takes it more than GW_SEND_MS to read. */
static void send_values(gw_share *s, int fd) {
  rdzv_gateway *g = s->g;
  uint64_t sent = 0;
  newt_buf frame;
  newt_buf_init(&frame);
  for (;;) {
    pthread_mutex_lock(&g->share_mu);
    int fresh = 0, gone = 0;
    while (!g->stopping && !gone && !(fresh = s->has_kv && s->seq != sent)) {
      share_wait(g, NEWT_DEADLINE_NONE, GW_PEER_CHECK_MS);
      gone = peer_gone(fd);
    }
    newt_result_t r = NEWT_ERR_ABORTED;
    if (fresh && !g->stopping) {
      r = share_frame(s, &frame);
      sent = s->seq;
    }
    pthread_mutex_unlock(&g->share_mu);
    if (r != NEWT_OK) {
      if (r != NEWT_ERR_ABORTED) NEWT_WARN(RDZV, "%s; the subscriber's connection is closed", newt_errmsg());
      break;
    }
    io_status st = io_all(fd, frame.data, frame.len, 1, newt_deadline_in_ms(GW_SEND_MS));
    if (st != IO_OK) {
      if (st == IO_TIMEOUT)
        NEWT_WARN(RDZV, "host gateway %s: a subscriber to %s read nothing for %d s: its connection is closed", g->path,
                  s->key, GW_SEND_MS / 1000);
      break;
    }
  }
  newt_buf_free(&frame);
}

/* A subscription: answers it (an error leaves the connection serving), then sends the
 * values. 1 to read the next request, 0 to close. */
static int serve_watch(rdzv_gateway *g, int fd, const cJSON *j) {
  char *key = NULL;
  int64_t ms = 0;
  newt_result_t r = get_bytes(j, "request", "watch", 1, &key, NULL);
  if (r == NEWT_OK && !key) r = NEWT_ERR(NEWT_ERR_INVALID, "request.watch: missing");
  if (r == NEWT_OK) r = newt_json_get_int(j, "request", "timeout_ms", 1, &ms);
  if (r != NEWT_OK) {
    free(key);
    send_error(fd, newt_err_wrap(r, "host gateway %s: ", g->path));
    return 0;
  }
  if (ms < 0 || ms > GW_MAX_WAIT_MS) ms = GW_MAX_WAIT_MS;
  pthread_mutex_lock(&g->share_mu);
  gw_share *s = NULL;
  for (int i = 0; i < g->nshares && !s; i++)
    if (strcmp(g->shares[i].key, key) == 0) s = &g->shares[i];
  char shown[200];
  r = s ? share_subscribe(s, newt_deadline_in_ms(ms))
        : NEWT_ERR(NEWT_ERR_NOTFOUND, "host gateway %s: the key %s is not shared", g->path,
                   newt_str_printable(shown, sizeof shown, key));
  pthread_mutex_unlock(&g->share_mu);
  free(key);
  if (r != NEWT_OK) {
    send_error(fd, r);
    return 1;
  }
  char watching[] = "{\"watching\":true}";
  unsigned char hdr[4];
  put_be32(hdr, sizeof watching - 1);
  newt_deadline_t d = newt_deadline_in_ms(GW_SEND_MS);
  if (io_all(fd, hdr, 4, 1, d) == IO_OK && io_all(fd, watching, sizeof watching - 1, 1, d) == IO_OK)
    send_values(s, fd);
  return 0;
}

/* Reads one request from fd, runs it and answers: 1 to read the next, 0 to close. */
static int serve_one(rdzv_gateway *g, int fd) {
  unsigned char hdr[4];
  if (io_all(fd, hdr, 4, 0, NEWT_DEADLINE_NONE) != IO_OK) return 0;
  uint32_t n = get_be32(hdr);
  if (n == 0 || n > GW_MAX_REQUEST) {
    send_error(fd, NEWT_ERR(NEWT_ERR_INVALID, "host gateway %s: a request frame of %u bytes, outside the bound of 1 "
                            "to %zu (4 MiB)", g->path, n, GW_MAX_REQUEST));
    return 0;
  }
  char *text = malloc(n);
  if (!text) {
    send_error(fd, NEWT_ERR(NEWT_ERR_NOMEM, "host gateway %s: out of memory for a request of %u bytes", g->path, n));
    return 0;
  }
  io_status st = io_all(fd, text, n, 0, NEWT_DEADLINE_NONE);
  cJSON *j = NULL;
  newt_result_t r = st == IO_OK ? newt_json_parse(text, n, "request", &j) : NEWT_ERR_PEER;
  free(text);
  if (st != IO_OK) return 0;
  if (r == NEWT_OK && cJSON_IsObject(j) && cJSON_GetObjectItemCaseSensitive(j, "watch")) {
    int more = serve_watch(g, fd, j);
    cJSON_Delete(j);
    return more;
  }
  gw_req q;
  if (r == NEWT_OK) r = decode_request(j, &q);
  cJSON_Delete(j);
  if (r != NEWT_OK) {
    send_error(fd, newt_err_wrap(r, "host gateway %s: ", g->path));
    return 0;
  }
  char *answer = run_request(g, &q);
  req_free(&q);
  newt_buf frame;
  newt_buf_init(&frame);
  int ok = answer && make_frame(answer, &frame) == NEWT_OK &&
           io_all(fd, frame.data, frame.len, 1, NEWT_DEADLINE_NONE) == IO_OK;
  newt_buf_free(&frame);
  return ok;
}

static void *conn_main(void *arg) {
  gw_conn *c = arg;
  while (serve_one(c->g, c->fd)) {
  }
  pthread_mutex_lock(&c->g->mu);
  close(c->fd);
  c->fd = -1;
  c->done = 1;
  pthread_mutex_unlock(&c->g->mu);
  return NULL;
}

/* Joins and frees the connections whose threads are done. */
static void reap(rdzv_gateway *g) {
  gw_conn *done = NULL;
  pthread_mutex_lock(&g->mu);
  for (gw_conn **p = &g->conns; *p;) {
    gw_conn *c = *p;
    if (!c->done) {
      p = &c->next;
      continue;
    }
    *p = c->next;
    c->next = done;
    done = c;
    g->nconns--;
  }
  pthread_mutex_unlock(&g->mu);
  while (done) {
    gw_conn *next = done->next;
    pthread_join(done->thread, NULL);
    free(done);
    done = next;
  }
}

static void add_conn(rdzv_gateway *g, int fd) {
  reap(g);
  gw_conn *c = calloc(1, sizeof *c);
  pthread_mutex_lock(&g->mu);
  int full = g->nconns >= GW_MAX_CONNS;
  int started = c && !full;
  if (started) {
    c->g = g;
    c->fd = fd;
    started = pthread_create(&c->thread, NULL, conn_main, c) == 0;
  }
  if (started) {
    c->next = g->conns;
    g->conns = c;
    g->nconns++;
  }
  pthread_mutex_unlock(&g->mu);
  if (started) return;
  NEWT_WARN(RDZV, "host gateway %s: refusing a connection (%s)", g->path,
            full ? "too many open" : "no memory or thread for it");
  close(fd);
  free(c);
}

static void *accept_main(void *arg) {
  rdzv_gateway *g = arg;
  for (;;) {
    struct pollfd pf[2] = {{.fd = g->lfd, .events = POLLIN}, {.fd = g->wake[0], .events = POLLIN}};
    if (poll(pf, 2, -1) < 0) {
      if (errno != EINTR) newt_sleep_ms(10);
      continue;
    }
    if (pf[1].revents) return NULL;
    if (!pf[0].revents) continue;
    int fd = accept4(g->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) {
      add_conn(g, fd);
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
      NEWT_WARN(RDZV, "host gateway %s: accept: %s", g->path, strerror(errno)); /* EMFILE, ENOBUFS: */
      newt_sleep_ms(100); /* wait for a connection to close */
    }
  }
}

static newt_result_t socket_addr(const char *path, struct sockaddr_un *sa) {
  if (!path || !*path) return NEWT_ERR(NEWT_ERR_INVALID, "host gateway: no socket path");
  size_t n = strlen(path);
  if (n > GW_PATH_MAX)
    return NEWT_ERR(NEWT_ERR_INVALID, "host gateway %s: the path is %zu bytes, over the %zu a unix socket's may have",
                    path, n, GW_PATH_MAX);
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  memcpy(sa->sun_path, path, n + 1);
  return NEWT_OK;
}

/* Removes an old socket at path; anything else there is refused. */
static newt_result_t clear_path(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT) return NEWT_OK;
    return NEWT_ERR(NEWT_ERR_SYS, "host gateway %s: %s", path, strerror(errno));
  }
  if (!S_ISSOCK(st.st_mode))
    return NEWT_ERR(NEWT_ERR_INVALID, "host gateway %s: exists and is not a socket", path);
  if (unlink(path) != 0 && errno != ENOENT)
    return NEWT_ERR(NEWT_ERR_SYS, "host gateway %s: removing the old socket: %s", path, strerror(errno));
  return NEWT_OK;
}

/* Binds, makes the socket the user's alone (before anyone may connect) and listens. */
static newt_result_t listen_at(rdzv_gateway *g, const struct sockaddr_un *sa) {
  g->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (g->lfd < 0) return NEWT_ERR(NEWT_ERR_SYS, "host gateway %s: socket: %s", g->path, strerror(errno));
  if (bind(g->lfd, (const struct sockaddr *)sa, sizeof *sa) != 0)
    return NEWT_ERR(NEWT_ERR_SYS, "host gateway %s: bind: %s", g->path, strerror(errno));
  struct stat st;
  if (chmod(g->path, 0600) != 0 || lstat(g->path, &st) != 0) {
    newt_result_t r = NEWT_ERR(NEWT_ERR_SYS, "host gateway %s: chmod 0600: %s", g->path, strerror(errno));
    unlink(g->path);
    return r;
  }
  g->dev = st.st_dev;
  g->ino = st.st_ino;
  if (listen(g->lfd, GW_BACKLOG) != 0) {
    newt_result_t r = NEWT_ERR(NEWT_ERR_SYS, "host gateway %s: listen: %s", g->path, strerror(errno));
    unlink(g->path);
    return r;
  }
  return NEWT_OK;
}

/* Removes the socket while it is still the one we bound. */
static void remove_socket(rdzv_gateway *g) {
  struct stat st;
  if (lstat(g->path, &st) == 0 && st.st_dev == g->dev && st.st_ino == g->ino) unlink(g->path);
}

newt_result_t rdzv_gateway_start(rdzv_batch *b, const char *path, rdzv_gateway **out) {
  *out = NULL;
  struct sockaddr_un sa;
  NEWT_CHECK(socket_addr(path, &sa));
  if (!b) return NEWT_ERR(NEWT_ERR_INVALID, "host gateway %s: no batch to serve", path);
  NEWT_CHECK(clear_path(path));
  rdzv_gateway *g = calloc(1, sizeof *g);
  NEWT_CHECK_ALLOC(g);
  g->b = b;
  g->lfd = g->wake[0] = g->wake[1] = -1;
  memcpy(g->path, path, strlen(path) + 1);
  pthread_mutex_init(&g->mu, NULL);
  pthread_mutex_init(&g->share_mu, NULL);
  rdzv_cond_init(&g->share_cv);
  newt_result_t r = listen_at(g, &sa);
  if (r == NEWT_OK && pipe2(g->wake, O_CLOEXEC) != 0)
    r = NEWT_ERR(NEWT_ERR_SYS, "host gateway %s: pipe: %s", path, strerror(errno));
  if (r == NEWT_OK && pthread_create(&g->accepter, NULL, accept_main, g) != 0)
    r = NEWT_ERR(NEWT_ERR_SYS, "host gateway %s: cannot start its thread", path);
  if (r == NEWT_OK) {
    *out = g;
    return NEWT_OK;
  }
  if (g->lfd >= 0) {
    remove_socket(g);
    close(g->lfd);
  }
  if (g->wake[0] >= 0) close(g->wake[0]);
  if (g->wake[1] >= 0) close(g->wake[1]);
  pthread_mutex_destroy(&g->mu);
  pthread_mutex_destroy(&g->share_mu);
  pthread_cond_destroy(&g->share_cv);
  free(g);
  return r;
}

void rdzv_gateway_stop(rdzv_gateway *g) {
  if (!g) return;
  char x = 1;
  while (write(g->wake[1], &x, 1) < 0 && errno == EINTR) {
  }
  pthread_join(g->accepter, NULL);
  remove_socket(g);
  close(g->lfd);
  pthread_mutex_lock(&g->share_mu); /* senders and subscriptions waiting on share_cv end */
  g->stopping = 1;
  pthread_cond_broadcast(&g->share_cv);
  pthread_mutex_unlock(&g->share_mu);
  pthread_mutex_lock(&g->mu);
  for (gw_conn *c = g->conns; c; c = c->next)
    if (c->fd >= 0) shutdown(c->fd, SHUT_RDWR);
  gw_conn *all = g->conns;
  g->conns = NULL;
  pthread_mutex_unlock(&g->mu);
  while (all) {
    gw_conn *next = all->next;
    pthread_join(all->thread, NULL);
    free(all);
    all = next;
  }
  /* the etcd watches last: nobody else can start one now, and their callbacks may run until freed */
  for (int i = 0; i < g->nshares; i++) {
    gw_share *s = &g->shares[i];
    rdzv_etcd_watch_free(s->watch);
    rdzv_etcd_kv_free(&s->kv);
    newt_buf_free(&s->frame);
    free(s->key);
  }
  close(g->wake[0]);
  close(g->wake[1]);
  pthread_mutex_destroy(&g->mu);
  pthread_mutex_destroy(&g->share_mu);
  pthread_cond_destroy(&g->share_cv);
  free(g);
}

/* --- the client ---------------------------------------------------------------------------- */

struct rdzv_gateway_client {
  pthread_mutex_t mu; /* one call at a time */
  int fd;             /* -1: not connected */
  struct sockaddr_un sa;
  const char *path;   /* sa.sun_path */
};

newt_result_t rdzv_gateway_client_new(const char *path, rdzv_gateway_client **out) {
  *out = NULL;
  struct sockaddr_un sa;
  NEWT_CHECK(socket_addr(path, &sa));
  rdzv_gateway_client *g = calloc(1, sizeof *g);
  NEWT_CHECK_ALLOC(g);
  g->sa = sa;
  g->path = g->sa.sun_path;
  g->fd = -1;
  pthread_mutex_init(&g->mu, NULL);
  *out = g;
  return NEWT_OK;
}

static void client_close(rdzv_gateway_client *g) {
  if (g->fd >= 0) close(g->fd);
  g->fd = -1;
}

void rdzv_gateway_client_free(rdzv_gateway_client *g) {
  if (!g) return;
  client_close(g);
  pthread_mutex_destroy(&g->mu);
  free(g);
}

/* Any failure is the gateway not there (no socket, nobody listening, its backlog full):
 * nothing was sent. */
static newt_result_t client_connect(rdzv_gateway_client *g) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return NEWT_ERR(NEWT_ERR_UNAVAILABLE, "host gateway %s: socket: %s", g->path, strerror(errno));
  if (connect(fd, (const struct sockaddr *)&g->sa, sizeof g->sa) != 0) {
    int e = errno;
    close(fd);
    return NEWT_ERR(NEWT_ERR_UNAVAILABLE, "host gateway %s: cannot connect: %s", g->path, strerror(e));
  }
  g->fd = fd;
  return NEWT_OK;
}

/* An idle connection the gateway has not closed (nor written to: it never speaks first). */
static int idle_open(int fd) {
  char c;
  ssize_t m = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return m < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* Sends the request, on the kept connection or a new one; once again on a new one when the
 * kept one turns out broken. The gateway runs whole requests only: a failed send never ran. */
static newt_result_t send_request(rdzv_gateway_client *g, const newt_buf *frame, newt_deadline_t d,
                                  int *unreached) {
  for (int again = 0;; again++) {
    int kept = g->fd >= 0;
    if (kept && !idle_open(g->fd)) {
      client_close(g);
      kept = 0;
    }
    if (g->fd < 0) NEWT_CHECK(client_connect(g));
    io_status st = io_all(g->fd, frame->data, frame->len, 1, d);
    if (st == IO_OK) return NEWT_OK;
    int e = errno;
    client_close(g);
    if (st == IO_TIMEOUT) {
      *unreached = 0;
      return NEWT_ERR(NEWT_ERR_TIMEOUT, "host gateway %s: the request was not sent by the deadline", g->path);
    }
    if (kept && again == 0 && (e == EPIPE || e == ECONNRESET)) continue;
    return NEWT_ERR(NEWT_ERR_UNAVAILABLE, "host gateway %s: sending the request: %s", g->path, strerror(e));
  }
}

/* After the request went: a broken or silent connection leaves its fate unknown. */
static newt_result_t read_answer(rdzv_gateway_client *g, void *buf, size_t n, newt_deadline_t d) {
  io_status st = io_all(g->fd, buf, n, 0, d);
  if (st == IO_OK) return NEWT_OK;
  const char *why = st == IO_EOF ? "the gateway closed the connection" : strerror(errno);
  client_close(g);
  if (st == IO_TIMEOUT)
    return NEWT_ERR(NEWT_ERR_TIMEOUT, "host gateway %s: no answer by the deadline; the transaction may or may not "
                    "have been applied", g->path);
  return NEWT_ERR(NEWT_ERR_UNAVAILABLE, "host gateway %s: %s before the answer; the transaction may or may not "
                  "have been applied", g->path, why);
}

static newt_result_t recv_answer(rdzv_gateway_client *g, newt_deadline_t d, char **text, size_t *len) {
  unsigned char hdr[4];
  NEWT_CHECK(read_answer(g, hdr, 4, d));
  uint32_t n = get_be32(hdr);
  if (n == 0 || n > GW_MAX_ANSWER) {
    client_close(g);
    return NEWT_ERR(NEWT_ERR_CORRUPT, "host gateway %s: an answer frame of %u bytes, outside the bound of 1 to %zu "
                    "(64 MiB)", g->path, n, GW_MAX_ANSWER);
  }
  char *buf = malloc(n);
  if (!buf) {
    client_close(g);
    return NEWT_ERR(NEWT_ERR_NOMEM, "host gateway %s: out of memory for an answer of %u bytes", g->path, n);
  }
  newt_result_t r = read_answer(g, buf, n, d);
  if (r != NEWT_OK) {
    free(buf);
    return r;
  }
  *text = buf;
  *len = n;
  return NEWT_OK;
}

/* An error answer ({code, message}) as this thread's error; NEWT_OK when it is a result. */
static newt_result_t answer_error(const char *path, const char *text, size_t len) {
  cJSON *j = NULL;
  if (newt_json_parse(text, len, "answer", &j) != NEWT_OK)
    return newt_err_wrap(NEWT_ERR_CORRUPT, "host gateway %s: ", path);
  const cJSON *code = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "code") : NULL;
  if (!code) {
    cJSON_Delete(j);
    return NEWT_OK;
  }
  int64_t c = 0;
  const char *msg = NULL;
  newt_result_t r = newt_json_item_int(code, "answer.code", &c);
  if (r == NEWT_OK) r = newt_json_get_str(j, "answer", "message", 1, &msg);
  if (r == NEWT_OK && (c <= NEWT_OK || c >= NEWT_ERR__COUNT))
    r = NEWT_ERR(NEWT_ERR_CORRUPT, "answer.code: %lld is no newt result code", (long long)c);
  if (r == NEWT_OK) r = NEWT_ERR((newt_result_t)c, "%s", msg);
  else r = newt_err_wrap(NEWT_ERR_CORRUPT, "host gateway %s: ", path);
  cJSON_Delete(j);
  return r;
}

static newt_result_t decode_answer(rdzv_gateway_client *g, const char *text, size_t len,
                                   rdzv_etcd_txn_result *out) {
  NEWT_CHECK(answer_error(g->path, text, len));
  rdzv_etcd_txn_result tmp;
  newt_result_t r = rdzv_etcd_parse_txn(text, len, out ? out : &tmp);
  if (r != NEWT_OK) return newt_err_wrap(NEWT_ERR_CORRUPT, "host gateway %s: answer: ", g->path);
  if (!out) rdzv_etcd_txn_result_free(&tmp);
  return NEWT_OK;
}

static newt_result_t exchange(rdzv_gateway_client *g, const gw_txn *t, newt_deadline_t d,
                              rdzv_etcd_txn_result *out, int *unreached) {
  if (newt_deadline_passed(d)) {
    *unreached = 0;
    return NEWT_ERR(NEWT_ERR_TIMEOUT, "host gateway %s: the deadline passed before the request was sent", g->path);
  }
  newt_buf frame;
  newt_buf_init(&frame);
  newt_result_t r = encode_request(t, d, &frame);
  if (r == NEWT_OK) r = send_request(g, &frame, d, unreached);
  newt_buf_free(&frame);
  if (r != NEWT_OK) return r;
  *unreached = 0;
  char *text = NULL;
  size_t len = 0;
  NEWT_CHECK(recv_answer(g, d, &text, &len));
  r = decode_answer(g, text, len, out);
  free(text);
  return r;
}

newt_result_t rdzv_gateway_txn(rdzv_gateway_client *g, const rdzv_etcd_cmp *cmps, size_t ncmp,
                               const rdzv_etcd_op *success, size_t nsuccess, const rdzv_etcd_op *failure,
                               size_t nfailure, newt_deadline_t d, rdzv_etcd_txn_result *out, int *unreached) {
  int ignored;
  if (!unreached) unreached = &ignored;
  *unreached = 1;
  if (out) memset(out, 0, sizeof *out);
  gw_txn t = {cmps, ncmp, success, failure, nsuccess, nfailure};
  pthread_mutex_lock(&g->mu);
  newt_result_t r = exchange(g, &t, d, out, unreached);
  pthread_mutex_unlock(&g->mu);
  return r;
}

/* --- shared watches: the client ------------------------------------------------------------ */

struct rdzv_gateway_watch {
  int fd;
  char *key;
  rdzv_gateway_watch_fn fn;
  void *ud;
  pthread_t thread;
  atomic_int freeing; /* rdzv_gateway_watch_free was called: no fn(NULL) */
  char path[GW_PATH_MAX + 1];
};

/* One frame of 1 to GW_MAX_ANSWER bytes by d: its JSON (malloc'd) and length; `what` names
 * it in messages. */
static newt_result_t recv_frame(rdzv_gateway_watch *w, const char *what, newt_deadline_t d, char **text,
                                size_t *len) {
  unsigned char hdr[4];
  io_status st = io_all(w->fd, hdr, 4, 0, d);
  uint32_t n = st == IO_OK ? get_be32(hdr) : 0;
  if (st == IO_OK && (n == 0 || n > GW_MAX_ANSWER))
    return NEWT_ERR(NEWT_ERR_CORRUPT, "host gateway %s: %s of %u bytes, outside the bound of 1 to %zu (64 MiB)",
                    w->path, what, n, GW_MAX_ANSWER);
  char *buf = st == IO_OK ? malloc(n) : NULL;
  if (st == IO_OK && !buf)
    return NEWT_ERR(NEWT_ERR_NOMEM, "host gateway %s: out of memory for %s of %u bytes", w->path, what, n);
  if (st == IO_OK) st = io_all(w->fd, buf, n, 0, d);
  if (st == IO_OK) {
    *text = buf;
    *len = n;
    return NEWT_OK;
  }
  int e = errno;
  free(buf);
  if (st == IO_TIMEOUT) return NEWT_ERR(NEWT_ERR_TIMEOUT, "host gateway %s: no %s by the deadline", w->path, what);
  return NEWT_ERR(NEWT_ERR_UNAVAILABLE, "host gateway %s: %s before %s", w->path,
                  st == IO_EOF ? "the gateway closed the connection" : strerror(e), what);
}

/* A {kv} frame: the value of the key watched; anything else is NEWT_ERR_CORRUPT. */
static newt_result_t decode_value(rdzv_gateway_watch *w, const char *text, size_t len, rdzv_etcd_kv *kv) {
  memset(kv, 0, sizeof *kv);
  cJSON *j = NULL;
  const cJSON *o = NULL;
  newt_result_t r = newt_json_parse(text, len, "value", &j);
  if (r == NEWT_OK) r = newt_json_get_obj(j, "value", "kv", 1, &o);
  if (r == NEWT_OK) r = rdzv_etcd_parse_kv(o, "value.kv", kv);
  cJSON_Delete(j);
  if (r != NEWT_OK) return newt_err_wrap(NEWT_ERR_CORRUPT, "host gateway %s: ", w->path);
  if (kv->key_len != strlen(w->key) || memcmp(kv->key, w->key, kv->key_len) != 0) {
    char shown[200];
    newt_str_printable(shown, sizeof shown, kv->key);
    rdzv_etcd_kv_free(kv);
    return NEWT_ERR(NEWT_ERR_CORRUPT, "host gateway %s: sent a value of %s, not of %s watched", w->path, shown,
                    w->key);
  }
  return NEWT_OK;
}

/* The subscription's thread: each value to fn until the connection ends or a frame is bad,
 * then fn(NULL), unless rdzv_gateway_watch_free ended it. */
static void *watch_main(void *arg) {
  rdzv_gateway_watch *w = arg;
  for (;;) {
    char *text = NULL;
    size_t len = 0;
    rdzv_etcd_kv kv;
    newt_result_t r = recv_frame(w, "a value", NEWT_DEADLINE_NONE, &text, &len);
    if (r == NEWT_OK) {
      r = decode_value(w, text, len, &kv);
      free(text);
    }
    if (r != NEWT_OK || atomic_load(&w->freeing)) break;
    w->fn(w->ud, &kv);
    rdzv_etcd_kv_free(&kv);
  }
  if (atomic_load(&w->freeing)) return NULL;
  NEWT_INFO(RDZV, "the watch of %s through the host gateway ended: %s", w->key, newt_errmsg());
  w->fn(w->ud, NULL);
  return NULL;
}

/* Connects, sends the subscription and reads its answer (one frame: values follow it). */
static newt_result_t subscribe(rdzv_gateway_watch *w, const struct sockaddr_un *sa, newt_deadline_t d) {
  w->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (w->fd < 0) return NEWT_ERR(NEWT_ERR_UNAVAILABLE, "host gateway %s: socket: %s", w->path, strerror(errno));
  if (connect(w->fd, (const struct sockaddr *)sa, sizeof *sa) != 0)
    return NEWT_ERR(NEWT_ERR_UNAVAILABLE, "host gateway %s: cannot connect: %s", w->path, strerror(errno));
  /* the gateway gets a tenth less (1 s at most), so that its answer comes before d */
  int64_t timeout = -1;
  if (d != NEWT_DEADLINE_NONE) {
    int64_t left = newt_deadline_left_ms(d);
    timeout = left - (left / 10 < 1000 ? left / 10 : 1000);
  }
  cJSON *req = cJSON_CreateObject();
  char *text = req && add_bytes(req, "watch", w->key, strlen(w->key)) && newt_json_add_int(req, "timeout_ms", timeout)
                   ? newt_json_print(req)
                   : NULL;
  cJSON_Delete(req);
  if (!text) return NEWT_ERR(NEWT_ERR_NOMEM, "host gateway %s: out of memory encoding a subscription", w->path);
  if (strlen(text) > GW_MAX_REQUEST) {
    free(text);
    return NEWT_ERR(NEWT_ERR_INVALID, "host gateway %s: a key of %zu bytes is too long to watch", w->path,
                    strlen(w->key));
  }
  newt_buf frame;
  newt_buf_init(&frame);
  newt_result_t r = make_frame(text, &frame);
  io_status st = r == NEWT_OK ? io_all(w->fd, frame.data, frame.len, 1, d) : IO_FAIL;
  int e = errno;
  newt_buf_free(&frame);
  if (r != NEWT_OK) return r;
  if (st == IO_TIMEOUT)
    return NEWT_ERR(NEWT_ERR_TIMEOUT, "host gateway %s: the subscription was not sent by the deadline", w->path);
  if (st != IO_OK)
    return NEWT_ERR(NEWT_ERR_UNAVAILABLE, "host gateway %s: sending the subscription: %s", w->path, strerror(e));
  size_t len = 0;
  NEWT_CHECK(recv_frame(w, "the subscription's answer", d, &text, &len));
  r = answer_error(w->path, text, len);
  cJSON *j = NULL;
  int watching = 0;
  if (r == NEWT_OK && newt_json_parse(text, len, "answer", &j) == NEWT_OK)
    watching = cJSON_IsTrue(cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "watching") : NULL);
  cJSON_Delete(j);
  free(text);
  if (r == NEWT_OK && !watching)
    r = NEWT_ERR(NEWT_ERR_CORRUPT, "host gateway %s: the subscription's answer is neither {watching: true} nor an "
                 "error", w->path);
  return r;
}

newt_result_t rdzv_gateway_watch_start(const char *path, const char *key, rdzv_gateway_watch_fn fn, void *ud,
                                       newt_deadline_t d, rdzv_gateway_watch **out) {
  *out = NULL;
  struct sockaddr_un sa;
  NEWT_CHECK(socket_addr(path, &sa));
  if (!key || !*key || !fn)
    return NEWT_ERR(NEWT_ERR_INVALID, "host gateway %s: a watch needs a key and a callback", path);
  rdzv_gateway_watch *w = calloc(1, sizeof *w);
  NEWT_CHECK_ALLOC(w);
  w->fd = -1;
  w->fn = fn;
  w->ud = ud;
  memcpy(w->path, path, strlen(path) + 1);
  w->key = newt_strdup(key);
  newt_result_t r = w->key ? subscribe(w, &sa, d) : NEWT_ERR(NEWT_ERR_NOMEM, "host gateway %s: out of memory", path);
  if (r == NEWT_OK && pthread_create(&w->thread, NULL, watch_main, w) != 0)
    r = NEWT_ERR(NEWT_ERR_SYS, "host gateway %s: cannot start a watch's thread", path);
  if (r == NEWT_OK) {
    *out = w;
    return NEWT_OK;
  }
  if (w->fd >= 0) close(w->fd);
  free(w->key);
  free(w);
  return r;
}

void rdzv_gateway_watch_free(rdzv_gateway_watch *w) {
  if (!w) return;
  atomic_store(&w->freeing, 1);
  shutdown(w->fd, SHUT_RDWR); /* its read ends */
  pthread_join(w->thread, NULL);
  close(w->fd);
  free(w->key);
  free(w);
}
