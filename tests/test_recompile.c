/* RECOMPILE: a slow trigger does not stall training while delta_launch covers it (iterations go on
 * while it runs), and stalls it when delta_launch = 0; an adjustment from the metrics of iteration j
 * takes effect exactly at iteration j + delta_launch + 1; delta_launch changes at run time. */
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "test.h"

static void sleep_ms(int ms) { nanosleep(&(struct timespec){0, ms * 1000000L}, NULL); }

typedef struct {
  int sleep_ms;
  int64_t at;          /* adjust on the first metrics of an iteration >= at */
  int64_t decided_on;  /* the iteration of the metrics the adjustment came from */
  atomic_int running;  /* 1 while the trigger sleeps */
  atomic_int calls;
} trig_ctx;

static int slow_trigger(const moe_metrics *m, moe_adjustment *out, void *user) {
  trig_ctx *c = user;
  atomic_store(&c->running, 1);
  atomic_fetch_add(&c->calls, 1);
  if (c->sleep_ms) sleep_ms(c->sleep_ms);
  atomic_store(&c->running, 0);
  if (c->decided_on < 0 && m->iter >= c->at) {
    c->decided_on = m->iter;
    out->set_capacity = 1;
    for (int e = 0; e < m->experts; e++) out->capacity[e] = 10 + e + m->counts[e];
    out->set_top_k = 1;
    out->top_k = 3;
    return 1;
  }
  return 0;
}

/* Runs `iters` iterations of `iter_ms` each; returns the iteration an adjustment arrived at (or -1)
 * and counts the iterations that ran while the trigger was running. */
static int64_t loop(moe_recompile *r, int iters, int iter_ms, trig_ctx *c, int *overlapped, int32_t *cap0) {
  int32_t counts[4] = {1, 2, 3, 4};
  int64_t got = -1;
  *overlapped = 0;
  for (int64_t i = 0; i < iters; i++) {
    const moe_adjustment *a;
    int has;
    if (moe_recompile_begin(r, i, &a, &has) != MOE_OK) return -2;
    if (has) {
      got = i;
      if (a->apply_at != i || !a->set_capacity || a->top_k != 3) return -3;
      *cap0 = a->capacity[0];
    }
    sleep_ms(iter_ms); /* the iteration's work */
    *overlapped += atomic_load(&c->running);
    moe_metrics m = {.iter = i, .loss = 1.0 / (double)(i + 1), .experts = 4, .counts = counts};
    if (moe_recompile_push(r, &m) != MOE_OK) return -4;
  }
  return got;
}

TEST(recompile_slow_trigger_does_not_stall) {
  trig_ctx c = {.sleep_ms = 25, .at = 3, .decided_on = -1};
  moe_recompile *r;
  ASSERT_OK(moe_recompile_new(&r, 4, 20, slow_trigger, &c)); /* 20 iterations of 4 ms: 80 ms of cover */
  int overlapped;
  int32_t cap0 = 0;
  int64_t got = loop(r, 50, 4, &c, &overlapped, &cap0);
  moe_recompile_stats st;
  moe_recompile_get_stats(r, &st);
  moe_recompile_free(r);
  ASSERT(got >= 0);
  ASSERT_EQ_INT(got, c.decided_on + 20 + 1); /* exactly the promised iteration */
  ASSERT_EQ_INT(cap0, 10 + 0 + 1);
  ASSERT_EQ_INT(st.stalls, 0);
  ASSERT(overlapped >= 10); /* iterations completed while the trigger ran */
  ASSERT_EQ_INT(st.adjustments, 1);
}

