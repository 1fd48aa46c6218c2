/* The worker's state moves (worker/state.c) on a device whose memory the host cannot touch:
 * the strict test device (tests/model/dev_strict.h) against the CPU device, with 2 real rank
 * processes over the CPU backend. Each rank trains 3 steps of tp 1 pp 1 dp 2 ZeRO 1 with the
 * worker's pre-step snapshot (taken on commit, a device-to-device copy) and the ZeRO replica
 * (host memory) after every step, then loses state and restores under tp 2 ZeRO 3 through
 * worker_restore (reshard through host staging, uploaded), and trains 2 more steps:
 *
 *   - rank 1 lost its state: step 3 is whole from rank 0's state and its replica of rank 1's
 *     shard (the replica path);
 *   - both lost their state: step 2 is whole from the two snapshots (the snapshot path);
 *   - both lost everything but the checkpoint the worker saved at step 3 (worker/save.c:
 *     pieces downloaded into the saver's staging, which a thread reserved in the worker's
 *     pool after step 1 -- check_staging) and it is read back (worker/state.c:
 *     read into host staging, uploaded); then two more generations of the second layout,
 *     each a new saver, a save and a restore from memory: on the strict device the staging
 *     of both is pinned memory of the worker's pool (the strict device refuses a queued
 *     download anywhere else) and the second pins nothing (the pool kept what the first
 *     gave back); on the CPU device the saver's staging comes from the pool too, and the
 *     second generation allocates none either.
 *
 * Each scenario must follow the single-process losses, and give the same restored step, the
 * same losses and the same final state, bit for bit, on both devices; a host access to
 * strict device memory kills the rank. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"

#include "parallel/par_test.h"
#include "worker/internal.h"

#define PRE 3
#define POST 2

static model_train_config cfg;
static pt_ref ref;
static char root[64]; /* the scenario with a checkpoint: <root>/cpu, <root>/strict */

typedef struct outcome {
  int64_t restored;
  double loss[PRE + POST];
  float *state;
  size_t nstate;
} outcome;

static newt_result_t on_commit(void *arg) { return worker_snapshot(arg); }

static int step(worker *w, int s, double *loss) {
  int count;
  model_step_info info;
  model_par_step_opts o = {.on_commit = on_commit, .arg = w};
  if (pt_fetch(&cfg, &w->par.pc, s, w->inputs, w->targets, &count) != NEWT_OK ||
      model_par_step(&w->par, &w->comms, w->inputs, w->targets, count, &o, &info) != NEWT_OK ||
      worker_replicate(w) != NEWT_OK) {
    fprintf(stderr, "%s: step %d: %s\n", model_dev_name(w->dev), s + 1, newt_errmsg());
    return 1;
  }
  *loss = info.loss;
  if (!(fabs(info.loss - ref.loss[s]) <= 1e-5)) {
    fprintf(stderr, "%s: step %d: loss %.9g, single-process %.9g\n", model_dev_name(w->dev), s + 1, info.loss,
            ref.loss[s]);
    return 1;
  }
  return 0;
}

/* Generations 3 and 4 of plan's layout (pc): a new saver, a save of the step the rank is at,
 * and a restore from memory each. The second must take no new block from the device (on the
 * strict device: pin no host memory), its staging coming from what the pool kept. */
static int more_generations(worker *w, comm_t *world, int rank, const newt_plan *plan, const model_par_config *pc,
                            int strict) {
  w->spec.ckpt_every = 1; /* the step it is at is saved */
  size_t pinned[3];
  uint64_t pool_allocs[3] = {0, 0, 0};
  int fails = 0;
  for (int g = 0; g < 2 && !fails; g++) {
    pinned[g] = dev_strict_host_allocs();
    worker_pinned_stats sg = {0};
    if (w->pinned) worker_pinned_stats_get(w->pinned, &sg);
    pool_allocs[g] = sg.allocs;
    newt_plan pg = *plan;
    pg.generation = 3 + (uint64_t)g;
    pg.nranks = 2;
    plan_rank me = {.rank = rank};
    newt_result_t r = worker_ckpt_generation(w, &pg, &me);
    if (r == NEWT_OK) r = worker_ckpt_step(w, &pg, &me);
    if (r == NEWT_OK) r = ckpt_save_wait(w->saver, newt_deadline_in_ms(60000));
    if (r == NEWT_OK) r = worker_restore(w, world, &pg, pc);
    if (r != NEWT_OK) {
      fprintf(stderr, "rank %d: generation %d: %s\n", rank, 3 + g, newt_errmsg());
      fails++;
    }
  }
  pinned[2] = dev_strict_host_allocs();
  if (fails) return fails;
  worker_pinned_stats st = {0};
  if (w->pinned) worker_pinned_stats_get(w->pinned, &st);
  pool_allocs[2] = st.allocs;
  if (!strict) {
    if (!w->pinned || st.reused == 0 || pool_allocs[2] != pool_allocs[1]) {
      fprintf(stderr, "rank %d: FAIL the CPU device's saver staging: %s, %llu requests met from kept blocks, "
              "generation 4 allocated %llu blocks (want 0)\n", rank, w->pinned ? "a pool" : "no pool",
              (unsigned long long)st.reused, (unsigned long long)(pool_allocs[2] - pool_allocs[1]));
      fails++;
    }
    return fails;
  }
  if (!w->pinned || st.allocs == 0 || st.reused == 0 || pinned[2] != pinned[1] || pool_allocs[2] != pool_allocs[1]) {
    fprintf(stderr, "rank %d: FAIL pinned pool: %llu blocks pinned, %llu requests met from kept blocks; generation 3 "
            "pinned %zu blocks, generation 4 %zu (want 0)\n", rank, (unsigned long long)st.allocs,
            (unsigned long long)st.reused, pinned[1] - pinned[0], pinned[2] - pinned[1]);
    fails++;
  } else if (rank == 0) {
    fprintf(stderr, "  pinned pool: %llu blocks (%zu bytes) pinned in 4 generations, %llu requests met from kept "
            "blocks, none pinned by generation 4\n", (unsigned long long)st.allocs, st.bytes,
            (unsigned long long)st.reused);
  }
  return fails;
}

