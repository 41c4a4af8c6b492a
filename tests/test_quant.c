/* GGUF tensor types (src/kernels/quant.c): every codec's dequantization against a plain reference
 * written from the GGUF specification's block descriptions (ggml-common.h's structs and the loop
 * shapes of its dequantizers), reading each field one bit at a time; the half conversions exhaustively;
 * the quantizers' error on random rows; the Q8_0 dot product's AVX2 and scalar versions. */
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "internal.h"
#include "kernels/quant.h"
#include "test.h"

/* ---------------------------------------------------------------- the reference */

/* Bit k (0 = least significant of byte 0) of a little-endian bit stream. */
static int bit(const uint8_t *p, int k) { return (p[k / 8] >> (k % 8)) & 1; }
/* n bits from bit k of byte `byte` upwards, one at a time. */
static int field(const uint8_t *p, int byte, int k, int n) {
  int v = 0;
  for (int i = 0; i < n; i++) v |= bit(p, 8 * byte + k + i) << i;
  return v;
}
static int sbyte(const uint8_t *p, int byte) {
  int v = field(p, byte, 0, 8);
  return v >= 128 ? v - 256 : v;
}

/* IEEE binary16: sign, 5-bit exponent (bias 15), 10-bit fraction; in double. */
static double ref_half(const uint8_t *p) {
  int frac = field(p, 0, 0, 10), ex = field(p, 0, 10, 5), sign = field(p, 0, 15, 1);
  double v = ex == 0 ? frac / 1024.0 * pow(2, -14) : (1 + frac / 1024.0) * pow(2, ex - 15);
  return sign ? -v : v;
}

static void ref_q8_0(const uint8_t *b, float *y) {
  float d = (float)ref_half(b);
  for (int i = 0; i < 32; i++) y[i] = (float)sbyte(b, 2 + i) * d;
}

/* Q4_0: byte j holds value j (low nibble) and value j + 16 (high nibble), stored + 8. */
static void ref_q4_0(const uint8_t *b, float *y) {
  float d = (float)ref_half(b);
  for (int j = 0; j < 16; j++) {
    y[j] = (float)(field(b, 2 + j, 0, 4) - 8) * d;
    y[j + 16] = (float)(field(b, 2 + j, 4, 4) - 8) * d;
  }
}

/* K-quant 6-bit scales and mins (K_SCALE_SIZE = 12 bytes): the first four scales and mins are the low
 * six bits of bytes 0-3 and 4-7; the last four take their low four bits from bytes 8-11 (scale in the
 * low nibble, min in the high) and their top two from bits 6-7 of bytes 0-3 (scales) and 4-7 (mins). */
static void ref_scale_min(const uint8_t *s, int j, int *sc, int *m) {
  if (j < 4) {
    *sc = field(s, j, 0, 6), *m = field(s, j + 4, 0, 6);
  } else {
    *sc = field(s, j + 4, 0, 4) + 16 * field(s, j - 4, 6, 2);
    *m = field(s, j + 4, 4, 4) + 16 * field(s, j, 6, 2);
  }
}

/* Q4_K / Q5_K: d, dmin, scales[12], (Q5_K: qh[32]), qs[128]; for each 64 values, 32 bytes of qs give
 * the first 32 in their low nibbles and the next 32 in their high; Q5_K's fifth bits: for the c-th
 * group of 64, bit 2c (first 32) and 2c + 1 (next 32) of qh[l]. */
static void ref_k(const uint8_t *b, int five, float *y) {
  float d = (float)ref_half(b), dmin = (float)ref_half(b + 2);
  int qs = five ? 48 : 16;
  for (int c = 0; c < 4; c++)
    for (int half = 0; half < 2; half++) {
      int sc, m;
      ref_scale_min(b + 4, 2 * c + half, &sc, &m);
      for (int l = 0; l < 32; l++) {
        int q = field(b, qs + 32 * c + l, 4 * half, 4);
        if (five) q += 16 * field(b, 16 + l, 2 * c + half, 1);
        y[64 * c + 32 * half + l] = d * (float)sc * (float)q - dmin * (float)m;
      }
    }
}

/* Q6_K: ql[128], qh[64], scales[16] (int8), d; per 128 values (ql advancing 64, qh 32, scales 8), lane
 * l of 32: ql[l] low / qh[l] bits 0-1 -> value l, ql[l + 32] low / bits 2-3 -> l + 32, ql[l] high /
 * bits 4-5 -> l + 64, ql[l + 32] high / bits 6-7 -> l + 96; each minus 32, scale index value / 16. */
