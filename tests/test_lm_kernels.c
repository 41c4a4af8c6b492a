/* The language model's kernels (src/lm/kernels.h) against double-precision references written here:
 * forward outputs compared with the reference, backward gradients with central differences of the
 * reference's L = <dy, f(x)> in double (so the differences are exact to about 1e-9). Attention runs
 * past one query block (T > 64) with grouped heads, and with a KV-cache offset. */
#include <stdlib.h>

#include "fdcheck.h"
#include "lm/kernels.h"
#include "test.h"

#define FD_EPS 1e-6
#define FD_ATOL 1e-4
#define FD_RTOL 1e-3

typedef double (*ref_loss)(const void *ctx, const double *in);

/* Central differences of L along up to `elems` inputs [off, off + n) of in, spread evenly, against
 * the float gradient g (n); prints and returns 0 on the first mismatch. */
static int fd_grad(ref_loss L, const void *ctx, double *in, size_t off, size_t n, const float *g, int elems,
                   const char *what) {
  size_t step = n > (size_t)elems ? n / (size_t)elems : 1;
  for (size_t i = 0; i < n; i += step) {
    double keep = in[off + i];
    in[off + i] = keep + FD_EPS;
    double lp = L(ctx, in);
    in[off + i] = keep - FD_EPS;
    double lm = L(ctx, in);
    in[off + i] = keep;
    double fd = (lp - lm) / (2 * FD_EPS);
    if (!(fabs(fd - g[i]) <= FD_ATOL + FD_RTOL * fabs(fd))) {
      fprintf(stderr, "  %s[%zu]: analytic %.8g, finite difference %.8g\n", what, i, (double)g[i], fd);
      return 0;
    }
  }
  return 1;
}

static double *to_double(const float *a, size_t n) {
  double *d = malloc(n * sizeof *d);
  for (size_t i = 0; d && i < n; i++) d[i] = a[i];
  return d;
}

static double max_abs_diff(const float *a, const double *b, size_t n) {
  double w = 0;
  for (size_t i = 0; i < n; i++) w = fmax(w, fabs(a[i] - b[i]));
  return w;
}

/* ---- RMSNorm ---- */
typedef struct { int n, d; float eps; const float *dy; } rms_ctx;

static void rms_ref(const rms_ctx *c, const double *x, const double *w, double *y) {
  for (int i = 0; i < c->n; i++) {
    double ss = 0;
    for (int j = 0; j < c->d; j++) ss += x[i * c->d + j] * x[i * c->d + j];
    double r = 1 / sqrt(ss / c->d + c->eps);
    for (int j = 0; j < c->d; j++) y[i * c->d + j] = x[i * c->d + j] * r * w[j];
  }
}

static double rms_loss(const void *ctx, const double *in) { /* in: x (n, d) then w (d) */
  const rms_ctx *c = ctx;
  size_t nd = (size_t)c->n * c->d;
  double *y = malloc(nd * sizeof *y), L = 0;
  rms_ref(c, in, in + nd, y);
  for (size_t i = 0; i < nd; i++) L += c->dy[i] * y[i];
  free(y);
  return L;
}

TEST(lm_rmsnorm_forward_backward) {
  enum { n = 5, d = 37 };
  uint64_t rng = 41;
  float x[n * d + d], dy[n * d], y[n * d], rstd[n], dx[n * d], dw[d];
  fd_fill(&rng, x, n * d + d, -2, 2);
  fd_fill(&rng, dy, n * d, -1, 1);
  rms_ctx c = {n, d, 1e-5f, dy};
  moe__rmsnorm_forward(x, x + n * d, n, d, c.eps, y, rstd, 2);
  double *in = to_double(x, n * d + d), yr[n * d];
  rms_ref(&c, in, in + n * d, yr);
  double e = max_abs_diff(y, yr, n * d);
  if (e > 1e-5) FAIL_("rmsnorm forward differs from the double reference by %g", e);
  memset(dx, 0, sizeof dx);
  memset(dw, 0, sizeof dw);
  moe__rmsnorm_backward(dy, x, x + n * d, rstd, n, d, dx, dw, 2);
  int ok = fd_grad(rms_loss, &c, in, 0, n * d, dx, n * d, "rmsnorm dx") &&
           fd_grad(rms_loss, &c, in, n * d, d, dw, d, "rmsnorm dw");
  free(in);
  ASSERT(ok);
}

