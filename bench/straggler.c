/* newt bench straggler: what rebalancing is worth when one worker is slow (issue 41). Runs
 * jobs on this host (private etcd, coordinators, --nproc CPU workers), one worker slowed by
 * chaos slowcpu to run --percent of the time from --slow-at on:
 *
 *   uninterrupted  no slowdown: the final loss the others are held to
 *   equal          the slowdown, rebalancing off (spec.fault.straggler_window 0): equal shares
 *   rebalanced     the slowdown, rebalancing on: the shares follow the measured speeds
 *   recovering     the slowdown ending at --recover-at, rebalancing on: the share given back
 *
 * One JSON line per job: the tokens/s from the slowdown to the end (tokens over the wall time
 * of those steps, from the step log: what the rebalance's detection and switch cost counts),
 * the steady tokens/s of the last generation (the step log's median), the rebalances, the
 * time from the slowdown to the first step of the rebalanced plan (slow_to_plan_ms) and from
 * its end to the first step of the plan that gave the share back (back_ms), and the final
 * loss against the uninterrupted run's. Then one line with the speedup of rebalanced over
 * equal (goal: 1.5; ideal with one worker of four at half speed: 1.75).
 *
 * With --link KBIT, two jobs instead, each worker a simulated host in a network namespace of its
 * own (root; their data over TCP): without a fault, and with host 1's link slowed to KBIT kbit/s with a short queue (chaos
 * slow: bursts dropped, TCP retransmits) for --link-ms from --slow-at on: the steps each does in
 * that span and the plans the slow link caused (goal: at most 2, out and back). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "common/fs.h"
#include "common/opts.h"
#include "common/strutil.h"
#include "gpt/gpt.h"
#include "job/runlog.h"
#include "job/spec_flags.h"
#include "launch/launcher.h"

typedef struct straggler_flags {
  int64_t nproc, slow_at, percent, recover_at, threads, link_kbit, link_ms, link_steps;
  int verbose, keep_logs;
} straggler_flags;

typedef struct job_figures {
  int ok;
  double tps_after, tps_steady, loss;
  int64_t rebalances, slow_to_plan_ms, back_ms, generations;
  int64_t span_steps, span_ms; /* the link jobs: steps done in the span from --slow-at on, its length */
} job_figures;

/* The job's step log, stitched (a generation's steps done again once); NULL when it reads not,
 * or has fewer than two steps. */
static job_step *read_steps(const char *path, size_t *n) {
  job_step *s = NULL;
  *n = 0;
  if (job_steplog_read(path, &s, n, NULL) != NEWT_OK || job_steplog_stitch(s, n, NULL) != NEWT_OK || *n < 2) {
    free(s);
    return NULL;
  }
  return s;
}

/* The steps completed within span_ms of step `from`'s completion (the link's fault starts
 * there), and the span the step log covers (shorter when the job ended first). */
static void span_figures(const char *path, int64_t from, int64_t span_ms, job_figures *f) {
  size_t n;
  job_step *s = read_steps(path, &n);
  if (!s) return;
  size_t a = 0;
  while (a + 1 < n && s[a].step < from) a++;
  uint64_t t0 = s[a].t_ms, end = t0 + (uint64_t)span_ms;
  for (size_t i = a + 1; i < n && s[i].t_ms <= end; i++) f->span_steps++;
  f->span_ms = s[n - 1].t_ms < end ? (int64_t)(s[n - 1].t_ms - t0) : span_ms;
  free(s);
}

/* The tokens/s from step `from` to the end (tokens over wall time), and the median of the last
 * generation's steps. */
static void step_figures(const char *path, int64_t from, int64_t step_tokens, job_figures *f) {
  size_t n;
  job_step *s = read_steps(path, &n);
  if (!s) return;
  size_t a = 0;
  while (a + 1 < n && s[a].step < from) a++;
  if (s[n - 1].t_ms > s[a].t_ms)
    f->tps_after = (double)(s[n - 1].step - s[a].step) * (double)step_tokens / ((double)(s[n - 1].t_ms - s[a].t_ms) / 1e3);
  double *v = calloc(n, sizeof *v);
  size_t nv = 0;
  for (size_t i = 0; v && i < n; i++)
    if (s[i].generation == s[n - 1].generation && s[i].tokens_per_s > 0) v[nv++] = s[i].tokens_per_s;
  if (nv > 1) f->tps_steady = newt_median(v, nv - 1); /* the last step's rate may hold the end */
  free(v);
  free(s);
}

