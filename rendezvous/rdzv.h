/* The rendezvous protocols on etcd: registration of a key on a lease, a membership view of
 * the keys under a prefix, leader election among candidates with guarded writes, and a
 * barrier over the keys of a set of members. This layer knows keys, leases and revisions, not
 * the records they hold: every key or prefix is the caller's (the job's keys are built in
 * job/), every value the caller's encoding (a registration's record is opaque bytes and the
 * function that writes them; a membership view's members are what the caller's decoder makes
 * of them). docs/rendezvous.md describes the protocols and their guarantees.
 *
 * Job names and ids (the last part of a member's key) are 1-63 characters of [A-Za-z0-9._-]. */
#ifndef NEWT_RENDEZVOUS_RDZV_H
#define NEWT_RENDEZVOUS_RDZV_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/name.h"
#include "rendezvous/etcd.h"

/* A member's or candidate's name (common/name.h: newt_check_name checks it). */
#define RDZV_NAME_MAX NEWT_ID_MAX

/* --- registration ------------------------------------------------------------------------ */

/* Writes a record's bytes: the caller's encoding of its record (malloc'd into *out). */
typedef newt_result_t (*rdzv_encode_fn)(const void *rec, char **out);

typedef struct rdzv_register_opts {
  const void *rec;        /* the caller's record (size bytes, copied: this layer never reads it) */
  size_t size;
  rdzv_encode_fn encode;  /* the value written: at registration, and again at every re-claim */
  int64_t host_lease;     /* a lease the caller is handed (0: a lease of its own), see below */
  int64_t ttl_s;
  rdzv_etcd_lease_lost_fn lost; /* may be NULL */
  void *ud;
  const char *what;       /* the holder, for messages ("worker id w3 in job j") */
  /* Where the transactions on the host's lease go (the claim, every rewrite, the leave's
     delete), to cost the host one proposal for all its workers (batch.h): an in-process
     batch, or the host agent's gateway (gateway.h; when it cannot be reached, straight to
     etcd). Neither: straight to etcd. Both outlive the registration. */
  struct rdzv_batch *batch;
  struct rdzv_gateway_client *gateway;
} rdzv_register_opts;

typedef struct rdzv_registration rdzv_registration;

/* Grants a lease of ttl_s, writes key on it (failing with NEWT_ERR_CONFLICT when a live lease
 * holds the key already) and keeps the lease alive. `lost` is called once, at once, when the
 * lease is lost: the holder must then stop acting as a member (it is gone from the view) and
 * register again.
 *
 * With a host_lease: on that lease rather than one of its own (the host's lease, granted and
 * kept alive by the node agent that runs this worker among others, cli/agent.h), so that
 * registering costs one write (no grant) and the host's loss removes all its keys at once. The
 * lease is kept alive by this client too, so that its loss is reported as above (unless this
 * client keeps it already). A registration on a host lease never revokes it: leaving deletes
 * its key only (a txn guarded by the lease), and the agent deletes the key of a worker that
 * ended or stopped (the lease lives on for the others). When the host lease is gone (at the
 * registration or a renewal), the registration goes on with a lease of its own. */
newt_result_t rdzv_register(rdzv_etcd *c, const char *key, const rdzv_register_opts *o, newt_deadline_t d,
                            rdzv_registration **out);
/* 1 while the registration is on the host's lease, 0 on its own. */
int rdzv_registration_shared(const rdzv_registration *r);
/* Rewrites the registration with record rec (size bytes, as registered), only while the key is
 * still ours: NEWT_ERR_CONFLICT when the lease was lost. */
newt_result_t rdzv_registration_put(rdzv_registration *r, const void *rec, newt_deadline_t d);
/* The record as last written (the registration's copy: valid until the next put or free). */
const void *rdzv_registration_record(const rdzv_registration *r);
const char *rdzv_registration_key(const rdzv_registration *r);
/* After a lost lease, or a refused update (the key is no longer ours): when etcd still has
 * the lease and our key on it (etcd extends every lease when it restarts, so an outage
 * shorter than the TTL loses nothing), keeps it alive again; otherwise registers anew, on the
 * host's lease while it lives, else on a fresh lease of its own (NEWT_ERR_CONFLICT when
 * another holder took the key meanwhile). NEWT_ERR_UNAVAILABLE while etcd cannot be reached. */
