/* The rendezvous protocols on etcd: worker registration, the membership view, leader
 * election among coordinators with guarded writes, and the generation barrier. This is
 * the API the coordinator and the worker use; docs/rendezvous.md describes the protocols
 * and their guarantees.
 *
 * Key layout (everything of a job lives under /newt/<job>/):
 *
 *   spec                        the job spec (JSON), written once by whoever starts the job
 *   workers/<id>                a worker's registration (JSON, rdzv_worker), on its lease:
 *                               it disappears when the worker dies or leaves; once the worker
 *                               took up a generation it carries that generation's
 *                               acknowledgement ("ack"): the barrier costs no write of its own
 *   election/<lease hex>        a coordinator's candidacy ({"name","host","pid"}), on its
 *                               lease; the leader is the lowest create_revision
 *   plan                        the current plan (JSON with "generation"), written only by
 *                               the leader, guarded by its candidacy key
 *   acks/<generation>/<id>      worker <id> acknowledges plan <generation>, on its lease
 *                               (<generation> is 20 zero-padded digits so keys sort): the
 *                               previous release's barrier, still counted by the readers
 *   events/<ms>-<random>        job events (JSON), ms = wall-clock milliseconds (16 digits)
 *
 * Job names and worker ids are 1-63 characters of [A-Za-z0-9._-]. */
#ifndef NEWT_RENDEZVOUS_RDZV_H
#define NEWT_RENDEZVOUS_RDZV_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "rendezvous/etcd.h"

#define RDZV_NAME_MAX 64
#define RDZV_ACK_MAX 256 /* an acknowledgement folded into a registration, as JSON text */

/* 1-63 characters of [A-Za-z0-9._-]; the error names `what`. */
newt_result_t rdzv_check_name(const char *what, const char *name);
/* "/newt/<job>/" + suffix into out. */
newt_result_t rdzv_key(char *out, size_t cap, const char *job, const char *suffix);

/* --- registration ------------------------------------------------------------------------ */

typedef struct rdzv_worker {
  char id[RDZV_NAME_MAX];
  char host[256];
  char domain[256];   /* its failure domain (a topology label: a node, a rack, a zone): what goes
                         as a unit; replicas are placed across domains. A record without one
                         (the previous release) reads as its host */
  char addr[256];     /* "ip:port" of its data-plane listener ("" when none yet) */
  int device;         /* GPU index; -1: CPU */
  int shares_device;  /* 1: it trains beside other workers on its GPU that say so too (newt
                         worker --share-device); 0: it wants the GPU to itself */
  char state[64];     /* "joining", "ready", "training", "leaving", ... */
  int64_t pid;
  int64_t generation; /* the last plan generation it has taken up (0: none) */
  char ack[RDZV_ACK_MAX]; /* its acknowledgement of `generation`: a JSON object this layer does
                             not read ("": not acknowledged yet); it counts in the barrier */
  /* read back from etcd (ignored when writing) */
  int64_t lease;
  int64_t create_revision;
  int64_t mod_revision;
} rdzv_worker;

/* JSON form ({"id","host","domain","addr","device","state","pid","generation"}, and
 * "shares_device": true when set; "domain" only when it differs from the host, so a
 * registration is what the previous release wrote unless a domain was given; "ack": {...}
 * once acknowledged); malloc'd. */
newt_result_t rdzv_worker_to_json(const rdzv_worker *w, char **out);
/* Parses and checks a registration; errors name `what` and the field. */
newt_result_t rdzv_worker_from_json(const char *text, size_t len, const char *what, rdzv_worker *out);

typedef struct rdzv_registration rdzv_registration;

/* Grants a lease of ttl_s, writes workers/<w->id> on it (failing with NEWT_ERR_CONFLICT
 * when that id is registered by a live lease already) and keeps the lease alive. `lost`
 * (may be NULL) is called once, at once, when the lease is lost: the worker must then
 * stop acting as a member (it is gone from the view) and register again. */
newt_result_t rdzv_register(rdzv_etcd *c, const char *job, const rdzv_worker *w, int64_t ttl_s,
                            rdzv_etcd_lease_lost_fn lost, void *ud, newt_deadline_t d,
                            rdzv_registration **out);
/* The same, on a lease the caller is handed rather than one of its own: the host's lease,
 * granted and kept alive by the node agent that runs this worker among others (cli/agent.h),
 * so that registering costs one write (no grant) and the host's loss (its agent's lease)
 * removes all its workers at once. The lease is kept alive by this client too, so that its
 * loss is reported as above (unless this client keeps it already). A registration on a host
 * lease never revokes it: leaving deletes its key only (a txn guarded by the lease), and the
 * agent deletes the key of a worker that ended or stopped (the lease lives on for the
 * others). When the host lease is gone (at the registration or a renewal), the registration
 * goes on with a lease of its own. */
newt_result_t rdzv_register_on(rdzv_etcd *c, const char *job, const rdzv_worker *w, int64_t host_lease,
                               int64_t ttl_s, rdzv_etcd_lease_lost_fn lost, void *ud, newt_deadline_t d,
                               rdzv_registration **out);
/* 1 while the registration is on the host's lease (rdzv_register_on), 0 on its own. */
int rdzv_registration_shared(const rdzv_registration *r);
/* Rewrites the registration with a new state (NULL: the same) and generation (only while it
 * is still ours: NEWT_ERR_CONFLICT when the lease was lost). Its acknowledgement stays while
 * the generation does, and goes when the generation changes. */
newt_result_t rdzv_registration_update(rdzv_registration *r, const char *state, int64_t generation,
                                       newt_deadline_t d);
