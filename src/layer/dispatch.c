/* Moving tokens to expert rows and back, and the combine.
 * dynamic: a gather into contiguous per-expert slices (rows from placement.c), a weighted sum back;
 *          nothing of size T*E*C exists.
 * static:  the GShard baseline: dense dispatch mask and combine weights (T, E, C), dispatch and
 *          combine as mask products (GEMMs), the padded (E, C, D) expert buffer. */
#include <string.h>

#include "kernels/gemm.h"
#include "layer/stages.h"

/* Elements of the static (T, rows) tensors: T times the expert rows (E C, or the sum of per-expert
 * capacities). */
static size_t tec(const moe__plan *p) { return (size_t)p->T * (size_t)p->rows; }

size_t moe__dispatch_bytes(const moe__plan *p, int D, moe_dispatch kind) {
  size_t b = moe__arena_size((size_t)p->rows * D * 4); /* xs */
  if (kind == MOE_DISPATCH_STATIC) b += 3 * moe__arena_size(tec(p) * 4); /* mask, comb, dcomb */
  return b;
}

moe_status moe__dispatch_alloc(const moe__plan *p, moe__dispatch *d, moe__arena *a, float **xs) {
  *xs = moe__arena_alloc(a, (size_t)p->rows * d->D * 4);
  MOE_TRY(*xs || p->rows == 0, MOE_ERR_STATE, "internal: dispatch workspace too small");
  if (d->kind == MOE_DISPATCH_DYNAMIC) return MOE_OK;
  d->mask = moe__arena_alloc(a, tec(p) * 4);
  d->comb = moe__arena_alloc(a, tec(p) * 4);
  MOE_TRY((d->mask && d->comb) || tec(p) == 0, MOE_ERR_STATE, "internal: dispatch workspace too small");
  return MOE_OK;
}

void moe__dispatch_forward(const moe__plan *p, const moe__dispatch *d, const float *x, float *xs) {
  int T = p->T, k = p->k, D = d->D, nt = d->threads;
  if (d->kind == MOE_DISPATCH_DYNAMIC) {
#pragma omp parallel for num_threads(nt) schedule(static) if (moe__par_worth((size_t)T * k * D))
    for (int t = 0; t < T; t++)
      for (int j = 0; j < k; j++) {
        int r = p->row[(size_t)t * k + j];
        if (r >= 0) memcpy(xs + (size_t)r * D, x + (size_t)t * D, (size_t)D * 4);
      }
    return;
  }
  size_t n = tec(p);
  int ec = p->rows; /* E * C */
  memset(d->mask, 0, n * 4);
  for (int t = 0; t < T; t++)
    for (int j = 0; j < k; j++) {
      int r = p->row[(size_t)t * k + j];
      if (r >= 0) d->mask[(size_t)t * ec + r] = 1.0f;
    }
  /* xs (E*C, D) = mask^T (E*C, T) x (T, D) */
  moe__gemm g = {true, false, ec, D, T, 1.0f, 0.0f, d->mask, ec, x, D, xs, D, false};
  moe__gemm_run(&g, 1, nt);
}

/* spec rows: the unweighted expert output of each assignment, zero when dropped. */
static void write_spec(const moe__plan *p, const moe__dispatch *d, const float *out, float *spec) {
  int D = d->D;
#pragma omp parallel for num_threads(d->threads) schedule(static) if (moe__par_worth((size_t)p->T * p->k * D))
  for (size_t a = 0; a < (size_t)p->T * p->k; a++) {
    int r = p->row[a];
    if (r >= 0) memcpy(spec + a * D, out + (size_t)r * D, (size_t)D * 4);
    else memset(spec + a * D, 0, (size_t)D * 4);
  }
}

