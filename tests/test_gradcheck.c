/* Finite-difference checks of moe_layer_backward on small layers (T=10, D=6, H=8, E=4, P=5).
 * The loss is L = <dy, y> + daux * aux_loss + dz * z_loss + <dspec, spec> + <dw, weights>; for x and every
 * parameter tensor it compares the analytic gradient with central differences, (a) along a random
 * unit direction over the whole tensor and (b) on up to 6 single elements (for expert tensors, of
 * experts that received tokens). Routing (top-k, capacity drops) is discontinuous, so every perturbed
 * forward must keep the same routing: same expert counts and drops, the same zero spec rows, and no
 * spec row jumping (an expert switch); otherwise the test fails saying so. Biases are randomized and
 * the cosine logit scale is set below ln 100 so that every tensor has a nonzero gradient, which is
 * asserted too. Set MOE_GRADCHECK_VERBOSE=1 to print the worst error of each configuration. */
#include <stdint.h>
#include <stdlib.h>

#include "fdcheck.h"
#include "test.h"

#define GC_T 10
#define GC_D 6
#define GC_H 8
#define GC_E 4
#define GC_P 5
#define GC_ELEMS 6      /* single elements checked per tensor */
#define GC_EPS 1e-3     /* central-difference step */
#define GC_ATOL 1e-3    /* |fd - an| <= GC_ATOL + GC_RTOL * |an| */
#define GC_RTOL 1e-3
#define GC_JUMP 0.02    /* a spec row moving further than this under a perturbation: an expert switch */
#define GC_MIN_GRAD 1e-3 /* every tensor's analytic gradient must reach this somewhere */

typedef struct {
  const char *name;
  moe_router router;
  moe_act act;
  moe_dispatch dispatch;
  moe_priority priority;
  int k;
  float capacity;
  int normalize_topk;
  int bias; /* gate_bias and expert_bias */
  uint64_t seed;
  int want_drops; /* assert that capacity drops happen */
} gc_case;

typedef struct { /* open models' routing and shared experts (DESIGN 4.1b) */
  moe_score score;
  int n_group, topk_group;
  moe_group_score group_score;
  float routed_scale;
  int select_bias, shared_H, shared_gate;
  float swiglu_limit; /* swiglu_oai's clamp; 0: the default */
} gc_open;

typedef struct {
  const gc_case *c;
  const gc_open *o; /* or NULL */
  moe_layer_t l;
  int T, D, E, k;
  float *x, *y, *spec, *spec0, *dy, *dspec, *dw, *dx;
  float daux, dz;
  int32_t counts0[GC_E];
  int dropped0;
  fd_check fd;        /* the finite differences and their worst errors */
  double max_jump;    /* largest spec movement seen under a perturbation */
} gc_ctx;

static int gc_row_zero(const float *r, int D) {
  for (int d = 0; d < D; d++)
    if (r[d] != 0.0f) return 0;
  return 1;
}

/* One forward at the current parameters and x: the loss in double, then the routing compared with
 * the reference forward. Returns 0 (after printing why) on an error or a routing change: the
 * fd_check loss callback. */
