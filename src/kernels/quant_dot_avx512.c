/* The quantized dot products' AVX-512 versions (F, BW, VL and VNNI), in the summation order quant.h
 * gives, so with the scalar versions' bits. Compiled for AVX-512 whatever the build's flags and handed out
 * by moe__qdot_kernel only when the CPU has it (CPUID there).
 *   Q8_0, Q4_0, MXFP4: two 32-value blocks a 512-bit vector; the weights' values v (int8) against the
 *     activations, stored unsigned (a + 128: quant.h's layout), with vpdpbusd, less 128 * the sum of v
 *     (made once per weight block, by vpdpbusd too): exact for any bytes on both sides, -128 included. The 16 int32
 *     lanes are quant.h's sixteen groups: converted, scaled and added to a row's float lanes as they are.
 *   K-quants: 64 values a vector: the unsigned weight levels times the int8 activations by maddubs
 *     (pair sums under 2^15: 2 * 63 * 128), times the sub-blocks' scales by vpdpwssd into int32: its
 *     16 lanes are quant.h's, converted and scaled as they are. */
#include <float.h>
#include <math.h>

#include "kernels/quant.h"
#include "kernels/quant_avx2.h"

#ifdef HAVE_X86

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c,fma")))

#define Q8_BYTES 34

/* ---------------------------------------------------------------- 32-value blocks */

/* Blocks x and x + wb's values as int8: the first in the low 256 bits, the second in the high. */
AVX512 static inline __m512i pair_values(int kind, const uint8_t *x, size_t wb) {
  if (kind == MOE__B32_Q8_0)
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(x + 2))),
                              _mm256_loadu_si256((const __m256i *)(x + wb + 2)), 1);
  int at = kind == MOE__B32_MXFP4 ? 1 : 2;
  __m256i q = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(x + wb + at)), _mm_loadu_si128((const __m128i *)(x + at)));
  __m512i z = _mm512_castsi256_si512(q);
  z = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(1, 1, 0, 0)); /* 128-bit parts: first, first, second, second */
  const __m512i shift = _mm512_setr_epi64(0, 0, 0x0004000400040004, 0x0004000400040004, 0, 0, 0x0004000400040004,
                                          0x0004000400040004); /* low nibbles (values 0-15), high (16-31) */
  z = _mm512_and_si512(_mm512_srlv_epi16(z, shift), _mm512_set1_epi8(15));
  if (kind == MOE__B32_MXFP4)
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)moe__fp4_x2)), z);
  return _mm512_sub_epi8(z, _mm512_set1_epi8(8));
}

/* The f16 scales of blocks x and x + wb (wb 34 or 18: 16-bit words 0 and wb / 2 of the bytes at x,
 * read within the two blocks), each in eight lanes. */
AVX512 static inline __m512 pair_f16(const uint8_t *x, size_t wb) {
  __m512i h = wb == Q8_BYTES ? _mm512_loadu_si512(x) : _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)x));
  __m512i at = _mm512_castsi256_si512(
      _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_set1_epi16((short)(wb / 2)), 1)); /* 0 x 8, wb / 2 x 8 */
  return _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(at, h)));
}

/* Two 256-bit halves as one vector (AVX-512 F alone: no DQ needed). */
AVX512 static inline __m512 join(__m256 lo, __m256 hi) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}

AVX512 static inline __m512 pair_scales(int kind, const uint8_t *x, size_t wb) {
  if (kind != MOE__B32_MXFP4) return pair_f16(x, wb);
  return join(_mm256_set1_ps(moe__e8m0_half(x[0])), _mm256_set1_ps(moe__e8m0_half(x[wb])));
}

/* -128 * the sums of each four of v's values: what the activations' + 128 adds to the products. */
AVX512 static inline __m512i offset(__m512i v) {
  __m512i z = _mm512_setzero_si512();
  return _mm512_sub_epi32(z, _mm512_dpbusd_epi32(z, _mm512_set1_epi8((char)0x80), v));
}

