/* The single-host launcher behind `newt run` and `newt bench recovery`: a private etcd
 * (unless one is given), K coordinators and N workers as separate processes, faults
 * injected for real at given steps (--chaos), a live progress line, and a summary of the
 * run with one entry per recovery. In its log directory it keeps the run's files for
 * `newt report` (job/runlog.h): the step log that rank 0 writes (steps.jsonl) and every
 * event of the leader as it saw them in etcd (events.jsonl). */
#ifndef NEWT_LAUNCH_LAUNCHER_H
#define NEWT_LAUNCH_LAUNCHER_H

#include <stdint.h>

#include "common/err.h"
#include "rendezvous/etcd.h"
#include "job/records.h"
#include "job/spec.h"
#include "launch/chaos.h"

typedef struct launcher_opts {
  newt_spec spec;
  int nproc;            /* workers at the start */
  int coordinators;     /* coordinator processes (a killed one is started again, as a
                           Deployment would) */
  const char *etcd;     /* an etcd to use; NULL: start a private one */
  /* how to reach that etcd (TLS, a user), for us (etcd_client: endpoints, CA, certificate,
     user and password) and for the processes we start (the flags, the password's file) */
  rdzv_etcd_opts etcd_client;
  const char *etcd_password_file;
  int etcd_members;     /* members of the private etcd (0: 1); chaos kill|stop:etcd:I acts on one */
  chaos_plan chaos;
  const char *summary;  /* write the summary JSON here; may be NULL */
  const char *log_dir;  /* per-process logs; NULL: a new directory under /tmp. It must be this user's and
                           written by nobody else, as every directory above it (newt_dir_trusted):
                           every file in it is opened through its descriptor, never through a link */
  const char *secret_file; /* the job secret (newt_secret_read's checks); NULL: the checkpoint
                              directory's own (DIR/job.secret, made when missing) when the job has one,
                              else a new one; a copy is <log dir>/job.secret, which the processes read */
  const char *step_log; /* the step log; NULL: steps.jsonl in the log directory */
  int threads;          /* per worker */
  int quiet;            /* no live line, no event lines */
  int64_t timeout_ms;   /* give up when the job is not done by then (0: none) */
  int no_metrics;       /* coordinators serve no metrics (default: each on a free port of 127.0.0.1) */
  int gpus;             /* GPUs of this host for the workers (0: none, they train on CPUs): each
                           worker gets the one fewest live workers use (--device) */
  int share_gpus;       /* with gpus: workers may share a GPU (tests, trying newt on one GPU;
                           slow): each worker is a host of its own (--host, NCCL_HOSTID), so
                           the one-worker-per-GPU rule holds per identity and NCCL connects
                           them over sockets (docs/elastic.md, "GPU workers on one host") */
  int hosts;            /* simulated hosts (0: none, every worker on this host as it is): worker
                           i of the first nproc is on host i * hosts / nproc (contiguous
                           blocks), a joiner on the one with the fewest live workers; each
                           worker gets --host hostI --domain hostI, and chaos kill:host:I kills
                           all of host I's at once */
  int netns;            /* each simulated host (each worker, without hosts) in a network namespace
                           of its own on a bridge (launch/netns.h; root): workers talk TCP
                           between their own addresses, etcd and the coordinators listen on the
                           bridge, and chaos cut:... / cut-etcd:... partition them for real */
  char *const *command; /* the program every worker runs (`newt worker ... -- COMMAND ARGS`,
                           cli/program.h), NULL-terminated, with LOCAL_RANK its slot (the
                           lowest no live worker holds) and LOCAL_WORLD_SIZE max(nproc, slot
                           + 1); NULL: the built-in trainer */
} launcher_opts;

typedef struct launcher_recovery {
  char cause[16];
  char fault[64];   /* the injected fault it answers ("kill:worker:1@step=100"; "": none) */
  uint64_t t_fault; /* wall ms of the fault (0: not injected by us) */
  uint64_t t_ms;    /* wall ms it began: the fault, or its detection when not injected */
  int64_t step;     /* the step training went on from (the state restored) */
  int64_t fault_step; /* the newest step the job had completed when the fault hit: steps_lost =
                         fault_step - step steps were done again (job_event_fault_step) */
  int64_t world;    /* ranks after it */
  int64_t detect_ms, plan_ms, comm_ms, restore_ms, step_ms, total_ms, steps_lost; /* step: the first step
                                                                                    after the restore */
  int64_t generation;
  char restore[8];
  /* cause "etcd" only, from the step log (-1: unknown): how long etcd was away, the longest
     stretch without a step meanwhile beyond the usual step time (0: steps went on at their
     pace), and the tokens/s before and during the outage */
  int64_t outage_ms, pause_ms;
  double tps_before, tps_during;
  /* an injected fault's, from the step log (-1: unknown): from the fault to the first step
     the new layout completed (rank 0's line after the fault with another world). Beside
     total_ms, which ends at the first step of the leader's plan: where etcd was away and the
     survivors went on without it (worker/peers.c), training resumed long before that plan */
  int64_t resumed_ms;
  /* a join newt run started (chaos join): from the joiners' process start (the launcher
     started them) to the first step, start-up (a program's imports) included; total_ms is
     the job's own wait, from the registration (-1: not known) */
  int64_t from_start_ms;
} launcher_recovery;

/* The recovery a recovered event records, timed from t_fault (a fault injected: 0 none) by
 * job_recovery_time, the one definition of every view; its fault's name is the caller's. */
