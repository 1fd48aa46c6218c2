/* The parallel trainer (model/parallel.h) against the single-process trainer, with one real
 * process per rank talking over the CPU backend (shared memory within a "host", TCP between).
 *
 *  - one rank, no communicators: bit for bit the single-process run (losses and weights);
 *  - every layout of 1 to 8 ranks with tp in {1,2}, pp in {1,2,4}, dp in {1,2,4} (14 of them,
 *    one of them again with its pipeline stages on different hosts, over TCP), each with
 *    ZeRO 0, 1, 2 and 3: the loss and the gradient norm of each of 20 steps equal the
 *    single-process ones within fp32 tolerance; the first mismatch fails the test naming the
 *    layout, the step and both values. After the run, the pieces of all ranks are laid over
 *    the global tensors: the primary pieces cover every element of every parameter and both
 *    moments exactly once, every other piece equals its primary copy bit for bit, and the
 *    assembled state is the single-process one's after 20 steps (within tolerance). With
 *    ZeRO 1/2 the same holds after a parameter all-gather "failed" (the chunks of other ranks
 *    overwritten, params_stale set), and step 21 gathers again and matches too;
 *  - resharding through the pieces: a run under one layout stops after 10 steps, its pieces
 *    go to shared memory (a checkpoint), a run under another layout (other tp, pp, dp and
 *    ZeRO stage) loads its own pieces from there and follows the single-process losses;
 *  - the pieces against real checkpoints: a checkpoint of the single-process trainer read
 *    into each rank of a parallel layout through its pieces (ckpt_load), and the primary
 *    pieces of all ranks saved (ckpt_save_add, one saver per rank) and resumed by the
 *    single-process trainer, both bit for bit;
 *  - the pipeline schedule with messages larger than the transport's buffers (no deadlock);
 *  - the strict test device (tests/model/dev_strict.h: device memory the host cannot touch):
 *    layouts with tp, pp, dp and ZeRO 0..3 and a reshard through the pieces give the CPU
 *    device's bits, so the trainer reaches device memory only through model/dev.h;
 *  - bad layouts and bad calls are refused with a message naming the field;
 *  - `newt bench train --tp --pp --dp --zero` runs a layout of processes and prints its line. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common/fs.h"
#include "gpt/ckpt.h"
#include "par_test.h"

#define STEPS 20
#define LOSS_TOL 1e-5  /* absolute, on losses of 3 to 5.5 (differences seen: < 1e-7) */
#define NORM_TOL 1e-4  /* relative (seen: < 3e-7) */
#define STATE_TOL 1e-4 /* relative RMS of a tensor's difference from the single-process state */

static model_train_config cfg;
static pt_ref ref;
static pt_shared *sh;

/* ---- one rank ----------------------------------------------------------------------------- */

typedef struct layout {
  int tp, pp, dp;
  int hosts_by_stage; /* 1: each pipeline stage on its own host (TCP between stages) */
} layout;

/* dp 3 splits the global batch of 8 unequally (3, 3, 2 sequences: 2, 2 and 1 micro-batches
   of 2; ZeRO 3's third rank adds an empty one), as every survivor of a kill trains */
static const layout layouts[] = {
    {1, 1, 1, 0}, {1, 1, 2, 0}, {1, 1, 4, 0}, {1, 2, 1, 0}, {1, 2, 2, 0}, {1, 2, 4, 0},
    {1, 4, 1, 0}, {1, 4, 2, 0}, {2, 1, 1, 0}, {2, 1, 2, 0}, {2, 1, 4, 0}, {2, 2, 1, 0},
    {2, 2, 2, 0}, {2, 4, 1, 0}, {2, 2, 2, 1}, {1, 1, 3, 0}, {1, 2, 3, 0},
};
#define NLAYOUTS ((int)(sizeof layouts / sizeof layouts[0]))

static int size_of(const layout *L) { return L->tp * L->pp * L->dp; }

/* Addresses of each layout's world, chosen by the parent before forking. */
static ct_world worlds[NLAYOUTS + 8];

static void world_init(ct_world *w, const layout *L, const char *name) {
  ct_world_init(w, size_of(L), CT_SHM, name);
  w->timeout_ms = 60000;
  if (L->hosts_by_stage)
    for (int r = 0; r < w->size; r++) snprintf(w->host_buf[r], sizeof w->host_buf[r], "stage%d", r / (L->tp * L->dp));
}

#define RFAIL(...)                                  \
  do {                                              \
    fprintf(stderr, "rank %d: FAIL ", rank);        \
    fprintf(stderr, __VA_ARGS__);                   \
    fputc('\n', stderr);                            \
    fails++;                                        \
  } while (0)

typedef struct rank_ctx {
  int rank;
  comm_t *world;
  model_par_comms comms;
} rank_ctx;

static int open_world_on(ct_world *w, const layout *L, rank_ctx *rc, int strict) {
  comm_config cc;
  ct_config(w, rc->rank, &cc);
  rc->world = NULL;
  if (comm_create(&cc, &rc->world) != NEWT_OK) {
    fprintf(stderr, "rank %d: comm_create (tp %d pp %d dp %d): %s\n", rc->rank, L->tp, L->pp, L->dp, newt_errmsg());
    return 1;
  }
  if (strict) dev_strict_comm(rc->world);
  model_par_config pc;
  model_par_config_from_rank(&pc, L->tp, L->pp, L->dp, 0, rc->rank);
  if (model_par_comms_split(rc->world, &pc, &rc->comms) != NEWT_OK) {
    fprintf(stderr, "rank %d: model_par_comms_split: %s\n", rc->rank, newt_errmsg());
    comm_free(rc->world);
    rc->world = NULL;
    return 1;
  }
  return 0;
}

