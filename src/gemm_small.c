/* fp32 GEMMs with a small side, on AVX-512, without packing the large operand.
 *
 * An expert with few rows (64 at case L) multiplies them by weights of H x D: a BLAS copies the
 * weights into its panel layout on every call (four times a step for each weight), and with so few
 * rows that copy costs about a quarter of the multiply. Here the weights are read where they lie:
 * - NN  C (m, N) = A (m, K) B (K, N): B's rows are contiguous along N, which the kernel vectorizes;
 * - TN  C (M, N) = A^T B with A (k, M), B (k, N) and few k (weight gradients): the same, broadcasting
 *   A's rows, which are contiguous along M;
 * - NT  C (m, N) = A B^T with B (N, K) (the forward): the kernel computes C^T, vectorized along the
 *   m rows of A^T (a copy of A, the small operand) and broadcasting B's rows as they stream by.
 * Each register tile is MR rows by up to 64 columns (4 vectors, the last masked) accumulated over a
 * block of KC of the inner dimension; the results depend on the shape only, never on threads. */
#include "gemm.h"

#ifdef __AVX512F__
#include <immintrin.h>
#include <stdint.h>

#define MR 6      /* rows of a register tile: 6 x 4 accumulators of 16 floats */
#define NR 64     /* columns of a register tile */
#define KC 512    /* inner-dimension block: a 64-column panel of it stays in L2 */
#define SMALL 128 /* the small side up to which the library's panels cost more than they save */

/* The masks of the vectors of a tile of n columns (n <= NR). */
static inline void col_masks(int n, __mmask16 mk[4]) {
  for (int q = 0; q < 4; q++) {
    int c = n - 16 * q;
    mk[q] = c >= 16 ? (__mmask16)0xffff : c > 0 ? (__mmask16)((1u << c) - 1) : 0;
  }
}

/* acc (mr, nq vectors) = (first ? beta C : C) + sum over k < kc of a(r, k) b(k, :), a(r, k) at
 * a[r * ar + k * ak], b(k, :) at b + k * ldb; C at c with row stride ldc, columns masked by mk. */
static inline __attribute__((always_inline)) void tile(int mr, int nq, int kc, const float *a, long ar, long ak,
                                                      const float *b, long ldb, float *c, long ldc,
                                                      const __mmask16 *mk, int load_c, float beta, const float *pf,
                                                      long pfld, int pfrows) {
  __m512 acc[MR][4];
#pragma GCC unroll 6
  for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
    for (int q = 0; q < nq; q++)
      acc[r][q] = load_c ? _mm512_mul_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(mk[q], c + r * ldc + 16 * q))
                         : _mm512_setzero_ps();
  for (int k = 0; k < kc; k++) {
    __m512 bv[4];
    if (k < pfrows) /* what the next tile reads from memory, while this one computes */
#pragma GCC unroll 4
      for (int q = 0; q < 4; q++) _mm_prefetch((const char *)(pf + k * pfld + 16 * q), _MM_HINT_T1);
#pragma GCC unroll 4
    for (int q = 0; q < nq; q++) bv[q] = _mm512_maskz_loadu_ps(mk[q], b + k * ldb + 16 * q);
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++) {
      __m512 av = _mm512_set1_ps(a[r * ar + k * ak]);
#pragma GCC unroll 4
      for (int q = 0; q < nq; q++) acc[r][q] = _mm512_fmadd_ps(av, bv[q], acc[r][q]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
    for (int q = 0; q < nq; q++) _mm512_mask_storeu_ps(c + r * ldc + 16 * q, mk[q], acc[r][q]);
}

typedef void (*tile_fn)(int kc, const float *a, long ar, long ak, const float *b, long ldb, float *c, long ldc,
                        const __mmask16 *mk, int load_c, float beta, const float *pf, long pfld, int pfrows);
#define TILE(mr, nq)                                                                                         \
  static void tile_##mr##_##nq(int kc, const float *a, long ar, long ak, const float *b, long ldb, float *c, \
                               long ldc, const __mmask16 *mk, int load_c, float beta, const float *pf,      \
                               long pfld, int pfrows) {                                                     \
    tile(mr, nq, kc, a, ar, ak, b, ldb, c, ldc, mk, load_c, beta, pf, pfld, pfrows);                         \
  }
#define TILES(mr) TILE(mr, 1) TILE(mr, 2) TILE(mr, 3) TILE(mr, 4)
TILES(1) TILES(2) TILES(3) TILES(4) TILES(5) TILES(6)
#define ROW(mr) {tile_##mr##_1, tile_##mr##_2, tile_##mr##_3, tile_##mr##_4}
static const tile_fn tiles[MR][4] = {ROW(1), ROW(2), ROW(3), ROW(4), ROW(5), ROW(6)};

