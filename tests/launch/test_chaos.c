/* Unit tests of chaos schedules (launch/chaos.h): the grammar, and errors naming the item. */
#include <string.h>

#include "launch/chaos.h"
#include "test.h"

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
  T_OK(chaos_parse("", &c));
  T_CHECK(c.n == 0);
  const char *bad[][2] = {{"kill:worker:1", "missing \"@step=N\""},
                          {"kill:worker:x@step=3", "worker index"},
                          {"explode:worker:1@step=3", "unknown action \"explode\""},
                          {"kill:worker:1@step=-2", "step"},
                          {"join:0@step=3", "join needs a count"},
                          {"restart:worker@step=3", "restart applies to etcd"},
                          {"kill:worker:1@step=3,kill:robot:1@step=4", "item 2"},
                          {"cont:coordinator@step=3", "cont applies to workers"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    T_CHECK_MSG(chaos_parse(bad[i][0], &c) == NEWT_ERR_INVALID, "accepted %s", bad[i][0]);
    T_CHECK_MSG(strstr(newt_errmsg(), bad[i][1]) != NULL, "error \"%s\" lacks \"%s\"", newt_errmsg(), bad[i][1]);
  }
}

int main(void) {
  T_RUN(test_chaos);
  return T_DONE();
}
