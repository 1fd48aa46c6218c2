/* Chaos schedules for `newt run --chaos SPEC` (and the fault of `newt bench recovery`):
 * faults injected for real at given steps; the launcher (launcher.h) fires them.
 *
 *   SPEC  := ITEM ("," ITEM)*
 *   ITEM  := ACTION ("@step=" N | "@ckpt=" N)
 *            @step: once the job completed step N; @ckpt: once a checkpoint of step N or a
 *            newer one committed (an event, not a step count that a slow save may outlast)
 *   ACTION:= ("kill" | "stop" | "term" | "cont") ":worker:" I    SIGKILL / SIGSTOP / SIGTERM / SIGCONT
 *          | ("kill" | "stop" | "term") ":rank:" R          the worker that is rank R of the current plan
 *          | ("kill" | "stop" | "term") ":coordinator" [":" I]  the leader when I is left out
 *          | "kill:host:" I             SIGKILL every worker of simulated host I at once, back
 *                                       to back (newt run --hosts: a node lost as a unit)
 *          | "join:" N                                          start N new workers
 *          | "restart:etcd" [":" MS]                            down for MS ms (default 2000)
 *          | ("restart" | "stop") ":etcd:until=" S              away until the job completed step S
 *          | "stop:etcd" [":" MS]       SIGSTOP every member for MS ms (default 2000, at least
 *                                       100), then SIGCONT: a hung etcd that accepts and never answers
 *          | "wipe:etcd" [":" MS]       down for MS ms (default 2000), then back EMPTY (its data lost)
 *          | "kill:etcd:" I [":" MS]    kill -9 member I, restart it after MS ms (default 2000;
 *                                       0: never)
 *          | "stop:etcd:" I ":" MS      SIGSTOP member I, SIGCONT after MS ms (0: never)
 *          | ("cut" | "cut-etcd") ":" ("worker" | "rank" | "host") ":" I [":" MS | ":until=" S]
 *                                       newt run --netns: the worker's (the rank's, the simulated
 *                                       host's) network namespace cut, with blackhole routes, from
 *                                       every other host (cut: a partition of the data plane;
 *                                       etcd and the coordinators still reach it) or from etcd
 *                                       and the coordinators (cut-etcd: its peers still reach
 *                                       it); mended after MS ms or once the job completed step
 *                                       S (neither: it lasts)
 *          | "flip:rank:" R [":" TENSOR]  once rank R has done step N (@step only), one bit of one
 *                                       element of TENSOR (default: its first replicated part) is
 *                                       flipped in its memory: silent data corruption. Armed in
 *                                       every worker at its start (NEWT_CHAOS_FLIP), so it lands
 *                                       at that very step; the replicas' check finds it
 *          | "slowcpu:" ("worker" | "rank") ":" I ":" P "%" [":until=" (S | "rebalanced")]
 *                                       the worker runs P percent (1..99) of the time: stopped and
 *                                       continued every 20 ms, until the job completed step S,
 *                                       or until the plan that answers it is in force
 *                                       (rebalanced), or for good. A straggler, which the leader
 *                                       answers by rebalancing (docs/elastic.md)
 *          | "slow:" ("worker" | "rank" | "host") ":" I ":" KBIT [":" MS | ":until=" S]
 *                                       newt run --netns: its link shaped to KBIT kbit/s both
 *                                       ways with a short queue (bursts dropped: slow and lossy)
 *
 * Worker I is the launcher's I-th worker process (w<I>, in start order, joins included).
 * Member I of the private etcd is 0..4 here; whether the etcd has it is the launcher's
 * check. stop:etcd with one value is the whole etcd (so a member needs both values).
 * Example: kill:worker:1@step=15,stop:worker:2@step=30,term:worker:0@step=45,join:2@step=50,
 *          kill:coordinator@step=60,restart:etcd@step=70,kill:etcd:1:0@step=80,wipe:etcd@step=90
 * Errors name the item and what is wrong with it. chaos.c holds the actions as one table, a
 * row per action and target (its grammar, printing, needs, fire and mend functions, and the
 * recovery that answers it): a new action is a value of chaos_action, a row and its functions. */
#ifndef NEWT_LAUNCH_CHAOS_H
#define NEWT_LAUNCH_CHAOS_H

#include <stdint.h>

#include "common/err.h"

typedef enum chaos_action {
  CHAOS_KILL,
  CHAOS_STOP,
  CHAOS_TERM,
  CHAOS_CONT,
  CHAOS_JOIN,
  CHAOS_RESTART,
  CHAOS_WIPE,
  CHAOS_CUT,      /* the data plane: a partition */
  CHAOS_CUT_ETCD, /* etcd and the coordinators */
  CHAOS_SLOW,     /* a slow, lossy link */
  CHAOS_FLIP,     /* a bit of a rank's state flipped (armed in the workers at their start) */
  CHAOS_SLOWCPU,  /* a worker's CPU time cut down to a fraction: a straggler */
} chaos_action;

typedef enum chaos_target { CHAOS_WORKER, CHAOS_COORDINATOR, CHAOS_ETCD, CHAOS_HOST } chaos_target;

typedef struct chaos_event {
  chaos_action action;
  chaos_target target;
  int index;     /* worker or coordinator index, -1: the current leader; etcd: the
                    member, -1: every member; host: the simulated host */
  int by_rank;   /* worker target: index is a rank of the current plan */
  int64_t arg;   /* join: how many workers; etcd: downtime in ms (a member's 0: for good); cut:
                    how long in ms (0: until until_step, or for good) */
  int64_t step;  /* fires once the job has completed this step */
  int64_t ckpt_step; /* ... and a checkpoint of this step or newer committed (0: no condition) */
  int64_t until_step; /* whole etcd, restart or stop; a cut: back (mended) once the job
                         completed this step (0: after arg ms) */
  int64_t kbit;       /* slow: the link's rate, kbit/s */
  int percent;        /* slowcpu: the CPU time left, percent */
  int until_rebalanced; /* slowcpu: it ends once a plan answered it (until=rebalanced) */
  char tensor[72];    /* flip: the tensor ("": the rank's first replicated part) */
  int fired;
} chaos_event;

typedef struct chaos_plan {
  int n;
  chaos_event *events; /* sorted by step, stable */
} chaos_plan;

newt_result_t chaos_parse(const char *spec, chaos_plan *out);
void chaos_free(chaos_plan *p);
/* "kill:worker:1@step=15", "stop:etcd:2000@step=9", "kill:etcd:1:0@step=9": what
 * chaos_parse reads back as the same event. */
const char *chaos_event_str(const chaos_event *e, char *buf, size_t cap);

#endif
