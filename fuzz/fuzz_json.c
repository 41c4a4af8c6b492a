/* libFuzzer target: the strict JSON parser (src/formats/json.c), which reads safetensors headers and placements. */
#include <stddef.h>
#include <stdint.h>

#include "formats/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  cJSON *root;
  if (moe__json_parse("fuzz", "input", (const char *)data, n, &root) == MOE_OK) cJSON_Delete(root);
  return 0;
}
