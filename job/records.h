/* The records of a job in etcd and their keys: job/ owns them all (rendezvous/ sees keys and
 * bytes only; job/store.h hands them to its protocols). Each record is one table of its fields
 * (job/codec.h) from which its writer and its parser are made, shared by every process that
 * reads or writes it (worker, coordinator, `newt run`, `newt status`), so a field is named in
 * one place. Everything of a job lives under /newt/<job>/:
 *
 *   key                          record        written by         read by
 *   spec                         job/spec.h    launcher, newt     all
 *                                              coordinator --spec
 *   plan                         job/plan.h    the leader         workers, launcher, status
 *   workers/<id>                 job_worker    the worker, on     coordinator, status
 *                                              its lease; its
 *                                              "ack" is a job_ack
 *   election/<lease hex>         job_candidacy coordinators       the election, status
 *   reports/<gen>/<id>           job_report    a rank whose       the leader
 *                                              collective failed
 *   acks/<gen>/<id>              job_ack       the previous       the leader
 *                                              release (now in
 *                                              the registration)
 *   progress                     job_progress  rank 0, at most    leader, launcher, status
 *                                              every 100 ms
 *   done                         job_done      rank 0, once       everyone
 *   ckpt                         job_ckpt      rank 0, after a    status
 *                                              commit
 *   events/<ms>-<rand>           job_event     the leader         launcher, status
 *   faults/<gen>                 job_fault     newt run, for a    status
 *                                              fault it injected
 *   links/<id>                   job_links     a worker left out  the leader
 *                                              of a plan, on its
 *                                              lease
 *
 * A report, an acknowledgement, a links record and the end marker carry their writer's proof
 * of the job secret ("mac", job_auth below): a reader with the secret counts them only with it.
 *
 * <gen> is the generation as 20 zero-padded digits, so keys sort by generation. Every
 * parser validates what it reads (types, ranges, names, the set a string comes from) and a
 * rejection names the record and the field: "report.kind: expected crash or hang, got
 * \"x\"". Writers produce only what their parser accepts (the tests check each round trip),
 * and the bytes the previous release wrote (tests/job/test_records_compat.c).
 *
 * This file and its codecs are pure: bytes to structs and back, no etcd (tests/arch checks
 * it). Reading and writing the records in etcd is job/store.h's. */
#ifndef NEWT_JOB_RECORDS_H
#define NEWT_JOB_RECORDS_H

#include <stdint.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/name.h"
#include "common/secret.h"
#include "job/spec.h"

#define JOB_ACCUSE_MAX 8   /* workers one report may name */
#define JOB_TEXT_MAX 512   /* free text: a report's why, a waiting event's why */
#define JOB_WORD_MAX 16    /* causes, kinds, restore sources */
#define JOB_MAC_MAX (NEWT_MAC_HEX + 1) /* a record's "mac": 64 hex digits */

/* --- keys ------------------------------------------------------------------------------------ */

typedef enum job_record {
  JOB_REC_OTHER = 0, /* a key newt does not know (ignored by readers) */
  JOB_REC_SPEC,
  JOB_REC_PLAN,
  JOB_REC_WORKER,
  JOB_REC_ELECTION,
  JOB_REC_REPORT,
  JOB_REC_ACK,
  JOB_REC_PROGRESS,
  JOB_REC_DONE,
  JOB_REC_CKPT,
  JOB_REC_EVENT,
  JOB_REC_FAILED,
  JOB_REC_FAULT,
  JOB_REC_LINKS,
  JOB_REC_PLAN_SHARD, /* plan/<generation>/<shard>: a shard of a plan too large for one record (plan.h) */
} job_record;

/* The key of a record: generation and id are used by reports and acks (id alone by
 * workers and links, generation alone by faults); events get their key from job_event_post
 * (job/store.h), candidacies from the election. */
newt_result_t job_key(char *out, size_t cap, const char *job, job_record rec, uint64_t generation, const char *id);
/* The prefix of a record's keys: "/newt/<job>/workers/", ".../events/", ".../election/"; for
 * acks and reports, the keys of one generation (".../acks/<gen>/"; generation -1: of every
 * one, ".../acks/"). Other records ignore the generation; JOB_REC_OTHER: the whole job's,
 * "/newt/<job>/". */
newt_result_t job_prefix(char *out, size_t cap, const char *job, job_record rec, int64_t generation);

