/* newt bench recovery: runs a job on this host (private etcd, coordinators, N workers),
 * kills one worker with SIGKILL mid-run, and prints how long the job took from the kill to
 * its next completed step, split into detection, planning, communicator and restore, and
 * how many steps were lost. One JSON line per run, then one with the medians.
 *
 * --fault join starts one more worker at --kill-at (the recovery is the join: from the
 * joiner's registration to the first step of the generation that takes it in); --fault
 * kill-during-etcd-outage takes etcd away at --kill-at for --outage-ms (default 4000) and
 * kills a worker two steps later, while etcd is still away: the survivors go on without it
 * (worker/peers.c), and resumed_ms says when the new layout completed its first step (the
 * step log), while total_ms runs to the first step of the leader's plan, after etcd is back.
 * Every line has resumed_ms (-1 where the step log shows no new layout).
 *
 * --fault etcd-outage takes etcd away instead (--outage-ms, as restart:etcd:MS) and prints
 * what training did meanwhile: the tokens/s during the outage against those before it
 * (goal: at least 0.9) and the longest pause of the steps beyond their usual time (goal: 0),
 * from the run's step log.
 *
 * --fault kill-host kills a whole simulated host at --kill-at (newt run --hosts: --hosts H,
 * default 2, the workers in contiguous blocks; chaos kill:host:I, every worker of host I at
 * once, never host 0), with --replicas k copies of each ZeRO shard (spec.fault.replicas):
 * whether the state came back from memory is the line's "restore".
 *
 * Every line of a kill, term or stop also says the ranks that trained after the recovery
 * (world_after) and the medians of the step log's tokens/s before the fault and after the
 * recovery: `--even-batches` against its absence shows what training every survivor is worth
 * (--nproc 3 --global-batch 12 --micro-batch 4: two survivors train as two ranks, or as one
 * and a spare).
 *
 * --backend nccl runs the workers on this host's GPUs over NCCL (as newt run --backend nccl,
 * with --gpus and --share-gpus); every line says its backend.
 *
 * `-- COMMAND [ARGS...]` runs a program of one's own as the workers (as newt run -- COMMAND:
 * a program built on libnewt, docs/api.md) instead of newt's own trainer; every line names
 * the program ("program": its file name, or "newt"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "common/fs.h"
#include "common/opts.h"
#include "common/strutil.h"
#include "gpt/gpt.h"
#include "job/plan.h"
#include "job/runlog.h"
#include "job/spec_flags.h"
#include "launch/launcher.h"
#include "model/dev.h"

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* The medians of the step log's tokens/s in the generations before gen and in gen and
 * after (0 when none). */
static void step_rates(const char *path, int64_t gen, double *before, double *after) {
  job_step *s = NULL;
  size_t n = 0;
  *before = *after = 0;
  if (job_steplog_read(path, &s, &n, NULL) != NEWT_OK || job_steplog_stitch(s, &n, NULL) != NEWT_OK) return;
  double *b = calloc(n + 1, sizeof *b), *a = calloc(n + 1, sizeof *a);
  size_t nb = 0, na = 0;
  for (size_t i = 0; b && a && i < n; i++) {
    if (!(s[i].tokens_per_s > 0)) continue;
    if ((int64_t)s[i].generation < gen) b[nb++] = s[i].tokens_per_s;
    else a[na++] = s[i].tokens_per_s;
  }
  if (nb) *before = newt_median(b, nb);
  if (na) *after = newt_median(a, na);
  free(b);
  free(a);
  free(s);
}

static int64_t median(int64_t *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_i64);
  return n ? (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2) : -1;
}

/* What the workers run, for the JSON lines: the program's file name (a character JSON would
 * have to escape becomes '_'), or "newt". */
/* The line's "preset": the model preset newt's own trainer used, quoted; null for a program
 * of one's own, which used none. */
static const char *preset_json(const launcher_opts *o, const char *preset) {
  static char q[80];
  if (o->command) return "null";
  snprintf(q, sizeof q, "\"%.64s\"", preset);
  return q;
}

static const char *program_name(const launcher_opts *o) {
  static char name[64];
  if (!o->command) return "newt";
  const char *slash = strrchr(o->command[0], '/'), *base = slash ? slash + 1 : o->command[0];
  size_t i = 0;
  for (; base[i] && i + 1 < sizeof name; i++)
    name[i] = base[i] == '"' || base[i] == '\\' || (unsigned char)base[i] < 0x20 ? '_' : base[i];
  name[i] = '\0';
  return name;
}

