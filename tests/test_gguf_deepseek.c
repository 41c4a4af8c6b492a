/* DeepSeek-V2/V3 in GGUF files as llama.cpp's deepseek2 (lm_gguf_deepseek.c): the fixtures
 * (tests/fixtures/lm/deepseek_*, checked against PyTorch by test_lm_families.c) converted to F32 GGUF
 * give the same logits bit for bit and convert back to the same tensors; the files llama.cpp's own
 * converter wrote from them (tests/fixtures/gguf_lm/deepseek_*.gguf, dev/gguf_lm_llama_cpp.py) load to
 * the logits of the model llama.cpp's graph computes, and are key for key and tensor for tensor the
 * files libmoe writes; settings that llama.cpp's keys cannot say are refused naming them, with no file
 * written; a Q8_0 or Q4_K file keeps its experts in that type. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lm_check.h"
#include "test.h"

/* What a fixture's config is changed to before it is written: llama.cpp's deepseek2 has no expert
 * groups, scales no rotary table (mscale equal to mscale_all_dim) and ropes adjacent pairs. */
enum { AS_IS = 0, NO_GROUPS = 1, MSCALE_ALL_DIM = 2, INTERLEAVE = 4 };

static void edit(moe_lm_config *c, int e) {
  if (e & NO_GROUPS) c->moe.n_group = c->moe.topk_group = 0;
  if (e & MSCALE_ALL_DIM) c->yarn.mscale = c->yarn.mscale_all_dim;
  if (e & INTERLEAVE) c->mla.rope_interleave = 1;
}

/* The fixture `name` loaded under its config.json changed by e. */
static int load_edited(const char *name, int e, moe_lm_t *m) { return lm_load_edited(name, edit, e, m); }

static const struct {
  const char *name;
  int edit;
} CASES[] = {
    {"deepseek_v2_lite", AS_IS},                    /* q_proj, softmax, scaled, no norm */
    {"deepseek_v2_seq_aux", AS_IS},                 /* no dense layer */
    {"deepseek_v2", NO_GROUPS},                     /* q through its latent, YaRN */
    {"deepseek_v3", NO_GROUPS | MSCALE_ALL_DIM},    /* sigmoid, selection bias, renormalized and scaled */
    {"deepseek_v3_rotate_half", NO_GROUPS | INTERLEAVE}, /* no shared expert */
};

TEST(gguf_deepseek_f32_gives_the_hf_logits_exactly_and_converts_back) {
  for (size_t k = 0; k < sizeof CASES / sizeof *CASES; k++) {
    char gguf[512], tmp[96];
    moe_lm_t hf;
    ASSERT(load_edited(CASES[k].name, CASES[k].edit, &hf));
    snprintf(tmp, sizeof tmp, "%s.gguf", CASES[k].name);
    int ok = lm_gguf_round_trip(CASES[k].name, &hf, test_tmp_path(tmp, gguf, sizeof gguf));
    moe_lm_free(&hf);
    ASSERT(ok);
  }
}

/* The converter's files (February 2025): deepseek_v2_lite's is the checkpoint's model; for deepseek_v2
 * and deepseek_v3 it drops the expert groups and V3's mscale 1.0 (keeping mscale_all_dim 0.8), which
 * llama.cpp's graph does not compute: their files are the models without them. */
static const char *const CONVERTED[] = {"deepseek_v2_lite", "deepseek_v2", "deepseek_v3"};

static void converted_path(const char *name, char *buf, size_t n) {
  snprintf(buf, n, "%s/gguf_lm/%s.gguf", test_fixture_dir(), name);
}

static int edit_of(const char *name) {
  for (size_t k = 0; k < sizeof CASES / sizeof *CASES; k++)
    if (!strcmp(CASES[k].name, name)) return CASES[k].edit;
  return AS_IS;
}

TEST(gguf_deepseek_llama_cpp_files_give_the_hf_logits) {
  for (int k = 0; k < 3; k++) {
    char gguf[600];
    moe_lm_t hf, g;
    moe_lm_config c;
    ASSERT(load_edited(CONVERTED[k], edit_of(CONVERTED[k]), &hf));
    converted_path(CONVERTED[k], gguf, sizeof gguf);
    ASSERT_OK(moe_lm_read_config(gguf, &c));
    ASSERT(lm_same_config(CONVERTED[k], &hf.cfg, &c));
    ASSERT_OK(moe_lm_load(&g, gguf, &c));
    ASSERT(lm_same_logits(CONVERTED[k], CONVERTED[k], &hf, &g));
    moe_lm_free(&hf), moe_lm_free(&g);
  }
}

