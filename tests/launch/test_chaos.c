/* Unit tests of chaos schedules (launch/chaos.h): the grammar, each form printed back as
 * chaos_parse reads it (chaos_event_str), and errors naming the item. */
#include <string.h>

#include "launch/chaos.h"
#include "test.h"

/* Each schedule bad[i][0] is refused, its error saying bad[i][1]. */
static void expect_refused(const char *const (*bad)[2], size_t n) {
  chaos_plan c;
  for (size_t i = 0; i < n; i++) {
    T_CHECK_MSG(chaos_parse(bad[i][0], &c) == NEWT_ERR_INVALID, "accepted %s", bad[i][0]);
    T_CHECK_MSG(strstr(newt_errmsg(), bad[i][1]) != NULL, "error \"%s\" lacks \"%s\"", newt_errmsg(), bad[i][1]);
  }
}

static void test_chaos(void) {
  chaos_plan c;
  T_OK(chaos_parse("kill:worker:1@step=15,stop:worker:2@step=30,term:worker:0@step=45,join:2@step=50,"
                   "kill:coordinator@step=60,restart:etcd@step=70,cont:worker:2@step=31", &c));
  T_CHECK(c.n == 7);
  T_CHECK(c.events[0].action == CHAOS_KILL && c.events[0].target == CHAOS_WORKER && c.events[0].index == 1);
  T_CHECK(c.events[2].action == CHAOS_CONT && c.events[2].step == 31); /* sorted by step */
  T_CHECK(c.events[4].action == CHAOS_JOIN && c.events[4].arg == 2);
  T_CHECK(c.events[5].target == CHAOS_COORDINATOR && c.events[5].index == -1);
  T_CHECK(c.events[6].target == CHAOS_ETCD && c.events[6].arg == 2000);
  char buf[64];
  T_CHECK(strcmp(chaos_event_str(&c.events[0], buf, sizeof buf), "kill:worker:1@step=15") == 0);
  chaos_free(&c);
  T_OK(chaos_parse("kill:rank:2@step=4", &c));
  T_CHECK(c.n == 1 && c.events[0].by_rank && c.events[0].index == 2 && c.events[0].target == CHAOS_WORKER);
  T_CHECK(strcmp(chaos_event_str(&c.events[0], buf, sizeof buf), "kill:rank:2@step=4") == 0);
  chaos_free(&c);
  /* once a checkpoint of step 20 (or newer) committed: no step condition */
  T_OK(chaos_parse("kill:worker:0@ckpt=20,kill:host:1@ckpt=5", &c));
  T_CHECK(c.n == 2 && c.events[0].ckpt_step == 20 && c.events[0].step == 0 && c.events[1].ckpt_step == 5);
  T_CHECK(strcmp(chaos_event_str(&c.events[0], buf, sizeof buf), "kill:worker:0@ckpt=20") == 0);
  T_CHECK(strcmp(chaos_event_str(&c.events[1], buf, sizeof buf), "kill:host:1@ckpt=5") == 0);
  chaos_free(&c);
  T_OK(chaos_parse("", &c));
  T_CHECK(c.n == 0);
  const char *bad[][2] = {{"kill:worker:1", "missing \"@step=N\""},
                          {"kill:worker:1@ckpt=0", "checkpoint step \"0\" is not a positive integer"},
                          {"kill:worker:1@ckpt=x", "checkpoint step"},
                          {"kill:worker:x@step=3", "worker index"},
                          {"explode:worker:1@step=3", "unknown action \"explode\""},
                          {"kill:worker:1@step=-2", "step"},
                          {"join:0@step=3", "join needs a count"},
                          {"restart:worker@step=3", "restart applies to etcd"},
                          {"kill:worker:1@step=3,kill:robot:1@step=4", "item 2"},
                          {"cont:coordinator@step=3", "cont applies to workers"}};
  expect_refused(bad, sizeof bad / sizeof bad[0]);
}

