/* etcd unwell, and well again. Out of space, it refuses every write (no plan, event or
 * progress can land) while training goes on on the data plane: said once, and once when it
 * takes writes again. After an outage the picture's clocks are stale (no progress could be
 * published, no lease renewed), and an etcd without a persistent volume may come back empty:
 * the leader puts back the spec and its plan. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/strutil.h"
#include "coordinator/coord.h"
#include "job/store.h"

/* Every 5 s at most. */
void coord_check_alarms(coord *c) {
  uint64_t now = newt_now_ns();
  if (c->alarms_checked && now - c->alarms_checked < 5000000000ull) return;
  c->alarms_checked = now;
  int nospace = 0, corrupt = 0;
  if (rdzv_etcd_alarms(c->etcd, job_call_deadline(), &nospace, &corrupt) != NEWT_OK) return;
  if (nospace && !c->nospace_since) {
    c->nospace_since = newt_wall_ms();
    NEWT_ERROR(COORD, "%s: etcd is out of space (NOSPACE alarm): it refuses every write until space is freed "
               "(etcdctl compact, etcdctl defrag, etcdctl alarm disarm); training goes on, plans wait", c->id);
  } else if (!nospace && c->nospace_since) {
    char d[32];
    job_event ev = {.type = JOB_EV_ETCD};
    snprintf(ev.why, sizeof ev.why, "etcd was out of space (NOSPACE alarm) for %s; it takes writes again",
             newt_fmt_duration((double)(newt_wall_ms() - c->nospace_since) / 1e3, d, sizeof d));
    NEWT_WARN(COORD, "%s: %s", c->id, ev.why);
    coord_post_event(c, &ev); /* what could not be said while it was full */
    c->nospace_since = 0;
  }
  metrics_set(c->metrics, "newt_etcd_nospace", nospace);
}

/* The spec, where etcd lost it. */
static void restore_spec(coord *c) {
  char key[256];
  rdzv_etcd_kv kv;
  if (job_key(key, sizeof key, c->o->job, JOB_REC_SPEC, 0, NULL) != NEWT_OK) return;
  newt_result_t r = rdzv_etcd_get(c->etcd, key, job_call_deadline(), &kv, NULL);
  if (r == NEWT_OK) rdzv_etcd_kv_free(&kv);
  else if (r == NEWT_ERR_NOTFOUND) {
    char *spec = spec_to_json(&c->spec);
    if (spec && job_spec_put(c->etcd, c->o->job, spec, job_call_deadline()) == NEWT_OK)
      NEWT_WARN(COORD, "%s: etcd had lost the job's spec; stored it again", c->id);
    free(spec);
  }
}

/* Why the stored plan is not ours as it should be (NULL: it is, or etcd did not answer). */
static const char *plan_lost(coord *c, const newt_plan *ours) {
  job_change ch;
  newt_result_t r = job_change_get(c->etcd, c->o->job, JOB_REC_PLAN, job_call_deadline(), &ch);
  if (r == NEWT_ERR_NOTFOUND) return "etcd had lost the plan";
  if (r == NEWT_ERR_INVALID) return "the stored plan was not valid";
  if (r != NEWT_OK) return NULL;
  /* an older one, or a newer one we would not take: forged or corrupt (a newer one we would
     take is the watch's to bring) */
  const newt_plan *stored = &ch.u.plan;
  int newer_refused = stored->generation > ours->generation &&
                      (plan_check_spec(stored, &c->spec) != NEWT_OK ||
                       plan_check_jump(ours->generation, stored->generation) != NEWT_OK);
  int forged = stored->generation < ours->generation || newer_refused;
  job_change_free(&ch);
  return forged ? "the stored plan was not one of this job's (forged or corrupt)" : NULL;
}

/* The current plan under its own generation (workers take only newer plans, so it changes
 * nothing for them; joiners find it) where the stored one is gone, invalid, older, or newer
 * and forged. */
void coord_restore_records(coord *c) {
  restore_spec(c);
  pthread_mutex_lock(&c->mu);
  newt_plan p = {0};
  newt_result_t cr = c->plan.generation ? plan_copy(&p, &c->plan) : NEWT_ERR_NOTFOUND;
  pthread_mutex_unlock(&c->mu);
  if (cr != NEWT_OK) return;
  const char *lost = plan_lost(c, &p);
  if (lost) {
    if (job_plan_publish_plan(c->cand, c->o->job, &p, job_call_deadline(), NULL) == NEWT_OK)
      NEWT_WARN(COORD, "%s: %s; published generation %llu again", c->id, lost, (unsigned long long)p.generation);
  }
  plan_free(&p);
}

/* The stall clock starts again, and every rank gets a lease TTL (and the join window) to
 * renew its registration before a missing one counts as gone; a rank that died during the
 * outage was reported by the survivors (their reports are queued until etcd answers) or
 * stops the steps. */
void coord_after_outage(coord *c) {
  c->outages_seen = rdzv_etcd_outages_ended(c->etcd);
  pthread_mutex_lock(&c->mu);
  uint64_t now = newt_now_ns();
  c->prog_change = c->stall_from = now;
  c->first_gone = 0;
  c->outage_end = now;
  pthread_mutex_unlock(&c->mu);
  NEWT_INFO(COORD, "%s: etcd answers again; members have %lld ms to renew their registrations", c->id,
            (long long)(c->spec.lease_ttl_ms + c->spec.join_window_ms));
  coord_restore_records(c);
}
