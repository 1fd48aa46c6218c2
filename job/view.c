/* One typed picture of a job (see view.h): keys and values decoded into changes, changes
 * taken into the picture. Pure: the reads in etcd that feed it are follow.c's. */
#include "job/view.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/strutil.h"

/* --- one key, decoded ------------------------------------------------------------------------ */

static newt_result_t decode_record(job_change *c, const rdzv_etcd_kv *kv) {
  const char *v = kv->value;
  size_t n = kv->value_len;
  switch (c->rec) {
  case JOB_REC_SPEC: return spec_from_json(v, n, &c->u.spec);
  case JOB_REC_PLAN: return plan_head_from_json(v, n, &c->u.plan); /* a head's shards: shards_from, follow.c */
  case JOB_REC_ELECTION: return job_candidacy_from_json(v, n, &c->u.candidacy);
  case JOB_REC_REPORT: {
    NEWT_CHECK(job_report_from_json(v, n, &c->u.report));
    if (strcmp(c->u.report.worker, c->id) != 0)
      return NEWT_ERR(NEWT_ERR_INVALID, "it is signed by worker %s", c->u.report.worker);
    return NEWT_OK;
  }
  case JOB_REC_ACK: return job_ack_from_json(v, n, &c->u.ack);
  case JOB_REC_PROGRESS: return job_progress_from_json(v, n, &c->u.progress);
  case JOB_REC_DONE: return job_done_from_json(v, n, &c->u.done);
  case JOB_REC_CKPT: return job_ckpt_from_json(v, n, &c->u.ckpt);
  case JOB_REC_EVENT: return job_event_from_json(v, n, &c->u.event);
  case JOB_REC_FAILED: return job_failed_from_json(v, n, &c->u.failed);
  case JOB_REC_FAULT: return job_fault_from_json(v, n, &c->u.fault);
  case JOB_REC_LINKS: return job_links_from_json(v, n, &c->u.links);
  case JOB_REC_WORKER: {
    job_worker *w = &c->u.worker;
    NEWT_CHECK(job_worker_from_json(v, n, "registration", w));
    if (strcmp(w->id, c->id) != 0) return NEWT_ERR(NEWT_ERR_INVALID, "it registers id %s", w->id);
    w->lease = kv->lease;
    w->create_revision = kv->create_revision;
    w->mod_revision = kv->mod_revision;
    return NEWT_OK;
  }
  default: return NEWT_OK;
  }
}

void job_change_decode(const char *prefix, const rdzv_etcd_kv *kv, int deleted, job_change *out) {
  memset(out, 0, sizeof *out);
  out->kv = kv;
  out->deleted = deleted;
  size_t plen = strlen(prefix);
  if (kv->key_len <= plen || strncmp(kv->key, prefix, plen) != 0) return;
  const char *id = NULL;
  out->rec = job_key_parse(kv->key + plen, &out->generation, &id);
  if (id) snprintf(out->id, sizeof out->id, "%s", id);
  if (deleted || out->rec == JOB_REC_OTHER) return;
  if (decode_record(out, kv) == NEWT_OK) return;
  job_change_refuse(out);
}

void job_change_refuse(job_change *c) {
  /* what was read so far is released: the record never reaches a caller */
  char key[256];
  snprintf(c->why, sizeof c->why, "%s: %s", newt_str_printable(key, sizeof key, c->kv->key), newt_errmsg());
  job_change_free(c);
  c->rec = JOB_REC_OTHER;
  c->refused = 1;
}

/* A plan head's shards taken from the same read (a whole read holds every key of the job); the
 * change is refused, naming the shard, when one is missing or is not the one the head names. */
static void shards_from(const char *prefix, const rdzv_etcd_kvs *all, job_change *ch) {
  if (ch->rec != JOB_REC_PLAN || !plan_is_partial(&ch->u.plan)) return;
  size_t plen = strlen(prefix);
  newt_result_t r = NEWT_OK;
  for (size_t i = 0; i < all->n && r == NEWT_OK; i++) {
    const rdzv_etcd_kv *kv = &all->kvs[i];
    uint64_t g = 0;
    const char *id = NULL;
    if (kv->key_len <= plen || strncmp(kv->key, prefix, plen) != 0 ||
        job_key_parse(kv->key + plen, &g, &id) != JOB_REC_PLAN_SHARD || g != ch->u.plan.generation)
      continue;
    char *end;
    long k = strtol(id, &end, 10);
    if (*end == '\0' && k >= 0 && k < ch->u.plan.nshards && !ch->u.plan.shards[k].added)
      r = plan_shard_add(&ch->u.plan, (int)k, kv->value, kv->value_len);
  }
  if (r == NEWT_OK) r = plan_shards_done(&ch->u.plan);
  if (r != NEWT_OK) job_change_refuse(ch);
}

