/* Unit tests of the checkpoint pieces: the chunk codec and its filters, slice geometry
 * (intersection copy against a brute-force reference, coverage, flat ZeRO ranges), and the
 * manifest format (round trip, and every kind of damage rejected with a message naming
 * the field). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/internal.h"
#include "ckpt_util.h"

static uint64_t rng = 0x1234567ULL;
static uint64_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}
static int64_t rnd_in(int64_t lo, int64_t hi) { return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1)); }

/* ---- codec --------------------------------------------------------------------------------- */

static void roundtrip(newt_dtype dt, const void *raw, size_t len, int level, int expect_codec) {
  ckpt_codec enc = {0}, dec = {0};
  ckpt_chunk_hdr h;
  uint8_t *block = malloc(CKPT_CHUNK_HDR + len);
  T_OK(ckpt_chunk_encode(&enc, raw, len, dt, level, &h, block));
  T_CHECK(h.raw == len);
  if (expect_codec >= 0) T_CHECK_MSG(h.codec == expect_codec, "%s, %zu bytes: codec %d, expected %d",
                                     newt_dtype_name(dt), len, h.codec, expect_codec);
  if (h.codec == CKPT_CODEC_ZSTD) T_CHECK(h.stored < len);
  ckpt_chunk_hdr back;
  T_OK(ckpt_chunk_hdr_decode(block, "test", &back));
  T_CHECK(back.codec == h.codec && back.filter == h.filter && back.esize == h.esize && back.raw == h.raw &&
          back.stored == h.stored && back.xxh_raw == h.xxh_raw && back.xxh_stored == h.xxh_stored);
  void *out = malloc(len + 1);
  T_OK(ckpt_chunk_decode(&dec, &h, block + CKPT_CHUNK_HDR, out, "test"));
  T_CHECK(memcmp(out, raw, len) == 0);
  /* one flipped bit anywhere in the stored bytes is caught */
  block[CKPT_CHUNK_HDR + (rnd() % h.stored)] ^= 0x10;
  T_ERR(NEWT_ERR_CORRUPT, ckpt_chunk_decode(&dec, &h, block + CKPT_CHUNK_HDR, out, "test"));
  T_CHECK(strstr(newt_errmsg(), "test: checksum mismatch") != NULL);
  free(out);
  free(block);
  ckpt_codec_free(&enc);
  ckpt_codec_free(&dec);
}

static void test_codec(void) {
  size_t n = 100003; /* odd element count */
  float *f = malloc(n * sizeof *f);
  for (size_t i = 0; i < n; i++) f[i] = 0.02f * (float)((int64_t)(rnd() % 20001) - 10000) / 10000.0f;
  f[5] = -0.0f;
  f[6] = 1e-42f; /* denormal */
  uint32_t nan = 0x7fc12345u;
  memcpy(&f[7], &nan, 4);
  roundtrip(NEWT_F32, f, n * 4, 1, CKPT_CODEC_ZSTD);
  roundtrip(NEWT_F32, f, n * 4, 0, CKPT_CODEC_RAW); /* level 0: stored raw */
  uint16_t *b = malloc(n * 2);
  for (size_t i = 0; i < n; i++) b[i] = newt_f32_to_bf16(f[i]);
  roundtrip(NEWT_BF16, b, n * 2, 3, CKPT_CODEC_ZSTD);
  roundtrip(NEWT_F16, b, n * 2, 1, -1);
  roundtrip(NEWT_I64, f, (n - 1) * 4, 1, -1);
  roundtrip(NEWT_I32, f, n * 4, 1, -1);
  roundtrip(NEWT_U8, f, n * 4 - 1, 1, -1);
  uint8_t *noise = malloc(n * 4);
  for (size_t i = 0; i < n * 4; i++) noise[i] = (uint8_t)rnd();
  roundtrip(NEWT_F32, noise, n * 4, 1, CKPT_CODEC_RAW); /* incompressible: stored raw */
  memset(noise, 0, 4096);
  roundtrip(NEWT_F32, noise, 4096, 1, CKPT_CODEC_ZSTD);
  roundtrip(NEWT_F32, f, 8, 1, CKPT_CODEC_RAW); /* tiny */
  free(f);
  free(b);
  free(noise);
}

