/* Knobs read once from the environment, in the manner of NCCL_PARAM:
 *
 *   NEWT_PARAM(KeepaliveMs, "NEWT_KEEPALIVE_MS", 1000)
 *
 * defines `int64_t newt_param_KeepaliveMs(void)`, which reads NEWT_KEEPALIVE_MS on first
 * call (decimal, with an optional k/M/G suffix) and falls back to the default when the
 * variable is unset or malformed (the latter logged as a warning). */
#ifndef NEWT_COMMON_PARAM_H
#define NEWT_COMMON_PARAM_H

#include <stdatomic.h>
#include <stdint.h>

int64_t newt_param_read(const char *env, int64_t deflt);

#define NEWT_PARAM_UNSET INT64_MIN

#define NEWT_PARAM(name, env, deflt)                           \
  static inline int64_t newt_param_##name(void) {              \
    static _Atomic int64_t cache_ = NEWT_PARAM_UNSET;          \
    int64_t v_ = atomic_load_explicit(&cache_, memory_order_relaxed); \
    if (v_ == NEWT_PARAM_UNSET) {                              \
      v_ = newt_param_read((env), (deflt));                    \
      atomic_store_explicit(&cache_, v_, memory_order_relaxed); \
    }                                                          \
    return v_;                                                 \
  }

#endif
