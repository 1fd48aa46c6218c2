/* The checkpoint's on-disk format: shard headers, chunk headers, shard indexes and the
 * manifest. Every byte a checkpoint holds is written through the encoders below (saver.c
 * and commit.c call them); every byte read comes back through the decoders, which check
 * everything (a file is outside data) and name the field at fault.
 *
 * Directory DIR (the --ckpt-dir):
 *
 *   DIR/LOCK                            the writer's lock (lock.c, mode 0600): one JSON line,
 *                                       {writer, pid, host, since_ms, cmd} of the process that
 *                                       took it
 *   DIR/latest                          "<N>\n": the newest committed step (a pointer for
 *                                       tools; readers trust the manifests, not this)
 *   DIR/step-<N>/                       one directory per step, N zero-padded to 10 digits
 *   DIR/step-<N>/rank-<R>-<A>.shard     rank R's chunks (R 5 digits, A = attempt, 16 hex)
 *   DIR/step-<N>/rank-<R>.index         rank R's shard index, published after the shard
 *                                       is fsync'd (temporary name, fsync, rename)
 *   DIR/step-<N>/rank-<R>.failed        rank R's save failed: attempt and message (the
 *                                       committer stops waiting)
 *   DIR/step-<N>/MANIFEST               written last; its presence commits the step
 *
 * Shard file (integers little-endian):
 *
 *   | offset | size | meaning                                                     |
 *   |--------|------|-------------------------------------------------------------|
 *   | 0      | 8    | magic "NEWTSHRD"                                            |
 *   | 8      | 4    | format version (1)                                          |
 *   | 12     | 4    | rank                                                        |
 *   | 16     | 4    | nranks                                                      |
 *   | 20     | 4    | reserved, 0                                                 |
 *   | 24     | 8    | step (signed)                                               |
 *   | 32     | 8    | attempt                                                     |
 *   | 40     | 16   | reserved, 0                                                 |
 *   | 56     | 8    | XXH3-64 of bytes 0..55                                      |
 *   | 64     | 4032 | zeros                                                       |
 *   | 4096   | ...  | blocks, each a multiple of 4096 bytes: chunks back to back  |
 *   |        |      | (a chunk header, then its stored bytes), then zeros. Blocks |
 *   |        |      | are in the order the compression threads wrote them; the    |
 *   |        |      | manifest gives each chunk's offset (of its header)          |
 *
 * Chunk header (at the chunk's offset; the stored bytes follow it):
 *
 *   | offset | size | meaning                                                     |
 *   |--------|------|-------------------------------------------------------------|
 *   | 0      | 4    | magic "NWCK"                                                |
 *   | 4      | 1    | codec: 0 raw, 1 zstd                                        |
 *   | 5      | 1    | filter: 0 none, 1 shuffle, 2 shuffle-rot1                   |
 *   | 6      | 1    | element size in bytes                                       |
 *   | 7      | 1    | reserved, 0                                                 |
 *   | 8      | 8    | raw length: the slice's bytes                               |
 *   | 16     | 8    | stored length (equals the raw length for codec raw)         |
 *   | 24     | 8    | XXH3-64 of the raw bytes (after decompression and unfilter) |
 *   | 32     | 8    | XXH3-64 of the stored bytes                                 |
 *   | 40     | 8    | XXH3-64 of bytes 0..39 of this header                       |
 *
 * Filters (applied before zstd, undone after): shuffle puts byte k of every element in
 * group k (all bytes of one significance together); shuffle-rot1 first rotates each
 * element left by one bit, which moves the sign to bit 0 and the 8 exponent bits of f32
 * and bf16 into the top byte, then shuffles. A chunk whose compressed size is not smaller
 * than its raw size is stored raw (codec 0, filter 0).
 *
 * Index and manifest files are framed JSON: one header line, then the JSON text.
 *
 *   | offset | size   | meaning                                                   |
 *   |--------|--------|-----------------------------------------------------------|
 *   | 0      | line   | "newt-ckpt <kind> 1 <length> <xxh3>\n": kind manifest or  |
 *   |        |        | index, format version, length of the JSON in bytes, XXH3- |
 *   |        |        | 64 of the JSON as 16 lowercase hex digits                 |
 *   | line   | length | the JSON object below; nothing may follow it              |
 *
 *   | field                  | meaning                                               |
 *   |------------------------|-------------------------------------------------------|
 *   | format, version        | "newt-ckpt", 1                                        |
 *   | kind                   | "manifest" or "index"                                 |
 *   | step, nranks, attempt  | the step, ranks that wrote it, attempt (16 hex)       |
 *   | rank                   | index only: whose index                               |
 *   | created_ms             | wall clock, ms since the epoch                        |
 *   | files[]                | {name, rank, bytes, raw_bytes, layout}: shard files   |
 *   |                        | (plain names inside the step directory), their sizes, |
 *   |                        | the tensor bytes they hold, the rank's layout object  |
 *   |                        | (ckpt_layout: dp, tp, pp, zero, rank, generation, the |
 *   |                        | ones set, in this order; a reader passes over others) |
 *   | tensors[]              | {name, dtype, shape[], chunks[]}, sorted by name      |
 *   | tensors[].chunks[]     | {file, offset, stored, raw, codec, filter, xxh_raw,   |
 *   |                        | xxh_stored, box_offset[], box_shape[], begin, end}:   |
 *   |                        | file index, offset of the chunk header, sizes, codec  |
 *   |                        | and filter names, checksums (16 hex), and the slice   |
 *   | state                  | manifest only: the training state object (at most     |
 *   |                        | 65,536 JSON values: CKPT_MAX_STATE_VALUES)            |
 *   | mac                    | written with a key (ckpt_key), always the last field: |
 *   |                        | HMAC-SHA256 under the key of "newt-manifest" (or      |
 *   |                        | "newt-index"), a zero byte and the JSON text without  |
 *   |                        | it (the text up to `,"mac":`, then "}"), 64 hex       |
 *
 * In a manifest the chunks of each tensor cover every element exactly once. A manifest or
 * index is at most CKPT_MAX_MANIFEST bytes (8 MiB): larger ones are never written, and are
 * refused unread. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "ckpt/internal.h"
#include "common/clock.h"
#include "common/fs.h"
#include "common/json.h"
#include "common/secret.h"
#include "common/strutil.h"

static const char *const codec_names[CKPT_CODEC__COUNT] = {"raw", "zstd"};
static const char *const filter_names[CKPT_FILTER__COUNT] = {"none", "shuffle", "shuffle-rot1"};

const char *ckpt_codec_name(int codec) {
  return codec >= 0 && codec < CKPT_CODEC__COUNT ? codec_names[codec] : "?";
}
const char *ckpt_filter_name(int filter) {
  return filter >= 0 && filter < CKPT_FILTER__COUNT ? filter_names[filter] : "?";
}

uint64_t ckpt_hash(const void *p, size_t n) { return (uint64_t)XXH3_64bits(p, n); }

/* ---- little-endian fields ------------------------------------------------------------ */

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

