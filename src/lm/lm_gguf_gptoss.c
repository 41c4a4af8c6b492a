/* gpt-oss in GGUF files as llama.cpp's gpt-oss architecture (LLM_ARCH_OPENAI_MOE; lm_gguf.h): the keys
 * its converter writes (conversion/gpt_oss.py's GptOssModel: sliding_window and
 * expert_feed_forward_length beside the common ones, the rope_scaling keys of TextModel) and its loader
 * and graph read (src/models/openai-moe.cpp: sliding_window_pattern (2 when absent, even layers
 * sliding), rope.freq_base_swa; build_moe_ffn with LLM_FFN_SWIGLU_OAI_MOE, whose alpha 1.702 and
 * limit 7 are constants, and SOFTMAX_WEIGHT gating: the softmax over the chosen logits; ggml's YaRN,
 * whose ramp ends are always floored and ceiled). What those keys cannot say is refused when writing,
 * naming the setting. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "lm_gguf.h"

#define ARCH "gpt-oss"

static const char *key(char *buf, const char *suffix) { return moe__lm_gguf_key(buf, ARCH, suffix); }
static int has_key(const moe_gguf *g, const char *suffix) { return moe__lm_gguf_has(g, ARCH, suffix); }
#define ALPHA 1.702f /* llama.cpp's build_moe_ffn: LLM_FFN_SWIGLU_OAI_MOE */
#define LIMIT 7.0f
#define PATTERN 2 /* llama.cpp's default sliding_window_pattern */




/* Layer i attends to every earlier position under llama.cpp's set_swa_pattern(n): the last of each n. */
static int full_in_pattern(int i, int n) { return i % n >= n - 1; }

/* rope.scaling.*: none, or YaRN as ggml computes it: betas from the keys (32 and 1 when absent), the
 * ramp's ends floored and ceiled (truncate), cos and sin times 0.1 ln(factor) + 1 (mscale 1,
 * mscale_all_dim 0); the keys that would change that (an attention factor, a log multiplier, an
 * extrapolation factor other than 1) are refused by name. */
static moe_status read_yarn(const moe_gguf *g, moe_lm_config *c) {
  moe_lm_yarn y = {0, c->max_seq, 32, 1, 1, 0, 1};
  int on;
  MOE_CHECK(moe__lm_gguf_read_yarn(g, ARCH, &y, &on));
  if (!on) return MOE_OK;
  char k[128];
  static const struct {
    const char *suffix;
    float value;
  } neutral[] = {{"rope.scaling.yarn_ext_factor", 1}, {"rope.scaling.yarn_attn_factor", 1},
                 {"rope.scaling.yarn_log_multiplier", 0}};
  for (int i = 0; i < 3; i++) {
    float v = neutral[i].value;
    if (has_key(g, neutral[i].suffix)) MOE_CHECK(moe_gguf_get_f32(g, key(k, neutral[i].suffix), &v));
    MOE_TRY(v == neutral[i].value, MOE_ERR_FORMAT, "%s: %s %g is not supported (only %g)", moe_gguf_path(g), k,
            (double)v, (double)neutral[i].value);
  }
  MOE_CHECK(moe__lm_gguf_real(g, ARCH, "rope.scaling.yarn_beta_fast", 1, &y.beta_fast));
  MOE_CHECK(moe__lm_gguf_real(g, ARCH, "rope.scaling.yarn_beta_slow", 1, &y.beta_slow));
  c->yarn = y;
  return MOE_OK;
}

moe_status moe__lm_gguf_read_gptoss(const moe_gguf *g, moe_lm_config *c) {
  const char *path = moe_gguf_path(g);
  char k[128];
  moe_lm_config_set_family(c, MOE_LM_GPT_OSS); /* sinks, biases, swiglu_oai (1.702, 7), softmax over the k */
  c->aux_coef = 0;
  MOE_CHECK(moe__lm_gguf_count(g, ARCH, "expert_feed_forward_length", 1, &c->moe.H));
  MOE_CHECK(moe__lm_gguf_count(g, ARCH, "attention.sliding_window", 1, &c->sliding_window));
  int n = PATTERN;
  MOE_CHECK(moe__lm_gguf_count(g, ARCH, "attention.sliding_window_pattern", 0, &n));
  memset(c->full_layers, 0, sizeof c->full_layers);
  for (int i = 0; i < c->n_layers; i++)
    if (full_in_pattern(i, n)) c->full_layers[i / 8] |= (uint8_t)(1u << (i % 8));
  if (has_key(g, "rope.freq_base_swa")) {
    float swa = 0;
    MOE_CHECK(moe_gguf_get_f32(g, key(k, "rope.freq_base_swa"), &swa));
    MOE_TRY(swa == c->rope_theta, MOE_ERR_FORMAT, "%s: %s %g is not %s.rope.freq_base %g (one rotary base for all "
            "layers)", path, k, (double)swa, ARCH, (double)c->rope_theta);
  }
  char name[64];
  snprintf(name, sizeof name, "blk.0.attn_q.bias");
  c->qkv_bias = c->o_bias = moe_gguf_has_tensor(g, name); /* llama.cpp requires them; libmoe takes either */
  return read_yarn(g, c);
}

