/* Growable buffers, formatting, number parsing, hex and base64 (see strutil.h). */
#include "strutil.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void newt_buf_init(newt_buf *b) { memset(b, 0, sizeof *b); }

void newt_buf_free(newt_buf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

void newt_buf_reset(newt_buf *b) {
  b->len = 0;
  if (b->data) b->data[0] = '\0';
}

newt_result_t newt_buf_reserve(newt_buf *b, size_t extra) {
  if (b->len + extra + 1 <= b->cap) return NEWT_OK;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra + 1) cap *= 2;
  char *d = realloc(b->data, cap);
  if (!d) return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory growing a buffer to %zu bytes", cap);
  b->data = d;
  b->cap = cap;
  return NEWT_OK;
}

newt_result_t newt_buf_append(newt_buf *b, const void *data, size_t len) {
  NEWT_CHECK(newt_buf_reserve(b, len));
  if (len) memcpy(b->data + b->len, data, len);
  b->len += len;
  b->data[b->len] = '\0';
  return NEWT_OK;
}

newt_result_t newt_buf_printf(newt_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return NEWT_ERR(NEWT_ERR_INVALID, "bad format string");
  NEWT_CHECK(newt_buf_reserve(b, (size_t)n));
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return NEWT_OK;
}

void newt_buf_consume(newt_buf *b, size_t n) {
  if (n >= b->len) {
    newt_buf_reset(b);
    return;
  }
  memmove(b->data, b->data + n, b->len - n);
  b->len -= n;
  b->data[b->len] = '\0';
}

char *newt_asprintf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return NULL;
  char *s = malloc((size_t)n + 1);
  if (!s) return NULL;
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return s;
}

char *newt_strdup(const char *s) { return s ? strdup(s) : NULL; }

int newt_parse_int(const char *s, int64_t *out) {
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || *end) return -1;
  *out = v;
  return 0;
}

int newt_parse_double(const char *s, double *out) {
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || *end) return -1;
  *out = v;
  return 0;
}

int newt_parse_size(const char *s, int64_t *out) {
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s) return -1;
  int shift = 0;
  switch (*end) {
    case '\0': break;
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: return -1;
  }
  if (*end == 'i' || *end == 'B') end++; /* "KiB", "MB" */
  if (*end == 'B') end++;
  if (*end) return -1;
  if (shift && (v > (INT64_MAX >> shift) || v < (INT64_MIN >> shift))) return -1;
  *out = (int64_t)v * ((int64_t)1 << shift);
  return 0;
}

/* Optimal string alignment distance (Levenshtein with swaps of neighbours), in two rows
 * plus one; words longer than 63 characters are never close. */
static size_t edit_distance(const char *a, size_t n, const char *b, size_t m) {
  enum { MAXW = 64 };
  if (n >= MAXW || m >= MAXW) return SIZE_MAX;
  size_t d[MAXW + 1][MAXW + 1];
  for (size_t i = 0; i <= n; i++) d[i][0] = i;
  for (size_t j = 0; j <= m; j++) d[0][j] = j;
  for (size_t i = 1; i <= n; i++)
    for (size_t j = 1; j <= m; j++) {
      size_t cost = a[i - 1] != b[j - 1], best = d[i - 1][j - 1] + cost;
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[n][m];
}

const char *newt_closest_name(const char *word, size_t word_len, const char *const *names) {
  if (!word_len) return NULL;
  size_t allowed = word_len <= 4 ? 1 : word_len <= 8 ? 2 : 3, best_d = SIZE_MAX;
  const char *best = NULL, *prefix_of = NULL;
  for (size_t i = 0; names[i]; i++) {
    size_t len = strlen(names[i]), dist = edit_distance(word, word_len, names[i], len);
    if (dist < best_d) best_d = dist, best = names[i];
    if (!prefix_of && word_len >= 2 && word_len < len && strncmp(word, names[i], word_len) == 0) prefix_of = names[i];
  }
  if (best && best_d <= allowed) return best;
  return prefix_of;
}

void newt_hex_encode(const void *in, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  const unsigned char *p = in;
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  out[2 * n] = '\0';
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int newt_hex_decode(const char *in, void *out, size_t n) {
  unsigned char *p = out;
  for (size_t i = 0; i < n; i++) {
    int hi = hexval(in[2 * i]), lo = hi < 0 ? -1 : hexval(in[2 * i + 1]);
    if (hi < 0 || lo < 0) return -1;
    p[i] = (unsigned char)(hi << 4 | lo);
  }
  return 0;
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t newt_base64_encoded_len(size_t n) { return (n + 2) / 3 * 4 + 1; }

size_t newt_base64_decoded_max(size_t n) { return n / 4 * 3 + 3; }

void newt_base64_encode(const void *in, size_t n, char *out) {
  const unsigned char *p = in;
  size_t o = 0, i = 0;
  for (; i + 3 <= n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
    out[o++] = b64[v >> 18];
    out[o++] = b64[(v >> 12) & 63];
    out[o++] = b64[(v >> 6) & 63];
    out[o++] = b64[v & 63];
  }
  if (n - i == 1) {
    uint32_t v = (uint32_t)p[i] << 16;
    out[o++] = b64[v >> 18];
    out[o++] = b64[(v >> 12) & 63];
    out[o++] = '=';
    out[o++] = '=';
  } else if (n - i == 2) {
    uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
    out[o++] = b64[v >> 18];
    out[o++] = b64[(v >> 12) & 63];
    out[o++] = b64[(v >> 6) & 63];
    out[o++] = '=';
  }
  out[o] = '\0';
}

static int b64val(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;
  if (c == '/' || c == '_') return 63;
  return -1;
}

long newt_base64_decode(const char *in, size_t n, void *out) {
  unsigned char *p = out;
  while (n > 0 && in[n - 1] == '=') n--;
  if (n % 4 == 1) return -1;
  size_t o = 0;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; i++) {
    int v = b64val((unsigned char)in[i]);
    if (v < 0) return -1;
    acc = acc << 6 | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      p[o++] = (unsigned char)(acc >> bits);
    }
  }
  return (long)o;
}

char *newt_base64_encode_alloc(const void *in, size_t n) {
  char *s = malloc(newt_base64_encoded_len(n));
  if (s) newt_base64_encode(in, n, s);
  return s;
}

char *newt_base64_decode_alloc(const char *in, size_t n, size_t *outlen) {
  char *s = malloc(newt_base64_decoded_max(n) + 1);
  if (!s) return NULL;
  long m = newt_base64_decode(in, n, s);
  if (m < 0) {
    free(s);
    return NULL;
  }
  s[m] = '\0';
  if (outlen) *outlen = (size_t)m;
  return s;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double newt_percentile(double *v, size_t n, double q) {
  if (!n) return 0;
  qsort(v, n, sizeof *v, cmp_double);
  size_t i = (size_t)(q * (double)(n - 1));
  return v[i < n ? i : n - 1];
}

double newt_median(double *v, size_t n) {
  if (!n) return 0;
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

char *newt_list_add(char *out, size_t cap, const char *item) {
  size_t l = strnlen(out, cap);
  if (l + 1 < cap) snprintf(out + l, cap - l, "%s%s", l ? ", " : "", item);
  return out;
}

char *newt_str_printable(char *out, size_t cap, const char *src) {
  if (!cap) return out;
  size_t i = 0;
  for (; src && src[i] && i + 1 < cap; i++) out[i] = src[i];
  out[i] = '\0';
  return newt_text_scrub(out);
}
