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
#include "lm_corpus.h"
#include "run_cli.h"
#include "test.h"

static const char *const cases[] = {"deepseek_v2_lite", "deepseek_v2", "deepseek_v3", "deepseek_v3_rotate_half"};
#define NCASES (int)(sizeof cases / sizeof cases[0])

TEST(lm_matches_pytorch_deepseek_v2_lite) { ASSERT(lm_check_case("deepseek_v2_lite")); }
TEST(lm_matches_pytorch_deepseek_v2) { ASSERT(lm_check_case("deepseek_v2")); }
TEST(lm_matches_pytorch_deepseek_v3) { ASSERT(lm_check_case("deepseek_v3")); }
TEST(lm_matches_pytorch_deepseek_v3_rotate_half) { ASSERT(lm_check_case("deepseek_v3_rotate_half")); }

/* With moe.seq_aux_alpha (DeepSeek's sequence-wise balance loss, each batch row a sequence) set by the
 * caller as the reference's case has it: the loss (ce plus every MoE layer's term) and every gradient. */
TEST(lm_matches_pytorch_deepseek_v2_seq_aux) {
  char dir[512];
  moe_lm_config c;
  ASSERT_OK(moe_lm_read_config(lm_case_dir("deepseek_v2_seq_aux", dir, sizeof dir), &c));
  c.moe.seq_aux_alpha = 0.25f;
  ASSERT(lm_check_case_config("deepseek_v2_seq_aux", &c));
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
    moe_lm_set_threads(&m, 1); /* tiny: one thread is fastest */
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

/* Load, save, load: DeepSeek's tensor names and config.json, the same configuration and bit-identical
 * logits. */
TEST(lm_deepseek_save_load_round_trip) {
  char dir[512];
  for (int ci = 0; ci < NCASES; ci++) ASSERT(lm_check_save_load(cases[ci], dir, sizeof dir));
}

/* SGD steps from each loaded checkpoint on its tokens as one sequence, then a save and load: the loss
 * falls and the reloaded model has the trained loss (the selection bias, not a gradient parameter, stays). */
TEST(lm_deepseek_train_from_checkpoint) {
  for (int ci = 0; ci < NCASES; ci++)
    ASSERT(lm_check_train_from_checkpoint(cases[ci], 1, "model.layers.1.mlp.gate.e_score_correction_bias"));
}

/* A model built from each case's configuration: initialized as HF does (norms 1, the selection bias 0),
 * saved in DeepSeek's layout and loaded back with the same parameters. */
TEST(lm_deepseek_init_save_load) {
  for (int ci = 0; ci < NCASES; ci++) {
    char src[512], dir[512], name[64];
    moe_lm_config c;
    ASSERT_OK(moe_lm_read_config(lm_case_dir(cases[ci], src, sizeof src), &c));
    moe_lm_t m, r;
    ASSERT_OK(moe_lm_init(&m, &c));
    moe_lm_init_params(&m, 11);
    for (int i = 0; i < m.nrefs; i++) {
      const moe_tensor_ref *ref = &m.refs[i];
      float want = strstr(ref->name, "norm.") ? 1.0f : strstr(ref->name, "correction_bias") ? 0.0f : -1.0f;
      if (want >= 0 && (ref->data[0] != want || ref->data[ref->numel - 1] != want))
        FAIL_("%s: %s starts %g, want %g", cases[ci], ref->name, ref->data[0], want);
    }
    snprintf(name, sizeof name, "lm_init_%s", cases[ci]);
    ASSERT_OK(moe_lm_save(&m, test_tmp_path(name, dir, sizeof dir)));
    ASSERT_OK(moe_lm_load(&r, dir, NULL));
    ASSERT_EQ_INT(r.nrefs, m.nrefs);
    for (int i = 0; i < m.nrefs; i++) ASSERT(!memcmp(m.refs[i].data, r.refs[i].data, m.refs[i].numel * 4));
    moe_lm_free(&m);
    moe_lm_free(&r);
  }
}

/* The deepseek_v3 fixture's weights with one more tensor, in dir. */
static void with_extra_tensor(const char *extra, char *dir, size_t n) {
  static int made;
  char src[700], dst[700], name[64];
  snprintf(name, sizeof name, "lm_ds_extra_%d", made++);
  test_tmp_path(name, dir, n);
  mkdir(dir, 0755);
  lm_case_dir("deepseek_v3", src, sizeof src);
  strcat(src, "/config.json");
  snprintf(dst, sizeof dst, "%s/config.json", dir);
  char *text = test_read_file(src, NULL);
  if (text) moe_write_file_atomic(dst, text, strlen(text));
  free(text);
  *strrchr(src, '/') = 0;
  strcat(src, "/model.safetensors");
  moe_st *f = NULL;
  moe_st_writer *w = NULL;
  if (moe_st_open(&f, src) == MOE_OK && moe_st_writer_new(&w) == MOE_OK) {
    for (int j = 0; j < moe_st_count(f); j++) {
      moe_tensor_view v;
      if (moe_st_at(f, j, &v) == MOE_OK) moe_st_writer_add(w, v.name, v.dtype, v.ndim, v.shape, v.data);
    }
    float zero[4] = {0};
    int64_t shape[1] = {4};
    moe_st_writer_add(w, extra, MOE_DT_F32, 1, shape, zero);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    moe_st_writer_save(w, dst);
  }
  moe_st_writer_free(w);
  moe_st_close(f);
}

/* DeepSeek-V3's multi-token-prediction layers (numbered from num_hidden_layers) are skipped with a note;
 * any other tensor the model lacks is still an error naming the file and the tensor. */
TEST(lm_deepseek_mtp_layers_skipped) {
  char dir[512];
  moe_lm_t m;
  with_extra_tensor("model.layers.3.eh_proj.weight", dir, sizeof dir);
  ASSERT_OK(moe_lm_load(&m, dir, NULL));
  moe_lm_free(&m);
  with_extra_tensor("model.layers.2.mlp.experts.8.up_proj.weight", dir, sizeof dir); /* expert 8 of 8 */
  ASSERT_EQ_INT(moe_lm_load(&m, dir, NULL), MOE_ERR_FORMAT);
  ASSERT(strstr(moe_last_error(), "model.layers.2.mlp.experts.8.up_proj.weight") && strstr(moe_last_error(), dir));
}

/* Fields not understood, values not implemented, sizes the weights do not have, tensors missing: each
 * an error naming config.json (or the weights file) and the field (tensor). */
TEST(lm_deepseek_bad_configs_name_file_and_field) {
  static const struct {
    const char *family, *field, *value, *drop;
    moe_status st;
    const char *want;
  } bad[] = {
      {"deepseek_v3", "quantization_config", "{\"quant_method\": \"fp8\"}", NULL, MOE_ERR_FORMAT,
       "\"quantization_config\" is not supported"},
      {"deepseek_v3", "rope_scaling", "{\"type\": \"dynamic\", \"factor\": 2}", NULL, MOE_ERR_FORMAT,
       "\"rope_scaling\" of type dynamic is not supported"},
      {"deepseek_v3", "rope_scaling", "{\"type\": \"yarn\", \"factor\": 4, \"low_freq_factor\": 1}", NULL,
       MOE_ERR_FORMAT, "\"rope_scaling\" field \"low_freq_factor\" is not supported for yarn"},
      {"deepseek_v3", "rope_scaling", "{\"type\": \"yarn\"}", NULL, MOE_ERR_FORMAT, "needs a number \"factor\""},
      {"deepseek_v2", "rope_scaling", "{\"type\": \"yarn\", \"factor\": 0.5}", NULL, MOE_ERR_FORMAT,
       "yarn wants factor >= 1"},
      {"deepseek_v3", "topk_method", "\"bogus\"", NULL, MOE_ERR_FORMAT, "\"topk_method\" bogus is not supported"},
      {"deepseek_v2", "scoring_func", "\"tanh\"", NULL, MOE_ERR_FORMAT, "\"scoring_func\" tanh is not supported"},
      {"deepseek_v2", "n_group", NULL, NULL, MOE_ERR_FORMAT, "group_limited_greedy needs \"n_group\""},
      {"deepseek_v3", "attention_bias", "true", NULL, MOE_ERR_FORMAT, "\"attention_bias\" true is not supported"},
      {"deepseek_v3", "head_dim", "6", NULL, MOE_ERR_FORMAT, "\"head_dim\" 6 is not \"qk_rope_head_dim\" 8"},
      {"deepseek_v3", "num_key_value_heads", "2", NULL, MOE_ERR_FORMAT,
       "\"num_key_value_heads\" 2 is not \"num_attention_heads\" 4"},
      {"deepseek_v3", "q_lora_rank", NULL, NULL, MOE_ERR_MISSING, "no \"q_lora_rank\""},
      {"deepseek_v2_lite", "frobnicate", "1", NULL, MOE_ERR_FORMAT,
       "field \"frobnicate\" is not understood for model_type \"deepseek_v2\""},
      {"deepseek_v3", "kv_lora_rank", "13", NULL, MOE_ERR_SHAPE,
       "\"kv_lora_rank\" + \"qk_rope_head_dim\" is 21, but tensor 'model.layers.2.self_attn.kv_a_proj_with_mqa.weight'"},
      {"deepseek_v3", "v_head_dim", "6", NULL, MOE_ERR_SHAPE,
       "(\"qk_nope_head_dim\" + \"v_head_dim\") is 48, but tensor 'model.layers.2.self_attn.kv_b_proj.weight'"},
      {"deepseek_v3", "q_lora_rank", "10", NULL, MOE_ERR_SHAPE,
       "\"q_lora_rank\" is 10, but tensor 'model.layers.2.self_attn.q_a_proj.weight'"},
      {"deepseek_v3", "q_lora_rank", "null", NULL, MOE_ERR_SHAPE, "'model.layers.2.self_attn.q_proj.weight'"},
      {"deepseek_v2_lite", "q_lora_rank", "8", NULL, MOE_ERR_SHAPE, "'model.layers.2.self_attn.q_a_proj.weight'"},
      {"deepseek_v3", "n_shared_experts", "2", NULL, MOE_ERR_SHAPE,
       "\"n_shared_experts\" x \"moe_intermediate_size\" is 20, but tensor "
       "'model.layers.2.mlp.shared_experts.gate_proj.weight'"},
      {"deepseek_v3", "first_k_dense_replace", "0", NULL, MOE_ERR_MISSING, "model.layers.0.mlp.gate.weight"},
      {"deepseek_v3", "vocab_size", "40", "model.layers.1.mlp.gate.e_score_correction_bias", MOE_ERR_MISSING,
       "model.layers.1.mlp.gate.e_score_correction_bias"},
      {"deepseek_v2", "vocab_size", "40", "model.layers.0.self_attn.kv_a_layernorm.weight", MOE_ERR_MISSING,
       "model.layers.0.self_attn.kv_a_layernorm.weight"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char dir[512];
    ASSERT(lm_patched(bad[i].family, bad[i].field, bad[i].value, bad[i].drop, dir, sizeof dir));
    moe_lm_t m;
    moe_status st = moe_lm_load(&m, dir, NULL);
    const char *err = moe_last_error();
    if (st != bad[i].st || !strstr(err, bad[i].want) || !strstr(err, dir)) {
      if (st == MOE_OK) moe_lm_free(&m);
      FAIL_("%s %s=%s: status %d, '%s'; want %d and '%s' in %s", bad[i].family, bad[i].field,
            bad[i].value ? bad[i].value : "(removed)", st, err, bad[i].st, bad[i].want, dir);
    }
  }
}

/* Greedy `moe generate` (the serving engine's slots over the latent cache) of each case: the argmax chain
 * of full forwards; DeepSeek-V3's also with the experts over 2 ranks (the selection bias and the shared
 * experts replicated), skipped without mpirun. */
TEST(lm_deepseek_generate_matches_full_forwards) {
  for (int ci = 0; ci < NCASES; ci++) {
    char dir[512], args[1024], out[512], err[2048], text[256], want[256] = "";
    lm_case_dir(cases[ci], dir, sizeof dir);
    test_tmp_path("lm_ds_gen.txt", out, sizeof out);
    snprintf(args, sizeof args, "generate --checkpoint %s --prompt-ids '5 9 1' --max-tokens 6 --temperature 0 "
             "--ignore-eos --threads 1", dir);
    if (run_moe(NULL, args, out, err, sizeof err)) FAIL_("moe %s: %s", args, err);
    test_read_text(out, text, sizeof text);
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
    if (strcmp(text, want)) FAIL_("%s: greedy generate printed '%s', the full forwards give '%s'", cases[ci], text, want);
    if (!test_have_mpirun() || strcmp(cases[ci], "deepseek_v3")) continue; /* experts over 2 ranks */
    if (run_moe(TEST_MPIRUN "-np 2", args, out, err, sizeof err)) FAIL_("mpirun -np 2 moe %s: %s", args, err);
    test_read_text(out, text, sizeof text);
    if (strcmp(text, want)) FAIL_("%s: 2 ranks generated '%s', one process '%s'", cases[ci], text, want);
  }
}

/* moe_lm_balance_bias after a forward of DeepSeek-V3's fixture: each MoE layer's selection bias moves by
 * exactly -gamma (more assignments than the mean), +gamma (fewer) or 0, the counts the layer stats'; a
 * model without the bias (V2) is MOE_ERR_STATE. */
TEST(lm_deepseek_balance_bias) {
  char dir[512];
  moe_lm_t m;
  int B, T;
  ASSERT_OK(moe_lm_load(&m, lm_case_dir("deepseek_v3", dir, sizeof dir), NULL));
  moe_lm_set_threads(&m, 1);
  int32_t *t = lm_fixture_tokens(dir, &B, &T);
  ASSERT(t);
  ASSERT_STATUS(moe_lm_balance_bias(&m, 0.01f), MOE_ERR_STATE); /* no forward yet */
  ASSERT_OK(moe_lm_forward(&m, t, NULL, B, T, NULL));
  int E = m.cfg.moe.E, moved = 0;
  float before[3][8];
  for (int i = 1; i < 3; i++) memcpy(before[i], moe_layer_param(&m.layers[i], "gate.select_bias"), (size_t)E * 4);
  ASSERT_OK(moe_lm_balance_bias(&m, 0.01f));
  for (int i = 1; i < 3; i++) {
    const moe_layer_stats *ls = moe_lm_layer_stats(&m, i);
    const float *b = moe_layer_param(&m.layers[i], "gate.select_bias");
    int total = 0;
    for (int e = 0; e < E; e++) total += ls->expert_counts[e];
    for (int e = 0; e < E; e++) {
      float want = ls->expert_counts[e] * E > total ? -0.01f : ls->expert_counts[e] * E < total ? 0.01f : 0.0f;
      if (b[e] != before[i][e] + want) FAIL_("layer %d expert %d: bias %g -> %g, want a move of %g", i, e, before[i][e], b[e], want);
      moved += want != 0;
    }
  }
  ASSERT(moved > 0);
  free(t);
  moe_lm_free(&m);
  ASSERT_OK(moe_lm_load(&m, lm_case_dir("deepseek_v2", dir, sizeof dir), NULL));
  ASSERT_STATUS(moe_lm_balance_bias(&m, 0.01f), MOE_ERR_STATE);
  moe_lm_free(&m);
}

/* moe train --task lm --family deepseek_v2|deepseek_v3 (a new model: 2 layers, the first dense, 8 experts,
 * 20 steps): the loss falls, the checkpoint is the family's with its latent attention, and moe eval reads it. */
TEST(train_lm_deepseek_families) {
  static const char *const fam[] = {"deepseek_v2", "deepseek_v3"};
  for (int i = 0; i < 2; i++) {
    char args[2048], out[512], ck[512], err[4096], lines[8192] = "";
    test_tmp_path("lm_ds_train", ck, sizeof ck);
    test_tmp_path("lm_ds_train.jsonl", out, sizeof out);
    snprintf(args, sizeof args, "train --task lm --data '%s' " LM_TINY " --layers 2 --experts 8 --steps 20 --family %s "
             "--checkpoint '%s' --json --log-steps", lm_corpus(), fam[i], ck);
    if (run_moe(NULL, args, out, err, sizeof err)) FAIL_("moe %s: %s", args, err);
    char *a = test_read_file(out, NULL);
    ASSERT(a);
    step_lines(a, lines, sizeof lines);
    free(a);
    double l[64];
    int n = 0;
    for (const char *p = lines; n < 64 && (p = strstr(p, "\"loss\": ")); p++) l[n++] = strtod(p + 8, NULL);
    ASSERT_EQ_INT(n, 20);
    fprintf(stderr, "  %s: loss %.4f -> %.4f in 20 steps\n", fam[i], l[0], l[19]);
    ASSERT(l[19] < l[0] - 0.5);
    moe_lm_config c;
    ASSERT_OK(moe_lm_read_config(ck, &c));
    ASSERT(!strcmp(moe_lm_family_name(c.family), fam[i]) && c.mla.kv_lora_rank > 0 && moe_lm_layer_dense(&c, 0) &&
           !moe_lm_layer_dense(&c, 1) && c.moe.select_bias == i);
    snprintf(args, sizeof args, "eval --task lm --checkpoint '%s' --data '%s' --threads 1", ck, lm_corpus());
    if (run_moe(NULL, args, NULL, err, sizeof err)) FAIL_("moe %s: %s", args, err);
  }
}
