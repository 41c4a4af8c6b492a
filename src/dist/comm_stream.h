/* MPipeMoE's communication stream on a CPU: all-to-all-v exchanges run, in the order posted, on one
 * thread per moe_dist, so that micro-batch i+1's exchange overlaps micro-batch i's experts. The
 * caller keeps the buffers untouched until the exchange's ticket is waited for, and makes no other
 * MPI call while any is outstanding (MPI_THREAD_SERIALIZED). Without a thread-capable MPI (or
 * without MPI) an exchange runs at once, on the caller's thread. */
#ifndef MOE_COMM_STREAM_H
#define MOE_COMM_STREAM_H

#include "dist/dist.h"

typedef uint64_t moe__ticket; /* an exchange's place in the stream; 0: nothing to wait for */

/* Counts and displacements as moe__dist_alltoallv_rows's (rows of width floats), 4 arrays of W each,
 * copied. */
moe_status moe__stream_alltoallv_rows(const moe_dist *d, const float *send, const int *counts, float *recv,
                                      int width, moe__ticket *t);
/* Returns once exchange t and every one posted before it are done; the first failure of any of them. */
moe_status moe__stream_wait(const moe_dist *d, moe__ticket t);
/* moe__stream_wait, the seconds it waited added to *seconds: the exchanges' time that nothing hid. */
moe_status moe__stream_wait_timed(const moe_dist *d, moe__ticket t, double *seconds);
/* Stops the thread (after the exchanges posted); moe_dist_finalize calls it. */
void moe__stream_free(moe_dist *d);

#endif
