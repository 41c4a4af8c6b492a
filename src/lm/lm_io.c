/* Hugging Face checkpoints of the language-model families (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE,
 * gpt-oss): config.json, one safetensors file or the shards of an index, F32/BF16/F16 tensors. config.json's
 * fields are read by the family's list (anything else is an error naming it); the model's reference
 * table carries the HF names and shapes (an expert's tensors are slices of the layer's stacked ones),
 * so loading and saving walk it and only the size check knows a few names; gpt-oss's fused (or MXFP4)
 * experts are converted by lm_gptoss.c, which reads through this file's shards. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "formats/json.h"
#include "lm_dist.h"
#include "lm_family.h"
#include "lm_gguf.h"
#include "lm_gptoss.h"
#include "lm_map.h"
#include "lm_shards.h"


static void path_in(char *buf, size_t n, const char *dir, const char *file) { snprintf(buf, n, "%s/%s", dir, file); }

/* An integer field: absent leaves *out as it is (unless required). */
static moe_status get_int(const char *path, const cJSON *root, const char *key, int required, int *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  MOE_TRY(v || !required, MOE_ERR_MISSING, "%s: no \"%s\"", path, key);
  if (!v || cJSON_IsNull(v)) return MOE_OK;
  MOE_TRY(cJSON_IsNumber(v) && v->valuedouble > 0 && v->valuedouble <= INT32_MAX && /* in range before the cast */
              v->valuedouble == (int)v->valuedouble,
          MOE_ERR_FORMAT, "%s: \"%s\" must be a positive integer", path, key);
  *out = (int)v->valuedouble;
  return MOE_OK;
}

static moe_status get_float(const char *path, const cJSON *root, const char *key, float *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!v) return MOE_OK;
  MOE_TRY(cJSON_IsNumber(v) && isfinite((float)v->valuedouble), MOE_ERR_FORMAT, "%s: \"%s\" must be a finite number",
          path, key);
  *out = (float)v->valuedouble;
  return MOE_OK;
}

static moe_status get_bool(const char *path, const cJSON *root, const char *key, int *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!v) return MOE_OK;
  MOE_TRY(cJSON_IsBool(v), MOE_ERR_FORMAT, "%s: \"%s\" must be true or false", path, key);
  *out = cJSON_IsTrue(v);
  return MOE_OK;
}

/* A field that must be false when present (a feature not implemented: refused by name). */
static moe_status refuse_true(const char *path, const cJSON *r, const char *key, const char *why) {
  int on = 0;
  MOE_CHECK(get_bool(path, r, key, &on));
  MOE_TRY(!on, MOE_ERR_FORMAT, "%s: \"%s\" true is not supported (%s)", path, key, why);
  return MOE_OK;
}

/* A number field that must be 0 when present (training noise libmoe does not add). */
static moe_status refuse_nonzero(const char *path, const cJSON *r, const char *key) {
  float v = 0;
  MOE_CHECK(get_float(path, r, key, &v));
  MOE_TRY(v == 0, MOE_ERR_FORMAT, "%s: \"%s\" %g is not supported (only 0)", path, key, (double)v);
  return MOE_OK;
}

/* Fields every family reads, and those that change nothing the library computes (token ids, which the
 * CLI reads itself, dtype and version notes, cache and init settings of transformers). */
static const char *const common_fields[] = {
    "architectures", "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "hidden_act", "max_position_embeddings", "rope_theta", "rope_scaling", "rope_parameters",
    "rms_norm_eps", "tie_word_embeddings", "router_aux_loss_coef", "output_router_logits", "num_experts_per_tok",
    "attention_dropout", "torch_dtype", "dtype", "transformers_version", "bos_token_id", "eos_token_id",
    "pad_token_id", "use_cache", "initializer_range", "_name_or_path", NULL};
/* DeepSeek's configuration_deepseek.py and transformers' DeepseekV2Config / DeepseekV3Config. Known and
 * not used: aux_loss_alpha and seq_aux (DeepSeek's training-time balance loss, which neither modeling file
 * adds at inference and transformers never adds), ep_size (its expert-parallel setting), pretraining_tp,
 * num_nextn_predict_layers (the multi-token-prediction layers, skipped on load), auto_map. */
#define DEEPSEEK_FIELDS                                                                                               \
  "intermediate_size", "moe_intermediate_size", "n_routed_experts", "n_shared_experts", "routed_scaling_factor",     \
      "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "head_dim", "topk_method", \
      "n_group", "topk_group", "first_k_dense_replace", "moe_layer_freq", "norm_topk_prob", "scoring_func",          \
      "aux_loss_alpha", "seq_aux", "attention_bias", "mlp_bias", "rope_interleave", "ep_size", "pretraining_tp",    \
      "num_nextn_predict_layers", "auto_map", "quantization_config"
/* Each family's own, as its transformers configuration class has them. */
static const char *const family_fields[][40] = {
    [MOE_LM_MIXTRAL] = {"intermediate_size", "head_dim", "num_local_experts", "sliding_window", "router_jitter_noise",
                        NULL},
    [MOE_LM_QWEN2_MOE] = {"intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                          "num_experts", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "qkv_bias",
                          "use_sliding_window", "sliding_window", "max_window_layers", "layer_types", NULL},
    [MOE_LM_QWEN3_MOE] = {"intermediate_size", "moe_intermediate_size", "head_dim", "num_experts", "norm_topk_prob",
                          "decoder_sparse_step", "mlp_only_layers", "attention_bias", "use_sliding_window",
                          "sliding_window", "max_window_layers", NULL},
    /* router_z_loss_coef: OLMoE's training code has a z-loss, transformers' OlmoeForCausalLM adds none */
    [MOE_LM_OLMOE] = {"intermediate_size", "num_experts", "norm_topk_prob", "clip_qkv", "attention_bias",
                      "router_z_loss_coef", NULL},
    /* experts_per_token and initial_context_length: the original OpenAI release's names, kept by its configs */
    [MOE_LM_GPT_OSS] = {"intermediate_size", "head_dim", "num_local_experts", "sliding_window", "layer_types",
                        "attention_bias", "swiglu_alpha", "swiglu_limit", "experts_per_token",
                        "initial_context_length", "quantization_config", NULL},
    [MOE_LM_DEEPSEEK_V2] = {DEEPSEEK_FIELDS, NULL},
    [MOE_LM_DEEPSEEK_V3] = {DEEPSEEK_FIELDS, NULL},
};

static int listed(const char *const *list, const char *key) {
  for (; *list; list++)
    if (!strcmp(*list, key)) return 1;
  return 0;
}

/* The family of config.json: model_type, else the architecture, else Mixtral (older libmoe files). */
static moe_status family_of(const char *path, const cJSON *r, moe_lm_family *out) {
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(r, "model_type");
  const cJSON *arch = cJSON_GetObjectItemCaseSensitive(r, "architectures"), *a;
  MOE_TRY(!mt || cJSON_IsString(mt), MOE_ERR_FORMAT, "%s: \"model_type\" is not a string", path);
  MOE_TRY(!arch || cJSON_IsArray(arch), MOE_ERR_FORMAT, "%s: \"architectures\" is not a list", path);
  *out = MOE_LM_MIXTRAL;
  int found = !mt;
  for (int f = 0; mt && moe__lm_family(f); f++)
    if (!strcmp(mt->valuestring, moe__lm_family(f)->model_type)) *out = f, found = 1;
  MOE_TRY(found, MOE_ERR_FORMAT,
          "%s: \"model_type\" is \"%s\", want mixtral, qwen2_moe, qwen3_moe, olmoe, gpt_oss, deepseek_v2 or deepseek_v3",
          path,
          mt->valuestring);
  cJSON_ArrayForEach(a, arch) {
    MOE_TRY(cJSON_IsString(a), MOE_ERR_FORMAT, "%s: \"architectures\" holds a non-string", path);
    int known = -1;
    for (int f = 0; moe__lm_family(f); f++)
      if (!strcmp(a->valuestring, moe__lm_family(f)->architecture)) known = f;
    MOE_TRY(known >= 0, MOE_ERR_FORMAT, "%s: \"architectures\" entry \"%s\" is not a causal LM libmoe runs", path,
            a->valuestring);
    if (!mt) *out = known, mt = a; /* the first architecture decides when model_type is absent */
    MOE_TRY(known == (int)*out, MOE_ERR_FORMAT, "%s: \"architectures\" entry \"%s\" is not model_type \"%s\"'s", path,
            a->valuestring, moe__lm_family(*out)->model_type);
  }
  return MOE_OK;
}

