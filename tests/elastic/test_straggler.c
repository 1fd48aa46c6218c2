/* Stragglers (issue 41): a real `newt run` of three workers, one of them slowed for real by
 * chaos slowcpu (stopped and continued so that it runs a quarter of the time). Each scenario
 * reads what the ranks took from their sample logs (NEWT_SAMPLE_LOG_DIR: "C gen step first count" as a rank takes its slice of a step, "A gen
 * step" once it applied it): the plans' shares as the ranks followed them, never a time.
 *
 *   rebalance  slowed from step 10 until a plan answers it: a generation gives the slowed worker
 *              fewer samples than every other rank, and a later one gives it its share back
 *              (within a sample of the others), seen in the sample logs as they come; then the
 *              job is interrupted: every step's samples once, its losses those of `newt train`
 *              without faults (check_losses), every plan after the first a rebalance
 *   short      slowed for 2 steps, fewer than half the window (10): no plan after the first
 *   replace    a spare in the plan and --straggler-replace 1.5: rank 1, slowed, is replaced by the
 *              spare (a generation where the spare takes samples and it none); then interrupted,
 *              every sample once, the uninterrupted run's loss
 *
 * usage: test_straggler <scenario> (one ctest test each). */
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/json.h"
#include "common/proc.h"
#include "job/runlog.h"
#include "tests/elastic/e2e.h"
#include "test.h"

#define GB 24
#define GB_S "24"
#define MB "2"
#define MODEL "layers=2,channels=128"
#define SEQ "64"
#define NPROC "3"
#define MAXGEN 64
/* a learning rate that is the same at step k whatever the steps: the job interrupted at step k
   is held to `newt train` of k steps */
#define LR "0.001"
#define WARMUP "2"

static char tmpdir[256];
static const char *newt_bin;

/* What the sample logs say: per step the newest generation that applied it, and every slice
 * taken (its generation, step, first sample, count, worker). */
typedef struct slice {
  long long gen, step, first, count;
  int worker;
} slice;

typedef struct samples {
  slice *c;
  size_t nc;
  long long *applied; /* [steps + 1]: the newest generation that applied the step (-1: none) */
} samples;

static void read_samples(const char *dir, int steps, samples *s) {
  memset(s, 0, sizeof *s);
  s->applied = malloc((size_t)(steps + 1) * sizeof *s->applied);
  for (int i = 0; i <= steps; i++) s->applied[i] = -1;
  size_t cap = 0;
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    int w;
    if (sscanf(e->d_name, "w%d.samples", &w) != 1) continue;
    char path[1024], line[256];
    snprintf(path, sizeof path, "%.700s/%.255s", dir, e->d_name);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) {
      slice r = {.worker = w};
      if (line[0] == 'C' && sscanf(line + 1, "%lld %lld %lld %lld", &r.gen, &r.step, &r.first, &r.count) == 4) {
        if (s->nc == cap) s->c = realloc(s->c, (cap = cap ? 2 * cap : 256) * sizeof *s->c);
        s->c[s->nc++] = r;
      } else if (line[0] == 'A' && sscanf(line + 1, "%lld %lld", &r.gen, &r.step) == 2 && r.step >= 1 &&
                 r.step <= steps && r.gen > s->applied[r.step]) {
        s->applied[r.step] = r.gen;
      }
    }
    if (f) fclose(f);
  }
  if (d) closedir(d);
}

/* Every step applied, its samples taken once by the generation that applied it. */
static void check_every_sample_once(const samples *s, int steps) {
  for (int st = 1; st <= steps; st++) {
    T_CHECK_MSG(s->applied[st] >= 0, "step %d was never applied", st);
    int seen[GB] = {0};
    for (size_t i = 0; i < s->nc; i++) {
      const slice *c = &s->c[i];
      if (c->step != st || c->gen != s->applied[st]) continue;
      for (long long k = c->first; k < c->first + c->count; k++) {
        long long off = k - (long long)(st - 1) * GB;
        T_CHECK_MSG(off >= 0 && off < GB, "step %d took sample %lld, outside its batch", st, k);
        if (off >= 0 && off < GB) seen[off]++;
      }
    }
    for (int k = 0; k < GB; k++) T_CHECK_MSG(seen[k] == 1, "step %d: sample %d taken %d times", st, k, seen[k]);
  }
}

