/* Causal grouped-query attention, flash-attention style on a CPU: queries in blocks of QB rows; a
 * block's scores against the keys it sees (a QB x Tk GEMM), the softmax in place, then one GEMM with
 * the values. Backward recomputes the probabilities from the saved log-sum-exp instead of keeping
 * them, so no per-head T x T matrix is ever stored. GEMMs are single-threaded BLAS calls inside the
 * OpenMP loop over (batch, head, block) items. A decode step's single query row (Tq 1) skips the
 * GEMMs: each thread takes a share of the heads and streams the cache a position at a time, in tiles
 * of keys with the softmax online across them (decode_heads). */
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

#define DECODE_KEYS 32 /* keys a tile of a decode step: their scores for a thread's heads on its stack */

/* s[0, m) := exp(s - mx); returns their sum. */
static double exp_shifted(float *s, int m, float mx) {
  double sum = 0;
  int j = 0;
#ifdef __AVX512F__
  for (; j < m; j += 16) {
    __mmask16 k = moe__lanes((size_t)(m - j));
    __m512 e = _mm512_maskz_mov_ps(k, _ZGVeN16v_expf(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), _mm512_set1_ps(mx))));
    _mm512_mask_storeu_ps(s + j, k, e);
    sum += _mm512_reduce_add_ps(e);
  }
#endif
  for (; j < m; j++) s[j] = expf(s[j] - mx), sum += s[j];
  return sum;
}

/* a . b over n floats: the scores where the small kernels do not run (a CPU without AVX-512). */
static inline float dot(const float *a, const float *b, int n) {
  float d = 0;
  for (int i = 0; i < n; i++) d += a[i] * b[i];
  return d;
}

/* o (n floats) += sum_j p[j] v_j over m rows v_j ld floats apart, o held in registers 64 floats at a time. */
static void add_weighted_rows(float *o, int n, const float *p, const float *v, size_t ld, int m) {
#ifdef __AVX512F__
  for (int i = 0; i < n; i += 64) {
    __mmask16 k[4];
    __m512 acc[4];
    for (int c = 0; c < 4; c++) {
      k[c] = i + 16 * c < n ? moe__lanes((size_t)(n - i - 16 * c)) : 0;
      acc[c] = _mm512_maskz_loadu_ps(k[c], o + i + 16 * c);
    }
    for (int j = 0; j < m; j++) {
      __m512 pj = _mm512_set1_ps(p[j]);
      for (int c = 0; c < 4; c++) acc[c] = _mm512_fmadd_ps(pj, _mm512_maskz_loadu_ps(k[c], v + j * ld + i + 16 * c), acc[c]);
    }
    for (int c = 0; c < 4; c++) _mm512_mask_storeu_ps(o + i + 16 * c, k[c], acc[c]);
  }
#else
  for (int j = 0; j < m; j++)
    for (int i = 0; i < n; i++) o[i] += p[j] * v[j * ld + i];
#endif
}

/* Asks for the cache lines of x[0, n) to be fetched. */
static void prefetch_span(const float *x, size_t n) {
  for (size_t i = 0; i < n; i += 16) __builtin_prefetch(x + i);
  __builtin_prefetch(x + n - 1);
}

static void scale_row(float *x, int n, float f) {
#pragma omp simd
  for (int i = 0; i < n; i++) x[i] *= f;
}

/* Heads [h0, h1) of batch row b's single query (Tq 1: a decode step). The keys go in tiles, each key's
 * row read once for all those heads (a head at a time read a kv head's rows once for each head of its
 * group: from memory, at a long context) and a position at a time, so the cache streams. The softmax
 * runs online across the tiles (each tile's max rescales the sums so far, as in flash-decoding),
 * o = sum_j p_j v_j / sum_j p_j, with the sink in the sum. */