static int gc_loss(void *ctx, double *L, const char *what) {
  gc_ctx *g = ctx;
  moe_layer_stats st;
  moe_status s = moe_layer_forward(&g->l, g->x, g->T, g->y, g->spec, &st);
  if (s != MOE_OK) {
    fprintf(stderr, "  [%s] forward at %s: %s: %s\n", g->c->name, what, moe_status_name(s), moe_last_error());
    return 0;
  }
  int T = g->T, D = g->D, k = g->k;
  double acc = (double)g->daux * st.aux_loss + (double)g->dz * st.z_loss;
  for (int i = 0; i < T * D; i++) acc += (double)g->dy[i] * g->y[i];
  for (int i = 0; i < T * k * D; i++) acc += (double)g->dspec[i] * g->spec[i];
  for (int i = 0; i < T * k; i++) acc += (double)g->dw[i] * st.weights[i];
  *L = acc;
  if (st.dropped != g->dropped0) {
    fprintf(stderr, "  [%s] routing changed at %s: dropped %d, reference %d; pick another seed\n",
            g->c->name, what, st.dropped, g->dropped0);
    return 0;
  }
  for (int e = 0; e < g->E; e++)
    if (st.expert_counts[e] != g->counts0[e]) {
      fprintf(stderr, "  [%s] routing changed at %s: expert %d count %d, reference %d; pick another seed\n",
              g->c->name, what, e, st.expert_counts[e], g->counts0[e]);
      return 0;
    }
  for (int a = 0; a < T * k; a++) {
    const float *r = g->spec + (size_t)a * D, *r0 = g->spec0 + (size_t)a * D;
    if (gc_row_zero(r, D) != gc_row_zero(r0, D)) {
      fprintf(stderr, "  [%s] routing changed at %s: assignment %d (token %d slot %d) %s; pick another seed\n",
              g->c->name, what, a, a / k, a % k, gc_row_zero(r, D) ? "now dropped" : "no longer dropped");
      return 0;
    }
    for (int d = 0; d < D; d++) {
      double j = fabs((double)r[d] - r0[d]);
      if (j > g->max_jump) g->max_jump = j;
      if (j > GC_JUMP) {
        fprintf(stderr, "  [%s] routing changed at %s: spec row %d (token %d slot %d) moved by %g: "
                "an expert switch; pick another seed\n", g->c->name, what, a, a / k, a % k, j);
        return 0;
      }
    }
  }
  return 1;
}

/* swiglu_oai: how many gate values (above the limit) and up values (outside +-limit) of all experts and
 * tokens clamp, so that a case can assert that the zero-gradient paths are exercised. */
static int gc_clamps(const gc_ctx *g) {
  moe_layer_t *l = (moe_layer_t *)&g->l;
  const float *w1 = moe_layer_param(l, "experts.fc1.weight"), *w3 = moe_layer_param(l, "experts.fc3.weight");
  const float *b1 = moe_layer_param(l, "experts.fc1.bias"), *b3 = moe_layer_param(l, "experts.fc3.bias");
  double lim = l->cfg.swiglu_limit;
  int n = 0;
  for (int e = 0; e < GC_E; e++)
    for (int t = 0; t < GC_T; t++)
      for (int j = 0; j < GC_H; j++) {
        size_t r = (size_t)e * GC_H + j;
        double a = b1 ? b1[r] : 0, u = b3 ? b3[r] : 0;
        for (int d = 0; d < GC_D; d++) {
          a += (double)g->x[t * GC_D + d] * w1[r * GC_D + d];
          u += (double)g->x[t * GC_D + d] * w3[r * GC_D + d];
        }
        n += (a > lim) + (fabs(u) > lim);
      }
  return n;
}

