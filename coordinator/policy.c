/* The leader's policy (see policy.h): what to do about a picture of the job. */
#include "coordinator/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/backend.h"
#include "common/strutil.h"

const char *policy_cause(policy_reason r) {
  switch (r) {
  case POLICY_INITIAL: return "initial";
  case POLICY_CRASH_REPORTED:
  case POLICY_ALL_GONE: return "crash";
  case POLICY_HANG_REPORTED:
  case POLICY_LEASE_LOST:
  case POLICY_STALL: return "hang";
  case POLICY_LEAVE: return "leave";
  case POLICY_JOIN: return "join";
  case POLICY_REBALANCE: return "rebalance";
  case POLICY_NONE: break;
  }
  return NULL;
}

int policy_member_leaving(const job_worker *w) {
  return strcmp(w->state, "leaving") == 0 || strcmp(w->state, "left") == 0;
}

int policy_member_done(const job_worker *w) { return strcmp(w->state, "done") == 0; }

/* Member id: through the view's index (policy_decide sees that there is one: a lookup for
 * each of 100,000 ranks is O(1)), else scanned (a view of a caller's own). */
static const job_worker *find_member(const policy_view *v, const char *id) {
  if (v->member_ix) {
    int i = newt_strindex_find(v->member_ix, v->members, id);
    return i >= 0 ? &v->members[i] : NULL;
  }
  for (int i = 0; i < v->nmembers; i++)
    if (strcmp(v->members[i].id, id) == 0) return &v->members[i];
  return NULL;
}

static int listed(char (*list)[RDZV_NAME_MAX], int n, const char *id) {
  for (int i = 0; i < n; i++)
    if (strcmp(list[i], id) == 0) return 1;
  return 0;
}

static const job_worker *find_member(const policy_view *v, const char *id);

/* Whether report r names id, and was written while id's registration was there: a report of
 * a generation that is over does not judge a worker that registered again since (fenced and
 * back, say) -- it would be fenced again at once, for good (issue 27). */
static int accuses(const policy_view *v, const job_report *r, const char *id) {
  int named = 0;
  for (int k = 0; k < r->naccuse && !named; k++) named = strcmp(r->accuse[k], id) == 0;
  const job_worker *m = named && v ? find_member(v, id) : NULL;
  return named && (!m || !r->revision || m->create_revision <= r->revision);
}

static const job_report *report_of(const policy_view *v, const char *id) {
  if (v->report_ix) {
    int i = newt_strindex_find(v->report_ix, v->reports, id);
    return i >= 0 ? &v->reports[i] : NULL;
  }
  for (int i = 0; i < v->nreports; i++)
    if (strcmp(v->reports[i].worker, id) == 0) return &v->reports[i];
  return NULL;
}

static int is_reporter(const policy_view *v, const char *id) { return report_of(v, id) != NULL; }

static int is_accused(const policy_view *v, const char *id) {
  for (int i = 0; i < v->nreports; i++)
    if (accuses(v, &v->reports[i], id)) return 1;
  return 0;
}

/* How many reports of a generation that never formed (other than its own) name id. */
static int build_accusers(const policy_view *v, const char *id) {
  int n = 0;
  for (int i = 0; i < v->nreports; i++)
    n += v->reports[i].build && strcmp(v->reports[i].worker, id) != 0 && accuses(v, &v->reports[i], id);
  return n;
}

/* Whether every accusation of id was made by a generation that never formed, at a deadline
 * (a link never made, a peer that gave up waiting: "build" reports of a hang). Such an
 * accusation says as much of the accuser as of the accused -- a worker that cannot prove
 * the generation's key names every other rank, and gives up first, having no step to
 * finish -- so a silent rank accused only so is still building, not dead. */
static int only_build_timeouts(const policy_view *v, const char *id) {
  for (int i = 0; i < v->nreports; i++)
    if (accuses(v, &v->reports[i], id) && !(v->reports[i].build && v->reports[i].hang)) return 0;
  return 1;
}

/* Of two ranks of a generation that never formed that name each other, with no majority to
 * decide (fewer than three reports), the one that holds the job's state keeps its place --
 * the newer step in its report (a newcomer, or a worker without the job's secret, holds
 * none), then the lower rank -- so the next generation forms without the other instead of
 * failing alike, or without both. */
