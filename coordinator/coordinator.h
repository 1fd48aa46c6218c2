/* The coordinator: campaigns for leadership of a job; the leader turns membership into
 * plans, detects failures (survivors' reports, expired leases, stalled steps), fences
 * failed workers, records events and recovery timings in etcd and serves Prometheus
 * metrics. Any number may run: one leads, the others stand by and take over within the
 * lease TTL. Training never waits for a coordinator: only changes of membership do.
 * docs/elastic.md describes the protocol. */
#ifndef NEWT_COORDINATOR_COORDINATOR_H
#define NEWT_COORDINATOR_COORDINATOR_H

#include "common/err.h"
#include "rendezvous/etcd.h"

typedef struct coordinator_opts {
  rdzv_etcd_opts etcd;
  const char *job;
  const char *id;           /* shown in the election and in events */
  const char *spec_file;    /* stored in etcd when the job has no spec yet; may be NULL */
  const char *metrics_addr; /* NULL: 0.0.0.0 */
  int metrics_port;         /* 0: no metrics server */
} coordinator_opts;

/* Runs until the job is done (NEWT_OK) or SIGTERM/SIGINT (resigns, NEWT_OK). */
newt_result_t coordinator_run(const coordinator_opts *o);

/* Stores the spec of `file` for job (validated first; errors name the file and field).
 * An identical spec already there is fine; a different one is NEWT_ERR_CONFLICT. */
newt_result_t coordinator_put_spec(rdzv_etcd *c, const char *job, const char *file);

#endif
