/* The job's records in etcd over rendezvous' generic protocols (see store.h): keys from
 * job_key / job_prefix, values from the records' codecs. */
#include "job/store.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/json.h"
#include "common/log.h"
#include "common/param.h"
#include "common/sys.h"
#include "job/codec.h"

NEWT_PARAM(EtcdCallMs, "NEWT_ETCD_CALL_MS", 5000)
/* A plan of more ranks than this is written as a head and shards of about this many ranks
 * (some 100 bytes each: 2048 are some 200 KB, 270 KB in the gateway's base64). */
NEWT_PARAM(PlanShardRanks, "NEWT_PLAN_SHARD_RANKS", 2048)
/* The shards one guarded transaction writes at most, by their bytes (etcd refuses a request
 * over 1.5 MiB; base64 makes 4 bytes of 3): some 700 KB a request. */
NEWT_PARAM(PlanTxnBytes, "NEWT_PLAN_TXN_BYTES", 512 * 1024)

newt_deadline_t job_call_deadline(void) { return newt_deadline_in_ms(newt_param_EtcdCallMs()); }

/* --- plan, spec, events --------------------------------------------------------------------- */

newt_result_t job_plan_publish(rdzv_candidate *cand, const char *job, int64_t generation, const char *plan_json,
                               newt_deadline_t d) {
  if (generation < 1)
    return NEWT_ERR(NEWT_ERR_INVALID, "publishing plan generation %lld: expected 1 or more", (long long)generation);
  char key[256];
  NEWT_CHECK(job_key(key, sizeof key, job, JOB_REC_PLAN, 0, NULL));
  NEWT_CHECK(rdzv_guarded_put(cand, key, plan_json, strlen(plan_json), d, NULL));
  NEWT_DEBUG(JOB, "published plan generation %lld of job %s", (long long)generation, job);
  return NEWT_OK;
}

/* The key of shard i of plan g. */
static newt_result_t shard_key(char *out, size_t cap, const char *job, uint64_t g, int i) {
  char id[16];
  snprintf(id, sizeof id, "%06d", i);
  return job_key(out, cap, job, JOB_REC_PLAN_SHARD, g, id);
}

/* The shards, in guarded transactions of at most PlanTxnBytes of values (and 64 puts) each. */
static newt_result_t put_shards(rdzv_candidate *cand, const char *job, uint64_t g, char **texts, int n,
                                newt_deadline_t d) {
  rdzv_etcd_op ops[64];
  char keys[64][256];
  newt_result_t r = NEWT_OK;
  for (int i = 0; i < n && r == NEWT_OK;) {
    size_t bytes = 0;
    int k = 0;
    while (i < n && k < 64 && (k == 0 || bytes + strlen(texts[i]) <= (size_t)newt_param_PlanTxnBytes())) {
      NEWT_CHECK(shard_key(keys[k], sizeof keys[k], job, g, i));
      ops[k] = (rdzv_etcd_op){.type = RDZV_OP_PUT, .key = keys[k], .value = texts[i], .value_len = strlen(texts[i])};
      bytes += ops[k].value_len;
      k++, i++;
    }
    r = rdzv_guarded_txn(cand, NULL, 0, ops, (size_t)k, d, NULL);
  }
  return r;
}

