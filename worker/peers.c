/* A crash while etcd is away: the survivors go on among themselves (docs/elastic.md, "A
 * crash while etcd is away"); the key a generation's links prove; a crash report's second
 * look at the ranks of a host that lost one (internal.h, worker_recheck); and a worker left
 * out of a plan proving that its links to the plan's ranks work (docs/elastic.md, "Back as
 * soon as the links work").
 *
 * When a generation fails and etcd does not answer, no plan can come: instead of waiting
 * for etcd, the ranks that are left make the next layout themselves, over the data plane.
 * The rule, the same on every survivor:
 *
 *   1. etcd is away: no endpoint takes a connection within NEWT_PEER_ETCD_MS (100 ms), or
 *      one takes it and answers nothing within ten times that (a loaded etcd is slow, not
 *      away); when it answers, the leader's plan comes as usual;
 *   2. every rank of the failed generation is probed at its data-plane address (a worker
 *      holds that socket for life): the ones that refuse the connection are gone (their
 *      process exited); every other rank must accept it. A rank that does not answer (a
 *      stopped process, a dead host, a cut link) proves nothing: then the survivors wait for
 *      etcd as before, since a live rank might be left out;
 *   3. the layout is plan_compute over the survivors, every one with its old rank (the
 *      same inputs on every survivor, so the same plan); ranks it makes spares hand their
 *      state over as donors, as in a leader's plan;
 *   4. the survivors shrink the failed communicator to themselves (comm_shrink: every one
 *      passes the same list of the gone, else none forms), proving a key derived from the
 *      failed generation's and the list, then reorder it to the plan's ranks.
 *
 * The result keeps the generation number: it is a sub-generation of the failed one (the
 * worker counts them in peer_epoch), never a plan in etcd, so there are never two plans of
 * one generation; the leader's next plan, once etcd answers, is the next generation, and
 * the survivors switch to it as to any plan (their reports of the crash are written then).
 * Why it cannot split the job: every live rank of the failed generation is in the new one
 * (a rank is left out only when its process is proven gone), so no second group of the
 * failed generation can form; and a leader decides nothing while etcd is away. The new
 * generation has the standing of any generation whose ranks lost etcd: it trains until etcd
 * answers (docs/elastic.md, "When etcd is away"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/param.h"
#include "common/strutil.h"
#include "job/records.h"
#include "worker/internal.h"

NEWT_PARAM(PeerRecovery, "NEWT_PEER_RECOVERY", 1)
NEWT_PARAM(PeerEtcdMs, "NEWT_PEER_ETCD_MS", 100)
NEWT_PARAM(PeerProbeMs, "NEWT_PEER_PROBE_MS", 200)
/* A link is well when it carries NEWT_LINK_PROBE_BYTES (spread over the ranks timed) within
 * NEWT_LINK_PROBE_MS, NEWT_LINK_WELL_ROUNDS probes in a row (0 bytes: not timed) */
NEWT_PARAM(LinkProbeBytes, "NEWT_LINK_PROBE_BYTES", 1048576)
NEWT_PARAM(LinkProbeMs, "NEWT_LINK_PROBE_MS", 1000)
NEWT_PARAM(LinkWellRounds, "NEWT_LINK_WELL_ROUNDS", 3)

newt_result_t worker_generation_key(const worker *w, const newt_plan *p, unsigned char *key, size_t *len) {
  if (w->job_secret) { /* the plan's secret is only a salt: the key is the job secret's */
    *len = COMM_KEY_BYTES;
    return comm_derive_secret(w->job_secret, w->job_secret_len, w->o.job, p->generation, p->secret, sizeof p->secret,
                              key);
  }
  memcpy(key, p->secret, sizeof p->secret);
  *len = sizeof p->secret;
  return NEWT_OK;
}

/* 1 when etcd answers a read of the plan (a leader's plan will come: no need to go on without
 * it). Away: no endpoint takes a connection within NEWT_PEER_ETCD_MS, or one takes it and
 * answers nothing for ten times that (a loaded etcd is slow, not away). */