static int open_world(ct_world *w, const layout *L, rank_ctx *rc) { return open_world_on(w, L, rc, 0); }

static void close_world(rank_ctx *rc) {
  model_par_comms_free(&rc->comms);
  comm_free(rc->world);
  rc->world = NULL;
}

/* Steps [s0, s1) of the run, compared with the reference; the first mismatch is reported. */
static int train_steps(model_par *p, rank_ctx *rc, const layout *L, int s0, int s1, double *max_dl, double *max_dn) {
  int fails = 0, rank = rc->rank;
  size_t n = (size_t)cfg.batch * cfg.seq_len;
  int32_t *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg);
  for (int s = s0; s < s1; s++) {
    int count;
    model_step_info info;
    if (pt_fetch(&cfg, &p->pc, s, in, tg, &count) != NEWT_OK ||
        model_par_step(p, &rc->comms, in, tg, count, &info) != NEWT_OK) {
      RFAIL("tp %d pp %d dp %d zero %d step %d: %s", L->tp, L->pp, L->dp, p->pc.zero, s + 1, newt_errmsg());
      break;
    }
    double dl = fabs(info.loss - ref.loss[s]), dn = fabs(info.grad_norm - ref.norm[s]) / ref.norm[s];
    if (dl > *max_dl) *max_dl = dl;
    if (dn > *max_dn) *max_dn = dn;
    if (!fails && (!(dl <= LOSS_TOL) || !(dn <= NORM_TOL) || info.step != s + 1))
      RFAIL("tp %d pp %d dp %d zero %d: step %d: loss %.9g, single-process %.9g; grad norm %.9g, single-process "
            "%.9g", L->tp, L->pp, L->dp, p->pc.zero, s + 1, info.loss, ref.loss[s], info.grad_norm, ref.norm[s]);
  }
  free(in);
  free(tg);
  return fails;
}

/* World rank 0: every element covered once by the primary pieces, and the assembled state
 * close to the single-process one's. */
static int check_cover(const model_par *p, int rank, const char *what) {
  int fails = 0;
  const model_layout *g = &p->global;
  const float *want[3] = {ref.params, ref.m, ref.v};
  static const char *const kind[3] = {"params", "adam.m", "adam.v"};
  for (int k = 0; k < 3; k++)
    for (size_t t = 0; t < g->n; t++) {
      const model_tensor *gt = &g->tensors[t];
      double d2 = 0, r2 = 0;
      int bad = 0;
      for (size_t i = 0; i < gt->size; i++) {
        size_t at = (size_t)k * sh->total + gt->offset + i;
        int c = atomic_load(&sh->cnt[at]);
        if (c != 1 && bad++ == 0) RFAIL("%s: %s %s element %zu is covered %d times", what, kind[k], gt->name, i, c);
        double d = (double)sh->val[at] - want[k][gt->offset + i];
        d2 += d * d;
        r2 += (double)want[k][gt->offset + i] * want[k][gt->offset + i];
      }
      double rel = sqrt(d2 / (r2 > 0 ? r2 : 1e-30));
      if (!(rel <= STATE_TOL)) RFAIL("%s: %s %s differs from the single-process state by %.3g (relative RMS)", what,
                                     kind[k], gt->name, rel);
    }
  return fails;
}

/* The pieces of every rank laid over the global tensors; world rank 0 checks them. */
static int check_pieces(const model_par *p, rank_ctx *rc, const char *what) {
  int fails = 0, rank = rc->rank;
  fails += pt_pieces_apply(p, pt_put, sh, 1);
  if (comm_barrier(rc->world) != NEWT_OK) RFAIL("%s: barrier: %s", what, newt_errmsg());
  if (rank == 0) fails += check_cover(p, rank, what);
  int bad = pt_pieces_apply(p, pt_same, sh, 0);
  if (bad) RFAIL("%s: %d elements of replicated pieces differ from their primary copy", what, bad);
  if (comm_barrier(rc->world) != NEWT_OK) RFAIL("%s: barrier: %s", what, newt_errmsg());
  if (rank == 0) memset((void *)sh->cnt, 0, 3 * sh->total * sizeof(int));
  if (comm_barrier(rc->world) != NEWT_OK) RFAIL("%s: barrier: %s", what, newt_errmsg());
  return fails;
}

/* ZeRO 1/2 after a failed parameter all-gather: the chunks other ranks own are garbage, the
 * pieces list the owned chunks (still every element once, still the single-process state),
 * and the next step gathers the parameters again before it runs. */
static int stale_step(model_par *p, rank_ctx *rc, const layout *L, const char *what) {
  int fails = 0, rank = rc->rank;
  for (int u = 0; u < p->nunits; u++)
    for (int d = 0; d < p->pc.dp; d++)
      if (d != p->pc.dp_rank)
        for (size_t i = 0; i < p->units[u].chunk; i++) p->params[p->units[u].off + d * p->units[u].chunk + i] = NAN;
  p->params_stale = 1;
  char w[128];
  snprintf(w, sizeof w, "%s, parameters stale", what);
  fails += check_pieces(p, rc, w);
  double dl = 0, dn = 0;
  fails += train_steps(p, rc, L, STEPS, STEPS + 1, &dl, &dn);
  if (p->params_stale) RFAIL("%s: still stale after a step", w);
  return fails;
}