static void decode_heads(const moe__attn *a, int b, int h0, int h1, float sc) {
  int hd = a->hd, grp = a->nh / a->nkv, p0 = a->pos0, nh = h1 - h0;
  int k0 = a->window && p0 + 1 > a->window ? p0 + 1 - a->window : 0, n = p0 + 1 - k0;
  const float *q = a->q + (size_t)b * a->ldq, *k = a->k + b * a->kv_bs + (size_t)k0 * a->ldkv;
  const float *v = a->v + b * a->kv_bs + (size_t)k0 * a->ldkv;
  float *o = a->o + (size_t)b * a->nh * hd, s[nh][DECODE_KEYS], mx[nh];
  double sum[nh];
  size_t span0 = (size_t)(h0 / grp) * hd, span = (size_t)((h1 - 1) / grp + 1) * hd - span0; /* this thread's kv heads */
  for (int j = 0; j < DECODE_KEYS && j < n; j++) prefetch_span(k + (size_t)j * a->ldkv + span0, span);
  for (int h = 0; h < nh; h++) {
    mx[h] = a->sinks ? a->sinks[h0 + h] : -INFINITY;
    sum[h] = a->sinks ? 1.0 : 0.0; /* the sink's exp(sink - max) */
    memset(o + (size_t)(h0 + h) * hd, 0, (size_t)hd * sizeof *o);
  }
  for (int j0 = 0; j0 < n; j0 += DECODE_KEYS) {
    int m = n - j0 < DECODE_KEYS ? n - j0 : DECODE_KEYS;
    /* the cache comes from memory (a token's weights pass through the caches between two reads of it):
     * the next tile's keys and this tile's values are fetched while the scores are computed */
    for (int j = 0; j < m; j++) {
      if (j0 + j + DECODE_KEYS < n) prefetch_span(k + (size_t)(j0 + j + DECODE_KEYS) * a->ldkv + span0, span);
      prefetch_span(v + (size_t)(j0 + j) * a->ldkv + span0, span);
    }
    for (int h = 0; h < nh; h++) { /* a head's scores: the small kernels' one-row product, 16 keys at a time */
      const float *qh = q + (size_t)(h0 + h) * hd, *kh = k + (size_t)j0 * a->ldkv + (size_t)((h0 + h) / grp) * hd;
      moe__gemm g = {false, true, 1, m, hd, 1.0f, 0.0f, qh, hd, kh, a->ldkv, s[h], m, false};
      if (!moe__gemm_small(&g)) /* no AVX-512 */
        for (int j = 0; j < m; j++) s[h][j] = dot(qh, kh + (size_t)j * a->ldkv, hd);
      scale_row(s[h], m, sc);
    }
    for (int h = 0; h < nh; h++) {
      float top = mx[h];
      for (int j = 0; j < m; j++) top = s[h][j] > top ? s[h][j] : top;
      if (top > mx[h] && mx[h] > -INFINITY) { /* a new max: what is summed so far shrinks by exp(old - new) */
        float f = expf(mx[h] - top);
        sum[h] *= f;
        scale_row(o + (size_t)(h0 + h) * hd, hd, f);
      }
      mx[h] = top;
      sum[h] += exp_shifted(s[h], m, top);
    }
    for (int h = 0; h < nh; h++) /* the tile's rows are in L1 after the first head of their kv head */
      add_weighted_rows(o + (size_t)(h0 + h) * hd, hd, s[h], v + (size_t)j0 * a->ldkv + (size_t)((h0 + h) / grp) * hd,
                        (size_t)a->ldkv, m);
  }
  for (int h = 0; h < nh; h++) {
    scale_row(o + (size_t)(h0 + h) * hd, hd, (float)(1.0 / sum[h]));
    a->lse[(size_t)b * a->nh + h0 + h] = mx[h] + (float)log(sum[h]);
  }
}

void moe__attn_forward(const moe__attn *a, float *scratch, int nt) {
  if (a->Tq == 1) { /* the B rows' heads in one contiguous share a thread */
    float sc = 1.0f / sqrtf((float)a->hd);
    int items = a->B * a->nh;
#pragma omp parallel num_threads(nt)
    {
      int t = omp_get_thread_num(), team = omp_get_num_threads();
      int i0 = (int)((long long)items * t / team), i1 = (int)((long long)items * (t + 1) / team);
      for (int b = i0 / a->nh; b < a->B && b * a->nh < i1; b++) {
        int h0 = i0 > b * a->nh ? i0 - b * a->nh : 0, h1 = i1 < (b + 1) * a->nh ? i1 - b * a->nh : a->nh;
        if (h1 > h0) decode_heads(a, b, h0, h1, sc);
      }
    }
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
