/* Experts in a quantized GGUF type (moe__experts_quant; DESIGN 4.8b), for inference:
 *   a1 = xs W1^T + b1, a3 = xs W3^T (+ b3) (swiglu, swiglu_oai), h = act(a1) (swiglu: silu(a1) a3;
 *   swiglu_oai: gpt-oss's clamped one with the layer's alpha and limit), out = h W2^T + b2,
 * each product a row of W (its type's bytes, ggml's layout) dotted with a row of xs or h quantized per
 * block (kernels/quant.h), so an expert's weights are read in their stored bytes and never widened.
 * A forward is one OpenMP parallel region of four steps, each split over the threads: the input rows
 * quantized (once, for both fc1 and fc3); fc1 and fc3 over runs of (expert, tile of H's rows), each run
 * adding b1 and applying the activation to its rows while they are in cache; h's rows quantized; fc2
 * over runs of (expert, tile of D's rows), adding b2 (runs taken as moe__work hands them out). A
 * run's rows in an expert go through moe__qrows_times
 * (kernels/quant_matmul.h): a decode step (one row per expert) is a GEMV, a prefill a GEMM that reads
 * each weight row from memory once. Every output is one dot product, whatever the split
 * and the rows beside it: the results are the same bits for any thread count or batch. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kernels/act.h"
#include "kernels/quant_matmul.h"
#include "layer/plugins.h"

typedef struct {
  moe_gguf_type types[3];   /* fc1's, fc2's and fc3's (fc1's without an fc3); types[0] 0 until experts
                               are given (a file may mix them: llama.cpp's _M files keep some down
                               projections in Q6_K beside Q4_K gates) */
  const uint8_t *w1, *w2, *w3; /* the bytes read: the caller's, or own */
  uint8_t *own;             /* quantized from the layer's fp32 experts (moe_layer_quantize_experts), or NULL */
  int stale;                /* own must be made again from the parameters before the next forward */
  moe__qffn b;              /* this forward's quantized activations (the work arena) */
  const uint8_t *(*wp)[3];  /* (groups) each expert's fc1, fc2, fc3 in the stacks (the work arena) */
  const float *(*bp)[3];    /* (groups) its fc1, fc2, fc3 biases in the parameters, or NULL (the work arena) */
} quant_self;

/* The types the arena is sized for: the bound ones, or Q8_0 before any (forward then says so). */
static void sized_types(const quant_self *q, moe_gguf_type t[3]) {
  for (int i = 0; i < 3; i++) t[i] = q->types[0] ? q->types[i] : MOE_GGUF_Q8_0;
}

/* Whether fc3's activations need a format of their own (a type with another activation format than fc1's). */
static int own_x3(const moe_gguf_type t[3], const moe_layer_config *c) {
  return moe__act_gated(c->act) && moe__act_format(t[2]) != moe__act_format(t[0]);
}

size_t moe__qffn_bytes(const moe_layer_config *c, const moe_gguf_type t[3], int rows) {
  size_t r = (size_t)rows;
  return (own_x3(t, c) ? moe__arena_size(r * moe__act_bytes(t[2], c->D)) : 0) +
         moe__arena_size(r * moe__act_bytes(t[0], c->D)) + moe__arena_size(r * moe__act_bytes(t[1], c->H));
}

void moe__qffn_alloc(moe__arena *a, const moe_layer_config *c, const moe_gguf_type t[3], int rows, moe__qffn *q) {
  size_t r = (size_t)rows;
  memcpy(q->t, t, sizeof q->t);
  q->xq = moe__arena_alloc(a, r * moe__act_bytes(t[0], c->D));
  q->xq3 = own_x3(t, c) ? moe__arena_alloc(a, r * moe__act_bytes(t[2], c->D)) : q->xq;
  q->hq = moe__arena_alloc(a, r * moe__act_bytes(t[1], c->H));
}

static moe_status q_init(const moe_layer_t *l, void *transport, void **self) {
  (void)l, (void)transport;
  quant_self *q = calloc(1, sizeof *q);
  MOE_TRY(q, MOE_ERR_NOMEM, "moe_layer_init: out of memory");
  *self = q;
  return MOE_OK;
}

static void q_free(void *self) {
  quant_self *q = self;
  if (q) free(q->own);
  free(q);
}

