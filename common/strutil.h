/* Strings and byte buffers: a growable buffer, formatted allocation, number parsing
 * with size suffixes, hex and base64 (etcd's JSON gateway carries keys and values in
 * base64). */
#ifndef NEWT_COMMON_STRUTIL_H
#define NEWT_COMMON_STRUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* A growable byte buffer, always NUL-terminated after `len` bytes. */
typedef struct newt_buf {
  char *data;
  size_t len;
  size_t cap;
} newt_buf;

void newt_buf_init(newt_buf *b);
void newt_buf_free(newt_buf *b);
void newt_buf_reset(newt_buf *b); /* len = 0, keeps the memory */
newt_result_t newt_buf_reserve(newt_buf *b, size_t extra);
newt_result_t newt_buf_append(newt_buf *b, const void *data, size_t len);
newt_result_t newt_buf_printf(newt_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops the first n bytes. */
void newt_buf_consume(newt_buf *b, size_t n);

/* malloc'd formatted string, NULL when out of memory. */
char *newt_asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
char *newt_strdup(const char *s); /* NULL for NULL */

/* Integers with an optional binary suffix k/K, m/M, g/G, t/T (powers of 1024);
 * returns 0 on success, -1 when malformed or out of range. */
int newt_parse_size(const char *s, int64_t *out);
/* Plain decimal integer / floating point, the whole string; 0 or -1. */
int newt_parse_int(const char *s, int64_t *out);
int newt_parse_double(const char *s, double *out);

/* The closest of the NULL-terminated `names` to a mistyped `word` (edits: insert, delete,
 * substitute, swap two neighbours), or NULL when none is close enough to be what was meant
 * (at most 1 edit for words of up to 4 characters, 2 up to 8, 3 beyond; or a name the
 * word is a prefix of). For "did you mean --nproc?" after an unknown flag or command. */
const char *newt_closest_name(const char *word, size_t word_len, const char *const *names);

/* Lowercase hex of n bytes into out (2n+1 bytes). */
void newt_hex_encode(const void *in, size_t n, char *out);
/* Decodes 2n hex digits; 0 or -1. */
int newt_hex_decode(const char *in, void *out, size_t n);

/* Standard base64 with padding. Encode: out needs newt_base64_encoded_len(n) bytes
 * (including the NUL). Decode: out needs at least newt_base64_decoded_max(strlen)
 * bytes; returns the decoded length, or -1 on malformed input. */
size_t newt_base64_encoded_len(size_t n);
size_t newt_base64_decoded_max(size_t n);
void newt_base64_encode(const void *in, size_t n, char *out);
long newt_base64_decode(const char *in, size_t n, void *out);
/* Convenience: malloc'd results (NUL-terminated); NULL when out of memory or malformed. */
char *newt_base64_encode_alloc(const void *in, size_t n);
char *newt_base64_decode_alloc(const char *in, size_t n, size_t *outlen);

/* src copied into out (cap bytes, NUL-terminated, cut to fit) with every control character
 * (C0, DEL, C1) and every byte of no well-formed UTF-8 sequence made a '?' (newt_text_scrub):
 * a key or value from etcd, a file or a peer, safe to print. Returns out. */
char *newt_str_printable(char *out, size_t cap, const char *src);

/* Appends item to the comma-separated list in out (cap bytes, NUL-terminated: "" to start):
 * ", item", or item alone when out is empty; cut to fit. Returns out. */
char *newt_list_add(char *out, size_t cap, const char *item);

/* The median of v[0..n) (sorts v in place); 0 when n is 0. */
double newt_median(double *v, size_t n);
/* The q-quantile (0 <= q <= 1, the lower of two neighbours) of v[0..n); sorts v in place. */
double newt_percentile(double *v, size_t n, double q);

#endif
