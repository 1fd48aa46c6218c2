/* The job spec: what a user asks for, written once to etcd under /newt/<job>/spec and
 * read by every coordinator and worker.
 *
 *   {"job": "demo",
 *    "model":    {"preset": "tiny", "layers": 4, ...},         overrides of the preset
 *    "data":     {"path": "corpus.tok", "seed": 1, "gen_bytes": 2097152},
 *    "train":    {"steps": 200, "global_batch": 32, "micro_batch": 4, "seq_len": 64,
 *                 "lr": 1e-3, "lr_min": 1e-4, "warmup": 10, "weight_decay": 0.1,
 *                 "grad_clip": 1.0, "seed": 1},
 *    "parallel": {"tp": 1, "pp": 1, "zero": 0, "dp_min": 1, "dp_max": 64,
 *                 "start_workers": 8, "start_timeout_ms": 30000, "join_window_ms": 100,
 *                 "even_batches": false},
 *    "ckpt":     {"dir": "/ckpt", "every": 50, "keep": 3, "level": 3},
 *    "fault":    {"lease_ttl_ms": 2000, "comm_timeout_ms": 3000, "hang_timeout_ms": 5000,
 *                 "report_window_ms": 300, "replica_every": 1, "replicas": 1,
 *                 "max_failures": 10, "failure_window_ms": 600000,
 *                 "on_state_loss": "checkpoint", "verify_every": 10, "on_mismatch": "rollback"},
 *    "backend":  "cpu"}
 *
 * Every field but "job" has a default; the training defaults are those of `newt train`, so
 * a job and `newt train` with the same values follow the same trajectory. Parsing rejects unknown fields and bad values with
 * a message naming the field ("spec.parallel.tp: must be at least 1, got 0"), so a typo
 * never silently falls back to a default. A number is a JSON number: "steps": "20" is refused
 * ("spec.train.steps: expected a number, got the string \"20\""). The one exception are the
 * seeds (data.seed, train.seed), 64-bit values: spec_to_json writes a seed beyond 15 digits as
 * a string of digits (a JSON number holds 2^53 exactly), and only such a string is read.
 *
 * What a spec is checked for before a job starts beyond these rules (the model, the data, the
 * checkpoint directory) is gpt_start_check's (gpt/gpt.h). */
#ifndef NEWT_JOB_SPEC_H
#define NEWT_JOB_SPEC_H

#define SPEC_REPLICAS_MAX 8 /* spec.fault.replicas: at most this many copies of a shard */

#define SPEC_JOIN_WINDOW_MS 100 /* spec.parallel.join_window_ms's default */
#define SPEC_PROGRESS_TIMEOUT_MS 600000 /* spec.fault.progress_timeout_ms's default: 10 min */
#define SPEC_STRAGGLER_MARGIN 0.5 /* spec.fault.straggler_margin's default */
#define SPEC_STRAGGLER_WINDOW 20   /* spec.fault.straggler_window's default, in steps */
#define SPEC_VERIFY_EVERY 10 /* spec.fault.verify_every's default (docs/elastic.md, "Replicas that disagree") */

/* spec.fault.on_state_loss: what a job does when no step is whole in its ranks' memory (more
   failure domains lost at once than spec.fault.replicas keeps copies for) */
typedef enum spec_state_loss {
  SPEC_LOSS_CHECKPOINT = 0, /* "checkpoint": back to the newest committed checkpoint; without one the job fails */
  SPEC_LOSS_FAIL = 1,       /* "fail": the job fails, even with a checkpoint to go back to */
  SPEC_LOSS_RESTART = 2,    /* "restart": the newest checkpoint, else the initial state (every step lost) */
} spec_state_loss;
/* spec.fault.on_mismatch: what a job does when data-parallel replicas of its replicated state
   disagree (a flipped bit, a program whose own code makes them drift) */
typedef enum spec_mismatch {
  SPEC_MISMATCH_ROLLBACK = 0, /* "rollback": back to the newest step whose fingerprints agreed, from memory */
  SPEC_MISMATCH_WARN = 1,     /* "warn": said (log, event), training goes on */
  SPEC_MISMATCH_FAIL = 2,     /* "fail": the job fails, naming the tensor, the step and the ranks */
} spec_mismatch;

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define SPEC_NAME_MAX 64
#define SPEC_PATH_MAX 512

