/* helm_spec_check: checks a job spec file with newt's own parser (spec_from_json) and the
 * checks a coordinator makes of it at its start (gpt_start_check, as `newt coordinator --spec
 * FILE --trainer T` does: the spec's rules and JSON, and with --trainer=builtin, the default,
 * the built-in trainer's model and layout), so the helm tests can prove that the spec the
 * chart renders into its ConfigMap is one the coordinators accept. Prints the parsed layout
 * on success ("ok job=... tp=... pp=... zero=... dp=[min,max] backend=... ckpt_dir=...");
 * prints the message (it names the field) and exits 1 on a bad spec, 2 on a usage or file
 * error. `helm_spec_check --presets` prints newt's model presets as JSON ({"tiny": {"vocab":
 * ..., "ctx": ..., "layers": ..., "heads": ..., "channels": ...}, ...}), which the chart's
 * files/presets.json must equal. */
#include <stdio.h>
#include <stdlib.h>

#include "common/err.h"
#include <string.h>

#include "common/fs.h"
#include "gpt/gpt.h"
#include "job/spec.h"
#include "model/config.h"

static int presets(void) {
  printf("{");
  for (int i = 0; i < model_config_npresets(); i++) {
    model_config m;
    if (model_config_preset(model_config_preset_name(i), &m) != NEWT_OK) return 1;
    printf("%s\"%s\":{\"vocab\":%lld,\"ctx\":%lld,\"layers\":%lld,\"heads\":%lld,\"channels\":%lld}", i ? "," : "",
           model_config_preset_name(i), (long long)m.vocab, (long long)m.ctx, (long long)m.layers, (long long)m.heads,
           (long long)m.channels);
  }
  printf("}\n");
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--presets") == 0) return presets();
  int builtin = 1;
  if (argc == 3 && (strcmp(argv[1], "--trainer=builtin") == 0 || strcmp(argv[1], "--trainer=program") == 0)) {
    builtin = strcmp(argv[1], "--trainer=builtin") == 0;
    argv++, argc--;
  }
  if (argc != 2) {
    fprintf(stderr, "usage: helm_spec_check [--trainer=builtin|program] SPEC.json\n");
    return 2;
  }
  char *text = NULL;
  size_t len = 0;
  if (newt_fs_read_all(argv[1], (size_t)1 << 20, &text, &len) != NEWT_OK) {
    fprintf(stderr, "helm_spec_check: %s\n", newt_errmsg());
    return 2;
  }
  newt_spec s;
  newt_result_t r = spec_from_json(text, len, &s);
  free(text);
  if (r == NEWT_OK) r = gpt_start_check(&s, GPT_CHECK_SPEC | (builtin ? GPT_CHECK_TRAINER : 0));
  if (r != NEWT_OK) {
    fprintf(stderr, "helm_spec_check: %s: %s\n", argv[1], newt_errmsg());
    return 1;
  }
  printf("ok job=%s tp=%lld pp=%lld zero=%lld dp=[%lld,%lld] global_batch=%lld micro_batch=%lld "
         "backend=%s ckpt_dir=%s ckpt_every=%lld\n",
         s.job, (long long)s.tp, (long long)s.pp, (long long)s.zero, (long long)s.dp_min,
         (long long)s.dp_max, (long long)s.global_batch, (long long)s.micro_batch, s.backend,
         s.ckpt_dir, (long long)s.ckpt_every);
  return 0;
}