/* ---- rotary embeddings ---- */
TEST(lm_rope_rotates_pairs_and_inverts) {
  enum { B = 2, T = 5, heads = 3, hd = 6, ld = heads * hd + 4, pos0 = 3, npos = pos0 + T };
  float cs[npos * hd / 2], sn[npos * hd / 2], x[B * T * ld], y[B * T * ld];
  moe__rope_tables(cs, sn, npos, hd, 10000.0f);
  uint64_t rng = 7;
  fd_fill(&rng, x, B * T * ld, -1, 1);
  memcpy(y, x, sizeof x);
  moe__rope_apply(y, ld, B, T, heads, hd, pos0, cs, sn, 0, 2);
  double worst = 0;
  for (int bt = 0; bt < B * T; bt++) {
    int pos = pos0 + bt % T;
    for (int c = heads * hd; c < ld; c++) ASSERT(y[bt * ld + c] == x[bt * ld + c]); /* past the heads: untouched */
    for (int h = 0; h < heads; h++)
      for (int i = 0; i < hd / 2; i++) {
        double ang = pos * pow(10000.0, -2.0 * i / hd);
        double a = x[bt * ld + h * hd + i], b = x[bt * ld + h * hd + i + hd / 2];
        worst = fmax(worst, fabs(y[bt * ld + h * hd + i] - (a * cos(ang) - b * sin(ang))));
        worst = fmax(worst, fabs(y[bt * ld + h * hd + i + hd / 2] - (b * cos(ang) + a * sin(ang))));
      }
  }
  if (worst > 2e-6) FAIL_("rope differs from rotate_half in double by %g", worst);
  /* backward = the transposed rotation: it undoes the forward */
  moe__rope_apply(y, ld, B, T, heads, hd, pos0, cs, sn, 1, 2);
  for (int i = 0; i < B * T * ld; i++) ASSERT_NEAR(y[i], x[i], 1e-6);
}

/* ---- attention ---- */
typedef struct { int B, T, pos0, nh, nkv, hd, ld; const float *dO; int window; const double *sinks; } att_ctx;

/* o (B, T - pos0, nh hd) for queries at positions [pos0, T) over all T keys of qkv (B, T, ld): query t
 * sees keys [0, t], or with a window the last `window` of them (transformers' sliding_window mask,
 * kv_idx > q_idx - sliding_window); with sinks, head h's sinks[h] joins each softmax with no value (gpt-oss's
 * eager_attention_forward: the sink column concatenated to the scores, dropped after the softmax). */
static void att_ref(const att_ctx *c, const double *qkv, double *o) {
  int qd = c->nh * c->hd, Tq = c->T - c->pos0;
  double *s = malloc((size_t)c->T * sizeof *s);
  for (int b = 0; b < c->B; b++)
    for (int h = 0; h < c->nh; h++) {
      int g = h / (c->nh / c->nkv);
      for (int t = c->pos0; t < c->T; t++) {
        const double *q = qkv + ((size_t)b * c->T + t) * c->ld + h * c->hd;
        double mx = c->sinks ? c->sinks[h] : -INFINITY, sum = 0;
        int lo = c->window && t + 1 > c->window ? t + 1 - c->window : 0;
        for (int j = lo; j <= t; j++) {
          const double *k = qkv + ((size_t)b * c->T + j) * c->ld + qd + g * c->hd;
          double dot = 0;
          for (int i = 0; i < c->hd; i++) dot += q[i] * k[i];
          s[j] = dot / sqrt((double)c->hd);
          mx = fmax(mx, s[j]);
        }
        if (c->sinks) sum = exp(c->sinks[h] - mx);
        for (int j = lo; j <= t; j++) sum += (s[j] = exp(s[j] - mx));
        double *out = o + ((size_t)b * Tq + t - c->pos0) * qd + h * c->hd;
        for (int i = 0; i < c->hd; i++) out[i] = 0;
        for (int j = lo; j <= t; j++) {
          const double *v = qkv + ((size_t)b * c->T + j) * c->ld + qd + (c->nkv + g) * c->hd;
          for (int i = 0; i < c->hd; i++) out[i] += s[j] / sum * v[i];
        }
      }
    }
  free(s);
}

