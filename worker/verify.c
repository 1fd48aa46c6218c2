/* Replicas that disagree (docs/elastic.md, "Replicas that disagree"; issue 35).
 *
 * A part every rank of a data-parallel group holds alike (its `replicated` role from the
 * restore: weights under ZeRO 0-2, module buffers, the program's replicated tensors and
 * bytes; a rank's own bytes are not) must stay bitwise the same on every rank: each applies
 * the same update to the same values. A flipped bit (silent data corruption), or a program
 * whose own code changes a replica on one rank (BatchNorm's running statistics), breaks that
 * without any error. So every spec.fault.verify_every steps, at every checkpoint's step (a
 * checkpoint is only ever of a verified state) and right after each restore (after the first
 * step of a new job, whose program initialises its state once the restore returned), every rank
 * fingerprints its replicated parts -- XXH3 of each part's bytes, keyed by its name and
 * slice, the keys sorted -- and the ranks all-gather one 64-bit fingerprint each (a
 * collective of 16 bytes per rank on the host channel). Agreement: the state is copied into
 * the verified copy (host memory, every part: the rollback's source). Disagreement: the
 * group's ranks exchange their parts' fingerprints to name the tensors and the ranks that
 * differ, the group's first rank publishes it (the mismatch report, an event of the
 * leader's), and spec.fault.on_mismatch acts, the same way on every rank (each knows every
 * group's verdict from the first exchange):
 *
 *   rollback  every rank drops the copies newer than the verified one (its state, snapshot,
 *             replicas: they hold the disagreeing state) and begins the generation again:
 *             the program restores its state, from the verified copy, and training goes on
 *             from its step;
 *   warn      said, training goes on (the state is not verified: the copy stays older);
 *   fail      the job fails, naming the tensors, the step and the ranks.
 *
 * A disagreement with nothing to roll back to (the first check of a generation, right after
 * its restore), or one that comes back at the first check after a rollback, is not a
 * transient fault: the program's own code makes the replicas differ. The job then fails
 * (unless warn), saying so by name with the way out: keep such a tensor on one rank's values
 * (broadcast it each step), or declare it per rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/log.h"
#include "worker/internal.h"

/* One replicated part's fingerprint: its key (name, type, slice) and its bytes' hash. */
typedef struct fp_pair {
  uint64_t key, val;
  size_t part; /* its index in the declaration (this rank's) */
} fp_pair;

/* What one rank sends in the first exchange. */
typedef struct fp_head {
  uint64_t combined; /* of its pairs, in key order */
  int64_t n;         /* its replicated parts */
} fp_head;

static int cmp_pair(const void *a, const void *b) {
  const fp_pair *x = a, *y = b;
  return x->key < y->key ? -1 : x->key > y->key;
}

static uint64_t part_key(const reshard_piece *p) {
  struct {
    char name[RESHARD_NAME_MAX];
    int64_t dtype, ndim, begin, end;
    int64_t offset[NEWT_SLICE_MAX_DIMS], box[NEWT_SLICE_MAX_DIMS];
  } k;
  memset(&k, 0, sizeof k);
  memcpy(k.name, p->name, sizeof k.name);
  k.dtype = p->dtype, k.ndim = p->ndim, k.begin = p->slice.begin, k.end = p->slice.end;
  for (int d = 0; d < p->slice.ndim && d < NEWT_SLICE_MAX_DIMS; d++) k.offset[d] = p->slice.offset[d], k.box[d] = p->slice.shape[d];
  return XXH3_64bits(&k, sizeof k);
}

/* Whether a check is due after this step (at_restore: right after the restore). All ranks
 * decide alike: the step and the plan are the same on every rank. */
static int due(const worker *w, int at_restore) {
  if (w->spec.verify_every <= 0 || w->plan.dp < 2 || !w->train) return 0;
  if (at_restore || w->verify_next) return 1;
  int ckpt = w->saver && w->spec.ckpt_every > 0 && w->live_step % w->spec.ckpt_every == 0;
  return ckpt || w->live_step % w->spec.verify_every == 0;
}

/* The host's view of every declared part: host memory as it is, device memory staged (one
 * download each, one wait) into *stage. view[i] points at part i's bytes. */
