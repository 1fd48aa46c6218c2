/* The publisher's queue (publish.c): the newest value of each etcd key a worker writes
 * through its publisher thread, at most WORKER_PUB_SLOTS keys. A value is taken out to be
 * written; one whose write failed goes back only if no newer value of its key came while it
 * was in flight, so a key is never written with an older value after a newer one (a
 * progress record must not go back to an older step after the end marker's). No lock: the
 * caller holds the worker's mutex. */
#ifndef NEWT_WORKER_PUBQ_H
#define NEWT_WORKER_PUBQ_H

#define WORKER_PUB_SLOTS 8

typedef struct worker_pubq {
  struct {
    char key[256];
    char *value;  /* NULL: free slot */
    int on_lease; /* written on the registration's lease (the one it has when written) */
  } slot[WORKER_PUB_SLOTS];
} worker_pubq;

/* A value taken out to be written: the key, the value (the taker's until given back), and
 * whether it goes on the lease. */
typedef struct worker_pub_item {
  char key[256];
  char *value;
  int on_lease;
} worker_pub_item;

/* Queues value for key (the queue owns it), on the lease or not: the newest value of a key
 * replaces an older one still queued. 0, or -1 when every slot holds another key (value
 * freed). */
int worker_pubq_put(worker_pubq *q, const char *key, char *value, int on_lease);

/* Takes the first queued value out (1), or 0 when none is queued. */
int worker_pubq_take(worker_pubq *q, worker_pub_item *it);

/* Gives back a value whose write failed, to be tried again: kept (1) unless a newer value of
 * its key was queued meanwhile (0) or every slot holds another key (-1); the item's value is
 * freed when it is not kept. */
int worker_pubq_retry(worker_pubq *q, worker_pub_item *it);

/* Whether anything is queued. */
int worker_pubq_pending(const worker_pubq *q);

/* Frees whatever is still queued. */
void worker_pubq_free(worker_pubq *q);

#endif