static int rank_layouts(ct_world *grp, int rank, void *arg) {
  int fails = 0;
  for (int i = 0; i < NLAYOUTS; i++) {
    const layout *L = &layouts[i];
    if (rank < size_of(L)) {
      rank_ctx rc = {.rank = rank};
      if (open_world(&worlds[i], L, &rc)) {
        fails++;
      } else {
        for (int zero = 0; zero <= 3; zero++) {
          model_par_config pc;
          model_par_config_from_rank(&pc, L->tp, L->pp, L->dp, zero, rank);
          model_par p;
          char what[96];
          snprintf(what, sizeof what, "tp %d pp %d dp %d zero %d%s", L->tp, L->pp, L->dp, zero,
                   L->hosts_by_stage ? " (stages over TCP)" : "");
          if (model_par_init(&p, &cfg, &pc) != NEWT_OK) {
            RFAIL("%s: model_par_init: %s", what, newt_errmsg());
            break;
          }
          double t0 = newt_now_s(), dl = 0, dn = 0;
          int f = train_steps(&p, &rc, L, 0, STEPS, &dl, &dn);
          fails += f;
          if (!f) fails += check_pieces(&p, &rc, what);
          if (!f && (zero == 1 || zero == 2)) f = fails += stale_step(&p, &rc, L, what);
          if (rank == 0)
            fprintf(stderr, "  %-36s max |loss - single| %.2e, max norm rel. diff %.2e, %.2f s\n", what, dl, dn,
                    newt_now_s() - t0);
          model_par_free(&p);
          if (f) break;
        }
        close_world(&rc);
      }
    }
    if (!pt_barrier(sh, grp->size)) {
      fprintf(stderr, "rank %d: the barrier after layout %d timed out\n", rank, i);
      return fails + 1;
    }
  }
  return fails;
}

static void run_ranks(ct_rank_fn fn, void *arg, int nranks, int64_t timeout_ms) {
  ct_world grp;
  ct_world_init(&grp, nranks, CT_SHM, "grp");
  ct_spawn(&grp, fn, arg);
  int bad = ct_wait(&grp, timeout_ms, NULL);
  T_CHECK_MSG(bad == 0, "%d rank processes failed", bad);
  ct_world_free(&grp);
}

static void test_layouts(void) {
  for (int i = 0; i < NLAYOUTS; i++) world_init(&worlds[i], &layouts[i], "lay");
  run_ranks(rank_layouts, NULL, PT_MAX_RANKS, 600000);
  for (int i = 0; i < NLAYOUTS; i++) ct_world_free(&worlds[i]);
}

/* ---- resharding through the pieces ------------------------------------------------------------ */

typedef struct transition {
  layout a, b;
  int zero_a, zero_b;
} transition;

static const transition transitions[] = {
    {{2, 2, 2, 0}, {1, 4, 2, 0}, 1, 3},
    {{1, 2, 4, 0}, {2, 1, 2, 0}, 2, 0},
    {{2, 4, 1, 0}, {1, 1, 4, 0}, 3, 1},
    {{1, 1, 4, 0}, {1, 1, 3, 0}, 3, 3}, /* a kill of one of four: three survivors, each trains */
};
#define NTRANS ((int)(sizeof transitions / sizeof transitions[0]))
#define HALF (STEPS / 2)

static int run_half(ct_world *w, const layout *L, int zero, int rank, int second, const char *what) {
  int fails = 0;
  rank_ctx rc = {.rank = rank};
  if (open_world(w, L, &rc)) return 1;
  model_par_config pc;
  model_par_config_from_rank(&pc, L->tp, L->pp, L->dp, zero, rank);
  model_par p;
  if (model_par_init(&p, &cfg, &pc) != NEWT_OK) {
    RFAIL("%s: model_par_init: %s", what, newt_errmsg());
    close_world(&rc);
    return fails;
  }
  double dl = 0, dn = 0;
  if (!second) {
    fails += train_steps(&p, &rc, L, 0, HALF, &dl, &dn);
    fails += pt_pieces_apply(&p, pt_put, sh, 1); /* the "checkpoint" */
  } else {
    fails += pt_pieces_apply(&p, pt_get, sh, 0);
    p.step = HALF;
    p.opt.t = HALF;
    fails += train_steps(&p, &rc, L, HALF, STEPS, &dl, &dn);
    if (rank == 0) fprintf(stderr, "  %-52s max |loss - single| %.2e\n", what, dl);
  }
  model_par_free(&p);
  close_world(&rc);
  return fails;
}

static int rank_reshard(ct_world *grp, int rank, void *arg) {
  int fails = 0;
  for (int i = 0; i < NTRANS; i++) {
    const transition *t = &transitions[i];
    char what[128];
    snprintf(what, sizeof what, "tp %d pp %d dp %d zero %d -> tp %d pp %d dp %d zero %d", t->a.tp, t->a.pp, t->a.dp,
             t->zero_a, t->b.tp, t->b.pp, t->b.dp, t->zero_b);
    if (rank < size_of(&t->a)) fails += run_half(&worlds[2 * i], &t->a, t->zero_a, rank, 0, what);
    if (!pt_barrier(sh, grp->size)) return fails + 1;
    if (rank < size_of(&t->b)) fails += run_half(&worlds[2 * i + 1], &t->b, t->zero_b, rank, 1, what);
    if (!pt_barrier(sh, grp->size)) return fails + 1;
    if (rank == 0) memset((void *)sh->cnt, 0, 3 * sh->total * sizeof(int));
    if (!pt_barrier(sh, grp->size)) return fails + 1;
  }
  return fails;
}

