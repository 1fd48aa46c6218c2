/* End-to-end fault tests: a real `newt run` (private etcd, coordinators and workers as
 * processes) with faults injected for real (kill -9, SIGSTOP, SIGTERM, new workers, a killed
 * leader, an etcd restart), alone and two at once. Each scenario checks that
 *
 *   - the job reaches its last step and the summary records one recovery per fault, of
 *     the right cause, with no step lost and state from memory (or peers, for a joiner);
 *   - the samples consumed are exactly those of an uninterrupted run: every step's
 *     samples, as the ranks that committed it logged them (NEWT_SAMPLE_LOG_DIR), cover
 *     [step*G, (step+1)*G) once, and no step is committed twice;
 *   - the final loss equals that of `newt train` (one process, no faults) with the same
 *     spec, within 1e-4 relative.
 *
 * The scenario "netns" runs across hosts: each worker in a network namespace of its own
 * (veth pairs on a bridge, so they talk TCP between their own addresses), etcd and the
 * coordinator outside. One host is cut off mid-run (its link set down): the others detect
 * it, replan and finish; once its link is back, the cut-off worker commits no step of the
 * generation it was cut from, and the job's samples and loss are those of an uninterrupted
 * run.
 *
 * usage: test_elastic <scenario> (one ctest test per scenario; see CMakeLists.txt). */
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/json.h"
#include "common/proc.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "job/plan.h"
#include "job/runlog.h"
#include "job/store.h"
#include "rendezvous/etcd_server.h"
#include "rendezvous/rdzv.h"
#include "tests/elastic/e2e.h"
#include "test.h"

#define GB 24
#define MB 2
#define MODEL "layers=2,channels=64"
#define SEQ "32"

typedef struct scenario {
  const char *name;
  int steps; /* long enough for the faults to play out: a join takes a process start, a
                lost coordinator its lease TTL, an etcd restart its downtime (sized for the
                GPT's steps on the CPU's own GEMM kernels, ~4x faster than the generic ones
                these counts were first chosen for: docs/model.md) */
  int nproc;
  const char *chaos;
  const char *causes[6]; /* expected recoveries, in order; "join?": one that may not happen */
  const char *extra[12]; /* more newt run flags, NULL-terminated */
  const char *stale;     /* a worker stopped and woken later: it must commit no step of its
                            old generation beyond what the others did (it cannot rejoin it) */
  int ckpt_every;        /* checkpoints every this many steps */
  const char *restore;   /* where every recovery's state must come from (NULL: memory or
                            peers, a joiner from peers) */
  const char *model;     /* the model, when not MODEL */
  int in_outage;         /* the worker's fault fires while etcd is away (newt run follows the
                            step log, not only etcd's progress); its recovery is the survivors'
                            own (worker/peers.c), in the record once etcd is back */
  const char *program;   /* a program of one's own as the workers: `newt run ... -- $NEWT_MLP
                            <program>` (examples/mlp, through libnewt), its reference the same
                            program under `newt run --nproc 1` (NULL: newt's own trainer) */
  const char *torch;     /* a PyTorch program as the workers: `newt run ... -- $NEWT_PYTHON
                            <script> <torch>` (through the Python package); its final loss within
                            tol (relative) of the same script on one worker */
  const char *script;    /* that program, under NEWT_SOURCE_DIR (NULL: examples/torch/train.py) */
  double tol;            /* its final loss's tolerance, relative (0: 1e-4) */
  int world;             /* the ranks after the last recovery (0: not checked): every survivor
                            trains where the spec lets it */
  int gens_max;          /* the generations of the whole job, at most (0: bounded by the
                            recoveries only) */
} scenario;

/* The workers are a program of one's own (not newt's trainer). */
static int own_program(const scenario *sc) { return sc->program || sc->torch; }

/* newt-mlp wide enough that its steps take a while, and the jobs long enough for a fault
   to play out: the launcher fires a fault when the step log reaches its step, and an MLP
   of 64 hidden units steps in a fraction of a millisecond (a lost leader's lease would
   outlast the whole job) */
#define MLP "--hidden 1024"
/* examples/torch/train.py's flags in the torch_* scenarios */
#define TORCH "--lr 5e-4"

static const scenario scenarios[] = {
    {"none", 40, 4, "", {NULL}, {NULL}},
    {"crash", 40, 4, "kill:worker:1@step=10", {"crash"}, {NULL}},
    {"hang", 40, 4, "stop:worker:2@step=10", {"hang"}, {"--comm-timeout-ms", "1000", NULL}},
    {"leave", 40, 4, "term:worker:0@step=10", {"leave"}, {NULL}},
    {"join", 1200, 3, "join:1@step=10", {"join"}, {NULL}},
    {"coordinator", 1600, 4, "kill:coordinator@step=10", {"coordinator"}, {NULL}},
    {"etcd", 1600, 4, "restart:etcd:1500@step=10", {"etcd"}, {NULL}},
    {"crash2", 40, 4, "kill:worker:1@step=10,kill:worker:2@step=10", {"crash"}, {NULL}},
    {"crash_hang", 40, 4, "kill:worker:0@step=10,stop:worker:3@step=10", {"crash"}, {NULL}},
    /* two joiners started together may register further apart than the join window
       (spec.parallel.join_window_ms, 100 ms) on a loaded machine: one join plan or two */
    {"leave_join", 1200, 4, "term:worker:3@step=10,join:2@step=20", {"leave", "join", "join?"}, {NULL}},
    {"coordinator_crash", 1600, 4, "kill:coordinator@step=10,kill:worker:2@step=20", {"coordinator", "crash"}, {NULL}},
    /* a worker leaving while etcd is away (the launcher follows the step log, so the fault
       fires at its step during the outage): its hand-over waits for a plan, which follows
       as soon as it can be published; which of the two is recorded first is a race */
    {"etcd_leave", 1600, 4, "restart:etcd:1000@step=10,term:worker:1@step=25", {"etcd|leave", "etcd|leave"}, {NULL}},
    /* etcd away longer than every lease (2 s TTL), hung, emptied, or one member of three
       lost: training goes on at its pace, nobody is fenced, nothing is replanned (but after
       a wipe, which takes one plan from the workers' memory) */
    {"etcd_2s", 1600, 4, "restart:etcd:2000@step=10", {"etcd"}, {NULL}},
    {"etcd_10s", 1600, 4, "restart:etcd:10000@step=10", {"etcd"}, {NULL}},
    {"etcd_60s", 400, 4, "restart:etcd:60000@step=10", {"etcd"}, {NULL}}, /* the job ends during it */
    {"etcd_stop", 1600, 4, "stop:etcd:4000@step=10", {"etcd"}, {NULL}},
    {"etcd_wipe", 1600, 4, "wipe:etcd:2000@step=10", {"etcd"}, {NULL}},
    {"etcd_member", 1600, 4, "kill:etcd:0:3000@step=10", {"etcd"}, {"--etcd-members", "3", NULL}},
    {"etcd_member_stop", 1600, 4, "stop:etcd:1:3000@step=10", {"etcd"}, {"--etcd-members", "3", NULL}},
    /* a worker killed while etcd is away: the survivors go on among themselves, and once etcd
       is back (an event: step 30, not a downtime, which a job of fast steps may outlast) the
       leader's plan follows and the crash is recorded as they take it up, 1570 steps before
       the end; which of the two is recorded first is a race */
    {"etcd_kill", 1600, 4, "restart:etcd:until=30@step=10,kill:worker:2@step=12", {"etcd|crash|hang", "etcd|crash|hang"},
     {NULL}, NULL, 0, NULL, NULL, 1},
    /* a worker killed while etcd is away, and etcd back only once the job reached step 30:
       the survivors must go on among themselves (worker/peers.c), or the job never gets
       there; the leader's plan for the crash follows once etcd is back, and the job ends only
       once the survivors took it up (issue 35), however few steps were left: the crash is in
       the summary, as it was made (in_outage) */
    {"etcd_peers", 40, 4, "restart:etcd:until=30@step=10,kill:worker:1@step=15", {"etcd|crash", "etcd|crash"}, {NULL},
     NULL, 0, NULL, NULL, 1},
    {"stale", 1200, 4, "stop:worker:2@step=10,cont:worker:2@step=60", {"hang", "join"}, {NULL}, "w2"},
    /* every worker killed at once: the replacements can only read the checkpoint; those
       that register after the start window (a loaded machine) join the next generation */
    {"ckpt", 60, 3, "kill:worker:0@step=25,kill:worker:1@step=25,kill:worker:2@step=25,join:3@step=25",
     {"crash|hang", "join?"}, {NULL}, NULL, 10, "ckpt"},
    /* every parallel mode through a resize: tp 2 x pp 2 x dp 2 loses a rank (dp 1, the
       ZeRO shards re-cut), then grows back with a new worker (dp 2) */
    {"tp2pp2z0", 400, 8, "kill:rank:3@step=10,join:1@step=30", {"crash", "join"}, {"--tp", "2", "--pp", "2", NULL}},
    {"tp2pp2z1", 400, 8, "kill:rank:5@step=10,join:1@step=30", {"crash", "join"},
     {"--tp", "2", "--pp", "2", "--zero", "1", NULL}},
    {"tp2pp2z2", 400, 8, "kill:rank:6@step=10,join:1@step=30", {"crash", "join"},
     {"--tp", "2", "--pp", "2", "--zero", "2", NULL}},
    {"tp2pp2z3", 400, 8, "kill:rank:1@step=10,join:1@step=30", {"crash", "join"},
     {"--tp", "2", "--pp", "2", "--zero", "3", NULL}},
    /* a rank whose pieces nobody else holds (tp 2 x pp 2 x dp 1, ZeRO 1) leaves: it hands
       them to the next generation (a spare takes its place) before it goes */
    {"leave_shards", 60, 5, "term:rank:1@step=10", {"leave"}, {"--tp", "2", "--pp", "2", "--zero", "1", NULL}},
    /* 4 ranks (micro-batches of 6: dp 1, 2 or 4) lose one: 3 make dp 2 and a spare, and the
       leaver (still registered while it hands over) must not look like room for dp 4 */
    {"leave_spare", 40, 4, "term:worker:1@step=10", {"leave"}, {"--micro-batch", "6", "--even-batches", NULL}, NULL, 0,
     NULL, "layers=4,channels=128"}, /* the tiny preset: a hand-over that takes a while */
    /* 4 ranks with ZeRO 1 (micro-batches of 6: dp 1, 2 or 4) lose one: the 3 survivors make
       dp 2 and a spare, and the spare's shard and copy (perhaps the only ones left of a
       slice) reach the new ranks: it is a donor of the plan that makes it a spare */
    {"zero_spare", 40, 4, "kill:rank:2@step=10", {"crash"}, {"--zero", "1", "--micro-batch", "6", "--even-batches", NULL}},
    /* every survivor trains (issue 26): the same kill without --even-batches keeps all three,
       the ranks taking 8 samples each (micro-batches of 6 and 2); and five survivors of six
       with ZeRO 3 take 5, 5, 5, 5 and 4 samples (micro-batches of 4: the last rank adds an
       empty one, as ZeRO 3's gathers are collectives) */
    {.name = "survivors", .steps = 40, .nproc = 4, .chaos = "kill:rank:2@step=10", .causes = {"crash"},
     .extra = {"--zero", "1", "--micro-batch", "6", NULL}, .world = 3},
    {.name = "survivors_z3", .steps = 40, .nproc = 6, .chaos = "kill:rank:2@step=10", .causes = {"crash"},
     .extra = {"--zero", "3", "--micro-batch", "4", NULL}, .world = 5},
    /* a slow start-up on purpose (issue 25, item 1): every worker spends 4 s after its first
       restore before its first step, twice the hang timeout: no false hang, no recovery */
    {.name = "slow_start", .steps = 60, .nproc = 2, .chaos = "", .causes = {NULL},
     .extra = {"--hang-timeout-ms", "2000", NULL}, .program = "--hidden 64 --start-delay-ms 4000"},
    /* a slow but healthy step (issue 26): rank 1 spends 1.5 s in step 150, six times the stall
       deadline that follows the steps (fractions of a millisecond: its 250 ms floor) and
       below the cap (--comm-timeout-ms 4000): its peers probe it, it answers, they wait. No
       hang, no recovery, the fault-free loss bitwise. The sleep is the case, not a bound. */
    {.name = "slow_step", .steps = 400, .nproc = 3, .chaos = "", .causes = {NULL}, .extra = {NULL},
     .program = "--hidden 64 --slow-step 150:1500"},
    {.name = "mlp_zero_spare", .steps = 600, .nproc = 4, .chaos = "kill:rank:0@step=10", .causes = {"crash"},
     .extra = {"--zero", "1", "--micro-batch", "6", "--even-batches", NULL}, .program = MLP},
    /* a whole host lost at once (issue 26): tp 2 x pp 2 x dp 2 with ZeRO 3 on two simulated
       hosts of four workers, host 1 killed (its four workers back to back). Each stage's two
       groups sit on both hosts, so every shard has its copy on the surviving one: the state
       comes from memory, not from a checkpoint or the start (which is what the placement of
       one host's groups in one stage made of it). The cause may read "hang": with eight
       workers on a loaded 2-core machine, a survivor's stall deadline (250 ms at least) may
       pass on a peer starved of the CPU before the closed connections of the dead are seen */
    {.name = "host", .steps = 40, .nproc = 8, .chaos = "kill:host:1@step=10", .causes = {"crash|hang"},
     .extra = {"--tp", "2", "--pp", "2", "--zero", "3", "--hosts", "2", NULL}, .world = 4},
    /* a partition made by newt run itself (issue 27): --netns puts each simulated host in a
       network namespace, and chaos cut:host:1 blackholes host 1's routes to host 0 (both
       still reach etcd) until step 40. One side goes on as the largest side of the cut; the
       other is held out while its probes find the plan's ranks unreachable, and joins as
       soon as the cut is mended (the mend is the fault those joins answer) */
    /* (600 steps: the second join comes before the end) */
    {.name = "netns_chaos", .steps = 600, .nproc = 4, .chaos = "cut:host:1:until=40@step=15",
     .causes = {"hang|crash", "join", "join?"}, .extra = {"--netns", "--hosts", "2", NULL}, .world = 4},
    /* a slow, lossy link (issue 27): host 1's veth shaped to 20 Mbit/s both ways with a queue
       of 16 packets (bursts dropped, TCP retransmits) from step 10 to 25: steps take ten
       times as long, and no rank takes that for a hang or a deadlock -- no recovery */
    {.name = "netns_slow", .steps = 60, .nproc = 4, .chaos = "slow:host:1:20000:until=25@step=10", .causes = {NULL},
     .extra = {"--netns", "--hosts", "2", NULL}},
    /* a link too slow to train over (issue 41): host 1's shaped to 2 Mbit/s from step 10 to
       step 40. Its worker's steps stall; the others take it for a hang and go on without it;
       fenced (or its lease lost), it registers again and times its links to their ranks,
       which stay too slow (1 MiB takes seconds) until the shaping ends; then it is taken
       back. One plan out, one back: no generation takes it while its link is slow (the test
       fails with NEWT_LINK_PROBE_BYTES=0, the links only probed for an answer: taken back at
       once, it stalls the job again until the failure budget ends it). A neighbour the hang
       plan left out with it (one CI run: plan 2 kept 2 of 4 ranks) comes back in a join of
       its own: at most 4 generations. Not in make test (tests/elastic/CMakeLists.txt): which
       rank a slow link's hang blames is not reliable yet (one run left an innocent rank out
       first, 6 generations); run it by hand: test_elastic netns_slow_link (issue 41) */
    {.name = "netns_slow_link", .steps = 600, .nproc = 4, .chaos = "slow:host:1:2000:until=40@step=10",
     .causes = {"hang|crash", "join", "join?"}, .extra = {"--netns", "--hosts", "4", NULL}, .world = 4, .gens_max = 4},
    /* k = 2 (spec.fault.replicas): six ZeRO 3 ranks on three hosts lose two hosts at once;
       each rank kept its two predecessors' shards, the ring ordered so that any three
       neighbours are on three hosts, so the two survivors hold all six shards */
    {.name = "host_k2", .steps = 40, .nproc = 6, .chaos = "kill:host:1@step=10,kill:host:2@step=10",
     .causes = {"crash|hang"}, .extra = {"--zero", "3", "--hosts", "3", "--replicas", "2", NULL}, .world = 2},
    /* a lost ZeRO shard comes back from its copy on the next data-parallel rank, not from
       the checkpoints being written all along ... */
    {"zero_replica", 40, 4, "kill:rank:1@step=12", {"crash"}, {"--zero", "1", NULL}, NULL, 5, "peer"},
    /* the issue's two neighbouring ZeRO 3 ranks lost at once, with a checkpoint to go back to
       (issue 35): the steps since it are done again, and the summary, the event log and the
       leader say one account of them (check_account); fired once a checkpoint committed, so
       there is one to go back to however slowly the saves go */
    {"account_z3", 60, 4, "kill:rank:1@ckpt=10,kill:rank:2@ckpt=10", {"crash"}, {"--zero", "3", NULL}, NULL, 5, "ckpt"},
    /* ... and when the shard and its copy are lost at once, from the checkpoint */
    {"zero_both", 60, 4, "kill:rank:0@step=30,kill:rank:2@step=30", {"crash"}, {"--tp", "2", "--zero", "1", NULL}, NULL,
     5, "ckpt"}, /* late enough that a checkpoint is committed on a loaded machine */
    /* GPU workers (--backend nccl: the CUDA device, NCCL communicators on its stream), run
       by a newt built against the CUDA/NCCL test double (NEWT_GPU_DOUBLE; CMakeLists.txt):
       the same faults, the same checks, the same reference */
    {"nccl_crash", 100, 4, "kill:worker:1@step=10", {"crash"}, {"--backend", "nccl", NULL}},
    /* the survivors of a crash while etcd is away go on among themselves (comm_shrink of the
       NCCL communicator and its control channel), as etcd_peers on the CPU */
    {"nccl_etcd_peers", 40, 4, "restart:etcd:until=30@step=10,kill:worker:1@step=15", {"etcd|crash", "etcd|crash"},
     {"--backend", "nccl", NULL}, NULL, 0, NULL, NULL, 1},
    {"nccl_hang", 100, 4, "stop:worker:2@step=10", {"hang"}, {"--backend", "nccl", "--comm-timeout-ms", "1000", NULL}},
    {"nccl_join", 300, 3, "join:1@step=10", {"join"}, {"--backend", "nccl", NULL}},
    {"nccl_coordinator", 400, 4, "kill:coordinator@step=10", {"coordinator"}, {"--backend", "nccl", NULL}},
    {"nccl_leave_shards", 60, 5, "term:rank:1@step=10", {"leave"},
     {"--backend", "nccl", "--tp", "2", "--pp", "2", "--zero", "1", NULL}},
    {"nccl_tp2pp2z0", 150, 8, "kill:rank:3@step=10,join:1@step=30", {"crash", "join"},
     {"--backend", "nccl", "--tp", "2", "--pp", "2", NULL}},
    {"nccl_tp2pp2z1", 150, 8, "kill:rank:5@step=10,join:1@step=30", {"crash", "join"},
     {"--backend", "nccl", "--tp", "2", "--pp", "2", "--zero", "1", NULL}},
    {"nccl_tp2pp2z2", 150, 8, "kill:rank:6@step=10,join:1@step=30", {"crash", "join"},
     {"--backend", "nccl", "--tp", "2", "--pp", "2", "--zero", "2", NULL}},
    {"nccl_tp2pp2z3", 150, 8, "kill:rank:1@step=10,join:1@step=30", {"crash", "join"},
     {"--backend", "nccl", "--tp", "2", "--pp", "2", "--zero", "3", NULL}},
    /* newt run --share-gpus: three workers on one "GPU" (CMakeLists.txt sets
       NEWT_NCCL_DOUBLE_DEVICES=1), each a host of its own to the coordinator and to NCCL
       (NCCL_HOSTID; without it the double refuses them as a duplicate GPU, as NCCL does) */
    {"nccl_share", 150, 3, "kill:worker:1@step=10,join:1@step=30", {"crash", "join"},
     {"--backend", "nccl", "--share-gpus", NULL}},
    /* a program of one's own (examples/mlp through libnewt) through every kind of fault, its
       optimizer state sharded (ZeRO 1) where the fault takes a rank: the kill's shard comes
       back from its copy, the leaver hands its own over; with the data-parallel size kept
       (a lost leader, etcd away) the loss is bitwise that of the same job without faults */
    {.name = "mlp_crash", .steps = 600, .nproc = 4, .chaos = "kill:worker:1@step=10", .causes = {"crash"},
     .extra = {"--zero", "1", NULL}, .program = MLP},
    {.name = "mlp_hang", .steps = 600, .nproc = 4, .chaos = "stop:worker:2@step=10", .causes = {"hang"},
     .extra = {"--comm-timeout-ms", "1000", NULL}, .program = MLP},
    {.name = "mlp_leave", .steps = 600, .nproc = 4, .chaos = "term:worker:0@step=10", .causes = {"leave"},
     .extra = {"--zero", "1", NULL}, .program = MLP},
    {.name = "mlp_join", .steps = 3000, .nproc = 3, .chaos = "join:1@step=10", .causes = {"join"}, .extra = {NULL},
     .program = MLP},
    {.name = "mlp_coordinator", .steps = 3000, .nproc = 4, .chaos = "kill:coordinator@step=10",
     .causes = {"coordinator"}, .extra = {"--zero", "1", NULL}, .program = MLP},
    {.name = "mlp_etcd", .steps = 3000, .nproc = 4, .chaos = "restart:etcd:1500@step=10", .causes = {"etcd"},
     .extra = {NULL}, .program = MLP},
    /* a PyTorch program (examples/torch/train.py through the Python package) through a kill,
       a hang, a leave, a join and a lost leader: its loss within 1e-4 of the script on one
       worker (bitwise that of the same job without faults while the data-parallel size is
       kept). A Python worker takes a second or more to start: a join needs the job to
       outlast that, a lost leader its lease TTL */
    {.name = "torch_crash", .steps = 120, .nproc = 4, .chaos = "kill:worker:1@step=10", .causes = {"crash"},
     .extra = {NULL}, .torch = TORCH},
    {.name = "torch_hang", .steps = 120, .nproc = 4, .chaos = "stop:worker:2@step=10", .causes = {"hang"},
     .extra = {"--comm-timeout-ms", "1000", NULL}, .torch = TORCH},
    {.name = "torch_leave", .steps = 120, .nproc = 4, .chaos = "term:worker:0@step=10", .causes = {"leave"},
     .extra = {NULL}, .torch = TORCH},
    {.name = "torch_join", .steps = 200, .nproc = 3, .chaos = "join:1@step=10", .causes = {"join"}, .extra = {NULL},
     .torch = TORCH},
    {.name = "torch_coordinator", .steps = 200, .nproc = 4, .chaos = "kill:coordinator@step=10",
     .causes = {"coordinator"}, .extra = {NULL}, .torch = TORCH},
    /* a stock DDP script (examples/torch/ddp.py: torch's DistributedDataParallel over newt,
       BatchNorm, AdamW, a schedule, accumulation with no_sync) through a kill, a hang, a
       leave, a join and a lost leader in one job: no step lost, every sample once, its loss
       within 1e-5 of the script on one worker */
    {.name = "torch_ddp", .steps = 400, .nproc = 4,
     .chaos = "kill:worker:1@step=10,stop:worker:2@step=50,term:worker:0@step=90,join:1@step=130,kill:coordinator@step=170",
     .causes = {"crash", "hang", "leave", "join|coordinator", "join|coordinator"},
     .extra = {"--comm-timeout-ms", "1000", NULL},
     .torch = "", .script = "examples/torch/ddp.py", .tol = 1e-5},
    /* the same with AdamW's state sharded over the ranks (newt.torch.ZeroRedundancyOptimizer,
       ZeRO stage 1): newt reshards the shards in memory at every resize */
    {.name = "torch_zero1", .steps = 400, .nproc = 4,
     .chaos = "kill:worker:1@step=10,stop:worker:2@step=50,term:worker:0@step=90,join:1@step=130,kill:coordinator@step=170",
     .causes = {"crash", "hang", "leave", "join|coordinator", "join|coordinator"},
     .extra = {"--comm-timeout-ms", "1000", NULL}, .torch = "--zero1", .script = "examples/torch/ddp.py", .tol = 1e-5},
};

