/* The model's side of its checkpoints: what a training run stores and how it comes back.
 * ckpt/ stores and reads slices of named tensors and an opaque state JSON; this file says
 * what they are for the GPT.
 *
 * Tensors: the GPT's flat buffers (model/layout.h), weights under their layout names
 * ("h.3.mlp.fc.w"), AdamW moments as "adam.m/<name>" and "adam.v/<name>" (MODEL_PAR_NAME_M,
 * MODEL_PAR_NAME_V; model_par_pieces names its pieces the same way). A rank saves or loads
 * any range [off, off + len) of the buffer (all of it, a pipeline stage's run, a ZeRO
 * shard); each tensor the range crosses becomes one slice of that tensor, so what one
 * layout saved loads under any other. The alignment gaps of the layout are never stored.
 *
 * The training point: step, data cursor, optimizer update count, the learning rate of the
 * next step (model_lr_at), seeds and the run's configuration, as the state JSON below;
 * loading checks that a checkpoint is of the same run before its step is taken. */
#ifndef NEWT_GPT_CKPT_H
#define NEWT_GPT_CKPT_H

#include "ckpt/ckpt.h"
#include "model/layout.h"
#include "model/parallel.h"
#include "model/train.h"


typedef struct gpt_ckpt_bufs {
  const model_layout *layout;
  float *params;         /* full-layout buffer, or NULL (moments only) */
  float *m, *v;          /* AdamW moments indexed from moff (NULL: none) */
  size_t moff, mlen;     /* the buffer range the moments cover */
  size_t off, len;       /* the range to save or load */
} gpt_ckpt_bufs;

/* Adds the range's weights and moments to a begun save. */
newt_result_t gpt_ckpt_add(ckpt_saver *s, const gpt_ckpt_bufs *b);

/* The requests that read the range back into the same buffers: *reqs is one malloc'd
 * block (names included), *n its entries; free(*reqs) when done. */
newt_result_t gpt_ckpt_requests(const gpt_ckpt_bufs *b, ckpt_request **reqs, size_t *n);

/* ---- a training run under any layout ------------------------------------------------------ */

/* The training state stored with a run's checkpoint (the format below), for a run of
 * config c at a step: what every layout's committer stores, so a checkpoint of one layout
 * (or of newt train) resumes under any other. *state is the caller's (cJSON_Delete). */
newt_result_t gpt_ckpt_train_state(const model_train_config *c, int64_t step, uint64_t cursor,
                                     int64_t adam_t, const char *data, cJSON **state);

/* Whether a checkpoint's state document (of the given step) is of the run of config c and
 * data: NEWT_ERR_INVALID naming the field when not (another learning-rate schedule only
 * warns, once). For libnewt's newt_state_document. */
newt_result_t gpt_ckpt_check_state(const model_train_config *c, const char *data, const char *state_json, int64_t step);

typedef struct gpt_ckpt_train_point {
  int64_t step;
  uint64_t cursor;
  int64_t adam_t;
  int fallbacks; /* newer committed checkpoints skipped as torn or corrupt */
  int committed; /* committed checkpoints looked at (set on failure too): 0 on a fresh directory */
  int refused;   /* ... of which did not prove the key (another job's, or written without it) */
} gpt_ckpt_train_point;

/* Reads the requests (any slices of weights and moments) from the newest committed
 * checkpoint of dir with step <= max_step (CKPT_LATEST: any) that reads back whole, after
 * checking it is the same run (model, batch, sequence, seeds, data: a mismatch names the
 * field). NEWT_ERR_NOTFOUND when there is none. The requests' buffers may be partly
 * written on failure. */
newt_result_t gpt_ckpt_train_load(const char *dir, int64_t max_step, const model_train_config *c,
                                    const char *data, int threads, const ckpt_request *reqs, size_t n,
                                    const ckpt_key *key, gpt_ckpt_train_point *out);

/* ---- one rank of the parallel trainer (model/parallel.h), on any device -------------------- */

/* Adds the rank's primary pieces (model_par_pieces: each element once across the layout)
 * to a save begun with async = 1. Host-visible memory (the CPU) is given to the saver as it
 * is (copied at ckpt_save_end); device memory is downloaded into the saver's staging
 * (ckpt_save_reserve), every piece queued and one wait (model_dev_download_async: the
 * saver's staging must be model_dev_host_alloc memory of p's device, its staging_alloc).
 * On failure, end the save with ckpt_save_fail: what is staged may be half copied. */
newt_result_t gpt_ckpt_par_add(ckpt_saver *s, const model_par *p);

/* The saver staging gpt_ckpt_par_add takes for p (its primary pieces, each rounded up
 * to CKPT_STAGING_ALIGN): ckpt_saver_opts.staging_bytes or staging_hint. 0 on no memory. */
size_t gpt_ckpt_par_staging_bytes(const model_par *p);

/* Floats of all the pieces p holds (model_par_pieces): the host staging a load needs. */
size_t gpt_ckpt_par_floats(const model_par *p);

/* Reads every piece p holds from the newest committed checkpoint of dir with step <=
 * max_step that reads back whole (gpt_ckpt_train_load: the same run, or an error naming
 * the field), into p's buffers, and sets p->step and p->opt.t; *pt gets the point (the data
 * cursor with it). On a device the host cannot touch the pieces are read into host staging
 * and uploaded (queued, one wait): stage (gpt_ckpt_par_floats(p) floats of
 * model_dev_host_alloc memory of p's device, as model_dev_upload_async wants), or NULL for
 * such memory allocated for the call. NEWT_ERR_NOTFOUND when none loads
 * (pt->committed says whether there were any). p's buffers may be partly written on
 * failure. */
newt_result_t gpt_ckpt_par_load(const char *dir, int64_t max_step, model_par *p, const char *data, int threads,
                                  float *stage, const ckpt_key *key, gpt_ckpt_train_point *pt);

/* ---- a whole single-process trainer (model/train.h) --------------------------------------- */

/* The training state stored with a trainer's checkpoint:
 *   {"step", "cursor" (samples consumed), "adam_t" (optimizer updates), "lr" (of the next
 *    step), "rng": {"seed", "data_seed"}, "config": {"model": {vocab, ctx, layers, heads,
 *    channels}, "batch", "micro_batch", "seq_len", "data", "optim": {...}}}
 * `data` names the token source ("generated:<bytes>" or a file path). The RNG is
 * counter-based (model/rng.h): its whole state is the two seeds plus the step and cursor. */
newt_result_t gpt_ckpt_trainer_state(const model_trainer *tr, const char *data, cJSON **state);

/* Saves the trainer (weights, moments, state) as step tr->step; see ckpt_save_begin for
 * async and *started. */
newt_result_t gpt_ckpt_trainer_save(ckpt_saver *s, const model_trainer *tr, const char *data, int async,
                                      int *started);

/* Resumes tr from the newest committed checkpoint of dir that reads back whole: weights,
 * moments, step, cursor, optimizer count. *step is the step resumed, or -1 when dir holds
 * no committed checkpoint (tr untouched). A checkpoint of another model, data or batch is
 * refused with a message naming the field; other optimizer settings only warn. */
newt_result_t gpt_ckpt_trainer_resume(const char *dir, model_trainer *tr, const char *data, int threads,
                                        int64_t *step);

#endif