static void test_filters(void) {
  uint8_t in[4096], mid[4096], out[4096];
  for (size_t i = 0; i < sizeof in; i++) in[i] = (uint8_t)rnd();
  for (int filter = 0; filter < CKPT_FILTER__COUNT; filter++)
    for (size_t es = 2; es <= 8; es *= 2) {
      size_t len = 4096 - 4096 % (es * 3);
      ckpt_filter_apply(filter, es, in, mid, len);
      ckpt_filter_undo(filter, es, mid, out, len);
      T_CHECK_MSG(memcmp(in, out, len) == 0, "filter %d, element size %zu", filter, es);
    }
  /* shuffle-rot1 puts the 8 exponent bits of an f32 in one byte group */
  float v[3] = {1.0f, -1.0f, 0.5f};
  ckpt_filter_apply(CKPT_FILTER_ROT1, 4, v, mid, sizeof v);
  T_CHECK(mid[9] == 127 && mid[10] == 127 && mid[11] == 126); /* group 3: exponents */
  T_CHECK((mid[0] & 1) == 0 && (mid[1] & 1) == 1);           /* group 0: sign in bit 0 */
}

/* ---- slices -------------------------------------------------------------------------------- */

/* Position of global element g in slice s, or -1. */
static int64_t pos_in(const int64_t *shape, int nd, const newt_slice *s, int64_t g) {
  int64_t idx[NEWT_SLICE_MAX_DIMS];
  for (int i = nd - 1; i >= 0; i--) {
    idx[i] = g % shape[i];
    g /= shape[i];
  }
  int64_t k = 0;
  for (int i = 0; i < nd; i++) {
    if (idx[i] < s->offset[i] || idx[i] >= s->offset[i] + s->shape[i]) return -1;
    k = k * s->shape[i] + (idx[i] - s->offset[i]);
  }
  return k >= s->begin && k < s->end ? k - s->begin : -1;
}

static void random_slice(int nd, const int64_t *shape, newt_slice *s) {
  memset(s, 0, sizeof *s);
  s->ndim = nd;
  for (int i = 0; i < nd; i++) {
    s->offset[i] = rnd_in(0, shape[i] - 1);
    s->shape[i] = rnd_in(1, shape[i] - s->offset[i]);
  }
  int64_t n = newt_shape_numel(nd, s->shape);
  s->begin = rnd() % 3 == 0 ? 0 : rnd_in(0, n - 1);
  s->end = rnd() % 3 == 0 ? n : rnd_in(s->begin + 1, n);
}

static void test_slice_copy(void) {
  for (int iter = 0; iter < 3000; iter++) {
    int nd = (int)rnd_in(1, 4);
    int64_t shape[NEWT_SLICE_MAX_DIMS];
    for (int i = 0; i < nd; i++) shape[i] = rnd_in(1, nd > 2 ? 6 : 13);
    int64_t numel = newt_shape_numel(nd, shape);
    newt_slice S, D;
    random_slice(nd, shape, &S);
    random_slice(nd, shape, &D);
    int64_t ns = newt_slice_numel(&S), ndd = newt_slice_numel(&D);
    int32_t *src = malloc((size_t)ns * 4), *dst = malloc((size_t)ndd * 4), *ref = malloc((size_t)ndd * 4);
    for (int64_t i = 0; i < ns; i++) src[i] = (int32_t)(1000 + i);
    for (int64_t i = 0; i < ndd; i++) dst[i] = ref[i] = -1;
    int64_t want = 0;
    for (int64_t g = 0; g < numel; g++) {
      int64_t ps = pos_in(shape, nd, &S, g), pd = pos_in(shape, nd, &D, g);
      if (ps >= 0 && pd >= 0) {
        ref[pd] = src[ps];
        want++;
      }
    }
    int64_t got = newt_slice_copy(shape, 4, &D, dst, &S, src);
    T_CHECK_MSG(got == want, "iteration %d: copied %lld, expected %lld", iter, (long long)got, (long long)want);
    T_CHECK_MSG(memcmp(dst, ref, (size_t)ndd * 4) == 0, "iteration %d: wrong elements", iter);
    T_CHECK(newt_slices_may_overlap(&D, &S) == (want > 0));
    int64_t pos;
    if (newt_slice_contiguous_in(shape, &S, &D, &pos)) { /* S sits in D as one run at pos */
      for (int64_t i = 0; i < ns; i++) T_CHECK(ref[pos + i] == src[i]);
    }
    free(src);
    free(dst);
    free(ref);
  }
}

static void add_chunk(ckpt_tensor *t, int nd, const int64_t *off, const int64_t *shape, int64_t b, int64_t e) {
  ckpt_chunk c = {0};
  newt_slice_box(&c.slice, nd, off, shape);
  c.slice.begin = b;
  c.slice.end = e < 0 ? c.slice.end : e;
  ckpt_tensor_add_chunk(t, &c);
}

