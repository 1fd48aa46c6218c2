/* The job's records in etcd, written and read through rendezvous' generic protocols: every key
 * comes from job_key / job_prefix (records.h), every value from its record's codec, and
 * rendezvous/ sees only keys, leases and bytes. What each protocol guarantees is
 * docs/rendezvous.md's; what each record holds is records.h's. */
#ifndef NEWT_JOB_STORE_H
#define NEWT_JOB_STORE_H

#include <stdatomic.h>

#include "job/plan.h"
#include "job/records.h"
#include "rendezvous/rdzv.h"

/* The deadline of one etcd call of the control plane (NEWT_ETCD_CALL_MS, 5 s). */
newt_deadline_t job_call_deadline(void);

/* --- plan, spec, events --------------------------------------------------------------------- */

/* The leader publishes plan `generation`: plan_json, the plan's record as its codec encoded it
 * (job/plan.h), put as it is, guarded by the candidacy. */
newt_result_t job_plan_publish(rdzv_candidate *cand, const char *job, int64_t generation, const char *plan_json,
                               newt_deadline_t d);
/* The leader publishes plan p: one record as plan_to_json writes it (job_plan_publish) when it
 * has at most NEWT_PLAN_SHARD_RANKS ranks (2048); otherwise its shards (plan_shard_encode),
 * each at plan/<generation>/<shard>, in guarded transactions of at most NEWT_PLAN_TXN_BYTES of
 * values (512 KiB), then the head, in one guarded transaction that also deletes the shards of
 * older plans: the head is the commit point, and a deposed leader's shards are refused like
 * its head. *bytes (may be NULL): the bytes written, head and shards. */
newt_result_t job_plan_publish_plan(rdzv_candidate *cand, const char *job, const newt_plan *p, newt_deadline_t d,
                                    size_t *bytes);
/* The shards of head (plan_head_from_json of the plan record read at `revision`), read at that
 * revision (in pieces of 4) and added: the whole plan, or an error naming the shard missing
 * or refused. A plan in one record is left as it is. */
newt_result_t job_plan_shards_get(rdzv_etcd *c, const char *job, newt_plan *head, int64_t revision,
                                  newt_deadline_t d);
/* Shard i of head alone, read at `revision` and checked (plan_shard_read): what a worker that
 * needs only its own host's ranks reads (plan_shard_of_host). */
newt_result_t job_plan_shard_get(rdzv_etcd *c, const char *job, const newt_plan *head, int i, int64_t revision,
                                 newt_deadline_t d, plan_rank **out, int *n);
/* The current plan (malloc'd JSON, may be NULL) and its generation; NEWT_ERR_NOTFOUND when none. */
newt_result_t job_plan_get(rdzv_etcd *c, const char *job, newt_deadline_t d, char **json, int64_t *generation,
                           int64_t *mod_revision);
/* The spec's record (spec_to_json's text; a JSON document, else refused). */
newt_result_t job_spec_put(rdzv_etcd *c, const char *job, const char *spec_json, newt_deadline_t d);
newt_result_t job_spec_get(rdzv_etcd *c, const char *job, newt_deadline_t d, char **spec_json);
/* Appends an event (a JSON object: job_event_to_json's) under events/<ms>-<seq>-<rand>. */
newt_result_t job_event_post(rdzv_etcd *c, const char *job, const char *event_json, newt_deadline_t d);

/* --- the end: done or failed ---------------------------------------------------------------- */

/* Whether the job has its end marker (reads /newt/<job>/done, and its progress; 0 also when
 * etcd cannot be reached: the caller asks again later). A marker counts only when it passes
 * its parser and job_done_counts: a forged or corrupt one is ignored, with a warning. auth:
 * the job's records key (NULL or none: the previous release's rule, no proof asked). */
int job_is_done(rdzv_etcd *c, const char *job, const newt_spec *spec, const job_auth *auth);
/* The same, and the marker in *out when it counts. */
int job_done_get(rdzv_etcd *c, const char *job, const newt_spec *spec, const job_auth *auth, job_done *out);
/* Whether the job has failed (reads /newt/<job>/failed; 0 also when etcd cannot be reached). */
int job_has_failed(rdzv_etcd *c, const char *job, job_failed *out);

/* --- a worker's registration ---------------------------------------------------------------- */

/* Registers w at workers/<w->id> on a lease of its own (rdzv_register: NEWT_ERR_CONFLICT when
 * the id is registered by a live lease already); job_register_on: on the host's lease. The
 * handle is rendezvous' (rdzv_registration_renew, _lease, _lost, _leave, _free, _shared). */
newt_result_t job_register(rdzv_etcd *c, const char *job, const job_worker *w, int64_t ttl_s,
                           rdzv_etcd_lease_lost_fn lost, void *ud, newt_deadline_t d, rdzv_registration **out);
