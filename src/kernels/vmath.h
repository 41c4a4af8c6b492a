/* glibc's vector math (libmvec) under the x86-64 vector ABI's names: erff and expf on 16 floats, for
 * AVX-512 builds. Within a few ulp of the scalar functions and many times faster (tests/test_act.c,
 * tests/test_lm_kernels.c bound their users against double precision). */
#ifndef MOE_VMATH_H
#define MOE_VMATH_H

#ifdef __AVX512F__
#include <immintrin.h>
#include <stddef.h>
__m512 _ZGVeN16v_erff(__m512 x);
__m512 _ZGVeN16v_expf(__m512 x);

/* The mask of the first min(left, 16) lanes. */
static inline __mmask16 moe__lanes(size_t left) {
  return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}
#endif

#endif
