/* Tests of the classifier model, its optimizers and its checkpoints:
 *  - model_gradcheck_*: finite differences of moe_model_backward for the whole model (in=10, C=4, L=2,
 *    D=6, H=8, E=4, k=2, B=8, aux 0.05, z 0.02), cooperation and specification loss, dynamic gelu and
 *    static swiglu with capacity drops, flat and hierarchical (3 inner experts, k 2). The scalar is
 *    stats.loss + aux_weight * stats.aux + z_weight * stats.z; every ref (dense and MoE) is checked
 *    along a random unit direction and on a few single elements (of experts that got tokens), with
 *    central differences (eps 1e-3). Routing is discontinuous: every perturbed forward must keep each
 *    block's expert of every slot, its expert counts and the drops (and each inner layer's, read from
 *    plugins.h), otherwise the test fails saying so. Biases and norm weights are randomized so
 *    that every gradient is exercised, and every tensor's gradient must be nonzero somewhere.
 *    MOE_GRADCHECK_VERBOSE=1 prints the worst errors.
 *  - model_forward_*: the loss, accuracy and predictions on a head with known logits; out-of-range
 *    labels (MOE_ERR_VALUE) and backward without a labelled forward (MOE_ERR_STATE).
 *  - model_optim_*: AdamW (one and two steps, bias correction, decay only on refs with ndim >= 2) and
 *    SGD with momentum against updates computed by hand in double; the learning-rate schedule.
 *  - model_checkpoint_*: a bit-exact save/load round trip of model, Adam state and training state
 *    (resumed training stays bit-identical, re-saving gives the same bytes), SGD and weights-only
 *    checkpoints (hierarchical), and bad files (missing, truncated, a layer file, a wrong shape, an
 *    extra tensor), each with its status and message, leaving the model zeroed and nothing leaked. */
#include <stdint.h>
#include <stdlib.h>

#include "fdcheck.h"
#include "layer/plugins.h" /* the inner layers' routing plans, to guard the hierarchical checks */
#include "test.h"

/* ---------------------------------------------------------------- random parameters */

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

/* Biases (dense and the layers') small and random, norm weights around 1: init_params leaves them at
 * 0 and 1, where their gradients would be checked only partly. */
static void randomize_vectors(moe_model_t *m, uint64_t *rng) {
  for (int i = 0; i < m->nrefs; i++) {
    moe_tensor_ref *r = &m->refs[i];
    if (strstr(r->name, "norm.weight")) fd_fill(rng, r->data, r->numel, 0.75, 1.25);
    else if (ends_with(r->name, "bias")) fd_fill(rng, r->data, r->numel, -0.3, 0.3);
  }
}

/* ---------------------------------------------------------------- finite differences */

#define MG_B 8
#define MG_IN 10
#define MG_C 4
#define MG_L 2
#define MG_D 6
#define MG_H 8
#define MG_E 4
#define MG_K 2
#define MG_ELEMS 4       /* single elements checked per tensor */
#define MG_EPS 1e-3      /* central-difference step */
#define MG_ATOL 1e-3     /* |fd - an| <= MG_ATOL + MG_RTOL * |an| */
#define MG_RTOL 1e-3
#define MG_MIN_GRAD 1e-4 /* every tensor's analytic gradient must reach this somewhere */

typedef struct {
  const char *name;
  moe_loss_kind loss;
  moe_act act;
  moe_dispatch dispatch;
  float capacity;
  uint64_t seed;
  int want_drops; /* assert that capacity drops happen */
  int inner_experts, inner_top_k; /* hierarchical MoE when > 0 */
} mg_case;

typedef struct {
  const mg_case *c;
  moe_model_t m;
  float x[MG_B * MG_IN];
  uint8_t labels[MG_B];
  int32_t counts0[MG_L][MG_E];
  int32_t experts0[MG_L][MG_B * MG_K];
  int dropped0;
  /* hierarchical: each inner layer's rows, k, drops and expert of every slot */
  int inner_T0[MG_L][MG_E], inner_k0[MG_L][MG_E], inner_dropped0[MG_L][MG_E];
  int32_t inner_top0[MG_L][MG_E][MG_B * MG_K * MG_E];
  fd_check fd; /* the finite differences, probes and worst errors */
} mg_ctx;

/* The scalar whose gradient moe_model_backward computes. */
static double mg_objective(const moe_model_t *m, const moe_model_stats *st) {
  return st->loss + (double)m->cfg.aux_weight * st->aux + (double)m->cfg.z_weight * st->z;
}

static void mg_record_routing(mg_ctx *g, const moe_model_stats *st) {
  g->dropped0 = st->dropped;
  for (int b = 0; b < MG_L; b++) {
    const moe_layer_stats *ls = moe_model_layer_stats(&g->m, b);
    memcpy(g->counts0[b], ls->expert_counts, sizeof g->counts0[b]);
    memcpy(g->experts0[b], ls->experts, sizeof g->experts0[b]);
    const moe_layer_t *l = &g->m.layers[b];
    for (int e = 0; l->inner && e < MG_E; e++) {
      const moe__plan *is = moe__layer_inspect(&l->inner[e]).plan;
      g->inner_T0[b][e] = is->T;
      g->inner_k0[b][e] = is->k;
      g->inner_dropped0[b][e] = is->dropped;
      if (is->T * is->k <= MG_B * MG_K * MG_E) memcpy(g->inner_top0[b][e], is->top_e, (size_t)is->T * is->k * 4);
    }
  }
}

/* One labelled forward: the objective, then the routing compared with the reference forward. Returns 0
 * (after printing why) on an error or a routing change: the fd_check loss callback. */
static int mg_loss(void *ctx, double *F, const char *what) {
  mg_ctx *g = ctx;
  moe_model_stats st;
  moe_status s = moe_model_forward(&g->m, g->x, g->labels, MG_B, &st);
  if (s != MOE_OK) {
    fprintf(stderr, "  [%s] forward at %s: %s: %s\n", g->c->name, what, moe_status_name(s), moe_last_error());
    return 0;
  }
  *F = mg_objective(&g->m, &st);
  if (st.dropped != g->dropped0) {
    fprintf(stderr, "  [%s] routing changed at %s: dropped %d, reference %d; pick another seed\n", g->c->name,
            what, st.dropped, g->dropped0);
    return 0;
  }
  for (int b = 0; b < MG_L; b++) {
    const moe_layer_stats *ls = moe_model_layer_stats(&g->m, b);
    for (int e = 0; e < MG_E; e++)
      if (ls->expert_counts[e] != g->counts0[b][e]) {
        fprintf(stderr, "  [%s] routing changed at %s: block %d expert %d count %d, reference %d; "
                "pick another seed\n", g->c->name, what, b, e, ls->expert_counts[e], g->counts0[b][e]);
        return 0;
      }
    for (int a = 0; a < MG_B * MG_K; a++)
      if (ls->experts[a] != g->experts0[b][a]) {
        fprintf(stderr, "  [%s] routing changed at %s: block %d token %d slot %d expert %d, reference %d; "
                "pick another seed\n", g->c->name, what, b, a / MG_K, a % MG_K, ls->experts[a],
                g->experts0[b][a]);
        return 0;
      }
    const moe_layer_t *l = &g->m.layers[b];
    for (int e = 0; l->inner && e < MG_E; e++) {
      const moe__plan *is = moe__layer_inspect(&l->inner[e]).plan;
      int same = is->T == g->inner_T0[b][e] && is->k == g->inner_k0[b][e] && is->dropped == g->inner_dropped0[b][e];
      same = same && is->T * is->k <= MG_B * MG_K * MG_E;
      for (int a = 0; same && a < is->T * is->k; a++) same = is->top_e[a] == g->inner_top0[b][e][a];
      if (!same) {
        fprintf(stderr, "  [%s] routing changed at %s: block %d inner layer %d; pick another seed\n", g->c->name,
                what, b, e);
        return 0;
      }
    }
  }
  return 1;
}

