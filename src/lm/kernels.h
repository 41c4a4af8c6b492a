/* The language model's kernels (DESIGN 4.5), each a forward and a backward: RMSNorm, rotary position
 * embeddings, causal grouped-query attention, token embedding, softmax cross-entropy and Mixtral's
 * load-balancing loss. Row-major fp32; `nt` is the OpenMP thread count. Backward functions add into
 * parameter gradients; what they do to input gradients is said per function. */
#ifndef MOE_LM_KERNELS_H
#define MOE_LM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "moe.h"

/* y (n, d) = x / sqrt(mean(x^2) + eps) * w (Hugging Face's LlamaRMSNorm); rstd (n) kept for backward. */
void moe__rmsnorm_forward(const float *x, const float *w, int n, int d, float eps, float *y, float *rstd, int nt);
/* dx (n, d) += the gradient through the norm of dy; dw (d) += its gradient. */
void moe__rmsnorm_backward(const float *dy, const float *x, const float *w, const float *rstd, int n, int d,
                           float *dx, float *dw, int nt);
/* The same over n rows of d floats that lie `per` after one another in groups ld floats apart (the q
 * heads of fused qkv rows: n = tokens x heads, per = heads, ld = the qkv row), all with the weights w (d);
 * x, y, dy and dx laid out alike. */
typedef struct {
  int n, d, per;
  size_t ld;
} moe__rows;
void moe__rmsnorm_rows_forward(const moe__rows *s, const float *x, const float *w, float eps, float *y, float *rstd,
                               int nt);
void moe__rmsnorm_rows_backward(const moe__rows *s, const float *dy, const float *x, const float *w, const float *rstd,
                                float *dx, float *dw, int nt);

/* Rotary tables for positions [0, npos): cos and sin (npos, hd/2) of pos * theta^(-2i/hd), the angle
 * formed in float32 as Hugging Face does (so long contexts round as theirs do). */
void moe__rope_tables(float *cos_t, float *sin_t, int npos, int hd, float theta);
/* Rotates, in place, the heads (hd each, `heads` per row, rows ld floats apart) of x (B, T, *) at positions
 * pos0 + t, with HF's rotate_half convention: x[i], x[i + hd/2] -> x[i] c - x[i + hd/2] s,
 * x[i + hd/2] c + x[i] s. inverse: the transposed rotation, which is the backward of the forward. */
void moe__rope_apply(float *x, int ld, int B, int T, int heads, int hd, int pos0, const float *cos_t,
                     const float *sin_t, int inverse, int nt);

/* get_mscale of YaRN (moe.h moe_lm_yarn): 0.1 m ln(scale) + 1, or 1 when scale <= 1. */
float moe__yarn_mscale(float scale, float m);
/* As moe__rope_tables with YaRN's frequencies, cos and sin times its attention factor (moe_lm_yarn). */
void moe__rope_tables_yarn(float *cos_t, float *sin_t, int npos, int hd, float theta, const moe_lm_yarn *y);
/* Where moe__rope_rotate turns: in each row (ld floats) `heads` spans of hd floats, the first at off and
 * each `stride` after the last; interleave pairs dimensions 2i and 2i + 1 (DeepSeek's checkpoints, the
 * same dot products as transformers' permute-then-rotate_half), else i and i + hd/2. */
typedef struct {
  int ld, heads, stride, off, hd, interleave;
} moe__rope_span;
/* moe__rope_apply over the spans sp of x (B, T, ld). */
void moe__rope_rotate(const moe__rope_span *sp, float *x, int B, int T, int pos0, const float *cos_t,
                      const float *sin_t, int inverse, int nt);

/* Causal grouped-query attention. q (B, Tq, nh * hd) with rows ldq floats apart; k, v (B, *, nkv * hd)
 * with rows ldkv and batches kv_bs floats apart (q, k and v may be one fused (B, T, qd + 2 kvd) buffer);
 * query t of batch b sits at position pos0 + t and sees keys [0, pos0 + t], or with window > 0 the last
 * `window` of them (Mixtral's sliding_window, as transformers masks it); head h uses kv head
 * h / (nh / nkv). o (B, Tq, nh * hd) = softmax(q k^T / sqrt(hd)) v; lse (B, nh, Tq) the log-sum-exp of each
 * row of scores, kept for backward. Queries go in blocks: a block's scores against the keys it sees are
 * one GEMM and never more than a block's rows exist per thread. */
