/* Strict parsing of a whole JSON text (the safetensors header, a placement file, a Hugging Face config):
 * one value, nothing after it but whitespace, no NUL byte (cJSON would stop there and silently drop the
 * rest). */
#ifndef MOE_JSON_H
#define MOE_JSON_H

#include <cjson/cJSON.h>

#include "moe.h"

/* Parses the n bytes of text into *out (free with cJSON_Delete); MOE_ERR_FORMAT naming path, what
 * ("header") and the byte where it went wrong. */
moe_status moe__json_parse(const char *path, const char *what, const char *text, size_t n, cJSON **out);

/* Reads the whole file at path (at most max_bytes) and parses it as moe__json_parse does; MOE_ERR_IO
 * naming the path when it cannot be read or is larger. */
moe_status moe__json_read(const char *path, const char *what, size_t max_bytes, cJSON **out);

#endif
