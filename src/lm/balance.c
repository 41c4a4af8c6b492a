/* Mixtral's load-balancing loss over all layers at once (as HF concatenates the layers' router
 * logits): aux = E sum_e F_e P_e with F_e the share of all (layer, token, slot) assignments that went
 * to e and P_e the mean router probability of e over all (layer, token). The libmoe layer's own
 * balance loss counts top-1 assignments per layer instead, so the model recomputes the router
 * probabilities (an (N, E) GEMM per layer) and passes this loss's gradient itself. gpt-oss's variant
 * (sparse) takes transformers' GptOss router output, the top-k scores scattered into zeros, for the
 * logits (kernels.h). */
#include <math.h>
#include <string.h>

#include "kernels/gemm.h"
#include "internal.h"
#include "kernels.h"

/* Row z (E) := gpt-oss's scores from its logits: the softmax of the k selected (ex) scattered into
 * zeros; their softmax over the E experts added to psum. */
static void sparse_scores(float *z, const float *bg, const int32_t *ex, int k, int E, double *psum) {
  float sel[k], mx = -INFINITY;
  for (int j = 0; j < k; j++) mx = fmaxf(mx, sel[j] = z[ex[j]] + bg[ex[j]]);
  double s = 0, q = 0;
  for (int j = 0; j < k; j++) s += (sel[j] = expf(sel[j] - mx));
  memset(z, 0, (size_t)E * sizeof *z);
  for (int j = 0; j < k; j++) z[ex[j]] = (float)(sel[j] / s);
  for (int j = 0; j < k; j++) mx = j ? fmaxf(mx, z[ex[j]]) : z[ex[j]]; /* the scores' max (>= the zeros) */
  for (int e = 0; e < E; e++) q += expf(z[e] - mx);
  for (int e = 0; e < E; e++) psum[e] += (float)(expf(z[e] - mx) / q);
}

moe_status moe__lbl_forward(moe__lbl *b, const float *xn, const float *wg, const float *bg, const int32_t *experts,
                            float *probs, int nt) {
  int N = b->N, E = b->E;
  moe__gemm g = {false, true, N, E, b->D, 1.0f, 0.0f, xn, b->D, wg, b->D, probs, E, false};
  MOE_CHECK(moe__gemm_run(&g, 1, nt));
  for (int t = 0; b->sparse && t < N; t++)
    sparse_scores(probs + (size_t)t * E, bg, experts + (size_t)t * b->k, b->k, E, b->psum);
  for (int t = 0; !b->sparse && t < N; t++) { /* softmax rows, summed into psum in token order */
    float *p = probs + (size_t)t * E, mx = -INFINITY;
    for (int e = 0; e < E; e++) mx = p[e] > mx ? p[e] : mx;
    double s = 0;
    for (int e = 0; e < E; e++) s += (p[e] = expf(p[e] - mx));
    for (int e = 0; e < E; e++) {
      p[e] = (float)(p[e] / s);
      b->psum[e] += p[e];
    }
  }
  for (size_t i = 0; i < (size_t)N * b->k; i++) b->cnt[experts[i]] += 1;
  return MOE_OK;
}

double moe__lbl_value(const moe__lbl *b) {
  double rows = b->rows, aux = 0;
  for (int e = 0; e < b->E; e++) aux += (b->cnt[e] / rows) * (b->psum[e] / rows);
  return rows > 0 ? b->E * aux : 0.0;
}

/* Row gr (E) := the gradient of the logits from G = d(coef aux) / d q through gpt-oss's scores z:
 * q = softmax(z), then the selected experts' softmax (the others' logits get none). */
static void sparse_grad(const float *z, const float *G, const int32_t *ex, int k, int E, float *gr) {
  float mx = z[ex[0]], dot = 0, ds[k], sd = 0;
  for (int j = 1; j < k; j++) mx = fmaxf(mx, z[ex[j]]);
  double s = 0;
  for (int e = 0; e < E; e++) s += (gr[e] = expf(z[e] - mx));
  for (int e = 0; e < E; e++) dot += (gr[e] = (float)(gr[e] / s)) * G[e]; /* gr: q */
  for (int j = 0; j < k; j++) sd += z[ex[j]] * (ds[j] = gr[ex[j]] * (G[ex[j]] - dot)); /* d z */
  memset(gr, 0, (size_t)E * sizeof *gr);
  for (int j = 0; j < k; j++) gr[ex[j]] = z[ex[j]] * (ds[j] - sd);
}

moe_status moe__lbl_backward(const moe__lbl *b, float coef, const float *xn, const float *wg, const int32_t *experts,
                             const float *probs, float *g, float *dwg, float *dbg, float *dxn, int nt) {
  int N = b->N, E = b->E, D = b->D;
  double rows = b->rows;
  float G[E]; /* d(coef aux) / d p_{t,e}: the same for every token */
  for (int e = 0; e < E; e++) G[e] = (float)(coef * E * (b->cnt[e] / rows) / rows);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < N; t++) {
    const float *p = probs + (size_t)t * E;
    float *gr = g + (size_t)t * E, dot = 0;
    if (b->sparse) {
      sparse_grad(p, G, experts + (size_t)t * b->k, b->k, E, gr);
      continue;
    }
    for (int e = 0; e < E; e++) dot += p[e] * G[e];
    for (int e = 0; e < E; e++) gr[e] = p[e] * (G[e] - dot);
  }
  for (int t = 0; b->sparse && t < N; t++) /* the router bias: in token order */
    for (int e = 0; e < E; e++) dbg[e] += g[(size_t)t * E + e];
  moe__gemm m[2] = {
      {true, false, E, D, N, 1.0f, 1.0f, g, E, xn, D, dwg, D, false},  /* dWg += g^T xn */
      {false, false, N, D, E, 1.0f, 1.0f, g, E, wg, D, dxn, D, false}, /* dxn += g Wg */
  };
  return moe__gemm_run(m, 2, nt);
}
