/* A model's parameters backed by the checkpoint's own pages (DESIGN 4.8c): buffers that file pages can
 * be mapped into, and the mapping of a tensor's bytes into them. The mapping is private and writable:
 * reading a weight reads the page cache's page (no copy), the first write to a page (a training step,
 * moe_lm_init_params) gives the buffer its own copy of that page, and the file never changes. */
#ifndef MOE_FILE_MAP_H
#define MOE_FILE_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "moe.h"

/* The page size the mappings are made in. */
size_t moe__map_page(void);

/* The n bytes at offset off of the open file fd (path for errors) placed at dst, which lies inside a
 * moe__map_alloc buffer (internal.h): the whole pages of [dst, dst + n) that the file's pages cover exactly (dst and
 * off at the same place in a page) become a private mapping of the file, the rest is read (pread).
 * *mapped: the bytes mapped. A file shorter than off + n is MOE_ERR_IO naming path and what. */
moe_status moe__map_into(int fd, const char *path, const char *what, uint64_t off, void *dst, size_t n,
                         size_t *mapped);

#endif
