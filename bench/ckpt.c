/* newt bench ckpt: not built yet (issue 5). */
#include <stdio.h>

#include "bench/bench.h"

int newt_bench_ckpt(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "newt bench ckpt: not built yet (issue 5)\n");
  return 2;
}
