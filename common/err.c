/* Thread-local error messages behind NEWT_ERR / NEWT_CHECK (see err.h). */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

#define NEWT_ERRMSG_MAX 1024

static _Thread_local char errmsg[NEWT_ERRMSG_MAX];
static _Thread_local newt_result_t errcode;

static const char *const names[NEWT_ERR__COUNT] = {
    [NEWT_OK] = "ok",
    [NEWT_ERR_INVALID] = "invalid",
    [NEWT_ERR_SYS] = "system",
    [NEWT_ERR_NOMEM] = "nomem",
    [NEWT_ERR_TIMEOUT] = "timeout",
    [NEWT_ERR_ABORTED] = "aborted",
    [NEWT_ERR_PEER] = "peer",
    [NEWT_ERR_NOTFOUND] = "notfound",
    [NEWT_ERR_CONFLICT] = "conflict",
    [NEWT_ERR_UNAVAILABLE] = "unavailable",
    [NEWT_ERR_AUTH] = "auth",
    [NEWT_ERR_CORRUPT] = "corrupt",
    [NEWT_ERR_NOSPACE] = "nospace",
    [NEWT_ERR_CUDA] = "cuda",
    [NEWT_ERR_NCCL] = "nccl",
    [NEWT_ERR_INTERNAL] = "internal",
    [NEWT_ERR_UNSUPPORTED] = "unsupported",
};

const char *newt_result_name(newt_result_t r) {
  if ((int)r < 0 || r >= NEWT_ERR__COUNT) return "unknown";
  return names[r];
}

/* A message may quote what a file, a peer or etcd held: every control character (a
 * terminal escape, a newline that would forge a log line) becomes '?', wherever it is
 * printed. */
static void scrub(char *m) {
  for (; *m; m++)
    if ((unsigned char)*m < 0x20 || *m == 0x7f) *m = '?';
}

newt_result_t newt_err_set(newt_result_t code, const char *file, int line, const char *fmt, ...) {
  /* formatted apart, then copied: an argument may be newt_errmsg() itself ("...: %s" of the
     failure below), which vsnprintf must not read while it writes over it */
  char msg[NEWT_ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  memcpy(errmsg, msg, sizeof errmsg);
  scrub(errmsg);
  errcode = code;
  NEWT_LOG_AT(NEWT_LOG_DEBUG, COMMON, "error %s at %s:%d: %s", newt_result_name(code), file, line,
              errmsg);
  return code;
}

newt_result_t newt_err_wrap(newt_result_t code, const char *fmt, ...) {
  char prefix[NEWT_ERRMSG_MAX];
  char old[NEWT_ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, errmsg, sizeof old);
  size_t n = strlen(prefix);
  if (n >= sizeof errmsg) n = sizeof errmsg - 1;
  memcpy(errmsg, prefix, n);
  size_t m = strnlen(old, sizeof errmsg - 1 - n);
  memcpy(errmsg + n, old, m);
  errmsg[n + m] = '\0';
  scrub(errmsg);
  errcode = code;
  return code;
}

const char *newt_errmsg(void) { return errmsg; }

newt_result_t newt_errcode(void) { return errcode; }

void newt_err_clear(void) {
  errmsg[0] = '\0';
  errcode = NEWT_OK;
}

void newt_err_trace(newt_result_t r, const char *file, int line, const char *expr) {
  NEWT_LOG_AT(NEWT_LOG_DEBUG, COMMON, "%s via %s:%d: %s", newt_result_name(r), file, line, expr);
}