/* The spec of one run's job: the flags' (base) named job; 2 (and a message) when the flags
 * make no valid job: checked as newt run checks one before it starts (gpt_start_check; the
 * trainer's model unless the workers run a program). */
static int job_spec(newt_spec *s, const newt_spec *base, const char *job, int program) {
  *s = *base;
  snprintf(s->job, sizeof s->job, "%s", job);
  unsigned what = GPT_CHECK_SPEC | GPT_CHECK_FILES | (program ? 0 : GPT_CHECK_TRAINER);
  if (gpt_start_check(s, what) != NEWT_OK) {
    fprintf(stderr, "newt bench recovery: %s\n", newt_errmsg());
    return 2;
  }
  return 0;
}

/* newt bench recovery's flags beside the spec's (those are a spec_flags), and the fault's kind */
typedef struct recovery_flags {
  int64_t nproc, runs, kill_at, threads, outage, hosts, gpus;
  const char *fault;
  int verbose, share_gpus;
  int etcd, join, in_outage, host; /* --fault etcd-outage, join, kill-during-etcd-outage, kill-host */
} recovery_flags;

/* --keep-logs: the log directories of runs that succeeded are kept too (a failed run's always
 * are, and named) */
static int keep_logs;

/* The end of a run that succeeded: its log directory goes unless asked for. */
static void run_done(launcher_result *res) {
  if (!keep_logs && newt_fs_rm_rf(res->log_dir) != NEWT_OK)
    fprintf(stderr, "newt bench recovery: removing %s: %s\n", res->log_dir, newt_errmsg());
  launcher_result_free(res);
}

/* Runs one job per run with etcd away for outage_ms from step at (steps: enough to train
 * through it); one JSON line per run, then the medians. */
static int bench_etcd_outage(const launcher_opts *base, const recovery_flags *f) {
  const char *backend = base->spec.backend, *preset = base->spec.preset;
  int64_t nproc = f->nproc, at = f->kill_at, outage = f->outage, runs = f->runs;
  newt_spec spec = base->spec; /* one layout, whatever the flags: tp 1, pp 1, ZeRO 0 */
  spec.tp = spec.pp = 1;
  spec.zero = 0;
  spec.even_batches = 0;
  spec.replicas = 1;
  if (outage < 100 || outage > 600000) {
    fprintf(stderr, "newt bench recovery: --outage-ms 100..600000\n");
    return 2;
  }
  double *ratio = calloc((size_t)runs, sizeof *ratio), *pause = calloc((size_t)runs, sizeof *pause);
  int ok = 0;
  for (int64_t run = 0; ratio && pause && run < runs; run++) {
    launcher_opts lo = *base;
    char job[64], chaos[64];
    snprintf(job, sizeof job, "bench-etcd-%d-%lld", (int)getpid(), (long long)run);
    if (job_spec(&lo.spec, &spec, job, lo.command != NULL)) return 2;
    snprintf(chaos, sizeof chaos, "restart:etcd:%lld@step=%lld", (long long)outage, (long long)at);
    if (chaos_parse(chaos, &lo.chaos) != NEWT_OK) return 2;
    lo.nproc = (int)nproc;
    lo.coordinators = 2;
    lo.threads = (int)f->threads;
    lo.quiet = !f->verbose;
    lo.timeout_ms = 600000 + outage;
    launcher_result res;
    newt_result_t r = launcher_run(&lo, &res);
    chaos_free(&lo.chaos);
    const launcher_recovery *rec = NULL;
    for (int k = 0; k < res.nrecoveries && !rec; k++)
      if (strcmp(res.recoveries[k].cause, "etcd") == 0) rec = &res.recoveries[k];
    if (r != NEWT_OK || !res.done || !rec || rec->tps_before <= 0) {
      fprintf(stderr, "newt bench recovery: run %lld: %s (logs in %s)\n", (long long)run,
              r != NEWT_OK ? newt_errmsg() : !rec ? "no outage was recorded" : "no step log around the outage",
              res.log_dir);
      launcher_result_free(&res);
      continue;
    }
    ratio[ok] = rec->tps_during / rec->tps_before;
    pause[ok] = (double)rec->pause_ms;
    printf("{\"bench\":\"recovery\",\"fault\":\"etcd-outage\",\"backend\":\"%s\",\"program\":\"%s\",\"run\":%lld,"
           "\"nproc\":%lld,\"preset\":%s,\"outage_ms\":%lld,\"tokens_per_s_before\":%.0f,\"tokens_per_s_during\":%.0f,\"ratio\":%.3f,"
           "\"pause_ms\":%lld,\"steps_lost\":%lld,\"generations\":%lld}\n",
           backend, program_name(base), (long long)run, (long long)nproc, preset_json(base, preset), (long long)rec->outage_ms, rec->tps_before, rec->tps_during,
           ratio[ok], (long long)rec->pause_ms, (long long)rec->steps_lost, (long long)res.generations);
    fflush(stdout);
    ok++;
    run_done(&res);
  }
  if (ok)
    printf("{\"bench\":\"recovery\",\"fault\":\"etcd-outage\",\"backend\":\"%s\",\"program\":\"%s\",\"median_of\":%d,"
           "\"nproc\":%lld,\"preset\":%s,\"outage_ms\":%lld,\"ratio\":%.3f,\"pause_ms\":%.0f}\n",
           backend, program_name(base), ok, (long long)nproc, preset_json(base, preset), (long long)outage, newt_median(ratio, (size_t)ok), newt_median(pause, (size_t)ok));
  free(ratio);
  free(pause);
  return ok == runs ? 0 : 1;
}

