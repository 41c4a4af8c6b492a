/* A layer's dictionary of setups (src/adapt/auto_pipe.c, layer_setup.c; Tutel P2 1.7): the layer's
 * steps are its trials. The search is checked on synthetic step costs (no clock): the entry equals brute
 * force, repeated capacities (the same floor(c / 128)) return it with no trial, and the trials stay
 * within the paper's count; then the layer with pipeline 0 against the bits of n = 1 while it searches,
 * what a sharded layer and one process do not offer, and `moe bench` printing the entry. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

#include "adapt/pipe_model.h"
#include "run_cli.h"
#include "test.h"

/* A synthetic step: r convex around r_best (r = 0 dear), a fixed cost per micro-batch plus work that
 * overlap hides better as n grows (so the best n grows with the capacity), 2DH cheaper per message
 * but dearer per row. */
typedef struct {
  double r_best;
} cost_model;

static double step_cost(const cost_model *m, size_t c, const moe__setup *s) {
  double r = s->r == 0 ? 10.0 : 0.01 * (s->r - m->r_best) * (s->r - m->r_best);
  double pipe = 0.002 * s->d * (s->a == MOE__A2A_2DH ? 0.5 : 1.0) + 1e-5 * (double)c * (1.0 + 1.0 / s->d);
  return 1.0 + r + pipe + (s->a == MOE__A2A_2DH ? 2e-6 * (double)c : 0);
}

/* Steps at capacity c until one is not a trial (its setup in *s); the trial steps taken, -1 on error. */
static int settle(moe__auto_pipe *a, const cost_model *m, size_t c, moe__setup *s) {
  for (int steps = 0; steps < 4000; steps++) {
    if (moe__auto_pipe_pick(a, c, s) != MOE_OK) return -1;
    if (!a->trial) return steps;
    if (moe__auto_pipe_record(a, step_cost(m, c, s)) != MOE_OK) return -1;
  }
  return -1;
}

static moe__setup brute_force(const moe__auto_pipe *a, const cost_model *m, size_t c) {
  moe__setup best = {0};
  double cb = INFINITY;
  int r_lo = a->dict.search_r ? 0 : 1, r_hi = a->dict.search_r ? a->dict.r_max : 1;
  for (int i = 0; i < a->dict.ndeg; i++)
    for (int j = 0; j < a->dict.nalgo; j++)
      for (int r = r_lo; r <= r_hi; r++) {
        moe__setup s = {r, a->dict.deg[i], a->dict.algo[j]};
        if (step_cost(m, c, &s) < cb) cb = step_cost(m, c, &s), best = s;
      }
  return best;
}

static const int DEG[] = {1, 2, 4, 8};
static const moe__a2a BOTH[] = {MOE__A2A_LINEAR, MOE__A2A_2DH};

/* Over (r, n, algorithm), n alone and r alone: the entry is brute force's, found within the paper's
 * trials, each run MOE__AUTO_REPS steps; the same key again costs no step, another key its own search. */
TEST(auto_pipe_dictionary_entries_trials_and_cache) {
  const struct { int W, E, search_r, ndeg, nalgo; double r_best; } cases[] = {
      {64, 1, 1, 4, 2, 23}, {16, 2, 1, 4, 2, 1}, {4, 2, 1, 1, 1, 2}, {64, 1, 1, 1, 1, 64},
      {8, 8, 1, 1, 1, 1}, {2, 8, 0, 3, 1, 1}, {4, 8, 0, 2, 2, 1}};
  const size_t caps[] = {100, 1000, 5000};
  for (int i = 0; i < (int)(sizeof cases / sizeof *cases); i++) {
    cost_model m = {cases[i].r_best};
    moe__auto_pipe a;
    ASSERT_OK(moe__auto_pipe_init(&a, cases[i].W, cases[i].E, cases[i].search_r, DEG, cases[i].ndeg, BOTH,
                                  cases[i].nalgo));
    a.dict.margin = 0; /* the exact argmin (tests/test_pipe_model.c tests the margin) */
    int m_r = (cases[i].W + cases[i].E - 1) / cases[i].E;
    double paper = (cases[i].search_r ? log((double)m_r) / log(1.5) + 2 : 1) * cases[i].ndeg * cases[i].nalgo;
    ASSERT(fabs(moe__setup_dict_bound(&a.dict) - paper) < 1e-9);
    for (int k = 0; k < 3; k++) {
      moe__setup s, want = brute_force(&a, &m, caps[k]), again;
      int64_t before = a.measured;
      int steps = settle(&a, &m, caps[k], &s);
      int64_t trials = a.measured - before;
      if (steps < 0 || s.r != want.r || s.d != want.d || s.a != want.a || trials > paper ||
          steps != trials * MOE__AUTO_REPS)
        FAIL_("W=%d E=%d capacity %zu: (r %d, n %d, a %d) in %d steps, %lld trials (bound %.1f); brute force "
              "(r %d, n %d, a %d)", cases[i].W, cases[i].E, caps[k], s.r, s.d, s.a, steps, (long long)trials, paper,
              want.r, want.d, want.a);
      size_t same = caps[k] / MOE__AUTO_ROWS * MOE__AUTO_ROWS + MOE__AUTO_ROWS - 1; /* the same key */
      ASSERT_EQ_INT(settle(&a, &m, same, &again), 0);
      ASSERT(again.r == s.r && again.d == s.d && again.a == s.a);
      ASSERT_EQ_INT((int)(a.measured - before), (int)trials); /* no trial for a cached entry */
    }
    ASSERT_EQ_INT((int)a.dict.map.len, 3);
    moe__auto_pipe_free(&a);
  }
}

