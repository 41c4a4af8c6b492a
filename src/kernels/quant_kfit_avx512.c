/* The K-quants' scale search (moe__kfit_scale_min) with the 21 candidate steps in the lanes of two
 * AVX-512 vectors: each step's sums still run over the values in order, with the scalar loop's
 * operations one for one (no fused multiply-adds: the library is built without contraction), so the
 * bits are the scalar version's; about ten times fewer instructions for the quantizer's hot loop. */
#include <math.h>

#include "kernels/quant_avx2.h"

#ifdef HAVE_X86
#define AVX512 __attribute__((target("avx512f")))

AVX512 void moe__kfit_steps_avx512(const moe__kfit *f, const float *x, int n, int nmax, float err[MOE__KFIT_STEPS],
                                   float s[MOE__KFIT_STEPS], float b[MOE__KFIT_STEPS]) {
  float is[32] = {0}, sl[32], sl2[32], sxl[32];
  for (int k = 0; k < MOE__KFIT_STEPS; k++) is[k] = ((float)nmax + 0.1f * (float)(k - 10)) / (f->hi - f->lo);
  __m512 vis[2] = {_mm512_loadu_ps(is), _mm512_loadu_ps(is + 16)}, zero = _mm512_setzero_ps();
  __m512 a1[2] = {zero, zero}, a2[2] = {zero, zero}, a3[2] = {zero, zero};
  __m512i L[32][2], top = _mm512_set1_epi32(nmax), none = _mm512_setzero_si512();
  for (int i = 0; i < n; i++) {
    __m512 xd = _mm512_set1_ps(x[i] - f->lo), w = _mm512_set1_ps(f->w[i]), xi = _mm512_set1_ps(x[i]);
    for (int h = 0; h < 2; h++) { /* lrintf: the current rounding, nearest even */
      __m512i l = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(vis[h], xd)), none), top);
      L[i][h] = l;
      __m512 lf = _mm512_cvtepi32_ps(l), wl = _mm512_mul_ps(w, lf);
      a1[h] = _mm512_add_ps(a1[h], wl);
      a2[h] = _mm512_add_ps(a2[h], _mm512_mul_ps(w, _mm512_cvtepi32_ps(_mm512_mullo_epi32(l, l))));
      a3[h] = _mm512_add_ps(a3[h], _mm512_mul_ps(wl, xi));
    }
  }
  for (int h = 0; h < 2; h++) {
    _mm512_storeu_ps(sl + 16 * h, a1[h]);
    _mm512_storeu_ps(sl2 + 16 * h, a2[h]);
    _mm512_storeu_ps(sxl + 16 * h, a3[h]);
  }
  float vs[32] = {0}, vb[32] = {0};
  int ok[MOE__KFIT_STEPS];
  for (int k = 0; k < MOE__KFIT_STEPS; k++) ok[k] = moe__kfit_solve(f->sw, f->swx, sl[k], sl2[k], sxl[k], &vs[k], &vb[k]);
  __m512 e[2] = {zero, zero}, sv[2] = {_mm512_loadu_ps(vs), _mm512_loadu_ps(vs + 16)},
         bv[2] = {_mm512_loadu_ps(vb), _mm512_loadu_ps(vb + 16)};
  for (int i = 0; i < n; i++) {
    __m512 w = _mm512_set1_ps(f->w[i]), xi = _mm512_set1_ps(x[i]);
    for (int h = 0; h < 2; h++) {
      __m512 t = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(sv[h], _mm512_cvtepi32_ps(L[i][h])), bv[h]), xi);
      e[h] = _mm512_add_ps(e[h], _mm512_mul_ps(_mm512_mul_ps(w, t), t));
    }
  }
  float ev[32];
  _mm512_storeu_ps(ev, e[0]);
  _mm512_storeu_ps(ev + 16, e[1]);
  for (int k = 0; k < MOE__KFIT_STEPS; k++) err[k] = ok[k] ? ev[k] : INFINITY, s[k] = vs[k], b[k] = vb[k];
}
#endif
