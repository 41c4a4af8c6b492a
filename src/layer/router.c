/* The router: logits (linear or cosine), softmax, top-k with optional renormalization, the GShard
 * balance loss and the z-loss, forward and backward. Capacity and placement are in placement.c. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "dist/dist.h"
#include "kernels/gemm.h"
#include "layer/layer_internal.h"

#define COS_EPS 1e-12f
#define LOG_MAX_SCALE 4.605170185988091f /* ln 100: the logit scale is clamped at 100 */
#define GATE_ROWS 64 /* tokens per router work item: fixed, so the bits do not depend on the threads */

static int gate_chunks(int T) { return (T + GATE_ROWS - 1) / GATE_ROWS; }

size_t moe__gate_bytes(const moe_layer_t *l, int T, int k) {
  size_t E = (size_t)l->cfg.E, P = (size_t)l->cfg.proj_dim, t = (size_t)T, tk = t * (size_t)k;
  size_t b = 0;
  b += 3 * moe__arena_size(t * E * 4);             /* logits, probs, dprobs */
  b += moe__arena_size(t * 4) * 2;                 /* lse, order */
  b += moe__arena_size(t * 8);                     /* placement.c: priority sort keys */
  b += moe__arena_size((size_t)(gate_chunks(T) + 1) * (2 * E + 2) * sizeof(double)); /* loss sums */
  b += 6 * moe__arena_size(tk * 4);                /* top_e, top_p, top_w, row, dw, fresh */
  b += 6 * moe__arena_size((E + 1) * 4);           /* counts, kept, offs, fill, frac1, cap */
  if (l->cfg.router == MOE_ROUTER_COSINE)          /* proj, dproj, norms, emb, demb */
    b += 2 * moe__arena_size(t * P * 4) + moe__arena_size(t * 4) + 2 * moe__arena_size(E * P * 4) +
         moe__arena_size(E * 4);
  return b;
}

/* L2 normalization of a row (m) in place; returns its norm, kept for backward. */
static float normalize_row(float *r, int m) {
  double s = 0;
  for (int j = 0; j < m; j++) s += (double)r[j] * r[j];
  float nrm = (float)sqrt(s);
  float inv = 1.0f / (nrm > COS_EPS ? nrm : COS_EPS);
  for (int j = 0; j < m; j++) r[j] *= inv;
  return nrm;
}

/* Backward of normalize_row over n rows: g (n, m) holds d(normalized) on entry and d(raw) on exit. */
static void normalize_rows_backward(float *g, const float *a, const float *norms, int n, int m,
                                    int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int i = 0; i < n; i++) {
    float *gr = g + (size_t)i * m;
    const float *ar = a + (size_t)i * m;
    if (norms[i] > COS_EPS) {
      double dot = 0;
      for (int j = 0; j < m; j++) dot += (double)gr[j] * ar[j];
      float inv = 1.0f / norms[i];
      for (int j = 0; j < m; j++) gr[j] = (gr[j] - ar[j] * (float)dot) * inv;
    } else {
      for (int j = 0; j < m; j++) gr[j] /= COS_EPS;
    }
  }
}

static float cosine_scale(const moe__weights *w) {
  float s = w->scale[0];
  return expf(s < LOG_MAX_SCALE ? s : LOG_MAX_SCALE);
}

/* Logits of tokens [t0, t0 + n) on the calling thread. The cosine router's expert embeddings are
 * normalized before (moe__gate_begin). */
static void compute_logits(moe_layer_t *l, const moe__weights *w, const float *x, int t0, int n) {
  moe__layer_state *s = l->st;
  int D = l->cfg.D, E = l->cfg.E, P = l->cfg.proj_dim;
  x += (size_t)t0 * D;
  float *logits = s->r.logits + (size_t)t0 * E;
  if (l->cfg.router == MOE_ROUTER_LINEAR) {
    if (w->gb)
      for (int t = 0; t < n; t++) memcpy(logits + (size_t)t * E, w->gb, (size_t)E * 4);
    moe__gemm g = {false, true, n, E, D, 1.0f, w->gb ? 1.0f : 0.0f, x, D, w->gw, D, logits, E, false};
    moe__gemm_one(&g);
    return;
  }
  float *proj = s->r.proj + (size_t)t0 * P;
  for (int t = 0; t < n; t++) memcpy(proj + (size_t)t * P, w->pb, (size_t)P * 4);
  moe__gemm g = {false, true, n, P, D, 1.0f, 1.0f, x, D, w->pw, D, proj, P, false};
  moe__gemm_one(&g);
  for (int t = 0; t < n; t++) s->r.proj_norm[t0 + t] = normalize_row(proj + (size_t)t * P, P);
  moe__gemm c = {false, true, n, E, P, cosine_scale(w), 0.0f, proj, P, s->r.emb, P, logits, E, false};
  moe__gemm_one(&c);
}