static double att_loss(const void *ctx, const double *in) {
  const att_ctx *c = ctx;
  size_t n = (size_t)c->B * c->T * c->nh * c->hd;
  double *o = malloc(n * sizeof *o), L = 0;
  att_ref(c, in, o);
  for (size_t i = 0; i < n; i++) L += c->dO[i] * o[i];
  free(o);
  return L;
}

static void attention_case(int *failed_, int window, int sinks);

TEST(lm_attention_blocks_gqa_backward_and_cache) { attention_case(failed_, 0, 0); }

/* Mixtral's sliding window: 70 keys, more than a query block, and 1 (each query its own value). */
TEST(lm_attention_sliding_window) {
  attention_case(failed_, 70, 0);
  if (!*failed_) attention_case(failed_, 1, 0);
}

/* gpt-oss's sinks, with its sliding window and without: forward, dqkv, dsinks and the cached decode. */
TEST(lm_attention_sinks) {
  attention_case(failed_, 0, 1);
  if (!*failed_) attention_case(failed_, 70, 1);
}

static void attention_case(int *failed_, int window, int sinks) {
  enum { B = 2, T = 150, nh = 4, nkv = 2, hd = 8, qd = nh * hd, ld = qd + 2 * nkv * hd };
  size_t nqkv = (size_t)B * T * ld, no = (size_t)B * T * qd;
  float *qkv = malloc(nqkv * 4), *o = malloc(no * 4), *dO = malloc(no * 4), *d = malloc(nqkv * 4);
  float *lse = malloc((size_t)B * nh * T * 4);
  double *o64 = malloc(no * sizeof *o64);
  ASSERT(qkv && o && dO && d && lse && o64);
  uint64_t rng = 5;
  fd_fill(&rng, qkv, nqkv, -1.5, 1.5);
  fd_fill(&rng, dO, no, -1, 1);
  float sk[nh] = {1.5f, -0.75f, 3.0f, 0.25f}, dsk[nh] = {0};
  double sk64[nh];
  for (int h = 0; h < nh; h++) sk64[h] = sk[h];
  moe__attn a = {B, T, 0, nh, nkv, hd, ld, ld, (size_t)T * ld, qkv, qkv + qd, qkv + qd + nkv * hd, o, lse, window,
                 sinks ? sk : NULL};
  float *scratch = malloc(moe__attn_scratch(&a, 2));
  moe__attn_forward(&a, scratch, 2);
  float *lse0 = malloc((size_t)B * nh * T * 4); /* the full pass's: the cached decodes below write lse */
  ASSERT(lse0);
  memcpy(lse0, lse, (size_t)B * nh * T * 4);
  att_ctx c = {B, T, 0, nh, nkv, hd, ld, dO, window, sinks ? sk64 : NULL};
  double *in = to_double(qkv, nqkv);
  att_ref(&c, in, o64);
  double e = max_abs_diff(o, o64, no);
  if (e > 1e-5) FAIL_("attention forward differs from the double reference by %g", e);
  moe__attn_backward(&a, dO, d, d + qd, d + qd + nkv * hd, scratch, 2);
  /* every other column of several rows across the three query blocks: q, k and v of both kv heads */
  int ok = 1;
  for (int t = 0; ok && t < T; t += 37)
    ok = fd_grad(att_loss, &c, in, (size_t)(B - 1) * T * ld + (size_t)t * ld, ld,
                 d + (size_t)(B - 1) * T * ld + (size_t)t * ld, ld / 2, "attention dqkv row");
  ASSERT(ok);
  if (sinks) { /* central differences of each sink */
    moe__attn_sinks_backward(&a, dO, dsk, 2);
    for (int h = 0; h < nh; h++) {
      double keep = sk64[h], lp, lm;
      sk64[h] = keep + 1e-5, lp = att_loss(&c, in);
      sk64[h] = keep - 1e-5, lm = att_loss(&c, in);
      sk64[h] = keep;
      double fd = (lp - lm) / 2e-5;
      if (!(fabs(fd - dsk[h]) <= 1e-4 * fmax(1, fabs(fd)))) FAIL_("dsinks[%d] = %g, central difference %g", h, dsk[h], fd);
      ASSERT(fabs(fd) > 1e-3); /* a sink that matters */
    }
  }
  /* decoding: queries [100, 150) against a cache of all 150 keys give the last rows of the full pass
   * (to rounding: the query blocks, so the GEMM shapes, differ) */
  a.Tq = T - 100;
  a.pos0 = 100;
  float *q2 = malloc((size_t)B * 50 * ld * 4), *o2 = malloc((size_t)B * 50 * qd * 4);
  for (int b = 0; b < B; b++) memcpy(q2 + (size_t)b * 50 * ld, qkv + ((size_t)b * T + 100) * ld, 50 * ld * 4);
  a.q = q2;
  a.o = o2;
  float *scratch2 = malloc(moe__attn_scratch(&a, 2));
  moe__attn_forward(&a, scratch2, 2);
  for (int b = 0; b < B; b++)
    for (int i = 0; i < 50 * qd; i++) ASSERT_NEAR(o2[(size_t)b * 50 * qd + i], o[((size_t)b * T + 100) * qd + i], 1e-6);
  free(q2), free(o2), free(scratch2);
  /* one query row at a time (a decode step's own path, its keys in tiles of 32): each position's output
   * and log-sum-exp as the full pass gave them (before, at and past the window's reach, the last key),
   * on 1 to 3 threads (3 split a row's heads between two threads) */
  int at[] = {0, 1, 69, 70, 71, 100, T - 1};
  a.Tq = 1;
  for (int i = 0; i < 3 * (int)(sizeof at / sizeof *at); i++) {
    int p = at[i / 3], nt = 1 + i % 3;
    a.pos0 = p;
    float q1[B * ld], o1[B * qd], lse1[B * nh];
    for (int b = 0; b < B; b++) memcpy(q1 + (size_t)b * ld, qkv + ((size_t)b * T + p) * ld, ld * 4);
    a.q = q1, a.o = o1, a.lse = lse1;
    float *scratch1 = malloc(moe__attn_scratch(&a, nt));
    ASSERT(scratch1);
    moe__attn_forward(&a, scratch1, nt);
    free(scratch1);
    for (int b = 0; b < B; b++) {
      for (int j = 0; j < qd; j++) {
        double want = o64[((size_t)b * T + p) * qd + j];
        if (!(fabs(o1[(size_t)b * qd + j] - want) <= 1e-5))
          FAIL_("decode row at position %d, %d threads, batch %d, value %d: %.8g, reference %.8g", p, nt, b, j,
                o1[(size_t)b * qd + j], want);
      }
      for (int h = 0; h < nh; h++)
        if (!(fabsf(lse1[b * nh + h] - lse0[((size_t)b * nh + h) * T + p]) <= 1e-5f))
          FAIL_("decode row at position %d, batch %d, head %d: lse %.8g, the full pass's %.8g", p, b, h, lse1[b * nh + h],
                lse0[((size_t)b * nh + h) * T + p]);
    }
  }
  free(in), free(qkv), free(o), free(dO), free(d), free(lse), free(lse0), free(o64), free(scratch);
}