void ckpt_shard_hdr_encode(const ckpt_shard_hdr *h, uint8_t out[CKPT_SHARD_HDR]) {
  memset(out, 0, CKPT_SHARD_HDR);
  memcpy(out, "NEWTSHRD", 8);
  put_u32(out + 8, CKPT_FORMAT_VERSION);
  put_u32(out + 12, h->rank);
  put_u32(out + 16, h->nranks);
  put_u64(out + 24, (uint64_t)h->step);
  put_u64(out + 32, h->attempt);
  put_u64(out + 56, ckpt_hash(out, 56));
}

newt_result_t ckpt_shard_hdr_decode(const uint8_t in[CKPT_SHARD_HDR], const char *what,
                                    ckpt_shard_hdr *h) {
  if (memcmp(in, "NEWTSHRD", 8) != 0)
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: not a newt shard file (bad magic)", what);
  if (get_u64(in + 56) != ckpt_hash(in, 56))
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: shard header checksum mismatch", what);
  if (get_u32(in + 8) != CKPT_FORMAT_VERSION)
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: shard format version %u, this build reads %d", what,
                    get_u32(in + 8), CKPT_FORMAT_VERSION);
  h->rank = get_u32(in + 12);
  h->nranks = get_u32(in + 16);
  h->step = (int64_t)get_u64(in + 24);
  h->attempt = get_u64(in + 32);
  return NEWT_OK;
}

void ckpt_chunk_hdr_encode(const ckpt_chunk_hdr *h, uint8_t out[CKPT_CHUNK_HDR]) {
  memset(out, 0, CKPT_CHUNK_HDR);
  memcpy(out, "NWCK", 4);
  out[4] = h->codec;
  out[5] = h->filter;
  out[6] = h->esize;
  put_u64(out + 8, h->raw);
  put_u64(out + 16, h->stored);
  put_u64(out + 24, h->xxh_raw);
  put_u64(out + 32, h->xxh_stored);
  put_u64(out + 40, ckpt_hash(out, 40));
}

newt_result_t ckpt_chunk_hdr_decode(const uint8_t in[CKPT_CHUNK_HDR], const char *what,
                                    ckpt_chunk_hdr *h) {
  if (memcmp(in, "NWCK", 4) != 0)
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: no chunk header at this offset (bad magic)", what);
  if (get_u64(in + 40) != ckpt_hash(in, 40))
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: chunk header checksum mismatch", what);
  h->codec = in[4];
  h->filter = in[5];
  h->esize = in[6];
  h->raw = get_u64(in + 8);
  h->stored = get_u64(in + 16);
  h->xxh_raw = get_u64(in + 24);
  h->xxh_stored = get_u64(in + 32);
  return NEWT_OK;
}

/* ---- the in-memory manifest ----------------------------------------------------------- */

void ckpt_manifest_free(ckpt_manifest *m) {
  if (!m) return;
  for (size_t i = 0; i < m->nfiles; i++) free(m->files[i].name);
  free(m->files);
  for (size_t i = 0; i < m->ntensors; i++) {
    free(m->tensors[i].name);
    free(m->tensors[i].chunks);
  }
  free(m->tensors);
  cJSON_Delete(m->state);
  memset(m, 0, sizeof *m);
}

static int tensor_cmp(const void *a, const void *b) {
  const ckpt_tensor *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : x->seq < y->seq ? -1 : x->seq > y->seq;
}

const ckpt_tensor *ckpt_manifest_find(const ckpt_manifest *m, const char *name) {
  size_t lo = 0, hi = m->ntensors;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(m->tensors[mid].name, name);
    if (c == 0) return &m->tensors[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}

newt_result_t ckpt_manifest_add_tensor(ckpt_manifest *m, const newt_tensor_desc *d, ckpt_tensor **out) {
  NEWT_CHECK(CKPT_RESERVE(m->tensors, m->cap, m->ntensors));
  ckpt_tensor *t = &m->tensors[m->ntensors];
  memset(t, 0, sizeof *t);
  t->name = newt_strdup(d->name);
  NEWT_CHECK_ALLOC(t->name);
  t->dtype = d->dtype;
  t->ndim = d->ndim;
  memcpy(t->shape, d->shape, sizeof t->shape);
  t->seq = m->ntensors++;
  *out = t;
  return NEWT_OK;
}

newt_result_t ckpt_manifest_sort(ckpt_manifest *m, int allow_dups, const char *what) {
  if (m->ntensors > 1) qsort(m->tensors, m->ntensors, sizeof *m->tensors, tensor_cmp);
  size_t w = 0;
  for (size_t i = 0; i < m->ntensors; i++) {
    ckpt_tensor *t = &m->tensors[i];
    ckpt_tensor *keep = w > 0 ? &m->tensors[w - 1] : NULL;
    if (!keep || strcmp(keep->name, t->name) != 0) {
      m->tensors[w++] = *t;
      continue;
    }
    if (!allow_dups) {
      for (size_t k = i; k < m->ntensors; k++) m->tensors[w++] = m->tensors[k]; /* freed by the caller */
      m->ntensors = w;
      return NEWT_ERR(NEWT_ERR_INVALID, "%s: tensor \"%.80s\" appears twice", what, t->name);
    }
    int same = keep->dtype == t->dtype && keep->ndim == t->ndim;
    for (int k = 0; same && k < t->ndim; k++) same = keep->shape[k] == t->shape[k];
    newt_result_t r = NEWT_OK;
    if (!same) {
      char a[200], b[200];
      ckpt_shape_str(keep->ndim, keep->shape, a, sizeof a);
      ckpt_shape_str(t->ndim, t->shape, b, sizeof b);
      r = NEWT_ERR(NEWT_ERR_INVALID, "%s: tensor \"%.80s\" is %s %s in one place, %s %s in another", what, t->name,
                   newt_dtype_name(keep->dtype), a, newt_dtype_name(t->dtype), b);
    }
    for (size_t j = 0; r == NEWT_OK && j < t->nchunks; j++) r = ckpt_tensor_add_chunk(keep, &t->chunks[j]);
    free(t->name);
    free(t->chunks);
    if (r != NEWT_OK) {
      for (size_t k = i + 1; k < m->ntensors; k++) m->tensors[w++] = m->tensors[k];
      m->ntensors = w;
      return r;
    }
  }
  m->ntensors = w;
  return NEWT_OK;
}

newt_result_t ckpt_tensor_add_chunk(ckpt_tensor *t, const ckpt_chunk *c) {
  NEWT_CHECK(CKPT_RESERVE(t->chunks, t->cap, t->nchunks));
  t->chunks[t->nchunks++] = *c;
  return NEWT_OK;
}

int ckpt_plain_name(const char *name) {
  if (!name || !*name || strlen(name) > 255 || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
    return 0;
  for (const char *p = name; *p; p++) {
    char ch = *p;
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
             ch == '.' || ch == '_' || ch == '-';
    if (!ok) return 0;
  }
  return 1;
}

/* ---- the layout --------------------------------------------------------------------------- */

/* The layout's fields, in the order a manifest writes them (the order newt always wrote). */
static const struct {
  const char *name;
  unsigned bit;
  size_t off;
} layout_fields[] = {
    {"dp", CKPT_LAYOUT_DP, offsetof(ckpt_layout, dp)},
    {"tp", CKPT_LAYOUT_TP, offsetof(ckpt_layout, tp)},
    {"pp", CKPT_LAYOUT_PP, offsetof(ckpt_layout, pp)},
    {"zero", CKPT_LAYOUT_ZERO, offsetof(ckpt_layout, zero)},
    {"rank", CKPT_LAYOUT_RANK, offsetof(ckpt_layout, rank)},
    {"generation", CKPT_LAYOUT_GENERATION, offsetof(ckpt_layout, generation)},
};
#define NLAYOUT (sizeof layout_fields / sizeof layout_fields[0])

static int64_t *layout_slot(ckpt_layout *l, size_t i) { return (int64_t *)((char *)l + layout_fields[i].off); }

cJSON *ckpt_layout_json(const ckpt_layout *l) {
  cJSON *o = cJSON_CreateObject();
  for (size_t i = 0; o && i < NLAYOUT; i++)
    if (l->has & layout_fields[i].bit)
      cJSON_AddNumberToObject(o, layout_fields[i].name, (double)*layout_slot((ckpt_layout *)l, i));
  return o;
}

/* The fields of a manifest's layout object that this build knows. The layout is a note for
 * tools that no load reads, and the previous releases took any object: a field of another
 * name or type is passed over, never a reason to refuse a checkpoint. */
static void decode_layout(const cJSON *o, ckpt_layout *l) {
  memset(l, 0, sizeof *l);
  for (size_t i = 0; o && i < NLAYOUT; i++) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, layout_fields[i].name);
    if (!it) continue;
    if (newt_json_item_int(it, layout_fields[i].name, layout_slot(l, i)) != NEWT_OK) {
      newt_err_clear();
      continue;
    }
    l->has |= layout_fields[i].bit;
  }
}

