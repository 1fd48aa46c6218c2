/* The declared training state across generations (docs/elastic.md, "Restore"; newt.h's
 * newt_state_*).
 *
 * A rank's state is what the program declares for the layout of its plan: parts of named
 * global tensors (a box, narrowed to a range of its row-major order) and opaque bytes, in
 * host or device memory. On each new plan:
 *
 *   - the ranks of the new communicator reshard in memory (worker/reshard.c): each says
 *     which parts it holds and of which step (its state, its pre-update snapshot, its
 *     neighbour's replica), the newest step whose parts cover every rank's new needs
 *     wins, and the parts move between ranks; a replacement or a joiner is filled from
 *     its peers, a different data-parallel size re-cuts the shards in memory;
 *   - only when no step is covered do the ranks read the newest valid checkpoint (each
 *     reading just its own parts, under any layout); on a new job there is nothing, and
 *     the program initialises its state itself, identically everywhere.
 *
 * The same exchange works out each part's role from every rank's declarations: the copy
 * to save (one per element across the layout), the parts no other rank holds (ZeRO shards,
 * tensor-parallel slices without a data-parallel replica), and whether every rank holds
 * everything. A rank whose last step failed holds step s, one whose step completed holds
 * s + 1: both are whole states, the newer wins when it is covered, nothing is mixed. Unless
 * every rank holds everything, two copies keep a lost rank from forcing a trip to disk:
 * every rank snapshots its state when a step is committed, before the update (so a step
 * that some ranks applied and others not can be rolled back everywhere), and each
 * data-parallel rank keeps copies of the unique parts of its k = spec.fault.replicas
 * predecessors in the data-parallel ring (at most dp - 1), refreshed every
 * spec.fault.replica_every steps: k shifts by one along the ring, each forwarding what the
 * one before brought, so rank d gets d-1's parts, then d-2's, ... The plan orders the ring
 * so that k + 1 consecutive ranks sit in distinct failure domains: any k domains lost at
 * once leave a copy of every part. Bytes a program declares per rank are parts only that
 * rank holds, optional: restored where a state of the step has them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/internal.h"
#include "worker/reshard.h"

/* --- declaring ------------------------------------------------------------------------------ */

void worker_decl_free(worker_decl *d) {
  free(d->parts);
  memset(d, 0, sizeof *d);
}

newt_result_t worker_declare(worker *w, const reshard_piece *p) {
  worker_decl *d = &w->decl;
  for (size_t i = 0; i < d->n; i++) {
    const reshard_piece *q = &d->parts[i].p;
    if (strcmp(q->name, p->name) != 0) continue;
    if (q->dtype != p->dtype || q->ndim != p->ndim || memcmp(q->shape, p->shape, sizeof q->shape) != 0)
      return NEWT_ERR(NEWT_ERR_INVALID, "tensor \"%s\" was declared before with another type or shape", p->name);
    int64_t ov = newt_slice_copy(p->shape, 1, &p->slice, NULL, &q->slice, NULL);
    int nested = ((p->flags | q->flags) & RESHARD_DERIVED) &&
                 (ov == newt_slice_numel(&p->slice) || ov == newt_slice_numel(&q->slice));
    if (ov > 0 && !nested)
      return NEWT_ERR(NEWT_ERR_INVALID, "tensor \"%s\" declared twice: this part overlaps one declared before "
                      "(%lld elements in common)", p->name, (long long)ov);
  }
  if (d->n == d->cap) {
    size_t cap = d->cap ? 2 * d->cap : 64;
    worker_part *np = realloc(d->parts, cap * sizeof *np);
    NEWT_CHECK_ALLOC(np);
    d->parts = np, d->cap = cap;
  }
  worker_part *e = &d->parts[d->n++];
  memset(e, 0, sizeof *e);
  e->p = *p;

  return NEWT_OK;
}

