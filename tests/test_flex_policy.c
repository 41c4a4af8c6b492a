/* FlexMoE's balance ratio, cost model, bandwidth fit and policy maker (src/flex/): Eq. 6 and Eq. 5 on
 * hand-computed cases, the fit recovering a known latency and bandwidth, and the scheduler on skewed
 * counts (the hot expert replicated, the ratio and the modelled time falling with every plan), uniform
 * counts (nothing), transfers too dear to repay (nothing) and replica groups a Migrate shrinks. */
#include <stdint.h>

#include "flex/flex.h"
#include "test.h"

/* A CPU-like profile (D = 1024 float rows, H = 4096): 20k tokens/s per expert, 2 GB/s links. */
static moe__flex_env cpu_env(void) {
  return (moe__flex_env){.compute = {1e-4, 2e4},
                         .a2a_intra = {5e-5, 2e9},
                         .a2a_inter = {5e-5, 2e9},
                         .allreduce = {1e-4, 2e9},
                         .token_bytes = 4096,
                         .grad_bytes = 2.0 * 1024 * 4096 * 4};
}
#define STATE_BYTES ((size_t)3 * 2 * 1024 * 4096 * 4) /* weights + Adam's two moments */

TEST(flex_balance_ratio_by_hand) {
  moe__flex_table t;
  ASSERT_OK(moe__flex_table_init(&t, 2, 2, 4, 1)); /* "01" "23" */
  const int64_t Ie[4] = {30, 10, 10, 10};
  ASSERT_NEAR(moe__flex_balance(&t, Ie), 40.0 / 30.0, 1e-15); /* loads 40 and 20, mean 30 */
  moe__flex_xfers x = {0};
  ASSERT_OK(moe__flex_migrate(&t, 1, 0, 2, 1, &x)); /* "02" "13": loads 40 and 20 still */
  ASSERT_NEAR(moe__flex_balance(&t, Ie), 40.0 / 30.0, 1e-15);
  moe__flex_table_free(&t);
  ASSERT_OK(moe__flex_table_init(&t, 2, 3, 4, 1)); /* 6 slots: "001" "223" */
  ASSERT_OK(moe__flex_shrink(&t, 2, 1));
  ASSERT_OK(moe__flex_expand(&t, 0, 1, &x)); /* "001" "203": rank 0 20 + 10, rank 1 10 + 10 + 10 */
  ASSERT_NEAR(moe__flex_balance(&t, Ie), 1.0, 1e-15);
  const int64_t none[4] = {0};
  ASSERT_NEAR(moe__flex_balance(&t, none), 1.0, 0);
  moe__flex_xfers_free(&x);
  moe__flex_table_free(&t);
}

TEST(flex_cost_model_by_hand) {
  moe__flex_env env = {.compute = {0.001, 1000},
                       .a2a_intra = {0.0005, 1e6},
                       .a2a_inter = {0.001, 5e5},
                       .allreduce = {0.002, 1e7},
                       .token_bytes = 1000,
                       .grad_bytes = 1e5};
  moe__flex_table t;
  double T, per[2];
  /* Expert 0 on rank 0, expert 1 on rank 1; rank 0 has 6 and 2 tokens, rank 1 4 and 0. Rank 0
   * computes 10 tokens of expert 0 (4 from rank 1), rank 1 2 of expert 1 (from rank 0):
   *   rank 0: 0.001 + 10/1000 + 4 (0.0005 + 4000/1e6) = 0.029;  rank 1: 0.001 + 0.002 + 4 (0.0005 + 0.002). */
  ASSERT_OK(moe__flex_table_init(&t, 2, 1, 2, 1));
  const int64_t I[4] = {6, 2, 4, 0};
  ASSERT_OK(moe__flex_cost(&t, I, &env, per, &T));
  ASSERT_NEAR(per[0], 0.029, 1e-12);
  ASSERT_NEAR(per[1], 0.013, 1e-12);
  ASSERT_NEAR(T, 0.029, 1e-12);
  moe__flex_table_free(&t);
  /* One expert on both ranks, 6 and 4 tokens: capacities 5 and 5, rank 0 sends 1 to rank 1. Both pay
   * the group's all-reduce, 0.002 + (2 (2-1)/2 1e5)/1e7 = 0.012:
   *   rank 0: 0.001 + 0.005 + 0.012 = 0.018;  rank 1: 0.006 + 4 (0.0005 + 1000/1e6) + 0.012 = 0.024. */
  ASSERT_OK(moe__flex_table_init(&t, 2, 1, 1, 1));
  const int64_t J[2] = {6, 4};
  ASSERT_OK(moe__flex_cost(&t, J, &env, per, &T));
  ASSERT_NEAR(per[0], 0.018, 1e-12);
  ASSERT_NEAR(per[1], 0.024, 1e-12);
  ASSERT_NEAR(T, 0.024, 1e-12);
  env.ranks_per_node = 1; /* two nodes: the token crosses the inter-node link, 4 (0.001 + 1000/5e5) */
  ASSERT_OK(moe__flex_cost(&t, J, &env, per, &T));
  ASSERT_NEAR(T, 0.030, 1e-12);
  moe__flex_table_free(&t);
}

