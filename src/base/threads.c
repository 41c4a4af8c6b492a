/* How many OpenMP threads a call uses, and releasing the calling thread's team (moe.h). */
#include <omp.h>

#include "internal.h"

int moe__threads(int requested) { return requested > 0 ? requested : omp_get_num_procs(); }

void moe_threads_release(void) { omp_pause_resource_all(omp_pause_soft); } /* libgomp: the caller's team only */
