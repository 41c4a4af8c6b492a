/* RMSNorm (Llama / Mixtral): y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps). Sums in double:
 * rows are short and this keeps the norm exact enough for the fp64 reference checks. */
#include <math.h>

#include "kernels.h"

void moe__rmsnorm_forward(const float *x, const float *w, int n, int d, float eps, float *y, float *rstd, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int i = 0; i < n; i++) {
    const float *xr = x + (size_t)i * d;
    float *yr = y + (size_t)i * d;
    double ss = 0;
    for (int j = 0; j < d; j++) ss += (double)xr[j] * xr[j];
    float r = (float)(1.0 / sqrt(ss / d + eps));
    rstd[i] = r;
    for (int j = 0; j < d; j++) yr[j] = xr[j] * r * w[j];
  }
}

/* With u = x rstd: dx = rstd (dy w - u mean(dy w u)), dw = sum over rows of dy u. */
void moe__rmsnorm_backward(const float *dy, const float *x, const float *w, const float *rstd, int n, int d,
                           float *dx, float *dw, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int i = 0; i < n; i++) {
    const float *xr = x + (size_t)i * d, *gr = dy + (size_t)i * d;
    float *dr = dx + (size_t)i * d;
    float r = rstd[i];
    double dot = 0;
    for (int j = 0; j < d; j++) dot += (double)gr[j] * w[j] * xr[j];
    float c = (float)(dot / d) * r * r;
    for (int j = 0; j < d; j++) dr[j] += r * (gr[j] * w[j] - xr[j] * c);
  }
  /* dw by column blocks so that threads never write the same entries */
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int j0 = 0; j0 < d; j0 += 64) {
    int j1 = j0 + 64 < d ? j0 + 64 : d;
    for (int i = 0; i < n; i++) {
      const float *xr = x + (size_t)i * d, *gr = dy + (size_t)i * d;
      float r = rstd[i];
      for (int j = j0; j < j1; j++) dw[j] += gr[j] * xr[j] * r;
    }
  }
}
