/* The elastic-safe loader (see loader.h). */
#include "model/loader.h"

#include "model/rng.h"

newt_result_t model_loader_init(model_loader *ld, const model_tokens *tok, int T, uint64_t seed,
                                int64_t vocab) {
  if (T < 1) return NEWT_ERR(NEWT_ERR_INVALID, "loader: sequence length %d must be >= 1", T);
  if (tok->count < (uint64_t)T + 1)
    return NEWT_ERR(NEWT_ERR_INVALID, "loader: %llu tokens, fewer than one sample of T + 1 = %d",
                    (unsigned long long)tok->count, T + 1);
  if ((int64_t)tok->vocab > vocab)
    return NEWT_ERR(NEWT_ERR_INVALID, "loader: the token file's vocab %u exceeds the model's vocab %lld",
                    tok->vocab, (long long)vocab);
  *ld = (model_loader){.tok = tok, .T = T, .seed = seed, .windows = (tok->count - 1) / (uint64_t)T};
  return NEWT_OK;
}

uint64_t model_loader_window(const model_loader *ld, uint64_t g) {
  uint64_t epoch = g / ld->windows, j = g % ld->windows;
  return model_rng_perm(ld->seed, epoch, ld->windows, j);
}

newt_result_t model_loader_fetch(const model_loader *ld, uint64_t g0, int64_t n, int32_t *inputs,
                                 int32_t *targets) {
  int T = ld->T;
  for (int64_t s = 0; s < n; s++) {
    uint64_t base = model_loader_window(ld, g0 + (uint64_t)s) * (uint64_t)T;
    for (int t = 0; t <= T; t++) {
      uint32_t tok = model_tokens_at(ld->tok, base + (uint64_t)t);
      if (tok >= ld->tok->vocab)
        return NEWT_ERR(NEWT_ERR_CORRUPT, "loader: token %llu is %u, not below vocab %u",
                        (unsigned long long)(base + t), tok, ld->tok->vocab);
      if (t < T) inputs[s * T + t] = (int32_t)tok;
      if (t > 0) targets[s * T + t - 1] = (int32_t)tok;
    }
  }
  return NEWT_OK;
}

void model_batch_slice(int64_t gb, int rank, int dp, int64_t *first, int64_t *count) {
  int64_t q = gb / dp, r = gb % dp;
  *first = rank * q + (rank < r ? rank : r);
  *count = q + (rank < r ? 1 : 0);
}
