/* newt worker: one training process. Registers with etcd, follows the leader's plans,
 * rebuilds its communicator on each, restores state, trains, and leaves gracefully on
 * SIGTERM. --step-log FILE: while it is rank 0, it appends a line per step to FILE (the
 * step log, job/runlog.h). --metrics-port: its own metrics and /healthz. Exit status and
 * termination message: cli/ending.h. --local-workers N: the node agent of cli/agent.h,
 * which runs N such workers (one per GPU of the node) and restarts the ones that crash.
 * `-- COMMAND [ARGS...]`: instead of the built-in trainer, the flags become the environment
 * of cli/program.h and COMMAND (a program built on libnewt) is exec'd in newt's place; with
 * --local-workers each local worker does so. With --restart and `-- COMMAND` (a program that
 * does not link newt), the worker stays and supervises COMMAND (cli/restart.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/agent.h"
#include "cli/cmds.h"
#include "cli/ending.h"
#include "cli/etcd_flags.h"
#include "cli/program.h"
#include "cli/restart.h"
#include "common/log.h"
#include "common/opts.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "gpt/gpt.h"
#include "rendezvous/rdzv.h"

#define WORKER_SYNOPSIS "--job NAME [flags] [-- COMMAND [ARGS...]]"

static const char worker_epilogue[] =
    "With -- COMMAND [ARGS...] newt worker runs COMMAND, a training program built on libnewt,\n"
    "instead of its built-in trainer: it checks the flags, sets them in the environment and\n"
    "execs COMMAND in its place (the same pid, so SIGTERM reaches the program). The program\n"
    "gets NEWT_ETCD, NEWT_ETCD_USER, NEWT_ETCD_PASSWORD_FILE, NEWT_ETCD_CA, NEWT_ETCD_CERT,\n"
    "NEWT_ETCD_KEY (those set), NEWT_JOB, NEWT_WORKER_ID (--id, else host-pid), NEWT_HOST,\n"
    "NEWT_DOMAIN and NEWT_ADDR (when given), NEWT_PORT, NEWT_DEVICE, NEWT_SHARE_DEVICE=1\n"
    "(with --share-device), NEWT_THREADS, NEWT_STEP_LOG and NEWT_JOB_SECRET_FILE (when given),\n"
    "NEWT_METRICS_PORT, NEWT_METRICS_ADDR, NEWT_TERMINATION_LOG (when there is one), and\n"
    "LOCAL_RANK and LOCAL_WORLD_SIZE as torchrun sets them (kept when set: the node agent and\n"
    "newt run set them; else 0 and 1). RANK and WORLD_SIZE are not set: they change while an\n"
    "elastic job runs; the program asks the library. A flag wins over an inherited variable;\n"
    "the rest of the environment is inherited. A COMMAND that cannot be run exits 2\n"
    "(docs/elastic.md).\n"
    "With --local-workers N each local worker runs COMMAND so, LOCAL_RANK i of N.\n"
    "NEWT_SPEC_WAIT_MS bounds how long joining waits for etcd to answer and for the job's spec\n"
    "(default 60000: 60 s), the built-in trainer's and a COMMAND's alike; past it the worker exits\n"
    "naming etcd's address.\n";

/* An integer flag's fallback: the variable, when set (a bad value names it). */
static newt_result_t env_int(const char *name, int64_t *v) {
  const char *s = getenv(name);
  if (!s || !*s) return NEWT_OK;
  if (newt_parse_int(s, v) != 0) return NEWT_ERR(NEWT_ERR_INVALID, "%s: expects an integer, got \"%s\"", name, s);
  return NEWT_OK;
}

static newt_result_t env_defaults(int64_t *port, int64_t *device, int64_t *threads, int64_t *metrics_port,
                                  int *share_device) {
  NEWT_CHECK(env_int("NEWT_PORT", port));
  NEWT_CHECK(env_int("NEWT_DEVICE", device));
  NEWT_CHECK(env_int("NEWT_THREADS", threads));
  NEWT_CHECK(env_int("NEWT_METRICS_PORT", metrics_port));
  int64_t share = 0;
  NEWT_CHECK(env_int("NEWT_SHARE_DEVICE", &share));
  if (share != 0 && share != 1)
    return NEWT_ERR(NEWT_ERR_INVALID, "NEWT_SHARE_DEVICE: 1 or 0, got %lld", (long long)share);
  *share_device = (int)share;
  return NEWT_OK;
}

