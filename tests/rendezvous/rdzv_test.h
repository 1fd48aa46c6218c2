/* Helpers shared by the rendezvous tests: a private etcd per test binary (real etcd on
 * free loopback ports, its own data directory), clients for it, test certificates made
 * with the openssl command, and a TCP proxy whose connections the tests cut for real. */
#ifndef NEWT_TESTS_RDZV_TEST_H
#define NEWT_TESTS_RDZV_TEST_H

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/proc.h"
#include "rendezvous/etcd.h"
#include "rendezvous/etcd_server.h"
#include "proxy.h"
#include "test.h"

/* Starts etcd or ends the test binary (nothing else can run without it). */
static inline rdzv_etcd_server *tu_server(const rdzv_etcd_server_opts *o) {
  rdzv_etcd_server *s;
  newt_result_t r = rdzv_etcd_server_start(o, &s);
  if (r != NEWT_OK) {
    fprintf(stderr, "FATAL: cannot start etcd: %s\n", newt_errmsg());
    exit(1);
  }
  return s;
}

static inline rdzv_etcd *tu_client_opts(const rdzv_etcd_opts *o) {
  rdzv_etcd *c;
  if (rdzv_etcd_init(o, &c) != NEWT_OK) {
    fprintf(stderr, "FATAL: etcd client: %s\n", newt_errmsg());
    exit(1);
  }
  return c;
}

static inline rdzv_etcd *tu_client(rdzv_etcd_server *s) {
  rdzv_etcd_opts o;
  rdzv_etcd_server_client_opts(s, &o);
  return tu_client_opts(&o);
}

/* A fresh directory under $TMPDIR (or /tmp), removed by the caller. */
static inline void tu_tmpdir(char *out, size_t cap, const char *tag) {
  const char *tmp = getenv("TMPDIR");
  snprintf(out, cap, "%s/newt-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", tag);
  if (!mkdtemp(out)) {
    perror("mkdtemp");
    exit(1);
  }
}

/* Makes CA(s), a server certificate for 127.0.0.1 and a client certificate in dir with
 * tests/rendezvous/gen_certs.sh. */
static inline int tu_gen_certs(const char *dir) {
  const char *src = getenv("NEWT_SOURCE_DIR");
  char script[1024];
  snprintf(script, sizeof script, "%s/tests/rendezvous/gen_certs.sh", src ? src : ".");
  const char *argv[] = {"sh", script, dir, NULL};
  char log[600];
  snprintf(log, sizeof log, "%s/gen_certs.log", dir);
  newt_spawn_opts so = {.log_path = log};
  pid_t pid;
  int st = 0;
  if (newt_proc_spawn(argv, &so, &pid) != NEWT_OK || newt_proc_wait(pid, 60000, &st) != NEWT_OK ||
      !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "gen_certs.sh failed (see %s)\n", log);
    return -1;
  }
  return 0;
}

#endif