/* The flags, in --help's order, parsed into f and sf; -1 to go on, else the exit status
 * (--help: 0, a bad flag: 2). *command: the index of the program after `--` (-1: none). */
static int parse_flags(int argc, char **argv, recovery_flags *f, spec_flags *sf, int *command) {
  *f = (recovery_flags){.nproc = 4, .runs = 5, .kill_at = 30, .threads = 1, .outage = -1, .gpus = -1,
                        .fault = "kill"};
  newt_spec d;
  spec_defaults(&d, "bench-recovery");
  d.steps = 0; /* the fault's own */
  d.global_batch = 16;
  newt_opt opts[] = {{"nproc", NEWT_OPT_INT, &f->nproc, "workers"},
                     SPEC_OPT_HELP("preset", "model preset"),
                     SPEC_OPT("model"),
                     SPEC_OPT_HELP("steps", "steps of each run (0: 60; with etcd-outage, 1500)"),
                     SPEC_OPT_HELP("global-batch", "samples per step"),
                     SPEC_OPT_HELP("micro-batch", "samples per forward/backward"),
                     {"kill-at", NEWT_OPT_INT, &f->kill_at, "step at which the fault is injected"},
                     {"fault", NEWT_OPT_STR, &f->fault,
                      "kill (SIGKILL, a crash), term (SIGTERM, a preemption), stop (SIGSTOP, a hang), join (one more "
                      "worker), kill-host (every worker of a simulated host at once), kill-during-etcd-outage, or "
                      "etcd-outage"},
                     {"hosts", NEWT_OPT_INT, &f->hosts,
                      "simulated hosts, the workers in contiguous blocks (as newt run --hosts; with --fault kill-host "
                      "default 2)"},
                     SPEC_OPT_HELP("replicas", "copies of each ZeRO shard, in other hosts (spec.fault.replicas)"),
                     {"outage-ms", NEWT_OPT_INT, &f->outage,
                      "with --fault etcd-outage (default 10000) or kill-during-etcd-outage (4000): how long etcd is away"},
                     {"runs", NEWT_OPT_INT, &f->runs, "jobs to run (one kill each)"},
                     {"threads", NEWT_OPT_INT, &f->threads, "compute threads per worker"},
                     SPEC_OPT("tp"),
                     SPEC_OPT("pp"),
                     SPEC_OPT_HELP("zero", "ZeRO stage"),
                     SPEC_OPT_HELP("even-batches",
                                   "only data-parallel sizes that give every rank the same whole micro-batches "
                                   "(survivors beyond wait as spares: spec.parallel.even_batches)"),
                     SPEC_OPT_HELP("backend", "cpu, or nccl: the workers train on GPUs over NCCL (as newt run)"),
                     {"gpus", NEWT_OPT_INT, &f->gpus, "with --backend nccl: GPUs of this host to use (default: every visible one)"},
                     {"share-gpus", NEWT_OPT_FLAG, &f->share_gpus,
                      "with --backend nccl: workers may share a GPU (as newt run --share-gpus: tests, one GPU; slow)"},
                     {"verbose", NEWT_OPT_FLAG, &f->verbose, "show each run's progress"},
                     {"keep-logs", NEWT_OPT_FLAG, &keep_logs,
                      "keep the log directories of runs that succeeded (a failed run's are kept and named)"},
                     NEWT_OPT_END};
  if (spec_flags_bind(sf, opts, &d) != NEWT_OK) return newt_opts_exit(NEWT_ERR_INVALID);
  return newt_opts_exit(newt_opts_parse_command("bench recovery", "[flags] [-- COMMAND [ARGS...]]",
                                                "COMMAND: a program built on libnewt, run as every worker (as newt "
                                                "run -- COMMAND) instead of newt's own trainer\n",
                                                opts, argc, argv, command));
}

