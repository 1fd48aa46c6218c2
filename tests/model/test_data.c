/* Token files and the loader: round trips of every width, corrupt and truncated files
 * rejected, the byte-level tokenizer, the generated corpus, the per-epoch permutation,
 * and the elastic invariant: resuming from any cursor under any data-parallel size
 * (changing mid-run) consumes exactly the samples of an uninterrupted run, in the same
 * order per step. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs.h"
#include "model/loader.h"
#include "model/tokens.h"
#include "test.h"

static char dir[256];

static const char *path_of(const char *name) {
  static char buf[4][512]; /* a few live at once: path_of(a), path_of(b) in one call */
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
  return buf[k];
}

static void test_roundtrip_widths(void) {
  uint32_t vocab[3] = {256, 50257, 100000};
  uint32_t width[3] = {1, 2, 4};
  for (int w = 0; w < 3; w++) {
    size_t n = 1000;
    uint8_t *buf = malloc(n * width[w]);
    for (size_t i = 0; i < n; i++) {
      uint32_t v = (uint32_t)((i * 2654435761u) % vocab[w]);
      for (uint32_t b = 0; b < width[w]; b++) buf[i * width[w] + b] = (uint8_t)(v >> (8 * b));
    }
    T_OK(model_tokens_write(path_of("w.tok"), buf, width[w], n, vocab[w]));
    model_tokens t;
    T_OK(model_tokens_open(&t, path_of("w.tok")));
    T_CHECK(t.width == width[w] && t.vocab == vocab[w] && t.count == n);
    for (size_t i = 0; i < n; i++)
      if (model_tokens_at(&t, i) != (uint32_t)((i * 2654435761u) % vocab[w])) {
        T_FAIL("width %u: token %zu differs", width[w], i);
        break;
      }
    model_tokens_close(&t);
    free(buf);
  }
  uint8_t bad[3] = {1, 2, 200};
  T_ERR(NEWT_ERR_INVALID, model_tokens_write(path_of("bad.tok"), bad, 1, 3, 100));
  T_CHECK(strstr(newt_errmsg(), "token 2") != NULL);
  T_ERR(NEWT_ERR_INVALID, model_tokens_write(path_of("bad.tok"), bad, 3, 1, 100));
}

static void flip_byte(const char *path, long off) {
  int fd = open(path, O_RDWR);
  unsigned char c;
  T_CHECK(pread(fd, &c, 1, off) == 1);
  c ^= 0x10;
  T_CHECK(pwrite(fd, &c, 1, off) == 1);
  close(fd);
}

static void test_corrupt_files_rejected(void) {
  char text[500];
  for (int i = 0; i < 500; i++) text[i] = (char)('a' + i % 26);
  const char *p = path_of("c.tok");
  model_tokens t;
  long offs[] = {0, 9, 13, 17, 25, 33, 64, 64 + 250, 64 + 499};
  for (size_t k = 0; k < sizeof offs / sizeof offs[0]; k++) {
    T_OK(model_tokens_write(p, text, 1, 500, 256));
    flip_byte(p, offs[k]);
    newt_result_t r = model_tokens_open(&t, p);
    T_CHECK_MSG(r == NEWT_ERR_CORRUPT, "flipped byte %ld: %s", offs[k], newt_result_name(r));
    T_CHECK(strstr(newt_errmsg(), p) != NULL);
  }
  T_OK(model_tokens_write(p, text, 1, 500, 256));
  T_CHECK(truncate(p, 64 + 499) == 0);
  T_ERR(NEWT_ERR_CORRUPT, model_tokens_open(&t, p));
  T_CHECK(strstr(newt_errmsg(), "truncated") != NULL);
  T_CHECK(truncate(p, 10) == 0);
  T_ERR(NEWT_ERR_CORRUPT, model_tokens_open(&t, p));
  T_ERR(NEWT_ERR_NOTFOUND, model_tokens_open(&t, path_of("missing.tok")));
}

static void test_prepare_bytes(void) {
  const char *txt = "In the beginning God created the heaven and the earth.\n\xc3\xa9\xff";
  T_OK(newt_fs_write_atomic(path_of("in.txt"), txt, strlen(txt)));
  uint64_t n = 0;
  T_OK(model_tokens_prepare(path_of("in.txt"), path_of("in.tok"), &n));
  T_CHECK(n == strlen(txt));
  model_tokens t;
  T_OK(model_tokens_open(&t, path_of("in.tok")));
  T_CHECK(t.width == 1 && t.vocab == 256 && t.count == n);
  for (uint64_t i = 0; i < n; i++) T_CHECK(model_tokens_at(&t, i) == (unsigned char)txt[i]);
  model_tokens_close(&t);
  T_ERR(NEWT_ERR_NOTFOUND, model_tokens_prepare(path_of("nope.txt"), path_of("x.tok"), &n));
}

