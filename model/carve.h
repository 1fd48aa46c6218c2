/* Carving one allocation into aligned pieces: run the same carve sequence twice, first
 * with base NULL to count the bytes, then over the allocation to hand out the pointers, so
 * the size and the layout cannot disagree. Used by the activations and scratch of the CPU
 * model and by the CUDA model's single device allocation. */
#ifndef NEWT_MODEL_CARVE_H
#define NEWT_MODEL_CARVE_H

#include <stddef.h>

typedef struct model_carver {
  char *base;   /* NULL: only count */
  size_t off;   /* bytes handed out so far */
  size_t align; /* of every piece */
} model_carver;

static inline void *model_carve(model_carver *c, size_t bytes) {
  void *p = c->base ? c->base + c->off : NULL;
  c->off += (bytes + c->align - 1) / c->align * c->align;
  return p;
}

#endif
