/* Double-precision references for a layer's router and experts (see layer_ref.h). */
#include "layer_ref.h"

#include <math.h>
#include <stdlib.h>

double ref_gate_softmax(moe_layer_t *l, const float *x, double *p) {
  int D = l->cfg.D, E = l->cfg.E;
  const float *gw = moe_layer_param(l, "gate.weight"), *gb = moe_layer_param(l, "gate.bias");
  double mx = -INFINITY, sum = 0;
  for (int e = 0; e < E; e++) {
    p[e] = gb ? gb[e] : 0.0;
    for (int d = 0; d < D; d++) p[e] += (double)gw[(size_t)e * D + d] * x[d];
    mx = fmax(mx, p[e]);
  }
  for (int e = 0; e < E; e++) sum += p[e] = exp(p[e] - mx);
  for (int e = 0; e < E; e++) p[e] /= sum;
  return mx + log(sum);
}

static double act(moe_act a, double v) {
  switch (a) {
    case MOE_ACT_RELU: return v > 0 ? v : 0;
    case MOE_ACT_GELU: return 0.5 * v * (1.0 + erf(v / sqrt(2.0))); /* exact gelu */
    default: return v / (1.0 + exp(-v)); /* silu */
  }
}

void ref_expert(moe_layer_t *l, int e, const float *x, double *out) {
  int D = l->cfg.D, H = l->cfg.H;
  const float *w1 = moe_layer_param(l, "experts.fc1.weight") + (size_t)e * H * D;
  const float *b1 = moe_layer_param(l, "experts.fc1.bias");
  const float *w2 = moe_layer_param(l, "experts.fc2.weight") + (size_t)e * D * H;
  const float *b2 = moe_layer_param(l, "experts.fc2.bias");
  double *h = malloc(sizeof(double) * (size_t)H);
  if (!h) abort();
  for (int j = 0; j < H; j++) {
    double a = b1 ? b1[(size_t)e * H + j] : 0.0;
    for (int d = 0; d < D; d++) a += (double)w1[(size_t)j * D + d] * x[d];
    h[j] = act(l->cfg.act, a);
  }
  for (int d = 0; d < D; d++) {
    double o = b2 ? b2[(size_t)e * D + d] : 0.0;
    for (int j = 0; j < H; j++) o += (double)w2[(size_t)d * H + j] * h[j];
    out[d] = o;
  }
  free(h);
}
