/* The rendezvous protocols other than election (rdzv_elect.c): names and keys, registration
 * of a key on a lease, the membership view of a prefix, the barrier. Every key and value is
 * the caller's (rdzv.h); docs/rendezvous.md gives the guarantees.
 *
 * The membership view and the barrier share one pattern: read the whole prefix once
 * (one range, at revision R), then watch it from R + 1. etcd orders every change by
 * revision, so the snapshot plus the watch sees each change exactly once; the watch layer
 * resumes after reconnects and turns a compacted history into a RESYNC snapshot. */
#include "rendezvous/rdzv.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/name.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "rendezvous/etcd_internal.h"
#include "rendezvous/gateway.h"

/* Sleeps on cv until pred holds, d passes or *abort is set: 0, NEWT_ERR_TIMEOUT, ABORTED.
 * Called with mu held. */
static newt_result_t cond_wait_slice(pthread_cond_t *cv, pthread_mutex_t *mu, newt_deadline_t d,
                                     const atomic_int *abort) {
  if (abort && atomic_load(abort)) return NEWT_ERR_ABORTED;
  if (newt_deadline_passed(d)) return NEWT_ERR_TIMEOUT;
  uint64_t until = newt_now_ns() + 50000000ull; /* 50 ms: abort flags are polled */
  if (d != NEWT_DEADLINE_NONE && d < until) until = d;
  struct timespec ts = {(time_t)(until / 1000000000ull), (long)(until % 1000000000ull)};
  pthread_cond_timedwait(cv, mu, &ts);
  return NEWT_OK;
}


/* --- registrations ------------------------------------------------------------------------ */

struct rdzv_registration {
  rdzv_etcd *c;
  char key[256];
  char what[200];      /* the holder, for messages */
  void *rec;           /* the caller's record as last written (size bytes) */
  size_t size;
  rdzv_encode_fn encode;
  _Atomic int64_t lease;
  int kept;
  int64_t ttl_s;
  rdzv_etcd_lease_lost_fn lost;
  void *ud;
  int64_t host_lease; /* the host's lease it was handed (0: none, or it went) */
  int shared;         /* 1: the registration is on host_lease, not a lease of its own */
  rdzv_batch *batch;  /* the host's transactions go through one of these (rdzv_register_opts) */
  rdzv_gateway_client *gateway;
};

/* A transaction on the registration's key: while it is on the host's lease, through the
 * host's batch or gateway (a gateway that cannot be reached: straight to etcd), else straight
 * to etcd. */
static newt_result_t reg_txn(rdzv_registration *r, int64_t lease, const rdzv_etcd_cmp *cmp, size_t ncmp,
                             const rdzv_etcd_op *ops, size_t nops, const rdzv_etcd_op *fail, size_t nfail,
                             newt_deadline_t d, rdzv_etcd_txn_result *out) {
  int hosts = lease != 0 && lease == r->host_lease;
  if (hosts && r->batch) return rdzv_batch_txn(r->batch, cmp, ncmp, ops, nops, fail, nfail, d, out);
  if (hosts && r->gateway) {
    int unreached = 0;
    newt_result_t res = rdzv_gateway_txn(r->gateway, cmp, ncmp, ops, nops, fail, nfail, d, out, &unreached);
    if (!unreached) return res;
  }
  return rdzv_etcd_txn(r->c, cmp, ncmp, ops, nops, fail, nfail, d, out);
}

/* Deletes the registration while it is on this lease (never another's). */
static newt_result_t delete_own_key(rdzv_registration *r, newt_deadline_t d) {
  rdzv_etcd_cmp cmp = {.key = r->key, .target = RDZV_CMP_LEASE, .result = RDZV_CMP_EQUAL, .number = r->lease};
  rdzv_etcd_op del = {.type = RDZV_OP_DELETE, .key = r->key};
  return reg_txn(r, r->lease, &cmp, 1, &del, 1, NULL, 0, d, NULL);
}

/* Keeps the registration's lease alive: its own always; the host's unless this client keeps
 * it already (another registration on it, perhaps one claiming it at this moment). */
