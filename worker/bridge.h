/* For newt's own GPT (gpt/worker.c) only: the communicator behind a public group handle, so
 * that the trainer's collectives (model/, over comm/) go to it with no layer between. NULL
 * for a group of a generation that ended. */
#ifndef NEWT_WORKER_BRIDGE_H
#define NEWT_WORKER_BRIDGE_H

#include "comm/comm.h"
#include "newt.h"

comm_t *worker_comm_of(newt_comm *c);

#endif
