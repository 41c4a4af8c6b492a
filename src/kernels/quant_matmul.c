/* Quantized weights times quantized activations (quant_matmul.h). */
#include "kernels/quant_matmul.h"

#define MAX_PARTS 8

size_t moe__qrow_bytes(moe_gguf_type t, int64_t n) {
  return (size_t)(n / moe_gguf_type_block(t)) * moe_gguf_type_block_bytes(t);
}

int moe__qmat_fits(moe_gguf_type t, int64_t n) { return moe__qdot_has(t) && n > 0 && n % moe_gguf_type_block(t) == 0; }

void moe__qrows_times(moe__qdot_fn dot, const uint8_t *w, size_t wb, int o0, int o1, const uint8_t *in, size_t ab,
                      int m, int n, float *out, int ldo, int add) {
  float t[MOE__QDOT_ROWS];
  for (int ob = o0; ob < o1; ob += MOE__QROWS_TILE) {
    int oe = ob + MOE__QROWS_TILE < o1 ? ob + MOE__QROWS_TILE : o1;
    for (int r = 0; r < m; r += MOE__QDOT_ROWS) {
      int nr = m - r < MOE__QDOT_ROWS ? m - r : MOE__QDOT_ROWS;
      for (int o = ob; o < oe; o++) {
        dot(w + (size_t)o * wb, in + (size_t)r * ab, ab, nr, n, t);
        for (int i = 0; i < nr; i++) {
          float *y = out + (size_t)(r + i) * ldo + o;
          *y = add ? *y + t[i] : t[i];
        }
      }
    }
  }
}

/* The two activation formats (quant.h): Q8_0 blocks of 32 for the weights of 32-value blocks, Q8_K
 * rows of 256 for the K-quants; each named by a weight type that takes it. */
static moe_gguf_type act_type(moe_gguf_type t) {
  return moe_gguf_type_block(t) == 256 ? MOE_GGUF_Q4_K : MOE_GGUF_Q8_0;
}

static size_t round_up(size_t n, size_t b) { return (n + b - 1) / b * b; }

/* Scratch bytes of format f's rows of I values, and where they start. */
static size_t act_region(moe_gguf_type f, int T, int I) {
  return (size_t)T * moe__act_bytes(f, (int64_t)round_up((size_t)I, (size_t)moe_gguf_type_block(f)));
}

size_t moe__qmatmul_scratch(int T, int I) {
  return act_region(MOE_GGUF_Q8_0, T, I) + act_region(MOE_GGUF_Q4_K, T, I);
}

void moe__qmatmul(const moe__qmat *w, int nw, const float *x, int T, int ldx, float *y, int ldy, int add,
                  void *scratch, int nt) {
  if (nw <= 0 || T <= 0) return;
  int I = w[0].cols, total = 0;
  uint8_t *buf[2] = {scratch, (uint8_t *)scratch + act_region(MOE_GGUF_Q8_0, T, I)};
  int need[2] = {0, 0};
  for (int j = 0; j < nw && j < MAX_PARTS; j++) {
    need[act_type(w[j].type) == MOE_GGUF_Q4_K] = 1;
    total += w[j].rows;
  }
  if (nw > MAX_PARTS) nw = MAX_PARTS; /* callers pass at most 3 */
  /* spans of whole MOE__QROWS_TILE-row tiles: enough items for every thread to take a few */
  int span = (total + MOE__QITEMS_PER_THREAD * nt - 1) / (MOE__QITEMS_PER_THREAD * nt);
  span = span < MOE__QROWS_TILE ? MOE__QROWS_TILE : (int)round_up((size_t)span, MOE__QROWS_TILE);
  int first[MAX_PARTS + 1] = {0}, col0[MAX_PARTS] = {0};
  for (int j = 0; j < nw; j++) {
    first[j + 1] = first[j] + (w[j].rows + span - 1) / span;
    col0[j] = j ? col0[j - 1] + w[j - 1].rows : 0;
  }
  int items = first[nw];
#pragma omp parallel num_threads(nt)
  {
    for (int f = 0; f < 2; f++) {
      if (!need[f]) continue;
      moe_gguf_type ft = f ? MOE_GGUF_Q4_K : MOE_GGUF_Q8_0;
      size_t ab = moe__act_bytes(ft, I);
#pragma omp for schedule(static)
      for (int r = 0; r < T; r++) moe__act_quantize(ft, x + (size_t)r * ldx, buf[f] + (size_t)r * ab, I);
    }
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < items; i++) {
      int j = 0;
      while (i >= first[j + 1]) j++;
      moe_gguf_type ft = act_type(w[j].type);
      int o0 = (i - first[j]) * span, o1 = o0 + span < w[j].rows ? o0 + span : w[j].rows;
      moe__qrows_times(moe__qdot_kernel(w[j].type, moe__qdot_best()), w[j].w, moe__qrow_bytes(w[j].type, I), o0, o1,
                       buf[ft == MOE_GGUF_Q4_K], moe__act_bytes(ft, I), T, I, y + col0[j], ldy, add);
    }
  }
}
