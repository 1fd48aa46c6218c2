/* The pure half of the etcd client: everything that turns bytes from the gateway into
 * structs, with no network. Kept apart so the unit tests and the libFuzzer targets
 * (tests/rendezvous/fuzz) drive exactly the code the client runs.
 *
 * Every parser treats its input as hostile: a missing, mistyped or malformed field is
 * NEWT_ERR_CORRUPT naming the field ("watch.result.events[2].kv.key: not base64"), never
 * a crash. */
#ifndef NEWT_RENDEZVOUS_ETCD_PARSE_H
#define NEWT_RENDEZVOUS_ETCD_PARSE_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/strutil.h"
#include "rendezvous/etcd.h"

/* The largest line (one JSON message) a watch stream may send. */
#define RDZV_ETCD_MAX_LINE ((size_t)64 << 20)

/* Splits a byte stream into lines. The gateway writes one JSON object per line; HTTP
 * chunks (and reads) cut anywhere, so bytes are buffered until a '\n'. Empty lines and a
 * '\r' before the '\n' are dropped. */
typedef struct rdzv_etcd_lines {
  newt_buf buf; /* the start of an unfinished line (never holds a '\n') */
  size_t max_line;
} rdzv_etcd_lines;

/* Called for each complete line (without its '\n'); a non-OK result stops the feed and
 * is returned by rdzv_etcd_lines_feed. */
typedef newt_result_t (*rdzv_etcd_line_fn)(void *ud, const char *line, size_t len);

void rdzv_etcd_lines_init(rdzv_etcd_lines *l, size_t max_line);
void rdzv_etcd_lines_free(rdzv_etcd_lines *l);
void rdzv_etcd_lines_reset(rdzv_etcd_lines *l); /* a new stream: drop a partial line */
/* NEWT_ERR_CORRUPT when a line grows past max_line. */
newt_result_t rdzv_etcd_lines_feed(rdzv_etcd_lines *l, const char *data, size_t len,
                                   rdzv_etcd_line_fn fn, void *ud);
/* Bytes of an unfinished line held back. */
size_t rdzv_etcd_lines_pending(const rdzv_etcd_lines *l);

/* A gateway error answer ({"error":..,"message":..,"code":N}, or in a stream
 * {"error":{"grpc_code":N,"message":..}}) as a result code and message. */
typedef struct rdzv_etcd_gw_error {
  int grpc_code;     /* -1 when unknown */
  char message[512];
} rdzv_etcd_gw_error;

/* Reads an error body (any HTTP status); when it is not the gateway's JSON, message holds
 * the start of the body. */
void rdzv_etcd_parse_error(const char *text, size_t len, rdzv_etcd_gw_error *e);
/* The newt code for a gRPC status from etcd (5 -> NOTFOUND, 14 -> UNAVAILABLE, ...). */
newt_result_t rdzv_etcd_grpc_code_result(int grpc_code, const char *message);
/* 1 when the message says the auth token is invalid or missing (trade the password again). */
int rdzv_etcd_is_token_error(const char *message);

/* One mvccpb.KeyValue object; `what` names it in messages. */
newt_result_t rdzv_etcd_parse_kv(const cJSON *obj, const char *what, rdzv_etcd_kv *out);
/* The "header" object's revision (0 when absent: etcd omits zeros). */
newt_result_t rdzv_etcd_parse_header_rev(const cJSON *msg, const char *what, int64_t *rev);

/* A RangeResponse body (or object). */
newt_result_t rdzv_etcd_parse_range(const char *text, size_t len, rdzv_etcd_kvs *out);
newt_result_t rdzv_etcd_parse_range_obj(const cJSON *obj, const char *what, rdzv_etcd_kvs *out);
/* A TxnResponse body. */
newt_result_t rdzv_etcd_parse_txn(const char *text, size_t len, rdzv_etcd_txn_result *out);
/* LeaseGrant / KeepAlive ({"result":{...}}) / TimeToLive answers: ID and TTL (0 when
 * omitted, -1 for time-to-live of an unknown lease). */
newt_result_t rdzv_etcd_parse_lease(const char *text, size_t len, int64_t *id, int64_t *ttl,
                                    int64_t *granted_ttl);
/* A PutResponse / DeleteRangeResponse: header revision and (delete) the count. */
newt_result_t rdzv_etcd_parse_write(const char *text, size_t len, int64_t *revision,
                                    int64_t *deleted);

/* One line of a watch stream. */
typedef struct rdzv_etcd_watch_msg {
  int64_t revision;         /* header revision */
  int created;
  int canceled;
  int64_t compact_revision; /* > 0: the start revision was compacted */
  char cancel_reason[256];
  int is_error;             /* {"error":...}: gw holds it */
  rdzv_etcd_gw_error gw;
  rdzv_etcd_event *events;
  size_t n_events;
} rdzv_etcd_watch_msg;

newt_result_t rdzv_etcd_parse_watch(const char *text, size_t len, rdzv_etcd_watch_msg *out);
void rdzv_etcd_watch_msg_free(rdzv_etcd_watch_msg *m);
void rdzv_etcd_events_free(rdzv_etcd_event *ev, size_t n);

#endif