/* The declared parts as reshard pieces of one step. *out is malloc'd. */
static newt_result_t decl_pieces(const worker_decl *d, int64_t step, reshard_piece **out, size_t *n) {
  reshard_piece *r = malloc((d->n ? d->n : 1) * sizeof *r);
  NEWT_CHECK_ALLOC(r);
  for (size_t i = 0; i < d->n; i++) {
    r[i] = d->parts[i].p;
    r[i].step = step;
  }
  *out = r;
  *n = d->n;
  return NEWT_OK;
}

/* --- host staging --------------------------------------------------------------------------- */

/* Resharding and checkpoints read and write host memory. Pieces v[i] with dev[i] set are
 * device memory the host cannot touch: *stage (from the pinned pool, NULL when nothing was)
 * gets a host copy of them (download = 1: their data, every copy queued and one wait; 0:
 * room only) and their pointers are moved there. */
static newt_result_t stage_pieces(worker *w, reshard_piece *v, const int *dev, size_t n, int download, void **stage) {
  *stage = NULL;
  size_t total = 0;
  for (size_t i = 0; i < n; i++)
    if (dev[i]) total += reshard_piece_bytes(&v[i]);
  if (total == 0) return NEWT_OK;
  char *h = NULL;
  NEWT_CHECK(worker_stage_get(w, total, (void **)&h));
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    if (!dev[i]) continue;
    size_t b = reshard_piece_bytes(&v[i]);
    if (download) worker_mem_copy(&w->o.memory, h + off, v[i].data, b, 1);
    v[i].data = h + off;
    off += b;
  }
  newt_result_t r = download ? worker_mem_sync(&w->o.memory) : NEWT_OK;
  if (r != NEWT_OK) {
    worker_stage_release(w, h);
    return r;
  }
  *stage = h;
  return NEWT_OK;
}

/* The staged pieces' data back up to their device pointers (dst: the pieces before they
 * were staged); nothing when stage is NULL. */
static newt_result_t unstage_pieces(worker *w, const reshard_piece *dst, const int *dev, size_t n, const void *stage) {
  if (!stage) return NEWT_OK;
  const char *h = stage;
  size_t off = 0;
  for (size_t i = 0; i < n; i++) { /* from the pinned staging, every copy queued and one wait */
    if (!dev[i]) continue;
    size_t b = reshard_piece_bytes(&dst[i]);
    worker_mem_copy(&w->o.memory, dst[i].data, h + off, b, 2);
    off += b;
  }
  return worker_mem_sync(&w->o.memory);
}

/* --- snapshot and replica ----------------------------------------------------------------- */

void worker_copy_free(worker *w, worker_copy *cp) {
  if (cp->on_device && cp->data) w->o.memory.free(w->o.memory.ctx, cp->data);
  else free(cp->data);
  free(cp->spare), free(cp->pieces);
  memset(cp, 0, sizeof *cp);
  cp->step = cp->spare_step = -1;
}

static void copies_free(worker *w) {
  worker_copy_free(w, &w->snap);
  worker_copy_free(w, &w->vsnap);
  w->verified_step = -1;
  for (int j = 0; j < SPEC_REPLICAS_MAX; j++) worker_copy_free(w, &w->rep[j]);
}

/* A piece's room in a copy's buffer: its bytes rounded up to a cache line. */
static size_t padded(size_t bytes) { return (bytes + 63) / 64 * 64; }

newt_result_t worker_copy_layout(worker *w, worker_copy *cp, int dev, const reshard_piece *src, size_t n) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += padded(reshard_piece_bytes(&src[i]));
  worker_copy_free(w, cp);
  cp->on_device = dev;
  cp->pieces = calloc(n ? n : 1, sizeof *cp->pieces);
  newt_result_t r = cp->pieces ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a copy of %zu parts", n);
  if (r == NEWT_OK && dev) r = w->o.memory.alloc(w->o.memory.ctx, total ? total : 1, (void **)&cp->data);
  else if (r == NEWT_OK && !(cp->data = malloc(total ? total : 1)))
    r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a copy of %zu bytes", total);
  if (r != NEWT_OK) {
    if (dev) cp->data = NULL;
    worker_copy_free(w, cp);
    return r;
  }
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    cp->pieces[i] = src[i];
    cp->pieces[i].data = cp->data + off;
    off += padded(reshard_piece_bytes(&src[i]));
  }
  cp->n = n;
  cp->bytes = total;
  cp->step = -1;
  return NEWT_OK;
}

