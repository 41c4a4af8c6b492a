/* The GGUF tensor types' internals (quant.c, quant_dot.c, quant_dot_k.c): half-precision conversions,
 * the activations quantized per block as each weight type's dot product needs, and the dot products of
 * a quantized weight row with such activations, each in a scalar, an AVX2 and an AVX-512 version chosen
 * at run time by the CPU's features.
 *
 * Every dot product sums integer products exactly (in int32: no value or byte pattern overflows it)
 * and then follows a fixed order of float steps, each product and sum a separate rounding (no fused
 * multiply-add; separate statements, so that no compiler contracts them): so the versions give the
 * same bits, and a row's result does not depend on how many rows a call computes with it. With dw
 * the weight block's scales and da the activation block's:
 *   Q8_0, Q4_0, MXFP4 (32-value blocks): sixteen float lanes, as a 512-bit vector holds them; group k
 *                of block b (its values 4k..4k+3, whose products a vpdpbusd lane sums) adds to lane
 *                8 (b % 2) + k:  lane += (float)g * (dw * da); the lanes summed by moe__lanes16_sum.
 *                (MXFP4: g over the doubled e2m1 values, dw = 2^(e - 128).) No horizontal sum per
 *                block and no chain of one add per block: the vector versions keep the lanes.
 *   Q4_K, Q5_K, Q6_K (256-value blocks): the same sixteen lanes, each the int32 sum of an AVX-512
 *                vpdpwssd lane (quant_dot_k.c says which values and scales go to which lane):
 *                lane += (dw * da) * (float)isum_lane; Q4_K and Q5_K then lane -= (dmin * da) * (float)msum_j
 *                for lanes j < 8 (msum_j = min_j times the activations' sum over sub-block j); Q6_K's
 *                offset of 32 is in the integer lanes 0-7. Summed by moe__lanes16_sum.
 *   BF16, F16:   fp32 activations as they are; value i of the row (padded with zeros to whole sixteens)
 *                into lane i % 16 by one fused multiply-add, lane = fma(w_i, x_i, lane), in order of i;
 *                summed by moe__lanes16_sum (quant_dot_float.c). */
#ifndef MOE_QUANT_H
#define MOE_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "moe.h"

/* IEEE binary16 to float (exact) and back (round to nearest even; overflow to infinity, NaN kept).
 * moe__half is the first, inline for the kernels: the bits assembled, a subnormal half scaled (exact). */
static inline float moe__half(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 1023, u;
  float f;
  if (e == 0) {
    f = (float)m * 0x1p-24f;
    return h & 0x8000 ? -f : f;
  }
  u = e == 31 ? (m ? 0x7fc00000u : 0x7f800000u) : (e + 112) << 23 | m << 13; /* a NaN: the quiet one */
  u |= sign;
  memcpy(&f, &u, 4);
  return f;
}
float moe__f16_to_f32(uint16_t h);

/* The K-quants' scale and min of a sub-block of n <= 32 values (x ~ s L - m, L in [0, nmax]: Q4_K,
 * Q5_K): for 21 candidate steps around (max - min) / nmax the levels rounded, (s, -m) fitted by least
 * squares weighted by |x| + rms, the fit of least error kept (the first of equals). The steps' sums
 * run each in value order, so the AVX-512 version (vector nonzero on a CPU with it: the steps in the
 * lanes) gives the scalar one's bits; returns s, and m in *m_out. */
#define MOE__KFIT_STEPS 21
typedef struct {
  float lo, hi, w[32], sw, swx;
} moe__kfit;
float moe__kfit_scale_min(const float *x, int n, int nmax, float *m_out, int vector);
/* (s, b) of a step from its sums; 0 when they fit no line. */
static inline int moe__kfit_solve(float sw, float swx, float sl, float sl2, float sxl, float *s, float *b) {
  float det = sw * sl2 - sl * sl;
  if (!(det > 0)) return 0;
  *s = (sw * sxl - swx * sl) / det, *b = (sl2 * swx - sl * sxl) / det;
  if (*b > 0) *b = 0, *s = sxl / sl2; /* the offset may only lower the values */
  return 1;
}
/* Each step's error (INFINITY where it fits no line), scale and offset. */
void moe__kfit_steps_scalar(const moe__kfit *f, const float *x, int n, int nmax, float err[MOE__KFIT_STEPS],
                            float s[MOE__KFIT_STEPS], float b[MOE__KFIT_STEPS]);
void moe__kfit_steps_avx512(const moe__kfit *f, const float *x, int n, int nmax, float err[MOE__KFIT_STEPS],
                            float s[MOE__KFIT_STEPS], float b[MOE__KFIT_STEPS]);
uint16_t moe__f32_to_f16(float f);

/* The 32-value block types, and the sum of their sixteen lanes (quant.h's order above): lanes k and
 * k + 8, then those sums' k and k + 4, then k and k + 2, then the two (a 512-bit vector's halving). */
