/* The job's records as the previous release wrote them: golden bytes, captured by running the
 * codecs of the release before issue 28 (the hand-written encoders of job/records.c, plan.c,
 * spec.c, and rendezvous' registration, rdzv_worker, now job_worker; the candidacy, which
 * rdzv_elect.c printed as {"name":"%s","host":"%s","pid":%d}) on the values built below.
 * Today's codecs must
 *   (a) read each of them back to the same value,
 *   (b) write the same value to the same bytes, byte for byte,
 * so that a job's records in etcd stay what every release reads and writes. Rejections
 * naming the record and the field are tests/job/test_records.c's and test_plan.c's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "job/plan.h"
#include "job/records.h"
#include "job/spec.h"
#include "test.h"

/* One record type under test: its codec, seen through void pointers. */
typedef struct codec {
  size_t size;
  char *(*encode)(const void *v);
  newt_result_t (*decode)(const char *text, size_t len, void *out);
  int (*same)(const void *a, const void *b); /* NULL: memcmp (a value built on zeroed memory) */
  void (*release)(void *v);                  /* NULL: nothing to free */
} codec;

#define CODEC_OF(T, enc, dec)                                                                                    \
  static char *enc_##T(const void *v) { return enc(v); }                                                         \
  static newt_result_t dec_##T(const char *t, size_t n, void *o) { return dec(t, n, o); }

CODEC_OF(job_report, job_report_to_json, job_report_from_json)
CODEC_OF(job_ack, job_ack_to_json, job_ack_from_json)
CODEC_OF(job_progress, job_progress_to_json, job_progress_from_json)
CODEC_OF(job_step, job_step_to_json, job_step_from_json)
CODEC_OF(job_done, job_done_to_json, job_done_from_json)
CODEC_OF(job_ckpt, job_ckpt_to_json, job_ckpt_from_json)
CODEC_OF(job_failed, job_failed_to_json, job_failed_from_json)
CODEC_OF(job_event, job_event_to_json, job_event_from_json)
CODEC_OF(job_fault, job_fault_to_json, job_fault_from_json)
CODEC_OF(job_links, job_links_to_json, job_links_from_json)
CODEC_OF(newt_spec, spec_to_json, spec_from_json)
CODEC_OF(newt_plan, plan_to_json, plan_from_json)
CODEC_OF(job_candidacy, job_candidacy_to_json, job_candidacy_from_json)

static char *enc_worker(const void *v) {
  char *out = NULL;
  return job_worker_to_json(v, &out) == NEWT_OK ? out : NULL;
}
static newt_result_t dec_worker(const char *t, size_t n, void *o) { return job_worker_from_json(t, n, "reg", o); }

/* NaN is NaN: the bits of a double read back as null need not be the bits written. */
static int same_real(double a, double b) { return (isnan(a) && isnan(b)) || a == b; }

static int same_names(char (*a)[NEWT_ID_MAX], int na, char (*b)[NEWT_ID_MAX], int nb) {
  if (na != nb) return 0;
  for (int i = 0; i < na; i++)
    if (strcmp(a[i], b[i]) != 0) return 0;
  return 1;
}

static int same_event(const void *pa, const void *pb) {
  const job_event *a = pa, *b = pb;
  job_event x = *a, y = *b; /* the scalars, the arrays apart */
  x.excluded = y.excluded = NULL;
  x.spare_ids = y.spare_ids = NULL;
  x.nexcluded = y.nexcluded = x.nspare_ids = y.nspare_ids = 0;
  int loss = same_real(x.loss, y.loss);
  x.loss = y.loss = 0;
  return memcmp(&x, &y, sizeof x) == 0 && loss && same_names(a->excluded, a->nexcluded, b->excluded, b->nexcluded) &&
         same_names(a->spare_ids, a->nspare_ids, b->spare_ids, b->nspare_ids);
}

static int same_progress(const void *pa, const void *pb) {
  job_progress x = *(const job_progress *)pa, y = *(const job_progress *)pb;
  int loss = same_real(x.loss, y.loss);
  x.loss = y.loss = 0;
  return loss && memcmp(&x, &y, sizeof x) == 0;
}

