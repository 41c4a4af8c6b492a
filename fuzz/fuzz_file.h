/* For fuzz targets whose API takes a path: the input written to a file of this process's own
 * (libFuzzer may run several jobs in one directory). */
#ifndef MOE_FUZZ_FILE_H
#define MOE_FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char fuzz_paths[2][512];

static void fuzz_files_remove(void) {
  for (int i = 0; i < 2; i++)
    if (fuzz_paths[i][0]) unlink(fuzz_paths[i]);
}

/* Writes the n bytes to $TMPDIR (or /tmp)/moe-fuzz-<pid>-<tag> and returns that path (slot 0 or 1,
 * for targets that need two files; removed at exit). Aborts if it cannot: that is the harness
 * failing, not the library. */
static const char *fuzz_file(int slot, const char *tag, const uint8_t *data, size_t n) {
  char(*paths)[512] = fuzz_paths;
  if (!paths[0][0] && !paths[1][0]) atexit(fuzz_files_remove);
  const char *dir = getenv("TMPDIR");
  snprintf(paths[slot], sizeof paths[slot], "%s/moe-fuzz-%ld-%s", dir && *dir ? dir : "/tmp", (long)getpid(), tag);
  FILE *fp = fopen(paths[slot], "wb");
  if (!fp || (n && fwrite(data, 1, n, fp) != n) || fclose(fp)) {
    perror(paths[slot]);
    abort();
  }
  return paths[slot];
}

#endif
