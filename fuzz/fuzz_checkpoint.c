/* libFuzzer target: checkpoints, for training (moe_checkpoint_load, with the optimizer state) and for
 * serving (moe_checkpoint_load_serving, all experts resident and behind a 1-slot cache). */
#include "fuzz_file.h"
#include "moe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  const char *path = fuzz_file(0, "ck.safetensors", data, n);
  moe_model_t m;
  moe_optim_t o;
  moe_train_state ts;
  if (moe_checkpoint_load(path, &m, &o, &ts) == MOE_OK) moe_optim_free(&o), moe_model_free(&m);
  for (int K = 0; K < 2; K++)
    if (moe_checkpoint_load_serving(path, &m, K, MOE_CACHE_LRU, -1) == MOE_OK) moe_model_free(&m);
  return 0;
}
