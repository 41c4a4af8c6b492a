/* The pipelining models (src/adapt/pipe_model.h): MPipeMoE's memory model against hand values and its
 * worked example, the pools the layer's buffers must match, the Eq. 10 strategy selector in Fig. 13's
 * regimes, Algorithm 1 (cache, range reuse on sweeps, brute force on a monotone cost, no overlapping
 * ranges on a non-monotone one) and Tutel's dictionary (buckets, trial counts, brute force). */
#include <stdlib.h>

#include "adapt/pipe_model.h"
#include "test.h"

/* ---- memory model ---- */

/* P4's worked example: M = 1024, H = 4096, B = 16384, one local expert, gate left out. */
static const moe__mem_shape example = {.B = 16384, .M = 1024, .H = 4096, .gate_experts = 0, .local_experts = 1};

TEST(pipe_mem_equations_by_hand) {
  ASSERT_NEAR(moe__mem_states(&example), 33554432.0, 0);   /* 4 * 2 H M */
  ASSERT_NEAR(moe__mem_act(&example), 134217728.0, 0);     /* 4 B M + B H = 64 Mi + 64 Mi */
  ASSERT_NEAR(moe__mem_buf(&example), 83886080.0, 0);      /* B M + B H */
  ASSERT_NEAR(moe__mem_buf_pipe(&example), 100663296.0, 0); /* 2 B M + B H */
  moe__mem_shape gated = example;
  gated.gate_experts = 64, gated.local_experts = 2;
  ASSERT_NEAR(moe__mem_states(&gated), 4.0 * (64 * 1024 + 2 * 2 * 4096.0 * 1024), 0);
}

TEST(pipe_mem_worked_example_phi) {
  /* Text: 2BM (1 - 2/4) + BH (1 - 1/4) = 16 Mi + 48 Mi; uniform: (2BM + BH)(1 - 2/4) = 48 Mi. */
  ASSERT_NEAR(moe__mem_saved(&example, 4, moe__bufs_text), 67108864.0, 0);
  ASSERT_NEAR(moe__mem_saved(&example, 4, moe__bufs_uniform), 50331648.0, 0);
  ASSERT_NEAR(moe__mem_phi(&example, 4, moe__bufs_text), 0.50, 1e-15);
  ASSERT_NEAR(moe__mem_phi(&example, 4, moe__bufs_uniform), 0.375, 1e-15);
  /* n = 1 saves nothing; n = 2 saves only T_M's half under the text's buffers. */
  ASSERT_NEAR(moe__mem_saved(&example, 1, moe__bufs_text), 0, 0);
  ASSERT_NEAR(moe__mem_saved(&example, 1, moe__bufs_uniform), 0, 0);
  ASSERT_NEAR(moe__mem_saved(&example, 2, moe__bufs_text), 16384.0 * 4096 / 2, 0);
  ASSERT_NEAR(moe__mem_saved(&example, 2, moe__bufs_uniform), 0, 0);
}

TEST(pipe_split_parts) {
  /* ceil(count / n) per part, the last ones smaller: 5 in 4 -> 2 2 1 0; 1 in 4 -> 1 0 0 0. */
  const size_t want5[4] = {2, 2, 1, 0}, want1[4] = {1, 0, 0, 0};
  for (int i = 0; i < 4; i++) {
    ASSERT_EQ_INT(moe__pipe_part(5, 4, i), want5[i]);
    ASSERT_EQ_INT(moe__pipe_part(1, 4, i), want1[i]);
    ASSERT_EQ_INT(moe__pipe_part(0, 4, i), 0);
  }
  for (size_t count = 0; count < 40; count++)
    for (int n = 1; n <= 9; n++) {
      size_t sum = 0;
      for (int i = 0; i < n; i++) {
        sum += moe__pipe_part(count, n, i);
        if (i) ASSERT(moe__pipe_part(count, n, i) <= moe__pipe_part(count, n, i - 1));
      }
      if (sum != count) FAIL_("count %zu in %d parts sums to %zu", count, n, sum);
    }
  const size_t counts[4] = {5, 3, 0, 1}; /* per source: largest parts 2 + 1 + 0 + 1 */
  ASSERT_EQ_INT(moe__pipe_rows_max(counts, 4, 4), 4);
  ASSERT_EQ_INT(moe__pipe_rows_max(counts, 4, 1), 9);
}

