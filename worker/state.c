/* The worker's training state across generations (docs/elastic.md, "Restore").
 *
 * A rank's state is a parallel trainer (model/parallel.h) for the layout of its plan: the
 * pieces of the global tensors (weights, AdamW moments) that its tensor, pipeline and
 * data-parallel coordinates and its ZeRO stage give it. On each new plan:
 *
 *   - the ranks of the new communicator reshard in memory (worker/reshard.c): each says
 *     which pieces it holds and of which step (its state, its pre-step snapshot, its
 *     neighbour's replica), the newest step whose pieces cover every rank's new needs
 *     wins, and the pieces move between ranks; a replacement or a joiner is filled from
 *     its peers, a different data-parallel size re-cuts the ZeRO shards in memory;
 *   - only when no step is covered do the ranks read the newest valid checkpoint (each
 *     reading just its own pieces, under any layout), and on a new job the weights come
 *     from the seed, identically everywhere.
 *
 * A rank whose last step failed holds step s, one whose step completed holds s + 1: both
 * are whole states, the newer wins when it is covered, nothing is mixed. Where a layout
 * holds pieces that no other rank has (ZeRO shards; tensor and pipeline slices without a
 * data-parallel replica), two copies keep a lost rank from forcing a trip to disk: every
 * rank snapshots its state before each step (so a step that some ranks applied and others
 * not can be rolled back everywhere), and with ZeRO each data-parallel rank keeps a copy
 * of its neighbour's shard, refreshed every spec.fault.replica_every steps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "model/checkpoint.h"
#include "worker/internal.h"
#include "worker/reshard.h"

/* The trainer's pieces as reshard pieces of one step. *out is malloc'd. */
static newt_result_t par_pieces(const model_par *p, int64_t step, reshard_piece **out, size_t *n) {
  model_par_piece *pp = NULL;
  size_t np = 0;
  NEWT_CHECK(model_par_pieces(p, &pp, &np));
  reshard_piece *r = calloc(np ? np : 1, sizeof *r);
  if (!r) {
    free(pp);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory listing %zu pieces", np);
  }
  for (size_t i = 0; i < np; i++) {
    snprintf(r[i].name, sizeof r[i].name, "%s", pp[i].desc.name);
    r[i].step = step;
    r[i].ndim = pp[i].desc.ndim;
    memcpy(r[i].shape, pp[i].desc.shape, sizeof r[i].shape);
    r[i].slice = pp[i].slice;
    r[i].data = pp[i].data;
  }
  *out = r;
  *n = np;
  free(pp);
  return NEWT_OK;
}

/* Pieces that live on this rank alone within its data-parallel group: the ZeRO shards. */
static int unique_piece(const model_par *p, const reshard_piece *r) {
  if (p->pc.zero == 0 || p->pc.dp == 1) return 0;
  int moment = strncmp(r->name, MODEL_CKPT_ADAM_M, strlen(MODEL_CKPT_ADAM_M)) == 0 ||
               strncmp(r->name, MODEL_CKPT_ADAM_V, strlen(MODEL_CKPT_ADAM_V)) == 0;
  return moment || p->pc.zero == 3;
}

/* Frees a copy's buffers (device memory for the snapshot, host memory for the replica). */
static void copy_free(worker_copy *cp) {
  if (cp->dev) model_dev_free(cp->dev, cp->data);
  else free(cp->data);
  free(cp->spare), free(cp->pieces);
  cp->data = cp->spare = NULL;
  cp->pieces = NULL;
}

static void copies_free(worker *w) {
  copy_free(&w->snap);
  copy_free(&w->rep);
  memset(&w->snap, 0, sizeof w->snap);
  memset(&w->rep, 0, sizeof w->rep);
}

/* Whether this layout needs copies: anything but plain data parallelism (where every rank
 * holds the whole state and the newest state always wins). */
static int wants_copies(const model_par_config *pc) { return pc->tp * pc->pp > 1 || pc->zero > 0; }

/* Host staging of floats from the worker's pinned pool (pinned.c): memory that device
 * copies are fastest to and from, pinned once per run; given back with stage_release. */
static newt_result_t stage_get(worker *w, model_dev *dev, size_t floats, float **out) {
  worker_pinned *pool = NULL;
  void *mem = NULL;
  *out = NULL;
  NEWT_CHECK(worker_pinned_of(w, dev, &pool));
  newt_result_t r = worker_pinned_get(pool, floats * sizeof(float), &mem);
  if (r != NEWT_OK) return newt_err_wrap(r, "staging %zu floats of the state on the host: ", floats);
  *out = mem;
  return NEWT_OK;
}

