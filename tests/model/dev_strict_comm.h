/* Collectives over the strict test device's memory (dev_strict.h; tests only). The CPU
 * backend reads and writes what it is given, so over the strict device's non-canonical
 * pointers it needs them translated: dev_strict_comm gives a CPU communicator (before any
 * split: its children inherit it) a copy of the CPU backend's table (comm/internal.h) whose
 * operations translate the strict device's pointers; host pointers pass as they are. The
 * product's collectives take device pointers as they come (NCCL: GPU pointers). */
#ifndef NEWT_TESTS_DEV_STRICT_COMM_H
#define NEWT_TESTS_DEV_STRICT_COMM_H

#include "comm/internal.h"
#include "model/dev_strict.h"

static comm_backend_ops dev_strict_comm_ops;

static inline newt_result_t dev_strict_comm_run(struct comm *c, const comm_opdesc *op) {
  dev_strict_flush(); /* a collective comes after the downloads queued before it */
  comm_opdesc o = *op;
  o.send = dev_strict_host(o.send);
  o.recv = dev_strict_host(o.recv);
  return comm_cpu_ops.run(c, &o);
}

static inline newt_result_t dev_strict_comm_submit(struct comm *c, struct comm_req *r) {
  dev_strict_flush();
  r->op.send = dev_strict_host(r->op.send);
  r->op.recv = dev_strict_host(r->op.recv);
  return comm_cpu_ops.submit(c, r);
}

/* world: a CPU communicator, not split yet. */
static inline void dev_strict_comm(comm_t *world) {
  if (!dev_strict_comm_ops.run) {
    dev_strict_comm_ops = comm_cpu_ops;
    dev_strict_comm_ops.run = dev_strict_comm_run;
    dev_strict_comm_ops.submit = dev_strict_comm_submit;
  }
  world->ops = &dev_strict_comm_ops;
}

#endif