TEST(pipe_pools_match_the_model) {
  const size_t B = 16384, M = 1024, H = 4096, elem = 4;
  moe__pools p;
  ASSERT_OK(moe__pipe_pools(B, B / 4, M, H, 4, MOE__REUSE_S4, elem, &p));
  ASSERT_EQ_INT(p.di, 2 * 4096 * 1024 * 4); /* two buffers of B/n rows */
  ASSERT_EQ_INT(p.m, 4096 * 4096 * 4);      /* one */
  ASSERT_EQ_INT(p.dout, 2 * 4096 * 1024 * 4);
  /* Without reuse every partition stays, whatever n. */
  ASSERT_OK(moe__pipe_pools(B, B / 4, M, H, 4, MOE__REUSE_NONE, elem, &p));
  ASSERT_EQ_INT(p.di, B * M * elem);
  ASSERT_EQ_INT(p.m, B * H * elem);
  ASSERT_EQ_INT(p.dout, B * M * elem);
  /* With reuse and n dividing B, the pools are Eq. 4's activations less Eq. 5's saving (text buffers). */
  for (int n = 1; n <= 16; n *= 2)
    for (int s = MOE__REUSE_S1; s <= MOE__REUSE_S4; s++) {
      ASSERT_OK(moe__pipe_pools(B, B / (size_t)n, M, H, n, (moe__reuse)s, elem, &p));
      double model = moe__mem_buf_pipe(&example) - moe__mem_saved(&example, n, moe__bufs_text);
      if ((double)(p.di + p.m + p.dout) != model * (double)elem)
        FAIL_("n %d, %s: pools %zu + %zu + %zu bytes, model %.0f", n, moe__reuse_names[s], p.di, p.m, p.dout,
              model * (double)elem);
    }
  /* Uneven splits: the largest micro-batch sizes the buffers. */
  ASSERT_OK(moe__pipe_pools(9, 4, 8, 32, 4, MOE__REUSE_S4, 2, &p));
  ASSERT_EQ_INT(p.di, 2 * 4 * 8 * 2);
  ASSERT_EQ_INT(p.m, 4 * 32 * 2);
  ASSERT_EQ_INT(p.dout, 2 * 4 * 8 * 2);
  ASSERT_OK(moe__pipe_pools(0, 0, 8, 32, 4, MOE__REUSE_S4, 2, &p)); /* a rank that received nothing */
  ASSERT_EQ_INT(p.di + p.m + p.dout, 0);
  ASSERT_STATUS(moe__pipe_pools(9, 2, 8, 32, 4, MOE__REUSE_S4, 2, &p), MOE_ERR_ARG); /* 4 x 2 < 9 rows */
  ASSERT_STATUS(moe__pipe_pools(9, 9, 8, 32, 0, MOE__REUSE_S4, 2, &p), MOE_ERR_ARG);
  ASSERT_STATUS(moe__pipe_pools(SIZE_MAX / 2, SIZE_MAX / 2, 8, 32, 1, MOE__REUSE_NONE, 2, &p), MOE_ERR_VALUE);
  ASSERT(strstr(moe_last_error(), "T_DI"));
}

/* ---- strategy selector (Eq. 10) ---- */

/* b = 4096, M = 1024, H = 4096: v0_comp = 2^34 multiply-adds, v0_comm = v0_mem = 2^22 elements. Speeds
 * are given in units of those, so one GEMM takes 1 s and the hand costs below are short sums. */
static const double b0 = 4096, M0 = 1024, H0 = 4096, V_COMP = 17179869184.0, V_COMM = 4194304.0;
/* Communication slowed by host copies on the same links (PCIe) far more than by GEMMs, as P4's Fig. 13
 * discussion says; mu_all < 2/3 mu_comp is what lets re-communication (S4) beat S1/S3's 2 all-to-alls. */
static const moe__interference fig13 = {.sigma = 1, .mu_comp = 0.9, .mu_all = 0.5, .eta_all = 0.8};
#define REUSING (MOE__REUSE_ALL & ~MOE__REUSE_BIT(MOE__REUSE_NONE))

static double cost_of(moe__reuse s, const moe__speeds *w, const moe__interference *f) {
  double c = -1;
  if (moe__reuse_cost(s, b0, M0, H0, w, f, &c) != MOE_OK) return -1;
  return c;
}