/* ---- embedding and cross-entropy ---- */
TEST(lm_embed_gathers_and_scatter_adds) {
  float table[4 * 3], x[5 * 3], dt[4 * 3] = {0};
  for (int i = 0; i < 12; i++) table[i] = (float)i;
  int32_t tok[5] = {2, 0, 2, 3, 2};
  moe__embed_forward(table, tok, 5, 3, x);
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 3; j++) ASSERT(x[i * 3 + j] == table[tok[i] * 3 + j]);
  moe__embed_backward(dt, tok, 5, 3, x); /* token 2 three times */
  ASSERT(dt[2 * 3 + 1] == 3 * table[2 * 3 + 1] && dt[1 * 3] == 0 && dt[0] == 0 && dt[3 * 3 + 2] == table[3 * 3 + 2]);
}

typedef struct { int n, V; const int32_t *tgt; } xent_ctx;

static double xent_loss(const void *ctx, const double *in) { /* mean over counted rows */
  const xent_ctx *c = ctx;
  double L = 0;
  int cnt = 0;
  for (int i = 0; i < c->n; i++) {
    if (c->tgt[i] < 0) continue;
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < c->V; j++) mx = fmax(mx, in[i * c->V + j]);
    for (int j = 0; j < c->V; j++) s += exp(in[i * c->V + j] - mx);
    L += mx + log(s) - in[i * c->V + c->tgt[i]];
    cnt++;
  }
  return L / cnt;
}

