/* The Mixtral-architecture language model and its relatives (moe.h, DESIGN 4.9): parameter table
 * under the family's Hugging Face names, forward keeping every layer's activations in one arena,
 * backward walking the layers in reverse. q, k and v come from one GEMM with the three projections,
 * which lie one after the other (their biases too); the families' q/k norms and clamp follow it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "dist/dist.h"
#include "kernels/gemm.h"
#include "kernels/act.h"
#include "kernels/mlp.h"
#include "kernels/quant_matmul.h"
#include "internal.h"
#include "kernels.h"
#include "lm_dist.h"
#include "lm_family.h"
#include "lm_gguf.h"
#include "lm_map.h"
#include "base/file_map.h"
#include "lm_stream.h"
#include "mla.h"

typedef struct {
  float *ln1, *wqkv, *wo, *ln2; /* wqkv: q_proj, k_proj, v_proj stacked (qd + 2 kvd, D) */
  float *bqkv;                  /* qkv_bias: their biases stacked (qd + 2 kvd), or NULL */
  float *qn, *kn;               /* qk_norm: q_norm and k_norm weights, or NULL */
  float *bo, *sinks;            /* o_bias: o_proj's bias (D); attn_sinks: the sinks (n_heads); or NULL */
  moe__mlp mlp;                 /* a dense layer's gate_proj (w1), up_proj (w3), down_proj (w2) */
  moe__mla_w mla;               /* the latent attention's (mla.kv_lora_rank > 0: wqkv unused) */
  /* weights kept in a quantized GGUF type (bound with moe__lm_bind_quant; .w NULL: the fp32 ones):
   * q_proj, k_proj and v_proj (all three or none), o_proj, a dense layer's gate, up and down */
  moe__qmat qkv[3], o, mlp1, mlp3, mlp2;
  void *own[3];                 /* bytes of those the model owns (permuted rows), freed with it */
} lm_block;

typedef struct { /* one layer's activations */
  float *res;          /* (N, D) the layer's input */
  float *xn1, *rstd1;  /* (N, D), (N) */
  float *qkv;          /* (N, qd + 2 kvd), q and k rotated */
  float *raw, *pre;    /* with qk_norm or clip_qkv: (N, qkv) the projections before the norms, and
                          with both the normed ones before the clamp (the clamp's mask) */
  float *rstdq;        /* qk_norm: (N, q rows + k rows) the norms' rstd */
  float *att, *lse;    /* (N, qd), (B, nh, T) */
  float *mid;          /* (N, D) after attention */
  float *xn2, *rstd2;  /* (N, D), (N) */
  float *probs;        /* (N, E) router probabilities for the balance loss */
  moe__mlp_acts mlp;   /* a dense layer's */
  moe__mla_acts mla;   /* the latent attention's (qkv and the q/k norms' unused) */
} lm_acts;

struct moe__lm_state {
  moe__arena arena;
  int B, T, N, nt, count, have_fwd; /* a ragged decode's rows have their own token counts: T the most */
  int *row0;            /* (B + 1) where each batch row's tokens start among the N (b T when not ragged) */
  lm_block *w, *g;      /* (L) parameters and their gradients */
  float *embed, *normf, *head, *gembed, *gnormf, *ghead;
  float *cos_t, *sin_t; /* (rope_n, head_dim / 2): grown with the positions used, up to max_seq */
  int rope_n;
  lm_acts *a;           /* (L + 1): a[L].res is the last layer's output */
  float *xnf, *rstdf, *logits, *lse; /* (N, D), (N), (N, V), (N) */
  int32_t *tokens, *targets;         /* (N) copies */
  float *dres, *dxn, *datt, *dqkv, *draw, *gl, *scratch; /* backward: (N, D) x2, (N, qd), (N, qkv) x2, (N, E) */
  double *bal;          /* (2 E + 3) the balance loss's sums; expert-parallel, the cross-entropy's sum,
                           count and tokens to add up over the ranks */
  size_t dense_n;       /* floats in m->dense */
  size_t mapped_bytes;  /* of the parameters, pages of the checkpoint (lm_map.h) */
  int dense_mappable;   /* m->dense is a moe__map_alloc buffer (file pages may be in it), at dense_phase */
  size_t dense_phase;
  moe__lbl lbl;
  moe_layer_stats *lstats; /* (L) each MoE layer's stats of the last forward */
  moe_lm_times times;      /* forwards (not decodes) and backwards since the last moe_lm_times_reset */
  double lap_moe, lap_router; /* this pass's MoE layers and balance loss */
  moe__mla_work mlaw;         /* the latent attention's backward buffers */
  int decoding;               /* this pass is a cached decode (the latent attention carves other buffers) */
  moe_gguf *mapped;           /* the file the layers' quantized experts are bound into (lm_gguf.c) */
  moe__qmat qembed, qhead;    /* the embedding and the head in a quantized type (.w NULL: fp32) */
  moe_gguf_type *ref_type;    /* (nrefs) the type each ref is computed in: F32, or the bound one */
  int quant;                  /* weights bound in a quantized type: inference only */
  void *qscratch;             /* the quantized activations of a pass (moe__qmatmul) */
  moe__lm_layer_hook hook;    /* streamed experts' prefetch (lm_stream.h), or NULL */
  void *hook_ctx;
};

struct moe_lm_cache {
  int L, B, max_seq, kvd, len;
  int latent;     /* the model's attention is latent (mla.h): one row of kvd floats per position in k */
  float **k, **v; /* (L, B): layer l's rotated keys and values of slot b, (cap[b], kvd) each; with latent
                     attention k holds the latent rows (mla.h) and v is unused (NULL) */
  int *cap;       /* (B) the positions each slot's buffers hold: grown as its sequence reaches them */
  int *slot_len;  /* (B) each slot's length, for moe_lm_decode_slots */
  const int *row_slot; /* during a decode: the slot of each batch row (NULL: row b is slot b at len) */
  int32_t *counts;     /* (L, E) tokens per expert in the last decode, for traces */
  int last_only;       /* decodes give the logits of each row's last position only (a prompt's next token) */
};

/* Where batch row b of a decode sits in the cache: its slot and the position of its first token. */
static int row_slot(const moe_lm_cache *kv, int b) { return kv->row_slot ? kv->row_slot[b] : b; }
static int row_pos(const moe_lm_cache *kv, int b) { return kv->row_slot ? kv->slot_len[kv->row_slot[b]] : kv->len; }

void moe_lm_config_default(moe_lm_config *c) {
  memset(c, 0, sizeof *c);
  moe_layer_config_default(&c->moe);
  c->vocab = 4096;
  c->n_layers = 4;
  c->n_heads = 8;
  c->n_kv_heads = 4;
  c->head_dim = 32;
  c->max_seq = 256;
  c->rope_theta = 1e6f;
  c->rms_eps = 1e-5f;
  c->aux_coef = 0.001f;
  c->moe.D = 256;
  c->moe.H = 512;
  c->moe.E = 8;
  c->moe.top_k = 2;
  c->moe.capacity_setting = 0;
  c->moe.normalize_topk = 1;
  c->moe.act = MOE_ACT_SWIGLU;
  c->moe.gate_bias = 0;
  c->moe.expert_bias = 0;
}

/* DeepSeek's structure at c's sizes, in the proportions of its releases (V2-Lite's for V2, V3's for V3):
 * each head's key and value head_dim wide (qk_nope_dim, v_head_dim) beside a rotary part half as wide
 * (head_dim becomes qk_rope_head_dim), a kv latent of D / 4 (at least the head's width), q through a
 * latent of D / 2 for V3 and directly for V2; a dense first layer (when there are more) as wide as the
 * active experts; shared experts as wide as two (V2) or one (V3) routed expert; V2 routes by softmax
 * without renormalizing, V3 by sigmoid with the selection bias, renormalized and scaled by 2.5, in 4
 * groups of which 2 are kept when E allows (8 experts or more); DeepSeek's interleaved rotary pairs; no
 * model-wide balance loss (V3 balances through the selection bias, moe_lm_balance_bias). */
static void set_deepseek(moe_lm_config *c, int v3) {
  moe_layer_config *l = &c->moe;
  int hd = c->head_dim;
  c->n_kv_heads = c->n_heads;
  c->mla = (moe_lm_mla){.kv_lora_rank = l->D / 4 > hd ? l->D / 4 : hd, .q_lora_rank = v3 ? l->D / 2 : 0,
                        .qk_nope_dim = hd, .v_head_dim = hd, .rope_interleave = 1};
  c->head_dim = hd / 2 > 2 ? hd / 2 & ~1 : 2;
  c->aux_coef = 0;
  if (c->n_layers > 1) c->dense_layers[0] |= 1, c->dense_H = c->dense_H ? c->dense_H : l->top_k * l->H;
  l->shared_H = l->shared_H ? l->shared_H : (v3 ? 1 : 2) * l->H;
  l->score = v3 ? MOE_SCORE_SIGMOID : MOE_SCORE_SOFTMAX;
  l->select_bias = v3;
  l->normalize_topk = v3;
  l->routed_scale = v3 ? 2.5f : 1.0f;
  int groups = v3 && l->E % 4 == 0 && l->E >= 8 && l->top_k <= l->E / 2; /* TOP2_SUM: 2 experts a group or more */
  l->n_group = groups ? 4 : 0, l->topk_group = groups ? 2 : 0;
  l->group_score = MOE_GROUP_TOP2_SUM;
}

void moe_lm_config_set_family(moe_lm_config *c, moe_lm_family f) {
  moe_layer_config *l = &c->moe;
  int oss = f == MOE_LM_GPT_OSS;
  c->family = f;
  c->qkv_bias = f == MOE_LM_QWEN2_MOE || oss;
  c->o_bias = c->attn_sinks = oss;
  c->qk_norm = f == MOE_LM_QWEN3_MOE ? MOE_QK_NORM_HEAD : f == MOE_LM_OLMOE ? MOE_QK_NORM_FULL : MOE_QK_NORM_NONE;
  l->shared_gate = f == MOE_LM_QWEN2_MOE;
  l->shared_H = !l->shared_gate ? 0 : l->shared_H ? l->shared_H : l->H;
  l->act = oss ? MOE_ACT_SWIGLU_OAI : MOE_ACT_SWIGLU;
  l->gate_bias = l->expert_bias = oss;
  if (f == MOE_LM_OLMOE) l->normalize_topk = 0;
  if (oss) l->normalize_topk = 1, c->aux_coef = 0;
  if (f == MOE_LM_DEEPSEEK_V2 || f == MOE_LM_DEEPSEEK_V3) set_deepseek(c, f == MOE_LM_DEEPSEEK_V3);
}

int moe_lm_layer_dense(const moe_lm_config *c, int i) {
  return i >= 0 && i < MOE_LM_MAX_LAYERS && (c->dense_layers[i / 8] >> (i % 8) & 1);
}

/* Whether layer i of m is a MoE layer (has a moe_layer_t). */
static int is_moe(const moe_lm_t *m, int i) { return !moe_lm_layer_dense(&m->cfg, i); }

static int is_deepseek(moe_lm_family f) { return f == MOE_LM_DEEPSEEK_V2 || f == MOE_LM_DEEPSEEK_V3; }