static int etcd_answers(worker *w) {
  char key[256];
  if (job_key(key, sizeof key, w->o.job, JOB_REC_PLAN, 0, NULL) != NEWT_OK) return 1;
  newt_result_t r = NEWT_OK;
  for (int64_t ms = newt_param_PeerEtcdMs(), tries = 0; tries < 2; tries++, ms *= 10) {
    rdzv_etcd_kv kv;
    r = rdzv_etcd_get(w->etcd, key, newt_deadline_in_ms(ms), &kv, NULL);
    if (r == NEWT_OK) rdzv_etcd_kv_free(&kv);
    if (r != NEWT_ERR_TIMEOUT) break; /* answered, refused everywhere, or another error */
  }
  if (r == NEWT_OK || !rdzv_etcd_transient(r)) {
    newt_err_clear();
    return 1;
  }
  NEWT_INFO(WORKER, "%s: generation %llu failed and etcd does not answer (%s): the survivors look for each other",
            w->id, (unsigned long long)w->plan.generation, newt_errmsg());
  newt_err_clear();
  return 0;
}

/* Probes the listeners of p's ranks but ours. */
static newt_result_t probe_plan(const worker *w, const newt_plan *p, int64_t ms, int *state) {
  const char **addrs = calloc((size_t)(p->nranks ? p->nranks : 1), sizeof *addrs);
  NEWT_CHECK_ALLOC(addrs);
  for (int r = 0; r < p->nranks; r++) addrs[r] = strcmp(p->ranks[r].worker, w->id) == 0 ? NULL : p->ranks[r].addr;
  newt_result_t res = comm_probe_listeners(addrs, p->nranks, ms, state);
  free(addrs);
  return res;
}

newt_result_t worker_probe_ranks(worker *w, int64_t ms, int *state) { return probe_plan(w, &w->plan, ms, state); }

/* --- a crash report's second look ------------------------------------------------------------ */

/* When the looks come, in ms after the detection: a dying process's listener closes within
 * milliseconds of its kill, later on a loaded host; the first look leaves the report's own
 * write to etcd the CPU (on 2 cores a look at 5 ms seemed to delay the first report by ~3
 * ms; after a plain crash the plan has come by 10 ms, and no look is taken), the last is at
 * the leader's default report window (fault.report_window_ms), past which it plans anyway. */
static const int64_t recheck_at_ms[] = {10, 30, 60, 100, 200, 300};
#define RECHECK_PROBE_MS 20 /* a listener's kernel answers in microseconds; none: left as it was */

void worker_recheck_free(worker *w) {
  report_recheck *rc = &w->recheck;
  plan_free(&rc->plan);
  free(rc->suspects);
  memset(rc, 0, sizeof *rc);
}

/* Whether rank r of p is on the host of a worker named in accused, and not named itself (a
 * rank named by a closed connection may still listen for a moment: named once is enough). */
static int near_accused(const newt_plan *p, int r, const char *const *accused, int naccused) {
  for (int a = 0; a < naccused; a++)
    if (strcmp(accused[a], p->ranks[r].worker) == 0) return 0;
  for (int a = 0; a < naccused; a++) {
    const plan_rank *k = plan_find(p, accused[a]);
    if (k && strcmp(k->host, p->ranks[r].host) == 0) return 1;
  }
  return 0;
}

void worker_recheck_start(worker *w, const int *state, int hang, const char *const *accused, int naccused,
                          const char *why) {
  worker_recheck_free(w);
  report_recheck *rc = &w->recheck;
  const newt_plan *p = &w->plan;
  if (!state || naccused < 1 || naccused >= JOB_ACCUSE_MAX || p->nranks < 1) return;
  int *s = malloc((size_t)p->nranks * sizeof *s), n = 0;
  for (int r = 0; s && r < p->nranks; r++)
    if (state[r] == 1 && r != w->me->rank && near_accused(p, r, accused, naccused)) s[n++] = r;
  if (!n || plan_copy(&rc->plan, p) != NEWT_OK) {
    free(s);
    newt_err_clear();
    return;
  }
  rc->suspects = s;
  rc->nsuspects = n;
  rc->hang = hang;
  snprintf(rc->why, sizeof rc->why, "%s", why ? why : "");
  for (int a = 0; a < naccused; a++) snprintf(rc->accused[rc->naccused++], sizeof rc->accused[0], "%s", accused[a]);
}