static void xent_case(int *failed_, int V);

/* V 11: one masked vector of the AVX-512 path; 37: two whole ones and a masked one. */
TEST(lm_cross_entropy_forward_backward) {
  xent_case(failed_, 11);
  if (!*failed_) xent_case(failed_, 37);
}

static void xent_case(int *failed_, int V) {
  enum { n = 6 };
  float lg[n * 37], lse[n];
  int32_t tgt[n] = {3, -1, 0, 10, 7, 7};
  uint64_t rng = 9;
  fd_fill(&rng, lg, n * V, -4, 4);
  double *in = to_double(lg, n * V);
  xent_ctx c = {n, V, tgt};
  int cnt;
  double sum = moe__xent_forward(lg, tgt, n, V, lse, &cnt, 2);
  ASSERT_EQ_INT(cnt, 5);
  ASSERT_NEAR(sum / cnt, xent_loss(&c, in), 1e-5);
  moe__xent_backward(lg, lse, tgt, n, V, 1.0f / cnt, 2);
  for (int j = 0; j < V; j++) ASSERT(lg[V + j] == 0); /* the ignored row */
  int ok = fd_grad(xent_loss, &c, in, 0, n * V, lg, n * V, "cross-entropy dlogits");
  free(in);
  ASSERT(ok);
}

/* ---- Mixtral's balance loss ---- */
typedef struct { int L, N, E, D, k; const int32_t *ex; float coef; } lbl_ctx;

/* coef * E * sum_e F_e P_e over the L layers, each with its own xn (N, D) and gate (E, D) in `in`. */
static double lbl_loss(const void *ctx, const double *in) {
  const lbl_ctx *c = ctx;
  double F[8] = {0}, P[8] = {0}, rows = (double)c->L * c->N;
  for (int l = 0; l < c->L; l++) {
    const double *xn = in + (size_t)l * (c->N + c->E) * c->D, *wg = xn + (size_t)c->N * c->D;
    for (int t = 0; t < c->N; t++) {
      double lg[8], mx = -INFINITY, s = 0;
      for (int e = 0; e < c->E; e++) {
        lg[e] = 0;
        for (int j = 0; j < c->D; j++) lg[e] += xn[t * c->D + j] * wg[e * c->D + j];
        mx = fmax(mx, lg[e]);
      }
      for (int e = 0; e < c->E; e++) s += (lg[e] = exp(lg[e] - mx));
      for (int e = 0; e < c->E; e++) P[e] += lg[e] / s / rows;
      for (int j = 0; j < c->k; j++) F[c->ex[((size_t)l * c->N + t) * c->k + j]] += 1 / rows;
    }
  }
  double aux = 0;
  for (int e = 0; e < c->E; e++) aux += F[e] * P[e];
  return c->coef * c->E * aux;
}

