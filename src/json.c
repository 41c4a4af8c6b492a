/* See json.h. */
#include "json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define BAD(...) moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, __VA_ARGS__)

moe_status moe__json_parse(const char *path, const char *what, const char *text, size_t n, cJSON **out) {
  *out = NULL;
  const char *nul = memchr(text, 0, n), *end = NULL;
  if (nul) return BAD("%s: %s contains a NUL byte at byte %ld", path, what, (long)(nul - text));
  cJSON *root = cJSON_ParseWithLengthOpts(text, n, &end, 0);
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

moe_status moe__json_load(const char *path, const char *what, cJSON **out) {
  *out = NULL;
  FILE *fp = fopen(path, "rb");
  MOE_TRY(fp, MOE_ERR_IO, "%s: cannot open the %s: %s", path, what, strerror(errno));
  char *text = NULL;
  long n = fseek(fp, 0, SEEK_END) == 0 ? ftell(fp) : -1;
  if (n >= 0 && n < (1L << 26) && fseek(fp, 0, SEEK_SET) == 0 && (text = malloc((size_t)n + 1)) &&
      fread(text, 1, (size_t)n, fp) == (size_t)n)
    text[n] = 0;
  else
    free(text), text = NULL;
  fclose(fp);
  MOE_TRY(text, MOE_ERR_IO, "%s: cannot read the %s", path, what);
  moe_status st = moe__json_parse(path, what, text, (size_t)n, out);
  free(text);
  return st;
}