/* "join?": a recovery that may not happen */
static int optional(const char *cause) { return cause[strlen(cause) - 1] == '?'; }

/* Whether `got` ("|cause|") is one of the causes of `want` ("a|b", "join?"). */
static int cause_is(const char *want, const char *got) {
  char w[64];
  snprintf(w, sizeof w, "|%.*s|", (int)(strlen(want) - optional(want)), want);
  return strstr(w, got) != NULL;
}

static char tmpdir[256];
static const scenario *current;
static const char *newt_bin;
static int run_capture(const char *const *argv, char **out);

/* Runs argv, stdout into out (malloc'd); returns the exit status or -1. */
static int run_capture(const char *const *argv, char **out) { return e2e_run_capture(tmpdir, argv, out); }

/* `newt train` of the scenarios' batch and sequence, with more flags (NULL-terminated);
 * its final loss (NaN when it failed), and in *resumed (may be NULL) the step its "resumed
 * at step N" line names (-1: none). */
static double train_run(const char *newt, int nsteps, const char *model, const char *const *extra, int64_t *resumed) {
  char steps[16], gb[16], mb[16];
  snprintf(steps, sizeof steps, "%d", nsteps);
  snprintf(gb, sizeof gb, "%d", GB);
  snprintf(mb, sizeof mb, "%d", MB);
  const char *argv[32] = {newt, "train", "--model", model, "--seq-len", SEQ, "--steps", steps, "--batch", gb,
                          "--micro-batch", mb};
  int a = 12;
  for (int i = 0; extra && extra[i] && a < 31; i++) argv[a++] = extra[i];
  char *out = NULL;
  int rc = run_capture(argv, &out);
  double loss = NAN;
  const char *last = out ? strrchr(out, '{') : NULL, *res = out ? strstr(out, "resumed at step ") : NULL;
  cJSON *j = NULL;
  if (rc == 0 && last && newt_json_parse(last, strlen(last), "train", &j) == NEWT_OK) {
    newt_json_get_double(j, "train", "final_loss", 1, &loss);
    cJSON_Delete(j);
  }
  if (rc != 0) fprintf(stderr, "newt train exited %d:\n%s\n", rc, out ? out : "");
  if (resumed) *resumed = res ? strtoll(res + 16, NULL, 10) : -1;
  free(out);
  return loss;
}

static double reference_loss(const char *newt, int nsteps, const char *model) {
  return train_run(newt, nsteps, model, NULL, NULL);
}

/* The sample logs: "C gen step first count" when a rank takes its slice of a step, "A gen
 * step" when it applied the step. */
typedef struct slice_rec {
  long long gen, step, first, count;
  int worker; /* which log */
} slice_rec;

/* The newest step each worker committed in generation 1 (stale check). */
static void check_stale(const char *dir, const char *stale) {
  char path[1024], line[128];
  long long stale_max = -1, others_max = -1;
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (!strstr(e->d_name, ".samples")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "r");
    int is_stale = strncmp(e->d_name, stale, strlen(stale)) == 0 && e->d_name[strlen(stale)] == '.';
    while (f && fgets(line, sizeof line, f)) {
      long long g, st;
      if (line[0] != 'A' || sscanf(line + 1, "%lld %lld", &g, &st) != 2 || g != 1) continue;
      long long *m = is_stale ? &stale_max : &others_max;
      if (st > *m) *m = st;
    }
    if (f) fclose(f);
  }
  if (d) closedir(d);
  T_CHECK_MSG(others_max > 0, "no step of generation 1 was logged");
  T_CHECK_MSG(stale_max <= others_max, "%s committed step %lld of generation 1 after the others left it at %lld",
              stale, stale_max, others_max);
}

/* Each step is committed by one generation, the newest that applied it. An earlier
 * application was rolled back, which is right only when the ranks that made it took part
 * in no generation after it up to the one that applied the step again (they died or hung,
 * their state with them, or a hung one woke and finished a step the others had given up),
 * or, where the layout shards the state (shards_state), when a survivor lacked some
 * peer's pieces of the newer step. A survivor holding a whole state is never rolled back. */
/* Generations in order with the ones the survivors made of them without etcd (a worker's
 * "generation G (peers E)", its sample log's epoch E): G.E after G, before G + 1. */
#define SUBGEN(g, e) ((g) * 4096 + (e))

static int took_part(const slice_rec *c, size_t nc, int worker, long long after, long long upto) {
  for (size_t i = 0; i < nc; i++)
    if (c[i].worker == worker && c[i].gen > after && c[i].gen <= upto) return 1;
  return 0;
}

static void check_samples(const char *dir, int STEPS, int shards_state) {
  slice_rec *c = NULL, *a = NULL; /* slices taken, steps applied */
  size_t nc = 0, cap = 0, na = 0, acap = 0;
  int nw = 0;
  long long *applied_gen = malloc((size_t)(STEPS + 1) * sizeof *applied_gen);
  for (int s = 0; s <= STEPS; s++) applied_gen[s] = -1;
  DIR *d = opendir(dir);
  T_CHECK_MSG(d != NULL, "no sample logs in %s", dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strstr(e->d_name, ".samples")) continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    char line[256];
    while (fgets(line, sizeof line, f)) {
      slice_rec r = {.worker = nw};
      long long epoch = 0, wall = 0; /* a generation the survivors made without etcd: (gen, epoch) */
      if (line[0] == 'C' && sscanf(line + 1, "%lld %lld %lld %lld %lld", &r.gen, &r.step, &r.first, &r.count, &epoch) >= 4) {
        r.gen = SUBGEN(r.gen, epoch);
        if (nc == cap) {
          cap = cap ? 2 * cap : 256;
          c = realloc(c, cap * sizeof *c);
        }
        c[nc++] = r;
      } else if (line[0] == 'A' && sscanf(line + 1, "%lld %lld %lld %lld", &r.gen, &r.step, &wall, &epoch) >= 2 &&
                 r.step >= 1 && r.step <= STEPS) {
        r.gen = SUBGEN(r.gen, epoch);
        if (na == acap) {
          acap = acap ? 2 * acap : 256;
          a = realloc(a, acap * sizeof *a);
        }
        a[na++] = r;
        if (r.gen > applied_gen[r.step]) applied_gen[r.step] = r.gen;
      }
    }
    fclose(f);
    nw++;
  }
  closedir(d);
  for (size_t i = 0; i < na && !shards_state; i++) {
    long long redo = applied_gen[a[i].step];
    T_CHECK_MSG(a[i].gen == redo || !took_part(c, nc, a[i].worker, a[i].gen, redo),
                "step %lld was applied in generation %lld by a rank that then took part in a later generation, "
                "and applied again in generation %lld: a survivor's newer state was thrown away",
                a[i].step, a[i].gen, redo);
  }
  for (int s = 1; s <= STEPS; s++) {
    T_CHECK_MSG(applied_gen[s] >= 0, "step %d was never committed", s);
    if (applied_gen[s] < 0) continue;
    /* the slices of step s in the generation that committed it cover its samples once */
    int seen[GB];
    memset(seen, 0, sizeof seen);
    for (size_t i = 0; i < nc; i++) {
      if (c[i].step != s || c[i].gen != applied_gen[s]) continue;
      for (long long k = c[i].first; k < c[i].first + c[i].count; k++) {
        long long off = k - (long long)(s - 1) * GB;
        T_CHECK_MSG(off >= 0 && off < GB, "step %d took sample %lld, outside its batch", s, k);
        if (off >= 0 && off < GB) seen[off]++;
      }
    }
    for (int k = 0; k < GB; k++)
      T_CHECK_MSG(seen[k] == 1, "step %d: sample %d taken %d times", s, (s - 1) * GB + k, seen[k]);
  }
  free(c);
  free(a);
  free(applied_gen);
}

/* Milliseconds since the epoch of a log line ("2026-12-01T10:15:30.123Z ...", UTC), or -1. */
static long long log_ms(const char *line) {
  struct tm tm;
  int ms;
  memset(&tm, 0, sizeof tm);
  if (sscanf(line, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
             &tm.tm_sec, &ms) != 7)
    return -1;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return (long long)timegm(&tm) * 1000 + ms;
}

/* Every restore from a checkpoint took a checkpoint's step, and none older than the newest
 * committed before it (from the processes' logs: "committed step N", "starts at step S
 * (state from ckpt)"; a commit's line may die with a process killed right after it). */
static void check_ckpt_restores(const char *dir, int every) {
  long long commit_t[256], commit_step[256], restore_t[64], restore_step[64];
  int ncommit = 0, nrestore = 0;
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (!strstr(e->d_name, ".log")) continue;
    char path[1024], line[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) {
      const char *p;
      long long t = log_ms(line), st;
      if ((p = strstr(line, "committed step ")) && sscanf(p, "committed step %lld", &st) == 1 && ncommit < 256)
        commit_t[ncommit] = t, commit_step[ncommit++] = st;
      else if (strstr(line, "(state from ckpt)") && (p = strstr(line, "starts at step ")) &&
               sscanf(p, "starts at step %lld", &st) == 1 && nrestore < 64)
        restore_t[nrestore] = t, restore_step[nrestore++] = st;
    }
    if (f) fclose(f);
  }
  if (d) closedir(d);
  T_CHECK_MSG(nrestore > 0, "no rank restored from a checkpoint");
  for (int i = 0; i < nrestore; i++) {
    long long newest = -1;
    for (int k = 0; k < ncommit; k++)
      if (commit_t[k] < restore_t[i] && commit_step[k] > newest) newest = commit_step[k];
    T_CHECK_MSG(restore_step[i] > 0 && restore_step[i] % every == 0, "a rank restored step %lld: no checkpoint step",
                restore_step[i]);
    T_CHECK_MSG(restore_step[i] >= newest, "a rank restored step %lld, the newest committed checkpoint was %lld",
                restore_step[i], newest);
  }
}

/* Each worker took up generations in increasing order only (its log: "generation N: rank"),
 * and, when no worker was harmed (etcd and coordinator faults only), no worker was fenced
 * (the coordinators' logs: "fenced <id>"). */
static void check_generations(const char *dir, int healthy) {
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (!strstr(e->d_name, ".log")) continue;
    char path[1024], line[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "r");
    long long last = 0;
    while (f && fgets(line, sizeof line, f)) {
      const char *p;
      long long g, ep = 0;
      int end = 0;
      if (e->d_name[0] == 'w' && (p = strstr(line, ": generation ")) &&
          ((sscanf(p, ": generation %lld: rank%n", &g, &end) == 1 && end > 0) ||
           (sscanf(p, ": generation %lld (peers %lld): rank%n", &g, &ep, &end) == 2 && end > 0))) {
        T_CHECK_MSG(SUBGEN(g, ep) > last, "%s took up generation %lld.%lld after %lld.%lld", e->d_name, g, ep,
                    last / 4096, last % 4096);
        last = SUBGEN(g, ep);
      }
      if (e->d_name[0] == 'c' && strstr(line, " fenced "))
        T_CHECK_MSG(!healthy, "a healthy worker was fenced: %s: %s", e->d_name, line);
    }
    if (f) fclose(f);
  }
  if (d) closedir(d);
}

/* No process reported a sanitizer finding (when built with NEWT_SANITIZE) or a crash of
 * its own making. */
static void check_logs(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (!strstr(e->d_name, ".log") || strcmp(e->d_name, "etcd.log") == 0) continue;
    char path[1024], line[512];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f))
      T_CHECK_MSG(!strstr(line, "runtime error:") && !strstr(line, "Sanitizer") && !strstr(line, "Segmentation"),
                  "%s: %s", path, line);
    if (f) fclose(f);
  }
  if (d) closedir(d);
}

/* One account of each recovery (issue 35): the step the fault hit, the step training went on
 * from and the steps redone agree (steps_lost = max(0, fault_step - step)) in the summary, as the
 * leader's recovered events in the event log say them, and the summary counts the samples
 * trained twice (steps_lost x the global batch, summed). A recovery the leader planned
 * says its fault step. */
