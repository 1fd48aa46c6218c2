/* In-memory resharding (see reshard.h).
 *
 * 1. Every rank serialises what it holds and needs (fixed-size records, no pointers) and
 *    the records of all ranks are all-gathered, so every rank sees the same picture and
 *    computes the same decisions without further talk.
 * 2. The step: the newest step of some held piece for which, counting each distinct
 *    slice held at that step once (and none that lies inside another), the overlap with
 *    every need of every rank adds up to exactly that need.
 * 3. The sources: each need takes each overlapping distinct slice from its own rank when
 *    it holds it, else from one of its holders, chosen by (rank + need) so the load
 *    spreads.
 * 4. The moves: ranks meet in pairs (a < b) in one global order; a sends then receives, b
 *    receives then sends. The earliest unfinished pair always has both ranks ready, so
 *    this cannot deadlock. A sender sends each of its pieces the receiver needs once,
 *    whole; the receiver copies the overlaps into its needs (newt_slice_copy). */
#include "worker/reshard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

typedef struct wire_piece {
  char name[RESHARD_NAME_MAX];
  int64_t step;
  int64_t dtype, flags;
  int64_t ndim;
  int64_t shape[NEWT_SLICE_MAX_DIMS];
  int64_t offset[NEWT_SLICE_MAX_DIMS];
  int64_t box[NEWT_SLICE_MAX_DIMS];
  int64_t begin, end;
} wire_piece;

typedef struct wire_head {
  int64_t nhave, nneed;
} wire_head;

typedef struct rank_view {
  int64_t nhave, nneed;
  const wire_piece *have, *need;
} rank_view;

/* A move of one held piece (src's have[h]) into one need (dst's need[k]). */
typedef struct unit {
  int src, dst;
  int64_t h, k;
} unit;

static void to_wire(const reshard_piece *p, wire_piece *w) {
  memset(w, 0, sizeof *w);
  snprintf(w->name, sizeof w->name, "%s", p->name);
  w->step = p->step;
  w->dtype = p->dtype;
  w->flags = p->flags & ~RESHARD_LOCAL_MASK;
  w->ndim = p->ndim;
  for (int i = 0; i < p->ndim; i++) {
    w->shape[i] = p->shape[i];
    w->offset[i] = p->slice.offset[i];
    w->box[i] = p->slice.shape[i];
  }
  w->begin = p->slice.begin;
  w->end = p->slice.end;
}

static void slice_of(const wire_piece *w, newt_slice *s) {
  memset(s, 0, sizeof *s);
  s->ndim = (int)w->ndim;
  for (int i = 0; i < s->ndim; i++) {
    s->offset[i] = w->offset[i];
    s->shape[i] = w->box[i];
  }
  s->begin = w->begin;
  s->end = w->end;
}

static int same_tensor(const wire_piece *a, const wire_piece *b) {
  if (strcmp(a->name, b->name) != 0 || a->ndim != b->ndim || a->dtype != b->dtype) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

static int same_slice(const wire_piece *a, const wire_piece *b) {
  if (!same_tensor(a, b) || a->begin != b->begin || a->end != b->end) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->offset[i] != b->offset[i] || a->box[i] != b->box[i]) return 0;
  return 1;
}

static int64_t overlap(const wire_piece *a, const wire_piece *b) {
  if (!same_tensor(a, b)) return 0;
  newt_slice sa, sb;
  slice_of(a, &sa);
  slice_of(b, &sb);
  return newt_slice_copy(a->shape, 4, &sa, NULL, &sb, NULL);
}

static int64_t numel(const wire_piece *w) { return w->end - w->begin; }
static size_t esize(const wire_piece *w) { return newt_dtype_size((newt_dtype)w->dtype); }

