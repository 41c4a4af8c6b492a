/* Language models in GGUF files (moe_lm_save_gguf, moe_lm_load of a .gguf, the tokenizer from
 * tokenizer.ggml.* keys): the families' Hugging Face fixtures (tests/fixtures/lm/, checked against
 * PyTorch by test_lm_families.c) converted to F32 GGUF give the same logits bit for bit and convert back
 * to the same tensors; quantized files stay within a stated distance of F32; the file has llama.cpp's
 * keys and tensor names, and llama's q/k rows in the converter's permuted order (checked against the
 * converter's reshape written out here); the real tokenizers of data/tokenizers encode the same from
 * GGUF metadata as from their tokenizer.json; bad files are errors naming the tensor, shape, arch or
 * pre-tokenizer. */
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lm/tokenizer_gguf.h"
#include "lm_check.h"
#include "run_cli.h"
#include "test.h"

static const char *const cases[] = {"mixtral", "mixtral_tied", "qwen2_moe", "qwen3_moe", "olmoe"};
#define NCASES (int)(sizeof cases / sizeof cases[0])

/* Deterministic tokens (B, T) in [0, V). */
static void tokens(int32_t *t, int n, int V) {
  for (int i = 0; i < n; i++) t[i] = (int32_t)((i * 7 + 3) % V);
}

/* The (B, T, V) logits of m on tokens(), malloc'd. */
static float *logits(moe_lm_t *m, int B, int T) {
  int32_t t[64];
  tokens(t, B * T, m->cfg.vocab);
  size_t n = (size_t)B * T * m->cfg.vocab;
  float *out = malloc(n * sizeof *out);
  if (!out || moe_lm_forward(m, t, NULL, B, T, NULL) != MOE_OK) {
    free(out);
    return NULL;
  }
  memcpy(out, moe_lm_logits(m), n * sizeof *out);
  return out;
}

TEST(gguf_lm_f32_gives_the_hf_logits_exactly_and_converts_back) {
  for (int c = 0; c < NCASES; c++) {
    char dir[512], gguf[512], back[512], name[64];
    moe_lm_t hf, g, h2;
    ASSERT_OK(moe_lm_load(&hf, lm_case_dir(cases[c], dir, sizeof dir), NULL));
    snprintf(name, sizeof name, "%s.gguf", cases[c]);
    test_tmp_path(name, gguf, sizeof gguf);
    ASSERT_OK(moe_lm_save_gguf(&hf, gguf, NULL));
    moe_lm_config cfg;
    ASSERT_OK(moe_lm_read_config(gguf, &cfg));
    ASSERT_EQ_INT(cfg.family, hf.cfg.family);
    ASSERT_EQ_INT(cfg.vocab, hf.cfg.vocab);
    ASSERT_EQ_INT(cfg.tie_embeddings, hf.cfg.tie_embeddings);
    ASSERT_EQ_INT(cfg.moe.shared_H, hf.cfg.moe.shared_H);
    ASSERT(!memcmp(cfg.dense_layers, hf.cfg.dense_layers, sizeof cfg.dense_layers));
    ASSERT(cfg.clip_qkv == hf.cfg.clip_qkv && cfg.rope_theta == hf.cfg.rope_theta && cfg.rms_eps == hf.cfg.rms_eps);
    ASSERT_OK(moe_lm_load(&g, gguf, NULL));
    ASSERT_EQ_INT(g.numel, hf.numel);
    float *a = logits(&hf, 2, 8), *b = logits(&g, 2, 8);
    ASSERT(a && b);
    size_t n = (size_t)16 * hf.cfg.vocab, diff = 0;
    for (size_t i = 0; i < n; i++) diff += a[i] != b[i];
    if (diff) FAIL_("%s: %zu of %zu logits differ from the Hugging Face checkpoint's", cases[c], diff, n);
    snprintf(name, sizeof name, "%s_back", cases[c]);
    test_tmp_path(name, back, sizeof back);
    ASSERT_OK(moe_lm_save(&g, back));
    ASSERT_OK(moe_lm_load(&h2, back, NULL));
    ASSERT(lm_same_tensors(cases[c], &hf, &h2)); /* after HF -> GGUF -> HF */
    fprintf(stderr, "  %s: %zu logits equal, %d tensors back\n", cases[c], n, hf.nrefs);
    free(a), free(b);
    moe_lm_free(&hf), moe_lm_free(&g), moe_lm_free(&h2);
  }
}

/* Files llama.cpp's own converter wrote from the Mixtral and OLMoE fixtures (dev/gguf_lm_llama_cpp.py,
 * tests/fixtures/gguf_lm/): the config read from llama.cpp's keys is the fixture's, and the weights
 * read by llama.cpp's names and undone from its permutation give the fixture's logits bit for bit.
 * That converter (February 2025) writes no clamp_kqv for OLMoE: its clip is the one field taken from
 * the fixture. */