TEST(pipe_select_compute_bound_small_n) {
  /* Fast all-to-all (few GPUs): a GEMM 1 s, an all-to-all or a copy 1/8 s. Every strategy is
   * compute-bound: 2 + 4 GEMMs for none, S1, S2; 2 + 5 with recomputation (S3, S4). */
  moe__speeds w = {.comp = V_COMP, .comm = 8 * V_COMM, .mem = 8 * V_COMM};
  moe__reuse s;
  double c;
  ASSERT_OK(moe__reuse_select(REUSING, b0, M0, H0, &w, &fig13, &s, &c));
  ASSERT_EQ_INT(s, MOE__REUSE_S1); /* tied with S2, the lower strategy kept */
  ASSERT_NEAR(c, 6.0, 1e-12);
  ASSERT_NEAR(cost_of(MOE__REUSE_S2, &w, &fig13), 6.0, 1e-12);
  ASSERT_NEAR(cost_of(MOE__REUSE_S3, &w, &fig13), 7.0, 1e-12);
  ASSERT_NEAR(cost_of(MOE__REUSE_S4, &w, &fig13), 7.0, 1e-12);
  ASSERT_OK(moe__reuse_select(MOE__REUSE_BIT(MOE__REUSE_S2) | MOE__REUSE_BIT(MOE__REUSE_S4), b0, M0, H0, &w,
                              &fig13, &s, &c));
  ASSERT_EQ_INT(s, MOE__REUSE_S2);
}

TEST(pipe_select_a2a_bound_large_n) {
  /* Slow all-to-all (many GPUs): 4 s each, a GEMM 1 s, a copy 1/8 s. S1: 2*4/0.5 = 16 per pass; S2: 16 +
   * 3*4/0.5 = 24; S3: 16 + 16; S4: 2*4/0.9 + 3*4/0.9 = 200/9. */
  moe__speeds w = {.comp = V_COMP, .comm = V_COMM / 4, .mem = 8 * V_COMM};
  moe__reuse s;
  double c;
  ASSERT_OK(moe__reuse_select(REUSING, b0, M0, H0, &w, &fig13, &s, &c));
  ASSERT_EQ_INT(s, MOE__REUSE_S4);
  ASSERT_NEAR(c, 200.0 / 9, 1e-12);
  ASSERT_NEAR(cost_of(MOE__REUSE_S1, &w, &fig13), 32.0, 1e-12);
  ASSERT_NEAR(cost_of(MOE__REUSE_S2, &w, &fig13), 40.0, 1e-12);
  ASSERT_NEAR(cost_of(MOE__REUSE_S3, &w, &fig13), 32.0, 1e-12);
  /* With the digest's defaults (mu_all = mu_comp = 0.8) the extra all-to-all is never hidden: S1 and S3
   * at 2*4/0.8 * 2 = 20 beat S4's (2 + 3) * 4/0.8 = 25. */
  moe__interference d = moe__interference_default();
  ASSERT_OK(moe__reuse_select(REUSING, b0, M0, H0, &w, &d, &s, &c));
  ASSERT_EQ_INT(s, MOE__REUSE_S1);
  ASSERT_NEAR(c, 20.0, 1e-12);
  ASSERT_NEAR(cost_of(MOE__REUSE_S4, &w, &d), 25.0, 1e-12);
}

TEST(pipe_select_cpu_strategies) {
  /* On a CPU only none and S4 apply, and W_mem is never measured: none restores nothing at S4's
   * interference, so it wins every regime; S4 is what remains when the memory must be saved. */
  const moe__speeds regimes[3] = {{.comp = V_COMP, .comm = 8 * V_COMM, .mem = 0},
                                  {.comp = V_COMP, .comm = V_COMM / 4, .mem = 0},
                                  {.comp = V_COMP / 16, .comm = V_COMM, .mem = 0}};
  for (int i = 0; i < 3; i++) {
    moe__reuse s;
    double c, c4;
    ASSERT_OK(moe__reuse_select(MOE__REUSE_CPU, b0, M0, H0, &regimes[i], &fig13, &s, &c));
    ASSERT_EQ_INT(s, MOE__REUSE_NONE);
    ASSERT_OK(moe__reuse_select(MOE__REUSE_BIT(MOE__REUSE_S4), b0, M0, H0, &regimes[i], &fig13, &s, &c4));
    ASSERT_EQ_INT(s, MOE__REUSE_S4);
    ASSERT(c4 > c);
  }
  /* Compute-bound (GEMM 16 s, all-to-all 1/0.9 s): none 2*16 + 4*16, S4 2*16 + 5*16. */
  ASSERT_NEAR(cost_of(MOE__REUSE_NONE, &regimes[2], &fig13), 96.0, 1e-12);
  ASSERT_NEAR(cost_of(MOE__REUSE_S4, &regimes[2], &fig13), 112.0, 1e-12);
}

