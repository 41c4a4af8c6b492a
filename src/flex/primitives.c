/* Expand, Shrink and Migrate (P3 1.2) as table operations that return the state copies the transport
 * must make: weights and optimizer state of one expert per transfer, point to point. */
#include <stdlib.h>

#include "flex/flex.h"

void moe__flex_xfers_free(moe__flex_xfers *l) {
  free(l->x);
  *l = (moe__flex_xfers){0};
}

static moe_status push(moe__flex_xfers *l, int src, int dst, int e, size_t bytes) {
  MOE_CHECK(moe__flex_reserve((void **)&l->x, &l->cap, l->n + 1, sizeof *l->x));
  l->x[l->n++] = (moe__flex_xfer){.src = src, .dst = dst, .expert = e, .bytes = bytes};
  return MOE_OK;
}

static moe_status check_expert_rank(const moe__flex_table *t, const char *op, int e, int g) {
  MOE_TRY(e >= 0 && e < t->E, MOE_ERR_ARG, "flex %s: expert %d not in [0, %d)", op, e, t->E);
  MOE_TRY(g >= 0 && g < t->W, MOE_ERR_ARG, "flex %s: rank %d not in [0, %d)", op, g, t->W);
  return MOE_OK;
}

/* The last slot of rank g holding e (-1 for a free slot), or -1 if none. */
static int find_slot(const moe__flex_table *t, int g, int e) {
  for (int s = t->Ev - 1; s >= 0; s--)
    if (t->slot[g * t->Ev + s] == e) return g * t->Ev + s;
  return -1;
}

static void set_slot(moe__flex_table *t, int i, int e) {
  int g = i / t->Ev, old = t->slot[i];
  if (old >= 0) t->n[(size_t)old * t->W + g]--;
  if (e >= 0) t->n[(size_t)e * t->W + g]++;
  t->slot[i] = e;
}

moe_status moe__flex_expand(moe__flex_table *t, int e, int dst, moe__flex_xfers *out) {
  MOE_CHECK(check_expert_rank(t, "expand", e, dst));
  int free_slot = find_slot(t, dst, -1);
  MOE_TRY(free_slot >= 0, MOE_ERR_ARG, "flex expand: expert %d to rank %d, which has no free slot of its %d", e,
          dst, t->Ev);
  if (!moe__flex_count(t, e, dst)) {
    int src = -1;
    for (int g = 0; g < t->W; g++)
      if (moe__flex_count(t, e, g) && (src < 0 || abs(g - dst) < abs(src - dst))) src = g;
    MOE_CHECK(push(out, src, dst, e, t->state_bytes));
  }
  set_slot(t, free_slot, e);
  return MOE_OK;
}

moe_status moe__flex_shrink(moe__flex_table *t, int e, int g) {
  MOE_CHECK(check_expert_rank(t, "shrink", e, g));
  MOE_TRY(moe__flex_count(t, e, g) > 0, MOE_ERR_ARG, "flex shrink: rank %d holds no replica of expert %d", g, e);
  MOE_TRY(moe__flex_replicas(t, e) >= 2, MOE_ERR_ARG,
          "flex shrink: expert %d on rank %d is its only replica (every expert keeps one)", e, g);
  set_slot(t, find_slot(t, g, e), -1);
  return MOE_OK;
}

moe_status moe__flex_migrate(moe__flex_table *t, int a, int i, int b, int j, moe__flex_xfers *out) {
  MOE_CHECK(check_expert_rank(t, "migrate", a, i));
  MOE_CHECK(check_expert_rank(t, "migrate", b, j));
  MOE_TRY(a != b && i != j, MOE_ERR_ARG,
          "flex migrate: expert %d on rank %d with expert %d on rank %d: two experts on two ranks needed", a, i, b,
          j);
  int si = find_slot(t, i, a), sj = find_slot(t, j, b);
  MOE_TRY(si >= 0 && sj >= 0, MOE_ERR_ARG, "flex migrate: rank %d holds %d replicas of expert %d, rank %d %d of %d",
          i, moe__flex_count(t, a, i), a, j, moe__flex_count(t, b, j), b);
  if (!moe__flex_count(t, a, j)) MOE_CHECK(push(out, i, j, a, t->state_bytes));
  if (!moe__flex_count(t, b, i)) MOE_CHECK(push(out, j, i, b, t->state_bytes));
  set_slot(t, si, b);
  set_slot(t, sj, a);
  return MOE_OK;
}

moe_status moe__flex_apply(moe__flex_table *t, const moe__flex_op *op, moe__flex_xfers *out) {
  switch (op->kind) {
  case MOE__FLEX_EXPAND: return moe__flex_expand(t, op->e, op->g, out);
  case MOE__FLEX_SHRINK: return moe__flex_shrink(t, op->e, op->g);
  case MOE__FLEX_MIGRATE: return moe__flex_migrate(t, op->e, op->g, op->b, op->h, out);
  }
  return moe__error(MOE_ERR_ARG, __FILE__, __LINE__, "flex apply: unknown operation %d", (int)op->kind);
}