/* The sixteen lanes (quant.h) a row in one vector: a pair of blocks' groups are its 16 vpdpbusd
 * lanes; a last odd block adds to lanes 0-7 only. */
AVX512 MOE__QDOT_INLINE void b32_acc512(int kind, size_t wb, const void *w, const void *a, size_t astride, int64_t n,
                                        __m512 *acc, int nr) {
  #pragma GCC unroll 8
  for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
  const uint8_t *x = w, *y = a; /* y: the pair's slot in row 0 (quant.h's activations) */
  int64_t nb = n / 32, i = 0;
  for (; i + 2 <= nb; i += 2, x += 2 * wb, y += MOE__ACT_PAIR_BYTES) {
    __m512i v = pair_values(kind, x, wb), off = offset(v);
    __m512 dw = pair_scales(kind, x, wb);
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
      const uint8_t *yr = y + r * astride;
      __m512 d = _mm512_mul_ps(dw, _mm512_loadu_ps(yr + 64));
      __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(off, _mm512_loadu_si512(yr), v)), d);
      acc[r] = _mm512_add_ps(acc[r], t);
    }
  }
  if (i < nb) {
    __m256i v = _mm512_castsi512_si256(pair_values(kind, x, 0));
    __m256i z = _mm256_setzero_si256(), off = _mm256_sub_epi32(z, _mm256_dpbusd_epi32(z, _mm256_set1_epi8((char)0x80), v));
    float dw = moe__b32_scale_avx(kind, x);
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
      const uint8_t *yr = y + r * astride;
      float da;
      memcpy(&da, yr + 64, 4);
      float d = dw * da;
      __m256i ya = _mm256_loadu_si256((const __m256i *)yr);
      __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_dpbusd_epi32(off, ya, v)), _mm256_set1_ps(d));
      acc[r] = join(_mm256_add_ps(_mm512_castps512_ps256(acc[r]), t), moe__high512(acc[r]));
    }
  }
}

AVX512 MOE__QDOT_INLINE void b32_avx512(int kind, size_t wb, const void *w, const void *a, size_t astride, int64_t n,
                                        float *out, int nr) {
  __m512 acc[MOE__QDOT_ROWS];
  b32_acc512(kind, wb, w, a, astride, n, acc, nr);
  moe__lanes16_out512(acc, nr, out);
}

AVX512 void moe__qdot_q8_0_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  MOE__QDOT_BY_ROWS(nr, b32_avx512, MOE__B32_Q8_0, 34, w, a, astride, n, out)
}

AVX512 void moe__qdot_q4_0_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  MOE__QDOT_BY_ROWS(nr, b32_avx512, MOE__B32_Q4_0, 18, w, a, astride, n, out)
}

AVX512 void moe__qdot_mxfp4_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  MOE__QDOT_BY_ROWS(nr, b32_avx512, MOE__B32_MXFP4, 17, w, a, astride, n, out)
}

/* ---------------------------------------------------------------- K-quants */

/* A 256-bit x in both halves of a 512-bit vector. */
AVX512 static inline __m512i twice(const uint8_t *p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p)); }

/* 16-bit lanes: a in the low 256 bits, b in the high. */
AVX512 static inline __m512i halves16(int a, int b) {
  return _mm512_inserti64x4(_mm512_set1_epi16((short)a), _mm256_set1_epi16((short)b), 1);
}

/* x's bytes through GFNI's affine transform by the 8 x 8 bit matrices in m (a qword each), as
 * _mm512_gf2p8affine_epi64_epi8(x, m, 0). In asm, so that no function needs the gfni target and the
 * compiler puts the instruction nowhere else: only the _gfni kernels run it, handed out where the CPU
 * has GFNI. */
AVX512 static inline __m512i gf2p8affine(__m512i x, __m512i m) {
  __m512i r;
  __asm__("vgf2p8affineqb $0, %2, %1, %0" : "=v"(r) : "v"(x), "v"(m));
  return r;
}

