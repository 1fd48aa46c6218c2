/* newt bench recovery: not built yet (issue 6). */
#include <stdio.h>

#include "bench/bench.h"

int newt_bench_recovery(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "newt bench recovery: not built yet (issue 6)\n");
  return 2;
}