/* The samples per step each worker took in each generation (-1: none), from the slices. */
static void shares_by_gen(const samples *s, long long share[MAXGEN][3]) {
  for (int g = 0; g < MAXGEN; g++) share[g][0] = share[g][1] = share[g][2] = -1;
  for (size_t i = 0; i < s->nc; i++)
    if (s->c[i].gen >= 0 && s->c[i].gen < MAXGEN && s->c[i].worker >= 0 && s->c[i].worker < 3)
      share[s->c[i].gen][s->c[i].worker] = s->c[i].count;
}

/* The arguments of `newt run` of the test job (steps, chaos, extra flags or NULL), its logs in
 * tmpdir/logs. A margin of a half and a window of 10 steps: a crowded test machine's noise moves
 * no median that far for that long. */
static void job_argv(const char **argv, const char *steps, const char *chaos, const char *const *extra, char *logs,
                     char *summary) {
  snprintf(logs, 512, "%s/logs", tmpdir);
  snprintf(summary, 512, "%s/run.json", tmpdir);
  const char *v[] = {newt_bin, "run", "--quiet", "--job", "e2e-straggler", "--nproc", NPROC, "--steps", steps,
                     "--global-batch", GB_S, "--micro-batch", MB, "--model", MODEL, "--seq-len", SEQ,
                     "--lr-min", LR, "--warmup", WARMUP, "--straggler-window", "10", "--straggler-margin", "0.5",
                     "--log-dir", logs, "--summary",
                     summary, "--timeout-ms", "600000", "--chaos", chaos};
  size_t n = sizeof v / sizeof v[0];
  memcpy(argv, v, sizeof v);
  for (size_t i = 0; extra && extra[i]; i++) argv[n++] = extra[i];
  argv[n] = NULL;
}

/* The step log of `newt train` of the test job's model over steps (NULL: it failed): the
 * uninterrupted run, step by step. */
static job_step *train_steps(int steps, size_t *n) {
  char log[600];
  snprintf(log, sizeof log, "%s/train.steps", tmpdir);
  unlink(log);
  const char *extra[] = {"--lr", LR, "--lr-min", LR, "--warmup", WARMUP, "--log", log, NULL};
  job_step *sl = NULL;
  *n = 0;
  if (!isfinite(e2e_train_loss_with(tmpdir, newt_bin, MODEL, SEQ, GB_S, MB, steps, extra)) ||
      job_steplog_read(log, &sl, n, NULL) != NEWT_OK || *n != (size_t)steps) {
    free(sl);
    return NULL;
  }
  return sl;
}

/* The job's losses (its stitched step log sl, ns steps) against the uninterrupted run's: the
 * same to 1e-5 up to 30 steps past the first step of a later plan (first; its shares sum the
 * gradients in another order, a rounding apart, which compounds as training goes on: 1e-6
 * after a hundred steps, a percent after four hundred), and within 5% at the last step. */
static void check_losses(const job_step *sl, size_t ns, long long first) {
  size_t nr = 0;
  int steps = (int)sl[ns - 1].step;
  job_step *ref = train_steps(steps, &nr);
  T_CHECK_MSG(ref != NULL, "no reference run of %d steps", steps);
  if (!ref) return;
  for (size_t i = 0; i < ns; i++) {
    long long k = sl[i].step;
    if (k < 1 || k > steps || k > first + 30) continue;
    double want = ref[k - 1].loss;
    T_CHECK_MSG(fabs(sl[i].loss - want) <= 1e-5 * fmax(1.0, fabs(want)), "step %lld: loss %.9f, uninterrupted %.9f",
                k, sl[i].loss, want);
  }
  double want = ref[steps - 1].loss;
  T_CHECK_MSG(fabs(sl[ns - 1].loss - want) <= 5e-2 * fabs(want), "step %d, the last: loss %.9f, uninterrupted %.9f",
              steps, sl[ns - 1].loss, want);
  free(ref);
}

