/* The language-model families' Hugging Face names (lm_family.h). */
#include <stdio.h>
#include <string.h>

#include "lm_family.h"

static const moe__lm_family_info families[] = {
    [MOE_LM_MIXTRAL] = {"mixtral", "MixtralForCausalLM", "num_local_experts", "intermediate_size", "block_sparse_moe",
                        "gate", {"w1", "w2", "w3"}, {0, 1, 2}},
    [MOE_LM_QWEN2_MOE] = {"qwen2_moe", "Qwen2MoeForCausalLM", "num_experts", "moe_intermediate_size", "mlp", "gate",
                          {"gate_proj", "up_proj", "down_proj"}, {0, 2, 1}},
    [MOE_LM_QWEN3_MOE] = {"qwen3_moe", "Qwen3MoeForCausalLM", "num_experts", "moe_intermediate_size", "mlp", "gate",
                          {"gate_proj", "up_proj", "down_proj"}, {0, 2, 1}},
    [MOE_LM_OLMOE] = {"olmoe", "OlmoeForCausalLM", "num_experts", "intermediate_size", "mlp", "gate",
                      {"gate_proj", "up_proj", "down_proj"}, {0, 2, 1}},
    [MOE_LM_GPT_OSS] = {"gpt_oss", "GptOssForCausalLM", "num_local_experts", "intermediate_size", "mlp", "router",
                        {"", "", ""}, {0, 1, 2}},
};

const moe__lm_family_info *moe__lm_family(moe_lm_family f) {
  return (unsigned)f < sizeof families / sizeof families[0] ? &families[f] : NULL;
}

const char *moe_lm_family_name(moe_lm_family f) {
  const moe__lm_family_info *i = moe__lm_family(f);
  return i ? i->model_type : NULL;
}

int moe__lm_expert_of(moe_lm_family f, const char *name, int *e, int *j) {
  const moe__lm_family_info *fi = moe__lm_family(f);
  char ffn[32], tensor[32];
  int n = 0;
  if (!fi || sscanf(name, "model.layers.%*d.%31[^.].experts.%d.%31[^.].weight%n", ffn, e, tensor, &n) != 3 ||
      name[n] || strcmp(ffn, fi->ffn))
    return 0;
  for (*j = 0; *j < 3; ++*j)
    if (!strcmp(tensor, fi->expert[*j])) return 1;
  return 0;
}

int moe__lm_moe_layers(const moe_lm_config *c) {
  int n = 0;
  for (int i = 0; i < c->n_layers; i++) n += !moe_lm_layer_dense(c, i);
  return n;
}
