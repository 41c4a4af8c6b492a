/* Hierarchical MoE (DynaMoE): the experts of a layer are themselves MoE layers, each with its own
 * router. The outer layer routes, dispatches and combines as usual; this expert source runs one inner
 * layer per expert on that expert's kept rows (the groups are the dispatch rows: hierarchical layers
 * are not expert-parallel). */
#include <string.h>

#include "layer_internal.h"

static moe_status inner_forward(moe_layer_t *l, const moe__groups *g, const moe__ffn *f, const moe__side_work *side) {
  (void)f, (void)side; /* the inner layers keep their own activations and run their own routers */
  moe__layer_state *s = l->st;
  int D = l->cfg.D;
  s->inner_aux = s->inner_z = 0;
  for (int e = 0; e < g->n; e++) {
    int r0 = g->offs[e], n = g->kept[e], pad = g->offs[e + 1] - r0 - n;
    moe_layer_stats st;
    MOE_CHECK(moe_layer_forward(&l->inner[e], g->x + (size_t)r0 * D, n, g->y + (size_t)r0 * D, NULL, &st));
    s->inner_aux += st.aux_loss;
    s->inner_z += st.z_loss;
    if (pad) memset(g->y + (size_t)(r0 + n) * D, 0, (size_t)pad * D * 4); /* static padding */
  }
  return MOE_OK;
}

static moe_status inner_backward(moe_layer_t *l, const moe__groups *g, const moe__ffn *f, const float *dout,
                                 float daux, float dz, float *dxs) {
  (void)f;
  int D = l->cfg.D;
  for (int e = 0; e < g->n; e++) {
    int r0 = g->offs[e], n = g->kept[e], pad = g->offs[e + 1] - r0 - n;
    MOE_CHECK(moe_layer_backward(&l->inner[e], dout + (size_t)r0 * D, daux, dz, NULL, NULL,
                                 dxs + (size_t)r0 * D));
    if (pad) memset(dxs + (size_t)(r0 + n) * D, 0, (size_t)pad * D * 4);
  }
  return MOE_OK;
}

/* The inner layers have workspaces of their own. */
static size_t inner_bytes(const moe_layer_t *l, int ng, int rows) {
  (void)l, (void)ng, (void)rows;
  return 0;
}

static moe_status inner_alloc(moe_layer_t *l, int ng, int rows, moe__ffn *f) {
  (void)l, (void)ng, (void)rows;
  *f = (moe__ffn){0};
  return MOE_OK;
}

const moe__expert_src moe__experts_inner = {"inner", 0, inner_bytes, inner_alloc, inner_forward, inner_backward};
