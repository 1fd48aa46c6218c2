/* A generation (internal.h): a plan that names this worker a rank, built into the
 * generation's communicator (its ranks, then its donors, over the spec's backend) and its
 * groups (tensor, data and pipeline, in Megatron's order); the spec's fields that may change
 * while the job runs are taken, and the program is asked to declare and restore its state. A
 * build that fails is reported, naming the members whose links were never made. Also the
 * generation's end (its groups freed, every handle of it stale) and the report of a failed
 * collective: whom this rank lost, and every rank whose listener refuses a connection. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/param.h"
#include "job/plan.h"
#include "job/records.h"
#include "job/store.h"
#include "worker/internal.h"

NEWT_PARAM(ReportProbeMs, "NEWT_REPORT_PROBE_MS", 50)  /* a failure report probes the ranks' listeners this long */

/* The generation's communicator: its ranks, then its donors. missing ([ranks + donors], may
 * be NULL) gets, when the build fails, 1 for each member whose links were not made. */
newt_result_t worker_build_comm(worker *w, const newt_plan *p, const plan_rank *me, int *missing, comm_t **out) {
  int n = p->nranks + p->ndonors;
  const char **addrs = calloc((size_t)n, sizeof *addrs);
  const char **hosts = calloc((size_t)n, sizeof *hosts);
  if (!addrs || !hosts) {
    free(addrs);
    free(hosts);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory building a communicator of %d ranks", n);
  }
  for (int r = 0; r < n; r++) {
    const plan_rank *e = r < p->nranks ? &p->ranks[r] : &p->donors[r - p->nranks];
    addrs[r] = e->addr;
    hosts[r] = e->host;
  }
  comm_config cfg;
  memset(&cfg, 0, sizeof cfg);
  /* the spec's backend; on a GPU on the program's stream: collectives follow the work queued
     before them */
  cfg.backend = w->backend->id;
  cfg.stream = w->o.cuda_stream;
  cfg.rank = me->rank;
  cfg.size = n;
  cfg.cancel = &w->build_cancel;
  cfg.peers_listen = 1; /* every worker holds its data-plane socket for life */
  pthread_mutex_lock(&w->mu);
  atomic_store(&w->build_cancel, w->latest.generation > p->generation); /* already moot? */
  pthread_mutex_unlock(&w->mu);
  cfg.addrs = addrs;
  cfg.hosts = hosts;
  cfg.job = w->o.job;
  cfg.generation = p->generation;
  newt_result_t r = worker_generation_key(w, p, cfg.secret, &cfg.secret_len);
  cfg.timeout_ms = w->spec.comm_timeout_ms;
  cfg.device = w->device >= 0 ? w->device : 0;
  cfg.listen_fd = w->listen_fd;
  cfg.missing = missing;
  if (r == NEWT_OK) r = comm_create(&cfg, out);
  free(addrs);
  free(hosts);
  return r;
}

/* The worker id of member r of p (its ranks, then its donors), or NULL. */
static const char *member_id(const newt_plan *p, int r) {
  return r >= 0 && r < p->nranks                        ? p->ranks[r].worker
         : r >= p->nranks && r < p->nranks + p->ndonors ? p->donors[r - p->nranks].worker
                                                        : NULL;
}

/* Reports a failed collective: the communicator says whom it lost and how, and every other
 * rank whose listener refuses a connection is gone too (several processes lost at once: a
 * host's workers, an OOM kill), so the leader need not wait out the report window for ranks
 * nobody named. */
void worker_report_failure(worker *w) {
  comm_status st;
  comm_get_status(w->all, &st);
  if (st.code == NEWT_ERR_ABORTED) return; /* we dropped it for a newer plan: nothing to report */
  const char *accused[JOB_ACCUSE_MAX];
  int n = 0;
  if (member_id(&w->plan, st.peer)) accused[n++] = member_id(&w->plan, st.peer);
  int *state = calloc((size_t)(w->plan.nranks ? w->plan.nranks : 1), sizeof *state);
  /* and every rank whose listener refuses a connection (gone) or takes none within the
     probe's time (a cut link, a host down: a listener's kernel answers for a stopped or busy
     process): a cut names the whole other side, so the leader sees the partition at once */
  if (state && worker_probe_ranks(w, newt_param_ReportProbeMs(), state) == NEWT_OK)
    for (int r = 0; r < w->plan.nranks && n < JOB_ACCUSE_MAX; r++)
      if (state[r] != 1 && r != st.peer && r != w->me->rank) accused[n++] = w->plan.ranks[r].worker;
  newt_err_clear();
  worker_report(w, &w->plan, st.code == NEWT_ERR_TIMEOUT, 0, accused, n, st.msg);
  worker_recheck_start(w, state, st.code == NEWT_ERR_TIMEOUT, accused, n, st.msg); /* while the plan is awaited */
  free(state);
}

