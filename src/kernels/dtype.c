/* The element types of tensors in files (safetensors' names) and their sizes. */
#include "moe.h"

static const char *const dt_names[MOE_DT_COUNT] = {"F32", "I32", "BF16", "F16", "F64", "I64", "U8"};
static const size_t dt_sizes[MOE_DT_COUNT] = {4, 4, 2, 2, 8, 8, 1};

const char *moe_dtype_name(moe_dtype dt) {
  return (unsigned)dt < MOE_DT_COUNT ? dt_names[dt] : "invalid";
}

size_t moe_dtype_size(moe_dtype dt) { return (unsigned)dt < MOE_DT_COUNT ? dt_sizes[dt] : 0; }