int64_t worker_recheck(worker *w) {
  report_recheck *rc = &w->recheck;
  int nlooks = (int)(sizeof recheck_at_ms / sizeof recheck_at_ms[0]);
  if (!rc->nsuspects || rc->looks >= nlooks) {
    worker_recheck_free(w);
    return -1;
  }
  uint64_t now = newt_wall_ms(), due = w->t_detect + (uint64_t)recheck_at_ms[rc->looks];
  if (now < due) return (int64_t)(due - now);
  rc->looks++;
  const char **addrs = calloc((size_t)rc->nsuspects, sizeof *addrs);
  int *state = calloc((size_t)rc->nsuspects, sizeof *state);
  int named = 0;
  for (int i = 0; addrs && state && i < rc->nsuspects; i++) addrs[i] = rc->plan.ranks[rc->suspects[i]].addr;
  if (addrs && state && comm_probe_listeners(addrs, rc->nsuspects, RECHECK_PROBE_MS, state) == NEWT_OK) {
    int kept = 0;
    for (int i = 0; i < rc->nsuspects; i++) {
      if (state[i] == 0 && rc->naccused < JOB_ACCUSE_MAX) { /* refused: gone since the first look */
        snprintf(rc->accused[rc->naccused++], sizeof rc->accused[0], "%s", rc->plan.ranks[rc->suspects[i]].worker);
        named++;
      } else {
        rc->suspects[kept++] = rc->suspects[i];
      }
    }
    rc->nsuspects = kept;
  }
  newt_err_clear();
  free(addrs);
  free(state);
  if (named) {
    const char *accused[JOB_ACCUSE_MAX];
    for (int a = 0; a < rc->naccused; a++) accused[a] = rc->accused[a];
    worker_report(w, &rc->plan, rc->hang, 0, accused, rc->naccused, rc->why);
  }
  return worker_recheck(w); /* the next look, or none */
}

/* --- a worker left out proves its links --------------------------------------------------- */

/* Times the links to up to LINKS_TIMED ranks of p spread over it (each gets its part of
 * NEWT_LINK_PROBE_BYTES, all at once: comm_time_links) and keeps each one's streak of well
 * rounds (its part came through within NEWT_LINK_PROBE_MS). Returns how many were not well
 * this round (slower, or no answer); *pending, how many were but not yet
 * NEWT_LINK_WELL_ROUNDS rounds in a row; *worst, this round's slowest time (ms; -1: one did
 * not answer), to worker `at`. */
static int time_links(worker *w, links_proof *lp, const newt_plan *p, int *pending, double *worst, char *at,
                      size_t cap) {
  *pending = 0;
  *worst = 0;
  at[0] = '\0';
  int64_t bytes = newt_param_LinkProbeBytes();
  if (bytes <= 0) return 0;
  if (lp->timed_gen != p->generation) {
    memset(lp->well, 0, sizeof lp->well);
    lp->timed_gen = p->generation;
  }
  int n = p->nranks < LINKS_TIMED ? p->nranks : LINKS_TIMED, idx[LINKS_TIMED];
  const char *addrs[LINKS_TIMED];
  double ms[LINKS_TIMED];
  for (int k = 0; k < n; k++) {
    idx[k] = (int)((int64_t)k * p->nranks / n);
    addrs[k] = strcmp(p->ranks[idx[k]].worker, w->id) == 0 ? NULL : p->ranks[idx[k]].addr;
  }
  size_t each = (size_t)bytes / (size_t)n;
  if (each > COMM_LINK_PROBE_MAX) each = COMM_LINK_PROBE_MAX;
  if (comm_time_links(addrs, n, each, newt_param_LinkProbeMs(), ms) != NEWT_OK) {
    newt_err_clear();
    *pending = 1; /* nothing learnt (no memory): nothing said, the next round */
    return 0;
  }
  int slow = 0;
  for (int k = 0; k < n; k++) {
    if (!addrs[k]) continue;
    int well = ms[k] >= 0 && ms[k] <= (double)newt_param_LinkProbeMs();
    lp->well[k] = well ? lp->well[k] + 1 : 0;
    slow += !well;
    *pending += well && lp->well[k] < newt_param_LinkWellRounds();
    if (*worst >= 0 && (ms[k] < 0 || ms[k] > *worst)) {
      *worst = ms[k];
      snprintf(at, cap, "%s", p->ranks[idx[k]].worker);
    }
  }
  return slow;
}

