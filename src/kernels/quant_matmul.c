/* Quantized weights times quantized activations (quant_matmul.h). */
#include "kernels/quant_matmul.h"

#define MAX_PARTS 8

size_t moe__qrow_bytes(moe_gguf_type t, int64_t n) {
  return (size_t)(n / moe_gguf_type_block(t)) * moe_gguf_type_block_bytes(t);
}

int moe__qmat_fits(moe_gguf_type t, int64_t n) { return moe__qdot_has(t) && n > 0 && n % moe_gguf_type_block(t) == 0; }

/* Weight rows [o, oe) against nr activation rows, four weight rows a call where the type has such a
 * kernel and there are several activation rows (a prefill: each activation load serves four weight
 * rows); one at a time for a decode's single row (four weight streams at once read 25-35% slower
 * than one, `moe bench --lm` on a BF16 file, Zen 5). */
static void tile_rows(moe__qdot_fn dot, moe__qdot4_fn dot4, const uint8_t *w, size_t wb, int o, int oe,
                      const uint8_t *in, size_t ab, int nr, int n, float *out, int ldo, int add) {
  float t[MOE__QDOT_ROWS * MOE__QDOT4_ROWS];
  while (o < oe) {
    int k = dot4 && nr > 1 && oe - o >= 4 ? 4 : 1;
    if (k == 4) dot4(w + (size_t)o * wb, wb, in, ab, nr, n, t);
    else dot(w + (size_t)o * wb, in, ab, nr, n, t);
    for (int j = 0; j < k; j++, o++)
      for (int i = 0; i < nr; i++) {
        float *y = out + (size_t)i * ldo + o, v = t[j * (k == 4 ? MOE__QDOT4_ROWS : 0) + i];
        *y = add ? *y + v : v;
      }
  }
}

moe__qkern moe__qkern_of(moe_gguf_type t) {
  moe__isa isa = moe__qdot_best();
  return (moe__qkern){moe__qdot_kernel(t, isa), moe__qdot4_kernel(t, isa)};
}

void moe__qrows_times(const moe__qkern *k, const uint8_t *w, size_t wb, int o0, int o1, const uint8_t *in, size_t ab,
                      int m, int n, float *out, int ldo, int add) {
  int rows = k->dot4 ? MOE__QDOT4_ROWS : MOE__QDOT_ROWS;
  for (int ob = o0; ob < o1; ob += MOE__QROWS_TILE) {
    int oe = ob + MOE__QROWS_TILE < o1 ? ob + MOE__QROWS_TILE : o1;
    for (int r = 0; r < m; r += rows) {
      int nr = m - r < rows ? m - r : rows;
      tile_rows(k->dot, k->dot4, w, wb, ob, oe, in + (size_t)r * ab, ab, nr, n, out + (size_t)r * ldo, ldo, add);
    }
  }
}

/* The activation formats (quant.h): Q8_0 blocks of 32 for the weights of 32-value blocks, Q8_K rows
 * of 256 for the K-quants, each named by a weight type that takes it and made into scratch; fp32 for
 * BF16 and F16 weights, read from x where it lies (moe__act_format). */
static const moe_gguf_type kActType[MOE__ACT_FORMATS] = {MOE_GGUF_Q8_0, MOE_GGUF_Q4_K, MOE_GGUF_BF16};

static size_t round_up(size_t n, size_t b) { return (n + b - 1) / b * b; }

/* Scratch bytes of format f's rows of I values. */
static size_t act_region(int f, int T, int I) {
  moe_gguf_type t = kActType[f];
  return (size_t)T * moe__act_bytes(t, (int64_t)round_up((size_t)I, (size_t)moe_gguf_type_block(t)));
}

size_t moe__qmatmul_scratch(int T, int I) { return act_region(MOE__ACT_Q8_0, T, I) + act_region(MOE__ACT_Q8_K, T, I); }

void moe__qmatmul(const moe__qmat *w, int nw, const float *x, int T, int ldx, float *y, int ldy, int add,
                  void *scratch, int nt) {
  if (nw <= 0 || T <= 0) return;
  int I = w[0].cols, total = 0;
  const uint8_t *in[MOE__ACT_FORMATS] = {scratch, (uint8_t *)scratch + act_region(MOE__ACT_Q8_0, T, I), (const uint8_t *)x};
  size_t ab[MOE__ACT_FORMATS] = {moe__act_bytes(MOE_GGUF_Q8_0, I), moe__act_bytes(MOE_GGUF_Q4_K, I), (size_t)ldx * 4};
  int need[MOE__ACT_FORMATS] = {0};
  for (int j = 0; j < nw && j < MAX_PARTS; j++) {
    need[moe__act_format(w[j].type)] = 1;
    total += w[j].rows;
  }
  if (nw > MAX_PARTS) nw = MAX_PARTS; /* callers pass at most 3 */
  /* spans of whole MOE__QROWS_TILE-row tiles: enough items for every thread to take a few */
  int span = (total + MOE__QITEMS_PER_THREAD * nt - 1) / (MOE__QITEMS_PER_THREAD * nt);
  span = span < MOE__QROWS_TILE ? MOE__QROWS_TILE : (int)round_up((size_t)span, MOE__QROWS_TILE);
  int first[MAX_PARTS + 1] = {0}, col0[MAX_PARTS] = {0};
  moe__qkern k[MAX_PARTS];
  for (int j = 0; j < nw; j++) {
    k[j] = moe__qkern_of(w[j].type);
    first[j + 1] = first[j] + (w[j].rows + span - 1) / span;
    col0[j] = j ? col0[j - 1] + w[j - 1].rows : 0;
  }
  int items = first[nw];
#pragma omp parallel num_threads(nt)
  {
    for (int f = MOE__ACT_Q8_0; f <= MOE__ACT_Q8_K; f++) {
      if (!need[f]) continue;
#pragma omp for schedule(static)
      for (int r = 0; r < T; r++) moe__act_quantize(kActType[f], x + (size_t)r * ldx, (uint8_t *)in[f] + (size_t)r * ab[f], I);
    }
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < items; i++) {
      int j = 0;
      while (i >= first[j + 1]) j++;
      int f = moe__act_format(w[j].type), o0 = (i - first[j]) * span, o1 = o0 + span < w[j].rows ? o0 + span : w[j].rows;
      moe__qrows_times(&k[j], w[j].w, moe__qrow_bytes(w[j].type, I), o0, o1, in[f], ab[f], T, I, y + col0[j], ldy, add);
    }
  }
}
