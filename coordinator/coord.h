/* The coordinator's own state and the functions its files share (private to coordinator/).
 *
 * The files are layers; each uses only those below it (tests/arch/check_layers.sh fails on
 * any loop between files):
 *
 *   coordinator.c  coordinator_run: the election, the leader's loop, the metrics, /healthz
 *   spec_change.c  a changed spec: the file re-read, a change in etcd taken (a replan)
 *   decide.c       the policy's decision acted on: fence, hold out, replan, record
 *   outage.c       etcd unwell: its alarms, its return, the records it lost put back
 *   recovery.c     replan, fence, record a recovery, housekeeping
 *   budget.c       the failure budget and the progress bound: when the leader gives up
 *   picture.c      the job's changes (job/view.h) taken into the picture
 *   holdout.c      workers held out of plans, and what their links say
 *   events.c       events posted, warnings rate-limited
 *
 * Two threads share the picture: the watch's (picture.c, holdout.c's links) writes it under
 * mu; the main thread (everything else) reads it under mu and owns the rest. */
#ifndef NEWT_COORDINATOR_COORD_H
#define NEWT_COORDINATOR_COORD_H

#include <pthread.h>
#include <stdint.h>

#include "common/metrics.h"
#include "common/strindex.h"
#include "coordinator/coordinator.h"
#include "coordinator/policy.h"
#include "job/plan.h"
#include "job/records.h"
#include "job/spec.h"
#include "job/store.h"
#include "job/view.h"
#include "rendezvous/rdzv.h"

/* An acknowledgement of the current generation, by whom. */
typedef struct c_ack {
  char id[RDZV_NAME_MAX];
  job_ack a;
} c_ack;

/* A worker a generation could not take in: kept out of plans a while (holdout.c). */
typedef struct c_held {
  char id[RDZV_NAME_MAX];
  uint64_t until;    /* monotonic ns */
  int strikes;
  uint64_t gen;      /* the generation it could not be in */
  int64_t links_gen; /* its newest links record: of this later generation (0: none) ... */
  int links_ok;      /* ... all of whose ranks answered (coord_put_links): the hold ends at once;
                        else it lasts while they do not, past until */
  int build;         /* a build could not take it in: its links answering proves nothing (a
                        worker without the job's key has working links), only their coming
                        back after a cut does: the hold ends early only after saw_cut */
  int saw_cut;       /* it said it did not reach a later plan's ranks */
  int said_kept;     /* logged that it is kept out past until */
} c_held;

