/* The chunk codec: a byte-grouping filter, zstd, and the two XXH3 checksums.
 *
 * Float bytes of one significance compress very differently: the exponent byte of trained
 * weights takes a handful of values, the low mantissa bytes are noise. The filter gathers
 * byte k of every element into group k (shuffle); for f32 and bf16 it first rotates each
 * element left by one bit so the 8 exponent bits fill one byte instead of straddling two
 * (shuffle-rot1). zstd then finds the exponent group cheap to code and passes the noise
 * through nearly raw. A chunk that zstd does not make smaller is stored raw.
 *
 * Byte-grouped floats have almost no repeated strings, only skewed byte frequencies: what
 * pays is entropy coding, and the time zstd spends looking for matches is lost. At level 1
 * (the default) such chunks are therefore compressed in "entropy mode": zstd's fastest
 * match finder at its highest acceleration, minimum match length 7, literals always
 * Huffman-coded. On weights and AdamW moments that is about four times faster than zstd's
 * own level 1 and a little smaller too. Other levels are zstd's, as they are. */
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_c_literalCompressionMode: checked at run time below */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <zstd_errors.h>

#include "ckpt/internal.h"

int ckpt_filter_for(newt_dtype dt) {
  switch (dt) {
    case NEWT_F32:
    case NEWT_BF16: return CKPT_FILTER_ROT1;
    case NEWT_F16:
    case NEWT_I32:
    case NEWT_I64: return CKPT_FILTER_SHUFFLE;
    default: return CKPT_FILTER_NONE;
  }
}

static void shuffle4(const uint8_t *in, uint8_t *out, size_t n, int rot) {
  uint8_t *o0 = out, *o1 = out + n, *o2 = out + 2 * n, *o3 = out + 3 * n;
  for (size_t i = 0; i < n; i++) {
    uint32_t v;
    memcpy(&v, in + 4 * i, 4);
    if (rot) v = (v << 1) | (v >> 31);
    o0[i] = (uint8_t)v;
    o1[i] = (uint8_t)(v >> 8);
    o2[i] = (uint8_t)(v >> 16);
    o3[i] = (uint8_t)(v >> 24);
  }
}

static void unshuffle4(const uint8_t *in, uint8_t *out, size_t n, int rot) {
  const uint8_t *i0 = in, *i1 = in + n, *i2 = in + 2 * n, *i3 = in + 3 * n;
  for (size_t i = 0; i < n; i++) {
    uint32_t v = (uint32_t)i0[i] | (uint32_t)i1[i] << 8 | (uint32_t)i2[i] << 16 | (uint32_t)i3[i] << 24;
    if (rot) v = (v >> 1) | (v << 31);
    memcpy(out + 4 * i, &v, 4);
  }
}

static void shuffle2(const uint8_t *in, uint8_t *out, size_t n, int rot) {
  uint8_t *o0 = out, *o1 = out + n;
  for (size_t i = 0; i < n; i++) {
    uint16_t v;
    memcpy(&v, in + 2 * i, 2);
    if (rot) v = (uint16_t)((v << 1) | (v >> 15));
    o0[i] = (uint8_t)v;
    o1[i] = (uint8_t)(v >> 8);
  }
}

static void unshuffle2(const uint8_t *in, uint8_t *out, size_t n, int rot) {
  const uint8_t *i0 = in, *i1 = in + n;
  for (size_t i = 0; i < n; i++) {
    uint16_t v = (uint16_t)(i0[i] | i1[i] << 8);
    if (rot) v = (uint16_t)((v >> 1) | (v << 15));
    memcpy(out + 2 * i, &v, 2);
  }
}

/* Element sizes other than 2 and 4 (i64): plain byte gathering, no rotation. */
static void shuffle_any(const uint8_t *in, uint8_t *out, size_t n, size_t es, int undo) {
  for (size_t k = 0; k < es; k++)
    for (size_t i = 0; i < n; i++) {
      if (undo) out[i * es + k] = in[k * n + i];
      else out[k * n + i] = in[i * es + k];
    }
}

void ckpt_filter_apply(int filter, size_t es, const void *in, void *out, size_t len) {
  size_t n = len / es;
  int rot = filter == CKPT_FILTER_ROT1;
  if (filter == CKPT_FILTER_NONE || es < 2) memcpy(out, in, len);
  else if (es == 4) shuffle4(in, out, n, rot);
  else if (es == 2) shuffle2(in, out, n, rot);
  else shuffle_any(in, out, n, es, 0);
}

void ckpt_filter_undo(int filter, size_t es, const void *in, void *out, size_t len) {
  size_t n = len / es;
  int rot = filter == CKPT_FILTER_ROT1;
  if (filter == CKPT_FILTER_NONE || es < 2) memcpy(out, in, len);
  else if (es == 4) unshuffle4(in, out, n, rot);
  else if (es == 2) unshuffle2(in, out, n, rot);
  else shuffle_any(in, out, n, es, 1);
}

void ckpt_codec_free(ckpt_codec *c) {
  ZSTD_freeCCtx(c->cctx);
  ZSTD_freeDCtx(c->dctx);
  free(c->tmp);
  memset(c, 0, sizeof *c);
}

static newt_result_t grow(uint8_t **buf, size_t *cap, size_t need) {
  if (*cap >= need) return NEWT_OK;
  uint8_t *nb = realloc(*buf, need);
  if (!nb) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: a chunk buffer of %zu bytes", need);
  *buf = nb;
  *cap = need;
  return NEWT_OK;
}

newt_result_t ckpt_buf_grow(uint8_t **buf, size_t *cap, size_t need) {
  if (*cap >= need) return NEWT_OK;
  free(*buf);
  *buf = NULL;
  *cap = 0;
  need = ckpt_align_up(need);
  if (posix_memalign((void **)buf, CKPT_ALIGN, need) != 0 || !*buf) {
    *buf = NULL;
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: a chunk buffer of %zu bytes", need);
  }
  *cap = need;
  return NEWT_OK;
}

