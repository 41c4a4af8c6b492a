/* fp32 GEMMs with a small side, on AVX-512, without packing the large operand.
 *
 * An expert with few rows (64 at case L) multiplies them by weights of H x D: a BLAS copies the
 * weights into its panel layout on every call (four times a step for each weight), and with so few
 * rows that copy costs about a quarter of the multiply. Here the weights are read where they lie:
 * - NN  C (m, N) = A (m, K) B (K, N): B's rows are contiguous along N, which the kernel vectorizes;
 * - TN  C (M, N) = A^T B with A (k, M), B (k, N) and few k (weight gradients): the same, broadcasting
 *   A's rows, which are contiguous along M;
 * - NT  C (m, N) = A B^T with B (N, K) (the forward): the kernel computes C^T, vectorized along the
 *   m rows of A^T (a copy of A, the small operand) and broadcasting B's rows as they stream by;
 *   with up to 16 rows (the inner experts of a hierarchical layer), dot products along K instead, as
 *   are the rows past a multiple of 64 by up to 16.
 * Each register tile is MR rows by up to 64 columns (4 vectors, the last masked) accumulated over a
 * block of the inner dimension (kc for NN, up to kc_nt for NT, all of it for TN: moe__gemm_params,
 * from the L2's size); the results depend on the shape and those blocks only, never on threads. */
#include "kernels/gemm.h"
#include "internal.h"

#ifdef __AVX512F__
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>

#define MR 6      /* rows of a register tile: 6 x 4 accumulators of 16 floats */
#define NR 64     /* columns of a register tile */
#define SMALL 128 /* the small side up to which the library's panels cost more than they save */
#define NT_COLS 48 /* rows of B (8 tiles) whose products NT writes back to C together */
/* Each thread's copy of an operand (A^T for NT, B's strips for TN): kc_nt x SMALL floats (512 KiB at
 * kc_nt 1024), kept in L2 while it is read, and after it NT's products before their write-back. On the
 * heap, made once per thread: as thread-local data it would be part of every thread's stack, and
 * threads with small stacks (an HTTP server's) could not start. */
static long copy_floats(void) { return (long)moe__gemm_params_get()->kc_nt * SMALL; }
static long scratch_floats(void) { return copy_floats() + SMALL * NT_COLS; }
static tss_t scratch_key;
static once_flag scratch_once = ONCE_FLAG_INIT;
static int scratch_keyed;
static void scratch_init(void) { scratch_keyed = tss_create(&scratch_key, free) == thrd_success; }
/* This thread's scratch, or NULL when there is no memory for it (the GEMM then goes to the BLAS);
 * moe__gemm_small_scratch makes it ahead of the steps. */
static float *scratch(void) {
  call_once(&scratch_once, scratch_init);
  if (!scratch_keyed) return NULL;
  float *s = tss_get(scratch_key);
  if (!s && (s = aligned_alloc(64, scratch_floats() * sizeof *s))) {
    memset(s, 0, scratch_floats() * sizeof *s); /* NT's write-back loads whole vectors, lanes it never stores included */
    if (tss_set(scratch_key, s) != thrd_success) {
      free(s);
      s = NULL;
    }
  }
  return s;
}

/* The mask of a vector's first n lanes (all 16 from n = 16 on, none for n <= 0). */
static inline __mmask16 lanes(int n) { return n >= 16 ? (__mmask16)0xffff : n > 0 ? (__mmask16)((1u << n) - 1) : 0; }

/* Sixteen floats at p, only lanes mk where mk is not all of them: a masked load is the slower one
 * (from memory 2.4x slower a byte on a Zen 5: its prefetchers do not follow it), so a loop takes its
 * full steps with the mask a constant 0xffff and its last step masked. */
static inline __attribute__((always_inline)) __m512 load16(__mmask16 mk, const float *p) {
  return mk == 0xffff ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(mk, p);
}

/* The masks of the vectors of a tile of n columns (n <= NR). */
static inline void col_masks(int n, __mmask16 mk[4]) {
  for (int q = 0; q < 4; q++) mk[q] = lanes(n - 16 * q);
}

