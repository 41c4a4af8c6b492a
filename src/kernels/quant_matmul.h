/* Products of quantized weight rows with activation rows quantized per block (quant.h's dot
 * products): y (T, O) = x (T, I) W^T for W in a GGUF type with a dot kernel. The experts of a
 * quantized layer (sources/quant.c) and the language model's quantized dense weights (lm_model.c)
 * both compute through here. Every output is one dot product of its weight row and its activation
 * row, whatever the split over threads or the rows beside it: the results are the same bits for any
 * thread count or batch. */
#ifndef MOE_QUANT_MATMUL_H
#define MOE_QUANT_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/quant.h"
#include "kernels/work.h"

/* A weight matrix of `rows` rows of `cols` values in type `type` (a multiple of its block), row r at
 * w + r * moe__qrow_bytes(type, cols). type 0 (F32) with w NULL: none. */
typedef struct {
  moe_gguf_type type;
  const uint8_t *w;
  int rows, cols;
} moe__qmat;

/* Bytes of a row of n values of type t (n a multiple of its block). */
size_t moe__qrow_bytes(moe_gguf_type t, int64_t n);
/* Whether a weight of rows n values long can be computed quantized: t has a dot kernel and n is
 * whole blocks of it. */
int moe__qmat_fits(moe_gguf_type t, int64_t n);

/* Weight rows dotted with every activation row before the next ones (moe__qrows_times). */
#define MOE__QROWS_TILE 16
/* The dot kernels of a weight type on this CPU (moe__qdot_best's), looked up once per product rather
 * than per span of rows. */
typedef struct {
  moe__qdot_fn dot;
  moe__qdot4_fn dot4; /* NULL: none (then one weight row at a time) */
  moe__qrun_fn run;   /* a decode's runs of rows; NULL: none (then a call a row) */
} moe__qkern;
moe__qkern moe__qkern_of(moe_gguf_type t);

/* out[r * ldo + o] (+= with add) for activation rows r < m (at in + r * ab, n values quantized for
 * the weights' type) and weight rows o in [o0, o1) (at w + o * wb) of the type whose kernels k are, on
 * the calling thread. The weight rows are taken 16 at a time and each dotted with the activation rows
 * MOE__QDOT_ROWS at a time (four weight rows with MOE__QDOT4_ROWS where the type has k.dot4), so
 * that the 16 rows stay in cache while every activation row reads them: with one activation row a
 * GEMV, with many a GEMM that reads each weight row from memory once. */
void moe__qrows_times(const moe__qkern *k, const uint8_t *w, size_t wb, int o0, int o1, const uint8_t *in, size_t ab,
                      int m, int n, float *out, int ldo, int add);

/* Bytes of the scratch moe__qmatmul needs for T activation rows of up to I values, any weight types. */
size_t moe__qmatmul_scratch(int T, int I);
/* y = x W_0^T | x W_1^T | ... (the nw matrices' outputs side by side in y's columns, all with x's
 * width cols): x (T, cols) ldx floats apart, y (T, sum of rows) ldy apart, overwritten or (add) added
 * to (y apart from x). x is quantized once for each activation format the weights need, into scratch
 * (BF16 and F16 weights read x itself); then the weight rows are spread over nt OpenMP threads. */
void moe__qmatmul(const moe__qmat *w, int nw, const float *x, int T, int ldx, float *y, int ldy, int add,
                  void *scratch, int nt);

#endif
