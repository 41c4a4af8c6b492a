/* The MoE layer: parameter table, configuration checks, and forward/backward as the stages of
 * plugins.h in order. The stages live in router.c, placement.c, micro.c, dispatch.c, the transport and
 * the expert source (given at init: src/wiring/layer_init.c chooses them); this file orders the stages
 * and owns the workspaces and the plug-ins' state. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "kernels/act.h"
#include "kernels/gemm.h"
#include "kernels/quant.h"
#include "layer/plugins.h"

/* The layer's private state: what a forward leaves for its backward, the plug-ins and their state, and
 * the two workspaces. No other file sees it: the stages and plug-ins get what they need by name. */
struct moe__layer_state {
  moe__arena route; /* router and plan: sized from T, k, E, P */
  moe__arena work;  /* dispatch and expert tensors: sized after routing (rows, capacity) */
  int have_fwd;     /* a forward ran and backward has not consumed it yet */
  int threads;      /* resolved thread count */
  const float *x;   /* (T, D) the forward's input, the caller's: the router's backward reads it */
  const moe__transport *tr;
  void *tr_self;
  const moe__expert_src *src;
  void *src_self;
  const moe__policy *pol;
  void *pol_self;
  moe__router r;
  moe__shared sh;   /* the shared experts' activations */
  moe__plan p;
  moe__ffn f;       /* the experts' activations: every micro-batch's, or one shared (memory reuse) */
  float *xs, *out;  /* (rows, D) dispatch rows: expert inputs and outputs */
  moe__expert_bufs xb; /* a moving transport's expert side */
  moe__dispatch dsp;   /* the dispatch's own tensors */
  moe_comm_stats comm; /* exchanges since the last reset */
  size_t params_phase; /* params: a moe__map_alloc buffer (file pages may be in it), at this phase */
};

#define LN_1_OVER_007 2.6592600369327779f /* Tutel's initial cosine logit scale, ln(1/0.07) */

void moe_layer_config_default(moe_layer_config *c) {
  memset(c, 0, sizeof *c);
  c->top_k = 2;
  c->capacity_setting = 1.0f;
  c->normalize_topk = -1;
  c->act = MOE_ACT_RELU;
  c->dispatch = MOE_DISPATCH_DYNAMIC;
  c->priority = MOE_PRIORITY_INDEX;
  c->router = MOE_ROUTER_LINEAR;
  c->proj_dim = 256;
  c->gate_bias = 1;
  c->expert_bias = 1;
  c->pipeline = 1;
  c->parallel_r = MOE_PARALLEL_OFF;
  c->routed_scale = 1.0f;
  c->swiglu_alpha = 1.702f;
  c->swiglu_limit = 7.0f;
  c->expert_type = -1;
}

int moe__layer_sharded(const moe_layer_config *c) { return c->dist && c->parallel_r != MOE_PARALLEL_OFF; }

static void add_param(moe_layer_t *l, const char *name, int ndim, int64_t a, int64_t b, int64_t c) {
  moe_param_info *p = &l->info[l->nparams++];
  p->name = name;
  p->ndim = ndim;
  p->shape[0] = a;
  p->shape[1] = b;
  p->shape[2] = c;
  p->numel = (size_t)a * (ndim > 1 ? (size_t)b : 1) * (ndim > 2 ? (size_t)c : 1);
  p->offset = l->numel;
  l->numel += (p->numel + 15) & ~(size_t)15; /* each tensor starts 64-byte aligned */
}

static moe_status check_pipeline(const moe_layer_config *c, int n, moe_reuse r) {
  MOE_TRY(n >= 0 && n <= MOE__MAX_MICRO, MOE_ERR_ARG,
          "config: pipeline (micro-batches) must be in [1, %d], or 0 (adaptive), got %d", MOE__MAX_MICRO, n);
  MOE_TRY((unsigned)r <= MOE_REUSE_AUTO, MOE_ERR_ARG, "config: unknown memory_reuse %d", r);
  MOE_TRY(r != MOE_REUSE_AUTO || c->memory_budget > 0, MOE_ERR_ARG,
          "config: memory_reuse auto needs a memory_budget (bytes of workspace), got 0");
  return MOE_OK;
}

/* The top-k's candidates: all experts, or those of the kept groups. */
static int candidates(const moe_layer_config *c) { return c->n_group > 0 ? c->topk_group * (c->E / c->n_group) : c->E; }

/* The score, selection and shared-expert options (DESIGN 4.1b). */
static moe_status check_routing(const moe_layer_config *c) {
  MOE_TRY((unsigned)c->score <= MOE_SCORE_SIGMOID, MOE_ERR_ARG, "config: unknown score %d", c->score);
  MOE_TRY(isfinite(c->routed_scale) && c->routed_scale > 0, MOE_ERR_ARG,
          "config: routed_scale must be finite and > 0, got %g", (double)c->routed_scale);
  MOE_TRY(c->select_bias == 0 || c->select_bias == 1, MOE_ERR_ARG, "config: select_bias must be 0 or 1, got %d",
          c->select_bias);
  MOE_TRY(c->shared_H >= 0, MOE_ERR_ARG, "config: shared_H must be >= 0, got %d", c->shared_H);
  MOE_TRY(c->shared_gate == 0 || (c->shared_gate == 1 && c->shared_H > 0), MOE_ERR_ARG,
          "config: shared_gate %d needs shared experts (shared_H > 0, got %d)", c->shared_gate, c->shared_H);
  MOE_TRY(c->seq_aux_alpha >= 0 && isfinite(c->seq_aux_alpha) && c->seq_len >= 0, MOE_ERR_ARG,
          "config: seq_aux_alpha must be finite and >= 0 and seq_len >= 0, got %g and %d", (double)c->seq_aux_alpha,
          c->seq_len);
  MOE_TRY(c->seq_aux_alpha == 0 || (!c->dist && !c->inner_experts && !c->external_experts), MOE_ERR_ARG,
          "config: seq_aux_alpha (the sequence-wise balance loss) is for one process's FFN experts");
  if (!c->n_group) return MOE_OK;
  MOE_TRY(c->n_group > 0 && c->n_group <= MOE__MAX_GROUPS && c->E % c->n_group == 0, MOE_ERR_ARG,
          "config: n_group must divide E=%d and be in [1, %d], got %d", c->E, MOE__MAX_GROUPS, c->n_group);
  MOE_TRY(c->topk_group >= 1 && c->topk_group <= c->n_group, MOE_ERR_ARG,
          "config: topk_group must be in [1, n_group=%d], got %d", c->n_group, c->topk_group);
  MOE_TRY((unsigned)c->group_score <= MOE_GROUP_TOP2_SUM, MOE_ERR_ARG, "config: unknown group_score %d",
          c->group_score);
  MOE_TRY(c->group_score != MOE_GROUP_TOP2_SUM || c->E / c->n_group >= 2, MOE_ERR_ARG,
          "config: group_score top2_sum needs groups of 2 or more experts (E=%d, n_group=%d)", c->E, c->n_group);
  MOE_TRY(c->top_k <= candidates(c), MOE_ERR_ARG, "config: top_k %d exceeds the %d experts of the topk_group=%d groups",
          c->top_k, candidates(c), c->topk_group);
  return MOE_OK;
}

