/* Where a memory budget's expert slots go (moe_lm_load_streaming, DESIGN 4.11): equally over the MoE
 * layers, or by each layer's misses simulated over a trace of the model; and which experts are pinned
 * from a trace. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "lm_family.h"
#include "lm_stream.h"

static const char *const placement_names[] = {"equal", "miss-cost"};

const char *moe_lm_placement_name(moe_lm_placement p) {
  return (unsigned)p < 2 ? placement_names[p] : "?";
}

moe_status moe_lm_placement_parse(const char *s, const char *field, moe_lm_placement *out) {
  int v;
  MOE_CHECK(moe__parse_name(s, field ? field : "placement", placement_names, 2, &v));
  *out = (moe_lm_placement)v;
  return MOE_OK;
}

/* A trace fits the model: its layers are the model's and its expert ids below E. */
static moe_status trace_fits(const moe_trace *t, const moe_lm_config *c, const char *what) {
  MOE_TRY(t->layers <= c->n_layers && t->experts <= c->moe.E, MOE_ERR_ARG,
          "%s: the trace has %d layers and %d experts, the model %d layers of %d experts: a trace of another model",
          what, t->layers, t->experts, c->n_layers, c->moe.E);
  return MOE_OK;
}

/* miss[k] for k in [1, kmax]: layer i's misses over the whole trace with k slots (0 if the trace has no
 * such layer). */
static moe_status miss_curve(const moe_trace *t, int i, moe_cache_policy p, int kmax, int64_t *miss) {
  for (int k = 1; k <= kmax; k++) {
    int64_t acc = 0;
    miss[k] = 0;
    if (i < t->layers && t->steps) MOE_CHECK(moe_cachesim(t, i, 0, t->steps, p, k, &acc, &miss[k]));
  }
  return MOE_OK;
}

/* The budget's units for placing by bytes: at most this many per slot a model could place (Lm E), and
 * at least MIN_UNITS, so that the table stays small; exact (units of the slots' common divisor) below
 * that, else each layer's slots round up by less than a unit (of about budget / (2 Lm E) bytes). */
#define UNITS_PER_SLOT 2
#define MIN_UNITS 16384

static size_t gcd(size_t a, size_t b) {
  while (b) {
    size_t t = a % b;
    a = b, b = t;
  }
  return a;
}

/* Slots per MoE layer (K[j], j over the MoE layers, each in [1, E]) whose bytes (K[j] slot[j], summed)
 * fit the budget, minimising the bytes the simulated misses read (each a slot's: with slots of one size,
 * the fewest misses): a knapsack over the budget in units of g
 * bytes (k slots of layer j take ceil(k slot[j] / g) of the floor(budget / g) units: never past the
 * budget; g the slots' greatest common divisor, so exact, unless that makes more units than the
 * bound above), exact where a greedy pass by marginal hits is not (FIFO's and LIFO's miss curves
 * need not be convex). best[j][u]: the least bytes missed by the first j layers in u units; ties to the
 * most slots, and the most units. *placed 0: no split fits the units (rounding): the caller places equally. */
static moe_status place_by_misses(const moe_lm_t *m, const moe_lm_stream_config *s, int Lm, const size_t *slot,
                                  size_t row, int *K, int *placed) {
  const moe_lm_config *c = &m->cfg;
  int E = c->moe.E;
  size_t budget = s->budget, all = 0, g = 0;
  for (int j = 0; j < Lm; j++) all += (size_t)E * slot[j], g = gcd(g, slot[j]);
  budget = budget < all ? budget : all; /* past every expert resident: no use */
  size_t most = (size_t)UNITS_PER_SLOT * Lm * E > MIN_UNITS ? (size_t)UNITS_PER_SLOT * Lm * E : MIN_UNITS;
  if (budget / g > most) g = (budget + most - 1) / most;
  size_t T = budget / g;
  int kmax = 1; /* the most slots a layer can take: the others keep one each */
  for (int j = 0; j < Lm; j++) {
    size_t k = (budget - row) / slot[j] + 1;
    kmax = k > (size_t)E ? E : (int)k > kmax ? (int)k : kmax;
  }
  int64_t *miss = malloc(sizeof *miss * (size_t)Lm * (kmax + 1)), *best = malloc(sizeof *best * (size_t)(Lm + 1) * (T + 1));
  int *pick = malloc(sizeof *pick * (size_t)(Lm + 1) * (T + 1));
  moe_status st = miss && best && pick ? MOE_OK : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "placement: out of memory");
  for (int i = 0, j = 0; st == MOE_OK && i < c->n_layers; i++)
    if (!moe_lm_layer_dense(c, i)) st = miss_curve(s->placement_trace, i, s->policy, kmax, miss + (size_t)j++ * (kmax + 1));
  const int64_t NONE = INT64_MAX;
  for (size_t u = 0; st == MOE_OK && u <= T; u++) best[u] = u ? NONE : 0;
  for (int j = 1; st == MOE_OK && j <= Lm; j++)
    for (size_t u = 0; u <= T; u++) {
      int64_t *b = best + (size_t)j * (T + 1) + u;
      *b = NONE;
      for (int k = 1; k <= kmax; k++) {
        size_t w = ((size_t)k * slot[j - 1] + g - 1) / g;
        if (w > u) break;
        int64_t prev = best[(size_t)(j - 1) * (T + 1) + u - w];
        if (prev == NONE) continue;
        int64_t v = prev + miss[(size_t)(j - 1) * (kmax + 1) + k] * (int64_t)slot[j - 1]; /* the bytes they read */
        if (v < *b || (v == *b && k > pick[(size_t)j * (T + 1) + u])) *b = v, pick[(size_t)j * (T + 1) + u] = k;
      }
    }
  *placed = 0;
  size_t u = T; /* the fewest misses over every total, ties to the most units */
  for (size_t v = T + 1; st == MOE_OK && v-- > 0;)
    if (best[(size_t)Lm * (T + 1) + v] < best[(size_t)Lm * (T + 1) + u]) u = v;
  if (st == MOE_OK && best[(size_t)Lm * (T + 1) + u] != NONE) {
    for (int j = Lm; j >= 1; j--) {
      K[j - 1] = pick[(size_t)j * (T + 1) + u];
      u -= ((size_t)K[j - 1] * slot[j - 1] + g - 1) / g;
    }
    *placed = 1;
  }
  free(miss), free(best), free(pick);
  return st;
}

