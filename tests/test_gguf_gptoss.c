/* gpt-oss in GGUF files as llama.cpp's gpt-oss architecture (lm_gguf_gptoss.c): the fixtures
 * (tests/fixtures/lm/gpt_oss*, checked against PyTorch by test_lm_families.c) converted to F32 GGUF give
 * the same logits bit for bit and convert back to the same tensors; the file has llama.cpp's keys and
 * tensor names (bytes of the header, the experts split from the checkpoint's fused gate_up_proj as
 * llama.cpp's converter splits them); the MXFP4 fixture's experts stay MXFP4 with the checkpoint's
 * values; settings llama.cpp's keys cannot say are refused naming them; malformed files are errors
 * naming the key or tensor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_check.h"
#include "test.h"

/* llama.cpp's gpt-oss computes swiglu with limit 7 (the fixtures have 1.5) and YaRN with the ramp's ends
 * floored and ceiled (truncate; the fixture has false): the models the fixtures become there. */
static void llama_cpp_settings(moe_lm_config *c, int unused) {
  (void)unused;
  c->moe.swiglu_limit = 7.0f;
  if (c->yarn.factor) c->yarn.truncate = 1;
}

static int load_llama_cpp_settings(const char *name, moe_lm_t *m) {
  return lm_load_edited(name, llama_cpp_settings, 0, m);
}

static const char *const CASES[] = {"gpt_oss", "gpt_oss_yarn", "gpt_oss_mxfp4"};

TEST(gguf_gptoss_f32_gives_the_hf_logits_exactly_and_converts_back) {
  for (size_t k = 0; k < sizeof CASES / sizeof *CASES; k++) {
    char gguf[512], tmp[96];
    moe_lm_t hf;
    moe_lm_config c;
    ASSERT(load_llama_cpp_settings(CASES[k], &hf));
    snprintf(tmp, sizeof tmp, "%s.gguf", CASES[k]);
    int ok = lm_gguf_round_trip(CASES[k], &hf, test_tmp_path(tmp, gguf, sizeof gguf));
    ok = ok && moe_lm_read_config(gguf, &c) == MOE_OK && c.moe.expert_type == -1 && /* F32: fp32 parameters */
         (c.yarn.factor == 0 || !memcmp(&hf.cfg.yarn, &c.yarn, sizeof c.yarn)); /* truncate too */
    moe_lm_free(&hf);
    ASSERT(ok);
  }
}

