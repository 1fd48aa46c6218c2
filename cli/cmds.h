/* The `newt` subcommands. Each is `int newt_cmd_<name>(int argc, char **argv)` in
 * cli/cmd_<name>.c, where argv[0] is the first argument after the subcommand's name; it
 * returns the process's exit status (0 success, 1 failure, 2 usage error). */
#ifndef NEWT_CLI_CMDS_H
#define NEWT_CLI_CMDS_H

int newt_cmd_run(int argc, char **argv);         /* single-host launcher */
int newt_cmd_coordinator(int argc, char **argv); /* control plane */
int newt_cmd_worker(int argc, char **argv);      /* one training process */
int newt_cmd_status(int argc, char **argv);      /* job state from etcd */
int newt_cmd_job(int argc, char **argv);         /* job rm: a job's records out of etcd */
int newt_cmd_report(int argc, char **argv);      /* an HTML report of a run */
int newt_cmd_ckpt(int argc, char **argv);        /* ls / inspect / verify */
int newt_cmd_bench(int argc, char **argv);       /* benchmarks, JSON lines */
int newt_cmd_train(int argc, char **argv);       /* single process, no coordinator */
int newt_cmd_data(int argc, char **argv);        /* data prepare */
int newt_cmd_demo(int argc, char **argv);        /* the rendezvous demo */

#endif
