/* The worker's state moves (worker/state.c, save.c) on a device whose memory the host cannot
 * touch: the strict test device (tests/model/dev_strict.h) against the CPU device, with 2
 * real rank processes over the CPU backend. The state is the parallel trainer's pieces,
 * declared as libnewt state the way the GPT worker does (gpt/worker.c), its memory copied
 * through the device (a newt_memory over the model device). Each rank trains 3 steps of tp 1
 * pp 1 dp 2 ZeRO 1 through the step protocol (worker_commit: the world's sums and the
 * pre-update snapshot, a device-to-device copy; worker_end: the replica of the neighbour's
 * unique parts, host memory, and the checkpoint), then loses state and restores under tp 2
 * ZeRO 3 through worker_restore (reshard through host staging, uploaded), and trains 2 more:
 *
 *   - rank 1 lost its state: step 3 is whole from rank 0's state and its replica of rank 1's
 *     shard (the replica path);
 *   - both lost their state: step 2 is whole from the two snapshots (the snapshot path);
 *   - both lost everything but the checkpoint saved at step 3 (parts downloaded into the
 *     saver's staging, which a thread reserved in the worker's pool after step 1 --
 *     check_staging) and it is read back (read into host staging, uploaded); then two more
 *     generations of the second layout, each a new saver, a save and a restore from memory:
 *     on the strict device the staging of both is pinned memory of the worker's pool (the
 *     strict device refuses a queued download anywhere else) and the second pins nothing
 *     (the pool kept what the first gave back); with host memory the saver's staging comes
 *     from the pool too, and the second generation allocates none either.
 *
 * Each scenario must follow the single-process losses, and give the same restored step, the
 * same losses and the same final state, bit for bit, on both devices; a host access to
 * strict device memory kills the rank. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "gpt/gpt.h"
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

/* The rank's trainer, its groups and the worker that keeps its state. */
typedef struct rank_state {
  worker w;
  model_dev *dev;
  model_par par, old; /* old: the trainer of the last layout, the restore's source */
  int have_par, have_old;
  model_par_comms comms;
  int32_t *inputs, *targets;
} rank_state;

/* --- a generation: the layout's groups, the plan, the declaration ----------------------------- */

/* The worker's generation of layout (tp, dp, zero) over `world`: its plan, its groups (the
 * trainer's are the worker's), its trainer's pieces declared. */
static newt_result_t generation(rank_state *rs, comm_t *world, int rank, uint64_t gen, int tp, int dp, int zero,
                                int64_t step) {
  worker *w = &rs->w;
  plan_free(&w->plan);
  memset(&w->plan, 0, sizeof w->plan);
  w->plan = (newt_plan){.generation = gen, .tp = tp, .pp = 1, .dp = dp, .zero = zero, .nranks = 2, .step = step,
                        .global_batch = cfg.batch};
  snprintf(w->plan.switch_mode, sizeof w->plan.switch_mode, "boundary");
  w->plan.ranks = calloc(2, sizeof *w->plan.ranks);
  if (!w->plan.ranks) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory");
  for (int r = 0; r < 2; r++) w->plan.ranks[r].rank = r;
  w->me = &w->plan.ranks[rank];
  w->all = w->train = world;
  model_par_config pc;
  model_par_config_from_rank(&pc, tp, 1, dp, zero, rank);
  pc.dev = rs->dev;
  model_par_comms_free(&rs->comms);
  NEWT_CHECK(model_par_comms_split(world, &pc, &rs->comms));
  w->dp = rs->comms.dp;
  w->tp_rank = pc.tp_rank, w->dp_rank = pc.dp_rank, w->pp_rank = 0;
  if (!rs->have_par || rs->par.pc.tp != tp || rs->par.pc.dp != dp || rs->par.pc.zero != zero) {
    if (rs->have_par) { /* kept until the restore has read it */
      if (rs->have_old) model_par_free(&rs->old);
      rs->old = rs->par;
      rs->have_old = 1;
    }
    NEWT_CHECK(model_par_alloc(&rs->par, &cfg, &pc));
    rs->have_par = 1;
  }
  /* the state of the last generation is the source; this one declares the trainer's pieces */
  if (w->state_in_decl) {
    worker_decl_free(&w->prev);
    w->prev = w->decl;
    memset(&w->decl, 0, sizeof w->decl);
    w->state_in_decl = 0;
  }
  model_par_piece *pp = NULL;
  size_t n = 0;
  NEWT_CHECK(model_par_pieces(&rs->par, &pp, &n));
  newt_result_t r = NEWT_OK;
  for (size_t i = 0; r == NEWT_OK && i < n; i++) {
    reshard_piece p;
    memset(&p, 0, sizeof p);
    snprintf(p.name, sizeof p.name, "%s", pp[i].desc.name);
    p.ndim = pp[i].desc.ndim;
    memcpy(p.shape, pp[i].desc.shape, sizeof p.shape);
    p.slice = pp[i].slice;
    p.data = pp[i].data;
    p.flags = WORKER_PART_DEVICE | (pp[i].derived ? RESHARD_DERIVED : 0);
    r = worker_declare(w, &p);
  }
  free(pp);
  w->phase = PHASE_BUILT;
  return r;
}

