/* The parameter table: every tensor of the model as (name, shape, offset, size) in one
 * contiguous float buffer. Gradients and the AdamW moments use the identical layout, so
 * the optimizer is one loop, a checkpoint addresses tensors by name, and a ZeRO shard is
 * an (offset, length) range of the buffer.
 *
 * Order (a pipeline stage owns a contiguous run of it):
 *
 *   wte (V,C)  wpe (maxT,C)
 *   per layer l:  h.l.ln1.w (C)  h.l.ln1.b (C)  h.l.attn.qkv.w (3C,C)  h.l.attn.qkv.b (3C)
 *                 h.l.attn.proj.w (C,C)  h.l.attn.proj.b (C)  h.l.ln2.w (C)  h.l.ln2.b (C)
 *                 h.l.mlp.fc.w (4C,C)  h.l.mlp.fc.b (4C)  h.l.mlp.proj.w (C,4C)  h.l.mlp.proj.b (C)
 *   lnf.w (C)  lnf.b (C)
 *
 * Weights are (out, in) as in PyTorch's nn.Linear; the LM head is tied to wte. Offsets are
 * aligned to MODEL_ALIGN floats; the gaps are zero in params, grads and moments alike.
 * Each entry carries how Megatron-style tensor parallelism splits it (`split`) and whether
 * AdamW decays it (`decay`: 2-D tensors, GPT-2 practice). */
#ifndef NEWT_MODEL_LAYOUT_H
#define NEWT_MODEL_LAYOUT_H

#include <stddef.h>

#include "common/err.h"
#include "model/config.h"

#define MODEL_ALIGN 16 /* floats (64 bytes) */
#define MODEL_NAME_MAX 40

/* Which tensors a layer has, in order; index with model_tensor.slot. */
enum model_slot {
  MODEL_WTE = 0,
  MODEL_WPE,
  MODEL_LN1_W,
  MODEL_LN1_B,
  MODEL_QKV_W,
  MODEL_QKV_B,
  MODEL_PROJ_W,
  MODEL_PROJ_B,
  MODEL_LN2_W,
  MODEL_LN2_B,
  MODEL_FC_W,
  MODEL_FC_B,
  MODEL_FCPROJ_W,
  MODEL_FCPROJ_B,
  MODEL_LNF_W,
  MODEL_LNF_B,
  MODEL_SLOT__COUNT
};
#define MODEL_LAYER_SLOTS (MODEL_FCPROJ_B - MODEL_LN1_W + 1) /* 12 tensors per layer */

/* How tensor parallelism cuts a tensor (Megatron): column-parallel weights split their
 * output rows, row-parallel weights their input columns. QKV splits each of its three
 * row blocks (q, k, v) by heads. The vocab-parallel embedding splits wte's rows. */
typedef enum model_split {
  MODEL_SPLIT_NONE = 0, /* replicated on every tensor-parallel rank */
  MODEL_SPLIT_ROWS,     /* dim 0 (fc.w, fc.b, wte) */
  MODEL_SPLIT_COLS,     /* dim 1 (attn.proj.w, mlp.proj.w) */
  MODEL_SPLIT_QKV_ROWS, /* dim 0 in three blocks of C rows (qkv.w, qkv.b) */
} model_split;

typedef struct model_tensor {
  char name[MODEL_NAME_MAX]; /* "h.3.mlp.fc.w" */
  int slot;                  /* enum model_slot */
  int layer;                 /* block index, -1 for wte, wpe, lnf */
  int ndim;                  /* 1 or 2 */
  size_t shape[2];           /* shape[1] = 1 when ndim = 1 */
  size_t offset;             /* in floats from the start of the buffer */
  size_t size;               /* elements = shape[0] * shape[1] */
  int decay;                 /* 1: AdamW weight decay applies */
  model_split split;
} model_tensor;

typedef struct model_layout {
  model_config cfg;
  model_tensor *tensors; /* n entries in buffer order */
  size_t n;
  size_t total;          /* floats in the buffer, gaps included */
  size_t nparams;        /* sum of sizes (what people call the parameter count) */
} model_layout;

newt_result_t model_layout_init(model_layout *lay, const model_config *cfg);
void model_layout_free(model_layout *lay);

/* The tensor called `name`, or NULL. */
const model_tensor *model_layout_find(const model_layout *lay, const char *name);

/* The tensor of `slot` in `layer` (layer ignored for wte, wpe, lnf). */
const model_tensor *model_layout_get(const model_layout *lay, int slot, int layer);

/* The buffer range [*begin, *end) of layers [l0, l1) (both ends aligned), for pipeline stages. */
void model_layout_layer_range(const model_layout *lay, int l0, int l1, size_t *begin, size_t *end);

#endif
