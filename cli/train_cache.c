/* Sample-assignment caching (DynaMoE 4.2) in moe train: each sample's experts (every block, every
 * slot) are recorded per epoch; frac_same is the fraction of samples whose assignment did not change
 * since the previous epoch. Caching switches on when frac_same >= on and the epoch is at least
 * min_epoch, and off when it falls below off; while on, each batch is routed with the samples'
 * assignments of the previous epoch (the gate still gives the weights and a fresh choice, recorded
 * for the next epoch). Under mpirun each rank records its own slice of every batch; at the end of an
 * epoch the ranks' records are merged (a sample is in one rank's slice per epoch) and the counts
 * behind frac_same summed, so that every rank has every record and all switch together. On this CPU the router
 * and the experts still run one after the other: the dependency is gone, the concurrency that would
 * use it is not there yet. */
#include <stdlib.h>
#include <string.h>

#include "train_cache.h"

struct assign_cache {
  assign_cache_opts o;
  const moe_dist *dist; /* the model's ranks, or NULL */
  int n, L, k, on;
  size_t per;             /* L k entries per sample */
  int32_t *prev, *cur;    /* (n, L, k): last epoch's and this epoch's assignments, -1 unknown */
  int32_t *buf;           /* (L, B, k) cached experts handed to the blocks */
  int bcap;
  long same, seen;
};

int assign_cache_new(assign_cache **out, const moe_model_t *m, int n, const assign_cache_opts *o) {
  assign_cache *c = calloc(1, sizeof *c);
  if (!c) return 1;
  c->o = *o;
  c->dist = m->cfg.moe.dist;
  c->n = n;
  c->L = m->cfg.blocks;
  c->k = m->cfg.moe.top_k;
  c->per = (size_t)c->L * c->k;
  c->prev = malloc(sizeof(int32_t) * c->per * (size_t)n);
  c->cur = malloc(sizeof(int32_t) * c->per * (size_t)n);
  if (!c->prev || !c->cur) {
    assign_cache_free(c);
    return 1;
  }
  memset(c->prev, 0xff, sizeof(int32_t) * c->per * (size_t)n);
  memset(c->cur, 0xff, sizeof(int32_t) * c->per * (size_t)n);
  *out = c;
  return 0;
}

int assign_cache_before(assign_cache *c, moe_model_t *m, const int32_t *ids, int n) {
  if (!c->on) return 0;
  if (n > c->bcap) {
    free(c->buf);
    c->buf = malloc(sizeof(int32_t) * c->per * (size_t)n);
    if (!c->buf) return 1;
    c->bcap = n;
  }
  for (int i = 0; i < n; i++)
    if (c->prev[(size_t)ids[i] * c->per] < 0) return 0; /* a sample without a record: the router decides */
  for (int l = 0; l < c->L; l++) {
    int32_t *b = c->buf + (size_t)l * n * c->k;
    for (int i = 0; i < n; i++) memcpy(b + (size_t)i * c->k, c->prev + (size_t)ids[i] * c->per + (size_t)l * c->k,
                                       sizeof(int32_t) * (size_t)c->k);
    if (moe_layer_set_cached_experts(&m->layers[l], b, n) != MOE_OK) return 1;
  }
  return 0;
}

void assign_cache_after(assign_cache *c, const moe_model_t *m, const int32_t *ids, int n) {
  for (int i = 0; i < n; i++) {
    int32_t *rec = c->cur + (size_t)ids[i] * c->per;
    for (int l = 0; l < c->L; l++)
      memcpy(rec + (size_t)l * c->k, moe_model_layer_stats(m, l)->fresh + (size_t)i * c->k, sizeof(int32_t) * (size_t)c->k);
    const int32_t *old = c->prev + (size_t)ids[i] * c->per;
    if (old[0] >= 0) {
      c->seen++;
      c->same += !memcmp(rec, old, sizeof(int32_t) * c->per);
    }
  }
}

/* Every rank gets every sample's record of this epoch: each record is known to one rank (-1 elsewhere),
 * so the sum of record + 1 over the ranks is that record + 1. */
static int merge_records(assign_cache *c) {
  size_t n = c->per * (size_t)c->n;
  double *a = malloc(sizeof(double) * n);
  if (!a) return 1;
  for (size_t i = 0; i < n; i++) a[i] = (double)c->cur[i] + 1.0;
  int rc = moe_dist_allreduce(c->dist, a, (int)n) != MOE_OK;
  for (size_t i = 0; !rc && i < n; i++) c->cur[i] = (int32_t)a[i] - 1;
  free(a);
  return rc;
}

int assign_cache_epoch(assign_cache *c, int epoch, int *on, double *frac_same) {
  double cnt[2] = {(double)c->same, (double)c->seen};
  if (c->dist && (moe_dist_allreduce(c->dist, cnt, 2) != MOE_OK || merge_records(c))) return 1;
  double frac = cnt[1] > 0 ? cnt[0] / cnt[1] : -1;
  if (frac >= 0) {
    if (!c->on && frac >= c->o.on && epoch + 1 >= c->o.min_epoch) c->on = 1;
    else if (c->on && frac < c->o.off) c->on = 0;
  }
  int32_t *t = c->prev;
  c->prev = c->cur;
  c->cur = t;
  memset(c->cur, 0xff, sizeof(int32_t) * c->per * (size_t)c->n); /* only this epoch's records */
  c->same = c->seen = 0;
  *on = c->on;
  *frac_same = frac;
  return 0;
}

void assign_cache_free(assign_cache *c) {
  if (!c) return;
  free(c->prev);
  free(c->cur);
  free(c->buf);
  free(c);
}
