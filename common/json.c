/* Typed, field-naming access to cJSON documents (see json.h). */
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strutil.h"

newt_result_t newt_json_parse(const char *text, size_t len, const char *what, cJSON **out) {
  const char *end = NULL;
  cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  if (!j) {
    size_t off = end && end >= text ? (size_t)(end - text) : 0;
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: malformed JSON at byte %zu of %zu", what, off, len);
  }
  *out = j;
  return NEWT_OK;
}

static const char *type_name(const cJSON *it) {
  if (cJSON_IsNumber(it)) return "a number";
  if (cJSON_IsString(it)) return "a string";
  if (cJSON_IsBool(it)) return "a boolean";
  if (cJSON_IsNull(it)) return "null";
  if (cJSON_IsArray(it)) return "an array";
  if (cJSON_IsObject(it)) return "an object";
  return "something else";
}

static newt_result_t lookup(const cJSON *obj, const char *what, const char *field, int required,
                            const cJSON **it) {
  if (!cJSON_IsObject(obj))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: expected an object, got %s", what, type_name(obj));
  *it = cJSON_GetObjectItemCaseSensitive(obj, field);
  if (!*it && required) return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: missing required field", what, field);
  return NEWT_OK;
}

newt_result_t newt_json_item_int(const cJSON *it, const char *what, int64_t *out) {
  if (cJSON_IsNumber(it)) {
    double d = it->valuedouble;
    if (d != floor(d) || fabs(d) > 9007199254740992.0)
      return NEWT_ERR(NEWT_ERR_INVALID, "%s: expected an integer, got %g", what, d);
    *out = (int64_t)d;
    return NEWT_OK;
  }
  if (cJSON_IsString(it) && newt_parse_int(it->valuestring, out) == 0) return NEWT_OK;
  if (cJSON_IsString(it))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: expected an integer, got \"%.40s\"", what, it->valuestring);
  return NEWT_ERR(NEWT_ERR_INVALID, "%s: expected an integer, got %s", what, type_name(it));
}

/* The field of a strict getter as a JSON number; a string is named with its text. */
static newt_result_t number_item(const cJSON *obj, const char *what, const char *field, int required,
                                 const cJSON **it) {
  NEWT_CHECK(lookup(obj, what, field, required, it));
  if (!*it || cJSON_IsNumber(*it)) return NEWT_OK;
  if (cJSON_IsString(*it))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: expected a number, got the string \"%.40s\"", what, field,
                    (*it)->valuestring);
  return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: expected a number, got %s", what, field, type_name(*it));
}

/* An int64 field: strict, a JSON number only; else a decimal string too (records). */
static newt_result_t get_int(const cJSON *obj, const char *what, const char *field, int required, int strict,
                             int64_t *out) {
  const cJSON *it;
  NEWT_CHECK(strict ? number_item(obj, what, field, required, &it) : lookup(obj, what, field, required, &it));
  if (!it) return NEWT_OK;
  char path[256];
  snprintf(path, sizeof path, "%s.%s", what, field);
  return newt_json_item_int(it, path, out);
}

newt_result_t newt_json_get_int(const cJSON *obj, const char *what, const char *field, int required,
                                int64_t *out) {
  return get_int(obj, what, field, required, 0, out);
}

newt_result_t newt_json_get_double(const cJSON *obj, const char *what, const char *field,
                                   int required, double *out) {
  const cJSON *it;
  NEWT_CHECK(lookup(obj, what, field, required, &it));
  if (!it) return NEWT_OK;
  if (cJSON_IsNumber(it)) {
    *out = it->valuedouble;
    return NEWT_OK;
  }
  if (cJSON_IsString(it) && newt_parse_double(it->valuestring, out) == 0) return NEWT_OK;
  return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: expected a number, got %s", what, field, type_name(it));
}

newt_result_t newt_json_get_int_strict(const cJSON *obj, const char *what, const char *field, int required,
                                       int64_t *out) {
  return get_int(obj, what, field, required, 1, out);
}

newt_result_t newt_json_get_double_strict(const cJSON *obj, const char *what, const char *field, int required,
                                          double *out) {
  const cJSON *it;
  NEWT_CHECK(number_item(obj, what, field, required, &it));
  if (!it) return NEWT_OK;
  if (!isfinite(it->valuedouble))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: expected a finite number, got %g", what, field, it->valuedouble);
  *out = it->valuedouble;
  return NEWT_OK;
}

newt_result_t newt_json_get_bool(const cJSON *obj, const char *what, const char *field, int required,
                                 int *out) {
  const cJSON *it;
  NEWT_CHECK(lookup(obj, what, field, required, &it));
  if (!it) return NEWT_OK;
  if (!cJSON_IsBool(it))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: expected true or false, got %s", what, field,
                    type_name(it));
  *out = cJSON_IsTrue(it);
  return NEWT_OK;
}

newt_result_t newt_json_get_str(const cJSON *obj, const char *what, const char *field, int required,
                                const char **out) {
  const cJSON *it;
  NEWT_CHECK(lookup(obj, what, field, required, &it));
  if (!it) return NEWT_OK;
  if (!cJSON_IsString(it))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: expected a string, got %s", what, field, type_name(it));
  *out = it->valuestring;
  return NEWT_OK;
}

newt_result_t newt_json_get_strcpy(const cJSON *obj, const char *what, const char *field, int required, char *out,
                                   size_t cap) {
  const char *s = NULL;
  NEWT_CHECK(newt_json_get_str(obj, what, field, required, &s));
  if (!s) return NEWT_OK;
  size_t n = strlen(s);
  if (n >= cap) return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: longer than %zu characters", what, field, cap - 1);
  memcpy(out, s, n + 1);
  return NEWT_OK;
}

newt_result_t newt_json_get_obj(const cJSON *obj, const char *what, const char *field, int required,
                                const cJSON **out) {
  const cJSON *it;
  NEWT_CHECK(lookup(obj, what, field, required, &it));
  if (!it) return NEWT_OK;
  if (!cJSON_IsObject(it))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: expected an object, got %s", what, field, type_name(it));
  *out = it;
  return NEWT_OK;
}

newt_result_t newt_json_get_arr(const cJSON *obj, const char *what, const char *field, int required,
                                const cJSON **out) {
  const cJSON *it;
  NEWT_CHECK(lookup(obj, what, field, required, &it));
  if (!it) return NEWT_OK;
  if (!cJSON_IsArray(it))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: expected an array, got %s", what, field, type_name(it));
  *out = it;
  return NEWT_OK;
}

newt_result_t newt_json_check_fields(const cJSON *obj, const char *what, const char *const *known) {
  if (!cJSON_IsObject(obj))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: expected an object, got %s", what, type_name(obj));
  for (const cJSON *it = obj->child; it; it = it->next) {
    int ok = 0;
    for (const char *const *k = known; *k && !ok; k++) ok = strcmp(*k, it->string) == 0;
    if (!ok) return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: unknown field", what, it->string);
  }
  return NEWT_OK;
}

char *newt_json_print(const cJSON *item) { return cJSON_PrintUnformatted(item); }

cJSON *newt_json_add_int(cJSON *obj, const char *field, int64_t v) {
  /* cJSON prints numbers with 15 significant digits: anything longer is rounded */
  if (v > 999999999999999LL || v < -999999999999999LL) {
    char digits[24];
    snprintf(digits, sizeof digits, "%lld", (long long)v);
    return cJSON_AddStringToObject(obj, field, digits);
  }
  return cJSON_AddNumberToObject(obj, field, (double)v);
}
