/* See json.h. */
#include "json.h"

#include <errno.h>
#include <string.h>

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
