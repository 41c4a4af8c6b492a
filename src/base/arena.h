/* A bump allocator for the layer's workspaces. Reserved once per call from the shapes of that call,
 * grown only when shapes grow, reset at each forward: nothing is malloc'd in the steady state. */
#ifndef MOE_ARENA_H
#define MOE_ARENA_H

#include <stddef.h>

#include "internal.h"

typedef struct {
  char *base;
  size_t cap;  /* bytes available */
  size_t used; /* bytes handed out since the last reset */
  size_t peak; /* largest `used` ever seen */
} moe__arena;

/* Bytes an allocation of n bytes takes in the arena (64-byte aligned). */
static inline size_t moe__arena_size(size_t n) { return (n + 63) & ~(size_t)63; }
/* Makes room for `bytes` (growing only when needed) and empties the arena. */
moe_status moe__arena_reserve(moe__arena *a, size_t bytes, const char *what);
/* Hands out n bytes; the caller reserved enough, so running out is an internal error (NULL). */
void *moe__arena_alloc(moe__arena *a, size_t n);
void moe__arena_free(moe__arena *a);

#endif