/* Whether the model's attention is the latent one (the DeepSeek families'). */
static int is_mla(const moe_lm_config *c) { return c->mla.kv_lora_rank > 0; }

/* The width of the attention output that o_proj reads. */
static int att_dim(const moe_lm_config *c) { return is_mla(c) ? moe__mla_out_dim(c) : c->n_heads * c->head_dim; }

/* The latent attention's sizes: the DeepSeek families have it and nothing of the others' attention. */
static moe_status check_mla(const moe_lm_config *c, const char *fam) {
  const moe_lm_mla *a = &c->mla;
  int ds = is_deepseek(c->family);
  MOE_TRY(ds == (a->kv_lora_rank > 0) && a->kv_lora_rank >= 0, MOE_ERR_ARG,
          "lm config: latent attention (mla.kv_lora_rank > 0) is the DeepSeek families', got %d for %s",
          a->kv_lora_rank, fam);
  if (!ds) return MOE_OK;
  MOE_TRY(a->q_lora_rank >= 0 && a->qk_nope_dim > 0 && a->v_head_dim > 0 &&
              a->v_head_dim <= a->qk_nope_dim + c->head_dim && (a->rope_interleave == 0 || a->rope_interleave == 1),
          MOE_ERR_ARG,
          "lm config: mla wants q_lora_rank >= 0, qk_nope_dim > 0, 0 < v_head_dim <= qk_nope_dim + head_dim and "
          "rope_interleave 0 or 1, got %d, %d, %d (head_dim %d), %d",
          a->q_lora_rank, a->qk_nope_dim, a->v_head_dim, c->head_dim, a->rope_interleave);
  MOE_TRY(c->n_kv_heads == c->n_heads, MOE_ERR_ARG, "lm config: %s's n_kv_heads is n_heads (%d), got %d", fam,
          c->n_heads, c->n_kv_heads);
  int64_t nh = c->n_heads, dqk = (int64_t)a->qk_nope_dim + c->head_dim, lat = (int64_t)a->kv_lora_rank + c->head_dim;
  MOE_TRY(nh * 3 * dqk <= INT32_MAX && nh * (dqk + lat) <= INT32_MAX && nh * (a->qk_nope_dim + a->v_head_dim) <= INT32_MAX,
          MOE_ERR_ARG, "lm config: %s's heads x head sizes must fit an int", fam);
  MOE_TRY(c->aux_coef == 0, MOE_ERR_ARG, "lm config: %s has no model-wide balance loss (aux_coef 0), got %g", fam,
          (double)c->aux_coef);
  return MOE_OK;
}

/* YaRN off (factor 0) or a factor >= 1 with its fields in range. */
static moe_status check_yarn(const moe_lm_yarn *y) {
  if (y->factor == 0) return MOE_OK;
  MOE_TRY(y->factor >= 1 && isfinite(y->factor) && y->original_max_pos > 0 && y->beta_fast > 0 &&
              isfinite(y->beta_fast) && y->beta_slow > 0 && isfinite(y->beta_slow) && isfinite(y->mscale) &&
              isfinite(y->mscale_all_dim) && (y->truncate == 0 || y->truncate == 1),
          MOE_ERR_ARG,
          "lm config: yarn wants factor >= 1, original_max_pos > 0, betas > 0, finite mscales and truncate 0 or 1, "
          "got factor %g, original_max_pos %d, beta_fast %g, beta_slow %g, mscale %g, mscale_all_dim %g, truncate %d",
          (double)y->factor, y->original_max_pos, (double)y->beta_fast, (double)y->beta_slow, (double)y->mscale,
          (double)y->mscale_all_dim, y->truncate);
  return MOE_OK;
}

/* What the family's config.json can say: its attention options and layer kinds (so that a model saved
 * in its family's layout reads back as itself). */
static moe_status check_family(const moe_lm_config *c) {
  const char *fam = moe_lm_family_name(c->family);
  MOE_TRY(fam, MOE_ERR_ARG,
          "lm config: family %d is not one of mixtral, qwen2_moe, qwen3_moe, olmoe, gpt_oss, deepseek_v2, deepseek_v3",
          (int)c->family);
  MOE_CHECK(check_mla(c, fam));
  MOE_CHECK(check_yarn(&c->yarn));
  int ds = is_deepseek(c->family);
  int dense = 0;
  for (int i = 0; i < c->n_layers; i++) dense |= moe_lm_layer_dense(c, i);
  moe_lm_qk_norm qk = c->family == MOE_LM_QWEN3_MOE ? MOE_QK_NORM_HEAD
                      : c->family == MOE_LM_OLMOE   ? MOE_QK_NORM_FULL
                                                    : MOE_QK_NORM_NONE;
  MOE_TRY(c->qk_norm == qk, MOE_ERR_ARG, "lm config: %s's q/k norm is %d, got %d", fam, (int)qk, (int)c->qk_norm);
  int oss = c->family == MOE_LM_GPT_OSS;
  MOE_TRY(!c->qkv_bias || c->family == MOE_LM_QWEN2_MOE || oss, MOE_ERR_ARG,
          "lm config: q/k/v biases are Qwen2-MoE's and gpt-oss's, not %s's", fam);
  MOE_TRY(!c->o_bias || (oss && c->qkv_bias), MOE_ERR_ARG,
          "lm config: an o_proj bias is gpt-oss's (with qkv_bias), not %s's", fam);
  MOE_TRY(!c->attn_sinks == !oss, MOE_ERR_ARG, "lm config: attention sinks are gpt-oss's and all it has, got %d for %s",
          c->attn_sinks, fam);
  int full = 0;
  for (int i = 0; i < c->n_layers; i++) full |= c->full_layers[i / 8] >> (i % 8) & 1;
  MOE_TRY(!full || (oss && c->sliding_window), MOE_ERR_ARG,
          "lm config: full-attention layers between sliding-window ones are gpt-oss's (with sliding_window), not %s's",
          fam);
  MOE_TRY(!oss || (c->moe.act == MOE_ACT_SWIGLU_OAI && c->moe.gate_bias && c->moe.expert_bias &&
                   c->moe.normalize_topk == 1),
          MOE_ERR_ARG, "lm config: gpt-oss's feed-forward is the clamped SwiGLU (swiglu_oai) with router and expert "
                       "biases and normalize_topk 1");
  MOE_TRY(c->clip_qkv == 0 || c->family == MOE_LM_OLMOE, MOE_ERR_ARG, "lm config: clip_qkv is OLMoE's, not %s's", fam);
  MOE_TRY(c->clip_qkv >= 0 && isfinite(c->clip_qkv), MOE_ERR_ARG, "lm config: clip_qkv must be >= 0, got %g",
          (double)c->clip_qkv);
  MOE_TRY(!dense || c->family == MOE_LM_QWEN2_MOE || c->family == MOE_LM_QWEN3_MOE || ds, MOE_ERR_ARG,
          "lm config: dense layers are Qwen2-MoE's, Qwen3-MoE's and DeepSeek's, not %s's", fam);
  MOE_TRY(!dense || c->dense_H > 0, MOE_ERR_ARG, "lm config: dense layers need dense_H > 0, got %d", c->dense_H);
  MOE_TRY(c->dense_H >= 0, MOE_ERR_ARG, "lm config: dense_H must be >= 0, got %d", c->dense_H);
  MOE_TRY(!c->moe.shared_H || c->family == MOE_LM_QWEN2_MOE || ds, MOE_ERR_ARG,
          "lm config: the shared expert is Qwen2-MoE's and DeepSeek's, not %s's", fam);
  MOE_TRY(!ds || !c->moe.shared_gate, MOE_ERR_ARG, "lm config: %s's shared experts have no gate", fam);
  MOE_TRY(!ds || c->moe.shared_H % c->moe.H == 0, MOE_ERR_ARG,
          "lm config: %s's shared experts are n_shared_experts x moe.H wide, got shared_H %d for H %d", fam,
          c->moe.shared_H, c->moe.H);
  int first_k, freq;
  MOE_TRY(!ds || moe__lm_deepseek_layers(c, &first_k, &freq), MOE_ERR_ARG,
          "lm config: %s's dense layers must be the first first_k_dense_replace and those off moe_layer_freq", fam);
  MOE_TRY(c->family != MOE_LM_QWEN2_MOE || (c->moe.shared_H > 0 && c->moe.shared_gate), MOE_ERR_ARG,
          "lm config: Qwen2-MoE has a gated shared expert (moe.shared_H > 0, moe.shared_gate 1)");
  MOE_TRY((c->family != MOE_LM_OLMOE && c->family != MOE_LM_QWEN2_MOE) || c->head_dim * c->n_heads == c->moe.D,
          MOE_ERR_ARG, "lm config: %s's head_dim is hidden_size / num_attention_heads, got %d x %d heads for %d", fam,
          c->head_dim, c->n_heads, c->moe.D);
  MOE_TRY(c->family == MOE_LM_MIXTRAL || oss || !c->sliding_window, MOE_ERR_ARG,
          "lm config: a sliding window is Mixtral's and gpt-oss's, not %s's", fam);
  return MOE_OK;
}

static moe_status check_config(const moe_lm_config *c) {
  const moe_layer_config *l = &c->moe;
  MOE_TRY(c->vocab > 0 && l->D > 0 && l->H > 0 && l->E > 0, MOE_ERR_ARG,
          "lm config: vocab, D, H and E must be > 0 (got %d, %d, %d, %d)", c->vocab, l->D, l->H, l->E);
  MOE_TRY(c->n_layers >= 1 && c->n_layers <= 1024, MOE_ERR_ARG, "lm config: n_layers must be in [1, 1024], got %d",
          c->n_layers);
  MOE_TRY(l->E <= 65536, MOE_ERR_ARG, "lm config: E must be <= 65536, got %d", l->E);
  MOE_TRY(c->n_heads > 0 && c->n_kv_heads > 0 && c->n_heads % c->n_kv_heads == 0, MOE_ERR_ARG,
          "lm config: n_heads (%d) must be a positive multiple of n_kv_heads (%d)", c->n_heads, c->n_kv_heads);
  MOE_TRY(c->head_dim > 0 && c->head_dim % 2 == 0, MOE_ERR_ARG, "lm config: head_dim must be even and > 0, got %d",
          c->head_dim);
  MOE_TRY(c->max_seq > 0, MOE_ERR_ARG, "lm config: max_seq must be > 0, got %d", c->max_seq);
  MOE_TRY(c->sliding_window >= 0, MOE_ERR_ARG, "lm config: sliding_window must be >= 0, got %d", c->sliding_window);
  MOE_TRY(((int64_t)c->n_heads + 2 * (int64_t)c->n_kv_heads) * c->head_dim <= INT32_MAX, MOE_ERR_ARG,
          "lm config: (n_heads + 2 n_kv_heads) x head_dim must fit an int, got (%d + 2 x %d) x %d", c->n_heads,
          c->n_kv_heads, c->head_dim);
  MOE_TRY(c->rope_theta > 0 && isfinite(c->rope_theta), MOE_ERR_ARG, "lm config: rope_theta must be > 0, got %g",
          (double)c->rope_theta);
  MOE_TRY(c->rms_eps > 0 && isfinite(c->rms_eps), MOE_ERR_ARG, "lm config: rms_eps must be > 0, got %g",
          (double)c->rms_eps);
  MOE_TRY(c->aux_coef >= 0 && isfinite(c->aux_coef), MOE_ERR_ARG, "lm config: aux_coef must be >= 0, got %g",
          (double)c->aux_coef);
  int oss = c->family == MOE_LM_GPT_OSS; /* its clamped SwiGLU and biases: check_family */
  MOE_TRY((oss || (l->act == MOE_ACT_SWIGLU && !l->gate_bias && !l->expert_bias)) && l->router == MOE_ROUTER_LINEAR &&
              !l->inner_experts,
          MOE_ERR_ARG, "lm config: the feed-forward must be Mixtral's: swiglu experts, linear router, no biases, "
                       "no hierarchical experts");
  MOE_TRY(is_deepseek(c->family) ||
              (l->score == MOE_SCORE_SOFTMAX && !l->select_bias && !l->n_group && l->routed_scale == 1.0f),
          MOE_ERR_ARG, "lm config: sigmoid scores, a selection bias, groups and a routed scale are DeepSeek's, not %s's",
          moe_lm_family_name(c->family) ? moe_lm_family_name(c->family) : "?");
  return check_family(c);
}