moe_status moe__expert_type_check(const moe_layer_config *c, int type, int rows, const char *what) {
  const char *name = moe_gguf_type_name((moe_gguf_type)type);
  MOE_TRY(moe__qdot_has((moe_gguf_type)type), MOE_ERR_ARG,
          "%s: experts of type %s (%d) have no kernels here: want Q8_0, Q4_0, Q4_K, Q5_K, Q6_K or MXFP4 (F32 and BF16: dtype)",
          what, name ? name : "unknown", type);
  int b = moe_gguf_type_block((moe_gguf_type)type);
  MOE_TRY(!(rows & MOE__ROWS_D) || c->D % b == 0, MOE_ERR_ARG,
          "%s: %s gate and up projections (rows of D values) need D a multiple of its block of %d, got D=%d", what, name, b,
          c->D);
  MOE_TRY(!(rows & MOE__ROWS_H) || c->H % b == 0, MOE_ERR_ARG,
          "%s: %s down projections (rows of H values) need H a multiple of its block of %d, got H=%d", what, name, b, c->H);
  MOE_TRY(c->dtype == MOE_DT_F32, MOE_ERR_ARG, "%s: %s experts with dtype %s: the dtype is that of fp32 experts' GEMMs, keep it f32",
          what, name, moe_dtype_name(c->dtype));
  MOE_TRY(!c->dist, MOE_ERR_ARG, "%s: %s experts are not expert-parallel (dist) yet", what, name);
  MOE_TRY(!c->inner_experts, MOE_ERR_ARG, "%s: %s experts cannot be hierarchical (inner_experts)", what, name);
  MOE_TRY(c->pipeline == 1, MOE_ERR_ARG, "%s: %s experts run the batch at once: pipeline must be 1, got %d", what, name,
          c->pipeline);
  MOE_TRY((unsigned)c->act <= MOE_ACT_SWIGLU_OAI, MOE_ERR_ARG,
          "%s: %s experts apply relu, gelu, silu, swiglu or swiglu_oai, not activation %d", what, name, (int)c->act);
  return MOE_OK;
}

static moe_status check_config(const moe_layer_config *c) {
  MOE_TRY(c->D > 0, MOE_ERR_ARG, "config: D must be > 0, got %d", c->D);
  MOE_TRY(c->H > 0, MOE_ERR_ARG, "config: H must be > 0, got %d", c->H);
  MOE_TRY(c->E > 0, MOE_ERR_ARG, "config: E (experts) must be > 0, got %d", c->E);
  MOE_TRY(c->top_k >= 1 && c->top_k <= c->E, MOE_ERR_ARG, "config: top_k must be in [1, E=%d], got %d",
          c->E, c->top_k);
  MOE_TRY(isfinite(c->capacity_setting), MOE_ERR_ARG, "config: capacity_setting must be finite");
  MOE_TRY(c->normalize_topk >= -1 && c->normalize_topk <= 1, MOE_ERR_ARG,
          "config: normalize_topk must be -1 (auto), 0 or 1, got %d", c->normalize_topk);
  MOE_TRY((unsigned)c->act <= MOE_ACT_SWIGLU_OAI, MOE_ERR_ARG, "config: unknown activation %d", c->act);
  if (c->act == MOE_ACT_SWIGLU_OAI) { /* the shared FFN has no clamp; shards and replicas no fc3.bias */
    MOE_TRY(isfinite(c->swiglu_alpha) && c->swiglu_limit > 0 && isfinite(c->swiglu_limit), MOE_ERR_ARG,
            "config: swiglu_oai needs a finite swiglu_alpha and swiglu_limit > 0, got %g and %g",
            (double)c->swiglu_alpha, (double)c->swiglu_limit);
    MOE_TRY(!c->shared_H && !c->replica_slots && !moe__layer_sharded(c), MOE_ERR_ARG,
            "config: swiglu_oai does not support shared experts, replica_slots or parallel_r yet");
  }
  MOE_TRY((unsigned)c->dispatch <= MOE_DISPATCH_STATIC, MOE_ERR_ARG, "config: unknown dispatch %d",
          c->dispatch);
  MOE_TRY((unsigned)c->priority <= MOE_PRIORITY_SCORE, MOE_ERR_ARG, "config: unknown priority %d",
          c->priority);
  MOE_TRY((unsigned)c->router <= MOE_ROUTER_COSINE, MOE_ERR_ARG, "config: unknown router %d", c->router);
  MOE_TRY(c->router != MOE_ROUTER_COSINE || c->proj_dim > 0, MOE_ERR_ARG,
          "config: proj_dim must be > 0 for the cosine router, got %d", c->proj_dim);
  MOE_TRY(c->threads >= 0, MOE_ERR_ARG, "config: threads must be >= 0, got %d", c->threads);
  MOE_TRY(c->inner_experts >= 0, MOE_ERR_ARG, "config: inner_experts must be >= 0, got %d", c->inner_experts);
  if (c->dist) {
    int W = moe_dist_size(c->dist);
    MOE_TRY(W <= MOE__EP_MAX_RANKS, MOE_ERR_ARG, "expert parallelism supports up to %d ranks, got %d",
            MOE__EP_MAX_RANKS, W);
    MOE_TRY(c->E % W == 0 || moe__layer_sharded(c), MOE_ERR_ARG, "config: expert parallelism needs E divisible by the ranks (E=%d, W=%d)",
            c->E, W);
    MOE_TRY(c->inner_experts == 0, MOE_ERR_ARG, "config: expert parallelism does not support hierarchical MoE yet");
    MOE_TRY(!c->external_experts, MOE_ERR_ARG, "config: expert parallelism does not support expert buffering yet");
    MOE_TRY(c->replica_slots == 0 || ((int64_t)c->replica_slots * W >= c->E && c->dispatch == MOE_DISPATCH_DYNAMIC &&
                                      c->pipeline == 1),
            MOE_ERR_ARG, "config: replica_slots %d needs E_v >= E/W (E=%d, W=%d), dynamic dispatch and pipeline 1",
            c->replica_slots, c->E, W);
  }
  MOE_TRY(c->parallel_r >= MOE_PARALLEL_OFF, MOE_ERR_ARG,
          "config: parallel_r must be >= 0, -1 (auto) or %d (off), got %d", MOE_PARALLEL_OFF, c->parallel_r);
  MOE_TRY(!moe__layer_sharded(c) || c->dispatch == MOE_DISPATCH_DYNAMIC, MOE_ERR_ARG,
          "config: parallel_r %d needs dynamic dispatch", c->parallel_r);
  MOE_TRY(c->replica_slots >= 0, MOE_ERR_ARG, "config: replica_slots must be >= 0, got %d", c->replica_slots);
  MOE_TRY(!moe__layer_sharded(c) || !c->replica_slots, MOE_ERR_ARG,
          "config: parallel_r %d and replica_slots %d: sharded experts have no replicas", c->parallel_r,
          c->replica_slots);
  MOE_TRY(c->dtype == MOE_DT_F32 || c->dtype == MOE_DT_BF16, MOE_ERR_ARG,
          "config: the experts' dtype must be f32 or bf16, got %s", moe_dtype_name(c->dtype));
  MOE_TRY(!c->external_experts || (c->dispatch == MOE_DISPATCH_DYNAMIC && !c->inner_experts), MOE_ERR_ARG,
          "config: buffered experts need dispatch=dynamic and no hierarchical experts");
  MOE_TRY(c->expert_type >= -1, MOE_ERR_ARG, "config: expert_type must be -1 or a moe_gguf_type, got %d", c->expert_type);
  if (c->expert_type > 0) MOE_CHECK(moe__expert_type_check(c, c->expert_type, MOE__ROWS_D, "config")); /* fc1's type */
  MOE_CHECK(check_pipeline(c, c->pipeline, c->memory_reuse));
  MOE_CHECK(check_routing(c));
  MOE_TRY(c->inner_experts == 0 || (c->inner_top_k >= 1 && c->inner_top_k <= c->inner_experts), MOE_ERR_ARG,
          "config: inner_top_k must be in [1, inner_experts=%d], got %d", c->inner_experts, c->inner_top_k);
  return MOE_OK;
}

