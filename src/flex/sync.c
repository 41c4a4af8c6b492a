/* The replica groups' gradient all-reduces (P3 1.7): the gradients of an expert held by several ranks
 * are summed over those ranks, issued by every rank in ascending logical expert id. Two ranks that
 * share several groups then meet them in the same order, so none waits on a call the other has not
 * reached. Training merges the groups of the same ranks into one sum (moe__flex_rank_sets, grads.c). */
#include "flex/flex.h"

moe_status moe__flex_sync_groups(const moe__flex_table *t, int rank, moe__flex_group *out, int *n) {
  MOE_TRY(rank >= -1 && rank < t->W, MOE_ERR_ARG, "flex sync: rank %d not in [-1, %d)", rank, t->W);
  *n = 0;
  for (int e = 0; e < t->E; e++) {
    moe__flex_group *grp = &out[*n];
    grp->expert = e;
    grp->n = moe__flex_ranks(t, e, grp->ranks);
    if (grp->n > 1 && (rank < 0 || moe__flex_count(t, e, rank))) (*n)++;
  }
  return MOE_OK;
}

int moe__flex_rank_sets(const moe__flex_table *t, int *set_of, uint64_t *masks) {
  int n = 0;
  for (int e = 0; e < t->E; e++) {
    uint64_t m = 0;
    for (int g = 0; g < t->W; g++)
      if (moe__flex_count(t, e, g)) m |= (uint64_t)1 << g;
    set_of[e] = -1;
    if (!(m & (m - 1))) continue; /* one rank */
    for (int k = 0; k < n && set_of[e] < 0; k++)
      if (masks[k] == m) set_of[e] = k;
    if (set_of[e] < 0) masks[n] = m, set_of[e] = n++;
  }
  return n;
}
