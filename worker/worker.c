/* The worker's life (see worker.h and docs/elastic.md).
 *
 * Threads: the main thread registers, waits for plans and trains; the plan watch (an
 * etcd watch on /newt/<job>/plan) keeps the newest plan and, when it asks to drop the
 * running step (switch "abort"), aborts the communicator so a pending collective returns
 * at once; a publisher thread writes what need not hold up a step (progress, acks,
 * registration state) to etcd. The main thread alone touches the model. */
#include "worker/worker.h"

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
#include "job/plan.h"
#include "job/records.h"
#include "job/runlog.h"
#include "model/ops.h"
#include "rendezvous/rdzv.h"
#include "worker/internal.h"

/* --- setup ------------------------------------------------------------------------------ */

/* The data-plane socket: bound once to addr:port (port 0: any free one) and held for the
 * whole life of the worker, so the address it registers stays its own across generations;
 * each generation's communicator listens on it. */
static newt_result_t bind_listener(const char *addr, int port, int *fd_out, int *port_out) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
    return NEWT_ERR(NEWT_ERR_INVALID, "--addr: \"%s\" is not an IPv4 address", addr);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1;
  socklen_t len = sizeof sa;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 256) != 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    return NEWT_ERR(NEWT_ERR_SYS, "--addr %s --port %d: cannot listen for the data plane: %s", addr, port,
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

static void take_plan(worker *w, const char *json, size_t len) {
  newt_plan p;
  if (plan_from_json(json, len, &p) != NEWT_OK) {
    NEWT_WARN(WORKER, "%s: ignoring a plan: %s", w->id, newt_errmsg());
    return;
  }
  pthread_mutex_lock(&w->mu);
  if (p.generation > w->latest.generation) {
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
  NEWT_CHECK(job_key(key, sizeof key, w->o->job, JOB_REC_PLAN, 0, NULL));
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

typedef enum wait_outcome { WAIT_PLAN, WAIT_LEAVE, WAIT_DONE, WAIT_FAILED } wait_outcome;

/* Waits for a plan newer than our generation in which we are a rank; meanwhile re-registers
 * after a lost lease and notices SIGTERM and the end of the job. */
static newt_result_t wait_plan(worker *w, int donor, newt_plan *out, wait_outcome *how) {
  uint64_t spare_gen = 0;
  uint64_t next_done_check = 0;
  /* a leaver waits (bounded: it must exit well within a pod's grace period) for the plan
     that names it a donor; the leader publishes it within milliseconds, or after a
     leadership change within a lease TTL */
  int64_t donor_wait = 3 * w->spec.lease_ttl_ms + 5000;
  if (donor_wait > 10000) donor_wait = 10000;
  newt_deadline_t give_up = newt_deadline_in_ms(donor ? donor_wait : -1);
  for (;;) {
    if ((!donor && newt_stop_requested()) || newt_deadline_passed(give_up)) {
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
        *how = WAIT_PLAN;
        return NEWT_OK;
      }
      if (!donor && spare_gen != w->latest.generation) {
        spare_gen = w->latest.generation;
        pthread_mutex_unlock(&w->mu);
        worker_set_state_async(w, "spare");
        continue;
      }
    }
    worker_wait_cv(w, 50);
    pthread_mutex_unlock(&w->mu);
    uint64_t now = newt_wall_ms();
    if (now >= next_done_check) {
      next_done_check = now + 500;
      if (job_is_done(w->etcd, w->o->job, &w->spec)) {
        *how = WAIT_DONE;
        return NEWT_OK;
      }
      job_failed f;
      if (!donor && job_has_failed(w->etcd, w->o->job, &f)) {
        w->failed = 1;
        snprintf(w->failed_why, sizeof w->failed_why, "%s", f.why);
        *how = WAIT_FAILED;
        return NEWT_OK;
      }
    }
  }
}

/* --- one generation ------------------------------------------------------------------------ */

/* The generation's communicator: its ranks, then its donors. */
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
  /* NCCL on the device's stream: collectives follow the kernels queued before them */
  cfg.backend = model_dev_kind_of(w->dev) == MODEL_DEV_CUDA ? COMM_BACKEND_NCCL : COMM_BACKEND_CPU;
  cfg.stream = model_dev_stream(w->dev);
  cfg.rank = me->rank;
  cfg.size = n;
  cfg.cancel = &w->build_cancel;
  cfg.peers_listen = 1; /* every worker holds its data-plane socket for life */
  pthread_mutex_lock(&w->mu);
  atomic_store(&w->build_cancel, w->latest.generation > p->generation); /* already moot? */
  pthread_mutex_unlock(&w->mu);
  cfg.addrs = addrs;
  cfg.hosts = hosts;
  cfg.job = w->o->job;
  cfg.generation = p->generation;
  if (w->job_secret) { /* the plan's secret is only a salt: the key is the job secret's */
    newt_result_t kr = comm_derive_secret(w->job_secret, w->job_secret_len, w->o->job, p->generation, p->secret,
                                          sizeof p->secret, cfg.secret);
    if (kr != NEWT_OK) {
      free(addrs);
      free(hosts);
      return kr;
    }
    cfg.secret_len = COMM_KEY_BYTES;
  } else {
    memcpy(cfg.secret, p->secret, sizeof p->secret);
    cfg.secret_len = sizeof p->secret;
  }
  cfg.timeout_ms = w->spec.comm_timeout_ms;
  cfg.device = w->device;
  cfg.listen_fd = w->listen_fd;
  cfg.missing = missing;
  newt_result_t r = comm_create(&cfg, out);
  free(addrs);
  free(hosts);
  return r;
}

/* The worker id of member r of p (its ranks, then its donors), or NULL. */
static const char *member_id(const newt_plan *p, int r) {
  return r >= 0 && r < p->nranks                ? p->ranks[r].worker
         : r >= p->nranks && r < p->nranks + p->ndonors ? p->donors[r - p->nranks].worker
                                                        : NULL;
}

/* Reports a failed collective: the communicator says whom it lost and how. */
static void report_failure(worker *w, const newt_plan *p, comm_t *c) {
  comm_status st;
  comm_get_status(c, &st);
  if (st.code == NEWT_ERR_ABORTED) return; /* we dropped it for a newer plan: nothing to report */
  const char *accused = member_id(p, st.peer);
  worker_report(w, p, st.code == NEWT_ERR_TIMEOUT, 0, &accused, accused ? 1 : 0, st.msg);
}

typedef enum gen_outcome { GEN_DONE, GEN_LEAVE, GEN_NEXT } gen_outcome;

/* One optimizer step of generation p: this rank's data-parallel slice of the global
 * batch through the parallel trainer, whose closing all-reduce also carries the control
 * values (leave, switch); then the neighbour's replica of the ZeRO shard. info->loss is
 * the step's mean loss (the same on every rank). */
/* Every rank finished step par.step (the collective that ends the next one succeeded): it is
 * committed, and the snapshot to roll back to is taken of it now, before the update. Taken
 * earlier, at the start of the step, a rank could drop the only whole state while another
 * rank still lacked the previous step's parameters (a ZeRO all-gather cut by a death). */
static newt_result_t commit_step(void *arg) {
  worker *w = arg;
  w->committed_step = w->par.step;
  return worker_snapshot(w);
}

static newt_result_t train_step(worker *w, const newt_plan *p, float ctl[2], model_step_info *info) {
  const model_par_config *pc = &w->par.pc;
  int64_t first, count;
  uint64_t cursor = worker_cursor(w);
  model_batch_slice(p->global_batch, pc->dp_rank, pc->dp, &first, &count);
  NEWT_CHECK(model_loader_fetch(&w->ld, cursor + (uint64_t)first, count, w->inputs, w->targets));
  if (w->sample_log && pc->tp_rank == 0 && pc->pp_rank == 0) { /* one rank per data-parallel slice */
    fprintf(w->sample_log, "C %llu %lld %llu %lld\n", (unsigned long long)p->generation, (long long)w->par.step + 1,
            (unsigned long long)(cursor + (uint64_t)first), (long long)count);
    fflush(w->sample_log);
  }
  ctl[0] = newt_stop_requested() ? 1.0f : 0.0f;
  if (ctl[0] > 0 && !w->leave_announced) {
    /* let the leader plan the next generation while this step finishes */
    w->leave_announced = 1;
    worker_set_state_async(w, "leaving");
  }
  ctl[1] = (float)atomic_load(&w->switch_pending);
  model_par_step_opts opts = {.ctl = ctl, .nctl = 2, .on_commit = commit_step, .arg = w};
  NEWT_CHECK(model_par_step(&w->par, &w->comms, w->inputs, w->targets, (int)count, &opts, info));
  if (w->sample_log) {
    fprintf(w->sample_log, "A %llu %lld %llu\n", (unsigned long long)p->generation, (long long)w->par.step,
            (unsigned long long)newt_wall_ms());
    fflush(w->sample_log);
  }
  NEWT_CHECK(worker_replicate(w));
  w->done_step = w->par.step;
  return NEWT_OK;
}

/* The step log (--step-log): rank 0 appends each step's line. Every rank keeps the line of
 * the last step it did, so that when a rank 0 is killed before it wrote its last step's
 * line, the next rank 0 writes it, having done that step too (a line twice is harmless:
 * readers keep one per step). */
static void log_step(worker *w, int rank0, const job_step *line) {
  w->last_step = *line;
  w->last_step_logged = rank0 && w->step_log_fd >= 0;
  if (!w->last_step_logged) return;
  if (job_steplog_append(w->step_log_fd, line) != NEWT_OK) /* the log is for people: training goes on */
    NEWT_WARN(WORKER, "%s: --step-log %s: %s", w->id, w->o->step_log, newt_errmsg());
}

static void end_generation(worker *w, comm_t *c, comm_t *train) {
  pthread_mutex_lock(&w->mu);
  w->comm = NULL;
  pthread_mutex_unlock(&w->mu);
  model_par_comms_free(&w->comms);
  memset(&w->comms, 0, sizeof w->comms);
  if (train && train != c) comm_free(train);
  comm_free(c);
}

/* A donor's generation: build the communicator with the ranks, hand them this worker's
 * state (the pieces they need), leave. */
static newt_result_t donate(worker *w, const newt_plan *p, const plan_rank *me, gen_outcome *how) {
  comm_t *c = NULL, *none = NULL;
  *how = GEN_LEAVE;
  if (!me) return NEWT_OK; /* neither a rank nor a donor of p: nothing to do in it */
  w->gen = p->generation;
  newt_result_t r = build_comm(w, p, me, NULL, &c);
  if (r == NEWT_OK) r = comm_split(c, -1, me->rank, &none); /* the ranks' own group */
  if (r == NEWT_OK) r = worker_donate(w, c);
  if (r == NEWT_OK) NEWT_INFO(WORKER, "%s: handed over the state of step %lld", w->id, (long long)w->par.step);
  else NEWT_WARN(WORKER, "%s: handing over its state in generation %llu: %s", w->id, (unsigned long long)p->generation,
                 newt_errmsg());
  if (c) comm_free(c);
  return NEWT_OK; /* leaving either way */
}

/* A plan made for a changed spec (cause "spec"), or one after generations this worker did
 * not see: the spec in etcd may have changed, and the fields that can change while the job
 * runs (checkpoint cadence, timeouts) are taken here, at the generation's start. */
static void refresh_spec(worker *w, const newt_plan *p) {
  if (strcmp(p->cause, "spec") != 0 && p->generation <= w->gen + 1) return;
  char *text = NULL;
  if (rdzv_spec_get(w->etcd, w->o->job, newt_deadline_in_ms(1000), &text) != NEWT_OK) return;
  newt_spec s;
  char what[512];
  if (spec_from_json(text, strlen(text), &s) == NEWT_OK && memcmp(&s, &w->spec, sizeof s) != 0) {
    if (spec_update_allowed(&w->spec, &s, what, sizeof what)) {
      w->spec = s;
      NEWT_INFO(WORKER, "%s: took the changed spec: %s", w->id, what);
    } else {
      NEWT_ERROR(WORKER, "%s: ignoring the spec in etcd: %s", w->id, newt_errmsg());
    }
  }
  free(text);
}

static newt_result_t run_generation(worker *w, const newt_plan *p, gen_outcome *how) {
  const plan_rank *me = plan_find(p, w->id);
  if (me) refresh_spec(w, p);
  if (!me) return donate(w, p, plan_find_donor(p, w->id), how);
  comm_t *c = NULL, *train = NULL;
  atomic_store(&w->switch_pending, 0);
  w->t_plan_seen = newt_wall_ms();
  int *missing = calloc((size_t)(p->nranks + p->ndonors), sizeof *missing);
  newt_result_t r = missing ? build_comm(w, p, me, missing, &c) : NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  pthread_mutex_lock(&w->mu);
  w->gen = p->generation;
  w->comm = c;
  /* a newer plan may have come while we built: honour it now */
  if (c && w->latest.generation > p->generation) {
    if (drops_now(&w->latest, w->id)) comm_abort(c);
    else atomic_store(&w->switch_pending, 1);
  }
  pthread_mutex_unlock(&w->mu);
  model_par_config pc;
  model_par_config_from_rank(&pc, p->tp, p->pp, p->dp, p->zero, me->rank);
  pc.dev = w->dev;
  /* the ranks train among themselves; donors only take part in the restore */
  if (r == NEWT_OK && p->ndonors) r = comm_split(c, 0, me->rank, &train);
  else train = c;
  if (r == NEWT_OK) r = model_par_comms_split(train, &pc, &w->comms);
  if (r != NEWT_OK) {
    /* some rank never came: say so, so the leader need not wait for its lease to run out
       (the ranks that do not report are the ones that did not come) */
    w->t_detect = newt_wall_ms();
    char why[512];
    snprintf(why, sizeof why, "building generation %llu: %s", (unsigned long long)p->generation, newt_errmsg());
    pthread_mutex_lock(&w->mu);
    int newer = w->latest.generation > p->generation;
    pthread_mutex_unlock(&w->mu);
    /* whom to blame: the members whose links were never made (a peer that could not prove
       the generation's key counts), at most JOB_ACCUSE_MAX */
    const char *accused[JOB_ACCUSE_MAX];
    int naccused = 0;
    for (int k = 0; missing && k < p->nranks + p->ndonors && naccused < JOB_ACCUSE_MAX; k++)
      if (missing[k] && member_id(p, k)) accused[naccused++] = member_id(p, k);
    if (!newer) worker_report(w, p, r == NEWT_ERR_TIMEOUT, 1, accused, naccused, why);
    free(missing);
    if (c) end_generation(w, c, train);
    *how = GEN_NEXT;
    return NEWT_OK;
  }
  free(missing);
  w->t_comm = newt_wall_ms();
  metrics_add(w->metrics, "newt_worker_communicator_builds_total", 1);
  metrics_set(w->metrics, "newt_worker_generation", (double)p->generation);
  metrics_set(w->metrics, "newt_worker_rank", (double)me->rank);
  NEWT_INFO(WORKER, "%s: generation %llu: rank %d of %d (tp %d, pp %d, dp %d, zero %d, accum %lld)", w->id,
            (unsigned long long)p->generation, me->rank, p->nranks, p->tp, p->pp, p->dp, p->zero,
            (long long)p->accum);
  r = worker_restore(w, c, p, &pc);
  w->t_restore = newt_wall_ms();
  /* a rank 0 killed right after a step may have taken that step's line with it, and the new
     rank 0 may not have done that step itself (its state came from a peer): every rank that
     did it and has not written it writes it (a line twice is harmless: readers keep one) */
  if (r == NEWT_OK && !w->last_step_logged && w->last_step.step == w->par.step && w->par.step > 0)
    log_step(w, 1, &w->last_step);
  if (r == NEWT_OK) r = worker_ckpt_generation(w, p, me);
  int first = 1;
  double t_last = newt_now_s();
  int64_t tokens = p->global_batch * (int64_t)w->tcfg.seq_len;
  while (r == NEWT_OK) {
    if (w->par.step >= w->spec.steps) {
      *how = GEN_DONE;
      break;
    }
    float ctl[2];
    model_step_info info;
    atomic_store(&w->step_started, newt_now_ns());
    r = train_step(w, p, ctl, &info);
    atomic_store(&w->step_started, 0);
    if (r != NEWT_OK) break;
    double loss = info.loss;
    double now = newt_now_s();
    double tps = (double)tokens / (now - t_last);
    metrics_observe(w->metrics, "newt_worker_step_duration_seconds", NULL, now - t_last);
    metrics_set(w->metrics, "newt_worker_tokens_per_second", tps);
    metrics_set(w->metrics, "newt_worker_step", (double)w->par.step);
    t_last = now;
    w->last_loss = loss;
    if (first) {
      first = 0;
      w->t_first_step = newt_wall_ms();
      worker_publish_ack(w, p, me);
      if (!w->leave_announced) worker_set_state_async(w, "training");
    }
    if (me->rank == 0) worker_publish_progress(w, p, loss, tps);
    newt_result_t cr = worker_ckpt_step(w, p, me);
    if (cr != NEWT_OK) /* a checkpoint that cannot start is reported, training goes on */
      NEWT_WARN(WORKER, "%s: checkpoint of step %lld: %s", w->id, (long long)w->par.step, newt_errmsg());
    job_step line = {.step = w->par.step, .loss = loss, .lr = info.lr, .tokens_per_s = tps, .world = p->nranks,
                     .dp = p->dp, .generation = p->generation, .t_ms = newt_wall_ms(), .ckpt = w->ckpt_published};
    log_step(w, me->rank == 0, &line);
    if (ctl[0] > 0) {
      *how = newt_stop_requested() ? GEN_LEAVE : GEN_NEXT;
      NEWT_INFO(WORKER, "%s: a rank leaves after step %lld", w->id, (long long)w->par.step);
      break;
    }
    if (ctl[1] > 0) {
      *how = GEN_NEXT;
      NEWT_INFO(WORKER, "%s: switching to the next plan after step %lld", w->id, (long long)w->par.step);
      break;
    }
  }
  if (r != NEWT_OK) {
    w->t_detect = newt_wall_ms();
    comm_status st;
    comm_get_status(c, &st);
    if (st.code == NEWT_OK) { /* not a communication failure: data or model */
      end_generation(w, c, train);
      return r;
    }
    report_failure(w, p, c);
    *how = GEN_NEXT;
    r = NEWT_OK;
  } else if (*how == GEN_DONE && me->rank == 0) {
    worker_mark_done(w, w->last_loss);
  }
  end_generation(w, c, train);
  return r;
}

/* --- the whole life ----------------------------------------------------------------------- */

/* /healthz: unhealthy while one step has taken longer than the hang timeout (the leader
 * replans without a rank stuck that long; a probe restarts its container). Waiting for a
 * plan is healthy: a job below its minimum size waits as long as it takes. */
static int worker_health(void *ud, char *why, size_t cap) {
  worker *w = ud;
  uint64_t t = atomic_load(&w->step_started), now = newt_now_ns();
  int64_t limit = w->spec.hang_timeout_ms > 0 ? w->spec.hang_timeout_ms : 5000;
  if (!t || now - t <= (uint64_t)limit * 1000000) return 1;
  snprintf(why, cap, "step %lld has run for %.1f s, beyond the hang timeout (%lld ms)", (long long)w->par.step + 1,
           (double)(now - t) / 1e9, (long long)limit);
  return 0;
}

static newt_result_t start_metrics(worker *w) {
  const worker_opts *o = w->o;
  static const double step_s[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  const char *addr = o->metrics_addr && *o->metrics_addr ? o->metrics_addr : "127.0.0.1";
  NEWT_CHECK(metrics_start(addr, o->metrics_port, NULL, &w->metrics));
  metrics_t *m = w->metrics;
  NEWT_CHECK(metrics_define(m, "newt_build_info", METRICS_GAUGE, "1, labelled with newt's version and the process's role"));
  NEWT_CHECK(metrics_define_histogram(m, "newt_worker_step_duration_seconds", 0, step_s, 12,
                                      "wall time of one training step on this worker"));
  NEWT_CHECK(metrics_define(m, "newt_worker_tokens_per_second", METRICS_GAUGE, "tokens of the global batch over this worker's last step time"));
  NEWT_CHECK(metrics_define(m, "newt_worker_step", METRICS_GAUGE, "the newest step this worker completed"));
  NEWT_CHECK(metrics_define(m, "newt_worker_communicator_builds_total", METRICS_COUNTER,
                            "communicators this worker built: one per generation it trained in"));
  NEWT_CHECK(metrics_define(m, "newt_worker_generation", METRICS_GAUGE, "the generation this worker trains in"));
  NEWT_CHECK(metrics_define(m, "newt_worker_rank", METRICS_GAUGE, "this worker's rank in its generation"));
  metrics_set_l(m, "newt_build_info", "version=\"" NEWT_VERSION "\",role=\"worker\"", 1);
  metrics_set_health(m, worker_health, w);
  NEWT_CHECK(rdzv_etcd_set_metrics(w->etcd, m));
  NEWT_INFO(WORKER, "%s: metrics at http://%s:%d/metrics (health: /healthz)", w->id, addr, metrics_port(m));
  return NEWT_OK;
}

/* The device the trainer runs on: with spec.backend nccl the GPU --device names (else the
 * local rank among the visible GPUs, LOCAL_RANK as launchers set it, else the only one);
 * with cpu the CPU (a --device is then only recorded in the registration). */
static newt_result_t open_device(worker *w, const worker_opts *o) {
  w->device = o->device;
  if (strcmp(w->spec.backend, "nccl") != 0) {
    w->dev = model_dev_cpu();
    return NEWT_OK;
  }
  int n = model_dev_cuda_count();
  if (n == 0)
    return NEWT_ERR(NEWT_ERR_UNSUPPORTED,
                    "spec.backend nccl: this worker sees no GPU (a build without CUDA, no driver, or "
                    "CUDA_VISIBLE_DEVICES=%s)",
                    getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "(unset)");
  int dev = o->device;
  const char *local = getenv("LOCAL_RANK");
  if (dev < 0 && local && *local) dev = atoi(local) % n;
  if (dev < 0 && n == 1) dev = 0;
  if (dev < 0)
    return NEWT_ERR(NEWT_ERR_INVALID,
                    "spec.backend nccl: %d GPUs are visible; --device (or NEWT_DEVICE, or LOCAL_RANK) says which one "
                    "this worker trains on",
                    n);
  if (dev >= n)
    return NEWT_ERR(NEWT_ERR_INVALID, "--device %d: this worker sees %d GPU%s (0 to %d)", dev, n, n == 1 ? "" : "s",
                    n - 1);
  /* --share-device: NCCL refuses two ranks of a communicator on one GPU of one host, unless
     each is a host of its own to it (its host hash comes from NCCL_HOSTID) */
  if (o->share_device && !getenv("NCCL_HOSTID")) {
    char hostid[200];
    snprintf(hostid, sizeof hostid, "newt-%.63s-%.63s-%.63s", o->job, w->host, w->id);
    setenv("NCCL_HOSTID", hostid, 1);
  }
  newt_result_t r = model_dev_open(MODEL_DEV_CUDA, dev, &w->dev);
  if (r != NEWT_OK) return newt_err_wrap(r, "spec.backend nccl: ");
  w->device = dev;
  NEWT_INFO(WORKER, "%s: trains on %s", w->id, model_dev_name(w->dev));
  return NEWT_OK;
}

static newt_result_t setup(worker *w, const worker_opts *o) {
  w->o = o;
  snprintf(w->host, sizeof w->host, "%s", o->host && *o->host ? o->host : newt_hostname());
  if (o->id && *o->id) snprintf(w->id, sizeof w->id, "%s", o->id);
  else snprintf(w->id, sizeof w->id, "%.40s-%d", w->host, (int)getpid());
  NEWT_CHECK(rdzv_check_name("worker id", w->id));
  NEWT_CHECK(rdzv_check_name("job", o->job));
  newt_log_set_name(w->id);
  const char *ip = o->addr && *o->addr ? o->addr : "127.0.0.1";
  int port = 0;
  NEWT_CHECK(bind_listener(ip, o->port, &w->listen_fd, &port));
  snprintf(w->addr, sizeof w->addr, "%s:%d", ip, port);

  if (o->secret_file && *o->secret_file) {
    char *sec = NULL;
    size_t n = 0;
    newt_result_t sr = newt_fs_read_all(o->secret_file, 4096, &sec, &n);
    if (sr == NEWT_OK && n < 16) sr = NEWT_ERR(NEWT_ERR_INVALID, "%s: a job secret needs at least 16 bytes, it has %zu", o->secret_file, n);
    if (sr != NEWT_OK) {
      free(sec);
      return newt_err_wrap(sr, "--job-secret-file: ");
    }
    w->job_secret = (unsigned char *)sec;
    w->job_secret_len = n;
  } else {
    NEWT_WARN(WORKER, "%s: no job secret (--job-secret-file): the data plane's keys are in the plans, which anyone "
              "who can read etcd can read", w->id);
  }
  NEWT_CHECK(rdzv_etcd_init(&o->etcd, &w->etcd));
  if (o->metrics_port > 0) NEWT_CHECK(start_metrics(w));
  char *spec = NULL;
  newt_deadline_t d = newt_deadline_in_ms(o->spec_wait_ms > 0 ? o->spec_wait_ms : 60000);
  for (;;) {
    newt_result_t r = rdzv_spec_get(w->etcd, o->job, job_call_deadline(), &spec);
    if (r == NEWT_OK) break;
    if (rdzv_etcd_transient(r)) { /* etcd away: wait for it; the spec's own wait starts after */
      NEWT_WARN(WORKER, "%s: reading the job's spec: %s (waiting for etcd)", w->id, newt_errmsg());
      d = newt_deadline_in_ms(o->spec_wait_ms > 0 ? o->spec_wait_ms : 60000);
      newt_sleep_ms(1000);
    } else if (r != NEWT_ERR_NOTFOUND || newt_deadline_passed(d)) {
      return r == NEWT_ERR_NOTFOUND
                 ? NEWT_ERR(NEWT_ERR_NOTFOUND, "job %s has no spec in etcd at %s (start a coordinator with --spec)",
                            o->job, rdzv_etcd_endpoints(w->etcd))
                 : r;
    }
    if (newt_stop_requested()) return NEWT_ERR(NEWT_ERR_ABORTED, "stopped while waiting for the spec");
    newt_sleep_ms(100);
  }
  newt_result_t r = spec_from_json(spec, strlen(spec), &w->spec);
  free(spec);
  NEWT_CHECK(r);
  model_train_config *tc = &w->tcfg;
  NEWT_CHECK(worker_train_config(&w->spec, o->threads, tc));
  /* the fixed part of the layout must fit the model (tp divides heads and vocab, ...) */
  model_par_config pc;
  model_par_config_from_rank(&pc, (int)w->spec.tp, (int)w->spec.pp, 1, (int)w->spec.zero, 0);
  newt_result_t lr = model_par_config_check(&pc, tc);
  if (lr != NEWT_OK) return newt_err_wrap(lr, "the job's spec does not fit its model: ");
  model_threads_set(tc->threads);
  NEWT_CHECK(open_device(w, o));
  NEWT_CHECK(worker_open_data(&w->spec, &w->tok));
  w->have_tok = 1;
  NEWT_CHECK(model_loader_init(&w->ld, &w->tok, tc->seq_len, tc->data_seed, tc->model.vocab));
  w->snap.step = w->rep.step = w->rep.spare_step = -1;
  size_t n = (size_t)w->spec.global_batch * (size_t)tc->seq_len;
  w->inputs = malloc(n * sizeof *w->inputs);
  w->targets = malloc(n * sizeof *w->targets);
  NEWT_CHECK_ALLOC(w->inputs);
  NEWT_CHECK_ALLOC(w->targets);
  const char *slog = getenv("NEWT_SAMPLE_LOG_DIR");
  if (slog && *slog) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.samples", slog, w->id);
    w->sample_log = fopen(path, "a");
    if (!w->sample_log) return NEWT_ERR(NEWT_ERR_SYS, "NEWT_SAMPLE_LOG_DIR: cannot open %s", path);
  }
  if (o->step_log && *o->step_log) NEWT_CHECK(job_runlog_open(o->step_log, 0, &w->step_log_fd));
  NEWT_CHECK(worker_publisher_start(w));
  NEWT_CHECK(worker_register(w));
  for (;;) { /* etcd away: wait for it */
    newt_result_t r = start_plan_watch(w);
    if (r == NEWT_OK) break;
    if (!rdzv_etcd_transient(r) || newt_stop_requested()) return r;
    NEWT_WARN(WORKER, "%s: watching the plan: %s (waiting for etcd)", w->id, newt_errmsg());
    newt_sleep_ms(1000);
  }
  NEWT_INFO(WORKER, "%s: registered for job %s at %s (host %s)", w->id, o->job, w->addr, w->host);
  return NEWT_OK;
}

static void teardown(worker *w) {
  worker_ckpt_free(w);
  worker_publisher_stop(w);
  rdzv_etcd_watch_free(w->plan_watch);
  rdzv_registration_free(w->reg);
  plan_free(&w->latest);
  worker_state_free(w);
  if (w->dev && model_dev_kind_of(w->dev) != MODEL_DEV_CPU) model_dev_close(w->dev); /* after its buffers */
  w->dev = NULL;
  if (w->have_tok) model_tokens_close(&w->tok);
  free(w->inputs);
  free(w->targets);
  if (w->sample_log) fclose(w->sample_log);
  if (w->step_log_fd >= 0) close(w->step_log_fd);
  if (w->listen_fd > 0) close(w->listen_fd);
  if (w->job_secret) memset(w->job_secret, 0, w->job_secret_len);
  free(w->job_secret);
  rdzv_etcd_free(w->etcd);
  metrics_stop(w->metrics); /* after the client whose requests it counts */
}

/* A leaving rank hands its state to the next generation's ranks (they may hold no other
 * copy of its pieces) before it goes: the leader names it a donor of the plan without it.
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
  if (wait_plan(w, 1, &p, &wo) != NEWT_OK || wo != WAIT_PLAN) {
    NEWT_WARN(WORKER, "%s: no plan took over its state of step %lld", w->id, (long long)w->par.step);
    return;
  }
  gen_outcome how;
  run_generation(w, &p, &how);
  plan_free(&p);
}

newt_result_t worker_run(const worker_opts *o) {
  worker *w = calloc(1, sizeof *w);
  NEWT_CHECK_ALLOC(w);
  w->step_log_fd = -1;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  newt_result_t r = setup(w, o);
  while (r == NEWT_OK) {
    newt_plan p;
    wait_outcome wo;
    r = wait_plan(w, 0, &p, &wo);
    if (r != NEWT_OK) break;
    if (wo == WAIT_DONE) {
      NEWT_INFO(WORKER, "%s: the job is done", w->id);
      break;
    }
    if (wo == WAIT_FAILED) {
      NEWT_ERROR(WORKER, "%s: the job failed: %s", w->id, w->failed_why);
      break;
    }
    if (wo == WAIT_LEAVE) {
      NEWT_INFO(WORKER, "%s: leaving (signal %d) between generations", w->id, newt_stop_requested());
      hand_over(w);
      break;
    }
    gen_outcome how = GEN_NEXT;
    r = run_generation(w, &p, &how);
    plan_free(&p);
    if (how == GEN_DONE) NEWT_INFO(WORKER, "%s: trained the last step (%lld)", w->id, (long long)w->par.step);
    if (r != NEWT_OK || how == GEN_DONE) break;
    if (how == GEN_LEAVE) {
      hand_over(w);
      NEWT_INFO(WORKER, "%s: left gracefully after step %lld", w->id, (long long)w->par.step);
      break;
    }
  }
  if (r == NEWT_OK && o->end) {
    job_end *e = o->end;
    if (w->failed) {
      e->status = JOB_EXIT_FAILED;
      snprintf(e->msg, sizeof e->msg, "failed: %s", w->failed_why);
    } else if (newt_stop_requested()) {
      e->status = JOB_EXIT_LEFT;
      snprintf(e->msg, sizeof e->msg, "left: signal %d, after step %lld of %lld; the job goes on without %s",
               newt_stop_requested(), (long long)w->par.step, (long long)w->spec.steps, w->id);
    } else {
      e->status = JOB_EXIT_DONE;
      snprintf(e->msg, sizeof e->msg, "done: job %s trained its %lld steps (final loss %.4f)", o->job,
               (long long)w->spec.steps, w->last_loss);
    }
  }
  if (w->reg && !rdzv_registration_lost(w->reg, NULL, 0)) {
    if (r == NEWT_OK) worker_set_state_async(w, w->failed ? "failed" : newt_stop_requested() ? "left" : "done");
    worker_publisher_stop(w);
    if (rdzv_registration_leave(w->reg, job_call_deadline()) != NEWT_OK)
      NEWT_WARN(WORKER, "%s: leaving: %s", w->id, newt_errmsg());
  }
  /* keep the message of a failure across teardown */
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", newt_errmsg());
  teardown(w);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  free(w);
  if (r != NEWT_OK) return NEWT_ERR(r, "%s", msg);
  return NEWT_OK;
}