newt_result_t job_plan_publish_plan(rdzv_candidate *cand, const char *job, const newt_plan *p, newt_deadline_t d,
                                    size_t *bytes) {
  if (bytes) *bytes = 0;
  if (p->nranks <= newt_param_PlanShardRanks()) { /* one record: the previous release's */
    char *json = plan_to_json(p);
    if (!json) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing plan %llu", (unsigned long long)p->generation);
    newt_result_t r = job_plan_publish(cand, job, (int64_t)p->generation, json, d);
    if (bytes) *bytes = strlen(json);
    free(json);
    return r;
  }
  char *head, **texts, key[256], below[256];
  int n;
  NEWT_CHECK(plan_shard_encode(p, (int)newt_param_PlanShardRanks(), &head, &texts, &n));
  /* the shards first, then the head that names them: a reader that sees the head finds them */
  newt_result_t r = put_shards(cand, job, p->generation, texts, n, d);
  if (r == NEWT_OK) r = job_key(key, sizeof key, job, JOB_REC_PLAN, 0, NULL);
  if (r == NEWT_OK) r = job_prefix(below, sizeof below, job, JOB_REC_PLAN_SHARD, (int64_t)p->generation);
  char from[256];
  if (r == NEWT_OK) r = job_prefix(from, sizeof from, job, JOB_REC_PLAN_SHARD, -1);
  if (r == NEWT_OK) {
    /* the head, and the shards of older plans deleted (a reader of an older head reads its
       shards at its head's revision) */
    rdzv_etcd_op ops[2] = {{.type = RDZV_OP_PUT, .key = key, .value = head, .value_len = strlen(head)},
                           {.type = RDZV_OP_DELETE, .key = from, .range_end = below}};
    r = rdzv_guarded_txn(cand, NULL, 0, ops, 2, d, NULL);
  }
  if (bytes) {
    *bytes = strlen(head);
    for (int i = 0; i < n; i++) *bytes += strlen(texts[i]);
  }
  free(head);
  plan_shard_texts_free(texts, n);
  if (r == NEWT_OK)
    NEWT_DEBUG(JOB, "published plan generation %llu of job %s in %d shards", (unsigned long long)p->generation, job, n);
  return r;
}

/* The shard index of a shard key's id ("000003"), -1 when it is none. */
static int shard_index(const char *id) {
  int i = 0, k = 0;
  for (; id[k] >= '0' && id[k] <= '9' && k < 6; k++) i = i * 10 + (id[k] - '0');
  return k == 6 && id[k] == '\0' ? i : -1;
}

newt_result_t job_plan_shards_get(rdzv_etcd *c, const char *job, newt_plan *head, int64_t revision,
                                  newt_deadline_t d) {
  if (!plan_is_partial(head)) return NEWT_OK;
  char prefix[256], end[256], from[300];
  size_t plen, elen;
  NEWT_CHECK(job_prefix(prefix, sizeof prefix, job, JOB_REC_PLAN_SHARD, (int64_t)head->generation));
  plen = strlen(prefix);
  rdzv_etcd_prefix_end(prefix, plen, end, &elen);
  snprintf(from, sizeof from, "%s", prefix);
  for (;;) { /* in pieces of 4 shards: no answer is larger than a few requests */
    rdzv_etcd_kvs kvs;
    rdzv_etcd_range_opts o = {.range_end = end, .limit = 4, .revision = revision};
    NEWT_CHECK(rdzv_etcd_range(c, from, &o, d, &kvs));
    newt_result_t r = NEWT_OK;
    for (size_t k = 0; k < kvs.n && r == NEWT_OK; k++) {
      int i = kvs.kvs[k].key_len > plen ? shard_index(kvs.kvs[k].key + plen) : -1;
      if (i >= 0 && i < head->nshards && !head->shards[i].added)
        r = plan_shard_add(head, i, kvs.kvs[k].value, kvs.kvs[k].value_len);
    }
    int more = kvs.more && kvs.n > 0;
    /* on from the key after the last one read: keys here are text, and the last one with a
       byte 1 after it comes before any longer key that starts with it */
    if (more) snprintf(from, sizeof from, "%.*s\x01", (int)kvs.kvs[kvs.n - 1].key_len, kvs.kvs[kvs.n - 1].key);
    rdzv_etcd_kvs_free(&kvs);
    NEWT_CHECK(r);
    if (!more) break;
  }
  return plan_shards_done(head);
}