/* A ref's check; for expert tensors, only elements of experts that received tokens in that block. */
static int mg_tensor(mg_ctx *g, uint64_t *rng, moe_tensor_ref *r, double L0) {
  int block = -1, inner = -1;
  if (sscanf(r->name, "blocks.%*d.moe.experts.%d.", &inner) == 1) block = -1; /* an inner layer's tensor */
  else if (strstr(r->name, ".moe.experts.") && sscanf(r->name, "blocks.%d.", &block) != 1) block = -1;
  return fd_tensor(&g->fd, r->name, r->data, r->grad, r->numel, block >= 0 ? g->counts0[block] : NULL, MG_E, rng,
                   L0);
}

static int mg_run_checks(mg_ctx *g) {
  const mg_case *c = g->c;
  moe_model_config cfg;
  moe_model_config_default(&cfg);
  cfg.in_dim = MG_IN;
  cfg.classes = MG_C;
  cfg.blocks = MG_L;
  cfg.moe.D = MG_D;
  cfg.moe.H = MG_H;
  cfg.moe.E = MG_E;
  cfg.moe.top_k = MG_K;
  cfg.moe.act = c->act;
  cfg.moe.dispatch = c->dispatch;
  cfg.moe.capacity_setting = c->capacity;
  cfg.moe.threads = 1;
  cfg.moe.inner_experts = c->inner_experts;
  cfg.moe.inner_top_k = c->inner_top_k;
  cfg.loss = c->loss;
  cfg.aux_weight = 0.05f;
  cfg.z_weight = 0.02f;
  moe_status s = moe_model_init(&g->m, &cfg);
  if (s != MOE_OK) {
    fprintf(stderr, "  [%s] moe_model_init: %s\n", c->name, moe_last_error());
    return 0;
  }
  moe_model_t *m = &g->m;
  moe_model_init_params(m, c->seed);
  uint64_t rng = c->seed ^ 0x5DEECE66Dull;
  randomize_vectors(m, &rng);
  fd_fill(&rng, g->x, MG_B * MG_IN, -1.5, 1.5);
  for (int i = 0; i < MG_B; i++) g->labels[i] = (uint8_t)(fd_next(&rng) % MG_C);

  /* reference forward, routing and the analytic gradients */
  moe_model_stats st;
  moe_model_zero_grad(m);
  s = moe_model_forward(m, g->x, g->labels, MG_B, &st);
  if (s != MOE_OK) {
    fprintf(stderr, "  [%s] forward: %s\n", c->name, moe_last_error());
    return 0;
  }
  double F0 = mg_objective(m, &st);
  mg_record_routing(g, &st);
  if (c->want_drops && st.dropped == 0) {
    fprintf(stderr, "  [%s] no assignment was dropped: the drop path is not exercised\n", c->name);
    return 0;
  }
  if (c->dispatch == MOE_DISPATCH_DYNAMIC && st.dropped != 0) {
    fprintf(stderr, "  [%s] dynamic dispatch dropped %d assignments\n", c->name, st.dropped);
    return 0;
  }
  if (!(st.loss > 0.1 && st.aux > 0 && st.z > 0)) {
    fprintf(stderr, "  [%s] implausible loss terms: loss %g aux %g z %g\n", c->name, st.loss, st.aux, st.z);
    return 0;
  }
  s = moe_model_backward(m);
  if (s != MOE_OK) {
    fprintf(stderr, "  [%s] backward: %s\n", c->name, moe_last_error());
    return 0;
  }
  double L0;
  if (!mg_loss(g, &L0, "the reference point")) return 0;
  if (L0 != F0) {
    fprintf(stderr, "  [%s] the forward is not deterministic: %.17g then %.17g\n", c->name, F0, L0);
    return 0;
  }
  for (int i = 0; i < m->nrefs; i++)
    if (!mg_tensor(g, &rng, &m->refs[i], L0)) return 0;
  const char *verbose = getenv("MOE_GRADCHECK_VERBOSE");
  if (verbose && verbose[0] && strcmp(verbose, "0"))
    printf("  [%s] %d tensors, %d probes, dropped %d, worst |fd-an|/max(1,|an|) %.3g, worst err/tol %.3g at %s\n",
           c->name, m->nrefs, g->fd.probes, g->dropped0, g->fd.worst_rel, g->fd.worst_ratio, g->fd.worst_at);
  return 1;
}

static int mg_run(const mg_case *c) {
  mg_ctx *g = calloc(1, sizeof *g);
  if (!g) return 0;
  g->c = c;
  g->fd = (fd_check){.name = c->name, .loss = mg_loss, .ctx = g, .eps = MG_EPS, .atol = MG_ATOL, .rtol = MG_RTOL,
                     .min_grad = MG_MIN_GRAD, .elems = MG_ELEMS};
  int ok = mg_run_checks(g);
  fd_free(&g->fd);
  moe_model_free(&g->m);
  free(g);
  return ok;
}

TEST(model_gradcheck_cooperation) {
  static const mg_case c = {"cooperation gelu dynamic", MOE_LOSS_COOPERATION, MOE_ACT_GELU, MOE_DISPATCH_DYNAMIC,
                            1.0f, 21, 0, 0, 0};
  ASSERT(mg_run(&c));
}

TEST(model_gradcheck_specification) {
  static const mg_case c = {"specification gelu dynamic", MOE_LOSS_SPECIFICATION, MOE_ACT_GELU,
                            MOE_DISPATCH_DYNAMIC, 1.0f, 22, 0, 0, 0};
  ASSERT(mg_run(&c));
}

TEST(model_gradcheck_static_swiglu_drops) {
  static const mg_case c = {"cooperation swiglu static cap 1.0", MOE_LOSS_COOPERATION, MOE_ACT_SWIGLU,
                            MOE_DISPATCH_STATIC, 1.0f, 23, 1, 0, 0};
  ASSERT(mg_run(&c));
}

TEST(model_gradcheck_spec_static_swiglu_drops) {
  static const mg_case c = {"specification swiglu static cap 1.0", MOE_LOSS_SPECIFICATION, MOE_ACT_SWIGLU,
                            MOE_DISPATCH_STATIC, 1.0f, 24, 1, 0, 0};
  ASSERT(mg_run(&c));
}

TEST(model_gradcheck_hierarchical) {
  static const mg_case c = {"hierarchical cooperation gelu dynamic", MOE_LOSS_COOPERATION, MOE_ACT_GELU,
                            MOE_DISPATCH_DYNAMIC, 1.0f, 25, 0, 3, 2};
  ASSERT(mg_run(&c));
}

TEST(model_gradcheck_hierarchical_spec_static) {
  static const mg_case c = {"hierarchical specification swiglu static cap 1.0", MOE_LOSS_SPECIFICATION,
                            MOE_ACT_SWIGLU, MOE_DISPATCH_STATIC, 1.0f, 26, 1, 3, 2};
  ASSERT(mg_run(&c));
}

