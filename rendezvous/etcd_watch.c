/* Watches over the gateway's streaming /v3/watch (see etcd.h).
 *
 * Each watch owns a thread and a curl multi handle (so another thread can wake it up to
 * cancel). The thread POSTs {"create_request":{...,"start_revision":next}} and reads the
 * answer as it streams: bytes go through the line splitter (etcd_parse.c), never trusting
 * HTTP chunk boundaries, and each line is one WatchResponse ({"result":{...}}):
 *   - created: the watch is live; without a start revision, events after the header
 *     revision follow, so next = revision + 1;
 *   - events: delivered in order; next = last event's mod_revision + 1; an event below
 *     next (never expected) is dropped, so nothing is delivered twice;
 *   - no events, not created/canceled: a progress notification, next = revision + 1;
 *   - canceled with compact_revision: the history from next on is gone, so the thread
 *     reads the whole range (RESYNC, at its revision R) and watches again from R + 1;
 *   - canceled otherwise, or {"error":..}: reported (ERROR), then re-opened; an invalid
 *     auth token is traded for a new one first;
 *   - created at a store revision below one already delivered: etcd lost its data and
 *     counts revisions from 1 again, so the thread reads the whole range (RESYNC) and
 *     watches from there.
 * When the stream breaks (etcd restarts, a proxy cuts it), the thread backs off (100 ms
 * doubling to 1 s, cut short by a cancel or by the client's calls coming back from an
 * outage) and re-opens from `next` on the next endpoint,
 * so no revision is missed or repeated. A stream can also die without breaking: an etcd
 * that is starting takes the connection and never answers the create request, and a
 * connection across an outage may be dead with nobody to close it. So a stream that is not
 * created within its deadline is re-opened, and so is a stream opened before the client's
 * calls last came back from an outage (rdzv_etcd.recoveries). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "rendezvous/etcd_internal.h"
#include "rendezvous/etcd_parse.h"

struct rdzv_etcd_watch {
  rdzv_etcd *c;
  char *key;
  int prefix;
  rdzv_etcd_watch_opts o;
  rdzv_etcd_watch_fn fn;
  void *ud;
  pthread_t thread;
  int thread_started;
  CURLM *multi;
  atomic_int cancel;
  atomic_llong next_rev;
  atomic_llong reconnects;

  pthread_mutex_t mu; /* start handshake and abortable sleeps */
  pthread_cond_t cv;
  int start_state; /* 0 waiting, 1 created */
  char last_err[512];

  /* per-stream state (watch thread only) */
  rdzv_etcd_lines lines;
  int created, stop_stream, need_resync, token_error;
  unsigned long long opened_at; /* the client's recoveries when the last stream was opened */
  int ever_created;
  newt_result_t stream_code; /* the code of stream_err */
  newt_result_t last_code;
  char stream_err[512];
};

static void set_err(rdzv_etcd_watch *w, const char *fmt, const char *a, const char *b) {
  rdzv_fmt(w->stream_err, sizeof w->stream_err, fmt, a, b);
  w->stream_code = NEWT_ERR_UNAVAILABLE;
}

static void deliver(rdzv_etcd_watch *w, rdzv_etcd_watch_resp *r) {
  if (!atomic_load(&w->cancel) && w->fn) w->fn(w->ud, r);
}

