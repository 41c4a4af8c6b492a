/* The classifier model (see moe.h): input projection, L pre-norm MoE blocks, final LayerNorm and a
 * softmax head, trained with the cooperation or the specification loss. Forward keeps every
 * block's activations in one arena; backward walks the blocks in reverse. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "dist/dist.h"
#include "kernels/gemm.h"
#include "internal.h"
#include "kernels/norm.h"

struct moe__model_state {
  moe__arena arena;
  int threads, B, k, has_labels; /* k: the last block's top-k at the forward */
  double Bg;          /* samples in the global batch: B summed over the ranks */
  size_t dense_n;     /* floats in the dense (replicated) parameters */
  const float *x;     /* (B, in) caller's */
  uint8_t *labels;    /* (B) */
  float **h;          /* L + 1 of (B, D): block inputs, h[L] the last output */
  float **xn;         /* L of (B, D): normalized block inputs */
  float **mean, **rstd; /* L of (B) */
  float *hn, *meanf, *rstdf; /* final norm (B, D), (B), (B) */
  float *logits;      /* (B, C), softmax in place after the loss */
  int32_t *pred;      /* (B) */
  /* specification loss: one prediction per assignment of the last block, rows t*k+j */
  float *spec, *hs, *hsn, *means, *rstds, *slogits, *sce; /* (Bk, D) x3, (Bk) x2, (Bk, C), (Bk) */
  moe_layer_stats *lstats; /* (L) */
  float **ptrs;       /* backing store of h, xn, mean, rstd */
  char bad[256];      /* the forward's first non-finite activation, "" while there is none */
};

const char *moe_loss_name(moe_loss_kind k) { return k == MOE_LOSS_SPECIFICATION ? "specification" : "cooperation"; }

moe_status moe_loss_parse(const char *s, const char *field, moe_loss_kind *out) {
  MOE_TRY(s, MOE_ERR_ARG, "%s: missing value", field);
  if (!strcmp(s, "cooperation") || !strcmp(s, "coop")) *out = MOE_LOSS_COOPERATION;
  else if (!strcmp(s, "specification") || !strcmp(s, "spec")) *out = MOE_LOSS_SPECIFICATION;
  else return moe__error(MOE_ERR_ARG, __FILE__, __LINE__, "%s: unknown value '%s' (want cooperation|specification)", field, s);
  return MOE_OK;
}

void moe_model_config_default(moe_model_config *c) {
  memset(c, 0, sizeof *c);
  moe_layer_config_default(&c->moe);
  c->blocks = 1;
  c->loss = MOE_LOSS_COOPERATION;
  c->aux_weight = 0.01f;
}

static void add_ref(moe_model_t *m, const char *name, int ndim, const int64_t *shape, float *data, float *grad) {
  moe_tensor_ref *r = &m->refs[m->nrefs++];
  snprintf(r->name, sizeof r->name, "%s", name);
  r->ndim = ndim;
  r->numel = 1;
  for (int d = 0; d < ndim; d++) {
    r->shape[d] = shape[d];
    r->numel *= (size_t)shape[d];
  }
  r->data = data;
  r->grad = grad;
  m->numel += r->numel;
}

