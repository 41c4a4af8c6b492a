/* The FFN experts: one FFN per expert over its group of rows (moe__groups: x in, y out), each expert
 * whole on one thread or as grouped GEMMs (see "Whole experts"); and the expert source of the layer's own parameters (moe__experts_own).
 *   a1 = xs W1^T + b1, h = act(a1) (swiglu: h = silu(a1) * (xs W3^T); swiglu_oai: of a1 and
 *   a3 = xs W3^T + b3), out = h W2^T + b2.
 * Backward adds dW1, db1, dW2, db2 (and dW3, db3) and yields dxs. Slices may be empty; static dispatch
 * passes padded slices of C rows. Backward reuses the forward's buffers once they are dead (h for
 * dh then da1, a3 for da3), so the workspace holds per row only what backward must read.
 * With cfg.dtype bf16 the GEMMs take bf16 copies of the weights and of their inputs (xs, h; in
 * backward dout, da1, da3), rounded once where they are made, and accumulate in fp32: the rest
 * (biases, activations, their derivatives, bias gradients) stays fp32. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/act.h"
#include "kernels/gemm.h"
#include "layer/plugins.h"

#define COLSUM_CHUNK 256

static int is_bf16(const moe_layer_t *l) { return l->cfg.dtype == MOE_DT_BF16; }

/* The source's state: the bf16 copies of the expert weights (cfg.dtype bf16; NULL otherwise), at the
 * parameters' offsets, made again before a forward after the parameters changed. */
typedef struct {
  uint16_t *wbf;
  int stale;
} ffn_self;

static moe_status own_init(const moe_layer_t *l, void *transport, void **self) {
  (void)transport;
  ffn_self *o = calloc(1, sizeof *o);
  MOE_TRY(o, MOE_ERR_NOMEM, "moe_layer_init: out of memory");
  *self = o;
  if (is_bf16(l) && moe_layer_param_find(l, "experts.fc1.weight")) {
    o->wbf = moe__alloc_big(l->numel * 2);
    o->stale = 1;
    MOE_TRY(o->wbf, MOE_ERR_NOMEM, "moe_layer_init: cannot allocate bf16 copies of %zu parameters", l->numel);
  }
  return MOE_OK;
}

static void own_free(void *self) {
  ffn_self *o = self;
  if (o) free(o->wbf);
  free(o);
}

static void own_params_changed(void *self) { ((ffn_self *)self)->stale = 1; }

size_t moe__ffn_bytes(void *self, const moe__env *env, int ng, int rows) {
  (void)self;
  const moe_layer_t *l = env->l;
  size_t r = (size_t)rows, H = (size_t)l->cfg.H, D = (size_t)l->cfg.D;
  int glu = moe__act_gated(l->cfg.act);
  size_t fwd = (glu ? 3 : 2) * moe__arena_size(r * H * 4); /* a1 (a3) h; the caller owns gx and gout */
  if (is_bf16(l)) /* xb hb db (d3b) */
    fwd += 2 * moe__arena_size(r * D * 2) + (glu ? 2 : 1) * moe__arena_size(r * H * 2);
  size_t E = (size_t)ng; /* the GEMM list, the weights of each group, and the cache's bookkeeping */
  return fwd + moe__arena_size(3 * E * sizeof(moe__gemm)) + moe__arena_size(E * sizeof(moe__expert_w)) +
         moe__arena_size(E) + moe__arena_size(E * sizeof(int));
}

/* d[c] += the sum over rows [r0, r1) of src (rows m apart), for columns [c0, c1), row by row. */
static void colsum_rows(float *d, const float *src, int r0, int r1, int c0, int c1, int m) {
  for (int r = r0; r < r1; r++) {
    const float *row = src + (size_t)r * m;
    for (int c = c0; c < c1; c++) d[c] += row[c];
  }
}

