/* The adaptive micro-batch count (moe_layer_config.pipeline = 0): Algorithm 1 driven by trial steps.
 * The search is checked on synthetic step costs (no clock), and the layer with pipeline 0 against the
 * bits of n = 1 while it searches and after it has chosen. */
#include <string.h>

#include "adapt/pipe_model.h"
#include "test.h"

/* A synthetic step: fixed cost per micro-batch plus work that overlap hides better as n grows, so the
 * best n grows with the rows (MPipeMoE's hypothesis). */
static double step_cost(size_t rows, int n) { return 0.002 * n + 1e-5 * (double)rows * (1.0 + 1.0 / n); }

/* Runs steps of `rows` rows until one is not a trial; returns the trial steps it took (-1 on error). */
static int settle(moe__auto_pipe *a, size_t rows, int *n) {
  for (int steps = 0; steps < 100; steps++) {
    if (moe__auto_pipe_pick(a, rows, n) != MOE_OK) return -1;
    if (a->trial < 0) return steps;
    if (moe__auto_pipe_record(a, step_cost(rows, *n)) != MOE_OK) return -1;
  }
  return -1;
}

static int brute_force(size_t rows, int max_n) {
  int best = 1;
  for (int n = 2; n <= max_n; n *= 2)
    if (step_cost(rows, n) < step_cost(rows, best)) best = n;
  return best;
}

TEST(auto_pipe_search_equals_brute_force) {
  moe__auto_pipe a;
  ASSERT_OK(moe__auto_pipe_init(&a, 6)); /* six local experts: candidates 1, 2, 4 */
  ASSERT_EQ_INT(a.gran.ncand, 3);
  int n, trials = settle(&a, 5000, &n);
  ASSERT_EQ_INT(trials, 3 * MOE__AUTO_REPS); /* each candidate, twice */
  ASSERT_EQ_INT(n, brute_force(5000 / MOE__AUTO_ROWS * MOE__AUTO_ROWS, 4));
  ASSERT_EQ_INT(settle(&a, 5000, &n), 0); /* known now */
  ASSERT_EQ_INT(settle(&a, 5000 / MOE__AUTO_ROWS * MOE__AUTO_ROWS + 1, &n), 0); /* same bucket: no trials */
  for (size_t rows = 128; rows <= 64 * 1024; rows += 512) { /* a sweep: new sizes are searched */
    ASSERT(settle(&a, rows, &n) >= 0);
    ASSERT_EQ_INT(n, brute_force(rows, 4));
  }
  /* the sweep left one range per n, each the hull of the sizes it won; sizes seen again, or in the same
   * bucket of rows, need no trial steps (a training run's steps revisit sizes) */
  ASSERT_EQ_INT(a.gran.nranges, 3);
  for (size_t rows = 128 + 100; rows <= 64 * 1024; rows += 512) {
    int trials = settle(&a, rows, &n);
    if (trials) FAIL_("rows %zu: %d trial steps inside the ranges", rows, trials);
    ASSERT_EQ_INT(n, brute_force(rows / MOE__AUTO_ROWS * MOE__AUTO_ROWS, 4));
  }
  moe__auto_pipe_free(&a);
}

TEST(auto_pipe_fastest_trial_step_counts) {
  moe__auto_pipe a;
  ASSERT_OK(moe__auto_pipe_init(&a, 1)); /* one local expert: nothing to choose */
  ASSERT_EQ_INT(a.gran.ncand, 1);
  int n;
  ASSERT_OK(moe__auto_pipe_pick(&a, 300, &n));
  ASSERT_EQ_INT(n, 1);
  moe__auto_pipe_free(&a);
  ASSERT_OK(moe__auto_pipe_init(&a, 2)); /* 1 and 2; the first step of each is slow (warming up) */
  double cost[2][2] = {{9.0, 1.0}, {9.5, 0.8}}; /* [candidate][rep]: warm-up, then the real cost */
  for (int c = 0; c < 2; c++)
    for (int r = 0; r < MOE__AUTO_REPS; r++) {
      ASSERT_OK(moe__auto_pipe_pick(&a, 300, &n));
      ASSERT_EQ_INT(n, c ? 2 : 1);
      ASSERT_OK(moe__auto_pipe_record(&a, cost[c][r]));
    }
  ASSERT_OK(moe__auto_pipe_pick(&a, 300, &n));
  ASSERT(a.trial < 0);
  ASSERT_EQ_INT(n, 2); /* 0.8 < 1.0: the fastest step of each, not the warm-up's */
  moe__auto_pipe_free(&a);
}

enum { D = 12, H = 20, E = 8, T = 90 };

static void fill(float *a, int n, uint64_t s) {
  for (int i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    a[i] = (float)((s >> 40) * 0x1.0p-23) - 1.0f;
  }
}

/* pipeline 0 in a layer: each step's outputs and input gradients are the bits of n = 1, through the
 * trial steps (every candidate n) and after; the layer says which n ran and when the search is over. */
TEST(auto_pipe_layer_same_bits_while_searching) {
  static float x[T * D], dy[T * D], y1[T * D], dx1[T * D], y[T * D], dx[T * D];
  fill(x, T * D, 5);
  fill(dy, T * D, 9);
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.D = D, cfg.H = H, cfg.E = E, cfg.threads = 1;
  moe_layer_t one, ad;
  ASSERT_OK(moe_layer_init(&one, &cfg));
  cfg.pipeline = 0;
  cfg.memory_reuse = MOE_REUSE_S4;
  ASSERT_OK(moe_layer_init(&ad, &cfg));
  moe_layer_init_params(&one, 3);
  moe_layer_init_params(&ad, 3);
  ASSERT_OK(moe_layer_forward(&one, x, T, y1, NULL, NULL));
  ASSERT_OK(moe_layer_backward(&one, dy, 0.1f, 0.0f, NULL, NULL, dx1));
  int seen = 0, trials = 0, last = -1; /* seen: bit n set when n ran */
  for (int step = 0; step < 12; step++) {
    moe_layer_stats st;
    ASSERT_OK(moe_layer_forward(&ad, x, T, y, NULL, &st));
    ASSERT_OK(moe_layer_backward(&ad, dy, 0.1f, 0.0f, NULL, NULL, dx));
    if (memcmp(y, y1, sizeof y) || memcmp(dx, dx1, sizeof dx))
      FAIL_("step %d (n = %d%s): y or dx differs from n = 1", step, st.pipeline, st.pipeline_trial ? ", trial" : "");
    seen |= 1 << st.pipeline;
    trials += st.pipeline_trial;
    if (!st.pipeline_trial && last >= 0) ASSERT_EQ_INT(st.pipeline, last); /* chosen once, kept */
    if (!st.pipeline_trial) last = st.pipeline;
  }
  ASSERT_EQ_INT(trials, 4 * MOE__AUTO_REPS); /* candidates 1, 2, 4, 8 (eight experts) */
  ASSERT_EQ_INT(seen & 0x116, 0x116);       /* 1, 2, 4 and 8 all ran */
  ASSERT(last == 1 || last == 2 || last == 4 || last == 8);
  moe_layer_free(&one);
  moe_layer_free(&ad);
}