static void ref_q6_K(const uint8_t *b, float *y) {
  float d = (float)ref_half(b + 208);
  for (int n = 0; n < 2; n++)
    for (int l = 0; l < 32; l++) {
      int ql = 64 * n + l, qh = 128 + 32 * n + l;
      int q[4] = {field(b, ql, 0, 4) + 16 * field(b, qh, 0, 2), field(b, ql + 32, 0, 4) + 16 * field(b, qh, 2, 2),
                  field(b, ql, 4, 4) + 16 * field(b, qh, 4, 2), field(b, ql + 32, 4, 4) + 16 * field(b, qh, 6, 2)};
      for (int k = 0; k < 4; k++) {
        int e = 128 * n + 32 * k + l;
        y[e] = d * (float)sbyte(b, 192 + e / 16) * (float)(q[k] - 32);
      }
    }
}

/* OCP MX: E8M0 scale 2^(e - 127); E2M1 elements: sign bit 3, exponent bits 1-2 (bias 1), mantissa bit 0,
 * subnormal (0 or 0.5) when the exponent is 0. Byte j: element j (low nibble), j + 16 (high). */
static double e2m1(int v) {
  int m = v & 1, ex = (v >> 1) & 3;
  double x = ex == 0 ? 0.5 * m : (1 + 0.5 * m) * pow(2, ex - 1);
  return v & 8 ? -x : x;
}
static void ref_mxfp4(const uint8_t *b, float *y) {
  double s = pow(2, field(b, 0, 0, 8) - 127);
  for (int j = 0; j < 16; j++) {
    y[j] = (float)(e2m1(field(b, 1 + j, 0, 4)) * s);
    y[j + 16] = (float)(e2m1(field(b, 1 + j, 4, 4)) * s);
  }
}

static void ref_block(moe_gguf_type t, const uint8_t *b, float *y) {
  switch (t) {
    case MOE_GGUF_Q8_0: ref_q8_0(b, y); break;
    case MOE_GGUF_Q4_0: ref_q4_0(b, y); break;
    case MOE_GGUF_Q4_K: ref_k(b, 0, y); break;
    case MOE_GGUF_Q5_K: ref_k(b, 1, y); break;
    case MOE_GGUF_Q6_K: ref_q6_K(b, y); break;
    case MOE_GGUF_MXFP4: ref_mxfp4(b, y); break;
    default: abort();
  }
}

/* Byte offsets of a block's f16 fields, which random blocks must hold finite. */
static int half_fields(moe_gguf_type t, int *at) {
  switch (t) {
    case MOE_GGUF_Q8_0: case MOE_GGUF_Q4_0: at[0] = 0; return 1;
    case MOE_GGUF_Q4_K: case MOE_GGUF_Q5_K: at[0] = 0, at[1] = 2; return 2;
    case MOE_GGUF_Q6_K: at[0] = 208; return 1;
    default: return 0;
  }
}

/* The high byte of a random half, made finite: an all-ones exponent loses its lowest bit. */
static void finite_half(uint8_t *hi) {
  if ((*hi & 0x7c) == 0x7c) *hi &= 0xfb;
}

static const moe_gguf_type quantized[] = {MOE_GGUF_Q8_0, MOE_GGUF_Q4_0, MOE_GGUF_Q4_K,
                                          MOE_GGUF_Q5_K, MOE_GGUF_Q6_K, MOE_GGUF_MXFP4};
#define NQ ((int)(sizeof quantized / sizeof *quantized))

/* ---------------------------------------------------------------- tests */