/* Softmax and top-k (ties to the lower id, slot 0 largest) of one token. */
static void route_token(const float *logit, float *prob, float *lse, int E, int k, int32_t *te, float *tp) {
  float mx = -INFINITY;
  for (int e = 0; e < E; e++) mx = logit[e] > mx ? logit[e] : mx;
  double sum = 0;
  for (int e = 0; e < E; e++) { /* one exp per entry (the router's main cost at large E), summed in double */
    prob[e] = expf(logit[e] - mx);
    sum += prob[e];
  }
  *lse = mx + (float)log(sum);
  for (int e = 0; e < E; e++) prob[e] = (float)(prob[e] / sum);
  for (int j = 0; j < k; j++) { /* k passes of selection: k is small */
    int best = -1;
    for (int e = 0; e < E; e++) {
      int taken = 0;
      for (int i = 0; i < j; i++) taken |= te[i] == e;
      if (!taken && (best < 0 || prob[e] > prob[best])) best = e;
    }
    te[j] = best;
    tp[j] = prob[best];
  }
}

moe_status moe__gate_begin(moe_layer_t *l, const float *x, int T, int k) {
  moe__layer_state *s = l->st;
  int E = l->cfg.E, P = l->cfg.proj_dim;
  moe__arena *a = &s->route;
  size_t te = (size_t)T * E, tk = (size_t)T * k;
  s->r.logits = moe__arena_alloc(a, te * 4);
  s->r.probs = moe__arena_alloc(a, te * 4);
  s->r.lse = moe__arena_alloc(a, (size_t)T * 4);
  s->r.order = moe__arena_alloc(a, (size_t)T * 4);
  s->p.top_e = moe__arena_alloc(a, tk * 4);
  s->r.top_p = moe__arena_alloc(a, tk * 4);
  s->p.top_w = moe__arena_alloc(a, tk * 4);
  s->p.row = moe__arena_alloc(a, tk * 4);
  s->r.fresh = moe__arena_alloc(a, tk * 4);
  s->p.counts = moe__arena_alloc(a, (size_t)(E + 1) * 4);
  s->p.kept = moe__arena_alloc(a, (size_t)(E + 1) * 4);
  s->p.offs = moe__arena_alloc(a, (size_t)(E + 1) * 4);
  s->r.fill = moe__arena_alloc(a, (size_t)(E + 1) * 4);
  s->r.frac1 = moe__arena_alloc(a, (size_t)(E + 1) * 4);
  s->p.cap = moe__arena_alloc(a, (size_t)(E + 1) * 4);
  s->r.acc = moe__arena_alloc(a, (size_t)(gate_chunks(T) + 1) * (2 * E + 2) * sizeof(double));
  if (l->cfg.router == MOE_ROUTER_COSINE) {
    s->r.proj = moe__arena_alloc(a, (size_t)T * P * 4);
    s->r.proj_norm = moe__arena_alloc(a, (size_t)T * 4);
    s->r.emb = moe__arena_alloc(a, (size_t)E * P * 4);
    s->r.emb_norm = moe__arena_alloc(a, (size_t)E * 4);
  }
  MOE_TRY(s->r.acc && (l->cfg.router != MOE_ROUTER_COSINE || s->r.emb_norm), MOE_ERR_STATE,
          "internal: router workspace too small");
  s->r.x = x;
  s->p.T = T;
  s->p.k = k;
  moe__weights_bind(l, l->params, &s->r.w);
  if (l->cfg.router == MOE_ROUTER_COSINE) {
    memcpy(s->r.emb, s->r.w.gw, (size_t)E * P * 4);
    for (int e = 0; e < E; e++) s->r.emb_norm[e] = normalize_row(s->r.emb + (size_t)e * P, P);
  }
  s->r.use_cache = l->cached != NULL;
  if (l->cached) memcpy(s->p.top_e, l->cached, tk * 4); /* the experts are known before the router runs */
  l->cached = NULL; /* one forward */
  return MOE_OK;
}