/* Q4_K (qh_at 0) and Q5_K (qh_at 16): vector c holds sub-blocks 2c (qs chunk c's low nibbles) and 2c + 1
 * (its high ones), with Q5_K's fifth bits (bits 2c, 2c + 1 of qh) added as 16. With gfni the nibbles
 * come out of one affine transform (the low 256 bits' matrix keeps bits 0-3, the high's moves 4-7 down)
 * in place of a masked shift and an and: the same bytes. */
AVX512 MOE__QDOT_INLINE void k4_acc512(const void *w, const void *a, size_t astride, int64_t n, __m512 *acc, size_t bytes,
                                       int qh_at, int nr, int gfni) {
  #pragma GCC unroll 8
  for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
  const __m512i lo4 = _mm512_set1_epi8(15);
  const __m512i nibbles = _mm512_set_epi64(0x1020408000000000LL, 0x1020408000000000LL, 0x1020408000000000LL,
                                           0x1020408000000000LL, 0x0102040800000000LL, 0x0102040800000000LL,
                                           0x0102040800000000LL, 0x0102040800000000LL);
  const uint8_t *b = w;
  int qs_at = qh_at ? 48 : 16;
  for (int64_t i = 0; i < n / 256; i++, b += bytes) {
    __m128i scv = moe__k4_scales_v(b);
    __m256i mins = moe__k4_mins(scv);
    __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(scv)); /* scales in 16-bit lanes 0-7 */
    float dw = moe__half_avx(b), dmw = moe__half_avx(b + 2);
    __m512i q[4], s[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
      __m512i x = twice(b + qs_at + 32 * c);
      q[c] = gfni ? gf2p8affine(x, nibbles)
                  : _mm512_and_si512(_mm512_mask_srli_epi16(x, 0xffff0000u, x, 4), lo4); /* the high half's nibbles */
      if (qh_at) {
        __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << 2 * c)), _mm256_set1_epi8((char)(1 << (2 * c + 1))), 1);
        q[c] = _mm512_mask_add_epi8(q[c], _mm512_test_epi8_mask(twice(b + qh_at), bit), q[c], _mm512_set1_epi8(16));
      }
      s[c] = _mm512_permutexvar_epi16(_mm512_add_epi16(halves16(0, 1), _mm512_set1_epi16((short)(2 * c))), sc16);
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
      const moe__q8k *y = (const moe__q8k *)((const char *)a + r * astride) + i;
      __m512i t = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int c = 0; c < 4; c++)
        t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(q[c], _mm512_loadu_si512(y->q + 64 * c)), s[c]);
      acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_set1_ps(dw * y->d), _mm512_cvtepi32_ps(t)));
      __m256 u = _mm256_mul_ps(_mm256_set1_ps(dmw * y->d), _mm256_cvtepi32_ps(moe__k4_msum8(y, mins)));
      acc[r] = _mm512_mask_sub_ps(acc[r], 0x00ff, acc[r], _mm512_castps256_ps512(u)); /* lanes 0-7 only */
    }
  }
}

AVX512 MOE__QDOT_INLINE void k4_avx512(const void *w, const void *a, size_t astride, int64_t n, float *out, size_t bytes,
                                       int qh_at, int nr) {
  __m512 acc[MOE__QDOT_ROWS];
  k4_acc512(w, a, astride, n, acc, bytes, qh_at, nr, 0);
  moe__lanes16_out512(acc, nr, out);
}

AVX512 void moe__qdot_q4_K_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  MOE__QDOT_BY_ROWS(nr, k4_avx512, w, a, astride, n, out, 144, 0)
}

AVX512 void moe__qdot_q5_K_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  MOE__QDOT_BY_ROWS(nr, k4_avx512, w, a, astride, n, out, 176, 16)
}

