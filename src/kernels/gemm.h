/* GEMMs through CBLAS. A list of independent GEMMs (the per-expert GEMMs of a grouped GEMM, or one
 * big GEMM) is cut into tiles along M or N and the tiles are spread over OpenMP threads, each tile
 * one single-threaded BLAS call: spreading experts over the cores beats threading each GEMM
 * (DESIGN 3b). Row-major throughout. */
#ifndef MOE_GEMM_H
#define MOE_GEMM_H

#include <stdbool.h>

#include "base/cpu.h"
#include "moe.h"

typedef struct {
  bool ta, tb;  /* op(A) = A^T when ta, op(B) = B^T when tb */
  int M, N, K;  /* C (M, N) = alpha op(A) (M, K) op(B) (K, N) + beta C */
  float alpha, beta;
  const void *A; int lda; /* float, or bf16 (uint16_t) when bf16 */
  const void *B; int ldb;
  float *C; int ldc;
  bool bf16;    /* A and B are bf16; fp32 accumulation into C; alpha must be 1 and beta 0 or 1 */
} moe__gemm;

/* Runs the n GEMMs; they must not write overlapping parts of C. Fails only for bf16 GEMMs without
 * memory. */
moe_status moe__gemm_run(const moe__gemm *g, int n, int threads);
/* One fp32 GEMM C = alpha A B^T + beta C of one row (M 1, tb, not ta): a decode step's y = x W^T. W's
 * rows, read once where they lie (the BLAS's sgemm packs W first, about doubling the bytes a decode
 * moves), are shared by the threads in runs of 16-row items (work.h), each run through the small
 * kernels' one-row product (gemm_small.c: its rows one after another; the BLAS's sgemv without
 * AVX-512, which read 1.5 times slower a byte on a Zen 4: perf of a Qwen3-shaped F32 decode); its bits
 * are not moe__gemm_run's. Any other GEMM goes to moe__gemm_run. */
moe_status moe__gemm_row(const moe__gemm *g, int threads);
/* Other work that may run alongside a list of GEMMs: n independent items, run(ctx, i) each, on the
 * same threads (one thread per item, BLAS single-threaded). */
typedef struct {
  void (*run)(void *ctx, int i);
  void *ctx;
  int n;
} moe__side_work;
/* moe__gemm_run, with the side items spread among the GEMM tiles of one dynamic schedule: a thread
 * takes whichever comes next, so the two kinds of work run at the same time and end together. The
 * tiles are those moe__gemm_run makes, so the GEMMs give the same bits with or without side work.
 * Past 4096 GEMMs (a batch), the side items go with the last batch. */
moe_status moe__gemm_run_side(const moe__gemm *g, int n, int threads, const moe__side_work *side);
/* moe__gemm_run_side with tiles that depend on each GEMM's own shape only, not on the list's total
 * work or the thread count: a GEMM gives the same bits whatever else runs with it (the experts' GEMMs,
 * so that micro-batches of whole experts compute what one batch does). */
moe_status moe__gemm_run_fixed(const moe__gemm *g, int n, int threads, const moe__side_work *side);
/* One GEMM on the calling thread, for work inside a parallel region whose threads run BLAS
 * single-threaded (side work); returns 0 if a bf16 GEMM failed. */
int moe__gemm_one(const moe__gemm *g);
/* gemm_small.c: an fp32 GEMM with a small side (few rows, or few inner steps for a weight gradient) on
 * AVX-512 kernels that read the large operand in place; returns 0, doing nothing, for any other GEMM
 * (or without AVX-512), which then goes to the BLAS. */
int moe__gemm_small(const moe__gemm *g);
/* The small kernels' blocking, derived from the CPU's caches by moe__gemm_params_for (gemm_params.c
 * says how): the same on one CPU whatever the threads. */
typedef struct {
  int kc;        /* NN's block of the inner dimension (does not change the bits) */
  int kc_nt;     /* NT's longest block of the inner dimension (changes the summation order) */
  long long l2;  /* the L2 size they were derived from, as taken (a power of two) */
} moe__gemm_params;
/* For a CPU's description (NULL: defaults); for this CPU, found once. */
moe__gemm_params moe__gemm_params_for(const moe__cpu *c);
const moe__gemm_params *moe__gemm_params_get(void);
/* Makes the small kernels' scratch (kc_nt x 128 + 128 x 48 floats a thread: 536 KiB at kc_nt 1024) of
 * each of `threads` OpenMP threads now, so that the GEMMs of the steps allocate nothing (layer init
 * calls it); MOE_ERR_NOMEM without the memory. A thread without its scratch later makes it on its
 * first GEMM, or leaves the GEMM to the BLAS. */
moe_status moe__gemm_small_scratch(int threads);
/* The bytes of that scratch a thread (0 in a build without AVX-512). */
long moe__gemm_small_scratch_bytes(void);
/* gemm_bf16.c: oneDNN's bf16 matmul (or the widening path where it has none), set up once before
 * the first bf16 GEMM; and one GEMM (returns 0 when out of memory). */
void moe__gemm_bf16_init(void);
int moe__gemm_bf16_one(const moe__gemm *g);

/* Whole expert GEMMs (sources/ffn.c). Whether moe__gemm_run_fixed runs g as one tile: such a GEMM gives the
 * same bits through moe__gemm_one on any thread. */
int moe__gemm_fixed_whole(const moe__gemm *g);
/* The flops past which moe__gemm_run_fixed cuts a GEMM (2^30); tests lower it to cut small GEMMs. */
extern double moe__fixed_tile_flops;

#endif