/* The plug-ins, each with its state. */
static moe_status plug_in(moe_layer_t *l, const moe__plugins *pl) {
  moe__layer_state *s = l->st;
  s->tr = pl->tr;
  s->src = pl->src;
  s->pol = pl->pol;
  if (s->tr->init) MOE_CHECK(s->tr->init(l, &s->tr_self));
  if (s->src && s->src->init) MOE_CHECK(s->src->init(l, s->tr_self, &s->src_self));
  return s->pol ? s->pol->init(l, &s->pol_self) : MOE_OK;
}

moe_status moe__layer_init(moe_layer_t *l, const moe_layer_config *cfg, const moe__plugins *pl) {
  MOE_TRY(l && cfg, MOE_ERR_ARG, "moe_layer_init: NULL argument");
  memset(l, 0, sizeof *l);
  MOE_CHECK(check_config(cfg));
  l->cfg = *cfg;
  int64_t D = cfg->D, H = cfg->H, E = cfg->E, P = cfg->proj_dim;
  if (cfg->router == MOE_ROUTER_LINEAR) {
    add_param(l, "gate.weight", 2, E, D, 0);
    if (cfg->gate_bias) add_param(l, "gate.bias", 1, E, 0, 0);
  } else {
    add_param(l, "gate.weight", 2, E, P, 0);
    add_param(l, "gate.proj.weight", 2, P, D, 0);
    add_param(l, "gate.proj.bias", 1, P, 0, 0);
    add_param(l, "gate.logit_scale", 1, 1, 0, 0);
  }
  if (cfg->select_bias) add_param(l, "gate.select_bias", 1, E, 0, 0);
  if (!cfg->inner_experts && !cfg->external_experts) {
    int flex = cfg->dist && cfg->replica_slots; /* E_v rows: the experts this rank holds, then zeros */
    int64_t El = flex ? cfg->replica_slots : E / moe_dist_size(cfg->dist), Dc = D; /* this rank's experts; fc2.bias's columns */
    if (moe__layer_sharded(cfg)) { /* every expert, this rank's rows of H (shard.h) */
      int W = moe_dist_size(cfg->dist), q = moe_dist_rank(cfg->dist);
      El = E;
      Dc = D * (q + 1) / W - D * q / W;
      H = H * (q + 1) / W - H * q / W;
    }
    int fp32 = cfg->expert_type <= 0; /* quantized experts: their weights are bound bytes, the biases stay */
    if (fp32) add_param(l, "experts.fc1.weight", 3, El, H, D);
    if (cfg->expert_bias) add_param(l, "experts.fc1.bias", 2, El, H, 0);
    if (fp32) add_param(l, "experts.fc2.weight", 3, El, D, H);
    if (cfg->expert_bias) add_param(l, "experts.fc2.bias", 2, El, Dc, 0);
    if (fp32 && moe__act_gated(cfg->act)) add_param(l, "experts.fc3.weight", 3, El, H, D);
    if (cfg->act == MOE_ACT_SWIGLU_OAI && cfg->expert_bias) add_param(l, "experts.fc3.bias", 2, El, H, 0);
  }
  if (cfg->shared_H) {
    add_param(l, "shared.fc1.weight", 2, cfg->shared_H, D, 0);
    if (cfg->act == MOE_ACT_SWIGLU) add_param(l, "shared.fc3.weight", 2, cfg->shared_H, D, 0);
    add_param(l, "shared.fc2.weight", 2, D, cfg->shared_H, 0);
    if (cfg->shared_gate) add_param(l, "shared.gate.weight", 2, 1, D, 0);
  }
  /* untouched zero pages: a load maps or writes the parameters, only training touches the gradients */
  l->params = moe__map_alloc(l->numel * 4, 0);
  l->grads = moe__map_alloc(l->numel * 4, 0);
  l->st = calloc(1, sizeof *l->st);
  l->inner = cfg->inner_experts ? calloc((size_t)E, sizeof *l->inner) : NULL;
  if (!l->params || !l->grads || !l->st || (cfg->inner_experts && !l->inner)) {
    size_t n = l->numel;
    moe_layer_free(l);
    MOE_TRY(0, MOE_ERR_NOMEM, "moe_layer_init: cannot allocate %zu parameters", n);
  }
  moe_status ps = plug_in(l, pl);
  if (ps != MOE_OK) {
    moe_layer_free(l);
    return ps;
  }
  moe_status sc = moe__gemm_small_scratch(moe__threads(cfg->threads)); /* the steps then allocate none */
  if (sc != MOE_OK) {
    moe_layer_free(l);
    return sc;
  }
  return MOE_OK;
}

