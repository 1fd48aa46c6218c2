/* The group commit of etcd transactions (rendezvous/batch.h) against a real etcd: a host's
 * workers registering and acknowledging through one batch cost one write where they cost one
 * each, and each still gets what its own transaction would have got alone: a key held by
 * another lease is refused to that worker only, a lease that is gone fails that worker only,
 * two transactions on one key never go together, a range goes alone. No timing: the batch
 * waits for the whole host (expect) with a linger far longer than any test. */
#include <pthread.h>
#include <string.h>

#include "job/records.h"
#include "job/store.h"
#include "rdzv_test.h"
#include "rendezvous/batch.h"
#include "rendezvous/rdzv.h"

static rdzv_etcd_server *srv;
static rdzv_etcd *cli;

static newt_deadline_t dl(int64_t ms) { return newt_deadline_in_ms(ms); }

/* One simulated worker of a host: registers on the host's lease through the batch, then
 * (when told) acknowledges generation 1 through it. */
typedef struct hw {
  rdzv_etcd *c;
  rdzv_batch *batch;
  int64_t lease;
  char id[16];
  rdzv_registration *reg;
  newt_result_t reg_rc, ack_rc;
  char err[256];
} hw;

static job_worker mkworker(const char *id) {
  job_worker w = {.device = -1, .pid = 1};
  snprintf(w.id, sizeof w.id, "%s", id);
  snprintf(w.host, sizeof w.host, "h");
  snprintf(w.addr, sizeof w.addr, "127.0.0.1:1");
  snprintf(w.state, sizeof w.state, "joining");
  return w;
}

static void *register_main(void *arg) {
  hw *x = arg;
  job_worker w = mkworker(x->id);
  job_host_route via = {.batch = x->batch};
  x->reg_rc = job_register_via(x->c, "batch", &w, x->lease, &via, 30, NULL, NULL, dl(20000), &x->reg);
  if (x->reg_rc != NEWT_OK) snprintf(x->err, sizeof x->err, "%s", newt_errmsg());
  return NULL;
}

static void *ack_main(void *arg) {
  hw *x = arg;
  x->ack_rc = job_registration_ack(x->reg, "training", 1, "{\"rank\":0}", dl(20000));
  return NULL;
}

static void *leave_main(void *arg) {
  hw *x = arg;
  x->ack_rc = rdzv_registration_leave(x->reg, dl(20000));
  return NULL;
}

static void run_all(hw *ws, int n, void *(*fn)(void *)) {
  pthread_t th[16];
  for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, fn, &ws[i]);
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

/* 8 workers of a host: their 8 registrations are one etcd write, their 8 acknowledgements
 * another; each is registered on the host's lease with its own record, and acknowledged. */
static void test_host_one_write(void) {
  rdzv_etcd *wc = tu_client(srv);
  int64_t lease = 0;
  T_OK(rdzv_etcd_lease_grant(wc, 30, 0, dl(5000), &lease, NULL));
  rdzv_batch_opts bo = {.expect = 8, .linger_ms = 600000};
  rdzv_batch *b = NULL;
  T_OK(rdzv_batch_new(wc, &bo, &b));
  hw ws[8];
  memset(ws, 0, sizeof ws);
  for (int i = 0; i < 8; i++) {
    ws[i] = (hw){.c = wc, .batch = b, .lease = lease};
    snprintf(ws[i].id, sizeof ws[i].id, "one%d", i);
  }
  int64_t w0 = rdzv_etcd_writes(wc);
  run_all(ws, 8, register_main);
  T_CHECK_MSG(rdzv_etcd_writes(wc) - w0 == 1, "8 registrations through the batch took %lld writes",
              (long long)(rdzv_etcd_writes(wc) - w0));
  for (int i = 0; i < 8; i++) {
    T_CHECK_MSG(ws[i].reg_rc == NEWT_OK, "%s: %s", ws[i].id, ws[i].err);
    if (!ws[i].reg) return;
    T_CHECK(rdzv_registration_shared(ws[i].reg) && rdzv_registration_lease(ws[i].reg) == lease);
  }
  w0 = rdzv_etcd_writes(wc);
  run_all(ws, 8, ack_main);
  T_CHECK_MSG(rdzv_etcd_writes(wc) - w0 == 1, "8 acknowledgements through the batch took %lld writes",
              (long long)(rdzv_etcd_writes(wc) - w0));
  for (int i = 0; i < 8; i++) {
    T_OK(ws[i].ack_rc);
    char key[128];
    rdzv_etcd_kv kv;
    T_OK(newt_job_path(key, sizeof key, "batch", "workers/"));
    strncat(key, ws[i].id, sizeof key - strlen(key) - 1);
    T_OK(rdzv_etcd_get(cli, key, dl(5000), &kv, NULL));
    job_worker got;
    T_OK(job_worker_from_json(kv.value, kv.value_len, key, &got));
    T_CHECK_MSG(strcmp(got.id, ws[i].id) == 0 && got.generation == 1 && strcmp(got.state, "training") == 0 &&
                    kv.lease == lease,
                "%s's record after the batch: id %s, generation %lld, state %s", ws[i].id, got.id,
                (long long)got.generation, got.state);
    rdzv_etcd_kv_free(&kv);
  }
  int64_t posted = 0, sent = 0;
  rdzv_batch_counts(b, &posted, &sent);
  T_CHECK_MSG(posted == 16 && sent == 2, "posted %lld, sent %lld", (long long)posted, (long long)sent);
  w0 = rdzv_etcd_writes(wc);
  run_all(ws, 8, leave_main); /* the host's workers leave together: one write */
  T_CHECK_MSG(rdzv_etcd_writes(wc) - w0 == 1, "8 leaves through the batch took %lld writes",
              (long long)(rdzv_etcd_writes(wc) - w0));
  for (int i = 0; i < 8; i++) {
    T_OK(ws[i].ack_rc);
    rdzv_registration_free(ws[i].reg);
  }
  rdzv_etcd_kvs left;
  char prefix[128];
  T_OK(newt_job_path(prefix, sizeof prefix, "batch", "workers/one"));
  rdzv_etcd_range_opts ro = {.prefix = 1};
  T_OK(rdzv_etcd_range(cli, prefix, &ro, dl(5000), &left));
  T_CHECK_MSG(left.n == 0, "%zu registrations left after the leaves", left.n);
  rdzv_etcd_kvs_free(&left);
  rdzv_batch_free(b);
  rdzv_etcd_lease_revoke(wc, lease, dl(5000));
  rdzv_etcd_free(wc);
}

