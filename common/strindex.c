/* Names to item numbers (see strindex.h): FNV-1a hashes, linear probing, a table at most half
 * full, deletion by backward shift (no tombstones: a table that sees 100,000 joins and leaves
 * does not fill with them). */
#include "common/strindex.h"

#include <stdlib.h>
#include <string.h>

static uint32_t hash_of(const char *s) {
  uint32_t h = 2166136261u;
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) h = (h ^ *c) * 16777619u;
  return h;
}

static const char *name_of(const newt_strindex *x, const void *base, int i) {
  return (const char *)base + (size_t)i * x->stride + x->key_off;
}

/* The slot of item i, or of its name's first empty slot (item numbers are compared: the name
 * of item i is the one looked up). */
static size_t slot_of_item(const newt_strindex *x, uint32_t h, int i) {
  size_t s = h & (x->cap - 1);
  while (x->slot[s] >= 0 && x->slot[s] != i) s = (s + 1) & (x->cap - 1);
  return s;
}

int newt_strindex_find(const newt_strindex *x, const void *base, const char *key) {
  if (!x->cap) return -1;
  uint32_t h = hash_of(key);
  for (size_t s = h & (x->cap - 1); x->slot[s] >= 0; s = (s + 1) & (x->cap - 1))
    if (x->hash[s] == h && strcmp(name_of(x, base, x->slot[s]), key) == 0) return x->slot[s];
  return -1;
}

static void put(newt_strindex *x, uint32_t h, int i) {
  size_t s = h & (x->cap - 1);
  while (x->slot[s] >= 0) s = (s + 1) & (x->cap - 1);
  x->slot[s] = i;
  x->hash[s] = h;
}

static newt_result_t grow(newt_strindex *x) {
  size_t cap = x->cap ? 2 * x->cap : 16;
  int *slot = malloc(cap * sizeof *slot);
  uint32_t *hash = malloc(cap * sizeof *hash);
  if (!slot || !hash) {
    free(slot);
    free(hash);
    return NEWT_ERR(NEWT_ERR_NOMEM, "out of memory indexing %d names", x->count + 1);
  }
  for (size_t s = 0; s < cap; s++) slot[s] = -1;
  int *old_slot = x->slot;
  uint32_t *old_hash = x->hash;
  size_t old_cap = x->cap;
  x->slot = slot, x->hash = hash, x->cap = cap;
  for (size_t s = 0; s < old_cap; s++)
    if (old_slot[s] >= 0) put(x, old_hash[s], old_slot[s]);
  free(old_slot);
  free(old_hash);
  return NEWT_OK;
}

newt_result_t newt_strindex_add(newt_strindex *x, const void *base, int i) {
  if (2 * ((size_t)x->count + 1) > x->cap) NEWT_CHECK(grow(x));
  put(x, hash_of(name_of(x, base, i)), i);
  x->count++;
  return NEWT_OK;
}

void newt_strindex_del(newt_strindex *x, const void *base, int i) {
  if (!x->cap) return;
  size_t mask = x->cap - 1, s = slot_of_item(x, hash_of(name_of(x, base, i)), i);
  if (x->slot[s] != i) return; /* not indexed */
  x->slot[s] = -1;
  x->count--;
  for (size_t j = (s + 1) & mask; x->slot[j] >= 0; j = (j + 1) & mask) { /* backward shift */
    size_t home = x->hash[j] & mask;
    /* the entry at j stays when its home lies cyclically in (s, j]: moved to s, a probe from
       its home would stop at the hole first */
    int stays = s < j ? (home > s && home <= j) : (home > s || home <= j);
    if (stays) continue;
    x->slot[s] = x->slot[j], x->hash[s] = x->hash[j];
    x->slot[j] = -1;
    s = j;
  }
}

void newt_strindex_renumber(newt_strindex *x, const void *base, int from, int to) {
  if (!x->cap || from == to) return;
  size_t s = slot_of_item(x, hash_of(name_of(x, base, from)), from);
  if (x->slot[s] == from) x->slot[s] = to;
}

void newt_strindex_clear(newt_strindex *x) {
  for (size_t s = 0; s < x->cap; s++) x->slot[s] = -1;
  x->count = 0;
}

void newt_strindex_free(newt_strindex *x) {
  free(x->slot);
  free(x->hash);
  x->slot = NULL, x->hash = NULL, x->cap = 0, x->count = 0;
}
