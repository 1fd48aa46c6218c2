/* The backends a job may train on, one row each (as NCCL's list of transports): the name a
 * spec, a flag or a bench line spells it with, the device its ranks compute on, and the
 * communicator's backend that comm/ keys its table of operations and its library by
 * (comm/backend.c). It lives here, the lowest layer, because every layer asks it: job/'s spec
 * checks a name, the coordinator whether ranks hold GPUs, the worker which device and
 * communicator to build, `newt run` and the benches whether to count GPUs. A backend is
 * added by a row here and its operations in comm/; callers ask, they compare no name.
 *
 *   name   device   comm backend         library (comm/backend.c)
 *   cpu    CPU      NEWT_BACKEND_CPU     built in: shared memory and TCP
 *   nccl   GPU      NEWT_BACKEND_NCCL    libnccl.so.2, loaded at run time */
#ifndef NEWT_COMMON_BACKEND_H
#define NEWT_COMMON_BACKEND_H

#include <stddef.h>

/* A communicator's backend (comm_config.backend: comm/comm.h spells it comm_backend). */
typedef enum newt_backend_id {
  NEWT_BACKEND_CPU = 0, /* shared memory within a host, TCP between hosts */
  NEWT_BACKEND_NCCL = 1,
  NEWT_BACKEND__COUNT
} newt_backend_id;

/* Where a backend's ranks compute and its buffers live. */
typedef enum newt_device_kind {
  NEWT_DEVICE_CPU = 0, /* host memory */
  NEWT_DEVICE_GPU = 1, /* one CUDA GPU per rank (the worker's device) */
} newt_device_kind;

typedef struct newt_backend {
  const char *name;        /* spec.backend, --backend, a bench line's "backend" */
  newt_backend_id id;      /* the communicator it builds */
  newt_device_kind device; /* where its ranks compute */
} newt_backend;

/* The row named `name`; NULL for a name no row has (or NULL). */
const newt_backend *newt_backend_find(const char *name);
/* The row of a communicator's backend; NULL for none. */
const newt_backend *newt_backend_of(newt_backend_id id);
/* Row i of the table, in its order (i from 0); NULL past the last. */
const newt_backend *newt_backend_at(int i);
/* 1 when b's ranks compute on GPUs (one each); 0 for a CPU backend or NULL. */
int newt_backend_uses_gpu(const newt_backend *b);
/* The names, each between quote and quote, joined as a sentence says them into out ("a, b or
 * c", each name quoted when quote is "\"": spec.backend's error); out. */
const char *newt_backend_names(char *out, size_t cap, const char *quote);

#endif