TEST(lm_balance_loss_forward_backward) {
  enum { L = 2, N = 7, E = 4, D = 5, k = 2, per = (N + E) * D };
  float in[L * per], probs[L][N * E], g[N * E], grad[L * per];
  int32_t ex[L * N * k];
  uint64_t rng = 3;
  fd_fill(&rng, in, L * per, -1, 1);
  for (int i = 0; i < L * N; i++) {
    ex[i * k] = (int32_t)(fd_next(&rng) % E);
    ex[i * k + 1] = (ex[i * k] + 1 + (int32_t)(fd_next(&rng) % (E - 1))) % E;
  }
  double sums[2 * E] = {0};
  moe__lbl b = {L, N, E, D, k, sums, sums + E, (double)L * N, 0};
  for (int l = 0; l < L; l++)
    ASSERT_OK(moe__lbl_forward(&b, in + l * per, in + l * per + N * D, NULL, ex + l * N * k, probs[l], 2));
  lbl_ctx c = {L, N, E, D, k, ex, 0.5f};
  double *in64 = to_double(in, L * per);
  ASSERT_NEAR(0.5 * moe__lbl_value(&b), lbl_loss(&c, in64), 1e-6);
  memset(grad, 0, sizeof grad);
  for (int l = 0; l < L; l++)
    ASSERT_OK(moe__lbl_backward(&b, 0.5f, in + l * per, in + l * per + N * D, ex + l * N * k, probs[l], g,
                                grad + l * per + N * D, NULL, grad + l * per, 2));
  int ok = fd_grad(lbl_loss, &c, in64, 0, L * per, grad, L * per, "balance loss d(xn, gate)");
  free(in64);
  ASSERT(ok);
}

/* gpt-oss's variant as transformers' GptOssForCausalLM computes it (modeling_gpt_oss.py at the commit
 * dev/gpt_oss_ref.py cites): the router output it records as router_logits is its scores z, the softmax
 * of the k selected logits x wg^T + bg scattered into zeros, which load_balancing_loss_func softmaxes
 * again: P_e the mean of softmax(z)_e, F_e the selected experts' share. Each layer's xn (N, D), gate
 * (E, D) and bias (E) in `in`. */
static double lbl_sparse_loss(const void *ctx, const double *in) {
  const lbl_ctx *c = ctx;
  double F[8] = {0}, P[8] = {0}, rows = (double)c->L * c->N;
  for (int l = 0; l < c->L; l++) {
    const double *xn = in + (size_t)l * ((c->N + c->E) * c->D + c->E), *wg = xn + (size_t)c->N * c->D;
    const double *bg = wg + (size_t)c->E * c->D;
    for (int t = 0; t < c->N; t++) {
      const int32_t *ex = c->ex + ((size_t)l * c->N + t) * c->k;
      double lg[8], z[8] = {0}, mx = -INFINITY, s = 0, q = 0;
      for (int e = 0; e < c->E; e++) {
        lg[e] = bg[e];
        for (int j = 0; j < c->D; j++) lg[e] += xn[t * c->D + j] * wg[e * c->D + j];
      }
      for (int j = 0; j < c->k; j++) mx = fmax(mx, lg[ex[j]]);
      for (int j = 0; j < c->k; j++) s += exp(lg[ex[j]] - mx);
      for (int j = 0; j < c->k; j++) z[ex[j]] = exp(lg[ex[j]] - mx) / s;
      for (int e = 0; e < c->E; e++) q += exp(z[e]);
      for (int e = 0; e < c->E; e++) P[e] += exp(z[e]) / q / rows;
      for (int j = 0; j < c->k; j++) F[ex[j]] += 1 / rows;
    }
  }
  double aux = 0;
  for (int e = 0; e < c->E; e++) aux += F[e] * P[e];
  return c->coef * c->E * aux;
}

