/* What a worker writes to etcd (job/records.h has every record): its registration and
 * its state, with the acknowledgement of its generation folded into the same update (one
 * write per generation), failure reports, progress, the checkpoint pointer and the end
 * marker. Only a failure report and the end marker are written by the caller's thread
 * (the leader needs them before anything else happens); everything else goes through the
 * publisher thread, which holds the newest value of each key and writes it when etcd is
 * there, so a step never waits on etcd. After a lost lease the publisher renews the
 * registration before it writes anything else. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/param.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "job/records.h"
#include "rendezvous/gateway.h"
#include "worker/internal.h"

NEWT_PARAM(ProgressMs, "NEWT_PROGRESS_MS", 100)
NEWT_PARAM(DoneWaitMs, "NEWT_DONE_WAIT_MS", 600000)

/* The host's lease, from the file the node agent that started this worker names in
 * NEWT_HOST_LEASE_FILE (cli/agent.h): the registration goes on it (job_register_on), one
 * write. The agent writes the file once the spec is in etcd, as this worker has just read
 * it: a file not there yet is waited for up to 2 s. 0: none (a lease of its own). */
static int64_t host_lease(const worker *w) {
  const char *path = getenv("NEWT_HOST_LEASE_FILE");
  if (!path || !*path) return 0;
  for (newt_deadline_t d = newt_deadline_in_ms(2000);; newt_sleep_ms(20)) {
    char *text = NULL;
    size_t len = 0;
    int64_t lease = 0;
    if (newt_fs_read_all(path, 64, &text, &len) == NEWT_OK) {
      while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r')) text[--len] = '\0';
      if (newt_parse_int(text, &lease) != 0 || lease <= 0) {
        NEWT_WARN(WORKER, "%s: %s: \"%.32s\" is not a lease id; registering on a lease of its own", w->id, path, text);
        lease = 0;
      }
      free(text);
      return lease;
    }
    if (newt_deadline_passed(d)) {
      NEWT_INFO(WORKER, "%s: no host lease in %s yet; registering on a lease of its own", w->id, path);
      return 0;
    }
  }
}

/* The host agent's gateway (rendezvous/gateway.h), at the socket the agent names in
 * NEWT_HOST_GATEWAY: the transactions on the host's lease go there, so that the host's
 * workers cost etcd one write together (a gateway that cannot be reached: straight to etcd). */
static void host_gateway(worker *w, int64_t host) {
  const char *path = getenv("NEWT_HOST_GATEWAY");
  if (w->gateway || host <= 0 || !path || !*path) return;
  if (rdzv_gateway_client_new(path, &w->gateway) != NEWT_OK) {
    NEWT_WARN(WORKER, "%s: host gateway %s: %s; writing to etcd itself", w->id, path, newt_errmsg());
    w->gateway = NULL;
  }
}

/* --- the registration ------------------------------------------------------------------------ */

/* A lost lease does not stop training: the data plane needs no etcd. The publisher renews
 * the registration (the same lease, when etcd kept it across a restart); if the leader
 * planned without us meanwhile, its plan drops our generation. */
