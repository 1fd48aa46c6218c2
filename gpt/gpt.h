/* The built-in GPT as a program on libnewt (include/newt.h): `newt worker` runs it. It
 * builds its trainer (model/parallel.h) from the job's spec, declares the trainer's pieces as
 * the state, and steps through newt's calls like any other program (docs/api.md), so there is
 * one orchestration for the GPT and for a program of one's own. gpt/ckpt.h is the GPT's side
 * of checkpoints for `newt train` (one process, no job), which writes the same state document. */
#ifndef NEWT_GPT_GPT_H
#define NEWT_GPT_GPT_H

#include "job/spec.h"
#include "model/dev.h"
#include "model/tokens.h"
#include "model/train.h"
#include "newt.h"

/* The trainer configuration a job spec asks for (model, optimizer, batch, data seeds): the
 * same one `newt train` builds from its flags, so the two follow one trajectory. */
newt_result_t gpt_train_config(const newt_spec *s, int threads, model_train_config *out);

/* The token stream a spec names: its token file, or the generated corpus. */
newt_result_t gpt_open_data(const newt_spec *s, model_tokens *tok);

/* What is checked of a job before anything of it starts (gpt/check.c), so that a bad value is
 * refused at once, naming the field and the value, and not found by every worker after etcd,
 * the coordinators and the workers started. `what` is a set of:
 *   GPT_CHECK_SPEC     the spec's rules (spec_validate) and its JSON read back as itself
 *                      (spec_check_json): for anything that publishes a spec;
 *   GPT_CHECK_TRAINER  the built-in trainer's: the preset, the overrides, seq_len within the
 *                      model's ctx, tp dividing its heads and vocab, pp at most its layers, the
 *                      trainer's configuration; not for a program of one's own (newt run --
 *                      COMMAND, workers.command), which has its own model and data;
 *   GPT_CHECK_FILES    what the spec names on this host: the token file (with
 *                      GPT_CHECK_TRAINER: it opens as a token file and holds a sample of the
 *                      model's vocab), the checkpoint directory (made, writable, no other
 *                      writer's lock: ckpt_lock_take as the job's ranks take it); not for
 *                      newt coordinator, whose host need not see the workers' files.
 * Every refusal is NEWT_ERR_INVALID (a usage error: exit 2) but out of memory. */
enum { GPT_CHECK_SPEC = 1, GPT_CHECK_TRAINER = 2, GPT_CHECK_FILES = 4 };
newt_result_t gpt_start_check(const newt_spec *s, unsigned what);

/* newt's copies of a device's memory (newt_memory) through the model's device: its
 * allocations, pinned host memory and copies queued on its stream. */
void gpt_dev_memory(model_dev *dev, newt_memory *out);

/* Trains the job's GPT as one worker until the job is done, this worker left (a signal),
 * the job failed, or an error; returns the exit status (newt_finish's: 0 done, 3 left, 4
 * failed, 1 an error, 2 a bad flag or spec). */
int gpt_worker_run(const newt_join_opts *o, int threads);

#endif
