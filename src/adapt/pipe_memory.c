/* MPipeMoE's memory model (DIGEST P4 1.1, 1.6) and the pools the pipelined layer's buffers must match.
 * Eqs. 4-6 are lost to OCR in the paper; they are rebuilt from its text with the buffers per tensor
 * class as parameters, so the text's variant and the authors' code's both compute. */
#include "adapt/pipe_model.h"

const moe__reuse_bufs moe__bufs_text = {.di = 2, .m = 1, .dout = 2};
const moe__reuse_bufs moe__bufs_uniform = {.di = 2, .m = 2, .dout = 2};

double moe__mem_states(const moe__mem_shape *s) {
  return 4.0 * (s->gate_experts * s->M + s->local_experts * 2.0 * s->H * s->M);
}

double moe__mem_act(const moe__mem_shape *s) { return 4.0 * s->B * s->M + s->B * s->H; }

double moe__mem_buf(const moe__mem_shape *s) { return s->B * s->M + s->B * s->H; }

double moe__mem_buf_pipe(const moe__mem_shape *s) { return 2.0 * s->B * s->M + s->B * s->H; }

/* Buffers kept of a tensor class with k per class and n partitions: never more buffers than
 * partitions (n = 1 keeps its one), so no saving goes negative. */
static int kept(int k, int n) { return k < n ? k : n; }
/* 1 - k/n: the share of a tensor's n partitions that its kept buffers save. */
static double share_saved(int k, int n) { return 1.0 - (double)kept(k, n) / n; }

double moe__mem_saved(const moe__mem_shape *s, int n, moe__reuse_bufs k) {
  double BM = s->B * s->M;
  return BM * share_saved(k.di, n) + s->B * s->H * share_saved(k.m, n) + BM * share_saved(k.dout, n);
}

double moe__mem_phi(const moe__mem_shape *s, int n, moe__reuse_bufs k) {
  /* Eq. 5: the gradient buffers save what the activations save. */
  return 2.0 * moe__mem_saved(s, n, k) / (moe__mem_states(s) + moe__mem_act(s) + moe__mem_buf_pipe(s));
}

size_t moe__pipe_part(size_t count, int n, int i) {
  size_t q = count / (size_t)n + (count % (size_t)n != 0), start = q * (size_t)i;
  return start >= count ? 0 : (count - start < q ? count - start : q);
}

size_t moe__pipe_rows_max(const size_t *counts, int ncounts, int n) {
  size_t rows = 0;
  for (int s = 0; s < ncounts; s++) rows += moe__pipe_part(counts[s], n, 0);
  return rows;
}

/* rows x cols x elem bytes into *out, refusing overflow (naming the pool). */
static moe_status pool_bytes(size_t rows, size_t cols, size_t elem, const char *pool, size_t *out) {
  size_t e;
  MOE_TRY(!__builtin_mul_overflow(rows, cols, &e) && !__builtin_mul_overflow(e, elem, out), MOE_ERR_VALUE,
          "pipe_pools: %s pool of %zu x %zu elements of %zu bytes overflows", pool, rows, cols, elem);
  return MOE_OK;
}

moe_status moe__pipe_pools(size_t B, size_t b, size_t M, size_t H, int n, moe__reuse s, size_t elem,
                           moe__pools *out) {
  MOE_TRY(out && n >= 1 && (unsigned)s < MOE__REUSE_COUNT, MOE_ERR_ARG,
          "pipe_pools: n must be >= 1 and the strategy known (got n %d, strategy %d)", n, (int)s);
  MOE_TRY(b <= B && b >= moe__pipe_part(B, n, 0), MOE_ERR_ARG,
          "pipe_pools: %d micro-batches of at most b = %zu rows cannot hold B = %zu rows", n, b, B);
  moe__reuse_bufs k = moe__bufs_text;
  size_t di = B, m = B, dout = B;
  if (s != MOE__REUSE_NONE) { /* the kept buffers, each as large as the largest micro-batch */
    di = (size_t)kept(k.di, n) * b;
    m = (size_t)kept(k.m, n) * b;
    dout = (size_t)kept(k.dout, n) * b;
  }
  MOE_CHECK(pool_bytes(di, M, elem, "T_DI", &out->di));
  MOE_CHECK(pool_bytes(m, H, elem, "T_M", &out->m));
  return pool_bytes(dout, M, elem, "T_DO", &out->dout);
}
