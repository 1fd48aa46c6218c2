/* A worker's life under the program's step loop (internal.h; newt.h is the contract).
 *
 * Threads: the program's thread calls in (join, begin, commit, end, finish) and does all
 * the work of a generation; the plan watch (an etcd watch on /newt/<job>/plan) keeps the
 * newest plan and, when it asks to drop the running step (switch "abort"), aborts the
 * communicator so a pending collective returns at once; a publisher thread writes what need
 * not hold up a step (progress, acks, registration state) to etcd.
 *
 * The protocol. newt_step_begin drives everything between steps: the first call registers;
 * while no plan names this worker a rank it waits (a spare); a plan that does is built into
 * a generation (its communicator, its tensor, data and pipeline groups) and handed to the
 * program (NEXT_GENERATION), which declares its state and restores it. Then each begin hands
 * out a step and this rank's samples; commit agrees on the step over the world (with the
 * control values: a rank asks to leave, a newer plan asks to switch) and snapshots the
 * state before the update; end does what follows a step (the replica, a checkpoint,
 * progress, the step log). A failed collective anywhere makes the next begin report whom
 * this rank lost, end the generation and wait for the next plan; a leave agreed at a commit
 * makes it hand this rank's state over (as a donor of the next plan) and say NEXT_LEFT. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/clock.h"
#include "common/fs.h"
#include "common/json.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/param.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "job/ending.h"
#include "job/plan.h"
#include "job/records.h"
#include "job/runlog.h"
#include "rendezvous/rdzv.h"
#include "worker/internal.h"

NEWT_PARAM(StallMultiple, "NEWT_STALL_MULTIPLE", 3)   /* the stall deadline: this many times ... */
NEWT_PARAM(StallFloorMs, "NEWT_STALL_FLOOR_MS", 250)  /* ... the 95th percentile of the step times, at least this */
NEWT_PARAM(ReportProbeMs, "NEWT_REPORT_PROBE_MS", 50)  /* a failure report probes the ranks' listeners this long */

/* --- setup ------------------------------------------------------------------------------ */

/* The data-plane socket: bound once to addr:port (port 0: any free one) and held for the
 * whole life of the worker, so the address it registers stays its own across generations;
 * each generation's communicator listens on it. */
static newt_result_t bind_listener(const char *addr, int port, int *fd_out, int *port_out) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
    return NEWT_ERR(NEWT_ERR_INVALID, "--addr: \"%s\" is not an IPv4 address (newt_join_opts.addr, NEWT_ADDR)", addr);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1;
  socklen_t len = sizeof sa;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 256) != 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    return NEWT_ERR(NEWT_ERR_SYS, "addr %s, port %d: cannot listen for the data plane: %s", addr, port,
                    strerror(e));
  }
  *fd_out = fd;
  *port_out = ntohs(sa.sin_port);
  return NEWT_OK;
}

/* --- the plan watch ------------------------------------------------------------------------ */

/* Whether plan p ends the running generation at once rather than at the next step
 * boundary: it says so, or it has nothing for us to do (a plan naming us a donor lets the
 * step finish: we leave after it, state in hand). */
static int drops_now(const newt_plan *p, const char *id) {
  return strcmp(p->switch_mode, "abort") == 0 || (!plan_find(p, id) && !plan_find_donor(p, id));
}

/* A plan from etcd, taken when it is newer than the newest one here and agrees with the
 * job's spec; a forged or corrupt one is ignored (logged) and the generation goes on. A
 * worker that has not taken up any generation yet follows the record as etcd orders it: a
 * lower generation after a higher one is the leader putting its plan back over a forged one
 * that this worker, knowing no generation, could not tell from a real one. */
static void take_plan(worker *w, const char *json, size_t len) {
  newt_plan p;
  if (plan_from_json(json, len, &p) != NEWT_OK) {
    NEWT_WARN(WORKER, "%s: ignoring a plan: %s", w->id, newt_errmsg());
    return;
  }
  pthread_mutex_lock(&w->mu);
  uint64_t have = w->latest.generation;
  int newer = p.generation > have || (w->gen == 0 && p.generation < have);
  newt_result_t ok = newer ? plan_check_spec(&p, &w->spec) : NEWT_OK;
  if (ok == NEWT_OK && newer) ok = plan_check_jump(w->gen ? have : 0, p.generation);
  if (ok != NEWT_OK) {
    pthread_mutex_unlock(&w->mu);
    NEWT_WARN(WORKER, "%s: ignoring a plan: %s", w->id, newt_errmsg());
    plan_free(&p);
    return;
  }
  if (newer) {
    plan_free(&w->latest);
    w->latest = p;
    /* a generation still building its communicator has no step to finish: it gives way */
    if (!w->comm) atomic_store(&w->build_cancel, 1);
    if (w->comm && p.generation > w->gen) {
      if (drops_now(&p, w->id)) {
        NEWT_INFO(WORKER, "%s: plan %llu (%s) drops generation %llu now", w->id,
                  (unsigned long long)p.generation, p.cause, (unsigned long long)w->gen);
        comm_abort(w->comm);
      } else {
        atomic_store(&w->switch_pending, 1);
      }
    }
    pthread_cond_broadcast(&w->cv);
  } else {
    plan_free(&p);
  }
  pthread_mutex_unlock(&w->mu);
}

static void on_plan(void *ud, const rdzv_etcd_watch_resp *r) {
  worker *w = ud;
  if (r->kind == RDZV_WATCH_EVENTS) {
    for (size_t i = 0; i < r->n_events; i++)
      if (r->events[i].type == RDZV_EVENT_PUT) take_plan(w, r->events[i].kv.value, r->events[i].kv.value_len);
  } else if (r->kind == RDZV_WATCH_RESYNC) {
    for (size_t i = 0; i < r->n_kvs; i++) take_plan(w, r->kvs[i].value, r->kvs[i].value_len);
  }
}

/* The plan as it is, then every change after the revision it was read at: no plan can
 * slip between the read and the watch (also when there was none yet). */
static newt_result_t start_plan_watch(worker *w) {
  char key[256];
  NEWT_CHECK(job_key(key, sizeof key, w->o.job, JOB_REC_PLAN, 0, NULL));
  rdzv_etcd_kv kv;
  int64_t rev = 0;
  newt_result_t r = rdzv_etcd_get(w->etcd, key, job_call_deadline(), &kv, &rev);
  if (r == NEWT_OK) {
    take_plan(w, kv.value, kv.value_len);
    rdzv_etcd_kv_free(&kv);
  } else if (r != NEWT_ERR_NOTFOUND) {
    return r;
  }
  rdzv_etcd_watch_opts wo = {.start_revision = rev + 1, .progress_notify = 1};
  return rdzv_etcd_watch_start(w->etcd, key, &wo, on_plan, w, job_call_deadline(), &w->plan_watch);
}

/* --- waiting for a plan ------------------------------------------------------------------- */

/* Every series this worker serves carries its id and rank (rank -1: "", none: before its
 * first generation, or a spare), so that a new rank moves them all. */