/* The profiled rate by rows per expert: buckets 256 rows at 1000 tokens/s (1 ms a row), 1024 at 500
 * (2 ms) and 4096 at 400 (2.5 ms). 512 rows sit halfway up in log2 between 256 and 1024: 1.5 ms a row;
 * 2048 halfway between 1024 and 4096: 2.25 ms; the ends' rates outside (100 rows at 1 ms, 8192 at
 * 2.5 ms); without buckets, the one rate. In Eq. 5, an expert of 512 rows on one rank and one of
 * 2048 on the other: per rank 0.001 + 512 x 0.0015 = 0.769 s and 0.001 + 2048 x 0.00225 = 4.609 s. */
TEST(flex_cost_model_uses_the_rate_at_each_size) {
  moe__flex_env env = {.compute = {0.001, 1000}, .rate_n = 3, .rate_rows = {256, 1024, 4096},
                       .rate_tps = {1000, 500, 400}, .a2a_intra = {0, 1e9}, .a2a_inter = {0, 1e9},
                       .allreduce = {0, 1e9}};
  ASSERT_NEAR(moe__flex_compute_time(&env, 512), 0.001 + 512 * 0.0015, 1e-12);
  ASSERT_NEAR(moe__flex_compute_time(&env, 2048), 0.001 + 2048 * 0.00225, 1e-12);
  ASSERT_NEAR(moe__flex_compute_time(&env, 1024), 0.001 + 1024 * 0.002, 1e-12);
  ASSERT_NEAR(moe__flex_compute_time(&env, 100), 0.001 + 100 * 0.001, 1e-12);
  ASSERT_NEAR(moe__flex_compute_time(&env, 8192), 0.001 + 8192 * 0.0025, 1e-12);
  ASSERT_NEAR(moe__flex_compute_time(&env, 0), 0, 0);
  moe__flex_table t;
  double T, per[2];
  ASSERT_OK(moe__flex_table_init(&t, 2, 1, 2, 1)); /* expert 0 on rank 0, 1 on rank 1; no tokens move */
  const int64_t I[4] = {512, 0, 0, 2048};
  ASSERT_OK(moe__flex_cost(&t, I, &env, per, &T));
  ASSERT_NEAR(per[0], 0.769, 1e-12);
  ASSERT_NEAR(per[1], 4.609, 1e-12);
  ASSERT_NEAR(T, 4.609, 1e-12);
  env.rate_n = 1; /* one bucket: its rate at every size */
  ASSERT_NEAR(moe__flex_compute_time(&env, 2048), 0.001 + 2048 * 0.001, 1e-12);
  env.rate_n = 0; /* none: compute.bw */
  ASSERT_OK(moe__flex_cost(&t, I, &env, per, &T));
  ASSERT_NEAR(T, 0.001 + 2.048, 1e-12);
  moe__flex_table_free(&t);
  /* moe_flex_env's buckets reach the model, and bad ones are refused naming the bucket */
  moe_flex_env pub = {.tps = 1000, .a2a_bw = 1e9, .ar_bw = 1e9, .rate_n = 2, .rate_rows = {256, 1024},
                      .rate_tps = {1000, 500}};
  ASSERT_OK(moe__flex_check_env(&pub));
  moe__flex_env got = moe__flex_env_of(&pub);
  ASSERT_NEAR(moe__flex_compute_time(&got, 512), 512 * 0.0015, 1e-12);
  pub.rate_rows[1] = 256;
  ASSERT_STATUS(moe__flex_check_env(&pub), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "rate bucket 1 (256 rows, 500 tokens/s)"));
  pub.rate_rows[1] = 1024, pub.rate_tps[0] = 0;
  ASSERT_STATUS(moe__flex_check_env(&pub), MOE_ERR_ARG);
  pub.rate_tps[0] = 1000, pub.rate_n = MOE_FLEX_RATE_BUCKETS + 1;
  ASSERT_STATUS(moe__flex_check_env(&pub), MOE_ERR_ARG);
}

