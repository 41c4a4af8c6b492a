/* See tokenizer_map.h. */
#include "lm/tokenizer_map.h"

#include <stdlib.h>
#include <string.h>

static uint64_t hash_bytes(const void *key, size_t len) {
  const unsigned char *p = key;
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, then a final mix so that the low bits spread */
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

/* The slot holding key, or the empty slot where it would go. */
static size_t find(const moe__tok_map *m, uint64_t h, const void *key, size_t len) {
  size_t mask = m->nslots - 1;
  for (size_t s = h & mask;; s = (s + 1) & mask) {
    int32_t e = m->slots[s];
    if (e < 0) return s;
    const moe__tok_entry *x = &m->entries[e];
    if (x->hash == h && x->len == len && !memcmp(m->keys + x->off, key, len)) return s;
  }
}

int64_t *moe__tok_map_get(const moe__tok_map *m, const void *key, size_t len) {
  if (!m->nslots) return NULL;
  int32_t e = m->slots[find(m, hash_bytes(key, len), key, len)];
  return e < 0 ? NULL : &m->entries[e].val;
}

/* Doubles the slots (kept at most half full) and places every entry again. */
static int grow_slots(moe__tok_map *m) {
  size_t ns = m->nslots ? 2 * m->nslots : 64;
  int32_t *s = malloc(ns * sizeof *s);
  if (!s) return 0;
  memset(s, 0xff, ns * sizeof *s);
  free(m->slots);
  m->slots = s;
  m->nslots = ns;
  for (size_t i = 0; i < m->n; i++) {
    size_t k = m->entries[i].hash & (ns - 1);
    while (s[k] >= 0) k = (k + 1) & (ns - 1);
    s[k] = (int32_t)i;
  }
  return 1;
}

/* Room for one more entry and len more key bytes. */
static int reserve(moe__tok_map *m, size_t len) {
  if (m->n == m->cap) {
    size_t c = m->cap ? 2 * m->cap : 64;
    moe__tok_entry *e = realloc(m->entries, c * sizeof *e);
    if (!e) return 0;
    m->entries = e;
    m->cap = c;
  }
  if (m->keys_len + len > m->keys_cap) {
    size_t c = m->keys_cap ? 2 * m->keys_cap : 1024;
    while (c < m->keys_len + len) c *= 2;
    char *k = realloc(m->keys, c);
    if (!k) return 0;
    m->keys = k;
    m->keys_cap = c;
  }
  return 2 * (m->n + 1) <= m->nslots || grow_slots(m);
}

int64_t *moe__tok_map_put(moe__tok_map *m, const void *key, size_t len, int64_t init, int *added) {
  uint64_t h = hash_bytes(key, len);
  *added = 0;
  if (m->nslots) {
    int32_t e = m->slots[find(m, h, key, len)];
    if (e >= 0) return &m->entries[e].val;
  }
  if (m->n >= INT32_MAX || !reserve(m, len)) return NULL;
  memcpy(m->keys + m->keys_len, key, len);
  m->entries[m->n] = (moe__tok_entry){h, m->keys_len, len, init};
  m->keys_len += len;
  m->slots[find(m, h, key, len)] = (int32_t)m->n;
  *added = 1;
  return &m->entries[m->n++].val;
}

void moe__tok_map_free(moe__tok_map *m) {
  free(m->entries);
  free(m->slots);
  free(m->keys);
  memset(m, 0, sizeof *m);
}
