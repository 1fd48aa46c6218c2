/* libnewt's core: one process as a worker of a job (include/newt.h is the public face,
 * api.c its argument checks). The state shared by its files; arrows go one way, from the top:
 *
 *   api.c       the public functions: checks and handles, then the calls below
 *   worker.c    the step protocol (begin, commit, end): what happens between steps, the
 *               end of a generation, a failure, a leave, the job's end; it drives
 *     join.c        joining: identity, socket, secret, etcd, metrics, spec, backend, device
 *     wait.c        waiting for a plan; a spare's or a leaver's hand-over as a donor
 *     generation.c  a generation built (communicator, groups), its failure reported, ended
 *     watch.c       the plan watch (its own thread)
 *     finish.c      the end: the termination message, everything released
 *   state.c     the declared training state: restore (memory, peers, else the checkpoint
 *               through save.c), the pre-update snapshot, the replica of the data-parallel
 *               neighbour's unique parts, a leaver's hand-over (uses reshard.c)
 *   save.c      the periodic checkpoints of a generation and reading them back (uses
 *               publish.c for the pointer)
 *   publish.c   everything the worker writes to etcd (job/records.h), off the step's path
 *   reshard.c   moving parts of a state between layouts (reshard.h)
 *   pinned.c    the pool of pinned host memory save.c and state.c stage through on a GPU
 *   mem.c       the memory the state lives in: host memory, the CUDA runtime, or the
 *               program's own (newt_memory) */
#ifndef NEWT_WORKER_INTERNAL_H
#define NEWT_WORKER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "ckpt/ckpt.h"
#include "common/backend.h"
#include "comm/comm.h"
#include "job/plan.h"
#include "job/records.h"
#include "job/spec.h"
#include "job/store.h"
#include "newt.h"
#include "rendezvous/etcd.h"
#include "common/sys.h"
#include "rendezvous/rdzv.h"
#include "worker/pubq.h"
#include "worker/reshard.h"
#include "worker/speed.h"

typedef struct newt_ctx worker;
typedef struct worker_pinned worker_pinned;

/* The join's options, resolved (flags, then the environment, then the defaults); the
 * strings are the worker's own copies. */
typedef struct worker_opts {
  rdzv_etcd_opts etcd;
  const char *job, *id, *host, *domain, *addr;
  int port;
  int device;       /* the CUDA device; -1: the CPU */
  void *cuda_stream;
  int share_device; /* other workers that say so too may train on this GPU */
  newt_memory memory; /* how the state's device memory is copied (filled for every device) */
  int64_t spec_wait_ms;
  const char *secret_file, *step_log, *metrics_addr, *termination_log;
  int metrics_port;
  int handle_signals;
} worker_opts;

/* A part of the declared state: a reshard piece (name, type, flags, shape, slice, data);
 * WORKER_PART_DEVICE in its flags: data is memory of the worker's device. */
#define WORKER_PART_DEVICE 0x100u
typedef struct worker_part {
  reshard_piece p;
  int primary; /* this rank saves it (worked out at the restore) */
  int unique;  /* no other rank holds it: the data-parallel neighbour keeps a copy */
  int replicated; /* every rank of its data-parallel group holds it alike: verified (verify.c) */
  int filled;  /* the restore filled it (an optional part may not be) */
} worker_part;

typedef struct worker_decl {
  worker_part *parts;
  size_t n, cap;
} worker_decl;

/* A copy of some of a rank's parts, of one step (state.c): its pre-update snapshot (memory
 * of the device), or a replica of a data-parallel predecessor's unique parts (host memory).
 * step -1: none. */
typedef struct worker_copy {
  reshard_piece *pieces;
  size_t n;
  int on_device; /* data is device memory (the snapshot) */
  char *data;
  char *spare; /* the replica's second buffer: the next one is received there, and the two
                  swap once it is whole, so a transfer cut short leaves the old one */
  size_t bytes;
  int64_t step;
  int64_t spare_step; /* the step of the replica the spare holds since the last swap (the one
                         before the newest), -1 once the next transfer started writing it */
} worker_copy;

