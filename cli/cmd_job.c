/* `newt job rm --job NAME`: removes a job's records from etcd (every key under
 * /newt/NAME/), so that its name can be used again. A live job (a worker registered, a
 * coordinator leading) is refused unless --force; the removal asks first on a terminal, and
 * without one needs --yes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cmds.h"
#include "cli/etcd_flags.h"
#include "common/opts.h"
#include "common/strutil.h"
#include "job/records.h"
#include "rendezvous/rdzv.h"

/* The keys of the job, and how many of them say it is live: registrations and candidacies
 * on a lease (a process keeps it alive; a key without one is no process's). */
static newt_result_t count_keys(rdzv_etcd *c, const char *job, int64_t *all, int64_t *live) {
  char prefix[256], sub[256];
  NEWT_CHECK(newt_job_path(prefix, sizeof prefix, job, ""));
  rdzv_etcd_kvs n;
  NEWT_CHECK(rdzv_etcd_range(c, prefix, &(rdzv_etcd_range_opts){.prefix = 1, .count_only = 1},
                             newt_deadline_in_ms(5000), &n));
  *all = n.count;
  rdzv_etcd_kvs_free(&n);
  *live = 0;
  const job_record alive[] = {JOB_REC_WORKER, JOB_REC_ELECTION};
  for (size_t i = 0; i < sizeof alive / sizeof alive[0]; i++) {
    NEWT_CHECK(job_prefix(sub, sizeof sub, job, alive[i], -1));
    NEWT_CHECK(rdzv_etcd_range(c, sub, &(rdzv_etcd_range_opts){.prefix = 1, .keys_only = 1},
                               newt_deadline_in_ms(5000), &n));
    for (size_t k = 0; k < n.n; k++) *live += n.kvs[k].lease != 0;
    rdzv_etcd_kvs_free(&n);
  }
  return NEWT_OK;
}

static int job_rm(rdzv_etcd *c, const char *job, int yes, int force) {
  int64_t all = 0, live = 0;
  if (count_keys(c, job, &all, &live) != NEWT_OK) {
    fprintf(stderr, "newt job rm: %s\n", newt_errmsg());
    return 1;
  }
  if (all == 0) {
    fprintf(stderr, "newt job rm: no job \"%s\" in etcd at %s\n", job, rdzv_etcd_endpoints(c));
    return 1;
  }
  if (live && !force) {
    fprintf(stderr, "newt job rm: job %s is live (%lld registered workers or coordinators): stop it first, or give "
                    "--force to remove it under them\n", job, (long long)live);
    return 1;
  }
  if (!yes) {
    if (!isatty(STDIN_FILENO)) {
      fprintf(stderr, "newt job rm: remove the %lld keys of job %s? Give --yes to remove them without a terminal to "
                      "ask on\n", (long long)all, job);
      return 2;
    }
    fprintf(stderr, "remove the %lld keys of job %s from %s? [y/N] ", (long long)all, job, rdzv_etcd_endpoints(c));
    char answer[16] = "";
    if (!fgets(answer, sizeof answer, stdin) || (answer[0] != 'y' && answer[0] != 'Y')) {
      fprintf(stderr, "newt job rm: nothing removed\n");
      return 1;
    }
  }
  char prefix[256];
  int64_t deleted = 0;
  if (newt_job_path(prefix, sizeof prefix, job, "") != NEWT_OK ||
      rdzv_etcd_delete(c, prefix, 1, newt_deadline_in_ms(10000), &deleted, NULL) != NEWT_OK) {
    fprintf(stderr, "newt job rm: %s\n", newt_errmsg());
    return 1;
  }
  printf("newt job rm: removed job %s (%lld keys); its name can be used again\n", job, (long long)deleted);
  return 0;
}

int newt_cmd_job(int argc, char **argv) {
  static const char *synopsis = "rm --job NAME [--yes] [--force] [etcd flags]";
  cli_etcd_flags ef;
  cli_etcd_flags_init(&ef);
  int yes = 0, force = 0;
  newt_opt opts[] = {CLI_ETCD_OPTS(&ef),
                     {"yes", NEWT_OPT_FLAG, &yes, "remove without asking"},
                     {"force", NEWT_OPT_FLAG, &force, "remove a live job's records too (its processes then fail)"},
                     NEWT_OPT_END};
  char *pos[1];
  int npos = 0;
  int ex = newt_opts_exit(newt_opts_parse("job", synopsis, opts, argc, argv, pos, 1, &npos));
  if (ex >= 0) return ex;
  if (npos != 1 || strcmp(pos[0], "rm") != 0) {
    fprintf(stderr, "newt job: %s (the one command: rm)\n", npos ? "unknown command" : "which command?");
    newt_opts_usage(stderr, "job", synopsis, opts);
    return 2;
  }
  rdzv_etcd_opts eo;
  char *password = NULL;
  rdzv_etcd *c = NULL;
  if (cli_etcd_opts(&ef, &eo, &password) != NEWT_OK) {
    fprintf(stderr, "newt job rm: %s\n", newt_errmsg());
    return 2;
  }
  if (rdzv_etcd_init(&eo, &c) != NEWT_OK) {
    fprintf(stderr, "newt job rm: %s\n", newt_errmsg());
    free(password);
    return 1;
  }
  int rc = job_rm(c, ef.job, yes, force);
  rdzv_etcd_free(c);
  free(password);
  return rc;
}
