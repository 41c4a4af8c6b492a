/* Dot products of quantized rows (activations quantized per block as the weight type needs): Q8_0 x
 * Q8_0, scalar and AVX2, the latter compiled for AVX2 whatever the build's flags and taken only when
 * the CPU has it. Both sum each block's integer products exactly and add the blocks' scaled sums in
 * the same order, so they give the same bits. */
#include <string.h>

#include "kernels/quant.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86 1
#endif

#define Q8_BYTES 34 /* f16 scale, then 32 int8 values */

static float scale_of(const uint8_t *b) { return moe__f16_to_f32((uint16_t)(b[0] | b[1] << 8)); }

float moe__dot_q8_0_scalar(const void *a, const void *b, int64_t n) {
  const uint8_t *x = a, *y = b;
  float sum = 0;
  for (int64_t i = 0; i < n / 32; i++, x += Q8_BYTES, y += Q8_BYTES) {
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += (int32_t)(int8_t)x[2 + j] * (int8_t)y[2 + j];
    sum += (float)s * (scale_of(x) * scale_of(y));
  }
  return sum;
}

#ifdef HAVE_X86
__attribute__((target("avx2"))) float moe__dot_q8_0_avx2(const void *a, const void *b, int64_t n) {
  const uint8_t *x = a, *y = b;
  float sum = 0;
  for (int64_t i = 0; i < n / 32; i++, x += Q8_BYTES, y += Q8_BYTES) {
    /* widened to int16, madd's pair sums (at most 2 * 128 * 128) are exact in int32 for any bytes */
    __m256i x0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x + 2)));
    __m256i x1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x + 18)));
    __m256i y0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(y + 2)));
    __m256i y1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(y + 18)));
    __m256i p32 = _mm256_add_epi32(_mm256_madd_epi16(x0, y0), _mm256_madd_epi16(x1, y1));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(p32), _mm256_extracti128_si256(p32, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    sum += (float)_mm_cvtsi128_si32(s4) * (scale_of(x) * scale_of(y));
  }
  return sum;
}

int moe__dot_q8_0_has_avx2(void) { return __builtin_cpu_supports("avx2"); }
#else
float moe__dot_q8_0_avx2(const void *a, const void *b, int64_t n) {
  (void)a, (void)b, (void)n;
  return 0;
}

int moe__dot_q8_0_has_avx2(void) { return 0; }
#endif

float moe__dot_q8_0(const void *a, const void *b, int64_t n) {
  static int avx2 = -1; /* decided once; a race writes the same value */
  if (avx2 < 0) avx2 = moe__dot_q8_0_has_avx2();
  return avx2 ? moe__dot_q8_0_avx2(a, b, n) : moe__dot_q8_0_scalar(a, b, n);
}