TEST(gguf_lm_llama_cpp_files_give_the_hf_logits) {
  static const char *const fams[] = {"mixtral", "olmoe"};
  for (int f = 0; f < 2; f++) {
    char dir[512], gguf[600];
    moe_lm_t hf, g;
    moe_lm_config c;
    ASSERT_OK(moe_lm_load(&hf, lm_case_dir(fams[f], dir, sizeof dir), NULL));
    snprintf(gguf, sizeof gguf, "%s/gguf_lm/%s.gguf", test_fixture_dir(), fams[f]);
    ASSERT_OK(moe_lm_read_config(gguf, &c));
    const moe_lm_config *h = &hf.cfg;
    ASSERT(c.family == h->family && c.vocab == h->vocab && c.n_layers == h->n_layers && c.n_heads == h->n_heads &&
           c.n_kv_heads == h->n_kv_heads && c.head_dim == h->head_dim && c.max_seq == h->max_seq);
    ASSERT(c.moe.D == h->moe.D && c.moe.H == h->moe.H && c.moe.E == h->moe.E && c.moe.top_k == h->moe.top_k);
    ASSERT(c.rope_theta == h->rope_theta && c.rms_eps == h->rms_eps && c.tie_embeddings == h->tie_embeddings);
    ASSERT(c.qk_norm == h->qk_norm && (c.moe.normalize_topk == 1) == (h->moe.normalize_topk != 0));
    c.clip_qkv = h->clip_qkv;
    ASSERT_OK(moe_lm_load(&g, gguf, &c));
    float *a = logits(&hf, 2, 8), *b = logits(&g, 2, 8);
    ASSERT(a && b);
    size_t n = (size_t)16 * h->vocab, diff = 0;
    for (size_t i = 0; i < n; i++) diff += a[i] != b[i];
    if (diff) FAIL_("%s: %zu of %zu logits of llama.cpp's file differ from the checkpoint's", fams[f], diff, n);
    free(a), free(b);
    moe_lm_free(&hf), moe_lm_free(&g);
  }
}

/* llama.cpp's converter writes llama's q_proj / k_proj as
 *   w.reshape(n_head, 2, rows / n_head / 2, D).swapaxes(1, 2).reshape(rows, D)
 * (LlamaModel.permute): row h hd + 2 i + j of the file is row h hd + j hd / 2 + i of the checkpoint.
 * The Mixtral fixture's file against that index arithmetic, written here apart from the library's. */
TEST(gguf_lm_llama_q_k_rows_are_permuted_as_llama_cpp_does) {
  char dir[512], gguf[512];
  moe_lm_t hf;
  ASSERT_OK(moe_lm_load(&hf, lm_case_dir("mixtral", dir, sizeof dir), NULL));
  test_tmp_path("perm.gguf", gguf, sizeof gguf);
  ASSERT_OK(moe_lm_save_gguf(&hf, gguf, NULL));
  moe_gguf *g;
  ASSERT_OK(moe_gguf_open(&g, gguf));
  const char *names[2][2] = {{"model.layers.1.self_attn.q_proj.weight", "blk.1.attn_q.weight"},
                             {"model.layers.1.self_attn.k_proj.weight", "blk.1.attn_k.weight"}};
  int hd = hf.cfg.head_dim, D = hf.cfg.moe.D, heads[2] = {hf.cfg.n_heads, hf.cfg.n_kv_heads};
  float row[256];
  ASSERT(D <= 256);
  for (int k = 0; k < 2; k++) {
    const moe_tensor_ref *r = moe_lm_find(&hf, names[k][0]);
    moe_gguf_tensor t;
    ASSERT(r);
    ASSERT_OK(moe_gguf_tensor_get(g, names[k][1], &t));
    ASSERT_EQ_INT(t.nrows, heads[k] * hd);
    for (int h = 0; h < heads[k]; h++)
      for (int i = 0; i < hd / 2; i++)
        for (int j = 0; j < 2; j++) {
          ASSERT_OK(moe_gguf_tensor_row_f32(g, &t, h * hd + 2 * i + j, row));
          if (memcmp(row, r->data + (size_t)(h * hd + j * hd / 2 + i) * D, (size_t)D * 4))
            FAIL_("%s row %d is not checkpoint row %d", names[k][1], h * hd + 2 * i + j, h * hd + j * hd / 2 + i);
        }
  }
  moe_gguf_close(g);
  moe_lm_free(&hf);
}

