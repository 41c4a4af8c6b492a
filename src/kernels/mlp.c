/* The dense feed-forward network of mlp.h: its GEMMs through moe__gemm_run, the activation over fixed
 * chunks of rows so that the bits do not depend on the thread count. */
#include "kernels/mlp.h"

#include "internal.h"
#include "kernels/act.h"
#include "kernels/gemm.h"

#define ACT_ROWS 16 /* rows per activation work item */

static int glu(const moe__mlp *m) { return m->act == MOE_ACT_SWIGLU; }

/* The first float of activation chunk c (rows of H floats). */
static size_t chunk_start(int c, int H) { return (size_t)c * ACT_ROWS * H; }

size_t moe__mlp_act_floats(const moe__mlp *m, int N) { return (size_t)N * m->H * (glu(m) ? 3 : 2); }

moe__mlp_acts moe__mlp_acts_at(const moe__mlp *m, int N, float *buf) {
  size_t n = (size_t)N * m->H;
  return (moe__mlp_acts){buf, glu(m) ? buf + 2 * n : NULL, buf + n};
}

moe_status moe__mlp_forward(const moe__mlp *m, int N, const float *x, moe__mlp_acts *a, float beta, float *y,
                            int threads) {
  int D = m->D, H = m->H;
  moe__gemm up[2] = {
      {false, true, N, H, D, 1.0f, 0.0f, x, D, m->w1, D, a->a1, H, false}, /* a1 = x W1^T */
      {false, true, N, H, D, 1.0f, 0.0f, x, D, m->w3, D, a->a3, H, false}, /* a3 = x W3^T */
  };
  MOE_CHECK(moe__gemm_run(up, glu(m) ? 2 : 1, threads));
  int chunks = (N + ACT_ROWS - 1) / ACT_ROWS;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int c = 0; c < chunks; c++) {
    size_t r0 = chunk_start(c, H), n = (c + 1 < chunks ? chunk_start(c + 1, H) : (size_t)N * H) - r0;
    moe__act_forward(m->act, a->a1 + r0, a->a3 ? a->a3 + r0 : NULL, a->h + r0, n);
  }
  moe__gemm down = {false, true, N, D, H, 1.0f, beta, a->h, H, m->w2, H, y, D, false}; /* y = h W2^T */
  return moe__gemm_run(&down, 1, threads);
}

moe_status moe__mlp_backward(const moe__mlp *m, const moe__mlp *g, int N, const float *x, moe__mlp_acts *a,
                             const float *dy, float *dx, int threads) {
  int D = m->D, H = m->H;
  moe__gemm w2 = {true, false, D, H, N, 1.0f, 1.0f, dy, D, a->h, H, g->w2, H, false}; /* dW2 += dy^T h */
  MOE_CHECK(moe__gemm_run(&w2, 1, threads));
  moe__gemm dh = {false, false, N, H, D, 1.0f, 0.0f, dy, D, m->w2, H, a->h, H, false}; /* dh = dy W2 */
  MOE_CHECK(moe__gemm_run(&dh, 1, threads));
  int chunks = (N + ACT_ROWS - 1) / ACT_ROWS;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int c = 0; c < chunks; c++) { /* h becomes da1, a3 da3 */
    size_t r0 = chunk_start(c, H), n = (c + 1 < chunks ? chunk_start(c + 1, H) : (size_t)N * H) - r0;
    moe__act_backward(m->act, a->a1 + r0, a->a3 ? a->a3 + r0 : NULL, a->h + r0, n);
  }
  moe__gemm wg[2] = {
      {true, false, H, D, N, 1.0f, 1.0f, a->h, H, x, D, g->w1, D, false},  /* dW1 += da1^T x */
      {true, false, H, D, N, 1.0f, 1.0f, a->a3, H, x, D, g->w3, D, false}, /* dW3 += da3^T x */
  };
  MOE_CHECK(moe__gemm_run(wg, glu(m) ? 2 : 1, threads));
  moe__gemm d1 = {false, false, N, D, H, 1.0f, 1.0f, a->h, H, m->w1, D, dx, D, false}; /* dx += da1 W1 */
  MOE_CHECK(moe__gemm_run(&d1, 1, threads));
  if (!glu(m)) return MOE_OK;
  moe__gemm d3 = {false, false, N, D, H, 1.0f, 1.0f, a->a3, H, m->w3, D, dx, D, false}; /* dx += da3 W3 */
  return moe__gemm_run(&d3, 1, threads);
}
