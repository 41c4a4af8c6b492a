/* A GGUF language model's weights outside the experts kept in their quantized type (DESIGN 4.8b):
 * attention q/k/v/o, a dense layer's MLP, the embedding and the head of Mixtral (untied) and
 * Qwen3-MoE (tied, a dense layer) files of each type with a dot kernel are computed from their bytes;
 * the logits stay within a stated distance of the same file widened to fp32 (moe.expert_type -1), are
 * the same bits for 1 and 2 threads, and near between a prefill and token-by-token decoding (every
 * quantized product is batch-invariant, but the fp32 attention is not bit for bit, and an ulp apart in
 * an activation can move its quantized block by a step: measured equal or within 3e-7 of the largest
 * logit, but 0.0053 for the Qwen3-MoE Q8_0 file; asserted within 0.02); llama's
 * permuted q and k rows are put back exactly (their bytes dequantize to the widened model's rows); such
 * a model refuses to be saved or trained. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_retype.h"
#include "lm/lm_gguf.h"
#include "test.h"

static const moe_gguf_type kTypes[] = {MOE_GGUF_Q8_0, MOE_GGUF_Q4_0, MOE_GGUF_MXFP4, MOE_GGUF_Q4_K,
                                       MOE_GGUF_Q5_K, MOE_GGUF_Q6_K, MOE_GGUF_BF16, MOE_GGUF_F16};
#define NTYPES 8
#define T_LEN 8

/* A tiny model of family fam (widths whole K-quant blocks) written as type t to path. */
static moe_status write_model(moe_lm_family fam, moe_gguf_type t, int dense_H, char *path, size_t n) {
  moe_lm_config c;
  moe_lm_config_default(&c);
  moe_lm_config_set_family(&c, fam);
  c.vocab = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 64, c.max_seq = 32;
  c.moe.D = 256, c.moe.H = 256, c.moe.E = 3, c.moe.top_k = 2;
  if (fam == MOE_LM_QWEN3_MOE) { /* layer 0 dense, the embedding tied to the head */
    c.dense_layers[0] = 1, c.dense_H = dense_H, c.tie_embeddings = 1;
  }
  moe_lm_t m;
  moe_status st = moe_lm_init(&m, &c);
  if (st != MOE_OK) return st;
  moe_lm_init_params(&m, 5);
  char name[64];
  snprintf(name, sizeof name, "qdense_%d_%d_%d.gguf", (int)fam, (int)t, dense_H);
  test_tmp_path(name, path, n);
  moe_lm_gguf_options o = {t, NULL, NULL};
  st = moe_lm_save_gguf(&m, path, &o);
  moe_lm_free(&m);
  return st;
}

/* The file as it is (q: its weights in their type) and widened (w: expert_type -1). */
static moe_status load_both(const char *path, moe_lm_t *q, moe_lm_t *w) {
  moe_lm_config c;
  moe_status st = moe_lm_load(q, path, NULL);
  if (st != MOE_OK) return st;
  st = moe_lm_read_config(path, &c);
  c.moe.expert_type = -1;
  if (st == MOE_OK) st = moe_lm_load(w, path, &c);
  if (st != MOE_OK) moe_lm_free(q);
  return st;
}

static void tokens(int32_t *t) {
  for (int i = 0; i < T_LEN; i++) t[i] = (int32_t)((i * 7 + 3) % 64);
}

/* The (T_LEN, V) logits of one sequence: a prefill, or (one_by_one) decoded a token at a time. */
static int seq_logits(moe_lm_t *m, int one_by_one, float *out) {
  int32_t t[T_LEN];
  tokens(t);
  int V = m->cfg.vocab;
  if (!one_by_one) {
    if (moe_lm_forward(m, t, NULL, 1, T_LEN, NULL) != MOE_OK) return 0;
    memcpy(out, moe_lm_logits(m), (size_t)T_LEN * V * 4);
    return 1;
  }
  moe_lm_cache *kv;
  if (moe_lm_cache_new(&kv, m, 1) != MOE_OK) return 0;
  int ok = 1;
  for (int i = 0; ok && i < T_LEN; i++) {
    ok = moe_lm_decode(m, kv, t + i, 1) == MOE_OK;
    if (ok) memcpy(out + (size_t)i * V, moe_lm_logits(m), (size_t)V * 4);
  }
  moe_lm_cache_free(kv);
  return ok;
}