static void test_reshard(void) {
  for (int i = 0; i < NTRANS; i++) {
    world_init(&worlds[2 * i], &transitions[i].a, "rsa");
    world_init(&worlds[2 * i + 1], &transitions[i].b, "rsb");
  }
  run_ranks(rank_reshard, NULL, PT_MAX_RANKS, 300000);
  for (int i = 0; i < 2 * NTRANS; i++) ct_world_free(&worlds[i]);
}

/* ---- the strict device: the trainer never touches device memory from the host ------------------- */

/* Layouts run on the CPU device and on the strict test device (tests/model/dev_strict.h:
 * device memory behind non-canonical pointers, host_visible 0), one after the other in each
 * rank process: the losses, the gradient norms and every piece of the state after the run
 * must be the same bits. Then a reshard through the pieces on the strict device (tp 2 pp 2
 * ZeRO 1 -> tp 1 pp 2 dp 2 ZeRO 3), whose second half must equal the CPU device's bit for
 * bit. A host load or store of the strict device's memory kills the rank (SIGSEGV). */
#define STRICT_STEPS 6

typedef struct strict_case {
  layout L;
  int zero;
} strict_case;

static const strict_case strict_cases[] = {
    {{1, 1, 1, 0}, 0}, {{2, 2, 1, 0}, 1}, {{2, 2, 1, 0}, 3}, {{2, 1, 2, 0}, 2}, {{1, 2, 2, 0}, 3},
};
#define NSTRICT ((int)(sizeof strict_cases / sizeof strict_cases[0]))
static const strict_case strict_from = {{2, 2, 1, 0}, 1}, strict_to = {{1, 2, 2, 0}, 3};

typedef struct strict_run {
  double loss[PT_MAX_STEPS], norm[PT_MAX_STEPS];
  float *state; /* every piece after the run, in piece order */
  size_t nstate;
} strict_run;

/* Steps [s0, s1) of case sc on dev (restored from the shared "checkpoint" when s0 > 0; its
 * pieces put there after the run when put is set). */
static int strict_one(ct_world *w, const strict_case *sc, int rank, model_dev *dev, int s0, int s1, int put,
                      strict_run *out) {
  int fails = 0;
  const layout *L = &sc->L;
  rank_ctx rc = {.rank = rank};
  memset(out, 0, sizeof *out);
  if (open_world_on(w, L, &rc, dev != model_dev_cpu())) return 1;
  model_par_config pc;
  model_par_config_from_rank(&pc, L->tp, L->pp, L->dp, sc->zero, rank);
  pc.dev = dev;
  model_par p;
  if (model_par_init(&p, &cfg, &pc) != NEWT_OK) {
    RFAIL("%s: model_par_init: %s", model_dev_name(dev), newt_errmsg());
    close_world(&rc);
    return fails;
  }
  if (s0 > 0) {
    fails += pt_pieces_apply(&p, pt_get, sh, 0);
    p.step = s0;
    p.opt.t = s0;
  }
  size_t n = (size_t)cfg.batch * cfg.seq_len;
  int32_t *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg);
  for (int s = s0; s < s1 && !fails; s++) {
    int count;
    model_step_info info;
    if (pt_fetch(&cfg, &p.pc, s, in, tg, &count) != NEWT_OK ||
        model_par_step(&p, &rc.comms, in, tg, count, &info) != NEWT_OK) {
      RFAIL("%s: step %d: %s", model_dev_name(dev), s + 1, newt_errmsg());
      break;
    }
    out->loss[s] = info.loss;
    out->norm[s] = info.grad_norm;
    if (!(fabs(info.loss - ref.loss[s]) <= LOSS_TOL))
      RFAIL("%s: step %d: loss %.9g, single-process %.9g", model_dev_name(dev), s + 1, info.loss, ref.loss[s]);
  }
  free(in);
  free(tg);
  if (!fails && put) fails += pt_pieces_apply(&p, pt_put, sh, 1);
  if (!fails && !(out->state = pt_pieces_download(&p, &out->nstate))) RFAIL("downloading the pieces: %s", newt_errmsg());
  model_par_free(&p);
  close_world(&rc);
  return fails;
}

/* The same bits from the CPU device and the strict device. */
static int strict_same(const strict_run *a, const strict_run *b, int s0, int s1, int rank, const char *what) {
  int fails = 0;
  for (int s = s0; s < s1; s++)
    if (memcmp(&a->loss[s], &b->loss[s], sizeof(double)) != 0 || memcmp(&a->norm[s], &b->norm[s], sizeof(double)) != 0) {
      RFAIL("%s: step %d: cpu loss %.17g norm %.17g, strict loss %.17g norm %.17g", what, s + 1, a->loss[s],
            a->norm[s], b->loss[s], b->norm[s]);
      return fails;
    }
  if (a->nstate != b->nstate || memcmp(a->state, b->state, a->nstate * sizeof(float)) != 0)
    RFAIL("%s: the state after the run differs between the cpu and the strict device", what);
  return fails;
}