/* The backend's GPUs (--gpus, --share-gpus) into base. 0, or 2 with the reason said. */
static int check_backend(const recovery_flags *f, launcher_opts *base) {
  const char *backend = base->spec.backend;
  int64_t gpus = f->gpus;
  if (newt_backend_uses_gpu(newt_backend_find(backend))) {
    int visible = model_dev_cuda_count();
    if (gpus < 0) gpus = visible;
    if (visible == 0) {
      fprintf(stderr, "newt bench recovery: --backend nccl: this host has no GPU this process can use (no CUDA "
                      "driver or GPU, CUDA_VISIBLE_DEVICES, or a newt built without CUDA)\n");
      return 2;
    }
    if (gpus < 1 || gpus > visible) {
      fprintf(stderr, "newt bench recovery: --gpus %lld: this host has %d GPU%s visible\n", (long long)gpus, visible,
              visible == 1 ? "" : "s");
      return 2;
    }
    base->gpus = (int)gpus;
    base->share_gpus = f->share_gpus;
  } else if (strcmp(backend, "cpu") != 0) {
    fprintf(stderr, "newt bench recovery: --backend: cpu or nccl, not \"%s\"\n", backend);
    return 2;
  } else if (gpus > 0 || f->share_gpus) {
    fprintf(stderr, "newt bench recovery: %s goes with --backend nccl\n", gpus > 0 ? "--gpus" : "--share-gpus");
    return 2;
  }
  return 0;
}

/* The fault's kind, and the defaults that follow from it (--hosts, --outage-ms, --steps). 0,
 * or 2 with the reason said. */
static int check_fault(recovery_flags *f, newt_spec *s) {
  const char *fault = f->fault;
  f->etcd = strcmp(fault, "etcd-outage") == 0;
  f->join = strcmp(fault, "join") == 0;
  f->in_outage = strcmp(fault, "kill-during-etcd-outage") == 0;
  f->host = strcmp(fault, "kill-host") == 0;
  if (f->host && f->hosts == 0) f->hosts = 2;
  if (f->outage < 0) f->outage = f->in_outage ? 4000 : 10000;
  /* an outage of seconds needs a job that trains through it, a join one that outlasts a
     process start */
  if (s->steps == 0) s->steps = f->etcd ? 1500 : f->in_outage ? 200 : f->join ? 400 : 60;
  if (strcmp(fault, "kill") != 0 && strcmp(fault, "term") != 0 && strcmp(fault, "stop") != 0 && !f->etcd &&
      !f->join && !f->in_outage && !f->host) {
    fprintf(stderr, "newt bench recovery: --fault: kill, term, stop, join, kill-host, kill-during-etcd-outage or "
                    "etcd-outage, not \"%s\"\n", fault);
    return 2;
  }
  if (f->hosts < 0 || f->hosts > f->nproc || (f->host && f->hosts < 2) || s->replicas < 1 ||
      s->replicas > SPEC_REPLICAS_MAX) {
    fprintf(stderr, "newt bench recovery: --hosts 0..--nproc (at least 2 with --fault kill-host), --replicas 1..%d\n",
            SPEC_REPLICAS_MAX);
    return 2;
  }
  return 0;
}

/* The chaos of run `run`: the fault at --kill-at, on a victim that is not rank 0's usual
 * worker (w0, on host 0), so progress keeps flowing. */
static void fault_chaos(const recovery_flags *f, int64_t run, char *chaos, size_t cap) {
  long long victim = 1 + run % (f->nproc - 1), at = (long long)f->kill_at;
  if (f->join)
    snprintf(chaos, cap, "join:1@step=%lld", at);
  else if (f->host)
    snprintf(chaos, cap, "kill:host:%lld@step=%lld", (long long)(1 + run % (f->hosts - 1)), at);
  else if (f->in_outage)
    snprintf(chaos, cap, "restart:etcd:%lld@step=%lld,kill:worker:%lld@step=%lld", (long long)f->outage, at, victim,
             at + 2);
  else
    snprintf(chaos, cap, "%s:worker:%lld@step=%lld", f->fault, victim, at);
}

