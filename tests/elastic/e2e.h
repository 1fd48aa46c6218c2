/* What the end-to-end tests of tests/elastic share: running a command and keeping what it
 * printed, reading a run's JSON, and the uninterrupted run's loss. */
#ifndef NEWT_TESTS_ELASTIC_E2E_H
#define NEWT_TESTS_ELASTIC_E2E_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/json.h"
#include "common/proc.h"

/* Runs argv, its stdout and stderr into dir/out.<pid> and then *out (malloc'd; may be NULL);
 * returns its exit status, or -1 when it could not run or did not end within 300 s. */
static inline int e2e_run_capture(const char *dir, const char *const *argv, char **out) {
  char path[512];
  snprintf(path, sizeof path, "%s/out.%d", dir, (int)getpid());
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

/* The JSON object of the file at path (NULL when it cannot be read or parsed). */
static inline cJSON *e2e_read_json(const char *path) {
  char *text = NULL;
  size_t n;
  cJSON *j = NULL;
  if (newt_fs_read_all(path, 1 << 20, &text, &n) == NEWT_OK) newt_json_parse(text, n, path, &j);
  free(text);
  return j;
}

/* A member of j: its number (NaN when absent or not one), its string ("" likewise). */
static inline double e2e_num(const cJSON *j, const char *key) {
  const cJSON *v = j ? cJSON_GetObjectItemCaseSensitive(j, key) : NULL;
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static inline const char *e2e_str(const cJSON *j, const char *key) {
  const cJSON *v = j ? cJSON_GetObjectItemCaseSensitive(j, key) : NULL;
  return cJSON_IsString(v) ? v->valuestring : "";
}

/* The final loss of `newt train` over steps of the model (NaN when it failed), extra flags
 * (NULL-ended; NULL: none) after the others: the uninterrupted run a job's loss is compared
 * with. Its output goes through dir. */
static inline double e2e_train_loss_with(const char *dir, const char *newt_bin, const char *model, const char *seq,
                                         const char *gb, const char *mb, int steps, const char *const *extra) {
  char st[16], *out = NULL;
  snprintf(st, sizeof st, "%d", steps);
  const char *argv[32] = {newt_bin, "train", "--model", model, "--seq-len", seq, "--steps", st, "--batch", gb,
                          "--micro-batch", mb};
  int n = 12;
  for (int i = 0; extra && extra[i] && n < 31; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  int rc = e2e_run_capture(dir, argv, &out);
  double loss = NAN;
  const char *last = out ? strrchr(out, '{') : NULL; /* its closing JSON line */
  cJSON *j = NULL;
  if (rc == 0 && last && newt_json_parse(last, strlen(last), "train", &j) == NEWT_OK) loss = e2e_num(j, "final_loss");
  cJSON_Delete(j);
  free(out);
  return loss;
}

static inline double e2e_train_loss(const char *dir, const char *newt_bin, const char *model, const char *seq,
                                    const char *gb, const char *mb, int steps) {
  return e2e_train_loss_with(dir, newt_bin, model, seq, gb, mb, steps, NULL);
}

#endif
