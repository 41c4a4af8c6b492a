/* Multi-head latent attention (mla.h). Training expands each head's key and value from the latent and
 * runs the model's causal attention over heads of qk_nope + qk_rope dimensions (the values padded with
 * zeros to that width, the queries scaled so that the kernel's 1/sqrt(width) becomes MLA's scale). A
 * cached decode never expands the cache: with W_k, W_v head h's rows of kv_b_proj, q_h . k_h =
 * (W_k^T q_nope_h) . latent + q_pe_h . k_pe and o_h = W_v (sum p latent), so the queries become
 * latent-width ones and every head attends to the one cached row [latent, k_pe] (multi-query). */
#include <math.h>
#include <string.h>

#include "base/arena.h"
#include "internal.h"
#include "kernels/gemm.h"
#include "kernels.h"
#include "mla.h"

#define LATENT_EPS 1e-6f /* q_a_layernorm and kv_a_layernorm: RMSNorm's default eps in both references */

typedef struct {
  int D, nh, qr, r, dr, dn, dv, dqk, ld; /* ld: a token's fused q, k, v row in training */
  float scale_fix;                        /* YaRN's softmax-scale correction, mscale^2 (1 without) */
} dims;

static dims dims_of(const moe_lm_config *c) {
  const moe_lm_mla *m = &c->mla;
  dims d = {c->moe.D, c->n_heads, m->q_lora_rank, m->kv_lora_rank, c->head_dim, m->qk_nope_dim, m->v_head_dim,
            m->qk_nope_dim + c->head_dim, 0, 1.0f};
  d.ld = 3 * d.nh * d.dqk;
  if (c->yarn.factor > 0 && c->yarn.mscale_all_dim != 0) {
    float ms = moe__yarn_mscale(c->yarn.factor, c->yarn.mscale_all_dim);
    d.scale_fix = ms * ms;
  }
  return d;
}

static moe__gemm gemm(bool ta, bool tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                      float beta, float *C, int ldc) {
  return (moe__gemm){ta, tb, M, N, K, 1.0f, beta, A, lda, B, ldb, C, ldc, false};
}

size_t moe__mla_numel(const moe_lm_config *c) {
  dims d = dims_of(c);
  size_t q = d.qr ? (size_t)d.qr * d.D + d.qr + (size_t)d.nh * d.dqk * d.qr : (size_t)d.nh * d.dqk * d.D;
  return q + (size_t)(d.r + d.dr) * d.D + d.r + (size_t)d.nh * (d.dn + d.dv) * d.r;
}

int moe__mla_out_dim(const moe_lm_config *c) { return c->n_heads * c->mla.v_head_dim; }

#define TAKE(ptr, n)                                                                                                  \
  do {                                                                                                                \
    if (base) (ptr) = (void *)(base + off);                                                                           \
    off += moe__arena_size((n) * 4);                                                                                  \
  } while (0)

size_t moe__mla_carve(const moe_lm_config *c, size_t N, int decode, moe__mla_acts *a, char *base) {
  dims d = dims_of(c);
  size_t off = 0, nh = (size_t)d.nh, lat = (size_t)d.r + d.dr;
  if (d.qr) {
    TAKE(a->qa, N * d.qr);
    TAKE(a->qan, N * d.qr);
    TAKE(a->rstd_q, N);
  }
  TAKE(a->kva, N * lat);
  TAKE(a->kvn, N * lat);
  TAKE(a->rstd_kv, N);
  if (!decode) TAKE(a->kvb, N * nh * (d.dn + d.dv));
  TAKE(a->qkv, N * nh * (decode ? d.dqk + lat : 3 * (size_t)d.dqk)); /* a decode's queries and absorbed ones */
  TAKE(a->o, N * nh * (decode ? lat : (size_t)d.dqk));
  TAKE(a->lse, N * nh);
  return off;
}

size_t moe__mla_work_carve(const moe_lm_config *c, size_t N, moe__mla_work *w, char *base) {
  dims d = dims_of(c);
  size_t off = 0, nh = (size_t)d.nh, lat = (size_t)d.r + d.dr;
  TAKE(w->dO, N * nh * d.dqk);
  TAKE(w->dqkv, N * 3 * nh * d.dqk);
  TAKE(w->dkvb, N * nh * (d.dn + d.dv));
  TAKE(w->dkvn, N * lat);
  TAKE(w->dkva, N * lat);
  if (d.qr) {
    TAKE(w->dqan, N * d.qr);
    TAKE(w->dqa, N * d.qr);
  }
  return off;
}
#undef TAKE

