/* moe eval --task lm --tokens FILE (issue 39's checking interface): the loss over a file of token ids,
 * without a tokenizer, equals the mean cross-entropy of the library's forwards over the same windows
 * (every non-overlapping window of --context tokens and its next tokens); bad ids are refused by place. */
#include <stdlib.h>
#include <string.h>

#include "run_cli.h"
#include "test.h"

enum { N = 41, CTX = 8 };

TEST(eval_lm_tokens_file_matches_the_forwards) {
  char dir[512], toks[512], out[512], err[512], args[1600], text[512];
  snprintf(dir, sizeof dir, "%s/lm/mixtral", test_fixture_dir());
  test_tmp_path("eval_tokens.txt", toks, sizeof toks);
  test_tmp_path("eval_tokens.json", out, sizeof out);
  int32_t ids[N];
  FILE *f = fopen(toks, "w");
  ASSERT(f);
  for (int i = 0; i < N; i++) {
    ids[i] = (i * 7 + 3) % 64;
    fprintf(f, "%d%s", ids[i], i % 10 == 9 ? "\n" : i % 2 ? ", " : " ");
  }
  fclose(f);
  snprintf(args, sizeof args, "eval --task lm --checkpoint %s --tokens %s --context %d --json", dir, toks, CTX);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  test_read_text(out, text, sizeof text);
  const char *at = strstr(text, "\"tokens_loss\": ");
  ASSERT(at);
  double got = atof(at + strlen("\"tokens_loss\": "));
  moe_lm_t m;
  ASSERT_OK(moe_lm_load(&m, dir, NULL));
  enum { W = (N - 1) / CTX };
  int32_t x[W * CTX], y[W * CTX];
  for (int w = 0; w < W; w++) {
    memcpy(x + w * CTX, ids + w * CTX, CTX * sizeof *x);
    memcpy(y + w * CTX, ids + w * CTX + 1, CTX * sizeof *y);
  }
  moe_lm_stats st;
  ASSERT_OK(moe_lm_forward(&m, x, y, W, CTX, &st));
  moe_lm_free(&m);
  ASSERT_EQ_INT(st.tokens, W * CTX);
  if (!(got > 0 && got - st.ce < 1e-5 && st.ce - got < 1e-5)) FAIL_("eval --tokens: loss %.6f, the forwards %.6f", got, st.ce);
  f = fopen(toks, "w");
  fprintf(f, "1 2 64 3\n");
  fclose(f);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 1);
  ASSERT(strstr(err, "token 2 is not a token id in [0, 64)"));
}
