/* Causal grouped-query attention, flash-attention style on a CPU: queries in blocks of QB rows; a
 * block's scores against the keys it sees (a QB x Tk GEMM), the softmax in place, then one GEMM with
 * the values. Backward recomputes the probabilities from the saved log-sum-exp instead of keeping
 * them, so no per-head T x T matrix is ever stored. GEMMs are single-threaded BLAS calls inside the
 * OpenMP loop over (batch, head, block) items. A decode step's single query row (Tq 1) skips the
 * GEMMs: a dot product a key, the softmax and the weighted sum of the values in one loop each. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/gemm.h"
#include "kernels/vmath.h"
#include "kernels.h"

#define QB 64 /* query rows per block: the scores of a block fit in L2 for contexts of a few thousand */

static int nblocks(int T) { return (T + QB - 1) / QB; }

size_t moe__attn_scratch(const moe__attn *a, int nt) {
  size_t tk = (size_t)a->pos0 + a->Tq, rows = a->Tq < QB ? (size_t)a->Tq : QB;
  return (size_t)nt * 2 * rows * tk * sizeof(float) + 64;
}

static moe__gemm gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, float *C, int ldc) {
  return (moe__gemm){ta, tb, M, N, K, alpha, beta, A, lda, B, ldb, C, ldc, false};
}

/* The probabilities of a block in place of its scores s (m, n): row r sees keys [0, p0 + r], the last
 * `window` of them when window > 0 (the others get 0). With lse NULL the rows are softmaxed and their
 * log-sum-exp stored in out_lse (with a sink, over the row and the sink's logit *sink); else
 * exp(s - lse). */
static void block_probs(float *s, int m, int n, int p0, int window, const float *sink, const float *lse,
                        float *out_lse) {
  for (int r = 0; r < m; r++) {
    float *row = s + (size_t)r * n;
    int seen = p0 + r + 1, lo = window && seen > window ? seen - window : 0;
    memset(row, 0, (size_t)lo * sizeof *row);
    if (lse) {
      for (int j = lo; j < seen; j++) row[j] = expf(row[j] - lse[r]);
    } else {
      float mx = sink ? *sink : -INFINITY;
      for (int j = lo; j < seen; j++) mx = row[j] > mx ? row[j] : mx;
      double sum = sink ? exp((double)(*sink - mx)) : 0;
      for (int j = lo; j < seen; j++) {
        row[j] = expf(row[j] - mx);
        sum += row[j];
      }
      float inv = (float)(1.0 / sum);
      for (int j = lo; j < seen; j++) row[j] *= inv;
      out_lse[r] = mx + (float)log(sum);
    }
    if (seen < n) memset(row + seen, 0, (size_t)(n - seen) * sizeof *row);
  }
}

/* A decode step's row (Tq 1) of head h of batch b: its scores against the keys it sees in s (n floats),
 * their softmax with the sink, and o = sum_j p_j v_j, each key and value read once. The block path's
 * two GEMM calls and their setup cost more than this whole row at a decode's few hundred keys. */
static void decode_row(const moe__attn *a, int b, int h, float sc, float *s) {
  int hd = a->hd, grp = a->nh / a->nkv, p0 = a->pos0;
  int k0 = a->window && p0 + 1 > a->window ? p0 + 1 - a->window : 0, n = p0 + 1 - k0;
  const float *q = a->q + (size_t)b * a->ldq + (size_t)h * hd;
  const float *k = a->k + b * a->kv_bs + (size_t)(h / grp) * hd + (size_t)k0 * a->ldkv;
  const float *v = a->v + b * a->kv_bs + (size_t)(h / grp) * hd + (size_t)k0 * a->ldkv;
  float *o = a->o + (size_t)b * a->nh * hd + (size_t)h * hd;
  float mx = a->sinks ? a->sinks[h] : -INFINITY;
  for (int j = 0; j < n; j++) {
    const float *kj = k + (size_t)j * a->ldkv;
    float d = 0;
#pragma omp simd reduction(+ : d)
    for (int i = 0; i < hd; i++) d += q[i] * kj[i];
    s[j] = d * sc;
    mx = s[j] > mx ? s[j] : mx;
  }
  double sum = a->sinks ? exp((double)(a->sinks[h] - mx)) : 0;
  int j = 0;
#ifdef __AVX512F__
  for (; j < n; j += 16) {
    __mmask16 m = moe__lanes((size_t)(n - j));
    __m512 e = _mm512_maskz_mov_ps(m, _ZGVeN16v_expf(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), _mm512_set1_ps(mx))));
    _mm512_mask_storeu_ps(s + j, m, e);
    sum += _mm512_reduce_add_ps(e);
  }
