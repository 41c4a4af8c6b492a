/* A GGUF file rewritten with one tensor in another type, for the tests (the mixed types of llama.cpp's
 * _M files). */
#ifndef MOE_TEST_GGUF_RETYPE_H
#define MOE_TEST_GGUF_RETYPE_H

#include "moe.h"

/* The GGUF file at path again with tensor `name` stored as type t2 (its values dequantized and quantized
 * again; every other tensor and key as it was). */
moe_status gguf_retype(const char *path, const char *name, moe_gguf_type t2);

#endif
