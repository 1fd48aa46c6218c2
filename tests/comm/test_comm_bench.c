/* `newt bench allreduce|reduce_scatter|allgather` prints what it promises: one JSON object
 * per line, the build and rebuild times, then one line per size doubling from --min to
 * --max with us, algbw = bytes/time and busbw = algbw * 2(n-1)/n (allreduce) or (n-1)/n
 * (reduce-scatter, allgather); over shared memory and over TCP; bad flags are refused. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "test.h"

static const char *newt_bin(void) {
  const char *b = getenv("NEWT_BIN");
  return b ? b : "./newt";
}

/* Runs the benchmark, checks every line; returns the number of size lines. */
static int run_bench(const char *op, int ranks, const char *backend, const char *min, const char *max) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "%s bench %s --ranks %d --min %s --max %s --backend %s --iters 10 --warmup 1",
           newt_bin(), op, ranks, min, max, backend);
  FILE *p = popen(cmd, "r");
  T_CHECK(p != NULL);
  if (!p) return 0;
  char line[1024];
  int sizes = 0, builds = 0;
  long long last = 0;
  while (fgets(line, sizeof line, p)) {
    cJSON *j = cJSON_Parse(line);
    T_CHECK_MSG(j != NULL, "not JSON: %s", line);
    if (!j) continue;
    const char *bench = cJSON_GetStringValue(cJSON_GetObjectItem(j, "bench"));
    T_CHECK(bench && strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(j, "backend")), backend) == 0);
    T_CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "ranks")) == ranks);
    if (bench && (strcmp(bench, "comm_create") == 0 || strcmp(bench, "comm_rebuild") == 0)) {
      T_CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "ms")) > 0);
      builds++;
    } else {
      T_CHECK(bench && strcmp(bench, op) == 0);
      double bytes = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "bytes"));
      double us = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "us"));
      double algbw = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "algbw"));
      double busbw = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "busbw"));
      double factor = strcmp(op, "allreduce") == 0 ? 2.0 * (ranks - 1) / ranks : (double)(ranks - 1) / ranks;
      T_CHECK_MSG(us > 0 && bytes > 0, "%s", line);
      T_CHECK_MSG(fabs(algbw - bytes / (us * 1e3)) <= 0.002 + 0.01 * algbw, "algbw %g for %g bytes in %g us", algbw, bytes, us);
      T_CHECK_MSG(fabs(busbw - algbw * factor) <= 0.002 + 0.01 * busbw, "busbw %g, algbw %g", busbw, algbw);
      T_CHECK_MSG(last == 0 || (long long)bytes >= 2 * last - 2 * ranks * 4, "sizes do not double: %lld then %g", last, bytes);
      last = (long long)bytes;
      sizes++;
    }
    cJSON_Delete(j);
  }
  T_CHECK(pclose(p) == 0);
  T_CHECK_MSG(builds == 2, "%d build lines", builds);
  return sizes;
}

static void test_allreduce_shm(void) { T_CHECK(run_bench("allreduce", 2, "shm", "4", "64K") == 15); }
static void test_allreduce_tcp(void) { T_CHECK(run_bench("allreduce", 3, "tcp", "1K", "1M") == 11); }
static void test_rs_ag(void) {
  T_CHECK(run_bench("reduce_scatter", 4, "shm", "64K", "1M") == 5);
  T_CHECK(run_bench("allgather", 2, "shm", "64K", "1M") == 5);
}

static void test_bad_flags(void) {
  char cmd[512];
  const char *bad[] = {"--ranks 0", "--backend ib", "--min 8 --max 4", "--dtype f64", "--bogus 1"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    snprintf(cmd, sizeof cmd, "%s bench allreduce %s >/dev/null 2>&1", newt_bin(), bad[i]);
    int st = system(cmd);
    T_CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 2, "%s: exit %d", bad[i], WEXITSTATUS(st));
  }
}

/* The NCCL backend: the nccl-tests figures on a GPU machine; elsewhere a clean failure
 * saying why (no GPU, or a newt built without CUDA). */
static void test_nccl(void) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "%s bench allreduce --backend nccl --min 1K --max 64K 2>&1", newt_bin());
  FILE *p = popen(cmd, "r");
  T_CHECK(p != NULL);
  if (!p) return;
  char out[4096] = "", line[1024];
  while (fgets(line, sizeof line, p))
    if (strlen(out) + strlen(line) < sizeof out) strcat(out, line);
  int st = pclose(p);
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) { /* a GPU machine */
    T_CHECK_MSG(strstr(out, "\"busbw\"") && strstr(out, "\"backend\":\"nccl\""), "%s", out);
    return;
  }
  T_CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 1, "exit status %d: %s", WEXITSTATUS(st), out);
#ifdef NEWT_HAVE_CUDA
  T_CHECK_MSG(strstr(out, "--backend nccl: no GPU") != NULL, "%s", out);
#else
  T_CHECK_MSG(strstr(out, "built without CUDA") != NULL, "%s", out);
#endif
  T_CHECK_MSG(strchr(out, '\n') == strrchr(out, '\n'), "more than one line: %s", out);
}

int main(void) {
  T_RUN(test_allreduce_shm);
  T_RUN(test_allreduce_tcp);
  T_RUN(test_rs_ag);
  T_RUN(test_bad_flags);
  T_RUN(test_nccl);
  return T_DONE();
}
