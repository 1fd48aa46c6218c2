/* newt bench rendezvous: not built yet (issue 2). */
#include <stdio.h>

#include "bench/bench.h"

int newt_bench_rendezvous(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "newt bench rendezvous: not built yet (issue 2)\n");
  return 2;
}
