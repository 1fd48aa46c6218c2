/* Group commit of etcd transactions: the transactions that callers post to one batch at about
 * the same time go to etcd as one transaction, one raft proposal instead of one each
 * (docs/rendezvous.md, "What a rendezvous costs in etcd writes").
 *
 * A host's node agent (cli/agent.h) keeps one local batch on its etcd client and serves it to
 * its workers at a unix socket (gateway.h): their registrations and the updates that
 * acknowledge a generation, each a small transaction guarded on its own key, then cost the
 * host one or two proposals rather than one per worker. `newt bench rendezvous` gives each
 * simulated host a local batch.
 *
 * Meaning: rdzv_batch_txn means exactly what rdzv_etcd_txn means for its caller. Transactions
 * are merged only when no key one of them compares or touches is another's, so the merged
 * compares hold exactly when each one's would have held alone, in any order; the merged
 * transaction runs the success ops of all of them (never their failure ops). When it
 * succeeds, each caller gets `succeeded`, the revision and the results of its own ops. When it
 * does not (a compare failed), or etcd refuses it for a reason one of them may carry alone
 * (a lease not found, too many ops, a request too large), each transaction is sent again on
 * its own, so each caller gets what etcd says of its own. A transient failure (etcd away, no
 * answer in time: it may or may not have been applied) is every caller's, as it would have
 * been alone.
 *
 * When: the first caller to find no merged transaction in flight sends: it waits up to
 * linger_ms for `expect` transactions to be queued (a host's workers register within a few
 * milliseconds of each other), then sends what is queued (at most max_ops ops and max_bytes
 * of keys and values). Callers that come while a transaction is in flight queue, and the
 * next sender takes them all. Nothing else waits: with linger_ms 0 a lone caller goes at
 * once.
 *
 * Threads: any number of threads may post at once. */
#ifndef NEWT_RENDEZVOUS_BATCH_H
#define NEWT_RENDEZVOUS_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "rendezvous/etcd.h"

typedef struct rdzv_batch rdzv_batch;

typedef struct rdzv_batch_opts {
  int expect;        /* transactions worth waiting for (a host's workers); 0: 1 */
  int64_t linger_ms; /* how long the first waits for them (0: never) */
  int max_ops;       /* ops (success ops and compares) in one merged transaction; 0: 120
                        (etcd's --max-txn-ops is 128 by default) */
  size_t max_bytes;  /* bytes of keys and values in one; 0: 512 KiB */
} rdzv_batch_opts;

#define RDZV_BATCH_MAX_OPS 120
#define RDZV_BATCH_MAX_BYTES (512u * 1024u)

/* A batch sending through c (which it does not own). o may be NULL (defaults). */
newt_result_t rdzv_batch_new(rdzv_etcd *c, const rdzv_batch_opts *o, rdzv_batch **out);
/* Callers must have returned. */
void rdzv_batch_free(rdzv_batch *b);

/* rdzv_etcd_txn through the batch (see above). out may be NULL (as for rdzv_etcd_txn). */
newt_result_t rdzv_batch_txn(rdzv_batch *b, const rdzv_etcd_cmp *cmps, size_t ncmp, const rdzv_etcd_op *success,
                             size_t nsuccess, const rdzv_etcd_op *failure, size_t nfailure, newt_deadline_t d,
                             rdzv_etcd_txn_result *out);

/* Transactions posted, and the requests they cost (merged ones and those sent again alone). */
void rdzv_batch_counts(rdzv_batch *b, int64_t *posted, int64_t *sent);

#endif