newt_result_t rdzv_registration_renew(rdzv_registration *r, newt_deadline_t d);
int64_t rdzv_registration_lease(const rdzv_registration *r);
/* 1 when its lease was lost (why filled), else 0. */
int rdzv_registration_lost(rdzv_registration *r, char *why, size_t cap);
/* Graceful leave: revokes the lease, so the registration and whatever else is on the lease go
 * at once (on the host's lease: deletes the registration only). */
newt_result_t rdzv_registration_leave(rdzv_registration *r, newt_deadline_t d);
/* Stops the keep-alive (the registration then expires with its lease) and frees. */
void rdzv_registration_free(rdzv_registration *r);

/* --- membership view ---------------------------------------------------------------------- */

typedef enum rdzv_member_change {
  RDZV_MEMBER_JOIN = 0,
  RDZV_MEMBER_LEAVE,
  RDZV_MEMBER_UPDATE,
  RDZV_MEMBER_RESYNC, /* history was compacted: the view was re-read; the JOIN / LEAVE /
                         UPDATE events that follow at the same revision are the difference */
} rdzv_member_change;

typedef struct rdzv_member_event {
  rdzv_member_change change;
  int64_t revision;  /* the etcd revision of the change */
  const char *id;    /* the member: the last part of its key (RESYNC: NULL) */
  const void *value; /* its decoded value (LEAVE: the last known; RESYNC: NULL) */
} rdzv_member_event;

/* Called in revision order: first (on the caller's thread, inside rdzv_members_start) a
 * JOIN for each member of the snapshot, then (on the watch thread) every change. */
typedef void (*rdzv_members_fn)(void *ud, const rdzv_member_event *e);

typedef struct rdzv_members_opts {
  size_t size; /* of a decoded member */
  /* kv (prefix + id) into member; 0: not a member (malformed: the decoder says why) */
  int (*decode)(const rdzv_etcd_kv *kv, const char *id, void *member);
  /* Whether a member counts for arg (rdzv_members_count_if); NULL: none does */
  int (*counts)(const void *member, int64_t arg);
  rdzv_members_fn fn; /* may be NULL (poll with rdzv_members_get) */
  void *ud;
} rdzv_members_opts;

typedef struct rdzv_members rdzv_members;

/* A consistent snapshot of the keys prefix<id> (one range at revision R) and a watch from
 * R + 1, so no change is missed between the two. */
newt_result_t rdzv_members_start(rdzv_etcd *c, const char *prefix, const rdzv_members_opts *o, newt_deadline_t d,
                                 rdzv_members **out);
/* A copy of the decoded members (size bytes each), sorted by id (free(*out)), and the revision
 * they are current at. */
newt_result_t rdzv_members_get(rdzv_members *m, void **out, size_t *n, int64_t *revision);
size_t rdzv_members_count(rdzv_members *m);
/* How many members count for arg (the options' counts), kept up to date change by change
 * once asked for an arg. */
size_t rdzv_members_count_if(rdzv_members *m, int64_t arg);
/* Waits until a membership change after revision `after` (*revision: that change's);
 * NEWT_ERR_TIMEOUT at d, NEWT_ERR_ABORTED when *abort becomes non-zero (checked every 50 ms). */
newt_result_t rdzv_members_wait(rdzv_members *m, int64_t after, newt_deadline_t d,
                                const atomic_int *abort, int64_t *revision);
void rdzv_members_free(rdzv_members *m);

/* --- leader election ---------------------------------------------------------------------- */

typedef struct rdzv_candidate rdzv_candidate;

/* Called on a background thread when this candidate becomes leader (leading = 1) or stops
 * being leader or candidate (leading = 0: lease lost, key deleted, deposed), with why. */
typedef void (*rdzv_leadership_fn)(void *ud, int leading, const char *why);

typedef struct rdzv_campaign_opts {
  const char *name;   /* shown to others ("coordinator-1") */
  int64_t ttl_s;      /* candidacy lease; a dead leader is replaced within about this */
  rdzv_leadership_fn fn;
  void *ud;
  const char *value;  /* what the candidacy key holds (the caller's record; NULL: the name) */
} rdzv_campaign_opts;

