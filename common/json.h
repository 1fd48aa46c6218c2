/* JSON through cJSON, with the checks every reader of outside data needs: typed field
 * access whose errors name the field ("spec.tp: expected an integer, got \"two\""), and
 * int64 fields that arrive either as numbers or as decimal strings (etcd's gateway
 * writes int64 as strings and omits zero-valued fields).
 *
 * Two kinds of getters: newt_json_get_int and newt_json_get_double read the records newt and
 * etcd write, where an int64 may be a decimal string (newt_json_add_int writes one beyond 15
 * digits); the _strict ones read what a person writes (a spec file, the chart's values), where
 * a number must be a JSON number: "steps": "20" is refused ("spec.train.steps: expected a
 * number, got the string \"20\""), as a typo would be.
 *
 * Getters leave *out untouched when an optional field is missing, so the caller sets
 * the default first. `what` is the path of `obj` used in messages ("spec", "plan.ranks[3]"). */
#ifndef NEWT_COMMON_JSON_H
#define NEWT_COMMON_JSON_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* Parses len bytes (need not be NUL-terminated); errors name `what` and the byte offset. */
newt_result_t newt_json_parse(const char *text, size_t len, const char *what, cJSON **out);

newt_result_t newt_json_get_int(const cJSON *obj, const char *what, const char *field, int required,
                                int64_t *out);
newt_result_t newt_json_get_double(const cJSON *obj, const char *what, const char *field,
                                   int required, double *out);
/* A JSON number only (strings refused, naming the field and the string); _int: an integer
 * within +-2^53, _double: a finite one. */
newt_result_t newt_json_get_int_strict(const cJSON *obj, const char *what, const char *field, int required,
                                       int64_t *out);
newt_result_t newt_json_get_double_strict(const cJSON *obj, const char *what, const char *field, int required,
                                          double *out);
newt_result_t newt_json_get_bool(const cJSON *obj, const char *what, const char *field, int required,
                                 int *out);
/* *out points into obj (valid while obj lives). */
newt_result_t newt_json_get_str(const cJSON *obj, const char *what, const char *field, int required,
                                const char **out);
/* The string copied into out[cap] (NUL-terminated); a longer one is refused naming the
 * field. out is untouched when an optional field is missing. */
newt_result_t newt_json_get_strcpy(const cJSON *obj, const char *what, const char *field, int required, char *out,
                                   size_t cap);
newt_result_t newt_json_get_obj(const cJSON *obj, const char *what, const char *field, int required,
                                const cJSON **out);
newt_result_t newt_json_get_arr(const cJSON *obj, const char *what, const char *field, int required,
                                const cJSON **out);

/* Rejects fields of obj that are not in the NULL-terminated list `known` (typos in specs). */
newt_result_t newt_json_check_fields(const cJSON *obj, const char *what, const char *const *known);

/* Reads an int64 from a number or decimal-string item. */
newt_result_t newt_json_item_int(const cJSON *item, const char *what, int64_t *out);

/* Compact malloc'd text of item; NULL when out of memory. */
char *newt_json_print(const cJSON *item);

/* The largest integer a JSON number (a double) holds exactly: 2^53. */
#define NEWT_JSON_INT_EXACT ((int64_t)1 << 53)

/* Adds an int64: a JSON number up to 15 digits (what cJSON prints exactly), a decimal
 * string beyond (as etcd's gateway writes int64), so newt_json_get_int reads back exactly
 * what was written, either way. */
cJSON *newt_json_add_int(cJSON *obj, const char *field, int64_t v);

#endif