static void test_coverage(void) {
  ckpt_tensor t = {.name = "w", .dtype = NEWT_F32, .ndim = 2, .shape = {5, 7}};
  /* columns split in two boxes, the second box split by a range */
  add_chunk(&t, 2, (int64_t[]){0, 0}, (int64_t[]){5, 3}, 0, -1);
  add_chunk(&t, 2, (int64_t[]){0, 3}, (int64_t[]){5, 4}, 0, 9);
  T_ERR(NEWT_ERR_INVALID, ckpt_coverage_check(&t, 1, "w"));
  T_CHECK(strstr(newt_errmsg(), "in no chunk") != NULL);
  T_OK(ckpt_coverage_check(&t, 0, "w")); /* no overlap: fine as an index */
  add_chunk(&t, 2, (int64_t[]){0, 3}, (int64_t[]){5, 4}, 9, 20);
  T_OK(ckpt_coverage_check(&t, 1, "w"));
  add_chunk(&t, 2, (int64_t[]){4, 6}, (int64_t[]){1, 1}, 0, -1);
  T_ERR(NEWT_ERR_INVALID, ckpt_coverage_check(&t, 1, "w"));
  T_CHECK(strstr(newt_errmsg(), "both hold element 34") != NULL);
  free(t.chunks);
}

/* f(e), the number of chunks holding each element, by walking every chunk's elements. */
static void brute_counts(const ckpt_tensor *t, int *cnt) {
  int64_t numel = newt_shape_numel(t->ndim, t->shape);
  memset(cnt, 0, (size_t)numel * sizeof *cnt);
  for (size_t j = 0; j < t->nchunks; j++) {
    const newt_slice *s = &t->chunks[j].slice;
    for (int64_t i = s->begin; i < s->end; i++) {
      int64_t pos = i, flat = 0, mul = 1;
      for (int d = s->ndim - 1; d >= 0; d--) {
        flat += (s->offset[d] + pos % s->shape[d]) * mul;
        mul *= t->shape[d];
        pos /= s->shape[d];
      }
      cnt[flat]++;
    }
  }
}

/* a number in [0, n) */
static int64_t below(int64_t n) { return rnd_in(0, n - 1); }

/* Cuts the box off/shape into random boxes (guillotine cuts; always while a box holds more
 * than `keep` elements), each stored as 1 to 3 chunks of consecutive ranges: a random
 * exact cover. */
static void tile(ckpt_tensor *t, const int64_t *off, const int64_t *shape, int64_t keep) {
  int d = (int)below(t->ndim);
  for (int k = 0; k < t->ndim && shape[d] == 1; k++) d = (d + 1) % t->ndim;
  if (shape[d] > 1 && (newt_shape_numel(t->ndim, shape) > keep || below(3) > 0)) {
    int64_t at = 1 + below(shape[d] - 1), o2[NEWT_SLICE_MAX_DIMS], s2[NEWT_SLICE_MAX_DIMS];
    memcpy(o2, off, sizeof o2);
    memcpy(s2, shape, sizeof s2);
    s2[d] = at;
    tile(t, o2, s2, keep);
    o2[d] = off[d] + at;
    s2[d] = shape[d] - at;
    tile(t, o2, s2, keep);
    return;
  }
  int64_t n = newt_shape_numel(t->ndim, shape), a = 0;
  int pieces = 1 + (int)below(3);
  for (int p = 0; p < pieces && a < n; p++) {
    int64_t b = p == pieces - 1 ? n : a + 1 + below(n - a);
    add_chunk(t, t->ndim, off, shape, a, b);
    a = b;
  }
}

/* Random tensors of 1 to 4 dimensions cut into random exact covers, then damaged (a
 * chunk dropped, repeated, a range grown or shrunk): the check agrees with counting, and
 * its message names an element held twice or a run of elements held by none. */
