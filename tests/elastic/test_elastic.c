/* End-to-end fault tests: a real `newt run` (private etcd, coordinators and workers as
 * processes) with faults injected for real (kill -9, SIGSTOP, SIGTERM, new workers, a killed
 * leader, an etcd restart), alone and two at once. Each scenario checks that
 *
 *   - the job reaches its last step and the summary records one recovery per fault, of
 *     the right cause, with no step lost and state from memory (or peers, for a joiner);
 *   - the samples consumed are exactly those of an uninterrupted run: every step's
 *     samples, as the ranks that committed it logged them (NEWT_SAMPLE_LOG_DIR), cover
 *     [step*G, (step+1)*G) once, and no step is committed twice;
 *   - the final loss equals that of `newt train` (one process, no faults) with the same
 *     spec, within 1e-4 relative.
 *
 * usage: test_elastic <scenario> (one ctest test per scenario; see CMakeLists.txt). */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/json.h"
#include "common/proc.h"
#include "common/strutil.h"
#include "test.h"

#define GB 24
#define MB 2
#define MODEL "layers=2,channels=64"
#define SEQ "32"

typedef struct scenario {
  const char *name;
  int steps; /* long enough for the faults to play out: a join takes a process start, a
                lost coordinator its lease TTL, an etcd restart its downtime */
  int nproc;
  const char *chaos;
  const char *causes[4]; /* expected recoveries, in order */
  const char *extra[4];  /* more newt run flags */
} scenario;

static const scenario scenarios[] = {
    {"none", 40, 4, "", {NULL}, {NULL}},
    {"crash", 40, 4, "kill:worker:1@step=10", {"crash"}, {NULL}},
    {"hang", 40, 4, "stop:worker:2@step=10", {"hang"}, {NULL}},
    {"leave", 40, 4, "term:worker:0@step=10", {"leave"}, {NULL}},
    {"join", 300, 3, "join:1@step=10", {"join"}, {NULL}},
    {"coordinator", 400, 4, "kill:coordinator@step=10", {"coordinator"}, {NULL}},
    {"etcd", 400, 4, "restart:etcd:1500@step=10", {"etcd"}, {NULL}},
    {"crash2", 40, 4, "kill:worker:1@step=10,kill:worker:2@step=10", {"crash"}, {NULL}},
    {"crash_hang", 40, 4, "kill:worker:0@step=10,stop:worker:3@step=10", {"crash"}, {NULL}},
    {"leave_join", 300, 4, "term:worker:3@step=10,join:2@step=20", {"leave", "join"}, {NULL}},
    {"coordinator_crash", 400, 4, "kill:coordinator@step=10,kill:worker:2@step=20", {"coordinator", "crash"}, {NULL}},
    {"etcd_leave", 400, 4, "restart:etcd:1000@step=10,term:worker:1@step=25", {"etcd", "leave"}, {NULL}},
};

static char tmpdir[256];