/* The snapshot is one buffer of the device when any part is device memory (host parts are
 * then copied to it from the host), else host memory: a copy queued behind the step's
 * work, no trip through the host for the device's parts. */
newt_result_t worker_snapshot(worker *w) {
  if (!w->has_state || w->whole) return NEWT_OK;
  int dev = 0;
  for (size_t i = 0; i < w->decl.n; i++) dev |= worker_part_on_device(w, &w->decl.parts[i]);
  if (!w->snap.pieces || w->snap.n != w->decl.n || w->snap.on_device != dev) {
    reshard_piece *cur = NULL;
    size_t n = 0;
    NEWT_CHECK(decl_pieces(&w->decl, w->live_step, &cur, &n));
    newt_result_t r = worker_copy_layout(w, &w->snap, dev, cur, n);
    free(cur);
    NEWT_CHECK(r);
  }
  int uploads = 0;
  for (size_t i = 0; i < w->decl.n; i++) {
    const worker_part *p = &w->decl.parts[i];
    size_t b = reshard_piece_bytes(&p->p);
    if (!dev) memcpy(w->snap.pieces[i].data, p->p.data, b);
    else if (worker_part_on_device(w, p)) worker_mem_copy(&w->o.memory, w->snap.pieces[i].data, p->p.data, b, 0);
    else worker_mem_copy(&w->o.memory, w->snap.pieces[i].data, p->p.data, b, 2), uploads = 1;
  }
  /* device-to-device copies are queued behind the step's work and not waited for (a copy
     that fails fails the device, which the next wait of the step says); a copy from host
     memory is, so that its source may change */
  if (uploads) NEWT_CHECK(worker_mem_sync(&w->o.memory));
  w->snap.step = w->live_step;
  for (size_t i = 0; i < w->snap.n; i++) w->snap.pieces[i].step = w->live_step;
  return NEWT_OK;
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

/* The replicas this rank keeps: spec.fault.replicas, at most dp - 1 (beyond, a rank would
 * get its own parts back) and SPEC_REPLICAS_MAX; one in a group of one, as ever. */
static int replicas_kept(const worker *w) {
  int k = w->spec.replicas > 1 ? (int)w->spec.replicas : 1, n = comm_size(w->dp);
  if (n > 1 && k > n - 1) k = n - 1;
  return k < SPEC_REPLICAS_MAX ? k : SPEC_REPLICAS_MAX;
}

/* The first replica of a generation, round j: tells the next rank what it will keep (this
 * rank's unique parts in round 0, else what it keeps in rep[j-1]), and lays out in cp what
 * this rank keeps of the one before (host memory, and a spare of the same size). */
static newt_result_t replica_layout(worker *w, worker_copy *cp, const reshard_piece *mine, size_t nu) {
  int64_t counts[2] = {(int64_t)nu, 0};
  NEWT_CHECK(ring_shift(w->dp, &counts[0], 1, &counts[1], 1, NEWT_I64));
  size_t nin = (size_t)counts[1];
  char *wout = malloc(reshard_wire_size(nu) + 1), *win = malloc(reshard_wire_size(nin) + 1);
  reshard_piece *desc = calloc(nin ? nin : 1, sizeof *desc);
  newt_result_t r = wout && win && desc ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a replica");
  if (r == NEWT_OK) {
    reshard_pack(mine, nu, wout);
    r = ring_shift(w->dp, wout, reshard_wire_size(nu), win, reshard_wire_size(nin), NEWT_U8);
  }
  if (r == NEWT_OK) r = reshard_unpack(win, reshard_wire_size(nin), desc, nin);
  if (r == NEWT_OK) r = worker_copy_layout(w, cp, 0, desc, nin);
  if (r == NEWT_OK && !(cp->spare = malloc(cp->bytes ? cp->bytes : 1)))
    r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for a replica");
  free(wout), free(win), free(desc);
  return r;
}

/* One round of the replicas: out (nout bytes, host memory) to the next rank, the one before's
 * into cp's spare; once whole, the spare becomes the replica of this step. */
static newt_result_t replica_round(worker *w, worker_copy *cp, const void *out, size_t nout) {
  /* into the spare buffer: until it is whole, the previous replica stays (a rollback to the
     committed step may need it) */
  cp->spare_step = -1;
  NEWT_CHECK(ring_shift(w->dp, out, nout, cp->spare, cp->bytes, NEWT_U8));
  char *old = cp->data;
  cp->data = cp->spare;
  cp->spare = old;
  for (size_t i = 0; i < cp->n; i++) {
    cp->pieces[i].data = cp->data + ((char *)cp->pieces[i].data - old);
    cp->pieces[i].step = w->live_step;
  }
  /* the one before stays whole in the spare until the next transfer: where a failure cut
     another stage's step short, the job may have to roll back to it (its snapshots are of
     that step, and this replica has moved on) */
  cp->spare_step = cp->step;
  cp->step = w->live_step;
  return NEWT_OK;
}

newt_result_t worker_replicate(worker *w) {
  if (!w->has_state || w->whole || !w->dp || w->live_step % w->spec.replica_every != 0) return NEWT_OK;
  /* this rank's unique parts, packed on the host: a memcpy each for host memory; the
     device's into pinned staging, every copy queued and one wait */
  reshard_piece *mine = malloc((w->decl.n ? w->decl.n : 1) * sizeof *mine);
  NEWT_CHECK_ALLOC(mine);
  size_t nu = 0, total = 0;
  for (size_t i = 0; i < w->decl.n; i++)
    if (w->decl.parts[i].unique) {
      mine[nu] = w->decl.parts[i].p;
      mine[nu++].step = w->live_step;
      total += padded(reshard_piece_bytes(&w->decl.parts[i].p));
    }
  int k = replicas_kept(w);
  newt_result_t r = NEWT_OK;
  for (int j = 0; r == NEWT_OK && j < k; j++) /* round j keeps rank d-1-j's: what d-1 kept in rep[j-1] */
    if (!w->rep[j].pieces)
      r = j == 0 ? replica_layout(w, &w->rep[0], mine, nu) : replica_layout(w, &w->rep[j], w->rep[j - 1].pieces, w->rep[j - 1].n);
  char *packed = NULL;
  if (r == NEWT_OK) r = worker_stage_get(w, total ? total : 1, (void **)&packed);
  int queued = 0;
  for (size_t i = 0, off = 0; r == NEWT_OK && i < w->decl.n; i++) {
    const worker_part *p = &w->decl.parts[i];
    if (!p->unique) continue;
    size_t b = reshard_piece_bytes(&p->p);
    if (worker_part_on_device(w, p)) worker_mem_copy(&w->o.memory, packed + off, p->p.data, b, 1), queued = 1;
    else memcpy(packed + off, p->p.data, b);
    off += padded(b);
  }
  if (r == NEWT_OK && queued) r = worker_mem_sync(&w->o.memory);
  /* k shifts by one along the ring: this rank's parts, then what the round before brought */
  for (int j = 0; r == NEWT_OK && j < k; j++)
    r = j == 0 ? replica_round(w, &w->rep[0], packed, total) : replica_round(w, &w->rep[j], w->rep[j - 1].data, w->rep[j - 1].bytes);
  worker_stage_release(w, packed);
  free(mine);
  return r;
}

/* --- what a rank holds ---------------------------------------------------------------------- */

/* The pieces of replica cp this rank can offer, into have (when not NULL): the newest and
 * the one before (its spare, whole since the last swap). Returns how many. */
static size_t replica_pieces(const worker_copy *cp, reshard_piece *have) {
  size_t nrep = cp->step >= 0 ? cp->n : 0;
  size_t nold = nrep && cp->spare && cp->spare_step >= 0 ? cp->n : 0; /* the replica before */
  for (size_t i = 0; have && i < nrep; i++) have[i] = cp->pieces[i];
  for (size_t i = 0; have && i < nold; i++) {
    reshard_piece *o = &have[nrep + i];
    *o = cp->pieces[i];
    o->data = cp->spare + ((char *)cp->pieces[i].data - cp->data);
    o->step = cp->spare_step;
  }
  return nrep + nold;
}

/* What this rank holds: its state (the declaration `d` of step live_step, but the derived
 * parts after a step whose post-update collectives failed), its snapshot (when older), the
 * replicas of its data-parallel predecessors and the ones before. *out is malloc'd; device
 * memory is staged into *stage (pinned, for worker_stage_release; NULL when none). */
static newt_result_t held_pieces(worker *w, const worker_decl *d, reshard_piece **out, size_t *n, void **stage) {
  *stage = NULL;
  size_t ncur = w->has_state && w->rollback_to < 0 ? d->n : 0; /* a rollback's state is the verified copy's */
  size_t nsnap = w->snap.step >= 0 && w->snap.step != w->live_step ? w->snap.n : 0, nreps = 0;
  /* the verified copy (verify.c), host memory, when of another step than the snapshot's */
  size_t nver = w->vsnap.step >= 0 && w->vsnap.step != w->live_step && w->vsnap.step != w->snap.step ? w->vsnap.n : 0;
  int held = 0; /* the predecessors this rank holds copies of */
  for (int j = 0; j < SPEC_REPLICAS_MAX; j++) nreps += replica_pieces(&w->rep[j], NULL), held += w->rep[j].step >= 0;
  reshard_piece *have = calloc(ncur + nsnap + nver + nreps + 1, sizeof *have);
  int *dev = calloc(ncur + nsnap + 1, sizeof *dev);
  if (!have || !dev) {
    free(have), free(dev);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory listing what this rank holds");
  }
  size_t k = 0;
  for (size_t i = 0; i < ncur; i++) {
    if (w->derived_stale && (d->parts[i].p.flags & RESHARD_DERIVED)) continue;
    dev[k] = worker_part_on_device(w, &d->parts[i]);
    have[k] = d->parts[i].p;
    have[k++].step = w->live_step;
  }
  for (size_t i = 0; i < nsnap; i++) {
    dev[k] = w->snap.on_device;
    have[k++] = w->snap.pieces[i];
  }
  size_t nstaged = k;
  for (size_t i = 0; i < nver; i++) have[k++] = w->vsnap.pieces[i];
  for (int j = 0; j < SPEC_REPLICAS_MAX; j++) k += replica_pieces(&w->rep[j], have + k);
  newt_result_t r = stage_pieces(w, have, dev, nstaged, 1, stage);
  free(dev);
  if (r != NEWT_OK) {
    free(have);
    return r;
  }
  *out = have;
  *n = k;
  NEWT_DEBUG(WORKER, "%s: holds its state of step %lld%s (%zu parts), a snapshot of step %lld (%zu), replicas of "
             "steps %lld and %lld (%zu pieces of %d predecessors, with the ones before)", w->id,
             ncur ? (long long)w->live_step : -1LL, w->derived_stale ? ", its derived parts stale" : "", ncur,
             nsnap ? (long long)w->snap.step : -1LL, nsnap, (long long)w->rep[0].step, (long long)w->rep[0].spare_step,
             nreps, held);
  return NEWT_OK;
}

/* --- a state lost ---------------------------------------------------------------------------- */

/* The ranks of the generation this rank last trained in that the plan in force no longer
 * has (as ranks or donors), into buf: "rank 1 (w1, domain host0), rank 2 (...)". */
static void gone_ranks(const worker *w, char *buf, size_t cap) {
  const newt_plan *h = &w->held_plan;
  size_t l = 0;
  int named = 0, more = 0;
  buf[0] = '\0';
  for (int r = 0; r < h->nranks; r++) {
    const plan_rank *k = &h->ranks[r];
    if (plan_find(&w->plan, k->worker) || plan_find_donor(&w->plan, k->worker)) continue;
    if (named == 4 || l + 96 >= cap) {
      more++;
      continue;
    }
    l += (size_t)snprintf(buf + l, cap - l, "%srank %d (%.40s, domain %.40s)", named ? ", " : "", k->rank, k->worker,
                          plan_rank_domain(k));
    named++;
  }
  if (more && l < cap) snprintf(buf + l, cap - l, " and %d more", more);
}

/* No step is whole in the ranks' memory (reshard_exchange said NEWT_ERR_NOTFOUND: rr). When
 * the job had trained (a rank held a step, or the plan says the job was past step 0) its
 * state is lost, and spec.fault.on_state_loss decides: the newest checkpoint, the initial
 * state, or the job fails (every rank the same way: they decide on the same exchange). A new
 * job reads its checkpoint when there is one, else starts from its initial state. Sets
 * restore_src, live_step and filled; *wrote when a checkpoint read may have half-written the
 * declared buffers. */
static newt_result_t state_lost(worker *w, const reshard_result *rr, int *filled, size_t n, int *wrote) {
  worker_decl *d = &w->decl;
  int64_t at = rr->newest > w->plan.step ? rr->newest : w->plan.step; /* the newest step the job had reached */
  int lost = at > 0, mode = (int)w->spec.on_state_loss;
  int64_t k = w->spec.replicas > 1 ? w->spec.replicas : 1, step = -1;
  newt_result_t r = lost && mode == SPEC_LOSS_FAIL ? NEWT_ERR_NOTFOUND : worker_ckpt_load(w, w->all, &step);
  if (r != NEWT_OK && r != NEWT_ERR_NOTFOUND) *wrote = 1; /* maybe half read */
  if (r == NEWT_OK) {
    if (lost && at > step)
      NEWT_WARN(WORKER, "%s: no step of the job is whole in the ranks' memory (more failure domains lost at once than "
                "spec.fault.replicas = %lld keeps copies for?): the job was at step %lld, back to the checkpoint of step "
                "%lld, %lld steps to train again", w->id, (long long)k, (long long)at, (long long)step,
                (long long)(at - step));
    w->live_step = step;
    snprintf(w->restore_src, sizeof w->restore_src, "ckpt");
    for (size_t i = 0; i < n; i++) filled[i] = d->parts[i].filled;
    return NEWT_OK;
  }
  if (r != NEWT_ERR_NOTFOUND) return r;
  newt_err_clear();
  char why[JOB_TEXT_MAX];
  /* checkpoints there, none of them this job's: never started over on top of them (its saves
     would prune them) */
  if (w->ckpt_refused[0] && !(lost && mode == SPEC_LOSS_FAIL)) {
    snprintf(why, sizeof why, "%.*s. Remedy: the job secret that wrote them (--job-secret-file), `newt ckpt sign` of "
             "a step you trust (docs/ckpt.md, \"Whose checkpoint\"), or another checkpoint directory",
             (int)(sizeof why - 200), w->ckpt_refused);
    NEWT_ERROR(WORKER, "%s: the job fails: %s", w->id, why);
    w->failed = 1;
    snprintf(w->failed_why, sizeof w->failed_why, "%s", why);
    worker_report_fatal(w, &w->plan, why);
    return NEWT_ERR(NEWT_ERR_ABORTED, "the job failed: %s", why);
  }
  if (!lost || mode == SPEC_LOSS_RESTART) {
    if (lost)
      NEWT_WARN(WORKER, "%s: no step of the job is whole in the ranks' memory and there is no checkpoint: the job was "
                "at step %lld and starts again from its initial state (spec.fault.on_state_loss restart), %lld steps "
                "to train again", w->id, (long long)at, (long long)at);
    w->live_step = 0;
    snprintf(w->restore_src, sizeof w->restore_src, "init");
    memset(filled, 0, n * sizeof *filled);
    return NEWT_OK;
  }
  /* the job fails: what is lost, who held it, what to do */
  char gone[256], lostw[320];
  gone_ranks(w, gone, sizeof gone);
  if (rr->lost[0])
    snprintf(lostw, sizeof lostw, "; lost: parts of %d tensor%s (%s)", rr->nlost, rr->nlost == 1 ? "" : "s", rr->lost);
  else lostw[0] = '\0';
  snprintf(why, sizeof why,
           "state lost at step %lld: no step is whole in the ranks' memory%s%s%s%s (spec.fault.replicas is %lld) and %s. "
           "Remedy: more copies (--replicas, across more failure domains), checkpoints (--ckpt-dir, --ckpt-every), or "
           "--on-state-loss restart to start again from step 0",
           (long long)at, gone[0] ? " after " : "", gone, gone[0] ? " went at once" : "", lostw, (long long)k,
           mode == SPEC_LOSS_FAIL ? "spec.fault.on_state_loss is fail" : "there is no checkpoint to go back to");
  NEWT_ERROR(WORKER, "%s: the job fails: %s", w->id, why);
  w->failed = 1;
  snprintf(w->failed_why, sizeof w->failed_why, "%s", why);
  worker_report_fatal(w, &w->plan, why);
  return NEWT_ERR(NEWT_ERR_ABORTED, "the job failed: %s", why);
}

/* --- restore ------------------------------------------------------------------------------- */

/* Whether a part of b lies in memory of a part of a: a program that keeps its buffers
 * across generations declares them again (a trainer whose layout changed only in its
 * data-parallel size), and a restore then writes into what the previous declaration holds. */
static int decl_overlaps(const worker_decl *a, const worker_decl *b) {
  for (size_t i = 0; i < a->n; i++) {
    const char *p = a->parts[i].p.data, *pe = p + reshard_piece_bytes(&a->parts[i].p);
    for (size_t j = 0; j < b->n; j++) {
      const char *q = b->parts[j].p.data, *qe = q + reshard_piece_bytes(&b->parts[j].p);
      if (p < qe && q < pe) return 1;
    }
  }
  return 0;
}

newt_result_t worker_restore(worker *w, newt_restore_info *out) {
  worker_decl *d = &w->decl;
  if (d->n == 0 && w->prev.n) { /* nothing declared anew: the last declaration again, in place */
    *d = w->prev;
    memset(&w->prev, 0, sizeof w->prev);
  }
  size_t n = d->n;
  int wrote = 0; /* something was written into the declared buffers */
  if (n == 0) return NEWT_ERR(NEWT_ERR_INVALID, "newt_state_restore: nothing declared (newt_state_tensor first)");
  /* what this rank holds (the previous declaration), what it needs (this one) */
  reshard_piece *have = NULL, *need = NULL, *need_dev = NULL;
  size_t nhave = 0, nneed = 0;
  void *have_stage = NULL, *need_stage = NULL;
  int *dev = calloc(n, sizeof *dev), *primary = calloc(n, sizeof *primary), *unique = calloc(n, sizeof *unique),
      *filled = calloc(n, sizeof *filled), *replicated = calloc(n, sizeof *replicated);
  newt_result_t r = dev && primary && unique && filled && replicated ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  if (r == NEWT_OK) r = held_pieces(w, w->prev.n ? &w->prev : d, &have, &nhave, &have_stage);
  if (r == NEWT_OK) r = decl_pieces(d, -1, &need, &nneed);
  if (r == NEWT_OK && !(need_dev = malloc(n * sizeof *need_dev))) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  if (r == NEWT_OK) { /* received into host staging, then uploaded */
    memcpy(need_dev, need, n * sizeof *need);
    for (size_t i = 0; i < n; i++) dev[i] = worker_part_on_device(w, &d->parts[i]);
    r = stage_pieces(w, need, dev, n, 0, &need_stage);
  }
  /* the parts a rank keeps a copy of for its data-parallel neighbour: those no other rank of
     the data-parallel group holds (a ZeRO shard: the tensor-parallel ranks holding the same
     shard are of other groups, and may go at once) */
  /* a rollback restores among the ranks (the donors, if any, left after the first restore) */
  comm_t *all = w->rollback_to >= 0 ? w->train : w->all;
  int members = w->rollback_to >= 0 ? w->plan.nranks : w->plan.nranks + w->plan.ndonors;
  int *group = malloc((size_t)members * sizeof *group);
  if (r == NEWT_OK && !group) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  for (int k = 0; group && k < members; k++) /* the dp group's color, as build_groups splits it */
    group[k] = k < w->plan.nranks ? (k / (w->plan.tp * w->plan.dp)) * w->plan.tp + k % w->plan.tp : -1 - k;
  reshard_result rr = {0};
  reshard_roles ro = {.check = 1, .primary = primary, .unique = unique, .filled = filled, .group = group,
                      .replicated = replicated};
  int ex = r == NEWT_OK ? reshard_exchange(all, have, nhave, need, n, &ro, &rr) : NEWT_ERR_INTERNAL;
  if (r == NEWT_OK) r = (newt_result_t)ex;
  if (ex != NEWT_ERR_INTERNAL) wrote = rr.copied + rr.received > 0;
  if (r == NEWT_OK) r = unstage_pieces(w, need_dev, dev, n, need_stage);
  int64_t received = r == NEWT_OK ? rr.received : 0;
  if (r == NEWT_OK) {
    w->live_step = rr.step;
    snprintf(w->restore_src, sizeof w->restore_src, "%s", rr.received ? "peer" : "memory");
  } else if (r == NEWT_ERR_NOTFOUND) {
    r = state_lost(w, &rr, filled, n, &wrote);
  }
  if (r == NEWT_OK) {
    int missing = 0;
    for (size_t i = 0; i < n; i++) {
      d->parts[i].primary = primary[i];
      d->parts[i].unique = unique[i];
      d->parts[i].filled = filled[i];
      d->parts[i].replicated = replicated[i];
      missing += (d->parts[i].p.flags & RESHARD_OPTIONAL) && !filled[i] && strcmp(w->restore_src, "init") != 0;
    }
    w->whole = ro.whole;
    if (out) {
      out->step = w->live_step;
      out->source = strcmp(w->restore_src, "peer") == 0     ? NEWT_FROM_PEERS
                    : strcmp(w->restore_src, "memory") == 0 ? NEWT_FROM_MEMORY
                    : strcmp(w->restore_src, "ckpt") == 0   ? NEWT_FROM_CHECKPOINT
                                                            : NEWT_FROM_NOTHING;
      out->bytes_received = received;
      out->bytes_missing = missing;
    }
  } else if (w->has_state && wrote && (w->prev.n == 0 || decl_overlaps(&w->prev, d))) {
    w->has_state = 0; /* the buffers held the state and were half written: no state any more */
  }
  free(have), free(need), free(need_dev), free(dev), free(primary), free(unique), free(filled), free(replicated),
      free(group);
  worker_stage_release(w, have_stage), worker_stage_release(w, need_stage);
  if (r != NEWT_OK) return r;
  worker_decl_free(&w->prev); /* the program may free those buffers now */
  copies_free(w);             /* they belong to the old layout */
  w->rollback_to = -1;
  w->has_state = 1;
  w->state_in_decl = 1;
  w->derived_stale = 0;
  w->restore_step = w->done_step = w->committed_step = w->live_step;
  NEWT_INFO(WORKER, "%s: generation %llu starts at step %lld (state from %s)", w->id,
            (unsigned long long)w->plan.generation, (long long)w->live_step, w->restore_src);
  return NEWT_OK;
}

newt_result_t worker_donate(worker *w, comm_t *c) {
  reshard_piece *have = NULL;
  size_t n = 0;
  void *stage = NULL;
  NEWT_CHECK(held_pieces(w, &w->decl, &have, &n, &stage));
  reshard_result rr;
  newt_result_t r = reshard_exchange(c, have, n, NULL, 0, NULL, &rr);
  free(have);
  worker_stage_release(w, stage);
  return r;
}

void worker_state_free(worker *w) {
  copies_free(w);
  worker_decl_free(&w->decl);
  worker_decl_free(&w->prev);
  worker_pinned_free(w->pinned); /* after the saver (worker_ckpt_free), before the device closes */
  w->pinned = NULL;
}