moe_status moe_layer_set_cached_experts(moe_layer_t *l, const int32_t *experts, int T) {
  int k = l->cfg.top_k, E = l->cfg.E;
  for (int t = 0; experts && t < T; t++)
    for (int j = 0; j < k; j++) {
      int32_t e = experts[(size_t)t * k + j];
      MOE_TRY(e >= 0 && e < E, MOE_ERR_ARG, "cached expert %d of token %d is not in [0, %d)", e, t, E);
      for (int i = 0; i < j; i++)
        MOE_TRY(experts[(size_t)t * k + i] != e, MOE_ERR_ARG, "token %d has expert %d twice in its cached experts", t, e);
    }
  l->cached = experts;
  l->cached_T = T;
  return MOE_OK;
}

moe_status moe_layer_set_expert_capacity(moe_layer_t *l, const int32_t *cap, int tokens) {
  if (!cap) {
    free(l->expert_capacity);
    l->expert_capacity = NULL;
    l->expert_capacity_tokens = 0;
    return MOE_OK;
  }
  MOE_TRY(tokens >= 0, MOE_ERR_ARG, "per-expert capacities: tokens must be >= 0, got %d", tokens);
  MOE_TRY(l->cfg.dispatch == MOE_DISPATCH_STATIC, MOE_ERR_ARG, "per-expert capacities need static dispatch");
  int64_t sum = 0;
  for (int e = 0; e < l->cfg.E; e++) {
    MOE_TRY(cap[e] >= 0 && cap[e] <= (1 << 24), MOE_ERR_ARG, "capacity of expert %d is %d: want [0, 2^24]", e, cap[e]);
    sum += cap[e];
  }
  MOE_TRY(sum * l->cfg.D <= INT32_MAX / 2, MOE_ERR_ARG, "capacities summing to %lld rows are too many", (long long)sum);
  if (!l->expert_capacity) {
    l->expert_capacity = malloc(sizeof(int32_t) * (size_t)l->cfg.E);
    MOE_TRY(l->expert_capacity, MOE_ERR_NOMEM, "out of memory");
  }
  memcpy(l->expert_capacity, cap, sizeof(int32_t) * (size_t)l->cfg.E);
  l->expert_capacity_tokens = tokens;
  return MOE_OK;
}

void moe_layer_free(moe_layer_t *l) {
  if (!l) return;
  if (l->inner) {
    for (int e = 0; e < l->cfg.E; e++) moe_layer_free(&l->inner[e]);
    free(l->inner);
  }
  moe__layer_state *s = l->st;
  moe__map_free(l->params, l->numel * 4, s ? s->params_phase : 0);
  moe__map_free(l->grads, l->numel * 4, 0);
  if (s) {
    moe__arena_free(&s->route);
    moe__arena_free(&s->work);
    if (s->src && s->src->free) s->src->free(s->src_self);
    if (s->tr && s->tr->free) s->tr->free(s->tr_self);
    if (s->pol) s->pol->free(s->pol_self);
    free(s);
  }
  free(l->expert_capacity);
  memset(l, 0, sizeof *l);
}

moe_status moe__layer_params_at(moe_layer_t *l, size_t phase) {
  float *p = moe__map_alloc(l->numel * 4, phase);
  MOE_TRY(p, MOE_ERR_NOMEM, "moe_layer_init: cannot allocate %zu parameters", l->numel);
  moe__map_free(l->params, l->numel * 4, l->st->params_phase);
  l->params = p; /* zero, as moe_layer_init left the old ones */
  l->st->params_phase = phase;
  return MOE_OK;
}

const moe_param_info *moe_layer_param_find(const moe_layer_t *l, const char *name) {
  for (int i = 0; i < l->nparams; i++)
    if (!strcmp(l->info[i].name, name)) return &l->info[i];
  return NULL;
}

float *moe_layer_param(moe_layer_t *l, const char *name) {
  const moe_param_info *p = moe_layer_param_find(l, name);
  return p ? l->params + p->offset : NULL;
}

float *moe_layer_grad(moe_layer_t *l, const char *name) {
  const moe_param_info *p = moe_layer_param_find(l, name);
  return p ? l->grads + p->offset : NULL;
}

void moe__weights_bind(const moe_layer_t *l, float *base, moe__weights *w) {
  const struct { const char *name; float **slot; } map[] = {
      {"gate.weight", &w->gw},         {"gate.bias", &w->gb},
      {"gate.proj.weight", &w->pw},    {"gate.proj.bias", &w->pb},
      {"gate.logit_scale", &w->scale}, {"experts.fc1.weight", &w->w1},
      {"experts.fc1.bias", &w->b1},    {"experts.fc2.weight", &w->w2},
      {"experts.fc2.bias", &w->b2},    {"experts.fc3.weight", &w->w3},
      {"experts.fc3.bias", &w->b3},
      {"gate.select_bias", &w->sbias}, {"shared.fc1.weight", &w->sw1},
      {"shared.fc3.weight", &w->sw3},  {"shared.fc2.weight", &w->sw2},
      {"shared.gate.weight", &w->sg},
  };
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
    const moe_param_info *p = moe_layer_param_find(l, map[i].name);
    *map[i].slot = p ? base + p->offset : NULL;
  }
}

void moe_layer_params_changed(moe_layer_t *l) {
  if (l->st->src && l->st->src->params_changed) l->st->src->params_changed(l->st->src_self);
  for (int e = 0; l->inner && e < l->cfg.E; e++) moe_layer_params_changed(&l->inner[e]);
}

void moe_layer_zero_grad(moe_layer_t *l) {
  memset(l->grads, 0, l->numel * 4);
  for (int e = 0; l->inner && e < l->cfg.E; e++) moe_layer_zero_grad(&l->inner[e]);
}