void job_change_free(job_change *c) {
  if (c->deleted) return;
  if (c->rec == JOB_REC_EVENT) job_event_free(&c->u.event);
  if (c->rec == JOB_REC_PLAN) plan_free(&c->u.plan);
  c->rec = JOB_REC_OTHER;
}

newt_result_t job_change_expect(const char *job, const rdzv_etcd_kv *kv, job_record rec, job_change *out) {
  char prefix[256];
  memset(out, 0, sizeof *out);
  NEWT_CHECK(job_prefix(prefix, sizeof prefix, job, JOB_REC_OTHER, -1));
  job_change_decode(prefix, kv, 0, out);
  if (out->rec == rec) return NEWT_OK;
  job_change_free(out);
  if (out->refused) return NEWT_ERR(NEWT_ERR_INVALID, "%s", out->why);
  char key[256];
  return NEWT_ERR(NEWT_ERR_INVALID, "%s: not the record expected there", newt_str_printable(key, sizeof key, kv->key));
}

/* --- the picture ------------------------------------------------------------------------------ */

#define VIEW_KEY_MAX 160

/* The view's bookkeeping beside the picture: the key of each event (a deletion names it) and
 * every candidacy (the leader is the oldest). */
struct job_view_keys {
  char **events; /* beside v->events, malloc'd */
  struct candidate {
    char key[VIEW_KEY_MAX];
    int64_t create_revision;
    job_candidacy c;
  } *cands;
  int ncands;
};

/* Grows an array of n elements of size sz to hold one more. */
static int grow(void *arrp, int n, size_t sz) {
  void **arr = arrp;
  if (n & (n - 1) && n > 0) return 1; /* capacity: powers of two from 1 */
  void *p = realloc(*arr, (size_t)(n ? 2 * n : 1) * sz);
  if (!p) return 0;
  *arr = p;
  return 1;
}

static int key_is(const rdzv_etcd_kv *kv, const char *key) {
  return kv->key_len == strlen(key) && memcmp(kv->key, key, kv->key_len) == 0;
}

/* The registrations are kept in id order: where id is, or would go, by binary search (a
 * snapshot's keys come in order, each appended: 100,000 registrations are taken in n log n,
 * where a scan for each made `newt status` n^2). */