static newt_result_t keep_lease(rdzv_registration *r, int64_t lease) {
  if (r->shared && rdzv_etcd_lease_lost(r->c, lease, NULL, 0) >= 0) return NEWT_OK;
  newt_result_t res = rdzv_etcd_lease_keep(r->c, lease, r->ttl_s, r->lost, r->ud);
  if (res != NEWT_OK && r->shared && rdzv_etcd_lease_lost(r->c, lease, NULL, 0) >= 0) return NEWT_OK;
  r->kept = res == NEWT_OK;
  return res;
}

/* Writes the registration on a lease if the id is free, and keeps the lease alive: the host's
 * lease when it has one (no grant: one write; kept alive here too, so that its loss is
 * reported here, unless this client keeps it already), else a lease of its own. A host lease
 * etcd no longer has is given up for a lease of its own. */
static newt_result_t claim(rdzv_registration *r, newt_deadline_t d) {
  char *value = NULL;
  int64_t lease = r->host_lease;
  int own = lease == 0;
  newt_result_t res;
  NEWT_CHECK(r->encode(r->rec, &value));
  if (own) NEWT_CHECK_GOTO(rdzv_etcd_lease_grant(r->c, r->ttl_s, 0, d, &lease, NULL), res, fail);
  rdzv_etcd_cmp cmp = {.key = r->key, .target = RDZV_CMP_CREATE, .result = RDZV_CMP_EQUAL, .number = 0};
  rdzv_etcd_op put = {.type = RDZV_OP_PUT, .key = r->key, .value = value, .value_len = strlen(value), .lease = lease};
  rdzv_etcd_op get = {.type = RDZV_OP_RANGE, .key = r->key};
  rdzv_etcd_txn_result tr;
  res = reg_txn(r, lease, &cmp, 1, &put, 1, &get, 1, d, &tr);
  if (res == NEWT_ERR_NOTFOUND && !own) { /* the host's lease is gone: one of our own */
    NEWT_INFO(RDZV, "%s: host lease %llx is gone; registering on a lease of its own", r->key, (unsigned long long)lease);
    free(value);
    r->host_lease = 0;
    return claim(r, d);
  }
  if (res != NEWT_OK) goto fail_lease;
  if (!tr.succeeded) {
    int64_t other = tr.n && tr.results[0].range.n ? tr.results[0].range.kvs[0].lease : 0;
    rdzv_etcd_txn_result_free(&tr);
    res = NEWT_ERR(NEWT_ERR_CONFLICT, "%s is already registered (%s, lease %llx): another holder uses it, or its "
                   "previous run's lease has not expired yet", r->what, r->key, (unsigned long long)other);
    goto fail_lease;
  }
  rdzv_etcd_txn_result_free(&tr);
  r->shared = !own;
  r->kept = 0;
  r->lease = lease;
  res = keep_lease(r, lease);
  if (res != NEWT_OK) {
    if (!own) delete_own_key(r, newt_deadline_in_ms(1000)); /* not registered after all */
    goto fail_lease;
  }
  free(value);
  return NEWT_OK;
fail_lease:
  if (own) rdzv_etcd_lease_revoke(r->c, lease, newt_deadline_in_ms(1000)); /* never the host's */
fail:
  free(value);
  return res;
}

newt_result_t rdzv_register(rdzv_etcd *c, const char *key, const rdzv_register_opts *o, newt_deadline_t d,
                            rdzv_registration **out) {
  *out = NULL;
  rdzv_registration *r = calloc(1, sizeof *r);
  NEWT_CHECK_ALLOC(r);
  r->rec = malloc(o->size ? o->size : 1);
  if (!r->rec) {
    free(r);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory registering %s", key);
  }
  memcpy(r->rec, o->rec, o->size);
  r->size = o->size;
  r->encode = o->encode;
  r->c = c;
  r->ttl_s = o->ttl_s;
  r->lost = o->lost;
  r->ud = o->ud;
  r->host_lease = o->host_lease;
  r->batch = o->batch;
  r->gateway = o->gateway;
  snprintf(r->what, sizeof r->what, "%s", o->what ? o->what : key);
  newt_result_t res = NEWT_OK;
  if (strlen(key) >= sizeof r->key) res = NEWT_ERR(NEWT_ERR_INVALID, "registration key %.80s...: too long", key);
  snprintf(r->key, sizeof r->key, "%s", key);
  if (res == NEWT_OK) res = claim(r, d);
  if (res != NEWT_OK) {
    free(r->rec);
    free(r);
    return res;
  }
  *out = r;
  return NEWT_OK;
}