/* ---- encoding -------------------------------------------------------------------------- */

static cJSON *int_array(int n, const int64_t *v) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
  return a;
}

static void add_hex(cJSON *o, const char *field, uint64_t v) {
  char buf[17];
  snprintf(buf, sizeof buf, "%016llx", (unsigned long long)v);
  cJSON_AddStringToObject(o, field, buf);
}

static cJSON *chunk_json(const ckpt_chunk *c) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  newt_json_add_int(o, "file", c->file);
  newt_json_add_int(o, "offset", (int64_t)c->offset);
  newt_json_add_int(o, "stored", (int64_t)c->stored);
  newt_json_add_int(o, "raw", (int64_t)c->raw);
  cJSON_AddStringToObject(o, "codec", ckpt_codec_name(c->codec));
  cJSON_AddStringToObject(o, "filter", ckpt_filter_name(c->filter));
  add_hex(o, "xxh_raw", c->xxh_raw);
  add_hex(o, "xxh_stored", c->xxh_stored);
  cJSON_AddItemToObject(o, "box_offset", int_array(c->slice.ndim, c->slice.offset));
  cJSON_AddItemToObject(o, "box_shape", int_array(c->slice.ndim, c->slice.shape));
  newt_json_add_int(o, "begin", c->slice.begin);
  newt_json_add_int(o, "end", c->slice.end);
  return o;
}

/* The values of a JSON tree (the item and everything under it). */
static size_t tree_values(const cJSON *it) {
  size_t n = 1;
  for (const cJSON *c = it ? it->child : NULL; c; c = c->next) n += tree_values(c);
  return n;
}

newt_result_t ckpt_key_of_secret(ckpt_key *k, const unsigned char *secret, size_t len) {
  memset(k, 0, sizeof *k);
  const void *parts[] = {"newt-checkpoint"};
  size_t lens[] = {15};
  NEWT_CHECK(newt_hmac(secret, len, parts, lens, 1, k->bytes));
  k->has = 1;
  return NEWT_OK;
}

#define MAC_SUFFIX_LEN (8 + NEWT_MAC_HEX + 2) /* ,"mac":"<64 hex>"} */

/* The mac of a manifest's or index's JSON text without its mac: body[0, n) then "}". */
static newt_result_t body_mac(const ckpt_key *key, int index, const char *body, size_t n, unsigned char out[32]) {
  const char *label = index ? "newt-index" : "newt-manifest";
  const void *parts[] = {label, "", body, "}"};
  size_t lens[] = {strlen(label), 1, n, 1};
  return newt_hmac(key->bytes, sizeof key->bytes, parts, lens, 4, out);
}

newt_result_t ckpt_manifest_encode(const ckpt_manifest *m, char **text, size_t *len) {
  return ckpt_manifest_encode_keyed(m, NULL, text, len);
}

