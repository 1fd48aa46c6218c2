/* Membership to plan, and the plan's JSON form (see plan.h).
 *
 * Placement: tensor-parallel groups of the previous plan that are still whole stay
 * together (they hold matching slices); the other members are grouped by host and each
 * host's run cut into groups of tp (a group never spans hosts). Whole groups come first,
 * in their old rank order, then the others (previous members before newcomers, by join
 * order); the first dp * pp groups fill the ranks in Megatron order, the rest are
 * spares. Pipeline slots are filled first with groups that held the same stage before, so
 * a survivor keeps its layers where it can; with tp = 1 and pp = 1 every surviving
 * worker keeps its relative order, so data-parallel indices move as little as possible.
 * Failure domains (a member's registered domain, else its host: what goes down as a unit)
 * decide where copies live: a free pipeline slot takes a group of the domain its stage has
 * fewest of, and each stage's data-parallel ring is ordered so that any
 * spec.fault.replicas + 1 consecutive ranks sit in distinct domains where the domains allow
 * (rank d keeps copies of the unique parts of ranks d-1 .. d-k: k domains lost at once
 * leave a copy of each). The host still decides the tensor-parallel groups. */
#include "job/plan.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/json.h"
#include "common/name.h"
#include "common/secret.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "job/codec.h"

int plan_choose_dp(const newt_spec *s, int64_t max_dp) {
  int64_t hi = max_dp < s->dp_max ? max_dp : s->dp_max;
  if (!s->even_batches) { /* every replica trains: the ranks split the samples (a sample each at least) */
    if (hi > s->global_batch) hi = s->global_batch;
    return hi >= s->dp_min ? (int)hi : 0;
  }
  for (int64_t dp = hi; dp >= s->dp_min; dp--)
    if (s->global_batch % (dp * s->micro_batch) == 0) return (int)dp;
  return 0;
}

/* a / b rounded up, for a >= 0, b >= 1, without overflow (a plan read from etcd may carry any
 * int64) */
static int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

int64_t plan_accum(int64_t global_batch, int64_t micro_batch, int64_t dp) {
  return ceil_div(ceil_div(global_batch, dp), micro_batch); /* the first ranks' samples, in micro-batches */
}

void plan_batch_slice(int64_t global_batch, int64_t dp, int64_t dp_rank, int64_t *first, int64_t *count) {
  int64_t q = global_batch / dp, rem = global_batch % dp;
  *first = dp_rank * q + (dp_rank < rem ? dp_rank : rem);
  *count = q + (dp_rank < rem);
}

void plan_slice(const newt_plan *p, int64_t dp_rank, int64_t *first, int64_t *count) {
  if (!p->shares) {
    plan_batch_slice(p->global_batch, p->dp, dp_rank, first, count);
    return;
  }
  int64_t at = 0;
  for (int64_t d = 0; d < dp_rank; d++) at += p->shares[d];
  *first = at;
  *count = p->shares[dp_rank];
}

int64_t plan_most_micro(const newt_plan *p) {
  if (!p->shares) return plan_accum(p->global_batch, p->micro_batch, p->dp);
  int64_t most = 0;
  for (int d = 0; d < p->dp; d++)
    if (ceil_div(p->shares[d], p->micro_batch) > most) most = ceil_div(p->shares[d], p->micro_batch);
  return most;
}

newt_result_t plan_shares_by_speed(int64_t global_batch, int dp, const double *speed, int64_t *out) {
  if (dp < 1 || dp > global_batch)
    return NEWT_ERR(NEWT_ERR_INVALID, "%d data-parallel ranks cannot share a global batch of %lld samples", dp,
                    (long long)global_batch);
  double total = 0;
  for (int d = 0; d < dp; d++) {
    if (!(speed[d] > 0) || !isfinite(speed[d]))
      return NEWT_ERR(NEWT_ERR_INVALID, "data-parallel rank %d: speed %g is not positive", d, speed[d]);
    total += speed[d];
  }
  /* a sample each first, then the rest in proportion to the speeds: whole parts, then one more
     to the largest remainders (the lower rank on a tie) */
  int64_t rest = global_batch - dp, given = 0;
  double *rem = malloc((size_t)dp * sizeof *rem);
  NEWT_CHECK_ALLOC(rem);
  for (int d = 0; d < dp; d++) {
    double want = (double)global_batch * speed[d] / total - 1.0, whole = want > 0 ? floor(want) : 0;
    if (whole > (double)(rest - given)) whole = (double)(rest - given);
    out[d] = 1 + (int64_t)whole;
    given += (int64_t)whole;
    rem[d] = want - whole;
  }
  for (; given < rest; given++) {
    int best = 0;
    for (int d = 1; d < dp; d++)
      if (rem[d] > rem[best]) best = d;
    out[best]++;
    rem[best] -= 1.0;
  }
  free(rem);
  return NEWT_OK;
}

int64_t *plan_shares_for(int64_t global_batch, int dp, const double *us, double margin, newt_result_t *err) {
  *err = NEWT_OK;
  if (dp < 2 || dp > global_batch) return NULL;
  double *v = malloc((size_t)dp * sizeof *v), lo = 0, hi = 0;
  int64_t *shares = NULL;
  int known = 0;
  if (!v) {
    *err = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory sharing the global batch");
    return NULL;
  }
  for (int d = 0; d < dp; d++)
    if (us[d] > 0) v[known++] = us[d];
  double median = known ? newt_percentile(v, (size_t)known, 0.5) : 0;
  for (int d = 0; d < dp; d++) {
    double t = us[d] > 0 ? us[d] : median;
    v[d] = t > 0 ? 1.0 / t : 0;
    if (d == 0 || t < lo) lo = t;
    if (d == 0 || t > hi) hi = t;
  }
  if (known >= 2 && lo > 0 && hi > (1.0 + margin) * lo) {
    shares = malloc((size_t)dp * sizeof *shares);
    if (!shares) *err = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory sharing the global batch");
    else if ((*err = plan_shares_by_speed(global_batch, dp, v, shares)) != NEWT_OK) free(shares), shares = NULL;
  }
  free(v);
  /* shares that come out even are no shares */
  int even = shares != NULL;
  for (int d = 0; even && d < dp; d++) {
    int64_t first, count;
    plan_batch_slice(global_batch, dp, d, &first, &count);
    even = shares[d] == count;
  }
  if (even) free(shares), shares = NULL;
  return shares;
}