static void stage_release(worker *w, float *stage) {
  if (stage) worker_pinned_put(w->pinned, stage);
}

/* --- snapshot and replica ----------------------------------------------------------------- */

/* Lays out a copy of the given pieces in one buffer: memory of dev (NULL: the host). */
static newt_result_t copy_layout(worker_copy *cp, model_dev *dev, const reshard_piece *src, size_t n) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += (size_t)newt_slice_numel(&src[i].slice);
  memset(cp, 0, sizeof *cp);
  cp->dev = dev;
  cp->pieces = calloc(n ? n : 1, sizeof *cp->pieces);
  newt_result_t r = cp->pieces ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a copy of %zu pieces", n);
  if (r == NEWT_OK && dev) {
    void *d = NULL;
    r = model_dev_alloc(dev, (total ? total : 1) * sizeof *cp->data, &d);
    cp->data = d;
  } else if (r == NEWT_OK && !(cp->data = malloc((total ? total : 1) * sizeof *cp->data))) {
    r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a copy of %zu floats", total);
  }
  if (r != NEWT_OK) {
    copy_free(cp);
    memset(cp, 0, sizeof *cp);
    return r;
  }
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    cp->pieces[i] = src[i];
    cp->pieces[i].data = cp->data + off;
    off += (size_t)newt_slice_numel(&src[i].slice);
  }
  cp->n = n;
  cp->len = total;
  cp->step = -1;
  return NEWT_OK;
}

newt_result_t worker_snapshot(worker *w) {
  if (!w->have_par || !wants_copies(&w->par.pc)) return NEWT_OK;
  reshard_piece *cur = NULL;
  size_t n = 0;
  NEWT_CHECK(par_pieces(&w->par, w->par.step, &cur, &n));
  newt_result_t r = NEWT_OK;
  model_dev *dev = w->par.dev;
  if (!w->snap.pieces || w->snap.n != n) {
    copy_free(&w->snap);
    r = copy_layout(&w->snap, dev, cur, n);
  }
  /* on the device, queued behind the step's work: no trip through the host */
  for (size_t i = 0; r == NEWT_OK && i < n; i++)
    model_dev_copy(dev, w->snap.pieces[i].data, cur[i].data, (size_t)newt_slice_numel(&cur[i].slice) * sizeof(float));
  if (r == NEWT_OK) r = model_dev_error(dev);
  if (r == NEWT_OK) {
    w->snap.step = w->par.step;
    for (size_t i = 0; i < n; i++) w->snap.pieces[i].step = w->par.step;
  }
  free(cur);
  return r;
}

/* Ring order within the data-parallel group: even ranks send first, odd ranks receive
 * first, so blocking sends cannot all wait on each other. out and in are host memory, so
 * they go over the group's CPU channel (comm_host_channel: an NCCL group's takes only device
 * memory). */
static newt_result_t ring_shift(comm_t *c, const void *out, size_t nout, void *in, size_t nin, newt_dtype dt) {
  c = comm_host_channel(c);
  int n = comm_size(c), r = comm_rank(c), next = (r + 1) % n, prev = (r + n - 1) % n;
  if (r % 2 == 0) {
    if (nout) NEWT_CHECK(comm_send(c, out, nout, dt, next));
    if (nin) NEWT_CHECK(comm_recv(c, in, nin, dt, prev));
  } else {
    if (nin) NEWT_CHECK(comm_recv(c, in, nin, dt, prev));
    if (nout) NEWT_CHECK(comm_send(c, out, nout, dt, next));
  }
  return NEWT_OK;
}

