/* A host's transaction gateway: a node agent (cli/agent.h) serves its local batch (batch.h)
 * at a unix socket in its private directory, and its workers send their registration's
 * transactions there instead of to etcd, so that a host's workers cost etcd one proposal
 * where they cost one each.
 *
 * The server: one thread accepts, a thread per connection reads requests (a transaction:
 * compares, success and failure ops, and the caller's time left), runs each through
 * rdzv_batch_txn on the agent's client and answers with the result (succeeded, revision, the
 * ops' results) or the error (its code and message), so the caller gets what rdzv_etcd_txn
 * would have returned. The socket is created with mode 0600 (only the agent's user); the
 * gateway writes nothing but what its workers ask, with the agent's etcd credentials, which
 * are the job's, as theirs are.
 *
 * The client: rdzv_gateway_txn sends one transaction and waits for its answer. When the
 * gateway cannot be reached (no socket, nobody listening: the agent is gone or restarting),
 * it returns NEWT_ERR_UNAVAILABLE with *unreached = 1 at once, without retrying, and the
 * transaction was not sent: the caller sends it to etcd itself. A gateway that took the
 * request and then failed (its connection closed before the answer) is NEWT_ERR_UNAVAILABLE
 * with *unreached = 0: the transaction may or may not have been applied, as for a write to
 * etcd whose answer was lost. */
#ifndef NEWT_RENDEZVOUS_GATEWAY_H
#define NEWT_RENDEZVOUS_GATEWAY_H

#include "rendezvous/batch.h"
#include "rendezvous/etcd.h"

typedef struct rdzv_gateway rdzv_gateway;

/* Serves b at a unix socket at path (an old socket there is replaced). b outlives the gateway. */
newt_result_t rdzv_gateway_start(rdzv_batch *b, const char *path, rdzv_gateway **out);
/* Stops accepting, closes every connection, waits for the threads and removes the socket. */
void rdzv_gateway_stop(rdzv_gateway *g);

typedef struct rdzv_gateway_client rdzv_gateway_client;

/* A client of the gateway at path (connects on first use, and again after a failure). */
newt_result_t rdzv_gateway_client_new(const char *path, rdzv_gateway_client **out);
void rdzv_gateway_client_free(rdzv_gateway_client *g);

/* rdzv_etcd_txn through the gateway (see above for *unreached). Any thread; calls on one
 * client are serialised. */
newt_result_t rdzv_gateway_txn(rdzv_gateway_client *g, const rdzv_etcd_cmp *cmps, size_t ncmp,
                               const rdzv_etcd_op *success, size_t nsuccess, const rdzv_etcd_op *failure,
                               size_t nfailure, newt_deadline_t d, rdzv_etcd_txn_result *out, int *unreached);

/* --- one watch per host ------------------------------------------------------------------- */

/* Lets the gateway's clients watch key through one etcd watch of the host's, on c (which
 * outlives the gateway): the first subscription reads the key and starts the watch (a
 * subscription that finds etcd unreachable is refused, and the next one tries again); every
 * subscriber is then sent the key's newest value at once, and again each time it changes (a
 * put, or the value a resync found): newest-wins, so a subscriber that was slow to read gets
 * the newest value, not every one between. Deletes are not sent. Any other key is refused. */
newt_result_t rdzv_gateway_share(rdzv_gateway *g, rdzv_etcd *c, const char *key);
/* Subscriptions taken, and etcd watches started, so far (a host's workers: one watch). */
void rdzv_gateway_share_counts(rdzv_gateway *g, int64_t *subscriptions, int64_t *watches);

typedef struct rdzv_gateway_watch rdzv_gateway_watch;

/* Called on the subscription's own thread with each value sent (key, value, mod_revision,
 * create_revision, version and lease as etcd has them); once with kv NULL when the
 * subscription ends other than by rdzv_gateway_watch_free (the gateway went, or sent what
 * it must not): the caller watches etcd itself from then on. */
typedef void (*rdzv_gateway_watch_fn)(void *ud, const rdzv_etcd_kv *kv);

/* Subscribes to key at the gateway at path; returns once the gateway took the subscription
 * (the key's value, if any, may come before this returns): NEWT_ERR_UNAVAILABLE when the
 * gateway cannot be reached, or the error it answered (the key not shared: NEWT_ERR_NOTFOUND;
 * etcd unreachable from the gateway). */
newt_result_t rdzv_gateway_watch_start(const char *path, const char *key, rdzv_gateway_watch_fn fn, void *ud,
                                       newt_deadline_t d, rdzv_gateway_watch **out);
/* Ends the subscription and joins its thread (not from the callback). NULL: nothing. */
void rdzv_gateway_watch_free(rdzv_gateway_watch *w);

#endif
