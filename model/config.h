/* The GPT-2 model's shape: presets (tiny, small, gpt2-124m) and field overrides.
 *
 * A config is five integers; every other size (head size, MLP width, the tensor table)
 * is derived from them. A field is set by name with its value (model_config_set_int: a
 * spec's numbers), or from text (model_config_set, model_config_override: "field=value"
 * pairs a person typed); all are checked together by model_config_check, whose errors
 * name the field. */
#ifndef NEWT_MODEL_CONFIG_H
#define NEWT_MODEL_CONFIG_H

#include <stdint.h>

#include "common/err.h"

typedef struct model_config {
  int64_t vocab;    /* V: token ids are in [0, V) */
  int64_t ctx;      /* maxT: longest sequence, rows of the position embedding */
  int64_t layers;   /* L: transformer blocks */
  int64_t heads;    /* NH: attention heads; C must be a multiple of NH */
  int64_t channels; /* C: model width */
} model_config;

/* The presets by name: "tiny" (V 256, ctx 64, L 4, NH 4, C 128), "small" (V 256, ctx 256,
 * L 6, NH 6, C 384), "gpt2-124m" (V 50257, ctx 1024, L 12, NH 12, C 768). */
newt_result_t model_config_preset(const char *name, model_config *cfg);

/* Sets one field by name ("vocab", "ctx", "layers", "heads", "channels") to v. */
newt_result_t model_config_set_int(model_config *cfg, const char *field, int64_t v);
/* The same from text a person typed: value is decimal. */
newt_result_t model_config_set(model_config *cfg, const char *field, const char *value);

/* Applies a comma-separated list of overrides: "layers=2,channels=64". NULL or "" is a no-op. */
newt_result_t model_config_override(model_config *cfg, const char *list);

/* Checks ranges and divisibility; the error names the field. */
newt_result_t model_config_check(const model_config *cfg);

/* Number of presets and their names (for --help and tests). */
int model_config_npresets(void);
const char *model_config_preset_name(int i);

#endif