/* Checks the records of a rank: sane dimensions and slices inside their tensors. */
static newt_result_t check_piece(const wire_piece *w, int rank) {
  if (w->ndim < 1 || w->ndim > NEWT_SLICE_MAX_DIMS || memchr(w->name, '\0', sizeof w->name) == NULL ||
      w->dtype < 0 || w->dtype > NEWT_U8 || (w->flags & ~(int64_t)(RESHARD_OPTIONAL | RESHARD_DERIVED)))
    return NEWT_ERR(NEWT_ERR_CORRUPT, "reshard: rank %d sent a malformed piece record", rank);
  newt_tensor_desc t = {.name = w->name, .dtype = (newt_dtype)w->dtype, .ndim = (int)w->ndim};
  memcpy(t.shape, w->shape, sizeof t.shape);
  newt_slice s;
  slice_of(w, &s);
  return newt_slice_check(&s, &t, "reshard");
}

/* The distinct slices held at one step, sorted by tensor name, each with its holders. */
typedef struct distinct {
  const wire_piece *p;
  int nholders;
  const int *rank;    /* its holders, ascending */
  const int64_t *idx; /* their have index */
} distinct;

typedef struct held {
  distinct *d;
  size_t n;
  int *ranks;
  int64_t *idxs;
} held;

typedef struct entry {
  const wire_piece *p;
  int rank;
  int64_t idx;
} entry;

static int cmp_i64(int64_t a, int64_t b) { return a < b ? -1 : a > b; }

/* Identical slices sort next to each other, their holders by rank. */
static int cmp_entry(const void *a, const void *b) {
  const entry *x = a, *y = b;
  int c = strcmp(x->p->name, y->p->name);
  if (!c) c = cmp_i64(x->p->begin, y->p->begin);
  if (!c) c = cmp_i64(x->p->end, y->p->end);
  for (int i = 0; i < NEWT_SLICE_MAX_DIMS && !c; i++) c = cmp_i64(x->p->offset[i], y->p->offset[i]);
  for (int i = 0; i < NEWT_SLICE_MAX_DIMS && !c; i++) c = cmp_i64(x->p->box[i], y->p->box[i]);
  if (!c) c = cmp_i64(x->rank, y->rank);
  return c;
}

static void held_free(held *hs) {
  free(hs->d);
  free(hs->ranks);
  free(hs->idxs);
  memset(hs, 0, sizeof *hs);
}

static newt_result_t held_build(const rank_view *v, int n, int64_t step, held *hs) {
  memset(hs, 0, sizeof *hs);
  size_t m = 0;
  for (int r = 0; r < n; r++)
    for (int64_t h = 0; h < v[r].nhave; h++) m += v[r].have[h].step == step;
  entry *e = malloc((m ? m : 1) * sizeof *e);
  hs->d = calloc(m ? m : 1, sizeof *hs->d);
  hs->ranks = malloc((m ? m : 1) * sizeof *hs->ranks);
  hs->idxs = malloc((m ? m : 1) * sizeof *hs->idxs);
  if (!e || !hs->d || !hs->ranks || !hs->idxs) {
    free(e);
    held_free(hs);
    return NEWT_ERR(NEWT_ERR_NOMEM, "reshard: out of memory");
  }
  size_t k = 0;
  for (int r = 0; r < n; r++)
    for (int64_t h = 0; h < v[r].nhave; h++)
      if (v[r].have[h].step == step) e[k++] = (entry){.p = &v[r].have[h], .rank = r, .idx = h};
  qsort(e, m, sizeof *e, cmp_entry);
  for (size_t i = 0; i < m; i++) {
    hs->ranks[i] = e[i].rank;
    hs->idxs[i] = e[i].idx;
  }
  for (size_t i = 0; i < m;) {
    size_t j = i + 1;
    while (j < m && same_slice(e[j].p, e[i].p)) j++;
    hs->d[hs->n++] = (distinct){.p = e[i].p, .nholders = (int)(j - i), .rank = &hs->ranks[i], .idx = &hs->idxs[i]};
    i = j;
  }
  free(e);
  /* a slice inside another one held at the same step adds nothing (a ZeRO chunk of a box
     that another rank holds whole): drop it, so what remains of a tensor is disjoint */
  size_t out = 0;
  for (size_t i = 0; i < hs->n; i++) {
    int inside = 0;
    for (size_t k = 0; k < hs->n && !inside; k++) {
      if (k == i || !same_tensor(hs->d[k].p, hs->d[i].p) || numel(hs->d[k].p) < numel(hs->d[i].p)) continue;
      if (numel(hs->d[k].p) == numel(hs->d[i].p) && k > i) continue; /* equal size: keep the first */
      inside = overlap(hs->d[i].p, hs->d[k].p) == numel(hs->d[i].p);
    }
    if (!inside) hs->d[out++] = hs->d[i];
  }
  hs->n = out;
  return NEWT_OK;
}