static int same_step(const void *pa, const void *pb) {
  job_step x = *(const job_step *)pa, y = *(const job_step *)pb;
  int loss = same_real(x.loss, y.loss) && same_real(x.grad_norm, y.grad_norm);
  x.loss = y.loss = x.grad_norm = y.grad_norm = 0;
  return loss && memcmp(&x, &y, sizeof x) == 0;
}

static int same_plan(const void *pa, const void *pb) {
  const newt_plan *a = pa, *b = pb;
  newt_plan x = *a, y = *b;
  x.ranks = y.ranks = x.donors = y.donors = NULL;
  x.spares = y.spares = NULL;
  x.by_worker = y.by_worker = NULL;
  if (memcmp(&x, &y, sizeof x) != 0) return 0;
  for (int i = 0; i < a->nranks; i++)
    if (memcmp(&a->ranks[i], &b->ranks[i], sizeof a->ranks[i]) != 0) return 0;
  for (int i = 0; i < a->ndonors; i++)
    if (memcmp(&a->donors[i], &b->donors[i], sizeof a->donors[i]) != 0) return 0;
  for (int i = 0; i < a->nspares; i++)
    if (strcmp(a->spares[i], b->spares[i]) != 0) return 0;
  return 1;
}

static void free_event(void *v) { job_event_free(v); }
static void free_plan(void *v) { plan_free(v); }

static const codec report_codec = {sizeof(job_report), enc_job_report, dec_job_report, NULL, NULL};
static const codec ack_codec = {sizeof(job_ack), enc_job_ack, dec_job_ack, NULL, NULL};
static const codec progress_codec = {sizeof(job_progress), enc_job_progress, dec_job_progress, same_progress, NULL};
static const codec step_codec = {sizeof(job_step), enc_job_step, dec_job_step, same_step, NULL};
static const codec done_codec = {sizeof(job_done), enc_job_done, dec_job_done, NULL, NULL};
static const codec ckpt_codec = {sizeof(job_ckpt), enc_job_ckpt, dec_job_ckpt, NULL, NULL};
static const codec failed_codec = {sizeof(job_failed), enc_job_failed, dec_job_failed, NULL, NULL};
static const codec event_codec = {sizeof(job_event), enc_job_event, dec_job_event, same_event, free_event};
static const codec fault_codec = {sizeof(job_fault), enc_job_fault, dec_job_fault, NULL, NULL};
static const codec links_codec = {sizeof(job_links), enc_job_links, dec_job_links, NULL, NULL};
static const codec spec_codec = {sizeof(newt_spec), enc_newt_spec, dec_newt_spec, NULL, NULL};
static const codec plan_codec = {sizeof(newt_plan), enc_newt_plan, dec_newt_plan, same_plan, free_plan};
static const codec candidacy_codec = {sizeof(job_candidacy), enc_job_candidacy, dec_job_candidacy, NULL, NULL};
static const codec worker_codec = {sizeof(job_worker), enc_worker, dec_worker, NULL, NULL};

/* (a) and (b) for one value and its golden bytes. */
static void check(const char *name, const codec *c, const void *value, const char *golden) {
  char *text = c->encode(value);
  T_CHECK_MSG(text && strcmp(text, golden) == 0, "%s: written as\n  %s\nwhere the previous release wrote\n  %s", name,
              text ? text : "(null)", golden);
  free(text);
  void *back = calloc(1, c->size);
  if (!back) return;
  newt_result_t r = c->decode(golden, strlen(golden), back);
  T_CHECK_MSG(r == NEWT_OK, "%s: the previous release's record is refused: %s", name, newt_errmsg());
  if (r == NEWT_OK) {
    int same = c->same ? c->same(value, back) : memcmp(value, back, c->size) == 0;
    T_CHECK_MSG(same, "%s: the previous release's record reads as another value", name);
    if (c->release) c->release(back);
  }
  free(back);
}