TEST(lm_balance_loss_gpt_oss_scores) {
  enum { L = 2, N = 7, E = 4, D = 5, k = 2, per = (N + E) * D + E };
  float in[L * per], probs[L][N * E], g[N * E], grad[L * per];
  int32_t ex[L * N * k];
  uint64_t rng = 5;
  fd_fill(&rng, in, L * per, -1, 1);
  for (int i = 0; i < L * N; i++) {
    ex[i * k] = (int32_t)(fd_next(&rng) % E);
    ex[i * k + 1] = (ex[i * k] + 1 + (int32_t)(fd_next(&rng) % (E - 1))) % E;
  }
  double sums[2 * E] = {0};
  moe__lbl b = {L, N, E, D, k, sums, sums + E, (double)L * N, 1};
  for (int l = 0; l < L; l++)
    ASSERT_OK(moe__lbl_forward(&b, in + l * per, in + l * per + N * D, in + l * per + (N + E) * D, ex + l * N * k,
                               probs[l], 2));
  lbl_ctx c = {L, N, E, D, k, ex, 0.5f};
  double *in64 = to_double(in, L * per);
  ASSERT_NEAR(0.5 * moe__lbl_value(&b), lbl_sparse_loss(&c, in64), 1e-6);
  memset(grad, 0, sizeof grad);
  for (int l = 0; l < L; l++)
    ASSERT_OK(moe__lbl_backward(&b, 0.5f, in + l * per, in + l * per + N * D, ex + l * N * k, probs[l], g,
                                grad + l * per + N * D, grad + l * per + (N + E) * D, grad + l * per, 2));
  int ok = fd_grad(lbl_sparse_loss, &c, in64, 0, L * per, grad, L * per, "gpt-oss balance loss d(xn, gate, bias)");
  free(in64);
  ASSERT(ok);
}

/* YaRN's tables (moe__rope_tables_yarn) against its definition computed here in double: frequencies
 * mixed between theta^(-2i/d) and that over the factor by the ramp between the correction dims, the
 * ramp's ends floored and ceiled with truncate (DeepSeek, transformers' default) and not without it
 * (gpt-oss), cos and sin times get_mscale(f, mscale) / get_mscale(f, mscale_all_dim). The two settings
 * must differ here, so that the flag is seen to matter. */
TEST(lm_rope_yarn_tables_match_definition) {
  enum { NPOS = 40, HD = 16 };
  float cs[2][NPOS * HD / 2], sn[NPOS * HD / 2];
  const double theta = 10000, pi = 3.14159265358979323846;
  for (int trunc = 0; trunc <= 1; trunc++) {
    moe_lm_yarn y = {4.0f, 64, 32.0f, 1.0f, 1.0f, 0.5f, trunc};
    moe__rope_tables_yarn(cs[trunc], sn, NPOS, HD, (float)theta, &y);
    double dim_of[2], att = (0.1 * log(4.0) + 1) / (0.1 * 0.5 * log(4.0) + 1), worst = 0;
    for (int j = 0; j < 2; j++) /* beta_fast 32, then beta_slow 1 */
      dim_of[j] = HD * log(64 / ((j ? 1.0 : 32.0) * 2 * pi)) / (2 * log(theta));
    double lo = trunc ? floor(dim_of[0]) : dim_of[0], hi = trunc ? ceil(dim_of[1]) : dim_of[1];
    lo = fmax(lo, 0), hi = fmin(hi, HD - 1);
    for (int i = 0; i < HD / 2; i++) {
      double base = pow(theta, 2.0 * i / HD), ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1);
      double inv = ramp / (4.0 * base) + (1 - ramp) / base;
      for (int p = 0; p < NPOS; p++) {
        worst = fmax(worst, fabs(cs[trunc][p * HD / 2 + i] - cos(p * inv) * att));
        worst = fmax(worst, fabs(sn[p * HD / 2 + i] - sin(p * inv) * att));
      }
    }
    if (worst > 2e-5) FAIL_("yarn tables (truncate %d) differ from the definition by %g", trunc, worst);
  }
  double diff = 0;
  for (int i = 0; i < NPOS * HD / 2; i++) diff = fmax(diff, fabs(cs[0][i] - cs[1][i]));
  ASSERT(diff > 1e-3);
}
