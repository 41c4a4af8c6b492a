/* bfloat16 conversions (a bf16 is the upper half of a float32; rounding in internal.h) and the
 * compute-dtype names. Plain loops the compiler vectorizes, split over threads when long. */
#include <string.h>

#include "kernels/gemm.h"
#include "internal.h"

#define PAR_MIN (1 << 16) /* below this many values, threads cost more than they give */

void moe__to_bf16(uint16_t *dst, const float *src, size_t n, int nt) {
#pragma omp parallel for simd num_threads(nt) schedule(static) if (n >= PAR_MIN)
  for (size_t i = 0; i < n; i++) dst[i] = moe__bf16(src[i]);
}

void moe_bf16_from_f32(uint16_t *dst, const float *src, size_t n) { moe__to_bf16(dst, src, n, moe__threads(0)); }

void moe__from_bf16(float *dst, const uint16_t *src, size_t n, int nt) {
#pragma omp parallel for simd num_threads(nt) schedule(static) if (n >= PAR_MIN)
  for (size_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)src[i] << 16;
    memcpy(&dst[i], &u, 4);
  }
}

void moe_bf16_to_f32(float *dst, const uint16_t *src, size_t n) { moe__from_bf16(dst, src, n, moe__threads(0)); }

moe_status moe_dtype_parse(const char *s, const char *field, moe_dtype *out) {
  static const char *const names[] = {"f32", "bf16"};
  static const moe_dtype dts[] = {MOE_DT_F32, MOE_DT_BF16};
  int i;
  MOE_CHECK(moe__parse_name(s, field, names, 2, &i));
  *out = dts[i];
  return MOE_OK;
}

const char *moe_compute_dtype_name(moe_dtype dt) { return dt == MOE_DT_BF16 ? "bf16" : "f32"; }