static void test_report_ack(void) {
  job_report r;
  memset(&r, 0, sizeof r);
  snprintf(r.worker, sizeof r.worker, "w1");
  r.hang = 1;
  r.build = 1;
  r.naccuse = 2;
  snprintf(r.accuse[0], sizeof r.accuse[0], "w2");
  snprintf(r.accuse[1], sizeof r.accuse[1], "w-3.x_y");
  r.step = 41;
  r.t_ms = 1700000000123ull;
  snprintf(r.why, sizeof r.why, "allreduce: rank 2 \"quoted\" closed");
  check("report", &report_codec, &r,
        "{\"worker\":\"w1\",\"kind\":\"hang\",\"during\":\"build\",\"accuse\":[\"w2\",\"w-3.x_y\"],\"step\":41,"
        "\"t_ms\":1700000000123,\"why\":\"allreduce: rank 2 \\\"quoted\\\" closed\"}");
  memset(&r, 0, sizeof r);
  snprintf(r.worker, sizeof r.worker, "w0");
  r.step = -1;
  r.t_ms = 5;
  check("report, crash, nobody accused", &report_codec, &r,
        "{\"worker\":\"w0\",\"kind\":\"crash\",\"during\":\"step\",\"accuse\":[],\"step\":-1,\"t_ms\":5,\"why\":\"\"}");

  job_ack a;
  memset(&a, 0, sizeof a);
  a.rank = 3;
  a.t_plan = 1700000000010ull;
  a.t_comm = 1700000000020ull;
  a.t_restore = 1700000000030ull;
  a.t_step = 1700000000040ull;
  snprintf(a.restore, sizeof a.restore, "peer");
  a.restore_step = 99;
  check("ack", &ack_codec, &a,
        "{\"rank\":3,\"t_plan\":1700000000010,\"t_comm\":1700000000020,\"t_restore\":1700000000030,"
        "\"t_step\":1700000000040,\"restore\":\"peer\",\"restore_step\":99}");
}

static void test_progress_step_done(void) {
  job_progress p;
  memset(&p, 0, sizeof p);
  p.generation = 4;
  p.step = 120;
  p.committed = 119;
  p.loss = 2.25;
  p.tokens_per_s = 12345.5;
  p.world = 8;
  p.dp = 2;
  p.t_ms = 1700000000000ull;
  p.step_tokens = 1024;
  check("progress", &progress_codec, &p,
        "{\"generation\":4,\"step\":120,\"committed\":119,\"loss\":2.25,\"tokens_per_s\":12345.5,"
        "\"step_tokens\":1024,\"world\":8,\"dp\":2,\"t_ms\":1700000000000}");
  p.committed = -1;
  p.loss = NAN;
  p.step_tokens = 0;
  p.tokens_per_s = 0.125;
  check("progress, diverged, no committed step", &progress_codec, &p,
        "{\"generation\":4,\"step\":120,\"loss\":null,\"tokens_per_s\":0.125,\"world\":8,\"dp\":2,"
        "\"t_ms\":1700000000000}");

  job_step s;
  memset(&s, 0, sizeof s);
  s.step = 7;
  s.loss = 3.5;
  s.lr = 0.001;
  s.grad_norm = 0.75;
  s.tokens_per_s = 4096;
  s.world = 4;
  s.dp = 4;
  s.generation = 2;
  s.t_ms = 1700000000999ull;
  s.ckpt = 5;
  check("step", &step_codec, &s,
        "{\"step\":7,\"loss\":3.5,\"lr\":0.001,\"grad_norm\":0.75,\"tokens_per_s\":4096,\"world\":4,\"dp\":4,"
        "\"generation\":2,\"t_ms\":1700000000999,\"ckpt\":5}");
  s.grad_norm = 0;
  s.loss = NAN;
  check("step, diverged, no norm", &step_codec, &s,
        "{\"step\":7,\"loss\":null,\"lr\":0.001,\"tokens_per_s\":4096,\"world\":4,\"dp\":4,\"generation\":2,"
        "\"t_ms\":1700000000999,\"ckpt\":5}");

  job_done d;
  memset(&d, 0, sizeof d);
  d.step = 300;
  d.loss = 2.1889;
  d.t_ms = 1700000001000ull;
  d.samples = 9600;
  check("done", &done_codec, &d, "{\"step\":300,\"loss\":2.1889,\"t_ms\":1700000001000,\"samples\":9600}");
}