/* Sets the compression parameters of c->cctx for level (and entropy mode), once. */
static newt_result_t set_params(ckpt_codec *c, int level, int entropy) {
  if (!c->cctx) {
    c->cctx = ZSTD_createCCtx();
    if (!c->cctx) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: a zstd compression context");
    c->cctx_mode = INT_MIN;
  }
  int mode = level * 2 + entropy;
  if (c->cctx_mode == mode) return NEWT_OK;
  ZSTD_CCtx_reset(c->cctx, ZSTD_reset_parameters);
  size_t r = ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_compressionLevel, entropy ? -1000 : level);
  if (!ZSTD_isError(r) && entropy) {
    /* An experimental parameter: a libzstd that refuses it gets zstd's plain level 1. */
    if (ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_literalCompressionMode, ZSTD_ps_enable)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_minMatch, 7))) {
      ZSTD_CCtx_reset(c->cctx, ZSTD_reset_parameters);
      r = ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_compressionLevel, level);
    }
  }
  if (ZSTD_isError(r)) return NEWT_ERR(NEWT_ERR_INVALID, "zstd level %d: %s", level, ZSTD_getErrorName(r));
  c->cctx_mode = mode;
  return NEWT_OK;
}

newt_result_t ckpt_chunk_encode(ckpt_codec *c, const void *raw, size_t len, newt_dtype dt, int level,
                                ckpt_chunk_hdr *h, uint8_t *out) {
  size_t es = newt_dtype_size(dt);
  memset(h, 0, sizeof *h);
  h->esize = (uint8_t)es;
  h->raw = len;
  h->xxh_raw = ckpt_hash(raw, len);
  uint8_t *dst = out + CKPT_CHUNK_HDR;
  int filter = es > 1 && len % es == 0 ? ckpt_filter_for(dt) : CKPT_FILTER_NONE;
  size_t cs = 0;
  if (level > 0 && len >= 64) {
    const void *src = raw;
    if (filter != CKPT_FILTER_NONE) {
      NEWT_CHECK(grow(&c->tmp, &c->tmp_cap, len));
      ckpt_filter_apply(filter, es, raw, c->tmp, len);
      src = c->tmp;
    }
    NEWT_CHECK(set_params(c, level, filter != CKPT_FILTER_NONE && level == 1));
    /* Room for one byte less than raw: what does not fit is not worth storing compressed. */
    cs = ZSTD_compress2(c->cctx, dst, len - 1, src, len);
    if (ZSTD_isError(cs)) {
      if (ZSTD_getErrorCode(cs) != ZSTD_error_dstSize_tooSmall)
        return NEWT_ERR(NEWT_ERR_INTERNAL, "zstd compression (level %d) failed: %s", level, ZSTD_getErrorName(cs));
      cs = 0; /* incompressible */
    }
  }
  if (cs > 0) {
    h->codec = CKPT_CODEC_ZSTD;
    h->filter = (uint8_t)filter;
    h->stored = cs;
    h->xxh_stored = ckpt_hash(dst, cs);
  } else {
    h->codec = CKPT_CODEC_RAW;
    h->filter = CKPT_FILTER_NONE;
    h->stored = len;
    h->xxh_stored = h->xxh_raw;
    memcpy(dst, raw, len);
  }
  ckpt_chunk_hdr_encode(h, out);
  return NEWT_OK;
}

newt_result_t ckpt_chunk_decode(ckpt_codec *c, const ckpt_chunk_hdr *h, const void *stored, void *out,
                                const char *what) {
  if (h->codec >= CKPT_CODEC__COUNT || h->filter >= CKPT_FILTER__COUNT ||
      (h->esize != 1 && h->esize != 2 && h->esize != 4 && h->esize != 8) ||
      (h->filter != CKPT_FILTER_NONE && (h->esize < 2 || h->raw % h->esize != 0)))
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: unknown codec %d / filter %d / element size %d", what, h->codec,
                    h->filter, h->esize);
  if (ckpt_hash(stored, h->stored) != h->xxh_stored)
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: checksum mismatch in the stored bytes (%llu bytes)", what,
                    (unsigned long long)h->stored);
  if (h->codec == CKPT_CODEC_RAW) {
    if (h->stored != h->raw)
      return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: raw chunk with %llu stored bytes for %llu raw", what,
                      (unsigned long long)h->stored, (unsigned long long)h->raw);
    if (out != stored) memcpy(out, stored, h->raw);
  } else {
    if (!c->dctx) {
      c->dctx = ZSTD_createDCtx();
      if (!c->dctx) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: a zstd decompression context");
    }
    void *dst = out;
    if (h->filter != CKPT_FILTER_NONE) {
      NEWT_CHECK(grow(&c->tmp, &c->tmp_cap, h->raw));
      dst = c->tmp;
    }
    size_t ds = ZSTD_decompressDCtx(c->dctx, dst, h->raw, stored, h->stored);
    if (ZSTD_isError(ds))
      return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: zstd: %s", what, ZSTD_getErrorName(ds));
    if (ds != h->raw)
      return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: decompressed to %zu bytes, expected %llu", what, ds,
                      (unsigned long long)h->raw);
    if (h->filter != CKPT_FILTER_NONE) ckpt_filter_undo(h->filter, h->esize, c->tmp, out, h->raw);
  }
  if (ckpt_hash(out, h->raw) != h->xxh_raw)
    return NEWT_ERR(NEWT_ERR_CORRUPT, "%s: checksum mismatch in the decoded bytes", what);
  return NEWT_OK;
}
