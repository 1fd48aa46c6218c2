/* Names and the keys they make: a job's name, a worker's id, a coordinator's name. Each is
 * 1-63 characters of [A-Za-z0-9._-], so that it is safe as one part of an etcd key, a file
 * name and a log line. rendezvous/ checks the names of its members and candidates with it,
 * job/ the ids its records and keys carry, and the commands their flags. */
#ifndef NEWT_COMMON_NAME_H
#define NEWT_COMMON_NAME_H

#include <stddef.h>

#include "err.h"

/* A name's bytes with its NUL: a char[NEWT_ID_MAX] holds any name that passes (not newt.h's
 * NEWT_NAME_MAX, the longest name of a declared tensor). */
#define NEWT_ID_MAX 64

/* 1-63 characters of [A-Za-z0-9._-]; the error names `what` (NEWT_ERR_INVALID). */
newt_result_t newt_check_name(const char *what, const char *name);
/* "/newt/<job>/" + suffix into out (cap bytes): the root of every key of a job (job/'s key
 * table builds the rest). The job's name is checked. */
newt_result_t newt_job_path(char *out, size_t cap, const char *job, const char *suffix);

#endif
