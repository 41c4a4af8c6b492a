/* moe simulate --calibrate (DESIGN 4.6): this machine's rates for the simulator, measured on the paths
 * the layer runs, every rank at once: the experts' GEMMs of each kind (moe__gemm_run_fixed) fitted to
 * Hockney's r_inf and n_1/2, the bandwidth of the layer's memory-bound passes (a step of a layer whose
 * experts are 8 wide, over the bytes step.c counts for it), and the token exchange
 * (moe__dist_alltoallv_rows, the layer's one-micro-batch exchange) fitted to alpha + bytes / bw. Each time is over REPS runs started together (an
 * all-reduce), averaged over the ranks; the median where it is work (the machine's load shows in the
 * rates as it does in a step), the fastest for the exchange's latency (a median of a 1 KiB exchange
 * on loaded cores times the scheduler, not the link). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "kernels/gemm.h"
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

/* GN expert GEMMs of one kind at 512 and 32 rows on the per-expert side: time = GN (rows + n_1/2)
 * 2 GD^2 / r_inf. NT and NN: (rows, GD) x (GD, GD); TN, a weight gradient: (GD, rows) x (rows, GD)
 * added into each GEMM's own (GD, GD). The fastest runs give the rate: on a shared machine the others'
 * load only adds time, and one loaded run would skew a prediction of every case. */
static moe_status calibrate_gemm(const moe_dist *d, int threads, moe__sim_kind kind, moe__sim_gemm *out) {
  const int rows[2] = {512, 32};
  int tn = kind == MOE__SIM_TN;
  size_t a = (size_t)GN * rows[0] * GD, c = tn ? (size_t)GN * GD * GD : a;
  float *A = calloc(a, sizeof *A), *B = calloc(tn ? a : (size_t)GD * GD, sizeof *B), *C = calloc(c, sizeof *C);
  moe_status st = A && B && C ? MOE_OK : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "sim_calibrate: GEMMs");
  double t[2] = {0, 0}, median;
  gemms g = {.threads = threads};
  for (int s = 0; s < 2 && st == MOE_OK; s++) {
    for (int e = 0; e < GN; e++) {
      size_t in = (size_t)e * rows[0] * GD;
      g.g[e] = tn ? (moe__gemm){.ta = true, .M = GD, .N = GD, .K = rows[s], .alpha = 1, .beta = 1, .A = A + in,
                                .lda = GD, .B = B + in, .ldb = GD, .C = C + (size_t)e * GD * GD, .ldc = GD}
                  : (moe__gemm){.tb = kind == MOE__SIM_NT, .M = rows[s], .N = GD, .K = GD, .alpha = 1, .A = A + in,
                                .lda = GD, .B = B, .ldb = GD, .C = C + in, .ldc = GD};
    }
    st = time_runs(d, run_gemms, &g, &t[s], &median);
  }
  free(A), free(B), free(C);
  MOE_CHECK(st);
  double per_row = (t[0] - t[1]) / (GN * (double)(rows[0] - rows[1])); /* 2 GD^2 / r_inf */
  MOE_TRY(per_row > 0, MOE_ERR_VALUE, "sim_calibrate: %d-row GEMMs took %g s, %d-row ones %g s: no rate", rows[0],
          t[0], rows[1], t[1]);
  out->flops = 2.0 * GD * GD / per_row;
  out->half_rows = t[1] / (GN * per_row) - rows[1];
  if (out->half_rows < 0) out->half_rows = 0; /* below the timer's resolution */
  return MOE_OK;
}

typedef struct {
  moe_layer_t l;
  const float *x, *dy;
  float *y, *dx;
  int T;
} layer_step;

static moe_status run_layer(void *ctx) {
  layer_step *s = ctx;
  MOE_CHECK(moe_layer_forward(&s->l, s->x, s->T, s->y, NULL, NULL));
  return moe_layer_backward(&s->l, s->dy, 0.01f, 0.0f, NULL, NULL, s->dx);
}

/* The memory-bound passes' bandwidth: the fastest step of a layer of case S's tokens and d_model whose
 * experts are LH wide (their GEMMs are passes over their rows too: 6 a D elements for a kept
 * assignments), over the bytes step.c counts for it, less its router's GEMMs at the NT rate. */
