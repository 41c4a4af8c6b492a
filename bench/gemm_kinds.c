/* The six expert GEMMs of an FFN layer alone, each over E experts of R rows, against a 2048^3 sgemm
 * measured in the same run: how close the small-GEMM kernels (src/kernels/gemm_small.c) come to the BLAS on
 * their own, without the layer's routing, activation and schedule around them (case L by default:
 * D 768, H 3072, 64 experts of 64 rows; `moe bench` gives the layer's ratio on the same shapes).
 * Each kind runs the layer's way: one expert's GEMM whole per work item, dynamically over the threads,
 * weights and gradients of every expert in memory (1.2 GB at case L). `make build` builds it:
 *   build/gemm_kinds [R D H E threads reps]   (default 64 768 3072 64 2 5)
 * Prints per kind the best of `reps` passes over the experts: ms, GFLOP/s a thread, ratio to the sgemm. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernels/gemm.h"
#include "moe.h"

static float *filled(size_t n, float scale) {
  float *p = malloc(n * sizeof *p);
  for (size_t i = 0; p && i < n; i++) p[i] = scale * (float)((i * 2654435761u) % 1000) / 1000.0f;
  return p;
}

int main(int argc, char **argv) {
  const char *core = moe_blas_better_coretype(); /* the AVX-512 kernels, as the moe command gets them */
  if (core && !getenv("MOE_BLAS_REEXEC") && setenv("OPENBLAS_CORETYPE", core, 1) == 0 &&
      setenv("MOE_BLAS_REEXEC", "1", 1) == 0)
    execv("/proc/self/exe", argv);
  int v[6] = {64, 768, 3072, 64, 2, 5};
  for (int i = 1; i < argc && i <= 6; i++) v[i - 1] = atoi(argv[i]);
  int R = v[0], D = v[1], H = v[2], E = v[3], th = v[4], reps = v[5];
  if (R < 1 || D < 1 || H < 1 || E < 1 || th < 1 || reps < 1) {
    fprintf(stderr, "gemm_kinds: R D H E threads reps must be positive\n");
    return 2;
  }
  size_t w = (size_t)H * D, xr = (size_t)R * D, hr = (size_t)R * H;
  float *w1 = filled(w * E, 0.02f), *w2 = filled(w * E, 0.02f), *g1 = filled(w * E, 0), *g2 = filled(w * E, 0);
  float *x = filled(xr * E, 1), *h = filled(hr * E, 1), *y = filled(xr * E, 1), *dh = filled(hr * E, 1);
  float *dx = filled(xr * E, 0);
  if (!w1 || !w2 || !g1 || !g2 || !x || !h || !y || !dh || !dx) {
    fprintf(stderr, "gemm_kinds: out of memory (%.1f GB of weights and gradients)\n", 16.0 * w * E / 1e9);
    return 1;
  }
  double sg = moe_sgemm_gflops(2048, th, 3);
  printf("R %d D %d H %d E %d, %d threads, %s; fp32 sgemm 2048^3: %.1f GFLOP/s\n", R, D, H, E, th, moe_blas_info(),
         sg);
  printf("%-10s %9s %15s %7s\n", "gemm", "ms", "GFLOP/s/thread", "ratio");
  /* forward: fc1 h = x W1^T, fc2 y = h W2^T; backward: dW2 += dy^T h, dh = dy W2, dW1 += dh^T x, dx = dh W1 */
  static const char *names[6] = {"fc1 NT", "fc2 NT", "dW2 TN", "dh NN", "dW1 TN", "dx NN"};
  double flops = 2.0 * R * D * H * E, total = 0;
  for (int kind = 0; kind < 6; kind++) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
      double t0 = omp_get_wtime();
#pragma omp parallel for num_threads(th) schedule(dynamic, 1)
      for (int e = 0; e < E; e++) {
        size_t we = (size_t)e * w, xe = (size_t)e * xr, he = (size_t)e * hr;
        moe__gemm gs[6] = {
            {false, true, R, H, D, 1, 0, x + xe, D, w1 + we, D, h + he, H, false},
            {false, true, R, D, H, 1, 0, h + he, H, w2 + we, H, y + xe, D, false},
            {true, false, D, H, R, 1, 1, y + xe, D, h + he, H, g2 + we, H, false},
            {false, false, R, H, D, 1, 0, y + xe, D, w2 + we, H, dh + he, H, false},
            {true, false, H, D, R, 1, 1, dh + he, H, x + xe, D, g1 + we, D, false},
            {false, false, R, D, H, 1, 0, dh + he, H, w1 + we, D, dx + xe, D, false}};
        moe__gemm_one(&gs[kind]);
      }
      double t = omp_get_wtime() - t0;
      if (t < best) best = t;
    }
    total += best;
    printf("%-10s %9.1f %15.1f %7.3f\n", names[kind], best * 1e3, flops / best / 1e9 / th, flops / best / 1e9 / sg);
  }
  printf("%-10s %9.1f %15.1f %7.3f\n", "all six", total * 1e3, 6 * flops / total / 1e9 / th, 6 * flops / total / 1e9 / sg);
  free(w1), free(w2), free(g1), free(g2), free(x), free(h), free(y), free(dh), free(dx);
  return 0;
}