newt_result_t job_plan_shard_get(rdzv_etcd *c, const char *job, const newt_plan *head, int i, int64_t revision,
                                 newt_deadline_t d, plan_rank **out, int *n) {
  char key[256];
  NEWT_CHECK(shard_key(key, sizeof key, job, head->generation, i));
  rdzv_etcd_kvs kvs;
  rdzv_etcd_range_opts o = {.revision = revision};
  NEWT_CHECK(rdzv_etcd_range(c, key, &o, d, &kvs));
  newt_result_t r = kvs.n == 1 ? plan_shard_read(head, i, kvs.kvs[0].value, kvs.kvs[0].value_len, out, n)
                               : NEWT_ERR(NEWT_ERR_NOTFOUND, "plan %llu: shard %d (%s) is missing",
                                          (unsigned long long)head->generation, i, key);
  rdzv_etcd_kvs_free(&kvs);
  return r;
}

/* The value of the job's record rec (malloc'd, NUL-terminated). */
static newt_result_t get_value(rdzv_etcd *c, const char *job, job_record rec, newt_deadline_t d, char **out,
                               int64_t *mod_revision) {
  char key[256];
  NEWT_CHECK(job_key(key, sizeof key, job, rec, 0, NULL));
  rdzv_etcd_kv kv;
  NEWT_CHECK(rdzv_etcd_get(c, key, d, &kv, NULL));
  *out = kv.value;
  if (mod_revision) *mod_revision = kv.mod_revision;
  kv.value = NULL;
  rdzv_etcd_kv_free(&kv);
  return NEWT_OK;
}

/* A plan's generation, read without the rest of the plan (plan_from_json checks the whole). */
typedef struct plan_head {
  int64_t generation;
} plan_head;
static const codec_field plan_head_fields[] = {
    {CODEC_INT(plan_head, generation, "generation", 0, INT64_MAX), CODEC_REQUIRED},
};
static const codec_table plan_head_table = CODEC_TABLE(plan_head, "plan", plan_head_fields);

newt_result_t job_plan_get(rdzv_etcd *c, const char *job, newt_deadline_t d, char **json, int64_t *generation,
                           int64_t *mod_revision) {
  char *s;
  NEWT_CHECK(get_value(c, job, JOB_REC_PLAN, d, &s, mod_revision));
  plan_head h;
  newt_result_t r = codec_read(&plan_head_table, s, strlen(s), NULL, &h);
  if (r != NEWT_OK) {
    free(s);
    return r;
  }
  if (generation) *generation = h.generation;
  if (json) *json = s;
  else free(s);
  return NEWT_OK;
}

/* text as a JSON document (an object when object is set); errors name what. */
static newt_result_t check_json(const char *text, const char *what, int object) {
  cJSON *j;
  NEWT_CHECK(newt_json_parse(text, strlen(text), what, &j));
  int ok = !object || cJSON_IsObject(j);
  cJSON_Delete(j);
  return ok ? NEWT_OK : NEWT_ERR(NEWT_ERR_INVALID, "%s: expected a JSON object", what);
}

newt_result_t job_spec_put(rdzv_etcd *c, const char *job, const char *spec_json, newt_deadline_t d) {
  char key[256];
  NEWT_CHECK(job_key(key, sizeof key, job, JOB_REC_SPEC, 0, NULL));
  NEWT_CHECK(check_json(spec_json, "spec", 0));
  return rdzv_etcd_put(c, key, spec_json, strlen(spec_json), 0, d, NULL);
}

newt_result_t job_spec_get(rdzv_etcd *c, const char *job, newt_deadline_t d, char **spec_json) {
  return get_value(c, job, JOB_REC_SPEC, d, spec_json, NULL);
}

