/* Buffers that are swept through memory every step: see moe__alloc_big (internal.h). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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

/* The pages of a moe__map_alloc buffer: whole pages from the one holding its first byte. */
static size_t region_bytes(size_t n, size_t phase) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  return (phase + (n ? n : 1) + pg - 1) / pg * pg;
}

void *moe__map_alloc(size_t n, size_t phase) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  if (phase >= pg || n > SIZE_MAX - 2 * HUGE_PAGE) return NULL;
  size_t len = region_bytes(n, phase), align = len >= HUGE_FROM ? HUGE_PAGE : pg, extra = align - pg;
  char *r = mmap(NULL, len + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (r == MAP_FAILED) return NULL;
  char *a = (char *)(((uintptr_t)r + align - 1) & ~(uintptr_t)(align - 1)); /* the slack unmapped */
  if (a > r) munmap(r, (size_t)(a - r));
  if (r + len + extra > a + len) munmap(a + len, (size_t)(r + len + extra - (a + len)));
  if (align > pg) madvise(a, len, MADV_HUGEPAGE);
  return a + phase;
}

void moe__map_free(void *p, size_t n, size_t phase) {
  if (p) munmap((char *)p - phase, region_bytes(n, phase));
}
