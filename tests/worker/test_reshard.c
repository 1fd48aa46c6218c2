/* In-memory resharding across layouts, with real rank processes and the CPU backend:
 * replicas filling a joiner, ZeRO shards re-cut for another data-parallel size, row
 * shards becoming column shards, the newest covered step winning over a newer partial
 * one, and a missing shard making every rank fall back (NOTFOUND). Every element is a
 * function of (tensor, global index, step), so each received value is checked.
 *
 * The roles (reshard_roles) every rank works out from the others' needs: who saves a part
 * (the lowest rank of equal parts, not derived, not inside another), which parts no other
 * rank holds (ZeRO shards), whether every rank holds everything (plain data parallelism);
 * needs that do not tile a tensor (a gap, a partial overlap, another type) refused on every
 * rank naming the tensor; optional needs nobody holds left unfilled; bytes of other element
 * types moved as they are. */
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
  float *d = p->data;
  for (int64_t k = s->begin; k < s->end; k++) d[k - s->begin] = step >= 0 ? value(t, global_index(t, s, k), step) : -1;
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
    const float *d = p->data;
    for (int64_t k = p->slice.begin; k < p->slice.end; k++)
      if (d[k - p->slice.begin] != value(t, global_index(t, &p->slice, k), step)) bad++;
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
  newt_result_t r = reshard_exchange(c, have.p, have.n, keep ? have.p : need.p, keep ? have.n : need.n, NULL, &res);
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

/* --- roles, checks, types ------------------------------------------------------------------- */

typedef enum role_case { ROLES_SHARDS, ROLES_REPLICAS, ROLES_DERIVED, BAD_GAP, BAD_OVERLAP, BAD_TYPE, OPTIONAL_BYTES } role_case;