/* Appends "; " (when why is not empty) and the formatted text, truncating at cap. */
static void why_add(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void why_add(char *why, size_t cap, const char *fmt, ...) {
  size_t len = strlen(why);
  if (len && len + 2 < cap) memcpy(why + len, "; ", 3), len += 2;
  if (len + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why + len, cap - len, fmt, ap);
  va_end(ap);
}

/* Why n members in ngroups tensor-parallel groups train as dp x pp of them: into why. */
static void spare_reason(const newt_spec *s, int n, int ngroups, int dp, char *why, size_t cap) {
  int tp = (int)s->tp, pp = (int)s->pp, loose = n - ngroups * tp, unpiped = ngroups % pp;
  int64_t max_dp = ngroups / pp, hi = max_dp < s->dp_max ? max_dp : s->dp_max;
  why[0] = '\0';
  if (loose > 0)
    why_add(why, cap, "%d worker%s make%s no whole tensor-parallel group (tp %d, on one host)", loose,
            loose == 1 ? "" : "s", loose == 1 ? "s" : "", tp);
  if (unpiped > 0)
    why_add(why, cap, "%d tensor-parallel group%s make%s no whole pipeline (pp %d)", unpiped, unpiped == 1 ? "" : "s",
            unpiped == 1 ? "s" : "", pp);
  if (max_dp > s->dp_max) why_add(why, cap, "spec.parallel.dp_max caps data parallelism at %lld", (long long)s->dp_max);
  if (dp < hi && !s->even_batches)
    why_add(why, cap, "the global batch of %lld samples gives a sample to at most %d data-parallel rank%s, not %lld",
            (long long)s->global_batch, dp, dp == 1 ? "" : "s", (long long)hi);
  else if (dp < hi)
    why_add(why, cap,
            "the global batch of %lld samples is %lld micro-batches of %lld, which split evenly over %d data-parallel "
            "rank%s, not %lld (spec.parallel.even_batches)",
            (long long)s->global_batch, (long long)(s->global_batch / s->micro_batch), (long long)s->micro_batch, dp,
            dp == 1 ? "" : "s", (long long)hi);
}

static int64_t member_key(const plan_member *m) {
  /* previous members first, by old rank; then newcomers by join revision */
  return m->prev_rank >= 0 ? m->prev_rank : ((int64_t)1 << 40) + m->join_rev;
}

static int cmp_host_then_key(const void *a, const void *b) {
  const plan_member *x = *(const plan_member *const *)a, *y = *(const plan_member *const *)b;
  int h = strcmp(x->host, y->host);
  if (h) return h;
  int64_t kx = member_key(x), ky = member_key(y);
  if (kx != ky) return kx < ky ? -1 : 1;
  return strcmp(x->id, y->id);
}

typedef struct group {
  const plan_member **m; /* tp members */
  int64_t key;
  int dom;               /* its failure domain's number (domain_number): equal numbers, equal domains */
} group;

static int cmp_group(const void *a, const void *b) {
  const group *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return strcmp(x->m[0]->id, y->m[0]->id);
}

/* A group's failure domain: its first member's (all of a group are on one host), else
 * that host. */
static const char *domain_of(const group *g) { return g->m[0]->domain[0] ? g->m[0]->domain : g->m[0]->host; }

static int same_domain(const group *groups, int a, int b) { return groups[a].dom == groups[b].dom; }

static int cmp_domain_of(const void *a, const void *b) {
  const group *x = *(const group *const *)a, *y = *(const group *const *)b;
  return strcmp(domain_of(x), domain_of(y));
}

/* Numbers the groups' failure domains 0..*ndomains-1 (by sorting their names: n log n, where
 * comparing names pairwise while placing would cost the square of the groups). */
static newt_result_t domain_number(group *groups, int ngroups, int *ndomains) {
  group **v = malloc((size_t)(ngroups ? ngroups : 1) * sizeof *v);
  NEWT_CHECK_ALLOC(v);
  for (int g = 0; g < ngroups; g++) v[g] = &groups[g];
  qsort(v, (size_t)ngroups, sizeof *v, cmp_domain_of);
  int d = -1;
  for (int i = 0; i < ngroups; i++) {
    if (i == 0 || strcmp(domain_of(v[i - 1]), domain_of(v[i])) != 0) d++;
    v[i]->dom = d;
  }
  free(v);
  *ndomains = d + 1;
  return NEWT_OK;
}

/* The pairs of a ring of n that sit within w consecutive places (around the ring) in one
 * domain: 0 when any w consecutive ranks are in w distinct domains. */
static int ring_clashes(const group *groups, const int *ring, int n, int w) {
  int clashes = 0;
  for (int i = 0; i < n; i++)
    for (int t = 1; t < w; t++) clashes += same_domain(groups, ring[i], ring[(i + t) % n]);
  return clashes;
}

/* Whether group g at place i of the ring (places 0..i-1 set) shares a domain with one of the
 * w-1 places before it, or, around the ring, with one of the places after it that are
 * already set (0..i+w-1-n). */
static int clashes_at(const group *groups, const int *ring, int n, int w, int i, int g) {
  for (int t = 1; t < w && i - t >= 0; t++)
    if (same_domain(groups, g, ring[i - t])) return 1;
  for (int p = 0; p <= i + w - 1 - n && p < i; p++)
    if (same_domain(groups, g, ring[p])) return 1;
  return 0;
}

/* A stage's data-parallel ring, reordered so that any k + 1 consecutive ranks (around the
 * ring) sit in k + 1 distinct failure domains where the domains allow: rank d keeps copies
 * of the unique parts of ranks d-1 .. d-k, and a copy in the same domain dies with it, so
 * then any k domains lost at once leave a copy of every part. Stable: an order that already
 * has it (or one domain) is kept, and a new order is taken only when it has fewer clashes;
 * otherwise a rank found in the way is moved forward past as few others as it can be (at most
 * SPREAD_WINDOW: a ring of 100,000 ranks in few domains is not searched to its end for each). */
#define SPREAD_WINDOW 1024
static newt_result_t spread_domains(const group *groups, int *ring, int n, int k) {
  int w = k + 1 < n ? k + 1 : n;
  if (w < 2) return NEWT_OK;
  int before = ring_clashes(groups, ring, n, w);
  if (before == 0) return NEWT_OK;
  int *next = malloc((size_t)n * sizeof *next);
  NEWT_CHECK_ALLOC(next);
  memcpy(next, ring, (size_t)n * sizeof *next);
  for (int i = 1; i < n; i++) {
    if (!clashes_at(groups, next, n, w, i, next[i])) continue;
    for (int j = i + 1; j < n && j - i <= SPREAD_WINDOW; j++)
      if (!clashes_at(groups, next, n, w, i, next[j])) {
        int g = next[j]; /* move it forward, keeping the others' order */
        memmove(next + i + 1, next + i, (size_t)(j - i) * sizeof *next);
        next[i] = g;
        break;
      }
  }
  if (ring_clashes(groups, next, n, w) < before) memcpy(ring, next, (size_t)n * sizeof *ring);
  free(next);
  return NEWT_OK;
}

/* The free slots of the stages (slot -1), filled: with dp > 1 each from the domain the stage
 * has fewest groups of yet (a stage's data-parallel copies can only be spread over the domains
 * its groups are in), first in group order among those; with dp 1 the next unused group. The
 * domains wait in a heap keyed by (groups in the stage, their first unused group), so a slot
 * costs log(domains), not a scan of the groups. */
typedef struct dom_queue {
  int *groups;  /* the groups of each domain, in group order: domain d's at groups[start[d]..start[d+1]) */
  int *start;
  int *first;   /* domain d's next group to look at (used ones are skipped when met) */
  int *count;   /* the groups of domain d in the stage being filled */
  int *heap, nheap;
} dom_queue;

static int dq_head(const dom_queue *q, const char *used, int d) {
  while (q->first[d] < q->start[d + 1] && used[q->groups[q->first[d]]]) q->first[d]++;
  return q->first[d] < q->start[d + 1] ? q->groups[q->first[d]] : -1;
}

static int dq_less(const dom_queue *q, int a, int b) {
  if (q->count[a] != q->count[b]) return q->count[a] < q->count[b];
  return q->groups[q->first[a]] < q->groups[q->first[b]];
}

static void dq_down(dom_queue *q, int i) {
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < q->nheap && dq_less(q, q->heap[l], q->heap[m])) m = l;
    if (r < q->nheap && dq_less(q, q->heap[r], q->heap[m])) m = r;
    if (m == i) return;
    int t = q->heap[i];
    q->heap[i] = q->heap[m], q->heap[m] = t, i = m;
  }
}

static void fill_stage(dom_queue *q, const group *groups, int ndomains, char *used, int *stage, int dp) {
  memset(q->count, 0, (size_t)ndomains * sizeof *q->count);
  for (int i = 0; i < dp; i++)
    if (stage[i] >= 0) q->count[groups[stage[i]].dom]++;
  q->nheap = 0;
  for (int d = 0; d < ndomains; d++)
    if (dq_head(q, used, d) >= 0) q->heap[q->nheap++] = d;
  for (int i = q->nheap / 2 - 1; i >= 0; i--) dq_down(q, i);
  for (int i = 0; i < dp && q->nheap > 0; i++) {
    if (stage[i] >= 0) continue;
    int d = q->heap[0], g = dq_head(q, used, d);
    used[g] = 1;
    stage[i] = g;
    q->count[d]++;
    if (dq_head(q, used, d) < 0) q->heap[0] = q->heap[--q->nheap];
    dq_down(q, 0);
  }
}

static newt_result_t fill_slots(const group *groups, int ngroups, int ndomains, char *used, int *slot, int dp,
                                int pp) {
  if (dp == 1) {
    int g = 0;
    for (int pi = 0; pi < pp; pi++)
      if (slot[pi] < 0) {
        while (used[g]) g++;
        used[g] = 1;
        slot[pi] = g;
      }
    return NEWT_OK;
  }
  dom_queue q = {0};
  size_t nd = (size_t)ndomains + 1;
  q.groups = malloc((size_t)(ngroups ? ngroups : 1) * sizeof *q.groups);
  q.start = calloc(nd + 1, sizeof *q.start);
  q.first = malloc(nd * sizeof *q.first);
  q.count = malloc(nd * sizeof *q.count);
  q.heap = malloc(nd * sizeof *q.heap);
  newt_result_t r = NEWT_OK;
  if (!q.groups || !q.start || !q.first || !q.count || !q.heap) {
    r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory placing %d groups", ngroups);
    goto out;
  }
  for (int g = 0; g < ngroups; g++) q.start[groups[g].dom + 1]++; /* counting sort: group order kept */
  for (int d = 0; d < ndomains; d++) q.start[d + 1] += q.start[d];
  memcpy(q.first, q.start, nd * sizeof *q.first);
  for (int g = 0; g < ngroups; g++) q.groups[q.first[groups[g].dom]++] = g;
  memcpy(q.first, q.start, nd * sizeof *q.first);
  for (int pi = 0; pi < pp; pi++) {
    int free_slots = 0;
    for (int i = 0; i < dp; i++) free_slots += slot[pi * dp + i] < 0;
    if (free_slots) fill_stage(&q, groups, ndomains, used, slot + pi * dp, dp);
  }
out:
  free(q.groups);
  free(q.start);
  free(q.first);
  free(q.count);
  free(q.heap);
  return r;
}

static newt_result_t plan_index(newt_plan *p);

