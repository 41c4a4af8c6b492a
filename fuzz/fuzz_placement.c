/* libFuzzer target: placement JSON (moe_placement_load), 8 experts on 2 devices, layers 0 and 1. */
#include "fuzz_file.h"
#include "moe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  const char *path = fuzz_file(0, "placement.json", data, n);
  int dev[8];
  for (int layer = 0; layer < 2; layer++) moe_placement_load(path, layer, 8, 2, dev);
  return 0;
}