/* What the key `rest` (the part after "/newt/<job>/") holds; *generation and *id (pointing
 * into rest) are set for reports, acks (both), workers and links (id) and faults (generation). A malformed generation
 * or id gives JOB_REC_OTHER. */
job_record job_key_parse(const char *rest, uint64_t *generation, const char **id);

/* --- what a rank says for itself, proved by the job secret ------------------------------------ */

/* The records a rank writes for itself -- a report (a failed collective, replicas that
 * disagree, the job failing), an acknowledgement, its links -- and the end marker carry "mac":
 * HMAC-SHA256 under the job's records key, HMAC-SHA256(job secret, "newt-records" 0 job), of
 * "newt-record" 0 <its etcd key> 0 <the plan's salt, for a report or an ack> <its canonical
 * bytes: the codec's writing of it without mac>. Moved to another key, generation or job, a
 * record proves nothing. A reader that holds the secret counts a record only with a valid mac
 * (the check); one without the secret, and a job without one, write and read the records of
 * the previous release (no mac). etcd's own access control says who may write at all; the mac
 * says which of those writers holds the job secret (the ranks, the coordinators). */
typedef struct job_auth {
  int has; /* 0: no secret (nothing sealed, nothing checked) */
  unsigned char key[NEWT_MAC_BYTES];
} job_auth;

/* The records key of `job` from its secret (secret NULL: a job without one, has = 0). */
newt_result_t job_auth_init(job_auth *a, const unsigned char *secret, size_t len, const char *job);
/* The job secret file read (newt_secret_read's checks) into the records key of job (path NULL
 * or "": none, has = 0, NEWT_OK). */
newt_result_t job_auth_load(job_auth *a, const char *path, const char *job);

/* --- a worker's registration (workers/<id>, on its lease) --------------------------------- */

#define JOB_ACK_MAX 384 /* an acknowledgement folded into a registration, as JSON text */

typedef struct job_worker {
  char id[NEWT_ID_MAX];
  char host[256];
  char domain[256];   /* its failure domain (a topology label: a node, a rack, a zone): what goes
                         as a unit; replicas are placed across domains. A record without one
                         (the previous release) reads as its host */
  char addr[256];     /* "ip:port" of its data-plane listener ("" when none yet) */
  int device;         /* GPU index; -1: CPU */
  int shares_device;  /* 1: it trains beside other workers on its GPU that say so too (newt
                         worker --share-device); 0: it wants the GPU to itself */
  char state[64];     /* "joining", "ready", "training", "leaving", ... */
  int64_t pid;
  int64_t generation; /* the last plan generation it has taken up (0: none) */
  char ack[JOB_ACK_MAX]; /* its acknowledgement of `generation` (a job_ack as JSON: kept as text,
                            "": not acknowledged yet); it counts in the barrier */
  /* read back from etcd by its readers (not in the JSON) */
  int64_t lease;
  int64_t create_revision;
  int64_t mod_revision;
} job_worker;

/* {"id","host","addr","device","state","pid","generation"}, and "shares_device": true when
 * set; "domain" only when it differs from the host, so a registration is what the previous
 * release wrote unless a domain was given; "ack": {...} once acknowledged (an ack that is not a
 * JSON object is refused, "registration.ack"). *out malloc'd. */
newt_result_t job_worker_to_json(const job_worker *w, char **out);
/* Parses and checks a registration; errors name `what` (NULL: "registration") and the field. */
newt_result_t job_worker_from_json(const char *text, size_t len, const char *what, job_worker *out);
/* Whether registration w acknowledges generation g: it carries an acknowledgement of g, or it
 * has taken up a later generation (the barrier of g is behind it). */
int job_worker_acked(const job_worker *w, int64_t generation);
/* The acknowledgement w carries (of w->generation), read by the ack's codec: NEWT_ERR_NOTFOUND
 * when it carries none; a bad one is refused (naming the field) while the registration stands. */
typedef struct job_ack job_ack;
newt_result_t job_worker_ack(const job_worker *w, job_ack *out);

/* --- a coordinator's candidacy (election/<lease hex>, on its lease) ------------------------ */

typedef struct job_candidacy {
  char name[NEWT_ID_MAX]; /* the coordinator's id */
  char host[256];
  int64_t pid;
} job_candidacy;