/* How far q's logits are from the widened model w's (worst, relative to w's largest), a prefill from a
 * token-by-token decode (dworst, the same), and how many differ between 1 and 2 threads; 0 when a pass
 * fails. */
typedef struct {
  double worst, dworst;
  size_t differ_threads;
} logit_gaps;
static int measure(moe_lm_t *q, moe_lm_t *w, logit_gaps *g) {
  size_t n = (size_t)T_LEN * q->cfg.vocab;
  float *pre = malloc(n * 4), *dec = malloc(n * 4), *two = malloc(n * 4), *ref = malloc(n * 4);
  int ok = pre && dec && two && ref;
  moe_lm_set_threads(q, 1);
  ok = ok && seq_logits(q, 0, pre) && seq_logits(q, 1, dec);
  moe_lm_set_threads(q, 2);
  ok = ok && seq_logits(q, 0, two) && seq_logits(w, 0, ref);
  double scale = 0;
  memset(g, 0, sizeof *g);
  for (size_t i = 0; ok && i < n; i++) {
    g->worst = fmax(g->worst, fabs(pre[i] - ref[i]));
    g->dworst = fmax(g->dworst, fabs(pre[i] - dec[i]));
    scale = fmax(scale, fabs(ref[i]));
    g->differ_threads += memcmp(&pre[i], &two[i], 4) != 0;
  }
  g->worst /= scale, g->dworst /= scale;
  free(pre), free(dec), free(two), free(ref);
  return ok;
}

/* Tolerances on the largest logit error relative to the largest logit against the widened model
 * (the activations' 8-bit quantization before every quantized product): measured 0.009-0.02 over the
 * types and the two families; asserted with room. A misread row or a permutation left in place gives
 * errors of the logits' own size. */
TEST(lm_quant_dense_near_widened_and_the_same_bits_for_decode_and_threads) {
  const moe_lm_family fams[2] = {MOE_LM_MIXTRAL, MOE_LM_QWEN3_MOE};
  for (int f = 0; f < 2; f++)
    for (int k = 0; k < NTYPES; k++) {
      moe_gguf_type t = kTypes[k];
      char path[512];
      moe_lm_t q, w;
      ASSERT_OK(write_model(fams[f], t, 256, path, sizeof path));
      ASSERT_OK(load_both(path, &q, &w));
      const char *quantized[] = {"model.embed_tokens.weight", "model.layers.1.self_attn.q_proj.weight",
                                 "model.layers.1.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.weight",
                                 "model.layers.1.self_attn.o_proj.weight", "model.layers.0.self_attn.q_proj.weight",
                                 f ? "model.layers.0.mlp.down_proj.weight" : "lm_head.weight",
                                 f ? "model.layers.0.mlp.gate_proj.weight" : "model.layers.0.self_attn.o_proj.weight"};
      for (size_t i = 0; i < sizeof quantized / sizeof *quantized; i++) {
        if (moe_lm_param_type(&q, quantized[i]) != t) FAIL_("%s: %s is computed in %s", moe_gguf_type_name(t), quantized[i],
                                                           moe_gguf_type_name(moe_lm_param_type(&q, quantized[i])));
        ASSERT(moe_lm_param_type(&w, quantized[i]) == MOE_GGUF_F32);
      }
      ASSERT(moe_lm_param_type(&q, "model.norm.weight") == MOE_GGUF_F32);
      logit_gaps g;
      ASSERT(measure(&q, &w, &g));
      int half = t == MOE_GGUF_BF16 || t == MOE_GGUF_F16; /* fp32 activations: only the sums' order differs */
      double tol = half ? 1e-5 : 0.05;
      fprintf(stderr, "  %s %s: largest logit error against the widened model / largest logit %.2g (tolerance %.2g)\n",
              moe_lm_family_name(fams[f]), moe_gguf_type_name(t), g.worst, tol);
      fprintf(stderr, "  %s %s: prefill against decode / largest logit %.2g (tolerance 0.02)\n",
              moe_lm_family_name(fams[f]), moe_gguf_type_name(t), g.dworst);
      if (g.differ_threads || g.dworst > 0.02)
        FAIL_("%s %s: %zu logits differ between 1 and 2 threads; prefill and decode %g apart", moe_lm_family_name(fams[f]),
              moe_gguf_type_name(t), g.differ_threads, g.dworst);
      ASSERT((g.worst > 0 || half) && g.worst < tol); /* quantized activations always move some logit */
      moe_lm_free(&q);
      moe_lm_free(&w);
    }
}