static void q_params_changed(void *self) {
  quant_self *q = self;
  q->stale = q->own != NULL;
}

static size_t q_bytes(void *self, const moe__env *env, int ng, int rows) {
  const moe_layer_t *l = env->l;
  size_t r = (size_t)rows, H = (size_t)l->cfg.H;
  moe_gguf_type t[3];
  sized_types(self, t);
  return (moe__act_gated(l->cfg.act) ? 3 : 2) * moe__arena_size(r * H * 4) + moe__qffn_bytes(&l->cfg, t, rows) +
         moe__arena_size((size_t)ng * sizeof(int)) + 2 * moe__arena_size((size_t)ng * 3 * sizeof(void *));
}

static moe_status q_alloc(void *self, const moe__env *env, int ng, int rows, moe__ffn *f) {
  quant_self *q = self;
  const moe_layer_t *l = env->l;
  size_t r = (size_t)rows, H = (size_t)l->cfg.H;
  moe_gguf_type t[3];
  sized_types(q, t);
  moe__arena *a = env->work;
  memset(f, 0, sizeof *f);
  f->a1 = moe__arena_alloc(a, r * H * 4);
  f->a3 = moe__act_gated(l->cfg.act) ? moe__arena_alloc(a, r * H * 4) : NULL;
  f->h = moe__arena_alloc(a, r * H * 4);
  moe__qffn_alloc(a, &l->cfg, t, rows, &q->b);
  f->order = moe__arena_alloc(a, (size_t)ng * sizeof(int));
  q->wp = moe__arena_alloc(a, (size_t)ng * 3 * sizeof(void *));
  q->bp = moe__arena_alloc(a, (size_t)ng * 3 * sizeof(void *));
  MOE_TRY(f->order && q->wp && q->bp && (f->h || rows == 0), MOE_ERR_STATE, "internal: expert workspace too small");
  return MOE_OK;
}

/* What a forward's items read. */
typedef struct {
  const moe_layer_t *l;
  const moe__qffn *q;
  const uint8_t *const (*w)[3];
  const moe__groups *g;
  const moe__ffn *f;
  const float *const (*b)[3];
  moe__qkern k1, k2, k3;  /* the kernels of fc1's, fc2's and fc3's types, looked up once a forward */
  size_t xab, x3ab, hab;  /* bytes of an input row quantized for fc1, for fc3; of a hidden row for fc2 */
  size_t r1, r3, r2;      /* bytes of a weight row of fc1, fc3, fc2 */
} fwd_ctx;

/* fc1 (and fc3) over H's rows [h0, h1) of group e, then b1 and the activation there. */
static void item1(const fwd_ctx *c, int e, int h0, int h1) {
  const moe_layer_t *l = c->l;
  int D = l->cfg.D, H = l->cfg.H, r0 = c->g->offs[e], m = c->g->offs[e + 1] - r0;
  const moe__qffn *q = c->q;
  float *a1 = c->f->a1 + (size_t)r0 * H, *a3 = c->f->a3 ? c->f->a3 + (size_t)r0 * H : NULL, *h = c->f->h + (size_t)r0 * H;
  const float *b1 = c->b ? c->b[e][0] : NULL, *b3 = c->b ? c->b[e][2] : NULL;
  moe__qrows_times(&c->k1, c->w[e][0], c->r1, h0, h1, q->xq + (size_t)r0 * c->xab, c->xab, m, D, a1, H, 0);
  if (a3) moe__qrows_times(&c->k3, c->w[e][2], c->r3, h0, h1, q->xq3 + (size_t)r0 * c->x3ab, c->x3ab, m, D, a3, H, 0);
  for (int r = 0; r < m; r++) {
    float *ar = a1 + (size_t)r * H, *ar3 = a3 ? a3 + (size_t)r * H : NULL;
    if (b1)
      for (int j = h0; j < h1; j++) ar[j] += b1[j];
    if (b3)
      for (int j = h0; j < h1; j++) ar3[j] += b3[j];
    moe__act_cfg_forward(&l->cfg, ar + h0, ar3 ? ar3 + h0 : NULL, h + (size_t)r * H + h0, (size_t)(h1 - h0));
  }
}