moe_status moe_model_init(moe_model_t *m, const moe_model_config *c) {
  MOE_TRY(m && c, MOE_ERR_ARG, "moe_model_init: NULL argument");
  memset(m, 0, sizeof *m);
  MOE_TRY(c->in_dim > 0, MOE_ERR_ARG, "model: in_dim must be > 0, got %d", c->in_dim);
  MOE_TRY(c->moe.D > 0 && c->moe.H > 0 && c->moe.E > 0, MOE_ERR_ARG, "model: D, H and E must be > 0 (got %d, %d, %d)",
          c->moe.D, c->moe.H, c->moe.E);
  MOE_TRY(c->classes > 1, MOE_ERR_ARG, "model: classes must be > 1, got %d", c->classes);
  MOE_TRY(c->blocks >= 1 && c->blocks <= 64, MOE_ERR_ARG, "model: blocks must be in [1, 64], got %d", c->blocks);
  MOE_TRY(isfinite(c->aux_weight) && isfinite(c->z_weight), MOE_ERR_ARG, "model: loss weights must be finite");
  MOE_TRY((unsigned)c->loss <= MOE_LOSS_SPECIFICATION, MOE_ERR_ARG, "model: unknown loss %d", c->loss);
  m->cfg = *c;
  int L = c->blocks, D = c->moe.D, C = c->classes, in = c->in_dim;
  m->layers = calloc((size_t)L, sizeof *m->layers);
  m->st = calloc(1, sizeof *m->st);
  size_t dense = (size_t)D * in + D + (size_t)L * 2 * D + 2 * D + (size_t)C * D + C;
  m->dense = calloc(dense, 4);
  m->dense_grad = calloc(dense, 4);
  size_t per_layer = 12 + (size_t)(c->moe.inner_experts ? c->moe.E : 0) * 12;
  m->refs = calloc((size_t)6 + (size_t)L * per_layer, sizeof *m->refs);
  if (m->st) {
    m->st->lstats = calloc((size_t)L, sizeof *m->st->lstats);
    m->st->ptrs = calloc((size_t)4 * L + 1, sizeof(float *));
  }
  if (!m->layers || !m->st || !m->dense || !m->dense_grad || !m->refs || !m->st->lstats || !m->st->ptrs) {
    moe_model_free(m);
    MOE_TRY(0, MOE_ERR_NOMEM, "moe_model_init: out of memory");
  }
  moe__model_state *s = m->st;
  s->dense_n = dense;
  s->h = s->ptrs;
  s->xn = s->h + L + 1;
  s->mean = s->xn + L;
  s->rstd = s->mean + L;
  for (int i = 0; i < L; i++) {
    moe_status st = moe_layer_init(&m->layers[i], &c->moe);
    if (st != MOE_OK) {
      moe_model_free(m);
      return st;
    }
  }
  float *p = m->dense, *g = m->dense_grad;
#define DENSE(name, nd, ...)                                  \
  do {                                                        \
    int64_t shp_[] = {__VA_ARGS__};                           \
    add_ref(m, name, nd, shp_, p, g);                         \
    p += m->refs[m->nrefs - 1].numel;                         \
    g += m->refs[m->nrefs - 1].numel;                         \
  } while (0)
  DENSE("in.weight", 2, D, in);
  DENSE("in.bias", 1, D);
  char name[64];
  for (int i = 0; i < L; i++) {
    snprintf(name, sizeof name, "blocks.%d.norm.weight", i);
    DENSE(name, 1, D);
    snprintf(name, sizeof name, "blocks.%d.norm.bias", i);
    DENSE(name, 1, D);
    moe_layer_t *l = &m->layers[i];
    for (int j = 0; j < l->nparams; j++) {
      snprintf(name, sizeof name, "blocks.%d.moe.%s", i, l->info[j].name);
      add_ref(m, name, l->info[j].ndim, l->info[j].shape, l->params + l->info[j].offset,
              l->grads + l->info[j].offset);
    }
    for (int e = 0; l->inner && e < l->cfg.E; e++) {
      moe_layer_t *il = &l->inner[e];
      for (int j = 0; j < il->nparams; j++) {
        snprintf(name, sizeof name, "blocks.%d.moe.experts.%d.%s", i, e, il->info[j].name);
        add_ref(m, name, il->info[j].ndim, il->info[j].shape, il->params + il->info[j].offset,
                il->grads + il->info[j].offset);
      }
    }
  }
  DENSE("norm.weight", 1, D);
  DENSE("norm.bias", 1, D);
  DENSE("head.weight", 2, C, D);
  DENSE("head.bias", 1, C);
#undef DENSE
  return MOE_OK;
}

void moe_model_free(moe_model_t *m) {
  if (!m) return;
  for (int i = 0; m->caches && i < m->cfg.blocks; i++) moe_expert_cache_free(m->caches[i]);
  free(m->caches);
  moe_st_close(m->file);
  if (m->layers)
    for (int i = 0; i < m->cfg.blocks; i++) moe_layer_free(&m->layers[i]);
  if (m->st) {
    moe__arena_free(&m->st->arena);
    free(m->st->lstats);
    free(m->st->ptrs);
    free(m->st);
  }
  free(m->layers);
  free(m->refs);
  free(m->dense);
  free(m->dense_grad);
  memset(m, 0, sizeof *m);
}

const moe_tensor_ref *moe_model_find(const moe_model_t *m, const char *name) {
  return moe__ref_find(m->refs, m->nrefs, name);
}