/* {"name","host","pid"}; malloc'd, NULL on no memory. */
char *job_candidacy_to_json(const job_candidacy *c);
newt_result_t job_candidacy_from_json(const char *text, size_t len, job_candidacy *out);

/* --- a failure report: a rank saw a collective of generation g fail -------------------------- */

typedef struct job_report {
  char worker[NEWT_ID_MAX];                   /* who reports (the key's id) */
  int hang;                                     /* "hang": no progress by the deadline; else "crash" */
  int build;                                    /* the generation never formed ("during":"build"):
                                                   the accused are those whose links were not made */
  char accuse[JOB_ACCUSE_MAX][NEWT_ID_MAX];   /* whom it lost (none: it cannot tell) */
  int naccuse;
  int64_t step;                                 /* the newest step every rank completed, as far as
                                                   it knows (-1: none) */
  int64_t done_step;                            /* the newest step it completed itself (0: not said,
                                                   a report of the previous release): the job's
                                                   step when the fault hit is the newest of these
                                                   (job_event.fault_step) */
  uint64_t t_ms;                                /* wall ms it saw the failure */
  char why[JOB_TEXT_MAX];                       /* the collective's message */
  /* replicas disagreed at step mismatch_step of this generation (worker/verify.c): the words
     ("" and absent: not so), what was done (rollback, warn, fail) and the step training went
     on from (back_to) */
  char mismatch[JOB_TEXT_MAX];
  char action[JOB_WORD_MAX];
  int64_t mismatch_step, back_to;
  char fatal[JOB_TEXT_MAX];                     /* the job fails, and why: its state is lost
                                                   (spec.fault.on_state_loss), its replicas disagree
                                                   (spec.fault.on_mismatch); "" and absent: not so */
  char mac[JOB_MAC_MAX];                        /* its writer's proof (job_report_seal; "" and
                                                   absent: a job without a secret) */
  int64_t revision;                             /* etcd's revision of the record, set by its reader
                                                   (not in the JSON; 0: unknown) */
} job_report;

/* {"worker","kind","accuse":[..],"step","done_step","t_ms","why"} (done_step only when said);
 * malloc'd, NULL on no memory. */
char *job_report_to_json(const job_report *r);
newt_result_t job_report_from_json(const char *text, size_t len, job_report *out);
/* Sets r->mac for the record at etcd key `key` in the generation whose plan's salt is given
 * (nothing without a key). */
newt_result_t job_report_seal(const job_auth *a, const char *key, const unsigned char *salt, size_t salt_len,
                              job_report *r);
/* NEWT_OK when r proves itself (or a has no key); else NEWT_ERR_AUTH saying why. */
newt_result_t job_report_check(const job_auth *a, const char *key, const unsigned char *salt, size_t salt_len,
                               const job_report *r);

/* --- an acknowledgement: a rank took up generation g and completed its first step ----------- */

typedef struct job_ack {
  int64_t rank;
  uint64_t t_plan, t_comm, t_restore, t_step; /* wall ms: plan seen, communicator built, state
                                                 restored, first step done */
  char restore[8];                            /* where its state came from: memory, peer, ckpt, init */
  int64_t restore_step;                       /* the step it restored */
  char mac[JOB_MAC_MAX];                      /* its writer's proof (job_ack_seal; "": none) */
} job_ack;

char *job_ack_to_json(const job_ack *a);
newt_result_t job_ack_from_json(const char *text, size_t len, job_ack *out);
/* As for reports; key: the registration's key (workers/<id>) for an acknowledgement folded into
 * it, acks/<gen>/<id> for the previous release's; the generation acknowledged is in the proof. */
newt_result_t job_ack_seal(const job_auth *a, const char *key, int64_t generation, const unsigned char *salt,
                           size_t salt_len, job_ack *ack);
newt_result_t job_ack_check(const job_auth *a, const char *key, int64_t generation, const unsigned char *salt,
                            size_t salt_len, const job_ack *ack);

/* The sources of state, cheapest first (the order a recovery is summarised by: its worst). */
int job_restore_rank(const char *restore); /* 0 memory, 1 peer, 2 init, 3 ckpt; -1 unknown */

/* --- progress: the newest step of the job (rank 0, rate-limited) ------------------------------ */

#define JOB_SLOW_MAX 8 /* the ranks off the median's speed a record lists */

