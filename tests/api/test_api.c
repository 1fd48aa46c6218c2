/* libnewt under misuse, through the public library alone (include/newt.h, libnewt.so): every
 * misuse returns NEWT_ERR_INVALID with a message naming what is wrong, and corrupts nothing --
 * the worker that made it goes on training, its state restores right, the job finishes.
 *
 * It includes only newt.h and libc, links only newt_shared, and runs real jobs: a private etcd
 * (the etcd binary, $NEWT_ETCD_BIN or etcd on PATH) on free loopback ports, one
 * `$NEWT_BIN coordinator` per job, and workers that are forks of this test calling the API. The
 * program they run: a replicated tensor "x" (NX floats) updated from the step's samples (each
 * rank sums g(k, i) over its samples, newt_allreduce sums over the data-parallel group, then
 * x = fmod(3 x + G + 1, 65521): integers, exact in float, so any world size gives the same
 * bits), a tensor "shard" (NS floats) cut into one contiguous part per rank (each rank adds the
 * step's number to its part), and per-job bytes "meta" (the steps done). expect() computes
 * the state after any step independently; every restore and every end is checked against it.
 *
 *   job api-main: workers A, B and C (the first plan waits for all three). In its first
 *     generation each makes the declaration misuses (a tensor declared twice, a "newt." name, a
 *     buffer of the wrong size, shapes, offsets, extents and byte lengths whose products or sums
 *     overflow 64 bits, size fields of 0, NULL arguments, restore and steps before the
 *     state is declared) and, running, the step misuses (declare after restore, commit or end
 *     out of order, a step begun twice -- then committed and ended, training on). B joins with
 *     an older newt_join_opts and takes its batches in an older newt_batch (the library writes
 *     only `size` bytes: a canary after them stays); a newt_tensor of a newer header that
 *     sets a field this library does not know is refused by its offset, newt_step_results of
 *     a newer header with zeros there are taken. C kills itself (SIGKILL) as step DIE_AT
 *     begins: a collective fails on A and B (that step's, or the copy of C's part that ends the
 *     step before), they begin again and take the next generation, in which their groups of
 *     the one before are refused naming both generations, and the pair leaves a gap in "shard"
 *     (rank 0 declares [0,4) of its [0,6)): both restores fail naming it, rank 0 declares [4,6)
 *     too, and the restore gives the state of the last step they applied (C's part from its
 *     copy on a peer), or of the one before when C died before its copy was whole. B asks to
 *     leave after step LEAVE_AT: NEXT_LEFT, calls after its part is over fail, newt_finish says
 *     3. A takes the next generation alone (stale groups refused again, the state of B's last
 *     step restored), trains to NEXT_DONE at the expected state, calls after that fail,
 *     newt_finish says 0.
 *   job api-overlap, at the same time: workers P and Q declare parts of "shard" that overlap
 *     partially ([0,7) and [5,12)): both restores fail naming it, and each ends with
 *     newt_finish of that error (status 2: another try will not mend it). Then worker R joins
 *     the same job and trains it to the end, to the expected values: the failed generation
 *     left nothing behind.
 *   job api-cut, at the same time: workers K, L and N, each holding all of "shard"; N kills
 *     itself as step DIE_AT begins,
 *     and in the next generation L kills itself right after its restore filled its parts and
 *     before the restore's own check (NEWT_CHAOS_DIE=restored:2), which K's side of that
 *     check then finds cut. K's restore must say it is done (its buffers hold the state: the
 *     next begin recovers), not failed: K, like a program that takes the buffers of a failed
 *     restore for empty, writes over them when it fails, and the next generation's restore,
 *     which reads them, would give it garbage (the built-in trainer freed them, and the job
 *     ended on "replicas disagree"). K trains to the end at the expected state.
 *   a worker Z without a job: NULL handles and arguments, newt_join without a job (naming
 *     NEWT_JOB), with a size field of 0, with a bad job name.
 *
 * Waits are for events (a log line, a child's exit) with generous deadlines. Prints one line
 * per case and "N passed, N failed"; exits non-zero on any failure (the directory with every
 * process's log is then kept and named; NEWT_KEEP_LOGS=1 keeps it in any case). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "newt.h"

#define NX 8           /* elements of the replicated tensor "x" */
#define NS 12          /* elements of the sharded tensor "shard" */
#define GB 6           /* the global batch (micro-batches of 1: dp 1, 2, 3 or 6) */
#define MAIN_STEPS 10  /* api-main's steps */
#define DIE_AT 3       /* C kills itself (SIGKILL) as this step begins */
#define LEAVE_AT 6     /* B asks to leave after this step */
#define OV_STEPS 4     /* api-overlap's steps */
#define CUT_STEPS 8    /* api-cut's steps */
#define DEADLINE_S 120 /* the whole test, generously (it takes seconds) */

/* --- the cases, counted in memory every process of the test shares ------------------------- */

enum {
  C_NULL_ARGS,
  C_SIZE_ZERO,
  C_JOIN_NO_JOB,
  C_NEWT_NAME,
  C_TWICE,
  C_BYTES,
  C_OVERFLOW,       /* sizes whose product or sum overflows 64 bits (issue 37, item 7) */
  C_GAP,
  C_OVERLAP,
  C_ORDER,          /* restore, begin and commit before the state is restored */
  C_DECL_RUNNING,   /* state declared after the restore */
  C_COMMIT_NO_BEGIN,
  C_BEGUN_TWICE,
  C_STALE,
  C_AFTER_DONE,
  C_AFTER_LEFT,
  C_ABI,
  C_TRAINS,         /* api-main: every restore and end at the expected state */
  C_GOES_ON,        /* api-overlap: the job finishes after the failed generation */
  C_CUT,            /* api-cut: a restore whose own check a peer's death cut is done, not failed */
  C_PROCESSES,      /* every process ended as it should */
  NCASES
};
static const char *const case_names[NCASES] = {
    "null_args",         "size_zero",       "join_without_job", "newt_name",        "tensor_declared_twice",
    "wrong_buffer_size", "sizes_overflow", "parts_leave_gap", "parts_overlap",    "calls_before_restore", "state_after_restore",
    "commit_without_begin", "step_begun_twice", "stale_generation", "after_done",   "after_left",
    "abi_older_structs", "main_job_trains_right", "job_goes_on_after_overlap", "restore_cut_after_filling",
    "processes_exit_right"};

typedef struct shared {
  atomic_int ran[NCASES], failed[NCASES];
  atomic_ullong gap_gen; /* the generation of api-main in which the gap is made (0: not yet) */
} shared;
static shared *sh;
static int report_fd = 2; /* where failures are said (a worker's own stderr goes to its log) */
static const char *me = "test";

