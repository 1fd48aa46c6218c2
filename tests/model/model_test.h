/* Shared by the model tests: the whole CPU model on one micro-batch (parameters,
 * activations of every layer and the head, scratch), set up and torn down in one call. */
#ifndef NEWT_TESTS_MODEL_TEST_H
#define NEWT_TESTS_MODEL_TEST_H

#include "model/gpt.h"
#include "test.h"

static void whole_init(model_gpt *g, model_acts *a, model_scratch *s, const model_config *c, int B, int T) {
  T_OK(model_gpt_init(g, c));
  T_OK(model_acts_init(a, c, B, T, 0, (int)c->layers, 1));
  T_OK(model_scratch_init(s, c, B, T));
}

static void whole_free(model_gpt *g, model_acts *a, model_scratch *s) {
  model_scratch_free(s);
  model_acts_free(a);
  model_gpt_free(g);
}

#endif