TEST(quant_table) {
  /* ggml's ids, block sizes and bytes (ggml-common.h's static_asserts) */
  struct { moe_gguf_type t; int id, blk, bytes; const char *name; } want[] = {
      {MOE_GGUF_F32, 0, 1, 4, "F32"},      {MOE_GGUF_F16, 1, 1, 2, "F16"},        {MOE_GGUF_Q4_0, 2, 32, 18, "Q4_0"},
      {MOE_GGUF_Q8_0, 8, 32, 34, "Q8_0"},  {MOE_GGUF_Q4_K, 12, 256, 144, "Q4_K"}, {MOE_GGUF_Q5_K, 13, 256, 176, "Q5_K"},
      {MOE_GGUF_Q6_K, 14, 256, 210, "Q6_K"}, {MOE_GGUF_BF16, 30, 1, 2, "BF16"},   {MOE_GGUF_MXFP4, 39, 32, 17, "MXFP4"}};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    ASSERT_EQ_INT(want[i].t, want[i].id);
    ASSERT_EQ_INT(moe_gguf_type_block(want[i].t), want[i].blk);
    ASSERT_EQ_INT(moe_gguf_type_block_bytes(want[i].t), want[i].bytes);
    ASSERT(!strcmp(moe_gguf_type_name(want[i].t), want[i].name));
    ASSERT(moe_gguf_type_supported(want[i].t));
    moe_gguf_type p;
    ASSERT_OK(moe_gguf_type_parse(want[i].name, "--type", &p));
    ASSERT_EQ_INT(p, want[i].t);
  }
  ASSERT(!moe_gguf_type_name((moe_gguf_type)4) && !moe_gguf_type_name((moe_gguf_type)1000)); /* removed, unknown */
  ASSERT(!strcmp(moe_gguf_type_name((moe_gguf_type)10), "Q2_K") && !moe_gguf_type_supported((moe_gguf_type)10));
  moe_gguf_type p;
  ASSERT_OK(moe_gguf_type_parse("q4_k", "--type", &p));
  ASSERT_EQ_INT(p, MOE_GGUF_Q4_K);
  ASSERT_STATUS(moe_gguf_type_parse("Q4_X", "--type", &p), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "--type") && strstr(moe_last_error(), "Q4_X"));
}

