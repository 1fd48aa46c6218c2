/* The worker: one training process of an elastic job (docs/elastic.md).
 *
 * It registers under /newt/<job>/workers/<id> on a lease, follows the leader's plans, and
 * for each generation it belongs to: builds the communicator the plan describes, restores
 * the newest whole state from the cheapest source (its own memory, a peer's, the newest
 * checkpoint, or the seed), acknowledges, and trains until the job is done, a collective
 * fails (it reports whom it lost and waits for the next plan), a new plan asks for a
 * switch, or SIGTERM asks it to leave (at the next step boundary, with no step lost). */
#ifndef NEWT_WORKER_WORKER_H
#define NEWT_WORKER_WORKER_H

#include "common/err.h"
#include "job/records.h"
#include "job/spec.h"
#include "model/train.h"
#include "rendezvous/etcd.h"

typedef struct worker_opts {
  rdzv_etcd_opts etcd;
  const char *job;
  const char *id;   /* unique in the job */
  const char *host; /* workers with the same host use shared memory */
  const char *addr; /* IP peers reach this worker at; the data plane binds it */
  int port;         /* data-plane port; 0: a free one */
  int device;       /* CUDA device; -1: CPU */
  int share_device; /* 1: other workers that say so too may train on this GPU (the coordinator
                       then lets them; NCCL needs each its own NCCL_HOSTID: docs/elastic.md,
                       "GPU workers on one host") */
  int threads;      /* compute threads */
  int64_t spec_wait_ms; /* how long to wait for the job's spec to appear in etcd */
  const char *secret_file; /* the job's secret (16 to 4096 bytes): each generation's data-plane
                              key is derived from it and the plan's salt, so etcd holds no key
                              (NULL: the plan's salt is the key, as etcd shows it) */
  const char *step_log; /* while rank 0, append a line per step here (job/runlog.h); NULL: none */
  const char *metrics_addr; /* metrics and /healthz: comma-separated IPv4 addresses (NULL: 127.0.0.1) */
  int metrics_port;         /* 0: no metrics server */
  job_end *end;             /* how it ended (exit status and message); may be NULL */
} worker_opts;

/* Runs the worker until the job is done (NEWT_OK, end JOB_EXIT_DONE), it left gracefully
 * on SIGTERM (NEWT_OK, JOB_EXIT_LEFT), the job failed (NEWT_OK, JOB_EXIT_FAILED: the
 * leader gave up on it), or a fatal error (bad spec, etcd unreachable for good).
 *
 * With metrics_port it serves its own metrics (step time, tokens/s, communicator builds,
 * its etcd requests) and /healthz, unhealthy while one step has taken longer than
 * spec.fault.hang_timeout_ms (a stuck step loop). */
newt_result_t worker_run(const worker_opts *o);

/* The trainer configuration a job spec asks for (model, optimizer, batch, data seeds):
 * the same one `newt train` builds from its flags, so the two follow one trajectory. */
newt_result_t worker_train_config(const newt_spec *s, int threads, model_train_config *out);

/* The token stream a spec names: its token file, or the generated corpus. */
newt_result_t worker_open_data(const newt_spec *s, model_tokens *tok);

#endif