/* Whether key i of a has the same type and value in b. */
static int same_kv(const moe_gguf *a, int64_t i, const moe_gguf *b) {
  moe_gguf_kv x, y;
  if (moe_gguf_kv_at(a, i, &x) != MOE_OK) return 0;
  int64_t j = moe_gguf_find_key(b, x.key);
  if (j < 0 || moe_gguf_kv_at(b, j, &y) != MOE_OK || x.type != y.type) return 0;
  uint32_t u, v;
  float f, h;
  int p, q;
  const char *s, *t;
  switch (x.type) {
  case MOE_GGUFV_U32: return !moe_gguf_get_u32(a, x.key, &u) && !moe_gguf_get_u32(b, x.key, &v) && u == v;
  case MOE_GGUFV_F32: return !moe_gguf_get_f32(a, x.key, &f) && !moe_gguf_get_f32(b, x.key, &h) && f == h;
  case MOE_GGUFV_BOOL: return !moe_gguf_get_bool(a, x.key, &p) && !moe_gguf_get_bool(b, x.key, &q) && p == q;
  case MOE_GGUFV_STRING: return !moe_gguf_get_str(a, x.key, &s) && !moe_gguf_get_str(b, x.key, &t) && !strcmp(s, t);
  default: return 0;
  }
}

/* The converter's files against libmoe's of the same models: every key (but general.name and the
 * converter's general.size_label) under the same name, type and value, every tensor under the same
 * name, type and shape with the same bytes (llama.cpp's names, shapes, stacking and kv_b layout). */
TEST(gguf_deepseek_file_is_what_llama_cpp_converter_writes) {
  for (int k = 0; k < 3; k++) {
    char theirs[600], ours[512], tmp[96];
    moe_lm_t hf;
    ASSERT(load_edited(CONVERTED[k], edit_of(CONVERTED[k]), &hf));
    snprintf(tmp, sizeof tmp, "ours_%s.gguf", CONVERTED[k]);
    test_tmp_path(tmp, ours, sizeof ours);
    ASSERT_OK(moe_lm_save_gguf(&hf, ours, NULL));
    moe_lm_free(&hf);
    converted_path(CONVERTED[k], theirs, sizeof theirs);
    moe_gguf *a, *b;
    ASSERT_OK(moe_gguf_open(&a, theirs));
    ASSERT_OK(moe_gguf_open(&b, ours));
    int64_t keys = 0;
    for (int64_t i = 0; i < moe_gguf_kv_count(a); i++) {
      moe_gguf_kv kv;
      ASSERT_OK(moe_gguf_kv_at(a, i, &kv));
      if (!strcmp(kv.key, "general.name") || !strcmp(kv.key, "general.size_label")) continue;
      keys++;
      if (!same_kv(a, i, b)) FAIL_("%s: key %s is not the converter's in libmoe's file", CONVERTED[k], kv.key);
    }
    ASSERT_EQ_INT(moe_gguf_kv_count(b), keys + 1); /* and general.name */
    ASSERT_EQ_INT(moe_gguf_tensor_count(b), moe_gguf_tensor_count(a));
    for (int64_t i = 0; i < moe_gguf_tensor_count(a); i++) {
      moe_gguf_tensor x, y;
      ASSERT_OK(moe_gguf_tensor_at(a, i, &x));
      if (moe_gguf_tensor_get(b, x.name, &y) != MOE_OK) FAIL_("%s: libmoe's file has no %s", CONVERTED[k], x.name);
      if (x.type != y.type || x.ndim != y.ndim || memcmp(x.ne, y.ne, sizeof x.ne) || x.nbytes != y.nbytes ||
          memcmp(x.data, y.data, x.nbytes))
        FAIL_("%s: tensor %s is not the converter's (type %d/%d, ne[0] %lld/%lld, ne[1] %lld/%lld)", CONVERTED[k],
              x.name, (int)x.type, (int)y.type, (long long)x.ne[0], (long long)y.ne[0], (long long)x.ne[1],
              (long long)y.ne[1]);
    }
    fprintf(stderr, "  %s: %lld keys, %lld tensors as the converter's\n", CONVERTED[k], (long long)keys,
            (long long)moe_gguf_tensor_count(a));
    moe_gguf_close(a), moe_gguf_close(b);
  }
}

TEST(gguf_deepseek_settings_without_a_key_are_refused_naming_them) {
  moe_lm_t m;
  ASSERT(load_edited("deepseek_v2", AS_IS, &m)); /* group_limited_greedy over 3 groups, 2 kept */
  ASSERT(lm_gguf_refused(&m, "n_group"));
  moe_lm_free(&m);
  ASSERT(load_edited("deepseek_v3", NO_GROUPS, &m)); /* mscale 1.0, mscale_all_dim 0.8 */
  ASSERT(lm_gguf_refused(&m, "mscale"));
  m.cfg.yarn.mscale = m.cfg.yarn.mscale_all_dim;
  m.cfg.yarn.beta_fast = 16;
  ASSERT(lm_gguf_refused(&m, "beta_fast"));
  m.cfg.yarn.beta_fast = 32, m.cfg.yarn.truncate = 0;
  ASSERT(lm_gguf_refused(&m, "truncate"));
  moe_lm_free(&m);
  ASSERT(load_edited("deepseek_v3_rotate_half", NO_GROUPS, &m));
  ASSERT(lm_gguf_refused(&m, "rope_interleave"));
  moe_lm_free(&m);
  /* MoE layers every other layer (moe_layer_freq 2): layer 1 dense after MoE layer 0 */
  moe_lm_config c;
  char dir[512];
  ASSERT_OK(moe_lm_read_config(lm_case_dir("deepseek_v2_seq_aux", dir, sizeof dir), &c));
  c.dense_layers[0] |= 2;
  ASSERT_OK(moe_lm_init(&m, &c));
  moe_lm_init_params(&m, 3);
  ASSERT(lm_gguf_refused(&m, "moe_layer_freq"));
  moe_lm_free(&m);
}

