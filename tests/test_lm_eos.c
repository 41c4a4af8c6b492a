/* The ids that end generation (moe_lm_eos_ids) from a checkpoint directory's config.json,
 * generation_config.json and tokenizer_config.json, and the tokenizer's <|endoftext|>. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "test.h"

static void put(const char *dir, const char *name, const char *text) {
  char path[700];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  if (f) fputs(text, f), fclose(f);
}

TEST(lm_eos_ids_from_every_config_file) {
  char dir[512];
  test_tmp_path("eos_ck", dir, sizeof dir);
  mkdir(dir, 0755);
  moe_tokenizer *t;
  ASSERT_OK(moe_tokenizer_train(&t, "ab ab ab", 8, 300));
  int32_t eot = moe_tokenizer_token_id(t, MOE_TOKENIZER_EOT), a = moe_tokenizer_token_id(t, "a"), ids[MOE_LM_MAX_EOS];
  ASSERT(eot >= 0 && a >= 0);
  int n = -1, V = moe_tokenizer_vocab_size(t);
  put(dir, "config.json", "{\"eos_token_id\": [3, 5]}");
  ASSERT_OK(moe_lm_eos_ids(dir, NULL, V, ids, MOE_LM_MAX_EOS, &n)); /* the other files absent */
  ASSERT(n == 2 && ids[0] == 3 && ids[1] == 5);
  put(dir, "generation_config.json", "{\"eos_token_id\": [7, 3]}");
  put(dir, "tokenizer_config.json", "{\"eos_token\": {\"content\": \"a\", \"special\": true}}");
  ASSERT_OK(moe_lm_eos_ids(dir, t, V, ids, MOE_LM_MAX_EOS, &n));
  int32_t want[] = {3, 5, 7, a, eot}; /* each once, in that order */
  ASSERT_EQ_INT(n, 5);
  for (int i = 0; i < n; i++) ASSERT_EQ_INT(ids[i], want[i]);
  ASSERT_OK(moe_lm_eos_ids(dir, NULL, V, ids, MOE_LM_MAX_EOS, &n)); /* without the tokenizer: the ids only */
  ASSERT_EQ_INT(n, 3);
  ASSERT_STATUS(moe_lm_eos_ids(dir, t, V, ids, 4, &n), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "room"));
  put(dir, "tokenizer_config.json", "{\"eos_token\": \"<|no such token|>\"}");
  ASSERT_STATUS(moe_lm_eos_ids(dir, t, V, ids, MOE_LM_MAX_EOS, &n), MOE_ERR_FORMAT);
  ASSERT(strstr(moe_last_error(), "tokenizer_config.json") && strstr(moe_last_error(), "<|no such token|>"));
  put(dir, "tokenizer_config.json", "{\"eos_token\": 3}");
  ASSERT_STATUS(moe_lm_eos_ids(dir, t, V, ids, MOE_LM_MAX_EOS, &n), MOE_ERR_FORMAT);
  put(dir, "tokenizer_config.json", "{\"eos_token\": null}");
  ASSERT_OK(moe_lm_eos_ids(dir, t, V, ids, MOE_LM_MAX_EOS, &n));
  ASSERT_EQ_INT(n, 4);
  put(dir, "generation_config.json", "{\"eos_token_id\": 100000}");
  ASSERT_STATUS(moe_lm_eos_ids(dir, t, V, ids, MOE_LM_MAX_EOS, &n), MOE_ERR_FORMAT);
  ASSERT(strstr(moe_last_error(), "generation_config.json") && strstr(moe_last_error(), "100000"));
  put(dir, "generation_config.json", "{\"eos_token_id\": [1, \"x\"]}");
  ASSERT_STATUS(moe_lm_eos_ids(dir, t, V, ids, MOE_LM_MAX_EOS, &n), MOE_ERR_FORMAT);
  put(dir, "generation_config.json", "{}");
  put(dir, "config.json", "{\"eos_token_id\": 2.5}");
  ASSERT_STATUS(moe_lm_eos_ids(dir, t, V, ids, MOE_LM_MAX_EOS, &n), MOE_ERR_FORMAT);
  ASSERT(strstr(moe_last_error(), "config.json") && strstr(moe_last_error(), "eos_token_id"));
  char none[600];
  snprintf(none, sizeof none, "%s/missing", dir);
  ASSERT_STATUS(moe_lm_eos_ids(none, t, V, ids, MOE_LM_MAX_EOS, &n), MOE_ERR_IO); /* config.json is needed */
  moe_tokenizer_free(t);
}
