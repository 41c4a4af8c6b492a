/* Dot products of quantized weight rows with activations quantized per block (quant.h: the formats and
 * the summation order every version follows): the activations' quantizers, Q8_0, Q4_0 and MXFP4 weights
 * with Q8_0 activations, and the choice of version by the CPU's features (the AVX-512 versions are in
 * quant_dot_avx512.c). The AVX2 versions (with F16C for the scales) are compiled for AVX2 whatever the
 * build's flags and handed out only when the CPU has it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "kernels/quant.h"
#include "kernels/quant_avx2.h"

#define Q8_BYTES 34 /* f16 scale, then 32 int8 values */
#define Q4_BYTES 18 /* f16 scale, then 16 bytes of two 4-bit values each */
#define MX_BYTES 17 /* E8M0 scale, then 16 bytes of two e2m1 values each */

static inline float scale_of(const uint8_t *b) { return moe__half((uint16_t)(b[0] | b[1] << 8)); }

/* ---------------------------------------------------------------- activations */

static int k_quant(moe_gguf_type w) { return w == MOE_GGUF_Q4_K || w == MOE_GGUF_Q5_K || w == MOE_GGUF_Q6_K; }
static int half_float(moe_gguf_type w) { return w == MOE_GGUF_BF16 || w == MOE_GGUF_F16; }

int moe__qdot_has(moe_gguf_type w) {
  return w == MOE_GGUF_Q8_0 || w == MOE_GGUF_Q4_0 || w == MOE_GGUF_MXFP4 || k_quant(w) || half_float(w);
}

int moe__act_format(moe_gguf_type w) { return half_float(w) ? MOE__ACT_F32 : k_quant(w) ? MOE__ACT_Q8_K : MOE__ACT_Q8_0; }

size_t moe__act_bytes(moe_gguf_type w, int64_t n) {
  if (half_float(w)) return (size_t)n * 4;
  return k_quant(w) ? (size_t)(n / 256) * sizeof(moe__q8k) : (size_t)((n / 32 + 1) / 2) * MOE__ACT_PAIR_BYTES;
}

/* Q8_0 block q8 (34 bytes) into half h of a pair's slot; the slot of block i; half h's scale. */
static void pack_block(const uint8_t *q8, uint8_t *slot, int h) {
  float d = scale_of(q8);
  for (int j = 0; j < 32; j++) slot[32 * h + j] = q8[2 + j] ^ 0x80;
  for (int k = 0; k < 8; k++) memcpy(slot + 64 + 32 * h + 4 * k, &d, 4);
}
static inline const uint8_t *slot_of(const void *a, int64_t i) {
  return (const uint8_t *)a + (size_t)(i / 2) * MOE__ACT_PAIR_BYTES;
}
/* Block i's Q8_0 bytes q8 into the row a of nb blocks (the odd last block's slot zeroed first). */
static void put_block(void *a, int64_t nb, int64_t i, const uint8_t *q8) {
  uint8_t *slot = (uint8_t *)a + (size_t)(i / 2) * MOE__ACT_PAIR_BYTES;
  if (i == nb - 1 && nb % 2) memset(slot, 0, MOE__ACT_PAIR_BYTES);
  pack_block(q8, slot, (int)(i % 2));
}
static inline float act_scale(const uint8_t *slot, int h) {
  float d;
  memcpy(&d, slot + 64 + 32 * h, 4);
  return d;
}

void moe__act_from_q8_0(const void *q8_0, void *a, int64_t n) {
  for (int64_t i = 0; i < n / 32; i++) put_block(a, n / 32, i, (const uint8_t *)q8_0 + Q8_BYTES * i);
}

/* The value of largest magnitude (the first of equals), and whether every value is finite. */
static float signed_max(const float *x, int n, int *finite) {
  float a = 0, s = 0;
  int ok = 1;
  for (int i = 0; i < n; i++) {
    ok &= isfinite(x[i]) != 0;
    if (fabsf(x[i]) > a) a = fabsf(x[i]), s = x[i];
  }
  *finite = ok;
  return s;
}

/* Rounding without libm calls (the quantizers run over every token's rows): to nearest, halves away
 * from zero (roundf), and halves to even (lrintf in the default rounding mode) by adding and taking
 * away 1.5 * 2^23, exact for |v| < 2^22. Both only for |v| <= 128 here. */