static void test_generated_text(void) {
  char a[4096], b[4096], c[4096];
  model_text_generate(7, a, sizeof a);
  model_text_generate(7, b, sizeof b);
  model_text_generate(8, c, sizeof c);
  T_CHECK(memcmp(a, b, sizeof a) == 0);
  T_CHECK(memcmp(a, c, sizeof a) != 0);
  int letters = 0, spaces = 0, stops = 0;
  for (size_t i = 0; i < sizeof a; i++) {
    letters += (a[i] >= 'a' && a[i] <= 'z') || (a[i] >= 'A' && a[i] <= 'Z');
    spaces += a[i] == ' ';
    stops += a[i] == '.';
  }
  T_CHECK(letters > 3000 && spaces > 400 && stops > 40); /* text, not noise */
}

static void make_stream(model_tokens *t, size_t n) {
  uint8_t *buf = malloc(n);
  for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)(i * 131 + (i >> 8));
  T_OK(model_tokens_from_memory(t, buf, 1, n, 256));
  free(buf);
}

static void test_permutation_per_epoch(void) {
  model_tokens t;
  make_stream(&t, 1000 * 16 + 1 + 7);
  model_loader ld;
  T_OK(model_loader_init(&ld, &t, 16, 5, 256));
  T_CHECK(ld.windows == 1000);
  uint8_t *seen = calloc(1000, 1);
  int identity = 0, same_as_e0 = 0;
  for (uint64_t e = 0; e < 3; e++) {
    memset(seen, 0, 1000);
    for (uint64_t j = 0; j < 1000; j++) {
      uint64_t w = model_loader_window(&ld, e * 1000 + j);
      T_CHECK(w < 1000);
      if (w < 1000) seen[w]++;
      identity += w == j;
      if (e > 0) same_as_e0 += w == model_loader_window(&ld, j);
    }
    for (int w = 0; w < 1000; w++) T_CHECK_MSG(seen[w] == 1, "epoch %llu: window %d seen %d times", (unsigned long long)e, w, seen[w]);
  }
  T_CHECK(identity < 30 && same_as_e0 < 30); /* shuffled, and differently per epoch */
  model_loader other;
  T_OK(model_loader_init(&other, &t, 16, 6, 256));
  int same = 0;
  for (uint64_t j = 0; j < 1000; j++) same += model_loader_window(&ld, j) == model_loader_window(&other, j);
  T_CHECK(same < 30);
  /* fetch: inputs and targets are the window shifted by one */
  int32_t in[2 * 16], tg[2 * 16];
  T_OK(model_loader_fetch(&ld, 1234, 2, in, tg));
  for (int s = 0; s < 2; s++) {
    uint64_t base = model_loader_window(&ld, 1234 + s) * 16;
    for (int i = 0; i < 16; i++) {
      T_CHECK(in[s * 16 + i] == (int32_t)model_tokens_at(&t, base + i));
      T_CHECK(tg[s * 16 + i] == (int32_t)model_tokens_at(&t, base + i + 1));
    }
  }
  model_loader small;
  T_ERR(NEWT_ERR_INVALID, model_loader_init(&small, &t, 20000, 1, 256));
  T_ERR(NEWT_ERR_INVALID, model_loader_init(&small, &t, 16, 1, 100));
  free(seen);
  model_tokens_close(&t);
}

/* One run: steps with a data-parallel size per step; resumes from a saved cursor whenever
 * the size changes (as after a failure), as each rank would: it knows only the cursor, the
 * global batch, its rank and the size. Records per step the windows each rank fetched,
 * concatenated in rank order, and checks the tokens fetched against the windows. */
