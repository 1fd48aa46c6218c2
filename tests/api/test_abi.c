/* The ABI rules of include/newt.h for options structs that grew: a program built against an
 * older header (a smaller newt_join_opts) gets only the bytes it has written, by the
 * function it calls (newt_join_opts_init as 0.1.0's header declared it, or
 * newt_join_opts_init_size with its sizeof), never one byte past its struct. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "newt.h"

/* built as a program outside newt is (newt.h alone): its own checks */
static int passed, failed;
#define T_CHECK_MSG(cond, ...)                                      \
  do {                                                              \
    if (cond) {                                                     \
      passed++;                                                     \
    } else {                                                        \
      failed++;                                                     \
      fprintf(stderr, "FAIL (test_abi.c:%d): ", __LINE__);          \
      fprintf(stderr, __VA_ARGS__);                                 \
      fputc('\n', stderr);                                          \
    }                                                               \
  } while (0)

#define CANARY 0xAB

/* Whether bytes [from, to) of p are all CANARY. */
static int untouched(const unsigned char *p, size_t from, size_t to) {
  for (size_t i = from; i < to; i++)
    if (p[i] != CANARY) return 0;
  return 1;
}

static void test_join_opts_sizes(void) {
  unsigned char buf[sizeof(newt_join_opts) + 64];
  newt_join_opts *o = (newt_join_opts *)(void *)buf;
  /* 0.1.0's entry point: its struct ended before `domain` */
  size_t v010 = offsetof(newt_join_opts, domain);
  memset(buf, CANARY, sizeof buf);
  (newt_join_opts_init)(o);
  T_CHECK_MSG(o->size == v010, "newt_join_opts_init (the function) set size %zu, 0.1.0's struct is %zu", o->size, v010);
  T_CHECK_MSG(untouched(buf, v010, sizeof buf), "newt_join_opts_init wrote past 0.1.0's struct (%zu bytes)", v010);
  T_CHECK_MSG(o->device == NEWT_FROM_ENV && o->handle_signals == 1, "0.1.0's fields lack their defaults");
  /* any caller's size: only that much */
  size_t small = offsetof(newt_join_opts, port);
  memset(buf, CANARY, sizeof buf);
  newt_join_opts_init_size(o, small);
  T_CHECK_MSG(o->size == small && untouched(buf, small, sizeof buf), "newt_join_opts_init_size(%zu) wrote %s", small,
              o->size == small ? "past it" : "another size");
  /* today's header: the whole struct, the new fields at their defaults */
  memset(buf, CANARY, sizeof buf);
  newt_join_opts_init(o);
  T_CHECK_MSG(o->size == sizeof(newt_join_opts) && o->domain == NULL && untouched(buf, sizeof(newt_join_opts), sizeof buf),
              "newt_join_opts_init (the macro): size %zu of %zu, domain %p", o->size, sizeof(newt_join_opts),
              (void *)o->domain);
  /* nonsense is ignored, not written */
  memset(buf, CANARY, sizeof buf);
  newt_join_opts_init_size(o, 3);
  T_CHECK_MSG(untouched(buf, 0, sizeof buf), "newt_join_opts_init_size(3) wrote into a struct without room for size");
  newt_join_opts_init_size(NULL, sizeof *o); /* no crash */
}

int main(void) {
  test_join_opts_sizes();
  fprintf(stderr, "%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
