/* A serving run in the simulator (DESIGN 4.6): the decode steps of a recorded trace (moe serve --trace,
 * one row per step, layer and expert) on one device whose K slots per layer cache experts held in
 * slow memory (expert buffering, deployment paper VI). The cache is moe_cachesim's, the compute the
 * training step's forward (its GEMM kinds and passes); a miss fetches the expert at fetch_bw while
 * the resident experts compute, as the runtime's loader thread does. */
#include <math.h>
#include <stdlib.h>

#include "sim/sim.h"

/* Misses of each step of [0, steps) in layer l: moe_cachesim over the prefix [0, s + 1) less over
 * [0, s) (the online policies' state after a prefix does not depend on what follows). */
static moe_status step_misses(const moe_trace *t, int l, moe_cache_policy p, int K, int64_t *out) {
  int64_t acc, prev = 0;
  for (int64_t s = 0; s < t->steps; s++) {
    int64_t m;
    MOE_CHECK(moe_cachesim(t, l, 0, s + 1, p, K, &acc, &m));
    out[s] = m - prev, prev = m;
  }
  return MOE_OK;
}

/* One layer's decode step: the token side, then the active experts, the hits first while the loader
 * fetches the misses one after another, each miss computing once it has landed and the compute stream
 * is free (which experts missed is not kept: each costs the step's mean). */
static double layer_step(const moe_sim_config *c, const int32_t *tok, int64_t misses, double fetch_one,
                         int64_t *tokens, double *fetch_wait) {
  moe_sim_config s = *c;
  double comp = 0, rows = 0;
  int active = 0;
  for (int e = 0; e < c->E; e++)
    if (tok[e] > 0) {
      active++, rows += tok[e];
      comp += 2 * moe__sim_gemm_s(c, MOE__SIM_NT, tok[e], 1) +
              (c->mem_bw > 0 ? moe__sim_expert_bytes(c, tok[e], 0) / c->mem_bw : 0);
    }
  s.T = (int)ceil(rows / c->k);
  *tokens = s.T;
  double side = c->mem_bw > 0 ? (moe__sim_token_bytes(&s, rows, MOE__SIM_BEFORE) +
                                 moe__sim_token_bytes(&s, rows, MOE__SIM_AFTER)) / c->mem_bw +
                                    moe__sim_router_s(&s) / 3
                              : 0;
  if (!active) return side;
  double mean = comp / active, t = (double)(active - misses) * mean;
  for (int64_t j = 1; j <= misses; j++) t = fmax(t, (double)j * fetch_one) + mean;
  *fetch_wait += t - comp;
  return side + t;
}

static moe_status serve_trace(const moe_sim_config *c, const moe_trace *t, moe_sim_serve_result *r) {
  MOE_TRY(t->experts == c->E, MOE_ERR_ARG, "simulator: the trace has %d experts, the config %d", t->experts, c->E);
  MOE_TRY(t->steps <= MOE__SIM_SERVE_MAX_STEPS, MOE_ERR_ARG, "simulator: the trace has %lld steps, at most %d are "
          "simulated", (long long)t->steps, MOE__SIM_SERVE_MAX_STEPS);
  *r = (moe_sim_serve_result){.steps = t->steps, .layers = t->layers, .cache_experts = c->cache_k,
                              .cache_policy = moe_cache_policy_name(c->cache_policy)};
  int64_t *miss = calloc((size_t)t->steps * t->layers + 1, sizeof *miss);
  MOE_TRY(miss, MOE_ERR_NOMEM, "simulator: misses of %lld steps", (long long)t->steps);
  moe_status st = MOE_OK;
  for (int l = 0; l < t->layers && st == MOE_OK && c->cache_k > 0; l++) /* K = 0: every expert resident */
    st = step_misses(t, l, c->cache_policy, c->cache_k, miss + (size_t)l * t->steps);
  /* The matrices and biases of one expert: what a miss reads. */
  double fetch_one = c->fetch_bw > 0 ? (2.0 * c->D * c->H + c->D + c->H) * c->elem / c->fetch_bw : 0;
  double total = 0;
  for (int64_t s = 0; s < t->steps && st == MOE_OK; s++) {
    int64_t step_tokens = 0;
    for (int l = 0; l < t->layers; l++) {
      const int32_t *tok = t->tokens + ((size_t)s * t->layers + l) * t->experts;
      int64_t m = miss[(size_t)l * t->steps + s], n;
      for (int e = 0; e < c->E; e++) r->accesses += tok[e] > 0;
      r->misses += m;
      total += layer_step(c, tok, m, fetch_one, &n, &r->fetch_wait_s);
      step_tokens = n > step_tokens ? n : step_tokens;
    }
    r->tokens += step_tokens;
  }
  free(miss);
  MOE_CHECK(st);
  r->time_s = total;
  r->hit_rate = r->accesses ? 1 - (double)r->misses / (double)r->accesses : 1;
  r->token_s = r->tokens ? total / (double)r->tokens : 0;
  r->fetch_s = (double)r->misses * fetch_one;
  return MOE_OK;
}

int moe_sim_config_serves(const moe_sim_config *c) { return c->serve_trace != NULL; }

moe_status moe_sim_serve(const moe_sim_config *c, moe_sim_serve_result *r) {
  MOE_TRY(c->serve_trace, MOE_ERR_ARG, "simulator: the config has no \"serve_trace\" to serve");
  moe_trace t = {0};
  moe_status st = moe_trace_load(&t, c->serve_trace, c->E);
  if (st == MOE_OK) st = serve_trace(c, &t, r);
  moe_trace_free(&t);
  return st;
}