void launcher_recovery_of(const job_event *e, uint64_t t_fault, launcher_recovery *out);
/* The step the fault hit: fault_step, or for a summary that does not say it (an earlier
 * version's), step + steps_lost. */
int64_t launcher_recovery_fault_step(const launcher_recovery *r);

/* Replicas that disagreed (a mismatch event of the leader's, from a rank's report): the step
 * checked, the step training went on from (back_to: the same when nothing was rolled back),
 * what was done (rollback, warn, fail), who said it and the words. */
typedef struct launcher_mismatch {
  int64_t step, back_to, generation;
  uint64_t t_ms;
  char action[16];
  char worker[64];
  char why[512];
} launcher_mismatch;

/* A committed checkpoint, as rank 0 published it (job/records.h job_ckpt). */
typedef struct launcher_ckpt {
  int64_t step;
  int64_t bytes;   /* every rank's files (0: unknown) */
  int64_t save_ms; /* rank 0's save: compress, write, fsync, commit (0: unknown) */
  double stall_ms; /* rank 0's stall: what the save took of its step loop (0: unknown) */
} launcher_ckpt;

typedef struct launcher_result {
  int done;            /* the job reached its last step */
  int64_t steps;
  double final_loss;
  int64_t generations;
  int64_t samples_consumed;
  int64_t samples_repeated; /* samples trained twice: each recovery's steps_lost x the global batch */
  double wall_s;
  launcher_recovery *recoveries;
  int nrecoveries;
  char log_dir[512];
  char step_log[600];   /* the run's files (job/runlog.h) */
  char event_log[600];
  uint64_t t_start_ms;  /* wall ms the run started */
  int64_t etcd_keys;    /* keys on no lease the job left under /newt/<job>/ once every process ended (-1: unknown) */
  char failed[512];     /* the job failed: why (the leader's failure budget); "" otherwise */
  char outcome[16];     /* how the run ended: done, failed, interrupted (SIGINT or SIGTERM to newt
                           run), timeout (--timeout), exited (every worker exited, the job not
                           done), error (the launcher could not go on) */
  char reason[512];     /* why, when not done ("interrupted by SIGINT at step 37"); "" when done */
  launcher_ckpt *ckpts; /* the checkpoints committed, in step order */
  int nckpts;
  launcher_mismatch *mismatches; /* replicas that disagreed, in the order said */
  int nmismatches;
  char (*left_out)[NEWT_ID_MAX]; /* workers that ended left out (JOB_EXIT_LEFT_OUT: they trained, were
                                      left out and not taken back before the end); malloc'd */
  int nleft_out;
  int64_t ckpts_skipped; /* saves rank 0 skipped, its previous save still being written (the ckpt
                            record's count: job_ckpt.skipped) */
  int64_t resumed_step;  /* the run's first generation started from the checkpoint of this step (an
                            earlier run's, in resumed_dir); 0: it started afresh */
  char resumed_dir[512];
  /* the restart mode (spec.restart): steps and final_loss are the program's (its NEWT_STEP lines),
     samples_consumed 0 (newt counts none of its samples); restarts: how many times the programs
     were started again (TORCHELASTIC_RESTART_COUNT of the last start); steps_redone: the program's
     steps done again after a restart (from its last checkpoint); beats: the supervisors' steps */
  int restart_mode;
  int64_t restarts, steps_redone, beats;
  int64_t newest_ckpt;   /* the newest checkpoint in spec.ckpt_dir once every process ended (its
                            `latest`, set by newt run): what a run on that directory resumes
                            from; 0: none */
} launcher_result;

/* The options that cannot go together (chaos on etcd with --etcd, a cut without --netns, a
 * checkpoint trigger for a job that writes none, --netns with --etcd): NEWT_ERR_INVALID
 * naming them, before anything starts. launcher_run checks them too. */
newt_result_t launcher_check_opts(const launcher_opts *o);
/* The simulated hosts the chaos schedule names are among o->hosts (kill:host:I, cut:host:I, ...):
 * NEWT_ERR_INVALID naming the first item that names another (newt run checks it once --hosts
 * is read). */
newt_result_t launcher_check_hosts(const launcher_opts *o);

/* Runs the job to its end. NEWT_OK when it finished; the result is filled either way. */
newt_result_t launcher_run(const launcher_opts *o, launcher_result *res);
void launcher_result_free(launcher_result *res);

/* The summary document of docs/elastic.md (steps, final_loss, generations, samples_consumed,
 * recoveries[] with cause and timings); malloc'd. */
char *launcher_summary_json(const launcher_opts *o, const launcher_result *res);

/* A summary read back (launch/summary.c), for `newt report`. */
typedef struct launcher_summary {
  char job[64];
  int64_t steps_planned; /* the spec's steps (0: not recorded) */
  int64_t global_batch, workers;
  char ckpt_dir[SPEC_PATH_MAX]; /* the spec's checkpoint directory, where newest_checkpoint is */
  launcher_result res;   /* recoveries malloc'd: launcher_result_free */
} launcher_summary;

/* Parses what launcher_summary_json writes (and what earlier versions wrote: a field added
 * later reads as its default, etcd_keys as -1); errors name the field
 * ("summary.recoveries[1].total_ms: ..."). */
newt_result_t launcher_summary_from_json(const char *text, size_t len, launcher_summary *out);

#endif