newt_result_t worker_replicate(worker *w) {
  const model_par *p = &w->par;
  if (!w->have_par || p->pc.zero == 0 || p->pc.dp < 2 || !w->comms.dp) return NEWT_OK;
  if (p->step % w->spec.replica_every != 0) return NEWT_OK;
  reshard_piece *cur = NULL;
  size_t n = 0;
  NEWT_CHECK(par_pieces(p, p->step, &cur, &n));
  /* this rank's shard, packed */
  size_t nu = 0, total = 0;
  for (size_t i = 0; i < n; i++)
    if (unique_piece(p, &cur[i])) cur[nu++] = cur[i], total += (size_t)newt_slice_numel(&cur[i].slice);
  newt_result_t r = NEWT_OK;
  if (!w->rep.pieces) {
    /* the first time in this generation: tell the next rank what it will keep */
    int64_t counts[2] = {(int64_t)nu, 0};
    r = ring_shift(w->comms.dp, &counts[0], 1, &counts[1], 1, NEWT_I64);
    size_t nin = (size_t)counts[1];
    char *wout = malloc(reshard_wire_size(nu) + 1), *win = malloc(reshard_wire_size(nin) + 1);
    reshard_piece *desc = calloc(nin ? nin : 1, sizeof *desc);
    if (r == NEWT_OK && (!wout || !win || !desc)) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a replica");
    if (r == NEWT_OK) {
      reshard_pack(cur, nu, wout);
      r = ring_shift(w->comms.dp, wout, reshard_wire_size(nu), win, reshard_wire_size(nin), NEWT_U8);
    }
    if (r == NEWT_OK) r = reshard_unpack(win, reshard_wire_size(nin), desc, nin);
    if (r == NEWT_OK) r = copy_layout(&w->rep, NULL, desc, nin); /* held on the host */
    if (r == NEWT_OK && !(w->rep.spare = malloc((w->rep.len ? w->rep.len : 1) * sizeof *w->rep.spare)))
      r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a replica");
    free(wout), free(win), free(desc);
  }
  /* this rank's shard packed on the host: a memcpy each on the CPU; on a GPU into pinned
     staging, every copy queued and one wait */
  int visible = model_dev_host_visible(p->dev);
  float *packed = NULL;
  if (r == NEWT_OK && visible && !(packed = malloc((total ? total : 1) * sizeof *packed)))
    r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a replica");
  if (r == NEWT_OK && !visible) r = stage_get(w, p->dev, total, &packed);
  if (r == NEWT_OK) {
    size_t off = 0;
    for (size_t i = 0; i < nu && r == NEWT_OK; i++) {
      size_t k = (size_t)newt_slice_numel(&cur[i].slice);
      if (visible) r = model_dev_download(p->dev, packed + off, cur[i].data, k * sizeof *packed);
      else model_dev_download_async(p->dev, packed + off, cur[i].data, k * sizeof *packed);
      off += k;
    }
    if (r == NEWT_OK && !visible) r = model_dev_sync(p->dev);
  }
  if (r == NEWT_OK) {
    /* into the spare buffer: until it is whole, the previous replica stays (a rollback to
       the committed step may need it) */
    w->rep.spare_step = -1;
    r = ring_shift(w->comms.dp, packed, total, w->rep.spare, w->rep.len, NEWT_F32);
  }
  if (r == NEWT_OK) {
    float *old = w->rep.data;
    w->rep.data = w->rep.spare;
    w->rep.spare = old;
    for (size_t i = 0; i < w->rep.n; i++) {
      w->rep.pieces[i].data = w->rep.data + ((float *)w->rep.pieces[i].data - old);
      w->rep.pieces[i].step = p->step;
    }
    /* the one before stays whole in the spare until the next transfer: where a failure cut
       another stage's step short, the job may have to roll back to it (its snapshots are of
       that step, and this replica has moved on) */
    w->rep.spare_step = w->rep.step;
    w->rep.step = p->step;
  }
  if (visible) free(packed);
  else stage_release(w, packed);
  free(cur);
  return r;
}

/* --- host staging ------------------------------------------------------------------------ */

/* Resharding and checkpoints read and write host memory. Pieces in memory of a device the
 * host cannot touch are staged: *stage (from the pinned pool, NULL when nothing was) gets a
 * host copy of pieces [0, n) of v (download = 1: their data, every copy queued and one
 * wait; 0: room only) and v's pointers are moved there. With a host-visible device (the
 * CPU) nothing is copied: zero-copy as ever. */
static newt_result_t stage_pieces(worker *w, model_dev *dev, reshard_piece *v, size_t n, int download, float **stage) {
  *stage = NULL;
  if (model_dev_host_visible(dev) || n == 0) return NEWT_OK;
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += (size_t)newt_slice_numel(&v[i].slice);
  float *h = NULL;
  NEWT_CHECK(stage_get(w, dev, total, &h));
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    size_t k = (size_t)newt_slice_numel(&v[i].slice);
    if (download) model_dev_download_async(dev, h + off, v[i].data, k * sizeof *h);
    v[i].data = h + off;
    off += k;
  }
  newt_result_t r = download ? model_dev_sync(dev) : NEWT_OK;
  if (r != NEWT_OK) {
    stage_release(w, h);
    return r;
  }
  *stage = h;
  return NEWT_OK;
}

/* The staged pieces' data back up to their device pointers (dst: the pieces before they
 * were staged); nothing when stage is NULL. */