newt_result_t job_register_on(rdzv_etcd *c, const char *job, const job_worker *w, int64_t host_lease, int64_t ttl_s,
                              rdzv_etcd_lease_lost_fn lost, void *ud, newt_deadline_t d, rdzv_registration **out);
/* Where the transactions on the host's lease go (rdzv_register_opts): the host's batch (one
 * process plays the host: newt bench rendezvous) or its agent's gateway (a worker under
 * `newt worker --local-workers`). */
typedef struct job_host_route {
  struct rdzv_batch *batch;
  struct rdzv_gateway_client *gateway;
} job_host_route;
/* job_register_on, its claim and every rewrite of it (the acknowledgements) and its leave
 * through via (NULL: straight to etcd). */
newt_result_t job_register_via(rdzv_etcd *c, const char *job, const job_worker *w, int64_t host_lease,
                               const job_host_route *via, int64_t ttl_s, rdzv_etcd_lease_lost_fn lost, void *ud,
                               newt_deadline_t d, rdzv_registration **out);
/* Rewrites the registration with a new state (NULL: the same) and generation (only while it
 * is still ours: NEWT_ERR_CONFLICT when the lease was lost). Its acknowledgement stays while
 * the generation does, and goes when the generation changes. */
newt_result_t job_registration_update(rdzv_registration *r, const char *state, int64_t generation, newt_deadline_t d);
/* The same, acknowledging `generation` in the same write: ack_json (a JSON object, at most
 * JOB_ACK_MAX - 1 bytes: a job_ack) goes into the registration, which makes it count in
 * job_barrier_wait of that generation. A worker's acknowledgement therefore lives and dies
 * with its registration, on its lease. */
newt_result_t job_registration_ack(rdzv_registration *r, const char *state, int64_t generation, const char *ack_json,
                                   newt_deadline_t d);
/* The node agent's part (cli/agent.c): deletes the registration workers/<id> while it is on
 * the host's `lease`, in one transaction guarded by the key's lease (what the end of the
 * worker's own lease would have done: the lease lives on for the host's other workers).
 * *deleted (may be NULL): 1 when it was there on that lease and is gone, 0 when it was not
 * (none, or on another lease). A job or id that is no name has no registration: NEWT_OK and 0,
 * without a call. */
newt_result_t job_registration_forget(rdzv_etcd *c, const char *job, const char *id, int64_t lease, newt_deadline_t d,
                                      int *deleted);

/* --- the membership view of workers/ -------------------------------------------------------- */

/* rdzv_members of the job's registrations: each member a job_worker (an event's value; lease
 * and revisions read back), malformed ones ignored with a warning. */
newt_result_t job_members_start(rdzv_etcd *c, const char *job, rdzv_members_fn fn, void *ud, newt_deadline_t d,
                                rdzv_members **out);
/* A copy of the members, sorted by id (free(*out)), and the revision they are current at. */
newt_result_t job_members_get(rdzv_members *m, job_worker **out, size_t *n, int64_t *revision);
/* How many members' registrations acknowledge generation g (job_worker_acked). */
size_t job_members_count_acked(rdzv_members *m, int64_t generation);

/* --- the generation barrier ----------------------------------------------------------------- */

/* A worker acknowledges generation g with one write, the update of its registration it makes
 * anyway (job_registration_ack). The previous release wrote a key of its own, acks/<g>/<id> on
 * its registration lease: job_barrier_ack still writes one (a second write per worker), and
 * the barrier counts either. */
newt_result_t job_barrier_ack(rdzv_etcd *c, const char *job, int64_t generation, const char *id, int64_t lease,
                              newt_deadline_t d);
/* Waits until every one of ids[0..n) has acknowledged generation g, in its registration or
 * with a key acks/<g>/<id> (rdzv_barrier_wait over both). */
newt_result_t job_barrier_wait(rdzv_etcd *c, const char *job, int64_t generation, const char *const *ids, size_t n,
                               newt_deadline_t d, const atomic_int *abort);
/* Deletes the acks of every generation below g (the leader's housekeeping). */
newt_result_t job_barrier_forget(rdzv_candidate *cand, const char *job, int64_t below_generation, newt_deadline_t d);

/* --- the coordinators' election ------------------------------------------------------------- */

/* Enters the job's election (election/<lease hex>, holding a job_candidacy: o->name, this host
 * and pid). */
newt_result_t job_campaign(rdzv_etcd *c, const char *job, const rdzv_campaign_opts *o, newt_deadline_t d,
                           rdzv_candidate **out);
/* Who leads the job's election now (for observers): its name (may be NULL; the candidacy key
 * when its record says none) and create_revision; NEWT_ERR_NOTFOUND when nobody runs. */
newt_result_t job_leader_get(rdzv_etcd *c, const char *job, newt_deadline_t d, char *name, size_t cap,
                             int64_t *create_revision);

#endif
