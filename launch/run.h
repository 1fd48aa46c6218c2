/* The launcher's own parts (launcher.h is what others see): the run that every file of the
 * launcher works on, and what one file gives another. The files are layers, each using only
 * those below it (no two call each other: tests/arch/check_layers.sh):
 *
 *   launcher.c    the run: its start, the main loop, its end
 *   chaos.c       the chaos actions' table (a row per action and target: its grammar, its
 *                 printing, what it needs, its fire and mend functions, the recovery that
 *                 answers it), and the loops over it: items parsed and printed, needs
 *                 checked, the faults due fired, those in force mended
 *   inject.c      each action's fire and mend functions: signals, a host's workers, cuts and
 *                 slow links, joins, etcd's faults (undone and timed)
 *   recoveries.c  the leader's events handled: each fault paired with the recovery that
 *                 answers it, the notes of our faults for newt status, outages measured
 *   procs.c       the processes: started (flags, environment), reaped, stopped
 *   live.c        the live line and the step log it follows; how a line of news starts
 *   follow.c      the job as the launcher sees it (job/view.h): progress, the end marker,
 *                 checkpoints and events as they come; the plan in force and the end marker
 *                 read directly
 *   runfile.c     the record of the run for `newt status --job` (runfile.h: where its etcd
 *                 is, how it ended), written by launcher.c, read by cli/cmd_status.c
 *
 * What the watch's thread writes (progress, done, the events not handled yet, etcd_lost_ms)
 * is under mu; everything else is the main loop's. */
#ifndef NEWT_LAUNCH_RUN_H
#define NEWT_LAUNCH_RUN_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "job/view.h"
#include "launch/chaos.h"
#include "launch/launcher.h"
#include "launch/netns.h"
#include "launch/runfile.h"
#include "rendezvous/etcd_server.h"

typedef enum proc_kind { PROC_WORKER, PROC_COORD } proc_kind;

typedef struct proc {
  pid_t pid;
  proc_kind kind;
  char name[32];
  int alive;
  int status;       /* once it exited: its exit status, 128 + the signal that ended it (-1: alive) */
  int killed_by_chaos;
  int metrics_port; /* a coordinator's (0: none) */
  int device;       /* a worker's GPU (-1: none) */
  int slot;         /* a worker's slot on this host, its LOCAL_RANK (-1: a coordinator) */
  int host;         /* a worker's simulated host (launcher_opts.hosts; -1: none) */
  int nshost;       /* with --netns: the host whose namespace it runs in (-1: none) */
} proc;

/* What answers a fault we injected: each row of chaos.c's table says it, and recoveries.c
 * pairs the leader's events with the faults by it. */
typedef enum chaos_answer {
  CHAOS_ANSWER_NONE,    /* nothing: the fault is matched when fired (a slow link, a cut from etcd) */
  CHAOS_ANSWER_CRASH,   /* a crash or hang: a rank lost (a stopped worker may be seen first
                           through its expired lease) */
  CHAOS_ANSWER_LEAVE,   /* a leave: a worker told to go */
  CHAOS_ANSWER_WAKE,    /* a join: a woken worker comes back as a joiner */
  CHAOS_ANSWER_JOINERS, /* the joins or spare events that name its joiners (a join, a mended cut) */
  CHAOS_ANSWER_LEADER,  /* a new leader: a coordinator lost */
  CHAOS_ANSWER_ETCD,    /* training's progress reaching etcd again (inject_etcd_tick) */
  CHAOS_ANSWER_REBALANCE, /* a plan that rebalances the shares (a straggler, or its end) */
} chaos_answer;

/* What an action needs of the run (chaos.c's rows; a @ckpt trigger adds checkpoints). */
enum {
  CHAOS_NEEDS_ETCD = 1,  /* the private etcd (no --etcd) */
  CHAOS_NEEDS_NETNS = 2, /* --netns */
  CHAOS_NEEDS_CKPT = 4,  /* checkpoints written (--ckpt-dir and --ckpt-every) */
  CHAOS_NEEDS_HOSTS = 8, /* its host among --hosts */
  CHAOS_NEEDS_PLAN = 16, /* the plan in force, read when it fires (a rank, a spare) */
};

/* A fault we injected, until the recovery that answers it is seen. */
typedef struct fault {
  chaos_event ev;
  char what[64];  /* "kill:worker:1@step=15" */
  uint64_t t_ms;
  chaos_answer answer;
  int matched;
  int join_first, joined; /* join: its joiners are w<join_first>.. (ev.arg of them); how many a plan has seen */
  char (*back)[RDZV_NAME_MAX]; /* a mended cut: the workers it left out, whose joins answer it
                                  (malloc'd; NULL: not a mend) */
  int nback;
} fault;

/* A cut or a slow link in force that is to be mended (chaos cut:..., cut-etcd:..., slow:...). */
typedef struct cut {
  int host;
  int slow; /* a slow link (else a cut of link) */
  netns_link link;
  uint64_t at; /* monotonic ns to mend it (0: at until_step) */
  int64_t until_step;
  char what[64];
} cut;

