/* The K-quants' dot products with Q8_K activations (moe__q8k), scalar and AVX2, in the summation order
 * quant.h gives. Block layouts (ggml's, see quant.c's codecs):
 *   Q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of eight 6-bit scales and mins, qs[128]: bytes
 *        qs[32c, 32c + 32) hold sub-block 2c (of 32 values) in their low nibbles, 2c + 1 in the high;
 *        value = d * scale_j * q - dmin * min_j.
 *   Q5_K (176 bytes): Q4_K's with qh[32] before qs: the fifth bit of value l of sub-block j is bit j
 *        of qh[l].
 *   Q6_K (210 bytes): ql[128], qh[64], sixteen int8 scales, f16 d; value e: half h = e / 128, quarter
 *        k = (e % 128) / 32, lane l = e % 32: low 4 bits in nibble k / 2 of ql[64h + 32(k % 2) + l],
 *        top 2 at bit 2k of qh[32h + l]; value = d * scale_(e/16) * (q - 32).
 * Each version sums quant.h's sixteen int32 lanes exactly (the AVX-512 vectors' lanes: the scalar and
 * AVX2 versions make the same ones), then takes the float steps on them. */
#include <string.h>

#include "kernels/quant.h"

#include "kernels/quant_avx2.h"

#define Q4K_BYTES 144
#define Q5K_BYTES 176
#define Q6K_BYTES 210

static inline float f16_at(const uint8_t *p) { return moe__half((uint16_t)(p[0] | p[1] << 8)); }

/* quant.h's float steps on the sixteen lanes L: L[l] += d * (float)v[l] (or -=) for l < n. */
static inline void lanes_add(float L[16], float d, const int32_t *v, int n) {
  for (int l = 0; l < n; l++) {
    float t = d * (float)v[l];
    L[l] += t;
  }
}
static inline void lanes_sub(float L[16], float d, const int32_t *v, int n) {
  for (int l = 0; l < n; l++) {
    float t = d * (float)v[l];
    L[l] -= t;
  }
}

/* ---------------------------------------------------------------- scalar */

/* Q4_K (qh_at 0) and Q5_K (qh_at 16: its fifth bits, bit j of qh[l] for value l of sub-block j), in
 * quant.h's lanes: lane 8h + g sums scale_j times the products of group g (values 4g..4g + 3) of
 * sub-blocks j = 2c + h, c = 0..3; lane j < 8 also takes min_j times the activations' sum over
 * sub-block j (two of a's sums of 16). */
static void k4_scalar(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out, size_t bytes,
                      int qh_at) {
  int qs_at = qh_at ? 48 : 16;
  for (int r = 0; r < nr; r++) {
    const uint8_t *b = w;
    const moe__q8k *y = (const moe__q8k *)((const char *)a + r * astride);
    float L[16] = {0};
    for (int64_t i = 0; i < n / 256; i++, b += bytes, y++) {
      uint8_t sc[8], mn[8];
      moe__k4_scales(b + 4, sc, mn);
      int32_t lane[16] = {0}, ms[8];
      for (int j = 0; j < 8; j++) {
        const uint8_t *q = b + qs_at + 32 * (j / 2), *qh = b + qh_at;
        for (int l = 0; l < 32; l++) {
          int v = (q[l] >> (4 * (j & 1))) & 15;
          if (qh_at) v |= ((qh[l] >> j) & 1) << 4;
          lane[8 * (j & 1) + l / 4] += sc[j] * v * y->q[32 * j + l];
        }
        ms[j] = mn[j] * (y->sums[2 * j] + y->sums[2 * j + 1]);
      }
      lanes_add(L, f16_at(b) * y->d, lane, 16);
      lanes_sub(L, f16_at(b + 2) * y->d, ms, 8);
    }
    out[r] = moe__lanes16_sum(L);
  }
}

void moe__qdot_q4_K_scalar(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  k4_scalar(w, a, astride, nr, n, out, Q4K_BYTES, 0);
}

void moe__qdot_q5_K_scalar(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  k4_scalar(w, a, astride, nr, n, out, Q5K_BYTES, 16);
}

/* Q6_K in quant.h's lanes: lane g sums, over t = 0..3, scale_(4t + g / 4) times the products of values
 * 64t + 4g .. 64t + 4g + 3; lane j < 8 also takes -32 (scale_2j sum_2j + scale_2j+1 sum_2j+1), the
 * values' offset against the activations' sums of 16. */
