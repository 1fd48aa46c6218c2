/* Checkpoints of the previous release read back whole through the typed reader, and what this
 * release writes is what that release wrote.
 *
 * fixtures/ckpt-v1 was written by the code of af82baa, the last that handed layouts and
 * training states to the saver as JSON text (fixtures/README.md has the program): step 3 as
 * `newt train` writes one (one rank), step 7 as a job's two workers do (a box of rows, a flat
 * range as ZeRO cuts it, whole tensors), the tensors' values ts_make's. fixtures/inspect-<N>.txt
 * and .json are what that release's `newt ckpt inspect [--json]` printed of step N (TZ=UTC,
 * the checkpoint directory written @DIR@).
 *
 *   - every field of the old manifests and indexes, as the typed reader gets it;
 *   - the old tensors load bit for bit, with their training state;
 *   - ckpt_inspect's fields, and `newt ckpt inspect [--json]` printing byte for byte what the
 *     old one did;
 *   - the old manifests and indexes, decoded and encoded again, are the same bytes;
 *   - step 7 written again through the typed API (ckpt_layout, a built state): its manifest has
 *     the old one's fields and values, but for when, where the chunks landed in the shards and
 *     how the compressor stored them. */
#include <fcntl.h>

#include "ckpt/internal.h"
#include "ckpt_util.h"
#include "common/json.h"

static char fixture[600], root[256];

static void step_path(char *out, size_t cap, int64_t step, const char *file) {
  snprintf(out, cap, "%s/step-%010lld%s%s", fixture, (long long)step, file ? "/" : "", file ? file : "");
}

static void load(int64_t step, const char *file, int index, ckpt_manifest *m) {
  char path[800];
  step_path(path, sizeof path, step, file);
  T_OK(ckpt_manifest_load(AT_FDCWD, NULL, path, index, m));
}

static void check_layout(const ckpt_layout *l, unsigned has, int64_t dp, int64_t zero, int64_t rank) {
  T_CHECK_MSG(l->has == has && l->dp == dp && l->tp == 1 && l->pp == 1 && l->zero == zero,
              "layout has 0x%x dp %lld tp %lld pp %lld zero %lld", l->has, (long long)l->dp, (long long)l->tp,
              (long long)l->pp, (long long)l->zero);
  if (has & CKPT_LAYOUT_RANK) T_CHECK(l->rank == rank && l->generation == 7);
}

static void check_file(const ckpt_file *f, const char *name, int rank, uint64_t bytes, uint64_t raw) {
  T_CHECK_MSG(strcmp(f->name, name) == 0 && f->rank == rank && f->bytes == bytes && f->raw_bytes == raw,
              "file %s rank %d, %llu bytes, %llu raw", f->name, f->rank, (unsigned long long)f->bytes,
              (unsigned long long)f->raw_bytes);
}

static int64_t num(const cJSON *o, const char *path) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s", path);
  const cJSON *it = o;
  for (char *s = buf, *dot; it && s; s = dot ? dot + 1 : NULL) {
    dot = strchr(s, '.');
    if (dot) *dot = '\0';
    it = cJSON_GetObjectItemCaseSensitive(it, s);
  }
  return cJSON_IsNumber(it) ? (int64_t)it->valuedouble : INT64_MIN;
}

/* The state of step 7 (the worker's fields, then the program's) and of step 3 (newt train's). */
static void check_state7(const cJSON *s) {
  T_CHECK(num(s, "step") == 7 && num(s, "cursor") == 448);
  T_CHECK(cJSON_GetObjectItem(s, "lr")->valuedouble == 0.00025);
  const cJSON *p = cJSON_GetObjectItem(s, "program");
  T_CHECK(strcmp(cJSON_GetObjectItem(p, "name")->valuestring, "mlp") == 0);
  T_CHECK(cJSON_GetObjectItem(p, "loss")->valuedouble == 2.5 && cJSON_IsTrue(cJSON_GetObjectItem(p, "ok")));
  T_CHECK(cJSON_IsNull(cJSON_GetObjectItem(p, "none")) && cJSON_GetArraySize(cJSON_GetObjectItem(p, "tags")) == 2);
  T_CHECK(cJSON_GetObjectItem(p, "big")->valuedouble == 12345678901234567.0);
}