typedef struct coord {
  const coordinator_opts *o;
  char id[RDZV_NAME_MAX];
  rdzv_etcd *etcd;
  newt_spec spec;
  metrics_t *metrics;
  rdzv_candidate *cand;
  char plan_key[256]; /* the plan's: a refused change of it is a foreign plan */

  pthread_mutex_t mu; /* guards the picture below, written by the watch thread */
  job_worker *members;
  int nmembers, cap_members;
  newt_strindex member_ix; /* members by id (coord_find_member): O(1), where a scan per rank was n^2 */
  newt_plan plan; /* generation 0: none */
  job_report *reports;
  int nreports;
  job_event said[8];            /* events a rank's report asks for (replicas that disagreed), to post
                                   outside the lock (coord_post_said) */
  int nsaid;
  job_event said_last;          /* the last mismatch queued: the same one again (every rank of a
                                   group reports a failing one) is posted once */
  char fatal_why[JOB_TEXT_MAX]; /* a rank of the plan in force reported that the job fails: why
                                   ("": none); kept apart from the reports, which the policy reads */
  c_ack *acks;
  int nacks, cap_acks;
  newt_strindex ack_ix; /* acks by id: an ack counted already, and every rank acked, in O(1) a rank */
  int64_t prog_step;
  int64_t prog_max;     /* the newest step any progress record said: an end marker beyond it is not
                           the job's end (job_done_counts) */
  double prog_loss, prog_tps;
  job_progress prog_speed; /* the newest progress record: the ranks' speeds in its generation (policy_rebalance_due) */
  uint64_t prog_change; /* monotonic ns of the last step change (or the plan, if later) */
  uint64_t stall_from;  /* monotonic ns the progress bound counts from: the newest step change,
                           this leader's start or etcd's return (a plan does not reset it) */
  int done;
  job_done done_seen;   /* an end marker the watch brought, judged once its batch is taken in ... */
  char done_key[256];   /* ... its key ("": none pending) and revision */
  int64_t done_seen_rev;
  int64_t done_rev;     /* the revision of the last one found wanting (said once) */
  job_auth auth;        /* the records' key (auth.has 0: the job has no secret) */
  uint64_t auth_warned; /* monotonic ns of the last warning of records that prove nothing ... */
  int auth_refused;     /* ... and how many since */
  uint64_t last_join;   /* monotonic ns of the last registration we had not seen */
  uint64_t join_seen_ms; /* wall ms of the first registration the plan does not take in, since
                            the plan (a join's recovery starts there) */
  uint64_t join_checked_join, join_checked_gen; /* join_grows_layout said no for these */
  job_event spare_ev;   /* ... and said why, to be posted (spare_ev.type == JOB_EV_SPARE) */
  int event_log_fd;     /* coordinator_opts.event_log (-1: none) */
  uint64_t first_member; /* monotonic ns the first worker was seen (the first plan) */
  uint64_t first_report; /* monotonic ns of the first report of this generation (0: none) */
  uint64_t first_gone;   /* monotonic ns a rank of this generation was first missing (0: none) */
  int said_alive;        /* this generation's vanished ranks were said alive (say_alive_locked) */
  /* the step the current generation had reached when it failed (coord_fault_step_locked): the
     newest step its reports say their writers completed, and its newest progress record when
     that was written before the first detection (the survivors of a crash while etcd is away
     go on in the same generation: what they did since is not where the fault hit) */
  int64_t gen_done;      /* newest done_step of its reports (their step, for the previous release's) */
  uint64_t gen_detect;   /* earliest detection its reports say, by their writers' clocks (0: none) */
  int64_t gen_prog;      /* its newest progress record's step (0: none yet) ... */
  uint64_t gen_prog_t;   /* ... and when that was written */
  char (*departed)[RDZV_NAME_MAX]; /* left gracefully since the plan (their key is gone) */
  int ndeparted;
  int in_resync; /* the picture's batch being applied is a resync (a snapshot read back) */
  c_held *held;                    /* workers a generation could not take in: kept out a while */
  int nheld;
  char (*held_ids)[RDZV_NAME_MAX]; /* those still held, for the policy */
  int nheld_ids;

  /* main thread only */
  job_follow *follow;   /* the picture's snapshot and watch, while leading */
  uint64_t plan_mono;   /* when the current plan was published */
  int recorded;         /* the recovery of the current generation is recorded */
  char cause[16];       /* what triggered the current plan */
  uint64_t t_trigger;   /* wall ms: when we learnt of it */
  uint64_t t_detect;    /* wall ms: the earliest detection (a survivor's report) */
  uint64_t t_published; /* wall ms */
  int64_t fault_step;   /* the step the job had reached when the fault the plan answers hit
                           (coord_fault_step_locked, taken with the plan): the recovery redoes
                           what lies beyond the step it restores */
  int went_on;          /* ... and its survivors went on after it, without etcd (coord_fault_step_locked) */
  int waiting_logged;
  char waiting_why[JOB_TEXT_MAX / 2]; /* why the last replan found no layout (waiting_logged) */
  uint64_t outages_seen; /* rdzv_etcd_outages_ended when last looked at */
  uint64_t outage_end;   /* monotonic ns etcd last came back (0: never) */
  uint64_t last_warn;    /* monotonic ns of the last rate-limited warning */
  char last_warn_msg[256];
  uint64_t alarms_checked; /* monotonic ns etcd's alarms were last read */
  uint64_t nospace_since;  /* wall ms etcd was first seen out of space (0: it is not) */

  /* the failure budget: wall ms of the plans made for a crash or hang, newest last */
  uint64_t fails[256];
  int nfails;
  int failed; /* this leader gave up on the job */

  /* spec changes: the file given (re-read every NEWT_SPEC_CHECK_MS), and one in etcd that
     the watch saw (taken by the main thread at the next tick) */
  char *spec_file_text;
  uint64_t spec_file_checked;
  newt_spec spec_next; /* guarded by mu */
  int spec_changed;    /* guarded by mu */
  int plan_foreign;    /* guarded by mu: the stored plan is one we would not take (forged, corrupt) */

  int64_t steps_counted;     /* the step newt_steps_total has counted up to */
  int64_t ckpt_seen;         /* the newest checkpoint whose save the metrics observed (guarded by mu) */
  _Atomic uint64_t tick;     /* monotonic ns the main loop last went round (/healthz) */
} coord;

/* --- spec_change.c ---------------------------------------------------------------------------- */

/* Re-reads the spec file every NEWT_SPEC_CHECK_MS and stores it when it changed. */
void coord_check_spec_file(coord *c);
/* The leader takes a changed spec the watch saw (a replan at the boundary, when planned). */
newt_result_t coord_take_spec_change(coord *c);

/* --- decide.c --------------------------------------------------------------------------------- */

/* Looks at the picture once and acts on the policy's decision (NEWT_ERR_CONFLICT: not leading). */
newt_result_t coord_decide(coord *c);

/* --- outage.c --------------------------------------------------------------------------------- */

/* Reads etcd's alarms every 5 s and says when it ran out of space and when it has space again. */
void coord_check_alarms(coord *c);
/* etcd answers again after an outage: the clocks start again, lost records are put back. */
void coord_after_outage(coord *c);
/* Puts back the spec and the current plan where etcd lost them or a writer replaced the plan. */
void coord_restore_records(coord *c);

