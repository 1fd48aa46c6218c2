/* newt ckpt: the checkpoint tools.
 *
 *   newt ckpt ls DIR [--json]            steps, committed or not, sizes, ratio, the latest
 *   newt ckpt inspect DIR/STEP [--json]  layout, tensors (shape, dtype, sizes), ratio, state
 *   newt ckpt verify DIR/STEP            every checksum; exit status 1 on any problem
 *   newt ckpt sign DIR/STEP [--job-secret-file F]
 *                                        adopts a step: every checksum verified, then its
 *                                        MANIFEST proved with the secret's key (default: the
 *                                        directory's own job.secret, made when missing)
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
#include "common/secret.h"
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

/* `inspect --json`: the description as one JSON object (the fields and their order are
 * what this command has always printed). */
static void print_info_json(const ckpt_info *in) {
  cJSON *o = cJSON_CreateObject(), *ranks, *tensors;
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)in->attempt);
  cJSON_AddStringToObject(o, "path", in->path);
  newt_json_add_int(o, "step", in->step);
  newt_json_add_int(o, "nranks", in->nranks);
  cJSON_AddStringToObject(o, "attempt", hex);
  newt_json_add_int(o, "created_ms", (int64_t)in->created_ms);
  cJSON_AddItemToObject(o, "ranks", ranks = cJSON_CreateArray());
  for (size_t f = 0; f < in->nfiles; f++) {
    const ckpt_info_file *x = &in->files[f];
    cJSON *j = cJSON_CreateObject();
    newt_json_add_int(j, "rank", x->rank);
    cJSON_AddStringToObject(j, "file", x->name);
    newt_json_add_int(j, "bytes", (int64_t)x->bytes);
    newt_json_add_int(j, "raw_bytes", (int64_t)x->raw_bytes);
    cJSON_AddItemToObject(j, "layout", ckpt_layout_json(&x->layout));
    cJSON_AddItemToArray(ranks, j);
  }
  cJSON_AddItemToObject(o, "tensors", tensors = cJSON_CreateArray());
  for (size_t i = 0; i < in->ntensors; i++) {
    const ckpt_info_tensor *t = &in->tensors[i];
    cJSON *j = cJSON_CreateObject(), *shape;
    cJSON_AddStringToObject(j, "name", t->name);
    cJSON_AddStringToObject(j, "dtype", newt_dtype_name(t->dtype));
    cJSON_AddItemToObject(j, "shape", shape = cJSON_CreateArray());
    for (int k = 0; k < t->ndim; k++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[k]));
    newt_json_add_int(j, "chunks", (int64_t)t->chunks);
    newt_json_add_int(j, "raw_bytes", (int64_t)t->raw_bytes);
    newt_json_add_int(j, "stored_bytes", (int64_t)t->stored_bytes);
    cJSON_AddItemToArray(tensors, j);
  }
  newt_json_add_int(o, "raw_bytes", (int64_t)in->raw_bytes);
  newt_json_add_int(o, "stored_bytes", (int64_t)in->stored_bytes);
  newt_json_add_int(o, "file_bytes", (int64_t)in->file_bytes);
  cJSON_AddNumberToObject(o, "ratio", in->ratio);
  cJSON_AddItemReferenceToObject(o, "state", in->state); /* printed, not copied */
  char *t = cJSON_PrintUnformatted(o);
  printf("%s\n", t ? t : "{}");
  free(t);
  cJSON_Delete(o);
}

static void print_ranks(const ckpt_info *in) {
  char a[32], b[32];
  printf("\nlayout: %zu rank(s)\n", in->nfiles);
  for (size_t f = 0; f < in->nfiles; f++) {
    const ckpt_info_file *x = &in->files[f];
    cJSON *lj = ckpt_layout_json(&x->layout);
    char *lay = lj ? cJSON_PrintUnformatted(lj) : NULL;
    human(x->bytes, a, sizeof a);
    human(x->raw_bytes, b, sizeof b);
    printf("  rank %-4d %s  %s of %s  %s\n", x->rank, x->name, a, b, lay ? lay : "");
    free(lay);
    cJSON_Delete(lj);
  }
}

