/* What the classifier's and the language model's training share: the flags of the layers' options and
 * of the RECOMPILE adjustments (dynamic capacity, sample-assignment caching), parsed once for both, and
 * the adjustments' report (the trainer runs them). */
#ifndef MOE_TRAIN_ADJUST_H
#define MOE_TRAIN_ADJUST_H

#include <stdio.h>

#include "moe.h"

/* The switch of caching, and the adjustments: --capacity dynamic (per-expert capacities through
 * RECOMPILE), --cache-assignments (DynaMoE's sample-assignment caching); the library's defaults. */
typedef moe_cache_switch assign_cache_opts;
typedef moe_train_adjust train_adjust;
void train_adjust_defaults(train_adjust *a);
/* With dynamic capacity, its line ("dynamic capacity: N recompiles, ...") on f. */
void train_capacity_report(const moe_trainer *t, FILE *f);

/* The flags with a value v of the layer's options (--capacity X|dynamic, --dispatch, --dtype; returns
 * 1) and of the adjustments (--delta-launch, --headroom, --cache-on, --cache-off, --cache-min-epoch;
 * returns 2); 0 when f is none of them. *ok is 0 for a bad value, *st a parser's error (message set).
 * --cache-assignments, which takes no value, is each command's own. */
int train_adjust_flag(const char *f, const char *v, moe_layer_config *m, train_adjust *a, int *ok, moe_status *st);

#endif
