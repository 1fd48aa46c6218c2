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

/* The flags that set a field of the spec: with --spec the file sets them all, and a flag
 * beside it would be silently overridden by the file. Says which were given, and returns 1,
 * when any was. */
static int spec_flags_given(int argc, int command, char **argv) {
  static const char *const fields[] = {"preset", "model", "steps", "seq-len", "global-batch", "micro-batch", "lr",
                                       "seed", "data", "data-seed", "ckpt-dir", "ckpt-every", "ckpt-keep", "tp", "pp",
                                       "zero", "dp-min", "dp-max", "even-batches", "join-window-ms", "backend", "job", "lease-ttl-ms", "comm-timeout-ms",
                                       "hang-timeout-ms", "first-step-timeout-ms", "max-failures",
                                       "failure-window-ms", "replicas", "on-state-loss", "verify-every",
                                       "on-mismatch", NULL};
  char given[512] = "";
  int end = command >= 0 ? command : argc;
  for (int i = 1; i < end; i++) {
    if (strncmp(argv[i], "--", 2) != 0) continue;
    for (int k = 0; fields[k]; k++) {
      size_t n = strlen(fields[k]);
      if (strncmp(argv[i] + 2, fields[k], n) == 0 && (argv[i][2 + n] == '\0' || argv[i][2 + n] == '=')) {
        size_t l = strlen(given);
        snprintf(given + l, sizeof given - l, "%s--%s", l ? ", " : "", fields[k]);
      }
    }
  }
  if (!given[0]) return 0;
  fprintf(stderr, "newt run: %s: the spec file (--spec) sets the job's fields; give them in the file, or leave out "
                  "--spec\n", given);
  return 1;
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

int newt_cmd_run(int argc, char **argv) {
  launcher_opts lo;
  memset(&lo, 0, sizeof lo);
  cli_etcd_flags ef; /* --etcd and how to reach it; no environment: newt run starts its own etcd */
  memset(&ef, 0, sizeof ef);
  char *password = NULL;
  char job[64];
  snprintf(job, sizeof job, "run-%d", (int)getpid());
  const char *backend = "cpu";
  int64_t gpus = -1;
  const char *job_name = job, *preset = "tiny", *model = NULL, *data = NULL, *ckpt_dir = NULL, *chaos = NULL, *spec_file = NULL;
  newt_spec d;
  spec_defaults(&d, job);
  int64_t nproc = 4, coords = 2, steps = d.steps, gb = d.global_batch, mb = d.micro_batch, every = 0, keep = d.ckpt_keep,
          threads = 1, tp = 1, pp = 1, zero = 0, timeout = 0, lease = d.lease_ttl_ms, comm_to = d.comm_timeout_ms,
          hang = d.hang_timeout_ms, first_step = d.first_step_timeout_ms, seed = (int64_t)d.seed, data_seed = (int64_t)d.data_seed, dp_min = d.dp_min,
          dp_max = d.dp_max, join_window = d.join_window_ms, seq = 0, members = 1, max_failures = d.max_failures, failure_window = d.failure_window_ms, progress_timeout = d.progress_timeout_ms,
          hosts = 0, replicas = d.replicas, verify_every = d.verify_every;
  const char *on_state_loss = spec_state_loss_name(d.on_state_loss), *on_mismatch = spec_mismatch_name(d.on_mismatch);
  double lr = d.lr;
  int quiet = 0, even_batches = 0;
  newt_opt opts[] = {
      {"nproc", NEWT_OPT_INT, &nproc, "workers to start"},
      {"preset", NEWT_OPT_STR, &preset, "model preset: tiny, small or gpt2-124m"},
      {"model", NEWT_OPT_STR, &model, "overrides of the preset: layers=2,channels=64,..."},
      {"steps", NEWT_OPT_INT, &steps, "optimizer steps"},
      {"seq-len", NEWT_OPT_INT, &seq, "tokens per sample (0: the model's ctx)"},
      {"global-batch", NEWT_OPT_INT, &gb, "samples per step, kept across every resize"},
      {"micro-batch", NEWT_OPT_INT, &mb, "samples per forward/backward on one rank"},
      {"lr", NEWT_OPT_DOUBLE, &lr, "peak learning rate"},
      {"seed", NEWT_OPT_INT, &seed, "seed of the initial weights"},
      {"data", NEWT_OPT_STR, &data, "token file (newt data prepare); default: the generated corpus"},
      {"data-seed", NEWT_OPT_INT, &data_seed, "seed of the sample order"},
      {"ckpt-dir", NEWT_OPT_STR, &ckpt_dir, "checkpoint directory"},
      {"ckpt-every", NEWT_OPT_INT, &every, "checkpoint every K steps (0: never)"},
      {"ckpt-keep", NEWT_OPT_INT, &keep, "checkpoints to keep"},
      {"tp", NEWT_OPT_INT, &tp, "tensor-parallel size"},
      {"pp", NEWT_OPT_INT, &pp, "pipeline-parallel size"},
      {"zero", NEWT_OPT_INT, &zero, "ZeRO stage (0..3)"},
      {"dp-min", NEWT_OPT_INT, &dp_min, "smallest data-parallel size to train with"},
      {"dp-max", NEWT_OPT_INT, &dp_max, "largest data-parallel size"},
      {"join-window-ms", NEWT_OPT_INT, &join_window,
       "joiners are taken in once no other has registered for this long (more gathers several into one plan)"},
      {"even-batches", NEWT_OPT_FLAG, &even_batches,
       "only data-parallel sizes that give every rank the same whole micro-batches (workers beyond wait as spares); "
       "default: every worker trains, the ranks splitting the global batch's samples as evenly as they go"},
      {"backend", NEWT_OPT_STR, &backend, "cpu, or nccl: the workers train on GPUs (one each), over NCCL"},
      {"gpus", NEWT_OPT_INT, &gpus, "with --backend nccl: GPUs of this host to use (default: every visible one); "
                                    "each worker gets the one fewest live workers use"},
      {"share-gpus", NEWT_OPT_FLAG, &lo.share_gpus,
       "with --backend nccl: workers may share a GPU, each a host of its own to the coordinator and NCCL "
       "(sockets, no P2P or shared memory): for tests and for trying newt on one GPU; slow (docs/elastic.md)"},
      {"etcd", NEWT_OPT_STR, &ef.endpoints, "etcd endpoints to use (default: start a private etcd)"},
      {"etcd-user", NEWT_OPT_STR, &ef.user, "with --etcd: its user"},
      {"etcd-password-file", NEWT_OPT_STR, &ef.password_file, "with --etcd: a file holding the user's password"},
      {"etcd-ca", NEWT_OPT_STR, &ef.ca, "with --etcd https://...: the CA bundle that signs etcd's certificate"},
      {"etcd-cert", NEWT_OPT_STR, &ef.cert, "with --etcd https://...: a client certificate (mTLS; no Common Name when etcd also has users)"},
      {"etcd-key", NEWT_OPT_STR, &ef.key, "with --etcd-cert: its key"},
      {"etcd-members", NEWT_OPT_INT, &members, "members of the private etcd (1..5; chaos kill|stop:etcd:I acts on one)"},
      {"job", NEWT_OPT_STR, &job_name, "job name"},
      {"spec", NEWT_OPT_STR, &spec_file, "job spec file (the flags of the spec's fields go in it, not beside it)"},
      {"coordinators", NEWT_OPT_INT, &coords, "coordinator processes (one leads)"},
      {"threads", NEWT_OPT_INT, &threads, "compute threads per worker"},
      {"lease-ttl-ms", NEWT_OPT_INT, &lease, "worker and coordinator lease TTL"},
      {"comm-timeout-ms", NEWT_OPT_INT, &comm_to, "a collective without progress this long fails"},
      {"hang-timeout-ms", NEWT_OPT_INT, &hang, "no step progress this long is a hang"},
      {"first-step-timeout-ms", NEWT_OPT_INT, &first_step,
       "until the job's first step completed (start-up: the model, the data, CUDA), the hang deadline"},
      {"max-failures", NEWT_OPT_INT, &max_failures, "the failure budget: more crash or hang recoveries than this in the window fail the job (0: none)"},
      {"failure-window-ms", NEWT_OPT_INT, &failure_window, "the failure budget's window"},
      {"progress-timeout-ms", NEWT_OPT_INT, &progress_timeout, "once the job has a plan, no step completed this long fails the job, naming what it waited for (0: wait for ever)"},
      {"replicas", NEWT_OPT_INT, &replicas,
       "k: each data-parallel rank keeps copies of its k predecessors' ZeRO shards, in other failure domains, so any "
       "k domains lost at once recover from memory (1..8; spec.fault.replicas)"},
      {"on-state-loss", NEWT_OPT_STR, &on_state_loss,
       "when no step is whole in the ranks' memory: checkpoint (back to the newest checkpoint; without one the job "
       "fails), fail, or restart (the newest checkpoint, else the initial state); spec.fault.on_state_loss"},
      {"verify-every", NEWT_OPT_INT, &verify_every,
       "fingerprint the replicated state and compare it across data-parallel replicas every N steps (0: never)"},
      {"on-mismatch", NEWT_OPT_STR, &on_mismatch,
       "when replicas disagree: rollback (to the newest step they agreed at), warn, or fail; spec.fault.on_mismatch"},
      {"hosts", NEWT_OPT_INT, &hosts,
       "simulate N hosts: the workers in contiguous blocks (w0..w(nproc/N-1) on host0, ...; a joiner on the host with "
       "fewest), each with --host hostI --domain hostI (its own shared memory and failure domain); chaos "
       "kill:host:I kills all of host I's at once (0: none)"},
      {"netns", NEWT_OPT_FLAG, &lo.netns,
       "each simulated host (each worker, without --hosts) in a network namespace of its own on a bridge (root): the "
       "workers talk TCP between their own addresses, and chaos cut:worker|rank|host:I[:MS|:until=S] (from the "
       "others) cut-etcd:... (from etcd and the coordinators) partition them for real, and slow:...:KBIT slows a link"},
      {"no-metrics", NEWT_OPT_FLAG, &lo.no_metrics, "coordinators serve no metrics (default: each on a free port, printed)"},
      {"chaos", NEWT_OPT_STR, &chaos, "faults at steps: kill:worker:1@step=15,join:2@step=50,..."},
      {"summary", NEWT_OPT_STR, &lo.summary, "write the run's summary JSON here"},
      {"log-dir", NEWT_OPT_STR, &lo.log_dir, "per-process logs and the run's files (default: a new directory under /tmp); "
       "yours, written by nobody else"},
      {"job-secret-file", NEWT_OPT_STR, &lo.secret_file,
       "the job secret (yours, mode 0600; default: the checkpoint directory's own job.secret, made when missing, "
       "else a new one): the data plane's keys, the proof of the records and checkpoints of the job"},
      {"step-log", NEWT_OPT_STR, &lo.step_log, "the step log, one JSON line per step (default: steps.jsonl in the log directory)"},
      {"timeout-ms", NEWT_OPT_INT, &timeout, "give up when not done by then (0: never)"},
      {"quiet", NEWT_OPT_FLAG, &quiet, "no live line"},
      NEWT_OPT_END};
  int command = -1;
  int rc = newt_opts_exit(newt_opts_parse_command("run", RUN_SYNOPSIS, run_epilogue, opts, argc, argv, &command));
  if (rc >= 0) return rc;
  if (command >= argc) {
    fprintf(stderr, "newt run: -- must be followed by the program the workers run: newt run " RUN_SYNOPSIS "\n");
    return 2;
  }
  if (command >= 0) lo.command = argv + command; /* NULL-terminated, as main's argv is */
  if (spec_file && spec_flags_given(argc, command, argv)) return 2;
  if (spec_file) {
    char *text = NULL;
    size_t len = 0;
    if (newt_fs_read_all(spec_file, 1 << 20, &text, &len) != NEWT_OK ||
        spec_from_json(text, len, &lo.spec) != NEWT_OK) {
      fprintf(stderr, "newt run: %s: %s\n", spec_file, newt_errmsg());
      free(text);
      return 2;
    }
    free(text);
  } else {
    newt_spec *s = &lo.spec;
    spec_defaults(s, job_name);
    if (strlen(job_name) >= sizeof s->job || strlen(preset) >= sizeof s->preset ||
        (data && strlen(data) >= sizeof s->data_path) || (ckpt_dir && strlen(ckpt_dir) >= sizeof s->ckpt_dir)) {
      fprintf(stderr, "newt run: --job, --preset, --data or --ckpt-dir is too long\n");
      return 2;
    }
    snprintf(s->preset, sizeof s->preset, "%s", preset);
    if (data) snprintf(s->data_path, sizeof s->data_path, "%s", data);
    if (ckpt_dir) snprintf(s->ckpt_dir, sizeof s->ckpt_dir, "%s", ckpt_dir);
    if (spec_set_model(s, model) != NEWT_OK) {
      fprintf(stderr, "newt run: --model: %s\n", newt_errmsg());
      return 2;
    }
    s->seq_len = seq;
    s->steps = steps;
    s->global_batch = gb;
    s->micro_batch = mb;
    s->lr = lr;
    s->lr_min = lr / 10;
    if (seed < 0 || data_seed < 0) {
      fprintf(stderr, "newt run: --%s: must not be negative, got %lld\n", seed < 0 ? "seed" : "data-seed",
              (long long)(seed < 0 ? seed : data_seed));
      return 2;
    }
    s->seed = (uint64_t)seed;
    s->data_seed = (uint64_t)data_seed;
    s->ckpt_every = every;
    s->ckpt_keep = keep;
    s->tp = tp;
    s->pp = pp;
    s->zero = zero;
    s->dp_min = dp_min;
    s->dp_max = dp_max;
    s->even_batches = even_batches;
    s->join_window_ms = join_window;
    s->lease_ttl_ms = lease;
    s->comm_timeout_ms = comm_to;
    s->hang_timeout_ms = hang;
    s->first_step_timeout_ms = first_step;
    s->max_failures = max_failures;
    s->failure_window_ms = failure_window;
    s->progress_timeout_ms = progress_timeout;
    s->replicas = replicas;
    s->verify_every = verify_every;
    s->on_state_loss = spec_state_loss_parse(on_state_loss);
    s->on_mismatch = spec_mismatch_parse(on_mismatch);
    if (s->on_state_loss < 0 || s->on_mismatch < 0) {
      fprintf(stderr, "newt run: %s: expected %s, got \"%s\"\n", s->on_state_loss < 0 ? "--on-state-loss" : "--on-mismatch",
              s->on_state_loss < 0 ? "checkpoint, fail or restart" : "rollback, warn or fail",
              s->on_state_loss < 0 ? on_state_loss : on_mismatch);
      return 2;
    }
    if (strlen(backend) >= sizeof s->backend) {
      fprintf(stderr, "newt run: --backend: cpu or nccl, got \"%s\"\n", backend);
      return 2;
    }
    snprintf(s->backend, sizeof s->backend, "%s", backend);
    if (spec_validate(s) != NEWT_OK) {
      fprintf(stderr, "newt run: %s\n", newt_errmsg());
      return 2;
    }
  }
  if (nproc < 1 || nproc > 1024 || coords < 1 || coords > 16 || threads < 0) {
    fprintf(stderr, "newt run: --nproc must be 1..1024, --coordinators 1..16, --threads >= 0\n");
    return 2;
  }
  if (members < 1 || members > 5 || (members > 1 && ef.endpoints)) {
    fprintf(stderr, "newt run: --etcd-members: 1..5, for the private etcd (not with --etcd)\n");
    return 2;
  }
  if (chaos_parse(chaos, &lo.chaos) != NEWT_OK) {
    fprintf(stderr, "newt run: %s\n", newt_errmsg());
    return 2;
  }
  if (hosts < 0 || hosts > nproc || hosts > 1024) {
    fprintf(stderr, "newt run: --hosts %lld: 0 (none) to --nproc %lld simulated hosts\n", (long long)hosts,
            (long long)nproc);
    return 2;
  }
  lo.hosts = (int)hosts;
  if (launcher_check_hosts(&lo) != NEWT_OK) { /* the hosts the chaos names */
    fprintf(stderr, "newt run: %s\n", newt_errmsg());
    return 2;
  }
  if (newt_backend_uses_gpu(newt_backend_find(lo.spec.backend))) {
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
    lo.gpus = (int)gpus;
  } else if (gpus > 0 || lo.share_gpus) {
    fprintf(stderr, "newt run: %s goes with --backend nccl\n", gpus > 0 ? "--gpus" : "--share-gpus");
    return 2;
  }
  lo.nproc = (int)nproc;
  lo.coordinators = (int)coords;
  lo.etcd_members = (int)members;
  if (ef.endpoints) {
    ef.job = lo.spec.job;
    if (cli_etcd_opts(&ef, &lo.etcd_client, &password) != NEWT_OK) {
      fprintf(stderr, "newt run: %s\n", newt_errmsg());
      return 2;
    }
    lo.etcd = ef.endpoints;
    lo.etcd_password_file = ef.password_file;
  } else if (ef.user || ef.password_file || ef.ca || ef.cert || ef.key) {
    fprintf(stderr, "newt run: --etcd-user, --etcd-password-file, --etcd-ca, --etcd-cert and --etcd-key go with --etcd\n");
    return 2;
  }
  if (launcher_check_opts(&lo) != NEWT_OK) { /* options that cannot go together */
    fprintf(stderr, "newt run: %s\n", newt_errmsg());
    return 2;
  }
  lo.threads = (int)threads;
  lo.quiet = quiet;
  lo.timeout_ms = timeout;
  if (before_start(&lo) != 0) return 2;
  launcher_result res;
  newt_result_t r = launcher_run(&lo, &res);
  if (r != NEWT_OK) fprintf(stderr, "%s\n", newt_errmsg());
  /* the step a run on the checkpoint directory resumes from, now that no process writes it */
  int64_t newest = lo.spec.ckpt_dir[0] ? ckpt_latest_pointer(lo.spec.ckpt_dir) : -1;
  res.newest_ckpt = newest > 0 ? newest : 0;
  if (res.done) {
    char repeated[64] = "", skipped[64] = ""; /* said where there are some */
    if (res.samples_repeated > 0)
      snprintf(repeated, sizeof repeated, " (%lld trained twice)", (long long)res.samples_repeated);
    if (res.ckpts_skipped > 0)
      snprintf(skipped, sizeof skipped, ", %lld checkpoint%s skipped", (long long)res.ckpts_skipped,
               res.ckpts_skipped == 1 ? "" : "s");
    printf("newt run: done: %lld steps, final loss %.4f, %lld generations, %d recoveries, %lld samples%s%s, %.1f s\n",
           (long long)res.steps, res.final_loss, (long long)res.generations, res.nrecoveries,
           (long long)res.samples_consumed, repeated, skipped, res.wall_s);
  }
  /* the summary: in the log directory for `newt report`, and where --summary says */
  char in_dir[600];
  snprintf(in_dir, sizeof in_dir, "%s/summary.json", res.log_dir);
  const char *paths[] = {res.log_dir[0] ? in_dir : NULL, lo.summary};
  char *json = launcher_summary_json(&lo, &res);
  for (size_t i = 0; i < 2; i++) {
    if (!paths[i]) continue;
    if (!json || newt_fs_write_atomic(paths[i], json, strlen(json)) != NEWT_OK) {
      fprintf(stderr, "newt run: writing the summary %s: %s\n", paths[i], json ? newt_errmsg() : "out of memory");
      r = r == NEWT_OK ? NEWT_ERR_SYS : r;
    }
  }
  free(json);
  /* a run cut short, or one that made no step (its workers could not start), has no report to
     offer: its files are kept, and the line above says where */
  int interrupted = strcmp(res.outcome, "interrupted") == 0, by_term = strstr(res.reason, "SIGTERM") != NULL;
  if (res.log_dir[0] && !quiet && !interrupted && (res.done || res.steps > 0))
    printf("newt run: the run's report: newt report %s\n", res.log_dir);
  if (interrupted && lo.spec.ckpt_dir[0]) { /* what a run on the directory takes up, as it is on disk */
    if (res.newest_ckpt > 0)
      printf("newt run: the newest checkpoint in %s is step %lld: newt run with --ckpt-dir %s resumes from it (on "
             "any number of workers)\n", lo.spec.ckpt_dir, (long long)res.newest_ckpt, lo.spec.ckpt_dir);
    else
      printf("newt run: %s holds no checkpoint: a run on it starts from step 0\n", lo.spec.ckpt_dir);
  }
  launcher_result_free(&res);
  chaos_free(&lo.chaos);
  if (password) memset(password, 0, strlen(password));
  free(password);
  /* 128 + the signal, as a shell reports a command a signal ended: 130 for Ctrl-C, 143 for
     SIGTERM */
  if (interrupted) return by_term ? 143 : 130;
  if (strcmp(res.outcome, "failed") == 0) return JOB_EXIT_FAILED; /* as every process of the job */
  return r == NEWT_OK && res.done ? 0 : 1;
}
