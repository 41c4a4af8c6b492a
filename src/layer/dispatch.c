/* Moving tokens to expert rows and back, and the combine.
 * dynamic: a gather into contiguous per-expert slices (rows from placement.c), a weighted sum back;
 *          nothing of size T*E*C exists.
 * static:  the GShard baseline: dense dispatch mask and combine weights (T, E, C), dispatch and
 *          combine as mask products (GEMMs), the padded (E, C, D) expert buffer. */
#include <string.h>

#include "kernels/gemm.h"
#include "layer/layer_internal.h"

/* Elements of the static (T, E, C) tensors: T times the expert rows (E C, or the sum of per-expert
 * capacities). Valid after routing. */
static size_t tec(const moe_layer_t *l) {
  return (size_t)l->st->p.T * (size_t)l->st->p.rows;
}

size_t moe__dispatch_bytes(const moe_layer_t *l) {
  size_t b = moe__arena_size((size_t)l->st->p.rows * l->cfg.D * 4); /* xs */
  if (l->cfg.dispatch == MOE_DISPATCH_STATIC) b += 3 * moe__arena_size(tec(l) * 4); /* mask, comb, dcomb */
  return b;
}

moe_status moe__dispatch_forward(moe_layer_t *l, const float *x) {
  moe__layer_state *s = l->st;
  int T = s->p.T, k = s->p.k, D = l->cfg.D, nt = s->threads;
  s->xs = moe__arena_alloc(&s->work, (size_t)s->p.rows * D * 4);
  MOE_TRY(s->xs || s->p.rows == 0, MOE_ERR_STATE, "internal: dispatch workspace too small");
  if (l->cfg.dispatch == MOE_DISPATCH_DYNAMIC) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < T; t++)
      for (int j = 0; j < k; j++) {
        int r = s->p.row[(size_t)t * k + j];
        if (r >= 0) memcpy(s->xs + (size_t)r * D, x + (size_t)t * D, (size_t)D * 4);
      }
    return MOE_OK;
  }
  size_t n = tec(l);
  int ec = s->p.rows; /* E * C */
  s->mask = moe__arena_alloc(&s->work, n * 4);
  s->comb = moe__arena_alloc(&s->work, n * 4);
  MOE_TRY((s->mask && s->comb) || n == 0, MOE_ERR_STATE, "internal: dispatch workspace too small");
  memset(s->mask, 0, n * 4);
  for (int t = 0; t < T; t++)
    for (int j = 0; j < k; j++) {
      int r = s->p.row[(size_t)t * k + j];
      if (r >= 0) s->mask[(size_t)t * ec + r] = 1.0f;
    }
  /* xs (E*C, D) = mask^T (E*C, T) x (T, D) */
  moe__gemm g = {true, false, ec, D, T, 1.0f, 0.0f, s->mask, ec, x, D, s->xs, D, false};
  moe__gemm_run(&g, 1, nt);
  return MOE_OK;
}

/* spec rows: the unweighted expert output of each assignment, zero when dropped. */
static void write_spec(const moe_layer_t *l, const float *out, float *spec) {
  const moe__layer_state *s = l->st;
  int D = l->cfg.D;
#pragma omp parallel for num_threads(s->threads) schedule(static)
  for (size_t a = 0; a < (size_t)s->p.T * s->p.k; a++) {
    int r = s->p.row[a];
    if (r >= 0) memcpy(spec + a * D, out + (size_t)r * D, (size_t)D * 4);
    else memset(spec + a * D, 0, (size_t)D * 4);
  }
}