/* acc (mr, nq vectors) = (first ? beta C : C) + sum over k < kc of a(r, k) b(k, :), a(r, k) at
 * a[r * ar + k * ak], b(k, :) at b + k * ldb; C at c with row stride ldc, columns masked by mk (all
 * but the last vector's full; with full, the last's too: b's loads then unmasked). */
static inline __attribute__((always_inline)) void tile(int mr, int nq, int full, int kc, const float *a, long ar, long ak,
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
      for (int q = 0; q < 4; q++) _mm_prefetch((const char *)(pf + k * pfld + 16 * q), _MM_HINT_T0);
#pragma GCC unroll 4
    for (int q = 0; q < nq; q++) bv[q] = load16(q < nq - 1 || full ? 0xffff : mk[q], b + k * ldb + 16 * q);
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
#define TILE(mr, nq, full)                                                                                  \
  static void tile_##mr##_##nq##_##full(int kc, const float *a, long ar, long ak, const float *b, long ldb,    \
                                        float *c, long ldc, const __mmask16 *mk, int load_c, float beta,       \
                                        const float *pf, long pfld, int pfrows) {                             \
    tile(mr, nq, full, kc, a, ar, ak, b, ldb, c, ldc, mk, load_c, beta, pf, pfld, pfrows);                     \
  }
#define TILES(mr) TILE(mr, 1, 0) TILE(mr, 2, 0) TILE(mr, 3, 0) TILE(mr, 4, 0) \
                  TILE(mr, 1, 1) TILE(mr, 2, 1) TILE(mr, 3, 1) TILE(mr, 4, 1)