static int loses_build_tie(const policy_view *v, const char *id) {
  const job_report *mine = report_of(v, id);
  const plan_rank *me = plan_find(v->plan, id);
  for (int i = 0; mine && mine->build && i < v->nreports; i++) {
    const job_report *o = &v->reports[i];
    if (o == mine || !o->build || !accuses(v, o, id) || !accuses(v, mine, o->worker)) continue;
    const plan_rank *them = plan_find(v->plan, o->worker);
    if (o->step > mine->step || (o->step == mine->step && me && them && them->rank < me->rank)) return 1;
  }
  return 0;
}

/* A rank that is to blame: accused and silent (it could not report: dead or stopped), or --
 * when a generation never formed -- one that reported too but whose links the others could
 * not make: with three or more reports, more than half of the others name it (it is alive
 * but cannot join them: a partition, a peer that cannot prove the generation's key); with
 * two that name each other, the one that loses the tie (loses_build_tie). The next
 * generation forms without it instead of failing the same way again. (Once steps ran, a
 * failure cascades -- each rank that sees one aborts, and its peers see it go -- so there the
 * accusations of ranks that reported are not counted.) */
static int suspect(const policy_view *v, const char *id) {
  if (!is_accused(v, id)) return 0;
  if (!is_reporter(v, id)) return 1;
  if (v->nreports >= 3) return 2 * build_accusers(v, id) > v->nreports - 1;
  return loses_build_tie(v, id);
}

/* The pairs of candidate plan ranks that cannot be on one side, as an adjacency list (CSR:
 * the neighbours of rank k are adj[off[k] .. off[k+1])). With cut NULL, a generation that
 * never formed: a build report of one names the other. Else a running generation's cut: a
 * report of no progress ("hang") of one names the other, a cut-off rank (cut[]). At most
 * JOB_ACCUSE_MAX pairs per report, so a job of any size is cheap to look at. */
static int side_conflicts(const policy_view *v, const int *cand, const int *cut, int **off_out, int **adj_out) {
  const newt_plan *p = v->plan;
  int n = p->nranks, ne = 0;
  int *ea = malloc((size_t)(v->nreports * JOB_ACCUSE_MAX + 1) * sizeof *ea);
  int *eb = malloc((size_t)(v->nreports * JOB_ACCUSE_MAX + 1) * sizeof *eb);
  int *off = calloc((size_t)n + 1, sizeof *off), *adj = NULL;
  for (int i = 0; ea && eb && off && i < v->nreports; i++) {
    const job_report *r = &v->reports[i];
    const plan_rank *ra = plan_find(p, r->worker);
    if (!ra || !cand[ra->rank] || (cut ? !r->hang : !r->build)) continue;
    for (int k = 0; k < r->naccuse; k++) {
      const plan_rank *rb = plan_find(p, r->accuse[k]);
      if (!rb || !cand[rb->rank] || rb == ra || (cut && !cut[rb->rank]) || !accuses(v, r, r->accuse[k])) continue;
      ea[ne] = ra->rank, eb[ne++] = rb->rank;
    }
  }
  if (ea && eb && off && (adj = malloc((size_t)(2 * ne + 1) * sizeof *adj))) {
    for (int e = 0; e < ne; e++) off[ea[e] + 1]++, off[eb[e] + 1]++;
    for (int k = 0; k < n; k++) off[k + 1] += off[k];
    int *at = malloc((size_t)(n + 1) * sizeof *at);
    if (at) {
      memcpy(at, off, (size_t)n * sizeof *at);
      for (int e = 0; e < ne; e++) adj[at[ea[e]]++] = eb[e], adj[at[eb[e]]++] = ea[e];
      free(at);
    } else {
      free(adj), adj = NULL;
    }
  }
  free(ea), free(eb);
  if (!adj) {
    free(off);
    return -1;
  }
  *off_out = off, *adj_out = adj;
  return 0;
}

/* The largest side of a partition, by a rule that cannot flip-flop: from each candidate in
 * rank order, the candidates in rank order that conflict with none taken so far
 * (side_conflicts); the largest such side, the first in rank order on a tie. Every start
 * without a conflict gives the side of the first candidate, so only that one and the ranks
 * with conflicts are tried. in_side[k] (plan ranks) set for its members; returns its size
 * (0: out of memory). */
