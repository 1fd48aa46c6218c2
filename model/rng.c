/* Counter-based normals and permutations (see rng.h). */
#include "model/rng.h"

#include <math.h>

double model_rng_normal(uint64_t seed, uint64_t stream, uint64_t i) {
  uint64_t r = model_rng_u64(seed, stream, i);
  /* two 26-bit uniforms in (0, 1] and [0, 1) */
  double u1 = ((double)(r >> 38) + 1.0) / 67108864.0;
  double u2 = (double)((r >> 12) & 0x3ffffff) / 67108864.0;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t model_rng_perm(uint64_t seed, uint64_t stream, uint64_t n, uint64_t j) {
  if (n <= 1) return 0;
  int bits = 2;
  while (bits < 64 && (1ull << bits) < n) bits += 2;
  int half = bits / 2;
  uint64_t mask = (1ull << half) - 1;
  uint64_t x = j;
  do {
    uint64_t l = x >> half, r = x & mask;
    for (uint64_t round = 0; round < 4; round++) {
      uint64_t f = model_rng_u64(seed, stream * 4 + round, r) & mask;
      uint64_t nl = r, nr = l ^ f;
      l = nl;
      r = nr;
    }
    x = (l << half) | r;
  } while (x >= n); /* cycle-walk: x is a permutation of [0, 2^bits), so this ends */
  return x;
}
