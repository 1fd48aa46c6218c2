/* A complete little program on libnewt, written against newt.h alone (tests/api/install.sh
 * builds it from a clean directory against the installed library and runs it as the workers
 * of `newt run -- ./client`). It joins the job its environment names (newt run and newt
 * worker -- COMMAND set NEWT_ETCD, NEWT_JOB, NEWT_WORKER_ID, ...), keeps one replicated
 * tensor "x" of N floats, and trains it: each rank sums g(k, i) = (7k + 3i) mod 11 over its
 * samples k of the step, the sums are added over the data-parallel group, and
 * x[i] = fmod(3 x[i] + G[i] + 1, 65521) -- whole numbers, exact in float, so every world size
 * gives the same bits. At the end it prints "client: final step S x ...". Any error of a
 * generation or a step sends it back to newt_step_begin, which recovers (a peer lost) or
 * says why it cannot. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "newt.h"

#define N 8
static float x[N];
static int64_t done; /* the steps the state has done */

/* A new layout: "x" declared, then restored (or, for a new job, initialised). */
static newt_result_t generation(newt_ctx *c, newt_layout *l) {
  static const int64_t shape[1] = {N};
  l->size = sizeof *l;
  newt_result_t r = newt_layout_get(c, l);
  if (r != NEWT_OK) return r;
  newt_tensor t;
  newt_tensor_init(&t);
  t.name = "x";
  t.dtype = NEWT_F32;
  t.ndim = 1;
  t.shape = shape;
  t.data = x;
  t.bytes = sizeof x;
  if ((r = newt_state_tensor(c, &t)) != NEWT_OK) return r;
  newt_restore_info ri = {.size = sizeof ri};
  if ((r = newt_state_restore(c, &ri)) != NEWT_OK) return r;
  if (ri.source == NEWT_FROM_NOTHING)
    for (int i = 0; i < N; i++) x[i] = (float)(i + 1);
  done = ri.step;
  return NEWT_OK;
}

static newt_result_t step(newt_ctx *c, const newt_layout *l, const newt_batch *b) {
  float g[N] = {0}, sum[N];
  for (int64_t k = b->first; k < b->first + b->count; k++)
    for (int i = 0; i < N; i++) g[i] += (float)((7 * k + 3 * i) % 11);
  newt_result_t r;
  if (l->dp_comm) { /* NULL when this rank is the whole data-parallel group */
    if ((r = newt_allreduce(l->dp_comm, g, sum, N, NEWT_F32, NEWT_SUM)) != NEWT_OK) return r;
    memcpy(g, sum, sizeof g);
  }
  if ((r = newt_step_commit(c, NULL, NULL, 0)) != NEWT_OK) return r; /* every rank agrees: update */
  for (int i = 0; i < N; i++) x[i] = fmodf(3 * x[i] + g[i] + 1, 65521);
  newt_step_result res;
  newt_step_result_init(&res);
  res.loss = x[0];
  if ((r = newt_step_end(c, &res)) != NEWT_OK) return r;
  done = b->step;
  return NEWT_OK;
}

int main(void) {
  newt_ctx *c = NULL;
  newt_result_t r = newt_join(NULL, &c);
  if (r != NEWT_OK) {
    fprintf(stderr, "client: %s\n", newt_errmsg());
    return 2;
  }
  newt_layout l = {.size = sizeof l};
  newt_next next = NEWT_NEXT_FAILED;
  for (;;) {
    newt_batch b = {.size = sizeof b};
    if ((r = newt_step_begin(c, &b, &next)) != NEWT_OK) break;
    if (next == NEWT_NEXT_GENERATION) (void)generation(c, &l);
    else if (next == NEWT_NEXT_STEP) (void)step(c, &l, &b);
    else break; /* done, left or failed: newt_finish says which */
  }
  if (r == NEWT_OK && next == NEWT_NEXT_DONE) {
    printf("client: final step %lld x", (long long)done);
    for (int i = 0; i < N; i++) printf(" %.0f", x[i]);
    printf("\n");
    fflush(stdout);
  } else if (r != NEWT_OK) {
    fprintf(stderr, "client: %s\n", newt_errmsg());
  }
  return newt_finish(c, r);
}