static float *ref_data(moe_model_t *m, const char *name) { return (float *)moe_model_find(m, name)->data; }
static float *ref_grad(moe_model_t *m, const char *name) { return moe_model_find(m, name)->grad; }

void moe_model_init_params(moe_model_t *m, uint64_t seed) {
  uint64_t st = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int i = 0; i < m->cfg.blocks; i++) moe_layer_init_params(&m->layers[i], seed + 1000003ull * (i + 1));
  for (int i = 0; i < m->nrefs; i++) {
    moe_tensor_ref *r = &m->refs[i];
    if (!strncmp(r->name, "blocks.", 7) && strstr(r->name, ".moe.")) continue;
    int is_norm_w = strstr(r->name, "norm.weight") != NULL;
    for (size_t j = 0; j < r->numel; j++) {
      if (r->ndim < 2) {
        r->data[j] = is_norm_w ? 1.0f : 0.0f;
        continue;
      }
      r->data[j] = moe__uniform(&st) / sqrtf((float)r->shape[1]);
    }
  }
}

void moe_model_zero_grad(moe_model_t *m) {
  for (int i = 0; i < m->nrefs; i++) memset(m->refs[i].grad, 0, m->refs[i].numel * 4);
}

void moe_model_set_threads(moe_model_t *m, int threads) {
  m->cfg.moe.threads = threads;
  for (int i = 0; i < m->cfg.blocks; i++) moe_layer_set_threads(&m->layers[i], threads);
}

const int32_t *moe_model_predictions(const moe_model_t *m) { return m->st->pred; }
const moe_layer_stats *moe_model_layer_stats(const moe_model_t *m, int i) { return &m->st->lstats[i]; }

/* y (n, out) = x (n, in) W^T + b */
static void linear(const float *x, const float *w, const float *b, int n, int in, int out, float *y, int nt) {
  for (int i = 0; i < n; i++) memcpy(y + (size_t)i * out, b, (size_t)out * 4);
  moe__gemm g = {false, true, n, out, in, 1.0f, 1.0f, x, in, w, in, y, out, false};
  moe__gemm_run(&g, 1, nt);
}

/* dW (out, in) += dy^T x; db (out) += column sums of dy; dx (n, in) = dy W (when not NULL). */
static void linear_backward(const float *dy, const float *x, const float *w, int n, int in, int out,
                            float *dw, float *db, float *dx, int nt) {
  moe__gemm g[2] = {{true, false, out, in, n, 1.0f, 1.0f, dy, out, x, in, dw, in, false},
                    {false, false, n, in, out, 1.0f, 0.0f, dy, out, w, in, dx, in, false}};
  moe__gemm_run(g, dx ? 2 : 1, nt);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < out; j++) db[j] += dy[(size_t)i * out + j];
}

/* Softmax in place per row; returns the cross-entropy of each row's label in ce (when labels). */
static void softmax_ce(float *z, int n, int C, const uint8_t *labels, int stride, float *ce) {
  for (int i = 0; i < n; i++) {
    float *r = z + (size_t)i * C, mx = r[0];
    for (int c = 1; c < C; c++) mx = r[c] > mx ? r[c] : mx;
    double sum = 0;
    for (int c = 0; c < C; c++) sum += exp((double)r[c] - mx);
    double lse = mx + log(sum);
    if (labels) ce[i] = (float)(lse - r[labels[i / stride]]);
    for (int c = 0; c < C; c++) r[c] = (float)exp((double)r[c] - lse);
  }
}

/* Whether all n values are finite, in one vectorized pass (x - x is 0 for a finite x, NaN otherwise). */
static int all_finite(const float *a, size_t n) {
  float acc = 0;
#pragma omp simd reduction(+ : acc)
  for (size_t i = 0; i < n; i++) acc += a[i] - a[i];
  return acc == 0;
}

/* Divergence: the forward checks its input and each activation as it is made. The first non-finite
 * value is described in s->bad (note), and the activation's non-finite values are zeroed (watch) so
 * that the forward still reaches its collectives (the other ranks would wait there forever); the
 * forward then fails on every rank. note returns whether a has one. */