static int gc_run_checks(gc_ctx *g) {
  const gc_case *c = g->c;
  int T = GC_T, D = GC_D, k = c->k;
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.D = D;
  cfg.H = GC_H;
  cfg.E = GC_E;
  cfg.top_k = k;
  cfg.capacity_setting = c->capacity;
  cfg.normalize_topk = c->normalize_topk;
  cfg.act = c->act;
  cfg.dispatch = c->dispatch;
  cfg.priority = c->priority;
  cfg.router = c->router;
  cfg.proj_dim = GC_P;
  cfg.gate_bias = c->bias;
  cfg.expert_bias = c->bias;
  cfg.threads = 1;
  if (g->o) {
    cfg.score = g->o->score;
    cfg.n_group = g->o->n_group;
    cfg.topk_group = g->o->topk_group;
    cfg.group_score = g->o->group_score;
    cfg.routed_scale = g->o->routed_scale;
    cfg.select_bias = g->o->select_bias;
    cfg.shared_H = g->o->shared_H;
    cfg.shared_gate = g->o->shared_gate;
    if (g->o->swiglu_limit > 0) cfg.swiglu_limit = g->o->swiglu_limit;
  }
  moe_status s = moe_layer_init(&g->l, &cfg);
  if (s != MOE_OK) {
    fprintf(stderr, "  [%s] moe_layer_init: %s\n", c->name, moe_last_error());
    return 0;
  }
  moe_layer_t *l = &g->l;
  g->T = T;
  g->D = D;
  g->E = GC_E;
  g->k = k;
  g->x = malloc((size_t)T * D * 4);
  g->y = malloc((size_t)T * D * 4);
  g->dy = malloc((size_t)T * D * 4);
  g->dx = malloc((size_t)T * D * 4);
  g->spec = malloc((size_t)T * k * D * 4);
  g->spec0 = malloc((size_t)T * k * D * 4);
  g->dspec = malloc((size_t)T * k * D * 4);
  g->dw = malloc((size_t)T * k * 4);
  if (!g->x || !g->y || !g->dy || !g->dx || !g->spec || !g->spec0 || !g->dspec || !g->dw) {
    fprintf(stderr, "  [%s] out of memory\n", c->name);
    return 0;
  }

  moe_layer_init_params(l, c->seed);
  uint64_t rng = c->seed ^ 0x5DEECE66Dull;
  static const char *const biases[] = {"gate.bias", "gate.proj.bias", "experts.fc1.bias", "experts.fc2.bias",
                                       "gate.select_bias", "experts.fc3.bias"};
  for (size_t i = 0; i < sizeof biases / sizeof biases[0]; i++) {
    const moe_param_info *pi = moe_layer_param_find(l, biases[i]);
    if (pi) fd_fill(&rng, l->params + pi->offset, pi->numel, -0.3, 0.3);
  }
  float *scale = moe_layer_param(l, "gate.logit_scale");
  if (scale) scale[0] = 1.3f; /* below ln 100: the scale has a gradient */
  fd_fill(&rng, g->x, (size_t)T * D, -1.5, 1.5);
  fd_fill(&rng, g->dy, (size_t)T * D, -1, 1);
  fd_fill(&rng, g->dspec, (size_t)T * k * D, -1, 1);
  uint64_t rw = c->seed ^ 0xD1CEull; /* its own stream: the draws above and below stay as they were */
  fd_fill(&rw, g->dw, (size_t)T * k, -1, 1);
  g->daux = 0.7f;
  g->dz = -0.45f;

  /* reference forward and the analytic gradients */
  moe_layer_stats st;
  moe_layer_zero_grad(l);
  s = moe_layer_forward(l, g->x, T, g->y, g->spec0, &st);
  if (s != MOE_OK) {
    fprintf(stderr, "  [%s] forward: %s\n", c->name, moe_last_error());
    return 0;
  }
  memcpy(g->counts0, st.expert_counts, sizeof g->counts0);
  if (cfg.act == MOE_ACT_SWIGLU_OAI && gc_clamps(g) < 10) {
    fprintf(stderr, "  [%s] only %d values clamp: the clamps are not exercised\n", c->name, gc_clamps(g));
    return 0;
  }
  g->dropped0 = st.dropped;
  if (c->want_drops && st.dropped == 0) {
    fprintf(stderr, "  [%s] no assignment was dropped: the drop path is not exercised\n", c->name);
    return 0;
  }
  if (c->dispatch == MOE_DISPATCH_DYNAMIC && st.dropped != 0) {
    fprintf(stderr, "  [%s] dynamic dispatch dropped %d assignments\n", c->name, st.dropped);
    return 0;
  }
  s = moe_layer_backward(l, g->dy, g->daux, g->dz, g->dspec, g->dw, g->dx);
  if (s != MOE_OK) {
    fprintf(stderr, "  [%s] backward: %s\n", c->name, moe_last_error());
    return 0;
  }
  double L0;
  if (!gc_loss(g, &L0, "the reference point")) return 0; /* the forward is deterministic */

  /* x, then every parameter tensor; of expert tensors only elements of experts with tokens */
  fd_check *f = &g->fd;
  if (!fd_tensor(f, "x", g->x, g->dx, (size_t)T * D, NULL, 0, &rng, L0)) return 0;
  for (int i = 0; i < l->nparams; i++) {
    const moe_param_info *pi = &l->info[i];
    if (!strcmp(pi->name, "gate.select_bias")) { /* chooses, is not differentiated: no gradient at all */
      for (size_t j = 0; j < pi->numel; j++)
        if (l->grads[pi->offset + j] != 0.0f) {
          fprintf(stderr, "  [%s] gate.select_bias[%zu] has gradient %g, want 0\n", c->name, j, l->grads[pi->offset + j]);
          return 0;
        }
      continue;
    }
    const int32_t *counts = strncmp(pi->name, "experts.", 8) ? NULL : g->counts0;
    if (!fd_tensor(f, pi->name, l->params + pi->offset, l->grads + pi->offset, pi->numel, counts, GC_E, &rng, L0))
      return 0;
  }
  const char *verbose = getenv("MOE_GRADCHECK_VERBOSE");
  if (verbose && verbose[0] && strcmp(verbose, "0"))
    printf("  [%s] dropped %d, worst |fd-an|/max(1,|an|) %.3g, worst err/tol %.3g at %s; "
           "max spec move %.3g\n", c->name, g->dropped0, f->worst_rel, f->worst_ratio, f->worst_at,
           g->max_jump);
  return 1;
}