TEST(quant_half_exhaustive) {
  for (uint32_t h = 0; h < 65536; h++) {
    uint8_t b[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
    int ex = (h >> 10) & 31;
    float f = moe__f16_to_f32((uint16_t)h);
    if (ex == 31) {
      ASSERT((h & 1023) ? isnan(f) : isinf(f));
      continue;
    }
    if ((double)f != ref_half(b)) FAIL_("half %04x: %.9g, want %.9g", h, f, ref_half(b));
    ASSERT_EQ_INT(moe__f32_to_f16(f), h);
    /* the midpoint to the next half up (exact in a float) rounds to the even one of the two */
    if (h >= 0x7bff) continue;
    uint8_t n[2] = {(uint8_t)(h + 1), (uint8_t)((h + 1) >> 8)};
    float mid = (float)((ref_half(b) + ref_half(n)) / 2);
    uint16_t want = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
    if (moe__f32_to_f16(mid) != want) FAIL_("midpoint %.9g of %04x: %04x, want %04x", mid, h, moe__f32_to_f16(mid), want);
  }
  ASSERT_EQ_INT(moe__f32_to_f16(65520.0f), 0x7c00);  /* the midpoint past 65504 rounds to infinity */
  ASSERT_EQ_INT(moe__f32_to_f16(65519.0f), 0x7bff);
  ASSERT_EQ_INT(moe__f32_to_f16(-1e-9f), 0x8000);    /* underflow keeps the sign */
  ASSERT_EQ_INT(moe__f32_to_f16(NAN) & 0x7e00, 0x7e00);
}

TEST(quant_dequant_matches_reference) {
  uint64_t seed = 41;
  uint8_t blk[8 * 256];
  float y[8 * 256], r[256];
  for (int ti = 0; ti < NQ; ti++) {
    moe_gguf_type t = quantized[ti];
    int n = moe_gguf_type_block(t), bb = (int)moe_gguf_type_block_bytes(t), at[2], nh = half_fields(t, at);
    for (int trial = 0; trial < 50; trial++) {
      for (int i = 0; i < 8 * bb; i++) blk[i] = (uint8_t)moe__splitmix(&seed);
      for (int k = 0; k < 8; k++)
        for (int h = 0; h < nh; h++) finite_half(&blk[k * bb + at[h] + 1]);
      ASSERT_OK(moe_gguf_dequantize(t, blk, y, 8 * n));
      for (int k = 0; k < 8; k++) {
        ref_block(t, blk + k * bb, r);
        for (int i = 0; i < n; i++)
          if (y[k * n + i] != r[i]) /* == : ggml's MXFP4 code 8 is +0 where OCP's E2M1 says -0 */
            FAIL_("%s block %d value %d: %.9g, reference %.9g", moe_gguf_type_name(t), k, i, y[k * n + i], r[i]);
      }
    }
  }
  /* F16 and BF16 rows: each value's half, and the upper half of a float */
  uint8_t h[64];
  for (int i = 0; i < 64; i++) h[i] = (uint8_t)moe__splitmix(&seed);
  for (int i = 0; i < 32; i++) finite_half(&h[2 * i + 1]);
  ASSERT_OK(moe_gguf_dequantize(MOE_GGUF_F16, h, y, 32));
  for (int i = 0; i < 32; i++) ASSERT((double)y[i] == ref_half(h + 2 * i));
  ASSERT_OK(moe_gguf_dequantize(MOE_GGUF_BF16, h, y, 32));
  for (int i = 0; i < 32; i++) {
    uint8_t f[4] = {0, 0, h[2 * i], h[2 * i + 1]};
    float want;
    memcpy(&want, f, 4); /* little-endian host, as the library's tests assume elsewhere */
    ASSERT(!memcmp(&y[i], &want, 4));
  }
}

/* Relative RMS error of dequantize(quantize(x)) over n values. */
static double rel_rms(moe_gguf_type t, const float *x, int n, int *ok) {
  size_t bytes = (size_t)(n / moe_gguf_type_block(t)) * moe_gguf_type_block_bytes(t);
  uint8_t *q = malloc(bytes);
  float *y = malloc((size_t)n * sizeof *y), r[256];
  double e = 0, s = 0;
  *ok = q && y && moe_gguf_quantize(t, x, q, n) == MOE_OK && moe_gguf_dequantize(t, q, y, n) == MOE_OK;
  /* what the quantizer wrote dequantizes as the reference reads it */
  int blk = moe_gguf_type_block(t);
  for (int b = 0; *ok && blk > 1 && b < n / blk; b++) {
    ref_block(t, q + (size_t)b * moe_gguf_type_block_bytes(t), r);
    if (memcmp(r, y + b * blk, (size_t)blk * 4)) *ok = 0;
  }
  for (int i = 0; *ok && i < n; i++) e += (double)(y[i] - x[i]) * (y[i] - x[i]), s += (double)x[i] * x[i];
  free(q), free(y);
  return sqrt(e / s);
}

TEST(quant_roundtrip_error) {
  enum { N = 64 * 256 };
  float *x = malloc(N * sizeof *x);
  ASSERT(x);
  uint64_t seed = 7;
  /* rows like trained weights: roughly normal (sum of uniforms), a few larger outliers */
  for (int i = 0; i < N; i++) {
    float s = 0;
    for (int k = 0; k < 4; k++) s += moe__uniform(&seed);
    x[i] = 0.02f * s * (moe__splitmix(&seed) % 64 ? 1.0f : 4.0f);
  }
  /* bounds: about 1.3x what these quantizers reach here (0.0067, 0.021, 0.041, 0.081, 0.108, 0.127, 0.0002,
   * 0.0017; bits per value 8.5, 6.56, 5.5, 4.5, 4.5, 4.25, 16, 16) */
  struct { moe_gguf_type t; double bound; } want[] = {
      {MOE_GGUF_Q8_0, 0.009}, {MOE_GGUF_Q6_K, 0.028}, {MOE_GGUF_Q5_K, 0.053}, {MOE_GGUF_Q4_K, 0.105},
      {MOE_GGUF_Q4_0, 0.14},  {MOE_GGUF_MXFP4, 0.165}, {MOE_GGUF_F16, 0.0003}, {MOE_GGUF_BF16, 0.0025},
      {MOE_GGUF_F32, 0}};
  double err[9];
  for (int i = 0; i < 9; i++) {
    int ok;
    err[i] = rel_rms(want[i].t, x, N, &ok);
    if (!ok) FAIL_("%s: quantize/dequantize failed or disagrees with the reference: %s", moe_gguf_type_name(want[i].t),
                   moe_last_error());
    printf("  %-5s relative RMS error %.5f (bound %g)\n", moe_gguf_type_name(want[i].t), err[i], want[i].bound);
    ASSERT(err[i] <= want[i].bound);
  }
  ASSERT(err[0] < err[1] && err[1] < err[2] && err[2] < err[3]); /* Q8_0 < Q6_K < Q5_K < Q4_K */
  ASSERT(err[0] > 0 && err[3] > 0); /* the bounds are of something */
  free(x);
}

TEST(quant_reference_behaviour) {
  float x[256];
  uint8_t b[256];
  /* Q8_0: d = amax / 127 as f16, q = round(x / d); the largest value at 127 */
  for (int i = 0; i < 32; i++) x[i] = (float)(i - 16) / 4;
  ASSERT_OK(moe_gguf_quantize(MOE_GGUF_Q8_0, x, b, 32));
  ASSERT_EQ_INT(b[0] | b[1] << 8, moe__f32_to_f16(4.0f / 127));
  ASSERT_EQ_INT((int8_t)b[2], -127);
  ASSERT_EQ_INT((int8_t)b[2 + 16], 0);
  ASSERT_EQ_INT((int8_t)b[2 + 20], 32); /* 1.0 / (4 / 127) = 31.75 */
  /* Q4_0: the value of largest magnitude (here -4, negative) at stored 0 (-8), d = max / -8 = 0.5 */
  ASSERT_OK(moe_gguf_quantize(MOE_GGUF_Q4_0, x, b, 32));
  ASSERT_EQ_INT(b[0] | b[1] << 8, moe__f32_to_f16(0.5f));
  ASSERT_EQ_INT(b[2] & 15, 0);
  ASSERT_EQ_INT(b[2 + 15] >> 4, 15); /* x[31] = 3.75 -> -7.5 + 8.5 = 16 -> clamped to 15 */
  /* MXFP4: values on the e2m1 grid times a power of two come back exactly */
  static const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int i = 0; i < 32; i++) x[i] = grid[i % 8] * (i & 8 ? -0.25f : 0.25f);
  float y[256];
  ASSERT_OK(moe_gguf_quantize(MOE_GGUF_MXFP4, x, b, 32));
  ASSERT_EQ_INT(b[0], 127 - 2); /* amax 1.5 = 6 * 2^-2 */
  ASSERT_OK(moe_gguf_dequantize(MOE_GGUF_MXFP4, b, y, 32));
  for (int i = 0; i < 32; i++) ASSERT_NEAR(y[i], x[i], 0);
  /* an all-zero block of each type stays zero */
  memset(x, 0, sizeof x);
  for (int ti = 0; ti < NQ; ti++) {
    int n = moe_gguf_type_block(quantized[ti]);
    ASSERT_OK(moe_gguf_quantize(quantized[ti], x, b, n));
    ASSERT_OK(moe_gguf_dequantize(quantized[ti], b, y, n));
    for (int i = 0; i < n; i++) ASSERT(y[i] == 0);
  }
}