static int rank_strict(ct_world *grp, int rank, void *arg) {
  (void)arg;
  int fails = 0;
  model_dev *devs[2] = {model_dev_cpu(), dev_strict()};
  for (int i = 0; i < NSTRICT; i++) {
    const strict_case *sc = &strict_cases[i];
    char what[96];
    snprintf(what, sizeof what, "tp %d pp %d dp %d zero %d", sc->L.tp, sc->L.pp, sc->L.dp, sc->zero);
    if (rank < size_of(&sc->L)) {
      strict_run r[2];
      for (int d = 0; d < 2; d++) fails += strict_one(&worlds[2 * i + d], sc, rank, devs[d], 0, STRICT_STEPS, 0, &r[d]);
      if (!fails) fails += strict_same(&r[0], &r[1], 0, STRICT_STEPS, rank, what);
      if (rank == 0 && !fails) fprintf(stderr, "  %-28s cpu and strict device: the same bits\n", what);
      free(r[0].state);
      free(r[1].state);
    }
    if (!pt_barrier(sh, grp->size)) return fails + 1;
  }
  /* a reshard through the pieces, on the strict device */
  strict_run a, b[2];
  if (rank < size_of(&strict_from.L))
    fails += strict_one(&worlds[2 * NSTRICT], &strict_from, rank, devs[1], 0, HALF, 1, &a);
  if (!pt_barrier(sh, grp->size)) return fails + 1;
  if (rank < size_of(&strict_to.L)) {
    for (int d = 0; d < 2; d++)
      fails += strict_one(&worlds[2 * NSTRICT + 1 + d], &strict_to, rank, devs[d], HALF, STEPS, 0, &b[d]);
    if (!fails) fails += strict_same(&b[0], &b[1], HALF, STEPS, rank, "reshard on the strict device");
    if (rank == 0 && !fails)
      fprintf(stderr, "  reshard tp 2 pp 2 zero 1 -> tp 1 pp 2 dp 2 zero 3 on the strict device: the cpu's bits\n");
    free(b[0].state);
    free(b[1].state);
  }
  if (rank < size_of(&strict_from.L)) free(a.state);
  if (!pt_barrier(sh, grp->size)) return fails + 1;
  if (rank == 0) memset((void *)sh->cnt, 0, 3 * sh->total * sizeof(int));
  return fails;
}

static void test_strict_device(void) {
  for (int i = 0; i < NSTRICT; i++)
    for (int d = 0; d < 2; d++) world_init(&worlds[2 * i + d], &strict_cases[i].L, "strict");
  world_init(&worlds[2 * NSTRICT], &strict_from.L, "strict");
  for (int d = 0; d < 2; d++) world_init(&worlds[2 * NSTRICT + 1 + d], &strict_to.L, "strict");
  run_ranks(rank_strict, NULL, 4, 300000);
  for (int i = 0; i < 2 * NSTRICT + 3; i++) ct_world_free(&worlds[i]);
}

/* ---- the pieces against real checkpoints ------------------------------------------------------------ */

static newt_result_t par_ckpt_load(const char *dir, model_par *p) {
  model_par_piece *pcs;
  size_t n;
  NEWT_CHECK(model_par_pieces(p, &pcs, &n));
  ckpt_request *reqs = calloc(n ? n : 1, sizeof *reqs);
  for (size_t i = 0; i < n; i++) reqs[i] = (ckpt_request){.t = pcs[i].desc, .slice = pcs[i].slice, .out = pcs[i].data};
  ckpt_loaded ld = {0};
  newt_result_t r = ckpt_load(dir, CKPT_LATEST, 1, reqs, n, &ld);
  cJSON_Delete(ld.state);
  free(reqs);
  free(pcs);
  return r;
}

static newt_result_t par_ckpt_save(const char *dir, model_par *p, int rank, int nranks, int64_t step,
                                   const cJSON *state) {
  ckpt_saver_opts o = {.dir = dir, .rank = rank, .nranks = nranks, .commit = rank == 0, .attempt = 1,
                       .commit_timeout_ms = 60000};
  ckpt_saver *sv;
  NEWT_CHECK(ckpt_saver_init(&sv, &o));
  model_par_piece *pcs = NULL;
  size_t n = 0;
  int started = 0;
  newt_result_t r = model_par_pieces(p, &pcs, &n);
  if (r == NEWT_OK) r = ckpt_save_begin(sv, step, 0, &started);
  for (size_t i = 0; i < n && r == NEWT_OK; i++)
    if (pcs[i].primary) r = ckpt_save_add(sv, &pcs[i].desc, &pcs[i].slice, pcs[i].data);
  if (started) {
    newt_result_t e = ckpt_save_end(sv, state);
    if (r == NEWT_OK) r = e;
  }
  free(pcs);
  ckpt_saver_free(sv);
  return r;
}

