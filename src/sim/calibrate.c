/* moe simulate --calibrate (DESIGN 4.6): this machine's rates for the simulator, measured on the paths
 * the layer runs, every rank at once: the experts' GEMMs (moe__gemm_run_fixed) fitted to Hockney's
 * r_inf and n_1/2, and the token exchange (moe__dist_alltoallv_rows, the layer's one-micro-batch
 * exchange) fitted to alpha + bytes / bw. Each time is over REPS runs started together (an
 * all-reduce), averaged over the ranks; the median where it is work (the machine's load shows in the
 * rates as it does in a step), the fastest for the exchange's latency (a median of a 1 KiB exchange
 * on loaded cores times the scheduler, not the link). */
#include <stdlib.h>

#include "dist/dist.h"
#include "gemm.h"
#include "sim/sim.h"

enum { REPS = 7, WIDTH = 256 /* exchange rows of 1 KiB */, GD = 1024 /* GEMMs of D = H = GD */, GN = 8 };

typedef moe_status (*timed_fn)(void *ctx);

/* The fastest and the median of REPS runs (seconds). */
static moe_status time_runs(const moe_dist *d, timed_fn fn, void *ctx, double *fastest, double *median) {
  int W = moe_dist_size(d);
  double t[REPS + 1];
  for (int r = 0; r <= REPS; r++) { /* run 0 warms caches and threads */
    double sync = 0;
    MOE_CHECK(moe_dist_allreduce(d, &sync, 1));
    double t0 = moe__now();
    MOE_CHECK(fn(ctx));
    t[r] = moe__now() - t0;
    MOE_CHECK(moe_dist_allreduce(d, &t[r], 1));
    t[r] /= W;
  }
  for (int i = 2; i <= REPS; i++) /* insertion sort of the timed runs t[1..REPS] */
    for (int j = i; j > 1 && t[j] < t[j - 1]; j--) {
      double x = t[j];
      t[j] = t[j - 1], t[j - 1] = x;
    }
  *fastest = t[1], *median = t[1 + REPS / 2];
  return MOE_OK;
}

typedef struct {
  const moe_dist *d;
  float *send, *recv;
  int *counts, *displs;
} xchg;

static moe_status run_xchg(void *ctx) {
  xchg *x = ctx;
  return moe__dist_alltoallv_rows(x->d, x->send, x->counts, x->displs, x->recv, x->counts, x->displs, WIDTH);
}

typedef struct {
  moe__gemm g[GN];
  int threads;
} gemms;

static moe_status run_gemms(void *ctx) {
  gemms *g = ctx;
  return moe__gemm_run_fixed(g->g, GN, g->threads, NULL);
}

/* GN expert GEMMs (rows, GD) x (GD, GD) at 512 and 32 rows: time = GN (rows + n_1/2) 2 GD^2 / r_inf. */
static moe_status calibrate_gemm(const moe_dist *d, int threads, moe_sim_machine *out) {
  const int rows[2] = {512, 32};
  size_t a = (size_t)GN * rows[0] * GD;
  float *A = calloc(a, sizeof *A), *B = calloc((size_t)GD * GD, sizeof *B), *C = malloc(a * sizeof *C);
  moe_status st = A && B && C ? MOE_OK : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "sim_calibrate: GEMMs");
  double t[2] = {0, 0}, fastest;
  gemms g = {.threads = threads};
  for (int s = 0; s < 2 && st == MOE_OK; s++) {
    for (int e = 0; e < GN; e++)
      g.g[e] = (moe__gemm){.M = rows[s], .N = GD, .K = GD, .alpha = 1, .A = A + (size_t)e * rows[0] * GD,
                           .lda = GD, .B = B, .ldb = GD, .C = C + (size_t)e * rows[0] * GD, .ldc = GD};
    st = time_runs(d, run_gemms, &g, &fastest, &t[s]);
  }
  free(A), free(B), free(C);
  MOE_CHECK(st);
  double per_row = (t[0] - t[1]) / (GN * (double)(rows[0] - rows[1])); /* 2 GD^2 / r_inf */
  MOE_TRY(per_row > 0, MOE_ERR_VALUE, "sim_calibrate: %d-row GEMMs took %g s, %d-row ones %g s: no rate", rows[0],
          t[0], rows[1], t[1]);
  out->gemm_flops = 2.0 * GD * GD / per_row;
  out->gemm_half_rows = t[1] / (GN * per_row) - rows[1];
  if (out->gemm_half_rows < 0) out->gemm_half_rows = 0; /* below the timer's resolution */
  return MOE_OK;
}

/* The exchange of 1 KiB and of 4 MiB to every rank (itself too, as the layer's): lat is the small
 * one's fastest time, bw the large one's bytes to one peer (to itself with one rank) over its median
 * time less lat. */
static moe_status calibrate_xchg(const moe_dist *d, moe_sim_machine *out) {
  int W = moe_dist_size(d);
  const int rows[2] = {1, 4096};
  size_t n = (size_t)W * rows[1] * WIDTH;
  xchg x = {d, calloc(n, sizeof *x.send), malloc(n * sizeof *x.recv), malloc(sizeof(int) * 2 * (size_t)W), NULL};
  moe_status st = x.send && x.recv && x.counts
                      ? MOE_OK
                      : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "sim_calibrate: %zu floats of exchange", n);
  x.displs = x.counts ? x.counts + W : NULL;
  double t[2] = {0, 0}, median;
  for (int s = 0; s < 2 && st == MOE_OK; s++) {
    for (int q = 0; q < W; q++) x.counts[q] = rows[s], x.displs[q] = q * rows[s];
    st = time_runs(d, run_xchg, &x, &t[s], &median);
    if (s == 1) t[1] = median;
  }
  free(x.send), free(x.recv), free(x.counts);
  MOE_CHECK(st);
  MOE_TRY(t[1] > t[0], MOE_ERR_VALUE, "sim_calibrate: an exchange of 4 MiB per rank took %g s, of 1 KiB %g s: no rate",
          t[1], t[0]);
  out->lat = t[0];
  out->bw = (double)(rows[1] - rows[0]) * WIDTH * sizeof(float) / (t[1] - t[0]);
  return MOE_OK;
}

moe_status moe_sim_calibrate(const moe_dist *d, int threads, moe_sim_machine *out) {
  MOE_TRY(d && out, MOE_ERR_ARG, "sim_calibrate: NULL argument");
  *out = (moe_sim_machine){.devices = moe_dist_size(d)};
  MOE_CHECK(calibrate_gemm(d, threads, out));
  return calibrate_xchg(d, out);
}
