/* The vExpert placement table (P3 1.1): which expert each slot of each rank holds, the replica counts
 * derived from it, and the invariants every primitive keeps. */
#include <stdlib.h>
#include <string.h>

#include "flex/flex.h"

static moe_status alloc_arrays(moe__flex_table *t, int W, int Ev, int E, size_t state_bytes) {
  *t = (moe__flex_table){.W = W, .Ev = Ev, .E = E, .state_bytes = state_bytes};
  t->slot = malloc(sizeof(int) * (size_t)W * (size_t)Ev);
  t->n = calloc((size_t)E * (size_t)W, sizeof(int));
  if (!t->slot || !t->n) {
    moe__flex_table_free(t);
    return moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "flex table: %d ranks x %d slots", W, Ev);
  }
  return MOE_OK;
}

moe_status moe__flex_table_init(moe__flex_table *t, int W, int Ev, int E, size_t state_bytes) {
  *t = (moe__flex_table){0};
  MOE_TRY(W >= 1 && W <= MOE__FLEX_MAX_RANKS, MOE_ERR_ARG, "flex table: ranks W=%d not in [1, %d]", W,
          MOE__FLEX_MAX_RANKS);
  MOE_TRY(E >= 1 && Ev >= 1, MOE_ERR_ARG, "flex table: experts E=%d and slots E_v=%d must be >= 1", E, Ev);
  MOE_TRY((int64_t)W * Ev >= E, MOE_ERR_ARG,
          "flex table: W=%d ranks x E_v=%d slots cannot hold E=%d experts (E_v >= E/W needed)", W, Ev, E);
  MOE_CHECK(alloc_arrays(t, W, Ev, E, state_bytes));
  int64_t S = (int64_t)W * Ev;
  for (int64_t i = 0; i < S; i++) {
    int e = (int)(i * E / S);
    t->slot[i] = e;
    t->n[(size_t)e * W + (size_t)(i / Ev)]++;
  }
  return MOE_OK;
}

void moe__flex_table_free(moe__flex_table *t) {
  free(t->slot);
  free(t->n);
  *t = (moe__flex_table){0};
}

moe_status moe__flex_table_clone(moe__flex_table *dst, const moe__flex_table *src) {
  MOE_CHECK(alloc_arrays(dst, src->W, src->Ev, src->E, src->state_bytes));
  moe__flex_table_assign(dst, src);
  return MOE_OK;
}

void moe__flex_table_assign(moe__flex_table *dst, const moe__flex_table *src) {
  memcpy(dst->slot, src->slot, sizeof(int) * (size_t)src->W * (size_t)src->Ev);
  memcpy(dst->n, src->n, sizeof(int) * (size_t)src->E * (size_t)src->W);
}

void moe__flex_table_set_slots(moe__flex_table *t, const int *slots) {
  memcpy(t->slot, slots, sizeof(int) * (size_t)t->W * t->Ev);
  memset(t->n, 0, sizeof(int) * (size_t)t->E * t->W);
  for (int i = 0; i < t->W * t->Ev; i++)
    if (slots[i] >= 0 && slots[i] < t->E) t->n[(size_t)slots[i] * t->W + i / t->Ev]++;
}

moe_status moe__flex_table_check(const moe__flex_table *t) {
  int W = t->W, Ev = t->Ev, E = t->E;
  for (int g = 0; g < W; g++)
    for (int s = 0; s < Ev; s++) {
      int e = t->slot[g * Ev + s];
      MOE_TRY(e >= -1 && e < E, MOE_ERR_STATE, "flex table: rank %d slot %d holds expert %d, not in [-1, %d)", g,
              s, e, E);
    }
  for (int e = 0; e < E; e++) {
    int total = 0;
    for (int g = 0; g < W; g++) {
      int c = 0;
      for (int s = 0; s < Ev; s++) c += t->slot[g * Ev + s] == e;
      MOE_TRY(c == moe__flex_count(t, e, g), MOE_ERR_STATE,
              "flex table: expert %d on rank %d counted %d replicas but its slots hold %d", e, g,
              moe__flex_count(t, e, g), c);
      total += c;
    }
    MOE_TRY(total >= 1, MOE_ERR_STATE, "flex table: expert %d has no replica on any of the %d ranks", e, W);
  }
  return MOE_OK;
}

int moe__flex_replicas(const moe__flex_table *t, int e) {
  int n = 0;
  for (int g = 0; g < t->W; g++) n += moe__flex_count(t, e, g);
  return n;
}

int moe__flex_ranks(const moe__flex_table *t, int e, int *ranks) {
  int m = 0;
  for (int g = 0; g < t->W; g++)
    if (moe__flex_count(t, e, g)) ranks[m++] = g;
  return m;
}

int moe__flex_row_on(const moe__flex_table *t, int g, int e) {
  int j = 0;
  for (int x = 0; x < e; x++) j += moe__flex_count(t, x, g) > 0;
  return j;
}

moe_status moe__flex_reserve(void **p, int *cap, int need, size_t elem) {
  if (need <= *cap) return MOE_OK;
  int c = *cap ? *cap : 8;
  while (c < need) c *= 2;
  void *q = realloc(*p, (size_t)c * elem);
  MOE_TRY(q, MOE_ERR_NOMEM, "flex: %d list entries of %zu bytes", c, elem);
  *p = q;
  *cap = c;
  return MOE_OK;
}
