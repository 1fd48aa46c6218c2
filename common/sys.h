/* Small system services: secure random bytes (per-generation secrets), a free loopback
 * port (tests and the single-host launcher start etcd and listeners on one), signal
 * handling for graceful leave (SIGTERM/SIGINT set a flag the step loop reads), and the
 * host name. */
#ifndef NEWT_COMMON_SYS_H
#define NEWT_COMMON_SYS_H

#include <stddef.h>

#include "err.h"

newt_result_t newt_random_bytes(void *buf, size_t n);
/* A random hex string of 2n characters into out (2n+1 bytes). */
newt_result_t newt_random_hex(char *out, size_t n);

/* A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read, close). */
newt_result_t newt_net_free_port(int *port);

/* Installs handlers: SIGTERM and SIGINT set the stop flag (a second SIGINT exits);
 * SIGPIPE is ignored. */
void newt_signals_install(void);
/* The signal that asked us to stop (SIGTERM/SIGINT), or 0. */
int newt_stop_requested(void);
/* Sets the flag as if the signal had arrived (tests). */
void newt_stop_request(int sig);

/* gethostname(), or "localhost". */
const char *newt_hostname(void);

#endif