int rdzv_registration_shared(const rdzv_registration *r) { return r->shared; }

newt_result_t rdzv_registration_renew(rdzv_registration *r, newt_deadline_t d) {
  int64_t lease = r->lease, ttl = 0;
  newt_result_t res = rdzv_etcd_lease_keepalive_once(r->c, lease, d, &ttl);
  if (res != NEWT_OK && res != NEWT_ERR_NOTFOUND) return res;
  if (res == NEWT_OK) {
    rdzv_etcd_kv kv;
    res = rdzv_etcd_get(r->c, r->key, d, &kv, NULL);
    if (res != NEWT_OK && res != NEWT_ERR_NOTFOUND) return res;
    int ours = res == NEWT_OK && kv.lease == lease;
    if (res == NEWT_OK) rdzv_etcd_kv_free(&kv);
    if (ours) {
      /* etcd kept the lease (it extends every lease when it restarts): keep it again */
      if (r->kept) rdzv_etcd_lease_unkeep(r->c, lease);
      r->kept = 0;
      return keep_lease(r, lease);
    }
    /* the lease lives, our key on it does not (deleted: fenced, or taken for dead by the
       host's agent): a lease of our own goes; the host's stays for the others, and the
       registration is written on it again */
    if (!r->shared) rdzv_etcd_lease_revoke(r->c, lease, d);
  } else if (r->shared) {
    r->host_lease = 0; /* the host's lease went: one of our own from now on */
  }
  if (r->kept) rdzv_etcd_lease_unkeep(r->c, lease);
  r->kept = 0;
  return claim(r, d);
}

newt_result_t rdzv_registration_put(rdzv_registration *r, const void *rec, newt_deadline_t d) {
  char *value;
  NEWT_CHECK(r->encode(rec, &value));
  rdzv_etcd_cmp cmp = {.key = r->key, .target = RDZV_CMP_LEASE, .result = RDZV_CMP_EQUAL, .number = r->lease};
  rdzv_etcd_op put = {.type = RDZV_OP_PUT, .key = r->key, .value = value, .value_len = strlen(value), .lease = r->lease};
  rdzv_etcd_txn_result tr;
  newt_result_t res = reg_txn(r, r->lease, &cmp, 1, &put, 1, NULL, 0, d, &tr);
  free(value);
  NEWT_CHECK(res);
  int ok = tr.succeeded;
  rdzv_etcd_txn_result_free(&tr);
  if (!ok)
    return NEWT_ERR(NEWT_ERR_CONFLICT, "registration %s is no longer ours: lease %llx was lost", r->key,
                    (unsigned long long)r->lease);
  if (rec != r->rec) memcpy(r->rec, rec, r->size);
  return NEWT_OK;
}

const void *rdzv_registration_record(const rdzv_registration *r) { return r->rec; }
const char *rdzv_registration_key(const rdzv_registration *r) { return r->key; }

int64_t rdzv_registration_lease(const rdzv_registration *r) { return r->lease; }

int rdzv_registration_lost(rdzv_registration *r, char *why, size_t cap) {
  return rdzv_etcd_lease_lost(r->c, r->lease, why, cap) == 1;
}

newt_result_t rdzv_registration_leave(rdzv_registration *r, newt_deadline_t d) {
  if (r->kept) rdzv_etcd_lease_unkeep(r->c, r->lease);
  r->kept = 0;
  /* on the host's lease: only our key goes (the lease is the other workers' too) */
  newt_result_t res = r->shared ? delete_own_key(r, d) : rdzv_etcd_lease_revoke(r->c, r->lease, d);
  return res == NEWT_ERR_NOTFOUND ? NEWT_OK : res; /* already gone: left anyway */
}

