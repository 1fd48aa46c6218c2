/* Helpers the checkpoint tests share: a small deterministic training state (weights and
 * AdamW moments whose values depend on the step), saving it with one saver, and loading
 * it back and comparing bit for bit. Header-only; each test includes it once. */
#ifndef NEWT_TESTS_CKPT_UTIL_H
#define NEWT_TESTS_CKPT_UTIL_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "ckpt/internal.h"
#include "common/fs.h"
#include "test.h"

#define TS_MAX 16

typedef struct tstate {
  size_t n;
  newt_tensor_desc t[TS_MAX];
  char names[TS_MAX][48];
  void *data[TS_MAX];
  size_t bytes[TS_MAX];
} tstate;

static inline uint64_t ts_mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

static inline void ts_add(tstate *s, const char *name, newt_dtype dt, int nd, int64_t a, int64_t b, uint64_t seed,
                   int noise) {
  size_t i = s->n++;
  snprintf(s->names[i], sizeof s->names[i], "%s", name);
  s->t[i] = (newt_tensor_desc){.name = s->names[i], .dtype = dt, .ndim = nd, .shape = {a, b}};
  size_t n = (size_t)newt_shape_numel(nd, s->t[i].shape), es = newt_dtype_size(dt);
  s->bytes[i] = n * es;
  s->data[i] = malloc(s->bytes[i] ? s->bytes[i] : 1);
  uint8_t *p = s->data[i];
  for (size_t k = 0; k < n; k++) {
    uint64_t r = ts_mix(seed * 1000003 + i * 7919 + k);
    if (noise || dt != NEWT_F32) {
      memcpy(p + k * es, &r, es);
    } else {
      float f = 0.02f * ((float)(r % 4001) - 2000.0f) / 2000.0f;
      memcpy(p + k * es, &f, 4);
    }
  }
}

/* The state at `step`: the values change with the step. scale multiplies the sizes;
 * noise = 1 makes the float data incompressible. */
static inline void ts_make(tstate *s, int64_t step, int64_t scale, int noise) {
  memset(s, 0, sizeof *s);
  ts_add(s, "wte", NEWT_F32, 2, 97 * scale, 16, (uint64_t)step, noise);
  ts_add(s, "h.0.attn.qkv.w", NEWT_F32, 2, 48, 16 * scale, (uint64_t)step, noise);
  ts_add(s, "h.0.ln1.b", NEWT_F32, 1, 16, 0, (uint64_t)step, noise);
  ts_add(s, "adam.m/wte", NEWT_F32, 2, 97 * scale, 16, (uint64_t)step + 100, noise);
  ts_add(s, "adam.v/wte", NEWT_F32, 2, 97 * scale, 16, (uint64_t)step + 200, noise);
  ts_add(s, "emb.bf16", NEWT_BF16, 2, 33, 7, (uint64_t)step, noise);
  ts_add(s, "counts", NEWT_I64, 1, 5, 0, (uint64_t)step, noise);
  ts_add(s, "empty", NEWT_F32, 2, 0, 4, (uint64_t)step, noise);
}

static inline void ts_free(tstate *s) {
  for (size_t i = 0; i < s->n; i++) free(s->data[i]);
  memset(s, 0, sizeof *s);
}

static inline size_t ts_bytes(const tstate *s) {
  size_t b = 0;
  for (size_t i = 0; i < s->n; i++) b += s->bytes[i];
  return b;
}

static inline void ts_state_json(int64_t step, char *out, size_t cap) {
  snprintf(out, cap, "{\"step\":%lld,\"cursor\":{\"shard\":0,\"pos\":%lld},\"rng\":\"%016llx\",\"lr_step\":%lld}",
           (long long)step, (long long)step * 64, (unsigned long long)ts_mix((uint64_t)step), (long long)step);
}

/* The training state of `step` as a saver takes it (cJSON_Delete it). */
static inline cJSON *ts_state(int64_t step) {
  char js[256];
  ts_state_json(step, js, sizeof js);
  cJSON *o = cJSON_Parse(js);
  if (!o) abort();
  return o;
}