static void check_at(int cs, int ok, int line, const char *fmt, ...) {
  atomic_fetch_add(&sh->ran[cs], 1);
  if (ok) return;
  atomic_fetch_add(&sh->failed[cs], 1);
  char buf[4096];
  int n = snprintf(buf, sizeof buf, "FAIL %s [%s] (test_api.c:%d): ", case_names[cs], me, line);
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(buf + n, sizeof buf - (size_t)n - 2, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
  buf[n++] = '\n';
  ssize_t w = write(report_fd, buf, (size_t)n);
  (void)w;
}
#define CHECK(cs, cond, ...) check_at(cs, !!(cond), __LINE__, __VA_ARGS__)

/* A call must return `want` (NEWT_ERR_*) with a message holding every string of subs. */
static int expect_err_at(int cs, int line, const char *call, newt_result_t got, newt_result_t want,
                         const char *const *subs) {
  const char *msg = newt_errmsg();
  const char *missing = NULL;
  for (int i = 0; subs[i] && !missing; i++)
    if (!strstr(msg, subs[i])) missing = subs[i];
  check_at(cs, got == want && !missing, line, "%s -> %s (want %s), message \"%s\"%s%s%s", call, newt_result_name(got),
           newt_result_name(want), msg, missing ? ", which does not say \"" : "", missing ? missing : "",
           missing ? "\"" : "");
  return got == want;
}
#define EXPECT_ERR(cs, want, call, ...)                                          \
  do {                                                                           \
    newt_result_t r_ = (call);                                                   \
    const char *const s_[] = {__VA_ARGS__, NULL};                                \
    expect_err_at(cs, __LINE__, #call, r_, want, s_);                            \
  } while (0)
#define EXPECT_OK(cs, call)                                                                          \
  do {                                                                                               \
    newt_result_t r_ = (call);                                                                       \
    check_at(cs, r_ == NEWT_OK, __LINE__, "%s -> %s: %s", #call, newt_result_name(r_), newt_errmsg()); \
  } while (0)

/* --- the program's arithmetic ----------------------------------------------------------------- */

static float g(int64_t k, int i) { return (float)((k * 7 + i * 3) % 11); }

/* x and "shard" after `steps` steps of the job, computed without newt. */
static void expect(int64_t steps, float x[NX], float shard[NS]) {
  for (int i = 0; i < NX; i++) x[i] = (float)(i + 1);
  for (int64_t s = 1; s <= steps; s++)
    for (int i = 0; i < NX; i++) {
      float G = 0;
      for (int64_t k = (s - 1) * GB; k < s * GB; k++) G += g(k, i);
      x[i] = fmodf(3 * x[i] + G + 1, 65521);
    }
  for (int j = 0; j < NS; j++) shard[j] = (float)(100 + j) + (float)(steps * (steps + 1) / 2);
}

/* --- a worker -------------------------------------------------------------------------------- */

typedef struct role {
  const char *id, *job;
  int64_t steps;    /* the job's */
  int leave_at;     /* newt_leave after this step (0: never) */
  int overlap;      /* declare the partially overlapping parts, and end there */
  int old_structs;  /* join and take batches with the structs of an older header */
  int want_exit;    /* newt_finish's status */
  int die_at;       /* SIGKILL itself as this step begins (0: never) */
  int die_restored; /* SIGKILL itself right after its restore of this generation filled its parts,
                       before the restore's own check (NEWT_CHAOS_DIE; 0: never) */
  int scribble;     /* a restore that fails leaves the buffers declared for it to the program,
                       which writes over them (as a program that takes them for empty may) */
} role;

/* The case a job's training is checked under. */
static int case_of(const role *ro) {
  return strcmp(ro->job, "api-main") == 0 ? C_TRAINS : strcmp(ro->job, "api-cut") == 0 ? C_CUT : C_GOES_ON;
}

typedef struct prog {
  const role *ro;
  newt_ctx *c;
  float x[NX];
  float shard[2][NS]; /* indexed by element; generation k's part lives in shard[k % 2] */
  int cur;
  int64_t meta;       /* the per-job bytes: steps done */
  int lo, hi;         /* this rank's part of "shard" */
  newt_layout l;
  int gens;
  int64_t done;       /* the newest step this rank applied (or restored to) */
  newt_comm *old_world, *old_dp; /* the groups of the generation before */
  uint64_t old_gen;
  int idle_misuse, step_misuse;
  int failed_steps; /* steps whose collectives failed (a peer died) */
  int failed_since_restore;
} prog;

static void tensor(newt_tensor *t, const char *name, float *data, int64_t n, const int64_t *shape, int64_t begin,
                   int64_t end) {
  newt_tensor_init(t);
  t->name = name;
  t->dtype = NEWT_F32;
  t->ndim = 1;
  t->shape = shape;
  t->begin = begin;
  t->end = end;
  t->data = data;
  t->bytes = (size_t)n * sizeof(float);
}

static const int64_t shape_x[1] = {NX}, shape_s[1] = {NS};

/* Declares "shard" elements [lo, hi) at their place in this generation's buffer. */
static newt_result_t declare_shard(prog *p, int lo, int hi) {
  newt_tensor t;
  tensor(&t, "shard", &p->shard[p->cur][lo], hi - lo, shape_s, lo, hi);
  return newt_state_tensor(p->c, &t);
}

/* The declaration misuses of a worker's first generation: each refused, each changing nothing
 * (the restore that follows sees exactly the right declarations). */
static void declaration_misuse(prog *p) {
  newt_tensor t;
  newt_restore_info ri = {.size = sizeof ri};
  newt_batch b = {.size = sizeof b};
  newt_next next;
  double v = 1, s = 0;
  EXPECT_ERR(C_ORDER, NEWT_ERR_INVALID, newt_state_restore(p->c, &ri), "nothing declared");
  EXPECT_ERR(C_ORDER, NEWT_ERR_INVALID, newt_step_begin(p->c, &b, &next), "not restored");
  EXPECT_ERR(C_ORDER, NEWT_ERR_INVALID, newt_step_commit(p->c, &v, &s, 1), "no step is begun");
  EXPECT_ERR(C_ORDER, NEWT_ERR_INVALID, newt_step_end(p->c, NULL), "no step is committed");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_state_tensor(p->c, NULL), "NULL");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_state_bytes(p->c, "meta", NEWT_PER_JOB, NULL, 8), "meta");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_layout_get(p->c, NULL), "NULL");

  tensor(&t, "x", p->x, NX, shape_x, 0, 0);
  EXPECT_OK(C_TWICE, newt_state_tensor(p->c, &t));
  EXPECT_ERR(C_TWICE, NEWT_ERR_INVALID, newt_state_tensor(p->c, &t), "\"x\"", "twice");
  tensor(&t, "x", p->x + 2, 3, shape_x, 2, 5); /* a part inside the first */
  EXPECT_ERR(C_TWICE, NEWT_ERR_INVALID, newt_state_tensor(p->c, &t), "\"x\"", "twice");

  static const int64_t shape_other[1] = {NX + 1};
  tensor(&t, "x", p->x, NX + 1, shape_other, 0, 0); /* the name again, another shape */
  EXPECT_ERR(C_TWICE, NEWT_ERR_INVALID, newt_state_tensor(p->c, &t), "\"x\"", "another type or shape");

  tensor(&t, "newt.x", p->x, NX, shape_x, 0, 0);
  EXPECT_ERR(C_NEWT_NAME, NEWT_ERR_INVALID, newt_state_tensor(p->c, &t), "\"newt.x\"", "newt.");
  char longname[NEWT_NAME_MAX + 2];
  memset(longname, 'n', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  tensor(&t, longname, p->x, NX, shape_x, 0, 0);
  EXPECT_ERR(C_NEWT_NAME, NEWT_ERR_INVALID, newt_state_tensor(p->c, &t), "72 bytes");
  tensor(&t, "", p->x, NX, shape_x, 0, 0);
  EXPECT_ERR(C_NEWT_NAME, NEWT_ERR_INVALID, newt_state_tensor(p->c, &t), "empty");

  tensor(&t, "wrong", p->x, NX, shape_x, 0, 0);
  t.bytes = 30; /* the part is 8 floats: 32 bytes */
  EXPECT_ERR(C_BYTES, NEWT_ERR_INVALID, newt_state_tensor(p->c, &t), "\"wrong\"", "30", "32");
  tensor(&t, "wrong", p->x, NX, shape_x, 2, 6);
  t.bytes = NX * sizeof(float); /* the part [2, 6) is 16 bytes */
  EXPECT_ERR(C_BYTES, NEWT_ERR_INVALID, newt_state_tensor(p->c, &t), "\"wrong\"", "32", "16");

  /* sizes that overflow, each refused at the call naming the field (before, a shape of
     [2^60 + 1, 16] floats passed as 64 bytes, and an offset of INT64_MAX passed) */
  static const int64_t shape_wrap[2] = {((int64_t)1 << 60) + 1, 16}, shape_big[2] = {(int64_t)1 << 61, 1};
  static const int64_t off_max[1] = {INT64_MAX}, ext_one[1] = {1}, off_two[1] = {2}, ext_max[1] = {INT64_MAX};
  tensor(&t, "wrap", p->x, NX, shape_wrap, 0, 0);
  t.ndim = 2, t.bytes = 64; /* 2^64 + 16 elements wrap to 16 */
  EXPECT_ERR(C_OVERFLOW, NEWT_ERR_INVALID, newt_state_tensor(p->c, &t), "\"wrap\"", "shape[1]", "overflow");
  tensor(&t, "wrap", p->x, NX, shape_big, 0, 0);
  t.ndim = 2, t.bytes = (size_t)1 << 63; /* 2^61 floats: 2^63 bytes */
  EXPECT_ERR(C_OVERFLOW, NEWT_ERR_INVALID, newt_state_tensor(p->c, &t), "\"wrap\"", "shape[0]", "overflow");
  tensor(&t, "wrap", p->x, 1, shape_x, 0, 0);
  t.offset = off_max, t.extent = ext_one; /* INT64_MAX + 1 wraps below the shape */
  EXPECT_ERR(C_OVERFLOW, NEWT_ERR_INVALID, newt_state_tensor(p->c, &t), "\"wrap\"", "offset[0]");
  t.offset = off_two, t.extent = ext_max;
  EXPECT_ERR(C_OVERFLOW, NEWT_ERR_INVALID, newt_state_tensor(p->c, &t), "\"wrap\"", "extent[0]");
  EXPECT_ERR(C_OVERFLOW, NEWT_ERR_INVALID, newt_state_bytes(p->c, "huge", NEWT_PER_JOB, &p->meta, ((size_t)1 << 63) + 16),
             "\"huge\"", "len");

  tensor(&t, "zero", p->x, NX, shape_x, 0, 0);
  t.size = 0;
  EXPECT_ERR(C_SIZE_ZERO, NEWT_ERR_INVALID, newt_state_tensor(p->c, &t), "size");
}

/* Size fields of 0 and structs of an older header for what the library writes. */
static void layout_abi(prog *p) {
  newt_layout l = {.size = 0};
  EXPECT_ERR(C_SIZE_ZERO, NEWT_ERR_INVALID, newt_layout_get(p->c, &l), "size");
  struct {
    newt_layout l;
    uint64_t canary;
  } old;
  memset(&old, 0x5a, sizeof old);
  old.l.size = offsetof(newt_layout, accum);
  EXPECT_OK(C_ABI, newt_layout_get(p->c, &old.l));
  unsigned char pat[sizeof old];
  memset(pat, 0x5a, sizeof pat);
  size_t tail = sizeof old - offsetof(newt_layout, accum);
  CHECK(C_ABI, memcmp((char *)&old + offsetof(newt_layout, accum), pat, tail) == 0,
        "newt_layout_get wrote past the %zu bytes of an older newt_layout", old.l.size);
  CHECK(C_ABI, old.l.generation == p->l.generation && old.l.rank == p->l.rank && old.l.world == p->l.world &&
                   old.l.dp == p->l.dp && old.l.dp_rank == p->l.dp_rank,
        "an older newt_layout: generation %llu rank %d world %d dp %d, the full one's %llu %d %d %d",
        (unsigned long long)old.l.generation, old.l.rank, old.l.world, old.l.dp, (unsigned long long)p->l.generation,
        p->l.rank, p->l.world, p->l.dp);

  newt_job_info ji = {.size = 0};
  EXPECT_ERR(C_SIZE_ZERO, NEWT_ERR_INVALID, newt_job_get(p->c, &ji), "size");
  struct {
    newt_job_info j;
    uint64_t canary;
  } oj;
  memset(&oj, 0x5a, sizeof oj);
  oj.j.size = offsetof(newt_job_info, zero);
  EXPECT_OK(C_ABI, newt_job_get(p->c, &oj.j));
  CHECK(C_ABI, oj.j.steps == p->ro->steps && oj.j.global_batch == GB && oj.j.micro_batch == 1 &&
                   strcmp(oj.j.job, p->ro->job) == 0 && strcmp(oj.j.worker_id, p->ro->id) == 0,
        "an older newt_job_info: job %s, worker %s, steps %lld, batch %lld", oj.j.job, oj.j.worker_id,
        (long long)oj.j.steps, (long long)oj.j.global_batch);
  size_t at = offsetof(newt_job_info, zero);
  CHECK(C_ABI, memcmp((char *)&oj + at, pat, sizeof oj - at) == 0,
        "newt_job_get wrote past the %zu bytes of an older newt_job_info", at);
}

/* The parts of "shard" of a layout: one contiguous range per rank. */
static void my_part(const newt_layout *l, int *lo, int *hi) {
  *lo = l->rank * NS / l->world;
  *hi = (l->rank + 1) * NS / l->world;
}

static int same(const float *a, const float *b, int n) { return memcmp(a, b, (size_t)n * sizeof *a) == 0; }

/* The restored state is the state of its step. */
static void check_state(prog *p, int cs, int64_t step, const char *when) {
  float ex[NX], es[NS];
  expect(step, ex, es);
  CHECK(cs, same(p->x, ex, NX), "%s: x at step %lld is %g %g ..., expected %g %g ...", when, (long long)step,
        p->x[0], p->x[1], ex[0], ex[1]);
  CHECK(cs, same(&p->shard[p->cur][p->lo], &es[p->lo], p->hi - p->lo),
        "%s: shard [%d, %d) at step %lld begins %g, expected %g", when, p->lo, p->hi, (long long)step,
        p->shard[p->cur][p->lo], es[p->lo]);
  CHECK(cs, p->meta == step, "%s: meta says %lld steps, the state is of step %lld", when, (long long)p->meta,
        (long long)step);
}

/* A new generation: the layout, the state declared (with the misuses of the first one) and
 * restored. An error ends the worker. */
static newt_result_t generation(prog *p) {
  int cs = case_of(p->ro);
  int first = ++p->gens == 1;
  p->l = (newt_layout){.size = sizeof p->l};
  newt_result_t r = newt_layout_get(p->c, &p->l);
  if (r != NEWT_OK) return r;
  if (first) layout_abi(p);
  if (p->old_world) { /* the groups of the generation before are refused, naming both */
    char was[64], is[64];
    snprintf(was, sizeof was, "generation %llu", (unsigned long long)p->old_gen);
    snprintf(is, sizeof is, "generation %llu", (unsigned long long)p->l.generation);
    float v[NX] = {0}, out[NX];
    newt_comm *split = (newt_comm *)1;
    EXPECT_ERR(C_STALE, NEWT_ERR_INVALID, newt_allreduce(p->old_world, v, out, NX, NEWT_F32, NEWT_SUM), was, is);
    EXPECT_ERR(C_STALE, NEWT_ERR_INVALID, newt_barrier(p->old_world), was, is);
    EXPECT_ERR(C_STALE, NEWT_ERR_INVALID, newt_comm_split(p->old_world, 0, 0, &split), was, is);
    CHECK(C_STALE, split == NULL, "newt_comm_split of a stale group left *out set");
    if (p->old_dp)
      EXPECT_ERR(C_STALE, NEWT_ERR_INVALID, newt_allgather(p->old_dp, v, out, 1, NEWT_F32), was, is);
    CHECK(C_STALE, newt_comm_rank(p->old_world) == -1 && newt_comm_size(p->old_world) == 0,
          "a stale group says rank %d of %d", newt_comm_rank(p->old_world), newt_comm_size(p->old_world));
  }
  p->old_world = p->l.world_comm;
  p->old_dp = p->l.dp_comm;
  p->old_gen = p->l.generation;
  p->cur = p->gens % 2;
  my_part(&p->l, &p->lo, &p->hi);
  if (cs == C_CUT) p->lo = 0, p->hi = NS; /* every rank holds it all: no part is lost with a rank */

  if (first) declaration_misuse(p); /* "x" is declared by it */
  newt_tensor t;
  if (!first) {
    tensor(&t, "x", p->x, NX, shape_x, 0, 0);
    if ((r = newt_state_tensor(p->c, &t)) != NEWT_OK) return r;
  }
  if ((r = newt_state_bytes(p->c, "meta", NEWT_PER_JOB, &p->meta, sizeof p->meta)) != NEWT_OK) return r;

  if (p->ro->overlap) { /* parts that overlap partially: [0, 7) and [5, 12) */
    CHECK(C_OVERLAP, p->l.world == 2, "the overlap needs 2 ranks, the layout has %d", p->l.world);
    if ((r = declare_shard(p, p->l.rank == 0 ? 0 : 5, p->l.rank == 0 ? 7 : NS)) != NEWT_OK) return r;
    newt_restore_info ri = {.size = sizeof ri};
    r = newt_state_restore(p->c, &ri);
    EXPECT_ERR(C_OVERLAP, NEWT_ERR_INVALID, r, "\"shard\"", "overlap");
    return r == NEWT_OK ? NEWT_ERR_INVALID : r; /* the worker ends with the error */
  }

  /* the gap: in the first generation of api-main with 2 ranks, rank 0 first declares [0, 4)
     of its [0, 6) */
  unsigned long long none = 0;
  int gap = cs == C_TRAINS && p->l.world == 2 &&
            (atomic_compare_exchange_strong(&sh->gap_gen, &none, p->l.generation) || none == p->l.generation);
  int gap_hi = p->hi - (gap && p->l.rank == 0 ? 2 : 0);
  if (first) { /* the part in a newt_tensor of an older header: the flags it lacks are not read */
    tensor(&t, "shard", &p->shard[p->cur][p->lo], gap_hi - p->lo, shape_s, p->lo, gap_hi);
    /* ... and of a newer one: a field this library does not know, set, is refused by its
       offset (it would be ignored), and declares nothing */
    struct {
      newt_tensor t;
      uint64_t later;
    } newer = {t, 1};
    newer.t.size = sizeof newer;
    EXPECT_ERR(C_ABI, NEWT_ERR_UNSUPPORTED, newt_state_tensor(p->c, &newer.t), "newer", "byte");
    t.size = offsetof(newt_tensor, flags);
    t.flags = 0xdead0000u;
    EXPECT_OK(C_ABI, newt_state_tensor(p->c, &t));
  } else if ((r = declare_shard(p, p->lo, gap_hi)) != NEWT_OK) {
    return r;
  }
  if (gap) {
    newt_restore_info ri = {.size = sizeof ri};
    EXPECT_ERR(C_GAP, NEWT_ERR_INVALID, newt_state_restore(p->c, &ri), "\"shard\"", "tile");
    if (p->l.rank == 0) EXPECT_OK(C_GAP, declare_shard(p, gap_hi, p->hi));
  }

  newt_restore_info ri;
  if (first) { /* a size of 0 is refused before anything is restored */
    ri.size = 0;
    EXPECT_ERR(C_SIZE_ZERO, NEWT_ERR_INVALID, newt_state_restore(p->c, &ri), "size");
  }
  struct {
    newt_restore_info ri;
    uint64_t canary;
  } old;
  memset(&old, 0x5a, sizeof old);
  old.ri.size = first ? offsetof(newt_restore_info, bytes_received) : sizeof old.ri;
  r = newt_state_restore(p->c, &old.ri);
  if (gap) CHECK(C_GAP, r == NEWT_OK, "the restore after the gap was filled: %s", newt_errmsg());
  if (p->ro->scribble) /* api-cut: its generation 2's peer died after the parts were filled */
    CHECK(C_CUT, r == NEWT_OK, "the restore of generation %llu failed (%s: %s) after it filled the parts",
          (unsigned long long)p->l.generation, newt_result_name(r), newt_errmsg());
  if (r != NEWT_OK) return r;
  ri = old.ri;
  if (first) {
    unsigned char pat[sizeof old];
    memset(pat, 0x5a, sizeof pat);
    size_t at = offsetof(newt_restore_info, bytes_received);
    CHECK(C_ABI, memcmp((char *)&old + at, pat, sizeof old - at) == 0,
          "newt_state_restore wrote past the %zu bytes of an older newt_restore_info", at);
  }
  if (ri.source == NEWT_FROM_NOTHING) {
    CHECK(cs, ri.step == 0 && p->done == 0, "a restore from nothing at step %lld, after step %lld", (long long)ri.step,
          (long long)p->done);
    float es[NS];
    expect(0, p->x, es);
    memcpy(&p->shard[p->cur][p->lo], &es[p->lo], (size_t)(p->hi - p->lo) * sizeof(float));
    p->meta = 0;
  } else {
    /* the state of the last step this rank applied; after a peer died, maybe the one before: the
       dead rank's part of the last step may not have reached its copy on a peer (its send
       returned, its peer had not read it), and then that step is done again */
    int64_t oldest = p->done - (p->failed_since_restore ? 1 : 0);
    CHECK(cs, ri.step >= oldest && ri.step <= p->done, "restored step %lld, this rank applied step %lld%s",
          (long long)ri.step, (long long)p->done, p->failed_since_restore ? " (or the one before, after a failure)" : "");
    char when[64];
    snprintf(when, sizeof when, "restore of generation %llu", (unsigned long long)p->l.generation);
    check_state(p, cs, ri.step, when);
  }
  p->done = ri.step;
  p->failed_since_restore = 0;
  newt_tensor_init(&t);
  tensor(&t, "late", p->x, NX, shape_x, 0, 0);
  EXPECT_ERR(C_DECL_RUNNING, NEWT_ERR_INVALID, newt_state_tensor(p->c, &t), "restored already");
  EXPECT_ERR(C_DECL_RUNNING, NEWT_ERR_INVALID, newt_state_bytes(p->c, "late", NEWT_PER_RANK, &p->meta, 8),
             "restored already");
  EXPECT_ERR(C_DECL_RUNNING, NEWT_ERR_INVALID, newt_state_restore(p->c, &ri), "restored already");
  return NEWT_OK;
}

/* Misuse between two steps of a running generation; then the step goes on as if none was made. */
static void idle_misuse(prog *p) {
  double v = 1, s = 0;
  newt_next next;
  EXPECT_ERR(C_COMMIT_NO_BEGIN, NEWT_ERR_INVALID, newt_step_commit(p->c, &v, &s, 1), "no step is begun");
  EXPECT_ERR(C_COMMIT_NO_BEGIN, NEWT_ERR_INVALID, newt_step_end(p->c, NULL), "no step is committed");
  newt_batch b = {.size = 0};
  EXPECT_ERR(C_SIZE_ZERO, NEWT_ERR_INVALID, newt_step_begin(p->c, &b, &next), "size");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_step_begin(p->c, NULL, &next), "NULL");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_step_begin(p->c, &b, NULL), "NULL");
}

