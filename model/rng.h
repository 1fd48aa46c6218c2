/* Counter-based random numbers: every value is a pure function of (seed, stream, index),
 * so a tensor's initial weights, or the sample a global index maps to, come out the same
 * whichever process, thread or shard computes them and in whatever order.
 *
 *   model_rng_u64(seed, stream, i)     64 random bits (splitmix64 finaliser over a mix)
 *   model_rng_normal(seed, stream, i)  N(0,1) by Box-Muller (cosine branch), in double
 *   model_rng_perm(seed, stream, n, j) a bijection of [0, n): a 4-round Feistel network
 *                                      over the next even power of two, cycle-walking
 *                                      back into range (expected < 4 rounds of walking) */
#ifndef NEWT_MODEL_RNG_H
#define NEWT_MODEL_RNG_H

#include <stdint.h>

static inline uint64_t model_rng_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline uint64_t model_rng_u64(uint64_t seed, uint64_t stream, uint64_t i) {
  return model_rng_mix(model_rng_mix(seed + 0x9e3779b97f4a7c15ull) ^
                       model_rng_mix(stream * 0xd1b54a32d192ed03ull + i));
}

/* FNV-1a of a string: a stable stream id for a tensor name. */
static inline uint64_t model_rng_hash(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

double model_rng_normal(uint64_t seed, uint64_t stream, uint64_t i);

/* The image of j in a seeded permutation of [0, n); n >= 1, j < n. */
uint64_t model_rng_perm(uint64_t seed, uint64_t stream, uint64_t n, uint64_t j);

#endif