static void sample_dir(char *dir) {
  snprintf(dir, 512, "%s/samples", tmpdir);
  T_OK(newt_fs_mkdirs(dir, 0755));
  setenv("NEWT_SAMPLE_LOG_DIR", dir, 1);
}

/* `newt run` of the test job to its end; its summary's object (NULL: none) and the sample
 * logs in tmpdir/samples. */
static cJSON *run_job(int steps, const char *chaos, samples *s) {
  char st[16], logs[512], summary[512], dir[512];
  const char *argv[40];
  snprintf(st, sizeof st, "%d", steps);
  job_argv(argv, st, chaos, NULL, logs, summary);
  sample_dir(dir);
  char *out = NULL;
  int rc = e2e_run_capture(tmpdir, argv, &out);
  unsetenv("NEWT_SAMPLE_LOG_DIR");
  T_CHECK_MSG(rc == 0, "newt run exited %d:\n%s", rc, out ? out : "");
  free(out);
  read_samples(dir, steps, s);
  return e2e_read_json(summary);
}

/* The generation that gave the slowed worker (w1) fewer samples than each other (0: none yet)
 * and a later one that gave it its share back, within a sample of the others' smaller (0: none
 * yet), from the slices taken so far. */
static void rebalanced(const samples *s, int *smaller, int *back, long long share[MAXGEN][3]) {
  shares_by_gen(s, share);
  *smaller = *back = 0;
  for (int g = 2; g < MAXGEN; g++) {
    if (share[g][0] < 0 || share[g][1] < 0 || share[g][2] < 0) continue;
    long long lo = share[g][0] < share[g][2] ? share[g][0] : share[g][2];
    if (!*smaller && share[g][1] < lo) *smaller = g;
    else if (*smaller && !*back && share[g][1] >= lo - 1) *back = g;
  }
}

/* Whether the run's event log (logs/events.jsonl) has the recovery of generation gen: its
 * first step done, the summary will count it. */
static int recovered(const char *logs, int gen) {
  char path[600];
  snprintf(path, sizeof path, "%s/events.jsonl", logs);
  job_event *ev = NULL;
  size_t n = 0;
  int seen = 0;
  if (job_eventlog_read(path, &ev, &n, NULL) != NEWT_OK) return 0;
  for (size_t i = 0; i < n; i++) seen |= ev[i].type == JOB_EV_RECOVERED && ev[i].generation >= gen;
  job_eventlog_free(ev, n);
  return seen;
}

/* The first step a later plan than the first applied (LLONG_MAX: none). */
static long long first_replanned_step(const samples *s, int steps) {
  for (int k = 1; k <= steps; k++)
    if (s->applied[k] >= 2) return k;
  return LLONG_MAX;
}

/* `newt run` of the test job, started for good (100,000 steps) with the sample logs in dir;
 * its pid (-1: none). */
static pid_t start_job(const char *chaos, const char *const *extra, char *logs, char *summary, char *dir) {
  char out_path[600];
  const char *argv[48];
  job_argv(argv, "100000", chaos, extra, logs, summary);
  sample_dir(dir);
  snprintf(out_path, sizeof out_path, "%s/run.out", tmpdir);
  newt_spawn_opts so = {.log_path = out_path, .die_with_parent = 1, .new_session = 1};
  pid_t run = -1;
  T_OK(newt_proc_spawn(argv, &so, &run));
  unsetenv("NEWT_SAMPLE_LOG_DIR");
  return run;
}