/* One step: this rank's sums, reduced over its data-parallel group, committed, applied. */
static newt_result_t step(prog *p, const newt_batch *b) {
  int cs = case_of(p->ro);
  if (p->ro->die_at && b->step == p->ro->die_at) kill(getpid(), SIGKILL); /* a crash, mid-job */
  int64_t q = GB / p->l.dp;
  CHECK(cs, b->step == p->done + 1 && b->first == (b->step - 1) * GB + p->l.dp_rank * q && b->count == q,
        "step %lld: samples [%lld, +%lld), expected step %lld, [%lld, +%lld)", (long long)b->step, (long long)b->first,
        (long long)b->count, (long long)p->done + 1, (long long)(p->done * GB + p->l.dp_rank * q), (long long)q);
  if (!p->step_misuse) { /* begun twice in a healthy generation: refused, the step goes on */
    newt_batch again = {.size = sizeof again};
    newt_next next;
    EXPECT_ERR(C_BEGUN_TWICE, NEWT_ERR_INVALID, newt_step_begin(p->c, &again, &next), "begun", "not committed");
  }
  float G[NX] = {0}, sum[NX];
  for (int64_t k = b->first; k < b->first + b->count; k++)
    for (int i = 0; i < NX; i++) G[i] += g(k, i);
  newt_result_t r;
  if (p->l.dp_comm) {
    if (!p->step_misuse)
      EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_allreduce(p->l.dp_comm, G, sum, NX, (newt_dtype)99, NEWT_SUM),
                 "99");
    if (b->step % 2 == 0) { /* every other step the asynchronous form, which must give the same sums */
      newt_req *req = NULL;
      if ((r = newt_allreduce_async(p->l.dp_comm, G, sum, NX, NEWT_F32, NEWT_SUM, &req)) != NEWT_OK) return r;
      CHECK(cs, req != NULL, "step %lld: newt_allreduce_async returned no request", (long long)b->step);
      if (req && (r = newt_wait(req)) != NEWT_OK) return r;
    } else if ((r = newt_allreduce(p->l.dp_comm, G, sum, NX, NEWT_F32, NEWT_SUM)) != NEWT_OK) {
      return r;
    }
    memcpy(G, sum, sizeof G);
  }
  double vals[33] = {(double)b->count}, sums[33] = {0};
  if (!p->step_misuse) {
    EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_step_commit(p->c, vals, sums, 33), "33");
    EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_step_commit(p->c, NULL, sums, 1), "NULL");
  }
  if ((r = newt_step_commit(p->c, vals, sums, 1)) != NEWT_OK) return r;
  CHECK(cs, sums[0] == GB, "step %lld: the commit's sum of the ranks' sample counts is %g, the global batch %d",
        (long long)b->step, sums[0], GB);
  for (int i = 0; i < NX; i++) p->x[i] = fmodf(3 * p->x[i] + G[i] + 1, 65521);
  for (int j = p->lo; j < p->hi; j++) p->shard[p->cur][j] += (float)b->step;
  p->meta = b->step;
  p->done = b->step; /* updated: the step is done, whatever newt_step_end says of what follows it */
  newt_step_result res;
  newt_step_result_init(&res);
  res.loss = p->x[0];
  if (!p->step_misuse) {
    EXPECT_ERR(C_BEGUN_TWICE, NEWT_ERR_INVALID, newt_step_begin(p->c, &(newt_batch){.size = sizeof(newt_batch)},
                                                                &(newt_next){0}),
               "begun", "not ended");
    res.size = 0;
    EXPECT_ERR(C_SIZE_ZERO, NEWT_ERR_INVALID, newt_step_end(p->c, &res), "size");
    /* an older newt_step_result: `after`, which it lacks, is not read */
    res.size = offsetof(newt_step_result, after);
    res.after = NEWT_ERR_PEER;
    p->step_misuse = 1;
    r = newt_step_end(p->c, &res);
    CHECK(C_ABI, r == NEWT_OK, "newt_step_end with an older newt_step_result: %s: %s", newt_result_name(r),
          newt_errmsg());
    CHECK(C_BEGUN_TWICE, r == NEWT_OK, "the step begun twice did not end: %s", newt_errmsg());
  } else { /* a newer header's newt_step_result, its fields beyond this library's zero (their
              defaults): taken as it is */
    struct {
      newt_step_result r;
      uint64_t later;
    } newer = {res, 0};
    newer.r.size = sizeof newer;
    r = newt_step_end(p->c, &newer.r);
    CHECK(C_ABI, r == NEWT_OK || r == NEWT_ERR_PEER || r == NEWT_ERR_TIMEOUT || r == NEWT_ERR_ABORTED,
          "newt_step_end with a newer newt_step_result (zero beyond): %s: %s", newt_result_name(r), newt_errmsg());
  }
  if (r != NEWT_OK) return r;
  if (p->ro->leave_at && p->done == p->ro->leave_at) newt_leave(p->c);
  return NEWT_OK;
}