/* fc2 over D's rows [d0, d1) of group e, then b2. */
static void item2(const fwd_ctx *c, int e, int d0, int d1) {
  const moe_layer_t *l = c->l;
  int D = l->cfg.D, H = l->cfg.H, r0 = c->g->offs[e], m = c->g->offs[e + 1] - r0;
  float *y = c->g->y + (size_t)r0 * D;
  moe__qrows_times(&c->k2, c->w[e][1], c->r2, d0, d1, c->q->hq + (size_t)r0 * c->hab, c->hab, m, H, y, D, 0);
  const float *b2 = c->b ? c->b[e][1] : NULL;
  if (b2)
    for (int r = 0; r < m; r++)
      for (int j = d0; j < d1; j++) y[(size_t)r * D + j] += b2[j];
}

/* The runs of w's items (each active group's tiles of `rows` rows, group after group) the calling thread
 * takes, each run cut at the groups' ends into item(c, group, first row, end row) calls. */
static void take_runs(const fwd_ctx *c, moe__work *w, int rows, const int *active,
                      void (*item)(const fwd_ctx *, int, int, int)) {
  int tiles = (rows + MOE__QROWS_TILE - 1) / MOE__QROWS_TILE, t0, n;
  while ((n = moe__work_take(w, &t0)) > 0)
    for (int t = t0; t < t0 + n;) {
      int a = t / tiles, end = (a + 1) * tiles < t0 + n ? (a + 1) * tiles : t0 + n;
      int r1 = (end - a * tiles) * MOE__QROWS_TILE;
      item(c, active[a], (t - a * tiles) * MOE__QROWS_TILE, r1 < rows ? r1 : rows);
      t = end;
    }
}

void moe__qffn_forward(const moe__qffn *q, const moe_layer_t *l, const moe__groups *g, const moe__ffn *f,
                       const uint8_t *const (*w)[3], const float *const (*b)[3], const int *active, int nact, int nt) {
  if (nact <= 0) return;
  int D = l->cfg.D, H = l->cfg.H, x3 = own_x3(q->t, &l->cfg);
  fwd_ctx c = {l, q, w, g, f, b, moe__qkern_of(q->t[0]), moe__qkern_of(q->t[1]), moe__qkern_of(q->t[2]),
               moe__act_bytes(q->t[0], D), moe__act_bytes(q->t[2], D), moe__act_bytes(q->t[1], H),
               moe__qrow_bytes(q->t[0], D), moe__qrow_bytes(q->t[2], D), moe__qrow_bytes(q->t[1], H)};
  int r0 = g->offs[active[0]], r1 = g->offs[active[nact - 1] + 1]; /* the groups between have no rows */
  moe__work w1 = moe__work_of(nact * ((H + MOE__QROWS_TILE - 1) / MOE__QROWS_TILE), nt);
  moe__work w2 = moe__work_of(nact * ((D + MOE__QROWS_TILE - 1) / MOE__QROWS_TILE), nt);
#pragma omp parallel num_threads(nt)
  {
#pragma omp for schedule(static)
    for (int r = r0; r < r1; r++) {
      moe__act_quantize(q->t[0], g->x + (size_t)r * D, q->xq + (size_t)r * c.xab, D);
      if (x3) moe__act_quantize(q->t[2], g->x + (size_t)r * D, q->xq3 + (size_t)r * c.x3ab, D);
    }
    take_runs(&c, &w1, H, active, item1);
#pragma omp barrier
#pragma omp for schedule(static)
    for (int r = r0; r < r1; r++) moe__act_quantize(q->t[1], f->h + (size_t)r * H, q->hq + (size_t)r * c.hab, H);
    take_runs(&c, &w2, D, active, item2);
  }
}

/* The experts quantized again from the parameters (after moe_layer_params_changed). */
static moe_status requantize(quant_self *q, const moe_layer_t *l);