static int is_deepseek(moe_lm_family f) { return f == MOE_LM_DEEPSEEK_V2 || f == MOE_LM_DEEPSEEK_V3; }

/* A count field that may be 0: absent or null leaves *out as it is. */
static moe_status get_count(const char *path, const cJSON *root, const char *key, int *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!v || cJSON_IsNull(v)) return MOE_OK;
  MOE_TRY(cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= INT32_MAX &&
              v->valuedouble == (int)v->valuedouble,
          MOE_ERR_FORMAT, "%s: \"%s\" must be a non-negative integer", path, key);
  *out = (int)v->valuedouble;
  return MOE_OK;
}

/* A string field, one of `names` (NULL-terminated): its index in *out; absent leaves *out. */
static moe_status get_choice(const char *path, const cJSON *root, const char *key, const char *const *names,
                             int *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!v) return MOE_OK;
  for (int i = 0; cJSON_IsString(v) && names[i]; i++)
    if (!strcmp(v->valuestring, names[i])) {
      *out = i;
      return MOE_OK;
    }
  MOE_TRY(0, MOE_ERR_FORMAT, "%s: \"%s\" %s is not supported", path, key,
          cJSON_IsString(v) ? v->valuestring : "(not a string)");
}

/* rope_scaling of type yarn (DeepSeek's, gpt-oss's): its fields into c->yarn, with transformers' and
 * DeepseekV2YarnRotaryEmbedding's defaults; a field it does not have is an error naming it. */
static moe_status read_yarn(const char *path, const cJSON *rs, moe_lm_config *c) {
  static const char *const known[] = {"type", "rope_type", "factor", "original_max_position_embeddings", "beta_fast",
                                      "beta_slow", "mscale", "mscale_all_dim", "truncate", NULL};
  const cJSON *it;
  cJSON_ArrayForEach(it, rs) {
    MOE_TRY(listed(known, it->string), MOE_ERR_FORMAT, "%s: \"rope_scaling\" field \"%s\" is not supported for yarn",
            path, it->string);
  }
  moe_lm_yarn y = {0, 4096, 32, 1, 1, 0, 1};
  MOE_TRY(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(rs, "factor")), MOE_ERR_FORMAT,
          "%s: \"rope_scaling\" of type yarn needs a number \"factor\"", path);
  MOE_CHECK(get_float(path, rs, "factor", &y.factor));
  MOE_CHECK(get_int(path, rs, "original_max_position_embeddings", 0, &y.original_max_pos));
  MOE_CHECK(get_float(path, rs, "beta_fast", &y.beta_fast));
  MOE_CHECK(get_float(path, rs, "beta_slow", &y.beta_slow));
  MOE_CHECK(get_float(path, rs, "mscale", &y.mscale));
  MOE_CHECK(get_float(path, rs, "mscale_all_dim", &y.mscale_all_dim));
  MOE_CHECK(get_bool(path, rs, "truncate", &y.truncate));
  MOE_TRY(y.factor >= 1 && y.beta_fast > 0 && y.beta_slow > 0, MOE_ERR_FORMAT,
          "%s: \"rope_scaling\" yarn wants factor >= 1 and positive betas, got factor %g, beta_fast %g, beta_slow %g",
          path, (double)y.factor, (double)y.beta_fast, (double)y.beta_slow);
  c->yarn = y;
  return MOE_OK;
}

/* rope_scaling null (or absent), or yarn for the DeepSeek families and gpt-oss (whose config's default is
 * GptOssConfig's YaRN: factor 32 over 4096 positions, betas 32 and 1, truncate false); rope_parameters
 * (transformers 5) of rope_type default, whose rope_theta counts. */
static moe_status read_rope(const char *path, const cJSON *r, moe_lm_config *c) {
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(r, "rope_scaling"), *ty = NULL;
  int oss = c->family == MOE_LM_GPT_OSS;
  if (oss && !rs && !cJSON_GetObjectItemCaseSensitive(r, "rope_parameters")) {
    c->yarn = (moe_lm_yarn){32, 4096, 32, 1, 1, 0, 0};
    return MOE_OK;
  }
  if (cJSON_IsObject(rs) && !cJSON_IsString(ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type")))
    ty = cJSON_GetObjectItemCaseSensitive(rs, "type");
  if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "yarn") && (is_deepseek(c->family) || oss))
    return read_yarn(path, rs, c);
  MOE_TRY(!rs || cJSON_IsNull(rs), MOE_ERR_FORMAT, "%s: \"rope_scaling\" of type %s is not supported (only null)",
          path, cJSON_IsString(ty) ? ty->valuestring : "(none given)");
  const cJSON *rp = cJSON_GetObjectItemCaseSensitive(r, "rope_parameters"), *it;
  if (!rp || cJSON_IsNull(rp)) return MOE_OK;
  MOE_TRY(cJSON_IsObject(rp), MOE_ERR_FORMAT, "%s: \"rope_parameters\" is not an object", path);
  cJSON_ArrayForEach(it, rp) {
    MOE_TRY(!strcmp(it->string, "rope_theta") || !strcmp(it->string, "rope_type"), MOE_ERR_FORMAT,
            "%s: \"rope_parameters\" field \"%s\" is not supported", path, it->string);
  }
  ty = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
  MOE_TRY(!ty || (cJSON_IsString(ty) && !strcmp(ty->valuestring, "default")), MOE_ERR_FORMAT,
          "%s: \"rope_parameters\" of rope_type %s is not supported (only default)", path,
          cJSON_IsString(ty) ? ty->valuestring : "(not a string)");
  return get_float(path, rp, "rope_theta", &c->rope_theta);
}

/* decoder_sparse_step and mlp_only_layers as transformers' Qwen2/3-MoE decoder layers read them: layer
 * i is MoE when it is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0. */
static moe_status read_layer_kinds(const char *path, const cJSON *r, moe_lm_config *c) {
  int step = 1;
  MOE_CHECK(get_int(path, r, "decoder_sparse_step", 0, &step));
  const cJSON *only = cJSON_GetObjectItemCaseSensitive(r, "mlp_only_layers"), *it;
  MOE_TRY(!only || cJSON_IsNull(only) || cJSON_IsArray(only), MOE_ERR_FORMAT, "%s: \"mlp_only_layers\" is not a list",
          path);
  MOE_TRY(c->n_layers <= MOE_LM_MAX_LAYERS, MOE_ERR_FORMAT, "%s: \"num_hidden_layers\" %d is more than %d", path,
          c->n_layers, MOE_LM_MAX_LAYERS);
  memset(c->dense_layers, 0, sizeof c->dense_layers);
  for (int i = 0; i < c->n_layers; i++)
    if ((i + 1) % step) c->dense_layers[i / 8] |= (uint8_t)(1u << (i % 8));
  cJSON_ArrayForEach(it, only) {
    MOE_TRY(cJSON_IsNumber(it) && it->valuedouble >= 0 && it->valuedouble < c->n_layers &&
                it->valuedouble == (int)it->valuedouble,
            MOE_ERR_FORMAT, "%s: \"mlp_only_layers\" entry %g is not a layer in [0, %d)", path, it->valuedouble,
            c->n_layers);
    int i = (int)it->valuedouble;
    c->dense_layers[i / 8] |= (uint8_t)(1u << (i % 8));
  }
  return MOE_OK;
}

/* gpt-oss: transformers' GptOssConfig defaults, its layer_types (absent: even layers sliding) and the
 * MXFP4 quantization its checkpoints declare. */