typedef struct newt_spec {
  char job[SPEC_NAME_MAX];
  /* model: the preset and its overrides (0 keeps the preset's value) */
  char preset[SPEC_NAME_MAX];
  int64_t vocab, ctx, layers, heads, channels;
  /* data */
  char data_path[SPEC_PATH_MAX]; /* empty: the generated corpus (model_text_generate) */
  uint64_t data_seed;            /* sample order, and the generated corpus */
  int64_t gen_bytes;             /* length of the generated corpus */
  /* training: the global batch is kept across every resize */
  int64_t steps;
  int64_t global_batch; /* samples per optimizer step, whole job */
  int64_t micro_batch;  /* samples per forward/backward on one data-parallel rank */
  int64_t seq_len;      /* tokens per sample; 0: the model's ctx */
  double lr, lr_min, weight_decay, grad_clip;
  int64_t warmup;       /* -1: 5% of the steps (as newt train) */
  uint64_t seed;
  /* parallelism: tp, pp and zero are fixed; dp varies in [dp_min, dp_max] */
  int64_t tp, pp, zero, dp_min, dp_max;
  /* 0 (default): any data-parallel size up to the global batch, the ranks taking the global
     batch's samples as evenly as they split (the first ones one more); 1: only sizes that
     split it into the same whole micro-batches on every rank (workers beyond wait as spares) */
  int even_batches;
  int64_t start_workers;    /* the first plan waits for this many workers (0: until joins settle) */
  int64_t start_timeout_ms; /* ... or this long after the first registration */
  int64_t join_window_ms;   /* joiners are taken in once no other has registered for this long
                               (100 ms: a join reaches the next generation well within 500 ms of
                               its registration; more gathers several joiners into one plan) */
  /* checkpoints (dir empty: none) */
  char ckpt_dir[SPEC_PATH_MAX];
  int64_t ckpt_every, ckpt_keep, ckpt_level;
  /* fault tolerance */
  int64_t lease_ttl_ms;     /* worker and coordinator leases */
  int64_t comm_timeout_ms;  /* floor of a collective's no-progress deadline */
  int64_t hang_timeout_ms;  /* a member whose step stops advancing this long is fenced */
  int64_t first_step_timeout_ms; /* the same, until the job's first step completed (start-up: model
                                    build, data, CUDA initialisation) */
  int64_t report_window_ms; /* how long the leader gathers failure reports before planning */
  int64_t replica_every;    /* ZeRO: refresh the in-memory copies of a shard every N steps */
  int64_t replicas;         /* k: each data-parallel rank keeps copies of the unique parts of its k
                               predecessors in the ring, placed so that any k failure domains lost at
                               once leave a copy of every part (1..SPEC_REPLICAS_MAX; written only
                               when not 1, so a spec of the previous release reads the same) */
  /* the failure budget: more than max_failures recoveries from a crash or hang within
     failure_window_ms end the job (failed, with its reason); 0: no budget */
  int64_t max_failures, failure_window_ms;
  /* the progress bound: once the job has a plan, no step completed for this long (counted
     from the newest step, the leader's start and etcd's return; before the first step, at
     least first_step_timeout_ms) ends the job (failed, naming what it waited for); 0: it waits
     for ever. Written only when not the default. */
  int64_t progress_timeout_ms;
  int on_state_loss;    /* spec_state_loss (written only when not "checkpoint") */
  /* replicas that disagree: every verify_every steps each data-parallel rank fingerprints its
     replicated state and the ranks compare (0: never); on_mismatch (spec_mismatch) says what a
     mismatch does. Written only when not the default. */
  int64_t verify_every;
  int on_mismatch;
  /* stragglers (docs/elastic.md, "Stragglers"): a data-parallel rank whose compute in a step
     stays more than straggler_margin (a fraction) above or below the median rank's for
     straggler_window steps in a row has its share of the global batch set by the measured
     speeds (0 window: never rebalanced). Written only when not the default. */
  double straggler_margin;
  int64_t straggler_window;
  /* a straggler whose compute per sample is at least this many times the median rank's is
     replaced by an idle spare, where the plan has one, rather than given a smaller share (0:
     never; at least 1 otherwise). Written only when set. */
  double straggler_replace;
  char backend[8];          /* a row of common/backend.h: cpu, nccl */
  /* 1: the restart mode (docs/elastic.md, "Scripts that do not link newt"): the workers are
     supervisors of programs that do not link newt (`newt worker --restart -- COMMAND`), and
     the job's steps are their beats, not the program's steps; the job ends done at a beat
     where every program exited 0, at most train.steps beats. Written only when set, so a spec
     of the previous release reads the same. */
  int restart;
} newt_spec;

