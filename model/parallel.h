/* The parallel trainer: one rank of a tensor x pipeline x data-parallel layout, with ZeRO
 * stage 0..3, following the single-process trainer (train.h) step for step.
 *
 * Layout. tp * pp * dp ranks; rank = (pp_rank * dp + dp_rank) * tp + tp_rank (Megatron's
 * order, job/plan.h): a tensor-parallel group is tp consecutive ranks.
 *
 *   tensor parallel (tp)  Megatron: qkv (split by heads within each of q, k, v) and mlp.fc
 *                         are column-parallel, attn.proj and mlp.proj row-parallel, so a
 *                         block needs one all-reduce after each row-parallel projection in
 *                         the forward (g) and one after each column-parallel input gradient
 *                         in the backward (f): two and two per layer. wte is split by rows
 *                         (vocab-parallel embedding: lookup of the rank's rows, all-reduce;
 *                         vocab-parallel cross-entropy: all-reduces of the row max, and of
 *                         the sum of exponentials with the target's logit). Layernorms, wpe
 *                         and the row-parallel biases are replicated and stay identical.
 *   pipeline (pp)         stage s holds layers model_par_stage_layers(s); stage 0 also wte
 *                         and wpe, the last stage lnf and the tied head (wte again). The
 *                         micro-batches run on a 1F1B schedule (warmup pp - s - 1), the
 *                         activations and their gradients go point to point on the pipeline
 *                         group, and the two copies of wte add their gradients every step
 *                         (all-reduce over the first and last stage: the embedding group).
 *   data parallel (dp)    rank d takes model_batch_slice(batch, d, dp) of the global batch,
 *                         in micro-batches of micro_batch. Gradients are reduced in buckets
 *                         (one per layer, one each for wte, wpe and lnf), each launched
 *                         with an async collective as the backward of the last micro-batch
 *                         finishes it, and waited before the optimizer.
 *   ZeRO                  each bucket is padded to a multiple of dp and dp rank d owns its
 *                         d-th contiguous chunk (Megatron's distributed optimizer): stage 1
 *                         keeps the AdamW moments of the owned chunks only, all-reduces the
 *                         gradients, updates its chunks in place and all-gathers them; stage
 *                         2 reduce-scatters the gradients (in place) instead; stage 3 also
 *                         keeps only the owned chunks of the parameters, all-gathering each
 *                         bucket (a layer) just before its forward and again before its
 *                         backward into a working set of two buckets.
 *
 * Every rank allocates only what it holds: its stage's tensors at their tensor-parallel
 * shapes (model_par.local: names as in the global table, offsets into params/grads), the
 * activations of the micro-batches its stage has in flight (pp - s at most), and the
 * moments (and, with ZeRO 3, the parameters) of its chunks. The gradient norm for clipping
 * is the single-process one: squares summed once per global element (tensor-parallel
 * shards once each, replicated tensors on tp rank 0, the head's copy of wte not at all,
 * data-parallel replicas once). The step ends, before anything is updated, with one
 * all-gather over the world of every rank's squares, loss and control values, summed in
 * rank order in double (the same bits on every rank; one rank alone is model_trainer bit
 * for bit). docs/model.md ("Parallel training") has the tables and figures.
 *
 *   model_par_config pc;
 *   model_par_config_from_rank(&pc, tp, pp, dp, zero, comm_rank(world));
 *   model_par_comms comms;
 *   model_par_comms_split(world, &pc, &comms);            // collective over world
 *   model_par p;
 *   model_par_init(&p, &train_cfg, &pc);                  // weights = model_trainer's
 *   ... each step: fetch this dp rank's slice of the global batch, then
 *   model_par_step(&p, &comms, inputs, targets, count, NULL, &info);
 *   model_par_free(&p); model_par_comms_free(&comms);
 *
 * Device. Everything a rank owns (parameters, gradients, moments, shards, the ZeRO-3
 * working buffers, activations, scratch, the end-of-step record) is memory of its device
 * (pc.dev, model/dev.h), and every computation is a kernel of that device (model_k_*): the
 * same code trains on the CPU and on a GPU. The host reads nothing of it directly: the
 * tokens go up once per micro-batch (model_dev_upload), and the step's one download is the
 * end-of-step record (every rank's squares, loss and control values) into host staging
 * (model_dev_host_alloc). Collectives get device pointers (the CPU backend with the CPU
 * device, NCCL with a GPU). docs/model.md, "Devices", has the rules.
 *
 * State for restore and checkpoints: model_par_pieces lists every piece of a global tensor
 * this rank holds (parameters and both moments), as checkpoint slices with pointers into
 * this rank's buffers: device pointers (of p.dev); read them to
 * save or send, write them to restore, through model_dev_download / model_dev_upload unless
 * model_dev_host_visible. The scalar state is p.step (optimizer steps done) and p.opt.t
 * (AdamW updates done). */