TEST(quant_rejects_bad_input) {
  float x[64] = {0};
  uint8_t b[256];
  ASSERT_STATUS(moe_gguf_quantize(MOE_GGUF_Q8_0, x, b, 48), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "48") && strstr(moe_last_error(), "Q8_0"));
  ASSERT_STATUS(moe_gguf_dequantize((moe_gguf_type)10, b, x, 256), MOE_ERR_DTYPE);
  ASSERT(strstr(moe_last_error(), "Q2_K"));
  x[5] = NAN;
  ASSERT_STATUS(moe_gguf_quantize(MOE_GGUF_Q4_0, x, b, 32), MOE_ERR_VALUE);
  ASSERT(strstr(moe_last_error(), "value 5"));
  x[5] = 70000;
  ASSERT_STATUS(moe_gguf_quantize(MOE_GGUF_F16, x, b, 32), MOE_ERR_VALUE);
  ASSERT_OK(moe_gguf_quantize(MOE_GGUF_BF16, x, b, 32)); /* bf16 has the range */
}

TEST(quant_dot_q8_0) {
  enum { N = 32 * 40 };
  uint64_t seed = 3;
  uint8_t a[N / 32 * 34], b[N / 32 * 34];
  for (size_t i = 0; i < sizeof a; i++) a[i] = (uint8_t)moe__splitmix(&seed), b[i] = (uint8_t)moe__splitmix(&seed);
  for (int k = 0; k < N / 32; k++) a[34 * k + 1] &= 0x3b, b[34 * k + 1] &= 0x3b; /* finite, moderate scales */
  a[2] = b[2] = 0x80, a[3] = 0x80, b[3] = 0x7f; /* -128 * -128 and -128 * 127 pairs */
  float fa[N], fb[N];
  ASSERT_OK(moe_gguf_dequantize(MOE_GGUF_Q8_0, a, fa, N));
  ASSERT_OK(moe_gguf_dequantize(MOE_GGUF_Q8_0, b, fb, N));
  double want = 0, mag = 0;
  for (int i = 0; i < N; i++) want += (double)fa[i] * fb[i], mag += fabs((double)fa[i] * fb[i]);
  float s = moe__dot_q8_0_scalar(a, b, N);
  ASSERT_NEAR(s, want, 1e-6 * mag);
  ASSERT(moe__dot_q8_0(a, b, N) == s);
  if (!moe__dot_q8_0_has_avx2()) SKIP("no AVX2 on this CPU: only the scalar version was checked");
  float v = moe__dot_q8_0_avx2(a, b, N);
  if (memcmp(&v, &s, 4)) FAIL_("AVX2 %.9g != scalar %.9g", v, s);
}

