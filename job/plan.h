/* The plan: who is which rank in generation g. The leader computes it from the live
 * workers and writes it to /newt/<job>/plan; every worker follows it.
 *
 *   {"generation": 7, "secret": "<64 hex>", "created_ms": ..., "cause": "crash",
 *    "switch": "abort",            "abort": drop the running step now (a member failed),
 *                                  "boundary": finish the current step first (join, leave)
 *    "dp": 2, "tp": 1, "pp": 1, "zero": 0,
 *    "global_batch": 32, "micro_batch": 4, "accum": 4,
 *    "restore": "memory",          the leader's expectation: memory, peer, ckpt or init
 *    "step": 120,                  the job's newest step known to the leader
 *    "ranks": [{"rank": 0, "worker": "w0", "host": "h", "addr": "10.0.0.1:4000",
 *               "dp": 0, "tp": 0, "pp": 0}, ...],
 *    "spares": ["w5"],
 *    "spare_why": "the global batch ...",  why the layout leaves the spares out (with spares)
 *    "donors": [{"rank": 4, "worker": "w2", "host": "h", "addr": "10.0.0.3:4000",
 *                "dp": -1, "tp": -1, "pp": -1}]}
 *
 * Donors are workers leaving gracefully (SIGTERM): they join the generation's communicator
 * after the ranks (ranks nranks..) only to hand their state to the ranks that need it, then
 * exit, so a preemption loses nothing even where no other rank held the leaver's pieces.
 *
 * Rank order is Megatron's: tp fastest, then dp, then pp:
 *   rank = (pp_idx * dp + dp_idx) * tp + tp_idx.
 * A tensor-parallel group (tp consecutive ranks) always lies on one host. The global
 * batch is kept exactly: data-parallel rank d takes plan_batch_slice of its samples (as
 * evenly as they split, the first ranks one more), in micro-batches of micro_batch (the
 * last one of a rank may be shorter); accum is the most micro-batches a rank takes
 * (plan_accum: global_batch / (dp * micro_batch) when every rank takes as many). Every
 * rank divides its loss by the global batch and the gradients are summed over the
 * data-parallel group, so the update is the same mean at any dp. */
#ifndef NEWT_JOB_PLAN_H
#define NEWT_JOB_PLAN_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "common/err.h"
#include "job/spec.h"

#define PLAN_ID_MAX 64
#define PLAN_ADDR_MAX 96
#define PLAN_SECRET_BYTES 32
#define PLAN_WHY_MAX 320

typedef struct plan_rank {
  int rank;
  char worker[PLAN_ID_MAX];
  char host[PLAN_ID_MAX];
  char addr[PLAN_ADDR_MAX];
  int dp, tp, pp; /* coordinates */
  char domain[256]; /* its failure domain; "" (and absent from the record): its host */
} plan_rank;

/* A rank's failure domain: its own, else its host. */
static inline const char *plan_rank_domain(const plan_rank *r) { return r->domain[0] ? r->domain : r->host; }

/* A shard of a plan too large for one etcd request (see "A plan in shards" below): the head
 * lists them in host order. */
#define PLAN_DIGEST_BYTES 32
typedef struct plan_shard_ref {
  char host[PLAN_ID_MAX]; /* its first host: shard i holds the ranks of the hosts in [host_i, host_i+1) */
  int ranks;              /* how many ranks it holds */
  unsigned char digest[PLAN_DIGEST_BYTES]; /* SHA-256 of its record's bytes */
  int added;              /* a reader's: its ranks are in the plan (plan_shard_add) */
} plan_shard_ref;

typedef struct newt_plan {
  uint64_t generation;
  unsigned char secret[PLAN_SECRET_BYTES];
  uint64_t created_ms;
  char cause[16];    /* initial, crash, hang, leave, join, coordinator, etcd */
  char switch_mode[16]; /* abort or boundary */
  int dp, tp, pp, zero;
  int64_t global_batch, micro_batch, accum;
  char restore[8]; /* memory, peer, ckpt, init */
  int64_t step;
  int nranks;
  plan_rank *ranks;
  int nspares;
  char (*spares)[PLAN_ID_MAX];
  char spare_why[PLAN_WHY_MAX]; /* why the layout leaves the spares out ("" without spares):
                                   printable text, for people (run, status, the report) */
  int ndonors;
  plan_rank *donors; /* rank nranks + i, coordinates -1 */
  int nshards;       /* a plan read in shards: its head's list (0: a plan in one record) */
  plan_shard_ref *shards;
  int *by_worker;    /* plan.c's: the ranks' indices sorted by worker, so that plan_find is a binary
                        search (set by plan_compute, plan_from_json, plan_copy; NULL: plan_find scans) */
  /* Samples per step of each data-parallel rank ([dp], summing to the global batch), set when the
     leader rebalanced for ranks of unequal speed (a straggler: docs/elastic.md, "Stragglers");
     NULL: as evenly as they split (plan_batch_slice). Written only when set. */
  int64_t *shares;
} newt_plan;

