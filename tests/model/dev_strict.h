/* The strict test device (tests only: never linked into newt). A device of model/dev.h whose
 * memory the host cannot touch, to prove that code written against the device interface
 * keeps its memory rule (model/dev.h, "Memory"): device pointers go only to the interface
 * and to collectives, never under a host load or store.
 *
 * Its memory is the CPU device's, handed out as non-canonical addresses (the host address
 * with bit 62 flipped, DEV_STRICT_TAG): on x86-64 a load or a store through one faults at
 * once (SIGSEGV), so a stray memcpy or loop over device memory kills the test where it
 * happens. host_visible is 0, so callers take their staging paths (upload, download, host
 * staging). Every operation translates its pointer arguments back and runs the CPU
 * device's operation (model/dev_cpu.c): the results are the CPU device's bit for bit. A
 * host pointer where a device pointer belongs (or the reverse) aborts with a message naming
 * the operation and the argument. Queued downloads run late (at the next operation, at the
 * latest model_dev_sync) and only into model_dev_host_alloc memory, which it counts.
 *
 *   model_dev *d = dev_strict();                        // one per process, never freed
 *   model_par_config pc; ...; pc.dev = d;               // train on it
 *   float *h = dev_strict_host(device_pointer);         // the host address (tests only)
 *
 * Collectives over its memory need a communicator that translates too (the CPU backend
 * dereferences what it is given): dev_strict_comm.h. */
#ifndef NEWT_TESTS_DEV_STRICT_H
#define NEWT_TESTS_DEV_STRICT_H

#include <stddef.h>
#include <stdint.h>

#include "model/dev.h"

#define DEV_STRICT_TAG (1ULL << 62)

/* The strict device (one per process, never freed). */
model_dev *dev_strict(void);

/* Runs the queued downloads now (dev_strict_comm.h does before each collective). */
void dev_strict_flush(void);
/* model_dev_host_alloc calls so far, and blocks not yet freed (for tests of pools). */
size_t dev_strict_host_allocs(void);
size_t dev_strict_host_live(void);

/* Is p (not NULL) one of the strict device's pointers? */
static inline int dev_strict_is_dev(const void *p) { return ((uintptr_t)p & DEV_STRICT_TAG) != 0; }

/* The host address behind a strict device pointer (NULL stays NULL; a host pointer is
 * returned as is). For the test harness only: code under test must not call it. */
static inline void *dev_strict_host(const void *p) {
  return dev_strict_is_dev(p) ? (void *)((uintptr_t)p ^ DEV_STRICT_TAG) : (void *)(uintptr_t)p;
}

#endif