/* The first step of a trial warms the workspace: the fastest of MOE__AUTO_REPS counts. */
TEST(auto_pipe_fastest_trial_step_counts) {
  moe__auto_pipe a;
  moe__setup s;
  ASSERT_OK(moe__auto_pipe_init(&a, 1, 1, 0, DEG, 1, BOTH, 1)); /* one setup: nothing to choose */
  ASSERT_OK(moe__auto_pipe_pick(&a, 300, &s));
  ASSERT(!a.trial && s.d == 1 && a.measured == 0);
  moe__auto_pipe_free(&a);
  ASSERT_OK(moe__auto_pipe_init(&a, 1, 1, 0, DEG, 2, BOTH, 1)); /* n 1 and 2 */
  const double cost[2][2] = {{9.0, 1.0}, {5.0, 2.0}}; /* n = 2's first is faster than n = 1's, its best not */
  for (int c = 0; c < 2; c++)
    for (int r = 0; r < MOE__AUTO_REPS; r++) {
      ASSERT_OK(moe__auto_pipe_pick(&a, 300, &s));
      ASSERT(a.trial && s.d == c + 1);
      ASSERT_OK(moe__auto_pipe_record(&a, cost[c][r]));
    }
  ASSERT_OK(moe__auto_pipe_pick(&a, 300, &s));
  ASSERT(!a.trial && s.d == 1);
  moe__auto_pipe_free(&a);
  ASSERT_STATUS(moe__auto_pipe_init(&a, 4, 2, 1, DEG, 0, BOTH, 1), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "0 degrees"));
}

enum { D = 12, H = 20, E = 8, T = 90 };

static void fill(float *a, int n, uint64_t s) {
  for (int i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    a[i] = (float)((s >> 40) * 0x1.0p-23) - 1.0f;
  }
}

/* pipeline 0 in a layer: each step's outputs and input gradients are the bits of n = 1, through the
 * trial steps (every candidate n) and after; the layer says which n ran and when the search is over, and
 * its dictionary's entry says that one process has no 2DH. */
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
  cfg.a2a_auto = 1;
  ASSERT_OK(moe_layer_init(&ad, &cfg));
  moe_layer_init_params(&one, 3);
  moe_layer_init_params(&ad, 3);
  ASSERT_OK(moe_layer_forward(&one, x, T, y1, NULL, NULL));
  ASSERT_OK(moe_layer_backward(&one, dy, 0.1f, 0.0f, NULL, NULL, dx1));
  moe_layer_setup_info info;
  ASSERT_EQ_INT(moe_layer_setup(&one, &info), 0); /* nothing adaptive: no dictionary */
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
    ASSERT_EQ_INT(moe_layer_setup(&ad, &info), 1);
    ASSERT_EQ_INT(info.trial, st.pipeline_trial);
    ASSERT_EQ_INT(info.capacity, st.capacity);
  }
  ASSERT_EQ_INT(trials, 4 * MOE__AUTO_REPS); /* candidates 1, 2, 4, 8 (eight experts) */
  ASSERT_EQ_INT(seen & 0x116, 0x116);       /* 1, 2, 4 and 8 all ran */
  ASSERT(last == 1 || last == 2 || last == 4 || last == 8);
  ASSERT(info.n == last && info.r == -1 && info.a2a == MOE_A2A_LINEAR && info.searched == 6);
  ASSERT(info.trials == 4 && info.entries == 1 && info.key == info.capacity / 128 && info.bound == 4);
  ASSERT(strstr(info.note, "2DH not offered: one process"));
  char line[512];
  moe_layer_setup_format(&info, line, sizeof line);
  ASSERT(strstr(line, "entry at capacity") && strstr(line, "r off (fixed)") && strstr(line, "4 trials"));
  moe_layer_free(&one);
  moe_layer_free(&ad);
}