static int largest_side(const policy_view *v, const int *cand, const int *cut, int *in_side) {
  const newt_plan *p = v->plan;
  int *off = NULL, *adj = NULL, best = 0, first = -1;
  int *taken = calloc((size_t)p->nranks + 1, sizeof *taken);
  if (!taken || side_conflicts(v, cand, cut, &off, &adj) != 0) {
    free(taken);
    return 0;
  }
  for (int s = 0; s < p->nranks; s++) {
    if (!cand[s] || (first >= 0 && off[s + 1] == off[s])) continue;
    if (first < 0) first = s;
    memset(taken, 0, (size_t)p->nranks * sizeof *taken);
    taken[s] = 1;
    int n = 1;
    for (int k = 0; k < p->nranks; k++) {
      int ok = cand[k] && !taken[k];
      for (int j = off[k]; ok && j < off[k + 1]; j++) ok = !taken[adj[j]];
      if (ok) taken[k] = 1, n++;
    }
    if (n > best) {
      best = n;
      memcpy(in_side, taken, (size_t)p->nranks * sizeof *in_side);
    }
  }
  free(taken), free(off), free(adj);
  return best;
}

int64_t policy_hold_out_ms(int strikes) {
  int64_t ms = 30000;
  for (int i = 1; i < strikes && ms < 600000; i++) ms *= 2;
  return ms < 600000 ? ms : 600000;
}

int policy_blames_build(const policy_view *v, const char *id) {
  for (int i = 0; i < v->nreports; i++)
    if (v->reports[i].build && accuses(v, &v->reports[i], id)) return 1;
  return 0;
}

/* ns from t to now; 0 when t is later (a watch thread may stamp a time after ours). */
static uint64_t elapsed(uint64_t now, uint64_t t) { return now > t ? now - t : 0; }

static int passed(const policy_view *v, uint64_t since, int64_t ms) {
  return elapsed(v->now, since) >= (uint64_t)ms * 1000000ull;
}

static void fill_member(plan_member *m, const job_worker *w) {
  memset(m, 0, sizeof *m);
  snprintf(m->id, sizeof m->id, "%s", w->id);
  snprintf(m->host, sizeof m->host, "%.63s", w->host);
  snprintf(m->domain, sizeof m->domain, "%s", w->domain);
  snprintf(m->addr, sizeof m->addr, "%.95s", w->addr);
  m->join_rev = w->create_revision;
}

/* A member the next plan may use, GPU clashes aside. */
static int candidate(const policy_view *v, char (*exclude)[RDZV_NAME_MAX], int nexclude, const job_worker *w) {
  return !policy_member_leaving(w) && !policy_member_done(w) && w->addr[0] && !listed(exclude, nexclude, w->id) &&
         !listed(v->held_out, v->nheld_out, w->id);
}

/* Whether candidate a keeps a GPU both it and b registered on: a rank of the current plan
 * before a newcomer (it holds state), then the earlier registration, then the smaller id. */
static int keeps_gpu(const policy_view *v, const job_worker *a, const job_worker *b) {
  int ra = v->plan->generation && plan_find(v->plan, a->id), rb = v->plan->generation && plan_find(v->plan, b->id);
  if (ra != rb) return ra;
  if (a->create_revision != b->create_revision) return a->create_revision < b->create_revision;
  return strcmp(a->id, b->id) < 0;
}

const job_worker *policy_gpu_taken(const policy_view *v, char (*exclude)[RDZV_NAME_MAX], int nexclude,
                                    const job_worker *w) {
  if (!newt_backend_uses_gpu(newt_backend_find(v->spec->backend)) || w->device < 0) return NULL;
  for (int i = 0; i < v->nmembers; i++) {
    const job_worker *o = &v->members[i];
    if (o != w && o->device == w->device && strcmp(o->host, w->host) == 0 && !(o->shares_device && w->shares_device) &&
        candidate(v, exclude, nexclude, o) && keeps_gpu(v, o, w))
      return o;
  }
  return NULL;
}

int policy_plan_members(const policy_view *v, char (*exclude)[RDZV_NAME_MAX], int nexclude, plan_member *out) {
  int n = 0;
  for (int i = 0; i < v->nmembers; i++) {
    const job_worker *w = &v->members[i];
    if (!candidate(v, exclude, nexclude, w) || policy_gpu_taken(v, exclude, nexclude, w)) continue;
    plan_member *m = &out[n++];
    fill_member(m, w);
    const plan_rank *r = v->plan->generation ? plan_find(v->plan, w->id) : NULL;
    m->prev_rank = r ? r->rank : -1;
    m->prev_pp = r ? r->pp : -1;
    m->has_state = r != NULL;
  }
  return n;
}

