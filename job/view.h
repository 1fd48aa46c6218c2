/* One typed picture of a job: what the coordinator, `newt run` and `newt status` read of
 * /newt/<job>/, so that none of them parses a key or decodes a record itself.
 *
 *   job_change  one key of the job decoded by its record's codec (records.h, spec.h,
 *               plan.h): which record it is, the parts of its key (the worker's id, the
 *               generation), its lease and revisions, and the record as a struct.
 *   job_view    the picture those changes make: the newest spec, plan, progress, end,
 *               failure and checkpoint pointer, every registration, the events and faults
 *               in key order (oldest first), and who leads the election.
 *   job_follow  a snapshot and a watch from the revision after it: the changes in order,
 *               in batches, to the caller's function on the watch's thread. A batch is what
 *               one watch response brought; after a compaction or an outage the watch reads
 *               the whole job again, and that batch comes marked resync: the caller's own
 *               picture starts again from it.
 *
 * view.c decodes and builds the picture (bytes and structs, no etcd call: tests/arch checks
 * it); follow.c, on the store side with store.c, reads etcd for it (job_change_get,
 * job_view_read, job_follow_*).
 *
 * A record its codec refuses never reaches a caller as a record: its change has rec
 * JOB_REC_OTHER and `refused` set, and the warning that names the key and the field is the
 * caller's to give (each client words it for its reader). */
#ifndef NEWT_JOB_VIEW_H
#define NEWT_JOB_VIEW_H

#include "job/plan.h"
#include "job/records.h"
#include "job/spec.h"
#include "rendezvous/etcd.h"

/* --- one key, decoded ------------------------------------------------------------------------ */

typedef struct job_change {
  job_record rec;          /* JOB_REC_OTHER: a key newt does not know, or a record refused */
  int deleted;             /* the key was deleted: only the key's parts below are set */
  int refused;             /* its codec refused the value: newt_errmsg() said why (in `why`) */
  char why[512];           /* refused: the codec's error, naming the record and the field */
  const rdzv_etcd_kv *kv;  /* the key, its lease and revisions (the caller's, borrowed) */
  char id[NEWT_ID_MAX];  /* workers/<id>, reports/<g>/<id>, acks/<g>/<id>, links/<id> */
  uint64_t generation;     /* reports/<g>/..., acks/<g>/..., faults/<g> */
  union {
    job_worker worker; /* lease and revisions filled from kv; its id is the key's, else refused */
    job_candidacy candidacy;
    job_report report;
    job_ack ack;
    job_progress progress;
    job_done done;
    job_failed failed;
    job_ckpt ckpt;
    job_event event; /* owns its name lists */
    job_fault fault;
    job_links links;
    newt_plan plan;  /* owns its ranks, spares and donors */
    newt_spec spec;
  } u;
} job_change;

/* Decodes kv, a key under prefix (the job's, job_prefix of JOB_REC_OTHER: "/newt/<job>/").
 * Never fails: a key outside the prefix or unknown is rec JOB_REC_OTHER; a value its codec
 * refuses is refused (why says so). Free with job_change_free. */
void job_change_decode(const char *prefix, const rdzv_etcd_kv *kv, int deleted, job_change *out);
void job_change_free(job_change *c);
/* Refuses c (decoded from c->kv): its record freed, rec JOB_REC_OTHER, refused set and `why`
 * newt_errmsg() after the key. A plan head whose shards are missing or not its own is refused so
 * (job_changes_decode finds them in the same read, follow.c in etcd at the head's revision). */
void job_change_refuse(job_change *c);
/* kv decoded as record rec of job: NEWT_ERR_INVALID, naming the key and why, when its codec
 * refuses it or it is another record (nothing is left to free then). */
newt_result_t job_change_expect(const char *job, const rdzv_etcd_kv *kv, job_record rec, job_change *out);
/* The job's record rec (a key of its own: job_key) read and decoded (follow.c) (job_change_expect;
 * out->kv is NULL, what the change holds is its own); NEWT_ERR_NOTFOUND: no such key. */