/* A crash report's second look (worker_recheck_start, peers.c). */
typedef struct report_recheck {
  newt_plan plan;   /* the failed generation's plan (nranks 0: nothing to look at) */
  int hang;
  char why[JOB_TEXT_MAX];
  int naccused;
  char accused[JOB_ACCUSE_MAX][RDZV_NAME_MAX];
  int nsuspects;
  int *suspects;    /* ranks of plan */
  int looks;        /* looks taken */
} report_recheck;

/* A group of a generation, as the program holds it: it outlives its generation (a stale
 * handle is refused, never freed under the program). */
#define WORKER_COMM_MAGIC 0x6e636f6du
struct newt_comm {
  uint32_t magic;
  worker *w;
  uint64_t generation;
  comm_t *c;               /* NULL once the generation ended */
  int own;                 /* the worker frees c at the generation's end (a split the program made) */
  struct newt_comm *host;  /* its host-memory companion's handle (itself for a CPU group) */
  struct newt_comm *next;  /* the worker's list of every handle */
};

typedef enum worker_phase {
  PHASE_JOINED,  /* joined, not registered yet */
  PHASE_WAITING, /* registered, waiting for a plan that names it a rank */
  PHASE_BUILT,   /* a generation's groups are built: the program declares and restores */
  PHASE_RUNNING, /* restored: steps */
  PHASE_OVER     /* done, left or failed: only newt_finish */
} worker_phase;

typedef enum step_phase { STEP_IDLE, STEP_BEGUN, STEP_COMMITTED } step_phase;

/* A worker. Its fields in groups, each filled by the file its heading names (others read it);
 * a group's comment says who else writes it. */
struct newt_ctx {
  /* --- what joining fills (api.c's options, join.c): fixed for the worker's life, but the
     spec, whose fields that may change while the job runs generation.c takes at a plan --- */
  worker_opts o;
  char *strings; /* the options' strings (one block) */
  char id[RDZV_NAME_MAX];
  char host[256];
  char domain[256]; /* its failure domain (registered; the host when none was given) */
  char addr[96]; /* ip:port of the data plane */
  int listen_fd; /* its socket, held for the worker's life */
  unsigned char *job_secret; /* from opts.secret_file (NULL: none) */
  size_t job_secret_len;
  job_auth auth;             /* the records' key made of it: what this rank says for itself is
                                proved with it, an end marker is believed only with its proof */
  ckpt_key ckpt_key;         /* the checkpoints' key made of it: its saves are proved with it, a
                                load takes only steps that prove it (has 0: no secret) */
  rdzv_etcd *etcd;
  newt_spec spec;
  char *spec_json;
  const newt_backend *backend; /* the spec's backend (common/backend.h): its device, its communicator */
  int device;    /* the GPU ordinal (registered with the host); -1: none */
  int device_set; /* newt_use_device was called (or not needed) */
  struct metrics *metrics;          /* --metrics-port (NULL: none) */
  FILE *sample_log; /* NEWT_SAMPLE_LOG_DIR: the samples of every step, for tests */
  int step_log_fd;  /* --step-log, appended to while rank 0 (-1: none) */

  /* --- etcd: the registration (publish.c) and the plan watch (watch.c) --- */
  rdzv_registration *reg;
  struct rdzv_gateway_client *gateway; /* the host agent's (publish.c: host_gateway); NULL: none */
  rdzv_etcd_watch *plan_watch;
  struct rdzv_gateway_watch *plan_gw; /* the host gateway's plan watch (watch.c); NULL: none */
  atomic_int plan_gw_closing;         /* worker_unwatch_plan: no etcd watch is started any more */