static newt_result_t host_view(worker *w, const char **view, void **stage) {
  *stage = NULL;
  size_t total = 0;
  for (size_t i = 0; i < w->decl.n; i++)
    if (worker_part_on_device(w, &w->decl.parts[i])) total += reshard_piece_bytes(&w->decl.parts[i].p);
  char *h = NULL;
  if (total) NEWT_CHECK(worker_stage_get(w, total, (void **)&h));
  size_t off = 0;
  for (size_t i = 0; i < w->decl.n; i++) {
    const worker_part *p = &w->decl.parts[i];
    if (!worker_part_on_device(w, p)) {
      view[i] = p->p.data;
      continue;
    }
    size_t b = reshard_piece_bytes(&p->p);
    worker_mem_copy(&w->o.memory, h + off, p->p.data, b, 1);
    view[i] = h + off;
    off += b;
  }
  newt_result_t r = total ? worker_mem_sync(&w->o.memory) : NEWT_OK;
  if (r != NEWT_OK) worker_stage_release(w, h);
  else *stage = h;
  return r;
}

/* The verified copy: every part's bytes (from view), of live_step. */
static newt_result_t keep_verified(worker *w, const char *const *view) {
  worker_copy *v = &w->vsnap;
  int same = v->pieces && v->n == w->decl.n;
  for (size_t i = 0; same && i < v->n; i++)
    same = reshard_piece_bytes(&v->pieces[i]) == reshard_piece_bytes(&w->decl.parts[i].p) &&
           strcmp(v->pieces[i].name, w->decl.parts[i].p.name) == 0;
  if (!same) {
    reshard_piece *src = malloc((w->decl.n ? w->decl.n : 1) * sizeof *src);
    NEWT_CHECK_ALLOC(src);
    for (size_t i = 0; i < w->decl.n; i++) src[i] = w->decl.parts[i].p;
    newt_result_t r = worker_copy_layout(w, v, 0, src, w->decl.n);
    free(src);
    NEWT_CHECK(r);
  }
  for (size_t i = 0; i < v->n; i++) {
    memcpy(v->pieces[i].data, view[i], reshard_piece_bytes(&v->pieces[i]));
    v->pieces[i].step = w->live_step;
  }
  v->step = w->verified_step = w->live_step;
  return NEWT_OK;
}

/* Back to the verified copy, on every rank: the copies newer than it hold the disagreeing
 * state and are dropped, and the next newt_step_begin starts the generation again
 * (NEXT_GENERATION, the same layout and groups): the program declares its state and restores
 * it -- from the verified copy, the newest step that remains -- and takes its step from the
 * restore, as after any recovery (a program keeps scalars of its own, an optimizer's step
 * count, from it). */
static void roll_back(worker *w) {
  int64_t back = w->verified_step;
  w->rollback_to = back;
  if (w->snap.step > back) w->snap.step = -1;
  for (int j = 0; j < SPEC_REPLICAS_MAX; j++) {
    if (w->rep[j].step > back) w->rep[j].step = -1;
    if (w->rep[j].spare_step > back) w->rep[j].spare_step = -1;
  }
}

/* Ranks as "1 (w1), 3 (w3)" into buf. */
static void rank_list(const worker *w, const int *ranks, int n, char *buf, size_t cap) {
  size_t l = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && l < cap; i++) {
    int r = ranks[i];
    const char *id = r >= 0 && r < w->plan.nranks ? w->plan.ranks[r].worker : "?";
    l += (size_t)snprintf(buf + l, cap - l, "%s%d (%s)", i ? ", " : "", r, id);
  }
}

/* The second exchange, within this rank's data-parallel group: every rank's pairs, to name
 * the tensors whose replicas differ and the ranks that differ from the majority. Into why. */
