/* Tiled grouped GEMM over CBLAS (see gemm.h) and the BLAS identification string. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm.h"
#include "kernels/work.h"
#include "internal.h"

/* Tiles per thread: enough to balance experts of different sizes, few enough to keep tiles large. */
#define TILES_PER_THREAD 4
#define MIN_TILE 64
#define MAX_TILES 4096 /* 64 KiB of stack */
/* moe__gemm_run_fixed: a GEMM is cut only past this many flops (about 5 ms of one core), so most
 * expert GEMMs run whole, one per thread, and their tiles never depend on the rest of the list */
double moe__fixed_tile_flops = 1073741824.0;

int moe__gemm_one(const moe__gemm *g) {
  if (g->M <= 0 || g->N <= 0) return 1;
  if (g->K <= 0) { /* C = beta C; BLAS rejects K = 0 leading dimensions on some builds */
    for (int i = 0; i < g->M; i++)
      for (int j = 0; j < g->N; j++) /* beta = 0 overwrites: NaN in C must not survive */
        g->C[(size_t)i * g->ldc + j] = g->beta == 0.0f ? 0.0f : g->beta * g->C[(size_t)i * g->ldc + j];
    return 1;
  }
  if (g->bf16) return moe__gemm_bf16_one(g);
  if (moe__gemm_small(g)) return 1;
  cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
              g->M, g->N, g->K, g->alpha, g->A, g->lda, g->B, g->ldb, g->beta, g->C, g->ldc);
  return 1;
}

/* Sub-GEMM of rows [m0, m0+m) and columns [n0, n0+n) of C. */
static moe__gemm gemm_tile(const moe__gemm *g, int m0, int m, int n0, int n) {
  moe__gemm t = *g;
  t.M = m;
  t.N = n;
  size_t es = g->bf16 ? 2 : 4;
  t.A = (const char *)g->A + es * (g->ta ? (size_t)m0 : (size_t)m0 * g->lda);
  t.B = (const char *)g->B + es * (g->tb ? (size_t)n0 * g->ldb : (size_t)n0);
  t.C = g->C + (size_t)m0 * g->ldc + n0;
  return t;
}

moe_status moe__gemm_run(const moe__gemm *g, int n, int threads) {
  return moe__gemm_run_side(g, n, threads, NULL);
}

/* Sub-GEMM of rows [m0, m0+m) and columns [n0, n0+n) of C. */
static moe__gemm gemm_tile(const moe__gemm *g, int m0, int m, int n0, int n);

moe_status moe__gemm_row(const moe__gemm *g, int threads) {
  if (g->M != 1 || g->ta || !g->tb || g->bf16 || g->K <= 0) return moe__gemm_run(g, 1, threads);
  enum { ROWS = 16 }; /* W's rows an item */
  int nt = moe__threads(threads);
  moe__work work = moe__work_of((g->N + ROWS - 1) / ROWS, nt);
#pragma omp parallel num_threads(nt)
  {
    omp_set_num_threads(1); /* the BLAS single-threaded inside, as in run_tiles */
    int t0, n;
    while ((n = moe__work_take(&work, &t0)) > 0) {
      int n0 = t0 * ROWS, cols = n0 + n * ROWS <= g->N ? n * ROWS : g->N - n0;
      moe__gemm t = gemm_tile(g, 0, 1, n0, cols);
      if (!moe__gemm_small(&t)) /* no AVX-512 */
        cblas_sgemv(CblasRowMajor, CblasNoTrans, cols, g->K, g->alpha, t.B, g->ldb, g->A, 1, g->beta, t.C, 1);
    }
  }
  return MOE_OK;
}

/* The tiles: each GEMM cut into parts of about `target` flops (fixed: FIXED_TILE_FLOPS; else a share
 * of the list's total work per thread), in whole SIMD blocks; then one dynamic schedule. */
static moe_status run_tiles(const moe__gemm *g, int n, int threads, const moe__side_work *side, int fixed);

moe_status moe__gemm_run_side(const moe__gemm *g, int n, int threads, const moe__side_work *side) {
  return run_tiles(g, n, threads, side, 0);
}