void worker_prove_links(worker *w, links_proof *lp) {
  uint64_t now = newt_wall_ms();
  if (now < lp->next_ms) return;
  lp->next_ms = now + (uint64_t)newt_param_PeerProbeMs();
  newt_plan p;
  pthread_mutex_lock(&w->mu);
  /* only a worker that was a rank and lost its registration since (the leader fenced it: it
     may hold it out), of a plan that leaves it out, until all of that plan's ranks answered */
  int said_all = w->latest.generation == lp->gen && lp->ok;
  int due = w->gen > 0 && atomic_load(&w->renewed) && w->latest.nranks > 0 && !said_all &&
            !plan_find(&w->latest, w->id) && !plan_find_donor(&w->latest, w->id);
  newt_result_t r = due ? plan_copy(&p, &w->latest) : NEWT_OK;
  pthread_mutex_unlock(&w->mu);
  if (!due || r != NEWT_OK) return;
  int *state = calloc((size_t)p.nranks, sizeof *state), answered = 0;
  if (state && probe_plan(w, &p, newt_param_PeerProbeMs(), state) == NEWT_OK)
    for (int k = 0; k < p.nranks; k++) answered += state[k] >= 0 || strcmp(p.ranks[k].worker, w->id) == 0;
  free(state);
  /* answering is not enough: a link that drops or crawls answers a connect and stalls the
     job again once a plan takes it back (a flapping worker); its data must go through, round
     after round */
  double worst = 0;
  char at[NEWT_ID_MAX] = "";
  int pending = 0, slow = answered == p.nranks ? time_links(w, lp, &p, &pending, &worst, at, sizeof at) : 0;
  int ok = answered == p.nranks && slow == 0;
  /* well so far, not yet for long enough: nothing to say (a worker held out for a failed
     build that says "not well" and then "well" would look like a cut that healed) */
  if (ok && pending) {
    plan_free(&p);
    return;
  }
  if (p.generation != lp->gen || ok != lp->ok) { /* news: once a plan, and when it changes */
    job_links l = {.generation = (int64_t)p.generation, .answered = answered, .ranks = p.nranks, .t_ms = newt_wall_ms(),
                   .slow = slow};
    worker_publish_links(w, &l);
    if (ok)
      NEWT_INFO(WORKER, "%s: left out of generation %llu, and every one of its ranks answers on the data plane, its "
                "links well: said so", w->id, (unsigned long long)p.generation);
    else if (slow)
      NEWT_INFO(WORKER, "%s: left out of generation %llu; its ranks answer, but its links to %d of them are not well "
                "(the slowest, to %s: its part of %lld bytes took %s%.0f ms; well: within %lld ms, %lld probes in a "
                "row): said so; trying again every %lld ms", w->id, (unsigned long long)p.generation, slow, at,
                (long long)newt_param_LinkProbeBytes(), worst < 0 ? "more than " : "",
                worst < 0 ? (double)newt_param_LinkProbeMs() : worst, (long long)newt_param_LinkProbeMs(),
                (long long)newt_param_LinkWellRounds(), (long long)newt_param_PeerProbeMs());
    else
      NEWT_INFO(WORKER, "%s: left out of generation %llu, and %d of its %d ranks do not answer on the data plane (a cut "
                "link?): said so; trying again every %lld ms", w->id, (unsigned long long)p.generation,
                p.nranks - answered, p.nranks, (long long)newt_param_PeerProbeMs());
    lp->gen = p.generation;
    lp->ok = ok;
  }
  plan_free(&p);
}