/* After NEXT_DONE or NEXT_LEFT: every call but newt_finish is refused. */
static void after_over(prog *p, int cs, const char *how) {
  newt_batch b = {.size = sizeof b};
  newt_next next;
  newt_tensor t;
  tensor(&t, "x", p->x, NX, shape_x, 0, 0);
  double v = 1, s;
  newt_layout l = {.size = sizeof l};
  EXPECT_ERR(cs, NEWT_ERR_INVALID, newt_step_begin(p->c, &b, &next), "over", how);
  EXPECT_ERR(cs, NEWT_ERR_INVALID, newt_state_tensor(p->c, &t), "no generation");
  EXPECT_ERR(cs, NEWT_ERR_INVALID, newt_state_restore(p->c, NULL), "no generation");
  EXPECT_ERR(cs, NEWT_ERR_INVALID, newt_step_commit(p->c, &v, &s, 1), "no step");
  EXPECT_ERR(cs, NEWT_ERR_INVALID, newt_layout_get(p->c, &l), "no generation");
}

static int run_worker(const role *ro, const char *etcd, const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s.log", dir, ro->id);
  report_fd = dup(2);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) dup2(fd, 1), dup2(fd, 2), close(fd);
  me = ro->id;
  static prog p;
  memset(&p, 0, sizeof p);
  p.ro = ro;
  int cs = case_of(ro);
  char term[512];
  snprintf(term, sizeof term, "%s/%s.termination", dir, ro->id);
  newt_join_opts o;
  newt_join_opts_init(&o);
  o.etcd = etcd;
  o.job = ro->job;
  o.worker_id = ro->id;
  o.metrics_port = 0;
  o.termination_log = term;
  o.handle_signals = 0;
  if (ro->die_restored) {
    char die[32];
    snprintf(die, sizeof die, "restored:%d", ro->die_restored);
    setenv("NEWT_CHAOS_DIE", die, 1);
  }
  if (ro->old_structs) { /* an older header's newt_join_opts: the fields it lacks are not read */
    setenv("NEWT_TERMINATION_LOG", term, 1);
    o.size = offsetof(newt_join_opts, metrics_port);
    o.metrics_port = 99999; /* refused, were it read */
  }
  newt_result_t r = newt_join(&o, &p.c);
  CHECK(ro->old_structs ? C_ABI : cs, r == NEWT_OK, "newt_join: %s", newt_errmsg());
  if (r != NEWT_OK) return 1;
  newt_next next = NEWT_NEXT_FAILED;
  for (;;) {
    if (p.done > 0 && !p.idle_misuse && p.gens > 0) {
      idle_misuse(&p);
      p.idle_misuse = 1;
    }
    struct {
      newt_batch b;
      uint64_t canary;
    } bb;
    memset(&bb, 0x5a, sizeof bb);
    bb.b.size = ro->old_structs ? offsetof(newt_batch, micro_batch) : sizeof bb.b;
    r = newt_step_begin(p.c, &bb.b, &next);
    if (r != NEWT_OK) break;
    if (next == NEWT_NEXT_STEP && ro->old_structs) {
      unsigned char pat[sizeof bb];
      memset(pat, 0x5a, sizeof pat);
      size_t at = offsetof(newt_batch, micro_batch);
      CHECK(C_ABI, memcmp((char *)&bb + at, pat, sizeof bb - at) == 0,
            "newt_step_begin wrote past the %zu bytes of an older newt_batch", at);
    }
    if (next == NEWT_NEXT_GENERATION) {
      r = generation(&p);
      if (r != NEWT_OK && ro->scribble && (r == NEWT_ERR_PEER || r == NEWT_ERR_TIMEOUT || r == NEWT_ERR_ABORTED)) {
        /* the restore failed: what it was declared on is the program's again (newt.h) */
        memset(p.x, 0xff, sizeof p.x);
        memset(p.shard[p.cur], 0xff, sizeof p.shard[p.cur]);
        r = NEWT_OK;
        continue;
      }
      if (r != NEWT_OK) break;
    } else if (next == NEWT_NEXT_STEP) {
      if ((r = step(&p, &bb.b)) != NEWT_OK) { /* a peer died: begin again, which recovers */
        CHECK(cs, r == NEWT_ERR_PEER || r == NEWT_ERR_TIMEOUT || r == NEWT_ERR_ABORTED,
              "step %lld failed with %s: %s", (long long)bb.b.step, newt_result_name(r), newt_errmsg());
        p.failed_steps++;
        p.failed_since_restore = 1;
        r = NEWT_OK;
      }
    } else {
      break;
    }
  }
  int status;
  if (ro->overlap) { /* the worker ends with the restore's error */
    CHECK(C_OVERLAP, r == NEWT_ERR_INVALID, "the overlapping worker stopped on %s: %s", newt_result_name(r),
          newt_errmsg());
    status = newt_finish(p.c, r);
    CHECK(C_OVERLAP, status == 2, "newt_finish of a worker stopped by NEWT_ERR_INVALID says %d, expected 2 (an "
          "error another try will not mend)", status);
    return status;
  }
  CHECK(cs, r == NEWT_OK, "the step loop stopped on %s: %s", newt_result_name(r), newt_errmsg());
  /* C's death failed one step of each survivor; N's of api-cut too */
  int crashes = strcmp(ro->job, "api-main") == 0 || strcmp(ro->job, "api-cut") == 0;
  CHECK(cs, p.failed_steps == crashes, "%d steps failed, expected %d", p.failed_steps, crashes);
  if (r == NEWT_OK && next == NEWT_NEXT_DONE) {
    CHECK(cs, p.done == ro->steps, "done after step %lld of %lld", (long long)p.done, (long long)ro->steps);
    check_state(&p, cs, p.done, "the end");
    after_over(&p, C_AFTER_DONE, "done");
    status = newt_finish(p.c, NEWT_OK);
    CHECK(C_AFTER_DONE, status == 0, "newt_finish after NEXT_DONE says %d, expected 0", status);
  } else if (r == NEWT_OK && next == NEWT_NEXT_LEFT) {
    CHECK(C_AFTER_LEFT, ro->leave_at && p.done >= ro->leave_at, "left after step %lld (asked after %d)",
          (long long)p.done, ro->leave_at);
    check_state(&p, cs, p.done, "the leave");
    after_over(&p, C_AFTER_LEFT, "left");
    status = newt_finish(p.c, NEWT_OK);
    CHECK(C_AFTER_LEFT, status == 3, "newt_finish after NEXT_LEFT says %d, expected 3", status);
  } else {
    CHECK(cs, 0, "ended with next %d", (int)next);
    status = newt_finish(p.c, r == NEWT_OK ? NEWT_ERR_INVALID : r);
  }
  return status;
}