static newt_result_t unstage_pieces(model_dev *dev, const reshard_piece *dst, size_t n, const float *stage) {
  if (!stage) return NEWT_OK;
  size_t off = 0;
  for (size_t i = 0; i < n; i++) { /* from the pinned staging, every copy queued and one wait */
    size_t k = (size_t)newt_slice_numel(&dst[i].slice);
    model_dev_upload_async(dev, dst[i].data, stage + off, k * sizeof *stage);
    off += k;
  }
  return model_dev_sync(dev);
}

/* What this rank holds: its state, its snapshot (when older), its neighbour's replica.
 * *out is malloc'd; the pieces point into this rank's buffers, or into *stage (pinned, for
 * stage_release; NULL when none) where the device's memory is not the host's. */
static newt_result_t held_pieces(worker *w, reshard_piece **out, size_t *n, float **stage) {
  reshard_piece *cur = NULL, *have;
  size_t ncur = 0;
  *stage = NULL;
  if (w->has_state && w->have_par) NEWT_CHECK(par_pieces(&w->par, w->par.step, &cur, &ncur));
  size_t nsnap = w->snap.step >= 0 && w->snap.step != w->par.step ? w->snap.n : 0, nrep = w->rep.step >= 0 ? w->rep.n : 0;
  size_t nold = nrep && w->rep.spare && w->rep.spare_step >= 0 ? w->rep.n : 0; /* the replica before */
  have = calloc(ncur + nsnap + nrep + nold + 1, sizeof *have);
  if (!have) {
    free(cur);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory listing what this rank holds");
  }
  if (ncur) memcpy(have, cur, ncur * sizeof *have);
  if (nsnap) memcpy(have + ncur, w->snap.pieces, nsnap * sizeof *have);
  if (nrep) memcpy(have + ncur + nsnap, w->rep.pieces, nrep * sizeof *have);
  for (size_t i = 0; i < nold; i++) {
    reshard_piece *o = &have[ncur + nsnap + nrep + i];
    *o = w->rep.pieces[i];
    o->data = w->rep.spare + ((float *)w->rep.pieces[i].data - w->rep.data);
    o->step = w->rep.spare_step;
  }
  free(cur);
  /* the state and the snapshot are device memory; the replica is the host's already */
  model_dev *dev = w->have_par ? w->par.dev : w->snap.dev;
  newt_result_t r = ncur + nsnap && dev ? stage_pieces(w, dev, have, ncur + nsnap, 1, stage) : NEWT_OK;
  if (r != NEWT_OK) {
    free(have);
    return r;
  }
  *out = have;
  *n = ncur + nsnap + nrep + nold;
  NEWT_DEBUG(WORKER, "%s: holds its state of step %lld%s (%zu pieces), a snapshot of step %lld (%zu), replicas of steps %lld and %lld (%zu each)",
             w->id, ncur ? (long long)w->par.step : -1LL, w->have_par && w->par.params_stale ? ", its parameters partly gathered" : "",
             ncur, nsnap ? (long long)w->snap.step : -1LL, nsnap, nrep ? (long long)w->rep.step : -1LL,
             nold ? (long long)w->rep.spare_step : -1LL, nrep);
  return NEWT_OK;
}

/* --- restore ------------------------------------------------------------------------------- */

/* Every rank reads its own pieces of the newest checkpoint; they check they read one step. */
static newt_result_t load_ckpt(worker *w, comm_t *c, model_par *np, int64_t *step) {
  /* host staging (pinned) for a device the host cannot touch: read there, then uploaded */
  float *stage = NULL;
  if (!model_dev_host_visible(np->dev)) NEWT_CHECK(stage_get(w, np->dev, model_ckpt_par_floats(np), &stage));
  model_ckpt_train_point pt = {.step = -1};
  char desc[SPEC_PATH_MAX + 32];
  spec_data_desc(&w->spec, desc, sizeof desc);
  newt_result_t r = w->spec.ckpt_dir[0]
                        ? model_ckpt_par_load(w->spec.ckpt_dir, CKPT_LATEST, np, desc, 2, stage, &pt)
                        : NEWT_ERR(NEWT_ERR_NOTFOUND, "no checkpoint directory");
  stage_release(w, stage);
  if (r != NEWT_OK && r != NEWT_ERR_NOTFOUND) return r;
  int64_t got = r == NEWT_OK ? pt.step : -1, lo = got, hi = got;
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
  *step = pt.step; /* np->step and np->opt.t are set */
  return NEWT_OK;
}

