/* See act.h. GELU (the classifier's default), SiLU and SwiGLU (the language model's) run 16 values at
 * a time through glibc's vector erff and expf (libmvec, the x86-64 vector ABI's names) where the build
 * has AVX-512: about 20x the scalar functions, whose calls took a fifth of a default training step;
 * they are within a few ulp of the scalar ones (tests/test_act.c bounds both against double
 * precision). Every value goes through the same function, the last partial vector masked, so a
 * value's result never depends on where it lies. */
#include <math.h>

#include "kernels/act.h"
#include "kernels/vmath.h"

static inline float sigmoidf(float a) { return 1.0f / (1.0f + expf(-a)); }

static inline float act_f(moe_act act, float a) {
  switch (act) {
    case MOE_ACT_RELU: return a > 0 ? a : 0;
    case MOE_ACT_GELU: return 0.5f * a * (1.0f + erff(a * 0.70710678118654752f));
    default: return a * sigmoidf(a); /* silu, and the gate half of swiglu */
  }
}

static inline float act_df(moe_act act, float a) {
  switch (act) {
    case MOE_ACT_RELU: return a > 0 ? 1.0f : 0.0f;
    case MOE_ACT_GELU:
      return 0.5f * (1.0f + erff(a * 0.70710678118654752f)) + a * expf(-0.5f * a * a) * 0.39894228040143268f;
    default: {
      float sg = sigmoidf(a);
      return sg * (1.0f + a * (1.0f - sg));
    }
  }
}

#ifdef __AVX512F__
/* The scalar formulas above, term for term, 16 values at a time. */
static void gelu_forward(const float *a, float *h, size_t n) {
  const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f), s = _mm512_set1_ps(0.70710678118654752f);
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 m = moe__lanes(n - i);
    __m512 x = _mm512_maskz_loadu_ps(m, a + i), e = _ZGVeN16v_erff(_mm512_mul_ps(x, s));
    _mm512_mask_storeu_ps(h + i, m, _mm512_mul_ps(_mm512_mul_ps(half, x), _mm512_add_ps(one, e)));
  }
}

static void gelu_backward(const float *a, float *dh, size_t n) {
  const __m512 half = _mm512_set1_ps(0.5f), mhalf = _mm512_set1_ps(-0.5f), one = _mm512_set1_ps(1.0f);
  const __m512 s = _mm512_set1_ps(0.70710678118654752f), k = _mm512_set1_ps(0.39894228040143268f);
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 m = moe__lanes(n - i);
    __m512 x = _mm512_maskz_loadu_ps(m, a + i);
    __m512 e = _ZGVeN16v_erff(_mm512_mul_ps(x, s));
    __m512 g = _ZGVeN16v_expf(_mm512_mul_ps(_mm512_mul_ps(mhalf, x), x));
    __m512 d = _mm512_add_ps(_mm512_mul_ps(half, _mm512_add_ps(one, e)), _mm512_mul_ps(_mm512_mul_ps(x, g), k));
    _mm512_mask_storeu_ps(dh + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, dh + i), d));
  }
}

/* sigmoid(x) = 1 / (1 + exp(-x)), as sigmoidf. */
static inline __m512 sigmoid16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, _ZGVeN16v_expf(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

/* silu (a3 NULL) or swiglu: h = a1 sigmoid(a1) (times a3). */
static void silu_forward(const float *a1, const float *a3, float *h, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 m = moe__lanes(n - i);
    __m512 x = _mm512_maskz_loadu_ps(m, a1 + i), y = _mm512_mul_ps(x, sigmoid16(x));
    if (a3) y = _mm512_mul_ps(y, _mm512_maskz_loadu_ps(m, a3 + i));
    _mm512_mask_storeu_ps(h + i, m, y);
  }
}

