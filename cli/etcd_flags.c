/* Environment defaults of the etcd connection flags (see etcd_flags.h). */
#include "cli/etcd_flags.h"

#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "rendezvous/rdzv.h"

static const char *env_or(const char *name, const char *deflt) {
  const char *v = getenv(name);
  return v && *v ? v : deflt;
}

const char cli_etcd_default[] = "http://127.0.0.1:2379";

void cli_etcd_flags_init(cli_etcd_flags *f) {
  f->endpoints = env_or("NEWT_ETCD", cli_etcd_default);
  f->user = env_or("NEWT_ETCD_USER", NULL);
  f->password_file = env_or("NEWT_ETCD_PASSWORD_FILE", NULL);
  f->ca = env_or("NEWT_ETCD_CA", NULL);
  f->cert = env_or("NEWT_ETCD_CERT", NULL);
  f->key = env_or("NEWT_ETCD_KEY", NULL);
  f->job = env_or("NEWT_JOB", NULL);
}

newt_result_t cli_etcd_opts(const cli_etcd_flags *f, rdzv_etcd_opts *o, char **password) {
  memset(o, 0, sizeof *o);
  *password = NULL;
  if (!f->job || !*f->job) return NEWT_ERR(NEWT_ERR_INVALID, "--job: required (or set NEWT_JOB)");
  NEWT_CHECK(newt_check_name("--job", f->job));
  o->endpoints = f->endpoints;
  o->ca_file = f->ca;
  o->cert_file = f->cert;
  o->key_file = f->key;
  if (f->user && *f->user) {
    if (!f->password_file)
      return NEWT_ERR(NEWT_ERR_INVALID, "--etcd-user %s needs --etcd-password-file", f->user);
    size_t len = 0;
    NEWT_CHECK(newt_fs_read_all(f->password_file, 4096, password, &len));
    while (len > 0 && ((*password)[len - 1] == '\n' || (*password)[len - 1] == '\r')) (*password)[--len] = '\0';
    o->user = f->user;
    o->password = *password;
  }
  return NEWT_OK;
}

int cli_etcd_given(const cli_etcd_flags *f) { return f->endpoints != cli_etcd_default; }
