/* A linear model learned by data-parallel SGD under newt: docs/api.md's example. */
#include <math.h>
#include "newt.h"

#define N 16
static float x_of(int64_t i, int k) { return sinf((float)(i * N + k)); } /* sample i, feature k */
static float y_of(int64_t i) { return x_of(i, 0) - 2 * x_of(i, 1) + 0.5f * x_of(i, N - 1); }

int main(void) {
  newt_ctx *c;
  if (newt_join(NULL, &c) != NEWT_OK) return 1; /* etcd, job, id: from newt run's environment */
  float w[N] = {0}, g[N];
  int64_t shape = N;
  newt_layout l = {.size = sizeof l};
  newt_batch b = {.size = sizeof b};
  newt_next next;
  newt_result_t r;
  while ((r = newt_step_begin(c, &b, &next)) == NEWT_OK && next < NEWT_NEXT_DONE) {
    if (next == NEWT_NEXT_GENERATION) { /* the first plan, or the job resized */
      newt_tensor t = NEWT_TENSOR_INIT;
      t.name = "w", t.ndim = 1, t.shape = &shape, t.data = w, t.bytes = sizeof w;
      newt_restore_info ri = {.size = sizeof ri};
      if (newt_layout_get(c, &l) == NEWT_OK && newt_state_tensor(c, &t) == NEWT_OK) newt_state_restore(c, &ri);
      continue; /* a failed restore: newt_step_begin recovers */
    }
    double loss = 0, mean;
    for (int k = 0; k < N; k++) g[k] = 0;
    for (int64_t i = b.first; i < b.first + b.count; i++) { /* this rank's samples */
      float e = -y_of(i);
      for (int k = 0; k < N; k++) e += w[k] * x_of(i, k);
      loss += 0.5 * e * e / b.global_batch;
      for (int k = 0; k < N; k++) g[k] += e * x_of(i, k) / b.global_batch;
    }
    if (l.dp_comm && newt_allreduce(l.dp_comm, g, g, N, NEWT_F32, NEWT_SUM) != NEWT_OK) continue;
    if (newt_step_commit(c, &loss, &mean, 1) != NEWT_OK) continue; /* a peer lost: recover */
    for (int k = 0; k < N; k++) w[k] -= 0.05f * g[k];
    newt_step_result res = {.size = sizeof res, .loss = mean};
    newt_step_end(c, &res);
  }
  return newt_finish(c, r);
}
