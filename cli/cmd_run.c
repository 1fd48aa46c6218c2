/* newt run: the whole job on this host, as one command: a private etcd (unless --etcd),
 * coordinators and workers as separate processes, faults injected at given steps, a
 * live progress line and a summary (see launch/launcher.h, docs/elastic.md). The log
 * directory keeps the run's files for `newt report DIR`: the summary (summary.json, also
 * where --summary says), the step log (steps.jsonl) and the event log (events.jsonl).
 * `-- COMMAND [ARGS...]`: every worker runs COMMAND, a program built on libnewt, in place
 * of the built-in trainer (`newt worker ... -- COMMAND ARGS`, cli/program.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "cli/cmds.h"
#include "cli/etcd_flags.h"
#include "cli/program.h"
#include "common/fs.h"
#include "common/opts.h"
#include "job/spec_flags.h"
#include "gpt/gpt.h"
#include "launch/launcher.h"
#include "model/dev.h"

#define RUN_SYNOPSIS "--nproc N [flags] [-- COMMAND [ARGS...]]"

static const char run_epilogue[] =
    "With -- COMMAND [ARGS...] every worker (the first --nproc and each chaos joiner) is\n"
    "`newt worker <its flags> -- COMMAND ARGS`: it execs COMMAND, a training program built on\n"
    "libnewt, with its flags in the environment (newt worker --help lists the variables) and\n"
    "LOCAL_RANK set to the worker's slot on this host (the lowest no live worker holds: the\n"
    "first workers get 0 to N-1, a joiner the lowest free one) and LOCAL_WORLD_SIZE to --nproc\n"
    "(or slot + 1 when more). The program writes the step log through NEWT_STEP_LOG; the\n"
    "summary, chaos and report are as with the built-in trainer (docs/elastic.md).\n";

/* The flags that set a field of the spec (job/spec_flags.h): with --spec the file sets them
 * all, and a flag beside it would be silently overridden by the file. Says which were given,
 * and returns 1, when any was. */
static int spec_flags_conflict(const spec_flags *sf, int argc, int command, char **argv) {
  char given[512];
  if (spec_flags_given(sf, command >= 0 ? command : argc, argv, given, sizeof given) == 0) return 0;
  fprintf(stderr, "newt run: %s: the spec file (--spec) sets the job's fields; give them in the file, or leave out "
                  "--spec\n", given);
  return 1;
}

/* newt run's flags beside the spec's (those are a spec_flags) */
typedef struct run_flags {
  int64_t nproc, coords, threads, timeout, members, hosts, gpus;
  const char *chaos, *spec_file;
  int quiet, restart;
  cli_etcd_flags ef; /* --etcd and how to reach it; no environment: newt run starts its own etcd */
} run_flags;

/* The flags, in --help's order, parsed into f, lo and sf; -1 to go on, else the exit status
 * (--help: 0, a bad flag: 2). *command: the index of the program after `--` (-1: none). */