  /* --- what the program's thread shares with the watch and publisher threads --- */
  pthread_mutex_t mu; /* guards what the watch and publisher threads share: */
  pthread_cond_t cv;
  newt_plan latest;   /* the newest plan seen (generation 0: none) */
  uint64_t gen;       /* the generation we are in, or were last */
  comm_t *comm;       /* the running generation's communicator, for aborts */
  worker_pubq pub;     /* the newest value of each key the publisher writes (pubq.h) */
  int pub_stop;
  int pub_failing;     /* the publisher's last write failed (etcd away or full) */
  uint64_t pub_warned; /* monotonic ns it last said so */
  char pub_state[16]; /* a registration state to write ("" when none) */
  char pub_ack[JOB_ACK_MAX]; /* an acknowledgement to fold into the registration ("" none) */
  uint64_t pub_ack_gen;       /* the generation it acknowledges */
  int pub_ack_held;           /* 1: it waits for the registration's renewal (it was refused as
                                 no longer ours: the lease went) */
  pthread_t pub_thread;
  int pub_running;
  atomic_int switch_pending; /* a newer plan asks to switch at the next step boundary */
  atomic_int build_cancel;   /* a newer plan came while a communicator was being built */
  atomic_int lease_lost;
  atomic_int renewed; /* the registration was renewed since the last plan that made this worker a rank (fenced,
                        or its lease lapsed): a worker left out then proves its links (worker_prove_links) */
  atomic_int leave_asked;    /* newt_leave */
  _Atomic uint64_t step_started;    /* monotonic ns the step under way began (0: none; the
                                       health endpoint's thread reads it) */

  /* --- the generation (generation.c; peers.c for the survivors' own): its plan, this rank
     in it, its groups, its timings --- */
  worker_phase phase;
  newt_plan plan;        /* valid from PHASE_BUILT */
  newt_plan held_plan;   /* the plan of the last generation this rank trained in (its state's
                            holders: named when a state is lost) */
  const plan_rank *me;   /* in plan */
  int tp_rank, dp_rank, pp_rank;
  comm_t *all;           /* ranks and donors */
  comm_t *train;         /* the ranks (all itself without donors) */
  comm_t *tp, *dp, *pp;  /* NULL for a group of one */
  comm_t *peer_parent;   /* a generation the survivors made without etcd: the shrunk
                            communicator `all` was split from (NULL: none) */
  int peer_epoch;        /* 0: the generation is the leader's plan; k: the k-th the survivors
                            made of it without etcd (worker/peers.c) */
  uint64_t leader_gen;       /* the generation of the leader's plan taken last, and its salt: what a
                                rank says of that generation is proved with it, in the survivors' own
                                generation too (worker/peers.c: same number, a salt of their own) */
  unsigned char leader_salt[PLAN_SECRET_BYTES];
  newt_comm *comms;      /* every handle given out (all generations) */
  newt_comm *h_world, *h_tp, *h_dp, *h_pp;
  /* this generation's timings (wall ms) and where its state came from (state.c) */
  uint64_t t_plan_seen, t_comm, t_restore, t_first_step, t_detect;
  char restore_src[8];
  int64_t restore_step;
  report_recheck recheck; /* the last crash report's second look (peers.c) */

  /* --- the declared state (state.c; api.c declares): declared for the generation, and the
     previous generation's (a source of the restore, released by it) --- */
  worker_decl decl, prev;
  int has_state;      /* the state's declaration holds a whole state of live_step */
  int state_in_decl;  /* that declaration is decl (restored), else prev (decl being made) */
  int64_t live_step;  /* steps the declared state has done */
  int derived_stale;  /* the last step's post-update collectives failed: derived parts stale */
  int whole;          /* every rank holds everything: no copies needed */
  worker_copy snap;
  worker_copy rep[SPEC_REPLICAS_MAX]; /* rep[j]: the unique parts of data-parallel rank d-1-j
                                         (spec.fault.replicas of them, at most dp - 1) */
  newt_doc_write_fn doc_write;
  newt_doc_check_fn doc_check;
  void *doc_arg;
  char restore_err[JOB_TEXT_MAX]; /* this generation's newt_state_restore failed, and why ("": not so):
                                     the root cause of a step begun unrestored */

