/* What the quantized dot products' AVX2 versions share (quant_dot.c, quant_dot_k.c; the AVX-512 ones in
 * quant_dot_avx512.c use them too): the target attribute, an f16 scale through F16C, a horizontal sum,
 * and Q4_K's mins. Defines HAVE_X86 where they exist. */
#ifndef MOE_QUANT_AVX2_H
#define MOE_QUANT_AVX2_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/quant.h"
#define HAVE_X86 1
#define AVX2 __attribute__((target("avx2,f16c")))

/* The f16 at p by F16C: exactly moe__half's value (a NaN may keep its payload). */
AVX2 static inline float moe__half_avx(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

AVX2 static inline int32_t moe__hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

/* A Q4_K / Q5_K block b's scales into sc, and its mins each twice as int16 lanes, against which the
 * activations' 16 sums give by madd min_j (s_2j + s_2j+1): moe__k4_msum. */
AVX2 static inline __m256i moe__k4_mins(const uint8_t *b, uint8_t sc[8]) {
  uint8_t mn[8];
  moe__k4_scales(b + 4, sc, mn);
  const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)mn), dup));
}
AVX2 static inline int32_t moe__k4_msum(const moe__q8k *y, __m256i mins) {
  return moe__hsum_i32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->sums), mins));
}
#endif

#endif