static void test_ckpt_failed_fault_links(void) {
  job_ckpt c;
  memset(&c, 0, sizeof c);
  c.step = 50;
  snprintf(c.dir, sizeof c.dir, "/ck \"quoted\" dir");
  check("ckpt, an older worker's", &ckpt_codec, &c, "{\"step\":50,\"dir\":\"/ck \\\"quoted\\\" dir\"}");
  c.bytes = 123456789012;
  c.save_ms = 812;
  c.stall_ms = 3.142;
  check("ckpt", &ckpt_codec, &c,
        "{\"step\":50,\"dir\":\"/ck \\\"quoted\\\" dir\",\"bytes\":123456789012,\"save_ms\":812,\"stall_ms\":3.142}");

  job_failed f;
  memset(&f, 0, sizeof f);
  snprintf(f.why, sizeof f.why, "11 failures within 600000 ms");
  f.t_ms = 1700000002000ull;
  snprintf(f.coordinator, sizeof f.coordinator, "coordinator-1");
  check("failed", &failed_codec, &f,
        "{\"why\":\"11 failures within 600000 ms\",\"t_ms\":1700000002000,\"coordinator\":\"coordinator-1\"}");

  job_fault ft;
  memset(&ft, 0, sizeof ft);
  ft.generation = 3;
  ft.t_ms = 1700000003000ull;
  snprintf(ft.what, sizeof ft.what, "kill:worker:1@step=100");
  check("fault", &fault_codec, &ft, "{\"generation\":3,\"t_ms\":1700000003000,\"what\":\"kill:worker:1@step=100\"}");

  job_links l;
  memset(&l, 0, sizeof l);
  l.generation = 7;
  l.answered = 2;
  l.ranks = 3;
  l.t_ms = 1700000004000ull;
  check("links", &links_codec, &l, "{\"generation\":7,\"answered\":2,\"ranks\":3,\"t_ms\":1700000004000}");
}

/* An event of `type` with every field of the struct set, so that a field written or read
 * for a type it does not belong to shows. */
static job_event full_event(job_event_type type, char (*ex)[NEWT_ID_MAX], int nex, char (*sp)[NEWT_ID_MAX],
                            int nsp) {
  job_event e;
  memset(&e, 0, sizeof e);
  e.type = type;
  e.t_ms = 1700000005000ull;
  snprintf(e.coordinator, sizeof e.coordinator, "c0");
  e.generation = 4;
  snprintf(e.cause, sizeof e.cause, "crash");
  e.world = 6;
  e.dp = 3;
  e.spares = nsp;
  e.excluded = ex;
  e.nexcluded = nex;
  e.spare_ids = sp;
  e.nspare_ids = nsp;
  snprintf(e.worker, sizeof e.worker, "w7");
  snprintf(e.why, sizeof e.why, "need 4 workers, have 2");
  e.t_trigger = 1700000004001ull;
  e.t_detect = 1700000004002ull;
  e.t_plan = 1700000004003ull;
  e.t_comm = 1700000004004ull;
  e.t_restore = 1700000004005ull;
  e.t_step = 1700000004006ull;
  snprintf(e.restore, sizeof e.restore, "memory");
  e.restore_step = 77;
  e.steps_lost = 1;
  e.step = 300;
  e.loss = 2.5;
  return e;
}

/* What the reader of a type keeps of full_event's value: the fields of the type, zero the rest. */
static job_event kept(job_event e) {
  job_event k;
  memset(&k, 0, sizeof k);
  k.type = e.type;
  k.t_ms = e.t_ms;
  memcpy(k.coordinator, e.coordinator, sizeof k.coordinator);
  int timed = e.type == JOB_EV_STARTED || e.type == JOB_EV_RECOVERED;
  if (timed || e.type == JOB_EV_PLAN) {
    k.generation = e.generation;
    memcpy(k.cause, e.cause, sizeof k.cause);
    k.world = e.world;
  }
  if (e.type == JOB_EV_PLAN) {
    k.dp = e.dp, k.spares = e.spares;
    k.excluded = e.excluded, k.nexcluded = e.nexcluded;
  }
  if (e.type == JOB_EV_PLAN || e.type == JOB_EV_SPARE) k.spare_ids = e.spare_ids, k.nspare_ids = e.nspare_ids;
  if (e.type == JOB_EV_FENCE) memcpy(k.worker, e.worker, sizeof k.worker);
  if (e.type != JOB_EV_LEADER && e.type != JOB_EV_FENCE && e.type != JOB_EV_DONE && !timed)
    memcpy(k.why, e.why, sizeof k.why);
  if (timed) {
    k.t_trigger = e.t_trigger, k.t_detect = e.t_detect, k.t_plan = e.t_plan, k.t_comm = e.t_comm;
    k.t_restore = e.t_restore, k.t_step = e.t_step, k.restore_step = e.restore_step, k.steps_lost = e.steps_lost;
    memcpy(k.restore, e.restore, sizeof k.restore);
  }
  if (e.type == JOB_EV_DONE) k.step = e.step, k.loss = e.loss;
  return k;
}