/* llama.cpp's converter permutes Mixtral's q and k rows per head; the quantized model puts whole rows
 * back. Each bound row, dequantized, is the widened model's row (which the loader put back in fp32)
 * bit for bit, for q, k (permuted), v and o (not). */
TEST(lm_quant_dense_permuted_rows_put_back_exactly) {
  for (int k = 0; k < NTYPES; k++) {
    char path[512];
    moe_lm_t q, w;
    ASSERT_OK(write_model(MOE_LM_MIXTRAL, kTypes[k], 256, path, sizeof path));
    ASSERT_OK(load_both(path, &q, &w));
    const char *names[4] = {"model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
                            "model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight"};
    for (int j = 0; j < 4; j++) {
      const moe__qmat *b = moe__lm_quant_weight(&q, names[j]);
      const moe_tensor_ref *r = moe_lm_find(&w, names[j]);
      ASSERT(b && r && b->type == kTypes[k] && b->rows == r->shape[0] && b->cols == r->shape[1]);
      float *row = malloc((size_t)b->cols * 4);
      ASSERT(row);
      size_t rb = moe__qrow_bytes(b->type, b->cols), bad = 0;
      for (int i = 0; i < b->rows; i++) {
        ASSERT_OK(moe_gguf_dequantize(b->type, b->w + (size_t)i * rb, row, b->cols));
        bad += memcmp(row, r->data + (size_t)i * b->cols, (size_t)b->cols * 4) != 0;
      }
      free(row);
      if (bad) FAIL_("%s %s: %zu rows are not the widened model's", moe_gguf_type_name(kTypes[k]), names[j], bad);
    }
    moe_lm_free(&q);
    moe_lm_free(&w);
  }
}

/* Saving or training the quantized model is an error naming why; the widened one does both. */
TEST(lm_quant_dense_is_inference_only) {
  char path[512], dir[512], out[512];
  moe_lm_t q, w;
  ASSERT_OK(write_model(MOE_LM_MIXTRAL, MOE_GGUF_Q8_0, 256, path, sizeof path));
  ASSERT_OK(load_both(path, &q, &w));
  test_tmp_path("qdense_save", dir, sizeof dir);
  test_tmp_path("qdense_save.gguf", out, sizeof out);
  int32_t t[T_LEN], y[T_LEN];
  tokens(t);
  for (int i = 0; i < T_LEN; i++) y[i] = t[(i + 1) % T_LEN];
  ASSERT_STATUS(moe_lm_save(&q, dir), MOE_ERR_ARG);
  ASSERT_STATUS(moe_lm_save_gguf(&q, out, NULL), MOE_ERR_ARG);
  ASSERT_OK(moe_lm_forward(&q, t, y, 1, T_LEN, NULL)); /* evaluating a loss is inference */
  ASSERT_STATUS(moe_lm_backward(&q), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "inference only") && strstr(moe_last_error(), "expert_type -1"));
  ASSERT_OK(moe_lm_forward(&w, t, y, 1, T_LEN, NULL));
  ASSERT_OK(moe_lm_backward(&w));
  ASSERT_OK(moe_lm_save_gguf(&w, out, NULL));
  moe_lm_free(&q);
  moe_lm_free(&w);
}

/* A dense layer whose down projection has no kernel (stored F32) keeps its whole MLP in fp32, the
 * attention still quantized; the logits stay near the widened model's. Before, the same layer with the
 * down projection as the writer leaves it (dense_H 40, not whole Q4_K blocks: F16) keeps all three in
 * their types. */