TEST(pipe_select_errors) {
  moe__speeds w = {.comp = V_COMP, .comm = V_COMM, .mem = 0};
  moe__interference f = moe__interference_default();
  ASSERT_NEAR(f.sigma, 1.0, 0);
  ASSERT_NEAR(f.mu_comp, 0.8, 0);
  ASSERT_NEAR(f.mu_all, 0.8, 0);
  ASSERT_NEAR(f.eta_all, 0.8, 0);
  moe__reuse s;
  ASSERT_STATUS(moe__reuse_select(0, b0, M0, H0, &w, &f, &s, NULL), MOE_ERR_ARG);
  ASSERT_STATUS(moe__reuse_select(1u << 7, b0, M0, H0, &w, &f, &s, NULL), MOE_ERR_ARG);
  ASSERT_STATUS(moe__reuse_select(REUSING, b0, M0, H0, &w, &f, &s, NULL), MOE_ERR_VALUE); /* S1 copies */
  ASSERT(strstr(moe_last_error(), "s1") && strstr(moe_last_error(), "W_mem"));
  f.mu_all = 1.5;
  ASSERT_STATUS(moe__reuse_select(MOE__REUSE_CPU, b0, M0, H0, &w, &f, &s, NULL), MOE_ERR_VALUE);
  ASSERT(strstr(moe_last_error(), "mu_all 1.5"));
  f = moe__interference_default();
  w.comm = NAN;
  ASSERT_STATUS(moe__reuse_select(MOE__REUSE_CPU, b0, M0, H0, &w, &f, &s, NULL), MOE_ERR_VALUE);
}

/* ---- adaptive granularity (Algorithm 1) ---- */

/* A pipelined step of B tokens in n micro-batches of b = B/n: each micro-batch has two all-to-alls of
 * 17 + 0.013 b and a GEMM of 3 + 0.021 b; the first runs alone, the other n - 1 overlap, paced by the
 * slower stream. Its best n over {1, 2, 4, 8, 16} rises with B: 2 from B = 3239, 4 from 12953, 8 from
 * 51810, 16 from 207239. */
static double pipelined_step(size_t B, int n) {
  double b = (double)B / n, comm = 17 + 0.013 * b, comp = 3 + 0.021 * b;
  return 2 * comm + comp + (n - 1) * fmax(2 * comm, comp);
}

typedef struct {
  int64_t calls;
  double (*fn)(size_t B, int n);
  int fail_at; /* n whose trial fails; 0: none */
} gran_probe;

static moe_status probe_cost(void *user, size_t B, int n, double *seconds) {
  gran_probe *p = user;
  p->calls++;
  if (n == p->fail_at) return moe__error(MOE_ERR_IO, __FILE__, __LINE__, "trial run failed");
  *seconds = p->fn(B, n);
  return MOE_OK;
}

static int brute_force(double (*fn)(size_t, int), size_t B) {
  static const int cand[5] = {1, 2, 4, 8, 16};
  int best = 0;
  for (int i = 1; i < 5; i++)
    if (fn(B, cand[i]) < fn(B, cand[best])) best = i;
  return cand[best];
}

/* The ranges are sorted, disjoint and one per n. */
static int ranges_ok(const moe__gran *g) {
  for (int i = 0; i < g->nranges; i++) {
    if (g->ranges[i].lo > g->ranges[i].hi || (i && g->ranges[i - 1].hi >= g->ranges[i].lo)) return 0;
    for (int j = 0; j < i; j++)
      if (g->ranges[j].n == g->ranges[i].n) return 0;
  }
  return 1;
}