typedef struct job_progress {
  uint64_t generation;
  int64_t step;
  int64_t committed;   /* the newest step every rank completed, <= step (-1: not said, take step);
                          a recovery that goes back to it loses no step */
  double loss;         /* NaN when not finite (written as null) */
  double tokens_per_s;
  int64_t world, dp;
  uint64_t t_ms;
  int64_t step_tokens; /* tokens of one step: global batch x sequence length (0: unknown) */
  /* the ranks' speeds (issue 41; docs/elastic.md, "Stragglers"), each written only when set:
     the median data-parallel rank's compute per sample over the last steps of the generation,
     in microseconds (0: not measured), and the ranks off it by more than
     spec.fault.straggler_margin (at most JOB_SLOW_MAX, the farthest first: a rank not listed
     computes at the median's speed) */
  double sample_us;
  int nslow;
  struct job_slow {
    int dp;        /* its data-parallel index in the generation's plan */
    double us;     /* its compute per sample, microseconds */
  } slow[JOB_SLOW_MAX];
  /* the longest run of steps, up to the newest, in which one data-parallel rank's compute
     stayed more than the margin above (a straggler) or below (one recovered, or given too
     little) the median rank's, and its length in ms: the leader rebalances once it reaches
     spec.fault.straggler_window steps (0: none) */
  int64_t straggle, straggle_ms;
} job_progress;

char *job_progress_to_json(const job_progress *p);
newt_result_t job_progress_from_json(const char *text, size_t len, job_progress *out);

/* --- one step of the step log (a file beside the job, not a key in etcd: job/runlog.h) ------- */

typedef struct job_step {
  int64_t step;         /* the step just done (1-based) */
  double loss;          /* its mean token loss; NaN when not finite (written as null) */
  double lr;            /* the learning rate it applied */
  double grad_norm;     /* the gradients' global norm before clipping (0: not known; absent from the line) */
  double tokens_per_s;  /* tokens of the step over its wall time */
  int64_t world, dp;    /* ranks of the plan, its data-parallel size */
  uint64_t generation;  /* the plan's generation (1 for `newt train`) */
  uint64_t t_ms;        /* wall ms when the step was done */
  int64_t ckpt;         /* the newest committed checkpoint the writer knows of (0: none) */
  int64_t restarts;     /* the restart mode: the program's step, and how many times the programs were
                           restarted before it (0: none, and not written; docs/elastic.md) */
  /* the ranks' speeds at this step, the progress record's (worker_speed_summary; issue 41),
     each written only when known: the median data-parallel rank's compute per sample in
     microseconds (0: not measured), and the ranks off it by the margin, the farthest first */
  double sample_us;
  int nslow;
  struct job_slow slow[JOB_SLOW_MAX];
} job_step;

/* {"step","loss","lr","tokens_per_s","world","dp","generation","t_ms","ckpt"}, in this
 * order, on one line (then "restarts", "sample_us" and "slow" where set); malloc'd, NULL on
 * no memory. */
char *job_step_to_json(const job_step *s);
newt_result_t job_step_from_json(const char *text, size_t len, job_step *out);

/* --- the end marker ------------------------------------------------------------------------- */

typedef struct job_done {
  int64_t step;
  double loss;
  uint64_t t_ms;
  uint64_t samples; /* samples consumed: steps x global batch */
  char mac[JOB_MAC_MAX]; /* the rank's proof (job_done_seal; "": a job without a secret) */
} job_done;

char *job_done_to_json(const job_done *d);
newt_result_t job_done_from_json(const char *text, size_t len, job_done *out);
/* The end marker of a job of this spec: its last step, and the samples of every step. */
int job_done_plausible(const job_done *d, const newt_spec *spec);
newt_result_t job_done_seal(const job_auth *a, const char *key, job_done *d);
newt_result_t job_done_check(const job_auth *a, const char *key, const job_done *d);
/* Whether end marker d (read under key) ends a job of this spec whose ranks are known to have
 * reached step `progress` (the newest progress record's step): plausible, proved by a rank of
 * the job when auth has a key, and no step beyond the progress of the job (a rank writes the
 * last step's progress in the same transaction as its marker: worker/publish.c). NEWT_OK, or why
 * not (NEWT_ERR_INVALID: forged or corrupt; NEWT_ERR_AUTH: no proof). */
newt_result_t job_done_counts(const job_done *d, const char *key, const newt_spec *spec, const job_auth *auth,
                              int64_t progress);

