/* The GGUF tensor types' internals (quant.c, quant_dot.c): half-precision conversions and the Q8_0
 * dot product in its scalar and AVX2 versions, the latter chosen at run time by the CPU's features. */
#ifndef MOE_QUANT_H
#define MOE_QUANT_H

#include <stdint.h>

#include "moe.h"

/* IEEE binary16 to float (exact) and back (round to nearest even; overflow to infinity, NaN kept). */
float moe__f16_to_f32(uint16_t h);
uint16_t moe__f32_to_f16(float f);

/* The dot product of two Q8_0 rows of n values (n a multiple of 32): per block, the exact integer sum
 * of the products times d_a * d_b, summed in block order; both versions give the same bits.
 * moe__dot_q8_0 is the AVX2 one when the CPU has AVX2 (moe__dot_q8_0_avx2 returns 0 when not built
 * for x86-64: ask moe__dot_q8_0_has_avx2 first). */
float moe__dot_q8_0(const void *a, const void *b, int64_t n);
float moe__dot_q8_0_scalar(const void *a, const void *b, int64_t n);
float moe__dot_q8_0_avx2(const void *a, const void *b, int64_t n);
int moe__dot_q8_0_has_avx2(void);

#endif
