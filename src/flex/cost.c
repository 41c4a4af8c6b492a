/* The balance ratio (P3 Eq. 6) and the step-time model (Eqs. 5, 7-9) the policy maker compares
 * placements with, and the least-squares fit that turns profiled (size, seconds) samples into its
 * latency and bandwidth terms. */
#include <math.h>
#include <stdlib.h>

#include "flex/flex.h"

double moe__flex_link_time(moe__flex_link l, double x) { return x > 0 ? l.lat + x / l.bw : 0; }

moe_status moe__flex_fit(const double *x, const double *seconds, int n, moe__flex_link *out) {
  MOE_TRY(n >= 2, MOE_ERR_VALUE, "flex fit: %d samples, at least 2 needed", n);
  double mx = 0, my = 0;
  for (int i = 0; i < n; i++) {
    MOE_TRY(isfinite(x[i]) && isfinite(seconds[i]), MOE_ERR_VALUE, "flex fit: sample %d (%g, %g s) is not finite",
            i, x[i], seconds[i]);
    mx += x[i] / n;
    my += seconds[i] / n;
  }
  double sxx = 0, sxy = 0; /* centred sums: no cancellation between large x and small seconds */
  for (int i = 0; i < n; i++) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (seconds[i] - my);
  }
  MOE_TRY(sxx > 0, MOE_ERR_VALUE, "flex fit: all %d samples have the same size %g", n, mx);
  double slope = sxy / sxx;
  MOE_TRY(slope > 0, MOE_ERR_VALUE, "flex fit: time falls with size (slope %g s per unit): not a bandwidth", slope);
  *out = (moe__flex_link){.lat = my - slope * mx, .bw = 1 / slope};
  return MOE_OK;
}

double moe__flex_balance(const moe__flex_table *t, const int64_t *Ie) {
  double load[MOE__FLEX_MAX_RANKS] = {0}, total = 0, max = 0;
  for (int e = 0; e < t->E; e++) {
    int ne = moe__flex_replicas(t, e);
    for (int g = 0; g < t->W; g++) load[g] += (double)Ie[e] * moe__flex_count(t, e, g) / ne;
    total += (double)Ie[e];
  }
  for (int g = 0; g < t->W; g++) max = fmax(max, load[g]);
  return total > 0 ? max / (total / t->W) : 1.0;
}

double moe__flex_compute_time(const moe__flex_env *env, double rows) {
  if (rows <= 0) return 0;
  int n = env->rate_n;
  if (n <= 0) return moe__flex_link_time(env->compute, rows);
  const double *x = env->rate_rows, *tps = env->rate_tps;
  int i = 0; /* the bucket below rows (or the first), interpolated towards the next */
  while (i + 2 < n && rows > x[i + 1]) i++;
  double per_row = 1 / tps[i];
  if (n > 1 && rows > x[i]) {
    double f = fmin(1, log2(rows / x[i]) / log2(x[i + 1] / x[i]));
    per_row += f * (1 / tps[i + 1] - 1 / tps[i]);
  }
  return env->compute.lat + rows * per_row;
}

static moe__flex_link link_between(const moe__flex_env *env, int g, int h) {
  int rpn = env->ranks_per_node;
  return rpn <= 0 || g / rpn == h / rpn ? env->a2a_intra : env->a2a_inter;
}

moe_status moe__flex_cost(const moe__flex_table *t, const int64_t *Isrc, const moe__flex_env *env,
                          double *per_rank, double *T) {
  int W = t->W, E = t->E;
  int64_t *r = malloc(sizeof(int64_t) * (size_t)W * (size_t)E * (size_t)W);
  MOE_TRY(r, MOE_ERR_NOMEM, "flex cost: routing of %d experts over %d ranks", E, W);
  moe_status st = moe__flex_route(t, Isrc, r);
  double worst = 0;
  for (int g = 0; st == MOE_OK && g < W; g++) {
    double tg = 0, recv[MOE__FLEX_MAX_RANKS] = {0};
    for (int e = 0; e < E; e++) {
      if (!moe__flex_count(t, e, g)) continue;
      int64_t tokens = 0;
      for (int h = 0; h < W; h++) {
        int64_t x = r[((size_t)h * E + e) * W + g];
        tokens += x;
        if (h != g) recv[h] += (double)x * env->token_bytes;
      }
      tg += moe__flex_compute_time(env, (double)tokens);
      int ranks[MOE__FLEX_MAX_RANKS], m = moe__flex_ranks(t, e, ranks);
      if (m > 1) tg += moe__flex_link_time(env->allreduce, 2.0 * (m - 1) / m * env->grad_bytes);
    }
    for (int h = 0; h < W; h++) tg += 4 * moe__flex_link_time(link_between(env, h, g), recv[h]);
    if (per_rank) per_rank[g] = tg;
    worst = fmax(worst, tg);
  }
  free(r);
  if (st == MOE_OK) *T = worst;
  return st;
}

double moe__flex_xfer_time(const moe__flex_env *env, const moe__flex_xfers *l, int from) {
  double s = 0;
  for (int i = from; i < l->n; i++)
    s += moe__flex_link_time(link_between(env, l->x[i].src, l->x[i].dst), (double)l->x[i].bytes);
  return s;
}