/* --- a worker without a job: arguments ---------------------------------------------------------- */

static int run_arguments(const char *dir) {
  me = "Z";
  char path[512];
  snprintf(path, sizeof path, "%s/Z.log", dir);
  report_fd = dup(2);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) dup2(fd, 1), dup2(fd, 2), close(fd);
  unsetenv("NEWT_JOB");
  int v = newt_version();
  CHECK(C_NULL_ARGS, v / 10000 == NEWT_VERSION_MAJOR && v % 10000 >= NEWT_VERSION_MINOR * 100,
        "the library is version %d, the header %d", v, NEWT_VERSION_NUMBER);
  newt_ctx *c = (newt_ctx *)1;
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_join(NULL, NULL), "out", "NULL");
  EXPECT_ERR(C_JOIN_NO_JOB, NEWT_ERR_INVALID, newt_join(NULL, &c), "NEWT_JOB");
  CHECK(C_JOIN_NO_JOB, c == NULL, "a newt_join that failed left *out set");
  newt_join_opts o;
  newt_join_opts_init(&o);
  o.etcd = "http://127.0.0.1:1";
  char term[512];
  snprintf(term, sizeof term, "%s/Z.termination", dir);
  o.termination_log = term;
  EXPECT_ERR(C_JOIN_NO_JOB, NEWT_ERR_INVALID, newt_join(&o, &c), "NEWT_JOB");
  o.job = "no/slash";
  EXPECT_ERR(C_JOIN_NO_JOB, NEWT_ERR_INVALID, newt_join(&o, &c), "no/slash");
  o.job = "j";
  o.size = 0;
  EXPECT_ERR(C_SIZE_ZERO, NEWT_ERR_INVALID, newt_join(&o, &c), "newt_join_opts", "size");

  newt_batch b = {.size = sizeof b};
  newt_next next;
  newt_tensor t;
  newt_tensor_init(&t);
  newt_layout l = {.size = sizeof l};
  newt_job_info ji = {.size = sizeof ji};
  newt_restore_info ri = {.size = sizeof ri};
  double val = 0, sum = 0;
  float f = 0;
  newt_comm *out = (newt_comm *)1;
  newt_req *req = (newt_req *)1;
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_step_begin(NULL, &b, &next), "newt_step_begin", "newt_ctx");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_step_commit(NULL, &val, &sum, 1), "newt_step_commit", "newt_ctx");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_step_end(NULL, NULL), "newt_step_end", "newt_ctx");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_state_tensor(NULL, &t), "newt_state_tensor", "newt_ctx");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_state_bytes(NULL, "b", NEWT_PER_JOB, &f, 4), "newt_ctx");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_state_restore(NULL, &ri), "newt_state_restore", "newt_ctx");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_state_document(NULL, NULL, NULL, NULL), "newt_ctx");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_layout_get(NULL, &l), "newt_layout_get", "newt_ctx");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_job_get(NULL, &ji), "newt_job_get", "newt_ctx");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_use_device(NULL, NULL, NULL), "newt_ctx");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_allreduce(NULL, &f, &f, 1, NEWT_F32, NEWT_SUM), "newt_allreduce",
             "not a group");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_broadcast(NULL, &f, &f, 1, NEWT_F32, 0), "not a group");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_barrier(NULL), "not a group");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_comm_split(NULL, 0, 0, &out), "not a group");
  CHECK(C_NULL_ARGS, out == NULL, "newt_comm_split of no group left *out set");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_comm_split(NULL, 0, 0, NULL), "out", "NULL");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_allreduce_async(NULL, &f, &f, 1, NEWT_F32, NEWT_SUM, &req),
             "not a group");
  CHECK(C_NULL_ARGS, req == NULL, "newt_allreduce_async of no group left *req set");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_allreduce_async(NULL, &f, &f, 1, NEWT_F32, NEWT_SUM, NULL), "req");
  EXPECT_ERR(C_NULL_ARGS, NEWT_ERR_INVALID, newt_wait(NULL), "newt_wait", "not a request");
  CHECK(C_NULL_ARGS, newt_comm_rank(NULL) == -1 && newt_comm_size(NULL) == 0 && newt_comm_host(NULL) == NULL,
        "no group says rank %d of %d", newt_comm_rank(NULL), newt_comm_size(NULL));
  newt_leave(NULL);
  CHECK(C_NULL_ARGS, newt_finish(NULL, NEWT_OK) == 1, "newt_finish(NULL) is not 1 (an error)");
  CHECK(C_NULL_ARGS, strcmp(newt_result_name(NEWT_ERR_INVALID), newt_result_name(NEWT_OK)) != 0,
        "newt_result_name gives no names");
  return 0;
}