/* Router chunk c: tokens [c GATE_ROWS, (c + 1) GATE_ROWS) (side work: the layer is the context). */
static void gate_rows(void *layer, int c) {
  moe_layer_t *l = layer;
  moe__layer_state *s = l->st;
  int E = l->cfg.E, k = s->p.k, t0 = c * GATE_ROWS, t1 = t0 + GATE_ROWS < s->p.T ? t0 + GATE_ROWS : s->p.T;
  compute_logits(l, &s->r.w, s->r.x, t0, t1 - t0);
  int norm = l->cfg.normalize_topk < 0 ? k > 1 : l->cfg.normalize_topk;
  for (int t = t0; t < t1; t++) {
    const float *prob = s->r.probs + (size_t)t * E;
    int32_t *te = s->p.top_e + (size_t)t * k, *fr = s->r.fresh + (size_t)t * k;
    float *tp = s->r.top_p + (size_t)t * k, *tw = s->p.top_w + (size_t)t * k;
    route_token(s->r.logits + (size_t)t * E, s->r.probs + (size_t)t * E, s->r.lse + t, E, k, fr, tp);
    if (s->r.use_cache) /* sample-assignment caching: the experts come from the cache, the weights from the gate */
      for (int j = 0; j < k; j++) tp[j] = prob[te[j]];
    else
      memcpy(te, fr, (size_t)k * 4);
    float sum = 0;
    for (int j = 0; j < k; j++) sum += tp[j];
    for (int j = 0; j < k; j++) tw[j] = norm ? tp[j] / sum : tp[j];
  }
  /* this chunk's loss sums, in token order: prob sums, top-1 counts, -, sum lse^2 */
  double *acc = s->r.acc + (size_t)(c + 1) * (2 * E + 2);
  memset(acc, 0, (size_t)(2 * E + 2) * sizeof *acc);
  for (int t = t0; t < t1; t++) {
    acc[2 * E + 1] += (double)s->r.lse[t] * s->r.lse[t];
    acc[E + s->p.top_e[(size_t)t * k]] += 1;
    const float *p = s->r.probs + (size_t)t * E;
    for (int e = 0; e < E; e++) acc[e] += p[e];
  }
}

moe_status moe__gate_end(moe_layer_t *l) {
  moe__layer_state *s = l->st;
  int E = l->cfg.E, E2 = 2 * E + 2, T = s->p.T;
  /* the losses from the chunks' sums in chunk order (the bits do not depend on the thread count),
   * summed over the ranks when expert-parallel: the balance loss and the z-loss are over all tokens */
  double *acc = s->r.acc;
  memset(acc, 0, (size_t)E2 * sizeof *acc);
  for (int c = 0; c < gate_chunks(T); c++)
    for (int i = 0; i < E2; i++) acc[i] += acc[(size_t)(c + 1) * E2 + i];
  acc[2 * E] = T;
  if (l->cfg.dist) MOE_CHECK(moe_dist_allreduce(l->cfg.dist, acc, E2));
  double Tg = acc[2 * E], aux = 0;
  s->r.Tg = Tg;
  for (int e = 0; e < E; e++) {
    s->r.frac1[e] = Tg > 0 ? (float)(acc[E + e] / Tg) : 0.0f;
    aux += Tg > 0 ? acc[e] / Tg * s->r.frac1[e] : 0.0;
  }
  s->r.aux = (float)(E * aux);
  s->r.z = Tg > 0 ? (float)(acc[2 * E + 1] / Tg) : 0.0f;
  return MOE_OK;
}

moe__side_work moe__gate_work(moe_layer_t *l) { return (moe__side_work){gate_rows, l, gate_chunks(l->st->p.T)}; }

