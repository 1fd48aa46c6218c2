/* The descriptor engine behind every record of a job (see codec.h): one walk over a table
 * writes a record, another reads and checks it. Each kind has one writer and one reader
 * here; what a record adds of its own lives in its table's check, skip and custom hooks. */
#include "job/codec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/name.h"

/* --- fields in the struct ------------------------------------------------------------------ */

static void *at(void *rec, const codec_field *f) { return (char *)rec + f->off; }
static const void *cat(const void *rec, const codec_field *f) { return (const char *)rec + f->off; }

/* An integer field of 4 (int, an enum) or 8 bytes (int64_t, uint64_t: the bits as they are). */
static int64_t load_int(const void *rec, const codec_field *f) {
  if (f->size == sizeof(int32_t)) {
    int32_t v;
    memcpy(&v, cat(rec, f), sizeof v);
    return v;
  }
  int64_t v;
  memcpy(&v, cat(rec, f), sizeof v);
  return v;
}

static void store_int(void *rec, const codec_field *f, int64_t v) {
  if (f->size == sizeof(int32_t)) {
    int32_t x = (int32_t)v;
    memcpy(at(rec, f), &x, sizeof x);
  } else {
    memcpy(at(rec, f), &v, sizeof v);
  }
}

static double load_real(const void *rec, const codec_field *f) {
  double v;
  memcpy(&v, cat(rec, f), sizeof v);
  return v;
}

static void store_real(void *rec, const codec_field *f, double v) { memcpy(at(rec, f), &v, sizeof v); }

static int *count_of(void *rec, const codec_field *f) { return (int *)((char *)rec + f->count_off); }
static int count_in(const void *rec, const codec_field *f) { return *(const int *)((const char *)rec + f->count_off); }

/* The names of a NAMES field: the array in the struct, or the malloc'd one it points to. */
typedef char name_t[NEWT_ID_MAX];
static name_t *names_in(const void *rec, const codec_field *f) {
  if (f->cap > 0) return (name_t *)cat(rec, f);
  name_t *p;
  memcpy(&p, cat(rec, f), sizeof p);
  return p;
}

static int is_string(codec_kind k) {
  return k == CODEC_K_WORD || k == CODEC_K_TEXT || k == CODEC_K_PRINTABLE || k == CODEC_K_TOKEN || k == CODEC_K_STR ||
         k == CODEC_K_NAME;
}

static int has_range(const codec_field *f) { return f->min != 0 || f->max != 0; }

static int64_t max_of(const void *rec, const codec_field *f) {
  if (!f->max_of) return f->max;
  int64_t v;
  memcpy(&v, (const char *)rec + f->max_of - 1, sizeof v);
  return v < f->max ? v : f->max;
}

static int word_count(const char *const *words) {
  int n = 0;
  while (words[n]) n++;
  return n;
}

/* --- defaults ------------------------------------------------------------------------------ */

void codec_defaults(const codec_table *t, void *rec) {
  for (size_t i = 0; i < t->n; i++) {
    const codec_field *f = &t->fields[i];
    if (f->kind == CODEC_K_OBJECT) codec_defaults(f->sub, rec);
    else if (f->kind == CODEC_K_REAL) store_real(rec, f, f->ddef);
    else if (is_string(f->kind)) snprintf(at(rec, f), f->size, "%s", f->sdef ? f->sdef : "");
    else if (f->kind == CODEC_K_NAMES) {
      if (f->cap > 0) memset(at(rec, f), 0, f->size);
      *count_of(rec, f) = 0;
    } else if (f->size == sizeof(int32_t) || f->size == sizeof(int64_t)) store_int(rec, f, f->def);
    else memset(at(rec, f), 0, f->size);
  }
}

void codec_free(const codec_table *t, void *rec) {
  for (size_t i = 0; i < t->n; i++) {
    const codec_field *f = &t->fields[i];
    if (f->kind == CODEC_K_OBJECT) codec_free(f->sub, rec);
    if (f->kind != CODEC_K_NAMES || f->cap > 0) continue;
    free(names_in(rec, f));
    memset(at(rec, f), 0, sizeof(name_t *));
    *count_of(rec, f) = 0;
  }
}

/* --- writing ------------------------------------------------------------------------------- */

