/* Stragglers (issue 41): a real `newt run` of three workers, one of them slowed for real by
 * chaos slowcpu (stopped and continued so that it gets a quarter of the CPU time its busiest
 * peer gets). Each scenario reads what the ranks took from their sample logs
 * (NEWT_SAMPLE_LOG_DIR: "C gen step first count" as a rank takes its slice of a step, "A gen
 * step" once it applied it): the plans' shares as the ranks followed them, never a time.
 *
 *   rebalance  slowed from step 10 to step 40: some later generation gives the slowed worker
 *              fewer samples than every other rank, and the generation the job ends in gives it
 *              its share back (within a sample of the others); every step's samples once, the
 *              final loss that of `newt train` without faults
 *   short      slowed for 3 steps, fewer than half the window (10): no plan after the first
 *
 * usage: test_straggler <scenario> (one ctest test each). */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/json.h"
#include "tests/elastic/e2e.h"
#include "test.h"

#define GB 24
#define GB_S "24"
#define MB "2"
#define MODEL "layers=2,channels=128"
#define SEQ "64"
#define NPROC "3"
#define MAXGEN 64

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

/* `newt run` of the test job with a chaos schedule; its summary's object (NULL: none) and
 * the sample logs in tmpdir/samples. */
static cJSON *run_job(int steps, const char *chaos, samples *s) {
  char st[16], logs[512], summary[512], dir[512];
  snprintf(st, sizeof st, "%d", steps);
  snprintf(logs, sizeof logs, "%s/logs", tmpdir);
  snprintf(summary, sizeof summary, "%s/run.json", tmpdir);
  snprintf(dir, sizeof dir, "%s/samples", tmpdir);
  T_OK(newt_fs_mkdirs(dir, 0755));
  setenv("NEWT_SAMPLE_LOG_DIR", dir, 1);
  /* a margin of a half: a crowded test machine's noise moves no median that far */
  const char *argv[] = {newt_bin, "run", "--quiet", "--job", "e2e-straggler", "--nproc", NPROC, "--steps", st,
                        "--global-batch", GB_S, "--micro-batch", MB, "--model", MODEL, "--seq-len", SEQ,
                        "--straggler-window", "10", "--straggler-margin", "0.5", "--log-dir", logs, "--summary",
                        summary, "--timeout-ms", "240000", "--chaos", chaos, NULL};
  char *out = NULL;
  int rc = e2e_run_capture(tmpdir, argv, &out);
  unsetenv("NEWT_SAMPLE_LOG_DIR");
  T_CHECK_MSG(rc == 0, "newt run exited %d:\n%s", rc, out ? out : "");
  free(out);
  read_samples(dir, steps, s);
  return e2e_read_json(summary);
}

static void test_rebalance(void) {
  const int steps = 80;
  double ref = e2e_train_loss(tmpdir, newt_bin, MODEL, SEQ, GB_S, MB, steps);
  T_CHECK_MSG(isfinite(ref), "no reference loss");
  samples s;
  cJSON *j = run_job(steps, "slowcpu:worker:1:25%:until=40@step=10", &s);
  T_CHECK(j != NULL);
  T_CHECK_MSG(e2e_num(j, "steps") == steps, "steps %g", e2e_num(j, "steps"));
  T_CHECK_MSG(e2e_num(j, "samples_consumed") == (double)steps * GB, "samples %g", e2e_num(j, "samples_consumed"));
  double loss = e2e_num(j, "final_loss");
  T_CHECK_MSG(fabs(loss - ref) <= 1e-4 * fmax(1.0, fabs(ref)), "final loss %.9f, uninterrupted %.9f", loss, ref);
  /* every plan after the first is a rebalance: nothing else happened */
  const cJSON *recs = cJSON_GetObjectItemCaseSensitive(j, "recoveries");
  int rebalances = 0;
  for (const cJSON *r = recs ? recs->child : NULL; r; r = r->next) {
    T_CHECK_MSG(strcmp(e2e_str(r, "cause"), "rebalance") == 0, "a recovery of cause %s", e2e_str(r, "cause"));
    T_CHECK_MSG(e2e_num(r, "steps_lost") == 0, "a rebalance lost %g steps", e2e_num(r, "steps_lost"));
    rebalances++;
  }
  T_CHECK_MSG(rebalances >= 2, "%d rebalances: expected one for the slowdown and one giving the share back",
              rebalances);
  check_every_sample_once(&s, steps);
  long long share[MAXGEN][3];
  shares_by_gen(&s, share);
  int smaller = 0, last = 0;
  for (int g = 1; g < MAXGEN; g++) {
    if (share[g][0] < 0 && share[g][1] < 0 && share[g][2] < 0) continue;
    last = g;
    if (g >= 2 && share[g][1] >= 0 && share[g][1] < share[g][0] && share[g][1] < share[g][2]) smaller = g;
  }
  T_CHECK_MSG(smaller >= 2, "no generation gave the slowed worker fewer samples than the others");
  long long lo = share[last][0] < share[last][2] ? share[last][0] : share[last][2];
  T_CHECK_MSG(last > smaller && share[last][1] >= lo - 1,
              "generation %d, the last, gives the slowed worker %lld samples, the others %lld and %lld: not its share "
              "back", last, share[last][1], share[last][0], share[last][2]);
  cJSON_Delete(j);
  free(s.c);
  free(s.applied);
}

static void test_short(void) {
  const int steps = 40;
  samples s;
  cJSON *j = run_job(steps, "slowcpu:worker:1:25%:until=13@step=10", &s);
  T_CHECK(j != NULL);
  T_CHECK_MSG(e2e_num(j, "steps") == steps, "steps %g", e2e_num(j, "steps"));
  T_CHECK_MSG(e2e_num(j, "generations") == 1, "%g generations: a slowdown of 3 steps (a window of 10) replanned",
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
  else {
    fprintf(stderr, "test_straggler: no scenario \"%s\"\n", argv[1]);
    return 2;
  }
  int rc = T_DONE();
  if (rc == 0) newt_fs_rm_rf(tmpdir);
  else fprintf(stderr, "logs kept in %s\n", tmpdir);
  return rc;
}
