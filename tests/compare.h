/* Comparing a computed tensor against a reference, for the tests. */
#ifndef MOE_TEST_COMPARE_H
#define MOE_TEST_COMPARE_H

#include <stddef.h>

#include "moe.h"

/* max|a - b| <= rtol * max|b| + atol; on failure prints name, max abs/rel error and the first bad
 * index to stderr. Returns 1 when close. */
int tensors_close(const char *name, const float *a, const float *b, size_t n, double rtol, double atol);

/* Frobenius norms: |a - b| <= tol |b|; on failure prints name and both norms. Returns 1 when close. */
int tensors_close_norm(const char *name, const float *a, const float *b, size_t n, double tol);

/* Whether tensor `name` of f has dtype dt; prints what it has otherwise. */
int tensor_dtype_is(const moe_st *f, const char *name, moe_dtype dt);

#endif