static void test_events(void) {
  char ex[2][NEWT_ID_MAX] = {"w1", "w4"}, sp[2][NEWT_ID_MAX] = {"w5", "w6"};
  static const char *const golden[] = {
      [JOB_EV_LEADER] = "{\"type\":\"leader\",\"t_ms\":1700000005000,\"coordinator\":\"c0\"}",
      [JOB_EV_PLAN] = "{\"type\":\"plan\",\"generation\":4,\"cause\":\"crash\",\"world\":6,\"dp\":3,\"spares\":2,"
                      "\"excluded\":[\"w1\",\"w4\"],\"spare_ids\":[\"w5\",\"w6\"],\"why\":\"need 4 workers, have 2\","
                      "\"t_ms\":1700000005000,\"coordinator\":\"c0\"}",
      [JOB_EV_FENCE] = "{\"type\":\"fence\",\"worker\":\"w7\",\"t_ms\":1700000005000,\"coordinator\":\"c0\"}",
      [JOB_EV_WAITING] = "{\"type\":\"waiting\",\"why\":\"need 4 workers, have 2\",\"t_ms\":1700000005000,"
                         "\"coordinator\":\"c0\"}",
      [JOB_EV_STARTED] = "{\"type\":\"started\",\"generation\":4,\"cause\":\"crash\",\"world\":6,"
                         "\"t_trigger\":1700000004001,\"t_detect\":1700000004002,\"t_plan\":1700000004003,"
                         "\"t_comm\":1700000004004,\"t_restore\":1700000004005,\"t_step\":1700000004006,"
                         "\"restore\":\"memory\",\"restore_step\":77,\"steps_lost\":1,\"t_ms\":1700000005000,"
                         "\"coordinator\":\"c0\"}",
      [JOB_EV_RECOVERED] = "{\"type\":\"recovered\",\"generation\":4,\"cause\":\"crash\",\"world\":6,"
                           "\"t_trigger\":1700000004001,\"t_detect\":1700000004002,\"t_plan\":1700000004003,"
                           "\"t_comm\":1700000004004,\"t_restore\":1700000004005,\"t_step\":1700000004006,"
                           "\"restore\":\"memory\",\"restore_step\":77,\"steps_lost\":1,\"t_ms\":1700000005000,"
                           "\"coordinator\":\"c0\"}",
      [JOB_EV_DONE] = "{\"type\":\"done\",\"step\":300,\"loss\":2.5,\"t_ms\":1700000005000,\"coordinator\":\"c0\"}",
      [JOB_EV_FAILED] = "{\"type\":\"failed\",\"why\":\"need 4 workers, have 2\",\"t_ms\":1700000005000,"
                        "\"coordinator\":\"c0\"}",
      [JOB_EV_SPEC] = "{\"type\":\"spec\",\"why\":\"need 4 workers, have 2\",\"t_ms\":1700000005000,"
                      "\"coordinator\":\"c0\"}",
      [JOB_EV_ETCD] = "{\"type\":\"etcd\",\"why\":\"need 4 workers, have 2\",\"t_ms\":1700000005000,"
                      "\"coordinator\":\"c0\"}",
      [JOB_EV_SPARE] = "{\"type\":\"spare\",\"spare_ids\":[\"w5\",\"w6\"],\"why\":\"need 4 workers, have 2\","
                       "\"t_ms\":1700000005000,\"coordinator\":\"c0\"}",
  };
  for (int t = JOB_EV_LEADER; t <= JOB_EV_SPARE; t++) {
    job_event full = full_event((job_event_type)t, ex, 2, sp, 2), k = kept(full);
    char name[64];
    snprintf(name, sizeof name, "event %s", job_event_type_name((job_event_type)t));
    check(name, &event_codec, &k, golden[t]);
    char *text = job_event_to_json(&full); /* the fields of other types are not written */
    T_CHECK_MSG(text && strcmp(text, golden[t]) == 0, "%s: every field set: %s", name, text ? text : "(null)");
    free(text);
  }
  /* a plan without spares or why; a diverged end */
  job_event plan = kept(full_event(JOB_EV_PLAN, ex, 0, sp, 0));
  memset(plan.why, 0, sizeof plan.why);
  memset(plan.cause, 0, sizeof plan.cause);
  snprintf(plan.cause, sizeof plan.cause, "initial");
  check("event plan, no spares", &event_codec, &plan,
        "{\"type\":\"plan\",\"generation\":4,\"cause\":\"initial\",\"world\":6,\"dp\":3,\"spares\":0,"
        "\"excluded\":[],\"t_ms\":1700000005000,\"coordinator\":\"c0\"}");
  job_event done = kept(full_event(JOB_EV_DONE, ex, 0, sp, 0));
  done.loss = NAN;
  check("event done, diverged", &event_codec, &done,
        "{\"type\":\"done\",\"step\":300,\"loss\":null,\"t_ms\":1700000005000,\"coordinator\":\"c0\"}");
}