/* Long rows are split over threads by blocks: the same bytes and values as one block at a time. */
TEST(quant_parallel_same_bytes) {
  enum { NB = 300, N = NB * 256 };
  float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y), yb[256];
  uint8_t *whole = malloc(NB * 210), *one = malloc(NB * 210);
  ASSERT(x && y && whole && one);
  uint64_t seed = 9;
  for (int i = 0; i < N; i++) x[i] = moe__uniform(&seed);
  static const moe_gguf_type ts[] = {MOE_GGUF_Q4_K, MOE_GGUF_Q6_K, MOE_GGUF_Q8_0};
  for (int k = 0; k < 3; k++) {
    int blk = moe_gguf_type_block(ts[k]);
    size_t bb = moe_gguf_type_block_bytes(ts[k]);
    int n = ts[k] == MOE_GGUF_Q8_0 ? N / 8 : N; /* 300 blocks of 32: still past the threshold */
    ASSERT_OK(moe_gguf_quantize(ts[k], x, whole, n));
    ASSERT_OK(moe_gguf_dequantize(ts[k], whole, y, n));
    for (int b = 0; b < n / blk; b++) {
      ASSERT_OK(moe_gguf_quantize(ts[k], x + b * blk, one + b * bb, blk));
      ASSERT_OK(moe_gguf_dequantize(ts[k], one + b * bb, yb, blk));
      if (memcmp(yb, y + b * blk, (size_t)blk * 4)) FAIL_("%s block %d differs", moe_gguf_type_name(ts[k]), b);
    }
    ASSERT(!memcmp(whole, one, (size_t)(n / blk) * bb));
  }
  free(x), free(y), free(whole), free(one);
}

/* The K-quants' scale search with its candidate steps in AVX-512 lanes gives the scalar search's bits
 * (scale and min) on sub-blocks of every kind: random spreads and offsets, one sign, constants, zeros,
 * a single outlier, tiny and large magnitudes, and 5-bit levels (Q5_K) as well as 4-bit. */
TEST(quant_kfit_vector_same_bits) {
  if (!moe__cpu_has(MOE__CPU_AVX512F)) SKIP("no AVX-512 here: only the scalar search runs");
  uint64_t r = 7;
  for (int t = 0; t < 4000; t++) {
    float x[32];
    int kind = t % 8;
    for (int i = 0; i < 32; i++) {
      r = r * 6364136223846793005ull + 1442695040888963407ull;
      float u = (float)((r >> 40) * 0x1.0p-24); /* [0, 1) */
      x[i] = kind == 0 ? 2 * u - 1 : kind == 1 ? u : kind == 2 ? -u : kind == 3 ? 0.25f
           : kind == 4 ? 0 : kind == 5 ? (i == 7 ? 40.0f : 0.01f * u) : kind == 6 ? 1e-30f * (u - 0.3f)
           : 3e4f * (u - 0.5f);
    }
    for (int nmax = 15; nmax <= 31; nmax += 16) {
      float m0, m1, s0 = moe__kfit_scale_min(x, 32, nmax, &m0, 0), s1 = moe__kfit_scale_min(x, 32, nmax, &m1, 1);
      if (memcmp(&s0, &s1, 4) || memcmp(&m0, &m1, 4))
        FAIL_("sub-block %d (kind %d), nmax %d: scalar scale %a min %a, AVX-512 scale %a min %a", t, kind, nmax,
              (double)s0, (double)m0, (double)s1, (double)m1);
    }
  }
}
