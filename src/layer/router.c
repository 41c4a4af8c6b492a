/* The router: logits (linear or cosine), scores (softmax, or sigmoid), top-k (with a selection bias and
 * groups: DeepSeek) with optional renormalization and scaling, the GShard balance loss and the z-loss,
 * forward and backward. Capacity and placement are in placement.c. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "dist/dist.h"
#include "kernels/gemm.h"
#include "layer/stages.h"

#define COS_EPS 1e-12f
#define LOG_MAX_SCALE 4.605170185988091f /* ln 100: the logit scale is clamped at 100 */
#define GATE_ROWS 64 /* tokens per router work item: fixed, so the bits do not depend on the threads */

/* Whether the top-k is chosen on values other than the scores: the selection bias, or groups. */
static int own_choice(const moe_layer_config *cfg) { return cfg->select_bias || cfg->n_group > 0; }

static int gate_chunks(int T) { return (T + GATE_ROWS - 1) / GATE_ROWS; }

size_t moe__router_bytes(const moe_layer_config *cfg, int T, int k) {
  size_t E = (size_t)cfg->E, P = (size_t)cfg->proj_dim, t = (size_t)T, tk = t * (size_t)k;
  size_t b = 0;
  b += 3 * moe__arena_size(t * E * 4);             /* logits, probs, dprobs */
  b += moe__arena_size(t * 4) * 2;                 /* lse, order */
  b += moe__arena_size(t * 8);                     /* placement.c: priority sort keys */
  b += moe__arena_size((size_t)(gate_chunks(T) + 1) * (2 * E + 2) * sizeof(double)); /* loss sums */
  b += 6 * moe__arena_size(tk * 4);                /* top_e, top_p, top_w, row, dw, fresh */
  b += 6 * moe__arena_size((E + 1) * 4);           /* counts, kept, offs, fill, frac1, cap */
  if (own_choice(cfg)) b += moe__arena_size(t * E * 4); /* choice values */
  if (cfg->seq_aux_alpha > 0) b += moe__arena_size(t * E * 4); /* the sequences' f (S <= T) */
  if (cfg->router == MOE_ROUTER_COSINE)            /* proj, dproj, norms, emb, demb */
    b += 2 * moe__arena_size(t * P * 4) + moe__arena_size(t * 4) + 2 * moe__arena_size(E * P * 4) +
         moe__arena_size(E * 4);
  return b;
}

/* L2 normalization of a row (m) in place; returns its norm, kept for backward. */
static float normalize_row(float *r, int m) {
  double s = 0;
  for (int j = 0; j < m; j++) s += (double)r[j] * r[j];
  float nrm = (float)sqrt(s);
  float inv = 1.0f / (nrm > COS_EPS ? nrm : COS_EPS);
  for (int j = 0; j < m; j++) r[j] *= inv;
  return nrm;
}

/* Backward of normalize_row over n rows: g (n, m) holds d(normalized) on entry and d(raw) on exit. */
static void normalize_rows_backward(float *g, const float *a, const float *norms, int n, int m,
                                    int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int i = 0; i < n; i++) {
    float *gr = g + (size_t)i * m;
    const float *ar = a + (size_t)i * m;
    if (norms[i] > COS_EPS) {
      double dot = 0;
      for (int j = 0; j < m; j++) dot += (double)gr[j] * ar[j];
      float inv = 1.0f / norms[i];
      for (int j = 0; j < m; j++) gr[j] = (gr[j] - ar[j] * (float)dot) * inv;
    } else {
      for (int j = 0; j < m; j++) gr[j] /= COS_EPS;
    }
  }
}

static float cosine_scale(const moe__weights *w) {
  float s = w->scale[0];
  return expf(s < LOG_MAX_SCALE ? s : LOG_MAX_SCALE);
}

/* Logits of tokens [t0, t0 + n) on the calling thread. The cosine router's expert embeddings are
 * normalized before (moe__router_begin). */
