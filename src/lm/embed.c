/* Token embedding: a row gather forward, a scatter-add backward (serial: rows of repeated tokens
 * add into the same gradient row). */
#include <string.h>

#include "kernels.h"

void moe__embed_forward(const float *table, const int32_t *tokens, int n, int d, float *x) {
  for (int i = 0; i < n; i++) memcpy(x + (size_t)i * d, table + (size_t)tokens[i] * d, (size_t)d * sizeof *x);
}

void moe__embed_backward(float *dtable, const int32_t *tokens, int n, int d, const float *dx) {
  for (int i = 0; i < n; i++) {
    float *g = dtable + (size_t)tokens[i] * d;
    const float *r = dx + (size_t)i * d;
    for (int j = 0; j < d; j++) g[j] += r[j];
  }
}