static newt_result_t describe(worker *w, const fp_pair *mine, int64_t n, char *why, size_t cap) {
  comm_t *g = comm_host_channel(w->dp);
  int size = comm_size(g);
  int64_t *counts = malloc((size_t)size * sizeof *counts), maxn = 0;
  NEWT_CHECK_ALLOC(counts);
  newt_result_t r = comm_allgather(g, &n, counts, 1, NEWT_I64);
  int same_n = 1;
  for (int q = 0; r == NEWT_OK && q < size; q++) {
    if (counts[q] > maxn) maxn = counts[q];
    same_n &= counts[q] == n;
  }
  fp_pair *all = NULL, *pad = NULL;
  if (r == NEWT_OK) {
    all = calloc((size_t)size * (size_t)(maxn ? maxn : 1), sizeof *all);
    pad = calloc((size_t)(maxn ? maxn : 1), sizeof *pad);
    if (!all || !pad) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory comparing replicas");
  }
  if (r == NEWT_OK) {
    memcpy(pad, mine, (size_t)n * sizeof *pad);
    r = comm_allgather(g, pad, all, (size_t)maxn * sizeof *pad, NEWT_U8);
  }
  /* the group's ranks in the plan: rank = (pp * dp + d) * tp + t */
  int t = w->tp_rank, pp = w->pp_rank, dp = w->plan.dp, tp = w->plan.tp;
  char names[200] = "", differ[160] = "";
  int nbad = 0, *odd = calloc((size_t)size, sizeof *odd), nodd = 0, majority = 1;
  if (r == NEWT_OK && !odd) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory comparing replicas");
  for (int q = 1; r == NEWT_OK && same_n && q < size; q++) /* the same parts, in key order, on every rank */
    for (int64_t k = 0; k < n && same_n; k++) same_n = all[(size_t)q * (size_t)maxn + (size_t)k].key == all[(size_t)k].key;
  if (r == NEWT_OK && !same_n) {
    snprintf(why, cap, "the data-parallel ranks of tp %d, pp %d declare different replicated parts (%lld here)", t, pp,
             (long long)n);
    goto exit;
  }
  for (int64_t k = 0; r == NEWT_OK && k < n; k++) {
    int agree = 1;
    for (int q = 1; q < size && agree; q++) agree = all[(size_t)q * (size_t)maxn + (size_t)k].val == all[(size_t)k].val;
    if (agree) continue;
    if (nbad < 3) {
      size_t l = strlen(names);
      snprintf(names + l, sizeof names - l, "%s%s", nbad ? ", " : "", w->decl.parts[mine[k].part].p.name);
    }
    nbad++;
    /* the majority's value: the ranks that differ from it (none has more than half: all of them) */
    int best = 0, best_n = 0;
    for (int q = 0; q < size; q++) {
      int c = 0;
      for (int o = 0; o < size; o++) c += all[(size_t)o * (size_t)maxn + (size_t)k].val == all[(size_t)q * (size_t)maxn + (size_t)k].val;
      if (c > best_n) best = q, best_n = c;
    }
    if (best_n * 2 <= size) majority = 0;
    for (int q = 0; q < size; q++)
      if (best_n * 2 <= size || all[(size_t)q * (size_t)maxn + (size_t)k].val != all[(size_t)best * (size_t)maxn + (size_t)k].val)
        odd[q] = 1;
  }
  int ranks[64];
  for (int q = 0; q < size; q++)
    if (odd[q] && nodd < 64) ranks[nodd++] = (pp * dp + q) * tp + t;
  rank_list(w, ranks, nodd, differ, sizeof differ);
  if (r == NEWT_OK && majority)
    snprintf(why, cap, "%s%s (%d tensor%s) differ%s on rank%s %s (the other %d agree)", names, nbad > 3 ? ", ..." : "",
             nbad, nbad == 1 ? "" : "s", nbad == 1 ? "s" : "", nodd == 1 ? "" : "s", differ, size - nodd);
  else if (r == NEWT_OK)
    snprintf(why, cap, "%s%s (%d tensor%s) differ%s among ranks %s, no majority agreeing", names,
             nbad > 3 ? ", ..." : "", nbad, nbad == 1 ? "" : "s", nbad == 1 ? "s" : "", differ);
exit:
  free(counts), free(all), free(pad), free(odd);
  return r;
}