TEST(pipe_gran_cached_and_ranges) {
  gran_probe p = {.fn = pipelined_step};
  moe__gran g;
  int n;
  ASSERT_OK(moe__gran_init(&g, NULL, 0, probe_cost, &p));
  ASSERT_OK(moe__gran_get(&g, 20000, &n));
  ASSERT_EQ_INT(n, 4);
  ASSERT_EQ_INT(g.searches, 1);
  ASSERT_EQ_INT(p.calls, 5); /* one trial per candidate */
  ASSERT_OK(moe__gran_get(&g, 20000, &n)); /* the cache: no trial */
  ASSERT_EQ_INT(n, 4);
  ASSERT_EQ_INT(p.calls, 5);
  ASSERT_OK(moe__gran_get(&g, 40000, &n)); /* n = 4 again: its range widens to [20000, 40000] */
  ASSERT_EQ_INT(n, 4);
  ASSERT_EQ_INT(g.nranges, 1);
  ASSERT_EQ_INT(g.ranges[0].lo, 20000);
  ASSERT_EQ_INT(g.ranges[0].hi, 40000);
  ASSERT_OK(moe__gran_get(&g, 31234, &n)); /* inside the range: no search */
  ASSERT_EQ_INT(n, 4);
  ASSERT_EQ_INT(g.searches, 2);
  ASSERT_EQ_INT(p.calls, 10);
  ASSERT_EQ_INT(g.trials, 10);
  moe__gran_free(&g);
}

TEST(pipe_gran_equals_brute_force) {
  gran_probe p = {.fn = pipelined_step};
  moe__gran g;
  ASSERT_OK(moe__gran_init(&g, NULL, 0, probe_cost, &p));
  uint64_t seed = 7;
  for (int q = 0; q < 3000; q++) {
    size_t B = 1 + (size_t)(moe__splitmix(&seed) % 300000);
    int n, want = brute_force(pipelined_step, B);
    ASSERT_OK(moe__gran_get(&g, B, &n));
    if (n != want) FAIL_("query %d: B = %zu gives n = %d, brute force %d", q, B, n, want);
  }
  ASSERT(ranges_ok(&g));
  ASSERT_EQ_INT(g.nranges, 5);
  ASSERT_EQ_INT(g.conflicts, 0);
  /* Random sizes fill the ranges fast: later queries mostly fall inside them. */
  ASSERT(g.searches < 300);
  moe__gran_free(&g);
}

TEST(pipe_gran_sweeps_bounded) {
  /* Algorithm 1 searches every size outside the ranges, so a first upward sweep over new sizes searches
   * each one (a new largest size is never inside a range). What it learns are the ranges: one per n,
   * each the hull of the sizes it won. A later monotone sweep over other sizes inside that span then
   * searches only the sizes in the gaps between ranges: here one per boundary crossed, within the bound
   * distinct n + boundaries crossed. */
  gran_probe p = {.fn = pipelined_step};
  moe__gran g;
  int n;
  ASSERT_OK(moe__gran_init(&g, NULL, 0, probe_cost, &p));
  for (size_t B = 1000; B <= 300000; B += 1000) ASSERT_OK(moe__gran_get(&g, B, &n));
  ASSERT_EQ_INT(g.searches, 300);
  const moe__gran_range want[5] = {
      {1000, 3000, 1}, {4000, 12000, 2}, {13000, 51000, 4}, {52000, 207000, 8}, {208000, 300000, 16}};
  ASSERT_EQ_INT(g.nranges, 5);
  for (int i = 0; i < 5; i++)
    if (g.ranges[i].lo != want[i].lo || g.ranges[i].hi != want[i].hi || g.ranges[i].n != want[i].n)
      FAIL_("range %d: [%zu, %zu] -> %d, want [%zu, %zu] -> %d", i, g.ranges[i].lo, g.ranges[i].hi,
            g.ranges[i].n, want[i].lo, want[i].hi, want[i].n);
  int64_t before = g.searches, boundaries = 0;
  int last = 0;
  for (size_t B = 1500; B < 300000; B += 1000) {
    ASSERT_OK(moe__gran_get(&g, B, &n));
    ASSERT_EQ_INT(n, brute_force(pipelined_step, B));
    boundaries += last && n != last;
    last = n;
  }
  ASSERT_EQ_INT(boundaries, 4);
  ASSERT_EQ_INT(g.searches - before, boundaries);
  ASSERT(g.searches - before <= 5 + boundaries);
  /* Downward over yet other sizes: the gaps have narrowed to 500 tokens around 3239, 12953, 51810, 207239,
   * and of the sizes 1000k + 250 and 1000k + 750 only 3250, 12750, 51750 and 207250 fall into them. */
  before = g.searches;
  for (size_t B = 299750; B > 1000; B -= 500) {
    ASSERT_OK(moe__gran_get(&g, B, &n));
    ASSERT_EQ_INT(n, brute_force(pipelined_step, B));
  }
  ASSERT_EQ_INT(g.searches - before, 4);
  ASSERT(ranges_ok(&g));
  moe__gran_free(&g);
}

