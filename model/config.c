/* Presets and overrides of the model's shape (see config.h). */
#include "model/config.h"

#include <stdio.h>
#include <string.h>

#include "common/strutil.h"

static const struct {
  const char *name;
  model_config cfg;
} presets[] = {
    {"tiny", {.vocab = 256, .ctx = 64, .layers = 4, .heads = 4, .channels = 128}},
    {"small", {.vocab = 256, .ctx = 256, .layers = 6, .heads = 6, .channels = 384}},
    {"gpt2-124m", {.vocab = 50257, .ctx = 1024, .layers = 12, .heads = 12, .channels = 768}},
};
#define NPRESETS ((int)(sizeof presets / sizeof presets[0]))

int model_config_npresets(void) { return NPRESETS; }

const char *model_config_preset_name(int i) { return i >= 0 && i < NPRESETS ? presets[i].name : NULL; }

newt_result_t model_config_preset(const char *name, model_config *cfg) {
  for (int i = 0; i < NPRESETS; i++)
    if (name && strcmp(name, presets[i].name) == 0) {
      *cfg = presets[i].cfg;
      return NEWT_OK;
    }
  return NEWT_ERR(NEWT_ERR_INVALID, "model preset \"%s\" is unknown (tiny, small or gpt2-124m)",
                  name ? name : "(null)");
}

/* The field of cfg named `field`: NULL when there is none of that name. */
static int64_t *field_slot(model_config *cfg, const char *field) {
  if (strcmp(field, "vocab") == 0) return &cfg->vocab;
  if (strcmp(field, "ctx") == 0) return &cfg->ctx;
  if (strcmp(field, "layers") == 0) return &cfg->layers;
  if (strcmp(field, "heads") == 0) return &cfg->heads;
  if (strcmp(field, "channels") == 0) return &cfg->channels;
  return NULL;
}

static newt_result_t unknown_field(const char *field) {
  return NEWT_ERR(NEWT_ERR_INVALID, "model field \"%s\" is unknown (vocab, ctx, layers, heads or channels)", field);
}

newt_result_t model_config_set_int(model_config *cfg, const char *field, int64_t v) {
  int64_t *slot = field_slot(cfg, field);
  if (!slot) return unknown_field(field);
  *slot = v;
  return NEWT_OK;
}

newt_result_t model_config_set(model_config *cfg, const char *field, const char *value) {
  if (!field_slot(cfg, field)) return unknown_field(field);
  int64_t v;
  if (newt_parse_int(value, &v) != 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "model.%s: expected an integer, got \"%s\"", field, value);
  return model_config_set_int(cfg, field, v);
}

newt_result_t model_config_override(model_config *cfg, const char *list) {
  if (!list) return NEWT_OK;
  const char *p = list;
  while (*p) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    char item[128];
    if (n >= sizeof item)
      return NEWT_ERR(NEWT_ERR_INVALID, "model override \"%.*s...\" is too long", 32, p);
    memcpy(item, p, n);
    item[n] = '\0';
    char *eq = strchr(item, '=');
    if (n > 0) {
      if (!eq)
        return NEWT_ERR(NEWT_ERR_INVALID, "model override \"%s\": expected field=value", item);
      *eq = '\0';
      NEWT_CHECK(model_config_set(cfg, item, eq + 1));
    }
    p += n;
    if (*p == ',') p++;
  }
  return NEWT_OK;
}

newt_result_t model_config_check(const model_config *c) {
  if (c->vocab < 2 || c->vocab > (1 << 24))
    return NEWT_ERR(NEWT_ERR_INVALID, "model.vocab = %lld: must be in [2, 16777216]", (long long)c->vocab);
  if (c->ctx < 1 || c->ctx > (1 << 16))
    return NEWT_ERR(NEWT_ERR_INVALID, "model.ctx = %lld: must be in [1, 65536]", (long long)c->ctx);
  if (c->layers < 1 || c->layers > 1024)
    return NEWT_ERR(NEWT_ERR_INVALID, "model.layers = %lld: must be in [1, 1024]", (long long)c->layers);
  if (c->channels < 1 || c->channels > (1 << 16))
    return NEWT_ERR(NEWT_ERR_INVALID, "model.channels = %lld: must be in [1, 65536]",
                    (long long)c->channels);
  if (c->heads < 1 || c->channels % c->heads != 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "model.heads = %lld: must divide model.channels = %lld",
                    (long long)c->heads, (long long)c->channels);
  return NEWT_OK;
}