/* The words of spec.fault.on_state_loss and spec.fault.on_mismatch ("checkpoint", "rollback");
 * NULL for a value out of range. Parse a word with spec_*_parse: -1 when it is none. */
const char *spec_state_loss_name(int v);
const char *spec_mismatch_name(int v);
int spec_state_loss_parse(const char *word);
int spec_mismatch_parse(const char *word);

/* The descriptor of a field of the spec by its path in the JSON ("train.global_batch", "job",
 * "model": a section is a field too); NULL when the spec has none. What the command line's
 * flags (job/spec_flags.h) write a field by. */
const struct codec_field *spec_field(const char *path);
/* The path of the spec's i-th field, sections opened ("job", "model.preset", ...) into path;
 * 0 once i is past the last. */
int spec_field_path(size_t i, char *path, size_t cap);

/* The restart mode's fields (docs/elastic.md, "Scripts that do not link newt"): restart set,
 * train.steps the most beats (SPEC_RESTART_BEATS), a global batch of SPEC_RESTART_BATCH
 * samples in micro-batches of 1 (a beat's samples are nobody's: they only let any world up to
 * it be planned). */
#define SPEC_RESTART_BEATS ((int64_t)1 << 40)
#define SPEC_RESTART_BATCH 1024
void spec_set_restart(newt_spec *s);

/* Defaults for everything; job set to `job`. */
void spec_defaults(newt_spec *s, const char *job);

/* Parses and validates a spec document; `s` is fully written only on success. */
newt_result_t spec_from_json(const char *text, size_t len, newt_spec *s);
newt_result_t spec_from_cjson(const cJSON *j, newt_spec *s);

/* Applies model overrides "layers=2,channels=64" (fields vocab, ctx, layers, heads,
 * channels); errors name the bad pair. */
newt_result_t spec_set_model(newt_spec *s, const char *list);

/* Checks the cross-field rules (batch divisibility, ranges); errors name the field. */
newt_result_t spec_validate(const newt_spec *s);

/* The spec as a JSON document (every field written); malloc'd, NULL on no memory. */
char *spec_to_json(const newt_spec *s);

/* Whether the spec, written as every process of the job will read it (spec_to_json), reads
 * back (spec_from_json) as itself: what a job publishes is what its readers accept. */
newt_result_t spec_check_json(const newt_spec *s);

/* Whether a running job may take spec b in place of a: it differs from a only in fields
 * that can change at a step boundary (parallel.dp_min, dp_max, start_*, ckpt.every, keep,
 * level, fault.comm_timeout_ms, hang_timeout_ms, report_window_ms, replica_every,
 * max_failures, failure_window_ms). 1: it may (*changed, when not NULL, lists what changed:
 * "ckpt.every 50 -> 100, ..."), 0: NEWT_ERR_CONFLICT set naming the first field that cannot
 * change and what to do. */
int spec_update_allowed(const newt_spec *a, const newt_spec *b, char *changed, size_t cap);

/* The token source as checkpoints name it: the data file, or "generated:<bytes>" for the
 * generated corpus. A checkpoint of other data is refused on resume, so every trainer
 * (`newt train`, the worker) names its data with this one function. */
void spec_data_desc(const newt_spec *s, char *out, size_t cap);

#endif