static void mark_started(rdzv_etcd_watch *w) {
  pthread_mutex_lock(&w->mu);
  w->start_state = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static newt_result_t on_line(void *ud, const char *line, size_t len) {
  rdzv_etcd_watch *w = ud;
  rdzv_etcd_watch_msg m;
  newt_result_t r = rdzv_etcd_parse_watch(line, len, &m);
  if (r != NEWT_OK) {
    set_err(w, "%s%s", "bad watch message: ", newt_errmsg());
    return r;
  }
  if (m.is_error) {
    set_err(w, "%s%s", "etcd: ", m.gw.message);
    w->stream_code = rdzv_etcd_grpc_code_result(m.gw.grpc_code, m.gw.message);
    w->token_error = rdzv_etcd_is_token_error(m.gw.message);
    return NEWT_ERR(NEWT_ERR_PEER, "watch: %s", m.gw.message);
  }
  if (m.canceled) {
    if (m.compact_revision > 0) {
      NEWT_INFO(RDZV, "watch %s: revision %lld was compacted (compact revision %lld): re-reading",
                w->key, (long long)atomic_load(&w->next_rev), (long long)m.compact_revision);
      w->need_resync = 1;
    } else {
      set_err(w, "%s%s", "etcd canceled the watch: ", m.cancel_reason[0] ? m.cancel_reason : "(no reason)");
      if (strstr(m.cancel_reason, "Unauthenticated") || strstr(m.cancel_reason, "PermissionDenied") ||
          strstr(m.cancel_reason, "permission denied"))
        w->stream_code = NEWT_ERR_AUTH;
      w->token_error = rdzv_etcd_is_token_error(m.cancel_reason);
    }
    rdzv_etcd_watch_msg_free(&m);
    w->stop_stream = 1;
    return NEWT_ERR(NEWT_ERR_ABORTED, "watch canceled");
  }
  if (m.created && atomic_load(&w->next_rev) > m.revision + 1) {
    /* the store is behind a revision this watch has seen: etcd lost its data (it came back
       empty) and its revisions count from 1 again; read it all and go on from there */
    NEWT_WARN(RDZV, "watch %s: etcd is at revision %lld, behind %lld seen before: it lost its data; re-reading",
              w->key, (long long)m.revision, (long long)atomic_load(&w->next_rev) - 1);
    rdzv_etcd_watch_msg_free(&m);
    w->need_resync = 1;
    w->stop_stream = 1;
    return NEWT_ERR(NEWT_ERR_ABORTED, "etcd's store was reset");
  }
  if (m.created) {
    if (w->ever_created) atomic_fetch_add(&w->reconnects, 1);
    w->ever_created = 1;
    w->created = 1;
    if (atomic_load(&w->next_rev) == 0) atomic_store(&w->next_rev, m.revision + 1);
    mark_started(w);
  }
  int64_t next = atomic_load(&w->next_rev);
  if (m.n_events > 0) {
    size_t skip = 0;
    while (skip < m.n_events && m.events[skip].kv.mod_revision < next) skip++;
    if (skip) NEWT_WARN(RDZV, "watch %s: dropped %zu events already delivered", w->key, skip);
    if (skip < m.n_events) {
      rdzv_etcd_watch_resp resp = {.kind = RDZV_WATCH_EVENTS,
                                   .revision = m.events[m.n_events - 1].kv.mod_revision,
                                   .events = m.events + skip,
                                   .n_events = m.n_events - skip};
      atomic_store(&w->next_rev, resp.revision + 1);
      deliver(w, &resp);
    }
  } else if (!m.created && w->created) {
    /* everything up to m.revision has been delivered */
    if (m.revision >= next) atomic_store(&w->next_rev, m.revision + 1);
    rdzv_etcd_watch_resp resp = {.kind = RDZV_WATCH_PROGRESS, .revision = m.revision};
    deliver(w, &resp);
  }
  rdzv_etcd_watch_msg_free(&m);
  return NEWT_OK;
}

static size_t on_data(char *data, size_t size, size_t nmemb, void *ud) {
  rdzv_etcd_watch *w = ud;
  size_t n = size * nmemb;
  if (atomic_load(&w->cancel) || w->stop_stream) return 0;
  if (rdzv_etcd_lines_feed(&w->lines, data, n, on_line, w) != NEWT_OK) {
    if (!w->stream_err[0]) set_err(w, "%s%s", "watch stream: ", newt_errmsg());
    w->stop_stream = 1;
    return 0;
  }
  return n;
}

/* Sleeps up to ms; returns early on cancel, and once the client's calls have come back from an
 * outage since the stream was opened (rdzv_etcd.recoveries): etcd answers again, so the stream
 * is re-opened at once, not at the end of a back-off that may be a second and more past etcd's
 * return (a leader would see the reports queued during the outage that much later). */
static void nap(rdzv_etcd_watch *w, int64_t ms) {
  uint64_t until = newt_now_ns() + (uint64_t)ms * 1000000ull;
  pthread_mutex_lock(&w->mu);
  while (!atomic_load(&w->cancel) && atomic_load(&w->c->recoveries) == w->opened_at) {
    uint64_t now = newt_now_ns(), next = now + 20000000ull; /* look at the client every 20 ms */
    if (now >= until) break;
    if (next > until) next = until;
    struct timespec ts = {(time_t)(next / 1000000000ull), (long)(next % 1000000000ull)};
    pthread_cond_timedwait(&w->cv, &w->mu, &ts);
  }
  pthread_mutex_unlock(&w->mu);
}

static char *create_body(rdzv_etcd_watch *w) {
  cJSON *req = cJSON_CreateObject(), *cr = req ? cJSON_AddObjectToObject(req, "create_request") : NULL;
  int ok = cr != NULL;
  size_t klen = strlen(w->key);
  if (ok && w->prefix) {
    char *end = malloc(klen + 2);
    size_t elen = 0;
    if (end) rdzv_etcd_prefix_end(w->key, klen, end, &elen);
    ok = end && rdzv_etcd_add_b64(cr, "key", klen ? w->key : "\0", klen ? klen : 1) &&
         rdzv_etcd_add_b64(cr, "range_end", end, elen);
    free(end);
  } else if (ok) {
    ok = rdzv_etcd_add_b64(cr, "key", w->key, klen) != NULL;
  }
  int64_t next = atomic_load(&w->next_rev);
  if (ok && next > 0) ok = rdzv_etcd_add_i64(cr, "start_revision", next) != NULL;
  if (ok && w->o.prev_kv) ok = cJSON_AddTrueToObject(cr, "prev_kv") != NULL;
  if (ok && w->o.progress_notify) ok = cJSON_AddTrueToObject(cr, "progress_notify") != NULL;
  char *body = ok ? cJSON_PrintUnformatted(req) : NULL;
  cJSON_Delete(req);
  return body;
}

/* One stream on one endpoint, until it ends, breaks, or the watch is canceled. */
static void run_stream(rdzv_etcd_watch *w, size_t endpoint) {
  rdzv_etcd *c = w->c;
  w->created = w->stop_stream = w->token_error = 0;
  w->stream_err[0] = '\0';
  rdzv_etcd_lines_reset(&w->lines);
  char url[1024];
  snprintf(url, sizeof url, "%s/v3/watch", c->urls[endpoint]);
  struct curl_slist *hdrs = NULL;
  uint64_t gen = 0;
  newt_result_t hr = rdzv_etcd_headers(c, newt_deadline_in_ms(c->connect_ms * 2), &hdrs, &gen);
  if (hr != NEWT_OK) {
    set_err(w, "%s%s", "", newt_errmsg());
    w->stream_code = hr;
    return;
  }
  char *body = create_body(w);
  CURL *h = rdzv_etcd_handle_new(c);
  if (!body || !h) {
    set_err(w, "%s%s", "out of memory opening a watch", "");
    free(body);
    curl_slist_free_all(hdrs);
    if (h) curl_easy_cleanup(h);
    return;
  }
  char errbuf[CURL_ERROR_SIZE] = "";
  rdzv_etcd_setup_post(h, url, body, hdrs, on_data, w, errbuf);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)c->connect_ms);
  if (w->o.idle_timeout_ms > 0) {
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)((w->o.idle_timeout_ms + 999) / 1000));
  }
  curl_multi_add_handle(w->multi, h);
  CURLcode done = CURLE_OK;
  uint64_t opened = newt_now_ns();
  int64_t create_ms = 3 * c->connect_ms > 3000 ? 3 * c->connect_ms : 3000;
  unsigned long long epoch = atomic_load(&c->recoveries);
  w->opened_at = epoch;
  for (;;) {
    int running = 0;
    CURLMcode mc = curl_multi_perform(w->multi, &running);
    if (mc != CURLM_OK) {
      set_err(w, "%s%s", "curl_multi_perform: ", curl_multi_strerror(mc));
      break;
    }
    int left;
    CURLMsg *msg;
    while ((msg = curl_multi_info_read(w->multi, &left)) != NULL)
      if (msg->msg == CURLMSG_DONE) done = msg->data.result;
    if (!running || atomic_load(&w->cancel) || w->stop_stream) break;
    if (!w->created && newt_now_ns() - opened > (uint64_t)create_ms * 1000000ull) {
      rdzv_fmt(w->stream_err, sizeof w->stream_err, "%s: no answer to the create request within %lld ms", url,
               (long long)create_ms);
      w->stream_code = NEWT_ERR_UNAVAILABLE;
      /* a token etcd cannot check (emptied and started again: its history is behind the token)
         is held, not refused: trade the password anew */
      w->token_error = c->user != NULL;
      break;
    }
    if (atomic_load(&c->recoveries) != epoch) {
      rdzv_fmt(w->stream_err, sizeof w->stream_err, "%s: etcd answers again after an outage", url);
      w->stream_code = NEWT_ERR_UNAVAILABLE;
      break;
    }
    curl_multi_poll(w->multi, NULL, 0, 200, NULL);
  }
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  if (!atomic_load(&w->cancel) && !w->stream_err[0] && !w->need_resync) {
    if (status != 0 && status != 200) {
      rdzv_etcd_gw_error e;
      rdzv_etcd_parse_error(w->lines.buf.data ? w->lines.buf.data : "", w->lines.buf.len, &e);
      rdzv_fmt(w->stream_err, sizeof w->stream_err, "%s: HTTP %ld: %s", url, status, e.message);
      w->stream_code = e.grpc_code >= 0 ? rdzv_etcd_grpc_code_result(e.grpc_code, e.message) : NEWT_ERR_PEER;
      w->token_error = rdzv_etcd_is_token_error(e.message);
    } else if (done != CURLE_OK) {
      int retry_safe;
      w->stream_code = rdzv_etcd_curl_result(c, h, done, errbuf, url, &retry_safe);
      rdzv_fmt(w->stream_err, sizeof w->stream_err, "%s", newt_errmsg());
    } else {
      rdzv_fmt(w->stream_err, sizeof w->stream_err, "%s: the stream ended", url);
      w->stream_code = NEWT_ERR_UNAVAILABLE;
    }
  } else if (w->stream_err[0] && !strstr(w->stream_err, "://")) {
    char tmp[sizeof w->stream_err];
    rdzv_fmt(tmp, sizeof tmp, "%s: %s", url, w->stream_err);
    memcpy(w->stream_err, tmp, sizeof tmp);
  }
  curl_multi_remove_handle(w->multi, h);
  curl_easy_cleanup(h);
  curl_slist_free_all(hdrs);
  free(body);
  if (w->token_error) rdzv_etcd_reauth(c, gen, newt_deadline_in_ms(c->connect_ms * 2));
}