void rdzv_registration_free(rdzv_registration *r) {
  if (!r) return;
  if (r->kept) rdzv_etcd_lease_unkeep(r->c, r->lease);
  free(r->rec);
  free(r);
}

/* --- membership view ------------------------------------------------------------------------- */

/* A member in the view: its id (the key's last part) and what the caller's decoder made of its
 * value, in one slot of slot_size bytes. */
typedef struct slot_head {
  char id[RDZV_NAME_MAX];
  int64_t mod_revision; /* of its key */
} slot_head;

struct rdzv_members {
  rdzv_etcd *c;
  char prefix[256];
  size_t prefix_len;
  rdzv_members_opts o;
  size_t slot_size;        /* a slot_head, then the member (o.size), aligned */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  unsigned char *w;        /* n slots, sorted by id */
  size_t n, cap;
  int64_t revision;        /* the view is current at this revision */
  int64_t change_revision; /* revision of the last change */
  int asked;               /* count_arg was asked for (counted holds its count) */
  int64_t count_arg;
  size_t counted;          /* members counting for count_arg, kept up to date per change */
  rdzv_etcd_watch *watch;
};

static slot_head *slot(const rdzv_members *m, unsigned char *base, size_t i) {
  return (slot_head *)(base + i * m->slot_size);
}
static void *member_of(slot_head *h) { return (unsigned char *)h + sizeof *h; }

/* Whether the member of slot h counts for the arg asked for (0 until one was asked). */
static size_t counts(const rdzv_members *m, slot_head *h) {
  return m->asked && m->o.counts && m->o.counts(member_of(h), m->count_arg) ? 1 : 0;
}

static int cmp_id(const void *a, const void *b) { return strcmp(((const slot_head *)a)->id, ((const slot_head *)b)->id); }

/* Index of id, or -(insertion point) - 1. */
static long find_member(const rdzv_members *m, const char *id) {
  size_t lo = 0, hi = m->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int c = strcmp(slot(m, m->w, mid)->id, id);
    if (c == 0) return (long)mid;
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return -(long)lo - 1;
}

/* Decodes prefix<id> into slot h; 0 when it is not a member (no id of one level, or the
 * caller's decoder refused it). */
static int decode_member(const rdzv_members *m, const rdzv_etcd_kv *kv, slot_head *h) {
  if (kv->key_len <= m->prefix_len || strchr(kv->key + m->prefix_len, '/')) return 0;
  const char *id = kv->key + m->prefix_len;
  if (strlen(id) >= sizeof h->id) return 0;
  memset(h, 0, m->slot_size);
  snprintf(h->id, sizeof h->id, "%s", id);
  h->mod_revision = kv->mod_revision;
  return m->o.decode(kv, id, member_of(h));
}

/* Changes to hand to the callback once the lock is dropped: the events and a copy of each
 * member's slot. */
typedef struct change_list {
  rdzv_member_event *ev;
  unsigned char *w;
  size_t n, cap;
} change_list;

static void note(const rdzv_members *m, change_list *cl, rdzv_member_change ch, int64_t rev, slot_head *h) {
  if (cl->n == cl->cap) {
    size_t cap = cl->cap ? cl->cap * 2 : 8;
    rdzv_member_event *ev = realloc(cl->ev, cap * sizeof *ev);
    if (ev) cl->ev = ev;
    unsigned char *ws = realloc(cl->w, cap * m->slot_size);
    if (ws) cl->w = ws;
    if (!ev || !ws) {
      NEWT_ERROR(RDZV, "out of memory noting a membership change");
      return;
    }
    cl->cap = cap;
  }
  cl->ev[cl->n] = (rdzv_member_event){.change = ch, .revision = rev};
  if (h) memcpy(slot(m, cl->w, cl->n), h, m->slot_size);
  else memset(slot(m, cl->w, cl->n), 0, m->slot_size);
  cl->n++;
}