/* The etcd forms: the whole etcd (index -1) or one member, the downtime in arg. */
static void test_chaos_etcd(void) {
  struct {
    const char *in;
    chaos_action action;
    int index;
    int64_t arg;
    const char *printed;
  } good[] = {
      {"restart:etcd@step=7", CHAOS_RESTART, -1, 2000, "restart:etcd:2000@step=7"},
      {"restart:etcd:0@step=7", CHAOS_RESTART, -1, 0, "restart:etcd:0@step=7"},
      {"stop:etcd@step=7", CHAOS_STOP, -1, 2000, "stop:etcd:2000@step=7"},
      {"stop:etcd:3000@step=7", CHAOS_STOP, -1, 3000, "stop:etcd:3000@step=7"},
      {"wipe:etcd@step=7", CHAOS_WIPE, -1, 2000, "wipe:etcd:2000@step=7"},
      {"wipe:etcd:500@step=7", CHAOS_WIPE, -1, 500, "wipe:etcd:500@step=7"},
      {"kill:etcd:1@step=7", CHAOS_KILL, 1, 2000, "kill:etcd:1:2000@step=7"},
      {"kill:etcd:0:0@step=7", CHAOS_KILL, 0, 0, "kill:etcd:0:0@step=7"},
      {"kill:etcd:4:1500@step=7", CHAOS_KILL, 4, 1500, "kill:etcd:4:1500@step=7"},
      {"stop:etcd:2:800@step=7", CHAOS_STOP, 2, 800, "stop:etcd:2:800@step=7"},
      {"stop:etcd:0:0@step=7", CHAOS_STOP, 0, 0, "stop:etcd:0:0@step=7"},
      {"restart:etcd:until=30@step=7", CHAOS_RESTART, -1, 0, "restart:etcd:until=30@step=7"},
      {"stop:etcd:until=8@step=7", CHAOS_STOP, -1, 0, "stop:etcd:until=8@step=7"},
  };
  chaos_plan c;
  char buf[64];
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    T_OK(chaos_parse(good[i].in, &c));
    if (c.n != 1) {
      T_FAIL("%s gave %d events", good[i].in, c.n);
      chaos_free(&c);
      continue;
    }
    chaos_event e = c.events[0];
    chaos_free(&c);
    T_CHECK_MSG(e.target == CHAOS_ETCD && e.action == good[i].action && e.index == good[i].index &&
                    e.arg == good[i].arg && e.step == 7 && !e.by_rank,
                "%s: action %d target %d index %d arg %lld", good[i].in, (int)e.action, (int)e.target, e.index,
                (long long)e.arg);
    chaos_event_str(&e, buf, sizeof buf);
    T_CHECK_MSG(strcmp(buf, good[i].printed) == 0, "%s printed as %s", good[i].in, buf);
    /* what is printed reads back as the same event */
    T_OK(chaos_parse(buf, &c));
    T_CHECK_MSG(c.n == 1 && c.events[0].action == e.action && c.events[0].target == e.target &&
                    c.events[0].index == e.index && c.events[0].arg == e.arg && c.events[0].step == e.step,
                "%s does not read back as itself", buf);
    chaos_free(&c);
  }
  /* with the other forms, in step order */
  T_OK(chaos_parse("wipe:etcd@step=9,kill:worker:1@step=2,stop:etcd:1:100@step=5", &c));
  T_CHECK(c.n == 3 && c.events[0].target == CHAOS_WORKER && c.events[1].index == 1 && c.events[2].action == CHAOS_WIPE);
  chaos_free(&c);

  const char *bad[][2] = {
      {"stop:etcd:x@step=3", "item 1 \"stop:etcd:x\": etcd downtime \"x\""},
      {"stop:etcd:1@step=3", "stop:etcd:I:MS"},
      {"stop:etcd:5:100@step=3", "etcd member \"5\" is not 0..4"},
      {"stop:etcd:1:-1@step=3", "item 1 \"stop:etcd:1:-1\""},
      {"wipe:etcd:1:2@step=3", "item 1 \"wipe:etcd:1:2\": wipe:etcd takes at most one value"},
      {"wipe:etcd:soon@step=3", "etcd downtime \"soon\""},
      {"wipe:worker:1@step=3", "wipe applies to etcd"},
      {"kill:etcd@step=3", "item 1 \"kill:etcd\": kill:etcd needs a member"},
      {"kill:etcd:-1@step=3", "etcd member \"-1\" is not 0..4"},
      {"kill:etcd:1:600001@step=3", "is not 0..600000 ms"},
      {"restart:etcd:-5@step=3", "item 1: etcd downtime \"-5\""},
      {"restart:etcd:1:2@step=3", "restart:etcd takes at most one value"},
      {"cont:etcd@step=3", "item 1 \"cont:etcd\": cont does not apply to etcd"},
      {"restart:etcd:until=3@step=3", "\"until=3\": etcd comes back at a step after the item's own (3)"},
      {"stop:etcd:until=x@step=3", "\"until=x\""},
      {"wipe:etcd:until=9@step=3", "etcd downtime \"until=9\""},
      {"term:etcd:1@step=3", "term does not apply to etcd"},
      {"kill:worker:1@step=3,stop:etcd:x@step=4", "item 2 \"stop:etcd:x\""},
  };
  expect_refused(bad, sizeof bad / sizeof bad[0]);
}