static moe__gemm linear_logits(const moe_layer_config *cfg, const moe__weights *w, const float *x, moe__router *r,
                               int t0, int n) {
  int D = cfg->D, E = cfg->E;
  float *logits = r->logits + (size_t)t0 * E;
  if (w->gb)
    for (int t = 0; t < n; t++) memcpy(logits + (size_t)t * E, w->gb, (size_t)E * 4);
  return (moe__gemm){false, true, n, E, D, 1.0f, w->gb ? 1.0f : 0.0f, x + (size_t)t0 * D, D, w->gw, D, logits, E, false};
}

static void compute_logits(const moe_layer_config *cfg, const moe__weights *w, const float *x, moe__router *r,
                           int t0, int n) {
  int D = cfg->D, E = cfg->E, P = cfg->proj_dim;
  if (cfg->router == MOE_ROUTER_LINEAR) {
    moe__gemm g = linear_logits(cfg, w, x, r, t0, n);
    moe__gemm_one(&g);
    return;
  }
  x += (size_t)t0 * D;
  float *logits = r->logits + (size_t)t0 * E;
  float *proj = r->proj + (size_t)t0 * P;
  for (int t = 0; t < n; t++) memcpy(proj + (size_t)t * P, w->pb, (size_t)P * 4);
  moe__gemm g = {false, true, n, P, D, 1.0f, 1.0f, x, D, w->pw, D, proj, P, false};
  moe__gemm_one(&g);
  for (int t = 0; t < n; t++) r->proj_norm[t0 + t] = normalize_row(proj + (size_t)t * P, P);
  moe__gemm c = {false, true, n, E, P, cosine_scale(w), 0.0f, proj, P, r->emb, P, logits, E, false};
  moe__gemm_one(&c);
}

/* The group-limited selection (DeepSeek) on one token's choice values c (E): keeps the topk_group groups
 * of best group score (ties to the lower group) and sets the other groups' values to 0, as transformers'
 * masked_fill does. */
static void limit_groups(const moe_layer_config *cfg, float *c) {
  int G = cfg->n_group, m = cfg->E / G;
  float gs[MOE__MAX_GROUPS];
  unsigned char keep[MOE__MAX_GROUPS] = {0};
  for (int g = 0; g < G; g++) {
    const float *v = c + (size_t)g * m;
    float b1 = -INFINITY, b2 = -INFINITY; /* the group's best two */
    for (int i = 0; i < m; i++) {
      if (v[i] > b1) { b2 = b1; b1 = v[i]; }
      else if (v[i] > b2) b2 = v[i];
    }
    gs[g] = cfg->group_score == MOE_GROUP_MAX ? b1 : b1 + b2;
  }
  for (int j = 0; j < cfg->topk_group; j++) {
    int best = -1;
    for (int g = 0; g < G; g++)
      if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
    keep[best] = 1;
  }
  for (int g = 0; g < G; g++)
    if (!keep[g]) memset(c + (size_t)g * m, 0, (size_t)m * sizeof *c);
}

/* One token: its logsumexp, scores (softmax over the experts, or each expert's sigmoid) into prob, and
 * its top-k (ties to the lower id, slot 0 largest) by the choice values: the scores, or (own_choice) the
 * scores plus the selection bias, limited to the best groups, in c (E scratch). tp: the chosen experts'
 * scores, without the bias. */
static void route_token(const moe_layer_config *cfg, const float *sbias, const float *logit, float *prob, float *lse,
                        int k, int32_t *te, float *tp, float *c) {
  int E = cfg->E;
  float mx = -INFINITY;
  for (int e = 0; e < E; e++) mx = logit[e] > mx ? logit[e] : mx;
  double sum = 0;
  for (int e = 0; e < E; e++) { /* one exp per entry (the router's main cost at large E), summed in double */
    prob[e] = expf(logit[e] - mx);
    sum += prob[e];
  }
  *lse = mx + (float)log(sum);
  if (cfg->score == MOE_SCORE_SIGMOID)
    for (int e = 0; e < E; e++) prob[e] = 1.0f / (1.0f + expf(-logit[e]));
  else
    for (int e = 0; e < E; e++) prob[e] = (float)(prob[e] / sum);
  const float *choice = prob;
  if (own_choice(cfg)) {
    for (int e = 0; e < E; e++) c[e] = prob[e] + (sbias ? sbias[e] : 0.0f);
    if (cfg->n_group > 0) limit_groups(cfg, c);
    choice = c;
  }
  for (int j = 0; j < k; j++) { /* k passes of selection: k is small */
    int best = -1;
    for (int e = 0; e < E; e++) {
      int taken = 0;
      for (int i = 0; i < j; i++) taken |= te[i] == e;
      if (!taken && (best < 0 || choice[e] > choice[best])) best = e;
    }
    te[j] = best;
    tp[j] = prob[best];
  }
}

