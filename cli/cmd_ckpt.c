/* newt ckpt: the checkpoint tools.
 *
 *   newt ckpt ls DIR [--json]            steps, committed or not, sizes, ratio, the latest
 *   newt ckpt inspect DIR/STEP [--json]  layout, tensors (shape, dtype, sizes), ratio, state
 *   newt ckpt verify DIR/STEP            every checksum; exit status 1 on any problem
 *
 * DIR/STEP is a step directory (DIR/step-0000000042), DIR/42, or DIR itself (the newest
 * committed step). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt/ckpt.h"
#include "cli/cmds.h"
#include "common/fs.h"
#include "common/json.h"
#include "common/opts.h"
#include "common/strutil.h"

static void human(uint64_t b, char *out, size_t cap) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int i = 0;
  while (v >= 1024 && i < 4) {
    v /= 1024;
    i++;
  }
  snprintf(out, cap, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

/* Resolves DIR/STEP, DIR/<N> or DIR (newest committed) to a step directory. */
static int resolve_step(const char *arg, char *out, size_t cap) {
  char mf[4300];
  snprintf(mf, sizeof mf, "%s/MANIFEST", arg);
  if (newt_fs_exists(mf)) {
    snprintf(out, cap, "%s", arg);
    return 0;
  }
  char dir[2048];
  newt_fs_dirname(arg, dir, sizeof dir);
  const char *base = strrchr(arg, '/') ? strrchr(arg, '/') + 1 : arg;
  int digits = *base != '\0';
  for (const char *p = base; *p; p++) digits = digits && isdigit((unsigned char)*p);
  if (digits) {
    snprintf(out, cap, "%s/step-%010lld", dir, atoll(base));
    return 0;
  }
  if (strncmp(base, "step-", 5) == 0) { /* an uncommitted step: let the reader say so */
    snprintf(out, cap, "%s", arg);
    return 0;
  }
  ckpt_reader *r = NULL;
  if (ckpt_open(&r, arg, CKPT_LATEST, 1) != NEWT_OK) {
    fprintf(stderr, "newt ckpt: %s\n", newt_errmsg());
    return -1;
  }
  snprintf(out, cap, "%s", ckpt_reader_path(r));
  ckpt_close(r);
  return 0;
}

static int cmd_ls(const char *dir, int json) {
  ckpt_step_info *s = NULL;
  size_t n = 0;
  if (!newt_fs_exists(dir)) {
    fprintf(stderr, "newt ckpt ls: %s does not exist\n", dir);
    return 1;
  }
  if (ckpt_list(dir, &s, &n) != NEWT_OK) {
    fprintf(stderr, "newt ckpt ls: %s\n", newt_errmsg());
    return 1;
  }
  if (!json) printf("%-16s %-10s %5s %7s %11s %11s %6s %11s\n", "STEP", "STATE", "RANKS", "TENSORS", "RAW", "FILES",
                    "RATIO", "ON DISK");
  for (size_t i = 0; i < n; i++) {
    const char *state = !s[i].committed ? "incomplete" : s[i].valid ? "committed" : "corrupt";
    double ratio = s[i].file_bytes ? (double)s[i].raw_bytes / (double)s[i].file_bytes : 0;
    if (json) {
      printf("{\"step\":%lld,\"name\":\"%s\",\"state\":\"%s\",\"latest\":%s,\"nranks\":%d,\"tensors\":%zu,"
             "\"raw_bytes\":%llu,\"file_bytes\":%llu,\"ratio\":%.4f,\"disk_bytes\":%llu}\n",
             (long long)s[i].step, s[i].name, state, s[i].latest ? "true" : "false", s[i].nranks, s[i].ntensors,
             (unsigned long long)s[i].raw_bytes, (unsigned long long)s[i].file_bytes, ratio,
             (unsigned long long)s[i].disk_bytes);
      continue;
    }
    char raw[32] = "-", file[32] = "-", disk[32], rs[16] = "-";
    if (s[i].valid) {
      human(s[i].raw_bytes, raw, sizeof raw);
      human(s[i].file_bytes, file, sizeof file);
      snprintf(rs, sizeof rs, "%.3f", ratio);
    }
    human(s[i].disk_bytes, disk, sizeof disk);
    char ranks[16] = "-", tensors[16] = "-";
    if (s[i].valid) {
      snprintf(ranks, sizeof ranks, "%d", s[i].nranks);
      snprintf(tensors, sizeof tensors, "%zu", s[i].ntensors);
    }
    printf("%-16s %-10s %5s %7s %11s %11s %6s %11s%s\n", s[i].name, state, ranks, tensors, raw, file, rs, disk,
           s[i].latest ? "  <- latest" : "");
  }
  if (!json && n == 0) printf("(no checkpoints in %s)\n", dir);
  free(s);
  return 0;
}

