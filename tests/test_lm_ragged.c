/* moe_lm_decode_ragged: one forward of slots holding token counts of their own (a new prompt, a
 * sequence's next token, a few tokens after a cached prefix) gives each slot the logits of running it
 * alone, for every family's tiny fixture (the GQA cache, DeepSeek's latent cache, gpt-oss's sinks and
 * sliding window, the q/k norms); with moe_lm_cache_last_logits, row i is slot i's last position. To
 * rounding, not to the bit: a row alone of one token goes through the one-row product (moe__gemm_row),
 * in a batch through the BLAS's sgemm, and the GEMMs' tiles change with the rows, so the sums run in
 * other orders. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

enum { NROW = 3, MAXT = 7 };

/* Row i: slot[i], prefix[i] tokens cached before (its own decode), then count[i] tokens in the ragged one. */
static const int slot[NROW] = {3, 0, 2}, prefix[NROW] = {0, 5, 2}, count[NROW] = {6, 1, 3};

static int32_t tok(int i, int t, int V) { return (int32_t)((i * 17 + t * 5 + 3) % V); }

/* The logits (count[i], V) of row i's tokens run alone after its prefix, into out. */
static int alone(moe_lm_t *m, int i, float *out) {
  int V = m->cfg.vocab;
  int32_t in[MAXT + 6];
  for (int t = 0; t < prefix[i] + count[i]; t++) in[t] = tok(i, t, V);
  moe_lm_cache *kv;
  if (moe_lm_cache_new(&kv, m, 1)) return 0;
  int ok = (!prefix[i] || !moe_lm_decode(m, kv, in, prefix[i])) && !moe_lm_decode(m, kv, in + prefix[i], count[i]);
  if (ok) memcpy(out, moe_lm_logits(m), (size_t)count[i] * V * sizeof *out);
  moe_lm_cache_free(kv);
  return ok;
}

/* The rows' prefixes into their slots of a fresh cache of 4, then the ragged decode (last_only on or off). */
static moe_status ragged(moe_lm_t *m, moe_lm_cache **kv, int last_only) {
  int V = m->cfg.vocab;
  int32_t in[MAXT + 6], all[NROW * MAXT];
  moe_status st = moe_lm_cache_new(kv, m, 4);
  if (st) return st;
  int n = 0;
  for (int i = 0; i < NROW; i++) {
    for (int t = 0; t < prefix[i] + count[i]; t++) in[t] = tok(i, t, V);
    if (prefix[i] && (st = moe_lm_decode_slots(m, *kv, &slot[i], 1, in, prefix[i]))) return st;
    memcpy(all + n, in + prefix[i], (size_t)count[i] * sizeof *all);
    n += count[i];
  }
  moe_lm_cache_last_logits(*kv, last_only);
  return moe_lm_decode_ragged(m, *kv, slot, NROW, all, count);
}

TEST(lm_ragged_decode_equals_each_slot_alone_every_family) {
  char root[512], dir[1024];
  snprintf(root, sizeof root, "%s/lm", test_fixture_dir());
  DIR *d = opendir(root);
  ASSERT(d);
  struct dirent *de;
  int families = 0;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    snprintf(dir, sizeof dir, "%s/%s", root, de->d_name);
    moe_lm_t m;
    ASSERT_OK(moe_lm_load(&m, dir, NULL));
    int V = m.cfg.vocab;
    float *want = malloc((size_t)NROW * MAXT * V * sizeof *want), *w = want;
    ASSERT(want);
    for (int i = 0; i < NROW; i++, w += (size_t)count[i - 1] * V) ASSERT(alone(&m, i, w));
    moe_lm_cache *kv;
    ASSERT_OK(ragged(&m, &kv, 0));
    const float *got = moe_lm_logits(&m);
    double worst = 0;
    int total = 0;
    for (int i = 0; i < NROW; i++) total += count[i];
    for (size_t j = 0; j < (size_t)total * V; j++) worst = fmax(worst, fabs(got[j] - want[j]));
    for (int i = 0; i < NROW; i++) ASSERT_EQ_INT(moe_lm_cache_slot_len(kv, slot[i]), prefix[i] + count[i]);
    ASSERT_EQ_INT(moe_lm_cache_slot_len(kv, 1), 0);
    moe_lm_cache_free(kv);
    ASSERT_OK(ragged(&m, &kv, 1)); /* row i: the last of slot i's positions */
    got = moe_lm_logits(&m);
    w = want;
    for (int i = 0; i < NROW; w += (size_t)count[i] * V, i++)
      for (int v = 0; v < V; v++) worst = fmax(worst, fabs(got[(size_t)i * V + v] - w[(size_t)(count[i] - 1) * V + v]));
    fprintf(stderr, "  %s: ragged against alone: max logit diff %.3g\n", de->d_name, worst);
    ASSERT(worst < 1e-5);
    moe_lm_cache_free(kv);
    free(want);
    moe_lm_free(&m);
    families++;
  }
  closedir(d);
  ASSERT(families >= 10);
}

/* Bad counts name what is wrong; nothing is appended to the cache. */
TEST(lm_ragged_decode_bad_counts_are_errors) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/lm/mixtral", test_fixture_dir());
  moe_lm_t m;
  ASSERT_OK(moe_lm_load(&m, dir, NULL));
  moe_lm_cache *kv;
  ASSERT_OK(moe_lm_cache_new(&kv, &m, 2));
  int slots[2] = {0, 1}, counts[2] = {2, 0};
  int32_t tokens[80] = {0};
  ASSERT_STATUS(moe_lm_decode_ragged(&m, kv, slots, 2, tokens, NULL), MOE_ERR_ARG);
  ASSERT_STATUS(moe_lm_decode_ragged(&m, kv, slots, 2, tokens, counts), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "row 1"));
  counts[1] = m.cfg.max_seq + 1;
  ASSERT_STATUS(moe_lm_decode_ragged(&m, kv, slots, 2, tokens, counts), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "max_seq"));
  counts[1] = 3, tokens[4] = m.cfg.vocab;
  ASSERT_STATUS(moe_lm_decode_ragged(&m, kv, slots, 2, tokens, counts), MOE_ERR_VALUE);
  ASSERT(strstr(moe_last_error(), "token [1, 2]"));
  ASSERT_EQ_INT(moe_lm_cache_slot_len(kv, 0), 0);
  ASSERT_EQ_INT(moe_lm_cache_slot_len(kv, 1), 0);
  moe_lm_cache_free(kv);
  moe_lm_free(&m);
}