/* ---------------------------------------------------------------- forward */

static void tiny_config(moe_model_config *c) {
  moe_model_config_default(c);
  c->in_dim = 3;
  c->classes = 4;
  c->blocks = 1;
  c->moe.D = 4;
  c->moe.H = 3;
  c->moe.E = 2;
  c->moe.top_k = 2;
  c->moe.threads = 1;
}

static void set_ref(moe_model_t *m, const char *name, float v) {
  const moe_tensor_ref *r = moe_model_find(m, name);
  if (r)
    for (size_t i = 0; i < r->numel; i++) r->data[i] = v;
}

/* With head.weight = 0 the logits are head.bias for every sample: the loss is known in closed form. */
static void forward_loss_values(int *failed_, moe_model_t *m, moe_loss_kind loss) {
  moe_model_config c;
  tiny_config(&c);
  c.blocks = 2;
  c.loss = loss;
  c.z_weight = 0.1f;
  ASSERT_OK(moe_model_init(m, &c));
  moe_model_init_params(m, 7);
  uint64_t rng = 99;
  randomize_vectors(m, &rng);
  set_ref(m, "head.weight", 0.0f);
  const moe_tensor_ref *hb = moe_model_find(m, "head.bias");
  ASSERT(hb && hb->numel == 4);
  const float bias[4] = {0.1f, -0.2f, 0.3f, 0.0f};
  memcpy(hb->data, bias, sizeof bias);
  enum { B = 6 };
  float x[B * 3];
  fd_fill(&rng, x, B * 3, -1, 1);
  const uint8_t labels[B] = {0, 1, 2, 3, 2, 1};
  double lse = 0;
  for (int j = 0; j < 4; j++) lse += exp((double)bias[j]);
  lse = log(lse);
  double want = 0;
  for (int i = 0; i < B; i++) want += lse - bias[labels[i]];
  want /= B;
  moe_model_stats st;
  ASSERT_OK(moe_model_forward(m, x, labels, B, &st));
  ASSERT_NEAR(st.loss, want, 2e-6);
  ASSERT_EQ_INT(st.correct, 2); /* argmax is class 2 */
  const int32_t *pred = moe_model_predictions(m);
  for (int i = 0; i < B; i++) ASSERT_EQ_INT(pred[i], 2);
  double aux = 0, z = 0;
  int dropped = 0;
  for (int b = 0; b < 2; b++) {
    aux += moe_model_layer_stats(m, b)->aux_loss;
    z += moe_model_layer_stats(m, b)->z_loss;
    dropped += moe_model_layer_stats(m, b)->dropped;
  }
  ASSERT(aux > 0 && z > 0);
  ASSERT_NEAR(st.aux, aux, 1e-12);
  ASSERT_NEAR(st.z, z, 1e-12);
  ASSERT_EQ_INT(st.dropped, dropped);
  /* inference: no loss, no hits counted, same predictions */
  ASSERT_OK(moe_model_forward(m, x, NULL, B, &st));
  ASSERT(st.loss == 0);
  ASSERT_EQ_INT(st.correct, 0);
  ASSERT_EQ_INT(moe_model_predictions(m)[0], 2);
}

TEST(model_forward_loss_values) {
  moe_model_t m;
  memset(&m, 0, sizeof m);
  forward_loss_values(failed_, &m, MOE_LOSS_COOPERATION);
  moe_model_free(&m);
  if (*failed_) return;
  /* specification: every assignment predicts the same, and the (normalized) gate weights sum to 1 */
  forward_loss_values(failed_, &m, MOE_LOSS_SPECIFICATION);
  moe_model_free(&m);
}

static void forward_errors(int *failed_, moe_model_t *m) {
  moe_model_config c;
  tiny_config(&c);
  ASSERT_OK(moe_model_init(m, &c));
  moe_model_init_params(m, 3);
  enum { B = 4 };
  float x[B * 3];
  uint64_t rng = 5;
  fd_fill(&rng, x, B * 3, -1, 1);
  uint8_t good[B] = {0, 3, 1, 2}, bad[B] = {0, 1, 4, 2}, worse[B] = {255, 0, 0, 0};
  /* backward before any forward */
  ASSERT_STATUS(moe_model_backward(m), MOE_ERR_STATE);
  moe_model_stats st;
  ASSERT_STATUS(moe_model_forward(m, x, bad, B, &st), MOE_ERR_VALUE);
  if (!strstr(moe_last_error(), "label 4 of sample 2"))
    FAIL_("error '%s' does not name the label and sample", moe_last_error());
  ASSERT_STATUS(moe_model_forward(m, x, worse, B, &st), MOE_ERR_VALUE);
  /* a failed forward leaves nothing to differentiate */
  ASSERT_STATUS(moe_model_backward(m), MOE_ERR_STATE);
  /* an inference forward has nothing to differentiate either */
  ASSERT_OK(moe_model_forward(m, x, NULL, B, &st));
  ASSERT_STATUS(moe_model_backward(m), MOE_ERR_STATE);
  if (!strstr(moe_last_error(), "no forward with labels")) FAIL_("error '%s' does not say why", moe_last_error());
  /* a labelled one does, once */
  ASSERT_OK(moe_model_forward(m, x, good, B, &st));
  ASSERT_OK(moe_model_backward(m));
  ASSERT_STATUS(moe_model_backward(m), MOE_ERR_STATE);
  if (!strstr(moe_last_error(), "no forward with labels"))
    FAIL_("a second backward fails for another reason: '%s'", moe_last_error());
  /* a labelled forward that fails after a good one (NaN input) leaves nothing to differentiate, and
   * backward adds nothing */
  ASSERT_OK(moe_model_forward(m, x, good, B, &st));
  float xn[B * 3];
  memcpy(xn, x, sizeof xn);
  xn[5] = NAN;
  moe_model_zero_grad(m);
  ASSERT(moe_model_forward(m, xn, good, B, &st) != MOE_OK);
  ASSERT_STATUS(moe_model_backward(m), MOE_ERR_STATE);
  if (!strstr(moe_last_error(), "no forward with labels")) FAIL_("error '%s' does not say why", moe_last_error());
  for (int i = 0; i < m->nrefs; i++)
    for (size_t j = 0; j < m->refs[i].numel; j++) ASSERT(m->refs[i].grad[j] == 0.0f);
  /* B = 0 is fine */
  ASSERT_OK(moe_model_forward(m, x, good, 0, &st));
  ASSERT(st.loss == 0);
}

/* k of the last block changed after init: the specification loss's buffers follow it. */
TEST(model_spec_loss_follows_top_k) {
  moe_model_t m;
  moe_model_config c;
  tiny_config(&c);
  c.loss = MOE_LOSS_SPECIFICATION;
  c.moe.top_k = 1; /* buffers planned for k = 1, then k = E */
  ASSERT_OK(moe_model_init(&m, &c));
  moe_model_init_params(&m, 4);
  ASSERT_OK(moe_layer_set_top_k(&m.layers[c.blocks - 1], c.moe.E));
  enum { B = 5 };
  float x[B * 3];
  uint64_t rng = 9;
  fd_fill(&rng, x, B * 3, -1, 1);
  uint8_t y[B] = {0, 1, 2, 3, 1};
  moe_model_stats st;
  moe_status a = moe_model_forward(&m, x, y, B, &st), b = a == MOE_OK ? moe_model_backward(&m) : a;
  moe_model_free(&m);
  ASSERT_OK(a);
  ASSERT_OK(b);
}

