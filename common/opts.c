/* The flag parser shared by every subcommand (see opts.h). */
#include "opts.h"

#include <string.h>

#include "strutil.h"

static const char *type_hint(newt_opt_type t) {
  switch (t) {
    case NEWT_OPT_INT: return "N";
    case NEWT_OPT_SIZE: return "BYTES";
    case NEWT_OPT_DOUBLE: return "X";
    case NEWT_OPT_STR: return "STR";
    default: return "";
  }
}

void newt_opts_usage(FILE *f, const char *cmd, const char *synopsis, const newt_opt *opts) {
  fprintf(f, "usage: newt %s %s\n\n", cmd, synopsis ? synopsis : "[flags]");
  for (const newt_opt *o = opts; o->name; o++) {
    char left[64];
    snprintf(left, sizeof left, "--%s %s", o->name, type_hint(o->type));
    fprintf(f, "  %-28s %s", left, o->help ? o->help : "");
    switch (o->type) {
      case NEWT_OPT_INT:
      case NEWT_OPT_SIZE:
        fprintf(f, " (default %lld)", (long long)*(int64_t *)o->ptr);
        break;
      case NEWT_OPT_DOUBLE: fprintf(f, " (default %g)", *(double *)o->ptr); break;
      case NEWT_OPT_STR:
        if (*(const char **)o->ptr) fprintf(f, " (default %s)", *(const char **)o->ptr);
        break;
      default: break;
    }
    fputc('\n', f);
  }
  fprintf(f, "  %-28s %s\n", "--help", "show this help");
}

static newt_result_t set_value(const char *cmd, const newt_opt *o, const char *v) {
  switch (o->type) {
    case NEWT_OPT_INT:
      if (newt_parse_int(v, (int64_t *)o->ptr) != 0)
        return NEWT_ERR(NEWT_ERR_INVALID, "newt %s: --%s expects an integer, got \"%s\"", cmd, o->name, v);
      break;
    case NEWT_OPT_SIZE:
      if (newt_parse_size(v, (int64_t *)o->ptr) != 0)
        return NEWT_ERR(NEWT_ERR_INVALID, "newt %s: --%s expects a size like 4096, 64K or 1G, got \"%s\"",
                        cmd, o->name, v);
      break;
    case NEWT_OPT_DOUBLE:
      if (newt_parse_double(v, (double *)o->ptr) != 0)
        return NEWT_ERR(NEWT_ERR_INVALID, "newt %s: --%s expects a number, got \"%s\"", cmd, o->name, v);
      break;
    case NEWT_OPT_STR: *(const char **)o->ptr = v; break;
    default: break;
  }
  return NEWT_OK;
}

int newt_opts_exit(newt_result_t res) {
  if (res == NEWT_OK) return -1;
  if (res == NEWT_ERR_ABORTED) return 0;
  fprintf(stderr, "%s\n", newt_errmsg());
  return 2;
}

/* The parser of both entry points: with command non-NULL, the first `--` ends the flags and
 * the rest is left alone (*command: the index of the word after it, -1 without one); else the
 * words after `--` are positional arguments. epilogue follows the usage on --help. */
static newt_result_t parse(const char *cmd, const char *synopsis, const char *epilogue, const newt_opt *opts,
                           int argc, char **argv, char **pos, int max_pos, int *npos, int *command) {
  int np = 0;
  if (command) *command = -1;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (command && strcmp(a, "--") == 0) {
      *command = i + 1;
      break;
    }
    if (strcmp(a, "--") == 0) {
      for (i++; i < argc; i++) {
        if (np >= max_pos)
          return NEWT_ERR(NEWT_ERR_INVALID, "newt %s: unexpected argument \"%s\"", cmd, argv[i]);
        pos[np++] = argv[i];
      }
      break;
    }
    if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
      if (np >= max_pos)
        return NEWT_ERR(NEWT_ERR_INVALID, "newt %s: unexpected argument \"%s\" (see newt %s --help)",
                        cmd, a, cmd);
      pos[np++] = argv[i];
      continue;
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      newt_opts_usage(stdout, cmd, synopsis, opts);
      if (epilogue) printf("\n%s", epilogue);
      return NEWT_ERR_ABORTED;
    }
    if (strcmp(a, "--list-flags") == 0) {
      for (const newt_opt *o = opts; o->name; o++) printf("--%s\n", o->name);
      return NEWT_ERR_ABORTED;
    }
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
    const newt_opt *o = opts;
    while (o->name && !(strlen(o->name) == nlen && strncmp(o->name, name, nlen) == 0)) o++;
    if (!o->name) {
      const char *names[128];
      size_t n = 0;
      for (const newt_opt *k = opts; k->name && n + 1 < sizeof names / sizeof names[0]; k++) names[n++] = k->name;
      names[n] = NULL;
      const char *near = newt_closest_name(name, nlen, names);
      if (near)
        return NEWT_ERR(NEWT_ERR_INVALID, "newt %s: unknown flag --%.*s: did you mean --%s? (see newt %s --help)",
                        cmd, (int)nlen, name, near, cmd);
      return NEWT_ERR(NEWT_ERR_INVALID, "newt %s: unknown flag --%.*s (see newt %s --help)", cmd,
                      (int)nlen, name, cmd);
    }
    if (o->type == NEWT_OPT_FLAG) {
      if (eq) return NEWT_ERR(NEWT_ERR_INVALID, "newt %s: --%s takes no value", cmd, o->name);
      *(int *)o->ptr = 1;
      continue;
    }
    const char *v = eq ? eq + 1 : NULL;
    if (!v) {
      if (i + 1 >= argc)
        return NEWT_ERR(NEWT_ERR_INVALID, "newt %s: --%s needs a value (%s)", cmd, o->name,
                        type_hint(o->type));
      v = argv[++i];
    }
    NEWT_CHECK(set_value(cmd, o, v));
  }
  if (npos) *npos = np;
  return NEWT_OK;
}

newt_result_t newt_opts_parse(const char *cmd, const char *synopsis, const newt_opt *opts, int argc,
                              char **argv, char **pos, int max_pos, int *npos) {
  return parse(cmd, synopsis, NULL, opts, argc, argv, pos, max_pos, npos, NULL);
}

newt_result_t newt_opts_parse_command(const char *cmd, const char *synopsis, const char *epilogue,
                                      const newt_opt *opts, int argc, char **argv, int *command) {
  return parse(cmd, synopsis, epilogue, opts, argc, argv, NULL, 0, NULL, command);
}