/* Whether an omit field holds its default, or a value its reader would refuse. */
static int at_default(const codec_field *f, const void *rec) {
  switch (f->kind) {
    case CODEC_K_INT: {
      int64_t v = load_int(rec, f);
      return v == f->def || (has_range(f) && (v < f->min || v > max_of(rec, f)));
    }
    case CODEC_K_REAL: {
      double v = load_real(rec, f);
      int nan_ok = (f->flags & CODEC_NULL) && isnan(v);
      return v == f->ddef || (f->dmin < f->dmax && !nan_ok && !(v >= f->dmin && v <= f->dmax));
    }
    case CODEC_K_NAMES: return count_in(rec, f) == 0;
    case CODEC_K_OBJECT:
    case CODEC_K_CUSTOM: return 0;
    default:
      if (is_string(f->kind)) return strcmp(cat(rec, f), f->sdef ? f->sdef : "") == 0;
      return load_int(rec, f) == f->def;
  }
}

static cJSON *add_names(cJSON *obj, const codec_field *f, const void *rec) {
  cJSON *a = cJSON_AddArrayToObject(obj, f->name);
  name_t *names = names_in(rec, f);
  int n = count_in(rec, f);
  if (f->cap > 0 && n > f->cap) n = f->cap;
  for (int i = 0; a && i < n; i++) {
    cJSON *s = cJSON_CreateString(names[i]);
    if (!s || !cJSON_AddItemToArray(a, s)) {
      cJSON_Delete(s);
      return NULL;
    }
  }
  return a;
}

/* One field into obj: NEWT_OK, or NEWT_ERR_NOMEM. */
static newt_result_t encode_field(cJSON *obj, const codec_field *f, const void *rec) {
  const cJSON *added = NULL;
  switch (f->kind) {
    case CODEC_K_INT: added = newt_json_add_int(obj, f->name, load_int(rec, f)); break;
    case CODEC_K_REAL: {
      double v = load_real(rec, f);
      if (f->scale > 0) v = round(v * f->scale) / f->scale;
      added = isfinite(v) ? cJSON_AddNumberToObject(obj, f->name, v) : cJSON_AddNullToObject(obj, f->name);
      break;
    }
    case CODEC_K_BOOL: added = cJSON_AddBoolToObject(obj, f->name, load_int(rec, f) != 0); break;
    case CODEC_K_ENUM: {
      int64_t v = load_int(rec, f);
      added = cJSON_AddStringToObject(obj, f->name, v >= 0 && v < word_count(f->words) ? f->words[v] : "?");
      break;
    }
    case CODEC_K_NAMES: added = add_names(obj, f, rec); break;
    case CODEC_K_OBJECT: {
      cJSON *sub = cJSON_AddObjectToObject(obj, f->name);
      if (!sub) break;
      return codec_encode_object(f->sub, sub, rec);
    }
    case CODEC_K_CUSTOM: return f->encode(obj, f, rec);
    default: added = cJSON_AddStringToObject(obj, f->name, cat(rec, f)); break;
  }
  return added ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing %s", f->name);
}

static int in_variant(const codec_field *f, unsigned v) { return !f->in || (f->in & v); }

/* The variant a CODEC_SELECTS field's value selects (none beyond the mask's bits). */
static unsigned variant_of(int64_t v) { return v >= 0 && v < 32 ? CODEC_V(v) : 0; }

newt_result_t codec_encode_object(const codec_table *t, cJSON *obj, const void *rec) {
  unsigned variant = CODEC_V(0);
  for (size_t i = 0; i < t->n; i++) {
    const codec_field *f = &t->fields[i];
    if (!in_variant(f, variant)) continue;
    if ((f->omit & variant) && at_default(f, rec)) continue;
    if (f->skip && f->skip(rec)) continue;
    NEWT_CHECK(encode_field(obj, f, rec));
    if (f->flags & CODEC_SELECTS) variant = variant_of(load_int(rec, f));
  }
  return NEWT_OK;
}

newt_result_t codec_encode(const codec_table *t, const void *rec, char **out) {
  *out = NULL;
  cJSON *j = cJSON_CreateObject();
  NEWT_CHECK_ALLOC(j);
  newt_result_t r = codec_encode_object(t, j, rec);
  if (r == NEWT_OK && !(*out = newt_json_print(j))) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing %s", t->name);
  cJSON_Delete(j);
  return r;
}

/* --- reading ------------------------------------------------------------------------------- */

static newt_result_t out_of_range(const char *what, const codec_field *f, int64_t v, int64_t hi) {
  return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: %lld is out of range [%lld, %lld]", what, f->name, (long long)v,
                  (long long)f->min, (long long)hi);
}

static newt_result_t read_int(const cJSON *j, const char *what, const codec_field *f, int req, int strict,
                              void *rec) {
  int64_t v = load_int(rec, f);
  NEWT_CHECK(strict ? newt_json_get_int_strict(j, what, f->name, req, &v) : newt_json_get_int(j, what, f->name, req, &v));
  if (has_range(f) && (v < f->min || v > f->max)) return out_of_range(what, f, v, f->max);
  store_int(rec, f, v);
  return NEWT_OK;
}