/* Best n 4 below 100 tokens, 2 for 100-199, 4 again from 200: not monotone. */
static double valley(size_t B, int n) {
  int want = B < 100 ? 4 : B < 200 ? 2 : 4;
  return 1.0 + abs(n - want);
}

TEST(pipe_gran_non_monotone_no_overlap) {
  gran_probe p = {.fn = valley};
  moe__gran g;
  int n;
  const int cand[3] = {1, 2, 4};
  ASSERT_OK(moe__gran_init(&g, cand, 3, probe_cost, &p));
  const size_t sizes[] = {50, 150, 300, 300, 60, 55, 120, 250, 130};
  const int64_t conflicts[] = {0, 0, 1, 1, 1, 1, 1, 2, 2}; /* 300 and 250 would swallow 2's range */
  const int64_t searches[] = {1, 2, 3, 3, 4, 4, 5, 6, 6};  /* 300 again: cache; 55, 130: in a range */
  for (int i = 0; i < 9; i++) {
    ASSERT_OK(moe__gran_get(&g, sizes[i], &n));
    if (n != (sizes[i] >= 100 && sizes[i] < 200 ? 2 : 4) || g.conflicts != conflicts[i] ||
        g.searches != searches[i] || !ranges_ok(&g))
      FAIL_("B = %zu: n %d, conflicts %lld, searches %lld, ranges ok %d", sizes[i], n, (long long)g.conflicts,
            (long long)g.searches, ranges_ok(&g));
  }
  ASSERT_EQ_INT(g.nranges, 2);
  ASSERT_EQ_INT(g.ranges[0].lo, 50);
  ASSERT_EQ_INT(g.ranges[0].hi, 60);
  ASSERT_EQ_INT(g.ranges[0].n, 4);
  ASSERT_EQ_INT(g.ranges[1].lo, 120);
  ASSERT_EQ_INT(g.ranges[1].hi, 150);
  ASSERT_EQ_INT(g.ranges[1].n, 2);
  moe__gran_free(&g);
}

TEST(pipe_gran_errors) {
  gran_probe p = {.fn = pipelined_step, .fail_at = 8};
  moe__gran g;
  int n;
  const int bad[3] = {1, 4, 2};
  ASSERT_STATUS(moe__gran_init(&g, bad, 3, probe_cost, &p), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "n[2] = 2"));
  ASSERT_STATUS(moe__gran_init(&g, bad, 0, probe_cost, &p), MOE_ERR_ARG);
  ASSERT_STATUS(moe__gran_init(&g, NULL, 0, NULL, &p), MOE_ERR_ARG);
  ASSERT_OK(moe__gran_init(&g, NULL, 0, probe_cost, &p));
  ASSERT_STATUS(moe__gran_get(&g, 5000, &n), MOE_ERR_IO);
  ASSERT(strstr(moe_last_error(), "B = 5000, n = 8: trial run failed"));
  ASSERT_EQ_INT(g.nranges, 0); /* a failed search remembers nothing */
  moe__gran_free(&g);
}

/* ---- Tutel's dictionary ---- */

/* A step's cost: convex in r >= 1 with its minimum at r_best, DP (r = 0) best from capacity 1500,
 * pipelining paying more at larger capacity, 2DH cheaper for small messages and Linear for large ones. */
typedef struct {
  int64_t calls;
  double r_best;
} setup_probe;

static double setup_cost(const setup_probe *p, size_t c, const moe__setup *s) {
  double a2a = (double)c / s->d * (s->a == MOE__A2A_LINEAR ? 1.0 : 1.25) + s->d * (s->a == MOE__A2A_LINEAR ? 40 : 12);
  if (s->r == 0) return a2a + 0.3 * (double)c + 300;
  return a2a + 0.5 * (double)c + 7 * (s->r - p->r_best) * (s->r - p->r_best);
}

static moe_status setup_trial(void *user, size_t c, const moe__setup *s, double *seconds) {
  setup_probe *p = user;
  p->calls++;
  *seconds = setup_cost(p, c, s);
  return MOE_OK;
}