  /* --- replicas that disagree (verify.c) --- */
  worker_copy vsnap;       /* the newest verified state: every declared part, host memory (verify.c) */
  int64_t verified_step;   /* its step (-1: none) */
  int mismatch_rolled;     /* the last check disagreed and was rolled back; no check agreed since */
  int verify_next;         /* a check is due after the next step (a new job's first) */
  int64_t rollback_to;     /* a check rolled back to this verified step: the next begin starts the
                              generation again, restored from the verified copy (-1: none) */
  int64_t mismatches;      /* checks that disagreed (under warn: said, the first and every 100th) */
  char chaos_flip[160];    /* NEWT_CHAOS_FLIP, tests and chaos ("": none; read at the join) */
  char chaos_die[64];      /* NEWT_CHAOS_DIE, tests: "restored:G" (worker_chaos_die; "": none) */
  int chaos_flipped;

  /* --- the step (worker.c) --- */
  step_phase step;
  int64_t step_first, step_count;
  int leave_agreed, switch_agreed; /* what the last commit's sums said */
  int all_leave;                   /* ... every rank asked to leave, and the plan has no spare:
                                      no one is left to hand the state to */
  int leave_announced;             /* this rank said it leaves (its registration's state) */
  int first_step_of_gen;
  uint64_t wait_at_begin;  /* comm_thread_wait_ns when the step under way began */
  worker_speed speed;      /* the generation's ranks' speeds (speed.c), for the progress record */
  int progress_rank;       /* who writes the progress record: the lowest rank that reached etcd
                              at the last commit (every rank agrees: the commit's sums) */
  double t_last;           /* when the last step ended (s, monotonic) */
  /* the stall deadline of the generation's collectives follows the observed step times
     (worker_follow_steps): the last WORKER_STEP_TIMES of them, a generation's first left out */
#define WORKER_STEP_TIMES 64
  double step_s[WORKER_STEP_TIMES];
  int nstep_s, step_s_at;
  int64_t stall_ms;        /* the deadline set on the generation's communicators (0: the cap) */
  int64_t done_step;      /* the newest step this rank completed */
  int64_t committed_step; /* the newest step every rank completed, as far as this rank knows */
  double last_loss;
  job_step last_step;   /* the step log's line of the last step this rank did */
  int last_step_logged; /* ... and whether this rank wrote it */

  /* --- progress published (publish.c) --- */
  uint64_t progress_ms;      /* wall ms it last published progress */
  double last_tps;           /* the newest progress this rank published: its throughput ... */
  int64_t last_step_tokens;  /* ... and a step's tokens (the last step's progress, with the end marker) */

  /* --- checkpoints (save.c) --- */
  ckpt_saver *saver; /* this generation's (save.c) */
  ckpt_lock *ckpt_lock; /* the job's lock of its checkpoint directory, held from the first saver on */
  int stage_fill_due;      /* the saver's staging is to be reserved in the pool by a thread
                              started after the generation's first step */
  int stage_filling;       /* that thread runs (joined before a save begins) */
  atomic_int stage_filled; /* that thread has reserved what it was to (or given up) */
  pthread_t stage_fill;
  worker_pinned *pinned; /* host staging of device memory the host cannot touch (pinned.c) */
  int64_t ckpt_failed_step, ckpt_published;
  int64_t ckpt_skipped; /* saves this worker skipped, its previous one still being written (rank
                           0's count reaches the summary in the ckpt record) */
  job_ckpt ckpt_pub;    /* the ckpt record rank 0 last published (written again at each skip) */
  char ckpt_refused[600];    /* the last load found committed checkpoints, none proving the key:
                                why, naming the newest one's MANIFEST ("": not so) */

  /* --- the end (worker.c, wait.c; finish.c says it) --- */
  newt_next over;          /* PHASE_OVER: how */
  int failed;                       /* the leader gave up on the job (the failed record) */
  char failed_why[JOB_TEXT_MAX];
  job_done end_marker;              /* the job's end marker, when this worker learned of the end from
                                       it (waiting for a plan: it did not train the last step) */
  int have_end_marker;
  int trained_last;                 /* this rank trained the job's last step (its loss is the job's) */
  int end_now;                      /* the restart mode: the job ends done at the step last ended
                                       (worker_end_job_now, worker/bridge.h) */
  job_end end;                      /* how it ended (newt_finish) */
};