TEST(recompile_delta_zero_stalls) {
  trig_ctx c = {.sleep_ms = 15, .at = 2, .decided_on = -1};
  moe_recompile *r;
  ASSERT_OK(moe_recompile_new(&r, 4, 0, slow_trigger, &c));
  int overlapped;
  int32_t cap0 = 0;
  int64_t got = loop(r, 8, 1, &c, &overlapped, &cap0);
  moe_recompile_stats st;
  moe_recompile_get_stats(r, &st);
  moe_recompile_free(r);
  ASSERT_EQ_INT(got, c.decided_on + 1);
  ASSERT(st.stalls >= 5); /* each iteration waits for the trigger on the previous one's metrics */
  ASSERT(st.stall_seconds > 0.05);
}

TEST(recompile_delta_changes_at_run_time) {
  trig_ctx c = {.sleep_ms = 0, .at = 20, .decided_on = -1};
  moe_recompile *r;
  ASSERT_OK(moe_recompile_new(&r, 4, 2, slow_trigger, &c));
  ASSERT_OK(moe_recompile_set_delta(r, 5));
  int overlapped;
  int32_t cap0 = 0;
  int64_t got = loop(r, 40, 1, &c, &overlapped, &cap0);
  moe_recompile_free(r);
  ASSERT_EQ_INT(got, c.decided_on + 5 + 1);
  ASSERT_STATUS(moe_recompile_new(&r, 0, 1, slow_trigger, &c), MOE_ERR_ARG);
  ASSERT_STATUS(moe_recompile_new(&r, 4, -1, slow_trigger, &c), MOE_ERR_ARG);
}

/* Per-expert capacities: all equal to the capacity_setting's C give the same output bit for bit;
 * lower ones drop exactly the excess; changing them leaves the weights bit-identical. */
TEST(recompile_expert_capacity) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = 8; c.H = 12; c.E = 4; c.top_k = 2; c.dispatch = MOE_DISPATCH_STATIC; c.capacity_setting = 1.0f;
  c.threads = 1;
  moe_layer_t l;
  ASSERT_OK(moe_layer_init(&l, &c));
  moe_layer_init_params(&l, 2);
  float *g = moe_layer_param(&l, "gate.weight");
  for (int i = 0; i < c.E * c.D; i++) g[i] *= 4.0f;
  enum { T = 32 };
  float x[T * 8], y0[T * 8], y1[T * 8];
  for (int i = 0; i < T * 8; i++) x[i] = (float)((i * 37) % 19) / 9.5f - 1.0f;
  moe_layer_stats st;
  ASSERT_OK(moe_layer_forward(&l, x, T, y0, NULL, &st));
  int32_t C = st.capacity, counts[4];
  memcpy(counts, st.expert_counts, sizeof counts);
  float *before = malloc(l.numel * 4);
  memcpy(before, l.params, l.numel * 4);
  int32_t same[4] = {C, C, C, C};
  ASSERT_OK(moe_layer_set_expert_capacity(&l, same, 0));
  ASSERT_OK(moe_layer_forward(&l, x, T, y1, NULL, &st));
  ASSERT(!memcmp(y0, y1, sizeof y0));
  int32_t tight[4] = {1, 2, 3, 0};
  ASSERT_OK(moe_layer_set_expert_capacity(&l, tight, 0));
  ASSERT_OK(moe_layer_forward(&l, x, T, y1, NULL, &st));
  int want = 0;
  for (int e = 0; e < 4; e++) want += counts[e] > tight[e] ? counts[e] - tight[e] : 0;
  ASSERT_EQ_INT(st.dropped, want);
  ASSERT(!memcmp(before, l.params, l.numel * 4));
  int32_t bad[4] = {1, -1, 1, 1};
  ASSERT_STATUS(moe_layer_set_expert_capacity(&l, bad, 0), MOE_ERR_ARG);
  free(before);
  moe_layer_free(&l);
  /* the policy: recompile when a need outgrows its capacity or shrinks far below it */
  int32_t need[3] = {10, 0, 5}, cur[3] = {11, 1, 6}, out[3];
  ASSERT_EQ_INT(moe_dynamic_capacity(need, cur, 3, 0.1f, out), 0);
  ASSERT(out[0] == 11 && out[1] == 1 && out[2] == 6);
  need[2] = 7;
  ASSERT_EQ_INT(moe_dynamic_capacity(need, cur, 3, 0.1f, out), 1);
  ASSERT(out[0] == 11 && out[1] == 1 && out[2] == 8);
  int32_t big[3] = {40, 1, 8};
  ASSERT_EQ_INT(moe_dynamic_capacity(need, big, 3, 0.1f, out), 1); /* 40 > 10 * 1.2 + 1 */
}

