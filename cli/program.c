/* The environment of a worker's program and its exec (see program.h). */
#include "cli/program.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/ending.h"
#include "common/sys.h"

static newt_result_t put(const char *name, const char *value) {
  if (setenv(name, value, 1) != 0) return NEWT_ERR(NEWT_ERR_SYS, "setting %s: %s", name, strerror(errno));
  return NEWT_OK;
}

/* Only a value that is given: an absent one leaves the environment as it is. */
static newt_result_t put_given(const char *name, const char *value) {
  return value && *value ? put(name, value) : NEWT_OK;
}

static newt_result_t put_int(const char *name, int64_t value) {
  char v[32];
  snprintf(v, sizeof v, "%lld", (long long)value);
  return put(name, v);
}

/* An inherited value stays; without one, deflt. */
static newt_result_t keep_or(const char *name, const char *deflt) {
  const char *v = getenv(name);
  return v && *v ? NEWT_OK : put(name, deflt);
}

void cli_program_id(const cli_program *p, char *out, size_t cap) {
  if (p->id && *p->id) snprintf(out, cap, "%s", p->id);
  else snprintf(out, cap, "%.40s-%d", p->host && *p->host ? p->host : newt_hostname(), (int)getpid());
}

static newt_result_t put_etcd(const cli_etcd_flags *f) {
  NEWT_CHECK(put_given("NEWT_ETCD", f->endpoints));
  NEWT_CHECK(put_given("NEWT_ETCD_USER", f->user));
  NEWT_CHECK(put_given("NEWT_ETCD_PASSWORD_FILE", f->password_file));
  NEWT_CHECK(put_given("NEWT_ETCD_CA", f->ca));
  NEWT_CHECK(put_given("NEWT_ETCD_CERT", f->cert));
  NEWT_CHECK(put_given("NEWT_ETCD_KEY", f->key));
  return put_given("NEWT_JOB", f->job);
}

/* The termination log, when there is one: one named (flag or inherited), or the default
 * where it exists (a container). */
static newt_result_t put_term_log(const char *flag) {
  const char *path = cli_termination_log(flag);
  if (strcmp(path, CLI_TERMINATION_LOG) == 0 && access(path, F_OK) != 0) return NEWT_OK;
  return put("NEWT_TERMINATION_LOG", path);
}

newt_result_t cli_program_env(const cli_program *p) {
  char id[128];
  cli_program_id(p, id, sizeof id);
  NEWT_CHECK(put_etcd(p->etcd));
  NEWT_CHECK(put("NEWT_WORKER_ID", id));
  NEWT_CHECK(put("NEWT_HOST", p->host && *p->host ? p->host : newt_hostname()));
  NEWT_CHECK(put_given("NEWT_DOMAIN", p->domain));
  NEWT_CHECK(put_given("NEWT_ADDR", p->addr));
  NEWT_CHECK(put_int("NEWT_PORT", p->port));
  NEWT_CHECK(put_int("NEWT_DEVICE", p->device));
  if (p->share_device) NEWT_CHECK(put("NEWT_SHARE_DEVICE", "1"));
  NEWT_CHECK(put_int("NEWT_THREADS", p->threads));
  /* OpenMP and OpenBLAS pools of the program (PyTorch's, NumPy's): --threads each, as
     torchrun's 1, unless the environment says otherwise -- N workers of a host each
     spawning a thread per core would take the cores from one another */
  char threads[24];
  snprintf(threads, sizeof threads, "%lld", (long long)(p->threads > 0 ? p->threads : 1));
  NEWT_CHECK(keep_or("OMP_NUM_THREADS", threads));
  NEWT_CHECK(put_given("NEWT_STEP_LOG", p->step_log));
  NEWT_CHECK(put_given("NEWT_JOB_SECRET_FILE", p->secret_file));
  NEWT_CHECK(put_int("NEWT_METRICS_PORT", p->metrics_port));
  NEWT_CHECK(put_given("NEWT_METRICS_ADDR", p->metrics_addr));
  NEWT_CHECK(put_term_log(p->term_log));
  NEWT_CHECK(keep_or("LOCAL_RANK", "0"));
  return keep_or("LOCAL_WORLD_SIZE", "1");
}

newt_result_t cli_program_exec(char *const *command, int *sig) {
  /* newt catches SIGTERM and SIGINT and ignores SIGPIPE; the program starts with the
     defaults, as from a shell. A stop signal caught before that is acted on here. */
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  const int sigs[] = {SIGTERM, SIGINT, SIGPIPE};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &dfl, NULL);
  *sig = newt_stop_requested();
  if (*sig) return NEWT_ERR(NEWT_ERR_ABORTED, "signal %d came before %s started", *sig, command[0]);
  fflush(NULL);
  execvp(command[0], command);
  int e = errno;
  int in_path = strchr(command[0], '/') == NULL && e == ENOENT;
  return NEWT_ERR(NEWT_ERR_INVALID, "cannot run the program \"%s\" (the COMMAND after --): %s%s", command[0],
                  strerror(e), in_path ? " (not found in PATH)" : "");
}

/* 0 when path is an executable file, else the errno execve would give. */
static int runnable(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) return errno;
  if (S_ISDIR(st.st_mode)) return EISDIR;
  if (!S_ISREG(st.st_mode) || access(path, X_OK) != 0) return EACCES;
  return 0;
}

newt_result_t cli_program_check(char *const *command) {
  const char *c = command[0];
  if (!*c) return NEWT_ERR(NEWT_ERR_INVALID, "cannot run the program \"\" (the COMMAND after --): an empty name");
  if (strchr(c, '/')) {
    int e = runnable(c);
    if (e) return NEWT_ERR(NEWT_ERR_INVALID, "cannot run the program \"%s\" (the COMMAND after --): %s", c, strerror(e));
    return NEWT_OK;
  }
  const char *path = getenv("PATH");
  if (!path) path = "/bin:/usr/bin"; /* execvp's default */
  int denied = 0;
  for (const char *p = path;; p++) {
    const char *end = strchr(p, ':');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    char file[4096];
    /* an empty entry is the current directory */
    if (snprintf(file, sizeof file, "%.*s/%s", n ? (int)n : 1, n ? p : ".", c) < (int)sizeof file) {
      int e = runnable(file);
      if (!e) return NEWT_OK;
      denied |= e == EACCES;
    }
    if (!end) break;
    p = end;
  }
  return NEWT_ERR(NEWT_ERR_INVALID, "cannot run the program \"%s\" (the COMMAND after --): %s", c,
                  denied ? "found in PATH, but not an executable file" : "not found in PATH");
}
