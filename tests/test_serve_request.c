/* moe serve's request parser (moe_request_parse_completion) and UTF-8 cleaning (moe__utf8_clean) alone. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/utf8.h"
#include "test.h"

static moe_status parse(const char *body, moe_request *c) {
  return moe_request_parse_completion(body, strlen(body), NULL, 50, 16, c);
}

TEST(serve_request_parse_fields_defaults_and_errors) {
  moe_request c;
  ASSERT_OK(parse("{\"prompt\": [3, 4], \"model\": \"x\", \"n\": 1}", &c));
  ASSERT(c.n_ids == 2 && c.ids[0] == 3 && c.ids[1] == 4 && c.max_tokens == 14 && c.temperature == 1 &&
         c.top_p == 1 && c.seed == 0 && !c.stream); /* the default 16, cut to the context */
  moe_request_free(&c);
  ASSERT_OK(parse("{\"prompt\": [0], \"max_tokens\": 15, \"temperature\": 0, \"top_p\": 0.5, \"seed\": 9, "
                  "\"stream\": true}", &c));
  ASSERT(c.max_tokens == 15 && c.temperature == 0 && c.top_p == 0.5f && c.seed == 9 && c.stream && !c.echo);
  moe_request_free(&c);
  ASSERT_OK(parse("{\"prompt\": [0, 1], \"max_tokens\": 0, \"echo\": true, \"logprobs\": 1}", &c)); /* scoring */
  ASSERT(c.max_tokens == 0 && c.echo && c.logprobs && c.top_logprobs == 1);
  moe_request_free(&c);
  static const char *const bad[][2] = {
      {"{\"prompt\": [1], \"max_tokens\": 16}", "exceed the model's context of 16"},
      {"{\"prompt\": \"hi\"}", "no tokenizer.json"},
      {"{\"prompt\": [50]}", "\"prompt\"[0] is not a token id in [0, 50)"},
      {"{\"prompt\": [1], \"seed\": 1.5}", "\"seed\" must be an integer"},
      {"{\"prompt\": [1], \"stream\": 1}", "\"stream\" must be true or false"},
      {"{\"prompt\": [1], \"max_tokens\": 0}", "\"max_tokens\" must be in [1, 16]"},
      {"{\"prompt\": [1], \"max_tokens\": 0, \"echo\": false}", "\"max_tokens\" must be in [1, 16]"},
      {"{\"prompt\": [1]} x", "garbage after the JSON body"},
      {"{\"prompt\": [1]", "not valid JSON"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    moe_status st = parse(bad[i][0], &c);
    if (st == MOE_OK || !strstr(moe_last_error(), bad[i][1]))
      FAIL_("%s: status %d, '%s', want '%s'", bad[i][0], st, moe_last_error(), bad[i][1]);
    ASSERT(!c.ids);
  }
}

TEST(serve_utf8_clean_holds_split_characters) {
  char out[64];
  size_t used;
  /* e-acute split after its first byte: held, then whole with the next piece */
  ASSERT_EQ_INT((int)moe__utf8_clean("caf\xc3", 4, 0, out, &used), 3);
  ASSERT_EQ_INT((int)used, 3);
  size_t w = moe__utf8_clean("\xc3\xa9!", 3, 1, out, &used);
  ASSERT(w == 3 && !memcmp(out, "\xc3\xa9!", 3) && used == 3);
  /* a byte that can start nothing, a surrogate, and a split sequence at the end: U+FFFD each */
  w = moe__utf8_clean("a\xff\xed\xa0\x80\xe2\x82", 7, 1, out, &used);
  const char want[] = "a\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd";
  if (w != sizeof want - 1 || memcmp(out, want, w)) FAIL_("cleaned to %zu bytes", w);
  ASSERT_EQ_INT((int)used, 7);
}

/* A prompt whose tokenizer gives more ids than the text has bytes (Llama 2's: "\n" is "▁" and <0x0A>)
 * is encoded whole (the request's ids have room for them). */
TEST(serve_request_prompt_with_more_ids_than_bytes) {
  char path[1024];
  snprintf(path, sizeof path, "%s/../../data/tokenizers/llama2/tokenizer.json", test_fixture_dir());
  moe_tokenizer *t;
  if (access(path, R_OK)) SKIP("no data/tokenizers/llama2 (scripts/get-tokenizers.sh fetches it)");
  ASSERT_OK(moe_tokenizer_load(&t, path));
  moe_request c;
  const char *body = "{\"prompt\": \"\\n\\n\", \"max_tokens\": 1}";
  moe_status st = moe_request_parse_completion(body, strlen(body), t, moe_tokenizer_vocab_size(t), 64, &c);
  if (st != MOE_OK) FAIL_("%s", moe_last_error());
  int32_t *want = NULL;
  size_t n = 0;
  ASSERT_OK(moe_tokenizer_encode_alloc(t, "\n\n", 2, 0, &want, &n));
  ASSERT(n > 2);
  ASSERT_EQ_INT(c.n_ids, (int)n);
  ASSERT(!memcmp(c.ids, want, n * sizeof *want));
  free(want);
  moe_request_free(&c);
  moe_tokenizer_free(t);
}