newt_result_t job_event_post(rdzv_etcd *c, const char *job, const char *event_json, newt_deadline_t d) {
  NEWT_CHECK(check_json(event_json, "event", 1));
  /* time, then this process's sequence (two events of one millisecond keep their order),
   * then a random tag (two processes' events of one millisecond do not collide) */
  static atomic_uint_fast32_t seq;
  unsigned n = (unsigned)atomic_fetch_add(&seq, 1);
  char rnd[9], key[256];
  NEWT_CHECK(newt_random_hex(rnd, 4));
  NEWT_CHECK(job_prefix(key, sizeof key - 40, job, JOB_REC_EVENT, -1));
  size_t len = strlen(key);
  snprintf(key + len, sizeof key - len, "%016llu-%08x-%s", (unsigned long long)newt_wall_ms(), n, rnd);
  return rdzv_etcd_put(c, key, event_json, strlen(event_json), 0, d, NULL);
}

/* --- the end: done or failed ---------------------------------------------------------------- */

int job_is_done(rdzv_etcd *c, const char *job, const newt_spec *spec, const job_auth *auth) {
  return job_done_get(c, job, spec, auth, NULL);
}

/* The step of the job's progress record as it was at etcd revision rev (0: now); -1: none,
 * unreadable, or compacted away. */
static int64_t progress_step(rdzv_etcd *c, const char *job, int64_t rev) {
  char key[256];
  if (job_key(key, sizeof key, job, JOB_REC_PROGRESS, 0, NULL) != NEWT_OK) return -1;
  rdzv_etcd_range_opts o = {.revision = rev};
  rdzv_etcd_kvs kvs;
  if (rdzv_etcd_range(c, key, &o, job_call_deadline(), &kvs) != NEWT_OK) {
    newt_err_clear();
    return -1;
  }
  job_progress p;
  int64_t step = kvs.n == 1 && job_progress_from_json(kvs.kvs[0].value, kvs.kvs[0].value_len, &p) == NEWT_OK ? p.step : -1;
  rdzv_etcd_kvs_free(&kvs);
  return step;
}

int job_done_get(rdzv_etcd *c, const char *job, const newt_spec *spec, const job_auth *auth, job_done *out) {
  char key[256];
  rdzv_etcd_kv kv;
  if (job_key(key, sizeof key, job, JOB_REC_DONE, 0, NULL) != NEWT_OK) return 0;
  if (rdzv_etcd_get(c, key, job_call_deadline(), &kv, NULL) != NEWT_OK) return 0;
  job_done d;
  int ok = job_done_from_json(kv.value, kv.value_len, &d) == NEWT_OK;
  int64_t rev = kv.mod_revision;
  rdzv_etcd_kv_free(&kv);
  /* the progress the job had when the marker was written (a rank writes its last step's in
     the marker's transaction), or has now: another rank's older progress, queued while etcd
     was away, may land after the marker, and must not unmake a true end */
  if (ok) {
    int64_t then = progress_step(c, job, rev), now = then >= d.step ? then : progress_step(c, job, 0);
    if (job_done_counts(&d, key, spec, auth, then > now ? then : now) != NEWT_OK) ok = 0;
  }
  /* said once per version of the record: the callers ask again and again */
  static _Atomic int64_t said;
  if (!ok && atomic_exchange(&said, rev) != rev) NEWT_WARN(JOB, "ignoring the end marker %s", newt_errmsg());
  if (ok && out) *out = d;
  return ok;
}

int job_has_failed(rdzv_etcd *c, const char *job, job_failed *out) {
  char key[256];
  rdzv_etcd_kv kv;
  if (job_key(key, sizeof key, job, JOB_REC_FAILED, 0, NULL) != NEWT_OK) return 0;
  if (rdzv_etcd_get(c, key, job_call_deadline(), &kv, NULL) != NEWT_OK) return 0;
  job_failed f;
  int ok = job_failed_from_json(kv.value, kv.value_len, &f) == NEWT_OK;
  if (!ok) NEWT_WARN(JOB, "ignoring %s: %s", key, newt_errmsg());
  else if (out) *out = f;
  rdzv_etcd_kv_free(&kv);
  return ok;
}

/* --- a worker's registration ---------------------------------------------------------------- */

static newt_result_t encode_worker(const void *rec, char **out) { return job_worker_to_json(rec, out); }