static int same_layout(const model_par_config *a, const model_par_config *b) {
  return a->tp == b->tp && a->pp == b->pp && a->dp == b->dp && a->zero == b->zero && a->tp_rank == b->tp_rank &&
         a->pp_rank == b->pp_rank && a->dp_rank == b->dp_rank;
}

newt_result_t worker_restore(worker *w, comm_t *c, const newt_plan *p, const model_par_config *pc) {
  newt_result_t r = NEWT_OK;
  model_par fresh, *np = &w->par;
  int reuse = w->have_par && same_layout(&w->par.pc, pc);
  if (!reuse) {
    NEWT_CHECK(model_par_alloc(&fresh, &w->tcfg, pc)); /* its weights come from below */
    np = &fresh;
  }
  /* what this rank holds: its state, its snapshot, its neighbour's replica */
  reshard_piece *have = NULL, *need = NULL, *need_dev = NULL;
  size_t nhave = 0, nneed = 0;
  float *have_stage = NULL, *need_stage = NULL;
  NEWT_CHECK_GOTO(held_pieces(w, &have, &nhave, &have_stage), r, exit);
  NEWT_CHECK_GOTO(par_pieces(np, -1, &need, &nneed), r, exit);
  if (!model_dev_host_visible(np->dev)) { /* received into host staging, then uploaded */
    need_dev = malloc((nneed ? nneed : 1) * sizeof *need_dev);
    if (!need_dev) {
      r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory listing what this rank needs");
      goto exit;
    }
    if (nneed) memcpy(need_dev, need, nneed * sizeof *need);
    NEWT_CHECK_GOTO(stage_pieces(w, np->dev, need, nneed, 0, &need_stage), r, exit);
  }

  reshard_result rr;
  r = reshard_exchange(c, have, nhave, need, nneed, NULL, &rr);
  if (r == NEWT_OK) r = unstage_pieces(np->dev, need_dev, nneed, need_stage);
  if (r == NEWT_OK) {
    np->step = rr.step;
    np->opt.t = rr.step; /* one AdamW update per step */
    snprintf(w->restore_src, sizeof w->restore_src, "%s", rr.received ? "peer" : "memory");
  } else if (r == NEWT_ERR_NOTFOUND) {
    int64_t step = -1;
    r = load_ckpt(w, c, np, &step);
    if (r != NEWT_OK && r != NEWT_ERR_NOTFOUND && reuse) w->has_state = 0; /* half read: not a state */
    if (r == NEWT_OK) {
      snprintf(w->restore_src, sizeof w->restore_src, "ckpt");
    } else if (r == NEWT_ERR_NOTFOUND) {
      if (p->step > 0)
        NEWT_ERROR(WORKER, "%s: the job was at step %lld but no rank holds a state and there is no "
                           "checkpoint: starting again from the seed",
                   w->id, (long long)p->step);
      /* back to the seed (also a reused trainer, or one a checkpoint half filled) */
      r = model_par_init_weights(np);
      snprintf(w->restore_src, sizeof w->restore_src, "init");
    }
  }
exit:
  free(have), free(need), free(need_dev);
  stage_release(w, have_stage), stage_release(w, need_stage);
  if (!reuse) {
    if (r == NEWT_OK) {
      if (w->have_par) model_par_free(&w->par);
      w->par = fresh;
      w->have_par = 1;
    } else {
      model_par_free(&fresh);
    }
  }
  if (r != NEWT_OK) return r;
  copies_free(w); /* they belong to the old layout */
  w->snap.step = w->rep.step = w->rep.spare_step = -1;
  w->has_state = 1;
  w->restore_step = w->done_step = w->committed_step = w->par.step;
  NEWT_INFO(WORKER, "%s: generation %llu starts at step %lld (state from %s)", w->id,
            (unsigned long long)p->generation, (long long)w->par.step, w->restore_src);
  return NEWT_OK;
}

newt_result_t worker_donate(worker *w, comm_t *c) {
  reshard_piece *have = NULL;
  size_t n = 0;
  float *stage = NULL;
  NEWT_CHECK(held_pieces(w, &have, &n, &stage));
  reshard_result rr;
  newt_result_t r = reshard_exchange(c, have, n, NULL, 0, NULL, &rr);
  free(have);
  stage_release(w, stage);
  return r;
}

void worker_state_free(worker *w) {
  copies_free(w);
  if (w->have_par) model_par_free(&w->par);
  w->have_par = 0;
  worker_pinned_free(w->pinned); /* after the saver (worker_ckpt_free), before the device closes */
  w->pinned = NULL;
}
