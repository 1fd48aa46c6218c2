/* The sticky error of a device (dev_internal.h's model_dev_fail), apart from dev.c so that
 * the implementations dev.c dispatches to (dev_cuda.c) can record it without calling back
 * into dev.c (tests/arch/check_layers.sh: no loop between object files). */
#include <stdio.h>

#include "model/dev_internal.h"

newt_result_t model_dev_fail(model_dev *d, newt_result_t r) {
  if (r == NEWT_OK) return d->err;
  if (d->err == NEWT_OK) {
    d->err = r;
    snprintf(d->errmsg, sizeof d->errmsg, "%s", newt_errmsg());
  }
  return d->err;
}
