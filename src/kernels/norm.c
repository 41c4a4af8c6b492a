/* LayerNorm (see norm.h). Row statistics in double so that large d does not lose bits. */
#include <math.h>
#include <stddef.h>

#include "kernels/norm.h"

void moe__layernorm_forward(const float *x, const float *g, const float *b, int n, int d, float *y,
                            float *mean, float *rstd, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int i = 0; i < n; i++) {
    const float *xr = x + (size_t)i * d;
    double s = 0, ss = 0;
    for (int j = 0; j < d; j++) s += xr[j];
    double mu = s / d;
    for (int j = 0; j < d; j++) ss += (xr[j] - mu) * (xr[j] - mu);
    float r = (float)(1.0 / sqrt(ss / d + MOE_LN_EPS));
    mean[i] = (float)mu;
    rstd[i] = r;
    float *yr = y + (size_t)i * d;
    for (int j = 0; j < d; j++) yr[j] = ((xr[j] - (float)mu) * r) * g[j] + b[j];
  }
}

void moe__layernorm_backward(const float *dy, const float *x, const float *g, const float *mean,
                             const float *rstd, int n, int d, float *dx, float *dg, float *db,
                             int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int i = 0; i < n; i++) {
    const float *dyr = dy + (size_t)i * d, *xr = x + (size_t)i * d;
    float mu = mean[i], r = rstd[i];
    double sdg = 0, sdgx = 0; /* sums of dxhat and dxhat * xhat */
    for (int j = 0; j < d; j++) {
      float xh = (xr[j] - mu) * r, dxh = dyr[j] * g[j];
      sdg += dxh;
      sdgx += dxh * xh;
    }
    float m1 = (float)(sdg / d), m2 = (float)(sdgx / d);
    float *dxr = dx + (size_t)i * d;
    for (int j = 0; j < d; j++) {
      float xh = (xr[j] - mu) * r;
      dxr[j] += r * (dyr[j] * g[j] - m1 - xh * m2);
    }
  }
  /* parameter gradients: columns in parallel, rows in order, so the bits do not depend on threads */
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int j = 0; j < d; j++) {
    float sg = 0, sb = 0;
    for (int i = 0; i < n; i++) {
      float dyv = dy[(size_t)i * d + j];
      sg += dyv * (x[(size_t)i * d + j] - mean[i]) * rstd[i];
      sb += dyv;
    }
    dg[j] += sg;
    db[j] += sb;
  }
}
