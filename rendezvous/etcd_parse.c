/* Parsing what etcd's JSON gateway sends (see etcd_parse.h): the line splitter of watch
 * streams, the response parsers, the mapping of gateway errors to newt codes, and the
 * prefix range_end. No I/O here; everything from the network is checked field by field. */
#include "rendezvous/etcd_parse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"

/* --- prefix range_end -------------------------------------------------------------------- */

void rdzv_etcd_prefix_end(const char *prefix, size_t len, char *out, size_t *out_len) {
  const unsigned char *p = (const unsigned char *)prefix;
  for (size_t i = len; i > 0; i--) {
    if (p[i - 1] < 0xff) {
      memcpy(out, prefix, i - 1);
      out[i - 1] = (char)(p[i - 1] + 1);
      out[i] = '\0';
      *out_len = i;
      return;
    }
  }
  /* empty prefix, or all 0xff: every key from `prefix` on ("\0" means "to the end") */
  out[0] = '\0';
  *out_len = 1;
}

/* --- line splitter ----------------------------------------------------------------------- */

void rdzv_etcd_lines_init(rdzv_etcd_lines *l, size_t max_line) {
  newt_buf_init(&l->buf);
  l->max_line = max_line ? max_line : RDZV_ETCD_MAX_LINE;
}

void rdzv_etcd_lines_free(rdzv_etcd_lines *l) { newt_buf_free(&l->buf); }

void rdzv_etcd_lines_reset(rdzv_etcd_lines *l) {
  newt_buf_reset(&l->buf);
}

size_t rdzv_etcd_lines_pending(const rdzv_etcd_lines *l) { return l->buf.len; }

static newt_result_t emit_line(const char *s, size_t n, rdzv_etcd_line_fn fn, void *ud) {
  if (n > 0 && s[n - 1] == '\r') n--;
  if (n == 0) return NEWT_OK;
  return fn(ud, s, n);
}

newt_result_t rdzv_etcd_lines_feed(rdzv_etcd_lines *l, const char *data, size_t len,
                                   rdzv_etcd_line_fn fn, void *ud) {
  /* Invariant: the buffer holds the start of one unfinished line and no '\n'. */
  size_t pos = 0;
  if (l->buf.len > 0) {
    const char *nl = memchr(data, '\n', len);
    size_t take = nl ? (size_t)(nl - data) : len;
    if (l->buf.len + take > l->max_line)
      return NEWT_ERR(NEWT_ERR_CORRUPT, "watch stream: a line grew past %zu bytes without a newline",
                      l->max_line);
    NEWT_CHECK(newt_buf_append(&l->buf, data, take));
    if (!nl) return NEWT_OK;
    newt_result_t r = emit_line(l->buf.data, l->buf.len, fn, ud);
    newt_buf_reset(&l->buf);
    NEWT_CHECK(r);
    pos = take + 1;
  }
  /* Whole lines straight out of `data`, the unfinished rest into the buffer. */
  const char *nl;
  while (pos < len && (nl = memchr(data + pos, '\n', len - pos)) != NULL) {
    size_t n = (size_t)(nl - (data + pos));
    if (n > l->max_line)
      return NEWT_ERR(NEWT_ERR_CORRUPT, "watch stream: a line of %zu bytes is longer than %zu", n,
                      l->max_line);
    NEWT_CHECK(emit_line(data + pos, n, fn, ud));
    pos += n + 1;
  }
  if (len - pos > l->max_line)
    return NEWT_ERR(NEWT_ERR_CORRUPT, "watch stream: a line grew past %zu bytes without a newline",
                    l->max_line);
  return newt_buf_append(&l->buf, data + pos, len - pos);
}

/* --- errors ------------------------------------------------------------------------------- */

void rdzv_etcd_parse_error(const char *text, size_t len, rdzv_etcd_gw_error *e) {
  e->grpc_code = -1;
  e->message[0] = '\0';
  cJSON *j = cJSON_ParseWithLength(text, len);
  const cJSON *err = j ? cJSON_GetObjectItemCaseSensitive(j, "error") : NULL;
  const cJSON *src = j;
  if (cJSON_IsObject(err)) src = err; /* streaming form: {"error":{"grpc_code":..}} */
  if (cJSON_IsObject(src)) {
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(src, "code");
    if (src == err) code = cJSON_GetObjectItemCaseSensitive(src, "grpc_code");
    if (cJSON_IsNumber(code)) e->grpc_code = code->valueint;
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(src, "message");
    if (!cJSON_IsString(msg) || !msg->valuestring[0]) msg = cJSON_IsString(err) ? err : NULL;
    if (cJSON_IsString(msg)) snprintf(e->message, sizeof e->message, "%s", msg->valuestring);
  }
  if (!e->message[0]) {
    /* not the gateway's JSON (a proxy's HTML page, garbage): show its start, printable */
    size_t n = 0;
    for (size_t i = 0; i < len && n + 1 < sizeof e->message && n < 120; i++)
      e->message[n++] = (text[i] >= 32 && text[i] < 127) ? text[i] : '.';
    e->message[n] = '\0';
    if (!n) snprintf(e->message, sizeof e->message, "(empty answer)");
  }
  cJSON_Delete(j);
}