static void test_ckpt(void) {
  char tmpl[] = "/tmp/newt-par-ckpt-XXXXXX";
  char *root = mkdtemp(tmpl);
  T_CHECK(root != NULL);
  if (!root) return;
  char dir_a[512], dir_b[512];
  snprintf(dir_a, sizeof dir_a, "%s/single", root);
  model_trainer tr, back;
  T_OK(model_trainer_init(&tr, &cfg));
  for (int s = 0; s < HALF; s++) T_OK(model_trainer_step_data(&tr, &pt_loader, NULL));
  ckpt_saver_opts o = {.dir = dir_a, .rank = 0, .nranks = 1, .commit = 1};
  ckpt_saver *sv;
  int started = 0;
  T_OK(ckpt_saver_init(&sv, &o));
  T_OK(gpt_ckpt_trainer_save(sv, &tr, "generated", 0, &started));
  T_CHECK(started);
  ckpt_saver_free(sv);
  cJSON *state = NULL;
  T_OK(gpt_ckpt_trainer_state(&tr, "generated", &state));
  static const struct {
    int tp, pp, dp, zero;
  } lays[] = {{2, 2, 2, 1}, {2, 4, 1, 3}, {1, 1, 4, 2}, {1, 2, 1, 0}};
  for (size_t li = 0; li < sizeof lays / sizeof lays[0]; li++) {
    int n = lays[li].tp * lays[li].pp * lays[li].dp;
    model_par p[8];
    snprintf(dir_b, sizeof dir_b, "%s/tp%d-pp%d-dp%d-z%d", root, lays[li].tp, lays[li].pp, lays[li].dp, lays[li].zero);
    /* the single-process checkpoint into every rank, checked through the shared "checkpoint" */
    memset((void *)sh->cnt, 0, 3 * sh->total * sizeof(int));
    memcpy(sh->val, tr.gpt.params, ref.total * sizeof(float));
    memcpy(sh->val + sh->total, tr.opt.m, ref.total * sizeof(float));
    memcpy(sh->val + 2 * sh->total, tr.opt.v, ref.total * sizeof(float));
    for (int r = 0; r < n; r++) {
      model_par_config pc;
      model_par_config_from_rank(&pc, lays[li].tp, lays[li].pp, lays[li].dp, lays[li].zero, r);
      T_OK(model_par_init(&p[r], &cfg, &pc));
      T_OK(par_ckpt_load(dir_a, &p[r]));
      T_CHECK_MSG(pt_pieces_apply(&p[r], pt_same, sh, 0) == 0, "%s rank %d: a piece read differs", dir_b, r);
      p[r].step = tr.step;
      p[r].opt.t = tr.opt.t;
    }
    /* every rank's primary pieces into a checkpoint of n ranks (the committer last) */
    for (int r = n - 1; r >= 0; r--) T_OK(par_ckpt_save(dir_b, &p[r], r, n, tr.step, state));
    T_OK(model_trainer_init(&back, &cfg));
    int64_t step = -1;
    T_OK(gpt_ckpt_trainer_resume(dir_b, &back, "generated", 1, &step));
    T_CHECK_MSG(step == HALF && back.opt.t == tr.opt.t, "%s: resumed step %lld", dir_b, (long long)step);
    T_CHECK_MSG(memcmp(back.gpt.params, tr.gpt.params, ref.total * sizeof(float)) == 0 &&
                    memcmp(back.opt.m, tr.opt.m, ref.total * sizeof(float)) == 0 &&
                    memcmp(back.opt.v, tr.opt.v, ref.total * sizeof(float)) == 0,
                "%s: the state saved by the parallel ranks is not the single-process one", dir_b);
    model_trainer_free(&back);
    for (int r = 0; r < n; r++) model_par_free(&p[r]);
  }
  cJSON_Delete(state);
  model_trainer_free(&tr);
  newt_fs_rm_rf(root);
}

/* ---- one rank, no communicators: the single-process trainer bit for bit ---------------------------- */

static void test_single_rank(void) {
  for (int zero = 0; zero <= 3; zero++) {
    model_par_config pc;
    model_par_config_from_rank(&pc, 1, 1, 1, zero, 0);
    model_par p;
    T_OK(model_par_init(&p, &cfg, &pc));
    T_CHECK(p.local.total == ref.total && p.local.n == p.global.n);
    size_t n = (size_t)cfg.batch * cfg.seq_len;
    int32_t *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg);
    for (int s = 0; s < STEPS; s++) {
      int count;
      model_step_info info;
      T_OK(pt_fetch(&cfg, &pc, s, in, tg, &count));
      T_OK(model_par_step(&p, NULL, in, tg, count, &info));
      if (zero == 0) T_CHECK_MSG(info.loss == ref.loss[s] && info.grad_norm == ref.norm[s],
                                 "zero 0 step %d: loss %.9g norm %.9g, single-process %.9g %.9g", s + 1, info.loss,
                                 info.grad_norm, ref.loss[s], ref.norm[s]);
      else T_NEAR(info.loss, ref.loss[s], LOSS_TOL);
    }
    if (zero == 0) {
      T_CHECK(memcmp(p.params, ref.params, ref.total * sizeof(float)) == 0);
      T_CHECK(memcmp(p.opt.m, ref.m, ref.total * sizeof(float)) == 0);
    }
    free(in);
    free(tg);
    model_par_free(&p);
  }
}

/* ---- a trainer kept across a change of the data-parallel size (ZeRO 0) ----------------------------- */

/* Data-parallel rank 2 of 3 taken, in place, to the only rank of 1 (a survivor's restore
 * moves nothing): the same buffers, and then the single-process trainer bit for bit. What
 * changes more than dp is refused, the trainer untouched. */