/* The queries (N, nh dqk) into q, rows ldq apart, before the rotary embedding. */
static moe_status project_q(const moe__mla_ctx *x, const dims *d, const moe__mla_w *w, moe__mla_acts *a,
                            const float *xn1, float *q, int ldq) {
  int N = x->N, qd = d->nh * d->dqk;
  if (!d->qr) {
    moe__gemm g = gemm(false, true, N, qd, d->D, xn1, d->D, w->q, d->D, 0.0f, q, ldq);
    return moe__gemm_run(&g, 1, x->nt);
  }
  moe__gemm g = gemm(false, true, N, d->qr, d->D, xn1, d->D, w->q_a, d->D, 0.0f, a->qa, d->qr);
  MOE_CHECK(moe__gemm_run(&g, 1, x->nt));
  moe__rmsnorm_forward(a->qa, w->q_a_ln, N, d->qr, LATENT_EPS, a->qan, a->rstd_q, x->nt);
  g = gemm(false, true, N, qd, d->qr, a->qan, d->qr, w->q_b, d->qr, 0.0f, q, ldq);
  return moe__gemm_run(&g, 1, x->nt);
}

/* kva and its normed latent in kvn (the key's part copied, not yet rotated). */
static moe_status project_latent(const moe__mla_ctx *x, const dims *d, const moe__mla_w *w, moe__mla_acts *a,
                                 const float *xn1) {
  int N = x->N, lat = d->r + d->dr;
  moe__gemm g = gemm(false, true, N, lat, d->D, xn1, d->D, w->kv_a, d->D, 0.0f, a->kva, lat);
  MOE_CHECK(moe__gemm_run(&g, 1, x->nt));
  memcpy(a->kvn, a->kva, (size_t)N * lat * 4);
  moe__rows rows = {N, d->r, 1, (size_t)lat};
  moe__rmsnorm_rows_forward(&rows, a->kva, w->kv_a_ln, LATENT_EPS, a->kvn, a->rstd_kv, x->nt);
  return MOE_OK;
}

/* The rotary spans: the rope part of each q head (rows ldq apart), and the shared key of a latent row. */
static moe__rope_span q_span(const moe_lm_config *c, const dims *d, int ldq) {
  return (moe__rope_span){ldq, d->nh, d->dqk, d->dn, d->dr, c->mla.rope_interleave};
}
static moe__rope_span k_span(const moe_lm_config *c, const dims *d) {
  return (moe__rope_span){d->r + d->dr, 1, 0, d->r, d->dr, c->mla.rope_interleave};
}

static void scale_rows(float *x, int n, int width, int ld, float s, int nt) {
  if (s == 1.0f) return;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < n; t++)
    for (int j = 0; j < width; j++) x[(size_t)t * ld + j] *= s;
}

static moe__attn train_attn(const moe__mla_ctx *x, const dims *d, const moe__mla_acts *a) {
  int qd = d->nh * d->dqk;
  return (moe__attn){x->B, x->T, 0, d->nh, d->nh, d->dqk, d->ld, d->ld, (size_t)x->T * d->ld,
                     a->qkv, a->qkv + qd, a->qkv + 2 * qd, a->o, a->lse, 0, NULL};
}

moe_status moe__mla_forward(const moe__mla_ctx *x, const moe__mla_w *w, moe__mla_acts *a, const float *xn1,
                            float *att) {
  dims d = dims_of(x->c);
  int N = x->N, nt = x->nt, nh = d.nh, dqk = d.dqk, lat = d.r + d.dr, kvw = d.dn + d.dv;
  MOE_CHECK(project_q(x, &d, w, a, xn1, a->qkv, d.ld));
  MOE_CHECK(project_latent(x, &d, w, a, xn1));
  moe__rope_span qs = q_span(x->c, &d, d.ld), ks = k_span(x->c, &d);
  moe__rope_rotate(&qs, a->qkv, x->B, x->T, 0, x->cos_t, x->sin_t, 0, nt);
  moe__rope_rotate(&ks, a->kvn, x->B, x->T, 0, x->cos_t, x->sin_t, 0, nt);
  scale_rows(a->qkv, N, nh * dqk, d.ld, d.scale_fix, nt);
  moe__gemm g = gemm(false, true, N, nh * kvw, d.r, a->kvn, lat, w->kv_b, d.r, 0.0f, a->kvb, nh * kvw);
  MOE_CHECK(moe__gemm_run(&g, 1, nt));
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < N; t++) { /* each head's key [k_nope, k_pe] and value [v, 0] */
    float *k = a->qkv + (size_t)t * d.ld + nh * dqk, *v = k + nh * dqk;
    const float *kb = a->kvb + (size_t)t * nh * kvw, *pe = a->kvn + (size_t)t * lat + d.r;
    for (int h = 0; h < nh; h++) {
      memcpy(k + h * dqk, kb + h * kvw, (size_t)d.dn * 4);
      memcpy(k + h * dqk + d.dn, pe, (size_t)d.dr * 4);
      memcpy(v + h * dqk, kb + h * kvw + d.dn, (size_t)d.dv * 4);
      memset(v + h * dqk + d.dv, 0, (size_t)(dqk - d.dv) * 4);
    }
  }
  moe__attn at = train_attn(x, &d, a);
  moe__attn_forward(&at, x->scratch, nt);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < N; t++)
    for (int h = 0; h < nh; h++)
      memcpy(att + ((size_t)t * nh + h) * d.dv, a->o + ((size_t)t * nh + h) * dqk, (size_t)d.dv * 4);
  return MOE_OK;
}