/* C (M, N) = sum_k a(i, k) b(k, j) + beta C, a(i, k) at a[i * ar + k * ak], b's rows ldb apart: tiles
 * down a panel of B's columns, which stays in cache for the next tile while the next panel is
 * prefetched. With few k (TN, at most SMALL) the panel is first copied together: rows of the
 * weights' width apart, its rows would fall into the same few sets of the L1 cache. */
static void run_tiles(int M, int N, int K, const float *a, long ar, long ak, const float *b, long ldb, float beta,
                      float *c, long ldc, int copy_panel) {
  static _Thread_local float bp[SMALL * NR] __attribute__((aligned(64)));
  for (int k0 = 0; k0 < K; k0 += KC) {
    int kc = K - k0 < KC ? K - k0 : KC;
    for (int j = 0; j < N; j += NR) {
      int nc = N - j < NR ? N - j : NR;
      __mmask16 mk[4];
      col_masks(nc, mk);
      const float *panel = b + (long)k0 * ldb + j;
      long pld = ldb;
      if (copy_panel) {
        for (int k = 0; k < kc; k++)
          for (int q = 0; q < 4; q++) _mm512_store_ps(bp + k * NR + 16 * q, _mm512_maskz_loadu_ps(mk[q], panel + k * ldb + 16 * q));
        panel = bp;
        pld = NR;
      }
      for (int i = 0; i < M; i += MR) {
        int mr = M - i < MR ? M - i : MR, load_c = k0 > 0 || beta != 0.0f;
        /* prefetched: the next tile's rows of C (TN: few k, the tile waits for C), else the next
         * panel of B while the first tile reads this one */
        int pc = copy_panel && load_c && i + MR < M, pb = !copy_panel && i == 0 && j + NR < N;
        tiles[mr - 1][(nc + 15) / 16 - 1](kc, a + i * ar + k0 * ak, ar, ak, panel, pld, c + i * ldc + j, ldc, mk,
                                            load_c, k0 > 0 ? 1.0f : beta,
                                            pc ? c + (i + MR) * ldc + j : panel + NR, pc ? ldc : ldb,
                                            pc ? (M - i - MR < MR ? M - i - MR : MR) : pb ? kc : 0);
      }
    }
  }
}

/* NT: C^T (N, m) = B (N, K) A^T (K, m), through a copy of A^T in blocks of KC x NR. */
static void run_nt(const moe__gemm *g) {
  static _Thread_local float at[KC * NR] __attribute__((aligned(64)));
  static _Thread_local float ct[MR * NR] __attribute__((aligned(64)));
  const float *A = g->A, *B = g->B;
  for (int i0 = 0; i0 < g->M; i0 += NR) {
    int mc = g->M - i0 < NR ? g->M - i0 : NR;
    __mmask16 mk[4];
    col_masks(mc, mk);
    for (int k0 = 0; k0 < g->K; k0 += KC) {
      int kc = g->K - k0 < KC ? g->K - k0 : KC;
      for (int i = 0; i < mc; i++)
        for (int k = 0; k < kc; k++) at[k * NR + i] = A[(long)(i0 + i) * g->lda + k0 + k];
      for (int j = 0; j < g->N; j += MR) {
        int mr = g->N - j < MR ? g->N - j : MR;
        tiles[mr - 1][(mc + 15) / 16 - 1](kc, B + (long)j * g->ldb + k0, g->ldb, 1, at, NR, ct, NR, mk, 0, 0.0f, NULL, 0, 0);
        float beta = k0 > 0 ? 1.0f : g->beta;
        for (int i = 0; i < mc; i++) {
          float *cr = g->C + (long)(i0 + i) * g->ldc + j;
          for (int r = 0; r < mr; r++) cr[r] = ct[r * NR + i] + (beta != 0.0f ? beta * cr[r] : 0.0f);
        }
      }
    }
  }
}

int moe__gemm_small(const moe__gemm *g) {
  if (g->bf16 || g->alpha != 1.0f || !__builtin_cpu_supports("avx512f")) return 0;
  if (!g->ta && !g->tb && g->M <= SMALL) /* NN */
    run_tiles(g->M, g->N, g->K, g->A, g->lda, 1, g->B, g->ldb, g->beta, g->C, g->ldc, 0);
  else if (g->ta && !g->tb && g->K <= SMALL) /* TN: a(i, k) = A[k][i] */
    run_tiles(g->M, g->N, g->K, g->A, 1, g->lda, g->B, g->ldb, g->beta, g->C, g->ldc, 1);
  else if (!g->ta && g->tb && g->M <= SMALL) /* NT */
    run_nt(g);
  else
    return 0;
  return 1;
}

#else
int moe__gemm_small(const moe__gemm *g) {
  (void)g;
  return 0;
}
#endif