static void test_spec(void) {
  newt_spec s;
  spec_defaults(&s, "demo");
  check("spec, defaults", &spec_codec, &s,
        "{\"job\":\"demo\",\"model\":{\"preset\":\"tiny\"},\"data\":{\"path\":\"\",\"seed\":1,\"gen_bytes\":2097152},"
        "\"train\":{\"steps\":100,\"global_batch\":32,\"micro_batch\":4,\"seq_len\":0,\"lr\":0.001,\"lr_min\":0.0001,"
        "\"warmup\":-1,\"weight_decay\":0.1,\"grad_clip\":1,\"seed\":1},\"parallel\":{\"tp\":1,\"pp\":1,\"zero\":0,"
        "\"dp_min\":1,\"dp_max\":1024,\"start_workers\":0,\"start_timeout_ms\":30000},\"ckpt\":{\"dir\":\"\","
        "\"every\":0,\"keep\":3,\"level\":3},\"fault\":{\"lease_ttl_ms\":2000,\"comm_timeout_ms\":3000,"
        "\"hang_timeout_ms\":5000,\"first_step_timeout_ms\":120000,\"report_window_ms\":300,\"replica_every\":1,"
        "\"max_failures\":10,\"failure_window_ms\":600000},\"backend\":\"cpu\"}");
  s.vocab = 256, s.ctx = 64, s.layers = 4, s.heads = 4, s.channels = 128;
  snprintf(s.preset, sizeof s.preset, "small");
  snprintf(s.data_path, sizeof s.data_path, "/data/corpus.tok");
  s.data_seed = 1000000000000000ull;
  s.seed = UINT64_MAX;
  s.steps = 2000, s.global_batch = 48, s.micro_batch = 2, s.seq_len = 32;
  s.lr = 0.0003, s.lr_min = 0.00003, s.warmup = 50, s.weight_decay = 0.01, s.grad_clip = 0.5;
  s.tp = 2, s.pp = 2, s.zero = 1, s.dp_min = 2, s.dp_max = 6, s.start_workers = 8, s.start_timeout_ms = 60000;
  s.join_window_ms = 250;
  s.even_batches = 1;
  snprintf(s.ckpt_dir, sizeof s.ckpt_dir, "/ckpt/demo");
  s.ckpt_every = 50, s.ckpt_keep = 2, s.ckpt_level = -3;
  s.lease_ttl_ms = 3000, s.comm_timeout_ms = 4000, s.hang_timeout_ms = 6000, s.first_step_timeout_ms = 90000;
  s.report_window_ms = 200, s.replica_every = 2, s.replicas = 3, s.max_failures = 0, s.failure_window_ms = 1000;
  s.progress_timeout_ms = 0;
  snprintf(s.backend, sizeof s.backend, "nccl");
  check("spec, every optional field", &spec_codec, &s,
        "{\"job\":\"demo\",\"model\":{\"preset\":\"small\",\"vocab\":256,\"ctx\":64,\"layers\":4,\"heads\":4,"
        "\"channels\":128},\"data\":{\"path\":\"/data/corpus.tok\",\"seed\":\"1000000000000000\",\"gen_bytes\":2097152},"
        "\"train\":{\"steps\":2000,\"global_batch\":48,\"micro_batch\":2,\"seq_len\":32,\"lr\":0.0003,"
        "\"lr_min\":3e-05,\"warmup\":50,\"weight_decay\":0.01,\"grad_clip\":0.5,\"seed\":\"18446744073709551615\"},"
        "\"parallel\":{\"tp\":2,\"pp\":2,\"zero\":1,\"dp_min\":2,\"dp_max\":6,\"start_workers\":8,"
        "\"start_timeout_ms\":60000,\"join_window_ms\":250,\"even_batches\":true},\"ckpt\":{\"dir\":\"/ckpt/demo\","
        "\"every\":50,\"keep\":2,\"level\":-3},\"fault\":{\"lease_ttl_ms\":3000,\"comm_timeout_ms\":4000,"
        "\"hang_timeout_ms\":6000,\"first_step_timeout_ms\":90000,\"report_window_ms\":200,\"replica_every\":2,"
        "\"replicas\":3,\"max_failures\":0,\"failure_window_ms\":1000,\"progress_timeout_ms\":0},"
        "\"backend\":\"nccl\"}");
}

