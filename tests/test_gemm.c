/* The tiled grouped GEMM against a double-precision triple loop: every transpose combination, shapes
 * that do not divide into tiles, several GEMMs at once, 1 and 3 threads, beta 0 and 1; and K = 0,
 * where beta = 0 must overwrite C (NaN included) rather than scale it; side work run alongside. */
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "kernels/gemm.h"
#include "test.h"

static float frand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*s >> 40) * 0x1.0p-23) - 1.0f;
}

static void reference(const moe__gemm *g, float *out) {
  for (int i = 0; i < g->M; i++)
    for (int j = 0; j < g->N; j++) {
      double acc = 0;
      for (int p = 0; p < g->K; p++) {
        const float *A = g->A, *B = g->B; /* fp32 operands: the caller passes the fp32 twins of bf16 ones */
        double a = g->ta ? A[(size_t)p * g->lda + i] : A[(size_t)i * g->lda + p];
        double b = g->tb ? B[(size_t)j * g->ldb + p] : B[(size_t)p * g->ldb + j];
        acc += a * b;
      }
      double c = g->beta == 0 ? 0 : g->beta * g->C[(size_t)i * g->ldc + j]; /* beta 0: C may be NaN */
      out[(size_t)i * g->N + j] = (float)(g->alpha * acc + c);
    }
}

/* fp32 GEMMs (alpha 0.75), and bf16 GEMMs (oneDNN, alpha 1) against the double-precision product of
 * the same bf16 values, tiled over 1 and 3 threads, every transpose, beta 0 and 1. */
TEST(gemm_tiles_match_reference) {
  uint64_t s = 1;
  const int shapes[][3] = {{1, 1, 1}, {70, 300, 33}, {257, 65, 129}, {64, 3072, 17}, {500, 40, 7}};
  for (int bf = 0; bf <= 1; bf++)
    for (int threads = 1; threads <= 3; threads += 2)
      for (int t = 0; t < 4; t++)
        for (int beta = 0; beta <= 1; beta++) {
          enum { NG = 5 };
          moe__gemm g[NG];
          float *bufs[NG][4];
          uint16_t *half[NG][2];
          for (int q = 0; q < NG; q++) {
            int M = shapes[q][0], N = shapes[q][1], K = shapes[q][2];
            for (int b = 0; b < 3; b++) {
              size_t n = (size_t)(b == 0 ? M * K : b == 1 ? K * N : M * N);
              bufs[q][b] = malloc(n * 4);
              for (size_t i = 0; i < n; i++) bufs[q][b][i] = frand(&s);
              if (b < 2) { /* bf16 operands, and their exact fp32 values for the reference */
                half[q][b] = malloc(n * 2);
                moe_bf16_from_f32(half[q][b], bufs[q][b], n);
                if (bf) moe_bf16_to_f32(bufs[q][b], half[q][b], n);
              }
            }
            bufs[q][3] = malloc((size_t)M * N * 4);
            g[q] = (moe__gemm){t & 1, t >> 1, M, N, K, bf ? 1.0f : 0.75f, (float)beta, bufs[q][0], t & 1 ? M : K,
                               bufs[q][1], t >> 1 ? K : N, bufs[q][2], N, false};
            reference(&g[q], bufs[q][3]);
            if (bf) {
              g[q].A = half[q][0];
              g[q].B = half[q][1];
              g[q].bf16 = true;
            }
          }
          ASSERT(moe__gemm_run(g, NG, threads) == MOE_OK);
          int ok = 1;
          for (int q = 0; q < NG; q++) {
            ok &= tensors_close("C", bufs[q][2], bufs[q][3], (size_t)g[q].M * g[q].N, 1e-5, 1e-6);
            for (int b = 0; b < 4; b++) free(bufs[q][b]);
            free(half[q][0]);
            free(half[q][1]);
          }
          if (!ok) FAIL_("%s, threads %d, transposes %d, beta %d", bf ? "bf16" : "f32", threads, t, beta);
        }
}

TEST(gemm_k0_overwrites_with_beta0) {
  float c[6] = {NAN, INFINITY, 1, 2, 3, 4}, a[1], b[1];
  moe__gemm g = {false, false, 2, 3, 0, 1.0f, 0.0f, a, 1, b, 3, c, 3, false};
  moe__gemm_run(&g, 1, 1);
  for (int i = 0; i < 6; i++) ASSERT(c[i] == 0.0f);
  float d[2] = {1, 2};
  moe__gemm h = {false, false, 1, 2, 0, 1.0f, 0.5f, a, 1, b, 2, d, 2, false};
  moe__gemm_run(&h, 1, 2);
  ASSERT(d[0] == 0.5f && d[1] == 1.0f);
}