static void add_ref(moe_lm_t *m, const char *name, int ndim, int64_t a, int64_t b, float *data, float *grad) {
  moe_tensor_ref *r = &m->refs[m->nrefs++];
  size_t len = strlen(name); /* < 64: check_config bounds the layer and expert numbers */
  memcpy(r->name, name, len < sizeof r->name ? len + 1 : sizeof r->name);
  r->name[sizeof r->name - 1] = 0;
  r->ndim = ndim;
  r->shape[0] = a;
  r->shape[1] = ndim > 1 ? b : 0;
  r->shape[2] = 0;
  r->numel = (size_t)a * (ndim > 1 ? (size_t)b : 1);
  r->data = data;
  r->grad = grad;
  m->numel += r->numel;
}

/* A 3-D ref (a, b, c): gpt-oss's experts as the layer holds them. */
static void add_ref3(moe_lm_t *m, const char *name, int64_t a, int64_t b, int64_t c, float *data, float *grad) {
  add_ref(m, name, 2, a, b * c, data, grad);
  moe_tensor_ref *r = &m->refs[m->nrefs - 1];
  r->ndim = 3, r->shape[1] = b, r->shape[2] = c;
}

/* gpt-oss's MoE refs after the router's weight: its bias, then the experts in the layer's layout under
 * the layer's names (lm_gptoss.h converts them from and to the checkpoint's fused tensors), and
 * down_proj_bias, which is the layer's experts.fc2.bias as it is; no expert refs for external experts. */
static void add_oss_refs(moe_lm_t *m, int i) {
  moe_layer_t *l = &m->layers[i];
  char nm[128];
  snprintf(nm, sizeof nm, "model.layers.%d.mlp.router.bias", i);
  add_ref(m, nm, 1, m->cfg.moe.E, 0, moe_layer_param(l, "gate.bias"), moe_layer_grad(l, "gate.bias"));
  static const char *const ours[] = {"experts.fc1.weight", "experts.fc1.bias", "experts.fc3.weight",
                                     "experts.fc3.bias", "experts.fc2.weight", "experts.fc2.bias"};
  for (int j = 0; j < 6; j++) {
    const moe_param_info *p = moe_layer_param_find(l, ours[j]);
    if (!p) continue; /* external experts: in the checkpoint's file, not parameters */
    if (j == 5) snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.down_proj_bias", i);
    else snprintf(nm, sizeof nm, "model.layers.%d.mlp.%s", i, ours[j]);
    float *d = moe_layer_param(l, ours[j]), *g = moe_layer_grad(l, ours[j]);
    if (p->ndim == 3) add_ref3(m, nm, p->shape[0], p->shape[1], p->shape[2], d, g);
    else add_ref(m, nm, 2, p->shape[0], p->shape[1], d, g);
  }
}

/* The dense parameters in HF order, carved from m->dense (and the same offsets of dense_grad). */
static void add_dense(moe_lm_t *m, size_t *off, const char *name, int ndim, int64_t a, int64_t b, float **p,
                      float **g) {
  *p = m->dense + *off;
  *g = m->dense_grad + *off;
  add_ref(m, name, ndim, a, b, *p, *g);
  *off += m->refs[m->nrefs - 1].numel;
}

/* The refs of layer i's MoE feed-forward: the router, this rank's experts (El from e0, Hl rows of H
 * each: all E, a shard of H each, when sharded) as slices of the layer's stacked tensors, and a
 * shared expert's tensors. */
static void add_moe_refs(moe_lm_t *m, int i) {
  const moe_lm_config *c = &m->cfg;
  const moe__lm_family_info *f = moe__lm_family(c->family);
  moe_layer_t *l = &m->layers[i];
  int64_t D = c->moe.D;
  char nm[128];
  snprintf(nm, sizeof nm, "model.layers.%d.%s.%s.weight", i, f->ffn, f->router);
  add_ref(m, nm, 2, c->moe.E, D, moe_layer_param(l, "gate.weight"), moe_layer_grad(l, "gate.weight"));
  if (c->moe.select_bias) { /* DeepSeek-V3's; moved by moe_layer_balance_bias, its gradient stays 0 */
    snprintf(nm, sizeof nm, "model.layers.%d.%s.gate.e_score_correction_bias", i, f->ffn);
    add_ref(m, nm, 1, c->moe.E, 0, moe_layer_param(l, "gate.select_bias"), moe_layer_grad(l, "gate.select_bias"));
  }
  if (c->family == MOE_LM_GPT_OSS) {
    add_oss_refs(m, i);
    return;
  }
  static const char *const ours[3] = {"experts.fc1.weight", "experts.fc2.weight", "experts.fc3.weight"};
  const moe_param_info *fc1 = moe_layer_param_find(l, ours[0]);
  /* quantized experts (expert_type) are bytes bound to the layer, not parameters: no refs */
  int El = fc1 ? (int)fc1->shape[0] : 0, e0 = El && El < c->moe.E ? moe_dist_rank(c->moe.dist) * El : 0;
  int64_t Hl = fc1 ? fc1->shape[1] : 0;
  for (int e = 0; e < El; e++)
    for (int j = 0; j < 3; j++) {
      size_t at = (size_t)e * Hl * D;
      int k = f->fc[j]; /* fc2 (down) is (D, H) */
      snprintf(nm, sizeof nm, "model.layers.%d.%s.experts.%d.%s.weight", i, f->ffn, e0 + e, f->expert[j]);
      add_ref(m, nm, 2, k == 1 ? D : Hl, k == 1 ? Hl : D, moe_layer_param(l, ours[k]) + at, moe_layer_grad(l, ours[k]) + at);
    }
  if (!c->moe.shared_H) return;
  if (is_deepseek(c->family)) { /* DeepSeek's n_shared_experts as one MLP, no gate */
    static const char *const ds[3] = {"gate_proj", "up_proj", "down_proj"},
                             *const dsh[3] = {"shared.fc1.weight", "shared.fc3.weight", "shared.fc2.weight"};
    for (int j = 0; j < 3; j++) {
      const moe_param_info *p = moe_layer_param_find(l, dsh[j]);
      snprintf(nm, sizeof nm, "model.layers.%d.mlp.shared_experts.%s.weight", i, ds[j]);
      add_ref(m, nm, 2, p->shape[0], p->shape[1], moe_layer_param(l, dsh[j]), moe_layer_grad(l, dsh[j]));
    }
    return;
  }
  static const char *const hf[4] = {"shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert.down_proj",
                                    "shared_expert_gate"},
                           *const sh[4] = {"shared.fc1.weight", "shared.fc3.weight", "shared.fc2.weight",
                                           "shared.gate.weight"};
  for (int j = 0; j < 4; j++) {
    const moe_param_info *p = moe_layer_param_find(l, sh[j]);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.%s.weight", i, hf[j]);
    add_ref(m, nm, 2, p->shape[0], p->shape[1], moe_layer_param(l, sh[j]), moe_layer_grad(l, sh[j]));
  }
}

/* The latent attention's tensors in DeepSeek's order (q_proj, or q_a_proj, q_a_layernorm, q_b_proj;
 * kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj). */
static void add_mla_refs(moe_lm_t *m, size_t *off, int i, moe__mla_w *w, moe__mla_w *g) {
  const moe_lm_config *c = &m->cfg;
  const moe_lm_mla *a = &c->mla;
  int64_t D = c->moe.D, qd = (int64_t)c->n_heads * (a->qk_nope_dim + c->head_dim), qr = a->q_lora_rank,
          r = a->kv_lora_rank;
  char nm[128];
#define NAME(fmt) (snprintf(nm, sizeof nm, "model.layers.%d.self_attn." fmt, i), nm)
  if (qr) {
    add_dense(m, off, NAME("q_a_proj.weight"), 2, qr, D, &w->q_a, &g->q_a);
    add_dense(m, off, NAME("q_a_layernorm.weight"), 1, qr, 0, &w->q_a_ln, &g->q_a_ln);
    add_dense(m, off, NAME("q_b_proj.weight"), 2, qd, qr, &w->q_b, &g->q_b);
  } else {
    add_dense(m, off, NAME("q_proj.weight"), 2, qd, D, &w->q, &g->q);
  }
  add_dense(m, off, NAME("kv_a_proj_with_mqa.weight"), 2, r + c->head_dim, D, &w->kv_a, &g->kv_a);
  add_dense(m, off, NAME("kv_a_layernorm.weight"), 1, r, 0, &w->kv_a_ln, &g->kv_a_ln);
  add_dense(m, off, NAME("kv_b_proj.weight"), 2, (int64_t)c->n_heads * (a->qk_nope_dim + a->v_head_dim), r, &w->kv_b,
            &g->kv_b);
#undef NAME
}

