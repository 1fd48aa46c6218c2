/* Token files (see tokens.h). The on-disk format, version 1, all integers little-endian:
 *
 *   offset  size         field
 *   ------  -----------  ---------------------------------------------------------------
 *        0  8            magic "NEWTTOKS"
 *        8  4            version, u32 = 1
 *       12  4            token width in bytes, u32: 1, 2 or 4
 *       16  8            token count, u64
 *       24  4            vocab, u32: every token is < vocab
 *       28  4            reserved, 0
 *       32  8            XXH64 (seed 0) of the token bytes [64, 64 + count * width)
 *       40  8            XXH64 (seed 0) of header bytes [0, 40)
 *       48  16           reserved, 0
 *       64  count*width  the tokens
 *
 * The file's size must be exactly 64 + count * width. A reader checks the magic, the
 * version, the width, the size and both checksums before using a byte of it. */
#include "model/tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/fs.h"
#include "model/rng.h"

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const uint8_t *p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

static int width_ok(uint32_t w) { return w == 1 || w == 2 || w == 4; }

newt_result_t model_tokens_open(model_tokens *t, const char *path) {
  memset(t, 0, sizeof *t);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return NEWT_ERR(errno == ENOENT ? NEWT_ERR_NOTFOUND : NEWT_ERR_SYS, "token file %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return NEWT_ERR(NEWT_ERR_SYS, "token file %s: fstat: %s", path, strerror(errno));
  }
  size_t len = (size_t)st.st_size;
  if (len < MODEL_TOKENS_HEADER) {
    close(fd);
    return NEWT_ERR(NEWT_ERR_CORRUPT, "token file %s: %zu bytes, shorter than its 64-byte header", path, len);
  }
  void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return NEWT_ERR(NEWT_ERR_SYS, "token file %s: mmap: %s", path, strerror(errno));
  const uint8_t *h = map;
  newt_result_t res = NEWT_OK;
  uint32_t version = get_u32(h + 8), width = get_u32(h + 12), vocab = get_u32(h + 24);
  uint64_t count = get_u64(h + 16);
  if (memcmp(h, MODEL_TOKENS_MAGIC, 8) != 0)
    res = NEWT_ERR(NEWT_ERR_CORRUPT, "token file %s: bad magic (not a token file; see newt data prepare)", path);
  else if (XXH64(h, 40, 0) != get_u64(h + 40))
    res = NEWT_ERR(NEWT_ERR_CORRUPT, "token file %s: header checksum mismatch", path);
  else if (version != MODEL_TOKENS_VERSION)
    res = NEWT_ERR(NEWT_ERR_CORRUPT, "token file %s: version %u, this newt reads version %d", path, version,
                   MODEL_TOKENS_VERSION);
  else if (!width_ok(width))
    res = NEWT_ERR(NEWT_ERR_CORRUPT, "token file %s: token width %u (1, 2 or 4)", path, width);
  else if (vocab == 0 || (width < 4 && vocab > (1u << (8 * width))))
    res = NEWT_ERR(NEWT_ERR_CORRUPT, "token file %s: vocab %u does not fit width %u", path, vocab, width);
  else if (count > (len - MODEL_TOKENS_HEADER) / width || MODEL_TOKENS_HEADER + count * width != len)
    res = NEWT_ERR(NEWT_ERR_CORRUPT, "token file %s: %zu bytes, the header says %llu tokens of %u bytes (truncated?)",
                   path, len, (unsigned long long)count, width);
  else if (XXH64(h + MODEL_TOKENS_HEADER, count * width, 0) != get_u64(h + 32))
    res = NEWT_ERR(NEWT_ERR_CORRUPT, "token file %s: token data checksum mismatch", path);
  if (res != NEWT_OK) {
    munmap(map, len);
    return res;
  }
  *t = (model_tokens){.width = width, .vocab = vocab, .count = count, .data = h + MODEL_TOKENS_HEADER,
                      .map = map, .map_len = len, .mapped = 1};
  return NEWT_OK;
}

newt_result_t model_tokens_from_memory(model_tokens *t, const void *data, uint32_t width,
                                       uint64_t count, uint32_t vocab) {
  memset(t, 0, sizeof *t);
  if (!width_ok(width)) return NEWT_ERR(NEWT_ERR_INVALID, "tokens: width %u (1, 2 or 4)", width);
  void *copy = malloc(count > 0 ? count * width : 1);
  NEWT_CHECK_ALLOC(copy);
  memcpy(copy, data, count * width);
  *t = (model_tokens){.width = width, .vocab = vocab, .count = count, .data = copy, .map = copy,
                      .map_len = count * width};
  for (uint64_t i = 0; i < count; i++)
    if (model_tokens_at(t, i) >= vocab) {
      model_tokens_close(t);
      return NEWT_ERR(NEWT_ERR_INVALID, "tokens: token %llu is >= vocab %u", (unsigned long long)i, vocab);
    }
  return NEWT_OK;
}

