/* The quantized dot products' AVX-512 versions (F, BW, VL and VNNI), in the summation order quant.h
 * gives, so with the scalar versions' bits. Compiled for AVX-512 whatever the build's flags and handed out
 * by moe__qdot_kernel only when the CPU has it (CPUID there).
 *   Q8_0, Q4_0, MXFP4: two 32-value blocks a 512-bit vector; the weights' values v (int8) against the
 *     activations made unsigned (a + 128, by xor) with vpdpbusd, less 128 * the sum of v (made once per
 *     weight block, by vpdpbusd too): exact for any bytes on both sides, -128 included. Eight blocks'
 *     sums reduced together, their eight (float)isum * (dw * da) side by side, added in block order.
 *   K-quants: 64 values a vector: the unsigned weight levels times the int8 activations by maddubs
 *     (pair sums under 2^15: 2 * 63 * 128), times the sub-blocks' scales by vpdpwssd into int32. */
#include "kernels/quant.h"
#include "kernels/quant_avx2.h"

#ifdef HAVE_X86

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c,fma")))

#define Q8_BYTES 34

/* ---------------------------------------------------------------- 32-value blocks */

enum { B_Q8_0, B_Q4_0, B_MXFP4 };

/* Blocks x and x + wb's values as int8: the first in the low 256 bits, the second in the high. */
AVX512 static inline __m512i pair_values(int kind, const uint8_t *x, size_t wb) {
  if (kind == B_Q8_0)
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(x + 2))),
                              _mm256_loadu_si256((const __m256i *)(x + wb + 2)), 1);
  int at = kind == B_MXFP4 ? 1 : 2;
  __m256i q = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(x + wb + at)), _mm_loadu_si128((const __m128i *)(x + at)));
  __m512i z = _mm512_castsi256_si512(q);
  z = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(1, 1, 0, 0)); /* 128-bit parts: first, first, second, second */
  const __m512i shift = _mm512_setr_epi64(0, 0, 0x0004000400040004, 0x0004000400040004, 0, 0, 0x0004000400040004,
                                          0x0004000400040004); /* low nibbles (values 0-15), high (16-31) */
  z = _mm512_and_si512(_mm512_srlv_epi16(z, shift), _mm512_set1_epi8(15));
  if (kind == B_MXFP4) return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)moe__fp4_x2)), z);
  return _mm512_sub_epi8(z, _mm512_set1_epi8(8));
}

AVX512 static inline float block_scale(int kind, const uint8_t *x) {
  return kind == B_MXFP4 ? moe__e8m0_half(x[0]) : moe__half_avx(x);
}

/* Two activation blocks (at y, y + 34) made unsigned: a + 128. */
AVX512 static inline __m512i pair_act(const uint8_t *y) {
  __m512i a = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(y + 2))),
                                 _mm256_loadu_si256((const __m256i *)(y + Q8_BYTES + 2)), 1);
  return _mm512_xor_si512(a, _mm512_set1_epi8((char)0x80));
}

/* -128 * the sums of each four of v's values: what the activations' + 128 adds to the products. */
AVX512 static inline __m512i offset(__m512i v) {
  __m512i z = _mm512_setzero_si512();
  return _mm512_sub_epi32(z, _mm512_dpbusd_epi32(z, _mm512_set1_epi8((char)0x80), v));
}

/* The eight f16 scales at p, p + stride, ... */
AVX512 static inline __m256 f16x8(const uint8_t *p, size_t stride) {
  uint16_t h[8];
  for (int b = 0; b < 8; b++) memcpy(&h[b], p + b * stride, 2);
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* Lanes 2i and 2i + 1 of the 32 of (a, b) added: lane i of the result. */
AVX512 static inline __m512i pair_sums(__m512i a, __m512i b) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  return _mm512_add_epi32(_mm512_permutex2var_epi32(a, even, b), _mm512_permutex2var_epi32(a, odd, b));
}