/* --- the job failed: the leader gave up on it (the failure budget) --------------------------- */

typedef struct job_failed {
  char why[JOB_TEXT_MAX];
  uint64_t t_ms;
  char coordinator[NEWT_ID_MAX];
} job_failed;

char *job_failed_to_json(const job_failed *f);
newt_result_t job_failed_from_json(const char *text, size_t len, job_failed *out);

/* How a coordinator or worker process ended, for its exit status and its termination
 * message (Kubernetes shows the message in `kubectl describe pod`; the chart's Jobs act on
 * the status, docs/kubernetes.md). */
enum {
  JOB_EXIT_DONE = 0,   /* the job is done */
  JOB_EXIT_ERROR = 1,  /* an error in this process; another try may do better */
  JOB_EXIT_USAGE = 2,  /* a bad flag or spec: another try will not do better */
  JOB_EXIT_LEFT = 3,   /* left on SIGTERM before the end: the job goes on without it */
  JOB_EXIT_FAILED = 4, /* the job failed (its reason in `newt status` and the message) */
  JOB_EXIT_LEFT_OUT = 5, /* this worker trained, was left out (fenced: stopped, hung, cut off) and
                            not taken back before the job ended: it speaks for itself only (the
                            step it was left out at; the job's own end as its marker says) */
};
typedef struct job_end {
  int status;      /* JOB_EXIT_* */
  char msg[1024];  /* one line: "done: ...", "left: ...", "failed: ...", "error: ..." */
} job_end;

/* --- the checkpoint pointer: the newest committed checkpoint -------------------------------- */

typedef struct job_ckpt {
  int64_t step;
  char dir[512];
  int64_t bytes;   /* its files, every rank's (0: unknown) */
  int64_t save_ms; /* rank 0's save: compress, write, fsync, commit (0: unknown) */
  double stall_ms; /* rank 0's stall: what the save took of its step loop (ckpt_save_begin to
                      ckpt_save_end: the snapshot, or the device's downloads), to the µs,
                      [0, JOB_STALL_MS_MAX] (0: unknown) */
  int64_t skipped; /* saves the worker that is rank 0 skipped so far because its previous save was
                      still being written (0: none, or a record of the previous release); rank 0
                      writes the pointer again at each skip */
} job_ckpt;
#define JOB_STALL_MS_MAX 1e9

char *job_ckpt_to_json(const job_ckpt *c);
newt_result_t job_ckpt_from_json(const char *text, size_t len, job_ckpt *out);

/* --- events: what the leader did, for people and the launcher ------------------------------- */

typedef enum job_event_type {
  JOB_EV_LEADER = 0, /* a coordinator took the lead */
  JOB_EV_PLAN,       /* it published a plan: generation, cause, world, dp, spares, excluded, and
                        the spares by name (spare_ids) with why the layout leaves them out */
  JOB_EV_FENCE,      /* it fenced a worker: worker */
  JOB_EV_WAITING,    /* it cannot plan: why */
  JOB_EV_STARTED,    /* the first generation completed its first step: the timings below */
  JOB_EV_RECOVERED,  /* a later generation did */
  JOB_EV_DONE,       /* the job ended: step, loss */
  JOB_EV_FAILED,     /* the leader gave up on the job: why */
  JOB_EV_SPEC,       /* a changed spec was taken (why: what changed) or refused (why) */
  JOB_EV_ETCD,       /* etcd was unwell and is well again: why (out of space, for how long) */
  JOB_EV_SPARE,      /* workers that joined stay spares, the layout no larger with them: spare_ids, why */
  JOB_EV_MISMATCH,   /* data-parallel replicas disagreed (a rank's report): generation, step (the
                        check's), restore_step (the step training went on from), action (rollback,
                        warn, fail), worker (who said it), why (the tensors, the ranks) */
} job_event_type;

