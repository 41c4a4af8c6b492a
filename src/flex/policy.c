/* The scheduler and the policy maker (P3 Algorithms 1 and 2): when the balance ratio is over the
 * threshold, replicate the slowest rank's expert with the most tokens per replica in place of a replica
 * of a cold one, as long as the cost model says the step gets faster by more than the copies cost
 * over K steps; then Migrates that shrink replica groups or move load off the slowest rank, under the
 * same rule. Every candidate is tried on a scratch copy of the table and costed with Eq. 5. */
#include <stdlib.h>

#include "flex/flex.h"

moe__flex_policy moe__flex_policy_default(void) {
  return (moe__flex_policy){.threshold = 1.2, .horizon = 10, .max_plans = 0};
}

void moe__flex_plan_free(moe__flex_plan *p) {
  free(p->ops);
  moe__flex_xfers_free(&p->xfers);
  *p = (moe__flex_plan){0};
}

/* Candidates are costed on scratch copies of the table with their transfers in xf. */
typedef struct {
  const moe__flex_table *t;
  const int64_t *Isrc;
  const moe__flex_env *env;
  const moe__flex_policy *p;
  moe__flex_table scratch;
  moe__flex_xfers xf;
  double t0, per_rank[MOE__FLEX_MAX_RANKS];
} search;

static moe_status search_begin(search *s, const moe__flex_table *t, const int64_t *Isrc, const moe__flex_env *env,
                               const moe__flex_policy *p) {
  *s = (search){.t = t, .Isrc = Isrc, .env = env, .p = p};
  MOE_TRY(p->horizon >= 1, MOE_ERR_ARG, "flex policy: horizon K=%d must be >= 1", p->horizon);
  MOE_CHECK(moe__flex_cost(t, Isrc, env, s->per_rank, &s->t0));
  return moe__flex_table_clone(&s->scratch, t);
}

static void search_end(search *s) {
  moe__flex_table_free(&s->scratch);
  moe__flex_xfers_free(&s->xf);
}

/* K (t0 - t1) - transfer time of ops applied to a fresh copy of the table. */
static moe_status gain_of(search *s, const moe__flex_op *ops, int nops, double *gain) {
  moe__flex_table_assign(&s->scratch, s->t);
  s->xf.n = 0;
  for (int i = 0; i < nops; i++) MOE_CHECK(moe__flex_apply(&s->scratch, &ops[i], &s->xf));
  double t1;
  MOE_CHECK(moe__flex_cost(&s->scratch, s->Isrc, s->env, NULL, &t1));
  *gain = s->p->horizon * (s->t0 - t1) - moe__flex_xfer_time(s->env, &s->xf, 0);
  return MOE_OK;
}

static int64_t *merged_counts(const moe__flex_table *t, const int64_t *Isrc) {
  int64_t *Ie = calloc((size_t)t->E, sizeof *Ie);
  if (Ie)
    for (int g = 0; g < t->W; g++)
      for (int e = 0; e < t->E; e++) Ie[e] += Isrc[(size_t)g * t->E + e];
  return Ie;
}

/* Whether expert a's tokens per replica are below b's (exact: cross-multiplied). */
static int cap_less(const int64_t *Ie, const moe__flex_table *t, int a, int b) {
  return Ie[a] * moe__flex_replicas(t, b) < Ie[b] * moe__flex_replicas(t, a);
}

/* The rank with the longest modelled step at the search's start (the first of equals). */
static int slowest_rank(const search *s) {
  int slow = 0;
  for (int g = 1; g < s->t->W; g++)
    if (s->per_rank[g] > s->per_rank[slow]) slow = g;
  return slow;
}

static moe_status make_plan(search *s, const int64_t *Ie, moe__flex_op ops[2], int *nops) {
  const moe__flex_table *t = s->t;
  *nops = 0;
  int slow = slowest_rank(s), e0 = -1;
  for (int e = 0; e < t->E; e++)
    if (moe__flex_count(t, e, slow) && (e0 < 0 || cap_less(Ie, t, e0, e))) e0 = e;
  if (e0 < 0 || !Ie[e0]) return MOE_OK;
  double best = 0;
  for (int e1 = 0; e1 < t->E; e1++) {
    if (e1 == e0 || moe__flex_replicas(t, e1) < 2) continue;
    for (int g = 0; g < t->W; g++) {
      /* a replica on the rank that holds all of e0's takes no load off it: the pair's gain would be
       * the Shrink's alone, paid for with a slot */
      if (!moe__flex_count(t, e1, g) || moe__flex_count(t, e0, g) == moe__flex_replicas(t, e0)) continue;
      moe__flex_op cand[2] = {{.kind = MOE__FLEX_SHRINK, .e = e1, .g = g}, {.kind = MOE__FLEX_EXPAND, .e = e0, .g = g}};
      double gain;
      MOE_CHECK(gain_of(s, cand, 2, &gain));
      if (gain > best || (*nops && gain == best && cap_less(Ie, t, e1, ops[0].e))) {
        best = gain;
        ops[0] = cand[0], ops[1] = cand[1];
        *nops = 2;
      }
    }
  }
  return MOE_OK;
}

