/* Benchmark drivers behind `newt bench <name>`. Each prints one JSON object per line on
 * stdout (progress goes to stderr) and returns an exit status. Collective benchmarks use
 * the nccl-tests definitions (docs/comm.md). */
#ifndef NEWT_BENCH_BENCH_H
#define NEWT_BENCH_BENCH_H

int newt_bench_rendezvous(int argc, char **argv);
int newt_bench_collective(const char *op, int argc, char **argv); /* allreduce, reduce_scatter, allgather */
int newt_bench_train(int argc, char **argv);
int newt_bench_ckpt(int argc, char **argv);
int newt_bench_recovery(int argc, char **argv);
int newt_bench_verify(int argc, char **argv); /* bench/train.c: the check of the replicas, per step */
int newt_bench_parse(int argc, char **argv);  /* plans, events and manifests read as they grow */
int newt_bench_straggler(int argc, char **argv); /* bench/straggler.c: rebalancing against equal shares */

#endif
