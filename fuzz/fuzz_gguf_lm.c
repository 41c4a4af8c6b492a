/* libFuzzer target: a GGUF file as a language model and its tokenizer (src/lm/lm_gguf*.c,
 * src/lm/tokenizer_gguf*.c): moe_lm_read_config, then for a config of at most 2^20 parameters
 * moe_lm_load and a forward of three tokens;
 * moe_tokenizer_load and a text encoded and decoded back; the chat template rendered from the file's
 * metadata; moe_tokenizer_gguf_to_hf into a directory, whose tokenizer must load. */
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_file.h"
#include "moe.h"

static char out_dir[512], out_files[2][600];

static void out_dir_remove(void) {
  for (int i = 0; i < 2; i++) unlink(out_files[i]);
  rmdir(out_dir);
}

/* Parameters of c, roughly (the dense ones and every expert), in doubles: no overflow. */
static double params(const moe_lm_config *c) {
  double D = c->moe.D, qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
  return 2.0 * c->vocab * D + c->n_layers * (2 * qd * D + 2 * kvd * D + 3.0 * c->moe.E * c->moe.H * D +
                                             3.0 * (c->dense_H + c->moe.shared_H) * D);
}

static void model(const char *path) {
  moe_lm_config c;
  if (moe_lm_read_config(path, &c) != MOE_OK || params(&c) > (1 << 20) || c.max_seq < 3) return;
  c.moe.threads = 1;
  moe_lm_t m;
  if (moe_lm_load(&m, path, &c) != MOE_OK) return;
  int32_t t[3] = {0, c.vocab - 1, c.vocab / 2};
  moe_lm_forward(&m, t, NULL, 1, 3, NULL); /* finite weights can still overflow: an error naming the layer */
  moe_lm_free(&m);
}

static void tokenizer(const char *path) {
  moe_tokenizer *t;
  if (moe_tokenizer_load(&t, path) != MOE_OK) return;
  static const char text[] = "Hello, w\xc3\xb6rld! 123 <s> \xe6\x97\xa5\n";
  int32_t *ids = NULL;
  size_t n = 0, len = 0;
  char *back = NULL;
  if (moe_tokenizer_encode_alloc(t, text, sizeof text - 1, MOE_TOKENIZER_SPECIAL | MOE_TOKENIZER_ADD_SPECIAL, &ids, &n) ==
      MOE_OK)
    moe_tokenizer_decode_alloc(t, ids, n, &back, &len);
  free(ids);
  free(back);
  moe_tokenizer_free(t);
  char *r = NULL;
  size_t rl;
  if (moe_chat_template_render_config(path, "[{\"role\": \"user\", \"content\": \"hi\"}]", 1, 0, &r, &rl) == MOE_OK)
    free(r);
  if (!out_dir[0]) {
    const char *tmp = getenv("TMPDIR");
    snprintf(out_dir, sizeof out_dir, "%s/moe-fuzz-%ld-hf", tmp && *tmp ? tmp : "/tmp", (long)getpid());
    snprintf(out_files[0], sizeof out_files[0], "%s/tokenizer.json", out_dir);
    snprintf(out_files[1], sizeof out_files[1], "%s/tokenizer_config.json", out_dir);
    if (mkdir(out_dir, 0755) != 0) abort();
    atexit(out_dir_remove);
  }
  if (moe_tokenizer_gguf_to_hf(path, out_dir) != MOE_OK) return;
  if (moe_tokenizer_load(&t, out_dir) != MOE_OK) abort(); /* what it wrote reads back */
  moe_tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  const char *path = fuzz_file(0, "lm.gguf", data, n);
  model(path);
  tokenizer(path);
  return 0;
}
