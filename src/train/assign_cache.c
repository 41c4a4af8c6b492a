/* Sample-assignment caching (DynaMoE 4.2) in the trainer: each sample's experts (every block, every
 * slot) are recorded per epoch; frac_same is the fraction of samples whose assignment did not change
 * since the previous epoch. The switch is a RECOMPILE adjustment (DynaMoE 3): each epoch's frac_same
 * goes to a trigger thread once, with the metrics of the next epoch's first step (so no newer metrics
 * supersede it, and where the switch lands does not depend on timing); the trigger turns caching on
 * when frac_same >= on from epoch min_epoch and off when it falls below off, and its decision on the
 * metrics of step j takes effect at step j + delta_launch + 1, while training goes on. While on, each
 * batch is routed with the samples' assignments of the previous epoch (the gate still gives the
 * weights and a fresh choice, recorded for the next epoch). Under mpirun each rank records its own
 * slice of every batch; at the end of an epoch the ranks' records are merged (a sample is in one
 * rank's slice per epoch) and the counts behind frac_same summed; rank 0's switch is applied on every
 * rank at the same step. With cached experts a layer runs its router alongside its experts (layer.c). */
#include <stdlib.h>
#include <string.h>

#include "train/adjust.h"

struct moe__assign_cache {
  moe__train_blocks b;
  moe_cache_switch o;
  const moe_dist *dist; /* the model's ranks when more than one, else NULL */
  int n, L, k, on, steps;
  size_t per;             /* L k entries per sample */
  int32_t *prev, *cur;    /* (n, L, k): last epoch's and this epoch's assignments, -1 unknown */
  int32_t *buf;           /* (L, B, k) cached experts handed to the blocks */
  int bcap;
  long same, seen;
  double frac;            /* frac_same of the last epoch, -1 before one */
  int fresh;              /* frac is new: the next step hands it to the trigger */
  int64_t on_from;        /* the step caching last switched on at, -1 never */
  moe_recompile *rc;
  int trig_on, trig_epoch; /* the trigger thread's own: its view of the switch, the epoch it last judged */
};

/* On the trigger thread, once per epoch (frac_same changes at epoch ends): the thresholds, with
 * hysteresis, from epoch min_epoch. */
static int trigger(const moe_metrics *m, moe_adjustment *out, void *user) {
  moe__assign_cache *c = user;
  int epoch = (int)(m->iter / c->steps);
  if (m->frac_same < 0 || epoch <= c->trig_epoch) return 0;
  c->trig_epoch = epoch;
  int want = c->trig_on ? m->frac_same >= c->o.off : m->frac_same >= c->o.on && epoch >= c->o.min_epoch;
  if (want == c->trig_on) return 0;
  c->trig_on = want;
  out->set_caching = 1;
  out->caching = want;
  return 1;
}

moe_status moe__assign_cache_new(moe__assign_cache **out, const moe__train_blocks *b, int n, int steps, int delta,
                                 const moe_cache_switch *o) {
  moe__assign_cache *c = calloc(1, sizeof *c);
  MOE_TRY(c, MOE_ERR_NOMEM, "assignment caching: out of memory");
  c->b = *b;
  c->o = *o;
  c->dist = moe_dist_size(b->cfg->dist) > 1 ? b->cfg->dist : NULL;
  c->n = n;
  c->steps = steps > 0 ? steps : 1;
  c->L = b->L;
  c->k = b->cfg->top_k;
  c->per = (size_t)c->L * c->k;
  c->frac = -1;
  c->on_from = -1;
  c->trig_epoch = -1;
  c->prev = malloc(sizeof(int32_t) * c->per * (size_t)n);
  c->cur = malloc(sizeof(int32_t) * c->per * (size_t)n);
  moe_status st = !c->prev || !c->cur ? moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "assignment caching: out of "
                                                    "memory for %d samples", n)
                                       : moe_recompile_new(&c->rc, 1, delta, trigger, c);
  if (st != MOE_OK) {
    moe__assign_cache_free(c);
    return st;
  }
  memset(c->prev, 0xff, sizeof(int32_t) * c->per * (size_t)n);
  memset(c->cur, 0xff, sizeof(int32_t) * c->per * (size_t)n);
  *out = c;
  return MOE_OK;
}