/* The words after `--`: the program (NULL: the built-in trainer). An empty one is an
 * error, said on stderr (exit 2). */
static int program_of(int argc, char **argv, int command, char ***out) {
  *out = NULL;
  if (command < 0) return 0;
  if (command >= argc) {
    fprintf(stderr, "newt worker: -- must be followed by the program to run: newt worker " WORKER_SYNOPSIS "\n");
    return -1;
  }
  *out = argv + command; /* argv is NULL-terminated, as main's is */
  return 0;
}

/* A program in newt's place (cli/program.h); returns only when it cannot be run. */
static int exec_program(const cli_program *p, char **command) {
  job_end end = {.status = JOB_EXIT_USAGE};
  char id[128];
  cli_program_id(p, id, sizeof id);
  newt_result_t r = newt_check_name("--id", id);
  if (r == NEWT_OK) r = cli_program_env(p);
  int sig = 0;
  if (r == NEWT_OK) r = cli_program_exec(command, &sig);
  if (sig) { /* asked to leave before the program started */
    end.status = JOB_EXIT_LEFT;
    snprintf(end.msg, sizeof end.msg, "left: signal %d before %s started", sig, command[0]);
    r = NEWT_OK;
  }
  return cli_end("worker", r, &end, cli_termination_log(p->term_log));
}

typedef struct agent_flags {
  int64_t local_workers, max_restarts, restart_window, health_every;
} agent_flags;

/* The node agent (cli/agent.h), once the flags are checked. */
static int run_agent(const cli_program *p, const agent_flags *af, const rdzv_etcd_opts *eo, const char *job, int argc,
                     char **argv, char **command) {
  if (p->port > 0 && p->port + af->local_workers - 1 > 65535) {
    fprintf(stderr, "newt worker: --port %lld + --local-workers %lld goes beyond port 65535\n", (long long)p->port,
            (long long)af->local_workers);
    return 2;
  }
  if (p->metrics_port > 0 && p->metrics_port + af->local_workers - 1 > 65535) {
    fprintf(stderr, "newt worker: --metrics-port %lld + --local-workers %lld goes beyond port 65535\n",
            (long long)p->metrics_port, (long long)af->local_workers);
    return 2;
  }
  /* the ids stay the same across a worker's restarts: the agent's own id, suffixed */
  char own_id[64];
  cli_program_id(p, own_id, sizeof own_id);
  char first[96];
  snprintf(first, sizeof first, "%s-%lld", own_id, (long long)af->local_workers - 1);
  if (newt_check_name("--id", first) != NEWT_OK) {
    fprintf(stderr, "newt worker: %s (with --local-workers the ids are ID-0 ... ID-%lld)\n", newt_errmsg(),
            (long long)af->local_workers - 1);
    return 2;
  }
  cli_agent_opts ao = {.n = (int)af->local_workers, .id = own_id, .device = p->device >= 0 ? (int)p->device : 0,
                       .port = (int)p->port, .metrics_port = (int)p->metrics_port,
                       .max_restarts = (int)af->max_restarts, .restart_window_ms = af->restart_window * 1000,
                       .health_every_ms = af->health_every, .metrics_addr = p->metrics_addr,
                       .term_log = cli_termination_log(p->term_log), .argc = argc, .argv = argv,
                       .command = command, .etcd = eo, .job = job};
  return cli_agent_run(&ao);
}

/* The checks of the flags' ranges (the rest are the worker's); 0 when they hold. */
static int check_ranges(const cli_program *p, const agent_flags *af) {
  if (p->port < 0 || p->port > 65535 || p->threads < 0 || p->metrics_port < 0 || p->metrics_port > 65535) {
    fprintf(stderr, "newt worker: --port and --metrics-port must be 0..65535 and --threads >= 0\n");
    return 2;
  }
  if (af->local_workers < 0 || af->local_workers > 64 || af->max_restarts < 0 || af->max_restarts > 1000 ||
      af->restart_window < 1 || af->health_every < 0 || af->health_every > 3600000) {
    fprintf(stderr, "newt worker: --local-workers must be 0..64, --max-restarts 0..1000, --restart-window >= 1 and "
                    "--health-every-ms 0..3600000\n");
    return 2;
  }
  return 0;
}