TEST(model_forward_errors) {
  moe_model_t m;
  memset(&m, 0, sizeof m);
  forward_errors(failed_, &m);
  moe_model_free(&m);
}

/* ---------------------------------------------------------------- optimizers */

/* A tiny model whose params and grads are random, with the first element of in.weight (a matrix) and
 * of in.bias having gradient 0. Copies of the params go to p (double). */
static void opt_setup(int *failed_, moe_model_t *m, uint64_t seed) {
  moe_model_config c;
  tiny_config(&c);
  ASSERT_OK(moe_model_init(m, &c));
  uint64_t rng = seed;
  for (int i = 0; i < m->nrefs; i++) {
    fd_fill(&rng, m->refs[i].data, m->refs[i].numel, -0.5, 0.5);
    fd_fill(&rng, m->refs[i].grad, m->refs[i].numel, -1, 1);
  }
  moe_model_find(m, "in.weight")->grad[0] = 0.0f;
  moe_model_find(m, "in.bias")->grad[0] = 0.0f;
  int has3 = 0;
  for (int i = 0; i < m->nrefs; i++) has3 |= m->refs[i].ndim == 3;
  ASSERT(has3); /* expert matrices (ndim 3) are decayed too */
}

static void new_grads(moe_model_t *m, uint64_t *rng) {
  for (int i = 0; i < m->nrefs; i++) fd_fill(rng, m->refs[i].grad, m->refs[i].numel, -1, 1);
}

/* Expected AdamW step in double on (p, mo, v) from the model's grads; then compares with the model and
 * the optimizer state. */
static void adam_expect(int *failed_, const moe_model_t *m, const moe_optim_t *o, double *p, double *mo, double *v,
                        double lr, int t) {
  double b1 = o->cfg.beta1, b2 = o->cfg.beta2, eps = o->cfg.eps, wd = o->cfg.weight_decay;
  size_t off = 0;
  double worst = 0;
  for (int i = 0; i < m->nrefs; i++) {
    const moe_tensor_ref *r = &m->refs[i];
    double d = r->ndim >= 2 && !strstr(r->name, "bias") ? wd : 0.0;
    for (size_t j = 0; j < r->numel; j++, off++) {
      double g = r->grad[j];
      mo[off] = b1 * mo[off] + (1 - b1) * g;
      v[off] = b2 * v[off] + (1 - b2) * g * g;
      double mh = mo[off] / (1 - pow(b1, t)), vh = v[off] / (1 - pow(b2, t));
      p[off] -= lr * (mh / (sqrt(vh) + eps) + d * p[off]);
      double err = fabs(r->data[j] - p[off]);
      worst = err > worst ? err : worst;
      if (err > 1e-7 + 1e-6 * fabs(p[off]))
        FAIL_("adam step %d: %s[%zu] = %.9g, want %.9g", t, r->name, j, r->data[j], p[off]);
      if (fabs(o->m[off] - mo[off]) > 1e-7 * (1 + fabs(mo[off])) ||
          fabs(o->v[off] - v[off]) > 1e-7 * (1 + fabs(v[off])))
        FAIL_("adam step %d: moments of %s[%zu] (%.9g, %.9g), want (%.9g, %.9g)", t, r->name, j, o->m[off],
              o->v[off], mo[off], v[off]);
      p[off] = r->data[j]; /* go on from the float state */
    }
  }
  ASSERT(off == o->n);
}

static void optim_adam(int *failed_, moe_model_t *m, moe_optim_t *o, double **bufp) {
  opt_setup(failed_, m, 41);
  if (*failed_) return;
  size_t n = m->numel;
  double *buf = *bufp = calloc(3 * n, sizeof *buf);
  ASSERT(buf);
  double *p = buf, *mo = buf + n, *v = buf + 2 * n;
  size_t off = 0;
  for (int i = 0; i < m->nrefs; i++)
    for (size_t j = 0; j < m->refs[i].numel; j++) p[off++] = m->refs[i].data[j];
  memset(mo, 0, 2 * n * sizeof *mo);
  moe_optim_config oc;
  moe_optim_config_default(&oc);
  ASSERT(oc.kind == MOE_OPT_ADAM && oc.beta1 == 0.9f && oc.beta2 == 0.999f && oc.eps == 1e-8f);
  ASSERT(oc.weight_decay == 0.0f);
  oc.weight_decay = 0.1f;
  ASSERT_OK(moe_optim_init(o, &oc, m));
  ASSERT(o->n == n && o->m && o->v && o->step == 0);
  const moe_tensor_ref *w = moe_model_find(m, "in.weight"), *b = moe_model_find(m, "in.bias");
  float w0 = w->data[0], b0 = b->data[0], w1 = w->data[1];
  float g1 = w->grad[1];
  const float lr = 0.01f;
  moe_optim_step(o, m, lr);
  ASSERT_EQ_INT(o->step, 1);
  /* zero gradient: a matrix only decays, a bias does not move */
  ASSERT_NEAR(w->data[0], (double)w0 * (1 - (double)lr * 0.1), 1e-8);
  ASSERT(b->data[0] == b0);
  /* the first step of Adam moves by lr * sign(g) (bias-corrected), plus the decay */
  ASSERT_NEAR(w->data[1], (double)w1 - lr * (g1 > 0 ? 1 : -1) - (double)lr * 0.1 * w1, 1e-6);
  adam_expect(failed_, m, o, p, mo, v, lr, 1);
  if (*failed_) return;
  uint64_t rng = 77;
  new_grads(m, &rng);
  moe_optim_step(o, m, lr);
  ASSERT_EQ_INT(o->step, 2);
  adam_expect(failed_, m, o, p, mo, v, lr, 2);
}

TEST(model_optim_adamw_two_steps) {
  moe_model_t m;
  moe_optim_t o;
  memset(&m, 0, sizeof m);
  memset(&o, 0, sizeof o);
  double *buf = NULL;
  optim_adam(failed_, &m, &o, &buf);
  free(buf);
  moe_optim_free(&o);
  moe_model_free(&m);
}

static void optim_sgd(int *failed_, moe_model_t *m, moe_optim_t *o, double **bufp) {
  opt_setup(failed_, m, 43);
  if (*failed_) return;
  double *p = *bufp = calloc(2 * m->numel, sizeof *p);
  ASSERT(p);
  double *buf = p + m->numel; /* p: the parameters, buf: the velocity */
  size_t off = 0;
  for (int i = 0; i < m->nrefs; i++)
    for (size_t j = 0; j < m->refs[i].numel; j++) p[off++] = m->refs[i].data[j];
  memset(buf, 0, m->numel * sizeof *buf);
  moe_optim_config oc;
  moe_optim_config_default(&oc);
  oc.kind = MOE_OPT_SGD;
  oc.weight_decay = 0.1f;
  ASSERT(oc.momentum == 0.9f);
  ASSERT_OK(moe_optim_init(o, &oc, m));
  ASSERT(o->m && !o->v);
  const double lr = 0.05f, mu = oc.momentum;
  uint64_t rng = 11;
  for (int t = 1; t <= 2; t++) {
    if (t == 2) new_grads(m, &rng);
    moe_optim_step(o, m, (float)lr);
    ASSERT_EQ_INT(o->step, t);
    off = 0;
    for (int i = 0; i < m->nrefs; i++) {
      const moe_tensor_ref *r = &m->refs[i];
      double d = r->ndim >= 2 && !strstr(r->name, "bias") ? 0.1f : 0.0f;
      for (size_t j = 0; j < r->numel; j++, off++) {
        buf[off] = mu * buf[off] + r->grad[j] + d * p[off];
        p[off] -= lr * buf[off];
        if (fabs(r->data[j] - p[off]) > 1e-7 + 1e-6 * fabs(p[off]))
          FAIL_("sgd step %d: %s[%zu] = %.9g, want %.9g", t, r->name, j, r->data[j], p[off]);
        if (fabs(o->m[off] - buf[off]) > 1e-6 * (1 + fabs(buf[off])))
          FAIL_("sgd step %d: velocity of %s[%zu] %.9g, want %.9g", t, r->name, j, o->m[off], buf[off]);
        p[off] = r->data[j];
      }
    }
  }
}

