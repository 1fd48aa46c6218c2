/* Workers held out of plans. A worker the leader fences while it is still registered (it was
 * on another side of a partition or cut, it stopped or hung, a build could not take it in)
 * registers again at once, and would stop the job the same way if a plan took it straight
 * back: it is held out until it says it reaches every rank of a later plan (its links/<id>,
 * coord_put_links), and past its hold-out while it says it does not (coord_held_refresh_locked).
 * docs/elastic.md, "Back as soon as the links work". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/strutil.h"
#include "coordinator/coord.h"

/* The hold of id, added when it has none (NULL: no memory). Called with mu held. */
static c_held *held_of(coord *c, const char *id) {
  int i = 0;
  while (i < c->nheld && strcmp(c->held[i].id, id) != 0) i++;
  if (i < c->nheld) return &c->held[i];
  c_held *h = realloc(c->held, (size_t)(c->nheld + 1) * sizeof *h);
  char (*ids)[RDZV_NAME_MAX] = realloc(c->held_ids, (size_t)(c->nheld + 1) * sizeof *ids);
  if (h) c->held = h;
  if (ids) c->held_ids = ids;
  if (!h || !ids) return NULL;
  memset(&c->held[i], 0, sizeof c->held[i]);
  snprintf(c->held[i].id, sizeof c->held[i].id, "%s", id);
  c->nheld++;
  return &c->held[i];
}

/* Holds id out from now (its strike counted), as a worker that failed generation gen: the
 * hold-out's length. Called with mu held; 0 when there is no memory for it. */
static int64_t hold_locked(coord *c, const char *id, uint64_t gen, int build) {
  c_held *h = held_of(c, id);
  if (!h) return 0;
  int64_t ms = policy_hold_out_ms(++h->strikes);
  h->until = newt_now_ns() + (uint64_t)ms * 1000000ull;
  h->gen = gen;
  h->build = build;
  h->saw_cut = 0;
  h->links_gen = 0;
  return ms;
}

void coord_hold_out(coord *c, const char *id, int build, const char *known) {
  pthread_mutex_lock(&c->mu);
  int64_t ms = hold_locked(c, id, c->plan.generation, build);
  pthread_mutex_unlock(&c->mu);
  if (!ms) return;
  char d[32];
  /* what is known, no more: the others lost it and its lease still held; whether it lives,
     only a registration after the fence will say */
  NEWT_WARN(COORD, "%s: %s is left out of generation %llu: %s, and its registration's lease had not run out: "
            "fenced. Should it be alive and register again, no plan takes it until it reaches every rank of a later "
            "one, or for %s at most while it says nothing", c->id, id, (unsigned long long)c->plan.generation, known,
            newt_fmt_duration((double)ms / 1e3, d, sizeof d));
}

void coord_held_registered_locked(coord *c, const char *id, const job_worker *w, int live) {
  uint64_t now = newt_now_ns();
  for (int i = 0; i < c->nheld; i++)
    if (strcmp(c->held[i].id, id) == 0 && c->held[i].until > now) {
      NEWT_INFO(COORD, "%s: %s registered again while held out: alive, though the others of generation %llu lost it "
                "(a cut or slow link, a stop, a build that could not take it in); held out", c->id, id,
                (unsigned long long)c->held[i].gen);
      return;
    }
  /* the same process back (its registration names the generation it was in; a new process
     says 0) after the plan in force left it out: its lease ran out while it lived -- a link
     too slow even for its keep-alives, a cut from etcd. Taken straight back, a slow link
     would stall the job again: held out as a fenced worker is, until its links are well */
  if (!live || w->generation <= 0 || !c->plan.generation || (uint64_t)w->generation >= c->plan.generation ||
      plan_find(&c->plan, id) || plan_is_spare(&c->plan, id))
    return;
  int64_t ms = hold_locked(c, id, (uint64_t)w->generation, 0);
  char d[32];
  if (ms)
    NEWT_INFO(COORD, "%s: %s registered again, alive since generation %lld, which plan %llu left it out of (its lease "
              "ran out: a slow or cut link?): held out until it reaches every rank of a later plan with its links "
              "well, or for %s at most while it says nothing", c->id, id, (long long)w->generation,
              (unsigned long long)c->plan.generation, newt_fmt_duration((double)ms / 1e3, d, sizeof d));
}

/* One held out since an earlier generation is let back at once when all of a
 * later plan's ranks answered and its links to them are well (the cut that kept it out
 * healed, the link that crawled carries data again), and kept out past its hold-out while
 * not (coord_held_refresh_locked). */
void coord_put_links(coord *c, const char *id, const job_links *l) {
  uint64_t now = newt_now_ns();
  for (int i = 0; i < c->nheld; i++) {
    c_held *h = &c->held[i];
    if (strcmp(h->id, id) != 0) continue;
    int was_held = h->until > now || h->said_kept;
    if (!l || (uint64_t)l->generation <= h->gen) { /* gone, or of the generation it failed */
      h->links_gen = 0;
      continue;
    }
    h->links_gen = l->generation;
    h->links_ok = l->answered == l->ranks && l->slow == 0; /* reached, and its data goes through */
    h->saw_cut |= !h->links_ok;
    if (!h->links_ok || !was_held || (h->build && !h->saw_cut)) continue;
    h->until = now;
    h->said_kept = 0;
    NEWT_INFO(COORD, "%s: %s reaches every rank of generation %lld again, its links well: its hold-out ends", c->id,
              id, (long long)l->generation);
  }
}

/* Those whose hold-out has not run out, and those that say they still do not reach every
 * rank of a plan after the one they failed (taken in, they would only fail its build). */
void coord_held_refresh_locked(coord *c) {
  uint64_t now = newt_now_ns();
  int before = c->nheld_ids;
  c->nheld_ids = 0;
  for (int i = 0; i < c->nheld; i++) {
    c_held *h = &c->held[i];
    int cut = h->links_gen > 0 && !h->links_ok;
    if (h->until <= now && cut && !h->said_kept) {
      h->said_kept = 1;
      NEWT_INFO(COORD, "%s: the hold-out of %s ran out, but it does not reach every rank of generation %lld, or its "
                "links to them are not well (links/%s): kept out until they are", c->id, h->id, (long long)h->links_gen,
                h->id);
    }
    if (h->until <= now && !cut) h->said_kept = 0;
    if (h->until > now || cut) snprintf(c->held_ids[c->nheld_ids++], RDZV_NAME_MAX, "%s", h->id);
  }
  /* one let back may make a larger layout: join_grows_layout's cached "no" is moot (the list
     only shrinks by releases; a new hold comes with a plan, which moots it anyway) */
  if (c->nheld_ids < before) c->join_checked_gen = UINT64_MAX;
}