/* silu' = s (1 + a (1 - s)); swiglu: da3 = dh silu(a1) into a3, dh = dh a3 silu'(a1). */
static void silu_backward(const float *a1, float *a3, float *dh, size_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 m = moe__lanes(n - i);
    __m512 x = _mm512_maskz_loadu_ps(m, a1 + i), sg = sigmoid16(x), d = _mm512_maskz_loadu_ps(m, dh + i);
    __m512 df = _mm512_mul_ps(sg, _mm512_add_ps(one, _mm512_mul_ps(x, _mm512_sub_ps(one, sg))));
    if (a3) {
      __m512 g = _mm512_maskz_loadu_ps(m, a3 + i);
      _mm512_mask_storeu_ps(a3 + i, m, _mm512_mul_ps(d, _mm512_mul_ps(x, sg)));
      _mm512_mask_storeu_ps(dh + i, m, _mm512_mul_ps(_mm512_mul_ps(d, g), df));
    } else {
      _mm512_mask_storeu_ps(dh + i, m, _mm512_mul_ps(d, df));
    }
  }
}
#endif

void moe__act_forward(moe_act act, const float *a1, const float *a3, float *h, size_t n) {
#ifdef __AVX512F__
  if (act == MOE_ACT_GELU) {
    gelu_forward(a1, h, n);
    return;
  }
  if (act == MOE_ACT_SILU || act == MOE_ACT_SWIGLU) {
    silu_forward(a1, act == MOE_ACT_SWIGLU ? a3 : NULL, h, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; i++)
    h[i] = act == MOE_ACT_SWIGLU ? act_f(MOE_ACT_SILU, a1[i]) * a3[i] : act_f(act, a1[i]);
}

void moe__act_backward(moe_act act, const float *a1, float *a3, float *dh, size_t n) {
#ifdef __AVX512F__
  if (act == MOE_ACT_GELU) {
    gelu_backward(a1, dh, n);
    return;
  }
  if (act == MOE_ACT_SILU || act == MOE_ACT_SWIGLU) {
    silu_backward(a1, act == MOE_ACT_SWIGLU ? a3 : NULL, dh, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; i++) {
    if (act == MOE_ACT_SWIGLU) {
      float g = a3[i];
      a3[i] = dh[i] * act_f(MOE_ACT_SILU, a1[i]);
      dh[i] = dh[i] * g * act_df(MOE_ACT_SILU, a1[i]);
    } else {
      dh[i] *= act_df(act, a1[i]);
    }
  }
}

/* gpt-oss's clamped SwiGLU, scalar: a NaN stays NaN through the clamps (comparisons false), as in torch. */
void moe__act_oai_forward(float alpha, float limit, const float *a1, const float *a3, float *h, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float g = a1[i] > limit ? limit : a1[i], u = a3[i] > limit ? limit : a3[i] < -limit ? -limit : a3[i];
    h[i] = (u + 1.0f) * g * sigmoidf(alpha * g);
  }
}

/* d/dg of g sigmoid(alpha g) = s + alpha g s (1 - s); torch's clamp passes the gradient where
 * min <= x <= max, so the bounds themselves pass. */
void moe__act_oai_backward(float alpha, float limit, const float *a1, float *a3, float *dh, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float g = a1[i] > limit ? limit : a1[i], u = a3[i] > limit ? limit : a3[i] < -limit ? -limit : a3[i];
    float s = sigmoidf(alpha * g), d = dh[i];
    a3[i] = a3[i] >= -limit && a3[i] <= limit ? d * g * s : 0.0f;
    dh[i] = a1[i] <= limit ? d * (u + 1.0f) * s * (1.0f + alpha * g * (1.0f - s)) : 0.0f;
  }
}

void moe__act_cfg_forward(const moe_layer_config *c, const float *a1, const float *a3, float *h, size_t n) {
  if (c->act == MOE_ACT_SWIGLU_OAI) moe__act_oai_forward(c->swiglu_alpha, c->swiglu_limit, a1, a3, h, n);
  else moe__act_forward(c->act, a1, a3, h, n);
}

void moe__act_cfg_backward(const moe_layer_config *c, const float *a1, float *a3, float *dh, size_t n) {
  if (c->act == MOE_ACT_SWIGLU_OAI) moe__act_oai_backward(c->swiglu_alpha, c->swiglu_limit, a1, a3, dh, n);
  else moe__act_backward(c->act, a1, a3, dh, n);
}