static void deliver_changes(rdzv_members *m, change_list *cl) {
  for (size_t i = 0; i < cl->n; i++) {
    slot_head *h = slot(m, cl->w, i);
    int resync = cl->ev[i].change == RDZV_MEMBER_RESYNC;
    cl->ev[i].id = resync ? NULL : h->id;
    cl->ev[i].value = resync ? NULL : member_of(h);
    if (m->o.fn) m->o.fn(m->o.ud, &cl->ev[i]);
  }
  free(cl->ev);
  free(cl->w);
}

static int insert_member(rdzv_members *m, size_t at, slot_head *h) {
  if (m->n == m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 16;
    unsigned char *p = realloc(m->w, cap * m->slot_size);
    if (!p) return 0;
    m->w = p;
    m->cap = cap;
  }
  memmove(slot(m, m->w, at + 1), slot(m, m->w, at), (m->n - at) * m->slot_size);
  memcpy(slot(m, m->w, at), h, m->slot_size);
  m->n++;
  return 1;
}

static void remove_member(rdzv_members *m, size_t at) {
  memmove(slot(m, m->w, at), slot(m, m->w, at + 1), (m->n - at - 1) * m->slot_size);
  m->n--;
}

/* Applies one PUT / DELETE (under mu); h is scratch of one slot. */
static void apply_event(rdzv_members *m, const rdzv_etcd_event *e, change_list *cl, slot_head *h) {
  if (e->kv.key_len <= m->prefix_len) return;
  long at = find_member(m, e->kv.key + m->prefix_len);
  if (e->type == RDZV_EVENT_DELETE) {
    if (at >= 0) {
      note(m, cl, RDZV_MEMBER_LEAVE, e->kv.mod_revision, slot(m, m->w, (size_t)at));
      m->counted -= counts(m, slot(m, m->w, (size_t)at));
      remove_member(m, (size_t)at);
    }
    return;
  }
  if (!decode_member(m, &e->kv, h)) return;
  if (at >= 0) {
    m->counted -= counts(m, slot(m, m->w, (size_t)at));
    m->counted += counts(m, h);
    memcpy(slot(m, m->w, (size_t)at), h, m->slot_size);
    note(m, cl, RDZV_MEMBER_UPDATE, e->kv.mod_revision, h);
  } else if (insert_member(m, (size_t)(-at - 1), h)) {
    m->counted += counts(m, h);
    note(m, cl, RDZV_MEMBER_JOIN, e->kv.mod_revision, h);
  }
}

/* Replaces the table with kvs (a full read at rev), noting the difference. */
static void apply_snapshot(rdzv_members *m, const rdzv_etcd_kv *kvs, size_t n, int64_t rev, change_list *cl) {
  unsigned char *fresh = calloc(n ? n : 1, m->slot_size);
  if (!fresh) {
    NEWT_ERROR(RDZV, "out of memory re-reading %s", m->prefix);
    return;
  }
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (decode_member(m, &kvs[i], slot(m, fresh, k))) k++;
  qsort(fresh, k, m->slot_size, cmp_id);
  size_t i = 0, j = 0;
  while (i < m->n || j < k) {
    slot_head *a = i < m->n ? slot(m, m->w, i) : NULL, *b = j < k ? slot(m, fresh, j) : NULL;
    int c = !a ? 1 : !b ? -1 : strcmp(a->id, b->id);
    if (c < 0) note(m, cl, RDZV_MEMBER_LEAVE, rev, a), i++;
    else if (c > 0) note(m, cl, RDZV_MEMBER_JOIN, rev, b), j++;
    else {
      if (a->mod_revision != b->mod_revision) note(m, cl, RDZV_MEMBER_UPDATE, rev, b);
      i++, j++;
    }
  }
  free(m->w);
  m->w = fresh;
  m->n = k;
  m->cap = n ? n : 1;
  m->counted = 0;
  for (size_t a = 0; a < k; a++) m->counted += counts(m, slot(m, m->w, a));
}