/* Side work runs each item exactly once, alongside GEMMs or alone (no GEMMs), and leaves the GEMMs'
 * bits as they are without it (the same tiles). */
static void count_item(void *ctx, int i) {
  __atomic_fetch_add((int *)ctx + i, 1, __ATOMIC_RELAXED);
}

TEST(gemm_side_work_runs_once_and_keeps_bits) {
  uint64_t s = 7;
  enum { M = 200, N = 96, K = 40, NS = 37 };
  float *a = malloc(M * K * 4), *b = malloc(K * N * 4), *c0 = malloc(M * N * 4), *c1 = malloc(M * N * 4);
  for (int i = 0; i < M * K; i++) a[i] = frand(&s);
  for (int i = 0; i < K * N; i++) b[i] = frand(&s);
  for (int threads = 1; threads <= 3; threads += 2)
    for (int with_gemm = 0; with_gemm <= 1; with_gemm++) {
      int seen[NS] = {0};
      moe__side_work side = {count_item, seen, NS};
      moe__gemm g0 = {false, false, M, N, K, 1.0f, 0.0f, a, K, b, N, c0, N, false}, g1 = g0;
      g1.C = c1;
      ASSERT(moe__gemm_run(&g0, 1, threads) == MOE_OK);
      ASSERT(moe__gemm_run_side(&g1, with_gemm, threads, &side) == MOE_OK);
      for (int i = 0; i < NS; i++)
        if (seen[i] != 1) FAIL_("threads %d, gemm %d: side item %d ran %d times", threads, with_gemm, i, seen[i]);
      if (with_gemm) ASSERT(!memcmp(c0, c1, M * N * 4));
    }
  free(a);
  free(b);
  free(c0);
  free(c1);
}

/* The small-side kernels (gemm_small.c) against the double-precision loop: NN and NT with few rows,
 * TN with few inner steps, every tail of their 6-row by 64-column register tiles, inner dimensions
 * past one block (NN 512, NT 1024), operands with padded rows, beta 0 over NaN and beta 1; and a GEMM they
 * do not take (large on every side, alpha not 1) is left to the BLAS. */
static int small_kernels_built(void) {
#ifdef __AVX512F__
  int have = __builtin_cpu_supports("avx512f");
#else
  int have = 0; /* built without AVX-512 */
#endif
  if (!have) test_skip("no AVX-512 kernels in this build or CPU: the BLAS runs every GEMM");
  return have;
}

TEST(gemm_small_kernels_match_reference) {
  if (!small_kernels_built()) return;
  uint64_t s = 3;
  const int rows[] = {1, 5, 6, 7, 17, 64, 65, 128}, cols[] = {1, 15, 16, 17, 63, 64, 65, 200};
  const int inner[] = {1, 7, 64, 513, 1100};
  int tried = 0;
  for (int form = 0; form < 3; form++) /* NN, NT, TN */
    for (int ri = 0; ri < 8; ri++)
      for (int ci = 0; ci < 8; ci++)
        for (int ki = 0; ki < 5; ki++) {
          int small = rows[ri], N = cols[ci], K = inner[ki];
          if (form == 2 && K > 128) continue;
          if ((ri + ci + ki) % 3) continue; /* a third of the combinations: every tail still occurs */
          int ta = form == 2, tb = form == 1;
          int M = form == 2 ? (ri * 131 + 40) % 300 + 1 : small; /* TN: C as large as the weights */
          int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
          size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
          float *a = malloc(na * 4), *b = malloc(nb * 4), *c = malloc(nc * 4), *want = malloc((size_t)M * N * 4);
          float *got = malloc((size_t)M * N * 4);
          for (size_t i = 0; i < na; i++) a[i] = frand(&s);
          for (size_t i = 0; i < nb; i++) b[i] = frand(&s);
          for (int beta = 0; beta <= 1; beta++) {
            for (size_t i = 0; i < nc; i++) c[i] = beta ? frand(&s) : NAN;
            moe__gemm g = {ta, tb, M, N, K, 1.0f, (float)beta, a, lda, b, ldb, c, ldc, false};
            reference(&g, want);
            ASSERT(moe__gemm_small(&g) == 1);
            for (int i = 0; i < M; i++) memcpy(got + (size_t)i * N, c + (size_t)i * ldc, (size_t)N * 4);
            if (!tensors_close("C", got, want, (size_t)M * N, 1e-5, 1e-5))
              FAIL_("form %s, M %d, N %d, K %d, beta %d", form == 0 ? "NN" : form == 1 ? "NT" : "TN", M, N, K, beta);
            tried++;
          }
          free(a), free(b), free(c), free(want), free(got);
        }
  ASSERT(tried > 100);
  float x[4] = {1, 2, 3, 4};
  moe__gemm big = {false, true, 200, 200, 2, 1.0f, 0.0f, x, 2, x, 2, x, 200, false}, scaled = big;
  scaled.M = 2;
  scaled.alpha = 0.5f;
  ASSERT(moe__gemm_small(&big) == 0 && moe__gemm_small(&scaled) == 0);
}

