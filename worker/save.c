/* The worker's checkpoints: saved every spec.ckpt.every steps, every rank writing the parts
 * of the declared state it holds the primary copy of (worked out at the restore: each
 * element once across the layout), in the background; rank 0 commits once every rank's
 * shard is in, with the state document: {"step", "cursor", then the program's own fields
 * (newt_state_document)}. Any layout loads them back (worker_ckpt_load: each rank its own
 * parts, after the program's check of the document).
 *
 * The job is one writer of its checkpoint directory (ckpt_lock_take: writer "job <name>"):
 * every rank holds the directory's lock from its first saver until it ends, across
 * generations, so a rank of this job (a stopped rank 0 of an earlier generation, say) never
 * keeps a newer rank out, and another job or `newt train` in that directory is refused.
 *
 * A save due while the previous one is still being written is skipped (the saver's
 * skip_if_busy: a step never waits for the disk), and said: a WARN line naming both steps, and
 * rank 0 writes its count into the ckpt record again (job_ckpt.skipped), whence the summary's
 * checkpoints_skipped. NEWT_CKPT_HOLD (ckpt/saver.c) makes a save that slow, for tests.
 *
 * A save in flight belongs to one generation (its attempt is the generation): when the
 * next plan drops a failed rank it can never complete, so it is aborted and the previous
 * checkpoint stays the newest; after a switch at a step boundary (everyone alive) it is
 * allowed to finish first.
 *
 * Device memory is downloaded into the saver's staging: every part's copy is queued and one
 * sync waits for them all, so the step waits for one wait on the copies, not one per part.
 * Host memory is copied by the saver itself. Either way the staging is memory of the
 * worker's pool (pinned.c; pinned on a GPU, so the copies run at the copy engine's speed):
 * a new generation's saver takes the blocks the last one gave back, sized up front for this
 * layout's primary parts when the pool holds them. When it does not (a worker's first
 * generation, or a larger layout), a thread started after the generation's first step --
 * off the path of a recovery -- reserves that staging in the pool while training goes on,
 * in one block, and a save waits for it only if it is due first: pinning gigabytes takes
 * the better part of a second, which the step does not pay. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/log.h"
#include "common/strutil.h"
#include "worker/internal.h"

static int enabled(const worker *w) { return w->spec.ckpt_dir[0] && w->spec.ckpt_every > 0; }

/* How long a last save may take (worker_ckpt_final): the committer's wait for the other
 * ranks' shards (commit_timeout_ms below) and a margin. newt run waits as long
 * (launch/procs.c, STOP_SAVE_GRACE_MS). */
#define STOP_SAVE_MS 150000

/* The staging a save of this rank's primary parts takes: each part rounded up to the
 * saver's alignment. */
static size_t primary_bytes(const worker *w) {
  size_t total = 0, align = CKPT_STAGING_ALIGN;
  for (size_t i = 0; i < w->decl.n; i++)
    if (w->decl.parts[i].primary) total += (reshard_piece_bytes(&w->decl.parts[i].p) + align - 1) / align * align;
  return total;
}

/* The staging thread: reserves a layout's staging in the pool (worker_pinned_reserve). */
typedef struct stage_fill_job {
  worker_pinned *pool;
  size_t bytes;
  const char *id;
  atomic_int *done;
} stage_fill_job;