newt_result_t ckpt_manifest_encode_keyed(const ckpt_manifest *m, const ckpt_key *key, char **text, size_t *len) {
  size_t sv = m->is_index || !m->state ? 0 : tree_values(m->state);
  if (sv > CKPT_MAX_STATE_VALUES) /* its readers would refuse it */
    return NEWT_ERR(NEWT_ERR_INVALID, "the state document of step %lld has %zu JSON values, more than the %d a "
                    "manifest may hold (docs/ckpt.md, \"Limits\"): not written", (long long)m->step, sv,
                    CKPT_MAX_STATE_VALUES);
  cJSON *root = cJSON_CreateObject();
  NEWT_CHECK_ALLOC(root);
  cJSON_AddStringToObject(root, "format", "newt-ckpt");
  newt_json_add_int(root, "version", CKPT_FORMAT_VERSION);
  cJSON_AddStringToObject(root, "kind", m->is_index ? "index" : "manifest");
  newt_json_add_int(root, "step", m->step);
  newt_json_add_int(root, "nranks", m->nranks);
  if (m->is_index) newt_json_add_int(root, "rank", m->rank);
  add_hex(root, "attempt", m->attempt);
  newt_json_add_int(root, "created_ms", (int64_t)m->created_ms);
  cJSON *files = cJSON_AddArrayToObject(root, "files");
  for (size_t i = 0; files && i < m->nfiles; i++) {
    const ckpt_file *f = &m->files[i];
    cJSON *o = cJSON_CreateObject();
    if (!o) break;
    cJSON_AddStringToObject(o, "name", f->name);
    newt_json_add_int(o, "rank", f->rank);
    newt_json_add_int(o, "bytes", (int64_t)f->bytes);
    newt_json_add_int(o, "raw_bytes", (int64_t)f->raw_bytes);
    cJSON_AddItemToObject(o, "layout", ckpt_layout_json(&f->layout));
    cJSON_AddItemToArray(files, o);
  }
  cJSON *tensors = cJSON_AddArrayToObject(root, "tensors");
  for (size_t i = 0; tensors && i < m->ntensors; i++) {
    const ckpt_tensor *t = &m->tensors[i];
    cJSON *o = cJSON_CreateObject();
    if (!o) break;
    cJSON_AddStringToObject(o, "name", t->name);
    cJSON_AddStringToObject(o, "dtype", newt_dtype_name(t->dtype));
    cJSON_AddItemToObject(o, "shape", int_array(t->ndim, t->shape));
    cJSON *chunks = cJSON_AddArrayToObject(o, "chunks");
    for (size_t j = 0; chunks && j < t->nchunks; j++) cJSON_AddItemToArray(chunks, chunk_json(&t->chunks[j]));
    cJSON_AddItemToArray(tensors, o);
  }
  if (!m->is_index) cJSON_AddItemToObject(root, "state", m->state ? cJSON_Duplicate(m->state, 1) : cJSON_CreateObject());
  char *body = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  NEWT_CHECK_ALLOC(body);
  size_t blen = strlen(body);
  if (key && key->has) { /* the mac of the text without it, as its last field */
    unsigned char mac[NEWT_MAC_BYTES];
    char hex[NEWT_MAC_HEX + 1];
    newt_result_t r = body_mac(key, m->is_index, body, blen - 1, mac);
    char *signed_body = r == NEWT_OK ? malloc(blen + MAC_SUFFIX_LEN) : NULL;
    if (r == NEWT_OK && !signed_body) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory encoding a manifest");
    if (r != NEWT_OK) {
      free(body);
      return r;
    }
    newt_hex_encode(mac, sizeof mac, hex);
    memcpy(signed_body, body, blen - 1);
    snprintf(signed_body + blen - 1, MAC_SUFFIX_LEN + 1, ",\"mac\":\"%s\"}", hex);
    free(body);
    body = signed_body;
    blen = strlen(body);
  }
  char head[128];
  int hl = snprintf(head, sizeof head, "newt-ckpt %s %d %zu %016llx\n", m->is_index ? "index" : "manifest",
                    CKPT_FORMAT_VERSION, blen, (unsigned long long)ckpt_hash(body, blen));
  if ((size_t)hl + blen > CKPT_MAX_MANIFEST) {
    size_t nchunks = 0;
    for (size_t i = 0; i < m->ntensors; i++) nchunks += m->tensors[i].nchunks;
    free(body);
    return NEWT_ERR(NEWT_ERR_INVALID, "the %s of step %lld would take %zu bytes (%zu files, %zu tensors, %zu chunks), "
                    "more than the %zu bytes (%zu MiB) a newt manifest or index may have (docs/ckpt.md, \"Limits\"): "
                    "not written; fewer, larger chunks (chunk_bytes) make it smaller", m->is_index ? "index" : "manifest",
                    (long long)m->step, (size_t)hl + blen, m->nfiles, m->ntensors, nchunks, CKPT_MAX_MANIFEST,
                    CKPT_MAX_MANIFEST >> 20);
  }
  char *out = malloc((size_t)hl + blen + 1);
  if (!out) {
    free(body);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory encoding a manifest of %zu bytes", blen);
  }
  memcpy(out, head, (size_t)hl);
  memcpy(out + hl, body, blen + 1);
  free(body);
  *text = out;
  *len = (size_t)hl + blen;
  return NEWT_OK;
}

/* ---- decoding ---------------------------------------------------------------------------- */

/* A manifest or index larger than CKPT_MAX_MANIFEST: refused before it is read or parsed. */
static newt_result_t too_big(const char *what, size_t bytes) {
  return NEWT_ERR(NEWT_ERR_INVALID, "%s: %zu bytes, more than the %zu bytes (%zu MiB) a newt manifest or index may "
                  "have: not read (docs/ckpt.md, \"Limits\")", what, bytes, CKPT_MAX_MANIFEST, CKPT_MAX_MANIFEST >> 20);
}

static newt_result_t get_range(const cJSON *o, const char *what, const char *field, int64_t lo,
                               int64_t hi, int64_t *out) {
  int64_t v = 0;
  NEWT_CHECK(newt_json_get_int(o, what, field, 1, &v));
  if (v < lo || v > hi)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: %lld is out of range [%lld, %lld]", what, field,
                    (long long)v, (long long)lo, (long long)hi);
  *out = v;
  return NEWT_OK;
}

static newt_result_t get_hex(const cJSON *o, const char *what, const char *field, uint64_t *out) {
  const char *s = NULL;
  NEWT_CHECK(newt_json_get_str(o, what, field, 1, &s));
  uint8_t b[8];
  if (strlen(s) != 16 || newt_hex_decode(s, b, 8) != 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: expected 16 hex digits, got \"%.40s\"", what, field, s);
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | b[i];
  *out = v;
  return NEWT_OK;
}

static newt_result_t get_name(const cJSON *o, const char *what, const char *field,
                              const char *const *names, int n, uint8_t *out) {
  const char *s = NULL;
  NEWT_CHECK(newt_json_get_str(o, what, field, 1, &s));
  for (int i = 0; i < n; i++)
    if (strcmp(s, names[i]) == 0) {
      *out = (uint8_t)i;
      return NEWT_OK;
    }
  return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: unknown value \"%.40s\"", what, field, s);
}

/* An array of ndim integers in [lo, hi] (ndim < 0: any length from 1 to NEWT_SLICE_MAX_DIMS). */
static newt_result_t get_dims(const cJSON *o, const char *what, const char *field, int *ndim,
                              int64_t lo, int64_t hi, int64_t *out) {
  const cJSON *a = NULL;
  NEWT_CHECK(newt_json_get_arr(o, what, field, 1, &a));
  int n = cJSON_GetArraySize(a);
  if (*ndim < 0 && (n < 1 || n > NEWT_SLICE_MAX_DIMS))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: %d dimensions, expected 1 to %d", what, field, n, NEWT_SLICE_MAX_DIMS);
  if (*ndim >= 0 && n != *ndim)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: %d dimensions, the tensor has %d", what, field, n, *ndim);
  int i = 0;
  for (const cJSON *it = a->child; it; it = it->next, i++) {
    char p[320];
    snprintf(p, sizeof p, "%s.%s[%d]", what, field, i);
    NEWT_CHECK(newt_json_item_int(it, p, &out[i]));
    if (out[i] < lo || out[i] > hi)
      return NEWT_ERR(NEWT_ERR_INVALID, "%s: %lld is out of range [%lld, %lld]", p, (long long)out[i],
                      (long long)lo, (long long)hi);
  }
  *ndim = n;
  return NEWT_OK;
}

#define MAXV ((int64_t)1 << 53)