/* Runs argv, stdout into out (malloc'd); returns the exit status or -1. */
static int run_capture(const char *const *argv, char **out) {
  char path[512];
  snprintf(path, sizeof path, "%s/out.%d", tmpdir, (int)getpid());
  unlink(path);
  newt_spawn_opts so = {.log_path = path};
  pid_t pid;
  if (newt_proc_spawn(argv, &so, &pid) != NEWT_OK) return -1;
  int st = 0;
  if (newt_proc_wait(pid, 300000, &st) != NEWT_OK) {
    newt_proc_stop(pid, 1000);
    return -1;
  }
  size_t n;
  if (out && newt_fs_read_all(path, 64 << 20, out, &n) != NEWT_OK) *out = NULL;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static double reference_loss(const char *newt, int nsteps) {
  char steps[16], gb[16], mb[16];
  snprintf(steps, sizeof steps, "%d", nsteps);
  snprintf(gb, sizeof gb, "%d", GB);
  snprintf(mb, sizeof mb, "%d", MB);
  const char *argv[] = {newt, "train", "--model", MODEL, "--seq-len", SEQ, "--steps", steps, "--batch", gb,
                        "--micro-batch", mb, NULL};
  char *out = NULL;
  int rc = run_capture(argv, &out);
  double loss = NAN;
  const char *last = out ? strrchr(out, '{') : NULL;
  cJSON *j = NULL;
  if (rc == 0 && last && newt_json_parse(last, strlen(last), "train", &j) == NEWT_OK) {
    newt_json_get_double(j, "train", "final_loss", 1, &loss);
    cJSON_Delete(j);
  }
  free(out);
  return loss;
}

/* The sample logs: "C gen step first count" when a rank takes its slice of a step, "A gen
 * step" when it applied the step. */
typedef struct slice_rec {
  long long gen, step, first, count;
} slice_rec;

static void check_samples(const char *dir, int STEPS) {
  slice_rec *c = NULL;
  size_t nc = 0, cap = 0;
  long long *applied_gen = malloc((size_t)(STEPS + 1) * sizeof *applied_gen);
  for (int s = 0; s <= STEPS; s++) applied_gen[s] = -1;
  DIR *d = opendir(dir);
  T_CHECK_MSG(d != NULL, "no sample logs in %s", dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strstr(e->d_name, ".samples")) continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    char line[256];
    while (fgets(line, sizeof line, f)) {
      slice_rec r;
      if (line[0] == 'C' && sscanf(line + 1, "%lld %lld %lld %lld", &r.gen, &r.step, &r.first, &r.count) == 4) {
        if (nc == cap) {
          cap = cap ? 2 * cap : 256;
          c = realloc(c, cap * sizeof *c);
        }
        c[nc++] = r;
      } else if (line[0] == 'A' && sscanf(line + 1, "%lld %lld", &r.gen, &r.step) == 2 && r.step >= 1 &&
                 r.step <= STEPS) {
        T_CHECK_MSG(applied_gen[r.step] < 0 || applied_gen[r.step] == r.gen,
                    "step %lld was committed by generations %lld and %lld", r.step, applied_gen[r.step], r.gen);
        applied_gen[r.step] = r.gen;
      }
    }
    fclose(f);
  }
  closedir(d);
  for (int s = 1; s <= STEPS; s++) {
    T_CHECK_MSG(applied_gen[s] >= 0, "step %d was never committed", s);
    if (applied_gen[s] < 0) continue;
    /* the slices of step s in the generation that committed it cover its samples once */
    int seen[GB];
    memset(seen, 0, sizeof seen);
    for (size_t i = 0; i < nc; i++) {
      if (c[i].step != s || c[i].gen != applied_gen[s]) continue;
      for (long long k = c[i].first; k < c[i].first + c[i].count; k++) {
        long long off = k - (long long)(s - 1) * GB;
        T_CHECK_MSG(off >= 0 && off < GB, "step %d took sample %lld, outside its batch", s, k);
        if (off >= 0 && off < GB) seen[off]++;
      }
    }
    for (int k = 0; k < GB; k++)
      T_CHECK_MSG(seen[k] == 1, "step %d: sample %d taken %d times", s, (s - 1) * GB + k, seen[k]);
  }
  free(c);
  free(applied_gen);
}