#endif
  for (; j < n; j++) s[j] = expf(s[j] - mx), sum += s[j];
  float inv = (float)(1.0 / sum);
  memset(o, 0, (size_t)hd * sizeof *o);
  for (j = 0; j < n; j++) {
    const float *vj = v + (size_t)j * a->ldkv;
    float p = s[j] * inv;
#pragma omp simd
    for (int i = 0; i < hd; i++) o[i] += p * vj[i];
  }
  a->lse[(size_t)b * a->nh + h] = mx + (float)log(sum);
}

void moe__attn_forward(const moe__attn *a, float *scratch, int nt) {
  if (a->Tq == 1) {
    float sc = 1.0f / sqrtf((float)a->hd);
    size_t per = (size_t)2 * (a->pos0 + 1);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int it = 0; it < a->B * a->nh; it++) decode_row(a, it / a->nh, it % a->nh, sc, scratch + per * omp_get_thread_num());
    return;
  }
  int nb = nblocks(a->Tq), hd = a->hd, qd = a->nh * hd, grp = a->nh / a->nkv;
  size_t per = (size_t)2 * (a->Tq < QB ? a->Tq : QB) * (a->pos0 + a->Tq);
  float sc = 1.0f / sqrtf((float)hd);
  int items = a->B * a->nh * nb;
#pragma omp parallel num_threads(nt)
  {
    omp_set_num_threads(1); /* BLAS single-threaded inside the team */
    float *s = scratch + per * omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int it = 0; it < items; it++) {
      int b = it / (a->nh * nb), h = it / nb % a->nh, blk = it % nb;
      int t0 = blk * QB, m = a->Tq - t0 < QB ? a->Tq - t0 : QB, p0 = a->pos0 + t0;
      /* keys from k0 on: with a window, those before the block's first row's window are never seen */
      int k0 = a->window && p0 + 1 > a->window ? p0 + 1 - a->window : 0, n = p0 + m - k0;
      const float *q = a->q + ((size_t)b * a->Tq + t0) * a->ldq + (size_t)h * hd;
      const float *k = a->k + b * a->kv_bs + (size_t)(h / grp) * hd + (size_t)k0 * a->ldkv;
      const float *v = a->v + b * a->kv_bs + (size_t)(h / grp) * hd + (size_t)k0 * a->ldkv;
      float *o = a->o + ((size_t)b * a->Tq + t0) * qd + (size_t)h * hd;
      moe__gemm g = gemm(false, true, m, n, hd, sc, q, a->ldq, k, a->ldkv, 0.0f, s, n);
      moe__gemm_one(&g);
      block_probs(s, m, n, p0 - k0, a->window, a->sinks ? a->sinks + h : NULL, NULL,
                  a->lse + ((size_t)b * a->nh + h) * a->Tq + t0);
      g = gemm(false, false, m, hd, n, 1.0f, s, n, v, a->ldkv, 0.0f, o, qd);
      moe__gemm_one(&g);
    }
  }
}

/* Per (batch, kv head): the heads of its group one after the other, so that its dk and dv rows have
 * one writer. For each query block: P again, dP = dO V^T, dS = P (dP - rowsum(dO o)) / sqrt(hd),
 * dQ = dS K, dK += dS^T Q, dV += P^T dO. */
