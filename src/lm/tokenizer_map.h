/* A hash map from byte strings to int64 values for the tokenizer: words and their counts, token bytes
 * and their ids, token pairs and their merges. Open addressing over entries kept in insertion order, so
 * iterating (entries[0 .. n)) is deterministic. Keys are copied. */
#ifndef MOE_LM_TOKENIZER_MAP_H
#define MOE_LM_TOKENIZER_MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint64_t hash;
  size_t off;   /* the key's bytes at keys + off */
  size_t len;
  int64_t val;
} moe__tok_entry;

typedef struct {
  moe__tok_entry *entries; /* in insertion order */
  size_t n, cap;
  int32_t *slots;          /* index into entries, -1 when empty; a power of two */
  size_t nslots;
  char *keys;
  size_t keys_len, keys_cap;
} moe__tok_map;

/* The value of key, or NULL when absent. */
int64_t *moe__tok_map_get(const moe__tok_map *m, const void *key, size_t len);
/* The value of key, inserted as `init` when absent (*added = 1 then); NULL when out of memory. */
int64_t *moe__tok_map_put(moe__tok_map *m, const void *key, size_t len, int64_t init, int *added);
/* The bytes of entry i's key. */
static inline const char *moe__tok_map_key(const moe__tok_map *m, size_t i) { return m->keys + m->entries[i].off; }
void moe__tok_map_free(moe__tok_map *m);

#endif