int policy_donors(const policy_view *v, int plan_started, plan_member *out) {
  int n = 0;
  for (int i = 0; i < v->nmembers; i++) {
    const job_worker *w = &v->members[i];
    if (strcmp(w->state, "leaving") != 0 || !w->addr[0]) continue;
    if (!plan_find(v->plan, w->id) && (plan_started || !plan_find_donor(v->plan, w->id))) continue;
    fill_member(&out[n++], w);
  }
  return n;
}

/* The first plan: once spec.parallel.start_workers are here (or start_timeout_ms after the
   first came), else once joins settle or every worker a layout could use is here. */
static void decide_first(const policy_view *v, policy_decision *d) {
  const newt_spec *s = v->spec;
  if (v->nmembers > 0 && !d->first_member) d->first_member = v->now;
  int64_t most = s->dp_max * s->tp * s->pp;
  int go;
  if (s->start_workers > 0)
    go = v->nmembers >= s->start_workers || passed(v, d->first_member, s->start_timeout_ms);
  else
    go = v->nmembers >= most || passed(v, v->last_join, v->start_window_ms);
  if (v->nmembers > 0 && go) d->reason = POLICY_INITIAL, d->at_boundary = 1;
}

static void exclude(policy_decision *d, const char *id) {
  snprintf(d->exclude[d->nexclude++], RDZV_NAME_MAX, "%s", id);
}

/* Each rank of the plan: gone (its registration vanished), leaving (gracefully, or gone after
   it said so), suspect (the reports leave it out: excluded) or, while there are reports, not
   reported yet. */
static void sort_ranks(const policy_view *v, policy_decision *d, int *gone, int *leaving, int *unreported) {
  const newt_plan *p = v->plan;
  int nreports = v->nreports;
  for (int k = 0; k < p->nranks; k++) {
    const char *id = p->ranks[k].worker;
    const job_worker *m = find_member(v, id);
    if (!m && listed(v->departed, v->ndeparted, id)) {
      (*leaving)++;
      exclude(d, id);
    } else if (!m) {
      (*gone)++;
      exclude(d, id);
    } else if (policy_member_leaving(m)) {
      (*leaving)++;
      exclude(d, id);
    } else if (nreports && suspect(v, id)) {
      exclude(d, id);
    } else if (nreports && !is_reporter(v, id)) {
      (*unreported)++;
    }
  }
}

/* A generation that never formed in which the majority rule leaves every rank out (cand: the
   ranks that reported, all suspect): the largest side goes on; of the candidates, the
   other sides stay excluded, and the gone and the leavers. */
static void partition_build(const policy_view *v, const int *cand, policy_decision *d) {
  const newt_plan *p = v->plan;
  int *side = calloc((size_t)p->nranks, sizeof *side);
  if (side && largest_side(v, cand, NULL, side) > 0) {
    int n = d->nexclude;
    d->nexclude = 0;
    for (int i = 0; i < n; i++) {
      const plan_rank *r = plan_find(p, d->exclude[i]);
      if ((!r || !cand[r->rank] || !side[r->rank]) && d->nexclude++ != i)
        memmove(d->exclude[d->nexclude - 1], d->exclude[i], RDZV_NAME_MAX);
    }
    d->partition = POLICY_PARTITION_BUILD;
  }
  free(side);
}

/* A running generation: a rank that reported (it is alive and reaches etcd) but that more
   than half of the other reporters name in reports of no progress ("hang": probes lost,
   unanswered) was cut off from them on the data plane. It goes -- it would only fail the
   next build -- with the largest side of the cut: ranks that named a cut-off rank are on
   the other side from it (a 2|2 split names one rank of each side). A closed connection
   ("crash") naming a rank that reported is the cascade of its abort, not a cut: not
   counted. */
