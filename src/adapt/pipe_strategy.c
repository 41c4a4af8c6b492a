/* The memory-reuse strategies of MPipeMoE (DIGEST P4 Table II) and the performance model that picks
 * one (Eqs. 7-10): each stream's work over its interfered speed, the slowest stream's time, summed over
 * forward and backward (P4 ambiguity 6). */
#include <float.h>
#include <math.h>

#include "adapt/pipe_model.h"

const char *const moe__reuse_names[MOE__REUSE_COUNT] = {"none", "s1", "s2", "s3", "s4"};

/* Work per stream in units of v0 ([GEMMs, all-to-alls, copies of b x M]); copying T_M counts 4 because
 * H = 4M in the paper's models. Backward: 4 GEMMs (data and weight gradients of two linears) + 1 to
 * recompute T_M, 2 all-to-alls + 1 to re-communicate T_DI. all: communication runs beside memory copies
 * too, so at mu_all instead of mu_comp (S3's mu is garbled in the paper: mu_all, P4 ambiguity 5). */
static const struct {
  double fw[3], bw[3];
  int all;
} table2[MOE__REUSE_COUNT] = {
    [MOE__REUSE_NONE] = {{2, 2, 0}, {4, 2, 0}, 0},
    [MOE__REUSE_S1] = {{2, 2, 5}, {4, 2, 5}, 1},
    [MOE__REUSE_S2] = {{2, 2, 4}, {4, 3, 4}, 1},
    [MOE__REUSE_S3] = {{2, 2, 1}, {5, 2, 1}, 1},
    [MOE__REUSE_S4] = {{2, 2, 0}, {5, 3, 0}, 0},
};

moe__interference moe__interference_default(void) {
  return (moe__interference){.sigma = 1.0, .mu_comp = 0.8, .mu_all = 0.8, .eta_all = 0.8};
}

static int positive(double x) { return isfinite(x) && x > 0; }
static int factor(double x) { return positive(x) && x <= 1; }

/* Eq. 10 for one pass: the slowest of the three streams. */
static double pass_time(const double q[3], const double v[3], const double speed[3]) {
  double t = 0;
  for (int i = 0; i < 3; i++)
    if (q[i] > 0 && q[i] * v[i] / speed[i] > t) t = q[i] * v[i] / speed[i];
  return t;
}

moe_status moe__reuse_cost(moe__reuse s, double b, double M, double H, const moe__speeds *w,
                           const moe__interference *f, double *seconds) {
  MOE_TRY(w && f && seconds && (unsigned)s < MOE__REUSE_COUNT, MOE_ERR_ARG, "reuse_cost: bad argument");
  MOE_TRY(positive(b) && positive(M) && positive(H), MOE_ERR_VALUE,
          "reuse_cost: b, M, H must be finite and > 0 (got %g, %g, %g)", b, M, H);
  MOE_TRY(positive(w->comp) && positive(w->comm), MOE_ERR_VALUE,
          "reuse_cost: W_comp and W_comm must be finite and > 0 (got %g, %g)", w->comp, w->comm);
  int copies = table2[s].fw[2] > 0 || table2[s].bw[2] > 0;
  MOE_TRY(!copies || positive(w->mem), MOE_ERR_VALUE,
          "reuse_cost: strategy %s copies to the host and needs W_mem finite and > 0 (got %g)",
          moe__reuse_names[s], w->mem);
  MOE_TRY(factor(f->sigma) && factor(f->mu_comp) && factor(f->mu_all) && factor(f->eta_all), MOE_ERR_VALUE,
          "reuse_cost: interference factors sigma %g, mu_comp %g, mu_all %g, eta_all %g must be in (0, 1]",
          f->sigma, f->mu_comp, f->mu_all, f->eta_all);
  double v[3] = {b * H * M, b * M, b * M}; /* Eqs. 7-9 */
  double speed[3] = {f->sigma * w->comp, (table2[s].all ? f->mu_all : f->mu_comp) * w->comm,
                     f->eta_all * w->mem};
  *seconds = pass_time(table2[s].fw, v, speed) + pass_time(table2[s].bw, v, speed);
  return MOE_OK;
}

moe_status moe__reuse_select(unsigned allowed, double b, double M, double H, const moe__speeds *w,
                             const moe__interference *f, moe__reuse *out, double *cost) {
  MOE_TRY(out && allowed && !(allowed & ~MOE__REUSE_ALL), MOE_ERR_ARG,
          "reuse_select: the allowed strategies (mask 0x%x) must be a non-empty subset of 0x%x", allowed,
          MOE__REUSE_ALL);
  double best = INFINITY;
  for (int s = 0; s < MOE__REUSE_COUNT; s++) {
    double c;
    if (!(allowed & MOE__REUSE_BIT(s))) continue;
    MOE_CHECK(moe__reuse_cost((moe__reuse)s, b, M, H, w, f, &c));
    if (c < best) best = c, *out = (moe__reuse)s;
  }
  if (cost) *cost = best;
  return MOE_OK;
}

moe_status moe__reuse_costs_cpu(double b, double M, double H, double comp, double comm, double cost[4]) {
  static const moe__reuse paper[4] = {MOE__REUSE_NONE, MOE__REUSE_S4, MOE__REUSE_S2, MOE__REUSE_S3};
  moe__speeds w = {comp, isinf(comm) ? DBL_MAX : comm, DBL_MAX}; /* the model's speeds are finite */
  moe__interference f = moe__interference_default();
  for (int r = 0; r < 4; r++) MOE_CHECK(moe__reuse_cost(paper[r], b, M, H, &w, &f, &cost[r]));
  return MOE_OK;
}