moe_status moe_layer_set_pipeline(moe_layer_t *l, int n, moe_reuse r) {
  MOE_CHECK(check_pipeline(&l->cfg, n, r));
  MOE_TRY(l->cfg.expert_type <= 0 || n == 1, MOE_ERR_ARG, "moe_layer_set_pipeline: %s experts run the batch at once: n must be 1, got %d",
          moe_gguf_type_name((moe_gguf_type)l->cfg.expert_type), n);
  l->cfg.pipeline = n;
  l->cfg.memory_reuse = r;
  if (l->st->pol) l->st->pol->reconfigured(l->st->pol_self); /* AUTO decides again, for the new micro-batches */
  return MOE_OK;
}

moe_status moe_layer_set_top_k(moe_layer_t *l, int k) {
  MOE_TRY(k >= 1 && k <= candidates(&l->cfg), MOE_ERR_ARG, "top_k must be in [1, %d], got %d", candidates(&l->cfg), k);
  l->cfg.top_k = k;
  return MOE_OK;
}

moe_status moe_layer_reduce_grads(moe_layer_t *l) {
  if (!l->cfg.dist) return MOE_OK;
  for (int i = 0; i < l->nparams; i++)
    if (!strncmp(l->info[i].name, "gate.", 5) || !strncmp(l->info[i].name, "shared.", 7)) /* every rank's copy */
      MOE_CHECK(moe__dist_allreduce_f32(l->cfg.dist, l->grads + l->info[i].offset, (int)l->info[i].numel));
  return l->st->tr->reduce_grads ? l->st->tr->reduce_grads(l->st->tr_self, l) : MOE_OK;
}

void moe_layer_set_threads(moe_layer_t *l, int threads) {
  l->cfg.threads = threads > 0 ? threads : 0;
  for (int e = 0; l->inner && e < l->cfg.E; e++) moe_layer_set_threads(&l->inner[e], threads);
}

void moe_layer_init_params(moe_layer_t *l, uint64_t seed) {
  uint64_t st = seed;
  memset(l->params, 0, l->numel * 4);
  for (int i = 0; i < l->nparams; i++) {
    const moe_param_info *p = &l->info[i];
    float *d = l->params + p->offset;
    if (!strcmp(p->name, "gate.logit_scale")) {
      d[0] = LN_1_OVER_007;
      continue;
    }
    if (p->ndim == 1 || strstr(p->name, ".bias")) continue; /* biases start at zero */
    /* expert-parallel: draw the whole tensor and keep this rank's part (the transport's layout), so
     * that every W initializes the same model */
    const moe__transport *tr = l->st->tr;
    int split = tr->whole && !strncmp(p->name, "experts.", 8);
    int64_t w[3] = {p->shape[0], p->ndim > 1 ? p->shape[1] : 1, p->ndim > 2 ? p->shape[2] : 1};
    if (split) tr->whole(l->st->tr_self, l, p, w);
    float bound = 1.0f / sqrtf((float)w[p->ndim - 1]); /* fan_in is the last dim */
    size_t total = (size_t)(w[0] * w[1] * w[2]);
    for (size_t j = 0; j < total; j++) {
      float u = bound * moe__uniform(&st);
      long long at = split ? tr->local(l->st->tr_self, l, p, j) : (long long)j;
      if (at >= 0) d[at] = u;
    }
  }
  for (int e = 0; l->inner && e < l->cfg.E; e++) moe_layer_init_params(&l->inner[e], moe__splitmix(&st));
  moe_layer_params_changed(l);
}

size_t moe_layer_peak_bytes(const moe_layer_t *l) {
  size_t b = l->st->route.peak + l->st->work.peak;
  for (int e = 0; l->inner && e < l->cfg.E; e++) b += moe_layer_peak_bytes(&l->inner[e]);
  return b;
}

/* First non-finite entry of a (n, m), or -1. */
static long long first_nonfinite(const float *a, size_t n, int nt) {
  long long first = (long long)n;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(min : first) if (moe__par_worth(n))
  for (size_t i = 0; i < n; i++)
    if (!isfinite(a[i]) && (long long)i < first) first = (long long)i;
  return first < (long long)n ? first : -1;
}

/* Whether the router can run alongside the experts (DynaMoE 4.2): the experts come from the cache,
 * so only the combine needs the router, provided that nothing before the experts reads its scores
 * (placement in token order, not by score) and the source takes side work (the layer's own experts,
 * not inner layers nor an expert cache). Expert-parallel ranks may differ in this: their collectives
 * come in the same order either way. */
static int router_alongside(const moe_layer_t *l) {
  return l->cached && l->cfg.priority == MOE_PRIORITY_INDEX && l->st->src->alongside;
}

/* The buffer the experts read or write for dispatch rows `rows`: the rows themselves when the
 * transport moves nothing, else its own. */
static float *expert_side(const moe_layer_t *l, float *rows, float *own) { return l->st->tr->in_place ? rows : own; }

/* Where micro-batch i starts in the experts' buffers: at its first row, or at row 0 of buffers that
 * hold one micro-batch (plan.slotted), in floats. */
static size_t micro_at(const moe_layer_t *l, int i) {
  return l->st->p.slotted ? 0 : (size_t)l->st->p.mb[i].lo * l->cfg.D;
}

/* MPipeMoE Table II on a CPU (offloading to host memory keeps a tensor): the strategies that recompute
 * T_M, and those that receive T_DI again (moving transports only: in process T_DI is the dispatch rows). */
static int recomputes(moe_reuse r) { return r == MOE_REUSE_S3 || r == MOE_REUSE_S4; }
static int recommunicates(moe_reuse r) { return r == MOE_REUSE_S2 || r == MOE_REUSE_S4; }

/* Micro-batch i's groups, in and out of the experts' buffers x and y. */
static moe__groups micro_groups(const moe_layer_t *l, int i, const float *x, float *y) {
  const moe__plan *p = &l->st->p;
  const moe__micro *m = &p->mb[i];
  size_t r = micro_at(l, i);
  const int32_t *kept = p->n == 1 && l->st->tr->in_place ? p->kept : NULL; /* static padding, in process */
  return (moe__groups){p->ng, m->rows, m->e0, m->e1, m->goffs, kept, x + r, y + r};
}

