/* Records as tables: one descriptor per field (its name in the JSON, where it lives in the
 * struct, its kind, its range, its default, whether it is required) drives the writer, the
 * reader and the checks of a record, so that a field is spelled once:
 *
 *   static const codec_field fault_fields[] = {
 *       {CODEC_INT(job_fault, generation, "generation", 1, INT64_MAX), CODEC_REQUIRED},
 *       {CODEC_MS(job_fault, t_ms, "t_ms"), CODEC_REQUIRED},
 *       {CODEC_TEXT(job_fault, what, "what"), CODEC_REQUIRED},
 *   };
 *   static const codec_table fault_table = CODEC_TABLE(job_fault, "fault", fault_fields);
 *
 * Writing (codec_encode): the fields in table order, compact JSON (the order is the record's
 * bytes in etcd: a table is never reordered). A field marked omit is written only when it is
 * not its default and lies within its range (a value its reader would refuse is left out and
 * read as the default), so a record of a release without the field reads the same and the
 * release's records stay what it wrote.
 *
 * Reading (codec_decode): every field set to its default, then each field read in table order
 * and checked (type, range, the word set, a worker id's characters), and a rejection names the
 * record and the field: "report.kind: expected crash or hang, got \"x\"". A field whose
 * maximum is another field of the record (max_of) is checked once the whole record is read.
 *
 * Variants: where the fields a record carries depend on one of its fields (an event's type),
 * that field is marked CODEC_SELECTS and comes first; every field then says in which values
 * of it it is present (in), required (req) and written only when set (omit), as bit masks
 * (CODEC_V(JOB_EV_PLAN) | CODEC_V(JOB_EV_SPARE); CODEC_ALL: every one).
 *
 * The escape hatches, for the few fields no kind describes: check (run once the field is
 * read: a rule the kind does not know, such as a host name's characters), skip (a field
 * written only when a rule of the record says so) and CODEC_CUSTOM's encode and decode. */
#ifndef NEWT_JOB_CODEC_H
#define NEWT_JOB_CODEC_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/name.h"

typedef enum codec_kind {
  CODEC_K_INT,       /* int64_t, uint64_t or int; an integer (a decimal string too, unless strict) */
  CODEC_K_REAL,      /* double; CODEC_NULL: null reads as NaN; a value not finite is written as null */
  CODEC_K_BOOL,      /* int: true or false */
  CODEC_K_ENUM,      /* int or enum: the index of a word of `words`, written as the word */
  CODEC_K_WORD,      /* char[]: one of `words` */
  CODEC_K_TEXT,      /* char[]: free text for people; a control character (C0, DEL, C1) or a byte of
                        no UTF-8 sequence reads as '?' (readers print it: newt_text_scrub) */
  CODEC_K_PRINTABLE, /* char[]: printable ASCII text, blanks allowed; anything else is refused */
  CODEC_K_TOKEN,     /* char[]: a name, an address or a word: 1 or more printable ASCII characters,
                        no blanks, quotes or backslashes */
  CODEC_K_STR,       /* char[]: any string that fits (a check says more, where it must) */
  CODEC_K_NAME,      /* char[NEWT_ID_MAX]: a worker id (newt_check_name) */
  CODEC_K_NAMES,     /* worker ids: char[cap][NEWT_ID_MAX] in the struct (cap > 0) or a malloc'd
                        char (*)[NEWT_ID_MAX] (cap 0, codec_free), their count an int at count_off */
  CODEC_K_OBJECT,    /* a nested object, described by `sub`, its fields in the same struct */
  CODEC_K_CUSTOM,    /* encode and decode say it all */
} codec_kind;

#define CODEC_ALL (~0u)
#define CODEC_V(x) (1u << (x))

enum {
  CODEC_NULL = 1,    /* REAL: null is NaN (a loss that was not finite) */
  CODEC_SELECTS = 2, /* ENUM: its value selects the variant of the fields after it */
};

typedef struct codec_field codec_field;
typedef struct codec_table codec_table;

struct codec_field {
  const char *name; /* in the JSON */
  codec_kind kind;
  size_t off, size; /* in the struct */
  unsigned in;      /* the variants it is in (0: every one) */
  unsigned req;     /* the variants it is required in */
  unsigned omit;    /* the variants it is written in only when not its default */
  int flags;        /* CODEC_NULL, CODEC_SELECTS */
  int64_t min, max; /* INT: the range (both 0: any value) */
  size_t max_of;    /* INT: offsetof + 1 of an int64_t field of the record that bounds it (0: none) */
  double dmin, dmax; /* REAL: the range (dmin >= dmax: any value) */
  double scale;      /* REAL: written rounded to 1 / scale (0: as it is) */
  int64_t def;       /* INT, BOOL, ENUM, CUSTOM of 4 or 8 bytes: the default */
  double ddef;       /* REAL: the default */
  const char *sdef;  /* strings: the default (NULL: "") */
  const char *const *words; /* ENUM, WORD: NULL-terminated */
  const codec_table *sub;   /* OBJECT */
  size_t count_off;         /* NAMES: offsetof its int count */
  int cap;                  /* NAMES: the capacity in the struct (0: malloc'd) */
  /* Once the field is read: a rule of its own; errors name what.<name> */
  newt_result_t (*check)(const char *what, const void *rec);
  /* Writing: 1 leaves the field out (a rule of the record, beyond omit's) */
  int (*skip)(const void *rec);
  /* CUSTOM: writes the field into obj; reads it from obj (required: it must be there) */
  newt_result_t (*encode)(cJSON *obj, const codec_field *f, const void *rec);
  newt_result_t (*decode)(const cJSON *obj, const char *what, const codec_field *f, void *rec, int required);
};