newt_result_t plan_compute(const newt_spec *s, const plan_member *members, int n, uint64_t prev_gen,
                           newt_plan *out) {
  newt_result_t res = NEWT_OK;
  int tp = (int)s->tp, pp = (int)s->pp;
  const plan_member **sorted = calloc((size_t)(n ? n : 1), sizeof *sorted);
  const plan_member **rest = calloc((size_t)(n ? n : 1), sizeof *rest);
  group *groups = calloc((size_t)(n ? n : 1), sizeof *groups);
  memset(out, 0, sizeof *out);
  if (!sorted || !rest || !groups) {
    res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory planning for %d workers", n);
    goto exit;
  }
  for (int i = 0; i < n; i++) sorted[i] = &members[i];
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_host_then_key);

  /* first the tensor-parallel groups of the previous plan that are still whole (on one
     host, every tp index there): they hold consistent slices and move no data */
  int ngroups = 0, nrest = 0;
  char *taken = calloc((size_t)(n ? n : 1), 1);
  if (!taken) {
    res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory planning for %d workers", n);
    goto exit;
  }
  for (int i = 0; i + tp <= n; i++) {
    const plan_member *a = sorted[i];
    if (a->prev_rank < 0 || a->prev_rank % tp != 0) continue;
    int whole = 1;
    for (int t = 1; t < tp && whole; t++) {
      const plan_member *b = sorted[i + t];
      whole = b->prev_rank == a->prev_rank + t && strcmp(b->host, a->host) == 0;
    }
    if (!whole) continue;
    for (int t = 0; t < tp; t++) taken[i + t] = 1;
    groups[ngroups].m = &sorted[i];
    groups[ngroups].key = member_key(a);
    ngroups++;
  }
  /* then the rest (members of broken groups, newcomers): each host's run cut into groups
     of tp, after the whole ones */
  for (int i = 0; i < n; i++)
    if (!taken[i]) rest[nrest++] = sorted[i];
  free(taken);
  for (int i = 0; i < nrest;) {
    int j = i;
    while (j < nrest && strcmp(rest[j]->host, rest[i]->host) == 0) j++;
    for (int k = i; k + tp <= j; k += tp) {
      groups[ngroups].m = &rest[k];
      groups[ngroups].key = ((int64_t)1 << 41) + member_key(rest[k]);
      ngroups++;
    }
    i = j;
  }
  qsort(groups, (size_t)ngroups, sizeof *groups, cmp_group);

  int dp = plan_choose_dp(s, ngroups / pp);
  if (dp == 0) {
    res = NEWT_ERR(NEWT_ERR_UNAVAILABLE,
                   "no layout: %d workers form %d tensor-parallel groups of %d on one host; "
                   "dp_min %lld x pp %d needs %lld groups (and global_batch %lld must split into "
                   "micro-batches of %lld)",
                   n, ngroups, tp, (long long)s->dp_min, pp, (long long)(s->dp_min * pp),
                   (long long)s->global_batch, (long long)s->micro_batch);
    goto exit;
  }

  out->generation = prev_gen + 1;
  NEWT_CHECK_GOTO(newt_random_bytes(out->secret, sizeof out->secret), res, exit);
  out->created_ms = newt_wall_ms();
  snprintf(out->cause, sizeof out->cause, "initial");
  snprintf(out->switch_mode, sizeof out->switch_mode, "boundary");
  out->dp = dp;
  out->tp = tp;
  out->pp = pp;
  out->zero = (int)s->zero;
  out->global_batch = s->global_batch;
  out->micro_batch = s->micro_batch;
  out->accum = plan_accum(s->global_batch, s->micro_batch, dp);
  out->nranks = dp * tp * pp;
  out->ranks = calloc((size_t)out->nranks, sizeof *out->ranks);
  out->nspares = n - out->nranks;
  out->spares = calloc((size_t)(out->nspares ? out->nspares : 1), sizeof *out->spares);
  if (!out->ranks || !out->spares) {
    res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory building a plan of %d ranks", out->nranks);
    goto exit;
  }
  /* slot[pp_idx * dp + dp_idx] = group; first the groups that held stage pp_idx */
  int nslots = dp * pp, *slot = malloc((size_t)nslots * sizeof *slot);
  char *used = calloc((size_t)ngroups, 1);
  if (!slot || !used) {
    free(slot);
    free(used);
    res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory placing %d groups", ngroups);
    goto exit;
  }
  /* first the groups that held a stage, in group order, while it has room */
  int *filled = calloc((size_t)pp, sizeof *filled), ndomains = 0;
  for (int sl = 0; sl < nslots; sl++) slot[sl] = -1;
  for (int g = 0; filled && g < ngroups; g++) {
    int pi = groups[g].m[0]->prev_pp;
    if (pi >= 0 && pi < pp && filled[pi] < dp) {
      used[g] = 1;
      slot[pi * dp + filled[pi]++] = g;
    }
  }
  res = filled ? domain_number(groups, ngroups, &ndomains) : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory placing");
  free(filled);
  if (res == NEWT_OK) res = fill_slots(groups, ngroups, ndomains, used, slot, dp, pp);
  free(used);
  for (int pi = 0; pi < pp && res == NEWT_OK; pi++) res = spread_domains(groups, slot + pi * dp, dp, (int)s->replicas);
  if (res != NEWT_OK) {
    free(slot);
    goto exit;
  }
  char *placed = calloc((size_t)(n ? n : 1), 1); /* by member: it is a rank */
  if (!placed) {
    free(slot);
    res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory placing %d workers", n);
    goto exit;
  }
  int any_prev = 0, all_prev = 1;
  double *us = calloc((size_t)dp, sizeof *us); /* a data-parallel rank's compute per sample: its slowest member's */
  if (!us) {
    free(slot);
    res = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory placing %d groups", ngroups);
    goto exit;
  }
  for (int sl = 0; sl < nslots; sl++) {
    int pp_idx = sl / dp, dp_idx = sl % dp;
    for (int t = 0; t < tp; t++) {
      const plan_member *m = groups[slot[sl]].m[t];
      placed[m - members] = 1;
      if (m->sample_us > us[dp_idx]) us[dp_idx] = m->sample_us;
      plan_rank *r = &out->ranks[(pp_idx * dp + dp_idx) * tp + t];
      r->rank = (pp_idx * dp + dp_idx) * tp + t;
      snprintf(r->worker, sizeof r->worker, "%s", m->id);
      snprintf(r->host, sizeof r->host, "%s", m->host);
      snprintf(r->addr, sizeof r->addr, "%s", m->addr);
      if (m->domain[0] && strcmp(m->domain, m->host) != 0) snprintf(r->domain, sizeof r->domain, "%s", m->domain);
      r->dp = dp_idx;
      r->tp = t;
      r->pp = pp_idx;
      any_prev |= m->has_state;
      all_prev &= m->has_state;
    }
  }
  free(slot);
  if (s->straggler_window > 0 && !s->even_batches && s->zero < 3) { /* ZeRO 3: every rank runs the most micro-batches */
    out->shares = plan_shares_for(s->global_batch, dp, us, s->straggler_margin, &res);
    if (out->shares) out->accum = plan_most_micro(out);
  }
  free(us);
  if (res != NEWT_OK) goto exit;
  /* spares: the members not placed, in a stable order */
  int ns = 0;
  for (int i = 0; i < n; i++)
    if (!placed[i]) snprintf(out->spares[ns++], PLAN_ID_MAX, "%s", members[i].id);
  free(placed);
  out->nspares = ns;
  if (ns) spare_reason(s, n, ngroups, dp, out->spare_why, sizeof out->spare_why);
  snprintf(out->restore, sizeof out->restore, "%s", all_prev ? "memory" : any_prev ? "peer" : "init");
  res = plan_index(out);
exit:
  free(sorted);
  free(rest);
  free(groups);
  if (res != NEWT_OK) plan_free(out);
  return res;
}

void plan_free(newt_plan *p) {
  free(p->by_worker);
  p->by_worker = NULL;
  free(p->shards);
  p->shards = NULL;
  p->nshards = 0;
  free(p->ranks);
  free(p->spares);
  free(p->donors);
  free(p->shares);
  p->ranks = NULL;
  p->spares = NULL;
  p->donors = NULL;
  p->shares = NULL;
  p->nranks = p->nspares = p->ndonors = 0;
}

newt_result_t plan_copy(newt_plan *dst, const newt_plan *src) {
  *dst = *src;
  dst->by_worker = NULL; /* src's until copied below: plan_free(dst) on the way out must not free them */
  dst->shards = NULL;
  dst->nshards = 0;
  dst->ranks = calloc((size_t)(src->nranks ? src->nranks : 1), sizeof *dst->ranks);
  dst->spares = calloc((size_t)(src->nspares ? src->nspares : 1), sizeof *dst->spares);
  dst->donors = calloc((size_t)(src->ndonors ? src->ndonors : 1), sizeof *dst->donors);
  dst->shares = src->shares ? malloc((size_t)src->dp * sizeof *dst->shares) : NULL;
  if (!dst->ranks || !dst->spares || !dst->donors || (src->shares && !dst->shares)) {
    plan_free(dst);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory copying a plan");
  }
  /* an empty list may be NULL, which memcpy may not be given even for 0 bytes */
  if (src->nranks) memcpy(dst->ranks, src->ranks, (size_t)src->nranks * sizeof *dst->ranks);
  if (src->nspares) memcpy(dst->spares, src->spares, (size_t)src->nspares * sizeof *dst->spares);
  if (src->ndonors) memcpy(dst->donors, src->donors, (size_t)src->ndonors * sizeof *dst->donors);
  if (src->shares) memcpy(dst->shares, src->shares, (size_t)src->dp * sizeof *dst->shares);
  if (src->nshards) {
    dst->shards = malloc((size_t)src->nshards * sizeof *dst->shards);
    if (!dst->shards) {
      plan_free(dst);
      return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory copying a plan");
    }
    memcpy(dst->shards, src->shards, (size_t)src->nshards * sizeof *dst->shards);
    dst->nshards = src->nshards;
  }
  if (!src->by_worker) return NEWT_OK;
  dst->by_worker = malloc((size_t)(src->nranks ? src->nranks : 1) * sizeof *dst->by_worker);
  if (!dst->by_worker) {
    plan_free(dst);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory copying a plan");
  }
  if (src->nranks) memcpy(dst->by_worker, src->by_worker, (size_t)src->nranks * sizeof *dst->by_worker);
  return NEWT_OK;
}

const plan_rank *plan_find(const newt_plan *p, const char *worker) {
  if (p->by_worker) {
    int lo = 0, hi = p->nranks;
    while (lo < hi) {
      int mid = lo + (hi - lo) / 2, c = strcmp(p->ranks[p->by_worker[mid]].worker, worker);
      if (c == 0) return &p->ranks[p->by_worker[mid]];
      if (c < 0) lo = mid + 1;
      else hi = mid;
    }
    return NULL;
  }
  for (int i = 0; i < p->nranks; i++)
    if (strcmp(p->ranks[i].worker, worker) == 0) return &p->ranks[i];
  return NULL;
}

const plan_rank *plan_find_donor(const newt_plan *p, const char *worker) {
  for (int i = 0; i < p->ndonors; i++)
    if (strcmp(p->donors[i].worker, worker) == 0) return &p->donors[i];
  return NULL;
}

newt_result_t plan_add_donor(newt_plan *p, const char *worker, const char *host, const char *addr) {
  plan_rank *d = realloc(p->donors, (size_t)(p->ndonors + 1) * sizeof *d);
  NEWT_CHECK_ALLOC(d);
  p->donors = d;
  d = &p->donors[p->ndonors];
  memset(d, 0, sizeof *d);
  d->rank = p->nranks + p->ndonors;
  snprintf(d->worker, sizeof d->worker, "%s", worker);
  snprintf(d->host, sizeof d->host, "%.63s", host);
  snprintf(d->addr, sizeof d->addr, "%.95s", addr);
  d->dp = d->tp = d->pp = -1;
  p->ndonors++;
  return NEWT_OK;
}