/* The saver's staging of a generation whose pool does not hold it yet (worker/save.c): after
 * the first step (step 1, no save due) a thread of its own reserves it in the pool, while
 * this one goes on -- on the CPU device, where nothing else takes pool memory, the pool
 * gains a block with no further call (on the strict device the replica's block may be
 * there to take) -- and the save at step PRE takes what the pool holds, allocating nothing
 * itself (before, it allocated its staging in the step loop). `before`: the pool as it was
 * before this step's worker_ckpt_step. */
static int check_staging(worker *w, int rank, int s, const worker_pinned_stats *before) {
  worker_pinned_stats now = {0};
  if (s == 1 && w->dev == model_dev_cpu()) {
    for (newt_deadline_t d = newt_deadline_in_ms(20000); !newt_deadline_passed(d); newt_sleep_ms(2)) {
      if (w->pinned) worker_pinned_stats_get(w->pinned, &now);
      if (now.allocs > before->allocs) return 0;
    }
    fprintf(stderr, "rank %d: FAIL the saver's staging was not reserved after the first step (%s, %llu blocks)\n",
            rank, w->pinned ? "a pool" : "no pool", (unsigned long long)now.allocs);
    return 1;
  }
  if (s != PRE) return 0;
  if (w->pinned) worker_pinned_stats_get(w->pinned, &now);
  if (now.allocs == before->allocs && now.reused > before->reused) return 0;
  fprintf(stderr, "rank %d: FAIL the save of step %d allocated %llu blocks and took %llu kept ones (want 0 and 1 or "
          "more: the staging reserved after step 1)\n", rank, s, (unsigned long long)(now.allocs - before->allocs),
          (unsigned long long)(now.reused - before->reused));
  return 1;
}

/* One scenario on one device: 0 rank 1 loses its state, 1 both do, 2 both lose all but the
 * checkpoint. */
