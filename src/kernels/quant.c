/* GGUF tensor types (ggml's ids and block layouts, from the GGUF specification and ggml-common.h's
 * block structs): the table of every id's block, and the codecs of F32, F16, BF16, Q8_0, Q4_0, Q4_K,
 * Q5_K, Q6_K and MXFP4. Bytes are read and written one by one, so the layouts hold on any host.
 * The quantizers are reference ones (round to nearest, a small least-squares scale search for the
 * K-quants, whose candidate steps run in AVX-512 lanes where the CPU has them, with the same bits). */
#include <math.h>
#include <string.h>
#include <strings.h>

#include "base/cpu.h"
#include "internal.h"
#include "kernels/quant.h"
#include "kernels/quant_avx2.h" /* HAVE_X86 */

typedef struct {
  const char *name;
  int block;     /* values per block */
  int bytes;     /* bytes per block */
} type_info;

/* Every ggml type id up to MXFP4 and NVFP4; the holes are ids ggml removed. */
static const type_info types[] = {
    [0] = {"F32", 1, 4},         [1] = {"F16", 1, 2},          [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},      [6] = {"Q5_0", 32, 22},       [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},      [9] = {"Q8_1", 32, 36},       [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},   [12] = {"Q4_K", 256, 144},    [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},   [15] = {"Q8_K", 256, 292},    [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74},  [18] = {"IQ3_XXS", 256, 98},  [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},   [21] = {"IQ3_S", 256, 110},   [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},          [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},        [27] = {"I64", 1, 8},         [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},   [30] = {"BF16", 1, 2},        [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},   [39] = {"MXFP4", 32, 17},     [40] = {"NVFP4", 64, 36},
};
#define NTYPES ((int)(sizeof types / sizeof *types))

static const type_info *info(moe_gguf_type t) {
  return (unsigned)t < (unsigned)NTYPES && types[t].name ? &types[t] : NULL;
}

const char *moe_gguf_type_name(moe_gguf_type t) { return info(t) ? info(t)->name : NULL; }
int moe_gguf_type_block(moe_gguf_type t) { return info(t) ? info(t)->block : 0; }
size_t moe_gguf_type_block_bytes(moe_gguf_type t) { return info(t) ? (size_t)info(t)->bytes : 0; }

int moe_gguf_type_supported(moe_gguf_type t) {
  switch (t) {
    case MOE_GGUF_F32: case MOE_GGUF_F16: case MOE_GGUF_BF16: case MOE_GGUF_Q8_0: case MOE_GGUF_Q4_0:
    case MOE_GGUF_Q4_K: case MOE_GGUF_Q5_K: case MOE_GGUF_Q6_K: case MOE_GGUF_MXFP4: return 1;
  }
  return 0;
}

moe_status moe_gguf_type_parse(const char *s, const char *field, moe_gguf_type *out) {
  MOE_TRY(s, MOE_ERR_ARG, "%s: missing value", field);
  for (int i = 0; i < NTYPES; i++)
    if (types[i].name && !strcasecmp(s, types[i].name)) {
      *out = (moe_gguf_type)i;
      return MOE_OK;
    }
  return moe__error(MOE_ERR_ARG, __FILE__, __LINE__,
                    "%s: unknown tensor type '%s' (want F32|F16|BF16|Q8_0|Q4_0|Q4_K|Q5_K|Q6_K|MXFP4)", field, s);
}

/* ---------------------------------------------------------------- halves */

float moe__f16_to_f32(uint16_t h) { return moe__half(h); }

uint16_t moe__f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00;           /* NaN: a quiet one */
  if (a >= 0x477ff000u) return sign | 0x7c00;          /* rounds to beyond 65504: infinity */
  if (a < 0x38800000u) {                                /* below 2^-14: a subnormal half (or 0) */
    float r = fabsf(f) * 0x1p24f;                       /* in units of 2^-24, exact */
    return sign | (uint16_t)lrintf(r);                  /* the default rounding: to nearest even */
  }
  uint32_t mant = a & 0x7fffff, exp = (a >> 23) - 112; /* the half's biased exponent, 1..30 */
  uint32_t h = exp << 10 | mant >> 13, rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++; /* a carry into the exponent is right */
  return sign | (uint16_t)h;
}