/* --- the step protocol (worker.c) ------------------------------------------------------------ */

newt_result_t worker_begin(worker *w, newt_batch *b, newt_next *next);
newt_result_t worker_commit(worker *w, const double *values, double *sums, int n);
newt_result_t worker_end(worker *w, const newt_step_result *r);
/* After a restore: the generation runs (its saver, the step log's last line). */
newt_result_t worker_restored(worker *w);
/* Test hook: NEWT_CHAOS_DIE=restored:G kills this worker (SIGKILL) right after its restore of
 * generation G filled its parts, before the restore's own check (its peers' check is cut). */
void worker_chaos_die(worker *w);

/* --- joining (join.c) -------------------------------------------------------------------------- */

/* Joins: the spec, the backend and device, the data-plane socket, metrics; not registered yet. */
newt_result_t worker_join(worker *w);
/* Labels every series this worker serves with its id and rank (-1: none, a spare). */
newt_result_t worker_label_metrics(worker *w, int rank);

/* --- the plan watch (watch.c) ------------------------------------------------------------------ */

/* The plan as it is, then every change after the revision it was read at. */
newt_result_t worker_watch_plan(worker *w);
/* Ends the plan watch (the gateway's, then etcd's). */
void worker_unwatch_plan(worker *w);
/* Whether plan p ends the running generation at once rather than at the next step boundary. */
int worker_plan_drops_now(const newt_plan *p, const char *id);

/* --- waiting for a plan (wait.c) --------------------------------------------------------------- */

typedef enum wait_outcome { WAIT_PLAN, WAIT_LEAVE, WAIT_DONE, WAIT_FAILED } wait_outcome;
/* Waits for a plan newer than the worker's generation naming it a rank (donor: a donor), a
 * leave asked for (a rank gives up at until, a donor at its own bound), or the job's end. */
newt_result_t worker_wait_plan(worker *w, int donor, newt_deadline_t until, newt_plan *out, wait_outcome *how);
/* A donor's generation of plan p: its communicator (c, or built here; parent freed after),
 * this worker's state handed to its ranks. */
void worker_donate_on(worker *w, newt_plan *p, comm_t *c, comm_t *parent);
/* A leaving rank hands its state to the next generation's ranks before it goes. */
void worker_hand_over(worker *w);

/* --- a generation (generation.c) --------------------------------------------------------------- */

/* The communicator of plan p's ranks, then its donors, over the spec's backend. */
newt_result_t worker_build_comm(worker *w, const newt_plan *p, const plan_rank *me, int *missing, comm_t **out);
/* Builds the generation of plan p (taken over): 1 when it stands (PHASE_BUILT), 0 when it
 * never formed (reported). built/parent: the survivors' own communicator, else NULL. */
int worker_start_generation(worker *w, newt_plan *p, comm_t *built, comm_t *parent);
/* The declaration that holds the state becomes the next restore's source; PHASE_BUILT. */
void worker_await_declaration(worker *w);
/* Reports the running generation's failed collective: whom this rank lost. */
void worker_report_failure(worker *w);
/* Ends the generation: its groups freed, every handle of it stale. */
void worker_end_generation(worker *w);
/* The handle of a group of the running generation. */
newt_comm *worker_comm_handle(worker *w, comm_t *c, int own);

/* --- finishing (finish.c) ---------------------------------------------------------------------- */

/* Ends the worker's part; the exit status. Frees w. */
int worker_finish(worker *w, newt_result_t r);

/* --- checkpoints (save.c) -------------------------------------------------------------------- */

/* A saver per generation; a save after each step that is a multiple of spec.ckpt.every
 * (every rank its primary parts, rank 0 commits). */
