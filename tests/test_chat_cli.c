/* moe chat: each line of standard input is a user turn answered through the checkpoint's chat template;
 * the printed answers (greedy) equal decoding the rendered conversation so far with the library (the
 * template rendered by moe_chat_template_render_config, encoded with special tokens, argmax tokens until
 * the end of text), the first answer joining the conversation before the second turn. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/utf8.h"
#include "test.h"

#define TEMPLATE "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\\n{% endfor %}" \
                 "{% if add_generation_prompt %}a:{% endif %}"

/* A random model with a tokenizer trained on a few sentences and the template above; 0 on failure. */
static int make_checkpoint(const char *dir) {
  const char *text = "the cat sat on the mat. a dog ran to the park. experts route every token.";
  moe_tokenizer *t;
  moe_lm_config c;
  moe_lm_t m;
  char path[700];
  if (moe_tokenizer_train(&t, text, strlen(text), 290)) return 0;
  moe_lm_config_default(&c);
  c.vocab = moe_tokenizer_vocab_size(t);
  c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 1, c.head_dim = 8, c.max_seq = 128;
  c.moe.D = 16, c.moe.H = 16, c.moe.E = 4, c.moe.threads = 1;
  int ok = moe_lm_init(&m, &c) == MOE_OK;
  if (ok) {
    moe_lm_init_params(&m, 3);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    ok = moe_lm_save(&m, dir) == MOE_OK && moe_tokenizer_save(t, path) == MOE_OK;
    moe_lm_free(&m);
  }
  moe_tokenizer_free(t);
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  FILE *f = ok ? fopen(path, "w") : NULL;
  ok = f && fprintf(f, "{\"chat_template\": \"%s\"}", TEMPLATE) > 0;
  if (f) ok &= !fclose(f);
  return ok;
}

/* The greedy answer (at most 6 tokens, to the end of text) to the conversation conv (a JSON list). */
static char *answer(const char *dir, moe_lm_t *m, const moe_tokenizer *t, const char *conv) {
  char *text = NULL, *out = NULL;
  size_t len = 0, n = 0;
  int32_t *ids = NULL, eot = moe_tokenizer_token_id(t, MOE_TOKENIZER_EOT), got[6];
  int k = 0;
  moe_lm_cache *kv = NULL;
  if (moe_chat_template_render_config(dir, conv, 1, -1, &text, &len) ||
      moe_tokenizer_encode_alloc(t, text, len, MOE_TOKENIZER_SPECIAL, &ids, &n) || moe_lm_cache_new(&kv, m, 1) ||
      moe_lm_decode(m, kv, ids, (int)n))
    goto done;
  const float *l = moe_lm_logits(m) + (n - 1) * (size_t)m->cfg.vocab;
  for (; k < 6; k++) {
    uint64_t rng = 0;
    moe_lm_sample(l, m->cfg.vocab, 0, 1, &rng, &got[k]);
    if (got[k] == eot || moe_lm_decode(m, kv, &got[k], 1)) break;
    l = moe_lm_logits(m);
  }
  char *raw = NULL;
  size_t used;
  if (moe_tokenizer_decode_alloc(t, got, (size_t)k, &raw, &len) == MOE_OK && (out = malloc(3 * len + 1)))
    out[moe__utf8_clean(raw, len, 1, out, &used)] = 0; /* as a stream shows it: bytes not UTF-8 as U+FFFD */
  free(raw);
done:
  moe_lm_cache_free(kv);
  free(text), free(ids);
  return out;
}

static char *json_text(const char *s) { /* s as a JSON string */
  cJSON *v = cJSON_CreateString(s);
  char *o = cJSON_PrintUnformatted(v);
  cJSON_Delete(v);
  return o;
}

TEST(chat_cli_answers_through_the_template) {
  char dir[512], in[512], out[512], cmd[2048], path[600];
  test_tmp_path("chat_ck", dir, sizeof dir);
  ASSERT(make_checkpoint(dir));
  test_tmp_path("chat_in.txt", in, sizeof in);
  test_tmp_path("chat_out.txt", out, sizeof out);
  FILE *f = fopen(in, "w");
  ASSERT(f);
  fputs("the cat\na dog ran\n", f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "'%s' chat --checkpoint '%s' --temperature 0 --max-tokens 6 --threads 1 < '%s' > '%s'",
           MOE_CLI, dir, in, out);
  ASSERT_EQ_INT(system(cmd), 0);
  char *got = test_read_file(out, NULL);
  ASSERT(got);
  moe_lm_t m;
  moe_tokenizer *t;
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  ASSERT_OK(moe_tokenizer_load(&t, path));
  ASSERT_OK(moe_lm_load(&m, dir, NULL));
  char conv[4096];
  char *a1 = answer(dir, &m, t, "[{\"role\": \"user\", \"content\": \"the cat\"}]");
  ASSERT(a1);
  char *a1j = json_text(a1);
  snprintf(conv, sizeof conv, "[{\"role\": \"user\", \"content\": \"the cat\"}, {\"role\": \"assistant\", \"content\": %s},"
           " {\"role\": \"user\", \"content\": \"a dog ran\"}]", a1j);
  char *a2 = answer(dir, &m, t, conv);
  ASSERT(a2);
  char want[4096];
  snprintf(want, sizeof want, "%s\n%s\n", a1, a2);
  if (strcmp(got, want)) FAIL_("moe chat printed %s, the library's turns give %s", got, want);
  free(a1), free(a1j), free(a2), free(got);
  moe_lm_free(&m);
  moe_tokenizer_free(t);
}
