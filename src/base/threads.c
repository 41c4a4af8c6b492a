/* How many OpenMP threads a call uses. */
#include <omp.h>

#include "internal.h"

int moe__threads(int requested) { return requested > 0 ? requested : omp_get_num_procs(); }
