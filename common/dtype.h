/* Element types shared by the collectives, the model and the checkpoints, and the
 * bf16 <-> f32 conversions (round to nearest even, NaN kept quiet). */
#ifndef NEWT_COMMON_DTYPE_H
#define NEWT_COMMON_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The types are libnewt's public ones (include/newt.h). */
#include "newt.h"
#define NEWT_DTYPE__COUNT (NEWT_U8 + 1)

static inline size_t newt_dtype_size(newt_dtype t) {
  static const size_t sizes[NEWT_DTYPE__COUNT] = {4, 2, 2, 4, 8, 1};
  return (unsigned)t < NEWT_DTYPE__COUNT ? sizes[t] : 0;
}

static inline const char *newt_dtype_name(newt_dtype t) {
  static const char *const names[NEWT_DTYPE__COUNT] = {"f32", "bf16", "f16", "i32", "i64", "u8"};
  return (unsigned)t < NEWT_DTYPE__COUNT ? names[t] : "?";
}

/* -1 when the name is unknown. */
static inline int newt_dtype_from_name(const char *s) {
  for (int t = 0; t < NEWT_DTYPE__COUNT; t++)
    if (strcmp(s, newt_dtype_name((newt_dtype)t)) == 0) return t;
  return -1;
}

static inline float newt_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t newt_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

#endif