static void check_account(const cJSON *summary, const char *logs, int steps) {
  char path[600];
  snprintf(path, sizeof path, "%s/events.jsonl", logs);
  job_event *evs = NULL;
  size_t nev = 0;
  T_OK(job_eventlog_read(path, &evs, &nev, NULL));
  int64_t repeated = 0, said = 0;
  newt_json_get_int(summary, "summary", "samples_repeated", 0, &said);
  const cJSON *recs = cJSON_GetObjectItemCaseSensitive(summary, "recoveries");
  for (const cJSON *r = recs ? recs->child : NULL; r; r = r->next) {
    const char *cause = "";
    int64_t step = -1, fault = 0, lost = -1, gen = 0;
    newt_json_get_str(r, "recovery", "cause", 1, &cause);
    newt_json_get_int(r, "recovery", "step", 1, &step);
    newt_json_get_int(r, "recovery", "fault_step", 0, &fault);
    newt_json_get_int(r, "recovery", "steps_lost", 1, &lost);
    newt_json_get_int(r, "recovery", "generation", 1, &gen);
    repeated += lost * GB;
    if (!strcmp(cause, "etcd") || !strcmp(cause, "coordinator")) continue; /* no plan: nothing redone */
    /* steps redone: max(0, fault_step - step); a plan that took over from survivors who went on
       without etcd comes at a later step than the fault */
    T_CHECK_MSG(fault > 0 && lost == (fault > step ? fault - step : 0), "recovery of generation %lld (%s): the fault hit at step %lld, "
                "training went on from step %lld, %lld steps redone: not one account", (long long)gen, cause,
                (long long)fault, (long long)step, (long long)lost);
    const job_event *e = NULL;
    for (size_t i = 0; i < nev; i++)
      if (evs[i].type == JOB_EV_RECOVERED && evs[i].generation == gen) e = &evs[i];
    T_CHECK_MSG(e && e->fault_step == fault && e->restore_step == step && e->steps_lost == lost,
                "the event log's recovery of generation %lld says another account than the summary's (step %lld, "
                "fault at %lld, %lld lost)", (long long)gen, e ? (long long)e->restore_step : -1LL,
                e ? (long long)e->fault_step : -1LL, e ? (long long)e->steps_lost : -1LL);
  }
  T_CHECK_MSG(said == repeated, "samples_repeated %lld, the recoveries redid %lld samples", (long long)said,
              (long long)repeated);
  /* the end, at the job's last step, and said at most once by each of newt run's two
     coordinators (none when etcd lost every key, the coordinators with it): an end marker
     the leader and the store judged apart (a progress record that went back behind the
     marker) made a coordinator lead, end and lead again, hundreds of events with the older
     step */
  int ndone = 0;
  for (size_t i = 0; i < nev; i++) {
    if (evs[i].type != JOB_EV_DONE) continue;
    ndone++;
    T_CHECK_MSG(evs[i].step == steps, "the event log's end says step %lld, the job's last is %d",
                (long long)evs[i].step, steps);
  }
  T_CHECK_MSG(ndone <= 2, "the event log says the job's end %d times", ndone);
  job_eventlog_free(evs, nev);
}

/* The scenario's `newt run` on nproc workers, with its faults or without (a reference), its
 * logs in tmpdir/<tag>.logs and its summary in tmpdir/<tag>.json; its exit status, its
 * output in *out (may be NULL). */
static int scenario_run(const scenario *sc, const char *newt, const char *tag, int nproc, int faults, char **out) {
  const char *model = sc->model ? sc->model : MODEL;
  char logs[512], summary[512], steps[16], gb[16], mb[16], np[16], job[64];
  snprintf(logs, sizeof logs, "%s/%s.logs", tmpdir, tag);
  snprintf(summary, sizeof summary, "%s/%s.json", tmpdir, tag);
  snprintf(steps, sizeof steps, "%d", sc->steps);
  snprintf(gb, sizeof gb, "%d", GB);
  snprintf(mb, sizeof mb, "%d", MB);
  snprintf(np, sizeof np, "%d", nproc);
  snprintf(job, sizeof job, "e2e-%s", sc->name);
  const char *argv[64];
  int a = 0;
  const char *base[] = {newt, "run", "--quiet", "--job", job, "--nproc", np, "--steps", steps, "--global-batch", gb,
                        "--micro-batch", mb, "--comm-timeout-ms", "4000", "--log-dir", logs, "--summary", summary,
                        "--timeout-ms", "180000"};
  for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) argv[a++] = base[i];
  if (!own_program(sc)) {
    argv[a++] = "--model";
    argv[a++] = model;
    argv[a++] = "--seq-len";
    argv[a++] = SEQ;
  }
  if (faults && sc->chaos[0]) {
    argv[a++] = "--chaos";
    argv[a++] = sc->chaos;
  }
  for (int i = 0; sc->extra[i]; i++) argv[a++] = sc->extra[i];
  char ckdir[512], every[16];
  if (sc->ckpt_every) {
    snprintf(ckdir, sizeof ckdir, "%s/%s.ckpt", tmpdir, tag);
    snprintf(every, sizeof every, "%d", sc->ckpt_every);
    argv[a++] = "--ckpt-dir";
    argv[a++] = ckdir;
    argv[a++] = "--ckpt-every";
    argv[a++] = every;
  }
  char args[256], script[600];
  if (sc->torch) {
    const char *py = getenv("NEWT_PYTHON"), *src = getenv("NEWT_SOURCE_DIR");
    if (!py || !src) {
      fprintf(stderr, "test_elastic: NEWT_PYTHON (a Python with torch) or NEWT_SOURCE_DIR is not set\n");
      return -1;
    }
    snprintf(script, sizeof script, "%s/%s", src, sc->script ? sc->script : "examples/torch/train.py");
    argv[a++] = "--";
    argv[a++] = py;
    argv[a++] = script;
    snprintf(args, sizeof args, "%s", sc->torch);
    for (char *save = NULL, *w = strtok_r(args, " ", &save); w && a < 63; w = strtok_r(NULL, " ", &save)) argv[a++] = w;
  } else if (sc->program) {
    const char *exe = getenv("NEWT_MLP");
    if (!exe) {
      fprintf(stderr, "test_elastic: NEWT_MLP (the path of examples/mlp's newt-mlp) is not set\n");
      return -1;
    }
    argv[a++] = "--";
    argv[a++] = exe;
    snprintf(args, sizeof args, "%s", sc->program);
    for (char *save = NULL, *w = strtok_r(args, " ", &save); w && a < 63; w = strtok_r(NULL, " ", &save)) argv[a++] = w;
  }
  argv[a] = NULL;
  return run_capture(argv, out);
}

/* The final loss of a reference run of the scenario (NaN when it failed). */
static double scenario_reference(const scenario *sc, const char *newt, const char *tag, int nproc) {
  char *out = NULL, path[600], *text = NULL;
  size_t n;
  int rc = scenario_run(sc, newt, tag, nproc, 0, &out);
  if (rc != 0) fprintf(stderr, "the reference newt run (%d workers) exited %d:\n%s\n", nproc, rc, out ? out : "");
  free(out);
  snprintf(path, sizeof path, "%s/%s.json", tmpdir, tag);
  double loss = NAN;
  cJSON *j = NULL;
  if (rc == 0 && newt_fs_read_all(path, 1 << 20, &text, &n) == NEWT_OK && newt_json_parse(text, n, path, &j) == NEWT_OK)
    newt_json_get_double(j, "summary", "final_loss", 1, &loss);
  cJSON_Delete(j);
  free(text);
  return loss;
}

static void run_scenario(const scenario *sc, const char *newt) {
  const int STEPS = sc->steps;
  int healthy = 1; /* only etcd or coordinators are harmed: the data-parallel size is kept */
  for (int k = 0; k < 6 && sc->causes[k]; k++)
    healthy &= !strcmp(sc->causes[k], "etcd") || !strcmp(sc->causes[k], "coordinator");
  /* the uninterrupted loss: `newt train` (newt's own model), or the program on one worker;
     a program's loss with the data-parallel size kept equals its fault-free run's bitwise */
  double ref = own_program(sc) ? scenario_reference(sc, newt, "ref1", 1)
                               : reference_loss(newt, STEPS, sc->model ? sc->model : MODEL);
  T_CHECK_MSG(isfinite(ref), "no reference loss");
  double exact = own_program(sc) && healthy ? scenario_reference(sc, newt, "ref", sc->nproc) : NAN;
  T_CHECK_MSG(!own_program(sc) || !healthy || isfinite(exact), "no fault-free loss");
  char logs[512], samples[512], summary[512];
  snprintf(logs, sizeof logs, "%s/run.logs", tmpdir);
  snprintf(samples, sizeof samples, "%s/samples", tmpdir);
  snprintf(summary, sizeof summary, "%s/run.json", tmpdir);
  T_OK(newt_fs_mkdirs(samples, 0755));
  setenv("NEWT_SAMPLE_LOG_DIR", samples, 1);
  setenv("NEWT_KEEP_EVENTS", "4", 1); /* the leader keeps the job's keys bounded: see below */
  char *out = NULL;
  int rc = scenario_run(sc, newt, "run", sc->nproc, 1, &out);
  unsetenv("NEWT_SAMPLE_LOG_DIR");
  T_CHECK_MSG(rc == 0, "newt run exited %d:\n%s", rc, out ? out : "");
  free(out);
  char *text = NULL;
  size_t n;
  cJSON *j = NULL;
  T_OK(newt_fs_read_all(summary, 1 << 20, &text, &n));
  if (text) T_OK(newt_json_parse(text, n, "summary", &j));
  if (!j) {
    free(text);
    return;
  }
  int done = 0;
  int64_t st = 0, samples_n = 0;
  double loss = NAN;
  newt_json_get_bool(j, "summary", "done", 1, &done);
  newt_json_get_int(j, "summary", "steps", 1, &st);
  newt_json_get_int(j, "summary", "samples_consumed", 1, &samples_n);
  newt_json_get_double(j, "summary", "final_loss", 1, &loss);
  T_CHECK(done);
  T_CHECK_MSG(st == STEPS, "steps %lld", (long long)st);
  /* what the job left in etcd once every process ended: spec, plan, progress, end marker,
     checkpoint pointer and at most the 4 newest events and the few that follow the last
     housekeeping -- no old generation's acks or reports, no event history */
  int64_t keys = -1;
  newt_json_get_int(j, "summary", "etcd_keys", 1, &keys);
  T_CHECK_MSG(keys >= 0 && keys <= 12, "the job left %lld keys in etcd", (long long)keys);
  T_CHECK_MSG(samples_n == (int64_t)STEPS * GB, "samples_consumed %lld, uninterrupted %d", (long long)samples_n,
              STEPS * GB);
  /* the summation order changes with the data-parallel size (and the step it changes at):
     rounding differences that Adam grows chaotically, to 2.3e-5 (relative) by step 200 of
     torch_join when the joiner came at step 50 on a loaded machine */
  double tol = sc->torch ? (sc->tol > 0 ? sc->tol : 1e-4) * fabs(ref) : 1e-4 * fmax(1.0, fabs(ref));
  T_CHECK_MSG(fabs(loss - ref) <= tol, "final loss %.9f, uninterrupted %.9f (within %.2g)", loss, ref, tol);
  T_CHECK_MSG(isnan(exact) || loss == exact, "final loss %.17g, the same job without faults %.17g: not bitwise", loss,
              exact);
  const cJSON *recs = cJSON_GetObjectItemCaseSensitive(j, "recoveries");
  int nexp = 0, nreq = 0;
  while (nexp < 6 && sc->causes[nexp]) nreq += !optional(sc->causes[nexp++]);
  /* a fault may take a plan that fails to form before the one that recovers; more is a
     leader replanning for nothing */
  int64_t gens = 0;
  /* a lost leader or etcd outage takes no new plan: at least the recoveries that cannot be
     one of those replan, at most those that can be something else */
  int nplans = 0, nplans_max = 0;
  for (int k = 0; k < nexp; k++) {
    char alt[64];
    snprintf(alt, sizeof alt, "|%s|", sc->causes[k]);
    int planless = strstr(alt, "|coordinator|") || strstr(alt, "|etcd|");
    int other = strcmp(sc->causes[k], "coordinator") != 0 && strcmp(sc->causes[k], "etcd") != 0;
    nplans += !planless && !optional(sc->causes[k]);
    nplans_max += other;
  }
  if (strstr(sc->chaos, "wipe:etcd")) nplans_max++; /* the plan an emptied etcd forgot */
  newt_json_get_int(j, "summary", "generations", 1, &gens);
  T_CHECK_MSG(!sc->gens_max || gens <= sc->gens_max, "%lld generations, expected at most %d:\n%s", (long long)gens,
              sc->gens_max, text);
  T_CHECK_MSG(gens >= 1 + nplans && gens <= 2 * (nplans_max + 1), "%lld generations for %d to %d recoveries that replan",
              (long long)gens, nplans, nplans_max);
  int nrec = cJSON_GetArraySize(recs);
  T_CHECK_MSG(nrec >= nreq && nrec <= nexp, "%d recoveries, expected %d%s:\n%s", nrec, nreq,
              nexp > nreq ? " or more" : "", text);
  /* two faults whose recoveries may come in either order ("a|b" twice): one of each */
  if (nexp == 2 && nrec == 2 && strcmp(sc->causes[0], sc->causes[1]) == 0) {
    const char *c0 = "", *c1 = "";
    newt_json_get_str(recs->child, "recovery", "cause", 1, &c0);
    newt_json_get_str(recs->child->next, "recovery", "cause", 1, &c1);
    T_CHECK_MSG(strcmp(c0, c1) != 0, "both recoveries have cause %s, expected one of each of %s:\n%s", c0,
                sc->causes[0], text);
  }
  if (sc->in_outage && nrec == 2) {
    /* the etcd record's t_ms is when etcd went away; the other's, when its fault fired */
    int64_t t[2] = {0, 0}, outage = 0;
    int e = 0;
    const cJSON *r = recs->child;
    for (int x = 0; x < 2; x++, r = r->next) {
      const char *cause = "";
      newt_json_get_str(r, "recovery", "cause", 1, &cause);
      newt_json_get_int(r, "recovery", "t_ms", 1, &t[x]);
      if (strcmp(cause, "etcd") == 0) e = x, newt_json_get_int(r, "recovery", "outage_ms", 1, &outage);
    }
    T_CHECK_MSG(t[1 - e] >= t[e] && t[1 - e] <= t[e] + outage,
                "the fault fired %lld ms after etcd went away, not during its %lld ms outage:\n%s",
                (long long)(t[1 - e] - t[e]), (long long)outage, text);
    /* the crash, as the survivors made it without etcd and the leader recorded it once etcd was
       back (issue 35): training resumed (resumed_ms, from the step log) before the leader's plan
       took over (total_ms), in a generation of the leader's, the fault's step before the step
       that plan took over at */
    const cJSON *c = e == 0 ? recs->child->next : recs->child;
    const char *cause = "";
    int64_t resumed = -1, total = -1, gen = 0, fault = 0, step = 0;
    newt_json_get_str(c, "recovery", "cause", 1, &cause);
    newt_json_get_int(c, "recovery", "resumed_ms", 0, &resumed);
    newt_json_get_int(c, "recovery", "total_ms", 1, &total);
    newt_json_get_int(c, "recovery", "generation", 1, &gen);
    newt_json_get_int(c, "recovery", "fault_step", 0, &fault);
    newt_json_get_int(c, "recovery", "step", 1, &step);
    if (strcmp(cause, "hang") != 0) {
      T_CHECK_MSG(!strcmp(cause, "crash") && resumed >= 0 && resumed < total && gen >= 2 && fault > 0 && fault <= step,
                  "the crash during the outage: cause %s, resumed after %lld ms, recorded after %lld, generation "
                  "%lld, the fault at step %lld and the leader's plan at step %lld:\n%s", cause, (long long)resumed,
                  (long long)total, (long long)gen, (long long)fault, (long long)step, text);
      T_CHECK_MSG(gens >= 2, "%lld generations: the leader's plan for the crash is not in the record", (long long)gens);
    }
  }
  check_account(j, logs, STEPS);
  int i = 0, k = 0;
  for (const cJSON *r = recs ? recs->child : NULL; r && k < nexp; r = r->next, i++, k++) {
    const char *cause = "", *restore = "";
    int64_t lost = -1, total = -1;
    int injected = 0;
    newt_json_get_str(r, "recovery", "cause", 1, &cause);
    newt_json_get_str(r, "recovery", "restore", 1, &restore);
    newt_json_get_int(r, "recovery", "steps_lost", 1, &lost);
    newt_json_get_int(r, "recovery", "total_ms", 1, &total);
    newt_json_get_bool(r, "recovery", "injected", 1, &injected);
    /* "a|b": either (whether the dead or the newcomers are seen first is a race); an
       optional one that did not happen is passed over */
    char got[32];
    snprintf(got, sizeof got, "|%s|", cause);
    while (k + 1 < nexp && optional(sc->causes[k]) && !cause_is(sc->causes[k], got)) k++;
    T_CHECK_MSG(cause_is(sc->causes[k], got), "recovery %d: cause %s, expected %s", i, cause, sc->causes[k]);
    int join = strcmp(cause, "join") == 0;
    if (sc->restore && strcmp(sc->restore, "ckpt") == 0 && !join)
      /* what is lost is what the newest committed checkpoint lacks (check_ckpt_restores);
         how much depends on how far the asynchronous writer lagged behind */
      T_CHECK_MSG(lost >= 0, "recovery %d (%s): %lld steps lost", i, cause, (long long)lost);
    else if (strcmp(cause, "crash") == 0)
      /* a rank killed after its step's commit and before that step's copies of its shards
         (worker_replicate: "a rank lost before them costs this step", worker/worker.c) costs
         that one step, said as such (check_account holds the summary and the event log to
         one account of it): the chaos kill fires on the step log's line, and on a loaded
         machine it lands there now and then (CI: elastic_mlp_crash, elastic_nccl_tp2pp2z1) */
      T_CHECK_MSG(lost == 0 || lost == 1, "recovery %d (%s): %lld steps lost", i, cause, (long long)lost);
    else
      T_CHECK_MSG(lost == 0, "recovery %d (%s): %lld steps lost", i, cause, (long long)lost);
    T_CHECK_MSG(injected, "recovery %d (%s) matches no injected fault", i, cause);
    T_CHECK_MSG(total >= 0, "recovery %d: total_ms %lld", i, (long long)total);
    /* state from memory, or from a peer that applied one step more before the fault;
       a joiner always from a peer: never from disk -- unless nobody holds a state */
    int from_ok = join          ? strcmp(restore, "peer") == 0
                  : sc->restore ? strcmp(restore, sc->restore) == 0
                                               : strcmp(restore, "memory") == 0 || strcmp(restore, "peer") == 0;
    T_CHECK_MSG(from_ok, "recovery %d (%s): state from %s", i, cause, restore);
    int64_t world = 0;
    newt_json_get_int(r, "recovery", "world", 1, &world);
    T_CHECK_MSG(!sc->world || r->next || world == sc->world, "recovery %d (%s): %lld ranks after it, expected %d "
                "(every survivor training)", i, cause, (long long)world, sc->world);
  }
  cJSON_Delete(j);
  free(text);
  check_logs(logs);
  check_generations(logs, healthy);
  if (sc->restore && strcmp(sc->restore, "ckpt") == 0) check_ckpt_restores(logs, sc->ckpt_every);
  int shards = 0; /* tensor, pipeline or ZeRO: no rank holds a whole state */
  for (int k = 0; sc->extra[k]; k++)
    shards |= !strcmp(sc->extra[k], "--tp") || !strcmp(sc->extra[k], "--pp") || !strcmp(sc->extra[k], "--zero");
  check_samples(samples, STEPS, shards);
  if (sc->stale) check_stale(samples, sc->stale);
}