moe_status moe__router_begin(const moe_layer_config *cfg, const moe__weights *w, int T, int k, const int32_t *cached,
                             moe__arena *a, moe__router *r, moe__plan *p) {
  int E = cfg->E, P = cfg->proj_dim;
  size_t te = (size_t)T * E, tk = (size_t)T * k;
  r->logits = moe__arena_alloc(a, te * 4);
  r->probs = moe__arena_alloc(a, te * 4);
  r->lse = moe__arena_alloc(a, (size_t)T * 4);
  r->order = moe__arena_alloc(a, (size_t)T * 4);
  p->top_e = moe__arena_alloc(a, tk * 4);
  r->top_p = moe__arena_alloc(a, tk * 4);
  p->top_w = moe__arena_alloc(a, tk * 4);
  p->row = moe__arena_alloc(a, tk * 4);
  r->fresh = moe__arena_alloc(a, tk * 4);
  p->counts = moe__arena_alloc(a, (size_t)(E + 1) * 4);
  p->kept = moe__arena_alloc(a, (size_t)(E + 1) * 4);
  p->offs = moe__arena_alloc(a, (size_t)(E + 1) * 4);
  r->fill = moe__arena_alloc(a, (size_t)(E + 1) * 4);
  r->frac1 = moe__arena_alloc(a, (size_t)(E + 1) * 4);
  p->cap = moe__arena_alloc(a, (size_t)(E + 1) * 4);
  r->acc = moe__arena_alloc(a, (size_t)(gate_chunks(T) + 1) * (2 * E + 2) * sizeof(double));
  r->choice = own_choice(cfg) ? moe__arena_alloc(a, te * 4) : NULL;
  r->seq_aux = 0;
  r->seq_f = NULL;
  if (cfg->seq_aux_alpha > 0) {
    r->seq_len = cfg->seq_len ? cfg->seq_len : T;
    MOE_TRY(T % r->seq_len == 0, MOE_ERR_ARG, "layer forward: %d tokens are not whole sequences of seq_len %d", T,
            cfg->seq_len);
    r->seq_n = T / r->seq_len;
    r->seq_f = moe__arena_alloc(a, te * 4);
    MOE_TRY(r->seq_f || !T, MOE_ERR_STATE, "internal: router workspace too small");
  }
  if (cfg->router == MOE_ROUTER_COSINE) {
    r->proj = moe__arena_alloc(a, (size_t)T * P * 4);
    r->proj_norm = moe__arena_alloc(a, (size_t)T * 4);
    r->emb = moe__arena_alloc(a, (size_t)E * P * 4);
    r->emb_norm = moe__arena_alloc(a, (size_t)E * 4);
  }
  MOE_TRY(r->acc && (cfg->router != MOE_ROUTER_COSINE || r->emb_norm) && (r->choice || !own_choice(cfg) || !T),
          MOE_ERR_STATE,
          "internal: router workspace too small");
  p->T = T;
  p->k = k;
  if (cfg->router == MOE_ROUTER_COSINE) {
    memcpy(r->emb, w->gw, (size_t)E * P * 4);
    for (int e = 0; e < E; e++) r->emb_norm[e] = normalize_row(r->emb + (size_t)e * P, P);
  }
  r->sbias = w->sbias;
  r->use_cache = cached != NULL;
  if (cached) memcpy(p->top_e, cached, tk * 4); /* the experts are known before the router runs */
  return MOE_OK;
}