/* One job: the spec's, slowed as chaos says ("" none), rebalancing with window (0: off); netns:
 * each worker in a network namespace of its own (the link jobs: their steps are --link-steps). */
static job_figures run_job(const launcher_opts *base, const straggler_flags *f, const char *name, const char *chaos,
                           int64_t window, int netns) {
  job_figures fig = {.slow_to_plan_ms = -1, .back_ms = -1};
  launcher_opts lo = *base;
  snprintf(lo.spec.job, sizeof lo.spec.job, "bench-straggler-%d-%s", (int)getpid(), name);
  lo.spec.straggler_window = window;
  lo.netns = netns;
  if (netns) lo.spec.steps = f->link_steps, lo.hosts = (int)f->nproc; /* a host each: their data over TCP, not shared memory */
  if (gpt_start_check(&lo.spec, GPT_CHECK_SPEC | GPT_CHECK_FILES | GPT_CHECK_TRAINER) != NEWT_OK ||
      chaos_parse(chaos, &lo.chaos) != NEWT_OK) {
    fprintf(stderr, "newt bench straggler: %s\n", newt_errmsg());
    return fig;
  }
  lo.nproc = (int)f->nproc;
  lo.coordinators = 2;
  lo.threads = (int)f->threads;
  lo.quiet = !f->verbose;
  lo.timeout_ms = 1200000;
  launcher_result res;
  newt_result_t r = launcher_run(&lo, &res);
  chaos_free(&lo.chaos);
  if (r != NEWT_OK || !res.done) {
    fprintf(stderr, "newt bench straggler: %s: %s (logs in %s)\n", name, r != NEWT_OK ? newt_errmsg() : "not done",
            res.log_dir);
    launcher_result_free(&res);
    return fig;
  }
  fig.ok = 1;
  fig.loss = res.final_loss;
  fig.generations = res.generations;
  for (int k = 0; k < res.nrecoveries; k++) {
    const launcher_recovery *rec = &res.recoveries[k];
    if (strcmp(rec->cause, "rebalance") != 0) continue;
    fig.rebalances++;
    /* timed from the fault it answers: the slowdown, or its end */
    if (strstr(rec->fault, "ended") && fig.back_ms < 0) fig.back_ms = rec->total_ms;
    else if (rec->fault[0] && !strstr(rec->fault, "ended") && fig.slow_to_plan_ms < 0) fig.slow_to_plan_ms = rec->total_ms;
  }
  int64_t tokens = lo.spec.global_batch * (lo.spec.seq_len > 0 ? lo.spec.seq_len : 0);
  step_figures(res.step_log, f->slow_at, tokens > 0 ? tokens : lo.spec.global_batch, &fig);
  if (netns) span_figures(res.step_log, f->slow_at, f->link_ms, &fig);
  if (!f->keep_logs) newt_fs_rm_rf(res.log_dir);
  launcher_result_free(&res);
  return fig;
}

static void say(const char *name, const straggler_flags *f, const launcher_opts *base, const job_figures *j,
                double ref) {
  printf("{\"bench\":\"straggler\",\"run\":\"%s\",\"nproc\":%lld,\"preset\":\"%s\",\"percent\":%lld,\"slow_at\":%lld,"
         "\"recover_at\":%lld,\"steps\":%lld,\"tokens_per_s_after\":%.0f,\"tokens_per_s_steady\":%.0f,"
         "\"rebalances\":%lld,\"generations\":%lld,\"slow_to_plan_ms\":%lld,\"back_ms\":%lld,\"final_loss\":%.9f,"
         "\"loss_rel_diff\":%.3g}\n",
         name, (long long)f->nproc, base->spec.preset, (long long)f->percent, (long long)f->slow_at,
         strcmp(name, "recovering") == 0 ? (long long)f->recover_at : 0LL, (long long)base->spec.steps, j->tps_after,
         j->tps_steady, (long long)j->rebalances, (long long)j->generations, (long long)j->slow_to_plan_ms,
         (long long)j->back_ms, j->loss, isfinite(ref) && ref != 0 ? fabs(j->loss - ref) / fabs(ref) : NAN);
  fflush(stdout);
}