/* A worker slowed down (chaos slowcpu): a thread stops and continues it so that it runs percent
 * of the time, until until_step, or until a plan answered its fault (until_rebalanced). */
typedef struct throttle {
  pid_t pid;
  char name[32];
  int percent;
  int64_t until_step;   /* 0: it lasts */
  int until_rebalanced; /* it ends once the plan that answers it is in force */
  int fault;            /* its fault in run.faults (-1: none) */
  char what[64];
  pthread_t thread;
  int has_thread;
  atomic_int stop;
} throttle;

typedef struct run {
  const launcher_opts *o;
  launcher_result *res;
  char exe[4096];
  char etcd_url[512];
  rdzv_etcd_server *server;
  rdzv_etcd *etcd;
  job_follow *follow;
  char prefix[256];      /* the job's keys: /newt/<job>/ */
  char secret_file[600]; /* the job's secret the workers derive data-plane keys from */
  int log_fd;            /* the log directory, checked (newt_dir_trusted): its files are opened here */
  job_auth auth;         /* the records' key of the job secret: an end marker counts with its proof */
  char etcd_user[96];    /* the private etcd's user of this job ("": no auth, --etcd) ... */
  char etcd_pw_file[600]; /* ... and its password's file in the log directory (mode 0600) */
  proc *procs;
  int nprocs, cap_procs, next_worker, next_coord;
  chaos_event *chaos; /* the schedule, each marked once fired */
  int nchaos;
  fault *faults;
  int nfaults;
  int event_log_fd; /* the event log (-1: none) */
  int steps_fd;     /* the step log, followed for the step when etcd is away (-1: not) */
  char steps_line[1024]; /* its line being read, and whether it outgrew the buffer */
  size_t steps_len;
  int steps_long;
  int64_t steps_world; /* the world of the step log's last line (0: none yet) */
  int tty;          /* stderr is a terminal: the live line refreshes in place */
  int line_open;    /* the live line is on the terminal, not ended by a line break */
  double t0;        /* when the run started (monotonic s) */
  double t_line;    /* when the last plain live line was printed */
  double t_step0;   /* when the live line first saw a step, and which (for the ETA) */
  int64_t step0;

  pthread_mutex_t mu; /* the picture the watch keeps: */
  int64_t step, gen;  /* in the restart mode the step is the program's, from the step log */
  int64_t beat;       /* the restart mode: the supervisors' beats (the progress record's step) */
  int64_t restarts;   /* the restart mode: the programs' restarts, from the step log */
  double loss, tps;
  int world, dp;
  uint64_t progress_t_ms;
  job_event *events; /* events not handled yet */
  int nevents, cap_events;
  int done;
  job_done done_seen;  /* an end marker the watch brought, judged once its batch is taken in */
  int done_pending;
  int64_t done_rev;    /* the revision of the marker found wanting last (said once) */
  int64_t done_seen_rev;
  char done_warn[600]; /* a marker found wanting, to be said by the main loop ("": none) */
  int leader_done; /* the main thread: the leader said the job is done (its "done" event, posted
                     after it recorded the last recovery) */
  int64_t done_step, done_samples;
  double done_loss;
  uint64_t etcd_lost_ms; /* wall ms our watch of etcd last broke with nothing since (0: fine) */

  int stopping; /* ending every process: nothing is restarted, no exit is news */
  job_fault *notes; /* faults we injected, to note in etcd for newt status (recoveries.c) */
  int nnotes, notes_done;

  /* an etcd fault in progress (chaos): what was done, when to undo it */
  int etcd_down;
  chaos_event etcd_ev;   /* restart, stop or wipe of the whole etcd, or kill|stop of a member */
  uint64_t etcd_up_at;   /* monotonic ns: undo it then (0: never, a member left dead) */
  uint64_t etcd_back_ms; /* wall ms it served again (0: not yet) */
  int etcd_fault;        /* index into faults */

  netns_net *net; /* --netns: the namespaces (NULL: none) */
  cut *cuts;
  int ncuts;
  throttle **throttles; /* workers slowed down (chaos slowcpu) */
  int nthrottles;

  runfile rec;     /* where newt status finds the job (runfile.h) ... */
  int rec_written; /* ... once written */
} run;

/* Milliseconds from b to a, wall times (0 where a is before b). */
static inline int64_t run_ms_between(uint64_t a, uint64_t b) { return a >= b ? (int64_t)(a - b) : 0; }

/* --- follow.c: the job as the launcher sees it ------------------------------------------------ */

/* Follows the job (job_follow_start): its progress, end marker, checkpoints and events into
 * the run's picture, and whether our watch of etcd is broken (etcd_lost_ms). */
