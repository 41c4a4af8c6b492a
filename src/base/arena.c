/* Workspace arena: see arena.h. */
#include <stdlib.h>

#include "base/arena.h"

moe_status moe__arena_reserve(moe__arena *a, size_t bytes, const char *what) {
  if (bytes > a->cap) {
    free(a->base);
    a->base = NULL;
    a->cap = 0;
    a->used = 0;
    if (bytes) {
      a->base = moe__alloc_big(moe__arena_size(bytes));
      MOE_TRY(a->base, MOE_ERR_NOMEM, "%s workspace: cannot allocate %zu bytes", what, bytes);
    }
    a->cap = moe__arena_size(bytes);
  }
  a->used = 0;
  return MOE_OK;
}

void *moe__arena_alloc(moe__arena *a, size_t n) {
  size_t sz = moe__arena_size(n);
  if (a->used + sz > a->cap) return NULL;
  void *p = a->base + a->used;
  a->used += sz;
  if (a->used > a->peak) a->peak = a->used;
  return p;
}

void moe__arena_free(moe__arena *a) {
  free(a->base);
  a->base = NULL;
  a->cap = a->used = 0;
}
