/* Builds the parameter table (see layout.h): walks the tensors in buffer order, giving
 * each an aligned offset. */
#include "model/layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const slot_names[MODEL_SLOT__COUNT] = {
    "wte", "wpe", "ln1.w", "ln1.b", "attn.qkv.w", "attn.qkv.b", "attn.proj.w", "attn.proj.b",
    "ln2.w", "ln2.b", "mlp.fc.w", "mlp.fc.b", "mlp.proj.w", "mlp.proj.b", "lnf.w", "lnf.b",
};

static size_t align_up(size_t x) { return (x + MODEL_ALIGN - 1) / MODEL_ALIGN * MODEL_ALIGN; }

static void add(model_layout *lay, int slot, int layer, size_t d0, size_t d1, int ndim,
                model_split split) {
  model_tensor *t = &lay->tensors[lay->n++];
  if (layer >= 0) snprintf(t->name, sizeof t->name, "h.%d.%s", layer, slot_names[slot]);
  else snprintf(t->name, sizeof t->name, "%s", slot_names[slot]);
  t->slot = slot;
  t->layer = layer;
  t->ndim = ndim;
  t->shape[0] = d0;
  t->shape[1] = ndim == 2 ? d1 : 1;
  t->size = t->shape[0] * t->shape[1];
  t->offset = lay->total;
  t->decay = ndim == 2;
  t->split = split;
  lay->total = align_up(lay->total + t->size);
  lay->nparams += t->size;
}

newt_result_t model_layout_init(model_layout *lay, const model_config *cfg) {
  memset(lay, 0, sizeof *lay);
  NEWT_CHECK(model_config_check(cfg));
  lay->cfg = *cfg;
  size_t V = cfg->vocab, T = cfg->ctx, C = cfg->channels, L = cfg->layers;
  lay->tensors = calloc(4 + L * MODEL_LAYER_SLOTS, sizeof *lay->tensors);
  NEWT_CHECK_ALLOC(lay->tensors);
  add(lay, MODEL_WTE, -1, V, C, 2, MODEL_SPLIT_ROWS);
  add(lay, MODEL_WPE, -1, T, C, 2, MODEL_SPLIT_NONE);
  for (int l = 0; l < (int)L; l++) {
    add(lay, MODEL_LN1_W, l, C, 0, 1, MODEL_SPLIT_NONE);
    add(lay, MODEL_LN1_B, l, C, 0, 1, MODEL_SPLIT_NONE);
    add(lay, MODEL_QKV_W, l, 3 * C, C, 2, MODEL_SPLIT_QKV_ROWS);
    add(lay, MODEL_QKV_B, l, 3 * C, 0, 1, MODEL_SPLIT_QKV_ROWS);
    add(lay, MODEL_PROJ_W, l, C, C, 2, MODEL_SPLIT_COLS);
    add(lay, MODEL_PROJ_B, l, C, 0, 1, MODEL_SPLIT_NONE);
    add(lay, MODEL_LN2_W, l, C, 0, 1, MODEL_SPLIT_NONE);
    add(lay, MODEL_LN2_B, l, C, 0, 1, MODEL_SPLIT_NONE);
    add(lay, MODEL_FC_W, l, 4 * C, C, 2, MODEL_SPLIT_ROWS);
    add(lay, MODEL_FC_B, l, 4 * C, 0, 1, MODEL_SPLIT_ROWS);
    add(lay, MODEL_FCPROJ_W, l, C, 4 * C, 2, MODEL_SPLIT_COLS);
    add(lay, MODEL_FCPROJ_B, l, C, 0, 1, MODEL_SPLIT_NONE);
  }
  add(lay, MODEL_LNF_W, -1, C, 0, 1, MODEL_SPLIT_NONE);
  add(lay, MODEL_LNF_B, -1, C, 0, 1, MODEL_SPLIT_NONE);
  return NEWT_OK;
}

void model_layout_free(model_layout *lay) {
  free(lay->tensors);
  memset(lay, 0, sizeof *lay);
}

const model_tensor *model_layout_find(const model_layout *lay, const char *name) {
  for (size_t i = 0; i < lay->n; i++)
    if (strcmp(lay->tensors[i].name, name) == 0) return &lay->tensors[i];
  return NULL;
}

const model_tensor *model_layout_get(const model_layout *lay, int slot, int layer) {
  if (slot == MODEL_WTE || slot == MODEL_WPE) return &lay->tensors[slot];
  if (slot == MODEL_LNF_W || slot == MODEL_LNF_B) return &lay->tensors[lay->n - 2 + (slot - MODEL_LNF_W)];
  return &lay->tensors[2 + (size_t)layer * MODEL_LAYER_SLOTS + (slot - MODEL_LN1_W)];
}

void model_layout_layer_range(const model_layout *lay, int l0, int l1, size_t *begin, size_t *end) {
  *begin = model_layout_get(lay, MODEL_LN1_W, l0)->offset;
  *end = l1 >= (int)lay->cfg.layers ? model_layout_get(lay, MODEL_LNF_W, 0)->offset
                                    : model_layout_get(lay, MODEL_LN1_W, l1)->offset;
}
