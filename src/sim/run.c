/* moe_sim_run: the simulated step under the config's options, and the choice each of the runtime's
 * adaptive policies makes, each called with costs from simulated trial steps (DESIGN 4.6). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flex/flex.h"
#include "sim/sim.h"

typedef struct {
  const moe_sim_config *c;
  const int64_t *send;
  moe__a2a a;
  double tail;
  /* The dictionary's trials over r: the config and routed counts they place, room for their traffic;
   * NULL (FlexMoE's placement): r stays 1 and the trials run c's traffic. */
  const moe_sim_config *base;
  const int64_t *per_expert;
  int64_t *scratch;
} trial_ctx;

/* Algorithm 1's trial: the simulated step in n micro-batches. */
static moe_status gran_cost(void *user, size_t B, int n, double *seconds) {
  (void)B; /* the key; the traffic is the context's */
  trial_ctx *t = user;
  moe__sim_times st;
  MOE_CHECK(moe__sim_step(t->c, t->send, n, t->a, t->tail, &st));
  *seconds = st.step;
  return MOE_OK;
}

/* Tutel's dictionary's trial: the simulated step at parallelism r, degree d, all-to-all a. */
static moe_status setup_cost(void *user, size_t capacity, const moe__setup *s, double *seconds) {
  (void)capacity;
  trial_ctx *t = user;
  moe_sim_config dev = *t->c;
  double gather = t->tail;
  if (t->base) MOE_CHECK(moe__sim_parallel(t->base, t->per_expert, s->r, t->scratch, &dev, &gather));
  moe__sim_times st;
  MOE_CHECK(moe__sim_step(&dev, t->base ? t->scratch : t->send, s->d, s->a, gather, &st));
  *seconds = st.step;
  return MOE_OK;
}

static size_t max_recv(int W, const int64_t *send) {
  size_t m = 0;
  for (int h = 0; h < W; h++) {
    size_t r = 0;
    for (int g = 0; g < W; g++) r += (size_t)send[(size_t)g * W + h];
    if (r > m) m = r;
  }
  return m;
}

/* The step, the memory and the pipelining and reuse choices for one placement's traffic: c the config
 * as each device computes (moe__sim_parallel's), base the config itself, or NULL under FlexMoE. */
static moe_status simulate(const moe_sim_config *base, const moe_sim_config *c, const int64_t *send,
                           const int64_t *per_expert, double tail, moe_sim_result *r) {
  int W = moe__sim_devices(c);
  trial_ctx ctx = {c, send, c->a2a, tail, base, per_expert, NULL};
  size_t B = max_recv(W, send);
  r->n = c->pipeline, r->auto_n = c->pipeline == 0;
  if (r->auto_n) {
    moe__gran g;
    MOE_CHECK(moe__gran_init(&g, NULL, 0, gran_cost, &ctx));
    moe_status st = moe__gran_get(&g, B, &r->n);
    moe__gran_free(&g);
    MOE_CHECK(st);
  }
  moe__sim_times t, t1;
  MOE_CHECK(moe__sim_step(c, send, r->n, c->a2a, tail, &t));
  MOE_CHECK(moe__sim_step(c, send, 1, c->a2a, 0, &t1));
  r->step_s = t.step, r->comm_s = t.comm, r->compute_s = t.comp_max, r->compute_min_s = t.comp_min;
  r->slowest = t.slowest, r->exposed_comm_s = t.step - t.comp_max;
  MOE_CHECK(moe__sim_memory(c, send, r->n, c->local, &r->peak_bytes));
  r->fits = c->mem_bytes <= 0 || r->peak_bytes <= c->mem_bytes;
  moe__mem_shape sh = {(double)B, c->D, c->H, c->E, c->local};
  r->eq6_phi = c->reuse == MOE__REUSE_NONE ? 0 : moe__mem_phi(&sh, r->n, moe__bufs_text);
  /* Eq. 10 among the strategies that save memory, at the simulator's own rates: the all-to-all's
   * elements per second on the busiest device (one device exchanges nothing: a rate Eq. 10 sees as
   * free, it wants a finite one), the GEMM's multiply-adds, the host link's elements. */
  moe__speeds w = {c->gemm_flops / 2, t1.a2a1 > 0 ? (double)B * c->D / t1.a2a1 : 1e300,
                   c->host_bw > 0 ? c->host_bw / c->elem : 0};
  unsigned allowed = MOE__REUSE_BIT(MOE__REUSE_S4) | (c->host_bw > 0 ? MOE__REUSE_BIT(MOE__REUSE_S2) |
                                                                           MOE__REUSE_BIT(MOE__REUSE_S3) : 0);
  moe__interference f = moe__interference_default();
  moe__reuse pick;
  MOE_CHECK(moe__reuse_select(allowed, (double)moe__pipe_part(B, r->n, 0), c->D, c->H, &w, &f, &pick, NULL));
  r->eq10_reuse = moe__reuse_names[pick];
  /* Tutel's dictionary at this capacity (the most tokens a device routes to one expert). */
  int64_t cap = 0;
  for (int e = 0; e < c->E; e++) cap = per_expert[e] > cap ? per_expert[e] : cap;
  moe__setup_dict d;
  moe__setup s;
  ctx.scratch = base ? malloc(sizeof *ctx.scratch * (size_t)W * W) : NULL;
  MOE_TRY(!base || ctx.scratch, MOE_ERR_NOMEM, "simulator: the dictionary's traffic of %d devices", W);
  moe_status st = moe__setup_dict_init(&d, W, c->E, base != NULL, 0, setup_cost, &ctx);
  d.margin = 0; /* modelled costs have no noise to guard against: the exact argmin */
  if (st == MOE_OK) st = moe__setup_dict_get(&d, (size_t)cap, &s);
  moe__setup_dict_free(&d);
  free(ctx.scratch);
  MOE_CHECK(st);
  r->tutel_r = s.r, r->tutel_d = s.d, r->tutel_a2a = s.a == MOE__A2A_2DH ? "2dh" : "linear";
  return MOE_OK;
}