static newt_result_t do_register(rdzv_etcd *c, const char *job, const job_worker *w, int64_t host_lease,
                                 const job_host_route *via, int64_t ttl_s, rdzv_etcd_lease_lost_fn lost, void *ud,
                                 newt_deadline_t d, rdzv_registration **out) {
  *out = NULL;
  char key[256], what[160];
  NEWT_CHECK(job_key(key, sizeof key, job, JOB_REC_WORKER, 0, w->id));
  snprintf(what, sizeof what, "worker id %s in job %s", w->id, job);
  rdzv_register_opts o = {.rec = w, .size = sizeof *w, .encode = encode_worker, .host_lease = host_lease,
                          .ttl_s = ttl_s, .lost = lost, .ud = ud, .what = what,
                          .batch = via ? via->batch : NULL, .gateway = via ? via->gateway : NULL};
  return rdzv_register(c, key, &o, d, out);
}

newt_result_t job_register(rdzv_etcd *c, const char *job, const job_worker *w, int64_t ttl_s,
                           rdzv_etcd_lease_lost_fn lost, void *ud, newt_deadline_t d, rdzv_registration **out) {
  return do_register(c, job, w, 0, NULL, ttl_s, lost, ud, d, out);
}

newt_result_t job_register_on(rdzv_etcd *c, const char *job, const job_worker *w, int64_t host_lease, int64_t ttl_s,
                              rdzv_etcd_lease_lost_fn lost, void *ud, newt_deadline_t d, rdzv_registration **out) {
  return job_register_via(c, job, w, host_lease, NULL, ttl_s, lost, ud, d, out);
}

newt_result_t job_register_via(rdzv_etcd *c, const char *job, const job_worker *w, int64_t host_lease,
                               const job_host_route *via, int64_t ttl_s, rdzv_etcd_lease_lost_fn lost, void *ud,
                               newt_deadline_t d, rdzv_registration **out) {
  if (host_lease <= 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "registering %s on a host lease: lease %lld is not one", w->id,
                    (long long)host_lease);
  return do_register(c, job, w, host_lease, via, ttl_s, lost, ud, d, out);
}

/* The registration rewritten (state NULL: the same; ack NULL: the same while the generation
 * is, none when it changes). */
static newt_result_t rewrite(rdzv_registration *r, const char *state, int64_t generation, const char *ack,
                             newt_deadline_t d) {
  job_worker w = *(const job_worker *)rdzv_registration_record(r);
  if (state) snprintf(w.state, sizeof w.state, "%s", state);
  if (ack) {
    if (strlen(ack) >= sizeof w.ack)
      return NEWT_ERR(NEWT_ERR_INVALID, "registration %s: ack of %zu bytes, more than %d", rdzv_registration_key(r),
                      strlen(ack), JOB_ACK_MAX - 1);
    snprintf(w.ack, sizeof w.ack, "%s", ack);
  } else if (generation != w.generation) {
    w.ack[0] = '\0';
  }
  w.generation = generation;
  return rdzv_registration_put(r, &w, d);
}

newt_result_t job_registration_update(rdzv_registration *r, const char *state, int64_t generation, newt_deadline_t d) {
  return rewrite(r, state, generation, NULL, d);
}

newt_result_t job_registration_ack(rdzv_registration *r, const char *state, int64_t generation, const char *ack_json,
                                   newt_deadline_t d) {
  if (!ack_json || !*ack_json)
    return NEWT_ERR(NEWT_ERR_INVALID, "registration %s: an acknowledgement of generation %lld without its ack",
                    rdzv_registration_key(r), (long long)generation);
  return rewrite(r, state, generation, ack_json, d);
}

