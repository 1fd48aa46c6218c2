/* Table-driven tests of the leader's policy (coordinator/policy.h): each row is a picture of
 * a job (its plan, the registered members and their states, the failure reports, who left,
 * and how long ago the clocks last moved) and the decision it must give: the reason (hence
 * the cause), a switch at the boundary or at once, fencing, and whom the next plan leaves
 * out. Every cause is covered, and the combinations the end-to-end suite injects (kill,
 * SIGSTOP, SIGTERM alone and in pairs, a lost coordinator, an etcd restart). */
#include <stdlib.h>
#include <string.h>

#include "coordinator/policy.h"
#include "test.h"

#define NOW (1000ull * 1000000000ull) /* an arbitrary monotonic now, in ns */
#define NEVER (-1)

typedef struct tcase {
  const char *name;
  const char *plan;     /* ranks of the current plan, in rank order; NULL: no plan yet */
  const char *members;  /* "w0 w1:leaving w2:done w3:noaddr": registered workers and states */
  const char *reports;  /* "w0:crash:w2@100 w1:hang@120": reporter, kind, accused (+-joined), t_ms; kind
                           "build" / "buildhang": a generation that never formed; "#65" after
                           t_ms: the report's step (else 0) */
  const char *departed; /* ranks that left gracefully since the plan */
  /* clocks: ms ago (NEVER: 0) */
  int64_t first_member, last_join, first_report, first_gone, progress;
  int start_workers; /* spec.parallel.start_workers */
  int join_grows;    /* the answer join_grows gives (-1: it must not be asked) */
  /* expected */
  policy_reason want;
  int boundary, fence;
  const char *excluded; /* space-separated, any order */
  int64_t outage;       /* etcd came back this many ms ago (0: no outage) */
} tcase;