/* Sample-assignment caching: feeding the router's own choices back as the cache gives the same
 * outputs and gradients bit for bit (static and dynamic); other cached experts are followed, with
 * the gate's probabilities as weights; bad caches are refused. */
TEST(recompile_cached_assignments) {
  for (int d = 0; d < 2; d++) {
    moe_layer_config c;
    moe_layer_config_default(&c);
    c.D = 8; c.H = 12; c.E = 5; c.top_k = 2; c.dispatch = (moe_dispatch)d; c.threads = 1;
    moe_layer_t l;
    ASSERT_OK(moe_layer_init(&l, &c));
    moe_layer_init_params(&l, 6);
    enum { T = 20 };
    float x[T * 8], y0[T * 8], y1[T * 8], dx0[T * 8], dx1[T * 8];
    for (int i = 0; i < T * 8; i++) x[i] = (float)((i * 29) % 23) / 11.5f - 1.0f;
    moe_layer_stats st;
    ASSERT_OK(moe_layer_forward(&l, x, T, y0, NULL, &st));
    int32_t fresh[T * 2];
    memcpy(fresh, st.fresh, sizeof fresh);
    moe_layer_zero_grad(&l);
    ASSERT_OK(moe_layer_backward(&l, y0, 0.1f, 0.0f, NULL, NULL, dx0));
    float *g0 = malloc(l.numel * 4);
    memcpy(g0, l.grads, l.numel * 4);
    ASSERT_OK(moe_layer_set_cached_experts(&l, fresh, T));
    ASSERT_OK(moe_layer_forward(&l, x, T, y1, NULL, &st));
    moe_layer_zero_grad(&l);
    ASSERT_OK(moe_layer_backward(&l, y0, 0.1f, 0.0f, NULL, NULL, dx1));
    ASSERT(!memcmp(y0, y1, sizeof y0) && !memcmp(dx0, dx1, sizeof dx0) && !memcmp(g0, l.grads, l.numel * 4));
    free(g0);
    int32_t other[T * 2];
    for (int t = 0; t < T; t++) other[t * 2] = 4, other[t * 2 + 1] = 3; /* everyone to experts 4 and 3 */
    ASSERT_OK(moe_layer_set_cached_experts(&l, other, T));
    ASSERT_OK(moe_layer_forward(&l, x, T, y1, NULL, &st));
    ASSERT_EQ_INT(st.expert_counts[4], T);
    ASSERT_EQ_INT(st.expert_counts[3], T);
    ASSERT(!memcmp(st.fresh, fresh, sizeof fresh)); /* the router's choice is still reported */
    ASSERT_OK(moe_layer_forward(&l, x, T, y1, NULL, &st)); /* one forward only: the router again */
    ASSERT(!memcmp(st.experts, fresh, sizeof fresh));
    int32_t bad[T * 2];
    memcpy(bad, fresh, sizeof bad);
    bad[3] = 7;
    ASSERT_STATUS(moe_layer_set_cached_experts(&l, bad, T), MOE_ERR_ARG);
    bad[3] = bad[2];
    ASSERT_STATUS(moe_layer_set_cached_experts(&l, bad, T), MOE_ERR_ARG);
    ASSERT_OK(moe_layer_set_cached_experts(&l, fresh, T));
    ASSERT_STATUS(moe_layer_forward(&l, x, T - 1, y1, NULL, &st), MOE_ERR_ARG);
    moe_layer_free(&l);
  }
}