static moe_status read_gpt_oss(const char *path, const cJSON *r, moe_lm_config *c) {
  moe_layer_config *l = &c->moe;
  moe_lm_config_set_family(c, MOE_LM_GPT_OSS);
  c->rope_theta = 150000.0f;
  MOE_CHECK(get_bool(path, r, "attention_bias", &c->qkv_bias));
  c->o_bias = c->qkv_bias;
  MOE_CHECK(get_float(path, r, "swiglu_alpha", &l->swiglu_alpha));
  MOE_CHECK(get_float(path, r, "swiglu_limit", &l->swiglu_limit));
  MOE_TRY(l->swiglu_limit > 0, MOE_ERR_FORMAT, "%s: \"swiglu_limit\" must be > 0", path);
  c->aux_coef = 0.9f; /* GptOssConfig's router_aux_loss_coef, counted with output_router_logits true */
  int per = l->top_k;
  MOE_CHECK(get_int(path, r, "experts_per_token", 0, &per));
  MOE_TRY(per == l->top_k, MOE_ERR_FORMAT, "%s: \"experts_per_token\" %d is not \"num_experts_per_tok\" %d", path, per,
          l->top_k);
  const cJSON *q = cJSON_GetObjectItemCaseSensitive(r, "quantization_config"), *qm;
  qm = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
  MOE_TRY(!q || cJSON_IsNull(q) || (cJSON_IsString(qm) && !strcmp(qm->valuestring, "mxfp4")),
          MOE_ERR_FORMAT, "%s: \"quantization_config\" other than quant_method \"mxfp4\" is not supported", path);
  const cJSON *sw = cJSON_GetObjectItemCaseSensitive(r, "sliding_window"), *it;
  const cJSON *lt = cJSON_GetObjectItemCaseSensitive(r, "layer_types");
  c->sliding_window = sw && cJSON_IsNull(sw) ? 0 : 128;
  MOE_CHECK(get_int(path, r, "sliding_window", 0, &c->sliding_window));
  MOE_TRY(c->n_layers <= MOE_LM_MAX_LAYERS, MOE_ERR_FORMAT, "%s: \"num_hidden_layers\" %d is more than %d", path,
          c->n_layers, MOE_LM_MAX_LAYERS);
  MOE_TRY(!lt || cJSON_IsNull(lt) || (cJSON_IsArray(lt) && cJSON_GetArraySize(lt) == c->n_layers), MOE_ERR_FORMAT,
          "%s: \"layer_types\" must be a list of \"num_hidden_layers\" %d entries", path, c->n_layers);
  memset(c->full_layers, 0, sizeof c->full_layers);
  for (int i = 0; i < c->n_layers; i++)
    if (!lt || cJSON_IsNull(lt) ? i % 2 : 0) c->full_layers[i / 8] |= (uint8_t)(1u << (i % 8));
  int i = 0;
  const cJSON *list = cJSON_IsArray(lt) ? lt : NULL;
  cJSON_ArrayForEach(it, list) {
    int full = cJSON_IsString(it) && !strcmp(it->valuestring, "full_attention");
    MOE_TRY(full || (cJSON_IsString(it) && !strcmp(it->valuestring, "sliding_attention")), MOE_ERR_FORMAT,
            "%s: \"layer_types\" entry %d is not \"sliding_attention\" or \"full_attention\"", path, i);
    if (full) c->full_layers[i / 8] |= (uint8_t)(1u << (i % 8));
    i++;
  }
  if (!c->sliding_window) memset(c->full_layers, 0, sizeof c->full_layers); /* no window: every layer full */
  return MOE_OK;
}

/* The router of DeepSeek's MoEGate: scoring_func, topk_method (V2's greedy or group_limited_greedy, V3's
 * noaux_tc), groups, norm_topk_prob (only for top_k > 1) and routed_scaling_factor (V2 applies it only
 * without the normalization, V3 after it). */
static moe_status read_deepseek_router(const char *path, const cJSON *r, moe_lm_config *c) {
  static const char *const scores[] = {"softmax", "sigmoid", NULL},
                           *const methods[] = {"greedy", "group_limited_greedy", "noaux_tc", "gready", NULL};
  int v3 = c->family == MOE_LM_DEEPSEEK_V3, score = v3, method = v3 ? 2 : 0, norm = v3, n_group = v3 ? 8 : 0,
      topk_group = v3 ? 4 : 0;
  float rsf = v3 ? 2.5f : 1.0f;
  MOE_CHECK(get_choice(path, r, "scoring_func", scores, &score));
  MOE_CHECK(get_choice(path, r, "topk_method", methods, &method));
  MOE_CHECK(get_bool(path, r, "norm_topk_prob", &norm));
  MOE_CHECK(get_float(path, r, "routed_scaling_factor", &rsf));
  moe_layer_config *l = &c->moe;
  l->score = score ? MOE_SCORE_SIGMOID : MOE_SCORE_SOFTMAX;
  l->normalize_topk = norm && l->top_k > 1;
  l->routed_scale = v3 || !l->normalize_topk ? rsf : 1.0f;
  l->select_bias = method == 2;
  l->group_score = method == 2 ? MOE_GROUP_TOP2_SUM : MOE_GROUP_MAX;
  l->n_group = l->topk_group = 0;
  if (method == 1 || method == 2) {
    MOE_CHECK(get_int(path, r, "n_group", 0, &n_group));
    MOE_CHECK(get_int(path, r, "topk_group", 0, &topk_group));
    MOE_TRY(n_group > 0 && topk_group > 0, MOE_ERR_FORMAT, "%s: \"topk_method\" %s needs \"n_group\" and \"topk_group\"",
            path, methods[method]);
    if (n_group > 1) l->n_group = n_group, l->topk_group = topk_group; /* one group limits nothing */
  }
  return MOE_OK;
}

