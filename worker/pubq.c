/* The publisher's queue: pubq.h. */
#include "worker/pubq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The slot queued with key, else a free one (-1: none). */
static int slot_for(const worker_pubq *q, const char *key) {
  int free_slot = -1;
  for (int i = 0; i < WORKER_PUB_SLOTS; i++) {
    if (q->slot[i].value && strcmp(q->slot[i].key, key) == 0) return i;
    if (!q->slot[i].value && free_slot < 0) free_slot = i;
  }
  return free_slot;
}

int worker_pubq_put(worker_pubq *q, const char *key, char *value, int on_lease) {
  int s = slot_for(q, key);
  if (s < 0) {
    free(value);
    return -1;
  }
  free(q->slot[s].value);
  snprintf(q->slot[s].key, sizeof q->slot[s].key, "%s", key);
  q->slot[s].value = value;
  q->slot[s].on_lease = on_lease;
  return 0;
}

int worker_pubq_take(worker_pubq *q, worker_pub_item *it) {
  for (int i = 0; i < WORKER_PUB_SLOTS; i++) {
    if (!q->slot[i].value) continue;
    snprintf(it->key, sizeof it->key, "%s", q->slot[i].key);
    it->value = q->slot[i].value;
    it->on_lease = q->slot[i].on_lease;
    q->slot[i].value = NULL;
    return 1;
  }
  return 0;
}

int worker_pubq_retry(worker_pubq *q, worker_pub_item *it) {
  int s = slot_for(q, it->key);
  if (s < 0 || q->slot[s].value) { /* a newer value is queued (or no room): drop this one */
    free(it->value);
    it->value = NULL;
    return s < 0 ? -1 : 0;
  }
  snprintf(q->slot[s].key, sizeof q->slot[s].key, "%s", it->key);
  q->slot[s].value = it->value;
  q->slot[s].on_lease = it->on_lease;
  it->value = NULL;
  return 1;
}

int worker_pubq_pending(const worker_pubq *q) {
  for (int i = 0; i < WORKER_PUB_SLOTS; i++)
    if (q->slot[i].value) return 1;
  return 0;
}

void worker_pubq_free(worker_pubq *q) {
  for (int i = 0; i < WORKER_PUB_SLOTS; i++) {
    free(q->slot[i].value);
    q->slot[i].value = NULL;
  }
}