static int gc_run_open(const gc_case *c, const gc_open *o) {
  gc_ctx g;
  memset(&g, 0, sizeof g);
  g.c = c;
  g.o = o;
  g.fd = (fd_check){.name = c->name, .loss = gc_loss, .ctx = &g, .eps = GC_EPS, .atol = GC_ATOL, .rtol = GC_RTOL,
                    .min_grad = GC_MIN_GRAD, .elems = GC_ELEMS};
  int ok = gc_run_checks(&g);
  free(g.x);
  free(g.y);
  free(g.dy);
  free(g.dx);
  free(g.spec);
  free(g.spec0);
  free(g.dspec);
  free(g.dw);
  fd_free(&g.fd);
  moe_layer_free(&g.l);
  return ok;
}

static int gc_run(const gc_case *c) { return gc_run_open(c, NULL); }

#define LIN MOE_ROUTER_LINEAR
#define COS MOE_ROUTER_COSINE
#define DYN MOE_DISPATCH_DYNAMIC
#define STA MOE_DISPATCH_STATIC
#define IDX MOE_PRIORITY_INDEX
#define SCO MOE_PRIORITY_SCORE

TEST(gradcheck_linear_gelu_dynamic) {
  static const gc_case c = {"linear gelu dynamic k=2", LIN, MOE_ACT_GELU, DYN, IDX, 2, 1.0f, -1, 1, 11, 0};
  ASSERT(gc_run(&c));
}

TEST(gradcheck_linear_silu_static_score_drops) {
  static const gc_case c = {"linear silu static cap 1.0 score", LIN, MOE_ACT_SILU, STA, SCO, 2, 1.0f, -1, 1,
                            12, 1};
  ASSERT(gc_run(&c));
}

TEST(gradcheck_linear_swiglu_dynamic_k3) {
  static const gc_case c = {"linear swiglu dynamic k=3", LIN, MOE_ACT_SWIGLU, DYN, IDX, 3, 1.0f, -1, 1, 13, 0};
  ASSERT(gc_run(&c));
}

TEST(gradcheck_cosine_gelu_dynamic) {
  static const gc_case c = {"cosine gelu dynamic k=2", COS, MOE_ACT_GELU, DYN, IDX, 2, 1.0f, -1, 1, 14, 0};
  ASSERT(gc_run(&c));
}

TEST(gradcheck_cosine_swiglu_static_adaptive) {
  static const gc_case c = {"cosine swiglu static cap -1.0", COS, MOE_ACT_SWIGLU, STA, IDX, 2, -1.0f, -1, 1,
                            15, 1};
  ASSERT(gc_run(&c));
}