static const tcase cases[] = {
    /* --- the first plan --- */
    {"initial: start_workers are here", NULL, "w0 w1 w2 w3", "", "", NEVER, 50, NEVER, NEVER, NEVER, 4, -1,
     POLICY_INITIAL, 1, 0, ""},
    {"initial: waiting for start_workers", NULL, "w0 w1", "", "", 100, 50, NEVER, NEVER, NEVER, 4, -1, POLICY_NONE, 0,
     0, ""},
    {"initial: start_timeout_ms passed", NULL, "w0 w1", "", "", 31000, 30000, NEVER, NEVER, NEVER, 4, -1,
     POLICY_INITIAL, 1, 0, ""},
    {"initial: joins settled", NULL, "w0 w1 w2", "", "", 2000, 1500, NEVER, NEVER, NEVER, 0, -1, POLICY_INITIAL, 1, 0,
     ""},
    {"initial: joins still arriving", NULL, "w0 w1 w2", "", "", 2000, 200, NEVER, NEVER, NEVER, 0, -1, POLICY_NONE, 0,
     0, ""},
    {"initial: nobody yet", NULL, "", "", "", NEVER, NEVER, NEVER, NEVER, NEVER, 0, -1, POLICY_NONE, 0, 0, ""},
    /* --- a healthy generation --- */
    {"healthy: nothing to do", "w0 w1 w2 w3", "w0 w1 w2 w3", "", "", 9000, 9000, NEVER, NEVER, 10, 0, 0, POLICY_NONE,
     0, 0, ""},
    /* --- crash (kill -9): survivors report a closed connection --- */
    {"crash: every survivor named the dead rank", "w0 w1 w2 w3", "w0 w1 w3", "w0:crash:w2@100 w1:crash:w2@101 w3:crash:w2@102",
     "", 9000, 9000, 5, NEVER, 10, 0, -1, POLICY_CRASH_REPORTED, 0, 1, "w2"},
    {"crash: the dead rank's lease still lives", "w0 w1 w2 w3", "w0 w1 w2 w3",
     "w0:crash:w2@100 w1:crash:w2@101 w3:crash:w2@102", "", 9000, 9000, 5, NEVER, 10, 0, -1, POLICY_CRASH_REPORTED, 0,
     1, "w2"},
    {"crash: waiting for the other reports", "w0 w1 w2 w3", "w0 w1 w3", "w0:crash:w2@100", "", 9000, 9000, 100, NEVER,
     10, 0, -1, POLICY_NONE, 0, 0, ""},
    {"crash: the report window passed, silent ranks are stuck too", "w0 w1 w2 w3", "w0 w1 w2 w3", "w0:crash:w2@100", "",
     9000, 9000, 400, NEVER, 10, 0, -1, POLICY_CRASH_REPORTED, 0, 1, "w1 w2 w3"},
    {"crash: nobody can tell whom it lost", "w0 w1", "w0 w1", "w0:crash@100 w1:crash@100", "", 9000, 9000, 5, NEVER, 10,
     0, -1, POLICY_CRASH_REPORTED, 0, 1, ""},
    /* --- hang (SIGSTOP): survivors' collectives time out --- */
    {"hang: the earliest report is a deadline", "w0 w1 w2 w3", "w0 w1 w2 w3",
     "w0:hang:w2@100 w1:crash:w0@150 w3:crash:w0@160", "", 9000, 9000, 5, NEVER, 10, 0, -1, POLICY_HANG_REPORTED, 0, 1,
     "w2"},
    {"hang: a tie goes to the crash", "w0 w1 w2", "w0 w1 w2", "w0:hang:w2@100 w1:crash:w2@100", "", 9000, 9000, 5, NEVER,
     10, 0, -1, POLICY_CRASH_REPORTED, 0, 1, "w2"},
    {"hang: a rank's lease ran out, nobody reported (first look)", "w0 w1 w2 w3", "w0 w1 w3", "", "", 9000, 9000, NEVER,
     NEVER, 10, 0, -1, POLICY_NONE, 0, 0, ""},
    {"hang: a rank's lease ran out, half a TTL later, no step since", "w0 w1 w2 w3", "w0 w1 w3", "", "", 9000, 9000,
     NEVER, 1100, 1500, 0, -1, POLICY_LEASE_LOST, 0, 1, "w2"},
    {"alive: a rank's registration vanished but steps go on", "w0 w1 w2 w3", "w0 w1 w3", "", "", 9000, 9000, NEVER,
     1100, 10, 0, -1, POLICY_NONE, 0, 0, ""},
    {"stall: no step for hang_timeout_ms", "w0 w1", "w0 w1", "", "", 9000, 9000, NEVER, NEVER, 6000, 0, -1,
     POLICY_STALL, 0, 1, ""},
    {"stall: not yet", "w0 w1", "w0 w1", "", "", 9000, 9000, NEVER, NEVER, 4000, 0, 0, POLICY_NONE, 0, 0, ""},
    {"crash: every rank is gone, arrivals still coming", "w0 w1", "w5", "", "", 9000, 100, NEVER, 2000, 10, 0, -1,
     POLICY_NONE, 0, 0, ""},
    {"crash: every rank is gone, arrivals slower than the join window", "w0 w1", "w5", "", "", 9000, 600, NEVER, 2000,
     2500, 0, -1, POLICY_NONE, 0, 0, ""},
    {"crash: every rank is gone, arrivals settled for the start window", "w0 w1", "w5", "", "", 9000, 1100, NEVER, 2000,
     2500, 0, -1, POLICY_ALL_GONE, 0, 1, "w0 w1"},
    {"crash: every rank is gone, as many arrived as the plan had", "w0 w1", "w5 w6", "", "", 9000, 10, NEVER, 2000,
     2500, 0, -1, POLICY_ALL_GONE, 0, 1, "w0 w1"},
    /* --- leave (SIGTERM) --- */
    {"leave: a rank announced it", "w0 w1 w2 w3", "w0 w1:leaving w2 w3", "", "", 9000, 9000, NEVER, NEVER, 10, 0, -1,
     POLICY_LEAVE, 1, 0, "w1"},
    {"leave: its key is already gone", "w0 w1 w2 w3", "w0 w2 w3", "", "w1", 9000, 9000, NEVER, NEVER, 10, 0, -1,
     POLICY_LEAVE, 1, 0, "w1"},
    {"leave: a spare leaving changes nothing", "w0 w1", "w0 w1 w5:leaving", "", "", 9000, 9000, NEVER, NEVER, 10, 0, 0,
     POLICY_NONE, 0, 0, ""},
    /* --- join --- */
    {"join: newcomers make a larger layout", "w0 w1", "w0 w1 w2 w3", "", "", 9000, 600, NEVER, NEVER, 10, 0, 1,
     POLICY_JOIN, 1, 0, ""},
    {"join: newcomers do not make a larger layout", "w0 w1", "w0 w1 w2", "", "", 9000, 600, NEVER, NEVER, 10, 0, 0,
     POLICY_NONE, 0, 0, ""},
    {"join: still arriving", "w0 w1", "w0 w1 w2 w3", "", "", 9000, 100, NEVER, NEVER, 10, 0, -1, POLICY_NONE, 0, 0, ""},
    /* --- pairs the end-to-end suite injects --- */
    {"kill + term at one step: the crash wins, the leaver is left out", "w0 w1 w2 w3", "w0 w1:leaving w3",
     "w0:crash:w2@100 w3:crash:w2@101 w1:crash:w2@101", "", 9000, 9000, 5, NEVER, 10, 0, -1, POLICY_CRASH_REPORTED, 0, 1,
     "w1 w2"},
    {"kill + stop: one closed, one silent", "w0 w1 w2 w3", "w0 w1 w2", "w0:crash:w3@100 w2:crash:w3@100", "", 9000,
     9000, 400, NEVER, 10, 0, -1, POLICY_CRASH_REPORTED, 0, 1, "w1 w3"},
    {"leave + lease lost: a lost lease is no leave", "w0 w1 w2 w3", "w0 w1:leaving w3", "", "", 9000, 9000, NEVER, 1100,
     1500, 0, -1, POLICY_LEASE_LOST, 0, 1, "w1 w2"},
    /* --- a generation that never formed: a rank the others cannot join (an impostor without
       the job's secret, a partition) is left out though it reported too --- */
    {"build: two of three cannot join the third", "w0 w1 w2", "w0 w1 w2",
     "w0:buildhang:w2@100 w1:buildhang:w2@101 w2:buildhang:w0+w1@102", "", 9000, 9000, 5, NEVER, 10, 0, -1,
     POLICY_HANG_REPORTED, 0, 1, "w2"},
    {"build: a rank saw the first to give up close its links, and names the rank it never reached too", "w0 w1 w2",
     "w0 w1 w2", "w0:buildhang:w2@100 w1:build:w2@101 w2:buildhang:w0+w1@102", "", 9000, 9000, 5, NEVER, 10, 0, -1,
     POLICY_HANG_REPORTED, 0, 1, "w2"},
    {"build: one rank blames the two others at once: wait for them", "w0 w1 w2", "w0 w1 w2",
     "w2:buildhang:w0+w1@100", "", 9000, 9000, 5, NEVER, 10, 0, -1, POLICY_NONE, 0, 0, ""},
    {"build: ... even past the report window (a build gives up at its own deadline)", "w0 w1 w2", "w0 w1 w2",
     "w2:buildhang:w0+w1@100", "", 9000, 9000, 1000, NEVER, 10, 0, -1, POLICY_NONE, 0, 0, ""},
    {"build: ... and past its deadline the slower ranks' reports may still be on their way", "w0 w1 w2", "w0 w1 w2",
     "w2:buildhang:w0+w1@100", "", 9000, 9000, 3100, NEVER, 10, 0, -1, POLICY_NONE, 0, 0, ""},
    {"build: ... and they never say a word: they are stuck", "w0 w1 w2", "w0 w1 w2", "w2:buildhang:w0+w1@100", "",
     9000, 9000, 3400, NEVER, 10, 0, -1, POLICY_HANG_REPORTED, 0, 1, "w0 w1"},
    /* two that name each other: no majority, so the one holding the job's state stays (the
       newer step; the same step: the lower rank) -- not both, and not the same plan again */
    {"build: two ranks of one step blame each other: the lower rank stays", "w0 w1", "w0 w1",
     "w0:buildhang:w1@100#65 w1:buildhang:w0@101#65", "", 9000, 9000, 5, NEVER, 10, 0, -1, POLICY_HANG_REPORTED, 0, 1,
     "w1"},
    {"build: a newcomer and a rank with the job's state blame each other: the newcomer goes", "imp w0", "imp w0",
     "imp:buildhang:w0@100#0 w0:buildhang:imp@101#65", "", 9000, 9000, 5, NEVER, 10, 0, -1, POLICY_HANG_REPORTED, 0, 1,
     "imp"},
    /* a worker that cannot prove the key gives up first (it had no step to finish) and names
       everyone; a rank named only by such timeouts is still building, not dead: wait for it */
    {"build: one named by the first to give up alone is still building", "w0 w1 imp", "w0 w1 imp",
     "imp:buildhang:w0+w1@100#0 w0:buildhang:imp@101#65", "", 9000, 9000, 5, NEVER, 10, 0, -1, POLICY_NONE, 0, 0, ""},
    {"build: ... and says so: the three reports decide", "w0 w1 imp", "w0 w1 imp",
     "imp:buildhang:w0+w1@100#0 w0:buildhang:imp@101#65 w1:buildhang:imp@104#65", "", 9000, 9000, 5, NEVER, 10, 0, -1,
     POLICY_HANG_REPORTED, 0, 1, "imp"},
    {"build: ... or never does: it is stuck, and the tie goes to the state", "w0 w1 imp", "w0 w1 imp",
     "imp:buildhang:w0+w1@100#0 w0:buildhang:imp@101#65", "", 9000, 9000, 3400, NEVER, 10, 0, -1, POLICY_HANG_REPORTED,
     0, 1, "w1 imp"},
    /* --- a report judges a worker only as the registration it had when the report was
       written: one that registered again since (fenced and back) is not fenced again for
       the same words (issue 27); the members' registrations are at revisions 10, 11, ... --- */
    {"stale: reports older than w2's registration do not name it", "w0 w1 w2 w3", "w0 w1 w2 w3",
     "w0:crash:w2@100^11 w1:crash:w2@101^11 w3:crash:w2@102^11", "", 9000, 9000, 5, NEVER, 10, 0, -1, POLICY_NONE, 0, 0,
     ""},
    {"stale: ... reports as new as its registration do", "w0 w1 w2 w3", "w0 w1 w2 w3",
     "w0:crash:w2@100^12 w1:crash:w2@101^12 w3:crash:w2@102^12", "", 9000, 9000, 5, NEVER, 10, 0, -1,
     POLICY_CRASH_REPORTED, 0, 1, "w2"},
    /* --- a running generation cut on the data plane (issue 27): a rank that reported (alive,
       it reaches etcd) but that more than half of the other reporters name was cut off from
       them: the first replan leaves it out instead of failing its build; a 2|2 cut keeps
       the side of rank 0; a crash's cascade (the dead report nothing) is as before --- */
    {"cut off: a reporter all the others name goes, though it reported", "w0 w1 w2 w3", "w0 w1 w2 w3",
     "w0:hang:w3@100 w1:hang:w3@101 w2:hang:w3@102 w3:hang:w0@103", "", 9000, 9000, 5, NEVER, 10, 0, -1,
     POLICY_HANG_REPORTED, 0, 1, "w3"},
    {"cut off: 2|2 while running, the side of rank 0 goes on", "w0 w1 w2 w3", "w0 w1 w2 w3",
     "w0:hang:w2@100 w1:hang:w2@101 w2:hang:w0@102 w3:hang:w0@103", "", 9000, 9000, 5, NEVER, 10, 0, -1,
     POLICY_HANG_REPORTED, 0, 1, "w2 w3"},
    {"cut off: the lone rank's report came first (naming the rest) and one other's: wait for theirs", "w0 w1 w2 w3",
     "w0 w1 w2 w3", "w3:hang:w0+w1+w2@100 w1:hang:w3@101", "", 9000, 9000, 5, NEVER, 10, 0, -1, POLICY_NONE, 0, 0, ""},
    {"cut off: ... and theirs came: the lone rank goes", "w0 w1 w2 w3", "w0 w1 w2 w3",
     "w3:hang:w0+w1+w2@100 w1:hang:w3@101 w0:hang:w3@102 w2:hang:w3@103", "", 9000, 9000, 5, NEVER, 10, 0, -1,
     POLICY_HANG_REPORTED, 0, 1, "w3"},
    {"cut off: a crash's cascade, one survivor naming another, is as before", "w0 w1 w2 w3", "w0 w1 w2",
     "w0:crash:w3@100 w1:crash:w3@101 w2:crash:w1@102", "", 9000, 9000, 5, NEVER, 10, 0, -1, POLICY_CRASH_REPORTED, 0,
     1, "w3"},
    /* --- a partition no majority explains (issue 27): every rank is named by more than half
       of the others, so the majority rule would leave everyone out; the largest side whose
       members named none of each other goes on, the first in rank order on a tie --- */
    {"partition: a 2|2 split, the side of rank 0 goes on", "w0 w1 w2 w3", "w0 w1 w2 w3",
     "w0:buildhang:w2+w3@100 w1:buildhang:w2+w3@101 w2:buildhang:w0+w1@102 w3:buildhang:w0+w1@103", "", 9000, 9000, 5,
     NEVER, 10, 0, -1, POLICY_HANG_REPORTED, 0, 1, "w2 w3"},
    {"partition: a 2|2 split across the ranks (w0 w2 | w1 w3)", "w0 w1 w2 w3", "w0 w1 w2 w3",
     "w0:buildhang:w1+w3@100 w2:buildhang:w1+w3@101 w1:buildhang:w0+w2@102 w3:buildhang:w0+w2@103", "", 9000, 9000, 5,
     NEVER, 10, 0, -1, POLICY_HANG_REPORTED, 0, 1, "w1 w3"},
    {"partition: 3|3, the side of rank 0", "w0 w1 w2 w3 w4 w5", "w0 w1 w2 w3 w4 w5",
     "w0:buildhang:w3+w4+w5@100 w1:buildhang:w3+w4+w5@100 w2:buildhang:w3+w4+w5@100 w3:buildhang:w0+w1+w2@100 "
     "w4:buildhang:w0+w1+w2@100 w5:buildhang:w0+w1+w2@100",
     "", 9000, 9000, 5, NEVER, 10, 0, -1, POLICY_HANG_REPORTED, 0, 1, "w3 w4 w5"},
    {"partition: 3|1 is the majority rule's (the one the three name goes)", "w0 w1 w2 w3", "w0 w1 w2 w3",
     "w0:buildhang:w3@100 w1:buildhang:w3@101 w2:buildhang:w3@102 w3:buildhang:w0+w1+w2@103", "", 9000, 9000, 5,
     NEVER, 10, 0, -1, POLICY_HANG_REPORTED, 0, 1, "w3"},
    {"partition: 1|2|1, the largest side goes on", "w0 w1 w2 w3", "w0 w1 w2 w3",
     "w0:buildhang:w1+w2+w3@100 w1:buildhang:w0+w3@101 w2:buildhang:w0+w3@102 w3:buildhang:w0+w1+w2@103", "", 9000,
     9000, 5, NEVER, 10, 0, -1, POLICY_HANG_REPORTED, 0, 1, "w0 w3"},
    {"build: a rank died during the build (its links closed): named at once", "w0 w1 w2", "w0 w1 w2",
     "w0:build:w2@100 w1:build:w2@101", "", 9000, 9000, 5, NEVER, 10, 0, -1, POLICY_CRASH_REPORTED, 0, 1, "w2"},
    {"steps: the ranks that saw a rank abort do not outvote it", "w0 w1 w2 w3", "w0 w1 w2 w3",
     "w0:hang:w2@100 w1:crash:w0@150 w2:crash:w0@155 w3:crash:w0@160", "", 9000, 9000, 5, NEVER, 10, 0, -1,
     POLICY_HANG_REPORTED, 0, 1, ""},
    /* --- a coordinator takes over (its first look at a running generation) --- */
    {"coordinator: a new leader finds a healthy generation", "w0 w1 w2 w3", "w0 w1 w2 w3", "", "", 0, 0, NEVER, NEVER, 0,
     0, 0, POLICY_NONE, 0, 0, ""},
    {"coordinator: a new leader finds reports its predecessor left", "w0 w1 w2", "w0 w2",
     "w0:crash:w1@100 w2:crash:w1@100", "", 0, 0, 0, NEVER, 0, 0, -1, POLICY_CRASH_REPORTED, 0, 1, "w1"},
    {"coordinator: a new leader finds a rank gone, first look", "w0 w1 w2", "w0 w2", "", "", 0, 0, NEVER, NEVER, 0, 0,
     -1, POLICY_NONE, 0, 0, ""},
    /* --- etcd came back (its leases were refreshed; every worker holds its key) --- */
    {"etcd: back after an outage, everyone still registered", "w0 w1 w2 w3", "w0 w1 w2 w3", "", "", 9000, 9000, NEVER,
     NEVER, 50, 0, 0, POLICY_NONE, 0, 0, ""},
    {"etcd: back a moment ago, two ranks still renewing their registrations", "w0 w1 w2 w3", "w0 w1", "", "", 9000,
     9000, NEVER, 2000, 3000, 0, -1, POLICY_NONE, 0, 0, "", 500},
    {"etcd: back a lease TTL ago, a rank never renewed and no step since", "w0 w1 w2 w3", "w0 w1 w2", "", "", 9000,
     9000, NEVER, 1100, 3000, 0, -1, POLICY_LEASE_LOST, 0, 1, "w3", 2600},
    {"etcd: back, the workers re-registered, a rank killed meanwhile was reported", "w0 w1 w2", "w0 w2",
     "w0:crash:w1@100 w2:crash:w1@101", "", 9000, 40, 5, NEVER, 3000, 0, -1, POLICY_CRASH_REPORTED, 0, 1, "w1"},
    /* --- a finishing job is never replanned --- */
    {"done: the last step is done and ranks are leaving", "w0 w1 w2", "w0:done w2", "", "", 9000, 9000, NEVER, 1100,
     6000, 0, -1, POLICY_NONE, 0, 0, ""},
};

