/* Reduction kernels (see reduce.h). Each element type gets, from one macro, a
 * three-operand and an in-place loop for sum, sum-then-divide and max; the loops are
 * simple enough for the vectoriser (this file is built with -O3). Integer sums wrap
 * (computed unsigned); max of floats keeps a NaN from either side. */
#include "comm/reduce.h"

#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

static inline float bf16_load(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round to nearest even, NaN stays a (quiet) NaN: the same as newt_f32_to_bf16, written
 * without a branch so the loop vectorises. */
static inline uint16_t bf16_store(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t nan = (u >> 16) | 0x40u;
  return (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u) ? nan : rounded);
}

#define ID(v) (v)

#define FSUM(x, y, q) ((x) + (y))
#define FSUMDIV(x, y, q) (((x) + (y)) / (q))
#define FMAX(x, y, q) (((x) > (y) || (x) != (x)) ? (x) : (y))
#define IMAX(x, y, q) ((x) > (y) ? (x) : (y))
#define U32SUM(x, y, q) ((int32_t)((uint32_t)(x) + (uint32_t)(y)))
#define U32SUMDIV(x, y, q) (U32SUM(x, y, q) / (q))
#define U64SUM(x, y, q) ((int64_t)((uint64_t)(x) + (uint64_t)(y)))
#define U64SUMDIV(x, y, q) (U64SUM(x, y, q) / (q))
#define U8SUM(x, y, q) ((uint8_t)((x) + (y)))
#define U8SUMDIV(x, y, q) ((uint8_t)(U8SUM(x, y, q) / (q)))

/* d = a op b and d = d op b for one type and one combining expression. */
#define KERNEL(NAME, T, ACC, LOAD, STORE, COMBINE)                                           \
  static void NAME##_3(void *dv, const void *av, const void *bv, size_t n, int div) {       \
    T *restrict d = dv;                                                                      \
    const T *restrict a = av;                                                                \
    const T *restrict b = bv;                                                                \
    const ACC q = (ACC)div;                                                                  \
    (void)q;                                                                                 \
    for (size_t i = 0; i < n; i++) {                                                         \
      ACC x = LOAD(a[i]), y = LOAD(b[i]);                                                    \
      d[i] = STORE(COMBINE(x, y, q));                                                        \
    }                                                                                        \
  }                                                                                          \
  static void NAME##_2(void *dv, const void *av, const void *bv, size_t n, int div) {       \
    T *restrict d = dv;                                                                      \
    const T *restrict b = bv;                                                                \
    const ACC q = (ACC)div;                                                                  \
    (void)av;                                                                                \
    (void)q;                                                                                 \
    for (size_t i = 0; i < n; i++) {                                                         \
      ACC x = LOAD(d[i]), y = LOAD(b[i]);                                                    \
      d[i] = STORE(COMBINE(x, y, q));                                                        \
    }                                                                                        \
  }

/* The three combining forms of one type. */
#define TYPE_KERNELS(P, T, ACC, LOAD, STORE, SUM, SUMDIV, MAX) \
  KERNEL(P##_sum, T, ACC, LOAD, STORE, SUM)                  \
  KERNEL(P##_sumdiv, T, ACC, LOAD, STORE, SUMDIV)            \
  KERNEL(P##_max, T, ACC, LOAD, STORE, MAX)

TYPE_KERNELS(f32, float, float, ID, ID, FSUM, FSUMDIV, FMAX)
TYPE_KERNELS(bf16, uint16_t, float, bf16_load, bf16_store, FSUM, FSUMDIV, FMAX)
TYPE_KERNELS(i32, int32_t, int32_t, ID, ID, U32SUM, U32SUMDIV, IMAX)
TYPE_KERNELS(i64, int64_t, int64_t, ID, ID, U64SUM, U64SUMDIV, IMAX)
TYPE_KERNELS(u8, uint8_t, uint8_t, ID, ID, U8SUM, U8SUMDIV, IMAX)

typedef void (*kernel_fn)(void *, const void *, const void *, size_t, int);

/* [dtype][form: sum, sumdiv, max][in place] */
static const kernel_fn kernels[NEWT_DTYPE__COUNT][3][2] = {
    [NEWT_F32] = {{f32_sum_3, f32_sum_2}, {f32_sumdiv_3, f32_sumdiv_2}, {f32_max_3, f32_max_2}},
    [NEWT_BF16] = {{bf16_sum_3, bf16_sum_2}, {bf16_sumdiv_3, bf16_sumdiv_2}, {bf16_max_3, bf16_max_2}},
    [NEWT_I32] = {{i32_sum_3, i32_sum_2}, {i32_sumdiv_3, i32_sumdiv_2}, {i32_max_3, i32_max_2}},
    [NEWT_I64] = {{i64_sum_3, i64_sum_2}, {i64_sumdiv_3, i64_sumdiv_2}, {i64_max_3, i64_max_2}},
    [NEWT_U8] = {{u8_sum_3, u8_sum_2}, {u8_sumdiv_3, u8_sumdiv_2}, {u8_max_3, u8_max_2}},
};

int comm_reduce_supported(newt_dtype dt) {
  return (unsigned)dt < NEWT_DTYPE__COUNT && kernels[dt][0][0] != NULL;
}

void comm_reduce(newt_dtype dt, comm_op op, void *dst, const void *a, const void *b, size_t n,
                 int div) {
  if (n == 0) return;
  int form = op == COMM_MAX ? 2 : (div > 0 ? 1 : 0);
  kernels[dt][form][a == NULL](dst, a, b, n, div);
}

/* dst = src / div, one type. */
#define SCALE(NAME, T, ACC, LOAD, STORE)                                        \
  static void NAME(void *dv, const void *sv, size_t n, int div) {              \
    T *d = dv;                                                                  \
    const T *s = sv;                                                            \
    const ACC q = (ACC)div;                                                     \
    for (size_t i = 0; i < n; i++) d[i] = STORE((ACC)(LOAD(s[i]) / q));        \
  }

SCALE(f32_scale, float, float, ID, ID)
SCALE(bf16_scale, uint16_t, float, bf16_load, bf16_store)
SCALE(i32_scale, int32_t, int32_t, ID, ID)
SCALE(i64_scale, int64_t, int64_t, ID, ID)
SCALE(u8_scale, uint8_t, uint8_t, ID, ID)

static void (*const scales[NEWT_DTYPE__COUNT])(void *, const void *, size_t, int) = {
    [NEWT_F32] = f32_scale, [NEWT_BF16] = bf16_scale, [NEWT_I32] = i32_scale,
    [NEWT_I64] = i64_scale, [NEWT_U8] = u8_scale,
};

void comm_scale(newt_dtype dt, void *dst, const void *src, size_t n, int div) {
  if (n == 0) return;
  if (div == 1) {
    if (dst != src) memmove(dst, src, n * newt_dtype_size(dt));
    return;
  }
  scales[dt](dst, src, n, div);
}

void comm_copy_stream(void *dst, const void *src, size_t n) {
#if defined(__x86_64__)
  uint8_t *d = dst;
  const uint8_t *s = src;
  if (n >= 4096) {
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
      __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
      __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
      _mm_stream_si128((__m128i *)d, a);
      _mm_stream_si128((__m128i *)(d + 16), b);
      _mm_stream_si128((__m128i *)(d + 32), c);
      _mm_stream_si128((__m128i *)(d + 48), e);
    }
  }
  memcpy(d, s, n);
#else
  memcpy(dst, src, n);
#endif
}

void comm_stream_fence(void) {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}
