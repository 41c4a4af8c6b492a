/* moe generate --dtype bf16 (issue 36): the experts' GEMMs in bf16, as the library runs them. Greedy
 * tokens equal the argmax chain of full forwards of a bf16 model loaded through the library (no cache,
 * so another path than generate's decode); a dtype other than f32 or bf16 is refused naming --dtype. */
#include <string.h>

#include "run_cli.h"
#include "test.h"

TEST(generate_dtype_bf16_greedy_matches_full_forwards) {
  char dir[512], args[1200], out[512], err[512], text[256];
  snprintf(dir, sizeof dir, "%s/lm/mixtral", test_fixture_dir());
  test_tmp_path("gen_bf16.txt", out, sizeof out);
  snprintf(args, sizeof args, "generate --checkpoint %s --prompt-ids '5 9 1' --max-tokens 6 --temperature 0 "
           "--ignore-eos --dtype bf16", dir);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  test_read_text(out, text, sizeof text);
  moe_lm_config c;
  ASSERT_OK(moe_lm_read_config(dir, &c));
  c.moe.dtype = MOE_DT_BF16;
  moe_lm_t m;
  ASSERT_OK(moe_lm_load(&m, dir, &c));
  int32_t seq[9] = {5, 9, 1};
  char want[256] = "";
  size_t at = 0;
  for (int n = 3; n < 9; n++) {
    if (moe_lm_forward(&m, seq, NULL, 1, n, NULL)) FAIL_("forward: %s", moe_last_error());
    uint64_t rng = 0;
    ASSERT_OK(moe_lm_sample(moe_lm_logits(&m) + (size_t)(n - 1) * m.cfg.vocab, m.cfg.vocab, 0, 1, &rng, &seq[n]));
    at += (size_t)snprintf(want + at, sizeof want - at, "%s%d", n > 3 ? " " : "", seq[n]);
  }
  moe_lm_free(&m);
  snprintf(want + at, sizeof want - at, "\n");
  if (strcmp(text, want)) FAIL_("generate --dtype bf16 printed '%s', bf16 full forwards give '%s'", text, want);
  snprintf(args, sizeof args, "generate --checkpoint %s --prompt-ids '5 9 1' --dtype f16", dir);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 1);
  ASSERT(strstr(err, "--dtype"));
}