static int note(moe__model_state *s, int block, const char *what, const float *a, int rows, int cols) {
  size_t n = (size_t)rows * cols, j = 0;
  if (all_finite(a, n)) return 0;
  while (j < n && isfinite(a[j])) j++;
  if (j == n) return 0;
  if (s->bad[0]) return 1;
  char where[32] = "";
  if (block >= 0) snprintf(where, sizeof where, "block %d, ", block);
  snprintf(s->bad, sizeof s->bad, "%s%s [%zu, %zu] = %g", where, what, j / (size_t)cols, j % (size_t)cols,
           (double)a[j]);
  return 1;
}

static void watch(moe__model_state *s, int block, const char *what, float *a, int rows, int cols) {
  if (note(s, block, what, a, rows, cols))
    for (size_t j = 0; j < (size_t)rows * cols; j++) a[j] = isfinite(a[j]) ? a[j] : 0;
}

static moe_status diverged(const char *bad, const char *what) {
  return moe__error(MOE_ERR_VALUE, __FILE__, __LINE__, "%s went non-finite first at %s", what,
                    bad[0] ? bad : "another rank");
}

/* MOE_ERR_VALUE on every rank when any rank's `bad` is set (a collective under expert parallelism). */
static moe_status agree(const moe_dist *d, const char *bad, const char *what) {
  double any = bad[0] != 0;
  if (d) MOE_CHECK(moe_dist_allreduce(d, &any, 1));
  return any == 0 ? MOE_OK : diverged(bad, what);
}

/* Describes the first non-finite value of tensor r's values a (named prefix + r->name) in bad, unless
 * bad already holds one. */
static void find_bad(char *bad, size_t size, const char *prefix, const moe_tensor_ref *r, const float *a) {
  if (bad[0] || all_finite(a, r->numel)) return;
  size_t j = 0;
  while (j < r->numel && isfinite(a[j])) j++;
  if (j == r->numel) return;
  size_t idx[MOE_MAX_DIMS], flat = j;
  for (int d = r->ndim - 1; d >= 0; d--) idx[d] = flat % (size_t)r->shape[d], flat /= (size_t)r->shape[d];
  int w = snprintf(bad, size, "'%s%s' [", prefix, r->name);
  for (int d = 0; d < r->ndim && w < (int)size; d++) w += snprintf(bad + w, size - w, "%s%zu", d ? ", " : "", idx[d]);
  if (w < (int)size) snprintf(bad + w, size - w, "] = %g", (double)a[j]);
}

static size_t model_bytes(const moe_model_t *m, int B) {
  size_t D = (size_t)m->cfg.moe.D, C = (size_t)m->cfg.classes, L = (size_t)m->cfg.blocks, b = (size_t)B;
  size_t bk = b * (size_t)m->layers[m->cfg.blocks - 1].cfg.top_k; /* k may change per call */
  size_t n = (L + 1) * moe__arena_size(b * D * 4) + L * (moe__arena_size(b * D * 4) + 2 * moe__arena_size(b * 4));
  n += moe__arena_size(b * D * 4) + 2 * moe__arena_size(b * 4) + moe__arena_size(b * C * 4) + 2 * moe__arena_size(b * 4);
  n += 3 * moe__arena_size(b * D * 4) + moe__arena_size(b * C * 4); /* backward: dh, dxn, dhn, dlogits */
  if (m->cfg.loss == MOE_LOSS_SPECIFICATION) /* spec, hs, hsn, dhsn, dhs; stats, ce, dw; slogits, dsl */
    n += 5 * moe__arena_size(bk * D * 4) + 4 * moe__arena_size(bk * 4) + 2 * moe__arena_size(bk * C * 4);
  return n;
}

#define ALLOC(p, n) MOE_TRY(((p) = moe__arena_alloc(&s->arena, (n))) != NULL || (n) == 0, MOE_ERR_STATE, "internal: model workspace too small")

