/* GEMMs through CBLAS. A list of independent GEMMs (the per-expert GEMMs of a grouped GEMM, or one
 * big GEMM) is cut into tiles along M or N and the tiles are spread over OpenMP threads, each tile
 * one single-threaded BLAS call: spreading experts over the cores beats threading each GEMM
 * (DESIGN 3b). Row-major throughout. */
#ifndef MOE_GEMM_H
#define MOE_GEMM_H

#include <stdbool.h>

typedef struct {
  bool ta, tb;  /* op(A) = A^T when ta, op(B) = B^T when tb */
  int M, N, K;  /* C (M, N) = alpha op(A) (M, K) op(B) (K, N) + beta C */
  float alpha, beta;
  const float *A; int lda;
  const float *B; int ldb;
  float *C; int ldc;
} moe__gemm;

/* Runs the n GEMMs; they must not write overlapping parts of C. */
void moe__gemm_run(const moe__gemm *g, int n, int threads);
/* Threads to use for a requested count (0 = all cores). */
int moe__threads(int requested);

#endif