static newt_result_t decode_chunk(const cJSON *o, const char *what, const ckpt_manifest *m,
                                  const ckpt_tensor *t, ckpt_chunk *c) {
  static const char *const known[] = {"file", "offset", "stored", "raw", "codec", "filter", "xxh_raw",
                                      "xxh_stored", "box_offset", "box_shape", "begin", "end", NULL};
  NEWT_CHECK(newt_json_check_fields(o, what, known));
  int64_t v;
  NEWT_CHECK(get_range(o, what, "file", 0, (int64_t)m->nfiles - 1, &v));
  c->file = (uint32_t)v;
  NEWT_CHECK(get_range(o, what, "offset", CKPT_SHARD_HDR, MAXV, &v));
  c->offset = (uint64_t)v;
  NEWT_CHECK(get_range(o, what, "stored", 0, (int64_t)CKPT_MAX_CHUNK, &v));
  c->stored = (uint64_t)v;
  NEWT_CHECK(get_range(o, what, "raw", 1, (int64_t)CKPT_MAX_CHUNK, &v));
  c->raw = (uint64_t)v;
  NEWT_CHECK(get_name(o, what, "codec", codec_names, CKPT_CODEC__COUNT, &c->codec));
  NEWT_CHECK(get_name(o, what, "filter", filter_names, CKPT_FILTER__COUNT, &c->filter));
  NEWT_CHECK(get_hex(o, what, "xxh_raw", &c->xxh_raw));
  NEWT_CHECK(get_hex(o, what, "xxh_stored", &c->xxh_stored));
  newt_slice *s = &c->slice;
  memset(s, 0, sizeof *s);
  s->ndim = t->ndim;
  NEWT_CHECK(get_dims(o, what, "box_offset", &s->ndim, 0, MAXV, s->offset));
  NEWT_CHECK(get_dims(o, what, "box_shape", &s->ndim, 1, MAXV, s->shape));
  NEWT_CHECK(get_range(o, what, "begin", 0, MAXV, &s->begin));
  NEWT_CHECK(get_range(o, what, "end", 1, MAXV, &s->end));
  newt_tensor_desc d = {.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
  memcpy(d.shape, t->shape, sizeof d.shape);
  NEWT_CHECK(newt_slice_check(s, &d, what));
  size_t es = newt_dtype_size(t->dtype);
  if (c->raw != (uint64_t)newt_slice_numel(s) * es)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.raw: %llu bytes, but the slice holds %lld %s elements", what,
                    (unsigned long long)c->raw, (long long)newt_slice_numel(s), newt_dtype_name(t->dtype));
  if (c->codec == CKPT_CODEC_RAW && (c->stored != c->raw || c->filter != CKPT_FILTER_NONE))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: a raw chunk must have stored == raw and filter none", what);
  if (c->codec == CKPT_CODEC_ZSTD && (c->stored == 0 || c->stored >= c->raw))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.stored: %llu bytes for a zstd chunk of %llu raw bytes", what,
                    (unsigned long long)c->stored, (unsigned long long)c->raw);
  const ckpt_file *f = &m->files[c->file];
  if (c->offset + CKPT_CHUNK_HDR + c->stored > f->bytes)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: bytes %llu..%llu lie past the end of %s (%llu bytes)", what,
                    (unsigned long long)c->offset, (unsigned long long)(c->offset + CKPT_CHUNK_HDR + c->stored),
                    f->name, (unsigned long long)f->bytes);
  return NEWT_OK;
}

/* A tensor's name, dtype and shape (o holds those members alone: its chunks are read one at a
 * time, by decode_tensor below): added to m, *out. */
static newt_result_t decode_tensor_head(const cJSON *o, const char *what, ckpt_manifest *m, ckpt_tensor **out) {
  const char *name = NULL, *dt = NULL;
  NEWT_CHECK(newt_json_get_str(o, what, "name", 1, &name));
  size_t nl = strlen(name);
  if (nl == 0 || nl > CKPT_MAX_NAME)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.name: %zu bytes, expected 1 to %d", what, nl, CKPT_MAX_NAME);
  for (const char *p = name; *p; p++)
    if ((unsigned char)*p < 0x20)
      return NEWT_ERR(NEWT_ERR_INVALID, "%s.name: control character in \"%.60s\"", what, name);
  NEWT_CHECK(newt_json_get_str(o, what, "dtype", 1, &dt));
  int dtype = newt_dtype_from_name(dt);
  if (dtype < 0) return NEWT_ERR(NEWT_ERR_INVALID, "%s.dtype: unknown dtype \"%.20s\"", what, dt);
  newt_tensor_desc d = {.name = name, .dtype = (newt_dtype)dtype, .ndim = -1};
  NEWT_CHECK(get_dims(o, what, "shape", &d.ndim, 0, MAXV, d.shape));
  int64_t numel = 1;
  for (int i = 0; i < d.ndim; i++) {
    if (d.shape[i] != 0 && numel > (MAXV / 8) / d.shape[i])
      return NEWT_ERR(NEWT_ERR_INVALID, "%s.shape: too many elements", what);
    numel *= d.shape[i];
  }
  return ckpt_manifest_add_tensor(m, &d, out);
}

static newt_result_t decode_file(const cJSON *o, const char *what, const ckpt_manifest *m, ckpt_file *f) {
  static const char *const known[] = {"name", "rank", "bytes", "raw_bytes", "layout", NULL};
  NEWT_CHECK(newt_json_check_fields(o, what, known));
  const char *name = NULL;
  NEWT_CHECK(newt_json_get_str(o, what, "name", 1, &name));
  if (!ckpt_plain_name(name))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.name: \"%.80s\" is not a plain file name inside the checkpoint "
                    "directory (no '/', no \"..\", only letters, digits, '.', '_' and '-')", what, name);
  int64_t v;
  NEWT_CHECK(get_range(o, what, "rank", 0, m->nranks - 1, &v));
  f->rank = (int)v;
  NEWT_CHECK(get_range(o, what, "bytes", CKPT_SHARD_HDR, MAXV, &v));
  f->bytes = (uint64_t)v;
  NEWT_CHECK(get_range(o, what, "raw_bytes", 0, MAXV, &v));
  f->raw_bytes = (uint64_t)v;
  const cJSON *layout = NULL;
  NEWT_CHECK(newt_json_get_obj(o, what, "layout", 0, &layout));
  f->name = newt_strdup(name);
  NEWT_CHECK_ALLOC(f->name);
  decode_layout(layout, &f->layout);
  return NEWT_OK;
}

/* ---- reading the JSON a piece at a time ---------------------------------------------------
 *
 * A manifest is at most 8 MiB, but a tree of cJSON items holds 10 to 40 times the text (64
 * bytes and a malloc'd key per value: an 8 MiB manifest took 344 MB to inspect). So the
 * document is walked as text: the top object's members, each element of `files` and
 * `tensors`, each tensor's members and each of its chunks are found by their brackets, and
 * cJSON parses one small piece at a time, freed before the next; the chunks and tensors are
 * counted first and their arrays made to measure. What is held at once is the text, the
 * decoded structs (about the text's size) and one piece. The walk only finds where a value
 * ends (strings and their escapes, nesting); cJSON checks each piece's syntax, and an error
 * says the byte of the whole text, as a whole parse did. The state object, kept as a cJSON
 * tree, is bounded (CKPT_MAX_STATE_VALUES). */