static void on_lease_lost(void *ud, int64_t lease, const char *why) {
  worker *w = ud;
  NEWT_WARN(WORKER, "%s: registration lease %llx lost (%s); renewing it", w->id, (unsigned long long)lease, why);
  pthread_mutex_lock(&w->mu);
  atomic_store(&w->lease_lost, 1);
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

newt_result_t worker_register(worker *w) {
  job_worker reg;
  memset(&reg, 0, sizeof reg);
  snprintf(reg.id, sizeof reg.id, "%s", w->id);
  snprintf(reg.host, sizeof reg.host, "%s", w->host);
  snprintf(reg.domain, sizeof reg.domain, "%s", w->domain);
  snprintf(reg.addr, sizeof reg.addr, "%s", w->addr);
  reg.device = w->device;
  reg.shares_device = w->o.share_device;
  snprintf(reg.state, sizeof reg.state, "joining");
  reg.pid = getpid();
  reg.generation = (int64_t)w->gen;
  int64_t ttl_s = (w->spec.lease_ttl_ms + 999) / 1000;
  /* a previous registration of ours (same id) may still be alive for up to its TTL after
     a restart or a lost lease: retry until it is gone; etcd away: wait for it */
  newt_deadline_t d = newt_deadline_in_ms(2 * w->spec.lease_ttl_ms + 5000);
  for (;;) {
    int64_t host = host_lease(w);
    host_gateway(w, host);
    job_host_route via = {.gateway = w->gateway};
    newt_result_t r = host > 0 ? job_register_via(w->etcd, w->o.job, &reg, host, &via, ttl_s, on_lease_lost, w,
                                                   job_call_deadline(), &w->reg)
                               : job_register(w->etcd, w->o.job, &reg, ttl_s, on_lease_lost, w, job_call_deadline(),
                                               &w->reg);
    if (r == NEWT_OK || worker_stop_asked(w)) return r;
    if (r == NEWT_ERR_CONFLICT && newt_deadline_passed(d)) return r;
    if (r != NEWT_ERR_CONFLICT && !rdzv_etcd_transient(r)) return r;
    if (rdzv_etcd_transient(r)) {
      NEWT_WARN(WORKER, "%s: registering: %s (waiting for etcd)", w->id, newt_errmsg());
      newt_sleep_ms(1000);
    }
    newt_sleep_ms(200);
  }
}

/* --- the publisher ------------------------------------------------------------------------- */

/* Queues a write for the publisher (latest value per key wins). */
static void publish(worker *w, const char *key, char *value, int on_lease) {
  pthread_mutex_lock(&w->mu);
  if (worker_pubq_put(&w->pub, key, value, on_lease) != 0)
    NEWT_WARN(WORKER, "%s: publisher queue full, dropping %s", w->id, key);
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static newt_result_t write_registration(worker *w, const char *state, const char *ack, uint64_t gen);


/* Waits a little before retrying a write (called with mu held). */
static void retry_pause(worker *w) { worker_wait_cv(w, 100); }

static void *publisher(void *arg) {
  worker *w = arg;
  pthread_mutex_lock(&w->mu);
  while (!w->pub_stop) {
    if (atomic_load(&w->lease_lost) && w->reg) {
      pthread_mutex_unlock(&w->mu);
      newt_result_t r = rdzv_registration_renew(w->reg, job_call_deadline());
      pthread_mutex_lock(&w->mu);
      if (r == NEWT_OK) {
        atomic_store(&w->lease_lost, 0);
        atomic_store(&w->renewed, 1);
        w->pub_ack_held = 0; /* an acknowledgement refused meanwhile goes into the renewed one */
        NEWT_INFO(WORKER, "%s: registration renewed (lease %llx)", w->id,
                  (unsigned long long)rdzv_registration_lease(w->reg));
      } else {
        retry_pause(w);
      }
      continue;
    }
    if (w->pub_state[0] || (w->pub_ack[0] && !w->pub_ack_held)) {
      /* a state and an acknowledgement queued together are one write */
      char state[sizeof w->pub_state], ack[sizeof w->pub_ack] = "";
      snprintf(state, sizeof state, "%s", w->pub_state);
      if (!w->pub_ack_held) snprintf(ack, sizeof ack, "%s", w->pub_ack);
      uint64_t ack_gen = w->pub_ack_gen, gen = w->gen;
      w->pub_state[0] = '\0';
      if (!w->pub_ack_held) w->pub_ack[0] = '\0';
      pthread_mutex_unlock(&w->mu);
      newt_result_t r;
      if (ack[0] && ack_gen != gen) { /* moved on meanwhile: an old generation's ack is no news */
        NEWT_DEBUG(WORKER, "%s: the acknowledgement of generation %llu is stale (now %llu)", w->id,
                   (unsigned long long)ack_gen, (unsigned long long)gen);
        ack[0] = '\0';
      }
      r = write_registration(w, state[0] ? state : NULL, ack[0] ? ack : NULL, gen);
      pthread_mutex_lock(&w->mu);
      if (r == NEWT_ERR_CONFLICT && rdzv_registration_shared(w->reg)) {
        /* our key on the host's lease was deleted (fenced, or taken for dead by the agent
           while it was stopped) while the lease lives on: nothing else tells us, so
           register again, as a worker whose own lease was revoked does */
        NEWT_WARN(WORKER, "%s: the registration on the host's lease is gone; registering again", w->id);
        atomic_store(&w->lease_lost, 1);
      }
      if (r != NEWT_OK && ack[0] && !w->pub_ack[0]) {
        /* not written: keep the acknowledgement, unless a newer one came meanwhile; when the
           registration is no longer ours (its lease went), until it is renewed */
        snprintf(w->pub_ack, sizeof w->pub_ack, "%s", ack);
        w->pub_ack_gen = ack_gen;
        w->pub_ack_held = r == NEWT_ERR_CONFLICT;
      }
      if (r != NEWT_OK && r != NEWT_ERR_CONFLICT) {
        /* etcd away: try again, unless a newer state came meanwhile */
        if (state[0] && !w->pub_state[0]) snprintf(w->pub_state, sizeof w->pub_state, "%s", state);
        retry_pause(w);
      }
      continue;
    }
    worker_pub_item it;
    if (!worker_pubq_take(&w->pub, &it)) {
      pthread_cond_wait(&w->cv, &w->mu);
      continue;
    }
    int64_t lease = it.on_lease && w->reg ? rdzv_registration_lease(w->reg) : 0;
    pthread_mutex_unlock(&w->mu);
    newt_result_t r = rdzv_etcd_put(w->etcd, it.key, it.value, strlen(it.value), lease, job_call_deadline(), NULL);
    pthread_mutex_lock(&w->mu);
    if (r != NEWT_OK && !w->pub_stop) {
      /* etcd away or full: keep it for another try, unless a newer value came meanwhile
         (which may sit in another slot: the older one must not follow it into etcd); say
         so when it starts and every 30 s, not at every try */
      uint64_t now = newt_now_ns();
      if (!w->pub_failing || now - w->pub_warned > 30000000000ull) {
        NEWT_WARN(WORKER, "%s: writing %s: %s (trying again until etcd takes it)", w->id, it.key, newt_errmsg());
        w->pub_warned = now;
      }
      w->pub_failing = 1;
      if (worker_pubq_retry(&w->pub, &it) < 0)
        NEWT_WARN(WORKER, "%s: publisher queue full, dropping %s", w->id, it.key);
      retry_pause(w);
    } else {
      if (r == NEWT_OK && w->pub_failing) NEWT_INFO(WORKER, "%s: etcd takes writes again", w->id);
      if (r == NEWT_OK) w->pub_failing = 0;
      free(it.value);
    }
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

int64_t worker_done_wait_ms(void) { return newt_param_DoneWaitMs(); }

void worker_publisher_flush(worker *w, newt_deadline_t d) {
  while (w->pub_running) {
    pthread_mutex_lock(&w->mu);
    int pending = w->pub_state[0] != '\0' || (w->pub_ack[0] != '\0' && !w->pub_ack_held) || worker_pubq_pending(&w->pub);
    pthread_mutex_unlock(&w->mu);
    if (!pending || newt_deadline_passed(d)) break;
    newt_sleep_ms(5);
  }
}

/* Writes everything still queued (at exit). */
void worker_publisher_stop(worker *w) {
  if (!w->pub_running) return;
  /* long enough for etcd to come back from a restart: the last states matter */
  worker_publisher_flush(w, newt_deadline_in_ms(w->spec.lease_ttl_ms + 3000));
  pthread_mutex_lock(&w->mu);
  w->pub_stop = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->pub_thread, NULL);
  w->pub_running = 0;
  worker_pubq_free(&w->pub);
}

newt_result_t worker_publisher_start(worker *w) {
  if (pthread_create(&w->pub_thread, NULL, publisher, w) != 0)
    return NEWT_ERR(NEWT_ERR_SYS, "cannot start the publisher thread");
  w->pub_running = 1;
  return NEWT_OK;
}

/* Rewrites the registration at generation gen: a new state (NULL: the same), and the
 * acknowledgement of gen when ack is not NULL. */
static newt_result_t write_registration(worker *w, const char *state, const char *ack, uint64_t gen) {
  if (!w->reg || atomic_load(&w->lease_lost))
    return NEWT_ERR(NEWT_ERR_UNAVAILABLE, "%s: the registration is being renewed", w->id);
  newt_result_t r = ack ? job_registration_ack(w->reg, state, (int64_t)gen, ack, job_call_deadline())
                        : job_registration_update(w->reg, state, (int64_t)gen, job_call_deadline());
  if (r != NEWT_OK)
    NEWT_WARN(WORKER, "%s: updating the registration%s%s%s: %s", w->id, state ? " to " : "", state ? state : "",
              ack ? " (acknowledging its generation)" : "", newt_errmsg());
  return r;
}

newt_result_t worker_set_state(worker *w, const char *state) {
  pthread_mutex_lock(&w->mu);
  uint64_t gen = w->gen;
  pthread_mutex_unlock(&w->mu);
  return write_registration(w, state, NULL, gen);
}

void worker_set_state_async(worker *w, const char *state) {
  pthread_mutex_lock(&w->mu);
  snprintf(w->pub_state, sizeof w->pub_state, "%s", state);
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

/* --- the records ----------------------------------------------------------------------------- */

/* Queues a record for the publisher: value is malloc'd (NULL: out of memory, nothing
 * queued). */
static void publish_record(worker *w, job_record rec, uint64_t generation, char *value, int on_lease) {
  char key[256];
  if (value && job_key(key, sizeof key, w->o.job, rec, generation, w->id) == NEWT_OK)
    publish(w, key, value, on_lease);
  else
    free(value);
}

/* A report of generation p, proved with the job secret and the salt of the leader's plan of
 * that generation (job_report_seal: the survivors' own generation has the same number and a
 * salt of its own, which the leader never sees), queued for the publisher on our lease. */
static void publish_report(worker *w, const newt_plan *p, job_report *rep) {
  char key[256];
  const unsigned char *salt = p->generation == w->leader_gen ? w->leader_salt : p->secret;
  if (job_key(key, sizeof key, w->o.job, JOB_REC_REPORT, p->generation, w->id) != NEWT_OK ||
      job_report_seal(&w->auth, key, salt, PLAN_SECRET_BYTES, rep) != NEWT_OK) {
    NEWT_WARN(WORKER, "%s: the report of generation %llu is not written: %s", w->id, (unsigned long long)p->generation,
              newt_errmsg());
    return;
  }
  publish_record(w, JOB_REC_REPORT, p->generation, job_report_to_json(rep), 1);
}

void worker_report(worker *w, const newt_plan *p, int hang, int build, const char *const *accused, int naccused,
                   const char *why) {
  job_report rep = {.hang = hang, .build = build, .step = w->committed_step, .done_step = w->done_step,
                    .t_ms = w->t_detect};
  snprintf(rep.worker, sizeof rep.worker, "%s", w->id);
  for (int i = 0; i < naccused && rep.naccuse < JOB_ACCUSE_MAX; i++)
    snprintf(rep.accuse[rep.naccuse++], sizeof rep.accuse[0], "%s", accused[i]);
  snprintf(rep.why, sizeof rep.why, "%s", why);
  /* through the publisher, which wakes at once: while etcd is away it is written when
     etcd answers again, so the leader still learns whom the survivors lost */
  publish_report(w, p, &rep);
  char names[256] = "";
  for (int i = 0; i < rep.naccuse; i++) newt_list_add(names, sizeof names, rep.accuse[i]);
  NEWT_WARN(WORKER, "%s: generation %llu failed (%s): %s%s%s", w->id, (unsigned long long)p->generation,
            hang ? "hang" : "crash", why, names[0] ? "; names " : "", names);
}

void worker_report_fatal(worker *w, const newt_plan *p, const char *why) {
  job_report rep = {.step = w->committed_step, .t_ms = newt_wall_ms()};
  snprintf(rep.worker, sizeof rep.worker, "%s", w->id);
  snprintf(rep.why, sizeof rep.why, "the job fails");
  snprintf(rep.fatal, sizeof rep.fatal, "%s", why);
  publish_report(w, p, &rep);
}

void worker_publish_mismatch(worker *w, int64_t step, int64_t back_to, const char *action, const char *why) {
  job_report rep = {.step = w->committed_step, .t_ms = newt_wall_ms(), .mismatch_step = step, .back_to = back_to};
  snprintf(rep.worker, sizeof rep.worker, "%s", w->id);
  snprintf(rep.why, sizeof rep.why, "replicas disagree");
  snprintf(rep.mismatch, sizeof rep.mismatch, "%s", why);
  snprintf(rep.action, sizeof rep.action, "%s", action);
  if (strcmp(action, "fail") == 0) snprintf(rep.fatal, sizeof rep.fatal, "%s", why); /* one report: one key */
  publish_report(w, &w->plan, &rep);
}

void worker_publish_ack(worker *w, const char *state) {
  if (!w->reg) return;
  if (w->peer_epoch) { /* the survivors' own generation is no plan of the leader's: no ack */
    if (state) worker_set_state_async(w, state);
    return;
  }
  job_ack a = {.rank = w->me->rank, .t_plan = w->t_plan_seen, .t_comm = w->t_comm, .t_restore = w->t_restore,
               .t_step = w->t_first_step, .restore_step = w->restore_step};
  snprintf(a.restore, sizeof a.restore, "%s", w->restore_src);
  char key[256];
  if (job_key(key, sizeof key, w->o.job, JOB_REC_WORKER, 0, w->id) != NEWT_OK ||
      job_ack_seal(&w->auth, key, (int64_t)w->plan.generation, w->plan.secret, sizeof w->plan.secret, &a) != NEWT_OK)
    NEWT_WARN(WORKER, "%s: the acknowledgement of generation %llu is not proved: %s", w->id,
              (unsigned long long)w->plan.generation, newt_errmsg());
  char *ack = job_ack_to_json(&a);
  if (!ack || strlen(ack) >= sizeof w->pub_ack) { /* cannot be: an ack is ~150 bytes */
    NEWT_ERROR(WORKER, "%s: the acknowledgement of generation %llu does not fit the registration", w->id,
               (unsigned long long)w->plan.generation);
    free(ack);
    if (state) worker_set_state_async(w, state);
    return;
  }
  pthread_mutex_lock(&w->mu);
  snprintf(w->pub_ack, sizeof w->pub_ack, "%s", ack);
  w->pub_ack_gen = w->plan.generation;
  w->pub_ack_held = 0;
  if (state) snprintf(w->pub_state, sizeof w->pub_state, "%s", state);
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  free(ack);
}

void worker_publish_progress(worker *w, double loss, double tps, int64_t step_tokens) {
  uint64_t now = newt_wall_ms();
  if (now - w->progress_ms < (uint64_t)newt_param_ProgressMs() && w->live_step < w->spec.steps) return;
  w->progress_ms = now;
  w->last_tps = tps;
  w->last_step_tokens = step_tokens;
  const newt_plan *p = &w->plan;
  job_progress pr = {.generation = p->generation, .step = w->live_step, .committed = w->committed_step,
                     .loss = loss, .tokens_per_s = tps,
                     .world = p->nranks, .dp = p->dp, .t_ms = now,
                     .step_tokens = step_tokens};
  worker_speed_summary(&w->speed, now, &pr);
  publish_record(w, JOB_REC_PROGRESS, 0, job_progress_to_json(&pr), 0);
}

void worker_publish_links(worker *w, const job_links *l) {
  job_links sealed = *l;
  char key[256];
  if (job_key(key, sizeof key, w->o.job, JOB_REC_LINKS, 0, w->id) != NEWT_OK ||
      job_links_seal(&w->auth, key, &sealed) != NEWT_OK) {
    NEWT_WARN(WORKER, "%s: its links record is not written: %s", w->id, newt_errmsg());
    return;
  }
  publish_record(w, JOB_REC_LINKS, 0, job_links_to_json(&sealed), 1);
}

void worker_publish_ckpt(worker *w, int64_t step, int64_t bytes, int64_t save_ms, double stall_ms) {
  job_ckpt c = {.step = step, .bytes = bytes, .save_ms = save_ms, .stall_ms = stall_ms, .skipped = w->ckpt_skipped};
  snprintf(c.dir, sizeof c.dir, "%s", w->spec.ckpt_dir);
  w->ckpt_pub = c;
  publish_record(w, JOB_REC_CKPT, 0, job_ckpt_to_json(&c), 0);
}

void worker_publish_ckpt_skips(worker *w) {
  if (w->ckpt_pub.step <= 0) return; /* no checkpoint to point at yet: the first commit's record carries the count */
  w->ckpt_pub.skipped = w->ckpt_skipped;
  publish_record(w, JOB_REC_CKPT, 0, job_ckpt_to_json(&w->ckpt_pub), 0);
}

/* Whether the end marker in etcd (kv) is a true one, as this rank would write it: proved by
 * a rank of the job (with the secret), the last step, and the loss and samples every rank
 * agreed on. */
static int done_is_true(const worker *w, const char *key, const rdzv_etcd_kv *kv, const job_done *mine) {
  job_done d;
  return job_done_from_json(kv->value, kv->value_len, &d) == NEWT_OK && job_done_plausible(&d, &w->spec) &&
         job_done_check(&w->auth, key, &d) == NEWT_OK && d.step == mine->step && d.samples == mine->samples &&
         (d.loss == mine->loss || (isnan(d.loss) && isnan(mine->loss)));
}

/* Writes the end marker unless a true one is there already (another rank's): every rank
 * writes it, the first one wins; one that is not true (a forged or corrupt record,
 * done_is_true) is replaced. The job's progress of the last step goes in the same
 * transaction, before the marker: a reader believes an end marker only when the progress it
 * has seen reached its step (job_done_counts), and sees them in this order. */
static newt_result_t put_done(worker *w, const char *key, const char *val, const job_done *mine, const char *pkey,
                              const char *prog) {
  rdzv_etcd_cmp absent = {.key = key, .target = RDZV_CMP_CREATE, .result = RDZV_CMP_EQUAL, .number = 0};
  rdzv_etcd_op puts[2] = {{.type = RDZV_OP_PUT, .key = pkey, .value = prog, .value_len = strlen(prog)},
                          {.type = RDZV_OP_PUT, .key = key, .value = val, .value_len = strlen(val)}};
  rdzv_etcd_op get = {.type = RDZV_OP_RANGE, .key = key};
  rdzv_etcd_txn_result tr;
  NEWT_CHECK(rdzv_etcd_txn(w->etcd, &absent, 1, puts, 2, &get, 1, job_call_deadline(), &tr));
  int there = tr.succeeded;
  if (!there && tr.n == 1 && tr.results[0].range.n == 1) there = done_is_true(w, key, &tr.results[0].range.kvs[0], mine);
  rdzv_etcd_txn_result_free(&tr);
  if (there) return NEWT_OK;
  NEWT_WARN(WORKER, "%s: the end marker in etcd is not this job's true end: written again", w->id);
  return rdzv_etcd_txn(w->etcd, NULL, 0, puts, 2, NULL, 0, job_call_deadline(), NULL);
}

void worker_mark_done(worker *w, double loss) {
  job_done d = {.step = w->live_step, .loss = loss, .t_ms = newt_wall_ms(), .samples = worker_cursor(w)};
  const newt_plan *p = &w->plan;
  job_progress pr = {.generation = p->generation, .step = w->live_step, .committed = w->committed_step,
                     .loss = loss, .tokens_per_s = w->last_tps, .world = p->nranks, .dp = p->dp,
                     .t_ms = d.t_ms, .step_tokens = w->last_step_tokens};
  char key[256], pkey[256];
  char *val = NULL, *prog = job_progress_to_json(&pr);
  if (job_key(key, sizeof key, w->o.job, JOB_REC_DONE, 0, NULL) == NEWT_OK &&
      job_key(pkey, sizeof pkey, w->o.job, JOB_REC_PROGRESS, 0, NULL) == NEWT_OK &&
      job_done_seal(&w->auth, key, &d) == NEWT_OK)
    val = job_done_to_json(&d);
  if (!val || !prog) {
    NEWT_WARN(WORKER, "%s: marking the job done: %s", w->id, *newt_errmsg() ? newt_errmsg() : "out of memory");
    free(val);
    free(prog);
    return;
  }
  /* the end marker is what ends the job for everyone: wait for etcd as long as it takes
     (NEWT_DONE_WAIT_MS), or until asked to stop; what this rank queued before it (the
     generation's acknowledgement, the last progress) goes first, so that the leader, which
     stops reading at the end marker, has seen it (a generation that ran to the end within
     moments is still recorded) */
  newt_deadline_t until = newt_deadline_in_ms(newt_param_DoneWaitMs());
  worker_publisher_flush(w, newt_deadline_in_ms(w->spec.lease_ttl_ms + 3000));
  /* every rank writes it (put_done): a rank 0 killed between the last step and its marker
     must not leave a finished job unfinished */
  for (;;) {
    newt_result_t r = put_done(w, key, val, &d, pkey, prog);
    if (r == NEWT_OK) break;
    if (!rdzv_etcd_transient(r) || newt_deadline_passed(until) || worker_stop_asked(w)) {
      NEWT_WARN(WORKER, "%s: marking the job done: %s", w->id, newt_errmsg());
      break;
    }
    NEWT_WARN(WORKER, "%s: marking the job done: %s (waiting for etcd)", w->id, newt_errmsg());
    newt_sleep_ms(500);
  }
  free(val);
  free(prog);
}