/* The restore of a generation, and the trainer's step and AdamW count from it. */
static newt_result_t restore(rank_state *rs) {
  newt_restore_info ri = {.size = sizeof ri};
  NEWT_CHECK(worker_restore(&rs->w, &ri));
  NEWT_CHECK(worker_restored(&rs->w));
  if (ri.source == NEWT_FROM_NOTHING) return NEWT_ERR(NEWT_ERR_INTERNAL, "nothing to restore from");
  if (rs->have_old) model_par_free(&rs->old);
  rs->have_old = 0;
  rs->par.step = ri.step;
  rs->par.opt.t = ri.step;
  rs->par.params_stale = 0;
  return NEWT_OK;
}

/* --- a step through the protocol ------------------------------------------------------------- */

static int step(rank_state *rs, int s, double *loss) {
  worker *w = &rs->w;
  int count;
  model_step_info info;
  double part[2], sums[2];
  w->step = STEP_BEGUN;
  newt_step_result res = {.size = sizeof res};
  newt_result_t r = pt_fetch(&cfg, &rs->par.pc, s, rs->inputs, rs->targets, &count);
  if (r == NEWT_OK) r = model_par_grads(&rs->par, &rs->comms, rs->inputs, rs->targets, count, part);
  if (r == NEWT_OK) r = worker_commit(w, part, sums, 2);
  if (r == NEWT_OK) r = res.after = model_par_apply(&rs->par, &rs->comms, sums, &info);
  if (r == NEWT_OK) res.loss = info.loss, r = worker_end(w, &res);
  if (r != NEWT_OK) {
    fprintf(stderr, "%s: step %d: %s\n", model_dev_name(rs->dev), s + 1, newt_errmsg());
    return 1;
  }
  *loss = info.loss;
  if (!(fabs(info.loss - ref.loss[s]) <= 1e-5)) {
    fprintf(stderr, "%s: step %d: loss %.9g, single-process %.9g\n", model_dev_name(rs->dev), s + 1, info.loss,
            ref.loss[s]);
    return 1;
  }
  return 0;
}

/* Generations 3 and 4 of the second layout: a new saver, a save of the step the rank is at,
 * and a restore from memory each. The second must take no new block from the device (on the
 * strict device: pin no host memory), its staging coming from what the pool kept. */
