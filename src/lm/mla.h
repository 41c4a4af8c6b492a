/* Multi-head latent attention (DeepSeek-V2/V3, moe.h moe_lm_mla) for the language model: training
 * forward and backward with each head's key and value expanded from the latent, and a cached decode
 * that keeps only the latent and the rotary key per token, the key and value projections absorbed
 * into the queries and the outputs. o_proj, the residual and the norms around it stay the model's. */
#ifndef MOE_LM_MLA_H
#define MOE_LM_MLA_H

#include <stddef.h>

#include "moe.h"

typedef struct { /* one layer's weights (or their gradients): views into the model's dense parameters */
  float *q_a, *q_a_ln, *q_b; /* q_lora_rank > 0: (qr, D), (qr), (nh dqk, qr) */
  float *q;                  /* q_lora_rank 0: q_proj (nh dqk, D) */
  float *kv_a, *kv_a_ln, *kv_b; /* (r + dr, D), (r), (nh (dn + dv), r) */
} moe__mla_w;

typedef struct { /* one layer's activations */
  float *qa, *qan, *rstd_q; /* q_lora_rank > 0: (N, qr) q_a_proj's output and its norm, (N) */
  float *kva;               /* (N, r + dr) kv_a_proj_with_mqa's output */
  float *kvn, *rstd_kv;     /* (N, r + dr): the normed latent and the rotated key (a cache row), (N) */
  float *kvb;               /* (N, nh (dn + dv)) kv_b_proj's output (not in a decode) */
  float *qkv;               /* (N, 3 nh dqk): q rotated and scaled, k, v padded to dqk; a decode's
                               (N, nh dqk) queries, then (N, nh (r + dr)) absorbed ones */
  float *o, *lse;           /* (N, nh dqk) the padded heads' outputs (a decode's (N, nh (r + dr))
                               latent ones), (N nh) */
} moe__mla_acts;

typedef struct { /* backward's buffers, one set for all layers */
  float *dO, *dqkv, *dkvb, *dkvn, *dkva, *dqan, *dqa;
} moe__mla_work;

typedef struct {
  const moe_lm_config *c;
  int B, T, N, nt;             /* N: the tokens, B T (a ragged decode's rows have their own counts) */
  const float *cos_t, *sin_t; /* the rotary tables (head_dim = qk_rope_head_dim) */
  float *scratch;             /* moe__attn_scratch's bytes for (B, T) at the positions used */
} moe__mla_ctx;

/* Parameters of one layer's latent attention without o_proj (floats). */
size_t moe__mla_numel(const moe_lm_config *c);
/* The width of the attention output o_proj reads: n_heads v_head_dim. */
int moe__mla_out_dim(const moe_lm_config *c);
/* Bytes of a layer's activations for N tokens of a training forward or (decode) of a cached decode,
 * carved from base when it is not NULL (64-byte aligned pieces, as the model's arena). */
size_t moe__mla_carve(const moe_lm_config *c, size_t N, int decode, moe__mla_acts *a, char *base);
size_t moe__mla_work_carve(const moe_lm_config *c, size_t N, moe__mla_work *w, char *base);
/* att (N, n_heads v_head_dim) from xn1 (N, D) at positions [0, T). */
moe_status moe__mla_forward(const moe__mla_ctx *x, const moe__mla_w *w, moe__mla_acts *a, const float *xn1,
                            float *att);
/* From datt (the gradient of att): the weights' gradients added into g, dxn1 (N, D) overwritten. */
moe_status moe__mla_backward(const moe__mla_ctx *x, const moe__mla_w *w, const moe__mla_w *g, const moe__mla_acts *a,
                             moe__mla_work *k, const float *xn1, const float *datt, float *dxn1);
/* Batch row b's T = row0[b + 1] - row0[b] tokens (from token row0[b] of the N) at positions pos0[b] on:
 * their cache rows (r + dr floats each) appended to rows[b] (room for pos0[b] + T of them), then
 * attention over rows[b][0, pos0[b] + T). */
moe_status moe__mla_decode(const moe__mla_ctx *x, const moe__mla_w *w, moe__mla_acts *a, const float *xn1,
                           float *const *rows, const int *pos0, const int *row0, float *att);

#endif