#ifndef NEWT_MODEL_PARALLEL_H
#define NEWT_MODEL_PARALLEL_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "common/err.h"
#include "common/slice.h"
#include "model/dev.h"
#include "model/gpt.h"
#include "model/optim.h"
#include "model/train.h"

/* ---- the layout ------------------------------------------------------------------------ */

typedef struct model_par_config {
  int tp, pp, dp; /* group sizes, each >= 1 */
  int zero;       /* ZeRO stage 0..3 */
  int tp_rank, pp_rank, dp_rank;
  model_dev *dev; /* the device the rank trains on (model/dev.h); NULL: model_dev_cpu() */
  int max_micro;  /* the most micro-batches a data-parallel rank takes per step, when the ranks'
                     shares are uneven by more than a sample (a rebalanced plan); 0: those of
                     model_batch_slice's first rank. A step then takes any count up to it. */
} model_par_config;

/* The coordinates of world rank `rank` (rank = (pp_rank * dp + dp_rank) * tp + tp_rank). */
void model_par_config_from_rank(model_par_config *pc, int tp, int pp, int dp, int zero, int rank);
/* This rank's world rank. */
int model_par_world_rank(const model_par_config *pc);
/* Checks the layout against the training config; the error names the field: tp must divide
 * heads and vocab, pp <= layers, dp <= batch, zero in 0..3, coordinates in range. */
newt_result_t model_par_config_check(const model_par_config *pc, const model_train_config *cfg);
/* The layers [*l0, *l1) of stage `stage` of pp: contiguous, as even as possible (the first
 * layers % pp stages take one more). */
void model_par_stage_layers(int layers, int pp, int stage, int *l0, int *l1);

/* ---- communicators ----------------------------------------------------------------------- */

/* One generation's communicators, children of `world` (comm_split). A group of one rank has
 * no communicator (NULL); the trainer skips its collectives. */
typedef struct model_par_comms {
  comm_t *world; /* every rank of the layout (not owned) */
  comm_t *tp;    /* same (pp, dp): the tensor-parallel group, ordered by tp_rank */
  comm_t *dp;    /* same (pp, tp): the data-parallel group, ordered by dp_rank */
  comm_t *pp;    /* same (dp, tp): the pipeline, ordered by pp_rank */
  comm_t *emb;   /* pp > 1, first and last stage of one pipeline: the tied embedding's group */
} model_par_comms;

/* The comm_split colors and keys of the groups (exposed for tests and tools): ranks with the
 * same color form a group ordered by key; color -1: not a member. */
typedef enum model_par_group { MODEL_PAR_TP = 0, MODEL_PAR_DP, MODEL_PAR_PP, MODEL_PAR_EMB } model_par_group;
void model_par_group_color(const model_par_config *pc, model_par_group g, int *color, int *key);

/* Builds the groups of more than one rank: collective over world, whose rank and size
 * must be model_par_world_rank(pc) and tp * pp * dp. On failure nothing is left allocated. */
newt_result_t model_par_comms_split(comm_t *world, const model_par_config *pc, model_par_comms *out);
/* Frees the children (not world). */
void model_par_comms_free(model_par_comms *c);

/* ---- the trainer --------------------------------------------------------------------------- */