static int parse_flags(int argc, char **argv, run_flags *f, launcher_opts *lo, spec_flags *sf, int *command) {
  *f = (run_flags){.nproc = 4, .coords = 2, .threads = 1, .members = 1, .gpus = -1};
  char job[64];
  snprintf(job, sizeof job, "run-%d", (int)getpid());
  newt_spec d;
  spec_defaults(&d, job);
  newt_opt opts[] = {
      {"nproc", NEWT_OPT_INT, &f->nproc, "workers to start"},
      SPEC_OPT("preset"), SPEC_OPT("model"), SPEC_OPT("steps"), SPEC_OPT("seq-len"), SPEC_OPT("global-batch"),
      SPEC_OPT("micro-batch"), SPEC_OPT("lr"), SPEC_OPT("lr-min"), SPEC_OPT("warmup"), SPEC_OPT("seed"),
      SPEC_OPT("data"), SPEC_OPT("data-seed"),
      SPEC_OPT("ckpt-dir"), SPEC_OPT("ckpt-every"), SPEC_OPT("ckpt-keep"), SPEC_OPT("tp"), SPEC_OPT("pp"),
      SPEC_OPT("zero"), SPEC_OPT("dp-min"), SPEC_OPT("dp-max"), SPEC_OPT("join-window-ms"),
      SPEC_OPT("even-batches"), SPEC_OPT("backend"),
      {"gpus", NEWT_OPT_INT, &f->gpus, "with --backend nccl: GPUs of this host to use (default: every visible one); "
                                       "each worker gets the one fewest live workers use"},
      {"share-gpus", NEWT_OPT_FLAG, &lo->share_gpus,
       "with --backend nccl: workers may share a GPU, each a host of its own to the coordinator and NCCL "
       "(sockets, no P2P or shared memory): for tests and for trying newt on one GPU; slow (docs/elastic.md)"},
      {"etcd", NEWT_OPT_STR, &f->ef.endpoints, "etcd endpoints to use (default: start a private etcd)"},
      {"etcd-user", NEWT_OPT_STR, &f->ef.user, "with --etcd: its user"},
      {"etcd-password-file", NEWT_OPT_STR, &f->ef.password_file, "with --etcd: a file holding the user's password"},
      {"etcd-ca", NEWT_OPT_STR, &f->ef.ca, "with --etcd https://...: the CA bundle that signs etcd's certificate"},
      {"etcd-cert", NEWT_OPT_STR, &f->ef.cert, "with --etcd https://...: a client certificate (mTLS; no Common Name when etcd also has users)"},
      {"etcd-key", NEWT_OPT_STR, &f->ef.key, "with --etcd-cert: its key"},
      {"etcd-members", NEWT_OPT_INT, &f->members, "members of the private etcd (1..5; chaos kill|stop:etcd:I acts on one)"},
      SPEC_OPT("job"),
      {"spec", NEWT_OPT_STR, &f->spec_file, "job spec file (the flags of the spec's fields go in it, not beside it)"},
      {"coordinators", NEWT_OPT_INT, &f->coords, "coordinator processes (one leads)"},
      {"threads", NEWT_OPT_INT, &f->threads, "compute threads per worker"},
      SPEC_OPT("lease-ttl-ms"), SPEC_OPT("comm-timeout-ms"), SPEC_OPT("hang-timeout-ms"),
      SPEC_OPT("first-step-timeout-ms"), SPEC_OPT("max-failures"), SPEC_OPT("failure-window-ms"),
      SPEC_OPT("progress-timeout-ms"), SPEC_OPT("replicas"), SPEC_OPT("on-state-loss"), SPEC_OPT("verify-every"),
      SPEC_OPT("on-mismatch"), SPEC_OPT("straggler-margin"), SPEC_OPT("straggler-window"),
      SPEC_OPT("straggler-replace"),
      {"hosts", NEWT_OPT_INT, &f->hosts,
       "simulate N hosts: the workers in contiguous blocks (w0..w(nproc/N-1) on host0, ...; a joiner on the host with "
       "fewest), each with --host hostI --domain hostI (its own shared memory and failure domain); chaos "
       "kill:host:I kills all of host I's at once (0: none)"},
      {"netns", NEWT_OPT_FLAG, &lo->netns,
       "each simulated host (each worker, without --hosts) in a network namespace of its own on a bridge (root): the "
       "workers talk TCP between their own addresses, and chaos cut:worker|rank|host:I[:MS|:until=S] (from the "
       "others) cut-etcd:... (from etcd and the coordinators) partition them for real, and slow:...:KBIT slows a link"},
      {"no-metrics", NEWT_OPT_FLAG, &lo->no_metrics, "coordinators serve no metrics (default: each on a free port, printed)"},
      {"chaos", NEWT_OPT_STR, &f->chaos, "faults at steps: kill:worker:1@step=15,join:2@step=50,..."},
      {"summary", NEWT_OPT_STR, &lo->summary, "write the run's summary JSON here"},
      {"log-dir", NEWT_OPT_STR, &lo->log_dir, "per-process logs and the run's files (default: a new directory under /tmp); "
       "yours, written by nobody else"},
      {"job-secret-file", NEWT_OPT_STR, &lo->secret_file,
       "the job secret (yours, mode 0600; default: the checkpoint directory's own job.secret, made when missing, "
       "else a new one): the data plane's keys, the proof of the records and checkpoints of the job"},
      {"step-log", NEWT_OPT_STR, &lo->step_log, "the step log, one JSON line per step (default: steps.jsonl in the log directory)"},
      {"timeout-ms", NEWT_OPT_INT, &f->timeout, "give up when not done by then (0: never)"},
      {"quiet", NEWT_OPT_FLAG, &f->quiet, "no live line"},
      {"restart", NEWT_OPT_FLAG, &f->restart,
       "the restart mode: COMMAND does not link newt (a script torchrun would run); each worker starts it with "
       "torchrun's environment and restarts every one when the membership changes or one fails or hangs; the "
       "steps counted are the lines `NEWT_STEP <n> [loss <x>]` it prints (docs/elastic.md, Scripts that do not "
       "link newt)"},
      NEWT_OPT_END};
  if (spec_flags_bind(sf, opts, &d) != NEWT_OK) return newt_opts_exit(NEWT_ERR_INVALID);
  return newt_opts_exit(newt_opts_parse_command("run", RUN_SYNOPSIS, run_epilogue, opts, argc, argv, command));
}

