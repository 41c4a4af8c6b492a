/* Dot products of 16-bit float weight rows (BF16, F16) with fp32 activations, in the order quant.h
 * gives them (value i into lane i % 16 by a fused multiply-add, the row padded with zeros to whole
 * sixteens, the lanes summed by moe__lanes16_sum): a scalar, an AVX2 (with FMA and F16C) and an AVX-512
 * version with the same bits, handed out by moe__qdot_kernel. The weights are widened exactly (BF16 by
 * a shift, F16 by F16C or moe__half) and the activations stay fp32, so a decode step reads two bytes a
 * weight where the widened model read four, and computes what the fp32 model of the same weights does
 * up to the summation order. */
#include <math.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/quant_avx2.h"

static inline float bf16_value(const uint16_t *w, int64_t i) {
  uint32_t u = (uint32_t)w[i] << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline float f16_value(const uint16_t *w, int64_t i) { return moe__half(w[i]); }

/* ---------------------------------------------------------------- scalar */

static void float_scalar(int f16, const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  for (int r = 0; r < nr; r++) {
    const float *x = (const float *)((const uint8_t *)a + r * astride);
    float lane[16] = {0};
    int64_t i = 0;
    for (; i < n; i++) {
      float v = f16 ? f16_value(w, i) : bf16_value(w, i);
      lane[i % 16] = fmaf(v, x[i], lane[i % 16]);
    }
    for (; i % 16; i++) lane[i % 16] = fmaf(0.0f, 0.0f, lane[i % 16]); /* the padding: -0 lanes become +0 */
    out[r] = moe__lanes16_sum(lane);
  }
}

void moe__qdot_bf16_scalar(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  float_scalar(0, w, a, astride, nr, n, out);
}
void moe__qdot_f16_scalar(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  float_scalar(1, w, a, astride, nr, n, out);
}

#ifdef HAVE_X86
/* ---------------------------------------------------------------- AVX2: two 8-lane vectors a row */

#define AVX2_FMA __attribute__((target("avx2,f16c,fma")))

AVX2_FMA static inline __m256 widen8(int f16, const uint16_t *p) {
  __m128i h = _mm_loadu_si128((const __m128i *)p);
  return f16 ? _mm256_cvtph_ps(h) : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Sixteen values (weights w, activations at a + i * 4 of each row) into the rows' lanes. */
AVX2_FMA MOE__QDOT_INLINE void sixteen_avx2(int f16, const uint16_t *w, const uint8_t *a, size_t astride, __m256 acc[][2],
                                            int nr) {
  __m256 lo = widen8(f16, w), hi = widen8(f16, w + 8);
  #pragma GCC unroll 8
  for (int r = 0; r < nr; r++) {
    const float *x = (const float *)(a + r * astride);
    acc[r][0] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x), acc[r][0]);
    acc[r][1] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + 8), acc[r][1]);
  }
}

AVX2_FMA MOE__QDOT_INLINE void float_avx2(int f16, const void *w, const void *a, size_t astride, int64_t n, float *out,
                                          int nr) {
  __m256 acc[MOE__QDOT_ROWS][2];
  #pragma GCC unroll 8
  for (int r = 0; r < nr; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const uint16_t *wv = w;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) sixteen_avx2(f16, wv + i, (const uint8_t *)a + 4 * i, astride, acc, nr);
  if (i < n) { /* the last values and the zeros after them, copied */
    uint16_t wt[16] = {0};
    float xt[MOE__QDOT_ROWS][16] = {{0}};
    memcpy(wt, wv + i, (size_t)(n - i) * 2);
    for (int r = 0; r < nr; r++) memcpy(xt[r], (const uint8_t *)a + r * astride + 4 * i, (size_t)(n - i) * 4);
    sixteen_avx2(f16, wt, (const uint8_t *)xt, sizeof xt[0], acc, nr);
  }
  moe__lanes16_out(acc, nr, out);
}

AVX2_FMA void moe__qdot_bf16_avx2(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  MOE__QDOT_BY_ROWS(nr, float_avx2, 0, w, a, astride, n, out)
}
AVX2_FMA void moe__qdot_f16_avx2(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  MOE__QDOT_BY_ROWS(nr, float_avx2, 1, w, a, astride, n, out)
}

/* ---------------------------------------------------------------- AVX-512: one vector a row */

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c,fma")))

/* Sixteen weights (fewer where m masks the rest: zeros) widened exactly. */
AVX512 static inline __m512 widen16(int f16, __mmask16 m, const uint16_t *w) {
  __m256i h = m == 0xffff ? _mm256_loadu_si256((const __m256i *)w) : _mm256_maskz_loadu_epi16(m, w);
  return f16 ? _mm512_cvtph_ps(h) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Sixteen values (fewer where m masks the rest: zeros) into the rows' lanes. */
AVX512 MOE__QDOT_INLINE void sixteen_avx512(int f16, __mmask16 m, const uint16_t *w, const uint8_t *a, size_t astride,
                                            __m512 *acc, int nr) {
  __m512 v = widen16(f16, m, w);
  #pragma GCC unroll 8
  for (int r = 0; r < nr; r++) {
    const float *x = (const float *)(a + r * astride);
    acc[r] = _mm512_fmadd_ps(v, m == 0xffff ? _mm512_loadu_ps(x) : _mm512_maskz_loadu_ps(m, x), acc[r]);
  }
}

AVX512 MOE__QDOT_INLINE void float_acc512(int f16, const void *w, const void *a, size_t astride, int64_t n, __m512 *acc,
                                          int nr) {
  #pragma GCC unroll 8
  for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
  const uint16_t *wv = w;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) sixteen_avx512(f16, 0xffff, wv + i, (const uint8_t *)a + 4 * i, astride, acc, nr);
  if (i < n) sixteen_avx512(f16, (__mmask16)((1u << (n - i)) - 1), wv + i, (const uint8_t *)a + 4 * i, astride, acc, nr);
}

