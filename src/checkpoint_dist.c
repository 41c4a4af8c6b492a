/* Checkpoints under expert parallelism: rank r holds experts [r E/W, (r+1) E/W) of every block, and
 * their optimizer state; the file is the one-process format whatever W saved it. Saving gathers every
 * rank's experts on rank 0 (rank order is expert order), which writes; loading reads the whole file
 * on every rank and keeps its own experts, so a run may resume with another number of ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "internal.h"
#include "shard.h"

/* The model of m's configuration on one process: its expert tensors whole, (E, ...). */
static moe_status whole_model(const moe_model_t *m, moe_model_t *whole) {
  moe_model_config c = m->cfg;
  c.moe.dist = NULL;
  return moe_model_init(whole, &c);
}

/* The tensors each rank holds a slice of (dimension 0, experts): the experts' of every block. */
static int split_ref(const moe_tensor_ref *r) {
  return !strncmp(r->name, "blocks.", 7) && strstr(r->name, ".moe.experts.") != NULL;
}

/* Tutel's sharded layout (parallel_r, shard.h): the layer and tensor behind ref r of m, or NULL. */
static const moe_param_info *sharded(const moe_model_t *m, const moe_tensor_ref *r, const moe_layer_t **l) {
  int b, at = 0;
  if (sscanf(r->name, "blocks.%d.moe.%n", &b, &at) != 1 || !at || b < 0 || b >= m->cfg.blocks) return NULL;
  *l = &m->layers[b];
  const moe_param_info *p = moe_layer_param_find(*l, r->name + at);
  int64_t w[3];
  int lo, hi;
  return p && moe__shard_axis(*l, p, 0, w, &lo, &hi) ? p : NULL;
}

/* Rank 0 gets n floats of every rank's src, in rank order, at dst; NULL dst on other ranks (sh: the
 * shards of sharded tensor sh of layer l instead). Copies when the tensor is replicated (every rank
 * holds the same values). */
static moe_status collect(const moe_dist *d, int split, const moe_layer_t *l, const moe_param_info *sh,
                          const float *src, size_t n, float *dst) {
  if (sh) return moe__shard_gather_tensor(l, sh, src, dst);
  if (split) return moe_dist_gather(d, src, (int)n, dst);
  if (dst) memcpy(dst, src, n * sizeof *src);
  return MOE_OK;
}

moe_status moe__checkpoint_save_ranks(const char *path, const moe_model_t *m, const moe_optim_t *o,
                                      const moe_train_state *ts) {
  const moe_dist *d = m->cfg.moe.dist;
  int root = moe_dist_rank(d) == 0;
  moe_model_t w = {0};
  moe_optim_t wo = {0};
  moe_status st = MOE_OK;
  if (root) {
    st = whole_model(m, &w);
    if (st == MOE_OK && o) st = moe_optim_init(&wo, &o->cfg, &w);
  }
  double failed = st != MOE_OK; /* every rank learns whether rank 0 can take the gathers */
  moe_status sd = moe_dist_allreduce(d, &failed, 1);
  if (st == MOE_OK && sd != MOE_OK) st = sd;
  if (st == MOE_OK && failed)
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: rank 0 cannot hold the whole model to save it", path);
  size_t off = 0, woff = 0;
  for (int i = 0; st == MOE_OK && i < m->nrefs; i++) {
    const moe_tensor_ref *r = &m->refs[i];
    const moe_layer_t *l = NULL;
    const moe_param_info *sh = sharded(m, r, &l);
    int split = split_ref(r);
    st = collect(d, split, l, sh, r->data, r->numel, root ? w.refs[i].data : NULL);
    if (st == MOE_OK && o) st = collect(d, split, l, sh, o->m + off, r->numel, root ? wo.m + woff : NULL);
    if (st == MOE_OK && o && o->v) st = collect(d, split, l, sh, o->v + off, r->numel, root ? wo.v + woff : NULL);
    off += r->numel;
    woff += root ? w.refs[i].numel : 0; /* only rank 0 reads the whole model's state */
  }
  for (int b = 0; st == MOE_OK && root && b < m->cfg.blocks; b++) /* every rank holds all E capacities */
    if (m->layers[b].expert_capacity)
      st = moe_layer_set_expert_capacity(&w.layers[b], m->layers[b].expert_capacity,
                                         m->layers[b].expert_capacity_tokens);
  if (st == MOE_OK && root) {
    wo.step = o ? o->step : 0;
    st = moe_checkpoint_save(path, &w, o ? &wo : NULL, ts);
  }
  moe_optim_free(&wo);
  moe_model_free(&w);
  return st;
}