int plan_is_spare(const newt_plan *p, const char *worker) {
  for (int i = 0; i < p->nspares; i++)
    if (strcmp(p->spares[i], worker) == 0) return 1;
  return 0;
}

/* --- the plan's record ------------------------------------------------------------------------ */

/* The domain is written only when it is not the host's: a plan is what the previous release
 * wrote unless a worker registered a domain of its own. */
static int rank_domain_is_host(const void *rec) {
  const plan_rank *r = rec;
  return !r->domain[0] || strcmp(r->domain, r->host) == 0;
}

/* A rank of the plan: its entry, then its coordinates (and its failure domain). A donor is a
 * rank without them: the table's first four fields. */
static const codec_field rank_fields[] = {
    {CODEC_INT(plan_rank, rank, "rank", 0, INT32_MAX), CODEC_REQUIRED},
    {CODEC_TOKEN(plan_rank, worker, "worker"), CODEC_REQUIRED},
    {CODEC_TOKEN(plan_rank, host, "host"), CODEC_REQUIRED},
    {CODEC_TOKEN(plan_rank, addr, "addr"), CODEC_REQUIRED},
    {CODEC_INT(plan_rank, dp, "dp", -1, INT32_MAX), CODEC_REQUIRED, .def = -1},
    {CODEC_INT(plan_rank, tp, "tp", -1, INT32_MAX), CODEC_REQUIRED, .def = -1},
    {CODEC_INT(plan_rank, pp, "pp", -1, INT32_MAX), CODEC_REQUIRED, .def = -1},
    {CODEC_TOKEN(plan_rank, domain, "domain"), .skip = rank_domain_is_host},
};
static const codec_table rank_table = CODEC_TABLE(plan_rank, "rank", rank_fields);
static const codec_table donor_table = {.name = "donor", .size = sizeof(plan_rank), .fields = rank_fields, .n = 4};

/* v in [lo, hi], for the bounds only the plan around an entry knows. */
static newt_result_t bounded(const char *what, const char *field, int64_t v, int64_t lo, int64_t hi) {
  if (v >= lo && v <= hi) return NEWT_OK;
  return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: %lld is out of range [%lld, %lld]", what, field, (long long)v,
                  (long long)lo, (long long)hi);
}

/* Entry i of the ranks, or of the donors (after the ranks: their rank is nranks + i). */
typedef struct rank_of {
  const char *worker;
  int rank;
  uint64_t key; /* the 8 bytes of its worker after the prefix every worker shares, big-endian */
} rank_of;

static int by_worker(const void *a, const void *b) {
  const rank_of *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1; /* as strcmp orders them (a name's end: 0) */
  int c = strcmp(x->worker, y->worker);
  return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

/* The ranks' workers sorted (ties by rank), malloc'd: a plan of 100,000 ranks is read in every
 * watcher at every put, so what is checked against the ranks is looked up in n log n, never
 * compared pairwise. The names of a plan share a prefix ("worker-0"): the 8 bytes after it,
 * held beside each name, order most pairs without reading the names (a sort of 100,000 took
 * 35 ms by strcmp alone). NULL when out of memory. */
static rank_of *sorted_ranks(const newt_plan *p) {
  rank_of *v = malloc((size_t)(p->nranks ? p->nranks : 1) * sizeof *v);
  if (!v) return NULL;
  size_t lcp = p->nranks ? strlen(p->ranks[0].worker) : 0;
  for (int i = 1; i < p->nranks && lcp; i++) {
    const char *a = p->ranks[0].worker, *b = p->ranks[i].worker;
    size_t k = 0;
    while (k < lcp && a[k] == b[k]) k++;
    lcp = k;
  }
  for (int i = 0; i < p->nranks; i++) {
    const unsigned char *w = (const unsigned char *)p->ranks[i].worker + lcp;
    uint64_t key = 0;
    int ended = 0;
    for (int k = 0; k < 8; k++) { /* nothing read past the name's end */
      unsigned char c = ended ? 0 : w[k];
      ended = !c;
      key = key << 8 | c;
    }
    v[i] = (rank_of){p->ranks[i].worker, i, key};
  }
  qsort(v, (size_t)p->nranks, sizeof *v, by_worker);
  return v;
}

static int by_name(const void *key, const void *elem) { return strcmp(key, ((const rank_of *)elem)->worker); }

/* p->by_worker, for plan_find (a plan whose workers are not all distinct is refused before
 * anyone looks one up). */
static newt_result_t plan_index(newt_plan *p) {
  free(p->by_worker);
  p->by_worker = NULL;
  rank_of *v = sorted_ranks(p);
  int *idx = malloc((size_t)(p->nranks ? p->nranks : 1) * sizeof *idx);
  if (!v || !idx) {
    free(v);
    free(idx);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory indexing a plan of %d ranks", p->nranks);
  }
  for (int i = 0; i < p->nranks; i++) idx[i] = v[i].rank;
  free(v);
  p->by_worker = idx;
  return NEWT_OK;
}

/* No worker is two ranks: neighbours of the sorted ranks compared. The pair named is the one
 * a scan in rank order meets first: the lowest rank whose worker comes again, and the next. */
static newt_result_t check_workers_once(newt_plan *p, const char *label) {
  rank_of *v = sorted_ranks(p);
  NEWT_CHECK_ALLOC(v);
  int a = -1, b = -1;
  for (int i = 1; i < p->nranks; i++)
    if (strcmp(v[i - 1].worker, v[i].worker) == 0) {
      if (a < 0 || v[i - 1].rank < a) a = v[i - 1].rank, b = v[i].rank; /* a run's first two, in rank order */
      while (i + 1 < p->nranks && strcmp(v[i].worker, v[i + 1].worker) == 0) i++;
    }
  if (a >= 0) {
    free(v);
    return NEWT_ERR(NEWT_ERR_INVALID, "%s[%d].worker: \"%s\" is also rank %d", label, b, p->ranks[b].worker, a);
  }
  /* the same order is plan_find's index (plan_index): one sort of 100,000 names, not two */
  int *idx = malloc((size_t)(p->nranks ? p->nranks : 1) * sizeof *idx);
  for (int i = 0; idx && i < p->nranks; i++) idx[i] = v[i].rank;
  free(v);
  NEWT_CHECK_ALLOC(idx);
  free(p->by_worker);
  p->by_worker = idx;
  return NEWT_OK;
}

/* A rank's coordinates within the plan's sizes, and the rank they give. */
static newt_result_t check_coords(const newt_plan *p, const plan_rank *r, const char *label) {
  NEWT_CHECK(bounded(label, "dp", r->dp, 0, p->dp - 1));
  NEWT_CHECK(bounded(label, "tp", r->tp, 0, p->tp - 1));
  NEWT_CHECK(bounded(label, "pp", r->pp, 0, p->pp - 1));
  if ((r->pp * p->dp + r->dp) * p->tp + r->tp != r->rank)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: coordinates (dp %d, tp %d, pp %d) do not give rank %d", label, r->dp, r->tp,
                    r->pp, r->rank);
  return NEWT_OK;
}

/* Entry i of a plan's ranks, or of its donors (`sorted`: the ranks, sorted_ranks). */
static newt_result_t parse_rank(const cJSON *o, const char *what, int i, const newt_plan *p, const rank_of *sorted,
                                int nsorted, plan_rank *r) {
  int donor = sorted != NULL;
  char label[96];
  snprintf(label, sizeof label, "%s[%d]", what, i);
  NEWT_CHECK(codec_decode_object(donor ? &donor_table : &rank_table, o, label, r));
  NEWT_CHECK(bounded(label, "rank", r->rank, donor ? p->nranks + i : i, donor ? p->nranks + i : i));
  if (donor) {
    r->dp = r->tp = r->pp = -1;
    if (bsearch(r->worker, sorted, (size_t)nsorted, sizeof *sorted, by_name))
      return NEWT_ERR(NEWT_ERR_INVALID, "%s.worker: \"%s\" is also a rank", label, r->worker);
    return NEWT_OK;
  }
  return check_coords(p, r, label);
}

static newt_result_t put_entries(cJSON *obj, const char *name, const codec_table *t, const plan_rank *r, int n) {
  cJSON *a = cJSON_AddArrayToObject(obj, name);
  NEWT_CHECK_ALLOC(a);
  for (int i = 0; i < n; i++) {
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddItemToArray(a, o)) {
      cJSON_Delete(o);
      return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing a plan");
    }
    NEWT_CHECK(codec_encode_object(t, o, &r[i]));
  }
  return NEWT_OK;
}

static newt_result_t put_ranks(cJSON *obj, const codec_field *f, const void *rec) {
  const newt_plan *p = rec;
  return put_entries(obj, f->name, &rank_table, p->ranks, p->nranks);
}

static newt_result_t put_donors(cJSON *obj, const codec_field *f, const void *rec) {
  const newt_plan *p = rec;
  return put_entries(obj, f->name, &donor_table, p->donors, p->ndonors);
}

/* The ranks: dp x tp x pp of them (counted before any is read), each in its place, no worker twice. */
static newt_result_t get_ranks(const cJSON *j, const char *what, const codec_field *f, void *rec, int required) {
  newt_plan *p = rec;
  const cJSON *ranks = NULL;
  (void)required;
  if (!cJSON_GetObjectItemCaseSensitive(j, f->name) && cJSON_GetObjectItemCaseSensitive(j, "shards"))
    return NEWT_OK; /* a head: its ranks are in its shards (get_shards) */
  NEWT_CHECK(newt_json_get_arr(j, what, f->name, 1, &ranks));
  int64_t want = (int64_t)p->dp * p->tp * p->pp;
  if (cJSON_GetArraySize(ranks) != want)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: %d entries, expected dp x tp x pp = %lld", what, f->name,
                    cJSON_GetArraySize(ranks), (long long)want);
  p->nranks = (int)want;
  p->ranks = calloc((size_t)p->nranks, sizeof *p->ranks);
  NEWT_CHECK_ALLOC(p->ranks);
  char label[48];
  snprintf(label, sizeof label, "%s.%s", what, f->name);
  int i = 0;
  for (const cJSON *o = ranks->child; o; o = o->next, i++) NEWT_CHECK(parse_rank(o, label, i, p, NULL, 0, &p->ranks[i]));
  return check_workers_once(p, label);
}