/* Ends a begun save with the training state of `step`. */
static inline newt_result_t ts_save_end(ckpt_saver *sv, int64_t step) {
  cJSON *st = ts_state(step);
  newt_result_t r = ckpt_save_end(sv, st);
  cJSON_Delete(st);
  return r;
}

/* Adds the whole state to a begun save and ends it. */
static inline newt_result_t ts_save_into(ckpt_saver *sv, const tstate *s, int64_t step) {
  for (size_t i = 0; i < s->n; i++) NEWT_CHECK(ckpt_save_add(sv, &s->t[i], NULL, s->data[i]));
  return ts_save_end(sv, step);
}

/* One rank saves the state of `step` synchronously and commits it. */
static inline newt_result_t ts_save(const char *dir, int64_t step, int64_t scale, int noise, size_t chunk) {
  ckpt_saver_opts o = {.dir = dir, .rank = 0, .nranks = 1, .threads = 2, .level = 3, .chunk_bytes = chunk,
                       .commit = 1, .keep = 10};
  ckpt_saver *sv;
  NEWT_CHECK(ckpt_saver_init(&sv, &o));
  tstate s;
  ts_make(&s, step, scale, noise);
  int started = 0;
  newt_result_t r = ckpt_save_begin(sv, step, 0, &started);
  if (r == NEWT_OK) r = ts_save_into(sv, &s, step);
  ts_free(&s);
  ckpt_saver_free(sv);
  return r;
}

/* Loads the newest usable checkpoint (<= max_step) and checks that it is the state of
 * `want_step` exactly; returns the loaded step (-1 on failure). */
static inline int64_t ts_load_check(const char *dir, int64_t max_step, int64_t want_step, int64_t scale, int noise,
                             int *fallbacks) {
  tstate want;
  ts_make(&want, want_step, scale, noise);
  ckpt_request reqs[TS_MAX];
  for (size_t i = 0; i < want.n; i++) {
    reqs[i] = (ckpt_request){.t = want.t[i], .out = malloc(want.bytes[i] ? want.bytes[i] : 1)};
    newt_slice_whole(&reqs[i].slice, &want.t[i]);
  }
  /* the empty tensor has no slice to ask for */
  size_t nreq = want.n - 1;
  ckpt_loaded ld;
  int64_t got = -1;
  newt_result_t r = ckpt_load(dir, max_step, 2, reqs, nreq, &ld);
  T_CHECK_MSG(r == NEWT_OK, "load %s: %s", dir, newt_errmsg());
  if (r == NEWT_OK) {
    got = ld.step;
    if (fallbacks) *fallbacks = ld.fallbacks;
    T_CHECK_MSG(ld.step == want_step, "loaded step %lld, expected %lld", (long long)ld.step, (long long)want_step);
    char js[256], *have = cJSON_PrintUnformatted(ld.state);
    ts_state_json(want_step, js, sizeof js);
    T_CHECK_MSG(have && strcmp(have, js) == 0, "state %s, expected %s", have ? have : "(none)", js);
    for (size_t i = 0; i < nreq && ld.step == want_step; i++)
      T_CHECK_MSG(memcmp(reqs[i].out, want.data[i], want.bytes[i]) == 0, "tensor %s differs", want.names[i]);
    free(have);
    cJSON_Delete(ld.state);
  }
  for (size_t i = 0; i < want.n; i++) free(reqs[i].out);
  ts_free(&want);
  return got;
}

/* A saver with options o, and the begun save of the state of `step` in s (not ended). */
static inline ckpt_saver *ts_begin(const ckpt_saver_opts *o, tstate *s, int64_t step, int64_t scale, int noise,
                                   int async) {
  ckpt_saver *sv = NULL;
  T_OK(ckpt_saver_init(&sv, o));
  if (!sv) exit(1);
  ts_make(s, step, scale, noise);
  int started = 0;
  T_OK(ckpt_save_begin(sv, step, async, &started));
  T_CHECK(started);
  return sv;
}