/* The flags as the worker's join options. */
static void join_opts_of(const cli_program *p, const cli_etcd_flags *ef, newt_join_opts *out) {
  newt_join_opts jo;
  newt_join_opts_init(&jo);
  jo.etcd = ef->endpoints;
  jo.etcd_user = ef->user;
  jo.etcd_password_file = ef->password_file;
  jo.etcd_ca = ef->ca;
  jo.etcd_cert = ef->cert;
  jo.etcd_key = ef->key;
  jo.job = ef->job;
  jo.worker_id = p->id;
  jo.host = p->host;
  jo.domain = p->domain;
  jo.addr = p->addr;
  jo.port = (int)p->port;
  jo.device = (int)p->device;
  jo.share_device = p->share_device;
  jo.step_log = p->step_log;
  jo.job_secret_file = p->secret_file;
  jo.metrics_addr = p->metrics_addr;
  jo.metrics_port = (int)p->metrics_port;
  jo.termination_log = cli_termination_log(p->term_log);
  jo.handle_signals = 1;
  *out = jo;
}

/* The built-in trainer as this worker (gpt_worker_run), with the flags as its join options. */
static int run_builtin(const cli_program *p, const cli_etcd_flags *ef) {
  newt_join_opts jo;
  join_opts_of(p, ef, &jo);
  return gpt_worker_run(&jo, (int)p->threads);
}

/* The restart mode's supervisor of COMMAND (cli/restart.h): the step log is its own to write
 * (the program's steps), not the library's (its beats). */
static int run_restart(const cli_program *p, const cli_etcd_flags *ef, char **command) {
  newt_join_opts jo;
  join_opts_of(p, ef, &jo);
  jo.step_log = "";
  char id[128];
  cli_program_id(p, id, sizeof id);
  jo.worker_id = id;
  newt_result_t r = cli_program_check(command);
  if (r != NEWT_OK) {
    job_end end = {.status = JOB_EXIT_USAGE};
    return cli_end("worker", r, &end, cli_termination_log(p->term_log));
  }
  cli_restart_opts ro = {.join = &jo, .command = command, .step_log = p->step_log, .addr = p->addr,
                         .threads = (int)p->threads};
  return cli_restart_run(&ro);
}