moe_status moe__gate_backward(moe_layer_t *l, const float *dw, float daux, float dz, float *dx) {
  moe__layer_state *s = l->st;
  int T = s->p.T, k = s->p.k, E = l->cfg.E, D = l->cfg.D, P = l->cfg.proj_dim, nt = s->threads;
  const float *x = s->r.x;
  moe__arena *a = &s->route;
  float *dl = moe__arena_alloc(a, (size_t)T * E * 4); /* dprobs, then dlogits in place */
  float *dp = NULL, *de = NULL;
  if (l->cfg.router == MOE_ROUTER_COSINE) {
    dp = moe__arena_alloc(a, (size_t)T * P * 4);
    de = moe__arena_alloc(a, (size_t)E * P * 4);
  }
  MOE_TRY(dl && (l->cfg.router != MOE_ROUTER_COSINE || de), MOE_ERR_STATE,
          "internal: router backward workspace too small");
  int norm = l->cfg.normalize_topk < 0 ? k > 1 : l->cfg.normalize_topk;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < T; t++) {
    float *g = dl + (size_t)t * E;
    const float *p = s->r.probs + (size_t)t * E;
    const float *tp = s->r.top_p + (size_t)t * k, *tw = s->p.top_w + (size_t)t * k, *d = dw + (size_t)t * k;
    const int32_t *te = s->p.top_e + (size_t)t * k;
    for (int e = 0; e < E; e++) g[e] = daux * E * s->r.frac1[e] / (float)s->r.Tg;
    if (norm) { /* w_j = p_j / S: dp_j = (dw_j - sum_i dw_i w_i) / S */
      float S = 0, dot = 0;
      for (int j = 0; j < k; j++) { S += tp[j]; dot += d[j] * tw[j]; }
      for (int j = 0; j < k; j++) g[te[j]] += (d[j] - dot) / S;
    } else {
      for (int j = 0; j < k; j++) g[te[j]] += d[j];
    }
    float dot = 0;
    for (int e = 0; e < E; e++) dot += g[e] * p[e];
    float zc = dz * 2.0f * s->r.lse[t] / (float)s->r.Tg;
    for (int e = 0; e < E; e++) g[e] = p[e] * (g[e] - dot) + zc * p[e];
  }
  moe__weights w, gw;
  moe__weights_bind(l, l->params, &w);
  moe__weights_bind(l, l->grads, &gw);
  if (l->cfg.router == MOE_ROUTER_LINEAR) {
    moe__gemm g[2] = {
        {true, false, E, D, T, 1.0f, 1.0f, dl, E, x, D, gw.gw, D, false},   /* dWg += dl^T x */
        {false, false, T, D, E, 1.0f, 1.0f, dl, E, w.gw, D, dx, D, false},  /* dx += dl Wg */
    };
    moe__gemm_run(g, 2, nt);
    if (gw.gb)
      for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) gw.gb[e] += dl[(size_t)t * E + e];
    return MOE_OK;
  }
  float sc = cosine_scale(&w);
  if (w.scale[0] < LOG_MAX_SCALE) { /* d logits / d s = logits while unclamped */
    double acc = 0;
    for (size_t i = 0; i < (size_t)T * E; i++) acc += (double)dl[i] * s->r.logits[i];
    gw.scale[0] += (float)acc;
  }
  moe__gemm g[2] = {
      {false, false, T, P, E, sc, 0.0f, dl, E, s->r.emb, P, dp, P, false},  /* d proj_n = s dl emb_n */
      {true, false, E, P, T, sc, 0.0f, dl, E, s->r.proj, P, de, P, false},  /* d emb_n = s dl^T proj_n */
  };
  moe__gemm_run(g, 2, nt);
  normalize_rows_backward(dp, s->r.proj, s->r.proj_norm, T, P, nt);
  normalize_rows_backward(de, s->r.emb, s->r.emb_norm, E, P, nt);
  for (size_t i = 0; i < (size_t)E * P; i++) gw.gw[i] += de[i];
  moe__gemm h[2] = {
      {true, false, P, D, T, 1.0f, 1.0f, dp, P, x, D, gw.pw, D, false},   /* dWp += dp^T x */
      {false, false, T, D, P, 1.0f, 1.0f, dp, P, w.pw, D, dx, D, false},  /* dx += dp Wp */
  };
  moe__gemm_run(h, 2, nt);
  for (int t = 0; t < T; t++)
    for (int p = 0; p < P; p++) gw.pb[p] += dp[(size_t)t * P + p];
  return MOE_OK;
}