/* One bucket of the local buffer: a layer, wte, wpe, or the final layernorm. */
#define MODEL_PAR_UNIT_WTE (-1)
#define MODEL_PAR_UNIT_LNF (-2)
#define MODEL_PAR_UNIT_WPE (-3)
typedef struct model_par_unit {
  size_t off, len; /* local buffer range; len is a multiple of dp * MODEL_ALIGN */
  size_t chunk;    /* len / dp: each data-parallel rank owns one chunk */
  size_t soff;     /* where this rank's chunk sits in the shard buffers */
  int layer;       /* the layer, or MODEL_PAR_UNIT_WTE, _WPE, _LNF */
} model_par_unit;

/* One box of a global tensor a local tensor holds (3 for qkv, 1 otherwise). */
typedef struct model_par_box {
  size_t local_off;        /* element of the local tensor the box starts at */
  size_t row0, col0;       /* the box's origin in the global tensor */
  size_t rows, cols;       /* its shape (cols 1 for 1-D tensors) */
} model_par_box;

typedef struct model_par_tensor {
  const model_tensor *global; /* in model_par.global */
  const model_tensor *local;  /* in model_par.local */
  int unit;
  int nbox;
  model_par_box box[3];
} model_par_tensor;

typedef struct model_par {
  model_train_config cfg;
  model_par_config pc;
  int l0, l1;             /* this stage's layers */
  int first, last;        /* stage 0, stage pp - 1 */
  model_layout global;    /* the whole model's table */
  model_layout local;     /* this rank's tensors: tensor-parallel shapes, offsets in params/grads */
  model_par_tensor *ten;  /* local.n entries, in local order */
  int *of_global;         /* global tensor index -> local index, -1 when not held */
  model_par_unit *units;
  int nunits;
  model_dev *dev;         /* pc.dev, or model_dev_cpu(): where every buffer below lives */
  /* Buffers (floats, device memory). params: the local layout (NULL with ZeRO 3); grads: the local layout,
   * accumulated over the micro-batches. The shard buffers hold this rank's chunks, one after
   * the other (shard_len floats): always the moments (opt.m, opt.v; ZeRO 0: the whole local
   * layout), with ZeRO 3 also shard_params and shard_grads (ZeRO 0: aliases of params and
   * grads; ZeRO 1/2: NULL, the chunks are updated in place in params). */
  float *params, *grads;
  float *shard_params, *shard_grads;
  size_t shard_len;
  model_layout shard;     /* ZeRO 3: the runs of tensors in the shard buffers (optimizer table) */
  model_adamw opt;        /* AdamW's moments and t (updates done) */
  int64_t step;           /* optimizer steps done */
  int params_stale;       /* ZeRO 1/2: a step's all-gather failed; only the owned chunks of params hold */
  /* working memory */
  model_acts *acts;       /* the micro-batches in flight */
  int nacts;
  model_scratch scratch;
  float *ce;              /* vocab-parallel cross-entropy: 3 floats per token */
  /* the end of a step: rec is this rank's totals (squared gradients and loss, as doubles),
   * host_rec the host staging they are downloaded into; loss_acc[0] sums the token losses of
   * the micro-batches (loss_acc[1] those of ZeRO 3's empty ones, which count for nothing) */
  void *rec, *host_rec;
  double t_step;          /* when the step began (model_par_grads) */
  double *loss_acc;
  float *gather[2];       /* ZeRO 3: two buckets' parameters */
  int gathered[2];        /* the unit each holds (-1: none) */
  int gather_next;
  size_t gather_len;
  comm_req_t **reqs;      /* one per unit: the bucket reductions in flight */
} model_par;

/* Allocates this rank's part of the model and initialises it as model_trainer_init would
 * (the same weights, element for element). No communication. */
newt_result_t model_par_init(model_par *p, const model_train_config *cfg, const model_par_config *pc);
/* The same without the initial weights (zero, to be filled from elsewhere: a restore), and
 * the initialisation alone (weights from the seed, moments zero, step 0). */
newt_result_t model_par_alloc(model_par *p, const model_train_config *cfg, const model_par_config *pc);
newt_result_t model_par_init_weights(model_par *p);
void model_par_free(model_par *p);
/* The same rank in a layout that differs only in its data-parallel size and place, under
 * ZeRO 0 (every data-parallel rank holds the whole replica, in buffers of the same layout at
 * any dp): pc taken in place, the buffers and their contents kept. NEWT_ERR_UNSUPPORTED
 * where the buffers would differ (another stage or tensor-parallel slice, ZeRO 1-3, a
 * pipeline stage that keeps more micro-batches in flight): make a new trainer then. */
