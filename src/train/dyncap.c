/* Dynamic capacity (moe train --capacity dynamic): DynaMoE's per-expert capacities (4.1) driven by RECOMPILE (3). After
 * every step the blocks' expert counts go to a trigger thread, which decides new capacities with
 * moe_dynamic_capacity (headroom and hysteresis); a decision on the metrics of step j takes effect at
 * step j + delta_launch + 1, while training goes on. Capacities are counts for the training batch;
 * the layers scale them to other batch sizes (evaluation), and checkpoints keep them. Under mpirun every rank runs a trigger on the same
 * (global) counts, but when each sees which metrics depends on timing: rank 0's decisions are the
 * ones applied, on every rank at the same step, so that all agree on the (E, C, D) layout. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/adjust.h"

struct moe__dyncap {
  moe__train_blocks b;
  int E, L, B;
  float headroom;
  int32_t *cur;     /* (L E) applied capacities */
  int32_t *decided; /* (L E) the trigger's latest decision (applied or on its way) */
  int32_t *counts;  /* (L E) metrics scratch */
  double *ema;      /* (L E) smoothed need, on the trigger thread */
  int32_t *smooth;  /* (L E) its rounding */
  int64_t seen;
  moe_recompile *rc;
  const moe_dist *dist; /* the model's ranks (more than one: rank 0 decides) */
  double *agree;        /* (1 + L E) rank 0's decision of this step, for every rank */
};

static int trigger(const moe_metrics *m, moe_adjustment *out, void *user) {
  moe__dyncap *d = user;
  /* the need is smoothed over steps (a batch's counts are noisy): capacities follow the trend */
  for (int i = 0; i < m->experts; i++) {
    d->ema[i] = d->seen ? 0.9 * d->ema[i] + 0.1 * m->counts[i] : m->counts[i];
    d->smooth[i] = (int32_t)ceil(d->ema[i] - 1e-9);
  }
  d->seen++;
  int due = moe_dynamic_capacity(d->smooth, d->decided, m->experts, d->headroom, out->capacity);
  if (!due) return 0;
  memcpy(d->decided, out->capacity, sizeof(int32_t) * (size_t)m->experts);
  out->set_capacity = 1;
  return 1;
}

static moe_status apply(moe__dyncap *d, const int32_t *cap) {
  for (int i = 0; i < d->L; i++) MOE_CHECK(moe_layer_set_expert_capacity(&d->b.layers[i], cap + (size_t)i * d->E, d->B));
  return MOE_OK;
}

moe_status moe__dyncap_start(moe__dyncap **out, const moe__train_blocks *b, int B, int delta, float headroom) {
  moe__dyncap *d = calloc(1, sizeof *d);
  int E = b->cfg->E, L = b->L;
  MOE_TRY(d, MOE_ERR_NOMEM, "dynamic capacity: out of memory");
  d->b = *b;
  d->E = E;
  d->L = L;
  d->B = B;
  d->headroom = headroom;
  d->cur = malloc(sizeof(int32_t) * (size_t)(4 * L * E));
  d->ema = calloc((size_t)(L * E), sizeof *d->ema);
  d->dist = moe_dist_size(b->cfg->dist) > 1 ? b->cfg->dist : NULL;
  d->agree = d->dist ? malloc(sizeof(double) * (size_t)(1 + L * E)) : NULL;
  if (!d->cur || !d->ema || (d->dist && !d->agree)) {
    free(d->cur);
    free(d->ema);
    free(d->agree);
    free(d);
    MOE_TRY(0, MOE_ERR_NOMEM, "dynamic capacity: out of memory for %d layers of %d experts", L, E);
  }
  d->smooth = d->cur + 3 * L * E;
  d->decided = d->cur + L * E;
  d->counts = d->decided + L * E;
  /* start from the checkpoint's capacities (a resumed run), else from capacity_setting's C */
  int C = (int)ceil((double)b->cfg->capacity_setting * b->cfg->top_k * B / E);
  for (int i = 0; i < L * E; i++) d->cur[i] = d->decided[i] = C > 0 ? C : 1;
  for (int i = 0; i < L; i++) {
    const moe_layer_t *l = &b->layers[i];
    if (l->expert_capacity && l->expert_capacity_tokens == B)
      for (int e = 0; e < E; e++) d->cur[i * E + e] = d->decided[i * E + e] = l->expert_capacity[e];
  }
  moe_status st = apply(d, d->cur);
  if (st == MOE_OK) st = moe_recompile_new(&d->rc, L * E, delta, trigger, d);
  if (st != MOE_OK) {
    moe__dyncap_free(d);
    return st;
  }
  *out = d;
  return MOE_OK;
}

moe_status moe__dyncap_begin(moe__dyncap *d, int64_t step) {
  const moe_adjustment *adj;
  int has, n = d->L * d->E;
  MOE_CHECK(moe_recompile_begin(d->rc, step, &adj, &has));
  has = has && adj->set_capacity;
  const int32_t *cap = has ? adj->capacity : NULL;
  if (d->dist) { /* rank 0's decision (or none), on every rank */
    memset(d->agree, 0, sizeof(double) * (size_t)(1 + n));
    if (has && moe_dist_rank(d->dist) == 0) {
      d->agree[0] = 1;
      for (int i = 0; i < n; i++) d->agree[1 + i] = cap[i];
    }
    MOE_CHECK(moe_dist_allreduce(d->dist, d->agree, 1 + n));
    has = d->agree[0] > 0;
    for (int i = 0; has && i < n; i++) d->counts[i] = (int32_t)d->agree[1 + i]; /* scratch until dyncap_push */
    cap = d->counts;
  }
  if (has) { /* the recompile: only the buffers whose sizes change grow */
    memcpy(d->cur, cap, sizeof(int32_t) * (size_t)n);
    MOE_CHECK(apply(d, d->cur));
  }
  return MOE_OK;
}

moe_status moe__dyncap_push(moe__dyncap *d, int64_t step, double loss) {
  for (int i = 0; i < d->L; i++)
    memcpy(d->counts + (size_t)i * d->E, d->b.stats(d->b.self, i)->expert_counts, sizeof(int32_t) * (size_t)d->E);
  moe_metrics mt = {.iter = step, .loss = loss, .experts = d->L * d->E, .counts = d->counts};
  return moe_recompile_push(d->rc, &mt);
}

void moe__dyncap_stats(const moe__dyncap *d, moe_recompile_stats *out) { moe_recompile_get_stats(d->rc, out); }

void moe__dyncap_free(moe__dyncap *d) {
  if (!d) return;
  moe_recompile_free(d->rc);
  free(d->cur);
  free(d->ema);
  free(d->agree);
  free(d);
}