/* The job's spec: the file of --spec, else the spec's flags (checked by spec_validate). 0, or
 * 2 with the reason said. */
static int build_spec(const run_flags *f, const spec_flags *sf, newt_spec *s) {
  if (!f->spec_file) {
    *s = sf->defaults;
    if (spec_flags_apply(sf, s) != NEWT_OK || spec_validate(s) != NEWT_OK) {
      fprintf(stderr, "newt run: %s\n", newt_errmsg());
      return 2;
    }
    return 0;
  }
  char *text = NULL;
  size_t len = 0;
  if (newt_fs_read_all(f->spec_file, 1 << 20, &text, &len) != NEWT_OK || spec_from_json(text, len, s) != NEWT_OK) {
    fprintf(stderr, "newt run: %s: %s\n", f->spec_file, newt_errmsg());
    free(text);
    return 2;
  }
  free(text);
  return 0;
}

/* Everything the run can be refused for before anything of it starts (no log directory, no
 * etcd, no process): the spec (gpt_start_check: its rules, the built-in trainer's model and
 * data, the checkpoint directory), the workers a layout needs, the program. 0 when it may
 * start; else the reason is said and the run exits 2. */
static int before_start(const launcher_opts *lo) {
  const newt_spec *s = &lo->spec;
  int64_t group = s->tp * s->pp;
  if (lo->nproc < group * s->dp_min) {
    fprintf(stderr, "newt run: --nproc %d workers cannot hold one layout of tp x pp x dp_min = %lld x %lld x %lld = "
                    "%lld ranks: start more, or lower spec.parallel.dp_min\n",
            lo->nproc, (long long)s->tp, (long long)s->pp, (long long)s->dp_min, (long long)(group * s->dp_min));
    return 2;
  }
  if (lo->command && cli_program_check(lo->command) != NEWT_OK) {
    fprintf(stderr, "newt run: %s\n", newt_errmsg());
    return 2;
  }
  /* a program has its own model and data: the trainer's checks are not its */
  unsigned what = GPT_CHECK_SPEC | GPT_CHECK_FILES | (lo->command ? 0 : GPT_CHECK_TRAINER);
  if (gpt_start_check(s, what) != NEWT_OK) {
    fprintf(stderr, "newt run: %s\n", newt_errmsg());
    return 2;
  }
  return 0;
}

/* newt run's own flags checked, and the workers, the chaos schedule and the simulated hosts
 * taken into lo. 0, or 2 with the reason said. */
static int check_flags(const run_flags *f, launcher_opts *lo) {
  if (f->nproc < 1 || f->nproc > 1024 || f->coords < 1 || f->coords > 16 || f->threads < 0) {
    fprintf(stderr, "newt run: --nproc must be 1..1024, --coordinators 1..16, --threads >= 0\n");
    return 2;
  }
  if (f->members < 1 || f->members > 5 || (f->members > 1 && f->ef.endpoints)) {
    fprintf(stderr, "newt run: --etcd-members: 1..5, for the private etcd (not with --etcd)\n");
    return 2;
  }
  if (chaos_parse(f->chaos, &lo->chaos) != NEWT_OK) {
    fprintf(stderr, "newt run: %s\n", newt_errmsg());
    return 2;
  }
  if (f->hosts < 0 || f->hosts > f->nproc || f->hosts > 1024) {
    fprintf(stderr, "newt run: --hosts %lld: 0 (none) to --nproc %lld simulated hosts\n", (long long)f->hosts,
            (long long)f->nproc);
    return 2;
  }
  lo->hosts = (int)f->hosts;
  return 0;
}

/* A chaos event aimed at a simulated host needs that host (lo->hosts). 0, or 2 with the
 * reason said. */
static int check_chaos_hosts(const launcher_opts *lo) {
  if (launcher_check_hosts(lo) == NEWT_OK) return 0;
  fprintf(stderr, "newt run: %s\n", newt_errmsg());
  return 2;
}

