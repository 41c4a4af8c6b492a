/* Writing a file atomically (the library's every output file goes through here): the content goes to
 * a temporary file beside the path, which is flushed, synced and renamed over it; on any failure the
 * temporary file is removed and the path is left as it was. */
#ifndef MOE_ATOMIC_FILE_H
#define MOE_ATOMIC_FILE_H

#include <stdio.h>

#include "moe.h"

/* Writes the content to fp; returns 0 on failure, optionally with the reason in msg (n bytes). */
typedef int (*moe__file_writer)(FILE *fp, void *ctx, char *msg, size_t n);

/* MOE_ERR_IO naming the path, the temporary file and the reason when anything fails. */
moe_status moe__save_atomic(const char *path, moe__file_writer write, void *ctx);

#endif