static void on_members_watch(void *ud, const rdzv_etcd_watch_resp *r) {
  rdzv_members *m = ud;
  change_list cl = {0};
  slot_head *scratch = malloc(m->slot_size);
  if (!scratch) {
    NEWT_ERROR(RDZV, "out of memory applying a change of %s", m->prefix);
    return;
  }
  pthread_mutex_lock(&m->mu);
  switch (r->kind) {
    case RDZV_WATCH_EVENTS:
      for (size_t i = 0; i < r->n_events; i++) apply_event(m, &r->events[i], &cl, scratch);
      break;
    case RDZV_WATCH_RESYNC:
      NEWT_INFO(RDZV, "members %s: history compacted, re-read at revision %lld", m->prefix, (long long)r->revision);
      note(m, &cl, RDZV_MEMBER_RESYNC, r->revision, NULL);
      apply_snapshot(m, r->kvs, r->n_kvs, r->revision, &cl);
      break;
    default: break;
  }
  if (r->kind != RDZV_WATCH_ERROR && r->revision > m->revision) m->revision = r->revision;
  if (cl.n) {
    m->change_revision = cl.ev[cl.n - 1].revision;
    pthread_cond_broadcast(&m->cv);
  }
  pthread_mutex_unlock(&m->mu);
  free(scratch);
  deliver_changes(m, &cl);
}

newt_result_t rdzv_members_start(rdzv_etcd *c, const char *prefix, const rdzv_members_opts *o, newt_deadline_t d,
                                 rdzv_members **out) {
  *out = NULL;
  if (strlen(prefix) >= sizeof ((rdzv_members *)0)->prefix)
    return NEWT_ERR(NEWT_ERR_INVALID, "membership view of %.80s...: prefix too long", prefix);
  rdzv_members *m = calloc(1, sizeof *m);
  NEWT_CHECK_ALLOC(m);
  m->c = c;
  m->o = *o;
  m->slot_size = (sizeof(slot_head) + o->size + 7) / 8 * 8;
  snprintf(m->prefix, sizeof m->prefix, "%s", prefix);
  m->prefix_len = strlen(m->prefix);
  pthread_mutex_init(&m->mu, NULL);
  rdzv_cond_init(&m->cv);
  rdzv_etcd_kvs snap = {0};
  rdzv_etcd_range_opts ro = {.prefix = 1};
  newt_result_t r = rdzv_etcd_range(c, m->prefix, &ro, d, &snap);
  if (r != NEWT_OK) {
    rdzv_members_free(m);
    return r;
  }
  change_list cl = {0};
  apply_snapshot(m, snap.kvs, snap.n, snap.revision, &cl);
  /* the snapshot's members join at their own revisions */
  for (size_t i = 0; i < cl.n; i++) cl.ev[i].revision = slot(m, cl.w, i)->mod_revision;
  m->revision = m->change_revision = snap.revision;
  rdzv_etcd_kvs_free(&snap);
  deliver_changes(m, &cl);
  rdzv_etcd_watch_opts wo = {.prefix = 1, .start_revision = m->revision + 1};
  r = rdzv_etcd_watch_start(c, m->prefix, &wo, on_members_watch, m, d, &m->watch);
  if (r != NEWT_OK) {
    rdzv_members_free(m);
    return r;
  }
  *out = m;
  return NEWT_OK;
}

newt_result_t rdzv_members_get(rdzv_members *m, void **out, size_t *n, int64_t *revision) {
  pthread_mutex_lock(&m->mu);
  unsigned char *copy = malloc((m->n ? m->n : 1) * (m->o.size ? m->o.size : 1));
  if (copy) {
    for (size_t i = 0; i < m->n; i++) memcpy(copy + i * m->o.size, member_of(slot(m, m->w, i)), m->o.size);
    *n = m->n;
    if (revision) *revision = m->revision;
  }
  pthread_mutex_unlock(&m->mu);
  NEWT_CHECK_ALLOC(copy);
  *out = copy;
  return NEWT_OK;
}

size_t rdzv_members_count(rdzv_members *m) {
  pthread_mutex_lock(&m->mu);
  size_t n = m->n;
  pthread_mutex_unlock(&m->mu);
  return n;
}

