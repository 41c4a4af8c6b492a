/* What the classifier's and the language model's training share: the MoE layers a training loop
 * adjusts (a view of either model's blocks), and the flags of the layers' options and of the RECOMPILE
 * adjustments (dynamic capacity, sample-assignment caching), parsed once for both. */
#ifndef MOE_TRAIN_ADJUST_H
#define MOE_TRAIN_ADJUST_H

#include "moe.h"

/* A model's L MoE layers, all of configuration cfg, and their stats of the last forward. */
typedef struct {
  moe_layer_t *layers;
  int L;
  const moe_layer_config *cfg;
  const moe_layer_stats *(*stats)(const void *model, int i);
  const void *model;
} train_blocks;
train_blocks train_blocks_of_model(moe_model_t *m);
train_blocks train_blocks_of_lm(moe_lm_t *m);
static inline const moe_layer_stats *train_block_stats(const train_blocks *b, int i) { return b->stats(b->model, i); }

/* The switch of caching, and the adjustments: --capacity dynamic (per-expert capacities through
 * RECOMPILE), --cache-assignments (DynaMoE's sample-assignment caching); the library's defaults. */
typedef moe_cache_switch assign_cache_opts;
typedef moe_train_adjust train_adjust;
void train_adjust_defaults(train_adjust *a);

/* The flags with a value v of the layer's options (--capacity X|dynamic, --dispatch, --dtype; returns
 * 1) and of the adjustments (--delta-launch, --headroom, --cache-on, --cache-off, --cache-min-epoch;
 * returns 2); 0 when f is none of them. *ok is 0 for a bad value, *st a parser's error (message set).
 * --cache-assignments, which takes no value, is each command's own. */
int train_adjust_flag(const char *f, const char *v, moe_layer_config *m, train_adjust *a, int *ok, moe_status *st);

#endif