/* FlexMoE's environment from the config: Eq. 7's compute, Eq. 8's links, Eq. 9's all-reduce. */
static moe__flex_env flex_env(const moe_sim_config *c) {
  moe__flex_link intra = {c->intra_lat, c->intra_bw}, inter = {c->inter_lat, c->inter_bw};
  return (moe__flex_env){.compute = {0, c->gemm_flops / (12.0 * c->D * c->H)},
                         .a2a_intra = intra,
                         .a2a_inter = c->nodes > 1 ? inter : intra,
                         .ranks_per_node = c->dpn,
                         .allreduce = c->nodes > 1 ? inter : intra,
                         .token_bytes = (double)c->D * c->elem,
                         .grad_bytes = 2.0 * c->D * c->H * c->elem};
}

/* FlexMoE's policy maker on the routed counts, then the step with its replicas and their all-reduces. */
static moe_status run_flex(const moe_sim_config *c, const int64_t *per_expert, moe_sim_result *r) {
  int W = moe__sim_devices(c), E = c->E, Ev = E / W + 1; /* one spare slot per device for replicas */
  MOE_TRY(W <= MOE__FLEX_MAX_RANKS, MOE_ERR_ARG, "simulator: \"flex\" with %d devices: FlexMoE's tables hold at "
          "most %d", W, MOE__FLEX_MAX_RANKS);
  MOE_TRY(E % W == 0 && c->r == 1, MOE_ERR_ARG, "simulator: \"flex\" places whole experts: %d experts on %d "
          "devices with r %d, want a multiple of the devices and r 1", E, W, c->r);
  moe__flex_env env = flex_env(c);
  moe__flex_policy pol = moe__flex_policy_default();
  moe__flex_table t = {0};
  moe__flex_plan plan = {0};
  moe__flex_group *groups = malloc(sizeof *groups * (size_t)E);
  int64_t *Isrc = malloc(sizeof *Isrc * (size_t)W * E), *rt = malloc(sizeof *rt * (size_t)W * E * W);
  int64_t *send = calloc((size_t)W * W, sizeof *send);
  moe_status st = groups && Isrc && rt && send ? MOE_OK
                  : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "simulator: FlexMoE's tables for %d devices", W);
  if (st == MOE_OK) st = moe__flex_table_init(&t, W, Ev, E, 6 * (size_t)c->D * c->H * c->elem);
  for (int g = 0; st == MOE_OK && g < W; g++) memcpy(Isrc + (size_t)g * E, per_expert, sizeof *Isrc * (size_t)E);
  if (st == MOE_OK) st = moe__flex_schedule(&t, Isrc, &env, &pol, &plan);
  if (st == MOE_OK) st = moe__flex_route(&t, Isrc, rt);
  int ng = 0;
  if (st == MOE_OK) st = moe__flex_sync_groups(&t, -1, groups, &ng);
  if (st == MOE_OK) {
    for (int g = 0; g < W; g++)
      for (int e = 0; e < E; e++)
        for (int h = 0; h < W; h++) send[(size_t)g * W + h] += rt[((size_t)g * E + e) * W + h];
    double tail = 0;
    for (int i = 0; i < ng; i++)
      tail += moe__flex_link_time(env.allreduce, 2.0 * (groups[i].n - 1) / groups[i].n * env.grad_bytes);
    r->flex = 1, r->balance_before = plan.ratio0, r->balance_after = plan.ratio1, r->flex_ops = plan.nops;
    r->flex_xfer_s = moe__flex_xfer_time(&env, &plan.xfers, 0), r->step_before_s = r->step_s;
    moe_sim_config dev = *c;
    dev.local = Ev;
    st = simulate(NULL, &dev, send, per_expert, tail, r);
  }
  moe__flex_plan_free(&plan);
  moe__flex_table_free(&t);
  free(groups), free(Isrc), free(rt), free(send);
  return st;
}

moe_status moe_sim_run(const moe_sim_config *c, moe_sim_result *r) {
  int W = moe__sim_devices(c), E = c->E;
  *r = (moe_sim_result){.devices = W, .nodes = c->nodes, .experts = E, .tokens = c->T,
                        .capacity_factor = c->cf, .a2a = c->a2a == MOE__A2A_2DH ? "2dh" : "linear",
                        .reuse = moe__reuse_names[c->reuse], .r = c->r};
  int64_t *per_expert = malloc(sizeof *per_expert * (size_t)E);
  int64_t *send = malloc(sizeof *send * (size_t)W * W);
  moe_status st = per_expert && send ? moe__sim_route(c, per_expert)
                  : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "simulator: traffic of %d devices", W);
  moe_sim_config dev;
  double gather = 0;
  if (st == MOE_OK) st = moe__sim_parallel(c, per_expert, c->r, send, &dev, &gather);
  if (st == MOE_OK) st = simulate(c, &dev, send, per_expert, gather, r);
  r->a2a_msgs = moe__sim_msgs(c, c->a2a);
  if (st == MOE_OK && c->flex) st = run_flex(c, per_expert, r);
  free(per_expert), free(send);
  return st;
}