static void check_state3(const cJSON *s) {
  T_CHECK(num(s, "step") == 3 && num(s, "cursor") == 24 && num(s, "adam_t") == 3);
  T_CHECK(num(s, "rng.seed") == 1 && num(s, "rng.data_seed") == 1);
  T_CHECK(num(s, "config.model.vocab") == 256 && num(s, "config.model.ctx") == 64 &&
          num(s, "config.model.layers") == 4 && num(s, "config.model.heads") == 4 &&
          num(s, "config.model.channels") == 128);
  T_CHECK(num(s, "config.batch") == 8 && num(s, "config.seq_len") == 64 && num(s, "config.optim.steps") == 100);
  T_CHECK(strcmp(cJSON_GetObjectItem(cJSON_GetObjectItem(s, "config"), "data")->valuestring, "generated") == 0);
}

/* One chunk's slice: its file, box and range. */
static void check_chunk(const ckpt_tensor *t, size_t j, uint32_t file, int64_t row0, int64_t rows, int64_t begin,
                        int64_t end) {
  T_CHECK_MSG(j < t->nchunks, "%s: %zu chunks", t->name, t->nchunks);
  if (j >= t->nchunks) return;
  const ckpt_chunk *c = &t->chunks[j];
  T_CHECK_MSG(c->file == file && c->slice.offset[0] == row0 && c->slice.shape[0] == rows && c->slice.begin == begin &&
                  c->slice.end == end && c->raw == (uint64_t)(end - begin) * 4 && c->codec == CKPT_CODEC_ZSTD,
              "%s chunk %zu: file %u, rows %lld+%lld, [%lld, %lld)", t->name, j, c->file,
              (long long)c->slice.offset[0], (long long)c->slice.shape[0], (long long)c->slice.begin,
              (long long)c->slice.end);
}

static void test_old_manifests(void) {
  static const char *names[] = {"adam.m/wte", "adam.v/wte", "counts", "emb.bf16", "empty", "h.0.attn.qkv.w",
                                "h.0.ln1.b", "wte"};
  ckpt_manifest m;
  load(7, "MANIFEST", 0, &m);
  T_CHECK(m.step == 7 && m.nranks == 2 && m.attempt == 7 && m.created_ms == 1796513451189ULL && m.nfiles == 2);
  if (m.nfiles == 2) {
    check_file(&m.files[0], "rank-00000-0000000000000007.shard", 0, 20480, 12552);
    check_file(&m.files[1], "rank-00001-0000000000000007.shard", 1, 16384, 9710);
    check_layout(&m.files[0].layout, CKPT_LAYOUT_ALL, 2, 1, 0);
    check_layout(&m.files[1].layout, CKPT_LAYOUT_ALL, 2, 1, 1);
  }
  T_CHECK(m.ntensors == 8);
  for (size_t i = 0; i < m.ntensors && i < 8; i++) T_CHECK(strcmp(m.tensors[i].name, names[i]) == 0);
  const ckpt_tensor *t = ckpt_manifest_find(&m, "wte"); /* a box of rows on each rank */
  T_CHECK(t && t->dtype == NEWT_F32 && t->ndim == 2 && t->shape[0] == 97 && t->shape[1] == 16);
  if (t) check_chunk(t, 0, 0, 0, 49, 0, 784), check_chunk(t, 1, 1, 49, 48, 0, 768);
  t = ckpt_manifest_find(&m, "adam.m/wte"); /* a flat range on each */
  if (t) check_chunk(t, 0, 0, 0, 97, 0, 776), check_chunk(t, 1, 1, 0, 97, 776, 1552);
  t = ckpt_manifest_find(&m, "emb.bf16");
  T_CHECK(t && t->dtype == NEWT_BF16 && t->nchunks == 1 && t->chunks[0].file == 1);
  t = ckpt_manifest_find(&m, "empty");
  T_CHECK(t && t->nchunks == 0 && t->shape[0] == 0 && t->shape[1] == 4);
  check_state7(m.state);
  ckpt_manifest_free(&m);

  load(7, "rank-00001.index", 1, &m);
  T_CHECK(m.is_index && m.rank == 1 && m.nranks == 2 && m.step == 7 && m.nfiles == 1 && m.ntensors == 5);
  if (m.nfiles == 1) check_layout(&m.files[0].layout, CKPT_LAYOUT_ALL, 2, 1, 1);
  ckpt_manifest_free(&m);

  load(3, "MANIFEST", 0, &m);
  T_CHECK(m.step == 3 && m.nranks == 1 && m.attempt == 0x0123456789abcdefULL && m.nfiles == 1 && m.ntensors == 8);
  if (m.nfiles == 1) {
    check_file(&m.files[0], "rank-00000-0123456789abcdef.shard", 0, 28672, 22262);
    check_layout(&m.files[0].layout, CKPT_LAYOUT_SHAPE, 1, 0, 0); /* newt train's: no rank, no generation */
  }
  check_state3(m.state);
  ckpt_manifest_free(&m);
}

