/* Names and the keys they make (see name.h). */
#include "name.h"

#include <stdio.h>
#include <string.h>

newt_result_t newt_check_name(const char *what, const char *name) {
  if (!name || !*name) return NEWT_ERR(NEWT_ERR_INVALID, "%s: empty", what);
  size_t n = strlen(name);
  if (n >= NEWT_ID_MAX)
    return NEWT_ERR(NEWT_ERR_INVALID, "%s \"%.70s...\": longer than %d characters", what, name, NEWT_ID_MAX - 1);
  for (size_t i = 0; i < n; i++) {
    char ch = name[i];
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
             ch == '_' || ch == '-';
    if (!ok)
      return NEWT_ERR(NEWT_ERR_INVALID, "%s \"%s\": character %zu is not one of A-Z a-z 0-9 . _ -", what, name,
                      i + 1);
  }
  return NEWT_OK;
}

newt_result_t newt_job_path(char *out, size_t cap, const char *job, const char *suffix) {
  NEWT_CHECK(newt_check_name("job name", job));
  int n = snprintf(out, cap, "/newt/%s/%s", job, suffix ? suffix : "");
  if (n < 0 || (size_t)n >= cap) return NEWT_ERR(NEWT_ERR_INVALID, "key for job %s is too long", job);
  return NEWT_OK;
}