TEST(flex_fit_recovers_latency_and_bandwidth) {
  /* seconds = 20 us + bytes / 3 GB/s over 1 kB .. 16 MB, exact and with +-1% alternating noise. */
  double x[15], s[15], noisy[15];
  for (int i = 0; i < 15; i++) {
    x[i] = 1024.0 * (1 << i);
    s[i] = 2e-5 + x[i] / 3e9;
    noisy[i] = s[i] * (i % 2 ? 1.01 : 0.99);
  }
  moe__flex_link l;
  ASSERT_OK(moe__flex_fit(x, s, 15, &l));
  ASSERT_NEAR(l.lat, 2e-5, 1e-12);
  ASSERT_NEAR(l.bw / 3e9, 1, 1e-9);
  ASSERT_NEAR(moe__flex_link_time(l, 3e6), 2e-5 + 1e-3, 1e-12);
  ASSERT_NEAR(moe__flex_link_time(l, 0), 0, 0);
  ASSERT_OK(moe__flex_fit(x, noisy, 15, &l));
  ASSERT_NEAR(l.bw / 3e9, 1, 0.01);
  ASSERT_STATUS(moe__flex_fit(x, s, 1, &l), MOE_ERR_VALUE);
  const double same[3] = {5, 5, 5}, falling[3] = {3, 2, 1};
  ASSERT_STATUS(moe__flex_fit(same, s, 3, &l), MOE_ERR_VALUE);
  ASSERT(strstr(moe_last_error(), "same size 5"));
  ASSERT_STATUS(moe__flex_fit(x, falling, 3, &l), MOE_ERR_VALUE);
  ASSERT(strstr(moe_last_error(), "not a bandwidth"));
}

/* Isrc (4 ranks, 8 experts) with every rank sending scale * base[e] tokens to expert e. */
static void counts(const int64_t *base, int64_t scale, int64_t *I) {
  for (int g = 0; g < 4; g++)
    for (int e = 0; e < 8; e++) I[g * 8 + e] = scale * base[e];
}

/* Replays plan's ops on a copy of t0: the invariants hold after each, and the modelled time falls
 * strictly with every Expand/Shrink pair and every Migrate. */
static int replay_monotone(const moe__flex_table *t0, const moe__flex_plan *plan, const int64_t *I,
                           const moe__flex_env *env) {
  moe__flex_table t;
  moe__flex_xfers x = {0};
  double prev, T;
  int ok = moe__flex_table_clone(&t, t0) == MOE_OK && moe__flex_cost(&t, I, env, NULL, &prev) == MOE_OK;
  for (int i = 0; ok && i < plan->nops; i++) {
    ok = moe__flex_apply(&t, &plan->ops[i], &x) == MOE_OK && moe__flex_table_check(&t) == MOE_OK;
    if (ok && plan->ops[i].kind != MOE__FLEX_SHRINK) {
      ok = moe__flex_cost(&t, I, env, NULL, &T) == MOE_OK && T < prev;
      if (!ok) fprintf(stderr, "  op %d: modelled time %g after %g\n", i, T, prev);
      prev = T;
    }
  }
  ok = ok && x.n == plan->xfers.n;
  moe__flex_xfers_free(&x);
  moe__flex_table_free(&t);
  return ok;
}

/* One scheduler step on skewed counts (expert 0 gets 62% of the tokens: rank 0 computes 1840 of every
 * 2560, ratio 2.875), from the initial placement of 4 ranks x 4 slots, 2 experts each. */