newt_result_t worker_verify(worker *w, int at_restore, int *rolled_back) {
  *rolled_back = 0;
  if (!due(w, at_restore)) return NEWT_OK;
  if (at_restore && strcmp(w->restore_src, "init") == 0) {
    /* nothing was restored: the program initialises its state after the restore returns,
       so the first check comes after the first step */
    w->verify_next = 1;
    return NEWT_OK;
  }
  w->verify_next = 0;
  size_t n = w->decl.n;
  const char **view = calloc(n ? n : 1, sizeof *view);
  fp_pair *pairs = calloc(n ? n : 1, sizeof *pairs);
  int size = comm_size(w->train);
  fp_head mine = {0}, *heads = calloc((size_t)size, sizeof *heads);
  void *stage = NULL;
  newt_result_t r = view && pairs && heads ? host_view(w, view, &stage) : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  /* 1. this rank's fingerprint, every rank's */
  int64_t np = 0;
  for (size_t i = 0; r == NEWT_OK && i < n; i++) {
    const worker_part *p = &w->decl.parts[i];
    if (!p->replicated) continue;
    pairs[np++] = (fp_pair){.key = part_key(&p->p), .val = XXH3_64bits(view[i], reshard_piece_bytes(&p->p)), .part = i};
  }
  qsort(pairs, (size_t)np, sizeof *pairs, cmp_pair);
  mine.n = np;
  for (int64_t k = 0; k < np; k++) {
    uint64_t kv[3] = {mine.combined, pairs[k].key, pairs[k].val};
    mine.combined = XXH3_64bits(kv, sizeof kv);
  }
  if (r == NEWT_OK) r = comm_allgather(comm_host_channel(w->train), &mine, heads, sizeof mine, NEWT_U8);
  /* 2. the verdict of every data-parallel group: ranks of one (tp, pp) must agree */
  int any = 0, here = 0;
  for (int q = 0; r == NEWT_OK && q < size && q < w->plan.nranks; q++) {
    const plan_rank *a = &w->plan.ranks[q];
    int first = (a->pp * w->plan.dp) * w->plan.tp + a->tp; /* its group's data-parallel rank 0 */
    if (first < 0 || first >= size) continue;
    int differs = heads[q].combined != heads[first].combined || heads[q].n != heads[first].n;
    any |= differs;
    here |= differs && a->tp == w->tp_rank && a->pp == w->pp_rank;
  }
  if (r == NEWT_OK && !any) {
    r = keep_verified(w, view);
    if (!at_restore) w->mismatch_rolled = 0; /* the restore of a rollback agrees by construction */
  }
  char what[400] = "";
  if (r == NEWT_OK && any && here) r = describe(w, pairs, np, what, sizeof what);
  worker_stage_release(w, stage);
  free(view), free(pairs), free(heads);
  if (r != NEWT_OK || !any) return r;

  /* 3. a disagreement: what it is, what to do (every rank alike) */
  int64_t step = w->live_step, back = w->verified_step;
  int mode = (int)w->spec.on_mismatch;
  int drift = w->mismatch_rolled || at_restore || back < 0;
  char why[JOB_TEXT_MAX];
  if (!here)
    snprintf(what, sizeof what, "the replicas of another data-parallel group (not this rank's: tp %d, pp %d) differ",
             w->tp_rank, w->pp_rank);
  const char *way_out = "where the program changes such a tensor on each rank itself (BatchNorm's running "
                        "statistics), keep it on one rank's values (broadcast it every step) or declare it per rank";
  w->mismatches++;
  if (mode == SPEC_MISMATCH_WARN) {
    snprintf(why, sizeof why, "replicas disagree at step %lld: %s; training goes on (spec.fault.on_mismatch warn; %s)",
             (long long)step, what, way_out);
    if (here && (w->mismatches == 1 || w->mismatches % 100 == 0)) NEWT_WARN(WORKER, "%s: %s", w->id, why);
    if (here && w->dp_rank == 0 && (w->mismatches == 1 || w->mismatches % 100 == 0))
      worker_publish_mismatch(w, step, step, "warn", why);
    return NEWT_OK;
  }
  if (mode == SPEC_MISMATCH_ROLLBACK && !drift) {
    snprintf(why, sizeof why, "replicas disagree at step %lld: %s; rolled back to step %lld, the newest step they "
             "agreed at. Once is a fault (a flipped bit); if it comes back, the program's own code makes them differ: %s",
             (long long)step, what, (long long)back, way_out);
    if (here) NEWT_WARN(WORKER, "%s: %s", w->id, why);
    else NEWT_INFO(WORKER, "%s: %s: rolled back to step %lld with every rank", w->id, what, (long long)back);
    if (here && w->dp_rank == 0) worker_publish_mismatch(w, step, back, "rollback", why);
    roll_back(w);
    w->mismatch_rolled = 1;
    *rolled_back = 1;
    return NEWT_OK;
  }
  if (mode == SPEC_MISMATCH_FAIL)
    snprintf(why, sizeof why, "replicas disagree at step %lld: %s (spec.fault.on_mismatch fail; %s)", (long long)step,
             what, way_out);
  else if (at_restore || back < 0)
    snprintf(why, sizeof why, "replicas disagree at step %lld, %s, with no verified step to go back to: %s. The "
             "program's own code makes them differ (or it initialises them differently on each rank)? %s",
             (long long)step, at_restore ? "right after the restore" : "the first check of the job", what, way_out);
  else
    snprintf(why, sizeof why, "replicas disagree again at step %lld, the first check after the rollback to step %lld: "
             "%s. The program's own code makes them differ: %s", (long long)step, (long long)back, what, way_out);
  if (here) NEWT_ERROR(WORKER, "%s: the job fails: %s", w->id, why);
  /* every rank of the group says it, the mismatch and the failure in one report: whichever
     the leader reads first, it says the mismatch before the failure (it posts one of the
     same words once) */
  if (here) worker_publish_mismatch(w, step, step, "fail", why);
  w->failed = 1;
  snprintf(w->failed_why, sizeof w->failed_why, "%s", why);
  return NEWT_ERR(NEWT_ERR_ABORTED, "the job failed: %s", why);
}

