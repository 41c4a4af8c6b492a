/* llama.cpp's names for the language model in GGUF files (lm_gguf.h): architectures and tensors, as
 * gguf-py's constants.py and llama.cpp's llama-arch.cpp spell them. */
#include <stdio.h>
#include <string.h>

#include "lm_family.h"
#include "lm_gguf.h"

static const struct {
  const char *arch;
  int norm_w; /* llama.cpp's graph renormalizes the top-k weights */
} ARCHS[] = {
    [MOE_LM_MIXTRAL] = {"llama", 1},
    [MOE_LM_QWEN2_MOE] = {"qwen2moe", 0},
    [MOE_LM_QWEN3_MOE] = {"qwen3moe", 1},
    [MOE_LM_OLMOE] = {"olmoe", 0},
    [MOE_LM_GPT_OSS] = {"gpt-oss", 1}, /* SOFTMAX_WEIGHT: the softmax over the chosen logits */
    [MOE_LM_DEEPSEEK_V2] = {"deepseek2", 0}, /* V2 and V3 alike: llama.cpp's converter writes both so */
    [MOE_LM_DEEPSEEK_V3] = {"deepseek2", 0},
};

const char *moe__lm_gguf_arch(moe_lm_family f) {
  return (unsigned)f < sizeof ARCHS / sizeof *ARCHS ? ARCHS[f].arch : NULL;
}

int moe__lm_gguf_norm_default(moe_lm_family f) { return (unsigned)f < sizeof ARCHS / sizeof *ARCHS && ARCHS[f].norm_w; }

/* A layer's Hugging Face tensors (after "model.layers.<i>.") and llama.cpp's (after "blk.<i>."). */
static const struct {
  const char *hf, *gguf;
} LAYER[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"self_attn.q_a_proj.weight", "attn_q_a.weight"}, /* DeepSeek's latent attention */
    {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"},
    {"self_attn.q_b_proj.weight", "attn_q_b.weight"},
    {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"},
    {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"},
    {"self_attn.kv_b_proj.weight", "attn_kv_b.weight"},
    {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias"},
    {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
    {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
    {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
    {"mlp.gate.weight", "ffn_gate_inp.weight"},
    {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
    {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
    {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
    {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};

/* gpt-oss's own (its experts are whole stacks: the layer's tensors, lm_gptoss.h; its post-attention norm
 * is llama.cpp's ATTN_POST_NORM there). */
static const struct {
  const char *hf, *gguf;
} GPT_OSS[] = {
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"self_attn.sinks", "attn_sinks.weight"},
    {"mlp.router.weight", "ffn_gate_inp.weight"},
    {"mlp.router.bias", "ffn_gate_inp.bias"},
    {"mlp.experts.fc1.weight", "ffn_gate_exps.weight"},
    {"mlp.experts.fc1.bias", "ffn_gate_exps.bias"},
    {"mlp.experts.fc3.weight", "ffn_up_exps.weight"},
    {"mlp.experts.fc3.bias", "ffn_up_exps.bias"},
    {"mlp.experts.fc2.weight", "ffn_down_exps.weight"},
    {"mlp.experts.down_proj_bias", "ffn_down_exps.bias"},
};

int moe__lm_gguf_name(const moe_lm_config *c, const char *hf, char *name, int *expert, int *permute) {
  *expert = -1;
  *permute = 0;
  static const char *const top[][2] = {
      {"model.embed_tokens.weight", "token_embd.weight"}, {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}};
  for (int i = 0; i < 3; i++)
    if (!strcmp(hf, top[i][0])) return snprintf(name, 64, "%s", top[i][1]), 1;
  int layer, n = 0, j;
  if (sscanf(hf, "model.layers.%d.%n", &layer, &n) != 1 || !n) return 0;
  if (moe__lm_expert_of(c->family, hf, expert, &j)) {
    /* expert[j] is w1 w2 w3 (Mixtral) or gate_proj up_proj down_proj; fc[j] says which of ours */
    static const char *const stacked[3] = {"ffn_gate_exps", "ffn_down_exps", "ffn_up_exps"};
    snprintf(name, 64, "blk.%d.%s.weight", layer, stacked[moe__lm_family(c->family)->fc[j]]);
    return 1;
  }
  for (size_t i = 0; c->family == MOE_LM_GPT_OSS && i < sizeof GPT_OSS / sizeof *GPT_OSS; i++)
    if (!strcmp(hf + n, GPT_OSS[i].hf)) return snprintf(name, 64, "blk.%d.%s", layer, GPT_OSS[i].gguf), 1;
  for (size_t i = 0; i < sizeof LAYER / sizeof *LAYER; i++)
    if (!strcmp(hf + n, LAYER[i].hf)) {
      snprintf(name, 64, "blk.%d.%s", layer, LAYER[i].gguf);
      if (c->family == MOE_LM_MIXTRAL && !strncmp(LAYER[i].gguf, "attn_q.", 7)) *permute = c->n_heads;
      if (c->family == MOE_LM_MIXTRAL && !strncmp(LAYER[i].gguf, "attn_k.", 7)) *permute = c->n_kv_heads;
      return 1;
    }
  return 0;
}

int64_t moe__lm_gguf_hf_row(int64_t r, int64_t rows, int heads) {
  int64_t hd = rows / heads, half = hd / 2, h = r / hd, i = r % hd;
  return h * hd + (i % 2) * half + i / 2;
}
