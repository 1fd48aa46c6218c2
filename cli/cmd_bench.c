/* newt bench <name>: dispatches to the benchmark drivers in bench/. */
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "cli/cmds.h"

int newt_cmd_bench(int argc, char **argv) {
  const char *names = "rendezvous, allreduce, reduce_scatter, allgather, train, ckpt, recovery, straggler, verify, parse";
  if (argc < 1 || strcmp(argv[0], "--help") == 0) {
    fprintf(argc < 1 ? stderr : stdout, "usage: newt bench <%s> [flags]\n", names);
    return argc < 1 ? 2 : 0;
  }
  const char *b = argv[0];
  if (strcmp(b, "rendezvous") == 0) return newt_bench_rendezvous(argc - 1, argv + 1);
  if (strcmp(b, "allreduce") == 0 || strcmp(b, "reduce_scatter") == 0 || strcmp(b, "allgather") == 0)
    return newt_bench_collective(b, argc - 1, argv + 1);
  if (strcmp(b, "train") == 0) return newt_bench_train(argc - 1, argv + 1);
  if (strcmp(b, "ckpt") == 0) return newt_bench_ckpt(argc - 1, argv + 1);
  if (strcmp(b, "recovery") == 0) return newt_bench_recovery(argc - 1, argv + 1);
  if (strcmp(b, "straggler") == 0) return newt_bench_straggler(argc - 1, argv + 1);
  if (strcmp(b, "verify") == 0) return newt_bench_verify(argc - 1, argv + 1);
  if (strcmp(b, "parse") == 0) return newt_bench_parse(argc - 1, argv + 1);
  fprintf(stderr, "newt bench: unknown benchmark \"%s\" (one of %s)\n", b, names);
  return 2;
}