/* The link jobs (--link KBIT): the same span of --link-ms from --slow-at on without a fault and
 * with worker 1's link slowed to KBIT kbit/s (chaos slow: a short queue, bursts dropped), each
 * in network namespaces; a line each and one comparing them. */
static int link_jobs(const launcher_opts *base, const straggler_flags *f, int64_t window) {
  char slow[96];
  snprintf(slow, sizeof slow, "slow:host:1:%lld:%lld@step=%lld", (long long)f->link_kbit, (long long)f->link_ms,
           (long long)f->slow_at);
  job_figures none = run_job(base, f, "link_none", "", window, 1), bad = run_job(base, f, "link_slow", slow, window, 1);
  for (int k = 0; k < 2; k++) {
    const job_figures *j = k ? &bad : &none;
    printf("{\"bench\":\"straggler\",\"run\":\"%s\",\"nproc\":%lld,\"kbit\":%lld,\"link_ms\":%lld,\"slow_at\":%lld,"
           "\"steps\":%lld,\"span_steps\":%lld,\"span_ms\":%lld,\"generations\":%lld,\"final_loss\":%.9f}\n",
           k ? "link_slow" : "link_none", (long long)f->nproc, k ? (long long)f->link_kbit : 0LL, (long long)f->link_ms,
           (long long)f->slow_at, (long long)f->link_steps, (long long)j->span_steps, (long long)j->span_ms,
           (long long)j->generations, j->loss);
  }
  if (!none.ok || !bad.ok) return 0;
  printf("{\"bench\":\"straggler\",\"summary\":\"link\",\"kbit\":%lld,\"link_ms\":%lld,\"steps_in_span\":%lld,"
         "\"steps_in_span_without\":%lld,\"ratio\":%.3f,\"plans_caused\":%lld,\"loss_rel_diff\":%.3g}\n",
         (long long)f->link_kbit, (long long)f->link_ms, (long long)bad.span_steps, (long long)none.span_steps,
         none.span_steps > 0 ? (double)bad.span_steps / (double)none.span_steps : 0, (long long)(bad.generations - 1),
         fabs(bad.loss - none.loss) / fabs(none.loss));
  fflush(stdout);
  return 1;
}

