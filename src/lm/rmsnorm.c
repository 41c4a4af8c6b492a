/* RMSNorm (Llama / Mixtral): y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps). Sums in double:
 * rows are short and this keeps the norm exact enough for the fp64 reference checks. The strided form
 * normalizes the heads of q and k where they lie in the fused qkv rows (Qwen3-MoE, OLMoE). */
#include <math.h>

#include "internal.h"
#include "kernels.h"

/* Where row r of a strided set starts: rows of d floats, `per` of them one after the other, groups ld apart. */
static size_t row_at(const moe__rows *s, int r) { return (size_t)(r / s->per) * s->ld + (size_t)(r % s->per) * s->d; }

void moe__rmsnorm_rows_forward(const moe__rows *s, const float *x, const float *w, float eps, float *y, float *rstd,
                               int nt) {
  int d = s->d;
#pragma omp parallel for num_threads(nt) schedule(static) if (moe__par_worth((size_t)s->n * d))
  for (int i = 0; i < s->n; i++) {
    const float *xr = x + row_at(s, i);
    float *yr = y + row_at(s, i);
    double ss = 0;
    for (int j = 0; j < d; j++) ss += (double)xr[j] * xr[j];
    float r = (float)(1.0 / sqrt(ss / d + eps));
    rstd[i] = r;
    for (int j = 0; j < d; j++) yr[j] = xr[j] * r * w[j];
  }
}

/* With u = x rstd: dx = rstd (dy w - u mean(dy w u)), dw = sum over rows of dy u. */
void moe__rmsnorm_rows_backward(const moe__rows *s, const float *dy, const float *x, const float *w, const float *rstd,
                                float *dx, float *dw, int nt) {
  int d = s->d;
#pragma omp parallel for num_threads(nt) schedule(static) if (moe__par_worth((size_t)s->n * d))
  for (int i = 0; i < s->n; i++) {
    const float *xr = x + row_at(s, i), *gr = dy + row_at(s, i);
    float *dr = dx + row_at(s, i);
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
    for (int i = 0; i < s->n; i++) {
      const float *xr = x + row_at(s, i), *gr = dy + row_at(s, i);
      float r = rstd[i];
      for (int j = j0; j < j1; j++) dw[j] += gr[j] * xr[j] * r;
    }
  }
}

void moe__rmsnorm_forward(const float *x, const float *w, int n, int d, float eps, float *y, float *rstd, int nt) {
  moe__rows s = {n, d, 1, (size_t)d};
  moe__rmsnorm_rows_forward(&s, x, w, eps, y, rstd, nt);
}

void moe__rmsnorm_backward(const float *dy, const float *x, const float *w, const float *rstd, int n, int d,
                           float *dx, float *dw, int nt) {
  moe__rows s = {n, d, 1, (size_t)d};
  moe__rmsnorm_rows_backward(&s, dy, x, w, rstd, dx, dw, nt);
}