static newt_result_t get_donors(const cJSON *j, const char *what, const codec_field *f, void *rec, int required) {
  newt_plan *p = rec;
  const cJSON *donors = NULL;
  NEWT_CHECK(newt_json_get_arr(j, what, f->name, required, &donors));
  int n = donors ? cJSON_GetArraySize(donors) : 0;
  p->donors = calloc((size_t)(n ? n : 1), sizeof *p->donors);
  NEWT_CHECK_ALLOC(p->donors);
  p->ndonors = n;
  char label[48];
  snprintf(label, sizeof label, "%s.%s", what, f->name);
  if (!n) return NEWT_OK;
  /* a head has no ranks yet: its donors come after dp x tp x pp ranks, and are checked against
     them once they are in (plan_shards_done) */
  newt_plan q = *p;
  if (p->nshards) q.nranks = (int)((int64_t)p->dp * p->tp * p->pp);
  rank_of *sorted = p->nshards ? calloc(1, sizeof *sorted) : sorted_ranks(p);
  NEWT_CHECK_ALLOC(sorted);
  newt_result_t r = NEWT_OK;
  int i = 0;
  for (const cJSON *o = donors->child; o && r == NEWT_OK; o = o->next, i++)
    r = parse_rank(o, label, i, &q, sorted, p->nshards ? 0 : p->nranks, &p->donors[i]);
  free(sorted);
  return r;
}


/* --- a head's shards ---------------------------------------------------------------------------- */

/* A field of bytes (a shard's digest, the plan's secret) as hex digits: f->size bytes at
 * f->off, written and read back exactly. */
static newt_result_t put_hex(cJSON *obj, const codec_field *f, const void *rec) {
  char hex[2 * 64 + 1];
  if (f->size > 64) return NEWT_ERR(NEWT_ERR_INVALID, "plan.%s: %zu bytes, more than a hex field holds", f->name, f->size);
  newt_hex_encode((const unsigned char *)rec + f->off, f->size, hex);
  return cJSON_AddStringToObject(obj, f->name, hex) ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing a plan");
}

static newt_result_t get_hex(const cJSON *j, const char *what, const codec_field *f, void *rec, int required) {
  const char *hex = NULL;
  NEWT_CHECK(newt_json_get_str(j, what, f->name, required, &hex));
  if (!hex) return NEWT_OK; /* absent and not required: the default */
  if (strlen(hex) != 2 * f->size || newt_hex_decode(hex, (unsigned char *)rec + f->off, f->size) != 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: expected %d hex digits", what, f->name, (int)(2 * f->size));
  return NEWT_OK;
}

static const codec_field shard_ref_fields[] = {
    {CODEC_TOKEN(plan_shard_ref, host, "host"), CODEC_REQUIRED},
    {CODEC_INT(plan_shard_ref, ranks, "ranks", 1, INT32_MAX), CODEC_REQUIRED},
    {CODEC_CUSTOM(plan_shard_ref, digest, "digest", put_hex, get_hex), CODEC_REQUIRED},
};
static const codec_table shard_ref_table = CODEC_TABLE(plan_shard_ref, "shard", shard_ref_fields);

static int no_shards(const void *rec) { return ((const newt_plan *)rec)->nshards == 0; }
static int in_shards(const void *rec) { return ((const newt_plan *)rec)->nshards > 0; }

static newt_result_t put_shards(cJSON *obj, const codec_field *f, const void *rec) {
  const newt_plan *p = rec;
  cJSON *a = cJSON_AddArrayToObject(obj, f->name);
  NEWT_CHECK_ALLOC(a);
  for (int i = 0; i < p->nshards; i++) {
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddItemToArray(a, o)) {
      cJSON_Delete(o);
      return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing a plan");
    }
    NEWT_CHECK(codec_encode_object(&shard_ref_table, o, &p->shards[i]));
  }
  return NEWT_OK;
}

/* The shares: written only when set (a plan without them is the previous release's bytes). */
static int no_shares(const void *rec) { return ((const newt_plan *)rec)->shares == NULL; }

static newt_result_t put_shares(cJSON *obj, const codec_field *f, const void *rec) {
  const newt_plan *p = rec;
  cJSON *a = cJSON_AddArrayToObject(obj, f->name);
  NEWT_CHECK_ALLOC(a);
  for (int d = 0; d < p->dp; d++) {
    cJSON *n = cJSON_CreateNumber((double)p->shares[d]);
    if (!n || !cJSON_AddItemToArray(a, n)) {
      cJSON_Delete(n);
      return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing a plan");
    }
  }
  return NEWT_OK;
}

/* A head's shards: hosts in increasing order, counts adding up to dp x tp x pp. The head has no
 * ranks yet (nranks 0): the first shard added makes them, empty (rank -1), for the shards to fill. */
static newt_result_t get_shards(const cJSON *j, const char *what, const codec_field *f, void *rec, int required) {
  newt_plan *p = rec;
  const cJSON *a = NULL;
  NEWT_CHECK(newt_json_get_arr(j, what, f->name, required, &a));
  if (!a) return NEWT_OK;
  if (p->ranks) return NEWT_ERR(NEWT_ERR_INVALID, "%s: both ranks and shards", what);
  int n = cJSON_GetArraySize(a);
  if (n < 1 || n > PLAN_SHARD_MAX)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: %d shards, expected 1 to %d", what, f->name, n, PLAN_SHARD_MAX);
  p->shards = calloc((size_t)n, sizeof *p->shards);
  NEWT_CHECK_ALLOC(p->shards);
  p->nshards = n;
  int64_t total = 0, want = (int64_t)p->dp * p->tp * p->pp;
  int i = 0;
  char label[64];
  for (const cJSON *o = a->child; o; o = o->next, i++) {
    snprintf(label, sizeof label, "%s.%s[%d]", what, f->name, i);
    NEWT_CHECK(codec_decode_object(&shard_ref_table, o, label, &p->shards[i]));
    if (i > 0 && strcmp(p->shards[i - 1].host, p->shards[i].host) >= 0)
      return NEWT_ERR(NEWT_ERR_INVALID, "%s.host: \"%s\" does not come after shard %d's \"%s\"", label,
                      p->shards[i].host, i - 1, p->shards[i - 1].host);
    total += p->shards[i].ranks;
  }
  if (total != want)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: %lld ranks in all, expected dp x tp x pp = %lld", what, f->name,
                    (long long)total, (long long)want);
  return NEWT_OK; /* no ranks until a shard is added (plan_shard_add): a host reads only its own */
}


/* dp whole numbers, each 1..global_batch, summing to the global batch (dp and the batch are read
 * before them). */
static newt_result_t get_shares(const cJSON *j, const char *what, const codec_field *f, void *rec, int required) {
  newt_plan *p = rec;
  const cJSON *a = NULL;
  NEWT_CHECK(newt_json_get_arr(j, what, f->name, required, &a));
  if (!a) return NEWT_OK;
  if (cJSON_GetArraySize(a) != p->dp)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: %d entries, expected dp = %d", what, f->name, cJSON_GetArraySize(a),
                    p->dp);
  p->shares = malloc((size_t)p->dp * sizeof *p->shares);
  NEWT_CHECK_ALLOC(p->shares);
  int64_t sum = 0;
  int d = 0;
  for (const cJSON *n = a->child; n; n = n->next, d++) {
    double v = cJSON_IsNumber(n) ? n->valuedouble : -1;
    if (!(v >= 1 && v <= (double)p->global_batch) || v != floor(v))
      return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s[%d]: expected a whole number of samples 1..%lld", what, f->name, d,
                      (long long)p->global_batch);
    p->shares[d] = (int64_t)v;
    sum += p->shares[d];
  }
  if (sum != p->global_batch)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: %lld samples in all, the global batch is %lld", what, f->name,
                    (long long)sum, (long long)p->global_batch);
  return NEWT_OK;
}

/* The ranks split the global batch's samples (a sample each at least; by the shares when the
 * plan has them); accum is the most micro-batches one takes (all of them when it splits evenly:
 * accum x dp x micro_batch is the global batch). */
static newt_result_t check_accum(const char *what, const void *rec) {
  const newt_plan *p = rec;
  if (p->dp > p->global_batch)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.dp: %d data-parallel ranks for a global batch of %lld samples", what, p->dp,
                    (long long)p->global_batch);
  int64_t accum = plan_most_micro(p);
  if (p->accum != accum)
    return NEWT_ERR(NEWT_ERR_INVALID,
                    "%s.accum: %lld, but the first of dp %d ranks takes %lld micro-batches of %lld of the global batch "
                    "%lld",
                    what, (long long)p->accum, p->dp, (long long)accum, (long long)p->micro_batch,
                    (long long)p->global_batch);
  return NEWT_OK;
}

static const char *const switches[] = {"abort", "boundary", NULL};
_Static_assert(PLAN_ID_MAX == NEWT_ID_MAX, "a plan's spares are worker ids (CODEC_K_NAMES)");

/* The plan's fields in the order they are written. A plan comes from etcd, and status, logs and
 * the report print its words and names: printable characters only (CODEC_K_TOKEN). A plan's
 * generation counts plans: one near 2^53 is forged or corrupt (and JSON numbers are exact only
 * up to there). */