void moe__qdot_q6_K_scalar(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  for (int r = 0; r < nr; r++) {
    const uint8_t *b = w;
    const moe__q8k *y = (const moe__q8k *)((const char *)a + r * astride);
    float L[16] = {0};
    for (int64_t i = 0; i < n / 256; i++, b += Q6K_BYTES, y++) {
      const uint8_t *ql = b, *qh = b + 128;
      const int8_t *sc = (const int8_t *)(b + 192);
      int32_t lane[16] = {0};
      for (int j = 0; j < 8; j++) lane[j] = -32 * (sc[2 * j] * y->sums[2 * j] + sc[2 * j + 1] * y->sums[2 * j + 1]);
      for (int e = 0; e < 256; e++) {
        int h = e / 128, k = (e % 128) / 32, l = e % 32;
        int q = ((ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15) | ((qh[32 * h + l] >> (2 * k)) & 3) << 4;
        lane[(e % 64) / 4] += sc[e / 16] * q * y->q[e];
      }
      lanes_add(L, f16_at(b + 208) * y->d, lane, 16);
    }
    out[r] = moe__lanes16_sum(L);
  }
}

/* ---------------------------------------------------------------- AVX2 */

#ifdef HAVE_X86

/* Q4_K (qh_at 0) and Q5_K (qh_at 16), per pair of sub-blocks: the 4-bit values (with Q5_K's fifth bit:
 * 0..31) times the activations by maddubs (pair sums at most 7874, no saturation), then times the
 * sub-block's scale (<= 63) by madd into int32. */
AVX2 MOE__QDOT_INLINE void k4_avx2(const void *w, const void *a, size_t astride, int64_t n, float *out, size_t bytes,
                                  int qh_at, int nr) {
  __m256 acc[MOE__QDOT_ROWS][2];
  #pragma GCC unroll 8
  for (int r = 0; r < nr; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const __m256i lo4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
  const uint8_t *b = w;
  int qs_at = qh_at ? 48 : 16;
  for (int64_t i = 0; i < n / 256; i++, b += bytes) {
    __m128i scv = moe__k4_scales_v(b); /* each scale broadcast by pshufb below */
    __m256i mins = moe__k4_mins(scv);
    float dw = moe__half_avx(b), dmw = moe__half_avx(b + 2);
    __m256i lo[4], hi[4], s_lo[4], s_hi[4];
    __m256i qh = qh_at ? _mm256_loadu_si256((const __m256i *)(b + qh_at)) : _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
      __m256i q = _mm256_loadu_si256((const __m256i *)(b + qs_at + 32 * c));
      lo[c] = _mm256_and_si256(q, lo4);
      hi[c] = _mm256_and_si256(_mm256_srli_epi16(q, 4), lo4);
      if (qh_at) { /* bit j of each qh byte, moved to bit 4 (16-bit shifts: the mask keeps each byte's own) */
        lo[c] = _mm256_or_si256(lo[c], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
        hi[c] = _mm256_or_si256(hi[c], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
      }
      s_lo[c] = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(scv, _mm_set1_epi8((char)(2 * c))));
      s_hi[c] = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(scv, _mm_set1_epi8((char)(2 * c + 1))));
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
      const moe__q8k *y = (const moe__q8k *)((const char *)a + r * astride) + i;
      __m256i s0 = _mm256_setzero_si256(), s1 = s0; /* lanes 0-7 (even sub-blocks), 8-15 (odd) */
      for (int c = 0; c < 4; c++) {
        __m256i y0 = _mm256_loadu_si256((const __m256i *)(y->q + 64 * c));
        __m256i y1 = _mm256_loadu_si256((const __m256i *)(y->q + 64 * c + 32));
        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_maddubs_epi16(lo[c], y0), s_lo[c]));
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(hi[c], y1), s_hi[c]));
      }
      __m256 d = _mm256_set1_ps(dw * y->d), dm = _mm256_set1_ps(dmw * y->d);
      acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_mul_ps(d, _mm256_cvtepi32_ps(s0)));
      acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_mul_ps(d, _mm256_cvtepi32_ps(s1)));
      acc[r][0] = _mm256_sub_ps(acc[r][0], _mm256_mul_ps(dm, _mm256_cvtepi32_ps(moe__k4_msum8(y, mins))));
    }
  }
  moe__lanes16_out(acc, nr, out);
}

