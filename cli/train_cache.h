/* Sample-assignment caching for moe train (DynaMoE 4.2; see train_cache.c). */
#ifndef MOE_TRAIN_CACHE_H
#define MOE_TRAIN_CACHE_H

#include "train_adjust.h"

typedef struct assign_cache assign_cache;
/* For n samples, `steps` steps per epoch; the switch takes effect delta steps after the metrics it
 * comes from (plus one). */
int assign_cache_new(assign_cache **out, const train_blocks *b, int n, int steps, int delta,
                     const assign_cache_opts *o);
/* Before step `step` on samples ids (n): applies a switch that is due, then hands the blocks last
 * epoch's assignments when caching is on. */
int assign_cache_before(assign_cache *c, int64_t step, const int32_t *ids, int n);
/* After the step: records the router's choices, counts the samples not reassigned, and hands the
 * trigger the metrics of this step. */
int assign_cache_after(assign_cache *c, int64_t step, const int32_t *ids, int n);
/* At the end of an epoch: frac_same over all ranks (-1 before any), the switch now, and the step it
 * last turned on at (-1 never); non-zero when the ranks could not be reached (moe_last_error). */
int assign_cache_epoch(assign_cache *c, double *frac_same, int *on, int64_t *on_from);
void assign_cache_free(assign_cache *c);

#endif