/* A sharded layer (a moe_dist of one process: no mpirun) with r and n adaptive: the dictionary searches
 * (r, n) together, r = 0 and r = 1 here times n in {1, 2, 4, 8} (cut between the eight experts), and
 * every step's output is the bits of n = 1 at r = 0 (one process: every r computes the same). */
TEST(auto_pipe_sharded_layer_searches_r_and_n) {
  static float x[T * D], y[T * D], dy[T * D], dx[T * D];
  fill(x, T * D, 7);
  fill(dy, T * D, 3);
  moe_dist *d;
  ASSERT_OK(moe_dist_init(&d, NULL, NULL));
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.D = D, cfg.H = H, cfg.E = E, cfg.threads = 1, cfg.dist = d;
  cfg.parallel_r = MOE_PARALLEL_AUTO, cfg.pipeline = 0;
  moe_layer_t l;
  ASSERT_OK(moe_layer_init(&l, &cfg));
  moe_layer_init_params(&l, 3);
  moe_layer_stats st;
  static float y1[T * D], dx1[T * D];
  ASSERT_OK(moe_layer_forward(&l, x, T, y1, NULL, &st)); /* the first trial: r = 0, n = 1 */
  ASSERT(st.pipeline == 1 && moe_layer_parallel_r(&l) == 0);
  ASSERT_OK(moe_layer_backward(&l, dy, 0.1f, 0.0f, NULL, NULL, dx1));
  int steps = 1, rs = 0, ns = 0;
  do {
    ASSERT_OK(moe_layer_forward(&l, x, T, y, NULL, &st));
    ASSERT_OK(moe_layer_backward(&l, dy, 0.1f, 0.0f, NULL, NULL, dx));
    if (memcmp(y, y1, sizeof y) || memcmp(dx, dx1, sizeof dx))
      FAIL_("step %d (r %d, n %d): y or dx differ from r = 0, n = 1", steps, moe_layer_parallel_r(&l), st.pipeline);
    ns |= 1 << st.pipeline;
    rs |= 1 << moe_layer_parallel_r(&l);
  } while (moe_layer_parallel_r_trial(&l) && ++steps < 40);
  ASSERT_EQ_INT(steps, 2 * 4 * MOE__AUTO_REPS); /* r = 0 and r = ceil(1/8) = 1, n = 1, 2, 4, 8 */
  ASSERT_EQ_INT(rs, 3);
  ASSERT_EQ_INT(ns, 0x116);
  moe_layer_setup_info info;
  ASSERT_EQ_INT(moe_layer_setup(&l, &info), 1);
  ASSERT(info.searched == 3 && info.trials == 8 && !info.trial && !*info.note);
  ASSERT_OK(moe_layer_set_parallel_r(&l, 1)); /* r fixed from now on: a dictionary of n alone */
  ASSERT_OK(moe_layer_forward(&l, x, T, y, NULL, &st));
  ASSERT_EQ_INT(moe_layer_setup(&l, &info), 1);
  ASSERT(info.searched == 2 && info.r == 1 && info.trials == 0);
  moe_layer_free(&l);
  moe_dist_finalize(d);
}

/* `moe bench --expert-parallel` prints the dictionary's entry per case, in text and JSON: on 4 ranks in
 * 2 nodes of 2, Linear and 2DH are both tried; on 2 ranks (one node) 2DH is not offered, and says so. */