static void run_scenario(const scenario *sc, const char *newt) {
  const int STEPS = sc->steps;
  double ref = reference_loss(newt, STEPS);
  T_CHECK_MSG(isfinite(ref), "newt train gave no reference loss");
  char logs[512], samples[512], summary[512], steps[16], gb[16], mb[16], nproc[16], job[64];
  snprintf(logs, sizeof logs, "%s/logs", tmpdir);
  snprintf(samples, sizeof samples, "%s/samples", tmpdir);
  snprintf(summary, sizeof summary, "%s/summary.json", tmpdir);
  T_OK(newt_fs_mkdirs(samples, 0755));
  snprintf(steps, sizeof steps, "%d", STEPS);
  snprintf(gb, sizeof gb, "%d", GB);
  snprintf(mb, sizeof mb, "%d", MB);
  snprintf(nproc, sizeof nproc, "%d", sc->nproc);
  snprintf(job, sizeof job, "e2e-%s", sc->name);
  const char *argv[40];
  int a = 0;
  const char *base[] = {newt, "run", "--quiet", "--job", job, "--nproc", nproc, "--model", MODEL, "--seq-len", SEQ,
                        "--steps", steps, "--global-batch", gb, "--micro-batch", mb, "--comm-timeout-ms", "1500",
                        "--log-dir", logs, "--summary", summary, "--timeout-ms", "180000"};
  for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) argv[a++] = base[i];
  if (sc->chaos[0]) {
    argv[a++] = "--chaos";
    argv[a++] = sc->chaos;
  }
  for (int i = 0; sc->extra[i]; i++) argv[a++] = sc->extra[i];
  argv[a] = NULL;
  setenv("NEWT_SAMPLE_LOG_DIR", samples, 1);
  char *out = NULL;
  int rc = run_capture(argv, &out);
  T_CHECK_MSG(rc == 0, "newt run exited %d:\n%s", rc, out ? out : "");
  free(out);
  char *text = NULL;
  size_t n;
  cJSON *j = NULL;
  T_OK(newt_fs_read_all(summary, 1 << 20, &text, &n));
  if (text) T_OK(newt_json_parse(text, n, "summary", &j));
  if (!j) {
    free(text);
    return;
  }
  int done = 0;
  int64_t st = 0, samples_n = 0;
  double loss = NAN;
  newt_json_get_bool(j, "summary", "done", 1, &done);
  newt_json_get_int(j, "summary", "steps", 1, &st);
  newt_json_get_int(j, "summary", "samples_consumed", 1, &samples_n);
  newt_json_get_double(j, "summary", "final_loss", 1, &loss);
  T_CHECK(done);
  T_CHECK_MSG(st == STEPS, "steps %lld", (long long)st);
  T_CHECK_MSG(samples_n == (int64_t)STEPS * GB, "samples_consumed %lld, uninterrupted %d", (long long)samples_n,
              STEPS * GB);
  T_CHECK_MSG(fabs(loss - ref) <= 1e-4 * fmax(1.0, fabs(ref)), "final loss %.7f, uninterrupted %.7f", loss, ref);
  const cJSON *recs = cJSON_GetObjectItemCaseSensitive(j, "recoveries");
  int nexp = 0;
  while (nexp < 4 && sc->causes[nexp]) nexp++;
  T_CHECK_MSG(cJSON_GetArraySize(recs) == nexp, "%d recoveries, expected %d:\n%s", cJSON_GetArraySize(recs), nexp,
              text);
  int i = 0;
  for (const cJSON *r = recs ? recs->child : NULL; r && i < nexp; r = r->next, i++) {
    const char *cause = "", *restore = "";
    int64_t lost = -1, total = -1;
    int injected = 0;
    newt_json_get_str(r, "recovery", "cause", 1, &cause);
    newt_json_get_str(r, "recovery", "restore", 1, &restore);
    newt_json_get_int(r, "recovery", "steps_lost", 1, &lost);
    newt_json_get_int(r, "recovery", "total_ms", 1, &total);
    newt_json_get_bool(r, "recovery", "injected", 1, &injected);
    T_CHECK_MSG(strcmp(cause, sc->causes[i]) == 0, "recovery %d: cause %s, expected %s", i, cause, sc->causes[i]);
    T_CHECK_MSG(lost == 0, "recovery %d (%s): %lld steps lost", i, cause, (long long)lost);
    T_CHECK_MSG(injected, "recovery %d (%s) matches no injected fault", i, cause);
    T_CHECK_MSG(total >= 0, "recovery %d: total_ms %lld", i, (long long)total);
    const char *want = strcmp(cause, "join") == 0 ? "peer" : "memory";
    T_CHECK_MSG(strcmp(restore, want) == 0, "recovery %d (%s): state from %s, expected %s", i, cause, restore, want);
  }
  cJSON_Delete(j);
  free(text);
  check_samples(samples, STEPS);
}

static const scenario *current;
static const char *newt_bin;

static void test_scenario(void) { run_scenario(current, newt_bin); }

int main(int argc, char **argv) {
  newt_bin = getenv("NEWT_BIN");
  if (!newt_bin || argc < 2) {
    fprintf(stderr, "usage: NEWT_BIN=path/to/newt test_elastic <scenario>\n");
    return 2;
  }
  for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
    if (strcmp(scenarios[i].name, argv[1]) == 0) current = &scenarios[i];
  if (!current) {
    fprintf(stderr, "test_elastic: no scenario \"%s\"\n", argv[1]);
    return 2;
  }
  snprintf(tmpdir, sizeof tmpdir, "/tmp/newt-e2e-%s-XXXXXX", argv[1]);
  if (!mkdtemp(tmpdir)) return 2;
  t_cur_name = current->name;
  T_RUN(test_scenario);
  int rc = T_DONE();
  if (rc == 0) newt_fs_rm_rf(tmpdir);
  else fprintf(stderr, "logs kept in %s\n", tmpdir);
  return rc;
}
