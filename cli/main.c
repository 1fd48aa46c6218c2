/* The `newt` binary: dispatches to a subcommand (see cli/cmds.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cmds.h"
#include "comm/comm.h"
#include "common/err.h"
#include "common/log.h"
#include "common/strutil.h"
#include "common/sys.h"
#include "model/dev.h"
#include "model/ops.h"

static const struct {
  const char *name;
  int (*fn)(int, char **);
  const char *help;
} commands[] = {
    {"run", newt_cmd_run, "start etcd, coordinators and workers on this host and train"},
    {"coordinator", newt_cmd_coordinator, "run a coordinator (leader election, plans, failure detection)"},
    {"worker", newt_cmd_worker, "run one training worker"},
    {"status", newt_cmd_status, "show a job's state from etcd (--watch: live)"},
    {"job", newt_cmd_job, "job rm: remove a job's records from etcd, so that its name can be used again"},
    {"report", newt_cmd_report, "an HTML page of a run: loss, membership, recoveries, throughput"},
    {"train", newt_cmd_train, "train in one process, without a coordinator"},
    {"ckpt", newt_cmd_ckpt, "list, inspect and verify checkpoints"},
    {"data", newt_cmd_data, "prepare token files"},
    {"bench", newt_cmd_bench, "benchmarks (JSON lines)"},
    {"demo", newt_cmd_demo, "the rendezvous demo: workers register, a leader is elected, one dies"},
};

/* `newt --version [--libs]`: the version and what the build holds; with --libs also what
 * the GPU parts load at run time (the CUDA driver and GPUs, NCCL, cuBLAS), each found or
 * why not. Exit status: 0, or 1 with --libs when one of them cannot be used. */
static int version(int libs) {
#if defined(NEWT_GPU_DOUBLE)
  const char *build = "the CUDA/NCCL test double: tests only";
#elif defined(NEWT_HAVE_CUDA)
  const char *build = "CUDA " NEWT_CUDA_BUILD ", sm_" NEWT_CUDA_ARCH "; NCCL and cuBLAS load at run time";
#else
  const char *build = "CPU only";
#endif
  printf("newt %s (%s)\n", NEWT_VERSION, build);
  if (!libs) return 0;
  int bad = 0;
  char d[768];
  newt_result_t r = model_dev_cuda_describe(d, sizeof d);
  printf("cuda: %s%s%s\n", d, r == NEWT_OK ? "" : ": ", r == NEWT_OK ? "" : newt_errmsg());
  bad |= r != NEWT_OK;
  const newt_backend *b;
  for (int i = 0; (b = newt_backend_at(i)) != NULL; i++) { /* the GPU backends' libraries (the CPU's is built in) */
    if (!newt_backend_uses_gpu(b)) continue;
    r = comm_backend_library(b->id, d, sizeof d);
    printf("%s: %s\n", b->name, r == NEWT_OK ? d : newt_errmsg());
    bad |= r != NEWT_OK;
  }
  const char *hint = model_blas_core_hint();
  if (hint)
    printf("openblas: core %s by its own choice; newt run, worker, train and bench ask for %s (OpenBLAS does not "
           "know this CPU's model)\n", model_blas_core(), hint);
  else
    printf("openblas: core %s%s\n", model_blas_core(), getenv("OPENBLAS_CORETYPE") ? " (OPENBLAS_CORETYPE)" : "");
  r = model_dev_cuda_library(d, sizeof d);
  printf("cublas: %s\n", r == NEWT_OK ? d : newt_errmsg());
  bad |= r != NEWT_OK;
  return bad;
}

/* The commands that compute with the model (or start processes that do, which inherit the
 * variable) start again with OPENBLAS_CORETYPE set when OpenBLAS took this CPU for an older
 * one (model/ops.h): the GEMMs of a step run several times faster. Same process, same pid. */
static void blas_core(char **argv) {
  static const char *const computes[] = {"run", "worker", "train", "bench"};
  int any = 0;
  for (size_t i = 0; i < sizeof computes / sizeof computes[0]; i++) any |= strcmp(argv[1], computes[i]) == 0;
  const char *core = any ? model_blas_core_hint() : NULL;
  if (!core || setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE"); /* not started again: on with the kernels loaded */
}

static void usage(FILE *f) {
  fprintf(f, "usage: newt <command> [flags]   (newt <command> --help for its flags)\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
  fprintf(f, "\nflags:\n  %-12s %s\n  %-12s %s\n", "--help", "this list", "--version",
          "print newt's version (--version --libs: also the GPU libraries it finds)");
}

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
      strcmp(argv[1], "help") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
    int libs = argc == 3 && strcmp(argv[2], "--libs") == 0;
    if (argc > 2 && !libs) {
      fprintf(stderr, "newt --version: unknown flag \"%s\" (--libs: the GPU libraries too)\n", argv[2]);
      return 2;
    }
    return version(libs);
  }
  blas_core(argv);
  newt_signals_install();
  (void)newt_log_enabled(NEWT_LOG_ERROR, 0); /* the logging environment read now: a bad value is said at once */
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp(argv[1], commands[i].name) == 0) return commands[i].fn(argc - 2, argv + 2);
  /* a mistyped command (or flag of newt itself): name the one that was meant */
  static const char *const own_flags[] = {"help", "version", NULL};
  const char *names[sizeof commands / sizeof commands[0] + 1];
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) names[i] = commands[i].name;
  names[sizeof commands / sizeof commands[0]] = NULL;
  int dashed = argv[1][0] == '-';
  const char *word = argv[1] + strspn(argv[1], "-");
  const char *near = newt_closest_name(word, strlen(word), dashed ? own_flags : names);
  if (near) {
    fprintf(stderr, "newt: unknown command \"%s\": did you mean %s%s? (newt --help lists them)\n", argv[1],
            dashed ? "--" : "", near);
    return 2;
  }
  fprintf(stderr, "newt: unknown command \"%s\"\n\n", argv[1]);
  usage(stderr);
  return 2;
}