static void skewed_step(int64_t scale, double want_ratio_below, int *failed_) {
  const int64_t base[8] = {400, 60, 50, 40, 30, 20, 20, 20};
  int64_t I[32], Ie[8];
  counts(base, scale, I);
  for (int e = 0; e < 8; e++) Ie[e] = 4 * scale * base[e];
  moe__flex_env env = cpu_env();
  moe__flex_policy pol = moe__flex_policy_default();
  moe__flex_table t, t0;
  moe__flex_plan plan = {0};
  ASSERT_OK(moe__flex_table_init(&t, 4, 4, 8, STATE_BYTES));
  ASSERT_OK(moe__flex_table_clone(&t0, &t));
  ASSERT_NEAR(moe__flex_balance(&t, Ie), 2.875, 1e-12);
  moe__flex_op ops[2];
  int nops;
  ASSERT_OK(moe__flex_make_plan(&t, I, &env, &pol, ops, &nops)); /* Algorithm 2 alone: one pair */
  ASSERT_EQ_INT(nops, 2);
  ASSERT(ops[0].kind == MOE__FLEX_SHRINK && ops[1].kind == MOE__FLEX_EXPAND && ops[1].e == 0);
  ASSERT(ops[0].g == ops[1].g && ops[0].g != 0); /* the freed slot, on a rank other than the hot one */
  ASSERT_OK(moe__flex_schedule(&t, I, &env, &pol, &plan));
  fprintf(stderr, "  skewed x%lld: balance %.3f -> %.3f, modelled step %.1f -> %.1f ms, %d ops, %d copies\n",
          (long long)scale, plan.ratio0, plan.ratio1, plan.t0 * 1e3, plan.t1 * 1e3, plan.nops, plan.xfers.n);
  ASSERT_OK(moe__flex_table_check(&t));
  ASSERT(moe__flex_replicas(&t, 0) > 2);
  ASSERT(plan.ratio1 < want_ratio_below);
  ASSERT(plan.t1 < plan.t0);
  ASSERT_NEAR(plan.ratio1, moe__flex_balance(&t, Ie), 0);
  ASSERT(replay_monotone(&t0, &plan, I, &env));
  for (int i = 0; i < plan.xfers.n; i++) ASSERT(plan.xfers.x[i].bytes == STATE_BYTES);
  /* The next step on the same counts finds nothing more to do. */
  ASSERT_OK(moe__flex_schedule(&t, I, &env, &pol, &plan));
  ASSERT_EQ_INT(plan.nops, 0);
  moe__flex_plan_free(&plan);
  moe__flex_table_free(&t0);
  moe__flex_table_free(&t);
}

TEST(flex_policy_replicates_the_hot_expert) {
  /* 640 tokens a rank: a replica's all-reduce (17-25 ms) costs as much as 350-500 tokens of compute, so
   * the model stops short of balance. 6400 tokens a rank (case M's 4096 x top-2 is 8192): compute
   * dominates and the ratio goes under the threshold. */
  skewed_step(1, 2.0, failed_);
  skewed_step(10, moe__flex_policy_default().threshold, failed_);
}

TEST(flex_policy_uniform_and_dear_copies_do_nothing) {
  const int64_t uniform[8] = {80, 80, 80, 80, 80, 80, 80, 80}, skewed[8] = {400, 60, 50, 40, 30, 20, 20, 20};
  int64_t I[32];
  moe__flex_env env = cpu_env();
  moe__flex_policy pol = moe__flex_policy_default();
  moe__flex_table t;
  moe__flex_plan plan = {0};
  ASSERT_OK(moe__flex_table_init(&t, 4, 4, 8, STATE_BYTES));
  counts(uniform, 1, I);
  ASSERT_OK(moe__flex_schedule(&t, I, &env, &pol, &plan));
  ASSERT_EQ_INT(plan.nops, 0);
  ASSERT_NEAR(plan.ratio0, 1.0, 1e-12);
  ASSERT_NEAR(plan.t1, plan.t0, 0);
  /* Skewed, but each copy takes a minute over a slow link: K = 10 steps never repay it. */
  counts(skewed, 1, I);
  env.a2a_intra.bw = 2e6;
  ASSERT_OK(moe__flex_schedule(&t, I, &env, &pol, &plan));
  ASSERT_EQ_INT(plan.nops, 0);
  ASSERT(plan.ratio0 > pol.threshold);
  /* A longer horizon repays it. */
  pol.horizon = 100000;
  ASSERT_OK(moe__flex_schedule(&t, I, &env, &pol, &plan));
  ASSERT(plan.nops >= 2);
  pol.horizon = 0;
  ASSERT_STATUS(moe__flex_schedule(&t, I, &env, &pol, &plan), MOE_ERR_ARG);
  moe__flex_plan_free(&plan);
  moe__flex_table_free(&t);
}