/* The GPUs of a GPU backend (--backend nccl: --gpus, --share-gpus) into lo. 0, or 2 with the reason said. */
static int check_gpus(launcher_opts *lo, int64_t gpus) {
  if (newt_backend_uses_gpu(newt_backend_find(lo->spec.backend))) {
    int visible = model_dev_cuda_count();
    if (gpus < 0) gpus = visible;
    if (visible == 0) {
      fprintf(stderr, "newt run: --backend nccl: this host has no GPU this process can use (no CUDA driver or GPU, "
                      "CUDA_VISIBLE_DEVICES, or a newt built without CUDA): use --backend cpu\n");
      return 2;
    }
    if (gpus < 1 || gpus > visible) {
      fprintf(stderr, "newt run: --gpus %lld: this host has %d GPU%s visible\n", (long long)gpus, visible,
              visible == 1 ? "" : "s");
      return 2;
    }
    lo->gpus = (int)gpus;
  } else if (gpus > 0 || lo->share_gpus) {
    fprintf(stderr, "newt run: %s goes with --backend nccl\n", gpus > 0 ? "--gpus" : "--share-gpus");
    return 2;
  }
  return 0;
}

/* --etcd and its client options into lo (*password: the user's, to clear at the end); without
 * --etcd a private etcd, and none of them. 0, or 2 with the reason said. */
static int setup_etcd(run_flags *f, launcher_opts *lo, char **password) {
  cli_etcd_flags *ef = &f->ef;
  if (ef->endpoints) {
    ef->job = lo->spec.job;
    if (cli_etcd_opts(ef, &lo->etcd_client, password) != NEWT_OK) {
      fprintf(stderr, "newt run: %s\n", newt_errmsg());
      return 2;
    }
    lo->etcd = ef->endpoints;
    lo->etcd_password_file = ef->password_file;
  } else if (ef->user || ef->password_file || ef->ca || ef->cert || ef->key) {
    fprintf(stderr, "newt run: --etcd-user, --etcd-password-file, --etcd-ca, --etcd-cert and --etcd-key go with --etcd\n");
    return 2;
  }
  return 0;
}

/* The restart mode (--restart, or a spec file that says "restart": true): the program after
 * `--` is supervised, and the spec gets the mode's fields (spec_set_restart). 0, or 2 with the
 * reason said. */
static int restart_mode(const run_flags *f, launcher_opts *lo) {
  if (!f->restart && !lo->spec.restart) return 0;
  if (!lo->command) {
    fprintf(stderr, "newt run: --restart goes with -- COMMAND, the program the workers supervise\n");
    return 2;
  }
  spec_set_restart(&lo->spec);
  if (spec_validate(&lo->spec) != NEWT_OK) {
    fprintf(stderr, "newt run: --restart: %s\n", newt_errmsg());
    return 2;
  }
  return 0;
}

/* Everything before the launch: the flags, the spec, the checks. -1 to launch, else the exit
 * status. */
static int prepare(int argc, char **argv, run_flags *f, launcher_opts *lo, char **password) {
  spec_flags sf;
  int command = -1;
  int rc = parse_flags(argc, argv, f, lo, &sf, &command);
  if (rc >= 0) return rc;
  if (command >= argc) {
    fprintf(stderr, "newt run: -- must be followed by the program the workers run: newt run " RUN_SYNOPSIS "\n");
    return 2;
  }
  if (command >= 0) lo->command = argv + command; /* NULL-terminated, as main's argv is */
  if (f->spec_file && spec_flags_conflict(&sf, argc, command, argv)) return 2;
  if (build_spec(f, &sf, &lo->spec) != 0 || check_flags(f, lo) != 0) return 2;
  if (restart_mode(f, lo) != 0) return 2;
  if (check_chaos_hosts(lo) != 0 || check_gpus(lo, f->gpus) != 0) return 2;
  lo->nproc = (int)f->nproc;
  lo->coordinators = (int)f->coords;
  lo->etcd_members = (int)f->members;
  if (setup_etcd(f, lo, password) != 0) return 2;
  if (launcher_check_opts(lo) != NEWT_OK) { /* options that cannot go together */
    fprintf(stderr, "newt run: %s\n", newt_errmsg());
    return 2;
  }
  lo->threads = (int)f->threads;
  lo->quiet = f->quiet;
  lo->timeout_ms = f->timeout;
  return before_start(lo) != 0 ? 2 : -1;
}

