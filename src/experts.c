/* The FFN experts: one FFN per expert over its group of rows (moe__groups: x in, y out), as grouped
 * GEMMs; and the expert source of the layer's own parameters (moe__experts_own).
 *   a1 = xs W1^T + b1, h = act(a1) (swiglu: h = silu(a1) * (xs W3^T)), out = h W2^T + b2.
 * Backward adds dW1, db1, dW2, db2 (and dW3) and yields dxs. Slices may be empty; static dispatch
 * passes padded slices of C rows. Backward reuses the forward's buffers once they are dead (h for
 * dh then da1, a3 for da3), so the workspace holds per row only what backward must read.
 * With cfg.dtype bf16 the GEMMs take bf16 copies of the weights and of their inputs (xs, h; in
 * backward dout, da1, da3), rounded once where they are made, and accumulate in fp32: the rest
 * (biases, activations, their derivatives, bias gradients) stays fp32. */
#include <math.h>
#include <string.h>

#include "gemm.h"
#include "layer_internal.h"

#define COLSUM_CHUNK 256

static int is_bf16(const moe_layer_t *l) { return l->cfg.dtype == MOE_DT_BF16; }

size_t moe__ffn_bytes(const moe_layer_t *l, int ng, int rows) {
  size_t r = (size_t)rows, H = (size_t)l->cfg.H, D = (size_t)l->cfg.D;
  int glu = l->cfg.act == MOE_ACT_SWIGLU;
  size_t fwd = (glu ? 3 : 2) * moe__arena_size(r * H * 4); /* a1 (a3) h; the caller owns gx and gout */
  if (is_bf16(l)) /* xb hb db (d3b) */
    fwd += 2 * moe__arena_size(r * D * 2) + (glu ? 2 : 1) * moe__arena_size(r * H * 2);
  size_t E = (size_t)ng; /* the GEMM list, the weights of each group, and the cache's bookkeeping */
  return fwd + moe__arena_size(3 * E * sizeof(moe__gemm)) + moe__arena_size(E * sizeof(moe__expert_w)) +
         moe__arena_size(E) + moe__arena_size(E * sizeof(int));
}

static inline float sigmoidf(float a) { return 1.0f / (1.0f + expf(-a)); }

static inline float act_f(moe_act act, float a) {
  switch (act) {
    case MOE_ACT_RELU: return a > 0 ? a : 0;
    case MOE_ACT_GELU: return 0.5f * a * (1.0f + erff(a * 0.70710678118654752f));
    default: return a * sigmoidf(a); /* silu, and the gate half of swiglu */
  }
}

static inline float act_df(moe_act act, float a) {
  switch (act) {
    case MOE_ACT_RELU: return a > 0 ? 1.0f : 0.0f;
    case MOE_ACT_GELU:
      return 0.5f * (1.0f + erff(a * 0.70710678118654752f)) +
             a * expf(-0.5f * a * a) * 0.39894228040143268f;
    default: {
      float sg = sigmoidf(a);
      return sg * (1.0f + a * (1.0f - sg));
    }
  }
}

/* dst[e, :] += sum of rows [offs[e], offs[e+1]) of src (rows, m); chunks of columns in parallel. */
static void colsum_add(float *dst, const float *src, const int32_t *offs, int E, int m, int nt) {
  int chunks = (m + COLSUM_CHUNK - 1) / COLSUM_CHUNK;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (int task = 0; task < E * chunks; task++) {
    int e = task / chunks, c0 = (task % chunks) * COLSUM_CHUNK;
    int c1 = c0 + COLSUM_CHUNK < m ? c0 + COLSUM_CHUNK : m;
    float *d = dst + (size_t)e * m;
    for (int r = offs[e]; r < offs[e + 1]; r++) {
      const float *row = src + (size_t)r * m;
      for (int c = c0; c < c1; c++) d[c] += row[c];
    }
  }
}

/* Adds expert e's bias (m) to each row of its slice of a (rows, m), for experts [e0, e1); `second`
 * picks fc2's bias over fc1's; a NULL bias adds nothing. */