TILES(1) TILES(2) TILES(3) TILES(4) TILES(5) TILES(6)
#define ROW(mr) {{tile_##mr##_1_0, tile_##mr##_1_1}, {tile_##mr##_2_0, tile_##mr##_2_1}, \
                 {tile_##mr##_3_0, tile_##mr##_3_1}, {tile_##mr##_4_0, tile_##mr##_4_1}}
static const tile_fn tiles[MR][4][2] = {ROW(1), ROW(2), ROW(3), ROW(4), ROW(5), ROW(6)};
/* The register tile of mr rows and nc columns (1 to NR). */
static inline tile_fn tile_of(int mr, int nc) { return tiles[mr - 1][(nc + 15) / 16 - 1][nc % 16 == 0]; }

/* NN: C (M, N) = A B + beta C: tiles down a panel of B's columns, which stays in cache for the next
 * tile while the first tile prefetches the next panel (after a block of K's last panel, the next
 * block's first: 1.03-1.05x where N is short, as dx's 768 columns). */
static void run_nn(const moe__gemm *g) {
  const float *A = g->A, *B = g->B;
  const int block = moe__gemm_params_get()->kc;
  for (int k0 = 0; k0 < g->K; k0 += block) {
    int kc = g->K - k0 < block ? g->K - k0 : block;
    for (int j = 0; j < g->N; j += NR) {
      int nc = g->N - j < NR ? g->N - j : NR, pr = j + NR < g->N ? kc : 0;
      __mmask16 mk[4];
      col_masks(nc, mk);
      const float *panel = B + (long)k0 * g->ldb + j, *pf = panel + NR;
      if (!pr && k0 + kc < g->K) { /* the next block's first panel */
        pf = B + (long)(k0 + kc) * g->ldb;
        pr = g->K - k0 - kc < block ? g->K - k0 - kc : block;
      }
      for (int i = 0; i < g->M; i += MR) {
        int mr = g->M - i < MR ? g->M - i : MR, load_c = k0 > 0 || g->beta != 0.0f;
        tile_of(mr, nc)(kc, A + (long)i * g->lda + k0, g->lda, 1, panel, g->ldb,
                                            g->C + (long)i * g->ldc + j, g->ldc, mk, load_c, k0 > 0 ? 1.0f : g->beta,
                                            pf, g->ldb, i == 0 ? pr : 0);
      }
    }
  }
}

/* TN with at most SMALL inner steps (the weight gradients): C (M, N), a gradient that does not stay
 * in cache from one expert to the next, is swept a group of TN_GROUP row tiles at a time, strip after
 * strip of NR columns, so each row is read along its length with the same rows' strip two ahead
 * prefetched (1.02-1.1x one ahead, four ahead slower), and from the group's last two strips on, the
 * next group's first two where the columns copied at a time make two strips or more (1.05-1.15x, most
 * where C is narrow: fewer strips to a group); B is first copied into strips of NR columns
 * (contiguous: rows of the weights' width apart, its rows would fall into the same few sets of the L1
 * cache), as many columns at a time as the scratch holds. Case L's gradients alone (64 rows, 2
 * threads): 1.2-1.4x the 64-column strips down all of C's rows that the NN panels walk; inside the
 * layer's backward, within the noise. */
#define TN_GROUP 8
static void run_tn_rows(const moe__gemm *g, float *bp) {
  const float *A = g->A, *B = g->B;
  float *C = g->C;
  int K = g->K, load_c = g->beta != 0.0f, width = (int)(copy_floats() / K / NR * NR);
  for (int j0 = 0; j0 < g->N; j0 += width) {
    int w = g->N - j0 < width ? g->N - j0 : width;
    for (int j = 0; j < w; j += NR) {
      __mmask16 mk[4];
      col_masks(w - j < NR ? w - j : NR, mk);
      for (int k = 0; k < K; k++)
        for (int q = 0; q < 4; q++)
          _mm512_store_ps(bp + ((long)j * K + k * NR) + 16 * q,
                          _mm512_maskz_loadu_ps(mk[q], B + (long)k * g->ldb + j0 + j + 16 * q));
    }
    for (int i0 = 0; i0 < g->M; i0 += TN_GROUP * MR) {
      int i1 = g->M - i0 < TN_GROUP * MR ? g->M : i0 + TN_GROUP * MR;
      for (int j = 0; j < w; j += NR) {
        int nc = w - j < NR ? w - j : NR, ahead = j + 2 * NR - (w + NR - 1) / NR * NR; /* >= 0: the next group's */
        __mmask16 mk[4];
        col_masks(nc, mk);
        for (int i = i0; i < i1; i += MR) {
          int mr = i1 - i < MR ? i1 - i : MR, ni = i + TN_GROUP * MR, pr = 0;
          float *c = C + (long)i * g->ldc + j0 + j, *pf = c + 2 * NR;
          if (load_c && ahead < 0)
            pr = mr;
          else if (load_c && ahead < w && ni < g->M) {
            pf = C + (long)ni * g->ldc + j0 + ahead;
            pr = g->M - ni < MR ? g->M - ni : MR;
          }
          tile_of(mr, nc)(K, A + i, 1, g->lda, bp + (long)j * K, NR, c, g->ldc, mk, load_c, g->beta,
                                              pf, g->ldc, pr);
        }
      }
    }
  }
}

/* NT with at most DOT_M rows: each C(i, j) is the dot product of A's row i and B's row j, both
 * contiguous along K, so the kernel vectorizes along K: nb rows of B at a time against m <= 8 rows
 * of A, m nb <= 16 accumulators of 16 lanes, their sums reduced together once at the end. The kernel
 * above would broadcast B's elements to vectors along the m rows, using m of their 16 lanes. */
#define DOT_ROWS 8 /* rows of one dot tile */
/* rows up to which they beat the kernel above, one thread: weights in cache 5x at 1 row, 2x at 8,
 * 1.05-1.2x at 16; weights out of cache (with the prefetch below) 2-3.5x at 1 to 16 rows */
#define DOT_M 16

/* The 16 sums of v[0..15]'s lanes, in one vector: lane t is the sum of v[t]'s, halving the width
 * at each level (256-, 128-, 64-, 32-bit parts of pairs of vectors added together). */
static inline __attribute__((always_inline)) __m512 sum16(const __m512 *v) {
  __m512 w[8], x[4], y[2];
  /* each level leaves lanes in an order whose bits are swapped in pairs (1 <-> 2, 4 <-> 8): taking
   * the inputs in that order, an involution, puts the sums in order */
  static const int in[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};
#pragma GCC unroll 8 /* unrolled, so that the accumulators stay in registers */
  for (int a = 0; a < 8; a++)
    w[a] = _mm512_add_ps(_mm512_shuffle_f32x4(v[in[a]], v[in[a + 8]], 0x44),
                         _mm512_shuffle_f32x4(v[in[a]], v[in[a + 8]], 0xee));
#pragma GCC unroll 4
  for (int a = 0; a < 4; a++)
    x[a] = _mm512_add_ps(_mm512_shuffle_f32x4(w[a], w[a + 4], 0x88), _mm512_shuffle_f32x4(w[a], w[a + 4], 0xdd));
#pragma GCC unroll 2
  for (int a = 0; a < 2; a++) {
    __m512d p = _mm512_castps_pd(x[a]), q = _mm512_castps_pd(x[a + 2]);
    y[a] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(p, q)), _mm512_castpd_ps(_mm512_unpackhi_pd(p, q)));
  }
  return _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xdd));
}