moe_status moe_model_forward(moe_model_t *m, const float *x, const uint8_t *labels, int B, moe_model_stats *out) {
  MOE_TRY(m && m->st, MOE_ERR_STATE, "moe_model_forward: model not initialized");
  MOE_TRY(B >= 0 && (B == 0 || x), MOE_ERR_ARG, "moe_model_forward: bad batch (B=%d)", B);
  moe__model_state *s = m->st;
  const moe_model_config *c = &m->cfg;
  int L = c->blocks, D = c->moe.D, C = c->classes, in = c->in_dim, k = m->layers[L - 1].cfg.top_k;
  int spec = c->loss == MOE_LOSS_SPECIFICATION && labels;
  if (labels)
    for (int i = 0; i < B; i++)
      MOE_TRY(labels[i] < C, MOE_ERR_VALUE, "label %d of sample %d is out of range (classes %d)", labels[i], i, C);
  s->threads = moe__threads(c->moe.threads);
  s->B = B;
  s->k = k;
  s->x = x;
  s->has_labels = 0; /* set on success only: backward must not see a failed forward */
  MOE_CHECK(moe__arena_reserve(&s->arena, model_bytes(m, B) + moe__arena_size((size_t)B), "model"));
  ALLOC(s->labels, (size_t)B);
  if (labels) memcpy(s->labels, labels, (size_t)B);
  for (int i = 0; i <= L; i++) ALLOC(s->h[i], (size_t)B * D * 4);
  for (int i = 0; i < L; i++) {
    ALLOC(s->xn[i], (size_t)B * D * 4);
    ALLOC(s->mean[i], (size_t)B * 4);
    ALLOC(s->rstd[i], (size_t)B * 4);
  }
  ALLOC(s->hn, (size_t)B * D * 4);
  ALLOC(s->meanf, (size_t)B * 4);
  ALLOC(s->rstdf, (size_t)B * 4);
  ALLOC(s->logits, (size_t)B * C * 4);
  ALLOC(s->pred, (size_t)B * 4);
  float *ce;
  ALLOC(ce, (size_t)B * 4);
  if (spec) {
    size_t bk = (size_t)B * k;
    ALLOC(s->spec, bk * D * 4);
    ALLOC(s->hs, bk * D * 4);
    ALLOC(s->hsn, bk * D * 4);
    ALLOC(s->means, bk * 4);
    ALLOC(s->rstds, bk * 4);
    ALLOC(s->slogits, bk * C * 4);
    ALLOC(s->sce, bk * 4);
  }
  int nt = s->threads;
  s->bad[0] = 0;
  note(s, -1, "the input (x)", x, B, in);
  linear(x, ref_data(m, "in.weight"), ref_data(m, "in.bias"), B, in, D, s->h[0], nt);
  watch(s, -1, "the input projection's output (in)", s->h[0], B, D);
  moe_model_stats acc = {0};
  char name[64], what[96];
  for (int i = 0; i < L; i++) {
    snprintf(name, sizeof name, "blocks.%d.norm.weight", i);
    float *g = ref_data(m, name);
    snprintf(name, sizeof name, "blocks.%d.norm.bias", i);
    moe__layernorm_forward(s->h[i], g, ref_data(m, name), B, D, s->xn[i], s->mean[i], s->rstd[i], nt);
    snprintf(what, sizeof what, "the norm's output (blocks.%d.norm)", i);
    watch(s, i, what, s->xn[i], B, D);
    MOE_CHECK(moe_layer_forward(&m->layers[i], s->xn[i], B, s->h[i + 1], spec && i == L - 1 ? s->spec : NULL,
                                &s->lstats[i]));
    snprintf(what, sizeof what, "the MoE layer's output (blocks.%d.moe)", i);
    watch(s, i, what, s->h[i + 1], B, D);
    if (spec && i == L - 1) watch(s, i, "the experts' own outputs (specification loss)", s->spec, B * k, D);
    float router[2] = {(float)s->lstats[i].aux_loss, (float)s->lstats[i].z_loss};
    watch(s, i, "the router's aux and z losses", router, 1, 2);
    for (size_t j = 0; j < (size_t)B * D; j++) s->h[i + 1][j] += s->h[i][j];
    watch(s, i, "the residual sum", s->h[i + 1], B, D);
    acc.aux += router[0];
    acc.z += router[1];
    acc.dropped += s->lstats[i].dropped;
    if (s->lstats[i].capacity > acc.capacity_max) acc.capacity_max = s->lstats[i].capacity;
  }
  float *gf = ref_data(m, "norm.weight"), *bf = ref_data(m, "norm.bias");
  float *wh = ref_data(m, "head.weight"), *bh = ref_data(m, "head.bias");
  moe__layernorm_forward(s->h[L], gf, bf, B, D, s->hn, s->meanf, s->rstdf, nt);
  watch(s, -1, "the final norm's output (norm)", s->hn, B, D);
  linear(s->hn, wh, bh, B, D, C, s->logits, nt);
  watch(s, -1, "the head's output, the logits (head)", s->logits, B, C);
  for (int i = 0; i < B; i++) {
    const float *r = s->logits + (size_t)i * C;
    int best = 0;
    for (int j = 1; j < C; j++) best = r[j] > r[best] ? j : best;
    s->pred[i] = best;
    if (labels) acc.correct += best == labels[i];
  }
  softmax_ce(s->logits, B, C, labels, 1, ce);
  if (labels && !spec)
    for (int i = 0; i < B; i++) acc.loss += ce[i];
  if (spec) { /* prediction with each assignment's own expert output in place of the mixture */
    const float *w = s->lstats[L - 1].weights;
    for (int t = 0; t < B; t++)
      for (int j = 0; j < k; j++) {
        float *dst = s->hs + ((size_t)t * k + j) * D;
        const float *hp = s->h[L - 1] + (size_t)t * D, *o = s->spec + ((size_t)t * k + j) * D;
        for (int d = 0; d < D; d++) dst[d] = hp[d] + o[d];
      }
    moe__layernorm_forward(s->hs, gf, bf, B * k, D, s->hsn, s->means, s->rstds, nt);
    linear(s->hsn, wh, bh, B * k, D, C, s->slogits, nt);
    watch(s, -1, "the head's output for each assignment (specification loss)", s->slogits, B * k, C);
    softmax_ce(s->slogits, B * k, C, labels, k, s->sce);
    for (size_t a = 0; a < (size_t)B * k; a++) acc.loss += (double)w[a] * s->sce[a];
  }
  if (!isfinite(acc.loss)) { /* zeroed like the activations */
    float loss = (float)acc.loss;
    watch(s, -1, "the loss", &loss, 1, 1);
    acc.loss = 0;
  }
  /* over the ranks: the batch is the global one, and a rank's non-finite value fails every rank */
  double tot[4] = {acc.loss, acc.correct, B, s->bad[0] != 0};
  if (c->moe.dist) MOE_CHECK(moe_dist_allreduce(c->moe.dist, tot, 4));
  if (tot[3] > 0) return diverged(s->bad, "the forward");
  s->Bg = tot[2];
  acc.correct = (int)tot[1];
  acc.loss = tot[2] > 0 ? tot[0] / tot[2] : 0;
  if (out) *out = acc;
  s->has_labels = labels != NULL;
  return MOE_OK;
}

