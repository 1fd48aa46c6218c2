/* The leader's policy as pure functions: a picture of the job in (members and their states,
 * the current plan, the failure reports of its generation, who left, and the clocks of
 * joins, reports, lost leases and progress), a decision out (whether to replan, why, at once
 * or at the next step boundary, and whom to leave out or fence). No etcd, no threads, no
 * clock reads: picture.c builds the picture from the job's changes, decide.c acts on the
 * decision, and tests/coordinator/test_policy.c drives every cause through a table.
 *
 * The causes (the plan's "cause", what events and `newt run` report):
 *   initial  the first plan: once spec.parallel.start_workers are registered (or
 *            start_timeout_ms after the first), else once joins settle (the start window) or
 *            every worker a layout could use is there
 *   crash    survivors reported a collective that failed on a closed connection; or every
 *            rank's registration is gone (nobody left to report) and as many workers as
 *            the plan had arrived, or arrivals settled for the start window
 *   hang     survivors reported a collective that made no progress by its deadline; or a
 *            rank's registration vanished, nobody reported, and no step completed since
 *            (it stopped, or lost its network); or no step completed for
 *            spec.fault.hang_timeout_ms (a stall nobody could name)
 *   leave    a rank announced a graceful leave (SIGTERM): at the step boundary
 *   join     newcomers would make a larger layout, once joins have settled: at the boundary
 *   rebalance a data-parallel rank's compute stayed more than spec.fault.straggler_margin
 *            above or below the median rank's for spec.fault.straggler_window steps (and at
 *            least the view's straggle_min_ms), and the shares its measured speeds earn differ
 *            from the plan's: at the boundary, the same members (docs/elastic.md, "Stragglers")
 * A finishing job (a worker in state "done") is never replanned.
 *
 * etcd is not the judge of who lives: every step needs every rank, so a rank whose
 * registration vanished while steps still complete is alive (its lease ran out while etcd
 * was away or out of its reach) and will renew it. And for a lease TTL plus the join window
 * after an outage ends, a missing registration counts for nothing: it is being renewed. */
#ifndef NEWT_COORDINATOR_POLICY_H
#define NEWT_COORDINATOR_POLICY_H

#include <stdint.h>

#include "common/err.h"
#include "common/strindex.h"
#include "job/plan.h"
#include "job/records.h"
#include "job/spec.h"
#include "rendezvous/rdzv.h"

/* Why the policy replans; several reasons share a cause (policy_cause). */
typedef enum policy_reason {
  POLICY_NONE = 0,
  POLICY_INITIAL,
  POLICY_CRASH_REPORTED, /* reports, the earliest of a closed connection */
  POLICY_HANG_REPORTED,  /* reports, the earliest of a deadline */
  POLICY_ALL_GONE,       /* every rank's registration vanished */
  POLICY_LEASE_LOST,     /* some ranks' registrations vanished, nobody reported */
  POLICY_STALL,          /* no step for hang_timeout_ms */
  POLICY_LEAVE,
  POLICY_JOIN,
  POLICY_REBALANCE,     /* a straggler, or one recovered: the shares follow the measured speeds */
} policy_reason;

/* "initial", "crash", "hang", "leave", "join"; NULL for POLICY_NONE. */
const char *policy_cause(policy_reason r);

typedef struct policy_view {
  const newt_spec *spec;
  const newt_plan *plan;           /* generation 0: none yet */
  const job_worker *members;      /* the registered workers */
  int nmembers;
  const newt_strindex *member_ix;  /* members by id (NULL: policy_decide indexes them itself) */
  const job_report *reports;       /* of the plan's generation */
  int nreports;
  const newt_strindex *report_ix;  /* policy.c's: reports by worker (set by policy_decide) */
  char (*departed)[RDZV_NAME_MAX]; /* left gracefully since the plan (their key is gone) */
  int ndeparted;
  char (*held_out)[RDZV_NAME_MAX]; /* workers no plan may take for now (policy_hold_out) */
  int nheld_out;
  /* clocks, monotonic ns (0: never) */
  uint64_t now;
  uint64_t first_member;  /* the first worker was seen (before the first plan) */
  uint64_t last_join;     /* the newest registration not in the plan */
  uint64_t first_report;  /* the first report of this generation */
  uint64_t first_gone;    /* a rank of this generation was first missing */
  uint64_t last_progress; /* the newest step change, or the plan if later */
  int64_t steps_done;     /* the job's newest completed step (0: none yet: start-up) */
  uint64_t outage_end;    /* etcd last came back after an outage (0: never) */
  int64_t join_window_ms; /* joins settle after this long without one */
  int64_t start_window_ms;
  const job_progress *progress; /* the newest progress record (its speeds; NULL: none yet) */
  int64_t straggle_min_ms;      /* a straggle shorter than this is noise (rebalance) */
  /* Whether the members not in the plan would make a larger one (asked only once joins
     have settled and nothing else is wrong); may be NULL (never). */
  int (*join_grows)(void *ud);
  void *ud;
} policy_view;