enum { MOE__B32_Q8_0, MOE__B32_Q4_0, MOE__B32_MXFP4 };
static inline float moe__lanes16_sum(const float l[16]) {
  float s[8], t[4], u[2];
  for (int k = 0; k < 8; k++) s[k] = l[k] + l[k + 8];
  for (int k = 0; k < 4; k++) t[k] = s[k] + s[k + 4];
  for (int k = 0; k < 2; k++) u[k] = t[k] + t[k + 2];
  return u[0] + u[1];
}

/* The dot product of two Q8_0 rows of n values (n a multiple of 32), any bytes, in the order above;
 * the versions give the same bits (NaN where the second row's copy as activations cannot be
 * allocated). moe__dot_q8_0 is the best version of the CPU (moe__dot_q8_0_avx2 returns 0 when not built
 * for x86-64: ask moe__dot_q8_0_has_avx2 first). */
float moe__dot_q8_0(const void *a, const void *b, int64_t n);
float moe__dot_q8_0_scalar(const void *a, const void *b, int64_t n);
float moe__dot_q8_0_avx2(const void *a, const void *b, int64_t n);
int moe__dot_q8_0_has_avx2(void);

/* The eight 6-bit scales and mins of Q4_K's and Q5_K's 12 packed bytes s, four bytes at a time:
 * bytes 0-3 hold scales 0-3 in their low six bits and the top two bits of scales 4-7, bytes 4-7 the
 * same for the mins, bytes 8-11 the low four bits of scales 4-7 (low nibbles) and mins 4-7 (high). */
static inline uint32_t moe__le32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static inline void moe__put32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}
static inline void moe__k4_scales(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
  uint32_t a = moe__le32(s), m = moe__le32(s + 4), c = moe__le32(s + 8);
  moe__put32(sc, a & 0x3f3f3f3fu);
  moe__put32(mn, m & 0x3f3f3f3fu);
  moe__put32(sc + 4, (c & 0x0f0f0f0fu) | ((a >> 6) & 0x03030303u) << 4);
  moe__put32(mn + 4, ((c >> 4) & 0x0f0f0f0fu) | ((m >> 6) & 0x03030303u) << 4);
}

/* MXFP4: the e2m1 values doubled (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, times 2), and the
 * E8M0 scale halved, 2^(e - 128), as the doubled values need (bits assembled: exact, no libm). */