newt_result_t worker_ckpt_generation(worker *w);
newt_result_t worker_ckpt_step(worker *w);
/* The job ends after live_step: it trained its last step, or the whole job stops (every rank
 * leaves at once: w->all_leave, and no one stays to take the state). Every rank saves that
 * step, whatever spec.ckpt.every says, and waits for it (rank 0: until committed) before it
 * ends, so a run on the directory takes up the job where it ended; an error says the step,
 * `why` and that the newest checkpoint stays the one to resume from. Nothing without a
 * checkpoint directory. */
newt_result_t worker_ckpt_final(worker *w, const char *why);
void worker_ckpt_free(worker *w);
/* Every rank reads its own parts of the newest checkpoint that reads back whole; they
 * check they read one step. NEWT_ERR_NOTFOUND when there is none. */
newt_result_t worker_ckpt_load(worker *w, comm_t *c, int64_t *step);

/* --- the state (state.c) --------------------------------------------------------------------- */

newt_result_t worker_declare(worker *w, const reshard_piece *p);
/* Makes the newest whole state the state of every rank of the generation. */
newt_result_t worker_restore(worker *w, newt_restore_info *out);
newt_result_t worker_snapshot(worker *w);
newt_result_t worker_replicate(worker *w);
/* A copy's buffers laid out for the given pieces, in one block of the device's memory (dev)
 * or the host's (step -1 until filled); freed (step -1, nothing held). */
newt_result_t worker_copy_layout(worker *w, worker_copy *cp, int dev, const reshard_piece *src, size_t n);
void worker_copy_free(worker *w, worker_copy *cp);

/* --- replicas that disagree (verify.c) ----------------------------------------------------- */

/* A check of the replicated state (docs/elastic.md, "Replicas that disagree"), at the end of
 * a step (after its update, before its checkpoint, replicas and log line) when it is due --
 * every spec.fault.verify_every steps and at every checkpoint's step -- and right after a
 * restore (at_restore): each rank fingerprints the parts its data-parallel group holds alike
 * and the ranks compare them. Agreement: the state is kept as the verified copy. A
 * disagreement is said (log, the mismatch record) and spec.fault.on_mismatch acts: warn goes
 * on; rollback drops every copy newer than the verified one (*rolled_back 1): the next
 * newt_step_begin says NEXT_GENERATION, the program restores, and the restore takes the
 * verified copy; fail -- or a disagreement there is nothing to roll back to, or that came back right
 * after a rollback (the program's own code: drift) -- fails the job (w->failed,
 * NEWT_ERR_ABORTED). Collective over the generation's ranks. */
newt_result_t worker_verify(worker *w, int at_restore, int *rolled_back);
/* The chaos flip (NEWT_CHAOS_FLIP="R:N[:TENSOR]", newt run --chaos flip:rank:R@step=N): once
 * this worker is rank R and has done step N, one bit of one element of the tensor (else of
 * its first replicated part) is flipped in place, in the memory it lives in. */
void worker_chaos_flip(worker *w);
/* A leaving rank's part of the restore: it gives what it holds and needs nothing. */
newt_result_t worker_donate(worker *w, comm_t *c);

/* peers.c: a crash while etcd is away. 1 when the survivors of the failed generation made
 * the next among themselves: *out its plan (same generation number), *all its communicator
 * (ranks, then donors), *parent the one to free after it (NULL: none). 0: wait for etcd. */
int worker_peer_recover(worker *w, newt_plan *out, comm_t **all, comm_t **parent);
/* Probes the data-plane listeners of the plan's ranks (this rank's own left out) for at most
 * ms: state[r] 1 accepted, 0 refused (its process is gone: a worker holds its listener for
 * life), -1 no answer or unknown (comm_probe_listeners). */
newt_result_t worker_probe_ranks(worker *w, int64_t ms, int *state);
/* A worker that was a rank and is left out of the plan in force (cut off, or on the smaller
 * side of a partition) connects to every rank of that plan, at most every
 * NEWT_PEER_PROBE_MS, until all answered, and writes how many did in links/<id> (job_links)
 * on its lease, once for each plan and again when that changes: the leader lets it back at
 * once when all did, and keeps it out while they do not. Called from the wait for a plan;
 * lp starts zeroed. */