moe_status moe__mla_backward(const moe__mla_ctx *x, const moe__mla_w *w, const moe__mla_w *g, const moe__mla_acts *a,
                             moe__mla_work *k, const float *xn1, const float *datt, float *dxn1) {
  dims d = dims_of(x->c);
  int N = x->N, nt = x->nt, nh = d.nh, dqk = d.dqk, lat = d.r + d.dr, kvw = d.dn + d.dv, qd = nh * dqk;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < N; t++)
    for (int h = 0; h < nh; h++) {
      float *o = k->dO + ((size_t)t * nh + h) * dqk;
      memcpy(o, datt + ((size_t)t * nh + h) * d.dv, (size_t)d.dv * 4);
      memset(o + d.dv, 0, (size_t)(dqk - d.dv) * 4);
    }
  moe__attn at = train_attn(x, &d, a);
  moe__attn_backward(&at, k->dO, k->dqkv, k->dqkv + qd, k->dqkv + 2 * qd, x->scratch, nt);
  scale_rows(k->dqkv, N, qd, d.ld, d.scale_fix, nt);
  moe__rope_span qs = q_span(x->c, &d, d.ld), ks = k_span(x->c, &d);
  moe__rope_rotate(&qs, k->dqkv, x->B, x->T, 0, x->cos_t, x->sin_t, 1, nt);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < N; t++) { /* d kv_b's output from each head's key and value; d k_pe summed over heads */
    const float *dk = k->dqkv + (size_t)t * d.ld + qd, *dv = dk + qd;
    float *db = k->dkvb + (size_t)t * nh * kvw, *dpe = k->dkvn + (size_t)t * lat + d.r;
    memset(dpe, 0, (size_t)d.dr * 4);
    for (int h = 0; h < nh; h++) {
      memcpy(db + h * kvw, dk + h * dqk, (size_t)d.dn * 4);
      memcpy(db + h * kvw + d.dn, dv + h * dqk, (size_t)d.dv * 4);
      for (int j = 0; j < d.dr; j++) dpe[j] += dk[h * dqk + d.dn + j];
    }
  }
  moe__rope_rotate(&ks, k->dkvn, x->B, x->T, 0, x->cos_t, x->sin_t, 1, nt);
  moe__gemm gs[2] = {gemm(true, false, nh * kvw, d.r, N, k->dkvb, nh * kvw, a->kvn, lat, 1.0f, g->kv_b, d.r),
                     gemm(false, false, N, d.r, nh * kvw, k->dkvb, nh * kvw, w->kv_b, d.r, 0.0f, k->dkvn, lat)};
  MOE_CHECK(moe__gemm_run(gs, 2, nt));
  memset(k->dkva, 0, (size_t)N * lat * 4);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < N; t++) /* the key's part passes kv_a_layernorm by */
    memcpy(k->dkva + (size_t)t * lat + d.r, k->dkvn + (size_t)t * lat + d.r, (size_t)d.dr * 4);
  moe__rows rows = {N, d.r, 1, (size_t)lat};
  moe__rmsnorm_rows_backward(&rows, k->dkvn, a->kva, w->kv_a_ln, a->rstd_kv, k->dkva, g->kv_a_ln, nt);
  gs[0] = gemm(true, false, lat, d.D, N, k->dkva, lat, xn1, d.D, 1.0f, g->kv_a, d.D);
  gs[1] = gemm(false, false, N, d.D, lat, k->dkva, lat, w->kv_a, d.D, 0.0f, dxn1, d.D);
  MOE_CHECK(moe__gemm_run(gs, 2, nt));
  if (!d.qr) {
    gs[0] = gemm(true, false, qd, d.D, N, k->dqkv, d.ld, xn1, d.D, 1.0f, g->q, d.D);
    gs[1] = gemm(false, false, N, d.D, qd, k->dqkv, d.ld, w->q, d.D, 1.0f, dxn1, d.D);
    return moe__gemm_run(gs, 2, nt);
  }
  gs[0] = gemm(true, false, qd, d.qr, N, k->dqkv, d.ld, a->qan, d.qr, 1.0f, g->q_b, d.qr);
  gs[1] = gemm(false, false, N, d.qr, qd, k->dqkv, d.ld, w->q_b, d.qr, 0.0f, k->dqan, d.qr);
  MOE_CHECK(moe__gemm_run(gs, 2, nt));
  memset(k->dqa, 0, (size_t)N * d.qr * 4);
  moe__rmsnorm_backward(k->dqan, a->qa, w->q_a_ln, a->rstd_q, N, d.qr, k->dqa, g->q_a_ln, nt);
  gs[0] = gemm(true, false, d.qr, d.D, N, k->dqa, d.qr, xn1, d.D, 1.0f, g->q_a, d.D);
  gs[1] = gemm(false, false, N, d.D, d.qr, k->dqa, d.qr, w->q_a, d.D, 1.0f, dxn1, d.D);
  return moe__gemm_run(gs, 2, nt);
}

