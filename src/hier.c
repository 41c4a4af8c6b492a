/* Hierarchical MoE (DynaMoE): the experts of a layer are themselves MoE layers, each with its own
 * router. The outer layer routes, dispatches and combines as usual; this file replaces the expert
 * FFNs of experts.c by one inner layer per expert, run on that expert's kept rows. */
#include <string.h>

#include "layer_internal.h"

moe_status moe__inner_forward(moe_layer_t *l) {
  moe__layer_state *s = l->st;
  int D = l->cfg.D;
  s->inner_aux = s->inner_z = 0;
  for (int e = 0; e < l->cfg.E; e++) {
    int r0 = s->offs[e], n = s->kept[e], pad = s->offs[e + 1] - r0 - n;
    moe_layer_stats st;
    MOE_CHECK(moe_layer_forward(&l->inner[e], s->xs + (size_t)r0 * D, n, s->out + (size_t)r0 * D, NULL, &st));
    s->inner_aux += st.aux_loss;
    s->inner_z += st.z_loss;
    if (pad) memset(s->out + (size_t)(r0 + n) * D, 0, (size_t)pad * D * 4); /* static padding */
  }
  return MOE_OK;
}

moe_status moe__inner_backward(moe_layer_t *l, const float *dout, float daux, float dz, float *dxs) {
  moe__layer_state *s = l->st;
  int D = l->cfg.D;
  for (int e = 0; e < l->cfg.E; e++) {
    int r0 = s->offs[e], n = s->kept[e], pad = s->offs[e + 1] - r0 - n;
    MOE_CHECK(moe_layer_backward(&l->inner[e], dout + (size_t)r0 * D, daux, dz, NULL, NULL,
                                 dxs + (size_t)r0 * D));
    if (pad) memset(dxs + (size_t)(r0 + n) * D, 0, (size_t)pad * D * 4);
  }
  return MOE_OK;
}