/* Q6_K: vector t holds values 64t..64t+63 (half t / 2, quarters 2 (t % 2) and 2 (t % 2) + 1): the low
 * bits are nibble t % 2 of ql[64 (t / 2) ...], 64 bytes as they lie; the top two of each quarter from
 * the same 32 qh bytes. Scales 4t..4t+3 eight 16-bit lanes each; the offset of 32 by the scales times
 * -32 against the activations' sums (vpmaddwd, at most 2 * 4096 * 2032 a lane). */
AVX512 MOE__QDOT_INLINE void q6k_acc512(const void *w, const void *a, size_t astride, int64_t n, __m512 *acc, int nr) {
  #pragma GCC unroll 8
  for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
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
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
      const moe__q8k *y = (const moe__q8k *)((const char *)a + r * astride) + i;
      __m512i u = _mm512_zextsi256_si512(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->sums), neg32));
      for (int t = 0; t < 4; t++)
        u = _mm512_dpwssd_epi32(u, _mm512_maddubs_epi16(q[t], _mm512_loadu_si512(y->q + 64 * t)), s[t]);
      acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_set1_ps(dw * y->d), _mm512_cvtepi32_ps(u)));
    }
  }
}

AVX512 MOE__QDOT_INLINE void q6k_avx512(const void *w, const void *a, size_t astride, int64_t n, float *out, int nr) {
  __m512 acc[MOE__QDOT_ROWS];
  q6k_acc512(w, a, astride, n, acc, nr);
  moe__lanes16_out512(acc, nr, out);
}

AVX512 void moe__qdot_q6_K_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  MOE__QDOT_BY_ROWS(nr, q6k_avx512, w, a, astride, n, out)
}

/* ---------------------------------------------------------------- activations */

/* The activations' quantizers (quant_dot.c's act_q8_0 and act_q8_K) sixteen values at a time, the same
 * bytes: the products and quotients are the scalar ones' float operations, the roundings exact on
 * values of at most 128 (cvtps's to nearest even in the default mode, as the scalar one's trick). */

/* Whether every one of the n (a multiple of 16) values at x is finite, and the largest magnitude. */
AVX512 static inline int finite_amax(const float *x, int n, float *amax) {
  const __m512 top = _mm512_set1_ps(FLT_MAX);
  __m512 m = _mm512_setzero_ps();
  __mmask16 ok = 0xffff;
  for (int i = 0; i < n; i += 16) {
    __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + i));
    ok &= _mm512_cmp_ps_mask(a, top, _CMP_LE_OQ); /* NaN and infinities fail */
    m = _mm512_max_ps(m, a);
  }
  *amax = _mm512_reduce_max_ps(m);
  return ok == 0xffff;
}

AVX512 void moe__act_q8_0_avx512(const float *x, uint8_t *b) {
  float amax;
  int ok = finite_amax(x, 32, &amax);
  float d = amax / 127, id = d ? 1 / d : 0;
  if (isinf(id)) id = 0; /* d subnormal (its f16 is 0): every value 0 */
  uint16_t h = moe__f32_to_f16(ok ? d : NAN);
  b[0] = (uint8_t)h, b[1] = (uint8_t)(h >> 8);
  for (int i = 0; i < 32; i += 16) {
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(id));
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __mmask16 away = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __mmask16 neg = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);
    __m512i q = _mm512_cvttps_epi32(t);
    q = _mm512_mask_add_epi32(q, away, q, _mm512_mask_blend_epi32(neg, _mm512_set1_epi32(1), _mm512_set1_epi32(-1)));
    _mm_storeu_si128((__m128i *)(b + 2 + i), ok ? _mm512_cvtepi32_epi8(q) : _mm_setzero_si128());
  }
}