moe__ffn moe__ffn_at(const moe_layer_t *l, const moe__ffn *f, int r) {
  size_t H = (size_t)l->cfg.H * r, D = (size_t)l->cfg.D * r;
  moe__ffn v = *f;
  v.a1 = f->a1 ? f->a1 + H : NULL;
  v.a3 = f->a3 ? f->a3 + H : NULL;
  v.h = f->h ? f->h + H : NULL;
  v.xb = f->xb ? f->xb + D : NULL;
  v.hb = f->hb ? f->hb + H : NULL;
  v.db = f->db ? f->db + D : NULL;
  v.d3b = f->d3b ? f->d3b + H : NULL;
  return v;
}

/* Micro-batch i's activations: its own rows of them, or the one shared buffer under memory reuse (as the
 * forward chose: the setting may change before backward). */
static moe__ffn micro_ffn(const moe_layer_t *l, int i) {
  return moe__ffn_at(l, &l->st->f, l->st->p.shared ? 0 : l->st->p.mb[i].lo);
}

/* What the plug-ins are handed at each call, in place of the layer. */
static moe__env env_of(moe_layer_t *l) {
  moe__layer_state *s = l->st;
  return (moe__env){l, s->threads, &s->route, &s->work, &s->comm, -1};
}

/* The experts' stage's end: every exchange the transport started has landed (also after a failure,
 * so that none writes into buffers after the call returns); st, or the transport's failure. */
static moe_status finish(moe_layer_t *l, const moe__env *env, moe_status st) {
  moe__layer_state *s = l->st;
  moe_status done = s->tr->finish ? s->tr->finish(s->tr_self, env, &s->p) : MOE_OK;
  return st ? st : done;
}

/* A forward's arguments and inputs, checked before any exchange (see agree). */
static moe_status check_forward(const moe_layer_t *l, const float *x, int T, const float *y) {
  int D = l->cfg.D, k = l->cfg.top_k;
  MOE_TRY(T >= 0, MOE_ERR_ARG, "moe_layer_forward: T must be >= 0, got %d", T);
  MOE_TRY(T == 0 || (x && y), MOE_ERR_ARG, "moe_layer_forward: x and y must not be NULL");
  MOE_TRY(l->st->src, MOE_ERR_STATE, "moe_layer_forward: the layer's experts need an expert cache");
  MOE_TRY(!l->cached || l->cached_T == T, MOE_ERR_ARG, "moe_layer_forward: cached experts for %d tokens, got %d",
          l->cached_T, T);
  MOE_TRY((int64_t)T * k <= INT32_MAX / 2 && (int64_t)T * D <= INT32_MAX, MOE_ERR_ARG,
          "moe_layer_forward: T=%d is too large for k=%d, D=%d", T, k, D);
  long long bad = first_nonfinite(x, (size_t)T * D, l->st->threads);
  MOE_TRY(bad < 0, MOE_ERR_VALUE, "x[%lld, %lld] is %g: inputs must be finite", bad / D, bad % D,
          bad < 0 ? 0.0 : (double)x[bad]);
  return MOE_OK;
}

/* This process's checks, agreed with the other ranks before any exchange: a rank that failed one and
 * returned would leave the others waiting in the exchange, so all fail together. */
static moe_status agree(moe_layer_t *l, moe_status mine) {
  moe__env env = env_of(l);
  return l->st->tr->agree ? l->st->tr->agree(l->st->tr_self, &env, mine) : mine;
}

/* The expert workspace a forward of this plan reserves under strategy r: the dispatch, the source's
 * activations (one micro-batch's when they are recomputed), out and dout, dy = 0, the transport's. */
static size_t work_bytes(moe_layer_t *l, int T, moe_reuse r) {
  moe__layer_state *s = l->st;
  moe__plan *p = &s->p;
  moe__env env = env_of(l);
  int shared = p->shared, slotted = p->slotted;
  p->shared = recomputes(r);
  p->slotted = p->n > 1 && !s->tr->in_place && recommunicates(r);
  size_t rows_d = moe__arena_size((size_t)p->rows * l->cfg.D * 4);
  size_t w = moe__dispatch_bytes(p, l->cfg.D, l->cfg.dispatch) +
             s->src->bytes(s->src_self, &env, p->ng, p->shared ? p->mb_rows : p->grows) + 2 * rows_d +
             moe__arena_size((size_t)T * l->cfg.D * 4) + s->tr->work_bytes(s->tr_self, &env, p); /* out, dout, dy=0 */
  p->shared = shared, p->slotted = slotted;
  return w;
}

/* memory_reuse AUTO: the policy's choice from the workspace each strategy would reserve (S4 without one). */
static moe_status auto_reuse(moe_layer_t *l, int T, size_t route, moe_reuse *out) {
  moe__layer_state *s = l->st;
  static const moe_reuse order[4] = {MOE_REUSE_NONE, MOE_REUSE_S2, MOE_REUSE_S3, MOE_REUSE_S4};
  *out = MOE_REUSE_S4;
  if (!s->pol) return MOE_OK;
  size_t bytes[4];
  for (int i = 0; i < 4; i++) bytes[i] = route + work_bytes(l, T, order[i]);
  return s->pol->reuse(s->pol_self, l, &s->p, bytes, out);
}

/* Counts this process's assignments per expert, asks the transport for the tokens placement runs over
 * (its view), and places them. */
static moe_status place(moe_layer_t *l) {
  moe__layer_state *s = l->st;
  moe__plan *p = &s->p;
  memset(p->counts, 0, (size_t)l->cfg.E * 4);
  for (size_t i = 0; i < (size_t)p->T * p->k; i++) p->counts[p->top_e[i]]++;
  moe__view v = {p->T, 0, p->top_e, s->r.top_p, p->k, p->counts, s->r.order};
  moe__env env = env_of(l);
  MOE_CHECK(s->tr->view(s->tr_self, &env, p, &v));
  p->stat_counts = v.counts;
  return moe__place(&l->cfg, l->expert_capacity, l->expert_capacity_tokens, &v, s->r.fill, &s->route, p);
}

