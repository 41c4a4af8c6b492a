/* Softmax cross-entropy over the vocabulary. Forward keeps each row's log-sum-exp; backward turns
 * the logits into their gradient in place (llm.c's fused softmax backward), so no probability
 * matrix is stored. The exponentials go 16 at a time through glibc's vector expf on AVX-512 builds. */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "kernels/vmath.h"

double moe__xent_forward(const float *logits, const int32_t *targets, int n, int V, float *lse, int *count, int nt) {
  double total = 0;
  int cnt = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(+ : total, cnt)
  for (int i = 0; i < n; i++) {
    const float *r = logits + (size_t)i * V;
    float mx = -INFINITY;
    for (int j = 0; j < V; j++) mx = r[j] > mx ? r[j] : mx;
    double s = 0;
#ifdef __AVX512F__
    for (int j = 0; j < V; j += 16) { /* 16 exponentials at a time, summed in the scalar loop's order */
      __mmask16 m = moe__lanes((size_t)(V - j));
      float e[16];
      _mm512_storeu_ps(e, _mm512_maskz_mov_ps(m, _ZGVeN16v_expf(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, r + j),
                                                                               _mm512_set1_ps(mx)))));
      for (int q = 0; q < 16 && j + q < V; q++) s += e[q];
    }
#else
    for (int j = 0; j < V; j++) s += expf(r[j] - mx);
#endif
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
#ifdef __AVX512F__
    for (int j = 0; j < V; j += 16) {
      __mmask16 m = moe__lanes((size_t)(V - j));
      __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, r + j), _mm512_set1_ps(lse[i]));
      _mm512_mask_storeu_ps(r + j, m, _mm512_mul_ps(_ZGVeN16v_expf(x), _mm512_set1_ps(scale)));
    }
#else
    for (int j = 0; j < V; j++) r[j] = expf(r[j] - lse[i]) * scale;
#endif
    r[targets[i]] -= scale;
  }
}