static moe_status q_forward(void *self, const moe__env *env, const moe__plan *p, const moe__groups *g,
                            const moe__ffn *f, const moe__side_work *side) {
  (void)p, (void)side; /* no side work: the source is not `alongside` */
  quant_self *q = self;
  const moe_layer_t *l = env->l;
  MOE_TRY(q->types[0], MOE_ERR_STATE, "moe_layer_forward: the layer's %s experts are not given yet (moe_layer_bind_experts, "
          "or a moe_layer_quantize_experts that succeeds)",
          moe_gguf_type_name((moe_gguf_type)l->cfg.expert_type));
  if (q->stale) MOE_CHECK(requantize(q, l));
  int D = l->cfg.D, H = l->cfg.H, *active = f->order, nact = 0;
  size_t r1 = moe__qrow_bytes(q->b.t[0], D), r2 = moe__qrow_bytes(q->b.t[1], H), r3 = moe__qrow_bytes(q->b.t[2], D);
  moe__weights w;
  moe__weights_bind(l, l->params, &w);
  for (int e = 0; e < g->n; e++)
    if (g->offs[e + 1] > g->offs[e]) {
      active[nact++] = e;
      q->wp[e][0] = q->w1 + (size_t)e * H * r1, q->wp[e][1] = q->w2 + (size_t)e * D * r2;
      q->wp[e][2] = q->w3 ? q->w3 + (size_t)e * H * r3 : NULL;
      q->bp[e][0] = w.b1 ? w.b1 + (size_t)e * H : NULL, q->bp[e][1] = w.b2 ? w.b2 + (size_t)e * D : NULL;
      q->bp[e][2] = w.b3 ? w.b3 + (size_t)e * H : NULL;
    }
  moe__qffn_forward(&q->b, l, g, f, (const uint8_t *const (*)[3])q->wp, (const float *const (*)[3])q->bp, active, nact,
                    env->threads);
  return MOE_OK;
}

static moe_status q_backward(void *self, const moe__env *env, const moe__plan *p, const moe__groups *g,
                             const moe__ffn *f, const float *dy, float daux, float dz, float *dx) {
  (void)self, (void)p, (void)g, (void)f, (void)dy, (void)daux, (void)dz, (void)dx;
  return moe__error(MOE_ERR_ARG, __FILE__, __LINE__, "moe_layer_backward: the layer's %s experts are for inference only",
                    moe_gguf_type_name((moe_gguf_type)env->l->cfg.expert_type));
}

const moe__expert_src moe__experts_quant = {"quant", 0, q_init, q_free, q_params_changed, q_bytes, q_alloc,
                                            q_forward, q_backward, NULL};

/* ---------------------------------------------------------------- the public API */

static moe_status requantize(quant_self *q, const moe_layer_t *l) {
  const char *names[3] = {"experts.fc1.weight", "experts.fc2.weight", "experts.fc3.weight"};
  const uint8_t **dst[3] = {&q->w1, &q->w2, &q->w3};
  size_t at = 0;
  for (int i = 0; i < 3; i++) {
    const moe_param_info *pi = moe_layer_param_find(l, names[i]);
    *dst[i] = NULL;
    if (!pi) continue;
    moe_status st = moe_gguf_quantize(q->types[0], l->params + pi->offset, q->own + at, (int64_t)pi->numel);
    MOE_TRY(st == MOE_OK, st, "moe_layer_quantize_experts: %s to %s: %s", names[i], moe_gguf_type_name(q->types[0]),
            moe_last_error());
    *dst[i] = q->own + at;
    at += moe__qrow_bytes(q->types[0], (int64_t)pi->numel);
  }
  q->stale = 0;
  return MOE_OK;
}

/* The layer switched to quantized experts of type t (those of `rows`: moe__expert_type_check): its
 * source's state. An expert tensor this source
 * does not apply (one a later feature adds) is refused rather than left out of the outputs. */
static moe_status switch_to(moe_layer_t *l, moe_gguf_type t, int rows, const char *what, quant_self **out) {
  MOE_TRY(l && l->st, MOE_ERR_STATE, "%s: layer not initialized", what);
  MOE_CHECK(moe__expert_type_check(&l->cfg, (int)t, rows, what));
  MOE_TRY(!l->cfg.external_experts, MOE_ERR_ARG, "%s: the layer's experts are an expert cache's (external_experts)", what);
  static const char *const known[] = {"experts.fc1.weight", "experts.fc1.bias", "experts.fc2.weight",
                                      "experts.fc2.bias", "experts.fc3.weight", "experts.fc3.bias"};
  for (int i = 0; i < l->nparams; i++) {
    int ok = strncmp(l->info[i].name, "experts.", 8) != 0;
    for (size_t j = 0; j < sizeof known / sizeof *known; j++) ok |= !strcmp(l->info[i].name, known[j]);
    MOE_TRY(ok, MOE_ERR_ARG, "%s: quantized experts do not apply %s yet", what, l->info[i].name);
  }
  void *self;
  MOE_CHECK(moe__layer_replace_source(l, &moe__experts_quant, &self));
  *out = self;
  return MOE_OK;
}