AVX512 static inline void b32_avx512(int kind, size_t wb, const void *w, const void *a, size_t astride, int nr,
                                     int64_t n, float *out) {
  float acc[MOE__QDOT_ROWS] = {0};
  const uint8_t *x = w, *y = a;
  int64_t nb = n / 32, i = 0;
  for (; i + 8 <= nb; i += 8, x += 8 * wb, y += 8 * Q8_BYTES) {
    __m512i v[4], off[4];
    for (int p = 0; p < 4; p++) v[p] = pair_values(kind, x + 2 * p * wb, wb), off[p] = offset(v[p]);
    __m256 dw = kind == B_MXFP4 ? _mm256_setr_ps(block_scale(kind, x), block_scale(kind, x + wb), block_scale(kind, x + 2 * wb),
                                                 block_scale(kind, x + 3 * wb), block_scale(kind, x + 4 * wb),
                                                 block_scale(kind, x + 5 * wb), block_scale(kind, x + 6 * wb),
                                                 block_scale(kind, x + 7 * wb))
                                : f16x8(x, wb);
    for (int r = 0; r < nr; r++) {
      const uint8_t *yr = y + r * astride;
      __m512i s[4]; /* lanes 0-7: block 2p's, 8-15: block 2p + 1's */
      for (int p = 0; p < 4; p++) s[p] = _mm512_dpbusd_epi32(off[p], pair_act(yr + 2 * p * Q8_BYTES), v[p]);
      __m512i e = pair_sums(pair_sums(s[0], s[1]), pair_sums(s[2], s[3])); /* lanes 2b, 2b + 1: block b's */
      __m256i sum = _mm512_cvtepi64_epi32(_mm512_add_epi32(e, _mm512_srli_epi64(e, 32)));
      float t[8];
      _mm256_storeu_ps(t, _mm256_mul_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dw, f16x8(yr, Q8_BYTES))));
      for (int b = 0; b < 8; b++) acc[r] += t[b];
    }
  }
  for (; i < nb; i++, x += wb, y += Q8_BYTES) { /* the last blocks one at a time */
    __m256i v = _mm512_castsi512_si256(pair_values(kind, x, 0));
    __m256i z = _mm256_setzero_si256(), off = _mm256_sub_epi32(z, _mm256_dpbusd_epi32(z, _mm256_set1_epi8((char)0x80), v));
    float dx = block_scale(kind, x);
    for (int r = 0; r < nr; r++) {
      const uint8_t *yr = y + r * astride;
      __m256i ya = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(yr + 2)), _mm256_set1_epi8((char)0x80));
      int32_t s = moe__hsum_i32(_mm256_dpbusd_epi32(off, ya, v));
      float d = dx * moe__half_avx(yr);
      float t = (float)s * d;
      acc[r] += t;
    }
  }
  for (int r = 0; r < nr; r++) out[r] = acc[r];
}

AVX512 void moe__qdot_q8_0_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  b32_avx512(B_Q8_0, 34, w, a, astride, nr, n, out);
}

AVX512 void moe__qdot_q4_0_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  b32_avx512(B_Q4_0, 18, w, a, astride, nr, n, out);
}

AVX512 void moe__qdot_mxfp4_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  b32_avx512(B_MXFP4, 17, w, a, astride, nr, n, out);
}

/* ---------------------------------------------------------------- K-quants */

/* A 256-bit x in both halves of a 512-bit vector. */
AVX512 static inline __m512i twice(const uint8_t *p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p)); }

/* 16-bit lanes: a in the low 256 bits, b in the high. */
AVX512 static inline __m512i halves16(int a, int b) {
  return _mm512_inserti64x4(_mm512_set1_epi16((short)a), _mm256_set1_epi16((short)b), 1);
}

/* Q4_K (qh_at 0) and Q5_K (qh_at 16): vector c holds sub-blocks 2c (qs chunk c's low nibbles) and 2c + 1
 * (its high ones), with Q5_K's fifth bits (bits 2c, 2c + 1 of qh) added as 16. */