newt_result_t model_par_relayout(model_par *p, const model_par_config *pc);

/* One optimizer step over the global batch. inputs and targets are this data-parallel
 * rank's slice of it ((count, T) each; count from model_batch_slice(cfg.batch, dp_rank,
 * dp)); every rank of the pipeline passes the same slice (stage 0 reads the inputs, the
 * last stage the targets). c may be NULL for a layout of one rank. info (may be NULL) gets
 * the step number, the mean loss over the global batch and the gradient norm (the same on
 * every rank), lr, tokens and ms.
 *
 * In two halves, for a caller that agrees on the step between them (libnewt's
 * newt_step_commit): model_par_grads runs the schedule (forward, backward, the gradients
 * reduced over the data-parallel group) and gives this rank's part of the step's totals,
 * its squared gradients (each element of the model counted once across the layout) and its
 * loss sum, as two doubles in host memory; summed over the world's ranks in rank order
 * (bitwise the same everywhere), model_par_apply clips, updates and advances p.step.
 * model_par_step is the two with that sum between them, over c's world.
 *
 * A failed collective returns its error. When the error came before the update, nothing
 * was updated (step unchanged); after it (ZeRO 1/2's parameter all-gather), the step was
 * applied, p.step advanced, and params_stale says the full parameters are not to be used:
 * the next step on a healthy communicator gathers them again first. */
newt_result_t model_par_grads(model_par *p, const model_par_comms *c, const int32_t *inputs,
                              const int32_t *targets, int count, double part[2]);
newt_result_t model_par_apply(model_par *p, const model_par_comms *c, const double sums[2], model_step_info *info);
newt_result_t model_par_step(model_par *p, const model_par_comms *c, const int32_t *inputs,
                             const int32_t *targets, int count, model_step_info *info);

/* Bytes this rank holds: *state (parameters, gradients, shards, moments, ZeRO-3 working
 * buffers) and *acts (activations of the micro-batches in flight, scratch). */
void model_par_memory(const model_par *p, size_t *state, size_t *acts);

/* ---- state as pieces of global tensors ------------------------------------------------------ */

typedef enum model_par_kind { MODEL_PAR_PARAM = 0, MODEL_PAR_ADAM_M, MODEL_PAR_ADAM_V } model_par_kind;

/* The moments' tensors are named after their weight's: "adam.m/h.0.attn.qkv.w". */
#define MODEL_PAR_NAME_M "adam.m/"
#define MODEL_PAR_NAME_V "adam.v/"

typedef struct model_par_piece {
  model_par_kind kind;
  const model_tensor *tensor; /* the global tensor (in model_par.global) */
  newt_tensor_desc desc;      /* the tensor: the weight's name, or MODEL_PAR_NAME_M /
                                 MODEL_PAR_NAME_V + it;
                                 F32; the global shape */
  newt_slice slice;           /* the box this rank holds (tensor and pipeline parallelism),
                                 narrowed to a range of its row-major order (ZeRO chunks) */
  float *data;                /* newt_slice_numel(&slice) floats in slice order, in this
                                 rank's buffers: read to save or send, written to restore */
  int primary;                /* 1 for exactly one copy of each element across the layout
                                 (tp rank 0 for replicated tensors, the first stage for wte,
                                 dp rank 0 for data-parallel replicas): the copy to save */
  int derived;                /* ZeRO 1/2's full parameters: rebuilt after each update from the
                                 ranks' owned chunks (listed as pieces of their own), so a
                                 state is whole without them (never primary) */
} model_par_piece;

/* Every piece this rank holds: parameters (with ZeRO 1/2 the owned chunks, and the full
 * parameters as derived pieces), then the m and v moments. *out is one malloc'd block
 * (names included; desc.name points into it): free(*out) when done. The pointers are
 * memory of p.dev (host memory only when model_dev_host_visible) and stay valid until
 * model_par_free. After writing pieces to restore, set p.step and p.opt.t, and clear
 * params_stale when the full parameters were written too. */
newt_result_t model_par_pieces(const model_par *p, model_par_piece **out, size_t *n);

#endif