static int run(ct_world *cw, int rank, model_dev *dev, int scenario, outcome *out) {
  memset(out, 0, sizeof *out);
  comm_config cc;
  ct_config(cw, rank, &cc);
  comm_t *world = NULL;
  if (comm_create(&cc, &world) != NEWT_OK) {
    fprintf(stderr, "rank %d: comm_create: %s\n", rank, newt_errmsg());
    return 1;
  }
  if (dev != model_dev_cpu()) dev_strict_comm(world);
  static worker w;
  memset(&w, 0, sizeof w);
  snprintf(w.id, sizeof w.id, "rank%d", rank);
  w.tcfg = cfg;
  w.spec.replica_every = 1;
  w.spec.global_batch = cfg.batch;
  w.dev = dev;
  w.snap.step = w.rep.step = -1;
  static worker_opts wo = {.job = "state-dev"};
  w.o = &wo;
  newt_plan plan_a = {.generation = 1, .tp = 1, .pp = 1, .dp = 2, .zero = 1, .nranks = 2};
  plan_rank me = {.rank = rank};
  if (scenario == 2) {
    snprintf(w.spec.ckpt_dir, sizeof w.spec.ckpt_dir, "%s/%s", root, dev == model_dev_cpu() ? "cpu" : "strict");
    w.spec.ckpt_every = PRE;
    w.spec.ckpt_keep = 2;
  }
  size_t n = (size_t)cfg.batch * cfg.seq_len;
  w.inputs = malloc(n * sizeof *w.inputs);
  w.targets = malloc(n * sizeof *w.targets);
  int fails = 0;
  model_par_config pc;
  model_par_config_from_rank(&pc, 1, 1, 2, 1, rank);
  pc.dev = dev;
  if (model_par_comms_split(world, &pc, &w.comms) != NEWT_OK || model_par_init(&w.par, &cfg, &pc) != NEWT_OK) {
    fprintf(stderr, "rank %d: layout A: %s\n", rank, newt_errmsg());
    fails = 1;
    goto exit;
  }
  w.have_par = w.has_state = 1;
  if (worker_ckpt_generation(&w, &plan_a, &me) != NEWT_OK) {
    fprintf(stderr, "rank %d: checkpoint saver: %s\n", rank, newt_errmsg());
    fails = 1;
    goto exit;
  }
  for (int s = 0; s < PRE && !fails; s++) {
    fails += step(&w, s, &out->loss[s]);
    worker_pinned_stats before = {0};
    if (w.pinned) worker_pinned_stats_get(w.pinned, &before);
    if (!fails && worker_ckpt_step(&w, &plan_a, &me) != NEWT_OK) {
      fprintf(stderr, "rank %d: checkpoint of step %d: %s\n", rank, s + 1, newt_errmsg());
      fails = 1;
    }
    if (!fails && scenario == 2) fails += check_staging(&w, rank, s + 1, &before);
  }
  worker_ckpt_free(&w); /* waits for the save in flight */
  if (fails) goto exit;
  if (scenario >= 1 || rank == 1) w.has_state = 0; /* its state is gone; snapshot and replica stay */
  if (scenario == 2) w.snap.step = w.rep.step = -1; /* and them too */
  model_par_comms_free(&w.comms);
  model_par_config_from_rank(&pc, 2, 1, 1, 3, rank);
  pc.dev = dev;
  newt_plan plan = {.generation = 2, .tp = 2, .pp = 1, .dp = 1, .zero = 3, .step = PRE};
  if (model_par_comms_split(world, &pc, &w.comms) != NEWT_OK || worker_restore(&w, world, &plan, &pc) != NEWT_OK) {
    fprintf(stderr, "rank %d: restore under layout B: %s\n", rank, newt_errmsg());
    fails = 1;
    goto exit;
  }
  out->restored = w.par.step;
  for (int s = (int)out->restored; s < (int)out->restored + POST && !fails; s++) fails += step(&w, s, &out->loss[s]);
  if (!fails && !(out->state = pt_pieces_download(&w.par, &out->nstate))) fails = 1;
  if (!fails && scenario == 2) fails += more_generations(&w, world, rank, &plan, &pc, dev != model_dev_cpu());
exit:
  worker_ckpt_free(&w);
  for (int i = 0; i < WORKER_PUB_SLOTS; i++) free(w.pub[i].value);
  worker_state_free(&w);
  model_par_comms_free(&w.comms);
  free(w.inputs), free(w.targets);
  comm_free(world);
  return fails;
}

#define NSCEN 3
static ct_world worlds[2 * NSCEN];

static int rank_main(ct_world *grp, int rank, void *arg) {
  (void)grp, (void)arg;
  int fails = 0;
  model_dev *devs[2] = {model_dev_cpu(), dev_strict()};
  static const char *const what[NSCEN] = {"rank 1 lost its state (replica)", "both lost their state (snapshots)",
                                           "both lost all but the checkpoint"};
  static const int64_t want[NSCEN] = {PRE, PRE - 1, PRE};
  for (int sc = 0; sc < NSCEN; sc++) {
    outcome o[2];
    for (int d = 0; d < 2; d++) fails += run(&worlds[2 * sc + d], rank, devs[d], sc, &o[d]);
    if (!fails) {
      int same = o[0].restored == o[1].restored && o[0].nstate == o[1].nstate &&
                 memcmp(o[0].loss, o[1].loss, sizeof o[0].loss) == 0 &&
                 memcmp(o[0].state, o[1].state, o[0].nstate * sizeof(float)) == 0;
      if (o[0].restored != want[sc] || !same) {
        fprintf(stderr, "rank %d: FAIL %s: restored step %lld (cpu) and %lld (strict), want %lld; %s\n", rank, what[sc],
                (long long)o[0].restored, (long long)o[1].restored, (long long)want[sc],
                same ? "same bits" : "the devices differ");
        fails++;
      } else if (rank == 0) {
        fprintf(stderr, "  %s: restored step %lld, the strict device gives the cpu's bits\n", what[sc],
                (long long)o[0].restored);
      }
    }
    free(o[0].state), free(o[1].state);
  }
  return fails;
}

static void test_state_moves(void) {
  snprintf(root, sizeof root, "/tmp/newt-state-dev-XXXXXX");
  T_CHECK(mkdtemp(root) != NULL);
  for (int i = 0; i < 2 * NSCEN; i++) {
    ct_world_init(&worlds[i], 2, CT_SHM, "state");
    worlds[i].timeout_ms = 60000;
  }
  ct_world grp;
  ct_world_init(&grp, 2, CT_SHM, "grp");
  ct_spawn(&grp, rank_main, NULL);
  T_CHECK_MSG(ct_wait(&grp, 120000, NULL) == 0, "rank processes failed");
  ct_world_free(&grp);
  for (int i = 0; i < 2 * NSCEN; i++) ct_world_free(&worlds[i]);
  newt_fs_rm_rf(root);
}

int main(void) {
  cfg = pt_config(PRE + POST);
  pt_data_init(&cfg);
  pt_reference(&cfg, PRE + POST, PRE + POST, &ref);
  T_RUN(test_state_moves);
  free(ref.params), free(ref.m), free(ref.v);
  model_tokens_close(&pt_corpus);
  return T_DONE();
}