/* Router chunk c from its tokens' logits, in r already: the choices, weights and loss sums. */
static void route_chunk(const moe__router_job *j, int c) {
  const moe_layer_config *cfg = j->cfg;
  moe__router *r = j->r;
  moe__plan *p = j->p;
  int E = cfg->E, k = p->k, t0 = c * GATE_ROWS, t1 = t0 + GATE_ROWS < p->T ? t0 + GATE_ROWS : p->T;
  int norm = cfg->normalize_topk < 0 ? k > 1 : cfg->normalize_topk;
  for (int t = t0; t < t1; t++) {
    const float *prob = r->probs + (size_t)t * E;
    int32_t *te = p->top_e + (size_t)t * k, *fr = r->fresh + (size_t)t * k;
    float *tp = r->top_p + (size_t)t * k, *tw = p->top_w + (size_t)t * k;
    route_token(cfg, r->sbias, r->logits + (size_t)t * E, r->probs + (size_t)t * E, r->lse + t, k, fr, tp,
                r->choice ? r->choice + (size_t)t * E : NULL);
    if (r->use_cache) /* sample-assignment caching: the experts come from the cache, the weights from the gate */
      for (int i = 0; i < k; i++) tp[i] = prob[te[i]];
    else
      memcpy(te, fr, (size_t)k * 4);
    float sum = 0;
    for (int i = 0; i < k; i++) sum += tp[i];
    for (int i = 0; i < k; i++) tw[i] = (norm ? tp[i] / sum : tp[i]) * cfg->routed_scale;
  }
  /* this chunk's loss sums, in token order: prob sums, top-1 counts, -, sum lse^2 (sigmoid scores count
   * normalized per token, as probabilities) */
  double *acc = r->acc + (size_t)(c + 1) * (2 * E + 2);
  memset(acc, 0, (size_t)(2 * E + 2) * sizeof *acc);
  for (int t = t0; t < t1; t++) {
    acc[2 * E + 1] += (double)r->lse[t] * r->lse[t];
    acc[E + p->top_e[(size_t)t * k]] += 1;
    const float *pr = r->probs + (size_t)t * E;
    float inv = 1.0f;
    if (cfg->score == MOE_SCORE_SIGMOID) {
      double ss = 0;
      for (int e = 0; e < E; e++) ss += pr[e];
      inv = (float)(1.0 / ss);
    }
    for (int e = 0; e < E; e++) acc[e] += pr[e] * inv;
  }
}

/* Router chunk c: tokens [c GATE_ROWS, (c + 1) GATE_ROWS) (side work: the job is the context). */
static void gate_rows(void *job, int c) {
  const moe__router_job *j = job;
  int t0 = c * GATE_ROWS, t1 = t0 + GATE_ROWS < j->p->T ? t0 + GATE_ROWS : j->p->T;
  compute_logits(j->cfg, j->w, j->x, j->r, t0, t1 - t0);
  route_chunk(j, c);
}

/* DeepSeek-V3's sequence-wise balance loss: per sequence f_i = E / (k T_s) x its tokens choosing i and
 * P_i = mean of its tokens' scores normalized per token; alpha times the mean over the sequences of
 * sum_i f_i P_i. Serial, in token order: the bits do not depend on the threads. */
static void seq_aux_forward(const moe_layer_config *cfg, moe__router *r, const moe__plan *p) {
  int E = cfg->E, k = p->k, L = r->seq_len;
  double total = 0;
  for (int s = 0; s < r->seq_n; s++) {
    float *f = r->seq_f + (size_t)s * E;
    memset(f, 0, (size_t)E * sizeof *f);
    for (int t = s * L; t < (s + 1) * L; t++)
      for (int j = 0; j < k; j++) f[p->top_e[(size_t)t * k + j]] += 1;
    for (int e = 0; e < E; e++) f[e] *= (float)E / ((float)k * (float)L);
    double sum = 0;
    for (int t = s * L; t < (s + 1) * L; t++) {
      const float *pr = r->probs + (size_t)t * E;
      double ss = 0, dot = 0;
      for (int e = 0; e < E; e++) ss += pr[e], dot += (double)f[e] * pr[e];
      sum += dot / ss;
    }
    total += sum / L;
  }
  r->seq_aux = (float)(cfg->seq_aux_alpha * total / r->seq_n);
}