/* The whole range at the latest revision, delivered as RESYNC. */
static newt_result_t resync(rdzv_etcd_watch *w) {
  rdzv_etcd_range_opts ro = {.prefix = w->prefix};
  rdzv_etcd_kvs kvs;
  NEWT_CHECK(rdzv_etcd_range(w->c, w->key, &ro, newt_deadline_in_ms(5000), &kvs));
  rdzv_etcd_watch_resp resp = {.kind = RDZV_WATCH_RESYNC, .revision = kvs.revision, .kvs = kvs.kvs,
                               .n_kvs = kvs.n};
  atomic_store(&w->next_rev, kvs.revision + 1);
  deliver(w, &resp);
  rdzv_etcd_kvs_free(&kvs);
  return NEWT_OK;
}

static void *watch_main(void *arg) {
  rdzv_etcd_watch *w = arg;
  size_t endpoint = atomic_load(&w->c->preferred) % w->c->n_urls;
  int64_t backoff = 100;
  while (!atomic_load(&w->cancel)) {
    if (w->need_resync) {
      if (resync(w) != NEWT_OK) {
        rdzv_fmt(w->stream_err, sizeof w->stream_err, "re-reading after compaction: %s", newt_errmsg());
        rdzv_etcd_watch_resp er = {.kind = RDZV_WATCH_ERROR, .error = w->stream_err};
        deliver(w, &er);
        nap(w, backoff);
        if (backoff < 1000) backoff *= 2;
        continue;
      }
      w->need_resync = 0;
    }
    run_stream(w, endpoint);
    if (atomic_load(&w->cancel)) break;
    if (w->created) backoff = 100;
    if (w->need_resync) {
      if (!w->created) mark_started(w); /* compacted start revision: the resync is the start */
      continue;
    }
    pthread_mutex_lock(&w->mu);
    rdzv_fmt(w->last_err, sizeof w->last_err, "%s", w->stream_err);
    w->last_code = w->stream_code;
    pthread_mutex_unlock(&w->mu);
    NEWT_INFO(RDZV, "watch %s: %s; re-opening from revision %lld", w->key, w->stream_err,
              (long long)atomic_load(&w->next_rev));
    rdzv_etcd_watch_resp er = {.kind = RDZV_WATCH_ERROR, .error = w->stream_err,
                               .revision = atomic_load(&w->next_rev) - 1};
    deliver(w, &er);
    if (!w->created) endpoint = (endpoint + 1) % w->c->n_urls;
    nap(w, backoff);
    if (backoff < 1000) backoff *= 2;
  }
  return NULL;
}