/* Loads every tensor of the newest step <= max_step and compares it with ts_make's. */
static void check_load(int64_t max_step, int64_t want) {
  tstate s;
  ts_make(&s, want, 1, 0);
  ckpt_request reqs[TS_MAX];
  size_t n = s.n - 1; /* "empty" has no slice to ask for */
  for (size_t i = 0; i < n; i++) {
    reqs[i] = (ckpt_request){.t = s.t[i], .out = calloc(1, s.bytes[i])};
    newt_slice_whole(&reqs[i].slice, &s.t[i]);
  }
  ckpt_loaded ld;
  T_OK(ckpt_load(fixture, max_step, 2, reqs, n, &ld));
  T_CHECK(ld.step == want && ld.fallbacks == 0 && ld.committed == 1);
  for (size_t i = 0; i < n; i++) {
    T_CHECK_MSG(memcmp(reqs[i].out, s.data[i], s.bytes[i]) == 0, "step %lld: %s differs", (long long)want, s.names[i]);
    free(reqs[i].out);
  }
  if (ld.state) (want == 7 ? check_state7 : check_state3)(ld.state);
  cJSON_Delete(ld.state);
  ts_free(&s);
}

static void test_old_tensors(void) {
  check_load(CKPT_LATEST, 7);
  check_load(6, 3);
  char sd[800];
  step_path(sd, sizeof sd, 7, NULL);
  ckpt_verify_result vr;
  T_OK(ckpt_verify(sd, NULL, NULL, &vr));
  T_CHECK(vr.files == 2 && vr.chunks == 10 && vr.bad == 0);
}

/* `newt ckpt inspect [--json] <fixture>/<step>` prints `golden` byte for byte (with @DIR@ for
 * the fixture's path). */
static void check_cli(int64_t step, int json) {
  static char out[1 << 16], want[1 << 16];
  char args[900], golden[800];
  snprintf(args, sizeof args, "ckpt inspect %s%s/%lld", json ? "--json " : "", fixture, (long long)step);
  snprintf(golden, sizeof golden, "%s/tests/ckpt/fixtures/inspect-%lld.%s", getenv("NEWT_SOURCE_DIR"),
           (long long)step, json ? "json" : "txt");
  int rc = ts_run_newt(args, out, sizeof out);
  char *text = NULL;
  size_t len = 0;
  T_OK(newt_fs_read_all(golden, sizeof want - 1024, &text, &len));
  want[0] = '\0';
  for (char *p = text, *at; p && *p; p = at ? at + 5 : NULL) { /* @DIR@ -> the fixture */
    at = strstr(p, "@DIR@");
    snprintf(want + strlen(want), sizeof want - strlen(want), "%.*s%s", (int)(at ? at - p : (long)strlen(p)), p,
             at ? fixture : "");
  }
  free(text);
  T_CHECK_MSG(rc == 0 && strcmp(out, want) == 0, "newt %s: exit %d, printed\n%s\nwhere the previous release printed\n%s",
              args, rc, out, want);
}

