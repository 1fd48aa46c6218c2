/* Token files: what `newt data prepare` writes and the loader reads. The format is
 * documented as a table at the top of tokens.c. Tokens are unsigned integers of 1, 2 or 4
 * bytes, all below the header's vocab; the byte-level tokenizer (vocab 256) maps each
 * byte of a text to one token of width 1.
 *
 * A token file is opened read-only with mmap; its header, size and checksums are checked
 * on open, so a truncated or corrupt file is rejected with an error naming it. A
 * model_tokens can also wrap tokens in memory (the generated corpus). */
#ifndef NEWT_MODEL_TOKENS_H
#define NEWT_MODEL_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define MODEL_TOKENS_MAGIC "NEWTTOKS"
#define MODEL_TOKENS_VERSION 1
#define MODEL_TOKENS_HEADER 64

typedef struct model_tokens {
  uint32_t width;      /* bytes per token: 1, 2 or 4 */
  uint32_t vocab;      /* every token is < vocab */
  uint64_t count;      /* tokens */
  const uint8_t *data; /* count * width bytes, little-endian */
  void *map;           /* the mapping (files) or the owned copy (memory); freed on close */
  size_t map_len;
  int mapped;
} model_tokens;

newt_result_t model_tokens_open(model_tokens *t, const char *path);
/* Copies `count` tokens of `width` bytes into an owned buffer. */
newt_result_t model_tokens_from_memory(model_tokens *t, const void *data, uint32_t width,
                                       uint64_t count, uint32_t vocab);
void model_tokens_close(model_tokens *t);

static inline uint32_t model_tokens_at(const model_tokens *t, uint64_t i) {
  const uint8_t *p = t->data + i * t->width;
  switch (t->width) {
    case 1: return p[0];
    case 2: return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    default: return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  }
}

/* Writes a token file atomically (temporary file, fsync, rename). Checks every token < vocab. */
newt_result_t model_tokens_write(const char *path, const void *tokens, uint32_t width, uint64_t count,
                                 uint32_t vocab);

/* The byte-level tokenizer: the file at in_path becomes a token file of width 1, vocab 256. */
newt_result_t model_tokens_prepare(const char *in_path, const char *out_path, uint64_t *count);

/* A generated, learnable text of n bytes, a pure function of seed: sentences of
 * pseudo-words drawn from a seeded lexicon in which every word prefers a few successors.
 * out receives n bytes (no terminator). */
void model_text_generate(uint64_t seed, char *out, size_t n);

#endif
