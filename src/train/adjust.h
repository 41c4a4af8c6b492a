/* DynaMoE's adjustments that the trainer runs (moe_trainer_config.adjust): per-expert dynamic capacity
 * (dyncap.c) and sample-assignment caching (assign_cache.c), over a model's MoE layers. */
#ifndef MOE_TRAIN_ADJUST_H
#define MOE_TRAIN_ADJUST_H

#include "internal.h"

/* A model's L MoE layers, all of configuration cfg, and their stats of the last forward. */
typedef struct {
  moe_layer_t *layers;
  int L;
  const moe_layer_config *cfg;
  const moe_layer_stats *(*stats)(void *self, int i);
  void *self;
} moe__train_blocks;

typedef struct moe__dyncap moe__dyncap;
/* Every block starts at capacity_setting's C for batches of B rows (or at its own per-expert
 * capacities for B, a resumed model's); decisions take effect delta steps late. */
moe_status moe__dyncap_start(moe__dyncap **out, const moe__train_blocks *b, int B, int delta, float headroom);
moe_status moe__dyncap_begin(moe__dyncap *d, int64_t step); /* applies what is due at this step */
moe_status moe__dyncap_push(moe__dyncap *d, int64_t step, double loss);
void moe__dyncap_stats(const moe__dyncap *d, moe_recompile_stats *out);
void moe__dyncap_free(moe__dyncap *d);

typedef struct moe__assign_cache moe__assign_cache;
/* For n samples, `steps` steps per epoch; the switch takes effect delta steps after the metrics it
 * comes from (plus one). */
moe_status moe__assign_cache_new(moe__assign_cache **out, const moe__train_blocks *b, int n, int steps, int delta,
                                 const moe_cache_switch *o);
/* Before step `step` on samples ids (n): applies a switch that is due, then hands the blocks last
 * epoch's assignments when caching is on. */
moe_status moe__assign_cache_before(moe__assign_cache *c, int64_t step, const int32_t *ids, int n);
/* After the step: records the router's choices, counts the samples not reassigned, and hands the
 * trigger the metrics of this step. */
moe_status moe__assign_cache_after(moe__assign_cache *c, int64_t step, const int32_t *ids, int n);
/* At the end of an epoch: frac_same over all ranks (-1 before any), the switch now, and the step it
 * last turned on at (-1 never). */
moe_status moe__assign_cache_epoch(moe__assign_cache *c, double *frac_same, int *on, int64_t *on_from);
void moe__assign_cache_free(moe__assign_cache *c);

#endif