/* Every worker a rank: a fault on a spare would recover nothing. 0, or 2 with the reason said. */
static int check_all_ranks(const recovery_flags *f, const newt_spec *s) {
  int64_t tp = s->tp, pp = s->pp;
  int dp = plan_choose_dp(s, f->nproc / (tp * pp));
  if (dp * tp * pp == f->nproc) return 0;
  fprintf(stderr, "newt bench recovery: --nproc %lld: a layout of tp %lld x pp %lld takes %lld of them (global batch "
                  "%lld in micro-batches of %lld), the rest would be spares; use --nproc %lld\n",
          (long long)f->nproc, (long long)tp, (long long)pp, (long long)(dp * tp * pp), (long long)s->global_batch,
          (long long)s->micro_batch, (long long)(dp ? dp * tp * pp : tp * pp));
  return 2;
}

/* The recoveries' numbers, a column per measure, a row per run that succeeded */
typedef struct recovery_table {
  int64_t *v[8]; /* detect, plan, comm, restore, total, steps lost, step, resumed (ms) */
  double *tps_after;
  int ok;
} recovery_table;

/* The JSON line of a recovery, and its row of t. */
static void say_recovery(const launcher_opts *base, const recovery_flags *f, int64_t run,
                         const launcher_recovery *rec, const launcher_result *res, recovery_table *t) {
  const newt_spec *s = &base->spec;
  double before, after;
  step_rates(res->step_log, rec->generation, &before, &after);
  printf("{\"bench\":\"recovery\",\"fault\":\"%s\",\"backend\":\"%s\",\"program\":\"%s\",\"run\":%lld,\"nproc\":%lld,"
         "\"preset\":%s,\"tp\":%lld,\"pp\":%lld,"
         "\"zero\":%lld,\"hosts\":%lld,\"replicas\":%lld,\"even_batches\":%s,\"cause\":\"%s\",\"detect_ms\":%lld,\"plan_ms\":%lld,\"comm_ms\":%lld,"
         "\"restore_ms\":%lld,\"step_ms\":%lld,\"total_ms\":%lld,\"steps_lost\":%lld,\"restore\":\"%s\",\"world_after\":%lld,"
         "\"resumed_ms\":%lld,\"tokens_per_s_before\":%.0f,\"tokens_per_s_after\":%.0f}\n",
         f->fault, s->backend, program_name(base), (long long)run, (long long)f->nproc, preset_json(base, s->preset),
         (long long)s->tp, (long long)s->pp, (long long)s->zero, (long long)f->hosts, (long long)s->replicas,
         s->even_batches ? "true" : "false", rec->cause, (long long)rec->detect_ms, (long long)rec->plan_ms,
         (long long)rec->comm_ms, (long long)rec->restore_ms, (long long)rec->step_ms, (long long)rec->total_ms,
         (long long)rec->steps_lost,
         rec->restore, (long long)rec->world, (long long)rec->resumed_ms, before, after);
  fflush(stdout);
  int64_t v[8] = {rec->detect_ms, rec->plan_ms, rec->comm_ms, rec->restore_ms, rec->total_ms, rec->steps_lost,
                  rec->step_ms, rec->resumed_ms};
  for (int k = 0; k < 8; k++) t->v[k][t->ok] = v[k];
  t->tps_after[t->ok] = after;
  t->ok++;
}

/* The line of the medians. */
static void say_medians(const launcher_opts *base, const recovery_flags *f, recovery_table *t) {
  const newt_spec *s = &base->spec;
  int ok = t->ok;
  printf("{\"bench\":\"recovery\",\"fault\":\"%s\",\"backend\":\"%s\",\"program\":\"%s\",\"median_of\":%d,"
         "\"nproc\":%lld,\"preset\":%s,\"tp\":%lld,\"pp\":%lld,"
         "\"zero\":%lld,\"hosts\":%lld,\"replicas\":%lld,\"even_batches\":%s,\"detect_ms\":%lld,\"plan_ms\":%lld,\"comm_ms\":%lld,\"restore_ms\":%lld,"
         "\"step_ms\":%lld,\"total_ms\":%lld,\"steps_lost\":%lld,\"resumed_ms\":%lld,\"tokens_per_s_after\":%.0f}\n",
         f->fault, s->backend, program_name(base), ok, (long long)f->nproc, preset_json(base, s->preset),
         (long long)s->tp, (long long)s->pp, (long long)s->zero, (long long)f->hosts, (long long)s->replicas,
         s->even_batches ? "true" : "false", (long long)median(t->v[0], ok), (long long)median(t->v[1], ok),
         (long long)median(t->v[2], ok), (long long)median(t->v[3], ok), (long long)median(t->v[6], ok),
         (long long)median(t->v[4], ok), (long long)median(t->v[5], ok), (long long)median(t->v[7], ok),
         newt_median(t->tps_after, (size_t)ok));
}

