/* Checkpoints of the GPT's flat buffers (model/layout.h): weights under their layout names
 * ("h.3.mlp.fc.w"), AdamW moments as "adam.m/<name>" and "adam.v/<name>". A rank saves or
 * loads any range [off, off + len) of the buffer (all of it, a pipeline stage's run, a ZeRO
 * shard); each tensor the range crosses becomes one slice of that tensor, so what one
 * layout saved loads under any other. The alignment gaps of the layout are never stored.
 * Built into newt_ckpt when newt_model exists. */
#ifndef NEWT_CKPT_MODEL_STATE_H
#define NEWT_CKPT_MODEL_STATE_H

#include "ckpt/ckpt.h"
#include "model/layout.h"
#include "model/train.h"

typedef struct ckpt_model_bufs {
  const model_layout *layout;
  float *params;         /* full-layout buffer, or NULL (moments only) */
  float *m, *v;          /* AdamW moments indexed from moff (NULL: none) */
  size_t moff, mlen;     /* the buffer range the moments cover */
  size_t off, len;       /* the range to save or load */
} ckpt_model_bufs;

/* Adds the range's weights and moments to a begun save. */
newt_result_t ckpt_model_add(ckpt_saver *s, const ckpt_model_bufs *b);

/* The requests that read the range back into the same buffers: *reqs is one malloc'd
 * block (names included), *n its entries; free(*reqs) when done. */
newt_result_t ckpt_model_requests(const ckpt_model_bufs *b, ckpt_request **reqs, size_t *n);

/* ---- a whole single-process trainer (newt train) --------------------------------------- */

/* The training state stored with a trainer's checkpoint:
 *   {"step", "cursor" (samples consumed), "adam_t" (optimizer updates), "lr" (of the next
 *    step), "rng": {"seed", "data_seed"}, "config": {"model": {vocab, ctx, layers, heads,
 *    channels}, "batch", "micro_batch", "seq_len", "data", "optim": {...}}}
 * `data` names the token source ("generated:<bytes>" or a file path). The RNG is
 * counter-based (model/rng.h): its whole state is the two seeds plus the step and cursor. */
newt_result_t ckpt_trainer_state(const model_trainer *tr, const char *data, char **json);

/* Saves the trainer (weights, moments, state) as step tr->step; see ckpt_save_begin for
 * async and *started. */
newt_result_t ckpt_trainer_save(ckpt_saver *s, const model_trainer *tr, const char *data, int async, int *started);

/* Resumes tr from the newest committed checkpoint of dir that reads back whole: weights,
 * moments, step, cursor, optimizer count. *step is the step resumed, or -1 when dir holds
 * no committed checkpoint (tr untouched). A checkpoint of another model, data or batch is
 * refused with a message naming the field; other optimizer settings only warn. */
newt_result_t ckpt_trainer_resume(const char *dir, model_trainer *tr, const char *data, int threads, int64_t *step);

#endif
