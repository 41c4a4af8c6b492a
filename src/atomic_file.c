/* Atomic file writing (see atomic_file.h), and the public whole-buffer form. */
#include "atomic_file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

moe_status moe__save_atomic(const char *path, moe__file_writer write, void *ctx) {
  MOE_TRY(path, MOE_ERR_ARG, "cannot write a file: NULL path");
  char *tmp = malloc(strlen(path) + 32);
  MOE_TRY(tmp, MOE_ERR_NOMEM, "%s: out of memory", path);
  sprintf(tmp, "%s.tmp.%ld", path, (long)getpid());
  char msg[200] = "";
  errno = 0;
  FILE *fp = fopen(tmp, "wb");
  int ok = fp && write(fp, ctx, msg, sizeof msg) && fflush(fp) == 0 && fsync(fileno(fp)) == 0;
  int err = errno;
  if (fp && fclose(fp) != 0 && ok) ok = 0, err = errno;
  if (ok && rename(tmp, path) != 0) ok = 0, err = errno;
  if (!ok && fp) remove(tmp);
  moe_status st = ok ? MOE_OK
                     : moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s: cannot write (via %s): %s", path, tmp,
                                  msg[0] ? msg : strerror(err ? err : EIO));
  free(tmp);
  return st;
}

typedef struct { const void *data; size_t n; } bytes;

static int write_bytes(FILE *fp, void *ctx, char *msg, size_t n) {
  (void)msg, (void)n;
  const bytes *b = ctx;
  return fwrite(b->data, 1, b->n, fp) == b->n;
}

moe_status moe_write_file_atomic(const char *path, const void *data, size_t n) {
  MOE_TRY(data || n == 0, MOE_ERR_ARG, "%s: NULL data", path ? path : "(NULL path)");
  bytes b = {data, n};
  return moe__save_atomic(path, write_bytes, &b);
}
