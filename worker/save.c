/* The worker's checkpoints: saved every spec.ckpt.every steps, every rank writing the
 * pieces of the weights and moments it holds the primary copy of (model_par_pieces: each
 * element once across the layout), in the background; rank 0 commits once every rank's
 * shard is in. Any layout loads them back (state.c reads each rank's own pieces).
 *
 * A save in flight belongs to one generation (its attempt is the generation): when the
 * next plan drops a failed rank it can never complete, so it is aborted and the previous
 * checkpoint stays the newest; after a switch at a step boundary (everyone alive) it is
 * allowed to finish first.
 *
 * On a device the host cannot touch (a GPU) the pieces are downloaded into the saver's
 * staging: every piece's copy is queued (model_dev_download_async) and one model_dev_sync
 * waits for them all, so the step loop stalls for one wait on the copies, not one per
 * piece. On the CPU device the saver's own snapshot copies the pieces. Either way the
 * staging is memory of the worker's pool (pinned.c; pinned on a GPU, so the copies run at
 * the copy engine's speed): a new generation's saver takes the blocks the last one gave
 * back, sized up front for this layout's primary pieces when the pool holds them. When it
 * does not (a worker's first generation, or a larger layout), a thread started after the
 * generation's first step -- off the path of a recovery -- reserves that staging in the pool
 * while training goes on, in one block, and a save waits for it only if it is due first:
 * pinning gigabytes takes the better part of a second, which the step loop does not pay. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/strutil.h"
#include "model/checkpoint.h"
#include "worker/internal.h"

static int enabled(const worker *w) { return w->spec.ckpt_dir[0] && w->spec.ckpt_every > 0; }

/* The staging thread: reserves a layout's staging in the pool (worker_pinned_reserve). */
typedef struct stage_fill_job {
  worker_pinned *pool;
  size_t bytes;
  const char *id;
} stage_fill_job;

static void *fill_staging(void *arg) {
  stage_fill_job *j = arg;
  if (worker_pinned_reserve(j->pool, j->bytes) != NEWT_OK)
    NEWT_WARN(WORKER, "%s: taking the checkpoint staging ahead of the first save: %s (the save takes it then)", j->id,
              newt_errmsg());
  free(j);
  return NULL;
}

/* Waits for the staging thread, if one runs. */
static void staging_filled(worker *w) {
  if (!w->stage_filling) return;
  pthread_join(w->stage_fill, NULL);
  w->stage_filling = 0;
}

/* Starts the staging thread for this generation's layout (after its first step). A thread
 * of an earlier generation is waited for first: it has long finished, or the pool would
 * be asked twice for one size. */
static void start_staging(worker *w) {
  w->stage_fill_due = 0;
  staging_filled(w);
  stage_fill_job *j = malloc(sizeof *j);
  if (!j) return; /* the save takes it */
  *j = (stage_fill_job){w->pinned, model_ckpt_par_staging_bytes(&w->par), w->id};
  w->stage_filling = pthread_create(&w->stage_fill, NULL, fill_staging, j) == 0;
  if (!w->stage_filling) free(j);
}

/* Ends the saver of the last generation: lets it finish when everyone of that generation
 * is still there, aborts it otherwise. */
static void end_saver(worker *w, int keep_going) {
  w->stage_fill_due = 0; /* a staging thread still running goes on: not waited for here, on
                            the way to the next generation's first step */
  if (!w->saver) return;
  if (keep_going) ckpt_save_wait(w->saver, newt_deadline_in_ms(60000));
  else ckpt_saver_abort(w->saver);
  ckpt_saver_free(w->saver);
  w->saver = NULL;
}