TEST(lm_quant_dense_mlp_all_or_none) {
  char path[512];
  moe_lm_t q, w;
  ASSERT_OK(write_model(MOE_LM_QWEN3_MOE, MOE_GGUF_Q4_K, 40, path, sizeof path));
  ASSERT_OK(moe_lm_load(&q, path, NULL));
  ASSERT(moe_lm_param_type(&q, "model.layers.0.mlp.gate_proj.weight") == MOE_GGUF_Q4_K);
  ASSERT(moe_lm_param_type(&q, "model.layers.0.mlp.down_proj.weight") == MOE_GGUF_F16);
  moe_lm_free(&q);
  ASSERT_OK(gguf_retype(path, "blk.0.ffn_down.weight", MOE_GGUF_F32));
  ASSERT_OK(load_both(path, &q, &w));
  ASSERT(moe_lm_param_type(&q, "model.layers.0.mlp.gate_proj.weight") == MOE_GGUF_F32);
  ASSERT(moe_lm_param_type(&q, "model.layers.0.mlp.down_proj.weight") == MOE_GGUF_F32);
  ASSERT(moe_lm_param_type(&q, "model.layers.0.self_attn.o_proj.weight") == MOE_GGUF_Q4_K);
  size_t n = (size_t)T_LEN * q.cfg.vocab;
  float *a = malloc(n * 4), *b = malloc(n * 4);
  ASSERT(a && b && seq_logits(&q, 0, a) && seq_logits(&w, 0, b));
  double worst = 0, scale = 0;
  for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(a[i] - b[i])), scale = fmax(scale, fabs(b[i]));
  ASSERT(worst > 0 && worst < 0.05 * scale);
  free(a), free(b);
  moe_lm_free(&q);
  moe_lm_free(&w);
}

/* Experts of mixed types, as llama.cpp's _M files store them (Q4_K gates with Q6_K down projections in
 * some layers), stay in their types: each projection of each layer in its own (fc3 in a type whose
 * activations differ from fc1's, BF16 beside Q4_K), the logits near the widened model's, the same bits
 * for 1 and 2 threads, prefill and decode near. */
TEST(lm_quant_mixed_expert_types_stay) {
  char path[512];
  moe_lm_t q, w;
  ASSERT_OK(write_model(MOE_LM_MIXTRAL, MOE_GGUF_Q4_K, 256, path, sizeof path));
  ASSERT_OK(gguf_retype(path, "blk.0.ffn_down_exps.weight", MOE_GGUF_Q6_K));
  ASSERT_OK(gguf_retype(path, "blk.1.ffn_up_exps.weight", MOE_GGUF_Q8_0));
  ASSERT_OK(gguf_retype(path, "blk.1.ffn_down_exps.weight", MOE_GGUF_BF16));
  ASSERT_OK(load_both(path, &q, &w));
  const moe_gguf_type want[2][3] = {{MOE_GGUF_Q4_K, MOE_GGUF_Q6_K, MOE_GGUF_Q4_K}, {MOE_GGUF_Q4_K, MOE_GGUF_BF16, MOE_GGUF_Q8_0}};
  for (int i = 0; i < 2; i++)
    for (int fc = 1; fc <= 3; fc++) {
      if (moe_layer_expert_type(&q.layers[i], fc) != want[i][fc - 1])
        FAIL_("layer %d fc%d: %s, want %s", i, fc, moe_gguf_type_name(moe_layer_expert_type(&q.layers[i], fc)),
              moe_gguf_type_name(want[i][fc - 1]));
      ASSERT(moe_layer_expert_type(&w.layers[i], fc) == MOE_GGUF_F32);
    }
  logit_gaps g;
  ASSERT(measure(&q, &w, &g));
  fprintf(stderr, "  mixed types: against the widened model %.2g, prefill against decode %.2g (of the largest logit), "
          "%zu logits differ between 1 and 2 threads\n", g.worst, g.dworst, g.differ_threads);
  ASSERT(g.worst > 0 && g.worst < 0.05 && g.dworst < 0.02 && g.differ_threads == 0);
  moe_lm_free(&q);
  moe_lm_free(&w);
}
