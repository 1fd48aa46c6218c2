/* The dense bf16 tensor-core peak of a GPU by its name (model/dev.h: model_dev_peak_bf16),
 * the denominator of MFU. Each figure is the vendor's datasheet number for bf16 tensor-core
 * FLOP/s *without* sparsity (the datasheets print the sparse figure, twice these, with an
 * asterisk); a part's form factor changes it (clocks, power), so the SXM, PCIe and NVL
 * parts are rows of their own:
 *
 *   model    variant  cc   TFLOP/s  datasheet
 *   H100     SXM      9    989      H100 Tensor Core GPU (1,979 sparse)
 *   H100     PCIe     9    756      (1,513 sparse)
 *   H100     NVL      9    835      (1,671 sparse)
 *   H200     SXM      9    989      H200 Tensor Core GPU (1,979 sparse)
 *   H200     NVL      9    835      (1,671 sparse)
 *   H800     SXM      9    989      as the H100 SXM
 *   H800     PCIe     9    756      as the H100 PCIe
 *   H20               9    148      (296 sparse)
 *   GH200             9    989      GH200 Grace Hopper Superchip (the H100/H200 SXM GPU)
 *   A100, A800        8    312      A100 Tensor Core GPU (624 sparse), SXM and PCIe alike
 *   A30               8    165      (330 sparse)
 *   A10               8    125      (250 sparse)
 *   L40S              8    362      (733 sparse)
 *   L40               8    181      (362 sparse)
 *   L4                8    121      (242 sparse)
 *   B200              10   2250     HGX B200 (4.5 PFLOP/s sparse per GPU)
 *   GB200             10   2500     GB200 NVL72 (5 PFLOP/s sparse per GPU)
 *
 * A name is split into words (at spaces and dashes): "NVIDIA H200 NVL" is the H200's NVL
 * row, "NVIDIA H200" (no variant word) its SXM row, "NVIDIA A100-SXM4-80GB" the A100's;
 * the model word must match whole ("A10" is not "A100") and the compute capability's
 * major agree. Anything else is 0: unknown, and MFU is then left out rather than guessed. */
#include <string.h>

#include "model/dev.h"

typedef struct peak_row {
  const char *model, *variant; /* variant NULL: the row for a name without a variant word */
  int major;
  double tflops;
} peak_row;

static const peak_row rows[] = {
    {"H100", "PCIe", 9, 756},  {"H100", "NVL", 9, 835},  {"H100", NULL, 9, 989},  {"H200", "NVL", 9, 835},
    {"H200", NULL, 9, 989},    {"H800", "PCIe", 9, 756}, {"H800", NULL, 9, 989},  {"H20", NULL, 9, 148},
    {"GH200", NULL, 9, 989},   {"A100", NULL, 8, 312},   {"A800", NULL, 8, 312},  {"A30", NULL, 8, 165},
    {"A10", NULL, 8, 125},     {"L40S", NULL, 8, 362},   {"L40", NULL, 8, 181},   {"L4", NULL, 8, 121},
    {"B200", NULL, 10, 2250},  {"GB200", NULL, 10, 2500},
};

/* 1 when `word` is one of name's words (split at spaces and dashes) */
static int has_word(const char *name, const char *word) {
  size_t n = strlen(word);
  for (const char *p = name; *p;) {
    size_t len = strcspn(p, " -");
    if (len == n && strncmp(p, word, n) == 0) return 1;
    p += len;
    p += strspn(p, " -");
  }
  return 0;
}

double model_dev_peak_bf16(const char *name, int cc_major) {
  const peak_row *plain = NULL;
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    const peak_row *r = &rows[i];
    if (r->major != cc_major || !has_word(name, r->model)) continue;
    if (r->variant && has_word(name, r->variant)) return r->tflops * 1e12;
    if (!r->variant && !plain) plain = r;
  }
  return plain ? plain->tflops * 1e12 : 0.0;
}
