/* libFuzzer target: IDX datasets (moe_dataset_load_idx). The input is two files: its first byte k,
 * then k bytes of the labels file, then the images file. */
#include "fuzz_file.h"
#include "moe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  if (n < 1 || (size_t)data[0] > n - 1) return 0;
  const size_t k = data[0];
  const char *labels = fuzz_file(0, "labels.idx1", data + 1, k);
  const char *images = fuzz_file(1, "images.idx3", data + 1 + k, n - 1 - k);
  moe_dataset d;
  if (moe_dataset_load_idx(&d, images, labels) == MOE_OK) moe_dataset_free(&d);
  return 0;
}