/* Which ranks of the failed generation are gone (gone[r] = 1): 0 unless every other rank
 * either refused (gone) or accepted (alive), and at least one is gone. */
static int find_gone(worker *w, int *gone, int *ngone) {
  const newt_plan *b = &w->plan;
  if (worker_probe_ranks(w, newt_param_PeerProbeMs(), gone) != NEWT_OK) return 0;
  *ngone = 0;
  for (int r = 0; r < b->nranks; r++) {
    if (r == w->me->rank) {
      gone[r] = 0;
      continue;
    }
    if (gone[r] < 0) {
      NEWT_WARN(WORKER, "%s: rank %d (%s at %s) did not answer within %lld ms: it may be alive, so the survivors "
                "wait for etcd", w->id, r, b->ranks[r].worker, b->ranks[r].addr, (long long)newt_param_PeerProbeMs());
      return 0;
    }
    gone[r] = !gone[r]; /* probe: 1 alive, 0 refused */
    *ngone += gone[r];
  }
  if (!*ngone) NEWT_INFO(WORKER, "%s: every rank of generation %llu still listens (not a crash): waiting for etcd",
                         w->id, (unsigned long long)b->generation);
  return *ngone > 0;
}

/* The survivors' plan: plan_compute over them with their old ranks; ranks it leaves out
 * become donors. Same generation, secret derived from the failed one's and the gone. */
static newt_result_t survivors_plan(worker *w, const int *gone, newt_plan *out) {
  const newt_plan *b = &w->plan;
  plan_member *m = calloc((size_t)b->nranks, sizeof *m);
  NEWT_CHECK_ALLOC(m);
  int n = 0;
  for (int r = 0; r < b->nranks; r++) {
    if (gone[r]) continue;
    const plan_rank *k = &b->ranks[r];
    plan_member *e = &m[n++];
    snprintf(e->id, sizeof e->id, "%s", k->worker);
    snprintf(e->host, sizeof e->host, "%s", k->host);
    snprintf(e->addr, sizeof e->addr, "%s", k->addr);
    snprintf(e->domain, sizeof e->domain, "%s", k->domain);
    e->join_rev = r;
    e->prev_rank = r;
    e->prev_pp = k->pp;
    e->has_state = 1;
  }
  newt_result_t res = plan_compute(&w->spec, m, n, b->generation - 1, out);
  for (int i = 0; res == NEWT_OK && i < n; i++)
    if (!plan_find(out, m[i].id)) res = plan_add_donor(out, m[i].id, m[i].host, m[i].addr);
  free(m);
  if (res != NEWT_OK) {
    plan_free(out);
    return res;
  }
  out->generation = b->generation;
  out->created_ms = b->created_ms;
  out->step = w->committed_step;
  snprintf(out->cause, sizeof out->cause, "crash");
  snprintf(out->switch_mode, sizeof out->switch_mode, "abort");
  /* the salt: HMAC(failed generation's salt, "peers" | epoch | the gone ranks) */
  unsigned char list[4 + 4 * 64], mac[COMM_KEY_BYTES];
  size_t len = 0;
  uint32_t epoch = (uint32_t)w->peer_epoch + 1;
  memcpy(list, &epoch, 4), len = 4;
  for (int r = 0; r < b->nranks && len + 4 <= sizeof list; r++)
    if (gone[r]) memcpy(list + len, &r, 4), len += 4;
  res = comm_derive_secret(b->secret, sizeof b->secret, "newt-peers", b->generation, list, len, mac);
  if (res != NEWT_OK) {
    plan_free(out);
    return res;
  }
  memcpy(out->secret, mac, sizeof out->secret < sizeof mac ? sizeof out->secret : sizeof mac);
  return NEWT_OK;
}