TEST(auto_pipe_bench_prints_the_entry) {
  if (!test_have_mpirun()) return;
  char out[512], args[512], err[1024], text[8192];
  test_tmp_path("auto_pipe_bench.txt", out, sizeof out);
  const char *base = "bench --expert-parallel --shape 512,16,32,8,2 --dispatch dynamic --routing uniform --reps 1 "
                     "--threads 1 --pipeline auto --a2a auto";
  snprintf(args, sizeof args, "%s --ranks-per-node 2 --json", base);
  if (run_moe(TEST_MPIRUN "-np 4", args, out, err, sizeof err)) FAIL_("mpirun -np 4 moe %s: %s", args, err);
  test_read_text(out, text, sizeof text);
  /* E/W = 2 local experts: n in {1, 2}, times both algorithms: 4 trials, the bound 4 */
  if (!strstr(text, "\"setup\": {") || !strstr(text, "\"searched\": \"na2a\", \"trials\": 4, \"entries\": 1, "
                                                      "\"bound\": 4.0, \"note\": \"\"}"))
    FAIL_("4 ranks: no entry with 4 trials and nothing held back in:\n%s", text);
  snprintf(args, sizeof args, "%s", base);
  if (run_moe(TEST_MPIRUN "-np 2", args, out, err, sizeof err)) FAIL_("mpirun -np 2 moe %s: %s", args, err);
  test_read_text(out, text, sizeof text);
  if (!strstr(text, "     dictionary: entry at capacity ") || !strstr(text, "2DH not offered: one node"))
    FAIL_("2 ranks: no dictionary line saying 2DH is not offered in:\n%s", text);
  ASSERT(run_moe(NULL, "bench --a2a sideways", NULL, err, sizeof err) != 0);
  ASSERT(strstr(err, "--a2a: bad value 'sideways'"));
}

/* On each of 4 ranks in 2 nodes of 2: a layer whose dictionary chooses n and Linear or 2DH gives, at
 * every step (trials of both algorithms included), the bits of its first step (n 1, Linear), and every
 * rank holds the same entry. */
static void child_a2a(int *failed_) {
  moe_dist *d = NULL;
  ASSERT_OK(moe_dist_init(&d, NULL, NULL));
  ASSERT_EQ_INT(moe_dist_size(d), 4);
  ASSERT_OK(moe_dist_set_a2a(d, MOE_A2A_2DH, 2));
  int rank = moe_dist_rank(d);
  static float x[T * D], dy[T * D], y0[T * D], dx0[T * D], y[T * D], dx[T * D];
  fill(x, T * D, 11 + (uint64_t)rank);
  fill(dy, T * D, 23 + (uint64_t)rank);
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.D = D, cfg.H = H, cfg.E = E, cfg.threads = 1, cfg.dist = d, cfg.pipeline = 0, cfg.a2a_auto = 1;
  moe_layer_t l;
  ASSERT_OK(moe_layer_init(&l, &cfg));
  moe_layer_init_params(&l, 3);
  moe_layer_setup_info info;
  int algos = 0, step = 0;
  do {
    ASSERT_OK(moe_layer_forward(&l, x, T, step ? y : y0, NULL, NULL));
    ASSERT_OK(moe_layer_backward(&l, dy, 0.1f, 0.0f, NULL, NULL, step ? dx : dx0));
    ASSERT_EQ_INT(moe_layer_setup(&l, &info), 1);
    algos |= 1 << info.a2a;
    if (step && (memcmp(y, y0, sizeof y) || memcmp(dx, dx0, sizeof dx)))
      FAIL_("rank %d step %d (n %d, %s): y or dx differs from the first step", rank, step, info.n,
            info.a2a == MOE_A2A_2DH ? "2DH" : "Linear");
  } while (info.trial && ++step < 40);
  ASSERT_EQ_INT(algos, 3);                       /* both tried */
  ASSERT(info.trials == 4 && info.bound == 4 && !*info.note); /* n in {1, 2} (2 local experts) x 2 */
  double mine[3] = {info.n, info.a2a, info.key}, sum[3] = {info.n, info.a2a, info.key};
  ASSERT_OK(moe_dist_allreduce(d, sum, 3));
  for (int i = 0; i < 3; i++) ASSERT(sum[i] == 4 * mine[i]); /* the same entry everywhere */
  moe_layer_free(&l);
  moe_dist_finalize(d);
}

TEST(auto_pipe_a2a_same_bits_and_entry_on_every_rank) {
  if (getenv("OMPI_COMM_WORLD_SIZE")) { /* a rank */
    child_a2a(failed_);
    return;
  }
  if (!test_have_mpirun()) return;
  char cmd[1024], out[8192];
  int rc = test_mpirun_self(4, "auto_pipe_a2a_same_bits_and_entry_on_every_rank", 120, cmd, sizeof cmd, out, sizeof out);
  if (rc) FAIL_("%s: status %d, output:\n%s", cmd, rc, out);
}