/* --- building a picture from a row ---------------------------------------------------------- */

static int split(const char *s, char out[][96], int max) {
  int n = 0;
  const char *p = s ? s : "";
  while (*p && n < max) {
    while (*p == ' ') p++;
    if (!*p) break;
    size_t l = strcspn(p, " ");
    snprintf(out[n++], 96, "%.*s", (int)l, p);
    p += l;
  }
  return n;
}

static uint64_t ago(int64_t ms) { return ms == NEVER ? 0 : NOW - (uint64_t)ms * 1000000ull; }

typedef struct picture {
  newt_spec spec;
  newt_plan plan;
  job_worker members[16];
  job_report reports[16];
  char departed[16][RDZV_NAME_MAX];
  int asked; /* join_grows was asked */
  int join_grows;
  policy_view v;
} picture;

static int join_grows(void *ud) {
  picture *p = ud;
  p->asked++;
  return p->join_grows > 0;
}

static void build(const tcase *t, picture *pic) {
  memset(pic, 0, sizeof *pic);
  spec_defaults(&pic->spec, "policy");
  pic->spec.start_workers = t->start_workers;
  pic->spec.dp_max = 8;
  char words[16][96];
  if (t->plan) {
    int n = split(t->plan, words, 16);
    pic->plan.generation = 3;
    pic->plan.nranks = n;
    pic->plan.ranks = calloc((size_t)n, sizeof *pic->plan.ranks);
    for (int i = 0; i < n; i++) {
      pic->plan.ranks[i].rank = i;
      snprintf(pic->plan.ranks[i].worker, PLAN_ID_MAX, "%.63s", words[i]);
    }
  }
  int nm = split(t->members, words, 16);
  for (int i = 0; i < nm; i++) {
    job_worker *w = &pic->members[i];
    char *colon = strchr(words[i], ':');
    snprintf(w->state, sizeof w->state, "%s", colon ? colon + 1 : "training");
    if (colon) *colon = '\0';
    snprintf(w->id, sizeof w->id, "%.63s", words[i]);
    snprintf(w->host, sizeof w->host, "h");
    if (strcmp(w->state, "noaddr") != 0) snprintf(w->addr, sizeof w->addr, "127.0.0.1:%d", 4000 + i);
    w->create_revision = 10 + i;
  }
  int nr = split(t->reports, words, 16);
  for (int i = 0; i < nr; i++) {
    job_report *r = &pic->reports[i];
    char kind[16] = "", acc[96] = "";
    unsigned long long t_ms = 0;
    char *caret = strchr(words[i], '^'); /* "^N": the record's etcd revision (the members': 10, 11, ...) */
    if (caret) r->revision = strtoll(caret + 1, NULL, 10), *caret = '\0';
    char *hash = strchr(words[i], '#');
    if (hash) r->step = strtoll(hash + 1, NULL, 10), *hash = '\0';
    char *at = strchr(words[i], '@');
    if (at) t_ms = strtoull(at + 1, NULL, 10), *at = '\0';
    char *f1 = strchr(words[i], ':');
    *f1 = '\0';
    char *f2 = strchr(f1 + 1, ':');
    if (f2) *f2 = '\0', snprintf(acc, sizeof acc, "%s", f2 + 1);
    snprintf(kind, sizeof kind, "%s", f1 + 1);
    snprintf(r->worker, sizeof r->worker, "%.63s", words[i]);
    r->hang = strcmp(kind, "hang") == 0 || strcmp(kind, "buildhang") == 0;
    r->build = strncmp(kind, "build", 5) == 0;
    r->t_ms = t_ms;
    for (char *a = acc[0] ? acc : NULL; a;) {
      char *plus = strchr(a, '+');
      if (plus) *plus = '\0';
      snprintf(r->accuse[r->naccuse++], RDZV_NAME_MAX, "%s", a);
      a = plus ? plus + 1 : NULL;
    }
  }
  int nd = split(t->departed, words, 16);
  for (int i = 0; i < nd; i++) snprintf(pic->departed[i], RDZV_NAME_MAX, "%.63s", words[i]);
  pic->join_grows = t->join_grows;
  pic->v = (policy_view){.spec = &pic->spec,
                         .plan = &pic->plan,
                         .members = pic->members,
                         .nmembers = nm,
                         .reports = pic->reports,
                         .nreports = nr,
                         .departed = pic->departed,
                         .ndeparted = nd,
                         .now = NOW,
                         .first_member = ago(t->first_member),
                         .last_join = ago(t->last_join),
                         .first_report = ago(t->first_report),
                         .first_gone = ago(t->first_gone),
                         .last_progress = ago(t->progress),
                         .steps_done = 10, /* a job past its start-up (test_first_step: one before) */
                         .outage_end = t->outage ? ago(t->outage) : 0,
                         .join_window_ms = 500,
                         .start_window_ms = 1000,
                         .join_grows = join_grows,
                         .ud = pic};
}

