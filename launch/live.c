/* What people see of a run as it goes (run.h): the live line, and the step log it follows.
 *
 * Rank 0 appends a line a step to the step log (job/runlog.h), the run's own file: each step
 * reaches the launcher through it even while etcd is away, so the chaos schedule fires at its
 * step and the live line moves whatever etcd does. News lines (a recovery, a fault fired)
 * start with live_news, which ends an open live line first. */
#include <stdio.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/strutil.h"
#include "job/runlog.h"
#include "launch/run.h"

const char *live_news(run *r) {
  const char *s = r->line_open ? "\n" : "";
  r->line_open = 0;
  return s;
}

/* A step log line in another world than the last while etcd is away: the survivors of a
 * crash went on among themselves (worker/peers.c); the leader's plan, and its "recovered"
 * line, come only once etcd is back. Says so, timed from the newest worker fault before it. */
static void resumed_line(run *r, const job_step *s) {
  int64_t prev = r->steps_world;
  r->steps_world = s->world;
  if (!prev || s->world == prev || !follow_etcd_away(r) || r->o->quiet) return;
  const fault *f = NULL;
  for (int i = 0; i < r->nfaults; i++)
    if (r->faults[i].ev.target == CHAOS_WORKER && r->faults[i].answer != CHAOS_ANSWER_JOINERS &&
        r->faults[i].t_ms <= s->t_ms)
      f = &r->faults[i];
  if (!f) return;
  fprintf(stderr, "%snewt run: training resumed without etcd at step %lld, %lld ms after %s: %lld ranks (the survivors "
          "went on among themselves; the leader's plan follows once etcd is back)\n", live_news(r), (long long)s->step,
          (long long)(s->t_ms - f->t_ms), f->what, (long long)s->world);
}

/* A step of the log into the run's picture, where it is newer than what etcd said. */
static void take_step(run *r, const job_step *s) {
  pthread_mutex_lock(&r->mu);
  if (s->restarts > r->restarts) r->restarts = s->restarts;
  if (s->step > r->step || (int64_t)s->generation > r->gen) {
    if (s->step > r->step) r->step = s->step;
    r->gen = (int64_t)s->generation;
    r->loss = s->loss;
    r->tps = s->tokens_per_s;
    r->world = (int)s->world;
    r->dp = (int)s->dp;
  }
  pthread_mutex_unlock(&r->mu);
}

/* Reads what was appended since the last look, at most 64 KiB a call; a line that does not
 * parse (torn by a killed writer, or longer than the buffer) is skipped. 1 when it read some. */
int live_follow_steps(run *r) {
  char chunk[65536];
  ssize_t got = r->steps_fd >= 0 ? read(r->steps_fd, chunk, sizeof chunk) : 0;
  for (ssize_t i = 0; i < got; i++) {
    if (chunk[i] != '\n') {
      if (r->steps_len < sizeof r->steps_line) r->steps_line[r->steps_len++] = chunk[i];
      else r->steps_long = 1;
      continue;
    }
    job_step s;
    if (!r->steps_long && job_step_from_json(r->steps_line, r->steps_len, &s) == NEWT_OK) {
      resumed_line(r, &s);
      take_step(r, &s);
    }
    r->steps_len = 0;
    r->steps_long = 0;
  }
  return got > 0;
}

/* etcd away (our watch of it broke, and nothing came since): " | etcd unreachable for 12s". */
static void away_for(run *r, char *out, size_t cap) {
  pthread_mutex_lock(&r->mu);
  uint64_t lost = r->etcd_lost_ms;
  pthread_mutex_unlock(&r->mu);
  out[0] = '\0';
  if (!lost) return;
  char d[32];
  uint64_t wall = newt_wall_ms();
  snprintf(out, cap, " | etcd unreachable for %s", newt_fmt_duration(wall > lost ? (double)(wall - lost) / 1e3 : 0, d, sizeof d));
}

/* The restart mode's line: the program's step, its loss and the restarts. */
static void restart_line(run *r, double now) {
  r->t_line = now;
  char took[32];
  newt_fmt_duration(now - r->t0, took, sizeof took);
  const char *rec = r->res->nrecoveries == 1 ? "recovery" : "recoveries";
  if (r->step <= 0)
    fprintf(stderr, "%snewt run: starting %d programs: no NEWT_STEP line yet, %s in%s", r->tty ? "\r\033[K" : "",
            r->o->nproc, took, r->tty ? "" : "\n");
  else
    fprintf(stderr, "%snewt run: the program's step %lld, loss %.4f, world %d, generation %lld, %lld restart%s, %d %s, "
            "%s in%s", r->tty ? "\r\033[K" : "", (long long)r->step, r->loss, r->world, (long long)r->gen,
            (long long)r->restarts, r->restarts == 1 ? "" : "s", r->res->nrecoveries, rec, took, r->tty ? "" : "\n");
  r->line_open = r->tty;
  fflush(stderr);
}

/* On a terminal: one line refreshed in place, with the time left at the pace since the first
 * step seen. Elsewhere (a log file, a CI console): a plain line every few seconds, and the
 * last one. No loss is shown before the first step. */
void live_line(run *r, int last) {
  if (r->o->quiet) return;
  double now = newt_now_s();
  int64_t step = r->step, steps = r->o->spec.steps;
  if (r->o->spec.restart) { /* the program's steps: newt knows no total, no tokens */
    if (last || r->tty || now - r->t_line >= 5.0) restart_line(r, now);
    return;
  }
  if (step > 0 && !r->t_step0) r->t_step0 = now, r->step0 = step;
  if (!r->tty && !last && now - r->t_line < 5.0) return;
  r->t_line = now;
  char took[32], left[48] = "", away[64];
  newt_fmt_duration(now - r->t0, took, sizeof took);
  if (step > r->step0 && step < steps && now > r->t_step0) {
    char d[32];
    double rate = (double)(step - r->step0) / (now - r->t_step0);
    snprintf(left, sizeof left, r->tty ? ", ETA %s" : ", about %s to go", newt_fmt_duration((double)(steps - step) / rate, d, sizeof d));
  }
  away_for(r, away, sizeof away);
  const char *rec = r->res->nrecoveries == 1 ? "recovery" : "recoveries";
  if (r->tty && step <= 0)
    fprintf(stderr, "\r\033[Kstarting %d workers: waiting for the first step | %s", r->o->nproc, took);
  else if (r->tty)
    fprintf(stderr, "\r\033[Kstep %lld/%lld (%.0f%%) | loss %.4f | %.0f tok/s | world %d (dp %d) | gen %lld | %d %s | %s%s%s",
            (long long)step, (long long)steps, 100.0 * (double)step / (double)steps, r->loss, r->tps, r->world, r->dp,
            (long long)r->gen, r->res->nrecoveries, rec, took, left, away);
  else if (step <= 0)
    fprintf(stderr, "newt run: starting %d workers: no step yet, %s in\n", r->o->nproc, took);
  else
    fprintf(stderr, "newt run: step %lld/%lld (%.0f%%), loss %.4f, %.0f tokens/s, world %d (dp %d), generation %lld, %d %s, %s in%s%s\n",
            (long long)step, (long long)steps, 100.0 * (double)step / (double)steps, r->loss, r->tps, r->world, r->dp,
            (long long)r->gen, r->res->nrecoveries, rec, took, left, away);
  r->line_open = r->tty;
  fflush(stderr);
}
