/* The language-model families beside Mixtral (Qwen2-MoE, Qwen3-MoE, OLMoE) against the PyTorch
 * re-implementations of dev/lm_families_ref.py (tests/fixtures/lm/<family>/: Hugging Face checkpoint
 * directories in each family's layout): logits, losses and every gradient; the KV-cache decode against
 * the full forward; save and load under the family's names; training from a loaded checkpoint; and
 * config.json fields the loader does not understand or that do not fit the weights. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "lm_check.h"
#include "lm_corpus.h"
#include "run_cli.h"
#include "test.h"

static const char *const families[] = {"qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss"};
#define NFAM (int)(sizeof families / sizeof families[0])

TEST(lm_matches_pytorch_qwen2_moe) { ASSERT(lm_check_case("qwen2_moe")); }
TEST(lm_matches_pytorch_qwen3_moe) { ASSERT(lm_check_case("qwen3_moe")); }
TEST(lm_matches_pytorch_olmoe) { ASSERT(lm_check_case("olmoe")); }
TEST(lm_matches_pytorch_gpt_oss) { ASSERT(lm_check_case("gpt_oss")); }
/* the same model with its experts as gpt-oss checkpoints store them: MXFP4 blocks and scales, dequantized */
TEST(lm_matches_pytorch_gpt_oss_mxfp4) { ASSERT(lm_check_case("gpt_oss_mxfp4")); }
/* YaRN as the releases configure it (truncate false: the correction range not rounded) */
TEST(lm_matches_pytorch_gpt_oss_yarn) { ASSERT(lm_check_case("gpt_oss_yarn")); }
/* output_router_logits true: transformers' balance loss over the router's top-k scores, its gradient */
TEST(lm_matches_pytorch_gpt_oss_aux) { ASSERT(lm_check_case("gpt_oss_aux")); }

/* Each family's fixture position by position through the KV cache (the first tokens at once, then one
 * and the rest), against one forward of the whole sequences. */
TEST(lm_families_kv_cache_decode_matches_full_forward) {
  for (int fi = 0; fi < NFAM; fi++) {
    char dir[512];
    moe_lm_t m;
    int B, T;
    ASSERT_OK(moe_lm_load(&m, lm_case_dir(families[fi], dir, sizeof dir), NULL));
    int32_t *t = lm_fixture_tokens(dir, &B, &T);
    ASSERT(t && T >= 5);
    size_t V = (size_t)m.cfg.vocab;
    float *full = malloc((size_t)B * T * V * 4);
    int32_t *in = malloc((size_t)B * T * 4);
    ASSERT(full && in);
    ASSERT_OK(moe_lm_forward(&m, t, NULL, B, T, NULL));
    memcpy(full, moe_lm_logits(&m), (size_t)B * T * V * 4);
    moe_lm_cache *kv;
    ASSERT_OK(moe_lm_cache_new(&kv, &m, B));
    const int steps[3][2] = {{0, 3}, {3, 1}, {4, T - 4}}; /* positions [p, p + n) */
    double worst = 0;
    for (int s = 0; s < 3; s++) {
      int p = steps[s][0], n = steps[s][1];
      for (int b = 0; b < B; b++) memcpy(in + b * n, t + b * T + p, (size_t)n * 4);
      moe_status st = moe_lm_decode(&m, kv, in, n);
      if (st) FAIL_("%s decode: %s", families[fi], moe_last_error());
      for (int b = 0; b < B; b++)
        for (size_t i = 0; i < n * V; i++)
          worst = fmax(worst, fabs(moe_lm_logits(&m)[(size_t)b * n * V + i] - full[((size_t)b * T + p) * V + i]));
    }
    ASSERT_EQ_INT(moe_lm_cache_len(kv), T);
    moe_lm_cache_free(kv);
    moe_lm_free(&m);
    free(full), free(in), free(t);
    fprintf(stderr, "  %s: cached decoding against the full forward: max logit diff %.3g\n", families[fi], worst);
    ASSERT(worst < 1e-5);
  }
}

