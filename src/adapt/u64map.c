/* A small hash map from 64-bit keys to 64-bit values for the adaptive caches (batch size -> n,
 * capacity bucket -> setup): open addressing with linear probing, no deletion, grown at half full. */
#include <math.h>
#include <stdlib.h>

#include "adapt/pipe_model.h"

/* The slot where key is, or the empty slot where it would go (cap is a power of two, never full). */
static size_t slot_of(const uint64_t *keys, size_t cap, uint64_t key) {
  uint64_t s = key;
  size_t i = (size_t)moe__splitmix(&s) & (cap - 1);
  while (keys[i] && keys[i] != key + 1) i = (i + 1) & (cap - 1);
  return i;
}

int moe__u64map_get(const moe__u64map *m, uint64_t key, uint64_t *val) {
  if (!m->cap || key == UINT64_MAX) return 0;
  size_t i = slot_of(m->keys, m->cap, key);
  if (!m->keys[i]) return 0;
  *val = m->vals[i];
  return 1;
}

static moe_status grow(moe__u64map *m) {
  size_t cap = m->cap ? 2 * m->cap : 16;
  uint64_t *keys = calloc(cap, sizeof *keys), *vals = malloc(cap * sizeof *vals);
  if (!keys || !vals) {
    free(keys);
    free(vals);
    MOE_TRY(0, MOE_ERR_NOMEM, "u64map: out of memory growing to %zu slots", cap);
  }
  for (size_t i = 0; i < m->cap; i++)
    if (m->keys[i]) {
      size_t j = slot_of(keys, cap, m->keys[i] - 1);
      keys[j] = m->keys[i], vals[j] = m->vals[i];
    }
  free(m->keys);
  free(m->vals);
  m->keys = keys, m->vals = vals, m->cap = cap;
  return MOE_OK;
}

moe_status moe__u64map_put(moe__u64map *m, uint64_t key, uint64_t val) {
  MOE_TRY(key != UINT64_MAX, MOE_ERR_ARG, "u64map: key %llu is reserved", (unsigned long long)key);
  if (2 * (m->len + 1) > m->cap) MOE_CHECK(grow(m));
  size_t i = slot_of(m->keys, m->cap, key);
  if (!m->keys[i]) m->keys[i] = key + 1, m->len++;
  m->vals[i] = val;
  return MOE_OK;
}

void moe__u64map_free(moe__u64map *m) {
  free(m->keys);
  free(m->vals);
  *m = (moe__u64map){0};
}

moe_status moe__trial_record(moe__u64map *runs, moe__u64map *secs, uint64_t k, double seconds, uint64_t *before) {
  uint64_t n = 0, best;
  moe__u64map_get(runs, k, &n);
  if (before) *before = n;
  double t = moe__u64map_get(secs, k, &best) ? fmin(moe__double_of_u64(best), seconds) : seconds;
  MOE_CHECK(moe__u64map_put(runs, k, n + 1));
  return moe__u64map_put(secs, k, moe__u64_of_double(t));
}