static const codec_field plan_fields[] = {
    {CODEC_INT(newt_plan, generation, "generation", 1, NEWT_JSON_INT_EXACT - 1), CODEC_REQUIRED},
    {CODEC_CUSTOM(newt_plan, secret, "secret", put_hex, get_hex), CODEC_REQUIRED},
    {CODEC_MS(newt_plan, created_ms, "created_ms"), CODEC_REQUIRED},
    {CODEC_TOKEN(newt_plan, cause, "cause"), CODEC_REQUIRED},
    {CODEC_WORD(newt_plan, switch_mode, "switch", switches), CODEC_REQUIRED},
    {CODEC_INT(newt_plan, dp, "dp", 1, 1 << 20), CODEC_REQUIRED},
    {CODEC_INT(newt_plan, tp, "tp", 1, 1 << 10), CODEC_REQUIRED},
    {CODEC_INT(newt_plan, pp, "pp", 1, 1 << 10), CODEC_REQUIRED},
    {CODEC_INT(newt_plan, zero, "zero", 0, 3), CODEC_REQUIRED},
    {CODEC_INT(newt_plan, global_batch, "global_batch", 1, INT64_MAX), CODEC_REQUIRED},
    {CODEC_INT(newt_plan, micro_batch, "micro_batch", 1, INT64_MAX), CODEC_REQUIRED},
    /* a new field, written only when set: a plan without it is the previous release's bytes */
    {CODEC_CUSTOM(newt_plan, shares, "shares", put_shares, get_shares), .skip = no_shares},
    {CODEC_INT(newt_plan, accum, "accum", 1, INT64_MAX), CODEC_REQUIRED, .check = check_accum},
    {CODEC_TOKEN(newt_plan, restore, "restore"), CODEC_REQUIRED},
    {CODEC_INT(newt_plan, step, "step", 0, INT64_MAX), CODEC_REQUIRED},
    {CODEC_CUSTOM(newt_plan, ranks, "ranks", put_ranks, get_ranks), CODEC_REQUIRED, .skip = in_shards},
    {CODEC_CUSTOM(newt_plan, shards, "shards", put_shards, get_shards), .skip = no_shards}, /* a head's */
    {CODEC_NAMES(newt_plan, spares, nspares, "spares", 0), CODEC_REQUIRED},
    {CODEC_PRINTABLE(newt_plan, spare_why, "spare_why"), CODEC_OMIT}, /* with spares */
    {CODEC_CUSTOM(newt_plan, donors, "donors", put_donors, get_donors)},
};
static const codec_table plan_table = {.name = "plan", .size = sizeof(newt_plan), .fields = plan_fields,
                                       .n = sizeof plan_fields / sizeof plan_fields[0], .closed = 1};

char *plan_to_json(const newt_plan *p) {
  char *text;
  newt_plan whole = *p; /* a plan read in shards is written whole: its ranks, not its head's list */
  whole.nshards = 0;
  whole.shards = NULL;
  return codec_encode(&plan_table, &whole, &text) == NEWT_OK ? text : NULL;
}

/* --- reading a large plan ----------------------------------------------------------------------
 *
 * cJSON makes 19 allocations of each rank's entry (its object, keys and values), and the codec
 * looks each field up by name: 100,000 ranks took 0.3-0.5 s. So plan_head_from_json reads the
 * "ranks" array itself, straight into the plan, in the exact form plan_to_json writes it
 * (whitespace and the keys' order free), and gives cJSON the rest with "ranks": [] in its
 * place; the ranks' checks that follow are get_ranks' own. Anything else in the array -- an
 * escape, a number that is not a plain integer, a decimal string, an unknown or repeated key, a
 * value out of its range, a string the codec would refuse -- and the plan is read the slow way
 * instead, so a plan that fails reads fail exactly as before, naming the same field. */

typedef struct scan {
  const char *p, *end;
} scan;