/* A live worker as the leader sees it. */
typedef struct plan_member {
  char id[PLAN_ID_MAX];
  char host[PLAN_ID_MAX];    /* workers of one host share memory; a tensor-parallel group is on one */
  char domain[256];         /* its failure domain (what goes down as a unit); "": its host */
  char addr[PLAN_ADDR_MAX];
  int64_t join_rev;  /* etcd create_revision of its registration: earlier joins first */
  int prev_rank;     /* its rank in the previous plan, -1 when none */
  int prev_pp;       /* its pipeline stage in the previous plan, -1 when none */
  int has_state;     /* holds training state in memory */
  double sample_us;  /* its measured compute per sample, in microseconds (0: not measured) */
} plan_member;

/* The largest data-parallel size in [dp_min, dp_max], at most max_dp and at most the global
 * batch (a sample for each rank); with spec.parallel.even_batches, the largest that also
 * splits the global batch into the same whole micro-batches on every rank. 0 when there is
 * none. */
int plan_choose_dp(const newt_spec *s, int64_t max_dp);

/* The most micro-batches of micro_batch one of dp ranks takes of the global batch (the
 * first rank's). */
int64_t plan_accum(int64_t global_batch, int64_t micro_batch, int64_t dp);

/* Data-parallel rank dp_rank's samples of a step of global_batch: [first, first + count)
 * from the step's first sample; the first global_batch % dp ranks take one more. */
void plan_batch_slice(int64_t global_batch, int64_t dp, int64_t dp_rank, int64_t *first, int64_t *count);

/* Data-parallel rank dp_rank's samples of a step of plan p: its share (p->shares), else
 * plan_batch_slice's. */
void plan_slice(const newt_plan *p, int64_t dp_rank, int64_t *first, int64_t *count);

/* The most micro-batches one data-parallel rank of p takes (what p->accum must be). */
int64_t plan_most_micro(const newt_plan *p);

/* The global batch split over dp ranks in proportion to their speeds (speed[d] > 0, any
 * unit): out[d] >= 1 samples, summing to global_batch (largest remainders; ties to the lower
 * rank). NEWT_ERR_INVALID when dp exceeds the global batch or a speed is not positive. */
newt_result_t plan_shares_by_speed(int64_t global_batch, int dp, const double *speed, int64_t *out);

/* The shares a plan of dp ranks gives ranks of the measured compute per sample us[d] (0: not
 * measured, taken as the median of those measured): NULL (even shares) unless the slowest is
 * more than 1 + margin times the fastest, else malloc'd plan_shares_by_speed of 1 / us.
 * *err set on no memory. */
int64_t *plan_shares_for(int64_t global_batch, int dp, const double *us, double margin, newt_result_t *err);

/* Computes the plan for generation prev_gen + 1 from the live members (any order).
 * Members that keep their place keep their coordinates where the layout allows it; the
 * others are spares, and spare_why says why in words (no whole tensor-parallel group on
 * their host, no whole pipeline, spec.parallel.dp_max, or a global batch that does not
 * split into whole micro-batches over more data-parallel ranks).
 * NEWT_ERR_UNAVAILABLE (message: how many workers are needed and how many there are)
 * when no valid layout exists. The secret is fresh random bytes. With
 * spec.fault.straggler_window > 0 (rebalancing; not with spec.parallel.even_batches) and
 * members whose sample_us was measured, a data-parallel rank's speed is that of its slowest
 * member, and the shares follow the speeds where they differ by more than
 * spec.fault.straggler_margin (plan_shares_for). */
newt_result_t plan_compute(const newt_spec *s, const plan_member *members, int nmembers,
                           uint64_t prev_gen, newt_plan *out);

void plan_free(newt_plan *p);