moe_status moe__router_end(const moe_layer_config *cfg, moe__router *r, const moe__plan *p) {
  int E = cfg->E, E2 = 2 * E + 2, T = p->T;
  /* the losses from the chunks' sums in chunk order (the bits do not depend on the thread count),
   * summed over the ranks when expert-parallel: the balance loss and the z-loss are over all tokens */
  double *acc = r->acc;
  memset(acc, 0, (size_t)E2 * sizeof *acc);
  for (int c = 0; c < gate_chunks(T); c++)
    for (int i = 0; i < E2; i++) acc[i] += acc[(size_t)(c + 1) * E2 + i];
  acc[2 * E] = T;
  if (cfg->dist) MOE_CHECK(moe_dist_allreduce(cfg->dist, acc, E2));
  double Tg = acc[2 * E], aux = 0;
  r->Tg = Tg;
  for (int e = 0; e < E; e++) {
    r->frac1[e] = Tg > 0 ? (float)(acc[E + e] / Tg) : 0.0f;
    aux += Tg > 0 ? acc[e] / Tg * r->frac1[e] : 0.0;
  }
  r->aux = (float)(E * aux);
  r->z = Tg > 0 ? (float)(acc[2 * E + 1] / Tg) : 0.0f;
  if (r->seq_f) seq_aux_forward(cfg, r, p);
  return MOE_OK;
}

moe__side_work moe__router_work(moe__router_job *job) { return (moe__side_work){gate_rows, job, gate_chunks(job->p->T)}; }

moe_status moe__router_run(moe__router_job *job, int threads) {
  if (job->p->T == 1 && job->cfg->router == MOE_ROUTER_LINEAR) {
    moe__gemm g = linear_logits(job->cfg, job->w, job->x, job->r, 0, 1);
    MOE_CHECK(moe__gemm_row(&g, threads));
    route_chunk(job, 0);
    return MOE_OK;
  }
  moe__side_work work = moe__router_work(job);
  return moe__gemm_run_side(NULL, 0, threads, &work);
}

