/* The official OpenAI JavaScript client (npm openai, fetched by scripts/get-openai-client.sh) against
 * moe serve (tests/openai_client.mjs under node): completions and chat, streamed and not, stop
 * sequences and logprobs equal to moe generate's or the unstreamed answer's; bad requests 4xx errors
 * the client raises with the server's message. Skipped without node or the package. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run_cli.h"
#include "test.h"

TEST(openai_client_against_serve) {
  char pkg[1024], ck[512], tok[1100], log[512], cmd[4096];
  snprintf(pkg, sizeof pkg, "%s/../../data/npm/openai", test_fixture_dir());
  snprintf(tok, sizeof tok, "%s/index.mjs", pkg);
  if (access(tok, R_OK)) SKIP("no data/npm/openai (scripts/get-openai-client.sh fetches it)");
  if (system("node -e 'process.exit(+process.versions.node.split(\".\")[0] >= 18 ? 0 : 1)' >/dev/null 2>&1"))
    SKIP("no node >= 18");
  /* a random model over a byte-level tokenizer trained on a few sentences */
  const char *text = "the cat sat on the mat. experts route every token to two of four experts. "
                     "a dog ran to the park. caf\xc3\xa9 na\xc3\xafve \xe2\x82\xac. be brief.";
  moe_tokenizer *t;
  moe_lm_config c;
  moe_lm_t m;
  test_tmp_path("openai_lm", ck, sizeof ck);
  snprintf(tok, sizeof tok, "%s/tokenizer.json", ck);
  ASSERT_OK(moe_tokenizer_train(&t, text, strlen(text), 300));
  moe_lm_config_default(&c);
  c.vocab = moe_tokenizer_vocab_size(t);
  c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 8, c.max_seq = 64;
  c.moe.D = 32, c.moe.H = 32, c.moe.E = 4, c.moe.threads = 1;
  ASSERT_OK(moe_lm_init(&m, &c));
  moe_lm_init_params(&m, 5);
  ASSERT_OK(moe_lm_save(&m, ck));
  ASSERT_OK(moe_tokenizer_save(t, tok));
  moe_lm_free(&m);
  moe_tokenizer_free(t);
  test_tmp_path("openai_client.log", log, sizeof log);
  snprintf(cmd, sizeof cmd, "node '%s/../openai_client.mjs' '%s' '%s' '%s' >'%s' 2>&1", test_fixture_dir(), MOE_CLI, ck,
           pkg, log);
  int rc = system(cmd);
  char *out = test_read_file(log, NULL);
  fprintf(stderr, "%s", out ? out : "  (no output)\n");
  free(out);
  ASSERT_EQ_INT(rc, 0);
}