static plan_rank rank_of(int rank, const char *worker, const char *host, const char *addr, int dp, int tp, int pp) {
  plan_rank r;
  memset(&r, 0, sizeof r);
  r.rank = rank;
  snprintf(r.worker, sizeof r.worker, "%s", worker);
  snprintf(r.host, sizeof r.host, "%s", host);
  snprintf(r.addr, sizeof r.addr, "%s", addr);
  r.dp = dp, r.tp = tp, r.pp = pp;
  return r;
}

static void test_plan(void) {
  newt_plan p;
  memset(&p, 0, sizeof p);
  p.generation = 7;
  for (int i = 0; i < PLAN_SECRET_BYTES; i++) p.secret[i] = (unsigned char)(i * 7 + 1);
  p.created_ms = 1700000006000ull;
  snprintf(p.cause, sizeof p.cause, "leave");
  snprintf(p.switch_mode, sizeof p.switch_mode, "boundary");
  p.dp = 2, p.tp = 1, p.pp = 1, p.zero = 1;
  p.global_batch = 10, p.micro_batch = 2, p.accum = 3;
  snprintf(p.restore, sizeof p.restore, "peer");
  p.step = 120;
  plan_rank ranks[2] = {rank_of(0, "w0", "h0", "10.0.0.1:4000", 0, 0, 0),
                        rank_of(1, "w1", "h1", "10.0.0.2:4000", 1, 0, 0)};
  plan_rank donors[1] = {rank_of(2, "w2", "h1", "10.0.0.3:4000", -1, -1, -1)};
  char spares[2][PLAN_ID_MAX] = {"w5", "w6"};
  p.nranks = 2, p.ranks = ranks;
  p.ndonors = 1, p.donors = donors;
  p.nspares = 2, p.spares = spares;
  snprintf(p.spare_why, sizeof p.spare_why, "dp_max is 2");
  check("plan, donors and spares", &plan_codec, &p,
        "{\"generation\":7,\"secret\":\"01080f161d242b323940474e555c636a71787f868d949ba2a9b0b7bec5ccd3da\","
        "\"created_ms\":1700000006000,\"cause\":\"leave\",\"switch\":\"boundary\",\"dp\":2,\"tp\":1,\"pp\":1,"
        "\"zero\":1,\"global_batch\":10,\"micro_batch\":2,\"accum\":3,\"restore\":\"peer\",\"step\":120,"
        "\"ranks\":[{\"rank\":0,\"worker\":\"w0\",\"host\":\"h0\",\"addr\":\"10.0.0.1:4000\",\"dp\":0,\"tp\":0,"
        "\"pp\":0},{\"rank\":1,\"worker\":\"w1\",\"host\":\"h1\",\"addr\":\"10.0.0.2:4000\",\"dp\":1,\"tp\":0,"
        "\"pp\":0}],\"spares\":[\"w5\",\"w6\"],\"spare_why\":\"dp_max is 2\",\"donors\":[{\"rank\":2,"
        "\"worker\":\"w2\",\"host\":\"h1\",\"addr\":\"10.0.0.3:4000\"}]}");
  p.ndonors = 0, p.nspares = 0;
  memset(p.spare_why, 0, sizeof p.spare_why);
  memset(p.switch_mode, 0, sizeof p.switch_mode);
  snprintf(p.switch_mode, sizeof p.switch_mode, "abort");
  check("plan, no donors or spares", &plan_codec, &p,
        "{\"generation\":7,\"secret\":\"01080f161d242b323940474e555c636a71787f868d949ba2a9b0b7bec5ccd3da\","
        "\"created_ms\":1700000006000,\"cause\":\"leave\",\"switch\":\"abort\",\"dp\":2,\"tp\":1,\"pp\":1,"
        "\"zero\":1,\"global_batch\":10,\"micro_batch\":2,\"accum\":3,\"restore\":\"peer\",\"step\":120,"
        "\"ranks\":[{\"rank\":0,\"worker\":\"w0\",\"host\":\"h0\",\"addr\":\"10.0.0.1:4000\",\"dp\":0,\"tp\":0,"
        "\"pp\":0},{\"rank\":1,\"worker\":\"w1\",\"host\":\"h1\",\"addr\":\"10.0.0.2:4000\",\"dp\":1,\"tp\":0,"
        "\"pp\":0}],\"spares\":[],\"donors\":[]}");
}

