/* The quantized matmul (src/kernels/quant_matmul.c), y = x W^T over several weight matrices side by
 * side: each output against a float64 sum over the dequantized weights (moe_gguf_dequantize) and the
 * activations as moe__act_dequantize gives them back; the same bits for 1 and 3 threads, for one row
 * at a time and all rows at once, and with add, exactly y's old value plus the product. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kernels/quant_matmul.h"
#include "test.h"

/* Three matrices of types a, b, c (rows 40, 24, 70: not multiples of the 16-row tiles) over I columns,
 * T rows of x. */
static void check_parts(int *failed_, moe_gguf_type ta, moe_gguf_type tb, moe_gguf_type tc, int I, int T) {
  moe_gguf_type types[3] = {ta, tb, tc};
  int rows[3] = {40, 24, 70}, O = 134;
  uint64_t seed = 11;
  float *wf = malloc((size_t)O * I * 4), *x = malloc((size_t)T * I * 4), *xa = malloc((size_t)I * 4);
  float *y1 = malloc((size_t)T * O * 4), *y3 = malloc((size_t)T * O * 4), *yr = malloc((size_t)T * O * 4);
  uint8_t *wq[3], *scratch = malloc(moe__qmatmul_scratch(T, I)), *xq = malloc(moe__act_bytes(MOE_GGUF_Q4_K, I) + moe__act_bytes(MOE_GGUF_Q8_0, I));
  moe__qmat w[3];
  ASSERT(wf && x && xa && y1 && y3 && yr && scratch && xq);
  for (size_t i = 0; i < (size_t)O * I; i++) wf[i] = 0.05f * moe__uniform(&seed);
  for (size_t i = 0; i < (size_t)T * I; i++) x[i] = moe__uniform(&seed);
  for (int j = 0, r0 = 0; j < 3; r0 += rows[j], j++) {
    wq[j] = malloc(moe__qrow_bytes(types[j], (int64_t)rows[j] * I));
    ASSERT(wq[j]);
    ASSERT_OK(moe_gguf_quantize(types[j], wf + (size_t)r0 * I, wq[j], (int64_t)rows[j] * I));
    ASSERT_OK(moe_gguf_dequantize(types[j], wq[j], wf + (size_t)r0 * I, (int64_t)rows[j] * I));
    w[j] = (moe__qmat){types[j], wq[j], rows[j], I};
  }
  moe__qmatmul(w, 3, x, T, I, y1, O, 0, scratch, 1);
  moe__qmatmul(w, 3, x, T, I, y3, O, 0, scratch, 3);
  ASSERT(!memcmp(y1, y3, (size_t)T * O * 4));
  for (int t = 0; t < T; t++) { /* one row alone: the same bits */
    moe__qmatmul(w, 3, x + (size_t)t * I, 1, I, yr + (size_t)t * O, O, 0, scratch, 2);
    ASSERT(!memcmp(yr + (size_t)t * O, y1 + (size_t)t * O, (size_t)O * 4));
  }
  double worst = 0;
  for (int t = 0; t < T; t++)
    for (int j = 0, r0 = 0; j < 3; r0 += rows[j], j++) {
      moe__act_quantize(types[j], x + (size_t)t * I, xq, I);
      moe__act_dequantize(types[j], xq, xa, I);
      for (int o = 0; o < rows[j]; o++) {
        double ref = 0, mag = 0;
        for (int i = 0; i < I; i++) {
          ref += (double)wf[(size_t)(r0 + o) * I + i] * xa[i];
          mag += fabs((double)wf[(size_t)(r0 + o) * I + i] * xa[i]);
        }
        double e = fabs(y1[(size_t)t * O + r0 + o] - ref) / mag;
        worst = e > worst ? e : worst;
      }
    }
  if (worst > 1e-5) FAIL_("%s %s %s: relative error %g against the float64 sum", moe_gguf_type_name(ta),
                          moe_gguf_type_name(tb), moe_gguf_type_name(tc), worst);
  for (size_t i = 0; i < (size_t)T * O; i++) yr[i] = y3[i] = (float)i * 0.25f;
  moe__qmatmul(w, 3, x, T, I, y3, O, 1, scratch, 2);
  for (size_t i = 0; i < (size_t)T * O; i++) ASSERT(y3[i] == yr[i] + y1[i]);
  for (int j = 0; j < 3; j++) free(wq[j]);
  free(wf), free(x), free(xa), free(y1), free(y3), free(yr), free(scratch), free(xq);
}

TEST(quant_matmul_against_float64_and_the_same_bits_for_any_split) {
  check_parts(failed_, MOE_GGUF_Q8_0, MOE_GGUF_Q4_K, MOE_GGUF_Q6_K, 512, 7); /* both activation formats in one call */
  check_parts(failed_, MOE_GGUF_Q4_0, MOE_GGUF_MXFP4, MOE_GGUF_Q5_K, 256, 5);
  check_parts(failed_, MOE_GGUF_Q8_0, MOE_GGUF_Q8_0, MOE_GGUF_Q8_0, 96, 9);  /* 32-value blocks alone: I not of 256 */
  check_parts(failed_, MOE_GGUF_Q4_K, MOE_GGUF_Q4_K, MOE_GGUF_Q4_K, 256, 8);
}