static void partition_cut(const policy_view *v, const int *cand, policy_decision *d) {
  const newt_plan *p = v->plan;
  int nreports = v->nreports;
  int *cut = calloc((size_t)p->nranks, sizeof *cut), *side = calloc((size_t)p->nranks, sizeof *side), ncut = 0;
  for (int k = 0; cut && side && k < p->nranks; k++) {
    if (!cand[k]) continue;
    int by = 0;
    for (int i = 0; i < nreports; i++)
      by += v->reports[i].hang && strcmp(v->reports[i].worker, p->ranks[k].worker) != 0 &&
            accuses(v, &v->reports[i], p->ranks[k].worker);
    cut[k] = 2 * by > nreports - 1;
    ncut += cut[k];
  }
  if (ncut && largest_side(v, cand, cut, side) > 0) {
    for (int k = 0; k < p->nranks; k++)
      if (cand[k] && !side[k] && !listed(d->exclude, d->nexclude, p->ranks[k].worker)) exclude(d, p->ranks[k].worker);
    d->partition = POLICY_PARTITION_CUT;
  }
  free(cut);
  free(side);
}

/* The sides of a partition the reports reveal (partition_build, partition_cut). */
static void find_partition(const policy_view *v, policy_decision *d) {
  const newt_plan *p = v->plan;
  int nreports = v->nreports;
  int *cand = calloc((size_t)(p->nranks ? p->nranks : 1), sizeof *cand), ncand = 0, nsuspect = 0, builds = 0;
  for (int i = 0; i < nreports; i++) builds += v->reports[i].build;
  for (int k = 0; cand && k < p->nranks; k++) {
    const job_worker *m = find_member(v, p->ranks[k].worker);
    cand[k] = m && !policy_member_leaving(m) && !listed(v->departed, v->ndeparted, p->ranks[k].worker) &&
              is_reporter(v, p->ranks[k].worker);
    ncand += cand[k];
    nsuspect += cand[k] && suspect(v, p->ranks[k].worker);
  }
  if (cand && builds && ncand >= 2 && nsuspect == ncand) partition_build(v, cand, d);
  else if (cand && !builds && nreports >= 3) partition_cut(v, cand, d);
  free(cand);
}

/* Whether the report window passed. A generation that never formed: each rank gives up at
   its own build deadline, and ranks that had a step to finish first started later, so wait
   for them a communicator timeout and the report window after it, not just the report
   window -- a rank that reports first (one refused at once, for lack of the job's secret)
   must not get the others fenced for being slower to say the same. */
static int report_window_over(const policy_view *v) {
  const newt_spec *s = v->spec;
  int64_t window = s->report_window_ms;
  for (int i = 0; i < v->nreports; i++)
    if (v->reports[i].build && s->comm_timeout_ms + s->report_window_ms > window)
      window = s->comm_timeout_ms + s->report_window_ms;
  return v->first_report && passed(v, v->first_report, window);
}

/* Whether a report of no progress (a hang's) names id: as each side of a cut sees the
 * other. (A rank that aborted on a fault is named by crash reports: its links closed.) */
static int hang_accused(const policy_view *v, const char *id) {
  for (int i = 0; i < v->nreports; i++)
    if (v->reports[i].hang && accuses(v, &v->reports[i], id)) return 1;
  return 0;
}

/* Whether every report that names id comes from a rank that a hang's report names in turn:
 * each side of a cut names the other, so a rank named only by the other side may be a
 * member of this side whose own report is on its way (the reports of one cut arrive
 * milliseconds apart), not a dead rank. */
static int only_disputed(const policy_view *v, const char *id) {
  for (int i = 0; i < v->nreports; i++)
    if (accuses(v, &v->reports[i], id) && !hang_accused(v, v->reports[i].worker)) return 0;
  return 1;
}

/* Everyone who could report did: decide at once -- unless the accused who are silent
   outnumber those who reported (one rank blaming the rest may be the odd one out: wait for
   the others to have their say), or one of them is accused only by the timeouts of a build
   (it is still building: wait for its report, or the window), or only by ranks that are
   accused themselves (a cut: the lone rank's report came first, naming the others, and
   theirs are on their way; deciding on it would leave the larger side out). */
static int all_said(const policy_view *v, int unreported) {
  const newt_plan *p = v->plan;
  int silent_suspects = 0, silent_building = 0, silent_disputed = 0;
  for (int k = 0; k < p->nranks; k++) {
    const char *id = p->ranks[k].worker;
    if (!find_member(v, id) || !is_accused(v, id) || is_reporter(v, id)) continue;
    silent_suspects++;
    silent_building += only_build_timeouts(v, id);
    silent_disputed += only_disputed(v, id);
  }
  return unreported == 0 && silent_building == 0 && silent_disputed == 0 && v->nreports >= silent_suspects;
}