int newt_bench_straggler(int argc, char **argv) {
  straggler_flags f = {.nproc = 4, .slow_at = 20, .percent = 50, .recover_at = 0, .threads = 1, .link_ms = 15000,
                       .link_steps = 600};
  spec_flags sf;
  newt_spec d;
  spec_defaults(&d, "bench-straggler");
  d.steps = 150;
  d.seq_len = 64;
  newt_opt opts[] = {{"nproc", NEWT_OPT_INT, &f.nproc, "workers"},
                     SPEC_OPT_HELP("preset", "model preset"),
                     SPEC_OPT("model"),
                     SPEC_OPT_HELP("steps", "steps of each job"),
                     SPEC_OPT_HELP("global-batch", "samples per step"),
                     SPEC_OPT_HELP("micro-batch", "samples per forward/backward"),
                     SPEC_OPT("seq-len"),
                     SPEC_OPT("straggler-window"),
                     SPEC_OPT("straggler-margin"),
                     {"slow-at", NEWT_OPT_INT, &f.slow_at, "step after which worker 1 is slowed"},
                     {"percent", NEWT_OPT_INT, &f.percent, "the time it runs, percent (chaos slowcpu)"},
                     {"recover-at", NEWT_OPT_INT, &f.recover_at,
                      "step at which the slowdown ends in the recovering job (0: halfway from --slow-at to the end)"},
                     {"threads", NEWT_OPT_INT, &f.threads, "compute threads per worker"},
                     {"link", NEWT_OPT_INT, &f.link_kbit,
                      "instead of the CPU jobs: worker 1's link slowed to this many kbit/s (chaos slow, each worker a host of "
                      "its own with --netns, root) "
                      "for --link-ms from --slow-at on, against the same span without it (0: the CPU jobs)"},
                     {"link-ms", NEWT_OPT_INT, &f.link_ms, "how long the link is slow"},
                     {"link-steps", NEWT_OPT_INT, &f.link_steps, "steps of each link job (enough to outlast the span)"},
                     {"verbose", NEWT_OPT_FLAG, &f.verbose, "show each job's progress"},
                     {"keep-logs", NEWT_OPT_FLAG, &f.keep_logs, "keep the jobs' log directories"},
                     NEWT_OPT_END};
  if (spec_flags_bind(&sf, opts, &d) != NEWT_OK) return newt_opts_exit(NEWT_ERR_INVALID);
  int rc = newt_opts_exit(newt_opts_parse("bench straggler", "[flags]", opts, argc, argv, NULL, 0, NULL));
  if (rc >= 0) return rc;
  launcher_opts base;
  memset(&base, 0, sizeof base);
  base.spec = sf.defaults;
  if (spec_flags_apply(&sf, &base.spec) != NEWT_OK) {
    fprintf(stderr, "newt bench straggler: %s\n", newt_errmsg());
    return 2;
  }
  int64_t steps = base.spec.steps, window = base.spec.straggler_window;
  if (!f.recover_at) f.recover_at = f.slow_at + (steps - f.slow_at) / 2;
  if (f.nproc < 2 || f.slow_at < 1 || f.slow_at >= steps || f.recover_at <= f.slow_at || f.recover_at >= steps ||
      f.percent < 1 || f.percent > 99 || window < 1) {
    fprintf(stderr, "newt bench straggler: --nproc >= 2, 1 <= --slow-at < --recover-at < --steps, --percent 1..99, "
            "--straggler-window >= 1\n");
    return 2;
  }
  if (f.link_kbit > 0) return link_jobs(&base, &f, window) ? 0 : 1;
  char slow[96], back[96];
  snprintf(slow, sizeof slow, "slowcpu:worker:1:%lld%%@step=%lld", (long long)f.percent, (long long)f.slow_at);
  snprintf(back, sizeof back, "slowcpu:worker:1:%lld%%:until=%lld@step=%lld", (long long)f.percent,
           (long long)f.recover_at, (long long)f.slow_at);
  job_figures ref = run_job(&base, &f, "uninterrupted", "", window, 0);
  say("uninterrupted", &f, &base, &ref, ref.ok ? ref.loss : NAN);
  job_figures eq = run_job(&base, &f, "equal", slow, 0, 0);
  say("equal", &f, &base, &eq, ref.ok ? ref.loss : NAN);
  job_figures rb = run_job(&base, &f, "rebalanced", slow, window, 0);
  say("rebalanced", &f, &base, &rb, ref.ok ? ref.loss : NAN);
  job_figures rc_ = run_job(&base, &f, "recovering", back, window, 0);
  say("recovering", &f, &base, &rc_, ref.ok ? ref.loss : NAN);
  int ok = ref.ok && eq.ok && rb.ok && rc_.ok;
  if (ok)
    printf("{\"bench\":\"straggler\",\"summary\":true,\"nproc\":%lld,\"percent\":%lld,\"speedup\":%.3f,"
           "\"speedup_steady\":%.3f,\"ideal\":%.3f,\"slow_to_plan_ms\":%lld,\"back_ms\":%lld,\"loss_rel_diff_max\":%.3g}\n",
           (long long)f.nproc, (long long)f.percent, eq.tps_after > 0 ? rb.tps_after / eq.tps_after : 0,
           eq.tps_steady > 0 ? rb.tps_steady / eq.tps_steady : 0,
           /* equal shares run at the slow one's pace; shares by speed at the sum of the speeds */
           ((double)(f.nproc - 1) + (double)f.percent / 100.0) / ((double)f.nproc * (double)f.percent / 100.0),
           (long long)rb.slow_to_plan_ms, (long long)rc_.back_ms,
           fmax(fmax(fabs(eq.loss - ref.loss), fabs(rb.loss - ref.loss)), fabs(rc_.loss - ref.loss)) / fabs(ref.loss));
  return ok ? 0 : 1;
}