/* One of 4 registrations is refused (its id is held by another live lease): that one gets
 * NEWT_ERR_CONFLICT naming the other lease, as alone, and the other 3 are registered. One
 * on a lease that does not exist, among 3: it goes on a lease of its own, the 3 on the host's. */
static void test_host_one_refused(void) {
  rdzv_etcd *wc = tu_client(srv);
  int64_t lease = 0, other = 0;
  T_OK(rdzv_etcd_lease_grant(wc, 30, 0, dl(5000), &lease, NULL));
  T_OK(rdzv_etcd_lease_grant(cli, 30, 0, dl(5000), &other, NULL));
  rdzv_registration *held = NULL;
  job_worker w = mkworker("ref2");
  T_OK(job_register_on(cli, "batch", &w, other, 30, NULL, NULL, dl(5000), &held));
  rdzv_batch_opts bo = {.expect = 4, .linger_ms = 600000};
  rdzv_batch *b = NULL;
  T_OK(rdzv_batch_new(wc, &bo, &b));
  hw ws[4];
  memset(ws, 0, sizeof ws);
  for (int i = 0; i < 4; i++) {
    ws[i] = (hw){.c = wc, .batch = b, .lease = lease};
    snprintf(ws[i].id, sizeof ws[i].id, "ref%d", i);
  }
  run_all(ws, 4, register_main);
  for (int i = 0; i < 4; i++) {
    if (i == 2) {
      T_CHECK_MSG(ws[i].reg_rc == NEWT_ERR_CONFLICT && strstr(ws[i].err, "already registered"),
                  "the held id through the batch: %s (%s)", newt_result_name(ws[i].reg_rc), ws[i].err);
      continue;
    }
    T_CHECK_MSG(ws[i].reg_rc == NEWT_OK, "%s: %s", ws[i].id, ws[i].err);
    if (ws[i].reg) T_CHECK(rdzv_registration_lease(ws[i].reg) == lease);
  }
  int64_t posted = 0, sent = 0;
  rdzv_batch_counts(b, &posted, &sent);
  T_CHECK_MSG(posted == 4 && sent == 5, "posted %lld, sent %lld (one merged, refused, then 4 alone)",
              (long long)posted, (long long)sent);
  for (int i = 0; i < 4; i++)
    if (ws[i].reg) {
      rdzv_registration_free(ws[i].reg); /* the host's lease goes below, and its keys with it */
    }
  rdzv_registration_leave(held, dl(5000));
  rdzv_registration_free(held);
  rdzv_etcd_lease_revoke(cli, other, dl(5000));

  /* a lease that is gone: etcd refuses the merged put; alone, the worker takes a lease of its
     own and the others the host's */
  int64_t gone = 0;
  T_OK(rdzv_etcd_lease_grant(wc, 30, 0, dl(5000), &gone, NULL));
  T_OK(rdzv_etcd_lease_revoke(wc, gone, dl(5000)));
  memset(ws, 0, sizeof ws);
  for (int i = 0; i < 4; i++) {
    ws[i] = (hw){.c = wc, .batch = b, .lease = i == 1 ? gone : lease};
    snprintf(ws[i].id, sizeof ws[i].id, "gone%d", i);
  }
  run_all(ws, 4, register_main);
  for (int i = 0; i < 4; i++) {
    T_CHECK_MSG(ws[i].reg_rc == NEWT_OK, "%s: %s", ws[i].id, ws[i].err);
    if (!ws[i].reg) continue;
    T_CHECK_MSG(i == 1 ? !rdzv_registration_shared(ws[i].reg) : rdzv_registration_lease(ws[i].reg) == lease,
                "%s: lease %llx (host %llx, gone %llx)", ws[i].id, (unsigned long long)rdzv_registration_lease(ws[i].reg),
                (unsigned long long)lease, (unsigned long long)gone);
    if (!rdzv_registration_shared(ws[i].reg)) rdzv_registration_leave(ws[i].reg, dl(5000)); /* its own lease */
    rdzv_registration_free(ws[i].reg);
  }
  rdzv_batch_free(b);
  rdzv_etcd_lease_revoke(wc, lease, dl(5000));
  rdzv_etcd_free(wc);
}