TEST(pipe_dict_buckets_and_brute_force) {
  setup_probe p = {.r_best = 3.3};
  moe__setup_dict t;
  moe__setup s, s2;
  ASSERT_OK(moe__setup_dict_init(&t, 64, 8, 1, 0, setup_trial, &p)); /* W/E = 8, R = 128 */
  ASSERT_EQ_INT(t.window, 128);
  ASSERT_OK(moe__setup_dict_get(&t, 300, &s));
  int64_t first = p.calls;
  ASSERT_EQ_INT(first, t.trials);
  ASSERT_OK(moe__setup_dict_get(&t, 383, &s2)); /* floor(383 / 128) = floor(300 / 128): no trial */
  ASSERT_EQ_INT(p.calls, first);
  ASSERT(s2.r == s.r && s2.d == s.d && s2.a == s.a);
  ASSERT_OK(moe__setup_dict_get(&t, 384, &s2)); /* the next bucket */
  ASSERT_EQ_INT(p.calls, 2 * first);
  moe__setup_dict_free(&t);
  /* Each bucket's setup is the brute-force best over r in [0, 8], d in {1, 2, 4, 8}, both algorithms,
   * with the best r >= 1 inside the searched range, at its end (r_best 7.6 -> 8) and at its start. */
  const size_t caps[] = {10, 300, 900, 2000, 5000, 40000};
  const double r_best[] = {3.3, 7.6, 1.2};
  for (int k = 0; k < 3; k++) {
    p.r_best = r_best[k];
    ASSERT_OK(moe__setup_dict_init(&t, 64, 8, 1, 0, setup_trial, &p));
    t.margin = 0; /* the exact argmin (the margin has its own test) */
    for (int i = 0; i < 6; i++) {
      moe__setup best = {0}, got;
      double cbest = INFINITY;
      for (int d = 1; d <= 8; d *= 2)
        for (int a = 0; a < 2; a++)
          for (int r = 0; r <= 8; r++) {
            moe__setup x = {.r = r, .d = d, .a = (moe__a2a)a};
            if (setup_cost(&p, caps[i], &x) < cbest) cbest = setup_cost(&p, caps[i], &x), best = x;
          }
      ASSERT_OK(moe__setup_dict_get(&t, caps[i], &got));
      if (got.r != best.r || got.d != best.d || got.a != best.a)
        FAIL_("r_best %g, capacity %zu: (r %d, d %d, a %d), brute force (r %d, d %d, a %d)", r_best[k], caps[i],
              got.r, got.d, got.a, best.r, best.d, best.a);
    }
    if (k == 0) {
      ASSERT_OK(moe__setup_dict_get(&t, 10, &s)); /* small capacity: no pipelining, 2DH */
      ASSERT(s.r == 3 && s.d == 1 && s.a == MOE__A2A_2DH);
      ASSERT_OK(moe__setup_dict_get(&t, 300, &s));
      ASSERT(s.r == 3 && s.d == 4 && s.a == MOE__A2A_2DH);
      ASSERT_OK(moe__setup_dict_get(&t, 40000, &s)); /* large: DP, degree 8 over Linear */
      ASSERT(s.r == 0 && s.d == 8 && s.a == MOE__A2A_LINEAR);
    }
    if (k == 1) {
      ASSERT_OK(moe__setup_dict_get(&t, 300, &s));
      ASSERT_EQ_INT(s.r, 8);
    }
    moe__setup_dict_free(&t);
  }
}

/* Degree 2 at 2% below degree 1's cost does not replace it (within the default 3% margin), at 5%
 * below it does; degrees 4 and 8 cost more. */
typedef struct {
  double gain;
} margin_probe;

static moe_status margin_trial(void *user, size_t c, const moe__setup *s, double *seconds) {
  (void)c;
  double g = ((margin_probe *)user)->gain;
  *seconds = s->d == 1 ? 1.0 : s->d == 2 ? 1.0 - g : 2.0;
  return MOE_OK;
}

TEST(pipe_dict_margin_keeps_the_simpler_setup) {
  const double gain[2] = {0.02, 0.05};
  const int want[2] = {1, 2};
  for (int i = 0; i < 2; i++) {
    margin_probe p = {gain[i]};
    moe__setup_dict t;
    moe__setup s;
    const moe__a2a lin = MOE__A2A_LINEAR;
    ASSERT_OK(moe__setup_dict_init(&t, 2, 2, 0, 128, margin_trial, &p));
    ASSERT_NEAR(t.margin, 0.03, 0);
    ASSERT_OK(moe__setup_dict_limit(&t, (const int[]){1, 2, 4, 8}, 4, &lin, 1));
    ASSERT_OK(moe__setup_dict_get(&t, 500, &s));
    if (s.d != want[i]) FAIL_("degree 2 at %.0f%% below degree 1: chose degree %d, want %d", 100 * gain[i], s.d, want[i]);
    moe__setup_dict_free(&t);
  }
}