static int cmd_inspect(const char *arg, int json) {
  char sd[4096];
  if (resolve_step(arg, sd, sizeof sd) != 0) return 1;
  cJSON *o = NULL;
  if (ckpt_inspect(sd, &o) != NEWT_OK) {
    fprintf(stderr, "newt ckpt inspect: %s\n", newt_errmsg());
    return 1;
  }
  if (json) {
    char *t = cJSON_PrintUnformatted(o);
    printf("%s\n", t ? t : "{}");
    free(t);
    cJSON_Delete(o);
    return 0;
  }
  char a[32], b[32], c[32], when[64] = "?";
  human((uint64_t)cJSON_GetObjectItem(o, "raw_bytes")->valuedouble, a, sizeof a);
  human((uint64_t)cJSON_GetObjectItem(o, "stored_bytes")->valuedouble, b, sizeof b);
  human((uint64_t)cJSON_GetObjectItem(o, "file_bytes")->valuedouble, c, sizeof c);
  time_t secs = (time_t)(cJSON_GetObjectItem(o, "created_ms")->valuedouble / 1000);
  struct tm tm;
  if (localtime_r(&secs, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
  printf("checkpoint %s\n  step %.0f, committed %s, attempt %s\n", sd, cJSON_GetObjectItem(o, "step")->valuedouble,
         when, cJSON_GetObjectItem(o, "attempt")->valuestring);
  printf("  tensors hold %s, stored in %s (ratio %.3f), shard files %s\n", a, b,
         cJSON_GetObjectItem(o, "ratio")->valuedouble, c);
  const cJSON *ranks = cJSON_GetObjectItem(o, "ranks");
  printf("\nlayout: %d rank(s)\n", cJSON_GetArraySize(ranks));
  for (const cJSON *x = ranks->child; x; x = x->next) {
    char *lay = cJSON_PrintUnformatted(cJSON_GetObjectItem(x, "layout"));
    human((uint64_t)cJSON_GetObjectItem(x, "bytes")->valuedouble, a, sizeof a);
    human((uint64_t)cJSON_GetObjectItem(x, "raw_bytes")->valuedouble, b, sizeof b);
    printf("  rank %-4.0f %s  %s of %s  %s\n", cJSON_GetObjectItem(x, "rank")->valuedouble,
           cJSON_GetObjectItem(x, "file")->valuestring, a, b, lay ? lay : "");
    free(lay);
  }
  const cJSON *tensors = cJSON_GetObjectItem(o, "tensors");
  printf("\ntensors: %d\n  %-40s %-5s %-22s %6s %11s %11s %6s\n", cJSON_GetArraySize(tensors), "NAME", "DTYPE", "SHAPE",
         "CHUNKS", "RAW", "STORED", "RATIO");
  for (const cJSON *x = tensors->child; x; x = x->next) {
    char shape[64] = "";
    for (const cJSON *d = cJSON_GetObjectItem(x, "shape")->child; d; d = d->next)
      snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%.0f", shape[0] ? "x" : "", d->valuedouble);
    double raw = cJSON_GetObjectItem(x, "raw_bytes")->valuedouble, st = cJSON_GetObjectItem(x, "stored_bytes")->valuedouble;
    human((uint64_t)raw, a, sizeof a);
    human((uint64_t)st, b, sizeof b);
    printf("  %-40s %-5s %-22s %6.0f %11s %11s %6.3f\n", cJSON_GetObjectItem(x, "name")->valuestring,
           cJSON_GetObjectItem(x, "dtype")->valuestring, shape, cJSON_GetObjectItem(x, "chunks")->valuedouble, a, b,
           st > 0 ? raw / st : 1.0);
  }
  char *state = cJSON_Print(cJSON_GetObjectItem(o, "state"));
  printf("\ntraining state:\n%s\n", state ? state : "{}");
  free(state);
  cJSON_Delete(o);
  return 0;
}

static void print_problem(void *ctx, const char *msg) {
  (void)ctx;
  printf("FAIL %s\n", msg);
}

static int cmd_verify(const char *arg) {
  char sd[4096];
  if (resolve_step(arg, sd, sizeof sd) != 0) return 1;
  ckpt_verify_result vr;
  double t0 = newt_now_s();
  newt_result_t r = ckpt_verify(sd, print_problem, NULL, &vr);
  if (r != NEWT_OK) {
    printf("%s: %zu problem(s) in %zu chunk(s) of %zu file(s)\n", sd, vr.bad, vr.chunks, vr.files);
    return 1;
  }
  char a[32], b[32];
  human(vr.raw_bytes, a, sizeof a);
  human(vr.stored_bytes, b, sizeof b);
  printf("%s: ok, %zu chunk(s) in %zu file(s), %s stored, %s raw, every checksum verified (%.2f s)\n", sd, vr.chunks,
         vr.files, b, a, newt_now_s() - t0);
  return 0;
}

int newt_cmd_ckpt(int argc, char **argv) {
  static const char *synopsis = "ls DIR | inspect DIR/STEP | verify DIR/STEP [--json]";
  int json = 0;
  newt_opt opts[] = {{"json", NEWT_OPT_FLAG, &json, "print JSON (ls, inspect)"}, NEWT_OPT_END};
  char *pos[2];
  int npos = 0;
  int ex = newt_opts_exit(newt_opts_parse("ckpt", synopsis, opts, argc, argv, pos, 2, &npos));
  if (ex >= 0) return ex;
  if (npos != 2) {
    newt_opts_usage(stderr, "ckpt", synopsis, opts);
    return 2;
  }
  if (strcmp(pos[0], "ls") == 0) return cmd_ls(pos[1], json);
  if (strcmp(pos[0], "inspect") == 0) return cmd_inspect(pos[1], json);
  if (strcmp(pos[0], "verify") == 0) return cmd_verify(pos[1]);
  fprintf(stderr, "newt ckpt: unknown command \"%s\" (ls, inspect or verify)\n", pos[0]);
  return 2;
}