static moe_status calibrate_passes(const moe_dist *d, int threads, moe_sim_config *c) {
  enum { LT = 2048, LD = 512, LH = 8, LE = 8, LK = 2 };
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.D = LD, cfg.H = LH, cfg.E = LE, cfg.top_k = LK, cfg.capacity_setting = 1.25f, cfg.threads = threads;
  layer_step s = {.T = LT};
  MOE_CHECK(moe_layer_init(&s.l, &cfg));
  moe_layer_init_params(&s.l, 1);
  size_t n = (size_t)LT * LD;
  float *buf = malloc(sizeof *buf * 4 * n);
  moe_status st = buf ? MOE_OK : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "sim_calibrate: a layer of %d tokens", LT);
  double median, t = 0;
  moe_layer_stats ls;
  if (st == MOE_OK) {
    for (size_t i = 0; i < 2 * n; i++) buf[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    s.x = buf, s.dy = buf + n, s.y = buf + 2 * n, s.dx = buf + 3 * n;
    st = time_runs(d, run_layer, &s, &t, &median);
  }
  if (st == MOE_OK) st = moe_layer_forward(&s.l, s.x, LT, s.y, NULL, &ls);
  moe_layer_free(&s.l);
  free(buf);
  MOE_CHECK(st);
  moe_sim_config l = *c;
  l.T = LT, l.D = LD, l.H = LH, l.E = LE, l.k = LK, l.elem = 4;
  double a = (double)LT * LK - ls.dropped, bytes = 6 * a * LD * 4.0 + moe__sim_expert_bytes(&l, a, 0) +
                                                   moe__sim_expert_bytes(&l, a, 1);
  for (int p = MOE__SIM_BEFORE; p <= MOE__SIM_LAST; p++) bytes += moe__sim_token_bytes(&l, a, (moe__sim_part)p);
  double left = t - moe__sim_router_s(&l);
  MOE_TRY(left > 0, MOE_ERR_VALUE, "sim_calibrate: a layer step of %g s, less its router's GEMMs: no bandwidth", t);
  c->mem_bw = bytes / left;
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

moe_status moe__sim_calibrate(const moe_dist *d, int threads, moe_sim_config *c) {
  MOE_TRY(d && c, MOE_ERR_ARG, "sim_calibrate: NULL argument");
  memset(c, 0, sizeof *c);
  moe__sim_gemm nn;
  MOE_CHECK(calibrate_gemm(d, threads, MOE__SIM_NN, &nn));
  MOE_CHECK(calibrate_gemm(d, threads, MOE__SIM_NT, &c->nt));
  MOE_CHECK(calibrate_gemm(d, threads, MOE__SIM_TN, &c->tn));
  c->gemm_flops = nn.flops, c->half_rows = nn.half_rows;
  MOE_CHECK(calibrate_passes(d, threads, c));
  moe_sim_machine m = {0};
  MOE_CHECK(calibrate_xchg(d, &m));
  c->nodes = 1, c->dpn = moe_dist_size(d), c->intra_bw = m.bw, c->intra_lat = m.lat;
  return MOE_OK;
}

moe_status moe_sim_calibrate(const moe_dist *d, int threads, moe_sim_machine *out) {
  MOE_TRY(d && out, MOE_ERR_ARG, "sim_calibrate: NULL argument");
  moe_sim_config c;
  MOE_CHECK(moe__sim_calibrate(d, threads, &c));
  *out = (moe_sim_machine){.devices = c.dpn, .gemm_flops = c.gemm_flops, .gemm_half_rows = c.half_rows,
                           .bw = c.intra_bw, .lat = c.intra_lat};
  return MOE_OK;
}

moe_status moe_sim_calibrate_config(const moe_dist *d, int threads, char *buf, size_t n) {
  moe_sim_config m;
  MOE_CHECK(moe__sim_calibrate(d, threads, &m));
  int len = snprintf(buf, n,
                     "{\"nodes\": 1, \"devices_per_node\": %d, \"intra_bw\": %.6g, \"intra_lat\": %.6g,\n"
                     " \"gemm_flops\": %.6g, \"gemm_half_rows\": %.4g, \"gemm_nt_flops\": %.6g, \"gemm_nt_half_rows\": %.4g,\n"
                     " \"gemm_tn_flops\": %.6g, \"gemm_tn_half_rows\": %.4g, \"mem_bw\": %.6g,\n"
                     " \"tokens\": %d, \"d_model\": 512, \"hidden\": 2048, \"experts\": 8, \"top_k\": 2, "
                     "\"capacity_factor\": 1.25}\n",
                     m.dpn, m.intra_bw, m.intra_lat, m.gemm_flops, m.half_rows, m.nt.flops, m.nt.half_rows, m.tn.flops,
                     m.tn.half_rows, m.mem_bw, 2048 / moe_dist_size(d));
  MOE_TRY(len >= 0 && (size_t)len < n, MOE_ERR_ARG, "sim_calibrate: the config takes %d characters, room for %zu",
          len, n);
  return MOE_OK;
}
