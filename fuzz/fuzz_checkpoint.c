/* libFuzzer target: checkpoints, for training (moe_checkpoint_load, with the optimizer state) and for
 * serving (moe_checkpoint_load_serving, all experts resident and behind a 1-slot cache); and an input
 * that starts with '{' as a language model's checkpoint directory (moe_lm_load): config.json up to a
 * NUL byte and model.safetensors after it, or without a NUL the weights of the fixture of the family the
 * config names (tests/fixtures/lm/<family>/model.safetensors, Mixtral's when it names none; gpt-oss's
 * MXFP4 fixture when it says mxfp4): every
 * family's fields, its tensor set, shapes, dtypes and counts, sizes checked against tensors. */
#include <string.h>
#include <sys/stat.h>

#include "fuzz_file.h"
#include "moe.h"

static char lm_dir[512], lm_weights[600], lm_config[600];

static void lm_dir_remove(void) {
  unlink(lm_weights);
  unlink(lm_config);
  rmdir(lm_dir);
}

static void write_file(const char *path, const uint8_t *data, size_t n) {
  FILE *fp = fopen(path, "wb");
  if (!fp || (n && fwrite(data, 1, n, fp) != n) || fclose(fp)) abort();
}

/* The checkpoint directory of a config.json input: its config and weights, or a link to the family's. */
static const char *lm_checkpoint(const uint8_t *data, size_t n) {
  static const char *const fams[][2] = {{"qwen2_moe", "qwen2_moe"}, {"qwen3_moe", "qwen3_moe"}, {"olmoe", "olmoe"},
                                        {"gpt_oss", "gpt_oss"}, {"mxfp4", "gpt_oss_mxfp4"}}; /* name, fixture */
  const uint8_t *nul = memchr(data, 0, n);
  size_t nc = nul ? (size_t)(nul - data) : n;
  const char *fam = "mixtral";
  for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++)
    if (memmem(data, nc, fams[i][0], strlen(fams[i][0]))) fam = fams[i][1];
  if (!lm_dir[0]) {
    const char *tmp = getenv("TMPDIR");
    snprintf(lm_dir, sizeof lm_dir, "%s/moe-fuzz-%ld-lm", tmp && *tmp ? tmp : "/tmp", (long)getpid());
    snprintf(lm_weights, sizeof lm_weights, "%s/model.safetensors", lm_dir);
    snprintf(lm_config, sizeof lm_config, "%s/config.json", lm_dir);
    if (mkdir(lm_dir, 0755) != 0) abort();
    atexit(lm_dir_remove);
  }
  char src[600];
  snprintf(src, sizeof src, "%s/lm/%s/model.safetensors", MOE_FIXTURE_DIR, fam);
  unlink(lm_weights);
  write_file(lm_config, data, nc);
  if (nul) write_file(lm_weights, nul + 1, n - nc - 1);
  else if (symlink(src, lm_weights) != 0) abort();
  return lm_dir;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  if (n && data[0] == '{') {
    moe_lm_t lm;
    if (moe_lm_load(&lm, lm_checkpoint(data, n), NULL) == MOE_OK) moe_lm_free(&lm);
    return 0;
  }
  const char *path = fuzz_file(0, "ck.safetensors", data, n);
  moe_model_t m;
  moe_optim_t o;
  moe_train_state ts;
  if (moe_checkpoint_load(path, &m, &o, &ts) == MOE_OK) moe_optim_free(&o), moe_model_free(&m);
  for (int K = 0; K < 2; K++)
    if (moe_checkpoint_load_serving(path, &m, K, MOE_CACHE_LRU, -1) == MOE_OK) moe_model_free(&m);
  return 0;
}
