/* Result codes and the check macros every newt function uses.
 *
 * Every library function returns a newt_result_t. A failing function records a
 * human-readable message in a thread-local slot with NEWT_ERR(code, fmt, ...) and
 * returns the code; callers propagate it with NEWT_CHECK / NEWT_CHECK_GOTO, which
 * log the call site at DEBUG level ("via file:line") so a failure can be traced
 * without a debugger. The message of the last failure on this thread is
 * newt_errmsg(). Library code never calls exit(). */
#ifndef NEWT_COMMON_ERR_H
#define NEWT_COMMON_ERR_H

#include <stddef.h>

/* The codes (NEWT_OK, NEWT_ERR_INVALID, ...) are libnewt's public ones (include/newt.h). */
#include "newt.h"
#define NEWT_ERR__COUNT (NEWT_ERR_UNSUPPORTED + 1)

/* Short stable name of a code ("timeout", "peer", ...). */
const char *newt_result_name(newt_result_t r);

/* Records a formatted message for this thread and returns `code`. Use NEWT_ERR. */
newt_result_t newt_err_set(newt_result_t code, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Prefixes the current message with context ("loading ckpt/17: " + message). */
newt_result_t newt_err_wrap(newt_result_t code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Message of the last failure recorded on this thread ("" when none). */
const char *newt_errmsg(void);

/* Code of the last failure recorded on this thread. */
newt_result_t newt_errcode(void);

/* Clears this thread's message. */
void newt_err_clear(void);

/* Text from outside (a file, a peer, etcd) made safe to print, in place: every control
 * character -- C0 (below 0x20), DEL and C1 (U+0080 to U+009F: CSI is U+009B, in UTF-8 the
 * bytes C2 9B) -- and every byte of no well-formed UTF-8 sequence (a raw 0x9B is CSI to an
 * 8-bit terminal) becomes one '?'. Returns s. */
char *newt_text_scrub(char *s);

/* Logs "via file:line: expr" at DEBUG level for the COMMON subsystem. */
void newt_err_trace(newt_result_t r, const char *file, int line, const char *expr);

#define NEWT_ERR(code, ...) newt_err_set((code), __FILE__, __LINE__, __VA_ARGS__)

#define NEWT_CHECK(call)                                   \
  do {                                                     \
    newt_result_t res_ = (call);                           \
    if (res_ != NEWT_OK) {                                 \
      newt_err_trace(res_, __FILE__, __LINE__, #call);     \
      return res_;                                         \
    }                                                      \
  } while (0)

#define NEWT_CHECK_GOTO(call, res, label)                  \
  do {                                                     \
    (res) = (call);                                        \
    if ((res) != NEWT_OK) {                                \
      newt_err_trace((res), __FILE__, __LINE__, #call);    \
      goto label;                                          \
    }                                                      \
  } while (0)

/* Fails with NEWT_ERR_NOMEM when `ptr` is NULL. */
#define NEWT_CHECK_ALLOC(ptr)                                                 \
  do {                                                                        \
    if ((ptr) == NULL) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory: %s", #ptr); \
  } while (0)

#endif