/* DeepSeek-V2/V3: the latent attention's sizes, the shared experts, the layer kinds, the router. */
static moe_status read_deepseek(const char *path, const cJSON *r, moe_lm_config *c) {
  static const char *const need[] = {"kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                     "v_head_dim", NULL};
  for (int i = 0; need[i]; i++)
    MOE_TRY(cJSON_GetObjectItemCaseSensitive(r, need[i]), MOE_ERR_MISSING, "%s: no \"%s\"", path, need[i]);
  MOE_TRY(!cJSON_GetObjectItemCaseSensitive(r, "quantization_config"), MOE_ERR_FORMAT,
          "%s: \"quantization_config\" is not supported (FP8 block-quantized weights: convert them to BF16 first)", path);
  MOE_CHECK(refuse_true(path, r, "attention_bias", "DeepSeek without attention biases only"));
  MOE_CHECK(refuse_true(path, r, "mlp_bias", "DeepSeek without MLP biases only"));
  int v3 = c->family == MOE_LM_DEEPSEEK_V3, rope = 0, shared = v3, first_k = v3 ? 3 : 0, freq = 1;
  moe_lm_mla *a = &c->mla;
  c->rope_theta = 10000.0f;
  c->rms_eps = 1e-6f;
  MOE_CHECK(get_int(path, r, "kv_lora_rank", 1, &a->kv_lora_rank));
  MOE_CHECK(get_int(path, r, "q_lora_rank", 0, &a->q_lora_rank)); /* null: q_proj */
  MOE_CHECK(get_int(path, r, "qk_nope_head_dim", 1, &a->qk_nope_dim));
  MOE_CHECK(get_int(path, r, "qk_rope_head_dim", 1, &rope));
  MOE_CHECK(get_int(path, r, "v_head_dim", 1, &a->v_head_dim));
  MOE_TRY(!cJSON_GetObjectItemCaseSensitive(r, "head_dim") || c->head_dim == rope, MOE_ERR_FORMAT,
          "%s: \"head_dim\" %d is not \"qk_rope_head_dim\" %d", path, c->head_dim, rope);
  MOE_TRY(c->n_kv_heads == c->n_heads, MOE_ERR_FORMAT, "%s: \"num_key_value_heads\" %d is not \"num_attention_heads\" %d",
          path, c->n_kv_heads, c->n_heads);
  c->head_dim = rope;
  a->rope_interleave = 1;
  MOE_CHECK(get_bool(path, r, "rope_interleave", &a->rope_interleave));
  MOE_CHECK(get_int(path, r, "intermediate_size", 0, &c->dense_H));
  const cJSON *ns = cJSON_GetObjectItemCaseSensitive(r, "n_shared_experts");
  if (cJSON_IsNull(ns)) shared = 0;
  MOE_CHECK(get_count(path, r, "n_shared_experts", &shared));
  c->moe.shared_H = shared * c->moe.H;
  c->moe.shared_gate = 0;
  MOE_CHECK(get_count(path, r, "first_k_dense_replace", &first_k));
  MOE_CHECK(get_int(path, r, "moe_layer_freq", 0, &freq));
  MOE_TRY(c->n_layers <= MOE_LM_MAX_LAYERS, MOE_ERR_FORMAT, "%s: \"num_hidden_layers\" %d is more than %d", path,
          c->n_layers, MOE_LM_MAX_LAYERS);
  memset(c->dense_layers, 0, sizeof c->dense_layers);
  for (int i = 0; i < c->n_layers; i++) /* DeepseekV2DecoderLayer's choice */
    if (!(i >= first_k && i % freq == 0)) c->dense_layers[i / 8] |= (uint8_t)(1u << (i % 8));
  return read_deepseek_router(path, r, c);
}

static moe_status read_family(const char *path, const cJSON *r, moe_lm_config *c) {
  const moe__lm_family_info *f = moe__lm_family(c->family);
  MOE_CHECK(get_int(path, r, f->experts_key, 1, &c->moe.E));
  MOE_CHECK(get_int(path, r, f->expert_H_key, 1, &c->moe.H));
  if (c->family == MOE_LM_GPT_OSS) return read_gpt_oss(path, r, c);
  if (is_deepseek(c->family)) return read_deepseek(path, r, c);
  if (c->family == MOE_LM_MIXTRAL) {
    MOE_CHECK(get_int(path, r, "sliding_window", 0, &c->sliding_window));
    return refuse_nonzero(path, r, "router_jitter_noise");
  }
  /* transformers' defaults where these families differ from Mixtral */
  c->rope_theta = 10000.0f;
  c->rms_eps = c->family == MOE_LM_OLMOE ? 1e-5f : 1e-6f;
  c->aux_coef = c->family == MOE_LM_OLMOE ? 0.01f : 0.001f;
  c->moe.normalize_topk = 0;
  MOE_CHECK(get_bool(path, r, "norm_topk_prob", &c->moe.normalize_topk));
  if (c->family == MOE_LM_OLMOE) {
    c->qk_norm = MOE_QK_NORM_FULL;
    const cJSON *clip = cJSON_GetObjectItemCaseSensitive(r, "clip_qkv");
    if (clip && !cJSON_IsNull(clip)) {
      MOE_TRY(cJSON_IsNumber(clip) && clip->valuedouble > 0 && isfinite((float)clip->valuedouble), MOE_ERR_FORMAT,
              "%s: \"clip_qkv\" must be null or a positive number", path);
      c->clip_qkv = (float)clip->valuedouble;
    }
    return refuse_true(path, r, "attention_bias", "OLMoE without attention biases only");
  }
  MOE_CHECK(refuse_true(path, r, "use_sliding_window", "transformers versions differ on its layers"));
  MOE_CHECK(get_int(path, r, "intermediate_size", 0, &c->dense_H));
  MOE_CHECK(read_layer_kinds(path, r, c));
  if (c->family == MOE_LM_QWEN3_MOE) {
    c->qk_norm = MOE_QK_NORM_HEAD;
    return refuse_true(path, r, "attention_bias", "Qwen3-MoE without attention biases only");
  }
  c->qkv_bias = 1;
  MOE_CHECK(get_bool(path, r, "qkv_bias", &c->qkv_bias));
  MOE_CHECK(get_int(path, r, "shared_expert_intermediate_size", 1, &c->moe.shared_H));
  c->moe.shared_gate = 1;
  const cJSON *lt = cJSON_GetObjectItemCaseSensitive(r, "layer_types"), *it;
  cJSON_ArrayForEach(it, lt) {
    MOE_TRY(cJSON_IsString(it) && !strcmp(it->valuestring, "full_attention"), MOE_ERR_FORMAT,
            "%s: \"layer_types\" other than \"full_attention\" are not supported", path);
  }
  return MOE_OK;
}

static moe_status read_config(const char *path, const cJSON *r, moe_lm_config *c) {
  MOE_CHECK(family_of(path, r, &c->family));
  const cJSON *it;
  cJSON_ArrayForEach(it, r) {
    MOE_TRY(listed(common_fields, it->string) || listed(family_fields[c->family], it->string), MOE_ERR_FORMAT,
            "%s: field \"%s\" is not understood for model_type \"%s\"", path, it->string,
            moe_lm_family_name(c->family));
  }
  const cJSON *act = cJSON_GetObjectItemCaseSensitive(r, "hidden_act");
  MOE_TRY(!act || (cJSON_IsString(act) && !strcmp(act->valuestring, "silu")), MOE_ERR_FORMAT,
          "%s: \"hidden_act\" must be \"silu\" (SwiGLU experts)", path);
  MOE_CHECK(refuse_nonzero(path, r, "attention_dropout"));
  MOE_CHECK(get_int(path, r, "vocab_size", 1, &c->vocab));
  MOE_CHECK(get_int(path, r, "hidden_size", 1, &c->moe.D));
  MOE_CHECK(get_int(path, r, "num_hidden_layers", 1, &c->n_layers));
  MOE_CHECK(get_int(path, r, "num_attention_heads", 1, &c->n_heads));
  c->n_kv_heads = c->n_heads;
  MOE_CHECK(get_int(path, r, "num_key_value_heads", 0, &c->n_kv_heads));
  c->head_dim = c->moe.D / c->n_heads;
  MOE_CHECK(get_int(path, r, "head_dim", 0, &c->head_dim));
  MOE_CHECK(get_int(path, r, "max_position_embeddings", 0, &c->max_seq));
  MOE_CHECK(get_int(path, r, "num_experts_per_tok", 1, &c->moe.top_k));
  MOE_CHECK(read_family(path, r, c));
  MOE_CHECK(get_float(path, r, "rope_theta", &c->rope_theta));
  MOE_CHECK(read_rope(path, r, c));
  MOE_CHECK(get_float(path, r, "rms_norm_eps", &c->rms_eps));
  MOE_CHECK(get_float(path, r, "router_aux_loss_coef", &c->aux_coef));
  int with_aux = 0;
  MOE_CHECK(get_bool(path, r, "output_router_logits", &with_aux));
  if (!with_aux || is_deepseek(c->family)) c->aux_coef = 0; /* transformers adds the balance loss only then */
  c->tie_embeddings = 0;
  return get_bool(path, r, "tie_word_embeddings", &c->tie_embeddings);
}

moe_status moe_lm_read_config(const char *dir, moe_lm_config *c) {
  MOE_TRY(dir && c, MOE_ERR_ARG, "moe_lm_read_config: NULL argument");
  if (moe__lm_gguf_is(dir)) return moe__lm_gguf_read_config(dir, c);
  char path[4096];
  path_in(path, sizeof path, dir, "config.json");
  cJSON *root;
  MOE_CHECK(moe__json_read(path, "config", (size_t)1 << 26, &root));
  moe_lm_config_default(c);
  moe_status st = cJSON_IsObject(root) ? read_config(path, root, c)
                                       : moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: not a JSON object", path);
  cJSON_Delete(root);
  return st;
}

typedef moe__lm_shards shards;

/* IEEE half to float, exactly. */
static float half_to_float(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
  return h & 0x8000 ? -v : v;
}

moe_status moe__lm_read_values(const moe_st *f, const moe_tensor_view *v, size_t off, size_t n, float *dst) {
  if (v->dtype == MOE_DT_F16) {
    uint16_t *h = malloc(n * 2 + 1);
    MOE_TRY(h, MOE_ERR_NOMEM, "%s: out of memory for tensor '%s'", moe_st_path(f), v->name);
    moe_status st = moe_st_read(f, v, off * 2, n * 2, h);
    for (size_t i = 0; st == MOE_OK && i < n; i++) dst[i] = half_to_float(h[i]);
    free(h);
    MOE_CHECK(st);
  } else {
    MOE_TRY(v->dtype == MOE_DT_F32 || v->dtype == MOE_DT_BF16, MOE_ERR_DTYPE,
            "%s: tensor '%s' is %s, want F32, BF16 or F16", moe_st_path(f), v->name, moe_dtype_name(v->dtype));
    MOE_CHECK(moe_st_view_f32(f, v, off, n, dst));
  }
  return moe__st_expect_finite(f, v, off, dst, n);
}

static moe_status read_tensor(const moe_st *f, const moe_tensor_ref *r) {
  moe_tensor_view v;
  MOE_CHECK(moe_st_get(f, r->name, &v));
  MOE_CHECK(moe__st_expect_shape(f, &v, r->name, r->ndim, r->shape));
  return moe__lm_read_values(f, &v, 0, r->numel, r->data);
}

/* Ref r from f: the whole tensor, or under the sharded layout this rank's part of it (lm_dist.h). */
static moe_status read_part(const moe_lm_t *m, const moe_st *f, const moe_tensor_ref *r) {
  moe__lm_part p;
  moe__lm_part_of(m, r, &p);
  if (p.whole.numel == r->numel) return read_tensor(f, r);
  p.whole.data = malloc(p.whole.numel * 4);
  MOE_TRY(p.whole.data, MOE_ERR_NOMEM, "%s: out of memory for tensor '%s'", moe_st_path(f), r->name);
  moe_status st = read_tensor(f, &p.whole);
  if (st == MOE_OK) moe__lm_part_copy(&p, p.whole.data, r->data, 0);
  free(p.whole.data);
  return st;
}

/* lm_gptoss.h's reader of the checkpoint's tensors (ctx: the shards): the shard holding a tensor. */
static moe_status file_of(void *ctx, const char *name, moe_st **f) { return moe__lm_shard_of(ctx, name, f); }

/* The config's sizes against the tensors that carry them, before anything of their size is allocated:
 * a config.json that does not fit its weights is an error naming the field and its value, not gigabytes
 * allocated (a shard's header alone is read). The last layer, the last MoE layer and its last expert
 * vouch for the counts; the first dense layer and the shared expert for their widths. */
static moe_status check_sizes(shards *s, const char *dir, const moe_lm_config *c) {
  const moe__lm_family_info *f = moe__lm_family(c->family);
  int64_t D = c->moe.D, hd = c->head_dim;
  int last_moe = -1, first_dense = -1, n = 0;
  for (int i = 0; i < c->n_layers; i++)
    if (moe_lm_layer_dense(c, i)) first_dense = first_dense < 0 ? i : first_dense;
    else last_moe = i;
  char names[9][128], rows[9][96], cols[9][96];
  int64_t nrows[9], ncols[9];
#define WANT(field, count, cfield, ccount, ...)                        \
  do {                                                                 \
    snprintf(names[n], 128, __VA_ARGS__);                              \
    snprintf(rows[n], 96, "%s", field);                                \
    snprintf(cols[n], 96, "%s", cfield);                               \
    nrows[n] = (count);                                                \
    ncols[n++] = (ccount);                                             \
  } while (0)
static const char hidden[] = "\"hidden_size\"";
  WANT("\"vocab_size\"", c->vocab, hidden, D, "model.embed_tokens.weight");
  const moe_lm_mla *a = &c->mla;
  int64_t dqk = (int64_t)c->n_heads * (a->qk_nope_dim + hd), r = a->kv_lora_rank, last = c->n_layers - 1;
  if (r) { /* the latent attention's */
    WANT("\"kv_lora_rank\" + \"qk_rope_head_dim\"", r + hd, hidden, D, "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight",
         (int)last);
    WANT("\"num_attention_heads\" x (\"qk_nope_head_dim\" + \"v_head_dim\")",
         (int64_t)c->n_heads * (a->qk_nope_dim + a->v_head_dim), "\"kv_lora_rank\"", r,
         "model.layers.%d.self_attn.kv_b_proj.weight", (int)last);
    if (a->q_lora_rank) {
      WANT("\"q_lora_rank\"", a->q_lora_rank, hidden, D, "model.layers.%d.self_attn.q_a_proj.weight", (int)last);
      WANT("\"num_attention_heads\" x (\"qk_nope_head_dim\" + \"qk_rope_head_dim\")", dqk, "\"q_lora_rank\"",
           a->q_lora_rank, "model.layers.%d.self_attn.q_b_proj.weight", (int)last);
    } else {
      WANT("\"num_attention_heads\" x (\"qk_nope_head_dim\" + \"qk_rope_head_dim\")", dqk, hidden, D,
           "model.layers.%d.self_attn.q_proj.weight", (int)last);
    }
  } else {
    WANT("\"num_attention_heads\" x \"head_dim\"", c->n_heads * hd, hidden, D, "model.layers.%d.self_attn.q_proj.weight",
         c->n_layers - 1);
    WANT("\"num_key_value_heads\" x \"head_dim\"", c->n_kv_heads * hd, hidden, D, "model.layers.%d.self_attn.k_proj.weight",
         c->n_layers - 1);
  }
  if (last_moe >= 0) {
    char key[48];
    snprintf(key, sizeof key, "\"%s\"", f->experts_key);
    WANT(key, c->moe.E, hidden, D, "model.layers.%d.%s.%s.weight", last_moe, f->ffn, f->router);
    snprintf(key, sizeof key, "\"%s\"", f->expert_H_key);
    if (c->family != MOE_LM_GPT_OSS) /* its fused experts: moe__gptoss_check_sizes */
      WANT(key, c->moe.H, hidden, D, "model.layers.%d.%s.experts.%d.%s.weight", last_moe, f->ffn, c->moe.E - 1,
           f->expert[0]);
    if (c->moe.shared_H && r)
      WANT("\"n_shared_experts\" x \"moe_intermediate_size\"", c->moe.shared_H, hidden, D,
           "model.layers.%d.mlp.shared_experts.gate_proj.weight", last_moe);
    else if (c->moe.shared_H)
      WANT("\"shared_expert_intermediate_size\"", c->moe.shared_H, hidden, D,
           "model.layers.%d.mlp.shared_expert.gate_proj.weight", last_moe);
  }
  if (first_dense >= 0)
    WANT("\"intermediate_size\"", c->dense_H, hidden, D, "model.layers.%d.mlp.gate_proj.weight", first_dense);
#undef WANT
  for (int i = 0; i < n; i++) {
    moe_st *fl = NULL;
    moe_tensor_view v;
    moe_status st = moe__lm_shard_of(s, names[i], &fl);
    if (st == MOE_OK) st = moe_st_get(fl, names[i], &v);
    MOE_TRY(st == MOE_OK, MOE_ERR_SHAPE, "%s/config.json: \"num_hidden_layers\" %d and \"%s\" %d ask for tensor '%s': %s",
            dir, c->n_layers, f->experts_key, c->moe.E, names[i], moe_last_error());
    MOE_TRY(v.ndim == 2 && v.shape[0] == nrows[i], MOE_ERR_SHAPE, "%s/config.json: %s is %lld, but tensor '%s' in %s has %lld rows",
            dir, rows[i], (long long)nrows[i], names[i], moe_st_path(fl), v.ndim ? (long long)v.shape[0] : 0LL);
    MOE_TRY(v.shape[1] == ncols[i], MOE_ERR_SHAPE, "%s/config.json: %s is %lld, but tensor '%s' in %s has %lld columns",
            dir, cols[i], (long long)ncols[i], names[i], moe_st_path(fl), (long long)v.shape[1]);
  }
  if (c->family != MOE_LM_GPT_OSS) return MOE_OK;
  moe__lm_reader rd = {s, file_of, read_tensor};
  return moe__gptoss_check_sizes(&rd, dir, c, c->n_layers - 1);
}

/* Every tensor of the checkpoint is one of the model's (expert-parallel, another rank's experts count),
 * or a rotary table older transformers saved (rotary_emb.inv_freq: recomputed): any other is an error,
 * not a weight silently left out. */
static moe_status check_unused(shards *s, const moe_lm_t *m) {
  const moe_lm_config *c = &m->cfg;
  int mtp = 0; /* DeepSeek's multi-token-prediction layers: numbered from num_hidden_layers, not used here */
  for (int i = 0; i < s->n; i++)
    for (int j = 0; j < moe_st_count(s->files[i]); j++) {
      moe_tensor_view v;
      MOE_CHECK(moe_st_at(s->files[i], j, &v));
      int layer = -1, e = -1, k;
      if (moe_lm_find(m, v.name) || strstr(v.name, ".rotary_emb.inv_freq") || moe__gptoss_source(c, v.name)) continue;
      if (is_deepseek(c->family) && sscanf(v.name, "model.layers.%d.", &layer) == 1 && layer >= c->n_layers) {
        mtp++;
        continue;
      }
      int other_rank = moe__lm_expert_of(c->family, v.name, &e, &k) && sscanf(v.name, "model.layers.%d.", &layer) == 1 &&
                       layer < c->n_layers && !moe_lm_layer_dense(c, layer) && e < c->moe.E;
      MOE_TRY(other_rank, MOE_ERR_FORMAT, "%s: tensor '%s' is not a parameter of the %s model config.json describes",
              moe_st_path(s->files[i]), v.name, moe_lm_family_name(c->family));
    }
  if (mtp)
    fprintf(stderr, "libmoe: %s: %d tensors of multi-token-prediction layers (model.layers.%d and on) skipped\n",
            moe_st_path(s->files[0]), mtp, c->n_layers);
  return MOE_OK;
}

/* Ref i of m if it is mappable (lm_map.h): F32 in its file, the whole tensor, of the ref's shape. */
static int mappable(const moe_lm_t *m, shards *s, int i, moe__lm_map_item *x) {
  const moe_tensor_ref *r = &m->refs[i];
  moe__lm_part p;
  moe_st *f = NULL;
  moe_tensor_view v;
  if (moe__gptoss_converted(m->cfg.family, r->name)) return 0;
  moe__lm_part_of(m, r, &p);
  if (p.whole.numel != r->numel) return 0; /* a rank's part of the tensor: read */
  /* errors here (a missing tensor, another shape) are the read's to report */
  if (moe__lm_shard_of(s, r->name, &f) != MOE_OK || !f || moe_st_get(f, r->name, &v) != MOE_OK) return 0;
  if (v.dtype != MOE_DT_F32 || v.ndim != r->ndim || memcmp(v.shape, r->shape, (size_t)r->ndim * sizeof *v.shape)) return 0;
  int k = 0;
  while (s->files[k] != f) k++;
  *x = (moe__lm_map_item){i, k, v.file_offset};
  return 1;
}

/* The mappable refs mapped (or where their pages do not line up, read) into m, flagged in done. */
static moe_status map_refs(moe_lm_t *m, shards *s, const char *dir, char *done) {
  moe__lm_map_item *x = malloc((size_t)m->nrefs * sizeof *x);
  int *fds = malloc((size_t)s->n * sizeof *fds), n = 0;
  const char **paths = malloc((size_t)s->n * sizeof *paths);
  moe_status st = x && fds && paths ? MOE_OK : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", dir);
  for (int i = 0; st == MOE_OK && i < s->n; i++) fds[i] = moe__st_fd(s->files[i]), paths[i] = moe_st_path(s->files[i]);
  for (int i = 0; st == MOE_OK && i < m->nrefs; i++) n += mappable(m, s, i, &x[n]);
  if (st == MOE_OK && n) st = moe__lm_map_items(m, x, n, fds, paths);
  for (int k = 0; st == MOE_OK && k < n; k++) done[x[k].ref] = 1;
  free(x), free(fds), free(paths);
  return st;
}

/* A mapped ref's values, all finite (as a read checks them). */
static moe_status check_mapped(shards *s, const moe_tensor_ref *r) {
  moe_st *f = NULL;
  moe_tensor_view v;
  MOE_CHECK(moe__lm_shard_of(s, r->name, &f));
  MOE_CHECK(moe_st_get(f, r->name, &v));
  return moe__st_expect_finite(f, &v, 0, r->data, r->numel);
}

moe_status moe_lm_load(moe_lm_t *m, const char *dir, const moe_lm_config *c) {
  MOE_TRY(m && dir, MOE_ERR_ARG, "moe_lm_load: NULL argument");
  if (moe__lm_gguf_is(dir)) return moe__lm_gguf_load(m, dir, c);
  memset(m, 0, sizeof *m);
  moe_lm_config own;
  if (!c) {
    MOE_CHECK(moe_lm_read_config(dir, &own));
    c = &own;
  }
  shards *s;
  moe_status st = moe__lm_shards_open(&s, dir, 1);
  if (st == MOE_OK) st = check_sizes(s, dir, c);
  if (st == MOE_OK) st = moe_lm_init(m, c);
  if (st != MOE_OK) {
    moe__lm_shards_release(s);
    return st;
  }
  moe__lm_reader rd = {s, file_of, read_tensor};
  char *mapped = calloc((size_t)m->nrefs, 1);
  st = mapped ? MOE_OK : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", dir);
  uint64_t bytes = 0; /* the parameters' fp32 bytes: what a copy takes */
  for (int i = 0; i < m->nrefs; i++) bytes += (uint64_t)m->refs[i].numel * 4;
  if (st == MOE_OK && moe__lm_mapping(bytes)) st = map_refs(m, s, dir, mapped);
  for (int i = 0; st == MOE_OK && i < m->nrefs; i++) {
    moe_st *f = NULL;
    if (mapped[i]) {
      st = check_mapped(s, &m->refs[i]);
      continue;
    }
    if (moe__gptoss_converted(c->family, m->refs[i].name)) { /* from gpt-oss's fused tensors */
      st = moe__gptoss_read_ref(&rd, m, &m->refs[i]);
      continue;
    }
    st = moe__lm_shard_of(s, m->refs[i].name, &f);
    if (st == MOE_OK) st = read_part(m, f, &m->refs[i]);
  }
  free(mapped);
  if (st == MOE_OK) st = check_unused(s, m);
  moe__lm_shards_release(s);
  if (st != MOE_OK) {
    moe_lm_free(m);
    return st;
  }
  moe_lm_params_changed(m);
  return MOE_OK;
}

/* A float as the shortest decimal that reads back as the same float ("1e-05", not 9.99999974737875e-06). */
static cJSON *float_json(float x) {
  char buf[32];
  for (int p = 6; p <= 9; p++) {
    snprintf(buf, sizeof buf, "%.*g", p, (double)x);
    if (strtof(buf, NULL) == x) break;
  }
  return cJSON_CreateRaw(buf);
}

/* Adds item under key, or deletes it and clears *ok (cJSON's adds fail silently when out of memory,
 * which would write a config.json with fields missing). */
static void add(cJSON *o, const char *key, cJSON *item, int *ok) {
  if (item && o && cJSON_AddItemToObject(o, key, item)) return;
  cJSON_Delete(item);
  *ok = 0;
}

/* mlp_only_layers: the dense layers by number (decoder_sparse_step is written as 1). */
static cJSON *dense_list(const moe_lm_config *c) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; a && i < c->n_layers; i++)
    if (moe_lm_layer_dense(c, i) && !cJSON_AddItemToArray(a, cJSON_CreateNumber(i))) {
      cJSON_Delete(a);
      return NULL;
    }
  return a;
}