int newt_cmd_worker(int argc, char **argv) {
  newt_log_set_default_level(NEWT_LOG_INFO); /* lifecycle lines: plan, joined, left, done */
  cli_etcd_flags ef;
  cli_etcd_flags_init(&ef);
  cli_program p = {.etcd = &ef, .device = -1, .threads = 1};
  p.id = getenv("NEWT_WORKER_ID") ? getenv("NEWT_WORKER_ID") : getenv("POD_NAME");
  p.host = getenv("NEWT_HOST");
  p.domain = getenv("NEWT_DOMAIN");
  p.addr = getenv("NEWT_ADDR") ? getenv("NEWT_ADDR") : getenv("POD_IP");
  p.step_log = getenv("NEWT_STEP_LOG");
  p.secret_file = getenv("NEWT_JOB_SECRET_FILE");
  p.metrics_addr = getenv("NEWT_METRICS_ADDR") ? getenv("NEWT_METRICS_ADDR") : "127.0.0.1";
  agent_flags af = {.max_restarts = 5, .restart_window = 600, .health_every = 5000};
  int restart = 0;
  if (env_defaults(&p.port, &p.device, &p.threads, &p.metrics_port, &p.share_device) != NEWT_OK) {
    fprintf(stderr, "newt worker: %s\n", newt_errmsg());
    return 2;
  }
  newt_opt opts[] = {CLI_ETCD_OPTS(&ef),
                     {"id", NEWT_OPT_STR, &p.id, "worker id, unique in the job (env NEWT_WORKER_ID, POD_NAME; default host-pid)"},
                     {"host", NEWT_OPT_STR, &p.host, "host identity: workers on one host share memory (env NEWT_HOST; default hostname)"},
                     {"domain", NEWT_OPT_STR, &p.domain,
                      "failure domain: what goes down as a unit with this worker (a node, a rack, a zone); copies of "
                      "a shard are kept in other domains (env NEWT_DOMAIN; default the host; docs/elastic.md)"},
                     {"addr", NEWT_OPT_STR, &p.addr, "address peers reach this worker at (env NEWT_ADDR, POD_IP; default 127.0.0.1)"},
                     {"port", NEWT_OPT_INT, &p.port, "data-plane port (0: any free port) (env NEWT_PORT)"},
                     {"device", NEWT_OPT_INT, &p.device, "CUDA device (-1: train on CPU) (env NEWT_DEVICE)"},
                     {"share-device", NEWT_OPT_FLAG, &p.share_device,
                      "other workers with --share-device may train on this GPU too (each its own NCCL host: "
                      "NCCL_HOSTID, set when unset; docs/elastic.md, GPU workers on one host) (env NEWT_SHARE_DEVICE=1)"},
                     {"threads", NEWT_OPT_INT, &p.threads, "CPU threads for compute (env NEWT_THREADS)"},
                     {"step-log", NEWT_OPT_STR, &p.step_log,
                      "while rank 0, append one JSON line per step to FILE (env NEWT_STEP_LOG; docs/elastic.md)"},
                     {"job-secret-file", NEWT_OPT_STR, &p.secret_file,
                      "the job's secret, the data plane's keys come from it (env NEWT_JOB_SECRET_FILE; docs/elastic.md)"},
                     {"metrics-port", NEWT_OPT_INT, &p.metrics_port,
                      "port of this worker's metrics and /healthz (0: off) (env NEWT_METRICS_PORT)"},
                     {"metrics-addr", NEWT_OPT_STR, &p.metrics_addr,
                      "addresses the metrics server binds, comma-separated (env NEWT_METRICS_ADDR)"},
                     {"termination-log", NEWT_OPT_STR, &p.term_log,
                      "file for the termination message (env NEWT_TERMINATION_LOG; default /dev/termination-log when it exists)"},
                     {"restart", NEWT_OPT_FLAG, &restart,
                      "with -- COMMAND: COMMAND does not link newt (a script torchrun would run): supervise it, "
                      "starting it with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) at each "
                      "generation and restarting it when the job's membership changes (a job of newt run --restart; "
                      "docs/elastic.md, Scripts that do not link newt)"},
                     {"local-workers", NEWT_OPT_INT, &af.local_workers,
                      "run N workers, worker i as --id ID-i --device DEVICE+i --port PORT+i --metrics-port METRICS-PORT+i, "
                      "restarting the ones that crash (the node agent: docs/kubernetes.md, GPU nodes; 0: be one worker)"},
                     {"max-restarts", NEWT_OPT_INT, &af.max_restarts,
                      "with --local-workers: restarts of one worker within --restart-window before the agent gives up"},
                     {"restart-window", NEWT_OPT_INT, &af.restart_window,
                      "with --local-workers: the window of --max-restarts, seconds"},
                     {"health-every-ms", NEWT_OPT_INT, &af.health_every,
                      "with --local-workers and --metrics-port: probe each worker's /healthz this often; one failing "
                      "3 probes in a row is killed and restarts (0: no probes)"},
                     NEWT_OPT_END};
  int command = -1;
  int rc = newt_opts_exit(newt_opts_parse_command("worker", WORKER_SYNOPSIS, worker_epilogue, opts, argc, argv, &command));
  if (rc >= 0) return rc;
  char **program = NULL;
  if (program_of(argc, argv, command, &program) != 0) return 2;
  rdzv_etcd_opts eo;
  char *password = NULL;
  if (cli_etcd_opts(&ef, &eo, &password) != NEWT_OK) {
    fprintf(stderr, "newt worker: %s\n", newt_errmsg());
    return 2;
  }
  if (check_ranges(&p, &af) != 0) {
    free(password);
    return 2;
  }
  if (restart && !program) {
    fprintf(stderr, "newt worker: --restart goes with -- COMMAND, the program to supervise\n");
    free(password);
    return 2;
  }
  if (restart && af.local_workers == 0) {
    free(password); /* libnewt reads the file itself */
    return run_restart(&p, &ef, program);
  }
  if (af.local_workers > 0 || program) {
    int nflags = program ? command - 1 : argc; /* the agent passes the flags on, not `--` */
    if (af.local_workers > 0) { /* the agent holds the host's lease: its client needs the password */
      int st = run_agent(&p, &af, &eo, ef.job, nflags, argv, program);
      free(password);
      return st;
    }
    free(password); /* read to check it; the program reads it itself */
    return exec_program(&p, program);
  }
  free(password); /* libnewt reads the file itself */
  return run_builtin(&p, &ef);
}