moe_status moe_layer_forward(moe_layer_t *l, const float *x, int T, float *y, float *spec,
                             moe_layer_stats *stats) {
  MOE_TRY(l && l->st, MOE_ERR_STATE, "moe_layer_forward: layer not initialized");
  moe__layer_state *s = l->st;
  const moe__transport *tr = s->tr;
  moe__plan *p = &s->p;
  int D = l->cfg.D, k = l->cfg.top_k, n = l->cfg.pipeline; /* 0: adaptive, chosen after routing */
  if (!n && !s->pol) n = 1;
  double t0 = moe__now();
  s->have_fwd = 0;
  s->threads = moe__threads(l->cfg.threads);
  MOE_CHECK(agree(l, check_forward(l, x, T, y)));
  if (s->pol) MOE_CHECK(s->pol->begin(s->pol_self, l)); /* Tutel's dictionary (parallel_r, pipeline or a2a adaptive) */
  size_t route = 0;
  moe__env env = env_of(l);
  MOE_CHECK(tr->begin(s->tr_self, &env, T, &route));
  route += moe__router_bytes(&l->cfg, T, k) + moe__micro_bytes(n ? n : s->pol->max_micro, l->cfg.E) +
           moe__shared_bytes(&l->cfg, T);
  MOE_CHECK(moe__arena_reserve(&s->route, route, "router"));
  int along = router_alongside(l);
  double tg = moe__now(); /* the router's seconds, for stats */
  moe__weights w;
  moe__weights_bind(l, l->params, &w);
  MOE_CHECK(moe__router_begin(&l->cfg, &w, T, k, l->cached, &s->route, &s->r, p));
  l->cached = NULL; /* one forward */
  s->x = x;
  moe__router_job job = {&l->cfg, &w, x, &s->r, p};
  moe__side_work router = moe__router_work(&job);
  if (!along) MOE_CHECK(moe__router_run(&job, s->threads)); /* the router first */
  double gate_s = moe__now() - tg;
  MOE_CHECK(place(l));
  if (s->pol) MOE_CHECK(s->pol->pick(s->pol_self, l, p, &n, &env.setup_r)); /* at this capacity: r, n and the all-to-all */
  MOE_CHECK(tr->groups(s->tr_self, &env, p)); /* now the rows this process's experts get are known */
  MOE_CHECK(moe__split_rows(&l->cfg, n, &s->route, p));
  moe_reuse reuse = l->cfg.memory_reuse;
  if (reuse == MOE_REUSE_AUTO) MOE_CHECK(auto_reuse(l, T, route, &reuse));
  p->shared = recomputes(reuse);
  p->slotted = n > 1 && !tr->in_place && recommunicates(reuse);
  int act_rows = p->shared ? p->mb_rows : p->grows; /* one micro-batch's, or all */
  MOE_CHECK(moe__arena_reserve(&s->work, work_bytes(l, T, reuse), "expert"));
  s->dsp = (moe__dispatch){l->cfg.dispatch, D, s->threads, NULL, NULL};
  MOE_CHECK(moe__dispatch_alloc(p, &s->dsp, &s->work, &s->xs));
  moe__dispatch_forward(p, &s->dsp, x, s->xs);
  s->out = moe__arena_alloc(&s->work, (size_t)p->rows * D * 4);
  MOE_TRY(s->out || p->rows == 0, MOE_ERR_STATE, "internal: expert workspace too small");
  MOE_CHECK(tr->alloc(s->tr_self, &env, p, &s->xb));
  MOE_CHECK(s->src->alloc(s->src_self, &env, p->ng, act_rows, &s->f));
  float *gx = expert_side(l, s->xs, s->xb.gx), *gout = expert_side(l, s->out, s->xb.gout);
  moe_status st = MOE_OK;
  moe_comm_stats comm0 = s->comm;
  double expert_s = 0, per_row = (double)D * l->cfg.H * (moe__act_gated(l->cfg.act) ? 3 : 2);
  for (int i = 0; i < p->n && !st; i++) { /* each micro-batch: its token exchange, its experts, its way back */
    moe__groups g = micro_groups(l, i, gx, gout);
    moe__ffn f = micro_ffn(l, i);
    st = tr->send(s->tr_self, &env, p, 0, i, s->xs, gx + micro_at(l, i));
    double te = moe__now();
    if (!st) st = s->src->forward(s->src_self, &env, p, &g, &f, along && i == 0 ? &router : NULL);
    expert_s += moe__now() - te;
    if (!st) st = tr->recv(s->tr_self, &env, p, i, gout + micro_at(l, i), s->out);
  }
  MOE_CHECK(finish(l, &env, st));
  if (s->pol && l->cfg.memory_reuse == MOE_REUSE_AUTO)
    s->pol->measure(s->pol_self, l, per_row * p->grows, expert_s, (s->comm.bytes - comm0.bytes) / 4,
                    s->comm.seconds - comm0.seconds);
  tg = moe__now();
  MOE_CHECK(moe__router_end(&l->cfg, &s->r, p)); /* the losses (a collective when expert-parallel), after either order */
  gate_s += moe__now() - tg;
  moe__combine_forward(p, &s->dsp, s->out, y, spec);
  if (l->cfg.shared_H) MOE_CHECK(moe__shared_forward(&l->cfg, &w, x, T, &s->route, s->threads, &s->sh, y));
  s->have_fwd = 1;
  if (stats) {
    float aux = s->r.aux, z = s->r.z;
    if (s->src->losses) s->src->losses(s->src_self, &aux, &z);
    stats->aux_loss = aux;
    stats->z_loss = z;
    stats->seq_aux_loss = s->r.seq_aux;
    stats->capacity = p->C;
    stats->dropped = p->dropped;
    stats->expert_counts = p->stat_counts;
    stats->experts = p->top_e;
    stats->fresh = s->r.fresh;
    stats->weights = p->top_w;
    stats->router_overlapped = along;
    stats->pipeline = p->n;
    stats->pipeline_trial = s->pol && s->pol->trial(s->pol_self);
    stats->memory_reuse = reuse;
    stats->router_seconds = gate_s;
  }
  if (s->pol) s->pol->time(s->pol_self, t0);
  return MOE_OK;
}

/* A backward's preconditions, checked before any exchange (see agree). */
static moe_status check_backward(const moe_layer_t *l, const float *dx) {
  const moe__layer_state *s = l->st;
  MOE_TRY(l->cfg.expert_type <= 0, MOE_ERR_ARG, "moe_layer_backward: the layer's %s experts are for inference only",
          moe_gguf_type_name((moe_gguf_type)l->cfg.expert_type));
  MOE_TRY(s->src && s->src->backward, MOE_ERR_STATE,
          "moe_layer_backward: a layer with buffered experts is for inference only");
  MOE_TRY(s->have_fwd, MOE_ERR_STATE, "moe_layer_backward: no forward pass to differentiate");
  MOE_TRY(s->p.T == 0 || dx, MOE_ERR_ARG, "moe_layer_backward: dx must not be NULL");
  return MOE_OK;
}