newt_result_t rdzv_etcd_grpc_code_result(int code, const char *message) {
  switch (code) {
    case 3: /* InvalidArgument: also "authentication failed", "user name is empty" */
      if (message && (strstr(message, "authentication failed") || strstr(message, "user name is empty")))
        return NEWT_ERR_AUTH;
      return NEWT_ERR_INVALID;
    case 4: return NEWT_ERR_TIMEOUT;     /* DeadlineExceeded */
    case 5: return NEWT_ERR_NOTFOUND;    /* NotFound: "requested lease not found" */
    case 6: return NEWT_ERR_CONFLICT;    /* AlreadyExists */
    case 7: return NEWT_ERR_AUTH;        /* PermissionDenied */
    case 8: return NEWT_ERR_NOSPACE;     /* ResourceExhausted: "database space exceeded" */
    case 9: return NEWT_ERR_INVALID;     /* FailedPrecondition */
    case 10: return NEWT_ERR_CONFLICT;   /* Aborted */
    case 11: return NEWT_ERR_INVALID;    /* OutOfRange: compacted / future revision */
    case 14: return NEWT_ERR_UNAVAILABLE;/* Unavailable: no leader, stopping */
    case 16: return NEWT_ERR_AUTH;       /* Unauthenticated: invalid auth token */
    default: return NEWT_ERR_PEER;
  }
}

int rdzv_etcd_is_token_error(const char *m) {
  return m && (strstr(m, "invalid auth token") || strstr(m, "user name is empty") ||
               strstr(m, "auth token is not provided"));
}

/* --- messages ----------------------------------------------------------------------------- */

static newt_result_t get_b64(const cJSON *obj, const char *what, const char *field, int required,
                             char **out, size_t *out_len) {
  const char *s = NULL;
  NEWT_CHECK(newt_json_get_str(obj, what, field, required, &s));
  if (!s) s = ""; /* omitted: empty (etcd omits zero values) */
  size_t n = 0;
  char *v = newt_base64_decode_alloc(s, strlen(s), &n);
  if (!v) return NEWT_ERR(NEWT_ERR_CORRUPT, "%s.%s: not base64", what, field);
  *out = v;
  *out_len = n;
  return NEWT_OK;
}

void rdzv_etcd_kv_free(rdzv_etcd_kv *kv) {
  if (!kv) return;
  free(kv->key);
  free(kv->value);
  memset(kv, 0, sizeof *kv);
}

void rdzv_etcd_kvs_free(rdzv_etcd_kvs *r) {
  if (!r) return;
  for (size_t i = 0; i < r->n; i++) rdzv_etcd_kv_free(&r->kvs[i]);
  free(r->kvs);
  memset(r, 0, sizeof *r);
}

/* Invalid JSON from etcd is corruption of what came over the wire, not a user error. */
static newt_result_t as_corrupt(newt_result_t r) {
  return r == NEWT_ERR_INVALID ? NEWT_ERR_CORRUPT : r;
}

newt_result_t rdzv_etcd_parse_kv(const cJSON *obj, const char *what, rdzv_etcd_kv *out) {
  memset(out, 0, sizeof *out);
  newt_result_t r;
  NEWT_CHECK_GOTO(get_b64(obj, what, "key", 1, &out->key, &out->key_len), r, fail);
  NEWT_CHECK_GOTO(get_b64(obj, what, "value", 0, &out->value, &out->value_len), r, fail);
  NEWT_CHECK_GOTO(newt_json_get_int(obj, what, "create_revision", 0, &out->create_revision), r, fail);
  NEWT_CHECK_GOTO(newt_json_get_int(obj, what, "mod_revision", 0, &out->mod_revision), r, fail);
  NEWT_CHECK_GOTO(newt_json_get_int(obj, what, "version", 0, &out->version), r, fail);
  NEWT_CHECK_GOTO(newt_json_get_int(obj, what, "lease", 0, &out->lease), r, fail);
  if (out->create_revision < 0 || out->mod_revision < 0 || out->version < 0) {
    r = NEWT_ERR(NEWT_ERR_CORRUPT, "%s: negative revision or version", what);
    goto fail;
  }
  return NEWT_OK;
fail:
  rdzv_etcd_kv_free(out);
  return as_corrupt(r);
}