static inline int round_away(float v) {
  float t = truncf(v); /* v - t is exact */
  return (int)t + (fabsf(v - t) >= 0.5f ? (v < 0 ? -1 : 1) : 0);
}
static inline int round_even(float v) {
  float big = 0x1.8p23f, r = v + big;
  return (int)(r - big);
}

/* Q8_0: d = amax / 127 stored as f16, values round(x / d) (halves away from zero) with the float d,
 * as moe_gguf_quantize does. */
static void act_q8_0(const float *x, uint8_t *b) {
  int ok;
  float d = fabsf(signed_max(x, 32, &ok)) / 127, id = d ? 1 / d : 0;
  if (isinf(id)) id = 0; /* d subnormal (its f16 is 0): every value 0, as the reference's lrintf gives */
  uint16_t h = moe__f32_to_f16(ok ? d : NAN);
  b[0] = (uint8_t)h, b[1] = (uint8_t)(h >> 8);
  for (int i = 0; i < 32; i++) b[2 + i] = ok ? (uint8_t)(int8_t)round_away(x[i] * id) : 0;
}

/* Q8_K as ggml makes it: the value of largest magnitude at -127, values rounded to nearest even,
 * d = 1 / the inverse scale. */
static void act_q8_K(const float *x, moe__q8k *b) {
  int ok;
  float max = signed_max(x, 256, &ok);
  memset(b, 0, sizeof *b);
  if (!ok) b->d = NAN;
  float is = -127 / max;
  if (!ok || max == 0 || isinf(is)) return; /* a subnormal max: d = 1 / is would be 0, the block 0 */
  for (int j = 0; j < 256; j++) {
    int v = round_even(is * x[j]);
    b->q[j] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    b->sums[j / 16] = (int16_t)(b->sums[j / 16] + b->q[j]);
  }
  b->d = 1 / is;
}

/* The AVX-512 quantizers where the version has them (the same bytes), the scalar ones else. */
static int cpu_avx512(void);

void moe__act_quantize_by(moe__isa isa, moe_gguf_type w, const float *x, void *a, int64_t n) {
  void (*q8_0)(const float *, uint8_t *) = act_q8_0;
  void (*q8_K)(const float *, moe__q8k *) = act_q8_K;
#ifdef HAVE_X86
  if (isa == MOE__ISA_AVX512 && cpu_avx512()) q8_0 = moe__act_q8_0_avx512, q8_K = moe__act_q8_K_avx512;
#endif
  (void)isa;
  if (half_float(w)) {
    memcpy(a, x, (size_t)n * 4);
  } else if (k_quant(w)) {
    moe__q8k *b = a;
    for (int64_t i = 0; i < n / 256; i++) q8_K(x + 256 * i, b + i);
  } else {
    for (int64_t i = 0; i < n / 32; i++) {
      uint8_t q8[Q8_BYTES];
      q8_0(x + 32 * i, q8);
      put_block(a, n / 32, i, q8);
    }
  }
}

void moe__act_quantize(moe_gguf_type w, const float *x, void *a, int64_t n) {
  moe__act_quantize_by(moe__qdot_best(), w, x, a, n);
}

void moe__act_dequantize(moe_gguf_type w, const void *a, float *x, int64_t n) {
  if (half_float(w)) {
    memcpy(x, a, (size_t)n * 4);
  } else if (k_quant(w)) {
    const moe__q8k *b = a;
    for (int64_t i = 0; i < n; i++) x[i] = b[i / 256].d * (float)b[i / 256].q[i % 256];
  } else {
    for (int64_t i = 0; i < n; i++) {
      const uint8_t *slot = slot_of(a, i / 32);
      int h = (int)(i / 32 % 2);
      x[i] = act_scale(slot, h) * (float)(int8_t)(slot[32 * h + i % 32] ^ 0x80);
    }
  }
}

/* ---------------------------------------------------------------- scalar */

/* A 32-value block's weights as int8: Q8_0's as they lie, Q4_0's nibbles less 8 (values 0-15 the low
 * nibbles, 16-31 the high), MXFP4's doubled e2m1 values; and its scale. */
static void b32_values(int kind, const uint8_t *x, int8_t v[32]) {
  for (int j = 0; j < 16; j++) {
    if (kind == MOE__B32_Q8_0) v[j] = (int8_t)x[2 + j], v[16 + j] = (int8_t)x[18 + j];
    else if (kind == MOE__B32_Q4_0) v[j] = (int8_t)((x[2 + j] & 15) - 8), v[16 + j] = (int8_t)((x[2 + j] >> 4) - 8);
    else v[j] = moe__fp4_x2[x[1 + j] & 15], v[16 + j] = moe__fp4_x2[x[1 + j] >> 4];
  }
}