typedef struct jtext {
  const char *body; /* the whole JSON text, for offsets in messages */
  size_t len;
  const char *what;
} jtext;

typedef struct jspan {
  const char *p, *end; /* [p, end): one value, no blanks around it */
} jspan;

static const char *skip_blank(const char *p, const char *end) {
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
  return p;
}

static newt_result_t malformed(const jtext *t, const char *at) {
  return NEWT_ERR(NEWT_ERR_INVALID, "%s: malformed JSON at byte %zu of %zu", t->what, (size_t)(at - t->body), t->len);
}

/* The end of the value starting at p (its last byte + 1), NULL when the text ends first. */
static const char *value_end(const char *p, const char *end) {
  if (p >= end) return NULL;
  if (*p == '"') {
    for (p++; p < end; p++) {
      if (*p == '\\') p++;
      else if (*p == '"') return p + 1;
    }
    return NULL;
  }
  if (*p == '{' || *p == '[') {
    size_t depth = 0;
    for (; p < end; p++) {
      if (*p == '"') {
        if (!(p = value_end(p, end))) return NULL;
        p--;
      } else if (*p == '{' || *p == '[') {
        depth++;
      } else if (*p == '}' || *p == ']') {
        if (--depth == 0) return p + 1;
      }
    }
    return NULL;
  }
  while (p < end && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') p++;
  return p;
}

/* What a value is, from its first byte, as json.c names it (its syntax is not checked). */
static const char *kind_of(jspan v) {
  switch (v.p < v.end ? *v.p : 0) {
  case '{': return "an object";
  case '[': return "an array";
  case '"': return "a string";
  case 't': case 'f': return "a boolean";
  case 'n': return "null";
  default: return "a number";
  }
}

/* One piece parsed by cJSON. */
static newt_result_t parse_piece(const jtext *t, jspan v, cJSON **out) {
  const char *end = NULL;
  *out = cJSON_ParseWithLengthOpts(v.p, (size_t)(v.end - v.p), &end, 0);
  if (!*out || (end && end != v.end)) {
    cJSON_Delete(*out);
    *out = NULL;
    return malformed(t, end && end >= v.p && end <= v.end ? end : v.p);
  }
  return NEWT_OK;
}

/* The elements of an array or the members of an object, one at a time: *it is where the walk
 * is (the open bracket first). Returns 1 and the next element (an object's member: its key
 * too, still quoted), 0 at the closing bracket, -1 malformed (*it at the fault). */
static int next_in(const char **it, const char *end, int object, jspan *key, jspan *val) {
  const char *p = *it;
  if (*p == '{' || *p == '[') {
    p = skip_blank(p + 1, end);
    if (p < end && *p == (object ? '}' : ']')) return *it = p + 1, 0;
  } else if (*p == ',') {
    p = skip_blank(p + 1, end);
  } else if (*p == (object ? '}' : ']')) {
    return *it = p + 1, 0;
  } else {
    return -1;
  }
  if (object) {
    const char *k = value_end(p, end);
    if (p >= end || *p != '"' || !k) return *it = p, -1;
    *key = (jspan){p, k};
    p = skip_blank(k, end);
    if (p >= end || *p != ':') return *it = p, -1;
    p = skip_blank(p + 1, end);
  }
  const char *v = value_end(p, end);
  if (!v || v == p) return *it = p, -1;
  *val = (jspan){p, v};
  p = skip_blank(v, end);
  if (p >= end || (*p != ',' && *p != (object ? '}' : ']'))) return *it = p, -1;
  *it = p;
  return 1;
}

/* The elements of the array v (each at most once: n counts them when out is NULL). */
static newt_result_t array_elements(const jtext *t, jspan v, jspan *out, size_t *n) {
  const char *it = v.p;
  jspan key, val;
  int r;
  *n = 0;
  while ((r = next_in(&it, v.end, 0, &key, &val)) == 1) {
    if (out) out[*n] = val;
    (*n)++;
  }
  return r < 0 ? malformed(t, it) : NEWT_OK;
}

/* A member's key as text (keys newt reads are plain words: one with an escape is no key of
 * theirs and reads as unknown, quoted as written). */
static void key_text(jspan k, char *out, size_t cap) {
  size_t n = (size_t)(k.end - k.p) - 2;
  snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), k.p + 1);
}

/* An object's members, for the names in known (a name once: the first, as cJSON takes it).
 * members[i] is known[i]'s value (p NULL: absent); an unknown name is refused by name. */
static newt_result_t object_members(const jtext *t, jspan v, const char *what, const char *const *known,
                                    jspan *members) {
  size_t nk = 0;
  while (known[nk]) members[nk++] = (jspan){NULL, NULL};
  if (v.p >= v.end || *v.p != '{') return NEWT_ERR(NEWT_ERR_INVALID, "%s: expected an object, got %s", what, kind_of(v));
  const char *it = v.p;
  jspan key, val;
  int r;
  while ((r = next_in(&it, v.end, 1, &key, &val)) == 1) {
    char name[64];
    key_text(key, name, sizeof name);
    size_t i = 0;
    while (i < nk && strcmp(known[i], name) != 0) i++;
    if (i == nk) return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: unknown field", what, name);
    if (!members[i].p) members[i] = val;
  }
  return r < 0 ? malformed(t, it) : NEWT_OK;
}

/* The members of `pick` (indexes into known, -1 ended) parsed into one small cJSON object, for
 * the getters of json.h. */
static newt_result_t small_object(const jtext *t, const char *const *known, const jspan *members, const int *pick,
                                  cJSON **out) {
  *out = cJSON_CreateObject();
  NEWT_CHECK_ALLOC(*out);
  for (const int *k = pick; *k >= 0; k++) {
    if (!members[*k].p) continue;
    cJSON *item;
    newt_result_t r = parse_piece(t, members[*k], &item);
    if (r == NEWT_OK && !cJSON_AddItemToObject(*out, known[*k], item)) {
      cJSON_Delete(item);
      r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory reading %s", t->what);
    }
    if (r != NEWT_OK) {
      cJSON_Delete(*out);
      *out = NULL;
      return r;
    }
  }
  return NEWT_OK;
}

/* An array member that must be there: its elements (malloc'd, *n of them). */
static newt_result_t required_array(const jtext *t, jspan v, const char *what, const char *field, jspan **out,
                                    size_t *n) {
  *out = NULL;
  *n = 0;
  if (!v.p) return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: missing required field", what, field);
  if (*v.p != '[') return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: expected an array, got %s", what, field, kind_of(v));
  NEWT_CHECK(array_elements(t, v, NULL, n));
  *out = malloc((*n ? *n : 1) * sizeof **out);
  NEWT_CHECK_ALLOC(*out);
  return array_elements(t, v, *out, n);
}

/* The JSON values in v, counted without parsing it (a comma or an opening bracket outside a
 * string begins one). */