static newt_result_t label_metrics(worker *w, int rank) {
  char r[16] = "";
  if (rank >= 0) snprintf(r, sizeof r, "%d", rank);
  metrics_label l[] = {{"worker", w->id}, {"rank", r}};
  return metrics_set_const_labels(w->metrics, l, 2);
}

typedef enum wait_outcome { WAIT_PLAN, WAIT_LEAVE, WAIT_DONE, WAIT_FAILED } wait_outcome;

static void donate(worker *w, newt_plan *p);

/* Waits for a plan newer than our generation in which we are a rank (donor: a donor);
 * meanwhile notices a leave asked for and the end of the job. A rank gives up (WAIT_LEAVE) at
 * until, a donor at its own bound. */
static newt_result_t wait_plan(worker *w, int donor, newt_deadline_t until, newt_plan *out, wait_outcome *how) {
  uint64_t spare_gen = 0;
  uint64_t next_done_check = 0;
  links_proof links = {0};
  /* a leaver waits (bounded: it must exit well within a pod's grace period) for the plan
     that names it a donor; the leader publishes it within milliseconds, or after a
     leadership change within a lease TTL */
  int64_t donor_wait = 3 * w->spec.lease_ttl_ms + 5000;
  if (donor_wait > 10000) donor_wait = 10000;
  newt_deadline_t give_up = donor ? newt_deadline_in_ms(donor_wait) : until;
  int64_t recheck_ms = donor ? -1 : worker_recheck(w); /* the last crash report's next look */
  for (;;) {
    if ((!donor && worker_stop_asked(w)) || newt_deadline_passed(give_up)) {
      *how = WAIT_LEAVE;
      return NEWT_OK;
    }
    pthread_mutex_lock(&w->mu);
    if (w->latest.generation > w->gen) {
      const plan_rank *me = donor ? plan_find_donor(&w->latest, w->id) : plan_find(&w->latest, w->id);
      if (me) {
        newt_result_t r = plan_copy(out, &w->latest);
        pthread_mutex_unlock(&w->mu);
        NEWT_CHECK(r);
        if (!donor) atomic_store(&w->renewed, 0); /* taken in: nothing to prove any more */
        *how = WAIT_PLAN;
        return NEWT_OK;
      }
      if (!donor && spare_gen != w->latest.generation) {
        spare_gen = w->latest.generation;
        /* a spare of this plan that was a rank of the last one: it hands the ranks what
           they need of its state first (the leader named it a donor) */
        newt_plan give;
        int donates = w->has_state && plan_find_donor(&w->latest, w->id) && plan_copy(&give, &w->latest) == NEWT_OK;
        pthread_mutex_unlock(&w->mu);
        worker_set_state_async(w, "spare");
        label_metrics(w, -1);
        if (donates) {
          donate(w, &give);
          plan_free(&give);
        }
        continue;
      }
    }
    worker_wait_cv(w, recheck_ms >= 0 && recheck_ms < 50 ? (int)recheck_ms : 50);
    pthread_mutex_unlock(&w->mu);
    if (!donor) worker_prove_links(w, &links);
    if (recheck_ms >= 0) recheck_ms = worker_recheck(w);
    uint64_t now = newt_wall_ms();
    if (now >= next_done_check) {
      next_done_check = now + 500;
      if (job_done_get(w->etcd, w->o.job, &w->spec, &w->auth, &w->end_marker)) {
        w->have_end_marker = 1;
        *how = WAIT_DONE;
        return NEWT_OK;
      }
      job_failed f;
      if (!donor && job_has_failed(w->etcd, w->o.job, &f)) {
        w->failed = 1;
        snprintf(w->failed_why, sizeof w->failed_why, "%s", f.why);
        *how = WAIT_FAILED;
        return NEWT_OK;
      }
    }
  }
}

/* --- a generation's communicator ---------------------------------------------------------- */

/* The generation's communicator: its ranks, then its donors. missing ([ranks + donors], may
 * be NULL) gets, when the build fails, 1 for each member whose links were not made. */