TEST(flex_policy_searches_past_the_busiest_rank) {
  /* 2 ranks "0011" "2233", expert 0 hot, 1-3 tied. Shrinking the coldest expert on the busiest rank
   * (DIGEST P3 4.5) frees a slot on rank 0, which already holds expert 0: nothing changes. The search
   * frees a slot of expert 2 on rank 1 instead and copies expert 0 there. */
  moe__flex_env env = cpu_env();
  env.compute.bw = 200; /* slow experts: compute dominates */
  moe__flex_policy pol = moe__flex_policy_default();
  moe__flex_table t;
  ASSERT_OK(moe__flex_table_init(&t, 2, 4, 4, STATE_BYTES));
  const int64_t I[8] = {50, 5, 5, 5, 50, 5, 5, 5};
  moe__flex_op ops[2];
  int nops;
  ASSERT_OK(moe__flex_make_plan(&t, I, &env, &pol, ops, &nops));
  ASSERT_EQ_INT(nops, 2);
  ASSERT(ops[0].kind == MOE__FLEX_SHRINK && ops[0].e == 2 && ops[0].g == 1);
  ASSERT(ops[1].kind == MOE__FLEX_EXPAND && ops[1].e == 0 && ops[1].g == 1);
  moe__flex_table_free(&t);
}

TEST(flex_policy_migrates_to_shrink_groups) {
  /* "001" "223", then a Migrate of 0 (rank 0) with 2 (rank 1): "021" "203", experts 0 and 2 each on
   * both ranks and paying an all-reduce. On uniform counts the scheduler swaps them back: both groups
   * shrink to one rank, and no state moves since each rank already holds what it receives. */
  moe__flex_env env = cpu_env();
  moe__flex_policy pol = moe__flex_policy_default();
  moe__flex_table t;
  moe__flex_xfers x = {0};
  moe__flex_plan plan = {0};
  ASSERT_OK(moe__flex_table_init(&t, 2, 3, 4, STATE_BYTES));
  ASSERT_OK(moe__flex_migrate(&t, 0, 0, 2, 1, &x));
  moe__flex_group g[4];
  int n;
  ASSERT_OK(moe__flex_sync_groups(&t, -1, g, &n));
  ASSERT_EQ_INT(n, 2);
  const int64_t I[8] = {30, 15, 30, 15, 30, 15, 30, 15}; /* per replica: 30 for 0 and 2, 30 for 1, 3 */
  ASSERT_OK(moe__flex_schedule(&t, I, &env, &pol, &plan));
  ASSERT_EQ_INT(plan.nops, 1);
  ASSERT(plan.ops[0].kind == MOE__FLEX_MIGRATE);
  ASSERT_EQ_INT(plan.xfers.n, 0);
  ASSERT(plan.t1 < plan.t0);
  ASSERT_OK(moe__flex_sync_groups(&t, -1, g, &n));
  ASSERT_EQ_INT(n, 0);
  ASSERT_OK(moe__flex_table_check(&t));
  moe__flex_xfers_free(&x);
  moe__flex_plan_free(&plan);
  moe__flex_table_free(&t);
}

TEST(flex_policy_relieves_the_slowest_rank) {
  /* "001" "223" with I = 60, 40, 2, 45: rank 0 computes 100 tokens, rank 1 47. The hottest expert per
   * replica overall is 3 (45), on rank 1: no replica of it can shorten rank 0. The policy takes the
   * hottest of rank 0's experts, 1 (40 on one replica), and moves half of it to rank 1 in place of a
   * replica of 2. */
  moe__flex_env env = cpu_env();
  env.compute.bw = 200;
  moe__flex_policy pol = moe__flex_policy_default();
  moe__flex_table t;
  ASSERT_OK(moe__flex_table_init(&t, 2, 3, 4, STATE_BYTES));
  const int64_t I[8] = {30, 20, 1, 22, 30, 20, 1, 23};
  moe__flex_op ops[2];
  int nops;
  ASSERT_OK(moe__flex_make_plan(&t, I, &env, &pol, ops, &nops));
  ASSERT_EQ_INT(nops, 2);
  ASSERT(ops[0].kind == MOE__FLEX_SHRINK && ops[0].e == 2 && ops[0].g == 1);
  ASSERT(ops[1].kind == MOE__FLEX_EXPAND && ops[1].e == 1 && ops[1].g == 1);
  moe__flex_table_free(&t);
}
