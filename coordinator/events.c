/* What the leader says: events posted to the job (and its event log), and warnings that
 * would repeat every tick while etcd is away or full, rate-limited. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "coordinator/coord.h"
#include "job/runlog.h"
#include "job/store.h"

void coord_warn_limited(coord *c, const char *what, const char *msg) {
  uint64_t now = newt_now_ns();
  if (strncmp(c->last_warn_msg, msg, sizeof c->last_warn_msg - 1) == 0 && now - c->last_warn < 10000000000ull) return;
  c->last_warn = now;
  snprintf(c->last_warn_msg, sizeof c->last_warn_msg, "%s", msg);
  NEWT_WARN(COORD, "%s: %s: %s (trying again)", c->id, what, msg);
}

void coord_post_said(coord *c) {
  job_event said[sizeof c->said / sizeof c->said[0]];
  pthread_mutex_lock(&c->mu);
  int n = c->nsaid;
  memcpy(said, c->said, (size_t)n * sizeof *said);
  c->nsaid = 0;
  pthread_mutex_unlock(&c->mu);
  for (int i = 0; i < n; i++) {
    NEWT_WARN(COORD, "%s: %s", said[i].worker, said[i].why);
    coord_post_event(c, &said[i]);
  }
}

void coord_post_event(coord *c, job_event *ev) {
  ev->t_ms = newt_wall_ms();
  snprintf(ev->coordinator, sizeof ev->coordinator, "%s", c->id);
  if (c->event_log_fd >= 0 && job_eventlog_append(c->event_log_fd, ev) != NEWT_OK)
    coord_warn_limited(c, "writing the event log", newt_errmsg());
  char *text = job_event_to_json(ev);
  if (text && job_event_post(c->etcd, c->o->job, text, job_call_deadline()) != NEWT_OK)
    coord_warn_limited(c, "posting an event", newt_errmsg());
  free(text);
}