/* rope_scaling: null, or YaRN's fields. */
static cJSON *yarn_json(const moe_lm_yarn *y) {
  if (y->factor == 0) return cJSON_CreateNull();
  cJSON *o = cJSON_CreateObject();
  int ok = 1;
  add(o, "type", cJSON_CreateString("yarn"), &ok);
  add(o, "factor", float_json(y->factor), &ok);
  add(o, "original_max_position_embeddings", cJSON_CreateNumber(y->original_max_pos), &ok);
  add(o, "beta_fast", float_json(y->beta_fast), &ok);
  add(o, "beta_slow", float_json(y->beta_slow), &ok);
  add(o, "mscale", float_json(y->mscale), &ok);
  add(o, "mscale_all_dim", float_json(y->mscale_all_dim), &ok);
  add(o, "truncate", cJSON_CreateBool(y->truncate), &ok);
  if (ok) return o;
  cJSON_Delete(o);
  return NULL;
}

/* DeepSeek's fields: what read_deepseek reads back as the same configuration. */
static void deepseek_json(cJSON *r, const moe_lm_config *c, int *ok) {
  const moe_layer_config *l = &c->moe;
  const moe_lm_mla *a = &c->mla;
  int first_k = 0, freq = 1;
  moe__lm_deepseek_layers(c, &first_k, &freq); /* moe_lm_init checked that it is such a pattern */
  static const char *const methods[] = {"greedy", "group_limited_greedy", "noaux_tc"};
  add(r, "n_shared_experts", l->shared_H ? cJSON_CreateNumber(l->shared_H / l->H) : cJSON_CreateNull(), ok);
  add(r, "first_k_dense_replace", cJSON_CreateNumber(first_k), ok);
  add(r, "moe_layer_freq", cJSON_CreateNumber(freq), ok);
  add(r, "kv_lora_rank", cJSON_CreateNumber(a->kv_lora_rank), ok);
  add(r, "q_lora_rank", a->q_lora_rank ? cJSON_CreateNumber(a->q_lora_rank) : cJSON_CreateNull(), ok);
  add(r, "qk_nope_head_dim", cJSON_CreateNumber(a->qk_nope_dim), ok);
  add(r, "qk_rope_head_dim", cJSON_CreateNumber(c->head_dim), ok);
  add(r, "v_head_dim", cJSON_CreateNumber(a->v_head_dim), ok);
  add(r, "rope_interleave", cJSON_CreateBool(a->rope_interleave), ok);
  add(r, "scoring_func", cJSON_CreateString(l->score == MOE_SCORE_SIGMOID ? "sigmoid" : "softmax"), ok);
  add(r, "topk_method", cJSON_CreateString(methods[l->select_bias ? 2 : l->n_group ? 1 : 0]), ok);
  add(r, "n_group", cJSON_CreateNumber(l->n_group ? l->n_group : 1), ok);
  add(r, "topk_group", cJSON_CreateNumber(l->n_group ? l->topk_group : 1), ok);
  add(r, "routed_scaling_factor", float_json(l->routed_scale), ok);
  add(r, "attention_bias", cJSON_CreateBool(0), ok);
  add(r, "rope_scaling", yarn_json(&c->yarn), ok);
}