/* The smallest n whose set_swa_pattern(n) gives c's full layers; 0 when none does. */
static int pattern_of(const moe_lm_config *c) {
  for (int n = 1; n <= c->n_layers + 1; n++) {
    int same = 1;
    for (int i = 0; i < c->n_layers && same; i++)
      same = full_in_pattern(i, n) == !!(c->full_layers[i / 8] & (1u << (i % 8)));
    if (same) return n;
  }
  return 0;
}

moe_status moe__lm_gguf_check_gptoss(const moe_lm_config *c, const char *path) {
  const moe_layer_config *l = &c->moe;
  MOE_TRY(c->sliding_window > 0, MOE_ERR_ARG, "%s: gpt-oss without a sliding window has no key in llama.cpp's "
          ARCH " (attention.sliding_window is required)", path);
  MOE_TRY(pattern_of(c), MOE_ERR_ARG, "%s: layer_types (full_layers) that are not the last of every n layers have no "
          "key in llama.cpp's " ARCH " (sliding_window_pattern n)", path);
  MOE_TRY(l->swiglu_alpha == ALPHA && l->swiglu_limit == LIMIT, MOE_ERR_ARG,
          "%s: swiglu_alpha %g and swiglu_limit %g have no key in llama.cpp's " ARCH " (it computes 1.702 and 7)", path,
          (double)l->swiglu_alpha, (double)l->swiglu_limit);
  MOE_TRY(c->qkv_bias && c->o_bias, MOE_ERR_ARG, "%s: attention_bias false: llama.cpp's " ARCH " requires the q, k, v "
          "and o biases", path);
  MOE_TRY(!c->tie_embeddings, MOE_ERR_ARG, "%s: tie_word_embeddings: llama.cpp's " ARCH " requires output.weight",
          path);
  const moe_lm_yarn *y = &c->yarn;
  if (y->factor == 0) return MOE_OK;
  MOE_TRY(y->truncate, MOE_ERR_ARG, "%s: yarn truncate false has no key in llama.cpp's " ARCH " (ggml floors and ceils "
          "the ramp's ends)", path);
  MOE_TRY(y->mscale == 1 && y->mscale_all_dim == 0, MOE_ERR_ARG, "%s: yarn mscale %g and mscale_all_dim %g have no key "
          "in llama.cpp's " ARCH " (it scales cos and sin by 0.1 ln(factor) + 1: mscale 1, mscale_all_dim 0)", path,
          (double)y->mscale, (double)y->mscale_all_dim);
  return MOE_OK;
}

moe_status moe__lm_gguf_write_gptoss(moe_gguf_writer *w, const moe_lm_config *c) {
  MOE_CHECK(moe__lm_gguf_set_u32(w, ARCH, "attention.sliding_window", c->sliding_window));
  MOE_CHECK(moe__lm_gguf_set_u32(w, ARCH, "expert_feed_forward_length", c->moe.H));
  int n = pattern_of(c);
  if (n != PATTERN) MOE_CHECK(moe__lm_gguf_set_u32(w, ARCH, "attention.sliding_window_pattern", n));
  if (c->yarn.factor == 0) return MOE_OK;
  char k[128];
  MOE_CHECK(moe_gguf_writer_set_str(w, key(k, "rope.scaling.type"), "yarn"));
  MOE_CHECK(moe__lm_gguf_set_f32(w, ARCH, "rope.scaling.factor", c->yarn.factor));
  MOE_CHECK(moe__lm_gguf_set_u32(w, ARCH, "rope.scaling.original_context_length",
                                 c->yarn.original_max_pos));
  MOE_CHECK(moe__lm_gguf_set_f32(w, ARCH, "rope.scaling.yarn_beta_fast", c->yarn.beta_fast));
  return moe__lm_gguf_set_f32(w, ARCH, "rope.scaling.yarn_beta_slow", c->yarn.beta_slow);
}