AVX512 static inline void k4_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out,
                                    size_t bytes, int qh_at) {
  float acc[MOE__QDOT_ROWS] = {0};
  const __m512i lo4 = _mm512_set1_epi8(15), nib = halves16(0, 4);
  const uint8_t *b = w;
  int qs_at = qh_at ? 48 : 16;
  for (int64_t i = 0; i < n / 256; i++, b += bytes) {
    uint8_t sc[8];
    __m256i mins = moe__k4_mins(b, sc);
    float dw = moe__half_avx(b), dmw = moe__half_avx(b + 2);
    __m512i q[4], s[4];
    for (int c = 0; c < 4; c++) {
      q[c] = _mm512_and_si512(_mm512_srlv_epi16(twice(b + qs_at + 32 * c), nib), lo4);
      if (qh_at) {
        __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << 2 * c)), _mm256_set1_epi8((char)(1 << (2 * c + 1))), 1);
        q[c] = _mm512_mask_add_epi8(q[c], _mm512_test_epi8_mask(twice(b + qh_at), bit), q[c], _mm512_set1_epi8(16));
      }
      s[c] = halves16(sc[2 * c], sc[2 * c + 1]);
    }
    for (int r = 0; r < nr; r++) {
      const moe__q8k *y = (const moe__q8k *)((const char *)a + r * astride) + i;
      __m512i t = _mm512_setzero_si512();
      for (int c = 0; c < 4; c++)
        t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(q[c], _mm512_loadu_si512(y->q + 64 * c)), s[c]);
      acc[r] = moe__q4k_add(acc[r], dw, dmw, y->d, _mm512_reduce_add_epi32(t), moe__k4_msum(y, mins));
    }
  }
  for (int r = 0; r < nr; r++) out[r] = acc[r];
}

AVX512 void moe__qdot_q4_K_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  k4_avx512(w, a, astride, nr, n, out, 144, 0);
}

AVX512 void moe__qdot_q5_K_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  k4_avx512(w, a, astride, nr, n, out, 176, 16);
}

/* Q6_K: vector t holds values 64t..64t+63 (half t / 2, quarters 2 (t % 2) and 2 (t % 2) + 1): the low
 * bits are nibble t % 2 of ql[64 (t / 2) ...], 64 bytes as they lie; the top two of each quarter from
 * the same 32 qh bytes. Scales 4t..4t+3 eight 16-bit lanes each; the offset of 32 by the scales times
 * -32 against the activations' sums (vpmaddwd, at most 2 * 4096 * 2032 a lane). */
AVX512 void moe__qdot_q6_K_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  float acc[MOE__QDOT_ROWS] = {0};
  const __m512i lo4 = _mm512_set1_epi8(15), lo2 = _mm512_set1_epi8(3);
  static const int16_t eighth[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                     2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
  const __m512i eighths = _mm512_loadu_si512(eighth); /* lane l: l / 8 */
  const uint8_t *b = w;
  for (int64_t i = 0; i < n / 256; i++, b += 210) {
    float dw = moe__half_avx(b + 208);
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
    __m256i neg32 = _mm256_mullo_epi16(sc16, _mm256_set1_epi16(-32));
    __m512i q[4], s[4];
    for (int t = 0; t < 4; t++) {
      __m512i ql = _mm512_loadu_si512(b + 64 * (t / 2));
      __m512i low = _mm512_and_si512(t % 2 ? _mm512_srli_epi16(ql, 4) : ql, lo4);
      __m512i top = _mm512_and_si512(_mm512_srlv_epi16(twice(b + 128 + 32 * (t / 2)), halves16(4 * (t % 2), 4 * (t % 2) + 2)), lo2);
      q[t] = _mm512_or_si512(low, _mm512_slli_epi16(top, 4));
      s[t] = _mm512_permutexvar_epi16(_mm512_add_epi16(eighths, _mm512_set1_epi16((short)(4 * t))), _mm512_castsi256_si512(sc16));
    }
    for (int r = 0; r < nr; r++) {
      const moe__q8k *y = (const moe__q8k *)((const char *)a + r * astride) + i;
      __m512i u = _mm512_zextsi256_si512(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->sums), neg32));
      for (int t = 0; t < 4; t++)
        u = _mm512_dpwssd_epi32(u, _mm512_maddubs_epi16(q[t], _mm512_loadu_si512(y->q + 64 * t)), s[t]);
      acc[r] = moe__q6k_add(acc[r], dw, y->d, _mm512_reduce_add_epi32(u));
    }
  }
  for (int r = 0; r < nr; r++) out[r] = acc[r];
}

#endif
