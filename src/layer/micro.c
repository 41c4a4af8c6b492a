/* Micro-batches of the experts' stage (MPipeMoE 1.2): the groups (this process's experts) cut into n
 * runs of consecutive experts, each carrying about 1/n of the rows. The cuts fall between experts,
 * never inside one: an expert's GEMMs are then the very calls of the whole batch
 * (moe__gemm_run_fixed), and a hierarchical expert's inner layer runs once, in its own micro-batch
 * (sources/inner.c), so every n gives the same bits, weight gradients included; the price is
 * that micro-batches are as even as the experts' loads allow, and that n above the number of experts
 * with rows leaves some empty. The cuts are made over keys that every rank knows the loads of, so that
 * every rank cuts at the same experts and each micro-batch is one exchange: the local experts [k0, k1)
 * of every owner (their rows over all owners: the assignments over all ranks, dynamic; the capacity
 * slots computed, padding included, static), or, when the transport names each group's global expert
 * (plan.gkey: the sharded layout), the tasks of experts [k0, k1) on every rank. Part i keeps all ng
 * groups, those outside it empty; its own are [e0, e1), experts without rows included. */
#include <math.h>

#include "layer/stages.h"

size_t moe__micro_bytes(int n, int ng) {
  return moe__arena_size((size_t)n * sizeof(moe__micro)) + moe__arena_size((size_t)n * (ng + 1) * 4) +
         moe__arena_size((size_t)(ng + 1) * sizeof(double));
}

/* The first group whose key is at least k. */
static int first_group(const moe__plan *p, int k) {
  if (!p->gkey) return k;
  int g = 0;
  while (g < p->ng && p->gkey[g] < k) g++;
  return g;
}

moe_status moe__split_rows(const moe_layer_config *cfg, int n, moe__arena *route, moe__plan *p) {
  int ng = p->ng, E = cfg->E, nk = p->gkey ? E : ng, W = nk ? E / nk : 1;
  int is_static = cfg->dispatch == MOE_DISPATCH_STATIC;
  p->mb = moe__arena_alloc(route, (size_t)n * sizeof *p->mb);
  int32_t *offs = moe__arena_alloc(route, (size_t)n * (ng + 1) * 4);
  double *cum = moe__arena_alloc(route, (size_t)(nk + 1) * sizeof *cum);
  MOE_TRY(p->mb && offs && cum, MOE_ERR_STATE, "internal: routing workspace too small");
  cum[0] = 0; /* the rows of key j on every owner, cumulated */
  for (int j = 0; j < nk; j++) {
    cum[j + 1] = cum[j];
    for (int q = 0, e = j; q < W; q++, e += nk)
      cum[j + 1] += is_static ? p->offs[e + 1] - p->offs[e] : p->stat_counts[e];
  }
  p->n = n;
  p->mb_rows = 0;
  int b = 0; /* the key where the part starts */
  for (int i = 0; i < n; i++) {
    int end = nk; /* the last part ends at the last key */
    if (i + 1 < n) { /* the boundary nearest to (i + 1) / n of the load, never before b */
      double want = (i + 1) * cum[nk] / n;
      end = b;
      while (end < nk && fabs(cum[end + 1] - want) <= fabs(cum[end] - want)) end++;
    }
    int g0 = first_group(p, b), g1 = first_group(p, end);
    int lo = p->goffs[g0], hi = p->goffs[g1];
    int32_t *go = offs + (size_t)i * (ng + 1);
    for (int e = 0; e <= ng; e++) {
      int r = p->goffs[e];
      go[e] = (r < lo ? lo : r > hi ? hi : r) - lo;
    }
    p->mb[i] = (moe__micro){lo, hi - lo, g0, g1, b, end, go};
    p->mb_rows = hi - lo > p->mb_rows ? hi - lo : p->mb_rows;
    b = end;
  }
  return MOE_OK;
}