/* --- bad input: rejected, naming the field ------------------------------------------------- */

static void expect_rejected(const char *const *argv, const char *needle) {
  char *out = NULL;
  int rc = run_capture(argv, &out);
  T_CHECK_MSG(rc == 2, "%s %s exited %d, expected 2:\n%s", argv[1], argv[2], rc, out ? out : "");
  T_CHECK_MSG(out && strstr(out, needle), "the message does not name \"%s\":\n%s", needle, out ? out : "");
  free(out);
}

static void test_cli(void) {
  const char *n = newt_bin;
  const char *chaos1[] = {n, "run", "--chaos", "kill:worker:x@step=3", NULL};
  expect_rejected(chaos1, "worker index \"x\"");
  const char *chaos2[] = {n, "run", "--chaos", "kill:worker:1@step=3,explode:etcd@step=4", NULL};
  expect_rejected(chaos2, "item 2: unknown action \"explode\"");
  const char *host1[] = {n, "run", "--chaos", "kill:host:0@step=3", NULL};
  expect_rejected(host1, "kill:host:0@step=3: a host to kill needs --hosts H");
  const char *host2[] = {n, "run", "--nproc", "4", "--hosts", "2", "--chaos", "kill:host:2@step=3", NULL};
  expect_rejected(host2, "kill:host:2@step=3: no such simulated host");
  const char *ckpt1[] = {n, "run", "--chaos", "kill:worker:0@ckpt=20", NULL};
  expect_rejected(ckpt1, "kill:worker:0@ckpt=20: the job writes no checkpoints");
  const char *host3[] = {n, "run", "--nproc", "4", "--hosts", "5", NULL};
  expect_rejected(host3, "--hosts 5: 0 (none) to --nproc 4");
  const char *reps[] = {n, "run", "--replicas", "9", NULL};
  expect_rejected(reps, "spec.fault.replicas: must be 1..8");
  const char *batch[] = {n, "run", "--global-batch", "30", "--micro-batch", "4", NULL};
  expect_rejected(batch, "spec.train.global_batch");
  const char *model[] = {n, "run", "--model", "layerz=2", NULL};
  expect_rejected(model, "layerz");
  char path[400];
  snprintf(path, sizeof path, "%s/bad-spec.json", tmpdir);
  const char *bad = "{\"job\":\"j\",\"parallel\":{\"tp\":0}}";
  T_OK(newt_fs_write_atomic(path, bad, strlen(bad)));
  const char *spec[] = {n, "run", "--spec", path, NULL};
  expect_rejected(spec, "spec.parallel.tp");
  const char *spec2[] = {n, "coordinator", "--job", "j", "--etcd", "http://127.0.0.1:1", "--spec", path, NULL};
  char *out = NULL;
  int rc = run_capture(spec2, &out);
  T_CHECK_MSG(rc != 0 && out && strstr(out, path) && strstr(out, "spec.parallel.tp"),
              "newt coordinator took a bad spec (exit %d):\n%s", rc, out ? out : "");
  free(out);
  const char *flag[] = {n, "worker", "--job", "j", "--threds", "2", NULL};
  expect_rejected(flag, "unknown flag --threds");
}

/* --- across hosts: network namespaces ------------------------------------------------- */

#define NETNS_HOSTS 4
/* Long enough that what a test waits for (a lease's TTL running out, a worker proving its
   links after a cut healed) comes before the end: 300 steps did when a step of this model
   took ~17 ms, not at ~4 ms on the CPU's own GEMM kernels (docs/model.md) */
#define NETNS_STEPS 1000
static char ns_tag[16];
static int ns_made;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
  char cmd[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int rc = system(cmd);
  if (rc != 0) fprintf(stderr, "test_elastic: `%s` failed (%d)\n", cmd, rc);
  return rc;
}

static void netns_cleanup(void) {
  if (!ns_made) return;
  for (int i = 0; i < NETNS_HOSTS; i++) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ip netns del %s-%d 2>/dev/null; ip link del %sv%d 2>/dev/null", ns_tag, i, ns_tag, i);
    if (system(cmd)) { /* already gone */
    }
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "ip link del %sbr 2>/dev/null", ns_tag);
  if (system(cmd)) {
  }
  ns_made = 0;
}

/* 10.<a>.<b>.1 on the bridge, .10+i in host i. */
static int netns_setup(int a, int b) {
  ns_made = 1;
  atexit(netns_cleanup);
  if (sh("ip link add %sbr type bridge && ip addr add 10.%d.%d.1/24 dev %sbr && ip link set %sbr up", ns_tag, a, b,
         ns_tag, ns_tag))
    return -1;
  for (int i = 0; i < NETNS_HOSTS; i++) {
    if (sh("ip netns add %s-%d && ip link add %sv%d type veth peer name %sp%d && ip link set %sp%d netns %s-%d && "
           "ip link set %sv%d master %sbr && ip link set %sv%d up && "
           "ip netns exec %s-%d ip addr add 10.%d.%d.%d/24 dev %sp%d && ip netns exec %s-%d ip link set %sp%d up && "
           "ip netns exec %s-%d ip link set lo up",
           ns_tag, i, ns_tag, i, ns_tag, i, ns_tag, i, ns_tag, i, ns_tag, i, ns_tag, ns_tag, i, ns_tag, i, a, b,
           10 + i, ns_tag, i, ns_tag, i, ns_tag, i, ns_tag, i))
      return -1;
  }
  return 0;
}

static newt_result_t get_json(rdzv_etcd *c, const char *job, const char *key, cJSON **out) {
  char k[256];
  rdzv_etcd_kv kv;
  NEWT_CHECK(newt_job_path(k, sizeof k, job, key));
  NEWT_CHECK(rdzv_etcd_get(c, k, newt_deadline_in_ms(3000), &kv, NULL));
  newt_result_t r = newt_json_parse(kv.value, kv.value_len, key, out);
  rdzv_etcd_kv_free(&kv);
  return r;
}

static int64_t json_int(const cJSON *j, const char *field) {
  int64_t v = -1;
  newt_json_get_int(j, "value", field, 1, &v);
  return v;
}


/* --- a hostile writer in etcd ------------------------------------------------------------ */

/* A job of 3 workers run by `newt run` on an etcd of the test's own, which the test writes
 * to while the job trains (the hostile writers below). */
typedef struct hostile_job {
  rdzv_etcd_server *srv;
  rdzv_etcd *c; /* the test's own client */
  pid_t pid;
  int status;   /* newt run's, once it ended (waitpid's) */
  char logs[512], summary[512], out[600];
} hostile_job;

static int hostile_start(hostile_job *h, const char *bin, const char *job, int steps, const char *chaos) {
  memset(h, 0, sizeof *h);
  h->status = -1;
  rdzv_etcd_server_opts so = {0};
  T_OK(rdzv_etcd_server_start(&so, &h->srv));
  if (!h->srv) return 0;
  rdzv_etcd_opts eo;
  rdzv_etcd_server_client_opts(h->srv, &eo);
  T_OK(rdzv_etcd_init(&eo, &h->c));
  char st[16], gb[16], mb[16];
  snprintf(h->logs, sizeof h->logs, "%s/logs", tmpdir);
  snprintf(h->summary, sizeof h->summary, "%s/summary.json", tmpdir);
  snprintf(h->out, sizeof h->out, "%s/run.out", tmpdir);
  snprintf(st, sizeof st, "%d", steps);
  snprintf(gb, sizeof gb, "%d", GB);
  snprintf(mb, sizeof mb, "%d", MB);
  const char *argv[32] = {bin, "run", "--quiet", "--etcd", rdzv_etcd_server_url(h->srv), "--job", job,
                          "--nproc", "3", "--model", MODEL, "--seq-len", SEQ, "--steps", st, "--global-batch", gb,
                          "--micro-batch", mb, "--log-dir", h->logs, "--summary", h->summary, "--timeout-ms", "240000"};
  int a = 25;
  if (chaos) argv[a++] = "--chaos", argv[a++] = chaos;
  argv[a] = NULL;
  newt_spawn_opts po = {.log_path = h->out};
  T_OK(newt_proc_spawn(argv, &po, &h->pid));
  return h->c != NULL;
}

/* Whether newt run has ended (its status in h->status). */
static int hostile_ended(hostile_job *h) { return waitpid(h->pid, &h->status, WNOHANG) == h->pid; }

/* The job's progress record's step (0 when there is none yet). */
static int64_t hostile_step(hostile_job *h, const char *job) {
  cJSON *prog = NULL;
  int64_t step = 0;
  if (get_json(h->c, job, "progress", &prog) == NEWT_OK) step = json_int(prog, "step");
  cJSON_Delete(prog);
  return step;
}

/* The run's summary when it ended done with every step at the uninterrupted loss (NULL and
 * a failed check otherwise); *text, its text. */
static cJSON *hostile_done(hostile_job *h, int steps, double ref, char **text) {
  size_t n;
  cJSON *j = NULL;
  *text = NULL;
  T_OK(newt_fs_read_all(h->summary, 1 << 20, text, &n));
  if (*text) T_OK(newt_json_parse(*text, n, "summary", &j));
  int done = 0;
  int64_t st = 0;
  double loss = NAN;
  newt_json_get_bool(j, "summary", "done", 1, &done);
  newt_json_get_int(j, "summary", "steps", 1, &st);
  newt_json_get_double(j, "summary", "final_loss", 1, &loss);
  T_CHECK_MSG(done && st == steps, "done %d after %lld steps", done, (long long)st);
  T_CHECK_MSG(fabs(loss - ref) <= 1e-4 * fmax(1.0, fabs(ref)), "final loss %.7f, uninterrupted %.7f", loss, ref);
  return j;
}

static void hostile_free(hostile_job *h) {
  if (h->pid > 0 && !WIFEXITED(h->status)) newt_proc_stop(h->pid, 1000);
  rdzv_etcd_free(h->c);
  rdzv_etcd_server_free(h->srv);
}

/* Anyone who can write under the job's prefix, or a buggy client (issue 17, items 6 and 7):
 * while a job trains, a forger writes a report in w0's name for the current generation
 * every 200 ms (on no lease, accusing nobody), forged acks, an end marker that says step 55,
 * and over the plan a copy whose generation is 2^63 - 1. The job must run to its end as if
 * nothing happened: no recovery, nobody fenced, every step, the uninterrupted loss. */
static void test_forged(void) {
  const int STEPS = 150;
  double ref = reference_loss(newt_bin, STEPS, MODEL);
  hostile_job h;
  if (!hostile_start(&h, newt_bin, "forged", STEPS, NULL)) return;
  rdzv_etcd *c = h.c;
  int forged_done = 0, forged_plan = 0;
  for (newt_deadline_t d = newt_deadline_in_ms(200000); !newt_deadline_passed(d) && !hostile_ended(&h);
       newt_sleep_ms(200)) {
    char *plan = NULL;
    int64_t g = 0;
    if (job_plan_get(c, "forged", newt_deadline_in_ms(1000), &plan, &g, NULL) != NEWT_OK) continue;
    char key[256], suffix[128];
    const char *rep = "{\"worker\":\"w0\",\"kind\":\"crash\",\"accuse\":[],\"step\":1,\"t_ms\":1,\"why\":\"forged\"}";
    snprintf(suffix, sizeof suffix, "reports/%020lld/w0", (long long)g);
    if (newt_job_path(key, sizeof key, "forged", suffix) == NEWT_OK) rdzv_etcd_put(c, key, rep, strlen(rep), 0, newt_deadline_in_ms(1000), NULL);
    const char *ack = "{\"rank\":1,\"t_plan\":1,\"t_comm\":1,\"t_restore\":1,\"t_step\":99999999999999,"
                      "\"restore\":\"ckpt\",\"restore_step\":0}";
    snprintf(suffix, sizeof suffix, "acks/%020lld/w1", (long long)g);
    if (newt_job_path(key, sizeof key, "forged", suffix) == NEWT_OK) rdzv_etcd_put(c, key, ack, strlen(ack), 0, newt_deadline_in_ms(1000), NULL);
    int64_t step = hostile_step(&h, "forged");
    if (step >= 20 && !forged_done) {
      const char *done = "{\"step\":55,\"loss\":1.0,\"t_ms\":1,\"samples\":1320}";
      if (newt_job_path(key, sizeof key, "forged", "done") == NEWT_OK &&
          rdzv_etcd_put(c, key, done, strlen(done), 0, newt_deadline_in_ms(1000), NULL) == NEWT_OK)
        forged_done = 1;
    }
    if (step >= 30 && !forged_plan && plan) {
      char gen[48];
      snprintf(gen, sizeof gen, "\"generation\":%lld", (long long)g);
      char *at = strstr(plan, gen);
      if (at) {
        char *copy = newt_asprintf("%.*s\"generation\":\"9223372036854775807\"%s", (int)(at - plan), plan, at + strlen(gen));
        if (copy && newt_job_path(key, sizeof key, "forged", "plan") == NEWT_OK &&
            rdzv_etcd_put(c, key, copy, strlen(copy), 0, newt_deadline_in_ms(1000), NULL) == NEWT_OK)
          forged_plan = 1;
        free(copy);
      }
    }
    free(plan);
  }
  T_CHECK_MSG(WIFEXITED(h.status) && WEXITSTATUS(h.status) == 0, "newt run with a forger did not finish well (status %d); logs in %s", h.status, tmpdir);
  T_CHECK_MSG(forged_done && forged_plan, "the forger did not get to write (done %d, plan %d)", forged_done, forged_plan);
  char *text = NULL;
  cJSON *j = hostile_done(&h, STEPS, ref, &text);
  T_CHECK_MSG(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "recoveries")) == 0,
              "the forger caused recoveries:\n%s", text ? text : "");
  cJSON_Delete(j);
  free(text);
  check_generations(h.logs, 1);
  hostile_free(&h);
}

/* A copy of plan text with `field`'s value (the text after "field": up to the next ',' or
 * '}') replaced by `value`; NULL when the field is not there. */
static char *plan_with(const char *plan, const char *field, const char *value) {
  char key[64];
  snprintf(key, sizeof key, "\"%s\":", field);
  const char *at = strstr(plan, key);
  if (!at) return NULL;
  const char *v = at + strlen(key), *end = v + strcspn(v, ",}");
  return newt_asprintf("%.*s%s%s", (int)(v - plan), plan, value, end);
}

/* Plans that parse but lie (issue 24, items 1 and 2): while a job trains, a forger puts over
 * the plan a copy of it that is consistent in itself but, with `batch`, of the next
 * generation with a global batch 500 times the spec's (workers fetched past their loader's
 * buffer: SIGSEGV), or else of the largest valid generation (at the next membership change
 * the leader published one past it, which its own parser refused, every 5 s, forever); then
 * a worker is killed. Every reader ignores the forgery (the leader puts its own plan back),
 * the kill is recovered in the next generation, and the job ends at the uninterrupted loss;
 * no process crashes. */
static void test_forged_plans(int batch) {
  const int STEPS = 300;
  double ref = reference_loss(newt_bin, STEPS, MODEL);
  hostile_job h;
  if (!hostile_start(&h, newt_bin, "lies", STEPS, "kill:worker:1@step=150")) return;
  int forged = 0;
  for (newt_deadline_t d = newt_deadline_in_ms(200000); !newt_deadline_passed(d) && !hostile_ended(&h);
       newt_sleep_ms(50)) {
    char *plan = NULL, key[256], gen[32];
    int64_t g = 0;
    if (forged || job_plan_get(h.c, "lies", newt_deadline_in_ms(1000), &plan, &g, NULL) != NEWT_OK) continue;
    char *a = NULL, *b = NULL, *cc = NULL;
    if (hostile_step(&h, "lies") >= 10) {
      snprintf(gen, sizeof gen, "%lld", batch ? (long long)g + 1 : (long long)NEWT_JSON_INT_EXACT - 1);
      a = plan_with(plan, "generation", gen);
      /* a global batch 500 times the spec's, the plan consistent in itself (accum x dp x
         micro_batch), so that only the spec can tell */
      cJSON *pj = cJSON_Parse(plan);
      int64_t dp = pj ? json_int(pj, "dp") : 0, mbs = pj ? json_int(pj, "micro_batch") : 0;
      cJSON_Delete(pj);
      char big[32];
      snprintf(big, sizeof big, "%lld", (long long)(dp * mbs * 500));
      b = a && batch ? plan_with(a, "global_batch", big) : NULL;
      cc = b ? plan_with(b, "accum", "500") : NULL;
      const char *put = batch ? cc : a;
      if (put && newt_job_path(key, sizeof key, "lies", "plan") == NEWT_OK &&
          rdzv_etcd_put(h.c, key, put, strlen(put), 0, newt_deadline_in_ms(1000), NULL) == NEWT_OK)
        forged++;
    }
    free(a);
    free(b);
    free(cc);
    free(plan);
  }
  T_CHECK_MSG(WIFEXITED(h.status) && WEXITSTATUS(h.status) == 0, "newt run with forged plans did not finish well "
              "(status %d); logs in %s", h.status, tmpdir);
  T_CHECK_MSG(forged == 1, "the forger did not get to write its plan");
  char *text = NULL;
  cJSON *j = hostile_done(&h, STEPS, ref, &text);
  const cJSON *recs = cJSON_GetObjectItemCaseSensitive(j, "recoveries");
  const char *cause = "";
  if (cJSON_GetArraySize(recs) == 1) newt_json_get_str(recs->child, "recovery", "cause", 1, &cause);
  T_CHECK_MSG(cJSON_GetArraySize(recs) == 1 && strcmp(cause, "crash") == 0, "expected the kill's recovery alone:\n%s",
              text ? text : "");
  int64_t gens = 0;
  newt_json_get_int(j, "summary", "generations", 1, &gens);
  T_CHECK_MSG(gens <= 3, "%lld generations: a forged generation was taken", (long long)gens);
  cJSON_Delete(j);
  free(text);
  check_generations(h.logs, 0);
  check_logs(h.logs);
  hostile_free(&h);
}

static void test_forged_batch(void) { test_forged_plans(1); }
static void test_forged_generation(void) { test_forged_plans(0); }

/* One mutation of a record's value, the n-th of a fixed sequence (the same every run): a
 * field dropped, its type swapped, a number at or past a bound, a number that disagrees
 * with the others (doubled), an array made huge, control bytes in a string, the text cut
 * short or made binary. Returns malloc'd bytes and their length in *len. */