static int same_set(char (*got)[RDZV_NAME_MAX], int n, const char *want) {
  char words[16][96];
  int nw = split(want, words, 16);
  if (nw != n) return 0;
  for (int i = 0; i < nw; i++) {
    int found = 0;
    for (int k = 0; k < n && !found; k++) found = strcmp(got[k], words[i]) == 0;
    if (!found) return 0;
  }
  return 1;
}

static void test_table(void) {
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const tcase *t = &cases[i];
    picture pic;
    build(t, &pic);
    policy_decision d;
    T_OK(policy_decide(&pic.v, &d));
    T_CHECK_MSG(d.reason == t->want, "%s: reason %d (%s), want %d (%s)", t->name, d.reason,
                policy_cause(d.reason) ? policy_cause(d.reason) : "none", t->want,
                policy_cause(t->want) ? policy_cause(t->want) : "none");
    if (d.reason == t->want && t->want != POLICY_NONE) {
      T_CHECK_MSG(d.at_boundary == t->boundary, "%s: at_boundary %d", t->name, d.at_boundary);
      T_CHECK_MSG(d.fence == t->fence, "%s: fence %d", t->name, d.fence);
      char got[256] = "";
      for (int k = 0; k < d.nexclude; k++) snprintf(got + strlen(got), sizeof got - strlen(got), " %s", d.exclude[k]);
      T_CHECK_MSG(same_set(d.exclude, d.nexclude, t->excluded), "%s: excluded [%s], want [%s]", t->name, got,
                  t->excluded);
    }
    if (t->join_grows < 0) T_CHECK_MSG(pic.asked == 0, "%s: asked whether joins grow the layout", t->name);
    policy_decision_free(&d);
    plan_free(&pic.plan);
  }
}