static void build_table(moe_lm_t *m) {
  const moe_lm_config *c = &m->cfg;
  moe__lm_state *s = m->st;
  int64_t D = c->moe.D, V = c->vocab, qd = (int64_t)c->n_heads * c->head_dim,
          kvd = (int64_t)c->n_kv_heads * c->head_dim, hd = c->head_dim, dH = c->dense_H;
  size_t off = 0;
  char nm[128]; /* names fit the refs' 64 bytes: layers <= 1024, E <= 65536 */
  float *unused, *unused_g; /* k_proj and v_proj (and their biases): reached through wqkv (bqkv) */
  add_dense(m, &off, "model.embed_tokens.weight", 2, V, D, &s->embed, &s->gembed);
  for (int i = 0; i < c->n_layers; i++) {
    lm_block *w = &s->w[i], *g = &s->g[i];
#define NAME(fmt) (snprintf(nm, sizeof nm, "model.layers.%d." fmt, i), nm)
    add_dense(m, &off, NAME("input_layernorm.weight"), 1, D, 0, &w->ln1, &g->ln1);
    if (is_mla(c)) {
      add_mla_refs(m, &off, i, &w->mla, &g->mla);
    } else {
      add_dense(m, &off, NAME("self_attn.q_proj.weight"), 2, qd, D, &w->wqkv, &g->wqkv);
      add_dense(m, &off, NAME("self_attn.k_proj.weight"), 2, kvd, D, &unused, &unused_g);
      add_dense(m, &off, NAME("self_attn.v_proj.weight"), 2, kvd, D, &unused, &unused_g);
      if (c->qkv_bias) {
        add_dense(m, &off, NAME("self_attn.q_proj.bias"), 1, qd, 0, &w->bqkv, &g->bqkv);
        add_dense(m, &off, NAME("self_attn.k_proj.bias"), 1, kvd, 0, &unused, &unused_g);
        add_dense(m, &off, NAME("self_attn.v_proj.bias"), 1, kvd, 0, &unused, &unused_g);
      }
      if (c->qk_norm) {
        int full = c->qk_norm == MOE_QK_NORM_FULL;
        add_dense(m, &off, NAME("self_attn.q_norm.weight"), 1, full ? qd : hd, 0, &w->qn, &g->qn);
        add_dense(m, &off, NAME("self_attn.k_norm.weight"), 1, full ? kvd : hd, 0, &w->kn, &g->kn);
      }
    }
    add_dense(m, &off, NAME("self_attn.o_proj.weight"), 2, D, att_dim(c), &w->wo, &g->wo);
    if (c->o_bias) add_dense(m, &off, NAME("self_attn.o_proj.bias"), 1, D, 0, &w->bo, &g->bo);
    if (c->attn_sinks) add_dense(m, &off, NAME("self_attn.sinks"), 1, c->n_heads, 0, &w->sinks, &g->sinks);
    add_dense(m, &off, NAME("post_attention_layernorm.weight"), 1, D, 0, &w->ln2, &g->ln2);
    if (is_moe(m, i)) {
      add_moe_refs(m, i);
    } else { /* HF's order: gate_proj, up_proj, down_proj */
      w->mlp = g->mlp = (moe__mlp){(int)D, (int)dH, MOE_ACT_SWIGLU, NULL, NULL, NULL};
      add_dense(m, &off, NAME("mlp.gate_proj.weight"), 2, dH, D, &w->mlp.w1, &g->mlp.w1);
      add_dense(m, &off, NAME("mlp.up_proj.weight"), 2, dH, D, &w->mlp.w3, &g->mlp.w3);
      add_dense(m, &off, NAME("mlp.down_proj.weight"), 2, D, dH, &w->mlp.w2, &g->mlp.w2);
    }
#undef NAME
  }
  add_dense(m, &off, "model.norm.weight", 1, D, 0, &s->normf, &s->gnormf);
  if (c->tie_embeddings) {
    s->head = s->embed;
    s->ghead = s->gembed;
  } else {
    add_dense(m, &off, "lm_head.weight", 2, V, D, &s->head, &s->ghead);
  }
}

/* Floats of the parameters outside the MoE layers (build_table's dense ones). */
static size_t dense_numel(const moe_lm_config *c) {
  size_t D = (size_t)c->moe.D, V = (size_t)c->vocab, qd = (size_t)c->n_heads * c->head_dim,
         kvd = (size_t)c->n_kv_heads * c->head_dim, n = V * D * (c->tie_embeddings ? 1 : 2) + D;
  for (int i = 0; i < c->n_layers; i++) {
    n += 2 * D + (size_t)att_dim(c) * D;
    n += is_mla(c) ? moe__mla_numel(c) : (qd + 2 * kvd) * D;
    if (c->qkv_bias) n += qd + 2 * kvd;
    n += (c->o_bias ? D : 0) + (c->attn_sinks ? (size_t)c->n_heads : 0);
    if (c->qk_norm) n += c->qk_norm == MOE_QK_NORM_FULL ? qd + kvd : 2 * (size_t)c->head_dim;
    if (moe_lm_layer_dense(c, i)) n += 3 * (size_t)c->dense_H * D;
  }
  return n;
}

moe_status moe_lm_init(moe_lm_t *m, const moe_lm_config *c) {
  MOE_TRY(m && c, MOE_ERR_ARG, "moe_lm_init: NULL argument");
  memset(m, 0, sizeof *m);
  MOE_CHECK(check_config(c));
  m->cfg = *c;
  int L = c->n_layers, E = c->moe.E;
  size_t dense = dense_numel(c);
  m->dense = calloc(dense, 4);
  m->dense_grad = calloc(dense, 4);
  m->layers = calloc((size_t)L, sizeof *m->layers);
  m->refs = calloc(3 + (size_t)L * (20 + 3 * (size_t)E), sizeof *m->refs);
  moe__lm_state *s = m->st = calloc(1, sizeof *m->st);
  if (s) {
    s->w = calloc((size_t)L, sizeof *s->w);
    s->g = calloc((size_t)L, sizeof *s->g);
    s->a = calloc((size_t)L + 1, sizeof *s->a);
    s->bal = calloc(2 * (size_t)E + 3, sizeof *s->bal);
    s->lstats = calloc((size_t)L, sizeof *s->lstats);
    s->ref_type = calloc(3 + (size_t)L * (20 + 3 * (size_t)E), sizeof *s->ref_type);
  }
  if (!m->dense || !m->dense_grad || !m->layers || !m->refs || !s || !s->w || !s->g || !s->a || !s->bal ||
      !s->lstats || !s->ref_type) {
    moe_lm_free(m);
    MOE_TRY(0, MOE_ERR_NOMEM, "moe_lm_init: out of memory for %zu dense parameters", dense);
  }
  for (int i = 0; i < L; i++) {
    if (!is_moe(m, i)) continue;
    moe_status st = moe_layer_init(&m->layers[i], &c->moe);
    if (st != MOE_OK) {
      moe_lm_free(m);
      return st;
    }
  }
  s->dense_n = dense;
  build_table(m);
  return MOE_OK;
}

void moe_lm_free(moe_lm_t *m) {
  if (!m) return;
  if (m->st && m->st->dense_mappable) moe__map_free(m->dense, m->st->dense_n * 4, m->st->dense_phase);
  else free(m->dense);
  for (int i = 0; m->layers && i < m->cfg.n_layers; i++) moe_layer_free(&m->layers[i]);
  if (m->st) {
    moe_gguf_close(m->st->mapped); /* after the layers bound into it */
    moe__arena_free(&m->st->arena);
    for (int i = 0; m->st->w && i < m->cfg.n_layers; i++)
      for (int j = 0; j < 3; j++) free(m->st->w[i].own[j]);
    free(m->st->ref_type);
    free(m->st->w);
    free(m->st->g);
    free(m->st->a);
    free(m->st->cos_t);
    free(m->st->sin_t);
    free(m->st->bal);
    free(m->st->lstats);
    free(m->st);
  }
  free(m->layers);
  free(m->refs);
  free(m->dense_grad);
  memset(m, 0, sizeof *m);
}

void moe__lm_keep_mapped(moe_lm_t *m, moe_gguf *g) { m->st->mapped = g; }

moe_status moe__lm_place(moe_lm_t *m, const size_t *phase) {
  moe__lm_state *s = m->st;
  float *d = moe__map_alloc(s->dense_n * 4, phase[0]);
  MOE_TRY(d, MOE_ERR_NOMEM, "moe_lm_init: out of memory for %zu dense parameters", s->dense_n);
  if (s->dense_mappable) moe__map_free(m->dense, s->dense_n * 4, s->dense_phase);
  else free(m->dense);
  m->dense = d;
  s->dense_mappable = 1, s->dense_phase = phase[0];
  for (int i = 0; i < m->cfg.n_layers; i++)
    if (is_moe(m, i)) MOE_CHECK(moe__layer_params_at(&m->layers[i], phase[1 + i]));
  m->nrefs = 0, m->numel = 0;
  build_table(m); /* the refs (and the blocks' pointers) into the new buffers */
  return MOE_OK;
}

size_t moe__lm_dense_floats(const moe_lm_t *m) { return m->st->dense_n; }
void moe__lm_add_mapped_bytes(moe_lm_t *m, size_t n) { m->st->mapped_bytes += n; }
size_t moe_lm_mapped_bytes(const moe_lm_t *m) { return m && m->st ? m->st->mapped_bytes : 0; }

/* Where parameter `name` goes when it is computed in a quantized type; NULL: it stays fp32. */
static moe__qmat *quant_slot(const moe_lm_t *m, const char *name) {
  moe__lm_state *s = m->st;
  if (!strcmp(name, "model.embed_tokens.weight")) return &s->qembed;
  if (!strcmp(name, "lm_head.weight")) return &s->qhead;
  int i, n = 0;
  if (sscanf(name, "model.layers.%d.%n", &i, &n) != 1 || !n || i < 0 || i >= m->cfg.n_layers) return NULL;
  lm_block *w = &s->w[i];
  const char *rest = name + n;
  static const char *const attn[4] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                      "self_attn.v_proj.weight", "self_attn.o_proj.weight"};
  static const char *const mlp[3] = {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
  moe__qmat *attn_slot[4] = {&w->qkv[0], &w->qkv[1], &w->qkv[2], &w->o}, *mlp_slot[3] = {&w->mlp1, &w->mlp3, &w->mlp2};
  for (int j = 0; j < 4 && !is_mla(&m->cfg); j++)
    if (!strcmp(rest, attn[j])) return attn_slot[j];
  for (int j = 0; j < 3 && !is_moe(m, i); j++)
    if (!strcmp(rest, mlp[j])) return mlp_slot[j];
  return NULL;
}

int moe__lm_quantizable(const moe_lm_t *m, const char *name) { return quant_slot(m, name) != NULL; }

const moe__qmat *moe__lm_quant_weight(const moe_lm_t *m, const char *name) {
  const moe__qmat *q = quant_slot(m, name);
  return q && q->w ? q : NULL;
}

void moe__lm_bind_quant(moe_lm_t *m, const char *name, moe_gguf_type t, const void *w, void *own) {
  moe__lm_state *s = m->st;
  moe__qmat *slot = quant_slot(m, name);
  const moe_tensor_ref *r = moe_lm_find(m, name);
  *slot = (moe__qmat){t, w, (int)r->shape[0], (int)r->shape[1]};
  if (slot == &s->qembed && m->cfg.tie_embeddings) s->qhead = *slot; /* the head reads the same bytes */
  s->ref_type[r - m->refs] = t;
  s->quant = 1;
  int i;
  if (own && sscanf(name, "model.layers.%d.", &i) == 1)
    for (int j = 0; j < 3; j++)
      if (!s->w[i].own[j]) {
        s->w[i].own[j] = own;
        break;
      }
}

moe_gguf_type moe_lm_param_type(const moe_lm_t *m, const char *name) {
  const moe_tensor_ref *r = m && name ? moe_lm_find(m, name) : NULL;
  return r ? m->st->ref_type[r - m->refs] : MOE_GGUF_F32;
}

void moe__lm_set_hook(moe_lm_t *m, moe__lm_layer_hook fn, void *ctx) {
  m->st->hook = fn;
  m->st->hook_ctx = ctx;
}

const moe_tensor_ref *moe_lm_find(const moe_lm_t *m, const char *name) {
  return moe__ref_find(m->refs, m->nrefs, name);
}

