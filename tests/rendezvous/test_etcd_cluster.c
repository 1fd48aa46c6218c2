/* Integration tests of the private etcd as a cluster (rendezvous/etcd_server.h) with the
 * real etcd binary: three members start together; the client, given every member's URL,
 * keeps working by its call deadline when a member is killed (kill -9: a follower, then
 * the leader) or the member it prefers hangs (SIGSTOP: a follower, then the leader); a
 * killed member restarts and rejoins; the whole cluster is
 * killed and restarted with its data, and wiped (back empty on the same ports); a small
 * backend quota makes puts fail with NEWT_ERR_NOSPACE; errors name the member. */
#include <string.h>
#include <unistd.h>

#include "common/strutil.h"
#include "rdzv_test.h"

static rdzv_etcd_server *srv;
static rdzv_etcd *cli;

static newt_deadline_t dl(int64_t ms) { return newt_deadline_in_ms(ms); }

static double ms_since(uint64_t t0) { return (double)(newt_now_ns() - t0) / 1e6; }

/* A client on member i alone. */
static rdzv_etcd *member_client(int i) {
  rdzv_etcd_opts o = {.endpoints = rdzv_etcd_server_member_url(srv, i)};
  return tu_client_opts(&o);
}

/* A client on every member, member i's URL first: the one it prefers. */
static rdzv_etcd *client_preferring(int i, char *eps, size_t cap) {
  size_t used = (size_t)snprintf(eps, cap, "%s", rdzv_etcd_server_member_url(srv, i));
  for (int k = 0; k < rdzv_etcd_server_members(srv); k++)
    if (k != i) used += (size_t)snprintf(eps + used, cap - used, ",%s", rdzv_etcd_server_member_url(srv, k));
  rdzv_etcd_opts o = {.endpoints = eps};
  return tu_client_opts(&o);
}

/* 1 when key holds value, read through c (the error is shown when the read fails). */
static int holds(rdzv_etcd *c, const char *key, const char *value, int64_t deadline_ms) {
  rdzv_etcd_kv kv;
  newt_result_t r = rdzv_etcd_get(c, key, dl(deadline_ms), &kv, NULL);
  if (r != NEWT_OK) {
    fprintf(stderr, "  get %s: %s: %s\n", key, newt_result_name(r), newt_errmsg());
    return 0;
  }
  int ok = kv.value_len == strlen(value) && memcmp(kv.value, value, kv.value_len) == 0;
  if (!ok)
    fprintf(stderr, "  get %s: \"%s\" (mod revision %lld), not \"%s\"\n", key, kv.value, (long long)kv.mod_revision,
            value);
  rdzv_etcd_kv_free(&kv);
  return ok;
}

static int leader(void) {
  int l = -1;
  T_OK(rdzv_etcd_server_leader(srv, dl(10000), &l));
  return l < 0 ? 0 : l;
}

static void test_cluster_serves(void) {
  T_CHECK(rdzv_etcd_server_members(srv) == 3);
  const char *url = rdzv_etcd_server_url(srv);
  int commas = 0;
  for (const char *p = url; *p; p++) commas += *p == ',';
  T_CHECK_MSG(commas == 2, "url %s", url);
  for (int i = 0; i < 3; i++) {
    T_CHECK(strstr(url, rdzv_etcd_server_member_url(srv, i)) != NULL);
    T_CHECK(rdzv_etcd_server_member_pid(srv, i) > 0);
    char log[700];
    snprintf(log, sizeof log, "%s/m%d/etcd.log", rdzv_etcd_server_dir(srv), i);
    T_CHECK_MSG(access(log, R_OK) == 0, "no log %s", log);
  }
  T_CHECK(rdzv_etcd_server_member_url(srv, 3) == NULL && rdzv_etcd_server_member_pid(srv, -1) == 0);
  T_OK(rdzv_etcd_put(cli, "/cl/a", "1", 1, 0, dl(5000), NULL));
  T_CHECK(holds(cli, "/cl/a", "1", 5000));
  /* every member has it */
  for (int i = 0; i < 3; i++) {
    rdzv_etcd *c = member_client(i);
    T_CHECK_MSG(holds(c, "/cl/a", "1", 5000), "member %d lacks /cl/a", i);
    rdzv_etcd_free(c);
  }
}

/* Restarts member i and checks that it rejoined: key, written while it was away, is read
 * through it alone. */