void moe__combine_forward(const moe__plan *p, const moe__dispatch *d, const float *out, float *y, float *spec) {
  int T = p->T, k = p->k, D = d->D, nt = d->threads;
  if (spec) write_spec(p, d, out, spec);
  if (d->kind == MOE_DISPATCH_STATIC) {
    /* the combine weights here, not at dispatch: with cached experts the router may still be running
     * while the experts are */
    if (tec(p)) memset(d->comb, 0, tec(p) * 4);
    for (int t = 0; t < T; t++)
      for (int j = 0; j < k; j++) {
        int r = p->row[(size_t)t * k + j];
        if (r >= 0) d->comb[(size_t)t * p->rows + r] = p->top_w[(size_t)t * k + j];
      }
    /* y (T, D) = comb (T, E*C) out (E*C, D) */
    moe__gemm g = {false, false, T, D, p->rows, 1.0f, 0.0f, d->comb, p->rows, out, D, y, D, false};
    moe__gemm_run(&g, 1, nt);
    return;
  }
#pragma omp parallel for num_threads(nt) schedule(static) if (moe__par_worth((size_t)T * k * D))
  for (int t = 0; t < T; t++) {
    float *yt = y + (size_t)t * D;
    memset(yt, 0, (size_t)D * 4);
    for (int j = 0; j < k; j++) {
      int r = p->row[(size_t)t * k + j];
      if (r < 0) continue;
      float w = p->top_w[(size_t)t * k + j];
      const float *o = out + (size_t)r * D;
      for (int e = 0; e < D; e++) yt[e] += w * o[e];
    }
  }
}

static float dot(const float *a, const float *b, int n) {
  float acc = 0;
  for (int i = 0; i < n; i++) acc += a[i] * b[i];
  return acc;
}

moe_status moe__combine_backward(const moe__plan *p, const moe__dispatch *d, moe__arena *work, const float *out,
                                  const float *dy, const float *dspec, float *dout, float *dw) {
  int T = p->T, k = p->k, D = d->D, nt = d->threads;
  int is_static = d->kind == MOE_DISPATCH_STATIC;
  float *dcomb = NULL;
  if (is_static) {
    size_t n = tec(p);
    dcomb = moe__arena_alloc(work, n * 4);
    MOE_TRY(dcomb || n == 0, MOE_ERR_STATE, "internal: combine workspace too small");
    /* dout (E*C, D) = comb^T dy; dcomb (T, E*C) = dy out^T: the einsum backward of GShard */
    moe__gemm g[2] = {
        {true, false, p->rows, D, T, 1.0f, 0.0f, d->comb, p->rows, dy, D, dout, D, false},
        {false, true, T, p->rows, D, 1.0f, 0.0f, dy, D, out, D, dcomb, p->rows, false},
    };
    moe__gemm_run(g, 2, nt);
  }
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < T; t++)
    for (int j = 0; j < k; j++) {
      size_t a = (size_t)t * k + j;
      int r = p->row[a];
      if (r < 0) {
        dw[a] = 0;
        continue;
      }
      float *dr = dout + (size_t)r * D;
      const float *dyt = dy + (size_t)t * D;
      if (is_static) {
        dw[a] = dcomb[(size_t)t * p->rows + r];
      } else {
        float w = p->top_w[a];
        for (int e = 0; e < D; e++) dr[e] = w * dyt[e];
        dw[a] = dot(dyt, out + (size_t)r * D, D);
      }
      if (dspec)
        for (int e = 0; e < D; e++) dr[e] += dspec[a * D + e];
    }
  return MOE_OK;
}

void moe__dispatch_backward(const moe__plan *p, const moe__dispatch *d, const float *dxs, float *dx) {
  int T = p->T, k = p->k, D = d->D, nt = d->threads;
  if (d->kind == MOE_DISPATCH_STATIC) {
    /* dx (T, D) = mask (T, E*C) dxs (E*C, D) */
    moe__gemm g = {false, false, T, D, p->rows, 1.0f, 0.0f, d->mask, p->rows, dxs, D, dx, D, false};
    moe__gemm_run(&g, 1, nt);
    return;
  }
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < T; t++) {
    float *dxt = dx + (size_t)t * D;
    memset(dxt, 0, (size_t)D * 4);
    for (int j = 0; j < k; j++) {
      int r = p->row[(size_t)t * k + j];
      if (r < 0) continue;
      const float *g = dxs + (size_t)r * D;
      for (int e = 0; e < D; e++) dxt[e] += g[e];
    }
  }
}