moe_status moe__lm_stream_slots(const moe_lm_t *m, const moe_lm_stream_config *s, const size_t *slot, int *K) {
  const moe_lm_config *c = &m->cfg;
  int Lm = moe__lm_moe_layers(c), E = c->moe.E;
  size_t row = 0; /* bytes of one slot in every MoE layer */
  for (int j = 0; j < Lm; j++) row += slot[j];
  MOE_TRY(Lm && row && s->budget >= row, MOE_ERR_ARG,
          "memory budget %zu bytes: below one expert per MoE layer (%d layers, %zu bytes)", s->budget, Lm, row);
  MOE_TRY(s->placement == MOE_LM_PLACE_EQUAL || s->placement == MOE_LM_PLACE_MISS_COST, MOE_ERR_ARG,
          "memory budget: unknown placement %d", (int)s->placement);
  size_t each = s->budget / row; /* equal: as many slots in every layer, and one more where what is left fits */
  int placed = 0;
  if (s->placement == MOE_LM_PLACE_MISS_COST && each < (size_t)E) {
    MOE_TRY(s->placement_trace, MOE_ERR_ARG, "memory budget: placement miss-cost needs a trace (placement_trace)");
    MOE_CHECK(trace_fits(s->placement_trace, c, "placement"));
    MOE_CHECK(place_by_misses(m, s, Lm, slot, row, K, &placed));
  }
  if (placed) return MOE_OK;
  size_t left = s->budget; /* what the equal share leaves goes a slot a layer to the first layers it fits */
  for (int j = 0; j < Lm; j++) K[j] = each < (size_t)E ? (int)each : E, left -= (size_t)K[j] * slot[j];
  for (int j = 0; j < Lm; j++)
    if (K[j] < E && left >= slot[j]) K[j]++, left -= slot[j];
  return MOE_OK;
}

/* Layer i's n experts active in the most steps of t (ties to the lower id), none the trace never uses,
 * into out; how many. */
static int most_used(const moe_trace *t, int i, int E, int n, int *out, int64_t *steps) {
  memset(steps, 0, sizeof *steps * (size_t)E);
  for (int64_t b = 0; i < t->layers && b < t->steps; b++)
    for (int e = 0; e < t->experts; e++) steps[e] += t->tokens[((size_t)b * t->layers + i) * t->experts + e] > 0;
  int k = 0;
  for (; k < n; k++) {
    int top = -1;
    for (int e = 0; e < E; e++)
      if (steps[e] > 0 && (top < 0 || steps[e] > steps[top])) top = e;
    if (top < 0) break;
    out[k] = top;
    steps[top] = 0;
  }
  return k;
}

moe_status moe__lm_stream_pin(const moe_lm_t *m, const moe_lm_stream_config *s, moe_lm_experts *x) {
  if (!s->pin_trace) return MOE_OK;
  const moe_lm_config *c = &m->cfg;
  MOE_TRY(s->pin >= 0, MOE_ERR_ARG, "memory budget: pin must be >= 0 (0: half the layer's slots), got %d", s->pin);
  MOE_CHECK(trace_fits(s->pin_trace, c, "pin"));
  int E = c->moe.E, *ids = malloc(sizeof *ids * (size_t)E);
  int64_t *steps = malloc(sizeof *steps * (size_t)E);
  moe_status st = ids && steps ? MOE_OK : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "pin: out of memory");
  for (int i = 0; st == MOE_OK && i < x->n; i++) {
    if (!x->caches[i]) continue;
    moe_expert_cache_stats cs;
    moe_expert_cache_get_stats(x->caches[i], &cs);
    int room = cs.slots - (cs.slots < E), want = s->pin ? s->pin : cs.slots / 2;
    int n = most_used(s->pin_trace, i, E, want < room ? want : room, ids, steps);
    st = moe_expert_cache_pin(x->caches[i], ids, n);
  }
  free(ids), free(steps);
  return st;
}