static char *mutate(const char *value, size_t vlen, unsigned n, size_t *len) {
  static const double bounds[] = {0, -1, 2147483648.0, 9007199254740993.0, 9.3e18, 1e308, -1e308};
  unsigned kind = n % 7, pick = n / 7;
  cJSON *j = kind < 6 ? cJSON_ParseWithLength(value, vlen) : NULL;
  int nf = j && cJSON_IsObject(j) ? cJSON_GetArraySize(j) : 0;
  char *out = NULL;
  if (nf > 0) {
    cJSON *f = cJSON_GetArrayItem(j, (int)(pick % (unsigned)nf));
    char name[64];
    snprintf(name, sizeof name, "%s", f->string ? f->string : "x");
    cJSON *repl = NULL;
    if (kind == 0) {
      cJSON_DeleteItemFromObjectCaseSensitive(j, name);
    } else if (kind == 1) {
      repl = cJSON_IsNumber(f) ? cJSON_CreateString("12x") : cJSON_IsString(f) ? cJSON_CreateNumber(12345)
                                                                                : cJSON_CreateString("true");
    } else if (kind == 2) {
      repl = cJSON_CreateNumber(bounds[pick % (sizeof bounds / sizeof bounds[0])]);
    } else if (kind == 3) {
      repl = cJSON_IsNumber(f) ? cJSON_CreateNumber(f->valuedouble * 2 + 1) : cJSON_CreateNumber(3);
    } else if (kind == 4) {
      repl = cJSON_CreateArray();
      for (int i = 0; repl && i < 20000; i++) cJSON_AddItemToArray(repl, cJSON_CreateNumber(i));
    } else {
      char text[128];
      snprintf(text, sizeof text, "%s\x1b[2J\n\x07%s", cJSON_IsString(f) ? f->valuestring : "w0", "\x7f");
      repl = cJSON_CreateString(text);
    }
    if (repl) cJSON_ReplaceItemInObjectCaseSensitive(j, name, repl);
    out = cJSON_PrintUnformatted(j);
  }
  cJSON_Delete(j);
  if (!out) { /* not an object, or the last kind: cut short, or bytes no parser takes */
    out = malloc(vlen + 4);
    if (!out) return NULL;
    if (pick % 2 == 0 && vlen > 1) memcpy(out, value, vlen / 2), out[vlen / 2] = '\0';
    else memcpy(out, "\x01\xff{\x00", 4), out[3] = '\0';
    *len = pick % 2 == 0 && vlen > 1 ? vlen / 2 : 3;
    return out;
  }
  *len = strlen(out);
  return out;
}

/* Hostile etcd (issue 24, "make the class impossible"): while a job trains, a writer
 * rewrites every record under /newt/<job>/ in turn with a mutation of its value (mutate),
 * 600 writes in all from the job's fifth step on, then stops. newt is the sanitized build
 * (asan_build, NEWT_ASAN_BIN): no process may crash, hang or report a memory error, and the
 * job either ends done at the uninterrupted loss with every step, or fails with a clear
 * failure of its own. */
static void test_hostile_etcd(void) {
  const int STEPS = 400;
  const char *bin = getenv("NEWT_ASAN_BIN") && *getenv("NEWT_ASAN_BIN") ? getenv("NEWT_ASAN_BIN") : newt_bin;
  double ref = reference_loss(newt_bin, STEPS, MODEL);
  hostile_job h;
  char prefix[256];
  T_OK(newt_job_path(prefix, sizeof prefix, "hostile", ""));
  if (!hostile_start(&h, bin, "hostile", STEPS, NULL)) return;
  unsigned writes = 0, round = 0;
  for (newt_deadline_t d = newt_deadline_in_ms(280000); !newt_deadline_passed(d) && !hostile_ended(&h);
       newt_sleep_ms(writes < 600 ? 20 : 200)) {
    if (writes >= 600 || (writes == 0 && hostile_step(&h, "hostile") < 5)) continue; /* a running job first */
    rdzv_etcd_kvs kvs;
    if (rdzv_etcd_range(h.c, prefix, &(rdzv_etcd_range_opts){.prefix = 1, .sort = RDZV_SORT_KEY_ASCEND},
                        newt_deadline_in_ms(1000), &kvs) != NEWT_OK)
      continue;
    if (kvs.n > 0) {
      const rdzv_etcd_kv *kv = &kvs.kvs[round++ % kvs.n];
      size_t len = 0;
      char *bad = mutate(kv->value, kv->value_len, writes, &len);
      if (bad && rdzv_etcd_put(h.c, kv->key, bad, len, 0, newt_deadline_in_ms(1000), NULL) == NEWT_OK) writes++;
      free(bad);
    }
    rdzv_etcd_kvs_free(&kvs);
  }
  int ended = WIFEXITED(h.status);
  char *out = NULL;
  size_t on = 0;
  newt_fs_read_all(h.out, 1 << 20, &out, &on);
  T_CHECK_MSG(ended, "newt run did not end under a hostile etcd (a hang); logs in %s", tmpdir);
  T_CHECK_MSG(writes >= 100 || (ended && WEXITSTATUS(h.status) != 0), "the hostile writer got only %u writes in", writes);
  T_CHECK_MSG(!out || (!strstr(out, "signal") && !strstr(out, "Sanitizer") && !strstr(out, "runtime error")),
              "a process crashed under a hostile etcd:\n%s", out ? out : "");
  check_logs(h.logs);
  if (ended && WEXITSTATUS(h.status) == 0) {
    char *text = NULL;
    cJSON_Delete(hostile_done(&h, STEPS, ref, &text));
    free(text);
    fprintf(stderr, "  hostile etcd: %u writes; the job ended done at the uninterrupted loss\n", writes);
  } else if (ended) {
    const char *last = out ? strstr(out, "newt run: ") : NULL;
    T_CHECK_MSG(last && (strstr(last, "fail") || strstr(last, "exited")), "newt run exited %d without saying why:\n%s",
                WEXITSTATUS(h.status), out ? out : "");
    fprintf(stderr, "  hostile etcd: %u writes; the job ended with a failure of its own:\n%s", writes, out ? out : "");
  }
  free(out);
  hostile_free(&h);
}

/* etcd out of space (issue 12; issue 17, item 8): a job on an etcd with an 8 MiB quota,
 * which a filler then fills until etcd raises its NOSPACE alarm and refuses every write.
 * Training goes on (the step log, which rank 0 writes itself, keeps growing), `newt status`
 * and the coordinator's log say that etcd is out of space; then a worker is killed (its
 * survivors cannot even report it), and once space is freed (delete, compact, defrag,
 * disarm, as an operator would) the coordinators, still there, replan and the job finishes:
 * every step, the uninterrupted loss, an etcd event saying how long it was full. */
/* Whether a coordinator's log (c0.log, c1.log in logs) says etcd ran out of space. */
static int coordinator_said_nospace(const char *logs) {
  int said = 0;
  for (int k = 0; k < 2 && !said; k++) {
    char path[600], *log = NULL;
    size_t ln;
    snprintf(path, sizeof path, "%s/c%d.log", logs, k);
    if (newt_fs_read_all(path, 64 << 20, &log, &ln) == NEWT_OK) said = strstr(log, "out of space (NOSPACE") != NULL;
    free(log);
  }
  return said;
}

static void test_nospace(void) {
  /* long enough to train through the fill, the kill, the leader's next look at etcd's alarms
     (every 5 s) and the clean-up: 1200 steps were when a step took ~17 ms, not at ~4 ms on
     the CPU's own GEMM kernels (docs/model.md) */
  const int STEPS = 5000;
  double ref = reference_loss(newt_bin, STEPS, MODEL);
  rdzv_etcd_server *srv = NULL;
  rdzv_etcd_server_opts so = {.quota_bytes = 8 << 20};
  T_OK(rdzv_etcd_server_start(&so, &srv));
  if (!srv) return;
  rdzv_etcd_opts eo;
  rdzv_etcd_server_client_opts(srv, &eo);
  rdzv_etcd *c = NULL;
  T_OK(rdzv_etcd_init(&eo, &c));
  const char *url = rdzv_etcd_server_url(srv);
  char logs[512], summary[512], steps[16], gb[16], mb[16], steplog[600];
  snprintf(logs, sizeof logs, "%s/logs", tmpdir);
  snprintf(summary, sizeof summary, "%s/summary.json", tmpdir);
  snprintf(steplog, sizeof steplog, "%s/steps.jsonl", logs);
  snprintf(steps, sizeof steps, "%d", STEPS);
  snprintf(gb, sizeof gb, "%d", GB);
  snprintf(mb, sizeof mb, "%d", MB);
  const char *argv[] = {newt_bin, "run", "--quiet", "--etcd", url, "--job", "nospace", "--nproc", "3", "--model", MODEL,
                        "--seq-len", SEQ, "--steps", steps, "--global-batch", gb, "--micro-batch", mb, "--log-dir",
                        logs, "--summary", summary, "--timeout-ms", "240000", NULL};
  char outp[600];
  snprintf(outp, sizeof outp, "%s/run.out", tmpdir);
  newt_spawn_opts po = {.log_path = outp};
  pid_t pid;
  T_OK(newt_proc_spawn(argv, &po, &pid));
  /* training runs */
  int64_t step = 0;
  for (newt_deadline_t d = newt_deadline_in_ms(60000); step < 10 && !newt_deadline_passed(d); newt_sleep_ms(20)) {
    cJSON *prog = NULL;
    if (get_json(c, "nospace", "progress", &prog) == NEWT_OK) step = json_int(prog, "step"), cJSON_Delete(prog);
  }
  T_CHECK_MSG(step >= 10, "training never reached step 10; logs in %s", tmpdir);
  /* the victim, later: rank 1 of the plan (rank 0 writes the end marker) */
  char victim_id[RDZV_NAME_MAX] = "";
  char *plan_text = NULL;
  newt_plan plan;
  if (job_plan_get(c, "nospace", newt_deadline_in_ms(2000), &plan_text, NULL, NULL) == NEWT_OK &&
      plan_from_json(plan_text, strlen(plan_text), &plan) == NEWT_OK) {
    if (plan.nranks > 1) snprintf(victim_id, sizeof victim_id, "%s", plan.ranks[1].worker);
    plan_free(&plan);
  }
  free(plan_text);
  T_CHECK_MSG(victim_id[0], "no rank 1 in the plan");
  /* fill etcd until it refuses */
  char *blob = malloc(1 << 20);
  memset(blob, 'x', 1 << 20);
  newt_result_t full = NEWT_OK;
  for (int i = 0; i < 64 && full != NEWT_ERR_NOSPACE; i++) {
    char key[64];
    snprintf(key, sizeof key, "/filler/%d", i);
    full = rdzv_etcd_put(c, key, blob, 1 << 20, 0, newt_deadline_in_ms(10000), NULL);
  }
  free(blob);
  T_CHECK_MSG(full == NEWT_ERR_NOSPACE, "etcd never ran out of space: %s", newt_errmsg());
  size_t n0 = 0, n1 = 0;
  job_step *ls = NULL;
  if (job_steplog_read(steplog, &ls, &n0, NULL) == NEWT_OK) free(ls);
  newt_sleep_ms(1000);
  if (job_steplog_read(steplog, &ls, &n1, NULL) == NEWT_OK) free(ls);
  T_CHECK_MSG(n1 > n0 && n1 < (size_t)STEPS, "no step in 1 s while etcd was out of space (%zu, then %zu of %d)", n0, n1,
              STEPS);
  char *out = NULL;
  const char *st[] = {newt_bin, "status", "--etcd", url, "--job", "nospace", NULL};
  run_capture(st, &out);
  T_CHECK_MSG(out && strstr(out, "NOSPACE"), "newt status does not say that etcd is out of space:\n%s", out ? out : "");
  free(out);
  /* a rank dies while etcd is full: its pid from its log ("w1[pid] ...") */
  char wlog[600], who[RDZV_NAME_MAX + 2], *wtext = NULL;
  size_t wn;
  snprintf(wlog, sizeof wlog, "%s/%s.log", logs, victim_id);
  snprintf(who, sizeof who, "%s[", victim_id);
  int victim = 0;
  const char *br = NULL;
  if (newt_fs_read_all(wlog, 1 << 20, &wtext, &wn) == NEWT_OK && (br = strstr(wtext, who)) != NULL)
    victim = atoi(br + strlen(who));
  free(wtext);
  T_CHECK_MSG(victim > 1 && kill(victim, SIGKILL) == 0, "cannot kill %s (pid %d)", victim_id, victim);
  newt_sleep_ms(2000);
  /* the leader reads etcd's alarms every 5 s: let it see this one before space is freed
     (checked below) */
  for (newt_deadline_t d = newt_deadline_in_ms(20000); !newt_deadline_passed(d) && !coordinator_said_nospace(logs);)
    newt_sleep_ms(200);
  /* free space, as an operator would */
  int64_t deleted = 0, rev = 0;
  T_OK(rdzv_etcd_delete(c, "/filler/", 1, newt_deadline_in_ms(10000), &deleted, &rev));
  T_OK(rdzv_etcd_compact(c, rev, newt_deadline_in_ms(10000)));
  T_CHECK(sh("ETCDCTL_API=3 etcdctl --endpoints %s defrag >/dev/null && ETCDCTL_API=3 etcdctl --endpoints %s alarm disarm "
             ">/dev/null",
             url, url) == 0);
  int stt = -1;
  T_CHECK_MSG(newt_proc_wait(pid, 200000, &stt) == NEWT_OK && WIFEXITED(stt) && WEXITSTATUS(stt) == 0,
              "newt run did not finish once etcd had space again; logs in %s", tmpdir);
  char *text = NULL;
  size_t n;
  cJSON *j = NULL;
  T_OK(newt_fs_read_all(summary, 1 << 20, &text, &n));
  if (text) T_OK(newt_json_parse(text, n, "summary", &j));
  if (j) {
    int done = 0;
    int64_t st2 = 0, samples_n = 0;
    double loss = NAN;
    newt_json_get_bool(j, "summary", "done", 1, &done);
    newt_json_get_int(j, "summary", "steps", 1, &st2);
    newt_json_get_int(j, "summary", "samples_consumed", 1, &samples_n);
    newt_json_get_double(j, "summary", "final_loss", 1, &loss);
    T_CHECK(done && st2 == STEPS && samples_n == (int64_t)STEPS * GB);
    T_CHECK_MSG(fabs(loss - ref) <= 1e-4 * fmax(1.0, fabs(ref)), "final loss %.7f, uninterrupted %.7f", loss, ref);
    int replanned = 0;
    const cJSON *recs = cJSON_GetObjectItemCaseSensitive(j, "recoveries");
    for (const cJSON *r = recs ? recs->child : NULL; r; r = r->next) {
      const char *cause = "";
      int64_t lost = -1;
      newt_json_get_str(r, "recovery", "cause", 1, &cause);
      newt_json_get_int(r, "recovery", "steps_lost", 1, &lost);
      replanned |= (!strcmp(cause, "crash") || !strcmp(cause, "hang")) && lost == 0;
    }
    T_CHECK_MSG(replanned, "no recovery from the worker killed while etcd was full:\n%s", text);
    cJSON_Delete(j);
  }
  free(text);
  /* the coordinators said so */
  T_CHECK_MSG(coordinator_said_nospace(logs), "no coordinator said that etcd was out of space; logs in %s", tmpdir);
  job_event *ev = NULL;
  size_t nev = 0;
  char evlog[600];
  snprintf(evlog, sizeof evlog, "%s/events.jsonl", logs);
  int told = 0;
  if (job_eventlog_read(evlog, &ev, &nev, NULL) == NEWT_OK)
    for (size_t k = 0; k < nev; k++) told |= ev[k].type == JOB_EV_ETCD && strstr(ev[k].why, "out of space") != NULL;
  job_eventlog_free(ev, nev);
  T_CHECK_MSG(told, "no event says that etcd was out of space; logs in %s", tmpdir);
  check_generations(logs, 0);
  rdzv_etcd_free(c);
  rdzv_etcd_server_free(srv);
}


/* A process that can read etcd but does not hold the job's secret (issue 17, item 11): it
 * registers as a worker and the leader plans it in, but the plan in etcd holds only a salt,
 * so it cannot prove the generation's key: the ranks refuse its connections, report it, the
 * leader fences it and trains on without it. It never takes part in a step; the job ends with
 * every step and the uninterrupted loss. Beside two workers it is outvoted (it names both,
 * each names it); beside one, the two name each other and the leader keeps the one that
 * holds the job's state -- the impostor gives up first (it had no step to finish), so a
 * leader that took the first to speak for the truth handed it the job. */
static void test_impostor_n(int nproc) {
  const int STEPS = 300;
  double ref = reference_loss(newt_bin, STEPS, MODEL);
  rdzv_etcd_server *srv = NULL;
  rdzv_etcd_server_opts so = {0};
  T_OK(rdzv_etcd_server_start(&so, &srv));
  if (!srv) return;
  rdzv_etcd_opts eo;
  rdzv_etcd_server_client_opts(srv, &eo);
  rdzv_etcd *c = NULL;
  T_OK(rdzv_etcd_init(&eo, &c));
  const char *url = rdzv_etcd_server_url(srv);
  char logs[512], summary[512], steps[16], gb[16], mb[16], samples[512], np[16];
  snprintf(logs, sizeof logs, "%s/logs", tmpdir);
  snprintf(summary, sizeof summary, "%s/summary.json", tmpdir);
  snprintf(samples, sizeof samples, "%s/samples", tmpdir);
  T_OK(newt_fs_mkdirs(samples, 0755));
  setenv("NEWT_SAMPLE_LOG_DIR", samples, 1);
  snprintf(steps, sizeof steps, "%d", STEPS);
  snprintf(gb, sizeof gb, "%d", GB);
  snprintf(mb, sizeof mb, "%d", MB);
  snprintf(np, sizeof np, "%d", nproc);
  const char *argv[] = {newt_bin, "run", "--quiet", "--etcd", url, "--job", "impostor", "--nproc", np, "--model", MODEL,
                        "--seq-len", SEQ, "--steps", steps, "--global-batch", gb, "--micro-batch", mb, "--log-dir",
                        logs, "--summary", summary, "--timeout-ms", "200000", NULL};
  char outp[600], ilog[600];
  snprintf(outp, sizeof outp, "%s/run.out", tmpdir);
  snprintf(ilog, sizeof ilog, "%s/impostor.log", tmpdir);
  newt_spawn_opts po = {.log_path = outp};
  pid_t pid, imp = 0;
  T_OK(newt_proc_spawn(argv, &po, &pid));
  int64_t step = 0;
  for (newt_deadline_t d = newt_deadline_in_ms(60000); step < 10 && !newt_deadline_passed(d); newt_sleep_ms(50)) {
    cJSON *prog = NULL;
    if (get_json(c, "impostor", "progress", &prog) == NEWT_OK) step = json_int(prog, "step"), cJSON_Delete(prog);
  }
  T_CHECK_MSG(step >= 10, "training never reached step 10; logs in %s", tmpdir);
  /* it reads etcd like anyone, and holds no secret */
  const char *iargv[] = {newt_bin, "worker", "--etcd", url, "--job", "impostor", "--id", "impostor", NULL};
  const char *ienv[] = {"NEWT_DEBUG=INFO", "NEWT_JOB_SECRET_FILE=", NULL};
  newt_spawn_opts io = {.log_path = ilog, .env = ienv};
  T_OK(newt_proc_spawn(iargv, &io, &imp));
  int st = -1;
  T_CHECK_MSG(newt_proc_wait(pid, 200000, &st) == NEWT_OK && WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "newt run did not finish beside an impostor; logs in %s", tmpdir);
  if (imp) newt_proc_stop(imp, 1000);
  char *text = NULL;
  size_t n;
  cJSON *j = NULL;
  T_OK(newt_fs_read_all(summary, 1 << 20, &text, &n));
  if (text) T_OK(newt_json_parse(text, n, "summary", &j));
  if (j) {
    int done = 0;
    int64_t st2 = 0, samples_n = 0;
    double loss = NAN;
    newt_json_get_bool(j, "summary", "done", 1, &done);
    newt_json_get_int(j, "summary", "steps", 1, &st2);
    newt_json_get_int(j, "summary", "samples_consumed", 1, &samples_n);
    newt_json_get_double(j, "summary", "final_loss", 1, &loss);
    T_CHECK(done && st2 == STEPS && samples_n == (int64_t)STEPS * GB);
    T_CHECK_MSG(fabs(loss - ref) <= 1e-4 * fmax(1.0, fabs(ref)), "final loss %.7f, uninterrupted %.7f", loss, ref);
    cJSON_Delete(j);
  }
  free(text);
  /* the impostor never applied a step (its sample log has no "A" line) */
  char spath[600], *stext = NULL;
  size_t sn = 0;
  snprintf(spath, sizeof spath, "%s/impostor.samples", samples);
  if (newt_fs_read_all(spath, 1 << 24, &stext, &sn) == NEWT_OK)
    T_CHECK_MSG(!strstr(stext, "\nA ") && strncmp(stext, "A ", 2) != 0, "the impostor applied steps:\n%.400s", stext);
  free(stext);
  check_samples(samples, STEPS, 0);
  unsetenv("NEWT_SAMPLE_LOG_DIR");
  rdzv_etcd_free(c);
  rdzv_etcd_server_free(srv);
}