/* Enters the election under prefix: a lease, the key <prefix><lease hex> on it, a keep-alive
 * and a watch of the prefix. Returns at once; see rdzv_candidate_wait. */
newt_result_t rdzv_campaign(rdzv_etcd *c, const char *prefix, const rdzv_campaign_opts *o,
                            newt_deadline_t d, rdzv_candidate **out);
/* Waits until this candidate leads: NEWT_OK, NEWT_ERR_TIMEOUT at d, NEWT_ERR_ABORTED
 * after rdzv_candidate_abort, NEWT_ERR_CONFLICT when the candidacy was lost. */
newt_result_t rdzv_candidate_wait(rdzv_candidate *cand, newt_deadline_t d);
/* Ends the waits in progress (they return NEWT_ERR_ABORTED); later waits are not affected. */
void rdzv_candidate_abort(rdzv_candidate *cand);
int rdzv_candidate_is_leader(rdzv_candidate *cand);
/* After the candidacy was lost (rdzv_candidate_wait said NEWT_ERR_CONFLICT, or leadership
 * ended): when etcd still has its lease and its key (etcd extends every lease when it
 * restarts, so an outage need not cost the candidacy), keeps them again and recomputes
 * leadership from a fresh read of election/ (NEWT_OK: a candidate again, leading if its key
 * is still the lowest); NEWT_ERR_CONFLICT when the lease or the key is gone (campaign
 * anew); NEWT_ERR_UNAVAILABLE or NEWT_ERR_TIMEOUT while etcd does not answer. NEWT_OK at
 * once when the candidacy was never lost. */
newt_result_t rdzv_candidate_renew(rdzv_candidate *cand, newt_deadline_t d);
int64_t rdzv_candidate_lease(const rdzv_candidate *cand);
const char *rdzv_candidate_key(const rdzv_candidate *cand);
/* A transaction that runs only while this candidate leads: its compares plus "my candidacy
 * key still has my create_revision". NEWT_ERR_CONFLICT when it does not lead (deposed:
 * its lease expired, it resigned, or it never led); *out may be NULL. */
newt_result_t rdzv_guarded_txn(rdzv_candidate *cand, const rdzv_etcd_cmp *cmps, size_t ncmp,
                               const rdzv_etcd_op *ops, size_t nops, newt_deadline_t d,
                               rdzv_etcd_txn_result *out);
newt_result_t rdzv_guarded_put(rdzv_candidate *cand, const char *key, const void *value, size_t len,
                               newt_deadline_t d, int64_t *revision);
/* Gives up leadership and candidacy (revokes the lease); others take over at once. */
newt_result_t rdzv_candidate_resign(rdzv_candidate *cand, newt_deadline_t d);
/* Stops the watch and keep-alive and frees (without resigning: the lease expires). */
void rdzv_candidate_free(rdzv_candidate *cand);

/* Who leads the election under prefix now (for observers): the leader's candidacy key and
 * value (rdzv_etcd_kv_free); NEWT_ERR_NOTFOUND when nobody runs. */
newt_result_t rdzv_leader_get(rdzv_etcd *c, const char *prefix, newt_deadline_t d, rdzv_etcd_kv *leader);

/* --- barrier ------------------------------------------------------------------------------- */

/* Where a barrier sees a member acknowledge: a key <prefix><id>, that counts by its existence
 * (counts NULL) or when counts says its value does. */
typedef struct rdzv_barrier_source {
  const char *prefix;
  int (*counts)(void *ud, const rdzv_etcd_kv *kv, const char *id);
  void *ud;
} rdzv_barrier_source;

/* Waits until every one of ids[0..n) has acknowledged in one of the sources (at most 8): a
 * snapshot of each prefix, then a watch of it. An acknowledgement that vanishes (its key
 * deleted, its lease lost) no longer counts. NEWT_ERR_TIMEOUT at d, naming `what` (the
 * barrier: "barrier of job j generation 3") and the members still missing; NEWT_ERR_ABORTED
 * when *abort becomes non-zero. */
newt_result_t rdzv_barrier_wait(rdzv_etcd *c, const rdzv_barrier_source *src, size_t nsrc, const char *what,
                                const char *const *ids, size_t n, newt_deadline_t d, const atomic_int *abort);

#endif