/* The distinct slices of the need's tensor: [*lo, *hi) of hs->d. */
static void tensor_range(const held *hs, const wire_piece *need, size_t *lo, size_t *hi) {
  size_t a = 0, b = hs->n;
  while (a < b) {
    size_t mid = (a + b) / 2;
    if (strcmp(hs->d[mid].p->name, need->name) < 0) a = mid + 1;
    else b = mid;
  }
  *lo = a;
  while (a < hs->n && strcmp(hs->d[a].p->name, need->name) == 0) a++;
  *hi = a;
}

/* Elements of need the distinct slices of hs hold. */
static int64_t held_sum(const held *hs, const wire_piece *need) {
  size_t lo, hi;
  tensor_range(hs, need, &lo, &hi);
  int64_t sum = 0;
  for (size_t i = lo; i < hi; i++) sum += overlap(need, hs->d[i].p);
  return sum;
}

/* Whether every need of every rank is covered exactly by the distinct slices held at
 * `step` (the first need that is not is logged). */
static int covered(const rank_view *v, int n, const held *hs, int64_t step) {
  for (int j = 0; j < n; j++)
    for (int64_t k = 0; k < v[j].nneed; k++) {
      const wire_piece *need = &v[j].need[k];
      if (need->flags & RESHARD_OPTIONAL) continue;
      if (held_sum(hs, need) != numel(need)) {
        NEWT_INFO(WORKER, "reshard: step %lld does not cover rank %d's %s [%lld, %lld): %lld of %lld elements held",
                  (long long)step, j, need->name, (long long)need->begin, (long long)need->end,
                  (long long)held_sum(hs, need), (long long)numel(need));
        return 0;
      }
    }
  return 1;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* The tensors whose needs the pieces of hs (held at one step) do not cover, into res->lost
 * (the first few by name) and res->nlost. */
static void describe_lost(const rank_view *v, int n, const held *hs, reshard_result *res) {
  size_t m = 0;
  for (int j = 0; j < n; j++) m += (size_t)v[j].nneed;
  const char **names = malloc((m ? m : 1) * sizeof *names);
  if (!names) return;
  size_t k = 0;
  for (int j = 0; j < n; j++)
    for (int64_t i = 0; i < v[j].nneed; i++) {
      const wire_piece *need = &v[j].need[i];
      if (!(need->flags & RESHARD_OPTIONAL) && held_sum(hs, need) != numel(need)) names[k++] = need->name;
    }
  qsort(names, k, sizeof *names, cmp_name);
  size_t l = 0;
  int shown = 0;
  for (size_t i = 0; i < k; i++) {
    if (i && strcmp(names[i], names[i - 1]) == 0) continue; /* a tensor counts once, however many parts */
    res->nlost++;
    if (shown < 4 && l < sizeof res->lost)
      l += (size_t)snprintf(res->lost + l, sizeof res->lost - l, "%s%.*s", shown ? ", " : "", RESHARD_NAME_MAX,
                            names[i]), shown++;
  }
  if (res->nlost > shown && l < sizeof res->lost) snprintf(res->lost + l, sizeof res->lost - l, ", ...");
  free(names);
}

/* The moves: for each need of each rank, each overlapping distinct slice from one of its
 * holders: the receiver itself when it holds it, else one chosen by (rank + need). */
static newt_result_t plan_units(const rank_view *v, int n, const held *hs, unit **out, size_t *nout) {
  size_t cap = 64, nu = 0;
  unit *u = malloc(cap * sizeof *u);
  NEWT_CHECK_ALLOC(u);
  for (int j = 0; j < n; j++)
    for (int64_t k = 0; k < v[j].nneed; k++) {
      size_t lo, hi;
      if ((v[j].need[k].flags & RESHARD_OPTIONAL) && held_sum(hs, &v[j].need[k]) != numel(&v[j].need[k]))
        continue; /* not held at this step: left as it is */
      tensor_range(hs, &v[j].need[k], &lo, &hi);
      for (size_t i = lo; i < hi; i++) {
        const distinct *d = &hs->d[i];
        if (!overlap(&v[j].need[k], d->p)) continue;
        int pick = (int)(((int64_t)j + k) % d->nholders);
        for (int q = 0; q < d->nholders; q++)
          if (d->rank[q] == j) pick = q;
        if (nu == cap) {
          unit *m = realloc(u, 2 * cap * sizeof *u);
          if (!m) {
            free(u);
            return NEWT_ERR(NEWT_ERR_NOMEM, "reshard: out of memory");
          }
          u = m;
          cap *= 2;
        }
        u[nu++] = (unit){.src = d->rank[pick], .dst = j, .h = d->idx[pick], .k = k};
      }
    }
  *out = u;
  *nout = nu;
  return NEWT_OK;
}

/* The distinct held pieces src sends dst, in have order (marks[h] = 1). */
static int64_t pair_payload(const unit *u, size_t nu, int src, int dst, const rank_view *v, char *marks) {
  memset(marks, 0, (size_t)v[src].nhave);
  for (size_t i = 0; i < nu; i++)
    if (u[i].src == src && u[i].dst == dst) marks[u[i].h] = 1;
  int64_t total = 0;
  for (int64_t h = 0; h < v[src].nhave; h++)
    if (marks[h]) total += numel(&v[src].have[h]) * (int64_t)esize(&v[src].have[h]);
  return total;
}

static newt_result_t send_to(comm_t *c, int me, int dst, const unit *u, size_t nu, const rank_view *v,
                             const reshard_piece *have, char *marks) {
  if (!pair_payload(u, nu, me, dst, v, marks)) return NEWT_OK;
  for (int64_t h = 0; h < v[me].nhave; h++)
    if (marks[h])
      NEWT_CHECK(comm_send(c, have[h].data, (size_t)numel(&v[me].have[h]) * esize(&v[me].have[h]), NEWT_U8, dst));
  return NEWT_OK;
}

static newt_result_t recv_from(comm_t *c, int me, int src, const unit *u, size_t nu, const rank_view *v,
                               const reshard_piece *need, char *marks, char **tmp, size_t *tmpcap,
                               reshard_result *res) {
  int64_t total = pair_payload(u, nu, src, me, v, marks);
  if (!total) return NEWT_OK;
  if ((size_t)total > *tmpcap) {
    char *t = realloc(*tmp, (size_t)total);
    NEWT_CHECK_ALLOC(t);
    *tmp = t;
    *tmpcap = (size_t)total;
  }
  size_t off = 0;
  for (int64_t h = 0; h < v[src].nhave; h++) {
    if (!marks[h]) continue;
    const wire_piece *hp = &v[src].have[h];
    size_t bytes = (size_t)numel(hp) * esize(hp);
    NEWT_CHECK(comm_recv(c, *tmp + off, bytes, NEWT_U8, src));
    newt_slice hs;
    slice_of(hp, &hs);
    for (size_t i = 0; i < nu; i++) {
      if (u[i].src != src || u[i].dst != me || u[i].h != h) continue;
      const reshard_piece *np = &need[u[i].k];
      res->received += newt_slice_copy(np->shape, esize(hp), &np->slice, np->data, &hs, *tmp + off);
    }
    off += bytes;
  }
  return NEWT_OK;
}

/* --- roles: what every rank's needs say about each part --------------------------------------- */

static int64_t tensor_numel(const wire_piece *w) {
  int64_t t = 1;
  for (int i = 0; i < w->ndim; i++) t *= w->shape[i];
  return t;
}

/* Whether part i of e[a, b) lies inside another part of it (for which keep(k) holds); of
 * two equal parts the first counts, as in held_build. */
static int inside_other(const entry *e, size_t a, size_t b, size_t i, int (*keep)(const entry *)) {
  for (size_t k = a; k < b; k++) {
    if (k == i || !keep(&e[k]) || numel(e[k].p) < numel(e[i].p) || same_slice(e[k].p, e[i].p)) continue;
    if (overlap(e[i].p, e[k].p) == numel(e[i].p)) return 1;
  }
  return 0;
}
static int any_part(const entry *x) { (void)x; return 1; }
static int plain_part(const entry *x) { return !(x->p->flags & RESHARD_DERIVED); }

/* One tensor's parts, e[a, b) (sorted: identical parts adjacent, by rank) of n ranks: the
 * check that they tile it, then this rank's roles in it. */
static newt_result_t tensor_roles(const entry *e, size_t a, size_t b, int n, int me, reshard_roles *ro) {
  const wire_piece *t = e[a].p;
  int64_t total = tensor_numel(t), sum = 0;
  for (size_t i = a + 1; ro->check && i < b; i++) {
    const wire_piece *q = e[i].p;
    int same = q->ndim == t->ndim && q->dtype == t->dtype;
    for (int d = 0; same && d < t->ndim; d++) same = q->shape[d] == t->shape[d];
    if (!same)
      return NEWT_ERR(NEWT_ERR_INVALID, "tensor \"%s\": rank %d declares it %s of %d dimensions, rank %d %s of %d "
                      "(one type and shape in the whole job)", t->name, e[a].rank, newt_dtype_name((newt_dtype)t->dtype),
                      (int)t->ndim, e[i].rank, newt_dtype_name((newt_dtype)q->dtype), (int)q->ndim);
  }
  for (size_t i = a; i < b; i++) {
    int first = i == a || !same_slice(e[i - 1].p, e[i].p); /* the lowest rank of equal parts */
    if (!first) continue;
    if (!inside_other(e, a, b, i, any_part)) {
      sum += numel(e[i].p);
      for (size_t k = i + 1; ro->check && k < b; k++) /* the outer parts must not overlap */
        if (!same_slice(e[k].p, e[i].p) && !inside_other(e, a, b, k, any_part) && overlap(e[i].p, e[k].p))
          return NEWT_ERR(NEWT_ERR_INVALID, "tensor \"%s\": the part of rank %d (elements [%lld, %lld) of its box) "
                          "and that of rank %d ([%lld, %lld)) overlap without being equal or one inside the other",
                          t->name, e[i].rank, (long long)e[i].p->begin, (long long)e[i].p->end, e[k].rank,
                          (long long)e[k].p->begin, (long long)e[k].p->end);
    }
    /* the copy to save: the first of equal plain parts, not inside another plain part */
    size_t j = i;
    while (j < b && same_slice(e[j].p, e[i].p) && !plain_part(&e[j])) j++;
    if (ro->primary && j < b && same_slice(e[j].p, e[i].p) && e[j].rank == me && !inside_other(e, a, b, j, plain_part))
      ro->primary[e[j].idx] = 1;
  }
  if (ro->check && sum != total)
    return NEWT_ERR(NEWT_ERR_INVALID, "tensor \"%s\" (%lld elements): the ranks' parts do not tile it: %lld elements are "
                    "declared by no rank", t->name, (long long)total, (long long)(total - sum));
  for (size_t i = a; ro->replicated && i < b; i++) { /* a part every rank of this rank's group holds alike */
    if (e[i].rank != me || (e[i].p->flags & RESHARD_OPTIONAL)) continue;
    int holders = 0, size = 0;
    for (size_t k = a; k < b; k++)
      holders += same_slice(e[k].p, e[i].p) && (!ro->group || ro->group[e[k].rank] == ro->group[me]);
    for (int r = 0; r < n; r++) size += !ro->group || ro->group[r] == ro->group[me];
    ro->replicated[e[i].idx] = size > 1 && holders == size;
  }
  for (size_t i = a; ro->unique && i < b; i++) { /* a part of this rank nobody else (of its group) holds */
    if (e[i].rank != me) continue;
    int alone = 1;
    for (size_t k = a; k < b && alone; k++)
      alone = e[k].rank == me || (ro->group && ro->group[e[k].rank] != ro->group[me]) ||
              overlap(e[i].p, e[k].p) != numel(e[i].p);
    ro->unique[e[i].idx] = alone;
  }
  return NEWT_OK;
}

/* Whether each of the n ranks holds the whole tensor of e[a, b) (sorted by rank): its own
 * parts, equal ones once and none inside another, add up to it. An optional tensor (a
 * rank's own bytes) does not count. */
static int tensor_whole(const entry *e, size_t a, size_t b, int n) {
  int64_t total = tensor_numel(e[a].p);
  int ranks = 0;
  for (size_t i = a; i < b; i++)
    if (e[i].p->flags & RESHARD_OPTIONAL) return 1;
  for (size_t r0 = a; r0 < b;) {
    size_t r1 = r0 + 1;
    while (r1 < b && e[r1].rank == e[r0].rank) r1++;
    int64_t seen = 0;
    for (size_t i = r0; i < r1; i++) {
      int skip = 0;
      for (size_t k = r0; k < r1 && !skip; k++) {
        if (k == i) continue;
        if (same_slice(e[k].p, e[i].p)) skip = k < i;
        else skip = numel(e[k].p) > numel(e[i].p) && overlap(e[i].p, e[k].p) == numel(e[i].p);
      }
      if (!skip) seen += numel(e[i].p);
    }
    if (seen != total) return 0;
    ranks++;
    r0 = r1;
  }
  return ranks == n;
}

/* Orders needs by tensor, then rank: the per-rank walk of tensor_roles' "whole". */
static int cmp_by_rank(const void *a, const void *b) {
  const entry *x = a, *y = b;
  int c = strcmp(x->p->name, y->p->name);
  return c ? c : x->rank != y->rank ? cmp_i64(x->rank, y->rank) : cmp_i64(x->idx, y->idx);
}

static newt_result_t work_out_roles(const rank_view *v, int n, int me, reshard_roles *ro) {
  size_t m = 0;
  for (int r = 0; r < n; r++) m += (size_t)v[r].nneed;
  for (int64_t k = 0; k < v[me].nneed; k++) {
    if (ro->primary) ro->primary[k] = 0;
    if (ro->unique) ro->unique[k] = 0;
    if (ro->filled) ro->filled[k] = 0;
  }
  ro->whole = 1;
  entry *e = malloc((m ? m : 1) * sizeof *e), *byrank = malloc((m ? m : 1) * sizeof *e);
  if (!e || !byrank) {
    free(e), free(byrank);
    return NEWT_ERR(NEWT_ERR_NOMEM, "reshard: out of memory");
  }
  size_t k = 0;
  for (int r = 0; r < n; r++)
    for (int64_t i = 0; i < v[r].nneed; i++) e[k++] = (entry){.p = &v[r].need[i], .rank = r, .idx = i};
  memcpy(byrank, e, m * sizeof *e);
  qsort(e, m, sizeof *e, cmp_entry);
  qsort(byrank, m, sizeof *e, cmp_by_rank);
  newt_result_t res = NEWT_OK;
  for (size_t a = 0; a < m && res == NEWT_OK;) {
    size_t b = a + 1;
    while (b < m && strcmp(e[b].p->name, e[a].p->name) == 0) b++;
    res = tensor_roles(e, a, b, n, me, ro);
    /* both orders put a tensor's parts at [a, b); "whole" walks them rank by rank */
    if (res == NEWT_OK && ro->whole && !tensor_whole(byrank, a, b, n)) ro->whole = 0;
    a = b;
  }
  free(e);
  free(byrank);
  return res;
}

newt_result_t reshard_exchange(comm_t *c, const reshard_piece *have, size_t nhave, const reshard_piece *need,
                               size_t nneed, reshard_roles *roles, reshard_result *res) {
  memset(res, 0, sizeof *res);
  res->step = -1;
  c = comm_host_channel(c); /* the pieces are host memory (staged where the device's is not) */
  int n = comm_size(c), me = comm_rank(c);
  newt_result_t r = NEWT_OK;
  size_t mylen = sizeof(wire_head) + (nhave + nneed) * sizeof(wire_piece);
  char *mine = calloc(1, mylen), *all = NULL, *marks = NULL;
  int64_t *lens = malloc((size_t)n * sizeof *lens);
  rank_view *v = calloc((size_t)n, sizeof *v);
  unit *u = NULL;
  size_t nu = 0, tmpcap = 0;
  char *tmp = NULL;
  if (!mine || !lens || !v) {
    r = NEWT_ERR(NEWT_ERR_NOMEM, "reshard: out of memory");
    goto exit;
  }
  wire_head *hd = (wire_head *)mine;
  hd->nhave = (int64_t)nhave;
  hd->nneed = (int64_t)nneed;
  wire_piece *wp = (wire_piece *)(hd + 1);
  for (size_t i = 0; i < nhave; i++) to_wire(&have[i], wp++);
  for (size_t i = 0; i < nneed; i++) to_wire(&need[i], wp++);

  /* 1. everyone's records */
  int64_t l = (int64_t)mylen, maxlen = 0;
  NEWT_CHECK_GOTO(comm_allgather(c, &l, lens, 1, NEWT_I64), r, exit);
  for (int i = 0; i < n; i++)
    if (lens[i] > maxlen) maxlen = lens[i];
  char *padded = calloc(1, (size_t)maxlen);
  all = malloc((size_t)maxlen * (size_t)n);
  if (!padded || !all) {
    free(padded);
    r = NEWT_ERR(NEWT_ERR_NOMEM, "reshard: out of memory for %d records of %lld bytes", n, (long long)maxlen);
    goto exit;
  }
  memcpy(padded, mine, mylen);
  r = comm_allgather(c, padded, all, (size_t)maxlen, NEWT_U8);
  free(padded);
  if (r != NEWT_OK) goto exit;
  int64_t maxhave = 0;
  for (int i = 0; i < n; i++) {
    const wire_head *h = (const wire_head *)(all + (size_t)i * (size_t)maxlen);
    if (lens[i] < (int64_t)sizeof *h || h->nhave < 0 || h->nneed < 0 ||
        lens[i] != (int64_t)(sizeof *h + (size_t)(h->nhave + h->nneed) * sizeof(wire_piece))) {
      r = NEWT_ERR(NEWT_ERR_CORRUPT, "reshard: rank %d sent %lld bytes of records that do not add up", i,
                   (long long)lens[i]);
      goto exit;
    }
    v[i].nhave = h->nhave;
    v[i].nneed = h->nneed;
    v[i].have = (const wire_piece *)(h + 1);
    v[i].need = v[i].have + h->nhave;
    for (int64_t k = 0; k < h->nhave + h->nneed; k++) NEWT_CHECK_GOTO(check_piece(&v[i].have[k], i), r, exit);
    if (v[i].nhave > maxhave) maxhave = v[i].nhave;
  }
  if (roles) NEWT_CHECK_GOTO(work_out_roles(v, n, me, roles), r, exit);

  /* 2. the newest step that covers every need */
  int64_t step = -1, below = INT64_MAX;
  held hs = {0};
  res->newest = -1;
  for (;;) {
    int64_t cand = -1;
    for (int i = 0; i < n; i++)
      for (int64_t h = 0; h < v[i].nhave; h++)
        if (v[i].have[h].step >= 0 && v[i].have[h].step < below && v[i].have[h].step > cand) cand = v[i].have[h].step;
    if (cand < 0) break;
    NEWT_CHECK_GOTO(held_build(v, n, cand, &hs), r, exit);
    if (covered(v, n, &hs, cand)) {
      step = cand;
      break;
    }
    if (res->newest < 0) { /* what the newest step lacks: said if none is whole */
      res->newest = cand;
      describe_lost(v, n, &hs, res);
    }
    held_free(&hs);
    below = cand;
  }
  if (res->newest < 0) res->newest = step;
  if (step < 0) {
    r = NEWT_ERR(NEWT_ERR_NOTFOUND, "reshard: what the %d ranks hold in memory covers no step whole", n);
    goto exit;
  }

  /* 3. the moves, 4. made */
  r = plan_units(v, n, &hs, &u, &nu);
  held_free(&hs);
  if (r != NEWT_OK) goto exit;
  marks = malloc((size_t)(maxhave ? maxhave : 1));
  if (!marks) {
    r = NEWT_ERR(NEWT_ERR_NOMEM, "reshard: out of memory");
    goto exit;
  }
  for (size_t i = 0; i < nu; i++) {
    if (u[i].src != me || u[i].dst != me) continue;
    const reshard_piece *hp = &have[u[i].h], *np = &need[u[i].k];
    if (hp->data == np->data && same_slice(&v[me].have[u[i].h], &v[me].need[u[i].k])) continue; /* in place */
    res->copied += newt_slice_copy(np->shape, esize(&v[me].have[u[i].h]), &np->slice, np->data, &hp->slice, hp->data);
  }
  for (int a = 0; a < n && r == NEWT_OK; a++)
    for (int b = a + 1; b < n && r == NEWT_OK; b++) {
      if (me == a) {
        r = send_to(c, me, b, u, nu, v, have, marks);
        if (r == NEWT_OK) r = recv_from(c, me, b, u, nu, v, need, marks, &tmp, &tmpcap, res);
      } else if (me == b) {
        r = recv_from(c, me, a, u, nu, v, need, marks, &tmp, &tmpcap, res);
        if (r == NEWT_OK) r = send_to(c, me, a, u, nu, v, have, marks);
      }
    }
  if (r == NEWT_OK) {
    res->step = step;
    res->source = res->received > 0;
    if (roles && roles->filled)
      for (size_t i = 0; i < nu; i++)
        if (u[i].dst == me) roles->filled[u[i].k] = 1;
  }
exit:
  free(mine);
  free(all);
  free(lens);
  free(v);
  free(u);
  free(marks);
  free(tmp);
  return r;
}

size_t reshard_wire_size(size_t n) { return n * sizeof(wire_piece); }

void reshard_pack(const reshard_piece *p, size_t n, void *buf) {
  wire_piece *w = buf;
  for (size_t i = 0; i < n; i++) to_wire(&p[i], &w[i]);
}

newt_result_t reshard_unpack(const void *buf, size_t len, reshard_piece *out, size_t n) {
  if (len != n * sizeof(wire_piece))
    return NEWT_ERR(NEWT_ERR_CORRUPT, "reshard: %zu bytes of records for %zu pieces", len, n);
  const wire_piece *w = buf;
  for (size_t i = 0; i < n; i++) {
    NEWT_CHECK(check_piece(&w[i], -1));
    reshard_piece *p = &out[i];
    memset(p, 0, sizeof *p);
    memcpy(p->name, w[i].name, sizeof p->name);
    p->step = w[i].step;
    p->dtype = (newt_dtype)w[i].dtype;
    p->flags = (unsigned)w[i].flags;
    p->ndim = (int)w[i].ndim;
    for (int d = 0; d < p->ndim; d++) p->shape[d] = w[i].shape[d];
    slice_of(&w[i], &p->slice);
  }
  return NEWT_OK;
}