typedef struct job_event {
  job_event_type type;
  uint64_t t_ms;
  char coordinator[NEWT_ID_MAX];
  int64_t generation;
  char cause[JOB_WORD_MAX];
  int64_t world, dp, spares;
  char (*excluded)[NEWT_ID_MAX]; /* plan: malloc'd (job_event_free) */
  int nexcluded;
  char (*spare_ids)[NEWT_ID_MAX]; /* plan, spare: malloc'd (job_event_free) */
  int nspare_ids;
  char worker[NEWT_ID_MAX];      /* fence */
  char why[JOB_TEXT_MAX];          /* waiting, etcd, failed, spec; plan and spare: why spares */
  /* started, recovered: wall ms of the trigger, the earliest detection, the plan, and the
     slowest rank's communicator, restore and first step */
  uint64_t t_trigger, t_detect, t_plan, t_comm, t_restore, t_step;
  char restore[8];
  int64_t restore_step, steps_lost;
  int64_t fault_step; /* recovered: the newest step the job had completed when the fault hit (the
                         newest its failed generation's ranks said: their reports, its progress);
                         steps_lost = fault_step - restore_step, the steps done again. 0: not
                         said (an event of the previous release: job_event_fault_step) */
  int64_t step; /* done; mismatch: the step checked */
  double loss;  /* done */
  char action[JOB_WORD_MAX]; /* mismatch: rollback, warn or fail */
} job_event;

const char *job_event_type_name(job_event_type t);
/* A recovery's one account of steps: the step the fault hit (fault_step; for an event that
 * does not say it, restore_step + steps_lost), from which training went back to restore_step,
 * doing steps_lost steps again. */
int64_t job_event_fault_step(const job_event *e);

/* A recovery's times, one definition for every view (newt run's lines, its summary and
 * report, newt status): from its start -- the moment of the fault where newt run injected it
 * (t_fault; 0: not injected), else its first detection (a survivor's report, a lapsed lease,
 * a stall; for a join, the first registration of a joiner the leader saw) -- to the first
 * detection (detect), the plan published (plan), the slowest rank's communicator (comm) and
 * state (restore), and its first completed step (step): the phases add up to the total. A fault after the
 * detection is not this recovery's: the detection starts it. The leader's own metric knows no
 * injected fault: it counts from the detection. */
typedef struct job_recovery_times {
  uint64_t start; /* wall ms */
  int64_t detect_ms, plan_ms, comm_ms, restore_ms, step_ms, total_ms;
} job_recovery_times;
job_recovery_times job_recovery_time(const job_event *e, uint64_t t_fault);
/* Adds them to obj as start_ms, detect_ms, plan_ms, comm_ms, restore_ms, step_ms, total_ms. */
newt_result_t job_recovery_times_add(cJSON *obj, const job_recovery_times *t);

/* --- a fault newt run injected, for the recovery of generation gen that answered it --------- */

typedef struct job_fault {
  int64_t generation; /* the recovery's (the generation it made) */
  uint64_t t_ms;      /* wall ms the fault was injected */
  char what[64];      /* the chaos item ("kill:worker:1@step=100") */
} job_fault;

char *job_fault_to_json(const job_fault *f);
newt_result_t job_fault_from_json(const char *text, size_t len, job_fault *out);

/* --- a worker left out of plans reaches every rank of generation g -------------------------- */

/* A worker that was a rank and is not one of the plan in force connects to every rank's
 * data-plane listener and says here, on its lease, how many answered (took the connection
 * or refused it: the link works either way): once for each plan, and again when that
 * changes. The leader lets a worker it holds out back at once when all of a later plan's
 * ranks answered (a cut that healed), and keeps it out past its hold-out while they do not
 * (it would only fail the next build). */
typedef struct job_links {
  int64_t generation; /* the plan whose ranks it probed */
  int64_t answered;   /* how many of them answered */
  int64_t ranks;      /* of how many (its own rank, if any, not probed, counts as answered) */
  uint64_t t_ms;      /* wall ms of the probe */
  char mac[JOB_MAC_MAX]; /* its writer's proof (job_links_seal; "": none) */
  int64_t slow;       /* of the ranks it timed, how many its link was not well to (0: well,
                         or not timed: the previous release's records) */
} job_links;

char *job_links_to_json(const job_links *l);
newt_result_t job_links_from_json(const char *text, size_t len, job_links *out);
newt_result_t job_links_seal(const job_auth *a, const char *key, job_links *l);
newt_result_t job_links_check(const job_auth *a, const char *key, const job_links *l);
/* The fields of its type only. */
char *job_event_to_json(const job_event *e);
newt_result_t job_event_from_json(const char *text, size_t len, job_event *out);
void job_event_free(job_event *e);
/* A deep copy (its own name lists); *dst is left empty when out of memory. */
newt_result_t job_event_copy(job_event *dst, const job_event *src);

#endif
