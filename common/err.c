/* Thread-local error messages behind NEWT_ERR / NEWT_CHECK (see err.h). */
#include "err.h"

#include <stdarg.h>
#include <stdint.h>
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

/* The bytes of the well-formed UTF-8 sequence at s (1 to 4) and its code point, or 0: a
 * byte that starts none (a continuation byte alone, an overlong form, a surrogate, a code
 * point past U+10FFFF, a sequence cut short by the end). */
static int utf8_seq(const unsigned char *s, uint32_t *cp) {
  int n;
  uint32_t min;
  if (s[0] < 0x80) return *cp = s[0], 1;
  if (s[0] >= 0xc2 && s[0] <= 0xdf) n = 2, min = 0x80, *cp = s[0] & 0x1fu;
  else if (s[0] >= 0xe0 && s[0] <= 0xef) n = 3, min = 0x800, *cp = s[0] & 0x0fu;
  else if (s[0] >= 0xf0 && s[0] <= 0xf4) n = 4, min = 0x10000, *cp = s[0] & 0x07u;
  else return 0;
  for (int i = 1; i < n; i++) { /* the terminating NUL is no continuation byte: never read past it */
    if ((s[i] & 0xc0) != 0x80) return 0;
    *cp = *cp << 6 | (s[i] & 0x3fu);
  }
  if (*cp < min || *cp > 0x10ffff || (*cp >= 0xd800 && *cp <= 0xdfff)) return 0;
  return n;
}

/* A message may quote what a file, a peer or etcd held: every control character (a
 * terminal escape, a newline that would forge a log line) becomes '?', wherever it is
 * printed. */
char *newt_text_scrub(char *s) {
  unsigned char *r = (unsigned char *)s, *w = r;
  while (*r) {
    uint32_t cp = 0;
    int n = utf8_seq(r, &cp);
    if (n == 0 || cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp <= 0x9f)) {
      *w++ = '?';
      r += n ? n : 1;
    } else {
      memmove(w, r, (size_t)n);
      w += n, r += n;
    }
  }
  *w = '\0';
  return s;
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
  newt_text_scrub(errmsg);
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
  newt_text_scrub(errmsg);
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
