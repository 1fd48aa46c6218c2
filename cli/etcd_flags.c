/* Environment defaults of the etcd connection flags (see etcd_flags.h). */
#include "cli/etcd_flags.h"

#include <stdlib.h>

static const char *env_or(const char *name, const char *deflt) {
  const char *v = getenv(name);
  return v && *v ? v : deflt;
}

void cli_etcd_flags_init(cli_etcd_flags *f) {
  f->endpoints = env_or("NEWT_ETCD", "http://127.0.0.1:2379");
  f->user = env_or("NEWT_ETCD_USER", NULL);
  f->password_file = env_or("NEWT_ETCD_PASSWORD_FILE", NULL);
  f->ca = env_or("NEWT_ETCD_CA", NULL);
  f->cert = env_or("NEWT_ETCD_CERT", NULL);
  f->key = env_or("NEWT_ETCD_KEY", NULL);
  f->job = env_or("NEWT_JOB", NULL);
}
