/* The tiled grouped GEMM against a double-precision triple loop: every transpose combination, shapes
 * that do not divide into tiles, several GEMMs at once, 1 and 3 threads, beta 0 and 1; and K = 0,
 * where beta = 0 must overwrite C (NaN included) rather than scale it; side work run alongside. */
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "gemm.h"
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
      out[(size_t)i * g->N + j] = (float)(g->alpha * acc + g->beta * g->C[(size_t)i * g->ldc + j]);
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