/* The clocks the policy starts: the first member (before the first plan) and the first
 * missing rank, kept by the caller for the next look. */
static void test_clocks(void) {
  picture pic;
  build(&cases[1], &pic); /* initial, waiting, first member seen 100 ms ago */
  pic.v.first_member = 0;
  policy_decision d;
  T_OK(policy_decide(&pic.v, &d));
  T_CHECK(d.reason == POLICY_NONE && d.first_member == NOW);
  policy_decision_free(&d);
  plan_free(&pic.plan);

  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (strcmp(cases[i].name, "hang: a rank's lease ran out, nobody reported (first look)") == 0) build(&cases[i], &pic);
  T_OK(policy_decide(&pic.v, &d));
  T_CHECK(d.reason == POLICY_NONE && d.first_gone == NOW);
  policy_decision_free(&d);
  /* half a lease TTL later, by the clock the first look started */
  pic.v.first_gone = NOW;
  pic.v.now = NOW + (uint64_t)pic.spec.lease_ttl_ms / 2 * 1000000ull;
  T_OK(policy_decide(&pic.v, &d));
  T_CHECK(d.reason == POLICY_LEASE_LOST && strcmp(policy_cause(d.reason), "hang") == 0);
  policy_decision_free(&d);
  /* a step completed after it vanished: it is alive, the clock starts again */
  pic.v.last_progress = NOW + 1000000ull;
  T_OK(policy_decide(&pic.v, &d));
  T_CHECK(d.reason == POLICY_NONE && d.first_gone == 0);
  policy_decision_free(&d);
  pic.v.last_progress = NOW - 1000000ull;
  T_OK(policy_decide(&pic.v, &d));
  T_CHECK(d.reason == POLICY_LEASE_LOST && strcmp(policy_cause(d.reason), "hang") == 0);
  policy_decision_free(&d);
  plan_free(&pic.plan);
}