/* Runs `$NEWT_BIN <args>`; returns its exit status, its output (stdout and stderr) in out. */
static inline int ts_run_newt(const char *args, char *out, size_t cap) {
  const char *bin = getenv("NEWT_BIN");
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s %s 2>&1", bin ? bin : "newt", args);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static inline void ts_tmpdir(char *out, size_t cap, const char *base, const char *name) {
  snprintf(out, cap, "%s/newt-test-%s-XXXXXX", base, name);
  if (!mkdtemp(out)) {
    perror("mkdtemp");
    exit(1);
  }
}

/* Mounts a tmpfs of `size` ("2m") at path (made here), a real disk that fills up: 1, or 0
 * with the test failed (it needs root; it does not skip). */
static inline int ts_mount_tmpfs(const char *path, const char *size) {
  char opts[64];
  snprintf(opts, sizeof opts, "size=%s", size);
  T_CHECK(mkdir(path, 0755) == 0);
  int m = mount("tmpfs", path, "tmpfs", 0, opts);
  T_CHECK_MSG(m == 0, "cannot mount a tmpfs on %s: %s (the test needs root; it does not skip)", path, strerror(errno));
  return m == 0;
}

static inline void ts_umount(const char *path) {
  if (umount(path) != 0) {
    T_FAIL("umount %s: %s", path, strerror(errno));
    umount2(path, MNT_DETACH);
  }
  rmdir(path);
}

/* Frames a manifest's JSON body with a correct header line, as a forger (or a buggy
 * writer) would: malloc'd, *len bytes. */
static inline char *ts_frame(const char *body, size_t *len) {
  size_t bl = strlen(body);
  char *out = malloc(bl + 128);
  if (!out) abort();
  int hl = sprintf(out, "newt-ckpt manifest 1 %zu %016llx\n", bl, (unsigned long long)ckpt_hash(body, bl));
  memcpy(out + hl, body, bl + 1);
  *len = (size_t)hl + bl;
  return out;
}

/* The hostile manifest of issue 17: a few hundred bytes describing one u8 tensor of shape
 * [rows, 2] stored as column boxes [rows, 1] (raw chunks of rows bytes each): ncols = 1
 * leaves the second column uncovered, ncols = 2 is a valid manifest. Framed, malloc'd. */
static inline char *ts_hostile_manifest(int64_t step, int64_t rows, int ncols, size_t *len) {
  char body[2048], chunks[1024] = "";
  for (int c = 0; c < ncols; c++)
    snprintf(chunks + strlen(chunks), sizeof chunks - strlen(chunks),
             "%s{\"file\":0,\"offset\":%lld,\"stored\":%lld,\"raw\":%lld,\"codec\":\"raw\",\"filter\":\"none\","
             "\"xxh_raw\":\"0000000000000000\",\"xxh_stored\":\"0000000000000000\",\"box_offset\":[0,%d],"
             "\"box_shape\":[%lld,1],\"begin\":0,\"end\":%lld}",
             c ? "," : "", (long long)(4096 + c * (rows + 4096)), (long long)rows, (long long)rows, c,
             (long long)rows, (long long)rows);
  snprintf(body, sizeof body,
           "{\"format\":\"newt-ckpt\",\"version\":1,\"kind\":\"manifest\",\"step\":%lld,\"nranks\":1,"
           "\"attempt\":\"0000000000000001\",\"created_ms\":0,\"files\":[{\"name\":"
           "\"rank-00000-0000000000000001.shard\",\"rank\":0,\"bytes\":%lld,\"raw_bytes\":%lld}],"
           "\"tensors\":[{\"name\":\"x\",\"dtype\":\"u8\",\"shape\":[%lld,2],\"chunks\":[%s]}],\"state\":{}}",
           (long long)step, (long long)(2 * (rows + 8192)), (long long)(ncols * rows), (long long)rows, chunks);
  return ts_frame(body, len);
}

#endif