static void add_bias(float *a, const moe__expert_w *w, int second, const int32_t *offs, int e0, int e1, int m,
                     int nt) {
  if (!(second ? w[e0].b2 : w[e0].b1)) return;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int r = offs[e0]; r < offs[e1]; r++) {
    int e = e0;
    while (offs[e + 1] <= r) e++;
    const float *b = second ? w[e].b2 : w[e].b1;
    float *row = a + (size_t)r * m;
    for (int c = 0; c < m; c++) row[c] += b[c];
  }
}

moe_status moe__ffn_alloc(moe_layer_t *l, int ng, int rows, moe__ffn *f) {
  int E = ng, H = l->cfg.H;
  moe__arena *a = &l->st->work;
  f->a1 = moe__arena_alloc(a, (size_t)rows * H * 4);
  f->a3 = l->cfg.act == MOE_ACT_SWIGLU ? moe__arena_alloc(a, (size_t)rows * H * 4) : NULL;
  f->h = moe__arena_alloc(a, (size_t)rows * H * 4);
  f->gemms = moe__arena_alloc(a, 3 * (size_t)E * sizeof *f->gemms);
  f->w = moe__arena_alloc(a, (size_t)E * sizeof(moe__expert_w));
  f->state = moe__arena_alloc(a, (size_t)E);
  f->order = moe__arena_alloc(a, (size_t)E * sizeof *f->order);
  MOE_TRY(f->gemms && f->order && (f->h || rows == 0), MOE_ERR_STATE, "internal: expert workspace too small");
  if (is_bf16(l)) {
    int D = l->cfg.D;
    f->xb = moe__arena_alloc(a, (size_t)rows * D * 2);
    f->db = moe__arena_alloc(a, (size_t)rows * D * 2);
    f->hb = moe__arena_alloc(a, (size_t)rows * H * 2);
    f->d3b = l->cfg.act == MOE_ACT_SWIGLU ? moe__arena_alloc(a, (size_t)rows * H * 2) : NULL;
    MOE_TRY(f->hb || rows == 0, MOE_ERR_STATE, "internal: expert workspace too small");
  }
  return MOE_OK;
}

/* A GEMM whose operands A and B are each given as an fp32 and a bf16 array and an offset: the layer's
 * dtype picks one (the other may be NULL). */
static moe__gemm gemm_of(bool bf, bool ta, bool tb, int M, int N, int K, float beta, const float *af,
                         const uint16_t *ab, size_t a0, int lda, const float *bf32, const uint16_t *bb, size_t b0,
                         int ldb, float *C, int ldc) {
  return (moe__gemm){ta, tb, M, N, K, 1.0f, beta, bf ? (const void *)(ab + a0) : (const void *)(af + a0), lda,
                     bf ? (const void *)(bb + b0) : (const void *)(bf32 + b0), ldb, C, ldc, bf};
}

moe__ffn moe__ffn_at(const moe_layer_t *l, const moe__ffn *f, int r) {
  size_t H = (size_t)l->cfg.H * r, D = (size_t)l->cfg.D * r;
  moe__ffn v = *f;
  v.a1 = f->a1 ? f->a1 + H : NULL;
  v.a3 = f->a3 ? f->a3 + H : NULL;
  v.h = f->h ? f->h + H : NULL;
  v.xb = f->xb ? f->xb + D : NULL;
  v.hb = f->hb ? f->hb + H : NULL;
  v.db = f->db ? f->db + D : NULL;
  v.d3b = f->d3b ? f->d3b + H : NULL;
  return v;
}