static void skip_ws(scan *s) {
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

static int take(scan *s, char c) {
  skip_ws(s);
  if (s->p >= s->end || *s->p != c) return 0;
  s->p++;
  return 1;
}

/* A string with no escape (a key): its span. 0: anything else. */
static int scan_key(scan *s, const char **from, size_t *n) {
  if (!take(s, '"')) return 0;
  const char *a = s->p;
  while (s->p < s->end && (unsigned char)*s->p >= ' ' && *s->p != '"' && *s->p != '\\') s->p++;
  if (s->p >= s->end || *s->p != '"') return 0;
  *from = a, *n = (size_t)(s->p - a);
  s->p++;
  return 1;
}

/* A string of printable ASCII without blanks, quotes or backslashes (a token: CODEC_K_TOKEN),
 * 1 to cap - 1 bytes, into out. 0: anything else. */
static int scan_token(scan *s, char *out, size_t cap) {
  if (!take(s, '"')) return 0;
  const char *a = s->p;
  while (s->p < s->end && *s->p > ' ' && *s->p < 0x7f && *s->p != '"' && *s->p != '\\') s->p++;
  if (s->p >= s->end || *s->p != '"') return 0;
  size_t len = (size_t)(s->p - a);
  s->p++;
  if (len == 0 || len >= cap) return 0;
  memcpy(out, a, len);
  out[len] = '\0';
  return 1;
}

/* A plain integer (what cJSON reads as the same number) in [lo, hi]. */
static int scan_int(scan *s, int64_t lo, int64_t hi, int *out) {
  skip_ws(s);
  int neg = s->p < s->end && *s->p == '-';
  if (neg) s->p++;
  int64_t v = 0;
  int digits = 0;
  for (; s->p < s->end && *s->p >= '0' && *s->p <= '9' && digits < 16; s->p++, digits++) v = v * 10 + (*s->p - '0');
  if (!digits || digits > 15) return 0;
  char c = s->p < s->end ? *s->p : ',';
  if ((c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.' || c == 'e' || c == 'E') return 0; /* cJSON reads more */
  v = neg ? -v : v;
  if (v < lo || v > hi) return 0;
  *out = (int)v;
  return 1;
}

enum { K_RANK, K_WORKER, K_HOST, K_ADDR, K_DP, K_TP, K_PP, K_DOMAIN, K_N };

/* One entry of the ranks, as rank_table reads it. */
static int scan_rank(scan *s, plan_rank *r) {
  static const char *const keys[K_N] = {"rank", "worker", "host", "addr", "dp", "tp", "pp", "domain"};
  static const size_t lens[K_N] = {4, 6, 4, 4, 2, 2, 2, 6};
  unsigned seen = 0;
  if (!take(s, '{')) return 0;
  do {
    const char *k;
    size_t kn;
    int key = 0;
    if (!scan_key(s, &k, &kn)) return 0;
    while (key < K_N && (lens[key] != kn || memcmp(keys[key], k, kn) != 0)) key++;
    if (key == K_N || (seen & (1u << key)) || !take(s, ':')) return 0;
    seen |= 1u << key;
    int ok = 0;
    switch (key) {
    case K_RANK: ok = scan_int(s, 0, INT32_MAX, &r->rank); break;
    case K_WORKER: ok = scan_token(s, r->worker, sizeof r->worker); break;
    case K_HOST: ok = scan_token(s, r->host, sizeof r->host); break;
    case K_ADDR: ok = scan_token(s, r->addr, sizeof r->addr); break;
    case K_DP: ok = scan_int(s, -1, INT32_MAX, &r->dp); break;
    case K_TP: ok = scan_int(s, -1, INT32_MAX, &r->tp); break;
    case K_PP: ok = scan_int(s, -1, INT32_MAX, &r->pp); break;
    default: ok = scan_token(s, r->domain, sizeof r->domain); break;
    }
    if (!ok) return 0;
  } while (take(s, ','));
  return take(s, '}') && (seen | (1u << K_DOMAIN)) == (1u << K_N) - 1;
}

/* The array of ranks at s: *out (calloc'd) and *n; 0: not in the form read here. */
static int scan_ranks(scan *s, plan_rank **out, int *n) {
  *out = NULL, *n = 0;
  if (!take(s, '[')) return 0;
  size_t cap = 1; /* at most one entry per '{' of the rest */
  for (const char *c = s->p; (c = memchr(c, '{', (size_t)(s->end - c))); c++) cap++;
  if (cap > INT32_MAX) return 0;
  plan_rank *v = calloc(cap, sizeof *v);
  if (!v) return 0;
  int k = 0;
  skip_ws(s);
  if (s->p < s->end && *s->p != ']')
    do {
      if ((size_t)k == cap || !scan_rank(s, &v[k++])) {
        free(v);
        return 0;
      }
    } while (take(s, ','));
  if (!take(s, ']')) {
    free(v);
    return 0;
  }
  *out = v, *n = k;
  return 1;
}

/* A string skipped as cJSON finds its end (a backslash takes the next byte with it). */
static int skip_string(scan *s) {
  for (s->p++; s->p < s->end && *s->p != '"'; s->p++)
    if (*s->p == '\\') s->p++;
  if (s->p >= s->end) return 0;
  s->p++;
  return 1;
}

/* A value of the plan's object other than the ranks, skipped: only its extent matters here
 * (cJSON checks it). 0: not a value as far as this can tell. */
static int skip_value(scan *s) {
  skip_ws(s);
  if (s->p >= s->end) return 0;
  if (*s->p == '"') return skip_string(s);
  if (*s->p == '{' || *s->p == '[') {
    for (int depth = 0; s->p < s->end;) {
      char c = *s->p;
      if (c == '"') {
        if (!skip_string(s)) return 0;
        continue;
      }
      s->p++;
      if (c == '{' || c == '[') depth++;
      else if ((c == '}' || c == ']') && --depth == 0) return 1;
    }
    return 0;
  }
  const char *a = s->p; /* a number, true, false or null: up to the next separator */
  while (s->p < s->end && *s->p && !strchr(",}] \t\n\r", *s->p)) s->p++;
  return s->p > a;
}

/* The plan's ranks, read (scan_ranks) from text where its top-level "ranks" is: *v, *n and
 * their span [*from, *to) in text. 0: no "ranks", twice, or not in a form read here. */
static int ranks_span(const char *text, size_t len, plan_rank **v, int *n, size_t *from, size_t *to) {
  scan s = {text, text + len};
  int found = 0;
  *v = NULL;
  if (!take(&s, '{')) return 0;
  do {
    const char *k;
    size_t kn;
    if (!scan_key(&s, &k, &kn) || !take(&s, ':')) break;
    if (kn == 5 && memcmp(k, "ranks", 5) == 0) {
      if (found) break;
      skip_ws(&s);
      *from = (size_t)(s.p - text);
      if (!scan_ranks(&s, v, n)) break;
      *to = (size_t)(s.p - text);
      found = 1;
    } else if (!skip_value(&s)) {
      break;
    }
    if (take(&s, '}')) return found;
  } while (take(&s, ','));
  free(*v);
  *v = NULL;
  return 0;
}

/* The ranks read ahead (ranks_span), checked as get_ranks checks what it reads: p->ranks and
 * p->nranks are set before the codec runs (this row of the table has no size, so
 * codec_defaults leaves them). */
static newt_result_t get_ranks_read(const cJSON *j, const char *what, const codec_field *f, void *rec, int required) {
  newt_plan *p = rec;
  (void)j, (void)required;
  int64_t want = (int64_t)p->dp * p->tp * p->pp;
  if (p->nranks != want)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.%s: %d entries, expected dp x tp x pp = %lld", what, f->name, p->nranks,
                    (long long)want);
  char label[48], at[96];
  snprintf(label, sizeof label, "%s.%s", what, f->name);
  for (int i = 0; i < p->nranks; i++) {
    const plan_rank *r = &p->ranks[i];
    if (r->rank == i && r->dp >= 0 && r->dp < p->dp && r->tp >= 0 && r->tp < p->tp && r->pp >= 0 && r->pp < p->pp &&
        (r->pp * p->dp + r->dp) * p->tp + r->tp == i)
      continue; /* the labels only for an error */
    snprintf(at, sizeof at, "%s[%d]", label, i);
    NEWT_CHECK(bounded(at, "rank", r->rank, i, i));
    NEWT_CHECK(check_coords(p, r, at));
  }
  return check_workers_once(p, label);
}

/* A whole plan with its ranks read by ranks_span; any error: read it the slow way. */
static newt_result_t plan_read_fast(const char *text, size_t len, newt_plan *out) {
  plan_rank *v;
  int n;
  size_t from, to;
  if (!ranks_span(text, len, &v, &n, &from, &to)) return NEWT_ERR(NEWT_ERR_INVALID, "plan: not in the form read fast");
  enum { NF = sizeof plan_fields / sizeof plan_fields[0] };
  codec_field fields[NF];
  memcpy(fields, plan_fields, sizeof fields);
  for (size_t i = 0; i < NF; i++)
    if (fields[i].decode == get_ranks) fields[i].size = 0, fields[i].decode = get_ranks_read;
  codec_table table = plan_table;
  table.fields = fields;
  newt_plan p;
  memset(&p, 0, sizeof p);
  p.ranks = v, p.nranks = n;
  size_t rest = len - (to - from) + 2; /* the text with "ranks": [] */
  char *t = malloc(rest);
  newt_result_t r = t ? NEWT_OK : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory reading a plan");
  if (t) {
    memcpy(t, text, from);
    memcpy(t + from, "[]", 2);
    memcpy(t + from + 2, text + to, len - to);
    r = codec_decode(&table, t, rest, "plan", &p);
    free(t);
  }
  if (r == NEWT_OK && (p.nshards || !p.by_worker)) r = NEWT_ERR(NEWT_ERR_INVALID, "plan: not read fast");
  if (r != NEWT_OK) {
    plan_free(&p);
    return r;
  }
  *out = p;
  return NEWT_OK;
}

newt_result_t plan_head_from_json(const char *text, size_t len, newt_plan *out) {
  if (plan_read_fast(text, len, out) == NEWT_OK) return NEWT_OK;
  newt_plan p;
  memset(&p, 0, sizeof p);
  newt_result_t r = codec_decode(&plan_table, text, len, "plan", &p);
  if (r == NEWT_OK && !p.nshards && !p.by_worker) r = plan_index(&p);
  if (r != NEWT_OK) {
    plan_free(&p);
    return r;
  }
  *out = p;
  return NEWT_OK;
}

newt_result_t plan_from_json(const char *text, size_t len, newt_plan *out) {
  NEWT_CHECK(plan_head_from_json(text, len, out));
  if (!out->nshards) return NEWT_OK;
  uint64_t g = out->generation;
  int n = out->nshards;
  plan_free(out);
  return NEWT_ERR(NEWT_ERR_INVALID, "plan %llu is a head of %d shards: its ranks are read with its shards",
                  (unsigned long long)g, n);
}

newt_result_t plan_check_spec(const newt_plan *p, const newt_spec *s) {
  const char *field = NULL;
  int64_t have = 0, want = 0;
  if (p->global_batch != s->global_batch) field = "global_batch", have = p->global_batch, want = s->global_batch;
  else if (p->micro_batch != s->micro_batch) field = "micro_batch", have = p->micro_batch, want = s->micro_batch;
  else if (p->tp != s->tp) field = "tp", have = p->tp, want = s->tp;
  else if (p->pp != s->pp) field = "pp", have = p->pp, want = s->pp;
  else if (p->zero != s->zero) field = "zero", have = p->zero, want = s->zero;
  if (field)
    return NEWT_ERR(NEWT_ERR_INVALID, "plan %llu: plan.%s is %lld, the job's spec fixes it at %lld",
                    (unsigned long long)p->generation, field, (long long)have, (long long)want);
  return NEWT_OK;
}

newt_result_t plan_check_jump(uint64_t have, uint64_t next) {
  if (have == 0 || next <= have + PLAN_MAX_JUMP) return NEWT_OK;
  return NEWT_ERR(NEWT_ERR_INVALID, "plan %llu jumps %llu generations past %llu (at most %d: a forged or corrupt "
                  "plan record)", (unsigned long long)next, (unsigned long long)(next - have), (unsigned long long)have,
                  PLAN_MAX_JUMP);
}

newt_result_t plan_check_publishable(const newt_plan *p, char **json) {
  *json = NULL;
  if (p->generation == 0 || p->generation >= (uint64_t)NEWT_JSON_INT_EXACT)
    return NEWT_ERR(NEWT_ERR_INVALID, "plan generation %llu is past the largest a plan may have (%lld): the "
                    "generations taken from etcd (the plan record, a registration) were forged or corrupt",
                    (unsigned long long)p->generation, (long long)NEWT_JSON_INT_EXACT - 1);
  char *text = plan_to_json(p);
  if (!text) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing a plan");
  newt_plan back;
  newt_result_t r = plan_from_json(text, strlen(text), &back);
  if (r != NEWT_OK) {
    free(text);
    return NEWT_ERR(NEWT_ERR_INTERNAL, "plan %llu would be refused by its readers: %s",
                    (unsigned long long)p->generation, newt_errmsg());
  }
  plan_free(&back);
  *json = text;
  return NEWT_OK;
}

/* --- a plan in shards (plan.h) ------------------------------------------------------------------ */

typedef struct shard_rec {
  uint64_t generation;
  int shard;
} shard_rec;
static const codec_field shard_fields[] = {
    {CODEC_INT(shard_rec, generation, "generation", 1, NEWT_JSON_INT_EXACT - 1), CODEC_REQUIRED},
    {CODEC_INT(shard_rec, shard, "shard", 0, PLAN_SHARD_MAX - 1), CODEC_REQUIRED},
};
static const codec_table shard_table = CODEC_TABLE(shard_rec, "shard", shard_fields);

static int by_host_then_rank(const void *a, const void *b) {
  const plan_rank *x = *(const plan_rank *const *)a, *y = *(const plan_rank *const *)b;
  int c = strcmp(x->host, y->host);
  return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

/* Shard `at` of the ranks v[from..to) (sorted by host): its record's text. */
static char *shard_text(const newt_plan *p, int at, const plan_rank *const *v, int from, int to) {
  cJSON *o = cJSON_CreateObject(), *a = NULL;
  shard_rec sr = {.generation = p->generation, .shard = at};
  int ok = o && codec_encode_object(&shard_table, o, &sr) == NEWT_OK && (a = cJSON_AddArrayToObject(o, "ranks"));
  for (int k = from; ok && k < to; k++) {
    cJSON *e = cJSON_CreateObject();
    ok = e && cJSON_AddItemToArray(a, e) && codec_encode_object(&rank_table, e, v[k]) == NEWT_OK;
  }
  char *text = ok ? cJSON_PrintUnformatted(o) : NULL;
  cJSON_Delete(o);
  return text;
}

void plan_shard_texts_free(char **shards, int n) {
  for (int i = 0; shards && i < n; i++) free(shards[i]);
  free(shards);
}

newt_result_t plan_shard_encode(const newt_plan *p, int shard_ranks, char **head, char ***shards, int *nshards) {
  *head = NULL, *shards = NULL, *nshards = 0;
  if (shard_ranks < 1) shard_ranks = 1;
  const plan_rank **v = malloc((size_t)(p->nranks ? p->nranks : 1) * sizeof *v);
  int cap = p->nranks / shard_ranks + 2, n = 0;
  char **texts = calloc((size_t)cap, sizeof *texts);
  newt_plan h = *p;
  h.shards = calloc((size_t)cap, sizeof *h.shards);
  newt_result_t r = NEWT_OK;
  if (!v || !texts || !h.shards) {
    r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory cutting a plan of %d ranks into shards", p->nranks);
    goto out;
  }
  for (int i = 0; i < p->nranks; i++) v[i] = &p->ranks[i];
  qsort(v, (size_t)p->nranks, sizeof *v, by_host_then_rank);
  for (int from = 0; from < p->nranks && r == NEWT_OK;) {
    int to = from + shard_ranks < p->nranks ? from + shard_ranks : p->nranks;
    while (to < p->nranks && strcmp(v[to]->host, v[to - 1]->host) == 0) to++; /* a host is never cut */
    if (n == PLAN_SHARD_MAX || n == cap) {
      r = NEWT_ERR(NEWT_ERR_INVALID, "a plan of %d ranks in shards of %d is over %d shards", p->nranks, shard_ranks,
                   n);
      break;
    }
    texts[n] = shard_text(p, n, v, from, to);
    if (!texts[n]) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing shard %d of plan %llu", n,
                                (unsigned long long)p->generation);
    else r = newt_sha256(texts[n], strlen(texts[n]), h.shards[n].digest);
    snprintf(h.shards[n].host, sizeof h.shards[n].host, "%s", v[from]->host);
    h.shards[n].ranks = to - from;
    n++;
    from = to;
  }
  h.nshards = n;
  if (r == NEWT_OK && codec_encode(&plan_table, &h, head) != NEWT_OK)
    r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory writing the head of plan %llu", (unsigned long long)p->generation);
out:
  free(v);
  free(h.shards);
  if (r != NEWT_OK) {
    plan_shard_texts_free(texts, n);
    return r;
  }
  *shards = texts, *nshards = n;
  return NEWT_OK;
}

int plan_is_partial(const newt_plan *p) {
  for (int i = 0; i < p->nshards; i++)
    if (!p->shards[i].added) return 1;
  return 0;
}

int plan_shard_of_host(const newt_plan *p, const char *host) {
  int lo = 0, hi = p->nshards; /* the last shard whose first host is not after host */
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (strcmp(p->shards[mid].host, host) <= 0) lo = mid + 1;
    else hi = mid;
  }
  return lo - 1;
}

/* Entry k of shard i, checked against the head: a rank of the plan with its coordinates, on
 * one of the shard's hosts. */
static newt_result_t shard_entry(const newt_plan *p, int i, const cJSON *o, const char *label, plan_rank *r) {
  NEWT_CHECK(codec_decode_object(&rank_table, o, label, r));
  NEWT_CHECK(bounded(label, "rank", r->rank, 0, (int64_t)p->dp * p->tp * p->pp - 1));
  NEWT_CHECK(check_coords(p, r, label));
  if (strcmp(r->host, p->shards[i].host) < 0 || (i + 1 < p->nshards && strcmp(r->host, p->shards[i + 1].host) >= 0))
    return NEWT_ERR(NEWT_ERR_INVALID, "%s.host: \"%s\" is not one of the shard's hosts", label, r->host);
  return NEWT_OK;
}

/* Shard i's entries read by ranks_span (its digest checked already), the rest by cJSON; every
 * check of plan_shard_read's. Any error: the shard is read the slow way, which names it. */
static newt_result_t shard_read_fast(const newt_plan *p, int i, const char *text, size_t len, plan_rank **out,
                                     int *n) {
  plan_rank *v;
  int k;
  size_t from, to;
  if (!ranks_span(text, len, &v, &k, &from, &to)) return NEWT_ERR(NEWT_ERR_INVALID, "shard: not read fast");
  size_t rest = len - (to - from) + 2; /* the text with "ranks": [] */
  char *t = malloc(rest);
  cJSON *j = NULL;
  if (t) {
    memcpy(t, text, from);
    memcpy(t + from, "[]", 2);
    memcpy(t + from + 2, text + to, len - to);
    j = cJSON_ParseWithLength(t, rest);
    free(t);
  }
  shard_rec sr;
  const cJSON *a = NULL;
  int ok = j && codec_decode_object(&shard_table, j, "shard", &sr) == NEWT_OK && sr.generation == p->generation &&
           sr.shard == i && newt_json_get_arr(j, "shard", "ranks", 1, &a) == NEWT_OK && cJSON_GetArraySize(a) == 0 &&
           k == p->shards[i].ranks;
  cJSON_Delete(j);
  int64_t nr = (int64_t)p->dp * p->tp * p->pp;
  const char *lo = p->shards[i].host, *hi = i + 1 < p->nshards ? p->shards[i + 1].host : NULL;
  for (int e = 0; ok && e < k; e++) {
    const plan_rank *r = &v[e];
    ok = r->rank < nr && r->dp >= 0 && r->dp < p->dp && r->tp >= 0 && r->tp < p->tp && r->pp >= 0 && r->pp < p->pp &&
         (r->pp * p->dp + r->dp) * p->tp + r->tp == r->rank && strcmp(r->host, lo) >= 0 &&
         (!hi || strcmp(r->host, hi) < 0);
  }
  if (!ok) {
    free(v);
    return NEWT_ERR(NEWT_ERR_INVALID, "shard: not read fast");
  }
  *out = v, *n = k;
  return NEWT_OK;
}

newt_result_t plan_shard_read(const newt_plan *p, int i, const char *text, size_t len, plan_rank **out, int *n) {
  *out = NULL, *n = 0;
  char what[64];
  snprintf(what, sizeof what, "plan %llu shard %d", (unsigned long long)p->generation, i);
  if (i < 0 || i >= p->nshards) return NEWT_ERR(NEWT_ERR_INVALID, "%s: the head lists %d shards", what, p->nshards);
  unsigned char digest[PLAN_DIGEST_BYTES];
  NEWT_CHECK(newt_sha256(text, len, digest));
  if (memcmp(digest, p->shards[i].digest, sizeof digest) != 0)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s: its digest is not the one its head names (forged, or of another plan)",
                    what);
  if (shard_read_fast(p, i, text, len, out, n) == NEWT_OK) return NEWT_OK;
  cJSON *j = cJSON_ParseWithLength(text, len);
  if (!j) return NEWT_ERR(NEWT_ERR_INVALID, "%s: not JSON", what);
  shard_rec sr;
  const cJSON *a = NULL;
  newt_result_t r = codec_decode_object(&shard_table, j, what, &sr);
  if (r == NEWT_OK && (sr.generation != p->generation || sr.shard != i))
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s: it says plan %llu shard %d", what, (unsigned long long)sr.generation, sr.shard);
  if (r == NEWT_OK) r = newt_json_get_arr(j, what, "ranks", 1, &a);
  if (r == NEWT_OK && cJSON_GetArraySize(a) != p->shards[i].ranks)
    r = NEWT_ERR(NEWT_ERR_INVALID, "%s.ranks: %d entries, its head says %d", what, cJSON_GetArraySize(a),
                 p->shards[i].ranks);
  plan_rank *v = r == NEWT_OK ? calloc((size_t)p->shards[i].ranks, sizeof *v) : NULL;
  if (r == NEWT_OK && !v) r = NEWT_ERR(NEWT_ERR_NOMEM, "out of memory reading %s", what);
  int k = 0;
  char label[96];
  for (const cJSON *o = a ? a->child : NULL; r == NEWT_OK && o; o = o->next, k++) {
    snprintf(label, sizeof label, "%s.ranks[%d]", what, k);
    r = shard_entry(p, i, o, label, &v[k]);
  }
  cJSON_Delete(j);
  if (r != NEWT_OK) {
    free(v);
    return r;
  }
  *out = v, *n = k;
  return NEWT_OK;
}

