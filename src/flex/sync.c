/* The replica groups' gradient all-reduces (P3 1.7): the gradients of an expert held by several ranks
 * are summed over those ranks, one all-reduce per expert, issued by every rank in ascending logical
 * expert id. Two ranks that share several groups then meet them in the same order, so none waits on a
 * call the other has not reached. */
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