static void test_impostor(void) { test_impostor_n(2); }
static void test_impostor_alone(void) { test_impostor_n(1); }


/* A job on an etcd that takes TLS with client certificates and a user with a password (the
 * setup docs/kubernetes.md describes; issue 17, item 10): `newt run --etcd https://...` with
 * the CA, a client certificate without a Common Name, the user and the password's file, for
 * itself and every process it starts. The job trains to its end. */
static void test_tls(void) {
  const int STEPS = 60;
  double ref = reference_loss(newt_bin, STEPS, MODEL);
  char certs[600], script[1024], log[700];
  snprintf(certs, sizeof certs, "%s/certs", tmpdir);
  T_OK(newt_fs_mkdirs(certs, 0700));
  const char *src = getenv("NEWT_SOURCE_DIR");
  snprintf(script, sizeof script, "%s/tests/rendezvous/gen_certs.sh", src ? src : ".");
  snprintf(log, sizeof log, "%s/gen_certs.log", certs);
  const char *gargv[] = {"sh", script, certs, NULL};
  newt_spawn_opts go = {.log_path = log};
  pid_t gp;
  int gst = -1;
  T_CHECK_MSG(newt_proc_spawn(gargv, &go, &gp) == NEWT_OK && newt_proc_wait(gp, 60000, &gst) == NEWT_OK &&
                  WIFEXITED(gst) && WEXITSTATUS(gst) == 0,
              "gen_certs.sh failed (see %s)", log);
  char cert[700], key[700], ca[700], ccert[700], ckey[700], pwfile[700];
  snprintf(cert, sizeof cert, "%s/server.pem", certs);
  snprintf(key, sizeof key, "%s/server.key", certs);
  snprintf(ca, sizeof ca, "%s/ca.pem", certs);
  snprintf(ccert, sizeof ccert, "%s/client.pem", certs);
  snprintf(ckey, sizeof ckey, "%s/client.key", certs);
  snprintf(pwfile, sizeof pwfile, "%s/password", certs);
  T_OK(newt_fs_write_atomic(pwfile, "s3cret\n", 7));
  rdzv_etcd_server *srv = NULL;
  rdzv_etcd_server_opts so = {.tls_cert = cert, .tls_key = key, .tls_ca = ca, .client_cert_auth = 1,
                              .client_cert = ccert, .client_key = ckey, .root_password = "s3cret"};
  T_OK(rdzv_etcd_server_start(&so, &srv));
  if (!srv) return;
  char logs[512], summary[512], steps[16], gb[16], mb[16];
  snprintf(logs, sizeof logs, "%s/logs", tmpdir);
  snprintf(summary, sizeof summary, "%s/summary.json", tmpdir);
  snprintf(steps, sizeof steps, "%d", STEPS);
  snprintf(gb, sizeof gb, "%d", GB);
  snprintf(mb, sizeof mb, "%d", MB);
  const char *argv[] = {newt_bin, "run", "--quiet", "--etcd", rdzv_etcd_server_url(srv), "--etcd-ca", ca,
                        "--etcd-cert", ccert, "--etcd-key", ckey, "--etcd-user", "root", "--etcd-password-file",
                        pwfile, "--job", "tls", "--nproc", "2", "--model", MODEL, "--seq-len", SEQ, "--steps", steps,
                        "--global-batch", gb, "--micro-batch", mb, "--log-dir", logs, "--summary", summary,
                        "--timeout-ms", "120000", NULL};
  char *out = NULL;
  int rc = run_capture(argv, &out);
  T_CHECK_MSG(rc == 0, "newt run over TLS with a user exited %d:\n%s", rc, out ? out : "");
  free(out);
  char *text = NULL;
  size_t n;
  cJSON *j = NULL;
  if (newt_fs_read_all(summary, 1 << 20, &text, &n) == NEWT_OK) T_OK(newt_json_parse(text, n, "summary", &j));
  double loss = NAN;
  int done = 0;
  if (j) {
    newt_json_get_bool(j, "summary", "done", 1, &done);
    newt_json_get_double(j, "summary", "final_loss", 1, &loss);
    cJSON_Delete(j);
  }
  free(text);
  T_CHECK(done);
  T_CHECK_MSG(fabs(loss - ref) <= 1e-4 * fmax(1.0, fabs(ref)), "final loss %.7f, uninterrupted %.7f", loss, ref);
  rdzv_etcd_server_free(srv);
}

/* A job across NETNS_HOSTS network namespaces (host i: 10.<a>.<b>.(10+i), worker w<i>):
 * etcd and coordinator c0 outside, on the bridge (10.<a>.<b>.1). */
typedef struct netns_job {
  const char *job;
  int a, b;
  double ref;
  rdzv_etcd *c;
  pid_t pids[NETNS_HOSTS + 2]; /* etcd, c0, the workers */
  int npids;
  char samples[300];
  int64_t final_gen; /* the plan's generation at the end (netns_finish) */
} netns_job;

static int netns_start(netns_job *J, const char *job) {
  memset(J, 0, sizeof *J);
  J->job = job;
  T_CHECK_MSG(geteuid() == 0, "the multi-host test needs root for ip netns (CI runs as root)");
  if (geteuid() != 0) return -1;
  const char *newt = newt_bin;
  J->a = 77, J->b = (int)(getpid() % 200) + 20;
  snprintf(ns_tag, sizeof ns_tag, "nt%d", (int)(getpid() % 100000));
  T_CHECK_MSG(netns_setup(J->a, J->b) == 0, "cannot build the network namespaces");
  if (!ns_made) return -1;
  J->ref = reference_loss(newt, NETNS_STEPS, MODEL);
  char bridge_ip[32], etcd_url[64], peer_url[64], etcd_dir[300], spec_path[300], logp[400];
  snprintf(bridge_ip, sizeof bridge_ip, "10.%d.%d.1", J->a, J->b);
  int port = 0, pport = 0;
  T_OK(newt_net_free_port(&port));
  T_OK(newt_net_free_port(&pport));
  snprintf(etcd_url, sizeof etcd_url, "http://%s:%d", bridge_ip, port);
  snprintf(peer_url, sizeof peer_url, "http://127.0.0.1:%d", pport);
  snprintf(etcd_dir, sizeof etcd_dir, "%s/etcd", tmpdir);
  snprintf(J->samples, sizeof J->samples, "%s/samples", tmpdir);
  T_OK(newt_fs_mkdirs(J->samples, 0755));
  setenv("NEWT_SAMPLE_LOG_DIR", J->samples, 1);
  setenv("NEWT_DEBUG", "INFO", 0);
  snprintf(logp, sizeof logp, "%s/etcd.log", tmpdir);
  const char *etcd_argv[] = {"etcd", "--data-dir", etcd_dir, "--listen-client-urls", etcd_url,
                             "--advertise-client-urls", etcd_url, "--listen-peer-urls", peer_url,
                             "--initial-advertise-peer-urls", peer_url, "--initial-cluster", NULL, NULL};
  char cluster[128];
  snprintf(cluster, sizeof cluster, "default=%s", peer_url);
  etcd_argv[12] = cluster;
  newt_spawn_opts so = {.log_path = logp, .die_with_parent = 1};
  T_OK(newt_proc_spawn(etcd_argv, &so, &J->pids[J->npids]));
  J->npids++;
  rdzv_etcd_opts eo = {.endpoints = etcd_url};
  T_OK(rdzv_etcd_init(&eo, &J->c));
  /* the spec: small model, a collective without progress for 1.5 s is a hang */
  snprintf(spec_path, sizeof spec_path, "%s/spec.json", tmpdir);
  char spec[512];
  snprintf(spec, sizeof spec,
           "{\"job\":\"%s\",\"model\":{\"preset\":\"tiny\",\"layers\":2,\"channels\":64},"
           "\"train\":{\"steps\":%d,\"global_batch\":%d,\"micro_batch\":%d,\"seq_len\":%s},"
           "\"fault\":{\"comm_timeout_ms\":1500}}",
           job, NETNS_STEPS, GB, MB, SEQ);
  T_OK(newt_fs_write_atomic(spec_path, spec, strlen(spec)));
  for (newt_deadline_t d = newt_deadline_in_ms(20000); !newt_deadline_passed(d);) {
    rdzv_etcd_kvs r;
    rdzv_etcd_range_opts ro = {.count_only = 1};
    if (rdzv_etcd_range(J->c, "x", &ro, newt_deadline_in_ms(500), &r) == NEWT_OK) {
      rdzv_etcd_kvs_free(&r);
      break;
    }
    newt_sleep_ms(100);
  }
  snprintf(logp, sizeof logp, "%s/c0.log", tmpdir);
  const char *coord[] = {newt, "coordinator", "--etcd", etcd_url, "--job", job, "--id", "c0", "--spec",
                         spec_path, "--metrics-port", "0", NULL};
  so.log_path = logp;
  T_OK(newt_proc_spawn(coord, &so, &J->pids[J->npids]));
  J->npids++;
  for (int i = 0; i < NETNS_HOSTS; i++) {
    char ns[32], id[16], host[16], addr[32];
    snprintf(ns, sizeof ns, "%s-%d", ns_tag, i);
    snprintf(id, sizeof id, "w%d", i);
    snprintf(host, sizeof host, "host%d", i);
    snprintf(addr, sizeof addr, "10.%d.%d.%d", J->a, J->b, 10 + i);
    snprintf(logp, sizeof logp, "%s/w%d.log", tmpdir, i);
    const char *argv[] = {"ip", "netns", "exec", ns, newt, "worker", "--etcd", etcd_url, "--job", job, "--id", id,
                          "--host", host, "--addr", addr, NULL};
    so.log_path = logp;
    T_OK(newt_proc_spawn(argv, &so, &J->pids[J->npids]));
    J->npids++;
  }
  return 0;
}

/* Waits until the job's progress record says step `at` or later: the step, -1 by 60 s. */
static int64_t netns_wait_step(netns_job *J, int64_t at) {
  for (newt_deadline_t d = newt_deadline_in_ms(60000); !newt_deadline_passed(d); newt_sleep_ms(20)) {
    cJSON *j = NULL;
    if (get_json(J->c, J->job, "progress", &j) != NEWT_OK) continue;
    int64_t step = json_int(j, "step");
    cJSON_Delete(j);
    if (step >= at) return step;
  }
  return -1;
}

/* The generation of the plan in etcd (0: none or unreadable). */
static int64_t netns_plan_gen(netns_job *J, newt_plan *out) {
  char *text = NULL;
  int64_t g = 0;
  if (job_plan_get(J->c, J->job, newt_deadline_in_ms(2000), &text, &g, NULL) != NEWT_OK) return 0;
  if (out && plan_from_json(text, strlen(text), out) != NEWT_OK) g = 0;
  free(text);
  return g;
}

/* The end: done at the last step with every sample once at the uninterrupted loss, every
 * process exits 0 by itself; the sample logs checked. */
static void netns_finish_left(netns_job *J, int left_out);
static void netns_finish(netns_job *J) { netns_finish_left(J, -1); }

/* ... with worker left_out (-1: none) cut off to the end: it trained, was left out, and ends
 * saying so (exit 5, its termination message: "left out: ..."), never claiming the job's end
 * as its own. Another worker may end left out too (a majority rank the cut's cascade made
 * look stuck, not back before the end): 0 or 5, never anything else. */
static void netns_finish_left(netns_job *J, int left_out) {
  int done = 0;
  double loss = NAN;
  int64_t final_step = -1, consumed = -1;
  for (newt_deadline_t d = newt_deadline_in_ms(180000); !newt_deadline_passed(d) && !done; newt_sleep_ms(100)) {
    cJSON *j = NULL;
    if (get_json(J->c, J->job, "done", &j) != NEWT_OK) continue;
    done = 1;
    final_step = json_int(j, "step");
    consumed = json_int(j, "samples");
    newt_json_get_double(j, "done", "loss", 1, &loss);
    cJSON_Delete(j);
  }
  T_CHECK_MSG(done, "the job did not finish; logs in %s", tmpdir);
  T_CHECK(final_step == NETNS_STEPS);
  T_CHECK(consumed == (int64_t)NETNS_STEPS * GB);
  T_CHECK_MSG(fabs(loss - J->ref) <= 1e-4 * fmax(1.0, fabs(J->ref)), "final loss %.7f, uninterrupted %.7f", loss,
              J->ref);
  /* every process ends by itself, the cut-off worker included */
  for (int i = 1; i < J->npids; i++) {
    int st = 0, want = left_out >= 0 && i == 2 + left_out ? 5 : 0;
    newt_result_t r = newt_proc_wait(J->pids[i], 30000, &st);
    int code = r == NEWT_OK && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    T_CHECK_MSG(code == want || (i >= 2 && left_out >= 0 && code == 5), "process %d (%s) exited %d, expected %d; logs in %s",
                i, i == 1 ? "c0" : "a worker", code, want, tmpdir);
    if (r != NEWT_OK) newt_proc_stop(J->pids[i], 1000);
  }
  J->final_gen = netns_plan_gen(J, NULL);
  newt_proc_stop(J->pids[0], 2000);
  rdzv_etcd_free(J->c);
  J->c = NULL;
  check_samples(J->samples, NETNS_STEPS, 0);
}

static void test_netns(void) {
  netns_job J;
  if (netns_start(&J, "netns") != 0) return;
  /* cut host 2 off once training runs */
  int64_t cut_step = netns_wait_step(&J, 15);
  if (cut_step >= 0) T_CHECK(sh("ip netns exec %s-2 ip link set %sp2 down", ns_tag, ns_tag) == 0);
  T_CHECK_MSG(cut_step >= 0, "training never reached step 15; logs in %s", tmpdir);
  /* the others replan without w2 */
  int64_t gen2 = -1;
  for (newt_deadline_t d = newt_deadline_in_ms(30000); cut_step >= 0 && !newt_deadline_passed(d) && gen2 < 0;
       newt_sleep_ms(50)) {
    newt_plan p;
    int64_t g = netns_plan_gen(&J, &p);
    if (g > 1) {
      if (!plan_find(&p, "w2")) gen2 = g;
      plan_free(&p);
    } else if (g == 1) {
      plan_free(&p);
    }
  }
  T_CHECK_MSG(gen2 > 1, "no plan without the cut-off host; logs in %s", tmpdir);
  /* its link comes back: it must not rejoin generation 1 */
  newt_sleep_ms(500);
  T_CHECK(sh("ip netns exec %s-2 ip link set %sp2 up", ns_tag, ns_tag) == 0);
  uint64_t t_up = newt_wall_ms();
  netns_finish(&J);
  /* once the link was back, no rank (the cut-off one least of all) took a step of
     generation 1: the old generation was gone for good */
  for (int i = 0; i < NETNS_HOSTS; i++) {
    char path[400], line[128];
    snprintf(path, sizeof path, "%s/w%d.samples", J.samples, i);
    FILE *f = fopen(path, "r");
    T_CHECK_MSG(f != NULL, "no sample log for w%d", i);
    long long late = 0;
    while (f && fgets(line, sizeof line, f)) {
      long long g, st;
      unsigned long long t;
      if (line[0] == 'A' && sscanf(line + 1, "%lld %lld %llu", &g, &st, &t) == 3 && g == 1 && t >= t_up) late++;
    }
    if (f) fclose(f);
    T_CHECK_MSG(late == 0, "w%d took %lld steps of generation 1 after the link came back", i, late);
  }
  netns_cleanup();
}

static int coord_said(const char *what);
static int64_t worker_log_generation(const char *name, int64_t min);

/* Starts netns job `job` and waits until it trains (step 15): 0, or -1 with the failure
 * recorded. */
static int netns_start_training(netns_job *J, const char *job) {
  if (netns_start(J, job) != 0) return -1;
  int64_t at = netns_wait_step(J, 15);
  T_CHECK_MSG(at >= 0, "training never reached step 15; logs in %s", tmpdir);
  return at >= 0 ? 0 : -1;
}


/* Cuts (add 1) or mends (add 0) the links between the hosts of side[] 1 and those of side[]
 * 0: blackhole routes to the other side's addresses in each namespace (etcd, on the bridge,
 * stays reachable). */
static int netns_cut(const netns_job *J, const int *side, int add) {
  int rc = 0;
  for (int i = 0; i < NETNS_HOSTS; i++)
    for (int j = 0; j < NETNS_HOSTS; j++)
      if (side[i] != side[j])
        rc |= sh("ip netns exec %s-%d ip route %s blackhole 10.%d.%d.%d/32", ns_tag, i, add ? "add" : "del", J->a, J->b,
                 10 + j);
  return rc;
}

