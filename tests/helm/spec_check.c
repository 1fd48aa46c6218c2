/* helm_spec_check: checks a job spec file with newt's own parser (spec_from_json), so the
 * helm tests can prove that the spec the chart renders into its ConfigMap is one the
 * coordinators accept. Prints the parsed layout on success ("ok job=... tp=... pp=...
 * zero=... dp=[min,max] backend=... ckpt_dir=..."); prints the parser's message (it names
 * the field) and exits 1 on a bad spec, 2 on a usage or file error. */
#include <stdio.h>
#include <stdlib.h>

#include "common/err.h"
#include "common/fs.h"
#include "job/spec.h"

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: helm_spec_check SPEC.json\n");
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
