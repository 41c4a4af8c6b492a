/* The shared experts (cfg.shared_H > 0: Qwen2-MoE, DeepSeek): one dense FFN of every token, added to the
 * routed output y, scaled per token by sigmoid(x . shared.gate.weight) when the layer has the gate. */
#include <math.h>
#include <string.h>

#include "layer/stages.h"

static moe__mlp shared_mlp(const moe_layer_config *cfg, const moe__weights *w) {
  return (moe__mlp){cfg->D, cfg->shared_H, cfg->act, w->sw1, w->sw3, w->sw2};
}

size_t moe__shared_bytes(const moe_layer_config *cfg, int T) {
  if (!cfg->shared_H) return 0;
  moe__mlp m = {cfg->D, cfg->shared_H, cfg->act, NULL, NULL, NULL};
  size_t td = moe__arena_size((size_t)T * cfg->D * 4);
  size_t b = moe__arena_size(moe__mlp_act_floats(&m, T) * 4);
  if (cfg->shared_gate) b += 2 * td + 2 * moe__arena_size((size_t)T * 4); /* out, gate; dy scaled, dgate */
  return b;
}

moe_status moe__shared_forward(const moe_layer_config *cfg, const moe__weights *w, const float *x, int T,
                               moe__arena *a, int threads, moe__shared *s, float *y) {
  moe__mlp m = shared_mlp(cfg, w);
  float *buf = moe__arena_alloc(a, moe__mlp_act_floats(&m, T) * 4);
  s->out = cfg->shared_gate ? moe__arena_alloc(a, (size_t)T * cfg->D * 4) : NULL;
  s->gate = cfg->shared_gate ? moe__arena_alloc(a, (size_t)T * 4) : NULL;
  MOE_TRY(T == 0 || (buf && (!cfg->shared_gate || s->gate)), MOE_ERR_STATE, "internal: shared expert workspace too small");
  s->acts = moe__mlp_acts_at(&m, T, buf);
  if (!cfg->shared_gate) return moe__mlp_forward(&m, T, x, &s->acts, 1.0f, y, threads); /* y += FFN(x) */
  MOE_CHECK(moe__mlp_forward(&m, T, x, &s->acts, 0.0f, s->out, threads));
  int D = cfg->D;
  moe__gemm g = {false, true, T, 1, D, 1.0f, 0.0f, x, D, w->sg, D, s->gate, 1, false}; /* gate logits */
  MOE_CHECK(moe__gemm_run(&g, 1, threads));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < T; t++) {
    float gt = 1.0f / (1.0f + expf(-s->gate[t]));
    s->gate[t] = gt;
    for (int d = 0; d < D; d++) y[(size_t)t * D + d] += gt * s->out[(size_t)t * D + d];
  }
  return MOE_OK;
}

moe_status moe__shared_backward(const moe_layer_config *cfg, const moe__weights *w, const moe__weights *gw,
                                const float *x, int T, moe__shared *s, const float *dy, moe__arena *a,
                                int threads, float *dx) {
  moe__mlp m = shared_mlp(cfg, w), gm = shared_mlp(cfg, gw);
  if (!cfg->shared_gate) return moe__mlp_backward(&m, &gm, T, x, &s->acts, dy, dx, threads);
  int D = cfg->D;
  float *dys = moe__arena_alloc(a, (size_t)T * D * 4), *dz = moe__arena_alloc(a, (size_t)T * 4);
  MOE_TRY(T == 0 || (dys && dz), MOE_ERR_STATE, "internal: shared expert backward workspace too small");
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < T; t++) { /* y_t += g_t out_t: d out_t = g_t dy_t, d g_t = dy_t . out_t */
    const float *dyt = dy + (size_t)t * D, *ot = s->out + (size_t)t * D;
    float gt = s->gate[t], dg = 0;
    for (int d = 0; d < D; d++) {
      dg += dyt[d] * ot[d];
      dys[(size_t)t * D + d] = gt * dyt[d];
    }
    dz[t] = dg * gt * (1.0f - gt); /* through the sigmoid */
  }
  moe__gemm g[2] = {
      {true, false, 1, D, T, 1.0f, 1.0f, dz, 1, x, D, gw->sg, D, false},   /* d gate.weight += dz^T x */
      {false, false, T, D, 1, 1.0f, 1.0f, dz, 1, w->sg, D, dx, D, false},  /* dx += dz gate.weight */
  };
  MOE_CHECK(moe__gemm_run(g, 2, threads));
  return moe__mlp_backward(&m, &gm, T, x, &s->acts, dys, dx, threads);
}
