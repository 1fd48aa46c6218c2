/* Element-wise reduction kernels of the CPU backend.
 *
 * One call reduces two arrays of n elements: dst = a op b, or dst = dst op b when a is
 * NULL (in place). The loops are plain, restrict-qualified and compiled with -O3 so the
 * compiler vectorises them (SSE2 on any x86-64). bf16 is widened to f32, combined and
 * rounded once per call (fp32 accumulation inside one reduction step). AVG is SUM whose
 * last step passes div = the rank count: the result is divided before it is stored
 * (integers: C division, toward zero). f16 is not reduced on the CPU (copies only). */
#ifndef NEWT_COMM_REDUCE_H
#define NEWT_COMM_REDUCE_H

#include <stddef.h>

#include "comm/comm.h"
#include "common/dtype.h"

/* 1 when the CPU backend can reduce this type (f32, bf16, i32, i64, u8). */
int comm_reduce_supported(newt_dtype dt);

/* dst[i] = a[i] op b[i] (a == NULL: dst[i] = dst[i] op b[i]); div > 0 divides the result
 * (SUM/AVG only). a and b must not overlap dst unless a == NULL. */
void comm_reduce(newt_dtype dt, comm_op op, void *dst, const void *a, const void *b, size_t n,
                 int div);

/* memcpy whose stores bypass the cache (non-temporal) for large copies: for results
 * this rank will not read again soon. Followed by comm_stream_fence() before the data is
 * published to another thread. */
void comm_copy_stream(void *dst, const void *src, size_t n);
void comm_stream_fence(void);

/* dst[i] = src[i] / div; src may equal dst. */
void comm_scale(newt_dtype dt, void *dst, const void *src, size_t n, int div);

#endif
