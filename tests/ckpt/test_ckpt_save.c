/* The saver and the commit protocol: synchronous and asynchronous saves (the snapshot is
 * what gets saved), staging reservations, one save in flight (skip or wait), a committer
 * that times out or is aborted when a rank never writes and reports it, a rank's failure
 * marker (and ckpt_save_fail, which leaves one), stale indexes of an earlier attempt,
 * pruning to `keep`, the checks the commit makes on what the ranks wrote, request errors on
 * load, and staging memory from the caller's allocator. */
#include <pthread.h>
#include <unistd.h>

#include "ckpt/internal.h"
#include "ckpt_util.h"

static char root[256];

static void subdir(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", root, name); }

static void test_sync_async(void) {
  char dir[300];
  subdir(dir, sizeof dir, "sync_async");
  T_OK(ts_save(dir, 1, 1, 0, 1 << 20));
  ckpt_saver_opts o = {.dir = dir, .rank = 0, .nranks = 1, .commit = 1, .keep = 5, .chunk_bytes = 3000};
  tstate s;
  ckpt_saver *sv = ts_begin(&o, &s, 2, 1, 0, 1);
  int started = 0;
  T_OK(ts_save_into(sv, &s, 2));
  /* training goes on and overwrites its state: the snapshot is what gets saved */
  tstate later;
  ts_make(&later, 3, 1, 0);
  for (size_t i = 0; i < s.n; i++) memcpy(s.data[i], later.data[i], s.bytes[i]);
  T_OK(ckpt_save_wait(sv, newt_deadline_in_ms(60000)));
  ckpt_save_status st;
  ckpt_saver_status(sv, &st);
  T_CHECK(st.state == CKPT_SAVE_DONE && st.step == 2 && st.last_ok_step == 2 && st.saves_ok == 1);
  T_CHECK(st.raw_bytes == ts_bytes(&s) && st.file_bytes > 0 && st.stall_ms >= 0 && st.write_ms > 0);
  size_t cap = 0;
  T_CHECK(ckpt_saver_staging(sv, &cap) != NULL && cap >= ts_bytes(&s));
  ts_load_check(dir, CKPT_LATEST, 2, 1, 0, NULL);
  ts_load_check(dir, 1, 1, 1, 0, NULL);
  T_CHECK(ckpt_latest_pointer(dir) == 2);

  /* staging reservations: the caller fills them (as a device-to-host copy would) */
  T_OK(ckpt_save_begin(sv, 3, 1, &started));
  for (size_t i = 0; i < later.n; i++) {
    void *dst = NULL;
    T_OK(ckpt_save_reserve(sv, &later.t[i], NULL, &dst));
    if (later.bytes[i]) memcpy(dst, later.data[i], later.bytes[i]);
  }
  T_OK(ts_save_end(sv, 3));
  T_OK(ckpt_save_wait(sv, newt_deadline_in_ms(60000)));
  ts_load_check(dir, CKPT_LATEST, 3, 1, 0, NULL);
  /* misuse is refused */
  T_ERR(NEWT_ERR_INVALID, ckpt_save_add(sv, &later.t[0], NULL, later.data[0]));
  T_ERR(NEWT_ERR_INVALID, ckpt_save_end(sv, NULL));
  T_OK(ckpt_save_begin(sv, 4, 0, &started));
  T_ERR(NEWT_ERR_INVALID, ckpt_save_begin(sv, 4, 0, &started));
  void *dst;
  T_ERR(NEWT_ERR_INVALID, ckpt_save_reserve(sv, &later.t[0], NULL, &dst));
  newt_slice bad;
  newt_slice_whole(&bad, &later.t[0]);
  bad.offset[0] = 1;
  T_ERR(NEWT_ERR_INVALID, ckpt_save_add(sv, &later.t[0], &bad, later.data[0]));
  T_CHECK(strstr(newt_errmsg(), "lies outside tensor \"wte\"") != NULL);
  cJSON *arr = cJSON_Parse("[1,2]");
  T_ERR(NEWT_ERR_INVALID, ckpt_save_end(sv, arr)); /* the state must be an object */
  T_CHECK(strstr(newt_errmsg(), "the training state is not a JSON object") != NULL);
  cJSON_Delete(arr);
  ckpt_saver_free(sv);
  ts_free(&s);
  ts_free(&later);
  ts_load_check(dir, CKPT_LATEST, 3, 1, 0, NULL);
}

/* A 2-rank save in which rank 1 never writes: the committer waits, and the save stays in
 * flight meanwhile. */
static void test_busy_and_timeout(void) {
  char dir[300];
  subdir(dir, sizeof dir, "busy");
  T_OK(ts_save(dir, 1, 1, 0, 1 << 20));
  ckpt_saver_opts o = {.dir = dir, .rank = 0, .nranks = 2, .commit = 1, .commit_timeout_ms = 1500,
                       .skip_if_busy = 1, .attempt = 77};
  tstate s;
  ckpt_saver *sv = ts_begin(&o, &s, 2, 1, 0, 1);
  int started = 0;
  T_OK(ts_save_into(sv, &s, 2));
  T_OK(ckpt_save_begin(sv, 3, 1, &started)); /* in flight: skipped */
  T_CHECK(!started);
  ckpt_save_status st;
  ckpt_saver_status(sv, &st);
  T_CHECK(st.state == CKPT_SAVE_RUNNING && st.saves_skipped == 1);
  newt_result_t r = ckpt_save_wait(sv, newt_deadline_in_ms(30000));
  T_CHECK_MSG(r == NEWT_ERR_TIMEOUT, "%s: %s", newt_result_name(r), newt_errmsg());
  ckpt_saver_status(sv, &st);
  T_CHECK(st.state == CKPT_SAVE_FAILED && st.result == NEWT_ERR_TIMEOUT && st.saves_failed == 1);
  T_CHECK_MSG(strstr(st.message, "rank(s) 1") != NULL, "message: %s", st.message);
  T_CHECK(st.last_ok_step == -1);
  ckpt_saver_free(sv);
  /* the failed save left step 1 the newest */
  T_CHECK(ckpt_latest_pointer(dir) == 1);
  ts_load_check(dir, CKPT_LATEST, 1, 1, 0, NULL);

  /* waiting instead of skipping, and an abort that ends the committer's wait early */
  o.skip_if_busy = 0;
  o.commit_timeout_ms = 60000;
  T_OK(ckpt_saver_init(&sv, &o));
  T_OK(ckpt_save_begin(sv, 4, 1, &started));
  T_OK(ts_save_into(sv, &s, 4));
  newt_sleep_ms(200);
  double t0 = newt_now_s();
  ckpt_saver_abort(sv);
  T_ERR(NEWT_ERR_ABORTED, ckpt_save_wait(sv, newt_deadline_in_ms(30000)));
  T_CHECK(newt_now_s() - t0 < 10);
  T_OK(ckpt_save_begin(sv, 5, 1, &started)); /* the previous one is over: begins at once */
  T_CHECK(started);
  ckpt_saver_abort(sv);
  T_OK(ts_save_into(sv, &s, 5));
  T_OK(ckpt_save_begin(sv, 6, 0, &started)); /* waits for step 5's (aborted) save */
  T_CHECK(started);
  ckpt_saver_abort(sv);
  T_ERR(NEWT_ERR_ABORTED, ts_save_into(sv, &s, 6));
  ckpt_saver_free(sv);
  ts_free(&s);
  T_CHECK(ckpt_latest_pointer(dir) == 1);
}

/* Rank 0 of 2 commits step `step` of attempt `attempt` in dir: rank 1's failure marker
 * ends its wait at once (well before its 60 s) with an error holding `want`. */
static void commit_stops_at_marker(const char *dir, int64_t step, uint64_t attempt, const char *want) {
  ckpt_saver_opts o = {.dir = dir, .rank = 0, .nranks = 2, .commit = 1, .commit_timeout_ms = 60000, .attempt = attempt};
  double t0 = newt_now_s();
  tstate s;
  ckpt_saver *sv = ts_begin(&o, &s, step, 1, 0, 0);
  T_ERR(NEWT_ERR_PEER, ts_save_into(sv, &s, step));
  T_CHECK_MSG(strstr(newt_errmsg(), want) != NULL, "the commit failed with: %s", newt_errmsg());
  T_CHECK(newt_now_s() - t0 < 20);
  ckpt_saver_free(sv);
  ts_free(&s);
}

/* Rank 1's failure marker ends the committer's wait at once with its message. */
static void test_failed_marker(void) {
  char dir[300], sd[400], path[500];
  subdir(dir, sizeof dir, "marker");
  ckpt_step_dirname(sd, sizeof sd, dir, 7);
  T_OK(newt_fs_mkdirs(sd, 0755));
  snprintf(path, sizeof path, "%s/rank-00001.failed", sd);
  const char *marker = "0000000000000063\nwrite rank-00001: No space left on device\n";
  T_OK(newt_fs_write_atomic(path, marker, strlen(marker)));
  commit_stops_at_marker(dir, 7, 0x63, "rank 1 could not write its shard: write rank-00001: No space");
}

/* ckpt_save_fail: a rank that could not gather its slices (a device-to-host copy failed)
 * ends its save without writing what it staged; its marker ends the committer's wait with
 * its reason, and the rank's next save goes through. */
static void test_save_fail(void) {
  char dir[300];
  subdir(dir, sizeof dir, "fail");
  ckpt_saver_opts o1 = {.dir = dir, .rank = 1, .nranks = 2, .attempt = 0x64};
  ckpt_saver *sv = NULL;
  T_OK(ckpt_saver_init(&sv, &o1));
  int started = 0;
  T_OK(ckpt_save_begin(sv, 9, 1, &started));
  T_CHECK(started == 1);
  newt_tensor_desc t = {.name = "w", .dtype = NEWT_F32, .ndim = 1, .shape = {16}};
  void *dst = NULL;
  T_OK(ckpt_save_reserve(sv, &t, NULL, &dst));
  T_ERR(NEWT_ERR_CUDA, ckpt_save_fail(sv, NEWT_ERR_CUDA, "cudaMemcpyAsync: an illegal memory access"));
  T_CHECK(strstr(newt_errmsg(), "illegal memory access") != NULL);
  ckpt_save_status st;
  ckpt_saver_status(sv, &st);
  T_CHECK(st.state == CKPT_SAVE_FAILED && st.step == 9 && st.result == NEWT_ERR_CUDA && st.saves_failed == 1);
  T_CHECK(strstr(st.message, "illegal memory access") != NULL);
  T_ERR(NEWT_ERR_INVALID, ckpt_save_end(sv, NULL)); /* the save is over */
  /* the committer of step 9 stops waiting at once, naming rank 1's reason */
  commit_stops_at_marker(dir, 9, 0x64, "rank 1 could not write its shard: cudaMemcpyAsync");
  /* nothing of step 9 was written by rank 1, and its next save works */
  char shard[500];
  snprintf(shard, sizeof shard, "%s/step-0000000009/rank-00001.index", dir);
  T_CHECK(!newt_fs_exists(shard));
  float w[16] = {1, 2, 3};
  T_OK(ckpt_save_begin(sv, 10, 1, &started));
  T_OK(ckpt_save_add(sv, &t, NULL, w));
  T_OK(ckpt_save_end(sv, NULL));
  ckpt_saver_abort(sv); /* no committer for step 10: its index is all this rank writes */
  ckpt_saver_free(sv);
}

static newt_result_t save_rank(const char *dir, int rank, int nranks, uint64_t attempt, int64_t step,
                               const tstate *s, int which) {
  ckpt_saver_opts o = {.dir = dir, .rank = rank, .nranks = nranks, .commit = rank == 0, .attempt = attempt,
                       .commit_timeout_ms = 20000, .keep = 3};
  ckpt_saver *sv;
  NEWT_CHECK(ckpt_saver_init(&sv, &o));
  int started;
  newt_result_t r = ckpt_save_begin(sv, step, 0, &started);
  /* which = 0: the first half of every tensor, 1: the rest, 2: all, 3: nothing */
  for (size_t i = 0; r == NEWT_OK && i < s->n; i++) {
    if (!s->bytes[i] || which == 3) continue;
    newt_slice sl;
    newt_slice_whole(&sl, &s->t[i]);
    int64_t half = sl.end / 2;
    if (which == 2) {
    } else if (which == 0) {
      sl.end = half;
    } else {
      sl.begin = half;
    }
    size_t es = newt_dtype_size(s->t[i].dtype);
    r = ckpt_save_add(sv, &s->t[i], &sl, (const uint8_t *)s->data[i] + (size_t)sl.begin * es);
  }
  if (r == NEWT_OK) r = ts_save_end(sv, step);
  ckpt_saver_free(sv);
  return r;
}

typedef struct rank_arg {
  const char *dir;
  int rank;
  uint64_t attempt;
  int64_t step;
  const tstate *s;
  newt_result_t r;
  char msg[512];
} rank_arg;

static void *rank_thread(void *p) {
  rank_arg *a = p;
  a->r = save_rank(a->dir, a->rank, 2, a->attempt, a->step, a->s, a->rank);
  snprintf(a->msg, sizeof a->msg, "%s", newt_errmsg());
  return NULL;
}

/* A killed run left rank 1's index of an earlier attempt in the step directory: the
 * committer of the new attempt waits for the new one and never mixes them. */
static void test_stale_attempt(void) {
  char dir[300];
  subdir(dir, sizeof dir, "stale");
  tstate old, cur;
  ts_make(&old, 100, 1, 0);
  ts_make(&cur, 8, 1, 0);
  /* attempt 1: only rank 1 got its shard and index out */
  T_OK(save_rank(dir, 1, 2, 1, 8, &old, 1));
  rank_arg a0 = {dir, 0, 2, 8, &cur}, a1 = {dir, 1, 2, 8, &cur};
  pthread_t t0, t1;
  pthread_create(&t0, NULL, rank_thread, &a0);
  newt_sleep_ms(300); /* the committer sees only the stale index for a while */
  pthread_create(&t1, NULL, rank_thread, &a1);
  pthread_join(t0, NULL);
  pthread_join(t1, NULL);
  T_CHECK_MSG(a0.r == NEWT_OK, "%s", a0.msg);
  T_CHECK_MSG(a1.r == NEWT_OK, "%s", a1.msg);
  ts_load_check(dir, CKPT_LATEST, 8, 1, 0, NULL);
  /* the stale shard of attempt 1 is gone */
  char stale[512];
  ckpt_step_dirname(stale, sizeof stale, dir, 8);
  strncat(stale, "/rank-00001-0000000000000001.shard", sizeof stale - strlen(stale) - 1);
  T_CHECK(!newt_fs_exists(stale));
  ts_free(&old);
  ts_free(&cur);
}

/* The commit refuses what the ranks wrote when it does not cover every tensor exactly once. */
static void test_commit_checks(void) {
  char dir[300];
  subdir(dir, sizeof dir, "checks");
  tstate s;
  ts_make(&s, 9, 1, 0);
  /* rank 1 never stores its half: a gap */
  T_OK(save_rank(dir, 1, 2, 5, 9, &s, 3));
  T_ERR(NEWT_ERR_INVALID, save_rank(dir, 0, 2, 5, 9, &s, 0));
  T_CHECK_MSG(strstr(newt_errmsg(), "in no chunk") != NULL, "%s", newt_errmsg());
  /* both store everything: an overlap */
  T_OK(save_rank(dir, 1, 2, 6, 9, &s, 2));
  T_ERR(NEWT_ERR_INVALID, save_rank(dir, 0, 2, 6, 9, &s, 2));
  T_CHECK_MSG(strstr(newt_errmsg(), "both hold element") != NULL, "%s", newt_errmsg());
  /* the ranks disagree on a tensor's shape */
  tstate other;
  ts_make(&other, 9, 2, 0);
  T_OK(save_rank(dir, 1, 2, 7, 9, &other, 1));
  T_ERR(NEWT_ERR_INVALID, save_rank(dir, 0, 2, 7, 9, &s, 0));
  T_CHECK_MSG(strstr(newt_errmsg(), "tensor \"adam.m/wte\" is f32 (97,16) in one place, f32 (194,16) in another") != NULL, "%s",
              newt_errmsg());
  T_CHECK(ckpt_latest_pointer(dir) == -1);
  /* a plain 2-rank save works */
  T_OK(save_rank(dir, 1, 2, 8, 9, &s, 1));
  T_OK(save_rank(dir, 0, 2, 8, 9, &s, 0));
  ts_load_check(dir, CKPT_LATEST, 9, 1, 0, NULL);
  ts_free(&s);
  ts_free(&other);
}

/* The committer carries the size of the step it committed (what the worker publishes): every
 * file of it, as a listing of the directory counts them; the other rank reports none. */
static void test_step_bytes(void) {
  char dir[300];
  subdir(dir, sizeof dir, "bytes");
  tstate s;
  ts_make(&s, 6, 1, 0);
  ckpt_saver *sv[2] = {NULL, NULL};
  for (int r = 1; r >= 0; r--) { /* rank 1's index first: rank 0's sync save commits */
    ckpt_saver_opts o = {.dir = dir, .rank = r, .nranks = 2, .commit = r == 0, .attempt = 3,
                         .commit_timeout_ms = 20000};
    T_OK(ckpt_saver_init(&sv[r], &o));
    if (!sv[r]) return;
    int started;
    T_OK(ckpt_save_begin(sv[r], 6, 0, &started));
    for (size_t i = (size_t)r; i < s.n; i += 2) T_OK(ckpt_save_add(sv[r], &s.t[i], NULL, s.data[i]));
    T_OK(ts_save_end(sv[r], 6));
  }
  ckpt_save_status st0, st1;
  ckpt_saver_status(sv[0], &st0);
  ckpt_saver_status(sv[1], &st1);
  ckpt_step_info *info = NULL;
  size_t n = 0;
  T_OK(ckpt_list(dir, &info, &n));
  T_CHECK_MSG(n == 1 && info[0].committed && st0.step_bytes == info[0].disk_bytes,
              "the committer says %llu bytes, the directory holds %llu", (unsigned long long)st0.step_bytes,
              n ? (unsigned long long)info[0].disk_bytes : 0ULL);
  T_CHECK(st0.step_bytes > st0.file_bytes + st1.file_bytes); /* the shards, and the indexes and manifest */
  T_CHECK(st1.state == CKPT_SAVE_DONE && st1.step_bytes == 0);
  free(info);
  ckpt_saver_free(sv[0]);
  ckpt_saver_free(sv[1]);
  ts_free(&s);
}

static void test_prune(void) {
  char dir[300], sd[400];
  subdir(dir, sizeof dir, "prune");
  ckpt_saver_opts o = {.dir = dir, .rank = 0, .nranks = 1, .commit = 1, .keep = 2};
  ckpt_saver *sv;
  T_OK(ckpt_saver_init(&sv, &o));
  tstate s;
  ts_make(&s, 1, 1, 0);
  /* an abandoned save older than what will be committed, and one newer (a save may be
   * running there: it stays) */
  ckpt_step_dirname(sd, sizeof sd, dir, 2);
  T_OK(newt_fs_mkdirs(sd, 0755));
  ckpt_step_dirname(sd, sizeof sd, dir, 99);
  T_OK(newt_fs_mkdirs(sd, 0755));
  for (int64_t step = 1; step <= 5; step += (step == 1 ? 2 : 1)) {
    int started;
    T_OK(ckpt_save_begin(sv, step, step % 2, &started));
    T_OK(ts_save_into(sv, &s, step));
    T_OK(ckpt_save_wait(sv, newt_deadline_in_ms(60000)));
  }
  ckpt_saver_free(sv);
  ts_free(&s);
  ckpt_step_info *info;
  size_t n;
  T_OK(ckpt_list(dir, &info, &n));
  T_CHECK_MSG(n == 3, "%zu steps left", n);
  if (n == 3) {
    T_CHECK(info[0].step == 4 && info[0].committed && info[0].valid && !info[0].latest);
    T_CHECK(info[1].step == 5 && info[1].committed && info[1].latest && info[1].ntensors == 8);
    T_CHECK(info[1].raw_bytes > 0 && info[1].file_bytes > 0 && info[1].disk_bytes >= info[1].file_bytes);
    T_CHECK(info[2].step == 99 && !info[2].committed);
  }
  free(info);
}

static void test_request_errors(void) {
  char dir[300];
  subdir(dir, sizeof dir, "requests");
  T_OK(ts_save(dir, 1, 1, 0, 1 << 20));
  T_OK(ts_save(dir, 2, 1, 0, 1 << 20));
  ckpt_reader *r;
  T_OK(ckpt_open(&r, dir, CKPT_LATEST, 2));
  T_CHECK(ckpt_reader_step(r) == 2 && ckpt_reader_ntensors(r) == 8);
  newt_tensor_desc d;
  T_OK(ckpt_reader_find(r, "adam.v/wte", &d));
  T_CHECK(d.dtype == NEWT_F32 && d.ndim == 2 && d.shape[0] == 97 && d.shape[1] == 16);
  T_OK(ckpt_reader_find(r, "empty", &d));
  T_CHECK(d.shape[0] == 0);
  T_ERR(NEWT_ERR_NOTFOUND, ckpt_reader_find(r, "nope", &d));
  T_CHECK(cJSON_GetObjectItem(ckpt_reader_state(r), "lr_step")->valuedouble == 2);
  float buf[97 * 16];
  newt_tensor_desc q = {.name = "wte", .dtype = NEWT_BF16, .ndim = 2, .shape = {97, 16}};
  T_ERR(NEWT_ERR_INVALID, ckpt_read_slice(r, &q, NULL, buf));
  T_CHECK(strstr(newt_errmsg(), "tensor \"wte\" is f32 (97,16) in the checkpoint, requested as bf16 (97,16)") != NULL);
  q.dtype = NEWT_F32;
  q.shape[0] = 96;
  T_ERR(NEWT_ERR_INVALID, ckpt_read_slice(r, &q, NULL, buf));
  q.shape[0] = 97;
  q.name = "wtf";
  T_ERR(NEWT_ERR_NOTFOUND, ckpt_read_slice(r, &q, NULL, buf));
  q.name = "wte";
  /* a slice: rows 10..19, columns 3..8, from element 4 of that box on */
  newt_slice sl;
  newt_slice_box(&sl, 2, (int64_t[]){10, 3}, (int64_t[]){10, 6});
  sl.begin = 4;
  T_OK(ckpt_read_slice(r, &q, &sl, buf));
  tstate s;
  ts_make(&s, 2, 1, 0);
  const float *w = s.data[0];
  for (int64_t k = 4; k < 60; k++) T_CHECK(buf[k - 4] == w[(10 + k / 6) * 16 + 3 + k % 6]);
  ts_free(&s);
  sl.end = 61;
  T_ERR(NEWT_ERR_INVALID, ckpt_read_slice(r, &q, &sl, buf));
  ckpt_close(r);
  /* ckpt_load gives a request that does not fit to the caller instead of falling back */
  ckpt_request req = {.t = q, .out = buf};
  req.t.name = "nope";
  newt_slice_whole(&req.slice, &q);
  ckpt_loaded ld;
  T_ERR(NEWT_ERR_NOTFOUND, ckpt_load(dir, CKPT_LATEST, 1, &req, 1, &ld));
  T_CHECK(strstr(newt_errmsg(), "step-0000000002") != NULL);
  T_ERR(NEWT_ERR_NOTFOUND, ckpt_open(&r, dir, 3, 1));
  T_CHECK(strstr(newt_errmsg(), "no MANIFEST") != NULL);
  char empty[300];
  subdir(empty, sizeof empty, "nothing-here");
  T_ERR(NEWT_ERR_NOTFOUND, ckpt_load(empty, CKPT_LATEST, 1, &req, 1, &ld));
  T_ERR(NEWT_ERR_NOTFOUND, ckpt_open(&r, empty, CKPT_LATEST, 1));
}

/* The caller's staging allocator (ckpt_saver_opts.staging_alloc), as a pinned-memory pool
 * would be: blocks aligned to CKPT_STAGING_ALIGN but not to a page (the shard's O_DIRECT
 * writes never come from staging), filled with garbage (the saver may not count on zeroed
 * memory), each one counted and every one given back. */
#define TA_MAX 64
typedef struct talloc {
  void *live[TA_MAX]; /* handed out, not yet freed */
  int nlive, allocs, frees, misalign, refuse;
} talloc;

static void *ta_alloc(void *ctx, size_t bytes) {
  talloc *a = ctx;
  uint8_t *p = NULL;
  if (a->refuse || a->nlive == TA_MAX || posix_memalign((void **)&p, 4096, bytes + 4096) != 0) return NULL;
  memset(p, 0xA5, bytes + 4096);
  uint8_t *q = p + (a->misalign ? 8 : CKPT_STAGING_ALIGN); /* on purpose not page-aligned */
  a->live[a->nlive++] = q;
  a->allocs++;
  return q;
}

static void ta_free(void *ctx, void *q) {
  talloc *a = ctx;
  int k = 0;
  while (k < a->nlive && a->live[k] != q) k++;
  T_CHECK_MSG(k < a->nlive, "staging_free(%p): not a block staging_alloc gave", q);
  if (k == a->nlive) return;
  a->live[k] = a->live[--a->nlive];
  a->frees++;
  uint8_t *p = (uint8_t *)q - (a->misalign ? 8 : CKPT_STAGING_ALIGN);
  free(p);
}

static void test_staging_allocator(void) {
  char dir[300];
  subdir(dir, sizeof dir, "staging_alloc");
  talloc a = {0};
  ckpt_saver_opts o = {.dir = dir, .rank = 0, .nranks = 1, .commit = 1, .keep = 5, .chunk_bytes = 3000,
                       .staging_bytes = 1000, /* too small: the first save grows it */
                       .staging_alloc = ta_alloc, .staging_free = ta_free, .staging_ctx = &a};
  tstate s;
  ckpt_saver *sv = ts_begin(&o, &s, 2, 1, 0, 1);
  T_CHECK(a.allocs == 1); /* staging_bytes, up front */
  T_OK(ts_save_into(sv, &s, 2)); /* snapshot copies into the caller's blocks */
  T_CHECK(a.allocs >= 2 && a.nlive == a.allocs);
  size_t cap = 0;
  T_CHECK(ckpt_saver_staging(sv, &cap) == a.live[0] && cap == 1000);
  for (size_t i = 0; i < s.n; i++) memset(s.data[i], 0x5A, s.bytes[i]); /* training goes on */
  T_OK(ckpt_save_wait(sv, newt_deadline_in_ms(60000)));
  ts_load_check(dir, CKPT_LATEST, 2, 1, 0, NULL);

  /* reservations filled by the caller, in the same blocks: warm, nothing more is allocated */
  int warm = a.allocs;
  tstate later;
  ts_make(&later, 3, 1, 0);
  int started = 0;
  T_OK(ckpt_save_begin(sv, 3, 1, &started));
  for (size_t i = 0; i < later.n; i++) {
    void *dst = NULL;
    T_OK(ckpt_save_reserve(sv, &later.t[i], NULL, &dst));
    T_CHECK(!later.bytes[i] || (uintptr_t)dst % CKPT_STAGING_ALIGN == 0);
    if (later.bytes[i]) memcpy(dst, later.data[i], later.bytes[i]);
  }
  T_OK(ts_save_end(sv, 3));
  T_OK(ckpt_save_wait(sv, newt_deadline_in_ms(60000)));
  T_CHECK_MSG(a.allocs == warm, "a warm saver allocated %d more staging blocks", a.allocs - warm);
  ts_load_check(dir, CKPT_LATEST, 3, 1, 0, NULL);
  ckpt_saver_free(sv);
  T_CHECK_MSG(a.nlive == 0 && a.frees == a.allocs, "%d of %d staging blocks not given back to staging_free", a.nlive,
              a.allocs);
  ts_free(&s);
  ts_free(&later);

  /* an allocator that cannot or gives memory not aligned as said: the save says so */
  ckpt_saver_opts half = o;
  half.staging_free = NULL;
  T_ERR(NEWT_ERR_INVALID, ckpt_saver_init(&sv, &half));
  T_CHECK(strstr(newt_errmsg(), "staging_alloc and staging_free") != NULL);
  o.staging_bytes = 0;
  a.misalign = 1;
  T_OK(ckpt_saver_init(&sv, &o));
  ts_make(&s, 4, 1, 0);
  T_OK(ckpt_save_begin(sv, 4, 1, &started));
  T_ERR(NEWT_ERR_INVALID, ckpt_save_add(sv, &s.t[0], NULL, s.data[0]));
  T_CHECK(strstr(newt_errmsg(), "not aligned to 64 bytes") != NULL);
  a.misalign = 0;
  a.refuse = 1;
  T_ERR(NEWT_ERR_NOMEM, ckpt_save_add(sv, &s.t[0], NULL, s.data[0]));
  T_CHECK(strstr(newt_errmsg(), "staging_alloc") != NULL);
  ckpt_saver_free(sv);
  T_CHECK(a.nlive == 0 && a.frees == a.allocs);
  ts_free(&s);
  ts_load_check(dir, CKPT_LATEST, 3, 1, 0, NULL);
}

/* staging_hint: the first save's staging is one block of the size the caller says a save
 * takes (not 1 MiB, growing by doubling): the saves that follow allocate nothing. */
static void test_staging_hint(void) {
  char dir[300];
  subdir(dir, sizeof dir, "staging_hint");
  tstate s;
  ts_make(&s, 2, 3, 0);
  size_t need = 0;
  for (size_t i = 0; i < s.n; i++)
    need += (s.bytes[i] + CKPT_STAGING_ALIGN - 1) / CKPT_STAGING_ALIGN * CKPT_STAGING_ALIGN;
  talloc a = {0};
  ckpt_saver_opts o = {.dir = dir, .rank = 0, .nranks = 1, .commit = 1, .keep = 5, .staging_hint = need,
                       .staging_alloc = ta_alloc, .staging_free = ta_free, .staging_ctx = &a};
  ckpt_saver *sv = NULL;
  T_OK(ckpt_saver_init(&sv, &o));
  T_CHECK(a.allocs == 0); /* on first use, not up front */
  for (int64_t step = 2; step <= 3; step++) {
    int started = 0;
    T_OK(ckpt_save_begin(sv, step, 1, &started));
    T_OK(ts_save_into(sv, &s, step));
    T_OK(ckpt_save_wait(sv, newt_deadline_in_ms(60000)));
  }
  size_t cap = 0;
  T_CHECK_MSG(a.allocs == 1 && ckpt_saver_staging(sv, &cap) && cap == need,
              "%d staging blocks, the first of %zu bytes; want one of %zu", a.allocs, cap, need);
  ckpt_saver_free(sv);
  T_CHECK(a.nlive == 0 && a.frees == a.allocs);
  ts_free(&s);
}

int main(void) {
  ts_tmpdir(root, sizeof root, "/tmp", "ckpt-save");
  T_RUN(test_sync_async);
  T_RUN(test_busy_and_timeout);
  T_RUN(test_failed_marker);
  T_RUN(test_save_fail);
  T_RUN(test_stale_attempt);
  T_RUN(test_commit_checks);
  T_RUN(test_step_bytes);
  T_RUN(test_prune);
  T_RUN(test_request_errors);
  T_RUN(test_staging_allocator);
  T_RUN(test_staging_hint);
  newt_fs_rm_rf(root);
  return T_DONE();
}