newt_comm *worker_comm_handle(worker *w, comm_t *c, int own) {
  if (!c) return NULL;
  newt_comm *h = calloc(1, sizeof *h);
  if (!h) return NULL;
  *h = (newt_comm){.magic = WORKER_COMM_MAGIC, .w = w, .generation = w->plan.generation, .c = c, .own = own,
                   .next = w->comms};
  w->comms = h;
  comm_t *hc = comm_host_channel(c);
  if (hc == c) {
    h->host = h;
  } else if ((h->host = calloc(1, sizeof *h->host)) != NULL) {
    *h->host = (newt_comm){.magic = WORKER_COMM_MAGIC, .w = w, .generation = h->generation, .c = hc, .next = w->comms};
    h->host->host = h->host;
    w->comms = h->host;
  }
  return h;
}

/* The generation's groups: the ranks' own (donors split off), then the tensor, data and
 * pipeline groups in Megatron's order, rank = (pp_rank * dp + dp_rank) * tp + tp_rank. */
static newt_result_t build_groups(worker *w) {
  const newt_plan *p = &w->plan;
  int rank = w->me->rank;
  w->tp_rank = rank % p->tp;
  w->dp_rank = (rank / p->tp) % p->dp;
  w->pp_rank = rank / (p->tp * p->dp);
  if (p->ndonors) NEWT_CHECK(comm_split(w->all, 0, rank, &w->train)); /* donors only take part in the restore */
  else w->train = w->all;
  const struct {
    int size, color, key;
    comm_t **dst;
  } groups[] = {{p->tp, w->pp_rank * p->dp + w->dp_rank, w->tp_rank, &w->tp},
                {p->dp, w->pp_rank * p->tp + w->tp_rank, w->dp_rank, &w->dp},
                {p->pp, w->dp_rank * p->tp + w->tp_rank, w->pp_rank, &w->pp}};
  for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++)
    if (groups[i].size > 1) NEWT_CHECK(comm_split(w->train, groups[i].color, groups[i].key, groups[i].dst));
  w->h_world = worker_comm_handle(w, w->train, 0);
  w->h_tp = worker_comm_handle(w, w->tp, 0);
  w->h_dp = worker_comm_handle(w, w->dp, 0);
  w->h_pp = worker_comm_handle(w, w->pp, 0);
  return NEWT_OK;
}

/* Ends the generation: its groups freed, every handle of it stale. */
void worker_end_generation(worker *w) {
  pthread_mutex_lock(&w->mu);
  w->comm = NULL;
  pthread_mutex_unlock(&w->mu);
  /* the program's own splits first (children of these), then ours, children before parents */
  for (newt_comm *h = w->comms; h; h = h->next)
    if (h->c && h->own) comm_free(h->c);
  for (newt_comm *h = w->comms; h; h = h->next) h->c = NULL;
  comm_free(w->pp), comm_free(w->dp), comm_free(w->tp);
  if (w->train && w->train != w->all) comm_free(w->train);
  comm_free(w->all);
  comm_free(w->peer_parent); /* what `all` was split from, when the survivors made it */
  w->pp = w->dp = w->tp = w->train = w->all = w->peer_parent = NULL;
  w->h_world = w->h_tp = w->h_dp = w->h_pp = NULL;
  w->step = STEP_IDLE;
  atomic_store(&w->step_started, 0);
}

/* A plan made for a changed spec (cause "spec"), or one after generations this worker did
 * not see: the spec in etcd may have changed, and the fields that can change while the job
 * runs (checkpoint cadence, timeouts) are taken here, at the generation's start. */
static void refresh_spec(worker *w, const newt_plan *p) {
  if (strcmp(p->cause, "spec") != 0 && p->generation <= w->gen + 1) return;
  char *text = NULL;
  if (job_spec_get(w->etcd, w->o.job, newt_deadline_in_ms(1000), &text) != NEWT_OK) return;
  newt_spec s;
  char what[512];
  if (spec_from_json(text, strlen(text), &s) == NEWT_OK && memcmp(&s, &w->spec, sizeof s) != 0) {
    if (spec_update_allowed(&w->spec, &s, what, sizeof what)) {
      w->spec = s;
      free(w->spec_json);
      w->spec_json = text;
      text = NULL;
      NEWT_INFO(WORKER, "%s: took the changed spec: %s", w->id, what);
    } else {
      NEWT_ERROR(WORKER, "%s: ignoring the spec in etcd: %s", w->id, newt_errmsg());
    }
  }
  free(text);
}