moe_status moe__gemm_run_fixed(const moe__gemm *g, int n, int threads, const moe__side_work *side) {
  return run_tiles(g, n, threads, side, 1);
}

/* The parts a GEMM is cut into for tiles of about `target` flops (at most its longer side of C over
 * MIN_TILE). */
static int tile_parts(const moe__gemm *q, double target) {
  double f = (double)q->M * q->N * (q->K + 1);
  int len = q->M >= q->N ? q->M : q->N;
  int parts = (int)(f / target);
  if (parts > len / MIN_TILE) parts = len / MIN_TILE;
  return parts < 1 ? 1 : parts;
}

int moe__gemm_fixed_whole(const moe__gemm *g) { return tile_parts(g, moe__fixed_tile_flops) == 1; }

/* The grid of pm x pn tiles a GEMM of `parts` tiles is cut into: about square tiles, since each
 * tile's BLAS call packs its own rows of A and columns of B again (strips down the whole of the
 * longer side packed the shorter side's operand once per tile: 12% of case M skewed's samples in the
 * BLAS's copies; square tiles 1.05x there), each part of rows at least SMALL_ROWS long. Strips along
 * the longer side, as before, for a GEMM of fewer than 2 SMALL_ROWS rows, one too narrow for the grid
 * to make its parts, and a grid of more tiles than the list's `budget` leaves it.
 * Like the strips, the grid depends on the GEMM's shape alone, so under moe__gemm_run_fixed the bits
 * do not depend on the thread count. */
#define SMALL_ROWS 256
static void tile_grid(const moe__gemm *q, int parts, int budget, int *pm, int *pn) {
  int m = 1, n = 0;
  if (q->M >= 2 * SMALL_ROWS) {
    int mmax = q->M / SMALL_ROWS < parts ? q->M / SMALL_ROWS : parts, nmax = q->N / MIN_TILE > 1 ? q->N / MIN_TILE : 1;
    m = (int)lround(sqrt((double)parts * q->M / q->N));
    m = m < 1 ? 1 : m > mmax ? mmax : m;
    n = (parts + m - 1) / m;
    if (n > nmax) n = nmax;
  }
  if (m * n < parts || m * n > budget) { /* strips */
    m = q->M >= q->N ? parts : 1;
    n = q->M >= q->N ? 1 : parts;
  }
  *pm = m;
  *pn = n;
}