AVX2 void moe__qdot_q4_K_avx2(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  MOE__QDOT_BY_ROWS(nr, k4_avx2, w, a, astride, n, out, Q4K_BYTES, 0)
}

AVX2 void moe__qdot_q5_K_avx2(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  MOE__QDOT_BY_ROWS(nr, k4_avx2, w, a, astride, n, out, Q5K_BYTES, 16)
}

/* Per quarter (32 values, two sub-blocks of 16): the 6-bit values (0..63) assembled from ql and qh,
 * times the activations by maddubs (pair sums at most 16002), then times the two sub-blocks' scales
 * (int8, as int16 lanes: the first 16 values' 8 pair sums take the first) by madd into int32; the
 * offset of 32 from the activations' sums by madd too (at most 32 * 2 * 128 * 2032 per lane). */
AVX2 MOE__QDOT_INLINE void q6k_avx2(const void *w, const void *a, size_t astride, int64_t n, float *out, int nr) {
  __m256 acc[MOE__QDOT_ROWS][2];
  #pragma GCC unroll 8
  for (int r = 0; r < nr; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const __m256i lo4 = _mm256_set1_epi8(15), lo2 = _mm256_set1_epi8(3);
  const uint8_t *b = w;
  for (int64_t i = 0; i < n / 256; i++, b += Q6K_BYTES) {
    float dw = moe__half_avx(b + 208);
    __m128i sc8 = _mm_loadu_si128((const __m128i *)(b + 192));
    __m256i sc16 = _mm256_cvtepi8_epi16(sc8); /* the 16 scales, against the activations' 16 sums */
    __m256i q[8], sc[8];
    for (int h = 0; h < 2; h++) {
      __m256i l0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h));
      __m256i l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
      __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
      for (int k = 0; k < 4; k++) {
        __m256i l = k % 2 ? l1 : l0;
        __m256i low = _mm256_and_si256(k / 2 ? _mm256_srli_epi16(l, 4) : l, lo4);
        __m256i top = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), lo2);
        q[4 * h + k] = _mm256_or_si256(low, _mm256_slli_epi16(top, 4));
        char j = (char)(8 * h + 2 * k); /* scales j (8 lanes) and j + 1 (8 lanes), widened */
        __m128i pick = _mm_setr_epi8(j, j, j, j, j, j, j, j, (char)(j + 1), (char)(j + 1), (char)(j + 1), (char)(j + 1),
                                     (char)(j + 1), (char)(j + 1), (char)(j + 1), (char)(j + 1));
        sc[4 * h + k] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick));
      }
    }
    for (int r = 0; r < nr; r++) {
      const moe__q8k *y = (const moe__q8k *)((const char *)a + r * astride) + i;
      /* less 32 scale_j sum_j: the values' offset, in lanes 0-7; quarter t's products in lanes 8 (t % 2) on */
      __m256i s[2] = {_mm256_sub_epi32(_mm256_setzero_si256(),
                                       _mm256_slli_epi32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->sums), sc16), 5)),
                      _mm256_setzero_si256()};
      #pragma GCC unroll 8
      for (int t = 0; t < 8; t++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(y->q + 32 * t));
        s[t % 2] = _mm256_add_epi32(s[t % 2], _mm256_madd_epi16(_mm256_maddubs_epi16(q[t], v), sc[t]));
      }
      __m256 d = _mm256_set1_ps(dw * y->d);
      for (int h = 0; h < 2; h++) acc[r][h] = _mm256_add_ps(acc[r][h], _mm256_mul_ps(d, _mm256_cvtepi32_ps(s[h])));
    }
  }
  moe__lanes16_out(acc, nr, out);
}

AVX2 void moe__qdot_q6_K_avx2(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  MOE__QDOT_BY_ROWS(nr, q6k_avx2, w, a, astride, n, out)
}
#else /* never handed out without x86-64 */
void moe__qdot_q4_K_avx2(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  moe__qdot_q4_K_scalar(w, a, astride, nr, n, out);
}
void moe__qdot_q5_K_avx2(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  moe__qdot_q5_K_scalar(w, a, astride, nr, n, out);
}
void moe__qdot_q6_K_avx2(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  moe__qdot_q6_K_scalar(w, a, astride, nr, n, out);
}
#endif