/* dz (n, C) = weight * (softmax - onehot(label)) / B */
static void ce_grad(const float *p, const uint8_t *labels, int stride, const float *weight, int n, int C, double B,
                    float *dz) {
  for (int i = 0; i < n; i++) {
    float w = (weight ? weight[i] : 1.0f) / (float)B;
    for (int c = 0; c < C; c++) dz[(size_t)i * C + c] = w * p[(size_t)i * C + c];
    dz[(size_t)i * C + labels[i / stride]] -= w;
  }
}

moe_status moe_model_backward(moe_model_t *m) {
  moe__model_state *s = m->st;
  MOE_TRY(s && s->has_labels, MOE_ERR_STATE, "moe_model_backward: no forward with labels to differentiate");
  s->has_labels = 0; /* once: a failed backward must not be retried on half-added gradients */
  const moe_model_config *c = &m->cfg;
  int L = c->blocks, D = c->moe.D, C = c->classes, in = c->in_dim, B = s->B, nt = s->threads;
  int k = s->k, spec = c->loss == MOE_LOSS_SPECIFICATION;
  float *dh, *dxn, *dhn, *dlog, *dhs = NULL, *dw = NULL;
  ALLOC(dh, (size_t)B * D * 4);
  ALLOC(dxn, (size_t)B * D * 4);
  ALLOC(dhn, (size_t)B * D * 4);
  ALLOC(dlog, (size_t)B * C * 4);
  float *gf = ref_data(m, "norm.weight"), *wh = ref_data(m, "head.weight");
  float *dgf = ref_grad(m, "norm.weight"), *dbf = ref_grad(m, "norm.bias");
  float *dwh = ref_grad(m, "head.weight"), *dbh = ref_grad(m, "head.bias");
  memset(dh, 0, (size_t)B * D * 4);
  if (!spec) {
    ce_grad(s->logits, s->labels, 1, NULL, B, C, s->Bg, dlog);
    linear_backward(dlog, s->hn, wh, B, D, C, dwh, dbh, dhn, nt);
    moe__layernorm_backward(dhn, s->h[L], gf, s->meanf, s->rstdf, B, D, dh, dgf, dbf, nt);
  } else {
    size_t bk = (size_t)B * k;
    float *dsl, *dhsn;
    ALLOC(dsl, bk * C * 4);
    ALLOC(dhsn, bk * D * 4);
    ALLOC(dhs, bk * D * 4);
    ALLOC(dw, bk * 4);
    ce_grad(s->slogits, s->labels, k, s->lstats[L - 1].weights, B * k, C, s->Bg, dsl);
    linear_backward(dsl, s->hsn, wh, B * k, D, C, dwh, dbh, dhsn, nt);
    memset(dhs, 0, bk * D * 4);
    moe__layernorm_backward(dhsn, s->hs, gf, s->means, s->rstds, B * k, D, dhs, dgf, dbf, nt);
    for (size_t a = 0; a < bk; a++) dw[a] = s->sce[a] / (float)s->Bg; /* d loss / d gate weight */
  }
  char name[64];
  for (int i = L - 1; i >= 0; i--) {
    int last_spec = spec && i == L - 1;
    MOE_CHECK(moe_layer_backward(&m->layers[i], last_spec ? NULL : dh, c->aux_weight, c->z_weight,
                                 last_spec ? dhs : NULL, last_spec ? dw : NULL, dxn));
    if (last_spec) /* h_{L-1} feeds every assignment's prediction directly */
      for (int t = 0; t < B; t++)
        for (int j = 0; j < k; j++)
          for (int d = 0; d < D; d++) dh[(size_t)t * D + d] += dhs[((size_t)t * k + j) * D + d];
    snprintf(name, sizeof name, "blocks.%d.norm.weight", i);
    const moe_tensor_ref *g = moe_model_find(m, name);
    snprintf(name, sizeof name, "blocks.%d.norm.bias", i);
    moe__layernorm_backward(dxn, s->h[i], g->data, s->mean[i], s->rstd[i], B, D, dh, g->grad,
                            ref_grad(m, name), nt);
  }
  linear_backward(dh, s->x, NULL, B, in, D, ref_grad(m, "in.weight"), ref_grad(m, "in.bias"), NULL, nt);
  if (c->moe.dist) { /* data parallel: the replicated parameters' gradients summed over the ranks */
    MOE_CHECK(moe__dist_allreduce_f32(c->moe.dist, m->dense_grad, (int)s->dense_n));
    for (int i = 0; i < L; i++) MOE_CHECK(moe_layer_reduce_grads(&m->layers[i]));
  }
  /* every gradient finite? one pass over the tensors on the threads (the expert weights' dominate and
   * are several); only when one is not, the serial scan that names the first */
  int ok = 1;
#pragma omp parallel for schedule(dynamic, 1) reduction(&& : ok) num_threads(nt)
  for (int i = 0; i < m->nrefs; i++)
    if (!all_finite(m->refs[i].grad, m->refs[i].numel)) ok = 0; /* the thread's own ok keeps a 0 it saw */
  char bad[256] = ""; /* the refs in reverse: about the order backward makes their gradients in */
  for (int i = m->nrefs - 1; i >= 0 && !ok; i--) find_bad(bad, sizeof bad, "grad.", &m->refs[i], m->refs[i].grad);
  return agree(c->moe.dist, bad, "the backward");
}

moe_status moe__model_check_finite(const moe_model_t *m, const moe_optim_t *o, int scan) {
  MOE_TRY(m && m->refs, MOE_ERR_STATE, "moe_model_check_finite: model not initialized");
  char bad[256] = "";
  size_t off = 0;
  for (int i = 0; scan && i < m->nrefs; off += m->refs[i++].numel) {
    find_bad(bad, sizeof bad, "", &m->refs[i], m->refs[i].data);
    if (o && o->m) find_bad(bad, sizeof bad, "optim.m.", &m->refs[i], o->m + off);
    if (o && o->v) find_bad(bad, sizeof bad, "optim.v.", &m->refs[i], o->v + off);
  }
  return agree(m->cfg.moe.dist, bad, "the parameters");
}

moe_status moe_model_check_finite(const moe_model_t *m, const moe_optim_t *o) {
  return moe__model_check_finite(m, o, 1);
}
