/* The coordinator: campaigns for leadership of a job; the leader turns membership into
 * plans, detects failures (survivors' reports, expired leases, stalled steps), fences
 * failed workers, records events and recovery timings in etcd and serves Prometheus
 * metrics. Any number may run: one leads, the others stand by and take over within the
 * lease TTL. Training never waits for a coordinator: only changes of membership do.
 * docs/elastic.md describes the protocol. */
#ifndef NEWT_COORDINATOR_COORDINATOR_H
#define NEWT_COORDINATOR_COORDINATOR_H

#include "common/err.h"
#include "job/records.h"
#include "rendezvous/etcd.h"

typedef struct coordinator_opts {
  rdzv_etcd_opts etcd;
  const char *job;
  const char *id;           /* shown in the election and in events */
  const char *spec_file;    /* stored in etcd when the job has no spec yet; may be NULL */
  const char *metrics_addr; /* comma-separated IPv4 addresses; NULL: 127.0.0.1 */
  int metrics_port;         /* 0: no metrics server */
  int metrics_linger_ms;    /* after the job's end, serves its final metrics this long (0: exits at once) */
  job_end *end;             /* how it ended (exit status and message); may be NULL */
  const char *event_log;    /* the leader appends every event it posts here too (job/runlog.h's
                               event log, for `newt report`; its folder is made); NULL: none */
  const char *secret_file;  /* the job secret (newt_secret_read's checks): a report, an
                               acknowledgement, a links record or the end marker counts only when
                               it proves it (job_report_check, ...); NULL or "": none, the previous
                               release's records counted as they are */
} coordinator_opts;

/* Runs until the job is done (NEWT_OK, end JOB_EXIT_DONE), failed (NEWT_OK, JOB_EXIT_FAILED:
 * this coordinator's failure budget ran out, or another's did), or SIGTERM/SIGINT (resigns,
 * NEWT_OK, JOB_EXIT_LEFT); after the job's end it serves its final metrics (the leader's
 * say how the job ended) for metrics_linger_ms before it returns (a signal cuts it short).
 * While it runs, the leader re-reads spec_file every 5 s and takes a changed one as
 * coordinator_put_spec does (a ConfigMap updated by `helm upgrade`). */
newt_result_t coordinator_run(const coordinator_opts *o);

/* Stores the spec of `file` for job (validated first; errors name the file and field).
 * An identical spec already there is fine; one that differs only in fields that can change
 * while the job runs (spec_update_allowed) replaces it, and the leader takes it at the
 * next step boundary (*changed, when not NULL, says what changed; cap its size); any other
 * difference is NEWT_ERR_CONFLICT naming the field and what to do. */
newt_result_t coordinator_put_spec(rdzv_etcd *c, const char *job, const char *file, char *changed, size_t cap);

#endif
