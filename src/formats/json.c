/* See json.h. */
#include "formats/json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"

#define BAD(...) moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, __VA_ARGS__)

moe_status moe__json_parse(const char *path, const char *what, const char *text, size_t n, cJSON **out) {
  *out = NULL;
  const char *nul = memchr(text, 0, n), *end = NULL;
  if (nul) return BAD("%s: %s contains a NUL byte at byte %ld", path, what, (long)(nul - text));
  errno = 0; /* cJSON says only that it failed: ENOMEM from its malloc tells memory from syntax */
  cJSON *root = cJSON_ParseWithLengthOpts(text, n, &end, 0);
  if (!root && errno == ENOMEM)
    return moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory parsing the %s (%zu bytes)", path, what, n);
  if (!root) {
    const char *at = cJSON_GetErrorPtr();
    long pos = at && at >= text && at <= text + n ? (long)(at - text) : -1;
    return BAD("%s: %s is not valid JSON (error near byte %ld)", path, what, pos);
  }
  for (; end < text + n; end++)
    if (!strchr(" \t\r\n", *end)) {
      cJSON_Delete(root);
      return BAD("%s: garbage after the JSON %s at byte %ld", path, what, (long)(end - text));
    }
  *out = root;
  return MOE_OK;
}

moe_status moe__json_read(const char *path, const char *what, size_t max_bytes, cJSON **out) {
  *out = NULL;
  FILE *fp = fopen(path, "rb");
  MOE_TRY(fp, MOE_ERR_IO, "%s: cannot open the %s: %s", path, what, strerror(errno));
  struct stat sb; /* a directory opens, and its size reads as LONG_MAX */
  if (fstat(fileno(fp), &sb) == 0 && !S_ISREG(sb.st_mode)) {
    fclose(fp);
    MOE_TRY(0, MOE_ERR_IO, "%s: the %s must be a file, and this is %s", path, what,
            S_ISDIR(sb.st_mode) ? "a directory" : "not a regular file");
  }
  long n = fseek(fp, 0, SEEK_END) == 0 ? ftell(fp) : -1;
  int fits = n >= 0 && (size_t)n <= max_bytes && fseek(fp, 0, SEEK_SET) == 0;
  char *text = fits ? malloc((size_t)n + 1) : NULL;
  int ok = text && fread(text, 1, (size_t)n, fp) == (size_t)n;
  int err = errno;
  fclose(fp);
  if (!ok) {
    free(text);
    MOE_TRY(!fits || text, MOE_ERR_NOMEM, "%s: out of memory for the %s (%ld bytes)", path, what, n);
    if (n < 0 || (size_t)n <= max_bytes)
      return moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s: cannot read the %s: %s", path, what, strerror(err));
    return moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s: the %s has %ld bytes, more than the %zu allowed", path,
                      what, n, max_bytes);
  }
  moe_status st = moe__json_parse(path, what, text, (size_t)n, out);
  free(text);
  return st;
}
