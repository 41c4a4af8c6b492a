/* The quantized dot products (src/kernels/quant_dot.c, quant_dot_k.c): each weight type's product with
 * its activations against a float64 sum over the dequantized weights (moe_gguf_dequantize) and the
 * dequantized activations (read from their fields here), the activations' quantizers against
 * moe_gguf_quantize and the Q8_K definition, and the AVX2 and AVX-512 versions bit for bit against the
 * scalar ones on random bytes, odd block counts, extreme scales, NaN activations and every row count. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "internal.h"
#include "kernels/quant.h"
#include "test.h"

static const moe_gguf_type kTypes[] = {MOE_GGUF_Q8_0, MOE_GGUF_Q4_0, MOE_GGUF_Q4_K, MOE_GGUF_Q6_K, MOE_GGUF_Q5_K, MOE_GGUF_MXFP4};
#define NTYPES 6

static int is_k(moe_gguf_type t) { return moe_gguf_type_block(t) == 256; }

/* x[i] with magnitudes varying by block (a spread of 2^-6 to 2^6), so that scales differ. */
static void random_row(float *x, int64_t n, int blk, uint64_t *seed) {
  for (int64_t b = 0; b < n / blk; b++) {
    float m = ldexpf(1.0f, (int)(moe__splitmix(seed) % 13) - 6);
    for (int i = 0; i < blk; i++) x[b * blk + i] = m * moe__uniform(seed);
  }
}

/* The activations' values from their fields: Q8_0's from their slots of pairs, Q8_K as d * q. */
static void act_values(moe_gguf_type w, const void *a, float *x, int64_t n) {
  if (!is_k(w)) { /* Q8_0's values and scales, in quant.h's layout */
    for (int64_t i = 0; i < n; i++) {
      const uint8_t *slot = (const uint8_t *)a + (i / 64) * MOE__ACT_PAIR_BYTES;
      float d;
      memcpy(&d, slot + 64 + 32 * (i / 32 % 2), 4);
      x[i] = d * (float)(int8_t)(slot[i % 64] ^ 0x80);
    }
    return;
  }
  const moe__q8k *b = a;
  for (int64_t i = 0; i < n; i++) x[i] = b[i / 256].d * (float)b[i / 256].q[i % 256];
}

/* Q8_0 activations are the codec's values and scales (its bytes, laid out in pairs of blocks); Q8_K:
 * the largest magnitude at -127, every value within half a step, the sums those of the values. */
