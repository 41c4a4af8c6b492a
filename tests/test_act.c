/* The activation functions (src/kernels/act.c) against double precision over [-12, 12] and beyond, forward
 * and backward, for every activation; GELU's vector path (AVX-512 builds) gives each value the same
 * bits wherever it lies in the array. The bound is in units of float rounding of the terms that
 * cancel: (|a| + |f(a)|) 2^-23; the worst here is 1.0 (GELU forward through the vector erff; 0.42
 * through the scalar one). */
#include <stdlib.h>

#include "kernels/act.h"
#include "test.h"

enum { N = 24011 }; /* not a multiple of 16: the masked last vector */

static double silu(double a) { return a / (1 + exp(-a)); }
static double dsilu(double a) {
  double s = 1 / (1 + exp(-a));
  return s * (1 + a * (1 - s));
}
static double f64(moe_act act, double a) {
  switch (act) {
    case MOE_ACT_RELU: return a > 0 ? a : 0;
    case MOE_ACT_GELU: return 0.5 * a * (1 + erf(a / sqrt(2.0)));
    default: return silu(a);
  }
}
static double df64(moe_act act, double a) {
  switch (act) {
    case MOE_ACT_RELU: return a > 0 ? 1 : 0;
    case MOE_ACT_GELU: return 0.5 * (1 + erf(a / sqrt(2.0))) + a * exp(-0.5 * a * a) / sqrt(2 * M_PI);
    default: return dsilu(a);
  }
}

/* The worst error over the inputs, in units of (|a| + |want|) 2^-23. */
static double units(double got, double want, double a) { return fabs(got - want) / ((fabs(a) + fabs(want)) * 0x1p-23 + 1e-45); }

TEST(act_forward_backward_match_double) {
  float *a = malloc(N * sizeof *a), *a3 = malloc(N * sizeof *a3), *h = malloc(N * sizeof *h);
  float *dh = malloc(N * sizeof *dh), *g3 = malloc(N * sizeof *g3);
  ASSERT(a && a3 && h && dh && g3);
  for (int i = 0; i < N; i++) {
    a[i] = -12.0f + 24.0f * (float)i / (N - 1);
    a3[i] = 0.75f - (float)(i % 7) * 0.25f;
  }
  a[0] = 0.0f, a[1] = -0.0f, a[2] = 1e-30f, a[3] = -1e-30f, a[4] = 30.0f, a[5] = -30.0f, a[6] = 90.0f, a[7] = -90.0f;
  const moe_act acts[4] = {MOE_ACT_RELU, MOE_ACT_GELU, MOE_ACT_SILU, MOE_ACT_SWIGLU};
  char msg[256] = "";
  for (int t = 0; t < 4 && !msg[0]; t++) {
    moe_act act = acts[t];
    int glu = act == MOE_ACT_SWIGLU;
    moe__act_forward(act, a, glu ? a3 : NULL, h, N);
    for (int i = 0; i < N; i++) {
      dh[i] = 1.0f - (float)(i % 5) * 0.5f;
      g3[i] = a3[i];
    }
    moe__act_backward(act, a, glu ? g3 : NULL, dh, N);
    double worst_f = 0, worst_b = 0, worst_3 = 0;
    for (int i = 0; i < N; i++) {
      double up = 1.0 - (i % 5) * 0.5, g = glu ? a3[i] : 1.0;
      double wf = f64(act, a[i]) * g, wb = up * g * df64(act, a[i]);
      worst_f = fmax(worst_f, units(h[i], wf, a[i] * g));
      worst_b = fmax(worst_b, units(dh[i], wb, up * g * (1 + fabs(a[i]))));
      if (glu) worst_3 = fmax(worst_3, units(g3[i], up * f64(act, a[i]), up * a[i]));
    }
    if (worst_f > 4 || worst_b > 4 || worst_3 > 4)
      snprintf(msg, sizeof msg, "%s: worst errors forward %.3g, backward %.3g, da3 %.3g units (bound 4)",
               moe_act_name(act), worst_f, worst_b, worst_3);
  }
  /* the same values at another offset (another lane, or the masked tail) give the same bits */
  for (int t = 0; t < 4 && !msg[0]; t++) {
    moe_act act = acts[t];
    const float *a3p = act == MOE_ACT_SWIGLU ? a3 : NULL;
    moe__act_forward(act, a, a3p, h, N);
    float part[40];
    moe__act_forward(act, a + 1003, a3p ? a3p + 1003 : NULL, part, 37);
    for (int i = 0; i < 37 && !msg[0]; i++)
      if (part[i] != h[1003 + i]) snprintf(msg, sizeof msg, "%s: value %d at another offset differs", moe_act_name(act), 1003 + i);
  }
  free(a), free(a3), free(h), free(dh), free(g3);
  if (msg[0]) FAIL_("%s", msg);
}