moe_status moe__ffn_forward(moe_layer_t *l, const moe__groups *gr, const moe__ffn *f, int e0, int e1,
                            const moe__expert_w *w, const moe__side_work *side) {
  int D = l->cfg.D, H = l->cfg.H, nt = l->st->threads;
  int glu = l->cfg.act == MOE_ACT_SWIGLU;
  bool bf = is_bf16(l);
  moe__gemm *g = f->gemms;
  const int32_t *offs = gr->offs;
  size_t lo = (size_t)offs[e0], hi = (size_t)offs[e1];
  if (bf) moe__to_bf16(f->xb + lo * D, gr->x + lo * D, (hi - lo) * D, nt);
  int n = 0;
  for (int e = e0; e < e1; e++) {
    int r0 = offs[e], m = offs[e + 1] - r0;
    g[n++] = gemm_of(bf, false, true, m, H, D, 0.0f, gr->x, f->xb, (size_t)r0 * D, D, w[e].w1, w[e].w1h, 0, D,
                     f->a1 + (size_t)r0 * H, H);
    if (glu)
      g[n++] = gemm_of(bf, false, true, m, H, D, 0.0f, gr->x, f->xb, (size_t)r0 * D, D, w[e].w3, w[e].w3h, 0, D,
                       f->a3 + (size_t)r0 * H, H);
  }
  MOE_CHECK(moe__gemm_run_fixed(g, n, nt, side));
  add_bias(f->a1, w, 0, offs, e0, e1, H, nt);
  moe_act act = l->cfg.act;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (size_t i = lo * H; i < hi * H; i++)
    f->h[i] = glu ? act_f(MOE_ACT_SILU, f->a1[i]) * f->a3[i] : act_f(act, f->a1[i]);
  if (bf) moe__to_bf16(f->hb + lo * H, f->h + lo * H, (hi - lo) * H, nt); /* a pass of its own: the loop above vectorizes */
  n = 0;
  for (int e = e0; e < e1; e++) {
    int r0 = offs[e], m = offs[e + 1] - r0;
    g[n++] = gemm_of(bf, false, true, m, D, H, 0.0f, f->h, f->hb, (size_t)r0 * H, H, w[e].w2, w[e].w2h, 0, H,
                     gr->y + (size_t)r0 * D, D);
  }
  MOE_CHECK(moe__gemm_run_fixed(g, n, nt, NULL));
  add_bias(gr->y, w, 1, offs, e0, e1, D, nt);
  return MOE_OK;
}

/* The bf16 copies of the expert weights, made again after the parameters changed. */
static void refresh_bf16(moe_layer_t *l) {
  moe__layer_state *s = l->st;
  if (!s->wbf_stale) return;
  for (int i = 0; i < l->nparams; i++) {
    const moe_param_info *p = &l->info[i];
    if (p->ndim == 3) /* experts.fc1/fc2/fc3.weight */
      moe__to_bf16(s->wbf + p->offset, l->params + p->offset, p->numel, s->threads);
  }
  s->wbf_stale = 0;
}

/* Expert e's weights in the layer's own parameters (and their bf16 copies). */
static moe__expert_w own_weights(const moe_layer_t *l, const moe__weights *w, int e) {
  size_t HD = (size_t)l->cfg.H * l->cfg.D, H = (size_t)l->cfg.H, D = (size_t)l->cfg.D;
  const uint16_t *wb = l->st->wbf;
  const float *p = l->params;
  moe__expert_w r = {w->w1 + e * HD, w->b1 ? w->b1 + e * H : NULL, w->w2 + e * HD, w->b2 ? w->b2 + e * D : NULL,
                     w->w3 ? w->w3 + e * HD : NULL, NULL, NULL, NULL};
  if (wb) {
    r.w1h = wb + (r.w1 - p);
    r.w2h = wb + (r.w2 - p);
    r.w3h = r.w3 ? wb + (r.w3 - p) : NULL;
  }
  return r;
}

static moe_status own_forward(moe_layer_t *l, const moe__groups *g, const moe__ffn *f,
                              const moe__side_work *side) {
  int E = g->n;
  if (is_bf16(l)) refresh_bf16(l);
  moe__weights w;
  moe__weights_bind(l, l->params, &w);
  moe__expert_w *ew = f->w;
  for (int e = 0; e < E; e++) ew[e] = own_weights(l, &w, e);
  return moe__ffn_forward(l, g, f, 0, E, ew, side);
}

