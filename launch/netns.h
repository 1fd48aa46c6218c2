/* Simulated hosts in network namespaces, for `newt run --netns` (root): each host is a
 * namespace with one veth on a bridge of the run's own, so its workers talk TCP between
 * their own addresses, and faults of the network are made for real, with routes, on one
 * machine (chaos cut:..., cut-etcd:...). The bridge carries 10.A.B.1/24, outside every
 * namespace: the private etcd and the coordinators listen there; host i is 10.A.B.(10+i).
 * Everything made is removed by netns_free (and by the kernel, for the namespaces, once
 * their last process is gone and they are deleted). */
#ifndef NEWT_LAUNCH_NETNS_H
#define NEWT_LAUNCH_NETNS_H

#include "common/err.h"

#define NETNS_HOSTS_MAX 240

typedef struct netns_net netns_net;

/* Makes the bridge. NEWT_ERR_UNSUPPORTED (naming what is missing) without root or `ip`. */
newt_result_t netns_start(netns_net **out);
/* "10.A.B.1": where etcd and the coordinators listen. */
const char *netns_gateway(const netns_net *n);
/* Host i (0..NETNS_HOSTS_MAX-1): its namespace, made on first use; *ns its name (for `ip
 * netns exec`) and *addr its address, valid until netns_free. */
newt_result_t netns_host(netns_net *n, int host, const char **ns, const char **addr);

typedef enum netns_link {
  NETNS_PEERS, /* every other host: the data plane (etcd and the coordinators still reach it) */
  NETNS_ETCD,  /* the bridge's address: etcd and the coordinators (the data plane still works) */
} netns_link;

/* Cuts (on 1) or mends (on 0) host i's routes to `what` (blackhole routes in its namespace:
 * its packets there are dropped, so no TCP connection either way gets through). */
newt_result_t netns_cut(netns_net *n, int host, netns_link what, int on);
/* Slows host i's link (kbit > 0) or gives it back its speed (0): both directions of its veth
 * shaped to kbit/s (tc htb) with a short queue (pfifo of 16 packets), so a burst beyond it is
 * dropped -- a slow and lossy link, which TCP's retransmissions make slower still. */
newt_result_t netns_slow(netns_net *n, int host, int64_t kbit);
/* Removes every namespace, veth and the bridge. NULL: nothing. */
void netns_free(netns_net *n);

#endif
