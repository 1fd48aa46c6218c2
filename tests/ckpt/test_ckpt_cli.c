/* The tools and the benchmark, run as the user runs them: `newt ckpt ls / inspect /
 * verify` on a real checkpoint directory, and a small `newt bench ckpt` of each kind whose
 * JSON line must carry every field. */
#include "ckpt/internal.h"
#include "ckpt_util.h"

static char root[256];

#define EXPECT(rc_want, args, ...)                                                                  \
  do {                                                                                              \
    int rc_ = ts_run_newt(args, out, sizeof out);                                                      \
    const char *needles_[] = {__VA_ARGS__, NULL};                                                   \
    int ok_ = rc_ == (rc_want);                                                                     \
    for (const char **n_ = needles_; ok_ && *n_; n_++) ok_ = strstr(out, *n_) != NULL;              \
    T_CHECK_MSG(ok_, "newt %s: exit %d (expected %d), output:\n%s", args, rc_, rc_want, out);       \
  } while (0)

static void test_tools(void) {
  static char out[1 << 16];
  char dir[300], args[600];
  snprintf(dir, sizeof dir, "%s/ck", root);
  T_OK(ts_save(dir, 1, 1, 0, 4096));
  T_OK(ts_save(dir, 12, 1, 0, 4096));
  char sd[400];
  ckpt_step_dirname(sd, sizeof sd, dir, 20);
  T_OK(newt_fs_mkdirs(sd, 0755)); /* a save in progress */

  snprintf(args, sizeof args, "ckpt ls %s", dir);
  EXPECT(0, args, "STEP", "step-0000000001  committed", "step-0000000012  committed", "<- latest",
         "step-0000000020  incomplete");
  snprintf(args, sizeof args, "ckpt ls --json %s", dir);
  EXPECT(0, args, "{\"step\":12,\"name\":\"step-0000000012\",\"state\":\"committed\",\"latest\":true,\"nranks\":1,\"tensors\":8,",
         "\"state\":\"incomplete\"");
  snprintf(args, sizeof args, "ckpt inspect %s", dir);
  EXPECT(0, args, "step-0000000012", "step 12", "layout: 1 rank(s)", "adam.v/wte", "97x16", "bf16", "training state",
         "\"lr_step\":\t12", "ratio");
  snprintf(args, sizeof args, "ckpt inspect --json %s/1", dir);
  EXPECT(0, args, "\"step\":1,", "\"nranks\":1", "\"name\":\"h.0.attn.qkv.w\",\"dtype\":\"f32\",\"shape\":[48,16]",
         "\"state\":{\"step\":1,");
  snprintf(args, sizeof args, "ckpt verify %s", dir);
  EXPECT(0, args, "step-0000000012: ok", "every checksum verified");
  snprintf(args, sizeof args, "ckpt verify %s/step-0000000020", dir);
  EXPECT(1, args, "no MANIFEST");
  snprintf(args, sizeof args, "ckpt verify %s/nothing", root);
  EXPECT(1, args, "no usable committed checkpoint");
  snprintf(args, sizeof args, "ckpt ls %s/nothing", root);
  EXPECT(1, args, "does not exist");
  EXPECT(2, "ckpt frobnicate x", "unknown command");
  EXPECT(2, "ckpt ls", "usage: newt ckpt");
  EXPECT(0, "ckpt --help", "usage: newt ckpt");
}

static void test_bench(void) {
  static char out[1 << 16];
  const char *kinds[] = {"train", "fp32", "bf16"};
  for (int k = 0; k < 3; k++) {
    char args[600];
    snprintf(args, sizeof args, "bench ckpt --bytes 2M --repeat 1 --chunk 256K --kind %s --dir %s/bench-%s", kinds[k],
             root, kinds[k]);
    char kind[64];
    snprintf(kind, sizeof kind, "{\"bench\":\"ckpt\",\"kind\":\"%s\",\"state_bytes\":", kinds[k]);
    EXPECT(0, args, kind, "\"file_bytes\":", "\"ratio\":", "\"save_GBps\":", "\"load_GBps\":", "\"stall_ms\":",
           "\"cache\":");
    const char *ratio = strstr(out, "\"ratio\":");
    if (ratio) T_CHECK_MSG(atof(ratio + 8) > 1.05, "%s: ratio %s", kinds[k], ratio + 8);
  }
  EXPECT(2, "bench ckpt --kind nope --bytes 1M", "train, fp32 or bf16");
}

int main(void) {
  ts_tmpdir(root, sizeof root, "/tmp", "ckpt-cli");
  T_RUN(test_tools);
  T_RUN(test_bench);
  newt_fs_rm_rf(root);
  return T_DONE();
}
