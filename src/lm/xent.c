/* Softmax cross-entropy over the vocabulary. Forward keeps each row's log-sum-exp; backward turns
 * the logits into their gradient in place (llm.c's fused softmax backward), so no probability
 * matrix is stored. */
#include <math.h>
#include <string.h>

#include "kernels.h"

double moe__xent_forward(const float *logits, const int32_t *targets, int n, int V, float *lse, int *count, int nt) {
  double total = 0;
  int cnt = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(+ : total, cnt)
  for (int i = 0; i < n; i++) {
    const float *r = logits + (size_t)i * V;
    float mx = -INFINITY;
    for (int j = 0; j < V; j++) mx = r[j] > mx ? r[j] : mx;
    double s = 0;
    for (int j = 0; j < V; j++) s += expf(r[j] - mx);
    lse[i] = mx + (float)log(s);
    if (targets[i] >= 0) {
      total += (double)lse[i] - r[targets[i]];
      cnt++;
    }
  }
  *count = cnt;
  return total;
}

void moe__xent_backward(float *logits, const float *lse, const int32_t *targets, int n, int V, float scale, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int i = 0; i < n; i++) {
    float *r = logits + (size_t)i * V;
    if (targets[i] < 0) {
      memset(r, 0, (size_t)V * sizeof *r);
      continue;
    }
    for (int j = 0; j < V; j++) r[j] = expf(r[j] - lse[i]) * scale;
    r[targets[i]] -= scale;
  }
}
