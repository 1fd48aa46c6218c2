/* The minimal test harness every newt test binary uses.
 *
 *   static void test_roundtrip(void) { T_CHECK(x == y); T_OK(call()); }
 *   int main(void) { T_RUN(test_roundtrip); return T_DONE(); }
 *
 * A failed check prints file:line, the expression and (for T_OK) newt_errmsg(); the
 * test goes on. T_DONE prints "N passed, N failed" and returns non-zero on any failure. */
#ifndef NEWT_TESTS_TEST_H
#define NEWT_TESTS_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"

static int t_passed, t_failed, t_cur_failed;
static const char *t_cur_name = "";

#define T_FAIL(...)                                                        \
  do {                                                                     \
    fprintf(stderr, "FAIL %s (%s:%d): ", t_cur_name, __FILE__, __LINE__);  \
    fprintf(stderr, __VA_ARGS__);                                          \
    fputc('\n', stderr);                                                   \
    t_cur_failed++;                                                        \
  } while (0)

#define T_CHECK(cond)                       \
  do {                                      \
    if (!(cond)) T_FAIL("%s", #cond);       \
  } while (0)

#define T_CHECK_MSG(cond, ...)              \
  do {                                      \
    if (!(cond)) T_FAIL(__VA_ARGS__);       \
  } while (0)

/* The call must return NEWT_OK. */
#define T_OK(call)                                                                        \
  do {                                                                                    \
    newt_result_t t_r_ = (call);                                                          \
    if (t_r_ != NEWT_OK) T_FAIL("%s -> %s: %s", #call, newt_result_name(t_r_), newt_errmsg()); \
  } while (0)

/* The call must fail with `code`. */
#define T_ERR(code, call)                                                                  \
  do {                                                                                     \
    newt_result_t t_r_ = (call);                                                           \
    if (t_r_ != (code))                                                                    \
      T_FAIL("%s -> %s, expected %s (%s)", #call, newt_result_name(t_r_),                  \
             newt_result_name(code), newt_errmsg());                                       \
  } while (0)

#define T_NEAR(a, b, tol)                                                                   \
  do {                                                                                      \
    double t_a_ = (a), t_b_ = (b);                                                          \
    if (!(fabs(t_a_ - t_b_) <= (tol))) T_FAIL("%s = %.9g, %s = %.9g, tolerance %g", #a, t_a_, #b, t_b_, (double)(tol)); \
  } while (0)

#define T_RUN(fn)                                                                      \
  do {                                                                                 \
    t_cur_name = #fn;                                                                  \
    t_cur_failed = 0;                                                                  \
    double t_t0_ = newt_now_s();                                                       \
    fn();                                                                              \
    fprintf(stderr, "%s %s (%.2f s)\n", t_cur_failed ? "FAILED" : "ok    ", #fn,       \
            newt_now_s() - t_t0_);                                                     \
    if (t_cur_failed) t_failed++;                                                      \
    else t_passed++;                                                                   \
  } while (0)

/* text with the first `from` replaced by `to` (malloc'd; NULL: not there, or no memory): a
 * record made wrong in one place, for a reader's refusals. */
static inline char *t_replaced(const char *text, const char *from, const char *to) {
  const char *at = strstr(text, from);
  if (!at) return NULL;
  size_t a = (size_t)(at - text), nf = strlen(from), nt = strlen(to), n = strlen(text);
  char *out = malloc(n - nf + nt + 1);
  if (!out) return NULL;
  memcpy(out, text, a);
  memcpy(out + a, to, nt);
  memcpy(out + a + nt, at + nf, n - a - nf + 1);
  return out;
}

#define T_DONE() (fprintf(stderr, "%d passed, %d failed\n", t_passed, t_failed), t_failed ? 1 : 0)

#endif