/* The fields of the family beside Mixtral's common ones. */
static void family_json(cJSON *r, const moe_lm_config *c, int *ok) {
  const moe__lm_family_info *f = moe__lm_family(c->family);
  if (c->family == MOE_LM_MIXTRAL) return;
  const moe_layer_config *l = &c->moe;
  add(r, f->experts_key, cJSON_CreateNumber(l->E), ok);
  add(r, f->expert_H_key, cJSON_CreateNumber(l->H), ok);
  if (c->family == MOE_LM_GPT_OSS) {
    cJSON *lt = cJSON_CreateArray();
    for (int i = 0; lt && i < c->n_layers; i++) {
      int full = !c->sliding_window || (c->full_layers[i / 8] >> (i % 8) & 1);
      if (!cJSON_AddItemToArray(lt, cJSON_CreateString(full ? "full_attention" : "sliding_attention"))) {
        cJSON_Delete(lt);
        lt = NULL;
      }
    }
    add(r, "layer_types", lt, ok);
    add(r, "head_dim", cJSON_CreateNumber(c->head_dim), ok);
    add(r, "sliding_window", c->sliding_window ? cJSON_CreateNumber(c->sliding_window) : cJSON_CreateNull(), ok);
    add(r, "attention_bias", cJSON_CreateBool(c->qkv_bias), ok);
    add(r, "swiglu_alpha", float_json(l->swiglu_alpha), ok);
    add(r, "swiglu_limit", float_json(l->swiglu_limit), ok);
    add(r, "rope_scaling", yarn_json(&c->yarn), ok); /* null: absent would be YaRN */
    return;
  }
  add(r, "norm_topk_prob", cJSON_CreateBool(l->normalize_topk == 1 || (l->normalize_topk < 0 && l->top_k > 1)), ok);
  if (c->family == MOE_LM_OLMOE) {
    add(r, "clip_qkv", c->clip_qkv > 0 ? float_json(c->clip_qkv) : cJSON_CreateNull(), ok);
    add(r, "attention_bias", cJSON_CreateBool(0), ok);
    return;
  }
  if (c->dense_H) add(r, "intermediate_size", cJSON_CreateNumber(c->dense_H), ok);
  if (is_deepseek(c->family)) {
    deepseek_json(r, c, ok);
    return;
  }
  add(r, "decoder_sparse_step", cJSON_CreateNumber(1), ok);
  add(r, "mlp_only_layers", dense_list(c), ok);
  add(r, "use_sliding_window", cJSON_CreateBool(0), ok);
  if (c->family == MOE_LM_QWEN3_MOE) {
    add(r, "head_dim", cJSON_CreateNumber(c->head_dim), ok);
    add(r, "attention_bias", cJSON_CreateBool(0), ok);
    return;
  }
  add(r, "shared_expert_intermediate_size", cJSON_CreateNumber(l->shared_H), ok);
  add(r, "qkv_bias", cJSON_CreateBool(c->qkv_bias), ok);
}