/* --- processes -------------------------------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void pause_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* A free loopback port (bound, read back, released). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

/* argv as a child that dies with us, its output appended to log. */
static pid_t spawn(char *const argv[], const char *log) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) dup2(fd, 1), dup2(fd, 2), close(fd);
  execvp(argv[0], argv);
  fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
  _exit(127);
}

static int file_has(const char *path, const char *what) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[8192];
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) found = strstr(line, what) != NULL;
  fclose(f);
  return found;
}

static int write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  int ok = fputs(text, f) >= 0;
  return fclose(f) == 0 && ok ? 0 : -1;
}

static void stop(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  for (double t = now_s(); now_s() - t < 10; pause_ms(20))
    if (waitpid(pid, NULL, WNOHANG) == pid) return;
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

typedef struct kid {
  const role *ro; /* NULL: the worker without a job */
  pid_t pid;
  int status, ended;
} kid;

static pid_t fork_worker(const role *ro, const char *etcd, const char *dir) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  exit(ro ? run_worker(ro, etcd, dir) : run_arguments(dir));
}

static const char *spec_fmt =
    "{\"job\": \"%s\", \"train\": {\"steps\": %d, \"global_batch\": %d, \"micro_batch\": 1},"
    " \"parallel\": {\"start_workers\": %d, \"start_timeout_ms\": 60000}, \"backend\": \"cpu\"}\n";