/* Once a cut healed: the generation of the first plan with every worker again (0: the job
 * ended first, or none came within 60 s), and whether the leader let the left-out back
 * because they reach every rank again (links/<id>), not because their hold-out ran out. */
static int64_t netns_all_back(netns_job *J) {
  for (newt_deadline_t d = newt_deadline_in_ms(60000); !newt_deadline_passed(d); newt_sleep_ms(20)) {
    newt_plan p;
    int64_t g = netns_plan_gen(J, &p);
    if (g <= 0) continue;
    int n = p.nranks;
    plan_free(&p);
    if (n == NETNS_HOSTS) return g;
    cJSON *done = NULL;
    if (get_json(J->c, J->job, "done", &done) == NEWT_OK) {
      cJSON_Delete(done);
      return 0;
    }
  }
  return 0;
}

static void netns_check_back(netns_job *J) {
  int64_t g = netns_all_back(J);
  T_CHECK_MSG(g > 0, "the workers left out never came back once the cut healed; logs in %s", tmpdir);
  /* one held out (it reported, so the leader knew it alive and cut off) was let back on its
     links, not when its hold-out ran out; one that was not held out joined as it came */
  T_CHECK_MSG(!coord_said("no plan takes it for") || coord_said("again: its hold-out ends"),
              "the left-out came back (generation %lld), but not on their links: the leader held them out until "
              "their hold-out ran out; logs in %s", (long long)g, tmpdir);
}

static int netns_split(const netns_job *J, int add) {
  static const int halves[NETNS_HOSTS] = {0, 0, 1, 1};
  return netns_cut(J, halves, add);
}

/* One worker cut from its peers, not from etcd (issue 27): it keeps its lease and reports the
 * failure too, but all the others name it in reports of no progress, so the first plan after
 * the failure leaves it out (it used to take it in again, and that generation never formed).
 * Healed once that plan is out: it is back in a plan as soon as its links work (held out, it
 * is let back on its probes, not when its hold-out runs out), and the job ends with every
 * sample once at the uninterrupted loss. */
static void test_netns_peers_cut(void) {
  netns_job J;
  if (netns_start_training(&J, "netns_peers_cut") != 0) return;
  static const int alone[NETNS_HOSTS] = {0, 0, 1, 0}; /* host 2: w2 */
  T_CHECK(netns_cut(&J, alone, 1) == 0);
  int64_t first = 0;
  int has_w2 = -1;
  for (newt_deadline_t d = newt_deadline_in_ms(90000); !newt_deadline_passed(d) && !first; newt_sleep_ms(20)) {
    newt_plan p;
    int64_t g = netns_plan_gen(&J, &p);
    if (g <= 0) continue;
    if (g > 1) first = g, has_w2 = plan_find(&p, "w2") != NULL;
    plan_free(&p);
  }
  T_CHECK_MSG(first == 2 && has_w2 == 0, "the first plan after w2 was cut from its peers: generation %lld, %s; logs in %s",
              (long long)first, has_w2 ? "with w2 (its build fails)" : "without w2", tmpdir);
  T_CHECK(netns_cut(&J, alone, 0) == 0);
  netns_check_back(&J); /* as soon as its links work, not after its 30 s hold-out */
  netns_finish(&J);
  netns_cleanup();
}

/* A 2|2 split (issue 27): hosts {0, 1} and {2, 3} cannot reach each other, both reach etcd.
 * The generation fails; every rank reports its stall, each side naming a rank of the other,
 * so the largest side of the cut -- on a tie, the one of the lowest rank -- must go on as a
 * plan of its own (if a plan with all four comes first, it never forms and its build reports
 * name every rank by two of three: the same rule decides). It used to take all four again,
 * then leave everyone out and spin on fencing for good. Healed once that plan is out: the
 * other side is back, all four in one plan, as soon as its links work (on its probes), and
 * the job ends with every sample once at the uninterrupted loss. */
static void test_netns_split(void) {
  netns_job J;
  if (netns_start_training(&J, "netns_split") != 0) return;
  T_CHECK(netns_split(&J, 1) == 0);
  int64_t side_gen = 0;
  for (newt_deadline_t d = newt_deadline_in_ms(90000); !newt_deadline_passed(d) && !side_gen; newt_sleep_ms(50)) {
    newt_plan p;
    int64_t g = netns_plan_gen(&J, &p);
    if (g <= 0) continue;
    int left = 0, right = 0;
    for (int k = 0; k < p.nranks; k++) {
      int h = -1;
      if (sscanf(p.ranks[k].worker, "w%d", &h) == 1 && h < 2) left++;
      else right++;
    }
    if (g > 1 && p.nranks > 0 && (!left || !right)) side_gen = g;
    plan_free(&p);
  }
  T_CHECK_MSG(side_gen > 1, "no plan of one side of the split; logs in %s", tmpdir);
  /* the running generation's cut (every rank reports its stall, naming the other side), the
     build's partition no majority explains (if a plan with all four came first), or -- when
     one side's reports come after the report window -- that side left out as silent and
     accused: each way the leader says whom it left out alive */
  T_CHECK_MSG(coord_said("the largest side goes on") || coord_said("its registration's lease had not run out: fenced"),
              "the leader did not say how it decided the partition; logs in %s", tmpdir);
  T_CHECK(netns_split(&J, 0) == 0);
  netns_check_back(&J); /* everyone back in one generation, as soon as the links work */
  netns_finish(&J);
  netns_cleanup();
}

/* Starts netns job `job` and waits for step 15: the host of plan 1's rank 0 (-1: none; the
 * failure is recorded). */
static int netns_start_rank0(netns_job *J, const char *job) {
  if (netns_start_training(J, job) != 0) return -1;
  newt_plan p;
  int host = -1;
  if (netns_plan_gen(J, &p) == 1) {
    if (p.nranks > 0 && sscanf(p.ranks[0].worker, "w%d", &host) != 1) host = -1;
    plan_free(&p);
  }
  T_CHECK_MSG(host >= 0 && host < NETNS_HOSTS, "no rank 0 in plan 1; logs in %s", tmpdir);
  return host >= 0 && host < NETNS_HOSTS ? host : -1;
}

/* A 3|1 split that lasts (issue 27): the host of plan 1's rank 0 cut from the other three
 * (blackhole routes both ways), all four still reaching etcd, until the job is done. The
 * three go on as the largest side; the one left out is fenced once and then kept out -- its
 * own probes say it reaches none of the plan's ranks, so even past its hold-out no plan tries
 * it again (each try would stop the three for a build that cannot form) -- and it ends with
 * the job. The job trains in generation 2 from the cut to its end. */
static void test_netns_lone(void) {
  netns_job J;
  int host = netns_start_rank0(&J, "netns_lone");
  if (host < 0) return;
  int lone[NETNS_HOSTS] = {0};
  lone[host] = 1;
  T_CHECK(netns_cut(&J, lone, 1) == 0);
  char name[16];
  snprintf(name, sizeof name, "w%d", host);
  int64_t gen = 0;
  int with_lone = -1;
  for (newt_deadline_t d = newt_deadline_in_ms(90000); !newt_deadline_passed(d) && !gen; newt_sleep_ms(20)) {
    newt_plan p;
    int64_t g = netns_plan_gen(&J, &p);
    if (g <= 0) continue;
    if (g > 1) gen = g, with_lone = plan_find(&p, name) != NULL;
    plan_free(&p);
  }
  T_CHECK_MSG(gen == 2 && with_lone == 0, "the first plan after %s (rank 0) was cut from the others: generation %lld, "
              "%s; logs in %s", name, (long long)gen, with_lone ? "with it" : "without it", tmpdir);
  netns_finish_left(&J, host); /* the cut lasts: the job ends without it, and it ends too: left out */
  /* no later plan named it: it never built a generation after the first, nor failed to (a
     rank of the majority side that the cut's cascade made look stuck may be left out with it,
     and then joins back on its links: more generations, none of them with the lone one) */
  int64_t tried = worker_log_generation(name, 2);
  T_CHECK_MSG(tried == 0, "a plan tried %s again while it was cut off (its log: generation %lld); logs in %s", name,
              (long long)tried, tmpdir);
  netns_cleanup();
}

/* The first generation >= min that worker `name`'s log says it built or failed to build
 * ("<name>: generation G: rank ..." or "<name>: generation G failed"), else 0. */
static int64_t worker_log_generation(const char *name, int64_t min) {
  char path[400], line[2048], head[64];
  snprintf(path, sizeof path, "%s/%s.log", tmpdir, name);
  snprintf(head, sizeof head, "%s: generation ", name);
  FILE *f = fopen(path, "r");
  int64_t found = 0;
  while (f && !found && fgets(line, sizeof line, f)) {
    const char *at = strstr(line, head);
    if (!at) continue;
    char *end = NULL;
    long long g = strtoll(at + strlen(head), &end, 10);
    if (end && (*end == ':' || strncmp(end, " failed", 7) == 0) && g >= min) found = g;
  }
  if (f) fclose(f);
  return found;
}

/* Whether c0's log has a line with `what`. */
static int coord_said(const char *what) {
  char path[400], line[2048];
  snprintf(path, sizeof path, "%s/c0.log", tmpdir);
  FILE *f = fopen(path, "r");
  int found = 0;
  while (f && !found && fgets(line, sizeof line, f)) found = strstr(line, what) != NULL;
  if (f) fclose(f);
  return found;
}

/* Rank 0 cut from etcd (a blackhole route to etcd in its namespace; its peers still
 * reachable) while it trains: its lease lapses, but steps go on, and the progress record
 * that says so comes from the lowest rank that reaches etcd -- so the leader finds it alive
 * and fences nobody (issue 27: rank 0's cut used to cost a "hang" recovery and a join,
 * while rank 1's cost nothing). Healed once the leader said so; then the job ends in
 * generation 1. */
static void test_netns_etcd_cut(void) {
  netns_job J;
  int host = netns_start_rank0(&J, "netns_etcd_cut");
  if (host < 0) return;
  T_CHECK(sh("ip netns exec %s-%d ip route add blackhole 10.%d.%d.1/32", ns_tag, host, J.a, J.b) == 0);
  /* the leader's verdict: alive (its registration vanished and steps went on), or a plan
     without it */
  int alive = 0;
  int64_t gen = 1;
  for (newt_deadline_t d = newt_deadline_in_ms(60000); !newt_deadline_passed(d) && !alive && gen == 1;
       newt_sleep_ms(50)) {
    alive = coord_said("vanished, but steps went on since");
    int64_t g = netns_plan_gen(&J, NULL);
    if (g > 1) gen = g;
  }
  T_CHECK_MSG(alive && gen == 1, "rank 0 (w%d) cut from etcd: %s; logs in %s", host,
              gen > 1 ? "the leader planned without it" : "the leader never said it alive", tmpdir);
  T_CHECK(sh("ip netns exec %s-%d ip route del blackhole 10.%d.%d.1/32", ns_tag, host, J.a, J.b) == 0);
  netns_finish(&J);
  T_CHECK_MSG(!coord_said(" fenced "), "a healthy worker was fenced; logs in %s", tmpdir);
  T_CHECK_MSG(J.final_gen == 1, "the job ended in generation %lld, not 1: a plan for nothing; logs in %s",
              (long long)J.final_gen, tmpdir);
  netns_cleanup();
}

/* A job that cannot make progress ends, within a stated bound (issue 27): two workers and
 * dp_min 2, one killed -- no layout fits the survivor, and no worker comes. The leader fails
 * the job once no step completed for spec.fault.progress_timeout_ms (5 s here: a healthy step
 * of this model takes milliseconds, and a stalled one a hang recovery within the hang timeout,
 * also 5 s), naming the bound and what it waited for; newt run ends with that failure. It
 * used to wait for ever (here: until --timeout-ms, which says something else). */
static void test_stuck(void) {
  char dir[400], gb[16], mb[16];
  snprintf(dir, sizeof dir, "%s/run", tmpdir);
  snprintf(gb, sizeof gb, "%d", GB);
  snprintf(mb, sizeof mb, "%d", MB);
  const char *argv[] = {newt_bin, "run", "--nproc", "2", "--dp-min", "2", "--model", MODEL, "--seq-len", SEQ, "--steps",
                        "100000", "--global-batch", gb, "--micro-batch", mb, "--progress-timeout-ms", "5000", "--chaos",
                        "kill:worker:1@step=3", "--timeout-ms", "120000", "--log-dir", dir, "--quiet", NULL};
  char *out = NULL;
  int rc = run_capture(argv, &out);
  T_CHECK_MSG(rc != 0, "newt run exited 0:\n%s", out ? out : "");
  T_CHECK_MSG(out && strstr(out, "the job failed") && strstr(out, "no step completed for") &&
                  strstr(out, "(spec.fault.progress_timeout_ms 5000) since step") &&
                  strstr(out, "the leader cannot plan: no layout") && strstr(out, "the job cannot make progress"),
              "newt run does not end with the progress bound's failure:\n%s", out ? out : "");
  free(out);
}

static void test_scenario(void) { run_scenario(current, newt_bin); }

/* One `newt run` of `steps` steps on `nproc` workers with checkpoints every 10 steps in
 * ckdir (extra: more flags, NULL-terminated; chaos: NULL, or faults that end the run, which
 * then must fail); its final loss, and in *from the step its first generation started at
 * and where from ("init", "ckpt": its started event). */
static double cross_run(const char *newt, const char *job, int nproc, int steps, const char *ckdir,
                        const char *const *extra, const char *chaos, char from[16], int64_t *from_step) {
  char logs[512], summary[512], st[16], np[16], gb[16], mb[16];
  snprintf(logs, sizeof logs, "%s/%s", tmpdir, job);
  snprintf(summary, sizeof summary, "%s/%s.json", tmpdir, job);
  snprintf(st, sizeof st, "%d", steps);
  snprintf(np, sizeof np, "%d", nproc);
  snprintf(gb, sizeof gb, "%d", GB);
  snprintf(mb, sizeof mb, "%d", MB);
  const char *argv[40] = {newt, "run", "--quiet", "--job", job, "--nproc", np, "--model", MODEL, "--seq-len", SEQ,
                          "--steps", st, "--global-batch", gb, "--micro-batch", mb, "--ckpt-dir", ckdir,
                          "--ckpt-every", "10", "--log-dir", logs, "--summary", summary, "--timeout-ms", "180000"};
  int a = 0;
  while (argv[a]) a++;
  for (int i = 0; extra[i] && a < 37; i++) argv[a++] = extra[i];
  if (chaos) argv[a++] = "--chaos", argv[a++] = chaos;
  char *out = NULL;
  int rc = run_capture(argv, &out);
  if (chaos)
    T_CHECK_MSG(rc != 0 && out && strstr(out, "every worker has exited"), "%s: newt run exited %d:\n%s", job, rc,
                out ? out : "");
  else
    T_CHECK_MSG(rc == 0, "%s: newt run exited %d:\n%s", job, rc, out ? out : "");
  free(out);
  double loss = NAN;
  char *text = NULL;
  size_t n = 0;
  cJSON *j = NULL;
  if (newt_fs_read_all(summary, 1 << 20, &text, &n) == NEWT_OK && newt_json_parse(text, n, "summary", &j) == NEWT_OK) {
    newt_json_get_double(j, "summary", "final_loss", 1, &loss);
    cJSON_Delete(j);
  }
  free(text);
  snprintf(from, 16, "?");
  *from_step = -1;
  char evpath[600], line[2048];
  snprintf(evpath, sizeof evpath, "%s/events.jsonl", logs);
  FILE *f = fopen(evpath, "r");
  while (f && fgets(line, sizeof line, f)) {
    if (!strstr(line, "\"type\":\"started\"")) continue;
    cJSON *e = NULL;
    const char *r = NULL;
    if (newt_json_parse(line, strlen(line), "event", &e) == NEWT_OK) {
      if (newt_json_get_str(e, "event", "restore", 1, &r) == NEWT_OK) snprintf(from, 16, "%s", r);
      newt_json_get_int(e, "event", "restore_step", 1, from_step);
      cJSON_Delete(e);
    }
    break;
  }
  if (f) fclose(f);
  return loss;
}

/* The summary of a run (NULL when it cannot be read: said). */
static cJSON *read_summary(const char *path) {
  cJSON *j = e2e_read_json(path);
  T_CHECK_MSG(j != NULL, "the summary %s does not read", path);
  return j;
}

/* The newest checkpoint a run says it leaves, {"step", "dir"} of its summary (-1: none). */
static int64_t newest_ckpt(const cJSON *summary, const char *dir) {
  const cJSON *n = summary ? cJSON_GetObjectItemCaseSensitive(summary, "newest_checkpoint") : NULL;
  int64_t step = -1;
  const char *d = "";
  if (!n || newt_json_get_int(n, "newest_checkpoint", "step", 1, &step) != NEWT_OK ||
      newt_json_get_str(n, "newest_checkpoint", "dir", 1, &d) != NEWT_OK || strcmp(d, dir) != 0)
    return -1;
  return step;
}

/* A whole job stopped, then resumed on another number of workers (issues 35 and 38): a job of
 * a million steps with a checkpoint due every 1000, stopped by Ctrl-C (SIGINT to newt run's
 * process group) once it trained 5 steps. Its workers save the step they stop at before they
 * leave: the summary's newest_checkpoint is its last step, newt run says it, and the steps'
 * samples are counted. A run of 6 steps more on the same directory, on 2 workers instead of
 * 3, resumes from that very step: its summary's resumed_from names it and the directory,
 * newt run said it, the samples are those of every step once, and its own last step is saved
 * at its end (not a multiple of the 1000). The first run says nothing of a resume. */