static char *config_json(const moe_lm_config *c) {
  const moe__lm_family_info *f = moe__lm_family(c->family);
  int mixtral = c->family == MOE_LM_MIXTRAL;
  cJSON *r = cJSON_CreateObject(), *arch = cJSON_CreateArray();
  int ok = arch && cJSON_AddItemToArray(arch, cJSON_CreateString(f->architecture)) && arch->child;
  add(r, "architectures", arch, &ok);
  add(r, "model_type", cJSON_CreateString(f->model_type), &ok);
  add(r, "hidden_act", cJSON_CreateString("silu"), &ok);
  add(r, "torch_dtype", cJSON_CreateString("float32"), &ok);
  const struct { const char *key; int v; } ints[] = {
      {"vocab_size", c->vocab},           {"hidden_size", c->moe.D},
      {"intermediate_size", c->moe.H},    {"num_hidden_layers", c->n_layers},
      {"num_attention_heads", c->n_heads}, {"num_key_value_heads", c->n_kv_heads},
      {"head_dim", c->head_dim},          {"max_position_embeddings", c->max_seq},
      {"num_local_experts", c->moe.E},    {"num_experts_per_tok", c->moe.top_k},
  };
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) /* Mixtral's; the others have their own names */
    if (mixtral || (strcmp(ints[i].key, "intermediate_size") && strcmp(ints[i].key, "head_dim") &&
                    strcmp(ints[i].key, "num_local_experts")))
      add(r, ints[i].key, cJSON_CreateNumber(ints[i].v), &ok);
  family_json(r, c, &ok);
  add(r, "rope_theta", float_json(c->rope_theta), &ok);
  add(r, "rms_norm_eps", float_json(c->rms_eps), &ok);
  add(r, "router_aux_loss_coef", float_json(c->aux_coef), &ok);
  add(r, "output_router_logits", cJSON_CreateBool(c->aux_coef > 0), &ok);
  add(r, "tie_word_embeddings", cJSON_CreateBool(c->tie_embeddings), &ok);
  if (mixtral)
    add(r, "sliding_window", c->sliding_window ? cJSON_CreateNumber(c->sliding_window) : cJSON_CreateNull(), &ok);
  add(r, "attention_dropout", cJSON_CreateNumber(0), &ok);
  char *text = ok ? cJSON_Print(r) : NULL;
  cJSON_Delete(r);
  return text;
}

/* A tensor of the saved file, made at save (the writer's fill): a ref's fp32 values copied a chunk at a
 * time, or an expert's tensor the model does not hold, read from the checkpoint whole into the writer's
 * buffer (gpt-oss's fused tensors an expert's slab a chunk, lm_gptoss.h). */