static void test_registration(void) {
  job_worker w;
  memset(&w, 0, sizeof w);
  snprintf(w.id, sizeof w.id, "w1");
  snprintf(w.host, sizeof w.host, "node-7");
  snprintf(w.domain, sizeof w.domain, "zone-a/rack-3");
  snprintf(w.addr, sizeof w.addr, "10.0.0.7:4000");
  w.device = 1;
  w.shares_device = 1;
  snprintf(w.state, sizeof w.state, "training");
  w.pid = 4242;
  w.generation = 3;
  snprintf(w.ack, sizeof w.ack, "{\"rank\":1,\"t_plan\":10,\"t_comm\":20,\"t_restore\":30,\"t_step\":40,"
                                "\"restore\":\"memory\",\"restore_step\":99}");
  check("registration, domain and ack", &worker_codec, &w,
        "{\"id\":\"w1\",\"host\":\"node-7\",\"addr\":\"10.0.0.7:4000\",\"device\":1,\"state\":\"training\","
        "\"pid\":4242,\"generation\":3,\"shares_device\":true,\"domain\":\"zone-a/rack-3\",\"ack\":{\"rank\":1,"
        "\"t_plan\":10,\"t_comm\":20,\"t_restore\":30,\"t_step\":40,\"restore\":\"memory\",\"restore_step\":99}}");
  memset(w.domain, 0, sizeof w.domain);
  snprintf(w.domain, sizeof w.domain, "node-7"); /* the host's: not written, read back as the host */
  w.shares_device = 0;
  memset(w.ack, 0, sizeof w.ack);
  w.device = -1;
  memset(w.addr, 0, sizeof w.addr);
  memset(w.state, 0, sizeof w.state);
  snprintf(w.state, sizeof w.state, "joining");
  w.generation = 0;
  check("registration, no domain, no ack", &worker_codec, &w,
        "{\"id\":\"w1\",\"host\":\"node-7\",\"addr\":\"\",\"device\":-1,\"state\":\"joining\",\"pid\":4242,"
        "\"generation\":0}");
}

static void test_candidacy(void) {
  job_candidacy c;
  memset(&c, 0, sizeof c);
  snprintf(c.name, sizeof c.name, "coordinator-1");
  snprintf(c.host, sizeof c.host, "node-7");
  c.pid = 4242;
  check("candidacy", &candidacy_codec, &c, "{\"name\":\"coordinator-1\",\"host\":\"node-7\",\"pid\":4242}");
}

int main(void) {
  T_RUN(test_report_ack);
  T_RUN(test_progress_step_done);
  T_RUN(test_ckpt_failed_fault_links);
  T_RUN(test_events);
  T_RUN(test_spec);
  T_RUN(test_plan);
  T_RUN(test_registration);
  T_RUN(test_candidacy);
  return T_DONE();
}