moe_status moe_layer_backward(moe_layer_t *l, const float *dy, float daux, float dz,
                              const float *dspec, const float *dweights, float *dx) {
  MOE_TRY(l && l->st, MOE_ERR_STATE, "moe_layer_backward: layer not initialized");
  moe__layer_state *s = l->st;
  MOE_CHECK(agree(l, check_backward(l, dx)));
  if (s->pol) MOE_CHECK(s->pol->backward(s->pol_self, l));
  moe__env env = env_of(l);
  const moe__plan *p = &s->p;
  int T = p->T, D = l->cfg.D;
  s->have_fwd = 0; /* backward overwrites the forward's buffers: one backward per forward */
  double t0 = moe__now();
  float *dw = moe__arena_alloc(&s->route, (size_t)T * p->k * 4);
  float *dout = moe__arena_alloc(&s->work, (size_t)p->rows * D * 4);
  float *dxs = s->out; /* the expert outputs are dead once the combine's backward has read them */
  MOE_TRY((dw && dout) || T == 0, MOE_ERR_STATE, "internal: backward workspace too small");
  if (!dy) { /* a loss on spec alone: y does not matter */
    float *z = moe__arena_alloc(&s->work, (size_t)T * D * 4);
    MOE_TRY(z || T == 0, MOE_ERR_STATE, "internal: backward workspace too small");
    if (T) memset(z, 0, (size_t)T * D * 4);
    dy = z;
  }
  MOE_CHECK(moe__combine_backward(p, &s->dsp, &s->work, s->out, dy, dspec, dout, dw));
  if (dweights)
    for (size_t i = 0; i < (size_t)T * p->k; i++) dw[i] += dweights[i];
  /* the experts' side of dout and dxs: the forward's outputs are dead by now */
  float *gx = expert_side(l, s->xs, s->xb.gx), *gd = expert_side(l, dout, s->xb.gout);
  float *gdx = expert_side(l, dxs, s->xb.gdx);
  int recompute = p->shared && p->n > 1; /* the shared buffer holds the last one */
  moe_status st = MOE_OK;
  for (int i = 0; i < p->n && !st; i++) {
    moe__groups g = micro_groups(l, i, gx, gdx); /* y: where a recompute may write, dead until dx */
    moe__ffn f = micro_ffn(l, i);
    size_t r = micro_at(l, i);
    st = s->tr->send(s->tr_self, &env, p, 0, i, dout, gd + r);
    if (!st && p->slotted) st = s->tr->send(s->tr_self, &env, p, 1, i, s->xs, gx + r); /* T_DI again (MPipeMoE S2, S4) */
    if (!st && recompute) st = s->src->forward(s->src_self, &env, p, &g, &f, NULL); /* T_M again (MPipeMoE S3, S4) */
    if (!st) st = s->src->backward(s->src_self, &env, p, &g, &f, gd + r, daux, dz, gdx + r);
    if (!st) st = s->tr->recv(s->tr_self, &env, p, i, gdx + r, dxs);
  }
  MOE_CHECK(finish(l, &env, st));
  moe__dispatch_backward(p, &s->dsp, dxs, dx);
  moe__weights w, gw;
  moe__weights_bind(l, l->params, &w);
  moe__weights_bind(l, l->grads, &gw);
  if (l->cfg.shared_H) MOE_CHECK(moe__shared_backward(&l->cfg, &w, &gw, s->x, T, &s->sh, dy, &s->route, s->threads, dx));
  MOE_CHECK(moe__router_backward(&l->cfg, &w, &gw, s->x, &s->r, p, dw, daux, dz, &s->route, s->threads, dx));
  if (s->pol) s->pol->time(s->pol_self, t0);
  return MOE_OK;
}

moe_status moe_layer_balance_bias(moe_layer_t *l, float gamma) {
  MOE_TRY(l && l->st && l->cfg.select_bias, MOE_ERR_STATE, "moe_layer_balance_bias: the layer has no select_bias");
  MOE_TRY(isfinite(gamma) && gamma >= 0, MOE_ERR_ARG, "moe_layer_balance_bias: gamma must be finite and >= 0, got %g",
          (double)gamma);
  const moe__plan *p = &l->st->p;
  MOE_TRY(p->counts && p->k > 0, MOE_ERR_STATE, "moe_layer_balance_bias: no forward to count assignments from");
  int E = l->cfg.E;
  double *c = malloc((size_t)E * sizeof *c), total = 0;
  MOE_TRY(c, MOE_ERR_NOMEM, "moe_layer_balance_bias: out of memory");
  for (int e = 0; e < E; e++) c[e] = p->counts[e];
  moe_status st = l->cfg.dist ? moe_dist_allreduce(l->cfg.dist, c, E) : MOE_OK;
  for (int e = 0; e < E; e++) total += c[e];
  float *b = moe_layer_param(l, "gate.select_bias");
  for (int e = 0; e < E && !st; e++) /* against the mean, compared exactly: count E versus the total */
    b[e] += c[e] * E > total ? -gamma : c[e] * E < total ? gamma : 0.0f;
  free(c);
  return st;
}

void moe_layer_comm_stats(const moe_layer_t *l, moe_comm_stats *out) { *out = l->st->comm; }
void moe_layer_comm_reset(moe_layer_t *l) { memset(&l->st->comm, 0, sizeof l->st->comm); }

void *moe__layer_transport(const moe_layer_t *l, const moe__transport *t) {
  return l->st && l->st->tr == t ? l->st->tr_self : NULL;
}

void *moe__layer_source(const moe_layer_t *l, const moe__expert_src *src) {
  return l->st && l->st->src == src ? l->st->src_self : NULL;
}

void *moe__layer_policy(const moe_layer_t *l) { return l->st ? l->st->pol_self : NULL; }

moe__layer_peek moe__layer_inspect(const moe_layer_t *l) {
  const moe__layer_state *s = l->st;
  return (moe__layer_peek){&s->p, &s->f, s->route.cap, s->work.cap};
}

moe_status moe__layer_replace_source(moe_layer_t *l, const moe__expert_src *src, void **self) {
  moe__layer_state *s = l->st;
  if (s->src != src) {
    void *fresh = NULL;
    if (src->init) MOE_CHECK(src->init(l, s->tr_self, &fresh));
    if (s->src && s->src->free) s->src->free(s->src_self);
    s->src = src, s->src_self = fresh;
    s->have_fwd = 0; /* the old source's activations are gone */
  }
  *self = s->src_self;
  return MOE_OK;
}

void moe__layer_set_source(moe_layer_t *l, const moe__expert_src *src, void *self) {
  l->st->src = src;
  l->st->src_self = self;
}
