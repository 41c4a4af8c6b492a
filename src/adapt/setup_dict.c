/* Tutel's dictionary of optimal setups (DIGEST P2 1.7): floor(capacity / R) -> (r, pipelining degree,
 * all-to-all algorithm), each entry found once by trials. Per (degree, algorithm) offered: r = 0 and
 * r = ceil(W/E) tried directly and r in [1, ceil(W/E) - 1], assumed convex, by a ternary-type search.
 *
 * The search is Fibonacci search, the integer form of golden-section search: each step keeps one of
 * its two probes for the next, so it costs one trial per shrink by 1.618 where a plain ternary search
 * costs two per shrink by 1.5. The paper's count, (log_1.5 ceil(W/E) + 2) * 4 * 2, charges one trial
 * per shrink by 1.5, which plain ternary search does not reach; Fibonacci search stays at or below it
 * (tests/test_pipe_model.c has the counts). */
#include <math.h>
#include <stdlib.h>

#include "adapt/pipe_model.h"

moe_status moe__setup_dict_init(moe__setup_dict *t, int world, int experts, int search_r, size_t window,
                                moe__setup_cost_fn cost, void *user) {
  MOE_TRY(t && cost, MOE_ERR_ARG, "setup_dict_init: NULL state or cost function");
  MOE_TRY(world >= 1 && experts >= 1, MOE_ERR_ARG, "setup_dict_init: world %d and experts %d must be >= 1",
          world, experts);
  int r_max = search_r ? world / experts + (world % experts != 0) : 1;
  /* degrees above 8 "hardly" pay and inflate the all-to-all's overhead */
  *t = (moe__setup_dict){.window = window ? window : 128, .r_max = r_max, .search_r = search_r != 0,
                         .deg = {1, 2, 4, 8}, .ndeg = 4, .algo = {MOE__A2A_LINEAR, MOE__A2A_2DH}, .nalgo = 2,
                         .cost = cost, .user = user, .margin = 0.03};
  t->memo = malloc(sizeof *t->memo * ((size_t)r_max + 1));
  MOE_TRY(t->memo, MOE_ERR_NOMEM, "setup_dict_init: out of memory for %zu trial costs", (size_t)r_max + 1);
  return MOE_OK;
}

moe_status moe__setup_dict_limit(moe__setup_dict *t, const int *deg, int ndeg, const moe__a2a *algo, int nalgo) {
  MOE_TRY(ndeg >= 1 && ndeg <= MOE__SETUP_MAX_DEG && nalgo >= 1 && nalgo <= 2, MOE_ERR_ARG,
          "setup_dict_limit: %d degrees (want 1 to %d) and %d algorithms (want 1 or 2)", ndeg, MOE__SETUP_MAX_DEG, nalgo);
  for (int i = 0; i < ndeg; i++)
    MOE_TRY(deg[i] >= 1 && (i == 0 || deg[i] > deg[i - 1]), MOE_ERR_ARG,
            "setup_dict_limit: degree[%d] = %d: degrees must be >= 1 and increasing", i, deg[i]);
  MOE_TRY(nalgo == 1 || algo[0] != algo[1], MOE_ERR_ARG, "setup_dict_limit: the same algorithm twice");
  for (int i = 0; i < ndeg; i++) t->deg[i] = deg[i];
  for (int i = 0; i < nalgo; i++) t->algo[i] = algo[i];
  t->ndeg = ndeg, t->nalgo = nalgo;
  return MOE_OK;
}

double moe__setup_dict_bound(const moe__setup_dict *t) {
  return (t->search_r ? log((double)t->r_max) / log(1.5) + 2 : 1) * t->ndeg * t->nalgo;
}

/* The cost of (r, d, a) at capacity c: remembered within one (d, a) search, else one trial. */
static moe_status trial(moe__setup_dict *t, size_t c, int r, int d, moe__a2a a, double *out) {
  if (!isnan(t->memo[r])) {
    *out = t->memo[r];
    return MOE_OK;
  }
  moe__setup s = {.r = r, .d = d, .a = a};
  t->trials++;
  moe_status st = t->cost(t->user, c, &s, out);
  MOE_TRY(st == MOE_OK, st, "setup trial at capacity %zu (r %d, degree %d, %s): %s", c, r, d,
          a == MOE__A2A_LINEAR ? "linear" : "2DH", moe_last_error());
  MOE_TRY(*out >= 0, MOE_ERR_VALUE, "setup trial at capacity %zu (r %d, degree %d): cost %g is not >= 0", c,
          r, d, *out);
  t->memo[r] = *out;
  return MOE_OK;
}