newt_result_t rdzv_etcd_watch_start(rdzv_etcd *c, const char *key, const rdzv_etcd_watch_opts *o,
                                    rdzv_etcd_watch_fn fn, void *ud, newt_deadline_t d,
                                    rdzv_etcd_watch **out) {
  static const rdzv_etcd_watch_opts none;
  *out = NULL;
  if (!key) return NEWT_ERR(NEWT_ERR_INVALID, "watch: key is NULL");
  if (!o) o = &none;
  rdzv_etcd_watch *w = calloc(1, sizeof *w);
  NEWT_CHECK_ALLOC(w);
  w->c = c;
  w->key = newt_strdup(key);
  w->prefix = o->prefix;
  w->o = *o;
  w->fn = fn;
  w->ud = ud;
  atomic_store(&w->next_rev, o->start_revision > 0 ? o->start_revision : 0);
  rdzv_etcd_lines_init(&w->lines, 0);
  pthread_mutex_init(&w->mu, NULL);
  rdzv_cond_init(&w->cv);
  w->multi = curl_multi_init();
  if (!w->key || !w->multi) {
    rdzv_etcd_watch_free(w);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory starting a watch on %.200s", key);
  }
  int err = pthread_create(&w->thread, NULL, watch_main, w);
  if (err) {
    rdzv_etcd_watch_free(w);
    return NEWT_ERR(NEWT_ERR_SYS, "starting a watch thread: %s", strerror(err));
  }
  w->thread_started = 1;
  /* wait for "created" (or a resync that stands for it) */
  pthread_mutex_lock(&w->mu);
  while (w->start_state == 0 && !newt_deadline_passed(d)) {
    uint64_t until = d == NEWT_DEADLINE_NONE ? newt_now_ns() + 1000000000ull : d;
    struct timespec ts = {(time_t)(until / 1000000000ull), (long)(until % 1000000000ull)};
    pthread_cond_timedwait(&w->cv, &w->mu, &ts);
  }
  int ok = w->start_state == 1;
  char why[sizeof w->last_err];
  memcpy(why, w->last_err, sizeof why);
  newt_result_t code = w->last_code == NEWT_ERR_AUTH || w->last_code == NEWT_ERR_INVALID ? w->last_code
                                                                                      : NEWT_ERR_UNAVAILABLE;
  pthread_mutex_unlock(&w->mu);
  if (!ok) {
    rdzv_etcd_watch_free(w);
    return NEWT_ERR(code,
                    "watch on %.200s at %s not created by the deadline: %s", key, c->endpoints_str,
                    why[0] ? why : "no answer");
  }
  *out = w;
  return NEWT_OK;
}

void rdzv_etcd_watch_cancel(rdzv_etcd_watch *w) {
  if (!w) return;
  atomic_store(&w->cancel, 1);
  pthread_mutex_lock(&w->mu);
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  if (w->multi) curl_multi_wakeup(w->multi);
}

void rdzv_etcd_watch_free(rdzv_etcd_watch *w) {
  if (!w) return;
  rdzv_etcd_watch_cancel(w);
  if (w->thread_started) pthread_join(w->thread, NULL);
  if (w->multi) curl_multi_cleanup(w->multi);
  rdzv_etcd_lines_free(&w->lines);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w->key);
  free(w);
}

int64_t rdzv_etcd_watch_next_revision(rdzv_etcd_watch *w) { return atomic_load(&w->next_rev); }

int64_t rdzv_etcd_watch_reconnects(rdzv_etcd_watch *w) { return atomic_load(&w->reconnects); }
