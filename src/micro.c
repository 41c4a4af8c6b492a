/* Micro-batches of the experts' stage (MPipeMoE 1.2): the groups' rows, which are sorted by expert, cut
 * into n contiguous parts of about rows / n rows each. The cuts fall between experts, never inside
 * one: an expert's GEMMs are then the very calls of the whole batch (moe__gemm_run_fixed), so every n
 * gives the same bits, weight gradients included; the price is that micro-batches are as even as the
 * experts' loads allow, and that n above the number of experts with rows leaves some empty. Part i
 * keeps all ng groups, those outside it empty. */
#include <math.h>

#include "layer_internal.h"

size_t moe__micro_bytes(int n, int ng) {
  return moe__arena_size((size_t)n * sizeof(moe__micro)) + moe__arena_size((size_t)n * (ng + 1) * 4);
}

moe_status moe__split_rows(moe_layer_t *l, int n) {
  moe__plan *p = &l->st->p;
  int ng = p->ng, rows = p->grows;
  p->mb = moe__arena_alloc(&l->st->route, (size_t)n * sizeof *p->mb);
  int32_t *offs = moe__arena_alloc(&l->st->route, (size_t)n * (ng + 1) * 4);
  MOE_TRY(p->mb && offs, MOE_ERR_STATE, "internal: routing workspace too small");
  p->n = n;
  p->mb_rows = 0;
  int b = 0; /* the group boundary where the part starts */
  for (int i = 0; i < n; i++) {
    int end = ng; /* the last part ends at the last group */
    if (i + 1 < n) { /* the boundary nearest to (i + 1) rows / n, never before b */
      double want = (double)(i + 1) * rows / n;
      end = b;
      while (end < ng && fabs(p->goffs[end + 1] - want) <= fabs(p->goffs[end] - want)) end++;
    }
    int lo = p->goffs[b], hi = p->goffs[end];
    int32_t *go = offs + (size_t)i * (ng + 1);
    for (int e = 0; e <= ng; e++) {
      int r = p->goffs[e];
      go[e] = (r < lo ? lo : r > hi ? hi : r) - lo;
    }
    p->mb[i] = (moe__micro){lo, hi - lo, lo, go};
    p->mb_rows = hi - lo > p->mb_rows ? hi - lo : p->mb_rows;
    b = end;
  }
  return MOE_OK;
}