moe_status moe__mla_decode(const moe__mla_ctx *x, const moe__mla_w *w, moe__mla_acts *a, const float *xn1,
                           float *const *rows, const int *pos0, const int *row0, float *att) {
  dims d = dims_of(x->c);
  int N = x->N, nt = x->nt, nh = d.nh, qd = nh * d.dqk, lat = d.r + d.dr, kvw = d.dn + d.dv;
  int la = nh * lat; /* an absorbed query row: each head's latent-width query and its rope part */
  float *q = a->qkv, *qa = a->qkv + (size_t)N * qd;
  MOE_CHECK(project_q(x, &d, w, a, xn1, q, qd));
  MOE_CHECK(project_latent(x, &d, w, a, xn1));
  moe__rope_span qs = q_span(x->c, &d, qd), ks = k_span(x->c, &d);
  for (int b = 0; b < x->B; b++) {
    int T = row0[b + 1] - row0[b];
    moe__rope_rotate(&qs, q + (size_t)row0[b] * qd, 1, T, pos0[b], x->cos_t, x->sin_t, 0, nt);
    moe__rope_rotate(&ks, a->kvn + (size_t)row0[b] * lat, 1, T, pos0[b], x->cos_t, x->sin_t, 0, nt);
    memcpy(rows[b] + (size_t)pos0[b] * lat, a->kvn + (size_t)row0[b] * lat, (size_t)T * lat * 4);
  }
  moe__gemm g[nh];
  for (int h = 0; h < nh; h++) /* q_nope_h W_k,h: (N, dn) (dn, r) */
    g[h] = gemm(false, false, N, d.r, d.dn, q + h * d.dqk, qd, w->kv_b + (size_t)h * kvw * d.r, d.r, 0.0f,
                qa + h * lat, la);
  MOE_CHECK(moe__gemm_run(g, nh, nt));
  /* the kernel scales by 1/sqrt(lat); MLA's scale is scale_fix / sqrt(dqk) */
  float s = d.scale_fix * sqrtf((float)lat) / sqrtf((float)d.dqk);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < N; t++)
    for (int h = 0; h < nh; h++) {
      float *r = qa + (size_t)t * la + h * lat;
      memcpy(r + d.r, q + (size_t)t * qd + h * d.dqk + d.dn, (size_t)d.dr * 4);
      for (int j = 0; j < lat; j++) r[j] *= s;
    }
  for (int b = 0; b < x->B; b++) {
    moe__attn at = {1, row0[b + 1] - row0[b], pos0[b], nh, 1, lat, la, lat, 0, qa + (size_t)row0[b] * la, rows[b],
                    rows[b], a->o + (size_t)row0[b] * la, a->lse + (size_t)row0[b] * nh, 0, NULL};
    moe__attn_forward(&at, x->scratch, nt);
  }
  for (int h = 0; h < nh; h++) /* o_h's latent part through W_v,h: (N, r) (dv, r)^T */
    g[h] = gemm(false, true, N, d.dv, d.r, a->o + h * lat, la, w->kv_b + ((size_t)h * kvw + d.dn) * d.r, d.r, 0.0f,
                att + h * d.dv, nh * d.dv);
  return moe__gemm_run(g, nh, nt);
}
