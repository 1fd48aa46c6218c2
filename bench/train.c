/* newt bench train: not built yet (issue 4). */
#include <stdio.h>

#include "bench/bench.h"

int newt_bench_train(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "newt bench train: not built yet (issue 4)\n");
  return 2;
}