/* The line of a run that is done. */
static void say_done(const launcher_result *res) {
  char repeated[64] = "", skipped[64] = ""; /* said where there are some */
  if (res->samples_repeated > 0)
    snprintf(repeated, sizeof repeated, " (%lld trained twice)", (long long)res->samples_repeated);
  if (res->ckpts_skipped > 0)
    snprintf(skipped, sizeof skipped, ", %lld checkpoint%s skipped", (long long)res->ckpts_skipped,
             res->ckpts_skipped == 1 ? "" : "s");
  if (res->restart_mode) { /* the programs' own steps and restarts: newt counted none of their samples */
    printf("newt run: done: the programs' %lld steps, final loss %.4f, %lld restart%s (%lld of their steps done "
           "again), %lld generations, %.1f s\n",
           (long long)res->steps, res->final_loss, (long long)res->restarts, res->restarts == 1 ? "" : "s",
           (long long)res->steps_redone, (long long)res->generations, res->wall_s);
    return;
  }
  printf("newt run: done: %lld steps, final loss %.4f, %lld generations, %d recoveries, %lld samples%s%s, %.1f s\n",
         (long long)res->steps, res->final_loss, (long long)res->generations, res->nrecoveries,
         (long long)res->samples_consumed, repeated, skipped, res->wall_s);
}

/* The summary: in the log directory for `newt report`, and where --summary says. r, or
 * NEWT_ERR_SYS where it was NEWT_OK and a summary could not be written. */
static newt_result_t write_summary(const launcher_opts *lo, launcher_result *res, newt_result_t r) {
  char in_dir[600];
  snprintf(in_dir, sizeof in_dir, "%s/summary.json", res->log_dir);
  const char *paths[] = {res->log_dir[0] ? in_dir : NULL, lo->summary};
  char *json = launcher_summary_json(lo, res);
  for (size_t i = 0; i < 2; i++) {
    if (!paths[i]) continue;
    if (!json || newt_fs_write_atomic(paths[i], json, strlen(json)) != NEWT_OK) {
      fprintf(stderr, "newt run: writing the summary %s: %s\n", paths[i], json ? newt_errmsg() : "out of memory");
      r = r == NEWT_OK ? NEWT_ERR_SYS : r;
    }
  }
  free(json);
  return r;
}

/* What comes after the run: its report, or, for one cut short on a checkpoint directory, the
 * step a run on it resumes from. */
static void say_next(const launcher_opts *lo, const launcher_result *res, int interrupted) {
  /* a run cut short, or one that made no step (its workers could not start), has no report to
     offer: its files are kept, and the line above says where */
  if (res->log_dir[0] && !lo->quiet && !interrupted && (res->done || res->steps > 0))
    printf("newt run: the run's report: newt report %s\n", res->log_dir);
  if (interrupted && lo->spec.ckpt_dir[0]) { /* what a run on the directory takes up, as it is on disk */
    if (res->newest_ckpt > 0)
      printf("newt run: the newest checkpoint in %s is step %lld: newt run with --ckpt-dir %s resumes from it (on "
             "any number of workers)\n", lo->spec.ckpt_dir, (long long)res->newest_ckpt, lo->spec.ckpt_dir);
    else
      printf("newt run: %s holds no checkpoint: a run on it starts from step 0\n", lo->spec.ckpt_dir);
  }
}

int newt_cmd_run(int argc, char **argv) {
  launcher_opts lo;
  memset(&lo, 0, sizeof lo);
  run_flags f;
  char *password = NULL;
  int rc = prepare(argc, argv, &f, &lo, &password);
  if (rc >= 0) return rc;
  launcher_result res;
  newt_result_t r = launcher_run(&lo, &res);
  if (r != NEWT_OK) fprintf(stderr, "%s\n", newt_errmsg());
  /* the step a run on the checkpoint directory resumes from, now that no process writes it */
  int64_t newest = lo.spec.ckpt_dir[0] ? ckpt_latest_pointer(lo.spec.ckpt_dir) : -1;
  res.newest_ckpt = newest > 0 ? newest : 0;
  if (res.done) say_done(&res);
  r = write_summary(&lo, &res, r);
  int interrupted = strcmp(res.outcome, "interrupted") == 0, by_term = strstr(res.reason, "SIGTERM") != NULL;
  say_next(&lo, &res, interrupted);
  int failed = strcmp(res.outcome, "failed") == 0, done = res.done;
  launcher_result_free(&res);
  chaos_free(&lo.chaos);
  if (password) memset(password, 0, strlen(password));
  free(password);
  /* 128 + the signal, as a shell reports a command a signal ended: 130 for Ctrl-C, 143 for
     SIGTERM */
  if (interrupted) return by_term ? 143 : 130;
  if (failed) return JOB_EXIT_FAILED; /* as every process of the job */
  return r == NEWT_OK && done ? 0 : 1;
}
