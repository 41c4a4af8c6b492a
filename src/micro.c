/* Micro-batches of the experts' stage (MPipeMoE 1.2): the groups (this process's experts) cut into n
 * runs of consecutive experts, each carrying about 1/n of the assignments. The cuts fall between
 * experts, never inside one: an expert's GEMMs are then the very calls of the whole batch
 * (moe__gemm_run_fixed), so every n gives the same bits, weight gradients included; the price is
 * that micro-batches are as even as the experts' loads allow, and that n above the number of experts
 * with rows leaves some empty. The loads are the counts over all ranks, so that every rank cuts at
 * the same experts and each micro-batch is one exchange: the rows every rank sends to each owner for
 * local experts [e0, e1). Part i keeps all ng groups, those outside it empty. */
#include <math.h>

#include "layer_internal.h"

size_t moe__micro_bytes(int n, int ng) {
  return moe__arena_size((size_t)n * sizeof(moe__micro)) + moe__arena_size((size_t)n * (ng + 1) * 4) +
         moe__arena_size((size_t)(ng + 1) * sizeof(double));
}

moe_status moe__split_rows(moe_layer_t *l, int n) {
  moe__plan *p = &l->st->p;
  int ng = p->ng, W = l->cfg.E / ng;
  p->mb = moe__arena_alloc(&l->st->route, (size_t)n * sizeof *p->mb);
  int32_t *offs = moe__arena_alloc(&l->st->route, (size_t)n * (ng + 1) * 4);
  double *cum = moe__arena_alloc(&l->st->route, (size_t)(ng + 1) * sizeof *cum);
  MOE_TRY(p->mb && offs && cum, MOE_ERR_STATE, "internal: routing workspace too small");
  cum[0] = 0; /* assignments to local expert j on every owner, cumulated */
  for (int j = 0; j < ng; j++) {
    cum[j + 1] = cum[j];
    for (int q = 0; q < W; q++) cum[j + 1] += p->stat_counts[q * ng + j];
  }
  p->n = n;
  p->mb_rows = 0;
  int b = 0; /* the expert where the part starts */
  for (int i = 0; i < n; i++) {
    int end = ng; /* the last part ends at the last expert */
    if (i + 1 < n) { /* the boundary nearest to (i + 1) / n of the load, never before b */
      double want = (i + 1) * cum[ng] / n;
      end = b;
      while (end < ng && fabs(cum[end + 1] - want) <= fabs(cum[end] - want)) end++;
    }
    int lo = p->goffs[b], hi = p->goffs[end];
    int32_t *go = offs + (size_t)i * (ng + 1);
    for (int e = 0; e <= ng; e++) {
      int r = p->goffs[e];
      go[e] = (r < lo ? lo : r > hi ? hi : r) - lo;
    }
    p->mb[i] = (moe__micro){lo, hi - lo, b, end, go};
    p->mb_rows = hi - lo > p->mb_rows ? hi - lo : p->mb_rows;
    b = end;
  }
  return MOE_OK;
}
