/* In-memory resharding across layouts, with real rank processes and the CPU backend:
 * replicas filling a joiner, ZeRO shards re-cut for another data-parallel size, row
 * shards becoming column shards, the newest covered step winning over a newer partial
 * one, and a missing shard making every rank fall back (NOTFOUND). Every element is a
 * function of (tensor, global index, step), so each received value is checked. */
#include <string.h>

#include "comm/comm_test.h"
#include "test.h"
#include "worker/reshard.h"

#define NT 2
static const char *const tname[NT] = {"a.w", "b.b"};
static const int tndim[NT] = {2, 1};
static const int64_t tshape[NT][2] = {{8, 6}, {10, 1}};

static float value(int t, int64_t g, int64_t step) { return (float)(t * 1000 + g) + 0.5f * (float)step; }

static int64_t tnumel(int t) { return tshape[t][0] * (tndim[t] == 2 ? tshape[t][1] : 1); }

/* Global row-major index of element k of a slice. */
static int64_t global_index(int t, const newt_slice *s, int64_t k) {
  int64_t idx[2] = {0, 0};
  int64_t inner = s->ndim == 2 ? s->shape[1] : 1;
  idx[0] = k / inner;
  if (s->ndim == 2) idx[1] = k % inner;
  int64_t g0 = s->offset[0] + idx[0];
  return s->ndim == 2 ? g0 * tshape[t][1] + s->offset[1] + idx[1] : g0;
}

typedef struct pieces {
  reshard_piece p[24];
  size_t n;
  float store[24][64];
} pieces;

static void add(pieces *ps, int t, const newt_slice *s, int64_t step) {
  reshard_piece *p = &ps->p[ps->n];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", tname[t]);
  p->ndim = tndim[t];
  for (int i = 0; i < tndim[t]; i++) p->shape[i] = tshape[t][i];
  p->slice = *s;
  p->step = step;
  p->data = ps->store[ps->n];
  for (int64_t k = s->begin; k < s->end; k++) p->data[k - s->begin] = step >= 0 ? value(t, global_index(t, s, k), step) : -1;
  ps->n++;
}

static void whole(int t, newt_slice *s) {
  newt_tensor_desc d = {.name = tname[t], .dtype = NEWT_F32, .ndim = tndim[t]};
  for (int i = 0; i < tndim[t]; i++) d.shape[i] = tshape[t][i];
  newt_slice_whole(s, &d);
}

/* The pieces of [off, off+len) of the concatenation of the tensors (a ZeRO shard). */
static void shard(pieces *ps, int64_t off, int64_t len, int64_t step) {
  newt_slice boxes[NT];
  for (int t = 0; t < NT; t++) whole(t, &boxes[t]);
  newt_flat_piece fp[NT];
  size_t n = 0;
  if (newt_flat_pieces(boxes, NT, off, len, fp, NT, &n) != NEWT_OK) return;
  for (size_t i = 0; i < n; i++) add(ps, (int)fp[i].tensor, &fp[i].slice, step);
}

static int64_t flat_total(void) { return tnumel(0) + tnumel(1); }

/* Counts elements of the needs that do not hold the expected step's values. */
static int check(const pieces *need, int64_t step) {
  int bad = 0;
  for (size_t i = 0; i < need->n; i++) {
    const reshard_piece *p = &need->p[i];
    int t = strcmp(p->name, tname[0]) == 0 ? 0 : 1;
    for (int64_t k = p->slice.begin; k < p->slice.end; k++)
      if (p->data[k - p->slice.begin] != value(t, global_index(t, &p->slice, k), step)) bad++;
  }
  return bad;
}

typedef struct scenario {
  const char *name;
  int expect_found;
  int64_t expect_step;
} scenario;