/* One few-row shape against the double-precision loop (what names its form): A, B and C with padded
 * rows, beta 0 over NaN and beta 1; C within 1e-5 and the padding between its rows never written. */
static void check_padded_shape(bool ta, bool tb, int M, int N, int K, uint64_t *s, const char *what, int *failed_) {
  int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2, ra = ta ? K : M, rb = tb ? N : K;
  float *a = malloc((size_t)ra * lda * 4), *b = malloc((size_t)rb * ldb * 4), *c = malloc((size_t)M * ldc * 4);
  float *want = malloc((size_t)M * N * 4), *got = malloc((size_t)M * N * 4), *c0 = malloc((size_t)M * ldc * 4);
  for (int i = 0; i < ra * lda; i++) a[i] = frand(s);
  for (int i = 0; i < rb * ldb; i++) b[i] = frand(s);
  for (int beta = 0; beta <= 1; beta++) {
    for (int i = 0; i < M * ldc; i++) c[i] = beta ? frand(s) : NAN;
    memcpy(c0, c, (size_t)M * ldc * 4);
    moe__gemm g = {ta, tb, M, N, K, 1.0f, (float)beta, a, lda, b, ldb, c, ldc, false};
    reference(&g, want);
    ASSERT(moe__gemm_small(&g) == 1);
    for (int i = 0; i < M; i++) memcpy(got + (size_t)i * N, c + (size_t)i * ldc, (size_t)N * 4);
    if (!tensors_close("C", got, want, (size_t)M * N, 1e-5, 1e-5))
      FAIL_("%s, M %d, N %d, K %d, beta %d", what, M, N, K, beta);
    for (int i = 0; i < M; i++)
      if (memcmp(c + (size_t)i * ldc + N, c0 + (size_t)i * ldc + N, (size_t)(ldc - N) * 4))
        FAIL_("%s, M %d, N %d, K %d, beta %d: padding after row %d of C written", what, M, N, K, beta, i);
  }
  free(a), free(b), free(c), free(c0), free(want), free(got);
}

/* NT with few rows (the dot-product tiles, up to 16 rows; 17 is the broadcast kernel's again): every
 * row count, column counts below, at and past each tile's width (16 / m columns) with odd tails, inner
 * dimensions below, at and past one 16-lane vector. Sums of up to 515 products of numbers in [-1, 1):
 * fp32 error well under 1e-5 of the largest. */
TEST(gemm_small_nt_few_rows_match_reference) {
  if (!small_kernels_built()) return;
  uint64_t s = 5;
  const int cols[] = {1, 2, 3, 7, 16, 17, 33, 130}, inner[] = {1, 5, 16, 17, 129, 515};
  for (int M = 1; M <= 17; M++)
    for (int ci = 0; ci < 8; ci++)
      for (int ki = 0; ki < 6; ki++) {
        check_padded_shape(false, true, M, cols[ci], inner[ki], &s, "NT", failed_);
        if (*failed_) return;
      }
}

/* TN weight gradients over few rows: C (M, N) = A^T B with A (m, M), B (m, N), the m rows summed over
 * (K = m), every m to 17. */
TEST(gemm_small_tn_few_rows_match_reference) {
  if (!small_kernels_built()) return;
  uint64_t s = 7;
  const int cols[] = {1, 2, 3, 7, 16, 17, 33, 130}, inner[] = {1, 5, 16, 17, 129, 515};
  for (int m = 1; m <= 17; m++)
    for (int ci = 0; ci < 8; ci++)
      for (int ki = 0; ki < 6; ki++) {
        check_padded_shape(true, false, cols[ci], inner[ki], m, &s, "TN", failed_);
        if (*failed_) return;
      }
}

/* TN gradients wider than the part of B the kernel copies at a time (its 512 KiB scratch over K,
 * rounded down to 64 columns: 1024 at K 128, 1280 at 100, 2048 at 64): one, two and three parts, the
 * last narrower than a 64-column strip, and row counts past and short of a group of 8 row tiles.
 * Also NT past one block of the inner dimension (1024): two and three equal blocks, with up to 64
 * rows and past 64 (two blocks of rows against each tile of B). */