static uint32_t u32_at(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t u64_at(const unsigned char *p) { return u32_at(p) | (uint64_t)u32_at(p + 4) << 32; }

/* Value [a][b][c] of a (A, B, C) F32 tensor of a safetensors file. */
static float st_at(const moe_st *f, const char *name, int64_t a, int64_t b, int64_t c) {
  moe_tensor_view v;
  float x = NAN;
  if (moe_st_get(f, name, &v) == MOE_OK && v.dtype == MOE_DT_F32)
    moe_st_read(f, &v, (size_t)(((a * v.shape[1] + b) * (v.ndim > 2 ? v.shape[2] : 1)) + c) * 4, 4, &x);
  return x;
}

/* The gpt_oss fixture's file as bytes (magic, version, counts, the first key) and as llama.cpp's loader
 * (src/models/openai-moe.cpp) reads it: its keys under their names and types, exactly the tensors it
 * creates, in ggml's shapes; the experts' values where llama.cpp's converter puts them (gate_up_proj's
 * even columns in ffn_gate_exps, odd ones in ffn_up_exps, down_proj transposed), read from the
 * checkpoint apart from libmoe's converter (lm_gptoss.c). */
TEST(gguf_gptoss_file_has_llama_cpp_keys_and_tensor_names) {
  char dir[512], gguf[512], st_path[600];
  moe_lm_t hf;
  ASSERT(load_llama_cpp_settings("gpt_oss", &hf));
  test_tmp_path("oss.gguf", gguf, sizeof gguf);
  ASSERT_OK(moe_lm_save_gguf(&hf, gguf, NULL));
  moe_lm_free(&hf);
  size_t len;
  unsigned char *bytes = (unsigned char *)test_read_file(gguf, &len);
  ASSERT(bytes && len > 80);
  ASSERT(!memcmp(bytes, "GGUF", 4));
  ASSERT_EQ_INT(u32_at(bytes + 4), 3);
  ASSERT_EQ_INT(u64_at(bytes + 8), 60);  /* tensors: 3 + 3 layers x 19 */
  ASSERT_EQ_INT(u64_at(bytes + 16), 19); /* keys */
  /* the first key: u64 length 20, "general.architecture", type 8 (string), u64 7, "gpt-oss" */
  ASSERT_EQ_INT(u64_at(bytes + 24), 20);
  ASSERT(!memcmp(bytes + 32, "general.architecture", 20));
  ASSERT_EQ_INT(u32_at(bytes + 52), 8);
  ASSERT_EQ_INT(u64_at(bytes + 56), 7);
  ASSERT(!memcmp(bytes + 64, "gpt-oss", 7));
  free(bytes);
  moe_gguf *g;
  ASSERT_OK(moe_gguf_open(&g, gguf));
  const struct { const char *key; uint32_t v; } u32s[] = {
      {"gpt-oss.block_count", 3}, {"gpt-oss.context_length", 64}, {"gpt-oss.embedding_length", 32},
      {"gpt-oss.feed_forward_length", 32}, {"gpt-oss.attention.head_count", 4},
      {"gpt-oss.attention.head_count_kv", 2}, {"gpt-oss.expert_count", 4}, {"gpt-oss.expert_used_count", 2},
      {"gpt-oss.attention.key_length", 12}, {"gpt-oss.attention.value_length", 12},
      {"gpt-oss.attention.sliding_window", 4}, {"gpt-oss.expert_feed_forward_length", 32},
      {"general.file_type", 0}, {"general.quantization_version", 2}};
  for (size_t i = 0; i < sizeof u32s / sizeof *u32s; i++) ASSERT(lm_gguf_u32_is(g, u32s[i].key, u32s[i].v));
  /* layer_types sliding, full, sliding: llama.cpp's default pattern, no key; no YaRN: no rope.scaling */
  ASSERT(moe_gguf_find_key(g, "gpt-oss.attention.sliding_window_pattern") < 0);
  ASSERT(moe_gguf_find_key(g, "gpt-oss.rope.scaling.type") < 0);
  float f;
  ASSERT_OK(moe_gguf_get_f32(g, "gpt-oss.rope.freq_base", &f));
  ASSERT(f == 10000.0f);
  ASSERT_OK(moe_gguf_get_f32(g, "gpt-oss.attention.layer_norm_rms_epsilon", &f));
  ASSERT(f == 1e-5f);
  static const char *const top[][2] = {
      {"token_embd.weight", "32 48"}, {"output_norm.weight", "32"}, {"output.weight", "32 48"}};
  static const char *const layer[][2] = {
      {"attn_norm.weight", "32"}, {"post_attention_norm.weight", "32"}, {"attn_q.weight", "32 48"},
      {"attn_k.weight", "32 24"}, {"attn_v.weight", "32 24"}, {"attn_output.weight", "48 32"}, {"attn_q.bias", "48"},
      {"attn_k.bias", "24"}, {"attn_v.bias", "24"}, {"attn_output.bias", "32"}, {"attn_sinks.weight", "4"},
      {"ffn_gate_inp.weight", "32 4"}, {"ffn_gate_inp.bias", "4"}, {"ffn_gate_exps.weight", "32 32 4"},
      {"ffn_up_exps.weight", "32 32 4"}, {"ffn_down_exps.weight", "32 32 4"}, {"ffn_gate_exps.bias", "32 4"},
      {"ffn_up_exps.bias", "32 4"}, {"ffn_down_exps.bias", "32 4"}};
  int seen = 0;
  for (size_t i = 0; i < 3; i++, seen++) ASSERT(lm_gguf_tensor_is(g, top[i][0], top[i][1], MOE_GGUF_F32));
  for (int l = 0; l < 3; l++)
    for (size_t i = 0; i < sizeof layer / sizeof *layer; i++, seen++) {
      char name[64];
      snprintf(name, sizeof name, "blk.%d.%s", l, layer[i][0]);
      ASSERT(lm_gguf_tensor_is(g, name, layer[i][1], MOE_GGUF_F32));
    }
  ASSERT_EQ_INT(seen, moe_gguf_tensor_count(g));
  /* layer 2's experts against the checkpoint's fused tensors: gate_up_proj (E, D, 2H), down_proj
   * (E, H, D), gate_up_proj_bias (E, 2H) */
  moe_st *st;
  snprintf(st_path, sizeof st_path, "%s/model.safetensors", lm_case_dir("gpt_oss", dir, sizeof dir));
  ASSERT_OK(moe_st_open(&st, st_path));
  const char *gu = "model.layers.2.mlp.experts.gate_up_proj", *dn = "model.layers.2.mlp.experts.down_proj";
  const char *gub = "model.layers.2.mlp.experts.gate_up_proj_bias";
  moe_gguf_tensor gate, up, down, gate_b, up_b;
  ASSERT_OK(moe_gguf_tensor_get(g, "blk.2.ffn_gate_exps.weight", &gate));
  ASSERT_OK(moe_gguf_tensor_get(g, "blk.2.ffn_up_exps.weight", &up));
  ASSERT_OK(moe_gguf_tensor_get(g, "blk.2.ffn_down_exps.weight", &down));
  ASSERT_OK(moe_gguf_tensor_get(g, "blk.2.ffn_gate_exps.bias", &gate_b));
  ASSERT_OK(moe_gguf_tensor_get(g, "blk.2.ffn_up_exps.bias", &up_b));
  int bad = 0;
  for (int e = 0; e < 4; e++)
    for (int j = 0; j < 32; j++) {
      const float *gw = (const float *)gate.data + (e * 32 + j) * 32, *uw = (const float *)up.data + (e * 32 + j) * 32;
      const float *dw = (const float *)down.data + (e * 32 + j) * 32; /* row j of expert e: output j */
      for (int d = 0; d < 32; d++) {
        bad += gw[d] != st_at(st, gu, e, d, 2 * j) || uw[d] != st_at(st, gu, e, d, 2 * j + 1);
        bad += dw[d] != st_at(st, dn, e, d, j); /* down row j (output j) over the hidden d */
      }
      bad += ((const float *)gate_b.data)[e * 32 + j] != st_at(st, gub, e, 2 * j, 0);
      bad += ((const float *)up_b.data)[e * 32 + j] != st_at(st, gub, e, 2 * j + 1, 0);
    }
  if (bad) FAIL_("%d expert values are not where llama.cpp's converter puts the checkpoint's", bad);
  moe_st_close(st);
  moe_gguf_close(g);
}

/* Row r of a ggml MXFP4 tensor (n values: n / 32 blocks of the E8M0 scale, then value i in the low
 * nibble of byte i and value i + 16 in the high one) from the checkpoint's row: its blocks (16 bytes,
 * value 2i in the low nibble of byte i, 2i + 1 in the high) and scales, as llama.cpp's converter
 * repacks them (conversion/gpt_oss.py, transform_nibble_layout), but for -0 (nibble 8), which is 0
 * (nibble 0) here: both are the value 0, and values are all that libmoe's model keeps of them. */
static int no_minus_zero(int nibble) { return nibble == 8 ? 0 : nibble; }

static void repack_row(const uint8_t *blocks, const uint8_t *scales, int n, uint8_t *out) {
  for (int b = 0; b < n / 32; b++, out += 17) {
    out[0] = scales[b];
    for (int i = 0; i < 16; i++) {
      int lo = (blocks[b * 16 + i / 2] >> (4 * (i & 1))) & 15, hi = (blocks[b * 16 + (i + 16) / 2] >> (4 * (i & 1))) & 15;
      out[1 + i] = (uint8_t)(no_minus_zero(lo) | no_minus_zero(hi) << 4);
    }
  }
}

/* Whether tensor `name` of g (E x R rows of K values, MXFP4) holds the checkpoint's `hf`_blocks and
 * _scales rows: its rows r of each expert are the checkpoint's rows 2r + first (step 2, gate_up_proj's
 * gate or up) or r (step 1, down_proj), bytes as llama.cpp's converter repacks them. */
static int same_mxfp4(const moe_gguf *g, const char *name, const moe_st *st, const char *hf, int step, int first) {
  char bn[128], sn[128];
  snprintf(bn, sizeof bn, "%s_blocks", hf);
  snprintf(sn, sizeof sn, "%s_scales", hf);
  moe_gguf_tensor t;
  moe_tensor_view vb, vs;
  if (moe_gguf_tensor_get(g, name, &t) || moe_st_get(st, bn, &vb) || moe_st_get(st, sn, &vs) || t.type != MOE_GGUF_MXFP4)
    return fprintf(stderr, "  %s: not MXFP4 beside %s: %s\n", name, bn, moe_last_error()), 0;
  int64_t K = t.ne[0], R = t.ne[1], E = t.ne[2], G = K / 32, bad = 0;
  uint8_t row[17 * 64];
  for (int64_t e = 0; e < E; e++)
    for (int64_t r = 0; r < R; r++) {
      int64_t src = e * R * step + r * step + first;
      repack_row((const uint8_t *)vb.data + src * G * 16, (const uint8_t *)vs.data + src * G, (int)K, row);
      bad += memcmp(row, (const uint8_t *)t.data + (e * R + r) * G * 17, (size_t)G * 17) != 0;
    }
  if (bad) fprintf(stderr, "  %s: %lld of %lld rows are not the checkpoint's bytes\n", name, (long long)bad,
                   (long long)(E * R));
  return !bad;
}

/* src's tensors with the expert stacks (ffn_*_exps.weight) quantized to MXFP4 and the rest as they are,
 * into dst: what llama.cpp's converter writes from an MXFP4 checkpoint with --outtype f32. */
static moe_status mxfp4_experts(const char *src, const char *dst) {
  moe_gguf *g;
  moe_gguf_writer *w = NULL;
  moe_status st = moe_gguf_open(&g, src);
  if (st != MOE_OK) return st;
  st = moe_gguf_writer_new(&w);
  for (int64_t i = 0; st == MOE_OK && i < moe_gguf_kv_count(g); i++) st = moe_gguf_writer_copy_kv(w, g, i);
  void *bufs[16] = {0};
  int nb = 0;
  for (int64_t i = 0; st == MOE_OK && i < moe_gguf_tensor_count(g); i++) {
    moe_gguf_tensor t;
    st = moe_gguf_tensor_at(g, i, &t);
    if (st == MOE_OK && strstr(t.name, "_exps.weight") && nb < 16) {
      size_t n = (size_t)(t.ne[0] * t.ne[1] * t.ne[2]), bytes = n / 32 * 17;
      bufs[nb] = malloc(bytes);
      st = moe_gguf_quantize(MOE_GGUF_MXFP4, t.data, bufs[nb], (int64_t)n);
      t.type = MOE_GGUF_MXFP4, t.data = bufs[nb++], t.nbytes = bytes;
    }
    if (st == MOE_OK) st = moe_gguf_writer_add_tensor(w, t.name, t.type, t.ndim, t.ne, t.data, t.nbytes);
  }
  if (st == MOE_OK) st = moe_gguf_writer_save(w, dst);
  moe_gguf_writer_free(w);
  moe_gguf_close(g);
  for (int i = 0; i < nb; i++) free(bufs[i]);
  return st;
}

/* The MXFP4 fixture: written as MXFP4 its experts are the checkpoint's MXFP4 bytes (what llama.cpp's
 * converter writes, -0 as 0: the dequantized values quantize back to them). A file of MXFP4 experts
 * and F32 other weights (what the converter writes with --outtype f32) keeps them in that type on load
 * (no fp32 experts; moe_layer_expert_type MXFP4 for gate, up and down) and gives, bit for bit, the
 * logits of the checkpoint's model whose layers quantize their experts to MXFP4
 * (moe_layer_quantize_experts): the same bytes through the same kernels. The same file widened
 * (expert_type -1) has the checkpoint's values bit for bit. */
TEST(gguf_gptoss_mxfp4_experts_stay_mxfp4_with_the_checkpoint_bytes) {
  char dir[512], gguf[512], mixed[512], f32[512], st_path[600];
  moe_lm_t hf, q, w;
  ASSERT(load_llama_cpp_settings("gpt_oss_mxfp4", &hf));
  test_tmp_path("oss_mxfp4.gguf", gguf, sizeof gguf);
  moe_lm_gguf_options o = {MOE_GGUF_MXFP4, NULL, NULL};
  ASSERT_OK(moe_lm_save_gguf(&hf, gguf, &o));
  moe_gguf *g;
  moe_st *st;
  ASSERT_OK(moe_gguf_open(&g, gguf));
  snprintf(st_path, sizeof st_path, "%s/model.safetensors", lm_case_dir("gpt_oss_mxfp4", dir, sizeof dir));
  ASSERT_OK(moe_st_open(&st, st_path));
  for (int l = 0; l < 3; l++) {
    char name[64], hf_name[96];
    snprintf(hf_name, sizeof hf_name, "model.layers.%d.mlp.experts.gate_up_proj", l);
    snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.weight", l);
    ASSERT(same_mxfp4(g, name, st, hf_name, 2, 0));
    snprintf(name, sizeof name, "blk.%d.ffn_up_exps.weight", l);
    ASSERT(same_mxfp4(g, name, st, hf_name, 2, 1));
    snprintf(hf_name, sizeof hf_name, "model.layers.%d.mlp.experts.down_proj", l);
    snprintf(name, sizeof name, "blk.%d.ffn_down_exps.weight", l);
    ASSERT(same_mxfp4(g, name, st, hf_name, 1, 0));
  }
  moe_st_close(st);
  moe_gguf_close(g);
  test_tmp_path("oss_f32.gguf", f32, sizeof f32);
  test_tmp_path("oss_mixed.gguf", mixed, sizeof mixed);
  ASSERT_OK(moe_lm_save_gguf(&hf, f32, NULL));
  ASSERT_OK(mxfp4_experts(f32, mixed));
  moe_lm_config c;
  ASSERT_OK(moe_lm_read_config(mixed, &c));
  ASSERT_EQ_INT(c.moe.expert_type, MOE_GGUF_MXFP4);
  ASSERT_OK(moe_lm_load(&q, mixed, NULL));
  for (int l = 0; l < 3; l++) {
    ASSERT(!moe_layer_param_find(&q.layers[l], "experts.fc1.weight"));
    for (int fc = 1; fc <= 3; fc++) ASSERT(moe_layer_expert_type(&q.layers[l], fc) == MOE_GGUF_MXFP4);
  }
  c.moe.expert_type = -1;
  ASSERT_OK(moe_lm_load(&w, mixed, &c));
  static const char *const experts[] = {"fc1.weight", "fc1.bias", "fc3.weight", "fc3.bias", "fc2.weight"};
  for (int l = 0; l < 3; l++)
    for (int k = 0; k < 5; k++) {
      char name[96];
      snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s", l, experts[k]);
      const moe_tensor_ref *a = moe_lm_find(&hf, name), *b = moe_lm_find(&w, name);
      ASSERT(a && b && a->numel == b->numel);
      if (memcmp(a->data, b->data, a->numel * 4)) FAIL_("%s: the file's values are not the checkpoint's", name);
    }
  for (int l = 0; l < 3; l++) ASSERT_OK(moe_layer_quantize_experts(&hf.layers[l], MOE_GGUF_MXFP4));
  ASSERT(lm_same_logits("MXFP4 experts", "gpt_oss_mxfp4", &hf, &q));
  moe_lm_free(&hf), moe_lm_free(&q), moe_lm_free(&w);
}

/* What llama.cpp's gpt-oss computes otherwise is refused when writing, naming the setting, with no file
 * left: swiglu_limit (the fixtures' 1.5) and alpha, YaRN's truncate false (the fixture's), mscale, a
 * layer pattern that is not "the last of every n", no sliding window, tied embeddings, no attention
 * biases. */
TEST(gguf_gptoss_settings_without_a_key_are_refused_naming_them) {
  char dir[512];
  moe_lm_t m;
  ASSERT_OK(moe_lm_load(&m, lm_case_dir("gpt_oss", dir, sizeof dir), NULL));
  ASSERT(lm_gguf_refused(&m, "swiglu_limit 1.5"));
  m.cfg.moe.swiglu_limit = 7.0f, m.cfg.moe.swiglu_alpha = 1.5f;
  ASSERT(lm_gguf_refused(&m, "swiglu_alpha 1.5"));
  m.cfg.moe.swiglu_alpha = 1.702f;
  m.cfg.full_layers[0] = 1; /* full, sliding, sliding */
  ASSERT(lm_gguf_refused(&m, "layer_types"));
  m.cfg.full_layers[0] = 2;
  m.cfg.sliding_window = 0;
  ASSERT(lm_gguf_refused(&m, "sliding window"));
  m.cfg.sliding_window = 4;
  m.cfg.tie_embeddings = 1;
  ASSERT(lm_gguf_refused(&m, "tie_word_embeddings"));
  m.cfg.tie_embeddings = 0;
  m.cfg.o_bias = 0;
  ASSERT(lm_gguf_refused(&m, "attention_bias"));
  moe_lm_free(&m);
  ASSERT_OK(moe_lm_load(&m, lm_case_dir("gpt_oss_yarn", dir, sizeof dir), NULL));
  m.cfg.moe.swiglu_limit = 7.0f;
  ASSERT(lm_gguf_refused(&m, "truncate"));
  m.cfg.yarn.truncate = 1, m.cfg.yarn.mscale_all_dim = 1;
  ASSERT(lm_gguf_refused(&m, "mscale_all_dim"));
  moe_lm_free(&m);
}

/* A pattern other than llama.cpp's default is written as sliding_window_pattern and read back; YaRN's
 * keys are llama.cpp's. */
TEST(gguf_gptoss_layer_pattern_and_yarn_keys) {
  char gguf[512];
  moe_lm_t m;
  ASSERT(load_llama_cpp_settings("gpt_oss_yarn", &m));
  m.cfg.full_layers[0] = 4; /* sliding, sliding, full: the last of every 3 */
  test_tmp_path("oss_pattern.gguf", gguf, sizeof gguf);
  ASSERT_OK(moe_lm_save_gguf(&m, gguf, NULL));
  moe_gguf *g;
  ASSERT_OK(moe_gguf_open(&g, gguf));
  uint32_t u;
  float f;
  const char *s;
  ASSERT_OK(moe_gguf_get_u32(g, "gpt-oss.attention.sliding_window_pattern", &u));
  ASSERT_EQ_INT(u, 3);
  ASSERT_OK(moe_gguf_get_str(g, "gpt-oss.rope.scaling.type", &s));
  ASSERT(!strcmp(s, "yarn"));
  ASSERT_OK(moe_gguf_get_f32(g, "gpt-oss.rope.scaling.factor", &f));
  ASSERT(f == 4.0f);
  ASSERT_OK(moe_gguf_get_u32(g, "gpt-oss.rope.scaling.original_context_length", &u));
  ASSERT_EQ_INT(u, 4096);
  ASSERT_OK(moe_gguf_get_f32(g, "gpt-oss.rope.scaling.yarn_beta_fast", &f));
  ASSERT(f == 32.0f);
  ASSERT_OK(moe_gguf_get_f32(g, "gpt-oss.rope.scaling.yarn_beta_slow", &f));
  ASSERT(f == 1.0f);
  moe_gguf_close(g);
  moe_lm_config c;
  ASSERT_OK(moe_lm_read_config(gguf, &c));
  ASSERT(lm_same_config("pattern 3", &m.cfg, &c));
  moe_lm_free(&m);
}

/* Malformed gpt-oss files are errors naming the key or tensor: a required key absent, one of another
 * type, values llama.cpp's graph would compute otherwise, a tensor absent or of another shape. */
TEST(gguf_gptoss_bad_files_are_errors_naming_the_key_or_tensor) {
  char good[512], bad[512];
  moe_lm_t m;
  moe_lm_config c;
  ASSERT(load_llama_cpp_settings("gpt_oss_yarn", &m));
  test_tmp_path("oss_good.gguf", good, sizeof good);
  test_tmp_path("oss_bad.gguf", bad, sizeof bad);
  ASSERT_OK(moe_lm_save_gguf(&m, good, NULL));
  moe_lm_free(&m);
  const struct {
    const char *drop, *shrink, *key, *value;
    moe_status st;
    const char *names, *also;
  } cases[] = {
      {NULL, NULL, "gpt-oss.attention.sliding_window", NULL, MOE_ERR_MISSING, "gpt-oss.attention.sliding_window", NULL},
      {NULL, NULL, "gpt-oss.expert_feed_forward_length", NULL, MOE_ERR_MISSING, "gpt-oss.expert_feed_forward_length",
       NULL},
      {NULL, NULL, "gpt-oss.attention.sliding_window_pattern", "2", MOE_ERR_DTYPE,
       "gpt-oss.attention.sliding_window_pattern", NULL},
      {NULL, NULL, "gpt-oss.rope.scaling.type", "linear", MOE_ERR_FORMAT, "gpt-oss.rope.scaling.type", "linear"},
      {NULL, NULL, "gpt-oss.rope.scaling.factor", NULL, MOE_ERR_MISSING, "gpt-oss.rope.scaling.factor", NULL},
      {NULL, NULL, "gpt-oss.rope.scaling.yarn_attn_factor", "f32:2", MOE_ERR_FORMAT,
       "gpt-oss.rope.scaling.yarn_attn_factor", NULL},
      {NULL, NULL, "gpt-oss.rope.freq_base_swa", "f32:5000", MOE_ERR_FORMAT, "gpt-oss.rope.freq_base_swa", "5000"},
      {NULL, NULL, "gpt-oss.final_logit_softcapping", "f32:30", MOE_ERR_FORMAT, "gpt-oss.final_logit_softcapping",
       NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ASSERT_OK(lm_gguf_rewrite(good, bad, cases[i].drop, cases[i].shrink, cases[i].key, cases[i].value));
    moe_status st = moe_lm_read_config(bad, &c);
    if (st != cases[i].st)
      FAIL_("%s %s: %s, want %s (%s)", cases[i].key, cases[i].value ? cases[i].value : "left out",
            moe_status_name(st), moe_status_name(cases[i].st), moe_last_error());
    ASSERT(lm_error_names(cases[i].names, "oss_bad.gguf", cases[i].also));
  }
  ASSERT_OK(lm_gguf_rewrite(good, bad, "blk.1.attn_sinks.weight", NULL, NULL, NULL));
  ASSERT_STATUS(moe_lm_load(&m, bad, NULL), MOE_ERR_MISSING);
  ASSERT(lm_error_names("blk.1.attn_sinks.weight", "oss_bad.gguf", NULL));
  ASSERT_OK(lm_gguf_rewrite(good, bad, NULL, "blk.2.ffn_up_exps.bias", NULL, NULL));
  ASSERT_STATUS(moe_lm_load(&m, bad, NULL), MOE_ERR_SHAPE);
  ASSERT(lm_error_names("blk.2.ffn_up_exps.bias", "[32, 3]", "[32, 4]"));
  ASSERT_OK(lm_gguf_rewrite(good, bad, NULL, "blk.0.ffn_down_exps.weight", NULL, NULL));
  ASSERT_STATUS(moe_lm_load(&m, bad, NULL), MOE_ERR_SHAPE);
  ASSERT(lm_error_names("blk.0.ffn_down_exps.weight", "[32, 31, 4]", "[32, 32, 4]"));
}