static float f16_at(const uint8_t *p) { return moe__f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
static void f16_put(uint8_t *p, float f) {
  uint16_t h = moe__f32_to_f16(f);
  p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}

/* ---------------------------------------------------------------- dequantization, one block each */

static void deq_q8_0(const uint8_t *b, float *y) {
  float d = f16_at(b);
  for (int i = 0; i < 32; i++) y[i] = (float)(int8_t)b[2 + i] * d;
}

static void deq_q4_0(const uint8_t *b, float *y) {
  float d = f16_at(b);
  for (int i = 0; i < 16; i++) {
    y[i] = (float)((b[2 + i] & 15) - 8) * d;
    y[i + 16] = (float)((b[2 + i] >> 4) - 8) * d;
  }
}

/* Q4_K and Q5_K (qh NULL for Q4_K): 8 sub-blocks of 32; bytes qs[32c..32c+32) hold sub-block 2c in
 * their low nibbles and 2c + 1 in their high ones; Q5_K's fifth bit of value l of sub-block j is bit j
 * of qh[l]. */
static void deq_k4(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, float *y) {
  float d = f16_at(b), dmin = f16_at(b + 2);
  uint8_t sc[8], m[8];
  moe__k4_scales(b + 4, sc, m);
  for (int j = 0; j < 8; j++) {
    float dj = d * (float)sc[j], mj = dmin * (float)m[j];
    const uint8_t *q = qs + 32 * (j / 2);
    for (int l = 0; l < 32; l++) {
      int v = (q[l] >> (4 * (j & 1))) & 15;
      if (qh) v |= ((qh[l] >> j) & 1) << 4;
      y[32 * j + l] = dj * (float)v - mj;
    }
  }
}

static void deq_q4_K(const uint8_t *b, float *y) { deq_k4(b, NULL, b + 16, y); }
static void deq_q5_K(const uint8_t *b, float *y) { deq_k4(b, b + 16, b + 48, y); }

/* Q6_K: ql[128], qh[64], 16 int8 scales, f16 d. Value e (of 256) is in half h = e / 128, quarter
 * k = (e % 128) / 32, lane l = e % 32: its low 4 bits in nibble k / 2 of ql[64h + 32(k % 2) + l], its
 * top 2 bits at bit 2k of qh[32h + l]; stored + 32; sub-block scale e / 16. */
static void deq_q6_K(const uint8_t *b, float *y) {
  const uint8_t *ql = b, *qh = b + 128;
  const int8_t *sc = (const int8_t *)(b + 192);
  float d = f16_at(b + 208);
  for (int e = 0; e < 256; e++) {
    int h = e / 128, k = (e % 128) / 32, l = e % 32;
    int lo = (ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15, hi = (qh[32 * h + l] >> (2 * k)) & 3;
    y[e] = d * (float)sc[e / 16] * (float)((lo | hi << 4) - 32);
  }
}

/* MXFP4's values (quant.h) */
const int8_t moe__fp4_x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* MXFP4: E8M0 scale, then 16 bytes: value i in the low nibble of byte i, value i + 16 in the high. */
static void deq_mxfp4(const uint8_t *b, float *y) {
  float d = moe__e8m0_half(b[0]);
  for (int i = 0; i < 16; i++) {
    y[i] = (float)moe__fp4_x2[b[1 + i] & 15] * d;
    y[i + 16] = (float)moe__fp4_x2[b[1 + i] >> 4] * d;
  }
}

/* ---------------------------------------------------------------- quantization, one block each */

static float amax_of(const float *x, int n, float *signed_max) {
  float a = 0, s = 0;
  for (int i = 0; i < n; i++)
    if (fabsf(x[i]) > a) a = fabsf(x[i]), s = x[i];
  if (signed_max) *signed_max = s;
  return a;
}

static void q_q8_0(const float *x, uint8_t *b) {
  float d = amax_of(x, 32, NULL) / 127, id = d ? 1 / d : 0;
  f16_put(b, d);
  for (int i = 0; i < 32; i++) b[2 + i] = (uint8_t)(int8_t)lrintf(roundf(x[i] * id));
}

static void q_q4_0(const float *x, uint8_t *b) {
  float max;
  amax_of(x, 32, &max);
  float d = max / -8, id = d ? 1 / d : 0; /* the largest magnitude maps to -8, the others within */
  f16_put(b, d);
  for (int i = 0; i < 16; i++) {
    int lo = (int)(x[i] * id + 8.5f), hi = (int)(x[i + 16] * id + 8.5f);
    b[2 + i] = (uint8_t)((lo > 15 ? 15 : lo) | (hi > 15 ? 15 : hi) << 4);
  }
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

void moe__kfit_steps_scalar(const moe__kfit *f, const float *x, int n, int nmax, float err[MOE__KFIT_STEPS],
                            float s[MOE__KFIT_STEPS], float b[MOE__KFIT_STEPS]) {
  for (int k = 0; k < MOE__KFIT_STEPS; k++) {
    float is = ((float)nmax + 0.1f * (float)(k - 10)) / (f->hi - f->lo), sl = 0, sl2 = 0, sxl = 0;
    int L[32];
    for (int i = 0; i < n; i++) {
      L[i] = clampi((int)lrintf(is * (x[i] - f->lo)), 0, nmax);
      sl += f->w[i] * (float)L[i], sl2 += f->w[i] * (float)(L[i] * L[i]), sxl += f->w[i] * (float)L[i] * x[i];
    }
    err[k] = INFINITY;
    if (!moe__kfit_solve(f->sw, f->swx, sl, sl2, sxl, &s[k], &b[k])) continue;
    float e = 0;
    for (int i = 0; i < n; i++) e += f->w[i] * (s[k] * (float)L[i] + b[k] - x[i]) * (s[k] * (float)L[i] + b[k] - x[i]);
    err[k] = e;
  }
}

float moe__kfit_scale_min(const float *x, int n, int nmax, float *m_out, int vector) {
  moe__kfit f = {x[0], x[0], {0}, 0, 0};
  float sx2 = 0;
  for (int i = 0; i < n; i++) f.lo = fminf(f.lo, x[i]), f.hi = fmaxf(f.hi, x[i]), sx2 += x[i] * x[i];
  if (f.lo > 0) f.lo = 0;
  *m_out = -f.lo;
  if (f.hi == f.lo) return 0;
  float rms = sqrtf(sx2 / (float)n);
  for (int i = 0; i < n; i++) f.w[i] = rms + fabsf(x[i]), f.sw += f.w[i], f.swx += f.w[i] * x[i];
  float err[MOE__KFIT_STEPS], s[MOE__KFIT_STEPS], b[MOE__KFIT_STEPS];
#ifdef HAVE_X86
  if (vector && moe__cpu_has(MOE__CPU_AVX512F)) moe__kfit_steps_avx512(&f, x, n, nmax, err, s, b);
  else
#endif
    moe__kfit_steps_scalar(&f, x, n, nmax, err, s, b);
  float best = INFINITY, bs = (f.hi - f.lo) / (float)nmax, bm = f.lo;
  for (int k = 0; k < MOE__KFIT_STEPS; k++) /* in step order: the first of equal errors */
    if (err[k] < best) best = err[k], bs = s[k], bm = b[k];
  *m_out = -bm;
  return bs;
}

/* Q4_K (nmax 15, qh NULL) and Q5_K (nmax 31): the sub-blocks' scales and mins as 6-bit multiples of
 * two f16 super-block scales, then each value re-rounded against the scale and min as stored. */
static void q_k4(const float *x, uint8_t *b, uint8_t *qh, uint8_t *qs, int nmax) {
  float sc[8], mn[8], max_s = 0, max_m = 0;
  for (int j = 0; j < 8; j++) {
    sc[j] = moe__kfit_scale_min(x + 32 * j, 32, nmax, &mn[j], 1);
    max_s = fmaxf(max_s, sc[j]), max_m = fmaxf(max_m, mn[j]);
  }
  float is = max_s > 0 ? 63 / max_s : 0, im = max_m > 0 ? 63 / max_m : 0;
  uint8_t *s = b + 4;
  memset(s, 0, 12);
  for (int j = 0; j < 8; j++) {
    int ls = clampi((int)lrintf(is * sc[j]), 0, 63), lm = clampi((int)lrintf(im * mn[j]), 0, 63);
    if (j < 4) {
      s[j] |= (uint8_t)ls, s[j + 4] |= (uint8_t)lm;
    } else {
      s[j + 4] = (uint8_t)((ls & 15) | (lm & 15) << 4);
      s[j - 4] |= (uint8_t)((ls >> 4) << 6), s[j] |= (uint8_t)((lm >> 4) << 6);
    }
  }
  f16_put(b, max_s / 63), f16_put(b + 2, max_m / 63);
  float d = f16_at(b), dmin = f16_at(b + 2);
  memset(qs, 0, 128);
  if (qh) memset(qh, 0, 32);
  uint8_t ls[8], lm[8];
  moe__k4_scales(s, ls, lm);
  for (int j = 0; j < 8; j++) {
    float dj = d * (float)ls[j], mj = dmin * (float)lm[j];
    for (int l = 0; l < 32; l++) {
      int v = dj > 0 ? clampi((int)lrintf((x[32 * j + l] + mj) / dj), 0, nmax) : 0;
      qs[32 * (j / 2) + l] |= (uint8_t)((v & 15) << (4 * (j & 1)));
      if (qh) qh[l] |= (uint8_t)((v >> 4) << j);
    }
  }
}

static void q_q4_K(const float *x, uint8_t *b) { q_k4(x, b, NULL, b + 16, 15); }
static void q_q5_K(const float *x, uint8_t *b) { q_k4(x, b, b + 16, b + 48, 31); }

/* A symmetric scale for 16 values with levels in [-32, 31]: candidate steps around max / -32 (the
 * value of largest magnitude at -32), each fitted by least squares weighted by x^2; the best kept. */
static float fit_scale_sym(const float *x) {
  float max;
  if (amax_of(x, 16, &max) == 0) return 0;
  float best = -1, scale = 0;
  for (int step = -9; step <= 9; step++) {
    float is = -(32 + 0.1f * (float)step) / max, sxl = 0, sl2 = 0;
    for (int i = 0; i < 16; i++) {
      float l = (float)clampi((int)lrintf(is * x[i]), -32, 31), w = x[i] * x[i];
      sxl += w * x[i] * l, sl2 += w * l * l;
    }
    if (sl2 > 0 && sxl * sxl / sl2 > best) best = sxl * sxl / sl2, scale = sxl / sl2;
  }
  return scale;
}

/* Q6_K: 16 sub-block scales as int8 multiples of an f16 d (the largest at -128), values re-rounded
 * against them. */
static void q_q6_K(const float *x, uint8_t *b) {
  float sc[16], max = 0;
  for (int j = 0; j < 16; j++) {
    sc[j] = fit_scale_sym(x + 16 * j);
    if (fabsf(sc[j]) > fabsf(max)) max = sc[j];
  }
  memset(b, 0, 210);
  if (max == 0) return; /* all zero: d = 0 */
  float is = -128 / max;
  f16_put(b + 208, 1 / is);
  float d = f16_at(b + 208);
  for (int j = 0; j < 16; j++) b[192 + j] = (uint8_t)(int8_t)clampi((int)lrintf(is * sc[j]), -128, 127);
  for (int e = 0; e < 256; e++) {
    float dj = d * (float)(int8_t)b[192 + e / 16];
    int v = dj != 0 ? clampi((int)lrintf(x[e] / dj), -32, 31) + 32 : 32;
    int h = e / 128, k = (e % 128) / 32, l = e % 32;
    b[64 * h + 32 * (k % 2) + l] |= (uint8_t)((v & 15) << (4 * (k / 2)));
    b[128 + 32 * h + l] |= (uint8_t)((v >> 4) << (2 * k));
  }
}

/* The doubled e2m1 level nearest x / d (the first of equals). */
static int nearest_fp4(float x, float d) {
  int best = 0;
  for (int i = 1; i < 16; i++)
    if (fabsf((float)moe__fp4_x2[i] * d - x) < fabsf((float)moe__fp4_x2[best] * d - x)) best = i;
  return best;
}

/* MXFP4: the scale 2^(floor(log2 amax) - 2), so that amax lands in [4, 8) of the e2m1 range (max 6). */
static void q_mxfp4(const float *x, uint8_t *b) {
  float amax = amax_of(x, 32, NULL);
  int e = amax > 0 ? clampi(ilogbf(amax) - 2 + 127, 0, 254) : 0;
  float d = moe__e8m0_half(e);
  b[0] = (uint8_t)e;
  for (int i = 0; i < 16; i++) b[1 + i] = (uint8_t)(nearest_fp4(x[i], d) | nearest_fp4(x[i + 16], d) << 4);
}

/* ---------------------------------------------------------------- rows */

/* Blocks are independent: from this many on, they are split over threads (the bytes do not change). */
#define PAR_BLOCKS 256

typedef void (*deq_fn)(const uint8_t *, float *);
typedef void (*q_fn)(const float *, uint8_t *);

static void codecs(moe_gguf_type t, deq_fn *deq, q_fn *q) {
  *deq = NULL, *q = NULL;
  switch (t) {
    case MOE_GGUF_Q8_0: *deq = deq_q8_0, *q = q_q8_0; break;
    case MOE_GGUF_Q4_0: *deq = deq_q4_0, *q = q_q4_0; break;
    case MOE_GGUF_Q4_K: *deq = deq_q4_K, *q = q_q4_K; break;
    case MOE_GGUF_Q5_K: *deq = deq_q5_K, *q = q_q5_K; break;
    case MOE_GGUF_Q6_K: *deq = deq_q6_K, *q = q_q6_K; break;
    case MOE_GGUF_MXFP4: *deq = deq_mxfp4, *q = q_mxfp4; break;
    default: break;
  }
}

static moe_status check_row(moe_gguf_type t, int64_t n, const char *what) {
  MOE_TRY(moe_gguf_type_supported(t), MOE_ERR_DTYPE, "%s: tensor type %s (%d) has no codec here", what,
          moe_gguf_type_name(t) ? moe_gguf_type_name(t) : "unknown", (int)t);
  int blk = moe_gguf_type_block(t);
  MOE_TRY(n >= 0 && n % blk == 0, MOE_ERR_ARG, "%s: %lld values are not a whole number of %s blocks of %d", what,
          (long long)n, moe_gguf_type_name(t), blk);
  return MOE_OK;
}

moe_status moe_gguf_dequantize(moe_gguf_type t, const void *src, float *dst, int64_t n) {
  MOE_CHECK(check_row(t, n, "moe_gguf_dequantize"));
  const uint8_t *p = src;
  if (t == MOE_GGUF_F32) {
    memcpy(dst, src, (size_t)n * 4);
  } else if (t == MOE_GGUF_F16) {
    for (int64_t i = 0; i < n; i++) dst[i] = f16_at(p + 2 * i);
  } else if (t == MOE_GGUF_BF16) {
    for (int64_t i = 0; i < n; i++) {
      uint32_t u = (uint32_t)(p[2 * i] | p[2 * i + 1] << 8) << 16;
      memcpy(&dst[i], &u, 4);
    }
  } else {
    deq_fn deq;
    q_fn q;
    codecs(t, &deq, &q);
    int blk = moe_gguf_type_block(t);
    size_t bb = moe_gguf_type_block_bytes(t);
    int64_t nb = n / blk;
#pragma omp parallel for schedule(static) num_threads(moe__threads(0)) if (nb >= PAR_BLOCKS)
    for (int64_t i = 0; i < nb; i++) deq(p + (size_t)i * bb, dst + i * blk);
  }
  return MOE_OK;
}

moe_status moe_gguf_quantize(moe_gguf_type t, const float *src, void *dst, int64_t n) {
  MOE_CHECK(check_row(t, n, "moe_gguf_quantize"));
  int f16_bound = t != MOE_GGUF_F32 && t != MOE_GGUF_BF16 && t != MOE_GGUF_MXFP4;
  for (int64_t i = 0; i < n; i++)
    MOE_TRY(isfinite(src[i]) && (!f16_bound || fabsf(src[i]) <= 65504), MOE_ERR_VALUE,
            "moe_gguf_quantize: value %lld is %g, %s for %s", (long long)i, src[i],
            isfinite(src[i]) ? "beyond the f16 range (+-65504)" : "not finite", moe_gguf_type_name(t));
  uint8_t *p = dst;
  if (t == MOE_GGUF_F32) {
    memcpy(dst, src, (size_t)n * 4);
  } else if (t == MOE_GGUF_F16) {
    for (int64_t i = 0; i < n; i++) f16_put(p + 2 * i, src[i]);
  } else if (t == MOE_GGUF_BF16) {
    for (int64_t i = 0; i < n; i++) {
      uint16_t h = moe__bf16(src[i]);
      p[2 * i] = (uint8_t)h, p[2 * i + 1] = (uint8_t)(h >> 8);
    }
  } else {
    deq_fn deq;
    q_fn q;
    codecs(t, &deq, &q);
    int blk = moe_gguf_type_block(t);
    size_t bb = moe_gguf_type_block_bytes(t);
    int64_t nb = n / blk;
#pragma omp parallel for schedule(static) num_threads(moe__threads(0)) if (nb >= PAR_BLOCKS)
    for (int64_t i = 0; i < nb; i++) q(src + i * blk, p + (size_t)i * bb);
  }
  return MOE_OK;
}