static void run_layout(const model_loader *ld, int64_t gb, int steps, const int *dp_of_step, uint64_t *out) {
  uint64_t cursor = 0; /* the committed state: samples consumed */
  int32_t *in = malloc((size_t)gb * ld->T * sizeof(int32_t)), *tg = malloc((size_t)gb * ld->T * sizeof(int32_t));
  for (int s = 0; s < steps; s++) {
    int dp = dp_of_step[s];
    size_t k = 0;
    for (int r = 0; r < dp; r++) {
      int64_t first, count;
      model_batch_slice(gb, r, dp, &first, &count);
      T_CHECK((size_t)first == k); /* contiguous slices in rank order */
      T_OK(model_loader_fetch(ld, cursor + (uint64_t)first, count, in, tg));
      for (int64_t i = 0; i < count; i++) {
        uint64_t w = model_loader_window(ld, cursor + (uint64_t)first + (uint64_t)i);
        T_CHECK(in[i * ld->T] == (int32_t)model_tokens_at(ld->tok, w * ld->T));
        out[(size_t)s * gb + k++] = w;
      }
    }
    T_CHECK(k == (size_t)gb);
    cursor += (uint64_t)gb;
  }
  free(in);
  free(tg);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static void test_elastic_resume(void) {
  model_tokens t;
  make_stream(&t, 37 * 32 + 1); /* 37 windows: the run crosses several epochs */
  model_loader ld;
  T_OK(model_loader_init(&ld, &t, 32, 11, 256));
  enum { STEPS = 24 };
  int64_t gbs[] = {12, 7};
  for (int g = 0; g < 2; g++) {
    int64_t gb = gbs[g];
    int one[STEPS], elastic[STEPS];
    /* dp 3, then a failure leaves 2, a join makes 5, then 4, 1 and 8 (more ranks than some
     * slices: a rank may get nothing when gb < dp) */
    int sizes[] = {3, 2, 5, 4, 1, 8};
    for (int s = 0; s < STEPS; s++) {
      one[s] = 1;
      elastic[s] = sizes[(s * 6) / STEPS];
    }
    uint64_t *ref = malloc(STEPS * gb * sizeof(uint64_t)), *got = malloc(STEPS * gb * sizeof(uint64_t));
    run_layout(&ld, gb, STEPS, one, ref);
    run_layout(&ld, gb, STEPS, elastic, got);
    T_CHECK_MSG(memcmp(ref, got, STEPS * gb * sizeof(uint64_t)) == 0,
                "gb %lld: an elastic run consumed other samples than the uninterrupted one", (long long)gb);
    /* as multisets too, and every window once per epoch */
    qsort(ref, STEPS * gb, sizeof *ref, cmp_u64);
    qsort(got, STEPS * gb, sizeof *got, cmp_u64);
    T_CHECK(memcmp(ref, got, STEPS * gb * sizeof(uint64_t)) == 0);
    /* resuming at a cursor mid-run under another size gives the remaining steps unchanged */
    uint64_t *tail = malloc(STEPS * gb * sizeof(uint64_t));
    run_layout(&ld, gb, STEPS, one, ref);
    for (int resume = 1; resume < STEPS; resume += 5) {
      model_loader again = ld; /* a fresh process: only the seed and the cursor carry over */
      uint64_t cursor = (uint64_t)resume * gb;
      for (int s = resume; s < STEPS; s++) {
        int dp = 1 + (s % 5);
        size_t k = 0;
        for (int r = 0; r < dp; r++) {
          int64_t first, count;
          model_batch_slice(gb, r, dp, &first, &count);
          for (int64_t i = 0; i < count; i++) tail[k++] = model_loader_window(&again, cursor + first + i);
        }
        T_CHECK(memcmp(tail, ref + (size_t)s * gb, gb * sizeof(uint64_t)) == 0);
        cursor += gb;
      }
    }
    free(tail);
    free(ref);
    free(got);
  }
  int64_t f, c;
  model_batch_slice(10, 2, 3, &f, &c);
  T_CHECK(f == 7 && c == 3);
  model_batch_slice(10, 0, 3, &f, &c);
  T_CHECK(f == 0 && c == 4);
  model_batch_slice(2, 4, 8, &f, &c);
  T_CHECK(f == 2 && c == 0);
  model_tokens_close(&t);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/newt-test-data-%d", (int)getpid());
  T_OK(newt_fs_mkdirs(dir, 0700));
  T_RUN(test_roundtrip_widths);
  T_RUN(test_corrupt_files_rejected);
  T_RUN(test_prepare_bytes);
  T_RUN(test_generated_text);
  T_RUN(test_permutation_per_epoch);
  T_RUN(test_elastic_resume);
  newt_fs_rm_rf(dir);
  return T_DONE();
}