typedef struct {
  int B, Tq, pos0, nh, nkv, hd, ldq, ldkv;
  size_t kv_bs;
  const float *q, *k, *v;
  float *o, *lse;
  int window;
  const float *sinks; /* (nh) or NULL: head h's logit sinks[h] joins each of its rows' softmax with no
                         value (gpt-oss): o = sum_j p_j v_j with the p_j summing to below 1, lse with it */
} moe__attn;
/* Bytes of scratch moe__attn_forward / _backward need for nt threads and Tk = pos0 + Tq keys. */
size_t moe__attn_scratch(const moe__attn *a, int nt);
void moe__attn_forward(const moe__attn *a, float *scratch, int nt);
/* pos0 = 0 only. do_ (B, Tq, nh * hd) the gradient of o; dq, dk and dv (overwritten) laid out as q, k
 * and v. */
void moe__attn_backward(const moe__attn *a, const float *do_, float *dq, float *dk, float *dv, float *scratch,
                        int nt);
/* With sinks: dsinks (nh) += the gradient of the sinks, -sum over rows of p_sink (do_ . o) (a sink's value
 * is 0, so its score's gradient is p_sink (0 - rowsum(dO o))); reads o and lse of the forward. */
void moe__attn_sinks_backward(const moe__attn *a, const float *do_, float *dsinks, int nt);

/* x (n, d) = rows tokens[i] of the table (vocab, d); backward adds dx's rows into dtable. */
void moe__embed_forward(const float *table, const int32_t *tokens, int n, int d, float *x);
void moe__embed_backward(float *dtable, const int32_t *tokens, int n, int d, const float *dx);

/* Softmax cross-entropy of logits (n, V) against targets (n; < 0: ignored): returns the sum of the
 * losses and sets lse (n); *count gets the targets counted. Backward overwrites logits with the
 * gradient of scale * sum (scale = 1 / count for the mean), rows of ignored targets zero. */
double moe__xent_forward(const float *logits, const int32_t *targets, int n, int V, float *lse, int *count, int nt);
void moe__xent_backward(float *logits, const float *lse, const int32_t *targets, int n, int V, float scale, int nt);

/* Mixtral's load-balancing loss (HF load_balancing_loss_func): over the L layers' N tokens each,
 *   aux = E * sum_e F_e P_e,  F_e = assignments to e (all k slots) / (L N),  P_e = mean router probability.
 * Per layer the router probabilities are recomputed from its input xn (N, D) and gate weight (E, D).
 * sparse (gpt-oss): what transformers' GptOss hands that function as router logits are the router's
 * scores, z = the softmax of the k selected logits (x wg^T + bg) scattered into zeros, so its
 * probabilities are softmax(z) over the E experts (F_e still the k selected). */
typedef struct {
  int L, N, E, D, k;
  double *cnt, *psum; /* (E) each: assignments and probability sums over the layers so far */
  double rows;        /* L times the tokens the sums are over: L N, or over all ranks' tokens */
  int sparse;
} moe__lbl;
/* probs (N, E) = softmax(xn wg^T), or sparse the scores z of the selected experts (N, k) from
 * xn wg^T + bg; adds this layer's assignments and probabilities. */
moe_status moe__lbl_forward(moe__lbl *b, const float *xn, const float *wg, const float *bg, const int32_t *experts,
                            float *probs, int nt);
double moe__lbl_value(const moe__lbl *b);
/* coef * aux through one layer: dwg (E, D) +=, dbg (E) += (sparse) and dxn (N, D) += their gradients;
 * g (N, E) scratch. */
moe_status moe__lbl_backward(const moe__lbl *b, float coef, const float *xn, const float *wg, const int32_t *experts,
                             const float *probs, float *g, float *dwg, float *dbg, float *dxn, int nt);

#endif
