/* moe_layer_init: the plug-ins a configuration gets (DESIGN 3.2-3.4) and the inner layers of a
 * hierarchical layer. The one place that names every transport, expert source and policy: the layer
 * (src/layer/) names none, so that it depends on no feature folder. */
#include "adapt/layer_setup.h"
#include "flex/wire.h"
#include "shard/shard.h"

static moe__plugins choose(const moe_layer_config *c) {
  const moe__transport *tr = !c->dist ? &moe__transport_local
                             : moe__layer_sharded(c) ? &moe__transport_shard
                             : c->dispatch == MOE_DISPATCH_STATIC ? &moe__transport_static
                             : c->replica_slots ? &moe__transport_flex : &moe__transport_a2a;
  const moe__expert_src *src = c->inner_experts ? &moe__experts_inner : c->external_experts ? NULL
                               : moe__layer_sharded(c) ? &moe__experts_shard
                               : c->expert_type > 0 ? &moe__experts_quant : &moe__experts_own;
  return (moe__plugins){tr, src, &moe__policy_setup};
}

moe_status moe_layer_init(moe_layer_t *l, const moe_layer_config *cfg) {
  MOE_TRY(l && cfg, MOE_ERR_ARG, "moe_layer_init: NULL argument");
  moe__plugins pl = choose(cfg);
  MOE_CHECK(moe__layer_init(l, cfg, &pl));
  if (!l->inner) return MOE_OK;
  moe_layer_config ic = *cfg;
  ic.E = cfg->inner_experts;
  ic.top_k = cfg->inner_top_k;
  ic.inner_experts = ic.inner_top_k = 0;
  ic.normalize_topk = -1; /* by the inner k: the outer setting is about the outer k */
  ic.select_bias = ic.n_group = ic.shared_H = ic.shared_gate = 0; /* the outer router's and the outer layer's */
  ic.routed_scale = 1.0f;
  for (int e = 0; e < cfg->E; e++) {
    moe_status st = moe_layer_init(&l->inner[e], &ic);
    if (st != MOE_OK) {
      moe_layer_free(l);
      return st;
    }
  }
  return MOE_OK;
}
