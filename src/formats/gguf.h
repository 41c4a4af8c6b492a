/* GGUF internals shared by the reader (gguf.c) and the writer (gguf_write.c). */
#ifndef MOE_GGUF_H
#define MOE_GGUF_H

#include <stddef.h>

#include "moe.h"

#define MOE__GGUF_VERSION 3
#define MOE__GGUF_ALIGNMENT 32      /* when general.alignment is absent */
#define MOE__GGUF_MAX_DIMS 4        /* ggml's GGML_MAX_DIMS */
#define MOE__GGUF_MAX_KEY 65535     /* the specification's bound on a key's length */
#define MOE__GGUF_MAX_NAME 64       /* on a tensor name's length (ggml itself takes at most 63) */

/* The stored bytes of entry i's value, its type id first (what follows the key), inside g's mapping. */
void moe__gguf_kv_raw(const moe_gguf *g, int64_t i, const void **p, size_t *n);

/* moe_gguf_open with the file's bytes read into anonymous memory (moe__map_alloc: 2 MiB pages for a
 * file past 4 MiB) instead of mapped: what a model keeping its weights in their stored type reads every
 * decode step (lm_map.h's choice). moe__gguf_copied says which; moe__gguf_size the file's bytes. */
moe_status moe__gguf_open_copy(moe_gguf **out, const char *path);
int moe__gguf_copied(const moe_gguf *g);
size_t moe__gguf_size(const moe_gguf *g);

/* Bytes of one stored value of a fixed-size metadata type; 0 for strings and arrays. */
size_t moe__gguf_vsize(moe_gguf_vtype t);

#endif