struct codec_table {
  const char *name; /* what errors name when the caller names nothing else: "report" */
  size_t size;      /* of the struct */
  const codec_field *fields;
  size_t n;
  int strict;       /* numbers are JSON numbers only (what a person writes: the spec) */
  int closed;       /* a field the table does not know is refused (the spec, the plan) */
};

/* --- writing tables ----------------------------------------------------------------------- */

#define CODEC_AT(T, m) .off = offsetof(T, m), .size = sizeof(((T *)0)->m)
#define CODEC_REQUIRED .req = CODEC_ALL
#define CODEC_OMIT .omit = CODEC_ALL
#define CODEC_MAX_OF(T, m) .max_of = offsetof(T, m) + 1

#define CODEC_INT(T, m, key, lo, hi) .name = (key), .kind = CODEC_K_INT, CODEC_AT(T, m), .min = (lo), .max = (hi)
/* a count or a wall-clock stamp in ms: [0, INT64_MAX] (a uint64_t) */
#define CODEC_MS(T, m, key) CODEC_INT(T, m, key, 0, INT64_MAX)
/* an integer with no range of its own (the spec's: spec_validate holds its rules) */
#define CODEC_NUM(T, m, key) .name = (key), .kind = CODEC_K_INT, CODEC_AT(T, m)
#define CODEC_REAL(T, m, key) .name = (key), .kind = CODEC_K_REAL, CODEC_AT(T, m)
#define CODEC_BOOL(T, m, key) .name = (key), .kind = CODEC_K_BOOL, CODEC_AT(T, m)
#define CODEC_ENUM(T, m, key, set) .name = (key), .kind = CODEC_K_ENUM, CODEC_AT(T, m), .words = (set)
#define CODEC_WORD(T, m, key, set) .name = (key), .kind = CODEC_K_WORD, CODEC_AT(T, m), .words = (set)
#define CODEC_TEXT(T, m, key) .name = (key), .kind = CODEC_K_TEXT, CODEC_AT(T, m)
#define CODEC_PRINTABLE(T, m, key) .name = (key), .kind = CODEC_K_PRINTABLE, CODEC_AT(T, m)
#define CODEC_TOKEN(T, m, key) .name = (key), .kind = CODEC_K_TOKEN, CODEC_AT(T, m)
#define CODEC_STR(T, m, key) .name = (key), .kind = CODEC_K_STR, CODEC_AT(T, m)
#define CODEC_NAME(T, m, key) .name = (key), .kind = CODEC_K_NAME, CODEC_AT(T, m)
#define CODEC_NAMES(T, m, n, key, capacity)                                                                     \
  .name = (key), .kind = CODEC_K_NAMES, CODEC_AT(T, m), .count_off = offsetof(T, n), .cap = (capacity)
#define CODEC_OBJECT(key, table) .name = (key), .kind = CODEC_K_OBJECT, .sub = &(table)
#define CODEC_CUSTOM(T, m, key, enc, dec) .name = (key), .kind = CODEC_K_CUSTOM, CODEC_AT(T, m), .encode = (enc), .decode = (dec)

#define CODEC_TABLE(T, label, fields_) {.name = (label), .size = sizeof(T), .fields = (fields_), .n = sizeof(fields_) / sizeof((fields_)[0])}

/* --- using them --------------------------------------------------------------------------- */

/* rec as a compact JSON document into *out (malloc'd). */
newt_result_t codec_encode(const codec_table *t, const void *rec, char **out);
/* The fields of rec added to obj (an element of an array, a record inside another). */
newt_result_t codec_encode_object(const codec_table *t, cJSON *obj, const void *rec);
/* Reads text (len bytes) into rec: every field of the table written (its default where
 * absent); errors name `what` (NULL: the table's name) and the field. On an error rec holds
 * what was read so far (codec_free releases it). */
newt_result_t codec_decode(const codec_table *t, const char *text, size_t len, const char *what, void *rec);
/* The same from a parsed object. */
newt_result_t codec_decode_object(const codec_table *t, const cJSON *obj, const char *what, void *rec);
/* codec_decode into a zeroed copy, which becomes *out only when it is whole: the reader of a
 * record whose struct the table describes (t->size bytes). */
newt_result_t codec_read(const codec_table *t, const char *text, size_t len, const char *what, void *out);
/* Every field of the table set to its default. */
void codec_defaults(const codec_table *t, void *rec);
/* Frees the malloc'd arrays of rec (CODEC_K_NAMES with cap 0) and clears them. */
void codec_free(const codec_table *t, void *rec);

#endif
