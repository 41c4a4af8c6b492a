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

/* Mean over ranks of a (n), then rank 0's values on every rank (its own plus zeros: exact), so that
 * every rank plans with the same bits. */
static moe_status agree(const moe_dist *d, double *a, int n) {
  MOE_CHECK(moe_dist_allreduce(d, a, n));
  for (int i = 0; i < n; i++) a[i] = moe_dist_rank(d) ? 0 : a[i] / moe_dist_size(d);
  return moe_dist_allreduce(d, a, n);
}

/* latency and bandwidth from (bytes, seconds), the seconds agreed (the mean over ranks) so that every
 * rank fits the same; a fit that fails (noise: a slope <= 0) falls back to the largest sample's rate. */
static moe_status fit_link(const moe_dist *d, const double *x, double *s, int n, moe__flex_link *out) {
  MOE_CHECK(agree(d, s, n));
  if (moe__flex_fit(x, s, n, out) != MOE_OK || out->lat < 0) *out = (moe__flex_link){0, x[n - 1] / s[n - 1]};
  return MOE_OK;
}

/* Seconds of the fastest of `reps` forward + backward passes of n rows through l, after `warm` untimed. */
static moe_status time_pass(moe_layer_t *l, const float *x, float *y, float *dx, int n, int warm, int reps, double *s) {
  *s = INFINITY;
  for (int k = 0; k < warm + reps; k++) {
    double t0 = moe__now();
    MOE_CHECK(moe_layer_forward(l, x, n, y, NULL, NULL));
    MOE_CHECK(moe_layer_backward(l, x, 0, 0, NULL, NULL, dx)); /* any dy: x */
    if (k >= warm) *s = fmin(*s, moe__now() - t0);
  }
  return MOE_OK;
}

#define RATE_ROWS0 64    /* the smallest size; the others double it */
#define RATE_BUDGET_S 12 /* about the compute the rate profile may take on a rank */

/* Room for (rows, D) inputs, filled, then the outputs and the input gradients; NULL when out of memory. */
static float *pass_buf(int rows, int D) {
  size_t nd = (size_t)rows * D;
  float *b = malloc(sizeof *b * nd * 3);
  for (size_t i = 0; b && i < nd; i++) b[i] = (float)((int)(i % 17) - 8) * 0.05f;
  return b;
}

/* Tokens per second of one expert of c's shape, forward and backward, at rows per expert 64, 128, ...
 * (out's rate buckets; the same on every rank). Timing the layer rather than its GEMMs counts what
 * runs beside them per token (the activation, the biases, dispatch and combine, the router's share)
 * and the GEMMs at their own shapes; timing it at several sizes counts that the per-row cost changes
 * with the rows (case M: the skewed plan's two experts of about 4,000 rows ran 10-15% slower per row
 * than the uniform step's sixteen of 512, and a rate taken at 256 rows left Eq. 5's step that much
 * under the measured one). The smallest size, timed first, says how many sizes fit in RATE_BUDGET_S:
 * the largest runs twice (its first pass grows the layer's buffers, untimed), then the smaller ones
 * without that first pass, each once (thrice where a pass is short). The estimate doubles the
 * smallest size's per-row time, since the per-row cost may rise with the rows (by 1.7x from 256 to
 * 2,048 rows in one run of case M's expert here). */
static moe_status time_rates(const moe_layer_config *c, const moe_dist *d, moe_flex_env *out) {
  moe_layer_config one;
  moe_layer_config_default(&one);
  one.D = c->D, one.H = c->H, one.E = 1, one.top_k = 1, one.act = c->act, one.dtype = c->dtype;
  one.threads = c->threads, one.expert_bias = c->expert_bias;
  moe_layer_t l;
  MOE_CHECK(moe_layer_init(&l, &one));
  moe_layer_init_params(&l, 1);
  size_t D = (size_t)c->D;
  double s0 = 0, s[MOE_FLEX_RATE_BUCKETS] = {0};
  int n = 1;
  float *b = pass_buf(RATE_ROWS0, c->D);
  moe_status st = b ? time_pass(&l, b, b + RATE_ROWS0 * D, b + 2 * RATE_ROWS0 * D, RATE_ROWS0, 1, 3, &s0)
                    : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "replicas: profiling %d tokens", RATE_ROWS0);
  free(b);
  if (st == MOE_OK) st = agree(d, &s0, 1);
  double per_row = 2 * s0 / RATE_ROWS0; /* an estimate for the larger sizes */
  while (n < MOE_FLEX_RATE_BUCKETS && 3.0 * (RATE_ROWS0 << n) * per_row <= RATE_BUDGET_S) n++;
  int top = RATE_ROWS0 << (n - 1);
  b = st == MOE_OK ? pass_buf(top, c->D) : NULL;
  if (st == MOE_OK && !b) st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "replicas: profiling %d tokens", top);
  for (int i = n - 1; st == MOE_OK && i >= 0; i--) {
    int rows = RATE_ROWS0 << i;
    st = time_pass(&l, b, b + top * D, b + 2 * top * D, rows, i == n - 1, rows * per_row < 0.05 ? 3 : 1, &s[i]);
  }
  free(b);
  moe_layer_free(&l);
  if (st == MOE_OK) st = agree(d, s, n);
  MOE_CHECK(st);
  for (int i = 0; i < n; i++) out->rate_rows[i] = RATE_ROWS0 << i, out->rate_tps[i] = out->rate_rows[i] / s[i];
  out->rate_n = n;
  out->tps = out->rate_tps[n - 1];
  return MOE_OK;
}

/* Start-up profile (P3 1.5): tokens per second of the experts (time_rates), and the all-to-all's and
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
  MOE_CHECK(st);
  *out = (moe_flex_env){.a2a_lat = a2a.lat, .a2a_bw = a2a.bw, .ar_lat = ar.lat, .ar_bw = ar.bw, .token_bytes = 4.0 * D,
                        .expert_bytes = (double)moe__flex_expert_floats(c) * 4};
  return time_rates(c, d, out);
}