static void test_relayout(void) {
  model_par_config pc, one, other;
  model_par_config_from_rank(&pc, 1, 1, 3, 0, 2);
  model_par p;
  T_OK(model_par_init(&p, &cfg, &pc));
  float *params = p.params, *grads = p.grads, *m = p.opt.m;
  model_par_config_from_rank(&other, 2, 1, 1, 0, 0); /* another tensor-parallel slice */
  T_CHECK(model_par_relayout(&p, &other) == NEWT_ERR_UNSUPPORTED && p.pc.dp == 3 && p.pc.tp == 1);
  model_par_config_from_rank(&other, 1, 1, 1, 1, 0); /* ZeRO 1: other buffers */
  T_CHECK(model_par_relayout(&p, &other) == NEWT_ERR_UNSUPPORTED && p.pc.dp == 3);
  newt_err_clear();
  model_par_config_from_rank(&one, 1, 1, 1, 0, 0);
  T_OK(model_par_relayout(&p, &one));
  T_CHECK(p.pc.dp == 1 && p.pc.dp_rank == 0 && p.params == params && p.grads == grads && p.opt.m == m);
  T_CHECK_MSG(p.local.total == ref.total, "ZeRO 0's buffers at dp 3: %zu floats, at dp 1: %zu", p.local.total,
              ref.total);
  size_t n = (size_t)cfg.batch * cfg.seq_len;
  int32_t *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg);
  for (int s = 0; s < STEPS; s++) {
    int count;
    model_step_info info;
    T_OK(pt_fetch(&cfg, &one, s, in, tg, &count));
    T_OK(model_par_step(&p, NULL, in, tg, count, &info));
    T_CHECK_MSG(info.loss == ref.loss[s] && info.grad_norm == ref.norm[s],
                "after the relayout, step %d: loss %.9g norm %.9g, single-process %.9g %.9g", s + 1, info.loss,
                info.grad_norm, ref.loss[s], ref.norm[s]);
  }
  T_CHECK(memcmp(p.params, ref.params, ref.total * sizeof(float)) == 0);
  free(in);
  free(tg);
  model_par_free(&p);
}

/* ---- the pipeline with messages larger than the shared-memory rings -------------------------------- */

static model_train_config big_cfg;
static pt_ref big_ref;

static int rank_unbuffered(ct_world *w, int rank, void *arg) {
  const layout *L = arg;
  int fails = 0;
  setenv("NEWT_COMM_SHM_RING", "65536", 1); /* the smallest ring; a boundary message is 128 KiB */
  rank_ctx rc = {.rank = rank};
  if (open_world(w, L, &rc)) return 1;
  model_par_config pc;
  model_par_config_from_rank(&pc, L->tp, L->pp, L->dp, 0, rank);
  model_par p;
  if (model_par_init(&p, &big_cfg, &pc) != NEWT_OK) {
    RFAIL("model_par_init: %s", newt_errmsg());
  } else {
    size_t n = (size_t)big_cfg.batch * big_cfg.seq_len;
    int32_t *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg);
    for (int s = 0; s < big_ref.steps; s++) {
      int count;
      model_step_info info;
      int64_t first, cnt;
      model_batch_slice(big_cfg.batch, pc.dp_rank, pc.dp, &first, &cnt);
      count = (int)cnt;
      if (model_loader_fetch(&pt_loader, (uint64_t)s * big_cfg.batch + (uint64_t)first, cnt, in, tg) != NEWT_OK ||
          model_par_step(&p, &rc.comms, in, tg, count, &info) != NEWT_OK) {
        RFAIL("pp %d step %d: %s", L->pp, s + 1, newt_errmsg());
        break;
      }
      if (!(fabs(info.loss - big_ref.loss[s]) <= LOSS_TOL))
        RFAIL("pp %d step %d: loss %.9g, single-process %.9g", L->pp, s + 1, info.loss, big_ref.loss[s]);
    }
    free(in);
    free(tg);
    model_par_free(&p);
  }
  close_world(&rc);
  return fails;
}

static void test_pipeline_unbuffered(void) {
  big_cfg = cfg;
  model_config_override(&big_cfg.model, "channels=128");
  big_cfg.batch = 32;
  big_cfg.micro_batch = 8; /* 8 x 32 x 128 floats = 128 KiB per boundary message, 4 micro-batches */
  big_cfg.optim = model_adamw_defaults(3);
  pt_reference(&big_cfg, 3, 3, &big_ref);
  const layout pls[] = {{1, 2, 1, 0}, {1, 4, 1, 0}};
  for (int i = 0; i < 2; i++) {
    ct_world w;
    world_init(&w, &pls[i], "unbuf");
    ct_spawn(&w, rank_unbuffered, (void *)&pls[i]);
    int bad = ct_wait(&w, 120000, NULL);
    T_CHECK_MSG(bad == 0, "pp %d: %d rank processes failed (a deadlock times out)", pls[i].pp, bad);
    ct_world_free(&w);
  }
  free(big_ref.params);
  free(big_ref.m);
  free(big_ref.v);
}

/* ---- newt bench train with a layout ------------------------------------------------------------------ */