static void test_coverage_random(void) {
  int *cnt = malloc(4096 * sizeof *cnt), seen[2] = {0, 0};
  for (int iter = 0; iter < 3000; iter++) {
    ckpt_tensor t = {.name = "w", .dtype = NEWT_F32, .ndim = 1 + (int)below(4)};
    int64_t zero[NEWT_SLICE_MAX_DIMS] = {0};
    for (int d = 0; d < t.ndim; d++) t.shape[d] = 1 + below(d == 0 ? 6 : 4);
    tile(&t, zero, t.shape, 1 + below(8));
    int damage = (int)below(5);
    if (damage == 1 && t.nchunks > 1) { /* dropped */
      size_t j = (size_t)below((int64_t)t.nchunks);
      t.chunks[j] = t.chunks[--t.nchunks];
    } else if (damage == 2) { /* repeated */
      ckpt_chunk c = t.chunks[below((int64_t)t.nchunks)];
      ckpt_tensor_add_chunk(&t, &c);
    } else if (damage == 3) { /* a range one element longer, when the box has room */
      newt_slice *s = &t.chunks[below((int64_t)t.nchunks)].slice;
      if (s->end < newt_shape_numel(s->ndim, s->shape)) s->end++;
      else if (s->begin > 0) s->begin--;
    } else if (damage == 4) { /* one element shorter */
      newt_slice *s = &t.chunks[below((int64_t)t.nchunks)].slice;
      if (s->end - s->begin > 1) s->end--;
    }
    int64_t numel = newt_shape_numel(t.ndim, t.shape);
    brute_counts(&t, cnt);
    int exact = 1;
    for (int64_t e = 0; e < numel; e++) exact &= cnt[e] == 1;
    seen[exact]++;
    newt_result_t r = ckpt_coverage_check(&t, 1, "w");
    T_CHECK_MSG((r == NEWT_OK) == exact, "iteration %d: check says %s, counting says %s", iter, newt_result_name(r),
                exact ? "exact" : "not exact");
    long long e = -1, a = -1, b = -1, n = -1;
    size_t c1, c2;
    if (r != NEWT_OK && sscanf(strstr(newt_errmsg(), "chunks ") ? strstr(newt_errmsg(), "chunks ") : "",
                               "chunks %zu and %zu both hold element %lld", &c1, &c2, &e) == 3) {
      T_CHECK_MSG(e >= 0 && e < numel && cnt[e] >= 2 && c1 < c2 && c2 < t.nchunks, "iteration %d: %s", iter,
                  newt_errmsg());
    } else if (r != NEWT_OK) {
      const char *m = strstr(newt_errmsg(), "elements [");
      T_CHECK_MSG(m && sscanf(m, "elements [%lld, %lld) of %lld", &a, &b, &n) == 3, "iteration %d: %s", iter,
                  newt_errmsg());
      int ok = n == numel && 0 <= a && a < b && b <= numel && (a == 0 || cnt[a - 1] > 0) && (b == numel || cnt[b] > 0);
      for (long long x = a; ok && x < b; x++) ok = cnt[x] == 0;
      T_CHECK_MSG(ok, "iteration %d: %s", iter, newt_errmsg());
    }
    int64_t sum = 0;
    for (int64_t x = 0; x < numel; x++) sum += cnt[x];
    if (sum <= numel) T_OK(ckpt_coverage_check(&t, 0, "w")); /* an index: its size only */
    else T_ERR(NEWT_ERR_INVALID, ckpt_coverage_check(&t, 0, "w"));
    free(t.chunks);
  }
  T_CHECK_MSG(seen[0] > 500 && seen[1] > 500, "%d exact covers, %d others", seen[1], seen[0]);
  free(cnt);
}

/* The manifests of issue 17: a u8 tensor of 2^27 (then 2^30) rows of 2 whose one chunk is
 * the first column. The check used to walk every row (20 s and 4.9 GB for 2^27, memory
 * exhausted for 2^30); its work is bounded by the chunks now. The valid variant (both
 * columns) is accepted as fast. */
static void test_coverage_hostile(void) {
  for (int bits = 27; bits <= 30; bits += 3) {
    size_t len;
    char *text = ts_hostile_manifest(3, (int64_t)1 << bits, 1, &len);
    ckpt_manifest m;
    double t0 = newt_now_s();
    T_ERR(NEWT_ERR_INVALID, ckpt_manifest_decode(text, len, "MANIFEST", 0, &m));
    double dt = newt_now_s() - t0;
    char want[128];
    snprintf(want, sizeof want, "elements [1, 2) of %lld are in no chunk", 2LL << bits);
    T_CHECK_MSG(strstr(newt_errmsg(), want) != NULL, "message: %s", newt_errmsg());
    T_CHECK_MSG(dt < 0.5, "2^%d rows: %.2f s to reject a %zu-byte manifest", bits, dt, len);
    T_CHECK_MSG(len < 1024, "%zu bytes", len);
    free(text);
    text = ts_hostile_manifest(3, (int64_t)1 << bits, 2, &len);
    t0 = newt_now_s();
    T_OK(ckpt_manifest_decode(text, len, "MANIFEST", 0, &m));
    dt = newt_now_s() - t0;
    T_CHECK_MSG(dt < 0.5, "2^%d rows: %.2f s to accept a %zu-byte manifest", bits, dt, len);
    ckpt_manifest_free(&m);
    free(text);
  }
  /* 8 dimensions, every box cut off-grid: the worst case is 2^8 faces per box */
  ckpt_tensor t = {.name = "w", .dtype = NEWT_F32, .ndim = 8};
  for (int d = 0; d < 8; d++) t.shape[d] = (int64_t)1 << 6;
  for (int i = 0; i < 2000; i++) {
    int64_t off[NEWT_SLICE_MAX_DIMS], shape[NEWT_SLICE_MAX_DIMS];
    for (int d = 0; d < 8; d++) {
      off[d] = below(60);
      shape[d] = 1 + below(4);
    }
    add_chunk(&t, 8, off, shape, 1, newt_shape_numel(8, shape) - 1);
  }
  double t0 = newt_now_s();
  T_ERR(NEWT_ERR_INVALID, ckpt_coverage_check(&t, 1, "w"));
  T_CHECK_MSG(newt_now_s() - t0 < 5, "%.2f s for 2000 chunks of 8 dimensions", newt_now_s() - t0);
  free(t.chunks);
  /* and an exact cover of 8 dimensions cut at random everywhere: nothing stops early */
  ckpt_tensor u = {.name = "u", .dtype = NEWT_F32, .ndim = 8};
  int64_t zero[NEWT_SLICE_MAX_DIMS] = {0};
  for (int d = 0; d < 8; d++) u.shape[d] = 3;
  tile(&u, zero, u.shape, 8);
  t0 = newt_now_s();
  T_OK(ckpt_coverage_check(&u, 1, "u"));
  T_CHECK_MSG(newt_now_s() - t0 < 5, "%.2f s for %zu chunks of 8 dimensions", newt_now_s() - t0, u.nchunks);
  T_CHECK_MSG(u.nchunks > 500, "%zu chunks", u.nchunks);
  free(u.chunks);
}

