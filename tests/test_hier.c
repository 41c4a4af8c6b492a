/* Hierarchical MoE runs its inner layers at once, one per thread (hier.c): outputs, input gradients,
 * losses and every inner layer's gradients are those of the same layer run on one thread, with
 * experts of many, few and no rows. */
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "test.h"

typedef struct {
  float *y, *dx, **grads;
  float aux;
  int empty; /* expert 0 got no rows */
} hier_run;

static float frand(uint64_t *s) { /* in [0, 1) */
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*s >> 40) * 0x1.0p-24);
}

static int run_hier(int threads, const float *x, const float *dy, int T, hier_run *out) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = 8, c.H = 16, c.E = 4, c.top_k = 1, c.inner_experts = 3, c.inner_top_k = 2, c.threads = threads;
  moe_layer_t l;
  if (moe_layer_init(&l, &c) != MOE_OK) return 0;
  moe_layer_init_params(&l, 11);
  /* expert 0's gate row far below the others for positive inputs: it gets no rows */
  const moe_param_info *g = moe_layer_param_find(&l, "gate.weight");
  if (!g) return 0;
  for (int i = 0; i < c.D; i++) l.params[g->offset + i] = -10.0f;
  moe_layer_stats st;
  int ok = moe_layer_forward(&l, x, T, out->y, NULL, &st) == MOE_OK &&
           moe_layer_backward(&l, dy, 0.5f, 0.25f, NULL, NULL, out->dx) == MOE_OK;
  out->aux = st.aux_loss;
  out->empty = st.expert_counts ? st.expert_counts[0] == 0 : -1;
  out->grads = calloc((size_t)c.E, sizeof *out->grads);
  for (int e = 0; ok && e < c.E; e++) {
    out->grads[e] = malloc(l.inner[e].numel * 4);
    memcpy(out->grads[e], l.inner[e].grads, l.inner[e].numel * 4);
  }
  moe_layer_free(&l);
  return ok;
}

TEST(hier_inner_layers_at_once_match_one_thread) {
  enum { T = 41, D = 8, E = 4 };
  uint64_t s = 5;
  float *x = malloc(T * D * 4), *dy = malloc(T * D * 4);
  for (int i = 0; i < T * D; i++) x[i] = frand(&s), dy[i] = frand(&s) - 0.5f;
  hier_run one = {malloc(T * D * 4), malloc(T * D * 4), NULL, 0, 0};
  hier_run many = {malloc(T * D * 4), malloc(T * D * 4), NULL, 0, 0};
  ASSERT(run_hier(1, x, dy, T, &one));
  ASSERT(run_hier(3, x, dy, T, &many));
  ASSERT(one.empty == 1 && many.empty == 1);
  ASSERT(tensors_close("y", many.y, one.y, T * D, 1e-6, 1e-7));
  ASSERT(tensors_close("dx", many.dx, one.dx, T * D, 1e-6, 1e-7));
  ASSERT_NEAR(many.aux, one.aux, 1e-6);
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = 8, c.H = 16, c.E = 3, c.top_k = 2;
  moe_layer_t probe; /* an inner layer's parameter count */
  ASSERT_OK(moe_layer_init(&probe, &c));
  for (int e = 0; e < E; e++)
    if (!tensors_close("inner grads", many.grads[e], one.grads[e], probe.numel, 1e-6, 1e-7)) FAIL_("expert %d", e);
  moe_layer_free(&probe);
  for (int e = 0; e < E; e++) free(one.grads[e]), free(many.grads[e]);
  free(one.grads), free(many.grads), free(one.y), free(one.dx), free(many.y), free(many.dx), free(x), free(dy);
}
