/* Libraries loaded at run time: dlopen over a list of candidates, dlsym into typed
 * function pointers (common/dynlib.h). */
#include "common/dynlib.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

newt_result_t newt_dynlib_open(newt_dynlib *lib, const char *what, const char *const *candidates, size_t n,
                               const char *hint) {
  char tried[2048] = "";
  size_t used = 0;
  memset(lib, 0, sizeof *lib);
  for (size_t i = 0; i < n; i++) {
    const char *c = candidates[i];
    if (!c || !*c) continue;
    void *h = dlopen(c, RTLD_NOW | RTLD_LOCAL);
    if (h) {
      struct link_map *lm = NULL;
      lib->handle = h;
      if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name)
        snprintf(lib->path, sizeof lib->path, "%s", lm->l_name);
      else
        snprintf(lib->path, sizeof lib->path, "%s", c);
      return NEWT_OK;
    }
    const char *why = dlerror();
    int w = snprintf(tried + used, sizeof tried - used, "%s%s (%s)", used ? "; " : "", c, why ? why : "not loaded");
    if (w > 0) used = used + (size_t)w < sizeof tried ? used + (size_t)w : sizeof tried - 1;
  }
  return NEWT_ERR(NEWT_ERR_NOTFOUND, "%s was not found: tried %s%s%s", what, used ? tried : "nothing",
                  hint ? "; " : "", hint ? hint : "");
}

newt_result_t newt_dynlib_symbol(const newt_dynlib *lib, const char *what, const char *name, void *fn_out) {
  (void)dlerror();
  void *p = dlsym(lib->handle, name);
  if (!p) {
    const char *why = dlerror();
    return NEWT_ERR(NEWT_ERR_NOTFOUND, "%s at %s lacks %s (%s): a library of another version or kind", what, lib->path,
                    name, why ? why : "no such symbol");
  }
  memcpy(fn_out, &p, sizeof p);
  return NEWT_OK;
}

newt_result_t newt_dynlib_load(newt_dynlib_once *once, newt_result_t (*load)(void)) {
  pthread_mutex_lock(&once->mu);
  if (!once->done) {
    once->result = load();
    if (once->result != NEWT_OK) snprintf(once->error, sizeof once->error, "%s", newt_errmsg());
    once->done = 1;
  }
  newt_result_t r = once->result;
  pthread_mutex_unlock(&once->mu);
  return r == NEWT_OK ? NEWT_OK : NEWT_ERR(r, "%s", once->error);
}
