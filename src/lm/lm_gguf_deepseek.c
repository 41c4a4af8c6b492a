/* DeepSeek-V2/V3 in GGUF files as llama.cpp's deepseek2 architecture (lm_gguf.h): the keys of its
 * converter (convert_hf_to_gguf.py's DeepseekV2Model, February 2025) and of its loader and graph
 * (llama-model.cpp's LLM_ARCH_DEEPSEEK2, build_deepseek2, llm_build_moe_ffn), read into the config and
 * written from it. What those keys cannot say is refused when writing, naming the setting: a file
 * libmoe writes computes what the model did. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "lm_family.h"
#include "lm_gguf.h"

#define ARCH "deepseek2"

static const char *key(char *buf, const char *suffix) { return moe__lm_gguf_key(buf, ARCH, suffix); }
static int has_key(const moe_gguf *g, const char *suffix) { return moe__lm_gguf_has(g, ARCH, suffix); }

/* llama.cpp's expert_gating_func values (gguf-py's ExpertGatingFuncType) */
enum { GATING_SOFTMAX = 1, GATING_SIGMOID = 2 };

int moe__lm_gguf_is_deepseek(moe_lm_family f) { return f == MOE_LM_DEEPSEEK_V2 || f == MOE_LM_DEEPSEEK_V3; }



/* A count that may be 0 (u32); *out left as it is when absent. */
static moe_status get_uint(const moe_gguf *g, const char *suffix, int *out) {
  char k[128];
  if (moe_gguf_find_key(g, key(k, suffix)) < 0) return MOE_OK;
  uint32_t v;
  MOE_CHECK(moe_gguf_get_u32(g, k, &v));
  MOE_TRY(v <= INT32_MAX, MOE_ERR_FORMAT, "%s: %s is %u, too large", moe_gguf_path(g), k, v);
  *out = (int)v;
  return MOE_OK;
}


/* The fewest significant digits of a decimal that reads back as x (config.json's number), and it. */
static int shortest(float x, double *d) {
  for (int digits = 1; digits < 9; digits++) {
    char b[32];
    snprintf(b, sizeof b, "%.*g", digits, (double)x);
    if ((float)(*d = strtod(b, NULL)) == x) return digits;
  }
  *d = x;
  return 9;
}

/* yarn_log_multiplier as the converter computes it, 0.1 x mscale_all_dim in double from config.json's
 * decimal, then stored as a float. */
static float log_multiplier(float mscale_all_dim) {
  double d;
  shortest(mscale_all_dim, &d);
  return (float)(0.1 * d);
}

/* mscale_all_dim back: of the floats near log_mul / 0.1 that give log_mul (a float tenth apart is
 * closer than the floats near it, so several may), the one of the shortest decimal. */
static float mscale_all_dim_of(float log_mul) {
  float m = (float)(log_mul / 0.1), best = m;
  int best_digits = 10;
  for (int i = 0; i < 8; i++) m = nextafterf(m, -INFINITY);
  for (int i = 0; i <= 16; i++, m = nextafterf(m, INFINITY)) {
    double d;
    int n = shortest(m, &d);
    if (log_multiplier(m) == log_mul && n < best_digits) best = m, best_digits = n;
  }
  return best;
}

/* rope.scaling.*: none, or YaRN as build_deepseek2 computes it: ggml's ramp (floored and ceiled ends)
 * between its default betas 32 and 1, cos and sin unscaled (DeepSeek's mscale equal to mscale_all_dim),
 * the softmax scale times (1 + yarn_log_multiplier ln factor)^2, yarn_log_multiplier being 0.1
 * mscale_all_dim as the converter writes it. */
static moe_status read_yarn(const moe_gguf *g, moe_lm_config *c) {
  moe_lm_yarn y = {0, c->max_seq, 32, 1, 0, 0, 1};
  int on;
  MOE_CHECK(moe__lm_gguf_read_yarn(g, ARCH, &y, &on));
  if (!on) return MOE_OK;
  float log_mul = 0;
  MOE_CHECK(moe__lm_gguf_real(g, ARCH, "rope.scaling.yarn_log_multiplier", 0, &log_mul));
  y.mscale = y.mscale_all_dim = mscale_all_dim_of(log_mul);
  c->yarn = y;
  return MOE_OK;
}

/* Keys of llama.cpp's later deepseek2 files and others that change what the model computes. */
static moe_status refuse_keys(const moe_gguf *g) {
  static const char *const later[] = {"attention.key_length_mla", "attention.value_length_mla",
                                      "rope.scaling.attn_factor", "expert_group_count",
                                      "expert_group_used_count", "attention.sliding_window"};
  char k[128];
  for (size_t i = 0; i < sizeof later / sizeof *later; i++)
    MOE_TRY(!has_key(g, later[i]), MOE_ERR_FORMAT,
            "%s: %s is not supported (the February 2025 deepseek2 layout: attn_kv_b whole, no expert groups)",
            moe_gguf_path(g), key(k, later[i]));
  return MOE_OK;
}

