/* The table of backends (backend.h): one row each, and the lookups every layer asks instead
 * of comparing a backend's name. */
#include "common/backend.h"

#include <stdio.h>
#include <string.h>

static const newt_backend backends[] = {
    {.name = "cpu", .id = NEWT_BACKEND_CPU, .device = NEWT_DEVICE_CPU},
    {.name = "nccl", .id = NEWT_BACKEND_NCCL, .device = NEWT_DEVICE_GPU},
};
#define NBACKENDS (int)(sizeof backends / sizeof backends[0])

const newt_backend *newt_backend_at(int i) { return i >= 0 && i < NBACKENDS ? &backends[i] : NULL; }

const newt_backend *newt_backend_find(const char *name) {
  for (int i = 0; name && i < NBACKENDS; i++)
    if (strcmp(backends[i].name, name) == 0) return &backends[i];
  return NULL;
}

const newt_backend *newt_backend_of(newt_backend_id id) {
  for (int i = 0; i < NBACKENDS; i++)
    if (backends[i].id == id) return &backends[i];
  return NULL;
}

int newt_backend_uses_gpu(const newt_backend *b) { return b && b->device == NEWT_DEVICE_GPU; }

const char *newt_backend_names(char *out, size_t cap, const char *quote) {
  size_t at = 0;
  if (cap) out[0] = '\0';
  for (int i = 0; i < NBACKENDS && at < cap; i++) {
    const char *sep = i == 0 ? "" : i == NBACKENDS - 1 ? " or " : ", ";
    int k = snprintf(out + at, cap - at, "%s%s%s%s", sep, quote, backends[i].name, quote);
    if (k < 0) break;
    at += (size_t)k;
  }
  return out;
}