/* Copies n floats of this rank's part of src (its slice when split; its shard of tensor sh of l) to dst. */
static void take(const moe_dist *d, int split, const moe_layer_t *l, const moe_param_info *sh, const float *src,
                 size_t n, float *dst) {
  if (sh) moe__shard_take_tensor(l, sh, src, dst);
  else memcpy(dst, src + (split ? (size_t)moe_dist_rank(d) * n : 0), n * sizeof *src);
}

static moe_status keep_own(const moe_dist *d, int parallel_r, const moe_model_t *w, const moe_optim_t *wo,
                           moe_model_t *m, moe_optim_t *o) {
  moe_model_config c = w->cfg;
  c.moe.dist = d;
  c.moe.parallel_r = parallel_r;
  MOE_CHECK(moe_model_init(m, &c));
  if (o && wo->m) {
    MOE_CHECK(moe_optim_init(o, &wo->cfg, m));
    o->step = wo->step;
  }
  size_t off = 0, woff = 0;
  for (int i = 0; i < m->nrefs; i++) {
    const moe_tensor_ref *r = &m->refs[i], *wr = &w->refs[i];
    const moe_layer_t *l = NULL;
    const moe_param_info *sh = sharded(m, r, &l);
    int split = split_ref(r);
    MOE_TRY(sh || wr->numel == r->numel * (split ? (size_t)moe_dist_size(d) : 1), MOE_ERR_STATE,
            "internal: tensor %s has %zu floats on a rank, %zu whole", r->name, r->numel, wr->numel);
    take(d, split, l, sh, wr->data, r->numel, r->data);
    if (o && o->m) take(d, split, l, sh, wo->m + woff, r->numel, o->m + off);
    if (o && o->v) take(d, split, l, sh, wo->v + woff, r->numel, o->v + off);
    off += r->numel;
    woff += wr->numel;
  }
  for (int b = 0; b < c.blocks; b++) {
    if (w->layers[b].expert_capacity)
      MOE_CHECK(moe_layer_set_expert_capacity(&m->layers[b], w->layers[b].expert_capacity,
                                              w->layers[b].expert_capacity_tokens));
    moe_layer_params_changed(&m->layers[b]); /* bf16 copies of the experts */
  }
  return MOE_OK;
}

moe_status moe_checkpoint_load_ranks(const char *path, const moe_dist *d, moe_model_t *m, moe_optim_t *o,
                                     moe_train_state *ts) {
  return moe_checkpoint_load_sharded(path, d, MOE_PARALLEL_OFF, m, o, ts);
}

moe_status moe_checkpoint_load_sharded(const char *path, const moe_dist *d, int parallel_r, moe_model_t *m,
                                       moe_optim_t *o, moe_train_state *ts) {
  if (moe_dist_size(d) <= 1) return moe_checkpoint_load(path, m, o, ts);
  MOE_TRY(path && m, MOE_ERR_ARG, "moe_checkpoint_load_ranks: NULL argument");
  memset(m, 0, sizeof *m);
  if (o) memset(o, 0, sizeof *o);
  moe_model_t w;
  moe_optim_t wo = {0};
  MOE_CHECK(moe_checkpoint_load(path, &w, o ? &wo : NULL, ts));
  moe_status st = keep_own(d, parallel_r, &w, &wo, m, o);
  if (st != MOE_OK) {
    if (o) moe_optim_free(o);
    moe_model_free(m);
    char why[512];
    snprintf(why, sizeof why, "%s", moe_last_error());
    st = moe__error(st, __FILE__, __LINE__, "%s on %d ranks: %s", path, moe_dist_size(d), why);
  }
  moe_optim_free(&wo);
  moe_model_free(&w);
  return st;
}