TEST(qdot_activation_quantizers) {
  enum { N = 256 * 5 };
  uint64_t seed = 11;
  float x[N];
  random_row(x, N, 256, &seed);
  x[300] = 0; /* and a block of zeros */
  for (int i = 512; i < 768; i++) x[i] = 0;
  uint8_t got[N / 64 * MOE__ACT_PAIR_BYTES], want[N / 32 * 34], packed[sizeof got];
  float gv[N], wv[N];
  moe__act_quantize(MOE_GGUF_Q8_0, x, got, N);
  ASSERT_OK(moe_gguf_quantize(MOE_GGUF_Q8_0, x, want, N));
  moe__act_from_q8_0(want, packed, N);
  ASSERT(memcmp(got, packed, sizeof got) == 0);
  moe__act_dequantize(MOE_GGUF_Q8_0, got, gv, N);
  act_values(MOE_GGUF_Q8_0, got, wv, N);
  ASSERT(memcmp(gv, wv, sizeof gv) == 0);
  ASSERT_OK(moe_gguf_dequantize(MOE_GGUF_Q8_0, want, wv, N)); /* the codec's values */
  ASSERT(memcmp(gv, wv, sizeof gv) == 0);
  ASSERT_EQ_INT((int)moe__act_bytes(MOE_GGUF_Q4_0, N), (int)sizeof got);
  ASSERT_EQ_INT((int)moe__act_bytes(MOE_GGUF_Q8_0, 96), 2 * MOE__ACT_PAIR_BYTES); /* an odd block: a slot of its own */
  moe__q8k k[N / 256];
  ASSERT_EQ_INT((int)moe__act_bytes(MOE_GGUF_Q6_K, N), (int)sizeof k);
  moe__act_quantize(MOE_GGUF_Q4_K, x, k, N);
  for (int b = 0; b < N / 256; b++) {
    float amax = 0, d = k[b].d;
    int at = 0;
    for (int i = 0; i < 256; i++)
      if (fabsf(x[256 * b + i]) > amax) amax = fabsf(x[256 * b + i]), at = i;
    if (amax == 0) {
      ASSERT(d == 0);
      continue;
    }
    ASSERT_NEAR(fabsf(d), amax / 127, 1e-6 * amax);
    ASSERT_EQ_INT(k[b].q[at] * (x[256 * b + at] > 0 ? 1 : -1) * (d > 0 ? 1 : -1), 127);
    for (int j = 0; j < 16; j++) {
      int s = 0;
      for (int i = 0; i < 16; i++) {
        s += k[b].q[16 * j + i];
        ASSERT(k[b].q[16 * j + i] >= -127 && k[b].q[16 * j + i] <= 127);
        ASSERT(fabs((double)d * k[b].q[16 * j + i] - x[256 * b + 16 * j + i]) <= 0.5001 * fabs(d));
      }
      ASSERT_EQ_INT(k[b].sums[j], s);
    }
  }
  /* halves: away from zero for Q8_0 (d = 1 with amax 127), to even for Q8_K (scale 1 with max -127) */
  const float ties[8] = {0.5f, 1.5f, -0.5f, -2.5f, 0.49999997f, 126.5f, -127.0f, 2.5f};
  for (int i = 0; i < 256; i++) x[i] = ties[i % 8] * (i < 8 || i % 8 == 6 ? 1.0f : 0.25f);
  moe__act_quantize(MOE_GGUF_Q8_0, x, got, 256);
  ASSERT_OK(moe_gguf_quantize(MOE_GGUF_Q8_0, x, want, 256));
  moe__act_from_q8_0(want, packed, 256);
  ASSERT(memcmp(got, packed, 4 * MOE__ACT_PAIR_BYTES) == 0);
  ASSERT_EQ_INT((int8_t)(got[0] ^ 0x80), 1);
  ASSERT_EQ_INT((int8_t)(got[3] ^ 0x80), -3);
  ASSERT_EQ_INT((int8_t)(got[4] ^ 0x80), 0);
  moe__act_quantize(MOE_GGUF_Q4_K, x, k, 256);
  ASSERT(k[0].d == 1.0f);
  for (int i = 0; i < 256; i++)
    if (k[0].q[i] != (int)lrintf(x[i])) FAIL_("Q8_K value %d of %.9g: %d, want %ld", i, x[i], k[0].q[i], lrintf(x[i]));
  x[7] = NAN; /* a value that is not finite: a NaN scale, not a number that looks right */
  moe__act_quantize(MOE_GGUF_Q8_0, x, got, 32);
  float back[32];
  moe__act_dequantize(MOE_GGUF_Q8_0, got, back, 32);
  ASSERT(isnan(back[0]));
  x[7] = INFINITY;
  moe__act_quantize(MOE_GGUF_Q4_K, x, k, 256);
  ASSERT(isnan(k[0].d));
  /* subnormal rows (the fuzzer's): 1 / d overflows; every value 0 with a zero scale, not an infinity
   * converted to an integer (undefined: UBSan stops there) */
  for (int i = 0; i < 256; i++) x[i] = (i % 3 - 1) * 1e-40f;
  moe__act_quantize(MOE_GGUF_Q8_0, x, got, 256);
  ASSERT_OK(moe_gguf_quantize(MOE_GGUF_Q8_0, x, want, 256));
  moe__act_from_q8_0(want, packed, 256);
  ASSERT(memcmp(got, packed, 4 * MOE__ACT_PAIR_BYTES) == 0);
  moe__act_dequantize(MOE_GGUF_Q8_0, got, back, 32);
  for (int i = 0; i < 32; i++) ASSERT(back[i] == 0);
  moe__act_quantize(MOE_GGUF_Q4_K, x, k, 256);
  ASSERT(k[0].d == 0);
  for (int i = 0; i < 256; i++) ASSERT_EQ_INT(k[0].q[i], 0);
}