newt_result_t follow_start(run *r, newt_deadline_t d);
/* Whether etcd is away: a fault of ours in force, or our watch of it broken. */
int follow_etcd_away(run *r);
/* The revision of the newest change of the job's keys in etcd now (-1: it did not answer within
 * wait_ms), and whether our watch has handed us every change up to rev yet (an outage's
 * back-off may keep it behind for a moment). */
int64_t follow_etcd_revision(run *r, int64_t wait_ms);
int follow_caught_up(run *r, int64_t rev);
/* Reads the end marker directly (retrying until d while etcd does not answer), taken as the
 * watch would: 1 when the job is done, 0 when it is not or etcd is away. */
int follow_read_done(run *r, newt_deadline_t d);
/* The plan in force, read from etcd into *buf (plan_free it): the rank a "rank" fault names,
 * whether a worker fault lands on a spare, which joiners a join answers. NULL where etcd is
 * away or there is none: nothing waits for it. */
newt_plan *follow_plan(run *r, newt_plan *buf);

/* --- live.c: what people see -------------------------------------------------------------------- */

/* What starts a line of news: a line break ending the live line, when one is open on the
 * terminal (the news line then closes it). */
const char *live_news(run *r);
/* The live line (last: the final one, printed whatever the time since the one before). */
void live_line(run *r, int last);
/* Reads what rank 0 appended to the step log since the last look, into the run's picture
 * (at most 64 KiB: 1 when it read some). */
int live_follow_steps(run *r);

/* --- procs.c: the processes -------------------------------------------------------------------- */

/* Starts worker or coordinator `index` (w<index>, c<index>). */
newt_result_t procs_spawn(run *r, proc_kind kind, int index);
/* The process named name (NULL: none). */
proc *procs_find(run *r, const char *name);
/* Reaps exited children; a coordinator that chaos killed is started again. */
void procs_reap(run *r);
/* Live workers; live coordinators. */
int procs_workers(const run *r);
int procs_coordinators(const run *r);
/* Ends every process (see procs.c for how). */
void procs_stop_all(run *r);

/* --- recoveries.c: the leader's events --------------------------------------------------------- */

/* A recovery no plan of the leader's answers (a coordinator replaced, etcd back): of fault f,
 * timed from it, the state kept in memory, at the run's step and world now (NULL: out of memory). */
launcher_recovery *recoveries_add_unplanned(run *r, const char *cause, const fault *f);
/* Handles the events the watch brought, each first appended to the event log, and frees them. */
void recoveries_take_events(run *r, job_event *evs, int n);
/* Writes the notes of our faults not written yet, while etcd answers (wait_ms a write). */
void recoveries_flush_notes(run *r, int64_t wait_ms);
/* Each etcd outage's pause and throughput, and each injected fault's resumed_ms, from the step
 * log; a worker fault the survivors went on from without etcd and no recovery answered, said. */
void recoveries_measure(run *r);

/* --- chaos.c: the actions' table, looped over ------------------------------------------------ */

/* Whether the run o offers every item of its schedule what it needs (the CHAOS_NEEDS_* of
 * which): NEWT_ERR_INVALID naming the first item that lacks something. */
newt_result_t chaos_check_needs(const launcher_opts *o, unsigned which);
/* What answers the fault e would be (its row's answer). */
chaos_answer chaos_event_answer(const chaos_event *e);
/* Fires the faults of the schedule due at step (the plan in force read once for them all). */
void chaos_fire_due(run *r, int64_t step);
/* Mends what is due of the faults in force (each row's mend, once). */
void chaos_mend(run *r, int64_t step);
/* Ends what chaos left in force that would hold up the end (slowed workers). */
void chaos_end(run *r);

/* --- inject.c: each action's fire and mend ------------------------------------------------------ */

/* The fire functions of chaos.c's rows: fault e, printed as what, injected (plan: the plan in
 * force where the row reads it, else NULL), each fault recorded with add_fault. 1 when it was
 * fired with nothing said of it yet (the caller says it), 0 when it said what happened. */
int inject_fire_signal(run *r, const chaos_event *e, const newt_plan *plan, const char *what);
int inject_fire_host(run *r, const chaos_event *e, const newt_plan *plan, const char *what);
int inject_fire_cut(run *r, const chaos_event *e, const newt_plan *plan, const char *what);
int inject_fire_join(run *r, const chaos_event *e, const newt_plan *plan, const char *what);
int inject_fire_etcd(run *r, const chaos_event *e, const newt_plan *plan, const char *what);
int inject_fire_flip(run *r, const chaos_event *e, const newt_plan *plan, const char *what);
int inject_fire_slowcpu(run *r, const chaos_event *e, const newt_plan *plan, const char *what);
/* The mend functions: the cuts and slow links whose time or step has come mended; an etcd
 * fault undone when its time is up, and recorded once training's progress (or the end
 * marker) reaches etcd again. */
void inject_mend_cuts(run *r, int64_t step);
/* Ends the slowdowns due at step (every one when step < 0: the run ends). */
void inject_mend_slowcpu(run *r, int64_t step);
void inject_etcd_tick(run *r, int64_t step);

#endif