newt_result_t rdzv_etcd_parse_header_rev(const cJSON *msg, const char *what, int64_t *rev) {
  const cJSON *h = NULL;
  *rev = 0;
  NEWT_CHECK(newt_json_get_obj(msg, what, "header", 0, &h));
  if (!h) return NEWT_OK;
  char path[128];
  snprintf(path, sizeof path, "%s.header", what);
  NEWT_CHECK(newt_json_get_int(h, path, "revision", 0, rev));
  if (*rev < 0) return NEWT_ERR(NEWT_ERR_CORRUPT, "%s.revision: negative (%lld)", path, (long long)*rev);
  return NEWT_OK;
}

static newt_result_t parse_kv_array(const cJSON *arr, const char *what, rdzv_etcd_kv **out, size_t *n) {
  *out = NULL;
  *n = 0;
  if (!arr) return NEWT_OK;
  int cnt = cJSON_GetArraySize(arr);
  if (cnt <= 0) return NEWT_OK;
  rdzv_etcd_kv *kvs = calloc((size_t)cnt, sizeof *kvs);
  NEWT_CHECK_ALLOC(kvs);
  size_t i = 0;
  for (const cJSON *it = arr->child; it; it = it->next, i++) {
    char path[160];
    snprintf(path, sizeof path, "%.120s[%zu]", what, i);
    newt_result_t r = rdzv_etcd_parse_kv(it, path, &kvs[i]);
    if (r != NEWT_OK) {
      for (size_t k = 0; k < i; k++) rdzv_etcd_kv_free(&kvs[k]);
      free(kvs);
      return r;
    }
  }
  *out = kvs;
  *n = i;
  return NEWT_OK;
}

newt_result_t rdzv_etcd_parse_range_obj(const cJSON *obj, const char *what, rdzv_etcd_kvs *out) {
  memset(out, 0, sizeof *out);
  const cJSON *arr = NULL;
  int more = 0;
  newt_result_t r;
  NEWT_CHECK_GOTO(rdzv_etcd_parse_header_rev(obj, what, &out->revision), r, fail);
  NEWT_CHECK_GOTO(newt_json_get_int(obj, what, "count", 0, &out->count), r, fail);
  NEWT_CHECK_GOTO(newt_json_get_bool(obj, what, "more", 0, &more), r, fail);
  NEWT_CHECK_GOTO(newt_json_get_arr(obj, what, "kvs", 0, &arr), r, fail);
  char path[128];
  snprintf(path, sizeof path, "%s.kvs", what);
  NEWT_CHECK_GOTO(parse_kv_array(arr, path, &out->kvs, &out->n), r, fail);
  out->more = more;
  if (out->count < (int64_t)out->n) out->count = (int64_t)out->n; /* count_only omits kvs */
  return NEWT_OK;
fail:
  rdzv_etcd_kvs_free(out);
  return as_corrupt(r);
}

static newt_result_t parse_doc(const char *text, size_t len, const char *what, cJSON **j) {
  newt_result_t r = newt_json_parse(text, len, what, j);
  if (r != NEWT_OK) return NEWT_ERR(NEWT_ERR_CORRUPT, "%s", newt_errmsg());
  if (!cJSON_IsObject(*j)) {
    cJSON_Delete(*j);
    *j = NULL;
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: expected a JSON object", what);
  }
  return NEWT_OK;
}

newt_result_t rdzv_etcd_parse_range(const char *text, size_t len, rdzv_etcd_kvs *out) {
  cJSON *j;
  memset(out, 0, sizeof *out);
  NEWT_CHECK(parse_doc(text, len, "range", &j));
  newt_result_t r = rdzv_etcd_parse_range_obj(j, "range", out);
  cJSON_Delete(j);
  return r;
}

void rdzv_etcd_txn_result_free(rdzv_etcd_txn_result *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n; i++) rdzv_etcd_kvs_free(&t->results[i].range);
  free(t->results);
  memset(t, 0, sizeof *t);
}