moe_status moe__router_backward(const moe_layer_config *cfg, const moe__weights *wp, const moe__weights *gwp,
                                const float *x, const moe__router *r, const moe__plan *pl, const float *dw,
                                float daux, float dz, moe__arena *a, int nt, float *dx) {
  int T = pl->T, k = pl->k, E = cfg->E, D = cfg->D, P = cfg->proj_dim;
  const moe__weights w = *wp, gw = *gwp;
  float *dl = moe__arena_alloc(a, (size_t)T * E * 4); /* dprobs, then dlogits in place */
  float *dp = NULL, *de = NULL;
  if (cfg->router == MOE_ROUTER_COSINE) {
    dp = moe__arena_alloc(a, (size_t)T * P * 4);
    de = moe__arena_alloc(a, (size_t)E * P * 4);
  }
  MOE_TRY(dl && (cfg->router != MOE_ROUTER_COSINE || de), MOE_ERR_STATE,
          "internal: router backward workspace too small");
  int norm = cfg->normalize_topk < 0 ? k > 1 : cfg->normalize_topk, sig = cfg->score == MOE_SCORE_SIGMOID;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < T; t++) {
    float *g = dl + (size_t)t * E; /* d scores, then d logits */
    const float *p = r->probs + (size_t)t * E, *l = r->logits + (size_t)t * E;
    const float *tp = r->top_p + (size_t)t * k, *d = dw + (size_t)t * k;
    const int32_t *te = pl->top_e + (size_t)t * k;
    float ss = 1.0f, dot = 0; /* sigmoid: the balance loss's probabilities are p / ss */
    if (sig) {
      double s = 0;
      for (int e = 0; e < E; e++) s += p[e];
      ss = (float)s;
    }
    for (int e = 0; e < E; e++) g[e] = daux * E * r->frac1[e] / (float)r->Tg;
    if (r->seq_f) { /* the sequence-wise loss: alpha f_{s,e} / (S T_s) on the normalized scores */
      const float *f = r->seq_f + (size_t)(t / r->seq_len) * E;
      float c = cfg->seq_aux_alpha / ((float)r->seq_n * (float)r->seq_len);
      for (int e = 0; e < E; e++) g[e] += c * f[e];
    }
    if (sig) { /* through q = p / ss */
      for (int e = 0; e < E; e++) dot += g[e] * p[e] / ss;
      for (int e = 0; e < E; e++) g[e] = (g[e] - dot) / ss;
    }
    /* w_j = scale p_j / S when renormalized: dp_j = (u_j - sum_i u_i p_i / S) / S with u = scale dw */
    float S = 0, dv = 0, sc = cfg->routed_scale;
    for (int j = 0; j < k; j++) S += tp[j];
    for (int j = 0; j < k; j++) dv += d[j] * sc * (tp[j] / S);
    for (int j = 0; j < k; j++) g[te[j]] += norm ? (d[j] * sc - dv) / S : d[j] * sc;
    float zc = dz * 2.0f * r->lse[t] / (float)r->Tg;
    if (sig) { /* each score its own sigmoid; the z-loss through softmax(logits) */
      for (int e = 0; e < E; e++) g[e] = g[e] * p[e] * (1.0f - p[e]) + zc * expf(l[e] - r->lse[t]);
      continue;
    }
    dot = 0;
    for (int e = 0; e < E; e++) dot += g[e] * p[e];
    for (int e = 0; e < E; e++) g[e] = p[e] * (g[e] - dot) + zc * p[e];
  }
  if (cfg->router == MOE_ROUTER_LINEAR) {
    moe__gemm g[2] = {
        {true, false, E, D, T, 1.0f, 1.0f, dl, E, x, D, gw.gw, D, false},   /* dWg += dl^T x */
        {false, false, T, D, E, 1.0f, 1.0f, dl, E, w.gw, D, dx, D, false},  /* dx += dl Wg */
    };
    moe__gemm_run(g, 2, nt);
    if (gw.gb)
      for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) gw.gb[e] += dl[(size_t)t * E + e];
    return MOE_OK;
  }
  float sc = cosine_scale(&w);
  if (w.scale[0] < LOG_MAX_SCALE) { /* d logits / d s = logits while unclamped */
    double acc = 0;
    for (size_t i = 0; i < (size_t)T * E; i++) acc += (double)dl[i] * r->logits[i];
    gw.scale[0] += (float)acc;
  }
  moe__gemm g[2] = {
      {false, false, T, P, E, sc, 0.0f, dl, E, r->emb, P, dp, P, false},  /* d proj_n = s dl emb_n */
      {true, false, E, P, T, sc, 0.0f, dl, E, r->proj, P, de, P, false},  /* d emb_n = s dl^T proj_n */
  };
  moe__gemm_run(g, 2, nt);
  normalize_rows_backward(dp, r->proj, r->proj_norm, T, P, nt);
  normalize_rows_backward(de, r->emb, r->emb_norm, E, P, nt);
  for (size_t i = 0; i < (size_t)E * P; i++) gw.gw[i] += de[i];
  moe__gemm h[2] = {
      {true, false, P, D, T, 1.0f, 1.0f, dp, P, x, D, gw.pw, D, false},   /* dWp += dp^T x */
      {false, false, T, D, P, 1.0f, 1.0f, dp, P, w.pw, D, dx, D, false},  /* dx += dp Wp */
  };
  moe__gemm_run(h, 2, nt);
  for (int t = 0; t < T; t++)
    for (int p = 0; p < P; p++) gw.pb[p] += dp[(size_t)t * P + p];
  return MOE_OK;
}