size_t rdzv_members_count_if(rdzv_members *m, int64_t arg) {
  pthread_mutex_lock(&m->mu);
  if (!m->asked || arg != m->count_arg) { /* counted afresh once, then kept up to date per change */
    m->asked = 1;
    m->count_arg = arg;
    m->counted = 0;
    for (size_t i = 0; i < m->n; i++) m->counted += counts(m, slot(m, m->w, i));
  }
  size_t n = m->counted;
  pthread_mutex_unlock(&m->mu);
  return n;
}

newt_result_t rdzv_members_wait(rdzv_members *m, int64_t after, newt_deadline_t d, const atomic_int *abort,
                                int64_t *revision) {
  newt_result_t r = NEWT_OK;
  pthread_mutex_lock(&m->mu);
  while (m->change_revision <= after && (r = cond_wait_slice(&m->cv, &m->mu, d, abort)) == NEWT_OK) {
  }
  int64_t rev = m->change_revision;
  pthread_mutex_unlock(&m->mu);
  if (r == NEWT_ERR_TIMEOUT)
    return NEWT_ERR(r, "membership of %s: no change after revision %lld by the deadline", m->prefix, (long long)after);
  if (r == NEWT_ERR_ABORTED) return NEWT_ERR(r, "waiting for a membership change of %s: aborted", m->prefix);
  if (revision) *revision = rev;
  return NEWT_OK;
}

void rdzv_members_free(rdzv_members *m) {
  if (!m) return;
  rdzv_etcd_watch_free(m->watch);
  free(m->w);
  pthread_mutex_destroy(&m->mu);
  pthread_cond_destroy(&m->cv);
  free(m);
}

/* --- barrier ------------------------------------------------------------------------------------ */

/* A member counts once one of the sources says so; bit i of acked[k] is source i's. */
#define BARRIER_SOURCES 8

typedef struct barrier {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  const char **ids;       /* sorted */
  unsigned char *acked;   /* a bit per source, per id */
  size_t n, have;
} barrier;

/* One of the barrier's watches: which source it reads. */
typedef struct barrier_follower {
  barrier *b;
  const rdzv_barrier_source *src;
  size_t prefix_len;
  int bit;
} barrier_follower;

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Sets or clears the follower's bit of the member whose id ends kv's key (ignored when it is
 * none of ids). */
static void barrier_mark(barrier_follower *f, const rdzv_etcd_kv *kv, int on) {
  barrier *b = f->b;
  if (kv->key_len <= f->prefix_len) return;
  const char *id = kv->key + f->prefix_len;
  if (strchr(id, '/')) return;
  const char **hit = bsearch(&id, b->ids, b->n, sizeof *b->ids, cmp_str);
  if (!hit) return;
  if (on && f->src->counts) on = f->src->counts(f->src->ud, kv, id); /* its value says whether it counts */
  size_t i = (size_t)(hit - b->ids);
  int was = b->acked[i] != 0;
  b->acked[i] = (unsigned char)(on ? b->acked[i] | f->bit : b->acked[i] & ~f->bit);
  int is = b->acked[i] != 0;
  if (is && !was) b->have++;
  if (was && !is) b->have--;
}

static void barrier_clear(barrier *b, int bit) {
  for (size_t i = 0; i < b->n; i++) {
    int was = b->acked[i] != 0;
    b->acked[i] = (unsigned char)(b->acked[i] & ~bit);
    if (was && !b->acked[i]) b->have--;
  }
}