static int run_newt(const char *out, const char *const *args) {
  const char *bin = getenv("NEWT_BIN");
  const char *argv[32] = {bin ? bin : "build/newt"};
  int n = 1;
  for (; args[n - 1] && n < 31; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  newt_spawn_opts o = {.log_path = out, .die_with_parent = 1};
  pid_t pid;
  int st = 0;
  if (newt_proc_spawn(argv, &o, &pid) != NEWT_OK || newt_proc_wait(pid, 120000, &st) != NEWT_OK) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_bench(void) {
  char tmpl[] = "/tmp/newt-par-bench-XXXXXX", log[256];
  char *dir = mkdtemp(tmpl);
  T_CHECK(dir != NULL);
  if (!dir) return;
  snprintf(log, sizeof log, "%s/out", dir);
  T_CHECK(run_newt(log, (const char *[]){"bench", "train", "--model", "layers=2,ctx=32", "--batch", "8", "--tp", "2",
                                         "--pp", "2", "--dp", "2", "--zero", "3", "--steps", "2", "--warmup", "1", NULL}) == 0);
  char *out = NULL;
  size_t n = 0;
  T_OK(newt_fs_read_all(log, 1 << 20, &out, &n));
  T_CHECK_MSG(out && strstr(out, "{\"bench\":\"train\",\"preset\":\"tiny\",\"threads\":1,\"tp\":2,\"pp\":2,\"dp\":2,"
                                 "\"zero\":3,\"ranks\":8,\"batch\":8,\"micro_batch\":2,") &&
                  strstr(out, "\"tokens_per_s\":") && strstr(out, "\"state_bytes\":"),
              "%s", out ? out : "");
  free(out);
  T_CHECK(run_newt(log, (const char *[]){"bench", "train", "--tp", "3", NULL}) == 2); /* 3 does not divide 4 heads */
  out = NULL;
  T_OK(newt_fs_read_all(log, 1 << 20, &out, &n));
  T_CHECK_MSG(out && strstr(out, "parallel.tp"), "%s", out ? out : "");
  free(out);
  newt_fs_rm_rf(dir);
}

/* ---- refusals ----------------------------------------------------------------------------------------- */

static void expect_invalid(int tp, int pp, int dp, int zero, const model_train_config *c, const char *field) {
  model_par_config pc;
  model_par_config_from_rank(&pc, tp, pp, dp, zero, 0);
  model_par p;
  T_ERR(NEWT_ERR_INVALID, model_par_init(&p, c, &pc));
  T_CHECK_MSG(strstr(newt_errmsg(), field) != NULL, "\"%s\" does not name %s", newt_errmsg(), field);
}

static void test_refusals(void) {
  expect_invalid(3, 1, 1, 0, &cfg, "parallel.tp");  /* 3 does not divide 4 heads */
  expect_invalid(1, 5, 1, 0, &cfg, "parallel.pp");  /* 5 stages, 4 layers */
  expect_invalid(1, 1, 9, 0, &cfg, "parallel.dp");  /* 9 ranks, 8 sequences */
  expect_invalid(1, 1, 1, 4, &cfg, "parallel.zero");
  model_train_config odd = cfg;
  odd.model.vocab = 255;
  expect_invalid(2, 1, 1, 0, &odd, "model.vocab");
  /* a rank outside the layout */
  model_par_config pc = {.tp = 1, .pp = 1, .dp = 2, .dp_rank = 2};
  model_par p;
  T_ERR(NEWT_ERR_INVALID, model_par_init(&p, &cfg, &pc));
  /* a step with the wrong slice, or without the communicators the layout needs */
  model_par_config_from_rank(&pc, 1, 1, 2, 0, 1);
  T_OK(model_par_init(&p, &cfg, &pc));
  int32_t x[8 * 32] = {0};
  T_ERR(NEWT_ERR_INVALID, model_par_step(&p, NULL, x, x, 3, NULL));
  T_CHECK(strstr(newt_errmsg(), "takes 4") != NULL);
  T_ERR(NEWT_ERR_INVALID, model_par_step(&p, NULL, x, x, 4, NULL));
  T_CHECK(strstr(newt_errmsg(), "communicators") != NULL);
  T_CHECK(p.step == 0);
  model_par_free(&p);
  /* ZeRO 3 needs as many micro-batches on every data-parallel rank */
  model_train_config uneven = cfg;
  uneven.batch = 10;
  model_par_config_from_rank(&pc, 1, 1, 4, 3, 0);
  T_OK(model_par_init(&p, &uneven, &pc));
  model_par_comms none = {0};
  T_ERR(NEWT_ERR_INVALID, model_par_step(&p, &none, x, x, 3, NULL));
  model_par_free(&p);
  int l0, l1;
  model_par_stage_layers(6, 4, 0, &l0, &l1);
  T_CHECK(l0 == 0 && l1 == 2);
  model_par_stage_layers(6, 4, 3, &l0, &l1);
  T_CHECK(l0 == 5 && l1 == 6);
}

int main(int argc, char **argv) {
  cfg = pt_config(STEPS);
  pt_data_init(&cfg);
  pt_reference(&cfg, STEPS + 1, STEPS, &ref);
  model_layout g;
  T_OK(model_layout_init(&g, &cfg.model));
  sh = pt_shared_new(g.total);
  model_layout_free(&g);
  const char *only = argc > 1 ? argv[1] : NULL;
  if (!only || strcmp(only, "single") == 0) T_RUN(test_single_rank);
  if (!only || strcmp(only, "refusals") == 0) T_RUN(test_refusals);
  if (!only || strcmp(only, "relayout") == 0) T_RUN(test_relayout);
  if (!only || strcmp(only, "bench") == 0) T_RUN(test_bench);
  if (!only || strcmp(only, "ckpt") == 0) T_RUN(test_ckpt);
  if (!only || strcmp(only, "unbuffered") == 0) T_RUN(test_pipeline_unbuffered);
  if (!only || strcmp(only, "layouts") == 0) T_RUN(test_layouts);
  if (!only || strcmp(only, "reshard") == 0) T_RUN(test_reshard);
  if (!only || strcmp(only, "strict") == 0) T_RUN(test_strict_device);
  free(ref.params);
  free(ref.m);
  free(ref.v);
  model_tokens_close(&pt_corpus);
  return T_DONE();
}