TEST(model_optim_sgd_momentum) {
  moe_model_t m;
  moe_optim_t o;
  memset(&m, 0, sizeof m);
  memset(&o, 0, sizeof o);
  double *buf = NULL;
  optim_sgd(failed_, &m, &o, &buf);
  free(buf);
  moe_optim_free(&o);
  moe_model_free(&m);
}

/* A model of 2 x 8 x 64 x 96 expert weights plus the rest (over the optimizer's threading threshold)
 * on 2 threads: each parameter of a threaded, vectorized step must be bit for bit the scalar float
 * formula's, for AdamW and SGD, and the gradients left zeroed; then a NaN gradient makes the checked
 * step fail naming the tensor. */
TEST(model_optim_threaded_bits_and_checked_step) {
  for (int kind = 0; kind < 2; kind++) {
    moe_model_config c;
    tiny_config(&c);
    c.in_dim = 20;
    c.moe.D = 64;
    c.moe.H = 96;
    c.moe.E = 8;
    c.moe.threads = 2;
    moe_model_t m;
    moe_optim_t o;
    memset(&o, 0, sizeof o);
    ASSERT_OK(moe_model_init(&m, &c));
    ASSERT(m.numel >= (1 << 16));
    moe_optim_config oc;
    moe_optim_config_default(&oc);
    oc.kind = kind ? MOE_OPT_SGD : MOE_OPT_ADAM;
    oc.weight_decay = 0.1f;
    ASSERT_OK(moe_optim_init(&o, &oc, &m));
    float *p = malloc(m.numel * 4 * sizeof *p), *mo = p + m.numel, *v = mo + m.numel, *gs = v + m.numel;
    ASSERT(p);
    memset(mo, 0, 2 * m.numel * sizeof *mo);
    uint64_t rng = 5;
    for (int i = 0; i < m.nrefs; i++) fd_fill(&rng, m.refs[i].data, m.refs[i].numel, -0.5, 0.5);
    for (int t = 1; t <= 2 && !*failed_; t++) {
      new_grads(&m, &rng);
      const float lr = 0.01f, bc1 = 1.0f - powf(oc.beta1, (float)t), bc2 = 1.0f - powf(oc.beta2, (float)t);
      size_t off = 0, wrong = 0;
      for (int i = 0; i < m.nrefs; i++) {
        const moe_tensor_ref *r = &m.refs[i];
        for (size_t j = 0; j < r->numel; j++) p[off + j] = r->data[j], gs[off + j] = r->grad[j];
        off += r->numel;
      }
      ASSERT_OK(moe_optim_step_checked(&o, &m, lr));
      off = 0;
      for (int i = 0; i < m.nrefs; i++) {
        const moe_tensor_ref *r = &m.refs[i];
        float wd = moe_param_decays(r) ? oc.weight_decay : 0.0f;
        for (size_t j = 0; j < r->numel; j++, off++) {
          float g = gs[off];
          if (r->grad[j] != 0 && !wrong++)
            FAIL_("%s: the checked step left %s's gradient [%zu] = %g, not 0", moe_opt_name(oc.kind), r->name, j,
                  r->grad[j]);
          if (kind == 0) {
            mo[off] = oc.beta1 * mo[off] + (1.0f - oc.beta1) * g;
            v[off] = oc.beta2 * v[off] + (1.0f - oc.beta2) * g * g;
            float mh = mo[off] / bc1, vh = v[off] / bc2;
            p[off] -= lr * (mh / (sqrtf(vh) + oc.eps) + wd * p[off]);
          } else {
            mo[off] = oc.momentum * mo[off] + g + wd * p[off];
            p[off] -= lr * mo[off];
          }
          if (memcmp(&p[off], &r->data[j], 4) || memcmp(&mo[off], &o.m[off], 4) ||
              (kind == 0 && memcmp(&v[off], &o.v[off], 4))) {
            if (!wrong++)
              FAIL_("%s step %d: %s[%zu] = %.9g (state %.9g), want %.9g (%.9g)", moe_opt_name(oc.kind), t, r->name,
                    j, r->data[j], o.m[off], p[off], mo[off]);
          }
        }
      }
    }
    const moe_tensor_ref *w = moe_model_find(&m, "blocks.0.moe.experts.fc2.weight");
    ASSERT(w);
    w->grad[77] = NAN;
    moe_status st = moe_optim_step_checked(&o, &m, 0.01f);
    if (st != MOE_ERR_VALUE || !strstr(moe_last_error(), "'blocks.0.moe.experts.fc2.weight' ["))
      FAIL_("a NaN gradient: status %d, '%s'", st, moe_last_error());
    free(p);
    moe_optim_free(&o);
    moe_model_free(&m);
  }
}

TEST(model_optim_lr_schedule) {
  const float base = 0.1f;
  /* warm-up over 10 steps of 110 */
  for (int s = 0; s < 10; s++) ASSERT_NEAR(moe_lr_schedule(base, s, 10, 110), base * (s + 1) / 10.0, 1e-8);
  ASSERT_NEAR(moe_lr_schedule(base, 9, 10, 110), base, 1e-8);  /* the last warm-up step reaches base */
  ASSERT_NEAR(moe_lr_schedule(base, 10, 10, 110), base, 1e-8); /* the cosine starts at base */
  ASSERT_NEAR(moe_lr_schedule(base, 60, 10, 110), base / 2, 1e-8);
  ASSERT_NEAR(moe_lr_schedule(base, 35, 10, 110), base * 0.5 * (1 + cos(M_PI * 0.25)), 1e-8);
  ASSERT_NEAR(moe_lr_schedule(base, 110, 10, 110), 0.0, 1e-9);
  ASSERT_NEAR(moe_lr_schedule(base, 500, 10, 110), 0.0, 1e-9); /* past the end: stays 0 */
  float prev = moe_lr_schedule(base, 10, 10, 110);
  for (int s = 11; s <= 110; s++) {
    float cur = moe_lr_schedule(base, s, 10, 110);
    ASSERT(cur <= prev);
    prev = cur;
  }
  /* no warm-up: cosine from base */
  ASSERT_NEAR(moe_lr_schedule(base, 0, 0, 100), base, 1e-8);
  ASSERT_NEAR(moe_lr_schedule(base, 50, 0, 100), base / 2, 1e-8);
  /* warm-up as long as the run: stays at base after it */
  ASSERT_NEAR(moe_lr_schedule(base, 20, 20, 20), base, 1e-8);
}