/* Until the job's first step, the stall deadline is first_step_timeout_ms (issue 25, item 1):
 * start-up beyond the hang timeout is no hang; beyond its own deadline it is. */
static void test_first_step(void) {
  picture pic;
  policy_decision d;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (strcmp(cases[i].name, "stall: no step for hang_timeout_ms") == 0) build(&cases[i], &pic);
  pic.v.steps_done = 0;
  T_OK(policy_decide(&pic.v, &d));
  T_CHECK_MSG(d.reason == POLICY_NONE, "start-up 6 s in (hang timeout %lld ms): reason %s",
              (long long)pic.spec.hang_timeout_ms, policy_cause(d.reason) ? policy_cause(d.reason) : "none");
  policy_decision_free(&d);
  pic.v.last_progress = NOW - (uint64_t)(pic.spec.first_step_timeout_ms + 1000) * 1000000ull;
  T_OK(policy_decide(&pic.v, &d));
  T_CHECK(d.reason == POLICY_STALL);
  policy_decision_free(&d);
  pic.v.steps_done = 1; /* once a step completed, the hang timeout again */
  pic.v.last_progress = NOW - (uint64_t)(pic.spec.hang_timeout_ms + 1000) * 1000000ull;
  T_OK(policy_decide(&pic.v, &d));
  T_CHECK(d.reason == POLICY_STALL);
  policy_decision_free(&d);
  plan_free(&pic.plan);
}

/* Stragglers (issue 41): a rank off the median for a whole window (and the minimum time)
 * rebalances at the boundary, nobody fenced; a shorter straggle, another generation's
 * progress, or speeds that earn the plan's own shares do nothing. */
static void test_rebalance(void) {
  picture pic;
  policy_decision d;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (strcmp(cases[i].name, "healthy: nothing to do") == 0) build(&cases[i], &pic);
  pic.plan.dp = pic.plan.nranks; /* four data-parallel ranks of a global batch of 24 */
  pic.plan.tp = pic.plan.pp = 1;
  pic.plan.global_batch = pic.spec.global_batch = 24;
  pic.plan.micro_batch = 2;
  for (int k = 0; k < pic.plan.nranks; k++) pic.plan.ranks[k].dp = k;
  job_progress pr = {.generation = pic.plan.generation, .step = 50, .sample_us = 400, .nslow = 1,
                     .slow = {{.dp = 2, .us = 800}}, .straggle = 20, .straggle_ms = 3000};
  pic.v.progress = &pr;
  pic.v.straggle_min_ms = 1000;
  T_OK(policy_decide(&pic.v, &d));
  T_CHECK_MSG(d.reason == POLICY_REBALANCE && d.at_boundary && !d.fence && d.nexclude == 0, "reason %d", d.reason);
  T_CHECK(strcmp(policy_cause(POLICY_REBALANCE), "rebalance") == 0);
  policy_decision_free(&d);
  static const struct {
    int64_t straggle, straggle_ms;
    int gen_off, zero, window;
    const char *why;
  } none[] = {
      {19, 3000, 0, 0, 20, "a straggle shorter than the window"},
      {20, 900, 0, 0, 20, "a straggle shorter than straggle_min_ms"},
      {20, 3000, -1, 0, 20, "the progress of another generation"},
      {20, 3000, 0, 3, 20, "ZeRO 3"},
      {20, 3000, 0, 0, 0, "rebalancing off"},
  };
  for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
    job_progress q = pr;
    q.straggle = none[i].straggle;
    q.straggle_ms = none[i].straggle_ms;
    q.generation = pic.plan.generation + (uint64_t)none[i].gen_off;
    pic.spec.zero = none[i].zero;
    pic.spec.straggler_window = none[i].window;
    pic.v.progress = &q;
    T_OK(policy_decide(&pic.v, &d));
    T_CHECK_MSG(d.reason == POLICY_NONE, "%s: reason %d", none[i].why, d.reason);
    policy_decision_free(&d);
  }
  pic.spec.zero = 0;
  pic.spec.straggler_window = 20;
  /* the plan already has the shares these speeds earn: nothing to do; its even shares back once
     no rank is listed */
  double us[4];
  pic.v.progress = &pr;
  policy_progress_us(&pr, pic.plan.dp, us);
  newt_result_t err;
  pic.plan.shares = plan_shares_for(pic.plan.global_batch, pic.plan.dp, us, pic.spec.straggler_margin, &err);
  T_CHECK(pic.plan.shares != NULL);
  T_OK(policy_decide(&pic.v, &d));
  T_CHECK_MSG(d.reason == POLICY_NONE, "the plan's own shares: reason %d", d.reason);
  policy_decision_free(&d);
  job_progress back = pr;
  back.nslow = 0;
  pic.v.progress = &back;
  T_OK(policy_decide(&pic.v, &d));
  T_CHECK_MSG(d.reason == POLICY_REBALANCE, "a rank recovered: reason %d", d.reason);
  policy_decision_free(&d);
  plan_free(&pic.plan);
}