static uint32_t u32_at(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t u64_at(const unsigned char *p) { return u32_at(p) | (uint64_t)u32_at(p + 4) << 32; }

/* The Qwen2-MoE fixture's file as bytes (magic, version, counts) and as llama.cpp's loader reads it:
 * every key it needs under its name and type, and exactly the tensors llama-model.cpp creates for a
 * qwen2moe model (its dense layer as ffn_gate/up/down), in ggml's shapes. */
TEST(gguf_lm_file_has_llama_cpp_keys_and_tensor_names) {
  char dir[512], gguf[512];
  moe_lm_t hf;
  ASSERT_OK(moe_lm_load(&hf, lm_case_dir("qwen2_moe", dir, sizeof dir), NULL));
  test_tmp_path("q2.gguf", gguf, sizeof gguf);
  ASSERT_OK(moe_lm_save_gguf(&hf, gguf, NULL));
  size_t len;
  unsigned char *bytes = (unsigned char *)test_read_file(gguf, &len);
  ASSERT(bytes && len > 24);
  ASSERT(!memcmp(bytes, "GGUF", 4));
  ASSERT_EQ_INT(u32_at(bytes + 4), 3);
  ASSERT_EQ_INT(u64_at(bytes + 8), 49);  /* tensors: 3 + 2 MoE layers x 18 + 1 dense layer x 10 */
  ASSERT_EQ_INT(u64_at(bytes + 16), 20); /* keys */
  /* the first key: u64 length 20, "general.architecture", type 8 (string), u64 8, "qwen2moe" */
  ASSERT_EQ_INT(u64_at(bytes + 24), 20);
  ASSERT(!memcmp(bytes + 32, "general.architecture", 20));
  ASSERT_EQ_INT(u32_at(bytes + 52), 8);
  ASSERT_EQ_INT(u64_at(bytes + 56), 8);
  ASSERT(!memcmp(bytes + 64, "qwen2moe", 8));
  free(bytes);
  moe_gguf *g;
  ASSERT_OK(moe_gguf_open(&g, gguf));
  const struct { const char *key; uint32_t v; } u32s[] = {
      {"qwen2moe.block_count", 3}, {"qwen2moe.context_length", 64}, {"qwen2moe.embedding_length", 32},
      {"qwen2moe.feed_forward_length", 24}, {"qwen2moe.attention.head_count", 4},
      {"qwen2moe.attention.head_count_kv", 2}, {"qwen2moe.expert_count", 4}, {"qwen2moe.expert_used_count", 2},
      {"qwen2moe.expert_feed_forward_length", 16}, {"qwen2moe.expert_shared_feed_forward_length", 20},
      {"qwen2moe.attention.key_length", 8}, {"general.file_type", 0}};
  for (size_t i = 0; i < sizeof u32s / sizeof *u32s; i++) ASSERT(lm_gguf_u32_is(g, u32s[i].key, u32s[i].v));
  float f;
  ASSERT_OK(moe_gguf_get_f32(g, "qwen2moe.rope.freq_base", &f));
  ASSERT(f == 10000.0f);
  ASSERT_OK(moe_gguf_get_f32(g, "qwen2moe.attention.layer_norm_rms_epsilon", &f));
  ASSERT(f == 1e-6f);
  static const char *const top[][2] = {
      {"token_embd.weight", "32 48"}, {"output_norm.weight", "32"}, {"output.weight", "32 48"}};
  static const char *const layer[][2] = {
      {"attn_norm.weight", "32"}, {"attn_q.weight", "32 32"}, {"attn_k.weight", "32 16"}, {"attn_v.weight", "32 16"},
      {"attn_q.bias", "32"}, {"attn_k.bias", "16"}, {"attn_v.bias", "16"}, {"attn_output.weight", "32 32"},
      {"ffn_norm.weight", "32"}, {"ffn_gate_inp.weight", "32 4"}, {"ffn_gate_exps.weight", "32 16 4"},
      {"ffn_up_exps.weight", "32 16 4"}, {"ffn_down_exps.weight", "16 32 4"}, {"ffn_gate_shexp.weight", "32 20"},
      {"ffn_up_shexp.weight", "32 20"}, {"ffn_down_shexp.weight", "20 32"}, {"ffn_gate_inp_shexp.weight", "32 1"},
      {"ffn_gate.weight", "32 24"}, {"ffn_up.weight", "32 24"}, {"ffn_down.weight", "24 32"}};
  int seen = 0;
  for (size_t i = 0; i < 3; i++, seen++) ASSERT(lm_gguf_tensor_is(g, top[i][0], top[i][1], MOE_GGUF_F32));
  for (int l = 0; l < 3; l++)
    for (size_t i = 0; i < sizeof layer / sizeof *layer; i++) {
      int dense_only = i >= 17, moe_only = i >= 9 && i < 17;
      if ((l == 1 && moe_only) || (l != 1 && dense_only)) continue; /* layer 1 is the dense one */
      char name[64];
      snprintf(name, sizeof name, "blk.%d.%s", l, layer[i][0]);
      ASSERT(lm_gguf_tensor_is(g, name, layer[i][1], MOE_GGUF_F32));
      seen++;
    }
  ASSERT_EQ_INT(seen, moe_gguf_tensor_count(g));
  moe_gguf_close(g);
  moe_lm_free(&hf);
}

/* The weights a file of type t holds, computed apart from the writer and the loader: each 2-D weight
 * but norms and routers (each expert's a slice of rows) quantized and dequantized with the codecs
 * (tested against the specification in test_quant.c). */
static int round_weights(moe_lm_t *m, moe_gguf_type t) {
  for (int i = 0; i < m->nrefs; i++) {
    moe_tensor_ref *r = &m->refs[i];
    if (r->ndim < 2 || strstr(r->name, "norm") || strstr(r->name, ".gate.weight")) continue;
    int64_t cols = r->shape[1];
    moe_gguf_type rt = cols % moe_gguf_type_block(t) == 0 ? t : cols % 32 == 0 ? MOE_GGUF_Q8_0 : MOE_GGUF_F16;
    int64_t n = (int64_t)r->numel; /* rows are whole blocks: all at once quantizes as row by row */
    void *q = malloc((size_t)(n / moe_gguf_type_block(rt)) * moe_gguf_type_block_bytes(rt));
    int ok = q && moe_gguf_quantize(rt, r->data, q, n) == MOE_OK && moe_gguf_dequantize(rt, q, r->data, n) == MOE_OK;
    free(q);
    if (!ok) return 0;
  }
  moe_lm_params_changed(m);
  return 1;
}

/* A model of family fam of D 256 and expert width H written as type t (a K-quant's down projection,
 * whose rows are H long, as Q8_0 where H is not a multiple of 256, as llama.cpp writes it) and loaded
 * twice. Read as it is, its experts stay in t (bound, DESIGN 4.8b): its logits within *err (the
 * largest distance relative to the largest logit) of the F32 model's, and within *act of those of the
 * model with every weight dequantized (the quantized activations' part). Loaded with expert_type -1,
 * every weight dequantized: exactly the logits of the model with round_weights' weights. Norms and the
 * router must have stayed F32, the weights taken t. */
static int quantized_case(moe_lm_family fam, moe_gguf_type t, int H, double *err, double *act) {
  moe_lm_config c;
  moe_lm_config_default(&c);
  c.family = fam;
  c.vocab = 64, c.n_layers = 1, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 64, c.max_seq = 32;
  c.moe.D = 256, c.moe.H = H, c.moe.E = 3, c.moe.top_k = 2;
  if (fam == MOE_LM_QWEN3_MOE) c.qk_norm = MOE_QK_NORM_HEAD;
  moe_lm_t m, q;
  if (moe_lm_init(&m, &c) != MOE_OK) return 0;
  moe_lm_init_params(&m, 7);
  char path[512], name[64];
  snprintf(name, sizeof name, "q_%d_%d_%d.gguf", (int)fam, (int)t, H);
  test_tmp_path(name, path, sizeof path);
  moe_lm_gguf_options o = {t, NULL, NULL};
  moe_lm_config cq;
  moe_lm_t k;
  int ok = moe_lm_save_gguf(&m, path, &o) == MOE_OK && moe_lm_read_config(path, &cq) == MOE_OK;
  int kept = ok && cq.moe.expert_type == (int)t;
  if (!kept) fprintf(stderr, "  the config's expert_type is %d, not the file's %d\n", ok ? cq.moe.expert_type : -2, (int)t);
  cq.moe.expert_type = -1; /* every weight dequantized */
  ok = kept && moe_lm_load(&q, path, &cq) == MOE_OK;
  int kload = ok && moe_lm_load(&k, path, NULL) == MOE_OK;
  ok = kload && k.layers[0].cfg.expert_type == (int)t && !moe_layer_param_find(&k.layers[0], "experts.fc1.weight");
  float *f32 = ok ? logits(&m, 2, 8) : NULL, *b = ok ? logits(&q, 2, 8) : NULL, *kl = ok ? logits(&k, 2, 8) : NULL;
  float *r = NULL;
  ok = ok && f32 && b && kl && round_weights(&m, t) && (r = logits(&m, 2, 8));
  double worst = 0, scale = 0, wact = 0;
  size_t differ = 0;
  for (size_t i = 0; ok && i < (size_t)16 * c.vocab; i++) {
    worst = fmax(worst, fabs(f32[i] - kl[i]));
    wact = fmax(wact, fabs(b[i] - kl[i]));
    scale = fmax(scale, fabs(f32[i]));
    differ += r[i] != b[i];
  }
  if (differ) fprintf(stderr, "  %zu logits differ from the model with the rounded weights\n", differ);
  *err = ok ? worst / scale : -1;
  *act = ok ? wact / scale : -1;
  if (kload) moe_lm_free(&k);
  free(kl);
  moe_gguf *g;
  moe_gguf_tensor norm, router, exps, embd;
  if (ok && moe_gguf_open(&g, path) == MOE_OK) {
    ok = moe_gguf_tensor_get(g, "blk.0.attn_norm.weight", &norm) == MOE_OK && norm.type == MOE_GGUF_F32 &&
         moe_gguf_tensor_get(g, "blk.0.ffn_gate_inp.weight", &router) == MOE_OK && router.type == MOE_GGUF_F32 &&
         moe_gguf_tensor_get(g, "blk.0.ffn_down_exps.weight", &exps) == MOE_OK &&
         exps.type == (H % moe_gguf_type_block(t) ? MOE_GGUF_Q8_0 : t) &&
         moe_gguf_tensor_get(g, "token_embd.weight", &embd) == MOE_OK && embd.type == t;
    moe_gguf_close(g);
  }
  if (b) moe_lm_free(&q);
  free(f32), free(b), free(r);
  moe_lm_free(&m);
  return ok && !differ;
}

/* Tolerances for the logits' largest error relative to the largest logit, weights ~ N(0, 0.02) through
 * two layers: measured about 0.01 for Q8_0 (8-bit rows) and 0.12 for Q4_K (4 bits, 16x the step);
 * asserted with room: 0.03 and 0.3. A misread block layout gives errors of the logits' own size. Expert
 * width 384 (1.5 K-quant blocks, as Qwen1.5-MoE's and DeepSeek-V2-Lite's 1408 are 5.5): Q4_K gate and up
 * stacks beside a Q8_0 down stack, kept in those types too. */
TEST(gguf_lm_q8_0_and_q4_k_logits_near_f32) {
  const struct { moe_lm_family fam; moe_gguf_type t; int H; double tol; } cases[] = {
      {MOE_LM_MIXTRAL, MOE_GGUF_Q8_0, 256, 0.03}, {MOE_LM_MIXTRAL, MOE_GGUF_Q4_K, 256, 0.3},
      {MOE_LM_QWEN3_MOE, MOE_GGUF_Q4_K, 256, 0.3}, {MOE_LM_MIXTRAL, MOE_GGUF_Q4_K, 384, 0.3}};
  for (int i = 0; i < 4; i++) {
    double e, a;
    const char *fam = moe_lm_family_name(cases[i].fam), *type = moe_gguf_type_name(cases[i].t);
    int ok = quantized_case(cases[i].fam, cases[i].t, cases[i].H, &e, &a);
    fprintf(stderr, "  %s %s, H %d: largest logit error / largest logit %.4f (tolerance %.2f), %.4f of it from the "
            "quantized activations (tolerance 0.03)\n", fam, type, cases[i].H, e, cases[i].tol, a);
    if (!ok) FAIL_("%s %s, H %d: not written or loaded, experts not kept in the type, logits not those of the rounded "
                   "weights, or tensors of the wrong types: %s", fam, type, cases[i].H, moe_last_error());
    ASSERT(e > 0 && e < cases[i].tol && a > 0 && a < 0.03);
  }
}

/* ---- bad files: a converted file rewritten with one thing changed ---- */

TEST(gguf_lm_bad_files_are_errors_naming_the_tensor_shape_or_arch) {
  char dir[512], good[512], bad[512];
  moe_lm_t m;
  ASSERT_OK(moe_lm_load(&m, lm_case_dir("mixtral", dir, sizeof dir), NULL));
  test_tmp_path("good.gguf", good, sizeof good);
  test_tmp_path("bad.gguf", bad, sizeof bad);
  ASSERT_OK(moe_lm_save_gguf(&m, good, NULL));
  moe_lm_free(&m);
  moe_lm_config c;
  ASSERT_OK(lm_gguf_rewrite(good, bad, "blk.1.attn_v.weight", NULL, NULL, NULL));
  ASSERT_STATUS(moe_lm_load(&m, bad, NULL), MOE_ERR_MISSING);
  ASSERT(lm_error_names("blk.1.attn_v.weight", "bad.gguf", NULL));
  ASSERT_OK(lm_gguf_rewrite(good, bad, NULL, "blk.0.attn_output.weight", NULL, NULL));
  ASSERT_STATUS(moe_lm_load(&m, bad, NULL), MOE_ERR_SHAPE);
  ASSERT(lm_error_names("blk.0.attn_output.weight", "[32, 31]", "[32, 32]"));
  ASSERT_OK(lm_gguf_rewrite(good, bad, NULL, "blk.1.ffn_gate_exps.weight", NULL, NULL)); /* checked before allocating */
  ASSERT_STATUS(moe_lm_read_config(bad, &c), MOE_OK);
  ASSERT_STATUS(moe_lm_load(&m, bad, NULL), MOE_ERR_SHAPE);
  ASSERT(lm_error_names("blk.1.ffn_gate_exps.weight", "[32, 31, 4]", "[32, 32, 4]"));
  ASSERT_OK(lm_gguf_rewrite(good, bad, NULL, NULL, "general.architecture", "gpt2"));
  ASSERT_STATUS(moe_lm_read_config(bad, &c), MOE_ERR_FORMAT);
  ASSERT(lm_error_names("general.architecture", "\"gpt2\"", NULL));
  ASSERT_STATUS(moe_lm_load(&m, bad, NULL), MOE_ERR_FORMAT);
  ASSERT_OK(lm_gguf_rewrite(good, bad, NULL, NULL, "llama.rope.scaling.type", "yarn"));
  ASSERT_STATUS(moe_lm_read_config(bad, &c), MOE_ERR_FORMAT);
  ASSERT(lm_error_names("llama.rope.scaling.type", "yarn", NULL));
  /* a tensor the model does not have: output.weight, read with a config whose head is the embedding */
  ASSERT_OK(moe_lm_read_config(good, &c));
  c.tie_embeddings = 1;
  ASSERT_STATUS(moe_lm_load(&m, good, &c), MOE_ERR_FORMAT);
  ASSERT(lm_error_names("output.weight", "not a parameter", NULL));
}

/* ---- tokenizers ---- */

/* A GGUF file holding only the tokenizer of `src` (a tokenizer.json directory; t loaded from it, or
 * NULL), at path. */
static moe_status tokenizer_gguf(const char *src, const moe_tokenizer *t, const char *path) {
  moe_gguf_writer *w;
  moe_status st = moe_gguf_writer_new(&w);
  if (st != MOE_OK) return st;
  st = t ? moe__tok_gguf_write_loaded(w, src, t, 0) : moe__tok_gguf_write(w, src, 0);
  if (st == MOE_OK) st = moe_gguf_writer_save(w, path);
  moe_gguf_writer_free(w);
  return st;
}

static const char *const MIXED[] = {
    "Hello, world! It's a test.",
    "  leading spaces and trailing   ",
    "numbers 1234567 and 3.14159, dates 2026-11-27",
    "Unicode: café, naïve, Ünïcödé, 日本語のテキスト, 中文字符, 한국어",
    "emoji 🤖🚀 and symbols ∑∫√ ← →",
    "code: def f(x):\n\treturn x**2  # square\n\n",
    "I'm, you're, we'll, they'd, she's; DON'T SHOUT",
    "<|endoftext|> <s> </s> <|im_start|>user\nhi<|im_end|>",
    "mixed\r\nline\rends\n\n\nand tabs\t\there",
    "",
};

/* Encodes every string with both tokenizers (with and without special tokens and BOS/EOS) and decodes
 * back; 0 after printing the first difference. */
static int same_encoding(const moe_tokenizer *a, const moe_tokenizer *b, const char *model) {
  if (moe_tokenizer_vocab_size(a) != moe_tokenizer_vocab_size(b)) {
    fprintf(stderr, "  %s: vocabulary %d vs %d\n", model, moe_tokenizer_vocab_size(a), moe_tokenizer_vocab_size(b));
    return 0;
  }
  const int flags[3] = {0, MOE_TOKENIZER_SPECIAL, MOE_TOKENIZER_SPECIAL | MOE_TOKENIZER_ADD_SPECIAL};
  for (size_t s = 0; s < sizeof MIXED / sizeof *MIXED; s++)
    for (int f = 0; f < 3; f++) {
      int32_t *x = NULL, *y = NULL;
      size_t nx = 0, ny = 0;
      char *dx = NULL, *dy = NULL;
      size_t lx = 0, ly = 0;
      int ok = moe_tokenizer_encode_alloc(a, MIXED[s], strlen(MIXED[s]), flags[f], &x, &nx) == MOE_OK &&
               moe_tokenizer_encode_alloc(b, MIXED[s], strlen(MIXED[s]), flags[f], &y, &ny) == MOE_OK && nx == ny &&
               (!nx || !memcmp(x, y, nx * sizeof *x)) && moe_tokenizer_decode_alloc(a, x, nx, &dx, &lx) == MOE_OK &&
               moe_tokenizer_decode_alloc(b, y, ny, &dy, &ly) == MOE_OK && lx == ly && !memcmp(dx, dy, lx);
      if (!ok) {
        fprintf(stderr, "  %s: \"%s\" (flags %d): %zu ids from tokenizer.json, %zu from GGUF", model, MIXED[s], flags[f],
                nx, ny);
        for (size_t i = 0; i < nx && i < ny; i++)
          if (x[i] != y[i]) {
            fprintf(stderr, ", first difference at %zu: %d vs %d", i, x[i], y[i]);
            break;
          }
        fprintf(stderr, " (%s)\n", moe_last_error());
      }
      free(x), free(y), free(dx), free(dy);
      if (!ok) return 0;
    }
  return 1;
}

/* moe_tokenizer_gguf_to_hf of gguf into a new directory `name`, loaded from there into *t. */
static moe_status exported(const char *gguf, const char *name, moe_tokenizer **t) {
  char dir[512];
  test_tmp_path(name, dir, sizeof dir);
  if (mkdir(dir, 0755)) return MOE_ERR_IO;
  moe_status st = moe_tokenizer_gguf_to_hf(gguf, dir);
  return st == MOE_OK ? moe_tokenizer_load(t, dir) : st;
}

/* export: also through moe_tokenizer_gguf_to_hf's tokenizer.json (the small vocabularies: time). */
static void check_model_tokenizer(int *failed_, const char *model, int export) {
  char dir[600], path[700];
  snprintf(dir, sizeof dir, "%s/../../data/tokenizers/%s", test_fixture_dir(), model);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  if (access(path, R_OK)) SKIP("no data/tokenizers/%s (scripts/get-tokenizers.sh fetches it)", model);
  char gguf[512], name[64];
  snprintf(name, sizeof name, "tok_%s.gguf", model);
  test_tmp_path(name, gguf, sizeof gguf);
  moe_tokenizer *a, *b;
  ASSERT_OK(moe_tokenizer_load(&a, dir));
  ASSERT_OK(tokenizer_gguf(dir, a, gguf));
  ASSERT_OK(moe_tokenizer_load(&b, gguf));
  int same = same_encoding(a, b, model);
  moe_tokenizer *c = NULL;
  if (same && export) {
    moe_status st = exported(gguf, model, &c);
    if (st != MOE_OK) fprintf(stderr, "  exported: %s\n", moe_last_error());
    same = st == MOE_OK && same_encoding(a, c, model);
  }
  moe_tokenizer_free(a);
  moe_tokenizer_free(b);
  moe_tokenizer_free(c);
  ASSERT(same);
}

TEST(gguf_tokenizer_encodes_as_tokenizer_json_qwen3) { check_model_tokenizer(failed_, "qwen3", 0); }
TEST(gguf_tokenizer_encodes_as_tokenizer_json_llama3) { check_model_tokenizer(failed_, "llama3", 0); }
TEST(gguf_tokenizer_encodes_as_tokenizer_json_deepseek_v3) { check_model_tokenizer(failed_, "deepseek_v3", 0); }
/* gpt-oss's o200k tokenizer: llama.cpp's gpt2 model with its "gpt-4o" pre-tokenizer. */
TEST(gguf_tokenizer_encodes_as_tokenizer_json_gptoss) {
  check_model_tokenizer(failed_, "gptoss", 0);
  char gguf[512];
  moe_gguf *g;
  const char *model, *pre;
  if (access(test_tmp_path("tok_gptoss.gguf", gguf, sizeof gguf), R_OK)) return; /* skipped or failed above */
  ASSERT_OK(moe_gguf_open(&g, gguf));
  ASSERT_OK(moe_gguf_get_str(g, "tokenizer.ggml.model", &model));
  ASSERT_OK(moe_gguf_get_str(g, "tokenizer.ggml.pre", &pre));
  ASSERT(!strcmp(model, "gpt2") && !strcmp(pre, "gpt-4o"));
  moe_gguf_close(g);
}
TEST(gguf_tokenizer_encodes_as_tokenizer_json_llama2) { check_model_tokenizer(failed_, "llama2", 1); }
TEST(gguf_tokenizer_encodes_as_tokenizer_json_llama3_1) { check_model_tokenizer(failed_, "llama3_1", 0); }
TEST(gguf_tokenizer_encodes_as_tokenizer_json_mistral) { check_model_tokenizer(failed_, "mistral", 1); }

/* A byte-level tokenizer trained here (GPT-2's pre-tokenizer), saved as tokenizer.json: its GGUF
 * form encodes the same, and bad tokenizer.ggml.pre / .model values are errors naming them. */
TEST(gguf_tokenizer_trained_round_trips_and_bad_pre_is_an_error_naming_it) {
  char dir[512], json[600], good[512], bad[512];
  test_tmp_path("tokdir", dir, sizeof dir);
  ASSERT_EQ_INT(mkdir(dir, 0755), 0);
  snprintf(json, sizeof json, "%s/tokenizer.json", dir);
  size_t n;
  char path[600];
  snprintf(path, sizeof path, "%s/tokenizer_sample.txt", test_fixture_dir());
  char *text = test_read_file(path, &n);
  ASSERT(text);
  moe_tokenizer *a, *b, *t;
  ASSERT_OK(moe_tokenizer_train(&a, text, n, 400));
  free(text);
  ASSERT_OK(moe_tokenizer_save(a, json));
  test_tmp_path("tok_good.gguf", good, sizeof good);
  test_tmp_path("tok_bad.gguf", bad, sizeof bad);
  ASSERT_OK(tokenizer_gguf(dir, NULL, good));
  moe_gguf *g;
  const char *pre;
  ASSERT_OK(moe_gguf_open(&g, good));
  ASSERT_OK(moe_gguf_get_str(g, "tokenizer.ggml.pre", &pre));
  ASSERT(!strcmp(pre, "gpt-2"));
  moe_gguf_close(g);
  ASSERT_OK(moe_tokenizer_load(&b, good));
  moe_tokenizer *c = NULL;
  int same = same_encoding(a, b, "trained") && exported(good, "tok_exported", &c) == MOE_OK && same_encoding(a, c, "exported");
  moe_tokenizer_free(a);
  moe_tokenizer_free(b);
  moe_tokenizer_free(c);
  ASSERT(same);
  ASSERT_OK(lm_gguf_rewrite(good, bad, NULL, NULL, "tokenizer.ggml.pre", "frobnicate"));
  ASSERT_STATUS(moe_tokenizer_load(&t, bad), MOE_ERR_FORMAT);
  ASSERT(lm_error_names("tokenizer.ggml.pre", "\"frobnicate\"", "tok_bad.gguf"));
  ASSERT_OK(lm_gguf_rewrite(good, bad, NULL, NULL, "tokenizer.ggml.model", "bert"));
  ASSERT_STATUS(moe_tokenizer_load(&t, bad), MOE_ERR_FORMAT);
  ASSERT(lm_error_names("tokenizer.ggml.model", "\"bert\"", NULL));
}

/* moe convert both ways, and moe generate of the GGUF file gives the checkpoint's greedy tokens. */
TEST(gguf_lm_convert_cli_and_generate_from_gguf) {
  char dir[512], gguf[512], back[512], args[1600], out1[512], out2[512], err[512];
  lm_case_dir("qwen3_moe", dir, sizeof dir);
  test_tmp_path("cli.gguf", gguf, sizeof gguf);
  test_tmp_path("cli_back", back, sizeof back);
  test_tmp_path("gen_hf.txt", out1, sizeof out1);
  test_tmp_path("gen_gguf.txt", out2, sizeof out2);
  snprintf(args, sizeof args, "convert %s %s --type q8_0", dir, gguf);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 0);
  snprintf(args, sizeof args, "convert %s %s", gguf, back);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 0);
  snprintf(args, sizeof args, "convert %s %s", dir, gguf);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 0);
  const char *gen = "generate --checkpoint %s --prompt-ids '5 9 1' --max-tokens 8 --temperature 0";
  snprintf(args, sizeof args, gen, dir);
  ASSERT_EQ_INT(run_moe(NULL, args, out1, err, sizeof err), 0);
  snprintf(args, sizeof args, gen, gguf);
  ASSERT_EQ_INT(run_moe(NULL, args, out2, err, sizeof err), 0);
  ASSERT(test_same_file(out1, out2));
  snprintf(args, sizeof args, "convert %s %s/x.gguf", gguf, back);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 1);
  ASSERT(strstr(err, "moe quantize"));
}