/* kill:host:I: every worker of a simulated host (newt run --hosts); only kill applies. */
static void test_chaos_host(void) {
  chaos_plan c;
  char buf[64];
  T_OK(chaos_parse("kill:worker:0@step=3,kill:host:1@step=10,kill:host:2@step=10", &c));
  T_CHECK(c.n == 3 && c.events[1].target == CHAOS_HOST && c.events[1].action == CHAOS_KILL && c.events[1].index == 1 &&
          c.events[2].index == 2 && !c.events[1].by_rank);
  T_CHECK(strcmp(chaos_event_str(&c.events[1], buf, sizeof buf), "kill:host:1@step=10") == 0);
  chaos_free(&c);
  T_OK(chaos_parse(buf, &c));
  T_CHECK(c.n == 1 && c.events[0].target == CHAOS_HOST && c.events[0].index == 1 && c.events[0].step == 10);
  chaos_free(&c);
  const char *bad[][2] = {
      {"stop:host:1@step=3", "item 1 \"stop:host:1\": only kill applies to a host"},
      {"kill:host@step=3", "item 1 \"kill:host\": host \"\" is not 0..1023"},
      {"kill:host:x@step=3", "host \"x\" is not 0..1023"},
      {"kill:host:1024@step=3", "host \"1024\""},
      {"kill:host:1:2@step=3", "item 1 \"kill:host:1:2\": kill:host takes one value"},
      {"kill:worker:1@step=3,kill:host:-1@step=4", "item 2 \"kill:host:-1\""},
  };
  expect_refused(bad, sizeof bad / sizeof bad[0]);
}

/* cut, cut-etcd: a worker's, a rank's or a simulated host's namespace (newt run --netns) cut
 * from the others or from etcd, for MS ms, until step S, or for good. */
static void test_chaos_cut(void) {
  struct {
    const char *in;
    chaos_action action;
    chaos_target target;
    int by_rank, index;
    int64_t arg, until;
    const char *printed;
  } good[] = {
      {"cut:worker:2@step=5", CHAOS_CUT, CHAOS_WORKER, 0, 2, 0, 0, "cut:worker:2@step=5"},
      {"cut:rank:0:3000@step=5", CHAOS_CUT, CHAOS_WORKER, 1, 0, 3000, 0, "cut:rank:0:3000@step=5"},
      {"cut:host:1:until=40@step=5", CHAOS_CUT, CHAOS_HOST, 0, 1, 0, 40, "cut:host:1:until=40@step=5"},
      {"cut-etcd:rank:0:until=9@step=5", CHAOS_CUT_ETCD, CHAOS_WORKER, 1, 0, 0, 9, "cut-etcd:rank:0:until=9@step=5"},
      {"cut-etcd:worker:3:10@step=5", CHAOS_CUT_ETCD, CHAOS_WORKER, 0, 3, 10, 0, "cut-etcd:worker:3:10@step=5"},
      {"slow:host:1:20000:until=30@step=5", CHAOS_SLOW, CHAOS_HOST, 0, 1, 0, 30, "slow:host:1:20000:until=30@step=5"},
      {"slow:worker:2:64@step=5", CHAOS_SLOW, CHAOS_WORKER, 0, 2, 0, 0, "slow:worker:2:64@step=5"},
  };
  chaos_plan c;
  char buf[64];
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    T_OK(chaos_parse(good[i].in, &c));
    T_CHECK_MSG(c.n == 1, "%s gave %d events", good[i].in, c.n);
    if (c.n != 1) {
      chaos_free(&c);
      continue;
    }
    chaos_event e = c.events[0];
    chaos_free(&c);
    T_CHECK_MSG(e.action == good[i].action && e.target == good[i].target && e.by_rank == good[i].by_rank &&
                    e.index == good[i].index && e.arg == good[i].arg && e.until_step == good[i].until && e.step == 5,
                "%s: action %d target %d index %d arg %lld until %lld", good[i].in, (int)e.action, (int)e.target,
                e.index, (long long)e.arg, (long long)e.until_step);
    T_CHECK_MSG(strcmp(chaos_event_str(&e, buf, sizeof buf), good[i].printed) == 0, "%s printed as %s", good[i].in, buf);
  }
  const char *bad[][2] = {
      {"cut@step=3", "item 1 \"cut\": cut needs a target"},
      {"cut:coordinator:0@step=3", "cut applies to worker:I, rank:R or host:I"},
      {"cut:worker:x@step=3", "worker \"x\" is not a number"},
      {"cut:worker:1:0@step=3", "how long the cut lasts, \"0\", is not 1..3600000 ms"},
      {"cut-etcd:host:1:until=3@step=3", "\"until=3\": the cut is mended at a step after the item's own (3)"},
      {"cut:worker:1:2:3@step=3", "too many"},
      {"slow:host:1@step=3", "slow needs a rate of 8..100000000 kbit/s"},
      {"slow:host:1:fast@step=3", "slow needs a rate"},
      {"slow:host:1:100:0@step=3", "how long the slow link lasts, \"0\""},
  };
  expect_refused(bad, sizeof bad / sizeof bad[0]);
}