newt_result_t job_registration_forget(rdzv_etcd *c, const char *job, const char *id, int64_t lease, newt_deadline_t d,
                                      int *deleted) {
  if (deleted) *deleted = 0;
  char key[256];
  if (job_key(key, sizeof key, job, JOB_REC_WORKER, 0, id) != NEWT_OK) return NEWT_OK;
  rdzv_etcd_cmp on = {.key = key, .target = RDZV_CMP_LEASE, .result = RDZV_CMP_EQUAL, .number = lease};
  rdzv_etcd_op del = {.type = RDZV_OP_DELETE, .key = key};
  rdzv_etcd_txn_result tr;
  NEWT_CHECK(rdzv_etcd_txn(c, &on, 1, &del, 1, NULL, 0, d, &tr));
  if (deleted) *deleted = tr.succeeded;
  rdzv_etcd_txn_result_free(&tr);
  return NEWT_OK;
}

/* --- the membership view -------------------------------------------------------------------- */

/* workers/<id> into w: its record, with the id of its key; 0 (logged) when it is not one. */
static int decode_registration(const rdzv_etcd_kv *kv, const char *id, job_worker *w, int quiet) {
  char what[300];
  snprintf(what, sizeof what, "registration %.250s", kv->key);
  if (job_worker_from_json(kv->value, kv->value_len, what, w) != NEWT_OK) {
    if (!quiet) NEWT_WARN(JOB, "ignoring a malformed worker registration: %s", newt_errmsg());
    return 0;
  }
  if (strcmp(w->id, id) != 0) {
    if (!quiet) NEWT_WARN(JOB, "ignoring registration %s: its id is \"%s\"", kv->key, w->id);
    return 0;
  }
  w->lease = kv->lease;
  w->create_revision = kv->create_revision;
  w->mod_revision = kv->mod_revision;
  return 1;
}

static int decode_member(const rdzv_etcd_kv *kv, const char *id, void *member) {
  return decode_registration(kv, id, member, 0);
}

static int member_acked(const void *member, int64_t generation) { return job_worker_acked(member, generation); }

newt_result_t job_members_start(rdzv_etcd *c, const char *job, rdzv_members_fn fn, void *ud, newt_deadline_t d,
                                rdzv_members **out) {
  char prefix[256];
  NEWT_CHECK(job_prefix(prefix, sizeof prefix, job, JOB_REC_WORKER, -1));
  rdzv_members_opts o = {.size = sizeof(job_worker), .decode = decode_member, .counts = member_acked, .fn = fn,
                         .ud = ud};
  return rdzv_members_start(c, prefix, &o, d, out);
}

newt_result_t job_members_get(rdzv_members *m, job_worker **out, size_t *n, int64_t *revision) {
  void *list;
  NEWT_CHECK(rdzv_members_get(m, &list, n, revision));
  *out = list;
  return NEWT_OK;
}

size_t job_members_count_acked(rdzv_members *m, int64_t generation) { return rdzv_members_count_if(m, generation); }

/* --- the generation barrier ----------------------------------------------------------------- */

/* The previous release's acknowledgement: a key of its own, acks/<g>/<id>, holding when. */
typedef struct barrier_ack {
  uint64_t t;
} barrier_ack;
static const codec_field barrier_ack_fields[] = {{CODEC_MS(barrier_ack, t, "t"), CODEC_REQUIRED}};
static const codec_table barrier_ack_table = CODEC_TABLE(barrier_ack, "ack", barrier_ack_fields);

newt_result_t job_barrier_ack(rdzv_etcd *c, const char *job, int64_t generation, const char *id, int64_t lease,
                              newt_deadline_t d) {
  if (generation < 0) return NEWT_ERR(NEWT_ERR_INVALID, "barrier: negative generation %lld", (long long)generation);
  char key[256], *value;
  NEWT_CHECK(job_key(key, sizeof key, job, JOB_REC_ACK, (uint64_t)generation, id));
  barrier_ack a = {.t = newt_wall_ms()};
  NEWT_CHECK(codec_encode(&barrier_ack_table, &a, &value));
  newt_result_t r = rdzv_etcd_put(c, key, value, strlen(value), lease, d, NULL);
  free(value);
  return r;
}

