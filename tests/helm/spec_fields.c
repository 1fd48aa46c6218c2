/* helm_spec_fields: the chart's job spec checked against newt's spec flag table
 * (job/spec_flags.h) and the spec's own table (job/spec.c), so that a field is spelt one way:
 *   1. every row of the flag table names a field of the spec;
 *   2. every spec field a flag sets is one the chart takes: in values.schema.json's "spec"
 *      (its type the field's), or set by newt.specJson (templates/_helpers.tpl: the job, the
 *      backend, dp_min, dp_max and the checkpoint directory come from other values);
 *   3. every field the chart names (the schema's "spec", newt.specJson's sets) is a field of
 *      the spec: a misspelt one fails here, not when a coordinator reads the rendered spec.
 * Usage: helm_spec_fields CHART_DIR (ctest: helm_spec_fields). One line per failure, then
 * "N passed, N failed"; exits 1 when any check failed. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "job/codec.h"
#include "job/spec.h"
#include "job/spec_flags.h"

static int passed, failed;

static void check(int ok, const char *fmt, const char *a, const char *b) {
  if (ok) {
    passed++;
    return;
  }
  failed++;
  printf("FAIL  ");
  printf(fmt, a, b);
  printf("\n");
}

/* The schema's type of a field of this kind. */
static const char *json_type(const codec_field *f) {
  switch (f->kind) {
    case CODEC_K_INT:
    case CODEC_K_CUSTOM: return "integer"; /* a seed: a number up to 2^53 in the chart */
    case CODEC_K_REAL: return "number";
    case CODEC_K_BOOL: return "boolean";
    case CODEC_K_OBJECT: return "object";
    default: return "string";
  }
}

/* The schema of spec field path ("train.lr"), NULL when the schema has none. */
static const cJSON *schema_of(const cJSON *spec, const char *path) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s", path);
  const cJSON *at = spec;
  for (char *save = NULL, *part = strtok_r(buf, ".", &save); part && at; part = strtok_r(NULL, ".", &save))
    at = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(at, "properties"), part);
  return at;
}

/* The fields newt.specJson sets from other values: `set $s "job"`, `set $s.parallel "dp_min"`,
 * as paths into out, each after a newline and before one ("\njob\nparallel.dp_min\n"). */
static void template_sets(const char *tpl, char *out, size_t cap) {
  const char *def = strstr(tpl, "define \"newt.specJson\"");
  const char *end = def ? strstr(def, "{{- end }}") : NULL;
  size_t l = (size_t)snprintf(out, cap, "\n");
  for (const char *p = def; p && p < end && (p = strstr(p, "set $s")) && p < end; p++) {
    char section[64] = "", key[64] = "";
    if (sscanf(p, "set $s.%63[a-z_] \"%63[a-z_]\"", section, key) != 2 && sscanf(p, "set $s \"%63[a-z_]\"", key) != 1)
      continue;
    l += (size_t)snprintf(out + l, cap - l, "%s%s%s\n", section, section[0] ? "." : "", key);
  }
}

static int set_by_template(const char *sets, const char *path) {
  char line[160];
  snprintf(line, sizeof line, "\n%s\n", path);
  return strstr(sets, line) != NULL;
}

/* Every leaf of the schema's spec (and every section) is a field of the spec. */
static void schema_fields(const cJSON *node, const char *prefix) {
  const cJSON *props = cJSON_GetObjectItemCaseSensitive(node, "properties");
  for (const cJSON *it = props ? props->child : NULL; it; it = it->next) {
    char path[128];
    snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", it->string);
    check(spec_field(path) != NULL, "values.schema.json: spec.%s is no field of the spec (job/spec.c)%s", path, "");
    if (cJSON_GetObjectItemCaseSensitive(it, "properties")) schema_fields(it, path);
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: helm_spec_fields CHART_DIR\n");
    return 2;
  }
  char file[1024];
  char *schema_text = NULL, *tpl = NULL;
  size_t len = 0;
  snprintf(file, sizeof file, "%s/values.schema.json", argv[1]);
  if (newt_fs_read_all(file, 1 << 22, &schema_text, &len) != NEWT_OK) {
    fprintf(stderr, "helm_spec_fields: %s\n", newt_errmsg());
    return 2;
  }
  snprintf(file, sizeof file, "%s/templates/_helpers.tpl", argv[1]);
  if (newt_fs_read_all(file, 1 << 22, &tpl, &len) != NEWT_OK) {
    fprintf(stderr, "helm_spec_fields: %s\n", newt_errmsg());
    return 2;
  }
  cJSON *schema = cJSON_Parse(schema_text);
  const cJSON *spec = schema ? schema_of(schema, "spec") : NULL;
  if (!spec) {
    fprintf(stderr, "helm_spec_fields: %s/values.schema.json has no properties.spec\n", argv[1]);
    return 2;
  }
  static char sets[4096];
  template_sets(tpl, sets, sizeof sets);
  check(sets[1] != '\0', "_helpers.tpl: newt.specJson sets no field (is the template's form changed?)%s%s", "", "");
  const char *path;
  for (size_t i = 0; spec_flag_row(i, &path); i++) {
    const char *flag = spec_flag_row(i, &path);
    const codec_field *f = spec_field(path);
    check(f != NULL, "--%s: spec.%s is no field of the spec (job/spec_flags.c)", flag, path);
    if (!f) continue;
    const cJSON *s = schema_of(spec, path);
    check(s || set_by_template(sets, path),
          "--%s: spec.%s is missing from values.schema.json's spec, and newt.specJson does not set it", flag, path);
    const cJSON *type = s ? cJSON_GetObjectItemCaseSensitive(s, "type") : NULL;
    if (type)
      check(cJSON_IsString(type) && strcmp(type->valuestring, json_type(f)) == 0,
            "values.schema.json: spec.%s: the spec's field is of type %s", path, json_type(f));
  }
  schema_fields(spec, "");
  for (char *line = sets + 1, *nl; *line && (nl = strchr(line, '\n')); line = nl + 1) {
    *nl = '\0';
    check(spec_field(line) != NULL, "_helpers.tpl: newt.specJson sets spec.%s, no field of the spec (job/spec.c)%s",
          line, "");
  }
  printf("%d passed, %d failed\n", passed, failed);
  cJSON_Delete(schema);
  free(schema_text);
  free(tpl);
  return failed ? 1 : 0;
}
