/* What the quantized dot products' AVX2 versions share (quant_dot.c, quant_dot_k.c): the target
 * attribute, an f16 scale through F16C, and a horizontal sum. Defines HAVE_X86 where they exist. */
#ifndef MOE_QUANT_AVX2_H
#define MOE_QUANT_AVX2_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
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
#endif

#endif