static void print_tensors(const ckpt_info *in) {
  char a[32], b[32];
  printf("\ntensors: %zu\n  %-40s %-5s %-22s %6s %11s %11s %6s\n", in->ntensors, "NAME", "DTYPE", "SHAPE", "CHUNKS",
         "RAW", "STORED", "RATIO");
  for (size_t i = 0; i < in->ntensors; i++) {
    const ckpt_info_tensor *t = &in->tensors[i];
    char shape[64] = "";
    for (int k = 0; k < t->ndim; k++)
      snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", shape[0] ? "x" : "",
               (long long)t->shape[k]);
    double raw = (double)t->raw_bytes, st = (double)t->stored_bytes;
    human(t->raw_bytes, a, sizeof a);
    human(t->stored_bytes, b, sizeof b);
    printf("  %-40s %-5s %-22s %6zu %11s %11s %6.3f\n", t->name, newt_dtype_name(t->dtype), shape, t->chunks, a, b,
           st > 0 ? raw / st : 1.0);
  }
}

static int cmd_inspect(const char *arg, int json) {
  char sd[4096];
  if (resolve_step(arg, sd, sizeof sd) != 0) return 1;
  ckpt_info in;
  if (ckpt_inspect(sd, &in) != NEWT_OK) {
    fprintf(stderr, "newt ckpt inspect: %s\n", newt_errmsg());
    return 1;
  }
  if (json) {
    print_info_json(&in);
    ckpt_info_free(&in);
    return 0;
  }
  char a[32], b[32], c[32], when[64] = "?";
  human(in.raw_bytes, a, sizeof a);
  human(in.stored_bytes, b, sizeof b);
  human(in.file_bytes, c, sizeof c);
  time_t secs = (time_t)(in.created_ms / 1000);
  struct tm tm;
  if (localtime_r(&secs, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
  printf("checkpoint %s\n  step %lld, committed %s, attempt %016llx\n", sd, (long long)in.step, when,
         (unsigned long long)in.attempt);
  printf("  tensors hold %s, stored in %s (ratio %.3f), shard files %s\n", a, b, in.ratio, c);
  print_ranks(&in);
  print_tensors(&in);
  char *state = cJSON_Print(in.state);
  printf("\ntraining state:\n%s\n", state ? state : "{}");
  free(state);
  ckpt_info_free(&in);
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

/* A step one trusts, adopted by a job with a key (docs/ckpt.md, "Whose checkpoint"). */
static int cmd_sign(const char *arg, const char *secret_file) {
  char sd[4096], dir[4096];
  if (resolve_step(arg, sd, sizeof sd) != 0) return 1;
  newt_fs_dirname(sd, dir, sizeof dir);
  unsigned char *secret = NULL;
  size_t len = 0;
  ckpt_key key;
  newt_result_t r = secret_file ? newt_secret_read(secret_file, &secret, &len) : newt_secret_in_dir(dir, 1, &secret, &len);
  if (r == NEWT_OK) r = ckpt_key_of_secret(&key, secret, len);
  newt_secret_free(secret, len);
  if (r == NEWT_OK) r = ckpt_sign(sd, &key);
  memset(&key, 0, sizeof key);
  if (r != NEWT_OK) {
    fprintf(stderr, "newt ckpt sign: %s\n", newt_errmsg());
    return 1;
  }
  printf("%s: every checksum verified; its MANIFEST is proved with the key of %s%s\n", sd,
         secret_file ? secret_file : dir, secret_file ? "" : "/job.secret");
  return 0;
}

int newt_cmd_ckpt(int argc, char **argv) {
  static const char *synopsis = "ls DIR | inspect DIR/STEP | verify DIR/STEP | sign DIR/STEP [--json] [--job-secret-file F]";
  int json = 0;
  const char *secret_file = NULL;
  newt_opt opts[] = {{"json", NEWT_OPT_FLAG, &json, "print JSON (ls, inspect)"},
                     {"job-secret-file", NEWT_OPT_STR, &secret_file,
                      "sign: the job secret whose key proves the step (default: the directory's own job.secret)"},
                     NEWT_OPT_END};
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
  if (strcmp(pos[0], "sign") == 0) return cmd_sign(pos[1], secret_file);
  fprintf(stderr, "newt ckpt: unknown command \"%s\" (ls, inspect, verify or sign)\n", pos[0]);
  return 2;
}
