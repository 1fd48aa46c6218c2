/* A private, single-member etcd: the tests, the benchmarks, the demo and `newt run` (when
 * no --etcd is given) start one on free loopback ports with its own data directory.
 *
 * The server is the real `etcd` binary (Debian package etcd-server; $NEWT_ETCD_BIN
 * overrides the path) run as a child process that dies with us. Its log goes to
 * <dir>/etcd.log; start and restart wait (with a deadline) until the log says it serves
 * clients, so a call made right after never races its startup. It is tuned to start in
 * well under a second (short election timeout: a single member elects itself at once).
 *
 * Faults for tests: kill (SIGKILL), pause/resume (SIGSTOP/SIGCONT), stop (SIGTERM) and
 * restart on the same ports and data directory. TLS (server certificate, optionally
 * client-certificate auth) and auth (user root with a password) are options. */
#ifndef NEWT_RENDEZVOUS_ETCD_SERVER_H
#define NEWT_RENDEZVOUS_ETCD_SERVER_H

#include <stdint.h>
#include <sys/types.h>

#include "common/clock.h"
#include "common/err.h"
#include "rendezvous/etcd.h"

typedef struct rdzv_etcd_server rdzv_etcd_server;

typedef struct rdzv_etcd_server_opts {
  const char *dir;            /* its directory (data + log); NULL: a new one under $TMPDIR or
                                 /tmp, removed by rdzv_etcd_server_free */
  const char *binary;         /* NULL: $NEWT_ETCD_BIN, else "etcd" on PATH */
  const char *tls_cert;       /* serve https with this certificate and key */
  const char *tls_key;
  const char *tls_ca;         /* the CA of the server certificate, also the one client
                                 certificates must be signed by with client_cert_auth */
  int client_cert_auth;       /* mTLS: refuse clients without a certificate from tls_ca */
  const char *client_cert;    /* the certificate our own admin client shows (mTLS) */
  const char *client_key;
  const char *root_password;  /* non-NULL: enable auth, user "root" with this password */
  int64_t progress_notify_ms; /* watch progress notifications every this often; 0: etcd's 10 min */
  int64_t auth_token_ttl_s;   /* simple-token lifetime; 0: etcd's 300 s */
  int64_t start_timeout_ms;   /* 0: 30000 */
} rdzv_etcd_server_opts;

/* Starts it and waits until it serves. NEWT_ERR_NOTFOUND names the etcd-server package
 * when the binary is missing; a failed start quotes the end of its log. */
newt_result_t rdzv_etcd_server_start(const rdzv_etcd_server_opts *o, rdzv_etcd_server **out);
/* Stops it (SIGTERM, then SIGKILL), removes its directory when we made it, frees. */
void rdzv_etcd_server_free(rdzv_etcd_server *s);

const char *rdzv_etcd_server_url(const rdzv_etcd_server *s); /* "http://127.0.0.1:PORT" */
const char *rdzv_etcd_server_dir(const rdzv_etcd_server *s);
pid_t rdzv_etcd_server_pid(const rdzv_etcd_server *s);       /* 0 while not running */
/* Client options that reach it (endpoints, CA, client cert, root and its password). The
 * strings point into s. */
void rdzv_etcd_server_client_opts(const rdzv_etcd_server *s, rdzv_etcd_opts *o);

/* SIGTERM, wait up to grace_ms, then SIGKILL; the data stays. */
newt_result_t rdzv_etcd_server_stop(rdzv_etcd_server *s, int64_t grace_ms);
/* kill -9 and reap. */
newt_result_t rdzv_etcd_server_kill(rdzv_etcd_server *s);
newt_result_t rdzv_etcd_server_pause(rdzv_etcd_server *s);  /* SIGSTOP */
newt_result_t rdzv_etcd_server_resume(rdzv_etcd_server *s); /* SIGCONT */
/* Starts it again on the same ports and data (stopping it first if it runs) and waits
 * until it serves, by the deadline. */
newt_result_t rdzv_etcd_server_restart(rdzv_etcd_server *s, newt_deadline_t d);

#endif