static moe_status own_backward(moe_layer_t *l, const moe__groups *gr, const moe__ffn *f, const float *dout,
                               float daux, float dz, float *dxs) {
  (void)daux, (void)dz; /* FFN experts have no losses of their own */
  int E = gr->n, D = l->cfg.D, H = l->cfg.H, rows = gr->rows, nt = l->st->threads;
  int glu = l->cfg.act == MOE_ACT_SWIGLU;
  bool bf = is_bf16(l);
  const int32_t *offs = gr->offs;
  float *dh = f->h;   /* h is dead once dW2 is done: dh, then da1, in its place */
  float *da3 = f->a3; /* swiglu: da3 in place of a3, read just before */
  moe__gemm *g = f->gemms; /* from the forward */
  moe__weights w, gw;
  moe__weights_bind(l, l->params, &w);
  moe__weights_bind(l, l->grads, &gw);
  if (bf) moe__to_bf16(f->db, dout, (size_t)rows * D, nt);
  int n = 0;
  for (int e = 0; e < E; e++) {
    int r0 = offs[e], m = offs[e + 1] - r0;
    if (m == 0) continue; /* nothing to add (an expert of another micro-batch) */
    g[n++] = gemm_of(bf, true, false, D, H, m, 1.0f, dout, f->db, (size_t)r0 * D, D, f->h, f->hb, (size_t)r0 * H, H,
                     gw.w2 + (size_t)e * D * H, H); /* dW2 += dout^T h */
  }
  MOE_CHECK(moe__gemm_run_fixed(g, n, nt, NULL));
  n = 0;
  for (int e = 0; e < E; e++) {
    int r0 = offs[e], m = offs[e + 1] - r0;
    moe__expert_w ew = own_weights(l, &w, e);
    g[n++] = gemm_of(bf, false, false, m, H, D, 0.0f, dout, f->db, (size_t)r0 * D, D, ew.w2, ew.w2h, 0, H,
                     dh + (size_t)r0 * H, H); /* dh = dout W2 */
  }
  MOE_CHECK(moe__gemm_run_fixed(g, n, nt, NULL));
  if (gw.b2) colsum_add(gw.b2, dout, offs, E, D, nt);
  moe_act act = l->cfg.act;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (size_t i = 0; i < (size_t)rows * H; i++) {
    float a1 = f->a1[i];
    if (glu) {
      float a3 = f->a3[i];
      da3[i] = dh[i] * act_f(MOE_ACT_SILU, a1);
      dh[i] = dh[i] * a3 * act_df(MOE_ACT_SILU, a1);
    } else {
      dh[i] *= act_df(act, a1);
    }
  }
  if (bf) { /* hb is dead after dW2: da1 in its place */
    moe__to_bf16(f->hb, dh, (size_t)rows * H, nt);
    if (glu) moe__to_bf16(f->d3b, da3, (size_t)rows * H, nt);
  }
  if (gw.b1) colsum_add(gw.b1, dh, offs, E, H, nt);
  n = 0;
  for (int e = 0; e < E; e++) {
    int r0 = offs[e], m = offs[e + 1] - r0;
    if (m == 0) continue;
    size_t xr = (size_t)r0 * D, hr = (size_t)r0 * H;
    moe__expert_w ew = own_weights(l, &w, e);
    g[n++] = gemm_of(bf, true, false, H, D, m, 1.0f, dh, f->hb, hr, H, gr->x, f->xb, xr, D,
                     gw.w1 + (size_t)e * H * D, D); /* dW1 += da1^T xs */
    if (glu)
      g[n++] = gemm_of(bf, true, false, H, D, m, 1.0f, da3, f->d3b, hr, H, gr->x, f->xb, xr, D,
                       gw.w3 + (size_t)e * H * D, D); /* dW3 += da3^T xs */
    g[n++] = gemm_of(bf, false, false, m, D, H, 0.0f, dh, f->hb, hr, H, ew.w1, ew.w1h, 0, D, dxs + xr,
                     D); /* dxs = da1 W1 */
  }
  MOE_CHECK(moe__gemm_run_fixed(g, n, nt, NULL));
  if (glu) {
    n = 0;
    for (int e = 0; e < E; e++) {
      int r0 = offs[e], m = offs[e + 1] - r0;
      moe__expert_w ew = own_weights(l, &w, e);
      g[n++] = gemm_of(bf, false, false, m, D, H, 1.0f, da3, f->d3b, (size_t)r0 * H, H, ew.w3, ew.w3h, 0, D,
                       dxs + (size_t)r0 * D, D); /* += da3 W3 */
    }
    MOE_CHECK(moe__gemm_run_fixed(g, n, nt, NULL));
  }
  return MOE_OK;
}

const moe__expert_src moe__experts_own = {"own", 1, moe__ffn_bytes, moe__ffn_alloc, own_forward, own_backward};
