/* The worker's state, shared by its files. Arrows go one way, from the top:
 *
 *   worker.c    life: setup, the plan watch, waiting for plans, generations, the step loop
 *   save.c      the periodic checkpoints of a generation (uses publish.c for the pointer)
 *   state.c     the training state: restore (memory, peers, checkpoint, seed), the pre-step
 *               snapshot, the ZeRO shard replica, a leaver's hand-over (uses reshard.c)
 *   publish.c   everything the worker writes to etcd (job/records.h), off the step's path
 *   reshard.c   moving pieces of a flat state between layouts (reshard.h)
 *   pinned.c    the pool of pinned host memory save.c and state.c stage through on a GPU */
#ifndef NEWT_WORKER_INTERNAL_H
#define NEWT_WORKER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "ckpt/ckpt.h"
#include "comm/comm.h"
#include "job/plan.h"
#include "job/records.h"
#include "job/spec.h"
#include "model/loader.h"
#include "model/parallel.h"
#include "model/train.h"
#include "rendezvous/rdzv.h"
#include "worker/reshard.h"
#include "worker/worker.h"

#define WORKER_PUB_SLOTS 8

typedef struct worker_pinned worker_pinned;

/* A copy of some of a rank's pieces, of one step (state.c): its pre-step snapshot, or the
 * replica of its data-parallel neighbour's ZeRO shard. step -1: none. */
typedef struct worker_copy {
  reshard_piece *pieces;
  size_t n;
  model_dev *dev; /* the device data is memory of (the snapshot); NULL: host memory (the replica) */
  float *data;
  float *spare; /* the replica's second buffer: the next one is received there, and the two
                   swap once it is whole, so a transfer cut short leaves the old one */
  size_t len;
  int64_t step;
  int64_t spare_step; /* the step of the replica the spare holds since the last swap (the one
                         before the newest), -1 once the next transfer started writing it */
} worker_copy;

typedef struct worker {
  const worker_opts *o;
  char id[RDZV_NAME_MAX];
  char host[256];
  char addr[96]; /* ip:port of the data plane */
  int listen_fd; /* its socket, held for the worker's life */
  unsigned char *job_secret; /* from opts.secret_file (NULL: none) */
  size_t job_secret_len;
  rdzv_etcd *etcd;
  newt_spec spec;
  model_tokens tok;
  model_loader ld;
  model_train_config tcfg;
  int have_tok;
  model_dev *dev;      /* the device the trainer runs on (model/dev.h): a GPU with backend nccl */
  int device;          /* its GPU ordinal (registered with the host); -1: none named */
  model_par par;       /* this rank's part of the model for the current layout (state.c) */
  int have_par;
  int has_state;       /* par holds a whole training state (of step par.step) */
  model_par_comms comms; /* the current generation's groups */
  worker_copy snap, rep;
  int32_t *inputs, *targets; /* this rank's slice of a step: at most the global batch */
  rdzv_registration *reg;
  rdzv_etcd_watch *plan_watch;

  pthread_mutex_t mu; /* guards what the watch and publisher threads share: */
  pthread_cond_t cv;
  newt_plan latest;   /* the newest plan seen (generation 0: none) */
  uint64_t gen;       /* the generation we are in, or were last */
  comm_t *comm;       /* the running generation's communicator, for aborts */
  struct {
    char key[256];
    char *value; /* NULL: free slot */
    int on_lease; /* written on the registration's lease (the one it has when written) */
  } pub[WORKER_PUB_SLOTS];
  int pub_stop;
  int pub_failing;     /* the publisher's last write failed (etcd away or full) */
  uint64_t pub_warned; /* monotonic ns it last said so */
  char pub_state[16]; /* a registration state to write ("" when none) */

  pthread_t pub_thread;
  int pub_running;
  atomic_int switch_pending; /* a newer plan asks to switch at the next step boundary */
  atomic_int build_cancel;   /* a newer plan came while a communicator was being built */
  atomic_int lease_lost;

  /* this generation's timings (wall ms) and where its state came from */
  uint64_t t_plan_seen, t_comm, t_restore, t_first_step, t_detect, progress_ms;
  char restore_src[8];
  int64_t restore_step;
  int64_t done_step; /* the newest step this rank completed (applied, and with ZeRO its shard
                        copied to the next rank); a failed step may have advanced par.step */
  int64_t committed_step; /* the newest step every rank completed, as far as this rank knows
                             (the end of the next step's collective says so) */
  double last_loss;
  FILE *sample_log; /* NEWT_SAMPLE_LOG_DIR: the samples of every step, for tests */
  int step_log_fd;  /* --step-log, appended to while rank 0 (-1: none) */
  job_step last_step;   /* the step log's line of the last step this rank did */
  int last_step_logged; /* ... and whether this rank wrote it */
  ckpt_saver *saver; /* this generation's (save.c) */
  int stage_fill_due;      /* the saver's staging is to be reserved in the pool by a thread
                              started after the generation's first step */
  int stage_filling;       /* that thread runs (joined before a save begins) */
  pthread_t stage_fill;
  worker_pinned *pinned; /* host staging of a device the host cannot touch (pinned.c); NULL: none yet */
  int64_t ckpt_failed_step, ckpt_published;
  int leave_announced;
  struct metrics *metrics;          /* --metrics-port (NULL: none) */
  _Atomic uint64_t step_started;    /* monotonic ns the step under way began (0: none) */
  int failed;                       /* the leader gave up on the job (the failed record) */
  char failed_why[JOB_TEXT_MAX];
} worker;