static newt_result_t build_comm(worker *w, const newt_plan *p, const plan_rank *me, int *missing, comm_t **out) {
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
static void report_failure(worker *w) {
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
static void end_generation(worker *w) {
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
static void await_declaration(worker *w) {
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
static int start_generation(worker *w, newt_plan *p, comm_t *built, comm_t *parent) {
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
  else r = missing ? build_comm(w, &w->plan, w->me, missing, &w->all) : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  pthread_mutex_lock(&w->mu);
  w->gen = w->plan.generation;
  w->comm = w->all;
  /* a newer plan may have come while we built: honour it now */
  if (w->all && w->latest.generation > w->plan.generation) {
    if (drops_now(&w->latest, w->id)) comm_abort(w->all);
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
    end_generation(w);
    return 0;
  }
  free(missing);
  w->t_comm = newt_wall_ms();
  metrics_add(w->metrics, "newt_worker_communicator_builds_total", 1);
  metrics_set(w->metrics, "newt_worker_generation", (double)w->plan.generation);
  metrics_set(w->metrics, "newt_worker_rank", (double)w->me->rank);
  label_metrics(w, w->me->rank);
  char sub[32] = ""; /* one the survivors made without etcd: "generation G (peers E)" */
  if (w->peer_epoch) snprintf(sub, sizeof sub, " (peers %d)", w->peer_epoch);
  NEWT_INFO(WORKER, "%s: generation %llu%s: rank %d of %d (tp %d, pp %d, dp %d, zero %d, accum %lld)", w->id,
            (unsigned long long)w->plan.generation, sub, w->me->rank, w->plan.nranks, w->plan.tp, w->plan.pp,
            w->plan.dp, w->plan.zero, (long long)w->plan.accum);
  await_declaration(w);
  return 1;
}

/* --- the step log ---------------------------------------------------------------------------- */

/* The step log (--step-log): rank 0 appends each step's line. Every rank keeps the line of
 * the last step it did, so that when a rank 0 is killed before it wrote its last step's
 * line, the next rank 0 writes it, having done that step too (a line twice is harmless:
 * readers keep one per step). */
static void log_step(worker *w, int rank0, const job_step *line) {
  w->last_step = *line;
  w->last_step_logged = rank0 && w->step_log_fd >= 0;
  if (!w->last_step_logged) return;
  if (job_steplog_append(w->step_log_fd, line) != NEWT_OK) /* the log is for people: training goes on */
    NEWT_WARN(WORKER, "%s: step log %s: %s", w->id, w->o.step_log, newt_errmsg());
}

/* --- leaving ---------------------------------------------------------------------------------- */

/* A donor's generation: build the communicator with the ranks, hand them this worker's
 * state (the parts they need); then it leaves, or waits as a spare. */
static void donate_on(worker *w, newt_plan *p, comm_t *c, comm_t *parent) {
  const plan_rank *me = plan_find_donor(p, w->id);
  comm_t *none = NULL;
  w->gen = p->generation;
  newt_result_t r = c ? NEWT_OK : build_comm(w, p, me, NULL, &c);
  if (r == NEWT_OK) r = comm_split(c, -1, me->rank, &none); /* the ranks' own group */
  if (r == NEWT_OK) r = worker_donate(w, c);
  if (r == NEWT_OK) NEWT_INFO(WORKER, "%s: handed over the state of step %lld", w->id, (long long)w->live_step);
  else NEWT_WARN(WORKER, "%s: handing over its state in generation %llu: %s", w->id, (unsigned long long)p->generation,
                 newt_errmsg());
  if (c) comm_free(c);
  comm_free(parent);
}

static void donate(worker *w, newt_plan *p) { donate_on(w, p, NULL, NULL); }

/* A leaving rank hands its state to the next generation's ranks (they may hold no other
 * copy of its parts) before it goes: the leader names it a donor of the plan without it.
 * A worker the latest plan does not name a rank (a spare) holds nothing anyone needs. */
static void hand_over(worker *w) {
  pthread_mutex_lock(&w->mu);
  int ranked = plan_find(&w->latest, w->id) != NULL;
  int donor = w->latest.generation > w->gen && plan_find_donor(&w->latest, w->id) != NULL;
  pthread_mutex_unlock(&w->mu);
  if (!w->has_state || (!ranked && !donor)) return;
  if (!w->leave_announced) { /* it left between steps: say so, the leader plans without it */
    w->leave_announced = 1;
    worker_set_state_async(w, "leaving");
  }
  newt_plan p;
  wait_outcome wo;
  if (wait_plan(w, 1, NEWT_DEADLINE_NONE, &p, &wo) != NEWT_OK || wo != WAIT_PLAN) {
    NEWT_WARN(WORKER, "%s: no plan took over its state of step %lld", w->id, (long long)w->live_step);
    return;
  }
  donate(w, &p);
  plan_free(&p);
}

/* The worker's part is over: how (NEXT_DONE, LEFT, FAILED, LEFT_OUT). */
static newt_result_t over(worker *w, newt_next how, newt_next *next) {
  w->phase = PHASE_OVER;
  w->over = how;
  *next = how;
  return NEWT_OK;
}

/* --- the step protocol ---------------------------------------------------------------------- */

/* Registers and watches the plan (the first begin). */
static newt_result_t enter(worker *w) {
  NEWT_CHECK(worker_publisher_start(w));
  NEWT_CHECK(worker_register(w));
  for (;;) { /* etcd away: wait for it */
    newt_result_t r = start_plan_watch(w);
    if (r == NEWT_OK) break;
    if (!rdzv_etcd_transient(r) || worker_stop_asked(w)) return r;
    NEWT_WARN(WORKER, "%s: watching the plan: %s (waiting for etcd)", w->id, newt_errmsg());
    newt_sleep_ms(1000);
  }
  NEWT_INFO(WORKER, "%s: registered for job %s at %s (host %s, failure domain %s)", w->id, w->o.job, w->addr, w->host,
            w->domain);
  w->phase = PHASE_WAITING;
  return NEWT_OK;
}

/* Waiting: for a plan naming this worker a rank, a donor's hand-over, or the end. */
static newt_result_t wait_generation(worker *w, newt_next *next) {
  for (;;) {
    newt_plan p;
    wait_outcome wo;
    NEWT_CHECK(wait_plan(w, 0, NEWT_DEADLINE_NONE, &p, &wo));
    switch (wo) {
      case WAIT_DONE: /* without this worker when it trained and was left out: it says so (ended_done) */
        NEWT_INFO(WORKER, "%s: the job is done", w->id);
        return over(w, w->done_step > 0 || w->held_plan.generation > 0 ? NEWT_NEXT_LEFT_OUT : NEWT_NEXT_DONE, next);
      case WAIT_FAILED:
        NEWT_ERROR(WORKER, "%s: the job failed: %s", w->id, w->failed_why);
        return over(w, NEWT_NEXT_FAILED, next);
      case WAIT_LEAVE:
        NEWT_INFO(WORKER, "%s: leaving between generations", w->id);
        hand_over(w);
        return over(w, NEWT_NEXT_LEFT, next);
      case WAIT_PLAN: break;
    }
    int built = start_generation(w, &p, NULL, NULL);
    plan_free(&p);
    if (built) {
      *next = NEWT_NEXT_GENERATION;
      return NEWT_OK;
    }
  }
}

/* The last step was trained in a generation the survivors of a crash made while etcd was away
 * (peers.c): no plan of the leader's names the membership the job ends with, and the crash is
 * in no record. So the end waits for the leader's plan, which follows the survivors' reports
 * once etcd is back (the end marker needs etcd too): its generation is taken up with no step
 * left to train, acknowledged (end_trained), and the end marker follows, so the recovery is
 * recorded and the job ends in a generation of the leader's. At most NEWT_DONE_WAIT_MS: then
 * the job ends as it is, saying so. */
static newt_result_t end_after_leaders_plan(worker *w, newt_next *next) {
  NEWT_INFO(WORKER, "%s: trained the last step (%lld) in generation %llu (peers %d), which no plan of the leader's "
            "names: waiting for the leader's plan (it follows once etcd is back) before the end", w->id,
            (long long)w->live_step, (unsigned long long)w->plan.generation, w->peer_epoch);
  end_generation(w);
  w->phase = PHASE_WAITING;
  newt_deadline_t until = newt_deadline_in_ms(worker_done_wait_ms());
  for (;;) {
    newt_plan p;
    wait_outcome wo;
    NEWT_CHECK(wait_plan(w, 0, until, &p, &wo));
    if (wo == WAIT_DONE) return over(w, NEWT_NEXT_DONE, next);
    if (wo == WAIT_FAILED) {
      NEWT_ERROR(WORKER, "%s: the job failed: %s", w->id, w->failed_why);
      return over(w, NEWT_NEXT_FAILED, next);
    }
    if (wo == WAIT_LEAVE) { /* asked to stop, or no plan came: the job is trained all the same */
      NEWT_WARN(WORKER, "%s: no plan of the leader's came for generation %llu (peers %d)%s: the job ends without its "
                "recovery in the record", w->id, (unsigned long long)w->gen, w->peer_epoch,
                worker_stop_asked(w) ? " before this worker was asked to stop" : "");
      worker_mark_done(w, w->last_loss);
      return over(w, NEWT_NEXT_DONE, next);
    }
    int built = start_generation(w, &p, NULL, NULL);
    plan_free(&p);
    if (built) {
      *next = NEWT_NEXT_GENERATION;
      return NEWT_OK;
    }
  }
}

/* The job's last step is done. A generation taken up with no step left to train (the
 * leader's plan after the survivors' own, end_after_leaders_plan) is acknowledged now, and
 * every rank's acknowledgement is in etcd before any end marker (a barrier after each rank's
 * publisher wrote its own): the leader records the recovery before it sees the end. */
static newt_result_t end_trained(worker *w, newt_next *next) {
  w->trained_last = 1; /* its loss is the job's: every rank has the same (the commit's sums) */
  if (w->peer_epoch) return end_after_leaders_plan(w, next);
  NEWT_INFO(WORKER, "%s: trained the last step (%lld)", w->id, (long long)w->live_step);
  if (w->first_step_of_gen) {
    w->first_step_of_gen = 0;
    w->t_first_step = newt_wall_ms();
    worker_publish_ack(w, NULL);
    worker_publisher_flush(w, newt_deadline_in_ms(w->spec.lease_ttl_ms + 3000));
    if (comm_barrier(comm_host_channel(w->train)) != NEWT_OK) /* a rank lost at the end: its own marker follows */
      NEWT_WARN(WORKER, "%s: waiting for the other ranks' acknowledgements of generation %llu: %s", w->id,
                (unsigned long long)w->plan.generation, newt_errmsg());
  }
  /* the job's last state in its checkpoint directory before the marker ends it (newt run gives
     the processes of a job done 10 s; a save is waited for before that clock starts) */
  if (worker_ckpt_final(w, "the job's last step") != NEWT_OK) NEWT_WARN(WORKER, "%s", newt_errmsg());
  worker_mark_done(w, w->last_loss);
  end_generation(w);
  return over(w, NEWT_NEXT_DONE, next);
}

/* The step that comes, or the end of the generation the last commit agreed on. */
static newt_result_t next_step(worker *w, newt_batch *b, newt_next *next) {
  if (w->leave_agreed || w->switch_agreed) {
    int leaving = w->leave_agreed && worker_stop_asked(w);
    NEWT_INFO(WORKER, "%s: %s after step %lld", w->id, w->leave_agreed ? "a rank leaves" : "switching to the next plan",
              (long long)w->live_step);
    w->leave_agreed = w->switch_agreed = 0;
    /* when every rank leaves at once (the whole job stopped: Ctrl-C on `newt run`, every pod
       deleted) no one stays to take the state: it goes to the checkpoint directory, if the job
       has one, so that a run on it resumes from this very step */
    if (leaving && w->all_leave && worker_ckpt_final(w, "the whole job stops") != NEWT_OK)
      NEWT_WARN(WORKER, "%s", newt_errmsg());
    end_generation(w);
    if (leaving) {
      /* ... and waiting for a plan that names us a donor would only hold the exit up */
      if (w->all_leave) NEWT_INFO(WORKER, "%s: every rank leaves after step %lld: nothing to hand over", w->id,
                                  (long long)w->live_step);
      else hand_over(w);
      NEWT_INFO(WORKER, "%s: left gracefully after step %lld", w->id, (long long)w->live_step);
      return over(w, NEWT_NEXT_LEFT, next);
    }
    w->phase = PHASE_WAITING;
    return wait_generation(w, next);
  }
  if (w->live_step >= w->spec.steps) return end_trained(w, next);
  const newt_plan *p = &w->plan;
  int64_t gb = p->global_batch, off;
  plan_batch_slice(gb, p->dp, w->dp_rank, &off, &w->step_count);
  w->step_first = (int64_t)worker_cursor(w) + off;
  *b = (newt_batch){.size = b->size, .step = w->live_step + 1, .first = w->step_first, .count = w->step_count,
                    .micro_batch = p->micro_batch, .accum = (w->step_count + p->micro_batch - 1) / p->micro_batch,
                    .global_batch = gb};
  if (w->sample_log && w->tp_rank == 0 && w->pp_rank == 0) { /* one rank per data-parallel slice */
    fprintf(w->sample_log, "C %llu %lld %llu %lld %d\n", (unsigned long long)p->generation, (long long)w->live_step + 1,
            (unsigned long long)w->step_first, (long long)w->step_count, w->peer_epoch);
    fflush(w->sample_log);
  }
  if (worker_stop_asked(w) && !w->leave_announced) {
    /* let the leader plan the next generation while this step finishes */
    w->leave_announced = 1;
    worker_set_state_async(w, "leaving");
  }
  atomic_store(&w->step_started, newt_now_ns());
  w->step = STEP_BEGUN;
  *next = NEWT_NEXT_STEP;
  return NEWT_OK;
}

/* 1 when the running generation's communicator failed (a collective of this rank's, or a
 * peer's failure spread to it). */
static int generation_failed(worker *w) {
  comm_status st;
  comm_get_status(w->all, &st);
  return st.code != NEWT_OK;
}

/* A generation failed: report whom this rank lost, end it, wait for the next plan. */
static newt_result_t recover(worker *w, newt_next *next) {
  w->t_detect = newt_wall_ms();
  if (w->step == STEP_COMMITTED) w->live_step++, w->derived_stale = 1; /* applied, not ended */
  report_failure(w);
  /* etcd away: the survivors may go on among themselves (worker/peers.c) */
  newt_plan p;
  comm_t *c = NULL, *parent = NULL;
  int peers = worker_peer_recover(w, &p, &c, &parent);
  end_generation(w);
  w->phase = PHASE_WAITING;
  if (peers) {
    int built = 0;
    if (plan_find(&p, w->id)) built = start_generation(w, &p, c, parent);
    else donate_on(w, &p, c, parent); /* a donor of it: hands its state over, then waits */
    plan_free(&p);
    if (built) {
      *next = NEWT_NEXT_GENERATION;
      return NEWT_OK;
    }
  }
  return wait_generation(w, next);
}

/* Replicas disagreed and a check rolled back (verify.c): the generation starts again, its
 * layout and groups the same; the program declares and restores, and the restore takes the
 * verified copy. */
static newt_result_t restart_generation(worker *w, newt_next *next) {
  NEWT_INFO(WORKER, "%s: generation %llu starts again from step %lld, its newest verified step", w->id,
            (unsigned long long)w->plan.generation, (long long)w->rollback_to);
  await_declaration(w);
  *next = NEWT_NEXT_GENERATION;
  return NEWT_OK;
}

newt_result_t worker_begin(worker *w, newt_batch *b, newt_next *next) {
  if (w->failed && w->phase != PHASE_OVER) { /* a restore or a check found the job failing (its words in failed_why) */
    if (w->all) end_generation(w);
    return over(w, NEWT_NEXT_FAILED, next);
  }
  switch (w->phase) {
    case PHASE_OVER:
      return NEWT_ERR(NEWT_ERR_INVALID, "newt_step_begin: this worker's part is over (%s): call newt_finish",
                      w->over == NEWT_NEXT_DONE       ? "the job is done"
                      : w->over == NEWT_NEXT_LEFT_OUT ? "the job is done without it"
                      : w->over == NEWT_NEXT_LEFT     ? "it left"
                                                      : "the job failed");
    case PHASE_JOINED: NEWT_CHECK(enter(w)); return wait_generation(w, next);
    case PHASE_WAITING: return wait_generation(w, next);
    case PHASE_BUILT:
      if (generation_failed(w)) return recover(w, next); /* the restore's collectives failed */
      if (w->restore_err[0]) /* the root cause, not this consequence of it */
        return NEWT_ERR(NEWT_ERR_INVALID, "newt_step_begin: generation %llu is built but its state is not restored: "
                        "its newt_state_restore failed: %s", (unsigned long long)w->plan.generation, w->restore_err);
      return NEWT_ERR(NEWT_ERR_INVALID, "newt_step_begin: generation %llu is built but its state is not restored "
                      "(declare it, then newt_state_restore)", (unsigned long long)w->plan.generation);
    case PHASE_RUNNING: break;
  }
  if (generation_failed(w)) return recover(w, next);
  if (w->rollback_to >= 0) return restart_generation(w, next);
  if (w->step != STEP_IDLE)
    return NEWT_ERR(NEWT_ERR_INVALID, "newt_step_begin: step %lld was begun and not %s, and its generation is "
                    "healthy (commit and end every step; after a failed collective, begin again)",
                    (long long)w->live_step + 1, w->step == STEP_BEGUN ? "committed" : "ended");
  return next_step(w, b, next);
}

newt_result_t worker_commit(worker *w, const double *values, double *sums, int n) {
  if (w->phase != PHASE_RUNNING || w->step != STEP_BEGUN)
    return NEWT_ERR(NEWT_ERR_INVALID, "newt_step_commit: no step is begun (newt_step_begin said NEXT_STEP first)%s",
                    w->step == STEP_COMMITTED ? "; this step was committed already" : "");
  /* [leave, switch, reaches etcd, values...] of every rank, summed in rank order in double */
  int k = n + 3, size = comm_size(w->train);
  double mine[35];
  mine[0] = worker_stop_asked(w) ? 1 : 0;
  mine[1] = (double)atomic_load(&w->switch_pending);
  pthread_mutex_lock(&w->mu);
  mine[2] = !w->etcd || (rdzv_etcd_reachable(w->etcd) && !w->pub_failing);
  pthread_mutex_unlock(&w->mu);
  for (int i = 0; i < n; i++) mine[3 + i] = values[i];
  double *all = malloc((size_t)size * (size_t)k * sizeof *all);
  NEWT_CHECK_ALLOC(all);
  newt_result_t r = comm_allgather(comm_host_channel(w->train), mine, all, (size_t)k * sizeof(double), NEWT_U8);
  if (r != NEWT_OK) {
    free(all);
    return r;
  }
  double tot[35] = {0};
  for (int q = 0; q < size; q++)
    for (int i = 0; i < k; i++) tot[i] += all[(size_t)q * (size_t)k + (size_t)i];
  /* the progress record (the leader's evidence that steps go on) comes from the lowest rank
     that reaches etcd, not from rank 0 alone: a rank cut from etcd, rank 0 included, is then
     seen alive while it trains (docs/elastic.md, "When etcd is away") */
  w->progress_rank = 0;
  for (int q = size - 1; q >= 0; q--)
    if (all[(size_t)q * (size_t)k + 2] > 0) w->progress_rank = q;
  free(all);
  for (int i = 0; i < n; i++) sums[i] = tot[3 + i];
  w->leave_agreed = tot[0] > 0;
  w->all_leave = tot[0] >= (double)size && w->plan.nspares == 0;
  w->switch_agreed = tot[1] > 0;
  /* every rank finished the step before (its update, its post-update collectives): it is
     committed, and the snapshot to roll back to is taken of it now, before the update. Taken
     earlier, at the start of the step, a rank could drop the only whole state while another
     rank still lacked the previous step's parameters (a ZeRO all-gather cut by a death). */
  w->committed_step = w->live_step;
  NEWT_CHECK(worker_snapshot(w));
  w->step = STEP_COMMITTED;
  return NEWT_OK;
}

/* The stall deadline of the generation's collectives (comm_set_stall) follows the observed
 * step times: NEWT_STALL_MULTIPLE times the 95th percentile of the last WORKER_STEP_TIMES
 * steps, at least NEWT_STALL_FLOOR_MS, at most spec.fault.comm_timeout_ms (the cap, and the
 * deadline until WORKER_STEP_TIMES / 8 steps were seen). A rank that stops (SIGSTOP, a hung
 * host) answers no probe and is named at that deadline; one that answers but is still in
 * its step is waited for up to the cap, so a slow but healthy step is no hang. */
static void follow_steps(worker *w, double step_s) {
  w->step_s[w->step_s_at] = step_s;
  w->step_s_at = (w->step_s_at + 1) % WORKER_STEP_TIMES;
  if (w->nstep_s < WORKER_STEP_TIMES) w->nstep_s++;
  if (w->nstep_s < WORKER_STEP_TIMES / 8 || !w->train) return;
  /* a generation's communicators get the deadline at once; after that it is worked out every
     eighth step, not on every step's path */
  if (w->stall_ms && w->step_s_at % 8) return;
  double sorted[WORKER_STEP_TIMES];
  memcpy(sorted, w->step_s, (size_t)w->nstep_s * sizeof *sorted);
  double p95 = newt_percentile(sorted, (size_t)w->nstep_s, 0.95);
  int64_t ms = (int64_t)(newt_param_StallMultiple() * p95 * 1e3), cap = w->spec.comm_timeout_ms;
  if (ms < newt_param_StallFloorMs()) ms = newt_param_StallFloorMs();
  if (ms > cap) ms = cap;
  if (ms == w->stall_ms) return;
  if (w->stall_ms == 0 || ms * 4 < w->stall_ms * 3 || ms * 4 > w->stall_ms * 5) /* say a move of a quarter or more */
    NEWT_INFO(WORKER, "%s: a collective without progress for %lld ms probes its peers (95th percentile of the last %d "
              "steps: %.0f ms; a peer still in its step is waited for up to %lld ms)", w->id, (long long)ms,
              w->nstep_s, p95 * 1e3, (long long)cap);
  w->stall_ms = ms;
  comm_set_stall(w->train, ms);
  metrics_set(w->metrics, "newt_worker_stall_deadline_seconds", (double)ms / 1e3);
}

newt_result_t worker_end(worker *w, const newt_step_result *res) {
  if (w->phase != PHASE_RUNNING || w->step != STEP_COMMITTED)
    return NEWT_ERR(NEWT_ERR_INVALID, "newt_step_end: no step is committed (newt_step_commit first)");
  w->step = STEP_IDLE;
  atomic_store(&w->step_started, 0);
  w->live_step++;
  w->derived_stale = res->after != NEWT_OK;
  if (w->sample_log) {
    fprintf(w->sample_log, "A %llu %lld %llu %d\n", (unsigned long long)w->plan.generation, (long long)w->live_step,
            (unsigned long long)newt_wall_ms(), w->peer_epoch);
    fflush(w->sample_log);
  }
  if (res->after != NEWT_OK) return NEWT_ERR(res->after, "the step's post-update collectives failed");
  worker_chaos_flip(w);
  /* the replicated state checked (when due) before it is copied, checkpointed or logged: a
     disagreement rolled back returns here, the next step the one after the verified step */
  int rolled = 0;
  NEWT_CHECK(worker_verify(w, 0, &rolled));
  if (rolled) return NEWT_OK;
  NEWT_CHECK(worker_replicate(w));
  w->done_step = w->live_step; /* with its copies made: a rank lost before them costs this step */
  const newt_plan *p = &w->plan;
  int64_t tokens = res->tokens > 0 ? res->tokens : p->global_batch;
  double now = newt_now_s(), tps = w->t_last > 0 ? (double)tokens / (now - w->t_last) : 0;
  metrics_observe(w->metrics, "newt_worker_step_duration_seconds", NULL, w->t_last > 0 ? now - w->t_last : 0);
  metrics_set(w->metrics, "newt_worker_tokens_per_second", tps);
  metrics_set(w->metrics, "newt_worker_step", (double)w->live_step);
  if (res->lr > 0) metrics_set(w->metrics, "newt_worker_learning_rate", res->lr);
  if (res->grad_norm != 0) metrics_set(w->metrics, "newt_worker_grad_norm", res->grad_norm);
  if (!w->first_step_of_gen) follow_steps(w, now - w->t_last); /* a generation's first holds its restore */
  w->t_last = now;
  w->last_loss = res->loss;
  if (w->first_step_of_gen) {
    w->first_step_of_gen = 0;
    w->t_first_step = newt_wall_ms();
    worker_publish_ack(w, w->leave_announced ? NULL : "training");
  }
  if (w->me->rank == w->progress_rank) worker_publish_progress(w, res->loss, tps, tokens);
  newt_result_t cr = worker_ckpt_step(w);
  if (cr != NEWT_OK) /* a checkpoint that cannot start is reported, training goes on */
    NEWT_WARN(WORKER, "%s: checkpoint of step %lld: %s", w->id, (long long)w->live_step, newt_errmsg());
  job_step line = {.step = w->live_step, .loss = res->loss, .lr = res->lr, .grad_norm = res->grad_norm,
                   .tokens_per_s = tps, .world = p->nranks,
                   .dp = p->dp, .generation = p->generation, .t_ms = newt_wall_ms(), .ckpt = w->ckpt_published};
  log_step(w, w->me->rank == 0, &line);
  return NEWT_OK;
}

newt_result_t worker_restored(worker *w) {
  w->t_restore = newt_wall_ms();
  /* the ranks of this generation hold the state from now on: named if it is ever lost */
  plan_free(&w->held_plan);
  if (plan_copy(&w->held_plan, &w->plan) != NEWT_OK) memset(&w->held_plan, 0, sizeof w->held_plan);
  /* a rank 0 killed right after a step may have taken that step's line with it, and the new
     rank 0 may not have done that step itself (its state came from a peer): every rank that
     did it and has not written it writes it (a line twice is harmless: readers keep one) */
  if (!w->last_step_logged && w->last_step.step == w->live_step && w->live_step > 0) log_step(w, 1, &w->last_step);
  NEWT_CHECK(worker_ckpt_generation(w));
  int rolled = 0; /* a restored state is checked at once: the generation's first verified copy */
  NEWT_CHECK(worker_verify(w, 1, &rolled));
  w->phase = PHASE_RUNNING;
  w->step = STEP_IDLE;
  w->first_step_of_gen = 1;
  w->t_last = newt_now_s();
  w->stall_ms = 0; /* the new communicators start at the cap; the next step sets the deadline */
  return NEWT_OK;
}

/* --- joining ------------------------------------------------------------------------------------ */

/* /healthz: unhealthy while one step has taken longer than the hang timeout (the leader
 * replans without a rank stuck that long; a probe restarts its container). Waiting for a
 * plan is healthy: a job below its minimum size waits as long as it takes. */
static int worker_health(void *ud, char *why, size_t cap) {
  worker *w = ud;
  uint64_t t = atomic_load(&w->step_started), now = newt_now_ns();
  int64_t limit = w->spec.hang_timeout_ms > 0 ? w->spec.hang_timeout_ms : 5000;
  if (!t || now - t <= (uint64_t)limit * 1000000) return 1;
  snprintf(why, cap, "step %lld has run for %.1f s, beyond the hang timeout (%lld ms)", (long long)w->live_step + 1,
           (double)(now - t) / 1e9, (long long)limit);
  return 0;
}

static newt_result_t start_metrics(worker *w) {
  static const double step_s[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  const char *addr = w->o.metrics_addr && *w->o.metrics_addr ? w->o.metrics_addr : "127.0.0.1";
  NEWT_CHECK(metrics_start(addr, w->o.metrics_port, NULL, &w->metrics));
  metrics_t *m = w->metrics;
  NEWT_CHECK(metrics_define(m, "newt_build_info", METRICS_GAUGE, "1, labelled with newt's version and the process's role"));
  NEWT_CHECK(metrics_define_histogram(m, "newt_worker_step_duration_seconds", 0, step_s, 12,
                                      "wall time of one training step on this worker"));
  NEWT_CHECK(metrics_define(m, "newt_worker_tokens_per_second", METRICS_GAUGE, "tokens of the global batch over this worker's last step time"));
  NEWT_CHECK(metrics_define(m, "newt_worker_step", METRICS_GAUGE, "the newest step this worker completed"));
  NEWT_CHECK(metrics_define(m, "newt_worker_stall_deadline_seconds", METRICS_GAUGE,
                            "how long a collective goes without progress before this worker probes its peers (follows "
                            "the step times; the cap, spec.fault.comm_timeout_ms, until enough steps were seen)"));
  NEWT_CHECK(metrics_define(m, "newt_worker_learning_rate", METRICS_GAUGE,
                            "the learning rate of this worker's last step, as its program said (0: not said)"));
  NEWT_CHECK(metrics_define(m, "newt_worker_grad_norm", METRICS_GAUGE,
                            "the gradients' global norm before clipping at this worker's last step, as its program "
                            "said (0: not said; NaN: not finite)"));
  NEWT_CHECK(metrics_define(m, "newt_worker_communicator_builds_total", METRICS_COUNTER,
                            "communicators this worker built: one per generation it trained in"));
  NEWT_CHECK(metrics_define(m, "newt_worker_generation", METRICS_GAUGE, "the generation this worker trains in"));
  NEWT_CHECK(metrics_define(m, "newt_worker_rank", METRICS_GAUGE, "this worker's rank in its generation"));
  metrics_set_l(m, "newt_build_info", "version=\"" NEWT_VERSION "\",role=\"worker\"", 1);
  NEWT_CHECK(label_metrics(w, -1));
  metrics_set_health(m, worker_health, w);
  NEWT_CHECK(rdzv_etcd_set_metrics(w->etcd, m));
  NEWT_INFO(WORKER, "%s: metrics at http://%s:%d/metrics (health: /healthz)", w->id, addr, metrics_port(m));
  return NEWT_OK;
}

/* The spec's backend (its row of common/backend.h) and the device: for a backend on GPUs
 * (spec.backend nccl) the one the options name, else LOCAL_RANK modulo the GPUs visible (as
 * launchers set it), else the only one; -1 (the CPU) for a CPU backend. */
static newt_result_t pick_device(worker *w) {
  int want = w->o.device, gpus = 0;
  w->backend = newt_backend_find(w->spec.backend);
  if (!w->backend) /* spec_validate refused it already */
    return NEWT_ERR(NEWT_ERR_INVALID, "spec.backend: \"%s\" is no backend", w->spec.backend);
  gpus = comm_gpu_count(NULL);
  if (!newt_backend_uses_gpu(w->backend)) {
    if (want >= 0) NEWT_INFO(WORKER, "%s: the job trains on CPUs (spec.backend %s): device %d only registered", w->id,
                             w->backend->name, want);
    w->device = -1;
    return NEWT_OK;
  }
  if (gpus == 0)
    return NEWT_ERR(NEWT_ERR_UNSUPPORTED,
                    "spec.backend %s: this worker sees no GPU (a build without CUDA, no driver, or "
                    "CUDA_VISIBLE_DEVICES=%s)", w->backend->name,
                    getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "(unset)");
  const char *local = getenv("LOCAL_RANK");
  if (want < 0 && local && *local) want = atoi(local) % gpus;
  if (want < 0 && gpus == 1) want = 0;
  if (want < 0)
    return NEWT_ERR(NEWT_ERR_INVALID,
                    "spec.backend %s: %d GPUs are visible; the device (--device, NEWT_DEVICE or LOCAL_RANK) says "
                    "which one this worker trains on",
                    w->backend->name, gpus);
  if (want >= gpus)
    return NEWT_ERR(NEWT_ERR_INVALID, "device %d: this worker sees %d GPU%s (0 to %d)", want, gpus, gpus == 1 ? "" : "s",
                    gpus - 1);
  /* a shared device: NCCL refuses two ranks of a communicator on one GPU of one host, unless
     each is a host of its own to it (its host hash comes from NCCL_HOSTID) */
  if (w->o.share_device && !getenv("NCCL_HOSTID")) {
    char hostid[200];
    snprintf(hostid, sizeof hostid, "newt-%.63s-%.63s-%.63s", w->o.job, w->host, w->id);
    setenv("NCCL_HOSTID", hostid, 1);
  }
  w->device = want;
  return NEWT_OK;
}

/* The job secret (newt_secret_read: refused when another user owns it or can read or write
 * it) and the keys made of it: the records' and the checkpoints'. */
static newt_result_t read_secret(worker *w) {
  const char *f = w->o.secret_file;
  if (!f || !*f) {
    NEWT_WARN(WORKER, "%s: no job secret (job_secret_file, NEWT_JOB_SECRET_FILE): the data plane's keys are in the "
              "plans, which anyone who can read etcd can read, and nothing it writes to etcd or its checkpoints "
              "proves it is this job's", w->id);
    return NEWT_OK;
  }
  unsigned char *sec = NULL;
  size_t n = 0;
  newt_result_t r = newt_secret_read(f, &sec, &n);
  if (r == NEWT_OK) r = job_auth_init(&w->auth, sec, n, w->o.job);
  if (r == NEWT_OK) r = ckpt_key_of_secret(&w->ckpt_key, sec, n);
  if (r != NEWT_OK) {
    newt_secret_free(sec, n);
    return r;
  }
  w->job_secret = sec;
  w->job_secret_len = n;
  return NEWT_OK;
}

/* The job's spec from etcd, waiting for it to appear and for etcd to answer: spec_wait_ms in
 * all (60 s by default), each call within what is left of it. Past it, an error that names
 * etcd's address, what was tried and etcd's last answer. */
static newt_result_t read_spec(worker *w) {
  char *spec = NULL, last[512] = "", key[300], took[32];
  int64_t wait = w->o.spec_wait_ms > 0 ? w->o.spec_wait_ms : 60000;
  newt_deadline_t d = newt_deadline_in_ms(wait);
  double warned = 0;
  int tries = 0, away = 0;
  if (job_key(key, sizeof key, w->o.job, JOB_REC_SPEC, 0, NULL) != NEWT_OK) snprintf(key, sizeof key, "its spec");
  newt_fmt_duration((double)wait / 1e3, took, sizeof took);
  for (;;) {
    newt_result_t r = job_spec_get(w->etcd, w->o.job, newt_deadline_min(job_call_deadline(), d), &spec);
    tries++;
    if (r == NEWT_OK) break;
    if (r != NEWT_ERR_NOTFOUND && !rdzv_etcd_transient(r)) return r;
    away = rdzv_etcd_transient(r);
    if (away) {
      snprintf(last, sizeof last, "%s", newt_errmsg());
      if (newt_now_s() - warned >= 10) { /* said at most every 10 s */
        NEWT_WARN(WORKER, "%s: reading the job's spec: %s (waiting for etcd at %s, %s in all)", w->id, last,
                  rdzv_etcd_endpoints(w->etcd), took);
        warned = newt_now_s();
      }
    }
    if (newt_deadline_passed(d)) {
      if (away)
        return NEWT_ERR(NEWT_ERR_UNAVAILABLE, "newt_join: etcd at %s did not answer within %s (spec_wait_ms, "
                        "NEWT_SPEC_WAIT_MS): %d tries to read %s; the last: %s", rdzv_etcd_endpoints(w->etcd), took,
                        tries, key, last);
      return NEWT_ERR(NEWT_ERR_NOTFOUND, "job %s has no spec in etcd at %s after %s (%s; start a coordinator with "
                      "--spec, or run the program under `newt run -- PROGRAM`)", w->o.job,
                      rdzv_etcd_endpoints(w->etcd), took, key);
    }
    if (worker_stop_asked(w)) return NEWT_ERR(NEWT_ERR_ABORTED, "stopped while waiting for the spec");
    int64_t pause = away ? 1000 : 100, left = newt_deadline_left_ms(d);
    newt_sleep_ms(pause < left ? pause : left);
  }
  newt_result_t r = spec_from_json(spec, strlen(spec), &w->spec);
  if (r != NEWT_OK) {
    free(spec);
    return r;
  }
  w->spec_json = spec;
  return NEWT_OK;
}

newt_result_t worker_join(worker *w) {
  w->step_log_fd = -1;
  w->snap.step = w->snap.spare_step = -1;
  for (int j = 0; j < SPEC_REPLICAS_MAX; j++) w->rep[j].step = w->rep[j].spare_step = -1;
  w->vsnap.step = w->vsnap.spare_step = w->verified_step = w->rollback_to = -1;
  const char *flip = getenv("NEWT_CHAOS_FLIP");
  if (flip) snprintf(w->chaos_flip, sizeof w->chaos_flip, "%s", flip);
  snprintf(w->host, sizeof w->host, "%s", w->o.host && *w->o.host ? w->o.host : newt_hostname());
  snprintf(w->domain, sizeof w->domain, "%s", w->o.domain && *w->o.domain ? w->o.domain : w->host);
  if (w->domain[strspn(w->domain, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:/")] != '\0' ||
      strlen(w->o.domain ? w->o.domain : "") >= sizeof w->domain)
    return NEWT_ERR(NEWT_ERR_INVALID, "failure domain \"%.64s\" (newt_join_opts.domain, NEWT_DOMAIN, newt worker "
                    "--domain): letters, digits, '.', '-', '_', ':' and '/', at most %zu characters", w->domain,
                    sizeof w->domain - 1);
  if (w->o.id && *w->o.id) snprintf(w->id, sizeof w->id, "%s", w->o.id);
  else snprintf(w->id, sizeof w->id, "%.40s-%d", w->host, (int)getpid());
  NEWT_CHECK(rdzv_check_name("worker id", w->id));
  NEWT_CHECK(rdzv_check_name("job", w->o.job));
  newt_log_set_name(w->id);
  const char *ip = w->o.addr && *w->o.addr ? w->o.addr : "127.0.0.1";
  int port = 0;
  NEWT_CHECK(bind_listener(ip, w->o.port, &w->listen_fd, &port));
  snprintf(w->addr, sizeof w->addr, "%s:%d", ip, port);
  NEWT_CHECK(read_secret(w));
  NEWT_CHECK(rdzv_etcd_init(&w->o.etcd, &w->etcd));
  if (w->o.metrics_port > 0) NEWT_CHECK(start_metrics(w));
  NEWT_CHECK(read_spec(w));
  NEWT_CHECK(pick_device(w));
  const char *slog = getenv("NEWT_SAMPLE_LOG_DIR");
  if (slog && *slog) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.samples", slog, w->id);
    w->sample_log = fopen(path, "a");
    if (!w->sample_log) return NEWT_ERR(NEWT_ERR_SYS, "NEWT_SAMPLE_LOG_DIR: cannot open %s", path);
  }
  if (w->o.step_log && *w->o.step_log) NEWT_CHECK(job_runlog_open(w->o.step_log, 0, &w->step_log_fd));
  w->phase = PHASE_JOINED;
  return NEWT_OK;
}

/* --- finishing ---------------------------------------------------------------------------------- */

static void teardown(worker *w) {
  worker_ckpt_free(w);
  worker_publisher_stop(w);
  rdzv_etcd_watch_free(w->plan_watch);
  rdzv_registration_free(w->reg);
  if (w->all) end_generation(w);
  plan_free(&w->latest);
  plan_free(&w->plan);
  plan_free(&w->held_plan);
  worker_recheck_free(w);
  worker_state_free(w);
  for (newt_comm *h = w->comms, *nx; h; h = nx) {
    nx = h->next;
    h->magic = 0;
    free(h);
  }
  if (w->sample_log) fclose(w->sample_log);
  if (w->step_log_fd >= 0) close(w->step_log_fd);
  if (w->listen_fd > 0) close(w->listen_fd);
  newt_secret_free(w->job_secret, w->job_secret_len);
  memset(&w->auth, 0, sizeof w->auth);
  memset(&w->ckpt_key, 0, sizeof w->ckpt_key);
  free(w->spec_json);
  rdzv_etcd_free(w->etcd);
  metrics_stop(w->metrics); /* after the client whose requests it counts */
}

/* The job is done. A rank that trained its last step says so with the job's loss (every rank
 * has the same: the commit's sums); a worker that learned of the end from the end marker
 * speaks only for itself: left out after the steps it trained (JOB_EXIT_LEFT_OUT), or a spare
 * that trained none, with the job's end as the marker says. */
static void ended_done(worker *w, job_end *e) {
  const job_done *m = &w->end_marker;
  if (w->trained_last) {
    e->status = JOB_EXIT_DONE;
    snprintf(e->msg, sizeof e->msg, "done: job %s trained its %lld steps (final loss %.4f)", w->o.job,
             (long long)w->spec.steps, w->last_loss);
  } else if (w->done_step > 0 || w->held_plan.generation > 0) {
    e->status = JOB_EXIT_LEFT_OUT;
    snprintf(e->msg, sizeof e->msg,
             "left out: %s trained up to step %lld (generation %llu) and was left out; the job went on without it "
             "and is done: %lld steps, final loss %.4f (its end marker)", w->id, (long long)w->done_step,
             (unsigned long long)w->held_plan.generation, (long long)m->step, m->loss);
  } else {
    e->status = JOB_EXIT_DONE;
    snprintf(e->msg, sizeof e->msg, "done: job %s is done: %lld steps, final loss %.4f (its end marker); %s waited as a "
             "spare and trained none of them", w->o.job, (long long)m->step, m->loss, w->id);
  }
}

int worker_finish(worker *w, newt_result_t r) {
  job_end *e = &w->end;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", newt_errmsg()); /* the program's error, kept across teardown */
  if (w->failed) { /* the job failed: whatever the program made of it (a restore that found the
                       state lost returned an error), that is how this worker ends */
    r = NEWT_OK;
    e->status = JOB_EXIT_FAILED;
    snprintf(e->msg, sizeof e->msg, "failed: %s", w->failed_why);
  } else if (r == NEWT_OK && w->phase == PHASE_OVER) {
    if (w->over == NEWT_NEXT_FAILED) {
      e->status = JOB_EXIT_FAILED;
      snprintf(e->msg, sizeof e->msg, "failed: %s", w->failed_why);
    } else if (w->over == NEWT_NEXT_LEFT) {
      e->status = JOB_EXIT_LEFT;
      snprintf(e->msg, sizeof e->msg, "left: after step %lld of %lld; the job goes on without %s",
               (long long)w->live_step, (long long)w->spec.steps, w->id);
    } else {
      ended_done(w, e);
    }
  } else if (r == NEWT_OK) { /* finished before its part was over: as a leave */
    e->status = JOB_EXIT_LEFT;
    snprintf(e->msg, sizeof e->msg, "left: the program finished after step %lld of %lld", (long long)w->live_step,
             (long long)w->spec.steps);
  }
  if (w->reg && !rdzv_registration_lost(w->reg, NULL, 0)) {
    const char *state = r != NEWT_OK || e->status == JOB_EXIT_FAILED                 ? "failed"
                        : e->status == JOB_EXIT_DONE || e->status == JOB_EXIT_LEFT_OUT ? "done"
                                                                                       : "left";
    worker_set_state_async(w, state);
    worker_publisher_stop(w);
    if (rdzv_registration_leave(w->reg, job_call_deadline()) != NEWT_OK)
      NEWT_WARN(WORKER, "%s: leaving: %s", w->id, newt_errmsg());
  }
  char who[96]; /* no id yet: a join refused before it had one */
  snprintf(who, sizeof who, "newt worker%s%s", w->id[0] ? " " : "", w->id);
  const char *path = job_termination_log(w->o.termination_log);
  teardown(w);
  if (r != NEWT_OK) (void)NEWT_ERR(r, "%s", msg);
  int status = job_end_write(who, r, e, path);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  worker_mem_release(&w->o.memory);
  free(w->strings);
  free(w);
  return status;
}