moe_status moe__assign_cache_before(moe__assign_cache *c, int64_t step, const int32_t *ids, int n) {
  const moe_adjustment *adj;
  int has;
  MOE_CHECK(moe_recompile_begin(c->rc, step, &adj, &has));
  double sw[2] = {has && adj->set_caching, has && adj->caching}; /* (switch, on) */
  if (c->dist) { /* rank 0's switch, on every rank */
    if (moe_dist_rank(c->dist) != 0) sw[0] = sw[1] = 0;
    MOE_CHECK(moe_dist_allreduce(c->dist, sw, 2));
  }
  if (sw[0] > 0) {
    c->on = sw[1] > 0;
    if (c->on) c->on_from = step;
  }
  if (!c->on) return MOE_OK;
  if (n > c->bcap) {
    free(c->buf);
    c->buf = malloc(sizeof(int32_t) * c->per * (size_t)n);
    c->bcap = c->buf ? n : 0;
    MOE_TRY(c->buf, MOE_ERR_NOMEM, "assignment caching: out of memory for a batch of %d", n);
  }
  for (int i = 0; i < n; i++)
    if (c->prev[(size_t)ids[i] * c->per] < 0) return MOE_OK; /* a sample without a record: the router decides */
  for (int l = 0; l < c->L; l++) {
    int32_t *b = c->buf + (size_t)l * n * c->k;
    for (int i = 0; i < n; i++) memcpy(b + (size_t)i * c->k, c->prev + (size_t)ids[i] * c->per + (size_t)l * c->k,
                                       sizeof(int32_t) * (size_t)c->k);
    MOE_CHECK(moe_layer_set_cached_experts(&c->b.layers[l], b, n));
  }
  return MOE_OK;
}

moe_status moe__assign_cache_after(moe__assign_cache *c, int64_t step, const int32_t *ids, int n) {
  for (int i = 0; i < n; i++) {
    int32_t *rec = c->cur + (size_t)ids[i] * c->per;
    for (int l = 0; l < c->L; l++)
      memcpy(rec + (size_t)l * c->k, c->b.stats(c->b.self, l)->fresh + (size_t)i * c->k,
             sizeof(int32_t) * (size_t)c->k);
    const int32_t *old = c->prev + (size_t)ids[i] * c->per;
    if (old[0] >= 0) {
      c->seen++;
      c->same += !memcmp(rec, old, sizeof(int32_t) * c->per);
    }
  }
  if (!c->fresh) return MOE_OK;
  c->fresh = 0;
  int32_t none = 0;
  moe_metrics mt = {.iter = step, .experts = 1, .counts = &none, .frac_same = c->frac};
  return moe_recompile_push(c->rc, &mt);
}

/* Every rank gets every sample's record of this epoch: each record is known to one rank (-1 elsewhere),
 * so the sum of record + 1 over the ranks is that record + 1. */
static moe_status merge_records(moe__assign_cache *c) {
  size_t n = c->per * (size_t)c->n;
  double *a = malloc(sizeof(double) * n);
  MOE_TRY(a, MOE_ERR_NOMEM, "assignment caching: out of memory merging %zu records", n);
  for (size_t i = 0; i < n; i++) a[i] = (double)c->cur[i] + 1.0;
  moe_status st = moe_dist_allreduce(c->dist, a, (int)n);
  for (size_t i = 0; st == MOE_OK && i < n; i++) c->cur[i] = (int32_t)a[i] - 1;
  free(a);
  return st;
}

moe_status moe__assign_cache_epoch(moe__assign_cache *c, double *frac_same, int *on, int64_t *on_from) {
  double cnt[2] = {(double)c->same, (double)c->seen};
  if (c->dist) MOE_CHECK(moe_dist_allreduce(c->dist, cnt, 2));
  if (c->dist) MOE_CHECK(merge_records(c));
  c->frac = cnt[1] > 0 ? cnt[0] / cnt[1] : -1;
  c->fresh = c->frac >= 0;
  int32_t *t = c->prev;
  c->prev = c->cur;
  c->cur = t;
  memset(c->cur, 0xff, sizeof(int32_t) * c->per * (size_t)c->n); /* only this epoch's records */
  c->same = c->seen = 0;
  *frac_same = c->frac;
  *on = c->on;
  *on_from = c->on_from;
  return MOE_OK;
}

void moe__assign_cache_free(moe__assign_cache *c) {
  if (!c) return;
  moe_recompile_free(c->rc);
  free(c->prev);
  free(c->cur);
  free(c->buf);
  free(c);
}