/* The job interrupted (SIGINT, as Ctrl-C) once the test saw what it waited for (ended: it ended
 * first, a failure), and the steps it did held to the uninterrupted run's: every sample once,
 * the loss of its last step that of `newt train` of as many steps; every plan after the first
 * a rebalance without a step lost, at least rebalances of them. */
static void interrupt_and_check(pid_t run, int ended, int st, const char *logs, const char *summary, const char *dir,
                                int rebalances) {
  T_CHECK_MSG(!ended, "newt run ended (status 0x%x) before the events were seen", st);
  if (!ended) {
    T_CHECK(kill(-run, SIGINT) == 0);
    T_CHECK_MSG(newt_proc_wait(run, 60000, &st) == NEWT_OK, "newt run did not end after SIGINT");
  }
  char steplog[600];
  snprintf(steplog, sizeof steplog, "%s/steps.jsonl", logs);
  job_step *sl = NULL;
  size_t ns = 0;
  T_OK(job_steplog_read(steplog, &sl, &ns, NULL));
  T_OK(job_steplog_stitch(sl, &ns, NULL));
  T_CHECK_MSG(ns > 10, "the step log has %zu steps", ns);
  if (ns > 10) {
    int steps = (int)sl[ns - 1].step;
    samples s;
    read_samples(dir, steps, &s);
    check_every_sample_once(&s, steps);
    check_losses(sl, ns, first_replanned_step(&s, steps));
    free(s.c);
    free(s.applied);
  }
  free(sl);
  cJSON *j = e2e_read_json(summary);
  const cJSON *recs = cJSON_GetObjectItemCaseSensitive(j, "recoveries");
  int n = 0;
  for (const cJSON *r = recs ? recs->child : NULL; r; r = r->next) {
    T_CHECK_MSG(strcmp(e2e_str(r, "cause"), "rebalance") == 0, "a recovery of cause %s", e2e_str(r, "cause"));
    T_CHECK_MSG(e2e_num(r, "steps_lost") == 0, "a rebalance lost %g steps", e2e_num(r, "steps_lost"));
    n++;
  }
  T_CHECK_MSG(n >= rebalances, "%d rebalances in the summary %s, expected at least %d", n, summary, rebalances);
  cJSON_Delete(j);
}

/* Slowed from step 10 until the plan that answers it is in force (chaos slowcpu ...
 * until=rebalanced): the test waits for that plan and for the one giving the share back in the
 * ranks' sample logs, then interrupts the job and holds the steps it did to the uninterrupted
 * run's. No step count or time decides: the events do. */
static void test_rebalance(void) {
  char logs[512], summary[512], dir[512];
  pid_t run = start_job("slowcpu:worker:1:25%:until=rebalanced@step=10", NULL, logs, summary, dir);
  if (run < 0) return;
  samples s = {0};
  long long share[MAXGEN][3];
  int smaller = 0, back = 0, st = 0, ended = 0;
  for (newt_deadline_t d = newt_deadline_in_ms(280000); !(back && recovered(logs, back)) && !ended &&
                                                        !newt_deadline_passed(d);) {
    newt_sleep_ms(200);
    if (!back) {
      free(s.c);
      free(s.applied);
      read_samples(dir, 100000, &s);
      rebalanced(&s, &smaller, &back, share);
    }
    ended = newt_proc_wait(run, 0, &st) == NEWT_OK;
  }
  free(s.c);
  free(s.applied);
  T_CHECK_MSG(smaller >= 2, "no generation gave the slowed worker fewer samples than the others");
  T_CHECK_MSG(back > smaller, "after generation %d (the slowed worker %lld samples, the others %lld and %lld) no "
              "generation gave its share back", smaller, smaller ? share[smaller][1] : -1,
              smaller ? share[smaller][0] : -1, smaller ? share[smaller][2] : -1);
  interrupt_and_check(run, ended, st, logs, summary, dir, 2);
}

/* The generation (0: none yet) in which the spare of generation 1 took samples and the worker
 * that was data-parallel rank 1 of it (*victim; the one slowed) took none: it was replaced. */