/* dot_tile's step at k: lanes mk of A's m rows against B's nb rows into acc, prefetching pf ahead. */
static inline __attribute__((always_inline)) void dot_step(int m, int nb, __mmask16 mk, int k, const float *A,
                                                          long lda, const float *B, long ldb, long pf, __m512 *acc) {
  __m512 b[16];
#pragma GCC unroll 16
  for (int j = 0; j < nb; j++) {
    b[j] = load16(mk, B + j * ldb + k);
    _mm_prefetch((const char *)(B + pf + j * ldb + k), _MM_HINT_T0);
  }
#pragma GCC unroll 8
  for (int i = 0; i < m; i++) {
    __m512 a = load16(mk, A + i * lda + k);
#pragma GCC unroll 16
    for (int j = 0; j < nb; j++) acc[i * nb + j] = _mm512_fmadd_ps(a, b[j], acc[i * nb + j]);
  }
}

/* C(i, j0 + jj) for i < m, skip <= jj < nb, = A's row i . B's row j0 + jj (+ beta C): B and C at
 * row j0 / column j0. */
static inline __attribute__((always_inline)) void dot_tile(int m, int nb, int K, const float *A, long lda,
                                                          const float *B, long ldb, float *C, long ldc, float beta,
                                                          int skip, long pf) {
  __m512 acc[16];
#pragma GCC unroll 16
  for (int t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
  int k = 0;
  for (; k + 16 <= K; k += 16) dot_step(m, nb, 0xffff, k, A, lda, B, ldb, pf, acc);
  if (k < K) dot_step(m, nb, lanes(K - k), k, A, lda, B, ldb, pf, acc);
  float s[16] __attribute__((aligned(64)));
  _mm512_store_ps(s, sum16(acc));
  for (int i = 0; i < m; i++)
    for (int j = skip; j < nb; j++) {
      float *c = C + i * ldc + j;
      *c = s[i * nb + j] + (beta != 0.0f ? beta * *c : 0.0f); /* beta 0 overwrites NaN */
    }
}

typedef void (*dot_fn)(int K, const float *A, long lda, const float *B, long ldb, float *C, long ldc, float beta,
                       int skip, long pf);
#define DOT(m, nb)                                                                                         \
  static void dot_##m##_##nb(int K, const float *A, long lda, const float *B, long ldb, float *C, long ldc, \
                             float beta, int skip, long pf) {                                               \
    dot_tile(m, nb, K, A, lda, B, ldb, C, ldc, beta, skip, pf);                                             \
  }
DOT(2, 8) DOT(3, 5) DOT(4, 4) DOT(5, 3) DOT(6, 2) DOT(7, 2) DOT(8, 2)
DOT(1, 1) DOT(2, 1) DOT(3, 1) DOT(4, 1) DOT(5, 1) DOT(6, 1) DOT(7, 1) DOT(8, 1)
/* One row of A against 16 of B: dot_tile's sums, B's rows taken one after another rather than side by
 * side, so that a decode's single row streams the weights in the order they lie, one stream for the
 * hardware prefetcher and no software prefetch (16 interleaved streams with their prefetches: 15-20%
 * slower on a Mixtral-shaped F32 decode, 10-25% on a Qwen3-shaped one, Zen 4); each row's sum the
 * same chain of multiply-adds as dot_tile's, so the same bits. */
