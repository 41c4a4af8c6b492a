/* Work shared in shrinking runs (work.h). */
#include "kernels/work.h"

int moe__work_take(moe__work *w, int *first) {
  int at = __atomic_load_n(&w->next, __ATOMIC_RELAXED), n;
  do {
    if (at >= w->total) return 0;
    n = (w->total - at) / (2 * w->nt);
    n = n < 1 ? 1 : n;
  } while (!__atomic_compare_exchange_n(&w->next, &at, at + n, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  *first = at;
  return n;
}