/* The AVX-512 quantizers of the activations give the scalar ones' bytes: rows of magnitudes from
 * subnormal to 2^100 (a block each), zeros and negative zeros, equal magnitudes of both signs (the
 * first one's sign is Q8_K's), halves after scaling, a NaN, an infinity; 3 blocks of 32 (an odd last
 * one) and 2 of 256. */
TEST(qdot_activation_quantizers_avx512_bytes_equal_scalar) {
  if (moe__qdot_best() < MOE__ISA_AVX512) SKIP("no AVX-512 VNNI on this CPU: its quantizers cannot run here");
  enum { N = 512 };
  uint64_t seed = 77;
  float x[N];
  static uint8_t s_[N / 64 * MOE__ACT_PAIR_BYTES + MOE__ACT_PAIR_BYTES], v_[sizeof s_];
  moe__q8k sk[N / 256], vk[N / 256];
  for (int trial = 0; trial < 60; trial++) {
    for (int b = 0; b < N / 32; b++) {
      int e = trial < 40 ? (int)(moe__splitmix(&seed) % 240) - 140 : (int)(moe__splitmix(&seed) % 20) - 10;
      for (int i = 0; i < 32; i++) x[32 * b + i] = ldexpf(moe__uniform(&seed) - 0.5f, e);
    }
    if (trial % 6 == 1) memset(x, 0, sizeof x), x[3] = -0.0f;
    if (trial % 6 == 2) { /* the largest magnitude twice in each block of 256, first negative then positive */
      float m = 0;
      for (int i = 0; i < N; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
      x[10] = -4 * m, x[12] = 4 * m, x[100] = 4 * m, x[260] = -4 * m, x[300] = 4 * m;
    }
    if (trial % 6 == 3)
      for (int i = 0; i < N; i++) x[i] = (float)((int)(moe__splitmix(&seed) % 255) - 127) + 0.5f * (i % 2);
    if (trial % 6 == 4) x[moe__splitmix(&seed) % N] = NAN;
    if (trial % 6 == 5) x[moe__splitmix(&seed) % N] = -INFINITY;
    for (int t = 0; t < 2; t++) {
      moe_gguf_type ty = t ? MOE_GGUF_Q4_K : MOE_GGUF_Q8_0;
      int n = t ? N : 96;
      void *sa = t ? (void *)sk : s_, *va = t ? (void *)vk : v_;
      size_t bytes = t ? sizeof sk : (size_t)2 * MOE__ACT_PAIR_BYTES;
      memset(sa, 0xa5, bytes), memset(va, 0x5a, bytes);
      moe__act_quantize_by(MOE__ISA_SCALAR, ty, x, sa, n);
      moe__act_quantize_by(MOE__ISA_AVX512, ty, x, va, n);
      if (memcmp(sa, va, bytes)) {
        for (size_t i = 0; i < bytes; i++)
          if (((uint8_t *)sa)[i] != ((uint8_t *)va)[i]) {
            FAIL_("%s trial %d: byte %zu is %d, the scalar quantizer's %d", t ? "Q8_K" : "Q8_0", trial, i,
                  ((uint8_t *)va)[i], ((uint8_t *)sa)[i]);
            break;
          }
      }
    }
  }
}

/* Each type's product against float64 over the dequantized operands, every version, every row count. */
TEST(qdot_matches_float64) {
  enum { N = 256 * 6, R = MOE__QDOT_ROWS };
  uint64_t seed = 5;
  float *w = malloc(N * 4), *x = malloc(R * N * 4), *wd = malloc(N * 4), *xd = malloc(R * N * 4);
  size_t amax = moe__act_bytes(MOE_GGUF_Q4_K, N) > moe__act_bytes(MOE_GGUF_Q8_0, N) ? moe__act_bytes(MOE_GGUF_Q4_K, N)
                                                                                   : moe__act_bytes(MOE_GGUF_Q8_0, N);
  uint8_t *wq = malloc(N * 2), *aq = malloc(R * amax);
  for (int t = 0; t < NTYPES; t++) {
    moe_gguf_type ty = kTypes[t];
    int blk = moe_gguf_type_block(ty);
    size_t ab = moe__act_bytes(ty, N);
    random_row(w, N, blk, &seed);
    random_row(x, (int64_t)R * N, blk, &seed);
    ASSERT_OK(moe_gguf_quantize(ty, w, wq, N));
    ASSERT_OK(moe_gguf_dequantize(ty, wq, wd, N));
    for (int r = 0; r < R; r++) {
      moe__act_quantize(ty, x + (size_t)r * N, aq + r * ab, N);
      act_values(ty, aq + r * ab, xd + (size_t)r * N, N);
    }
    for (int isa = MOE__ISA_SCALAR; isa <= MOE__ISA_AVX512; isa++) {
      moe__qdot_fn f = moe__qdot_kernel(ty, (moe__isa)isa);
      if (!f) continue; /* a version this CPU lacks: the bit-identity test says so */
      for (int nr = 1; nr <= R; nr++) {
        float out[R];
        f(wq, aq, ab, nr, N, out);
        for (int r = 0; r < nr; r++) {
          double want = 0, mag = 0;
          for (int i = 0; i < N; i++) {
            double p = (double)wd[i] * xd[(size_t)r * N + i];
            want += p, mag += fabs(p);
          }
          if (fabs(out[r] - want) > 2e-6 * mag)
            FAIL_("%s %s rows %d row %d: %.9g, float64 %.9g (sum of |products| %.4g)", moe_gguf_type_name(ty),
                  moe__isa_name((moe__isa)isa), nr, r, out[r], want, mag);
        }
      }
    }
  }
  free(w), free(x), free(wd), free(xd), free(wq), free(aq);
}

/* Random bytes for a block of type t, with finite scales of exponent e (0..30: f16's biased exponent;
 * MXFP4's E8M0 scale is 2^(e - 16)). */
static void random_block(moe_gguf_type t, uint8_t *b, int e, uint64_t *seed) {
  size_t n = moe_gguf_type_block_bytes(t);
  for (size_t i = 0; i < n; i++) b[i] = (uint8_t)moe__splitmix(seed);
  if (t == MOE_GGUF_MXFP4) { /* an E8M0 scale: 2^(e - 16) */
    b[0] = (uint8_t)(112 + e);
    return;
  }
  int at[2] = {0, -1};
  if (t == MOE_GGUF_Q4_K || t == MOE_GGUF_Q5_K) at[1] = 2;
  if (t == MOE_GGUF_Q6_K) at[0] = 208;
  for (int k = 0; k < 2 && at[k] >= 0; k++) b[at[k] + 1] = (uint8_t)((b[at[k] + 1] & 0x83) | e << 2);
}

/* Random activations: Q8_0 blocks of scale exponent e, or Q8_K blocks of values in [-127, 127] with
 * their sums and a scale of 2^(e - 15) (a tiny to a huge one). */
static void random_act(moe_gguf_type t, uint8_t *a, int64_t n, int e, uint64_t *seed) {
  if (!is_k(t)) {
    for (int64_t b = 0; b < n / 32; b++) random_block(MOE_GGUF_Q8_0, a + 34 * b, e, seed);
    for (int64_t b = 0; b < n / 32; b++)
      for (int i = 0; i < 32; i++)
        if (a[34 * b + 2 + i] == 0x80) a[34 * b + 2 + i] = 0x81; /* the quantizer's range */
    return;
  }
  moe__q8k *k = (moe__q8k *)a;
  for (int64_t b = 0; b < n / 256; b++) {
    k[b].d = ldexpf(1.0f + moe__uniform(seed) * 0.5f, 4 * (e - 15));
    for (int j = 0; j < 16; j++) {
      int s = 0;
      for (int i = 0; i < 16; i++) s += k[b].q[16 * j + i] = (int8_t)((int)(moe__splitmix(seed) % 255) - 127);
      k[b].sums[j] = (int16_t)s;
    }
  }
}

/* Version isa gives the scalar one's bits for every row count (and a row's bits do not depend on the
 * rows with it), on block counts below, at and past a multiple of 8 (the AVX-512 versions' groups),
 * with -128 weights and activations (any bytes: exact). A row of NaN scale gives NaN. */
static void bits_equal_scalar(int *failed_, moe__isa isa) {
  enum { MAXB = 17, R = MOE__QDOT_ROWS };
  uint64_t seed = 9;
  static uint8_t w[MAXB * 210], a[R * MAXB * sizeof(moe__q8k)], q8[R * MAXB * 8 * 34];
  const int counts[] = {1, 3, 7, 8, 9, 17}, exps[] = {0, 1, 8, 15, 22, 30}; /* f16 exponents: subnormal to 2^15 */
  for (int t = 0; t < NTYPES; t++) {
    moe_gguf_type ty = kTypes[t];
    moe__qdot_fn s = moe__qdot_kernel(ty, MOE__ISA_SCALAR), v = moe__qdot_kernel(ty, isa);
    ASSERT(s && v);
    for (int c = 0; c < 6; c++)
      for (int ei = 0; ei < 6; ei++)
        for (int trial = 0; trial < 4; trial++) {
          int64_t n = (int64_t)counts[c] * moe_gguf_type_block(ty);
          size_t ab = moe__act_bytes(ty, n), bb = moe_gguf_type_block_bytes(ty);
          for (int b = 0; b < counts[c]; b++) random_block(ty, w + b * bb, exps[(ei + b) % 6], &seed);
          size_t qb = (size_t)(n / 32) * 34; /* 32-value blocks: rows of Q8_0 bytes, then laid out as activations */
          for (int r = 0; r < R; r++) random_act(ty, is_k(ty) ? a + r * ab : q8 + r * qb, n, exps[(ei + r + trial) % 6], &seed);
          if (trial == 1 && !is_k(ty)) q8[2 * qb + 2] = 0x80, w[ty == MOE_GGUF_Q8_0 ? 2 : 0] = 0x80; /* -128 (a scale byte else) */
          if (trial == 2) { /* a NaN scale in row 1's last block */
            if (is_k(ty)) ((moe__q8k *)(a + ab))[counts[c] - 1].d = NAN;
            else q8[qb + 34 * (n / 32 - 1)] = 0xff, q8[qb + 34 * (n / 32 - 1) + 1] = 0x7f;
          }
          for (int r = 0; !is_k(ty) && r < R; r++) moe__act_from_q8_0(q8 + r * qb, a + r * ab, n);
          float os[R], ov[R], one;
          s(w, a, ab, R, n, os);
          for (int nr = 1; nr <= R; nr++) {
            v(w, a, ab, nr, n, ov);
            for (int r = 0; r < nr; r++)
              if (memcmp(&os[r], &ov[r], 4) && !(isnan(os[r]) && isnan(ov[r])))
                FAIL_("%s %s, %d blocks, exponent %d, rows %d, row %d: %.9g != scalar %.9g", moe_gguf_type_name(ty),
                      moe__isa_name(isa), counts[c], exps[ei], nr, r, ov[r], os[r]);
          }
          if (trial == 2) ASSERT(isnan(os[1]));
          for (int r = 0; r < R; r++) {
            v(w, a + r * ab, ab, 1, n, &one);
            if (memcmp(&one, &ov[r], 4) && !(isnan(one) && isnan(ov[r])))
              FAIL_("%s row %d: alone %.9g, with others %.9g", moe_gguf_type_name(ty), r, one, ov[r]);
          }
        }
  }
}

TEST(qdot_avx2_bits_equal_scalar) {
  if (moe__qdot_best() < MOE__ISA_AVX2) SKIP("no AVX2 on this CPU: only the scalar versions exist here");
  bits_equal_scalar(failed_, MOE__ISA_AVX2);
}

TEST(qdot_avx512_bits_equal_scalar) {
  if (moe__qdot_best() < MOE__ISA_AVX512) SKIP("no AVX-512 VNNI on this CPU: its versions cannot run here");
  bits_equal_scalar(failed_, MOE__ISA_AVX512);
}

/* moe_cpu_info names the version the quantized experts run: AVX-512 exactly when the CPU has F, BW, VL
 * and VNNI, else AVX2 exactly when it has AVX2, FMA and F16C. */
TEST(qdot_cpu_info_names_the_choice) {
  __builtin_cpu_init();
  int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
  int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  ASSERT_EQ_INT(moe__qdot_best(), avx512 ? MOE__ISA_AVX512 : avx2 ? MOE__ISA_AVX2 : MOE__ISA_SCALAR);
  char want[80];
  snprintf(want, sizeof want, "quantized experts' dot products %s", avx512 ? "AVX-512 VNNI" : avx2 ? "AVX2" : "scalar");
  if (!strstr(moe_cpu_info(), want)) FAIL_("moe_cpu_info: '%s' lacks '%s'", moe_cpu_info(), want);
  for (size_t t = 0; t < NTYPES; t++) ASSERT(moe__qdot_kernel(kTypes[t], MOE__ISA_SCALAR) != NULL);
  ASSERT(!moe__qdot_kernel(MOE_GGUF_F32, MOE__ISA_SCALAR) && !moe__qdot_has(MOE_GGUF_F32));
}

/* ---- BF16 and F16 weights with fp32 activations (quant_dot_float.c) */

static const moe_gguf_type kFloatTypes[] = {MOE_GGUF_BF16, MOE_GGUF_F16};
static const int kFloatLengths[] = {1, 5, 15, 16, 17, 31, 48, 100, 263};

/* Against float64 over the stored weights' values and the activations, every version and row count. */
TEST(qdot_float_matches_float64) {
  enum { N = 263, R = MOE__QDOT_ROWS };
  uint64_t seed = 21;
  float w[N], wd[N], x[R * N], out[R];
  uint16_t wq[N];
  for (int t = 0; t < 2; t++)
    for (int c = 0; c < 9; c++) {
      int n = kFloatLengths[c];
      random_row(w, n, 1, &seed);
      random_row(x, (int64_t)R * n, 1, &seed);
      ASSERT_OK(moe_gguf_quantize(kFloatTypes[t], w, wq, n));
      ASSERT_OK(moe_gguf_dequantize(kFloatTypes[t], wq, wd, n));
      ASSERT_EQ_INT((int)moe__act_bytes(kFloatTypes[t], n), 4 * n);
      for (int isa = MOE__ISA_SCALAR; isa <= MOE__ISA_AVX512; isa++) {
        moe__qdot_fn f = moe__qdot_kernel(kFloatTypes[t], (moe__isa)isa);
        if (!f) continue; /* a version this CPU lacks: the bit-identity test says so */
        for (int nr = 1; nr <= R; nr++) {
          f(wq, x, (size_t)n * 4, nr, n, out);
          for (int r = 0; r < nr; r++) {
            double want = 0, mag = 0;
            for (int i = 0; i < n; i++) want += (double)wd[i] * x[r * n + i], mag += fabs((double)wd[i] * x[r * n + i]);
            if (fabs(out[r] - want) > 1e-6 * mag)
              FAIL_("%s %s n %d rows %d row %d: %.9g, float64 %.9g", moe_gguf_type_name(kFloatTypes[t]),
                    moe__isa_name((moe__isa)isa), n, nr, r, out[r], want);
          }
        }
      }
    }
}

/* Version isa gives the scalar one's bits on any weight bits (NaN, infinities, subnormals), lengths
 * below, at and past sixteens, every row count, and a row's bits whatever rows are beside it. */
static void float_bits_equal_scalar(int *failed_, moe__isa isa) {
  enum { N = 263, R = MOE__QDOT_ROWS };
  uint64_t seed = 23;
  uint16_t w[N];
  float x[R * N], os[R], ov[R], one;
  for (int t = 0; t < 2; t++) {
    moe__qdot_fn s = moe__qdot_kernel(kFloatTypes[t], MOE__ISA_SCALAR), v = moe__qdot_kernel(kFloatTypes[t], isa);
    ASSERT(s && v);
    for (int c = 0; c < 9; c++)
      for (int trial = 0; trial < 4; trial++) {
        int n = kFloatLengths[c];
        for (int i = 0; i < n; i++) { /* any bits, or (trials 0-1) exponents that keep the sums finite */
          uint16_t bits = (uint16_t)moe__splitmix(&seed), e = (uint16_t)(moe__splitmix(&seed) % 16);
          w[i] = trial >= 2 ? bits : t ? (uint16_t)((bits & 0x83ff) | (8 + e) << 10) : (uint16_t)((bits & 0x807f) | (119 + e) << 7);
        }
        for (int i = 0; i < R * n; i++) x[i] = ldexpf(moe__uniform(&seed) - 0.5f, (int)(moe__splitmix(&seed) % 40) - 20);
        if (trial == 1) x[n - 1] = -0.0f, w[n - 1] = 0x8000; /* negative zeros */
        s(w, x, (size_t)n * 4, R, n, os);
        for (int nr = 1; nr <= R; nr++) {
          v(w, x, (size_t)n * 4, nr, n, ov);
          for (int r = 0; r < nr; r++)
            if (memcmp(&os[r], &ov[r], 4) && !(isnan(os[r]) && isnan(ov[r])))
              FAIL_("%s %s, n %d, trial %d, rows %d, row %d: %.9g != scalar %.9g", moe_gguf_type_name(kFloatTypes[t]),
                    moe__isa_name(isa), n, trial, nr, r, ov[r], os[r]);
        }
        for (int r = 0; r < R; r++) {
          v(w, x + r * n, (size_t)n * 4, 1, n, &one);
          if (memcmp(&one, &ov[r], 4) && !(isnan(one) && isnan(ov[r])))
            FAIL_("%s row %d: alone %.9g, with others %.9g", moe_gguf_type_name(kFloatTypes[t]), r, one, ov[r]);
        }
      }
  }
}

TEST(qdot_float_avx2_bits_equal_scalar) {
  if (moe__qdot_best() < MOE__ISA_AVX2) SKIP("no AVX2 with FMA on this CPU: only the scalar versions exist here");
  float_bits_equal_scalar(failed_, MOE__ISA_AVX2);
}

TEST(qdot_float_avx512_bits_equal_scalar) {
  if (moe__qdot_best() < MOE__ISA_AVX512) SKIP("no AVX-512 VNNI on this CPU: its versions cannot run here");
  float_bits_equal_scalar(failed_, MOE__ISA_AVX512);
}

/* The four-row kernels (where a type and CPU have one) give each output the scalar one-row kernel's bits,
 * for 1 to 4 activation rows and lengths below, at and past sixteens. */
TEST(qdot4_float_bits_equal_one_row) {
  enum { N = 263, R = MOE__QDOT4_ROWS };
  uint64_t seed = 29;
  uint16_t w[4 * N];
  float x[R * N], o4[4 * R], one[R];
  int tested = 0;
  for (int t = 0; t < 2; t++) {
    moe__qdot4_fn f4 = moe__qdot4_kernel(kFloatTypes[t], moe__qdot_best());
    moe__qdot_fn s = moe__qdot_kernel(kFloatTypes[t], MOE__ISA_SCALAR);
    if (!f4) continue;
    for (int c = 0; c < 9; c++) {
      int n = kFloatLengths[c];
      for (int i = 0; i < 4 * n; i++) w[i] = (uint16_t)moe__splitmix(&seed);
      for (int i = 0; i < R * n; i++) x[i] = ldexpf(moe__uniform(&seed) - 0.5f, (int)(moe__splitmix(&seed) % 40) - 20);
      for (int nr = 1; nr <= R; nr++) {
        f4(w, (size_t)n * 2, x, (size_t)n * 4, nr, n, o4);
        for (int j = 0; j < 4; j++) {
          s(w + j * n, x, (size_t)n * 4, nr, n, one);
          for (int r = 0; r < nr; r++)
            if (memcmp(&o4[j * MOE__QDOT4_ROWS + r], &one[r], 4) && !(isnan(one[r]) && isnan(o4[j * MOE__QDOT4_ROWS + r])))
              FAIL_("%s four rows, n %d, rows %d: weight row %d row %d %.9g != one row's %.9g",
                    moe_gguf_type_name(kFloatTypes[t]), n, nr, j, r, o4[j * MOE__QDOT4_ROWS + r], one[r]);
        }
      }
      tested++;
    }
  }
  if (!tested) SKIP("no four-row kernel on this CPU (AVX-512 has them)");
}

/* A run of rows (moe__qrun_kernel: a decode's k weight rows against one activation row) gives each
 * row the scalar one-row kernel's bits, for k 1 to MOE__QRUN_ROWS, block counts below, at and past
 * the vectors' groups, a NaN activation scale; it writes k outputs and no more. */
TEST(qrun_bits_equal_one_row) {
  enum { MAXB = 9, K = MOE__QRUN_ROWS };
  uint64_t seed = 41;
  static uint8_t w[K * MAXB * 210], a[MAXB * sizeof(moe__q8k)], q8[MAXB * 8 * 34];
  const int counts[] = {1, 3, 8, 9};
  int tested = 0;
  for (int t = 0; t < 2 * NTYPES; t++) { /* each type's run kernel with and (where the CPU has it) without GFNI */
    moe_gguf_type ty = kTypes[t % NTYPES];
    moe__qrun_gfni(t < NTYPES);
    moe__qrun_fn run = moe__qrun_kernel(ty, moe__qdot_best());
    moe__qrun_gfni(1);
    moe__qdot_fn s = moe__qdot_kernel(ty, MOE__ISA_SCALAR);
    if (!run) continue;
    for (int c = 0; c < 4; c++)
      for (int trial = 0; trial < 3; trial++) {
        int64_t n = (int64_t)counts[c] * moe_gguf_type_block(ty);
        size_t bb = moe_gguf_type_block_bytes(ty), wb = (size_t)counts[c] * bb, ab = moe__act_bytes(ty, n);
        for (int b = 0; b < K * counts[c]; b++) random_block(ty, w + b * bb, (b + trial) % 31, &seed);
        random_act(ty, is_k(ty) ? a : q8, n, 10 + trial, &seed);
        if (trial == 2) { /* a NaN scale in the last block */
          if (is_k(ty)) ((moe__q8k *)a)[counts[c] - 1].d = NAN;
          else q8[34 * (n / 32 - 1)] = 0xff, q8[34 * (n / 32 - 1) + 1] = 0x7f;
        }
        if (!is_k(ty)) moe__act_from_q8_0(q8, a, n);
        for (int k = 1; k <= K; k++) {
          float got[K + 1], one;
          for (int j = 0; j <= K; j++) got[j] = -1.0f;
          run(w, wb, k, a, n, got);
          for (int j = 0; j < k; j++) {
            s(w + j * wb, a, ab, 1, n, &one);
            if (memcmp(&got[j], &one, 4) && !(isnan(one) && isnan(got[j])))
              FAIL_("%s%s run of %d, %d blocks, trial %d: row %d %.9g != one row's %.9g", moe_gguf_type_name(ty),
                    t < NTYPES && moe__cpu_has(MOE__CPU_GFNI) ? " (GFNI)" : "", k, counts[c], trial, j, got[j], one);
          }
          for (int j = k; j <= K; j++)
            if (got[j] != -1.0f) FAIL_("%s run of %d: wrote out[%d] = %.9g", moe_gguf_type_name(ty), k, j, got[j]);
          if (trial == 2) ASSERT(isnan(got[0]));
        }
        tested++;
      }
  }
  for (int t = 0; t < 2; t++) { /* BF16, F16: fp32 activations */
    moe__qrun_fn run = moe__qrun_kernel(kFloatTypes[t], moe__qdot_best());
    moe__qdot_fn s = moe__qdot_kernel(kFloatTypes[t], MOE__ISA_SCALAR);
    if (!run) continue;
    for (int c = 0; c < 9; c++) {
      int n = kFloatLengths[c];
      static uint16_t fw[K * 300];
      static float x[300];
      for (int i = 0; i < K * n; i++) fw[i] = (uint16_t)moe__splitmix(&seed);
      for (int i = 0; i < n; i++) x[i] = ldexpf(moe__uniform(&seed) - 0.5f, (int)(moe__splitmix(&seed) % 40) - 20);
      for (int k = 1; k <= K; k++) {
        float got[K], one;
        run(fw, (size_t)n * 2, k, x, n, got);
        for (int j = 0; j < k; j++) {
          s(fw + j * n, x, (size_t)n * 4, 1, n, &one);
          if (memcmp(&got[j], &one, 4) && !(isnan(one) && isnan(got[j])))
            FAIL_("%s run of %d, n %d: row %d %.9g != one row's %.9g", moe_gguf_type_name(kFloatTypes[t]), k, n, j,
                  got[j], one);
        }
      }
      tested++;
    }
  }
  if (!tested) SKIP("no run kernels on this CPU (AVX-512 VNNI has them)");
}