/* --- the chaos flip ------------------------------------------------------------------------ */

/* The bit to flip in an element of dtype dt: the lowest bit of a float's exponent (the value
 * doubles or halves: a fault that matters, and no infinity or NaN for any value a model
 * holds), the lowest bit of an integer. */
static int flip_bit(newt_dtype dt) {
  switch (dt) {
    case NEWT_F32: return 23;
    case NEWT_BF16: return 7;
    case NEWT_F16: return 10;
    default: return 0;
  }
}

void worker_chaos_flip(worker *w) {
  if (!w->chaos_flip[0] || w->chaos_flipped || !w->me) return;
  char spec[sizeof w->chaos_flip];
  snprintf(spec, sizeof spec, "%s", w->chaos_flip);
  for (char *save = NULL, *item = strtok_r(spec, ";", &save); item; item = strtok_r(NULL, ";", &save)) {
    long long rank = -1, step = -1;
    int used = 0;
    if (sscanf(item, "%lld:%lld%n", &rank, &step, &used) != 2 || rank != w->me->rank || step != w->live_step) continue;
    const char *name = item[used] == ':' ? item + used + 1 : NULL;
    const worker_part *p = NULL;
    for (size_t i = 0; i < w->decl.n && !p; i++) {
      const worker_part *q = &w->decl.parts[i];
      if (name ? strcmp(q->p.name, name) == 0 : q->replicated && newt_slice_numel(&q->p.slice) > 0) p = q;
    }
    if (!p) {
      NEWT_WARN(WORKER, "%s: chaos: flip at step %lld: no %s%s%s declared here", w->id, step,
                name ? "tensor \"" : "replicated part", name ? name : "", name ? "\"" : "");
      w->chaos_flipped = 1;
      return;
    }
    size_t es = newt_dtype_size(p->p.dtype), el = (size_t)newt_slice_numel(&p->p.slice) / 2;
    int bit = flip_bit(p->p.dtype);
    unsigned char b[8] = {0};
    char *at = (char *)p->p.data + el * es + (size_t)bit / 8;
    if (worker_part_on_device(w, p)) { /* down, flipped, up: the device's memory changed */
      worker_mem_copy(&w->o.memory, b, at, 1, 1);
      if (worker_mem_sync(&w->o.memory) != NEWT_OK) return;
      b[0] ^= (unsigned char)(1u << (bit % 8));
      worker_mem_copy(&w->o.memory, at, b, 1, 2);
      if (worker_mem_sync(&w->o.memory) != NEWT_OK) return;
    } else {
      *(unsigned char *)at ^= (unsigned char)(1u << (bit % 8));
    }
    w->chaos_flipped = 1;
    NEWT_WARN(WORKER, "%s: chaos: flipped bit %d of element %zu of %s (rank %d, after step %lld)", w->id, bit, el,
              p->p.name, w->me->rank, step);
    return;
  }
}