newt_result_t plan_shard_add(newt_plan *p, int i, const char *text, size_t len) {
  plan_rank *v;
  int n;
  NEWT_CHECK(plan_shard_read(p, i, text, len, &v, &n));
  if (p->shards[i].added) {
    free(v);
    return NEWT_ERR(NEWT_ERR_INVALID, "plan %llu shard %d: given twice", (unsigned long long)p->generation, i);
  }
  if (!p->ranks) { /* the first shard: every rank empty until its shard gives it */
    int64_t want = (int64_t)p->dp * p->tp * p->pp;
    p->ranks = malloc((size_t)want * sizeof *p->ranks);
    if (!p->ranks) {
      free(v);
      return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory for the %lld ranks of plan %llu", (long long)want,
                      (unsigned long long)p->generation);
    }
    for (int64_t r = 0; r < want; r++) p->ranks[r].rank = -1;
    p->nranks = (int)want;
  }
  for (int k = 0; k < n; k++) {
    if (p->ranks[v[k].rank].rank >= 0) {
      int r = v[k].rank;
      free(v);
      return NEWT_ERR(NEWT_ERR_INVALID, "plan %llu shard %d.ranks[%d]: rank %d is given twice",
                      (unsigned long long)p->generation, i, k, r);
    }
    p->ranks[v[k].rank] = v[k];
  }
  free(v);
  p->shards[i].added = 1;
  return NEWT_OK;
}

newt_result_t plan_shards_done(newt_plan *p) {
  for (int i = 0; i < p->nshards; i++)
    if (!p->shards[i].added)
      return NEWT_ERR(NEWT_ERR_NOTFOUND, "plan %llu: shard %d (hosts from \"%s\") is missing",
                      (unsigned long long)p->generation, i, p->shards[i].host);
  for (int r = 0; r < p->nranks; r++) /* the counts add up and no rank came twice: each is there */
    if (p->ranks[r].rank != r)
      return NEWT_ERR(NEWT_ERR_INVALID, "plan %llu: rank %d is in no shard", (unsigned long long)p->generation, r);
  NEWT_CHECK(check_workers_once(p, "plan.ranks"));
  if (p->ndonors) {
    rank_of *sorted = sorted_ranks(p);
    NEWT_CHECK_ALLOC(sorted);
    for (int i = 0; i < p->ndonors; i++)
      if (bsearch(p->donors[i].worker, sorted, (size_t)p->nranks, sizeof *sorted, by_name)) {
        free(sorted);
        return NEWT_ERR(NEWT_ERR_INVALID, "plan.donors[%d].worker: \"%s\" is also a rank", i, p->donors[i].worker);
      }
    free(sorted);
  }
  return p->by_worker ? NEWT_OK : plan_index(p); /* check_workers_once made it */
}
