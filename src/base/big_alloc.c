/* Buffers that are swept through memory every step: see moe__alloc_big (internal.h). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

#define HUGE_PAGE ((size_t)2 << 20)
/* From here on the slack of rounding up to whole huge pages (under 2 MiB) is at most half the buffer. */
#define HUGE_FROM (2 * HUGE_PAGE)

void *moe__alloc_big(size_t bytes) {
  if (bytes > SIZE_MAX - HUGE_PAGE) { /* the rounding up would wrap */
    errno = ENOMEM;
    return NULL;
  }
  if (bytes < HUGE_FROM) return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
  size_t size = (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
  void *p = aligned_alloc(HUGE_PAGE, size);
  if (p) madvise(p, size, MADV_HUGEPAGE); /* advice only: without transparent huge pages it does nothing */
  return p;
}

void *moe__calloc_big(size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) { /* as calloc: a count whose bytes overflow is out of memory */
    errno = ENOMEM;
    return NULL;
  }
  void *p = moe__alloc_big(n * size);
  if (p) memset(p, 0, n * size);
  return p;
}