/* The same, acknowledging `generation` in the same write: ack_json (a JSON object, at most
 * RDZV_ACK_MAX - 1 bytes, what the caller wants its barrier's reader to know) goes into the
 * registration, which makes it count in rdzv_barrier_wait of that generation. A worker's
 * acknowledgement therefore lives and dies with its registration, on its lease. */
newt_result_t rdzv_registration_ack(rdzv_registration *r, const char *state, int64_t generation,
                                    const char *ack_json, newt_deadline_t d);
/* After a lost lease, or a refused update (the key is no longer ours): when etcd still has
 * the lease and our key on it (etcd extends every lease when it restarts, so an outage
 * shorter than the TTL loses nothing), keeps it alive again; otherwise registers anew, on the
 * host's lease while it lives, else on a fresh lease of its own (NEWT_ERR_CONFLICT when
 * another worker took the id meanwhile). NEWT_ERR_UNAVAILABLE while etcd cannot be reached. */
newt_result_t rdzv_registration_renew(rdzv_registration *r, const char *job, newt_deadline_t d);
int64_t rdzv_registration_lease(const rdzv_registration *r);
/* 1 when its lease was lost (why filled), else 0. */
int rdzv_registration_lost(rdzv_registration *r, char *why, size_t cap);
/* Graceful leave: revokes the lease, so the registration and its acks go at once (on the
 * host's lease: deletes the registration, which carries its acknowledgement). */
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
  int64_t revision;          /* the etcd revision of the change */
  const rdzv_worker *worker; /* LEAVE: its last known registration; RESYNC: NULL */
} rdzv_member_event;

/* Whether registration w acknowledges generation g: it carries an acknowledgement of g, or it
 * has taken up a later generation (the barrier of g is behind it). */
int rdzv_worker_acked(const rdzv_worker *w, int64_t generation);

/* Called in revision order: first (on the caller's thread, inside rdzv_members_start) a
 * JOIN for each member of the snapshot, then (on the watch thread) every change. */
typedef void (*rdzv_members_fn)(void *ud, const rdzv_member_event *e);

typedef struct rdzv_members rdzv_members;

/* A consistent snapshot of workers/ (one range at revision R) and a watch from R + 1, so
 * no change is missed between the two; fn may be NULL (poll with rdzv_members_get). */
newt_result_t rdzv_members_start(rdzv_etcd *c, const char *job, rdzv_members_fn fn, void *ud,
                                 newt_deadline_t d, rdzv_members **out);
/* A copy of the members, sorted by id (free(*out)), and the revision they are current at. */
newt_result_t rdzv_members_get(rdzv_members *m, rdzv_worker **out, size_t *n, int64_t *revision);
size_t rdzv_members_count(rdzv_members *m);
/* How many members' registrations acknowledge generation g (rdzv_worker_acked). */
size_t rdzv_members_count_acked(rdzv_members *m, int64_t generation);
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
} rdzv_campaign_opts;

/* Enters the election: a lease, the key election/<lease hex> on it, a keep-alive and a
 * watch of election/. Returns at once; see rdzv_candidate_wait. */
newt_result_t rdzv_campaign(rdzv_etcd *c, const char *job, const rdzv_campaign_opts *o,
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

/* Who leads the job's election now (for observers): name (may be NULL), its candidacy key
 * and create_revision; NEWT_ERR_NOTFOUND when nobody runs. */
newt_result_t rdzv_leader_get(rdzv_etcd *c, const char *job, newt_deadline_t d, char *name, size_t cap,
                              int64_t *create_revision);

/* --- plan, spec, events --------------------------------------------------------------------- */

/* The leader publishes plan `generation`: plan_json, the plan's record as its codec encoded it
 * (job/plan.h), put as it is. */
newt_result_t rdzv_plan_publish(rdzv_candidate *cand, int64_t generation, const char *plan_json,
                                newt_deadline_t d);
/* The current plan (malloc'd JSON) and its generation; NEWT_ERR_NOTFOUND when none. */
newt_result_t rdzv_plan_get(rdzv_etcd *c, const char *job, newt_deadline_t d, char **json,
                            int64_t *generation, int64_t *mod_revision);
newt_result_t rdzv_spec_put(rdzv_etcd *c, const char *job, const char *spec_json, newt_deadline_t d);
newt_result_t rdzv_spec_get(rdzv_etcd *c, const char *job, newt_deadline_t d, char **spec_json);
/* Appends an event (JSON object) under events/. */
newt_result_t rdzv_event_post(rdzv_etcd *c, const char *job, const char *event_json, newt_deadline_t d);

/* --- generation barrier --------------------------------------------------------------------- */

/* A worker acknowledges generation g with one write, the update of its registration it makes
 * anyway (rdzv_registration_ack). The previous release wrote a key of its own, acks/<g>/<id>
 * on its registration lease: rdzv_barrier_ack still writes one (a second write per worker),
 * and the barrier counts either. */
newt_result_t rdzv_barrier_ack(rdzv_etcd *c, const char *job, int64_t generation, const char *id,
                               int64_t lease, newt_deadline_t d);
/* Waits until every one of ids[0..n) has acknowledged generation g, in its registration
 * (rdzv_worker_acked) or with a key acks/<g>/<id> (a snapshot of each prefix, then a watch of
 * it). An acknowledgement that vanishes (its registration deleted, its lease lost) no longer
 * counts. NEWT_ERR_TIMEOUT at d naming the members still missing; NEWT_ERR_ABORTED when
 * *abort becomes non-zero. */
newt_result_t rdzv_barrier_wait(rdzv_etcd *c, const char *job, int64_t generation,
                                const char *const *ids, size_t n, newt_deadline_t d,
                                const atomic_int *abort);
/* Deletes the acks of every generation below g (the leader's housekeeping). */
newt_result_t rdzv_barrier_forget(rdzv_candidate *cand, const char *job, int64_t below_generation,
                                  newt_deadline_t d);

#endif