void model_tokens_close(model_tokens *t) {
  if (t->mapped) munmap(t->map, t->map_len);
  else free(t->map);
  memset(t, 0, sizeof *t);
}

newt_result_t model_tokens_write(const char *path, const void *tokens, uint32_t width, uint64_t count,
                                 uint32_t vocab) {
  if (!width_ok(width)) return NEWT_ERR(NEWT_ERR_INVALID, "token file %s: width %u (1, 2 or 4)", path, width);
  model_tokens view = {.width = width, .vocab = vocab, .count = count, .data = tokens};
  for (uint64_t i = 0; i < count; i++)
    if (model_tokens_at(&view, i) >= vocab)
      return NEWT_ERR(NEWT_ERR_INVALID, "token file %s: token %llu is %u, not below vocab %u", path,
                      (unsigned long long)i, model_tokens_at(&view, i), vocab);
  size_t len = MODEL_TOKENS_HEADER + count * width;
  uint8_t *buf = calloc(1, len);
  NEWT_CHECK_ALLOC(buf);
  memcpy(buf, MODEL_TOKENS_MAGIC, 8);
  put_u32(buf + 8, MODEL_TOKENS_VERSION);
  put_u32(buf + 12, width);
  put_u64(buf + 16, count);
  put_u32(buf + 24, vocab);
  memcpy(buf + MODEL_TOKENS_HEADER, tokens, count * width);
  put_u64(buf + 32, XXH64(buf + MODEL_TOKENS_HEADER, count * width, 0));
  put_u64(buf + 40, XXH64(buf, 40, 0));
  newt_result_t res = newt_fs_write_atomic(path, buf, len);
  free(buf);
  return res;
}

newt_result_t model_tokens_prepare(const char *in_path, const char *out_path, uint64_t *count) {
  char *text = NULL;
  size_t len = 0;
  NEWT_CHECK(newt_fs_read_all(in_path, (size_t)1 << 34, &text, &len));
  newt_result_t res = NEWT_OK;
  if (len < 2) res = NEWT_ERR(NEWT_ERR_INVALID, "text %s: %zu bytes, too short to train on", in_path, len);
  else res = model_tokens_write(out_path, text, 1, len, 256);
  free(text);
  if (res == NEWT_OK && count) *count = len;
  return res;
}

/* --- the generated corpus ------------------------------------------------------------ */

#define GEN_WORDS 320
#define GEN_NEXT 3

void model_text_generate(uint64_t seed, char *out, size_t n) {
  static const char cons[] = "bcdfghklmnprstvwz", vow[] = "aeiou";
  char words[GEN_WORDS][12];
  int next[GEN_WORDS][GEN_NEXT];
  uint64_t ctr = 0;
#define R() model_rng_u64(seed, 0x7465787467656eull, ctr++)
  for (int w = 0; w < GEN_WORDS; w++) {
    int len = 2 + (int)(R() % 7);
    for (int i = 0; i < len; i++)
      words[w][i] = (i % 2 == 0) ? cons[R() % (sizeof cons - 1)] : vow[R() % (sizeof vow - 1)];
    words[w][len] = '\0';
    for (int k = 0; k < GEN_NEXT; k++) next[w][k] = (int)(R() % GEN_WORDS);
  }
  size_t pos = 0;
  int w = (int)(R() % GEN_WORDS), in_sentence = 0, left = 0;
  while (pos < n) {
    if (!in_sentence) {
      left = 4 + (int)(R() % 9);
      in_sentence = 1;
      w = (int)(R() % 40); /* sentences open with one of 40 words */
    } else {
      w = (R() % 5 != 0) ? next[w][R() % GEN_NEXT] : (int)(R() % GEN_WORDS);
    }
    char tmp[20];
    int m = snprintf(tmp, sizeof tmp, "%s", words[w]);
    if (in_sentence == 1) tmp[0] = (char)(tmp[0] - 'a' + 'A');
    in_sentence = 2;
    if (--left == 0) {
      tmp[m++] = '.';
      tmp[m++] = (R() % 4 == 0) ? '\n' : ' ';
      in_sentence = 0;
    } else {
      if (R() % 12 == 0) tmp[m++] = ',';
      tmp[m++] = ' ';
    }
    for (int i = 0; i < m && pos < n; i++) out[pos++] = tmp[i];
  }
#undef R
}