static void test_old_inspect(void) {
  char sd[800];
  step_path(sd, sizeof sd, 7, NULL);
  ckpt_info in;
  T_OK(ckpt_inspect(sd, &in));
  T_CHECK(strcmp(in.path, sd) == 0 && in.step == 7 && in.nranks == 2 && in.attempt == 7 &&
          in.created_ms == 1796513451189ULL);
  T_CHECK(in.nfiles == 2 && in.ntensors == 8 && in.file_bytes == 20480 + 16384 && in.raw_bytes == 12552 + 9710);
  T_CHECK(in.stored_bytes > 0 && in.ratio == (double)in.raw_bytes / (double)in.stored_bytes);
  if (in.nfiles == 2) {
    T_CHECK(in.files[1].rank == 1 && strcmp(in.files[1].name, "rank-00001-0000000000000007.shard") == 0);
    T_CHECK(in.files[1].bytes == 16384 && in.files[1].raw_bytes == 9710);
    check_layout(&in.files[1].layout, CKPT_LAYOUT_ALL, 2, 1, 1);
  }
  if (in.ntensors == 8) {
    const ckpt_info_tensor *t = &in.tensors[7];
    T_CHECK(strcmp(t->name, "wte") == 0 && t->dtype == NEWT_F32 && t->ndim == 2 && t->shape[0] == 97);
    T_CHECK(t->chunks == 2 && t->raw_bytes == 97 * 16 * 4 && t->stored_bytes < t->raw_bytes);
  }
  check_state7(in.state);
  ckpt_info_free(&in);
  setenv("TZ", "UTC", 1); /* the golden's time of the commit */
  for (int json = 0; json < 2; json++) check_cli(3, json), check_cli(7, json);
}

/* Decoded, then encoded by this release: the same bytes as the file. */
static void check_reencode(int64_t step, const char *file, int index) {
  char path[800], *old = NULL, *text = NULL;
  size_t olen = 0, len = 0;
  step_path(path, sizeof path, step, file);
  T_OK(newt_fs_read_all(path, CKPT_MAX_MANIFEST, &old, &olen));
  ckpt_manifest m;
  T_OK(ckpt_manifest_decode(old, olen, path, index, &m));
  T_OK(ckpt_manifest_encode(&m, &text, &len));
  T_CHECK_MSG(text && len == olen && memcmp(text, old, len) == 0, "%s encodes to\n%s\nnot\n%s", path, text ? text : "",
              old ? old : "");
  ckpt_manifest_free(&m);
  free(text);
  free(old);
}

static void test_reencode(void) {
  check_reencode(3, "MANIFEST", 0);
  check_reencode(3, "rank-00000.index", 1);
  check_reencode(7, "MANIFEST", 0);
  check_reencode(7, "rank-00000.index", 1);
  check_reencode(7, "rank-00001.index", 1);
}

/* ---- step 7 written again, through the typed API -------------------------------------------- */

static newt_result_t put(ckpt_saver *sv, const tstate *s, size_t i, const newt_slice *sl) {
  size_t es = newt_dtype_size(s->t[i].dtype);
  const uint8_t *p = s->data[i];
  if (sl) p += (size_t)(sl->offset[0] * (s->t[i].ndim == 2 ? s->t[i].shape[1] : 1) + sl->begin) * es;
  return ckpt_save_add(sv, &s->t[i], sl, p);
}

/* The state the fixture's rank 0 stored, built as the worker builds one. */
static cJSON *state7(void) {
  cJSON *o = cJSON_CreateObject(), *p = cJSON_CreateObject(), *tags = cJSON_CreateArray();
  newt_json_add_int(o, "step", 7);
  newt_json_add_int(o, "cursor", 448);
  cJSON_AddNumberToObject(o, "lr", 0.00025);
  cJSON_AddItemToObject(o, "program", p);
  cJSON_AddStringToObject(p, "name", "mlp");
  cJSON_AddNumberToObject(p, "loss", 2.5);
  cJSON_AddItemToArray(tags, cJSON_CreateString("a"));
  cJSON_AddItemToArray(tags, cJSON_CreateString("b"));
  cJSON_AddItemToObject(p, "tags", tags);
  cJSON_AddTrueToObject(p, "ok");
  cJSON_AddNullToObject(p, "none");
  cJSON_AddNumberToObject(p, "big", 12345678901234567.0);
  return o;
}