/* One run: the job, its fault, its recovery said and kept in t. 0 (a failed run is said and
 * skipped), or 2 when the flags make no run. */
static int run_one(const launcher_opts *base, const recovery_flags *f, int64_t run, recovery_table *t) {
  launcher_opts lo = *base;
  char job[64], chaos[160];
  snprintf(job, sizeof job, "bench-recovery-%d-%lld", (int)getpid(), (long long)run);
  if (job_spec(&lo.spec, &base->spec, job, lo.command != NULL) || check_all_ranks(f, &lo.spec)) return 2;
  lo.hosts = (int)f->hosts;
  fault_chaos(f, run, chaos, sizeof chaos);
  if (chaos_parse(chaos, &lo.chaos) != NEWT_OK) return 2;
  lo.nproc = (int)f->nproc;
  lo.coordinators = 2;
  lo.threads = (int)f->threads;
  lo.quiet = !f->verbose;
  lo.timeout_ms = 600000 + (f->in_outage ? f->outage : 0);
  launcher_result res;
  newt_result_t r = launcher_run(&lo, &res);
  chaos_free(&lo.chaos);
  const launcher_recovery *rec = NULL; /* the fault's: the join, or the crash (not etcd's own) */
  for (int k = 0; k < res.nrecoveries && !rec; k++)
    if (f->join ? strcmp(res.recoveries[k].cause, "join") == 0 : strcmp(res.recoveries[k].cause, "etcd") != 0)
      rec = &res.recoveries[k];
  if (r != NEWT_OK || !res.done || !rec) {
    fprintf(stderr, "newt bench recovery: run %lld: %s (logs in %s)\n", (long long)run,
            r != NEWT_OK ? newt_errmsg() : "no recovery was recorded", res.log_dir);
    launcher_result_free(&res);
    return 0;
  }
  say_recovery(base, f, run, rec, &res, t);
  run_done(&res);
  return 0;
}

int newt_bench_recovery(int argc, char **argv) {
  recovery_flags f;
  spec_flags sf;
  int command = -1;
  int rc = parse_flags(argc, argv, &f, &sf, &command);
  if (rc >= 0) return rc;
  if (command >= argc) {
    fprintf(stderr, "newt bench recovery: -- must be followed by the program the workers run\n");
    return 2;
  }
  launcher_opts base;
  memset(&base, 0, sizeof base);
  if (command >= 0) base.command = argv + command; /* NULL-terminated, as main's argv is */
  base.spec = sf.defaults;
  if (spec_flags_apply(&sf, &base.spec) != NEWT_OK) {
    fprintf(stderr, "newt bench recovery: %s\n", newt_errmsg());
    return 2;
  }
  if (check_backend(&f, &base) != 0 || check_fault(&f, &base.spec) != 0) return 2;
  if (f.etcd) return bench_etcd_outage(&base, &f);
  if (f.runs < 1 || f.runs > 100 || f.nproc < 2 || f.kill_at < 1 || f.kill_at >= base.spec.steps) {
    fprintf(stderr, "newt bench recovery: --runs 1..100, --nproc >= 2, 1 <= --kill-at < --steps\n");
    return 2;
  }
  recovery_table t = {.ok = 0};
  for (int k = 0; k < 8; k++) t.v[k] = calloc((size_t)f.runs, sizeof(int64_t));
  t.tps_after = calloc((size_t)f.runs, sizeof *t.tps_after);
  for (int64_t run = 0; run < f.runs; run++)
    if (run_one(&base, &f, run, &t) != 0) return 2;
  if (t.ok) say_medians(&base, &f, &t);
  int ok = t.ok;
  for (int k = 0; k < 8; k++) free(t.v[k]);
  free(t.tps_after);
  return ok == f.runs ? 0 : 1;
}
