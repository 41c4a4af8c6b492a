/* Loading a language model by mapping its checkpoint (DESIGN 4.8c): the parameters whose bytes in the
 * file are already what the model computes with (F32 little-endian, the whole tensor, rows in the
 * model's order) are mapped from the file into the model's buffers instead of read; lm_io.c (safetensors)
 * and lm_gguf.c (GGUF) list them, read the rest as before, and check every value finite either way. */
#ifndef MOE_LM_MAP_H
#define MOE_LM_MAP_H

#include <stdint.h>

#include "moe.h"

/* A ref whose bytes lie in file `file` (an index into the loader's files) at offset off. */
typedef struct {
  int ref;
  int file;
  uint64_t off;
} moe__lm_map_item;

/* Whether a load of `bytes` of weights maps them (1) or reads every tensor (0: the copying loader, and
 * a GGUF file's stored-type weights read into anonymous memory: moe__gguf_open_copy). A copy sits on
 * 2 MiB pages, the file's page cache on 4 KiB ones, whose page walks and the prefetchers' stops at each
 * page cost decode up to 14% (BENCHMARKS "Huge pages for the weights"); a mapping loads at once, is shared
 * with the page cache and other processes, and is dropped under memory pressure rather than swapped.
 * So by moe__lm_map_choice(getenv("MOE_NO_MMAP"), bytes, MemAvailable), unless moe__lm_set_mapping
 * (1 or 0; -1 back to that) fixed it for the process (the tests compare both). */
void moe__lm_set_mapping(int on);
int moe__lm_mapping(uint64_t bytes);
/* MOE_NO_MMAP "1": read; "0": map; else read what fits in half the memory available (avail, 0 when
 * unknown: map). */
int moe__lm_map_choice(const char *env, uint64_t bytes, uint64_t avail);

/* Places m's buffers (moe__lm_place, right after moe_lm_init: nothing loaded yet) where the most bytes
 * of the n items fall at the same place in a page as in their files, then puts each item's bytes into
 * its ref, mapped where the pages line up and read where not (runs of items contiguous in the file and
 * in the model in one go), adding the bytes mapped to moe_lm_mapped_bytes. fds[i] and paths[i]: file i. */
moe_status moe__lm_map_items(moe_lm_t *m, moe__lm_map_item *x, int n, const int *fds, const char *const *paths);

/* lm_model.c: m's buffers moved to ones a file's pages can be mapped into (base/file_map.h), phase[0]
 * the place in a page of m->dense's first byte, phase[1 + i] layer i's; the refs follow. Right after
 * moe_lm_init. The floats in m->dense. moe_lm_mapped_bytes's count, added to by
 * moe__lm_map_items and by lm_gguf.c for the weights it binds where they lie in its mapped file. */
moe_status moe__lm_place(moe_lm_t *m, const size_t *phase);
size_t moe__lm_dense_floats(const moe_lm_t *m);
void moe__lm_add_mapped_bytes(moe_lm_t *m, size_t n);

#endif