/* ---------------------------------------------------------------- checkpoints */

#define RT_B 12

static void rt_config(moe_model_config *c) {
  moe_model_config_default(c);
  c->in_dim = 5;
  c->classes = 3;
  c->blocks = 2;
  c->moe.D = 6;
  c->moe.H = 4;
  c->moe.E = 3;
  c->moe.top_k = 2;
  c->moe.capacity_setting = 1.25f;
  c->moe.normalize_topk = 0;
  c->moe.act = MOE_ACT_SILU;
  c->moe.dispatch = MOE_DISPATCH_STATIC;
  c->moe.priority = MOE_PRIORITY_SCORE;
  c->moe.router = MOE_ROUTER_COSINE;
  c->moe.proj_dim = 5;
  c->moe.expert_bias = 0;
  c->moe.threads = 1;
  c->loss = MOE_LOSS_SPECIFICATION;
  c->aux_weight = 0.03f;
  c->z_weight = 0.002f;
}

static moe_status train_step(moe_model_t *m, moe_optim_t *o, const float *x, const uint8_t *y, int B, float lr,
                             moe_model_stats *st) {
  moe_model_zero_grad(m);
  moe_status s = moe_model_forward(m, x, y, B, st);
  if (s == MOE_OK) s = moe_model_backward(m);
  if (s == MOE_OK) moe_optim_step(o, m, lr);
  return s;
}

/* Index of the first ref whose name, shape or bits differ; -1 when all are identical. */
static int refs_differ(const moe_model_t *a, const moe_model_t *b) {
  if (a->nrefs != b->nrefs || a->numel != b->numel) return 0;
  for (int i = 0; i < a->nrefs; i++) {
    const moe_tensor_ref *x = &a->refs[i], *y = &b->refs[i];
    if (strcmp(x->name, y->name) || x->ndim != y->ndim || x->numel != y->numel) return i;
    for (int d = 0; d < x->ndim; d++)
      if (x->shape[d] != y->shape[d]) return i;
    if (memcmp(x->data, y->data, x->numel * 4)) return i;
  }
  return -1;
}

static int spit(const char *path, const unsigned char *data, size_t n) {
  FILE *fp = fopen(path, "wb");
  if (!fp) return 0;
  int ok = fwrite(data, 1, n, fp) == n;
  return (fclose(fp) == 0) & ok;
}

/* Are the two files byte-identical? -1 when one cannot be read. */
static int files_equal(const char *a, const char *b) {
  size_t na = 0, nb = 0;
  unsigned char *da = (unsigned char *)test_read_file(a, &na), *db = (unsigned char *)test_read_file(b, &nb);
  int eq = da && db ? na == nb && !memcmp(da, db, na) : -1;
  free(da);
  free(db);
  return eq;
}

typedef struct {
  moe_model_t m, m2;
  moe_optim_t o, o2;
} rt_ctx;

/* A model and Adam after two training steps on random data, saved to path. */
static void rt_make(int *failed_, rt_ctx *r, const char *path, float *x, uint8_t *y) {
  moe_model_config c;
  rt_config(&c);
  ASSERT_OK(moe_model_init(&r->m, &c));
  moe_model_init_params(&r->m, 2024);
  uint64_t rng = 31337;
  randomize_vectors(&r->m, &rng);
  fd_fill(&rng, x, RT_B * 5, -1, 1);
  for (int i = 0; i < RT_B; i++) y[i] = (uint8_t)(fd_next(&rng) % 3);
  moe_optim_config oc;
  moe_optim_config_default(&oc);
  oc.beta1 = 0.85f;
  oc.beta2 = 0.995f;
  oc.eps = 1e-7f;
  oc.momentum = 0.7f;
  oc.weight_decay = 0.05f;
  ASSERT_OK(moe_optim_init(&r->o, &oc, &r->m));
  moe_model_stats st;
  for (int s = 0; s < 2; s++) ASSERT_OK(train_step(&r->m, &r->o, x, y, RT_B, 0.02f, &st));
  moe_train_state ts;
  memset(&ts, 0, sizeof ts);
  ts.epoch = 3;
  ts.step = 17;
  ts.seed = 42;
  snprintf(ts.extra, sizeof ts.extra, "a=b");
  ASSERT_OK(moe_checkpoint_save(path, &r->m, &r->o, &ts));
}

static void rt_body(int *failed_, rt_ctx *r) {
  char p1[512], p2[512], p3[512], p4[512];
  test_tmp_path("model_rt1.safetensors", p1, sizeof p1);
  test_tmp_path("model_rt2.safetensors", p2, sizeof p2);
  test_tmp_path("model_rt3.safetensors", p3, sizeof p3);
  test_tmp_path("model_rt4.safetensors", p4, sizeof p4);
  float x[RT_B * 5];
  uint8_t y[RT_B];
  rt_make(failed_, r, p1, x, y);
  if (*failed_) return;
  moe_train_state ts2;
  memset(&ts2, 0x5a, sizeof ts2);
  ASSERT_OK(moe_checkpoint_load(p1, &r->m2, &r->o2, &ts2));
  /* configuration */
  const moe_model_config *a = &r->m.cfg, *b = &r->m2.cfg;
  ASSERT_EQ_INT(b->in_dim, a->in_dim);
  ASSERT_EQ_INT(b->classes, a->classes);
  ASSERT_EQ_INT(b->blocks, a->blocks);
  ASSERT_EQ_INT(b->moe.D, a->moe.D);
  ASSERT_EQ_INT(b->moe.H, a->moe.H);
  ASSERT_EQ_INT(b->moe.E, a->moe.E);
  ASSERT_EQ_INT(b->moe.top_k, a->moe.top_k);
  ASSERT(b->moe.capacity_setting == a->moe.capacity_setting);
  ASSERT_EQ_INT(b->moe.normalize_topk, a->moe.normalize_topk);
  ASSERT_EQ_INT(b->moe.act, a->moe.act);
  ASSERT_EQ_INT(b->moe.dispatch, a->moe.dispatch);
  ASSERT_EQ_INT(b->moe.priority, a->moe.priority);
  ASSERT_EQ_INT(b->moe.router, a->moe.router);
  ASSERT_EQ_INT(b->moe.proj_dim, a->moe.proj_dim);
  ASSERT_EQ_INT(b->moe.gate_bias, a->moe.gate_bias);
  ASSERT_EQ_INT(b->moe.expert_bias, a->moe.expert_bias);
  ASSERT_EQ_INT(b->moe.inner_experts, a->moe.inner_experts);
  ASSERT_EQ_INT(b->moe.inner_top_k, a->moe.inner_top_k);
  ASSERT_EQ_INT(b->loss, a->loss);
  ASSERT(b->aux_weight == a->aux_weight);
  ASSERT(b->z_weight == a->z_weight);
  /* parameters */
  ASSERT_EQ_INT(r->m2.nrefs, r->m.nrefs);
  ASSERT_EQ_INT(r->m2.numel, r->m.numel);
  int d = refs_differ(&r->m, &r->m2);
  if (d >= 0) FAIL_("loaded ref %d (%s) differs from the saved one", d, r->m.refs[d].name);
  /* optimizer */
  ASSERT_EQ_INT(r->o2.cfg.kind, MOE_OPT_ADAM);
  ASSERT(r->o2.cfg.beta1 == r->o.cfg.beta1 && r->o2.cfg.beta2 == r->o.cfg.beta2);
  ASSERT(r->o2.cfg.eps == r->o.cfg.eps && r->o2.cfg.momentum == r->o.cfg.momentum);
  ASSERT(r->o2.cfg.weight_decay == r->o.cfg.weight_decay);
  ASSERT_EQ_INT(r->o2.step, 2);
  ASSERT_EQ_INT(r->o2.n, r->o.n);
  ASSERT(r->o2.m && r->o2.v);
  ASSERT(!memcmp(r->o2.m, r->o.m, r->o.n * 4));
  ASSERT(!memcmp(r->o2.v, r->o.v, r->o.n * 4));
  /* training state */
  ASSERT_EQ_INT(ts2.epoch, 3);
  ASSERT_EQ_INT(ts2.step, 17);
  ASSERT(ts2.seed == 42);
  ASSERT(!strcmp(ts2.extra, "a=b"));
  /* the loaded model saves to the same bytes */
  ASSERT_OK(moe_checkpoint_save(p2, &r->m2, &r->o2, &ts2));
  ASSERT_EQ_INT(files_equal(p1, p2), 1);
  /* and trains on bit for bit (threads are not part of a checkpoint: use the same count) */
  moe_model_set_threads(&r->m2, r->m.cfg.moe.threads);
  moe_model_stats s1, s2;
  ASSERT_OK(train_step(&r->m, &r->o, x, y, RT_B, 0.02f, &s1));
  ASSERT_OK(train_step(&r->m2, &r->o2, x, y, RT_B, 0.02f, &s2));
  ASSERT(s1.loss == s2.loss && s1.aux == s2.aux && s1.z == s2.z);
  ASSERT_EQ_INT(s1.dropped, s2.dropped);
  ASSERT(s1.loss > 0);
  d = refs_differ(&r->m, &r->m2);
  if (d >= 0) FAIL_("after a step, ref %d (%s) differs between original and loaded", d, r->m.refs[d].name);
  ASSERT(!memcmp(r->o2.m, r->o.m, r->o.n * 4));
  ASSERT(!memcmp(r->o2.v, r->o.v, r->o.n * 4));
  ASSERT_EQ_INT(r->o2.step, 3);
  /* the step changed the parameters, so the comparison above means something */
  moe_model_t m1;
  ASSERT_OK(moe_checkpoint_load(p1, &m1, NULL, NULL));
  d = refs_differ(&r->m, &m1);
  moe_model_free(&m1);
  ASSERT(d >= 0);
  ASSERT_OK(moe_checkpoint_save(p3, &r->m, &r->o, &ts2));
  ASSERT_OK(moe_checkpoint_save(p4, &r->m2, &r->o2, &ts2));
  ASSERT_EQ_INT(files_equal(p3, p4), 1);
  ASSERT_EQ_INT(files_equal(p1, p3), 0);
}