static void save_rank7(const char *dir, int rank) {
  ckpt_saver_opts o = {.dir = dir, .rank = rank, .nranks = 2, .threads = 2, .level = 1, .chunk_bytes = 4096,
                       .commit = rank == 0, .keep = 10, .attempt = 7, .writer = "job fixture",
                       .layout = {.has = CKPT_LAYOUT_ALL, .dp = 2, .tp = 1, .pp = 1, .zero = 1, .rank = rank,
                                  .generation = 7}};
  ckpt_saver *sv = NULL;
  T_OK(ckpt_saver_init(&sv, &o));
  if (!sv) return;
  tstate s;
  ts_make(&s, 7, 1, 0);
  int go = 0;
  T_OK(ckpt_save_begin(sv, 7, 0, &go));
  newt_slice rows, flat;
  newt_slice_box(&rows, 2, (int64_t[]){rank ? 49 : 0, 0}, (int64_t[]){rank ? 48 : 49, 16});
  newt_slice_whole(&flat, &s.t[3]);
  flat.begin = rank ? 776 : 0;
  flat.end = rank ? 1552 : 776;
  T_OK(put(sv, &s, 0, &rows));
  T_OK(put(sv, &s, 3, &flat));
  for (size_t i = 0; i < s.n; i++)
    if (i != 0 && i != 3 && (int)(i % 2) == rank) T_OK(put(sv, &s, i, NULL));
  cJSON *state = rank ? NULL : state7();
  T_OK(ckpt_save_end(sv, state));
  cJSON_Delete(state);
  ckpt_saver_free(sv);
  ts_free(&s);
}

/* A manifest's JSON, less what depends on the moment, on the order the compression threads
 * wrote their blocks in and on the libzstd at hand: created_ms, the shards' sizes, the chunks'
 * offsets and how they are stored (codec, filter, stored bytes and their checksum). */
static cJSON *manifest_fields(const char *path) {
  static const char *const stored_fields[] = {"offset", "codec", "filter", "stored", "xxh_stored", NULL};
  char *text = NULL;
  size_t len = 0;
  T_OK(newt_fs_read_all(path, CKPT_MAX_MANIFEST, &text, &len));
  char *body = text ? strchr(text, '\n') : NULL;
  cJSON *o = body ? cJSON_Parse(body + 1) : NULL;
  free(text);
  T_CHECK_MSG(o != NULL, "%s: no JSON", path);
  if (!o) return NULL;
  cJSON_DeleteItemFromObject(o, "created_ms");
  for (cJSON *f = cJSON_GetObjectItem(o, "files")->child; f; f = f->next) cJSON_DeleteItemFromObject(f, "bytes");
  for (cJSON *t = cJSON_GetObjectItem(o, "tensors")->child; t; t = t->next)
    for (cJSON *c = cJSON_GetObjectItem(t, "chunks")->child; c; c = c->next)
      for (const char *const *k = stored_fields; *k; k++) cJSON_DeleteItemFromObject(c, *k);
  return o;
}

static void test_new_writer(void) {
  char dir[300], mine[400], old[800];
  snprintf(dir, sizeof dir, "%s/new", root);
  save_rank7(dir, 1); /* its index first: rank 0's sync save commits */
  save_rank7(dir, 0);
  snprintf(mine, sizeof mine, "%s/step-0000000007/MANIFEST", dir);
  step_path(old, sizeof old, 7, "MANIFEST");
  cJSON *a = manifest_fields(old), *b = manifest_fields(mine);
  char *as = a ? cJSON_PrintUnformatted(a) : NULL, *bs = b ? cJSON_PrintUnformatted(b) : NULL;
  T_CHECK_MSG(as && bs && strcmp(as, bs) == 0, "the previous release wrote\n%s\nthis one writes\n%s", as ? as : "",
              bs ? bs : "");
  free(as);
  free(bs);
  cJSON_Delete(a);
  cJSON_Delete(b);
  /* and it loads as the old one does */
  ckpt_manifest m;
  T_OK(ckpt_manifest_load(AT_FDCWD, NULL, mine, 0, &m));
  if (m.nfiles == 2) check_layout(&m.files[1].layout, CKPT_LAYOUT_ALL, 2, 1, 1);
  if (m.state) check_state7(m.state);
  ckpt_manifest_free(&m);
}

int main(void) {
  const char *src = getenv("NEWT_SOURCE_DIR");
  if (!src) {
    fprintf(stderr, "NEWT_SOURCE_DIR is not set (ctest sets it): the fixtures are in its tests/ckpt/fixtures\n");
    return 1;
  }
  snprintf(fixture, sizeof fixture, "%s/tests/ckpt/fixtures/ckpt-v1", src);
  ts_tmpdir(root, sizeof root, "/tmp", "ckpt-compat");
  T_RUN(test_old_manifests);
  T_RUN(test_old_tensors);
  T_RUN(test_old_inspect);
  T_RUN(test_reencode);
  T_RUN(test_new_writer);
  newt_fs_rm_rf(root);
  return T_DONE();
}
