/* A private etcd: the tests, the benchmarks, the demo and `newt run` (when no --etcd is
 * given) start one on free loopback ports with its own directory, as one member (the
 * default) or as a cluster of up to RDZV_ETCD_MAX_MEMBERS.
 *
 * The server is the real `etcd` binary (Debian package etcd-server; $NEWT_ETCD_BIN
 * overrides the path), each member a child process that dies with us. One member keeps
 * its data in <dir>/data and logs to <dir>/etcd.log; member i of several uses
 * <dir>/m<i>/data and <dir>/m<i>/etcd.log, and a cluster always starts empty (its ports are
 * new, and a member's data records its peers' addresses). Start and restart wait (with a
 * deadline) until each log says the member serves clients, so a call made right after
 * never races its startup. Every member is spawned before any is waited for: a member of a
 * new cluster serves only once a quorum is up. One member is tuned to start in well under
 * a second (heartbeat 25 ms, election 250 ms: it elects itself at once); a cluster uses
 * heartbeat 50 ms, election 500 ms and pre-vote, which elect a leader within a second yet
 * stay stable on a slow, shared machine.
 *
 * History is compacted automatically (revision mode, keeping the newest 1000 revisions,
 * run by etcd every 5 minutes), so a long job does not grow the database without bound;
 * quota_bytes sets the backend quota (a put beyond it fails with NEWT_ERR_NOSPACE).
 *
 * Faults for tests and chaos, for the whole etcd (every member) or one member: kill
 * (SIGKILL), pause/resume (SIGSTOP/SIGCONT), stop (SIGTERM) and restart on the same ports
 * and data directory (a restarted member rejoins its cluster); wipe starts it again empty
 * on the same ports, as an etcd without a persistent volume comes back after a reschedule.
 * TLS (server certificate, optionally client-certificate auth) and auth (user root with a
 * password, and a user of the caller's that may read and write one prefix) are options. Errors name the member and quote the end of its log. */
#ifndef NEWT_RENDEZVOUS_ETCD_SERVER_H
#define NEWT_RENDEZVOUS_ETCD_SERVER_H

#include <stdint.h>
#include <sys/types.h>

#include "common/clock.h"
#include "common/err.h"
#include "rendezvous/etcd.h"

typedef struct rdzv_etcd_server rdzv_etcd_server;

#define RDZV_ETCD_MAX_MEMBERS 5

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
  const char *user;           /* with root_password: a user of its own too, with this password, that may read
                                 and write the keys under user_prefix only (a role of the user's name) */
  const char *user_password;
  const char *user_prefix;
  int64_t progress_notify_ms; /* watch progress notifications every this often; 0: etcd's 10 min */
  int64_t auth_token_ttl_s;   /* simple-token lifetime; 0: etcd's 300 s */
  int64_t start_timeout_ms;   /* 0: 30000 */
  int members;                /* 1..RDZV_ETCD_MAX_MEMBERS; 0: 1 */
  int64_t quota_bytes;        /* --quota-backend-bytes; 0: etcd's default (2 GiB) */
  const char *client_host;    /* the IPv4 address clients reach it at (NULL: 127.0.0.1); peers
                                 stay on loopback */
} rdzv_etcd_server_opts;

/* Starts it and waits until every member serves. NEWT_ERR_NOTFOUND names the etcd-server package
 * when the binary is missing; a failed start quotes the end of its log. */
newt_result_t rdzv_etcd_server_start(const rdzv_etcd_server_opts *o, rdzv_etcd_server **out);
/* Stops it (SIGTERM, then SIGKILL), removes its directory when we made it, frees. */
void rdzv_etcd_server_free(rdzv_etcd_server *s);

/* Every member's client URL, comma-separated in member order: "http://127.0.0.1:PORT,..." */
const char *rdzv_etcd_server_url(const rdzv_etcd_server *s);
const char *rdzv_etcd_server_dir(const rdzv_etcd_server *s);
pid_t rdzv_etcd_server_pid(const rdzv_etcd_server *s);       /* member 0's; 0 while not running */
int rdzv_etcd_server_members(const rdzv_etcd_server *s);
/* Member i's client URL and pid (0 while not running); i outside 0..members-1: NULL, 0. */
const char *rdzv_etcd_server_member_url(const rdzv_etcd_server *s, int i);
pid_t rdzv_etcd_server_member_pid(const rdzv_etcd_server *s, int i);
/* Client options that reach it (endpoints, CA, client cert, root and its password). The
 * strings point into s. */
/* ... as the user of its own (opts.user), when there is one; else as root. */
void rdzv_etcd_server_user_opts(const rdzv_etcd_server *s, rdzv_etcd_opts *o);
void rdzv_etcd_server_client_opts(const rdzv_etcd_server *s, rdzv_etcd_opts *o);

/* The whole etcd: each call acts on every member. */
/* SIGTERM to every member, wait up to grace_ms, then SIGKILL; the data stays. */
newt_result_t rdzv_etcd_server_stop(rdzv_etcd_server *s, int64_t grace_ms);
/* kill -9 and reap every running member; NEWT_ERR_INVALID when none runs. */
newt_result_t rdzv_etcd_server_kill(rdzv_etcd_server *s);
newt_result_t rdzv_etcd_server_pause(rdzv_etcd_server *s);  /* SIGSTOP every running member */
newt_result_t rdzv_etcd_server_resume(rdzv_etcd_server *s); /* SIGCONT every running member */
/* Starts every member again on the same ports and data (stopping those that run) and
 * waits until all serve, by the deadline. */
newt_result_t rdzv_etcd_server_restart(rdzv_etcd_server *s, newt_deadline_t d);
/* Stops every member, deletes every data directory and starts a fresh, empty etcd on the
 * same ports (auth enabled again when the options ask for it), by the deadline. */
newt_result_t rdzv_etcd_server_wipe(rdzv_etcd_server *s, newt_deadline_t d);

/* The member that leads now (asking each running member's status), by the deadline;
 * NEWT_ERR_UNAVAILABLE when none does (no quorum, an election in progress). */
newt_result_t rdzv_etcd_server_leader(rdzv_etcd_server *s, newt_deadline_t d, int *leader);

/* One member i (0..members-1; NEWT_ERR_INVALID otherwise, naming the count). */
newt_result_t rdzv_etcd_server_member_kill(rdzv_etcd_server *s, int i);   /* kill -9 and reap */
newt_result_t rdzv_etcd_server_member_pause(rdzv_etcd_server *s, int i);  /* SIGSTOP */
newt_result_t rdzv_etcd_server_member_resume(rdzv_etcd_server *s, int i); /* SIGCONT */
/* Starts member i again on its ports and data (stopping it first if it runs) and waits
 * until it serves, by the deadline: it rejoins its cluster (which needs a quorum up). */
newt_result_t rdzv_etcd_server_member_restart(rdzv_etcd_server *s, int i, newt_deadline_t d);

#endif