static void test_flat_pieces(void) {
  newt_slice boxes[3];
  newt_slice_box(&boxes[0], 2, NULL, (int64_t[]){3, 4});
  newt_slice_box(&boxes[1], 1, NULL, (int64_t[]){5});
  newt_slice_box(&boxes[2], 2, (int64_t[]){2, 0}, (int64_t[]){2, 2});
  newt_flat_piece p[4];
  size_t n = 0;
  T_OK(newt_flat_pieces(boxes, 3, 10, 9, p, 4, &n)); /* tail of 0, all of 1, head of 2 */
  T_CHECK(n == 3);
  T_CHECK(p[0].tensor == 0 && p[0].slice.begin == 10 && p[0].slice.end == 12 && p[0].flat_off == 10);
  T_CHECK(p[1].tensor == 1 && p[1].slice.begin == 0 && p[1].slice.end == 5 && p[1].flat_off == 12);
  T_CHECK(p[2].tensor == 2 && p[2].slice.begin == 0 && p[2].slice.end == 2 && p[2].slice.offset[0] == 2);
  T_ERR(NEWT_ERR_INVALID, newt_flat_pieces(boxes, 3, 20, 5, p, 4, &n)); /* past the end (21 elements) */
  T_ERR(NEWT_ERR_INVALID, newt_flat_pieces(boxes, 3, 0, 21, p, 2, &n)); /* too many pieces */
}

/* ---- manifests ----------------------------------------------------------------------------- */

static char *sample_manifest(size_t *len) {
  ckpt_manifest m = {.step = 42, .nranks = 2, .attempt = 0xabcdef, .created_ms = 1700000000000ULL};
  m.files = calloc(2, sizeof *m.files);
  m.nfiles = 2;
  m.files[0] = (ckpt_file){.name = strdup("rank-00000-0000000000abcdef.shard"), .rank = 0, .bytes = 1 << 20, .raw_bytes = 60};
  m.files[1] = (ckpt_file){.name = strdup("rank-00001-0000000000abcdef.shard"), .rank = 1, .bytes = 1 << 20, .raw_bytes = 60};
  newt_tensor_desc d = {.name = "h.0.attn.qkv.w", .dtype = NEWT_F32, .ndim = 2, .shape = {3, 10}};
  ckpt_tensor *t;
  ckpt_manifest_add_tensor(&m, &d, &t);
  for (int r = 0; r < 2; r++) {
    ckpt_chunk c = {.file = (uint32_t)r, .codec = CKPT_CODEC_RAW, .offset = 4096, .stored = 60, .raw = 60,
                    .xxh_raw = 0x1122334455667788ULL, .xxh_stored = 0x1122334455667788ULL};
    newt_slice_box(&c.slice, 2, (int64_t[]){0, 5 * r}, (int64_t[]){3, 5});
    ckpt_tensor_add_chunk(t, &c);
  }
  m.state = cJSON_Parse("{\"step\":42,\"cursor\":{\"shard\":1,\"pos\":99},\"rng\":\"00ff\"}");
  char *text = NULL;
  T_OK(ckpt_manifest_encode(&m, &text, len));
  ckpt_manifest_free(&m);
  return text;
}