static void test_causes(void) {
  T_CHECK(policy_cause(POLICY_NONE) == NULL);
  T_CHECK(strcmp(policy_cause(POLICY_INITIAL), "initial") == 0);
  T_CHECK(strcmp(policy_cause(POLICY_CRASH_REPORTED), "crash") == 0);
  T_CHECK(strcmp(policy_cause(POLICY_ALL_GONE), "crash") == 0);
  T_CHECK(strcmp(policy_cause(POLICY_HANG_REPORTED), "hang") == 0);
  T_CHECK(strcmp(policy_cause(POLICY_STALL), "hang") == 0);
  T_CHECK(strcmp(policy_cause(POLICY_LEAVE), "leave") == 0);
  T_CHECK(strcmp(policy_cause(POLICY_JOIN), "join") == 0);
}

/* Who the next plan may place, and who hands state over. */
static void test_members_and_donors(void) {
  const tcase t = {"", "w0 w1 w2", "w0 w1:leaving w2 w3 w4:done w5:noaddr w6:left", "", "", 0, 0, NEVER, NEVER, 0,
                   0, 0, POLICY_NONE, 0, 0, ""};
  picture pic;
  build(&t, &pic);
  plan_member m[16];
  char ex[1][RDZV_NAME_MAX] = {"w2"};
  int n = policy_plan_members(&pic.v, ex, 1, m);
  T_CHECK(n == 2 && strcmp(m[0].id, "w0") == 0 && strcmp(m[1].id, "w3") == 0);
  T_CHECK(m[0].prev_rank == 0 && m[0].has_state && m[1].prev_rank == -1 && !m[1].has_state);
  /* donors: the leaving rank of the current plan */
  n = policy_donors(&pic.v, 1, m);
  T_CHECK(n == 1 && strcmp(m[0].id, "w1") == 0);
  /* a leaving spare holds nothing */
  pic.members[1].state[0] = '\0';
  snprintf(pic.members[3].state, sizeof pic.members[3].state, "leaving");
  T_CHECK(policy_donors(&pic.v, 1, m) == 0);
  /* a donor of a plan that has not started yet is still one; once it started, it left */
  T_OK(plan_add_donor(&pic.plan, "w3", "h", "127.0.0.1:4003"));
  T_CHECK(policy_donors(&pic.v, 0, m) == 1 && strcmp(m[0].id, "w3") == 0);
  T_CHECK(policy_donors(&pic.v, 1, m) == 0);
  plan_free(&pic.plan);
}

/* spec.backend nccl: one rank per GPU of a host. A rank of the plan keeps its GPU over a
 * newcomer, else the earlier registration; other hosts, other GPUs, the CPU backend and
 * workers on no GPU are not affected; a GPU whose holder leaves is free again; workers
 * that all share their GPU (--share-device) train on it together. */
static void test_gpu_clash(void) {
  const tcase t = {"", "w2", "w0 w1 w2 w3 w4 w5", "", "", 0, 0, NEVER, NEVER, 0, 0, 0, POLICY_NONE, 0, 0, ""};
  picture pic;
  build(&t, &pic);
  snprintf(pic.spec.backend, sizeof pic.spec.backend, "nccl");
  int dev[] = {0, 0, 0, 1, 1, -1};
  for (int i = 0; i < 6; i++) pic.members[i].device = dev[i];
  snprintf(pic.members[4].host, sizeof pic.members[4].host, "h2"); /* GPU 1 of another host */
  plan_member m[16];
  int n = policy_plan_members(&pic.v, NULL, 0, m);
  /* w2 (a rank) keeps GPU 0; w0, w1 wait; w3 on GPU 1, w4 on h2's GPU 1, w5 on none */
  T_CHECK_MSG(n == 4 && !strcmp(m[0].id, "w2") && !strcmp(m[1].id, "w3") && !strcmp(m[2].id, "w4") &&
                  !strcmp(m[3].id, "w5"),
              "%d members, first %s", n, n ? m[0].id : "-");
  T_CHECK(policy_gpu_taken(&pic.v, NULL, 0, &pic.members[0]) == &pic.members[2]);
  T_CHECK(policy_gpu_taken(&pic.v, NULL, 0, &pic.members[2]) == NULL);
  /* no plan yet: the earliest registration keeps it */
  pic.plan.generation = 0;
  n = policy_plan_members(&pic.v, NULL, 0, m);
  T_CHECK(n == 4 && !strcmp(m[0].id, "w0"));
  /* the holder leaves: the next in line gets the GPU */
  snprintf(pic.members[0].state, sizeof pic.members[0].state, "leaving");
  n = policy_plan_members(&pic.v, NULL, 0, m);
  T_CHECK(n == 4 && !strcmp(m[0].id, "w1"));
  /* --share-device: workers that all share their GPU train on it together; one that did
     not say so still waits for it (and a sharer waits for a holder that does not share) */
  pic.members[1].shares_device = pic.members[2].shares_device = 1;
  n = policy_plan_members(&pic.v, NULL, 0, m);
  T_CHECK_MSG(n == 5 && !strcmp(m[0].id, "w1") && !strcmp(m[1].id, "w2"), "%d members, first %s", n, n ? m[0].id : "-");
  pic.members[1].shares_device = 0;
  n = policy_plan_members(&pic.v, NULL, 0, m);
  T_CHECK(n == 4);
  T_CHECK(policy_gpu_taken(&pic.v, NULL, 0, &pic.members[1]) == NULL &&
          policy_gpu_taken(&pic.v, NULL, 0, &pic.members[2]) == &pic.members[1]);
  /* the CPU backend: devices do not matter */
  snprintf(pic.spec.backend, sizeof pic.spec.backend, "cpu");
  T_CHECK(policy_plan_members(&pic.v, NULL, 0, m) == 5);
  plan_free(&pic.plan);
}

/* Replacing a straggler by an idle spare (spec.fault.straggler_replace): the slowest rank, when
 * it is that many times the median of the others and the plan has a spare. */