static int more_generations(rank_state *rs, comm_t *world, int rank, int strict) {
  worker *w = &rs->w;
  w->spec.ckpt_every = 1; /* the step it is at is saved */
  size_t pinned[3];
  uint64_t pool_allocs[3] = {0, 0, 0};
  int fails = 0;
  for (int g = 0; g < 2 && !fails; g++) {
    pinned[g] = dev_strict_host_allocs();
    worker_pinned_stats sg = {0};
    if (w->pinned) worker_pinned_stats_get(w->pinned, &sg);
    pool_allocs[g] = sg.allocs;
    newt_result_t r = generation(rs, world, rank, 3 + (uint64_t)g, 2, 1, 3, rs->par.step);
    if (r == NEWT_OK) r = restore(rs);
    if (r == NEWT_OK) r = worker_ckpt_step(w);
    if (r == NEWT_OK) r = ckpt_save_wait(w->saver, newt_deadline_in_ms(60000));
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
      fprintf(stderr, "rank %d: FAIL host memory's saver staging: %s, %llu requests met from kept blocks, "
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
 * this one goes on -- with host memory, where nothing else takes pool memory, the pool gains
 * a block with no further call -- and the save at step PRE takes what the pool holds,
 * allocating nothing itself. `before`: the pool as it was before this step's end. */
static int check_staging(rank_state *rs, int rank, int s, const worker_pinned_stats *before) {
  worker *w = &rs->w;
  worker_pinned_stats now = {0};
  if (s == 1 && rs->dev == model_dev_cpu()) {
    /* the reservation done (it may take more than one block), not merely begun */
    for (newt_deadline_t d = newt_deadline_in_ms(20000); !newt_deadline_passed(d); newt_sleep_ms(2)) {
      if (w->pinned) worker_pinned_stats_get(w->pinned, &now);
      if (atomic_load(&w->stage_filled) && now.allocs > before->allocs) return 0;
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

/* The scenario's losses: 0 rank 1 loses its state, 1 both do, 2 both lose all but the
 * checkpoint. */
static void lose(rank_state *rs, int scenario, int rank) {
  worker *w = &rs->w;
  if (scenario >= 1 || rank == 1) { /* its state is gone; snapshot and replica stay */
    w->has_state = 0;
    model_par_free(&rs->par);
    rs->have_par = 0;
  }
  if (scenario == 2) w->snap.step = w->rep[0].step = w->rep[0].spare_step = -1; /* and them too */
}

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
  static rank_state rs;
  memset(&rs, 0, sizeof rs);
  rs.dev = dev;
  worker *w = &rs.w;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  snprintf(w->id, sizeof w->id, "rank%d", rank);
  w->o.job = "state-dev";
  w->spec.replica_every = 1;
  w->spec.global_batch = cfg.batch;
  w->spec.steps = PRE + POST;
  w->step_log_fd = -1;
  w->snap.step = w->snap.spare_step = -1;
  for (int j = 0; j < SPEC_REPLICAS_MAX; j++) w->rep[j].step = w->rep[j].spare_step = -1;
  if (dev == model_dev_cpu()) {
    worker_mem_host(&w->o.memory);
  } else {
    gpt_dev_memory(dev, &w->o.memory); /* as gpt/worker.c gives it */
  }
  if (scenario == 2) {
    snprintf(w->spec.ckpt_dir, sizeof w->spec.ckpt_dir, "%s/%s", root, dev == model_dev_cpu() ? "cpu" : "strict");
    w->spec.ckpt_every = PRE;
    w->spec.ckpt_keep = 2;
  }
  size_t n = (size_t)cfg.batch * cfg.seq_len;
  rs.inputs = malloc(n * sizeof *rs.inputs);
  rs.targets = malloc(n * sizeof *rs.targets);
  int fails = 0;
  newt_result_t r = generation(&rs, world, rank, 1, 1, 2, 1, 0);
  /* a new job: nothing anywhere; the trainer initialises, as the GPT worker does */
  newt_restore_info ri = {.size = sizeof ri};
  if (r == NEWT_OK) r = worker_restore(w, &ri);
  if (r == NEWT_OK && ri.source != NEWT_FROM_NOTHING) r = NEWT_ERR(NEWT_ERR_INTERNAL, "a state on a new job?");
  if (r == NEWT_OK) r = model_par_init_weights(&rs.par);
  if (r == NEWT_OK) r = worker_restored(w);
  if (r != NEWT_OK) {
    fprintf(stderr, "rank %d: layout A: %s\n", rank, newt_errmsg());
    fails = 1;
    goto exit;
  }
  for (int s = 0; s < PRE && !fails; s++) {
    worker_pinned_stats before = {0};
    if (w->pinned) worker_pinned_stats_get(w->pinned, &before);
    fails += step(&rs, s, &out->loss[s]);
    if (!fails && scenario == 2) fails += check_staging(&rs, rank, s + 1, &before);
  }
  worker_ckpt_free(w); /* waits for the save in flight */
  if (fails) goto exit;
  lose(&rs, scenario, rank);
  if ((r = generation(&rs, world, rank, 2, 2, 1, 3, PRE)) != NEWT_OK || (r = restore(&rs)) != NEWT_OK) {
    fprintf(stderr, "rank %d: restore under layout B: %s\n", rank, newt_errmsg());
    fails = 1;
    goto exit;
  }
  out->restored = rs.par.step;
  for (int s = (int)out->restored; s < (int)out->restored + POST && !fails; s++) fails += step(&rs, s, &out->loss[s]);
  if (!fails && !(out->state = pt_pieces_download(&rs.par, &out->nstate))) fails = 1;
  if (!fails && scenario == 2) fails += more_generations(&rs, world, rank, dev != model_dev_cpu());
exit:
  worker_ckpt_free(w);
  worker_pubq_free(&w->pub);
  worker_state_free(w);
  plan_free(&w->plan);
  worker_mem_release(&w->o.memory);
  if (rs.have_par) model_par_free(&rs.par);
  if (rs.have_old) model_par_free(&rs.old);
  model_par_comms_free(&rs.comms);
  free(rs.inputs), free(rs.targets);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
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
