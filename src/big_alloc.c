/* Buffers that are swept through memory every step: see moe__alloc_big (internal.h). */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

#define HUGE_PAGE ((size_t)2 << 20)
/* From here on the slack of rounding up to whole huge pages (under 2 MiB) is at most half the buffer. */
#define HUGE_FROM (2 * HUGE_PAGE)

void *moe__alloc_big(size_t bytes) {
  if (bytes < HUGE_FROM) return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
  size_t size = (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
  void *p = aligned_alloc(HUGE_PAGE, size);
  if (p) madvise(p, size, MADV_HUGEPAGE); /* advice only: without transparent huge pages it does nothing */
  return p;
}

void *moe__calloc_big(size_t bytes) {
  void *p = moe__alloc_big(bytes);
  if (p) memset(p, 0, bytes);
  return p;
}