static void on_barrier_watch(void *ud, const rdzv_etcd_watch_resp *r) {
  barrier_follower *f = ud;
  barrier *b = f->b;
  pthread_mutex_lock(&b->mu);
  if (r->kind == RDZV_WATCH_EVENTS) {
    for (size_t i = 0; i < r->n_events; i++) barrier_mark(f, &r->events[i].kv, r->events[i].type == RDZV_EVENT_PUT);
  } else if (r->kind == RDZV_WATCH_RESYNC) {
    barrier_clear(b, f->bit);
    for (size_t i = 0; i < r->n_kvs; i++) barrier_mark(f, &r->kvs[i], 1);
  }
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

/* Reads one source's prefix into the barrier, then watches it from the next revision. */
static newt_result_t barrier_follow(rdzv_etcd *c, barrier_follower *f, newt_deadline_t d, rdzv_etcd_watch **w) {
  rdzv_etcd_kvs snap = {0};
  rdzv_etcd_range_opts ro = {.prefix = 1, .keys_only = f->src->counts == NULL};
  NEWT_CHECK(rdzv_etcd_range(c, f->src->prefix, &ro, d, &snap));
  pthread_mutex_lock(&f->b->mu);
  for (size_t i = 0; i < snap.n; i++) barrier_mark(f, &snap.kvs[i], 1);
  pthread_mutex_unlock(&f->b->mu);
  rdzv_etcd_watch_opts wo = {.prefix = 1, .start_revision = snap.revision + 1};
  rdzv_etcd_kvs_free(&snap);
  return rdzv_etcd_watch_start(c, f->src->prefix, &wo, on_barrier_watch, f, d, w);
}

/* The error of a barrier that ended before every member acknowledged, naming who did not. */
static newt_result_t barrier_missing(newt_result_t r, const barrier *b, const char *what) {
  newt_buf missing;
  newt_buf_init(&missing);
  size_t shown = 0;
  for (size_t i = 0; i < b->n; i++) {
    if (b->acked[i]) continue;
    if (shown < 32) newt_buf_printf(&missing, "%s%s", shown ? ", " : "", b->ids[i]);
    shown++;
  }
  if (shown > 32) newt_buf_printf(&missing, " and %zu more", shown - 32);
  r = NEWT_ERR(r, "%s %s: %zu of %zu members did not acknowledge: %s", what,
               r == NEWT_ERR_TIMEOUT ? "timed out" : "aborted", b->n - b->have, b->n, missing.data ? missing.data : "");
  newt_buf_free(&missing);
  return r;
}

newt_result_t rdzv_barrier_wait(rdzv_etcd *c, const rdzv_barrier_source *src, size_t nsrc, const char *what,
                                const char *const *ids, size_t n, newt_deadline_t d, const atomic_int *abort) {
  if (nsrc > BARRIER_SOURCES) return NEWT_ERR(NEWT_ERR_INVALID, "%s: %zu sources, at most %d", what, nsrc, BARRIER_SOURCES);
  barrier b = {.n = n};
  b.ids = malloc((n ? n : 1) * sizeof *b.ids);
  b.acked = calloc(n ? n : 1, 1);
  if (!b.ids || !b.acked) {
    free(b.ids);
    free(b.acked);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a barrier of %zu", n);
  }
  memcpy(b.ids, ids, n * sizeof *ids);
  qsort(b.ids, n, sizeof *b.ids, cmp_str);
  pthread_mutex_init(&b.mu, NULL);
  rdzv_cond_init(&b.cv);
  barrier_follower fol[BARRIER_SOURCES];
  rdzv_etcd_watch *w[BARRIER_SOURCES] = {0};
  newt_result_t r = NEWT_OK;
  for (size_t i = 0; i < nsrc && r == NEWT_OK; i++) {
    fol[i] = (barrier_follower){.b = &b, .src = &src[i], .prefix_len = strlen(src[i].prefix), .bit = 1 << i};
    r = barrier_follow(c, &fol[i], d, &w[i]);
  }
  if (r == NEWT_OK) {
    pthread_mutex_lock(&b.mu);
    while (b.have < n && (r = cond_wait_slice(&b.cv, &b.mu, d, abort)) == NEWT_OK) {
    }
    pthread_mutex_unlock(&b.mu);
  }
  for (size_t i = 0; i < nsrc; i++) rdzv_etcd_watch_free(w[i]); /* no callback runs after these */
  if (r == NEWT_ERR_TIMEOUT || r == NEWT_ERR_ABORTED) r = barrier_missing(r, &b, what);
  free(b.ids);
  free(b.acked);
  pthread_mutex_destroy(&b.mu);
  pthread_cond_destroy(&b.cv);
  return r;
}