void moe_lm_params_changed(moe_lm_t *m) {
  for (int i = 0; i < m->cfg.n_layers; i++)
    if (is_moe(m, i)) moe_layer_params_changed(&m->layers[i]);
  m->st->have_fwd = 0;
}

/* Advances the generator past n draws: the experts another rank holds. */
static void skip_draws(uint64_t *st, size_t n) {
  for (size_t i = 0; i < n; i++) moe__splitmix(st);
}

void moe_lm_init_params(moe_lm_t *m, uint64_t seed) {
  uint64_t st = seed * 0x9E3779B97F4A7C15ull + 1;
  const float sd = 0.02f * 1.7320508f; /* uniform on [-a, a] has standard deviation a / sqrt(3) */
  const moe_layer_config *c = &m->cfg.moe;
  /* expert-parallel: the draws of one process, the other ranks' experts (or parts of each) skipped */
  int first = 0;
  while (first < m->cfg.n_layers - 1 && !is_moe(m, first)) first++;
  const moe_param_info *fc1 = moe_layer_param_find(&m->layers[first], "experts.fc1.weight");
  int El = fc1 ? (int)fc1->shape[0] : c->E, e0 = El < c->E ? moe_dist_rank(c->dist) * El : 0;
  size_t per = 3 * (size_t)c->H * c->D; /* an expert's three tensors */
  for (int i = 0; i < m->nrefs; i++) {
    moe_tensor_ref *r = &m->refs[i];
    int e = -1, k = -1;
    if (!moe__lm_expert_of(m->cfg.family, r->name, &e, &k)) e = -1;
    if (e == e0 && k == 0) skip_draws(&st, (size_t)e0 * per);
    int bias = strstr(r->name, ".bias") != NULL || strstr(r->name, "_bias") != NULL;
    int sinks = strstr(r->name, ".sinks") != NULL;
    moe__lm_part p; /* sharded: the whole tensor's draws, this rank's runs of them kept */
    moe__lm_part_of(m, r, &p);
    int drawn = !bias && (r->ndim > 1 || sinks); /* norms 1, biases 0, weights and sinks drawn (HF's _init_weights) */
    size_t at = 0; /* the whole tensor's draws so far (none for a norm or a bias) */
    for (size_t run = 0; run < p.runs; run++) {
      size_t from = p.first + run * p.stride;
      if (drawn) skip_draws(&st, from - at);
      for (size_t j = 0; j < p.len; j++) r->data[run * p.len + j] = !drawn ? (bias ? 0.0f : 1.0f) : sd * moe__uniform(&st);
      at = from + p.len;
    }
    if (drawn) skip_draws(&st, p.whole.numel - at);
    if (e == e0 + El - 1 && k == 2) skip_draws(&st, (size_t)(c->E - e0 - El) * per);
  }
  moe_lm_params_changed(m);
}

void moe_lm_zero_grad(moe_lm_t *m) {
  for (int i = 0; i < m->nrefs; i++) memset(m->refs[i].grad, 0, m->refs[i].numel * 4);
}

void moe_lm_set_threads(moe_lm_t *m, int threads) {
  m->cfg.moe.threads = threads;
  for (int i = 0; i < m->cfg.n_layers; i++)
    if (is_moe(m, i)) moe_layer_set_threads(&m->layers[i], threads);
}

const float *moe_lm_logits(const moe_lm_t *m) { return m->st->logits; }

/* The arena's buffers for B batch rows of N tokens in all, T at most a row, at positions up to pos0 + T:
 * sizes only when base is NULL (returns the bytes). */
static size_t carve(moe_lm_t *m, int B, int T, size_t N, int pos0, char *base) {
  const moe_lm_config *c = &m->cfg;
  moe__lm_state *s = m->st;
  size_t D = (size_t)c->moe.D, qd = (size_t)c->n_heads * c->head_dim,
         qkv = qd + 2 * (size_t)c->n_kv_heads * c->head_dim, E = (size_t)c->moe.E;
  size_t off = 0;
#define TAKE(ptr, n)                                          \
  do {                                                        \
    if (base) (ptr) = (void *)(base + off);                   \
    off += moe__arena_size((n) * 4);                          \
  } while (0)
  int shaped = c->qk_norm || c->clip_qkv > 0; /* q, k, v changed after the projections */
  size_t qk_rows = c->qk_norm == MOE_QK_NORM_HEAD ? (size_t)c->n_heads + c->n_kv_heads : 2;
  for (int i = 0; i <= c->n_layers; i++) {
    lm_acts *a = &s->a[i];
    TAKE(a->res, N * D);
    if (i == c->n_layers) break;
    TAKE(a->xn1, N * D);
    TAKE(a->rstd1, N);
    if (is_mla(c)) {
      off += moe__mla_carve(c, N, s->decoding, &a->mla, base ? base + off : NULL);
    } else {
      TAKE(a->qkv, N * qkv);
      TAKE(a->lse, N * c->n_heads);
    }
    if (shaped) TAKE(a->raw, N * qkv);
    if (c->qk_norm && c->clip_qkv > 0) TAKE(a->pre, N * qkv);
    if (c->qk_norm) TAKE(a->rstdq, N * qk_rows);
    TAKE(a->att, N * att_dim(c));
    TAKE(a->mid, N * D);
    TAKE(a->xn2, N * D);
    TAKE(a->rstd2, N);
    if (!moe_lm_layer_dense(c, i)) {
      TAKE(a->probs, N * E);
    } else {
      const moe__mlp *mlp = &s->w[i].mlp;
      float *buf = NULL;
      TAKE(buf, moe__mlp_act_floats(mlp, (int)N));
      if (base) a->mlp = moe__mlp_acts_at(mlp, (int)N, buf);
    }
  }
  TAKE(s->xnf, N * D);
  TAKE(s->rstdf, N);
  TAKE(s->logits, N * c->vocab);
  TAKE(s->lse, N);
  TAKE(s->tokens, N);
  TAKE(s->targets, N);
  TAKE(s->row0, (size_t)B + 1);
  TAKE(s->dres, N * D);
  TAKE(s->dxn, N * D);
  TAKE(s->datt, N * att_dim(c));
  if (is_mla(c)) {
    off += moe__mla_work_carve(c, N, &s->mlaw, base ? base + off : NULL);
  } else {
    TAKE(s->dqkv, N * qkv);
  }
  if (shaped) TAKE(s->draw, N * qkv);
  TAKE(s->gl, N * E);
  if (s->quant) { /* activations quantized for the widest input: D, the attention's, a dense layer's */
    int I = c->moe.D > att_dim(c) ? c->moe.D : att_dim(c);
    I = c->dense_H > I ? c->dense_H : I;
    TAKE(s->qscratch, (moe__qmatmul_scratch((int)N, I) + 3) / 4);
  }
#undef TAKE
  moe__attn at = {.B = B, .Tq = T, .pos0 = pos0, .nh = c->n_heads, .nkv = c->n_kv_heads, .hd = c->head_dim};
  if (base) s->scratch = (float *)(base + off);
  return off + moe__attn_scratch(&at, s->nt);
}

static moe__gemm gemm(bool ta, bool tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                      float beta, float *C, int ldc) {
  return (moe__gemm){ta, tb, M, N, K, 1.0f, beta, A, lda, B, ldb, C, ldc, false};
}

/* Layer i's attention: its window (none in gpt-oss's full-attention layers) and sinks. */
static moe__attn attn_of(const moe_lm_t *m, int i) {
  const moe_lm_config *c = &m->cfg;
  const lm_acts *a = &m->st->a[i];
  int hd = c->head_dim, qd = c->n_heads * hd, ld = qd + 2 * c->n_kv_heads * hd;
  int window = c->full_layers[i / 8] >> (i % 8) & 1 ? 0 : c->sliding_window;
  return (moe__attn){m->st->B, m->st->T, 0, c->n_heads, c->n_kv_heads, hd, ld, ld, (size_t)m->st->T * ld,
                     a->qkv, a->qkv + qd, a->qkv + qd + c->n_kv_heads * hd, a->att, a->lse, window, m->st->w[i].sinks};
}

/* Rows [0, N) of x (ld floats apart) += b (n). */
static void add_bias_rows(float *x, int N, int ld, const float *b, int n, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < N; t++)
    for (int j = 0; j < n; j++) x[(size_t)t * ld + j] += b[j];
}

/* g (n) += the column sums of rows [0, N) of d (ld floats apart), each column one thread's. */
static void add_col_sums(const float *d, int N, int ld, float *g, int n, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int j = 0; j < n; j++) {
    float acc = 0;
    for (int t = 0; t < N; t++) acc += d[(size_t)t * ld + j];
    g[j] += acc;
  }
}

static void add_rows(float *y, const float *x, size_t n, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static) if (moe__par_worth(n))
  for (size_t i = 0; i < n; i++) y[i] += x[i];
}

/* A pass over the layers of `secs` seconds: what its MoE layers and balance loss did not take is
 * attention (with its norms and the residual adds). */
static void add_times(moe__lm_state *s, double secs) {
  s->times.experts += s->lap_moe;
  s->times.router += s->lap_router;
  s->times.attention += secs - s->lap_moe - s->lap_router;
}

const moe_layer_stats *moe_lm_layer_stats(const moe_lm_t *m, int i) { return &m->st->lstats[i]; }
void moe_lm_times_get(const moe_lm_t *m, moe_lm_times *out) { *out = m->st->times; }
void moe_lm_times_reset(moe_lm_t *m) { memset(&m->st->times, 0, sizeof m->st->times); }

/* The q/k norms' rows: q's (is_k 0) or k's heads within the fused qkv rows of N tokens. */
static moe__rows qk_rows(const moe_lm_config *c, int N, int is_k) {
  int hd = c->head_dim, heads = is_k ? c->n_kv_heads : c->n_heads;
  size_t ld = (size_t)(c->n_heads + 2 * c->n_kv_heads) * hd;
  return c->qk_norm == MOE_QK_NORM_HEAD ? (moe__rows){N * heads, hd, heads, ld} : (moe__rows){N, heads * hd, 1, ld};
}

static void clamp_rows(float *x, size_t n, float lim, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
  for (size_t i = 0; i < n; i++) x[i] = x[i] < -lim ? -lim : x[i] > lim ? lim : x[i];
}

/* q, k and v of layer i before the rotary embedding, in a->qkv: the projections (with their biases),
 * the q/k norms and the clamp, keeping what backward needs. */