TEST(model_checkpoint_round_trip) {
  rt_ctx *r = calloc(1, sizeof *r);
  ASSERT(r);
  rt_body(failed_, r);
  moe_optim_free(&r->o);
  moe_optim_free(&r->o2);
  moe_model_free(&r->m);
  moe_model_free(&r->m2);
  free(r);
}

/* SGD state (one buffer) and weights-only checkpoints. */
static void sgd_and_weights_body(int *failed_, rt_ctx *r) {
  char p1[512], p2[512];
  test_tmp_path("model_sgd.safetensors", p1, sizeof p1);
  test_tmp_path("model_weights.safetensors", p2, sizeof p2);
  moe_model_config c;
  rt_config(&c);
  c.loss = MOE_LOSS_COOPERATION;
  c.moe.inner_experts = 2; /* hierarchical: the inner layers' tensors are saved and restored too */
  c.moe.inner_top_k = 1;
  ASSERT_OK(moe_model_init(&r->m, &c));
  int inner_refs = 0;
  for (int i = 0, e; i < r->m.nrefs; i++)
    inner_refs += sscanf(r->m.refs[i].name, "blocks.%*d.moe.experts.%d.", &e) == 1;
  ASSERT(inner_refs > 0);
  moe_model_init_params(&r->m, 5);
  moe_optim_config oc;
  moe_optim_config_default(&oc);
  oc.kind = MOE_OPT_SGD;
  oc.momentum = 0.8f;
  ASSERT_OK(moe_optim_init(&r->o, &oc, &r->m));
  float x[RT_B * 5];
  uint8_t y[RT_B];
  uint64_t rng = 8;
  fd_fill(&rng, x, RT_B * 5, -1, 1);
  for (int i = 0; i < RT_B; i++) y[i] = (uint8_t)(fd_next(&rng) % 3);
  moe_model_stats st;
  ASSERT_OK(train_step(&r->m, &r->o, x, y, RT_B, 0.1f, &st));
  ASSERT_OK(moe_checkpoint_save(p1, &r->m, &r->o, NULL));
  moe_train_state ts;
  memset(&ts, 0x5a, sizeof ts);
  ASSERT_OK(moe_checkpoint_load(p1, &r->m2, &r->o2, &ts));
  ASSERT_EQ_INT(r->m2.cfg.loss, MOE_LOSS_COOPERATION);
  ASSERT_EQ_INT(r->m2.cfg.moe.inner_experts, 2);
  ASSERT_EQ_INT(r->m2.cfg.moe.inner_top_k, 1);
  ASSERT_EQ_INT(r->o2.cfg.kind, MOE_OPT_SGD);
  ASSERT(r->o2.cfg.momentum == 0.8f);
  ASSERT_EQ_INT(r->o2.step, 1);
  ASSERT(r->o2.m && !r->o2.v);
  ASSERT(!memcmp(r->o2.m, r->o.m, r->o.n * 4));
  ASSERT_EQ_INT(refs_differ(&r->m, &r->m2), -1);
  ASSERT_EQ_INT(ts.epoch, 0); /* saved without a training state */
  ASSERT_EQ_INT(ts.step, 0);
  ASSERT(ts.extra[0] == 0);
  moe_optim_free(&r->o2);
  moe_model_free(&r->m2);
  /* weights only: the optimizer comes back empty */
  ASSERT_OK(moe_checkpoint_save(p2, &r->m, NULL, NULL));
  ASSERT_OK(moe_checkpoint_load(p2, &r->m2, &r->o2, NULL));
  ASSERT(r->o2.m == NULL && r->o2.v == NULL && r->o2.n == 0);
  ASSERT_EQ_INT(refs_differ(&r->m, &r->m2), -1);
}

TEST(model_checkpoint_sgd_and_weights_only) {
  rt_ctx *r = calloc(1, sizeof *r);
  ASSERT(r);
  sgd_and_weights_body(failed_, r);
  moe_optim_free(&r->o);
  moe_optim_free(&r->o2);
  moe_model_free(&r->m);
  moe_model_free(&r->m2);
  free(r);
}

/* Copies the checkpoint src to dst tensor by tensor with its metadata; the tensor `alter` gets its last
 * two dimensions swapped (same byte count, wrong shape) and with `extra` one more tensor is added. */