static void check_rejoins(int i, const char *key, const char *value) {
  uint64_t t0 = newt_now_ns();
  T_OK(rdzv_etcd_server_member_restart(srv, i, dl(30000)));
  fprintf(stderr, "  member %d rejoined in %.0f ms\n", i, ms_since(t0));
  T_CHECK(rdzv_etcd_server_member_pid(srv, i) > 0);
  rdzv_etcd *c = member_client(i);
  T_CHECK_MSG(holds(c, key, value, 5000), "restarted member %d lacks %s", i, key);
  rdzv_etcd_free(c);
}

static void test_follower_killed(void) {
  int f = (leader() + 1) % 3;
  char eps[512];
  rdzv_etcd *c = client_preferring(f, eps, sizeof eps);
  T_OK(rdzv_etcd_server_member_kill(srv, f));
  T_CHECK(rdzv_etcd_server_member_pid(srv, f) == 0);
  /* refused by the dead member, the client fails over at once */
  uint64_t t0 = newt_now_ns();
  T_OK(rdzv_etcd_put(c, "/cl/f", "1", 1, 0, dl(5000), NULL));
  double put_ms = ms_since(t0);
  t0 = newt_now_ns();
  T_CHECK(holds(c, "/cl/f", "1", 5000));
  fprintf(stderr, "  follower %d killed: put %.0f ms, get %.0f ms\n", f, put_ms, ms_since(t0));
  T_CHECK(put_ms < 5000);
  /* a second kill of the dead member is an error naming it */
  T_ERR(NEWT_ERR_INVALID, rdzv_etcd_server_member_kill(srv, f));
  T_CHECK_MSG(strstr(newt_errmsg(), "etcd member") && strstr(newt_errmsg(), "not running"), "%s", newt_errmsg());
  check_rejoins(f, "/cl/f", "1");
  rdzv_etcd_free(c);
}

static void test_leader_killed(void) {
  int l = leader();
  char eps[512];
  rdzv_etcd *c = client_preferring(l, eps, sizeof eps);
  T_OK(rdzv_etcd_put(c, "/cl/l", "1", 1, 0, dl(5000), NULL));
  T_OK(rdzv_etcd_server_member_kill(srv, l));
  /* a write made before the others noticed is lost with the leader and cannot be told
     from one applied: etcd holds it to its own request timeout (6 s); the client ends it
     by its deadline, saying so */
  uint64_t t0 = newt_now_ns();
  newt_result_t r = rdzv_etcd_put(c, "/cl/l", "2", 1, 0, dl(3000), NULL);
  double w_ms = ms_since(t0);
  T_CHECK(w_ms < 3300);
  if (r != NEWT_OK)
    T_CHECK_MSG(r == NEWT_ERR_TIMEOUT && strstr(newt_errmsg(), "may or may not"), "%s: %s", newt_result_name(r),
                newt_errmsg());
  /* a read is re-sent: it is answered once the others elected a leader, within its deadline */
  t0 = newt_now_ns();
  rdzv_etcd_kv kv;
  T_OK(rdzv_etcd_get(c, "/cl/l", dl(5000), &kv, NULL));
  double get_ms = ms_since(t0);
  rdzv_etcd_kv_free(&kv);
  T_CHECK(get_ms < 5000);
  int l2 = -1;
  T_OK(rdzv_etcd_server_leader(srv, dl(10000), &l2));
  T_CHECK(l2 >= 0 && l2 != l);
  T_OK(rdzv_etcd_put(c, "/cl/l", "3", 1, 0, dl(5000), NULL));
  fprintf(stderr, "  leader %d killed: a write right after: %s in %.0f ms; then a get %.0f ms; member %d leads\n",
          l, newt_result_name(r), w_ms, get_ms, l2);
  check_rejoins(l, "/cl/l", "3");
  rdzv_etcd_free(c);
}