static newt_result_t read_real(const cJSON *j, const char *what, const codec_field *f, int req, int strict,
                               void *rec) {
  double v = load_real(rec, f);
  if ((f->flags & CODEC_NULL) && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, f->name))) {
    store_real(rec, f, NAN);
    return NEWT_OK;
  }
  NEWT_CHECK(strict ? newt_json_get_double_strict(j, what, f->name, req, &v)
                    : newt_json_get_double(j, what, f->name, req, &v));
  if (f->dmin < f->dmax && !(v >= f->dmin && v <= f->dmax))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: %g is out of range [%g, %g]", what, f->name, v, f->dmin, f->dmax);
  store_real(rec, f, v);
  return NEWT_OK;
}

/* A string from the field's word set: its index (-1: absent). */
static newt_result_t read_word(const cJSON *j, const char *what, const codec_field *f, int req, int *index) {
  const char *s = NULL;
  *index = -1;
  NEWT_CHECK(newt_json_get_str(j, what, f->name, req, &s));
  if (!s) return NEWT_OK;
  char list[160] = "";
  for (int i = 0; f->words[i]; i++) {
    if (strcmp(s, f->words[i]) == 0) {
      *index = i;
      return NEWT_OK;
    }
    size_t l = strlen(list);
    snprintf(list + l, sizeof list - l, "%s%s", i ? (f->words[i + 1] ? ", " : " or ") : "", f->words[i]);
  }
  return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: expected %s, got \"%.40s\"", what, f->name, list, s);
}

/* The byte of s a rule refuses (NULL: none). TOKEN: printable ASCII but for blanks, quotes
 * and backslashes (what status, logs and reports print: a terminal escape must not reach a
 * screen); PRINTABLE: printable ASCII and blanks. */
static const unsigned char *refused_byte(const char *s, codec_kind k) {
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c < 0x20 || *c >= 0x7f) return c;
    if (k == CODEC_K_TOKEN && (*c == ' ' || *c == '"' || *c == '\\')) return c;
  }
  return NULL;
}

static newt_result_t read_string(const cJSON *j, const char *what, const codec_field *f, int req, void *rec) {
  char *out = at(rec, f);
  const char *s = NULL;
  NEWT_CHECK(newt_json_get_str(j, what, f->name, req, &s));
  if (!s) return NEWT_OK;
  size_t n = strlen(s);
  if (f->kind == CODEC_K_TOKEN && (!n || n >= f->size))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: must be 1 to %zu characters", what, f->name, f->size - 1);
  if (n >= f->size) return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: longer than %zu characters", what, f->name, f->size - 1);
  const unsigned char *bad = f->kind == CODEC_K_TOKEN || f->kind == CODEC_K_PRINTABLE ? refused_byte(s, f->kind) : NULL;
  if (bad)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: byte 0x%02x at %zu is not %s", what, f->name, *bad,
                    (size_t)(bad - (const unsigned char *)s),
                    f->kind == CODEC_K_TOKEN ? "a printable character of a name" : "printable text");
  if (f->kind == CODEC_K_NAME) {
    char label[400];
    snprintf(label, sizeof label, "%s.%s", what, f->name);
    NEWT_CHECK(newt_check_name(label, s));
  }
  memcpy(out, s, n + 1);
  if (f->kind == CODEC_K_TEXT) newt_text_scrub(out); /* readers print it: no terminal escape (C0, C1), no newline */
  return NEWT_OK;
}

static newt_result_t read_names(const cJSON *j, const char *what, const codec_field *f, int req, void *rec) {
  const cJSON *a = NULL;
  NEWT_CHECK(newt_json_get_arr(j, what, f->name, req, &a));
  int n = cJSON_GetArraySize(a);
  if (f->cap > 0 && n > f->cap)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: %d workers, at most %d", what, f->name, n, f->cap);
  if (f->cap == 0 && n > 0) {
    name_t *p = calloc((size_t)n, sizeof *p);
    if (!p) return NEWT_ERR(NEWT_ERR_NOMEM, "%s.%s: out of memory", what, f->name);
    free(names_in(rec, f));
    memcpy(at(rec, f), &p, sizeof p);
  }
  name_t *names = names_in(rec, f);
  int *count = count_of(rec, f), i = 0;
  *count = 0;
  for (const cJSON *x = a ? a->child : NULL; x; x = x->next, i++) {
    char label[400];
    snprintf(label, sizeof label, "%s.%s[%d]", what, f->name, i);
    if (!cJSON_IsString(x)) return NEWT_ERR(NEWT_ERR_INVALID, "%s: expected a worker id", label);
    NEWT_CHECK(newt_check_name(label, x->valuestring));
    snprintf(names[(*count)++], NEWT_ID_MAX, "%s", x->valuestring);
  }
  return NEWT_OK;
}