void moe__attn_backward(const moe__attn *a, const float *do_, float *dq, float *dk, float *dv, float *scratch,
                        int nt) {
  int T = a->Tq, nb = nblocks(T), hd = a->hd, qd = a->nh * hd, lq = a->ldq, lkv = a->ldkv, grp = a->nh / a->nkv;
  size_t per = (size_t)2 * (T < QB ? T : QB) * T;
  float sc = 1.0f / sqrtf((float)hd);
  int items = a->B * a->nkv;
#pragma omp parallel num_threads(nt)
  {
    omp_set_num_threads(1);
    float *p = scratch + per * omp_get_thread_num(), *dp = p + per / 2;
#pragma omp for schedule(dynamic, 1)
    for (int it = 0; it < items; it++) {
      int b = it / a->nkv, kh = it % a->nkv;
      const float *k = a->k + b * a->kv_bs + (size_t)kh * hd, *v = a->v + b * a->kv_bs + (size_t)kh * hd;
      float *dkb = dk + b * a->kv_bs + (size_t)kh * hd, *dvb = dv + b * a->kv_bs + (size_t)kh * hd;
      for (int t = 0; t < T; t++) {
        memset(dkb + (size_t)t * lkv, 0, (size_t)hd * sizeof(float));
        memset(dvb + (size_t)t * lkv, 0, (size_t)hd * sizeof(float));
      }
      for (int h = kh * grp; h < (kh + 1) * grp; h++)
        for (int blk = 0; blk < nb; blk++) {
          /* keys from k0 on, as in the forward: the ones before the window get no gradient */
          int t0 = blk * QB, m = T - t0 < QB ? T - t0 : QB, k0 = a->window && t0 + 1 > a->window ? t0 + 1 - a->window : 0;
          int n = t0 + m - k0;
          size_t r0 = ((size_t)b * T + t0) * qd + (size_t)h * hd, rq = ((size_t)b * T + t0) * lq + (size_t)h * hd;
          const float *q = a->q + rq, *o = a->o + r0, *dO = do_ + r0;
          const float *kb = k + (size_t)k0 * lkv, *vb = v + (size_t)k0 * lkv;
          float *dkw = dkb + (size_t)k0 * lkv, *dvw = dvb + (size_t)k0 * lkv;
          const float *lse = a->lse + ((size_t)b * a->nh + h) * T + t0;
          moe__gemm g[5];
          g[0] = gemm(false, true, m, n, hd, sc, q, lq, kb, lkv, 0.0f, p, n);
          g[1] = gemm(false, true, m, n, hd, 1.0f, dO, qd, vb, lkv, 0.0f, dp, n);
          moe__gemm_one(&g[0]);
          moe__gemm_one(&g[1]);
          block_probs(p, m, n, t0 - k0, a->window, NULL, lse, NULL);
          for (int r = 0; r < m; r++) {
            const float *orow = o + (size_t)r * qd, *drow = dO + (size_t)r * qd;
            float di = 0;
            for (int j = 0; j < hd; j++) di += orow[j] * drow[j];
            float *pr = p + (size_t)r * n, *dr = dp + (size_t)r * n;
            for (int j = 0; j < n; j++) dr[j] = pr[j] * (dr[j] - di) * sc;
          }
          g[2] = gemm(false, false, m, hd, n, 1.0f, dp, n, kb, lkv, 0.0f, dq + rq, lq);
          g[3] = gemm(true, false, n, hd, m, 1.0f, dp, n, q, lq, 1.0f, dkw, lkv);
          g[4] = gemm(true, false, n, hd, m, 1.0f, p, n, dO, qd, 1.0f, dvw, lkv);
          for (int i = 2; i < 5; i++) moe__gemm_one(&g[i]);
        }
    }
  }
}

void moe__attn_sinks_backward(const moe__attn *a, const float *do_, float *dsinks, int nt) {
  int hd = a->hd, qd = a->nh * hd;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int h = 0; h < a->nh; h++) { /* each head one thread's */
    double acc = 0;
    for (int b = 0; b < a->B; b++)
      for (int t = 0; t < a->Tq; t++) {
        size_t at = ((size_t)b * a->Tq + t) * qd + (size_t)h * hd;
        const float *o = a->o + at, *d = do_ + at;
        double di = 0;
        for (int j = 0; j < hd; j++) di += (double)o[j] * d[j];
        acc -= exp((double)a->sinks[h] - a->lse[((size_t)b * a->nh + h) * a->Tq + t]) * di;
      }
    dsinks[h] += (float)acc;
  }
}
