/* See pread_all.h. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "base/pread_all.h"
#include "internal.h"

moe_status moe__pread_all(int fd, const char *path, const char *what, off_t off, void *dst, size_t n) {
  for (size_t done = 0; done < n;) { /* pread may return short counts */
    ssize_t k = pread(fd, (char *)dst + done, n - done, off + (off_t)done);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s: reading %s: %s", path, what, strerror(errno));
    MOE_TRY(k > 0, MOE_ERR_IO, "%s: reading %s: file shrank (the end of the file after %zu of %zu bytes)", path, what,
            done, n);
    done += (size_t)k;
  }
  return MOE_OK;
}