static int replaced(const samples *s, int *victim) {
  long long share[MAXGEN][3];
  shares_by_gen(s, share);
  int spare = -1;
  *victim = -1;
  for (int w = 0; w < 3; w++)
    if (share[1][w] < 0) spare = w;
  for (size_t i = 0; i < s->nc; i++) /* even shares in generation 1: rank 1's slice starts half-way */
    if (s->c[i].gen == 1 && s->c[i].first - (s->c[i].step - 1) * GB == GB / 2) *victim = s->c[i].worker;
  if (spare < 0 || *victim < 0) return 0;
  for (int g = 2; g < MAXGEN; g++)
    if (share[g][spare] > 0 && share[g][*victim] < 0) return g;
  return 0;
}

/* A spare in the plan (--dp-max 2 of three workers) and --straggler-replace 1.5: the slowed rank
 * is replaced by the spare rather than given a smaller share; the job goes on, every sample
 * once, the uninterrupted run's loss. */
static void test_replace(void) {
  char logs[512], summary[512], dir[512];
  const char *extra[] = {"--dp-max", "2", "--straggler-replace", "1.5", NULL};
  pid_t run = start_job("slowcpu:rank:1:25%:until=rebalanced@step=10", extra, logs, summary, dir);
  if (run < 0) return;
  samples s = {0};
  int gen = 0, victim = -1, st = 0, ended = 0;
  for (newt_deadline_t d = newt_deadline_in_ms(280000); !(gen && recovered(logs, gen)) && !ended &&
                                                        !newt_deadline_passed(d);) {
    newt_sleep_ms(200);
    if (!gen) {
      free(s.c);
      free(s.applied);
      read_samples(dir, 100000, &s);
      gen = replaced(&s, &victim);
    }
    ended = newt_proc_wait(run, 0, &st) == NEWT_OK;
  }
  free(s.c);
  free(s.applied);
  T_CHECK_MSG(gen >= 2, "no generation replaced the slowed worker (w%d, rank 1 of generation 1) by the spare",
              victim);
  interrupt_and_check(run, ended, st, logs, summary, dir, 1);
}

/* Slowed for 2 steps, fewer than half the window: no plan after the first. */
static void test_short(void) {
  const int steps = 40;
  samples s;
  cJSON *j = run_job(steps, "slowcpu:worker:1:25%:until=12@step=10", &s);
  T_CHECK(j != NULL);
  T_CHECK_MSG(e2e_num(j, "steps") == steps, "steps %g", e2e_num(j, "steps"));
  T_CHECK_MSG(e2e_num(j, "generations") == 1, "%g generations: a slowdown of 2 steps (a window of 10) replanned",
              e2e_num(j, "generations"));
  check_every_sample_once(&s, steps);
  cJSON_Delete(j);
  free(s.c);
  free(s.applied);
}

int main(int argc, char **argv) {
  newt_bin = getenv("NEWT_BIN");
  if (!newt_bin || argc < 2) {
    fprintf(stderr, "usage: NEWT_BIN=path/to/newt test_straggler <scenario>\n");
    return 2;
  }
  snprintf(tmpdir, sizeof tmpdir, "/tmp/newt-straggler-%s-XXXXXX", argv[1]);
  if (!mkdtemp(tmpdir)) return 2;
  t_cur_name = argv[1];
  if (strcmp(argv[1], "rebalance") == 0) T_RUN(test_rebalance);
  else if (strcmp(argv[1], "short") == 0) T_RUN(test_short);
  else if (strcmp(argv[1], "replace") == 0) T_RUN(test_replace);
  else {
    fprintf(stderr, "test_straggler: no scenario \"%s\"\n", argv[1]);
    return 2;
  }
  int rc = T_DONE();
  if (rc == 0) newt_fs_rm_rf(tmpdir);
  else fprintf(stderr, "logs kept in %s\n", tmpdir);
  return rc;
}
