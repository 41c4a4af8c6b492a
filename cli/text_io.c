/* Whole text files and streams into memory. */
#include <stdlib.h>
#include <sys/stat.h>

#include "text_io.h"

/* The whole stream in a malloc'd buffer, NUL-terminated (its length, without the NUL, in *n); NULL on
 * failure. */
char *cli_read_all(FILE *fp, size_t *n) {
  size_t cap = 1 << 16;
  char *buf = malloc(cap);
  *n = 0;
  for (size_t got; buf && (got = fread(buf + *n, 1, cap - 1 - *n, fp)) > 0;) {
    *n += got;
    if (*n == cap - 1) {
      char *b = realloc(buf, cap *= 2);
      if (!b) free(buf);
      buf = b;
    }
  }
  if (buf && ferror(fp)) {
    free(buf);
    return NULL;
  }
  if (buf) buf[*n] = 0;
  return buf;
}

/* The file at path (or DIR/name when path is a directory) in a malloc'd buffer. */
char *cli_read_text(const char *path, const char *name, size_t *n, char *used, size_t cap) {
  struct stat s;
  if (stat(path, &s) == 0 && S_ISDIR(s.st_mode)) snprintf(used, cap, "%s/%s", path, name);
  else snprintf(used, cap, "%s", path);
  FILE *fp = fopen(used, "rb");
  char *text = fp ? cli_read_all(fp, n) : NULL;
  if (fp) fclose(fp);
  return text;
}