TEST(gemm_small_wide_gradients_and_long_rows_match_reference) {
  if (!small_kernels_built()) return;
  uint64_t s = 9;
  const int tn[][3] = {{53, 2100, 128}, {100, 1300, 100}, {7, 2050, 64}, {300, 641, 6}}; /* M N K */
  for (int i = 0; i < 4 && !*failed_; i++) check_padded_shape(true, false, tn[i][0], tn[i][1], tn[i][2], &s, "TN", failed_);
  const int nt[][3] = {{64, 70, 2048}, {19, 33, 2100}, {128, 7, 3073}, {100, 8, 2100}};
  for (int i = 0; i < 4 && !*failed_; i++) check_padded_shape(false, true, nt[i][0], nt[i][1], nt[i][2], &s, "NT", failed_);
}

/* NT past 64 rows by up to 16 (case L's experts under uniform routing): the 64 rows through the tiles,
 * the rest as dot products against each panel of 96 rows of B; every such row count, one panel and
 * several with a tail short of a tile, inner dimensions shorter than a vector, one block and two and
 * three (16 rows past 64 with three), few columns. */
TEST(gemm_small_nt_rows_past_64_match_reference) {
  if (!small_kernels_built()) return;
  uint64_t s = 11;
  for (int M = 65; M <= 81 && !*failed_; M++) check_padded_shape(false, true, M, 137, 33, &s, "NT", failed_);
  const int nt[][3] = {{66, 70, 2100}, {79, 13, 1500}, {80, 200, 100}, {72, 200, 2100}, {80, 145, 1500},
                       {80, 49, 2049}, {70, 5, 3}};
  for (int i = 0; i < 7 && !*failed_; i++) check_padded_shape(false, true, nt[i][0], nt[i][1], nt[i][2], &s, "NT", failed_);
}

/* A GEMM cut into about square tiles (rows and columns of C) by moe__gemm_run_fixed: within the
 * reference's tolerance, and the same bits on 1, 2 and 3 threads (the cut depends on the shape alone),
 * every transpose and beta, with row and column counts that do not divide into the tiles. */
TEST(gemm_square_tiles_match_reference_on_any_threads) {
  uint64_t s = 7;
  const int M = 1100, N = 903, K = 130;
  size_t mn = (size_t)M * N;
  float *A = malloc((size_t)M * K * 4), *B = malloc((size_t)K * N * 4), *C0 = malloc(mn * 4);
  float *C[3] = {malloc(mn * 4), malloc(mn * 4), malloc(mn * 4)}, *ref = malloc(mn * 4);
  ASSERT(A && B && C0 && C[0] && C[1] && C[2] && ref);
  for (size_t i = 0; i < (size_t)M * K; i++) A[i] = frand(&s);
  for (size_t i = 0; i < (size_t)K * N; i++) B[i] = frand(&s);
  for (size_t i = 0; i < mn; i++) C0[i] = frand(&s);
  double keep = moe__fixed_tile_flops;
  moe__fixed_tile_flops = (double)M * N * (K + 1) / 9.5; /* 9 parts: 3 x 3 tiles */
  int ok = 1;
  for (int t = 0; t < 4 && ok; t++)
    for (int beta = 0; beta <= 1 && ok; beta++) {
      moe__gemm g = {t & 1, t >> 1, M, N, K, 1.0f, (float)beta, A, t & 1 ? M : K, B, t >> 1 ? K : N, C0, N, false};
      reference(&g, ref);
      for (int th = 0; th < 3; th++) {
        memcpy(C[th], C0, mn * 4);
        g.C = C[th];
        ok &= moe__gemm_run_fixed(&g, 1, th + 1, NULL) == MOE_OK;
      }
      ok &= tensors_close("C", C[0], ref, mn, 1e-5, 1e-6);
      for (int th = 1; th < 3; th++)
        if (memcmp(C[0], C[th], mn * 4)) {
          fprintf(stderr, "  transposes %d, beta %d: %d threads' bits differ from 1 thread's\n", t, beta, th + 1);
          ok = 0;
        }
    }
  moe__fixed_tile_flops = keep;
  free(A), free(B), free(C0), free(C[0]), free(C[1]), free(C[2]), free(ref);
  ASSERT(ok);
}

