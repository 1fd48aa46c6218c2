/* An index from names to the places of the items of a caller's array that carry them: a hash
 * table of open addressing (linear probing, deletion by backward shift) that stores item
 * numbers, never names. The names stay in the items, at a fixed offset of each (key_off) in an
 * array of items of stride bytes, so the table holds 4 + 4 bytes a slot and the caller's array
 * may move (realloc): every call is given its base.
 *
 *   newt_strindex ix = NEWT_STRINDEX(job_worker, id);
 *   newt_strindex_add(&ix, members, n);              item n (its name) is now in the array
 *   int i = newt_strindex_find(&ix, members, "w3");  -1: none
 *   newt_strindex_del(&ix, members, i);              item i leaves (before it is overwritten)
 *   newt_strindex_renumber(&ix, members, last, i);   item last is moving to i (before the move)
 *
 * A lookup, an addition and a deletion cost O(1) on average (the table is kept at most half
 * full), where a scan of the array cost n: the leader looks a worker up for each of 100,000
 * ranks and registrations. Names are not checked for uniqueness here: add one that is not
 * there (find first). */
#ifndef NEWT_COMMON_STRINDEX_H
#define NEWT_COMMON_STRINDEX_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef struct newt_strindex {
  size_t stride, key_off; /* item i's name: (const char *)base + i * stride + key_off */
  int *slot;              /* cap slots: -1 empty, else an item number */
  uint32_t *hash;         /* the hash of each slot's name (compared before the names) */
  size_t cap;             /* a power of two (0: nothing allocated yet) */
  int count;
} newt_strindex;

#define NEWT_STRINDEX(T, member) ((newt_strindex){.stride = sizeof(T), .key_off = offsetof(T, member)})

/* The item of base named key (-1: none). */
int newt_strindex_find(const newt_strindex *x, const void *base, const char *key);
/* Item i of base, under its name. NEWT_ERR_NOMEM when the table cannot grow (it is then as it was). */
newt_result_t newt_strindex_add(newt_strindex *x, const void *base, int i);
/* Item i leaves the index: called while base still holds it (its name is read there). */
void newt_strindex_del(newt_strindex *x, const void *base, int i);
/* Item from is to be item to (the caller moves it: a deletion that swaps the last item into
 * the hole): called while base still holds it at from. */
void newt_strindex_renumber(newt_strindex *x, const void *base, int from, int to);
/* Every name out (the table kept for reuse). */
void newt_strindex_clear(newt_strindex *x);
/* The table freed; the index empty and usable again. */
void newt_strindex_free(newt_strindex *x);

#endif