/* A registration counts in the barrier of g when it says it took g up (job_worker_acked). */
static int registration_counts(void *ud, const rdzv_etcd_kv *kv, const char *id) {
  job_worker w;
  return decode_registration(kv, id, &w, 1) && job_worker_acked(&w, *(const int64_t *)ud);
}

newt_result_t job_barrier_wait(rdzv_etcd *c, const char *job, int64_t generation, const char *const *ids, size_t n,
                               newt_deadline_t d, const atomic_int *abort) {
  if (generation < 0) return NEWT_ERR(NEWT_ERR_INVALID, "barrier: negative generation %lld", (long long)generation);
  char regs[256], acks[256], what[160];
  NEWT_CHECK(job_prefix(regs, sizeof regs, job, JOB_REC_WORKER, -1));
  NEWT_CHECK(job_prefix(acks, sizeof acks, job, JOB_REC_ACK, generation));
  snprintf(what, sizeof what, "barrier of job %s generation %lld", job, (long long)generation);
  rdzv_barrier_source src[2] = {{.prefix = regs, .counts = registration_counts, .ud = &generation},
                                {.prefix = acks}};
  return rdzv_barrier_wait(c, src, 2, what, ids, n, d, abort);
}

newt_result_t job_barrier_forget(rdzv_candidate *cand, const char *job, int64_t below, newt_deadline_t d) {
  if (below < 0) return NEWT_ERR(NEWT_ERR_INVALID, "barrier: negative generation %lld", (long long)below);
  char from[256], to[256];
  NEWT_CHECK(job_prefix(from, sizeof from, job, JOB_REC_ACK, -1));
  NEWT_CHECK(job_prefix(to, sizeof to, job, JOB_REC_ACK, below));
  rdzv_etcd_op del = {.type = RDZV_OP_DELETE, .key = from, .range_end = to};
  return rdzv_guarded_txn(cand, NULL, 0, &del, 1, d, NULL);
}

/* --- the coordinators' election ------------------------------------------------------------- */

newt_result_t job_campaign(rdzv_etcd *c, const char *job, const rdzv_campaign_opts *o, newt_deadline_t d,
                           rdzv_candidate **out) {
  *out = NULL;
  char prefix[256];
  NEWT_CHECK(job_prefix(prefix, sizeof prefix, job, JOB_REC_ELECTION, -1));
  job_candidacy me;
  memset(&me, 0, sizeof me);
  snprintf(me.name, sizeof me.name, "%s", o && o->name ? o->name : "coordinator");
  snprintf(me.host, sizeof me.host, "%s", newt_hostname());
  me.pid = getpid();
  char *value = job_candidacy_to_json(&me);
  NEWT_CHECK_ALLOC(value);
  rdzv_campaign_opts co = o ? *o : (rdzv_campaign_opts){0};
  co.value = value;
  newt_result_t r = rdzv_campaign(c, prefix, &co, d, out);
  free(value);
  return r;
}

newt_result_t job_leader_get(rdzv_etcd *c, const char *job, newt_deadline_t d, char *name, size_t cap,
                             int64_t *create_revision) {
  char prefix[256];
  NEWT_CHECK(job_prefix(prefix, sizeof prefix, job, JOB_REC_ELECTION, -1));
  rdzv_etcd_kv kv;
  newt_result_t r = rdzv_leader_get(c, prefix, d, &kv);
  if (r == NEWT_ERR_NOTFOUND) return NEWT_ERR(r, "job %s: no coordinator is running for leader", job);
  NEWT_CHECK(r);
  if (create_revision) *create_revision = kv.create_revision;
  if (name && cap) {
    job_candidacy cd;
    if (job_candidacy_from_json(kv.value, kv.value_len, &cd) == NEWT_OK && cd.name[0]) snprintf(name, cap, "%s", cd.name);
    else snprintf(name, cap, "%s", kv.key);
  }
  rdzv_etcd_kv_free(&kv);
  return NEWT_OK;
}