moe_status moe__flex_make_plan(const moe__flex_table *t, const int64_t *Isrc, const moe__flex_env *env,
                               const moe__flex_policy *p, moe__flex_op ops[2], int *nops) {
  *nops = 0;
  int64_t *Ie = merged_counts(t, Isrc);
  MOE_TRY(Ie, MOE_ERR_NOMEM, "flex policy: counts of %d experts", t->E);
  search s;
  moe_status st = search_begin(&s, t, Isrc, env, p);
  if (st == MOE_OK) st = make_plan(&s, Ie, ops, nops);
  search_end(&s);
  free(Ie);
  return st;
}

/* Candidate cand costed; kept in *op when its gain beats *best. */
static void consider(search *s, const moe__flex_op *cand, double *best, moe__flex_op *op, int *found,
                     moe_status *st) {
  double gain;
  if (*st == MOE_OK && (*st = gain_of(s, cand, 1, &gain)) == MOE_OK && gain > *best)
    *best = gain, *op = *cand, *found = 1;
}

/* The Migrate with the largest positive gain among two kinds of swap: a on i (its only replica there,
 * so a's group loses i) with b on j (j also holds a) that add no rank to b's group; and, to move load
 * off the slowest rank i (which Expand and Shrink cannot do once no replica is spare), any expert a
 * there with the expert b of fewest tokens per replica on each other rank j (Ev (W - 1) candidates,
 * not E^2 W^2). *found = 0 when none pays off. */
static moe_status best_migrate(search *s, const int64_t *Ie, moe__flex_op *op, int *found) {
  const moe__flex_table *t = s->t;
  double best = 0;
  moe_status st = MOE_OK;
  *found = 0;
  for (int a = 0; a < t->E; a++)
    for (int i = 0; i < t->W; i++) {
      if (moe__flex_count(t, a, i) != 1) continue;
      for (int j = 0; j < t->W; j++) {
        if (j == i || !moe__flex_count(t, a, j)) continue;
        for (int b = 0; b < t->E; b++) {
          if (b == a || !moe__flex_count(t, b, j)) continue;
          if (!moe__flex_count(t, b, i) && moe__flex_count(t, b, j) > 1) continue;
          consider(s, &(moe__flex_op){.kind = MOE__FLEX_MIGRATE, .e = a, .g = i, .b = b, .h = j}, &best, op, found, &st);
        }
      }
    }
  int slow = slowest_rank(s);
  for (int j = 0; j < t->W; j++) {
    int b = -1;
    for (int e = 0; e < t->E; e++)
      if (j != slow && moe__flex_count(t, e, j) && !moe__flex_count(t, e, slow) && (b < 0 || cap_less(Ie, t, e, b)))
        b = e;
    for (int a = 0; b >= 0 && a < t->E; a++)
      if (moe__flex_count(t, a, slow))
        consider(s, &(moe__flex_op){.kind = MOE__FLEX_MIGRATE, .e = a, .g = slow, .b = b, .h = j}, &best, op, found, &st);
  }
  return st;
}

static moe_status record(moe__flex_table *t, moe__flex_plan *plan, const moe__flex_op *op) {
  MOE_CHECK(moe__flex_reserve((void **)&plan->ops, &plan->cap, plan->nops + 1, sizeof *plan->ops));
  plan->ops[plan->nops++] = *op;
  return moe__flex_apply(t, op, &plan->xfers);
}

static moe_status schedule(moe__flex_table *t, const int64_t *Isrc, const moe__flex_env *env,
                           const moe__flex_policy *p, const int64_t *Ie, moe__flex_plan *plan) {
  int limit = p->max_plans > 0 ? p->max_plans : t->W * t->Ev;
  plan->ratio0 = plan->ratio1 = moe__flex_balance(t, Ie);
  MOE_CHECK(moe__flex_cost(t, Isrc, env, NULL, &plan->t0));
  moe_status st = MOE_OK;
  for (int k = 0; st == MOE_OK && plan->ratio1 > p->threshold && k < limit; k++) {
    search s;
    moe__flex_op ops[2];
    int nops = 0;
    st = search_begin(&s, t, Isrc, env, p);
    if (st == MOE_OK) st = make_plan(&s, Ie, ops, &nops);
    search_end(&s);
    if (st != MOE_OK || !nops) break;
    for (int i = 0; st == MOE_OK && i < nops; i++) st = record(t, plan, &ops[i]);
    plan->ratio1 = moe__flex_balance(t, Ie);
  }
  for (int k = 0; st == MOE_OK && k < limit; k++) {
    search s;
    moe__flex_op op;
    int found = 0;
    st = search_begin(&s, t, Isrc, env, p);
    if (st == MOE_OK) st = best_migrate(&s, Ie, &op, &found);
    search_end(&s);
    if (st != MOE_OK || !found) break;
    st = record(t, plan, &op);
  }
  plan->ratio1 = moe__flex_balance(t, Ie);
  if (st == MOE_OK) st = moe__flex_cost(t, Isrc, env, NULL, &plan->t1);
  return st;
}

moe_status moe__flex_schedule(moe__flex_table *t, const int64_t *Isrc, const moe__flex_env *env,
                              const moe__flex_policy *p, moe__flex_plan *plan) {
  plan->nops = 0;
  plan->xfers.n = 0;
  int64_t *Ie = merged_counts(t, Isrc);
  MOE_TRY(Ie, MOE_ERR_NOMEM, "flex scheduler: counts of %d experts", t->E);
  moe_status st = schedule(t, Isrc, env, p, Ie, plan);
  free(Ie);
  return st;
}
