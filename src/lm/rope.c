/* Rotary position embeddings with Hugging Face's rotate_half layout: dimension i of a head pairs
 * with i + hd/2 and turns by pos * theta^(-2i/hd). */
#include <math.h>

#include "internal.h"
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
#pragma omp parallel for num_threads(nt) schedule(static) if (moe__par_worth((size_t)B * T * heads * hd))
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

float moe__yarn_mscale(float scale, float m) { return scale <= 1 ? 1.0f : 0.1f * m * logf(scale) + 1.0f; }

/* The YaRN paper's dimension (of d) whose pair turns `rot` times within `maxpos` positions. */
static double correction_dim(double rot, int d, double theta, int maxpos) {
  return d * log(maxpos / (rot * 2 * M_PI)) / (2 * log(theta));
}

void moe__rope_tables_yarn(float *cos_t, float *sin_t, int npos, int hd, float theta, const moe_lm_yarn *y) {
  int h2 = hd / 2;
  double lo = correction_dim(y->beta_fast, hd, theta, y->original_max_pos),
         hi = correction_dim(y->beta_slow, hd, theta, y->original_max_pos);
  if (y->truncate) lo = floor(lo), hi = ceil(hi);
  lo = lo > 0 ? lo : 0;
  hi = hi < hd - 1 ? hi : hd - 1;
  if (lo == hi) hi += 0.001; /* as both references: no division by zero */
  float att = moe__yarn_mscale(y->factor, y->mscale) / moe__yarn_mscale(y->factor, y->mscale_all_dim);
  for (int i = 0; i < h2; i++) {
    /* in float32 as the references: the extrapolated and interpolated frequencies mixed by the ramp */
    float base = powf(theta, (float)(2 * i) / (float)hd), extra = 1.0f / base, inter = 1.0f / (y->factor * base);
    float ramp = (float)(((float)i - lo) / (hi - lo));
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    float inv = inter * ramp + extra * (1.0f - ramp);
    for (int p = 0; p < npos; p++) {
      float ang = (float)p * inv;
      cos_t[(size_t)p * h2 + i] = (float)cos((double)ang) * att;
      sin_t[(size_t)p * h2 + i] = (float)sin((double)ang) * att;
    }
  }
}

void moe__rope_rotate(const moe__rope_span *sp, float *x, int B, int T, int pos0, const float *cos_t,
                      const float *sin_t, int inverse, int nt) {
  int h2 = sp->hd / 2, il = sp->interleave;
  float sg = inverse ? -1.0f : 1.0f;
#pragma omp parallel for num_threads(nt) schedule(static) if (moe__par_worth((size_t)B * T * sp->heads * sp->hd))
  for (int bt = 0; bt < B * T; bt++) {
    int pos = pos0 + bt % T;
    const float *c = cos_t + (size_t)pos * h2, *s = sin_t + (size_t)pos * h2;
    for (int h = 0; h < sp->heads; h++) {
      float *r = x + (size_t)bt * sp->ld + sp->off + (size_t)h * sp->stride;
      for (int i = 0; i < h2; i++) {
        float *pa = il ? r + 2 * i : r + i, *pb = il ? r + 2 * i + 1 : r + i + h2;
        float a = *pa, b = *pb, si = sg * s[i];
        *pa = a * c[i] - b * si;
        *pb = b * c[i] + a * si;
      }
    }
  }
}
