/* Checkpoints of the worker: loading the newest valid one when no rank holds a state. */
#include "worker/internal.h"

newt_result_t worker_ckpt_load(worker *w, int64_t *step) {
  (void)step;
  if (!w->spec.ckpt_dir[0]) return NEWT_ERR(NEWT_ERR_NOTFOUND, "no checkpoint directory");
  return NEWT_ERR(NEWT_ERR_UNSUPPORTED, "checkpoints: not wired in yet");
}