moe_status moe__lm_gguf_read_deepseek(const moe_gguf *g, moe_lm_config *c) {
  const char *path = moe_gguf_path(g);
  char k[128];
  MOE_CHECK(refuse_keys(g));
  moe_lm_mla *a = &c->mla;
  int key_len = 0, rope = 0, shared = 0, first_k = 0;
  MOE_CHECK(moe__lm_gguf_count(g, ARCH, "attention.kv_lora_rank", 1, &a->kv_lora_rank));
  MOE_CHECK(moe__lm_gguf_count(g, ARCH, "attention.q_lora_rank", 0, &a->q_lora_rank)); /* absent: attn_q */
  MOE_CHECK(moe__lm_gguf_count(g, ARCH, "attention.key_length", 1, &key_len));
  MOE_CHECK(moe__lm_gguf_count(g, ARCH, "attention.value_length", 1, &a->v_head_dim));
  MOE_CHECK(moe__lm_gguf_count(g, ARCH, "rope.dimension_count", 1, &rope));
  MOE_TRY(rope < key_len, MOE_ERR_FORMAT, "%s: deepseek2.rope.dimension_count %d is not less than %s %d", path, rope,
          key(k, "attention.key_length"), key_len);
  MOE_TRY(c->n_kv_heads == c->n_heads, MOE_ERR_FORMAT, "%s: %s %d is not attention.head_count %d", path,
          key(k, "attention.head_count_kv"), c->n_kv_heads, c->n_heads);
  c->head_dim = rope;
  a->qk_nope_dim = key_len - rope;
  a->rope_interleave = 1; /* llama.cpp ropes deepseek2 by adjacent pairs (LLAMA_ROPE_TYPE_NORM) */
  MOE_CHECK(moe__lm_gguf_count(g, ARCH, "expert_feed_forward_length", 1, &c->moe.H));
  MOE_CHECK(get_uint(g, "expert_shared_count", &shared));
  c->moe.shared_H = shared * c->moe.H;
  c->moe.shared_gate = 0;
  MOE_CHECK(get_uint(g, "leading_dense_block_count", &first_k));
  MOE_TRY(first_k < c->n_layers, MOE_ERR_FORMAT, "%s: %s %d leaves no MoE layer of %d", path,
          key(k, "leading_dense_block_count"), first_k, c->n_layers);
  for (int i = 0; i < first_k; i++) c->dense_layers[i / 8] |= (uint8_t)(1u << (i % 8));
  if (first_k) {
    MOE_CHECK(moe__lm_gguf_count(g, ARCH, "feed_forward_length", 1, &c->dense_H));
  }
  /* llm_build_moe_ffn: scores by the gating function, the selection bias exp_probs_b added to choose,
   * the chosen scores renormalized when expert_weights_norm, then times expert_weights_scale */
  uint32_t gating = GATING_SOFTMAX; /* llama.cpp's default for files without the key (V2, V2.5) */
  if (has_key(g, "expert_gating_func")) MOE_CHECK(moe_gguf_get_u32(g, key(k, "expert_gating_func"), &gating));
  MOE_TRY(gating == GATING_SOFTMAX || gating == GATING_SIGMOID, MOE_ERR_FORMAT,
          "%s: %s %u is not supported (1 softmax, 2 sigmoid)", path, key(k, "expert_gating_func"), gating);
  moe_layer_config *l = &c->moe;
  l->score = gating == GATING_SIGMOID ? MOE_SCORE_SIGMOID : MOE_SCORE_SOFTMAX;
  char name[64];
  snprintf(name, sizeof name, "blk.%d.exp_probs_b.bias", first_k);
  l->select_bias = moe_gguf_has_tensor(g, name);
  l->normalize_topk = 0;
  if (has_key(g, "expert_weights_norm")) MOE_CHECK(moe_gguf_get_bool(g, key(k, "expert_weights_norm"), &l->normalize_topk));
  l->routed_scale = 1.0f;
  MOE_CHECK(moe__lm_gguf_real(g, ARCH, "expert_weights_scale", 1, &l->routed_scale));
  l->n_group = l->topk_group = 0;
  /* DeepSeek-V2's modeling file scales only unnormalized weights: a file that normalizes and scales is
   * V3's layout (which a V2 config.json could not say) */
  int v3 = l->score == MOE_SCORE_SIGMOID || l->select_bias || (l->normalize_topk && l->routed_scale != 1.0f);
  c->family = v3 ? MOE_LM_DEEPSEEK_V3 : MOE_LM_DEEPSEEK_V2;
  return read_yarn(g, c);
}

