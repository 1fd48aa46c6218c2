/* The data loader: deterministic and elastic-safe.
 *
 * A token stream of N tokens is cut into W = (N - 1) / T windows of T + 1 tokens at
 * stride T (window w covers tokens [w T, w T + T]; inputs are its first T, targets its
 * last T). A global sample index g means window perm_e(g mod W) of epoch e = g / W, where
 * perm_e is a seeded permutation of [0, W) computed on demand (model_rng_perm), so which
 * sample g is depends only on (seed, g): never on the data-parallel size, the rank, or
 * what was fetched before. The loader's whole state is one cursor: the number of samples
 * consumed, i.e. the global index of the next one. Step k of a run with global batch GB
 * takes samples [k GB, (k+1) GB); data-parallel rank r of d takes its contiguous slice of
 * them (model_batch_slice), so resuming at any cursor under any d consumes exactly the
 * samples, in the same order per step, that an uninterrupted run would. */
#ifndef NEWT_MODEL_LOADER_H
#define NEWT_MODEL_LOADER_H

#include <stdint.h>

#include "common/err.h"
#include "model/tokens.h"

typedef struct model_loader {
  const model_tokens *tok; /* not owned */
  int T;
  uint64_t seed;
  uint64_t windows; /* W */
} model_loader;

/* Fails when the stream has fewer than T + 1 tokens or its vocab exceeds `vocab`. */
newt_result_t model_loader_init(model_loader *ld, const model_tokens *tok, int T, uint64_t seed,
                                int64_t vocab);

/* The window global sample g maps to. */
uint64_t model_loader_window(const model_loader *ld, uint64_t g);

/* Samples [g0, g0 + n): inputs and targets (n,T) each. Tokens are checked against the vocab. */
newt_result_t model_loader_fetch(const model_loader *ld, uint64_t g0, int64_t n, int32_t *inputs,
                                 int32_t *targets);

/* Rank r of d's share of a global batch of gb samples: [*first, *first + *count) relative
 * to the step's first sample. The first gb % d ranks take one sample more. */
void model_batch_slice(int64_t gb, int rank, int dp, int64_t *first, int64_t *count);

#endif