static void test_resume(void) {
  char ckdir[512], logs[2][512], summary[2][512], out_path[600], gb[16], mb[16], steps2[32], said[700];
  snprintf(ckdir, sizeof ckdir, "%s/ck", tmpdir);
  snprintf(gb, sizeof gb, "%d", GB);
  snprintf(mb, sizeof mb, "%d", MB);
  for (int k = 0; k < 2; k++) {
    snprintf(logs[k], sizeof logs[k], "%s/run%d", tmpdir, k);
    snprintf(summary[k], sizeof summary[k], "%s/run%d.json", tmpdir, k);
  }
  snprintf(out_path, sizeof out_path, "%s/run0.out", tmpdir);
  const char *argv0[] = {newt_bin, "run", "--nproc", "3", "--model", MODEL, "--seq-len", SEQ, "--steps", "1000000",
                         "--global-batch", gb, "--micro-batch", mb, "--ckpt-dir", ckdir, "--ckpt-every", "1000",
                         "--log-dir", logs[0], "--summary", summary[0], "--timeout-ms", "600000", NULL};
  newt_spawn_opts so = {.log_path = out_path, .die_with_parent = 1, .new_session = 1}; /* its own group, as a shell's job */
  pid_t run = -1;
  T_OK(newt_proc_spawn(argv0, &so, &run));
  if (run < 0) return;
  /* the event: 5 steps in the step log */
  char steps_path[600];
  snprintf(steps_path, sizeof steps_path, "%s/steps.jsonl", logs[0]);
  size_t ns = 0;
  for (newt_deadline_t d = newt_deadline_in_ms(300000); ns < 5 && !newt_deadline_passed(d);) {
    job_step *sl = NULL;
    size_t torn = 0;
    ns = 0;
    if (job_steplog_read(steps_path, &sl, &ns, &torn) != NEWT_OK) ns = 0;
    free(sl);
    if (ns < 5) newt_sleep_ms(100);
  }
  T_CHECK_MSG(ns >= 5, "the first run made %zu steps", ns);
  T_CHECK(kill(-run, SIGINT) == 0); /* Ctrl-C */
  int st = 0;
  T_CHECK_MSG(newt_proc_wait(run, 300000, &st) == NEWT_OK, "newt run did not end after SIGINT");
  T_CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 130, "newt run after SIGINT: status 0x%x, expected exit 130", st);
  char *out[2] = {NULL, NULL};
  size_t len = 0;
  T_OK(newt_fs_read_all(out_path, 1 << 20, &out[0], &len));
  cJSON *first = read_summary(summary[0]);
  int64_t stopped = -1, samples = -1;
  if (first) {
    newt_json_get_int(first, "summary", "steps", 1, &stopped);
    newt_json_get_int(first, "summary", "samples_consumed", 1, &samples);
  }
  T_CHECK_MSG(first && !cJSON_GetObjectItemCaseSensitive(first, "resumed_from"),
              "a run that started afresh says it resumed:\n%s", out[0] ? out[0] : "");
  T_CHECK_MSG(out[0] && !strstr(out[0], "resumed from the checkpoint"), "%s", out[0] ? out[0] : "");
  T_CHECK_MSG(stopped >= 5 && newest_ckpt(first, ckdir) == stopped,
              "the stopped run: its last step %lld, its newest checkpoint %lld (expected the same: saved as it "
              "stopped)\n%s", (long long)stopped, (long long)newest_ckpt(first, ckdir), out[0] ? out[0] : "");
  T_CHECK_MSG(samples == stopped * GB, "the stopped run: samples_consumed %lld after %lld steps", (long long)samples,
              (long long)stopped);
  snprintf(said, sizeof said, "the newest checkpoint in %s is step %lld", ckdir, (long long)stopped);
  T_CHECK_MSG(out[0] && strstr(out[0], said), "newt run did not say \"%s\":\n%s", said, out[0] ? out[0] : "");

  /* the same job resumed on 2 workers, 6 steps more */
  snprintf(steps2, sizeof steps2, "%lld", (long long)(stopped + 6));
  const char *argv1[] = {newt_bin, "run", "--nproc", "2", "--model", MODEL, "--seq-len", SEQ, "--steps", steps2,
                         "--global-batch", gb, "--micro-batch", mb, "--ckpt-dir", ckdir, "--ckpt-every", "1000",
                         "--log-dir", logs[1], "--summary", summary[1], "--timeout-ms", "180000", NULL};
  int rc = run_capture(argv1, &out[1]);
  T_CHECK_MSG(rc == 0, "the resumed run: newt run exited %d:\n%s", rc, out[1] ? out[1] : "");
  cJSON *second = read_summary(summary[1]);
  const cJSON *from = second ? cJSON_GetObjectItemCaseSensitive(second, "resumed_from") : NULL;
  int64_t step = -1;
  const char *dir = "";
  samples = -1;
  if (from) {
    newt_json_get_int(from, "resumed_from", "step", 1, &step);
    newt_json_get_str(from, "resumed_from", "dir", 1, &dir);
  }
  if (second) newt_json_get_int(second, "summary", "samples_consumed", 1, &samples);
  T_CHECK_MSG(from && step == stopped && strcmp(dir, ckdir) == 0, "the resumed run's summary: resumed_from step %lld, "
              "dir \"%s\" (expected %lld in %s)", (long long)step, dir, (long long)stopped, ckdir);
  snprintf(said, sizeof said, "resumed from the checkpoint of step %lld in %s", (long long)stopped, ckdir);
  T_CHECK_MSG(out[1] && strstr(out[1], said), "newt run did not say \"%s\":\n%s", said, out[1] ? out[1] : "");
  T_CHECK_MSG(samples == (stopped + 6) * GB, "samples_consumed %lld: the cursor of step %lld", (long long)samples,
              (long long)(stopped + 6));
  T_CHECK_MSG(newest_ckpt(second, ckdir) == stopped + 6, "the resumed run's newest checkpoint: %lld, expected its "
              "last step %lld (saved at its end)", (long long)newest_ckpt(second, ckdir), (long long)(stopped + 6));
  cJSON_Delete(first);
  cJSON_Delete(second);
  free(out[0]);
  free(out[1]);
}

/* Skipped saves are said (issue 35): with NEWT_CKPT_HOLD (ckpt/saver.c) a save stays in flight
 * until the next one is due, which is then skipped -- a save too slow to keep up, made
 * certain. Every skip is a WARN line of the worker's log, and the summary's
 * checkpoints_skipped is the count of rank 0's lines; newt run says it. */
static void test_ckpt_skips(void) {
  char ckdir[512], logs[512], summary[512], gb[16], mb[16];
  snprintf(ckdir, sizeof ckdir, "%s/ck", tmpdir);
  snprintf(logs, sizeof logs, "%s/run", tmpdir);
  snprintf(summary, sizeof summary, "%s/run.json", tmpdir);
  snprintf(gb, sizeof gb, "%d", GB);
  snprintf(mb, sizeof mb, "%d", MB);
  const char *argv[] = {newt_bin, "run", "--nproc", "2", "--model", MODEL, "--seq-len", SEQ, "--steps", "20",
                        "--global-batch", gb, "--micro-batch", mb, "--ckpt-dir", ckdir, "--ckpt-every", "2",
                        "--log-dir", logs, "--summary", summary, "--timeout-ms", "180000", NULL};
  setenv("NEWT_CKPT_HOLD", "1", 1);
  char *out = NULL;
  int rc = run_capture(argv, &out);
  unsetenv("NEWT_CKPT_HOLD");
  T_CHECK_MSG(rc == 0, "newt run exited %d:\n%s", rc, out ? out : "");
  /* the worker that is rank 0 (no fault: of generation 1 throughout), and its skip lines */
  int64_t lines = 0, rank0 = 0;
  for (int k = 0; k < 2; k++) {
    char path[600], line[1024];
    snprintf(path, sizeof path, "%s/w%d.log", logs, k);
    FILE *f = fopen(path, "r");
    int64_t n = 0, is0 = 0;
    while (f && fgets(line, sizeof line, f)) {
      n += strstr(line, "skipped: the save of step") && strstr(line, " is still being written") != NULL;
      is0 |= strstr(line, ": generation 1: rank 0 of") != NULL;
    }
    if (f) fclose(f);
    if (is0) lines = n, rank0++;
  }
  T_CHECK_MSG(rank0 == 1, "%lld workers say they were rank 0 of generation 1", (long long)rank0);
  cJSON *j = read_summary(summary);
  int64_t skipped = 0;
  if (j) newt_json_get_int(j, "summary", "checkpoints_skipped", 0, &skipped);
  T_CHECK_MSG(skipped == lines && skipped > 0, "the summary says %lld checkpoints skipped, rank 0's log %lld",
              (long long)skipped, (long long)lines);
  char said[64];
  snprintf(said, sizeof said, ", %lld checkpoint%s skipped,", (long long)skipped, skipped == 1 ? "" : "s");
  T_CHECK_MSG(out && strstr(out, said), "newt run did not say \"%s\":\n%s", said, out ? out : "");
  cJSON_Delete(j);
  free(out);
}

/* Flips one bit in the middle of the (first) shard file of a step directory: 0 when done. */
static int flip_shard_byte(const char *step_dir) {
  DIR *d = opendir(step_dir);
  struct dirent *e;
  char path[1024] = "";
  while (d && (e = readdir(d)))
    if (strstr(e->d_name, ".shard") && !path[0]) snprintf(path, sizeof path, "%s/%s", step_dir, e->d_name);
  if (d) closedir(d);
  FILE *f = path[0] ? fopen(path, "r+b") : NULL;
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long mid = ftell(f) / 2;
  int c = fseek(f, mid, SEEK_SET) == 0 ? fgetc(f) : EOF;
  int rc = c == EOF || fseek(f, mid, SEEK_SET) != 0 || fputc(c ^ 0x10, f) == EOF ? -1 : 0;
  return fclose(f) == 0 ? rc : -1;
}

/* Checkpoints cross devices: a job of GPU workers (NEWT_BIN: a newt on the CUDA/NCCL test
 * double, --backend nccl) that lost every worker (from step 30 on) resumes from its
 * checkpoint on CPU workers (NEWT_CPU_BIN) of another layout, and the other way round; each
 * resumed run starts from a checkpoint (every 10 steps) and ends at the loss of an
 * uninterrupted `newt train`. Then `newt train --device cuda` (on the double) against the CPU's, and
 * its checkpoints resumed by `newt train` on the CPU and the other way round. The double's
 * kernels are the CPU's, so the loss is checked as tightly as every scenario's; on a GPU
 * the bf16 GEMMs would need a looser bound (tests/gpu/run.sh). */
static void test_ckpt_cross(void) {
  const char *cpu = getenv("NEWT_CPU_BIN");
  T_CHECK_MSG(cpu && *cpu, "NEWT_CPU_BIN (a newt of the product build) is not set");
  if (!cpu || !*cpu) return;
  double ref = reference_loss(cpu, 200, MODEL);
  T_CHECK_MSG(isfinite(ref), "newt train gave no reference loss");
  static const char *const gpu2[] = {"--backend", "nccl", NULL}, *const cpu_tp2[] = {"--tp", "2", NULL},
                           *const none[] = {NULL}, *const gpu_tp2z1[] = {"--backend", "nccl", "--tp", "2", "--zero", "1", NULL};
  struct {
    const char *name, *first_bin, *second_bin;
    const char *const *first, *const *second;
  } dirs[] = {{"gpu-to-cpu", newt_bin, cpu, gpu2, cpu_tp2}, {"cpu-to-gpu", cpu, newt_bin, none, gpu_tp2z1}};
  for (size_t k = 0; k < sizeof dirs / sizeof dirs[0]; k++) {
    char ckdir[512], job[64], from[16];
    int64_t from_step = -1;
    snprintf(ckdir, sizeof ckdir, "%s/ck-%s", tmpdir, dirs[k].name);
    snprintf(job, sizeof job, "%s-a", dirs[k].name);
    /* both workers killed once the checkpoint of step 20 committed (an event: a save that a
       loaded machine slows must not be outrun by a step count) */
    cross_run(dirs[k].first_bin, job, 2, 200, ckdir, dirs[k].first, "kill:worker:0@ckpt=20,kill:worker:1@ckpt=20", from,
              &from_step);
    T_CHECK_MSG(strcmp(from, "init") == 0, "%s: the first run started from %s", dirs[k].name, from);
    snprintf(job, sizeof job, "%s-b", dirs[k].name);
    double loss = cross_run(dirs[k].second_bin, job, 4, 200, ckdir, dirs[k].second, NULL, from, &from_step);
    T_CHECK_MSG(strcmp(from, "ckpt") == 0 && from_step >= 20 && from_step % 10 == 0 && from_step < 200,
                "%s: the second run started from %s at step %lld", dirs[k].name, from, (long long)from_step);
    T_CHECK_MSG(fabs(loss - ref) <= 1e-4 * fmax(1.0, fabs(ref)), "%s: final loss %.7f, uninterrupted %.7f",
                dirs[k].name, loss, ref);
  }
  /* newt train on either device: the GPU's run (on the double) is the CPU's, and what one
     saves the other resumes, once the newest checkpoint is made unreadable (a flipped byte)
     so that the one before it loads */
  static const char *const on_gpu[] = {"--device", "cuda", NULL};
  double g = train_run(newt_bin, 200, MODEL, on_gpu, NULL);
  T_CHECK_MSG(fabs(g - ref) <= 1e-4 * fmax(1.0, fabs(ref)), "newt train --device cuda: final loss %.7f, the CPU's %.7f", g,
              ref);
  struct {
    const char *name, *first_bin, *second_bin, *first_dev, *second_dev;
  } trains[] = {{"train-gpu-to-cpu", newt_bin, cpu, "cuda", "cpu"}, {"train-cpu-to-gpu", cpu, newt_bin, "cpu", "cuda:0"}};
  for (size_t k = 0; k < sizeof trains / sizeof trains[0]; k++) {
    char ckdir[512], step_dir[600];
    snprintf(ckdir, sizeof ckdir, "%s/ck-%s", tmpdir, trains[k].name);
    const char *const first[] = {"--device", trains[k].first_dev, "--ckpt-dir", ckdir, "--ckpt-every", "10", NULL},
                      *const second[] = {"--device", trains[k].second_dev, "--ckpt-dir", ckdir, NULL};
    double l1 = train_run(trains[k].first_bin, 200, MODEL, first, NULL);
    T_CHECK_MSG(fabs(l1 - ref) <= 1e-4 * fmax(1.0, fabs(ref)), "%s: the saving run's final loss %.7f, the CPU's %.7f",
                trains[k].name, l1, ref);
    snprintf(step_dir, sizeof step_dir, "%s/step-0000000200", ckdir);
    T_CHECK_MSG(flip_shard_byte(step_dir) == 0, "%s: no shard in %s to flip a byte of", trains[k].name, step_dir);
    int64_t resumed = -1;
    double l2 = train_run(trains[k].second_bin, 200, MODEL, second, &resumed);
    T_CHECK_MSG(resumed == 190, "%s: resumed at step %lld, expected 190 (step 200's shard has a flipped byte)",
                trains[k].name, (long long)resumed);
    T_CHECK_MSG(fabs(l2 - ref) <= 1e-4 * fmax(1.0, fabs(ref)), "%s: final loss %.7f after resuming, uninterrupted %.7f",
                trains[k].name, l2, ref);
  }
}

int main(int argc, char **argv) {
  newt_bin = getenv("NEWT_BIN");
  if (!newt_bin || argc < 2) {
    fprintf(stderr, "usage: NEWT_BIN=path/to/newt test_elastic <scenario>\n");
    return 2;
  }
  for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
    if (strcmp(scenarios[i].name, argv[1]) == 0) current = &scenarios[i];
  if (strcmp(argv[1], "cli") == 0) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/newt-e2e-cli-XXXXXX");
    if (!mkdtemp(tmpdir)) return 2;
    T_RUN(test_cli);
    int rc = T_DONE();
    newt_fs_rm_rf(tmpdir);
    return rc;
  }
  if (strcmp(argv[1], "forged") == 0 || strcmp(argv[1], "forged_batch") == 0 ||
      strcmp(argv[1], "forged_generation") == 0 || strcmp(argv[1], "hostile_etcd") == 0 ||
      strcmp(argv[1], "etcd_nospace") == 0 ||
      strcmp(argv[1], "impostor") == 0 || strcmp(argv[1], "impostor_alone") == 0 || strcmp(argv[1], "tls") == 0 ||
      strcmp(argv[1], "nccl_ckpt_cross") == 0 || strcmp(argv[1], "stuck") == 0 || strcmp(argv[1], "resume") == 0 ||
      strcmp(argv[1], "ckpt_skips") == 0) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/newt-e2e-%s-XXXXXX", argv[1]);
    if (!mkdtemp(tmpdir)) return 2;
    if (strcmp(argv[1], "forged") == 0) T_RUN(test_forged);
    else if (strcmp(argv[1], "forged_batch") == 0) T_RUN(test_forged_batch);
    else if (strcmp(argv[1], "hostile_etcd") == 0) T_RUN(test_hostile_etcd);
    else if (strcmp(argv[1], "forged_generation") == 0) T_RUN(test_forged_generation);
    else if (strcmp(argv[1], "impostor") == 0) T_RUN(test_impostor);
    else if (strcmp(argv[1], "impostor_alone") == 0) T_RUN(test_impostor_alone);
    else if (strcmp(argv[1], "tls") == 0) T_RUN(test_tls);
    else if (strcmp(argv[1], "nccl_ckpt_cross") == 0) T_RUN(test_ckpt_cross);
    else if (strcmp(argv[1], "stuck") == 0) T_RUN(test_stuck);
    else if (strcmp(argv[1], "resume") == 0) T_RUN(test_resume);
    else if (strcmp(argv[1], "ckpt_skips") == 0) T_RUN(test_ckpt_skips);
    else T_RUN(test_nospace);
    int rc = T_DONE();
    if (rc == 0) newt_fs_rm_rf(tmpdir);
    else fprintf(stderr, "logs kept in %s\n", tmpdir);
    return rc;
  }
  if (strncmp(argv[1], "netns", 5) == 0 && !current) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/newt-e2e-%s-XXXXXX", argv[1]);
    if (!mkdtemp(tmpdir)) return 2;
    if (strcmp(argv[1], "netns") == 0) T_RUN(test_netns);
    else if (strcmp(argv[1], "netns_etcd_cut") == 0) T_RUN(test_netns_etcd_cut);
    else if (strcmp(argv[1], "netns_split") == 0) T_RUN(test_netns_split);
    else if (strcmp(argv[1], "netns_peers_cut") == 0) T_RUN(test_netns_peers_cut);
    else if (strcmp(argv[1], "netns_lone") == 0) T_RUN(test_netns_lone);
    else {
      fprintf(stderr, "test_elastic: no scenario \"%s\"\n", argv[1]);
      return 2;
    }
    int rc = T_DONE();
    if (rc == 0) newt_fs_rm_rf(tmpdir);
    else fprintf(stderr, "logs kept in %s\n", tmpdir);
    return rc;
  }
  if (!current) {
    fprintf(stderr, "test_elastic: no scenario \"%s\"\n", argv[1]);
    return 2;
  }
  snprintf(tmpdir, sizeof tmpdir, "/tmp/newt-e2e-%s-XXXXXX", argv[1]);
  if (!mkdtemp(tmpdir)) return 2;
  t_cur_name = current->name;
  T_RUN(test_scenario);
  int rc = T_DONE();
  if (rc == 0) newt_fs_rm_rf(tmpdir);
  else fprintf(stderr, "logs kept in %s\n", tmpdir);
  return rc;
}