static int run(ct_world *w, int rank, void *arg) {
  const scenario *sc = arg;
  comm_config cfg;
  ct_config(w, rank, &cfg);
  comm_t *c = NULL;
  if (comm_create(&cfg, &c) != NEWT_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, newt_errmsg());
    return 1;
  }
  static pieces have, need;
  memset(&have, 0, sizeof have);
  memset(&need, 0, sizeof need);
  int64_t step = -1;
  int keep = 0; /* need == have */
  newt_slice s;
  int64_t T = flat_total();
  if (strcmp(sc->name, "replicas") == 0) {
    step = rank < 2 ? 5 : rank == 2 ? 4 : -1;
    for (int t = 0; t < NT; t++) {
      whole(t, &s);
      add(&have, t, &s, step);
    }
    keep = rank < 3;
    if (!keep)
      for (int t = 0; t < NT; t++) whole(t, &s), add(&need, t, &s, -1);
  } else if (strcmp(sc->name, "zero_recut") == 0 || strcmp(sc->name, "missing") == 0) {
    int lost = strcmp(sc->name, "missing") == 0 && rank == 1;
    if (rank < 3 && !lost) {
      step = 7;
      shard(&have, T * rank / 3, T * (rank + 1) / 3 - T * rank / 3, step);
    }
    shard(&need, T * rank / 4, T * (rank + 1) / 4 - T * rank / 4, -1);
  } else if (strcmp(sc->name, "rows_to_cols") == 0) {
    int64_t off[2], shp[2];
    if (rank < 2) {
      step = 3;
      off[0] = 4 * rank, off[1] = 0, shp[0] = 4, shp[1] = 6;
      newt_slice_box(&s, 2, off, shp);
      add(&have, 0, &s, step);
      whole(1, &s);
      add(&have, 1, &s, step);
    }
    off[0] = 0, off[1] = 3 * (rank % 2), shp[0] = 8, shp[1] = 3;
    newt_slice_box(&s, 2, off, shp);
    add(&need, 0, &s, -1);
    whole(1, &s);
    add(&need, 1, &s, -1);
  } else if (strcmp(sc->name, "zero_replica") == 0 || strcmp(sc->name, "snapshot") == 0) {
    /* ZeRO shards of dp 4, each also copied on the next rank. Rank 2 lost everything.
       zero_replica: everyone else at step 6. snapshot: ranks 0 and 1 applied step 7 and
       kept a snapshot of their step-6 shard; rank 3 is at 6. Both end at step 6, rank 2's
       shard from rank 3's copy. */
    int snap = strcmp(sc->name, "snapshot") == 0;
    if (rank != 2) {
      int64_t cur = snap && rank < 2 ? 7 : 6;
      shard(&have, T * rank / 4, T * (rank + 1) / 4 - T * rank / 4, cur);
      if (cur != 6) shard(&have, T * rank / 4, T * (rank + 1) / 4 - T * rank / 4, 6); /* the snapshot */
      int prev = (rank + 3) % 4;
      shard(&have, T * prev / 4, T * (prev + 1) / 4 - T * prev / 4, 6); /* the neighbour's copy */
    }
    shard(&need, T * rank / 4, T * (rank + 1) / 4 - T * rank / 4, -1);
  } else if (strcmp(sc->name, "nested") == 0) {
    /* rank 0 holds everything at step 5, rank 1 a chunk inside it (a ZeRO chunk of a box
       another rank holds whole), ranks 2 and 3 nothing: the chunk adds nothing */
    if (rank == 0) shard(&have, 0, T, 5);
    if (rank == 1) shard(&have, 3, 20, 5);
    shard(&need, 0, T, -1);
  } else if (strcmp(sc->name, "newest_covered") == 0) {
    /* rank 0: step 9 whole; ranks 1, 2: step 10 halves; rank 3 nothing: 10 wins */
    if (rank == 0) {
      step = 9;
      shard(&have, 0, T, step);
    } else if (rank < 3) {
      step = 10;
      shard(&have, T * (rank - 1) / 2, T * rank / 2 - T * (rank - 1) / 2, step);
    }
    shard(&need, 0, T, -1);
  }
  reshard_result res;
  newt_result_t r = reshard_exchange(c, have.p, have.n, keep ? have.p : need.p, keep ? have.n : need.n, &res);
  int fails = 0;
  if (sc->expect_found) {
    if (r != NEWT_OK) {
      fprintf(stderr, "%s rank %d: %s\n", sc->name, rank, newt_errmsg());
      fails++;
    } else {
      if (res.step != sc->expect_step) {
        fprintf(stderr, "%s rank %d: step %lld, expected %lld\n", sc->name, rank, (long long)res.step,
                (long long)sc->expect_step);
        fails++;
      }
      int bad = check(keep ? &have : &need, sc->expect_step);
      if (bad) fprintf(stderr, "%s rank %d: %d wrong elements\n", sc->name, rank, bad);
      fails += bad;
      if (strcmp(sc->name, "replicas") == 0 && rank < 2 && res.received) {
        fprintf(stderr, "replicas rank %d received %lld elements it held\n", rank, (long long)res.received);
        fails++;
      }
    }
  } else if (r != NEWT_ERR_NOTFOUND) {
    fprintf(stderr, "%s rank %d: %s, expected NOTFOUND\n", sc->name, rank, newt_result_name(r));
    fails++;
  }
  comm_free(c);
  return fails;
}

static void scenario_run(const scenario *sc) {
  ct_world w;
  ct_world_init(&w, 4, CT_SHM, sc->name);
  ct_spawn(&w, run, (void *)sc);
  T_CHECK_MSG(ct_wait(&w, 60000, NULL) == 0, "scenario %s failed", sc->name);
  ct_world_free(&w);
}

static void test_replicas(void) { scenario_run(&(scenario){"replicas", 1, 5}); }
static void test_zero_recut(void) { scenario_run(&(scenario){"zero_recut", 1, 7}); }
static void test_rows_to_cols(void) { scenario_run(&(scenario){"rows_to_cols", 1, 3}); }
static void test_newest_covered(void) { scenario_run(&(scenario){"newest_covered", 1, 10}); }
static void test_missing(void) { scenario_run(&(scenario){"missing", 0, -1}); }
static void test_zero_replica(void) { scenario_run(&(scenario){"zero_replica", 1, 6}); }
static void test_snapshot(void) { scenario_run(&(scenario){"snapshot", 1, 6}); }
static void test_nested(void) { scenario_run(&(scenario){"nested", 1, 5}); }

int main(void) {
  T_RUN(test_replicas);
  T_RUN(test_zero_recut);
  T_RUN(test_rows_to_cols);
  T_RUN(test_newest_covered);
  T_RUN(test_missing);
  T_RUN(test_zero_replica);
  T_RUN(test_snapshot);
  T_RUN(test_nested);
  return T_DONE();
}