typedef struct raw {
  rdzv_batch *b;
  rdzv_etcd_op op;
  rdzv_etcd_cmp cmp;
  int ncmp;
  newt_result_t rc;
  rdzv_etcd_txn_result tr;
} raw;

static void *raw_main(void *arg) {
  raw *x = arg;
  x->rc = rdzv_batch_txn(x->b, &x->cmp, (size_t)x->ncmp, &x->op, 1, NULL, 0, dl(20000), &x->tr);
  return NULL;
}

/* Two transactions on one key never go together (the second's compare must see the first's
 * put: merged, etcd would refuse them): with both queued, the batch sends them one after the
 * other, whichever first, and both compares hold. A range goes alone and gets its own result. */
static void test_same_key_apart(void) {
  rdzv_etcd *wc = tu_client(srv);
  rdzv_batch_opts bo = {.expect = 3, .linger_ms = 600000};
  rdzv_batch *b = NULL;
  T_OK(rdzv_batch_new(wc, &bo, &b));
  char k[128], k2[128];
  T_OK(newt_job_path(k, sizeof k, "batch", "same"));
  T_OK(newt_job_path(k2, sizeof k2, "batch", "other"));
  T_OK(rdzv_etcd_put(cli, k2, "x", 1, 0, dl(5000), NULL));
  raw xs[3];
  memset(xs, 0, sizeof xs);
  xs[0] = (raw){.b = b, .op = {.type = RDZV_OP_PUT, .key = k, .value = "1", .value_len = 1},
                .cmp = {.key = k, .target = RDZV_CMP_VERSION, .result = RDZV_CMP_LESS, .number = 2}, .ncmp = 1};
  xs[1] = (raw){.b = b, .op = {.type = RDZV_OP_PUT, .key = k, .value = "2", .value_len = 1},
                .cmp = {.key = k, .target = RDZV_CMP_VERSION, .result = RDZV_CMP_LESS, .number = 3}, .ncmp = 1};
  xs[2] = (raw){.b = b, .op = {.type = RDZV_OP_RANGE, .key = k2}};
  pthread_t th[3];
  for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, raw_main, &xs[i]);
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 3; i++) {
    T_OK(xs[i].rc);
    T_CHECK(xs[i].tr.succeeded && xs[i].tr.n == 1);
  }
  T_CHECK(xs[2].tr.n == 1 && xs[2].tr.results[0].range.n == 1 && xs[2].tr.results[0].range.kvs[0].value_len == 1 &&
          xs[2].tr.results[0].range.kvs[0].value[0] == 'x');
  rdzv_etcd_kv kv;
  T_OK(rdzv_etcd_get(cli, k, dl(5000), &kv, NULL));
  T_CHECK_MSG(kv.version == 2, "the key was written %lld times, not 2", (long long)kv.version);
  rdzv_etcd_kv_free(&kv);
  int64_t posted = 0, sent = 0;
  rdzv_batch_counts(b, &posted, &sent);
  T_CHECK_MSG(posted == 3 && sent == 3, "posted %lld, sent %lld: none of the three may go with another",
              (long long)posted, (long long)sent);
  for (int i = 0; i < 3; i++) rdzv_etcd_txn_result_free(&xs[i].tr);
  rdzv_batch_free(b);
  rdzv_etcd_free(wc);
}

int main(void) {
  srv = tu_server(NULL);
  cli = tu_client(srv);
  T_RUN(test_host_one_write);
  T_RUN(test_host_one_refused);
  T_RUN(test_same_key_apart);
  rdzv_etcd_free(cli);
  rdzv_etcd_server_free(srv);
  return T_DONE();
}