/* Checkpoints (save.c): a saver per generation; a save after each step that is a multiple
 * of spec.ckpt.every (every rank its primary pieces, rank 0 commits). */
newt_result_t worker_ckpt_generation(worker *w, const newt_plan *p, const plan_rank *me);
newt_result_t worker_ckpt_step(worker *w, const newt_plan *p, const plan_rank *me);
void worker_ckpt_free(worker *w);

/* The training state (state.c): makes the newest whole state the state of every rank of
 * p under layout pc (resharding in memory, else the checkpoint, else the seed); the
 * pre-step snapshot; the replica of the data-parallel neighbour's ZeRO shard. The trainer's
 * pieces are memory of w->dev: the snapshot stays there (device-to-device copies), the
 * replica is host memory, and resharding, checkpoints and the replica's transfers go
 * through host staging unless the device's memory is the host's (model_dev_host_visible). */
newt_result_t worker_restore(worker *w, comm_t *c, const newt_plan *p, const model_par_config *pc);
newt_result_t worker_snapshot(worker *w);
newt_result_t worker_replicate(worker *w);
/* A leaving rank's part of the restore: it gives what it holds and needs nothing. */
newt_result_t worker_donate(worker *w, comm_t *c);
void worker_state_free(worker *w);

/* Pinned host memory (pinned.c): a pool of model_dev_host_alloc blocks of one device, kept
 * when given back and handed out again (the smallest free block that fits), so a GPU
 * worker pins its staging once per run, not per generation or recovery. Thread-safe. */
typedef struct worker_pinned_stats {
  uint64_t allocs; /* model_dev_host_alloc calls made */
  uint64_t reused; /* requests a kept block met */
  size_t blocks, bytes; /* held now (in use or free) */
} worker_pinned_stats;
newt_result_t worker_pinned_init(worker_pinned **out, model_dev *dev);
/* At least bytes of host memory of the pool's device, aligned to CKPT_STAGING_ALIGN. */
newt_result_t worker_pinned_get(worker_pinned *p, size_t bytes, void **out);
/* 1 when a free block of at least bytes is kept (a get of it allocates nothing). */
int worker_pinned_has(worker_pinned *p, size_t bytes);
/* Makes the pool keep a free block of at least bytes (allocating it, outside the pool's lock,
 * unless one is kept), so that a later get of that size allocates nothing; any thread. */
newt_result_t worker_pinned_reserve(worker_pinned *p, size_t bytes);
/* Gives a block back to the pool (NULL: nothing). */
void worker_pinned_put(worker_pinned *p, void *ptr);
void worker_pinned_stats_get(worker_pinned *p, worker_pinned_stats *st);
/* Frees the blocks (before the device is closed; a block still in use is left alone). */
void worker_pinned_free(worker_pinned *p);
/* ckpt_saver_opts.staging_alloc / staging_free over a pool (ctx: the worker_pinned). */
void *worker_pinned_staging_alloc(void *ctx, size_t bytes);
void worker_pinned_staging_free(void *ctx, void *ptr);
/* The worker's pool, made on first use for dev (its device). */
newt_result_t worker_pinned_of(worker *w, model_dev *dev, worker_pinned **out);

/* The data cursor: samples consumed by the steps done. */
static inline uint64_t worker_cursor(const worker *w) {
  return (uint64_t)w->par.step * (uint64_t)w->spec.global_batch;
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
 * formed), whom it lost (none: it cannot tell) and why; queued for the publisher, which writes it at once on the
 * registration lease (or when etcd answers again). */
void worker_report(worker *w, const newt_plan *p, int hang, int build, const char *const *accused, int naccused,
                   const char *why);
/* The acknowledgement of p (after its first step), progress (at most every
 * NEWT_PROGRESS_MS, and always the last step), the newest committed checkpoint. */
void worker_publish_ack(worker *w, const newt_plan *p, const plan_rank *me);
void worker_publish_progress(worker *w, const newt_plan *p, double loss, double tps);
void worker_publish_ckpt(worker *w, int64_t step, int64_t bytes, int64_t save_ms, double stall_ms);
/* The end marker (rank 0 after the last step), written at once. */
void worker_mark_done(worker *w, double loss);

#endif
