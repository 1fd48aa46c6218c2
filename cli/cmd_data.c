/* newt data: token files for training.
 *
 *   newt data prepare --in TEXT --out FILE    byte-level tokenizer (vocab 256)
 *   newt data generate --out FILE [--bytes N] [--seed S]   the generated corpus
 *   newt data inspect FILE                    the header, checked, as one JSON line */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmds.h"
#include "common/opts.h"
#include "model/tokens.h"

static int fail(const char *what) {
  fprintf(stderr, "newt data %s: %s\n", what, newt_errmsg());
  return 1;
}

static int cmd_prepare(int argc, char **argv) {
  const char *in = NULL, *out = NULL;
  newt_opt opts[] = {
      {"in", NEWT_OPT_STR, &in, "text file to tokenize (one token per byte)"},
      {"out", NEWT_OPT_STR, &out, "token file to write"},
      NEWT_OPT_END,
  };
  int rc = newt_opts_exit(newt_opts_parse("data prepare", "--in TEXT --out FILE", opts, argc, argv, NULL, 0, NULL));
  if (rc >= 0) return rc;
  if (!in || !out) {
    fprintf(stderr, "newt data prepare: --in and --out are required\n");
    return 2;
  }
  uint64_t count = 0;
  if (model_tokens_prepare(in, out, &count) != NEWT_OK) return fail("prepare");
  printf("{\"out\":\"%s\",\"tokens\":%llu,\"vocab\":256,\"width\":1}\n", out, (unsigned long long)count);
  return 0;
}

static int cmd_generate(int argc, char **argv) {
  const char *out = NULL;
  int64_t bytes = 1 << 21, seed = 1;
  newt_opt opts[] = {
      {"out", NEWT_OPT_STR, &out, "token file to write"},
      {"bytes", NEWT_OPT_SIZE, &bytes, "length of the generated text (tokens)"},
      {"seed", NEWT_OPT_INT, &seed, "seed of the generated text"},
      NEWT_OPT_END,
  };
  int rc = newt_opts_exit(newt_opts_parse("data generate", "--out FILE [flags]", opts, argc, argv, NULL, 0, NULL));
  if (rc >= 0) return rc;
  if (!out || bytes < 2) {
    fprintf(stderr, "newt data generate: --out is required and --bytes must be >= 2\n");
    return 2;
  }
  char *text = malloc((size_t)bytes);
  if (!text) {
    fprintf(stderr, "newt data generate: out of memory for %lld bytes\n", (long long)bytes);
    return 1;
  }
  model_text_generate((uint64_t)seed, text, (size_t)bytes);
  newt_result_t res = model_tokens_write(out, text, 1, (uint64_t)bytes, 256);
  free(text);
  if (res != NEWT_OK) return fail("generate");
  printf("{\"out\":\"%s\",\"tokens\":%lld,\"vocab\":256,\"width\":1,\"seed\":%lld}\n", out, (long long)bytes,
         (long long)seed);
  return 0;
}

static int cmd_inspect(int argc, char **argv) {
  newt_opt opts[] = {NEWT_OPT_END};
  char *pos[1];
  int npos = 0;
  int rc = newt_opts_exit(newt_opts_parse("data inspect", "FILE", opts, argc, argv, pos, 1, &npos));
  if (rc >= 0) return rc;
  if (npos != 1) {
    fprintf(stderr, "newt data inspect: give one token file\n");
    return 2;
  }
  model_tokens t;
  if (model_tokens_open(&t, pos[0]) != NEWT_OK) return fail("inspect");
  printf("{\"file\":\"%s\",\"version\":%d,\"width\":%u,\"vocab\":%u,\"tokens\":%llu}\n", pos[0],
         MODEL_TOKENS_VERSION, t.width, t.vocab, (unsigned long long)t.count);
  model_tokens_close(&t);
  return 0;
}

int newt_cmd_data(int argc, char **argv) {
  const char *usage = "usage: newt data <prepare|generate|inspect> [flags]   (newt data <sub> --help)\n";
  if (argc < 1 || strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0) {
    fputs(usage, argc < 1 ? stderr : stdout);
    return argc < 1 ? 2 : 0;
  }
  if (strcmp(argv[0], "prepare") == 0) return cmd_prepare(argc - 1, argv + 1);
  if (strcmp(argv[0], "generate") == 0) return cmd_generate(argc - 1, argv + 1);
  if (strcmp(argv[0], "inspect") == 0) return cmd_inspect(argc - 1, argv + 1);
  fprintf(stderr, "newt data: unknown subcommand \"%s\"\n%s", argv[0], usage);
  return 2;
}