void moe__combine_forward(moe_layer_t *l, const float *out, float *y, float *spec) {
  moe__layer_state *s = l->st;
  int T = s->p.T, k = s->p.k, D = l->cfg.D, nt = s->threads;
  if (spec) write_spec(l, out, spec);
  if (l->cfg.dispatch == MOE_DISPATCH_STATIC) {
    /* the combine weights here, not at dispatch: with cached experts the router may still be running
     * while the experts are */
    if (tec(l)) memset(s->comb, 0, tec(l) * 4);
    for (int t = 0; t < T; t++)
      for (int j = 0; j < k; j++) {
        int r = s->p.row[(size_t)t * k + j];
        if (r >= 0) s->comb[(size_t)t * s->p.rows + r] = s->p.top_w[(size_t)t * k + j];
      }
    /* y (T, D) = comb (T, E*C) out (E*C, D) */
    moe__gemm g = {false, false, T, D, s->p.rows, 1.0f, 0.0f, s->comb, s->p.rows, out, D, y, D, false};
    moe__gemm_run(&g, 1, nt);
    return;
  }
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < T; t++) {
    float *yt = y + (size_t)t * D;
    memset(yt, 0, (size_t)D * 4);
    for (int j = 0; j < k; j++) {
      int r = s->p.row[(size_t)t * k + j];
      if (r < 0) continue;
      float w = s->p.top_w[(size_t)t * k + j];
      const float *o = out + (size_t)r * D;
      for (int d = 0; d < D; d++) yt[d] += w * o[d];
    }
  }
}

static float dot(const float *a, const float *b, int n) {
  float acc = 0;
  for (int i = 0; i < n; i++) acc += a[i] * b[i];
  return acc;
}

moe_status moe__combine_backward(moe_layer_t *l, const float *out, const float *dy, const float *dspec, float *dout,
                                  float *dw) {
  moe__layer_state *s = l->st;
  int T = s->p.T, k = s->p.k, D = l->cfg.D, nt = s->threads;
  int is_static = l->cfg.dispatch == MOE_DISPATCH_STATIC;
  float *dcomb = NULL;
  if (is_static) {
    size_t n = tec(l);
    dcomb = moe__arena_alloc(&s->work, n * 4);
    MOE_TRY(dcomb || n == 0, MOE_ERR_STATE, "internal: combine workspace too small");
    /* dout (E*C, D) = comb^T dy; dcomb (T, E*C) = dy out^T: the einsum backward of GShard */
    moe__gemm g[2] = {
        {true, false, s->p.rows, D, T, 1.0f, 0.0f, s->comb, s->p.rows, dy, D, dout, D, false},
        {false, true, T, s->p.rows, D, 1.0f, 0.0f, dy, D, out, D, dcomb, s->p.rows, false},
    };
    moe__gemm_run(g, 2, nt);
  }
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < T; t++)
    for (int j = 0; j < k; j++) {
      size_t a = (size_t)t * k + j;
      int r = s->p.row[a];
      if (r < 0) {
        dw[a] = 0;
        continue;
      }
      float *dr = dout + (size_t)r * D;
      const float *dyt = dy + (size_t)t * D;
      if (is_static) {
        dw[a] = dcomb[(size_t)t * s->p.rows + r];
      } else {
        float w = s->p.top_w[a];
        for (int d = 0; d < D; d++) dr[d] = w * dyt[d];
        dw[a] = dot(dyt, out + (size_t)r * D, D);
      }
      if (dspec)
        for (int d = 0; d < D; d++) dr[d] += dspec[a * D + d];
    }
  return MOE_OK;
}

void moe__dispatch_backward(moe_layer_t *l, const float *dxs, float *dx) {
  moe__layer_state *s = l->st;
  int T = s->p.T, k = s->p.k, D = l->cfg.D, nt = s->threads;
  if (l->cfg.dispatch == MOE_DISPATCH_STATIC) {
    /* dx (T, D) = mask (T, E*C) dxs (E*C, D) */
    moe__gemm g = {false, false, T, D, s->p.rows, 1.0f, 0.0f, s->mask, s->p.rows, dxs, D, dx, D, false};
    moe__gemm_run(&g, 1, nt);
    return;
  }
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < T; t++) {
    float *dxt = dx + (size_t)t * D;
    memset(dxt, 0, (size_t)D * 4);
    for (int j = 0; j < k; j++) {
      int r = s->p.row[(size_t)t * k + j];
      if (r < 0) continue;
      const float *g = dxs + (size_t)r * D;
      for (int d = 0; d < D; d++) dxt[d] += g[d];
    }
  }
}