static moe_status run_tiles(const moe__gemm *g, int n, int threads, const moe__side_work *side, int fixed) {
  threads = moe__threads(threads);
  for (int i = 0; i < n; i++)
    if (g[i].bf16) {
      moe__gemm_bf16_init();
      break;
    }
  while (n > MAX_TILES) { /* batches small enough for one tile each; the side work with the last */
    MOE_CHECK(run_tiles(g, MAX_TILES, threads, NULL, fixed));
    g += MAX_TILES;
    n -= MAX_TILES;
  }
  int ns = side ? side->n : 0;
  if (threads == 1 && openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  double total = 0;
  for (int i = 0; i < n; i++) total += (double)g[i].M * g[i].N * (g[i].K + 1);
  double target = fixed ? moe__fixed_tile_flops : threads == 1 ? INFINITY : total / (threads * TILES_PER_THREAD) + 1;
  /* tiles: (gemm index, rows from m0, columns from n0, their counts); on the stack, read by every thread */
  struct { int gi, m0, m, n0, n; } tiles[MAX_TILES];
  int nt = 0;
  for (int i = 0; i < n; i++) {
    const moe__gemm *q = &g[i];
    if (q->M <= 0 || q->N <= 0) continue;
    int parts = tile_parts(q, target);
    int budget = (MAX_TILES - nt) / (n - i); /* every GEMM left gets at least one tile */
    if (parts > budget) parts = budget > 0 ? budget : 1;
    int pm, pn;
    tile_grid(q, parts, budget, &pm, &pn);
    int sm = ((q->M + pm - 1) / pm + 15) & ~15, sn = ((q->N + pn - 1) / pn + 15) & ~15; /* whole SIMD blocks */
    for (int m0 = 0; m0 < q->M; m0 += sm)
      for (int n0 = 0; n0 < q->N; n0 += sn) {
        tiles[nt].gi = i;
        tiles[nt].m0 = m0;
        tiles[nt].m = m0 + sm <= q->M ? sm : q->M - m0;
        tiles[nt].n0 = n0;
        tiles[nt].n = n0 + sn <= q->N ? sn : q->N - n0;
        nt++;
      }
  }
  int failed = 0, items = nt + ns;
  /* BLAS must not thread, nor oneDNN, which threads whenever it is not inside an active region
   * (a team of one is not): each thread's own count is set to 1, so the thread count is the caller's. */
#pragma omp parallel num_threads(threads) reduction(| : failed)
  {
    omp_set_num_threads(1);
#pragma omp for schedule(dynamic, 1)
    for (int j = 0; j < items; j++) {
      /* item j is side item floor(j ns / items) when that count steps up at j, else a tile: the side
       * items are spread evenly over the schedule */
      long long before = (long long)j * ns / items, upto = (long long)(j + 1) * ns / items;
      if (upto > before) {
        side->run(side->ctx, (int)before);
        continue;
      }
      int t = j - (int)before;
      const moe__gemm *q = &g[tiles[t].gi];
      moe__gemm tile = gemm_tile(q, tiles[t].m0, tiles[t].m, tiles[t].n0, tiles[t].n);
      failed |= !moe__gemm_one(&tile);
    }
  }
  MOE_TRY(!failed, MOE_ERR_NOMEM, "a bf16 GEMM failed: out of memory");
  return MOE_OK;
}

const char *moe_blas_info(void) {
  static char buf[256];
  const char *cfg = openblas_get_config();
  const char *core = openblas_get_corename();
  int par = openblas_get_parallel(); /* 0 serial, 1 pthreads, 2 OpenMP */
  char ver[64] = "OpenBLAS";
  if (cfg) {
    const char *sp = strchr(cfg, ' ');
    const char *sp2 = sp ? strchr(sp + 1, ' ') : NULL;
    if (sp2 && sp2 - cfg < (long)sizeof ver) {
      memcpy(ver, cfg, (size_t)(sp2 - cfg));
      ver[sp2 - cfg] = 0;
    }
  }
  snprintf(buf, sizeof buf, "%s (kernels %s, %s)", ver, core ? core : "?",
           par == 2 ? "OpenMP" : par == 1 ? "pthreads" : "serial");
  return buf;
}

const char *moe_blas_better_coretype(void) {
  /* MOE_KEEP_BLAS_CORETYPE keeps whatever OpenBLAS loaded; MOE_BLAS_REEXEC marks the process that
   * was already restarted, so a BLAS that ignores the variable cannot make a loop. */
  if (getenv("MOE_KEEP_BLAS_CORETYPE") || getenv("MOE_BLAS_REEXEC")) return NULL;
  int avx512 = moe__cpu_has(MOE__CPU_AVX512F | MOE__CPU_AVX512BW | MOE__CPU_AVX512DQ | MOE__CPU_AVX512VL |
                            MOE__CPU_AVX512CD);
  const char *core = openblas_get_corename();
  int has512 = core && (strstr(core, "SkylakeX") || strstr(core, "Cooperlake") || strstr(core, "SapphireRapids") ||
                        strstr(core, "Zen4") || strstr(core, "ZEN4"));
  return avx512 && !has512 ? "SKYLAKEX" : NULL;
}

double moe_sgemm_gflops(int n, int threads, int reps) {
  size_t nn = (size_t)n * n;
  float *a = aligned_alloc(64, nn * 4), *b = aligned_alloc(64, nn * 4), *c = aligned_alloc(64, nn * 4);
  double best = 0;
  if (a && b && c) {
    for (size_t i = 0; i < nn; i++) a[i] = b[i] = (float)(i % 17) * 0.01f;
    openblas_set_num_threads(moe__threads(threads));
    for (int r = 0; r < reps + 1; r++) { /* the first run warms caches and threads */
      double t0 = moe__now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
      double g = 2.0 * n * (double)n * n / (moe__now() - t0) / 1e9;
      if (r > 0 && g > best) best = g;
    }
  }
  free(a);
  free(b);
  free(c);
  return best;
}