moe_status moe_layer_quantize_experts(moe_layer_t *l, moe_gguf_type type) {
  const char *what = "moe_layer_quantize_experts";
  MOE_TRY(l && l->st, MOE_ERR_STATE, "%s: layer not initialized", what);
  MOE_TRY(moe_layer_param_find(l, "experts.fc1.weight"), MOE_ERR_STATE,
          "%s: the layer has no fp32 experts (made with expert_type %d or external experts): bind them with "
          "moe_layer_bind_experts",
          what, l->cfg.expert_type);
  quant_self *q;
  MOE_CHECK(switch_to(l, type, MOE__ROWS_D | MOE__ROWS_H, what, &q));
  size_t bytes = 0;
  for (int i = 0; i < l->nparams; i++)
    if (l->info[i].ndim == 3) bytes += moe__qrow_bytes(type, (int64_t)l->info[i].numel);
  free(q->own);
  q->own = moe__alloc_big(bytes);
  q->types[0] = 0;
  MOE_TRY(q->own, MOE_ERR_NOMEM, "%s: cannot allocate %zu bytes of %s experts", what, bytes, moe_gguf_type_name(type));
  q->types[0] = q->types[1] = q->types[2] = type;
  moe_status st = requantize(q, l);
  if (st != MOE_OK) q->types[0] = 0; /* no experts until a quantize or bind succeeds */
  l->cfg.expert_type = (int)type;
  return st;
}

moe_status moe_layer_bind_experts_typed(moe_layer_t *l, const moe_gguf_type types[3], const void *fc1, const void *fc2,
                                        const void *fc3) {
  const char *what = "moe_layer_bind_experts";
  MOE_TRY(l && l->st && types, MOE_ERR_STATE, "%s: layer not initialized", what);
  int glu = moe__act_gated(l->cfg.act);
  MOE_TRY(fc1 && fc2, MOE_ERR_ARG, "%s: fc1 (gate) and fc2 (down) must not be NULL", what);
  MOE_TRY(!fc3 == !glu, MOE_ERR_ARG, "%s: fc3 (the up projection) is %s", what,
          glu ? "needed with swiglu and swiglu_oai" : "only for swiglu and swiglu_oai: pass NULL");
  for (int i = 1; i < (glu ? 3 : 2); i++)
    MOE_CHECK(moe__expert_type_check(&l->cfg, (int)types[i], i == 1 ? MOE__ROWS_H : MOE__ROWS_D, what));
  quant_self *q;
  MOE_CHECK(switch_to(l, types[0], MOE__ROWS_D, what, &q));
  free(q->own);
  q->own = NULL, q->stale = 0;
  q->types[0] = types[0], q->types[1] = types[1], q->types[2] = glu ? types[2] : types[0];
  q->w1 = fc1, q->w2 = fc2, q->w3 = fc3;
  l->cfg.expert_type = (int)types[0];
  return MOE_OK;
}

moe_status moe_layer_bind_experts(moe_layer_t *l, moe_gguf_type type, const void *fc1, const void *fc2,
                                  const void *fc3) {
  const moe_gguf_type types[3] = {type, type, type};
  return moe_layer_bind_experts_typed(l, types, fc1, fc2, fc3);
}

moe_gguf_type moe_layer_expert_type(const moe_layer_t *l, int fc) {
  if (!l || !l->st || l->cfg.expert_type <= 0 || fc < 1 || fc > 3) return MOE_GGUF_F32;
  const quant_self *q = moe__layer_source(l, &moe__experts_quant);
  if (!q || !q->types[0]) return (moe_gguf_type)l->cfg.expert_type;
  return fc == 3 && !moe__act_gated(l->cfg.act) ? MOE_GGUF_F32 : q->types[fc - 1];
}