/* Deep copy. */
newt_result_t plan_copy(newt_plan *dst, const newt_plan *src);

/* Serialisation; parsing validates everything (ranks complete, coordinates consistent
 * with dp/tp/pp, accum keeping the global batch) and names the bad field. */
char *plan_to_json(const newt_plan *p);
newt_result_t plan_from_json(const char *text, size_t len, newt_plan *out);

/* The entry of `worker`, or NULL when it is not a rank of the plan (log n with the index a
 * computed, parsed or copied plan carries; a plan built by hand is scanned). */
const plan_rank *plan_find(const newt_plan *p, const char *worker);
/* The donor entry of `worker`, or NULL. */
const plan_rank *plan_find_donor(const newt_plan *p, const char *worker);
/* Adds a donor (the next rank after the ranks and earlier donors). */
newt_result_t plan_add_donor(newt_plan *p, const char *worker, const char *host, const char *addr);
int plan_is_spare(const newt_plan *p, const char *worker);

/* What a reader checks of a plan beyond its own consistency (plan_from_json's): the fields
 * the job's spec fixes (global and micro batch, tp, pp, ZeRO stage) agree with it, naming
 * the first that does not; the generation is no jump of more than PLAN_MAX_JUMP past the
 * newest one the reader knows (have; 0: none yet, anything goes). A plan that fails either
 * is forged or corrupt: readers ignore it and the current generation goes on. */
#define PLAN_MAX_JUMP (1 << 20)
newt_result_t plan_check_spec(const newt_plan *p, const newt_spec *s);
newt_result_t plan_check_jump(uint64_t have, uint64_t next);

/* A plan its readers will take: the generation within the bound the parser accepts, and
 * the serialised text parsing back (a leader never publishes what it would refuse to
 * read). *json: that text (the caller frees it). */
newt_result_t plan_check_publishable(const newt_plan *p, char **json);

/* --- a plan in shards ---------------------------------------------------------------------------
 *
 * A plan of more ranks than fit one etcd request (100,000 ranks are some 11 MB; etcd takes
 * 1.5 MiB) is stored as a head and shards. The head is the plan's record without "ranks" and
 * with "shards": [{"host": first host, "ranks": count, "digest": SHA-256 hex}, ...]; shard i is
 * {"generation": g, "shard": i, "ranks": [entries as in a plan]} and holds the ranks of the
 * hosts from its first host to the next shard's (ranks sorted by host, then rank; a host is
 * never cut), so that a worker finds the shard of its own host, its tensor-parallel group
 * with it, in the head alone. The head names each shard by its digest: a shard that is not
 * the one the head was written with is refused, naming it. A plan of at most one shard's
 * ranks is one record, the previous release's bytes. */
#define PLAN_SHARD_MAX 65536

/* Cuts p into shards of about shard_ranks ranks (at host boundaries): *head, the head's text,
 * and (*shards)[0..*nshards), each shard's (plan_shard_texts_free). */
newt_result_t plan_shard_encode(const newt_plan *p, int shard_ranks, char **head, char ***shards, int *nshards);
void plan_shard_texts_free(char **shards, int n);
/* A plan record as stored: a whole plan (as plan_from_json), or a head: nshards > 0 and no
 * ranks (nranks 0) until a shard is added. plan_from_json refuses a head. */
newt_result_t plan_head_from_json(const char *text, size_t len, newt_plan *out);
/* 1 while p is a head with shards not yet added. */
int plan_is_partial(const newt_plan *p);
/* Shard i of head p, checked (its digest the head's, its generation and index, each entry a
 * rank of the plan in range with its coordinates, on a host of the shard's, in the shard's
 * count) and parsed into *out (malloc'd, *n entries). Errors name the shard: "plan 7 shard
 * 3: ...". */
newt_result_t plan_shard_read(const newt_plan *p, int i, const char *text, size_t len, plan_rank **out, int *n);
/* Shard i read (plan_shard_read) into p's ranks; a rank already given is refused. */
newt_result_t plan_shard_add(newt_plan *p, int i, const char *text, size_t len);
/* Once every shard is added: no shard missing (named), every rank there, no worker twice;
 * the plan is whole (plan_find works). */
newt_result_t plan_shards_done(newt_plan *p);
/* The shard that holds host's ranks, if any (-1: no shard's hosts take it in). */
int plan_shard_of_host(const newt_plan *p, const char *host);

#endif