static newt_result_t read_fields(const codec_table *t, const cJSON *j, const char *what, void *rec);

static newt_result_t read_object(const cJSON *j, const char *what, const codec_field *f, int req, void *rec) {
  const cJSON *sub = NULL;
  NEWT_CHECK(newt_json_get_obj(j, what, f->name, req, &sub));
  if (!sub) return NEWT_OK;
  char label[400];
  snprintf(label, sizeof label, "%s.%s", what, f->name);
  return read_fields(f->sub, sub, label, rec);
}

static newt_result_t read_field(const codec_table *t, const cJSON *j, const char *what, const codec_field *f,
                                int req, void *rec) {
  switch (f->kind) {
    case CODEC_K_INT: return read_int(j, what, f, req, t->strict, rec);
    case CODEC_K_REAL: return read_real(j, what, f, req, t->strict, rec);
    case CODEC_K_BOOL: {
      int v = (int)load_int(rec, f);
      NEWT_CHECK(newt_json_get_bool(j, what, f->name, req, &v));
      store_int(rec, f, v);
      return NEWT_OK;
    }
    case CODEC_K_ENUM:
    case CODEC_K_WORD: {
      int i;
      NEWT_CHECK(read_word(j, what, f, req, &i));
      if (i < 0) return NEWT_OK;
      if (f->kind == CODEC_K_ENUM) store_int(rec, f, i);
      else snprintf(at(rec, f), f->size, "%s", f->words[i]);
      return NEWT_OK;
    }
    case CODEC_K_NAMES: return read_names(j, what, f, req, rec);
    case CODEC_K_OBJECT: return read_object(j, what, f, req, rec);
    case CODEC_K_CUSTOM: return f->decode(j, what, f, rec, req);
    default: return read_string(j, what, f, req, rec);
  }
}

/* A field of the object that the table does not know (a closed table's error). */
static newt_result_t check_known(const codec_table *t, const cJSON *j, const char *what) {
  for (const cJSON *it = j->child; it; it = it->next) {
    size_t i = 0;
    while (i < t->n && strcmp(t->fields[i].name, it->string) != 0) i++;
    if (i == t->n) return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: unknown field", what, it->string);
  }
  return NEWT_OK;
}

static newt_result_t read_fields(const codec_table *t, const cJSON *j, const char *what, void *rec) {
  if (!cJSON_IsObject(j)) return NEWT_ERR(NEWT_ERR_INVALID, "%s: expected a JSON object", what);
  if (t->closed) NEWT_CHECK(check_known(t, j, what));
  unsigned variant = CODEC_V(0);
  for (size_t i = 0; i < t->n; i++) {
    const codec_field *f = &t->fields[i];
    if (!in_variant(f, variant)) continue;
    NEWT_CHECK(read_field(t, j, what, f, (f->req & variant) != 0, rec));
    if (f->check) NEWT_CHECK(f->check(what, rec));
    if (f->flags & CODEC_SELECTS) variant = variant_of(load_int(rec, f));
  }
  /* bounds that are other fields: known once every field is read */
  for (size_t i = 0; i < t->n; i++) {
    const codec_field *f = &t->fields[i];
    if (!f->max_of || !in_variant(f, variant)) continue;
    int64_t v = load_int(rec, f), hi = max_of(rec, f);
    if (v > hi) return out_of_range(what, f, v, hi);
  }
  return NEWT_OK;
}

newt_result_t codec_decode_object(const codec_table *t, const cJSON *obj, const char *what, void *rec) {
  codec_defaults(t, rec);
  return read_fields(t, obj, what ? what : t->name, rec);
}

newt_result_t codec_decode(const codec_table *t, const char *text, size_t len, const char *what, void *rec) {
  if (!what) what = t->name;
  cJSON *j;
  codec_defaults(t, rec);
  NEWT_CHECK(newt_json_parse(text, len, what, &j));
  newt_result_t r = read_fields(t, j, what, rec);
  cJSON_Delete(j);
  return r;
}

newt_result_t codec_read(const codec_table *t, const char *text, size_t len, const char *what, void *out) {
  void *rec = calloc(1, t->size);
  NEWT_CHECK_ALLOC(rec);
  newt_result_t r = codec_decode(t, text, len, what, rec);
  if (r == NEWT_OK) memcpy(out, rec, t->size);
  else codec_free(t, rec);
  free(rec);
  return r;
}
