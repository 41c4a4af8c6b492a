/* Reading a file's bytes at an offset until all are read (pread_all.c): the one loop the lazy safetensors
 * reader, the mapping loader's unmapped edges and the streamed GGUF experts share. Internal. */
#ifndef MOE_BASE_PREAD_ALL_H
#define MOE_BASE_PREAD_ALL_H

#include <stddef.h>
#include <sys/types.h>

#include "moe.h"

/* The n bytes at offset off of the open file fd into dst, retrying on EINTR and short counts. An error
 * is MOE_ERR_IO "<path>: reading <what>: <why>", why the system's message or, at the end of the file,
 * "file shrank" with the bytes read of the n. */
moe_status moe__pread_all(int fd, const char *path, const char *what, off_t off, void *dst, size_t n);

#endif
