/* Command-line flags for the `newt` subcommands: one table per subcommand, parsed the
 * same way everywhere (`--name value` or `--name=value`, `--help`), with errors that
 * name the flag and the expected form. The tables are also what `--help` prints and what
 * tests compare the Helm chart's command lines against (`newt <cmd> --list-flags`). */
#ifndef NEWT_COMMON_OPTS_H
#define NEWT_COMMON_OPTS_H

#include <stdint.h>
#include <stdio.h>

#include "err.h"

typedef enum newt_opt_type {
  NEWT_OPT_FLAG,   /* int, set to 1 (no value) */
  NEWT_OPT_INT,    /* int64_t, decimal */
  NEWT_OPT_SIZE,   /* int64_t, with k/M/G suffix */
  NEWT_OPT_DOUBLE, /* double */
  NEWT_OPT_STR,    /* const char * (points into argv) */
} newt_opt_type;

typedef struct newt_opt {
  const char *name; /* without the leading "--" */
  newt_opt_type type;
  void *ptr;
  const char *help; /* one line; the default is shown from *ptr */
} newt_opt;

/* Table terminator. */
#define NEWT_OPT_END {NULL, NEWT_OPT_FLAG, NULL, NULL}

/* Parses argv[0..argc) (argv[0] is the first argument after the subcommand name).
 * Positional arguments are collected in order into pos (at most max_pos; *npos set).
 * Returns NEWT_ERR_INVALID naming the flag on any error. When --help is given it prints
 * usage to stdout and returns NEWT_ERR_ABORTED; --list-flags prints one flag name per
 * line and returns NEWT_ERR_ABORTED (callers exit 0 on ABORTED). */
newt_result_t newt_opts_parse(const char *cmd, const char *synopsis, const newt_opt *opts, int argc,
                              char **argv, char **pos, int max_pos, int *npos);

/* For a subcommand that runs a program (`newt worker [flags] -- COMMAND [ARGS...]`): parses
 * the flags before the first `--` as newt_opts_parse does (no positional argument) and
 * leaves the words after it alone: *command is the index in argv of the first of them
 * (argc when `--` ends argv), -1 when there is no `--`. --help and --list-flags count
 * only before it, so `-- prog --help` asks prog. On --help the usage is followed by
 * epilogue (may be NULL). */
newt_result_t newt_opts_parse_command(const char *cmd, const char *synopsis, const char *epilogue,
                                      const newt_opt *opts, int argc, char **argv, int *command);

void newt_opts_usage(FILE *f, const char *cmd, const char *synopsis, const newt_opt *opts);

/* The common exit path of a subcommand's flag parsing: prints the error (if any) and maps
 * the result of newt_opts_parse to an exit status: --help gives 0, a bad flag 2. Returns -1
 * to go on. Typical use:
 *   int rc = newt_opts_exit(newt_opts_parse(...));
 *   if (rc >= 0) return rc; */
int newt_opts_exit(newt_result_t res);

#endif