static moe_status project(moe_lm_t *m, int i) {
  const moe_lm_config *c = &m->cfg;
  moe__lm_state *s = m->st;
  lm_acts *a = &s->a[i];
  const lm_block *w = &s->w[i];
  int N = s->N, D = c->moe.D, nt = s->nt, qd = c->n_heads * c->head_dim, ld = qd + 2 * c->n_kv_heads * c->head_dim;
  float *out = a->raw ? a->raw : a->qkv;
  if (w->qkv[0].w) {
    moe__qmatmul(w->qkv, 3, a->xn1, N, D, out, ld, 0, s->qscratch, nt);
  } else {
    moe__gemm g = gemm(false, true, N, ld, D, a->xn1, D, w->wqkv, D, 0.0f, out, ld);
    MOE_CHECK(moe__gemm_row(&g, nt));
  }
  if (w->bqkv) add_bias_rows(out, N, ld, w->bqkv, ld, nt);
  if (!a->raw) return MOE_OK;
  memcpy(a->qkv, a->raw, (size_t)N * ld * 4); /* v as it is; q and k overwritten by their norms */
  if (c->qk_norm) {
    moe__rows q = qk_rows(c, N, 0), k = qk_rows(c, N, 1);
    moe__rmsnorm_rows_forward(&q, a->raw, w->qn, c->rms_eps, a->qkv, a->rstdq, nt);
    moe__rmsnorm_rows_forward(&k, a->raw + qd, w->kn, c->rms_eps, a->qkv + qd, a->rstdq + q.n, nt);
  }
  if (a->pre) memcpy(a->pre, a->qkv, (size_t)N * ld * 4);
  if (c->clip_qkv > 0) clamp_rows(a->qkv, (size_t)N * ld, c->clip_qkv, nt);
  return MOE_OK;
}

/* Backward of project, from d qkv (before the rotary embedding) in s->dqkv: the weight and bias
 * gradients, and d xn1 into s->dxn. */
static moe_status unproject(moe_lm_t *m, int i) {
  const moe_lm_config *c = &m->cfg;
  moe__lm_state *s = m->st;
  lm_acts *a = &s->a[i];
  const lm_block *w = &s->w[i];
  lm_block *gw = &s->g[i];
  int N = s->N, D = c->moe.D, nt = s->nt, qd = c->n_heads * c->head_dim, ld = qd + 2 * c->n_kv_heads * c->head_dim;
  float *d = s->dqkv;
  if (c->clip_qkv > 0) { /* torch's clamp passes the gradient where min <= x <= max */
    const float *x = a->pre ? a->pre : a->raw, lim = c->clip_qkv;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t j = 0; j < (size_t)N * ld; j++)
      if (!(x[j] >= -lim && x[j] <= lim)) d[j] = 0;
  }
  if (c->qk_norm) { /* d raw: v's as it is, q's and k's through their norms */
    moe__rows q = qk_rows(c, N, 0), k = qk_rows(c, N, 1);
    memset(s->draw, 0, (size_t)N * ld * 4);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < N; t++)
      memcpy(s->draw + (size_t)t * ld + qd + k.d * k.per, d + (size_t)t * ld + qd + k.d * k.per,
             (size_t)(ld - qd - k.d * k.per) * 4);
    moe__rmsnorm_rows_backward(&q, d, a->raw, w->qn, a->rstdq, s->draw, gw->qn, nt);
    moe__rmsnorm_rows_backward(&k, d + qd, a->raw + qd, w->kn, a->rstdq + q.n, s->draw + qd, gw->kn, nt);
    d = s->draw;
  }
  if (gw->bqkv) add_col_sums(d, N, ld, gw->bqkv, ld, nt);
  moe__gemm g[2] = {gemm(true, false, ld, D, N, d, ld, a->xn1, D, 1.0f, gw->wqkv, D),  /* dWqkv += dqkv^T xn1 */
                    gemm(false, false, N, D, ld, d, ld, w->wqkv, D, 0.0f, s->dxn, D)}; /* dxn1 = dqkv Wqkv */
  return moe__gemm_run(g, 2, nt);
}

/* The grouped-query attention of layer i into a->att, from a->xn1: q, k and v projected and rotated (with kv,
 * each batch row's keys and values appended to the cache at its position and attention over it). */
static moe_status gqa_forward(moe_lm_t *m, int i, moe_lm_cache *kv) {
  const moe_lm_config *c = &m->cfg;
  moe__lm_state *s = m->st;
  lm_acts *a = &s->a[i];
  int nt = s->nt, hd = c->head_dim, qd = c->n_heads * hd, nkv = c->n_kv_heads;
  int ld = qd + 2 * nkv * hd;
  MOE_CHECK(project(m, i));
  moe__attn at = attn_of(m, i);
  if (kv) { /* each batch row at its own slot and position: rotate, append to the cache, attend */
    size_t kvd = (size_t)nkv * hd;
    for (int b = 0; b < s->B; b++) {
      int pos0 = row_pos(kv, b), T = s->row0[b + 1] - s->row0[b];
      size_t cell = (size_t)i * kv->B + row_slot(kv, b);
      float *q = a->qkv + (size_t)s->row0[b] * ld, *kb = kv->k[cell], *vb = kv->v[cell];
      moe__rope_apply(q, ld, 1, T, c->n_heads, hd, pos0, s->cos_t, s->sin_t, 0, nt);
      moe__rope_apply(q + qd, ld, 1, T, nkv, hd, pos0, s->cos_t, s->sin_t, 0, nt);
      for (int t = 0; t < T; t++) {
        memcpy(kb + (pos0 + t) * kvd, q + (size_t)t * ld + qd, kvd * 4);
        memcpy(vb + (pos0 + t) * kvd, q + (size_t)t * ld + qd + kvd, kvd * 4);
      }
      moe__attn one = at;
      one.B = 1, one.Tq = T, one.pos0 = pos0, one.q = q, one.k = kb, one.v = vb, one.ldkv = (int)kvd, one.kv_bs = 0;
      one.o = a->att + (size_t)s->row0[b] * qd, one.lse = a->lse + (size_t)s->row0[b] * c->n_heads;
      moe__attn_forward(&one, s->scratch, nt);
    }
  } else {
    moe__rope_apply(a->qkv, ld, s->B, s->T, c->n_heads, hd, 0, s->cos_t, s->sin_t, 0, nt);
    moe__rope_apply(a->qkv + qd, ld, s->B, s->T, nkv, hd, 0, s->cos_t, s->sin_t, 0, nt);
    moe__attn_forward(&at, s->scratch, nt);
  }
  return MOE_OK;
}

static moe__mla_ctx mla_ctx(const moe_lm_t *m) {
  const moe__lm_state *s = m->st;
  return (moe__mla_ctx){&m->cfg, s->B, s->T, s->N, s->nt, s->cos_t, s->sin_t, s->scratch};
}

/* The latent attention of layer i into a->att (with kv, each batch row's latent rows appended to its slot). */
static moe_status mla_forward(moe_lm_t *m, int i, moe_lm_cache *kv) {
  moe__lm_state *s = m->st;
  lm_acts *a = &s->a[i];
  moe__mla_ctx x = mla_ctx(m);
  if (!kv) return moe__mla_forward(&x, &s->w[i].mla, &a->mla, a->xn1, a->att);
  float *rows[s->B];
  int pos[s->B];
  for (int b = 0; b < s->B; b++) rows[b] = kv->k[(size_t)i * kv->B + row_slot(kv, b)], pos[b] = row_pos(kv, b);
  return moe__mla_decode(&x, &s->w[i].mla, &a->mla, a->xn1, rows, pos, s->row0, a->att);
}

/* Layer i's dense MLP with its weights in a quantized type (moe__mlp_forward's in fp32), added to
 * a[i + 1].res: gate and up of xn2, SwiGLU, down of h. */
static void quant_mlp_forward(moe_lm_t *m, int i) {
  moe__lm_state *s = m->st;
  const lm_block *w = &s->w[i];
  lm_acts *a = &s->a[i];
  int N = s->N, D = m->cfg.moe.D, H = m->cfg.dense_H;
  moe__qmatmul(&w->mlp1, 1, a->xn2, N, D, a->mlp.a1, H, 0, s->qscratch, s->nt);
  moe__qmatmul(&w->mlp3, 1, a->xn2, N, D, a->mlp.a3, H, 0, s->qscratch, s->nt);
#pragma omp parallel for num_threads(s->nt) schedule(static)
  for (int t = 0; t < N; t++)
    moe__act_forward(MOE_ACT_SWIGLU, a->mlp.a1 + (size_t)t * H, a->mlp.a3 + (size_t)t * H, a->mlp.h + (size_t)t * H, (size_t)H);
  moe__qmatmul(&w->mlp2, 1, a->mlp.h, N, H, s->a[i + 1].res, D, 1, s->qscratch, s->nt);
}

/* Layer i forward: attention, then the MoE feed-forward; a[i].res in, a[i + 1].res out. With kv the
 * tokens sit at positions kv->len on: their keys and values join the cache and attention reads it. */
static moe_status layer_forward(moe_lm_t *m, int i, moe_lm_cache *kv, moe_lm_stats *out) {
  const moe_lm_config *c = &m->cfg;
  moe__lm_state *s = m->st;
  lm_acts *a = &s->a[i];
  const lm_block *w = &s->w[i];
  int N = s->N, D = c->moe.D, nt = s->nt, ad = att_dim(c);
  moe__rmsnorm_forward(a->res, w->ln1, N, D, c->rms_eps, a->xn1, a->rstd1, nt);
  MOE_CHECK(is_mla(c) ? mla_forward(m, i, kv) : gqa_forward(m, i, kv));
  memcpy(a->mid, a->res, (size_t)N * D * 4);
  if (w->o.w) {
    moe__qmatmul(&w->o, 1, a->att, N, ad, a->mid, D, 1, s->qscratch, nt);
  } else {
    moe__gemm g = gemm(false, true, N, D, ad, a->att, ad, w->wo, ad, 1.0f, a->mid, D);
    MOE_CHECK(moe__gemm_row(&g, nt));
  }
  if (w->bo) add_bias_rows(a->mid, N, D, w->bo, D, nt);
  moe__rmsnorm_forward(a->mid, w->ln2, N, D, c->rms_eps, a->xn2, a->rstd2, nt);
  if (!is_moe(m, i)) { /* the dense MLP, added to the residual in place */
    memcpy(s->a[i + 1].res, a->mid, (size_t)N * D * 4);
    if (w->mlp1.w) return quant_mlp_forward(m, i), MOE_OK;
    return moe__mlp_forward(&w->mlp, N, a->xn2, &a->mlp, 1.0f, s->a[i + 1].res, nt);
  }
  moe_layer_stats *ls = &s->lstats[i];
  moe_layer_t *l = &m->layers[i];
  if (s->hook) MOE_CHECK(s->hook(s->hook_ctx, m, i, a->mid, N, nt));
  double t0 = moe__now();
  moe_status st = moe_layer_forward(l, a->xn2, N, s->a[i + 1].res, NULL, ls);
  MOE_TRY(st == MOE_OK, st, "layer %d: %s", i, moe_last_error());
  double t1 = moe__now();
  add_rows(s->a[i + 1].res, a->mid, (size_t)N * D, nt);
  out->dropped += ls->dropped;
  out->seq_aux += ls->seq_aux_loss;
  if (kv) memcpy(kv->counts + (size_t)i * c->moe.E, ls->expert_counts, (size_t)c->moe.E * sizeof *kv->counts);
  /* Mixtral's balance loss (gpt-oss's over its scores, only when on); DeepSeek has no model-wide one
   * (check_mla). A decode has no loss to give: its router logits again (a second read of the gate,
   * the other thread waiting on a token's one tile) were 2% of a Qwen3-shaped Q8_0 decode. */
  if (!kv && !is_deepseek(c->family) && (c->family != MOE_LM_GPT_OSS || c->aux_coef > 0))
    st = moe__lbl_forward(&s->lbl, a->xn2, moe_layer_param(l, "gate.weight"), moe_layer_param(l, "gate.bias"),
                          ls->experts, a->probs, nt);
  s->lap_moe += t1 - t0 - ls->router_seconds;
  s->lap_router += moe__now() - t1 + ls->router_seconds;
  return st;
}

