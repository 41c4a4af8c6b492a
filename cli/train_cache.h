/* Sample-assignment caching for moe train (DynaMoE 4.2; see train_cache.c). */
#ifndef MOE_TRAIN_CACHE_H
#define MOE_TRAIN_CACHE_H

#include "moe.h"

typedef struct {
  float on, off;  /* switch on at frac_same >= on (from epoch min_epoch), off below off */
  int min_epoch;
} assign_cache_opts;
typedef struct assign_cache assign_cache;
int assign_cache_new(assign_cache **out, const moe_model_t *m, int n, const assign_cache_opts *o);
/* Before a step on samples ids (n): hands the blocks last epoch's assignments when caching is on. */
int assign_cache_before(assign_cache *c, moe_model_t *m, const int32_t *ids, int n);
/* After the step: records the router's choices and counts the samples not reassigned. */
void assign_cache_after(assign_cache *c, const moe_model_t *m, const int32_t *ids, int n);
/* At the end of epoch `epoch` (0-based): the metric over all ranks, frac_same (-1 before any), and the
 * switch; returns non-zero when the ranks could not be reached (the message in moe_last_error). */
int assign_cache_epoch(assign_cache *c, int epoch, int *on, double *frac_same);
void assign_cache_free(assign_cache *c);

#endif