/* The reports are in. stuck: the window passed with ranks that neither reported nor were
   named: they are stuck too. */
static void decide_reported(const policy_view *v, policy_decision *d, int stuck) {
  const newt_plan *p = v->plan;
  for (int k = 0; stuck && k < p->nranks; k++) {
    const char *id = p->ranks[k].worker;
    if (find_member(v, id) && !is_reporter(v, id) && !is_accused(v, id)) exclude(d, id);
  }
  /* a failure cascades (each rank that sees one aborts, closing its links), so the kind of
     the earliest report is the kind of the fault */
  int first_hang = 0;
  uint64_t first_t = UINT64_MAX;
  for (int i = 0; i < v->nreports; i++)
    if (v->reports[i].t_ms < first_t || (v->reports[i].t_ms == first_t && !v->reports[i].hang)) {
      first_t = v->reports[i].t_ms;
      first_hang = v->reports[i].hang;
    }
  d->reason = first_hang ? POLICY_HANG_REPORTED : POLICY_CRASH_REPORTED;
}

/* gone ranks' registrations vanished and nobody reported. */
static void decide_gone(const policy_view *v, policy_decision *d, int gone) {
  const newt_spec *s = v->spec;
  if (v->outage_end && !passed(v, v->outage_end, s->lease_ttl_ms + v->join_window_ms)) {
    /* etcd came back a moment ago: the ranks are renewing their registrations */
  } else if (d->first_gone && v->last_progress > d->first_gone) {
    /* steps went on after the registration vanished: every rank is alive */
    d->first_gone = 0;
    d->gone_alive = 1;
  } else {
    /* a lease ran out and no survivor saw a connection die: a rank that crashed would have
       been reported within milliseconds, so it stopped (or lost its network) -- unless no
       rank survived to report anything. Leases of ranks that died together run out up to a
       renewal period apart: wait that long for the others (or a report). */
    if (!d->first_gone) d->first_gone = v->now;
    if (gone == v->plan->nranks) {
      /* nobody left: nothing runs and no state is held, so gather the workers that are
         arriving (as for the first plan: replacements start together but register as
         their processes come up) instead of planning with the first one -- until as many
         are here as the plan had, or arrivals settled for the start window */
      if (v->nmembers >= v->plan->nranks || passed(v, v->last_join, v->start_window_ms)) d->reason = POLICY_ALL_GONE;
    } else if (passed(v, d->first_gone, s->lease_ttl_ms / 2)) {
      d->reason = POLICY_LEASE_LOST;
    }
  }
}

void policy_progress_us(const job_progress *pr, int dp, double *us) {
  for (int d = 0; d < dp; d++) us[d] = pr->sample_us > 0 ? pr->sample_us : 0;
  for (int i = 0; i < pr->nslow && i < JOB_SLOW_MAX; i++)
    if (pr->slow[i].dp >= 0 && pr->slow[i].dp < dp) us[pr->slow[i].dp] = pr->slow[i].us;
}

int policy_replace_dp(const newt_spec *s, const newt_plan *p, const double *us) {
  if (s->straggler_replace < 1 || p->nspares < 1 || p->dp < 2) return -1;
  int worst = 0;
  for (int d = 1; d < p->dp; d++)
    if (us[d] > us[worst]) worst = d;
  /* against the median of the others (of two ranks, the other one's) */
  double *v = malloc((size_t)p->dp * sizeof *v);
  if (!v) return -1;
  int n = 0;
  for (int d = 0; d < p->dp; d++)
    if (d != worst) v[n++] = us[d];
  double median = newt_percentile(v, (size_t)n, 0.5);
  free(v);
  return median > 0 && us[worst] >= s->straggler_replace * median ? worst : -1;
}

int policy_rebalance_due(const policy_view *v) {
  const newt_spec *s = v->spec;
  const newt_plan *p = v->plan;
  const job_progress *pr = v->progress;
  if (!pr || s->straggler_window <= 0 || s->even_batches || s->zero >= 3 || p->dp < 2 || pr->generation != p->generation ||
      pr->straggle < s->straggler_window || pr->straggle_ms < v->straggle_min_ms || !(pr->sample_us > 0))
    return 0;
  double *us = malloc((size_t)p->dp * sizeof *us);
  if (!us) return 0;
  policy_progress_us(pr, p->dp, us);
  newt_result_t err;
  int64_t *shares = plan_shares_for(p->global_batch, p->dp, us, s->straggler_margin, &err);
  int differ = (shares == NULL) != (p->shares == NULL) || policy_replace_dp(s, p, us) >= 0;
  free(us);
  for (int d = 0; shares && p->shares && d < p->dp && !differ; d++) differ = shares[d] != p->shares[d];
  free(shares);
  return err == NEWT_OK && differ;
}