/* Expert-parallel (data-parallel outside the MoE layers): the balance loss's sums, the cross-entropy
 * sum *sum and its count over every rank's tokens, so that the loss and its gradient are the global
 * batch's. Each rank's share of every parameter gradient is then a sum of parts, added up in backward. */
static moe_status global_sums(moe_lm_t *m, double *sum) {
  moe__lm_state *s = m->st;
  const moe_dist *d = m->cfg.moe.dist;
  int E = m->cfg.moe.E;
  if (moe_dist_size(d) < 2) return MOE_OK;
  double *g = s->bal + 2 * E;
  g[0] = *sum, g[1] = s->count, g[2] = s->N;
  MOE_CHECK(moe_dist_allreduce(d, s->bal, 2 * E + 3));
  *sum = g[0];
  s->count = (int)g[1];
  s->lbl.rows = (double)moe__lm_moe_layers(&m->cfg) * g[2];
  return MOE_OK;
}

/* The positions a buffer of `have` grows to for n (<= max_seq): doubled at least, so that a sequence
 * growing a token at a time reallocates log(n) times. */
static int room(int have, int n, int max_seq) { return have > max_seq / 2 ? max_seq : 2 * have > n ? 2 * have : n; }

static moe_status grow(float **buf, int n, size_t per) {
  float *p = realloc(*buf, (size_t)n * per * 4);
  MOE_TRY(p, MOE_ERR_NOMEM, "out of memory for %d positions of %zu floats", n, per);
  *buf = p;
  return MOE_OK;
}

/* The rotary tables of positions [0, n): formed anew whenever they grow. */
static moe_status rope_reserve(moe_lm_t *m, int n) {
  const moe_lm_config *c = &m->cfg;
  moe__lm_state *s = m->st;
  if (n <= s->rope_n) return MOE_OK;
  int want = room(s->rope_n, n, c->max_seq);
  MOE_CHECK(grow(&s->cos_t, want, (size_t)c->head_dim / 2));
  MOE_CHECK(grow(&s->sin_t, want, (size_t)c->head_dim / 2));
  if (c->yarn.factor > 0)
    moe__rope_tables_yarn(s->cos_t, s->sin_t, want, c->head_dim, c->rope_theta, &c->yarn);
  else
    moe__rope_tables(s->cos_t, s->sin_t, want, c->head_dim, c->rope_theta);
  s->rope_n = want;
  return MOE_OK;
}

/* Room in slot b's keys and values of every layer for n positions. */
static moe_status kv_reserve(moe_lm_cache *kv, int b, int n) {
  if (n <= kv->cap[b]) return MOE_OK;
  int want = room(kv->cap[b], n, kv->max_seq);
  for (int l = 0; l < kv->L; l++) {
    size_t at = (size_t)l * kv->B + b;
    moe_status st = grow(&kv->k[at], want, (size_t)kv->kvd);
    if (st == MOE_OK && !kv->latent) st = grow(&kv->v[at], want, (size_t)kv->kvd);
    MOE_TRY(st == MOE_OK, st, "the KV cache of slot %d: %s", b, moe_last_error());
  }
  kv->cap[b] = want;
  return MOE_OK;
}

/* The forward of moe_lm_forward (kv NULL) and the decodes: B rows of T tokens each, or (a ragged decode)
 * counts[b] tokens in row b, one row's after another's. */
static moe_status forward(moe_lm_t *m, const int32_t *tokens, const int32_t *targets, int B, int T,
                          const int *counts, moe_lm_cache *kv, moe_lm_stats *out) {
  MOE_TRY(m && m->st && tokens, MOE_ERR_ARG, "moe_lm_forward: NULL argument");
  const moe_lm_config *c = &m->cfg;
  moe__lm_state *s = m->st;
  MOE_TRY(B >= 1, MOE_ERR_ARG, "moe_lm_forward: want B >= 1, got %d", B);
  int64_t N = 0;
  int end = 0, Tmax = 0; /* the furthest position a row reaches, the most tokens a row has */
  for (int b = 0; b < B; b++) {
    int n = counts ? counts[b] : T, p = kv ? row_pos(kv, b) : 0;
    MOE_TRY(n >= 1 && p + n <= c->max_seq, MOE_ERR_ARG,
            "moe_lm_forward: row %d: want 1 to max_seq=%d - %d positions already cached tokens, got %d", b, c->max_seq,
            p, n);
    N += n;
    end = p + n > end ? p + n : end;
    Tmax = n > Tmax ? n : Tmax;
  }
  MOE_TRY(N * (c->vocab > c->moe.D ? c->vocab : c->moe.D) <= INT32_MAX, MOE_ERR_ARG,
          "moe_lm_forward: a batch of %lld tokens is too large", (long long)N);
  MOE_CHECK(rope_reserve(m, end));
  s->have_fwd = 0;
  s->B = B, s->T = Tmax, s->N = (int)N, s->nt = moe__threads(c->moe.threads), s->decoding = kv != NULL;
  MOE_CHECK(moe__arena_reserve(&s->arena, carve(m, B, Tmax, (size_t)N, end - Tmax, NULL), "language model"));
  carve(m, B, Tmax, (size_t)N, end - Tmax, s->arena.base);
  s->row0[0] = 0;
  for (int b = 0; b < B; b++) s->row0[b + 1] = s->row0[b] + (counts ? counts[b] : T);
  int V = c->vocab, D = c->moe.D;
  for (int b = 0; b < B; b++)
    for (int i = s->row0[b]; i < s->row0[b + 1]; i++) {
      MOE_TRY(tokens[i] >= 0 && tokens[i] < V, MOE_ERR_VALUE,
              "moe_lm_forward: token [%d, %d] = %d is not in [0, %d)", b, i - s->row0[b], tokens[i], V);
      MOE_TRY(!targets || targets[i] < V, MOE_ERR_VALUE, "moe_lm_forward: target [%d, %d] = %d is not below %d", b,
              i - s->row0[b], targets[i], V);
    }
  for (int b = 0; kv && b < B; b++)
    MOE_CHECK(kv_reserve(kv, row_slot(kv, b), row_pos(kv, b) + s->row0[b + 1] - s->row0[b]));
  memcpy(s->tokens, tokens, (size_t)N * 4);
  for (int i = 0; i < N; i++) s->targets[i] = targets ? targets[i] : -1;
  moe_lm_stats st = {0};
  memset(s->bal, 0, 2 * (size_t)c->moe.E * sizeof *s->bal);
  int Lm = moe__lm_moe_layers(c); /* the balance loss is over the MoE layers' router logits */
  s->lbl = (moe__lbl){Lm, N, c->moe.E, D, c->moe.top_k, s->bal, s->bal + c->moe.E, (double)Lm * N,
                      c->family == MOE_LM_GPT_OSS};
  if (s->qembed.w) { /* the rows looked up, dequantized */
    size_t rb = moe__qrow_bytes(s->qembed.type, D);
    for (int i = 0; i < N; i++)
      MOE_CHECK(moe_gguf_dequantize(s->qembed.type, s->qembed.w + (size_t)tokens[i] * rb, s->a[0].res + (size_t)i * D, D));
  } else {
    moe__embed_forward(s->embed, tokens, N, D, s->a[0].res);
  }
  s->lap_moe = s->lap_router = 0;
  for (int i = 0; i < c->n_layers; i++) /* the sequence-wise balance loss: each batch row a sequence (a
                                         ragged decode's, which has no loss to give, the batch one) */
    if (is_moe(m, i)) m->layers[i].cfg.seq_len = counts ? 0 : T;
  double t0 = moe__now();
  for (int i = 0; i < c->n_layers; i++) MOE_CHECK(layer_forward(m, i, kv, &st));
  if (!kv) add_times(s, moe__now() - t0);
  moe__rmsnorm_forward(s->a[c->n_layers].res, s->normf, N, D, c->rms_eps, s->xnf, s->rstdf, s->nt);
  int Nh = N; /* the rows through the output layer */
  if (kv && kv->last_only && N > B) { /* each row's last position, to the front (row b's is at or after b) */
    for (int b = 0; b < B; b++) memmove(s->xnf + (size_t)b * D, s->xnf + ((size_t)s->row0[b + 1] - 1) * D, (size_t)D * 4);
    Nh = B;
  }
  if (s->qhead.w) {
    moe__qmatmul(&s->qhead, 1, s->xnf, Nh, D, s->logits, V, 0, s->qscratch, s->nt);
  } else {
    moe__gemm g = gemm(false, true, Nh, V, D, s->xnf, D, s->head, D, 0.0f, s->logits, V);
    MOE_CHECK(moe__gemm_row(&g, s->nt));
  }
  double sum = 0; /* without targets (generation) there is no loss: the logits' normalizers are not needed */
  s->count = 0;
  if (targets) sum = moe__xent_forward(s->logits, s->targets, N, V, s->lse, &s->count, s->nt);
  if (!kv) MOE_CHECK(global_sums(m, &sum));
  st.tokens = s->count;
  st.ce = s->count ? sum / s->count : 0.0;
  st.aux = moe__lbl_value(&s->lbl);
  st.loss = st.ce + c->aux_coef * st.aux + st.seq_aux;
  MOE_TRY(isfinite(st.loss), MOE_ERR_VALUE, "moe_lm_forward: the loss is %g (ce %g, aux %g)", st.loss, st.ce, st.aux);
  s->have_fwd = targets != NULL && !kv;
  for (int b = 0; kv && kv->row_slot && b < B; b++) kv->slot_len[kv->row_slot[b]] += s->row0[b + 1] - s->row0[b];
  if (kv && !kv->row_slot) kv->len += T;
  if (out) *out = st;
  return MOE_OK;
}

moe_status moe_lm_forward(moe_lm_t *m, const int32_t *tokens, const int32_t *targets, int B, int T,
                          moe_lm_stats *out) {
  return forward(m, tokens, targets, B, T, NULL, NULL, out);
}

/* Floats per position and layer in a cache: the rotated keys and the values of the kv heads, or with
 * latent attention the normed latent and the rotated shared key. */
static int cache_width(const moe_lm_config *c) {
  return is_mla(c) ? c->mla.kv_lora_rank + c->head_dim : c->n_kv_heads * c->head_dim;
}