static moe_status copy_checkpoint(const char *src, const char *dst, const char *alter, int extra) {
  static const char *const keys[] = {
      "format", "in_dim", "classes", "blocks", "D", "H", "E", "proj_dim", "gate_bias", "expert_bias", "top_k",
      "capacity_setting", "normalize_topk", "activation", "dispatch", "priority", "router", "loss",
      "aux_weight", "z_weight", "epoch", "step", "seed", "train", "optimizer", "beta1", "beta2", "eps",
      "momentum", "weight_decay", "optim_step", "inner_experts", "inner_top_k"};
  moe_st *f = NULL;
  moe_st_writer *w = NULL;
  moe_status s = moe_st_open(&f, src);
  if (s == MOE_OK) s = moe_st_writer_new(&w);
  for (int i = 0; s == MOE_OK && i < moe_st_count(f); i++) {
    moe_tensor_view v;
    s = moe_st_at(f, i, &v);
    if (s != MOE_OK) break;
    int64_t shape[MOE_MAX_DIMS];
    memcpy(shape, v.shape, sizeof shape);
    if (alter && !strcmp(v.name, alter) && v.ndim >= 2) {
      int64_t t = shape[v.ndim - 1];
      shape[v.ndim - 1] = shape[v.ndim - 2];
      shape[v.ndim - 2] = t;
    }
    s = moe_st_writer_add(w, v.name, v.dtype, v.ndim, shape, v.data);
  }
  for (size_t i = 0; s == MOE_OK && i < sizeof keys / sizeof keys[0]; i++)
    if (moe_st_meta(f, keys[i])) s = moe_st_writer_meta(w, keys[i], moe_st_meta(f, keys[i]));
  if (s == MOE_OK && extra) {
    float one = 1.0f;
    int64_t shp[1] = {1};
    s = moe_st_writer_add(w, "unexpected.tensor", MOE_DT_F32, 1, shp, &one);
  }
  if (s == MOE_OK) s = moe_st_writer_save(w, dst);
  moe_st_writer_free(w);
  moe_st_close(f);
  return s;
}

/* moe_checkpoint_load(path) must fail with st (or any failure when st is MOE_OK), with a message naming
 * the path and containing needle (when not NULL), leaving the model and optimizer zeroed. */
static void expect_load_fails(int *failed_, const char *path, moe_status want, const char *needle) {
  moe_model_t m;
  moe_optim_t o;
  moe_train_state ts;
  memset(&m, 0x5a, sizeof m);
  memset(&o, 0x5a, sizeof o);
  moe_status s = moe_checkpoint_load(path, &m, &o, &ts);
  char msg[2048];
  snprintf(msg, sizeof msg, "%s", moe_last_error());
  int zeroed = !m.refs && !m.layers && !m.st && !m.dense && !m.dense_grad && m.nrefs == 0 && !o.m && !o.v;
  moe_optim_free(&o); /* both must be safe to free after a failure */
  moe_model_free(&m);
  if (want == MOE_OK ? s == MOE_OK : s != want)
    FAIL_("loading %s -> %s, want %s (%s)", path, moe_status_name(s), want == MOE_OK ? "a failure" :
          moe_status_name(want), msg);
  if (!strstr(msg, path)) FAIL_("error '%s' does not name the file %s", msg, path);
  if (needle && !strstr(msg, needle)) FAIL_("error '%s' lacks '%s'", msg, needle);
  if (!zeroed) FAIL_("loading %s failed but left the model or optimizer not zeroed", path);
}

static void bad_body(int *failed_, rt_ctx *r, moe_layer_t *layer) {
  char good[512], p[512];
  test_tmp_path("model_good.safetensors", good, sizeof good);
  float x[RT_B * 5];
  uint8_t y[RT_B];
  rt_make(failed_, r, good, x, y);
  if (*failed_) return;

  /* a missing file */
  expect_load_fails(failed_, test_tmp_path("model_does_not_exist.safetensors", p, sizeof p), MOE_ERR_IO, NULL);
  if (*failed_) return;

  /* truncated in the middle, and inside the header */
  size_t n = 0;
  unsigned char *bytes = (unsigned char *)test_read_file(good, &n);
  ASSERT(bytes && n > 1000);
  char ph[512];
  int ok = spit(test_tmp_path("model_truncated.safetensors", p, sizeof p), bytes, n / 2);
  ok = ok && spit(test_tmp_path("model_truncated_header.safetensors", ph, sizeof ph), bytes, 100);
  free(bytes);
  ASSERT(ok);
  expect_load_fails(failed_, p, MOE_OK, NULL);
  if (*failed_) return;
  expect_load_fails(failed_, ph, MOE_OK, NULL);
  if (*failed_) return;

  /* a layer's weights, not a checkpoint */
  moe_layer_config lc;
  moe_layer_config_default(&lc);
  lc.D = 6;
  lc.H = 8;
  lc.E = 4;
  lc.threads = 1;
  ASSERT_OK(moe_layer_init(layer, &lc));
  moe_layer_init_params(layer, 1);
  moe_st_writer *w = NULL;
  ASSERT_OK(moe_st_writer_new(&w));
  moe_status s = moe_layer_save_params(layer, w);
  if (s == MOE_OK) s = moe_st_writer_save(w, test_tmp_path("model_layer.safetensors", p, sizeof p));
  moe_st_writer_free(w);
  ASSERT_OK(s);
  expect_load_fails(failed_, p, MOE_ERR_MISSING, "not a libmoe checkpoint");
  if (*failed_) return;

  /* an unaltered copy loads: the copier keeps everything a checkpoint needs */
  ASSERT_OK(copy_checkpoint(good, test_tmp_path("model_copy.safetensors", p, sizeof p), NULL, 0));
  moe_model_t m;
  moe_optim_t o;
  ASSERT_OK(moe_checkpoint_load(p, &m, &o, NULL));
  int d = refs_differ(&r->m, &m);
  int same_state = o.n == r->o.n && o.m && o.v && !memcmp(o.m, r->o.m, o.n * 4) && !memcmp(o.v, r->o.v, o.n * 4);
  moe_optim_free(&o);
  moe_model_free(&m);
  ASSERT_EQ_INT(d, -1);
  ASSERT(same_state);

  /* one parameter with the wrong shape (same byte count) */
  const char *bad = "blocks.1.moe.experts.fc1.weight";
  ASSERT_OK(copy_checkpoint(good, test_tmp_path("model_shape.safetensors", p, sizeof p), bad, 0));
  expect_load_fails(failed_, p, MOE_ERR_SHAPE, bad);
  if (*failed_) return;
  /* an optimizer tensor with the wrong shape (found after the optimizer state is allocated) */
  bad = "optim.v.head.weight";
  ASSERT_OK(copy_checkpoint(good, test_tmp_path("model_shape_opt.safetensors", p, sizeof p), bad, 0));
  expect_load_fails(failed_, p, MOE_ERR_SHAPE, bad);
  if (*failed_) return;
  /* a tensor the configuration does not account for */
  ASSERT_OK(copy_checkpoint(good, test_tmp_path("model_extra.safetensors", p, sizeof p), NULL, 1));
  expect_load_fails(failed_, p, MOE_ERR_FORMAT, "tensors");
}

TEST(model_checkpoint_bad_input) {
  rt_ctx *r = calloc(1, sizeof *r);
  moe_layer_t *layer = calloc(1, sizeof *layer);
  if (r && layer) bad_body(failed_, r, layer);
  else *failed_ = 1;
  if (layer) moe_layer_free(layer);
  if (r) {
    moe_optim_free(&r->o);
    moe_model_free(&r->m);
  }
  free(layer);
  free(r);
}