newt_result_t rdzv_etcd_parse_txn(const char *text, size_t len, rdzv_etcd_txn_result *out) {
  cJSON *j;
  memset(out, 0, sizeof *out);
  NEWT_CHECK(parse_doc(text, len, "txn", &j));
  const cJSON *arr = NULL;
  newt_result_t r;
  NEWT_CHECK_GOTO(rdzv_etcd_parse_header_rev(j, "txn", &out->revision), r, fail);
  NEWT_CHECK_GOTO(newt_json_get_bool(j, "txn", "succeeded", 0, &out->succeeded), r, fail);
  NEWT_CHECK_GOTO(newt_json_get_arr(j, "txn", "responses", 0, &arr), r, fail);
  int cnt = arr ? cJSON_GetArraySize(arr) : 0;
  if (cnt > 0) {
    out->results = calloc((size_t)cnt, sizeof *out->results);
    if (!out->results) {
      r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for %d txn responses", cnt);
      goto fail;
    }
  }
  size_t i = 0;
  for (const cJSON *it = arr ? arr->child : NULL; it; it = it->next, i++) {
    char path[64];
    snprintf(path, sizeof path, "txn.responses[%zu]", i);
    rdzv_etcd_op_result *o = &out->results[i];
    out->n = i + 1;
    const cJSON *sub = NULL;
    if (!cJSON_IsObject(it)) {
      r = NEWT_ERR(NEWT_ERR_CORRUPT, "%s: expected an object", path);
      goto fail;
    }
    if ((sub = cJSON_GetObjectItemCaseSensitive(it, "response_range")) != NULL) {
      o->type = RDZV_OP_RANGE;
      NEWT_CHECK_GOTO(rdzv_etcd_parse_range_obj(sub, path, &o->range), r, fail);
    } else if ((sub = cJSON_GetObjectItemCaseSensitive(it, "response_put")) != NULL) {
      o->type = RDZV_OP_PUT;
      if (!cJSON_IsObject(sub)) {
        r = NEWT_ERR(NEWT_ERR_CORRUPT, "%s.response_put: expected an object", path);
        goto fail;
      }
    } else if ((sub = cJSON_GetObjectItemCaseSensitive(it, "response_delete_range")) != NULL) {
      o->type = RDZV_OP_DELETE;
      NEWT_CHECK_GOTO(newt_json_get_int(sub, path, "deleted", 0, &o->deleted), r, fail);
    } else {
      r = NEWT_ERR(NEWT_ERR_CORRUPT, "%s: none of response_range/put/delete_range", path);
      goto fail;
    }
  }
  cJSON_Delete(j);
  return NEWT_OK;
fail:
  cJSON_Delete(j);
  rdzv_etcd_txn_result_free(out);
  return as_corrupt(r);
}

newt_result_t rdzv_etcd_parse_lease(const char *text, size_t len, int64_t *id, int64_t *ttl,
                                    int64_t *granted_ttl) {
  cJSON *j;
  NEWT_CHECK(parse_doc(text, len, "lease", &j));
  const cJSON *obj = cJSON_GetObjectItemCaseSensitive(j, "result"); /* keep-alive is a stream */
  const char *what = obj ? "lease.result" : "lease";
  if (!obj) obj = j;
  int64_t v_id = 0, v_ttl = 0, v_granted = 0;
  newt_result_t r;
  NEWT_CHECK_GOTO(newt_json_get_int(obj, what, "ID", 0, &v_id), r, out);
  NEWT_CHECK_GOTO(newt_json_get_int(obj, what, "TTL", 0, &v_ttl), r, out);
  NEWT_CHECK_GOTO(newt_json_get_int(obj, what, "grantedTTL", 0, &v_granted), r, out);
  if (id) *id = v_id;
  if (ttl) *ttl = v_ttl;
  if (granted_ttl) *granted_ttl = v_granted;
out:
  cJSON_Delete(j);
  return as_corrupt(r);
}

newt_result_t rdzv_etcd_parse_write(const char *text, size_t len, int64_t *revision, int64_t *deleted) {
  cJSON *j;
  NEWT_CHECK(parse_doc(text, len, "write", &j));
  int64_t rev = 0, del = 0;
  newt_result_t r;
  NEWT_CHECK_GOTO(rdzv_etcd_parse_header_rev(j, "write", &rev), r, out);
  NEWT_CHECK_GOTO(newt_json_get_int(j, "write", "deleted", 0, &del), r, out);
  if (revision) *revision = rev;
  if (deleted) *deleted = del;
out:
  cJSON_Delete(j);
  return as_corrupt(r);
}

void rdzv_etcd_events_free(rdzv_etcd_event *ev, size_t n) {
  for (size_t i = 0; ev && i < n; i++) {
    rdzv_etcd_kv_free(&ev[i].kv);
    rdzv_etcd_kv_free(&ev[i].prev_kv);
  }
  free(ev);
}

