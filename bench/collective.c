/* newt bench allreduce|reduce_scatter|allgather: not built yet (issue 3). */
#include <stdio.h>

#include "bench/bench.h"

int newt_bench_collective(const char *op, int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "newt bench %s: not built yet (issue 3)\n", op);
  return 2;
}
