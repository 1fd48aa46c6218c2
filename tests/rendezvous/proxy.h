/* A TCP proxy for fault injection in the rendezvous tests (proxy.c). */
#ifndef NEWT_TESTS_RDZV_PROXY_H
#define NEWT_TESTS_RDZV_PROXY_H

typedef struct tu_proxy tu_proxy;
/* Listens on a free loopback port and forwards to 127.0.0.1:target_port. */
tu_proxy *tu_proxy_start(int target_port);
int tu_proxy_port(const tu_proxy *p);
/* Closes every open connection and refuses new ones (accepts and closes at once); returns once
 * every connection is closed. */
void tu_proxy_cut(tu_proxy *p);
/* Forwards new connections again. */
void tu_proxy_restore(tu_proxy *p);
void tu_proxy_free(tu_proxy *p);

#endif