/* --- recovery.c ------------------------------------------------------------------------------- */

/* Computes and publishes the next plan (*no_layout: none fits, NEWT_ERR_UNAVAILABLE). */
newt_result_t coord_replan(coord *c, const char *cause, const char *switch_mode, char (*exclude)[RDZV_NAME_MAX],
                           int nexclude, int *no_layout);
/* Fences a member: its registration goes (its lease revoked, or its key where the lease is shared). */
void coord_fence(coord *c, const char *id);
/* Records the current generation's recovery once every rank acknowledged it. */
void coord_record_recovery(coord *c);

/* --- budget.c --------------------------------------------------------------------------------- */

/* Counts a plan made for cause at wall ms t_ms against the budget (a crash or hang only). */
void coord_count_plan(coord *c, const char *cause, uint64_t t_ms);
/* The failures a predecessor planned for, from the job's events. */
void coord_recount_failures(coord *c);
/* Gives up on the job: the failed record, an event, the log, and this process's end. */
void coord_fail_job(coord *c, const char *why);
/* Whether planning for one more failure of cause would overspend the budget (it fails the job). */
int coord_budget_spent(coord *c, const char *cause);
/* Whether no step completed for spec.fault.progress_timeout_ms (it fails the job). */
int coord_past_progress_bound(coord *c);
/* Whether a rank of the current plan reported that the job fails (its state lost,
 * spec.fault.on_state_loss; its replicas disagree, spec.fault.on_mismatch): it fails the
 * job, with the rank's words. */
int coord_fatal_report(coord *c);

/* --- picture.c -------------------------------------------------------------------------------- */

/* Builds the picture from a snapshot of the job and follows its changes (c->follow). */
newt_result_t coord_picture_start(coord *c);
/* Stops following the job (the picture stays as it is). */
void coord_picture_stop(coord *c);
/* The watch's batch of changes taken into the picture (resync: a snapshot that starts the
 * members, reports and acks anew); takes mu. */
void coord_on_batch(void *ud, const job_change *chs, size_t n, int resync);
/* The picture's indexes set up (on a zeroed coord) and freed. */
void coord_picture_init(coord *c);
void coord_picture_free(coord *c);
/* The index of member id in c->members (-1: none). Called with mu held. */
int coord_find_member(const coord *c, const char *id);
/* The index of rank id's ack in c->acks (-1: none). Called with mu held. */
int coord_find_ack(const coord *c, const char *id);
/* Member id is gone (its key deleted, or fenced). Called with mu held. */
void coord_drop_member(coord *c, const char *id);
/* p (moved in) is the current plan: this generation's reports, acks, departures start anew;
 * unless p is the current plan already (the watch brought our own plan, and its ranks' first
 * acks, before we took it in after publishing it): then they stay. */
void coord_set_plan_locked(coord *c, newt_plan *p);
/* The picture as the policy sees it. Called with mu held; valid while it is held. */
policy_view coord_view_locked(coord *c);
/* The newest step the current generation had completed when it failed, as its ranks said it
 * (0: none said); *went_on (may be NULL): its survivors trained on in it after the failure was
 * seen (a crash while etcd was away: worker/peers.c). Called with mu held. */
int64_t coord_fault_step_locked(const coord *c, int *went_on);

/* --- holdout.c -------------------------------------------------------------------------------- */

/* Keeps a worker fenced alive out of plans (until its links to a later plan's ranks work). */
/* known: what the reports say of it, in words ("its connections closed ..."). */
void coord_hold_out(coord *c, const char *id, int build, const char *known);
/* id registered (again), its registration w: when it is held out, it was fenced alive, and
 * that is said; when it comes back from a generation before the plan's, which left it out
 * (its lease ran out while it lived: a link too slow for its keep-alives, a cut from etcd),
 * it is held out the same way until its links are well. live: a registration seen as it
 * happens, not read back by a resync. Called with mu held. */
void coord_held_registered_locked(coord *c, const char *id, const job_worker *w, int live);
/* links/<id> (l NULL: deleted): a held worker's links to a plan's ranks. Called with mu held. */
void coord_put_links(coord *c, const char *id, const job_links *l);
/* The ids still held out, for the policy (c->held_ids). Called with mu held. */
void coord_held_refresh_locked(coord *c);

/* --- events.c --------------------------------------------------------------------------------- */

/* Posts an event of this coordinator, stamped now (and appends it to the event log). */
void coord_post_event(coord *c, job_event *ev);
/* Posts the events the ranks' reports asked for (c->said). */
void coord_post_said(coord *c);
/* A warning that repeats every tick: logged when it changes, else at most every 10 s. */
void coord_warn_limited(coord *c, const char *what, const char *msg);

#endif