newt_result_t worker_ckpt_generation(worker *w, const newt_plan *p, const plan_rank *me) {
  if (!enabled(w)) return NEWT_OK;
  end_saver(w, strcmp(p->switch_mode, "boundary") == 0); /* its staging goes back to the pool */
  char layout[160];
  snprintf(layout, sizeof layout, "{\"dp\":%d,\"tp\":%d,\"pp\":%d,\"zero\":%d,\"rank\":%d,\"generation\":%llu}", p->dp,
           p->tp, p->pp, p->zero, me->rank, (unsigned long long)p->generation);
  ckpt_saver_opts so = {.dir = w->spec.ckpt_dir,
                        .rank = me->rank,
                        .nranks = p->nranks,
                        .threads = 2,
                        .level = w->spec.ckpt_level == 0 ? CKPT_LEVEL_RAW : (int)w->spec.ckpt_level,
                        .skip_if_busy = 1,
                        .commit = me->rank == 0,
                        .keep = (int)w->spec.ckpt_keep,
                        .commit_timeout_ms = 120000,
                        .attempt = p->generation,
                        .layout_json = layout};
  if (w->have_par) { /* staging from the pool: kept across generations, pinned on a GPU */
    worker_pinned *pool = NULL;
    NEWT_CHECK(worker_pinned_of(w, w->par.dev, &pool));
    size_t need = model_ckpt_par_staging_bytes(&w->par);
    /* taken now when the pool holds it; else reserved in the background after the first
       step, not here: this is the path to the generation's first step (a recovery's time) */
    int has = worker_pinned_has(pool, need);
    so.staging_bytes = has ? need : 0;
    so.staging_hint = need; /* the first save's staging in one block */
    w->stage_fill_due = !has && need > 0;
    so.staging_alloc = worker_pinned_staging_alloc;
    so.staging_free = worker_pinned_staging_free;
    so.staging_ctx = pool;
  }
  return ckpt_saver_init(&w->saver, &so);
}

/* The bytes on disk of committed step `step`, every rank's files (0: not found). */
static int64_t ckpt_bytes(worker *w, int64_t step) {
  ckpt_step_info *info = NULL;
  size_t n = 0;
  int64_t bytes = 0;
  if (ckpt_list(w->spec.ckpt_dir, &info, &n) != NEWT_OK) return 0;
  for (size_t i = 0; i < n; i++)
    if (info[i].step == step && info[i].committed) bytes = (int64_t)info[i].disk_bytes;
  free(info);
  return bytes;
}

newt_result_t worker_ckpt_step(worker *w, const newt_plan *p, const plan_rank *me) {
  if (!w->saver) return NEWT_OK;
  if (w->stage_fill_due) start_staging(w); /* after the generation's first step: the staging, meanwhile */
  ckpt_save_status st;
  ckpt_saver_status(w->saver, &st);
  if (st.state == CKPT_SAVE_FAILED && st.step != w->ckpt_failed_step) {
    w->ckpt_failed_step = st.step;
    NEWT_WARN(WORKER, "%s: checkpoint of step %lld failed: %s (the previous one stays the newest)", w->id,
              (long long)st.step, st.message);
  }
  if (me->rank == 0 && st.state == CKPT_SAVE_DONE && st.last_ok_step > w->ckpt_published) {
    w->ckpt_published = st.last_ok_step;
    worker_publish_ckpt(w, st.last_ok_step, ckpt_bytes(w, st.last_ok_step), (int64_t)st.write_ms, st.stall_ms);
  }
  const model_par *par = &w->par;
  if (par->step % w->spec.ckpt_every != 0) return NEWT_OK;
  staging_filled(w); /* the save takes the block it reserved */
  int started = 0;
  NEWT_CHECK(ckpt_save_begin(w->saver, par->step, 1, &started));
  if (!started) return NEWT_OK; /* the last save is still being written: skip this one */
  newt_result_t res = model_ckpt_par_add(w->saver, par);
  char *state = NULL, desc[SPEC_PATH_MAX + 32];
  spec_data_desc(&w->spec, desc, sizeof desc);
  if (res == NEWT_OK && me->rank == 0)
    res = model_ckpt_train_state(&w->tcfg, par->step, worker_cursor(w), par->opt.t, desc, &state);
  /* staging half filled: the save ends as failed and writes nothing (its marker stops the
     committer waiting for this rank) */
  res = res == NEWT_OK ? ckpt_save_end(w->saver, state) : ckpt_save_fail(w->saver, res, newt_errmsg());
  free(state);
  return res;
}

void worker_ckpt_free(worker *w) {
  staging_filled(w); /* before the pool goes */
  end_saver(w, 1);
}