AVX512 MOE__QDOT_INLINE void float_avx512(int f16, const void *w, const void *a, size_t astride, int64_t n, float *out,
                                          int nr) {
  __m512 acc[MOE__QDOT_ROWS];
  float_acc512(f16, w, a, astride, n, acc, nr);
  moe__lanes16_out512(acc, nr, out);
}

/* A decode's run of rows (quant.h's moe__qrun_fn): each row's lanes as float_avx512 makes them, in row
 * order, through one copy of the row's code (quant_dot_avx512.c's run512 says why). */
AVX512 MOE__QDOT_INLINE void float_run512(int f16, const void *w, size_t wb, int k, const void *a, int64_t n, float *out) {
  __m512 acc[MOE__QRUN_ROWS];
  #pragma GCC unroll 1
  for (int j = 0; j < MOE__QRUN_ROWS; j++) {
    acc[j] = _mm512_setzero_ps();
    if (j < k) float_acc512(f16, (const uint8_t *)w + (size_t)j * wb, a, 0, n, &acc[j], 1);
  }
  moe__lanes16_out4_512(acc, k, out);
}
AVX512 void moe__qrun_bf16_avx512(const void *w, size_t wb, int k, const void *a, int64_t n, float *out) {
  float_run512(0, w, wb, k, a, n, out);
}
AVX512 void moe__qrun_f16_avx512(const void *w, size_t wb, int k, const void *a, int64_t n, float *out) {
  float_run512(1, w, wb, k, a, n, out);
}

/* Four weight rows (wb bytes apart) against nr activation rows: each activation load serves four
 * weight rows, so that a prefill's activations (too many for L1) are read a quarter as often as by
 * the one-row kernel; every output is still its own lanes' chain, the one-row kernel's bits. */
AVX512 MOE__QDOT_INLINE void sixteen4_avx512(int f16, __mmask16 m, const void *w, size_t wb, const void *a,
                                             size_t astride, int64_t i, __m512 acc[][4], int nr) {
  __m512 x[4];
  #pragma GCC unroll 4
  for (int r = 0; r < nr; r++) {
    const float *p = (const float *)((const uint8_t *)a + r * astride) + i;
    x[r] = m == 0xffff ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
    __asm__("" : "+v"(x[r])); /* held in a register: the compiler would fold a load into each of its four FMAs */
  }
  #pragma GCC unroll 4
  for (int j = 0; j < 4; j++) {
    __m512 v = widen16(f16, m, (const uint16_t *)((const uint8_t *)w + j * wb) + i);
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) acc[j][r] = _mm512_fmadd_ps(v, x[r], acc[j][r]);
  }
}

AVX512 MOE__QDOT_INLINE void float4_avx512(int f16, const void *w, size_t wb, const void *a, size_t astride, int64_t n,
                                           float *out, int nr) {
  __m512 acc[4][4];
  #pragma GCC unroll 4
  for (int j = 0; j < 4; j++)
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) acc[j][r] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) sixteen4_avx512(f16, 0xffff, w, wb, a, astride, i, acc, nr);
  if (i < n) sixteen4_avx512(f16, (__mmask16)((1u << (n - i)) - 1), w, wb, a, astride, i, acc, nr);
  #pragma GCC unroll 4
  for (int j = 0; j < 4; j++) moe__lanes16_out512(acc[j], nr, out + j * MOE__QDOT4_ROWS);
}

#define FLOAT4_BY_ROWS(f16)                                                        \
  switch (nr) {                                                                    \
    case 1: float4_avx512(f16, w, wb, a, astride, n, out, 1); break;               \
    case 2: float4_avx512(f16, w, wb, a, astride, n, out, 2); break;               \
    case 3: float4_avx512(f16, w, wb, a, astride, n, out, 3); break;               \
    default: float4_avx512(f16, w, wb, a, astride, n, out, 4); break;              \
  }
AVX512 void moe__qdot4_bf16_avx512(const void *w, size_t wb, const void *a, size_t astride, int nr, int64_t n, float *out) {
  FLOAT4_BY_ROWS(0)
}
AVX512 void moe__qdot4_f16_avx512(const void *w, size_t wb, const void *a, size_t astride, int nr, int64_t n, float *out) {
  FLOAT4_BY_ROWS(1)
}

AVX512 void moe__qdot_bf16_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  MOE__QDOT_BY_ROWS(nr, float_avx512, 0, w, a, astride, n, out)
}
AVX512 void moe__qdot_f16_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  MOE__QDOT_BY_ROWS(nr, float_avx512, 1, w, a, astride, n, out)
}
#endif