int main(void) {
  double t0 = now_s();
  sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) return 2;
  memset(sh, 0, sizeof *sh);
  const char *newt = getenv("NEWT_BIN");
  if (!newt || !*newt) {
    fprintf(stderr, "test_api: NEWT_BIN (the newt binary) is not set; ctest sets it\n");
    return 2;
  }
  const char *etcd_bin = getenv("NEWT_ETCD_BIN") && *getenv("NEWT_ETCD_BIN") ? getenv("NEWT_ETCD_BIN") : "etcd";
  char dir[] = "/tmp/newt-api-XXXXXX";
  if (!mkdtemp(dir)) return 2;
  setenv("NEWT_DEBUG", "INFO", 0); /* the workers' and coordinators' logs, for a failure */
  fflush(NULL);

  kid kids[16] = {{0}};
  int nkids = 0;
  kids[nkids].pid = fork_worker(NULL, NULL, dir), nkids++;

  /* etcd, serving once its log says so */
  int cport = free_port(), pport = free_port();
  char curl[64], purl[64], cluster[96], data[600], elog[600];
  snprintf(curl, sizeof curl, "http://127.0.0.1:%d", cport);
  snprintf(purl, sizeof purl, "http://127.0.0.1:%d", pport);
  snprintf(cluster, sizeof cluster, "default=%s", purl);
  snprintf(data, sizeof data, "%s/etcd", dir);
  snprintf(elog, sizeof elog, "%s/etcd.log", dir);
  char *eargv[] = {(char *)etcd_bin, "--data-dir", data, "--listen-client-urls", curl, "--advertise-client-urls", curl,
                   "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl, "--initial-cluster", cluster,
                   "--heartbeat-interval", "25", "--election-timeout", "250", NULL};
  pid_t etcd = spawn(eargv, elog);
  int ready = 0;
  for (double t = now_s(); !ready && now_s() - t < 30 && waitpid(etcd, NULL, WNOHANG) == 0; pause_ms(20))
    ready = file_has(elog, "serving client traffic") || file_has(elog, "ready to serve client requests");
  pid_t coords[3] = {0, 0, 0};
  static const role roles[] = {
      {"A", "api-main", MAIN_STEPS, 0, 0, 0, 0, 0},        {"B", "api-main", MAIN_STEPS, LEAVE_AT, 0, 1, 3, 0},
      {"C", "api-main", MAIN_STEPS, 0, 0, 0, -SIGKILL, DIE_AT}, {"P", "api-overlap", OV_STEPS, 0, 1, 0, 2, 0},
      {"Q", "api-overlap", OV_STEPS, 0, 1, 0, 2, 0},       {"R", "api-overlap", OV_STEPS, 0, 0, 0, 0, 0},
      {"K", "api-cut", CUT_STEPS, 0, 0, 0, 0, 0, 0, 1},   {"L", "api-cut", CUT_STEPS, 0, 0, 0, -SIGKILL, 0, 2, 0},
      {"N", "api-cut", CUT_STEPS, 0, 0, 0, -SIGKILL, DIE_AT, 0, 0}};
  const role *late = &roles[5]; /* R: once P and Q have ended */
  if (!ready) {
    fprintf(stderr, "FAIL: etcd (%s) did not serve within 30 s; its log: %s\n", etcd_bin, elog);
    atomic_fetch_add(&sh->ran[C_PROCESSES], 1), atomic_fetch_add(&sh->failed[C_PROCESSES], 1);
  } else {
    const char *jobs[3] = {"api-main", "api-overlap", "api-cut"};
    int steps[3] = {MAIN_STEPS, OV_STEPS, CUT_STEPS}, start[3] = {3, 2, 3};
    for (int j = 0; j < 3; j++) {
      char spec[600], text[600], clog[600], id[32];
      snprintf(spec, sizeof spec, "%s/%s.json", dir, jobs[j]);
      snprintf(clog, sizeof clog, "%s/coordinator-%s.log", dir, jobs[j]);
      snprintf(text, sizeof text, spec_fmt, jobs[j], steps[j], GB, start[j]);
      snprintf(id, sizeof id, "c-%s", jobs[j]);
      if (write_file(spec, text) != 0) return 2;
      char *cargv[] = {(char *)newt, "coordinator", "--etcd", curl, "--job", (char *)jobs[j], "--id", id, "--spec",
                       spec, "--metrics-port", "0", NULL};
      coords[j] = spawn(cargv, clog);
    }
    for (int i = 0; i < (int)(sizeof roles / sizeof roles[0]); i++) {
      if (&roles[i] == late) continue;
      kids[nkids].ro = &roles[i];
      kids[nkids].pid = fork_worker(&roles[i], curl, dir), nkids++;
    }
  }

  /* every process ends; R joins api-overlap once P and Q have ended */
  for (;;) {
    int running = 0, pq_ended = 0, r_started = 0;
    for (int i = 0; i < nkids; i++) {
      kid *k = &kids[i];
      if (!k->ended && waitpid(k->pid, &k->status, WNOHANG) == k->pid) k->ended = 1;
      running += !k->ended;
      if (k->ro && k->ro->overlap) pq_ended += k->ended;
      if (k->ro == late) r_started = 1;
    }
    if (pq_ended == 2 && !r_started) {
      kids[nkids].ro = late;
      kids[nkids].pid = fork_worker(late, curl, dir), nkids++;
      continue;
    }
    if (!running) break;
    if (now_s() - t0 > DEADLINE_S) {
      for (int i = 0; i < nkids; i++)
        if (!kids[i].ended) {
          fprintf(stderr, "FAIL: worker %s still runs after %d s: killed\n", kids[i].ro ? kids[i].ro->id : "Z",
                  DEADLINE_S);
          kill(kids[i].pid, SIGKILL);
          waitpid(kids[i].pid, &kids[i].status, 0);
          kids[i].ended = 1;
        }
      break;
    }
    pause_ms(20);
  }
  for (int i = 0; i < nkids; i++) {
    const kid *k = &kids[i];
    int want = k->ro ? k->ro->want_exit : 0; /* < 0: killed by that signal */
    int ok = want < 0 ? WIFSIGNALED(k->status) && WTERMSIG(k->status) == -want
                      : WIFEXITED(k->status) && WEXITSTATUS(k->status) == want;
    atomic_fetch_add(&sh->ran[C_PROCESSES], 1);
    if (!ok) {
      atomic_fetch_add(&sh->failed[C_PROCESSES], 1);
      fprintf(stderr, "FAIL processes_exit_right: worker %s: %s %d, expected %s %d\n", k->ro ? k->ro->id : "Z",
              WIFEXITED(k->status) ? "exit" : "signal", WIFEXITED(k->status) ? WEXITSTATUS(k->status)
                                                                             : WTERMSIG(k->status),
              want < 0 ? "signal" : "exit", want < 0 ? -want : want);
    }
  }
  for (int j = 0; j < 3; j++) stop(coords[j]);
  stop(etcd);

  int passed = 0, failed = 0;
  for (int cs = 0; cs < NCASES; cs++) {
    int ran = atomic_load(&sh->ran[cs]), bad = atomic_load(&sh->failed[cs]);
    int ok = ran > 0 && bad == 0;
    fprintf(stderr, "%s %s (%d checks%s)\n", ok ? "ok    " : "FAILED", case_names[cs], ran,
            ran == 0 ? ": never ran" : "");
    ok ? passed++ : failed++;
  }
  fprintf(stderr, "test_api: %.1f s\n", now_s() - t0);
  if (failed || getenv("NEWT_KEEP_LOGS")) {
    fprintf(stderr, "logs in %s\n", dir);
  } else {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  }
  fprintf(stderr, "%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