/* The generation's groups are built (or kept, restart_generation): the declaration that holds
 * the state becomes the source of the next one's restore (one made for a generation that never
 * restored holds nothing: dropped), and the program declares and restores. */
void worker_await_declaration(worker *w) {
  if (w->state_in_decl) {
    worker_decl_free(&w->prev);
    w->prev = w->decl;
    w->state_in_decl = 0;
  } else {
    worker_decl_free(&w->decl);
  }
  memset(&w->decl, 0, sizeof w->decl);
  w->restore_err[0] = '\0';
  w->phase = PHASE_BUILT;
}

/* Builds the generation of plan p (this worker a rank of it): 1 when it stands (PHASE_BUILT),
 * 0 when it never formed (reported; back to waiting). built: its communicator, already made
 * (the survivors' own generation, worker/peers.c; parent: what it was split from), else
 * NULL: built here. */
int worker_start_generation(worker *w, newt_plan *p, comm_t *built, comm_t *parent) {
  if (!built) { /* a leader's plan */
    w->peer_epoch = 0;
    w->leader_gen = p->generation;
    memcpy(w->leader_salt, p->secret, sizeof w->leader_salt);
  }
  refresh_spec(w, p);
  atomic_store(&w->switch_pending, 0);
  w->t_plan_seen = newt_wall_ms();
  plan_free(&w->plan);
  w->plan = *p;
  memset(p, 0, sizeof *p);
  w->me = plan_find(&w->plan, w->id);
  int n = w->plan.nranks + w->plan.ndonors;
  int *missing = calloc((size_t)n, sizeof *missing);
  newt_result_t r = NEWT_OK;
  if (built) w->all = built, w->peer_parent = parent;
  else r = missing ? worker_build_comm(w, &w->plan, w->me, missing, &w->all) : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  pthread_mutex_lock(&w->mu);
  w->gen = w->plan.generation;
  w->comm = w->all;
  /* a newer plan may have come while we built: honour it now */
  if (w->all && w->latest.generation > w->plan.generation) {
    if (worker_plan_drops_now(&w->latest, w->id)) comm_abort(w->all);
    else atomic_store(&w->switch_pending, 1);
  }
  pthread_mutex_unlock(&w->mu);
  if (r == NEWT_OK) r = build_groups(w);
  if (r != NEWT_OK) {
    /* some rank never came: say so, so the leader need not wait for its lease to run out
       (the ranks that do not report are the ones that did not come) */
    w->t_detect = newt_wall_ms();
    char why[512];
    snprintf(why, sizeof why, "building generation %llu: %s", (unsigned long long)w->plan.generation, newt_errmsg());
    pthread_mutex_lock(&w->mu);
    int newer = w->latest.generation > w->plan.generation;
    pthread_mutex_unlock(&w->mu);
    /* whom to blame: the members whose links were never made (a peer that could not prove
       the generation's key counts), at most JOB_ACCUSE_MAX */
    const char *accused[JOB_ACCUSE_MAX];
    int naccused = 0;
    for (int k = 0; missing && k < n && naccused < JOB_ACCUSE_MAX; k++)
      if (missing[k] && member_id(&w->plan, k)) accused[naccused++] = member_id(&w->plan, k);
    if (!newer) worker_report(w, &w->plan, r == NEWT_ERR_TIMEOUT, 1, accused, naccused, why);
    free(missing);
    worker_end_generation(w);
    return 0;
  }
  free(missing);
  w->t_comm = newt_wall_ms();
  metrics_add(w->metrics, "newt_worker_communicator_builds_total", 1);
  metrics_set(w->metrics, "newt_worker_generation", (double)w->plan.generation);
  metrics_set(w->metrics, "newt_worker_rank", (double)w->me->rank);
  worker_label_metrics(w, w->me->rank);
  char sub[32] = ""; /* one the survivors made without etcd: "generation G (peers E)" */
  if (w->peer_epoch) snprintf(sub, sizeof sub, " (peers %d)", w->peer_epoch);
  NEWT_INFO(WORKER, "%s: generation %llu%s: rank %d of %d (tp %d, pp %d, dp %d, zero %d, accum %lld)", w->id,
            (unsigned long long)w->plan.generation, sub, w->me->rank, w->plan.nranks, w->plan.tp, w->plan.pp,
            w->plan.dp, w->plan.zero, (long long)w->plan.accum);
  worker_await_declaration(w);
  return 1;
}
