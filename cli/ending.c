/* The exit status and termination message of a service (see ending.h): job/ending.c's. */
#include "cli/ending.h"

#include <stdio.h>

#include "job/ending.h"

const char *cli_termination_log(const char *flag) { return job_termination_log(flag); }

int cli_end(const char *cmd, newt_result_t r, job_end *e, const char *path) {
  char who[64];
  snprintf(who, sizeof who, "newt %s", cmd);
  return job_end_write(who, r, e, path);
}