/* The manifest of the largest layout docs/ckpt.md ("Limits") sizes the bound for: 4096 ranks
 * (each with a layout like the worker's), 444 tensors (gpt2-124m with its AdamW moments)
 * and `nchunks` zstd chunks of 4 MiB, numbers as wide as such a checkpoint's. */
static void large_manifest(ckpt_manifest *m, int nranks, size_t nchunks) {
  memset(m, 0, sizeof *m);
  *m = (ckpt_manifest){.step = 1234567, .nranks = nranks, .attempt = 0x123456789abcdefULL,
                       .created_ms = 1700000000000ULL};
  m->files = calloc((size_t)nranks, sizeof *m->files);
  m->nfiles = (size_t)nranks;
  const int64_t rows = 1365, cols = 768; /* a chunk: 1365 x 768 floats, 4 MiB */
  size_t per = (nchunks + 443) / 444;
  for (int r = 0; r < nranks; r++) {
    char name[64];
    ckpt_shard_name(name, sizeof name, r, m->attempt);
    ckpt_layout layout = {.has = CKPT_LAYOUT_ALL, .dp = 256, .tp = 4, .pp = 4, .zero = 3, .rank = r, .generation = 1234};
    m->files[r] = (ckpt_file){.name = strdup(name), .rank = r, .bytes = (uint64_t)1 << 42,
                              .raw_bytes = 123456789012ULL, .layout = layout};
  }
  size_t made = 0;
  for (int i = 0; i < 444 && made < nchunks; i++) {
    char name[64];
    snprintf(name, sizeof name, "%s/h.%d.attn.qkv.w", i % 3 == 0 ? "adam.m" : i % 3 == 1 ? "adam.v" : "w", i);
    newt_tensor_desc d = {.name = name, .dtype = NEWT_F32, .ndim = 2, .shape = {rows * (int64_t)per, cols}};
    ckpt_tensor *t;
    T_OK(ckpt_manifest_add_tensor(m, &d, &t));
    for (size_t k = 0; k < per && made < nchunks; k++, made++) {
      ckpt_chunk c = {.file = (uint32_t)(made % (size_t)nranks), .codec = CKPT_CODEC_ZSTD, .filter = CKPT_FILTER_ROT1,
                      .offset = 1099511000000ULL + made * 4096, .stored = (uint64_t)rows * cols * 4 - 654321,
                      .raw = (uint64_t)rows * cols * 4, .xxh_raw = 0x8899aabbccddeeffULL * (made + 1),
                      .xxh_stored = 0x1122334455667788ULL * (made + 1)};
      newt_slice_box(&c.slice, 2, (int64_t[]){rows * (int64_t)k, 0}, (int64_t[]){rows, cols});
      T_OK(ckpt_tensor_add_chunk(t, &c));
    }
    t->shape[0] = rows * (int64_t)t->nchunks; /* exactly covered */
  }
  m->state = cJSON_Parse("{\"step\":1234567,\"cursor\":79012345678,\"config\":{\"model\":{\"preset\":\"gpt2-124m\","
                         "\"vocab\":50257,\"ctx\":1024,\"layers\":12,\"heads\":12,\"channels\":768},\"batch\":512,"
                         "\"seq_len\":1024,\"lr\":0.0006,\"seed\":1,\"data\":\"/data/openwebtext/train.tok\"}}");
}

/* The manifest bound (CKPT_MAX_MANIFEST): the largest layout's manifest fits with room (at
 * most 60% of the bound) and reads back; one over the bound is never written, and a text over
 * it is refused before it is parsed, naming the bound. */
static void test_manifest_bound(void) {
  ckpt_manifest m, back;
  large_manifest(&m, 4096, 16384);
  char *text = NULL;
  size_t len = 0;
  T_OK(ckpt_manifest_encode(&m, &text, &len));
  fprintf(stderr, "  the largest layout's manifest: %zu bytes (4096 ranks, 444 tensors, 16384 chunks), bound %zu\n",
          len, CKPT_MAX_MANIFEST);
  T_CHECK_MSG(len <= CKPT_MAX_MANIFEST / 10 * 6, "%zu bytes: the bound %zu leaves too little room", len, CKPT_MAX_MANIFEST);
  T_OK(ckpt_manifest_decode(text, len, "MANIFEST", 0, &back));
  T_CHECK(back.nfiles == 4096 && back.ntensors == m.ntensors);
  ckpt_manifest_free(&back);
  free(text);
  ckpt_manifest_free(&m);
  /* far more chunks: the encoder refuses, naming the bound and the counts */
  large_manifest(&m, 4096, 60000);
  text = NULL;
  T_ERR(NEWT_ERR_INVALID, ckpt_manifest_encode(&m, &text, &len));
  char bound[32];
  snprintf(bound, sizeof bound, "%zu bytes", CKPT_MAX_MANIFEST);
  T_CHECK_MSG(strstr(newt_errmsg(), bound) && strstr(newt_errmsg(), "60000 chunks") && text == NULL,
              "message: %s", newt_errmsg());
  ckpt_manifest_free(&m);
  /* a text over the bound: refused at once, whatever it holds */
  size_t big = CKPT_MAX_MANIFEST + 1;
  char *junk = malloc(big);
  memset(junk, ' ', big);
  memcpy(junk, "newt-ckpt manifest 1 0 0000000000000000\n", 40);
  T_ERR(NEWT_ERR_INVALID, ckpt_manifest_decode(junk, big, "step-0000000001/MANIFEST", 0, &back));
  T_CHECK_MSG(strstr(newt_errmsg(), "step-0000000001/MANIFEST") && strstr(newt_errmsg(), bound),
              "message: %s", newt_errmsg());
  free(junk);
}