static size_t count_values(jspan v) {
  size_t n = 1;
  for (const char *p = v.p; p < v.end; p++) {
    if (*p == '"') {
      const char *e = value_end(p, v.end);
      if (!e) break;
      p = e - 1;
    } else if (*p == ',' || *p == '[' || *p == '{') {
      n++;
    }
  }
  return n;
}

/* Tensor i of the manifest: its head, then its chunks one at a time into an array made to
 * measure. */
static newt_result_t decode_tensor(const jtext *t, jspan v, const char *what, ckpt_manifest *m) {
  static const char *const known[] = {"name", "dtype", "shape", "chunks", NULL};
  static const int head[] = {0, 1, 2, -1};
  jspan members[4];
  NEWT_CHECK(object_members(t, v, what, known, members));
  cJSON *o;
  NEWT_CHECK(small_object(t, known, members, head, &o));
  ckpt_tensor *tensor = NULL;
  newt_result_t r = decode_tensor_head(o, what, m, &tensor);
  cJSON_Delete(o);
  NEWT_CHECK(r);
  jspan *chunks;
  size_t n;
  NEWT_CHECK(required_array(t, members[3], what, "chunks", &chunks, &n));
  if (n && !(tensor->chunks = malloc(n * sizeof *tensor->chunks))) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory reading %s", what);
  else tensor->cap = n;
  for (size_t j = 0; r == NEWT_OK && j < n; j++) {
    char p[300];
    snprintf(p, sizeof p, "%s.chunks[%zu]", what, j);
    cJSON *it;
    ckpt_chunk c;
    if ((r = parse_piece(t, chunks[j], &it)) != NEWT_OK) break;
    r = decode_chunk(it, p, m, tensor, &c);
    cJSON_Delete(it);
    if (r == NEWT_OK) r = ckpt_tensor_add_chunk(tensor, &c);
  }
  free(chunks);
  return r;
}

typedef struct file_name_at {
  const char *name;
  size_t i;
} file_name_at;

static int by_file_name(const void *a, const void *b) {
  const file_name_at *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : (x->i > y->i) - (x->i < y->i);
}

/* No shard file listed twice: the names sorted, neighbours compared (n log n). The one named
 * is the first, in the list's order, whose name came before. */
static newt_result_t check_files_once(const ckpt_manifest *m, const char *what) {
  if (m->nfiles < 2) return NEWT_OK;
  file_name_at *v = malloc(m->nfiles * sizeof *v);
  NEWT_CHECK_ALLOC(v);
  for (size_t i = 0; i < m->nfiles; i++) v[i] = (file_name_at){m->files[i].name, i};
  qsort(v, m->nfiles, sizeof *v, by_file_name);
  size_t twice = m->nfiles;
  for (size_t i = 1; i < m->nfiles; i++)
    if (strcmp(v[i - 1].name, v[i].name) == 0 && v[i].i < twice) twice = v[i].i;
  free(v);
  if (twice == m->nfiles) return NEWT_OK;
  return NEWT_ERR(NEWT_ERR_INVALID, "%s.files[%zu].name: \"%s\" is listed twice", what, twice, m->files[twice].name);
}

static newt_result_t decode_body(const jtext *t, int want_index, ckpt_manifest *m) {
  static const char *const known[] = {"format", "version", "kind", "step", "nranks", "rank", "attempt",
                                      "created_ms", "files", "tensors", "state", "mac", NULL};
  enum { F_FILES = 8, F_TENSORS = 9, F_STATE = 10, F_MAC = 11 };
  static const int head[] = {0, 1, 2, 3, 4, 5, 6, 7, -1};
  const char *what = t->what;
  const char *p = skip_blank(t->body, t->body + t->len);
  const char *e = value_end(p, t->body + t->len);
  if (!e) return malformed(t, p < t->body + t->len ? t->body + t->len : p);
  jspan members[12];
  NEWT_CHECK(object_members(t, (jspan){p, e}, what, known, members));
  cJSON *root;
  NEWT_CHECK(small_object(t, known, members, head, &root));
  newt_result_t r = NEWT_OK;
  const char *format = NULL, *kind = NULL;
  int64_t v;
  if ((r = newt_json_get_str(root, what, "format", 1, &format)) != NEWT_OK) goto out;
  if (strcmp(format, "newt-ckpt") != 0) {
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s.format: \"%.40s\", expected \"newt-ckpt\"", what, format);
    goto out;
  }
  if ((r = get_range(root, what, "version", CKPT_FORMAT_VERSION, CKPT_FORMAT_VERSION, &v)) != NEWT_OK) goto out;
  if ((r = newt_json_get_str(root, what, "kind", 1, &kind)) != NEWT_OK) goto out;
  if (strcmp(kind, want_index ? "index" : "manifest") != 0) {
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s.kind: \"%.40s\", expected \"%s\"", what, kind, want_index ? "index" : "manifest");
    goto out;
  }
  m->is_index = want_index;
  if ((r = get_range(root, what, "step", 0, MAXV, &m->step)) != NEWT_OK) goto out;
  if ((r = get_range(root, what, "nranks", 1, CKPT_MAX_RANKS, &v)) != NEWT_OK) goto out;
  m->nranks = (int)v;
  if (want_index) {
    if ((r = get_range(root, what, "rank", 0, m->nranks - 1, &v)) != NEWT_OK) goto out;
    m->rank = (int)v;
  }
  if ((r = get_hex(root, what, "attempt", &m->attempt)) != NEWT_OK) goto out;
  if ((r = get_range(root, what, "created_ms", 0, MAXV, &v)) != NEWT_OK) goto out;
  m->created_ms = (uint64_t)v;

  jspan *items = NULL;
  size_t n = 0;
  if ((r = required_array(t, members[F_FILES], what, "files", &items, &n)) != NEWT_OK) goto out;
  if (n < 1 || n > (size_t)m->nranks * 16) {
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s.files: %zu entries for %d ranks", what, n, m->nranks);
  } else if (!(m->files = calloc(n, sizeof *m->files))) {
    r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory reading %s", what);
  }
  for (size_t i = 0; r == NEWT_OK && i < n; i++) {
    char fp[160];
    snprintf(fp, sizeof fp, "%s.files[%zu]", what, i);
    cJSON *it;
    if ((r = parse_piece(t, items[i], &it)) != NEWT_OK) break;
    r = decode_file(it, fp, m, &m->files[i]);
    cJSON_Delete(it);
    if (r == NEWT_OK) m->nfiles++;
  }
  free(items);
  items = NULL;
  if (r == NEWT_OK) r = check_files_once(m, what);
  if (r == NEWT_OK) r = required_array(t, members[F_TENSORS], what, "tensors", &items, &n);
  if (r == NEWT_OK && n && !(m->tensors = calloc(n, sizeof *m->tensors)))
    r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory reading %s", what);
  else if (r == NEWT_OK) m->cap = n;
  for (size_t i = 0; r == NEWT_OK && i < n; i++) {
    char tp[160];
    snprintf(tp, sizeof tp, "%s.tensors[%zu]", what, i);
    r = decode_tensor(t, items[i], tp, m);
  }
  free(items);
  if (r != NEWT_OK) goto out;
  if ((r = ckpt_manifest_sort(m, 0, what)) != NEWT_OK) goto out;
  for (size_t k = 0; k < m->ntensors; k++) {
    char cp[CKPT_MAX_NAME + 64];
    snprintf(cp, sizeof cp, "%s: tensor \"%s\"", what, m->tensors[k].name);
    if ((r = ckpt_coverage_check(&m->tensors[k], !want_index, cp)) != NEWT_OK) goto out;
  }
  if (!want_index) {
    jspan st = members[F_STATE];
    if (!st.p) r = NEWT_ERR(NEWT_ERR_INVALID, "%s.state: missing required field", what);
    else if (*st.p != '{') r = NEWT_ERR(NEWT_ERR_INVALID, "%s.state: expected an object, got %s", what, kind_of(st));
    else if ((n = count_values(st)) > CKPT_MAX_STATE_VALUES)
      r = NEWT_ERR(NEWT_ERR_INVALID, "%s.state: %zu values, at most %d (docs/ckpt.md, \"Limits\")", what, n,
                   CKPT_MAX_STATE_VALUES);
    else r = parse_piece(t, st, &m->state);
  }
  jspan mac = members[F_MAC]; /* its proof is check_mac's; here its form: a string, the last field */
  if (r == NEWT_OK && mac.p &&
      (t->len < MAC_SUFFIX_LEN || mac.p != t->body + t->len - MAC_SUFFIX_LEN + 7 || mac.end != t->body + t->len - 1 ||
       memcmp(t->body + t->len - MAC_SUFFIX_LEN, ",\"mac\":\"", 8) != 0))
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s.mac: 64 hex digits, the last field", what);
out:
  cJSON_Delete(root);
  return r;
}