static void dot_1_16(int K, const float *A, long lda, const float *B, long ldb, float *C, long ldc, float beta,
                     int skip, long pf) {
  (void)lda, (void)ldc, (void)pf;
  __m512 acc[16];
  for (int j = 0; j < 16; j++) {
    const float *b = B + j * ldb;
    __m512 s = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= K; k += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(A + k), _mm512_loadu_ps(b + k), s);
    if (k < K) s = _mm512_fmadd_ps(load16(lanes(K - k), A + k), load16(lanes(K - k), b + k), s);
    acc[j] = s;
  }
  float t[16] __attribute__((aligned(64)));
  _mm512_store_ps(t, sum16(acc));
  for (int j = skip; j < 16; j++) C[j] = t[j] + (beta != 0.0f ? beta * C[j] : 0.0f); /* beta 0 overwrites NaN */
}

/* per m: the widest tile, and one B row for panels narrower than that */
static const dot_fn dots[DOT_ROWS][2] = {{dot_1_16, dot_1_1}, {dot_2_8, dot_2_1}, {dot_3_5, dot_3_1},
                                      {dot_4_4, dot_4_1},  {dot_5_3, dot_5_1}, {dot_6_2, dot_6_1},
                                      {dot_7_2, dot_7_1},  {dot_8_2, dot_8_1}};

/* The weights stream from memory (a layer's experts do not fit in cache), in tiles of a few short
 * rows that the hardware prefetcher leaves mostly to demand misses: each tile prefetches the rows of
 * a tile at least this far ahead (2 to 4x faster at 6 to 8 rows on weights out of cache). */
#define DOT_PREFETCH 4096

/* Rows i0 .. i0 + m - 1 (m <= 8), columns j0 .. j0 + n - 1 of C; the last columns past a multiple of
 * the width: the last full tile again, writing only its new columns (beta must not apply twice). */
static void dot_rows(const moe__gemm *g, int i0, int m, int j0, int n) {
  int nb = 16 / m, w = n < nb ? 1 : nb;
  long ahead = (DOT_PREFETCH / 4 / ((long)nb * g->ldb) + 1) * nb; /* rows */
  const float *A = (const float *)g->A + (long)i0 * g->lda;
  float *C = g->C + (long)i0 * g->ldc;
  for (int j = j0; j < j0 + n; j += w) {
    int jt = j0 + n - j < w ? j0 + n - w : j;
    long pf = jt + ahead + nb <= g->N ? ahead * g->ldb : 0; /* never past the end of B */
    dots[m - 1][w == 1](g->K, A, g->lda, (const float *)g->B + (long)jt * g->ldb, g->ldb, C + jt, g->ldc, g->beta,
                        j - jt, pf);
  }
}

/* Rows i0 .. i0 + m - 1 of C against B's rows j .. j + n - 1 (a panel, in cache once the first block
 * has read it): past 8 rows, blocks of rows as even as can be (9 = 5 + 4: one row more than 8 would
 * leave a one-row block, the slowest per row). */
#define DOT_PANEL 64
static void dot_panel(const moe__gemm *g, int i0, int m, int j, int n) {
  int blocks = (m + DOT_ROWS - 1) / DOT_ROWS;
  for (int b = 0, i = i0; b < blocks; b++) {
    int mb = (i0 + m - i) / (blocks - b);
    dot_rows(g, i, mb, j, n);
    i += mb;
  }
}

static void run_nt_dot(const moe__gemm *g) {
  for (int j = 0; j < g->N; j += DOT_PANEL) dot_panel(g, 0, g->M, j, g->N - j < DOT_PANEL ? g->N - j : DOT_PANEL);
}

/* v[0..15] = its transpose (16 x 16): pairs of rows interleaved, then pairs of pairs, then 128-bit
 * parts of rows 4 apart, then of rows 8 apart. */