newt_result_t job_change_get(rdzv_etcd *c, const char *job, job_record rec, newt_deadline_t d, job_change *out);

/* --- the picture ------------------------------------------------------------------------------ */

typedef struct job_view {
  int64_t revision;        /* the store revision the picture is current at */
  int has_spec;
  newt_spec spec;
  newt_plan plan;          /* the stored plan as it is (generation 0: none); a reader that acts on
                              it checks it against the spec (plan_check_spec, plan_check_jump) */
  job_worker *workers;     /* the registrations, in key order (by id) */
  int nworkers;
  int has_progress, has_done, has_failed, has_ckpt;
  job_progress progress;
  job_done done;
  job_failed failed;
  job_ckpt ckpt;
  job_event **events;      /* in key order: oldest first (each malloc'd: one that comes out of order
                              moves pointers) */
  int nevents;
  job_fault *faults;       /* in key order: by generation */
  int nfaults;
  job_candidacy leader;    /* the candidacy with the oldest key (the election's leader) */
  int64_t leader_rev;      /* its create_revision (0: nobody campaigns) */
  int nrefused;            /* records of the picture its codecs refused (left out) */
  struct job_view_keys *keys; /* private: the key of each event, every candidacy */
} job_view;

/* Takes one change into the picture (a record's newest value, a deletion, an event or a fault
 * appended in key order). Refused and unknown keys change nothing but nrefused. */
void job_view_apply(job_view *v, const job_change *c);
/* The picture of a whole read of the job under prefix (all: its keys, any order), each change
 * taken in resync order (job_follow_fn); warn (may be NULL) is told of each refused record. */
void job_view_take(job_view *out, const char *prefix, const rdzv_etcd_kvs *all,
                   void (*warn)(void *ud, const job_change *ch), void *ud);
/* The whole job read at once (one range, follow.c): NEWT_ERR_NOTFOUND, naming the job and the endpoint,
 * when it has no key at all. warn (may be NULL) is told of each refused record. */
newt_result_t job_view_read(rdzv_etcd *c, const char *job, newt_deadline_t d,
                            void (*warn)(void *ud, const job_change *ch), void *ud, job_view *out);
/* The registration of id (NULL: none). */
const job_worker *job_view_worker(const job_view *v, const char *id);
void job_view_free(job_view *v);

/* --- following it ----------------------------------------------------------------------------- */

/* A batch of changes in revision order. resync: the first batch (the snapshot) and every
 * whole re-read after a compaction or an outage; the caller starts its picture again from
 * it. A resync batch is sorted so that the spec comes first, then the plan, the progress,
 * the registrations and then the rest, in key order: a report or an acknowledgement is read
 * after the plan and registration that decide whether it counts. */
typedef void (*job_follow_fn)(void *ud, const job_change *chs, size_t n, int resync);
/* How the watch is doing: called on the watch's thread when its stream breaks (ok 0, why)
 * and when it delivers again after that (ok 1). */
typedef void (*job_follow_health_fn)(void *ud, int ok, const char *why);

typedef struct job_follow job_follow;

/* The changes of a whole read, decoded and in resync order (*out malloc'd, all->n of them: a
 * change is some 2.8 KB, so there is one array of them, not two); job_changes_free frees them. */
newt_result_t job_changes_decode(const char *prefix, const rdzv_etcd_kvs *all, job_change **out);
void job_changes_free(job_change *chs, size_t n);

/* Reads the whole job, hands it to fn as one resync batch (on the calling thread, before it
 * returns), then watches from the next revision: fn gets every later batch on the watch's
 * thread. health may be NULL. */
newt_result_t job_follow_start(rdzv_etcd *c, const char *job, job_follow_fn fn, job_follow_health_fn health,
                               void *ud, newt_deadline_t d, job_follow **out);
/* The newest revision whose batch fn has returned from (the snapshot's, then the watch's): a
 * reader that read a key's revision knows whether the batches up to it have come. */
int64_t job_follow_revision(job_follow *f);
/* Stops the watch and waits for its thread (never from fn). NULL is fine. */
void job_follow_free(job_follow *f);

#endif
