/* FlexMoE's start-up profile (P3 1.5; moe_flex_profile in moe.h): the terms of the step-time model
 * measured on this machine and these ranks, the same on every rank. */
#include <math.h>
#include <stdlib.h>

#include "dist/dist.h"
#include "flex/wire.h"

/* Seconds of the fastest of 3 runs of an exchange of `rows` rows of D floats with every other rank. */
static moe_status time_a2a(const moe_dist *d, int rows, int D, float *buf, double *s) {
  int W = moe_dist_size(d), me = moe_dist_rank(d), c[4 * MOE__FLEX_MAX_RANKS];
  for (int q = 0; q < W; q++) c[q] = c[2 * W + q] = q == me ? 0 : rows, c[W + q] = c[3 * W + q] = q * rows;
  *s = INFINITY;
  for (int k = 0; k < 3; k++) {
    double t0 = moe__now();
    MOE_CHECK(moe__dist_alltoallv_rows(d, buf, c, c + W, buf + (size_t)W * rows * D, c + 2 * W, c + 3 * W, D));
    *s = fmin(*s, moe__now() - t0);
  }
  return MOE_OK;
}

/* latency and bandwidth from (bytes, seconds), the seconds the mean over ranks so that every rank
 * fits the same; a fit that fails (noise: a slope <= 0) falls back to the largest sample's rate. */
static moe_status fit_link(const moe_dist *d, const double *x, double *s, int n, moe__flex_link *out) {
  MOE_CHECK(moe_dist_allreduce(d, s, n));
  for (int i = 0; i < n; i++) s[i] /= moe_dist_size(d);
  if (moe__flex_fit(x, s, n, out) != MOE_OK || out->lat < 0) *out = (moe__flex_link){0, x[n - 1] / s[n - 1]};
  return MOE_OK;
}

/* Tokens per second of one expert of c's shape, forward and backward, on this process: the fastest of
 * 3 passes (after one to warm up) of `n` tokens through a layer of that one expert. Timing the layer
 * rather than its GEMMs counts what runs beside them per token (the activation, the biases, dispatch
 * and combine, the router's share) and the GEMMs at their own shapes: a step of case M spent about
 * 18% more than the sgemm rate said, the gap between Eq. 5's step and the measured one. */
static moe_status time_expert(const moe_layer_config *c, int n, double *tps) {
  moe_layer_config one;
  moe_layer_config_default(&one);
  one.D = c->D, one.H = c->H, one.E = 1, one.top_k = 1, one.act = c->act, one.dtype = c->dtype;
  one.threads = c->threads, one.expert_bias = c->expert_bias;
  moe_layer_t l;
  MOE_CHECK(moe_layer_init(&l, &one));
  moe_layer_init_params(&l, 1);
  size_t nd = (size_t)n * c->D;
  float *buf = malloc(sizeof *buf * nd * 3), *x = buf, *y = buf + nd, *dx = buf + 2 * nd;
  moe_status st = buf ? MOE_OK : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "replicas: profiling %d tokens", n);
  for (size_t i = 0; buf && i < nd; i++) x[i] = (float)((int)(i % 17) - 8) * 0.05f;
  double best = INFINITY;
  for (int k = 0; st == MOE_OK && k < 4; k++) {
    double t0 = moe__now();
    st = moe_layer_forward(&l, x, n, y, NULL, NULL);
    if (st == MOE_OK) st = moe_layer_backward(&l, x, 0, 0, NULL, NULL, dx); /* any dy: x */
    if (k) best = fmin(best, moe__now() - t0);
  }
  free(buf);
  moe_layer_free(&l);
  if (st == MOE_OK) *tps = n / best;
  return st;
}

/* Start-up profile (P3 1.5): tokens per second of the experts (time_expert), and the all-to-all's and
 * the all-reduce's latency and bandwidth fitted over 4 sizes each. */
moe_status moe_flex_profile(const moe_layer_config *c, moe_flex_env *out) {
  const moe_dist *d = c->dist;
  MOE_TRY(moe_dist_size(d) > 1, MOE_ERR_ARG, "replicas: profiling needs more than one rank (under mpirun)");
  int sizes[4] = {1, 16, 64, 256}, D = c->D, W = moe_dist_size(d);
  float *buf = calloc((size_t)2 * W * 256 * D, sizeof *buf);
  MOE_TRY(buf, MOE_ERR_NOMEM, "replicas: profiling buffers");
  double x[4], s[4];
  moe__flex_link a2a, ar;
  moe_status st = MOE_OK;
  for (int i = 0; st == MOE_OK && i < 4; i++) {
    x[i] = 4.0 * D * sizes[i];
    st = time_a2a(d, sizes[i], D, buf, &s[i]);
  }
  if (st == MOE_OK) st = fit_link(d, x, s, 4, &a2a);
  for (int i = 0; st == MOE_OK && i < 4; i++) {
    int n = sizes[i] * D;
    x[i] = 2.0 * (W - 1) / W * 4.0 * n;
    s[i] = INFINITY;
    for (int k = 0; st == MOE_OK && k < 3; k++) {
      double t0 = moe__now();
      st = moe__dist_allreduce_f32(d, buf, n);
      s[i] = fmin(s[i], moe__now() - t0);
    }
  }
  if (st == MOE_OK) st = fit_link(d, x, s, 4, &ar);
  free(buf);
  double tps = 0;
  if (st == MOE_OK) st = time_expert(c, 256, &tps);
  MOE_CHECK(st);
  MOE_CHECK(moe_dist_allreduce(d, &tps, 1)); /* the mean: every rank plans alike */
  *out = (moe_flex_env){.tps = tps / W, .a2a_lat = a2a.lat, .a2a_bw = a2a.bw, .ar_lat = ar.lat, .ar_bw = ar.bw,
                           .token_bytes = 4.0 * D,
                           .expert_bytes = (double)moe__flex_expert_floats(c) * 4};
  return MOE_OK;
}

