/* Buffers a file's pages can be mapped into: see file_map.h. */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file_map.h"
#include "base/pread_all.h"
#include "internal.h"

size_t moe__map_page(void) {
  static size_t page;
  if (!page) page = (size_t)sysconf(_SC_PAGESIZE);
  return page;
}

moe_status moe__map_into(int fd, const char *path, const char *what, uint64_t off, void *dst, size_t n,
                         size_t *mapped) {
  *mapped = 0;
  struct stat sb;
  MOE_TRY(fstat(fd, &sb) == 0, MOE_ERR_IO, "%s: stat: %s", path, strerror(errno));
  /* a page past the end of the file would be SIGBUS when read, not an error */
  MOE_TRY((uint64_t)sb.st_size >= off && (uint64_t)sb.st_size - off >= n, MOE_ERR_IO,
          "%s: %s: the file ends at %lld bytes, before the tensor's end at %llu (file changed?)", path, what,
          (long long)sb.st_size, (unsigned long long)(off + n));
  size_t pg = moe__map_page(), a = (size_t)(-(uintptr_t)dst & (pg - 1)); /* bytes to dst's first whole page */
  char *d = dst;
  if ((uintptr_t)dst % pg != off % pg || a >= n || (n - a) / pg == 0)
    return moe__pread_all(fd, path, what, (off_t)off, d, n);
  size_t whole = (n - a) / pg * pg;
  void *p = mmap(d + a, whole, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, (off_t)(off + a));
  if (p == MAP_FAILED) { /* too many mappings (vm.max_map_count), say: the bytes are read instead, into
                           anonymous pages again should the failed call have taken the old ones */
    p = mmap(d + a, whole, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    MOE_TRY(p != MAP_FAILED, MOE_ERR_NOMEM, "%s: %s: mmap: %s", path, what, strerror(errno));
    return moe__pread_all(fd, path, what, (off_t)off, d, n);
  }
  madvise(p, whole, MADV_WILLNEED); /* read ahead: the finite check reads every page next */
  *mapped = whole;
  MOE_CHECK(moe__pread_all(fd, path, what, (off_t)off, d, a));
  return moe__pread_all(fd, path, what, (off_t)(off + a + whole), d + a + whole, n - a - whole);
}