moe_status moe_lm_cache_new(moe_lm_cache **out, const moe_lm_t *m, int B) {
  MOE_TRY(out && m && m->st && B >= 1, MOE_ERR_ARG, "moe_lm_cache_new: NULL model or B < 1");
  const moe_lm_config *c = &m->cfg;
  moe_lm_cache *kv = calloc(1, sizeof *kv);
  MOE_TRY(kv, MOE_ERR_NOMEM, "moe_lm_cache_new: out of memory");
  *kv = (moe_lm_cache){c->n_layers, B, c->max_seq, cache_width(c), 0, is_mla(c), NULL, NULL, NULL, NULL, NULL, NULL, 0};
  size_t n = (size_t)kv->L * B;
  kv->k = calloc(n, sizeof *kv->k);
  kv->v = calloc(n, sizeof *kv->v);
  kv->cap = calloc((size_t)B, sizeof *kv->cap);
  kv->slot_len = calloc((size_t)B, sizeof *kv->slot_len);
  kv->counts = calloc((size_t)c->n_layers * c->moe.E, sizeof *kv->counts);
  if (!kv->k || !kv->v || !kv->cap || !kv->slot_len || !kv->counts) {
    moe_lm_cache_free(kv);
    MOE_TRY(0, MOE_ERR_NOMEM, "moe_lm_cache_new: out of memory for %d slots", B);
  }
  *out = kv;
  return MOE_OK;
}

/* Frees slot b's keys and values: a new sequence there grows them from nothing. */
static void kv_release(moe_lm_cache *kv, int b) {
  for (int l = 0; kv->k && kv->v && l < kv->L; l++) {
    size_t at = (size_t)l * kv->B + b;
    free(kv->k[at]), free(kv->v[at]);
    kv->k[at] = kv->v[at] = NULL;
  }
  if (kv->cap) kv->cap[b] = 0;
}

void moe_lm_cache_free(moe_lm_cache *kv) {
  if (!kv) return;
  for (int b = 0; b < kv->B; b++) kv_release(kv, b);
  free(kv->k);
  free(kv->v);
  free(kv->cap);
  free(kv->slot_len);
  free(kv->counts);
  free(kv);
}

int moe_lm_cache_len(const moe_lm_cache *kv) { return kv->len; }
void moe_lm_cache_reset(moe_lm_cache *kv) { kv->len = 0; }

static moe_status check_cache(const moe_lm_t *m, const moe_lm_cache *kv) {
  MOE_TRY(kv && m && kv->L == m->cfg.n_layers && kv->max_seq == m->cfg.max_seq && kv->kvd == cache_width(&m->cfg) &&
              kv->latent == is_mla(&m->cfg),
          MOE_ERR_ARG, "moe_lm_decode: the cache is not this model's");
  return MOE_OK;
}

moe_status moe_lm_decode(moe_lm_t *m, moe_lm_cache *kv, const int32_t *tokens, int T) {
  MOE_CHECK(check_cache(m, kv));
  return forward(m, tokens, NULL, kv->B, T, NULL, kv, NULL);
}

void moe_lm_cache_last_logits(moe_lm_cache *kv, int on) { kv->last_only = on != 0; }

int moe_lm_cache_slot_len(const moe_lm_cache *kv, int slot) {
  return slot >= 0 && slot < kv->B ? kv->slot_len[slot] : -1;
}

const int32_t *moe_lm_cache_expert_counts(const moe_lm_cache *kv) { return kv->counts; }

void moe_lm_cache_slot_reset(moe_lm_cache *kv, int slot) {
  if (slot < 0 || slot >= kv->B) return;
  kv->slot_len[slot] = 0;
  kv_release(kv, slot);
}

/* moe_lm_decode_ragged, and moe_lm_decode_slots (counts NULL: T tokens each). */
static moe_status decode_rows(moe_lm_t *m, moe_lm_cache *kv, const int *slots, int n, const int32_t *tokens,
                              const int *counts, int T, const char *fn) {
  MOE_CHECK(check_cache(m, kv));
  MOE_TRY(slots && n >= 1 && n <= kv->B, MOE_ERR_ARG, "%s: want 1 to B=%d slots, got %d", fn, kv->B, n);
  for (int i = 0; i < n; i++) {
    MOE_TRY(slots[i] >= 0 && slots[i] < kv->B, MOE_ERR_ARG, "%s: slot %d is not in [0, %d)", fn, slots[i], kv->B);
    for (int j = 0; j < i; j++) MOE_TRY(slots[j] != slots[i], MOE_ERR_ARG, "%s: slot %d given twice", fn, slots[i]);
  }
  kv->row_slot = slots;
  moe_status st = forward(m, tokens, NULL, n, T, counts, kv, NULL);
  kv->row_slot = NULL;
  return st;
}

moe_status moe_lm_decode_slots(moe_lm_t *m, moe_lm_cache *kv, const int *slots, int n, const int32_t *tokens,
                               int T) {
  return decode_rows(m, kv, slots, n, tokens, NULL, T, "moe_lm_decode_slots");
}

moe_status moe_lm_decode_ragged(moe_lm_t *m, moe_lm_cache *kv, const int *slots, int n, const int32_t *tokens,
                                const int *counts) {
  MOE_TRY(counts, MOE_ERR_ARG, "moe_lm_decode_ragged: NULL counts");
  return decode_rows(m, kv, slots, n, tokens, counts, 0, "moe_lm_decode_ragged");
}

/* Layer i backward: s->dres holds d a[i + 1].res on entry and d a[i].res on exit. */
static moe_status layer_backward(moe_lm_t *m, int i) {
  const moe_lm_config *c = &m->cfg;
  moe__lm_state *s = m->st;
  lm_acts *a = &s->a[i];
  const lm_block *w = &s->w[i];
  lm_block *gw = &s->g[i];
  moe_layer_t *l = &m->layers[i];
  int N = s->N, D = c->moe.D, nt = s->nt, hd = c->head_dim, qd = c->n_heads * hd, nkv = c->n_kv_heads;
  int ld = qd + 2 * nkv * hd;
  if (is_moe(m, i)) {
    double t0 = moe__now();
    moe_status st = moe_layer_backward(l, s->dres, 0.0f, 0.0f, NULL, NULL, s->dxn);
    MOE_TRY(st == MOE_OK, st, "layer %d: %s", i, moe_last_error());
    double t1 = moe__now();
    if (c->aux_coef > 0)
      MOE_CHECK(moe__lbl_backward(&s->lbl, c->aux_coef, a->xn2, moe_layer_param(l, "gate.weight"),
                                  moe_lm_layer_stats(m, i)->experts, a->probs, s->gl, moe_layer_grad(l, "gate.weight"),
                                  moe_layer_grad(l, "gate.bias"), s->dxn, nt));
    s->lap_moe += t1 - t0;
    s->lap_router += moe__now() - t1;
  } else {
    memset(s->dxn, 0, (size_t)N * D * 4);
    MOE_CHECK(moe__mlp_backward(&w->mlp, &gw->mlp, N, a->xn2, &a->mlp, s->dres, s->dxn, nt));
  }
  moe__rmsnorm_backward(s->dxn, a->mid, w->ln2, a->rstd2, N, D, s->dres, gw->ln2, nt); /* dres: d mid */
  int ad = att_dim(c);
  moe__gemm g[2] = {gemm(true, false, D, ad, N, s->dres, D, a->att, ad, 1.0f, gw->wo, ad),   /* dWo += dmid^T att */
                    gemm(false, false, N, ad, D, s->dres, D, w->wo, ad, 0.0f, s->datt, ad)}; /* datt = dmid Wo */
  MOE_CHECK(moe__gemm_run(g, 2, nt));
  if (gw->bo) add_col_sums(s->dres, N, D, gw->bo, D, nt);
  if (is_mla(c)) {
    moe__mla_ctx x = mla_ctx(m);
    MOE_CHECK(moe__mla_backward(&x, &w->mla, &gw->mla, &a->mla, &s->mlaw, a->xn1, s->datt, s->dxn));
  } else {
    moe__attn at = attn_of(m, i);
    if (gw->sinks) moe__attn_sinks_backward(&at, s->datt, gw->sinks, nt);
    moe__attn_backward(&at, s->datt, s->dqkv, s->dqkv + qd, s->dqkv + qd + nkv * hd, s->scratch, nt);
    moe__rope_apply(s->dqkv, ld, s->B, s->T, c->n_heads, hd, 0, s->cos_t, s->sin_t, 1, nt);
    moe__rope_apply(s->dqkv + qd, ld, s->B, s->T, nkv, hd, 0, s->cos_t, s->sin_t, 1, nt);
    MOE_CHECK(unproject(m, i));
  }
  moe__rmsnorm_backward(s->dxn, a->res, w->ln1, a->rstd1, N, D, s->dres, gw->ln1, nt);
  return MOE_OK;
}

moe_status moe_lm_backward(moe_lm_t *m) {
  MOE_TRY(m && m->st, MOE_ERR_ARG, "moe_lm_backward: NULL argument");
  moe__lm_state *s = m->st;
  MOE_TRY(!s->quant && m->cfg.moe.expert_type <= 0, MOE_ERR_ARG,
          "moe_lm_backward: the model's weights are bytes of a quantized GGUF file, for inference only (load it "
          "with moe.expert_type -1 to widen them to fp32 parameters)");
  MOE_TRY(s->have_fwd, MOE_ERR_STATE, "moe_lm_backward: no forward with targets to differentiate");
  s->have_fwd = 0; /* the logits become their gradient: one backward per forward */
  const moe_lm_config *c = &m->cfg;
  int N = s->N, D = c->moe.D, V = c->vocab, nt = s->nt;
  moe__xent_backward(s->logits, s->lse, s->targets, N, V, s->count ? 1.0f / s->count : 0.0f, nt);
  moe__gemm g[2] = {gemm(true, false, V, D, N, s->logits, V, s->xnf, D, 1.0f, s->ghead, D),  /* dW += dl^T xnf */
                    gemm(false, false, N, D, V, s->logits, V, s->head, D, 0.0f, s->dxn, D)}; /* dxnf = dl W */
  MOE_CHECK(moe__gemm_run(g, 2, nt));
  memset(s->dres, 0, (size_t)N * D * 4);
  moe__rmsnorm_backward(s->dxn, s->a[c->n_layers].res, s->normf, s->rstdf, N, D, s->dres, s->gnormf, nt);
  s->lap_moe = s->lap_router = 0;
  double t0 = moe__now();
  for (int i = c->n_layers - 1; i >= 0; i--) MOE_CHECK(layer_backward(m, i));
  add_times(s, moe__now() - t0);
  moe__embed_backward(s->gembed, s->tokens, N, D, s->dres);
  if (moe_dist_size(c->moe.dist) > 1) { /* the replicated parameters' parts, summed over the ranks */
    MOE_CHECK(moe__dist_allreduce_f32(c->moe.dist, m->dense_grad, (int)s->dense_n));
    for (int i = 0; i < c->n_layers; i++)
      if (is_moe(m, i)) MOE_CHECK(moe_layer_reduce_grads(&m->layers[i]));
  }
  return MOE_OK;
}

moe_status moe_lm_balance_bias(moe_lm_t *m, float gamma) {
  MOE_TRY(m && m->st && m->cfg.moe.select_bias, MOE_ERR_STATE, "moe_lm_balance_bias: the model has no selection bias");
  for (int i = 0; i < m->cfg.n_layers; i++)
    if (is_moe(m, i)) {
      moe_status st = moe_layer_balance_bias(&m->layers[i], gamma);
      MOE_TRY(st == MOE_OK, st, "layer %d: %s", i, moe_last_error());
    }
  return MOE_OK;
}