/* Replaces the first `from` in the manifest's JSON by `to`, re-frames, decodes: must fail
 * naming `field`. */
static void expect_rejected(const char *text, const char *from, const char *to, const char *field) {
  const char *body = strchr(text, '\n') + 1;
  const char *at = strstr(body, from);
  T_CHECK_MSG(at != NULL, "\"%s\" not in the sample manifest", from);
  if (!at) return;
  size_t pre = (size_t)(at - body);
  char *mod = malloc(strlen(body) + strlen(to) + 1);
  if (!mod) abort();
  sprintf(mod, "%.*s%s%s", (int)pre, body, to, at + strlen(from));
  size_t len;
  char *framed = ts_frame(mod, &len);
  ckpt_manifest m;
  newt_result_t r = ckpt_manifest_decode(framed, len, "MANIFEST", 0, &m);
  T_CHECK_MSG(r != NEWT_OK, "replacing %s by %s was accepted", from, to);
  T_CHECK_MSG(strstr(newt_errmsg(), field) != NULL, "replacing %s by %s: message \"%s\" does not name %s", from, to,
              newt_errmsg(), field);
  if (r == NEWT_OK) ckpt_manifest_free(&m);
  free(framed);
  free(mod);
}

static void test_manifest(void) {
  size_t len;
  char *text = sample_manifest(&len);
  ckpt_manifest m;
  T_OK(ckpt_manifest_decode(text, len, "MANIFEST", 0, &m));
  T_CHECK(m.step == 42 && m.nranks == 2 && m.attempt == 0xabcdef && m.ntensors == 1);
  T_CHECK(m.tensors[0].nchunks == 2 && m.tensors[0].chunks[1].slice.offset[1] == 5);
  T_CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(m.state, "cursor"), "pos")->valuedouble == 99);
  ckpt_manifest_free(&m);
  /* the same text framed as an index is refused */
  T_ERR(NEWT_ERR_CORRUPT, ckpt_manifest_decode(text, len, "rank-00000.index", 1, &m));

  /* damage to the frame */
  T_ERR(NEWT_ERR_CORRUPT, ckpt_manifest_decode(text, len - 10, "MANIFEST", 0, &m));
  T_CHECK(strstr(newt_errmsg(), "MANIFEST: truncated") != NULL);
  T_ERR(NEWT_ERR_CORRUPT, ckpt_manifest_decode(text, 30, "MANIFEST", 0, &m));
  T_ERR(NEWT_ERR_CORRUPT, ckpt_manifest_decode(text, 0, "MANIFEST", 0, &m));
  char *flip = strdup(text);
  flip[len / 2] ^= 1;
  T_ERR(NEWT_ERR_CORRUPT, ckpt_manifest_decode(flip, len, "MANIFEST", 0, &m));
  T_CHECK(strstr(newt_errmsg(), "checksum mismatch") != NULL);
  free(flip);
  T_ERR(NEWT_ERR_CORRUPT, ckpt_manifest_decode("garbage\n{}", 10, "MANIFEST", 0, &m));
  T_CHECK(strstr(newt_errmsg(), "malformed header line") != NULL);

  /* damage to the content, with a valid checksum: each names its field */
  expect_rejected(text, "\"step\":42", "\"step\":\"x\"", "MANIFEST.step");
  expect_rejected(text, "\"step\":42,", "", "MANIFEST.step: missing");
  expect_rejected(text, "\"format\":\"newt-ckpt\"", "\"format\":\"zip\"", "MANIFEST.format");
  expect_rejected(text, "\"version\":1", "\"version\":7", "MANIFEST.version");
  expect_rejected(text, "\"nranks\":2", "\"nranks\":0", "MANIFEST.nranks");
  expect_rejected(text, "rank-00000-0000000000abcdef.shard", "../../etc/passwd", "MANIFEST.files[0].name");
  expect_rejected(text, "rank-00000-0000000000abcdef.shard", "/etc/passwd", "not a plain file name");
  expect_rejected(text, "rank-00000-0000000000abcdef.shard", "..", "MANIFEST.files[0].name");
  expect_rejected(text, "rank-00000-0000000000abcdef.shard", "sub/dir.shard", "MANIFEST.files[0].name");
  expect_rejected(text, "rank-00001-0000000000abcdef.shard", "rank-00000-0000000000abcdef.shard", "listed twice");
  expect_rejected(text, "\"rank\":1", "\"rank\":2", "MANIFEST.files[1].rank");
  expect_rejected(text, "\"dtype\":\"f32\"", "\"dtype\":\"f33\"", "MANIFEST.tensors[0].dtype");
  expect_rejected(text, "\"shape\":[3,10]", "\"shape\":[3,-10]", "MANIFEST.tensors[0].shape[1]");
  expect_rejected(text, "\"shape\":[3,10]", "\"shape\":[3,9]", "MANIFEST.tensors[0].chunks[1]");
  expect_rejected(text, "\"file\":1", "\"file\":5", "MANIFEST.tensors[0].chunks[1].file");
  expect_rejected(text, "\"codec\":\"raw\"", "\"codec\":\"lz4\"", "MANIFEST.tensors[0].chunks[0].codec");
  expect_rejected(text, "\"raw\":60", "\"raw\":64", "MANIFEST.tensors[0].chunks[0].raw");
  expect_rejected(text, "\"xxh_raw\":\"1122334455667788\"", "\"xxh_raw\":\"xyz\"", "chunks[0].xxh_raw");
  expect_rejected(text, "\"offset\":4096", "\"offset\":1048500", "past the end");
  expect_rejected(text, "\"box_offset\":[0,5]", "\"box_offset\":[0,6]", "MANIFEST.tensors[0].chunks[1]");
  expect_rejected(text, "\"box_offset\":[0,5]", "\"box_offset\":[0,0]", "both hold");
  expect_rejected(text, "\"begin\":0", "\"begin\":5", "MANIFEST.tensors[0].chunks[0].raw");
  expect_rejected(text, "\"shape\":[3,10]", "\"shape\":[4,10]", "elements [30, 40) of 40 are in no chunk");
  expect_rejected(text, "\"state\":{\"step\":42,\"cursor\":{\"shard\":1,\"pos\":99},\"rng\":\"00ff\"}", "\"state\":7",
                  "MANIFEST.state: expected an object");
  expect_rejected(text, "\"tensors\":[{", "\"tensors\":[7,{", "MANIFEST.tensors[0]: expected an object");
  expect_rejected(text, "\"state\":{", "\"extra\":1,\"state\":{", "MANIFEST.extra: unknown field");
  free(text);

  T_CHECK(ckpt_plain_name("rank-00000-0000000000abcdef.shard"));
  T_CHECK(!ckpt_plain_name("..") && !ckpt_plain_name(".") && !ckpt_plain_name("") && !ckpt_plain_name("a/b") &&
          !ckpt_plain_name("a b") && !ckpt_plain_name("/x"));
}