enum { POLICY_PARTITION_BUILD = 1, POLICY_PARTITION_CUT = 2 };

typedef struct policy_decision {
  policy_reason reason;            /* POLICY_NONE: nothing to do now */
  int at_boundary;                 /* switch at the next step boundary (else abort the step) */
  int fence;                       /* fence the excluded that are still registered */
  char (*exclude)[RDZV_NAME_MAX];  /* ranks the next plan leaves out (malloc'd) */
  int nexclude;
  /* the clocks as this look leaves them (the caller keeps them for the next) */
  uint64_t first_member, first_gone;
  int gone_alive; /* ranks' registrations vanished, but steps went on since: they are alive */
  int partition;  /* 0, or how the ranks in exclude were found on another side than the one
                     that goes on: POLICY_PARTITION_BUILD (a generation that never formed, a
                     partition no majority explains) or POLICY_PARTITION_CUT (a running
                     generation, ranks that reported but most of the others name) */
} policy_decision;

/* How long at most to keep a worker out of plans after it was fenced alive, the strikes-th
 * time (a build could not take it in, it was cut off, it stopped): 30 s, doubling, at most
 * 10 min -- so that one worker that cannot join does not stop the job over and over by
 * registering again. The leader ends it sooner when the worker says it reaches every rank of
 * a later plan, and keeps it past it while the worker says it does not (job_links). */
int64_t policy_hold_out_ms(int strikes);
/* Whether build reports (a generation that never formed) accuse id: its links were not made,
 * or it could not prove the generation's key. */
int policy_blames_build(const policy_view *v, const char *id);

/* The compute per sample of each of the dp data-parallel ranks of the progress record's
 * generation (us[dp]): a rank it lists off the median, else the median's (0: not measured). */
void policy_progress_us(const job_progress *pr, int dp, double *us);

/* The data-parallel rank to replace by an idle spare rather than rebalance (-1: none): the
 * slowest by us (compute per sample, [dp]) when it is at least spec.fault.straggler_replace
 * times the median of the others' and plan p has a spare (docs/elastic.md, "Stragglers"). */
int policy_replace_dp(const newt_spec *s, const newt_plan *p, const double *us);

/* Whether the progress record says a straggle long enough (spec.fault.straggler_window steps,
 * straggle_min_ms) in the plan's generation, and the shares the measured speeds earn
 * (plan_shares_for) are not the plan's. */
int policy_rebalance_due(const policy_view *v);

/* Looks at the picture once. Only NEWT_ERR_NOMEM fails. */
newt_result_t policy_decide(const policy_view *v, policy_decision *out);
void policy_decision_free(policy_decision *d);

/* A member leaving gracefully (state "leaving" or "left"); one that finished ("done"). */
int policy_member_leaving(const job_worker *w);
int policy_member_done(const job_worker *w);

/* The candidates of the next plan: members that are not leaving, not done, have a data-plane
 * address, are not held out and are not in exclude; out has room for v->nmembers. Returns
 * how many. */
int policy_plan_members(const policy_view *v, char (*exclude)[RDZV_NAME_MAX], int nexclude, plan_member *out);

/* With a backend on GPUs (common/backend.h; spec.backend nccl), two ranks of one communicator
 * cannot share a GPU (NCCL refuses a duplicate device of one host): the candidate that keeps a
 * GPU which candidate w registered on too (a rank of the current plan first, then the earlier
 * registration), or NULL when w's GPU is its own (or the job trains on CPUs, or w on no GPU).
 * Such a w is left out of the next plan until the GPU is free. */
const job_worker *policy_gpu_taken(const policy_view *v, char (*exclude)[RDZV_NAME_MAX], int nexclude,
                                    const job_worker *w);

/* The donors of the next plan: members leaving gracefully that hold state someone needs --
 * ranks of the current plan, and its donors while it has not started (once it has, they
 * handed over and left). out has room for v->nmembers. Returns how many. */
int policy_donors(const policy_view *v, int plan_started, plan_member *out);

#endif