TEST(pipe_dict_trial_counts) {
  /* Trials per key against the paper's (log_1.5 ceil(W/E) + 2) * 4 * 2 = 16, 57.0, 98.1, 125.5 for
   * W/E = 1, 8, 64, 256. Fibonacci search costs one trial per step (2 for the first) over F_k - 1 >= r
   * points, r = 1..ceil(W/E) - 1, fewer where probes fall past the end: 4, 9 and 12 trials for 7, 63
   * and 255 points with the minimum near r = 3, plus r = 0 and r = W/E, so 16, 48, 88, 112 per key. */
  const int ratio[4] = {1, 8, 64, 256};
  const int64_t want[4] = {16, 48, 88, 112};
  for (int i = 0; i < 4; i++) {
    setup_probe p = {.r_best = 3.3};
    moe__setup_dict t;
    moe__setup s;
    ASSERT_OK(moe__setup_dict_init(&t, 4 * ratio[i], 4, 1, 128, setup_trial, &p));
    ASSERT_OK(moe__setup_dict_get(&t, 1000, &s));
    double paper = (log((double)ratio[i]) / log(1.5) + 2) * 8;
    if (t.trials != want[i] || t.trials > paper + 1e-9)
      FAIL_("W/E = %d: %lld trials, want %lld (paper %.1f)", ratio[i], (long long)t.trials, (long long)want[i],
            paper);
    ASSERT_EQ_INT(s.r, ratio[i] == 1 ? 1 : 3);
    moe__setup_dict_free(&t);
  }
  /* Without the search over r (a layer with one parallel flow): 4 degrees x 2 algorithms. */
  setup_probe p = {.r_best = 3.3};
  moe__setup_dict t;
  moe__setup s;
  ASSERT_OK(moe__setup_dict_init(&t, 64, 8, 0, 128, setup_trial, &p));
  ASSERT_OK(moe__setup_dict_get(&t, 1000, &s));
  ASSERT_EQ_INT(t.trials, 8);
  ASSERT_EQ_INT(s.r, 1);
  moe__setup_dict_free(&t);
  ASSERT_STATUS(moe__setup_dict_init(&t, 0, 8, 1, 128, setup_trial, &p), MOE_ERR_ARG);
}

/* The layer's strategies on a CPU (moe_reuse order none, S4, S2, S3), offloading free: with GEMMs of
 * g seconds and exchanges of c seconds for one micro-batch's b x M (interfered at 0.8), forward costs
 * max(2g, 2c) for all; backward none max(4g, 2c), S2 max(4g, 3c), S3 max(5g, 2c), S4 max(5g, 3c). */
TEST(pipe_reuse_costs_cpu) {
  const struct { double g, c, want[4]; } cases[] = {
      {1, 10, {40, 50, 50, 40}}, /* exchange-bound: re-communicating costs, recomputing hides */
      {10, 1, {60, 70, 60, 70}}, /* compute-bound: the other way round */
  };
  for (int i = 0; i < 2; i++) {
    double cost[4];
    ASSERT_OK(moe__reuse_costs_cpu(1, 1, 1, 1 / cases[i].g, 1 / (0.8 * cases[i].c), cost));
    for (int r = 0; r < 4; r++)
      if (fabs(cost[r] - cases[i].want[r]) > 1e-9)
        FAIL_("g %g c %g: %s costs %.12g, want %g", cases[i].g, cases[i].c, moe_reuse_name((moe_reuse)r), cost[r],
              cases[i].want[r]);
  }
  double cost[4]; /* one process: nothing moves, so S2 costs what none does and S4 what S3 does */
  ASSERT_OK(moe__reuse_costs_cpu(1, 1, 1, 0.1, INFINITY, cost));
  ASSERT_NEAR(cost[MOE_REUSE_S2], cost[MOE_REUSE_NONE], 1e-9);
  ASSERT_NEAR(cost[MOE_REUSE_S4], cost[MOE_REUSE_S3], 1e-9);
  ASSERT(cost[MOE_REUSE_S3] > cost[MOE_REUSE_NONE]);
}
