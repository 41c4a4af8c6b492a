/* What the quantized dot products' AVX2 versions share (quant_dot.c, quant_dot_k.c; the AVX-512 ones in
 * quant_dot_avx512.c use them too): the target attribute, the inlining per row count, f16 and 32-value
 * block scales through F16C, the sum of two 8-lane vectors' lanes, and Q4_K's scales and mins.
 * Defines HAVE_X86 where they exist. */
#ifndef MOE_QUANT_AVX2_H
#define MOE_QUANT_AVX2_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/quant.h"
#define HAVE_X86 1
#define AVX2 __attribute__((target("avx2,f16c")))

/* The vector kernels are inlined into each public function once per row count (MOE__QDOT_BY_ROWS), so
 * that nr is a constant there and each row's lanes stay in registers (a runtime nr kept them in
 * memory: a store and a reload on every block's add). */
#define MOE__QDOT_INLINE static inline __attribute__((always_inline))
#define MOE__QDOT_BY_ROWS(nr, f, ...) \
  switch (nr) {                       \
    case 1: f(__VA_ARGS__, 1); break; \
    case 2: f(__VA_ARGS__, 2); break; \
    case 3: f(__VA_ARGS__, 3); break; \
    case 4: f(__VA_ARGS__, 4); break; \
    case 5: f(__VA_ARGS__, 5); break; \
    case 6: f(__VA_ARGS__, 6); break; \
    case 7: f(__VA_ARGS__, 7); break; \
    default: f(__VA_ARGS__, 8); break; \
  }

/* The f16 at p by F16C: exactly moe__half's value (a NaN may keep its payload). */
AVX2 static inline float moe__half_avx(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

/* A 32-value block's scale: MXFP4's E8M0 (halved, as its values are doubled), else the f16 d. */
AVX2 static inline float moe__b32_scale_avx(int kind, const uint8_t *x) {
  return kind == MOE__B32_MXFP4 ? moe__e8m0_half(x[0]) : moe__half_avx(x);
}

/* Each row's sixteen lanes, held as two 8-lane vectors (lanes 0-7, 8-15), summed into out by
 * moe__lanes16_sum. */
AVX2 MOE__QDOT_INLINE void moe__lanes16_out(__m256 acc[][2], int nr, float *out) {
  #pragma GCC unroll 8
  for (int r = 0; r < nr; r++) {
    float l[16];
    _mm256_storeu_ps(l, acc[r][0]);
    _mm256_storeu_ps(l + 8, acc[r][1]);
    out[r] = moe__lanes16_sum(l);
  }
}

/* The AVX-512 versions' (quant_dot_avx512.c, quant_dot_float.c): a vector's high 256 bits (AVX-512 F
 * alone: no DQ needed), and each row's sixteen lanes in one vector summed into out by
 * moe__lanes16_sum's halvings. */
#define MOE__AVX512F __attribute__((target("avx512f,avx2,f16c,fma")))
MOE__AVX512F static inline __m256 moe__high512(__m512 v) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}
MOE__AVX512F MOE__QDOT_INLINE void moe__lanes16_out512(const __m512 *acc, int nr, float *out) {
  #pragma GCC unroll 8
  for (int r = 0; r < nr; r++) {
    __m256 s = _mm256_add_ps(_mm512_castps512_ps256(acc[r]), moe__high512(acc[r]));
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    out[r] = _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
  }
}

/* Four rows' sixteen lanes (a run's: quant.h) summed at once by the same halvings, row j's into out[j]
 * for j < k: rows 0 and 1 (2 and 3) side by side in one vector for the first, all four for the rest. */
MOE__AVX512F MOE__QDOT_INLINE void moe__lanes16_out4_512(const __m512 acc[4], int k, float *out) {
  __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(acc[0], acc[1], _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm512_shuffle_f32x4(acc[0], acc[1], _MM_SHUFFLE(3, 2, 3, 2)));
  __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2], acc[3], _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm512_shuffle_f32x4(acc[2], acc[3], _MM_SHUFFLE(3, 2, 3, 2)));
  __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1))); /* each row's four in a 128-bit part */
  __m512 u = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(1, 0, 3, 2)));
  __m512 v = _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(2, 3, 0, 1)));
  __m128 r = _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v));
  if (k == 4) {
    _mm_storeu_ps(out, r);
  } else {
    float o[4];
    _mm_storeu_ps(o, r);
    memcpy(out, o, (size_t)k * 4);
  }
}

/* A Q4_K / Q5_K block b's eight scales (bytes 0-7) and mins (8-15), unpacked in registers as
 * moe__k4_scales does (through memory, byte stores reloaded wider would stall); and its mins each twice
 * as int16 lanes, against which the activations' 16 sums give by madd min_j (s_2j + s_2j+1) in lane j:
 * moe__k4_msum8. */
AVX2 static inline __m128i moe__k4_scales_v(const uint8_t *b) {
  /* the block's first 16 bytes: d, dmin, then dwords a (bytes 4-7), m (8-11), c (12-15) of moe__k4_scales */
  __m128i v = _mm_loadu_si128((const __m128i *)b);
  __m128i acmc = _mm_shuffle_epi8(v, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
  __m128i aamm = _mm_shuffle_epi8(v, _mm_setr_epi8(4, 5, 6, 7, 4, 5, 6, 7, 8, 9, 10, 11, 8, 9, 10, 11));
  __m128i low = _mm_and_si128(_mm_srlv_epi32(acmc, _mm_setr_epi32(0, 0, 0, 4)),
                              _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
  __m128i top = _mm_and_si128(_mm_srli_epi32(aamm, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030)); /* bits 6-7 to 4-5 */
  return _mm_or_si128(low, top);
}
AVX2 static inline __m256i moe__k4_mins(__m128i scales_mins) {
  const __m128i dup = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
  return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(scales_mins, dup));
}
AVX2 static inline __m256i moe__k4_msum8(const moe__q8k *y, __m256i mins) {
  return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->sums), mins);
}
#endif

#endif