extern const int8_t moe__fp4_x2[16];
static inline float moe__e8m0_half(int e) {
  uint32_t u = e >= 2 ? (uint32_t)(e - 1) << 23 : 0x00200000u << e; /* e 0 and 1: subnormal */
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Activations for the K-quants (ggml's Q8_K): 256 values as int8 in [-127, 127] times d, with the sums
 * of each 16 (what the weights' mins and offsets multiply). */
typedef struct {
  float d;
  int8_t q[256];
  int16_t sums[16];
} moe__q8k;

/* The kernels' versions (each CPU with one has those before it). */
typedef enum { MOE__ISA_SCALAR, MOE__ISA_AVX2, MOE__ISA_AVX512 } moe__isa;

/* The weight types with dot products here (Q8_0, Q4_0, MXFP4, Q4_K, Q5_K, Q6_K, BF16, F16). */
int moe__qdot_has(moe_gguf_type w);
/* The activations' format for weights of type w: for Q8_0, Q4_0 and MXFP4, Q8_0 blocks (exactly the
 * values and scales moe_gguf_quantize(Q8_0) writes) laid out as the kernels read them, per pair of
 * blocks (64 values) a slot of MOE__ACT_PAIR_BYTES: the 64 values made unsigned (the int8 byte xor
 * 0x80: a + 128, what vpdpbusd takes), then 16 floats, block 2p's scale eight times and block
 * 2p + 1's eight times (one load each, no f16 to convert per weight row); an odd last block fills
 * the first half of its slot, the rest zero. moe__q8k for the K-quants. The fp32 values themselves
 * for BF16 and F16. Rows of n values (a multiple of w's block): their bytes, the quantizer (values in
 * [-127, 127]; a row with a value that is not finite gets a NaN scale, so that its dot products are
 * NaN; for BF16 and F16 a copy), the same layout made from Q8_0 bytes (any bytes: for tests and
 * references), and the inverse (for references). */
#define MOE__ACT_PAIR_BYTES 128
enum { MOE__ACT_Q8_0, MOE__ACT_Q8_K, MOE__ACT_F32, MOE__ACT_FORMATS };
int moe__act_format(moe_gguf_type w); /* which of the three formats weights of type w take */
size_t moe__act_bytes(moe_gguf_type w, int64_t n);
void moe__act_quantize(moe_gguf_type w, const float *x, void *a, int64_t n);   /* moe__qdot_best's version */
void moe__act_quantize_by(moe__isa isa, moe_gguf_type w, const float *x, void *a, int64_t n); /* isa's (for tests) */
void moe__act_from_q8_0(const void *q8_0, void *a, int64_t n);
void moe__act_dequantize(moe_gguf_type w, const void *a, float *x, int64_t n);

/* out[r] = the dot product of the weight row w (n values of its type) with activation row r, at
 * a + r * astride bytes, for r < nr (1 to MOE__QDOT_ROWS): each weight block is decoded once for the
 * nr rows (8 of them: half the decoding a row of 4, and the AVX-512 versions' registers hold it). */
#define MOE__QDOT_ROWS 8
typedef void (*moe__qdot_fn)(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
/* Four weight rows at once (wb bytes apart) against nr activation rows (1 to MOE__QDOT4_ROWS): out[j *
 * MOE__QDOT4_ROWS + r] for weight row j, each the bits of the one-row kernel's product (where a type
 * has one: a prefill reuses each activation load four times). */
#define MOE__QDOT4_ROWS 4
typedef void (*moe__qdot4_fn)(const void *w, size_t wb, const void *a, size_t astride, int nr, int64_t n, float *out);
/* A decode's run of weight rows: k (1 to MOE__QRUN_ROWS) rows wb bytes apart, read one after another
 * (the order a one-row kernel called on each reads them), against one activation row: out[j] for row
 * j, each the bits of the one-row kernel's product. Summing four rows' lanes at once and calling once
 * for four rows is what a short row needs: a Q4_K row of 1024 values is four blocks, and the one-row
 * kernel spent about as long on its call and its lanes' sum as on two of them. */
#define MOE__QRUN_ROWS 4
typedef void (*moe__qrun_fn)(const void *w, size_t wb, int k, const void *a, int64_t n, float *out);
/* The best version this CPU runs (decided once), its name ("AVX-512 VNNI", "AVX2", "scalar"), and the kernel of
 * weight type w in version isa (NULL: no kernel for w, or isa not on this CPU / not built). */
moe__isa moe__qdot_best(void);
const char *moe__isa_name(moe__isa isa);
moe__qdot_fn moe__qdot_kernel(moe_gguf_type w, moe__isa isa);
moe__qdot4_fn moe__qdot4_kernel(moe_gguf_type w, moe__isa isa); /* NULL: none (then one row at a time) */
moe__qrun_fn moe__qrun_kernel(moe_gguf_type w, moe__isa isa);   /* NULL: none (then a call a row) */
/* The AVX-512 Q4_K and Q5_K run kernels split their nibbles by GFNI's affine byte transform where the
 * CPU has GFNI (one instruction a vector for a masked shift and an and; the same bits); 0 turns that
 * off for the process (the tests run both), 1 back on. */
void moe__qrun_gfni(int on);

/* quant_dot_k.c: the K-quants' kernels (moe__qdot_kernel hands them out). */
void moe__qdot_q4_K_scalar(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qdot_q5_K_scalar(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qdot_q6_K_scalar(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qdot_q4_K_avx2(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qdot_q5_K_avx2(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qdot_q6_K_avx2(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
/* quant_dot_float.c: BF16 and F16 weights (the vector versions defined on x86-64 only). */
void moe__qdot_bf16_scalar(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qdot_f16_scalar(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qdot_bf16_avx2(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qdot_f16_avx2(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qdot_bf16_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qdot_f16_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qdot4_bf16_avx512(const void *w, size_t wb, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qdot4_f16_avx512(const void *w, size_t wb, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qrun_bf16_avx512(const void *w, size_t wb, int k, const void *a, int64_t n, float *out);
void moe__qrun_f16_avx512(const void *w, size_t wb, int k, const void *a, int64_t n, float *out);
/* quant_dot_avx512.c: the AVX-512 versions (defined on x86-64 only; handed out by moe__qdot_kernel). */
void moe__qdot_q8_0_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qdot_q4_0_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qdot_mxfp4_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qdot_q4_K_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qdot_q5_K_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__qdot_q6_K_avx512(const void *w, const void *a, size_t astride, int nr, int64_t n, float *out);
void moe__act_q8_0_avx512(const float *x, uint8_t *b);      /* 32 values into a Q8_0 block (34 bytes) */
void moe__act_q8_K_avx512(const float *x, moe__q8k *b);     /* 256 values */
void moe__qrun_q8_0_avx512(const void *w, size_t wb, int k, const void *a, int64_t n, float *out);
void moe__qrun_q4_0_avx512(const void *w, size_t wb, int k, const void *a, int64_t n, float *out);
void moe__qrun_mxfp4_avx512(const void *w, size_t wb, int k, const void *a, int64_t n, float *out);
void moe__qrun_q4_K_avx512(const void *w, size_t wb, int k, const void *a, int64_t n, float *out);
void moe__qrun_q5_K_avx512(const void *w, size_t wb, int k, const void *a, int64_t n, float *out);
void moe__qrun_q6_K_avx512(const void *w, size_t wb, int k, const void *a, int64_t n, float *out);
void moe__qrun_q4_K_gfni_avx512(const void *w, size_t wb, int k, const void *a, int64_t n, float *out);
void moe__qrun_q5_K_gfni_avx512(const void *w, size_t wb, int k, const void *a, int64_t n, float *out);

#endif