static int roles_run(ct_world *w, int rank, void *arg) {
  role_case rc = *(const role_case *)arg;
  comm_config cfg;
  ct_config(w, rank, &cfg);
  comm_t *c = NULL;
  if (comm_create(&cfg, &c) != NEWT_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, newt_errmsg());
    return 1;
  }
  static pieces need;
  memset(&need, 0, sizeof need);
  int64_t T = flat_total();
  newt_slice s;
  int fails = 0;
  if (rc == ROLES_SHARDS) {
    shard(&need, T * rank / 4, T * (rank + 1) / 4 - T * rank / 4, -1);
  } else if (rc == ROLES_REPLICAS) {
    shard(&need, 0, T, -1);
  } else if (rc == ROLES_DERIVED) { /* ZeRO 1/2: the full tensors derived, the owned chunk plain */
    size_t n0 = need.n;
    shard(&need, 0, T, -1);
    for (size_t i = n0; i < need.n; i++) need.p[i].flags = RESHARD_DERIVED;
    shard(&need, T * rank / 4, T * (rank + 1) / 4 - T * rank / 4, -1);
  } else if (rc == BAD_GAP) { /* rank 3 declares nothing: its quarter is nobody's */
    if (rank < 3) shard(&need, T * rank / 4, T * (rank + 1) / 4 - T * rank / 4, -1);
  } else if (rc == BAD_OVERLAP) { /* rank 1 and 2 overlap by two elements */
    int64_t lo = T * rank / 4 - (rank == 2 ? 2 : 0);
    shard(&need, lo, T * (rank + 1) / 4 - lo, -1);
  } else if (rc == BAD_TYPE) {
    whole(1, &s);
    add(&need, 1, &s, -1);
    if (rank == 1) need.p[0].dtype = NEWT_I32;
  }
  int64_t blob[2][16];
  size_t nblob = 0;
  if (rc == OPTIONAL_BYTES) {
    /* a u8 tensor of 10 bytes only rank 0 holds (at step 4: the others receive it) and a rank's
       own bytes that ranks 0..2 hold: rank 3's is optional and nobody has it */
    static pieces have;
    memset(&have, 0, sizeof have);
    for (int k = 0; k < 2; k++) {
      reshard_piece *h = &have.p[have.n++], *q = &need.p[need.n++];
      memset(h, 0, sizeof *h);
      snprintf(h->name, sizeof h->name, k == 0 ? "job.bytes" : "rank.%d.bytes", rank);
      h->dtype = NEWT_U8;
      h->ndim = 1;
      h->shape[0] = 10;
      h->slice.ndim = 1, h->slice.shape[0] = 10, h->slice.end = 10;
      h->step = k == 1 && rank == 3 ? -1 : 4;
      h->flags = k == 1 ? RESHARD_OPTIONAL : 0;
      *q = *h;
      h->data = blob[0] + 8 * k;
      q->data = blob[1] + 8 * k;
      for (int b = 0; b < 10; b++) ((uint8_t *)h->data)[b] = (uint8_t)(100 + b + 10 * k);
      memset(q->data, 0xee, 10);
    }
    /* rank 0 holds the job's bytes and its own; ranks 1, 2 their own; rank 3 nothing */
    reshard_piece *from = rank == 0 ? have.p : &have.p[1];
    nblob = rank == 0 ? 2 : rank < 3 ? 1 : 0;
    int filled[2] = {-1, -1};
    reshard_roles ro = {.check = 1, .filled = filled};
    reshard_result res;
    newt_result_t r = reshard_exchange(c, from, nblob, need.p, 2, &ro, &res);
    if (r != NEWT_OK) {
      fprintf(stderr, "bytes rank %d: %s\n", rank, newt_errmsg());
      fails++;
    } else {
      for (int b = 0; b < 10; b++) fails += ((uint8_t *)need.p[0].data)[b] != (uint8_t)(100 + b);
      if (filled[0] != 1 || filled[1] != (rank < 3)) {
        fprintf(stderr, "bytes rank %d: filled %d %d\n", rank, filled[0], filled[1]);
        fails++;
      }
      for (int b = 0; rank < 3 && b < 10; b++) fails += ((uint8_t *)need.p[1].data)[b] != (uint8_t)(110 + b);
      for (int b = 0; rank == 3 && b < 10; b++) fails += ((uint8_t *)need.p[1].data)[b] != 0xee; /* left as it was */
    }
    comm_free(c);
    return fails;
  }
  int primary[24], unique[24];
  reshard_roles ro = {.check = 1, .primary = primary, .unique = unique};
  reshard_result res;
  newt_result_t r = reshard_exchange(c, NULL, 0, need.p, need.n, &ro, &res);
  if (rc >= BAD_GAP) {
    const char *want = rc == BAD_GAP ? "declared by no rank" : rc == BAD_OVERLAP ? "overlap without" : "one type and shape";
    if (r != NEWT_ERR_INVALID || !strstr(newt_errmsg(), want)) {
      fprintf(stderr, "case %d rank %d: %s: %s, expected INVALID saying \"%s\"\n", (int)rc, rank, newt_result_name(r),
              newt_errmsg(), want);
      fails++;
    }
  } else if (r != NEWT_ERR_NOTFOUND) { /* nothing held: no step, but the roles */
    fprintf(stderr, "case %d rank %d: %s: %s, expected NOTFOUND\n", (int)rc, rank, newt_result_name(r), newt_errmsg());
    fails++;
  } else {
    int whole_want = rc != ROLES_SHARDS;
    if (ro.whole != whole_want) {
      fprintf(stderr, "case %d rank %d: whole %d, expected %d\n", (int)rc, rank, ro.whole, whole_want);
      fails++;
    }
    for (size_t i = 0; i < need.n; i++) {
      int derived = (need.p[i].flags & RESHARD_DERIVED) != 0;
      int pw = rc == ROLES_SHARDS ? 1 : rc == ROLES_REPLICAS ? rank == 0 : !derived;
      int uw = rc == ROLES_SHARDS;
      if (primary[i] != pw || unique[i] != uw) {
        fprintf(stderr, "case %d rank %d: part %zu (%s [%lld, %lld)%s): primary %d unique %d, expected %d %d\n", (int)rc,
                rank, i, need.p[i].name, (long long)need.p[i].slice.begin, (long long)need.p[i].slice.end,
                derived ? ", derived" : "", primary[i], unique[i], pw, uw);
        fails++;
      }
    }
  }
  comm_free(c);
  return fails;
}

static void roles_case(role_case rc) {
  ct_world w;
  ct_world_init(&w, 4, CT_SHM, "roles");
  ct_spawn(&w, roles_run, &rc);
  T_CHECK_MSG(ct_wait(&w, 60000, NULL) == 0, "case %d failed", (int)rc);
  ct_world_free(&w);
}

static void test_roles(void) {
  roles_case(ROLES_SHARDS);
  roles_case(ROLES_REPLICAS);
  roles_case(ROLES_DERIVED);
}
static void test_bad_layouts(void) {
  roles_case(BAD_GAP);
  roles_case(BAD_OVERLAP);
  roles_case(BAD_TYPE);
}
static void test_optional_bytes(void) { roles_case(OPTIONAL_BYTES); }

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
  T_RUN(test_roles);
  T_RUN(test_bad_layouts);
  T_RUN(test_optional_bytes);
  return T_DONE();
}
