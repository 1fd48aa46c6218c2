/* Reading of NEWT_PARAM knobs (see param.h). */
#include "param.h"

#include <stdlib.h>

#include "log.h"
#include "strutil.h"

int64_t newt_param_read(const char *env, int64_t deflt) {
  const char *s = getenv(env);
  if (s == NULL || *s == '\0') return deflt;
  int64_t v;
  if (newt_parse_size(s, &v) != 0) {
    NEWT_WARN(COMMON, "%s=%s is not a number; using the default %lld", env, s, (long long)deflt);
    return deflt;
  }
  NEWT_INFO(COMMON, "%s set by environment to %lld", env, (long long)v);
  return v;
}