static float b32_scale(int kind, const uint8_t *x) { return kind == MOE__B32_MXFP4 ? moe__e8m0_half(x[0]) : scale_of(x); }

static void b32_scalar(int kind, size_t wb, const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  for (int r = 0; r < nr; r++) {
    const uint8_t *x = w, *ar = (const uint8_t *)a + r * astride;
    float lane[16] = {0};
    for (int64_t i = 0; i < n / 32; i++, x += wb) {
      const uint8_t *slot = slot_of(ar, i), *y = slot + 32 * (i % 2);
      int8_t v[32];
      b32_values(kind, x, v);
      float d = b32_scale(kind, x) * act_scale(slot, (int)(i % 2));
      for (int k = 0; k < 8; k++) {
        int32_t g = 0;
        for (int j = 4 * k; j < 4 * k + 4; j++) g += (int32_t)v[j] * (int8_t)(y[j] ^ 0x80);
        float t = (float)g * d; /* a statement of its own: never fused with the sum */
        lane[8 * (i % 2) + k] += t;
      }
    }
    out[r] = moe__lanes16_sum(lane);
  }
}

static void q8_0_scalar(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  b32_scalar(MOE__B32_Q8_0, Q8_BYTES, w, a, astride, nr, n, out);
}

static void q4_0_scalar(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  b32_scalar(MOE__B32_Q4_0, Q4_BYTES, w, a, astride, nr, n, out);
}

static void mxfp4_scalar(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  b32_scalar(MOE__B32_MXFP4, MX_BYTES, w, a, astride, nr, n, out);
}

/* ---------------------------------------------------------------- AVX2 */

#ifdef HAVE_X86

/* The 32-value blocks (Q8_0, Q4_0, MXFP4 weights; Q8_0 activations): a block's 32 weight values as
 * int8 in one vector. */
AVX2 static inline __m256i block_values(int kind, const uint8_t *x) {
  if (kind == MOE__B32_Q8_0) return _mm256_loadu_si256((const __m256i *)(x + 2));
  __m128i q = _mm_loadu_si128((const __m128i *)(x + (kind == MOE__B32_MXFP4 ? 1 : 2))), lo4 = _mm_set1_epi8(15);
  __m128i lo = _mm_and_si128(q, lo4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), lo4); /* values 0-15, 16-31 */
  if (kind == MOE__B32_MXFP4) { /* the doubled e2m1 values by table */
    __m128i table = _mm_loadu_si128((const __m128i *)moe__fp4_x2);
    return _mm256_set_m128i(_mm_shuffle_epi8(table, hi), _mm_shuffle_epi8(table, lo));
  }
  return _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8));
}

/* The block's eight group sums (values 4k..4k + 3), exact for any bytes (both sides widened to int16,
 * madd's pairs then hadd's), in the lane order g0 g1 g4 g5 g2 g3 g6 g7; v0, v1: the weights' values
 * 0-15 and 16-31 as int16, y: the block's 32 activation bytes. */
AVX2 static inline __m256i block_groups(__m256i v0, __m256i v1, const uint8_t *y) {
  const __m128i u = _mm_set1_epi8((char)0x80); /* the activations' bytes back to int8 */
  __m256i y0 = _mm256_cvtepi8_epi16(_mm_xor_si128(_mm_loadu_si128((const __m128i *)y), u));
  __m256i y1 = _mm256_cvtepi8_epi16(_mm_xor_si128(_mm_loadu_si128((const __m128i *)(y + 16)), u));
  return _mm256_hadd_epi32(_mm256_madd_epi16(v0, y0), _mm256_madd_epi16(v1, y1));
}

/* Block i (half h = i % 2 of its pair, a constant where this is inlined) into each row's lanes acc[r][h]. */
AVX2 MOE__QDOT_INLINE void b32_avx2_block(int kind, const uint8_t *x, const void *a, size_t astride, int64_t i, int h,
                                         __m256 acc[][2], int nr) {
  __m256i v = block_values(kind, x);
  __m256i v0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)), v1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
  float dw = moe__b32_scale_avx(kind, x);
  #pragma GCC unroll 8
  for (int r = 0; r < nr; r++) {
    const uint8_t *slot = slot_of((const uint8_t *)a + r * astride, i);
    float d = dw * act_scale(slot, h);
    __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(block_groups(v0, v1, slot + 32 * h)), _mm256_set1_ps(d));
    acc[r][h] = _mm256_add_ps(acc[r][h], t);
  }
}