#define LINKS_TIMED 8 /* the ranks of a plan whose links a worker left out times */
typedef struct links_proof {
  uint64_t gen;     /* the plan it last said something of */
  int ok;           /* whether all that plan's ranks answered, and its links to them are well */
  uint64_t next_ms; /* wall ms of the next try */
  uint64_t timed_gen;          /* the plan the streaks are of */
  int well[LINKS_TIMED];       /* rounds in a row each timed rank's link was well */
} links_proof;
void worker_prove_links(worker *w, links_proof *lp);
/* A crash report's second look. A host's workers die together, and the first probe may come
 * before the kernel closed a dying one's listener (its exit unmaps a large address space
 * before it closes its files), so the report names one and the leader waits out its report
 * window for the rest. worker_recheck_start keeps the report and the ranks that still
 * listened on a host that lost one (state: worker_probe_ranks'); worker_recheck, called
 * from the wait for a plan, probes them again 10 to 300 ms after the detection and
 * writes the report again, naming every rank gone; it returns the ms until its next look (-1:
 * none left). */
void worker_recheck_start(worker *w, const int *state, int hang, const char *const *accused, int naccused,
                          const char *why);
int64_t worker_recheck(worker *w);
void worker_recheck_free(worker *w);
/* The key the links of p's generation prove (COMM_SECRET_MAX bytes room; *len set). */
newt_result_t worker_generation_key(const worker *w, const newt_plan *p, unsigned char *key, size_t *len);
void worker_decl_free(worker_decl *d);
void worker_state_free(worker *w);

/* --- memory (mem.c) ---------------------------------------------------------------------------- */

/* The built-in memories: the host's (data is host memory) and, with CUDA, the runtime's on
 * a stream of one device. */
void worker_mem_host(newt_memory *m);
newt_result_t worker_mem_cuda(newt_memory *m, int device, void *stream);
void worker_mem_release(newt_memory *m);
/* Queues a copy (kind 0 device to device, 1 device to host, 2 host to device). */
static inline void worker_mem_copy(const newt_memory *m, void *dst, const void *src, size_t bytes, int kind) {
  m->copy(m->ctx, dst, src, bytes, kind);
}
static inline newt_result_t worker_mem_sync(const newt_memory *m) { return m->sync(m->ctx); }

/* --- pinned host memory (pinned.c) ---------------------------------------------------------- */

/* A pool of host_alloc blocks of one memory, kept when given back and handed out again
 * (the smallest free block that fits), so a GPU worker pins its staging once per run, not
 * per generation or recovery. Thread-safe. */
typedef struct worker_pinned_stats {
  uint64_t allocs; /* host_alloc calls made */
  uint64_t reused; /* requests a kept block met */
  size_t blocks, bytes; /* held now (in use or free) */
} worker_pinned_stats;
newt_result_t worker_pinned_init(worker_pinned **out, const newt_memory *mem);
/* At least bytes of host memory of the pool's device, aligned to CKPT_STAGING_ALIGN. */
newt_result_t worker_pinned_get(worker_pinned *p, size_t bytes, void **out);
/* 1 when a free block of at least bytes is kept (a get of it allocates nothing). */
int worker_pinned_has(worker_pinned *p, size_t bytes);
/* Makes the pool keep a free block of at least bytes, so that a later get of that size
 * allocates nothing; any thread. */
newt_result_t worker_pinned_reserve(worker_pinned *p, size_t bytes);
/* Gives a block back to the pool (NULL: nothing). */
void worker_pinned_put(worker_pinned *p, void *ptr);
void worker_pinned_stats_get(worker_pinned *p, worker_pinned_stats *st);
/* Frees the blocks (a block still in use is left alone). */
void worker_pinned_free(worker_pinned *p);
/* ckpt_saver_opts.staging_alloc / staging_free over a pool (ctx: the worker_pinned). */
void *worker_pinned_staging_alloc(void *ctx, size_t bytes);
void worker_pinned_staging_free(void *ctx, void *ptr);
/* The worker's pool, made on first use. */
newt_result_t worker_pinned_of(worker *w, worker_pinned **out);
/* Host staging of the worker's device memory, from its pool (given back with
 * worker_stage_release; NULL: nothing). */
