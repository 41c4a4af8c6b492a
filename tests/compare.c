/* See compare.h. */
#include <math.h>
#include <stdio.h>

#include "compare.h"

int tensors_close(const char *name, const float *a, const float *b, size_t n, double rtol, double atol) {
  double maxref = 0, maxerr = 0;
  size_t worst = 0;
  for (size_t i = 0; i < n; i++) maxref = fmax(maxref, fabs(b[i]));
  double tol = rtol * maxref + atol;
  long long first = -1;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - b[i]);
    if (!(e <= tol) && first < 0) first = (long long)i;
    if (!(e <= maxerr)) { maxerr = e; worst = i; }
  }
  if (first < 0) return 1;
  fprintf(stderr, "  %s: max abs err %.3g (rel %.3g of max|ref| %.3g) at %zu: %.9g vs %.9g; first bad %lld\n",
          name, maxerr, maxref > 0 ? maxerr / maxref : maxerr, maxref, worst, (double)a[worst],
          (double)b[worst], first);
  return 0;
}

int tensors_close_norm(const char *name, const float *a, const float *b, size_t n, double tol) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - b[i];
    diff += d * d;
    ref += (double)b[i] * b[i];
  }
  diff = sqrt(diff);
  ref = sqrt(ref);
  if (diff <= tol * ref + 1e-30) return 1;
  fprintf(stderr, "  %s: |a - b| = %.3g, %.3g of |ref| = %.3g (tolerance %.3g)\n", name, diff,
          ref > 0 ? diff / ref : diff, ref, tol);
  return 0;
}

int tensor_dtype_is(const moe_st *f, const char *name, moe_dtype dt) {
  moe_tensor_view v;
  if (moe_st_get(f, name, &v) != MOE_OK) {
    fprintf(stderr, "  %s\n", moe_last_error());
    return 0;
  }
  if (v.dtype == dt) return 1;
  fprintf(stderr, "  %s: tensor '%s' is %s, want %s\n", moe_st_path(f), name, moe_dtype_name(v.dtype),
          moe_dtype_name(dt));
  return 0;
}
