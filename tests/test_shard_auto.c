/* The adaptive r (src/shard_auto.c): Tutel's dictionary with the layer's steps as trials, on synthetic
 * step costs (no clock). It finds the cheapest r, asks for at most the trials of P2 1.7
 * ((log_1.5 ceil(W/E) + 2) * 4 * 2, here: distinct r measured), runs MOE__AUTO_REPS steps per trial,
 * and returns its cached choice without trials for capacities of the same window (floor(c / 128)). */
#include <math.h>

#include "shard.h"
#include "test.h"

/* A convex step cost over r with its minimum at r_best (r = 0 dear). */
static double step_cost(int r, int r_best) { return r == 0 ? 10.0 : 1.0 + 0.01 * (r - r_best) * (r - r_best); }

/* Steps at capacity c until one is not a trial; the trial steps it took (-1 on error). */
static int settle(moe__auto_r *a, size_t c, int r_best, int *r) {
  for (int steps = 0; steps < 2000; steps++) {
    if (moe__auto_r_pick(a, c, r) != MOE_OK) return -1;
    if (a->trial < 0) return steps;
    if (moe__auto_r_record(a, step_cost(*r, r_best)) != MOE_OK) return -1;
  }
  return -1;
}

TEST(shard_auto_r_finds_the_best_r_within_the_trial_count) {
  const struct { int W, E, best; } cases[] = {{64, 1, 23}, {64, 1, 64}, {16, 2, 1}, {8, 8, 1}, {4, 2, 2}};
  for (int i = 0; i < 5; i++) {
    moe__auto_r a;
    ASSERT_OK(moe__auto_r_init(&a, cases[i].W, cases[i].E));
    int m = (cases[i].W + cases[i].E - 1) / cases[i].E, r = -1;
    int steps = settle(&a, 1000, cases[i].best, &r);
    double bound = (log((double)m) / log(1.5) + 2) * 4 * 2;
    if (r != cases[i].best || steps < 0 || a.measured > bound || steps != a.measured * MOE__AUTO_REPS)
      FAIL_("W=%d E=%d: r %d (want %d), %d trial steps, %lld trials (bound %.1f)", cases[i].W, cases[i].E, r,
            cases[i].best, steps, (long long)a.measured, bound);
    int64_t trials = a.measured;
    int again = -1;
    ASSERT_EQ_INT(settle(&a, 1000 / 128 * 128 + 127, cases[i].best, &again), 0); /* the same window: cached */
    ASSERT_EQ_INT(again, r);
    ASSERT_EQ_INT((int)a.measured, (int)trials);
    ASSERT(settle(&a, 5000, cases[i].best, &again) > 0); /* another window: a search of its own */
    moe__auto_r_free(&a);
  }
}