static inline __attribute__((always_inline)) void transpose16(__m512 v[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    v[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    v[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    v[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    v[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {
    int h = i / 4 * 8 + i % 4;
    t[h] = _mm512_shuffle_f32x4(v[h], v[h + 4], 0x88);
    t[h + 4] = _mm512_shuffle_f32x4(v[h], v[h + 4], 0xdd);
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {
    v[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    v[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd);
  }
}

/* C's rows i < m and columns < n = ct^T (+ beta C), ct holding n rows of NR (C's columns by its
 * rows): a 16 x 16 transpose per 16 rows and 16 columns, stored as rows of 16 columns. */
static void store_transposed(const float *ct, int n, int m, float *C, long ldc, float beta) {
  for (int j0 = 0; j0 < n; j0 += 16) {
    __mmask16 mk = lanes(n - j0);
    for (int i0 = 0; i0 < m; i0 += 16) {
      __m512 v[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; r++) v[r] = _mm512_load_ps(ct + (j0 + r) * NR + i0);
      transpose16(v);
      for (int i = 0; i < 16 && i0 + i < m; i++) {
        float *c = C + (long)(i0 + i) * ldc + j0;
        __m512 x = v[i];
        if (beta != 0.0f) x = _mm512_add_ps(x, _mm512_mul_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(mk, c)));
        _mm512_mask_storeu_ps(c, mk, x);
      }
    }
  }
}

/* at = A^T (rows < m, columns < kc of A) in blocks of NR rows: A(i, k) at at + (i / NR) NR kc + k NR
 * + i % NR; 16 x 16 transposes, rows past m as zeros. */
static void copy_transposed(const float *A, long lda, int m, int kc, float *at) {
  for (int i0 = 0; i0 < m; i0 += 16) {
    float *dst = at + (long)(i0 / NR) * NR * kc + i0 % NR;
    for (int k = 0; k < kc; k += 16) {
      int nk = kc - k < 16 ? kc - k : 16;
      __mmask16 mk = lanes(nk);
      __m512 v[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; r++)
        v[r] = i0 + r < m ? _mm512_maskz_loadu_ps(mk, A + (long)(i0 + r) * lda + k) : _mm512_setzero_ps();
      transpose16(v);
      for (int t = 0; t < nk; t++) _mm512_store_ps(dst + (long)(k + t) * NR, v[t]);
    }
  }
}

/* NT: C^T (N, m) = B (N, K) A^T (K, m), through a copy of A^T in blocks of K of equal length, at most
 * kc_nt (1024 on a 1 MiB L2; K = 768 whole: 1.2x the 512 + 256 of a fixed block, one thread at case L), and of 64 rows:
 * each tile of B's rows is read from memory once and multiplied by every block of rows while it is
 * in L1 (an expert a few rows past 64 would otherwise stream its weights twice). Up to DOT_M rows past
 * a multiple of 64 (half of case L's experts under uniform routing) are dot products against each
 * panel of B's rows just read (two write-back groups, 96 rows), while it is in L2: as a block of the
 * tiles above they would use a few of 16 lanes, and with 6 accumulators wait on the FMAs' latency
 * (case L's two forward GEMMs over 64 experts, 2 threads: 1.2-1.3x at 66 and 72 rows, 1.1-1.2x at
 * 80). The products of NT_COLS rows of B are written back together, transposed 16 x 16 into rows of
 * C: a row at a time, with scalars, the write-back took 10-15% of the forward GEMMs (1.05-1.15x for
 * fc2, whose C takes three blocks of K; fc1 within the noise). */
static void run_nt(const moe__gemm *g, float *at) {
  float *ct = at + copy_floats(); /* the products of NT_COLS rows of B by each block of 64 rows */
  const float *A = g->A, *B = g->B;
  const int kmax = moe__gemm_params_get()->kc_nt;
  int tail = g->M > NR && g->M % NR <= DOT_M ? g->M % NR : 0, mt = g->M - tail;
  int blocks = (g->K + kmax - 1) / kmax, kb = (g->K + blocks - 1) / blocks;
  for (int k0 = 0; k0 < g->K; k0 += kb) {
    int kc = g->K - k0 < kb ? g->K - k0 : kb;
    float beta = k0 > 0 ? 1.0f : g->beta;
    moe__gemm part = *g; /* this block of K, for the dot products */
    part.K = kc;
    part.A = A + k0;
    part.B = B + k0;
    part.beta = beta;
    copy_transposed(A + k0, g->lda, mt, kc, at);
    for (int jb = 0, jd = 0; jb < g->N; jb += NT_COLS) {
      int jn = g->N - jb < NT_COLS ? g->N - jb : NT_COLS;
      for (int j = jb; j < jb + jn; j += MR) {
        int mr = jb + jn - j < MR ? jb + jn - j : MR;
        for (int i0 = 0; i0 < mt; i0 += NR) {
          int mc = mt - i0 < NR ? mt - i0 : NR;
          __mmask16 mk[4];
          col_masks(mc, mk);
          tile_of(mr, mc)(kc, B + (long)j * g->ldb + k0, g->ldb, 1, at + (long)i0 * kc, NR,
                                              ct + (long)i0 * NT_COLS + (j - jb) * NR, NR, mk, 0, 0.0f, NULL, 0, 0);
        }
      }
      for (int i0 = 0; i0 < mt; i0 += NR)
        store_transposed(ct + (long)i0 * NT_COLS, jn, mt - i0 < NR ? mt - i0 : NR, g->C + (long)i0 * g->ldc + jb,
                         g->ldc, beta);
      if (tail && (jb + jn - jd >= DOT_PANEL || jb + jn == g->N)) {
        dot_panel(&part, mt, tail, jd, jb + jn - jd);
        jd = jb + jn;
      }
    }
  }
}

/* TN with at most TN_K inner steps (weight gradients of an inner expert's few rows): C, the gradient,
 * which does not stay in cache from one expert to the next, is swept row block after row block over
 * its whole width (B's few rows stay in L1) with the same columns of the block TN_AHEAD blocks down
 * prefetched; the panels above walk C by 64-column strips and prefetch at most k rows of the next
 * tile. One thread, 64 gradients of 512 x 128 and 128 x 512 in turn: 2.6-3.4x faster at k 1 and 2,
 * 1.3-1.8x at 4, 0.8-0.9x at 8 and 16. */
#define TN_K 5
#define TN_AHEAD 2
static void run_tn_few(const moe__gemm *g) {
  const float *A = g->A, *B = g->B;
  float *C = g->C;
  for (int i = 0; i < g->M; i += MR) {
    int mr = g->M - i < MR ? g->M - i : MR, pi = i + TN_AHEAD * MR, pr = g->M - pi < MR ? g->M - pi : MR;
    for (int j = 0; j < g->N; j += NR) {
      int nc = g->N - j < NR ? g->N - j : NR;
      __mmask16 mk[4];
      col_masks(nc, mk);
      for (int r = 0; r < pr; r++) /* the same columns of a block of rows further down */
        for (int q = 0; q < nc; q += 16) _mm_prefetch((const char *)(C + (long)(pi + r) * g->ldc + j + q), _MM_HINT_T0);
      tile_of(mr, nc)(g->K, A + i, 1, g->lda, B + j, g->ldb, C + (long)i * g->ldc + j, g->ldc, mk,
                                          g->beta != 0.0f, g->beta, NULL, 0, 0);
    }
  }
}

int moe__gemm_small(const moe__gemm *g) {
  if (g->bf16 || g->alpha != 1.0f || !moe__cpu_has(MOE__CPU_AVX512F)) return 0;
  int nn = !g->ta && !g->tb, tn = g->ta && !g->tb, nt = !g->ta && g->tb;
  float *s = NULL;
  if (nn && g->M <= SMALL)
    run_nn(g);
  else if (tn && g->K <= TN_K) /* few k */
    run_tn_few(g);
  else if (tn && g->K <= SMALL && (s = scratch())) /* a(i, k) = A[k][i] */
    run_tn_rows(g, s);
  else if (nt && g->M <= DOT_M) /* few rows */
    run_nt_dot(g);
  else if (nt && g->M <= SMALL && (s = scratch()))
    run_nt(g, s);
  else
    return 0;
  return 1;
}

long moe__gemm_small_scratch_bytes(void) { return scratch_floats() * (long)sizeof(float); }

moe_status moe__gemm_small_scratch(int threads) {
  if (!moe__cpu_has(MOE__CPU_AVX512F)) return MOE_OK;
  int missing = 0;
#pragma omp parallel num_threads(threads) reduction(| : missing)
  missing |= !scratch();
  MOE_TRY(!missing, MOE_ERR_NOMEM, "cannot allocate the small GEMMs' scratch (%d KiB a thread)",
          (int)(moe__gemm_small_scratch_bytes() >> 10));
  return MOE_OK;
}

#else
long moe__gemm_small_scratch_bytes(void) { return 0; }
int moe__gemm_small(const moe__gemm *g) {
  (void)g;
  return 0;
}
moe_status moe__gemm_small_scratch(int threads) {
  (void)threads;
  return MOE_OK;
}
#endif