void rdzv_etcd_watch_msg_free(rdzv_etcd_watch_msg *m) {
  if (!m) return;
  rdzv_etcd_events_free(m->events, m->n_events);
  m->events = NULL;
  m->n_events = 0;
}

static newt_result_t parse_event(const cJSON *it, const char *path, rdzv_etcd_event *ev) {
  const char *type = NULL;
  const cJSON *kv = NULL, *prev = NULL;
  NEWT_CHECK(newt_json_get_str(it, path, "type", 0, &type));
  if (!type || strcmp(type, "PUT") == 0) ev->type = RDZV_EVENT_PUT;
  else if (strcmp(type, "DELETE") == 0) ev->type = RDZV_EVENT_DELETE;
  else return NEWT_ERR(NEWT_ERR_CORRUPT, "%s.type: unknown event type \"%.32s\"", path, type);
  NEWT_CHECK(newt_json_get_obj(it, path, "kv", 1, &kv));
  char sub[160];
  snprintf(sub, sizeof sub, "%s.kv", path);
  NEWT_CHECK(rdzv_etcd_parse_kv(kv, sub, &ev->kv));
  if (ev->kv.mod_revision <= 0)
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s.mod_revision: missing or not positive", sub);
  NEWT_CHECK(newt_json_get_obj(it, path, "prev_kv", 0, &prev));
  if (prev) {
    snprintf(sub, sizeof sub, "%s.prev_kv", path);
    NEWT_CHECK(rdzv_etcd_parse_kv(prev, sub, &ev->prev_kv));
    ev->has_prev = 1;
  }
  return NEWT_OK;
}

newt_result_t rdzv_etcd_parse_watch(const char *text, size_t len, rdzv_etcd_watch_msg *out) {
  memset(out, 0, sizeof *out);
  cJSON *j;
  NEWT_CHECK(parse_doc(text, len, "watch", &j));
  newt_result_t r = NEWT_OK;
  if (cJSON_GetObjectItemCaseSensitive(j, "error")) {
    out->is_error = 1;
    rdzv_etcd_parse_error(text, len, &out->gw);
    cJSON_Delete(j);
    return NEWT_OK;
  }
  const cJSON *res = NULL, *arr = NULL;
  const char *reason = NULL;
  NEWT_CHECK_GOTO(newt_json_get_obj(j, "watch", "result", 1, &res), r, fail);
  NEWT_CHECK_GOTO(rdzv_etcd_parse_header_rev(res, "watch.result", &out->revision), r, fail);
  NEWT_CHECK_GOTO(newt_json_get_bool(res, "watch.result", "created", 0, &out->created), r, fail);
  NEWT_CHECK_GOTO(newt_json_get_bool(res, "watch.result", "canceled", 0, &out->canceled), r, fail);
  NEWT_CHECK_GOTO(newt_json_get_int(res, "watch.result", "compact_revision", 0, &out->compact_revision),
                  r, fail);
  NEWT_CHECK_GOTO(newt_json_get_str(res, "watch.result", "cancel_reason", 0, &reason), r, fail);
  if (reason) snprintf(out->cancel_reason, sizeof out->cancel_reason, "%s", reason);
  NEWT_CHECK_GOTO(newt_json_get_arr(res, "watch.result", "events", 0, &arr), r, fail);
  int cnt = arr ? cJSON_GetArraySize(arr) : 0;
  if (cnt > 0) {
    out->events = calloc((size_t)cnt, sizeof *out->events);
    if (!out->events) {
      r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for %d watch events", cnt);
      goto fail;
    }
    size_t i = 0;
    for (const cJSON *it = arr->child; it; it = it->next, i++) {
      char path[64];
      snprintf(path, sizeof path, "watch.result.events[%zu]", i);
      out->n_events = i + 1;
      NEWT_CHECK_GOTO(parse_event(it, path, &out->events[i]), r, fail);
      if (i > 0 && out->events[i].kv.mod_revision < out->events[i - 1].kv.mod_revision) {
        r = NEWT_ERR(NEWT_ERR_CORRUPT, "%s: revision %lld after %lld (out of order)", path,
                     (long long)out->events[i].kv.mod_revision,
                     (long long)out->events[i - 1].kv.mod_revision);
        goto fail;
      }
    }
  }
  cJSON_Delete(j);
  return NEWT_OK;
fail:
  cJSON_Delete(j);
  rdzv_etcd_watch_msg_free(out);
  return as_corrupt(r);
}