static void *fill_staging(void *arg) {
  stage_fill_job *j = arg;
  if (worker_pinned_reserve(j->pool, j->bytes) != NEWT_OK)
    NEWT_WARN(WORKER, "%s: taking the checkpoint staging ahead of the first save: %s (the save takes it then)", j->id,
              newt_errmsg());
  atomic_store(j->done, 1);
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
  *j = (stage_fill_job){w->pinned, primary_bytes(w), w->id, &w->stage_filled};
  atomic_store(&w->stage_filled, 0);
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

newt_result_t worker_ckpt_generation(worker *w) {
  if (!enabled(w)) return NEWT_OK;
  const newt_plan *p = &w->plan;
  end_saver(w, strcmp(p->switch_mode, "boundary") == 0); /* its staging goes back to the pool */
  char writer[128];
  snprintf(writer, sizeof writer, "job %s", w->o.job);
  if (!w->ckpt_lock) NEWT_CHECK(ckpt_lock_take(w->spec.ckpt_dir, writer, &w->ckpt_lock));
  ckpt_saver_opts so = {.dir = w->spec.ckpt_dir,
                        .rank = w->me->rank,
                        .nranks = p->nranks,
                        .threads = 2,
                        .level = w->spec.ckpt_level == 0 ? CKPT_LEVEL_RAW : (int)w->spec.ckpt_level,
                        .skip_if_busy = 1,
                        .commit = w->me->rank == 0,
                        .keep = (int)w->spec.ckpt_keep,
                        .commit_timeout_ms = 120000,
                        .attempt = p->generation,
                        .layout = {.has = CKPT_LAYOUT_ALL, .dp = p->dp, .tp = p->tp, .pp = p->pp, .zero = p->zero,
                                   .rank = w->me->rank, .generation = (int64_t)p->generation},
                        .writer = writer,
                        .key = &w->ckpt_key};
  /* staging from the pool: kept across generations, pinned on a GPU */
  worker_pinned *pool = NULL;
  NEWT_CHECK(worker_pinned_of(w, &pool));
  size_t need = primary_bytes(w);
  /* taken now when the pool holds it; else reserved in the background after the first step,
     not here: this is the path to the generation's first step (a recovery's time) */
  int has = worker_pinned_has(pool, need);
  so.staging_bytes = has ? need : 0;
  so.staging_hint = need; /* the first save's staging in one block */
  w->stage_fill_due = !has && need > 0;
  so.staging_alloc = worker_pinned_staging_alloc;
  so.staging_free = worker_pinned_staging_free;
  so.staging_ctx = pool;
  return ckpt_saver_init(&w->saver, &so);
}

/* The part's tensor as the checkpoint names it. */
static newt_tensor_desc part_desc(const reshard_piece *p) {
  newt_tensor_desc t = {.name = p->name, .dtype = p->dtype, .ndim = p->ndim};
  memcpy(t.shape, p->shape, sizeof t.shape);
  return t;
}

/* Adds this rank's primary parts to the save begun: host memory as it is (the saver copies
 * it at ckpt_save_end), device memory downloaded into the saver's staging, every copy queued
 * and one wait (also after a failure: no copy may still be landing). */
static newt_result_t add_parts(worker *w) {
  newt_result_t r = NEWT_OK;
  int queued = 0;
  for (size_t i = 0; r == NEWT_OK && i < w->decl.n; i++) {
    const worker_part *p = &w->decl.parts[i];
    if (!p->primary) continue;
    newt_tensor_desc t = part_desc(&p->p);
    if (!worker_part_on_device(w, p)) {
      r = ckpt_save_add(w->saver, &t, &p->p.slice, p->p.data);
      continue;
    }
    void *dst = NULL;
    r = ckpt_save_reserve(w->saver, &t, &p->p.slice, &dst);
    if (r == NEWT_OK) worker_mem_copy(&w->o.memory, dst, p->p.data, reshard_piece_bytes(&p->p), 1), queued = 1;
  }
  if (queued) {
    newt_result_t sr = worker_mem_sync(&w->o.memory);
    if (r == NEWT_OK) r = sr;
  }
  return r;
}

/* The state document of a save at `step`: the worker's fields, then the program's (text
 * from newt.h's newt_doc_write_fn, parsed here once). *out is the caller's. */
static newt_result_t state_document(worker *w, int64_t step, cJSON **out) {
  *out = NULL;
  cJSON *o = cJSON_CreateObject();
  NEWT_CHECK_ALLOC(o);
  newt_json_add_int(o, "step", step);
  newt_json_add_int(o, "cursor", (int64_t)worker_cursor(w));
  newt_result_t r = NEWT_OK;
  if (w->doc_write) {
    char *mine = w->doc_write(w->doc_arg, step);
    cJSON *prog = NULL;
    if (!mine) r = NEWT_ERR(NEWT_ERR_NOMEM, "the program's state document for step %lld is missing", (long long)step);
    else r = newt_json_parse(mine, strlen(mine), "the program's state document", &prog);
    if (r == NEWT_OK && !cJSON_IsObject(prog))
      r = NEWT_ERR(NEWT_ERR_INVALID, "the program's state document is not a JSON object");
    while (r == NEWT_OK && prog->child) {
      cJSON *it = cJSON_DetachItemViaPointer(prog, prog->child);
      if (strcmp(it->string, "step") == 0 || strcmp(it->string, "cursor") == 0) cJSON_Delete(it); /* the worker's */
      else cJSON_AddItemToObject(o, it->string, it);
    }
    cJSON_Delete(prog);
    free(mine);
  }
  if (r != NEWT_OK) {
    cJSON_Delete(o);
    return r;
  }
  *out = o;
  return NEWT_OK;
}

/* Begins and ends a save of live_step: this rank's primary parts and, on rank 0, the state
 * document. A save still being written skips it (said, and counted). */
static newt_result_t save_live_step(worker *w) {
  staging_filled(w); /* the save takes the block it reserved */
  int started = 0;
  NEWT_CHECK(ckpt_save_begin(w->saver, w->live_step, 1, &started));
  if (!started) { /* the last save is still being written: this one is skipped, and said */
    ckpt_save_status st;
    ckpt_saver_status(w->saver, &st);
    w->ckpt_skipped++;
    NEWT_WARN(WORKER, "%s: checkpoint of step %lld skipped: the save of step %lld is still being written (%lld "
              "skipped so far; a save slower than spec.ckpt.every steps)", w->id, (long long)w->live_step,
              (long long)st.step, (long long)w->ckpt_skipped);
    if (w->me->rank == 0) worker_publish_ckpt_skips(w);
    return NEWT_OK;
  }
  newt_result_t res = add_parts(w);
  cJSON *state = NULL;
  if (res == NEWT_OK && w->me->rank == 0) res = state_document(w, w->live_step, &state);
  /* staging half filled: the save ends as failed and writes nothing (its marker stops the
     committer waiting for this rank) */
  res = res == NEWT_OK ? ckpt_save_end(w->saver, state) : ckpt_save_fail(w->saver, res, newt_errmsg());
  cJSON_Delete(state);
  return res;
}

newt_result_t worker_ckpt_step(worker *w) {
  if (!w->saver) return NEWT_OK;
  if (w->stage_fill_due) start_staging(w); /* after the generation's first step: the staging, meanwhile */
  ckpt_save_status st;
  ckpt_saver_status(w->saver, &st);
  if (st.state == CKPT_SAVE_FAILED && st.step != w->ckpt_failed_step) {
    w->ckpt_failed_step = st.step;
    NEWT_WARN(WORKER, "%s: checkpoint of step %lld failed: %s (the previous one stays the newest)", w->id,
              (long long)st.step, st.message);
  }
  if (w->me->rank == 0 && st.state == CKPT_SAVE_DONE && st.last_ok_step > w->ckpt_published) {
    w->ckpt_published = st.last_ok_step;
    /* the bytes the committer wrote down: the directory is not listed again */
    worker_publish_ckpt(w, st.last_ok_step, (int64_t)st.step_bytes, (int64_t)st.write_ms, st.stall_ms);
  }
  if (w->live_step % w->spec.ckpt_every != 0) return NEWT_OK;
  return save_live_step(w);
}

newt_result_t worker_ckpt_final(worker *w, const char *why) {
  if (!w->saver) return NEWT_OK;
  newt_deadline_t d = newt_deadline_in_ms(STOP_SAVE_MS);
  ckpt_save_status st;
  ckpt_saver_status(w->saver, &st);
  newt_result_t r = NEWT_OK;
  if (st.step != w->live_step) { /* not saved at its step end (not due, or skipped) */
    NEWT_INFO(WORKER, "%s: %s after step %lld: saving it to %s", w->id, why, (long long)w->live_step,
              w->spec.ckpt_dir);
    ckpt_save_wait(w->saver, d); /* the save in flight first: this one is not skipped */
    r = save_live_step(w);
  }
  /* every rank's shard written, then rank 0 commits: a rank lost meanwhile fails the barrier
     at once (its sockets closed), and rank 0 stops waiting for its shard rather than for the
     commit's timeout */
  if (w->me->rank != 0 && r == NEWT_OK) r = ckpt_save_wait(w->saver, d);
  newt_result_t br = comm_barrier(comm_host_channel(w->train));
  if (br != NEWT_OK && w->me->rank == 0) ckpt_saver_abort(w->saver);
  if (w->me->rank == 0 && r == NEWT_OK) r = ckpt_save_wait(w->saver, d);
  if (r == NEWT_OK && br != NEWT_OK) r = br;
  ckpt_saver_status(w->saver, &st);
  if (r != NEWT_OK || st.last_ok_step != w->live_step)
    return NEWT_ERR(r != NEWT_OK ? r : NEWT_ERR_INTERNAL, "%s: the checkpoint of step %lld (%s) was not written: %s "
                    "(the newest one in %s stays the one to resume from)", w->id, (long long)w->live_step, why,
                    r != NEWT_OK ? newt_errmsg() : st.message, w->spec.ckpt_dir);
  NEWT_INFO(WORKER, "%s: saved step %lld (%s) to %s", w->id, (long long)w->live_step, why, w->spec.ckpt_dir);
  if (w->me->rank == 0 && st.last_ok_step > w->ckpt_published) {
    w->ckpt_published = st.last_ok_step;
    worker_publish_ckpt(w, st.last_ok_step, (int64_t)st.step_bytes, (int64_t)st.write_ms, st.stall_ms);
  }
  return NEWT_OK;
}

void worker_ckpt_free(worker *w) {
  staging_filled(w); /* before the pool goes */
  end_saver(w, 1);
  ckpt_lock_release(w->ckpt_lock);
  w->ckpt_lock = NULL;
}

/* --- loading ------------------------------------------------------------------------------------ */

/* ckpt_state_check_fn: a checkpoint's document must be of this run (the program says) and
 * of its own step. */
static newt_result_t check_doc(void *ctx, int64_t step, const cJSON *state) {
  worker *w = ctx;
  int64_t s = -1, cursor = -1;
  NEWT_CHECK(newt_json_get_int(state, "state", "step", 1, &s));
  NEWT_CHECK(newt_json_get_int(state, "state", "cursor", 1, &cursor));
  if (s != step || cursor < 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "state.step %lld (cursor %lld) in the checkpoint of step %lld", (long long)s,
                    (long long)cursor, (long long)step);
  if (!w->doc_check) return NEWT_OK;
  char *text = cJSON_PrintUnformatted(state);
  NEWT_CHECK_ALLOC(text);
  newt_result_t r = w->doc_check(w->doc_arg, text, step);
  free(text);
  return r == NEWT_OK ? NEWT_OK : NEWT_ERR(r, "%s", *newt_errmsg() ? newt_errmsg() : "the program refused the checkpoint");
}

/* Reads the optional parts (a rank's own bytes) from the checkpoint of `step`, each where it
 * is there: a missing one stays unfilled. */
static void load_optional(worker *w, int64_t step, char *stage, const size_t *offs) {
  ckpt_reader *rd = NULL;
  if (ckpt_open_keyed(&rd, w->spec.ckpt_dir, step, 2, &w->ckpt_key) != NEWT_OK) return;
  for (size_t i = 0; i < w->decl.n; i++) {
    worker_part *p = &w->decl.parts[i];
    if (!(p->p.flags & RESHARD_OPTIONAL)) continue;
    ckpt_request q = {.t = part_desc(&p->p), .slice = p->p.slice, .out = stage && offs[i] != SIZE_MAX ? stage + offs[i] : p->p.data};
    p->filled = ckpt_read_slices(rd, &q, 1) == NEWT_OK;
  }
  ckpt_close(rd);
  newt_err_clear();
}

newt_result_t worker_ckpt_load(worker *w, comm_t *c, int64_t *step) {
  *step = -1;
  size_t n = w->decl.n, total = 0, nreq = 0;
  size_t *offs = malloc((n ? n : 1) * sizeof *offs);
  ckpt_request *reqs = calloc(n ? n : 1, sizeof *reqs);
  newt_result_t r = offs && reqs ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory reading a checkpoint");
  for (size_t i = 0; i < n; i++) {
    offs[i] = SIZE_MAX;
    const worker_part *p = &w->decl.parts[i];
    if (worker_part_on_device(w, p)) offs[i] = total, total += reshard_piece_bytes(&p->p);
  }
  char *stage = NULL; /* host staging (pinned) of device memory: read there, then uploaded */
  if (r == NEWT_OK && total) r = worker_stage_get(w, total, (void **)&stage);
  for (size_t i = 0; r == NEWT_OK && i < n; i++) {
    const worker_part *p = &w->decl.parts[i];
    if (p->p.flags & RESHARD_OPTIONAL) continue;
    reqs[nreq++] = (ckpt_request){.t = part_desc(&p->p), .slice = p->p.slice,
                                  .out = offs[i] != SIZE_MAX ? stage + offs[i] : p->p.data};
  }
  ckpt_loaded ld = {0};
  if (r == NEWT_OK)
    r = w->spec.ckpt_dir[0]
            ? ckpt_load_keyed(w->spec.ckpt_dir, CKPT_LATEST, 2, reqs, nreq, check_doc, w, &w->ckpt_key, &ld)
            : NEWT_ERR(NEWT_ERR_NOTFOUND, "no checkpoint directory");
  /* committed checkpoints, none of them this job's to trust: said (state.c fails the job
     rather than start over and prune them) */
  w->ckpt_refused[0] = '\0';
  if (r == NEWT_ERR_NOTFOUND && ld.refused > 0)
    if (snprintf(w->ckpt_refused, sizeof w->ckpt_refused, "%s holds %d committed checkpoint%s, none proved by this "
                 "job's secret (the newest: %s)", w->spec.ckpt_dir, ld.committed, ld.committed == 1 ? "" : "s",
                 ld.refused_why) >= (int)sizeof w->ckpt_refused)
      snprintf(w->ckpt_refused + sizeof w->ckpt_refused - 5, 5, "...)");
  if (r == NEWT_OK) {
    for (size_t i = 0; i < n; i++) w->decl.parts[i].filled = !(w->decl.parts[i].p.flags & RESHARD_OPTIONAL);
    load_optional(w, ld.step, stage, offs);
    int queued = 0;
    for (size_t i = 0; i < n; i++) { /* queued, one wait */
      const worker_part *p = &w->decl.parts[i];
      if (offs[i] == SIZE_MAX || !p->filled) continue;
      worker_mem_copy(&w->o.memory, p->p.data, stage + offs[i], reshard_piece_bytes(&p->p), 2), queued = 1;
    }
    if (queued) r = worker_mem_sync(&w->o.memory);
  }
  cJSON_Delete(ld.state);
  worker_stage_release(w, stage);
  free(reqs);
  free(offs);
  if (r != NEWT_OK && r != NEWT_ERR_NOTFOUND) return newt_err_wrap(r, "loading %s: ", w->spec.ckpt_dir);
  /* every rank must have read the same step */
  int64_t got = r == NEWT_OK ? ld.step : -1, lo = got, hi = got;
  int size = comm_size(c);
  int64_t *steps = malloc((size_t)size * sizeof *steps);
  NEWT_CHECK_ALLOC(steps);
  newt_result_t g = comm_allgather(comm_host_channel(c), &got, steps, 1, NEWT_I64); /* host memory */
  for (int i = 0; g == NEWT_OK && i < size; i++) {
    if (steps[i] < lo) lo = steps[i];
    if (steps[i] > hi) hi = steps[i];
  }
  free(steps);
  NEWT_CHECK(g);
  if (lo != hi)
    return NEWT_ERR(NEWT_ERR_CORRUPT, "ranks read different checkpoints (steps %lld to %lld) from %s", (long long)lo,
                    (long long)hi, w->spec.ckpt_dir);
  if (r != NEWT_OK) return r;
  *step = ld.step;
  return NEWT_OK;
}