typedef struct {
  const float *x;       /* or NULL: read */
  moe__lm_expert_src *in;
  const moe_lm_config *oss; /* or NULL; else fused tensor t of the layer, expert by expert */
  int layer, t, e;      /* the reader's tensor t of expert e (lm_gguf.h) */
  size_t chunk;         /* bytes made at a time: an expert's slab, or 0: the whole tensor */
  char name[64];
} saved;

static moe_status fill_saved(void *ctx, size_t off, void *dst, size_t n) {
  const saved *t = ctx;
  if (t->oss) return moe__gptoss_fused_read(t->oss, t->layer, t->t, t->in, (int)(off / t->chunk), dst, t->name);
  if (!t->x) return moe__lm_expert_src_read(t->in, t->layer, t->t, t->e, dst, t->name);
  memcpy(dst, (const char *)t->x + off, n);
  return MOE_OK;
}

#define SAVE_CHUNK ((size_t)4 << 20) /* bytes of a ref copied at a time */

/* Adds t (its fields set; kept in the list *ts of *n, grown here) under t.name of shape (a, b), or of
 * ref r's shape. */
static moe_status add_saved(moe_st_writer *w, saved ***ts, int *n, saved t, int ndim, const int64_t *shape) {
  saved **g = realloc(*ts, (size_t)(*n + 1) * sizeof *g), *p = g ? malloc(sizeof *p) : NULL;
  if (g) *ts = g;
  MOE_TRY(p, MOE_ERR_NOMEM, "tensor '%s': out of memory", t.name);
  *p = t;
  g[(*n)++] = p;
  return moe_st_writer_add_fill(w, p->name, MOE_DT_F32, ndim, shape, p->x ? SAVE_CHUNK : p->chunk, fill_saved, p);
}

/* Layer i's experts under their Hugging Face names, read from in at save: where the refs of a model
 * holding them would be (after the router and its selection bias, or gpt-oss's router bias), in their
 * order; gpt-oss's as its fused tensors. */
static moe_status add_streamed_experts(const moe_lm_t *m, moe_st_writer *w, moe__lm_expert_src *in, int i,
                                       saved ***ts, int *n) {
  const moe__lm_family_info *f = moe__lm_family(m->cfg.family);
  int64_t D = m->cfg.moe.D, H = m->cfg.moe.H, shape[3];
  if (m->cfg.family == MOE_LM_GPT_OSS) {
    saved t = {.in = in, .oss = &m->cfg, .layer = i};
    for (int nd; (nd = moe__gptoss_fused(&m->cfg, i, t.t, t.name, sizeof t.name, shape)); t.t++) {
      t.chunk = (size_t)(shape[1] * (nd == 3 ? shape[2] : 1)) * sizeof(float);
      MOE_CHECK(add_saved(w, ts, n, t, nd, shape));
    }
    return MOE_OK;
  }
  for (int e = 0; e < m->cfg.moe.E; e++)
    for (int j = 0; j < 3; j++) {
      int k = f->fc[j]; /* fc2 (down) is (D, H) */
      saved t = {.in = in, .layer = i, .t = 2 * k, .e = e};
      snprintf(t.name, sizeof t.name, "model.layers.%d.%s.experts.%d.%s.weight", i, f->ffn, e, f->expert[j]);
      shape[0] = k == 1 ? D : H, shape[1] = k == 1 ? H : D;
      MOE_CHECK(add_saved(w, ts, n, t, 2, shape));
    }
  return MOE_OK;
}

/* Whether ref r is the last of layer i's refs before its experts' (the router, its selection bias, or
 * gpt-oss's router bias) in a model whose layer i holds no experts. */
static int experts_follow(const moe_lm_t *m, const moe_tensor_ref *r, int *i) {
  const moe__lm_family_info *f = moe__lm_family(m->cfg.family);
  char want[128];
  if (sscanf(r->name, "model.layers.%d.", i) != 1 || *i < 0 || *i >= m->cfg.n_layers || moe_lm_layer_dense(&m->cfg, *i) ||
      moe_layer_param(&m->layers[*i], "experts.fc1.weight"))
    return 0;
  if (m->cfg.family == MOE_LM_GPT_OSS) snprintf(want, sizeof want, "model.layers.%d.mlp.router.bias", *i);
  else if (m->cfg.moe.select_bias)
    snprintf(want, sizeof want, "model.layers.%d.%s.gate.e_score_correction_bias", *i, f->ffn);
  else snprintf(want, sizeof want, "model.layers.%d.%s.%s.weight", *i, f->ffn, f->router);
  return !strcmp(r->name, want);
}

moe_status moe__lm_save_dir(const moe_lm_t *m, const char *dir, moe__lm_expert_src *in) {
  MOE_TRY(m && m->st && dir, MOE_ERR_ARG, "moe_lm_save: NULL argument");
  MOE_TRY(m->cfg.moe.expert_type <= 0, MOE_ERR_ARG,
          "moe_lm_save: %s: the experts (and the weights with kernels of their type) are %s bytes, not parameters "
          "(load with moe.expert_type -1 to save)", dir,
          moe_gguf_type_name((moe_gguf_type)m->cfg.moe.expert_type));
  if (moe_dist_size(m->cfg.moe.dist) > 1) return moe__lm_save_ranks(m, dir);
  int created = mkdir(dir, 0755) == 0; /* removed again if the save fails: no empty directory left */
  MOE_TRY(created || errno == EEXIST, MOE_ERR_IO, "%s: cannot create the directory: %s", dir, strerror(errno));
  char path[4096];
  moe_st_writer *w;
  moe_status st = moe_st_writer_new(&w);
  if (st != MOE_OK && created) rmdir(dir);
  MOE_CHECK(st);
  saved **ts = NULL;
  int n = 0, layer;
  st = moe_st_writer_meta(w, "format", "pt");
  for (int i = 0; st == MOE_OK && i < m->nrefs; i++) {
    const moe_tensor_ref *r = &m->refs[i];
    if (moe__gptoss_converted(m->cfg.family, r->name)) st = moe__gptoss_write_ref(m, r, w); /* HF's fused layout */
    else if (!r->data && r->numel) /* moe_lm_buffer_experts' experts */
      st = moe__error(MOE_ERR_STATE, __FILE__, __LINE__, "moe_lm_save: parameter '%s' has no values (served by an "
                      "expert cache)", r->name);
    else {
      saved t = {.x = r->data};
      snprintf(t.name, sizeof t.name, "%s", r->name);
      st = add_saved(w, &ts, &n, t, r->ndim, r->shape);
    }
    if (st == MOE_OK && experts_follow(m, r, &layer))
      st = in ? add_streamed_experts(m, w, in, layer, &ts, &n)
              : moe__error(MOE_ERR_STATE, __FILE__, __LINE__, "moe_lm_save: layer %d's experts are not parameters "
                           "(streamed): moe_lm_convert writes them from the checkpoint", layer);
  }
  path_in(path, sizeof path, dir, "model.safetensors");
  if (st == MOE_OK) st = moe_st_writer_save(w, path);
  moe_st_writer_free(w);
  if (in) moe__lm_expert_src_close(in);
  for (int i = 0; i < n; i++) free(ts[i]);
  free(ts);
  if (st != MOE_OK && created) rmdir(dir);
  MOE_CHECK(st);
  path_in(path, sizeof path, dir, MOE_LM_INDEX_JSON);
  MOE_TRY(unlink(path) == 0 || errno == ENOENT, MOE_ERR_IO, "%s: cannot remove the old index: %s", path,
          strerror(errno));
  char *text = config_json(&m->cfg);
  MOE_TRY(text, MOE_ERR_NOMEM, "out of memory for config.json");
  path_in(path, sizeof path, dir, "config.json");
  st = moe_write_file_atomic(path, text, strlen(text));
  free(text);
  return st;
}

moe_status moe_lm_save(const moe_lm_t *m, const char *dir) { return moe__lm_save_dir(m, dir, NULL); }