/* Sixteen lanes a row as two 8-lane vectors, even blocks' and odd blocks' (in block_groups' order, put
 * back in group order for the final sum). */
AVX2 MOE__QDOT_INLINE void b32_avx2(int kind, size_t wb, const void *w, const void *a, size_t astride, int64_t n,
                                   float *out, int nr) {
  __m256 acc[MOE__QDOT_ROWS][2];
  #pragma GCC unroll 8
  for (int r = 0; r < nr; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const uint8_t *x = w;
  int64_t nb = n / 32, i = 0;
  for (; i + 2 <= nb; i += 2, x += 2 * wb) {
    b32_avx2_block(kind, x, a, astride, i, 0, acc, nr);
    b32_avx2_block(kind, x + wb, a, astride, i + 1, 1, acc, nr);
  }
  if (i < nb) b32_avx2_block(kind, x, a, astride, i, 0, acc, nr);
  const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  #pragma GCC unroll 8
  for (int r = 0; r < nr; r++)
    for (int h = 0; h < 2; h++) acc[r][h] = _mm256_permutevar8x32_ps(acc[r][h], order);
  moe__lanes16_out(acc, nr, out);
}

AVX2 static void q8_0_avx2(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  MOE__QDOT_BY_ROWS(nr, b32_avx2, MOE__B32_Q8_0, Q8_BYTES, w, a, astride, n, out)
}

AVX2 static void q4_0_avx2(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  MOE__QDOT_BY_ROWS(nr, b32_avx2, MOE__B32_Q4_0, Q4_BYTES, w, a, astride, n, out)
}

AVX2 static void mxfp4_avx2(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out) {
  MOE__QDOT_BY_ROWS(nr, b32_avx2, MOE__B32_MXFP4, MX_BYTES, w, a, astride, n, out)
}

/* AVX2, FMA and F16C (F16C for the scales); for AVX-512 also F, BW, VL and VNNI (base/cpu.h asks the
 * CPU once, the OS's saving of the registers included). */
static int cpu_avx2(void) { return moe__cpu_has(MOE__CPU_AVX2 | MOE__CPU_FMA | MOE__CPU_F16C); }

static int cpu_avx512(void) {
  return cpu_avx2() && moe__cpu_has(MOE__CPU_AVX512F | MOE__CPU_AVX512BW | MOE__CPU_AVX512VL | MOE__CPU_AVX512_VNNI);
}
#else
static int cpu_avx2(void) { return 0; }
static int cpu_avx512(void) { return 0; }
#endif

/* ---------------------------------------------------------------- the choice */

moe__isa moe__qdot_best(void) {
  static int best = -1; /* decided once; a race writes the same value */
  if (best < 0) best = cpu_avx512() ? MOE__ISA_AVX512 : cpu_avx2() ? MOE__ISA_AVX2 : MOE__ISA_SCALAR;
  return (moe__isa)best;
}

const char *moe__isa_name(moe__isa isa) {
  return isa == MOE__ISA_AVX512 ? "AVX-512 VNNI" : isa == MOE__ISA_AVX2 ? "AVX2" : "scalar";
}

moe__qdot_fn moe__qdot_kernel(moe_gguf_type w, moe__isa isa) {
  if (isa == MOE__ISA_SCALAR) {
    switch (w) {
      case MOE_GGUF_Q8_0: return q8_0_scalar;
      case MOE_GGUF_Q4_0: return q4_0_scalar;
      case MOE_GGUF_MXFP4: return mxfp4_scalar;
      case MOE_GGUF_Q4_K: return moe__qdot_q4_K_scalar;
      case MOE_GGUF_Q5_K: return moe__qdot_q5_K_scalar;
      case MOE_GGUF_Q6_K: return moe__qdot_q6_K_scalar;
      case MOE_GGUF_BF16: return moe__qdot_bf16_scalar;
      case MOE_GGUF_F16: return moe__qdot_f16_scalar;
      default: return NULL;
    }
  }
#ifdef HAVE_X86
  if (isa == MOE__ISA_AVX2 && cpu_avx2()) {
    switch (w) {
      case MOE_GGUF_Q8_0: return q8_0_avx2;
      case MOE_GGUF_Q4_0: return q4_0_avx2;
      case MOE_GGUF_MXFP4: return mxfp4_avx2;
      case MOE_GGUF_Q4_K: return moe__qdot_q4_K_avx2;
      case MOE_GGUF_Q5_K: return moe__qdot_q5_K_avx2;
      case MOE_GGUF_Q6_K: return moe__qdot_q6_K_avx2;
      case MOE_GGUF_BF16: return moe__qdot_bf16_avx2;
      case MOE_GGUF_F16: return moe__qdot_f16_avx2;
      default: return NULL;
    }
  }
  if (isa == MOE__ISA_AVX512 && cpu_avx512()) {
    switch (w) {
      case MOE_GGUF_Q8_0: return moe__qdot_q8_0_avx512;
      case MOE_GGUF_Q4_0: return moe__qdot_q4_0_avx512;
      case MOE_GGUF_MXFP4: return moe__qdot_mxfp4_avx512;
      case MOE_GGUF_Q4_K: return moe__qdot_q4_K_avx512;
      case MOE_GGUF_Q5_K: return moe__qdot_q5_K_avx512;
      case MOE_GGUF_Q6_K: return moe__qdot_q6_K_avx512;
      case MOE_GGUF_BF16: return moe__qdot_bf16_avx512;
      case MOE_GGUF_F16: return moe__qdot_f16_avx512;
      default: return NULL;
    }
  }
#endif
  return NULL;
}

moe__qdot4_fn moe__qdot4_kernel(moe_gguf_type w, moe__isa isa) {
#ifdef HAVE_X86
  if (isa == MOE__ISA_AVX512 && cpu_avx512()) return w == MOE_GGUF_BF16 ? moe__qdot4_bf16_avx512
                                                     : w == MOE_GGUF_F16  ? moe__qdot4_f16_avx512
                                                                          : NULL;
#endif
  (void)w, (void)isa;
  return NULL;
}

static int gfni = 1;
void moe__qrun_gfni(int on) { gfni = on != 0; }

moe__qrun_fn moe__qrun_kernel(moe_gguf_type w, moe__isa isa) {
#ifdef HAVE_X86
  if (isa == MOE__ISA_AVX512 && cpu_avx512()) {
    int g = gfni && moe__cpu_has(MOE__CPU_GFNI);
    switch (w) {
      case MOE_GGUF_Q8_0: return moe__qrun_q8_0_avx512;
      case MOE_GGUF_Q4_0: return moe__qrun_q4_0_avx512;
      case MOE_GGUF_MXFP4: return moe__qrun_mxfp4_avx512;
      case MOE_GGUF_Q4_K: return g ? moe__qrun_q4_K_gfni_avx512 : moe__qrun_q4_K_avx512;
      case MOE_GGUF_Q5_K: return g ? moe__qrun_q5_K_gfni_avx512 : moe__qrun_q5_K_avx512;
      case MOE_GGUF_Q6_K: return moe__qrun_q6_K_avx512;
      case MOE_GGUF_BF16: return moe__qrun_bf16_avx512;
      case MOE_GGUF_F16: return moe__qrun_f16_avx512;
      default: return NULL;
    }
  }
#endif
  (void)w, (void)isa;
  return NULL;
}

/* ---------------------------------------------------------------- Q8_0 x Q8_0, one row */

/* b as activations (malloc'd: these are for tests and references), dotted with a by version isa. */
static float dot_q8_0_by(moe__isa isa, const void *a, const void *b, int64_t n) {
  float s = NAN;
  moe__qdot_fn f = moe__qdot_kernel(MOE_GGUF_Q8_0, isa);
  void *act = malloc(moe__act_bytes(MOE_GGUF_Q8_0, n));
  if (f && act) {
    moe__act_from_q8_0(b, act, n);
    f(a, act, 0, 1, n, &s);
  }
  free(act);
  return f ? s : 0;
}

float moe__dot_q8_0_scalar(const void *a, const void *b, int64_t n) { return dot_q8_0_by(MOE__ISA_SCALAR, a, b, n); }

float moe__dot_q8_0_avx2(const void *a, const void *b, int64_t n) { return dot_q8_0_by(MOE__ISA_AVX2, a, b, n); }

int moe__dot_q8_0_has_avx2(void) { return moe__qdot_best() >= MOE__ISA_AVX2; }

float moe__dot_q8_0(const void *a, const void *b, int64_t n) { return dot_q8_0_by(moe__qdot_best(), a, b, n); }
