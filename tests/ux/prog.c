/* A program of one's own on libnewt (newt.h only), for test_words.c: what its user sees when
 * it goes wrong.
 *
 *   ux-prog join   joins (everything from the environment) and ends: newt_join's own error
 *                  when it fails (no job, etcd away), else newt_finish's status
 *   ux-prog gap    declares tensor "W" (768 floats) with a part that leaves one element to no
 *                  rank, prints the restore's error as a program would, begins a step anyway
 *                  and ends with newt_finish of that step's error */
#include <stdio.h>
#include <string.h>

#include "newt.h"

#define N 768

static float w[N];

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "join";
  newt_ctx *c = NULL;
  newt_result_t r = newt_join(NULL, &c);
  if (r != NEWT_OK) return 1; /* newt_join said why, and wrote the termination message */
  if (strcmp(mode, "gap") != 0) return newt_finish(c, NEWT_OK);
  newt_batch b = {.size = sizeof b};
  newt_next next;
  r = newt_step_begin(c, &b, &next); /* NEXT_GENERATION */
  if (r == NEWT_OK) {
    int64_t shape[1] = {N}, off[1] = {0}, ext[1] = {N - 1};
    newt_tensor t;
    newt_tensor_init(&t);
    t.name = "W";
    t.dtype = NEWT_F32;
    t.ndim = 1;
    t.shape = shape;
    t.offset = off;
    t.extent = ext;
    t.data = w;
    t.bytes = sizeof(float) * (N - 1);
    r = newt_state_tensor(c, &t);
    if (r == NEWT_OK && newt_state_restore(c, NULL) != NEWT_OK)
      fprintf(stderr, "ux-prog: restore: %s\n", newt_errmsg()); /* to the program's stderr, as users do */
    r = newt_step_begin(c, &b, &next);
  }
  return newt_finish(c, r);
}