/* Whether every tensor of file a is in file b with the same shape, and the counts agree. */
static int same_tensor_names(const char *a, const char *b) {
  moe_st *fa = NULL, *fb = NULL;
  int ok = moe_st_open(&fa, a) == MOE_OK && moe_st_open(&fb, b) == MOE_OK && moe_st_count(fa) == moe_st_count(fb);
  for (int i = 0; ok && i < moe_st_count(fa); i++) {
    moe_tensor_view v, w;
    ok = moe_st_at(fa, i, &v) == MOE_OK && moe_st_get(fb, v.name, &w) == MOE_OK && v.ndim == w.ndim &&
         !memcmp(v.shape, w.shape, sizeof(int64_t) * (size_t)v.ndim);
    if (!ok) fprintf(stderr, "  tensor %d of %s is not in %s as it is\n", i, a, b);
  }
  moe_st_close(fa);
  moe_st_close(fb);
  return ok;
}

/* Load, save, load: the family's tensor names and config.json (model_type, architectures), the same
 * configuration and bit-identical logits. */
TEST(lm_families_save_load_round_trip) {
  for (int fi = 0; fi < NFAM; fi++) {
    char src[512], dir[512], a[700], b[700];
    ASSERT(lm_check_save_load(families[fi], dir, sizeof dir));
    snprintf(a, sizeof a, "%s/model.safetensors", lm_case_dir(families[fi], src, sizeof src));
    snprintf(b, sizeof b, "%s/model.safetensors", dir);
    ASSERT(same_tensor_names(a, b));
    snprintf(b, sizeof b, "%s/config.json", dir);
    char *text = test_read_file(b, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    int ok = cJSON_IsString(mt) && !strcmp(mt->valuestring, families[fi]);
    cJSON_Delete(j);
    if (!ok) FAIL_("%s: the saved config.json's model_type is not the family's", families[fi]);
  }
}

/* A few SGD steps from the loaded checkpoint on its fixture's tokens (as one sequence, each predicting
 * the next), then a save and load: the loss falls, and the reloaded model has the trained loss. */
TEST(lm_families_train_from_checkpoint) {
  for (int fi = 0; fi < NFAM; fi++) ASSERT(lm_check_train_from_checkpoint(families[fi], 0, NULL));
}

/* Fields the loader does not understand, values it does not implement, sizes the weights do not have
 * and tensors missing: each an error naming config.json (or the weights file) and the field (tensor). */
TEST(lm_families_bad_configs_name_file_and_field) {
  static const struct {
    const char *family, *field, *value, *drop;
    moe_status st;
    const char *want;
  } cases[] = {
      {"qwen3_moe", "shared_expert_intermediate_size", "8", NULL, MOE_ERR_FORMAT,
       "field \"shared_expert_intermediate_size\" is not understood for model_type \"qwen3_moe\""},
      {"olmoe", "head_dim", "8", NULL, MOE_ERR_FORMAT, "field \"head_dim\" is not understood"},
      {"qwen2_moe", "frobnicate", "1", NULL, MOE_ERR_FORMAT, "field \"frobnicate\" is not understood"},
      {"qwen2_moe", "model_type", "\"llama\"", NULL, MOE_ERR_FORMAT, "\"model_type\" is \"llama\""},
      {"qwen2_moe", "architectures", "[\"Qwen3MoeForCausalLM\"]", NULL, MOE_ERR_FORMAT,
       "\"Qwen3MoeForCausalLM\" is not model_type \"qwen2_moe\"'s"},
      {"qwen3_moe", "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4}", NULL, MOE_ERR_FORMAT,
       "\"rope_scaling\" of type yarn is not supported"},
      {"qwen3_moe", "rope_parameters", "{\"rope_type\": \"llama3\", \"rope_theta\": 10}", NULL, MOE_ERR_FORMAT,
       "\"rope_parameters\" of rope_type llama3"},
      {"qwen2_moe", "use_sliding_window", "true", NULL, MOE_ERR_FORMAT, "\"use_sliding_window\" true is not supported"},
      {"qwen3_moe", "attention_bias", "true", NULL, MOE_ERR_FORMAT, "\"attention_bias\" true is not supported"},
      {"olmoe", "clip_qkv", "-1", NULL, MOE_ERR_FORMAT, "\"clip_qkv\" must be null or a positive number"},
      {"qwen3_moe", "mlp_only_layers", "[3]", NULL, MOE_ERR_FORMAT, "\"mlp_only_layers\" entry 3 is not a layer"},
      {"qwen2_moe", "attention_dropout", "0.1", NULL, MOE_ERR_FORMAT, "\"attention_dropout\" 0.1 is not supported"},
      {"qwen3_moe", "moe_intermediate_size", "13", NULL, MOE_ERR_SHAPE,
       "\"moe_intermediate_size\" is 13, but tensor 'model.layers.2.mlp.experts.3.gate_proj.weight'"},
      {"qwen3_moe", "intermediate_size", "30", NULL, MOE_ERR_SHAPE,
       "\"intermediate_size\" is 30, but tensor 'model.layers.0.mlp.gate_proj.weight'"},
      {"qwen2_moe", "shared_expert_intermediate_size", "21", NULL, MOE_ERR_SHAPE,
       "\"shared_expert_intermediate_size\" is 21, but tensor 'model.layers.2.mlp.shared_expert.gate_proj.weight'"},
      {"olmoe", "num_experts", "5", NULL, MOE_ERR_SHAPE, "\"num_experts\" is 5, but tensor"},
      {"qwen3_moe", "mlp_only_layers", "[]", NULL, MOE_ERR_MISSING, "no tensor 'model.layers.0.mlp.gate.weight'"},
      {"qwen3_moe", "decoder_sparse_step", "2", NULL, MOE_ERR_MISSING, "no tensor 'model.layers.2.mlp.gate_proj.weight'"},
      {"qwen2_moe", "shared_expert_intermediate_size", NULL, NULL, MOE_ERR_MISSING,
       "no \"shared_expert_intermediate_size\""},
      {"qwen3_moe", "vocab_size", "40", "model.layers.1.self_attn.k_norm.weight", MOE_ERR_MISSING,
       "model.layers.1.self_attn.k_norm.weight"},
      {"qwen2_moe", "vocab_size", "48", "model.layers.0.self_attn.v_proj.bias", MOE_ERR_MISSING,
       "model.layers.0.self_attn.v_proj.bias"},
      {"qwen2_moe", "vocab_size", "48", "model.layers.2.mlp.shared_expert_gate.weight", MOE_ERR_MISSING,
       "model.layers.2.mlp.shared_expert_gate.weight"},
      {"gpt_oss", "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 32.0, \"attention_factor\": 2}", NULL,
       MOE_ERR_FORMAT, "\"rope_scaling\" field \"attention_factor\" is not supported for yarn"},
      {"gpt_oss", "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 2}", NULL, MOE_ERR_FORMAT,
       "\"rope_scaling\" of type linear is not supported"},
      {"gpt_oss", "layer_types", "[\"sliding_attention\"]", NULL, MOE_ERR_FORMAT,
       "\"layer_types\" must be a list of \"num_hidden_layers\" 3 entries"},
      {"gpt_oss", "layer_types", "[\"sliding_attention\", \"chunked_attention\", \"full_attention\"]", NULL,
       MOE_ERR_FORMAT, "\"layer_types\" entry 1 is not"},
      {"gpt_oss", "quantization_config", "{\"quant_method\": \"bitsandbytes\"}", NULL, MOE_ERR_FORMAT,
       "\"quantization_config\" other than quant_method \"mxfp4\""},
      {"gpt_oss", "experts_per_token", "3", NULL, MOE_ERR_FORMAT, "\"experts_per_token\" 3 is not \"num_experts_per_tok\" 2"},
      {"gpt_oss", "swiglu_limit", "0", NULL, MOE_ERR_FORMAT, "\"swiglu_limit\" must be > 0"},
      {"gpt_oss", "intermediate_size", "16", NULL, MOE_ERR_SHAPE,
       "\"intermediate_size\" 16 do not fit tensor 'model.layers.2.mlp.experts.gate_up_proj'"},
      {"gpt_oss_mxfp4", "intermediate_size", "16", NULL, MOE_ERR_SHAPE,
       "\"intermediate_size\" 16 do not fit tensor 'model.layers.2.mlp.experts.gate_up_proj_blocks'"},
      {"gpt_oss", "num_local_experts", "5", NULL, MOE_ERR_SHAPE,
       "\"num_local_experts\" is 5, but tensor 'model.layers.2.mlp.router.weight'"},
      {"gpt_oss", "vocab_size", "48", "model.layers.1.self_attn.sinks", MOE_ERR_MISSING, "model.layers.1.self_attn.sinks"},
      {"gpt_oss", "vocab_size", "48", "model.layers.0.mlp.experts.gate_up_proj_bias", MOE_ERR_MISSING,
       "model.layers.0.mlp.experts.gate_up_proj_bias"},
      {"gpt_oss", "vocab_size", "48", "model.layers.1.mlp.experts.down_proj", MOE_ERR_MISSING,
       "model.layers.1.mlp.experts.down_proj"},
      {"gpt_oss_mxfp4", "vocab_size", "48", "model.layers.0.mlp.experts.down_proj_scales", MOE_ERR_MISSING,
       "model.layers.0.mlp.experts.down_proj_scales"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char dir[512];
    ASSERT(lm_patched(cases[i].family, cases[i].field, cases[i].value, cases[i].drop, dir, sizeof dir));
    moe_lm_t m;
    moe_status st = moe_lm_load(&m, dir, NULL);
    const char *err = moe_last_error();
    if (st != cases[i].st || !strstr(err, cases[i].want) || !strstr(err, dir)) {
      if (st == MOE_OK) moe_lm_free(&m);
      FAIL_("%s %s=%s: status %d, '%s'; want %d and '%s' in %s", cases[i].family, cases[i].field,
            cases[i].value ? cases[i].value : "(removed)", st, err, cases[i].st, cases[i].want, dir);
    }
  }
}

/* decoder_sparse_step and mlp_only_layers as transformers reads them; the known-and-ignored fields of
 * released configs (sliding_window with use_sliding_window false, max_window_layers, router_z_loss_coef)
 * read; rope_parameters' rope_theta counts. */
TEST(lm_families_config_layer_kinds_and_ignored_fields) {
  char dir[512];
  moe_lm_config c;
  ASSERT(lm_patched("qwen3_moe", "decoder_sparse_step", "2", NULL, dir, sizeof dir));
  ASSERT_OK(moe_lm_read_config(dir, &c)); /* mlp_only_layers [0]: 0 dense, 1 MoE, 2 dense by the step */
  ASSERT(moe_lm_layer_dense(&c, 0) && !moe_lm_layer_dense(&c, 1) && moe_lm_layer_dense(&c, 2));
  ASSERT(c.family == MOE_LM_QWEN3_MOE && c.qk_norm == MOE_QK_NORM_HEAD && c.head_dim == 8 && c.dense_H == 28);
  ASSERT(c.moe.normalize_topk == 1 && c.moe.H == 12 && c.moe.E == 4);
  ASSERT(lm_patched("qwen2_moe", "model_type", NULL, NULL, dir, sizeof dir)); /* the architecture decides */
  ASSERT_OK(moe_lm_read_config(dir, &c));
  ASSERT(c.family == MOE_LM_QWEN2_MOE && c.qkv_bias && c.moe.shared_H == 20 && c.moe.shared_gate);
  ASSERT(moe_lm_layer_dense(&c, 1) && !moe_lm_layer_dense(&c, 0) && c.moe.normalize_topk == 0);
  ASSERT(c.sliding_window == 0); /* 4096 in the file, but use_sliding_window is false */
  ASSERT(lm_patched("olmoe", "router_z_loss_coef", "0.001", NULL, dir, sizeof dir));
  ASSERT_OK(moe_lm_read_config(dir, &c));
  ASSERT(c.family == MOE_LM_OLMOE && c.qk_norm == MOE_QK_NORM_FULL && c.clip_qkv == 1.25f && c.head_dim == 8);
  ASSERT(lm_patched("olmoe", "rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 500000.0}", NULL, dir,
                 sizeof dir));
  ASSERT_OK(moe_lm_read_config(dir, &c));
  ASSERT(c.rope_theta == 500000.0f);
  /* gpt-oss: layer_types absent is transformers' alternation (even layers sliding), sliding_window absent 128 */
  ASSERT(lm_patched("gpt_oss", "layer_types", NULL, NULL, dir, sizeof dir));
  ASSERT_OK(moe_lm_read_config(dir, &c));
  ASSERT(c.family == MOE_LM_GPT_OSS && c.sliding_window == 4 && c.full_layers[0] == 2 && c.attn_sinks && c.o_bias);
  ASSERT(c.moe.act == MOE_ACT_SWIGLU_OAI && c.moe.swiglu_limit == 1.5f && c.moe.swiglu_alpha == 1.702f && c.head_dim == 12);
  ASSERT(c.aux_coef == 0 && c.moe.gate_bias && c.moe.expert_bias && c.moe.normalize_topk == 1);
  ASSERT(lm_patched("gpt_oss", "sliding_window", NULL, NULL, dir, sizeof dir));
  ASSERT_OK(moe_lm_read_config(dir, &c));
  ASSERT(c.sliding_window == 128 && c.full_layers[0] == 2); /* the fixture's layer_types: 1 full */
  ASSERT(lm_patched("gpt_oss", "sliding_window", "null", NULL, dir, sizeof dir));
  ASSERT_OK(moe_lm_read_config(dir, &c));
  ASSERT(c.sliding_window == 0 && c.full_layers[0] == 0); /* no window: every layer full */
  ASSERT(lm_patched("gpt_oss", "attention_bias", "false", NULL, dir, sizeof dir));
  ASSERT_OK(moe_lm_read_config(dir, &c));
  ASSERT(!c.qkv_bias && !c.o_bias);
  /* gpt-oss's YaRN: the released configs' rope_scaling, and GptOssConfig's default when it is absent */
  ASSERT(lm_patched("gpt_oss", "rope_scaling", "{\"beta_fast\": 32.0, \"beta_slow\": 1.0, \"factor\": 32.0, "
                    "\"original_max_position_embeddings\": 4096, \"rope_type\": \"yarn\", \"truncate\": false}",
                    NULL, dir, sizeof dir));
  ASSERT_OK(moe_lm_read_config(dir, &c));
  ASSERT(c.yarn.factor == 32 && c.yarn.original_max_pos == 4096 && c.yarn.beta_fast == 32 && c.yarn.beta_slow == 1 &&
         c.yarn.mscale == 1 && c.yarn.mscale_all_dim == 0 && c.yarn.truncate == 0);
  ASSERT(lm_patched("gpt_oss", "rope_scaling", NULL, NULL, dir, sizeof dir));
  ASSERT_OK(moe_lm_read_config(dir, &c));
  ASSERT(c.yarn.factor == 32 && c.yarn.original_max_pos == 4096 && c.yarn.truncate == 0);
}

/* A model built from a configuration (not a checkpoint) of each family: initialized as HF does (biases
 * 0, norms 1), saved in the family's layout and loaded back with the same parameters. */
TEST(lm_families_init_save_load) {
  for (int fi = 0; fi < NFAM; fi++) {
    char src[512], dir[512], name[64];
    moe_lm_config c;
    ASSERT_OK(moe_lm_read_config(lm_case_dir(families[fi], src, sizeof src), &c));
    moe_lm_t m, r;
    ASSERT_OK(moe_lm_init(&m, &c));
    moe_lm_init_params(&m, 7);
    int biases = 0, norms = 0;
    for (int i = 0; i < m.nrefs; i++) {
      const moe_tensor_ref *ref = &m.refs[i];
      const float *d = ref->data;
      if (strstr(ref->name, "bias")) {
        biases++;
        ASSERT(d[0] == 0 && d[ref->numel - 1] == 0);
      }
      if (strstr(ref->name, "norm.")) {
        norms++;
        ASSERT(d[0] == 1 && d[ref->numel - 1] == 1);
      }
    }
    /* gpt-oss: q, k, v, o, the router's, the experts' fc1, fc3 (gate_up_proj_bias) and down_proj_bias */
    ASSERT_EQ_INT(biases, c.family == MOE_LM_GPT_OSS ? 8 * c.n_layers : c.qkv_bias ? 3 * c.n_layers : 0);
    ASSERT_EQ_INT(norms, 2 * c.n_layers + 1 + (c.qk_norm ? 2 * c.n_layers : 0));
    snprintf(name, sizeof name, "lm_init_%s", families[fi]);
    ASSERT_OK(moe_lm_save(&m, test_tmp_path(name, dir, sizeof dir)));
    ASSERT_OK(moe_lm_load(&r, dir, NULL));
    ASSERT_EQ_INT(r.nrefs, m.nrefs);
    for (int i = 0; i < m.nrefs; i++) {
      ASSERT(!strcmp(m.refs[i].name, r.refs[i].name));
      ASSERT(!memcmp(m.refs[i].data, r.refs[i].data, m.refs[i].numel * 4));
    }
    moe_lm_free(&m);
    moe_lm_free(&r);
  }
}

/* A tensor the model does not have (a Mixtral expert name in a Qwen checkpoint, lm_head beside tied
 * embeddings) is an error naming the file and the tensor; an old rotary table is not. */
TEST(lm_families_unknown_tensors_are_errors) {
  static const struct { const char *family, *extra; int ok; } cases[] = {
      {"qwen2_moe", "model.layers.0.block_sparse_moe.experts.0.w1.weight", 0},
      {"qwen3_moe", "lm_head.weight", 0},
      {"olmoe", "model.layers.0.mlp.experts.4.up_proj.weight", 0}, /* expert 4 of 4 */
      {"olmoe", "model.layers.1.self_attn.rotary_emb.inv_freq", 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char dir[512], src[700], dst[700], name[64];
    snprintf(name, sizeof name, "lm_extra_%zu", i);
    test_tmp_path(name, dir, sizeof dir);
    ASSERT(mkdir(dir, 0755) == 0);
    lm_case_dir(cases[i].family, src, sizeof src);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    strcat(src, "/config.json");
    char *text = test_read_file(src, NULL);
    ASSERT(text && moe_write_file_atomic(dst, text, strlen(text)) == MOE_OK);
    free(text);
    *strrchr(src, '/') = 0;
    strcat(src, "/model.safetensors");
    moe_st *f = NULL;
    moe_st_writer *w;
    ASSERT_OK(moe_st_open(&f, src));
    ASSERT_OK(moe_st_writer_new(&w));
    for (int j = 0; j < moe_st_count(f); j++) {
      moe_tensor_view v;
      ASSERT_OK(moe_st_at(f, j, &v));
      ASSERT_OK(moe_st_writer_add(w, v.name, v.dtype, v.ndim, v.shape, v.data));
    }
    float zero[4] = {0};
    int64_t shape[1] = {4};
    ASSERT_OK(moe_st_writer_add(w, cases[i].extra, MOE_DT_F32, 1, shape, zero));
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    ASSERT_OK(moe_st_writer_save(w, dst));
    moe_st_writer_free(w);
    moe_st_close(f);
    moe_lm_t m;
    moe_status st = moe_lm_load(&m, dir, NULL);
    if (st == MOE_OK) moe_lm_free(&m);
    if (cases[i].ok ? st != MOE_OK : st != MOE_ERR_FORMAT || !strstr(moe_last_error(), cases[i].extra) ||
                                         !strstr(moe_last_error(), dst))
      FAIL_("%s with '%s': status %d, %s", cases[i].family, cases[i].extra, st, st ? moe_last_error() : "loaded");
  }
}

/* Greedy `moe generate` of each family's fixture: the full forwards' argmax chain in one process, and
 * the same tokens with the experts over 2 ranks (each loading its own experts by the family's names;
 * shared expert and dense layers replicated). The MPI half is skipped without mpirun. */
TEST(lm_families_generate_one_process_and_expert_parallel) {
  for (int fi = 0; fi < NFAM; fi++) {
    char dir[512], args[1024], out1[512], out2[512], err[2048], text[256], want[256] = "";
    lm_case_dir(families[fi], dir, sizeof dir);
    test_tmp_path("lm_fam_gen1.txt", out1, sizeof out1);
    test_tmp_path("lm_fam_gen2.txt", out2, sizeof out2);
    snprintf(args, sizeof args, "generate --checkpoint %s --prompt-ids '5 9 1' --max-tokens 6 --temperature 0 "
             "--ignore-eos --threads 1", dir);
    if (run_moe(NULL, args, out1, err, sizeof err)) FAIL_("moe %s: %s", args, err);
    test_read_text(out1, text, sizeof text);
    moe_lm_t m;
    ASSERT_OK(moe_lm_load(&m, dir, NULL));
    int32_t seq[9] = {5, 9, 1};
    size_t at = 0;
    for (int n = 3; n < 9; n++) {
      ASSERT_OK(moe_lm_forward(&m, seq, NULL, 1, n, NULL));
      uint64_t rng = 0;
      moe_lm_sample(moe_lm_logits(&m) + (size_t)(n - 1) * m.cfg.vocab, m.cfg.vocab, 0, 1, &rng, &seq[n]);
      at += (size_t)snprintf(want + at, sizeof want - at, "%s%d", n > 3 ? " " : "", seq[n]);
    }
    moe_lm_free(&m);
    snprintf(want + at, sizeof want - at, "\n");
    if (strcmp(text, want)) FAIL_("%s: greedy generate printed '%s', the full forwards give '%s'", families[fi], text, want);
    if (!test_have_mpirun() || strcmp(families[fi], "qwen2_moe")) continue;
    if (run_moe(TEST_MPIRUN "-np 2", args, out2, err, sizeof err)) FAIL_("mpirun -np 2 moe %s: %s", args, err);
    test_read_text(out2, text, sizeof text);
    if (strcmp(text, want)) FAIL_("%s: 2 ranks generated '%s', one process '%s'", families[fi], text, want);
  }
}

/* moe train --task lm --family F (a new model of each family, 2 layers of 4 experts, 20 steps): the loss
 * falls, its checkpoint is the family's (model_type) and moe eval reads it; Qwen2-MoE's (its shared
 * expert and biases replicated, the rest as every family's) also with the experts over 2 ranks, every
 * step's loss within 1e-4 of one process's. The MPI half is skipped without mpirun. */
TEST(train_lm_families_one_process_and_expert_parallel) {
  for (int fi = 0; fi < NFAM; fi++) {
    char args[2048], one[512], two[512], ck[512], err[4096], path[600];
    test_tmp_path("lm_fam_train", ck, sizeof ck);
    snprintf(args, sizeof args, "train --task lm --data '%s' " LM_TINY " --layers 2 --steps 20 --family %s "
             "--checkpoint '%s' --json --log-steps", lm_corpus(), families[fi], ck);
    test_tmp_path("lm_fam_ep1.jsonl", one, sizeof one);
    test_tmp_path("lm_fam_ep2.jsonl", two, sizeof two);
    if (run_moe(NULL, args, one, err, sizeof err)) FAIL_("moe %s: %s", args, err);
    char *a = test_read_file(one, NULL), lines[8192] = "";
    ASSERT(a);
    step_lines(a, lines, sizeof lines);
    free(a);
    double la[64], lb[64];
    int na = 0, nb = 0;
    for (const char *p = lines; na < 64 && (p = strstr(p, "\"loss\": ")); p++) la[na++] = strtod(p + 8, NULL);
    ASSERT_EQ_INT(na, 20);
    fprintf(stderr, "  %s: loss %.4f -> %.4f in 20 steps\n", families[fi], la[0], la[19]);
    ASSERT(la[19] < la[0] - 0.5);
    moe_lm_config c;
    ASSERT_OK(moe_lm_read_config(ck, &c));
    ASSERT(!strcmp(moe_lm_family_name(c.family), families[fi]));
    snprintf(path, sizeof path, "eval --task lm --checkpoint '%s' --data '%s' --threads 1", ck, lm_corpus());
    if (run_moe(NULL, path, NULL, err, sizeof err)) FAIL_("moe %s: %s", path, err);
    if (!test_have_mpirun() || strcmp(families[fi], "qwen2_moe")) continue;
    if (run_moe(TEST_MPIRUN "-np 2", args, two, err, sizeof err)) FAIL_("mpirun -np 2 moe %s: %s", args, err);
    char *b = test_read_file(two, NULL);
    ASSERT(b);
    lines[0] = 0;
    step_lines(b, lines, sizeof lines);
    free(b);
    for (const char *p = lines; nb < 64 && (p = strstr(p, "\"loss\": ")); p++) lb[nb++] = strtod(p + 8, NULL);
    ASSERT_EQ_INT(nb, 20);
    for (int s = 0; s < 20; s++)
      if (!(fabs(la[s] - lb[s]) <= 1e-4))
        FAIL_("%s: step %d loss %.8f with 2 ranks, %.8f in one process", families[fi], s + 1, lb[s], la[s]);
  }
}

/* Each family with the MoE layers in bf16 (moe.dtype; dense layers and attention stay fp32): the fp32
 * model's logits to bf16's rounding, and a backward that runs. */
TEST(lm_families_bf16_experts) {
  for (int fi = 0; fi < NFAM; fi++) {
    char dir[512];
    moe_lm_config c;
    moe_lm_t m, h;
    int B, T;
    lm_case_dir(families[fi], dir, sizeof dir);
    int32_t *t = lm_fixture_tokens(dir, &B, &T);
    ASSERT(t);
    ASSERT_OK(moe_lm_read_config(dir, &c));
    ASSERT_OK(moe_lm_load(&m, dir, &c));
    c.moe.dtype = MOE_DT_BF16;
    ASSERT_OK(moe_lm_load(&h, dir, &c));
    size_t n = (size_t)B * T * c.vocab;
    float *want = malloc(n * 4);
    ASSERT(want);
    ASSERT_OK(moe_lm_forward(&m, t, NULL, B, T, NULL));
    memcpy(want, moe_lm_logits(&m), n * 4);
    ASSERT_OK(moe_lm_forward(&h, t, t, B, T, NULL));
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(moe_lm_logits(&h)[i] - want[i]));
    ASSERT_OK(moe_lm_backward(&h));
    moe_lm_free(&m);
    moe_lm_free(&h);
    free(want), free(t);
    fprintf(stderr, "  %s: bf16 experts' logits within %.3g of fp32's\n", families[fi], worst);
    ASSERT(worst > 0 && worst < 0.05);
  }
}

/* A new model of each family from moe_lm_config_set_family (what `moe train --family` builds): it
 * initializes, trains a step, and its checkpoint loads back as the same configuration and logits
 * (gpt-oss with a window over one of two layers; DeepSeek-V3 with 8 experts, so in groups). */
TEST(lm_families_set_family_from_scratch) {
  for (int f = MOE_LM_MIXTRAL; f <= MOE_LM_DEEPSEEK_V3; f++) {
    moe_lm_config c;
    moe_lm_config_default(&c);
    c.vocab = 40, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 8, c.max_seq = 16;
    c.moe.D = 32, c.moe.H = 16, c.moe.E = f == MOE_LM_DEEPSEEK_V3 ? 8 : 4, c.moe.threads = 1;
    moe_lm_config_set_family(&c, (moe_lm_family)f);
    if (f == MOE_LM_GPT_OSS) c.sliding_window = 3, c.full_layers[0] = 2;
    moe_lm_t m, r;
    moe_status st = moe_lm_init(&m, &c);
    if (st) FAIL_("%s: %s", moe_lm_family_name((moe_lm_family)f), moe_last_error());
    moe_lm_init_params(&m, 3);
    int32_t t[12] = {1, 5, 9, 2, 7, 3, 11, 4, 30, 8, 6, 0};
    moe_lm_stats s;
    ASSERT_OK(moe_lm_forward(&m, t, t + 1, 1, 11, &s));
    ASSERT_OK(moe_lm_backward(&m));
    char dir[512], name[64];
    snprintf(name, sizeof name, "lm_set_family_%d", f);
    ASSERT_OK(moe_lm_save(&m, test_tmp_path(name, dir, sizeof dir)));
    ASSERT_OK(moe_lm_load(&r, dir, NULL));
    const moe_layer_config *a = &c.moe, *b = &r.cfg.moe;
    ASSERT((int)r.cfg.family == f && r.cfg.qkv_bias == c.qkv_bias && r.cfg.o_bias == c.o_bias &&
           r.cfg.attn_sinks == c.attn_sinks && r.cfg.qk_norm == c.qk_norm && r.cfg.sliding_window == c.sliding_window &&
           !memcmp(r.cfg.full_layers, c.full_layers, sizeof c.full_layers) && r.cfg.aux_coef == c.aux_coef);
    ASSERT(b->act == a->act && b->gate_bias == a->gate_bias && b->expert_bias == a->expert_bias &&
           b->normalize_topk == a->normalize_topk && b->shared_H == a->shared_H && b->shared_gate == a->shared_gate &&
           b->swiglu_alpha == a->swiglu_alpha && b->swiglu_limit == a->swiglu_limit);
    ASSERT(!memcmp(&r.cfg.mla, &c.mla, sizeof c.mla) && r.cfg.head_dim == c.head_dim && r.cfg.n_kv_heads == c.n_kv_heads &&
           !memcmp(r.cfg.dense_layers, c.dense_layers, sizeof c.dense_layers) && r.cfg.dense_H == c.dense_H);
    ASSERT(b->score == a->score && b->select_bias == a->select_bias && b->routed_scale == a->routed_scale &&
           b->n_group == a->n_group && b->topk_group == a->topk_group && (!a->n_group || b->group_score == a->group_score));
    if (f == MOE_LM_DEEPSEEK_V3) ASSERT(c.mla.q_lora_rank > 0 && c.moe.n_group == 4 && c.moe.select_bias && c.moe.shared_H == 16);
    if (f == MOE_LM_DEEPSEEK_V2) ASSERT(c.mla.kv_lora_rank == 8 && c.mla.q_lora_rank == 0 && c.head_dim == 4 && c.moe.shared_H == 32);
    float la[11 * 40];
    ASSERT_OK(moe_lm_forward(&m, t, NULL, 1, 11, NULL));
    memcpy(la, moe_lm_logits(&m), sizeof la);
    ASSERT_OK(moe_lm_forward(&r, t, NULL, 1, 11, NULL));
    int same = !memcmp(la, moe_lm_logits(&r), sizeof la);
    moe_lm_free(&m);
    moe_lm_free(&r);
    if (!same) FAIL_("%s: the saved model's logits differ", moe_lm_family_name((moe_lm_family)f));
  }
}