static int worker_at(const job_view *v, const char *id) {
  if (!v->nworkers || strcmp(v->workers[v->nworkers - 1].id, id) < 0) return v->nworkers; /* the last: appended */
  int lo = 0, hi = v->nworkers;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (strcmp(v->workers[mid].id, id) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static void put_worker(job_view *v, const job_change *c) {
  int i = worker_at(v, c->id);
  if (i < v->nworkers && strcmp(v->workers[i].id, c->id) == 0) {
    if (c->deleted) memmove(&v->workers[i], &v->workers[i + 1], (size_t)(--v->nworkers - i) * sizeof *v->workers);
    else v->workers[i] = c->u.worker;
    return;
  }
  if (c->deleted || !grow(&v->workers, v->nworkers, sizeof *v->workers)) return;
  memmove(&v->workers[i + 1], &v->workers[i], (size_t)(v->nworkers++ - i) * sizeof *v->workers);
  v->workers[i] = c->u.worker;
}

/* kv's key against a key of the view, as strcmp orders them. */
static int key_cmp(const rdzv_etcd_kv *kv, const char *key) {
  size_t n = strlen(key), m = kv->key_len < n ? kv->key_len : n;
  int c = memcmp(kv->key, key, m);
  return c ? c : (kv->key_len > n) - (kv->key_len < n);
}

/* The events are kept in key order (their keys start with the time): where kv's key is, or
 * would go, by binary search. A snapshot's keys come in order, each one appended: the 40,000
 * events of a long job are taken in n log n (a scan of every key per event made it n^2, 5 s
 * for `newt status`). One that comes out of order moves pointers, not events. *found: the
 * key is there already. */
static int event_at(const job_view *v, const struct job_view_keys *k, const rdzv_etcd_kv *kv, int *found) {
  *found = 0;
  if (!v->nevents || key_cmp(kv, k->events[v->nevents - 1]) > 0) return v->nevents; /* the newest: appended */
  int lo = 0, hi = v->nevents;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2, c = key_cmp(kv, k->events[mid]);
    if (c == 0) return *found = 1, mid;
    if (c < 0) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

static void put_event(job_view *v, struct job_view_keys *k, const job_change *c) {
  int found, i = event_at(v, k, c->kv, &found);
  if (found) {
    if (!c->deleted) return; /* an event is written once */
    job_event_free(v->events[i]);
    free(v->events[i]);
    free(k->events[i]);
    memmove(&v->events[i], &v->events[i + 1], (size_t)(v->nevents - i - 1) * sizeof *v->events);
    memmove(&k->events[i], &k->events[i + 1], (size_t)(v->nevents - i - 1) * sizeof *k->events);
    v->nevents--;
    return;
  }
  if (c->deleted || c->kv->key_len >= VIEW_KEY_MAX) return;
  if (!grow(&v->events, v->nevents, sizeof *v->events) || !grow(&k->events, v->nevents, sizeof *k->events)) return;
  job_event *e = malloc(sizeof *e);
  char *key = malloc(c->kv->key_len + 1);
  if (!e || !key || job_event_copy(e, &c->u.event) != NEWT_OK) {
    free(e);
    free(key);
    return;
  }
  memcpy(key, c->kv->key, c->kv->key_len);
  key[c->kv->key_len] = '\0';
  memmove(&v->events[i + 1], &v->events[i], (size_t)(v->nevents - i) * sizeof *v->events); /* an older key: its place */
  memmove(&k->events[i + 1], &k->events[i], (size_t)(v->nevents - i) * sizeof *k->events);
  v->events[i] = e;
  k->events[i] = key;
  v->nevents++;
}

static void put_fault(job_view *v, const job_change *c) {
  int i = 0;
  while (i < v->nfaults && (uint64_t)v->faults[i].generation < c->generation) i++;
  int same = i < v->nfaults && (uint64_t)v->faults[i].generation == c->generation;
  if (same && c->deleted) memmove(&v->faults[i], &v->faults[i + 1], (size_t)(--v->nfaults - i) * sizeof *v->faults);
  else if (same) v->faults[i] = c->u.fault;
  else if (!c->deleted && grow(&v->faults, v->nfaults, sizeof *v->faults)) {
    memmove(&v->faults[i + 1], &v->faults[i], (size_t)(v->nfaults++ - i) * sizeof *v->faults);
    v->faults[i] = c->u.fault;
  }
}

static void find_leader(job_view *v, const struct job_view_keys *k) {
  v->leader_rev = 0;
  memset(&v->leader, 0, sizeof v->leader);
  for (int i = 0; i < k->ncands; i++)
    if (!v->leader_rev || k->cands[i].create_revision < v->leader_rev) {
      v->leader_rev = k->cands[i].create_revision;
      v->leader = k->cands[i].c;
    }
}

static void put_candidacy(job_view *v, struct job_view_keys *k, const job_change *c) {
  int i = 0;
  while (i < k->ncands && !key_is(c->kv, k->cands[i].key)) i++;
  if (c->deleted) {
    if (i < k->ncands) k->cands[i] = k->cands[--k->ncands];
  } else if (i < k->ncands || (c->kv->key_len < VIEW_KEY_MAX && grow(&k->cands, k->ncands, sizeof *k->cands))) {
    if (i == k->ncands) k->ncands++;
    snprintf(k->cands[i].key, VIEW_KEY_MAX, "%.*s", (int)c->kv->key_len, c->kv->key);
    k->cands[i].create_revision = c->kv->create_revision;
    k->cands[i].c = c->u.candidacy;
  }
  find_leader(v, k);
}

static void put_plan(job_view *v, const job_change *c) {
  newt_plan p;
  if (c->deleted) {
    plan_free(&v->plan);
    memset(&v->plan, 0, sizeof v->plan);
  } else if (plan_copy(&p, &c->u.plan) == NEWT_OK) {
    plan_free(&v->plan);
    v->plan = p;
  }
}

/* A record of a key of its own: its newest value, or none once deleted. */
static void put_single(int *has, void *dst, const void *src, size_t size, int deleted) {
  *has = !deleted;
  if (!deleted) memcpy(dst, src, size);
}

void job_view_apply(job_view *v, const job_change *c) {
  if (c->kv && c->kv->mod_revision > v->revision) v->revision = c->kv->mod_revision;
  if (c->refused) v->nrefused++;
  if (!v->keys && !(v->keys = calloc(1, sizeof *v->keys))) return;
  int del = c->deleted;
  switch (c->rec) {
  case JOB_REC_SPEC: put_single(&v->has_spec, &v->spec, &c->u.spec, sizeof v->spec, del); break;
  case JOB_REC_PLAN: put_plan(v, c); break;
  case JOB_REC_WORKER: put_worker(v, c); break;
  case JOB_REC_ELECTION: put_candidacy(v, v->keys, c); break;
  case JOB_REC_PROGRESS: put_single(&v->has_progress, &v->progress, &c->u.progress, sizeof v->progress, del); break;
  case JOB_REC_DONE: put_single(&v->has_done, &v->done, &c->u.done, sizeof v->done, del); break;
  case JOB_REC_FAILED: put_single(&v->has_failed, &v->failed, &c->u.failed, sizeof v->failed, del); break;
  case JOB_REC_CKPT: put_single(&v->has_ckpt, &v->ckpt, &c->u.ckpt, sizeof v->ckpt, del); break;
  case JOB_REC_EVENT: put_event(v, v->keys, c); break;
  case JOB_REC_FAULT: put_fault(v, c); break;
  default: break; /* reports, acks and links are the leader's alone: it keeps them as it judges them */
  }
}

const job_worker *job_view_worker(const job_view *v, const char *id) {
  for (int i = 0; i < v->nworkers; i++)
    if (strcmp(v->workers[i].id, id) == 0) return &v->workers[i];
  return NULL;
}

void job_view_free(job_view *v) {
  plan_free(&v->plan);
  free(v->workers);
  for (int i = 0; i < v->nevents; i++) {
    job_event_free(v->events[i]);
    free(v->events[i]);
    if (v->keys) free(v->keys->events[i]);
  }
  free(v->events);
  free(v->faults);
  if (v->keys) {
    free(v->keys->events);
    free(v->keys->cands);
    free(v->keys);
  }
  memset(v, 0, sizeof *v);
}

/* --- reading it whole -------------------------------------------------------------------------- */

/* The order a resync batch comes in: the spec, the plan, the progress, the registrations, the
 * rest (a stable sort: key order within each). */
static int rank_of(const job_change *c) {
  switch (c->rec) {
  case JOB_REC_SPEC: return 0;
  case JOB_REC_PLAN: return 1;
  case JOB_REC_PROGRESS: return 2;
  case JOB_REC_WORKER: return 3;
  default: return 4;
  }
}

/* A key's place in a resync batch, from the key alone (a record its codec refuses keeps the
 * place of its key), so that the changes are decoded straight into their order. */
static int pass_of(const char *prefix, size_t plen, const rdzv_etcd_kv *kv) {
  if (kv->key_len <= plen || strncmp(kv->key, prefix, plen) != 0) return 4;
  uint64_t generation;
  const char *id;
  job_change c = {.rec = job_key_parse(kv->key + plen, &generation, &id)};
  return rank_of(&c);
}

newt_result_t job_changes_decode(const char *prefix, const rdzv_etcd_kvs *all, job_change **out) {
  *out = calloc(all->n ? all->n : 1, sizeof **out);
  if (!*out) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for the %zu keys of the job", all->n);
  size_t k = 0, plen = strlen(prefix);
  for (int pass = 0; pass <= 4; pass++)
    for (size_t i = 0; i < all->n; i++)
      if (pass_of(prefix, plen, &all->kvs[i]) == pass) {
        job_change_decode(prefix, &all->kvs[i], 0, &(*out)[k]);
        shards_from(prefix, all, &(*out)[k++]);
      }
  return NEWT_OK;
}

void job_changes_free(job_change *chs, size_t n) {
  for (size_t i = 0; chs && i < n; i++) job_change_free(&chs[i]);
  free(chs);
}

void job_view_take(job_view *out, const char *prefix, const rdzv_etcd_kvs *all,
                   void (*warn)(void *ud, const job_change *ch), void *ud) {
  /* one change at a time, in resync order: the view keeps what it needs of each */
  size_t plen = strlen(prefix);
  for (int pass = 0; pass <= 4; pass++)
    for (size_t i = 0; i < all->n; i++) {
      if (pass_of(prefix, plen, &all->kvs[i]) != pass) continue;
      job_change ch;
      job_change_decode(prefix, &all->kvs[i], 0, &ch);
      shards_from(prefix, all, &ch);
      if (ch.refused && warn) warn(ud, &ch);
      job_view_apply(out, &ch);
      job_change_free(&ch);
    }
  out->revision = all->revision;
}