/* SIGSTOP the member a client prefers (a follower, then the leader): its calls go on. */
static void test_preferred_member_hangs(void) {
  for (int round = 0; round < 2; round++) {
    int l = leader(), m = round == 0 ? (l + 1) % 3 : l;
    const char *role = round == 0 ? "follower" : "leader";
    char eps[512], key[16], key2[16];
    snprintf(key, sizeof key, "/cl/h%d", round); /* a key per round: a held write of the last may land late */
    snprintf(key2, sizeof key2, "/cl/g%d", round);
    rdzv_etcd *c = client_preferring(m, eps, sizeof eps);
    T_OK(rdzv_etcd_put(c, key, "1", 1, 0, dl(5000), NULL));
    T_OK(rdzv_etcd_server_member_pause(srv, m));
    /* a read held by the hung member for its share of the deadline, then answered by another */
    uint64_t t0 = newt_now_ns();
    T_CHECK(holds(c, key, "1", 4000));
    double get_ms = ms_since(t0);
    t0 = newt_now_ns();
    T_OK(rdzv_etcd_put(c, key, "2", 1, 0, dl(4000), NULL)); /* to where the read was answered */
    double put_ms = ms_since(t0);
    fprintf(stderr, "  %s %d stopped: get %.0f ms (failed over), then put %.0f ms\n", role, m, get_ms, put_ms);
    T_CHECK(get_ms < 4000 && put_ms < 4000);
    /* a write whose first try goes to the hung member cannot know whether it was applied:
       it fails after that member's share of the deadline, saying so, and never later */
    rdzv_etcd *fresh = client_preferring(m, eps, sizeof eps);
    t0 = newt_now_ns();
    newt_result_t r = rdzv_etcd_put(fresh, key, "3", 1, 0, dl(3000), NULL);
    double w_ms = ms_since(t0);
    fprintf(stderr, "  a write to the stopped %s first: %s after %.0f ms\n", role, newt_result_name(r), w_ms);
    T_CHECK(w_ms < 3300);
    if (r != NEWT_OK)
      T_CHECK_MSG(r == NEWT_ERR_TIMEOUT && strstr(newt_errmsg(), rdzv_etcd_server_member_url(srv, m)) &&
                      strstr(newt_errmsg(), "may or may not"),
                  "%s: %s", newt_result_name(r), newt_errmsg());
    rdzv_etcd_free(fresh);
    T_OK(rdzv_etcd_server_member_resume(srv, m));
    /* the resumed member serves again (the write it held may be applied now, after every
       later one: "may or may not have been applied" means either, at any time) */
    T_OK(rdzv_etcd_put(c, key2, "4", 1, 0, dl(5000), NULL));
    rdzv_etcd *cm = member_client(m);
    T_CHECK_MSG(holds(cm, key2, "4", 5000), "resumed %s %d does not serve", role, m);
    rdzv_etcd_kv kv;
    T_OK(rdzv_etcd_get(cm, key, dl(5000), &kv, NULL));
    T_CHECK(kv.value && (strcmp(kv.value, "2") == 0 || strcmp(kv.value, "3") == 0));
    if (kv.value) fprintf(stderr, "  after the resume %s is \"%s\"\n", key, kv.value);
    rdzv_etcd_kv_free(&kv);
    rdzv_etcd_free(cm);
    rdzv_etcd_free(c);
  }
}

static void test_whole_cluster_restart(void) {
  T_OK(rdzv_etcd_server_kill(srv));
  for (int i = 0; i < 3; i++) T_CHECK(rdzv_etcd_server_member_pid(srv, i) == 0);
  T_ERR(NEWT_ERR_UNAVAILABLE, rdzv_etcd_put(cli, "/cl/x", "1", 1, 0, dl(300), NULL));
  uint64_t t0 = newt_now_ns();
  T_OK(rdzv_etcd_server_restart(srv, dl(30000)));
  fprintf(stderr, "  cluster restarted in %.0f ms\n", ms_since(t0));
  T_CHECK(holds(cli, "/cl/l", "3", 5000)); /* its data kept */
}

static void test_wipe(void) {
  int64_t rev = 0;
  T_OK(rdzv_etcd_put(cli, "/cl/w", "1", 1, 0, dl(5000), &rev));
  T_CHECK(rev > 3);
  char before[1024];
  snprintf(before, sizeof before, "%s", rdzv_etcd_server_url(srv));
  uint64_t t0 = newt_now_ns();
  T_OK(rdzv_etcd_server_wipe(srv, dl(30000)));
  fprintf(stderr, "  wiped and back in %.0f ms\n", ms_since(t0));
  T_CHECK(strcmp(before, rdzv_etcd_server_url(srv)) == 0); /* the same ports */
  rdzv_etcd_kvs r;
  T_OK(rdzv_etcd_range(cli, "/", &(rdzv_etcd_range_opts){.prefix = 1}, dl(5000), &r));
  T_CHECK_MSG(r.n == 0 && r.count == 0, "%zu keys after the wipe", (size_t)r.n);
  rdzv_etcd_kvs_free(&r);
  int64_t rev2 = 0;
  T_OK(rdzv_etcd_put(cli, "/cl/w", "2", 1, 0, dl(5000), &rev2));
  T_CHECK_MSG(rev2 < rev, "revision %lld after the wipe, %lld before", (long long)rev2, (long long)rev);
  for (int i = 0; i < 3; i++) {
    rdzv_etcd *c = member_client(i);
    T_CHECK_MSG(holds(c, "/cl/w", "2", 5000), "member %d after the wipe", i);
    rdzv_etcd_free(c);
  }
}