/* A running generation: failures first (reports, vanished ranks, a stall), then leaves,
   then joins. */
static void decide_running(const policy_view *v, policy_decision *d) {
  const newt_spec *s = v->spec;
  int gone = 0, leaving = 0, unreported = 0;
  sort_ranks(v, d, &gone, &leaving, &unreported);
  find_partition(v, d);
  int window_over = report_window_over(v);
  if (v->nreports && (all_said(v, unreported) || window_over)) {
    decide_reported(v, d, window_over && unreported);
  } else if (v->nreports) {
    /* more reports may come: wait for them (or the window) */
  } else if (leaving && !gone) {
    d->reason = POLICY_LEAVE, d->at_boundary = 1;
  } else if (gone) {
    decide_gone(v, d, gone);
  } else if (passed(v, v->last_progress, v->steps_done ? s->hang_timeout_ms : s->first_step_timeout_ms)) {
    /* until the job's first step, start-up (a model built, data read, CUDA started) has a
       deadline of its own: no false hang is charged to the failure budget */
    d->reason = POLICY_STALL;
  } else if (policy_rebalance_due(v)) {
    d->reason = POLICY_REBALANCE, d->at_boundary = 1;
  } else if (passed(v, v->last_join, v->join_window_ms)) {
    /* newcomers: replan only when they allow a larger layout */
    if (v->join_grows && v->join_grows(v->ud)) d->reason = POLICY_JOIN, d->at_boundary = 1;
  }
}

/* ix indexes the n items of base by name, the first of a name only (what a scan finds first). */
static newt_result_t index_first(newt_strindex *ix, const void *base, int n) {
  for (int i = 0; i < n; i++)
    if (newt_strindex_find(ix, base, (const char *)base + (size_t)i * ix->stride + ix->key_off) < 0)
      NEWT_CHECK(newt_strindex_add(ix, base, i));
  return NEWT_OK;
}

static newt_result_t decide(const policy_view *v, policy_decision *out);

newt_result_t policy_decide(const policy_view *given, policy_decision *out) {
  /* the members (unless the view brings their index) and the reports indexed for the look:
     each rank of the plan is looked up in both */
  policy_view v = *given;
  newt_strindex members = NEWT_STRINDEX(job_worker, id), reports = NEWT_STRINDEX(job_report, worker);
  newt_result_t r = NEWT_OK;
  if (!v.member_ix && (r = index_first(&members, v.members, v.nmembers)) == NEWT_OK) v.member_ix = &members;
  if (r == NEWT_OK && (r = index_first(&reports, v.reports, v.nreports)) == NEWT_OK) v.report_ix = &reports;
  if (r == NEWT_OK) r = decide(&v, out);
  else memset(out, 0, sizeof *out);
  newt_strindex_free(&members);
  newt_strindex_free(&reports);
  return r;
}

static newt_result_t decide(const policy_view *v, policy_decision *out) {
  memset(out, 0, sizeof *out);
  out->first_member = v->first_member;
  out->first_gone = v->first_gone;
  out->exclude = calloc((size_t)(v->nmembers + v->plan->nranks + 1), sizeof *out->exclude);
  if (!out->exclude) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory deciding");
  for (int i = 0; i < v->nmembers; i++)
    if (policy_member_done(&v->members[i])) return NEWT_OK; /* the last step is done: the end marker follows */
  if (!v->plan->generation) decide_first(v, out);
  else decide_running(v, out);
  if (out->reason == POLICY_NONE) out->nexclude = 0;
  /* a failed rank must not come back into g+1: fence the excluded that did not report */
  out->fence = out->reason != POLICY_NONE && !out->at_boundary && out->reason != POLICY_INITIAL;
  return NEWT_OK;
}

void policy_decision_free(policy_decision *d) {
  free(d->exclude);
  d->exclude = NULL;
  d->nexclude = 0;
}
