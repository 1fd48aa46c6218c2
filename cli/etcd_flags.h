/* The flags every subcommand that talks to etcd takes (coordinator, worker, status, run),
 * with environment fallbacks for Kubernetes (flags win):
 *
 *   --etcd URLS            NEWT_ETCD            comma-separated endpoints (http:// or https://)
 *   --etcd-user NAME       NEWT_ETCD_USER
 *   --etcd-password-file F NEWT_ETCD_PASSWORD_FILE   (a file, so it can come from a Secret)
 *   --etcd-ca FILE         NEWT_ETCD_CA         CA bundle to verify the server
 *   --etcd-cert FILE       NEWT_ETCD_CERT       client certificate (mTLS)
 *   --etcd-key FILE        NEWT_ETCD_KEY        client key (mTLS)
 *   --job NAME             NEWT_JOB */
#ifndef NEWT_CLI_ETCD_FLAGS_H
#define NEWT_CLI_ETCD_FLAGS_H

#include "common/opts.h"
#include "rendezvous/etcd.h"

typedef struct cli_etcd_flags {
  const char *endpoints;
  const char *user;
  const char *password_file;
  const char *ca;
  const char *cert;
  const char *key;
  const char *job;
} cli_etcd_flags;

/* Fills defaults from the environment (endpoints: cli_etcd_default when NEWT_ETCD is not set). */
extern const char cli_etcd_default[];
void cli_etcd_flags_init(cli_etcd_flags *f);
/* Whether the endpoints were given (--etcd or NEWT_ETCD), not the default. */
int cli_etcd_given(const cli_etcd_flags *f);

/* The client options the flags ask for; the password is read from its file into a
 * malloc'd string (*password, freed by the caller; trailing newline dropped). Checks
 * that --job is given and valid. */
newt_result_t cli_etcd_opts(const cli_etcd_flags *f, rdzv_etcd_opts *o, char **password);

/* The entries for these flags, to splice into a subcommand's table (7 entries). */
#define CLI_ETCD_OPTS(f)                                                                          \
  {"etcd", NEWT_OPT_STR, &(f)->endpoints, "etcd endpoints, comma-separated (env NEWT_ETCD)"},      \
      {"etcd-user", NEWT_OPT_STR, &(f)->user, "etcd user (env NEWT_ETCD_USER)"},                    \
      {"etcd-password-file", NEWT_OPT_STR, &(f)->password_file,                                     \
       "file holding the etcd password (env NEWT_ETCD_PASSWORD_FILE)"},                             \
      {"etcd-ca", NEWT_OPT_STR, &(f)->ca, "CA bundle for etcd's TLS (env NEWT_ETCD_CA)"},           \
      {"etcd-cert", NEWT_OPT_STR, &(f)->cert, "client certificate for etcd mTLS (env NEWT_ETCD_CERT)"}, \
      {"etcd-key", NEWT_OPT_STR, &(f)->key, "client key for etcd mTLS (env NEWT_ETCD_KEY)"},        \
      {"job", NEWT_OPT_STR, &(f)->job, "job name (env NEWT_JOB)"}

#endif