static void test_bad_members(void) {
  T_ERR(NEWT_ERR_INVALID, rdzv_etcd_server_member_pause(srv, 3));
  T_CHECK_MSG(strstr(newt_errmsg(), "etcd member 3") && strstr(newt_errmsg(), "3 members"), "%s", newt_errmsg());
  T_ERR(NEWT_ERR_INVALID, rdzv_etcd_server_member_restart(srv, -1, dl(1000)));
  rdzv_etcd_server *s = NULL;
  rdzv_etcd_server_opts six = {.members = 6};
  T_ERR(NEWT_ERR_INVALID, rdzv_etcd_server_start(&six, &s));
  T_CHECK(strstr(newt_errmsg(), "members 6 is not 1..5") != NULL);
  /* a member that cannot start is named, with its log */
  rdzv_etcd_server_opts broken = {.members = 2, .binary = "/bin/false"};
  T_CHECK(rdzv_etcd_server_start(&broken, &s) == NEWT_ERR_UNAVAILABLE && s == NULL);
  T_CHECK_MSG(strstr(newt_errmsg(), "etcd member ") && strstr(newt_errmsg(), " (http://127.0.0.1:") &&
                  strstr(newt_errmsg(), "exit 1") && strstr(newt_errmsg(), "/etcd.log ends"),
              "%s", newt_errmsg());
}

static void test_quota(void) {
  rdzv_etcd_server_opts so = {.quota_bytes = 1 << 20};
  rdzv_etcd_server *qs = tu_server(&so);
  rdzv_etcd *c = tu_client(qs);
  char *value = malloc(64 << 10);
  T_CHECK(value != NULL);
  if (!value) return;
  memset(value, 'q', 64 << 10);
  newt_result_t r = NEWT_OK;
  int puts = 0;
  for (; puts < 200 && r == NEWT_OK; puts++) {
    char key[32];
    snprintf(key, sizeof key, "/q/%03d", puts);
    r = rdzv_etcd_put(c, key, value, 64 << 10, 0, dl(5000), NULL);
  }
  fprintf(stderr, "  quota 1 MiB: put %d gave %s: %s\n", puts, newt_result_name(r), r ? newt_errmsg() : "");
  T_CHECK_MSG(r == NEWT_ERR_NOSPACE, "%s: %s", newt_result_name(r), newt_errmsg());
  T_CHECK(strstr(newt_errmsg(), "database space exceeded") != NULL);
  T_CHECK(puts > 2);
  /* reads still work */
  rdzv_etcd_kvs kvs;
  T_OK(rdzv_etcd_range(c, "/q/", &(rdzv_etcd_range_opts){.prefix = 1, .count_only = 1}, dl(5000), &kvs));
  /* the put refused may be applied all the same (etcd checks the quota again after it
     applied one, and answers that one with the error too) */
  T_CHECK_MSG(kvs.count == puts - 1 || kvs.count == puts, "%lld keys after %d puts", (long long)kvs.count, puts);
  rdzv_etcd_kvs_free(&kvs);
  free(value);
  rdzv_etcd_free(c);
  rdzv_etcd_server_free(qs);
}

int main(void) {
  uint64_t t0 = newt_now_ns();
  rdzv_etcd_server_opts so = {.members = 3};
  srv = tu_server(&so);
  fprintf(stderr, "  3 members serving in %.0f ms at %s\n", ms_since(t0), rdzv_etcd_server_url(srv));
  cli = tu_client(srv);
  T_RUN(test_cluster_serves);
  T_RUN(test_follower_killed);
  T_RUN(test_leader_killed);
  T_RUN(test_preferred_member_hangs);
  T_RUN(test_whole_cluster_restart);
  T_RUN(test_wipe);
  T_RUN(test_bad_members);
  T_RUN(test_quota);
  rdzv_etcd_free(cli);
  rdzv_etcd_server_free(srv);
  return T_DONE();
}