AVX512 void moe__act_q8_K_avx512(const float *x, moe__q8k *b) {
  float amax, max = 0;
  int ok = finite_amax(x, 256, &amax);
  for (int i = 0; ok && i < 256 && amax > 0; i += 16) { /* the first value of that magnitude, with its sign */
    __mmask16 at = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + i)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
    if (at) {
      max = x[i + __builtin_ctz(at)];
      break;
    }
  }
  float is = -127 / max;
  if (!ok || max == 0 || isinf(is)) { /* every value 0; a NaN scale where a value is not finite */
    memset(b, 0, sizeof *b);
    b->d = ok ? 0.0f : NAN;
    return;
  }
  for (int j = 0; j < 16; j++) {
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_set1_ps(is), _mm512_loadu_ps(x + 16 * j)));
    q = _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
    _mm_storeu_si128((__m128i *)(b->q + 16 * j), _mm512_cvtepi32_epi8(q));
    b->sums[j] = (int16_t)_mm512_reduce_add_epi32(q);
  }
  b->d = 1 / is;
}

/* ---------------------------------------------------------------- runs of rows (decode) */

/* One weight row's lanes against one activation row, by type t (a constant where this is inlined). */
AVX512 MOE__QDOT_INLINE void row_acc(moe_gguf_type t, int gfni, const uint8_t *w, const void *a, int64_t n, __m512 *acc) {
  switch (t) {
    case MOE_GGUF_Q8_0: b32_acc512(MOE__B32_Q8_0, Q8_BYTES, w, a, 0, n, acc, 1); break;
    case MOE_GGUF_Q4_0: b32_acc512(MOE__B32_Q4_0, 18, w, a, 0, n, acc, 1); break;
    case MOE_GGUF_MXFP4: b32_acc512(MOE__B32_MXFP4, 17, w, a, 0, n, acc, 1); break;
    case MOE_GGUF_Q4_K: k4_acc512(w, a, 0, n, acc, 144, 0, 1, gfni); break;
    case MOE_GGUF_Q5_K: k4_acc512(w, a, 0, n, acc, 176, 16, 1, gfni); break;
    default: q6k_acc512(w, a, 0, n, acc, 1); break;
  }
}

/* A run (quant.h's moe__qrun_fn): each row's lanes as the one-row kernel makes them, in row order.
 * The rows go through one copy of the row's code, not four unrolled: each load instruction then walks
 * the weights at one stride across rows and runs, as a CPU's stride prefetcher (by instruction
 * address) needs; four copies, each jumping four rows at a row's end, read from memory at half the
 * speed on a Zen 5 (bench/qdot_kernels, Q4_K of 1024 and 4096 values a row) and as fast in cache. */
AVX512 MOE__QDOT_INLINE void run512(moe_gguf_type t, int gfni, const void *w, size_t wb, int k, const void *a, int64_t n,
                                    float *out) {
  __m512 acc[MOE__QRUN_ROWS];
  #pragma GCC unroll 1
  for (int j = 0; j < MOE__QRUN_ROWS; j++) {
    acc[j] = _mm512_setzero_ps();
    if (j < k) row_acc(t, gfni, (const uint8_t *)w + (size_t)j * wb, a, n, &acc[j]);
  }
  moe__lanes16_out4_512(acc, k, out);
}

/* Each type's run kernel: run512 with the type (and whether to split nibbles by GFNI) a constant. */
#define QRUN512(name, type, gfni)                                                                             \
  AVX512 void moe__qrun_##name##_avx512(const void *w, size_t wb, int k, const void *a, int64_t n, float *out) { \
    run512(type, gfni, w, wb, k, a, n, out);                                                                  \
  }
QRUN512(q8_0, MOE_GGUF_Q8_0, 0)
QRUN512(q4_0, MOE_GGUF_Q4_0, 0)
QRUN512(mxfp4, MOE_GGUF_MXFP4, 0)
QRUN512(q4_K, MOE_GGUF_Q4_K, 0)
QRUN512(q5_K, MOE_GGUF_Q5_K, 0)
QRUN512(q6_K, MOE_GGUF_Q6_K, 0)
QRUN512(q4_K_gfni, MOE_GGUF_Q4_K, 1)
QRUN512(q5_K_gfni, MOE_GGUF_Q5_K, 1)

#endif
