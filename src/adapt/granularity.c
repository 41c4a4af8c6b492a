/* Adaptive pipelining granularity, MPipeMoE's Algorithm 1 (DIGEST P4 1.3): on the hypothesis that the
 * best n never decreases as B grows, each n owns one range of batch sizes, and a size inside it needs no
 * trials. After a search, the range widened is the one owned by the n found (the printed find(S, B)
 * is an erratum, P4 ambiguity 2); where widening would swallow a neighbour's range, the hypothesis has
 * failed there and only the per-B cache remembers the answer. */
#include <math.h>
#include <string.h>

#include "adapt/pipe_model.h"

static const int default_cand[] = {1, 2, 4, 8, 16};

moe_status moe__gran_init(moe__gran *g, const int *cand, int ncand, moe__gran_cost_fn cost, void *user) {
  MOE_TRY(g && cost, MOE_ERR_ARG, "gran_init: NULL state or cost function");
  if (!cand) cand = default_cand, ncand = (int)(sizeof default_cand / sizeof *default_cand);
  MOE_TRY(ncand >= 1 && ncand <= MOE__GRAN_MAX_CAND, MOE_ERR_ARG,
          "gran_init: %d candidate n values, want 1 to %d", ncand, MOE__GRAN_MAX_CAND);
  for (int i = 0; i < ncand; i++)
    MOE_TRY(cand[i] >= 1 && (i == 0 || cand[i] > cand[i - 1]), MOE_ERR_ARG,
            "gran_init: candidate n[%d] = %d: candidates must be >= 1 and increasing", i, cand[i]);
  *g = (moe__gran){.ncand = ncand, .cost = cost, .user = user};
  memcpy(g->cand, cand, sizeof *cand * (size_t)ncand);
  return MOE_OK;
}

/* Index of the first range ending at or after B (the ranges are disjoint, so their ends are sorted too). */
static int first_ending_from(const moe__gran *g, size_t B) {
  int lo = 0, hi = g->nranges;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (g->ranges[mid].hi < B) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* searchBestGran: every candidate tried, the cheapest kept (ties to the smaller n). A cost may be +inf
 * for an n that cannot run; NaN or negative costs are errors. */
static moe_status search(moe__gran *g, size_t B, int *n) {
  double best = INFINITY;
  g->searches++;
  for (int i = 0; i < g->ncand; i++) {
    double t;
    g->trials++;
    moe_status st = g->cost(g->user, B, g->cand[i], &t);
    MOE_TRY(st == MOE_OK, st, "granularity search at B = %zu, n = %d: %s", B, g->cand[i], moe_last_error());
    MOE_TRY(t >= 0, MOE_ERR_VALUE, "granularity search at B = %zu, n = %d: cost %g is not >= 0", B, g->cand[i],
            t);
    if (t < best) best = t, *n = g->cand[i];
  }
  MOE_TRY(isfinite(best), MOE_ERR_VALUE, "granularity search at B = %zu: no candidate n has a finite cost", B);
  return MOE_OK;
}

/* Gives B to n's range (find-by-n): a new range [B, B], or n's widened to B unless it would overlap a
 * neighbour. B lies in no range, so a new one overlaps nothing, and only the neighbour on B's side can
 * be reached by widening. */
static void remember_range(moe__gran *g, size_t B, int n) {
  int idx = -1;
  for (int i = 0; i < g->nranges; i++)
    if (g->ranges[i].n == n) idx = i;
  if (idx < 0) {
    int at = first_ending_from(g, B);
    memmove(&g->ranges[at + 1], &g->ranges[at], sizeof *g->ranges * (size_t)(g->nranges - at));
    g->ranges[at] = (moe__gran_range){.lo = B, .hi = B, .n = n};
    g->nranges++;
    return;
  }
  moe__gran_range *r = &g->ranges[idx];
  size_t lo = B < r->lo ? B : r->lo, hi = B > r->hi ? B : r->hi;
  if ((idx > 0 && g->ranges[idx - 1].hi >= lo) || (idx + 1 < g->nranges && g->ranges[idx + 1].lo <= hi)) {
    g->conflicts++;
    return;
  }
  r->lo = lo, r->hi = hi;
}

int moe__gran_known(const moe__gran *g, size_t B, int *n) {
  uint64_t v;
  if (moe__u64map_get(&g->cache, B, &v)) {
    *n = (int)v;
    return 1;
  }
  int i = first_ending_from(g, B);
  if (i < g->nranges && g->ranges[i].lo <= B) {
    *n = g->ranges[i].n;
    return 1;
  }
  return 0;
}

moe_status moe__gran_get(moe__gran *g, size_t B, int *n) {
  MOE_TRY(g && n, MOE_ERR_ARG, "gran_get: NULL argument");
  if (!moe__gran_known(g, B, n)) {
    MOE_CHECK(search(g, B, n));
    remember_range(g, B, *n);
  }
  return moe__u64map_put(&g->cache, B, (uint64_t)*n);
}

void moe__gran_free(moe__gran *g) { moe__u64map_free(&g->cache); }