/* The index of `id` in p's communicator (ranks, then donors), -1 when none. */
static int member_index(const newt_plan *p, const char *id) {
  const plan_rank *r = plan_find(p, id);
  if (r) return r->rank;
  r = plan_find_donor(p, id);
  return r ? r->rank : -1;
}

int worker_peer_recover(worker *w, newt_plan *out, comm_t **all, comm_t **parent) {
  *all = *parent = NULL;
  if (!newt_param_PeerRecovery() || !w->all || !w->me || w->plan.ndonors || w->plan.nranks < 2) return 0;
  comm_status st;
  comm_get_status(w->all, &st);
  if (st.code == NEWT_ERR_ABORTED) return 0; /* dropped for a newer plan, or a member's lease lapsed */
  pthread_mutex_lock(&w->mu);
  int newer = w->latest.generation > w->gen;
  pthread_mutex_unlock(&w->mu);
  if (newer || etcd_answers(w)) return 0;
  const newt_plan *b = &w->plan;
  int *gone = calloc((size_t)b->nranks, sizeof *gone), ngone = 0;
  if (!gone || !find_gone(w, gone, &ngone)) {
    free(gone);
    return 0;
  }
  int *ex = calloc((size_t)ngone, sizeof *ex), nex = 0;
  newt_result_t r = ex ? survivors_plan(w, gone, out) : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  for (int k = 0; ex && k < b->nranks; k++)
    if (gone[k]) ex[nex++] = k;
  unsigned char key[COMM_SECRET_MAX];
  size_t keylen = 0;
  comm_t *s = NULL;
  if (r == NEWT_OK) r = worker_generation_key(w, out, key, &keylen);
  if (r == NEWT_OK) r = comm_shrink(w->all, ex, nex, b->generation, key, keylen, &s);
  /* the shrunk communicator keeps the survivors' old order; the plan's may differ */
  int identity = r == NEWT_OK;
  for (int k = 0; identity && k < comm_size(s); k++) {
    int old = k; /* the k-th survivor's old rank */
    for (int j = 0, seen = -1; j < b->nranks; j++)
      if (!gone[j] && ++seen == k) old = j;
    identity = member_index(out, b->ranks[old].worker) == k;
  }
  if (r == NEWT_OK && !identity) {
    comm_t *c = NULL;
    r = comm_split(s, 0, member_index(out, w->id), &c);
    if (r == NEWT_OK) *all = c, *parent = s;
  } else if (r == NEWT_OK) {
    *all = s;
  }
  if (r != NEWT_OK) {
    NEWT_WARN(WORKER, "%s: the survivors of generation %llu could not go on without etcd (%s): waiting for it", w->id,
              (unsigned long long)b->generation, newt_errmsg());
    comm_free(s);
    plan_free(out);
  } else {
    char names[256] = "";
    for (int k = 0; k < nex; k++) newt_list_add(names, sizeof names, b->ranks[ex[k]].worker);
    w->peer_epoch++;
    /* what the leader reads once etcd answers again (a later write of this key wins) */
    const char *accused[JOB_ACCUSE_MAX];
    int nacc = 0;
    for (int k = 0; k < nex && nacc < JOB_ACCUSE_MAX; k++) accused[nacc++] = b->ranks[ex[k]].worker;
    char why[512];
    snprintf(why, sizeof why, "%s gone (connection refused) while etcd was away: the survivors went on without it "
             "from step %lld as %d ranks (generation %llu, peers %d)", names, (long long)w->done_step,
             out->nranks, (unsigned long long)b->generation, w->peer_epoch);
    worker_report(w, b, 0, 0, accused, nacc, why);
    NEWT_INFO(WORKER, "%s: generation %llu goes on without etcd (peers %d): %d ranks, %d donors, %s gone "
              "(connection refused)", w->id, (unsigned long long)b->generation, w->peer_epoch, out->nranks,
              out->ndonors, names);
  }
  free(gone);
  free(ex);
  return r == NEWT_OK;
}
