/* The policy maker over a sequence of steps (moe_flex_sim, moe.h): what `moe placement --method
 * flexmoe` runs over a recorded trace, with the same table, scheduler and cost model as training. */
#include <stdlib.h>

#include "flex/flex.h"

struct moe_flex_sim {
  moe__flex_table t;
  moe__flex_env env;
  moe__flex_policy pol;
  moe__flex_plan plan;
};

moe__flex_env moe__flex_env_of(const moe_flex_env *e) {
  moe__flex_link a2a = {e->a2a_lat, e->a2a_bw};
  moe__flex_env out = {.compute = {0, e->tps},
                       .rate_n = e->rate_n,
                       .a2a_intra = a2a,
                       .a2a_inter = a2a,
                       .allreduce = {e->ar_lat, e->ar_bw},
                       .token_bytes = e->token_bytes,
                       .grad_bytes = e->expert_bytes};
  for (int i = 0; i < e->rate_n; i++) out.rate_rows[i] = e->rate_rows[i], out.rate_tps[i] = e->rate_tps[i];
  return out;
}

moe_status moe__flex_check_env(const moe_flex_env *e) {
  MOE_TRY(e->tps > 0 && e->a2a_bw > 0 && e->ar_bw > 0, MOE_ERR_ARG,
          "flex: tokens per second %g, all-to-all bandwidth %g and all-reduce bandwidth %g must be > 0", e->tps,
          e->a2a_bw, e->ar_bw);
  MOE_TRY(e->a2a_lat >= 0 && e->ar_lat >= 0 && e->token_bytes >= 0 && e->expert_bytes >= 0, MOE_ERR_ARG,
          "flex: latencies (%g, %g s) and sizes (%g, %g bytes) must be >= 0", e->a2a_lat, e->ar_lat,
          e->token_bytes, e->expert_bytes);
  MOE_TRY(e->rate_n >= 0 && e->rate_n <= MOE_FLEX_RATE_BUCKETS, MOE_ERR_ARG, "flex: rate_n %d not in [0, %d]",
          e->rate_n, MOE_FLEX_RATE_BUCKETS);
  for (int i = 0; i < e->rate_n; i++)
    MOE_TRY(e->rate_tps[i] > 0 && e->rate_rows[i] > (i ? e->rate_rows[i - 1] : 0), MOE_ERR_ARG,
            "flex: rate bucket %d (%g rows, %g tokens/s): rows must rise above %g and the rate be > 0", i,
            e->rate_rows[i], e->rate_tps[i], i ? e->rate_rows[i - 1] : 0.0);
  return MOE_OK;
}

moe_status moe_flex_sim_new(moe_flex_sim **out, int ranks, int slots, int experts, const moe_flex_env *env,
                            double threshold) {
  MOE_TRY(out && env, MOE_ERR_ARG, "moe_flex_sim_new: NULL argument");
  MOE_CHECK(moe__flex_check_env(env));
  MOE_TRY(threshold >= 1, MOE_ERR_ARG, "flex: balance threshold %g is below 1 (the ratio of a perfect balance)",
          threshold);
  moe_flex_sim *s = calloc(1, sizeof *s);
  MOE_TRY(s, MOE_ERR_NOMEM, "flex: out of memory");
  moe_status st = moe__flex_table_init(&s->t, ranks, slots, experts, (size_t)(3 * env->expert_bytes));
  if (st != MOE_OK) {
    free(s);
    return st;
  }
  s->env = moe__flex_env_of(env);
  s->pol = moe__flex_policy_default();
  s->pol.threshold = threshold;
  *out = s;
  return MOE_OK;
}

void moe_flex_sim_free(moe_flex_sim *s) {
  if (!s) return;
  moe__flex_table_free(&s->t);
  moe__flex_plan_free(&s->plan);
  free(s);
}

moe_flex_step moe__flex_step_of(const moe__flex_plan *p, const moe__flex_env *env) {
  moe_flex_step out = {.balance_before = p->ratio0,
                       .balance_after = p->ratio1,
                       .time_before = p->t0,
                       .time_after = p->t1,
                       .xfer_s = moe__flex_xfer_time(env, &p->xfers, 0)};
  for (int i = 0; i < p->nops; i++) {
    moe__flex_kind k = p->ops[i].kind;
    out.expands += k == MOE__FLEX_EXPAND;
    out.shrinks += k == MOE__FLEX_SHRINK;
    out.migrates += k == MOE__FLEX_MIGRATE;
  }
  return out;
}

moe_status moe_flex_sim_step(moe_flex_sim *s, const int64_t *src, moe_flex_step *out) {
  MOE_CHECK(moe__flex_schedule(&s->t, src, &s->env, &s->pol, &s->plan));
  *out = moe__flex_step_of(&s->plan, &s->env);
  return MOE_OK;
}