/* moe_cpu_info names the features the kernels are chosen by as the CPU reports them, and the choice:
 * the small-GEMM kernels are on exactly when this build and CPU have AVX-512; on x86-64 the L1 data
 * cache's size (from /sys, or CPUID in VMs without /sys's cache directory). */
TEST(cpu_info_matches_the_cpu) {
  const char *s = moe_cpu_info();
  if (!strstr(s, "(family ") || !strstr(s, "; kernels: small GEMMs ")) FAIL_("moe_cpu_info: %s", s);
  __builtin_cpu_init();
  ASSERT_EQ_INT(strstr(s, " avx2") != NULL || strstr(s, ": avx2") != NULL, __builtin_cpu_supports("avx2") != 0);
  ASSERT_EQ_INT(strstr(s, "avx512f") != NULL, __builtin_cpu_supports("avx512f") != 0);
#ifdef __AVX512F__
  int on = __builtin_cpu_supports("avx512f") != 0; /* a flag, not 1 */
#else
  int on = 0;
#endif
  ASSERT_EQ_INT(strstr(s, "small GEMMs AVX-512") != NULL, on);
  ASSERT(!strchr(s, '"') && !strchr(s, '\n'));
#ifdef __x86_64__
  const char *l1 = strstr(s, "L1d ");
  if (!l1 || atoi(l1 + 4) < 8) FAIL_("moe_cpu_info names no L1 data cache: %s", s);
#endif
}

/* moe__gemm_row (a decode step's y = alpha x W^T + beta y, W's rows shared by the threads in runs;
 * the small kernels' one-row product with AVX-512 and alpha 1, the BLAS's sgemv else): against a
 * double-precision sum, with alpha 1 and 0.5, beta 0 and 1, odd sizes, a strided W, 1 and 2 threads;
 * a GEMM of two rows goes to moe__gemm_run (the same bits). */
TEST(gemm_row_matches_reference) {
  enum { N = 1037, K = 301, LDB = 320 };
  float *W = malloc(sizeof(float) * N * LDB), x[K], y[N], y0[N], y2[2 * N], yr[2 * N], x2[2 * K];
  ASSERT(W);
  uint64_t s = 3;
  for (int i = 0; i < N * LDB; i++) W[i] = frand(&s);
  for (int i = 0; i < K; i++) x[i] = frand(&s);
  for (int i = 0; i < N; i++) y0[i] = (float)i / N;
  for (int threads = 1; threads <= 2; threads++)
    for (int beta = 0; beta <= 1; beta++)
      for (int half = 0; half <= 1; half++) {
        float alpha = half ? 0.5f : 1.0f;
        memcpy(y, y0, sizeof y);
        moe__gemm g = {false, true, 1, N, K, alpha, (float)beta, x, K, W, LDB, y, N, false};
        ASSERT_OK(moe__gemm_row(&g, threads));
        for (int n = 0; n < N; n++) {
          double want = beta * (double)y0[n];
          for (int k = 0; k < K; k++) want += (double)alpha * x[k] * (double)W[(size_t)n * LDB + k];
          if (fabs(y[n] - want) > 1e-4)
            FAIL_("threads %d alpha %g beta %d: y[%d] = %g, want %g", threads, alpha, beta, n, y[n], want);
        }
      }
  /* alpha 1: each row's value is the small kernels' one-row product of the whole (the router's single
   * token takes this path and keeps the bits of its one-item chunk), whichever thread took it */
  memcpy(yr, y0, sizeof y0);
  moe__gemm whole = {false, true, 1, N, K, 1.0f, 1.0f, x, K, W, LDB, yr, N, false};
  if (moe__gemm_small(&whole))
    for (int threads = 1; threads <= 2; threads++) {
      memcpy(y, y0, sizeof y);
      moe__gemm g = whole;
      g.C = y;
      ASSERT_OK(moe__gemm_row(&g, threads));
      for (int n = 0; n < N; n++)
        if (memcmp(&y[n], &yr[n], sizeof y[n])) FAIL_("threads %d: y[%d] = %.9g, the whole product's %.9g", threads, n, y[n], yr[n]);
    }
  memcpy(x2, x, sizeof x), memcpy(x2 + K, x, sizeof x);
  memset(y2, 0, sizeof y2), memset(yr, 0, sizeof yr);
  moe__gemm g2 = {false, true, 2, N, K, 1.0f, 0.0f, x2, K, W, LDB, y2, N, false}, r2 = g2;
  r2.C = yr;
  ASSERT_OK(moe__gemm_row(&g2, 2));
  ASSERT_OK(moe__gemm_run(&r2, 1, 2));
  ASSERT(!memcmp(y2, yr, sizeof y2));
  free(W);
}
