/* Rotary position embeddings with Hugging Face's rotate_half layout: dimension i of a head pairs
 * with i + hd/2 and turns by pos * theta^(-2i/hd). */
#include <math.h>

#include "kernels.h"

void moe__rope_tables(float *cos_t, float *sin_t, int npos, int hd, float theta) {
  int h2 = hd / 2;
  for (int i = 0; i < h2; i++) {
    /* as HF: inv_freq = 1 / theta ** (2i / hd) and the angle pos * inv_freq, all in float32 */
    float inv = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
    for (int p = 0; p < npos; p++) {
      float ang = (float)p * inv;
      cos_t[(size_t)p * h2 + i] = (float)cos((double)ang);
      sin_t[(size_t)p * h2 + i] = (float)sin((double)ang);
    }
  }
}

void moe__rope_apply(float *x, int ld, int B, int T, int heads, int hd, int pos0, const float *cos_t,
                     const float *sin_t, int inverse, int nt) {
  int h2 = hd / 2;
  float sg = inverse ? -1.0f : 1.0f;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int bt = 0; bt < B * T; bt++) {
    int pos = pos0 + bt % T;
    const float *c = cos_t + (size_t)pos * h2, *s = sin_t + (size_t)pos * h2;
    for (int h = 0; h < heads; h++) {
      float *r = x + (size_t)bt * ld + (size_t)h * hd;
      for (int i = 0; i < h2; i++) {
        float a = r[i], b = r[i + h2], si = sg * s[i];
        r[i] = a * c[i] - b * si;
        r[i + h2] = b * c[i] + a * si;
      }
    }
  }
}
