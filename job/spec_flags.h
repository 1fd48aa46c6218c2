/* The job spec's fields as command-line flags: one row per flag (its name, the spec field it
 * sets by its path in the JSON, its help line, and a rule of its own where the field's kind
 * says too little), after Redis's static_configs[]. The rows drive, for every command that
 * takes spec fields as flags (newt run, newt train, newt bench recovery), the newt_opt rows
 * (--help, --list-flags), the set of them given on a command line (newt run's --spec
 * conflict) and the values' way into a newt_spec. A command names a row where its --help
 * lists it:
 *
 *   newt_opt opts[] = {{"nproc", NEWT_OPT_INT, &nproc, "workers to start"},
 *                      SPEC_OPT("steps"),
 *                      SPEC_OPT_HELP("micro-batch", "sequences per forward/backward (0: the batch)"),
 *                      NEWT_OPT_END};
 *   spec_flags sf;
 *   spec_flags_bind(&sf, opts, &defaults);   each SPEC_OPT made a whole row: a slot of sf
 *   newt_opts_parse(..., opts, ...);
 *   spec_flags_apply(&sf, &spec);            every bound flag's value into the spec
 *
 * A new spec field exposed as a flag is one row (job/spec_flags.c) and its SPEC_OPT in the
 * commands that take it. --help shows the values of the spec handed to bind as the defaults:
 * a command whose flag means otherwise hands its own (newt train's --micro-batch 0). The
 * chart's schema is checked against the rows (tests/helm/spec_fields.c). */
#ifndef NEWT_JOB_SPEC_FLAGS_H
#define NEWT_JOB_SPEC_FLAGS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/opts.h"
#include "job/spec.h"

#define SPEC_FLAGS_MAX 48 /* rows one command binds, at most */

/* A row of the table, by its flag's name: a placeholder bind makes whole (help NULL: the
 * row's own) */
#define SPEC_OPT(flag) {(flag), NEWT_OPT_FLAG, NULL, NULL}
#define SPEC_OPT_HELP(flag, help) {(flag), NEWT_OPT_FLAG, NULL, (help)}

typedef struct spec_flag spec_flag;

/* What the parser writes a flag's value into: as its newt_opt type says */
typedef union spec_flag_value {
  int64_t i;     /* NEWT_OPT_INT, NEWT_OPT_SIZE */
  double d;      /* NEWT_OPT_DOUBLE */
  const char *s; /* NEWT_OPT_STR: a string field, a word, the model's overrides */
  int b;         /* NEWT_OPT_FLAG */
} spec_flag_value;

typedef struct spec_flags {
  newt_spec defaults; /* the slots' first values (a string's points into it) */
  size_t n;
  struct {
    const spec_flag *row;
    spec_flag_value v;
  } bound[SPEC_FLAGS_MAX];
} spec_flags;

/* Makes every row of opts with no ptr (SPEC_OPT) a row of the table: its type, its help
 * unless given, a slot of sf holding the field's value in defaults. NEWT_ERR_INVALID for a
 * name the table has not (a command's mistake). sf must stay where it is while opts is used. */
newt_result_t spec_flags_bind(spec_flags *sf, newt_opt *opts, const newt_spec *defaults);

/* Writes every bound flag's value into s, in the table's order; the first value the field
 * cannot hold is refused, naming the flag ("--seed: must not be negative, got -1"). */
newt_result_t spec_flags_apply(const spec_flags *sf, newt_spec *s);

/* The bound flags given in argv[0..end) ("--steps, --lr"), into given; how many. */
size_t spec_flags_given(const spec_flags *sf, int end, char **argv, char *given, size_t cap);

/* The table's i-th row: its flag, and the path of the spec field it sets in *path; NULL
 * once i is past the last. */
const char *spec_flag_row(size_t i, const char **path);

#endif