/* slowcpu: a worker run a fraction of the time (issue 41). */
static void test_chaos_slowcpu(void) {
  chaos_plan c;
  char buf[64];
  T_OK(chaos_parse("slowcpu:worker:1:50%:until=60@step=20,slowcpu:rank:0:25%@step=5", &c));
  T_CHECK(c.n == 2);
  if (c.n == 2) {
    const chaos_event *a = &c.events[0], *b = &c.events[1]; /* sorted by step */
    T_CHECK(a->action == CHAOS_SLOWCPU && a->by_rank && a->index == 0 && a->percent == 25 && a->until_step == 0);
    T_CHECK(b->action == CHAOS_SLOWCPU && !b->by_rank && b->index == 1 && b->percent == 50 && b->until_step == 60);
    T_CHECK_MSG(strcmp(chaos_event_str(b, buf, sizeof buf), "slowcpu:worker:1:50%:until=60@step=20") == 0, "%s", buf);
    T_CHECK_MSG(strcmp(chaos_event_str(a, buf, sizeof buf), "slowcpu:rank:0:25%@step=5") == 0, "%s", buf);
  }
  chaos_free(&c);
  T_OK(chaos_parse("slowcpu:worker:2:40%:until=rebalanced@step=7", &c));
  T_CHECK(c.n == 1 && c.events[0].until_rebalanced && c.events[0].until_step == 0 && c.events[0].percent == 40);
  if (c.n == 1)
    T_CHECK_MSG(strcmp(chaos_event_str(&c.events[0], buf, sizeof buf), "slowcpu:worker:2:40%:until=rebalanced@step=7") == 0,
                "%s", buf);
  chaos_free(&c);
  const char *bad[][2] = {
      {"slowcpu:worker:1:50%:until=balanced@step=3", "or once a plan answered it, as until=rebalanced"},
      {"slowcpu:worker:1@step=3", "slowcpu applies to worker:I or rank:R with the CPU time it keeps"},
      {"slowcpu:host:1:50%@step=3", "slowcpu applies to worker:I or rank:R"},
      {"slowcpu:worker:1:50@step=3", "\"50\": the CPU time the worker keeps is 1%..99%"},
      {"slowcpu:worker:1:100%@step=3", "1%..99%"},
      {"slowcpu:worker:1:50%:until=3@step=3", "the slowdown ends at a step after the item's own (3)"},
  };
  expect_refused(bad, sizeof bad / sizeof bad[0]);
}

int main(void) {
  T_RUN(test_chaos);
  T_RUN(test_chaos_cut);
  T_RUN(test_chaos_slowcpu);
  T_RUN(test_chaos_host);
  T_RUN(test_chaos_etcd);
  return T_DONE();
}