newt_result_t worker_stage_get(worker *w, size_t bytes, void **out);
void worker_stage_release(worker *w, void *stage);

/* 1 when the worker is asked to leave (a signal it handles, or newt_leave). */
static inline int worker_stop_asked(worker *w) {
  return atomic_load(&w->leave_asked) || (w->o.handle_signals && newt_stop_requested());
}

/* Whether a part's memory is the device's (not the host's): staged to move or save. */
static inline int worker_part_on_device(const worker *w, const worker_part *p) {
  return !w->o.memory.host_visible && (p->p.flags & WORKER_PART_DEVICE);
}

/* The data cursor: samples consumed by the steps done. */
static inline uint64_t worker_cursor(const worker *w) {
  return (uint64_t)w->live_step * (uint64_t)w->spec.global_batch;
}

/* Waits on the worker's condition variable for at most ms (called with mu held). */
static inline void worker_wait_cv(worker *w, long ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += ms * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_cond_timedwait(&w->cv, &w->mu, &ts);
}

/* --- etcd (publish.c) ------------------------------------------------------------------- */

/* Registers under workers/<id> (retrying while an earlier registration of the same id
 * lives out its lease); a lost lease is renewed by the publisher. */
newt_result_t worker_register(worker *w);
newt_result_t worker_publisher_start(worker *w);
/* Writes what is still queued (bounded by a lease TTL and 3 s), then stops the thread. */
void worker_publisher_stop(worker *w);
/* The registration's state ("training", "leaving", ...), written now / by the publisher. */
newt_result_t worker_set_state(worker *w, const char *state);
void worker_set_state_async(worker *w, const char *state);
/* A failed generation (hang: no progress by the deadline; else a crash; build: it never
 * formed), whom it lost (none: it cannot tell) and why; queued for the publisher, which
 * writes it at once on the registration lease (or when etcd answers again). */
void worker_report(worker *w, const newt_plan *p, int hang, int build, const char *const *accused, int naccused,
                   const char *why);
/* The job fails in generation p (its state lost, spec.fault.on_state_loss; its replicas
 * disagree, spec.fault.on_mismatch): a report whose `fatal` says why, from which the leader
 * fails the job. Queued like any report. */
void worker_report_fatal(worker *w, const newt_plan *p, const char *why);
/* Replicas disagreed at `step` (verify.c): a report whose `mismatch` says it, what was done
 * (action: rollback, warn, fail) and the step training went on from; the leader makes it an
 * event, and for fail also fails the job (the report's `fatal`: one key per rank and
 * generation, so one report says both). Queued like any report. */
void worker_publish_mismatch(worker *w, int64_t step, int64_t back_to, const char *action, const char *why);
/* The acknowledgement of the generation (after its first step), folded into the update of
 * the registration that says `state` (NULL: the state stays), so that taking up a generation
 * costs one write; progress (at most every NEWT_PROGRESS_MS, and always the last step), the
 * newest committed checkpoint. */
void worker_publish_ack(worker *w, const char *state);
void worker_publish_progress(worker *w, double loss, double tps, int64_t step_tokens);
void worker_publish_ckpt(worker *w, int64_t step, int64_t bytes, int64_t save_ms, double stall_ms);
/* The ckpt record again (rank 0, once it published one), with this worker's count of skipped
 * saves. */
void worker_publish_ckpt_skips(worker *w);
void worker_publish_links(worker *w, const job_links *l);
/* The end marker (every rank after the last step, the first write wins), written at once. */
void worker_mark_done(worker *w, double loss);
/* Waits until the publisher has written everything queued so far, or until d. */
void worker_publisher_flush(worker *w, newt_deadline_t d);
/* How long the end waits for etcd (NEWT_DONE_WAIT_MS, 10 min): the end marker, and the leader's
 * plan for a generation the survivors made without etcd (worker.c). */
int64_t worker_done_wait_ms(void);

#endif