/* Fibonacci search for the leftmost minimum of a convex cost over r in [lo, hi] (non-empty). The
 * interval is padded to F_k - 1 points; points past hi cost +inf without a trial. */
static moe_status fib_search(moe__setup_dict *t, size_t c, int d, moe__a2a a, int lo, int hi, int *r,
                             double *cost) {
  long long f[64] = {0, 1}, x = lo; /* 64-bit: the padded interval may pass INT_MAX */
  int k = 1;
  while (f[k] - 1 < (long long)hi - lo + 1) k++, f[k] = f[k - 1] + f[k - 2];
  for (; k > 3; k--) { /* [x, x + F_k - 2]: probes at F_{k-2} - 1 and F_{k-1} - 1, either kept next */
    long long x1 = x + f[k - 2] - 1, x2 = x + f[k - 1] - 1;
    double c1 = INFINITY, c2 = INFINITY;
    if (x1 <= hi) MOE_CHECK(trial(t, c, (int)x1, d, a, &c1));
    if (x2 <= hi) MOE_CHECK(trial(t, c, (int)x2, d, a, &c2));
    if (c1 > c2) x = x1 + 1; /* else the leftmost minimum lies before x2 */
  }
  *r = (int)x; /* x <= hi: it moves only past a probe before one that was tried */
  return trial(t, c, *r, d, a, cost);
}

/* The best r for (d, a): r = 0, the searched [1, r_max - 1], r = r_max; ties to the smaller r. */
static moe_status best_r(moe__setup_dict *t, size_t c, int d, moe__a2a a, int *r, double *cost) {
  for (size_t i = 0; i <= (size_t)t->r_max; i++) t->memo[i] = NAN;
  *r = t->search_r ? 0 : 1;
  MOE_CHECK(trial(t, c, *r, d, a, cost));
  if (!t->search_r) return MOE_OK;
  double x;
  int rx;
  if (t->r_max >= 2) {
    MOE_CHECK(fib_search(t, c, d, a, 1, t->r_max - 1, &rx, &x));
    if (x < *cost) *cost = x, *r = rx;
  }
  MOE_CHECK(trial(t, c, t->r_max, d, a, &x));
  if (x < *cost) *cost = x, *r = t->r_max;
  return MOE_OK;
}

moe_status moe__setup_dict_get(moe__setup_dict *t, size_t capacity, moe__setup *out) {
  MOE_TRY(t && out, MOE_ERR_ARG, "setup_dict_get: NULL argument");
  uint64_t key = capacity / t->window, v;
  if (moe__u64map_get(&t->map, key, &v)) {
    *out = (moe__setup){.r = (int)(v >> 16), .d = (int)(v >> 8 & 0xff), .a = (moe__a2a)(v & 0xff)};
    return MOE_OK;
  }
  double best = INFINITY;
  int one = !t->search_r && t->ndeg * t->nalgo == 1; /* one setup: nothing to try */
  if (one) best = 0, *out = (moe__setup){.r = 1, .d = t->deg[0], .a = t->algo[0]};
  for (int i = 0; i < t->ndeg && !one; i++)
    for (int j = 0; j < t->nalgo; j++) {
      int r;
      double x;
      MOE_CHECK(best_r(t, capacity, t->deg[i], t->algo[j], &r, &x));
      /* setups come simplest first (degree 1, Linear); a later one must win by the margin, since a
       * trial is a step or two on a machine whose steps vary by more than that */
      if (x < (isfinite(best) ? best * (1 - t->margin) : best))
        best = x, *out = (moe__setup){.r = r, .d = t->deg[i], .a = t->algo[j]};
    }
  MOE_TRY(isfinite(best), MOE_ERR_VALUE, "setup trials at capacity %zu: no setup has a finite cost", capacity);
  return moe__u64map_put(&t->map, key, (uint64_t)out->r << 16 | (uint64_t)out->d << 8 | (uint64_t)out->a);
}

void moe__setup_dict_free(moe__setup_dict *t) {
  moe__u64map_free(&t->map);
  free(t->memo);
  t->memo = NULL;
}
