/* The worker's state, shared by its files (worker.c: life and generations; restore.c:
 * where a generation's state comes from). */
#ifndef NEWT_WORKER_INTERNAL_H
#define NEWT_WORKER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "ckpt/ckpt.h"
#include "comm/comm.h"
#include "coordinator/plan.h"
#include "coordinator/spec.h"
#include "model/loader.h"
#include "model/train.h"
#include "rendezvous/rdzv.h"
#include "worker/worker.h"

#define WORKER_PUB_SLOTS 8

typedef struct worker {
  const worker_opts *o;
  char id[RDZV_NAME_MAX];
  char host[256];
  char addr[96]; /* ip:port of the data plane */
  rdzv_etcd *etcd;
  newt_spec spec;
  model_tokens tok;
  model_loader ld;
  model_trainer tr;
  int have_tok, have_tr;
  int has_state;     /* tr holds a whole training state (of step tr.step) */
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
    int64_t lease;
  } pub[WORKER_PUB_SLOTS];
  int pub_stop;
  char pub_state[16]; /* a registration state to write ("" when none) */

  pthread_t pub_thread;
  int pub_running;
  atomic_int switch_pending; /* a newer plan asks to switch at the next step boundary */
  atomic_int lease_lost;

  /* this generation's timings (wall ms) and where its state came from */
  uint64_t t_plan_seen, t_comm, t_restore, t_first_step, t_detect, progress_ms;
  char restore_src[8];
  int64_t restore_step;
  double last_loss;
  FILE *sample_log; /* NEWT_SAMPLE_LOG_DIR: the samples of every step, for tests */
  ckpt_saver *saver; /* this generation's (ckpt.c) */
  int64_t ckpt_failed_step, ckpt_published;
  int leave_announced;
} worker;

/* Checkpoints (ckpt.c): a saver per generation; a save after each step that is a multiple
 * of spec.ckpt.every; loading the newest valid checkpoint of spec.ckpt.dir into the trainer
 * (*step its step; NEWT_ERR_NOTFOUND when there is none). */
newt_result_t worker_ckpt_generation(worker *w, const newt_plan *p, const plan_rank *me);
newt_result_t worker_ckpt_step(worker *w, const newt_plan *p, const plan_rank *me);
newt_result_t worker_ckpt_load(worker *w, int64_t *step);
void worker_ckpt_free(worker *w);

/* Makes the newest whole state the state of every rank of p (restore.c). */
newt_result_t worker_restore(worker *w, comm_t *c, const newt_plan *p);

void worker_abort_comm(worker *w, const char *why);
void worker_publish(worker *w, const char *key, char *value, int64_t lease);
newt_result_t worker_set_state(worker *w, const char *state);
/* The same, written by the publisher thread: never holds up a step. */
void worker_set_state_async(worker *w, const char *state);

#endif
