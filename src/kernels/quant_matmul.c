/* Quantized weights times quantized activations (quant_matmul.h). */
#include "kernels/quant_matmul.h"

#define MAX_PARTS 8

size_t moe__qrow_bytes(moe_gguf_type t, int64_t n) {
  return (size_t)(n / moe_gguf_type_block(t)) * moe_gguf_type_block_bytes(t);
}

int moe__qmat_fits(moe_gguf_type t, int64_t n) { return moe__qdot_has(t) && n > 0 && n % moe_gguf_type_block(t) == 0; }

/* Weight rows [o, oe) against nr activation rows, four weight rows a call where the type has such a
 * kernel and there are several activation rows (a prefill: each activation load serves four weight
 * rows); for a decode's single row, runs of rows read one after another where the type has a run
 * kernel, else one row a call (four weight streams at once read 25-35% slower than one, `moe bench
 * --lm` on a BF16 file, Zen 5). */
static void tile_rows(const moe__qkern *kn, const uint8_t *w, size_t wb, int o, int oe, const uint8_t *in, size_t ab,
                      int nr, int n, float *out, int ldo, int add) {
  float t[MOE__QDOT_ROWS * MOE__QDOT4_ROWS];
  while (o < oe) {
    int run = nr == 1 && kn->run, k = run ? (oe - o < MOE__QRUN_ROWS ? oe - o : MOE__QRUN_ROWS)
                                          : kn->dot4 && nr > 1 && oe - o >= 4 ? 4 : 1;
    int step = nr == 1 ? 1 : k == 4 ? MOE__QDOT4_ROWS : 0; /* between weight rows' outputs in t */
    if (run) kn->run(w + (size_t)o * wb, wb, k, in, n, t);
    else if (k == 4) kn->dot4(w + (size_t)o * wb, wb, in, ab, nr, n, t);
    else kn->dot(w + (size_t)o * wb, in, ab, nr, n, t);
    for (int j = 0; j < k; j++, o++)
      for (int i = 0; i < nr; i++) {
        float *y = out + (size_t)i * ldo + o, v = t[j * step + i];
        *y = add ? *y + v : v;
      }
  }
}

moe__qkern moe__qkern_of(moe_gguf_type t) {
  moe__isa isa = moe__qdot_best();
  return (moe__qkern){moe__qdot_kernel(t, isa), moe__qdot4_kernel(t, isa), moe__qrun_kernel(t, isa)};
}

void moe__qrows_times(const moe__qkern *k, const uint8_t *w, size_t wb, int o0, int o1, const uint8_t *in, size_t ab,
                      int m, int n, float *out, int ldo, int add) {
  int rows = k->dot4 ? MOE__QDOT4_ROWS : MOE__QDOT_ROWS;
  for (int ob = o0; ob < o1; ob += MOE__QROWS_TILE) {
    int oe = ob + MOE__QROWS_TILE < o1 ? ob + MOE__QROWS_TILE : o1;
    for (int r = 0; r < m; r += rows) {
      int nr = m - r < rows ? m - r : rows;
      tile_rows(k, w, wb, ob, oe, in + (size_t)r * ab, ab, nr, n, out + (size_t)r * ldo, ldo, add);
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
  int I = w[0].cols;
  const uint8_t *in[MOE__ACT_FORMATS] = {scratch, (uint8_t *)scratch + act_region(MOE__ACT_Q8_0, T, I), (const uint8_t *)x};
  size_t ab[MOE__ACT_FORMATS] = {moe__act_bytes(MOE_GGUF_Q8_0, I), moe__act_bytes(MOE_GGUF_Q4_K, I), (size_t)ldx * 4};
  int need[MOE__ACT_FORMATS] = {0};
  for (int j = 0; j < nw && j < MAX_PARTS; j++) need[moe__act_format(w[j].type)] = 1;
  if (nw > MAX_PARTS) nw = MAX_PARTS; /* callers pass at most 3 */
  int first[MAX_PARTS + 1] = {0}, col0[MAX_PARTS] = {0}; /* each matrix's first tile, first output column */
  moe__qkern k[MAX_PARTS];
  for (int j = 0; j < nw; j++) {
    k[j] = moe__qkern_of(w[j].type);
    first[j + 1] = first[j] + (w[j].rows + MOE__QROWS_TILE - 1) / MOE__QROWS_TILE;
    col0[j] = j ? col0[j - 1] + w[j - 1].rows : 0;
  }
  moe__work work = moe__work_of(first[nw], nt);
#pragma omp parallel num_threads(nt)
  {
    for (int f = MOE__ACT_Q8_0; f <= MOE__ACT_Q8_K; f++) {
      if (!need[f]) continue;
#pragma omp for schedule(static)
      for (int r = 0; r < T; r++) moe__act_quantize(kActType[f], x + (size_t)r * ldx, (uint8_t *)in[f] + (size_t)r * ab[f], I);
    }
    int t0, n;
    while ((n = moe__work_take(&work, &t0)) > 0)
      for (int j = 0; j < nw; j++) { /* the run's part in each matrix */
        int a = t0 > first[j] ? t0 : first[j], b = t0 + n < first[j + 1] ? t0 + n : first[j + 1];
        if (a >= b) continue;
        int o0 = (a - first[j]) * MOE__QROWS_TILE, o1 = (b - first[j]) * MOE__QROWS_TILE;
        int f = moe__act_format(w[j].type);
        moe__qrows_times(&k[j], w[j].w, moe__qrow_bytes(w[j].type, I), o0, o1 < w[j].rows ? o1 : w[j].rows, in[f], ab[f],
                         T, I, y + col0[j], ldy, add);
      }
  }
}
