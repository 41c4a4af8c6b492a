/* Atomic file writing (see atomic_file.h), and the public whole-buffer form. The temporary file is
 * "<path>.tmp.<pid>", flock'ed while it is written; one that a writer killed mid-write (kill -9) left
 * behind is removed by the next write of the same path, once its pid is not a live process here and
 * its lock is free (the lock guards a writer on another host sharing the directory). */
#include "formats/atomic_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "internal.h"

/* True when name is "<base>.tmp.<pid>" of a pid that is neither ours nor a live process. */
static int stale_name(const char *name, const char *base, size_t bl) {
  if (strncmp(name, base, bl) || strncmp(name + bl, ".tmp.", 5)) return 0;
  const char *digits = name + bl + 5;
  size_t nd = strlen(digits);
  if (nd == 0 || nd > 9 || strspn(digits, "0123456789") != nd) return 0;
  long pid = strtol(digits, NULL, 10);
  if (pid <= 0 || pid == (long)getpid()) return 0;
  return kill((pid_t)pid, 0) != 0 && errno == ESRCH; /* EPERM: alive, someone else's */
}

/* Removes the stale temporary files of path (best effort: a failure leaves them, as before). */
static void remove_stale(const char *path) {
  const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
  char dir[PATH_MAX]; /* not malloc'd: out of memory would skip the cleanup but let the write succeed */
  size_t dl = slash ? (size_t)(slash - path) + 1 : 0;
  if (dl >= sizeof dir) return; /* opendir would fail with ENAMETOOLONG */
  memcpy(dir, path, dl);
  dir[dl] = 0;
  DIR *d = opendir(dl ? dir : ".");
  if (!d) return;
  size_t bl = strlen(base);
  const struct dirent *e;
  while ((e = readdir(d))) {
    if (!stale_name(e->d_name, base, bl)) continue;
    int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) unlinkat(dirfd(d), e->d_name, 0);
    close(fd);
  }
  closedir(d);
}

/* The temporary file, created and locked (a filesystem without flock still gets the pid check). */
static FILE *open_tmp(const char *tmp) {
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return NULL;
  (void)flock(fd, LOCK_EX | LOCK_NB);
  FILE *fp = fdopen(fd, "wb");
  if (!fp) {
    int err = errno;
    close(fd);
    errno = err;
  }
  return fp;
}

moe_status moe__save_atomic(const char *path, moe__file_writer write, void *ctx) {
  MOE_TRY(path, MOE_ERR_ARG, "cannot write a file: NULL path");
  char *tmp = malloc(strlen(path) + 32);
  MOE_TRY(tmp, MOE_ERR_NOMEM, "%s: out of memory", path);
  sprintf(tmp, "%s.tmp.%ld", path, (long)getpid());
  remove_stale(path);
  char msg[200] = "";
  errno = 0;
  FILE *fp = open_tmp(tmp);
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