moe_status moe__lm_gguf_check_deepseek(const moe_lm_config *c, const char *path) {
  const moe_layer_config *l = &c->moe;
  int first_k, freq;
  MOE_TRY(moe__lm_deepseek_layers(c, &first_k, &freq) && freq == 1, MOE_ERR_ARG,
          "%s: moe_layer_freq %d (MoE layers not all those after the leading dense ones) has no key in llama.cpp's "
          "deepseek2 (only leading_dense_block_count)", path, freq);
  MOE_TRY(!l->n_group || l->topk_group >= l->n_group, MOE_ERR_ARG,
          "%s: group-limited routing (n_group %d, topk_group %d) has no key in llama.cpp's deepseek2, which routes "
          "among all experts", path, l->n_group, l->topk_group);
  MOE_TRY(c->mla.rope_interleave, MOE_ERR_ARG,
          "%s: rope_interleave false (rotate_half pairs) has no key in llama.cpp's deepseek2, which ropes adjacent "
          "pairs", path);
  const moe_lm_yarn *y = &c->yarn;
  if (y->factor == 0) return MOE_OK;
  MOE_TRY(y->beta_fast == 32 && y->beta_slow == 1, MOE_ERR_ARG,
          "%s: yarn beta_fast %g and beta_slow %g have no key in llama.cpp's deepseek2 (it takes 32 and 1)", path,
          (double)y->beta_fast, (double)y->beta_slow);
  MOE_TRY(y->mscale == y->mscale_all_dim, MOE_ERR_ARG,
          "%s: yarn mscale %g other than mscale_all_dim %g has no key in llama.cpp's deepseek2 (its rotary tables "
          "are unscaled, as when the two are equal)", path, (double)y->mscale, (double)y->mscale_all_dim);
  MOE_TRY(y->truncate, MOE_ERR_ARG, "%s: yarn truncate false has no key in llama.cpp's deepseek2 (ggml floors and "
          "ceils the ramp's ends)", path);
  MOE_TRY(mscale_all_dim_of(log_multiplier(y->mscale_all_dim)) == y->mscale_all_dim, MOE_ERR_ARG,
          "%s: yarn mscale_all_dim %.9g does not survive as yarn_log_multiplier 0.1 x it in float", path,
          (double)y->mscale_all_dim);
  return MOE_OK;
}

moe_status moe__lm_gguf_write_deepseek(moe_gguf_writer *w, const moe_lm_config *c) {
  const moe_layer_config *l = &c->moe;
  const moe_lm_mla *a = &c->mla;
  int first_k = 0, freq = 1;
  moe__lm_deepseek_layers(c, &first_k, &freq);
  char k[128];
  MOE_CHECK(moe__lm_gguf_set_u32(w, ARCH, "leading_dense_block_count", first_k));
  MOE_CHECK(moe__lm_gguf_set_u32(w, ARCH, "vocab_size", c->vocab));
  if (a->q_lora_rank) MOE_CHECK(moe__lm_gguf_set_u32(w, ARCH, "attention.q_lora_rank", a->q_lora_rank));
  MOE_CHECK(moe__lm_gguf_set_u32(w, ARCH, "attention.kv_lora_rank", a->kv_lora_rank));
  MOE_CHECK(moe__lm_gguf_set_u32(w, ARCH, "attention.key_length", a->qk_nope_dim + c->head_dim));
  MOE_CHECK(moe__lm_gguf_set_u32(w, ARCH, "attention.value_length", a->v_head_dim));
  MOE_CHECK(moe__lm_gguf_set_u32(w, ARCH, "expert_feed_forward_length", l->H));
  MOE_CHECK(moe__lm_gguf_set_u32(w, ARCH, "expert_count", l->E));
  MOE_CHECK(moe__lm_gguf_set_u32(w, ARCH, "expert_shared_count", l->shared_H / l->H));
  MOE_CHECK(moe__lm_gguf_set_f32(w, ARCH, "expert_weights_scale", l->routed_scale));
  MOE_CHECK(moe_gguf_writer_set_bool(w, key(k, "expert_weights_norm"), l->normalize_topk == 1 ||
                                     (l->normalize_topk < 0 && l->top_k > 1)));
  MOE_CHECK(moe__lm_gguf_set_u32(w, ARCH, "expert_gating_func",
                                 l->score == MOE_SCORE_SIGMOID ? GATING_SIGMOID : GATING_SOFTMAX));
  MOE_CHECK(moe__lm_gguf_set_u32(w, ARCH, "rope.dimension_count", c->head_dim));
  if (c->yarn.factor == 0) return MOE_OK;
  MOE_CHECK(moe_gguf_writer_set_str(w, key(k, "rope.scaling.type"), "yarn"));
  MOE_CHECK(moe__lm_gguf_set_f32(w, ARCH, "rope.scaling.factor", c->yarn.factor));
  MOE_CHECK(moe__lm_gguf_set_u32(w, ARCH, "rope.scaling.original_context_length", c->yarn.original_max_pos));
  return moe__lm_gguf_set_f32(w, ARCH, "rope.scaling.yarn_log_multiplier",
                              log_multiplier(c->yarn.mscale_all_dim));
}