static void test_replace(void) {
  newt_spec s;
  spec_defaults(&s, "replace");
  newt_plan p;
  memset(&p, 0, sizeof p);
  p.dp = 4;
  p.nspares = 1;
  double us[4] = {400, 410, 1300, 390};
  T_CHECK_MSG(policy_replace_dp(&s, &p, us) == -1, "replaced with straggler_replace 0 (never)");
  s.straggler_replace = 3;
  T_CHECK_MSG(policy_replace_dp(&s, &p, us) == 2, "1300 us against a median of 400: not replaced at 3x");
  s.straggler_replace = 4;
  T_CHECK_MSG(policy_replace_dp(&s, &p, us) == -1, "1300 us against a median of 400: replaced at 4x");
  s.straggler_replace = 3;
  p.nspares = 0;
  T_CHECK_MSG(policy_replace_dp(&s, &p, us) == -1, "replaced without a spare");
  p.nspares = 1;
  p.dp = 2; /* of two, against the other */
  double two[2] = {1000, 320};
  T_CHECK_MSG(policy_replace_dp(&s, &p, two) == 0, "of two ranks, one 3.1x the other's not replaced");
}

/* A job of 1,000 ranks (issue 42: the policy finds each rank's member and report through an
 * index, not a scan of every member): the members registered in reverse order, two leaving,
 * then one gone and a report. The same decision from the index policy_decide builds and from
 * the view's own (the coordinator's), members added in any order. */
static void decide_many(const policy_view *v, policy_reason want, const char *ex0, const char *ex1) {
  policy_decision d;
  T_OK(policy_decide(v, &d));
  T_CHECK_MSG(d.reason == want, "reason %d, want %d", (int)d.reason, (int)want);
  int has0 = 0, has1 = 0;
  for (int i = 0; i < d.nexclude; i++) has0 |= strcmp(d.exclude[i], ex0) == 0, has1 |= strcmp(d.exclude[i], ex1) == 0;
  T_CHECK_MSG(d.nexclude == 2 && has0 && has1, "%d excluded", d.nexclude);
  policy_decision_free(&d);
}

static void test_many_members(void) {
  enum { N = 1000 };
  newt_spec spec;
  spec_defaults(&spec, "policy");
  newt_plan plan;
  memset(&plan, 0, sizeof plan);
  plan.generation = 3, plan.nranks = N;
  plan.ranks = calloc(N, sizeof *plan.ranks);
  job_worker *m = calloc(N, sizeof *m);
  job_report rep;
  memset(&rep, 0, sizeof rep);
  for (int i = 0; i < N; i++) {
    plan.ranks[i].rank = i;
    snprintf(plan.ranks[i].worker, PLAN_ID_MAX, "w%d", i);
    job_worker *w = &m[N - 1 - i];
    snprintf(w->id, sizeof w->id, "w%d", i);
    snprintf(w->host, sizeof w->host, "h%d", i / 8);
    snprintf(w->addr, sizeof w->addr, "10.0.%d.%d:4000", i / 256, i % 256);
    snprintf(w->state, sizeof w->state, "%s", i == 7 || i == 900 ? "leaving" : "training");
    w->create_revision = 10 + i;
  }
  policy_view v = {.spec = &spec, .plan = &plan, .members = m, .nmembers = N, .now = NOW, .first_member = ago(9000),
                   .last_join = ago(9000), .last_progress = ago(10), .steps_done = 10, .join_window_ms = 500,
                   .start_window_ms = 1000};
  decide_many(&v, POLICY_LEAVE, "w7", "w900"); /* policy_decide's own index */
  newt_strindex ix = NEWT_STRINDEX(job_worker, id);
  for (int i = N - 1; i >= 0; i--) T_OK(newt_strindex_add(&ix, m, i));
  v.member_ix = &ix;
  decide_many(&v, POLICY_LEAVE, "w7", "w900");
  /* w500 crashed: its registration is gone (the last member moved into its place, as the
     coordinator deletes) and w3 reported it; w7 and w900 still leaving */
  int at = newt_strindex_find(&ix, m, "w500"), last = N - 1;
  T_CHECK(at == N - 1 - 500);
  newt_strindex_del(&ix, m, at);
  newt_strindex_renumber(&ix, m, last, at);
  m[at] = m[last];
  v.nmembers = N - 1;
  snprintf(rep.worker, sizeof rep.worker, "w3");
  snprintf(rep.accuse[rep.naccuse++], RDZV_NAME_MAX, "w500");
  rep.t_ms = 100;
  v.reports = &rep, v.nreports = 1, v.first_report = ago(400); /* the report window passed */
  policy_decision d;
  T_OK(policy_decide(&v, &d));
  /* the silent ranks are stuck too: the gone w500, the leavers (named again as silent) and
     every member but the reporter: N + 1 entries */
  T_CHECK(d.reason == POLICY_CRASH_REPORTED);
  int w500 = 0, w3 = 0, w7 = 0;
  for (int i = 0; i < d.nexclude; i++)
    w500 |= strcmp(d.exclude[i], "w500") == 0, w3 |= strcmp(d.exclude[i], "w3") == 0,
        w7 |= strcmp(d.exclude[i], "w7") == 0;
  T_CHECK_MSG(w500 && !w3 && w7 && d.nexclude == N + 1, "%d excluded", d.nexclude);
  policy_decision_free(&d);
  v.member_ix = NULL; /* the same from policy_decide's own index */
  T_OK(policy_decide(&v, &d));
  T_CHECK(d.reason == POLICY_CRASH_REPORTED && d.nexclude == N + 1);
  policy_decision_free(&d);
  newt_strindex_free(&ix);
  free(m);
  plan_free(&plan);
}

int main(void) {
  T_RUN(test_table);
  T_RUN(test_clocks);
  T_RUN(test_first_step);
  T_RUN(test_rebalance);
  T_RUN(test_replace);
  T_RUN(test_causes);
  T_RUN(test_members_and_donors);
  T_RUN(test_gpu_clash);
  T_RUN(test_many_members);
  return T_DONE();
}
