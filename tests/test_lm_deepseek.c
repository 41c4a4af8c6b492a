/* The DeepSeek-V2 / V2-Lite / V3 families against the float64 PyTorch reference of dev/deepseek_ref.py
 * (tests/fixtures/lm/deepseek_*: Hugging Face checkpoint directories in DeepSeek's layout; q_lora_rank
 * null and set, a dense first layer, greedy, group-limited and noaux_tc routing, YaRN, interleaved and
 * rotate_half rotary): logits, loss and every gradient; the latent KV cache's decode against the full
 * forward; save and load; training from a loaded checkpoint; multi-token-prediction layers skipped;
 * config.json errors naming the file and the field. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "lm_check.h"
#include "test.h"

static const char *const cases[] = {"deepseek_v2_lite", "deepseek_v2", "deepseek_v3", "deepseek_v3_rotate_half"};
#define NCASES (int)(sizeof cases / sizeof cases[0])

TEST(lm_matches_pytorch_deepseek_v2_lite) { ASSERT(lm_check_case("deepseek_v2_lite")); }
TEST(lm_matches_pytorch_deepseek_v2) { ASSERT(lm_check_case("deepseek_v2")); }
TEST(lm_matches_pytorch_deepseek_v3) { ASSERT(lm_check_case("deepseek_v3")); }
TEST(lm_matches_pytorch_deepseek_v3_rotate_half) { ASSERT(lm_check_case("deepseek_v3_rotate_half")); }

/* The fixture's tokens (B, T), malloc'd. */
static int32_t *ds_tokens(const char *dir, int *B, int *T) {
  char path[700];
  snprintf(path, sizeof path, "%s/ref.safetensors", dir);
  moe_st *f = NULL;
  moe_tensor_view v;
  int32_t *out = NULL;
  if (moe_st_open(&f, path) == MOE_OK && moe_st_get(f, "tokens", &v) == MOE_OK && (out = malloc(v.nbytes))) {
    memcpy(out, v.data, v.nbytes);
    *B = (int)v.shape[0], *T = (int)v.shape[1];
  }
  moe_st_close(f);
  return out;
}

/* The config.json fields as read: the latent attention, YaRN, the router and the layer kinds. */
TEST(lm_deepseek_config_fields) {
  char dir[512];
  moe_lm_config c;
  ASSERT_OK(moe_lm_read_config(lm_case_dir("deepseek_v3", dir, sizeof dir), &c));
  ASSERT(c.family == MOE_LM_DEEPSEEK_V3 && c.head_dim == 8 && c.n_kv_heads == 4 && c.aux_coef == 0);
  ASSERT(c.mla.kv_lora_rank == 12 && c.mla.q_lora_rank == 12 && c.mla.qk_nope_dim == 6 && c.mla.v_head_dim == 5 &&
         c.mla.rope_interleave == 1);
  ASSERT(c.yarn.factor == 8 && c.yarn.original_max_pos == 64 && c.yarn.mscale == 1 && c.yarn.mscale_all_dim == 0.8f &&
         c.yarn.beta_fast == 32 && c.yarn.beta_slow == 1 && c.yarn.truncate == 1);
  ASSERT(c.moe.score == MOE_SCORE_SIGMOID && c.moe.select_bias && c.moe.n_group == 4 && c.moe.topk_group == 2 &&
         c.moe.group_score == MOE_GROUP_TOP2_SUM && c.moe.normalize_topk == 1 && c.moe.routed_scale == 2.5f);
  ASSERT(c.moe.E == 8 && c.moe.H == 10 && c.moe.shared_H == 10 && !c.moe.shared_gate && c.dense_H == 24);
  ASSERT(moe_lm_layer_dense(&c, 0) && !moe_lm_layer_dense(&c, 1) && !moe_lm_layer_dense(&c, 2));
  ASSERT_OK(moe_lm_read_config(lm_case_dir("deepseek_v2_lite", dir, sizeof dir), &c));
  ASSERT(c.family == MOE_LM_DEEPSEEK_V2 && c.mla.q_lora_rank == 0 && c.yarn.factor == 0);
  ASSERT(c.moe.score == MOE_SCORE_SOFTMAX && !c.moe.select_bias && c.moe.n_group == 0 && c.moe.normalize_topk == 0 &&
         c.moe.routed_scale == 1.5f && c.moe.shared_H == 20);
  ASSERT_OK(moe_lm_read_config(lm_case_dir("deepseek_v2", dir, sizeof dir), &c));
  ASSERT(c.moe.n_group == 3 && c.moe.topk_group == 2 && c.moe.group_score == MOE_GROUP_MAX && c.yarn.mscale == 0.707f);
}

/* Each case position by position through the latent KV cache (three tokens at once, then one, then the
 * rest; the decode's attention runs on the latent with the projections absorbed), against one forward of
 * the whole sequences; the cache's bytes per token beside those of the same heads' plain K/V cache. */
TEST(lm_deepseek_latent_cache_decode_matches_full_forward) {
  for (int ci = 0; ci < NCASES; ci++) {
    char dir[512];
    moe_lm_t m;
    int B, T;
    ASSERT_OK(moe_lm_load(&m, lm_case_dir(cases[ci], dir, sizeof dir), NULL));
    int32_t *t = ds_tokens(dir, &B, &T);
    ASSERT(t && T >= 5);
    size_t V = (size_t)m.cfg.vocab;
    float *full = malloc((size_t)B * T * V * 4);
    int32_t *in = malloc((size_t)B * T * 4);
    ASSERT(full && in);
    ASSERT_OK(moe_lm_forward(&m, t, NULL, B, T, NULL));
    memcpy(full, moe_lm_logits(&m), (size_t)B * T * V * 4);
    moe_lm_cache *kv;
    ASSERT_OK(moe_lm_cache_new(&kv, &m, B));
    const int steps[3][2] = {{0, 3}, {3, 1}, {4, T - 4}};
    double worst = 0;
    for (int s = 0; s < 3; s++) {
      int p = steps[s][0], n = steps[s][1];
      for (int b = 0; b < B; b++) memcpy(in + b * n, t + b * T + p, (size_t)n * 4);
      moe_status st = moe_lm_decode(&m, kv, in, n);
      if (st) FAIL_("%s decode: %s", cases[ci], moe_last_error());
      for (int b = 0; b < B; b++)
        for (size_t i = 0; i < n * V; i++)
          worst = fmax(worst, fabs(moe_lm_logits(&m)[(size_t)b * n * V + i] - full[((size_t)b * T + p) * V + i]));
    }
    ASSERT_EQ_INT(moe_lm_cache_len(kv), T);
    /* the slot API too: slot 1 alone, from nothing, gives row 1's logits */
    int slot = 1;
    moe_lm_cache_slot_reset(kv, slot);
    ASSERT_OK(moe_lm_decode_slots(&m, kv, &slot, 1, t + T, T));
    for (size_t i = 0; i < T * V; i++) worst = fmax(worst, fabs(moe_lm_logits(&m)[i] - full[(size_t)T * V + i]));
    const moe_lm_config *c = &m.cfg;
    fprintf(stderr, "  %s: latent cache decode vs full forward: max logit diff %.3g; cache %d floats per token and "
            "layer (a K/V cache of the same heads: %d)\n", cases[ci], worst, c->mla.kv_lora_rank + c->head_dim,
            c->n_heads * (c->mla.qk_nope_dim + c->head_dim + c->mla.v_head_dim));
    moe_lm_cache_free(kv);
    moe_lm_free(&m);
    free(full), free(in), free(t);
    ASSERT(worst < 1e-5);
  }
}