/* A DeepSeek-V3-shaped model whose widths are whole K-quant blocks (D = H = 256), written as Q8_0 and
 * Q4_K: its experts stay in the type (moe.expert_type, no fp32 experts), the latent attention's
 * weights take the type or (rows not whole blocks) Q8_0, norms, router and selection bias stay F32, and
 * the logits are within the tolerance test_gguf_lm.c states for the other families (0.03 and 0.3 of the
 * largest logit) of the F32 model's. All experts are chosen (top_k = E): with 2 of 4, a token whose
 * two best scores nearly tie takes another expert after rounding (seen: one token's logits 0.43 off),
 * which says nothing of the weights' types. */
TEST(gguf_deepseek_quantized_keeps_its_experts_quantized) {
  moe_lm_config c;
  moe_lm_config_default(&c);
  c.vocab = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 4, c.head_dim = 64, c.max_seq = 32;
  c.moe.D = 256, c.moe.H = 256, c.moe.E = 4, c.moe.top_k = 4; /* every expert: no choice to flip */
  moe_lm_config_set_family(&c, MOE_LM_DEEPSEEK_V3);
  c.moe.n_group = c.moe.topk_group = 0;
  moe_lm_t m;
  ASSERT_OK(moe_lm_init(&m, &c));
  moe_lm_init_params(&m, 5);
  float *ref = NULL;
  int32_t t[16];
  for (int i = 0; i < 16; i++) t[i] = (i * 7 + 3) % c.vocab;
  ASSERT((ref = lm_logits(&m, t, 2, 8)));
  const struct { moe_gguf_type t; double tol; } types[] = {{MOE_GGUF_Q8_0, 0.03}, {MOE_GGUF_Q4_K, 0.3}};
  for (int k = 0; k < 2; k++) {
    char path[512], tmp[64];
    snprintf(tmp, sizeof tmp, "ds_%s.gguf", moe_gguf_type_name(types[k].t));
    test_tmp_path(tmp, path, sizeof path);
    moe_lm_gguf_options o = {types[k].t, NULL, NULL};
    ASSERT_OK(moe_lm_save_gguf(&m, path, &o));
    moe_lm_config cq;
    ASSERT_OK(moe_lm_read_config(path, &cq));
    ASSERT_EQ_INT(cq.moe.expert_type, (int)types[k].t);
    moe_lm_t q;
    ASSERT_OK(moe_lm_load(&q, path, NULL));
    ASSERT(q.layers[1].cfg.expert_type == (int)types[k].t && !moe_layer_param_find(&q.layers[1], "experts.fc1.weight"));
    float *l = lm_logits(&q, t, 2, 8);
    ASSERT(l);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < (size_t)16 * c.vocab; i++) worst = fmax(worst, fabs(l[i] - ref[i])), scale = fmax(scale, fabs(ref[i]));
    fprintf(stderr, "  %s: largest logit error / largest logit %.4f (tolerance %.2f)\n",
            moe_gguf_type_name(types[k].t), worst / scale, types[k].tol);
    ASSERT(worst > 0 && worst / scale < types[k].tol);
    free(l);
    moe_lm_free(&q);
    moe_gguf *g;
    ASSERT_OK(moe_gguf_open(&g, path));
    const struct { const char *name; moe_gguf_type t; } want[] = {
        {"blk.1.ffn_gate_exps.weight", types[k].t}, {"blk.1.ffn_down_exps.weight", types[k].t},
        {"blk.1.attn_kv_a_mqa.weight", types[k].t}, {"blk.1.attn_q_b.weight", MOE_GGUF_Q8_0}, /* rows of 128 */
        {"blk.1.attn_kv_a_norm.weight", MOE_GGUF_F32}, {"blk.1.ffn_gate_inp.weight", MOE_GGUF_F32},
        {"blk.1.exp_probs_b.bias", MOE_GGUF_F32}, {"blk.0.ffn_gate.weight", types[k].t}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
      moe_gguf_tensor x;
      ASSERT_OK(moe_gguf_tensor_get(g, want[i].name, &x));
      if (x.type != want[i].t)
        FAIL_("%s file: %s is %s, want %s", moe_gguf_type_name(types[k].t), want[i].name, moe_gguf_type_name(x.type),
              moe_gguf_type_name(want[i].t));
    }
    moe_gguf_close(g);
  }
  free(ref);
  moe_lm_free(&m);
}