/* A file's "mac": the last field, its form, and with a key its proof (before the JSON is
 * parsed: another job's file costs no parse). */
static newt_result_t check_mac(const char *body, size_t blen, const char *what, int index, const ckpt_key *key) {
  static const char head[] = ",\"mac\":\"";
  const char *at = blen >= MAC_SUFFIX_LEN ? body + blen - MAC_SUFFIX_LEN : NULL;
  int has = at && memcmp(at, head, 8) == 0 && at[MAC_SUFFIX_LEN - 2] == '"' && at[MAC_SUFFIX_LEN - 1] == '}';
  unsigned char got[NEWT_MAC_BYTES], want[NEWT_MAC_BYTES];
  char hex[NEWT_MAC_HEX + 1];
  if (has) {
    memcpy(hex, at + 8, NEWT_MAC_HEX);
    hex[NEWT_MAC_HEX] = '\0';
    has = newt_hex_decode(hex, got, sizeof got) == 0;
  }
  if (!key || !key->has) return NEWT_OK; /* its form: the parser's (the last field, 64 hex digits) */
  if (!has)
    return NEWT_ERR(NEWT_ERR_AUTH, "%s: not proved by this job's key (written without one: by a job without a secret, "
                    "newt train without one or the previous release; `newt ckpt sign` adopts a step you trust)", what);
  NEWT_CHECK(body_mac(key, index, body, blen - MAC_SUFFIX_LEN, want));
  if (!newt_ct_equal(got, want, sizeof got))
    return NEWT_ERR(NEWT_ERR_AUTH, "%s: proved by another key than this job's: another job's checkpoint (or changed "
                    "since it was written); not read", what);
  return NEWT_OK;
}

newt_result_t ckpt_manifest_decode(const char *text, size_t len, const char *what, int want_index,
                                   ckpt_manifest *m) {
  return ckpt_manifest_decode_keyed(text, len, what, want_index, NULL, m);
}

newt_result_t ckpt_manifest_decode_keyed(const char *text, size_t len, const char *what, int want_index,
                                         const ckpt_key *key, ckpt_manifest *m) {
  memset(m, 0, sizeof *m);
  if (len > CKPT_MAX_MANIFEST) return too_big(what, len);
  const char *nl = memchr(text, '\n', len < 200 ? len : 200);
  if (!nl)
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: no header line (empty, truncated or not a newt checkpoint file)", what);
  char head[256], kind[32], hex[32];
  snprintf(head, sizeof head, "%.*s", (int)(nl - text), text);
  int version = 0;
  unsigned long long blen = 0;
  int used = 0;
  if (sscanf(head, "newt-ckpt %31s %d %llu %31s%n", kind, &version, &blen, hex, &used) != 4 ||
      (size_t)used != strlen(head))
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: malformed header line \"%.80s\"", what, head);
  if (strcmp(kind, want_index ? "index" : "manifest") != 0)
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: header says \"%s\", expected \"%s\"", what, kind,
                    want_index ? "index" : "manifest");
  if (version != CKPT_FORMAT_VERSION)
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: format version %d, this build reads %d", what, version,
                    CKPT_FORMAT_VERSION);
  const char *body = nl + 1;
  size_t have = len - (size_t)(body - text);
  if (have < blen)
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: truncated: the header announces %llu bytes of JSON, the file "
                    "holds %zu", what, blen, have);
  if (have > blen)
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: %zu stray bytes after the JSON", what, have - (size_t)blen);
  char want[17];
  snprintf(want, sizeof want, "%016llx", (unsigned long long)ckpt_hash(body, (size_t)blen));
  if (strcmp(want, hex) != 0)
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: checksum mismatch (header %s, content %s)", what, hex, want);
  NEWT_CHECK(check_mac(body, (size_t)blen, what, want_index, key));
  jtext t = {body, (size_t)blen, what};
  newt_result_t r = decode_body(&t, want_index, m);
  if (r != NEWT_OK) ckpt_manifest_free(m);
  else m->encoded_bytes = len;
  return r;
}

newt_result_t ckpt_manifest_load(int dirfd, const char *dir, const char *name, int want_index,
                                 ckpt_manifest *m) {
  return ckpt_manifest_load_keyed(dirfd, dir, name, want_index, NULL, m);
}

newt_result_t ckpt_manifest_load_keyed(int dirfd, const char *dir, const char *name, int want_index,
                                       const ckpt_key *key, ckpt_manifest *m) {
  char *text = NULL, what[4400];
  size_t len = 0;
  memset(m, 0, sizeof *m);
  snprintf(what, sizeof what, "%s%s%s", dir ? dir : "", dir ? "/" : "", name);
  struct stat st; /* the size, before anything is read: a larger file is never read, let alone parsed */
  if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
      (uint64_t)st.st_size > CKPT_MAX_MANIFEST)
    return too_big(what, (size_t)st.st_size);
  NEWT_CHECK(newt_fs_read_all_at(dirfd, dir, name, CKPT_MAX_MANIFEST, &text, &len));
  newt_result_t r = ckpt_manifest_decode_keyed(text, len, what, want_index, key, m);
  free(text);
  return r;
}