TEST(gradcheck_linear_unnormalized_k2) {
  static const gc_case c = {"linear gelu dynamic k=2 normalize_topk=0", LIN, MOE_ACT_GELU, DYN, IDX, 2, 1.0f,
                            0, 1, 16, 0};
  ASSERT(gc_run(&c));
}

TEST(gradcheck_linear_k1) {
  static const gc_case c = {"linear silu dynamic k=1 (normalize auto: off)", LIN, MOE_ACT_SILU, DYN, IDX, 1,
                            1.0f, -1, 1, 17, 0};
  ASSERT(gc_run(&c));
}

TEST(gradcheck_linear_relu_dynamic) {
  static const gc_case c = {"linear relu dynamic k=2", LIN, MOE_ACT_RELU, DYN, IDX, 2, 1.0f, -1, 1, 18, 0};
  ASSERT(gc_run(&c));
}

TEST(gradcheck_no_biases) {
  static const gc_case c = {"linear gelu dynamic k=2 no biases", LIN, MOE_ACT_GELU, DYN, IDX, 2, 1.0f, -1, 0,
                            19, 0};
  ASSERT(gc_run(&c));
}

/* The routers and shared experts of open models (DESIGN 4.1b). */
TEST(gradcheck_shared_gated_swiglu_unnormalized) { /* Qwen2-MoE */
  static const gc_case c = {"qwen2-moe: swiglu k=2 unnormalized, gated shared expert", LIN, MOE_ACT_SWIGLU, DYN, IDX,
                            2, 1.0f, 0, 0, 31, 0};
  static const gc_open o = {MOE_SCORE_SOFTMAX, 0, 0, MOE_GROUP_MAX, 1.0f, 0, 5, 1, 0};
  ASSERT(gc_run_open(&c, &o));
}

TEST(gradcheck_sigmoid_groups_bias_scaled_shared) { /* DeepSeek-V3 */
  static const gc_case c = {"deepseek-v3: sigmoid, select bias, 2 groups top2_sum, scale 2.5, shared", LIN,
                            MOE_ACT_SWIGLU, DYN, IDX, 2, 1.0f, 1, 0, 32, 0};
  static const gc_open o = {MOE_SCORE_SIGMOID, 2, 1, MOE_GROUP_TOP2_SUM, 2.5f, 1, 7, 0, 0};
  ASSERT(gc_run_open(&c, &o));
}

TEST(gradcheck_softmax_groups_max_static_drops) { /* DeepSeek-V2 */
  static const gc_case c = {"deepseek-v2: softmax, 2 groups max, scale 1.5, static drops", LIN, MOE_ACT_GELU, STA,
                            SCO, 1, 1.0f, 0, 1, 33, 1};
  static const gc_open o = {MOE_SCORE_SOFTMAX, 2, 1, MOE_GROUP_MAX, 1.5f, 0, 0, 0, 0};
  ASSERT(gc_run_open(&c, &o));
}

TEST(gradcheck_sigmoid_unnormalized_gated_relu) {
  static const gc_case c = {"sigmoid k=2 unnormalized, gated shared relu", LIN, MOE_ACT_RELU, DYN, IDX, 2, 1.0f, 0, 1,
                            34, 0};
  static const gc_open o = {MOE_SCORE_SIGMOID, 0, 0, MOE_GROUP_MAX, 1.0f, 0, 6, 1, 0};
  ASSERT(gc_run_open(&c, &o));
}

TEST(gradcheck_swiglu_oai_biases_clamped) { /* gpt-oss: the clamped SwiGLU with its up bias, the router's bias */
  static const gc_case c = {"gpt-oss: swiglu_oai limit 0.5, fc1/fc3/fc2 biases, router bias, k=2 normalized", LIN,
                            MOE_ACT_SWIGLU_OAI, DYN, IDX, 2, 1.0f, 1, 1, 41, 0};
  static const gc_open o = {MOE_SCORE_SOFTMAX, 0, 0, MOE_GROUP_MAX, 1.0f, 0, 0, 0, 0.5f};
  ASSERT(gc_run_open(&c, &o));
}