static void test_headers(void) {
  uint8_t b[CKPT_SHARD_HDR];
  ckpt_shard_hdr h = {.rank = 3, .nranks = 8, .step = 1234567890123LL, .attempt = 77}, back;
  ckpt_shard_hdr_encode(&h, b);
  T_OK(ckpt_shard_hdr_decode(b, "shard", &back));
  T_CHECK(back.rank == 3 && back.nranks == 8 && back.step == h.step && back.attempt == 77);
  b[20] ^= 1;
  T_ERR(NEWT_ERR_CORRUPT, ckpt_shard_hdr_decode(b, "shard", &back));
  b[20] ^= 1;
  b[0] = 'X';
  T_ERR(NEWT_ERR_CORRUPT, ckpt_shard_hdr_decode(b, "shard", &back));
  T_CHECK(strstr(newt_errmsg(), "bad magic") != NULL);
  T_CHECK(ckpt_parse_step_name("step-0000000042") == 42 && ckpt_parse_step_name("step-") == -1 &&
          ckpt_parse_step_name("step-4x") == -1 && ckpt_parse_step_name("latest") == -1);
}

int main(void) {
  T_RUN(test_codec);
  T_RUN(test_filters);
  T_RUN(test_slice_copy);
  T_RUN(test_coverage);
  T_RUN(test_coverage_random);
  T_RUN(test_coverage_hostile);
  T_RUN(test_flat_pieces);
  T_RUN(test_manifest);
  T_RUN(test_manifest_bound);
  T_RUN(test_headers);
  return T_DONE();
}