/* A checkpoint with a tokenizer (trained here) and a chat template, converted by moe convert: the GGUF
 * file carries both, and moe generate from a text prompt, the chat template's rendering and the EOS id
 * are those of the directory. */
TEST(gguf_lm_checkpoint_with_tokenizer_and_chat_template) {
  char dir[512], gguf[512], path[700], args[1600], out1[512], out2[512], err[512];
  test_tmp_path("ck", dir, sizeof dir);
  test_tmp_path("ck.gguf", gguf, sizeof gguf);
  test_tmp_path("gen_dir.txt", out1, sizeof out1);
  test_tmp_path("gen_file.txt", out2, sizeof out2);
  snprintf(path, sizeof path, "%s/tokenizer_sample.txt", test_fixture_dir());
  size_t n;
  char *text = test_read_file(path, &n);
  ASSERT(text);
  moe_tokenizer *t;
  ASSERT_OK(moe_tokenizer_train(&t, text, n, 300));
  free(text);
  moe_lm_config c;
  moe_lm_config_default(&c);
  c.vocab = moe_tokenizer_vocab_size(t), c.n_layers = 1, c.moe.D = 32, c.moe.H = 32, c.moe.E = 4, c.head_dim = 8;
  c.n_heads = 4, c.n_kv_heads = 2, c.max_seq = 64;
  moe_lm_t m;
  ASSERT_OK(moe_lm_init(&m, &c));
  moe_lm_init_params(&m, 11);
  ASSERT_OK(moe_lm_save(&m, dir));
  moe_lm_free(&m);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  ASSERT_OK(moe_tokenizer_save(t, path));
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  const char *cfg = "{\"eos_token\": \"<|endoftext|>\", \"chat_template\": \"{% for m in messages %}<{{ m.role }}>"
                    "{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}\"}";
  ASSERT_OK(moe_write_file_atomic(path, cfg, strlen(cfg)));
  snprintf(args, sizeof args, "convert %s %s", dir, gguf);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 0);
  moe_gguf *g;
  uint32_t eos;
  ASSERT_OK(moe_gguf_open(&g, gguf));
  ASSERT_OK(moe_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos));
  ASSERT_EQ_INT(eos, moe_tokenizer_token_id(t, MOE_TOKENIZER_EOT));
  moe_gguf_close(g);
  int32_t ends[MOE_LM_MAX_EOS];
  int n_ends;
  ASSERT_OK(moe_lm_eos_ids(gguf, NULL, c.vocab, ends, MOE_LM_MAX_EOS, &n_ends));
  ASSERT(n_ends == 1 && ends[0] == (int32_t)eos);
  moe_tokenizer_free(t);
  const char *conv = "[{\"role\": \"user\", \"content\": \"hello there\"}]";
  char *a = NULL, *b = NULL;
  size_t la, lb;
  ASSERT_OK(moe_chat_template_render_config(dir, conv, 1, -1, &a, &la));
  ASSERT_OK(moe_chat_template_render_config(gguf, conv, 1, -1, &b, &lb));
  int same = la == lb && !memcmp(a, b, la) && strstr(a, "<user>hello there<|endoftext|><assistant>");
  if (!same) fprintf(stderr, "  rendered: \"%s\" vs \"%s\"\n", a, b);
  free(a), free(b);
  ASSERT(same);
  /* back to a directory: the tokenizer and the template come along */
  char back[512], *r = NULL;
  size_t lr;
  test_tmp_path("ck_back", back, sizeof back);
  snprintf(args, sizeof args, "convert %s %s", gguf, back);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 0);
  ASSERT_OK(moe_chat_template_render_config(back, conv, 1, -1, &r, &lr));
  same = lr == la && strstr(r, "<user>hello there<|endoftext|><assistant>");
  free(r);
  ASSERT(same);
  const char *gen = "generate --checkpoint %s --prompt 'the cat sat on' --max-tokens 12 --temperature 0";
  snprintf(args, sizeof args, gen, dir);
  ASSERT_EQ_INT(run_moe(NULL, args, out1, err, sizeof err), 0);
  snprintf(args, sizeof args, gen, gguf);
  ASSERT_EQ_INT(run_moe(NULL, args, out2, err, sizeof err), 0);
  ASSERT(test_same_file(out1, out2));
  snprintf(args, sizeof args, gen, back);
  ASSERT_EQ_INT(run_moe(NULL, args, out2, err, sizeof err), 0);
  ASSERT(test_same_file(out1, out2));
  char words[256];
  ASSERT(test_read_text(out1, words, sizeof words) > 0);
}