moe_status moe__ffn_alloc(void *self, const moe__env *env, int ng, int rows, moe__ffn *f) {
  (void)self;
  const moe_layer_t *l = env->l;
  int E = ng, H = l->cfg.H;
  moe__arena *a = env->work;
  f->a1 = moe__arena_alloc(a, (size_t)rows * H * 4);
  f->a3 = moe__act_gated(l->cfg.act) ? moe__arena_alloc(a, (size_t)rows * H * 4) : NULL;
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
    f->d3b = moe__act_gated(l->cfg.act) ? moe__arena_alloc(a, (size_t)rows * H * 2) : NULL;
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

/* Expert e's weights in the layer's own parameters (and their bf16 copies). */
static moe__expert_w own_weights(const moe_layer_t *l, const uint16_t *wb, const moe__weights *w, int e) {
  size_t HD = (size_t)l->cfg.H * l->cfg.D, H = (size_t)l->cfg.H, D = (size_t)l->cfg.D;
  const float *p = l->params;
  moe__expert_w r = {w->w1 + e * HD, w->b1 ? w->b1 + e * H : NULL, w->w2 + e * HD, w->b2 ? w->b2 + e * D : NULL,
                     w->w3 ? w->w3 + e * HD : NULL, NULL, NULL, NULL, w->b3 ? w->b3 + e * H : NULL};
  if (wb) {
    r.w1h = wb + (r.w1 - p);
    r.w2h = wb + (r.w2 - p);
    r.w3h = r.w3 ? wb + (r.w3 - p) : NULL;
  }
  return r;
}

/* Expert e's forward GEMMs of stage 0 (fc1, and fc3 for swiglu) or 1 (fc2), weights w; returns how many. */
static int fwd_gemms(const moe_layer_t *l, const moe__groups *gr, const moe__ffn *f, const moe__expert_w *w, int e,
                     int stage, moe__gemm *g) {
  int D = l->cfg.D, H = l->cfg.H, r0 = gr->offs[e], m = gr->offs[e + 1] - r0;
  bool bf = is_bf16(l);
  size_t xr = (size_t)r0 * D, hr = (size_t)r0 * H;
  if (stage == 1) {
    g[0] = gemm_of(bf, false, true, m, D, H, 0.0f, f->h, f->hb, hr, H, w->w2, w->w2h, 0, H, gr->y + xr, D);
    return 1;
  }
  g[0] = gemm_of(bf, false, true, m, H, D, 0.0f, gr->x, f->xb, xr, D, w->w1, w->w1h, 0, D, f->a1 + hr, H);
  if (!moe__act_gated(l->cfg.act)) return 1;
  g[1] = gemm_of(bf, false, true, m, H, D, 0.0f, gr->x, f->xb, xr, D, w->w3, w->w3h, 0, D, f->a3 + hr, H);
  return 2;
}

/* Whole experts. An expert whose GEMMs moe__gemm_run_fixed would each run as one tile (fp32) is one work
 * item: its GEMMs one after the other on one thread, its biases, activation and bias gradients on its
 * rows between them while they are in cache. At case L (64 experts of 64 rows) this takes the place of
 * a schedule per GEMM and a parallel pass over all rows between each two (eleven parallel regions a
 * step, and the passes' memory traffic). The bits are those of the pass-by-pass schedule, which the experts with
 * cut GEMMs (and bf16, whose copies are made over all rows at once) keep. */
typedef struct {
  const moe_layer_t *l;
  int threads;
  const uint16_t *wbf;        /* backward: the bf16 copies of the weights, or NULL */
  const moe__groups *gr;
  const moe__ffn *f;
  const moe__expert_w *w;     /* forward: the experts' weights */
  const float *dout;          /* backward */
  float *dxs;
  moe__weights pw, gw;        /* backward: the parameters, the gradients */
  int e0, e1, bwd;            /* the experts [e0, e1) */
  const moe__side_work *side; /* the caller's items: run first */
} ffn_ctx;

/* Expert e's backward GEMMs of stage 0 (dW2), 1 (dh), 2 (dW1, dW3, dxs) or 3 (swiglu: dxs += da3 W3);
 * none for an expert without rows. */
static int bwd_gemms(const ffn_ctx *c, int e, int stage, moe__gemm *g) {
  const moe_layer_t *l = c->l;
  const moe__ffn *f = c->f;
  int D = l->cfg.D, H = l->cfg.H, r0 = c->gr->offs[e], m = c->gr->offs[e + 1] - r0;
  int glu = moe__act_gated(l->cfg.act), n = 0;
  if (m == 0) return 0; /* nothing to add (an expert of another micro-batch) */
  bool bf = is_bf16(l);
  size_t xr = (size_t)r0 * D, hr = (size_t)r0 * H;
  const float *dout = c->dout, *x = c->gr->x;
  float *dh = f->h;   /* h is dead once dW2 is done: dh, then da1, in its place */
  float *da3 = f->a3; /* swiglu: da3 in place of a3, read just before */
  moe__expert_w ew = own_weights(l, c->wbf, &c->pw, e);
  switch (stage) {
    case 0: /* dW2 += dout^T h */
      g[n++] = gemm_of(bf, true, false, D, H, m, 1.0f, dout, f->db, xr, D, f->h, f->hb, hr, H,
                       c->gw.w2 + (size_t)e * D * H, H);
      break;
    case 1: /* dh = dout W2 */
      g[n++] = gemm_of(bf, false, false, m, H, D, 0.0f, dout, f->db, xr, D, ew.w2, ew.w2h, 0, H, dh + hr, H);
      break;
    case 2: /* dW1 += da1^T xs (dW3 += da3^T xs), dxs = da1 W1 */
      g[n++] = gemm_of(bf, true, false, H, D, m, 1.0f, dh, f->hb, hr, H, x, f->xb, xr, D, c->gw.w1 + (size_t)e * H * D, D);
      if (glu)
        g[n++] = gemm_of(bf, true, false, H, D, m, 1.0f, da3, f->d3b, hr, H, x, f->xb, xr, D,
                         c->gw.w3 + (size_t)e * H * D, D);
      g[n++] = gemm_of(bf, false, false, m, D, H, 0.0f, dh, f->hb, hr, H, ew.w1, ew.w1h, 0, D, c->dxs + xr, D);
      break;
    default: /* dxs += da3 W3 */
      if (glu)
        g[n++] = gemm_of(bf, false, false, m, D, H, 1.0f, da3, f->d3b, hr, H, ew.w3, ew.w3h, 0, D, c->dxs + xr, D);
  }
  return n;
}

static int all_whole(const moe__gemm *g, int n) {
  for (int i = 0; i < n; i++)
    if (!moe__gemm_fixed_whole(&g[i])) return 0;
  return 1;
}

/* Whether expert e runs whole (in the pass's direction). */
static int whole(const ffn_ctx *c, int e) {
  if (is_bf16(c->l)) return 0;
  moe__gemm g[6];
  int n = 0;
  for (int s = 0; s < (c->bwd ? 4 : 2); s++)
    n += c->bwd ? bwd_gemms(c, e, s, g + n) : fwd_gemms(c->l, c->gr, c->f, &c->w[e], e, s, g + n);
  return all_whole(g, n);
}

/* a[r, :] += b for rows [r0, r1) of a (rows m apart); nothing for a NULL bias. */
static void add_rows(float *a, const float *b, int r0, int r1, int m) {
  if (!b) return;
  for (int r = r0; r < r1; r++) {
    float *row = a + (size_t)r * m;
    for (int c = 0; c < m; c++) row[c] += b[c];
  }
}

/* Rows [r0, r1): h = act(a1) (swiglu: silu(a1) * a3). */
static void fwd_act(const moe_layer_t *l, const moe__ffn *f, int r0, int r1) {
  size_t H = (size_t)l->cfg.H, a = (size_t)r0 * H;
  moe__act_cfg_forward(&l->cfg, f->a1 + a, f->a3 ? f->a3 + a : NULL, f->h + a, (size_t)(r1 - r0) * H);
}

/* Rows [r0, r1) of backward through the activation: dh (in h's place) to da1, and da3 (swiglu). */
static void bwd_act(const moe_layer_t *l, const moe__ffn *f, int r0, int r1) {
  size_t H = (size_t)l->cfg.H, a = (size_t)r0 * H;
  moe__act_cfg_backward(&l->cfg, f->a1 + a, f->a3 ? f->a3 + a : NULL, f->h + a, (size_t)(r1 - r0) * H);
}

static void run_gemms(const moe__gemm *g, int n) {
  for (int i = 0; i < n; i++) moe__gemm_one(&g[i]); /* fp32: cannot fail */
}

/* Expert e's whole forward or backward (nothing for one that does not run whole). */
static void whole_expert(const ffn_ctx *c, int e) {
  const moe_layer_t *l = c->l;
  const moe__ffn *f = c->f;
  int D = l->cfg.D, H = l->cfg.H, r0 = c->gr->offs[e], r1 = c->gr->offs[e + 1];
  if (r1 == r0 || !whole(c, e)) return;
  moe__gemm g[3];
  if (!c->bwd) {
    const moe__expert_w *w = &c->w[e];
    run_gemms(g, fwd_gemms(l, c->gr, f, w, e, 0, g));
    add_rows(f->a1, w->b1, r0, r1, H);
    if (f->a3) add_rows(f->a3, w->b3, r0, r1, H);
    fwd_act(l, f, r0, r1);
    run_gemms(g, fwd_gemms(l, c->gr, f, w, e, 1, g));
    add_rows(c->gr->y, w->b2, r0, r1, D);
    return;
  }
  run_gemms(g, bwd_gemms(c, e, 0, g));
  run_gemms(g, bwd_gemms(c, e, 1, g));
  if (c->gw.b2) colsum_rows(c->gw.b2 + (size_t)e * D, c->dout, r0, r1, 0, D, D);
  bwd_act(l, f, r0, r1);
  if (c->gw.b1) colsum_rows(c->gw.b1 + (size_t)e * H, f->h, r0, r1, 0, H, H);
  if (c->gw.b3) colsum_rows(c->gw.b3 + (size_t)e * H, f->a3, r0, r1, 0, H, H);
  run_gemms(g, bwd_gemms(c, e, 2, g));
  run_gemms(g, bwd_gemms(c, e, 3, g));
}

/* Side item i: the caller's first, then expert e0 + i - (their count). */
static void side_item(void *ctx, int i) {
  const ffn_ctx *c = ctx;
  int ns = c->side ? c->side->n : 0;
  if (i < ns)
    c->side->run(c->side->ctx, i);
  else
    whole_expert(c, c->e0 + i - ns);
}

/* The passes between the GEMMs of the experts that do not run whole, over units of rows or of columns. */
enum { P_BIAS1, P_ACT, P_BIAS2, P_DB2, P_DACT, P_DB1, P_DB3 };
#define PASS_ROWS 16

static void pass_unit(const ffn_ctx *c, int kind, int e, int u) {
  const moe_layer_t *l = c->l;
  const moe__ffn *f = c->f;
  int D = l->cfg.D, H = l->cfg.H, r0 = c->gr->offs[e], r1 = c->gr->offs[e + 1];
  int c0 = u * COLSUM_CHUNK, a = r0 + u * PASS_ROWS, b = a + PASS_ROWS < r1 ? a + PASS_ROWS : r1;
  switch (kind) {
    case P_BIAS1:
      add_rows(f->a1, c->w[e].b1, a, b, H);
      if (f->a3) add_rows(f->a3, c->w[e].b3, a, b, H);
      break;
    case P_ACT: fwd_act(l, f, a, b); break;
    case P_BIAS2: add_rows(c->gr->y, c->w[e].b2, a, b, D); break;
    case P_DB2: colsum_rows(c->gw.b2 + (size_t)e * D, c->dout, r0, r1, c0, c0 + COLSUM_CHUNK < D ? c0 + COLSUM_CHUNK : D, D); break;
    case P_DACT: bwd_act(l, f, a, b); break;
    case P_DB1: colsum_rows(c->gw.b1 + (size_t)e * H, f->h, r0, r1, c0, c0 + COLSUM_CHUNK < H ? c0 + COLSUM_CHUNK : H, H); break;
    default: colsum_rows(c->gw.b3 + (size_t)e * H, f->a3, r0, r1, c0, c0 + COLSUM_CHUNK < H ? c0 + COLSUM_CHUNK : H, H);
  }
}

/* One parallel pass of `kind` over the experts that do not run whole. */
static void pass(const ffn_ctx *c, int kind) {
  int cols = kind == P_DB2 ? c->l->cfg.D : kind == P_DB1 || kind == P_DB3 ? c->l->cfg.H : 0;
#pragma omp parallel num_threads(c->threads)
  for (int e = c->e0; e < c->e1; e++) {
    if (whole(c, e)) continue;
    int m = c->gr->offs[e + 1] - c->gr->offs[e];
    int units = cols ? (m ? (cols + COLSUM_CHUNK - 1) / COLSUM_CHUNK : 0) : (m + PASS_ROWS - 1) / PASS_ROWS;
#pragma omp for schedule(dynamic, 1) nowait
    for (int u = 0; u < units; u++) pass_unit(c, kind, e, u);
  }
}

/* The GEMMs of stage s of the experts that do not run whole, with the whole experts (and the caller's
 * side items) as side work when `items`; *ran: how many GEMMs ran. */
static moe_status run_stage(const ffn_ctx *c, int s, int items, int *ran) {
  moe__gemm *g = c->f->gemms;
  int n = 0, e0 = c->e0, e1 = c->e1;
  for (int e = e0; e < e1; e++)
    if (!whole(c, e)) n += c->bwd ? bwd_gemms(c, e, s, g + n) : fwd_gemms(c->l, c->gr, c->f, &c->w[e], e, s, g + n);
  moe__side_work side = {side_item, (void *)c, (c->side ? c->side->n : 0) + (e1 - e0)};
  *ran = n;
  if (!n && !items) return MOE_OK;
  return moe__gemm_run_fixed(g, n, c->threads, items ? &side : NULL);
}

moe_status moe__ffn_forward(const moe__env *env, const moe__groups *gr, const moe__ffn *f, int e0, int e1,
                            const moe__expert_w *w, const moe__side_work *side) {
  const moe_layer_t *l = env->l;
  int D = l->cfg.D, H = l->cfg.H, nt = env->threads, n;
  bool bf = is_bf16(l);
  size_t lo = (size_t)gr->offs[e0], hi = (size_t)gr->offs[e1];
  if (bf) moe__to_bf16(f->xb + lo * D, gr->x + lo * D, (hi - lo) * D, nt);
  ffn_ctx c = {.l = l, .threads = nt, .gr = gr, .f = f, .w = w, .e0 = e0, .e1 = e1, .side = side};
  MOE_CHECK(run_stage(&c, 0, 1, &n));
  if (!n) return MOE_OK; /* every expert ran whole */
  pass(&c, P_BIAS1);
  pass(&c, P_ACT);
  if (bf) moe__to_bf16(f->hb + lo * H, f->h + lo * H, (hi - lo) * H, nt); /* bf16: no expert runs whole */
  MOE_CHECK(run_stage(&c, 1, 0, &n));
  pass(&c, P_BIAS2);
  return MOE_OK;
}

/* The bf16 copies of the expert weights, made again after the parameters changed. */
static void refresh_bf16(ffn_self *o, const moe_layer_t *l, int threads) {
  if (!o->stale) return;
  for (int i = 0; i < l->nparams; i++) {
    const moe_param_info *p = &l->info[i];
    if (p->ndim == 3) /* experts.fc1/fc2/fc3.weight */
      moe__to_bf16(o->wbf + p->offset, l->params + p->offset, p->numel, threads);
  }
  o->stale = 0;
}

static moe_status own_forward(void *self, const moe__env *env, const moe__plan *p, const moe__groups *g,
                              const moe__ffn *f, const moe__side_work *side) {
  (void)p;
  ffn_self *o = self;
  const moe_layer_t *l = env->l;
  int E = g->n;
  if (is_bf16(l)) refresh_bf16(o, l, env->threads);
  moe__weights w;
  moe__weights_bind(l, l->params, &w);
  moe__expert_w *ew = f->w;
  for (int e = 0; e < E; e++) ew[e] = own_weights(l, o->wbf, &w, e);
  return moe__ffn_forward(env, g, f, 0, E, ew, side);
}

static moe_status own_backward(void *self, const moe__env *env, const moe__plan *p, const moe__groups *gr,
                               const moe__ffn *f, const float *dout, float daux, float dz, float *dxs) {
  (void)p, (void)daux, (void)dz; /* FFN experts have no losses of their own */
  const ffn_self *o = self;
  const moe_layer_t *l = env->l;
  int D = l->cfg.D, H = l->cfg.H, rows = gr->rows, nt = env->threads, n;
  bool bf = is_bf16(l);
  ffn_ctx c = {.l = l, .threads = nt, .wbf = o->wbf, .gr = gr, .f = f, .dout = dout, .dxs = dxs, .e1 = gr->n,
               .bwd = 1};
  moe__weights_bind(l, l->params, &c.pw);
  moe__weights_bind(l, l->grads, &c.gw);
  if (bf) moe__to_bf16(f->db, dout, (size_t)rows * D, nt);
  MOE_CHECK(run_stage(&c, 0, 1, &n));
  if (!n) return MOE_OK; /* every expert ran whole (or had no rows) */
  MOE_CHECK(run_stage(&c, 1, 0, &n));
  if (c.gw.b2) pass(&c, P_DB2);
  pass(&c, P_DACT);
  if (bf) { /* no expert runs whole; hb is dead after dW2: da1 in its place */
    moe__to_bf16(f->hb, f->h, (size_t)rows * H, nt);
    if (f->d3b) moe__to_bf16(f->d3b, f->a3, (size_t)rows * H, nt);
  }
  if (c.gw.b1) pass(&c, P_DB1);
  if (c.gw.b3) pass(&c, P_DB3);
  MOE_CHECK(run_stage(&c, 2, 0, &n));
  return run_stage(&c, 3, 0, &n);
}

const moe__expert_src moe__experts_own = {"own",          1,              own_init,    own_free,     own_params_changed,
                                          moe__ffn_bytes, moe__ffn_alloc, own_forward, own_backward, NULL};
